//! Hooks of readiness: poll, ppoll, select, pselect, epoll_*.
use crate::fdtable::Entry;
use crate::fdtable::FdTable;
use crate::fdtable::TABLE;
use crate::fdtable::TABLE_LEN;
use crate::hooks::common::chk_fail;
use crate::hooks::common::run;
use crate::hooks::common::Reentry;
use crate::sys;
use crate::sys::real;
use libc::c_int;
use libc::nfds_t;
use libc::pollfd;
use libc::size_t;

type FnPoll = unsafe extern "C" fn(*mut pollfd, nfds_t, c_int) -> c_int;

type FnPpoll = unsafe extern "C" fn(
    *mut pollfd,
    nfds_t,
    *const libc::timespec,
    *const libc::sigset_t,
) -> c_int;

type FnSelect = unsafe extern "C" fn(
    c_int,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *mut libc::timeval,
) -> c_int;

type FnPselect = unsafe extern "C" fn(
    c_int,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *const libc::timespec,
    *const libc::sigset_t,
) -> c_int;

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut pollfd,
    nfds: nfds_t,
    timeout: c_int,
    fdslen: size_t,
) -> c_int {
    if fdslen / core::mem::size_of::<pollfd>() < nfds as usize {
        chk_fail();
    }
    // SAFETY: same contract as poll.
    unsafe { poll(fds, nfds, timeout) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut pollfd,
    nfds: nfds_t,
    ts: *const libc::timespec,
    ss: *const libc::sigset_t,
    fdslen: size_t,
) -> c_int {
    if fdslen / core::mem::size_of::<pollfd>() < nfds as usize {
        chk_fail();
    }
    // SAFETY: same contract as ppoll.
    unsafe { ppoll(fds, nfds, ts, ss) }
}

// ---- descriptors -----------------------------------------------------------------------------

fn pollfds<'a>(fds: *mut pollfd, nfds: nfds_t) -> &'a mut [pollfd] {
    if fds.is_null() || nfds == 0 {
        return &mut [];
    }
    // SAFETY: the application passes `nfds` pollfds at `fds`.
    unsafe { core::slice::from_raw_parts_mut(fds, nfds as usize) }
}

pub(crate) fn ts_ns(ts: *const libc::timespec) -> Result<Option<i64>, i32> {
    if ts.is_null() {
        return Ok(None);
    }
    // SAFETY: the application's timespec.
    let t = unsafe { *ts };
    if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
        return Err(libc::EINVAL);
    }
    Ok(Some(
        t.tv_sec
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec),
    ))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    let real = || {
        // SAFETY: forwarding to libc's poll.
        unsafe { real!(c"poll", FnPoll)(fds, nfds, timeout) }
    };
    let Some(g) = crate::conn::guest::guest() else {
        return real();
    };
    let set = pollfds(fds, nfds);
    if !crate::mux::poll::has_canal(set) {
        return real();
    }
    let Some(_r) = Reentry::enter() else {
        return real();
    };
    let t = if timeout < 0 {
        None
    } else {
        Some(timeout as i64 * 1_000_000)
    };
    run(|| crate::mux::poll::poll(g, set, t, sys::SigMask::NONE).map(|n| n as isize)) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    nfds: nfds_t,
    ts: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let real = || {
        // SAFETY: forwarding to libc's ppoll.
        unsafe { real!(c"ppoll", FnPpoll)(fds, nfds, ts, sigmask) }
    };
    let Some(g) = crate::conn::guest::guest() else {
        return real();
    };
    let set = pollfds(fds, nfds);
    if !crate::mux::poll::has_canal(set) {
        return real();
    }
    let Some(_r) = Reentry::enter() else {
        return real();
    };
    run(|| crate::mux::poll::poll(g, set, ts_ns(ts)?, sys::SigMask(sigmask)).map(|n| n as isize))
        as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn select(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    tv: *mut libc::timeval,
) -> c_int {
    let real = || {
        // SAFETY: forwarding to libc's select.
        unsafe { real!(c"select", FnSelect)(nfds, r, w, e, tv) }
    };
    let Some(g) = crate::conn::guest::guest() else {
        return real();
    };
    if !crate::mux::poll::select_has_canal(nfds, r, w, e) {
        return real();
    }
    let Some(_r) = Reentry::enter() else {
        return real();
    };
    run(|| {
        let t = if tv.is_null() {
            None
        } else {
            // SAFETY: the application's timeval.
            let t = unsafe { *tv };
            if t.tv_sec < 0 || !(0..1_000_000).contains(&t.tv_usec) {
                return Err(libc::EINVAL);
            }
            Some(
                t.tv_sec
                    .saturating_mul(1_000_000_000)
                    .saturating_add(t.tv_usec * 1000),
            )
        };
        let start = sys::now_ns();
        let res = crate::mux::poll::select(g, nfds, r, w, e, t, sys::SigMask::NONE);
        if let (Some(t), false) = (t, tv.is_null()) {
            // Linux updates the timeout to the time not slept.
            let left = (t - (sys::now_ns() - start)).max(0);
            // SAFETY: the application's timeval.
            unsafe {
                (*tv).tv_sec = (left / 1_000_000_000) as libc::time_t;
                (*tv).tv_usec = ((left % 1_000_000_000) / 1000) as libc::suseconds_t;
            }
        }
        res.map(|n| n as isize)
    }) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pselect(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    ts: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let real = || {
        // SAFETY: forwarding to libc's pselect.
        unsafe { real!(c"pselect", FnPselect)(nfds, r, w, e, ts, sigmask) }
    };
    let Some(g) = crate::conn::guest::guest() else {
        return real();
    };
    if !crate::mux::poll::select_has_canal(nfds, r, w, e) {
        return real();
    }
    let Some(_r) = Reentry::enter() else {
        return real();
    };
    run(|| {
        crate::mux::poll::select(g, nfds, r, w, e, ts_ns(ts)?, sys::SigMask(sigmask))
            .map(|n| n as isize)
    }) as c_int
}

// ---- sendfile -----------------------------------------------------------------------------

type FnEpollCtl = unsafe extern "C" fn(c_int, c_int, c_int, *mut libc::epoll_event) -> c_int;

type FnEpollWait = unsafe extern "C" fn(c_int, *mut libc::epoll_event, c_int, c_int) -> c_int;

type FnEpollPwait = unsafe extern "C" fn(
    c_int,
    *mut libc::epoll_event,
    c_int,
    c_int,
    *const libc::sigset_t,
) -> c_int;

type FnEpollPwait2 = unsafe extern "C" fn(
    c_int,
    *mut libc::epoll_event,
    c_int,
    *const libc::timespec,
    *const libc::sigset_t,
) -> c_int;

/// epoll_ctl: a canal socket (or an epoll fd watching canal sockets) goes to the
/// library's interest list (`epoll.rs`); everything else to the kernel.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut libc::epoll_event,
) -> c_int {
    let real = || {
        // SAFETY: forwarding the caller's arguments to libc's epoll_ctl.
        unsafe { real!(c"epoll_ctl", FnEpollCtl)(epfd, op, fd, ev) }
    };
    let w = TABLE.raw(fd);
    // No vfork-child check here (a getpid system call per call, and event loops such
    // as redis-benchmark call epoll_ctl several times per request): a vfork child that
    // changes an epoll set changes the instance its parent shares, as in the kernel.
    if w == 0 {
        return real();
    }
    let nested = match FdTable::<TABLE_LEN>::decode(w) {
        Some(Entry::Canal(_)) => false,
        Some(Entry::Epoll) => true,
        Some(Entry::Undecided(_)) => {
            // The set holds the kernel socket: it stays the kernel's (direct.rs).
            crate::direct::settle_kernel(fd);
            return real();
        }
        _ => return real(),
    };
    let Some(_g) = Reentry::enter() else {
        return real();
    };
    let event = (!ev.is_null()).then(|| {
        // SAFETY: the application passes a readable epoll_event (or null).
        unsafe { core::ptr::read_unaligned(ev) }
    });
    run(|| match crate::mux::epoll::ctl(epfd, op, fd, event) {
        // An epoll fd registered for real before it watched canal sockets.
        Err(libc::ENOENT) if nested => {
            let r = real();
            if r < 0 {
                Err(sys::errno())
            } else {
                Ok(0)
            }
        }
        r => r.map(|_| 0),
    }) as c_int
}

