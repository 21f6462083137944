//! Hostile guests: one scribbles random bytes over its whole region and floods its
//! doorbell; another keeps the queue protocol but sends garbage requests, garbage ring
//! indices and records, and floods attention bits and its control socket. Meanwhile an
//! honest guest moves 64 MiB out and 16 MiB in through canald to native peers. canald
//! must stay up, the honest transfers must arrive intact, and STAT must still answer.

mod common;
use canal_abi::control::kind;
use canal_abi::ring::{record_kind, Producer};
use canal_abi::sync::Ordering;
use canal_abi::{op, slot_state, sock_flag, sock_kind, CanalAddr};
use common::*;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const HOSTILE_FOR: Duration = Duration::from_secs(2);

fn scribbler(path: std::path::PathBuf, stop: Arc<AtomicBool>) -> u64 {
    let g = TestGuest::attach(&path, "scribbler");
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let t0 = Instant::now();
    let mut rounds = 0;
    while t0.elapsed() < HOSTILE_FOR && !stop.load(Ordering::Relaxed) {
        g.map.scribble(|| rng.next());
        // Kick whatever the header says; also ring the doorbell unconditionally.
        let _ = canald::sys::eventfd_write(g.doorbell.as_raw_fd());
        rounds += 1;
    }
    rounds
}

fn garbage_requests(
    path: std::path::PathBuf,
    target_port: u16,
    stop: Arc<AtomicBool>,
    broken_seen: Arc<AtomicU64>,
) -> u64 {
    let mut g = TestGuest::attach(&path, "garbler");
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let slots = g.region.layout().slot_count.min(32);
    let sockets = g.region.layout().socket_count;
    // Claim some extra slots to fire many requests at once.
    for i in 0..slots {
        let _ = g.region.slot(i).unwrap().state.compare_exchange(
            slot_state::FREE,
            slot_state::IDLE,
            Ordering::Acquire,
            Ordering::Relaxed,
        );
    }
    garbage_on_control_socket(&g);

    let q =
        canal_abi::queue::QueueProducer::new(g.region.queue_cells(), &g.region.header().queue_tail);
    let t0 = Instant::now();
    let mut sent = 0u64;
    let addrs = [
        localhost(target_port),
        localhost(0),
        CanalAddr::v4([127, 0, 0, 1], 1),
        CanalAddr::v4([192, 0, 2, 1], 80), // not loopback: refused by policy
    ];
    while t0.elapsed() < HOSTILE_FOR && !stop.load(Ordering::Relaxed) {
        for j in 0..slots {
            let s = g.region.slot(j).unwrap();
            let opc = match rng.below(10) {
                0..=2 => op::SOCKET,
                3 => op::CONNECT,
                4 => op::CLOSE,
                5 => op::BIND,
                6 => op::LISTEN,
                7 => op::SETSOCKOPT,
                8 => op::GETSOCKOPT,
                _ => rng.below(16) as u32,
            };
            // Handles: mostly live-looking (index + current generation), some random.
            let idx = rng.below(8) as u32;
            let gen = g
                .region
                .socket(idx)
                .unwrap()
                .generation
                .load(Ordering::Relaxed);
            let handle = if rng.below(4) == 0 {
                rng.next() as u32
            } else {
                canal_abi::make_handle(idx, gen)
            };
            s.op.store(opc, Ordering::Relaxed);
            s.socket.store(handle, Ordering::Relaxed);
            s.args[0].store(
                match opc {
                    op::SOCKET => [2, 10, rng.next()][rng.below(3) as usize],
                    _ => rng.below(300),
                },
                Ordering::Relaxed,
            );
            s.args[1].store(
                if rng.below(2) == 0 {
                    1 + rng.below(2)
                } else {
                    rng.next()
                },
                Ordering::Relaxed,
            );
            s.args[2].store(rng.below(500), Ordering::Relaxed);
            let a = addrs[rng.below(addrs.len() as u64) as usize].encode();
            s.write_payload(0, &a);
            let junk: Vec<u8> = (0..rng.below(64)).map(|_| rng.next() as u8).collect();
            s.write_payload(32, &junk);
            s.in_len.store(
                [32, 4, rng.below(400) as u32, rng.next() as u32][rng.below(4) as usize],
                Ordering::Relaxed,
            );
            s.state.store(slot_state::REQUESTED, Ordering::Release);
            let _ = q.push(if rng.below(20) == 0 {
                rng.next() as u32
            } else {
                j
            });
            sent += 1;
        }
        garbage_in_rings(&g, &mut rng, sockets, target_port, &broken_seen);
        for w in g.region.attention() {
            w.store(u64::MAX, Ordering::Release);
        }
        g.kick();
        std::thread::sleep(Duration::from_micros(200));
    }
    // A final honest request from a fresh slot: canald still serves this guest.
    let fresh = slots + 1;
    let st = &g.region.slot(fresh).unwrap().state;
    st.store(slot_state::IDLE, Ordering::Release);
    g.slot = fresh;
    assert_eq!(g.request(op::NOP, 0, [0; 4], &[]).0, 0);
    sent
}

