//! Runs one cell once: starts the servers and clients of that system (natively or under
//! `canal run`), waits with deadlines, and turns their output into metrics.

use crate::json;
use crate::model::{Cell, System, Variant, Workload};
use crate::procs::{free_port, pid_cpu_seconds, status_text, wait_connectable, Proc};
use std::path::PathBuf;
use std::time::Duration;

pub(crate) use crate::status::Status;

#[derive(Clone, Debug)]
pub(crate) struct Outcome {
    pub(crate) status: Status,
    pub(crate) metrics: Vec<(String, f64)>,
    /// The processes as they were started (shell syntax), `;`-separated.
    pub(crate) raw_command: String,
    pub(crate) detail: String,
}

impl Outcome {
    /// A cell that was not run, and why (`status`).
    pub(crate) fn not_run(status: Status) -> Outcome {
        Outcome {
            status,
            metrics: vec![],
            raw_command: String::new(),
            detail: String::new(),
        }
    }

    pub(crate) fn fail(reason: String, raw: String) -> Outcome {
        Outcome {
            status: Status::Failed(reason),
            metrics: vec![],
            raw_command: raw,
            detail: String::new(),
        }
    }
}

/// Settings for how long and how hard each run goes.
#[derive(Clone, Debug)]
pub(crate) struct Knobs {
    pub(crate) duration: f64,
    pub(crate) idle_secs: f64,
    pub(crate) tool_secs: f64,
    pub(crate) redis_requests: u64,
    pub(crate) strace_counts: (u64, u64),
    /// Nominal seconds for one run under strace (it slows every call down).
    pub(crate) strace_secs: f64,
    /// Extra seconds a canal run may take beyond its nominal duration.
    pub(crate) canal_grace: f64,
    pub(crate) pin: bool,
    pub(crate) cpu_mhz: Option<f64>,
}

pub(crate) struct Daemon {
    pub(crate) variant: String,
    pub(crate) socket: PathBuf,
    pub(crate) proc: Option<Proc>,
    pub(crate) pid: Option<u32>,
    /// Why canal cells of this variant cannot run, if they cannot.
    pub(crate) problem: Option<Status>,
    pub(crate) config: Option<json::Json>,
}

pub(crate) struct Runner {
    pub(crate) canal: PathBuf,
    pub(crate) gen: PathBuf,
    pub(crate) tmp: PathBuf,
    pub(crate) knobs: Knobs,
    pub(crate) daemon: Option<Daemon>,
    pub(crate) seq: u64,
    /// Every port handed to a server in this run: never handed out twice (the kernel
    /// may offer a port again that a server started a moment ago has not bound yet;
    /// 8 pairs' servers then collided with EADDRINUSE).
    pub(crate) ports: std::collections::HashSet<u16>,
    /// PostgreSQL's binaries and database for B10's pgbench cells, made at the first
    /// (or why they cannot run).
    pub(crate) pg: Option<Result<crate::tools::pg_setup::PgSetup, Status>>,
}

pub(crate) fn metric_unit(m: &str) -> &'static str {
    match m {
        x if x.ends_with("_us") => "µs",
        "gbit_s" => "Gbit/s",
        "bytes_s" => "B/s",
        "msgs_s" => "msg/s",
        x if x.ends_with("_rps") || x == "req_s" => "req/s",
        x if x.ends_with("_tps") => "tx/s",
        "cpu_ns_per_byte" => "ns/B",
        "est_cycles_per_byte" => "cycles/B",
        "cpu_cores" => "cores",
        "daemon_cpu_pct" | "guests_cpu_pct" => "% of a core",
        x if x.ends_with("_s") => "s",
        "syscalls_per_msg" => "syscalls/msg",
        _ => "",
    }
}

impl Runner {
    pub(crate) fn new(canal: PathBuf, gen: PathBuf, tmp: PathBuf, knobs: Knobs) -> Runner {
        Runner {
            canal,
            gen,
            tmp,
            knobs,
            daemon: None,
            seq: 0,
            ports: std::collections::HashSet::new(),
            pg: None,
        }
    }

