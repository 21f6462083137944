//! The STAT listing: a snapshot of guests and sockets, rendered as JSON (the shape in
//! the contract) or as a human-readable table.
#![forbid(unsafe_code)]

use crate::guest::socket::Kind;
use crate::guest::socket::Phase;
use crate::guest::state::Guest;
use canal_abi::CanalAddr;
use serde::Serialize;
use std::fmt::Write;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct SockStat {
    pub(crate) handle: u32,
    pub(crate) kind: &'static str,
    pub(crate) state: &'static str,
    pub(crate) local: String,
    pub(crate) peer: String,
    pub(crate) tx_bytes: u64,
    pub(crate) rx_bytes: u64,
    /// The worker that owns this socket (virtual RSS; else the guest's worker).
    pub(crate) worker: u32,
    /// A short-circuited socket with zones: the zone buffers it has posted
    /// (guest-written index, a statistic only; JSON `zone_sends`, absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) zone_sends: Option<u64>,
    /// A datagram socket on the path between canal guests (`dgram_local`): datagrams
    /// it received ring to ring, and those dropped for a full receive buffer (JSON
    /// `local_in`, `local_drops`; absent for a socket never registered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) local_in: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) local_drops: Option<u64>,
    /// A listener whose program accepts its native clients itself (feature
    /// NATIVE_ACCEPT: they are its own kernel sockets, not listed here); JSON
    /// `native_accept`, absent otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) native_accept: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GuestStat {
    pub(crate) id: u32,
    pub(crate) pid: u32,
    pub(crate) comm: String,
    pub(crate) sockets: Vec<SockStat>,
    /// Eventfd wake-ups sent to this guest, and those deferred by coalescing.
    pub(crate) wakes: u64,
    pub(crate) deferred_wakes: u64,
    /// The worker (poller) serving this guest.
    pub(crate) worker: u32,
    /// A VM served with ivshmem doorbells: kicks received (interrupts sent = wakes).
    pub(crate) doorbell_kicks: Option<u64>,
    /// The guest network whose address view it has (VM, isolated namespace).
    pub(crate) network: Option<NetStat>,
    /// Requests completed, and those that failed (not counting EAGAIN/EINPROGRESS).
    pub(crate) requests: u64,
    pub(crate) errors: u64,
    pub(crate) quota: QuotaStat,
    /// Bytes sent and received by its sockets already closed (totals are these plus
    /// the listed sockets').
    pub(crate) closed_tx_bytes: u64,
    pub(crate) closed_rx_bytes: u64,
    /// Bells (protocol §8.8): its threads' bells canald holds, and the peers' bells
    /// canald handed to it (None: neither).
    pub(crate) bells: Option<BellStat>,
    /// Connects completed with a ticket, without a CONNECT (protocol §8.10).
    pub(crate) fast_connects: u64,
}

/// A guest's bells (protocol §8.8), as `canal stat` shows them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct BellStat {
    /// Bells of its threads canald holds (one per thread and live peer guest).
    pub(crate) registered: u64,
    /// Peers' bells canald handed to it over its life (BELL_GET answered): the
    /// threads it wakes itself.
    pub(crate) given: u64,
}

impl GuestStat {
    /// Bytes sent and received over the guest's life.
    pub(crate) fn bytes_total(&self) -> (u64, u64) {
        self.sockets
            .iter()
            .fold((self.closed_tx_bytes, self.closed_rx_bytes), |(t, r), s| {
                (t.wrapping_add(s.tx_bytes), r.wrapping_add(s.rx_bytes))
            })
    }
}

/// A guest's quota hits (docs/operations.md, "Limit").
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub(crate) struct QuotaStat {
    /// Destinations refused (EPERM).
    pub(crate) denied: u64,
    /// Times a connect waited for the connection rate, and a round stopped for the
    /// request rate.
    pub(crate) connect_waits: u64,
    pub(crate) request_waits: u64,
    /// WATCHes refused at the descriptor quota (`crate::watch`).
    pub(crate) watches_refused: u64,
    /// Connects waiting for the connection rate now.
    pub(crate) held_connects: u64,
}

