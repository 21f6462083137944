//! The effective configuration: defaults, then the configuration files, then the
//! command line, key by key — and where each value came from (`canald --print-config`,
//! `settings` in `canal stat --json`).
use super::args::DaemonArgs;
use super::file::{self, ConfigFile};
use super::model::{Config, ConfigError, Setting};
use crate::engine::CoalesceCfg;
use std::collections::BTreeMap;

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Origin {
    Default,
    /// A file, and the line that set the key (0: not found by line).
    File(std::path::PathBuf, usize),
    CommandLine,
    /// An environment variable of canald's (CANAL_ZONES, CANAL_NO_SHORTCUT).
    Env(&'static str),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Default => f.write_str("default"),
            Origin::File(p, 0) => write!(f, "{}", p.display()),
            Origin::File(p, l) => write!(f, "{}:{l}", p.display()),
            Origin::CommandLine => f.write_str("command line"),
            Origin::Env(v) => write!(f, "environment {v}"),
        }
    }
}

/// The command line over the files over the defaults; `origins` says, per key set by
/// a file or the command line, which one.
fn merge(cli: &DaemonArgs, files: &[ConfigFile]) -> (DaemonArgs, BTreeMap<&'static str, Origin>) {
    let mut out = DaemonArgs::default();
    let mut origins = BTreeMap::new();
    let layers = files
        .iter()
        .map(|f| (&f.args, Some(f)))
        .chain(std::iter::once((cli, None)));
    for (src, file) in layers {
        let origin = |key: &str| match file {
            Some(f) => Origin::File(f.path.clone(), f.line_of(key)),
            None => Origin::CommandLine,
        };
        macro_rules! take {
            (opt: $($o:ident)*; flag: $($f:ident)*) => {
                $(if src.$o.is_some() {
                    out.$o = src.$o.clone();
                    origins.insert(key_of(stringify!($o)), origin(key_of(stringify!($o))));
                })*
                $(if src.$f {
                    out.$f = true;
                    origins.insert(key_of(stringify!($f)), origin(key_of(stringify!($f))));
                })*
            };
        }
        take!(opt: socket idle_exit slots sockets data_mib ring_kib spin budget notify
                   t_worst_us split_us rx_quantum_kib tx_quantum_kib workers shortcut_ring_kib
                   zones arenas bells direct dns metrics;
              flag: coalesce no_batch loopback_only no_shortcut verbose serve_users);
        if !src.pin.is_empty() {
            out.pin = src.pin.clone();
            origins.insert("pin", origin("pin"));
        }
        if !src.quota.is_empty() {
            out.quota.overlay(&src.quota);
            let o = match (origins.get("quota"), origin("quota")) {
                (Some(Origin::File(a, _)), Origin::File(b, _)) if *a != b => {
                    Origin::File(format!("{} and {}", a.display(), b.display()).into(), 0)
                }
                (_, o) => o,
            };
            origins.insert("quota", o);
        }
    }
    (out, origins)
}

/// A field name as its key (`data_mib` → `data-mib`), from a fixed set so the key
/// can be `'static`.
fn key_of(field: &str) -> &'static str {
    KEYS.iter()
        .copied()
        .find(|k| k.len() == field.len() && k.replace('-', "_") == field)
        .expect("every option has a key")
}

/// Every key, in `--print-config` order.
const KEYS: &[&str] = &[
    "socket",
    "idle-exit",
    "slots",
    "sockets",
    "data-mib",
    "ring-kib",
    "spin",
    "budget",
    "notify",
    "coalesce",
    "t-worst-us",
    "split-us",
    "no-batch",
    "rx-quantum-kib",
    "tx-quantum-kib",
    "workers",
    "pin",
    "loopback-only",
    "no-shortcut",
    "shortcut-ring-kib",
    "zones",
    "arenas",
    "bells",
    "direct",
    "dns",
    "metrics",
    "serve-users",
    "verbose",
    "quota",
];

