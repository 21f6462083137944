//! B14 (`canal bench b14`): an isolated canal guest (`canal run --isolate`) against
//! the namespace networking people use for containers today — pasta (Debian's `passt`)
//! and slirp4netns — in the same run, interleaved, with the same programs and the host
//! (both ends native) as the baseline.
//!
//! Topologies: *guest → host* (a native server on the host's 127.0.0.1; the client in a
//! namespace) and *guest ↔ guest* (the server in one namespace with its port published
//! on the host, the client in another, reaching it through the host). Tests: iperf3
//! throughput both directions (`-R`), 64-byte request/response p50
//! (`canal-bench-gen --mode rr`) and connection rate (`--mode conn`: connect, 1-byte
//! echo, close); and a static Go net/http server and client (`gohttp.go`, built here
//! with CGO_ENABLED=0: inside `--isolate` seccomp notification serves it), download
//! throughput and 1 KiB requests/s, held to the same programs on the host.
//!
//! How each system reaches the host's 127.0.0.1: canal as 10.0.2.2; slirp4netns as
//! 10.0.2.2; pasta in two ways, both measured: its loopback splice (127.0.0.1 inside,
//! forwarded by `-T auto`) and its tap path (the default gateway's address, which pasta
//! maps to the host's loopback — no packet leaves the machine). pasta refuses to set up
//! user mappings as root, so when run as root every namespaced program (canal's
//! included, with its own canald) runs as an unprivileged user (`--user`, default
//! nobody).

use crate::procs::{free_port, Proc};
use crate::stats::summarize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `canal bench b14`: isolated canal guests against pasta and slirp4netns.
#[derive(clap::Args, Debug, Clone)]
pub struct B14Args {
    /// 1 rep of 1 s per cell (checks it runs)
    #[arg(long)]
    pub quick: bool,
    /// Repetitions (interleaved: every cell once per round)
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub reps: u32,
    /// Seconds per run
    #[arg(long, value_name = "S", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub duration: u32,
    /// Write b14.md, b14.csv and b14.png into DIR
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// When run as root: the user the namespaced programs run as
    #[arg(long, value_name = "NAME", default_value = "nobody")]
    pub user: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sys {
    Native,
    Canal,
    PastaSplice,
    PastaTap,
    Slirp,
}

const SYSTEMS: [Sys; 5] = [
    Sys::Native,
    Sys::Canal,
    Sys::PastaSplice,
    Sys::PastaTap,
    Sys::Slirp,
];

impl Sys {
    fn id(self) -> &'static str {
        match self {
            Sys::Native => "native",
            Sys::Canal => "canal-isolate",
            Sys::PastaSplice => "pasta-splice",
            Sys::PastaTap => "pasta-tap",
            Sys::Slirp => "slirp4netns",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Sys::Native => "host (native)",
            Sys::Canal => "canal --isolate",
            Sys::PastaSplice => "pasta (loopback splice)",
            Sys::PastaTap => "pasta (tap, gateway)",
            Sys::Slirp => "slirp4netns",
        }
    }
    /// The host and canal are what this bench is about: a cell of theirs without a
    /// number fails the run. pasta's and slirp4netns's are comparisons; a crash of
    /// theirs (iperf3 under pasta has been seen to SIGSEGV) is tried once more, and
    /// if it fails again the cell says why instead of failing the run.
    fn compared_only(self) -> bool {
        !matches!(self, Sys::Native | Sys::Canal)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Topo {
    ToHost,
    GuestGuest,
}

impl Topo {
    fn id(self) -> &'static str {
        match self {
            Topo::ToHost => "guest-host",
            Topo::GuestGuest => "guest-guest",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Topo::ToHost => "guest → host server",
            Topo::GuestGuest => "guest ↔ guest (published port)",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Test {
    Iperf,
    IperfRev,
    Rr,
    Conn,
    /// A static Go net/http client downloading from a Go server (gohttp.go).
    GoBulk,
    /// The same programs, 1 KiB GETs over GO_CONNS keep-alive connections.
    GoReq,
}

const TESTS: [Test; 6] = [
    Test::Iperf,
    Test::IperfRev,
    Test::Rr,
    Test::Conn,
    Test::GoBulk,
    Test::GoReq,
];

/// Keep-alive connections of the Go request-rate test.
const GO_CONNS: u32 = 4;

impl Test {
    fn id(self) -> &'static str {
        match self {
            Test::Iperf => "iperf3",
            Test::IperfRev => "iperf3-reverse",
            Test::Rr => "rr-p50",
            Test::Conn => "conn-rate",
            Test::GoBulk => "go-http-bulk",
            Test::GoReq => "go-http-req",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Test::Iperf => "iperf3 client → server",
            Test::IperfRev => "iperf3 server → client (-R)",
            Test::Rr => "64 B request/response p50",
            Test::Conn => "connect + 1 B echo + close",
            Test::GoBulk => "Go net/http download (static binary)",
            Test::GoReq => "Go net/http 1 KiB GETs, 4 keep-alive connections",
        }
    }
    fn unit(self) -> &'static str {
        match self {
            Test::Iperf | Test::IperfRev | Test::GoBulk => "Gbit/s",
            Test::Rr => "µs",
            Test::Conn => "conn/s",
            Test::GoReq => "req/s",
        }
    }
    fn is_go(self) -> bool {
        matches!(self, Test::GoBulk | Test::GoReq)
    }
    fn higher_is_better(self) -> bool {
        self != Test::Rr
    }
}

/// The guest port servers use inside a namespace (published on a free host port).
const GUEST_PORT: u16 = 7000;

/// Runs slirp4netns around a program: a user+network namespace (`unshare -rn`), then
/// slirp4netns attached to it, then the program once slirp4netns is ready.
const SLIRP_SH: &str = r#"set -e
d=$(mktemp -d)
mkfifo "$d/go"
unshare -rn sh -c 'echo $$ > "$0/pid"; read x < "$0/go"; exec "$@"' "$d" "$@" &
while [ ! -s "$d/pid" ]; do sleep 0.01; done
slirp4netns --configure --mtu=65520 --ready-fd=3 "$(cat "$d/pid")" tap0 3>"$d/ready" >/dev/null 2>&1 &
sp=$!
while [ ! -s "$d/ready" ]; do sleep 0.01; done
echo go > "$d/go"
rc=0; wait %1 || rc=$?
kill $sp 2>/dev/null; rm -rf "$d"; exit $rc
"#;

struct Env {
    canal: PathBuf,
    gen: PathBuf,
    /// `setpriv …` when run as root, else empty.
    prefix: Vec<String>,
    dir: PathBuf,
    socket: PathBuf,
    /// The default gateway (pasta maps it to the host's loopback).
    gateway: Option<String>,
    duration: u32,
    /// Why a system cannot run here.
    missing: Vec<(Sys, String)>,
    /// The Go test program, or why there is none.
    gohttp: Result<PathBuf, String>,
    _canald: Proc,
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

/// The default route's gateway from /proc/net/route (little-endian hex).
fn default_gateway() -> Option<String> {
    let t = std::fs::read_to_string("/proc/net/route").ok()?;
    t.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&"00000000"))
            .then(|| u32::from_str_radix(f.get(2)?, 16).ok())
            .flatten()
            .filter(|&g| g != 0)
            .map(|g| std::net::Ipv4Addr::from(g.to_le_bytes()).to_string())
    })
}

