//! The listing in the Prometheus text exposition format (version 0.0.4): what
//! `canal stat --prometheus` prints and `canald --metrics ADDR` serves at /metrics.
//! Counters end in `_total`; guests are labelled by id, pid, program and network.
#![forbid(unsafe_code)]

use crate::stat::{GuestStat, Snapshot};
use std::fmt::Write;

/// One metric family being written.
struct Family<'a> {
    out: &'a mut String,
    name: &'static str,
}

impl Family<'_> {
    fn sample(&mut self, labels: &str, value: impl std::fmt::Display) {
        let _ = if labels.is_empty() {
            writeln!(self.out, "{} {value}", self.name)
        } else {
            writeln!(self.out, "{}{{{labels}}} {value}", self.name)
        };
    }
}

fn family<'a>(out: &'a mut String, name: &'static str, kind: &str, help: &str) -> Family<'a> {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    Family { out, name }
}

/// A label value with `\`, `"` and newlines escaped.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn guest_labels(g: &GuestStat) -> String {
    let net = g.network.as_ref().map_or("host", |n| n.name.as_str());
    format!(
        "guest=\"{}\",pid=\"{}\",comm=\"{}\",network=\"{}\"",
        g.id,
        g.pid,
        esc(&g.comm),
        esc(net)
    )
}

/// Per-worker families: name, type, help, value.
#[allow(clippy::type_complexity)]
const WORKER_METRICS: [(&str, &str, &str, fn(&crate::stat::WorkerStat) -> String); 11] = [
    (
        "canal_worker_guests",
        "gauge",
        "Guests a worker serves.",
        |w| w.guests.to_string(),
    ),
    (
        "canal_worker_sockets",
        "gauge",
        "Sockets a worker owns.",
        |w| w.sockets.to_string(),
    ),
    (
        "canal_worker_rounds_total",
        "counter",
        "Poller rounds.",
        |w| w.rounds.to_string(),
    ),
    (
        "canal_worker_requests_total",
        "counter",
        "Requests taken from guests' queues.",
        |w| w.requests.to_string(),
    ),
    (
        "canal_worker_bytes_total",
        "counter",
        "Bytes moved for guests (both directions).",
        |w| w.bytes.to_string(),
    ),
    (
        "canal_worker_sleeps_total",
        "counter",
        "Times the poller slept.",
        |w| w.sleeps.to_string(),
    ),
    (
        "canal_worker_wakeups_total",
        "counter",
        "Wake-ups sent to sleeping guest threads.",
        |w| w.wakes.to_string(),
    ),
    (
        "canal_worker_kicks_total",
        "counter",
        "Kicks received from guests (doorbells).",
        |w| w.kicks.to_string(),
    ),
    (
        "canal_worker_holds_total",
        "counter",
        "Host-side coalescing holds.",
        |w| w.holds.to_string(),
    ),
    (
        "canal_worker_spin_seconds_total",
        "counter",
        "Time spent spinning without work.",
        |w| secs(w.spun_ns),
    ),
    (
        "canal_worker_spin_budget_seconds",
        "gauge",
        "The adaptive spin budget now.",
        |w| secs(w.spin_ns),
    ),
];

/// Per-guest families: name, type, help, value.
#[allow(clippy::type_complexity)]
const GUEST_METRICS: [(&str, &str, &str, fn(&GuestStat) -> u64); 11] = [
    (
        "canal_guest_sockets",
        "gauge",
        "Sockets a guest holds.",
        |g| g.sockets.len() as u64,
    ),
    (
        "canal_guest_sent_bytes_total",
        "counter",
        "Bytes the guest sent.",
        |g| g.bytes_total().0,
    ),
    (
        "canal_guest_received_bytes_total",
        "counter",
        "Bytes the guest received.",
        |g| g.bytes_total().1,
    ),
    (
        "canal_guest_requests_total",
        "counter",
        "Requests canald completed for the guest.",
        |g| g.requests,
    ),
    (
        "canal_guest_errors_total",
        "counter",
        "Requests that failed (not EAGAIN/EINPROGRESS).",
        |g| g.errors,
    ),
    (
        "canal_guest_wakeups_total",
        "counter",
        "Wake-ups sent to the guest's threads.",
        |g| g.wakes,
    ),
    (
        "canal_guest_deferred_wakeups_total",
        "counter",
        "Wake-ups deferred by coalescing.",
        |g| g.deferred_wakes,
    ),
    (
        "canal_guest_quota_denied_total",
        "counter",
        "Destinations refused by the guest's policy (EPERM).",
        |g| g.quota.denied,
    ),
    (
        "canal_guest_quota_connect_waits_total",
        "counter",
        "Connects that waited for the connection rate.",
        |g| g.quota.connect_waits,
    ),
    (
        "canal_guest_quota_request_waits_total",
        "counter",
        "Rounds the guest's requests waited for the request rate.",
        |g| g.quota.request_waits,
    ),
    (
        "canal_guest_quota_watches_refused_total",
        "counter",
        "WATCHes refused at the guest's descriptor quota (those sockets close by request).",
        |g| g.quota.watches_refused,
    ),
];

pub(crate) fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    let o = &mut out;
    family(
        o,
        "canal_info",
        "gauge",
        "canald's version and control socket.",
    )
    .sample(
        &format!(
            "version=\"{}\",pid=\"{}\",socket=\"{}\"",
            env!("CARGO_PKG_VERSION"),
            s.pid,
            esc(&s.socket)
        ),
        1,
    );
    family(o, "canal_guests", "gauge", "Guests attached.").sample("", s.guests.len());
    family(
        o,
        "canal_networks",
        "gauge",
        "Guest networks (VMs, isolated namespaces).",
    )
    .sample("", s.networks.len());

    for (name, kind, help, f) in WORKER_METRICS {
        let mut fam = family(o, name, kind, help);
        for w in &s.workers {
            fam.sample(
                &format!("worker=\"{}\",notify=\"{}\"", w.id, w.notify),
                f(w),
            );
        }
    }

    for (name, kind, help, f) in GUEST_METRICS {
        let mut fam = family(o, name, kind, help);
        for g in &s.guests {
            fam.sample(&guest_labels(g), f(g));
        }
    }
    let mut fam = family(
        o,
        "canal_network_seccomp_calls_total",
        "counter",
        "Calls answered by a network's seccomp service (static and Go programs).",
    );
    for n in &s.networks {
        if let Some(sc) = &n.seccomp {
            fam.sample(&format!("network=\"{}\"", esc(&n.name)), sc.calls);
        }
    }
    out
}

fn secs(ns: u64) -> String {
    format!("{:.9}", ns as f64 / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_label_values() {
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn every_family_has_help_and_type_once() {
        let text = render(&crate::stat::tests_snapshot());
        let mut seen = std::collections::HashSet::new();
        for l in text.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap();
                assert!(seen.insert(name.to_string()), "{name} twice");
            }
        }
        assert!(text.contains("canal_guest_requests_total{guest=\"1\",pid=\"1234\",comm=\"cu\\\"rl\\n\",network=\"host\"} 9"), "{text}");
        assert!(text.contains("canal_guest_sent_bytes_total{"), "{text}");
        assert!(seen.len() >= 20, "{seen:?}");
    }
}
