//! A guest's event log (protocol.md §8.6): which of its sockets may have changed, so
//! that an epoll over thousands of canal sockets looks at the ones that changed, not
//! at all of them.
//!
//! One log per guest, a sealed memfd canald creates with the region. Appenders are
//! canald (after it changed a socket's entry) and the guest's short-circuit peers
//! (after they moved a ring of a connection the guest watches with epoll). Readers are
//! the guest's epoll sets, each with its own cursor, so several sets and processes of
//! one guest read the same log without taking entries from each other.
//!
//! An entry is only a hint: a reader re-reads the socket itself. A lost or stale entry
//! would be a missed event, so whatever a reader cannot trust — the tail ran more than
//! the log's length ahead (overflow), went backwards, or an entry stays unwritten —
//! makes it look at every socket once (`Sweep::Rescan`). Garbage entries cost a look
//! at a socket that did not change, nothing more.
//!
//! Ordering: an appender changes the socket first, then appends (the tail's SeqCst
//! fetch_add, the entry's Release store); a reader loads the tail, then the entry
//! (Acquire), then the socket. A sleeping reader counts itself in `sleepers`, fences
//! (SeqCst), and sweeps again; an appender fences after its entry and reads `sleepers`;
//! if non-zero it has canald wake the guest's event sleepers (model-checked in
//! tests/loom.rs).

use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};

/// "CANALLOG" read as a little-endian u64.
pub const EVLOG_MAGIC: u64 = u64::from_le_bytes(*b"CANALLOG");
/// Entries in a log (a power of two).
pub const EVLOG_ENTRIES: u64 = 8192;
/// Bytes of the header page.
pub const EVLOG_HEADER_SIZE: u64 = 4096;
/// Bytes of a log file.
pub const EVLOG_SIZE: u64 = EVLOG_HEADER_SIZE + 8 * EVLOG_ENTRIES;

/// Page 0 of a log. Line 0 is written by canald once, before the log is shared.
#[repr(C)]
pub struct EvLogHeader {
    pub magic: u64,
    pub version: u32,
    /// EVLOG_ENTRIES.
    pub entries: u32,
    /// The owning guest's key (as in a pair segment's `owners`).
    pub owner: u32,
    pub reserved0: [u32; 11],
    // --- 64: appenders
    /// Entries appended so far; entry `p` lives at `p % entries`.
    pub tail: AtomicU64,
    pub reserved1: [u64; 7],
    // --- 128: the owning guest
    /// The guest's threads sleeping in an epoll wait that relies on the log.
    pub sleepers: AtomicU32,
    /// The guest's epoll sets that rely on the log. canald appends only while it is
    /// non-zero (it reads it after its SeqCst fence that follows the changes; a set
    /// counts itself, then looks at every socket once).
    pub readers: AtomicU32,
    /// (protocol §8.8, minor 8) The log's sleepers as a bell word (`segment::bell`):
    /// an appender that finds one tag there rings that thread's bell itself.
    pub bell: AtomicU64,
    pub reserved2: [u32; 12],
}

// SAFETY: repr(C) of integers, integer atomics and arrays of them.
unsafe impl crate::AnyBitPattern for EvLogHeader {}

/// Bytes of the header actually defined.
pub const EVLOG_HEADER_USED: usize = 192;

/// Entry encoding: the appender's position + 1 above the socket index, so an entry
/// tells which lap wrote it and a zero (never written) entry matches no position.
#[inline]
pub const fn encode(pos: u64, index: u32) -> u64 {
    (pos.wrapping_add(1) << 16) | (index as u64 & 0xffff)
}

const TAG_MASK: u64 = (1 << 48) - 1;

/// The header line 0 canald writes when it creates a log (64 bytes, little-endian).
pub fn encode_header(owner: u32) -> [u8; 64] {
    let mut h = [0u8; 64];
    h[0..8].copy_from_slice(&EVLOG_MAGIC.to_le_bytes());
    h[8..12].copy_from_slice(&1u32.to_le_bytes());
    h[12..16].copy_from_slice(&(EVLOG_ENTRIES as u32).to_le_bytes());
    h[16..20].copy_from_slice(&owner.to_le_bytes());
    h
}

/// A mapped log.
#[derive(Clone, Copy)]
pub struct EvLog<'a> {
    pub header: &'a EvLogHeader,
    pub entries: &'a [AtomicU64],
}

