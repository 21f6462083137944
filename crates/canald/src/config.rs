//! canald's configuration: `Config`, its defaults, and the command line that sets it.
use crate::engine;
use crate::engine::CoalesceCfg;
use crate::engine::NotifyMode;
use crate::guest::config::GuestConfig;
use crate::sys;
use canal_abi::Layout;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Config {
    pub(crate) socket: PathBuf,
    /// Exit after this long without guests (None: never).
    pub(crate) idle_exit: Option<Duration>,
    pub(crate) slots: u32,
    pub(crate) sockets: u32,
    pub(crate) data_mib: u64,
    /// `--ring-kib`; None: DEFAULT_RING_KIB, shrunk to fit a small `--data-mib`.
    pub(crate) ring_kib: Option<u64>,
    /// Empty rounds before the poller sleeps; None: calibrated at start so the
    /// poller spins about SPIN_TARGET.
    pub(crate) spin: Option<u32>,
    /// Requests per guest per round.
    pub(crate) budget: usize,
    /// Policy: guests may only bind/connect/send to loopback addresses.
    pub(crate) loopback_only: bool,
    /// Short-circuit connections between canal guests (§8). Off with `--no-shortcut`
    /// or a non-empty `CANAL_NO_SHORTCUT` in canald's environment.
    pub(crate) shortcut: bool,
    /// Each ring of a pair segment, in KiB (rounded up to a power of two, ≥ 64).
    pub(crate) shortcut_ring_kib: u64,
    /// `--zones on|off`: pair segments carry buffer zones for sends larger than the
    /// ring's free space (protocol §10). Off by default (docs/bench/README.md, B8);
    /// `CANAL_ZONES=on` in canald's environment turns them on (test suites).
    pub(crate) zones: bool,
    pub(crate) verbose: bool,
    /// How the poller waits (`--notify`).
    pub(crate) notify: NotifyMode,
    /// Host → guest wake-up coalescing (`--t-worst-us`, `--split-us`, `--no-coalesce`).
    pub(crate) coalesce: CoalesceCfg,
    /// `--no-batch`: each host call moves at most one guest send's worth.
    pub(crate) no_batch: bool,
    /// Per-guest per-round byte quanta (receive, transmit).
    pub(crate) rx_quantum: u64,
    pub(crate) tx_quantum: u64,
    /// Pollers (`--workers`), and the CPUs to pin them to (`--pin`; empty: none).
    pub(crate) workers: usize,
    pub(crate) pin: Vec<usize>,
}

/// Default pollers: one on small machines (≤ 2 cores: guests need the other core),
/// else one per four cores, at most four.
pub(crate) fn default_workers() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores <= 2 {
        1
    } else {
        (cores / 4).clamp(1, 4)
    }
}

/// A socket's tx and rx rings, each (`--ring-kib`): while the data area has room. A
/// 64 KiB guest→native stream moved 1.58× the bytes with 1 MiB rings than with 256 KiB
/// (fewer ring-full waits and wake-ups; docs/bench/rings); sockets beyond what the area
/// holds at this size get smaller rings (`Guest::alloc_rings`).
pub(crate) const DEFAULT_RING_KIB: u64 = 1024;

/// What `--no-batch` allows per host call on a stream: one typical guest send.
pub(crate) const NO_BATCH_CHUNK: u64 = 4096;

/// The worst-case added wake-up delay of the two-layer coalescing when `--coalesce`
/// turns it on without `--t-worst-us`.
pub(crate) const DEFAULT_T_WORST: Duration = Duration::from_micros(50);

impl Config {
    pub(crate) fn new(socket: PathBuf) -> Config {
        Config {
            socket,
            idle_exit: None,
            slots: 256,
            sockets: 1024,
            data_mib: 256,
            ring_kib: None,
            spin: None,
            budget: 16,
            loopback_only: false,
            shortcut: std::env::var_os("CANAL_NO_SHORTCUT").is_none_or(|v| v.is_empty()),
            shortcut_ring_kib: 1024,
            zones: std::env::var_os("CANAL_ZONES").is_some_and(|v| v == "on"),
            verbose: false,
            notify: NotifyMode::Hybrid,
            // Off unless asked for: on this design a woken guest spins through the
            // events that follow, so deferring wake-ups only added latency in every
            // workload measured (docs/bench/coalescing).
            coalesce: CoalesceCfg::Off,
            no_batch: false,
            rx_quantum: 256 << 10,
            tx_quantum: 1 << 20,
            workers: default_workers(),
            pin: Vec::new(),
        }
    }

