//! Model checks of the concurrent algorithms with loom:
//! `RUSTFLAGS="--cfg loom" cargo test -p canal-abi --test loom --release`.
#![cfg(loom)]

use canal_abi::queue::{init_cells, QueueCell, QueueConsumer, QueueProducer};
use canal_abi::ring::{record_kind, Consumer, Producer, RingStorage};
use canal_abi::sync::{fence, AtomicU32, AtomicU64, Ordering};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

/// Ring bytes whose every access loom checks for causality.
struct LoomStorage(Vec<UnsafeCell<u8>>);
// SAFETY: accesses are ordered by the ring protocol under test; loom reports any that
// are not.
unsafe impl Sync for LoomStorage {}
// SAFETY: as above.
unsafe impl Send for LoomStorage {}

impl LoomStorage {
    fn new(n: usize) -> Self {
        LoomStorage((0..n).map(|_| UnsafeCell::new(0)).collect())
    }
}

impl RingStorage for LoomStorage {
    fn size(&self) -> u64 {
        self.0.len() as u64
    }
    fn write(&self, off: usize, src: &[u8]) {
        for (i, b) in src.iter().enumerate() {
            // SAFETY: loom checks that no read of this byte races with the write.
            self.0[off + i].with_mut(|p| unsafe { *p = *b });
        }
    }
    fn read(&self, off: usize, dst: &mut [u8]) {
        for (i, d) in dst.iter_mut().enumerate() {
            // SAFETY: as above.
            *d = self.0[off + i].with(|p| unsafe { *p });
        }
    }
}

struct Q {
    cells: Vec<QueueCell>,
    tail: AtomicU32,
}

#[test]
fn queue_two_producers_one_consumer() {
    loom::model(|| {
        let q = Arc::new(Q {
            cells: (0..2).map(|_| QueueCell::new(0)).collect(),
            tail: AtomicU32::new(0),
        });
        init_cells(&q.cells);
        let hs: Vec<_> = [7u32, 9]
            .into_iter()
            .map(|v| {
                let q = q.clone();
                thread::spawn(move || QueueProducer::new(&q.cells, &q.tail).push(v).unwrap())
            })
            .collect();
        let mut c = QueueConsumer::new();
        let mut got = vec![];
        while got.len() < 2 {
            match c.pop(&q.cells) {
                Some(v) => got.push(v),
                None => thread::yield_now(),
            }
        }
        for h in hs {
            h.join().unwrap();
        }
        got.sort();
        assert_eq!(got, vec![7, 9]);
        assert!(c.pop(&q.cells).is_none());
    });
}

#[test]
fn queue_reuses_cells_after_a_lap() {
    // The producer spins while the single cell is full; bound preemptions so the
    // model stays finite (loom's advice for algorithms that wait for progress).
    bounded().check(|| {
        let q = Arc::new(Q {
            cells: (0..2).map(|_| QueueCell::new(0)).collect(),
            tail: AtomicU32::new(0),
        });
        init_cells(&q.cells);
        let q2 = q.clone();
        let p = thread::spawn(move || {
            let pr = QueueProducer::new(&q2.cells, &q2.tail);
            for v in [1u32, 2, 3] {
                while pr.push(v).is_err() {
                    thread::yield_now();
                }
            }
        });
        let mut c = QueueConsumer::new();
        let mut got = vec![];
        while got.len() < 3 {
            match c.pop(&q.cells) {
                Some(v) => got.push(v),
                None => thread::yield_now(),
            }
        }
        p.join().unwrap();
        assert_eq!(got, vec![1, 2, 3], "FIFO across a full lap");
    });
}

struct R {
    s: LoomStorage,
    head: AtomicU64,
    tail: AtomicU64,
}

/// An empty 4-byte ring.
fn ring4() -> Arc<R> {
    ring(4)
}

/// An empty ring of `size` bytes.
fn ring(size: usize) -> Arc<R> {
    Arc::new(R {
        s: LoomStorage::new(size),
        head: AtomicU64::new(0),
        tail: AtomicU64::new(0),
    })
}

impl R {
    /// Its producer end, starting at index 0.
    fn producer(&self) -> Producer<'_, LoomStorage> {
        Producer {
            storage: &self.s,
            head_shared: &self.head,
            tail_shared: &self.tail,
            head: 0,
        }
    }
    /// Its consumer end, starting at index 0.
    fn consumer(&self) -> Consumer<'_, LoomStorage> {
        Consumer {
            storage: &self.s,
            head_shared: &self.head,
            tail_shared: &self.tail,
            tail: 0,
        }
    }
}

