//! How a thread blocked in accept() sleeps on a listener whose native clients this
//! process takes from its twin (`sock::native`): so that one native client wakes one
//! of the threads blocked there, as the kernel's accept does, not all of them.
//!
//! poll(2) never waits exclusively: with every blocked thread polling the twin, each
//! client woke them all (16 Python threads in accept: 12-15 wake-ups per connection
//! against the kernel's 1, at half its rate). epoll's EPOLLEXCLUSIVE wakes one of the
//! instances attached to a file, but counts a wake-up as taken only where a thread
//! waits in epoll_wait on that instance (the kernel's ep_poll_callback): a ppoll on an
//! epoll descriptor is not enough. So each slot of this process keeps an epoll
//! instance of its own, holding the slot's wake-up port (canald's and peers' wake-ups,
//! one per connection with ACCEPT_ONE) and canald's pidfd; a sleep adds the twin with
//! EPOLLEXCLUSIVE, waits in epoll_pwait2 and takes the twin out again. Every
//! process's twin is the same file (canald's host listener), so the choice spans the
//! guest's processes too.
//!
//! The instance is one of the library's descriptors (lifted, hidden, moved when the
//! program dup2s onto its number). A wait on it runs inside `ownfd::using`, so a move
//! cannot hand the sleep the program's own epoll instance (whose events it would take);
//! a mover wakes such sleepers (`nudge`) rather than wait out their sleep.
use crate::conn::guest::death_pollfd;
use crate::conn::guest::Guest;
use crate::conn::slots::forget_sleep_instance;
use crate::conn::slots::slot_efd;
use crate::conn::slots::wake_slot;
use crate::conn::slots::SLOT_EP;
use crate::sys;
use core::sync::atomic::Ordering;
use libc::c_int;

/// The listener a sleep in accept() names: its handle, and how to find this
/// process's twin of it now (the twin may move: ownfd.rs). A function, not a call
/// into `sock::native`, which itself waits through this module.
#[derive(Clone, Copy)]
pub(crate) struct Twin {
    pub(crate) handle: u32,
    pub(crate) fd_of: fn(u32) -> Option<c_int>,
}

/// Event data of the instance's three members: which of the sleep's entries it is.
const TWIN_TAG: u64 = 0x6361_6e61_6c00_0000;
const PORT_TAG: u64 = TWIN_TAG + 1;
const DEATH_TAG: u64 = TWIN_TAG + 2;

