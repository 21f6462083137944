//! Threaded tests of the queue and rings on real atomics (also run under Miri with
//! smaller counts: `cargo +nightly miri test -p canal-abi --test stress`), plus the
//! checks a host makes on indices a hostile guest wrote.
#![cfg(not(loom))]

use canal_abi::queue::{init_cells, QueueCell, QueueConsumer, QueueFull, QueueProducer};
use canal_abi::ring::*;
use canal_abi::sync::{AtomicU32, AtomicU64};
use std::sync::Arc;

const N: u32 = if cfg!(miri) { 50 } else { 20_000 };

/// Ring storage on the heap.
struct HeapRing {
    buf: Vec<u64>,
    raw: RawRing,
}
impl HeapRing {
    fn new(size: usize) -> HeapRing {
        let mut buf = vec![0u64; size / 8];
        // SAFETY: the Vec's heap buffer does not move while HeapRing lives.
        let raw = unsafe { RawRing::new(buf.as_mut_ptr() as *mut u8, size as u64) };
        HeapRing { buf, raw }
    }
}

struct Shared {
    ring: HeapRing,
    head: AtomicU64,
    tail: AtomicU64,
}
// SAFETY: the raw ring's bytes are only accessed under the ring protocol.
unsafe impl Sync for Shared {}
// SAFETY: as above.
unsafe impl Send for Shared {}

