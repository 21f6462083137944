//! epoll over any mix of canal and ordinary descriptors.
//!
//! The kernel cannot watch a canal socket (its dummy descriptor never becomes ready), so
//! each epoll instance that watches canal sockets keeps their interest list here, in
//! process memory: one `Item` per (epoll fd, canal fd) with the requested events, the
//! user data, and the edge/one-shot state. Ordinary descriptors stay registered in the
//! real epoll instance. Such an epoll fd is tagged `Entry::Epoll` in the descriptor
//! table, so `epoll_wait` on an epoll fd without canal sockets costs one table load
//! before the real call.
//!
//! A wait loops { canal readiness from the socket entries (`ready.rs`); the real epoll
//! fd with timeout 0 } for the spin budget, then sleeps in one ppoll on [the real epoll
//! fd, nested epoll fds, the slot eventfd, the control socket] (`crate::conn::sleep::sleep_events`).
//!
//! Semantics per item, as the kernel's `ep_poll_callback`/`ep_send_events`:
//! - level-triggered: reported while `readiness & (events | ERR | HUP)` is non-zero;
//! - EPOLLET: reported when that mask is non-zero and the socket changed since the last
//!   report (the host's `event_seq` moved, or a bit appeared), and once right after
//!   ADD/MOD;
//! - EPOLLONESHOT: disarmed after one report until EPOLL_CTL_MOD;
//! - EPOLLEXCLUSIVE: accepted (every waiter of this process family may be woken);
//! - a canal descriptor leaves every set when it is closed (also by dup2 over it).
//!
//! Nesting: an epoll fd that watches canal sockets, added to another epoll fd, is kept
//! as a nested item of the outer one: it is reported EPOLLIN when the inner set has an
//! event (canal or real), and poll()/select() on it do the same (`poll.rs`).
//!
//! The interest lists are process memory: after fork the child has its own copy (the
//! kernel's is shared), and they do not survive exec (docs/compat.md).
//!
//! Which items a scan looks at — all of a small set, or (a large one) those the
//! guest's event log named — is `evset`'s business (protocol §8.6).

use crate::conn::guest::Guest;
use crate::fdtable::{Entry, TABLE};
use crate::mux::evset::{Item, Set, Target, EPOLLEXCLUSIVE};
use crate::sock::core::Sock;
use crate::sys;
use canal_abi::WAIT_ANY;
use libc::{c_int, epoll_event};

/// Ordinary descriptors are checked for real on the first round and then every
/// ORDINARY_EVERY rounds of the spin phase (each check is a system call).
const ORDINARY_EVERY: u32 = 64;
/// A hybrid wait's spin yields the CPU every this many rounds (see the loop).
const YIELD_EVERY: u32 = 16;

static SETS: crate::rt::Locked<Vec<Set>> = crate::rt::Locked::new(Vec::new());

/// Runs `f` on the sets with the lock held. `f` must not call back into this module.
fn with<R>(f: impl FnOnce(&mut Vec<Set>) -> R) -> R {
    SETS.with(f)
}

/// Fork prepare (`fork`): every set is shared from now on (`Set::shared`, in the
/// parent and the child); no thread may hold the sets across fork.
pub(crate) fn fork_prepare() {
    with(|sets| sets.iter_mut().for_each(|s| s.shared = true));
    SETS.hold();
}

pub(crate) fn fork_parent() {
    SETS.release();
}

pub(crate) fn fork_child() {
    // The child's only thread is the one that took the lock in fork_prepare.
    SETS.reset_after_fork();
    // Its copies of the sets watch the same connections and read the same log.
    with(|sets| sets.iter_mut().for_each(Set::forked));
}

