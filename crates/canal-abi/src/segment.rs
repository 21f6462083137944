//! Pair segments: the shared memory of a short-circuited connection between two canal
//! guests on one host (protocol §8).
//!
//! A pair segment is a sealed memfd that canald creates when a guest's CONNECT targets
//! a canal listener, and hands to exactly the two guests of the connection (control
//! message SEGMENT). It holds a header, the index words of two byte rings and the two
//! sides' sleeper counters (page 0), then ring 0 (connector → acceptor) and ring 1
//! (acceptor → connector). The guests move bytes directly; canald is involved only
//! when a side sleeps (the peer then raises its own entry's attention bit and canald
//! wakes the sleeper). canald never reads the segment's shared words except, with
//! `pread`, the indices when one side closes (to choose FIN or RESET) and for
//! statistics. Neither guest's own region is shared with the other.

use crate::sync::{AtomicU32, AtomicU64};

/// "CANALSEG" read as a little-endian u64.
pub const SEG_MAGIC: u64 = u64::from_le_bytes(*b"CANALSEG");
/// Direct peer wake-ups (protocol §8.8, minor 8): bell tags and the bell word.
pub mod bell {
    use crate::sync::{AtomicU64, Ordering};

    /// The bell word's tag when more than one thread (or one without a bell for this
    /// peer) sleeps: the peer must have canald relay the wake-up.
    pub const SEVERAL: u32 = u32::MAX;
    /// Bits of a tag that name the slot (`MAX_SLOTS` = 4096).
    pub const SLOT_BITS: u32 = 12;
    /// Generations run 1..=GEN_MAX (never 0, so a tag is never 0 or SEVERAL).
    pub const GEN_MAX: u32 = (u32::MAX >> SLOT_BITS) - 1;

    /// The tag of the thread holding `slot` in its `gen`-th binding of it.
    pub const fn tag(slot: u32, gen: u32) -> u32 {
        ((gen % GEN_MAX + 1) << SLOT_BITS) | (slot & ((1 << SLOT_BITS) - 1))
    }

    /// The slot a tag names.
    pub const fn slot_of(tag: u32) -> u32 {
        tag & ((1 << SLOT_BITS) - 1)
    }

    const fn pack(count: u32, tag: u32) -> u64 {
        (tag as u64) << 32 | count as u64
    }

    /// A sleeper with bell `tag` (or `None`: it has none for this peer) counts itself.
    pub fn enter(word: &AtomicU64, tag: Option<u32>) {
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            let (n, t) = (cur as u32, (cur >> 32) as u32);
            let next_tag = match tag {
                Some(mine) if n == 0 || t == mine => mine,
                _ => SEVERAL,
            };
            match word.compare_exchange_weak(
                cur,
                pack(n.wrapping_add(1), next_tag),
                Ordering::SeqCst,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(v) => cur = v,
            }
        }
    }

    /// A sleeper that counted itself with `enter` woke.
    pub fn leave(word: &AtomicU64) {
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            let (n, t) = (cur as u32, (cur >> 32) as u32);
            let n = n.saturating_sub(1);
            let next = if n == 0 { 0 } else { pack(n, t) };
            match word.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(v) => cur = v,
            }
        }
    }

    /// The tag to ring, from the bell word the publisher read after its fence (having
    /// found the side's `sleepers` non-zero): `Some` when the word names one sleeper
    /// with a bell. None: have canald relay — several sleepers, one without a bell, or
    /// an empty word (a side whose library does not use bells; all processes of a
    /// guest run one library, as for the deferred barrier). A sleeper counts itself in
    /// both words before its fence and re-check, so a sleeper the publisher may fail
    /// to wake is one whose re-check sees the publish (Dekker, per word).
    pub fn target(word: u64) -> Option<u32> {
        let (n, t) = (word as u32, (word >> 32) as u32);
        (n != 0 && t != 0 && t != SEVERAL).then_some(t)
    }
}

/// Bytes of page 0 (header, index words, sleeper counters).
pub const SEG_HEADER_SIZE: u64 = 4096;

/// Sides of a connection: index of the side's outgoing ring, and of its sleeper word.
pub mod side {
    /// The side that called CONNECT; it sends on ring 0.
    pub const CONNECTOR: u32 = 0;
    /// The side that accepted; it sends on ring 1.
    pub const ACCEPTOR: u32 = 1;
}