fn sv(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

impl Env {
    fn new(a: &B14Args) -> Result<Env, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let gen = exe.with_file_name("canal-bench-gen");
        if !gen.is_file() {
            return Err(format!(
                "{} not found (cargo build --release)",
                gen.display()
            ));
        }
        let dir = std::env::temp_dir().join(format!("canal-b14-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // SAFETY: plain queries of this process's credentials.
        let root = unsafe { libc::geteuid() } == 0;
        let mut prefix = Vec::new();
        if root {
            let (uid, gid) = user_ids(&a.user)?;
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).map_err(|e| e.to_string())?;
            prefix = vec![
                "setpriv".into(),
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".into(),
                "env".into(),
                format!("HOME={}", dir.display()),
                format!("TMPDIR={}", dir.display()),
            ];
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| e.to_string())?;
        let socket = dir.join("canald.sock");
        let mut argv = prefix.clone();
        argv.extend([
            exe.display().to_string(),
            "daemon".into(),
            "--socket".into(),
        ]);
        argv.push(socket.display().to_string());
        let canald = Proc::spawn("canald", &argv, &[])?;
        let mut missing = Vec::new();
        for (s, tool) in [
            (Sys::PastaSplice, "pasta"),
            (Sys::PastaTap, "pasta"),
            (Sys::Slirp, "slirp4netns"),
        ] {
            if which(tool).is_none() {
                missing.push((s, format!("{tool} is not installed")));
            }
        }
        let gateway = default_gateway();
        if gateway.is_none() {
            missing.push((
                Sys::PastaTap,
                "no default route for pasta's gateway mapping".into(),
            ));
        }
        let gohttp = build_gohttp(&dir);
        let slirp = dir.join("slirp-run.sh");
        std::fs::write(&slirp, SLIRP_SH).map_err(|e| e.to_string())?;
        let env = Env {
            canal: exe,
            gen,
            prefix,
            dir,
            socket,
            gateway,
            duration: if a.quick { 1 } else { a.duration },
            missing,
            gohttp,
            _canald: canald,
        };
        env.wait_canald()?;
        Ok(env)
    }

    fn wait_canald(&self) -> Result<(), String> {
        for _ in 0..500 {
            let mut argv = self.prefix.clone();
            argv.extend([
                self.canal.display().to_string(),
                "stat".into(),
                "--socket".into(),
            ]);
            argv.push(self.socket.display().to_string());
            let ok = std::process::Command::new(&argv[0])
                .args(&argv[1..])
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("canald (as the bench user) did not answer".into())
    }

    /// `argv` as `sys` runs it, publishing host port `publish` on GUEST_PORT if given.
    fn wrap(&self, sys: Sys, publish: Option<u16>, argv: Vec<String>) -> Vec<String> {
        let mut v = self.prefix.clone();
        match sys {
            Sys::Native => {}
            Sys::Canal => {
                v.extend([
                    self.canal.display().to_string(),
                    "run".into(),
                    "--socket".into(),
                ]);
                v.push(self.socket.display().to_string());
                v.push("--isolate".into());
                if let Some(h) = publish {
                    v.extend(["--publish".into(), format!("{h}:{GUEST_PORT}")]);
                }
                v.push("--".into());
            }
            Sys::PastaSplice | Sys::PastaTap => {
                v.extend(sv(&["pasta", "--config-net"]));
                if let Some(h) = publish {
                    v.extend(["-t".into(), format!("127.0.0.1/{h}:{GUEST_PORT}")]);
                }
                v.push("--".into());
            }
            Sys::Slirp => {
                v.extend([
                    "sh".into(),
                    self.dir.join("slirp-run.sh").display().to_string(),
                ]);
            }
        }
        v.extend(argv);
        v
    }

    /// The address a client under `sys` uses for the host's 127.0.0.1.
    fn host_addr(&self, sys: Sys) -> String {
        match sys {
            Sys::Native | Sys::PastaSplice => "127.0.0.1".into(),
            Sys::Canal | Sys::Slirp => "10.0.2.2".into(),
            Sys::PastaTap => self.gateway.clone().unwrap_or_default(),
        }
    }

    fn unavailable(&self, sys: Sys, topo: Topo, test: Test) -> Option<String> {
        if let Some((_, why)) = self.missing.iter().find(|(s, _)| *s == sys) {
            return Some(why.clone());
        }
        if let (true, Err(why)) = (test.is_go(), &self.gohttp) {
            return Some(why.clone());
        }
        (sys == Sys::Slirp && topo == Topo::GuestGuest)
            .then(|| "a published port needs slirp4netns's API socket (not driven here)".into())
    }

    fn go(&self) -> Result<String, String> {
        self.gohttp
            .as_ref()
            .map(|p| p.display().to_string())
            .map_err(Clone::clone)
    }

    /// One measurement of `test` on (`sys`, `topo`).
    fn measure(&self, sys: Sys, topo: Topo, test: Test) -> Result<f64, String> {
        let h = free_port()?;
        let d = self.duration.to_string();
        let inner = topo == Topo::GuestGuest && sys != Sys::Native;
        let (bind, port) = if inner {
            ("0.0.0.0".to_string(), GUEST_PORT)
        } else {
            ("127.0.0.1".to_string(), h)
        };
        // The generator's arguments for this test (rr or conn mode).
        let gen = |role: &str, addr: &str| {
            let mut v = vec![self.gen.display().to_string(), role.into(), "--addr".into()];
            v.push(addr.into());
            v.extend(if test == Test::Rr {
                sv(&["--mode", "rr", "--size", "64"])
            } else {
                sv(&["--mode", "conn", "--clients", "1"])
            });
            v
        };
        let (server, ready) = match test {
            Test::Iperf | Test::IperfRev => (
                sv(&[
                    "iperf3",
                    "-s",
                    "-1",
                    "--forceflush",
                    "-B",
                    &bind,
                    "-p",
                    &port.to_string(),
                ]),
                "Server listening",
            ),
            Test::Rr | Test::Conn => (gen("server", &format!("{bind}:{port}")), "READY"),
            Test::GoBulk | Test::GoReq => (
                vec![self.go()?, "server".into(), format!("{bind}:{port}")],
                "READY",
            ),
        };
        let server = if inner {
            self.wrap(sys, Some(h), server)
        } else {
            server
        };
        let mut srv = Proc::spawn("server", &server, &[])?;
        srv.wait_line(ready, Duration::from_secs(20))?;
        let to = format!("{}:{h}", self.host_addr(sys));
        let client = match test {
            Test::Iperf | Test::IperfRev => {
                let host = self.host_addr(sys);
                let mut c = sv(&["iperf3", "-c", &host, "-p", &h.to_string(), "-t", &d, "-J"]);
                if test == Test::IperfRev {
                    c.push("-R".into());
                }
                c
            }
            Test::Rr | Test::Conn => {
                let mut c = gen("client", &to);
                c.extend(["--duration".into(), d.clone()]);
                c
            }
            Test::GoBulk => vec![self.go()?, "bulk".into(), format!("http://{to}/"), d],
            Test::GoReq => vec![
                self.go()?,
                "req".into(),
                format!("http://{to}/"),
                d,
                GO_CONNS.to_string(),
            ],
        };
        let mut cli = Proc::spawn("client", &self.wrap(sys, None, client), &[])?;
        let st = cli.wait(Duration::from_secs(self.duration as u64 + 30))?;
        let out = cli.stdout();
        let _ = srv.wait(Duration::from_secs(5));
        if !st.success() {
            return Err(format!("client failed ({st}): {}", cli.tail()));
        }
        parse(test, &out).ok_or_else(|| format!("no result in: {}", cli.tail()))
    }
}

/// The Go test program (gohttp.go), built static (CGO_ENABLED=0: LD_PRELOAD cannot
/// reach it, so inside --isolate it is served by seccomp notification) into `dir`.
const GOHTTP_SRC: &str = include_str!("gohttp.go");

fn build_gohttp(dir: &Path) -> Result<PathBuf, String> {
    let go = which("go").ok_or("go is not installed (Debian's golang-go)")?;
    let src = dir.join("gohttp.go");
    let out = dir.join("gohttp");
    std::fs::write(&src, GOHTTP_SRC).map_err(|e| e.to_string())?;
    // The invoking user's own build cache (a shared one under /tmp could be filled by
    // another user), else one that goes with this run.
    let cache = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache/canal-bench-go"))
        .filter(|c| std::fs::create_dir_all(c).is_ok())
        .unwrap_or_else(|| dir.join("gocache"));
    eprintln!(
        "canal bench b14: building the Go test program (static, {})",
        go.display()
    );
    let o = std::process::Command::new(go)
        .args(["build", "-o"])
        .arg(&out)
        .arg(&src)
        .env("CGO_ENABLED", "0")
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env("GOCACHE", &cache)
        .output()
        .map_err(|e| format!("go build: {e}"))?;
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        return Err(format!(
            "go build failed: {}",
            err.lines().next().unwrap_or("")
        ));
    }
    Ok(out)
}

fn user_ids(name: &str) -> Result<(u32, u32), String> {
    let c = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: a NUL-terminated name; the result is read before any other getpw* call.
    let pw = unsafe { libc::getpwnam(c.as_ptr()) };
    if pw.is_null() {
        return Err(format!("no user '{name}' (--user)"));
    }
    // SAFETY: getpwnam returned a valid entry.
    Ok(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

/// The number a run reports: Gbit/s, p50 µs, or connections/s.
fn parse(test: Test, out: &str) -> Option<f64> {
    match test {
        Test::Iperf | Test::IperfRev => {
            let j = crate::json::parse(out).ok()?;
            crate::json::get(&j, "end.sum_received.bits_per_second")?
                .as_f64()
                .map(|b| b / 1e9)
        }
        Test::Rr | Test::Conn | Test::GoBulk | Test::GoReq => {
            let line = out.lines().find(|l| l.starts_with("RESULT"))?;
            let kv = crate::gen::parse_result(line)?;
            let get = |k: &str| kv.iter().find(|(a, _)| a == k)?.1.parse::<f64>().ok();
            match test {
                Test::Rr => get("p50_ns").map(|n| n / 1000.0),
                Test::Conn => get("conns_per_s"),
                Test::GoBulk => get("gbit_s"),
                _ => get("req_s"),
            }
        }
    }
}

/// One cell's runs.
struct Row {
    sys: Sys,
    topo: Topo,
    test: Test,
    values: Vec<f64>,
    errors: Vec<String>,
    unavailable: Option<String>,
}

/// Runs B14; returns the exit status.
pub fn run_b14(a: &B14Args) -> i32 {
    let env = match Env::new(a) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("canal bench b14: {e}");
            return 1;
        }
    };
    let reps = if a.quick { 1 } else { a.reps as usize };
    let mut rows: Vec<Row> = Vec::new();
    for topo in [Topo::ToHost, Topo::GuestGuest] {
        for test in TESTS {
            for sys in SYSTEMS {
                let unavailable = env.unavailable(sys, topo, test);
                rows.push(Row {
                    sys,
                    topo,
                    test,
                    values: vec![],
                    errors: vec![],
                    unavailable,
                });
            }
        }
    }
    let total = rows.iter().filter(|r| r.unavailable.is_none()).count() * reps;
    let mut done = 0;
    for rep in 0..reps {
        for r in rows.iter_mut().filter(|r| r.unavailable.is_none()) {
            done += 1;
            let mut m = env.measure(r.sys, r.topo, r.test);
            if let (Err(e), true) = (&m, r.sys.compared_only()) {
                eprintln!(
                    "[{done}/{total}] {} {} {} failed once, trying again: {}",
                    r.topo.id(),
                    r.test.id(),
                    r.sys.id(),
                    e.lines().next().unwrap_or("")
                );
                m = env.measure(r.sys, r.topo, r.test);
            }
            let shown = match &m {
                Ok(v) => format!("{v:.2} {}", r.test.unit()),
                Err(e) => format!("failed: {}", e.lines().next().unwrap_or("")),
            };
            eprintln!(
                "[{done}/{total}] rep {} {} {} {}: {shown}",
                rep + 1,
                r.topo.id(),
                r.test.id(),
                r.sys.id()
            );
            match m {
                Ok(v) => r.values.push(v),
                Err(e) => r.errors.push(e),
            }
        }
    }
    let md = report(&rows, reps, env.duration);
    print!("{md}");
    let failed = rows
        .iter()
        .any(|r| !r.sys.compared_only() && r.unavailable.is_none() && r.values.is_empty());
    if let Some(dir) = &a.out {
        if let Err(e) = write_out(dir, &md, &rows) {
            eprintln!("canal bench b14: {e}");
            return 1;
        }
    }
    let _ = std::fs::remove_dir_all(&env.dir);
    i32::from(failed)
}

fn write_out(dir: &Path, md: &str, rows: &[Row]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::fs::write(dir.join("b14.md"), md).map_err(|e| e.to_string())?;
    let mut csv = String::from("topology,test,system,unit,n,median,min,max,values,note\n");
    for r in rows {
        let s = summarize(&r.values);
        let f = |x: Option<f64>| x.map_or(String::new(), |v| format!("{v:.4}"));
        let vals: Vec<String> = r.values.iter().map(|v| format!("{v:.4}")).collect();
        let note = r
            .unavailable
            .clone()
            .or_else(|| r.errors.first().cloned())
            .unwrap_or_default();
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},\"{}\"",
            r.topo.id(),
            r.test.id(),
            r.sys.id(),
            r.test.unit(),
            r.values.len(),
            f(s.map(|s| s.median)),
            f(s.map(|s| s.min)),
            f(s.map(|s| s.max)),
            vals.join(" "),
            note.replace('"', "'").lines().next().unwrap_or("")
        );
    }
    std::fs::write(dir.join("b14.csv"), csv).map_err(|e| e.to_string())?;
    crate::isolation_report::plot(dir)
}

fn report(rows: &[Row], reps: usize, duration: u32) -> String {
    crate::isolation_report::markdown(
        &rows
            .iter()
            .map(|r| crate::isolation_report::Cell {
                topo: r.topo.label(),
                topo_id: r.topo.id(),
                test: r.test.label(),
                test_id: r.test.id(),
                unit: r.test.unit(),
                higher_is_better: r.test.higher_is_better(),
                sys: r.sys.label(),
                sys_id: r.sys.id(),
                summary: summarize(&r.values),
                why: r.unavailable.clone().or_else(|| {
                    r.values
                        .is_empty()
                        .then(|| r.errors.first().cloned().unwrap_or_default())
                }),
            })
            .collect::<Vec<_>>(),
        reps,
        duration,
    )
}