    /// A free loopback port not handed out before in this run.
    pub(crate) fn port(&mut self) -> Result<u16, String> {
        for _ in 0..1000 {
            let p = free_port()?;
            if self.ports.insert(p) {
                return Ok(p);
            }
        }
        Err("no free port that this run has not used".into())
    }

    pub(crate) fn next_id(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    pub(crate) fn canal_s(&self) -> String {
        self.canal.to_string_lossy().into_owned()
    }

    /// Makes sure a canald for `variant` runs (restarting it for another variant).
    pub(crate) fn ensure_daemon(&mut self, variant: &Variant) {
        if self
            .daemon
            .as_ref()
            .is_some_and(|d| d.variant == variant.name)
        {
            let alive = self
                .daemon
                .as_mut()
                .and_then(|d| d.proc.as_mut())
                .is_some_and(|p| p.try_wait().is_none());
            if alive || self.daemon.as_ref().is_some_and(|d| d.problem.is_some()) {
                return;
            }
        }
        self.stop_daemon();
        let id = self.next_id();
        let socket = self.tmp.join(format!("canald-{id}.sock"));
        let mut env = variant.env.clone();
        env.push(("CANAL_SOCKET".into(), socket.to_string_lossy().into_owned()));
        let mut argv = vec![
            self.canal_s(),
            "daemon".into(),
            "--socket".into(),
            socket.to_string_lossy().into_owned(),
        ];
        argv.extend(variant.args.iter().cloned());
        let mut d = Daemon {
            variant: variant.name.clone(),
            socket: socket.clone(),
            proc: None,
            pid: None,
            problem: None,
            config: None,
        };
        if let Some(why) = &variant.unavailable {
            d.problem = Some(Status::NotAvailable(why.clone()));
            self.daemon = Some(d);
            return;
        }
        match Proc::spawn("canal daemon", &argv, &env) {
            Err(e) => d.problem = Some(Status::Failed(format!("canal daemon did not start: {e}"))),
            Ok(mut p) => {
                p.wait_for_path(&socket, Duration::from_secs(3));
                if let Some(st) = p.try_wait() {
                    d.problem = Some(Status::Failed(format!(
                        "`canal daemon` exited ({}): {}",
                        status_text(st),
                        p.tail()
                    )));
                } else if !socket.exists() {
                    d.problem = Some(Status::Failed(format!(
                        "`canal daemon --socket {}` made no socket within 3 s",
                        socket.display()
                    )));
                } else {
                    d.pid = Some(p.pid());
                    match self.stat_json(&socket) {
                        Ok(j) => {
                            if let Some(pid) =
                                json::get(&j, "daemon.pid").and_then(json::Json::as_f64)
                            {
                                d.pid = Some(pid as u32);
                            }
                            d.config = json::get(&j, "daemon.config").cloned();
                        }
                        Err(e) if !variant.is_default() => {
                            d.problem = Some(Status::NotAvailable(format!(
                                "cannot confirm switch {}: {e}",
                                variant.name
                            )))
                        }
                        Err(_) => {}
                    }
                    if d.problem.is_none() {
                        d.problem = variant.check(d.config.as_ref()).map(Status::NotAvailable);
                    }
                }
                d.proc = Some(p);
            }
        }
        self.daemon = Some(d);
    }

    pub(crate) fn stop_daemon(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            if let Some(p) = d.proc.as_mut() {
                p.kill();
            }
            let _ = std::fs::remove_file(&d.socket);
        }
    }

    pub(crate) fn stat_json(&self, socket: &std::path::Path) -> Result<json::Json, String> {
        let argv = vec![
            self.canal_s(),
            "stat".into(),
            "--socket".into(),
            socket.to_string_lossy().into_owned(),
            "--json".into(),
        ];
        let p = crate::procs::run_to_end("`canal stat --json`", &argv, Duration::from_secs(3))?;
        json::parse(&p.stdout()).map_err(|e| format!("`canal stat --json` output: {e}"))
    }