    pub(crate) fn guest_config(&self) -> Result<GuestConfig, String> {
        let data = self
            .data_mib
            .checked_mul(1 << 20)
            .ok_or("--data-mib too large")?;
        let layout = Layout::new(self.slots, self.sockets, data).ok_or_else(|| {
            format!(
                "bad region size: --slots must be a power of two <= {}, --sockets 1..={}, \
                 --data-mib >= 1",
                canal_abi::MAX_SLOTS,
                canal_abi::MAX_SOCKETS
            )
        })?;
        let mut ring =
            (self.ring_kib.unwrap_or(DEFAULT_RING_KIB).max(64) * 1024).next_power_of_two();
        if self.ring_kib.is_none() {
            ring = crate::guest::config::ring_for_four_sockets(ring, data);
        }
        if 2 * ring > data {
            return Err("--ring-kib too large for --data-mib".into());
        }
        Ok(GuestConfig {
            budget: self.budget.max(1),
            loopback_only: self.loopback_only,
            chunk: if self.no_batch {
                NO_BATCH_CHUNK
            } else {
                u64::MAX
            },
            rx_quantum: self.rx_quantum.max(4096),
            tx_quantum: self.tx_quantum.max(4096),
            ..GuestConfig::with_layout(layout, ring)
        })
    }
}

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

