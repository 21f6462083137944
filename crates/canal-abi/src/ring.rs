//! Single-producer/single-consumer byte rings and the message records built on them.
//!
//! A ring is `size` bytes (a power of two) of storage plus two free-running `u64`
//! indices in the socket entry: `head` (written only by the producer) and `tail`
//! (written only by the consumer). `head - tail` is the number of bytes queued; it
//! never exceeds `size`. The byte at index `i` lives at storage offset `i & (size-1)`.
//!
//! The host never trusts an index the guest wrote: it keeps its own index privately
//! and checks the guest's with [`check_indices`] (`head - tail <= size`, and the
//! guest's index never moves backwards). A violation marks the socket broken.

use crate::sync::{AtomicU64, Ordering};

/// Where ring bytes live. Real rings are raw shared memory; loom tests substitute
/// storage whose accesses the model checker can see.
pub trait RingStorage {
    /// Size in bytes, a power of two.
    fn size(&self) -> u64;
    /// Copies `src` to storage offset `off`; `off + src.len() <= size()`.
    fn write(&self, off: usize, src: &[u8]);
    /// Copies storage offset `off` into `dst`; `off + dst.len() <= size()`.
    fn read(&self, off: usize, dst: &mut [u8]);
}

/// Largest single memcpy when copying out of a ring (see `RawRing::read`).
const COPY_PIECE: usize = 2048;

/// Raw shared-memory storage.
#[derive(Clone, Copy, Debug)]
pub struct RawRing {
    base: *mut u8,
    size: u64,
}

// SAFETY: a RawRing only names memory inside a mapped region; all accesses are byte
// copies whose exclusivity is arranged by the ring indices (the producer only writes
// the free part, the consumer only reads the queued part).
unsafe impl Send for RawRing {}
// SAFETY: as above.
unsafe impl Sync for RawRing {}

impl RawRing {
    /// # Safety
    /// `base..base+size` must stay mapped and writable for the life of the value, and
    /// `size` must be a power of two.
    pub unsafe fn new(base: *mut u8, size: u64) -> Self {
        debug_assert!(size.is_power_of_two());
        RawRing { base, size }
    }

    /// The (at most two) contiguous pieces covering `len` bytes from index `pos`, as
    /// (pointer, length) pairs for readv/writev. The second has length 0 when the span
    /// does not wrap.
    pub fn segments(&self, pos: u64, len: u64) -> [(*mut u8, usize); 2] {
        let off = pos & (self.size - 1);
        let first = len.min(self.size - off);
        // SAFETY: off < size, so the pointer stays inside the ring.
        let p0 = unsafe { self.base.add(off as usize) };
        [(p0, first as usize), (self.base, (len - first) as usize)]
    }
}

impl RingStorage for RawRing {
    fn size(&self) -> u64 {
        self.size
    }
    fn write(&self, off: usize, src: &[u8]) {
        debug_assert!(off as u64 + src.len() as u64 <= self.size);
        let mut done = 0;
        while done < src.len() {
            let n = (src.len() - done).min(COPY_PIECE);
            // SAFETY: the caller keeps off+len within the ring (checked above in debug,
            // by construction in `copy_in`), and the producer owns the free part it
            // writes.
            unsafe {
                core::ptr::copy_nonoverlapping(src.as_ptr().add(done), self.base.add(off + done), n)
            };
            done += n;
        }
    }
    fn read(&self, off: usize, dst: &mut [u8]) {
        debug_assert!(off as u64 + dst.len() as u64 <= self.size);
        // Pieces of at most COPY_PIECE bytes: large copies out of memory another core
        // just wrote are markedly faster with glibc's vector loop than with the
        // `rep movsb` it picks for large sizes (measured on AMD EPYC: about 2x).
        let mut done = 0;
        while done < dst.len() {
            let n = (dst.len() - done).min(COPY_PIECE);
            // SAFETY: as in `write`; the consumer owns the queued part it reads. The
            // other side may be hostile and write concurrently: that can only garble
            // the bytes copied, never reach outside the ring.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    self.base.add(off + done),
                    dst.as_mut_ptr().add(done),
                    n,
                )
            };
            done += n;
        }
    }
}

/// Copies `src` into the ring at index `pos`, wrapping.
pub fn copy_in<S: RingStorage + ?Sized>(s: &S, pos: u64, src: &[u8]) {
    let size = s.size();
    let off = (pos & (size - 1)) as usize;
    let first = src.len().min(size as usize - off);
    s.write(off, &src[..first]);
    if first < src.len() {
        s.write(0, &src[first..]);
    }
}

/// Copies from the ring at index `pos` into `dst`, wrapping.
pub fn copy_out<S: RingStorage + ?Sized>(s: &S, pos: u64, dst: &mut [u8]) {
    let size = s.size();
    let off = (pos & (size - 1)) as usize;
    let first = dst.len().min(size as usize - off);
    s.read(off, &mut dst[..first]);
    if first < dst.len() {
        let n = dst.len();
        s.read(0, &mut dst[first..n]);
    }
}

