//! poll/ppoll/select/pselect over any mix of canal and ordinary descriptors.
//!
//! Loop { canal readiness from the socket entries; ordinary descriptors by a real
//! poll with timeout 0 } for a bounded budget, then sleep in one real ppoll on [the
//! ordinary descriptors + the slot's eventfd + the control socket] with the remaining
//! timeout, after publishing sleep=EVENTS for any socket (§6).

use crate::conn::guest::Guest;
use crate::fdtable::{Entry, TABLE};
use crate::ready::{self, mask};
use crate::sock::core::Sock;
use crate::sys;
use canal_abi::WAIT_ANY;
use libc::{c_short, pollfd};

const STACK_FDS: usize = 64;

/// Ordinary descriptors are polled for real on the first round and then every
/// ORDINARY_EVERY rounds of the spin phase (each check is a system call).
const ORDINARY_EVERY: u32 = 64;

/// Canal readiness for one descriptor (`None`: not a canal descriptor).
fn canal_revents(g: &'static Guest, fd: i32, events: c_short) -> Option<c_short> {
    let h = match TABLE.get(fd)? {
        Entry::Canal(h) => h,
        // An epoll fd watching canal sockets: readable when it has an event.
        Entry::Epoll => return Some(crate::mux::epoll::poll_revents(g, fd, events)),
        Entry::Internal | Entry::Bridged(_) | Entry::Undecided(_) => return None,
    };
    if crate::conn::guest::is_dead(g) {
        return Some(mask(crate::sock::dead::readiness(g, h), events));
    }
    Some(match Sock::new(g, h) {
        Ok(s) => mask(crate::sock::native::readiness(&s), events),
        Err(_) => libc::POLLNVAL,
    })
}

/// Fills revents of the canal entries of `fds`; returns how many are ready.
fn scan_canal(g: &'static Guest, fds: &mut [pollfd]) -> usize {
    let mut n = 0;
    for p in fds.iter_mut() {
        if p.fd < 0 {
            continue;
        }
        if let Some(r) = canal_revents(g, p.fd, p.events) {
            p.revents = r;
            if r != 0 {
                n += 1;
            }
        }
    }
    n
}

/// Whether any entry is a canal descriptor.
pub(crate) fn has_canal(fds: &[pollfd]) -> bool {
    fds.iter().any(|p| p.fd >= 0 && special(p.fd))
}

/// A canal socket, or an epoll fd watching canal sockets.
fn special(fd: i32) -> bool {
    matches!(TABLE.get(fd), Some(Entry::Canal(_) | Entry::Epoll))
}

