//! Buffer zones (protocol §10): shared memory carved into fixed-size buffers that two
//! parties name by (zone, offset), hand to each other by descriptor, and recycle with
//! reference counts (the SETH design).
//!
//! A zone is one mapping: page 0 is the header (identity, the buffer classes, one
//! free-list head per class), then for each class an array of 16-byte buffer
//! descriptors (`BufMeta`: reference count, free-list link, generation), then for each
//! class its slab of `count` buffers of `buf_size` bytes. Every offset is relative to
//! the zone's start, so the same name means the same bytes in every address space.
//!
//! The allocator is a recycling slab per class: a lock-free LIFO free list (Treiber
//! stack) whose head word carries a 32-bit tag against ABA. `alloc` pops a buffer and
//! gives it one reference (the allocating party's); `share` adds one for each party the
//! buffer is handed to *before* the descriptor that names it is published; `release`
//! drops one, and the party whose release takes the count to 0 pushes the buffer back.
//!
//! Both parties map the zone writable, so either may scribble over it. Nothing here
//! trusts what it reads from the zone: every index is bounds-checked before use, every
//! loop is bounded, a count that would go below zero is reported (`ZoneCorrupt`) and
//! left alone, and a name received from the peer is resolved with `resolve`, which
//! accepts only a whole buffer of this zone. The worst a hostile peer achieves is to
//! garble the bytes it sends (which it could do anyway) or to make allocations fail,
//! which sends the honest party back to its ring (threat model, "Buffer zones").

use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// "CANALZON" read as a little-endian u64.
pub const ZONE_MAGIC: u64 = u64::from_le_bytes(*b"CANALZON");
/// Bytes of page 0 (header and free-list heads).
pub const ZONE_HEADER_SIZE: u64 = 4096;
/// Buffer classes a zone may have.
pub const MAX_CLASSES: usize = 4;
/// Bytes of one buffer descriptor.
pub const META_SIZE: u64 = 16;
/// Smallest and largest buffer of a class (powers of two).
pub const MIN_BUF: u32 = 4096;
pub const MAX_BUF: u32 = 1 << 24;
/// Most buffers of one class (the free list stores index + 1 in 32 bits).
pub const MAX_COUNT: u32 = 1 << 20;
/// Bytes of an encoded buffer name.
pub const REF_SIZE: usize = 24;
/// A CAS loop on a free-list head gives up after this many lost races (only a peer
/// rewriting the head forever gets there; the caller then falls back to its ring).
const MAX_RACES: u32 = 1024;
/// `BufMeta::refs` of a buffer on the free list.
const FREE: u32 = 0;

/// One class of a zone: `count` buffers of `buf_size` bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ZoneClass {
    /// Bytes of each buffer (power of two, MIN_BUF..=MAX_BUF); 0: class unused.
    pub buf_size: u32,
    /// Buffers in the class (≤ MAX_COUNT).
    pub count: u32,
    /// Offset of the class's descriptor array (`count` × META_SIZE bytes).
    pub meta_offset: u64,
    /// Offset of buffer 0; buffer i is at slab_offset + i × buf_size.
    pub slab_offset: u64,
    pub reserved: u64,
}

/// A class's free-list head, on its own cache line: (tag << 32) | (index + 1), with
/// index + 1 = 0 for an empty list.
#[repr(C)]
pub struct FreeHead {
    pub head: AtomicU64,
    pub reserved: [u64; 7],
}

/// Page 0 of a zone. Everything before `free` is written once by the zone's creator
/// before any other party maps it.
#[repr(C)]
pub struct ZoneHeader {
    pub magic: u64,
    pub version_major: u16,
    pub version_minor: u16,
    /// ZONE_HEADER_SIZE.
    pub header_size: u32,
    /// Bytes of the whole zone.
    pub zone_size: u64,
    /// The zone's id, the first half of every buffer name (never 0).
    pub id: u32,
    /// Classes in use (1..=MAX_CLASSES).
    pub class_count: u32,
    pub reserved0: [u64; 4],
    // --- 64
    pub classes: [ZoneClass; MAX_CLASSES],
    // --- 192
    pub reserved1: [u64; 8],
    // --- 256: free-list heads, one line each
    pub free: [FreeHead; MAX_CLASSES],
}

