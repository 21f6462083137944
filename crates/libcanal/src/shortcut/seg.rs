//! Pair segments (protocol §8) as a guest process maps them: a short-circuited
//! connection's rings live in a segment shared with the peer guest, not in our region.
//!
//! Each process keeps its own cache of mapped segments (an open-addressed table keyed
//! by segment id, in zeroed static memory that is committed only where used; forked
//! children inherit the mappings with the table). It holds every segment a guest can
//! have (one per table entry) with room to spare; lookups are lock-free and stop at
//! the first never-used slot, and a removal leaves a tombstone only where a later
//! slot of the same run is in use, so misses stay short under connection churn. A
//! segment is mapped on first use of a socket that names it (control message SEGMENT)
//! and unmapped by the process that drops the socket's last reference.

use crate::conn::guest::Guest;
use crate::sys;
use canal_abi::ring::RawRing;
use canal_abi::segment::{self, SegDir, SegHeader, ZoneQueue};
use canal_abi::sync::{AtomicU32, Ordering};
use canal_abi::zone::{self, MappedZone, ZoneHeader};
use core::sync::atomic::AtomicUsize;

const CACHE: usize = 1 << 17;
/// A removed entry inside a run of used slots (ids are never all ones).
const TOMB: u32 = u32::MAX;

struct Cached {
    /// Segment id (0: free). Stored last (Release) when an entry is filled.
    id: AtomicU32,
    /// The segment's header.
    base: AtomicUsize,
    /// Its ring 0 (ring 1 follows).
    rings: AtomicUsize,
    len: AtomicUsize,
    ring_size: AtomicUsize,
    /// Bytes of each direction's zone (0: no zones).
    zone_size: AtomicUsize,
    /// The pair arena holding the segment (0: a mapping of its own, `len` bytes).
    arena: AtomicU32,
}

static TABLE: [Cached; CACHE] = [const {
    Cached {
        id: AtomicU32::new(0),
        base: AtomicUsize::new(0),
        rings: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        ring_size: AtomicUsize::new(0),
        zone_size: AtomicUsize::new(0),
        arena: AtomicU32::new(0),
    }
}; CACHE];

/// Serialises filling and emptying table entries in this process.
static LOCK: AtomicU32 = AtomicU32::new(0);

/// Threads of this process that hold pointers into segments outside the table lock:
/// sleepers (a poll may sleep on a socket another thread closes) and closes (the last
/// close of one end of a pair whose other end, in this process too, closes at the
/// same moment: each sees the other's references gone). While non-zero, unmapping is
/// deferred.
static HOLDERS: AtomicU32 = AtomicU32::new(0);

/// Mappings whose socket closed while some thread held pointers (base, len); unmapped
/// later.
static DEFERRED: [(AtomicUsize, AtomicUsize); 64] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; 64];

/// A thread is about to look up segments and keep pointers to them until `hold_end`
/// (a sleeper counting itself in or out, or re-checking; a last close: `Hold`). SeqCst
/// pairs with `forget`: either its lookup misses the cleared id, or `forget` sees it
/// and defers the unmap.
pub(crate) fn hold_begin() {
    HOLDERS.fetch_add(1, Ordering::SeqCst);
}
pub(crate) fn hold_end() {
    if HOLDERS.fetch_sub(1, Ordering::SeqCst) == 1 && DEFERRED_ANY.load(Ordering::Relaxed) {
        // The last holder: unmap what was deferred while we held it.
        crate::rt::lock(&LOCK);
        unmap_or_defer(0, 0);
        crate::rt::unlock(&LOCK);
    }
}

/// Some mapping waits in DEFERRED.
static DEFERRED_ANY: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Which mapping a pointer into a segment came from: a later `still_mapped` says
/// whether the pointer may be used again (the segment can be unmapped meanwhile).
#[derive(Clone, Copy)]
pub(crate) struct Mark {
    id: u32,
    base: usize,
}

impl Mark {
    pub(crate) const NONE: Mark = Mark { id: 0, base: 0 };

    /// Whether the segment is mapped where it was when marked. The caller holds
    /// mappings (`hold_begin` or a `Hold`): a yes then stays true until it lets go.
    pub(crate) fn still_mapped(&self) -> bool {
        self.id != 0 && find(self.id).is_some_and(|s| s.base as usize == self.base)
    }
}

