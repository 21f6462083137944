//! The `canald` command line (also `canal daemon`): parse, bind, serve.

use crate::config::DaemonArgs;
use crate::daemon::{Bound, Daemon};
use clap::Parser;

/// canald, the canal host service: performs guests' socket calls on the host's
/// network stack.
#[derive(Parser, Debug)]
#[command(name = "canald", version, about)]
struct Cli {
    #[command(flatten)]
    args: DaemonArgs,
}

/// The `canald` binary: parses `std::env::args()`. Returns the exit status.
pub fn cli_main() -> i32 {
    match parse_or_status::<Cli>("canald") {
        Ok(cli) => serve(&cli.args),
        Err(status) => status,
    }
}

/// canald's command definition (for man pages and completions).
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Parses the process's arguments. Err(exit status) when there is nothing to run:
/// `--help` and `--version` printed (0; a closed standard output is reported, 1),
/// or a usage error said on standard error (2).
pub fn parse_or_status<P: Parser>(prog: &str) -> Result<P, i32> {
    use clap::error::ErrorKind;
    match P::try_parse() {
        Ok(p) => Ok(p),
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            Err(crate::output::print_or_fail(prog, &e.render().to_string()))
        }
        Err(e) => {
            let _ = e.print();
            Err(2)
        }
    }
}

/// Binds the control socket and serves until told to stop (or idle). Returns the
/// exit status: 0 also when another canald already serves the socket.
pub fn serve(args: &DaemonArgs) -> i32 {
    let cfg = match crate::config::layers::resolve(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("canald: {e}");
            return 2;
        }
    };
    if args.print_config {
        return crate::output::print_or_fail(
            "canald",
            &crate::config::layers::render(&cfg.settings),
        );
    }
    crate::logging::init(cfg.verbose);
    let mut d = match Daemon::bind(cfg) {
        Ok(Bound::Serving(d)) => d,
        Ok(Bound::AlreadyRunning) => return 0,
        Err(e) => {
            eprintln!("canald: {e}");
            return 1;
        }
    };
    if let Some(addr) = d.cfg.metrics {
        match crate::metrics::http::start(addr, d.cfg.socket.clone()) {
            Ok(a) => log::info!("metrics at http://{a}/metrics"),
            Err(e) => {
                eprintln!("canald: --metrics {addr}: {e}");
                return 1;
            }
        }
    }
    if let Err(e) = d.handle_signals() {
        eprintln!("canald: signals: {e}");
        return 1;
    }
    match d.run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("canald: {e}");
            1
        }
    }
}