#[cfg(not(loom))]
// SAFETY: repr(C) structs of integers, integer atomics and arrays of them; every bit
// pattern is a valid value.
unsafe impl crate::AnyBitPattern for ZoneHeader {}

/// Bytes of the header actually defined; the rest of page 0 is zero.
pub const ZONE_HEADER_USED: usize = 512;

/// One buffer's descriptor.
#[repr(C)]
pub struct BufMeta {
    /// Parties holding the buffer (0: on the free list).
    pub refs: AtomicU32,
    /// Free-list link: index + 1 of the next free buffer, 0 at the end.
    pub next: AtomicU32,
    /// Bumped by every allocation; part of the buffer's name, so a stale name is told
    /// apart from the buffer's next use.
    pub gen: AtomicU32,
    pub reserved: u32,
}

impl BufMeta {
    pub fn new() -> BufMeta {
        BufMeta {
            refs: AtomicU32::new(FREE),
            next: AtomicU32::new(0),
            gen: AtomicU32::new(0),
            reserved: 0,
        }
    }
}

impl Default for BufMeta {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(not(loom))]
// SAFETY: as for ZoneHeader.
unsafe impl crate::AnyBitPattern for BufMeta {}

/// The zone is malformed, or a word of it holds a value the protocol never writes
/// (a peer broke the protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZoneCorrupt;

/// The name of a buffer (or of its first `len` bytes), as posted in a descriptor:
/// 24 bytes little-endian — zone u32, len u32, offset u64, gen u32, reserved u32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ZoneRef {
    pub zone: u32,
    pub len: u32,
    pub offset: u64,
    pub gen: u32,
}

impl ZoneRef {
    pub fn encode(&self) -> [u8; REF_SIZE] {
        let mut b = [0u8; REF_SIZE];
        b[0..4].copy_from_slice(&self.zone.to_le_bytes());
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..20].copy_from_slice(&self.gen.to_le_bytes());
        b
    }
    pub fn decode(b: &[u8; REF_SIZE]) -> ZoneRef {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut o = [0u8; 8];
        o.copy_from_slice(&b[8..16]);
        ZoneRef {
            zone: u32_at(0),
            len: u32_at(4),
            offset: u64::from_le_bytes(o),
            gen: u32_at(16),
        }
    }
}

/// Where a zone's pieces go, computed by its creator (`plan`) or checked from a
/// header a party mapped (`check_header`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZoneLayout {
    pub id: u32,
    pub class_count: u32,
    pub classes: [ZoneClass; MAX_CLASSES],
    pub zone_size: u64,
}

const fn page_up(n: u64) -> u64 {
    (n + 4095) & !4095
}

/// Lays out a zone with the given (buf_size, count) classes: header, the descriptor
/// arrays one after the other (page-aligned), then the slabs (each page-aligned).
pub fn plan(id: u32, classes: &[(u32, u32)]) -> Result<ZoneLayout, ZoneCorrupt> {
    if id == 0 || classes.is_empty() || classes.len() > MAX_CLASSES {
        return Err(ZoneCorrupt);
    }
    let mut l = ZoneLayout {
        id,
        class_count: classes.len() as u32,
        classes: [ZoneClass::default(); MAX_CLASSES],
        zone_size: 0,
    };
    let mut at = ZONE_HEADER_SIZE;
    for (c, &(size, count)) in l.classes.iter_mut().zip(classes) {
        if !size.is_power_of_two() || !(MIN_BUF..=MAX_BUF).contains(&size) {
            return Err(ZoneCorrupt);
        }
        if count == 0 || count > MAX_COUNT {
            return Err(ZoneCorrupt);
        }
        c.buf_size = size;
        c.count = count;
        c.meta_offset = at;
        at = page_up(at + count as u64 * META_SIZE);
    }
    for c in l.classes.iter_mut().take(classes.len()) {
        c.slab_offset = at;
        at += c.count as u64 * c.buf_size as u64;
    }
    l.zone_size = at;
    Ok(l)
}

