//! The biased side lock of a socket entry (protocol §3.4, minor 4).
//!
//! Senders on one socket are serialised by `tx_lock`, receivers by `rx_lock`. Almost
//! always one thread sends and one receives, yet taking a lock is a locked instruction,
//! and on x86 a locked instruction waits for the store buffer to drain: for the
//! previous call's index store to take its line back from the peer's core. That wait
//! was a fifth of a 64-byte send.
//!
//! So the first thread to take a side's lock keeps it *biased*: `bias` holds its owner
//! key (a value unique to one live thread of one process), and it then enters with two plain stores to `busy` around its call — no locked
//! instruction. Any other thread takes the ordinary lock and *revokes* the bias for good:
//!
//! ```text
//! owner (fast path)                   revoker (holds the ordinary lock)
//! busy = 1                            bias = REVOKED
//! [barrier B1]                        [barrier B2: membarrier(2)]
//! if bias == me: enter                wait until busy == 0; enter
//! else: busy = 0, take the lock
//! ```
//!
//! This is Dekker's handshake with the owner's fence moved to the revoker: B1 is only a
//! compiler barrier in the owner, and B2 is `MEMBARRIER_CMD_GLOBAL_EXPEDITED`, which
//! runs a full barrier on every CPU that runs a registered process's thread. After B2
//! either the owner's `busy = 1` is visible to the revoker, or the owner's later load
//! of `bias` sees REVOKED. An owner must therefore belong to a registered process, and
//! a revoker must be able to issue the barrier: callers pass `may_bias` and a
//! [`LockEnv`].
//! (The loom model stands B1 and B2 in as SeqCst fences on both sides, the ordering
//! the kernel's barrier supplies.)
//!
//! A revoked side stays revoked: a socket two threads use pays the lock, and at most
//! one barrier in its life.

use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};

/// `bias` of a side whose bias was revoked: no thread has the fast path any more.
pub const REVOKED: u64 = u64::MAX;

/// The three words of one side (sender or receiver) of a socket entry.
pub struct SideLock<'a> {
    pub lock: &'a AtomicU32,
    pub bias: &'a AtomicU64,
    pub busy: &'a AtomicU32,
}

/// What the lock needs from its process: B2, and a way to wait.
pub trait LockEnv {
    /// Runs B2 (every registered thread on another CPU passes a full barrier); false
    /// if it could not (it is then retried).
    fn barrier(&self) -> bool;
    /// Waits a little: the `n`th round of a wait for the lock or for `busy`.
    fn wait(&self, n: u32);
}

/// How a side was entered; give it back to [`SideLock::exit`].
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entered {
    Biased,
    Locked,
}

impl SideLock<'_> {
    /// Enters the side as the thread whose owner key is `me` (non-zero, not REVOKED).
    /// `may_bias` (asked only when the side has no owner yet): this thread may become
    /// the owner (its process receives the barrier B2).
    #[inline]
    pub fn enter(&self, me: u64, may_bias: impl FnOnce() -> bool, env: &impl LockEnv) -> Entered {
        if self.bias.load(Ordering::Relaxed) == me {
            self.busy.store(1, Ordering::Relaxed);
            owner_barrier();
            // BL1: Acquire is not needed for data: only this thread entered since it
            // became the owner (a revoked owner never comes back here).
            if self.bias.load(Ordering::Relaxed) == me {
                return Entered::Biased;
            }
            // BL2: Release pairs with the revoker's BL4 for what we wrote before.
            self.busy.store(0, Ordering::Release);
        }
        self.enter_slow(me, may_bias, env)
    }

    #[cold]
    fn enter_slow(&self, me: u64, may_bias: impl FnOnce() -> bool, env: &impl LockEnv) -> Entered {
        self.lock_word(env);
        match self.bias.load(Ordering::Relaxed) {
            0 if may_bias() => self.bias.store(me, Ordering::Relaxed),
            0 | REVOKED => {}
            b if b == me => {}
            _ => self.revoke_locked(env),
        }
        Entered::Locked
    }

    /// With the lock word held: takes the bias from its owner for good (REVOKED), and
    /// waits until the owner's call in progress, if any, is complete.
    fn revoke_locked(&self, env: &impl LockEnv) {
        self.bias.store(REVOKED, Ordering::Relaxed);
        let mut n = 0u32;
        while !env.barrier() {
            n = n.wrapping_add(1);
            env.wait(n);
        }
        // BL4: Acquire pairs with BL2/BL3: the owner's call is complete.
        while self.busy.load(Ordering::Acquire) != 0 {
            n = n.wrapping_add(1);
            env.wait(n);
        }
    }

    /// Ends biasing on this side for good, whoever owns it (this thread included): from
    /// now on every entry takes the lock word, so no later entry needs B2. For a
    /// process about to lose the barrier (a seccomp filter that forbids membarrier).
    pub fn revoke(&self, env: &impl LockEnv) {
        self.lock_word(env);
        match self.bias.load(Ordering::Relaxed) {
            REVOKED => {}
            0 => self.bias.store(REVOKED, Ordering::Relaxed),
            _ => self.revoke_locked(env),
        }
        // L2: Release pairs with L1.
        self.lock.store(0, Ordering::Release);
    }

    /// Leaves the side.
    pub fn exit(&self, how: Entered) {
        match how {
            // BL3: Release pairs with BL4.
            Entered::Biased => self.busy.store(0, Ordering::Release),
            // L2: Release pairs with L1.
            Entered::Locked => self.lock.store(0, Ordering::Release),
        }
    }

    fn lock_word(&self, env: &impl LockEnv) {
        let mut n = 0u32;
        // L1: Acquire pairs with L2: the previous holder's writes are visible.
        while self
            .lock
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            n = n.wrapping_add(1);
            env.wait(n);
        }
    }
}

