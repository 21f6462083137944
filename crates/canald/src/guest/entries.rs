//! Which socket-table entries are free (`EntryPool`). The table is sized for the
//! guest's quota, but its pages are committed only as entries are used: entries are
//! handed out lowest first, from the entries freed so far and then from the never-used
//! ones above the high-water mark, so a guest with n sockets touches about n entries
//! and every scan (canald's and the guest's) can stop at the mark. Finding a free
//! entry is O(log n), not a walk of the table: a server with 10,000 connections opens
//! and closes the 10,001st at the same cost as the first.
//!
//! The quota counts canald's descriptors, not only entries (`crate::fdbudget`): an
//! entry costs canald at most one (its host socket), and a WATCH end it holds for the
//! guest (`crate::watch`) is one more, held "apart" from the entries. Entries in use
//! plus descriptors held apart never exceed the quota.
#![forbid(unsafe_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;

pub(crate) struct EntryPool {
    /// Entries below `high` that were freed (possibly stale: an index is checked
    /// against the table again when it is taken).
    freed: BinaryHeap<Reverse<u32>>,
    /// 1 + the highest index ever handed out.
    high: u32,
    /// canald's descriptors held for the guest besides its entries' (WATCH ends).
    apart: u32,
    /// Table size: the guest's quota of canald's descriptors.
    cap: u32,
}

impl EntryPool {
    pub(crate) fn new(cap: u32) -> EntryPool {
        EntryPool {
            freed: BinaryHeap::new(),
            high: 0,
            apart: 0,
            cap,
        }
    }

    /// The lowest free entry (`is_free` confirms a freed one is still free), or None
    /// when the quota is used up (entries in use and descriptors held apart).
    pub(crate) fn take(&mut self, is_free: impl Fn(u32) -> bool) -> Option<u32> {
        if self.available() == 0 {
            return None;
        }
        while let Some(Reverse(i)) = self.freed.pop() {
            if is_free(i) {
                return Some(i);
            }
        }
        (self.high < self.cap).then(|| {
            self.high += 1;
            self.high - 1
        })
    }

    /// Returns an entry taken before (it may be given back once per take).
    pub(crate) fn give(&mut self, index: u32) {
        if index < self.high {
            self.freed.push(Reverse(index));
        }
    }

    /// Holds one more descriptor apart from the entries, if the quota has room.
    pub(crate) fn hold_apart(&mut self) -> bool {
        let room = self.available() > 0;
        self.apart += room as u32;
        room
    }

    /// A descriptor held apart was closed.
    pub(crate) fn release_apart(&mut self) {
        self.apart = self.apart.saturating_sub(1);
    }

    /// Whether `take` would fail (up to stale freed indices, which make it succeed
    /// less often than this promises, never more).
    pub(crate) fn exhausted(&self) -> bool {
        self.available() == 0
    }

    /// How many more entries the quota allows: those not in use (counting stale freed
    /// indices once each) less the descriptors held apart.
    pub(crate) fn available(&self) -> u32 {
        (self.cap - self.high + self.freed.len() as u32).saturating_sub(self.apart)
    }

    /// 1 + the highest index ever handed out: scans stop here.
    pub(crate) fn high_water(&self) -> u32 {
        self.high
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn lowest_first_then_exhausted() {
        let mut used = HashSet::new();
        let mut p = EntryPool::new(4);
        for want in 0..4 {
            let i = p.take(|i| !used.contains(&i)).unwrap();
            assert_eq!(i, want);
            used.insert(i);
        }
        assert!(p.exhausted());
        assert_eq!(p.take(|_| true), None);
        used.remove(&2);
        p.give(2);
        used.remove(&1);
        p.give(1);
        assert!(!p.exhausted());
        assert_eq!(p.available(), 2);
        assert_eq!(p.take(|i| !used.contains(&i)), Some(1));
        used.insert(1);
        assert_eq!(p.take(|i| !used.contains(&i)), Some(2));
        assert_eq!(p.high_water(), 4);
    }

    #[test]
    fn stale_freed_indices_are_skipped() {
        let mut p = EntryPool::new(8);
        let a = p.take(|_| true).unwrap();
        p.give(a);
        p.give(a); // a double give (a bug elsewhere) must not hand `a` out twice
        let used = [p.take(|_| true).unwrap()];
        assert_eq!(used[0], a);
        // The stale copy is skipped: the next entry is a fresh one.
        assert_eq!(p.take(|i| !used.contains(&i)), Some(1));
    }

    #[test]
    fn high_water_stays_low_under_churn() {
        // 1,000 held, then 10,000 open/close cycles: the mark stays at 1,001.
        let mut p = EntryPool::new(65535);
        let mut used = HashSet::new();
        for _ in 0..1000 {
            used.insert(p.take(|i| !used.contains(&i)).unwrap());
        }
        for _ in 0..10_000 {
            let i = p.take(|i| !used.contains(&i)).unwrap();
            p.give(i);
        }
        assert_eq!(p.high_water(), 1001);
    }

    #[test]
    fn descriptors_held_apart_count_against_the_quota() {
        let mut p = EntryPool::new(4);
        let a = p.take(|_| true).unwrap();
        assert!(p.hold_apart() && p.hold_apart());
        assert_eq!(p.available(), 1);
        let _b = p.take(|i| i != a).unwrap();
        // Two entries and two WATCH ends: the quota is used up, for both kinds.
        assert!(p.exhausted());
        assert_eq!(p.take(|_| true), None);
        assert!(!p.hold_apart());
        p.release_apart();
        assert!(!p.exhausted());
        p.give(a);
        assert_eq!(p.available(), 2);
        assert_eq!(p.take(|_| true), Some(a));
    }
}