/// A model whose threads wait for each other's progress: preemptions are bounded so it
/// stays finite (loom's advice for such algorithms).
fn bounded() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b
}

#[test]
fn byte_ring_spsc_with_wrap() {
    loom::model(|| {
        let r = ring4();
        let r2 = r.clone();
        let p = thread::spawn(move || {
            let mut pr = Producer {
                storage: &r2.s,
                head_shared: &r2.head,
                tail_shared: &r2.tail,
                head: 0,
            };
            let data = [1u8, 2, 3, 4, 5, 6];
            let mut sent = 0;
            while sent < data.len() {
                let n = pr.push(&data[sent..(sent + 3).min(data.len())]).unwrap();
                if n == 0 {
                    thread::yield_now();
                }
                sent += n;
            }
        });
        let mut co = Consumer {
            storage: &r.s,
            head_shared: &r.head,
            tail_shared: &r.tail,
            tail: 0,
        };
        let mut got = vec![];
        while got.len() < 6 {
            let mut b = [0u8; 4];
            let n = co.pop(&mut b).unwrap();
            if n == 0 {
                thread::yield_now();
            }
            got.extend_from_slice(&b[..n]);
        }
        p.join().unwrap();
        assert_eq!(got, vec![1, 2, 3, 4, 5, 6]);
    });
}

/// The guest's stream path (libcanal `sock.rs`, protocol §3.4 minor 3): the sender
/// keeps the consumer's index as last read (`tx_tail_seen`) and reads the real one only
/// when the space it implies is short of the call; the receiver keeps the producer's
/// (`rx_head_seen`) and reads the real one only when the bytes it implies do not fill
/// its buffer. Stale values are lower bounds: loom checks that no byte is overwritten
/// before it was read nor read before it was written, in every interleaving.
#[test]
fn byte_ring_with_cached_indices() {
    use canal_abi::ring::{check_indices, copy_in, copy_out};
    // Both sides wait for each other: bound preemptions so the model stays finite.
    bounded().check(|| {
        let r = ring4();
        let r2 = r.clone();
        let p = thread::spawn(move || {
            let data = [1u8, 2, 3, 4, 5, 6];
            let (mut head, mut tail_seen, mut sent) = (0u64, 0u64, 0usize);
            while sent < data.len() {
                let want = (data.len() - sent).min(3);
                let mut used = check_indices(head, tail_seen, 4).unwrap();
                if 4 - used < want as u64 {
                    tail_seen = r2.tail.load(Ordering::Acquire);
                    used = check_indices(head, tail_seen, 4).unwrap();
                }
                let n = ((4 - used) as usize).min(want);
                if n == 0 {
                    thread::yield_now();
                    continue;
                }
                copy_in(&r2.s, head, &data[sent..sent + n]);
                head += n as u64;
                r2.head.store(head, Ordering::Release);
                sent += n;
            }
        });
        let (mut tail, mut head_seen) = (0u64, 0u64);
        let mut got = vec![];
        while got.len() < 6 {
            let want = 2u64;
            let mut avail = check_indices(head_seen, tail, 4).unwrap();
            if avail < want {
                head_seen = r.head.load(Ordering::Acquire);
                avail = check_indices(head_seen, tail, 4).unwrap();
            }
            let n = avail.min(want) as usize;
            if n == 0 {
                thread::yield_now();
                continue;
            }
            let mut b = [0u8; 2];
            copy_out(&r.s, tail, &mut b[..n]);
            tail += n as u64;
            r.tail.store(tail, Ordering::Release);
            got.extend_from_slice(&b[..n]);
        }
        p.join().unwrap();
        assert_eq!(got, vec![1, 2, 3, 4, 5, 6]);
    });
}

#[test]
fn message_ring_records_with_padding() {
    loom::model(|| {
        // 64-byte ring: a 16-byte record then a 24-byte one wrap and need a PAD.
        let r = Arc::new(R {
            s: LoomStorage::new(64),
            head: AtomicU64::new(40),
            tail: AtomicU64::new(40),
        });
        let r2 = r.clone();
        let p = thread::spawn(move || {
            let mut pr = Producer {
                storage: &r2.s,
                head_shared: &r2.head,
                tail_shared: &r2.tail,
                head: 40,
            };
            for payload in [&[1u8, 2, 3][..], &[4u8; 12][..]] {
                while !pr
                    .push_record(record_kind::DATAGRAM, &[], &[payload])
                    .unwrap()
                {
                    thread::yield_now();
                }
            }
        });
        let mut co = Consumer {
            storage: &r.s,
            head_shared: &r.head,
            tail_shared: &r.tail,
            tail: 40,
        };
        let mut got: Vec<Vec<u8>> = vec![];
        while got.len() < 2 {
            match co.next_record().unwrap() {
                Some(info) => {
                    let mut b = vec![0u8; info.len as usize];
                    co.record_payload(&info, 0, &mut b);
                    co.consume_record(&info);
                    got.push(b);
                }
                None => thread::yield_now(),
            }
        }
        p.join().unwrap();
        assert_eq!(got, vec![vec![1, 2, 3], vec![4u8; 12]]);
    });
}

