//! Booting a harness guest and running one program in it.
//!
//! The host listens on three Unix sockets in a private run directory; QEMU connects to them
//! as the guest's virtio-serial ports `canal.ctl`, `canal.stdout` and `canal.stderr`. The
//! guest's init (guest/init.sh) says `READY` on the control port when the program is about
//! to start and `EXIT <status>` when it has finished, then powers off. Program output is
//! streamed as it arrives. The host never sleeps a fixed time: it waits in poll(2) for
//! those lines, for QEMU to exit, or for a deadline.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::qemu::VmConfig;
use crate::sys;

/// A private directory for one VM's sockets, logs and command file; removed on drop.
pub(crate) struct RunDir {
    pub(crate) path: PathBuf,
}

impl RunDir {
    pub(crate) fn create() -> io::Result<RunDir> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path =
            std::env::temp_dir().join(format!("canal-vm.{}.{:08x}", std::process::id(), nanos));
        fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(RunDir { path })
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Single-quotes `s` for a POSIX shell.
pub(crate) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// What the guest runs: written to cmd.sh in the run directory, which the guest sees at
/// /run/canal-vm/cmd.sh and runs with the host root's /bin/sh after chroot.
#[derive(Debug, Clone, Default)]
pub(crate) struct GuestCommand {
    pub(crate) program: Vec<String>,
    /// Exported to the program (names are validated).
    pub(crate) env: Vec<(String, String)>,
    /// Set only on the program itself, not on the shell that starts it.
    pub(crate) preload: Option<PathBuf>,
    /// Working directory if the guest can see it (the host root is visible read-only).
    pub(crate) cwd: Option<PathBuf>,
}

fn valid_env_name(n: &str) -> bool {
    let mut c = n.chars();
    matches!(c.next(), Some(ch) if ch == '_' || ch.is_ascii_alphabetic())
        && c.all(|ch| ch == '_' || ch.is_ascii_alphanumeric())
}

impl GuestCommand {
    pub(crate) fn script(&self) -> io::Result<String> {
        if self.program.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no program given",
            ));
        }
        let mut s = String::from("# written by canal vm run\n");
        s.push_str("export PATH='/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'\n");
        for (k, v) in &self.env {
            if !valid_env_name(k) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("invalid environment variable name '{k}'"),
                ));
            }
            s.push_str(&format!("export {k}={}\n", shell_quote(v)));
        }
        if let Some(cwd) = &self.cwd {
            s.push_str(&format!(
                "cd {} 2>/dev/null || cd /\n",
                shell_quote(&cwd.to_string_lossy())
            ));
        }
        if let Some(p) = &self.preload {
            s.push_str(&format!(
                "LD_PRELOAD={} ",
                shell_quote(&p.to_string_lossy())
            ));
        }
        s.push_str("exec");
        for a in &self.program {
            s.push(' ');
            s.push_str(&shell_quote(a));
        }
        s.push('\n');
        Ok(s)
    }
}

/// Limits for one boot.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadlines {
    /// The guest must say READY within this time after QEMU starts.
    pub(crate) ready: Duration,
    /// Whole run (boot + program), if limited.
    pub(crate) total: Option<Duration>,
    /// After EXIT, QEMU must be gone within this time or it is killed.
    pub(crate) poweroff: Duration,
}

/// How a boot ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The program ran and exited with this status (128+N if killed by signal N).
    Exited(i32),
    /// The guest's init reported a setup failure.
    GuestFailed(String),
    /// QEMU exited (or failed to start) without the guest reporting an exit status.
    QemuFailed(String),
    /// No READY line in time.
    NotReady(Duration),
    /// `total` passed.
    TimedOut,
    /// We were asked to stop by this signal.
    Signalled(i32),
}

/// Timings of one boot (from QEMU start).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Timings {
    pub(crate) ready: Option<Duration>,
    /// Guest uptime when it said READY, as the guest reported it.
    pub(crate) guest_uptime_at_ready: Option<f64>,
    pub(crate) exited: Option<Duration>,
    pub(crate) qemu_gone: Option<Duration>,
}

/// Where program output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// To our stdout/stderr as it arrives.
    Stream,
    /// Dropped (probes).
    Discard,
}

const CTL: usize = 0;
const OUT: usize = 1;
const ERR: usize = 2;

struct Channel {
    listener: UnixListener,
    conn: Option<UnixStream>,
    eof: bool,
}

/// Boots `cfg` (whose run directory already holds cmd.sh) and waits for the result.
pub(crate) fn boot(cfg: &VmConfig, deadlines: Deadlines, output: Output) -> (Outcome, Timings) {
    boot_with(cfg, deadlines, output, &|_| {})
}

/// [`boot`], calling `on_spawn` with QEMU's pid once it is started.
pub(crate) fn boot_with(
    cfg: &VmConfig,
    deadlines: Deadlines,
    output: Output,
    on_spawn: &dyn Fn(u32),
) -> (Outcome, Timings) {
    let mut t = Timings::default();
    let outcome = match boot_inner(cfg, deadlines, output, &mut t, on_spawn) {
        Ok(o) => o,
        Err(e) => Outcome::QemuFailed(e.to_string()),
    };
    (outcome, t)
}

