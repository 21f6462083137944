//! What is measured: systems (who runs where), workloads, switch variants, cells, and
//! the experiments B1–B13 of docs/bench/README.md expressed as lists of cells.

use std::fmt;

/// Who runs where. Native programs use the kernel; guests run under `canal run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum System {
    /// Kernel TCP over 127.0.0.1, both ends native.
    Tcp,
    /// Unix domain stream socket, both ends native.
    Uds,
    /// Both ends under `canal run`, over 127.0.0.1 TCP (canal's co-resident short-circuit).
    CanalGG,
    /// Client under `canal run`, server native: canald carries it onto host TCP.
    CanalGN,
    /// Server under `canal run`, client native: canald accepts for the guest.
    CanalNG,
}

pub(crate) const ALL_SYSTEMS: [System; 4] =
    [System::Tcp, System::Uds, System::CanalGG, System::CanalGN];

/// UDP ends: native (kernel UDP, shown in the `tcp` column), both under canal, client
/// under canal (B15).
const UDP_PLACEMENTS: [System; 3] = [System::Tcp, System::CanalGG, System::CanalGN];

/// Every placement of TCP ends, native and under canal (B12, B13).
const TCP_PLACEMENTS: [System; 4] = [
    System::Tcp,
    System::CanalGG,
    System::CanalGN,
    System::CanalNG,
];

impl System {
    pub(crate) fn id(self) -> &'static str {
        match self {
            System::Tcp => "tcp",
            System::Uds => "uds",
            System::CanalGG => "canal-gg",
            System::CanalGN => "canal-gn",
            System::CanalNG => "canal-ng",
        }
    }
    pub(crate) fn label(self) -> &'static str {
        match self {
            System::Tcp => "kernel TCP",
            System::Uds => "UDS",
            System::CanalGG => "canal guest↔guest",
            System::CanalGN => "canal guest→native",
            System::CanalNG => "canal native→guest",
        }
    }
    pub(crate) fn parse(s: &str) -> Option<System> {
        ALL_SYSTEMS
            .into_iter()
            .chain([System::CanalNG])
            .find(|x| x.id() == s)
    }
    pub(crate) fn server_is_guest(self) -> bool {
        matches!(self, System::CanalGG | System::CanalNG)
    }
    pub(crate) fn client_is_guest(self) -> bool {
        matches!(self, System::CanalGG | System::CanalGN)
    }
    pub(crate) fn uses_canal(self) -> bool {
        self.client_is_guest() || self.server_is_guest()
    }
    pub(crate) fn placement(self) -> &'static str {
        match self {
            System::Tcp => "server native, client native, 127.0.0.1 TCP",
            System::Uds => "server native, client native, Unix socket",
            System::CanalGG => "server guest, client guest (canal run), 127.0.0.1 TCP via canald",
            System::CanalGN => "server native, client guest (canal run), 127.0.0.1 TCP via canald",
            System::CanalNG => "server guest (canal run), client native, 127.0.0.1 TCP via canald",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Workload {
    /// Built-in generator, request-response (ping-pong).
    Rr,
    /// Built-in generator, one-way stream.
    Stream,
    /// Built-in generator, connected but idle (idle CPU of every process).
    Idle,
    /// Built-in generator rr under `strace -c`: system calls per round trip.
    SysRr,
    /// Built-in generator stream under `strace -c`: system calls per send.
    SysStream,
    Sockperf,
    Iperf3,
    Redis,
    Nginx,
    /// memcached with memaslap (B10).
    Memcached,
    /// PostgreSQL with pgbench, select-only and TPC-B-like (B10).
    Postgres,
    /// Built-in generator: connect, 1-byte echo, close; `size` = concurrent clients.
    ConnRate,
    /// Built-in generator: `size` idle connections held, 64-byte ping-pong on one more.
    Hold,
    /// Built-in generator over UDP (B15): datagram request-response.
    UdpRr,
    /// Built-in generator over UDP (B15): one-way datagrams, throughput of what arrived.
    UdpStream,
}

impl Workload {
    pub(crate) fn id(self) -> &'static str {
        match self {
            Workload::Rr => "rr",
            Workload::Stream => "stream",
            Workload::Idle => "idle",
            Workload::SysRr => "syscalls-rr",
            Workload::SysStream => "syscalls-stream",
            Workload::Sockperf => "sockperf-pp",
            Workload::Iperf3 => "iperf3",
            Workload::Redis => "redis-benchmark",
            Workload::Nginx => "nginx-wrk",
            Workload::Memcached => "memcached",
            Workload::Postgres => "pgbench",
            Workload::ConnRate => "conn-rate",
            Workload::Hold => "hold",
            Workload::UdpRr => "udp-rr",
            Workload::UdpStream => "udp-stream",
        }
    }
}