/// The sleep/kick handshake of protocol §6: whenever the sleeper decides to sleep
/// without having seen the work, the worker must have seen the flag and kicked.
#[test]
fn sleep_flag_handshake_never_loses_a_wakeup() {
    loom::model(|| {
        let sleeping = Arc::new(AtomicU32::new(0));
        let work = Arc::new(AtomicU32::new(0));
        let kicked = Arc::new(AtomicU32::new(0));
        let (s2, w2, k2) = (sleeping.clone(), work.clone(), kicked.clone());
        let guest = thread::spawn(move || {
            w2.store(1, Ordering::Release);
            fence(Ordering::SeqCst);
            if s2.swap(0, Ordering::SeqCst) == 1 {
                k2.store(1, Ordering::Relaxed);
            }
        });
        sleeping.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let saw_work = work.load(Ordering::Acquire) == 1;
        guest.join().unwrap();
        if !saw_work {
            assert_eq!(kicked.load(Ordering::Relaxed), 1, "lost wake-up");
        }
    });
}

/// The receive-room handshake (protocol §3.5): the host, short of room, sets
/// RX_WANT_SPACE, fences and re-reads the guest's tail; the guest releases room (tail
/// store, Release) and asks `room_asked_after_release`. Property: the host sees the
/// room or the guest raises attention — never neither (both would wait for good).
#[test]
fn rx_room_handshake_never_strands_the_host() {
    loom::model(|| {
        let flags = Arc::new(AtomicU32::new(0));
        let tail = Arc::new(AtomicU64::new(0));
        let raised = Arc::new(AtomicU32::new(0));
        let (f2, t2, r2) = (flags.clone(), tail.clone(), raised.clone());
        let guest = thread::spawn(move || {
            t2.store(64, Ordering::Release);
            if canal_abi::region::room_asked_after_release(&f2) {
                r2.store(1, Ordering::Relaxed);
            }
        });
        flags.fetch_or(
            canal_abi::consts::sock_flag::RX_WANT_SPACE,
            Ordering::Release,
        );
        fence(Ordering::SeqCst);
        let saw_room = tail.load(Ordering::Acquire) == 64;
        guest.join().unwrap();
        if !saw_room {
            assert_eq!(
                raised.load(Ordering::Relaxed),
                1,
                "host stranded short of room"
            );
        }
    });
}

