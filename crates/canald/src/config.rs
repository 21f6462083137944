//! canald's configuration: `Config`, its defaults, and the command line that sets it.
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
    /// Host → guest wake-up coalescing (`--coalesce`, `--t-worst-us`, `--split-us`).
    pub(crate) coalesce: CoalesceCfg,
    /// `--no-batch`: each host call moves at most one guest send's worth.
    pub(crate) no_batch: bool,
    /// Per-guest per-round byte quanta (receive, transmit).
    pub(crate) rx_quantum: u64,
    pub(crate) tx_quantum: u64,
    /// Pollers (`--workers`), and the CPUs to pin them to (`--pin`; empty: none).
    pub(crate) workers: usize,
    pub(crate) pin: Vec<usize>,
    /// Where a network guest's resolver (10.0.2.3:53) is forwarded: `--dns`, else the
    /// first IPv4 nameserver of /etc/resolv.conf.
    pub(crate) dns: Option<std::net::SocketAddrV4>,
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

/// A socket's tx and rx rings, each (`--ring-kib`): while the data area has room
/// (fewer ring-full waits and wake-ups than smaller rings; docs/bench/why.md); sockets
/// beyond what the area holds at this size get smaller rings (`Guest::alloc_rings`).
pub(crate) const DEFAULT_RING_KIB: u64 = 1024;

/// Defaults shared by `Config::new` and the command line (`DaemonArgs`).
const DEFAULT_SLOTS: u32 = 256;
/// Every entry a handle can name: the table is sparse (pages committed as entries are
/// used), so the quota costs nothing until used; canald lowers it to what its own
/// descriptor limit can serve (`fdbudget`).
const DEFAULT_SOCKETS: u32 = canal_abi::MAX_SOCKETS;
const DEFAULT_DATA_MIB: u64 = 256;
const DEFAULT_BUDGET: usize = 16;
const DEFAULT_SHORTCUT_RING_KIB: u64 = 1024;
const DEFAULT_RX_QUANTUM_KIB: u64 = 256;
const DEFAULT_TX_QUANTUM_KIB: u64 = 1024;

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
            slots: DEFAULT_SLOTS,
            sockets: DEFAULT_SOCKETS,
            data_mib: DEFAULT_DATA_MIB,
            ring_kib: None,
            spin: None,
            budget: DEFAULT_BUDGET,
            loopback_only: false,
            shortcut: std::env::var_os("CANAL_NO_SHORTCUT").is_none_or(|v| v.is_empty()),
            shortcut_ring_kib: DEFAULT_SHORTCUT_RING_KIB,
            zones: std::env::var_os("CANAL_ZONES").is_some_and(|v| v == "on"),
            verbose: false,
            notify: NotifyMode::Hybrid,
            // Off unless asked for: on this design a woken guest spins through the
            // events that follow, so deferring wake-ups only added latency in every
            // workload measured (docs/bench/coalescing).
            coalesce: CoalesceCfg::Off,
            no_batch: false,
            rx_quantum: DEFAULT_RX_QUANTUM_KIB << 10,
            tx_quantum: DEFAULT_TX_QUANTUM_KIB << 10,
            workers: default_workers(),
            pin: Vec::new(),
            dns: crate::network::host_resolver(),
        }
    }

    pub(crate) fn guest_config(&self) -> Result<GuestConfig, ConfigError> {
        // The pool for rings above the smallest, on top of the smallest rings for every
        // table entry (so the quota's last socket still gets rings). Sparse: only
        // rings written to commit memory.
        let pool = self
            .data_mib
            .checked_mul(1 << 20)
            .ok_or(ConfigError::DataTooLarge)?;
        let data = (self.sockets as u64 * 2 * crate::guest::config::MIN_RING)
            .checked_add(pool)
            .ok_or(ConfigError::DataTooLarge)?;
        let layout = Layout::new(self.slots, self.sockets, data).ok_or(ConfigError::BadLayout)?;
        let mut ring =
            (self.ring_kib.unwrap_or(DEFAULT_RING_KIB).max(64) * 1024).next_power_of_two();
        if self.ring_kib.is_none() {
            ring = crate::guest::config::ring_for_four_sockets(ring, pool);
        }
        if 2 * ring > pool.max(2 * crate::guest::config::MIN_RING) {
            return Err(ConfigError::RingTooLarge);
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

/// A configuration that cannot serve: the region its options describe does not fit.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--data-mib too large")]
    DataTooLarge,
    #[error(
        "bad region size: --slots must be a power of two <= {}, --sockets 1..={}, \
         --data-mib >= 1",
        canal_abi::MAX_SLOTS,
        canal_abi::MAX_SOCKETS
    )]
    BadLayout,
    #[error("--ring-kib too large for --data-mib")]
    RingTooLarge,
}