/// The poll core. `timeout_ns`: None = forever. Returns the number of ready entries.
pub(crate) fn poll(
    g: &'static Guest,
    fds: &mut [pollfd],
    timeout_ns: Option<i64>,
    sigmask: sys::SigMask,
) -> Result<usize, i32> {
    let n = fds.len();
    let mut stack = [pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; STACK_FDS];
    let mut heap: Vec<pollfd> = Vec::new();
    let work: &mut [pollfd] = if n + 2 <= STACK_FDS {
        &mut stack[..n + 2]
    } else {
        heap.resize(
            n + 2,
            pollfd {
                fd: -1,
                events: 0,
                revents: 0,
            },
        );
        &mut heap
    };
    // Ordinary entries are copied; canal ones become -1 (ignored by the kernel). An
    // epoll fd watching canal sockets stays (its real part wakes the sleep) and is
    // also evaluated by scan_canal.
    let mut ordinary = 0;
    // One canal socket and no epoll set among the descriptors (a blocking call with a
    // timeout, as Python's and Go's runtimes make): sleep on that socket alone, so
    // canald wakes this thread for its changes only, not for every socket's (WAIT_ANY
    // wakes every such sleeper on any change: hundreds of threads each polling its
    // own socket would all wake for each one's reply).
    let mut wait_on: Option<u32> = None;
    let mut any = false;
    let mut nested = false;
    for p in fds.iter().filter(|p| p.fd >= 0) {
        match TABLE.get(p.fd) {
            Some(Entry::Canal(h)) if wait_on.is_none_or(|w| w == canal_abi::handle_index(h)) => {
                wait_on = Some(canal_abi::handle_index(h));
            }
            Some(Entry::Canal(_)) => any = true,
            Some(Entry::Epoll) => (any, nested) = (true, true),
            _ => {}
        }
    }
    let wait_on = if any {
        WAIT_ANY
    } else {
        wait_on.unwrap_or(WAIT_ANY)
    };
    for (w, p) in work.iter_mut().zip(fds.iter()) {
        let canal = p.fd >= 0 && TABLE.handle(p.fd).is_some();
        *w = pollfd {
            fd: if canal { -1 } else { p.fd },
            events: p.events,
            revents: 0,
        };
        if !canal && p.fd >= 0 {
            ordinary += 1;
        }
    }
    let deadline = timeout_ns.map(|t| sys::now_ns().saturating_add(t));
    let mut round = 0u32;
    let budget = crate::notify::spin_iters(&g.wait);
    let t0 = if crate::notify::adaptive(&g.wait) {
        sys::now_ns()
    } else {
        0
    };
    let mut signals = crate::mux::pollwait::SignalWindow::new();
    crate::conn::sleep::new_wait();
    loop {
        // Check everything without blocking.
        let mut ready = 0;
        if ordinary > 0 && (round.is_multiple_of(ORDINARY_EVERY) || round >= budget) {
            ready += sys::ppoll(&mut work[..n], Some(0), sys::SigMask::NONE)?;
        }
        ready += scan_canal(g, fds);
        if ready > 0 || timeout_ns == Some(0) {
            if ready > 0 && t0 != 0 {
                crate::notify::record(&g.wait, sys::now_ns() - t0);
            }
            copy_ordinary(fds, work, n);
            return Ok(count(fds));
        }
        let now = sys::now_ns();
        if deadline.is_some_and(|d| now >= d) {
            copy_ordinary(fds, work, n);
            return Ok(0);
        }
        if round < budget {
            round += 1;
            canal_abi::sync::spin_hint();
            if round.is_multiple_of(crate::notify::POLL_YIELD_EVERY)
                && g.wait.mode == crate::notify::Mode::Poll
            {
                round = 0; // poll mode: the budget never runs out
                signals.yield_point(sigmask)?;
            }
            continue;
        }
        // Sleep.
        let remaining = deadline.map(|d| d - now);
        // Several canal sockets and no epoll set: those are all it waits on.
        let listed: Vec<u32> = if wait_on == WAIT_ANY && !nested {
            fds.iter()
                .filter_map(|p| TABLE.handle(p.fd))
                .map(canal_abi::handle_index)
                .collect()
        } else {
            Vec::new()
        };
        for w in work[..n].iter_mut() {
            w.revents = 0;
        }
        let twins = crate::sock::native::poll_twins(g, fds, &mut work[..n]);
        let mut cond = || scan_canal(g, fds) > 0;
        let scope = crate::conn::sleep::Scope::listed_or(&listed, wait_on);
        let r = crate::conn::sleep::sleep_ready_in(g, scope, remaining, &mut cond, work, sigmask);
        if twins {
            crate::sock::native::unpoll_twins(fds, &mut work[..n]);
        }
        match r {
            Err(libc::EINTR) => return Err(libc::EINTR),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let ord_ready = work[..n]
            .iter()
            .filter(|w| w.fd >= 0 && w.revents != 0)
            .count();
        let canal_ready = scan_canal(g, fds);
        if ord_ready + canal_ready > 0 {
            if t0 != 0 {
                crate::notify::record_wait(&g.wait, sys::now_ns() - t0, true);
            }
            copy_ordinary(fds, work, n);
            return Ok(count(fds));
        }
        // Spurious wake-up (another socket changed): check the clock and sleep again
        // without a new spin phase.
    }
}

fn copy_ordinary(fds: &mut [pollfd], work: &[pollfd], n: usize) {
    for (p, w) in fds.iter_mut().zip(&work[..n]) {
        if w.fd >= 0 && TABLE.get(p.fd) == Some(Entry::Epoll) {
            // Real part and canal part (set by scan_canal) together.
            p.revents |= w.revents;
        } else if w.fd >= 0 {
            p.revents = w.revents;
        } else if p.fd < 0 {
            p.revents = 0;
        }
    }
}

fn count(fds: &[pollfd]) -> usize {
    fds.iter().filter(|p| p.fd >= 0 && p.revents != 0).count()
}

// ---- select ------------------------------------------------------------------------------

fn fd_isset(set: *const libc::fd_set, fd: i32) -> bool {
    if set.is_null() {
        return false;
    }
    // SAFETY: set points to an fd_set (FD_SETSIZE bits) and fd < FD_SETSIZE (checked by
    // the caller), as the application promised when it passed nfds.
    unsafe { libc::FD_ISSET(fd, set) }
}

/// Whether any descriptor of the three sets (below nfds) is a canal socket.
pub(crate) fn select_has_canal(
    nfds: i32,
    r: *const libc::fd_set,
    w: *const libc::fd_set,
    e: *const libc::fd_set,
) -> bool {
    let nfds = nfds.clamp(0, libc::FD_SETSIZE as i32);
    (0..nfds).any(|fd| (fd_isset(r, fd) || fd_isset(w, fd) || fd_isset(e, fd)) && special(fd))
}

/// select/pselect through the poll core. Returns the number of bits set.
pub(crate) fn select(
    g: &'static Guest,
    nfds: i32,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout_ns: Option<i64>,
    sigmask: sys::SigMask,
) -> Result<usize, i32> {
    if nfds < 0 {
        return Err(libc::EINVAL);
    }
    let nfds = nfds.min(libc::FD_SETSIZE as i32);
    let mut pfds: Vec<pollfd> = Vec::new();
    for fd in 0..nfds {
        let (ir, iw, ie) = (fd_isset(r, fd), fd_isset(w, fd), fd_isset(e, fd));
        if ir || iw || ie {
            pfds.push(pollfd {
                fd,
                events: ready::select_events(ir, iw, ie),
                revents: 0,
            });
        }
    }
    let res = poll(g, &mut pfds, timeout_ns, sigmask)?;
    if pfds.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
        return Err(libc::EBADF);
    }
    // SAFETY: the sets are the application's fd_sets (or null, skipped).
    unsafe {
        for set in [r, w, e] {
            if !set.is_null() {
                for fd in 0..nfds {
                    libc::FD_CLR(fd, set);
                }
            }
        }
    }
    let mut bits = 0;
    if res > 0 {
        for p in &pfds {
            let (rr, ww, ee) = ready::select_result(p.revents);
            for (want, set, ev) in [
                (rr, r, libc::POLLIN),
                (ww, w, libc::POLLOUT),
                (ee, e, libc::POLLPRI),
            ] {
                if want && !set.is_null() && p.events & ev != 0 {
                    // SAFETY: p.fd < nfds <= FD_SETSIZE; set is the application's.
                    unsafe { libc::FD_SET(p.fd, set) };
                    bits += 1;
                }
            }
        }
    }
    Ok(bits)
}