/// Segments stay mapped while this lives (`hold_begin` to `hold_end`). Taken by
/// a last close before it gives up its socket's references, so that the other end's
/// close, which may then find no live socket naming the segment, cannot unmap it
/// under the pointers this close still uses.
pub(crate) struct Hold(());

impl Hold {
    pub(crate) fn new() -> Hold {
        hold_begin();
        Hold(())
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        hold_end();
    }
}

/// A mapped pair segment.
#[derive(Clone, Copy)]
pub(crate) struct Seg {
    /// Its header.
    base: *mut u8,
    /// Its ring 0, ring 1 right after: after the header page in a segment of its own
    /// or a paged arena, elsewhere in a packed arena (§8.7).
    rings: *mut u8,
    ring_size: u64,
    zone_size: u64,
}

/// Writes one of a side's announcement words (0 → 1) once; later calls only read it.
#[inline]
fn announce(word: &AtomicU32) {
    if word.load(Ordering::Relaxed) == 0 {
        word.store(1, Ordering::Relaxed);
    }
}

impl Seg {
    fn header(&self) -> &'static SegHeader {
        // SAFETY: base maps at least segment_size(ring_size) bytes (checked when it
        // was mapped) and stays mapped while the socket is open; SegHeader accepts any
        // bit pattern and is used through shared references only.
        unsafe { &*(self.base as *const SegHeader) }
    }
    pub(crate) fn dir(&self, d: u32) -> &'static SegDir {
        &self.header().dirs[d.min(1) as usize]
    }
    pub(crate) fn sleepers(&self, side: u32) -> &'static AtomicU32 {
        &self.header().sides[side.min(1) as usize].sleepers
    }
    pub(crate) fn futex_sleepers(&self, side: u32) -> &'static AtomicU32 {
        &self.header().sides[side.min(1) as usize].futex_sleepers
    }
    /// The side's deferred-barrier announcement (§8.4, barrier.rs).
    pub(crate) fn deferred_barrier(&self, side: u32) -> &'static AtomicU32 {
        &self.header().sides[side.min(1) as usize].deferred_barrier
    }
    pub(crate) fn wake_seq(&self, side: u32) -> &'static AtomicU32 {
        &self.header().sides[side.min(1) as usize].wake_seq
    }
    /// Before a sleeper of `side` counts itself: the side's sleepers follow the
    /// deferred-barrier rule (barrier.rs) and the room rule (room.rs).
    #[inline]
    pub(crate) fn announce_sleeper_rules(&self, side: u32) {
        announce(self.deferred_barrier(side));
        announce(self.room_rule(side));
    }
    /// When a socket first resolves its rings: the side follows the deferred-barrier
    /// rule before any of its threads can sleep on it (§8.4).
    #[inline]
    pub(crate) fn announce_deferred_barrier(&self, side: u32) {
        announce(self.deferred_barrier(side));
    }
    /// The side's room-rule words (§8.4, crate::shortcut::room).
    pub(crate) fn room_wanted(&self, side: u32) -> &'static AtomicU32 {
        &self.header().sides[side.min(1) as usize].room_wanted
    }
    pub(crate) fn room_rule(&self, side: u32) -> &'static AtomicU32 {
        &self.header().sides[side.min(1) as usize].room_rule
    }
    /// The side's event-log words (§8.6, crate::evlog).
    pub(crate) fn watched(&self, side: u32) -> &'static AtomicU32 {
        &self.header().sides[side.min(1) as usize].watched
    }
    pub(crate) fn watch_index(&self, side: u32) -> &'static AtomicU32 {
        &self.header().sides[side.min(1) as usize].watch_index
    }
    pub(crate) fn logged(&self, side: u32) -> &'static AtomicU32 {
        &self.header().sides[side.min(1) as usize].logged
    }
    /// The side's bell word (§8.8, crate::shortcut::bells).
    pub(crate) fn bell(&self, side: u32) -> &'static canal_abi::sync::AtomicU64 {
        &self.header().sides[side.min(1) as usize].bell
    }
    /// The key of the side's event log, as canald wrote it (0: an older canald).
    pub(crate) fn owner(&self, side: u32) -> u32 {
        self.header().owners[side.min(1) as usize]
    }
    /// canald's id of the segment.
    pub(crate) fn id(&self) -> u32 {
        self.header().id
    }

    /// Wakes `side`'s futex sleepers (after a change they wait for).
    pub(crate) fn futex_wake(&self, side: u32) {
        let w = self.wake_seq(side);
        w.fetch_add(1, Ordering::SeqCst);
        sys::futex_wake_all(w);
    }
    /// A segment over memory the caller laid out (unit tests play both guests).
    ///
    /// # Safety
    /// `base` must map segment_size_zones(ring_size, zone_size) bytes, page-aligned,
    /// for as long as the value is used.
    #[cfg(test)]
    pub(crate) unsafe fn from_raw(base: *mut u8, ring_size: u64, zone_size: u64) -> Seg {
        Seg {
            base,
            // SAFETY: the caller's promise: the mapping holds the whole segment.
            rings: unsafe { base.add(segment::ring_offset(0, ring_size) as usize) },
            ring_size,
            zone_size,
        }
    }
    pub(crate) fn ring_size(&self) -> u64 {
        self.ring_size
    }
    /// This mapping of the segment, to check later whether it is still mapped.
    pub(crate) fn mark(&self) -> Mark {
        Mark {
            id: self.id(),
            base: self.base as usize,
        }
    }
    /// The segment carries buffer zones (protocol §10.4).
    pub(crate) fn has_zones(&self) -> bool {
        self.zone_size != 0
    }
    /// Direction `d`'s zone queue (page 0; meaningful only with zones).
    pub(crate) fn zone_queue(&self, d: u32) -> &'static ZoneQueue {
        let off = segment::zone_queue_offset(d.min(1));
        // SAFETY: page 0 is mapped (4096 bytes); the queue (640 bytes at 1024 or 2048)
        // lies inside it, 8-aligned; ZoneQueue accepts any bit pattern.
        unsafe { &*(self.base.add(off as usize) as *const ZoneQueue) }
    }
    /// Direction `d`'s zone with its layout checked against the mapping (the header
    /// is peer-writable: checked at every use, and only the returned layout is used).
    pub(crate) fn zone(&self, d: u32, id: u32) -> Result<MappedZone, i32> {
        if self.zone_size == 0 {
            return Err(libc::EIO);
        }
        let off = segment::zone_offset(d.min(1), self.ring_size, self.zone_size);
        // SAFETY: the zone lies inside the mapping (segment size checked at map time).
        let base = unsafe { self.base.add(off as usize) };
        // SAFETY: zone_size ≥ 4096 (checked at map time): the header page is mapped;
        // ZoneHeader accepts any bit pattern.
        let h = unsafe { &*(base as *const ZoneHeader) };
        let l = zone::check_header(h, id, self.zone_size).map_err(|_| libc::EIO)?;
        // SAFETY: check_header proved layout.zone_size ≤ zone_size: every part of the
        // layout lies inside this zone's part of the mapping.
        Ok(unsafe { MappedZone::new(base, l) })
    }
    pub(crate) fn ring(&self, d: u32) -> RawRing {
        let off = d.min(1) as u64 * self.ring_size;
        // SAFETY: both rings lie inside the mapping from `rings` (checked at map
        // time), and ring_size is a power of two (checked).
        unsafe { RawRing::new(self.rings.add(off as usize), self.ring_size) }
    }
}

