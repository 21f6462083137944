//! The quota table of the configuration (`[quota.default]`, `[quota.uid.NAME]`,
//! `[quota.cgroup."PATH"]`, `[quota.guest.NAME]`) and the limits it gives one guest:
//! the default, then its uid's, then its cgroups' (outermost first), then its name's,
//! key by key — the most specific wins.
#![forbid(unsafe_code)]

use super::rules::{DestPolicy, DestRule};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Limits for a set of guests; unset keys leave the less specific value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Limits {
    /// Socket table entries (at attach; at most canald's `sockets`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sockets: Option<u32>,
    /// Ring memory beyond the smallest rings, MiB (at attach).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_mib: Option<u64>,
    /// Outgoing stream connections per second (0: unlimited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_rate: Option<u32>,
    /// Requests per second (0: unlimited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_rate: Option<u32>,
    /// Destinations connect and sendto may reach (empty or unset: any).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "rule_list")]
    pub allow: Option<Vec<DestRule>>,
    /// Destinations they may not reach (wins over allow).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "rule_list")]
    pub deny: Option<Vec<DestRule>>,
}

mod rule_list {
    use super::DestRule;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<DestRule>>, D::Error> {
        let v = Vec::<String>::deserialize(d)?;
        v.iter()
            .map(|s| DestRule::parse(s))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
            .map_err(serde::de::Error::custom)
    }

    pub fn serialize<S: Serializer>(v: &Option<Vec<DestRule>>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().flatten().map(|r| r.text()))
    }
}

impl Limits {
    /// `other`'s keys over ours.
    fn overlay(&mut self, other: &Limits) {
        macro_rules! take {
            ($($k:ident)*) => {$(if other.$k.is_some() { self.$k = other.$k.clone(); })*};
        }
        take!(sockets data_mib connect_rate request_rate allow deny);
    }

    /// The destination policy, if it restricts anything.
    pub fn policy(&self) -> Option<DestPolicy> {
        let p = DestPolicy {
            allow: self.allow.clone().unwrap_or_default(),
            deny: self.deny.clone().unwrap_or_default(),
        };
        (!p.is_open()).then_some(p)
    }
}

/// `[quota]` of a configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaTable {
    #[serde(default, skip_serializing_if = "is_default")]
    pub default: Limits,
    /// By user: a uid or a user name of /etc/passwd.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub uid: BTreeMap<String, Limits>,
    /// By cgroup (v2 path, as in /proc/PID/cgroup): the guest's cgroup or any above it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cgroup: BTreeMap<String, Limits>,
    /// By guest name: its network's (`canal run --isolate --name`, a container, a VM
    /// region), else its program's (`comm`, e.g. "nginx").
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub guest: BTreeMap<String, Limits>,
    /// The uid each `uid` key names, looked up once by `check` (a guest's attach reads
    /// no /etc/passwd).
    #[serde(skip)]
    uid_numbers: BTreeMap<String, u32>,
}

fn is_default(l: &Limits) -> bool {
    *l == Limits::default()
}

/// Who a guest is, for the table.
#[derive(Debug, Clone, Default)]
pub struct Who {
    pub uid: u32,
    /// The cgroup v2 path (None: unknown).
    pub cgroup: Option<String>,
    pub name: String,
}

impl QuotaTable {
    pub fn is_empty(&self) -> bool {
        *self == QuotaTable::default()
    }

    /// `other` (a later file) over this one, key by key.
    pub fn overlay(&mut self, other: &QuotaTable) {
        self.default.overlay(&other.default);
        for (dst, src) in [
            (&mut self.uid, &other.uid),
            (&mut self.cgroup, &other.cgroup),
            (&mut self.guest, &other.guest),
        ] {
            for (k, v) in src {
                dst.entry(k.clone()).or_default().overlay(v);
            }
        }
    }

    /// Checks what parsing cannot, and resolves the uid keys: every one names a user.
    /// Err(reason).
    pub fn check(&mut self) -> Result<(), String> {
        self.uid_numbers.clear();
        for k in self.uid.keys() {
            let n = uid_of(k).ok_or_else(|| format!("[quota.uid.{k}]: no such user or uid"))?;
            self.uid_numbers.insert(k.clone(), n);
        }
        for k in self.cgroup.keys() {
            if !k.starts_with('/') {
                return Err(format!(
                    "[quota.cgroup.\"{k}\"]: a cgroup path starts with '/'"
                ));
            }
        }
        Ok(())
    }

    /// The limits for `who` (uid keys as `check` resolved them).
    pub fn for_guest(&self, who: &Who) -> Limits {
        let mut l = self.default.clone();
        for (k, v) in &self.uid {
            if self.uid_numbers.get(k) == Some(&who.uid) {
                l.overlay(v);
            }
        }
        if let Some(cg) = &who.cgroup {
            let mut hits: Vec<(&String, &Limits)> =
                self.cgroup.iter().filter(|(k, _)| under(cg, k)).collect();
            hits.sort_by_key(|(k, _)| k.len());
            for (_, v) in hits {
                l.overlay(v);
            }
        }
        if let Some(v) = self.guest.get(&who.name) {
            l.overlay(v);
        }
        l
    }
}

