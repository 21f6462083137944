//! The `canal bench` command line and the options it yields.

use crate::model::{Plan, System, Variant, EXPERIMENT_IDS};
use clap::Args;
use std::path::PathBuf;

/// `canal bench`: the experiments of docs/bench/README.md beside their baselines.
///
/// Exit status: 0 when every native baseline ran (canal cells may fail; they are
/// reported with their reason), 1 when a native baseline failed, 2 on bad usage.
#[derive(Args, Debug, Clone, Default)]
pub struct BenchArgs {
    /// B1 … B13 or all [default: all]; see docs/bench/README.md
    #[arg(value_name = "EXPERIMENT")]
    pub(crate) experiments: Vec<String>,
    /// Small counts, 2 reps, < 2 min: checks the harness, asserts no target
    #[arg(long, overrides_with = "full")]
    pub(crate) quick: bool,
    /// 3 reps, longer runs; results meant for docs/bench/ (the default)
    #[arg(long, overrides_with = "quick")]
    pub(crate) full: bool,
    /// Where results go [default: bench-out/<mode>-<UTC time>]
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// Repetitions per cell
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) reps: Option<u32>,
    /// Seconds per generator run (rr/stream)
    #[arg(long, value_name = "S")]
    pub(crate) duration: Option<f64>,
    /// Message sizes in bytes, replacing each experiment's sizes (e.g. 64,1024)
    #[arg(long, value_name = "LIST", value_delimiter = ',',
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) sizes: Option<Vec<u64>>,
    /// A subset of tcp,uds,canal-gg,canal-gn,canal-ng
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_system)]
    pub(crate) systems: Option<Vec<System>>,
    /// Concurrent client/server pairs for B4/B9 (e.g. 1,2,4,8)
    #[arg(long, value_name = "LIST", value_delimiter = ',',
          value_parser = clap::value_parser!(u64).range(1..=64))]
    pub(crate) pairs: Option<Vec<u64>>,
    /// A subset of canal switch variants (default, notify=poll, disable=batch, split=0.5, …)
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_variant)]
    pub(crate) variants: Option<Vec<String>>,
    /// Pin generator servers to CPU 0 and clients to CPU 1 for every system (canald and
    /// tools unpinned); the default in --full mode
    #[arg(long, overrides_with = "no_pin")]
    pub(crate) pin: bool,
    /// Let the scheduler place every process (the default in --quick mode)
    #[arg(long, overrides_with = "pin")]
    pub(crate) no_pin: bool,
    /// Extra seconds a canal run may take before it is killed and reported failed
    #[arg(long, value_name = "S")]
    pub(crate) canal_grace: Option<f64>,
    /// Skip the PNG plots
    #[arg(long)]
    pub(crate) no_plots: bool,
    /// List the experiments and exit
    #[arg(long)]
    pub(crate) list: bool,
}

fn parse_system(s: &str) -> Result<System, String> {
    System::parse(s).ok_or_else(|| format!("'{s}' is not tcp, uds, canal-gg or canal-gn"))
}

fn parse_variant(s: &str) -> Result<String, String> {
    Variant::parse(s).map(|_| s.to_string())
}

/// What one `canal bench` run does.
pub(crate) struct Opts {
    pub(crate) quick: bool,
    pub(crate) exps: Vec<String>,
    pub(crate) out: Option<PathBuf>,
    pub(crate) reps: Option<usize>,
    pub(crate) duration: Option<f64>,
    pub(crate) plan: Plan,
    /// None: pinned in full mode, not in quick mode.
    pub(crate) pin: Option<bool>,
    pub(crate) plots: bool,
    pub(crate) canal_grace: Option<f64>,
    pub(crate) list: bool,
}

impl Opts {
    /// Generator ends pinned to different CPUs: the full mode's default, so the two ends
    /// of a ping-pong never share a core (for every system alike).
    pub(crate) fn pinned(&self) -> bool {
        self.pin.unwrap_or(!self.quick)
    }
}

impl BenchArgs {
    /// The run these arguments describe (experiment names checked).
    pub(crate) fn opts(&self) -> Result<Opts, String> {
        let mut exps = Vec::new();
        for x in &self.experiments {
            if x.eq_ignore_ascii_case("all") {
                exps.extend(EXPERIMENT_IDS.iter().map(|s| s.to_string()));
                continue;
            }
            let up = x.to_ascii_uppercase();
            if !EXPERIMENT_IDS.contains(&up.as_str()) {
                return Err(format!("unknown experiment '{x}' (B1 … B13 or all)"));
            }
            exps.push(up);
        }
        if exps.is_empty() {
            exps = EXPERIMENT_IDS.iter().map(|s| s.to_string()).collect();
        }
        let mut seen = std::collections::HashSet::new();
        exps.retain(|e| seen.insert(e.clone()));
        let usizes =
            |v: &Option<Vec<u64>>| v.as_ref().map(|v| v.iter().map(|&x| x as usize).collect());
        Ok(Opts {
            quick: self.quick,
            exps,
            out: self.out.clone(),
            reps: self.reps.map(|r| r as usize),
            duration: self.duration,
            plan: Plan {
                quick: self.quick,
                sizes: usizes(&self.sizes),
                pairs: usizes(&self.pairs),
                systems: self.systems.clone(),
                variants: self.variants.clone(),
            },
            pin: match (self.pin, self.no_pin) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
            plots: !self.no_plots,
            canal_grace: self.canal_grace,
            list: self.list,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn parse(v: &[&str]) -> Result<Opts, String> {
        let cli = Cli::try_parse_from(std::iter::once("bench").chain(v.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.args.opts()
    }

    #[test]
    fn parses_cli() {
        let o = parse(&[
            "--quick",
            "b2",
            "B7",
            "--sizes",
            "64,1024",
            "--systems=tcp,uds",
        ])
        .unwrap();
        assert!(o.quick);
        assert_eq!(o.exps, vec!["B2", "B7"]);
        assert_eq!(o.plan.sizes, Some(vec![64, 1024]));
        assert_eq!(o.plan.systems.as_ref().map(Vec::len), Some(2));
        assert!(parse(&["--systems", "quic"]).is_err());
        assert!(parse(&["--variants", "notify=fast"]).is_err());
        assert!(parse(&["B14"]).is_err());
        assert!(parse(&["--reps", "0"]).is_err());
        assert!(parse(&["--pairs", "65"]).is_err());
        // Pinned by default in full mode only; both overridable.
        assert!(!o.pinned());
        assert!(parse(&["--full"]).unwrap().pinned());
        assert!(!parse(&["--full", "--no-pin"]).unwrap().pinned());
        assert!(parse(&["--quick", "--pin"]).unwrap().pinned());
        assert_eq!(parse(&[]).unwrap().exps.len(), 14);
        assert_eq!(parse(&["all", "B1"]).unwrap().exps.len(), 14);
    }
}