/// A set of canal switches. Switches travel as flags of the canald the harness starts
/// (`args`) and as environment variables given to it and to every guest (`env`, e.g.
/// `CANAL_NOTIFY` for libcanal's own waiting); canald must echo the ones in force under
/// `daemon.config` in `canal stat --json`, otherwise the variant is reported as not
/// available (a switch canal silently ignores must not produce numbers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Variant {
    pub(crate) name: String,
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    /// (key under daemon.config, expected value as text).
    pub(crate) expect: Vec<(String, String)>,
    /// Set when canal has no such switch: its cells are "not available" with this reason.
    pub(crate) unavailable: Option<String>,
}

/// T_worst of the coalescing variants (B9), in µs: adaptive and fixed splits share it.
pub(crate) const COALESCE_WINDOW_US: u64 = 100;

impl Variant {
    pub(crate) fn parse(name: &str) -> Result<Variant, String> {
        let v = |args: &[&str], env: &[(&str, &str)], expect: &[(&str, &str)]| Variant {
            name: name.to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: env
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            expect: expect
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            unavailable: None,
        };
        let t = COALESCE_WINDOW_US.to_string();
        match name.split_once('=') {
            None if name == "default" => Ok(v(&[], &[], &[])),
            Some(("notify", m)) if ["poll", "sleep", "hybrid"].contains(&m) => Ok(v(
                &["--notify", m],
                &[("CANAL_NOTIFY", m)],
                &[("notify", m)],
            )),
            // Polling off: canald and the guests only sleep.
            Some(("disable", "poll")) => Ok(v(
                &["--notify", "sleep"],
                &[("CANAL_NOTIFY", "sleep")],
                &[("notify", "sleep")],
            )),
            Some(("disable", "batch")) => Ok(v(&["--no-batch"], &[], &[("batch", "false")])),
            Some(("disable", "coalesce")) => {
                Ok(v(&["--t-worst-us", "0"], &[], &[("coalesce", "off")]))
            }
            // Wake-up coalescing is off by default (docs/bench/coalescing): `coalesce=on`
            // measures the adaptive split at canald's default T_worst against it.
            Some(("coalesce", "on")) => Ok(v(
                &["--coalesce"],
                &[],
                &[("coalesce", "adaptive"), ("t_worst_us", "50")],
            )),
            Some(("disable", "shortcut")) => {
                Ok(v(&["--no-shortcut"], &[], &[("shortcut", "false")]))
            }
            // A segment file per short-circuited connection instead of pair arenas
            // (protocol §8.7): what the arenas save on short connections (B12).
            Some(("disable", "arenas")) => Ok(v(&["--arenas", "off"], &[], &[("arenas", "false")])),
            // Sleepers woken by canald's relay instead of their peer's bell (protocol
            // §8.8): what the bells save servers that wait in epoll/poll (B10 g↔g).
            Some(("disable", "bells")) => Ok(v(&["--bells", "off"], &[], &[("bells", "false")])),
            // Every connect a CONNECT, none with a ticket (protocol §8.10): what fast
            // connects save short connections between guests (B12 g↔g).
            Some(("disable", "fast")) => Ok(v(&[], &[("CANAL_FAST_CONNECT", "off")], &[])),
            // A guest's native peers relayed by canald instead of on the guest's own
            // kernel sockets (protocol §2 Port directory): the relay's cost or gain.
            Some(("disable", "direct")) => {
                Ok(v(&["--direct", "off"], &[], &[("direct", "false")]))
            }
            // Zero copy in canal's sense: buffer zones (sends beyond the ring's free
            // space posted by (zone, offset) descriptors, protocol §10). Off by
            // default; `zones=on` measures them against it.
            Some(("disable", "zerocopy")) => Ok(v(&["--zones", "off"], &[], &[("zones", "false")])),
            Some(("zones", m)) if m == "on" || m == "off" => Ok(v(
                &["--zones", m],
                &[],
                &[("zones", if m == "on" { "true" } else { "false" })],
            )),
            // canald pollers; with 2..16 a guest's connections and datagram sockets
            // spread over them (virtual RSS); guest-to-guest stays short-circuited.
            Some(("workers", n)) if n.parse::<u32>().is_ok_and(|n| (1..=16).contains(&n)) => {
                Ok(v(&["--workers", n], &[], &[("workers", n)]))
            }
            Some(("split", "adaptive")) => Ok(v(
                &["--t-worst-us", &t],
                &[],
                &[("coalesce", "adaptive"), ("t_worst_us", &t)],
            )),
            Some(("split", m)) if m.parse::<f64>().is_ok_and(|f| (0.0..=1.0).contains(&f)) => {
                // The share f of T_worst spent holding host-side: T_p = f · T_worst.
                let f: f64 = m.parse().unwrap_or(0.0);
                let p = ((COALESCE_WINDOW_US as f64) * f).round() as u64;
                let p = p.to_string();
                Ok(v(
                    &["--t-worst-us", &t, "--split-us", &p],
                    &[],
                    &[("coalesce", "fixed"), ("t_worst_us", &t), ("split_us", &p)],
                ))
            }
            _ => Err(format!(
                "unknown variant '{name}' (default, notify=poll|sleep|hybrid, \
                 disable=poll|batch|coalesce|shortcut|zerocopy|arenas|bells|fast, zones=on|off, coalesce=on, \
                 split=adaptive|0.0..1.0, workers=1..16)"
            )),
        }
    }
    pub(crate) fn is_default(&self) -> bool {
        self.name == "default"
    }

