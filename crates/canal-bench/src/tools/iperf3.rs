//! iperf3 streams (B3): Gbit/s from `iperf3 -J`.
use crate::json;
use crate::model::Cell;
use crate::runner::sv;
use crate::runner::Outcome;
use crate::runner::Ready;

use crate::runner::Runner;

impl Runner {
    pub(crate) fn run_iperf3(&mut self, cell: &Cell) -> Outcome {
        let port = match self.tools_and_port(&["iperf3"]) {
            Ok(p) => p,
            Err(o) => return o,
        };
        let p = port.to_string();
        let secs = self.knobs.tool_secs;
        // --forceflush: iperf3 block-buffers its stdout into a pipe otherwise.
        let server = sv(&[
            "iperf3",
            "-s",
            "-1",
            "--forceflush",
            "-B",
            "127.0.0.1",
            "-p",
            &p,
        ]);
        let client = sv(&[
            "iperf3",
            "-c",
            "127.0.0.1",
            "-p",
            &p,
            "-t",
            &format!("{}", secs.ceil() as u64),
            "-l",
            &cell.size.to_string(),
            "-J",
        ]);
        let r = self.server_client(
            cell,
            server,
            Ready::Line("Server listening".into()),
            client,
            secs + 1.0,
        );
        self.tool_outcome(r, |out| {
            let j = json::parse(out)?;
            if let Some(e) = json::get(&j, "error") {
                return Err(format!("iperf3: {}", json::as_text(e)));
            }
            let bps = json::get(&j, "end.sum_received.bits_per_second")
                .and_then(json::Json::as_f64)
                .ok_or("iperf3 -J has no end.sum_received.bits_per_second")?;
            Ok(vec![
                ("gbit_s".into(), bps / 1e9),
                ("bytes_s".into(), bps / 8.0),
            ])
        })
    }
}
