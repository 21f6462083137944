//! canald's options: the command line (also `canal daemon`), and the same options as
//! keys of a TOML file (`config::file`). Every field is optional here: what neither
//! the command line nor a file sets keeps the default of `Config::new`, and
//! `config::layers` records where each value came from (`--print-config`).
use super::model::{
    default_socket_path, Config, ConfigError, DEFAULT_BUDGET, DEFAULT_DATA_MIB,
    DEFAULT_RX_QUANTUM_KIB, DEFAULT_SHORTCUT_RING_KIB, DEFAULT_SLOTS, DEFAULT_SOCKETS,
    DEFAULT_TX_QUANTUM_KIB, DEFAULT_T_WORST,
};
use crate::engine::{CoalesceCfg, NotifyMode};
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// canald's options. On the command line as `--key value` or `--key=value`; in a
/// configuration file as `key = value` (the same names).
#[derive(clap::Args, Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct DaemonArgs {
    /// Read options from this TOML file instead of /etc/canal/canald.toml and
    /// ~/.config/canal/canald.toml (command-line options win over the file's)
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Print the effective configuration, with where each value came from, and exit
    #[arg(long)]
    #[serde(skip)]
    pub print_config: bool,
    /// Control socket [default: $CANAL_SOCKET, $XDG_RUNTIME_DIR/canal/canald.sock, or
    /// /tmp/canal-$UID/canald.sock]; a socket handed over by systemd (LISTEN_FDS) is
    /// served instead of binding one
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Exit after SECS without guests (0: never) [default: 0]
    #[arg(long, value_name = "SECS")]
    pub idle_exit: Option<u64>,
    /// Request slots per guest (a power of two) [default: 2048]
    #[arg(long, value_name = "N")]
    pub slots: Option<u32>,
    /// Socket quota per guest (at most 65535; lowered to what canald's descriptor
    /// limit serves). Table entries and rings take memory only while used
    /// [default: 65535]
    #[arg(long, value_name = "N")]
    pub sockets: Option<u32>,
    /// Ring memory per guest in MiB beyond every socket's smallest (64 KiB) rings:
    /// the pool for larger rings [default: 256]
    #[arg(long, value_name = "N")]
    pub data_mib: Option<u64>,
    /// Each socket's tx and rx ring in KiB [default: 2048]; when the data area runs
    /// short, later sockets get smaller rings (down to 64 KiB) so that every socket
    /// table entry can still have some
    #[arg(long, value_name = "N")]
    pub ring_kib: Option<u64>,
    /// Fixed empty poller rounds before sleeping [default: adaptive budget]
    #[arg(long, value_name = "N")]
    pub spin: Option<u32>,
    /// Requests served per guest per round [default: 16]
    #[arg(long, value_name = "N")]
    pub budget: Option<usize>,
    /// How pollers wait: poll (never sleeps; measurement only), sleep (never spins),
    /// or hybrid (adaptive spin, then sleep) [default: hybrid]
    #[arg(long, value_name = "MODE", value_parser = parse_notify)]
    #[serde(default, deserialize_with = "de_notify")]
    pub notify: Option<NotifyMode>,
    /// Coalesce wake-ups: the two-layer split of T_worst = 50 µs between host holds
    /// and guest wake-ups (off by default: every wake-up goes out at once)
    #[arg(long)]
    #[serde(default)]
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
    #[serde(default)]
    pub no_batch: bool,
    /// Bytes a guest may receive per round, in KiB [default: 256]
    #[arg(long, value_name = "N")]
    pub rx_quantum_kib: Option<u64>,
    /// Bytes a guest may transmit per round, in KiB [default: 1024]
    #[arg(long, value_name = "N")]
    pub tx_quantum_kib: Option<u64>,
    /// Pollers [default: 1 on <= 2 cores, else cores/4 up to 4]; each guest has a home
    /// worker, and with 2..16 workers its connected streams are spread over all of
    /// them by a flow hash (virtual RSS)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub workers: Option<u16>,
    /// Pin worker i to the i-th CPU of the list (cycled)
    #[arg(long, value_name = "CPU,CPU..", value_delimiter = ',')]
    #[serde(default)]
    pub pin: Vec<usize>,
    /// Policy: guests may only bind, connect and send to loopback addresses
    #[arg(long)]
    #[serde(default)]
    pub loopback_only: bool,
    /// Never short-circuit connections between canal guests (also:
    /// CANAL_NO_SHORTCUT=1 in canald's environment)
    #[arg(long)]
    #[serde(default)]
    pub no_shortcut: bool,
    /// Each ring of a short-circuited connection in KiB [default: 1024]
    #[arg(long, value_name = "N")]
    pub shortcut_ring_kib: Option<u64>,
    /// Buffer zones on short-circuited connections: sends larger than the ring's free
    /// space go by (zone, offset) descriptors [default: off; also CANAL_ZONES=on in
    /// canald's environment]
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    #[serde(default, deserialize_with = "de_on_off")]
    pub zones: Option<bool>,
    /// Short-circuited connections between two guests share the guests' pair arenas
    /// (protocol §8.7) instead of a file each [default: on; also CANAL_ARENAS=off in
    /// canald's environment]
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    #[serde(default, deserialize_with = "de_on_off")]
    pub arenas: Option<bool>,
    /// A thread sleeping on short-circuited arena connections is woken by its peer
    /// directly, through a bell eventfd canald hands over (protocol §8.8), instead of
    /// through canald [default: on; also CANAL_BELLS=off in canald's environment]
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    #[serde(default, deserialize_with = "de_on_off")]
    pub bells: Option<bool>,
    /// A process guest in canald's own network, without a destination policy or rate
    /// quota, keeps a socket to a native peer on a kernel socket of its own, so its
    /// data never passes through canald (protocol §2 DIRECTORY); canal ports stay
    /// canal's [default: on; also CANAL_DIRECT=off in canald's environment]
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    #[serde(default, deserialize_with = "de_on_off")]
    pub direct: Option<bool>,
    /// The resolver isolated and VM guests reach as 10.0.2.3:53 (IP or IP:PORT)
    /// [default: the first IPv4 nameserver of /etc/resolv.conf]
    #[arg(long, value_name = "ADDR", value_parser = parse_dns)]
    #[serde(default, deserialize_with = "de_dns")]
    pub dns: Option<std::net::SocketAddrV4>,
    /// Serve Prometheus metrics over HTTP at http://ADDR/metrics (PORT alone: on
    /// 127.0.0.1) [default: off]
    #[arg(long, value_name = "ADDR", value_parser = crate::metrics::http::parse_addr)]
    #[serde(default, deserialize_with = "de_metrics")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Log every guest's attach and departure to stderr
    #[arg(short, long)]
    #[serde(default)]
    pub verbose: bool,
    /// Host-wide service (root only): serve other users' programs, each user's by a
    /// canald of its own started as that user (docs/operations.md)
    #[arg(long)]
    #[serde(default)]
    pub serve_users: bool,
    /// A user's canald started by a host-wide one: connections arrive on descriptor FD
    /// (internal; implies reading only the system configuration file)
    #[arg(long, value_name = "FD", hide = true)]
    #[serde(skip)]
    pub user_channel: Option<i32>,
    /// Quotas and policy per guest: configuration files only (`[quota.default]`,
    /// `[quota.uid.NAME]`, `[quota.cgroup."PATH"]`, `[quota.guest.NAME]`).
    #[arg(skip)]
    #[serde(default)]
    pub quota: crate::quota::QuotaTable,
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

