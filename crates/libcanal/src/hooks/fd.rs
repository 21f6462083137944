//! Hooks of descriptor bookkeeping: close, close_range, closefrom, dup*, fcntl, ioctl.
use crate::cmd::fcntl_action;
use crate::cmd::FcntlAction;
use crate::fdtable::Entry;
use crate::fdtable::FdTable;
use crate::fdtable::TABLE;
use crate::fdtable::TABLE_LEN;
use crate::hooks::common::canal;
use crate::hooks::common::dispatch;
use crate::hooks::common::run;
use crate::hooks::common::FnInt;
use crate::hooks::common::FnIntInt;
use crate::hooks::common::Reentry;
use crate::hooks::exec::vfork_child;
use crate::sock::core::Sock;
use crate::sys;
use crate::sys::real;
use libc::c_int;
use libc::c_uint;
use libc::c_ulong;
use libc::c_void;
use std::panic::catch_unwind;
use std::panic::AssertUnwindSafe;

type FnFcntl = unsafe extern "C" fn(c_int, c_int, c_ulong) -> c_int;

type FnIoctl = unsafe extern "C" fn(c_int, c_ulong, *mut c_void) -> c_int;

type FnDup3 = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;

type FnCloseRange = unsafe extern "C" fn(c_uint, c_uint, c_int) -> c_int;

type FnCloseFrom = unsafe extern "C" fn(c_int);

/// close_range: canal descriptors in the range are released as by close(); the
/// library's own descriptors are skipped (the range is split around them). With
/// CLOSE_RANGE_CLOEXEC nothing is closed now and the call passes through.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let real = |a: c_uint, b: c_uint| {
        // SAFETY: forwarding to libc's close_range.
        unsafe { real!(c"close_range", FnCloseRange)(a, b, flags) }
    };
    if crate::conn::guest::guest().is_none()
        || vfork_child()
        || flags & (libc::CLOSE_RANGE_CLOEXEC as c_int) != 0
        || first > last
    {
        return real(first, last);
    }
    let Some(_g) = Reentry::enter() else {
        return real(first, last);
    };
    // No WATCH is put on these numbers while they close (sock/watch.rs).
    let _held = crate::sock::watch::hold();
    let mut canal_fds: Vec<(c_int, u32)> = Vec::new();
    let mut internal: Vec<c_uint> = Vec::new();
    let high = TABLE.high_water() as u64;
    for fd in (first as u64)..(last as u64 + 1).min(high) {
        match TABLE.get(fd as c_int) {
            Some(Entry::Canal(h)) => canal_fds.push((fd as c_int, h)),
            Some(Entry::Internal) => internal.push(fd as c_uint),
            Some(Entry::Epoll) => {
                TABLE.take(fd as c_int);
                crate::mux::epoll::forget_fd(fd as c_int);
            }
            Some(Entry::Bridged(_)) => {
                TABLE.take(fd as c_int);
            }
            Some(Entry::Undecided(_)) => crate::direct::settle_kernel(fd as c_int),
            None => {}
        }
    }
    let g = crate::conn::guest::guest();
    let mut asks: Vec<u32> = Vec::new();
    if let Some(g) = g {
        // A panic here must not unwind into C; the descriptors are closed regardless.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            for (fd, h) in canal_fds {
                if TABLE.take(fd).is_some() {
                    crate::mux::epoll::forget_fd(fd);
                    if crate::sock::close::release(g, h) {
                        asks.push(h);
                    }
                }
            }
        }));
    }
    let r = close_between(first, last, &internal, real);
    if let Some(g) = g {
        for h in asks {
            crate::sock::close::close_if_unheld(g, h);
        }
    }
    r
}

/// close_range's closing of `first..=last` in pieces around the library's own
/// descriptors (`internal`, ascending), which stay open.
fn close_between(
    first: c_uint,
    last: c_uint,
    internal: &[c_uint],
    real: impl Fn(c_uint, c_uint) -> c_int,
) -> c_int {
    let mut start = first;
    for &i in internal {
        if i > start {
            let r = real(start, i - 1);
            if r < 0 {
                return r;
            }
        }
        start = i.saturating_add(1);
        if i == c_uint::MAX {
            return 0;
        }
    }
    if start <= last {
        real(start, last)
    } else {
        0
    }
}

