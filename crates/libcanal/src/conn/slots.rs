//! Per-thread request slots: a thread keeps one of the first three quarters, later
//! threads borrow one per request; each owned slot has an eventfd wake-up port.
use crate::conn::ctl::register_port;
use crate::conn::guest::guest;
use crate::conn::guest::is_dead;
use crate::conn::guest::Guest;
use crate::fdtable::TABLE;
use crate::sys;
use canal_abi::sleep_kind;
use canal_abi::slot_state;
use canal_abi::sync::Ordering;
use canal_abi::Slot;
use core::cell::Cell;
use core::sync::atomic::AtomicI32;
use core::sync::atomic::AtomicI64;
use libc::c_int;

/// The calling thread's slot, if it holds one.
pub(crate) fn my_slot_index() -> Option<u32> {
    SLOT.try_with(|s| s.idx.get())
        .ok()
        .filter(|&i| i != NO_SLOT)
}

/// Eventfd of each slot this process owns (for waking local sleepers on local events).
pub(crate) static SLOT_EFD: [AtomicI32; canal_abi::MAX_SLOTS as usize] =
    [const { AtomicI32::new(-1) }; canal_abi::MAX_SLOTS as usize];

const NO_SLOT: u32 = u32::MAX;

struct ThreadSlot {
    idx: Cell<u32>,
    /// A thread that found every keepable slot kept (it borrows instead) looks again
    /// only after this (monotonic ns): a look scans them all.
    retry_at: Cell<i64>,
}

/// How long a thread that could not keep a slot borrows before it looks again.
const BIND_RETRY_NS: i64 = 50_000_000;

/// Process-wide: until when (monotonic ns) every keepable slot was last found kept.
/// One thread's failed look tells the others, until a kept slot is released: each
/// look reads every keepable slot, and thousands of threads beyond the slots looked
/// every BIND_RETRY_NS each.
static KEPT_UNTIL: AtomicI64 = AtomicI64::new(0);

/// Process-wide: when the next look for kept slots of dead threads may be made. It
/// asks the kernel whether each owner lives (kill(tid, 0)): with 4,000 threads beyond
/// the slots each asking about 1,536 owners every 50 ms, those calls were half of all
/// CPU samples and the run took 2-4x its native time (2026-11-28).
static TAKEOVER_AT: AtomicI64 = AtomicI64::new(0);

/// At most one look for dead owners' slots per process this often.
const TAKEOVER_EVERY_NS: i64 = 1_000_000_000;

/// Whether this look may take over dead owners' slots (one thread per interval).
fn takeover_turn(now: i64) -> bool {
    let at = TAKEOVER_AT.load(Ordering::Relaxed);
    now >= at
        && TAKEOVER_AT
            .compare_exchange(
                at,
                now + TAKEOVER_EVERY_NS,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
}

/// A kept slot was released (or this is a new process): threads that borrow may keep
/// one again at once.
fn kept_slot_released() {
    KEPT_UNTIL.store(0, Ordering::Relaxed);
}

/// Whether a thread without a kept slot looks for one now (`retry_at`: its own next
/// look).
fn worth_a_look(now: i64, retry_at: i64) -> bool {
    now >= retry_at && now >= KEPT_UNTIL.load(Ordering::Relaxed)
}

/// A look at `now` found every keepable slot kept.
fn found_all_kept(now: i64) {
    KEPT_UNTIL.store(now + BIND_RETRY_NS, Ordering::Relaxed);
}

impl Drop for ThreadSlot {
    fn drop(&mut self) {
        let idx = self.idx.replace(NO_SLOT);
        if idx != NO_SLOT {
            if let Some(g) = guest() {
                release_slot(g, idx, slot_efd(idx));
                kept_slot_released();
            }
        }
    }
}

thread_local! {
    static SLOT: ThreadSlot = const {
        ThreadSlot { idx: Cell::new(NO_SLOT), retry_at: Cell::new(0) }
    };
}

/// A slot in use by the calling thread. Temporary slots (a thread whose thread-locals
/// are already gone) are released on drop and wait by backoff.
pub(crate) struct SlotRef<'g> {
    pub(crate) g: &'g Guest,
    pub(crate) idx: u32,
    pub(crate) slot: &'g Slot,
    /// The slot's eventfd when the reference was made (-1: none); act on it only
    /// through `slot_efd`, inside ownfd::using (it may have moved since).
    pub(crate) efd: c_int,
    temp: bool,
}