pub(crate) const USAGE: &str =
    "usage: canald [--socket PATH] [--idle-exit SECS] [--slots N] [--sockets N]
              [--data-mib N] [--ring-kib N] [--spin N] [--budget N] [--loopback-only] [-v]
              [--notify poll|sleep|hybrid] [--coalesce] [--t-worst-us T | --coalesce-us T]
              [--split-us P] [--no-coalesce] [--no-batch] [--rx-quantum-kib N] [--tx-quantum-kib N]
              [--workers N] [--pin CPU,CPU..] [--no-shortcut] [--shortcut-ring-kib N]
  --socket PATH     control socket (default: $CANAL_SOCKET, $XDG_RUNTIME_DIR/canal/canald.sock,
                    or /tmp/canal-$UID/canald.sock)
  --idle-exit SECS  exit after SECS without guests (0 = never; default 0)
  --slots N         request slots per guest (power of two, default 256)
  --sockets N       sockets per guest (default 1024)
  --data-mib N      ring memory per guest in MiB (default 256)
  --ring-kib N      each socket's tx and rx ring in KiB (default 1024); when the data
                    area runs short, later sockets get smaller rings (down to 64 KiB)
                    so that every socket table entry can still have some
  --spin N          fixed empty poller rounds before sleeping (default: adaptive budget)
  --budget N        requests served per guest per round (default 16)
  --notify MODE     poll (never sleeps; measurement only), sleep (never spins), or
                    hybrid (adaptive spin, then sleep; default)
  --coalesce        coalesce wake-ups: the two-layer split of T_worst = 50 µs between
                    host holds and guest wake-ups (default off: every wake-up goes out
                    at once, which measured faster and no costlier here)
  --t-worst-us T    coalesce with worst-case added wake-up delay T µs, split
                    adaptively between host holds and guest wake-ups (0: off)
  --coalesce-us T   same as --t-worst-us
  --split-us P      fixed host share T_p of T_worst instead of the adaptive split
  --no-coalesce     every wake-up goes out at once (the default)
  --no-batch        each host send/receive call moves at most 4 KiB (ablation)
  --rx-quantum-kib N, --tx-quantum-kib N
                    bytes a guest may receive / transmit per round (default 256 / 1024)
  --workers N       pollers (default 1 on <= 2 cores, else cores/4 up to 4); each
                    guest has a home worker, and with 2..16 workers its connected
                    streams are spread over all of them by a flow hash (virtual RSS)
  --pin CPU,CPU..   pin worker i to the i-th CPU of the list (cycled)
  --loopback-only   policy: guests may only bind, connect and send to loopback addresses
  --no-shortcut     never short-circuit connections between canal guests (also:
                    CANAL_NO_SHORTCUT=1 in canald's environment)
  --shortcut-ring-kib N  each ring of a short-circuited connection in KiB (default 1024)
  --zones on|off    buffer zones on short-circuited connections: sends larger than the
                    ring's free space go by (zone, offset) descriptors (default off;
                    also: CANAL_ZONES=on in canald's environment)
  -v                log to stderr";

pub(crate) fn parse_args(args: &[String]) -> Result<Config, String> {
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
                cfg.ring_kib = Some(num(a, v)?);
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
            "--notify" => {
                let m = v.ok_or("--notify needs a value")?;
                cfg.notify = engine::NotifyMode::parse(m)
                    .ok_or_else(|| format!("--notify: '{m}' is not poll, sleep or hybrid"))?;
                i += 1;
            }
            "--t-worst-us" | "--coalesce-us" => {
                let t = Duration::from_micros(num(a, v)?);
                cfg.coalesce = match cfg.coalesce {
                    engine::CoalesceCfg::Fixed { t_p, .. } => {
                        engine::CoalesceCfg::Fixed { t_worst: t, t_p }
                    }
                    _ if t.is_zero() => engine::CoalesceCfg::Off,
                    _ => engine::CoalesceCfg::Adaptive { t_worst: t },
                };
                i += 1;
            }
            "--split-us" => {
                let t_p = Duration::from_micros(num(a, v)?);
                let t_worst = match cfg.coalesce {
                    engine::CoalesceCfg::Adaptive { t_worst }
                    | engine::CoalesceCfg::Fixed { t_worst, .. } => t_worst,
                    engine::CoalesceCfg::Off => crate::config::DEFAULT_T_WORST,
                };
                cfg.coalesce = engine::CoalesceCfg::Fixed { t_worst, t_p };
                i += 1;
            }
            "--no-coalesce" => cfg.coalesce = engine::CoalesceCfg::Off,
            "--coalesce" => {
                if cfg.coalesce == engine::CoalesceCfg::Off {
                    cfg.coalesce = engine::CoalesceCfg::Adaptive {
                        t_worst: crate::config::DEFAULT_T_WORST,
                    };
                }
            }
            "--no-batch" => cfg.no_batch = true,
            "--workers" => {
                cfg.workers = num(a, v)?;
                if !(1..=64).contains(&cfg.workers) {
                    return Err("--workers must be 1..=64".into());
                }
                i += 1;
            }
            "--pin" => {
                let list = v.ok_or("--pin needs a value")?;
                cfg.pin = list
                    .split(',')
                    .map(|c| c.trim().parse::<usize>())
                    .collect::<Result<_, _>>()
                    .map_err(|_| format!("--pin: '{list}' is not a list of CPU numbers"))?;
                i += 1;
            }
            "--rx-quantum-kib" => {
                cfg.rx_quantum = num::<u64>(a, v)?.saturating_mul(1024);
                i += 1;
            }
            "--tx-quantum-kib" => {
                cfg.tx_quantum = num::<u64>(a, v)?.saturating_mul(1024);
                i += 1;
            }
            "--no-shortcut" => cfg.shortcut = false,
            "--shortcut-ring-kib" => {
                cfg.shortcut_ring_kib = num(a, v)?;
                i += 1;
            }
            "--zones" => {
                cfg.zones = match v.map(String::as_str) {
                    Some("on") => true,
                    Some("off") => false,
                    _ => return Err("--zones needs on or off".into()),
                };
                i += 1;
            }
            "-v" | "--verbose" => cfg.verbose = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument '{other}'")),
        }
        i += 1;
    }
    cfg.guest_config()?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
        assert_eq!(c.notify, engine::NotifyMode::Hybrid);
        let c = parse_args(&s(&["--notify", "poll", "--no-batch", "--no-coalesce"])).unwrap();
        assert_eq!(c.notify, engine::NotifyMode::Poll);
        assert!(c.no_batch);
        assert_eq!(c.coalesce, engine::CoalesceCfg::Off);
        assert!(parse_args(&s(&["--notify", "spin"])).is_err());
        let c = parse_args(&s(&["--t-worst-us", "80", "--split-us", "30"])).unwrap();
        assert_eq!(
            c.coalesce,
            engine::CoalesceCfg::Fixed {
                t_worst: Duration::from_micros(80),
                t_p: Duration::from_micros(30)
            }
        );
        let c = parse_args(&s(&["--workers", "2", "--pin", "0,1"])).unwrap();
        assert_eq!((c.workers, c.pin.clone()), (2, vec![0, 1]));
        assert!(parse_args(&s(&["--workers", "0"])).is_err());
        assert!(parse_args(&s(&["--pin", "a,1"])).is_err());
        let c = parse_args(&s(&["--coalesce", "--coalesce-us", "0"])).unwrap();
        assert_eq!(c.coalesce, engine::CoalesceCfg::Off);
    }

    #[test]
    fn coalescing_is_off_unless_asked_for() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(parse_args(&[]).unwrap().coalesce, engine::CoalesceCfg::Off);
        let on = engine::CoalesceCfg::Adaptive {
            t_worst: crate::config::DEFAULT_T_WORST,
        };
        assert_eq!(parse_args(&s(&["--coalesce"])).unwrap().coalesce, on);
        // --coalesce keeps a window or split given before it.
        let c = parse_args(&s(&["--t-worst-us", "80", "--coalesce"])).unwrap();
        assert_eq!(
            c.coalesce,
            engine::CoalesceCfg::Adaptive {
                t_worst: Duration::from_micros(80)
            }
        );
        let c = parse_args(&s(&["--coalesce", "--no-coalesce"])).unwrap();
        assert_eq!(c.coalesce, engine::CoalesceCfg::Off);
    }
}