fn boot_inner(
    cfg: &VmConfig,
    dl: Deadlines,
    output: Output,
    t: &mut Timings,
    on_spawn: &dyn Fn(u32),
) -> io::Result<Outcome> {
    let mut chans = Vec::new();
    for p in [&cfg.ctl_sock, &cfg.out_sock, &cfg.err_sock] {
        let l = UnixListener::bind(p)
            .map_err(|e| io::Error::new(e.kind(), format!("bind {}: {e}", p.display())))?;
        l.set_nonblocking(true)?;
        chans.push(Channel {
            listener: l,
            conn: None,
            eof: false,
        });
    }
    let qemu_log = cfg.run_dir.join("qemu.log");
    let log = fs::File::create(&qemu_log)?;
    let mut cmd = Command::new(&cfg.qemu);
    cmd.args(cfg.args())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    sys::die_with_parent(&mut cmd);
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", cfg.qemu.display())))?;
    on_spawn(child.id());
    let mut guard = ChildGuard(Some(&mut child));

    let mut ctl_buf: Vec<u8> = Vec::new();
    let mut exit_status: Option<i32> = None;
    let mut qemu_status: Option<std::process::ExitStatus> = None;
    let mut guest_fail: Option<String> = None;
    let mut buf = vec![0u8; 64 * 1024];
    let stdout = io::stdout();
    let stderr = io::stderr();

    loop {
        if let Some(sig) = sys::pending_signal() {
            guard.kill();
            return Ok(Outcome::Signalled(sig));
        }
        if let Some(st) = guard.try_wait()? {
            t.qemu_gone = Some(start.elapsed());
            qemu_status = Some(st);
            break;
        }
        let now = start.elapsed();
        if t.ready.is_none() && now > dl.ready {
            guard.kill();
            return Ok(Outcome::NotReady(dl.ready));
        }
        if let Some(total) = dl.total {
            if now > total {
                guard.kill();
                return Ok(Outcome::TimedOut);
            }
        }
        if let Some(ex) = t.exited.or(if guest_fail.is_some() {
            Some(now)
        } else {
            None
        }) {
            if now > ex + dl.poweroff {
                guard.kill();
                break;
            }
        }

        let mut fds = Vec::new();
        let mut which = Vec::new();
        for (i, c) in chans.iter().enumerate() {
            match &c.conn {
                None => fds.push(c.listener.as_raw_fd()),
                Some(s) if !c.eof => fds.push(s.as_raw_fd()),
                Some(_) => continue,
            }
            which.push(i);
        }
        let ready = sys::poll_readable(&fds, 100)?;
        for (k, &i) in which.iter().enumerate() {
            if !ready[k] {
                continue;
            }
            let c = &mut chans[i];
            let Some(conn) = c.conn.as_mut() else {
                match c.listener.accept() {
                    Ok((s, _)) => {
                        s.set_nonblocking(true)?;
                        c.conn = Some(s);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                continue;
            };
            let n = match conn.read(&mut buf) {
                Ok(0) => {
                    c.eof = true;
                    continue;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    c.eof = true;
                    continue;
                }
            };
            match i {
                CTL => {
                    ctl_buf.extend_from_slice(&buf[..n]);
                    while let Some(pos) = ctl_buf.iter().position(|&b| b == b'\n') {
                        let line: Vec<u8> = ctl_buf.drain(..=pos).collect();
                        let line = String::from_utf8_lossy(&line).trim().to_string();
                        handle_ctl(&line, start, t, &mut exit_status, &mut guest_fail);
                    }
                }
                OUT if output == Output::Stream => {
                    let mut o = stdout.lock();
                    let _ = o.write_all(&buf[..n]).and_then(|_| o.flush());
                }
                ERR if output == Output::Stream => {
                    let mut e = stderr.lock();
                    let _ = e.write_all(&buf[..n]).and_then(|_| e.flush());
                }
                _ => {}
            }
        }
    }

    // QEMU is gone: whatever is left in the sockets is the tail of the output.
    let mut ctl = CtlState {
        buf: ctl_buf,
        exit_status,
        guest_fail,
    };
    drain_channels(&mut chans, &mut ctl, start, t, output)?;
    let _ = stdout.lock().flush();
    Ok(final_outcome(ctl, qemu_status, &qemu_log))
}

/// The control channel's unparsed bytes and what the guest reported on it.
struct CtlState {
    buf: Vec<u8>,
    exit_status: Option<i32>,
    guest_fail: Option<String>,
}

/// After QEMU is gone: reads what is left in each channel (the output's tail, the last
/// control lines).
fn drain_channels(
    chans: &mut [Channel],
    ctl: &mut CtlState,
    start: Instant,
    t: &mut Timings,
    output: Output,
) -> io::Result<()> {
    let stdout = io::stdout();
    let stderr = io::stderr();
    for (i, c) in chans.iter_mut().enumerate() {
        let Some(conn) = c.conn.as_mut() else {
            continue;
        };
        if c.eof {
            continue;
        }
        conn.set_nonblocking(false)?;
        conn.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut rest = Vec::new();
        let _ = conn.read_to_end(&mut rest);
        match i {
            CTL => {
                ctl.buf.extend_from_slice(&rest);
                ctl.buf.push(b'\n');
                let text = String::from_utf8_lossy(&ctl.buf).to_string();
                for line in text.lines() {
                    handle_ctl(
                        line.trim(),
                        start,
                        t,
                        &mut ctl.exit_status,
                        &mut ctl.guest_fail,
                    );
                }
            }
            OUT if output == Output::Stream => {
                let _ = stdout.lock().write_all(&rest);
            }
            ERR if output == Output::Stream => {
                let _ = stderr.lock().write_all(&rest);
            }
            _ => {}
        }
    }
    Ok(())
}

/// The outcome once QEMU is gone: the guest's failure, its program's exit status, or
/// QEMU's own failure with its log.
fn final_outcome(
    ctl: CtlState,
    qemu_status: Option<std::process::ExitStatus>,
    qemu_log: &std::path::Path,
) -> Outcome {
    if let Some(f) = ctl.guest_fail {
        return Outcome::GuestFailed(f);
    }
    match ctl.exit_status {
        Some(s) => Outcome::Exited(s),
        None => {
            let status = qemu_status;
            let log = fs::read_to_string(qemu_log).unwrap_or_default();
            Outcome::QemuFailed(format!(
                "QEMU exited ({}) before the guest reported an exit status{}{}",
                status
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "killed".into()),
                if log.trim().is_empty() {
                    ""
                } else {
                    "; QEMU said:\n"
                },
                log.trim_end()
            ))
        }
    }
}

fn handle_ctl(
    line: &str,
    start: Instant,
    t: &mut Timings,
    exit_status: &mut Option<i32>,
    guest_fail: &mut Option<String>,
) {
    if let Some(rest) = line.strip_prefix("READY") {
        t.ready = Some(start.elapsed());
        t.guest_uptime_at_ready = rest.trim().parse().ok();
    } else if let Some(rest) = line.strip_prefix("EXIT ") {
        t.exited = Some(start.elapsed());
        *exit_status = rest.trim().parse().ok().or(Some(125));
    } else if let Some(rest) = line.strip_prefix("FAIL ") {
        *guest_fail = Some(rest.to_string());
    }
}

/// Kills and reaps the QEMU child when dropped or asked to.
struct ChildGuard<'a>(Option<&'a mut Child>);