/// The effective configuration of `cli` with the configuration files it names (or
/// the default ones). A value that cannot serve is reported with where it came from.
pub(crate) fn resolve(cli: &DaemonArgs) -> Result<Config, ConfigError> {
    // A user's canald reads only the host's configuration: a user must not raise the
    // quotas the host set for them by editing their own file.
    let files = match (&cli.config, cli.user_channel) {
        (None, Some(_)) => file::load_system()?,
        (explicit, _) => file::load_all(explicit.as_deref())?,
    };
    let (mut args, origins) = merge(cli, &files);
    args.user_channel = cli.user_channel;
    let mut cfg = args.config().map_err(|e| blame(e, &origins))?;
    cfg.settings = settings(&cfg, &args, &origins);
    cfg.config_file = cli.config.clone();
    cfg.cli_settings = cfg
        .settings
        .iter()
        .filter(|s| origins.get(s.key) == Some(&Origin::CommandLine))
        .cloned()
        .collect();
    Ok(cfg)
}

/// The options a host-wide canald passes to each user's canald: the socket path it
/// reports, the configuration file given to it, and the options its own command line
/// set (as `--key=value`); not `--metrics`, `--serve-users` or `--idle-exit`, which are
/// the host-wide daemon's own.
pub(crate) fn user_daemon_args(cfg: &Config) -> Vec<std::ffi::OsString> {
    let mut out: Vec<std::ffi::OsString> = vec!["--socket".into(), cfg.socket.clone().into()];
    if let Some(f) = &cfg.config_file {
        out.push("--config".into());
        out.push(f.clone().into());
    }
    for s in &cfg.cli_settings {
        if matches!(
            s.key,
            "socket" | "metrics" | "serve-users" | "idle-exit" | "quota"
        ) {
            continue;
        }
        match &s.value {
            toml::Value::Boolean(true) => out.push(format!("--{}", s.key).into()),
            toml::Value::Boolean(false) => {}
            toml::Value::String(v) => out.push(format!("--{}={v}", s.key).into()),
            toml::Value::Array(a) => {
                let list: Vec<String> = a.iter().map(|v| v.to_string()).collect();
                out.push(format!("--{}={}", s.key, list.join(",")).into());
            }
            v => out.push(format!("--{}={v}", s.key).into()),
        }
    }
    out
}

/// Names the origins of the keys an error is about, when a file set any of them.
fn blame(e: ConfigError, origins: &BTreeMap<&'static str, Origin>) -> ConfigError {
    let named: Vec<String> = e
        .keys()
        .iter()
        .filter_map(|k| match origins.get(k) {
            Some(o @ Origin::File(..)) => Some(format!("{k} from {o}")),
            _ => None,
        })
        .collect();
    if named.is_empty() {
        e
    } else {
        ConfigError::Blamed {
            reason: e.to_string(),
            origins: named.join(", "),
        }
    }
}