/// One direction's index words, each on its own cache line (its only writer's).
#[repr(C)]
pub struct SegDir {
    /// Producer index (written by the sending side only).
    pub head: AtomicU64,
    /// (§8.3, minor 9) 1 once the sending side's program closed the connection (its
    /// last descriptor, with nothing unread): stored (Release) after its last `head`,
    /// on the head's line, so the receiver, reading it (Acquire) before the head at no
    /// extra cost, returns end-of-file once the ring is drained — without waiting for
    /// canald's RX_EOF.
    pub fin: AtomicU32,
    pub reserved0a: u32,
    pub reserved0: [u64; 6],
    /// Consumer index (written by the receiving side only).
    pub tail: AtomicU64,
    pub reserved1: [u64; 7],
}

/// One side's sleeper words (own cache line).
#[repr(C)]
pub struct SegSide {
    /// Threads of this side about to sleep, or sleeping, on their slot eventfd with
    /// this connection among what they wait for (poll/select/epoll; incremented before
    /// the sleeper's SeqCst fence and re-check, decremented after it woke). While it
    /// is non-zero the other side raises its own attention bit and kicks canald after
    /// producing or consuming, and canald wakes them.
    pub sleepers: AtomicU32,
    /// Threads of this side about to sleep, or sleeping, in FUTEX_WAIT on `wake_seq`
    /// (a blocking send/recv/connect on this one socket). While it is non-zero the
    /// other side, after producing or consuming, increments `wake_seq` and calls
    /// FUTEX_WAKE on it (shared futex: both guests map the segment) — no canald.
    pub futex_sleepers: AtomicU32,
    /// The futex word: incremented by whoever wakes this side's futex sleepers (the
    /// peer, or canald after changing this side's entry flags).
    pub wake_seq: AtomicU32,
    /// 1 once this side's sleepers follow the deferred-barrier rule (§8.4: after
    /// counting themselves they sleep at most 500 µs, then issue a global
    /// `membarrier` and re-check before sleeping longer), so that the other side may
    /// publish without a fence. Written (once, 0 → 1) by a sleeper of this side
    /// before it counts itself; 0 from an older guest library.
    pub deferred_barrier: AtomicU32,
    /// (§8.6) Epoll sets of this side that rely on this side's event log for this
    /// connection. While it is non-zero the other side, after producing or consuming,
    /// appends `watch_index` to this side's log (once per `logged`).
    pub watched: AtomicU32,
    /// This side's socket-table index (written by this side before it counts itself
    /// in `watched`).
    pub watch_index: AtomicU32,
    /// 1 while an appended entry for this connection has not been looked at: the
    /// other side swaps it to 1 and appends only if it read 0; a reader of this side
    /// swaps it to 0 before it looks at the socket.
    pub logged: AtomicU32,
    /// (§8.4 room rule) 1 while a thread of this side found its outgoing ring full
    /// and may wait for room (the kernel's SOCK_NOSPACE): set by this side before its
    /// fence and re-check; the other side, after consuming, swaps it to 0 and wakes
    /// this side only if it read 1 (or `room_rule` is 0).
    pub room_wanted: AtomicU32,
    /// (§8.8, minor 8) This side's poll sleepers as a bell word: low 32 bits their
    /// count, high 32 bits the bell tag of the only one (`bell::tag`), 0 while none
    /// sleeps, or `bell::SEVERAL`. The other side, seeing exactly the sleepers this
    /// word counts and one tag, writes that thread's bell eventfd itself instead of
    /// having canald relay the wake-up.
    pub bell: AtomicU64,
    /// 1 once this side follows the room rule (`room_wanted`); 0 from an older guest
    /// library, whose sleepers the other side wakes after every consume as before.
    pub room_rule: AtomicU32,
    pub reserved: [u32; 5],
}

/// Page 0 of a pair segment. Line 0 is written by canald once, before either guest
/// maps the segment.
#[repr(C)]
pub struct SegHeader {
    pub magic: u64,
    pub version_major: u16,
    pub version_minor: u16,
    /// SEG_HEADER_SIZE.
    pub header_size: u32,
    /// Bytes of each ring (a power of two, ≥ 4096).
    pub ring_size: u64,
    /// Bytes of the whole segment: SEG_HEADER_SIZE + 2 × ring_size.
    pub segment_size: u64,
    /// canald's id of the segment (never 0).
    pub id: u32,
    /// SEG_FLAG_* (0 for a segment without zones).
    pub flags: u32,
    /// With SEG_FLAG_ZONES: bytes of each direction's zone (§10.4), else 0.
    pub zone_size: u64,
    /// (§8.6) The owner keys of the two sides' event logs (connector, acceptor), as
    /// EVLOG_OK names them: a side that maps the other's log once serves every
    /// connection to that guest with it.
    pub owners: [u32; 2],
    pub reserved1: [u64; 1],
    // --- 64
    pub reserved2: [u64; 8],
    // --- 128: ring 0 (connector → acceptor), 256: ring 1 (acceptor → connector)
    pub dirs: [SegDir; 2],
    // --- 384: connector's sleepers, 448: acceptor's sleepers
    pub sides: [SegSide; 2],
}

