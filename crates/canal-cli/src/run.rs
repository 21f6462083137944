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

/// Whether something accepts connections on the control socket. canald's socket is
/// SOCK_SEQPACKET; std has no such type, so probe with a raw socket.
fn answers(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: plain socket(2); the descriptor is closed below on every path.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return false;
    }
    // SAFETY: sockaddr_un is plain data; all-zero is valid.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let ok = if bytes.len() < sa.sun_path.len() {
        for (d, s) in sa.sun_path.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        // SAFETY: sa is a valid sockaddr_un of the given size; fd is ours.
        unsafe {
            libc::connect(
                fd,
                &sa as *const libc::sockaddr_un as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            ) == 0
        }
    } else {
        false
    };
    // SAFETY: fd is ours and not used after.
    unsafe { libc::close(fd) };
    ok
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

/// Makes sure a canald answers on `path`: starts a private one if not (`canal vm` uses
/// this too).
pub fn ensure_daemon(path: &Path) -> Result<(), String> {
    if answers(path) {
        return Ok(());
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find my own binary: {e}"))?;
    start_private_daemon(&exe, path)
}

fn start_private_daemon(exe: &Path, path: &Path) -> Result<(), String> {
    let log = path.with_extension("log");
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null());
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
        if answers(path) {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            // Another canal run may have won the race for the same path.
            if answers(path) {
                return Ok(());
            }
            return Err(format!(
                "canald exited at start ({st}); see {}",
                log.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Err(format!(
        "canald did not answer on {} within 10 s; see {}",
        path.display(),
        log.display()
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
    if !answers(&path) {
        if let Err(e) = start_private_daemon(&exe, &path) {
            eprintln!("canal run: {e}");
            return 1;
        }
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