    /// None when `daemon.config` (from `canal stat --json`) shows every expected switch,
    /// else why the variant cannot be confirmed.
    pub(crate) fn check(&self, config: Option<&crate::json::Json>) -> Option<String> {
        for (k, want) in &self.expect {
            let got = config
                .and_then(|c| crate::json::get(c, k))
                .map(crate::json::as_text);
            if got.as_deref() != Some(want.as_str()) {
                let mut sw: Vec<String> = self.args.clone();
                sw.extend(self.env.iter().map(|(a, b)| format!("{a}={b}")));
                return Some(format!(
                    "switch {} not confirmed: canald does not report daemon.config.{k}={want} \
                     in `canal stat --json` (got {})",
                    sw.join(" "),
                    got.unwrap_or_else(|| "nothing".into())
                ));
            }
        }
        None
    }
}

/// One measured configuration; repeated `reps` times, interleaved with its neighbours.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Cell {
    pub(crate) workload: Workload,
    pub(crate) size: usize,
    pub(crate) pairs: usize,
    pub(crate) variant: String,
    pub(crate) system: System,
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} size={} pairs={} variant={}",
            self.workload.id(),
            self.system.id(),
            self.size,
            self.pairs,
            self.variant
        )
    }
}

pub(crate) struct Experiment {
    pub(crate) id: &'static str,
    pub(crate) title: &'static str,
    pub(crate) measures: &'static str,
    pub(crate) target: &'static str,
    pub(crate) cells: Vec<Cell>,
    /// Set when the experiment cannot run at all on this build (B11).
    pub(crate) unavailable: Option<&'static str>,
}