/// The ring's indices are inconsistent: the other side broke the protocol.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub struct RingCorrupt;

/// Checks a (head, tail) pair read from shared memory.
pub fn check_indices(head: u64, tail: u64, size: u64) -> Result<u64, RingCorrupt> {
    let used = head.wrapping_sub(tail);
    if used > size {
        Err(RingCorrupt)
    } else {
        Ok(used)
    }
}

/// The producer's view. `head` is the producer's own index (private on the host,
/// read from the entry on the guest, where only this side writes it).
pub struct Producer<'a, S: RingStorage + ?Sized> {
    pub storage: &'a S,
    pub head_shared: &'a AtomicU64,
    pub tail_shared: &'a AtomicU64,
    pub head: u64,
}

impl<'a, S: RingStorage + ?Sized> Producer<'a, S> {
    /// Free bytes, reading the consumer's index.
    pub fn free(&self) -> Result<u64, RingCorrupt> {
        // R1: Acquire pairs with the consumer's Release (R4): the consumer has finished
        // copying bytes out before we reuse their space.
        let tail = self.tail_shared.load(Ordering::Acquire);
        let used = check_indices(self.head, tail, self.storage.size())?;
        Ok(self.storage.size() - used)
    }

    /// Copies as much of `src` as fits and publishes it. Returns bytes written.
    pub fn push(&mut self, src: &[u8]) -> Result<usize, RingCorrupt> {
        let n = (self.free()? as usize).min(src.len());
        if n > 0 {
            copy_in(self.storage, self.head, &src[..n]);
            self.publish(n as u64);
        }
        Ok(n)
    }

    /// Publishes `n` bytes already written at `head..head+n` (e.g. by readv).
    pub fn publish(&mut self, n: u64) {
        self.head = self.head.wrapping_add(n);
        // R2: Release publishes the bytes; pairs with the consumer's Acquire (R3).
        self.head_shared.store(self.head, Ordering::Release);
    }
}

/// The consumer's view. `tail` is the consumer's own index.
pub struct Consumer<'a, S: RingStorage + ?Sized> {
    pub storage: &'a S,
    pub head_shared: &'a AtomicU64,
    pub tail_shared: &'a AtomicU64,
    pub tail: u64,
}

impl<'a, S: RingStorage + ?Sized> Consumer<'a, S> {
    /// Queued bytes, reading the producer's index.
    pub fn available(&self) -> Result<u64, RingCorrupt> {
        // R3: Acquire pairs with R2: the bytes up to head are visible.
        let head = self.head_shared.load(Ordering::Acquire);
        check_indices(head, self.tail, self.storage.size())
    }

    /// Copies up to `dst.len()` bytes out and releases them. Returns bytes read.
    pub fn pop(&mut self, dst: &mut [u8]) -> Result<usize, RingCorrupt> {
        let n = (self.available()? as usize).min(dst.len());
        if n > 0 {
            copy_out(self.storage, self.tail, &mut dst[..n]);
            self.release(n as u64);
        }
        Ok(n)
    }

    /// Copies up to `dst.len()` bytes out without releasing them (MSG_PEEK).
    pub fn peek(&self, dst: &mut [u8]) -> Result<usize, RingCorrupt> {
        let n = (self.available()? as usize).min(dst.len());
        copy_out(self.storage, self.tail, &mut dst[..n]);
        Ok(n)
    }

    /// Releases `n` bytes already consumed (e.g. by writev).
    pub fn release(&mut self, n: u64) {
        self.tail = self.tail.wrapping_add(n);
        // R4: Release orders our reads of the bytes before the producer may reuse
        // them; pairs with R1.
        self.tail_shared.store(self.tail, Ordering::Release);
    }
}

// ---- message records ------------------------------------------------------------

/// Record kinds in a message ring.
pub mod record_kind {
    /// Filler to the end of the ring; skip it.
    pub const PAD: u16 = 0;
    /// A datagram: `addr` is the destination (tx) or source (rx).
    pub const DATAGRAM: u16 = 1;
    /// An accepted connection on a listener's rx ring: payload is `AcceptRecord`.
    pub const ACCEPT: u16 = 2;
    /// A part of a datagram that later parts complete (tx only, feature `DGRAM_MORE`):
    /// sent with MSG_MORE, so the host socket appends the next record to it as the
    /// kernel appends a program's `send(..., MSG_MORE)` parts.
    pub const DATAGRAM_MORE: u16 = 3;
}

/// Bytes of a record header: `len: u32` (payload bytes), `addr_len: u16` (0 or
/// `ADDR_SIZE`), `kind: u16`. All little-endian.
pub const RECORD_HEADER: u64 = 8;

/// Rounds up to the record alignment (8 bytes).
pub const fn align8(n: u64) -> u64 {
    (n + 7) & !7
}

/// Total ring bytes a record takes.
pub const fn record_size(addr_len: u64, len: u64) -> u64 {
    RECORD_HEADER + align8(addr_len) + align8(len)
}