/// Slot `idx`'s eventfd now (ownfd.rs may move it), -1 if it has none.
#[inline]
pub(crate) fn slot_efd(idx: u32) -> c_int {
    SLOT_EFD
        .get(idx as usize)
        .map_or(-1, |a| a.load(Ordering::SeqCst))
}

/// Wakes the thread asleep on slot `idx`'s eventfd (if it is awake by now, its next
/// sleep returns at once: every sleep re-checks what it waits for).
pub(crate) fn wake_slot(idx: u32) {
    crate::ownfd::using(|| {
        let efd = slot_efd(idx);
        if efd >= 0 {
            let _ = sys::eventfd_signal(efd);
        }
    });
}

/// Drains slot `idx`'s eventfd after a ppoll entry `p` for it had events — only if it
/// is still ours (it may have moved while we slept: ownfd.rs).
pub(crate) fn drain_port(idx: u32, p: &libc::pollfd) {
    crate::ownfd::using(|| {
        if p.fd >= 0 && p.fd == slot_efd(idx) {
            sys::eventfd_drain(p.fd);
        }
    });
}

/// Points the slot eventfd or epoll instance holding `old` at `new` (it moved:
/// ownfd.rs).
pub(crate) fn retarget(old: c_int, new: c_int) -> bool {
    crate::ownfd::retarget(SLOT_EFD.iter().chain(SLOT_EP.iter()), old, new)
}

/// The epoll instance of each slot this process owns, for a thread blocked in
/// accept() (conn/accept_sleep.rs; -1: none made yet). It holds the slot's port, so
/// it goes with the slot or its port (`forget_sleep_instance`).
pub(crate) static SLOT_EP: [AtomicI32; canal_abi::MAX_SLOTS as usize] =
    [const { AtomicI32::new(-1) }; canal_abi::MAX_SLOTS as usize];

/// Slot `idx` changes hands or port: its epoll instance goes with it.
pub(crate) fn forget_sleep_instance(idx: u32) {
    if let Some(a) = SLOT_EP.get(idx as usize) {
        crate::ownfd::close_held(a);
    }
}

impl Drop for SlotRef<'_> {
    fn drop(&mut self) {
        if self.temp {
            release_slot(self.g, self.idx, -1);
        }
    }
}

pub(crate) fn release_slot(g: &Guest, idx: u32, efd: c_int) {
    if efd >= 0 {
        crate::shortcut::bells::release(idx);
    }
    forget_sleep_instance(idx);
    if let Some(s) = g.region.slot(idx) {
        s.sleep.store(sleep_kind::AWAKE, Ordering::Relaxed);
        // A slot is only released IDLE (no request outstanding). Release pairs with
        // the Acquire CAS of the next claimer.
        let _ = s.state.compare_exchange(
            slot_state::IDLE,
            slot_state::FREE,
            Ordering::Release,
            Ordering::Relaxed,
        );
    }
    if efd >= 0 {
        crate::ownfd::using(|| {
            // The published number (it may have moved), else the unpublished one.
            let cur = SLOT_EFD
                .get(idx as usize)
                .map_or(-1, |a| a.swap(-1, Ordering::SeqCst));
            let efd = if cur >= 0 { cur } else { efd };
            if efd < 0 || crate::conn::ivshmem::is_irq_efd(efd) {
                return; // an interrupt vector's eventfd: the next holder of the slot uses it
            }
            crate::ownfd::close_own(efd);
        });
    }
}

/// Slots a thread may keep for its lifetime: all but a quarter (at least one when
/// there are two or more), which stay for threads beyond that number to borrow one
/// request at a time (`claim_temp`), so any number of threads can make requests.
fn bindable(n: u32) -> u32 {
    match n {
        0 | 1 => n,
        2..=7 => n - 1,
        _ => n - n / 4,
    }
}