/// The slot holding segment `id`: its run is walked from `id`'s home slot to the first
/// never-used one (lock-free for lookups; under LOCK for removal).
fn position(id: u32) -> Option<usize> {
    let start = id as usize % CACHE;
    (0..CACHE)
        .map(|k| (start + k) % CACHE)
        // Acquire pairs with the Release store of `id` after base/len were filled.
        .map(|i| (i, TABLE[i].id.load(Ordering::Acquire)))
        .take_while(|&(_, v)| v != 0)
        .find(|&(_, v)| v == id)
        .map(|(i, _)| i)
}

fn find(id: u32) -> Option<Seg> {
    let c = &TABLE[position(id)?];
    // Acquire pairs with the Release swap in `forget`: a base it cleared comes with the
    // tombstone stored before it, so the re-read of `id` below sees the entry go (then:
    // a miss, never a null base).
    let base = c.base.load(Ordering::Acquire) as *mut u8;
    let seg = Seg {
        base,
        rings: c.rings.load(Ordering::Relaxed) as *mut u8,
        ring_size: c.ring_size.load(Ordering::Relaxed) as u64,
        zone_size: c.zone_size.load(Ordering::Relaxed) as u64,
    };
    let still = c.id.load(Ordering::Acquire) == id;
    (still && !base.is_null()).then_some(seg)
}

