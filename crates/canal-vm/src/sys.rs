//! Small safe wrappers around the system calls the harness needs: poll(2), signal
//! handlers that only set a flag, kill(2) and prctl(PR_SET_PDEATHSIG). All of the crate's
//! `unsafe` lives here.

use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

/// Waits until one of `fds` is readable (or hung up), or `timeout_ms` passes. Returns, for
/// each fd, whether it has something to read (data, EOF or an error).
pub(crate) fn poll_readable(fds: &[RawFd], timeout_ms: i32) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `pfds` is a valid, exclusively borrowed array of `pfds.len()` pollfd structs
    // that outlives the call; poll(2) only writes their `revents` fields.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(e);
    }
    Ok(pfds.iter().map(|p| p.revents != 0).collect())
}

/// The last SIGINT/SIGTERM/SIGHUP received (0 = none). Written only by `on_signal`.
static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Relaxed: the main loop polls this flag at least every 100 ms; nothing else is
    // published through it.
    PENDING_SIGNAL.store(sig, Ordering::Relaxed);
}

/// Makes SIGINT, SIGTERM and SIGHUP set a flag (read with [`pending_signal`]) instead of
/// killing the process, so the harness can kill QEMU and remove its files first.
pub(crate) fn catch_termination_signals() -> io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; we then set a
        // handler that is async-signal-safe (one relaxed atomic store).
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The signal that asked us to stop, if any.
pub(crate) fn pending_signal() -> Option<i32> {
    match PENDING_SIGNAL.load(Ordering::Relaxed) {
        0 => None,
        s => Some(s),
    }
}

/// Sends `sig` to process `pid` (errors ignored: the process may already be gone).
pub(crate) fn kill(pid: u32, sig: i32) {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Arranges for the child to get SIGKILL when this process dies, so a QEMU cannot outlive
/// a `canal vm run` that was killed with SIGKILL.
pub(crate) fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and calls only prctl(2) and
    // getppid(2), which are async-signal-safe and allocate nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() != parent {
                return Err(io::Error::other("parent exited"));
            }
            Ok(())
        });
    }
}
