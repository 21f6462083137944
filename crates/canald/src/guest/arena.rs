//! Pair arenas (protocol §8.7): the pair segments of two guests' short-circuited
//! connections, as slots of a few shared files instead of one file per connection.
//!
//! A per-connection segment costs canald a memfd, seals and a mapping, and each guest
//! a SEGMENT round trip, an mmap and an munmap — most of a short connection's life.
//! An arena is `ARENA_SLOTS` segments of one ring size in one sealed memfd that both
//! guests map once (control ARENA); a new connection between them takes a free slot,
//! canald writes its header, and the socket entry says where it is. Between guests
//! that both know it the arena is packed (`ArenaLayout::Packed`): the slots' headers
//! share pages, so a held idle connection costs 512 bytes of header, not a page. A slot both ends
//! closed is free again: some of an arena's free slots keep their pages ("warm": the
//! pair's next connection takes one with its header page zeroed, and neither guest nor
//! canald faults the pages in again: on short connections that was a tenth of a
//! client's time), the others have their pages punched out (the memory goes back, the
//! next user reads zeros). Two warm slots whatever their connections moved, and up to
//! `WARM_SMALL` more whose rings never held more than `SMALL_EXTENT` bytes since their
//! last punch (a few pages each): with 16 concurrent short connections, punching all
//! but two cost a tenth of the machine in TLB shoot-downs and page faults. An arena holds only connections between its two guests,
//! so reuse never shows one guest's bytes to a third; an empty arena goes once one of
//! its guests has left.

use crate::sys;
use canal_abi::segment;
use canal_abi::segment::ArenaLayout;
use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// One arena's file and canald's mapping of it.
pub(crate) struct ArenaMem {
    pub(crate) id: u32,
    pub(crate) fd: OwnedFd,
    pub(crate) map: sys::Mapping,
    pub(crate) layout: ArenaLayout,
    pub(crate) ring_size: u64,
}

impl ArenaMem {
    pub(crate) fn size(&self) -> u64 {
        self.layout.size(self.ring_size)
    }

    fn header_offset(&self, slot: u32) -> u64 {
        self.layout.header_offset(slot, self.ring_size)
    }

    /// Zeroes slot `slot`'s header (its pages stay).
    fn clear_header(&self, slot: u32) {
        const ZEROS: [u8; segment::SEG_HEADER_SIZE as usize] =
            [0; segment::SEG_HEADER_SIZE as usize];
        let n = self.layout.header_size() as usize;
        self.map
            .write_at(self.header_offset(slot) as usize, &ZEROS[..n]);
    }

    /// Gives slot `slot`'s pages back to the system: the next user reads zeros. A
    /// packed arena's header shares its page with other slots' headers: zeroed.
    fn punch(&self, slot: u32) {
        let rs = self.ring_size;
        match self.layout {
            ArenaLayout::Paged => self
                .map
                .punch(self.header_offset(slot), segment::segment_size(rs)),
            ArenaLayout::Packed => {
                self.clear_header(slot);
                self.map.punch(self.layout.rings_offset(slot, rs), 2 * rs);
            }
        }
    }
}

struct Arena {
    mem: Arc<ArenaMem>,
    /// The two guests (connection keys, sorted) whose connections it holds.
    conns: [u32; 2],
    /// Bit `s` set: slot `s` holds a live segment.
    used: u32,
    /// Bit `s` set: slot `s` is free and its pages were kept (not punched).
    warm: u32,
    /// Per slot, the most bytes either ring may have touched since the slot's pages
    /// were last punched (from its `head` words, which the guests write: a guest that
    /// lies only makes canald keep or punch pages of its own pair's arena).
    extent: [u64; segment::ARENA_SLOTS as usize],
}

/// Free slots per arena whose pages are kept for the pair's next connections, however
/// much they held.
const WARM_SLOTS: u32 = 2;

/// Further warm slots, for those that stayed small (`SMALL_EXTENT`).
const WARM_SMALL: u32 = 14;

/// A slot is small while neither ring has held more than this since its last punch.
const SMALL_EXTENT: u64 = 16 * 1024;

