//! The zone path of a short-circuited stream (protocol §10.4): when a send does not
//! fit the ring's free space, the rest goes into 64 KiB buffers of the sending
//! direction's zone, named by (zone, offset) in the direction's zone queue together
//! with the ring index they come before. The receiver copies straight out of the
//! buffer and drops its reference; the last reference returns the buffer to the
//! zone's free list.
//!
//! Everything read here was written by the peer guest and is checked before use: a
//! queue index out of range, an entry position outside the ring's queued span or a
//! buffer name that is not a whole buffer of the zone is EIO, never an access outside
//! the segment.

use crate::iov;
use crate::shortcut::seg::Seg;
use canal_abi::ring::RawRing;
use canal_abi::segment::{ZoneQueue, ZONE_QUEUE_ENTRIES};
use canal_abi::sync::Ordering;
use canal_abi::zone::ZoneRef;
use libc::iovec;

/// Sends smaller than this that do not fit the ring wait for ring space instead (a
/// 64 KiB buffer for a few bytes is not worth a descriptor).
pub(crate) const MIN_ZONE_SEND: usize = 4096;

fn queued(q: &ZoneQueue) -> Result<(u64, u64), i32> {
    let tail = q.tail.load(Ordering::Relaxed);
    // Acquire pairs with the producer's Release of head: the entries are written.
    let head = q.head.load(Ordering::Acquire);
    let n = head.wrapping_sub(tail);
    if n > ZONE_QUEUE_ENTRIES {
        return Err(libc::EIO);
    }
    Ok((tail, n))
}

/// Posted entries the receiver has not finished (sender side: Acquire of the
/// receiver's tail, so a slot is reused only after the receiver is done with it).
fn in_flight(q: &ZoneQueue) -> Result<u64, i32> {
    let head = q.head.load(Ordering::Relaxed);
    let tail = q.tail.load(Ordering::Acquire);
    let n = head.wrapping_sub(tail);
    if n > ZONE_QUEUE_ENTRIES {
        return Err(libc::EIO);
    }
    Ok(n)
}

fn entry(q: &ZoneQueue, i: u64) -> &canal_abi::segment::ZoneDesc {
    &q.entries[(i % ZONE_QUEUE_ENTRIES) as usize]
}

fn name(q: &ZoneQueue, i: u64) -> ZoneRef {
    let e = entry(q, i);
    ZoneRef {
        zone: e.zone.load(Ordering::Relaxed),
        len: e.len.load(Ordering::Relaxed),
        offset: e.offset.load(Ordering::Relaxed),
        gen: e.gen.load(Ordering::Relaxed),
    }
}

/// Receiver: zone bytes queued in direction `dir` (a statistic for readiness and
/// FIONREAD; bounded, never fails).
pub(crate) fn pending(seg: Seg, dir: u32) -> u64 {
    let q = seg.zone_queue(dir);
    let Ok((tail, n)) = queued(q) else {
        return 1; // broken: make the socket readable so recv reports EIO
    };
    let mut sum = 0u64;
    for i in 0..n {
        sum += name(q, tail.wrapping_add(i)).len as u64;
    }
    sum.saturating_sub(q.front_off.load(Ordering::Relaxed))
}

/// Receiver: entries posted so far (moves with each zone send: an arrival edge).
pub(crate) fn posted(seg: Seg, dir: u32) -> u64 {
    seg.zone_queue(dir).head.load(Ordering::Acquire)
}

/// Receiver, ring lock held, ring indices `tail`/`head` just read (head Acquire,
/// before this call): the ring bytes that come before the next zone entry. None: no
/// entry (all `head - tail` ring bytes may be read). Some(0): the front entry is next.
pub(crate) fn ring_limit(seg: Seg, dir: u32, tail: u64, head: u64) -> Result<Option<u64>, i32> {
    let q = seg.zone_queue(dir);
    let (zt, n) = queued(q)?;
    if n == 0 {
        return Ok(None);
    }
    let pos = entry(q, zt).pos.load(Ordering::Relaxed);
    // The producer posts an entry at its ring head after publishing the ring bytes
    // before it; we read `head` first, so pos may be beyond it (bytes published
    // after our read), but never before the tail.
    // (A gap beyond `head - tail` is that race, or a peer's lie that only stalls the
    // stream it sends.)
    let _ = head;
    let gap = pos.wrapping_sub(tail);
    if gap > seg.ring_size() {
        return Err(libc::EIO);
    }
    Ok(Some(gap))
}