/// canald's command line (also `canal daemon`). Every option has the default of
/// `Config::new`.
#[derive(clap::Args, Debug, Clone)]
pub struct DaemonArgs {
    /// Control socket [default: $CANAL_SOCKET, $XDG_RUNTIME_DIR/canal/canald.sock, or
    /// /tmp/canal-$UID/canald.sock]
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Exit after SECS without guests (0: never)
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    pub idle_exit: u64,
    /// Request slots per guest (a power of two)
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SLOTS)]
    pub slots: u32,
    /// Socket quota per guest (at most 65535; lowered to what canald's descriptor
    /// limit serves). Table entries and rings take memory only while used
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SOCKETS)]
    pub sockets: u32,
    /// Ring memory per guest in MiB beyond every socket's smallest (64 KiB) rings:
    /// the pool for larger rings
    #[arg(long, value_name = "N", default_value_t = DEFAULT_DATA_MIB)]
    pub data_mib: u64,
    /// Each socket's tx and rx ring in KiB [default: 1024]; when the data area runs
    /// short, later sockets get smaller rings (down to 64 KiB) so that every socket
    /// table entry can still have some
    #[arg(long, value_name = "N")]
    pub ring_kib: Option<u64>,
    /// Fixed empty poller rounds before sleeping [default: adaptive budget]
    #[arg(long, value_name = "N")]
    pub spin: Option<u32>,
    /// Requests served per guest per round
    #[arg(long, value_name = "N", default_value_t = DEFAULT_BUDGET)]
    pub budget: usize,
    /// How pollers wait: poll (never sleeps; measurement only), sleep (never spins),
    /// or hybrid (adaptive spin, then sleep)
    #[arg(long, value_name = "MODE", default_value = "hybrid", value_parser = parse_notify)]
    pub notify: NotifyMode,
    /// Coalesce wake-ups: the two-layer split of T_worst = 50 µs between host holds
    /// and guest wake-ups (off by default: every wake-up goes out at once)
    #[arg(long)]
    pub coalesce: bool,
    /// Coalesce with worst-case added wake-up delay T µs, split adaptively between
    /// host holds and guest wake-ups (0: off)
    #[arg(long, value_name = "T")]
    pub t_worst_us: Option<u64>,
    /// Fixed host share T_p of T_worst instead of the adaptive split
    #[arg(long, value_name = "P")]
    pub split_us: Option<u64>,
    /// Each host send/receive call moves at most 4 KiB (ablation)
    #[arg(long)]
    pub no_batch: bool,
    /// Bytes a guest may receive per round, in KiB
    #[arg(long, value_name = "N", default_value_t = DEFAULT_RX_QUANTUM_KIB)]
    pub rx_quantum_kib: u64,
    /// Bytes a guest may transmit per round, in KiB
    #[arg(long, value_name = "N", default_value_t = DEFAULT_TX_QUANTUM_KIB)]
    pub tx_quantum_kib: u64,
    /// Pollers [default: 1 on <= 2 cores, else cores/4 up to 4]; each guest has a home
    /// worker, and with 2..16 workers its connected streams are spread over all of
    /// them by a flow hash (virtual RSS)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub workers: Option<u16>,
    /// Pin worker i to the i-th CPU of the list (cycled)
    #[arg(long, value_name = "CPU,CPU..", value_delimiter = ',')]
    pub pin: Vec<usize>,
    /// Policy: guests may only bind, connect and send to loopback addresses
    #[arg(long)]
    pub loopback_only: bool,
    /// Never short-circuit connections between canal guests (also:
    /// CANAL_NO_SHORTCUT=1 in canald's environment)
    #[arg(long)]
    pub no_shortcut: bool,
    /// Each ring of a short-circuited connection in KiB
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SHORTCUT_RING_KIB)]
    pub shortcut_ring_kib: u64,
    /// Buffer zones on short-circuited connections: sends larger than the ring's free
    /// space go by (zone, offset) descriptors [default: off; also CANAL_ZONES=on in
    /// canald's environment]
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    pub zones: Option<bool>,
    /// The resolver isolated and VM guests reach as 10.0.2.3:53 (IP or IP:PORT)
    /// [default: the first IPv4 nameserver of /etc/resolv.conf]
    #[arg(long, value_name = "ADDR", value_parser = parse_dns)]
    pub dns: Option<std::net::SocketAddrV4>,
    /// Log every guest's attach and departure to stderr
    #[arg(short, long)]
    pub verbose: bool,
}