/// Sizes and counts for one mode (quick or full), possibly overridden on the command line.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) quick: bool,
    pub(crate) sizes: Option<Vec<usize>>,
    pub(crate) pairs: Option<Vec<usize>>,
    pub(crate) systems: Option<Vec<System>>,
    pub(crate) variants: Option<Vec<String>>,
}

pub(crate) const EXPERIMENT_IDS: [&str; 14] = [
    "B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B9", "B10", "B11", "B12", "B13", "B15",
];

fn cells(
    plan: &Plan,
    workloads: &[Workload],
    sizes: &[usize],
    pairs: &[usize],
    variants: &[&str],
    systems: &[System],
) -> Vec<Cell> {
    // --sizes is message sizes: not B12's client counts nor B13's connection counts.
    let counts = workloads
        .iter()
        .any(|w| matches!(w, Workload::ConnRate | Workload::Hold));
    let sizes: Vec<usize> = match &plan.sizes {
        Some(s) if sizes != [0] && !counts => s.clone(),
        _ => sizes.to_vec(),
    };
    // --pairs applies to the experiments that vary the number of pairs (B4, B9).
    let pairs: Vec<usize> = match &plan.pairs {
        Some(p) if pairs != [1] => p.clone(),
        _ => pairs.to_vec(),
    };
    let mut out = Vec::new();
    for &w in workloads {
        for &size in &sizes {
            for &p in &pairs {
                for &v in variants {
                    if plan
                        .variants
                        .as_ref()
                        .is_some_and(|vs| !vs.iter().any(|x| x == v))
                    {
                        continue;
                    }
                    for &s in systems {
                        if plan.systems.as_ref().is_some_and(|ss| !ss.contains(&s)) {
                            continue;
                        }
                        // Variants are canal switches; native baselines run once, as default.
                        if v != "default" && !s.uses_canal() {
                            continue;
                        }
                        out.push(Cell {
                            workload: w,
                            size,
                            pairs: p,
                            variant: v.to_string(),
                            system: s,
                        });
                    }
                }
            }
        }
    }
    out
}

