//! The `canald` command line (also `canal daemon`): parse, bind, serve.
use crate::config::parse_args;
use crate::config::USAGE;
use crate::daemon::Bound;
use crate::daemon::Daemon;

/// The `canald` command line (also `canal daemon`). Returns the exit status.
pub fn cli_main(args: Vec<String>) -> i32 {
    let cfg = match parse_args(&args) {
        Ok(c) => c,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("canald: {e}\n{USAGE}");
            return 2;
        }
    };
    let mut d = match Daemon::bind(cfg) {
        Ok(Bound::Serving(d)) => d,
        Ok(Bound::AlreadyRunning) => return 0,
        Err(e) => {
            eprintln!("canald: {e}");
            return 1;
        }
    };
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