/// A guest network as `canal stat` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct NetStat {
    pub(crate) name: String,
    /// The host address standing for the guest's own addresses.
    pub(crate) loopback: String,
    /// Guest ports bound (translation-table entries), own connections made through
    /// the kernel.
    pub(crate) bound: u64,
    pub(crate) own_conns: u64,
    pub(crate) published: Vec<String>,
    /// Programs served through seccomp user notification (static, Go): host sockets
    /// installed, calls answered, let through, sockets replaced, errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) seccomp: Option<SeccompStat>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct SeccompStat {
    pub(crate) sockets: u64,
    pub(crate) calls: u64,
    pub(crate) passed: u64,
    pub(crate) replaced: u64,
    pub(crate) errors: u64,
    /// The installed sockets still open (the daemon's list of networks only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) open: Option<Vec<SeccompSockStat>>,
}

/// A socket served through seccomp that is still open.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct SeccompSockStat {
    pub(crate) pid: u32,
    pub(crate) fd: i32,
    /// "tcp", "tcp-listener" or "udp".
    pub(crate) kind: &'static str,
    /// As `ss` names it ("established", "listen", "syn-sent", …; "bound" for a socket
    /// neither listening nor connected, "connected" for a connected datagram socket).
    pub(crate) state: &'static str,
    /// Both ends in the guest's view (the name it bound, while unconnected), and the
    /// host's local address (what the outside sees).
    pub(crate) local: String,
    pub(crate) peer: String,
    pub(crate) host_local: String,
}

impl SeccompSockStat {
    fn of(n: &crate::guest::netview::NetView, s: crate::seccomp::installed::OpenSocket) -> Self {
        SeccompSockStat {
            pid: s.pid,
            fd: s.fd,
            kind: s.kind,
            state: s.state,
            local: fmt_addr(s.bound.or(s.host_local.map(|h| n.local(&h)))),
            peer: fmt_addr(s.host_peer.map(|p| n.peer(&p, s.via_resolver))),
            host_local: fmt_addr(s.host_local),
        }
    }
}

/// A network's line in the listing; `with_open`: with its seccomp-served sockets still
/// open (found under /proc: the daemon's list of networks, not each guest's line).
pub(crate) fn net_stat(n: &crate::guest::netview::NetView, with_open: bool) -> NetStat {
    let (bound, own_conns) = n.counts();
    let [sockets, calls, passed, replaced, errors] = n.served.snapshot();
    NetStat {
        name: n.name.clone(),
        loopback: std::net::Ipv4Addr::from(n.lo).to_string(),
        bound: bound as u64,
        own_conns: own_conns as u64,
        published: n.publish.iter().map(crate::network::show).collect(),
        seccomp: (calls > 0).then_some(SeccompStat {
            sockets,
            calls,
            passed,
            replaced,
            errors,
            open: with_open.then(|| {
                let open = n.served.installed.open();
                open.into_iter()
                    .map(|s| SeccompSockStat::of(n, s))
                    .collect()
            }),
        }),
    }
}

/// One poller's engine state and counters.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub(crate) struct WorkerStat {
    pub(crate) id: u32,
    pub(crate) notify: &'static str,
    pub(crate) guests: u64,
    pub(crate) rounds: u64,
    pub(crate) sleeps: u64,
    pub(crate) wakes: u64,
    pub(crate) kicks: u64,
    pub(crate) holds: u64,
    pub(crate) spin_ns: u64,
    /// Time spun without work, in total (ns).
    pub(crate) spun_ns: u64,
    /// Requests taken and bytes moved by this worker.
    pub(crate) requests: u64,
    pub(crate) bytes: u64,
    /// Coalescing split now in force (ns; all 0 when off) and its inputs.
    pub(crate) t_worst_ns: u64,
    pub(crate) t_p_ns: u64,
    pub(crate) t_v_ns: u64,
    pub(crate) c_p_ns: u64,
    pub(crate) c_v_ns: u64,
    pub(crate) active: u64,
    /// Sockets this worker owns.
    pub(crate) sockets: u64,
}