// SAFETY: repr(C) structs of integers, integer atomics and arrays of them; every bit
// pattern is a valid value.
unsafe impl crate::AnyBitPattern for SegHeader {}

/// Bytes of the header actually defined; the rest of page 0 is zero, except the two
/// zone queues of a segment with zones (at ZONE_QUEUE_OFFSET).
pub const SEG_HEADER_USED: usize = 512;

/// The segment carries one buffer zone per direction after its rings, and a zone
/// queue per direction in page 0 (protocol §10.4).
pub const SEG_FLAG_ZONES: u32 = 1 << 0;
/// Offset in page 0 of direction `dir`'s zone queue.
pub const fn zone_queue_offset(dir: u32) -> u64 {
    1024 + dir as u64 * 1024
}
/// Entries of a zone queue (a power of two).
pub const ZONE_QUEUE_ENTRIES: u64 = 16;

/// One zone-sent piece of a direction's byte stream: the `len` bytes of buffer
/// `(zone, offset)` come in the stream right before the ring byte at index `pos`
/// (several entries may share a `pos`; they come in queue order). Written by the
/// sending side before it publishes `ZoneQueue::head`.
#[repr(C)]
pub struct ZoneDesc {
    pub pos: AtomicU64,
    /// The buffer's name (zone::ZoneRef): zone id, length, offset, generation.
    pub zone: AtomicU32,
    pub len: AtomicU32,
    pub offset: AtomicU64,
    pub gen: AtomicU32,
    pub reserved: u32,
}

/// A direction's zone queue: a single-producer single-consumer queue of ZoneDesc.
#[repr(C)]
pub struct ZoneQueue {
    /// Entries posted (written by the sending side only; Release after the entry).
    pub head: AtomicU64,
    pub reserved0: [u64; 7],
    /// Entries fully consumed (written by the receiving side only; Release after it
    /// released the buffer).
    pub tail: AtomicU64,
    /// Bytes of entry `tail` already consumed (receiving side only).
    pub front_off: AtomicU64,
    pub reserved1: [u64; 6],
    pub entries: [ZoneDesc; ZONE_QUEUE_ENTRIES as usize],
}

// SAFETY: repr(C) structs of integers and integer atomics; any bit pattern is valid.
unsafe impl crate::AnyBitPattern for ZoneQueue {}

/// Bytes of a segment with rings of `ring_size` bytes and zones of `zone_size`.
pub const fn segment_size_zones(ring_size: u64, zone_size: u64) -> u64 {
    segment_size(ring_size) + 2 * zone_size
}

/// Where direction `dir`'s zone starts (a segment with zones).
pub const fn zone_offset(dir: u32, ring_size: u64, zone_size: u64) -> u64 {
    segment_size(ring_size) + dir as u64 * zone_size
}

/// Offsets of a zone queue's `head` and `tail` words (canald's `pread` on close).
pub const fn zone_head_offset(dir: u32) -> u64 {
    zone_queue_offset(dir)
}
pub const fn zone_tail_offset(dir: u32) -> u64 {
    zone_queue_offset(dir) + 64
}

/// Where ring `dir` starts inside a segment whose rings are `ring_size` bytes.
pub const fn ring_offset(dir: u32, ring_size: u64) -> u64 {
    SEG_HEADER_SIZE + dir as u64 * ring_size
}

/// Total bytes of a segment with rings of `ring_size` bytes.
pub const fn segment_size(ring_size: u64) -> u64 {
    SEG_HEADER_SIZE + 2 * ring_size
}

/// Segments per pair arena (protocol §8.7): an arena holds `ARENA_SLOTS` segments of
/// one ring size, laid out as its `ArenaLayout` says.
pub const ARENA_SLOTS: u32 = 32;

/// Bytes of a slot's header in a packed arena: the `SegHeader` (its defined part).
pub const PACKED_HEADER_SIZE: u64 = SEG_HEADER_USED as u64;

/// Bytes of a packed arena's header block: every slot's header, back to back.
pub const PACKED_HEADERS: u64 = ARENA_SLOTS as u64 * PACKED_HEADER_SIZE;