/// The pair-segment wake handshake (protocol §8.4). Side B wants to read: it counts
/// itself in `sleepers`, publishes `sleep = EVENTS` on its slot, fences, re-checks the
/// ring, and sleeps only if still empty. Side A publishes bytes (head, Release),
/// fences, and only if `sleepers` is non-zero raises its attention bit (Release) —
/// followed by a kick, modelled by canald's thread, which acquires the bit, fences and
/// reads B's `sleep` word to decide the wake-up. Property: B never sleeps unless canald
/// will see it asleep (a lost wake-up would hang B); and when B sees the bytes they
/// are the ones written.
#[test]
fn segment_wake_handshake() {
    loom::model(|| {
        let r = ring(8);
        let sleepers = Arc::new(AtomicU32::new(0));
        let sleep = Arc::new(AtomicU32::new(0));
        let attention = Arc::new(AtomicU32::new(0));

        let a = {
            let (r, sleepers, attention) = (r.clone(), sleepers.clone(), attention.clone());
            thread::spawn(move || {
                let mut p = r.producer();
                assert_eq!(p.push(&[42]).unwrap(), 1);
                fence(Ordering::SeqCst);
                if sleepers.load(Ordering::Relaxed) != 0 {
                    attention.store(1, Ordering::Release);
                    true
                } else {
                    false
                }
            })
        };
        let b = {
            let (r, sleepers, sleep) = (r.clone(), sleepers.clone(), sleep.clone());
            thread::spawn(move || {
                let mut c = r.consumer();
                let mut buf = [0u8; 1];
                if c.pop(&mut buf).unwrap() == 1 {
                    assert_eq!(buf[0], 42);
                    return false; // got it while polling
                }
                sleepers.fetch_add(1, Ordering::Relaxed);
                sleep.store(2, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                if c.pop(&mut buf).unwrap() == 1 {
                    assert_eq!(buf[0], 42);
                    sleep.store(0, Ordering::Relaxed);
                    sleepers.fetch_sub(1, Ordering::Relaxed);
                    return false; // the re-check saw it
                }
                true // would sleep on its eventfd
            })
        };
        let kicked = a.join().unwrap();
        // canald runs after the kick (the doorbell write orders it after A).
        let woke = if kicked && attention.swap(0, Ordering::Acquire) == 1 {
            fence(Ordering::SeqCst);
            sleep.load(Ordering::Relaxed) == 2
        } else {
            false
        };
        let slept = b.join().unwrap();
        assert!(!slept || woke, "B sleeps but canald does not wake it");
    });
}

/// FIN word (protocol §8.3, minor 9): A publishes a byte, then its FIN word
/// (Release), fences and wakes B's futex sleepers if it finds any; B, reading the FIN
/// word (Acquire) before the head, declares end-of-file only with the ring drained,
/// else counts itself a sleeper, fences and re-checks before it would sleep.
/// Properties: B never declares the end before it has the byte; a B that sleeps is
/// woken.
#[test]
fn fin_follows_the_last_byte_and_wakes_a_sleeper() {
    loom::model(|| {
        let r = ring(8);
        let fin = Arc::new(AtomicU32::new(0));
        let sleepers = Arc::new(AtomicU32::new(0));

        let a = {
            let (r, fin, sleepers) = (r.clone(), fin.clone(), sleepers.clone());
            thread::spawn(move || {
                let mut p = r.producer();
                assert_eq!(p.push(&[42]).unwrap(), 1);
                fin.store(1, Ordering::Release);
                fence(Ordering::SeqCst);
                sleepers.load(Ordering::Relaxed) != 0 // FUTEX_WAKE
            })
        };
        let b = {
            let (r, fin, sleepers) = (r.clone(), fin.clone(), sleepers.clone());
            thread::spawn(move || {
                let mut c = r.consumer();
                let mut got = false;
                let mut buf = [0u8; 1];
                // One look: the end (ring drained), or the byte, or nothing yet.
                let mut look = |c: &mut Consumer<'_, LoomStorage>, got: &mut bool| {
                    let ended = fin.load(Ordering::Acquire) != 0;
                    if c.pop(&mut buf).unwrap() == 1 {
                        assert_eq!(buf[0], 42);
                        *got = true;
                    }
                    if ended {
                        assert!(*got, "end of file before the last byte");
                    }
                    ended
                };
                if look(&mut c, &mut got) {
                    return false;
                }
                sleepers.fetch_add(1, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                if look(&mut c, &mut got) || got {
                    sleepers.fetch_sub(1, Ordering::Relaxed);
                    return false;
                }
                true // FUTEX_WAIT
            })
        };
        let woke = a.join().unwrap();
        let slept = b.join().unwrap();
        assert!(!slept || woke, "B sleeps but A does not wake it");
    });
}

/// Bells (protocol §8.8): two sleepers of one side — B with a bell, C with a bell or
/// without one — each counting itself in the bell word, then in `sleepers`; and a
/// publisher A that, after its fence, finds `sleepers` non-zero and then rings the one
/// tag the bell word names, or has canald relay (which wakes every sleeper).
/// Property: a thread that sleeps is woken — its own bell rung, or the relay.
#[test]
fn bell_wake_handshake() {
    use canal_abi::segment::bell;
    for c_bell in [true, false] {
        bounded().check(move || {
            let data = Arc::new(AtomicU32::new(0));
            let sleepers = Arc::new(AtomicU32::new(0));
            let word = Arc::new(AtomicU64::new(0));
            let sleeper = |tag: Option<u32>| {
                let (data, sleepers, word) = (data.clone(), sleepers.clone(), word.clone());
                thread::spawn(move || {
                    bell::enter(&word, tag);
                    sleepers.fetch_add(1, Ordering::Release);
                    fence(Ordering::SeqCst);
                    if data.load(Ordering::Relaxed) == 1 {
                        sleepers.fetch_sub(1, Ordering::Relaxed);
                        bell::leave(&word);
                        return None; // the re-check saw it
                    }
                    Some(tag) // sleeps on its bell (if any) and its slot eventfd
                })
            };
            let (tb, tc) = (bell::tag(1, 1), bell::tag(2, 1));
            let b = sleeper(Some(tb));
            let c = sleeper(c_bell.then_some(tc));
            let a = {
                let (data, sleepers, word) = (data.clone(), sleepers.clone(), word.clone());
                thread::spawn(move || {
                    data.store(1, Ordering::Relaxed);
                    fence(Ordering::SeqCst);
                    if sleepers.load(Ordering::Acquire) == 0 {
                        return (None, false);
                    }
                    match bell::target(word.load(Ordering::Relaxed)) {
                        Some(t) => (Some(t), false),
                        None => (None, true),
                    }
                })
            };
            let (rung, relayed) = a.join().unwrap();
            for slept in [b.join().unwrap(), c.join().unwrap()].into_iter().flatten() {
                let woken = relayed || (slept.is_some() && rung == slept);
                assert!(woken, "a sleeper ({slept:?}) is never woken: rung {rung:?}");
            }
        });
    }
}

/// Zones: one buffer, handed from a sender to a receiver by (shared reference,
/// posted name). The sender drops its reference right after posting and allocates
/// again; it can get the buffer back only after both released it, and loom
/// checks that its new write is ordered after the receiver's read (the refcount's
/// AcqRel and the free list's Release/Acquire carry the happens-before).
#[test]
fn zone_refcount_recycle_orders_reuse_after_last_reader() {
    use canal_abi::zone::{BufMeta, ClassView};
    struct Z {
        head: AtomicU64,
        meta: Vec<BufMeta>,
        buf: UnsafeCell<u8>,
        posted: AtomicU32,
    }
    // SAFETY: `buf` is accessed by its holders only, ordered by the protocol; loom
    // reports any access that is not.
    unsafe impl Sync for Z {}
    // SAFETY: as above.
    unsafe impl Send for Z {}
    fn view(z: &Z) -> ClassView<'_> {
        ClassView {
            buf_size: 4096,
            slab_offset: 0,
            head: &z.head,
            meta: &z.meta,
        }
    }
    bounded().check(|| {
        let z = Arc::new(Z {
            head: AtomicU64::new(0),
            meta: vec![BufMeta::new()],
            buf: UnsafeCell::new(0),
            posted: AtomicU32::new(0),
        });
        view(&z).init();
        let z2 = z.clone();
        let sender = thread::spawn(move || {
            let c = view(&z2);
            let (i, _) = c.alloc().unwrap().unwrap();
            // SAFETY: sole holder.
            z2.buf.with_mut(|p| unsafe { *p = 7 });
            c.share(i).unwrap();
            z2.posted.store(i + 1, Ordering::Release);
            // Whichever of the two releases comes last frees the buffer.
            c.release(i).unwrap();
            let (j, _) = loop {
                match c.alloc().unwrap() {
                    Some(b) => break b,
                    None => thread::yield_now(),
                }
            };
            assert_eq!(j, i);
            // SAFETY: sole holder again (loom checks the receiver's read is ordered
            // before this write).
            z2.buf.with_mut(|p| unsafe { *p = 8 });
        });
        let c = view(&z);
        let i = loop {
            let v = z.posted.load(Ordering::Acquire);
            if v != 0 {
                break v - 1;
            }
            thread::yield_now();
        };
        // SAFETY: we hold a reference; the sender wrote before sharing.
        let v = z.buf.with(|p| unsafe { *p });
        assert_eq!(v, 7);
        c.release(i).unwrap();
        sender.join().unwrap();
        assert_eq!(c.free_count(), 0, "the sender holds it again");
    });
}