/// A slot taken for a new segment.
pub(crate) struct Place {
    pub(crate) mem: Arc<ArenaMem>,
    pub(crate) slot: u32,
    /// The segment's byte offset in the arena.
    pub(crate) base: u64,
}

/// Every arena canald has, by id.
#[derive(Default)]
pub(crate) struct Arenas {
    by_id: HashMap<u32, Arena>,
    next_id: u32,
}

const ALL_USED: u32 = if segment::ARENA_SLOTS == 32 {
    u32::MAX
} else {
    (1u32 << segment::ARENA_SLOTS) - 1
};

fn pair_key(a: u32, b: u32) -> [u32; 2] {
    [a.min(b), a.max(b)]
}

impl Arenas {
    /// A free slot for a segment between guests `a` and `b` with rings of `ring_size`
    /// bytes, in an arena of theirs of `layout` or a new one; its header (zeros after
    /// a previous use) is the caller's to write.
    pub(crate) fn take(
        &mut self,
        a: u32,
        b: u32,
        (layout, ring_size): (ArenaLayout, u64),
    ) -> io::Result<Place> {
        let conns = pair_key(a, b);
        let found = self.by_id.values_mut().find(|x| {
            x.conns == conns
                && x.mem.ring_size == ring_size
                && x.mem.layout == layout
                && x.used != ALL_USED
        });
        let arena = match found {
            Some(x) => x,
            None => {
                let id = self.fresh_id();
                let size = layout.size(ring_size);
                let fd = sys::create_arena(size)?;
                let map = sys::Mapping::map(&fd, size as usize)?;
                let mem = Arc::new(ArenaMem {
                    id,
                    fd,
                    map,
                    layout,
                    ring_size,
                });
                self.by_id.entry(id).or_insert(Arena {
                    mem,
                    conns,
                    used: 0,
                    warm: 0,
                    extent: [0; segment::ARENA_SLOTS as usize],
                })
            }
        };
        // A warm slot first; its header page still holds the last connection's state.
        let slot = match arena.warm & !arena.used {
            0 => (!arena.used).trailing_zeros(),
            warm => warm.trailing_zeros(),
        };
        if arena.warm & (1 << slot) != 0 {
            arena.warm &= !(1 << slot);
            arena.mem.clear_header(slot);
        }
        arena.used |= 1 << slot;
        Ok(Place {
            mem: arena.mem.clone(),
            slot,
            base: arena.mem.header_offset(slot),
        })
    }

    fn fresh_id(&mut self) -> u32 {
        loop {
            self.next_id = self.next_id.wrapping_add(1).max(1);
            if !self.by_id.contains_key(&self.next_id) {
                return self.next_id;
            }
        }
    }

    /// Both ends of the segment in `slot` of arena `id` are gone: the slot is free,
    /// warm (its pages kept) while the arena has fewer than `WARM_SLOTS` such, or
    /// fewer than `WARM_SLOTS + WARM_SMALL` and this one stayed small; else its pages
    /// go back to the system. An arena left empty goes too when one of its guests has
    /// left (`live` says which guests are still attached).
    pub(crate) fn give_back(&mut self, id: u32, slot: u32, live: impl Fn(u32) -> bool) {
        let Some(a) = self.by_id.get_mut(&id) else {
            return;
        };
        let slot = slot.min(segment::ARENA_SLOTS - 1);
        let bit = 1u32 << slot;
        let base = a.mem.header_offset(slot);
        let ring = a.mem.ring_size;
        let held = (0..2)
            .map(|dir| {
                let off = base + segment::head_offset(dir);
                a.mem
                    .map
                    .load_u64(off as usize)
                    .map_or(ring, |h| h.min(ring))
            })
            .max()
            .unwrap_or(ring);
        let extent = &mut a.extent[slot as usize];
        *extent = (*extent).max(held);
        let warm = a.warm.count_ones();
        if warm < WARM_SLOTS || (warm < WARM_SLOTS + WARM_SMALL && *extent <= SMALL_EXTENT) {
            a.warm |= bit;
        } else {
            a.mem.punch(slot);
            *extent = 0;
        }
        a.used &= !bit;
        if a.used == 0 && !(live(a.conns[0]) && live(a.conns[1])) {
            self.by_id.remove(&id);
        }
    }

