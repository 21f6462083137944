//! Hooks of exec and exit: carrying canal sockets across exec (see `rejoin`), vfork
//! children, and the exit-time flush.
use crate::fdtable::TABLE;
use crate::hooks::common::Reentry;
use crate::sock::core::Sock;
use crate::sys;
use crate::sys::real;
use libc::c_int;
use std::panic::catch_unwind;
use std::panic::AssertUnwindSafe;

/// A vfork child (or posix_spawn's) runs in our memory with its own descriptor table:
/// it must not change the table or the reference counts the parent owns. Checked on
/// slow paths only (one getpid system call).
pub(crate) fn vfork_child() -> bool {
    crate::rt::PID.load(core::sync::atomic::Ordering::Relaxed) != sys::getpid()
}

type FnExecve = unsafe extern "C" fn(
    *const libc::c_char,
    *const *const libc::c_char,
    *const *const libc::c_char,
) -> c_int;

type FnFexecve =
    unsafe extern "C" fn(c_int, *const *const libc::c_char, *const *const libc::c_char) -> c_int;

/// Before exec: the kernel will close every close-on-exec descriptor, so their
/// references are dropped now (as close would). Only references another descriptor
/// still backs (refs > 1) are dropped, so a failed exec can restore them exactly; a
/// socket whose last reference goes away by exec stays open until the guest's control
/// connection closes. Descriptors without close-on-exec survive exec as bare dummies
/// the new image does not know (docs/compat.md, exec). A vfork child shares our memory and must not
/// touch the table: it is recognised by its pid differing from the one our state
/// belongs to.
fn before_exec() -> Vec<(c_int, u32)> {
    let mut dropped = Vec::new();
    let Some(g) = crate::conn::guest::guest() else {
        return dropped;
    };
    if crate::rt::PID.load(core::sync::atomic::Ordering::Relaxed) != sys::getpid() {
        return dropped;
    }
    let Some(_r) = Reentry::enter() else {
        return dropped;
    };
    // The new image shares the control connection and inherits descriptors: every
    // socket gets its WATCH now (sock/watch.rs), so a close-on-exec one closes with
    // this image.
    crate::sock::watch::share(g);
    let _ = catch_unwind(AssertUnwindSafe(|| {
        TABLE.for_each_canal(|fd, h| {
            let cloexec = sys::fcntl_int(fd, libc::F_GETFD, 0)
                .is_ok_and(|f| f as c_int & libc::FD_CLOEXEC != 0);
            if !cloexec {
                return;
            }
            if let Ok(s) = Sock::new(g, h) {
                let o = core::sync::atomic::Ordering::AcqRel;
                let r = core::sync::atomic::Ordering::Relaxed;
                if s.e
                    .refs
                    .fetch_update(o, r, |n| (n > 1).then(|| n - 1))
                    .is_ok()
                {
                    dropped.push((fd, h));
                }
            }
        });
        for &(fd, _) in &dropped {
            TABLE.take(fd);
        }
    }));
    dropped
}

/// exec failed: the descriptors are still ours.
fn exec_failed(dropped: Vec<(c_int, u32)>) {
    let Some(g) = crate::conn::guest::guest() else {
        return;
    };
    let e = sys::errno();
    for (fd, h) in dropped {
        let _ = TABLE.set_canal(fd, h);
        crate::sock::close::add_ref(g, h);
    }
    sys::set_errno(e);
}

extern "C" {
    /// libc's environment (also execl.rs's).
    pub(crate) static environ: *const *const libc::c_char;
}

/// Descriptors and the canal socket handles they hold.
type FdHandles = Vec<(c_int, u32)>;

/// What an exec'd image inherits (CANAL_REJOIN's lists).
struct Inherited {
    keep: FdHandles,
    bridged: FdHandles,
    tokens: FdHandles,
}

/// What the new image inherits: canal sockets without close-on-exec, and bridged
/// descriptors (bridge.rs). A connected TCP socket on a standard stream (0-2: inetd
/// style, a daemon's child serving the connection) is bridged now: the new image may
/// use it through stdio, or be a program without the library. Elsewhere an inherited
/// socket is usually one the child does not use (no close-on-exec), and a bridge would
/// take the data its parent still reads; it keeps the rejoin path.
fn inherited() -> Inherited {
    let (mut keep, mut bridged) = (Vec::new(), Vec::new());
    let none = || Inherited {
        keep: vec![],
        bridged: vec![],
        tokens: vec![],
    };
    let Some(g) = crate::conn::guest::guest() else {
        return none();
    };
    if vfork_child() {
        return none();
    }
    let survives =
        |fd| sys::fcntl_int(fd, libc::F_GETFD, 0).is_ok_and(|f| f as c_int & libc::FD_CLOEXEC == 0);
    let mut canal = Vec::new();
    TABLE.for_each_canal(|fd, h| {
        if survives(fd) {
            canal.push((fd, h));
        }
    });
    let mut done: Vec<u32> = Vec::new();
    for &(fd, h) in &canal {
        if fd <= 2 && !done.contains(&h) {
            done.push(h);
            crate::bridge::bridge_if_connected(g, fd, h);
        }
    }
    for fd in 0..TABLE.high_water() as c_int {
        match TABLE.get(fd) {
            Some(crate::fdtable::Entry::Canal(h)) if survives(fd) => keep.push((fd, h)),
            Some(crate::fdtable::Entry::Bridged(h)) if survives(fd) => bridged.push((fd, h)),
            _ => {}
        }
    }
    // A bridge's receive token goes with the image only if it gets the socket as stdin.
    let stdin_of = match TABLE.get(0) {
        Some(crate::fdtable::Entry::Bridged(h)) if survives(0) => Some(h),
        _ => None,
    };
    let tokens = crate::bridge::prepare_exec(stdin_of);
    Inherited {
        keep,
        bridged,
        tokens,
    }
}