/// Two parties release their references to one buffer at the same time while a third
/// allocates: exactly one release frees it, and the allocation either finds the list
/// empty or gets the buffer after both releases.
#[test]
fn zone_concurrent_releases_free_once() {
    use canal_abi::zone::{BufMeta, ClassView};
    loom::model(|| {
        let head = Arc::new(AtomicU64::new(0));
        let meta = Arc::new(vec![BufMeta::new()]);
        let c = ClassView {
            buf_size: 4096,
            slab_offset: 0,
            head: &head,
            meta: &meta,
        };
        c.init();
        let (i, _) = c.alloc().unwrap().unwrap();
        c.share(i).unwrap();
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let (head, meta) = (head.clone(), meta.clone());
                thread::spawn(move || {
                    let c = ClassView {
                        buf_size: 4096,
                        slab_offset: 0,
                        head: &head,
                        meta: &meta,
                    };
                    c.release(i).unwrap()
                })
            })
            .collect();
        let freed: Vec<bool> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(freed.iter().filter(|&&f| f).count(), 1);
        assert_eq!(c.alloc().unwrap().map(|b| b.0), Some(i));
        assert_eq!(c.alloc().unwrap(), None);
    });
}

/// The biased side lock (bias.rs): an owner on its fast path and a revoker never hold
/// the side together, and every increment of the guarded counter survives. The owner
/// already holds the bias; it enters twice (fast path, then whatever is left after a
/// revocation), the other thread once (it revokes). B1/B2 are SeqCst fences.
#[test]
fn biased_side_lock_owner_and_revoker() {
    use canal_abi::bias::{FenceEnv, SideLock, REVOKED};
    struct Side {
        lock: AtomicU32,
        bias: AtomicU64,
        busy: AtomicU32,
        count: UnsafeCell<u32>,
    }
    // SAFETY: `count` is guarded by the lock under test; loom reports racing accesses.
    unsafe impl Sync for Side {}
    fn bump(side: &Side, me: u64) {
        let s = SideLock {
            lock: &side.lock,
            bias: &side.bias,
            busy: &side.busy,
        };
        let how = s.enter(me, || true, &FenceEnv);
        // SAFETY: inside the side lock.
        side.count.with_mut(|p| unsafe { *p += 1 });
        s.exit(how);
    }
    loom::model(|| {
        let side = Arc::new(Side {
            lock: AtomicU32::new(0),
            bias: AtomicU64::new(1),
            busy: AtomicU32::new(0),
            count: UnsafeCell::new(0),
        });
        let other = {
            let side = side.clone();
            thread::spawn(move || bump(&side, 2))
        };
        bump(&side, 1);
        bump(&side, 1);
        other.join().unwrap();
        // SAFETY: both threads are done.
        assert_eq!(side.count.with(|p| unsafe { *p }), 3);
        assert_eq!(side.bias.load(Ordering::Relaxed), REVOKED);
    });
}