pub(crate) fn experiment(id: &str, plan: &Plan) -> Option<Experiment> {
    use System::*;
    use Workload::*;
    let q = plan.quick;
    let all = ALL_SYSTEMS;
    let pick = |quick: &[usize], full: &[usize]| if q { quick.to_vec() } else { full.to_vec() };
    let e = match id {
        "B1" => Experiment {
            id: "B1",
            title: "request-response latency vs message size",
            measures: "round-trip time p50/p99 of blocking send+recv ping-pong (built-in generator)",
            target: "canal g↔g p50 at 64 B ≤ 1 µs and ≤ 1/50 of kernel TCP",
            cells: cells(plan, &[Rr], &pick(&[64, 1024, 16384], &[56, 64, 256, 1024, 4096, 16384, 65536]), &[1], &["default"], &all),
            unavailable: None,
        },
        "B2" => Experiment {
            id: "B2",
            title: "streaming throughput vs message size",
            measures: "bytes/s and messages/s of a one-way blocking stream (built-in generator)",
            target: "canal g↔g ≥ 2× UDS at every size; ≥ 7× kernel TCP at 16 KiB, ≥ 12× at 64 KiB; ≥ 10× kernel TCP msg/s at 64 B",
            cells: cells(
                plan,
                &[Stream],
                &pick(&[64, 1024, 65536], &[56, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]),
                &[1],
                &["default"],
                &all,
            ),
            unavailable: None,
        },
        "B3" => {
            // The reverse direction (native client, server under canal) in full mode:
            // the quick mode keeps its time budget.
            let gen_systems: &[System] = if q { &[Tcp, CanalGN] } else { &[Tcp, CanalGN, CanalNG] };
            let mut c = cells(plan, &[Stream], &[65536], &[1], &["default"], gen_systems);
            c.extend(cells(plan, &[Rr], &[64], &[1], &["default"], gen_systems));
            c.extend(cells(plan, &[Iperf3], &pick(&[65536], &[1024, 65536]), &[1], &["default"], &[Tcp, CanalGN]));
            c.extend(cells(plan, &[Sockperf], &pick(&[64], &[64, 1024, 16384]), &[1], &["default"], &[Tcp, CanalGN]));
            // canald's relay (the path of VMs and guests under a policy), side by side;
            // in full mode also for native clients, which the server otherwise accepts
            // itself (NATIVE_ACCEPT).
            let relayed: &[System] = if q { &[CanalGN] } else { &[CanalGN, CanalNG] };
            c.extend(cells(plan, &[Stream], &[65536], &[1], &["disable=direct"], relayed));
            c.extend(cells(plan, &[Rr], &[64], &[1], &["disable=direct"], relayed));
            Experiment {
                id: "B3",
                title: "guest → native peer through canald onto host TCP (and native → guest)",
                measures: "stream throughput and RR latency of a guest client against a native server (generator, iperf3, sockperf); in full mode also a native client against a server under canal (generator)",
                target: "≥ 96% of a native client's throughput; RR p50 ≤ 1.04× native",
                cells: c,
                unavailable: None,
            }
        }
        "B4" => {
            let pairs = pick(&[1, 2], &[1, 2, 4, 8]);
            // workers=2 (virtual RSS, short-circuit on) against default (one worker):
            // what a second poller adds; disable=shortcut: the same pairs on host TCP.
            let vs = ["default", "disable=shortcut", "workers=2"];
            let mut c = cells(plan, &[Stream], &[16384], &pairs, &vs, &[Tcp, Uds, CanalGG]);
            c.extend(cells(plan, &[Rr], &[64], &pairs, &vs, &[Tcp, Uds, CanalGG]));
            Experiment {
                id: "B4",
                title: "scaling with 1 … 8 concurrent client/server pairs (2 … 16 guests on one canald)",
                measures: "aggregate stream throughput (16 KiB) and mean RR p50 (64 B)",
                target: "aggregate never falls as guests are added; mean latency at 8 pairs ≤ 2× at 1",
                cells: c,
                unavailable: None,
            }
        }
        "B5" => {
            let modes = ["default", "notify=poll", "notify=sleep", "notify=hybrid"];
            let mut c = cells(plan, &[Rr], &[64], &[1], &modes, &[Tcp, CanalGG]);
            c.extend(cells(plan, &[Idle], &[64], &[1], &modes, &[Tcp, CanalGG]));
            Experiment {
                id: "B5",
                title: "notification modes: poll only / sleep only / hybrid",
                measures: "RR p50/p99 at 64 B and CPU per process; CPU of canald with one idle connection",
                target: "hybrid within 10% of poll-only latency under load; idle canald ≤ 1% of a core",
                cells: c,
                unavailable: None,
            }
        }
        "B6" => Experiment {
            id: "B6",
            title: "transfer cost",
            measures: "CPU time of every process (client, server, canald) per byte moved, streaming",
            target: "canal g↔g ≤ kernel TCP at ≥ 1 KiB",
            cells: cells(plan, &[Stream], &pick(&[1024, 65536], &[64, 1024, 16384, 65536]), &[1], &["default"], &all),
            unavailable: None,
        },
        _ => return experiment_b7_on(id, plan),
    };
    Some(e)
}

/// B12's variants: pair arenas and fast connects (g↔g) and the direct path (g→n) off,
/// beside the default.
const B12_VARIANTS: [&str; 4] = [
    "default",
    "disable=arenas",
    "disable=fast",
    "disable=direct",
];