/// Whether `fd` is an epoll instance: ours (tagged), or the kernel says so.
fn is_epoll(fd: c_int) -> Result<bool, i32> {
    if TABLE.get(fd) == Some(Entry::Epoll) {
        return Ok(true);
    }
    sys::fcntl_int(fd, libc::F_GETFD, 0)?;
    let path = format!("/proc/self/fd/{fd}\0");
    let mut buf = [0u8; 64];
    // SAFETY: path is NUL-terminated; buf is writable for its length.
    let r = unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_readlinkat,
            libc::AT_FDCWD as libc::c_long,
            path.as_ptr(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    let Ok(len) = sys::check(r) else {
        // No /proc: trust the kernel's later answer (the wait would fail with EINVAL).
        return Ok(true);
    };
    Ok(&buf[..len] == b"anon_inode:[eventpoll]")
}

/// epoll_ctl where `fd` is a canal socket or a canal-bearing epoll fd. `ev`: the
/// caller's event, already read (None for a null pointer).
pub(crate) fn ctl(epfd: c_int, op: c_int, fd: c_int, ev: Option<epoll_event>) -> Result<(), i32> {
    if epfd == fd {
        return Err(libc::EINVAL);
    }
    if !is_epoll(epfd)? {
        return Err(libc::EINVAL);
    }
    let target = match TABLE.get(fd) {
        Some(Entry::Canal(h)) => Target::Canal(h),
        Some(Entry::Epoll) => Target::Nested(fd),
        _ => return Err(libc::EBADF),
    };
    let want = if op == libc::EPOLL_CTL_DEL {
        None
    } else {
        let e = ev.ok_or(libc::EFAULT)?;
        Some((e.events, e.u64))
    };
    let sock = match target {
        Target::Canal(h) => crate::conn::guest::guest().and_then(|g| Sock::new(g, h).ok()),
        Target::Nested(_) => None,
    };
    // A native-accept listener: the kernel counts its native arrivals for this set
    // (its twin in the real instance), or else the set relies on canald's.
    // Another descriptor of the listener in the set shares its registration. Not an
    // EPOLLEXCLUSIVE item: the kernel wakes one exclusive waiter only among threads
    // in epoll_wait itself, and a library sleep polls the instance, so every set would
    // wake for each client (37 wake-ups for 20 clients over 4 processes, where
    // canald's marks gave 21 and the kernel 20).
    // Nor in a set another process may wait on (`Set::shared`), or an image exec'd
    // with it (an instance without close-on-exec: there the copy's events would reach
    // the program as events of its own, with user data it never gave).
    // The cheap test first: every other canal socket a server adds pays nothing more.
    let exclusive = want.is_some_and(|(e, _)| e & EPOLLEXCLUSIVE != 0);
    let twin = op == libc::EPOLL_CTL_ADD
        && !exclusive
        && sock.is_some_and(|s| {
            crate::sock::native::twin_watchable(&s)
                && match twin_state(epfd, s.handle) {
                    (true, _) => false,
                    (false, true) => true,
                    (false, false) => {
                        sys::fcntl_int(epfd, libc::F_GETFD, 0)
                            .is_ok_and(|f| f & libc::FD_CLOEXEC as usize != 0)
                            && crate::sock::native::watch_twin(epfd, &s)
                    }
                }
        });
    let watched = twin || (op == libc::EPOLL_CTL_MOD && twin_watched(epfd, fd));
    if let Some(s) = sock.filter(|_| op != libc::EPOLL_CTL_DEL) {
        if !watched {
            crate::sock::native::held_by_epoll(&s);
        } else if op == libc::EPOLL_CTL_MOD {
            // Re-armed: the kernel re-checks the twin, an event if clients wait.
            crate::sock::native::rewatch_twin(epfd, &s);
        }
    }
    let seq = match sock {
        Some(s) if watched => crate::mux::edge::twin_seq(&s),
        Some(s) => s.edge_seq(),
        None => (0, None),
    };
    // A set about to rely on the event log maps it first (a round trip to canald,
    // never under the sets' lock).
    let log = if op == libc::EPOLL_CTL_ADD
        && matches!(target, Target::Canal(_))
        && with(|sets| {
            sets.iter()
                .find(|s| s.epfd == epfd)
                .map_or(crate::mux::evset::log_at() <= 1, Set::wants_log)
        }) {
        crate::conn::guest::guest().and_then(crate::evlog::own)
    } else {
        None
    };
    let r = with(|sets| {
        let si = sets.iter().position(|s| s.epfd == epfd);
        // The set that has `fd` (MOD and DEL need one).
        let holder = si.filter(|&si| sets[si].contains(fd));
        match op {
            libc::EPOLL_CTL_ADD => {
                if holder.is_some() {
                    return Err(libc::EEXIST);
                }
                let (events, data) = want.ok_or(libc::EFAULT)?;
                let si = si.unwrap_or_else(|| {
                    sets.push(Set::new(epfd));
                    sets.len() - 1
                });
                let s = &mut sets[si];
                // `log` is Some only for a canal socket that takes the set over the
                // threshold.
                if let Some(log) = log.filter(|_| s.wants_log()) {
                    s.enter_log(log);
                }
                let mut it = Item::new(fd, target, events, data, seq);
                it.twin = twin;
                s.add(it);
                // Its first canal item: a thread may be in the kernel's wait on it.
                let first = s.kick.is_none();
                if first {
                    s.kick = Some(crate::mux::kick::make(epfd).unwrap_or(-1));
                }
                Ok((true, first, s.sleepers.clone()))
            }
            libc::EPOLL_CTL_MOD => {
                let s = &mut sets[holder.ok_or(libc::ENOENT)?];
                let (events, data) = want.ok_or(libc::EFAULT)?;
                let it = s.get_mut(fd).ok_or(libc::ENOENT)?;
                if events & EPOLLEXCLUSIVE != 0 || it.events & EPOLLEXCLUSIVE != 0 {
                    return Err(libc::EINVAL);
                }
                it.events = events;
                it.data = data;
                it.fresh = true;
                it.disarmed = false;
                it.last_seq = seq.0;
                it.last_tx = seq.1.unwrap_or(it.last_tx);
                s.touched(fd);
                Ok((false, false, s.sleepers.clone()))
            }
            libc::EPOLL_CTL_DEL => {
                sets[holder.ok_or(libc::ENOENT)?].remove(fd);
                Ok((false, false, Vec::new()))
            }
            _ => Err(libc::EINVAL),
        }
    });
    if r.is_err() && twin {
        if let Target::Canal(h) = target {
            if twin_state(epfd, h) == (false, false) {
                crate::sock::native::unwatch_twin(epfd, h);
            }
        }
    }
    let (tagged, first, sleepers) = r?;
    if tagged {
        // The epoll fd now watches canal sockets: its waits go through `wait`.
        let _ = TABLE.set_epoll(epfd);
    }
    // After the tag: a kernel wait listed later sees it (kick.rs, `KernelWait`).
    if first && crate::mux::kick::kernel_waits_on(epfd) {
        kick_set(epfd);
    }
    // Each sleeper scans the set again, the new item included (mux/kick.rs).
    for idx in sleepers.into_iter().filter(|&i| i != NO_SLOT) {
        crate::conn::slots::wake_slot(idx);
    }
    Ok(())
}

/// The set of `epfd`: whether it existed at a fork (`Set::shared`), and whether it
/// holds listener `handle`'s twin (for a twin-watched item).
fn twin_state(epfd: c_int, handle: u32) -> (bool, bool) {
    with(|sets| {
        sets.iter()
            .find(|s| s.epfd == epfd)
            .map_or((false, false), |s| (s.shared, s.twin_watched(handle)))
    })
}

/// Whether the set of `epfd` holds `fd` as a twin-watched listener.
fn twin_watched(epfd: c_int, fd: c_int) -> bool {
    with(|sets| {
        sets.iter_mut()
            .find(|s| s.epfd == epfd)
            .and_then(|s| s.get_mut(fd))
            .is_some_and(|it| it.twin)
    })
}

/// A sleeper without a request slot of its own: it sleeps in short steps, each
/// re-checking the set, and needs no wake-up.
const NO_SLOT: u32 = u32::MAX;

/// Wakes a thread in the kernel's wait on the set of `epfd` (mux/kick.rs).
fn kick_set(epfd: c_int) {
    crate::ownfd::using(|| {
        with(|sets| {
            let k = sets.iter().find(|s| s.epfd == epfd).and_then(|s| s.kick);
            if let Some(k) = k.filter(|&k| k >= 0) {
                crate::mux::kick::kick(k);
            }
        })
    });
}

/// Counts the thread of request slot `slot` in (`asleep`) or out of the sleepers of
/// the set of `epfd`.
fn count_sleeper(epfd: c_int, slot: u32, asleep: bool) {
    with(|sets| {
        if let Some(s) = sets.iter_mut().find(|s| s.epfd == epfd) {
            if asleep {
                s.sleepers.push(slot);
            } else if let Some(i) = s.sleepers.iter().position(|&x| x == slot) {
                s.sleepers.swap_remove(i);
            }
        }
    });
}

/// The library's descriptor `old` (a kick) moved to `new` (`hooks::fd::make_room`).
pub(crate) fn retarget_kick(old: c_int, new: c_int) -> bool {
    with(|sets| {
        sets.iter_mut()
            .filter_map(|s| s.kick.as_mut())
            .find(|k| **k == old)
            .map(|k| *k = new)
            .is_some()
    })
}

/// The kernel's wait ended with `r` events in `out`, of which the library's kicks are
/// dropped; None if only kicks were there (the caller waits on).
pub(crate) fn after_kernel_wait(out: *mut epoll_event, r: c_int) -> Option<c_int> {
    if r <= 0 || out.is_null() {
        return Some(r);
    }
    // SAFETY: the kernel wrote r events there.
    let events = unsafe { core::slice::from_raw_parts_mut(out, r as usize) };
    // Twin events here (a set that got its first canal items while this wait was in
    // the kernel) are dropped: those items are new, and report what is queued anyway.
    match crate::mux::kick::take_own(events, r as usize, &mut Vec::new()) {
        0 => None,
        n => Some(n as c_int),
    }
}

/// A canal descriptor (or a canal-bearing epoll fd) was closed: it leaves every set.
/// An epoll fd that was closed loses its interest list.
pub(crate) fn forget_fd(fd: c_int) {
    with(|sets| {
        if let Some(i) = sets.iter().position(|s| s.epfd == fd) {
            sets.swap_remove(i).drop_all();
        }
        for s in sets.iter_mut() {
            s.remove(fd);
        }
    });
}

/// A canal socket at `fd` became a kernel socket (selection policy): its interest moves
/// to the real epoll instances, with the same events and data.
pub(crate) fn move_to_kernel(fd: c_int) {
    let moved: Vec<(c_int, u32, u64)> = with(|sets| {
        sets.iter_mut()
            .filter_map(|s| s.remove(fd).map(|i| (s.epfd, i.events, i.data)))
            .collect()
    });
    for (epfd, events, data) in moved {
        let mut ev = epoll_event { events, u64: data };
        // SAFETY: ev is a live local the kernel reads.
        unsafe {
            crate::sys::raw_syscall!(
                libc::SYS_epoll_ctl,
                epfd as libc::c_long,
                libc::EPOLL_CTL_ADD as libc::c_long,
                fd as libc::c_long,
                &mut ev as *mut epoll_event,
            )
        };
    }
}

/// Whether the set of `epfd` has anything to report (canal items, or its real part).
fn peek_set(g: &'static Guest, epfd: c_int, depth: u32) -> bool {
    peek_items(g, epfd, depth) || real_readable(epfd)
}

/// The real epoll fd has events (poll on an epoll fd does not consume them).
fn real_readable(epfd: c_int) -> bool {
    let mut p = [libc::pollfd {
        fd: epfd,
        events: libc::POLLIN,
        revents: 0,
    }];
    sys::ppoll(&mut p, Some(0), sys::SigMask::NONE).unwrap_or(0) > 0
}

/// poll()/select() readiness of a canal-bearing epoll fd.
pub(crate) fn poll_revents(g: &'static Guest, epfd: c_int, events: libc::c_short) -> libc::c_short {
    if peek_set(g, epfd, 0) {
        events & (libc::POLLIN | libc::POLLRDNORM)
    } else {
        0
    }
}

/// Collects the canal events of `epfd` into `out`; returns how many.
fn scan(g: &'static Guest, epfd: c_int, out: &mut [epoll_event]) -> usize {
    // Nested items need the lock themselves: evaluate them first.
    let nested: Vec<(c_int, bool)> = nested_fds(epfd)
        .into_iter()
        .map(|f| (f, peek_set(g, f, 1)))
        .collect();
    with(|sets| match sets.iter_mut().find(|s| s.epfd == epfd) {
        Some(s) => s.scan(g, &nested, out),
        None => 0,
    })
}

/// Peek: whether any canal item of `epfd` would report now.
fn peek_items(g: &'static Guest, epfd: c_int, depth: u32) -> bool {
    let items: Vec<Item> = with(|sets| {
        sets.iter_mut()
            .find(|s| s.epfd == epfd)
            .map(|s| s.peek_items(g))
            .unwrap_or_default()
    });
    items
        .into_iter()
        .any(|mut it| crate::mux::evset::eval(g, &mut it, false, depth, peek_set) != 0)
}

fn nested_fds(epfd: c_int) -> Vec<c_int> {
    with(|sets| {
        sets.iter()
            .find(|s| s.epfd == epfd)
            .map(Set::nested_fds)
            .unwrap_or_default()
    })
}

/// A small set's canal sockets, if it has no nested sets (`Set::canal_sockets`).
fn listed_scope(epfd: c_int) -> Vec<u32> {
    with(|sets| {
        sets.iter()
            .find(|s| s.epfd == epfd)
            .and_then(|s| s.canal_sockets())
            .unwrap_or_default()
    })
}

/// A logged set's sleep scope: its direct short-circuited sockets and its log.
fn logged_scope(epfd: c_int) -> Option<(Vec<u32>, canal_abi::evlog::EvLog<'static>)> {
    with(|sets| {
        let s = sets.iter().find(|s| s.epfd == epfd)?;
        Some((s.direct_sockets(), s.log()?))
    })
}

/// The real epoll_pwait with timeout 0.
fn real_poll_events(
    g: &'static Guest,
    epfd: c_int,
    out: &mut [epoll_event],
    rescan: bool,
) -> Result<usize, i32> {
    if out.is_empty() {
        return Ok(0);
    }
    // SAFETY: out is writable for out.len() events; no signal mask.
    let n = sys::check(unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_epoll_pwait,
            epfd as libc::c_long,
            out.as_mut_ptr(),
            out.len() as libc::c_long,
            0 as libc::c_long,
            core::ptr::null::<libc::sigset_t>(),
            8usize,
        )
    })?;
    let mut twins = Vec::new();
    let n = crate::mux::kick::take_own(out, n, &mut twins);
    if twins.is_empty() {
        return Ok(n);
    }
    // Native arrivals on twin-watched listeners: their items report at the next
    // scan — now if `rescan` and nothing else is to be reported (a scan after one of
    // this batch could report an item twice in it).
    with(|sets| {
        if let Some(s) = sets.iter_mut().find(|s| s.epfd == epfd) {
            s.kernel_edges(&twins);
        }
    });
    Ok(if rescan && n == 0 {
        scan(g, epfd, out)
    } else {
        n
    })
}