/// B1. Without loom a compiler barrier: the revoker's membarrier supplies the fence.
#[cfg(not(loom))]
#[inline(always)]
fn owner_barrier() {
    core::sync::atomic::compiler_fence(Ordering::SeqCst);
}

/// B1 under loom: the fence that the revoker's membarrier puts into this thread.
#[cfg(loom)]
fn owner_barrier() {
    fence(Ordering::SeqCst);
}

/// B2 as a SeqCst fence in the revoker (the loom model, and tests in one thread),
/// waiting as a spin.
pub struct FenceEnv;

impl LockEnv for FenceEnv {
    fn barrier(&self) -> bool {
        fence(Ordering::SeqCst);
        true
    }
    fn wait(&self, _n: u32) {
        crate::sync::spin_hint();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    type Words = (AtomicU32, AtomicU64, AtomicU32);

    fn side() -> Words {
        (AtomicU32::new(0), AtomicU64::new(0), AtomicU32::new(0))
    }

    fn over(w: &Words) -> SideLock<'_> {
        SideLock {
            lock: &w.0,
            bias: &w.1,
            busy: &w.2,
        }
    }

    #[test]
    fn first_taker_owns_then_enters_without_the_lock() {
        let w = side();
        let s = over(&w);
        assert_eq!(s.enter(7, || true, &FenceEnv), Entered::Locked);
        assert_eq!(w.1.load(Ordering::Relaxed), 7);
        s.exit(Entered::Locked);
        let e = s.enter(7, || true, &FenceEnv);
        assert_eq!(e, Entered::Biased);
        assert_eq!(
            (w.0.load(Ordering::Relaxed), w.2.load(Ordering::Relaxed)),
            (0, 1)
        );
        s.exit(e);
        assert_eq!(w.2.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn another_thread_revokes_for_good() {
        let w = side();
        let s = over(&w);
        s.exit(s.enter(7, || true, &FenceEnv));
        struct Count(core::cell::Cell<u32>);
        impl LockEnv for Count {
            fn barrier(&self) -> bool {
                self.0.set(self.0.get() + 1);
                true
            }
            fn wait(&self, _n: u32) {}
        }
        let count = &Count(core::cell::Cell::new(0));
        let barriers = &count.0;
        assert_eq!(s.enter(9, || true, count), Entered::Locked);
        assert_eq!((w.1.load(Ordering::Relaxed), barriers.get()), (REVOKED, 1));
        s.exit(Entered::Locked);
        // Neither the old owner nor anyone else gets the fast path again.
        assert_eq!(s.enter(7, || true, count), Entered::Locked);
        s.exit(Entered::Locked);
        assert_eq!(s.enter(9, || true, count), Entered::Locked);
        s.exit(Entered::Locked);
        assert_eq!(barriers.get(), 1);
    }

    #[test]
    fn without_may_bias_nobody_owns() {
        let w = side();
        let s = over(&w);
        s.exit(s.enter(7, || false, &FenceEnv));
        assert_eq!(w.1.load(Ordering::Relaxed), 0);
        assert_eq!(s.enter(7, || false, &FenceEnv), Entered::Locked);
    }
}
