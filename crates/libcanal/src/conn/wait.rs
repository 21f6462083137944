//! Waiting for a socket's readiness: `wait_until` (spin, then sleep, honouring
//! timeouts, signals and SA_RESTART; a sleeping call pins its socket, `pin`), and
//! yielding to a co-resident peer while spinning.
use crate::conn::accept_sleep::Twin;
use crate::conn::guest::control_hung_up;
use crate::conn::guest::is_dead;
use crate::conn::guest::mark_dead;
use crate::conn::guest::Guest;
use crate::conn::pin::pin_for_call;
use crate::conn::sleep::new_wait;
use crate::conn::sleep::seg_of;
use crate::conn::sleep::sleep_futex;
use crate::conn::sleep::sleep_ready_in;
use crate::conn::sleep::Scope;
use crate::notify;
use crate::sys;

/// How an event wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    Ready,
    Timeout,
    Interrupted,
    Dead,
}

/// Waits until `cond()` holds for socket `index` (or WAIT_ANY), up to `deadline`
/// (monotonic ns): polls first, then sleeps on the slot's eventfd (§6).
pub(crate) fn wait_until(
    g: &'static Guest,
    index: u32,
    deadline: Option<i64>,
    cond: impl FnMut() -> bool,
) -> Wait {
    wait_until_as(g, index, None, deadline, -1, cond)
}

/// `wait_until` for a thread blocked in accept() on listener `index`: its sleep is
/// marked so canald wakes one such thread per waiting connection (`ACCEPT_ONE`).
/// `native`: the listener's twin (`sock::native`), which the sleep also waits on, so
/// the kernel wakes it for a native client without canald — one such thread per
/// client, as accept() natively (conn/accept_sleep.rs). `spin`: false to sleep at
/// once, without the spin budget (in poll mode it still spins).
pub(crate) fn wait_accept(
    g: &'static Guest,
    index: u32,
    deadline: Option<i64>,
    native: Option<(libc::c_int, Twin)>,
    spin: bool,
    cond: impl FnMut() -> bool,
) -> Wait {
    let exclusive = g.region.header().features & canal_abi::feature::ACCEPT_ONE != 0;
    let (fd, twin) = native.map_or((-1, None), |(fd, t)| (fd, Some(t)));
    let how = Accepting {
        twin: exclusive.then_some(twin),
        spin,
    };
    wait_until_as(g, index, Some(how), deadline, fd, cond)
}

/// A thread blocked in accept(): how `wait_until_as` waits for it.
struct Accepting {
    /// Some when canald wakes one such thread per connection (`ACCEPT_ONE`): the sleep
    /// is `Scope::Accept`, with the listener's twin if it has one.
    twin: Option<Option<Twin>>,
    /// Spin before sleeping (else sleep at once, unless in poll mode).
    spin: bool,
}

/// `accepting`: a thread blocked in accept().
fn wait_until_as(
    g: &'static Guest,
    index: u32,
    accepting: Option<Accepting>,
    deadline: Option<i64>,
    also: libc::c_int,
    mut cond: impl FnMut() -> bool,
) -> Wait {
    let mut spins = 0u32;
    let at_once = accepting.as_ref().is_some_and(|a| !a.spin) && g.wait.mode != notify::Mode::Poll;
    let budget = if at_once {
        0
    } else {
        notify::spin_iters(&g.wait)
    };
    // The adaptive budget needs each wait's gap, but a wait answered within its first
    // CLOCK_AFTER spins (the common case under request/response load) estimates it
    // from the spin count instead of reading the clock twice (notify::spins_ns). A wait
    // that never spun says nothing about the budget.
    let adaptive = notify::adaptive(&g.wait) && !at_once;
    let mut t0 = 0i64;
    let mut seg_wait = false;
    let mut slept = false;
    let mut signals = crate::mux::pollwait::SignalWindow::new();
    new_wait();
    loop {
        if is_dead(g) {
            mark_dead();
            return Wait::Dead;
        }
        if cond() {
            if adaptive {
                let gap = if t0 != 0 {
                    sys::now_ns() - t0
                } else {
                    notify::spins_ns(&g.wait, spins)
                };
                notify::record_wait(&g.wait, gap, slept);
            }
            return Wait::Ready;
        }
        if adaptive && t0 == 0 && (spins >= notify::CLOCK_AFTER || spins >= budget) {
            t0 = sys::now_ns() - notify::spins_ns(&g.wait, spins);
        }
        let now = if deadline.is_some() || spins >= budget {
            sys::now_ns()
        } else {
            0
        };
        if let Some(d) = deadline {
            if now >= d {
                return Wait::Timeout;
            }
        }
        if spins < budget {
            if spins == 0 {
                seg_wait = seg_of(g, index).is_some();
            }
            spins += 1;
            canal_abi::sync::spin_hint();
            if spins.is_multiple_of(notify::POLL_YIELD_EVERY) && g.wait.mode == notify::Mode::Poll {
                // Poll mode: the budget never runs out.
                spins = 0;
                if control_hung_up(g) {
                    mark_dead();
                    return Wait::Dead;
                }
                match signals.yield_point(sys::SigMask::NONE) {
                    Ok(()) => {}
                    Err(_) if deadline.is_none() && all_handlers_restart() => {}
                    Err(_) => return Wait::Interrupted,
                }
                // A poll-only wait that spun this long is a blocked call: it holds the
                // socket (as a sleep does, below) and sees signals (pollwait.rs).
                if signals.active() {
                    pin_for_call(g, index);
                }
            } else if seg_wait
                && spins > budget / 8
                && spins.is_multiple_of(YIELD_EVERY)
                && peer_yield::worth_trying()
            {
                // Not a quick answer: the peer is another process that may share our
                // core (or wait for one), let it run.
                let t = sys::now_ns();
                sys::sched_yield();
                peer_yield::note(sys::now_ns() - t);
            }
            continue;
        }
        let remaining = deadline.map(|d| d - now);
        // From its first sleep (on the segment futex or the slot eventfd) until it
        // returns (`unpin`, called by the hook), the call holds a reference, as the
        // kernel's in-flight call holds the file: a
        // close() by another thread does not close the socket under it (the call goes
        // on and returns the peer's later data, as natively; for a short-circuited
        // socket it also keeps the pair segment mapped).
        pin_for_call(g, index);
        // A short-circuited socket: sleep on its segment's futex (§8.4), at most 1 s
        // at a time so a vanished canald is noticed.
        slept = true;
        if let Some((seg, side)) = seg_of(g, index) {
            match sleep_futex(seg, side, remaining, &mut cond) {
                Ok(true) => return Wait::Ready,
                Ok(false) => continue,
                // The same restart rule as the eventfd sleep below.
                Err(libc::EINTR) if deadline.is_none() && all_handlers_restart() => continue,
                Err(_) => return Wait::Interrupted,
            }
        }
        let remaining = deadline.map(|d| d - now);
        let scope = match &accepting {
            Some(Accepting {
                twin: Some(twin), ..
            }) => Scope::Accept(index, *twin),
            _ => Scope::One(index),
        };
        let mut extra = [libc::pollfd {
            fd: also,
            events: libc::POLLIN,
            revents: 0,
        }; 3];
        let extra: &mut [libc::pollfd] = if also >= 0 { &mut extra } else { &mut [] };
        let r = sleep_ready_in(g, scope, remaining, &mut cond, extra, sys::SigMask::NONE);
        match r {
            Ok(n) if n > 0 => return Wait::Ready,
            Ok(_) => {}
            // A handler with SA_RESTART restarts a socket call without a timeout (the
            // kernel's ERESTARTSYS); with SO_RCVTIMEO/SO_SNDTIMEO it is EINTR.
            Err(libc::EINTR) if deadline.is_none() && all_handlers_restart() => {}
            Err(libc::EINTR) => return Wait::Interrupted,
            Err(_) => {}
        }
    }
}

