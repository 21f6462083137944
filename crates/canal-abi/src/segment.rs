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
    pub reserved0: [u64; 7],
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
    pub reserved: [u32; 13],
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
    pub reserved0: u32,
    pub reserved1: [u64; 3],
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

/// Bytes of the header actually defined; the rest of page 0 is zero.
pub const SEG_HEADER_USED: usize = 512;

/// Where ring `dir` starts inside a segment whose rings are `ring_size` bytes.
pub const fn ring_offset(dir: u32, ring_size: u64) -> u64 {
    SEG_HEADER_SIZE + dir as u64 * ring_size
}

/// Total bytes of a segment with rings of `ring_size` bytes.
pub const fn segment_size(ring_size: u64) -> u64 {
    SEG_HEADER_SIZE + 2 * ring_size
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

/// Checks a mapped segment's header: magic, major version, the id expected, a
/// power-of-two ring size and a segment size equal to the computed one and ≤ the
/// mapped length. Returns the ring size.
pub fn check_header(h: &SegHeader, id: u32, mapped_len: u64) -> Result<u64, BadSegment> {
    let rs = h.ring_size;
    if h.magic != SEG_MAGIC
        || h.version_major != 1
        || h.header_size as u64 != SEG_HEADER_SIZE
        || h.id != id
        || id == 0
        || !rs.is_power_of_two()
        || !(4096..=(1 << 32)).contains(&rs)
        || h.segment_size != segment_size(rs)
        || h.segment_size > mapped_len
    {
        return Err(BadSegment);
    }
    Ok(rs)
}