/// Garbage on the control socket: bad headers, bad PORT, a pipe as "eventfd", a short
/// message, a second HELLO. Each is refused with ERROR.
fn garbage_on_control_socket(g: &TestGuest) {
    send_ctl(&g.ctl, 99, b"junk", &[]);
    let _ = recv_ctl(&g.ctl);
    send_ctl(
        &g.ctl,
        kind::PORT,
        &u32::MAX.to_le_bytes(),
        &[g.port.as_raw_fd()],
    );
    assert_eq!(recv_ctl(&g.ctl).0, kind::ERROR);
    let (pr, _pw) = std::os::unix::net::UnixStream::pair().unwrap();
    send_ctl(&g.ctl, kind::PORT, &1u32.to_le_bytes(), &[pr.as_raw_fd()]);
    assert_eq!(
        recv_ctl(&g.ctl).0,
        kind::ERROR,
        "a non-eventfd port is refused"
    );
    canald::sys::send_with_fds(&g.ctl, b"short", &[], false).unwrap();
    assert_eq!(recv_ctl(&g.ctl).0, kind::ERROR);
    send_ctl(&g.ctl, kind::HELLO, &[0u8; 24], &[]);
    assert_eq!(recv_ctl(&g.ctl).0, kind::ERROR, "second HELLO refused");
}

/// Ring garbage on live entries: indices far ahead, backwards, or sane with random
/// bytes (which then go to the native listener), and random records.
fn garbage_in_rings(
    g: &TestGuest,
    rng: &mut Rng,
    sockets: u32,
    target_port: u16,
    broken_seen: &AtomicU64,
) {
    for i in 0..sockets.min(64) {
        let e = g.region.socket(i).unwrap();
        let k = e.kind.load(Ordering::Acquire);
        if k == sock_kind::FREE {
            continue;
        }
        if e.flags.load(Ordering::Relaxed) & sock_flag::BROKEN != 0 {
            broken_seen.fetch_add(1, Ordering::Relaxed);
        }
        match rng.below(6) {
            0 => e.tx_head.store(rng.next(), Ordering::Release),
            1 => e.rx_tail.store(rng.next(), Ordering::Release),
            2 => {
                let h = e.tx_head.load(Ordering::Relaxed);
                e.tx_head
                    .store(h.wrapping_sub(1 + rng.below(100)), Ordering::Release);
            }
            _ => {
                let ring = g.region.ring(
                    e.tx_offset.load(Ordering::Relaxed),
                    e.tx_size.load(Ordering::Relaxed) as u64,
                );
                if let Some(ring) = ring {
                    let mut p = Producer {
                        storage: &ring,
                        head_shared: &e.tx_head,
                        tail_shared: &e.tx_tail,
                        head: e.tx_head.load(Ordering::Relaxed),
                    };
                    let bytes: Vec<u8> = (0..rng.below(3000)).map(|_| rng.next() as u8).collect();
                    if k == sock_kind::DGRAM && rng.below(2) == 0 {
                        let a = localhost(target_port).encode();
                        let kindv =
                            [record_kind::DATAGRAM, record_kind::ACCEPT, 77][rng.below(3) as usize];
                        let _ = p.push_record(kindv, &a[..rng.below(33) as usize], &[&bytes]);
                    } else {
                        let _ = p.push(&bytes);
                    }
                }
            }
        }
    }
}