    /// Guest `conn` left: its empty arenas go now, the others when their last
    /// segment does.
    pub(crate) fn forget(&mut self, conn: u32) {
        self.by_id
            .retain(|_, a| !(a.used == 0 && a.conns.contains(&conn)));
    }

    /// The guest at the other side of arena `id` from guest `conn` (None if `conn` is
    /// not one of its two).
    pub(crate) fn peer_of(&self, id: u32, conn: u32) -> Option<u32> {
        let a = self.by_id.get(&id)?;
        match a.conns {
            [x, y] if x == conn => Some(y),
            [x, y] if y == conn => Some(x),
            _ => None,
        }
    }

    /// Arena `id`'s memfd and size, if guest `conn` is one of its two.
    pub(crate) fn file_for(&self, id: u32, conn: u32) -> Option<(&OwnedFd, u64)> {
        let a = self.by_id.get(&id)?;
        a.conns.contains(&conn).then(|| (&a.mem.fd, a.mem.size()))
    }

    /// Arenas and slots in use.
    #[cfg(test)]
    fn counts(&self) -> (usize, u32) {
        let slots = self.by_id.values().map(|a| a.used.count_ones()).sum();
        (self.by_id.len(), slots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RING: u64 = 4096;
    const BIG: u64 = 64 * 1024;
    const LAYOUTS: [ArenaLayout; 2] = [ArenaLayout::Paged, ArenaLayout::Packed];

    /// A byte of slot `p`'s ring 0, a page into it.
    fn ring_at(p: &Place) -> usize {
        p.mem.layout.rings_offset(p.slot, p.mem.ring_size) as usize + 4096
    }

    #[test]
    fn small_slots_stay_warm_up_to_a_bound() {
        for layout in LAYOUTS {
            small_slots_stay_warm_in(layout);
        }
    }

    fn small_slots_stay_warm_in(layout: ArenaLayout) {
        let mut ar = Arenas::default();
        let places: Vec<Place> = (0..20)
            .map(|_| ar.take(6, 7, (layout, BIG)).unwrap())
            .collect();
        let word = |p: &Place| p.mem.map.load_u64(ring_at(p));
        for p in &places {
            // A short connection's bytes: well inside a page of each ring.
            p.mem.map.write_at(ring_at(p), b"echo....");
            let head = p.base as usize + segment::head_offset(0) as usize;
            p.mem.map.write_at(head, &100u64.to_ne_bytes());
            ar.give_back(p.mem.id, p.slot, |_| true);
        }
        let warm = WARM_SLOTS + WARM_SMALL;
        for (i, p) in places.iter().enumerate() {
            let kept = word(p) != Some(0);
            assert_eq!(kept, (i as u32) < warm, "slot {i}");
        }
        // A slot that once held much is punched when freed beyond the first two, even
        // if its last connection was small.
        let mut ar = Arenas::default();
        let held: Vec<Place> = (0..3)
            .map(|_| ar.take(8, 9, (layout, BIG)).unwrap())
            .collect();
        let big = &held[2];
        let head = big.base as usize + segment::head_offset(0) as usize;
        big.mem.map.write_at(head, &50_000u64.to_ne_bytes());
        ar.give_back(big.mem.id, big.slot, |_| true); // warm: the first
        let again = ar.take(8, 9, (layout, BIG)).unwrap();
        assert_eq!(again.slot, big.slot);
        again.mem.map.write_at(ring_at(&again), b"small...");
        again.mem.map.write_at(head, &10u64.to_ne_bytes());
        for p in &held[..2] {
            ar.give_back(p.mem.id, p.slot, |_| true);
        }
        ar.give_back(again.mem.id, again.slot, |_| true);
        assert_eq!(again.mem.map.load_u64(ring_at(&again)), Some(0));
    }

    #[test]
    fn slots_are_reused_within_a_pair_only() {
        let mut ar = Arenas::default();
        let paged = (ArenaLayout::Paged, RING);
        let p = ar.take(1, 2, paged).unwrap();
        let q = ar.take(2, 1, paged).unwrap();
        assert_eq!(p.mem.id, q.mem.id, "one arena per guest pair, either order");
        assert_ne!(p.slot, q.slot);
        let other = ar.take(1, 3, paged).unwrap();
        assert_ne!(other.mem.id, p.mem.id, "another pair never shares an arena");
        let packed = ar.take(1, 2, (ArenaLayout::Packed, RING)).unwrap();
        assert_ne!(packed.mem.id, p.mem.id, "one arena per layout");
        ar.give_back(p.mem.id, p.slot, |_| true);
        let r = ar.take(1, 2, paged).unwrap();
        assert_eq!(
            (r.mem.id, r.slot),
            (p.mem.id, p.slot),
            "a freed slot is reused"
        );
        assert!(ar.file_for(p.mem.id, 1).is_some());
        assert!(
            ar.file_for(p.mem.id, 3).is_none(),
            "a third guest gets no arena"
        );
    }

    #[test]
    fn a_full_arena_opens_another_and_reuse_reads_zeros() {
        for layout in LAYOUTS {
            a_full_arena_opens_another_in(layout);
        }
    }

    fn a_full_arena_opens_another_in(layout: ArenaLayout) {
        let mut ar = Arenas::default();
        let places: Vec<Place> = (0..segment::ARENA_SLOTS + 1)
            .map(|_| ar.take(4, 5, (layout, BIG)).unwrap())
            .collect();
        let first = places[0].mem.id;
        assert!(places[..segment::ARENA_SLOTS as usize]
            .iter()
            .all(|p| p.mem.id == first));
        assert_ne!(places.last().unwrap().mem.id, first);
        // The first WARM_SLOTS freed slots keep their pages; later ones are punched
        // unless they stayed small (these moved 40,000 bytes one way).
        let word = |p: &Place, off: usize| p.mem.map.load_u64(p.base as usize + off);
        let ring_word = |p: &Place| p.mem.map.load_u64(ring_at(p));
        let neighbour = &places[4];
        neighbour
            .mem
            .map
            .write_at(neighbour.base as usize + 64, b"neighbr!");
        for p in &places[1..4] {
            p.mem.map.write_at(ring_at(p), b"secret!!");
            p.mem.map.write_at(p.base as usize + 64, b"stale!!!");
            let head = p.base as usize + segment::head_offset(1) as usize;
            p.mem.map.write_at(head, &40_000u64.to_ne_bytes());
            ar.give_back(p.mem.id, p.slot, |_| true);
        }
        assert_ne!(ring_word(&places[1]), Some(0), "warm");
        assert_ne!(ring_word(&places[2]), Some(0), "warm");
        assert_eq!(
            ring_word(&places[3]),
            Some(0),
            "a freed slot's pages are punched out"
        );
        assert_eq!(word(&places[3], 64), Some(0), "and its header cleared");
        // A packed header shares its page with its neighbours': theirs stay.
        assert_eq!(word(&places[4], 64), Some(u64::from_ne_bytes(*b"neighbr!")));
        assert_eq!(ar.counts(), (2, segment::ARENA_SLOTS - 2));
        // The next connection takes a warm slot, its header page zeroed.
        let r = ar.take(4, 5, (layout, BIG)).unwrap();
        assert_eq!(r.slot, places[1].slot);
        assert_eq!(
            word(&r, 64),
            Some(0),
            "the last connection's header is gone"
        );
    }

    #[test]
    fn empty_arenas_go_with_their_guest() {
        let mut ar = Arenas::default();
        let p = ar.take(7, 8, (ArenaLayout::Packed, RING)).unwrap();
        let q = ar.take(7, 9, (ArenaLayout::Packed, RING)).unwrap();
        ar.give_back(q.mem.id, q.slot, |_| true);
        ar.forget(7);
        assert_eq!(ar.counts(), (1, 1), "the empty arena of 7 and 9 went");
        ar.give_back(p.mem.id, p.slot, |c| c != 7);
        assert_eq!(
            ar.counts(),
            (0, 0),
            "the last segment of a gone guest's arena"
        );
    }
}