thread_local! {
    /// Whether the calling thread's last sleep here was ended by the twin (a native
    /// client chose it): if its accept then takes something else, another sleeper
    /// is woken for the client (`pass_on`).
    static TWIN_WOKE: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

fn ctl(ep: c_int, op: c_int, fd: c_int, events: u32, tag: u64) -> Result<(), i32> {
    let mut ev = libc::epoll_event { events, u64: tag };
    // SAFETY: ev is a live local the kernel reads (and ignores for DEL).
    sys::check(unsafe {
        sys::raw_syscall!(
            libc::SYS_epoll_ctl,
            ep as libc::c_long,
            op as libc::c_long,
            fd as libc::c_long,
            &mut ev as *mut libc::epoll_event,
        )
    })
    .map(|_| ())
}

/// Slot `idx`'s instance, made on its first sleep here: None where it cannot be (no
/// port or pidfd to hold, no descriptor to be had, or a confined process).
fn instance(g: &Guest, idx: u32) -> Option<c_int> {
    let held = SLOT_EP.get(idx as usize)?;
    let ep = held.load(Ordering::SeqCst);
    if ep >= 0 {
        return Some(ep);
    }
    // SAFETY: no pointer arguments.
    let made = unsafe { sys::raw_syscall!(libc::SYS_epoll_create1, libc::EPOLL_CLOEXEC) };
    if made < 0 {
        return None;
    }
    let ep = crate::ownfd::adopt(made as c_int);
    // The port and the pidfd as they are now, read where no move can slip in between.
    let filled = crate::ownfd::using(|| {
        let (port, death) = (slot_efd(idx), death_pollfd(g).fd);
        if port < 0 || death < 0 {
            return Err(libc::EBADF);
        }
        ctl(
            ep,
            libc::EPOLL_CTL_ADD,
            port,
            libc::EPOLLIN as u32,
            PORT_TAG,
        )?;
        ctl(
            ep,
            libc::EPOLL_CTL_ADD,
            death,
            libc::EPOLLIN as u32,
            DEATH_TAG,
        )
    });
    if filled.is_err() {
        crate::ownfd::close_own(ep);
        return None;
    }
    held.store(ep, Ordering::SeqCst);
    crate::ownfd::readers_may_sleep(nudge);
    Some(ep)
}

/// One sleep of a thread blocked in accept() on `twin`'s listener, in place of
/// `ppoll(fds)`: `fds` is [twin, the slot's port, canald's pidfd], and gets their
/// revents as a ppoll would. None: this sleep cannot be made here (the caller polls).
pub(crate) fn sleep(
    g: &Guest,
    idx: u32,
    twin: Twin,
    fds: &mut [libc::pollfd],
    timeout_ns: Option<i64>,
    sigmask: sys::SigMask,
) -> Option<Result<usize, i32>> {
    if fds.len() != 3 || fds[1].fd < 0 || fds[2].fd < 0 || sys::confined() {
        return None;
    }
    instance(g, idx)?;
    let twin_op = |op: c_int| {
        crate::ownfd::using(|| {
            let fd = (twin.fd_of)(twin.handle).ok_or(libc::EBADF)?;
            let ev = (libc::EPOLLIN | libc::EPOLLEXCLUSIVE) as u32;
            ctl(ep_now(idx)?, op, fd, ev, TWIN_TAG)
        })
    };
    match twin_op(libc::EPOLL_CTL_ADD) {
        Ok(()) | Err(libc::EEXIST) => {}
        Err(_) => return None,
    }
    let mut out = [libc::epoll_event { events: 0, u64: 0 }; 3];
    let r = crate::ownfd::using(|| wait(ep_now(idx)?, &mut out, timeout_ns, sigmask));
    if twin_op(libc::EPOLL_CTL_DEL).is_err() {
        // The twin closed or moved while we slept: its registration would outlive
        // this sleep (and take exclusive wake-ups meant for other threads). A new
        // instance next time.
        forget_sleep_instance(idx);
    }
    let n = match r {
        Ok(n) => n,
        Err(e) => return Some(Err(e)),
    };
    for f in fds.iter_mut() {
        f.revents = 0;
    }
    let mut woke_by_twin = false;
    for ev in &out[..n] {
        let at = match ev.u64 {
            TWIN_TAG => 0,
            PORT_TAG => 1,
            DEATH_TAG => 2,
            _ => continue,
        };
        woke_by_twin |= at == 0;
        fds[at].revents = (ev.events & 0xffff) as libc::c_short;
    }
    let _ = TWIN_WOKE.try_with(|w| w.set(woke_by_twin));
    Some(Ok(n))
}

/// Slot `idx`'s instance as published now (it may have moved), inside `using`.
fn ep_now(idx: u32) -> Result<c_int, i32> {
    let ep = SLOT_EP
        .get(idx as usize)
        .map_or(-1, |a| a.load(Ordering::SeqCst));
    if ep < 0 {
        Err(libc::EBADF)
    } else {
        Ok(ep)
    }
}

/// epoll_pwait2 (epoll_pwait with a millisecond timeout on a kernel before 5.11).
fn wait(
    ep: c_int,
    out: &mut [libc::epoll_event],
    timeout_ns: Option<i64>,
    sigmask: sys::SigMask,
) -> Result<usize, i32> {
    let ts = timeout_ns.map(|ns| sys::timespec_of(ns.max(0)));
    let tsp = ts
        .as_ref()
        .map_or(core::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: out is writable for out.len() events; tsp is null or a live timespec;
    // the mask is null or the caller's sigset (the kernel's size, 8).
    let r = sys::check(unsafe {
        sys::raw_syscall!(
            libc::SYS_epoll_pwait2,
            ep as libc::c_long,
            out.as_mut_ptr(),
            out.len() as libc::c_long,
            tsp,
            sigmask.0,
            8usize,
        )
    });
    if r != Err(libc::ENOSYS) {
        return r;
    }
    // SAFETY: as above, with a millisecond timeout.
    sys::check(unsafe {
        sys::raw_syscall!(
            libc::SYS_epoll_pwait,
            ep as libc::c_long,
            out.as_mut_ptr(),
            out.len() as libc::c_long,
            sys::ns_ms(timeout_ns) as libc::c_long,
            sigmask.0,
            8usize,
        )
    })
}

/// Whether the calling thread's last sleep here ended with a native client's
/// wake-up (and forgets it).
pub(crate) fn woken_by_twin() -> bool {
    TWIN_WOKE.try_with(|w| w.replace(false)).unwrap_or(false)
}

/// The kernel chose the calling thread for a native client, but its accept took
/// something else: wakes another thread of this process asleep in accept() on
/// socket `index` (the kernel's next choice would have been one; it re-checks the
/// twin as it sleeps again). Threads of other processes re-check within their
/// sleep's bound (a second).
pub(crate) fn pass_on(g: &Guest, index: u32) {
    let me = crate::conn::slots::my_slot_index();
    let wanted = index | canal_abi::WAIT_ACCEPT;
    let used = g.region.header().slots_used.load(Ordering::Relaxed);
    for idx in 0..used {
        // Only this process's slots that have slept here have an instance: the
        // others' eventfds are not ours to write.
        if Some(idx) == me || ep_now(idx).is_err() {
            continue;
        }
        let Some(s) = g.region.slot(idx) else {
            continue;
        };
        if s.sleep.load(Ordering::Relaxed) == canal_abi::sleep_kind::EVENTS
            && s.wait_socket.load(Ordering::Relaxed) == wanted
        {
            wake_slot(idx);
            return;
        }
    }
}

/// A mover waits for readers inside `ownfd::using`: wakes this process's threads
/// asleep here (their next sleep starts anew, after the move).
pub(crate) fn nudge() {
    for (idx, a) in SLOT_EP.iter().enumerate() {
        if a.load(Ordering::Relaxed) >= 0 {
            wake_slot(idx as u32);
        }
    }
}