/// Under LOCK: empties slot `i` (its entry was removed). A tombstone keeps the run
/// unbroken for lookups of later entries; where the run ends here, this slot and the
/// tombstones before it become never-used again (a concurrent lookup that stops
/// there could only have been looking for an entry that is not in the table).
fn vacate(i: usize) {
    TABLE[i].id.store(TOMB, Ordering::SeqCst);
    if TABLE[(i + 1) % CACHE].id.load(Ordering::Relaxed) != 0 {
        return;
    }
    let mut j = i;
    while TABLE[j].id.load(Ordering::Relaxed) == TOMB {
        TABLE[j].id.store(0, Ordering::SeqCst);
        j = (j + CACHE - 1) % CACHE;
    }
}

/// The segment if this process has it mapped already (no control traffic).
pub(crate) fn mapped(id: u32) -> Option<Seg> {
    if id == 0 {
        return None;
    }
    find(id)
}

/// Where a socket entry says its segment is: (arena, offset), arena 0 for a segment
/// in a file of its own (protocol §8.7).
pub(crate) type Place = (u32, u64);

/// The segment `id`, mapping it (or its arena) on first use. EIO if canald does not
/// give it to us or it is malformed.
pub(crate) fn get(g: &Guest, id: u32, place: Place) -> Result<Seg, i32> {
    if id == 0 {
        return Err(libc::EIO);
    }
    if let Some(s) = find(id) {
        return Ok(s);
    }
    crate::rt::lock(&LOCK);
    let r = map_locked(g, id, place);
    crate::rt::unlock(&LOCK);
    r
}

/// A segment file of its own, mapped: (base, mapped bytes).
fn map_file(g: &Guest, id: u32) -> Result<(*mut u8, u64), i32> {
    let (fd, size) = crate::conn::ctl::ctl_segment(g, id)?;
    sys::map_memfd(fd, size, 1 << 34)
}

fn map_locked(g: &Guest, id: u32, (arena, offset): Place) -> Result<Seg, i32> {
    if let Some(s) = find(id) {
        return Ok(s);
    }
    let slot = free_slot(id).ok_or(libc::ENOBUFS)?;
    let arenas = g.region.header().features & canal_abi::feature::ARENAS != 0;
    let (base, size, in_arena) = if arena == 0 {
        let (base, size) = map_file(g, id)?;
        (base, size, None)
    } else if arenas {
        let s = crate::shortcut::arena::take(g, arena, offset)?;
        (s.header, 0, Some(s))
    } else {
        return Err(libc::EIO);
    };
    // Undoes the mapping (or the arena use) of a segment we refuse.
    let drop_it = || {
        if arena == 0 {
            sys::munmap(base, size as usize);
        } else {
            crate::shortcut::arena::put(arena, unmap_or_defer);
        }
    };
    // SAFETY: base maps at least a header (512 bytes: a page for a segment of its
    // own, a checked slot of an arena); SegHeader accepts any bit pattern.
    let h = unsafe { &*(base as *const SegHeader) };
    // Zones only if canald gave us the ZONES feature (it then may hand us segments
    // with zones; otherwise such a segment is malformed for us).
    let zones_ok = g.region.header().features & canal_abi::feature::ZONES != 0;
    let checked = match &in_arena {
        Some(s) => {
            segment::check_arena_header(h, id, s.layout, s.ring_size).map(|()| (s.ring_size, 0))
        }
        None if zones_ok => segment::check_header_zones(h, id, size),
        None => segment::check_header(h, id, size).map(|rs| (rs, 0)),
    };
    let (ring_size, zone_size) = match checked {
        Ok(x) => x,
        Err(_) => {
            drop_it();
            return Err(libc::EIO);
        }
    };
    let rings = match &in_arena {
        Some(s) => s.rings,
        // SAFETY: check_header proved the file's mapping holds the whole segment.
        None => unsafe { base.add(segment::ring_offset(0, ring_size) as usize) },
    };
    let seg = Seg {
        base,
        rings,
        ring_size,
        zone_size,
    };
    fill(
        slot,
        id,
        &seg,
        if arena == 0 { size as usize } else { 0 },
        arena,
    );
    // Before any publish on the segment: publishing without a fence needs it.
    crate::shortcut::barrier::ensure_registered();
    crate::rt::debug!(
        g,
        "canal: mapped pair segment {id} (arena {arena}, rings of {ring_size} bytes)\n"
    );
    Ok(seg)
}

