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
    static environ: *const *const libc::c_char;
}

/// Canal sockets without close-on-exec that the new image inherits.
fn inherited() -> Vec<(c_int, u32)> {
    let mut keep = Vec::new();
    if crate::conn::guest::guest().is_none() || vfork_child() {
        return keep;
    }
    TABLE.for_each_canal(|fd, h| {
        let cloexec = sys::fcntl_int(fd, libc::F_GETFD, 0)
            .map_or(true, |f| f as c_int & libc::FD_CLOEXEC != 0);
        if !cloexec {
            keep.push((fd, h));
        }
    });
    keep
}

/// Runs an exec: references of close-on-exec sockets are dropped first; if sockets
/// are inherited, the new image gets CANAL_REJOIN in its environment (rejoin.rs) and
/// `$call` runs with the rewritten environment `$envp` names. A failed exec restores
/// everything.
macro_rules! exec_hook {
    ($orig_env:expr, |$envp:ident| $call:expr) => {{
        let dropped = before_exec();
        let keep = inherited();
        let entry = match (crate::conn::guest::guest(), keep.is_empty()) {
            (Some(g), false) => {
                crate::rejoin::prepare(g, &keep).and_then(|e| std::ffi::CString::new(e).ok())
            }
            _ => None,
        };
        let rewritten = entry.as_ref().map(|e| {
            // SAFETY: the caller's environment, as exec requires it.
            unsafe { crate::rejoin::new_envp($orig_env, e) }
        });
        let $envp: *const *const libc::c_char = match &rewritten {
            Some(v) => v.as_ptr(),
            None => $orig_env,
        };
        // SAFETY: forwarding the caller's arguments (and an environment built from
        // theirs) to libc's exec function.
        let r = unsafe { $call };
        if entry.is_some() {
            if let Some(g) = crate::conn::guest::guest() {
                crate::rejoin::undo(g);
            }
        }
        exec_failed(dropped);
        r
    }};
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execve(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    exec_hook!(envp, |e| real!(c"execve", FnExecve)(path, argv, e))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execv(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
) -> c_int {
    // SAFETY: reading libc's environ pointer.
    let env = unsafe { environ };
    exec_hook!(env, |e| real!(c"execve", FnExecve)(path, argv, e))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execvp(
    file: *const libc::c_char,
    argv: *const *const libc::c_char,
) -> c_int {
    // SAFETY: reading libc's environ pointer.
    let env = unsafe { environ };
    exec_hook!(env, |e| real!(c"execvpe", FnExecve)(file, argv, e))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execvpe(
    file: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    exec_hook!(envp, |e| real!(c"execvpe", FnExecve)(file, argv, e))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    exec_hook!(envp, |e| real!(c"fexecve", FnFexecve)(fd, argv, e))
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
