//! How a waiting thread sleeps: eventfd ports, bounded backoff without one, the
//! deferred re-check of short-circuited sockets, and waking local sleepers.
use crate::conn::accept_sleep;
use crate::conn::guest::death_pollfd;
use crate::conn::guest::died;
use crate::conn::guest::mark_dead;
use crate::conn::guest::Guest;
use crate::conn::slots::own_slot;
use crate::conn::slots::SlotRef;
use crate::conn::slots::SLOT_EFD;
use crate::notify::SEGMENT_MAPPED;
use crate::sys;
use canal_abi::feature;
use canal_abi::sleep_kind;
use canal_abi::sync::fence;
use canal_abi::sync::AtomicU32;
use canal_abi::sync::AtomicU64;
use canal_abi::sync::Ordering;
use canal_abi::SocketEntry;
use canal_abi::WAIT_ANY;
use core::cell::Cell;

/// What a sleeping thread waits for: one socket (or WAIT_ANY: any of the guest's), or
/// an epoll set that relies on the event log (§8.6): any socket (its changes come
/// through the log, whose `sleepers` word it counts itself in), plus the listed
/// short-circuited sockets the set still looks at directly.
#[derive(Clone, Copy)]
pub(crate) enum Scope<'a> {
    One(u32),
    /// A listener a thread is blocked in accept() on: with `feature::ACCEPT_ONE`
    /// canald wakes only as many such threads as connections wait (§6). With the
    /// listener's twin, a native client wakes one such thread too (accept_sleep.rs).
    Accept(u32, Option<crate::conn::accept_sleep::Twin>),
    /// Any of the listed sockets (a poll set's): canald wakes it for any socket, but
    /// only their connections count it as a sleeper, so a peer rings its bell (§8.8)
    /// rather than finding every sleeping thread of the process counted there.
    Listed(&'a [u32]),
    Logged {
        direct: &'a [u32],
        log: &'a canal_abi::evlog::EvLogHeader,
    },
}