/// The socket naming segment `id` lost its last reference in this process: unmap,
/// unless another live socket of this guest names the same segment (both ends of a
/// connection within one program share the mapping; its other end may be in use).
/// (Another thread of the program still using the socket it closed would fault; the
/// kernel would give it EBADF. Closing a socket under a concurrent call is a bug the
/// program already has.)
pub(crate) fn forget(g: &Guest, id: u32) {
    if id == 0 {
        return;
    }
    let shared = (0..g.region.entries_in_use_bound()).any(|i| {
        g.region.socket(i).is_some_and(|e| {
            e.segment.load(Ordering::Acquire) == id && e.refs.load(Ordering::Acquire) > 0
        })
    });
    if shared {
        return;
    }
    crate::rt::lock(&LOCK);
    if let Some((base, len, arena)) = remove(id) {
        if arena != 0 {
            crate::shortcut::arena::put(arena, unmap_or_defer);
        } else if base != 0 {
            unmap_or_defer(base, len);
        }
    }
    crate::rt::unlock(&LOCK);
}

/// Under LOCK: removes the entry of segment `id`, if any; returns its (base, len,
/// arena).
fn remove(id: u32) -> Option<(usize, usize, u32)> {
    position(id).map(empty)
}

/// Under LOCK: the slot a new entry for `id` goes to (the first never-used or removed
/// one of its run).
fn free_slot(id: u32) -> Option<&'static Cached> {
    let start = id as usize % CACHE;
    (0..CACHE)
        .map(|k| &TABLE[(start + k) % CACHE])
        .find(|c| matches!(c.id.load(Ordering::Relaxed), 0 | TOMB))
}

/// Under LOCK: fills `slot` with segment `id` (`len` bytes mapped of its own, or 0 in
/// an arena), `id` last so that a lookup sees a complete entry.
fn fill(slot: &Cached, id: u32, seg: &Seg, len: usize, arena: u32) {
    // Release: a lookup that reads this base re-reads `id` and cannot see the entry
    // it replaced (find).
    slot.base.store(seg.base as usize, Ordering::Release);
    slot.rings.store(seg.rings as usize, Ordering::Relaxed);
    slot.len.store(len, Ordering::Relaxed);
    slot.arena.store(arena, Ordering::Relaxed);
    slot.ring_size
        .store(seg.ring_size as usize, Ordering::Relaxed);
    slot.zone_size
        .store(seg.zone_size as usize, Ordering::Relaxed);
    slot.id.store(id, Ordering::Release);
}

/// Under LOCK: removes the entry in slot `i`; returns its (base, len, arena).
fn empty(i: usize) -> (usize, usize, u32) {
    let c = &TABLE[i];
    vacate(i);
    // Release: after the tombstone (find's re-check of `id`).
    let base = c.base.swap(0, Ordering::Release);
    let len = c.len.swap(0, Ordering::Relaxed);
    let arena = c.arena.swap(0, Ordering::Relaxed);
    (base, len, arena)
}

/// Under LOCK: unmaps `len` bytes at `base`, or, while some thread holds pointers
/// into shared memory (`HOLDERS`), defers it to a later unmap; with no holder, also
/// what was deferred before (`base` 0: only that).
fn unmap_or_defer(base: usize, len: usize) {
    if HOLDERS.load(Ordering::SeqCst) == 0 {
        if base != 0 {
            sys::munmap(base as *mut u8, len);
        }
        if DEFERRED_ANY.swap(false, Ordering::Relaxed) {
            for (b, l) in &DEFERRED {
                let b = b.swap(0, Ordering::Relaxed);
                if b != 0 {
                    sys::munmap(b as *mut u8, l.load(Ordering::Relaxed));
                }
            }
        }
    } else if base != 0 {
        // (A flush alone, base 0, waits for the next holder to leave.)
        if let Some((b, l)) = DEFERRED
            .iter()
            .find(|(b, _)| b.load(Ordering::Relaxed) == 0)
        {
            l.store(len, Ordering::Relaxed);
            b.store(base, Ordering::Relaxed);
            DEFERRED_ANY.store(true, Ordering::Relaxed);
        } // else: left mapped until exit (64 unmaps deferred by threads holding
          // mappings for microseconds: their look-ups and re-checks, never their sleeps)
    }
}

