//! canald's own process: uid, CPU pinning, descriptor limit, clocks, exec setup.

use std::io;
use std::os::fd::OwnedFd;

pub fn getuid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// Pins the calling thread to one CPU.
pub(crate) fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= rustix::thread::CpuSet::MAX_CPU {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    Ok(rustix::thread::sched_setaffinity(None, &set)?)
}

/// Gives the core to another runnable thread (a spinning poller on a busy machine).
pub(crate) fn sched_yield() {
    rustix::thread::sched_yield();
}

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns the soft limit in force.
pub(crate) fn raise_nofile() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let r = getrlimit(Resource::Nofile);
    let Some(cur) = r.current else {
        return u64::MAX; // unlimited
    };
    if r.maximum.is_none_or(|max| cur < max) {
        let want = Rlimit {
            current: r.maximum,
            maximum: r.maximum,
        };
        // Raising the soft limit up to the hard one needs no privilege.
        if setrlimit(Resource::Nofile, want).is_ok() {
            return r.maximum.unwrap_or(u64::MAX);
        }
    }
    cur
}

/// CLOCK_MONOTONIC in milliseconds.
pub(crate) fn monotonic_ms() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// /dev/null, read-only, close-on-exec (a placeholder descriptor).
pub(crate) fn open_dev_null() -> io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    Ok(rustix::fs::open(
        "/dev/null",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Makes `cmd`'s child start a new session (setsid) before it execs, so that the
/// terminal's signals for the parent's process group never reach it.
pub fn new_session_on_exec(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid() is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
}

/// Makes `fd` descriptor 3 of the program `cmd` runs (the rest stay close-on-exec): a
/// per-user canald's channel from the host-wide one (`users.rs`).
pub(crate) fn pass_as_fd3_on_exec(cmd: &mut std::process::Command, fd: std::os::fd::RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: dup2 and fcntl are async-signal-safe and touch no memory of the parent;
    // `fd` stays open in the parent until the child has exec'd (Command::spawn waits).
    unsafe {
        cmd.pre_exec(move || {
            if fd == 3 {
                if libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
            } else if libc::dup2(fd, 3) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