/// Receiver, ring lock held, the front entry due (`ring_limit` gave Some(0)): copies
/// up to `want` of its bytes into the iovecs from byte `got`, and unless `peek`
/// consumes them; the last byte releases the buffer and retires the entry. Returns
/// the bytes copied (or skipped with `discard`).
///
/// # Safety
/// The iovecs must be the caller's writable buffers for at least got + want bytes.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn recv_front(
    seg: Seg,
    dir: u32,
    seg_id: u32,
    iov: &[iovec],
    got: usize,
    want: usize,
    peek: bool,
    discard: bool,
) -> Result<usize, i32> {
    let q = seg.zone_queue(dir);
    let (zt, n) = queued(q)?;
    if n == 0 {
        return Ok(0);
    }
    let z = seg.zone(dir, seg_id)?;
    let r = name(q, zt);
    let (ptr, len) = z.bytes(&r).map_err(|_| libc::EIO)?;
    let off = q.front_off.load(Ordering::Relaxed);
    if off >= len as u64 {
        return Err(libc::EIO);
    }
    let k = (len - off as usize).min(want);
    if !discard {
        // SAFETY: ptr..ptr+len lies in the zone (resolved against the checked layout);
        // the buffer (a power of two ≥ len) is viewed as a ring only to reuse the
        // scatter code: off + k ≤ len never wraps.
        let buf = unsafe { RawRing::new(ptr, (len as u64).next_power_of_two()) };
        // SAFETY: the caller's iovecs take got + k bytes (k ≤ want).
        unsafe { iov::scatter_from(&buf, off, iov, got, k) };
    }
    if peek {
        return Ok(k);
    }
    if off + k as u64 == len as u64 {
        let (class, index) = canal_abi::zone::resolve(z.layout(), &r).map_err(|_| libc::EIO)?;
        let c = z.class(class).ok_or(libc::EIO)?;
        // Our reads of the buffer are done before the count drops (AcqRel inside).
        c.release(index).map_err(|_| libc::EIO)?;
        q.front_off.store(0, Ordering::Relaxed);
        // Release: the entry's slot may be reused after this.
        q.tail.store(zt.wrapping_add(1), Ordering::Release);
    } else {
        q.front_off.store(off + k as u64, Ordering::Relaxed);
    }
    Ok(k)
}