/// A blocking call's wait on one short-circuited socket (§8.4): count ourselves in
/// the side's `futex_sleepers`, read `wake_seq`, fence, re-check `cond`, then
/// FUTEX_WAIT on `wake_seq` for at most `timeout_ns`. The peer (or canald, after a
/// flag change) bumps `wake_seq` and wakes us. Ok(true): `cond` held on the re-check;
/// Err(EINTR): a signal interrupted the sleep.
pub(crate) fn futex_sleep(
    seg: Seg,
    side: u32,
    timeout_ns: i64,
    cond: &mut dyn FnMut() -> bool,
) -> Result<bool, i32> {
    let fs = seg.futex_sleepers(side);
    let w = seg.wake_seq(side);
    seg.announce_sleeper_rules(side);
    fs.fetch_add(1, Ordering::Relaxed);
    let seq = w.load(Ordering::Relaxed);
    // F1: SeqCst fence between counting ourselves and re-checking; pairs with the
    // waker's fence between publishing its index and reading futex_sleepers, or,
    // for a waker that skips it, with the global barrier below (barrier.rs).
    canal_abi::sync::fence(Ordering::SeqCst);
    let mut ready = crate::shortcut::room::recheck(cond);
    let mut r = Ok(());
    let mut left = timeout_ns.max(1);
    let mut barrier_done = false;
    while !ready && left > 0 {
        let step = if barrier_done {
            left
        } else {
            left.min(crate::shortcut::barrier::DEFER_NS)
        };
        let t = sys::now_ns();
        r = sys::futex_wait(w, seq, step);
        if r.is_err() || w.load(Ordering::Relaxed) != seq {
            break; // a signal, or a wake-up (or a spurious return: the caller loops)
        }
        left -= sys::now_ns() - t;
        // Slept DEFER_NS without a wake-up: make any fence-less publish visible, then
        // re-check before sleeping on (or, without the barrier, re-check each step).
        barrier_done = !barrier_done && crate::shortcut::barrier::global();
        ready = crate::shortcut::room::recheck(cond);
    }
    fs.fetch_sub(1, Ordering::Relaxed);
    r.map(|_| ready)
}

/// Fork: no thread may hold the table lock across fork (the child would inherit it
/// held forever).
pub(crate) fn fork_prepare() {
    crate::rt::lock(&LOCK);
}
pub(crate) fn fork_done() {
    crate::rt::unlock(&LOCK);
}
pub(crate) fn fork_child() {
    LOCK.store(0, Ordering::Relaxed);
    crate::shortcut::barrier::fork_child();
}

#[cfg(test)]
mod tests {
    use super::*;
    use canal_abi::segment::side;
    use canal_abi::sync::AtomicU64;

    const RING: u64 = 4096;

    /// Zeroed, 8-byte aligned memory for a segment with two RING-byte rings.
    fn segment_memory() -> Vec<u64> {
        vec![0u64; (segment::SEG_HEADER_SIZE + 2 * RING) as usize / 8]
    }

    /// The segment over `mem`; the caller keeps `mem` alive while it is used.
    fn over(mem: &mut [u64]) -> Seg {
        // SAFETY: mem is zeroed, aligned, SEG_HEADER_SIZE + 2 * RING bytes long.
        unsafe { Seg::from_raw(mem.as_mut_ptr() as *mut u8, RING, 0) }
    }

    #[test]
    fn announce_is_written_once() {
        let w = AtomicU32::new(0);
        announce(&w);
        assert_eq!(w.load(Ordering::Relaxed), 1);
        announce(&w);
        assert_eq!(w.load(Ordering::Relaxed), 1);
    }