impl<'a> Scope<'a> {
    /// The listed sockets, or (none listed) socket `otherwise` (WAIT_ANY: any).
    pub(crate) fn listed_or(listed: &'a [u32], otherwise: u32) -> Scope<'a> {
        if listed.is_empty() {
            Scope::One(otherwise)
        } else {
            Scope::Listed(listed)
        }
    }
}

/// Sleeps once on readiness of what `scope` names: on the thread's own slot
/// (`sleep_events`), or, for a thread without one, in backoff (`sleep_backoff`).
pub(crate) fn sleep_ready_in(
    g: &'static Guest,
    scope: Scope<'_>,
    timeout_ns: Option<i64>,
    cond: &mut dyn FnMut() -> bool,
    extra: &mut [libc::pollfd],
    sigmask: sys::SigMask,
) -> Result<usize, i32> {
    match own_slot(g) {
        Some(s) => sleep_events(&s, scope, timeout_ns, cond, extra, sigmask),
        None => match slotless_futex(g, scope, extra, &sigmask) {
            // Ok(0): as a wake-up of `sleep_events` with no descriptor ready.
            Some((seg, side)) => sleep_futex(seg, side, timeout_ns, cond).map(|_| 0),
            None => sleep_backoff(g, timeout_ns, cond, extra, sigmask),
        },
    }
}

/// A thread without a slot of its own (beyond the three quarters of the slots threads
/// keep) waiting on one short-circuited socket and nothing else, without a signal
/// mask to apply: it can sleep on the segment's futex as a blocking call does (§8.4:
/// the peer and canald wake it), instead of backing off. Backing off, each such
/// thread woke up to 1,000 times a second: 2,500 threads each connecting to a server
/// thread of their own (5,000 threads) timed out waiting 20 s for replies in two runs
/// of three (2026-11-28).
fn slotless_futex(
    g: &'static Guest,
    scope: Scope<'_>,
    extra: &[libc::pollfd],
    sigmask: &sys::SigMask,
) -> Option<(crate::shortcut::seg::Seg, u32)> {
    let Scope::One(index) = scope else {
        return None;
    };
    let ordinary = extra[..extra.len().saturating_sub(2)]
        .iter()
        .any(|p| p.fd >= 0);
    let shortcut = g
        .region
        .socket(index)
        .is_some_and(|e| e.segment.load(Ordering::Acquire) != 0);
    if ordinary || !sigmask.0.is_null() || !shortcut {
        return None;
    }
    // Held until the call returns (as the kernel's poll holds the file while it
    // sleeps), before the segment is looked up: a close by another thread cannot
    // unmap it under the sleep.
    crate::conn::pin::pin_for_call(g, index);
    seg_of(g, index)
}

/// A sleep on a short-circuited socket's segment futex (§8.4), at most RECHECK_NS at a
/// time (a vanished canald is noticed by the caller's loop): `seg::futex_sleep`'s
/// answer (Ok(true): `cond` held).
pub(crate) fn sleep_futex(
    seg: crate::shortcut::seg::Seg,
    side: u32,
    timeout_ns: Option<i64>,
    cond: &mut dyn FnMut() -> bool,
) -> Result<bool, i32> {
    let t = timeout_ns.map_or(RECHECK_NS, |t| t.min(RECHECK_NS));
    crate::shortcut::seg::futex_sleep(seg, side, t, cond)
}

/// Backoff of event waits without a wake-up port: (monotonic ns when the wait began, 0
/// before its first sleep; next sleep step in ns).
const BACKOFF_MIN_NS: i64 = 1_000;

const BACKOFF_MAX_NS: i64 = 1_000_000;

/// How long a wait without a wake-up port polls (yielding) before it sleeps: set at
/// ivshmem attach ($CANAL_VM_POLL_US, default 200 µs).
pub(crate) static YIELD_NS: core::sync::atomic::AtomicI64 = core::sync::atomic::AtomicI64::new(0);

thread_local! {
    static BACKOFF: Cell<(i64, i64)> = const { Cell::new((0, BACKOFF_MIN_NS)) };
}

/// Starts a new wait for `sleep_events`' backoff (no wake-up port): its polling phase
/// and its backoff steps count from the wait's first sleep.
pub(crate) fn new_wait() {
    let _ = BACKOFF.try_with(|b| b.set((0, BACKOFF_MIN_NS)));
}

const NO_POLLFD: libc::pollfd = libc::pollfd {
    fd: -1,
    events: 0,
    revents: 0,
};

/// The descriptors of one sleep: the caller's `extra` (its two spare entries at the end
/// cleared for the wake-up port and the control socket), or `own` alone.
fn sleep_fds<'a>(
    own: &'a mut [libc::pollfd; 2],
    extra: &'a mut [libc::pollfd],
) -> &'a mut [libc::pollfd] {
    let fds: &mut [libc::pollfd] = if extra.is_empty() { own } else { extra };
    let n = fds.len() - 2;
    fds[n].revents = 0;
    fds[n + 1].revents = 0;
    fds
}

/// A sleep without a wake-up port: a VM guest over ivshmem without interrupts, or a
/// thread beyond the slots threads may keep (it has no slot to sleep on). A sleeping
/// thread in a VM wakes late (the VM's timer), so a wait first keeps checking, yielding
/// the CPU between checks, for YIELD_NS (0 for process guests); then it sleeps in
/// exponential backoff, 1 µs doubling to 1 ms (§6), polling `extra`'s descriptors.
pub(crate) fn sleep_backoff(
    g: &Guest,
    timeout_ns: Option<i64>,
    cond: &mut dyn FnMut() -> bool,
    extra: &mut [libc::pollfd],
    sigmask: sys::SigMask,
) -> Result<usize, i32> {
    let mut own = [NO_POLLFD; 2];
    let fds = sleep_fds(&mut own, extra);
    let n = fds.len() - 2;
    if cond() {
        return Ok(0);
    }
    let now = sys::now_ns();
    let step = BACKOFF.with(|b| {
        let (start, step) = b.get();
        // The first sleep of a wait (new_wait() cleared the start).
        let (start, step) = if start == 0 {
            (now, BACKOFF_MIN_NS)
        } else {
            (start, step)
        };
        if now - start < YIELD_NS.load(Ordering::Relaxed) {
            b.set((start, step));
            return 0;
        }
        b.set((start, (step * 2).min(BACKOFF_MAX_NS)));
        step
    });
    if step == 0 {
        canal_abi::sync::spin_hint();
        return Ok(0);
    }
    let t = timeout_ns.map_or(step, |t| t.min(step));
    fds[n].fd = -1;
    fds[n + 1] = death_pollfd(g);
    let r = sys::ppoll(fds, Some(t), sigmask)?;
    if died(g, &fds[n + 1], r == 0) {
        mark_dead();
    }
    Ok(r.saturating_sub((fds[n + 1].revents != 0) as usize))
}