/// Every key with its effective value and origin.
fn settings(
    cfg: &Config,
    args: &DaemonArgs,
    origins: &BTreeMap<&'static str, Origin>,
) -> Vec<Setting> {
    use toml::Value;
    let int = |v: u64| Value::Integer(i64::try_from(v).unwrap_or(i64::MAX));
    let us = |d: std::time::Duration| int(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let (t_worst, split) = match cfg.coalesce {
        CoalesceCfg::Off => (int(0), None),
        CoalesceCfg::Adaptive { t_worst } => (us(t_worst), None),
        CoalesceCfg::Fixed { t_worst, t_p } => (us(t_worst), Some(us(t_p))),
    };
    let mut out = Vec::new();
    for &key in KEYS {
        let value = match key {
            "socket" => Value::String(cfg.socket.display().to_string()),
            "idle-exit" => int(cfg.idle_exit.map_or(0, |d| d.as_secs())),
            "slots" => int(cfg.slots.into()),
            "sockets" => int(cfg.sockets.into()),
            "data-mib" => int(cfg.data_mib),
            "ring-kib" => match cfg.ring_kib {
                Some(k) => int(k),
                None => continue,
            },
            "spin" => match cfg.spin {
                Some(s) => int(s.into()),
                None => continue,
            },
            "budget" => int(cfg.budget as u64),
            "notify" => Value::String(cfg.notify.name().into()),
            "coalesce" => Value::Boolean(args.coalesce),
            "t-worst-us" => t_worst.clone(),
            "split-us" => match &split {
                Some(v) => v.clone(),
                None => continue,
            },
            "no-batch" => Value::Boolean(cfg.no_batch),
            "rx-quantum-kib" => int(cfg.rx_quantum / 1024),
            "tx-quantum-kib" => int(cfg.tx_quantum / 1024),
            "workers" => int(cfg.workers as u64),
            "pin" => Value::Array(cfg.pin.iter().map(|c| int(*c as u64)).collect()),
            "loopback-only" => Value::Boolean(cfg.loopback_only),
            "no-shortcut" => Value::Boolean(!cfg.shortcut),
            "shortcut-ring-kib" => int(cfg.shortcut_ring_kib),
            "zones" => Value::Boolean(cfg.zones),
            "arenas" => Value::Boolean(cfg.arenas),
            "bells" => Value::Boolean(cfg.bells),
            "direct" => Value::Boolean(cfg.direct),
            "dns" => match cfg.dns {
                Some(d) => Value::String(d.to_string()),
                None => continue,
            },
            "metrics" => match cfg.metrics {
                Some(a) => Value::String(a.to_string()),
                None => continue,
            },
            "serve-users" => Value::Boolean(cfg.serve_users),
            "verbose" => Value::Boolean(cfg.verbose),
            "quota" => match toml::Value::try_from(&*cfg.quota) {
                Ok(v) if !cfg.quota.is_empty() => v,
                _ => continue,
            },
            _ => unreachable!("KEYS and this match list the same keys"),
        };
        let origin = origins.get(key).cloned().unwrap_or_else(|| env_origin(key));
        out.push(Setting {
            key,
            value,
            origin: origin.to_string(),
        });
    }
    out
}

/// The default, or the environment variable that changed it.
fn env_origin(key: &str) -> Origin {
    let set = |v: &str| std::env::var_os(v).is_some_and(|x| !x.is_empty());
    match key {
        "no-shortcut" if set("CANAL_NO_SHORTCUT") => Origin::Env("CANAL_NO_SHORTCUT"),
        "zones" if set("CANAL_ZONES") => Origin::Env("CANAL_ZONES"),
        "arenas" if set("CANAL_ARENAS") => Origin::Env("CANAL_ARENAS"),
        "bells" if set("CANAL_BELLS") => Origin::Env("CANAL_BELLS"),
        "direct" if set("CANAL_DIRECT") => Origin::Env("CANAL_DIRECT"),
        "socket" if set("CANAL_SOCKET") => Origin::Env("CANAL_SOCKET"),
        _ => Origin::Default,
    }
}

/// `--print-config`: a TOML file that would configure this daemon the same way, each
/// line commented with the value's origin; keys left to a computed default (an
/// adaptive spin, the ring size) are listed as comments.
pub(crate) fn render(settings: &[Setting]) -> String {
    let mut out = String::from("# canald: the effective configuration (key = value  # origin)\n");
    let (tables, keys): (Vec<&Setting>, Vec<&Setting>) =
        settings.iter().partition(|s| s.value.is_table());
    let width = keys
        .iter()
        .map(|s| s.key.len() + 3 + s.value.to_string().len())
        .max()
        .unwrap_or(0);
    for s in keys {
        let line = format!("{} = {}", s.key, s.value);
        out.push_str(&format!("{line:<width$}  # {}\n", s.origin));
    }
    for key in KEYS {
        if !settings.iter().any(|s| s.key == *key) {
            let what = match *key {
                "ring-kib" => "2048, shrunk to fit a small data-mib",
                "spin" => "an adaptive budget",
                "split-us" => "an adaptive split",
                "dns" => "none: /etc/resolv.conf names no IPv4 nameserver",
                "metrics" => "off",
                "quota" => "none: every guest gets the sizes above, no rate limit, any destination",
                _ => "unset",
            };
            out.push_str(&format!("# {key}: {what}  (default)\n"));
        }
    }
    for s in tables {
        let mut t = toml::Table::new();
        t.insert(s.key.to_string(), s.value.clone());
        out.push_str(&format!("\n# {}: from {}\n", s.key, s.origin));
        out.push_str(&toml::to_string(&t).unwrap_or_default());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(v: &[&str]) -> DaemonArgs {
        super::super::args::parse_cli(v).unwrap()
    }

    fn file(path: &str, text: &str) -> ConfigFile {
        file::parse(std::path::Path::new(path), text.into()).unwrap()
    }

    #[test]
    fn command_line_over_user_over_system_over_default() {
        let sys = file(
            "/etc/c.toml",
            "slots = 64\nbudget = 4\nloopback-only = true\n",
        );
        let user = file("/home/u/c.toml", "# x\nbudget = 8\nspin = 3\n");
        let (args, origins) = merge(&cli(&["--spin=5"]), &[sys, user]);
        assert_eq!(args.slots, Some(64));
        assert_eq!(args.budget, Some(8));
        assert_eq!(args.spin, Some(5));
        assert!(args.loopback_only);
        let o = |k| origins.get(k).map(|o: &Origin| o.to_string());
        assert_eq!(o("slots").as_deref(), Some("/etc/c.toml:1"));
        assert_eq!(o("budget").as_deref(), Some("/home/u/c.toml:2"));
        assert_eq!(o("spin").as_deref(), Some("command line"));
        assert_eq!(o("loopback-only").as_deref(), Some("/etc/c.toml:3"));
        assert_eq!(o("sockets"), None);
    }

    #[test]
    fn printed_configuration_reads_back_the_same() {
        let f = file(
            "/c.toml",
            "slots = 64\nnotify = \"sleep\"\npin = [1]\nspin = 9\n",
        );
        let (args, origins) = merge(&cli(&["--socket", "/s/c.sock"]), &[f]);
        let mut cfg = args.config().unwrap();
        cfg.settings = settings(&cfg, &args, &origins);
        let text = render(&cfg.settings);
        assert!(text.contains("slots = 64"), "{text}");
        assert!(text.contains("# /c.toml:1"), "{text}");
        assert!(text.contains("# command line"), "{text}");
        let again = file("/p.toml", &text);
        let (args2, _) = merge(&DaemonArgs::default(), &[again]);
        let cfg2 = args2.config().unwrap();
        let values = |s: &[Setting]| {
            s.iter()
                .map(|s| (s.key, s.value.clone()))
                .collect::<Vec<_>>()
        };
        let s2 = settings(&cfg2, &args2, &BTreeMap::new());
        assert_eq!(values(&cfg.settings), values(&s2));
    }

    #[test]
    fn errors_after_parsing_name_the_file() {
        let f = file("/c.toml", "\nslots = 3\n");
        let (args, origins) = merge(&DaemonArgs::default(), &[f]);
        let e = blame(args.config().unwrap_err(), &origins).to_string();
        assert!(e.contains("slots from /c.toml:2"), "{e}");
        let f = file("/c.toml", "workers = 0\n");
        let (args, origins) = merge(&DaemonArgs::default(), &[f]);
        let e = blame(args.config().unwrap_err(), &origins).to_string();
        assert!(e.contains("workers from /c.toml:1"), "{e}");
    }
}
