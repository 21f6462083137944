//! Trust checks on the control socket's directory and on the daemon behind it, for
//! canald itself and for the clients that start or use it (`canal run`, `canal stat`,
//! `canal vm`). The guest library makes the same checks with raw system calls
//! (libcanal `conn::attach::check_dir`, `conn::attach::daemon_trusted`). See docs/threat-model.md, "Who a guest trusts".
//!
//! A directory another user can write lets that user plant the socket (an impostor
//! daemon), the lock file or the log as symlinks: so the directory must be a real
//! directory (never followed through a symlink), owned by the caller or root, and
//! writable by nobody else. A client additionally wants its own directory private
//! (0700); a root-owned one (a system service's) only needs to be closed to writes.
#![forbid(unsafe_code)]

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Why a control directory or a daemon is not to be trusted (or could not be checked).
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("cannot inspect the control directory {}: {source}", dir.display())]
    Inspect {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create {}: {source}", dir.display())]
    Create {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("the control directory {} is a symlink; refusing to follow it", dir.display())]
    Symlink { dir: PathBuf },
    #[error("the control directory {} is not a directory", dir.display())]
    NotDir { dir: PathBuf },
    #[error(
        "the control directory {} belongs to uid {owner}, not to you (uid {me}) or root; \
         another user may have created it to impersonate canald: remove it or use --socket",
        dir.display()
    )]
    Owner { dir: PathBuf, owner: u32, me: u32 },
    #[error(
        "the control directory {} is writable by other users (mode {mode:04o}); refusing it \
         (make it 0700)",
        dir.display()
    )]
    Writable { dir: PathBuf, mode: u32 },
    #[error(
        "the control directory {0} is open to other users (mode {mode:04o}); canal wants it \
         0700 (chmod 700 {0})",
        dir.display()
    )]
    NotPrivate { dir: PathBuf, mode: u32 },
    #[error(
        "a private canald is started only in a directory of your own: {} belongs to uid \
         {owner}; use --socket in a directory of yours",
        dir.display()
    )]
    NotOwn { dir: PathBuf, owner: u32 },
    #[error(
        "permission denied on {}: it belongs to another user's canald (use your own with \
         --socket, or run as that user)",
        socket.display()
    )]
    Denied { socket: PathBuf },
    #[error("cannot connect to {}: {source}", socket.display())]
    Connect {
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot learn who serves {}: {source}", socket.display())]
    PeerCred {
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the canald on {} (pid {pid}) runs as uid {uid}, not as you (uid {me}) or root; \
         refusing to use it",
        socket.display()
    )]
    Untrusted {
        socket: PathBuf,
        pid: u32,
        uid: u32,
        me: u32,
    },
}

/// Whose rule applies.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    /// canald: the directory must be its own (or root's, for a root daemon) and not
    /// writable by group or others.
    Daemon,
    /// A client: its own directory must be 0700; a root-owned one not writable by
    /// group or others.
    Client,
    /// Where a client starts a private daemon: its own directory, 0700 (also for root:
    /// a root-owned 0755 directory such as /etc or /run/canal is not a private one).
    Private,
}

/// Checks `dir` without following a symlink at its last component.
pub(crate) fn check_dir(dir: &Path, role: Role) -> Result<(), TrustError> {
    let me = crate::sys::getuid();
    let m = std::fs::symlink_metadata(dir).map_err(|source| TrustError::Inspect {
        dir: dir.into(),
        source,
    })?;
    check_meta(
        dir,
        m.file_type().is_symlink(),
        m.is_dir(),
        m.uid(),
        m.mode(),
        me,
        role,
    )
}

fn check_meta(
    dir: &Path,
    symlink: bool,
    is_dir: bool,
    owner: u32,
    mode: u32,
    me: u32,
    role: Role,
) -> Result<(), TrustError> {
    let dir = dir.to_path_buf();
    if symlink {
        return Err(TrustError::Symlink { dir });
    }
    if !is_dir {
        return Err(TrustError::NotDir { dir });
    }
    if owner != me && owner != 0 {
        return Err(TrustError::Owner { dir, owner, me });
    }
    if owner != me && role == Role::Private {
        return Err(TrustError::NotOwn { dir, owner });
    }
    let mode = mode & 0o7777;
    if mode & 0o022 != 0 {
        return Err(TrustError::Writable { dir, mode });
    }
    // A user's own directory must be private; root's may be a system service's
    // (/run/canal, 0755): closed to writes is what matters there.
    let private_wanted = match role {
        Role::Private => true,
        Role::Client => me != 0,
        Role::Daemon => false,
    };
    if private_wanted && owner == me && mode & 0o077 != 0 {
        return Err(TrustError::NotPrivate { dir, mode });
    }
    Ok(())
}