/// The largest payload a ring of `size` bytes accepts: a record (plus the padding
/// that may precede it) must fit in an otherwise empty ring.
pub const fn max_record_payload(size: u64, addr_len: u64) -> u64 {
    let half = size / 2;
    half.saturating_sub(RECORD_HEADER + align8(addr_len)) & !7
}

/// Encodes a record header.
pub fn encode_record_header(len: u32, addr_len: u16, kind: u16) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[0..4].copy_from_slice(&len.to_le_bytes());
    h[4..6].copy_from_slice(&addr_len.to_le_bytes());
    h[6..8].copy_from_slice(&kind.to_le_bytes());
    h
}

/// Decoded header of the record at the consumer's tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordInfo {
    pub kind: u16,
    pub addr_len: u16,
    pub len: u32,
}

impl<'a, S: RingStorage + ?Sized> Producer<'a, S> {
    /// Appends one record, or returns `Ok(false)` if it does not fit now. Records never
    /// wrap: a PAD record fills the end of the ring first when needed. `payload` may
    /// be split across `parts` to avoid an intermediate copy.
    pub fn push_record(
        &mut self,
        kind: u16,
        addr: &[u8],
        parts: &[&[u8]],
    ) -> Result<bool, RingCorrupt> {
        let size = self.storage.size();
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let need = record_size(addr.len() as u64, len as u64);
        if need > size / 2 + RECORD_HEADER {
            // Would not fit even in an empty ring with worst-case padding.
            return Ok(false);
        }
        let to_end = size - (self.head & (size - 1));
        let pad = if to_end < need { to_end } else { 0 };
        if self.free()? < pad + need {
            return Ok(false);
        }
        let mut pos = self.head;
        if pad > 0 {
            copy_in(
                self.storage,
                pos,
                &encode_record_header((pad - RECORD_HEADER) as u32, 0, record_kind::PAD),
            );
            pos += pad;
        }
        copy_in(
            self.storage,
            pos,
            &encode_record_header(len as u32, addr.len() as u16, kind),
        );
        let mut at = pos + RECORD_HEADER;
        copy_in(self.storage, at, addr);
        at += align8(addr.len() as u64);
        for p in parts {
            copy_in(self.storage, at, p);
            at += p.len() as u64;
        }
        self.publish(pad + need);
        Ok(true)
    }
}

impl<'a, S: RingStorage + ?Sized> Consumer<'a, S> {
    /// Looks at the next record, skipping PAD records. `Ok(None)`: the ring is empty.
    /// Every length is checked against what is queued, so a hostile producer can only
    /// make this fail with `RingCorrupt`.
    pub fn next_record(&mut self) -> Result<Option<RecordInfo>, RingCorrupt> {
        let size = self.storage.size();
        loop {
            let avail = self.available()?;
            if avail == 0 {
                return Ok(None);
            }
            if avail < RECORD_HEADER {
                return Err(RingCorrupt);
            }
            let mut h = [0u8; 8];
            copy_out(self.storage, self.tail, &mut h);
            let info = RecordInfo {
                len: u32::from_le_bytes([h[0], h[1], h[2], h[3]]),
                addr_len: u16::from_le_bytes([h[4], h[5]]),
                kind: u16::from_le_bytes([h[6], h[7]]),
            };
            let to_end = size - (self.tail & (size - 1));
            if info.kind == record_kind::PAD {
                let total = RECORD_HEADER + info.len as u64;
                if total != to_end || total > avail || info.addr_len != 0 {
                    return Err(RingCorrupt);
                }
                self.release(total);
                continue;
            }
            let total = record_size(info.addr_len as u64, info.len as u64);
            if total > avail || total > to_end || self.tail & 7 != 0 {
                return Err(RingCorrupt);
            }
            return Ok(Some(info));
        }
    }

    /// Copies the current record's address into `addr` (up to its length).
    pub fn record_addr(&self, info: &RecordInfo, addr: &mut [u8]) {
        let n = (info.addr_len as usize).min(addr.len());
        copy_out(self.storage, self.tail + RECORD_HEADER, &mut addr[..n]);
    }

    /// Copies payload bytes `from..from+dst.len()` (clamped) of the current record.
    pub fn record_payload(&self, info: &RecordInfo, from: usize, dst: &mut [u8]) -> usize {
        let len = info.len as usize;
        if from >= len {
            return 0;
        }
        let n = (len - from).min(dst.len());
        let at = self.tail + RECORD_HEADER + align8(info.addr_len as u64) + from as u64;
        copy_out(self.storage, at, &mut dst[..n]);
        n
    }

    /// Index of the current record's payload (for building iovecs in place).
    pub fn record_payload_pos(&self, info: &RecordInfo) -> u64 {
        self.tail + RECORD_HEADER + align8(info.addr_len as u64)
    }

    /// Drops the current record.
    pub fn consume_record(&mut self, info: &RecordInfo) {
        self.release(record_size(info.addr_len as u64, info.len as u64));
    }
}