/// What a sweep found.
#[derive(Debug, PartialEq, Eq)]
pub enum Sweep {
    /// Every entry up to the tail was read.
    Done,
    /// An appender has taken a position but not yet written its entry: the cursor
    /// stays there; sweep again (the caller rescans if it stays so).
    Pending,
    /// The log cannot be trusted from the cursor on: look at every socket.
    Rescan,
}

impl<'a> EvLog<'a> {
    /// A log over `header` and its entries (as many as the header says, a power of
    /// two: EVLOG_ENTRIES in a log file, fewer in model checks); None if the header is
    /// not a log of ours.
    pub fn new(header: &'a EvLogHeader, entries: &'a [AtomicU64]) -> Option<EvLog<'a>> {
        let n = header.entries as usize;
        let ok = header.magic == EVLOG_MAGIC && n.is_power_of_two() && entries.len() == n;
        ok.then_some(EvLog { header, entries })
    }

    /// The log mapped at `base` (a log file's EVLOG_SIZE bytes); None if its header is
    /// not a log of ours.
    ///
    /// # Safety
    /// `base` must be page-aligned and map EVLOG_SIZE bytes for as long as the result
    /// is used.
    #[cfg(not(loom))]
    pub unsafe fn from_base(base: *const u8) -> Option<EvLog<'a>> {
        // SAFETY: by the contract, the header (192 bytes) and EVLOG_ENTRIES u64 words
        // after the header page lie inside the mapping; both accept any bit pattern
        // and are only accessed atomically.
        let (h, e) = unsafe {
            (
                &*(base as *const EvLogHeader),
                core::slice::from_raw_parts(
                    base.add(EVLOG_HEADER_SIZE as usize) as *const AtomicU64,
                    EVLOG_ENTRIES as usize,
                ),
            )
        };
        EvLog::new(h, e)
    }

    /// Appends socket `index`; returns whether a reader sleeps on the log (the caller
    /// then has canald wake the guest).
    #[inline]
    pub fn append(&self, index: u32) -> bool {
        let p = self.header.tail.fetch_add(1, Ordering::SeqCst);
        let n = self.entries.len() as u64;
        self.entries[(p % n) as usize].store(encode(p, index), Ordering::Release);
        // Pairs with the sleeper's fence between counting itself and sweeping.
        fence(Ordering::SeqCst);
        self.header.sleepers.load(Ordering::Relaxed) != 0
    }

    /// The bell word of the log's sleepers (read after `append` returned true: its
    /// fence orders this load after the entry, as the `sleepers` load).
    #[inline]
    pub fn bell(&self) -> u64 {
        self.header.bell.load(Ordering::Relaxed)
    }

    /// Whether some epoll set of the owner relies on the log (canald's gate).
    #[inline]
    pub fn has_readers(&self) -> bool {
        self.header.readers.load(Ordering::Relaxed) != 0
    }

    /// The tail now: a new reader starts here.
    #[inline]
    pub fn tail(&self) -> u64 {
        self.header.tail.load(Ordering::SeqCst)
    }

    /// Reads the entries from `*cursor` to the tail, calling `f` with each index, and
    /// moves the cursor. On `Rescan` the cursor is at the tail.
    pub fn sweep(&self, cursor: &mut u64, mut f: impl FnMut(u32)) -> Sweep {
        let t = self.tail();
        let n = self.entries.len() as u64;
        if t < *cursor || t - *cursor > n {
            *cursor = t;
            return Sweep::Rescan;
        }
        while *cursor < t {
            let p = *cursor;
            let e = self.entries[(p % n) as usize].load(Ordering::Acquire);
            let want = p.wrapping_add(1) & TAG_MASK;
            let tag = e >> 16;
            if tag == want {
                f((e & 0xffff) as u32);
                *cursor = p + 1;
            } else if tag < want && want - tag < (1 << 47) {
                // Not written yet (an older lap's entry, or zero).
                return Sweep::Pending;
            } else {
                *cursor = t;
                return Sweep::Rescan;
            }
        }
        Sweep::Done
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn log_memory() -> (Box<EvLogHeader>, Vec<AtomicU64>) {
        // SAFETY: EvLogHeader accepts any bit pattern, zero included.
        let mut h: Box<EvLogHeader> = Box::new(unsafe { core::mem::zeroed() });
        h.magic = EVLOG_MAGIC;
        h.entries = EVLOG_ENTRIES as u32;
        let e = (0..EVLOG_ENTRIES).map(|_| AtomicU64::new(0)).collect();
        (h, e)
    }

    #[test]
    fn entries_are_read_once_per_reader() {
        let (h, e) = log_memory();
        let log = EvLog::new(&h, &e).unwrap();
        let (mut a, mut b) = (log.tail(), log.tail());
        for i in [3, 7, 3] {
            log.append(i);
        }
        let mut seen = Vec::new();
        assert_eq!(log.sweep(&mut a, |i| seen.push(i)), Sweep::Done);
        assert_eq!(seen, [3, 7, 3]);
        seen.clear();
        assert_eq!(log.sweep(&mut a, |i| seen.push(i)), Sweep::Done);
        assert!(seen.is_empty());
        assert_eq!(log.sweep(&mut b, |i| seen.push(i)), Sweep::Done);
        assert_eq!(seen, [3, 7, 3], "a second reader sees the same entries");
    }

    #[test]
    fn overflow_and_garbage_rescan() {
        let (h, e) = log_memory();
        let log = EvLog::new(&h, &e).unwrap();
        let mut c = 0;
        for i in 0..EVLOG_ENTRIES + 1 {
            log.append(i as u32);
        }
        assert_eq!(log.sweep(&mut c, |_| {}), Sweep::Rescan);
        assert_eq!(c, log.tail());
        // A tail that went backwards (someone wrote it).
        h.tail.store(5, Ordering::Relaxed);
        assert_eq!(log.sweep(&mut c, |_| {}), Sweep::Rescan);
        assert_eq!(c, 5);
        // An entry from a later lap where this lap's should be.
        log.append(1);
        e[5].store(encode(5 + EVLOG_ENTRIES, 9), Ordering::Relaxed);
        assert_eq!(log.sweep(&mut c, |_| {}), Sweep::Rescan);
    }

    #[test]
    fn an_unwritten_entry_holds_the_cursor() {
        let (h, e) = log_memory();
        let log = EvLog::new(&h, &e).unwrap();
        let mut c = 0;
        // An appender took position 0 and has not written it yet.
        h.tail.store(1, Ordering::Relaxed);
        assert_eq!(
            log.sweep(&mut c, |_| panic!("nothing written")),
            Sweep::Pending
        );
        assert_eq!(c, 0);
        e[0].store(encode(0, 4), Ordering::Release);
        let mut seen = Vec::new();
        assert_eq!(log.sweep(&mut c, |i| seen.push(i)), Sweep::Done);
        assert_eq!((seen, c), (vec![4], 1));
    }

    #[test]
    fn sleepers_are_reported_to_the_appender() {
        let (h, e) = log_memory();
        let log = EvLog::new(&h, &e).unwrap();
        assert!(!log.append(1));
        h.sleepers.store(1, Ordering::SeqCst);
        assert!(log.append(1));
    }

    #[test]
    fn a_created_log_reads_back() {
        let mut mem = vec![0u64; (EVLOG_SIZE / 8) as usize];
        let h = encode_header(7);
        for (i, w) in h.chunks(8).enumerate() {
            mem[i] = u64::from_le_bytes(w.try_into().unwrap());
        }
        // SAFETY: mem is 8-aligned and EVLOG_SIZE bytes for the test's life.
        let log = unsafe { EvLog::from_base(mem.as_ptr() as *const u8) }.unwrap();
        assert_eq!(
            (log.header.owner, log.entries.len()),
            (7, EVLOG_ENTRIES as usize)
        );
        assert!(!log.append(3));
        let mut seen = Vec::new();
        assert_eq!(log.sweep(&mut 0, |i| seen.push(i)), Sweep::Done);
        assert_eq!(seen, [3]);
    }

    #[test]
    fn header_layout() {
        assert_eq!(core::mem::size_of::<EvLogHeader>(), EVLOG_HEADER_USED);
        assert_eq!(core::mem::offset_of!(EvLogHeader, tail), 64);
        assert_eq!(core::mem::offset_of!(EvLogHeader, sleepers), 128);
        assert_eq!(core::mem::offset_of!(EvLogHeader, readers), 132);
        assert!(EvLog::new(&log_memory().0, &[]).is_none());
    }
}