/// Creates `dir` (and missing parents) with mode 0700 if it does not exist, then
/// checks it. An existing path is never changed, only checked.
pub fn ensure_dir(dir: &Path, role: Role) -> Result<(), TrustError> {
    if std::fs::symlink_metadata(dir).is_err() {
        match std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
        {
            Ok(()) => {}
            // Another process made it meanwhile: the check below judges it.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(TrustError::Create {
                    dir: dir.into(),
                    source,
                })
            }
        }
    }
    check_dir(dir, role)
}

/// The directory of a control socket path ("." for a bare name).
pub fn dir_of(socket: &Path) -> &Path {
    match socket.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Whether a daemon running as `uid` may be trusted by a process of uid `me`.
pub(crate) fn trusted_daemon(uid: u32, me: u32) -> bool {
    uid == me || uid == 0
}

/// Connects to the daemon on `socket` after checking its directory (client rule),
/// and checks the daemon's uid (`SO_PEERCRED`) before anything is sent. Ok(None):
/// nobody answers there (no socket, or a stale one). Err: a daemon or directory canal
/// must not trust, or a socket this user may not use, with the reason.
pub fn connect_trusted(socket: &Path) -> Result<Option<std::os::fd::OwnedFd>, TrustError> {
    check_dir(dir_of(socket), Role::Client)?;
    let fd = match crate::sys::seqpacket_connect(socket) {
        Ok(fd) => fd,
        Err(e) => {
            return match e.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ECONNREFUSED) => Ok(None),
                Some(libc::EACCES) | Some(libc::EPERM) => Err(TrustError::Denied {
                    socket: socket.into(),
                }),
                _ => Err(TrustError::Connect {
                    socket: socket.into(),
                    source: e,
                }),
            };
        }
    };
    check_daemon(&fd, socket)?;
    Ok(Some(fd))
}

/// Checks the uid of the daemon at the other end of `fd`, connected to `socket`
/// (SO_PEERCRED): ours or root, else the reason.
pub(crate) fn check_daemon(fd: &std::os::fd::OwnedFd, socket: &Path) -> Result<(), TrustError> {
    let me = crate::sys::getuid();
    let (pid, uid) = crate::sys::peer_cred(fd).map_err(|source| TrustError::PeerCred {
        socket: socket.into(),
        source,
    })?;
    if !trusted_daemon(uid, me) {
        return Err(TrustError::Untrusted {
            socket: socket.into(),
            pid,
            uid,
            me,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(symlink: bool, owner: u32, mode: u32, me: u32, role: Role) -> bool {
        check_meta(Path::new("/x"), symlink, true, owner, mode, me, role).is_ok()
    }

    #[test]
    fn rules() {
        // Own private directory: fine for both.
        assert!(check(false, 1000, 0o40700, 1000, Role::Client));
        assert!(check(false, 1000, 0o40700, 1000, Role::Daemon));
        // A symlink is never followed.
        assert!(!check(true, 1000, 0o40700, 1000, Role::Client));
        // Another user's directory (the impostor's /tmp/canal-0, mode 0777).
        assert!(!check(false, 1001, 0o40777, 0, Role::Client));
        assert!(!check(false, 1001, 0o40700, 1000, Role::Daemon));
        // Writable by others: refused even when owned by the caller.
        assert!(!check(false, 0, 0o41777, 0, Role::Daemon));
        assert!(!check(false, 1000, 0o40770, 1000, Role::Daemon));
        // Own directory readable by others: a daemon may serve others there (they
        // are refused by SO_PEERCRED unless root), a client wants its own 0700.
        assert!(check(false, 1000, 0o40755, 1000, Role::Daemon));
        assert!(!check(false, 1000, 0o40755, 1000, Role::Client));
        // A root-owned system directory closed to writes: trusted by users.
        assert!(check(false, 0, 0o40755, 1000, Role::Client));
        // Root too: its system directory is 0755 (a root client owns it) — but a
        // private daemon is started only in a private directory.
        assert!(check(false, 0, 0o40755, 0, Role::Client));
        assert!(!check(false, 0, 0o40755, 0, Role::Private));
        assert!(check(false, 0, 0o40700, 0, Role::Private));
        assert!(!check(false, 0, 0o40700, 1000, Role::Private));
        assert!(check_meta(Path::new("/x"), false, false, 0, 0o100600, 0, Role::Client).is_err());
    }

    #[test]
    fn daemon_uids() {
        assert!(trusted_daemon(1000, 1000));
        assert!(trusted_daemon(0, 1000));
        assert!(!trusted_daemon(1001, 1000));
    }
}
