//! The arming lock of a guest process (libcanal `sock/watch.rs`): many threads may drop
//! or copy descriptors at once (the shared side), and arming — which puts a WATCH pair's
//! end in place of each socket's dummy, under the same numbers — must run while none
//! does (the exclusive side). Guest-only; here so loom can check it (tests/loom.rs).
//!
//! One word: the count of shared holders, and `EXCLUSIVE`. A thread that takes the
//! exclusive side while it holds shared sides itself (a hook that goes on to arm)
//! names how many (`mine`): it waits only for the others.

use crate::sync::{AtomicU32, Ordering};

const EXCLUSIVE: u32 = 1 << 31;

pub struct ArmLock {
    state: AtomicU32,
}

impl Default for ArmLock {
    fn default() -> Self {
        Self::new()
    }
}

impl ArmLock {
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        ArmLock {
            state: AtomicU32::new(0),
        }
    }

    #[cfg(loom)]
    pub fn new() -> Self {
        ArmLock {
            state: AtomicU32::new(0),
        }
    }

    /// One attempt at the shared side; false while the exclusive side is held.
    pub fn try_shared(&self) -> bool {
        let s = self.state.load(Ordering::Acquire);
        s & EXCLUSIVE == 0
            && self
                .state
                .compare_exchange(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
    }

    pub fn release_shared(&self) {
        self.state.fetch_sub(1, Ordering::Release);
    }

    /// One attempt at the exclusive side by a thread holding `mine` shared sides:
    /// succeeds when no other thread holds either side.
    pub fn try_exclusive(&self, mine: u32) -> bool {
        self.state
            .compare_exchange(mine, EXCLUSIVE | mine, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Ends the exclusive side; the caller's own shared sides stay counted.
    pub fn release_exclusive(&self) {
        self.state.fetch_and(!EXCLUSIVE, Ordering::Release);
    }

    /// In a fork child, whose only thread is the one that forked: nothing is held.
    pub fn reset(&self) {
        self.state.store(0, Ordering::Release);
    }
}