/// How a pair arena lays out its slots (protocol §8.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArenaLayout {
    /// Each slot a whole segment: its header page, then its two rings (minor 7).
    Paged,
    /// Every slot's header, `PACKED_HEADER_SIZE` bytes each, together at the start;
    /// then each slot's two rings (minor 15). An idle connection's header costs an
    /// eighth of a page, not a page: the header page was most of a held
    /// short-circuited connection's memory (B13).
    Packed,
}

impl ArenaLayout {
    /// The layout a guest with `features` understands best (None: no arenas).
    pub fn for_features(features: u64) -> Option<ArenaLayout> {
        use crate::consts::feature;
        match (
            features & feature::ARENAS,
            features & feature::PACKED_ARENAS,
        ) {
            (0, _) => None,
            (_, 0) => Some(ArenaLayout::Paged),
            _ => Some(ArenaLayout::Packed),
        }
    }

    /// Bytes of a slot's header (its `header_size` field).
    pub const fn header_size(self) -> u64 {
        match self {
            ArenaLayout::Paged => SEG_HEADER_SIZE,
            ArenaLayout::Packed => PACKED_HEADER_SIZE,
        }
    }

    /// Bytes of an arena whose segments have rings of `ring_size` bytes.
    pub const fn size(self, ring_size: u64) -> u64 {
        match self {
            ArenaLayout::Paged => ARENA_SLOTS as u64 * segment_size(ring_size),
            ArenaLayout::Packed => PACKED_HEADERS + ARENA_SLOTS as u64 * 2 * ring_size,
        }
    }

    /// Where slot `slot`'s header starts (the place a socket entry names).
    pub const fn header_offset(self, slot: u32, ring_size: u64) -> u64 {
        match self {
            ArenaLayout::Paged => slot as u64 * segment_size(ring_size),
            ArenaLayout::Packed => slot as u64 * PACKED_HEADER_SIZE,
        }
    }

    /// Where slot `slot`'s ring 0 starts (ring 1 follows it).
    pub const fn rings_offset(self, slot: u32, ring_size: u64) -> u64 {
        match self {
            ArenaLayout::Paged => self.header_offset(slot, ring_size) + SEG_HEADER_SIZE,
            ArenaLayout::Packed => PACKED_HEADERS + slot as u64 * 2 * ring_size,
        }
    }

    /// The layout and ring size of an arena `len` bytes long, from its length alone
    /// (a guest needs no word of the arena's content for it). No length is both: the
    /// two sizes differ by 114,688 + 64 × (difference of the ring sizes), never 0 for
    /// ring sizes that are powers of two ≥ 4096.
    pub fn of_len(len: u64) -> Option<(ArenaLayout, u64)> {
        // Both sizes are a fixed part (`size(0)`) plus 2 × ARENA_SLOTS × ring size.
        let ring_size = |layout: ArenaLayout| {
            len.checked_sub(layout.size(0))
                .map(|r| r / (2 * ARENA_SLOTS as u64))
                .filter(|&rs| ring_size_ok(rs) && layout.size(rs) == len)
        };
        match (
            ring_size(ArenaLayout::Paged),
            ring_size(ArenaLayout::Packed),
        ) {
            (Some(rs), None) => Some((ArenaLayout::Paged, rs)),
            (None, Some(rs)) => Some((ArenaLayout::Packed, rs)),
            _ => None,
        }
    }

    /// The slot whose header is at `offset` (the place a socket entry names), if it
    /// is one.
    pub fn slot_at(self, offset: u64, ring_size: u64) -> Option<u32> {
        let step = match self {
            ArenaLayout::Paged => segment_size(ring_size),
            ArenaLayout::Packed => PACKED_HEADER_SIZE,
        };
        let slot = offset / step;
        (offset.is_multiple_of(step) && slot < ARENA_SLOTS as u64).then_some(slot as u32)
    }

    /// Line 0 of slot header in this layout (its `header_size` and `segment_size`
    /// say which).
    pub fn encode_header(self, id: u32, ring_size: u64) -> [u8; 64] {
        let mut h = encode_header(id, ring_size);
        let hs = self.header_size();
        h[12..16].copy_from_slice(&(hs as u32).to_le_bytes());
        h[24..32].copy_from_slice(&(hs + 2 * ring_size).to_le_bytes());
        h
    }
}