/// epoll_wait/epoll_pwait/epoll_pwait2 on a canal-bearing epoll fd. `timeout_ns`:
/// None = forever.
pub(crate) fn wait(
    g: &'static Guest,
    epfd: c_int,
    out: &mut [epoll_event],
    timeout_ns: Option<i64>,
    sigmask: sys::SigMask,
) -> Result<usize, i32> {
    let t0 = sys::now_ns();
    let deadline = timeout_ns.map(|t| t0.saturating_add(t));
    // Hybrid mode bounds the spin phase by time with the thread's adaptive budget (a
    // round scans every watched socket, so counted rounds calibrated on a bare spin
    // would spin many times longer with a few dozen sockets); otherwise `g.wait.spin` rounds.
    // Poll-only mode never sleeps (it yields, and sees signals, at every yield point:
    // pollwait.rs); sleep-only mode does not spin.
    let spin_ns = crate::notify::adaptive_ns(&g.wait);
    let mode = g.wait.mode;
    let mut signals = crate::mux::pollwait::SignalWindow::new();
    let mut spinning = mode != crate::notify::Mode::Sleep;
    let mut round = 0u32;
    let mut canal_first = true;
    let mut slept = false;
    // After a sleep: false when its ppoll said the real epoll fd and the nested ones
    // are not readable. A wake-up by a canal socket's bell or slot then skips one
    // epoll_wait; anything native that arrives later makes the next sleep's ppoll
    // return at once.
    let mut real_ready = true;
    loop {
        let check_real = real_ready && (round.is_multiple_of(ORDINARY_EVERY) || !spinning);
        real_ready = true;
        // Alternate which side fills the buffer first, so neither starves the other.
        let n = if canal_first {
            let c = scan(g, epfd, out);
            c + if check_real {
                real_poll_events(g, epfd, &mut out[c..], c == 0)?
            } else {
                0
            }
        } else {
            let r = if check_real {
                real_poll_events(g, epfd, out, false)?
            } else {
                0
            };
            r + scan(g, epfd, &mut out[r..])
        };
        canal_first = !canal_first;
        if timeout_ns == Some(0) {
            return Ok(n);
        }
        let now = sys::now_ns();
        if n > 0 {
            // The wait's gap feeds the thread's budget (as `crate::conn::wait::wait_until`).
            crate::notify::record_wait(&g.wait, now - t0, slept);
            return Ok(n);
        }
        if deadline.is_some_and(|d| now >= d) {
            return Ok(0);
        }
        if spinning && mode != crate::notify::Mode::Poll {
            spinning = match spin_ns {
                Some(ns) => ((now - t0) as u64) < ns,
                None => round < g.wait.spin,
            };
        }
        if spinning {
            round = round.wrapping_add(1);
            canal_abi::sync::spin_hint();
            if mode == crate::notify::Mode::Poll
                && round.is_multiple_of(crate::notify::POLL_YIELD_EVERY)
            {
                signals.yield_point(sigmask)?;
            } else if mode == crate::notify::Mode::Hybrid && round.is_multiple_of(YIELD_EVERY) {
                // A spin that holds the core for its whole budget can keep the peer
                // it waits for off the CPU (2 cores, several busy processes).
                crate::conn::wait::yield_while_spinning();
            }
            continue;
        }
        // Counted asleep before the sleep's scope is read: an item added later wakes us.
        let slot = crate::conn::slots::own_slot(g).map_or(NO_SLOT, |s| s.idx);
        count_sleeper(epfd, slot, true);
        // Sleep on [real epfd, nested epoll fds, slot eventfd, control socket].
        let mut fds: Vec<libc::pollfd> = core::iter::once(epfd)
            .chain(nested_fds(epfd))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                // "Maybe ready" until a ppoll fills it: a sleep that returns without
                // polling (its condition held, or a VM guest's yield phase) leaves it.
                revents: libc::POLLIN,
            })
            .collect();
        fds.extend(
            [libc::pollfd {
                fd: -1,
                events: 0,
                revents: 0,
            }; 2],
        );
        let remaining = deadline.map(|d| d - now);
        let mut cond = || peek_items(g, epfd, 0);
        let r = match logged_scope(epfd) {
            Some((direct, log)) => crate::conn::sleep::sleep_ready_in(
                g,
                crate::conn::sleep::Scope::Logged {
                    direct: &direct,
                    log: log.header,
                },
                remaining,
                &mut cond,
                &mut fds,
                sigmask,
            ),
            None => {
                let listed = listed_scope(epfd);
                let scope = crate::conn::sleep::Scope::listed_or(&listed, WAIT_ANY);
                crate::conn::sleep::sleep_ready_in(
                    g, scope, remaining, &mut cond, &mut fds, sigmask,
                )
            }
        };
        count_sleeper(epfd, slot, false);
        slept = true;
        // The last two entries are the sleep's own (slot eventfd, control socket).
        real_ready = fds[..fds.len() - 2].iter().any(|p| p.revents != 0);
        r?;
        // Re-check everything (past the spin phase: real checks each time).
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forget_drops_sets_and_items() {
        with(|sets| {
            let mut s = Set::new(1000);
            s.add(Item::new(
                1001,
                Target::Canal(7),
                crate::mux::evset::EPOLLIN,
                5,
                (0, None),
            ));
            sets.push(s);
        });
        forget_fd(1001);
        assert!(with(|s| !s
            .iter()
            .find(|s| s.epfd == 1000)
            .unwrap()
            .contains(1001)));
        forget_fd(1000);
        assert!(with(|s| s.iter().all(|s| s.epfd != 1000)));
    }

    #[test]
    fn ctl_rejects_self_and_non_epoll() {
        assert_eq!(ctl(5, libc::EPOLL_CTL_ADD, 5, None), Err(libc::EINVAL));
        let mut p = [0; 2];
        // SAFETY: plain pipe creation into a two-element array.
        let rc = unsafe { libc::pipe(p.as_mut_ptr()) };
        assert_eq!(rc, 0);
        assert_eq!(is_epoll(p[0]), Ok(false));
        // SAFETY: creating an epoll instance.
        let ep = unsafe { libc::epoll_create1(0) };
        assert_eq!(is_epoll(ep), Ok(true));
        assert_eq!(is_epoll(-1), Err(libc::EBADF));
        for fd in [p[0], p[1], ep] {
            let _ = sys::close(fd);
        }
    }
}