/// An event log of 4 entries (protocol §8.6) in loom atomics.
fn small_log() -> (Box<canal_abi::evlog::EvLogHeader>, Vec<AtomicU64>) {
    use canal_abi::evlog::*;
    let h = EvLogHeader {
        magic: EVLOG_MAGIC,
        version: 1,
        entries: 4,
        owner: 1,
        reserved0: [0; 11],
        tail: AtomicU64::new(0),
        reserved1: [0; 7],
        sleepers: AtomicU32::new(0),
        readers: AtomicU32::new(1),
        bell: AtomicU64::new(0),
        reserved2: [0; 12],
    };
    (Box::new(h), (0..4).map(|_| AtomicU64::new(0)).collect())
}

/// E1/E2: a peer publishes data and appends; the owner's epoll waiter counts itself a
/// sleeper (in the bell word too, §8.8), then sweeps. Either the sweep names the
/// socket (and the data is visible then), or the appender sees the sleeper and rings
/// its bell or has canald wake it — never neither, and never another tag.
const LOG_SLEEPER_TAG: u32 = canal_abi::segment::bell::tag(3, 1);

#[test]
fn event_log_append_and_sleeper_never_lose_a_change() {
    bounded().check(|| {
        let (h, e) = small_log();
        let shared = Arc::new((h, e, AtomicU64::new(0), AtomicU32::new(0)));
        let peer = {
            let s = shared.clone();
            thread::spawn(move || {
                let log = canal_abi::evlog::EvLog::new(&s.0, &s.1).unwrap();
                s.2.store(1, Ordering::Release); // the ring head moves
                if log.append(7) {
                    // Its bell rung (2), or canald relays (1).
                    let rung = canal_abi::segment::bell::target(log.bell());
                    assert!(rung.is_none() || rung == Some(LOG_SLEEPER_TAG));
                    s.3.store(if rung.is_some() { 2 } else { 1 }, Ordering::Relaxed);
                }
            })
        };
        let log = canal_abi::evlog::EvLog::new(&shared.0, &shared.1).unwrap();
        // The sleeper's W2 fence (libcanal conn::sleep) after counting itself.
        canal_abi::segment::bell::enter(&shared.0.bell, Some(LOG_SLEEPER_TAG));
        shared.0.sleepers.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let mut cursor = 0;
        let mut named = false;
        let mut data = 0;
        let sweep = log.sweep(&mut cursor, |i| {
            assert_eq!(i, 7);
            named = true;
        });
        if named {
            data = shared.2.load(Ordering::Acquire);
        }
        peer.join().unwrap();
        if named {
            assert_eq!(data, 1, "an entry is appended only after the change");
        } else {
            // Nothing seen (or an entry still being written): the sleeper must be woken.
            assert!(
                shared.3.load(Ordering::Relaxed) != 0 || sweep == canal_abi::evlog::Sweep::Pending,
                "a change neither named nor woken"
            );
        }
    });
}

