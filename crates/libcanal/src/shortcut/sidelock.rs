//! The senders' and receivers' locks of a socket entry, biased to the thread that uses
//! them (canal_abi::bias; protocol §3.4): the usual one-thread-per-side socket enters
//! its side with two plain stores instead of a locked instruction.

use canal_abi::bias::{Entered, LockEnv, SideLock};
use canal_abi::region::SocketEntry;
use canal_abi::sync::Ordering;

/// This thread's owner key: its process id and its thread pointer, both cheap to read
/// (no thread-local lookup: docs/bench/why.md, "Side-lock owner key"). The thread
/// pointer alone is not enough: a forked child's thread has its parent's, and threads
/// in different processes can share a value. Thread pointers are 64-byte aligned
/// user addresses below 2^47 and pids below 2^22 (`pid_max` ≤ 4194304), so the key is
/// exact and never 0 or `REVOKED`.
#[inline]
fn me() -> u64 {
    let pid = crate::rt::PID.load(Ordering::Relaxed) as u64;
    (pid << 41) | (thread_pointer() >> 6)
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn thread_pointer() -> u64 {
    let tp: u64;
    // SAFETY: on x86-64 Linux %fs:0 holds the thread control block's address (the
    // TLS ABI's self pointer); reading it has no side effects.
    unsafe {
        core::arch::asm!("mov {}, qword ptr fs:0", out(reg) tp, options(nostack, readonly, preserves_flags));
    }
    tp
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn thread_pointer() -> u64 {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as u64 }
}

/// B2 is the kernel's global expedited barrier; waits back off as `crate::rt::lock` does.
struct Env;

impl LockEnv for Env {
    fn barrier(&self) -> bool {
        crate::shortcut::barrier::global()
    }
    fn wait(&self, n: u32) {
        crate::rt::backoff(n);
    }
}

fn tx(e: &SocketEntry) -> SideLock<'_> {
    SideLock {
        lock: &e.tx_lock,
        bias: &e.tx_bias,
        busy: &e.tx_busy,
    }
}

fn rx(e: &SocketEntry) -> SideLock<'_> {
    SideLock {
        lock: &e.rx_lock,
        bias: &e.rx_bias,
        busy: &e.rx_busy,
    }
}

/// Whether this thread may become a side's owner: its process receives B2, and can
/// issue it (a confined process cannot: sys.rs, "confinement").
#[inline]
fn may_bias() -> bool {
    !crate::sys::confined() && crate::shortcut::barrier::ensure_registered()
}

/// Enters the senders' side of `e`.
#[inline]
pub(crate) fn enter_tx(e: &SocketEntry) -> Entered {
    tx(e).enter(me(), may_bias, &Env)
}

/// Ends biasing on both sides of `e` (before this process loses membarrier).
pub(crate) fn revoke_both(e: &SocketEntry) {
    tx(e).revoke(&Env);
    rx(e).revoke(&Env);
}

#[inline]
pub(crate) fn exit_tx(e: &SocketEntry, how: Entered) {
    tx(e).exit(how)
}

/// Enters the receivers' side of `e`.
#[inline]
pub(crate) fn enter_rx(e: &SocketEntry) -> Entered {
    rx(e).enter(me(), may_bias, &Env)
}

#[inline]
pub(crate) fn exit_rx(e: &SocketEntry, how: Entered) {
    rx(e).exit(how)
}

#[cfg(test)]
mod tests {
    use super::*;
    use canal_abi::sync::{AtomicU32, AtomicU64};
    use std::cell::UnsafeCell;
    use std::sync::Barrier;

    const CS_SPINS: u32 = 300;

    struct Side {
        lock: AtomicU32,
        bias: AtomicU64,
        busy: AtomicU32,
        count: UnsafeCell<u64>,
        /// The owner's bumps so far, for the revoker to time its entry.
        progress: AtomicU32,
    }
    // SAFETY: `count` is only touched inside the side lock under test.
    unsafe impl Sync for Side {}

    impl Side {
        fn lock(&self) -> SideLock<'_> {
            SideLock {
                lock: &self.lock,
                bias: &self.bias,
                busy: &self.busy,
            }
        }
        /// A read-modify-write made slow on purpose: two holders at once lose counts.
        fn bump(&self, me: u64) {
            let s = self.lock();
            let how = s.enter(me, crate::shortcut::barrier::ensure_registered, &Env);
            // SAFETY: inside the side lock.
            unsafe {
                let v = core::ptr::read_volatile(self.count.get());
                // Long enough (~10 µs) to still be inside when a revoker's barrier
                // returns: a revoker that does not wait for it then overlaps.
                for _ in 0..CS_SPINS {
                    core::hint::spin_loop();
                }
                core::ptr::write_volatile(self.count.get(), v + 1);
            }
            s.exit(how);
        }
    }

    /// The real thing (membarrier as B2, thread ids as owners, two cores): on each of
    /// many fresh sides an owner bumps a counter in a tight loop on its fast path while
    /// another thread revokes and bumps; no bump may be lost. (The loom model proves
    /// the protocol; this catches a build whose barrier or wait does not do its job.)
    #[test]
    fn revocation_racing_a_busy_owner_loses_nothing() {
        const SIDES: usize = 100;
        const OWNER_BUMPS: u64 = 100;
        const OTHER_BUMPS: u64 = 50;
        let sides: Vec<Side> = (0..SIDES)
            .map(|_| Side {
                lock: AtomicU32::new(0),
                bias: AtomicU64::new(0),
                busy: AtomicU32::new(0),
                count: UnsafeCell::new(0),
                progress: AtomicU32::new(0),
            })
            .collect();
        let start = Barrier::new(2);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                let me = me();
                for side in &sides {
                    side.bump(me); // takes the bias
                    assert_eq!(side.bias.load(Ordering::Relaxed), me);
                }
                start.wait();
                for side in &sides {
                    for i in 1..OWNER_BUMPS {
                        side.bump(me);
                        side.progress.store(i as u32, Ordering::Relaxed);
                    }
                }
            });
            sc.spawn(|| {
                start.wait();
                let me = me();
                for side in &sides {
                    // Revoke while the owner is (likely) mid-loop on this side.
                    while u64::from(side.progress.load(Ordering::Relaxed)) < OWNER_BUMPS / 4 {
                        core::hint::spin_loop();
                    }
                    for _ in 0..OTHER_BUMPS {
                        side.bump(me);
                    }
                }
            });
        });
        for (i, side) in sides.iter().enumerate() {
            assert_eq!(
                // SAFETY: both threads are done.
                unsafe { *side.count.get() },
                OWNER_BUMPS + OTHER_BUMPS,
                "side {i}: a bump was lost"
            );
            assert_eq!(side.bias.load(Ordering::Relaxed), canal_abi::bias::REVOKED);
        }
    }
}