/// Whether cgroup `cg` is `top` or below it.
fn under(cg: &str, top: &str) -> bool {
    let top = top.trim_end_matches('/');
    top.is_empty() || cg == top || cg.strip_prefix(top).is_some_and(|r| r.starts_with('/'))
}

/// A uid given as a number or a user name (/etc/passwd).
fn uid_of(k: &str) -> Option<u32> {
    if let Ok(n) = k.parse() {
        return Some(n);
    }
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == k).then_some(())?;
        f.nth(1)?.parse().ok()
    })
}

/// A process's cgroup path: the unified (v2) hierarchy's (`0::/PATH` of
/// /proc/PID/cgroup); on a hybrid host where that is only `/`, systemd's v1 hierarchy's
/// (`N:name=systemd:/PATH`), which names the same units and slices.
pub fn cgroup_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    cgroup_in(&text)
}

fn cgroup_in(text: &str) -> Option<String> {
    let v2 = text.lines().find_map(|l| l.strip_prefix("0::"));
    let systemd = text
        .lines()
        .find_map(|l| l.split_once(":name=systemd:").map(|(_, p)| p));
    match (v2, systemd) {
        (Some("/") | None, Some(p)) => Some(p.to_string()),
        (v2, _) => v2.map(str::to_string),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> QuotaTable {
        #[derive(Deserialize)]
        struct F {
            quota: QuotaTable,
        }
        toml::from_str::<F>(text).unwrap().quota
    }

    #[test]
    fn most_specific_wins_key_by_key() {
        let mut t = table(
            "[quota.default]\nconnect-rate = 100\nsockets = 500\n\
             [quota.uid.0]\nconnect-rate = 50\n\
             [quota.uid.root]\nrequest-rate = 9000\n\
             [quota.cgroup.\"/a\"]\nsockets = 40\n\
             [quota.cgroup.\"/a/b\"]\nsockets = 30\n\
             [quota.guest.web]\nconnect-rate = 7\nallow = [\"127.0.0.0/8\"]\n",
        );
        t.check().unwrap();
        let who = |uid, cg: Option<&str>, name: &str| Who {
            uid,
            cgroup: cg.map(str::to_string),
            name: name.into(),
        };
        let l = t.for_guest(&who(1000, None, "x"));
        assert_eq!(
            (l.connect_rate, l.sockets, l.request_rate),
            (Some(100), Some(500), None)
        );
        let l = t.for_guest(&who(0, Some("/a/b/c"), "x"));
        assert_eq!(
            (l.connect_rate, l.sockets, l.request_rate),
            (Some(50), Some(30), Some(9000))
        );
        let l = t.for_guest(&who(0, Some("/ab"), "web"));
        assert_eq!((l.connect_rate, l.sockets), (Some(7), Some(500)));
        assert!(l.policy().is_some());
        assert!(t.for_guest(&who(1, None, "x")).policy().is_none());
    }

    #[test]
    fn cgroup_paths() {
        assert_eq!(
            cgroup_in("0::/system.slice/a.service\n").as_deref(),
            Some("/system.slice/a.service")
        );
        let hybrid = "9:name=systemd:/user.slice/x.scope\n4:memory:/m\n0::/\n";
        assert_eq!(cgroup_in(hybrid).as_deref(), Some("/user.slice/x.scope"));
        assert_eq!(cgroup_in("0::/\n").as_deref(), Some("/"));
        assert_eq!(cgroup_in("4:memory:/m\n"), None);
    }

    #[test]
    fn bad_tables() {
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct F {
            quota: QuotaTable,
        }
        for bad in [
            "[quota.default]\nconect-rate = 1\n",
            "[quota.default]\nallow = [\"10.0.0.0/40\"]\n",
            "[quota.other]\n",
        ] {
            assert!(toml::from_str::<F>(bad).is_err(), "{bad}");
        }
        assert!(table("[quota.uid.no-such-user-here]\nsockets = 1\n")
            .check()
            .is_err());
        assert!(table("[quota.cgroup.x]\nsockets = 1\n").check().is_err());
    }

    #[test]
    fn prints_back() {
        let t =
            table("[quota.default]\ndeny = [\"10.0.0.0/8:22\"]\n[quota.guest.a]\nsockets = 3\n");
        #[derive(Serialize)]
        struct F<'a> {
            quota: &'a QuotaTable,
        }
        let text = toml::to_string(&F { quota: &t }).unwrap();
        assert_eq!(table(&text), t, "{text}");
    }
}
