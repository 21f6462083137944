//! The room rule (protocol §8.4, minor 16): the kernel's SOCK_NOSPACE for
//! short-circuited streams.
//!
//! A side that consumes bytes frees room in its peer's outgoing ring. Before this rule
//! it then woke every sleeping thread of the peer, although almost all of them sleep
//! for bytes, not for room: in a request-response exchange each side, reading the
//! answer, woke the other side's thread that had just gone to sleep waiting for the
//! next request — one wake-up and two context switches more per exchange than the
//! kernel's loopback, whose reader wakes a writer only after that writer found its
//! send buffer full (`sk_stream_write_space` after SOCK_NOSPACE).
//!
//! Now a side that is about to sleep with its outgoing ring full (the re-check after
//! it counted itself a sleeper, `recheck`: a blocked send, a poll or epoll for
//! POLLOUT) raises its `room_wanted` word, fences and looks again (`want`); a
//! consumer, after its own
//! fence, wakes the peer's sleepers only if it takes that word from 1 to 0
//! (`wanted`). Either the consumer sees the word, or the side sees the room (Dekker,
//! as for the sleeper counts; `room_rule_wakes_every_waiter_for_room` in canal-abi's
//! loom tests). Every waiter for room raises the word again before each sleep, so the
//! consumer clearing it never hides a later waiter; a waiter still spinning does not
//! raise it, so a bulk transfer's consumer does not bounce its line. A side announces
//! the rule (`room_rule`, `Seg::announce_sleeper_rules`) before its first sleeper counts itself; a peer library that
//! never announces it is woken after every consume, as before.

use canal_abi::sync::{fence, AtomicU32, Ordering};
use core::cell::Cell;

thread_local! {
    static RECHECKING: Cell<bool> = const { Cell::new(false) };
}

/// Runs a sleeper's re-check `cond` (after it counted itself and fenced): a full
/// outgoing ring it finds asks the peer for room (`Sock::snapshot`).
pub(crate) fn recheck(cond: &mut dyn FnMut() -> bool) -> bool {
    RECHECKING.with(|r| r.set(true));
    let ready = cond();
    RECHECKING.with(|r| r.set(false));
    ready
}

/// Whether the calling thread is in a sleeper's re-check.
#[inline]
pub(crate) fn rechecking() -> bool {
    RECHECKING.with(|r| r.get())
}

/// A side found its outgoing ring full and may wait for room: raise its
/// `room_wanted` word, then fence. The caller looks at the ring's tail again after.
#[inline]
pub(crate) fn want(w: &AtomicU32) {
    if w.load(Ordering::Relaxed) == 0 {
        w.store(1, Ordering::Release);
    }
    // Pairs with the consumer's fence between its tail store and `wanted`.
    fence(Ordering::SeqCst);
}

/// After this side consumed from the peer's ring and fenced (or, under the deferred
/// barrier, not: the peer's sleepers then re-check after a global barrier), given the
/// peer's `room_rule` and `room_wanted` words: whether the peer must hear of it — it
/// asked for room (taken back here), or it does not follow the rule.
#[inline]
pub(crate) fn wanted(rule: &AtomicU32, w: &AtomicU32) -> bool {
    if rule.load(Ordering::Relaxed) == 0 {
        return true;
    }
    // Acquire: the waiter counted itself a sleeper before raising the word.
    w.load(Ordering::Relaxed) != 0 && w.swap(0, Ordering::AcqRel) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consume_wakes_only_a_side_that_asked_or_follows_no_rule() {
        let (rule, word) = (AtomicU32::new(0), AtomicU32::new(0));
        // An older library never announces: woken after every consume, as before.
        assert!(wanted(&rule, &word));
        assert!(wanted(&rule, &word));
        rule.store(1, Ordering::Relaxed); // Seg::announce_sleeper_rules
        assert!(!wanted(&rule, &word), "woken without asking for room");
        want(&word);
        assert!(wanted(&rule, &word));
        // Taken back: the next consume does not wake it unless it asks again.
        assert!(!wanted(&rule, &word));
        assert_eq!(word.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn only_a_sleepers_recheck_asks() {
        assert!(!rechecking());
        let mut inside = false;
        assert!(recheck(&mut || {
            inside = rechecking();
            true
        }));
        assert!(inside && !rechecking());
    }
}