/// The common part of the epoll waits on an epoll fd watching canal sockets.
fn epoll_wait_canal(
    epfd: c_int,
    events: *mut libc::epoll_event,
    maxevents: c_int,
    timeout_ns: Result<Option<i64>, i32>,
    sigmask: *const libc::sigset_t,
) -> c_int {
    run(|| {
        let g = crate::conn::guest::guest().ok_or(libc::EBADF)?;
        let max = maxevents as usize;
        if maxevents <= 0 || max > (i32::MAX as usize) / core::mem::size_of::<libc::epoll_event>() {
            return Err(libc::EINVAL);
        }
        if events.is_null() {
            return Err(libc::EFAULT);
        }
        let t = timeout_ns?;
        // SAFETY: the application passes room for maxevents events.
        let out = unsafe { core::slice::from_raw_parts_mut(events, max) };
        crate::mux::epoll::wait(g, epfd, out, t, sys::SigMask(sigmask)).map(|n| n as isize)
    }) as c_int
}

fn ms_ns(timeout: c_int) -> Option<i64> {
    (timeout >= 0).then(|| timeout as i64 * 1_000_000)
}

/// An epoll wait the kernel serves: a set that watched no canal socket when the wait
/// began (or a wait made from inside the library). `real(left)` is the kernel's wait for
/// at most `left` ns. The library's kicks are dropped from what it returns
/// (mux/kick.rs); if they were all of it, another thread gave the set its first canal
/// socket, and the wait goes on through the library for the rest of its timeout.
fn kernel_epoll_wait(
    epfd: c_int,
    events: *mut libc::epoll_event,
    maxevents: c_int,
    timeout_ns: Option<i64>,
    sigmask: *const libc::sigset_t,
    real: impl Fn(Option<i64>) -> c_int,
) -> c_int {
    // The clock only for a finite wait (not a clock read on every wait forever or for
    // nothing): a wait goes on only after a kick, for the time it has left.
    let t0 = if timeout_ns.is_some_and(|t| t > 0) {
        sys::now_ns()
    } else {
        0
    };
    let mut left = timeout_ns;
    loop {
        // Listed before the tag is looked at (mux/kick.rs); a wait that cannot sleep
        // needs no kick.
        let listed = (left != Some(0)).then(|| crate::mux::kick::KernelWait::begin(epfd));
        if listed.is_some() && TABLE.get(epfd) == Some(Entry::Epoll) {
            if let Some(_g) = Reentry::enter() {
                drop(listed);
                return epoll_wait_canal(epfd, events, maxevents, Ok(left), sigmask);
            }
        }
        let r = real(left);
        drop(listed);
        if let Some(r) = crate::mux::epoll::after_kernel_wait(events, r) {
            return r;
        }
        left = timeout_ns.map(|t| {
            if t > 0 {
                (t - (sys::now_ns() - t0)).max(0)
            } else {
                0
            }
        });
    }
}

