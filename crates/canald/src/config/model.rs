//! `Config`, its defaults, the errors of a configuration that cannot serve, and the
//! effective settings list.
use crate::engine::CoalesceCfg;
use crate::engine::NotifyMode;
use crate::guest::config::GuestConfig;
use crate::sys;
use canal_abi::Layout;
use std::path::PathBuf;
use std::time::Duration;

/// One effective option: its key, value (TOML) and origin.
#[derive(Debug, Clone, serde::Serialize, PartialEq)]
pub struct Setting {
    pub key: &'static str,
    pub value: toml::Value,
    pub origin: String,
}

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
    /// `--arenas on|off`: the segments of two guests' connections are slots of their
    /// pair arenas (protocol §8.7) instead of a file each. On by default;
    /// `CANAL_ARENAS=off` in canald's environment turns them off.
    pub(crate) arenas: bool,
    /// `--bells on|off`: direct peer wake-ups between arena connections' guests
    /// (protocol §8.8). On by default; `CANAL_BELLS=off` turns them off.
    pub(crate) bells: bool,
    /// `--direct on|off`: DIRECT guests keep sockets to native peers on kernel
    /// sockets of their own (protocol §2 DIRECTORY). On by default;
    /// `CANAL_DIRECT=off` turns it off.
    pub(crate) direct: bool,
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
    /// Every option's effective value and origin (empty unless built by
    /// `layers::resolve`).
    pub(crate) settings: Vec<Setting>,
    /// Where Prometheus metrics are served (`--metrics`; None: nowhere).
    pub(crate) metrics: Option<std::net::SocketAddr>,
    /// Serve other users through daemons of their own (`--serve-users`, root only).
    pub(crate) serve_users: bool,
    /// A user's canald: the channel its connections arrive on (`--user-channel`).
    pub(crate) user_channel: Option<i32>,
    /// `--config`, if given (a user's canald reads the same file).
    pub(crate) config_file: Option<PathBuf>,
    /// The settings the command line set (a user's canald gets them too).
    pub(crate) cli_settings: Vec<Setting>,
    /// Quotas and policy per guest (configuration files).
    pub(crate) quota: std::sync::Arc<crate::quota::QuotaTable>,
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
pub(crate) const DEFAULT_RING_KIB: u64 = 2048;

/// Defaults shared by `Config::new` and the command line (`DaemonArgs`).
pub(crate) const DEFAULT_SLOTS: u32 = 2048;
/// Every entry a handle can name: the table is sparse (pages committed as entries are
/// used), so the quota costs nothing until used; canald lowers it to what its own
/// descriptor limit can serve (`fdbudget`).
pub(crate) const DEFAULT_SOCKETS: u32 = canal_abi::MAX_SOCKETS;
pub(crate) const DEFAULT_DATA_MIB: u64 = 256;
pub(crate) const DEFAULT_BUDGET: usize = 16;
pub(crate) const DEFAULT_SHORTCUT_RING_KIB: u64 = 1024;
pub(crate) const DEFAULT_RX_QUANTUM_KIB: u64 = 256;
pub(crate) const DEFAULT_TX_QUANTUM_KIB: u64 = 1024;

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
            arenas: std::env::var_os("CANAL_ARENAS").is_none_or(|v| v != "off"),
            bells: std::env::var_os("CANAL_BELLS").is_none_or(|v| v != "off"),
            direct: std::env::var_os("CANAL_DIRECT").is_none_or(|v| v != "off"),
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
            settings: Vec::new(),
            metrics: None,
            serve_users: false,
            user_channel: None,
            config_file: None,
            cli_settings: Vec::new(),
            quota: Default::default(),
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
    #[error("--workers {0}: must be 1..=64")]
    Workers(u16),
    /// A configuration file that cannot be read, is not to be trusted, or does not
    /// parse (line 0: the whole file).
    #[error("{}{}: {reason}", path.display(), if *line > 0 { format!(":{line}") } else { String::new() })]
    File {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error(
        "--serve-users needs canald to run as root (it starts each user's canald as that user)"
    )]
    ServeUsersNeedsRoot,
    /// A quota table that parses but cannot apply (an unknown user, a bad cgroup).
    #[error("{0}")]
    Quota(String),
    /// An error about values a file set, with where.
    #[error("{reason} ({origins})")]
    Blamed { reason: String, origins: String },
}

impl ConfigError {
    /// The option keys an error is about.
    pub(crate) fn keys(&self) -> &'static [&'static str] {
        match self {
            ConfigError::DataTooLarge => &["data-mib"],
            ConfigError::BadLayout => &["slots", "sockets", "data-mib"],
            ConfigError::RingTooLarge => &["ring-kib", "data-mib"],
            ConfigError::Workers(_) => &["workers"],
            ConfigError::Quota(_) => &["quota"],
            ConfigError::ServeUsersNeedsRoot => &["serve-users"],
            ConfigError::File { .. } | ConfigError::Blamed { .. } => &[],
        }
    }
}