/// Longest single sleep on a wake-up port before readiness is checked again.
const RECHECK_NS: i64 = 1_000_000_000;

/// One sleep on readiness changes (§6): publish sleep=EVENTS, fence, re-check `cond`,
/// then ppoll on [extra fds..., slot eventfd, control socket]. `extra` must have two
/// spare entries at its end, which this fills. Returns the ppoll count of `extra`'s
/// own entries with events (0 if `cond` already held).
pub(crate) fn sleep_events(
    s: &SlotRef,
    scope: Scope<'_>,
    timeout_ns: Option<i64>,
    cond: &mut dyn FnMut() -> bool,
    extra: &mut [libc::pollfd],
    sigmask: sys::SigMask,
) -> Result<usize, i32> {
    let g = s.g;
    if s.efd < 0 {
        return sleep_backoff(g, timeout_ns, cond, extra, sigmask);
    }
    let h = g.region.header();
    let mut own = [NO_POLLFD; 2];
    let fds = sleep_fds(&mut own, extra);
    let n = fds.len() - 2;
    if g.ctl() < 0 {
        // A VM guest with interrupt wake-ups (§9.5): the same polling phase as above
        // before the first sleep of a wait (an interrupt under emulation arrives
        // ~150 µs late), then sleep on the slot's interrupt eventfd.
        if cond() {
            return Ok(0);
        }
        let now = sys::now_ns();
        let polling = BACKOFF.with(|b| {
            let (start, step) = b.get();
            let start = if start == 0 { now } else { start };
            b.set((start, step));
            now - start < YIELD_NS.load(Ordering::Relaxed)
        });
        if polling {
            sys::sched_yield();
            return Ok(0);
        }
    }
    // §8: count ourselves as a sleeper of every short-circuited connection we wait
    // on, so its peer raises attention (and canald wakes us) after changing it.
    let mut seg_sleepers = SegSleepers::new(s.idx);
    let (index, log_sleepers) = match scope {
        Scope::One(index) => {
            seg_sleepers.enter(g, index);
            (index, None)
        }
        Scope::Accept(index, _) => (index | canal_abi::WAIT_ACCEPT, None),
        Scope::Listed(indices) => {
            seg_sleepers.enter_listed(g, indices);
            (WAIT_ANY, None)
        }
        Scope::Logged { direct, log } => {
            seg_sleepers.enter_listed(g, direct);
            // §8.8: in the log's bell word too (before the fence, as `sleepers`), with
            // our tag if we have a bell: an appender that has one for us rings it.
            if crate::shortcut::bells::enabled(g) {
                let (tag, mask) = crate::shortcut::bells::for_log_sleep(s.idx);
                canal_abi::segment::bell::enter(&log.bell, tag);
                seg_sleepers.rings |= mask;
                seg_sleepers.log_bell = &log.bell;
            }
            // Appenders read it after their SeqCst append (canal_abi::evlog).
            log.sleepers.fetch_add(1, Ordering::SeqCst);
            (WAIT_ANY, Some(&log.sleepers))
        }
    };
    let mut bell_events = 0;
    s.slot.wait_socket.store(index, Ordering::Relaxed);
    s.slot.sleep.store(sleep_kind::EVENTS, Ordering::Relaxed);
    h.event_waiters.fetch_add(1, Ordering::Relaxed);
    // W2: SeqCst fence between publishing sleep/event_waiters and re-checking the
    // socket state; pairs with the host's fence between changing a socket and reading
    // event_waiters / sleep (§6).
    fence(Ordering::SeqCst);
    let r = if crate::shortcut::room::recheck(cond) {
        Ok(0)
    } else {
        fds[n] = libc::pollfd {
            fd: s.efd,
            events: libc::POLLIN,
            revents: 0,
        };
        fds[n + 1] = death_pollfd(g);
        // More short-circuited sockets than we can count on: sleep in short steps.
        // Otherwise at most RECHECK_NS: a missed wake-up costs at most that (one was
        // seen about once in 50 bursts of 400 threads each polling its own socket,
        // cause not found), and a vanished canald is noticed.
        let t = if seg_sleepers.overflow {
            Some(timeout_ns.map_or(1_000_000, |t| t.min(1_000_000)))
        } else {
            Some(timeout_ns.map_or(RECHECK_NS, |t| t.min(RECHECK_NS)))
        };
        let poll = |all: &mut [libc::pollfd], cond: &mut dyn FnMut() -> bool| {
            seg_sleepers.pause();
            let r = if seg_sleepers.n > 0 {
                // Counted on a connection whose peer may publish without a fence: the
                // deferred barrier (barrier.rs) before sleeping longer than DEFER_NS.
                // Its re-check looks segments up again: held meanwhile.
                let mut held = || {
                    let _hold = crate::shortcut::seg::Hold::new();
                    crate::shortcut::room::recheck(cond)
                };
                deferred_ppoll(all, t, sigmask, &mut held)
            } else {
                sys::ppoll(all, t, sigmask)
            };
            seg_sleepers.resume();
            r
        };
        let exclusive = match scope {
            Scope::Accept(_, Some(twin)) => accept_sleep::sleep(g, s.idx, twin, fds, t, sigmask),
            _ => None,
        };
        if let Some(r) = exclusive {
            r
        } else if seg_sleepers.rings == 0 {
            poll(fds, cond)
        } else {
            // The bells this sleep named (§8.8) are polled too, after our own two.
            let mut all = fds.to_vec();
            all.extend(seg_sleepers.bell_pollfds(s.idx));
            let r = poll(&mut all, cond);
            let (own, bells) = all.split_at(fds.len());
            for (j, p) in bells.iter().enumerate().filter(|(_, p)| p.revents != 0) {
                crate::shortcut::bells::drain(s.idx, seg_sleepers.bell_index(j), p);
                bell_events += 1;
            }
            for (f, o) in fds.iter_mut().zip(own) {
                f.revents = o.revents;
            }
            r
        }
    };
    s.slot.sleep.store(sleep_kind::AWAKE, Ordering::Relaxed);
    h.event_waiters.fetch_sub(1, Ordering::Relaxed);
    if let Some(w) = log_sleepers {
        w.fetch_sub(1, Ordering::Relaxed);
    }
    seg_sleepers.leave();
    let mut own_events = 0;
    if fds[n].revents != 0 && fds[n].fd >= 0 {
        crate::conn::slots::drain_port(s.idx, &fds[n]);
        own_events += 1;
    }
    if fds[n + 1].revents != 0 {
        own_events += 1;
    }
    if died(g, &fds[n + 1], r == Ok(0)) {
        mark_dead();
    }
    r.map(|c| c.saturating_sub(own_events + bell_events))
}

