//! redis-server with redis-benchmark (B10): SET/GET rates and latency.
use crate::model::Cell;
use crate::model::System;
use crate::runner::sv;
use crate::runner::Outcome;
use crate::runner::Ready;

use crate::runner::Runner;

impl Runner {
    pub(crate) fn run_redis(&mut self, cell: &Cell) -> Outcome {
        if let Some(o) = self.tool_missing(&["redis-server", "redis-benchmark"]) {
            return o;
        }
        let n = self.knobs.redis_requests.to_string();
        let id = self.next_id();
        let (server, ready, target) = if cell.system == System::Uds {
            let path = self.tmp.join(format!("redis-{id}.sock"));
            let ps = path.to_string_lossy().into_owned();
            (
                sv(&[
                    "redis-server",
                    "--port",
                    "0",
                    "--unixsocket",
                    &ps,
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ]),
                Ready::Path(path),
                sv(&["-s", &ps]),
            )
        } else {
            let port = match self.port() {
                Ok(p) => p,
                Err(e) => return Outcome::fail(e, String::new()),
            };
            let p = port.to_string();
            (
                sv(&[
                    "redis-server",
                    "--port",
                    &p,
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ]),
                Ready::Port(port),
                sv(&["-h", "127.0.0.1", "-p", &p]),
            )
        };
        let mut client = sv(&["redis-benchmark"]);
        client.extend(target);
        client.extend(sv(&["-t", "set,get", "-n", &n, "-c", "10", "--csv"]));
        // Assumes at least 20 000 requests/s; a slower run still finishes within the grace.
        let nominal = self.knobs.redis_requests as f64 / 20_000.0;
        let r = self.server_client(cell, server, ready, client, nominal);
        self.tool_outcome(r, parse_redis_csv)
    }
}

pub(crate) fn parse_redis_csv(out: &str) -> Result<Vec<(String, f64)>, String> {
    let mut m = Vec::new();
    for line in out.lines() {
        let f: Vec<String> = line
            .split(',')
            .map(|s| s.trim().trim_matches('"').to_string())
            .collect();
        if f.len() >= 7 && (f[0] == "SET" || f[0] == "GET") {
            let op = f[0].to_lowercase();
            let num = |i: usize| {
                f[i].parse::<f64>()
                    .map_err(|_| format!("redis-benchmark csv: bad number '{}'", f[i]))
            };
            m.push((format!("{op}_rps"), num(1)?));
            m.push((format!("{op}_p50_us"), num(4)? * 1e3));
            m.push((format!("{op}_p99_us"), num(6)? * 1e3));
        }
    }
    if m.len() < 6 {
        return Err(format!(
            "redis-benchmark printed no SET/GET rows: {}",
            out.lines().last().unwrap_or("")
        ));
    }
    Ok(m)
}
