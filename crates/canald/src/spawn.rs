//! Starting a private canald: `canal run` and `canal vm` make sure a daemon they may
//! trust answers on the control socket, and start one (`canal daemon`, detached, with
//! an idle exit) when nobody does. The caller's executable must be the `canal` binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a private canald lingers after its last guest left, so back-to-back
/// `canal run`s (and two guests talking to each other) share one daemon.
const PRIVATE_IDLE_EXIT_SECS: &str = "5";

/// Why no trusted canald could be made to answer.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error(transparent)]
    Trust(#[from] crate::ctldir::TrustError),
    #[error("cannot find my own binary: {0}")]
    OwnExe(std::io::Error),
    #[error("cannot start canald ({}): {source}", exe.display())]
    Start {
        exe: PathBuf,
        source: std::io::Error,
    },
    /// canald exited before answering; its own words from the log, else where to look.
    #[error("canald exited at start ({status}){detail}")]
    Exited {
        status: std::process::ExitStatus,
        detail: String,
    },
    #[error("canald did not answer on {} within 10 s; {log_note}", socket.display())]
    NoAnswer { socket: PathBuf, log_note: String },
    /// Nobody answers on the socket and this user cannot create one there: the real
    /// cause, said before a daemon is started that could only fail.
    #[error(
        "nobody answers on {} and a private canald cannot be started there: {} is not writable by this user ({source}); use a socket of your own with --socket or CANAL_SOCKET, or run as the directory's owner",
        socket.display(),
        dir.display()
    )]
    DirNotWritable {
        socket: PathBuf,
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// The host-wide service's control socket (`canald.socket`, scripts/install);
/// `$CANAL_SERVICE_SOCKET` names another.
pub const SYSTEM_SOCKET: &str = "/run/canal/canald.sock";

/// Where `canal run` (and stat, vm, oci-hook) find canald: the socket given
/// (`--socket`, else `$CANAL_SOCKET`); else a daemon of this user already answering at
/// the per-user path (a user service, or a private daemon); else the host-wide service
/// when it answers and runs as this user; else the per-user path, where `ensure_daemon`
/// starts a private daemon.
pub fn locate(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.into();
    }
    let user = crate::config::default_socket_path();
    if std::env::var_os("CANAL_SOCKET").is_some_and(|v| !v.is_empty()) || serves_me(&user) {
        return user;
    }
    let system = std::env::var_os("CANAL_SERVICE_SOCKET")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(SYSTEM_SOCKET), PathBuf::from);
    if serves_me(&system) {
        return system;
    }
    user
}

/// A trusted daemon answers on `path` and serves this user: it runs as this user, or it
/// is a root service that answers this user's STAT (one with `serve-users`, which hands
/// the connection to the user's own canald; without it root serves root only).
fn serves_me(path: &Path) -> bool {
    let Ok(Some(fd)) = crate::ctldir::connect_trusted(path) else {
        return false;
    };
    match crate::sys::peer_cred(&fd) {
        Ok((_, uid)) if uid == crate::sys::getuid() => true,
        Ok((_, 0)) => crate::client::listing_over(&fd, 0).is_ok(),
        _ => false,
    }
}

/// Whether a daemon canal may trust answers on the control socket: Ok(false) if
/// nobody does; Err with the reason if the directory or the daemon is not to be
/// trusted (canald::ctldir).
fn answers(path: &Path) -> Result<bool, SpawnError> {
    Ok(crate::ctldir::connect_trusted(path)?.is_some())
}

/// Makes sure a canald canal may trust answers on `path`: checks (or creates, 0700)
/// its directory and starts a private daemon if nobody answers (`canal vm` uses this
/// too).
pub fn ensure_daemon(path: &Path) -> Result<(), SpawnError> {
    use crate::ctldir::{dir_of, ensure_dir, Role};
    ensure_dir(dir_of(path), Role::Client)?;
    if answers(path)? {
        return Ok(());
    }
    let dir = dir_of(path);
    if let Err(source) = rustix::fs::access(
        dir,
        rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
    ) {
        return Err(SpawnError::DirNotWritable {
            socket: path.into(),
            dir: dir.into(),
            source: source.into(),
        });
    }
    // A private daemon's directory (its lock and log files go there) must be private.
    crate::ctldir::check_dir(dir, Role::Private)?;
    let exe = std::env::current_exe().map_err(SpawnError::OwnExe)?;
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

/// Starts `<exe> daemon --socket PATH --idle-exit 5` detached, its stderr appended to
/// `PATH.log`, and waits (10 s at most) until it answers.
fn start_private_daemon(exe: &Path, path: &Path) -> Result<(), SpawnError> {
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
    // Its own session: the terminal's signals for the program do not reach it.
    crate::sys::new_session_on_exec(&mut cmd);
    let mut child = cmd.spawn().map_err(|source| SpawnError::Start {
        exe: exe.into(),
        source,
    })?;
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
            return Err(SpawnError::Exited {
                status: st,
                detail: if tail.is_empty() {
                    format!("; {log_note}")
                } else {
                    format!(": {tail}")
                },
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Err(SpawnError::NoAnswer {
        socket: path.into(),
        log_note,
    })
}