/// Runs an exec: a program canal cannot reach is reported (launch.rs); references of
/// close-on-exec sockets are dropped; if sockets are inherited, the new image gets
/// CANAL_REJOIN (rejoin.rs); the environment keeps the image under canal (launch.rs);
/// then `$call` runs with that environment as `$envp`. A failed exec restores
/// everything.
macro_rules! exec_hook {
    ($orig_env:expr, $warn:expr, |$envp:ident| $call:expr) => {{
        // A vfork child runs in our memory: it must not allocate (launch.rs).
        let vforked = vfork_child();
        ($warn)(vforked);
        let dropped = before_exec();
        let inh = inherited();
        let entry = crate::conn::guest::guest()
            .and_then(|g| crate::rejoin::prepare(g, &inh.keep, &inh.bridged, &inh.tokens))
            .and_then(|e| std::ffi::CString::new(e).ok());
        let rejoining = entry.is_some();
        // SAFETY: the caller's environment, as exec requires it.
        let env = unsafe { crate::launch::exec_env($orig_env, entry, !vforked) };
        let $envp: *const *const libc::c_char = env.as_ptr();
        // SAFETY: forwarding the caller's arguments (and an environment built from
        // theirs) to libc's exec function.
        let r = unsafe { $call };
        if rejoining {
            if let Some(g) = crate::conn::guest::guest() {
                crate::rejoin::undo(g);
            }
        }
        crate::bridge::exec_failed();
        exec_failed(dropped);
        r
    }};
}

/// The warning for exec'ing `file` (a path, or with `search` a name to look up in
/// PATH, which allocates: not in a vfork child).
fn warn(file: *const libc::c_char, search: bool, vforked: bool) {
    if file.is_null() {
        return;
    }
    // SAFETY: exec's contract: a valid C string.
    let f = unsafe { core::ffi::CStr::from_ptr(file) };
    if !search || f.to_bytes().contains(&b'/') {
        crate::launch::warn_if_unreachable(f, -1);
    } else if !vforked {
        if let Some(p) = crate::launch::resolve(f) {
            crate::launch::warn_if_unreachable(&p, -1);
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execve(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    exec_hook!(envp, |v| warn(path, false, v), |e| real!(
        c"execve", FnExecve
    )(path, argv, e))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execv(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
) -> c_int {
    // SAFETY: reading libc's environ pointer.
    let env = unsafe { environ };
    exec_hook!(env, |v| warn(path, false, v), |e| real!(
        c"execve", FnExecve
    )(path, argv, e))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execvp(
    file: *const libc::c_char,
    argv: *const *const libc::c_char,
) -> c_int {
    // SAFETY: reading libc's environ pointer.
    let env = unsafe { environ };
    exec_hook!(env, |v| warn(file, true, v), |e| real!(
        c"execvpe", FnExecve
    )(file, argv, e))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execvpe(
    file: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    exec_hook!(envp, |v| warn(file, true, v), |e| real!(
        c"execvpe", FnExecve
    )(file, argv, e))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    exec_hook!(
        envp,
        |_| crate::launch::warn_if_unreachable(c"(fexecve)", fd),
        |e| { real!(c"fexecve", FnFexecve)(fd, argv, e) }
    )
}

/// At exit() the kernel closes every descriptor: drop this process's references so a
/// socket shared with another process (fork) is closed when the last one goes. A
/// process ended by _exit() or a signal skips this (see docs/compat.md).
pub(crate) fn at_exit() {
    if crate::rt::PID.load(core::sync::atomic::Ordering::Relaxed) != sys::getpid() {
        return;
    }
    let Some(g) = crate::conn::guest::guest() else {
        return;
    };
    if crate::conn::guest::is_dead(g) {
        return;
    }
    let Some(_r) = Reentry::enter() else { return };
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let mut all: Vec<(c_int, u32)> = Vec::new();
        TABLE.for_each_canal(|fd, h| all.push((fd, h)));
        for (fd, h) in all {
            if TABLE.take(fd).is_some() {
                crate::sock::close::release(g, h);
            }
        }
    }));
}