/// A free slot among the first `limit`. `kept` (a thread's own slot): the lowest
/// free, and if none is, in this process's turn (`takeover_turn`), an idle one whose
/// owner thread is gone (one liveness check per idle slot: not for every borrow).
fn claim_slot(g: &Guest, limit: u32, kept: bool) -> Result<u32, i32> {
    let n = g.region.layout().slot_count.min(limit);
    if n == 0 {
        return Err(libc::EAGAIN);
    }
    let tid = sys::gettid() as u32;
    // A thread's own slot: the lowest free, so the slots that can hold a sleeper stay
    // below `slots_used` and canald's scan for sleepers stays short. A borrowed one
    // (never a sleeper): anywhere, spread by thread.
    let start = if kept { 0 } else { tid % n };
    for pass in 0..(1 + kept as u32) {
        if pass == 1 && !takeover_turn(sys::now_ns()) {
            break;
        }
        for i in 0..n {
            let idx = (start + i) % n;
            let Some(s) = g.region.slot(idx) else {
                continue;
            };
            let claimed = if pass == 0 {
                // A plain load first: most slots are kept by threads, and a failing
                // CAS would still take each one's line from the core using it.
                // Acquire pairs with the Release in release_slot.
                s.state.load(Ordering::Relaxed) == slot_state::FREE
                    && s.state
                        .compare_exchange(
                            slot_state::FREE,
                            slot_state::IDLE,
                            Ordering::Acquire,
                            Ordering::Relaxed,
                        )
                        .is_ok()
            } else {
                // Second pass: take over IDLE slots whose owner thread is gone (a
                // process that died without releasing them). The CAS on `owner` makes
                // exactly one claimer win.
                let owner = s.owner.load(Ordering::Relaxed);
                s.state.load(Ordering::Acquire) == slot_state::IDLE
                    && owner != 0
                    && !sys::alive(owner as i32)
                    && s.owner
                        .compare_exchange(owner, tid, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
            };
            if claimed {
                s.owner.store(tid, Ordering::Relaxed);
                s.sleep.store(sleep_kind::AWAKE, Ordering::Relaxed);
                return Ok(idx);
            }
        }
    }
    Err(libc::EAGAIN)
}

/// A slot for one request of a thread that has none of its own: any free slot, waited
/// for if all are busy (borrowed slots are released after each request, so one frees).
fn claim_temp(g: &Guest) -> Result<u32, i32> {
    let n = g.region.layout().slot_count;
    let mut tries = 0u32;
    loop {
        // A dead owner's slot is taken over by threads that keep slots, not here.
        match claim_slot(g, n, false) {
            Ok(i) => return Ok(i),
            Err(_) if !is_dead(g) => {
                // Sleep, not yield: on few cores the holders need the CPU.
                tries = tries.saturating_add(1);
                sys::sleep_ns(20_000 * i64::from(tries.min(50)));
            }
            Err(e) => return Err(e),
        }
    }
}

fn claim_for_thread(g: &Guest) -> Result<(u32, c_int), i32> {
    let idx = claim_slot(g, bindable(g.region.layout().slot_count), true)?;
    // Before the slot can sleep: canald's scan for sleepers stops at `slots_used`.
    g.region
        .header()
        .slots_used
        .fetch_max(idx + 1, Ordering::Relaxed);
    if !g.ports {
        return Ok((idx, -1));
    }
    if g.ctl() < 0 {
        // ivshmem with doorbell interrupts: slot idx's port is MSI-X vector idx's
        // eventfd, shared by this process family and never closed (-1 beyond the
        // routed vectors: that slot backs off).
        let efd = crate::conn::ivshmem::irq_efd(idx);
        if let Some(a) = SLOT_EFD.get(idx as usize) {
            a.store(efd, Ordering::Relaxed);
        }
        return Ok((idx, efd));
    }
    let efd = match sys::eventfd() {
        Ok(f) => f,
        // No descriptor to be had (RLIMIT_NOFILE lowered by a sandboxing program, or
        // confined: sys.rs): keep the slot without a port; its waits back off.
        Err(_) => return Ok((idx, -1)),
    };
    let efd = crate::ownfd::adopt(efd);
    // A slot taken over from a dead thread: its instance held the old port.
    forget_sleep_instance(idx);
    if let Err(e) = register_port(g, idx, efd) {
        release_slot(g, idx, efd);
        return Err(e);
    }
    if let Some(a) = SLOT_EFD.get(idx as usize) {
        a.store(efd, Ordering::Relaxed);
    }
    Ok((idx, efd))
}

/// The thread's kept slot, claimed (and its port registered) on first use; EAGAIN
/// while every keepable slot is kept (looked at again after BIND_RETRY_NS).
fn bind_thread_slot(g: &Guest, s: &ThreadSlot) -> Result<(u32, c_int), i32> {
    if s.idx.get() == NO_SLOT {
        let now = sys::now_ns();
        if !worth_a_look(now, s.retry_at.get()) {
            return Err(libc::EAGAIN);
        }
        match claim_for_thread(g) {
            Ok((idx, _)) => s.idx.set(idx),
            Err(e) => {
                if e == libc::EAGAIN {
                    s.retry_at.set(now + BIND_RETRY_NS);
                    found_all_kept(now);
                }
                return Err(e);
            }
        }
    }
    let idx = s.idx.get();
    Ok((idx, slot_efd(idx)))
}

/// The calling thread's own slot, claimed (and its port registered) on first use;
/// None for a thread beyond the slots threads may keep (or past its thread-locals):
/// such a thread sleeps with `sleep_backoff` instead of holding a borrowed slot.
pub(crate) fn own_slot(g: &'static Guest) -> Option<SlotRef<'static>> {
    let (idx, efd) = SLOT.try_with(|s| bind_thread_slot(g, s)).ok()?.ok()?;
    Some(SlotRef {
        g,
        idx,
        slot: g.region.slot(idx)?,
        efd,
        temp: false,
    })
}

/// The calling thread's slot, claimed (and its port registered) on first use.
pub(crate) fn my_slot(g: &'static Guest) -> Result<SlotRef<'static>, i32> {
    let r = SLOT.try_with(|s| bind_thread_slot(g, s));
    let (idx, efd, temp) = match r {
        Ok(Ok((i, e))) => (i, e, false),
        // Every slot a thread may keep is kept by another thread: borrow one.
        Ok(Err(libc::EAGAIN)) => (claim_temp(g)?, -1, true),
        Ok(Err(e)) => return Err(e),
        // Thread-locals already destroyed (a late destructor): use a temporary slot.
        Err(_) => (claim_temp(g)?, -1, true),
    };
    let slot = g.region.slot(idx).ok_or(libc::EIO)?;
    Ok(SlotRef {
        g,
        idx,
        slot,
        efd,
        temp,
    })
}

/// In a fork child: the slots this process held belong to the parent's threads.
pub(crate) fn forget_in_child() {
    // The forking thread's slot belongs to the parent's thread: forget it (the child
    // claims its own on first use). The eventfd copy is closed; the region stays mapped.
    let _ = SLOT.try_with(|s| s.idx.set(NO_SLOT));
    // The parent's threads kept the parent's slots; this process has kept none yet.
    kept_slot_released();
    for a in SLOT_EP.iter() {
        // The instances of the parent's threads' slots (the child must not change them).
        let ep = a.swap(-1, Ordering::Relaxed);
        if ep >= 0 && TABLE.get(ep) == Some(crate::fdtable::Entry::Internal) {
            crate::ownfd::close_own(ep);
        }
    }
    for a in SLOT_EFD.iter() {
        let efd = a.swap(-1, Ordering::Relaxed);
        if efd >= 0
            && !crate::conn::ivshmem::is_irq_efd(efd)
            && TABLE.get(efd) == Some(crate::fdtable::Entry::Internal)
        {
            // Other threads' eventfds: those threads do not exist in the child.
            crate::ownfd::close_own(efd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Thousands of threads beyond the slots must not each scan the slots, nor each
    /// ask the kernel about every owner: one look for dead owners per interval per
    /// process, and one failed look holds the others off until a kept slot is freed.
    #[test]
    fn threads_beyond_the_slots_look_rarely() {
        let t = 1_000_000_000_000_000; // beyond any turn taken by another test
        assert!(takeover_turn(t));
        assert!(
            !takeover_turn(t + 1),
            "a second thread in the same interval"
        );
        assert!(!takeover_turn(t + TAKEOVER_EVERY_NS - 1));
        assert!(takeover_turn(t + TAKEOVER_EVERY_NS));

        assert!(worth_a_look(t, 0));
        found_all_kept(t);
        assert!(!worth_a_look(t + 1, 0), "another thread's look just failed");
        assert!(worth_a_look(t + BIND_RETRY_NS, 0));
        assert!(!worth_a_look(t + 1, t + 2), "this thread's own next look");
        found_all_kept(t);
        kept_slot_released();
        assert!(worth_a_look(t + 1, 0), "a kept slot was freed");
    }
}
