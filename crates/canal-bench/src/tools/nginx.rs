//! nginx with wrk (B10): requests per second and latency.
use crate::model::Cell;
use crate::runner::sv;
use crate::runner::Outcome;
use crate::runner::Ready;

use crate::runner::Runner;

impl Runner {
    pub(crate) fn run_nginx(&mut self, cell: &Cell) -> Outcome {
        let port = match self.tools_and_port(&["nginx", "wrk"]) {
            Ok(p) => p,
            Err(o) => return o,
        };
        let id = self.next_id();
        let dir = self.tmp.join(format!("nginx-{id}"));
        let conf = dir.join("nginx.conf");
        let d = dir.to_string_lossy();
        let text = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log stderr notice;\npid {d}/nginx.pid;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/cb; proxy_temp_path {d}/px; fastcgi_temp_path {d}/fc;\n  \
             uwsgi_temp_path {d}/uw; scgi_temp_path {d}/sc;\n  \
             server {{ listen 127.0.0.1:{port}; location / {{ return 200 \"hello from canal bench\\n\"; }} }}\n}}\n"
        );
        if let Err(e) =
            std::fs::create_dir_all(dir.join("logs")).and_then(|_| std::fs::write(&conf, text))
        {
            return Outcome::fail(format!("nginx config: {e}"), String::new());
        }
        let secs = self.knobs.tool_secs;
        let server = sv(&["nginx", "-p", &d, "-c", &conf.to_string_lossy()]);
        let client = sv(&[
            "wrk",
            "-t1",
            "-c10",
            &format!("-d{}s", secs.ceil() as u64),
            "--latency",
            &format!("http://127.0.0.1:{port}/"),
        ]);
        let r = self.server_client(cell, server, Ready::Port(port), client, secs + 2.0);
        self.tool_outcome(r, parse_wrk)
    }
}

pub(crate) fn wrk_time_us(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, mul) = if let Some(v) = s.strip_suffix("us") {
        (v, 1.0)
    } else if let Some(v) = s.strip_suffix("ms") {
        (v, 1e3)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1e6)
    } else {
        return None;
    };
    num.parse::<f64>().ok().map(|v| v * mul)
}

pub(crate) fn parse_wrk(out: &str) -> Result<Vec<(String, f64)>, String> {
    let mut m = Vec::new();
    for line in out.lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("Requests/sec:") {
            m.push((
                "req_s".to_string(),
                v.trim().parse().map_err(|_| format!("wrk: bad '{t}'"))?,
            ));
        } else if let Some(v) = t.strip_prefix("50%") {
            m.extend(wrk_time_us(v).map(|x| ("p50_us".to_string(), x)));
        } else if let Some(v) = t.strip_prefix("99%") {
            m.extend(wrk_time_us(v).map(|x| ("p99_us".to_string(), x)));
        }
    }
    // A fast run of failures is no result: socket errors, or answers that were not
    // the page (wrk counts them in Requests/sec).
    if let Some(e) = out
        .lines()
        .find(|l| l.contains("Socket errors") || l.contains("Non-2xx or 3xx responses"))
    {
        return Err(format!("wrk: {}", e.trim()));
    }
    if !m.iter().any(|(k, _)| k == "req_s") {
        return Err(format!(
            "wrk printed no Requests/sec: {}",
            out.lines().last().unwrap_or("")
        ));
    }
    Ok(m)
}
