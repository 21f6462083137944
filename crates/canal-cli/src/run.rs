//! `canal run`: make sure a canald answers (start a private one if not), then exec the
//! program with the guest library preloaded.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a private canald lingers after its last guest left, so back-to-back
/// `canal run`s (and two guests talking to each other) share one daemon.
const PRIVATE_IDLE_EXIT_SECS: &str = "5";

fn usage() -> &'static str {
    "usage: canal run [--socket PATH] -- PROG ARGS...\n\
     Runs PROG with its AF_INET/AF_INET6 TCP and UDP sockets served by canald.\n\
     If no canald answers on PATH (default: $CANAL_SOCKET, $XDG_RUNTIME_DIR/canal/canald.sock\n\
     or /tmp/canal-$UID/canald.sock) a private one is started; it exits by itself\n\
     a few seconds after its last guest. canal run execs PROG (same pid): the exit\n\
     status is PROG's, and a signal that kills PROG kills canal run the same way\n\
     (a shell shows 128+N)."
}

/// Whether a daemon canal may trust answers on the control socket: Ok(false) if
/// nobody does; Err with the reason if the directory or the daemon is not to be
/// trusted (canald::ctldir).
fn answers(path: &Path) -> Result<bool, String> {
    canald::ctldir::connect_trusted(path).map(|fd| fd.is_some())
}

/// Where libcanal.so is: $CANAL_LIB, next to this binary (a cargo target dir), or
/// ../lib/canal/ (an installed layout).
fn find_library(exe: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CANAL_LIB") {
        return Some(PathBuf::from(p));
    }
    let dir = exe.parent()?;
    [
        dir.join("libcanal.so"),
        dir.join("../lib/canal/libcanal.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// Makes sure a canald canal may trust answers on `path`: checks (or creates, 0700)
/// its directory and starts a private daemon if nobody answers (`canal vm` uses this
/// too).
pub fn ensure_daemon(path: &Path) -> Result<(), String> {
    use canald::ctldir::{dir_of, ensure_dir, Role};
    ensure_dir(dir_of(path), Role::Client)?;
    if answers(path)? {
        return Ok(());
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find my own binary: {e}"))?;
    start_private_daemon(&exe, path)
}

/// `<socket>.log`, opened for appending without following a symlink (the directory was
/// checked: only this user can write it).
fn open_log(log: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(log)
}

/// The last lines of the daemon's log, to quote when it failed to start.
fn log_tail(log: &Path, start: u64) -> String {
    let text = std::fs::read(log).unwrap_or_default();
    let text = String::from_utf8_lossy(&text[(start as usize).min(text.len())..]).into_owned();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

fn start_private_daemon(exe: &Path, path: &Path) -> Result<(), String> {
    let mut log = path.as_os_str().to_owned();
    log.push(".log");
    let log = PathBuf::from(log);
    let (stderr, start, log_note) = match open_log(&log) {
        Ok(f) => {
            let start = f.metadata().map(|m| m.len()).unwrap_or(0);
            (Stdio::from(f), start, format!("see {}", log.display()))
        }
        Err(e) => (
            Stdio::null(),
            0,
            format!("its log {} could not be opened: {e}", log.display()),
        ),
    };
    let mut cmd = Command::new(exe);
    cmd.arg("daemon")
        .arg("--socket")
        .arg(path)
        .arg("--idle-exit")
        .arg(PRIVATE_IDLE_EXIT_SECS)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .env_remove("LD_PRELOAD");
    // SAFETY: setsid() is async-signal-safe; it detaches the daemon from our session
    // so the terminal's signals for the program do not reach it.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start canald ({}): {e}", exe.display()))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if answers(path)? {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            // Another canal run may have won the race for the same path.
            if answers(path)? {
                return Ok(());
            }
            let tail = log_tail(&log, start);
            return Err(if tail.is_empty() {
                format!("canald exited at start ({st}); {log_note}")
            } else {
                format!("canald exited at start ({st}): {tail}")
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Err(format!(
        "canald did not answer on {} within 10 s; {log_note}",
        path.display()
    ))
}

pub fn run(args: Vec<String>) -> i32 {
    let mut socket: Option<PathBuf> = None;
    let mut it = args.into_iter();
    let mut prog: Vec<String> = Vec::new();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--socket" => match it.next() {
                Some(p) => socket = Some(PathBuf::from(p)),
                None => {
                    eprintln!("canal run: --socket needs a path");
                    return 2;
                }
            },
            "-h" | "--help" => {
                println!("{}", usage());
                return 0;
            }
            "--" => {
                prog.extend(it.by_ref());
                break;
            }
            other if other.starts_with('-') => {
                eprintln!("canal run: unknown option '{other}'\n{}", usage());
                return 2;
            }
            _ => {
                prog.push(a);
                prog.extend(it.by_ref());
                break;
            }
        }
    }
    if prog.is_empty() {
        eprintln!("canal run: no program given\n{}", usage());
        return 2;
    }
    let path = socket.unwrap_or_else(canald::default_socket_path);
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("canal run: cannot find my own binary: {e}");
            return 1;
        }
    };
    let Some(lib) = find_library(&exe) else {
        eprintln!(
            "canal run: libcanal.so not found next to {} (set CANAL_LIB to its path)",
            exe.display()
        );
        return 1;
    };
    if let Err(e) = ensure_daemon(&path) {
        eprintln!("canal run: {e}");
        return 1;
    }
    if let Some(w) = crate::elfcheck::warning(&prog[0]) {
        eprintln!("{w}");
    }
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{} {old}", lib.display()),
        _ => lib.display().to_string(),
    };
    let err = Command::new(&prog[0])
        .args(&prog[1..])
        .env("LD_PRELOAD", preload)
        .env("CANAL_SOCKET", &path)
        .exec();
    eprintln!("canal run: cannot run '{}': {err}", prog[0]);
    if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}
