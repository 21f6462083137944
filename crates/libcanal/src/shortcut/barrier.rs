//! The asymmetric sleeper handshake of short-circuited connections (protocol §8.4).
//!
//! A side that publishes bytes (or frees space) must learn whether its peer sleeps:
//! store the index, then read the peer's sleeper counts (Dekker). On x86 the full
//! fence between the two waits for the store to leave the store buffer, i.e. for the
//! index line to be taken from the peer's cache: about a third of a small send's or
//! recv's time. Sleeping is rare and already costs system calls, so the fence moves to
//! the sleeper: a process that maps a pair segment registers for the kernel's global
//! expedited memory barrier (`membarrier(2)`), and may then publish without a fence on
//! a side whose sleepers announced (`SegSide::deferred_barrier`) that they follow the
//! deferred rule:
//!
//! 1. count themselves and fence (as before), re-check, then sleep at most
//!    [`DEFER_NS`];
//! 2. if that sleep ends without a wake-up, issue `MEMBARRIER_CMD_GLOBAL_EXPEDITED`
//!    (every registered thread running on another CPU passes through a full barrier:
//!    a fence-less publisher's index store is then visible, or its later read of the
//!    sleeper count sees us), re-check, and only then sleep as long as asked.
//!
//! A publisher's store stays in its store buffer for nanoseconds, so a wake-up lost to
//! the missing fence is found by step 2 at the latest: it delays that one wake-up by
//! at most [`DEFER_NS`] instead of losing it. Where the kernel refuses the barrier the
//! sleeper re-checks every [`DEFER_NS`] instead (no sleep is ever unbounded). A
//! publisher that is not registered, or a peer side without the announcement (an
//! older libcanal), keeps the fence.

use crate::sys;
use canal_abi::sync::{AtomicU32, Ordering};
use core::sync::atomic::AtomicU8;

/// How long a sleeper on a short-circuited connection sleeps before it issues the
/// global barrier (step 2). Sleeps longer than this pay one extra wake-up and one
/// barrier (~10 µs with an IPI, which also stops the other CPU); the rare wake-up lost
/// to a fence-less publisher (a publish within nanoseconds of the sleeper's last
/// check) is delayed by at most this. It was 500 µs: with many processes on few cores
/// most sleeps outlast that (PostgreSQL's backends on two cores), and paying for each
/// cost a fifth of pgbench's transactions (docs/bench/b10-pg/).
pub(crate) const DEFER_NS: i64 = 5_000_000;

// membarrier(2) commands (linux/membarrier.h).
const CMD_QUERY: i32 = 0;
const CMD_GLOBAL_EXPEDITED: i32 = 1 << 1;
const CMD_REGISTER_GLOBAL_EXPEDITED: i32 = 1 << 2;

const UNKNOWN: u8 = 0;
const YES: u8 = 1;
const NO: u8 = 2;

/// This process registered for global expedited barriers (so may skip the fence).
static REGISTERED: AtomicU8 = AtomicU8::new(UNKNOWN);
/// The kernel lets this process issue a global expedited barrier.
static CAN_ISSUE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// The commands the kernel supports (0 if none); notes whether we may issue the
/// global expedited barrier.
fn query() -> i64 {
    let q = sys::membarrier(CMD_QUERY).unwrap_or(0);
    let can = q & CMD_GLOBAL_EXPEDITED as i64 != 0;
    CAN_ISSUE.store(if can { YES } else { NO }, Ordering::Relaxed);
    q
}

/// Registers this process (idempotent; called when it maps its first pair segment and
/// again in a forked child, whose new mm starts unregistered).
pub(crate) fn register() {
    let q = query();
    let ok = q & CMD_GLOBAL_EXPEDITED as i64 != 0
        && q & CMD_REGISTER_GLOBAL_EXPEDITED as i64 != 0
        && sys::membarrier(CMD_REGISTER_GLOBAL_EXPEDITED).is_ok();
    REGISTERED.store(if ok { YES } else { NO }, Ordering::Release);
}

/// Registers this process on first use; whether it is registered (a thread of a
/// registered process may own a biased side lock, canal_abi::bias).
#[inline]
pub(crate) fn ensure_registered() -> bool {
    match REGISTERED.load(Ordering::Relaxed) {
        YES => true,
        NO => false,
        _ => {
            register();
            REGISTERED.load(Ordering::Relaxed) == YES
        }
    }
}

/// Fork: the child registers again if the parent had.
pub(crate) fn fork_child() {
    if REGISTERED.load(Ordering::Relaxed) == YES {
        register();
    }
}

/// Whether a publish on a connection may go without the fence: we are registered
/// and the peer side's sleepers follow the deferred rule.
#[inline]
pub(crate) fn may_skip_fence(peer_announced: &AtomicU32) -> bool {
    REGISTERED.load(Ordering::Relaxed) == YES && peer_announced.load(Ordering::Relaxed) != 0
}

/// Step 2: makes every fence-less publish that happened before it visible. False if
/// the kernel refuses (the caller then re-checks every DEFER_NS).
pub(crate) fn global() -> bool {
    if CAN_ISSUE.load(Ordering::Relaxed) == UNKNOWN {
        query();
    }
    CAN_ISSUE.load(Ordering::Relaxed) == YES && sys::membarrier(CMD_GLOBAL_EXPEDITED).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipping_needs_registration_and_announcement() {
        let w = AtomicU32::new(1);
        register();
        let registered = REGISTERED.load(Ordering::Relaxed) == YES;
        assert_eq!(may_skip_fence(&w), registered);
        assert!(!may_skip_fence(&AtomicU32::new(0)));
        // This kernel has membarrier (Linux ≥ 4.16): registration and the barrier work.
        assert!(registered, "membarrier registration failed");
        assert!(global());
    }
}