/// `ppoll` for a sleeper counted on short-circuited connections (§8.4, barrier.rs):
/// at most DEFER_NS, then the global barrier and a re-check (`cond` true: returns 0
/// with no descriptor ready, as a wake-up would), then the rest of `timeout`.
fn deferred_ppoll(
    fds: &mut [libc::pollfd],
    timeout: Option<i64>,
    sigmask: sys::SigMask,
    cond: &mut dyn FnMut() -> bool,
) -> Result<usize, i32> {
    let step = timeout.map_or(crate::shortcut::barrier::DEFER_NS, |t| {
        t.min(crate::shortcut::barrier::DEFER_NS)
    });
    let t0 = sys::now_ns();
    let r = sys::ppoll(fds, Some(step), sigmask)?;
    if r > 0 || timeout.is_some_and(|t| t <= step) {
        return Ok(r);
    }
    let barrier = crate::shortcut::barrier::global();
    if cond() {
        return Ok(0);
    }
    let rest = timeout.map(|t| (t - (sys::now_ns() - t0)).max(0));
    // Without the barrier (the kernel refused it) re-check every DEFER_NS.
    let rest = if barrier {
        rest
    } else {
        Some(rest.map_or(crate::shortcut::barrier::DEFER_NS, |r| {
            r.min(crate::shortcut::barrier::DEFER_NS)
        }))
    };
    for f in fds.iter_mut() {
        f.revents = 0;
    }
    sys::ppoll(fds, rest, sigmask)
}