    /// A sleeper whose re-check missed a fence-less publish (the publisher's index
    /// store still in its store buffer, its read of the sleeper count too early: no
    /// wake-up comes, §8.4) still sees the bytes: DEFER_NS into the sleep it issues
    /// the global barrier and re-checks, instead of sleeping the whole timeout.
    #[test]
    fn a_wake_up_lost_to_a_fence_less_publish_is_found_by_the_deferred_check() {
        let mut mem = segment_memory();
        let seg = over(&mut mem);
        crate::shortcut::barrier::register();
        // The publish is invisible to the first check and visible from then on; the
        // publisher never bumps wake_seq.
        let checks = AtomicU64::new(0);
        let mut cond = || checks.fetch_add(1, Ordering::Relaxed) >= 1;
        let t0 = sys::now_ns();
        let r = futex_sleep(seg, side::CONNECTOR, 10_000_000_000, &mut cond);
        assert_eq!(r, Ok(true));
        assert_eq!(checks.load(Ordering::Relaxed), 2);
        // Found by the deferred re-check, long before the timeout (a generous bound
        // on where it comes, not a performance figure).
        let waited = sys::now_ns() - t0;
        assert!(waited >= crate::shortcut::barrier::DEFER_NS, "{waited}");
        assert!(waited < 5_000_000_000, "{waited}");
        assert_eq!(
            seg.deferred_barrier(side::CONNECTOR)
                .load(Ordering::Relaxed),
            1
        );
        assert_eq!(
            seg.futex_sleepers(side::CONNECTOR).load(Ordering::Relaxed),
            0
        );
        drop(mem);
    }

    /// A lookup racing the removal of its entry (the other end of an in-process pair
    /// closing at the same moment) finds the whole entry or nothing, never a cleared
    /// base: a close that woke its peer through a null base crashed about one run in
    /// twenty-five of 1,000 threads making short connections (2026-11-28).
    #[test]
    fn a_lookup_racing_a_removal_sees_the_whole_entry_or_none() {
        const ID: u32 = 0x7ead_0001; // no other test's segment id
        let mut mem = segment_memory();
        let base = mem.as_mut_ptr() as usize;
        let stop = std::sync::Arc::new(core::sync::atomic::AtomicBool::new(false));
        let cycles = std::sync::Arc::new(AtomicU64::new(0));
        let remover = {
            let (stop, cycles) = (stop.clone(), cycles.clone());
            std::thread::spawn(move || {
                // SAFETY: `mem` is a whole segment, alive until the thread is joined.
                let seg = unsafe { Seg::from_raw(base as *mut u8, RING, 0) };
                while !stop.load(Ordering::Relaxed) {
                    crate::rt::lock(&LOCK);
                    fill(free_slot(ID).unwrap(), ID, &seg, 0, 0);
                    crate::rt::unlock(&LOCK);
                    crate::rt::lock(&LOCK);
                    assert!(remove(ID).is_some());
                    crate::rt::unlock(&LOCK);
                    cycles.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        // Until both outcomes were seen often over many removals (or 20 s pass).
        let (mut hits, mut misses) = (0u64, 0u64);
        let t0 = sys::now_ns();
        while (hits < 10_000 || misses < 10_000 || cycles.load(Ordering::Relaxed) < 200_000)
            && sys::now_ns() - t0 < 20_000_000_000
        {
            match find(ID) {
                Some(s) => {
                    assert_eq!(s.base as usize, base);
                    assert_eq!(s.rings as usize, base + segment::SEG_HEADER_SIZE as usize);
                    assert_eq!(s.ring_size, RING);
                    hits += 1;
                }
                None => misses += 1,
            }
        }
        stop.store(true, Ordering::Relaxed);
        remover.join().unwrap();
        assert!(hits > 0 && misses > 0, "{hits} {misses}");
        drop(mem);
    }

    /// A real wake-up (the peer bumps wake_seq) ends the sleep at once, and a sleep
    /// with nothing published lasts its timeout.
    #[test]
    fn futex_sleep_wakes_on_wake_seq_and_times_out_otherwise() {
        let mut mem = segment_memory();
        let seg = over(&mut mem);
        let mut never = || false;
        let t0 = sys::now_ns();
        assert_eq!(
            futex_sleep(seg, side::ACCEPTOR, 30_000_000, &mut never),
            Ok(false)
        );
        assert!(sys::now_ns() - t0 >= 30_000_000);
        let addr = mem.as_mut_ptr() as usize;
        let waker = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            // SAFETY: the same mapping, alive until the join below.
            let s = unsafe { Seg::from_raw(addr as *mut u8, RING, 0) };
            s.futex_wake(side::ACCEPTOR);
        });
        let t0 = sys::now_ns();
        assert_eq!(
            futex_sleep(seg, side::ACCEPTOR, 10_000_000_000, &mut never),
            Ok(false)
        );
        assert!(sys::now_ns() - t0 < 5_000_000_000);
        waker.join().unwrap();
        drop(mem);
    }
}