impl WorkerStat {
    /// `sockets`: the worker's count, taken by the caller under the shard's lock.
    pub(crate) fn from_stats(
        id: u32,
        notify: &'static str,
        st: &crate::engine::WorkerStats,
        sockets: u64,
    ) -> Self {
        use crate::engine::WorkerStats as W;
        let (t_p, t_v) = (W::get(&st.t_p_ns), W::get(&st.t_v_ns));
        WorkerStat {
            id,
            notify,
            guests: W::get(&st.guests),
            rounds: W::get(&st.rounds),
            sleeps: W::get(&st.sleeps),
            wakes: W::get(&st.wakes),
            kicks: W::get(&st.kicks),
            holds: W::get(&st.holds),
            spin_ns: W::get(&st.spin_ns),
            spun_ns: W::get(&st.spun_ns),
            requests: W::get(&st.requests),
            bytes: W::get(&st.bytes),
            t_worst_ns: t_p + t_v,
            t_p_ns: t_p,
            t_v_ns: t_v,
            c_p_ns: W::get(&st.c_p_ns),
            c_v_ns: W::get(&st.c_v_ns),
            active: W::get(&st.active),
            sockets,
        }
    }
}

/// The engine switches in force (`daemon.config` in the JSON), so a benchmark can
/// confirm that the variant it asked for is the one it measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct ConfigStat {
    /// "poll", "sleep" or "hybrid" (`--notify`).
    pub(crate) notify: &'static str,
    /// false with `--no-batch`.
    pub(crate) batch: bool,
    /// "adaptive", "fixed" (`--split-us`) or "off" (the default, or `--t-worst-us 0`).
    pub(crate) coalesce: &'static str,
    /// T_worst in µs (0 when coalescing is off).
    pub(crate) t_worst_us: u64,
    /// The fixed host share T_p in µs; None unless `coalesce` is "fixed".
    pub(crate) split_us: Option<u64>,
    pub(crate) workers: u64,
    /// Whether the co-resident short-circuit is in force: false with `--no-shortcut` /
    /// CANAL_NO_SHORTCUT.
    pub(crate) shortcut: bool,
    /// Buffer zones on short-circuited connections (`--zones on`, and the shortcut in
    /// force).
    pub(crate) zones: bool,
    /// Pair arenas for short-circuited connections (`--arenas`, and the shortcut in
    /// force).
    pub(crate) arenas: bool,
    /// Direct peer wake-ups (`--bells`, with arenas in force).
    pub(crate) bells: bool,
    /// Native peers on guests' own kernel sockets (`--direct`).
    pub(crate) direct: bool,
    /// Every option's effective value and where it came from (as `--print-config`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) settings: Vec<crate::config::Setting>,
}

