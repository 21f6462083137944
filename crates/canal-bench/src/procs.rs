//! Child processes for one measurement: spawned in their own process group (so a
//! `canal run` wrapper and whatever it starts are ended together), output captured line
//! by line, every wait bounded by a deadline.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) struct Proc {
    pub(crate) label: String,
    pub(crate) cmdline: String,
    child: Child,
    pgid: i32,
    lines: Receiver<String>,
    out: Arc<Mutex<String>>,
    err: Arc<Mutex<String>>,
    /// How many of the two pipe readers have seen end of file.
    readers_done: Arc<AtomicUsize>,
    exited: Option<ExitStatus>,
}

/// Quotes one argument for a POSIX shell only when it needs it.
pub(crate) fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=,+@%".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

pub(crate) fn cmdline(env: &[(String, String)], argv: &[String]) -> String {
    env.iter()
        .map(|(k, v)| format!("{k}={}", shell_quote(v)))
        .chain(argv.iter().map(|a| shell_quote(a)))
        .collect::<Vec<_>>()
        .join(" ")
}

impl Proc {
    pub(crate) fn spawn(
        label: &str,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<Proc, String> {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", argv[0]))?;
        let pgid = child.id() as i32;
        let (tx, rx) = channel();
        let out = Arc::new(Mutex::new(String::new()));
        let err = Arc::new(Mutex::new(String::new()));
        let so = child.stdout.take().expect("piped stdout");
        let se = child.stderr.take().expect("piped stderr");
        let readers_done = Arc::new(AtomicUsize::new(0));
        for (stream, buf) in [
            (Box::new(so) as Box<dyn std::io::Read + Send>, out.clone()),
            (Box::new(se), err.clone()),
        ] {
            let tx = tx.clone();
            let done = readers_done.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    if let Ok(mut b) = buf.lock() {
                        // Bound what we keep: tools like nginx can be chatty.
                        if b.len() < 1 << 20 {
                            b.push_str(&line);
                            b.push('\n');
                        }
                    }
                    let _ = tx.send(line);
                }
                // Pairs with the Acquire load in wait(): the text above is in the buffer.
                done.fetch_add(1, Ordering::Release);
            });
        }
        Ok(Proc {
            label: label.to_string(),
            cmdline: cmdline(env, argv),
            child,
            pgid,
            lines: rx,
            out,
            err,
            readers_done,
            exited: None,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its process group (`canal run` and the program it runs share it).
    pub(crate) fn pgid(&self) -> i32 {
        self.pgid
    }

    pub(crate) fn stdout(&self) -> String {
        self.out.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub(crate) fn stderr(&self) -> String {
        self.err.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The last few lines of stderr (or stdout), for a failure reason.
    pub(crate) fn tail(&self) -> String {
        let e = self.stderr();
        let src = if e.trim().is_empty() {
            self.stdout()
        } else {
            e
        };
        let lines: Vec<&str> = src
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        // Prefer the lines that say what went wrong over a usage text printed after them.
        let key = [
            "error", "unknown", "cannot", "failed", "panicked", "refused", "denied", "not ",
        ];
        let important: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| key.iter().any(|k| l.to_ascii_lowercase().contains(k)))
            .take(2)
            .collect();
        let t = if important.is_empty() {
            lines[lines.len().saturating_sub(3)..].join(" | ")
        } else {
            important.join(" | ")
        };
        let t: String = t.chars().filter(|c| !c.is_control()).collect();
        if t.chars().count() > 300 {
            t.chars().take(300).collect::<String>() + "…"
        } else {
            t
        }
    }

    /// Waits until a line containing `pat` appears on stdout or stderr.
    pub(crate) fn wait_line(&mut self, pat: &str, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left.min(Duration::from_millis(50))) {
                Ok(l) if l.contains(pat) => return Ok(l),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(st) = self.try_wait() {
                        return Err(format!(
                            "{} exited ({}) before '{pat}': {}",
                            self.label,
                            status_text(st),
                            self.tail()
                        ));
                    }
                    if left.is_zero() {
                        return Err(format!(
                            "{} printed no '{pat}' within {:.1}s{}",
                            self.label,
                            timeout.as_secs_f64(),
                            tail_suffix(&self.tail())
                        ));
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let st = self.wait(Duration::from_secs(2)).ok();
                    return Err(format!(
                        "{} closed its output ({}) before '{pat}': {}",
                        self.label,
                        st.map(status_text)
                            .unwrap_or_else(|| "still running".into()),
                        self.tail()
                    ));
                }
            }
        }
    }

    pub(crate) fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    /// Waits for exit; on timeout kills the whole process group and says so.
    pub(crate) fn wait(&mut self, timeout: Duration) -> Result<ExitStatus, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_wait() {
                // Let the readers reach end of file, so all output is in. Bounded: a
                // process the child left behind (a private canald) may hold the pipes.
                let drain = Instant::now() + Duration::from_secs(2);
                while self.readers_done.load(Ordering::Acquire) < 2 && Instant::now() < drain {
                    std::thread::sleep(Duration::from_millis(1));
                }
                return Ok(st);
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!(
                    "{} did not finish within {:.1}s (killed){}",
                    self.label,
                    timeout.as_secs_f64(),
                    tail_suffix(&self.tail())
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits until `path` exists, at most `timeout`, giving up if this process exits
    /// first (a daemon making its socket); whether it exists.
    pub(crate) fn wait_for_path(&mut self, path: &Path, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !path.exists() && self.try_wait().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        path.exists()
    }

    /// SIGINT to the process group, then waits up to `timeout` for the leader to exit.
    pub(crate) fn interrupt_and_wait(&mut self, timeout: Duration) {
        if self.try_wait().is_none() {
            signal_group(self.pgid, libc::SIGINT);
            let _ = self.wait(timeout);
        }
    }

    /// Ends this process group: SIGTERM, then SIGKILL if still there after a moment.
    pub(crate) fn kill(&mut self) {
        if self.try_wait().is_some() {
            // The leader is gone; members it left behind still share the group id.
            signal_group(self.pgid, libc::SIGKILL);
            return;
        }
        signal_group(self.pgid, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            if self.try_wait().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        signal_group(self.pgid, libc::SIGKILL);
        let _ = self.child.wait();
        self.exited = self.child.try_wait().ok().flatten();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn tail_suffix(t: &str) -> String {
    if t.is_empty() {
        String::new()
    } else {
        format!(": {t}")
    }
}

/// Runs `argv` to its end (at most `timeout`): the finished process, or why it failed
/// ("`label` exit 1: its last lines").
pub(crate) fn run_to_end(label: &str, argv: &[String], timeout: Duration) -> Result<Proc, String> {
    let mut p = Proc::spawn(label, argv, &[])?;
    let st = p.wait(timeout)?;
    if !st.success() {
        return Err(format!("{label} {}: {}", status_text(st), p.tail()));
    }
    Ok(p)
}

pub(crate) fn status_text(st: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit {c}"),
        (_, Some(s)) => format!("signal {s}"),
        _ => "unknown status".into(),
    }
}

fn signal_group(pgid: i32, sig: i32) {
    if pgid <= 1 {
        return;
    }
    // SAFETY: kill(2) has no memory-safety preconditions; a negative pid addresses only
    // the process group we created for our own child (process_group(0) above).
    unsafe {
        libc::kill(-pgid, sig);
    }
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant and has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// Fields of /proc/PID/stat after the command name: (pgrp, utime+stime ticks).
fn stat_fields(pid: &str) -> Option<(i32, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); pgrp is field 5, utime 14, stime 15.
    let pgrp = f.get(2)?.parse().ok()?;
    let ut: u64 = f.get(11)?.parse().ok()?;
    let st: u64 = f.get(12)?.parse().ok()?;
    Some((pgrp, ut + st))
}

/// Memory of the processes in group `pgid`: the sum of their proportional set sizes
/// (a page shared by k processes counts 1/k to each, so canal's shared rings count
/// once over the guests and canald), in bytes.
pub(crate) fn group_pss_bytes(pgid: i32) -> u64 {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0;
    };
    rd.flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        .filter(|n| stat_fields(n).is_some_and(|(g, _)| g == pgid))
        .filter_map(|n| kib_field(&format!("/proc/{n}/smaps_rollup"), "Pss:"))
        .sum::<u64>()
        * 1024
}

/// The `KEY  N kB` line of a /proc file (meminfo, smaps_rollup): N.
pub(crate) fn kib_field(path: &str, key: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The kernel's memory for sockets, in bytes: every live slab object (socket, inode,
/// file and dentry objects live there) but what held connections do not allocate
/// (`unrelated_slab_bytes`), and TCP buffer pages (/proc/net/sockstat). System-wide:
/// sample it around a change, not as an absolute.
pub(crate) fn kernel_socket_bytes() -> u64 {
    // Objects, not pages: the slab returns a freed object's page when it likes, so an
    // earlier cell's closed connections moved Slab (meminfo) by up to ±5 KiB per
    // connection of the next one; their objects are gone at once.
    let slab = match std::fs::read_to_string("/proc/slabinfo") {
        Ok(t) => slab_object_bytes(&t).saturating_sub(unrelated_slab_bytes(&t)),
        // Not root: every slab page.
        Err(_) => kib_field("/proc/meminfo", "Slab:").unwrap_or(0) * 1024,
    };
    let tcp_pages = std::fs::read_to_string("/proc/net/sockstat")
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("TCP:"))?;
            let f: Vec<&str> = l.split_whitespace().collect();
            let i = f.iter().position(|w| *w == "mem")?;
            f.get(i + 1)?.parse::<u64>().ok()
        })
        .unwrap_or(0);
    slab + tcp_pages * 4096
}

/// /proc/slabinfo's caches as (name, active objects, object size); the header lines
/// and anything unparsable are skipped.
fn slab_caches(slabinfo: &str) -> impl Iterator<Item = (&str, u64, u64)> {
    // name active_objs num_objs objsize ...
    slabinfo.lines().filter_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        Some((
            *f.first()?,
            f.get(1)?.parse().ok()?,
            f.get(3)?.parse().ok()?,
        ))
    })
}