fn parse_dns(s: &str) -> Result<std::net::SocketAddrV4, String> {
    s.parse::<std::net::SocketAddrV4>()
        .or_else(|_| s.parse().map(|ip| std::net::SocketAddrV4::new(ip, 53)))
        .map_err(|_| format!("'{s}' is not an IPv4 address or IPv4:PORT"))
}

fn parse_notify(s: &str) -> Result<NotifyMode, String> {
    NotifyMode::parse(s.as_bytes()).ok_or_else(|| format!("'{s}' is not poll, sleep or hybrid"))
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("'{s}' is not on or off")),
    }
}

impl DaemonArgs {
    /// The configuration these options describe (checked: the region must fit).
    pub fn config(&self) -> Result<Config, ConfigError> {
        let mut cfg = Config::new(self.socket.clone().unwrap_or_else(default_socket_path));
        cfg.idle_exit = (self.idle_exit > 0).then(|| Duration::from_secs(self.idle_exit));
        cfg.slots = self.slots;
        cfg.sockets = self.sockets;
        cfg.data_mib = self.data_mib;
        cfg.ring_kib = self.ring_kib;
        cfg.spin = self.spin;
        cfg.budget = self.budget;
        cfg.loopback_only = self.loopback_only;
        cfg.notify = self.notify;
        cfg.coalesce = self.coalescing();
        cfg.no_batch = self.no_batch;
        cfg.rx_quantum = self.rx_quantum_kib.saturating_mul(1024);
        cfg.tx_quantum = self.tx_quantum_kib.saturating_mul(1024);
        if let Some(w) = self.workers {
            cfg.workers = w.into();
        }
        cfg.pin = self.pin.clone();
        if self.dns.is_some() {
            cfg.dns = self.dns;
        }
        cfg.shortcut &= !self.no_shortcut;
        cfg.shortcut_ring_kib = self.shortcut_ring_kib;
        if let Some(z) = self.zones {
            cfg.zones = z;
        }
        cfg.verbose = self.verbose;
        cfg.guest_config()?;
        Ok(cfg)
    }