/// Sender, ring lock held, after publishing ring bytes up to `head`: moves up to
/// `left` bytes of the iovecs (from byte `skip`) into zone buffers posted at ring index
/// `head`, while buffers and queue slots last. Returns the bytes posted (0: none —
/// the caller waits for ring space as before).
///
/// # Safety
/// The iovecs must be the caller's readable buffers for at least skip + left bytes.
pub(crate) unsafe fn send(
    seg: Seg,
    dir: u32,
    seg_id: u32,
    head: u64,
    iov: &[iovec],
    skip: usize,
    left: usize,
) -> Result<usize, i32> {
    if left < MIN_ZONE_SEND {
        return Ok(0);
    }
    let q = seg.zone_queue(dir);
    let z = seg.zone(dir, seg_id)?;
    let Some(c) = z.class(0) else {
        return Ok(0);
    };
    let mut done = 0usize;
    let mut zh = q.head.load(Ordering::Relaxed);
    while left - done >= MIN_ZONE_SEND && in_flight(q)? < ZONE_QUEUE_ENTRIES {
        let Some((index, gen)) = c.alloc().map_err(|_| libc::EIO)? else {
            break;
        };
        let k = (left - done).min(c.buf_size as usize);
        let off = c.offset_of(index);
        let r = ZoneRef {
            zone: seg_id,
            len: k as u32,
            offset: off,
            gen,
        };
        let (ptr, _) = z.bytes(&r).map_err(|_| libc::EIO)?;
        // SAFETY: the buffer (buf_size, a power of two) lies in the zone and is ours
        // alone (just allocated); the caller's iovecs hold skip + left bytes.
        unsafe {
            let buf = RawRing::new(ptr, c.buf_size as u64);
            iov::gather_into(&buf, 0, iov, skip + done, k);
        }
        // The receiver's reference, taken before the name is published.
        c.share(index).map_err(|_| libc::EIO)?;
        let e = entry(q, zh);
        e.pos.store(head, Ordering::Relaxed);
        e.zone.store(r.zone, Ordering::Relaxed);
        e.len.store(r.len, Ordering::Relaxed);
        e.offset.store(r.offset, Ordering::Relaxed);
        e.gen.store(r.gen, Ordering::Relaxed);
        zh = zh.wrapping_add(1);
        // Release publishes the entry and the buffer's bytes to the receiver's Acquire.
        q.head.store(zh, Ordering::Release);
        // Our own reference: the receiver's keeps the buffer until it has read it.
        c.release(index).map_err(|_| libc::EIO)?;
        done += k;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use canal_abi::segment::{self, zone_offset};
    use canal_abi::zone::{plan, MappedZone};

    const RING: u64 = 4096;
    const ID: u32 = 3;

    /// A segment with 4 KiB rings and zones of four 4 KiB buffers, in page-aligned heap
    /// memory; both directions' zones initialised as canald does.
    struct Mem {
        buf: Vec<u8>,
        off: usize,
        zone_size: u64,
    }
    impl Mem {
        fn new() -> Mem {
            let l = plan(ID, &[(4096, 4)]).unwrap();
            let len = segment::segment_size_zones(RING, l.zone_size) as usize;
            let mut buf = vec![0u8; len + 4096];
            let off = buf.as_ptr().align_offset(4096);
            let base = buf[off..].as_mut_ptr();
            for d in 0..2 {
                // SAFETY: the zone lies inside buf (len computed for it), page-aligned.
                let z = unsafe {
                    MappedZone::new(base.add(zone_offset(d, RING, l.zone_size) as usize), l)
                };
                z.init();
            }
            Mem {
                buf,
                off,
                zone_size: l.zone_size,
            }
        }
        fn seg(&mut self) -> Seg {
            let base = self.buf[self.off..].as_mut_ptr();
            // SAFETY: base maps the whole segment (see new) while self lives.
            unsafe { Seg::from_raw(base, RING, self.zone_size) }
        }
    }

    fn iov_of(b: &mut [u8]) -> [iovec; 1] {
        [iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        }]
    }

    #[test]
    fn zone_pieces_arrive_in_order_partially_and_recycle() {
        let mut m = Mem::new();
        let seg = m.seg();
        let mut data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let src = iov_of(&mut data);
        // Ring head 100 (bytes already in the ring): the pieces go before ring byte 100.
        // SAFETY: src covers 10 000 readable bytes.
        let n = unsafe { send(seg, 0, ID, 100, &src, 0, 10_000) }.unwrap();
        assert_eq!(
            n, 8192,
            "two whole buffers; the 1 808-byte rest waits for the ring"
        );
        assert_eq!(pending(seg, 0), 8192);
        assert_eq!(posted(seg, 0), 2);
        assert_eq!(
            ring_limit(seg, 0, 0, 100),
            Ok(Some(100)),
            "ring bytes first"
        );
        assert_eq!(ring_limit(seg, 0, 100, 100), Ok(Some(0)), "then the zone");
        let mut out = vec![0u8; 8192];
        let mut got = 0;
        // Peek does not consume.
        let dst = iov_of(&mut out);
        // SAFETY: dst covers 8192 writable bytes.
        let k = unsafe { recv_front(seg, 0, ID, &dst, 0, 10, true, false) }.unwrap();
        assert_eq!((k, &out[..10]), (10, &data[..10]));
        assert_eq!(pending(seg, 0), 8192);
        while got < 8192 {
            // Odd pieces: entries are consumed partially, then retired.
            // SAFETY: dst covers 8192 bytes and got + want ≤ 8192.
            let k =
                unsafe { recv_front(seg, 0, ID, &dst, got, 1000.min(8192 - got), false, false) }
                    .unwrap();
            assert!(k > 0);
            got += k;
            assert_eq!(pending(seg, 0), 8192 - got as u64);
        }
        assert_eq!(&out[..], &data[..8192]);
        assert_eq!(ring_limit(seg, 0, 100, 100), Ok(None), "queue empty");
        let z = seg.zone(0, ID).unwrap();
        assert_eq!(
            z.class(0).unwrap().free_count(),
            4,
            "every buffer back on the list"
        );
        // The other direction is untouched.
        assert_eq!(pending(seg, 1), 0);
    }

    #[test]
    fn full_zone_and_small_rests_fall_back_to_the_ring() {
        let mut m = Mem::new();
        let seg = m.seg();
        let mut data = vec![1u8; 40_000];
        let src = iov_of(&mut data);
        // SAFETY: src covers 40 000 readable bytes.
        let n = unsafe { send(seg, 0, ID, 0, &src, 0, 40_000) }.unwrap();
        assert_eq!(n, 4 * 4096, "four buffers, then none free");
        // SAFETY: as above.
        assert_eq!(unsafe { send(seg, 0, ID, 0, &src, 0, 40_000) }, Ok(0));
        // SAFETY: as above.
        let small = unsafe { send(seg, 1, ID, 0, &src, 0, 4095) };
        assert_eq!(small, Ok(0), "< 4 KiB");
    }

    #[test]
    fn hostile_queue_words_are_eio_never_out_of_bounds() {
        let mut m = Mem::new();
        let seg = m.seg();
        let mut data = vec![9u8; 4096];
        let src = iov_of(&mut data);
        // SAFETY: src covers 4096 readable bytes.
        assert_eq!(unsafe { send(seg, 0, ID, 0, &src, 0, 4096) }, Ok(4096));
        let q = seg.zone_queue(0);
        let e = &q.entries[0];
        let mut out = vec![0u8; 4096];
        let dst = iov_of(&mut out);
        let recv = |seg| {
            // SAFETY: dst covers 4096 writable bytes.
            unsafe { recv_front(seg, 0, ID, &dst, 0, 4096, true, false) }
        };
        // A position beyond a ring's worth of the tail.
        e.pos.store(RING + 1, Ordering::Relaxed);
        assert_eq!(ring_limit(seg, 0, 0, 0), Err(libc::EIO));
        e.pos.store(0, Ordering::Relaxed);
        // Names that are not a whole buffer of this zone.
        let good = e.offset.load(Ordering::Relaxed);
        for (off, len, zone) in [
            (good + 1, 4096, ID),
            (good, 4097, ID),
            (good, 0, ID),
            (u64::MAX - 10, 4096, ID),
            (0, 16, ID),
            (good, 4096, ID + 1),
        ] {
            e.offset.store(off, Ordering::Relaxed);
            e.len.store(len, Ordering::Relaxed);
            e.zone.store(zone, Ordering::Relaxed);
            assert_eq!(
                recv(seg),
                Err(libc::EIO),
                "offset {off} len {len} zone {zone}"
            );
        }
        e.offset.store(good, Ordering::Relaxed);
        e.len.store(4096, Ordering::Relaxed);
        e.zone.store(ID, Ordering::Relaxed);
        // front_off past the piece.
        q.front_off.store(5000, Ordering::Relaxed);
        assert_eq!(recv(seg), Err(libc::EIO));
        q.front_off.store(0, Ordering::Relaxed);
        // More entries than the queue holds.
        q.head.store(17, Ordering::Relaxed);
        assert_eq!(ring_limit(seg, 0, 0, 0), Err(libc::EIO));
        q.head.store(1, Ordering::Relaxed);
        // A zone header rewritten by the peer: the layout no longer checks out.
        let z = seg.zone(0, ID).unwrap();
        let hdr = z.header() as *const _ as *mut u8;
        // SAFETY: the header's first page is ours (test memory); byte 64 is class 0's
        // buf_size.
        unsafe { *hdr.add(66) = 0x10 };
        assert!(seg.zone(0, ID).is_err());
        assert_eq!(recv(seg), Err(libc::EIO));
        // Intact again: the piece is still readable.
        // SAFETY: as above.
        unsafe { *hdr.add(66) = 0 };
        assert_eq!(recv(seg), Ok(4096));
        assert_eq!(out, data);
    }
}