    pub(crate) fn daemon_cpu(&self) -> Option<f64> {
        self.daemon
            .as_ref()
            .filter(|d| d.problem.is_none())
            .and_then(|d| d.pid)
            .and_then(pid_cpu_seconds)
    }

    /// Wraps argv in `canal run` when this end is a guest.
    pub(crate) fn wrap(&self, guest: bool, argv: Vec<String>) -> Vec<String> {
        if !guest {
            return argv;
        }
        let sock = self
            .daemon
            .as_ref()
            .map(|d| d.socket.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut v = vec![
            self.canal_s(),
            "run".into(),
            "--socket".into(),
            sock,
            "--".into(),
        ];
        v.extend(argv);
        v
    }

    pub(crate) fn guest_env(&self, cell: &Cell) -> Vec<(String, String)> {
        if !cell.system.uses_canal() {
            return vec![];
        }
        let mut env = Variant::parse(&cell.variant)
            .map(|v| v.env)
            .unwrap_or_default();
        if let Some(d) = &self.daemon {
            env.push((
                "CANAL_SOCKET".into(),
                d.socket.to_string_lossy().into_owned(),
            ));
        }
        env
    }

    pub(crate) fn timeout(&self, cell: &Cell, nominal: f64) -> Duration {
        let grace = if cell.system.uses_canal() {
            self.knobs.canal_grace
        } else {
            20.0
        };
        Duration::from_secs_f64(nominal + grace)
    }

    pub(crate) fn run(&mut self, cell: &Cell) -> Outcome {
        if !cell.system.uses_canal() {
            // Native baselines run without a canald around: one that polls would take a
            // core from them and flatter canal.
            self.stop_daemon();
        } else {
            match Variant::parse(&cell.variant) {
                Ok(v) => self.ensure_daemon(&v),
                Err(e) => return Outcome::fail(e, String::new()),
            }
            if let Some(p) = self.daemon.as_ref().and_then(|d| d.problem.clone()) {
                return Outcome::not_run(p);
            }
        }
        match cell.workload {
            Workload::Rr
            | Workload::Stream
            | Workload::Idle
            | Workload::ConnRate
            | Workload::Hold
            | Workload::UdpRr
            | Workload::UdpStream => self.run_gen(cell, None),
            Workload::SysRr | Workload::SysStream => self.run_syscalls(cell),
            Workload::Sockperf => self.run_sockperf(cell),
            Workload::Iperf3 => self.run_iperf3(cell),
            Workload::Redis => self.run_redis(cell),
            Workload::Nginx => self.run_nginx(cell),
            Workload::Memcached => self.run_memcached(cell),
            Workload::Postgres => self.run_postgres(cell),
        }
    }

    pub(crate) fn gen_args(
        &self,
        role: &str,
        cell: &Cell,
        addr: &str,
        cpu: Option<usize>,
    ) -> Vec<String> {
        let mode = match cell.workload {
            Workload::Rr | Workload::SysRr | Workload::UdpRr => "rr",
            Workload::Stream | Workload::SysStream | Workload::UdpStream => "stream",
            Workload::ConnRate => "conn",
            Workload::Hold => "hold",
            _ => "idle",
        };
        let mut v = vec![
            self.gen.to_string_lossy().into_owned(),
            role.into(),
            "--net".into(),
            if cell.system == System::Uds {
                "unix"
            } else if matches!(cell.workload, Workload::UdpRr | Workload::UdpStream) {
                "udp"
            } else {
                "tcp"
            }
            .into(),
            "--addr".into(),
            addr.into(),
            "--mode".into(),
            mode.into(),
        ];
        // B12's size column counts clients, B13's idle connections (64-byte RR).
        match cell.workload {
            Workload::ConnRate => v.extend([
                "--size".into(),
                "1".into(),
                "--clients".into(),
                cell.size.to_string(),
            ]),
            Workload::Hold => v.extend([
                "--size".into(),
                "64".into(),
                "--idle".into(),
                cell.size.to_string(),
            ]),
            _ => v.extend(["--size".into(), cell.size.to_string()]),
        }
        if let Some(c) = cpu {
            v.extend(["--cpu".into(), c.to_string()]);
        }
        v
    }

    pub(crate) fn addr(&mut self, cell: &Cell) -> Result<String, String> {
        if cell.system == System::Uds {
            let id = self.next_id();
            Ok(self
                .tmp
                .join(format!("gen-{id}.sock"))
                .to_string_lossy()
                .into_owned())
        } else {
            Ok(format!("127.0.0.1:{}", self.port()?))
        }
    }

    /// The generator with `pairs` server/client pairs at once. `strace_count`: run the
    /// single client under `strace -c -f` for exactly that many messages.
    pub(crate) fn run_gen(
        &mut self,
        cell: &Cell,
        strace: Option<(u64, &std::path::Path)>,
    ) -> Outcome {
        let env = self.guest_env(cell);
        let mut raw = Vec::new();
        let (mut servers, addrs) = match self.start_gen_servers(cell, &env, &mut raw) {
            Ok(x) => x,
            Err(e) => return Outcome::fail(e, raw.join(" ; ")),
        };
        let nominal = match (cell.workload, strace) {
            (_, Some(_)) => self.knobs.strace_secs,
            (Workload::Idle, _) => self.knobs.idle_secs,
            _ => self.knobs.duration,
        };
        let d0 = self.daemon_cpu();
        let mut clients = Vec::new();
        for (i, addr) in addrs.iter().enumerate() {
            let argv = self.gen_client_argv(cell, addr, strace, nominal);
            let cenv = if cell.system.client_is_guest() {
                env.clone()
            } else {
                vec![]
            };
            match Proc::spawn(&format!("client {i}"), &argv, &cenv) {
                Ok(p) => {
                    raw.push(p.cmdline.clone());
                    clients.push(p);
                }
                Err(e) => return Outcome::fail(e, raw.join(" ; ")),
            }
        }
        let raw = raw.join(" ; ");
        // B13: memory while the idle connections are held, against before.
        let mut per_conn = None;
        if cell.workload == Workload::Hold && !clients.is_empty() {
            let sample = |line: &str, clients: &mut Vec<Proc>| {
                clients[0].wait_line(line, Duration::from_secs(120))?;
                Ok::<u64, String>(self.memory(&servers, clients))
            };
            match sample("BASE", &mut clients)
                .and_then(|m0| Ok((m0, sample("HELD", &mut clients)?)))
            {
                Ok((m0, m1)) => {
                    per_conn = Some((m1 as f64 - m0 as f64) / (cell.size.max(1) as f64) / 1024.0)
                }
                Err(e) => return Outcome::fail(e, raw),
            }
        }
        let to = self.timeout(cell, nominal);
        let (results, server_cpu) = match collect_gen(&mut clients, &mut servers, to) {
            Ok(x) => x,
            Err(e) => return Outcome::fail(e, raw),
        };
        let daemon_cpu = match (d0, self.daemon_cpu()) {
            (Some(a), Some(b)) => Some(b - a),
            _ => None,
        };
        let metrics = if strace.is_some() {
            let msgs = results
                .iter()
                .map(|kv| getf(kv, "msgs").unwrap_or(f64::NAN))
                .sum();
            vec![("msgs".to_string(), msgs)]
        } else {
            let mut m = self.gen_metrics(cell, &results, server_cpu, daemon_cpu);
            if let Some(kib) = per_conn.filter(|_| cell.size > 0) {
                m.push(("mem_per_conn_kib".to_string(), kib));
            }
            m
        };
        Outcome {
            status: Status::Ok,
            metrics,
            raw_command: raw,
            detail: String::new(),
        }
    }

    /// Starts one generator server per pair and waits until each says READY; their
    /// processes and addresses.
    pub(crate) fn start_gen_servers(
        &mut self,
        cell: &Cell,
        env: &[(String, String)],
        raw: &mut Vec<String>,
    ) -> Result<(Vec<Proc>, Vec<String>), String> {
        let mut servers = Vec::new();
        let mut addrs = Vec::new();
        for i in 0..cell.pairs {
            let addr = self.addr(cell)?;
            let argv = self.wrap(
                cell.system.server_is_guest(),
                self.gen_args("server", cell, &addr, self.knobs.pin.then_some(0)),
            );
            let senv = if cell.system.server_is_guest() {
                env.to_vec()
            } else {
                vec![]
            };
            let p = Proc::spawn(&format!("server {i}"), &argv, &senv)?;
            raw.push(format!("{} &", p.cmdline));
            servers.push(p);
            addrs.push(addr);
        }
        let ready = Duration::from_secs_f64(if cell.system.server_is_guest() {
            self.knobs.canal_grace
        } else {
            10.0
        });
        for s in servers.iter_mut() {
            s.wait_line("READY", ready)?;
        }
        Ok((servers, addrs))
    }

    /// A generator client's command line: a timed run with warm-up, or (for B7) a
    /// fixed count under `strace -c`.
    pub(crate) fn gen_client_argv(
        &self,
        cell: &Cell,
        addr: &str,
        strace: Option<(u64, &std::path::Path)>,
        nominal: f64,
    ) -> Vec<String> {
        let mut g = self.gen_args("client", cell, addr, self.knobs.pin.then_some(1));
        match strace {
            Some((n, _)) => g.extend([
                "--count".into(),
                n.to_string(),
                "--warmup".into(),
                "0".into(),
            ]),
            None => {
                let warm = if matches!(
                    cell.workload,
                    Workload::Rr | Workload::Hold | Workload::UdpRr
                ) {
                    "100"
                } else {
                    "0"
                };
                g.extend([
                    "--duration".into(),
                    format!("{nominal}"),
                    "--warmup".into(),
                    warm.into(),
                ]);
            }
        }
        if let Some((_, out)) = strace {
            let mut s = vec![
                "strace".into(),
                "-f".into(),
                "-c".into(),
                "-o".into(),
                out.to_string_lossy().into_owned(),
                "--".into(),
            ];
            s.extend(g);
            g = s;
        }
        self.wrap(cell.system.client_is_guest(), g)
    }

    /// The metrics of one generator run from its clients' RESULT lines, the servers'
    /// CPU and canald's (None: not measured).
    pub(crate) fn gen_metrics(
        &self,
        cell: &Cell,
        results: &[GenResult],
        server_cpu: f64,
        daemon: Option<f64>,
    ) -> Vec<(String, f64)> {
        let daemon_cpu = daemon.unwrap_or(0.0);
        let d0 = daemon;
        let sum = |k: &str| {
            results
                .iter()
                .map(|kv| getf(kv, k).unwrap_or(f64::NAN))
                .sum::<f64>()
        };
        let max = |k: &str| {
            results
                .iter()
                .map(|kv| getf(kv, k).unwrap_or(f64::NAN))
                .fold(f64::NAN, f64::max)
        };
        let mean = |k: &str| sum(k) / results.len() as f64;
        let mut m: Vec<(String, f64)> = Vec::new();
        let mut put = |k: &str, v: f64| m.push((k.to_string(), v));
        let client_cpu = sum("cpu_s");
        let cpu_total = client_cpu + server_cpu + daemon_cpu;
        let bytes = sum("bytes");
        let elapsed = max("elapsed_s");
        match cell.workload {
            Workload::ConnRate => {
                put("conns_s", sum("conns_per_s"));
                put("conn_p50_us", mean("p50_ns") / 1e3);
                put("conn_p99_us", max("p99_ns") / 1e3);
            }
            Workload::Rr | Workload::Hold | Workload::UdpRr => {
                put("rtt_p50_us", mean("p50_ns") / 1e3);
                put("rtt_p99_us", max("p99_ns") / 1e3);
                put("rtt_mean_us", mean("mean_ns") / 1e3);
                put("rtt_max_us", max("max_ns") / 1e3);
                let rate: f64 = results
                    .iter()
                    .map(|kv| {
                        getf(kv, "msgs").unwrap_or(0.0) / getf(kv, "elapsed_s").unwrap_or(f64::NAN)
                    })
                    .sum();
                put("msgs_s", rate);
                // CPU of every process per round trip: what a variant that changes the
                // round-trip rate (a coalescing split) costs per unit of work.
                if rate > 0.0 {
                    put("cpu_per_rt_us", cpu_total / elapsed / rate * 1e6);
                }
            }
            Workload::Stream | Workload::UdpStream => {
                let bps: f64 = sum("bytes_per_s");
                put("gbit_s", bps * 8.0 / 1e9);
                put("bytes_s", bps);
                put("msgs_s", sum("msgs_per_s"));
                if cell.workload == Workload::UdpStream {
                    // Datagrams the receiver never got (natively too, under a fast sender).
                    let sent = sum("sent");
                    if sent > 0.0 {
                        put("lost_pct", (sent - sum("msgs")) / sent * 100.0);
                    }
                }
            }
            _ => {
                if d0.is_some() {
                    put("daemon_cpu_pct", daemon_cpu / elapsed * 100.0);
                }
                put(
                    "guests_cpu_pct",
                    (client_cpu + server_cpu) / elapsed * 100.0,
                );
            }
        }
        put("cpu_client_s", client_cpu);
        put("cpu_server_s", server_cpu);
        if d0.is_some() {
            put("cpu_daemon_s", daemon_cpu);
        }
        put("cpu_cores", cpu_total / elapsed);
        if bytes > 0.0 {
            let nspb = cpu_total * 1e9 / bytes;
            put("cpu_ns_per_byte", nspb);
            if let Some(mhz) = self.knobs.cpu_mhz {
                put("est_cycles_per_byte", nspb * mhz / 1e3);
            }
        }
        put("elapsed_s", elapsed);
        m
    }

    /// Memory of the servers, the clients and canald (their process groups' PSS) plus
    /// the kernel's socket memory, in bytes (B13).
    pub(crate) fn memory(&self, servers: &[Proc], clients: &[Proc]) -> u64 {
        let daemon = self
            .daemon
            .as_ref()
            .and_then(|d| d.proc.as_ref())
            .map_or(0, |p| crate::procs::group_pss_bytes(p.pgid()));
        servers
            .iter()
            .chain(clients)
            .map(|p| crate::procs::group_pss_bytes(p.pgid()))
            .sum::<u64>()
            + daemon
            + crate::procs::kernel_socket_bytes()
    }

    pub(crate) fn tool_missing(&self, tools: &[&str]) -> Option<Outcome> {
        tools.iter().find(|t| which(t).is_none()).map(|t| {
            Outcome::not_run(Status::NotAvailable(format!(
                "{t} is not installed (scripts/packages/bench.txt)"
            )))
        })
    }

    /// For a cell run by external tools over TCP: the tools are there and a port this
    /// run has not used yet, or the outcome that says why not.
    pub(crate) fn tools_and_port(&mut self, tools: &[&str]) -> Result<u16, Outcome> {
        if let Some(o) = self.tool_missing(tools) {
            return Err(o);
        }
        self.port().map_err(|e| Outcome::fail(e, String::new()))
    }

    /// Starts a tool server, runs a tool client against it, returns the client's stdout.
    pub(crate) fn server_client(
        &mut self,
        cell: &Cell,
        server: Vec<String>,
        ready: Ready,
        client: Vec<String>,
        nominal: f64,
    ) -> Result<(String, String), (String, String)> {
        let env = self.guest_env(cell);
        let sargv = self.wrap(cell.system.server_is_guest(), server);
        let senv = if cell.system.server_is_guest() {
            env.clone()
        } else {
            vec![]
        };
        let mut s = Proc::spawn("server", &sargv, &senv).map_err(|e| (e, String::new()))?;
        let mut raw = format!("{} &", s.cmdline);
        let rt = Duration::from_secs_f64(if cell.system.server_is_guest() {
            self.knobs.canal_grace
        } else {
            10.0
        });
        let r = match &ready {
            Ready::Line(l) => s.wait_line(l, rt).map(|_| ()),
            Ready::Port(p) => {
                if wait_connectable(Some(*p), None, rt) {
                    Ok(())
                } else {
                    Err(match s.try_wait() {
                        Some(st) => format!("server exited ({}): {}", status_text(st), s.tail()),
                        None => format!(
                            "server not accepting on port {p} within {:.0}s: {}",
                            rt.as_secs_f64(),
                            s.tail()
                        ),
                    })
                }
            }
            Ready::Path(p) => wait_connectable(None, Some(p), rt)
                .then_some(())
                .ok_or_else(|| {
                    format!(
                        "server not accepting on {} within {:.0}s: {}",
                        p.display(),
                        rt.as_secs_f64(),
                        s.tail()
                    )
                }),
        };
        if let Err(e) = r {
            return Err((e, raw));
        }
        let cargv = self.wrap(cell.system.client_is_guest(), client);
        let cenv = if cell.system.client_is_guest() {
            env
        } else {
            vec![]
        };
        let mut c = Proc::spawn("client", &cargv, &cenv).map_err(|e| (e, raw.clone()))?;
        raw.push_str(&format!(" ; {}", c.cmdline));
        let st = c
            .wait(self.timeout(cell, nominal))
            .map_err(|e| (e, raw.clone()))?;
        if !st.success() {
            return Err((format!("client {}: {}", status_text(st), c.tail()), raw));
        }
        s.kill();
        Ok((c.stdout(), raw))
    }

    pub(crate) fn tool_outcome(
        &self,
        r: Result<(String, String), (String, String)>,
        parse: impl Fn(&str) -> Result<Vec<(String, f64)>, String>,
    ) -> Outcome {
        match r {
            Err((e, raw)) => Outcome::fail(e, raw),
            Ok((out, raw)) => match parse(&out) {
                Ok(m) => Outcome {
                    status: Status::Ok,
                    metrics: m,
                    raw_command: raw,
                    detail: String::new(),
                },
                Err(e) => Outcome::fail(e, raw),
            },
        }
    }
}

/// One generator's RESULT line as key/value pairs.
pub(crate) type GenResult = Vec<(String, String)>;

/// Waits for every client and server of a generator run; the clients' RESULT lines and
/// the servers' total CPU seconds.
pub(crate) fn collect_gen(
    clients: &mut [Proc],
    servers: &mut [Proc],
    to: Duration,
) -> Result<(Vec<GenResult>, f64), String> {
    let mut results = Vec::new();
    for c in clients.iter_mut() {
        let st = c.wait(to)?;
        if !st.success() {
            return Err(format!("{} {}: {}", c.label, status_text(st), c.tail()));
        }
        match c.stdout().lines().find_map(crate::gen::parse_result) {
            Some(kv) => results.push(kv),
            None => return Err(format!("{} printed no RESULT: {}", c.label, c.tail())),
        }
    }
    let mut server_cpu = 0.0;
    for s in servers.iter_mut() {
        let st = s.wait(Duration::from_secs(5))?;
        if !st.success() {
            return Err(format!("{} {}: {}", s.label, status_text(st), s.tail()));
        }
        let kv = s
            .stdout()
            .lines()
            .find_map(crate::gen::parse_result)
            .unwrap_or_default();
        server_cpu += getf(&kv, "cpu_s").unwrap_or(f64::NAN);
    }
    Ok((results, server_cpu))
}

pub(crate) enum Ready {
    Line(String),
    Port(u16),
    Path(PathBuf),
}

pub(crate) fn sv(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

pub(crate) fn getf(kv: &[(String, String)], k: &str) -> Option<f64> {
    kv.iter()
        .find(|(a, _)| a == k)
        .and_then(|(_, v)| v.parse().ok())
}

pub(crate) fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}
