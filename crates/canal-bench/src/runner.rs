//! Runs one cell once: starts the servers and clients of that system (natively or under
//! `canal run`), waits with deadlines, and turns their output into metrics.

use crate::json;
use crate::model::{Cell, System, Variant, Workload};
use crate::procs::{free_port, pid_cpu_seconds, status_text, wait_connectable, Proc};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    Ok,
    /// It ran and failed (includes canal not working yet).
    Failed(String),
    /// The mechanism or switch does not exist in this build.
    NotAvailable(String),
    /// Not attempted, e.g. after repeated failures of the same system.
    Skipped(String),
}

impl Status {
    pub fn word(&self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed(_) => "failed",
            Status::NotAvailable(_) => "not available",
            Status::Skipped(_) => "skipped",
        }
    }
    pub fn reason(&self) -> &str {
        match self {
            Status::Ok => "",
            Status::Failed(r) | Status::NotAvailable(r) | Status::Skipped(r) => r,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Outcome {
    pub status: Status,
    pub metrics: Vec<(String, f64)>,
    /// The processes as they were started (shell syntax), `;`-separated.
    pub raw_command: String,
    pub detail: String,
}

impl Outcome {
    fn fail(reason: String, raw: String) -> Outcome {
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
pub struct Knobs {
    pub duration: f64,
    pub idle_secs: f64,
    pub tool_secs: f64,
    pub redis_requests: u64,
    pub strace_counts: (u64, u64),
    /// Nominal seconds for one run under strace (it slows every call down).
    pub strace_secs: f64,
    /// Extra seconds a canal run may take beyond its nominal duration.
    pub canal_grace: f64,
    pub pin: bool,
    pub cpu_mhz: Option<f64>,
}

pub struct Daemon {
    pub variant: String,
    pub socket: PathBuf,
    pub proc: Option<Proc>,
    pub pid: Option<u32>,
    /// Why canal cells of this variant cannot run, if they cannot.
    pub problem: Option<Status>,
    pub config: Option<json::Json>,
}

pub struct Runner {
    pub canal: PathBuf,
    pub gen: PathBuf,
    pub tmp: PathBuf,
    pub knobs: Knobs,
    pub daemon: Option<Daemon>,
    seq: u64,
    /// Every port handed to a server in this run: never handed out twice (the kernel
    /// may offer a port again that a server started a moment ago has not bound yet;
    /// 8 pairs' servers then collided with EADDRINUSE).
    ports: std::collections::HashSet<u16>,
}

pub fn metric_unit(m: &str) -> &'static str {
    match m {
        x if x.ends_with("_us") => "µs",
        "gbit_s" => "Gbit/s",
        "bytes_s" => "B/s",
        "msgs_s" => "msg/s",
        x if x.ends_with("_rps") || x == "req_s" => "req/s",
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
    pub fn new(canal: PathBuf, gen: PathBuf, tmp: PathBuf, knobs: Knobs) -> Runner {
        Runner {
            canal,
            gen,
            tmp,
            knobs,
            daemon: None,
            seq: 0,
            ports: std::collections::HashSet::new(),
        }
    }

    /// A free loopback port not handed out before in this run.
    fn port(&mut self) -> Result<u16, String> {
        for _ in 0..1000 {
            let p = free_port()?;
            if self.ports.insert(p) {
                return Ok(p);
            }
        }
        Err("no free port that this run has not used".into())
    }

    fn next_id(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn canal_s(&self) -> String {
        self.canal.to_string_lossy().into_owned()
    }

    /// Makes sure a canald for `variant` runs (restarting it for another variant).
    pub fn ensure_daemon(&mut self, variant: &Variant) {
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
                let deadline = std::time::Instant::now() + Duration::from_secs(3);
                while !socket.exists()
                    && p.try_wait().is_none()
                    && std::time::Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
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

    pub fn stop_daemon(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            if let Some(p) = d.proc.as_mut() {
                p.kill();
            }
            let _ = std::fs::remove_file(&d.socket);
        }
    }

    fn stat_json(&self, socket: &std::path::Path) -> Result<json::Json, String> {
        let argv = vec![
            self.canal_s(),
            "stat".into(),
            "--socket".into(),
            socket.to_string_lossy().into_owned(),
            "--json".into(),
        ];
        let mut p = Proc::spawn("canal stat", &argv, &[])?;
        let st = p.wait(Duration::from_secs(3))?;
        if !st.success() {
            return Err(format!(
                "`canal stat --json` {}: {}",
                status_text(st),
                p.tail()
            ));
        }
        json::parse(&p.stdout()).map_err(|e| format!("`canal stat --json` output: {e}"))
    }

    fn daemon_cpu(&self) -> Option<f64> {
        self.daemon
            .as_ref()
            .filter(|d| d.problem.is_none())
            .and_then(|d| d.pid)
            .and_then(pid_cpu_seconds)
    }

    /// Wraps argv in `canal run` when this end is a guest.
    fn wrap(&self, guest: bool, argv: Vec<String>) -> Vec<String> {
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

    fn guest_env(&self, cell: &Cell) -> Vec<(String, String)> {
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

    fn timeout(&self, cell: &Cell, nominal: f64) -> Duration {
        let grace = if cell.system.uses_canal() {
            self.knobs.canal_grace
        } else {
            20.0
        };
        Duration::from_secs_f64(nominal + grace)
    }

    pub fn run(&mut self, cell: &Cell) -> Outcome {
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
                return Outcome {
                    status: p,
                    metrics: vec![],
                    raw_command: String::new(),
                    detail: String::new(),
                };
            }
        }
        match cell.workload {
            Workload::Rr | Workload::Stream | Workload::Idle => self.run_gen(cell, None),
            Workload::SysRr | Workload::SysStream => self.run_syscalls(cell),
            Workload::Sockperf => self.run_sockperf(cell),
            Workload::Iperf3 => self.run_iperf3(cell),
            Workload::Redis => self.run_redis(cell),
            Workload::Nginx => self.run_nginx(cell),
        }
    }

    fn gen_args(&self, role: &str, cell: &Cell, addr: &str, cpu: Option<usize>) -> Vec<String> {
        let mode = match cell.workload {
            Workload::Rr | Workload::SysRr => "rr",
            Workload::Stream | Workload::SysStream => "stream",
            _ => "idle",
        };
        let mut v = vec![
            self.gen.to_string_lossy().into_owned(),
            role.into(),
            "--net".into(),
            if cell.system == System::Uds {
                "unix"
            } else {
                "tcp"
            }
            .into(),
            "--addr".into(),
            addr.into(),
            "--mode".into(),
            mode.into(),
            "--size".into(),
            cell.size.to_string(),
        ];
        if let Some(c) = cpu {
            v.extend(["--cpu".into(), c.to_string()]);
        }
        v
    }

    fn addr(&mut self, cell: &Cell) -> Result<String, String> {
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
    fn run_gen(&mut self, cell: &Cell, strace: Option<(u64, &std::path::Path)>) -> Outcome {
        let env = self.guest_env(cell);
        let pinned = self.knobs.pin;
        let pin = |role: usize| if pinned { Some(role) } else { None };
        let mut servers = Vec::new();
        let mut raw = Vec::new();
        let mut addrs = Vec::new();
        for i in 0..cell.pairs {
            let addr = match self.addr(cell) {
                Ok(a) => a,
                Err(e) => return Outcome::fail(e, raw.join(" ; ")),
            };
            let argv = self.wrap(
                cell.system.server_is_guest(),
                self.gen_args("server", cell, &addr, pin(0)),
            );
            let senv = if cell.system.server_is_guest() {
                env.clone()
            } else {
                vec![]
            };
            match Proc::spawn(&format!("server {i}"), &argv, &senv) {
                Ok(p) => {
                    raw.push(format!("{} &", p.cmdline));
                    servers.push(p);
                }
                Err(e) => return Outcome::fail(e, raw.join(" ; ")),
            }
            addrs.push(addr);
        }
        let ready = Duration::from_secs_f64(if cell.system.server_is_guest() {
            self.knobs.canal_grace
        } else {
            10.0
        });
        for s in servers.iter_mut() {
            if let Err(e) = s.wait_line("READY", ready) {
                return Outcome::fail(e, raw.join(" ; "));
            }
        }
        let nominal = match (cell.workload, strace) {
            (_, Some(_)) => self.knobs.strace_secs,
            (Workload::Idle, _) => self.knobs.idle_secs,
            _ => self.knobs.duration,
        };
        let d0 = self.daemon_cpu();
        let mut clients = Vec::new();
        for (i, addr) in addrs.iter().enumerate() {
            let mut g = self.gen_args("client", cell, addr, pin(1));
            match strace {
                Some((n, _)) => g.extend([
                    "--count".into(),
                    n.to_string(),
                    "--warmup".into(),
                    "0".into(),
                ]),
                None => {
                    let warm = if cell.workload == Workload::Rr {
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
            let argv = self.wrap(cell.system.client_is_guest(), g);
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
        let to = self.timeout(cell, nominal);
        let mut results = Vec::new();
        for c in clients.iter_mut() {
            match c.wait(to) {
                Ok(st) if st.success() => {}
                Ok(st) => {
                    return Outcome::fail(
                        format!("{} {}: {}", c.label, status_text(st), c.tail()),
                        raw,
                    )
                }
                Err(e) => return Outcome::fail(e, raw),
            }
            match c.stdout().lines().find_map(crate::gen::parse_result) {
                Some(kv) => results.push(kv),
                None => {
                    return Outcome::fail(
                        format!("{} printed no RESULT: {}", c.label, c.tail()),
                        raw,
                    )
                }
            }
        }
        let mut server_cpu = 0.0;
        for s in servers.iter_mut() {
            match s.wait(Duration::from_secs(5)) {
                Ok(st) if st.success() => {}
                Ok(st) => {
                    return Outcome::fail(
                        format!("{} {}: {}", s.label, status_text(st), s.tail()),
                        raw,
                    )
                }
                Err(e) => return Outcome::fail(e, raw),
            }
            let kv = s
                .stdout()
                .lines()
                .find_map(crate::gen::parse_result)
                .unwrap_or_default();
            server_cpu += getf(&kv, "cpu_s").unwrap_or(f64::NAN);
        }
        let d1 = self.daemon_cpu();
        let daemon_cpu = match (d0, d1) {
            (Some(a), Some(b)) => b - a,
            _ => 0.0,
        };
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
        if strace.is_some() {
            put("msgs", sum("msgs"));
            return Outcome {
                status: Status::Ok,
                metrics: m,
                raw_command: raw,
                detail: String::new(),
            };
        }
        match cell.workload {
            Workload::Rr => {
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
            Workload::Stream => {
                let bps: f64 = sum("bytes_per_s");
                put("gbit_s", bps * 8.0 / 1e9);
                put("bytes_s", bps);
                put("msgs_s", sum("msgs_per_s"));
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
        Outcome {
            status: Status::Ok,
            metrics: m,
            raw_command: raw,
            detail: String::new(),
        }
    }

    /// System calls per message = (calls at N2 − calls at N1) / (N2 − N1): setup and
    /// teardown cancel out, only the steady state remains.
    fn run_syscalls(&mut self, cell: &Cell) -> Outcome {
        if which("strace").is_none() {
            return Outcome {
                status: Status::NotAvailable("strace is not installed".into()),
                metrics: vec![],
                raw_command: String::new(),
                detail: String::new(),
            };
        }
        let (n1, n2) = self.knobs.strace_counts;
        let mut tables = Vec::new();
        let mut raws = Vec::new();
        for n in [n1, n2] {
            let id = self.next_id();
            let out = self.tmp.join(format!("strace-{id}.txt"));
            let o = self.run_gen(cell, Some((n, &out)));
            raws.push(o.raw_command.clone());
            if o.status != Status::Ok {
                return o;
            }
            match std::fs::read_to_string(&out)
                .map_err(|e| e.to_string())
                .and_then(|t| parse_strace_c(&t))
            {
                Ok(t) => tables.push(t),
                Err(e) => return Outcome::fail(format!("strace -c output: {e}"), raws.join(" ; ")),
            }
        }
        let total = |t: &Vec<(String, f64)>| t.iter().map(|(_, c)| c).sum::<f64>();
        let per = (total(&tables[1]) - total(&tables[0])) / (n2 - n1) as f64;
        let mut diffs: Vec<(String, f64)> = tables[1]
            .iter()
            .map(|(name, c)| {
                let before = tables[0]
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|x| x.1)
                    .unwrap_or(0.0);
                (name.clone(), (c - before) / (n2 - n1) as f64)
            })
            .filter(|(_, d)| d.abs() >= 0.01)
            .collect();
        diffs.sort_by(|a, b| b.1.total_cmp(&a.1));
        let detail = diffs
            .iter()
            .take(4)
            .map(|(n, d)| format!("{n} {d:.2}"))
            .collect::<Vec<_>>()
            .join(", ");
        Outcome {
            status: Status::Ok,
            metrics: vec![("syscalls_per_msg".into(), per)],
            raw_command: raws.join(" ; "),
            detail,
        }
    }

    fn tool_missing(&self, tools: &[&str]) -> Option<Outcome> {
        tools.iter().find(|t| which(t).is_none()).map(|t| Outcome {
            status: Status::NotAvailable(format!(
                "{t} is not installed (scripts/packages/bench.txt)"
            )),
            metrics: vec![],
            raw_command: String::new(),
            detail: String::new(),
        })
    }

    /// Starts a tool server, runs a tool client against it, returns the client's stdout.
    fn server_client(
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

    fn tool_outcome(
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

    fn run_sockperf(&mut self, cell: &Cell) -> Outcome {
        if let Some(o) = self.tool_missing(&["sockperf"]) {
            return o;
        }
        let port = match self.port() {
            Ok(p) => p,
            Err(e) => return Outcome::fail(e, String::new()),
        };
        let p = port.to_string();
        let secs = self.knobs.tool_secs;
        let server = sv(&["sockperf", "sr", "--tcp", "-i", "127.0.0.1", "-p", &p]);
        let client = sv(&[
            "sockperf",
            "pp",
            "--tcp",
            "-i",
            "127.0.0.1",
            "-p",
            &p,
            "-t",
            &format!("{}", secs.ceil() as u64),
            "-m",
            &cell.size.max(14).to_string(),
        ]);
        let r = self.server_client(cell, server, Ready::Port(port), client, secs + 1.0);
        self.tool_outcome(r, parse_sockperf)
    }

    fn run_iperf3(&mut self, cell: &Cell) -> Outcome {
        if let Some(o) = self.tool_missing(&["iperf3"]) {
            return o;
        }
        let port = match self.port() {
            Ok(p) => p,
            Err(e) => return Outcome::fail(e, String::new()),
        };
        let p = port.to_string();
        let secs = self.knobs.tool_secs;
        // --forceflush: iperf3 block-buffers its stdout into a pipe otherwise.
        let server = sv(&[
            "iperf3",
            "-s",
            "-1",
            "--forceflush",
            "-B",
            "127.0.0.1",
            "-p",
            &p,
        ]);
        let client = sv(&[
            "iperf3",
            "-c",
            "127.0.0.1",
            "-p",
            &p,
            "-t",
            &format!("{}", secs.ceil() as u64),
            "-l",
            &cell.size.to_string(),
            "-J",
        ]);
        let r = self.server_client(
            cell,
            server,
            Ready::Line("Server listening".into()),
            client,
            secs + 1.0,
        );
        self.tool_outcome(r, |out| {
            let j = json::parse(out)?;
            if let Some(e) = json::get(&j, "error") {
                return Err(format!("iperf3: {}", json::as_text(e)));
            }
            let bps = json::get(&j, "end.sum_received.bits_per_second")
                .and_then(json::Json::as_f64)
                .ok_or("iperf3 -J has no end.sum_received.bits_per_second")?;
            Ok(vec![
                ("gbit_s".into(), bps / 1e9),
                ("bytes_s".into(), bps / 8.0),
            ])
        })
    }

    fn run_redis(&mut self, cell: &Cell) -> Outcome {
        if let Some(o) = self.tool_missing(&["redis-server", "redis-benchmark"]) {
            return o;
        }
        let n = self.knobs.redis_requests.to_string();
        let id = self.next_id();
        let (server, ready, target) = if cell.system == System::Uds {
            let path = self.tmp.join(format!("redis-{id}.sock"));
            let ps = path.to_string_lossy().into_owned();
            (
                sv(&[
                    "redis-server",
                    "--port",
                    "0",
                    "--unixsocket",
                    &ps,
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ]),
                Ready::Path(path),
                sv(&["-s", &ps]),
            )
        } else {
            let port = match self.port() {
                Ok(p) => p,
                Err(e) => return Outcome::fail(e, String::new()),
            };
            let p = port.to_string();
            (
                sv(&[
                    "redis-server",
                    "--port",
                    &p,
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ]),
                Ready::Port(port),
                sv(&["-h", "127.0.0.1", "-p", &p]),
            )
        };
        let mut client = sv(&["redis-benchmark"]);
        client.extend(target);
        client.extend(sv(&["-t", "set,get", "-n", &n, "-c", "10", "--csv"]));
        // Assumes at least 20 000 requests/s; a slower run still finishes within the grace.
        let nominal = self.knobs.redis_requests as f64 / 20_000.0;
        let r = self.server_client(cell, server, ready, client, nominal);
        self.tool_outcome(r, parse_redis_csv)
    }

    fn run_nginx(&mut self, cell: &Cell) -> Outcome {
        if let Some(o) = self.tool_missing(&["nginx", "wrk"]) {
            return o;
        }
        let port = match self.port() {
            Ok(p) => p,
            Err(e) => return Outcome::fail(e, String::new()),
        };
        let id = self.next_id();
        let dir = self.tmp.join(format!("nginx-{id}"));
        let conf = dir.join("nginx.conf");
        let d = dir.to_string_lossy();
        let text = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log stderr notice;\npid {d}/nginx.pid;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/cb; proxy_temp_path {d}/px; fastcgi_temp_path {d}/fc;\n  \
             uwsgi_temp_path {d}/uw; scgi_temp_path {d}/sc;\n  \
             server {{ listen 127.0.0.1:{port}; location / {{ return 200 \"hello from canal bench\\n\"; }} }}\n}}\n"
        );
        if let Err(e) =
            std::fs::create_dir_all(dir.join("logs")).and_then(|_| std::fs::write(&conf, text))
        {
            return Outcome::fail(format!("nginx config: {e}"), String::new());
        }
        let secs = self.knobs.tool_secs;
        let server = sv(&["nginx", "-p", &d, "-c", &conf.to_string_lossy()]);
        let client = sv(&[
            "wrk",
            "-t1",
            "-c10",
            &format!("-d{}s", secs.ceil() as u64),
            "--latency",
            &format!("http://127.0.0.1:{port}/"),
        ]);
        let r = self.server_client(cell, server, Ready::Port(port), client, secs + 2.0);
        self.tool_outcome(r, parse_wrk)
    }
}

enum Ready {
    Line(String),
    Port(u16),
    Path(PathBuf),
}

fn sv(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn getf(kv: &[(String, String)], k: &str) -> Option<f64> {
    kv.iter()
        .find(|(a, _)| a == k)
        .and_then(|(_, v)| v.parse().ok())
}

pub fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// `strace -c` table → (syscall, calls).
pub fn parse_strace_c(t: &str) -> Result<Vec<(String, f64)>, String> {
    let mut rows = Vec::new();
    for line in t.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 5 || f[0].parse::<f64>().is_err() {
            continue;
        }
        let name = f[f.len() - 1];
        if name == "total" {
            continue;
        }
        if let Ok(calls) = f[3].parse::<f64>() {
            rows.push((name.to_string(), calls));
        }
    }
    if rows.is_empty() {
        return Err("no syscall rows".into());
    }
    Ok(rows)
}

/// sockperf reports half the round trip; we report the round trip (×2) like the generator.
pub fn parse_sockperf(out: &str) -> Result<Vec<(String, f64)>, String> {
    let mut p50 = None;
    let mut p99 = None;
    let mut avg: Option<f64> = None;
    for line in out.lines() {
        let clean: String = line.chars().filter(|c| !c.is_control()).collect();
        let val = || {
            clean
                .rsplit('=')
                .next()
                .and_then(|v| v.trim().trim_end_matches("[0m").trim().parse::<f64>().ok())
        };
        if clean.contains("percentile 50.000") {
            p50 = val();
        } else if clean.contains("percentile 99.000") {
            p99 = val();
        } else if let Some(i) = clean.find("avg-latency=") {
            avg = clean[i + 12..]
                .split(|c: char| !(c.is_ascii_digit() || c == '.'))
                .next()
                .and_then(|v| v.parse().ok());
        }
    }
    match (p50, p99) {
        (Some(a), Some(b)) => {
            let mut m = vec![
                ("rtt_p50_us".into(), 2.0 * a),
                ("rtt_p99_us".into(), 2.0 * b),
            ];
            if let Some(v) = avg {
                m.push(("rtt_mean_us".into(), 2.0 * v));
            }
            Ok(m)
        }
        _ => Err(format!(
            "sockperf printed no percentiles: {}",
            out.lines().last().unwrap_or("")
        )),
    }
}

pub fn parse_redis_csv(out: &str) -> Result<Vec<(String, f64)>, String> {
    let mut m = Vec::new();
    for line in out.lines() {
        let f: Vec<String> = line
            .split(',')
            .map(|s| s.trim().trim_matches('"').to_string())
            .collect();
        if f.len() >= 7 && (f[0] == "SET" || f[0] == "GET") {
            let op = f[0].to_lowercase();
            let num = |i: usize| {
                f[i].parse::<f64>()
                    .map_err(|_| format!("redis-benchmark csv: bad number '{}'", f[i]))
            };
            m.push((format!("{op}_rps"), num(1)?));
            m.push((format!("{op}_p50_us"), num(4)? * 1e3));
            m.push((format!("{op}_p99_us"), num(6)? * 1e3));
        }
    }
    if m.len() < 6 {
        return Err(format!(
            "redis-benchmark printed no SET/GET rows: {}",
            out.lines().last().unwrap_or("")
        ));
    }
    Ok(m)
}

fn wrk_time_us(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, mul) = if let Some(v) = s.strip_suffix("us") {
        (v, 1.0)
    } else if let Some(v) = s.strip_suffix("ms") {
        (v, 1e3)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1e6)
    } else {
        return None;
    };
    num.parse::<f64>().ok().map(|v| v * mul)
}

pub fn parse_wrk(out: &str) -> Result<Vec<(String, f64)>, String> {
    let mut m = Vec::new();
    for line in out.lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("Requests/sec:") {
            m.push((
                "req_s".to_string(),
                v.trim().parse().map_err(|_| format!("wrk: bad '{t}'"))?,
            ));
        } else if let Some(v) = t.strip_prefix("50%") {
            m.extend(wrk_time_us(v).map(|x| ("p50_us".to_string(), x)));
        } else if let Some(v) = t.strip_prefix("99%") {
            m.extend(wrk_time_us(v).map(|x| ("p99_us".to_string(), x)));
        }
    }
    if let Some(e) = out.lines().find(|l| l.contains("Socket errors")) {
        return Err(format!("wrk: {}", e.trim()));
    }
    if !m.iter().any(|(k, _)| k == "req_s") {
        return Err(format!(
            "wrk printed no Requests/sec: {}",
            out.lines().last().unwrap_or("")
        ));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tool_outputs() {
        let s = "sockperf: \u{1b}[2;35m====> avg-latency=10.751 (std-dev=10.399)\u{1b}[0m\n\
                 sockperf: ---> percentile 99.000 =   16.155\nsockperf: ---> percentile 50.000 =   10.228\n";
        let m = parse_sockperf(s).unwrap();
        assert_eq!(m[0], ("rtt_p50_us".to_string(), 20.456));
        assert!((m[2].1 - 21.502).abs() < 1e-9);
        let r = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                 \"SET\",\"60240.96\",\"0.101\",\"0.032\",\"0.079\",\"0.199\",\"0.223\",\"0.495\"\n\
                 \"GET\",\"79365.08\",\"0.072\",\"0.016\",\"0.071\",\"0.087\",\"0.119\",\"0.319\"\n";
        let m = parse_redis_csv(r).unwrap();
        assert_eq!(m[0], ("set_rps".to_string(), 60240.96));
        assert!((m[5].1 - 119.0).abs() < 1e-6);
        let w = "  Latency Distribution\n     50%   47.00us\n     99%    1.27ms\nRequests/sec: 113639.19\n";
        let m = parse_wrk(w).unwrap();
        assert_eq!(
            m,
            vec![
                ("p50_us".into(), 47.0),
                ("p99_us".into(), 1270.0),
                ("req_s".into(), 113639.19)
            ]
        );
        assert!(parse_wrk("Socket errors: connect 10\nRequests/sec: 1\n").is_err());
        let st = "% time     seconds  usecs/call     calls    errors syscall\n------ ----------- ----------- --------- --------- ----------------\n \
                  60.00    0.000300          10        30           sendto\n 40.00    0.000200          10        20         2 recvfrom\n\
                  ------ ----------- ----------- --------- --------- ----------------\n100.00    0.000500          10        50         2 total\n";
        assert_eq!(
            parse_strace_c(st).unwrap(),
            vec![("sendto".into(), 30.0), ("recvfrom".into(), 20.0)]
        );
    }
}