impl ConfigStat {
    pub(crate) fn from_config(c: &crate::config::Config) -> Self {
        use crate::engine::CoalesceCfg;
        let us = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let (coalesce, t_worst_us, split_us) = match c.coalesce {
            CoalesceCfg::Off => ("off", 0, None),
            CoalesceCfg::Adaptive { t_worst } => ("adaptive", us(t_worst), None),
            CoalesceCfg::Fixed { t_worst, t_p } => ("fixed", us(t_worst), Some(us(t_p))),
        };
        ConfigStat {
            notify: c.notify.name(),
            batch: !c.no_batch,
            coalesce,
            t_worst_us,
            split_us,
            workers: c.workers as u64,
            shortcut: c.shortcut,
            zones: c.zones && c.shortcut,
            arenas: c.arenas && c.shortcut,
            bells: c.bells && c.arenas && c.shortcut,
            direct: c.direct,
            settings: c.settings.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Snapshot {
    pub(crate) pid: u32,
    pub(crate) socket: String,
    /// None only in tests that predate it; the daemon always reports it.
    pub(crate) config: Option<ConfigStat>,
    pub(crate) guests: Vec<GuestStat>,
    pub(crate) workers: Vec<WorkerStat>,
    /// Guest networks (VMs, isolated namespaces), with what seccomp service did.
    pub(crate) networks: Vec<NetStat>,
}

/// "1.2.3.4:80", "[::1]:80", or "" when unknown.
pub(crate) fn fmt_addr(a: Option<CanalAddr>) -> String {
    let Some(a) = a else {
        return String::new();
    };
    match a.family {
        canal_abi::addr::FAMILY_INET => {
            let ip = std::net::Ipv4Addr::from(a.ip4());
            format!("{ip}:{}", a.port)
        }
        _ => format!("[{}]:{}", std::net::Ipv6Addr::from(a.addr), a.port),
    }
}

pub(crate) fn guest_stat(g: &Guest) -> GuestStat {
    let mut sockets: Vec<SockStat> = g
        .sockets()
        // Spares no process has taken are canald's, not the program's.
        .filter(|s| !g.is_untaken_spare(s.handle))
        .map(|s| {
            let local = s.dgram_local().and_then(|l| l.counts());
            SockStat {
                handle: s.handle,
                kind: match s.kind() {
                    // Short-circuited to another canal socket (protocol §8): no kernel TCP.
                    Kind::Stream if s.is_shortcut() => "tcp-shortcut",
                    Kind::Stream => "tcp",
                    Kind::Dgram => "udp",
                    Kind::Listener => "tcp-listener",
                },
                state: if s.is_closing() || g.gone.is_some() {
                    "closing"
                } else if s.flags & canal_abi::sock_flag::HANDED_OVER != 0 {
                    // The program passed it on: a kernel socket of its own now.
                    "handed-over"
                } else {
                    match s.phase {
                        Phase::Open => "open",
                        Phase::Connecting => "connecting",
                        Phase::Connected => "connected",
                        Phase::Listening => "listening",
                        // Dead until the guest closes it.
                        Phase::Failed | Phase::Broken => "closing",
                    }
                },
                local: fmt_addr(s.local()),
                peer: fmt_addr(s.peer()),
                tx_bytes: g.sc_bytes(s).map_or(s.tx_bytes, |b| b.0),
                rx_bytes: g.sc_bytes(s).map_or(s.rx_bytes, |b| b.1),
                zone_sends: g.sc_zone_sends(s),
                native_accept: s.kind() == Kind::Listener
                    && s.flags & canal_abi::sock_flag::NATIVE_ACCEPT != 0,
                local_in: local.map(|c| c.0),
                local_drops: local.map(|c| c.1),
                worker: 0,
            }
        })
        .collect();
    sockets.sort_by_key(|s| s.handle & 0xffff);
    GuestStat {
        id: g.id,
        pid: g.pid,
        comm: g.comm.clone(),
        sockets,
        wakes: g.wakes,
        deferred_wakes: g.deferred_wakes,
        worker: 0,
        doorbell_kicks: g.doorbell.map(|d| d.kicks),
        network: g.cfg.net.as_deref().map(|n| net_stat(n, false)),
        requests: g.served,
        errors: g.failed,
        closed_tx_bytes: g.freed_bytes.0,
        closed_rx_bytes: g.freed_bytes.1,
        bells: None,
        fast_connects: g.fast_connects,
        quota: {
            let [denied, connect_waits, request_waits, watches_refused] = g.cfg.policy.hits();
            QuotaStat {
                denied,
                connect_waits,
                request_waits,
                watches_refused,
                held_connects: g.rates.held.len() as u64,
            }
        },
    }
}

/// The JSON shape of `canal stat --json` (docs/operations.md).
#[derive(Serialize)]
struct StatJson<'a> {
    daemon: DaemonJson<'a>,
    guests: Vec<GuestJson<'a>>,
    networks: &'a [NetStat],
}

#[derive(Serialize)]
struct DaemonJson<'a> {
    pid: u32,
    socket: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    config: Option<&'a ConfigStat>,
    workers: &'a [WorkerStat],
}

#[derive(Serialize)]
struct GuestJson<'a> {
    id: u32,
    pid: u32,
    comm: &'a str,
    worker: u32,
    wakes: u64,
    deferred_wakes: u64,
    requests: u64,
    errors: u64,
    /// Bytes over the guest's life (closed sockets included).
    tx_bytes: u64,
    rx_bytes: u64,
    quota: &'a QuotaStat,
    #[serde(skip_serializing_if = "Option::is_none")]
    doorbell: Option<DoorbellJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    network: Option<&'a NetStat>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bells: Option<BellStat>,
    /// Connects made with a ticket (protocol §8.10); absent while none.
    #[serde(skip_serializing_if = "is_zero")]
    fast_connects: u64,
    sockets: &'a [SockStat],
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A doorbell VM (protocol §9.5): every wake is an MSI-X interrupt.
#[derive(Serialize)]
struct DoorbellJson {
    kicks: u64,
    interrupts: u64,
}

pub(crate) fn render_json(s: &Snapshot) -> String {
    let j = StatJson {
        daemon: DaemonJson {
            pid: s.pid,
            socket: &s.socket,
            config: s.config.as_ref(),
            workers: &s.workers,
        },
        guests: s
            .guests
            .iter()
            .map(|g| GuestJson {
                id: g.id,
                pid: g.pid,
                comm: &g.comm,
                worker: g.worker,
                wakes: g.wakes,
                deferred_wakes: g.deferred_wakes,
                requests: g.requests,
                errors: g.errors,
                tx_bytes: g.bytes_total().0,
                rx_bytes: g.bytes_total().1,
                quota: &g.quota,
                doorbell: g.doorbell_kicks.map(|kicks| DoorbellJson {
                    kicks,
                    interrupts: g.wakes,
                }),
                network: g.network.as_ref(),
                bells: g.bells,
                fast_connects: g.fast_connects,
                sockets: &g.sockets,
            })
            .collect(),
        networks: &s.networks,
    };
    serde_json::to_string(&j).expect("the listing serializes")
}

pub(crate) fn render_text(s: &Snapshot) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "canald pid {}  socket {}  guests {}",
        s.pid,
        s.socket,
        s.guests.len()
    );
    for w in &s.workers {
        let _ = writeln!(
            o,
            "worker {}  notify {}  guests {}  sockets {}  rounds {}  sleeps {}  wakes {}  kicks {}  \
             spin {} ns  split T_p {} us / T_v {} us (T_worst {} us, C_p {} ns, C_v {} ns, \
             n {})  holds {}",
            w.id,
            w.notify,
            w.guests,
            w.sockets,
            w.rounds,
            w.sleeps,
            w.wakes,
            w.kicks,
            w.spin_ns,
            w.t_p_ns / 1000,
            w.t_v_ns / 1000,
            w.t_worst_ns / 1000,
            w.c_p_ns,
            w.c_v_ns,
            w.active,
            w.holds
        );
    }
    for n in &s.networks {
        let served = n.seccomp.as_ref().map_or(String::new(), |c| {
            format!(
                "  seccomp: sockets {} calls {} passed {} replaced {} errors {}",
                c.sockets, c.calls, c.passed, c.replaced, c.errors
            )
        });
        let _ = writeln!(
            o,
            "network {}  loopback {}  published [{}]{served}",
            n.name,
            n.loopback,
            n.published.join(", ")
        );
        let open = n.seccomp.as_ref().and_then(|c| c.open.as_deref());
        if let Some(open) = open.filter(|o| !o.is_empty()) {
            render_seccomp_sockets(&mut o, open);
        }
    }
    for g in &s.guests {
        let _ = writeln!(
            o,
            "\nguest {}  pid {}  comm {}  sockets {}  worker {}  wakes {} (+{} deferred)",
            g.id,
            g.pid,
            g.comm,
            g.sockets.len(),
            g.worker,
            g.wakes,
            g.deferred_wakes
        );
        if let Some(b) = g.bells {
            let _ = writeln!(
                o,
                "  bells: {} of its threads', {} of its peers' (protocol §8.8)",
                b.registered, b.given
            );
        }
        if let Some(n) = &g.network {
            let _ = writeln!(
                o,
                "  network {}  loopback {}  bound {}  own conns {}  published [{}]",
                n.name,
                n.loopback,
                n.bound,
                n.own_conns,
                n.published.join(", ")
            );
        }
        if g.sockets.is_empty() {
            continue;
        }
        let _ = writeln!(
            o,
            "  {:>8}  {:<12}  {:<10}  {:<22}  {:<22}  {:>12}  {:>12}  {:>6}",
            "HANDLE", "KIND", "STATE", "LOCAL", "PEER", "TX_BYTES", "RX_BYTES", "WORKER"
        );
        for k in &g.sockets {
            let _ = writeln!(
                o,
                "  {:>8}  {:<12}  {:<10}  {:<22}  {:<22}  {:>12}  {:>12}  {:>6}",
                k.handle,
                k.kind,
                k.state,
                if k.local.is_empty() { "-" } else { &k.local },
                if k.peer.is_empty() { "-" } else { &k.peer },
                k.tx_bytes,
                k.rx_bytes,
                k.worker
            );
        }
    }
    o
}