    /// Off unless asked for; a fixed split keeps the given (or default) window; a
    /// window of 0 is off.
    fn coalescing(&self) -> CoalesceCfg {
        let us = Duration::from_micros;
        match (self.split_us, self.t_worst_us) {
            (Some(p), t) => CoalesceCfg::Fixed {
                t_worst: t.map_or(DEFAULT_T_WORST, us),
                t_p: us(p),
            },
            (None, Some(0)) => CoalesceCfg::Off,
            (None, Some(t)) => CoalesceCfg::Adaptive { t_worst: us(t) },
            (None, None) if self.coalesce => CoalesceCfg::Adaptive {
                t_worst: DEFAULT_T_WORST,
            },
            (None, None) => CoalesceCfg::Off,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: DaemonArgs,
    }

    fn parse_args(v: &[&str]) -> Result<Config, String> {
        let cli = Cli::try_parse_from(std::iter::once("canald").chain(v.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.args.config().map_err(|e| e.to_string())
    }

    #[test]
    fn args() {
        let c = parse_args(&["--socket", "/x/y", "--idle-exit", "3", "--spin", "7"]).unwrap();
        assert_eq!(c.socket, PathBuf::from("/x/y"));
        assert_eq!(c.idle_exit, Some(Duration::from_secs(3)));
        assert_eq!(c.spin, Some(7));
        let c = parse_args(&["--socket=/a/b", "--spin=9"]).unwrap();
        assert_eq!((c.socket, c.spin), (PathBuf::from("/a/b"), Some(9)));
        assert!(parse_args(&["--slots", "3"]).is_err());
        assert!(parse_args(&["--bogus"]).is_err());
        assert!(parse_args(&["--spin"]).is_err());
        let c = parse_args(&["--idle-exit", "0"]).unwrap();
        assert_eq!(c.idle_exit, None);
        assert_eq!(c.notify, NotifyMode::Hybrid);
        let c = parse_args(&["--notify", "poll", "--no-batch"]).unwrap();
        assert_eq!(c.notify, NotifyMode::Poll);
        assert!(c.no_batch);
        assert_eq!(c.coalesce, CoalesceCfg::Off);
        assert!(parse_args(&["--notify", "spin"]).is_err());
        let c = parse_args(&["--t-worst-us", "80", "--split-us", "30"]).unwrap();
        assert_eq!(
            c.coalesce,
            CoalesceCfg::Fixed {
                t_worst: Duration::from_micros(80),
                t_p: Duration::from_micros(30)
            }
        );
        let c = parse_args(&["--workers", "2", "--pin", "0,1"]).unwrap();
        assert_eq!((c.workers, c.pin.clone()), (2, vec![0, 1]));
        assert!(parse_args(&["--workers", "0"]).is_err());
        assert!(parse_args(&["--pin", "a,1"]).is_err());
        assert!(parse_args(&["--zones", "maybe"]).is_err());
        assert!(parse_args(&["--zones", "on"]).unwrap().zones);
        let c = parse_args(&["--rx-quantum-kib", "8", "--no-shortcut"]).unwrap();
        assert_eq!(c.rx_quantum, 8192);
        assert!(!c.shortcut);
    }

    #[test]
    fn coalescing_is_off_unless_asked_for() {
        assert_eq!(parse_args(&[]).unwrap().coalesce, CoalesceCfg::Off);
        let on = CoalesceCfg::Adaptive {
            t_worst: DEFAULT_T_WORST,
        };
        assert_eq!(parse_args(&["--coalesce"]).unwrap().coalesce, on);
        // A window given with --coalesce is kept, in either order.
        let w80 = CoalesceCfg::Adaptive {
            t_worst: Duration::from_micros(80),
        };
        assert_eq!(
            parse_args(&["--t-worst-us", "80", "--coalesce"])
                .unwrap()
                .coalesce,
            w80
        );
        assert_eq!(
            parse_args(&["--coalesce", "--t-worst-us", "80"])
                .unwrap()
                .coalesce,
            w80
        );
        // A window of 0 is off, even with --coalesce.
        let c = parse_args(&["--coalesce", "--t-worst-us", "0"]).unwrap();
        assert_eq!(c.coalesce, CoalesceCfg::Off);
        // A split alone uses the default window.
        let c = parse_args(&["--split-us", "10"]).unwrap();
        assert_eq!(
            c.coalesce,
            CoalesceCfg::Fixed {
                t_worst: DEFAULT_T_WORST,
                t_p: Duration::from_micros(10)
            }
        );
    }
}