/// Two appenders and two independent readers: each reader sees both entries once
/// (in some order), whatever it saw mid-way.
#[test]
fn event_log_two_appenders_two_readers() {
    bounded().check(|| {
        let (h, e) = small_log();
        let shared = Arc::new((h, e));
        let ts: Vec<_> = [3u32, 5]
            .into_iter()
            .map(|i| {
                let s = shared.clone();
                thread::spawn(move || {
                    canal_abi::evlog::EvLog::new(&s.0, &s.1).unwrap().append(i);
                })
            })
            .collect();
        let log = canal_abi::evlog::EvLog::new(&shared.0, &shared.1).unwrap();
        let (mut a, mut b) = (0u64, 0u64);
        let mut seen_a = Vec::new();
        let _ = log.sweep(&mut a, |i| seen_a.push(i));
        for t in ts {
            t.join().unwrap();
        }
        let mut seen_b = Vec::new();
        assert_eq!(
            log.sweep(&mut a, |i| seen_a.push(i)),
            canal_abi::evlog::Sweep::Done
        );
        assert_eq!(
            log.sweep(&mut b, |i| seen_b.push(i)),
            canal_abi::evlog::Sweep::Done
        );
        for seen in [&mut seen_a, &mut seen_b] {
            seen.sort_unstable();
            assert_eq!(seen, &vec![3, 5]);
        }
    });
}

/// The arming lock (libcanal sock/watch.rs): a thread closing a descriptor (shared
/// side) and a thread arming (exclusive side) never overlap, and a thread that holds
/// a shared side itself can still take the exclusive side (a dup2 onto stdout that
/// starts a bridge). The closer's "descriptor" is a cell loom checks for races.
#[test]
fn arm_lock_excludes_closers_and_lets_a_holder_arm() {
    use canal_abi::armlock::ArmLock;
    loom::model(|| {
        let lock = Arc::new(ArmLock::new());
        let fd = Arc::new(UnsafeCell::new(0u32));
        let (l2, f2) = (lock.clone(), fd.clone());
        let closer = thread::spawn(move || {
            while !l2.try_shared() {
                thread::yield_now();
            }
            // SAFETY: loom reports an access that races with the arming thread's.
            f2.with_mut(|p| unsafe { *p += 1 });
            l2.release_shared();
        });
        // This thread holds a shared side, then arms.
        while !lock.try_shared() {
            thread::yield_now();
        }
        while !lock.try_exclusive(1) {
            thread::yield_now();
        }
        // SAFETY: as above.
        fd.with_mut(|p| unsafe { *p += 10 });
        lock.release_exclusive();
        lock.release_shared();
        closer.join().unwrap();
        // SAFETY: both threads are done.
        assert_eq!(fd.with(|p| unsafe { *p }), 11);
        assert!(lock.try_exclusive(0), "the lock is free again");
    });
}