/// Checks the header of a slot of an arena of `layout` with rings of `ring_size` bytes
/// (both from the arena's length): magic, major version, the id expected, no zones,
/// and the header and segment sizes of that layout.
pub fn check_arena_header(
    h: &SegHeader,
    id: u32,
    layout: ArenaLayout,
    ring_size: u64,
) -> Result<(), BadSegment> {
    let hs = layout.header_size();
    if !names_ok(h, id)
        || h.header_size as u64 != hs
        || h.flags != 0
        || h.ring_size != ring_size
        || h.segment_size != hs + 2 * ring_size
    {
        return Err(BadSegment);
    }
    Ok(())
}

/// Offsets of a direction's `head` and `tail` words (for canald's `pread`).
pub const fn head_offset(dir: u32) -> u64 {
    128 + dir as u64 * 128
}
pub const fn tail_offset(dir: u32) -> u64 {
    128 + dir as u64 * 128 + 64
}

/// Offset of a side's `wake_seq` futex word (canald wakes futex sleepers there).
pub const fn wake_seq_offset(side: u32) -> u64 {
    384 + side as u64 * 64 + 8
}

/// Offset of `owners[side]` (canald writes both before either guest maps the segment).
pub const fn owners_offset(side: u32) -> u64 {
    48 + side as u64 * 4
}

/// Line 0 of a segment with zones of `zone_size` bytes per direction.
pub fn encode_header_zones(id: u32, ring_size: u64, zone_size: u64) -> [u8; 64] {
    let mut h = encode_header(id, ring_size);
    h[24..32].copy_from_slice(&segment_size_zones(ring_size, zone_size).to_le_bytes());
    h[36..40].copy_from_slice(&SEG_FLAG_ZONES.to_le_bytes());
    h[40..48].copy_from_slice(&zone_size.to_le_bytes());
    h
}

/// The header line 0 canald writes (64 bytes, little-endian).
pub fn encode_header(id: u32, ring_size: u64) -> [u8; 64] {
    let mut h = [0u8; 64];
    h[0..8].copy_from_slice(&SEG_MAGIC.to_le_bytes());
    h[8..10].copy_from_slice(&1u16.to_le_bytes());
    h[10..12].copy_from_slice(&0u16.to_le_bytes());
    h[12..16].copy_from_slice(&(SEG_HEADER_SIZE as u32).to_le_bytes());
    h[16..24].copy_from_slice(&ring_size.to_le_bytes());
    h[24..32].copy_from_slice(&segment_size(ring_size).to_le_bytes());
    h[32..36].copy_from_slice(&id.to_le_bytes());
    h
}

/// Why a guest refused a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadSegment;

/// A header's magic, major version and id (never 0) are the ones expected.
fn names_ok(h: &SegHeader, id: u32) -> bool {
    h.magic == SEG_MAGIC && h.version_major == 1 && h.id == id && id != 0
}

/// A ring size a segment may have: a power of two from 4 KiB to 4 GiB.
fn ring_size_ok(rs: u64) -> bool {
    rs.is_power_of_two() && (4096..=(1 << 32)).contains(&rs)
}

/// Checks a mapped segment's header: magic, major version, the id expected, a
/// power-of-two ring size and a segment size equal to the computed one and ≤ the
/// mapped length. Returns the ring size.
pub fn check_header(h: &SegHeader, id: u32, mapped_len: u64) -> Result<u64, BadSegment> {
    let rs = h.ring_size;
    if !names_ok(h, id)
        || h.header_size as u64 != SEG_HEADER_SIZE
        || !ring_size_ok(rs)
        || h.segment_size != segment_size(rs)
        || h.segment_size > mapped_len
    {
        return Err(BadSegment);
    }
    Ok(rs)
}

/// `check_header` for a guest that understands zones: also accepts a segment with
/// SEG_FLAG_ZONES whose size is the rings plus two zones of a page-multiple
/// `zone_size` (≤ 1 GiB). Returns (ring size, zone size or 0).
pub fn check_header_zones(
    h: &SegHeader,
    id: u32,
    mapped_len: u64,
) -> Result<(u64, u64), BadSegment> {
    if h.flags == 0 {
        return check_header(h, id, mapped_len).map(|rs| (rs, 0));
    }
    let rs = h.ring_size;
    let zs = h.zone_size;
    if !names_ok(h, id)
        || h.header_size as u64 != SEG_HEADER_SIZE
        || h.flags != SEG_FLAG_ZONES
        || !ring_size_ok(rs)
        || !zs.is_multiple_of(4096)
        || !(4096..=(1 << 30)).contains(&zs)
        || h.segment_size != segment_size_zones(rs, zs)
        || h.segment_size > mapped_len
    {
        return Err(BadSegment);
    }
    Ok((rs, zs))
}