/// The sleeper counters (protocol §8.4) a sleeping thread incremented, so it
/// decrements exactly those.
struct SegSleepers {
    words: [*const AtomicU32; 64],
    /// The segment of each counted word (`seg::Mark`): the words are touched again
    /// only where their segment is still mapped (it may go while we sleep).
    marks: [crate::shortcut::seg::Mark; 64],
    /// The bell word (§8.8) of each counted connection, or null (not counted there).
    bell_words: [*const AtomicU64; 64],
    n: usize,
    overflow: bool,
    active: bool,
    /// The sleeping thread's slot.
    slot: u32,
    /// Bit j: the thread named its bell j in some bell word (poll it).
    rings: u32,
    /// The event log's bell word it counted itself in (§8.8), or null.
    log_bell: *const AtomicU64,
}

impl SegSleepers {
    fn new(slot: u32) -> Self {
        SegSleepers {
            words: [core::ptr::null(); 64],
            marks: [crate::shortcut::seg::Mark::NONE; 64],
            bell_words: [core::ptr::null(); 64],
            n: 0,
            overflow: false,
            active: false,
            slot,
            rings: 0,
            log_bell: core::ptr::null(),
        }
    }

    /// Pollfds for the bells named in this sleep (in `bell_index` order).
    fn bell_pollfds(&self, slot: u32) -> impl Iterator<Item = libc::pollfd> + '_ {
        (0..crate::shortcut::bells::PER_THREAD)
            .filter(|j| self.rings & (1 << j) != 0)
            .map(move |j| libc::pollfd {
                fd: crate::shortcut::bells::fd(slot, j),
                events: libc::POLLIN,
                revents: 0,
            })
    }

    /// The bell polled at position `k` of `bell_pollfds`.
    fn bell_index(&self, k: usize) -> usize {
        (0..crate::shortcut::bells::PER_THREAD)
            .filter(|j| self.rings & (1 << j) != 0)
            .nth(k)
            .unwrap_or(0)
    }

    fn add(&mut self, g: &Guest, e: &SocketEntry) {
        if e.kind.load(Ordering::Acquire) != canal_abi::sock_kind::STREAM {
            return;
        }
        let Some(seg) = crate::shortcut::seg::mapped(e.segment.load(Ordering::Acquire)) else {
            return;
        };
        if self.n == self.words.len() {
            self.overflow = true;
            return;
        }
        let side = e.segment_side.load(Ordering::Relaxed);
        seg.announce_sleeper_rules(side);
        // §8.8: count ourselves in the bell word too, naming our bell for this peer if
        // we have one (before the fence, as `sleepers`: Dekker holds for each word).
        self.bell_words[self.n] = core::ptr::null();
        if crate::shortcut::bells::enabled(g) {
            let arena = e.arena.load(Ordering::Relaxed);
            let peer = seg.owner(1 - side.min(1));
            let mine = crate::shortcut::bells::for_sleep(g, self.slot, peer, arena);
            if let Some((_, j)) = mine {
                self.rings |= 1 << j;
            }
            canal_abi::segment::bell::enter(seg.bell(side), mine.map(|(t, _)| t));
            self.bell_words[self.n] = seg.bell(side);
        }
        let w = seg.sleepers(side);
        w.fetch_add(1, Ordering::Relaxed);
        self.words[self.n] = w;
        self.marks[self.n] = seg.mark();
        self.n += 1;
    }

    /// Around the blocking ppoll: segments may be unmapped while we sleep (holding
    /// them through every sleep of every thread kept a server that always had one
    /// sleeping from ever unmapping an arena: one more mapping per client process
    /// met). `resume` holds them again; `leave` then touches only those still mapped.
    fn pause(&self) {
        if self.active {
            crate::shortcut::seg::hold_end();
        }
    }
    fn resume(&self) {
        if self.active {
            crate::shortcut::seg::hold_begin();
        }
    }

    /// Before the sleeper's fence: one socket, or (WAIT_ANY) every mapped one.
    fn enter(&mut self, g: &Guest, index: u32) {
        if g.region.header().features & feature::SHORTCUT == 0 {
            return;
        }
        // A process that never mapped a pair segment has no sleeper word to count
        // (`add` skips unmapped ones): spare the WAIT_ANY walk over the whole socket
        // table (one cache line per entry; docs/bench/why.md).
        if index == WAIT_ANY && !SEGMENT_MAPPED.load(Ordering::Acquire) {
            return;
        }
        self.active = true;
        crate::shortcut::seg::hold_begin();
        if index != WAIT_ANY {
            if let Some(e) = g.region.socket(index) {
                self.add(g, e);
            }
            return;
        }
        for i in 0..g.region.entries_in_use_bound() {
            if let Some(e) = g.region.socket(i) {
                if e.segment.load(Ordering::Relaxed) != 0 {
                    self.add(g, e);
                }
            }
        }
    }

    /// Before the sleeper's fence: the listed sockets only (an epoll set's direct ones).
    fn enter_listed(&mut self, g: &Guest, indices: &[u32]) {
        if indices.is_empty() || g.region.header().features & feature::SHORTCUT == 0 {
            return;
        }
        self.active = true;
        crate::shortcut::seg::hold_begin();
        for &i in indices {
            if let Some(e) = g.region.socket(i) {
                self.add(g, e);
            }
        }
    }

    fn leave(&mut self) {
        let counted = self.words[..self.n].iter().zip(&self.bell_words);
        for ((w, b), m) in counted.zip(&self.marks) {
            // A segment unmapped while we slept (its sockets closed) keeps our count:
            // its peer may wake nobody once more, until the closes reach it.
            if !m.still_mapped() {
                continue;
            }
            // SAFETY: each pointer names a sleeper word of a segment still mapped (just
            // checked, holding: `seg::forget` defers every unmap while a thread is
            // between hold_begin and hold_end).
            unsafe { &**w }.fetch_sub(1, Ordering::Relaxed);
            if !b.is_null() {
                // SAFETY: as above (the same segment's bell word).
                canal_abi::segment::bell::leave(unsafe { &**b });
            }
        }
        self.rings = 0;
        if !self.log_bell.is_null() {
            // SAFETY: the guest's own event log, mapped for the life of the process.
            canal_abi::segment::bell::leave(unsafe { &*self.log_bell });
            self.log_bell = core::ptr::null();
        }
        self.n = 0;
        if self.active {
            self.active = false;
            crate::shortcut::seg::hold_end();
        }
    }
}

