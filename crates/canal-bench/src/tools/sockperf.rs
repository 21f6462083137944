//! sockperf ping-pong (B3): RTT percentiles.
use crate::model::Cell;
use crate::runner::sv;
use crate::runner::Outcome;
use crate::runner::Ready;

use crate::runner::Runner;

impl Runner {
    pub(crate) fn run_sockperf(&mut self, cell: &Cell) -> Outcome {
        let port = match self.tools_and_port(&["sockperf"]) {
            Ok(p) => p,
            Err(o) => return o,
        };
        let p = port.to_string();
        let secs = self.knobs.tool_secs;
        let server = sv(&["sockperf", "sr", "--tcp", "-i", "127.0.0.1", "-p", &p]);
        let client = sv(&[
            "sockperf",
            "pp",
            "--tcp",
            "-i",
            "127.0.0.1",
            "-p",
            &p,
            "-t",
            &format!("{}", secs.ceil() as u64),
            "-m",
            &cell.size.max(14).to_string(),
        ]);
        let r = self.server_client(cell, server, Ready::Port(port), client, secs + 1.0);
        self.tool_outcome(r, parse_sockperf)
    }
}

/// sockperf reports half the round trip; we report the round trip (×2) like the generator.
pub(crate) fn parse_sockperf(out: &str) -> Result<Vec<(String, f64)>, String> {
    let mut p50 = None;
    let mut p99 = None;
    let mut avg: Option<f64> = None;
    for line in out.lines() {
        let clean: String = line.chars().filter(|c| !c.is_control()).collect();
        let val = || {
            clean
                .rsplit('=')
                .next()
                .and_then(|v| v.trim().trim_end_matches("[0m").trim().parse::<f64>().ok())
        };
        if clean.contains("percentile 50.000") {
            p50 = val();
        } else if clean.contains("percentile 99.000") {
            p99 = val();
        } else if let Some(i) = clean.find("avg-latency=") {
            avg = clean[i + 12..]
                .split(|c: char| !(c.is_ascii_digit() || c == '.'))
                .next()
                .and_then(|v| v.parse().ok());
        }
    }
    match (p50, p99) {
        (Some(a), Some(b)) => {
            let mut m = vec![
                ("rtt_p50_us".into(), 2.0 * a),
                ("rtt_p99_us".into(), 2.0 * b),
            ];
            if let Some(v) = avg {
                m.push(("rtt_mean_us".into(), 2.0 * v));
            }
            Ok(m)
        }
        _ => Err(format!(
            "sockperf printed no percentiles: {}",
            out.lines().last().unwrap_or("")
        )),
    }
}