/// A string option of a file, read with the command line's parser.
fn de_parsed<'de, D, T>(d: D, parse: fn(&str) -> Result<T, String>) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let s = String::deserialize(d)?;
    parse(&s).map(Some).map_err(serde::de::Error::custom)
}

fn de_notify<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<NotifyMode>, D::Error> {
    de_parsed(d, parse_notify)
}

fn de_dns<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<std::net::SocketAddrV4>, D::Error> {
    de_parsed(d, parse_dns)
}

fn de_metrics<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<std::net::SocketAddr>, D::Error> {
    de_parsed(d, crate::metrics::http::parse_addr)
}

/// `zones = true`, or the command line's `"on"` / `"off"`.
fn de_on_off<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OnOff {
        Bool(bool),
        Word(String),
    }
    match OnOff::deserialize(d)? {
        OnOff::Bool(b) => Ok(Some(b)),
        OnOff::Word(w) => parse_on_off(&w).map(Some).map_err(serde::de::Error::custom),
    }
}

impl DaemonArgs {
    /// The configuration these options describe (checked: the region must fit).
    pub fn config(&self) -> Result<Config, ConfigError> {
        let mut cfg = Config::new(self.socket.clone().unwrap_or_else(default_socket_path));
        cfg.idle_exit = self.idle_exit.filter(|s| *s > 0).map(Duration::from_secs);
        cfg.slots = self.slots.unwrap_or(DEFAULT_SLOTS);
        cfg.sockets = self.sockets.unwrap_or(DEFAULT_SOCKETS);
        cfg.data_mib = self.data_mib.unwrap_or(DEFAULT_DATA_MIB);
        cfg.ring_kib = self.ring_kib;
        cfg.spin = self.spin;
        cfg.budget = self.budget.unwrap_or(DEFAULT_BUDGET);
        cfg.loopback_only = self.loopback_only;
        cfg.notify = self.notify.unwrap_or_default();
        cfg.coalesce = self.coalescing();
        cfg.no_batch = self.no_batch;
        let kib = |v: Option<u64>, d: u64| v.unwrap_or(d).saturating_mul(1024);
        cfg.rx_quantum = kib(self.rx_quantum_kib, DEFAULT_RX_QUANTUM_KIB);
        cfg.tx_quantum = kib(self.tx_quantum_kib, DEFAULT_TX_QUANTUM_KIB);
        if let Some(w) = self.workers {
            if !(1..=64).contains(&w) {
                return Err(ConfigError::Workers(w));
            }
            cfg.workers = w.into();
        }
        cfg.pin = self.pin.clone();
        if self.dns.is_some() {
            cfg.dns = self.dns;
        }
        cfg.shortcut &= !self.no_shortcut;
        cfg.shortcut_ring_kib = self.shortcut_ring_kib.unwrap_or(DEFAULT_SHORTCUT_RING_KIB);
        if let Some(z) = self.zones {
            cfg.zones = z;
        }
        if let Some(on) = self.arenas {
            cfg.arenas = on;
        }
        if let Some(on) = self.bells {
            cfg.bells = on;
        }
        if let Some(on) = self.direct {
            cfg.direct = on;
        }
        cfg.verbose = self.verbose;
        cfg.metrics = self.metrics;
        cfg.user_channel = self.user_channel;
        if self.serve_users && crate::sys::getuid() != 0 {
            return Err(ConfigError::ServeUsersNeedsRoot);
        }
        cfg.serve_users = self.serve_users;
        let mut quota = self.quota.clone();
        quota.check().map_err(ConfigError::Quota)?;
        cfg.quota = std::sync::Arc::new(quota);
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

/// canald's command line `v` (tests of this module and of `layers`).
#[cfg(test)]
pub(super) fn parse_cli(v: &[&str]) -> Result<DaemonArgs, clap::Error> {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: DaemonArgs,
    }
    Cli::try_parse_from(std::iter::once("canald").chain(v.iter().copied())).map(|c| c.args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_args(v: &[&str]) -> Result<Config, String> {
        let args = parse_cli(v).map_err(|e| e.to_string())?;
        args.config().map_err(|e| e.to_string())
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
        assert!(!parse_args(&["--arenas", "off"]).unwrap().arenas);
        assert!(parse_args(&[]).unwrap().arenas || std::env::var_os("CANAL_ARENAS").is_some());
        assert!(!parse_args(&["--bells", "off"]).unwrap().bells);
        assert!(!parse_args(&["--direct", "off"]).unwrap().direct);
        assert!(parse_args(&["--direct", "on"]).unwrap().direct);
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