#[test]
fn hostile_guests_cannot_hurt_canald_or_honest_guest() {
    let mut d = TestDaemon::start(&["--data-mib", "16", "--loopback-only"]);
    // Sink for whatever the garbler connects to and sends.
    let sink = TcpListener::bind("127.0.0.1:0").unwrap();
    let sink_port = sink.local_addr().unwrap().port();
    sink.set_nonblocking(true).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let sink_thread = std::thread::spawn(move || {
        let mut conns = Vec::new();
        let mut buf = vec![0u8; 65536];
        while !stop2.load(Ordering::Relaxed) {
            while let Ok((c, _)) = sink.accept() {
                c.set_nonblocking(true).unwrap();
                conns.push(c);
            }
            conns.retain_mut(|c| !matches!(c.read(&mut buf), Ok(0)));
            std::thread::sleep(Duration::from_millis(1));
        }
    });

    let broken = Arc::new(AtomicU64::new(0));
    let (p1, s1) = (d.path.clone(), stop.clone());
    let scrib = std::thread::spawn(move || scribbler(p1, s1));
    let (p2, s2, b2) = (d.path.clone(), stop.clone(), broken.clone());
    let garb = std::thread::spawn(move || garbage_requests(p2, sink_port, s2, b2));

    // The honest guest: 64 MiB out, 16 MiB in, hashed.
    let t0 = Instant::now();
    let mut g = TestGuest::attach(&d.path, "honest");
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = g.socket(AF_INET, STREAM);
    let r = g.connect(h, &localhost(port));
    assert!(r == 0 || r == EINPROGRESS);
    let (mut peer, _) = l.accept().unwrap();
    peer.set_read_timeout(Some(T)).unwrap();
    g.wait_flags(h, sock_flag::CONNECTED);
    const OUT: usize = 64 << 20;
    const IN: usize = 16 << 20;
    let mut peer_w = peer.try_clone().unwrap();
    let reader = std::thread::spawn(move || {
        let mut hsh = FNV0;
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0;
        loop {
            let k = peer.read(&mut buf).unwrap();
            if k == 0 {
                break;
            }
            fnv(&mut hsh, &buf[..k]);
            n += k;
        }
        (hsh, n)
    });
    let writer = std::thread::spawn(move || {
        let chunk = pattern(3, 1 << 20);
        for _ in 0..IN / chunk.len() {
            peer_w.write_all(&chunk).unwrap();
        }
    });
    let chunk = pattern(5, 1 << 20);
    let mut want_out = FNV0;
    let mut got_in = FNV0;
    let mut rx_n = 0;
    let mut rbuf = vec![0u8; 1 << 20];
    // At least 64 MiB, and on until both hostile guests are done.
    let mut sent_out = 0;
    while sent_out < OUT || !(scrib.is_finished() && garb.is_finished()) {
        sent_out += chunk.len();
        fnv(&mut want_out, &chunk);
        let mut rest = &chunk[..];
        while !rest.is_empty() {
            let n = g.send_some(h, rest);
            rest = &rest[n..];
            let k = g.recv_some(h, &mut rbuf);
            fnv(&mut got_in, &rbuf[..k]);
            rx_n += k;
            if n == 0 && k == 0 {
                assert!(
                    t0.elapsed() < Duration::from_secs(60),
                    "honest transfer stalled"
                );
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
    let rest = g.recv_exact(h, IN - rx_n);
    fnv(&mut got_in, &rest);
    writer.join().unwrap();
    assert_eq!(g.request(op::SHUTDOWN, h, [1, 0, 0, 0], &[]).0, 0);
    let (hash_out, n_out) = reader.join().unwrap();
    assert_eq!(n_out, sent_out, "bytes out");
    assert_eq!(
        hash_out,
        want_out,
        "{} MiB out: hash differs",
        sent_out >> 20
    );
    let mut want_in = FNV0;
    let c = pattern(3, 1 << 20);
    for _ in 0..IN / c.len() {
        fnv(&mut want_in, &c);
    }
    assert_eq!(got_in, want_in, "16 MiB in: hash differs");
    eprintln!(
        "honest transfer: {} MiB out, {} MiB in, {:?}",
        sent_out >> 20,
        IN >> 20,
        t0.elapsed()
    );

    let rounds = scrib.join().unwrap();
    let reqs = garb.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    sink_thread.join().unwrap();
    eprintln!(
        "scribbler rounds {rounds}, garbage requests {reqs}, BROKEN sightings {}",
        broken.load(Ordering::Relaxed)
    );
    assert!(rounds > 0 && reqs > 0);
    assert!(
        broken.load(Ordering::Relaxed) > 0,
        "ring corruption should have broken some sockets"
    );
    assert!(d.alive(), "canald died");
    let s = d.stat();
    assert!(s.contains("\"comm\":\"honest\""), "{s}");
    assert!(s.contains(&format!(
        "\"handle\":{h},\"kind\":\"tcp\",\"state\":\"connected\""
    )));
    // The honest guest still gets requests served.
    assert_eq!(g.request(op::NOP, 0, [0; 4], &[]).0, 0);
}

/// WATCH carries a descriptor of the guest's choosing. Whatever it is — a pipe with
/// bytes in it, an eventfd with a count, a regular file — canald must stay responsive
/// and leave the socket alone; a socket pair's end with bytes in it reads as bytes
/// written outside the hooks, and its hang-up as the last close: both act on that one
/// socket only (the guest's own, its own choice), never on another.
#[test]
fn hostile_watch_descriptors_touch_only_their_own_socket() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "watcher");
    let (h, mut peer) = connected_pair(&mut g);
    let (other, mut other_peer) = connected_pair(&mut g);
    /// A pipe's (read, write) ends.
    fn pipe() -> (std::fs::File, std::fs::File) {
        use std::os::fd::FromRawFd;
        let mut fds = [0i32; 2];
        // SAFETY: pipe writes two descriptors into the array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors, owned by the caller from here on.
        unsafe {
            (
                std::fs::File::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        }
    }
    let (pr, pw) = pipe();
    // SAFETY: eventfd makes a fresh descriptor, owned by the test from here on.
    let efd = unsafe {
        use std::os::fd::FromRawFd;
        std::fs::File::from_raw_fd(libc::eventfd(5, libc::EFD_CLOEXEC))
    };
    (&pw).write_all(b"not a hang-up").unwrap();
    let file = std::fs::File::open("/dev/null").unwrap();
    fn watch(g: &mut TestGuest, fd: i32, h: u32) {
        send_ctl(&g.ctl, kind::WATCH, &h.to_le_bytes(), &[fd]);
        // No reply to WATCH; a request after it is served after it.
        assert_eq!(g.request(op::NOP, 0, [0; 4], &[]).0, 0, "canald answers");
    }
    for fd in [pr.as_raw_fd(), efd.as_raw_fd(), file.as_raw_fd()] {
        watch(&mut g, fd, h);
    }
    std::thread::sleep(Duration::from_millis(200));
    echoes_both_ways(&g, h, &mut peer);
    assert_eq!(g.flags(h) & (sock_flag::ERROR | sock_flag::BROKEN), 0);
    // A socket pair's end with bytes waiting: an unseen send, so that socket's
    // connection is reset (the peer never takes a stream with a hole as whole).
    let (sa, sb) = std::os::unix::net::UnixStream::pair().unwrap();
    (&sb).write_all(b"bytes the hooks never saw").unwrap();
    watch(&mut g, sa.as_raw_fd(), h);
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut rest = Vec::new();
    let r = peer.read_to_end(&mut rest);
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "{r:?}"
    );
    g.wait_flags(h, sock_flag::BROKEN | sock_flag::ERROR);
    // The guest's other connection is untouched.
    g.send_all(other, b"other");
    let mut got = [0u8; 5];
    other_peer.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"other");
    // A pipe's write end closed: the hang-up of the watched descriptor, which closes
    // the socket as the guest's last close would; the native peer reads EOF.
    let (r2, w2) = pipe();
    watch(&mut g, r2.as_raw_fd(), other);
    drop(r2);
    drop(w2);
    other_peer
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut rest = Vec::new();
    other_peer.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
    assert!(
        d.stat().contains("watcher"),
        "canald still serves the guest"
    );
    drop((pw, efd, file, sb));
}