/// The bytes of every live slab object (active objects × object size, each cache).
fn slab_object_bytes(slabinfo: &str) -> u64 {
    slab_caches(slabinfo).map(|(_, n, size)| n * size).sum()
}

/// Slab that sockets held open do not allocate, but that changes while they are
/// counted (B13, 2026-11-28), from /proc/slabinfo's text:
/// - /proc's inodes and (one each) their dentries: a process that walks other
///   processes' /proc/PID/fd makes one per descriptor it looks at — this sandbox's
///   process manager does, so held connections' descriptors showed up as 0.4–2.0 KiB
///   per connection natively and under canal alike, in whichever run the walk fell;
/// - TIME_WAIT sockets: an earlier cell's closed connections expire 60 s later, in
///   whichever cell's window that falls (10,000 of them made one cell's memory per
///   connection negative).
fn unrelated_slab_bytes(slabinfo: &str) -> u64 {
    let cache = |name: &str| {
        slab_caches(slabinfo)
            .find(|(n, ..)| *n == name)
            .map(|(_, n, size)| (n, size))
    };
    let bytes = |name: &str| cache(name).map_or(0, |(n, size)| n * size);
    let proc_inodes = cache("proc_inode_cache").map_or(0, |(n, size)| {
        n * (size + cache("dentry").map_or(0, |(_, s)| s))
    });
    proc_inodes + bytes("tw_sock_TCP") + bytes("tw_sock_TCPv6")
}