/// Wakes this process's own threads sleeping on `index` (local events the host does
/// not see, e.g. shutdown(SHUT_RD) or close by another thread).
pub(crate) fn wake_local(g: &Guest, index: u32) {
    crate::evlog::note_local(index);
    if let Some((seg, side)) = seg_of(g, index) {
        seg.futex_wake(side);
    }
    for (i, a) in SLOT_EFD
        .iter()
        .enumerate()
        .take(g.region.layout().slot_count as usize)
    {
        if a.load(Ordering::Relaxed) < 0 {
            continue;
        }
        if let Some(s) = g.region.slot(i as u32) {
            if s.sleep.load(Ordering::Relaxed) == sleep_kind::EVENTS {
                let w = s.wait_socket.load(Ordering::Relaxed);
                if w == index || w == WAIT_ANY {
                    crate::conn::slots::wake_slot(i as u32);
                }
            }
        }
    }
}

/// The pair segment and side of socket `index`, if it is short-circuited and mapped.
pub(crate) fn seg_of(g: &Guest, index: u32) -> Option<(crate::shortcut::seg::Seg, u32)> {
    if index == WAIT_ANY {
        return None;
    }
    let e = g.region.socket(index)?;
    let seg = crate::shortcut::seg::mapped(e.segment.load(Ordering::Acquire))?;
    Some((seg, e.segment_side.load(Ordering::Relaxed).min(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The eventfd sleep of a poll/epoll counted on short-circuited connections
    /// (§8.4): a publish its re-check missed, with no wake-up, is found DEFER_NS into
    /// the sleep by the global barrier and re-check, not at the timeout.
    #[test]
    fn deferred_ppoll_rechecks_after_the_barrier() {
        let mut fds = [libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }; 2];
        let mut checks = 0;
        let mut cond = || {
            checks += 1;
            true
        };
        let t0 = sys::now_ns();
        let r = deferred_ppoll(
            &mut fds,
            Some(10_000_000_000),
            sys::SigMask::NONE,
            &mut cond,
        );
        let waited = sys::now_ns() - t0;
        assert_eq!(r, Ok(0));
        assert_eq!(checks, 1);
        assert!(waited >= crate::shortcut::barrier::DEFER_NS, "{waited}");
        assert!(waited < 5_000_000_000, "{waited}");
        // A short timeout ends within its first step, without a re-check.
        let mut never = || false;
        assert_eq!(
            deferred_ppoll(&mut fds, Some(1_000_000), sys::SigMask::NONE, &mut never),
            Ok(0)
        );
    }
}