/// Whether every signal with a handler has SA_RESTART (the interrupted call cannot
/// tell which signal ran, so it restarts only when any of them would have).
fn all_handlers_restart() -> bool {
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: querying (not changing) the disposition into a zeroed struct.
        let old = unsafe {
            let mut old: libc::sigaction = core::mem::zeroed();
            if libc::sigaction(sig, core::ptr::null(), &mut old) != 0 {
                continue;
            }
            old
        };
        let h = old.sa_sigaction;
        if h != libc::SIG_DFL && h != libc::SIG_IGN && old.sa_flags & libc::SA_RESTART == 0 {
            return false;
        }
    }
    true
}

/// While polling a short-circuited socket, after the first eighth of the spin budget
/// (a few µs: a request-response peer answers well within it), yield the CPU every
/// this many spins.
const YIELD_EVERY: u32 = 64;

/// Whether the short-circuit wait's sched_yield gives the core to anyone. A yield
/// that comes back within FUTILE_NS ran nobody (the peer is on another core, or not
/// runnable): after FUTILE_MAX such yields in a row the thread stops yielding, except
/// at one chance in PROBE_EVERY (the peer may have moved to our core), so a peer on
/// another core no longer costs a system call per round trip (B7). A yield that ran
/// someone (or while the count is low) keeps the old behaviour.
mod peer_yield {
    use core::cell::Cell;
    const FUTILE_NS: i64 = 3_000;
    const FUTILE_MAX: u32 = 4;
    const PROBE_EVERY: u32 = 64;
    thread_local! {
        /// (futile yields in a row, yields skipped since the last probe)
        static STATE: Cell<(u32, u32)> = const { Cell::new((0, 0)) };
    }
    pub(crate) fn worth_trying() -> bool {
        STATE
            .try_with(|s| {
                let (futile, skipped) = s.get();
                if futile < FUTILE_MAX {
                    return true;
                }
                if skipped + 1 >= PROBE_EVERY {
                    s.set((futile, 0));
                    return true;
                }
                s.set((futile, skipped + 1));
                false
            })
            .unwrap_or(true)
    }
    pub(crate) fn note(took_ns: i64) {
        let _ = STATE.try_with(|s| {
            let (futile, skipped) = s.get();
            s.set(if took_ns < FUTILE_NS {
                (futile.saturating_add(1), skipped)
            } else {
                (0, 0)
            });
        });
    }
}

/// Yields the CPU from a spinning wait unless recent yields ran nobody (`peer_yield`):
/// on a 2-core machine the event a spinning event loop waits for may come from a
/// process queued behind it on its own core.
pub(crate) fn yield_while_spinning() {
    if peer_yield::worth_trying() {
        let t = sys::now_ns();
        sys::sched_yield();
        peer_yield::note(sys::now_ns() - t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn futile_yields_stop_and_probe() {
        // A fresh thread: its own thread-local state.
        std::thread::spawn(|| {
            for _ in 0..4 {
                assert!(peer_yield::worth_trying());
                peer_yield::note(500); // came back at once: nobody ran
            }
            let tries: Vec<bool> = (0..128).map(|_| peer_yield::worth_trying()).collect();
            assert_eq!(tries.iter().filter(|&&t| t).count(), 2, "one probe per 64");
            assert!(tries[63] && tries[127]);
            peer_yield::note(50_000); // this one ran the peer: yield again
            assert!(peer_yield::worth_trying());
        })
        .join()
        .unwrap();
    }
}