/// A socket created while its process becomes shared is armed exactly once: the
/// creator publishes it in the descriptor table, fences, and arms it itself if the
/// mode is no longer "marked"; the sharer stores the new mode and fences before it
/// reads the table and arms what it finds (without that fence loom finds neither
/// arming: a SeqCst store alone does not order the later table reads). Either may see the other, or both, never
/// neither; the claim (fetch_or of ARMED) lets only one of them arm.
#[test]
fn socket_created_while_sharing_is_armed_once() {
    const MARKED: u32 = 1;
    const ARMING: u32 = 2;
    loom::model(|| {
        let mode = Arc::new(AtomicU32::new(MARKED));
        let table = Arc::new(AtomicU32::new(0));
        let claimed = Arc::new(AtomicU32::new(0));
        let arms = Arc::new(AtomicU32::new(0));
        let arm = |claimed: &AtomicU32, arms: &AtomicU32| {
            if claimed.fetch_or(1, Ordering::AcqRel) == 0 {
                arms.fetch_add(1, Ordering::Relaxed);
            }
        };
        let (m2, t2, c2, a2) = (mode.clone(), table.clone(), claimed.clone(), arms.clone());
        let creator = thread::spawn(move || {
            t2.store(1, Ordering::Release);
            fence(Ordering::SeqCst);
            if m2.load(Ordering::Relaxed) != MARKED {
                arm(&c2, &a2);
            }
        });
        mode.store(ARMING, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if table.load(Ordering::Relaxed) == 1 {
            arm(&claimed, &arms);
        }
        creator.join().unwrap();
        assert_eq!(arms.load(Ordering::Relaxed), 1, "armed by exactly one side");
    });
}

/// A process's names slot (`canal_abi::names`): a reader looking while a writer
/// replaces one pair with another gets the old pair, the new one or a miss — never
/// words of both.
#[test]
fn names_slot_reader_never_sees_a_mixed_pair() {
    use canal_abi::names::NameSlot;
    names_model().check(|| {
        let slot = Arc::new(NameSlot::new());
        let (a, b) = (names_pair(1000), names_pair(2000));
        assert!(slot.store(7, &a));
        let w = {
            let s = slot.clone();
            thread::spawn(move || s.store(7, &b))
        };
        if let Some(got) = slot.load(7) {
            assert!(got == a || got == b, "a mixed pair was read");
        }
        assert!(w.join().unwrap(), "a lone writer always gets in");
        assert_eq!(slot.load(7), Some(b));
        slot.forget(7);
        assert_eq!(slot.load(7), None);
    });
}

/// Two writers of one slot: one may give up, and what stays is one writer's whole
/// pair (the second writer's Acquire entry orders its words after the first's).
#[test]
fn names_slot_two_writers_leave_one_whole_pair() {
    use canal_abi::names::NameSlot;
    names_model().check(|| {
        let slot = Arc::new(NameSlot::new());
        let (a, b) = (names_pair(1000), names_pair(2000));
        let w = {
            let s = slot.clone();
            thread::spawn(move || s.store(7, &a))
        };
        let mine = slot.store(7, &b);
        let theirs = w.join().unwrap();
        assert!(mine || theirs, "one writer always gets in");
        let last = slot.load(7).expect("stable after both writers left");
        assert!(last == a || last == b, "a mixed pair was left");
    });
}

/// Eight words per pair make the unbounded model take minutes; a mixed pair needs
/// only one preemption (a thread stopped between two words), so two suffice.
fn names_model() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b
}

fn names_pair(port: u16) -> [u8; canal_abi::names::NAMES_SIZE] {
    use canal_abi::addr::CanalAddr;
    canal_abi::names::encode(
        &CanalAddr::v4([127, 0, 0, 1], port),
        &CanalAddr::v4([127, 0, 0, 2], port),
    )
}

/// Room rule (§8.4, minor 16): a waiter with its ring full raises `room_wanted`, fences
/// and reads the tail again before it sleeps; the consumer, after its tail store and
/// fence, bumps `wake_seq` (FUTEX_WAKE) only if it finds a sleeper and takes the word
/// from 1 to 0. Two waiters race one consume: none may sleep on a never-bumped value.
#[test]
fn room_rule_wakes_every_waiter_for_room() {
    type Words = (AtomicU32, AtomicU32, AtomicU32); // room_wanted, sleepers, wake_seq
    bounded().check(|| {
        let r = ring4();
        assert_eq!(r.producer().push(&[1, 2, 3, 4]).unwrap(), 4);
        let w: Arc<Words> = Arc::new(Default::default());
        let (rc, wc) = (r.clone(), w.clone());
        let c = thread::spawn(move || {
            assert_eq!(rc.consumer().pop(&mut [0u8; 1]).unwrap(), 1);
            fence(Ordering::SeqCst);
            // As `Rings::notify`: the sleeper count first, then the word.
            if wc.1.load(Ordering::Relaxed) != 0
                && wc.0.load(Ordering::Relaxed) != 0
                && wc.0.swap(0, Ordering::AcqRel) != 0
            {
                wc.2.fetch_add(1, Ordering::SeqCst);
            }
        });
        let waiter = || {
            let (r, w) = (r.clone(), w.clone());
            thread::spawn(move || {
                // Head 4 on a 4-byte ring: the free room is the tail.
                let room = || r.tail.load(Ordering::Acquire) > 0;
                w.1.fetch_add(1, Ordering::Relaxed);
                let seq = w.2.load(Ordering::Relaxed);
                fence(Ordering::SeqCst);
                if room() {
                    return None;
                }
                w.0.store(1, Ordering::Release);
                fence(Ordering::SeqCst);
                (!room()).then_some(seq) // would FUTEX_WAIT on `seq`
            })
        };
        let (w1, w2) = (waiter(), waiter());
        c.join().unwrap();
        let now = w.2.load(Ordering::Relaxed);
        for seq in [w1.join().unwrap(), w2.join().unwrap()]
            .into_iter()
            .flatten()
        {
            assert_ne!(seq, now, "a waiter for room sleeps and is never woken");
        }
    });
}