#[test]
fn queue_many_producers_in_order_per_producer() {
    let cells: Arc<Vec<QueueCell>> = Arc::new((0..8).map(|_| QueueCell::new(0)).collect());
    init_cells(&cells);
    let tail = Arc::new(AtomicU32::new(0));
    let producers: Vec<_> = (0..3u32)
        .map(|p| {
            let (cells, tail) = (cells.clone(), tail.clone());
            std::thread::spawn(move || {
                let q = QueueProducer::new(&cells, &tail);
                for i in 0..N {
                    while q.push(p << 24 | i) == Err(QueueFull) {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    let mut c = QueueConsumer::new();
    let mut next = [0u32; 3];
    let mut got = 0;
    while got < 3 * N {
        match c.pop(&cells) {
            Some(v) => {
                let (p, i) = ((v >> 24) as usize, v & 0xff_ffff);
                assert_eq!(i, next[p], "per-producer FIFO");
                next[p] += 1;
                got += 1;
            }
            None => std::thread::yield_now(),
        }
    }
    for p in producers {
        p.join().unwrap();
    }
    assert!(!c.has_next(&cells));
}

#[test]
fn queue_consumer_ignores_garbage_cells() {
    let cells: Vec<QueueCell> = (0..4).map(|_| QueueCell::new(0)).collect();
    init_cells(&cells);
    let mut c = QueueConsumer::new();
    // A hostile guest writes arbitrary sequences: the consumer only takes a cell whose
    // sequence is exactly head+1, and never loops.
    cells[0]
        .seq
        .store(12345, canal_abi::sync::Ordering::Relaxed);
    assert_eq!(c.pop(&cells), None);
    cells[0].seq.store(1, canal_abi::sync::Ordering::Relaxed);
    cells[0]
        .value
        .store(0xdead_beef, canal_abi::sync::Ordering::Relaxed);
    assert_eq!(
        c.pop(&cells),
        Some(0xdead_beef),
        "garbage value is the caller's to validate"
    );
}

#[test]
fn byte_ring_stream_of_random_chunks() {
    let s = Arc::new(Shared {
        ring: HeapRing::new(4096),
        head: AtomicU64::new(0),
        tail: AtomicU64::new(0),
    });
    let total: usize = if cfg!(miri) { 3000 } else { 4 << 20 };
    let s2 = s.clone();
    let prod = std::thread::spawn(move || {
        let mut p = Producer {
            storage: &s2.ring.raw,
            head_shared: &s2.head,
            tail_shared: &s2.tail,
            head: 0,
        };
        let mut sent = 0usize;
        let mut x = 1u32;
        let chunk: Vec<u8> = (0..3000).map(|i| (i % 251) as u8).collect();
        while sent < total {
            x = x.wrapping_mul(1664525).wrapping_add(1013904223);
            let want = (1 + (x >> 8) as usize % 2999).min(total - sent);
            let start = sent % 251;
            let src: Vec<u8> = (0..want).map(|i| chunk[(start + i) % 251]).collect();
            let n = p.push(&src).unwrap();
            sent += n;
            if n == 0 {
                std::thread::yield_now();
            }
        }
    });
    let mut c = Consumer {
        storage: &s.ring.raw,
        head_shared: &s.head,
        tail_shared: &s.tail,
        tail: 0,
    };
    let mut got = 0usize;
    let mut buf = vec![0u8; 1777];
    while got < total {
        let n = c.pop(&mut buf).unwrap();
        for (i, b) in buf[..n].iter().enumerate() {
            assert_eq!(*b as usize, (got + i) % 251, "byte {} corrupted", got + i);
        }
        got += n;
        if n == 0 {
            std::thread::yield_now();
        }
    }
    prod.join().unwrap();
    assert!(s.ring.buf.len() == 512);
}

#[test]
fn records_keep_boundaries_and_addresses() {
    let s = Arc::new(Shared {
        ring: HeapRing::new(1024),
        head: AtomicU64::new(0),
        tail: AtomicU64::new(0),
    });
    let count = if cfg!(miri) { 40 } else { 20_000 };
    let s2 = s.clone();
    let prod = std::thread::spawn(move || {
        let mut p = Producer {
            storage: &s2.ring.raw,
            head_shared: &s2.head,
            tail_shared: &s2.tail,
            head: 0,
        };
        for i in 0..count {
            let len = i % 300;
            let payload: Vec<u8> = (0..len).map(|j| (i + j) as u8).collect();
            let addr = canal_abi::CanalAddr::v4([127, 0, 0, 1], i as u16).encode();
            let (a, b) = payload.split_at(len / 2);
            while !p
                .push_record(record_kind::DATAGRAM, &addr, &[a, b])
                .unwrap()
            {
                std::thread::yield_now();
            }
        }
    });
    let mut c = Consumer {
        storage: &s.ring.raw,
        head_shared: &s.head,
        tail_shared: &s.tail,
        tail: 0,
    };
    let mut i = 0;
    while i < count {
        let Some(info) = c.next_record().unwrap() else {
            std::thread::yield_now();
            continue;
        };
        assert_eq!(info.kind, record_kind::DATAGRAM);
        assert_eq!(info.len as usize, i % 300);
        let mut a = [0u8; 32];
        c.record_addr(&info, &mut a);
        assert_eq!(canal_abi::CanalAddr::decode(&a).unwrap().port, i as u16);
        let mut b = vec![0u8; info.len as usize];
        assert_eq!(c.record_payload(&info, 0, &mut b), b.len());
        assert!(b.iter().enumerate().all(|(j, x)| *x == (i + j) as u8));
        c.consume_record(&info);
        i += 1;
    }
    prod.join().unwrap();
}

#[test]
fn oversized_record_is_refused_not_wedged() {
    let s = Shared {
        ring: HeapRing::new(256),
        head: AtomicU64::new(0),
        tail: AtomicU64::new(0),
    };
    let mut p = Producer {
        storage: &s.ring.raw,
        head_shared: &s.head,
        tail_shared: &s.tail,
        head: 0,
    };
    let max = max_record_payload(256, 32) as usize;
    assert!(p.push_record(1, &[0; 32], &[&vec![0u8; max]]).unwrap());
    assert!(!p.push_record(1, &[0; 32], &[&vec![0u8; max + 8]]).unwrap());
}

#[test]
fn hostile_indices_are_detected() {
    let s = Shared {
        ring: HeapRing::new(256),
        head: AtomicU64::new(0),
        tail: AtomicU64::new(0),
    };
    // Producer index too far ahead of the consumer's.
    s.head.store(257, canal_abi::sync::Ordering::Relaxed);
    let c = Consumer {
        storage: &s.ring.raw,
        head_shared: &s.head,
        tail_shared: &s.tail,
        tail: 0,
    };
    assert_eq!(c.available(), Err(RingCorrupt));
    // Producer index behind the consumer's (wraps to a huge "used").
    s.head.store(0, canal_abi::sync::Ordering::Relaxed);
    let c = Consumer {
        storage: &s.ring.raw,
        head_shared: &s.head,
        tail_shared: &s.tail,
        tail: 8,
    };
    assert_eq!(c.available(), Err(RingCorrupt));
    // Consumer index ahead of what was produced.
    s.tail.store(300, canal_abi::sync::Ordering::Relaxed);
    let p = Producer {
        storage: &s.ring.raw,
        head_shared: &s.head,
        tail_shared: &s.tail,
        head: 16,
    };
    assert_eq!(p.free(), Err(RingCorrupt));
}

#[test]
fn hostile_record_headers_are_detected() {
    for bad in [
        encode_record_header(1000, 0, record_kind::DATAGRAM), // longer than queued
        encode_record_header(8, 0, record_kind::PAD),         // PAD not reaching the end
        encode_record_header(0, 7, record_kind::PAD),         // PAD with an address
    ] {
        let s = Shared {
            ring: HeapRing::new(256),
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
        };
        copy_in(&s.ring.raw, 0, &bad);
        s.head.store(64, canal_abi::sync::Ordering::Relaxed);
        let mut c = Consumer {
            storage: &s.ring.raw,
            head_shared: &s.head,
            tail_shared: &s.tail,
            tail: 0,
        };
        assert_eq!(c.next_record(), Err(RingCorrupt), "{bad:?}");
    }
}

/// Zones: a sender allocates buffers, fills them with a pattern naming the buffer's
/// use, shares each with the receiver and posts its name through a queue; the
/// receiver checks the bytes and releases; the sender releases its own reference
/// early or late. A buffer handed out twice at once, or recycled while someone still
/// reads it, shows up as a wrong pattern (and as a data race under Miri).
#[test]
fn zone_share_and_recycle_between_two_threads() {
    use canal_abi::zone::*;
    use std::sync::atomic::Ordering;
    const BUFS: usize = 4;
    const BUF: usize = 64;
    let rounds: u32 = if cfg!(miri) { 40 } else { 20_000 };
    struct Z {
        head: AtomicU64,
        meta: Vec<BufMeta>,
        slab: Vec<std::cell::UnsafeCell<[u64; BUF / 8]>>,
        posted: Vec<QueueCell>,
        posted_tail: AtomicU32,
    }
    // SAFETY: slab buffers are accessed only by their current holders, as the zone
    // protocol under test orders it.
    unsafe impl Sync for Z {}
    let z = Arc::new(Z {
        head: AtomicU64::new(0),
        meta: (0..BUFS).map(|_| BufMeta::new()).collect(),
        slab: (0..BUFS)
            .map(|_| std::cell::UnsafeCell::new([0u64; BUF / 8]))
            .collect(),
        posted: (0..8).map(|_| QueueCell::new(0)).collect(),
        posted_tail: AtomicU32::new(0),
    });
    init_cells(&z.posted);
    fn view(z: &Z) -> ClassView<'_> {
        ClassView {
            buf_size: 4096,
            slab_offset: 0,
            head: &z.head,
            meta: &z.meta,
        }
    }
    view(&z).init();
    let zs = z.clone();
    let sender = std::thread::spawn(move || {
        let c = view(&zs);
        let q = QueueProducer::new(&zs.posted, &zs.posted_tail);
        for round in 0..rounds {
            let (i, _gen) = loop {
                match c.alloc().unwrap() {
                    Some(b) => break b,
                    None => std::thread::yield_now(),
                }
            };
            // SAFETY: we hold the only reference: nobody else touches the buffer.
            unsafe { (*zs.slab[i as usize].get()).fill(round as u64) };
            c.share(i).unwrap();
            let early = round % 2 == 0;
            if early {
                // Our reference goes before the receiver has it: it still holds one.
                assert!(!c.release(i).unwrap());
            }
            while q.push(round << 4 | i) == Err(QueueFull) {
                std::thread::yield_now();
            }
            if !early {
                c.release(i).unwrap();
            }
        }
    });
    let c = view(&z);
    let mut qc = QueueConsumer::new();
    for round in 0..rounds {
        let v = loop {
            match qc.pop(&z.posted) {
                Some(v) => break v,
                None => std::thread::yield_now(),
            }
        };
        assert_eq!(v >> 4, round);
        let i = v & 15;
        // SAFETY: we hold a reference, the sender no longer writes the buffer.
        let b = unsafe { *z.slab[i as usize].get() };
        assert!(b.iter().all(|&w| w == round as u64), "round {round}");
        c.release(i).unwrap();
    }
    sender.join().unwrap();
    assert_eq!(c.free_count(), BUFS as u32, "every buffer recycled");
    assert!(z.meta.iter().all(|m| m.refs.load(Ordering::Relaxed) == 0));
}
