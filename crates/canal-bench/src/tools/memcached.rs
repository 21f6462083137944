//! memcached with memaslap (`memcaslap`, Debian's libmemcached-tools) (B10): get/set
//! operations per second, with a tenth of the gets verified.
use crate::model::Cell;
use crate::runner::sv;
use crate::runner::Outcome;
use crate::runner::Ready;

use crate::runner::Runner;

/// The load generator's name in Debian's libmemcached-tools.
const MEMASLAP: &str = "memcaslap";

impl Runner {
    pub(crate) fn run_memcached(&mut self, cell: &Cell) -> Outcome {
        let port = match self.tools_and_port(&["memcached", MEMASLAP]) {
            Ok(p) => p,
            Err(o) => return o,
        };
        let p = port.to_string();
        let mut server = sv(&[
            "memcached",
            "-p",
            &p,
            "-l",
            "127.0.0.1",
            "-t",
            "2",
            "-U",
            "0",
        ]);
        // memcached refuses to run as root unless told which user to be.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            server.extend(sv(&["-u", "root"]));
        }
        let secs = self.knobs.tool_secs.ceil() as u64;
        let client = sv(&[
            MEMASLAP,
            "-s",
            &format!("127.0.0.1:{p}"),
            "-T",
            "2",
            "-c",
            "16",
            "-t",
            &format!("{secs}s"),
            "-v",
            "0.1",
        ]);
        let r = self.server_client(cell, server, Ready::Port(port), client, secs as f64 + 2.0);
        self.tool_outcome(r, parse_memaslap)
    }
}

/// memaslap's summary: `Run time: 3.0s Ops: 354092 TPS: 118017 Net_rate: 132.0M/s`,
/// after `verify_failed: N` (a run that read back wrong values is a failure).
pub(crate) fn parse_memaslap(out: &str) -> Result<Vec<(String, f64)>, String> {
    let field = |line: &str, key: &str| -> Option<f64> {
        let rest = line.split(key).nth(1)?;
        rest.split_whitespace().next()?.parse().ok()
    };
    if let Some(n) = out.lines().find_map(|l| field(l, "verify_failed:")) {
        if n != 0.0 {
            return Err(format!("memaslap: {n} gets read back a wrong value"));
        }
    }
    let tps = out
        .lines()
        .filter(|l| l.contains("Run time:"))
        .find_map(|l| field(l, "TPS:"))
        .ok_or_else(|| {
            format!(
                "memaslap printed no TPS: {}",
                out.lines().last().unwrap_or("")
            )
        })?;
    Ok(vec![("ops_rps".to_string(), tps)])
}