/// The header's first 256 bytes (identity and classes, little-endian) as the
/// creator writes them; the free-list heads are set by `ClassView::init`.
pub fn encode_header(l: &ZoneLayout) -> [u8; 256] {
    let mut h = [0u8; 256];
    h[0..8].copy_from_slice(&ZONE_MAGIC.to_le_bytes());
    h[8..10].copy_from_slice(&1u16.to_le_bytes());
    h[10..12].copy_from_slice(&0u16.to_le_bytes());
    h[12..16].copy_from_slice(&(ZONE_HEADER_SIZE as u32).to_le_bytes());
    h[16..24].copy_from_slice(&l.zone_size.to_le_bytes());
    h[24..28].copy_from_slice(&l.id.to_le_bytes());
    h[28..32].copy_from_slice(&l.class_count.to_le_bytes());
    for (i, c) in l.classes.iter().enumerate() {
        let o = 64 + i * 32;
        h[o..o + 4].copy_from_slice(&c.buf_size.to_le_bytes());
        h[o + 4..o + 8].copy_from_slice(&c.count.to_le_bytes());
        h[o + 8..o + 16].copy_from_slice(&c.meta_offset.to_le_bytes());
        h[o + 16..o + 24].copy_from_slice(&c.slab_offset.to_le_bytes());
    }
    h
}

/// Checks a zone header a party mapped: magic, major version, the id expected, and
/// classes that are exactly what `plan` makes of them within `mapped_len` bytes (so
/// no descriptor array or slab overlaps another or leaves the mapping). Returns the
/// layout; a party uses only the returned layout, never the header's words again.
#[cfg(not(loom))]
pub fn check_header(h: &ZoneHeader, id: u32, mapped_len: u64) -> Result<ZoneLayout, ZoneCorrupt> {
    if h.magic != ZONE_MAGIC
        || h.version_major != 1
        || h.header_size as u64 != ZONE_HEADER_SIZE
        || h.id != id
        || h.class_count == 0
        || h.class_count as usize > MAX_CLASSES
    {
        return Err(ZoneCorrupt);
    }
    let n = h.class_count as usize;
    let mut want = [(0u32, 0u32); MAX_CLASSES];
    for (w, c) in want.iter_mut().zip(&h.classes[..n]) {
        *w = (c.buf_size, c.count);
    }
    let l = plan(id, &want[..n])?;
    if l.classes[..n] != h.classes[..n] || l.zone_size != h.zone_size || l.zone_size > mapped_len {
        return Err(ZoneCorrupt);
    }
    Ok(l)
}

const fn pack(tag: u32, idx1: u32) -> u64 {
    (tag as u64) << 32 | idx1 as u64
}
const fn unpack(w: u64) -> (u32, u32) {
    ((w >> 32) as u32, w as u32)
}

/// One class as a party sees it: its checked geometry, its free-list head and its
/// descriptor array (both in the shared zone).
#[derive(Clone, Copy)]
pub struct ClassView<'a> {
    pub buf_size: u32,
    pub slab_offset: u64,
    pub head: &'a AtomicU64,
    pub meta: &'a [BufMeta],
}

/// A buffer this party holds: class, index, the generation it was allocated with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufId {
    pub class: u32,
    pub index: u32,
    pub gen: u32,
}

impl<'a> ClassView<'a> {
    /// Puts every buffer on the free list (index 0 first out). Only the creator, before
    /// any other party maps the zone.
    pub fn init(&self) {
        let n = self.meta.len() as u32;
        for (i, m) in self.meta.iter().enumerate() {
            m.refs.store(FREE, Ordering::Relaxed);
            m.gen.store(0, Ordering::Relaxed);
            let next = if (i as u32) + 1 < n { i as u32 + 2 } else { 0 };
            m.next.store(next, Ordering::Relaxed);
        }
        self.head
            .store(pack(0, if n > 0 { 1 } else { 0 }), Ordering::Release);
    }