/// Whether a wait on `epfd` goes through the library: the set watches canal sockets and
/// this is not a call from inside the library. The guard is held for the wait.
fn canal_wait(epfd: c_int) -> Option<Reentry> {
    (TABLE.get(epfd) == Some(Entry::Epoll))
        .then(Reentry::enter)
        .flatten()
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    events: *mut libc::epoll_event,
    maxevents: c_int,
    timeout: c_int,
) -> c_int {
    if let Some(_g) = canal_wait(epfd) {
        return epoll_wait_canal(
            epfd,
            events,
            maxevents,
            Ok(ms_ns(timeout)),
            core::ptr::null(),
        );
    }
    kernel_epoll_wait(
        epfd,
        events,
        maxevents,
        ms_ns(timeout),
        core::ptr::null(),
        |left| {
            // SAFETY: forwarding the caller's arguments to libc's epoll_wait.
            unsafe { real!(c"epoll_wait", FnEpollWait)(epfd, events, maxevents, sys::ns_ms(left)) }
        },
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    events: *mut libc::epoll_event,
    maxevents: c_int,
    timeout: c_int,
    sigmask: *const libc::sigset_t,
) -> c_int {
    if let Some(_g) = canal_wait(epfd) {
        return epoll_wait_canal(epfd, events, maxevents, Ok(ms_ns(timeout)), sigmask);
    }
    kernel_epoll_wait(epfd, events, maxevents, ms_ns(timeout), sigmask, |left| {
        // SAFETY: forwarding the caller's arguments to libc's epoll_pwait.
        unsafe {
            real!(c"epoll_pwait", FnEpollPwait)(epfd, events, maxevents, sys::ns_ms(left), sigmask)
        }
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    events: *mut libc::epoll_event,
    maxevents: c_int,
    ts: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    if let Some(_g) = canal_wait(epfd) {
        return epoll_wait_canal(epfd, events, maxevents, ts_ns(ts), sigmask);
    }
    let Ok(timeout_ns) = ts_ns(ts) else {
        // The kernel's own EINVAL for a bad timeout.
        // SAFETY: forwarding the caller's arguments to libc's epoll_pwait2.
        return unsafe {
            real!(c"epoll_pwait2", FnEpollPwait2)(epfd, events, maxevents, ts, sigmask)
        };
    };
    kernel_epoll_wait(epfd, events, maxevents, timeout_ns, sigmask, |left| {
        let t = left.map(sys::timespec_of);
        let tp = t
            .as_ref()
            .map_or(core::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: forwarding the caller's arguments, with the time left, to libc's
        // epoll_pwait2.
        unsafe { real!(c"epoll_pwait2", FnEpollPwait2)(epfd, events, maxevents, tp, sigmask) }
    })
}

// ---- exec -------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timespec_validation() {
        let ts = libc::timespec {
            tv_sec: 1,
            tv_nsec: 5,
        };
        assert_eq!(ts_ns(&ts), Ok(Some(1_000_000_005)));
        assert_eq!(ts_ns(core::ptr::null()), Ok(None));
        let bad = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000_000,
        };
        assert_eq!(ts_ns(&bad), Err(libc::EINVAL));
    }
}