/// A network's sockets served through seccomp, under its line: the guest's view of
/// each end, and the host address the outside sees.
fn render_seccomp_sockets(o: &mut String, open: &[SeccompSockStat]) {
    let dash = |a: &str| {
        if a.is_empty() {
            "-".to_string()
        } else {
            a.to_string()
        }
    };
    let _ = writeln!(
        o,
        "  {:>8}  {:>5}  {:<12}  {:<11}  {:<22}  {:<22}  {:<22}  (served by seccomp)",
        "PID", "FD", "KIND", "STATE", "LOCAL", "PEER", "HOST"
    );
    for k in open {
        let _ = writeln!(
            o,
            "  {:>8}  {:>5}  {:<12}  {:<11}  {:<22}  {:<22}  {:<22}",
            k.pid,
            k.fd,
            k.kind,
            k.state,
            dash(&k.local),
            dash(&k.peer),
            dash(&k.host_local)
        );
    }
}

/// The listing the tests render (also `metrics::prom`'s).
#[cfg(test)]
pub(crate) fn tests_snapshot() -> Snapshot {
    tests::snap()
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn snap() -> Snapshot {
        Snapshot {
            pid: 42,
            socket: "/tmp/x/canald.sock".into(),
            config: None,
            networks: vec![],
            guests: vec![GuestStat {
                id: 1,
                pid: 1234,
                comm: "cu\"rl\n".into(),
                sockets: vec![
                    SockStat {
                        handle: 65537,
                        kind: "tcp",
                        state: "connected",
                        local: "127.0.0.1:80".into(),
                        peer: "127.0.0.1:5555".into(),
                        tx_bytes: 10,
                        worker: 0,
                        rx_bytes: 20,
                        zone_sends: None,
                        local_in: None,
                        local_drops: None,
                        native_accept: false,
                    },
                    SockStat {
                        handle: 65538,
                        kind: "tcp-listener",
                        state: "listening",
                        local: "[::1]:8080".into(),
                        peer: String::new(),
                        tx_bytes: 0,
                        rx_bytes: 0,
                        zone_sends: None,
                        local_in: None,
                        local_drops: None,
                        native_accept: false,
                        worker: 1,
                    },
                ],
                wakes: 3,
                deferred_wakes: 1,
                doorbell_kicks: None,
                network: None,
                worker: 0,
                requests: 9,
                errors: 2,
                closed_tx_bytes: 0,
                closed_rx_bytes: 0,
                bells: None,
                fast_connects: 0,
                quota: QuotaStat {
                    connect_waits: 4,
                    ..Default::default()
                },
            }],
            workers: vec![WorkerStat {
                id: 0,
                notify: "hybrid",
                rounds: 10,
                t_p_ns: 20_000,
                t_v_ns: 30_000,
                t_worst_ns: 50_000,
                sockets: 2,
                ..Default::default()
            }],
        }
    }

    #[test]
    fn json_shape() {
        let j = render_json(&snap());
        assert_eq!(
            j,
            "{\"daemon\":{\"pid\":42,\"socket\":\"/tmp/x/canald.sock\",\"workers\":[\
             {\"id\":0,\"notify\":\"hybrid\",\"guests\":0,\"rounds\":10,\"sleeps\":0,\
             \"wakes\":0,\"kicks\":0,\"holds\":0,\"spin_ns\":0,\"spun_ns\":0,\"requests\":0,\"bytes\":0,\"t_worst_ns\":50000,\
             \"t_p_ns\":20000,\"t_v_ns\":30000,\"c_p_ns\":0,\"c_v_ns\":0,\"active\":0,\
             \"sockets\":2}]},\
             \"guests\":[{\"id\":1,\"pid\":1234,\"comm\":\"cu\\\"rl\\n\",\"worker\":0,\
             \"wakes\":3,\"deferred_wakes\":1,\"requests\":9,\"errors\":2,\"tx_bytes\":10,\"rx_bytes\":20,\"quota\":{\"denied\":0,\"connect_waits\":4,\"request_waits\":0,\"watches_refused\":0,\"held_connects\":0},\"sockets\":[{\"handle\":65537,\"kind\":\"tcp\",\
             \"state\":\"connected\",\"local\":\"127.0.0.1:80\",\"peer\":\"127.0.0.1:5555\",\
             \"tx_bytes\":10,\"rx_bytes\":20,\"worker\":0},{\"handle\":65538,\"kind\":\"tcp-listener\",\
             \"state\":\"listening\",\"local\":\"[::1]:8080\",\"peer\":\"\",\"tx_bytes\":0,\
             \"rx_bytes\":0,\"worker\":1}]}],\"networks\":[]}"
        );
        let empty = Snapshot {
            pid: 1,
            socket: "s".into(),
            config: None,
            guests: vec![],
            workers: vec![],
            networks: vec![],
        };
        assert_eq!(
            render_json(&empty),
            "{\"daemon\":{\"pid\":1,\"socket\":\"s\",\"workers\":[]},\"guests\":[],\"networks\":[]}"
        );
    }

    #[test]
    fn config_json() {
        let mut c = crate::config::Config::new("/s".into());
        c.no_batch = true;
        c.shortcut = false;
        c.direct = false;
        c.workers = 1;
        c.notify = crate::engine::NotifyMode::Sleep;
        c.coalesce = crate::engine::CoalesceCfg::Fixed {
            t_worst: std::time::Duration::from_micros(100),
            t_p: std::time::Duration::from_micros(25),
        };
        let s = Snapshot {
            pid: 1,
            socket: "s".into(),
            config: Some(ConfigStat::from_config(&c)),
            guests: vec![],
            workers: vec![],
            networks: vec![],
        };
        assert_eq!(
            render_json(&s),
            "{\"daemon\":{\"pid\":1,\"socket\":\"s\",\"config\":{\"notify\":\"sleep\",\
             \"batch\":false,\"coalesce\":\"fixed\",\"t_worst_us\":100,\"split_us\":25,\
             \"workers\":1,\"shortcut\":false,\"zones\":false,\"arenas\":false,\"bells\":false,\"direct\":false},\"workers\":[]},\"guests\":[],\"networks\":[]}"
        );
        c.coalesce = crate::engine::CoalesceCfg::Off;
        let cs = ConfigStat::from_config(&c);
        assert_eq!((cs.coalesce, cs.t_worst_us, cs.split_us), ("off", 0, None));
        c.shortcut = true;
        assert!(ConfigStat::from_config(&c).shortcut);
        // The short-circuit works with any number of workers (protocol §8.5).
        c.workers = 2;
        assert!(ConfigStat::from_config(&c).shortcut);
    }

    #[test]
    fn control_chars_escaped() {
        let mut s = snap();
        s.guests[0].comm = "a\u{1}b\\\"".into();
        let j: serde_json::Value = serde_json::from_str(&render_json(&s)).unwrap();
        assert_eq!(j["guests"][0]["comm"], "a\u{1}b\\\"");
        assert!(render_json(&s).contains(r#""comm":"a\u0001b\\\"""#));
    }

    #[test]
    fn text_table() {
        let t = render_text(&snap());
        assert!(t.starts_with("canald pid 42  socket /tmp/x/canald.sock  guests 1\n"));
        assert!(t.contains("guest 1  pid 1234"));
        assert!(t.contains("worker 0  notify hybrid") && t.contains("T_p 20 us / T_v 30 us"));
        let row = t.lines().find(|l| l.contains("65538")).unwrap();
        assert!(row.contains("tcp-listener") && row.contains("listening"));
        assert!(row.contains("[::1]:8080") && row.contains(" - "));
        assert!(t
            .lines()
            .any(|l| l.contains("HANDLE") && l.contains("RX_BYTES")));
    }

    #[test]
    fn addresses() {
        assert_eq!(fmt_addr(None), "");
        assert_eq!(
            fmt_addr(Some(CanalAddr::v4([10, 0, 0, 1], 443))),
            "10.0.0.1:443"
        );
        let mut v6 = [0u8; 16];
        v6[15] = 1;
        assert_eq!(fmt_addr(Some(CanalAddr::v6(v6, 5, 0, 0))), "[::1]:5");
    }
}
