//! canald, the canal host service: performs guests' socket calls on the host's
//! network stack. Guests reach it through a Unix control socket (attach, wake-up
//! ports, listing) and a shared-memory region each (requests, rings), as described in
//! `docs/protocol.md`; guest memory is treated as hostile (`docs/threat-model.md`).
//!
//! Code map: `sys` (the only unsafe code: small syscall wrappers), `alloc` (data-area
//! allocator), `request` (copy-then-validate of request slots), `guest` (one guest's
//! sockets and its service round), `daemon` (control socket and the poller loop),
//! `stat` (the listing), `vm` (VM guests: region files,
//! address view), `fuzz` (the request consumer's fuzz entry point).
#![deny(unsafe_code)]

pub mod alloc;
pub mod daemon;
pub mod fuzz;
pub mod guest;
pub mod request;
pub mod stat;
pub mod sys;
pub mod vm;

pub use daemon::{fetch_stat, Bound, Config, Daemon};
use std::path::PathBuf;
use std::time::Duration;

/// `$CANAL_SOCKET`, else `$XDG_RUNTIME_DIR/canal/canald.sock`, else
/// `/tmp/canal-$UID/canald.sock`.
pub fn default_socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os("CANAL_SOCKET").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()) {
        return PathBuf::from(d).join("canal").join("canald.sock");
    }
    PathBuf::from(format!("/tmp/canal-{}/canald.sock", sys::getuid()))
}

const USAGE: &str = "usage: canald [--socket PATH] [--idle-exit SECS] [--slots N] [--sockets N]
              [--data-mib N] [--ring-kib N] [--spin N] [--budget N] [--loopback-only] [-v]
  --socket PATH     control socket (default: $CANAL_SOCKET, $XDG_RUNTIME_DIR/canal/canald.sock,
                    or /tmp/canal-$UID/canald.sock)
  --idle-exit SECS  exit after SECS without guests (0 = never; default 0)
  --slots N         request slots per guest (power of two, default 256)
  --sockets N       sockets per guest (default 1024)
  --data-mib N      ring memory per guest in MiB (default 256)
  --ring-kib N      each socket's tx and rx ring in KiB (default 256)
  --spin N          empty poller rounds before sleeping (default: calibrated to ~30 us)
  --budget N        requests served per guest per round (default 64)
  --loopback-only   policy: guests may only bind, connect and send to loopback addresses
  -v                log to stderr";

fn parse_args(args: &[String]) -> Result<Config, String> {
    let mut cfg = Config::new(default_socket_path());
    let mut i = 0;
    fn num<T: std::str::FromStr>(flag: &str, v: Option<&String>) -> Result<T, String> {
        v.ok_or_else(|| format!("{flag} needs a value"))?
            .parse()
            .map_err(|_| format!("{flag}: not a number"))
    }
    while i < args.len() {
        let a = args[i].as_str();
        let v = args.get(i + 1);
        match a {
            "--socket" => {
                cfg.socket = PathBuf::from(v.ok_or("--socket needs a value")?);
                i += 1;
            }
            "--idle-exit" => {
                let s: u64 = num(a, v)?;
                cfg.idle_exit = (s > 0).then(|| Duration::from_secs(s));
                i += 1;
            }
            "--slots" => {
                cfg.slots = num(a, v)?;
                i += 1;
            }
            "--sockets" => {
                cfg.sockets = num(a, v)?;
                i += 1;
            }
            "--data-mib" => {
                cfg.data_mib = num(a, v)?;
                i += 1;
            }
            "--ring-kib" => {
                cfg.ring_kib = num(a, v)?;
                i += 1;
            }
            "--spin" => {
                cfg.spin = Some(num(a, v)?);
                i += 1;
            }
            "--budget" => {
                cfg.budget = num(a, v)?;
                i += 1;
            }
            "--loopback-only" => cfg.loopback_only = true,
            "-v" | "--verbose" => cfg.verbose = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument '{other}'")),
        }
        i += 1;
    }
    cfg.guest_config()?;
    Ok(cfg)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let c = parse_args(&s(&["--socket", "/x/y", "--idle-exit", "3", "--spin", "7"])).unwrap();
        assert_eq!(c.socket, PathBuf::from("/x/y"));
        assert_eq!(c.idle_exit, Some(Duration::from_secs(3)));
        assert_eq!(c.spin, Some(7));
        assert!(parse_args(&s(&["--slots", "3"])).is_err());
        assert!(parse_args(&s(&["--bogus"])).is_err());
        assert!(parse_args(&s(&["--spin"])).is_err());
        let c = parse_args(&s(&["--idle-exit", "0"])).unwrap();
        assert_eq!(c.idle_exit, None);
    }
}