    /// Takes a free buffer, with one reference (the caller's). Ok(None): none free.
    /// Returns (index, generation).
    pub fn alloc(&self) -> Result<Option<(u32, u32)>, ZoneCorrupt> {
        let mut w = self.head.load(Ordering::Acquire);
        for _ in 0..MAX_RACES {
            let (tag, idx1) = unpack(w);
            if idx1 == 0 {
                return Ok(None);
            }
            let m = self.meta.get(idx1 as usize - 1).ok_or(ZoneCorrupt)?;
            let next = m.next.load(Ordering::Relaxed);
            if next as usize > self.meta.len() {
                // Either the link changed under us (the CAS below would fail) or a
                // peer wrote it: re-read the head before deciding.
                let again = self.head.load(Ordering::Acquire);
                if again == w {
                    return Err(ZoneCorrupt);
                }
                w = again;
                continue;
            }
            // Acquire pairs with the Release of the push that freed the buffer: the
            // last holder's reads of it are done before we write it.
            match self.head.compare_exchange_weak(
                w,
                pack(tag.wrapping_add(1), next),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    let i = idx1 - 1;
                    // A buffer on the free list has no holder; anything else means a
                    // peer broke the protocol (it may still hold it: do not use it).
                    if m.refs
                        .compare_exchange(FREE, 1, Ordering::Relaxed, Ordering::Relaxed)
                        .is_err()
                    {
                        return Err(ZoneCorrupt);
                    }
                    let gen = m.gen.load(Ordering::Relaxed).wrapping_add(1);
                    m.gen.store(gen, Ordering::Relaxed);
                    return Ok(Some((i, gen)));
                }
                Err(cur) => w = cur,
            }
        }
        Err(ZoneCorrupt)
    }

    /// Adds a reference for a party the buffer is about to be handed to. Must happen
    /// before the descriptor naming the buffer is published.
    pub fn share(&self, index: u32) -> Result<(), ZoneCorrupt> {
        let m = self.meta.get(index as usize).ok_or(ZoneCorrupt)?;
        let old = m.refs.fetch_add(1, Ordering::Relaxed);
        if old == FREE || old == u32::MAX {
            return Err(ZoneCorrupt);
        }
        Ok(())
    }

    /// Drops one reference; the last one puts the buffer back on the free list.
    /// Ok(true): this call freed it. Err: the count was already 0 (nothing changed).
    pub fn release(&self, index: u32) -> Result<bool, ZoneCorrupt> {
        let m = self.meta.get(index as usize).ok_or(ZoneCorrupt)?;
        let mut old = m.refs.load(Ordering::Relaxed);
        let mut races = 0;
        loop {
            if old == FREE {
                return Err(ZoneCorrupt);
            }
            // Release: our reads (or writes) of the buffer happen before the count
            // drops; Acquire: the party that frees sees every other party's.
            match m
                .refs
                .compare_exchange_weak(old, old - 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(cur) => old = cur,
            }
            races += 1;
            if races >= MAX_RACES {
                return Err(ZoneCorrupt);
            }
        }
        if old != 1 {
            return Ok(false);
        }
        self.push(index)?;
        Ok(true)
    }

    fn push(&self, index: u32) -> Result<(), ZoneCorrupt> {
        let m = &self.meta[index as usize];
        let mut w = self.head.load(Ordering::Relaxed);
        for _ in 0..MAX_RACES {
            let (tag, idx1) = unpack(w);
            m.next.store(idx1, Ordering::Relaxed);
            // Release: publishes the link and the holders' finished accesses to the
            // next allocator's Acquire.
            match self.head.compare_exchange_weak(
                w,
                pack(tag.wrapping_add(1), index + 1),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(cur) => w = cur,
            }
        }
        Err(ZoneCorrupt)
    }

    /// Offset of buffer `index` in the zone.
    pub fn offset_of(&self, index: u32) -> u64 {
        self.slab_offset + index as u64 * self.buf_size as u64
    }

    /// Free buffers (walks the list, at most `count` steps; a statistic, racy).
    pub fn free_count(&self) -> u32 {
        let (_, mut idx1) = unpack(self.head.load(Ordering::Acquire));
        let mut n = 0;
        while idx1 != 0 && (n as usize) < self.meta.len() {
            n += 1;
            idx1 = match self.meta.get(idx1 as usize - 1) {
                Some(m) => m.next.load(Ordering::Relaxed),
                None => break,
            };
        }
        n
    }
}

