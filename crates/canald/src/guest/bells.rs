//! Bells (protocol §8.8): direct peer wake-ups between the guests of arena
//! connections.
//!
//! A guest thread about to sleep on short-circuited connections registers, once per
//! peer guest, an eventfd of its own (BELL_SET, naming an arena of the pair) and
//! names it by its tag in each connection's bell word. The peer, finding one tag
//! there, asks canald for that eventfd (BELL_GET, once) and from then on wakes the
//! thread itself: one wake-up instead of two, and canald is not woken at all.
//!
//! A bell is kept per (owner guest, tag, peer guest): a peer is only ever given bells
//! meant for it, so the worst it can do with one (read it, flood it, saturate its
//! counter) is to delay or spuriously wake the owner's waits on connections with that
//! very peer. A thread's next binding of its slot takes a new tag; canald drops the
//! slot's old bells when the slot's new wake-up port arrives (PORT), and all of a
//! guest's when it leaves.

use std::collections::HashMap;
use std::os::fd::OwnedFd;

/// Bells one guest may register (its threads × the peers they sleep on).
pub(crate) const MAX_PER_GUEST: usize = 16384;

pub(crate) struct Bells {
    /// (owner, tag, peer) → the owner thread's eventfd for that peer.
    by_key: HashMap<(u32, u32, u32), OwnedFd>,
    per_owner: HashMap<u32, usize>,
    /// Bells handed to each guest (BELL_GET answered), for `canal stat`.
    given: HashMap<u32, u64>,
    limit: usize,
}

impl Default for Bells {
    fn default() -> Self {
        Bells {
            by_key: HashMap::new(),
            per_owner: HashMap::new(),
            given: HashMap::new(),
            limit: MAX_PER_GUEST,
        }
    }
}

impl Bells {
    /// Owner `owner`'s thread with `tag` registers `fd` for peer `peer` (replacing an
    /// earlier one). ENOSPC beyond MAX_PER_GUEST.
    pub(crate) fn set(&mut self, owner: u32, tag: u32, peer: u32, fd: OwnedFd) -> Result<(), i32> {
        let n = self.per_owner.entry(owner).or_default();
        if self.by_key.insert((owner, tag, peer), fd).is_none() {
            if *n >= self.limit {
                self.by_key.remove(&(owner, tag, peer));
                return Err(libc::ENOSPC);
            }
            *n += 1;
        }
        Ok(())
    }

    /// The bell `owner`'s thread `tag` registered for `peer`.
    pub(crate) fn get(&self, owner: u32, tag: u32, peer: u32) -> Option<&OwnedFd> {
        self.by_key.get(&(owner, tag, peer))
    }

    /// Counts a bell handed to guest `to`.
    pub(crate) fn gave(&mut self, to: u32) {
        *self.given.entry(to).or_default() += 1;
    }

    /// (bells of `conn`'s threads held, bells handed to `conn`), for `canal stat`.
    pub(crate) fn counts(&self, conn: u32) -> (u64, u64) {
        (
            self.per_owner.get(&conn).copied().unwrap_or(0) as u64,
            self.given.get(&conn).copied().unwrap_or(0),
        )
    }

    /// `owner`'s slot `slot` has a new holder: the old holders' bells go.
    pub(crate) fn forget_slot(&mut self, owner: u32, slot: u32) {
        self.drop_where(|&(o, t, _)| o == owner && canal_abi::segment::bell::slot_of(t) == slot);
    }

    /// Guest `conn` left: its bells, and those registered for it, go.
    pub(crate) fn forget(&mut self, conn: u32) {
        self.drop_where(|&(o, _, p)| o == conn || p == conn);
        self.per_owner.remove(&conn);
        self.given.remove(&conn);
    }

    fn drop_where(&mut self, gone: impl Fn(&(u32, u32, u32)) -> bool) {
        if self.by_key.is_empty() {
            return;
        }
        let per_owner = &mut self.per_owner;
        self.by_key.retain(|k, _| {
            if !gone(k) {
                return true;
            }
            if let Some(n) = per_owner.get_mut(&k.0) {
                *n = n.saturating_sub(1);
            }
            false
        });
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use canal_abi::segment::bell::tag;

    fn efd() -> OwnedFd {
        crate::sys::eventfd().unwrap()
    }

    #[test]
    fn a_bell_is_given_only_to_the_peer_it_was_registered_for() {
        let mut b = Bells::default();
        b.set(1, tag(3, 1), 2, efd()).unwrap();
        assert!(b.get(1, tag(3, 1), 2).is_some());
        assert!(b.get(1, tag(3, 1), 9).is_none(), "another peer");
        assert!(b.get(1, tag(3, 2), 2).is_none(), "another generation");
        assert!(b.get(2, tag(3, 1), 1).is_none(), "the other direction");
    }

    #[test]
    fn a_new_holder_of_the_slot_and_a_departure_drop_bells() {
        let mut b = Bells::default();
        b.set(1, tag(3, 1), 2, efd()).unwrap();
        b.set(1, tag(3, 1), 4, efd()).unwrap();
        b.set(1, tag(5, 1), 2, efd()).unwrap();
        b.set(2, tag(3, 1), 1, efd()).unwrap();
        b.forget_slot(1, 3);
        assert_eq!(b.len(), 2);
        assert!(b.get(1, tag(5, 1), 2).is_some());
        b.forget(2);
        // Guest 2's own bell and guest 1's bell for guest 2 are gone.
        assert_eq!(b.len(), 0);
    }

    #[test]
    fn a_guest_cannot_register_without_bound() {
        let mut b = Bells {
            limit: 8,
            ..Bells::default()
        };
        for i in 0..8 {
            b.set(1, tag(i, 1), 2, efd()).unwrap();
        }
        assert_eq!(b.set(1, tag(7, 999), 2, efd()), Err(libc::ENOSPC));
        // Replacing an existing one is fine; another guest is unaffected.
        b.set(1, tag(0, 1), 2, efd()).unwrap();
        b.set(3, tag(0, 1), 2, efd()).unwrap();
    }
}