impl ChildGuard<'_> {
    fn kill(&mut self) {
        if let Some(c) = self.0.take() {
            sys::kill(c.id(), libc::SIGKILL);
            let _ = c.wait();
        }
    }
    fn try_wait(&mut self) -> io::Result<Option<std::process::ExitStatus>> {
        match self.0.as_mut() {
            Some(c) => {
                let r = c.try_wait()?;
                if r.is_some() {
                    self.0 = None;
                }
                Ok(r)
            }
            None => Ok(None),
        }
    }
}

impl Drop for ChildGuard<'_> {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `n` lines of the guest's kernel console, for error messages.
pub(crate) fn console_tail(path: &Path, n: usize) -> String {
    let s = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }

    #[test]
    fn script_quotes_and_validates() {
        let c = GuestCommand {
            program: vec!["sh".into(), "-c".into(), "echo '$x'; exit 3".into()],
            env: vec![("A_1".into(), "v'v".into())],
            preload: Some("/p/libcanal.so".into()),
            cwd: Some("/work".into()),
        };
        let s = c.script().unwrap();
        assert!(s.contains("export A_1='v'\\''v'\n"));
        assert!(s.contains("cd '/work' 2>/dev/null || cd /\n"));
        assert!(
            s.ends_with("LD_PRELOAD='/p/libcanal.so' exec 'sh' '-c' 'echo '\\''$x'\\''; exit 3'\n")
        );
        let bad = GuestCommand {
            program: vec!["x".into()],
            env: vec![("1A".into(), "v".into())],
            ..Default::default()
        };
        assert!(bad.script().is_err());
        assert!(GuestCommand::default().script().is_err());
    }

    #[test]
    fn script_runs_in_a_real_shell() {
        // The generated script must reproduce the arguments exactly.
        let args = [
            "a b",
            "it's",
            "$HOME",
            "\"q\"",
            "back\\slash",
            "new\nline",
            "",
        ];
        let mut program = vec!["printf".to_string(), "<%s>".to_string()];
        program.extend(args.iter().map(|s| s.to_string()));
        let c = GuestCommand {
            program,
            ..Default::default()
        };
        let out = Command::new("/bin/sh")
            .arg("-c")
            .arg(c.script().unwrap())
            .output()
            .unwrap();
        let want: String = args.iter().map(|a| format!("<{a}>")).collect();
        assert_eq!(String::from_utf8_lossy(&out.stdout), want);
    }
}