/// Resolves a name received from the peer against this zone's checked layout: the
/// zone id matches, the offset is the start of a buffer of some class, and len fits
/// that buffer. Returns (class, index); the bytes offset..offset+len are then inside
/// the zone whatever the peer wrote anywhere.
pub fn resolve(l: &ZoneLayout, r: &ZoneRef) -> Result<(u32, u32), ZoneCorrupt> {
    if r.zone != l.id || r.len == 0 {
        return Err(ZoneCorrupt);
    }
    for (ci, c) in l.classes[..(l.class_count as usize).min(MAX_CLASSES)]
        .iter()
        .enumerate()
    {
        let size = c.buf_size as u64;
        let end = c.slab_offset + c.count as u64 * size;
        if r.offset >= c.slab_offset && r.offset < end {
            let rel = r.offset - c.slab_offset;
            if !rel.is_multiple_of(size) || r.len as u64 > size {
                return Err(ZoneCorrupt);
            }
            return Ok((ci as u32, (rel / size) as u32));
        }
    }
    Err(ZoneCorrupt)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn class(n: usize) -> (AtomicU64, Vec<BufMeta>) {
        (AtomicU64::new(0), (0..n).map(|_| BufMeta::new()).collect())
    }

    #[test]
    fn plan_is_sequential_and_page_aligned() {
        let l = plan(7, &[(4096, 3), (65536, 2)]).unwrap();
        assert_eq!(l.classes[0].meta_offset, 4096);
        assert_eq!(l.classes[1].meta_offset, 8192);
        assert_eq!(l.classes[0].slab_offset, 12288);
        assert_eq!(l.classes[1].slab_offset, 12288 + 3 * 4096);
        assert_eq!(l.zone_size, 12288 + 3 * 4096 + 2 * 65536);
        assert!(plan(0, &[(4096, 1)]).is_err());
        assert!(plan(1, &[(4095, 1)]).is_err());
        assert!(plan(1, &[(4096, 0)]).is_err());
        assert!(plan(1, &[(4096, 1); 5]).is_err());
    }

    #[test]
    fn alloc_until_empty_then_recycle() {
        let (h, m) = class(3);
        let c = ClassView {
            buf_size: 4096,
            slab_offset: 0,
            head: &h,
            meta: &m,
        };
        c.init();
        assert_eq!(c.free_count(), 3);
        let a = c.alloc().unwrap().unwrap();
        let b = c.alloc().unwrap().unwrap();
        let d = c.alloc().unwrap().unwrap();
        assert_eq!((a.0, b.0, d.0), (0, 1, 2));
        assert_eq!(c.alloc(), Ok(None));
        // Shared with a peer: freed only by the second release.
        c.share(b.0).unwrap();
        assert_eq!(c.release(b.0), Ok(false));
        assert_eq!(c.alloc(), Ok(None));
        assert_eq!(c.release(b.0), Ok(true));
        assert_eq!(c.release(b.0), Err(ZoneCorrupt), "count below zero refused");
        let again = c.alloc().unwrap().unwrap();
        assert_eq!(again.0, b.0);
        assert_ne!(again.1, b.1, "a new generation for each use");
        assert_eq!(c.share(7), Err(ZoneCorrupt));
        assert_eq!(c.release(7), Err(ZoneCorrupt));
    }

    #[test]
    fn corrupt_words_are_reported_not_followed() {
        let (h, m) = class(2);
        let c = ClassView {
            buf_size: 4096,
            slab_offset: 0,
            head: &h,
            meta: &m,
        };
        c.init();
        h.store(pack(5, 99), Ordering::Relaxed);
        assert_eq!(c.alloc(), Err(ZoneCorrupt));
        c.init();
        m[0].next.store(1000, Ordering::Relaxed);
        assert_eq!(c.alloc(), Err(ZoneCorrupt));
        c.init();
        m[0].refs.store(3, Ordering::Relaxed); // a "free" buffer someone holds
        assert_eq!(c.alloc(), Err(ZoneCorrupt));
        // A cycle in the free list: free_count stays bounded.
        c.init();
        m[1].next.store(1, Ordering::Relaxed);
        assert_eq!(c.free_count(), 2);
    }

    #[test]
    fn resolve_accepts_only_whole_buffers_of_this_zone() {
        let l = plan(9, &[(4096, 4), (65536, 2)]).unwrap();
        let s0 = l.classes[0].slab_offset;
        let s1 = l.classes[1].slab_offset;
        let r = |zone, offset, len| ZoneRef {
            zone,
            offset,
            len,
            gen: 1,
        };
        assert_eq!(resolve(&l, &r(9, s0 + 4096, 10)), Ok((0, 1)));
        assert_eq!(resolve(&l, &r(9, s1 + 65536, 65536)), Ok((1, 1)));
        assert!(resolve(&l, &r(8, s0, 10)).is_err());
        assert!(resolve(&l, &r(9, s0 + 1, 10)).is_err());
        assert!(resolve(&l, &r(9, s0, 4097)).is_err());
        assert!(resolve(&l, &r(9, s0, 0)).is_err());
        assert!(resolve(&l, &r(9, s1 + 2 * 65536, 1)).is_err());
        assert!(resolve(&l, &r(9, 0, 1)).is_err());
        assert!(resolve(&l, &r(9, u64::MAX, 1)).is_err());
        let e = r(9, s1, 300).encode();
        assert_eq!(ZoneRef::decode(&e), r(9, s1, 300));
    }
}