/// B7 … B13 (see `experiment`).
fn experiment_b7_on(id: &str, plan: &Plan) -> Option<Experiment> {
    use System::*;
    use Workload::*;
    let q = plan.quick;
    let all = ALL_SYSTEMS;
    let pick = |quick: &[usize], full: &[usize]| if q { quick.to_vec() } else { full.to_vec() };
    let e = match id {
        "B7" => {
            let mut c = cells(plan, &[SysRr], &[64], &[1], &["default"], &all);
            c.extend(cells(plan, &[SysStream], &[1024], &[1], &["default"], &all));
            // The target's condition, "while the other side is polling": canald and
            // both guests in poll-only mode, so no side ever needs a wake-up.
            for w in [SysRr, SysStream] {
                let size = if w == SysRr { 64 } else { 1024 };
                c.extend(cells(plan, &[w], &[size], &[1], &["notify=poll"], &[CanalGG, CanalGN]));
            }
            Experiment {
                id: "B7",
                title: "system calls avoided",
                measures: "system calls per round trip (RR, 64 B) and per send (stream, 1 KiB) made by the client process, counted with strace -c -f",
                target: "0 per send/recv in steady state while the other side is polling",
                cells: c,
                unavailable: None,
            }
        }
        "B8" => {
            let v = [
                "default",
                "disable=poll",
                "disable=batch",
                "coalesce=on",
                "disable=shortcut",
                "disable=zerocopy",
                "zones=on",
            ];
            let mut c = cells(plan, &[Stream], &[16384], &[1], &v, &[Tcp, CanalGG]);
            if !q {
                c.extend(cells(plan, &[Rr], &[64], &[1], &v, &[Tcp, CanalGG]));
            }
            // Guest↔guest traffic is short-circuited past canald, where batching and
            // coalescing act: their share shows on guest→native connections.
            let gn = ["default", "disable=poll", "disable=batch", "coalesce=on"];
            c.extend(cells(plan, &[Stream], &[16384], &[1], &gn, &[CanalGN]));
            if !q {
                c.extend(cells(plan, &[Rr], &[64], &[1], &gn, &[CanalGN]));
            }
            Experiment {
                id: "B8",
                title: "ablation: each canal mechanism switched off in turn",
                measures: "stream throughput at 16 KiB (and RR p50 at 64 B in full mode) with one mechanism disabled, guest↔guest and guest→native",
                target: "each mechanism's share shown; each one pays for itself",
                cells: c,
                unavailable: None,
            }
        }
        "B9" => {
            let v: &[&str] = if q {
                &["split=adaptive", "split=0", "split=0.5", "split=1"]
            } else {
                // With coalescing off too: what the split saves at all (B8's question
                // for coalescing, asked where it acts: n guests behind one poller).
                &[
                    "split=adaptive",
                    "split=0",
                    "split=0.25",
                    "split=0.5",
                    "split=0.75",
                    "split=1",
                    "disable=coalesce",
                ]
            };
            Experiment {
                id: "B9",
                title: "two-layer coalescing: host/guest split of the wake-up window",
                measures: "CPU per round trip and cores busy, and worst-case RR latency (max) at 64 B with n concurrent guest→native pairs (canald's path: guest↔guest traffic is short-circuited past the split), per split",
                target: "adaptive split ≤ CPU of any fixed split at the same worst-case latency",
                cells: cells(plan, &[Rr], &[64], &pick(&[1, 2], &[1, 2, 4, 8]), v, &[CanalGN]),
                unavailable: None,
            }
        }
        "B10" => {
            let mut c = cells(plan, &[Redis], &[0], &[1], &["default"], &all);
            c.extend(cells(plan, &[Nginx], &[0], &[1], &["default"], &[Tcp, CanalGG, CanalGN]));
            c.extend(cells(plan, &[Memcached], &[0], &[1], &["default"], &[Tcp, CanalGG, CanalGN]));
            // Not in quick mode: its budget (120 s, tests/e2e/test_bench.py) is nearly
            // spent without the ~10 s of a database set-up and two cells; PostgreSQL under
            // canal is tested by tests/compat/test_compat_postgres.py.
            if !q {
                c.extend(cells(plan, &[Postgres], &[0], &[1], &["default"], &TCP_PLACEMENTS));
                // The server's native clients relayed by canald, beside accepted by the
                // server itself (NATIVE_ACCEPT).
                c.extend(cells(plan, &[Postgres], &[0], &[1], &["disable=direct"], &[CanalNG]));
            }
            c.extend(cells(plan, &[Redis, Nginx, Memcached], &[0], &[1], &["disable=bells"], &[CanalGG]));
            c.extend(cells(plan, &[Redis, Nginx, Memcached], &[0], &[1], &["disable=direct"], &[CanalGN]));
            Experiment {
                id: "B10",
                title: "real applications",
                measures: "redis-benchmark SET/GET req/s and p99; nginx + wrk req/s and p99; memcached + memaslap ops/s (2 threads, 16 connections, 9:1 get:set, a tenth of gets verified); PostgreSQL + pgbench tps (8 clients, select-only and TPC-B-like, scale 1, fsync off; kernel, both ends, client only, server only)",
                target: "guest↔guest ≥ 1.5× native loopback; guest→native ≥ 0.95× native; PostgreSQL both ends ≥ 1.2× native, server only ≥ 0.95×; memcached ≥ 1.0×",
                cells: c,
                unavailable: None,
            }
        }
        "B11" => Experiment {
            id: "B11",
            title: "inside a QEMU guest: canal over ivshmem vs virtio-net",
            measures: "throughput and RR latency from a VM to a host server",
            target: "canal ≥ 3× virtio-net throughput and ≤ 1/3 of its latency",
            cells: vec![],
            unavailable: Some(
                "boots a QEMU guest: run it alone as `canal bench b11` (crates/canal-vm/src/bench.rs; \
                 results in docs/bench/b11.md)",
            ),
        },
        "B12" => Experiment {
            id: "B12",
            title: "connection rate",
            measures: "connections/s of clients that connect, echo 1 byte and close, one after another (1 and 16 concurrent clients; the size column is the number of clients), and one connection's life p50",
            target: "guest↔guest ≥ 5× kernel TCP; guest→native and native→guest ≥ 1.0×",
            cells: cells(plan, &[ConnRate], &[1, 16], &[1], &B12_VARIANTS, &TCP_PLACEMENTS),
            unavailable: None,
        },
        "B13" => Experiment {
            id: "B13",
            title: "many connections held by one server",
            measures: "RR p50 at 64 B on one connection while n idle ones are held (the size column is n), and memory per held connection: every process's PSS (client, server, canald) plus the kernel's slab (but /proc's inodes and their dentries, and TIME_WAIT sockets) and TCP memory, after − before, / n",
            target: "RR p50 with 10,000 idle connections ≤ 1.1× with none; memory per idle connection ≤ the kernel's",
            cells: cells(plan, &[Hold], &pick(&[0, 300], &[0, 1000, 10000]), &[1], &["default"], &TCP_PLACEMENTS),
            unavailable: None,
        },
        "B15" => Experiment {
            id: "B15",
            title: "UDP",
            measures: "datagram request-response p50 (64 B, 1 KiB) and one-way datagram throughput of what arrived (64 B, 1 KiB, 8 KiB); the kernel column is kernel UDP over 127.0.0.1",
            target: "guest↔guest RR p50 ≤ 1/20 of kernel UDP; guest→native ≥ 0.95× kernel UDP throughput",
            cells: [
                cells(plan, &[UdpRr], &pick(&[64], &[64, 1024]), &[1], &["default"], &UDP_PLACEMENTS),
                cells(plan, &[UdpStream], &pick(&[1024], &[64, 1024, 8192]), &[1], &["default"], &UDP_PLACEMENTS),
                cells(plan, &[UdpStream], &pick(&[1024], &[64, 1024, 8192]), &[1], &["disable=direct"], &[CanalGN]),
            ]
            .concat(),
            unavailable: None,
        },
        _ => return None,
    };
    Some(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(quick: bool) -> Plan {
        Plan {
            quick,
            sizes: None,
            pairs: None,
            systems: None,
            variants: None,
        }
    }

    #[test]
    fn every_experiment_is_defined_and_baselines_are_native_default() {
        for id in EXPERIMENT_IDS {
            let e = experiment(id, &plan(true)).unwrap();
            assert!(e.unavailable.is_some() || !e.cells.is_empty(), "{id}");
            for c in &e.cells {
                assert!(c.variant == "default" || c.system.uses_canal(), "{id}: {c}");
                Variant::parse(&c.variant).unwrap();
            }
        }
        assert!(experiment("B14", &plan(true)).is_none());
    }

    #[test]
    fn filters_apply() {
        let p = Plan {
            quick: true,
            sizes: Some(vec![4096]),
            pairs: None,
            systems: Some(vec![System::Uds]),
            variants: None,
        };
        let e = experiment("B2", &p).unwrap();
        assert_eq!(e.cells.len(), 1);
        assert_eq!((e.cells[0].size, e.cells[0].system), (4096, System::Uds));
        // Tool cells keep their size 0 whatever --sizes says.
        assert!(experiment("B10", &p)
            .unwrap()
            .cells
            .iter()
            .all(|c| c.size == 0));
    }

    #[test]
    fn variants_parse() {
        assert_eq!(
            Variant::parse("notify=poll").unwrap().env,
            vec![("CANAL_NOTIFY".to_string(), "poll".to_string())]
        );
        assert!(Variant::parse("notify=fast").is_err());
        assert!(Variant::parse("split=1.5").is_err());
        assert!(Variant::parse("split=0.25").is_ok());
    }

    #[test]
    fn variants_map_to_canald_flags() {
        let v = Variant::parse("split=0.25").unwrap();
        assert_eq!(v.args, ["--t-worst-us", "100", "--split-us", "25"]);
        let v = Variant::parse("disable=poll").unwrap();
        assert_eq!(v.args, ["--notify", "sleep"]);
        assert_eq!(v.env, [("CANAL_NOTIFY".to_string(), "sleep".to_string())]);
        let z = Variant::parse("disable=zerocopy").unwrap();
        assert!(z.unavailable.is_none());
        assert_eq!(z.args, ["--zones", "off"]);
        assert_eq!(z.expect, [("zones".to_string(), "false".to_string())]);
        assert_eq!(Variant::parse("zones=on").unwrap().args, ["--zones", "on"]);
        assert!(Variant::parse("zones=maybe").is_err());
        assert!(Variant::parse("disable=shortcut")
            .unwrap()
            .unavailable
            .is_none());
    }

    #[test]
    fn config_check() {
        let cfg = crate::json::parse(
            r#"{"daemon":{"pid":1,"config":{"notify":"sleep","batch":false,
               "coalesce":"fixed","t_worst_us":100,"split_us":25,"workers":1,
               "shortcut":true}}}"#,
        )
        .unwrap();
        let c = crate::json::get(&cfg, "daemon.config");
        assert_eq!(Variant::parse("split=0.25").unwrap().check(c), None);
        assert_eq!(Variant::parse("disable=batch").unwrap().check(c), None);
        assert_eq!(Variant::parse("disable=poll").unwrap().check(c), None);
        assert_eq!(Variant::parse("default").unwrap().check(c), None);
        // A different split, or a switch the daemon does not show, is refused.
        let e = Variant::parse("split=0.5").unwrap().check(c).unwrap();
        assert!(
            e.contains("daemon.config.split_us=50") && e.contains("got 25"),
            "{e}"
        );
        let e = Variant::parse("disable=shortcut")
            .unwrap()
            .check(c)
            .unwrap();
        assert!(e.contains("got true"), "{e}");
        let e = Variant::parse("split=adaptive").unwrap().check(c).unwrap();
        assert!(e.contains("got fixed"), "{e}");
        // An old canald without daemon.config confirms nothing.
        let e = Variant::parse("notify=poll").unwrap().check(None).unwrap();
        assert!(e.contains("got nothing"), "{e}");
    }
}