/// closefrom(lowfd) is close_range(lowfd, ~0, 0).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn closefrom(low: c_int) {
    if crate::conn::guest::guest().is_none() || vfork_child() {
        // SAFETY: forwarding to libc's closefrom.
        unsafe { real!(c"closefrom", FnCloseFrom)(low) };
        return;
    }
    // SAFETY: same contract.
    let r = unsafe { close_range(low.max(0) as c_uint, c_uint::MAX, 0) };
    if r < 0 {
        // closefrom cannot fail; glibc falls back to closing one by one.
        for fd in low.max(0)..(TABLE.high_water() as c_int) {
            // SAFETY: closing descriptors, as closefrom does.
            unsafe { close(fd) };
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    let w = TABLE.raw(fd);
    if w == 0 {
        // SAFETY: forwarding to libc's close.
        return unsafe { real!(c"close", FnInt)(fd) };
    }
    if vfork_child() {
        // SAFETY: forwarding to libc's close.
        return unsafe { real!(c"close", FnInt)(fd) };
    }
    match FdTable::<TABLE_LEN>::decode(w) {
        // The library's own descriptors (control socket, eventfds) stay open: code that
        // closes every descriptor it did not open (daemonising) must not cut us off.
        Some(Entry::Internal) => 0,
        Some(Entry::Epoll) => {
            if TABLE.take(fd).is_some() {
                crate::mux::epoll::forget_fd(fd);
            }
            // SAFETY: forwarding to libc's close.
            unsafe { real!(c"close", FnInt)(fd) }
        }
        Some(Entry::Canal(_)) => {
            let Some(_g) = Reentry::enter() else {
                // SAFETY: forwarding to libc's close.
                return unsafe { real!(c"close", FnInt)(fd) };
            };
            let _held = crate::sock::watch::hold();
            run(|| {
                let mut ask = None;
                if let Some(Entry::Canal(h)) = TABLE.take(fd) {
                    crate::mux::epoll::forget_fd(fd);
                    if let Some(g) = crate::conn::guest::guest() {
                        if crate::sock::close::release(g, h) {
                            ask = Some((g, h));
                        }
                    }
                }
                let r = sys::close(fd).map(|_| 0);
                if let Some((g, h)) = ask {
                    crate::sock::close::close_if_unheld(g, h);
                }
                r
            }) as c_int
        }
        Some(Entry::Bridged(_)) => {
            // A kernel socket: the bridge notices its last copy going.
            TABLE.take(fd);
            // SAFETY: forwarding to libc's close.
            unsafe { real!(c"close", FnInt)(fd) }
        }
        Some(Entry::Undecided(_)) => {
            crate::direct::settle_kernel(fd);
            // SAFETY: forwarding to libc's close.
            unsafe { real!(c"close", FnInt)(fd) }
        }
        // SAFETY: forwarding to libc's close.
        None => unsafe { real!(c"close", FnInt)(fd) },
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let r = dispatch!(fd, real!(c"dup", FnInt)(fd), |s| {
        let _held = crate::sock::watch::hold();
        let nfd = sys::fcntl_int(fd, libc::F_DUPFD, 0)? as c_int;
        install_dup(s, nfd)
    }) as c_int;
    copy_bridged(fd, r);
    r
}

/// A copy of a bridged descriptor is bridged too (its kernel file is the same); a
/// copy of an undecided one makes it the kernel's (direct.rs).
fn copy_bridged(old: c_int, new: c_int) {
    if new >= 0 && new != old {
        crate::direct::settle_kernel(old);
        if let Some(Entry::Bridged(h)) = TABLE.get(old) {
            let _ = TABLE.set_bridged(new, h);
        }
    }
}

fn install_dup(s: Sock, nfd: c_int) -> Result<isize, i32> {
    match TABLE.set_canal(nfd, s.handle) {
        Ok(prev) => {
            crate::sock::close::add_ref(s.g, s.handle);
            if let Some(Entry::Canal(old)) = prev {
                crate::sock::close::release_closed(s.g, old);
            }
            Ok(nfd as isize)
        }
        Err(e) => {
            let _ = sys::close(nfd);
            Err(e)
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    // SAFETY: forwarding to libc's dup3 / dup2 with the caller's arguments.
    unsafe { dup_common(old, new, 0, true) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { dup_common(old, new, flags, false) }
}

unsafe fn dup_common(old: c_int, new: c_int, flags: c_int, is_dup2: bool) -> c_int {
    let real = || {
        if is_dup2 {
            // SAFETY: forwarding to libc's dup2.
            unsafe { real!(c"dup2", FnIntInt)(old, new) }
        } else {
            // SAFETY: forwarding to libc's dup3.
            unsafe { real!(c"dup3", FnDup3)(old, new, flags) }
        }
    };
    let (wo, wn) = (TABLE.raw(old), TABLE.raw(new));
    if (wo == 0 && wn == 0) || vfork_child() {
        return real();
    }
    let Some(_g) = Reentry::enter() else {
        return real();
    };
    let _held = crate::sock::watch::hold();
    if TABLE.get(new) == Some(Entry::Internal) && old != new {
        // The program wants this number: ours moves away first (never EBUSY).
        if let Err(e) = make_room(new) {
            sys::set_errno(e);
            return -1;
        }
    }
    run(|| {
        let r = real();
        if r < 0 {
            return Err(sys::errno());
        }
        if old == new {
            return Ok(r as isize);
        }
        if wn != 0 {
            // Whatever `new` was (a canal socket, an epoll set) left every epoll set.
            crate::mux::epoll::forget_fd(new);
        }
        // `new` was closed by the kernel; whatever it was, it now is what `old` is.
        let g = crate::conn::guest::guest();
        match (canal(old), g) {
            (Some(h), Some(g)) => {
                let s = Sock::new(g, h)?;
                let r = install_dup(s, new)?;
                if (0..=2).contains(&new) {
                    // A connection becoming a standard stream is about to be used through
                    // stdio (bash's builtins, printf...), which the hooks never see:
                    // carry it on a kernel socket from now on (bridge.rs).
                    crate::bridge::bridge_if_connected(g, new, h);
                }
                Ok(r)
            }
            _ => {
                crate::direct::settle_kernel(new);
                if let (Some(Entry::Canal(h)), Some(g)) = (TABLE.take(new), g) {
                    crate::sock::close::release_closed(g, h);
                }
                copy_bridged(old, new);
                Ok(r as isize)
            }
        }
    }) as c_int
}

/// Moves the library's descriptor at `fd` to another number, so that the program's
/// dup2/dup3 onto `fd` (which closes what is there) gets it. Every holder of the number
/// is pointed at the copy, and calls acting on the old number are waited out (ownfd.rs);
/// the control socket moves under the control lock, so no exchange is under way.
fn make_room(fd: c_int) -> Result<(), i32> {
    let g = crate::conn::guest::guest();
    let ctl = g.filter(|g| g.ctl() == fd);
    if let Some(g) = ctl {
        crate::conn::guest::ctl_lock(g);
    }
    let r = (|| {
        let new = match crate::ownfd::dup_high(fd) {
            Ok(n) => n,
            // Nothing free up there: anywhere else will do (visible, but working).
            Err(_) => sys::fcntl_int(fd, libc::F_DUPFD_CLOEXEC, 3)? as c_int,
        };
        let _ = TABLE.set_internal(new);
        // A descriptor no holder names (kept open only to keep its file alive, e.g.
        // VFIO's) simply lives at `new` from now on.
        let _ = g.is_some_and(|g| g.retarget(fd, new))
            || crate::conn::slots::retarget(fd, new)
            || crate::conn::pin::retarget_pin(fd, new)
            || crate::conn::ivshmem::retarget(fd, new)
            || crate::shortcut::bells::retarget(fd, new)
            || crate::bridge::retarget_token(fd, new)
            || crate::sock::watch::retarget_lone(fd, new)
            || crate::conn::guest::retarget_daemon_pidfd(fd, new)
            || crate::mux::epoll::retarget_kick(fd, new)
            || crate::sock::native::retarget(fd, new);
        crate::ownfd::wait_unused();
        // Our copy at `fd` is the program's to replace now.
        TABLE.take(fd);
        Ok(())
    })();
    if let Some(g) = ctl {
        crate::conn::guest::ctl_unlock(g);
    }
    r
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: same contract as fcntl.
    unsafe { fcntl_common(fd, cmd, arg, false) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: same contract as fcntl64.
    unsafe { fcntl_common(fd, cmd, arg, true) }
}

unsafe fn fcntl_common(fd: c_int, cmd: c_int, arg: c_ulong, is64: bool) -> c_int {
    let real = |cmd: c_int, arg: c_ulong| {
        if is64 {
            // SAFETY: forwarding the argument word unchanged (see cmd.rs).
            unsafe { real!(c"fcntl64", FnFcntl)(fd, cmd, arg) }
        } else {
            // SAFETY: as above.
            unsafe { real!(c"fcntl", FnFcntl)(fd, cmd, arg) }
        }
    };
    if let (Some(Entry::Bridged(_) | Entry::Undecided(_)), FcntlAction::Dup { .. }) =
        (TABLE.get(fd), fcntl_action(cmd, arg))
    {
        let r = real(cmd, arg);
        copy_bridged(fd, r);
        return r;
    }
    dispatch!(fd, real(cmd, arg), |s| {
        match fcntl_action(cmd, arg) {
            FcntlAction::GetFl => {
                let r = real(libc::F_GETFL, 0);
                if r < 0 {
                    return Err(sys::errno());
                }
                let nb = if s.nonblocking() { libc::O_NONBLOCK } else { 0 };
                Ok(((r & !libc::O_NONBLOCK) | nb) as isize)
            }
            FcntlAction::SetFl(v) => {
                s.set_nonblocking(v & libc::O_NONBLOCK != 0);
                // The dummy keeps the other flags (O_ASYNC etc. are not emulated) and
                // its own O_NONBLOCK (see crate::sock::watch::dummy).
                let keep = sys::fcntl_int(fd, libc::F_GETFL, 0).map_or(0, |f| f as c_int)
                    & libc::O_NONBLOCK;
                let r = real(libc::F_SETFL, ((v & !libc::O_NONBLOCK) | keep) as c_ulong);
                if r < 0 {
                    return Err(sys::errno());
                }
                Ok(0)
            }
            FcntlAction::Dup { .. } => {
                let _held = crate::sock::watch::hold();
                let r = real(cmd, arg);
                if r < 0 {
                    return Err(sys::errno());
                }
                install_dup(s, r)
            }
            FcntlAction::PassThrough => {
                let r = real(cmd, arg);
                if r < 0 {
                    Err(sys::errno())
                } else {
                    Ok(r as isize)
                }
            }
        }
    }) as c_int
}

/// SIOCOUTQNSD from linux/sockios.h (SIOCOUTQ is TIOCOUTQ's number).
const SIOCOUTQNSD: c_ulong = 0x894b;
/// SIOCATMARK from asm/sockios.h.
const SIOCATMARK: c_ulong = 0x8905;

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    dispatch!(fd, real!(c"ioctl", FnIoctl)(fd, req, arg), |s| {
        match req {
            libc::FIONBIO => {
                if arg.is_null() {
                    return Err(libc::EFAULT);
                }
                // SAFETY: FIONBIO takes an int*.
                let on = unsafe { *(arg as *const c_int) } != 0;
                s.set_nonblocking(on);
                Ok(0)
            }
            libc::FIONREAD => {
                if arg.is_null() {
                    return Err(libc::EFAULT);
                }
                let n = crate::sock::control::fionread(s)?;
                // SAFETY: FIONREAD takes an int* out-parameter.
                unsafe { *(arg as *mut c_int) = n };
                Ok(0)
            }
            libc::TIOCOUTQ | SIOCOUTQNSD => {
                if arg.is_null() {
                    return Err(libc::EFAULT);
                }
                let n = crate::sock::control::outq(s, req == SIOCOUTQNSD)?;
                // SAFETY: SIOCOUTQ (TIOCOUTQ's number) and SIOCOUTQNSD take an int*.
                unsafe { *(arg as *mut c_int) = n };
                Ok(0)
            }
            SIOCATMARK => match s.kind() {
                // UDP has no urgent data and no such ioctl.
                canal_abi::sock_kind::DGRAM => Err(libc::ENOTTY),
                _ if arg.is_null() => Err(libc::EFAULT),
                _ => {
                    // canal carries no urgent data (MSG_OOB is refused), so a TCP
                    // socket is never at the mark: 0, as the kernel answers without it.
                    // SAFETY: SIOCATMARK takes an int* out-parameter.
                    unsafe { *(arg as *mut c_int) = 0 };
                    Ok(0)
                }
            },
            _ => {
                // SAFETY: other requests act on the dummy descriptor.
                let r = unsafe { real!(c"ioctl", FnIoctl)(fd, req, arg) };
                if r < 0 {
                    Err(sys::errno())
                } else {
                    Ok(r as isize)
                }
            }
        }
    }) as c_int
}

// ---- poll / select -------------------------------------------------------------------------------