/// A zone mapped in this address space, with its checked layout.
#[cfg(not(loom))]
#[derive(Clone, Copy)]
pub struct MappedZone {
    base: *mut u8,
    layout: ZoneLayout,
}

#[cfg(not(loom))]
impl MappedZone {
    /// # Safety
    /// `base` must map at least `layout.zone_size` bytes, 8-aligned, for as long as the
    /// value (and every view taken from it) is used; `layout` must come from `plan` or
    /// `check_header` for that mapping.
    pub unsafe fn new(base: *mut u8, layout: ZoneLayout) -> MappedZone {
        MappedZone { base, layout }
    }
    pub fn layout(&self) -> &ZoneLayout {
        &self.layout
    }
    pub fn header(&self) -> &ZoneHeader {
        // SAFETY: the mapping holds at least the header page (zone_size ≥ 4096 by
        // construction); ZoneHeader accepts any bit pattern and is used through
        // shared references (atomics for the shared words).
        unsafe { &*(self.base as *const ZoneHeader) }
    }
    /// Class `c` (< class_count), or None.
    pub fn class(&self, c: u32) -> Option<ClassView<'_>> {
        if c >= self.layout.class_count {
            return None;
        }
        let k = &self.layout.classes[c as usize];
        // SAFETY: the layout was checked against the mapping: the descriptor array of
        // `count` 16-byte entries lies inside it, 8-aligned (page-aligned start); every
        // bit pattern is a valid BufMeta.
        let meta = unsafe {
            core::slice::from_raw_parts(
                self.base.add(k.meta_offset as usize) as *const BufMeta,
                k.count as usize,
            )
        };
        Some(ClassView {
            buf_size: k.buf_size,
            slab_offset: k.slab_offset,
            head: &self.header().free[c as usize].head,
            meta,
        })
    }
    /// Writes the header and puts every buffer on its free list (the creator only).
    pub fn init(&self) {
        let h = encode_header(&self.layout);
        // SAFETY: the header page is inside the mapping and nobody else maps it yet.
        unsafe { core::ptr::copy_nonoverlapping(h.as_ptr(), self.base, h.len()) };
        for c in 0..self.layout.class_count {
            if let Some(v) = self.class(c) {
                v.init();
            }
        }
    }
    /// The bytes a resolved name covers: (pointer, len). The span lies inside the
    /// mapping (`resolve` checked it against the layout).
    pub fn bytes(&self, r: &ZoneRef) -> Result<(*mut u8, usize), ZoneCorrupt> {
        resolve(&self.layout, r)?;
        // SAFETY: resolve proved offset..offset+len lies in a slab inside zone_size.
        Ok((unsafe { self.base.add(r.offset as usize) }, r.len as usize))
    }
}