/// CPU seconds a live process has used, all its threads: the sum of the per-thread
/// scheduler runtimes (nanoseconds) when available, else utime+stime ticks.
pub(crate) fn pid_cpu_seconds(pid: u32) -> Option<f64> {
    let dir = format!("/proc/{pid}/task");
    if let Ok(rd) = std::fs::read_dir(&dir) {
        let mut ns: u64 = 0;
        let mut any = false;
        for e in rd.flatten() {
            let p = e.path().join("schedstat");
            if let Ok(s) = std::fs::read_to_string(&p) {
                if let Some(v) = s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                {
                    ns += v;
                    any = true;
                }
            }
        }
        if any {
            return Some(ns as f64 * 1e-9);
        }
    }
    stat_fields(&pid.to_string()).map(|(_, t)| t as f64 / clock_ticks())
}

/// A free TCP port on 127.0.0.1 (bound then released; the window for a race is tiny).
pub(crate) fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// Polls until a TCP connect to 127.0.0.1:port (or a Unix path) succeeds.
pub(crate) fn wait_connectable(port: Option<u16>, path: Option<&Path>, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let ok = match (port, path) {
            (Some(p), _) => std::net::TcpStream::connect(("127.0.0.1", p)).is_ok(),
            (None, Some(p)) => std::os::unix::net::UnixStream::connect(p).is_ok(),
            _ => false,
        };
        if ok {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// /proc's inodes are found in slabinfo where it is readable (root, as CI), and a
    /// walk of /proc/self/fd grows them; without slabinfo B13 counts meminfo's Slab.
    #[test]
    fn proc_inodes_are_measured() {
        let Ok(before) = std::fs::read_to_string("/proc/slabinfo") else {
            eprintln!("skipped: /proc/slabinfo is not readable here");
            return;
        };
        let held: Vec<std::fs::File> = (0..500)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        let walked = std::fs::read_dir("/proc/self/fd").unwrap().count();
        assert!(walked >= held.len());
        let after = std::fs::read_to_string("/proc/slabinfo").unwrap();
        let (before, after) = (unrelated_slab_bytes(&before), unrelated_slab_bytes(&after));
        assert!(
            after > before,
            "{before} -> {after} after walking {walked} descriptors"
        );
    }

    /// The caches left out of the kernel's share, read from slabinfo's columns.
    #[test]
    fn unrelated_slab_is_read_from_slabinfo() {
        let text = "slabinfo - version: 2.1\n\
            # name <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab>\n\
            tw_sock_TCPv6          2     32    248   16    1 : tunables 0 0 0\n\
            tw_sock_TCP         1000   1024    248   16    1 : tunables 0 0 0\n\
            TCP                 9000   9010   2432   13    8 : tunables 0 0 0\n\
            proc_inode_cache     100    120    720   22    4 : tunables 0 0 0\n\
            dentry              5000   5100    192   21    1 : tunables 0 0 0\n";
        assert_eq!(
            unrelated_slab_bytes(text),
            2 * 248 + 1000 * 248 + 100 * (720 + 192)
        );
        assert_eq!(unrelated_slab_bytes("TCP 1 1 2432 13 8\n"), 0);
        assert_eq!(
            slab_object_bytes(text),
            2 * 248 + 1000 * 248 + 9000 * 2432 + 100 * 720 + 5000 * 192
        );
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("abc-1.2/x"), "abc-1.2/x");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(
            cmdline(&[("A".into(), "1 2".into())], &["x".into(), "".into()]),
            "A='1 2' x ''"
        );
    }

    #[test]
    fn waits_and_kills_bounded() {
        let mut p = Proc::spawn(
            "echo",
            &["sh".into(), "-c".into(), "echo hi; echo READY x".into()],
            &[],
        )
        .unwrap();
        assert_eq!(
            p.wait_line("READY", Duration::from_secs(5)).unwrap(),
            "READY x"
        );
        assert!(p.wait(Duration::from_secs(5)).unwrap().success());
        let mut s = Proc::spawn("sleeper", &["sleep".into(), "30".into()], &[]).unwrap();
        let t = Instant::now();
        let e = s.wait(Duration::from_millis(100)).unwrap_err();
        assert!(e.contains("did not finish"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
        let mut f = Proc::spawn(
            "false",
            &["sh".into(), "-c".into(), "echo boom >&2; exit 3".into()],
            &[],
        )
        .unwrap();
        let e = f.wait_line("READY", Duration::from_secs(5)).unwrap_err();
        assert!(e.contains("boom"), "{e}");
    }

    #[test]
    fn own_cpu_is_visible() {
        let me = std::process::id();
        assert!(pid_cpu_seconds(me).unwrap() > 0.0);
    }
}
