//! Integration tests: a real canald subprocess on a private socket, and test guests
//! written directly against canal-abi talking to native peers on 127.0.0.1.

mod common;
use canal_abi::ring::record_kind;
use canal_abi::sync::Ordering;
use canal_abi::{errno, op, sock_flag, sock_kind, CanalAddr};
use common::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

#[test]
fn tcp_connect_send_recv_both_ways() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "tcp-test");
    let (h, mut peer) = connected_pair(&mut g);
    assert_eq!(g.entry(h).kind.load(Ordering::Relaxed), sock_kind::STREAM);

    // getsockname / getpeername agree with the native side.
    let (r, out) = g.request(op::GETSOCKNAME, h, [0; 4], &[]);
    assert_eq!(r, 0);
    let local = CanalAddr::decode(&out).unwrap();
    assert_eq!(local.port, peer.peer_addr().unwrap().port());
    let (r, out) = g.request(op::GETPEERNAME, h, [0; 4], &[]);
    assert_eq!(r, 0);
    assert_eq!(
        CanalAddr::decode(&out).unwrap().port,
        peer.local_addr().unwrap().port()
    );

    // guest → native: 4 MiB, more than the ring, checked byte for byte.
    let data = pattern(7, 4 << 20);
    let reader = std::thread::spawn(move || {
        let mut got = vec![0u8; 4 << 20];
        peer.read_exact(&mut got).unwrap();
        (peer, got)
    });
    g.send_all(h, &data);
    let (mut peer, got) = reader.join().unwrap();
    assert!(got == data, "guest→native bytes differ");

    // native → guest.
    let back = pattern(9, 3 << 20);
    let b2 = back.clone();
    let writer = std::thread::spawn(move || {
        peer.write_all(&b2).unwrap();
        peer
    });
    let got = g.recv_exact(h, back.len());
    assert!(got == back, "native→guest bytes differ");
    let mut peer = writer.join().unwrap();

    // EOF from the native side: RX_EOF after the data.
    peer.write_all(b"tail").unwrap();
    peer.shutdown(std::net::Shutdown::Write).unwrap();
    let got = g.recv_exact(h, 100);
    assert_eq!(got, b"tail");
    assert_ne!(g.flags(h) & sock_flag::RX_EOF, 0);

    // SHUT_WR from the guest: the native side reads EOF after the queued bytes.
    g.send_all(h, b"bye");
    assert_eq!(g.request(op::SHUTDOWN, h, [1, 0, 0, 0], &[]).0, 0);
    let mut rest = Vec::new();
    peer.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"bye");
    let f = g.wait_flags(h, sock_flag::TX_CLOSED);
    assert_ne!(f & sock_flag::HUP, 0, "both directions over: HUP");

    // Stats count the bytes.
    let s = d.stat();
    assert!(s.contains("\"tx_bytes\":4194307"), "{s}");
    assert!(s.contains("\"rx_bytes\":3145732"), "{s}");

    // CLOSE frees the entry and bumps the generation.
    assert_eq!(g.request(op::CLOSE, h, [0; 4], &[]).0, 0);
    let e = g.entry(h);
    g.wait_until("entry freed", || {
        e.kind.load(Ordering::Acquire) == sock_kind::FREE
    });
    assert_ne!(e.generation.load(Ordering::Relaxed), h >> 16);
    assert_eq!(
        g.request(op::CLOSE, h, [0; 4], &[]).0,
        -(errno::EBADF as i64)
    );
}

#[test]
fn listen_and_accept_records() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "srv");
    let l = g.socket(AF_INET, STREAM);
    let one = 1u32.to_ne_bytes();
    let (r, _) = g.request(
        op::SETSOCKOPT,
        l,
        [libc::SOL_SOCKET as u64, libc::SO_REUSEADDR as u64, 0, 0],
        &one,
    );
    assert_eq!(r, 0);
    assert_eq!(g.request(op::BIND, l, [0; 4], &localhost(0).encode()).0, 0);
    assert_eq!(g.request(op::LISTEN, l, [16, 0, 0, 0], &[]).0, 0);
    assert_eq!(g.entry(l).kind.load(Ordering::Relaxed), sock_kind::LISTENER);
    assert_ne!(g.flags(l) & sock_flag::LISTENING, 0);
    let (_, out) = g.request(op::GETSOCKNAME, l, [0; 4], &[]);
    let port = CanalAddr::decode(&out).unwrap().port;
    assert_ne!(port, 0);

    let mut clients = Vec::new();
    for i in 0..3u8 {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_read_timeout(Some(T)).unwrap();
        c.write_all(&[i; 10]).unwrap();
        clients.push(c);
    }
    for c in clients.iter_mut() {
        let (kind, addr, payload) = g.wait_record(l);
        assert_eq!(kind, record_kind::ACCEPT);
        assert_eq!(payload.len(), 8);
        let h = u32::from_le_bytes(payload[..4].try_into().unwrap());
        // Records come in accept order; the peer is the client.
        assert_eq!(addr.port, c.local_addr().unwrap().port());
        assert_eq!(addr.ip4(), [127, 0, 0, 1]);
        assert_ne!(g.flags(h) & sock_flag::CONNECTED, 0);
        // A connected stream's names are final: both come in one answer (§4 Names).
        let (r, names) = g.request(op::GETPEERNAME, h, [0; 4], &[]);
        assert_eq!((r, names.len()), (0, canal_abi::names::NAMES_SIZE));
        let (peer, local) = (
            CanalAddr::decode(&names[..32]).unwrap(),
            CanalAddr::decode(&names[32..]).unwrap(),
        );
        assert_eq!(peer.port, c.local_addr().unwrap().port());
        assert_eq!(local.port, port);
        let got = g.recv_exact(h, 10);
        assert_eq!(got.len(), 10);
        g.send_all(h, &got);
        let mut echo = [0u8; 10];
        c.read_exact(&mut echo).unwrap();
        assert_eq!(&echo[..], &got[..]);
    }
    let s = d.stat();
    assert!(
        s.contains("\"kind\":\"tcp-listener\",\"state\":\"listening\""),
        "{s}"
    );
    assert_eq!(
        s.matches("\"kind\":\"tcp\",\"state\":\"connected\"")
            .count(),
        3,
        "{s}"
    );
}

/// Feature HOST_QUEUED (protocol §5 Accept, minor 20): before an accept asks, canald
/// takes no client off the host listener (the kernel's queue is the only one) and only
/// says that the kernel holds some; the guest's attention with the flag set starts the
/// listener, every client then comes as a record in the kernel's order, and the flag
/// goes once canald finds the kernel's queue empty.
#[test]
fn host_queued_leaves_clients_to_the_kernel_until_an_accept_asks() {
    let d = TestDaemon::start(&[]);
    let flag = canal_abi::control::hello_flag::HOST_QUEUED;
    let mut g = TestGuest::attach_with(&d.path, "srv", flag);
    let features = g.region.header().features;
    assert_ne!(features & canal_abi::feature::HOST_QUEUED, 0);
    let (l, port) = tcp_listener(&mut g);
    let clients: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    g.wait_flags(l, sock_flag::HOST_QUEUED);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(g.rx_queued(l), 0, "taken ahead before an accept asked");
    assert_ne!(g.flags(l) & sock_flag::HOST_QUEUED, 0);
    g.attention(l);
    for c in &clients {
        let (kind, addr, _) = g.wait_record(l);
        assert_eq!(kind, record_kind::ACCEPT);
        assert_eq!(
            addr.port,
            c.local_addr().unwrap().port(),
            "the kernel's order"
        );
    }
    g.wait_until("HOST_QUEUED cleared", || {
        g.flags(l) & sock_flag::HOST_QUEUED == 0
    });
}

#[test]
fn udp_records_both_ways() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "udp");
    let h = g.socket(AF_INET, DGRAM);
    assert_eq!(g.request(op::BIND, h, [0; 4], &localhost(0).encode()).0, 0);
    let (_, out) = g.request(op::GETSOCKNAME, h, [0; 4], &[]);
    let gport = CanalAddr::decode(&out).unwrap().port;

    let native = UdpSocket::bind("127.0.0.1:0").unwrap();
    native.set_read_timeout(Some(T)).unwrap();
    let nport = native.local_addr().unwrap().port();

    for i in 0..20u8 {
        let msg = vec![i; 100 + i as usize * 50];
        assert!(g.send_dgram(h, Some(&localhost(nport)), &msg));
        let mut buf = [0u8; 4096];
        let (n, from) = native.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], &msg[..], "datagram {i} boundary/content");
        assert_eq!(from.port(), gport);
    }
    for i in 0..20u8 {
        let msg = vec![i ^ 0x55; 1 + i as usize * 700];
        native.send_to(&msg, ("127.0.0.1", gport)).unwrap();
        let (kind, src, payload) = g.wait_record(h);
        assert_eq!(kind, record_kind::DATAGRAM);
        assert_eq!(src.port, nport);
        assert_eq!(payload, msg);
    }
    // Connected UDP: records without an address go to the peer.
    assert_eq!(g.connect(h, &localhost(nport)), 0);
    assert_ne!(g.flags(h) & sock_flag::CONNECTED, 0);
    assert!(g.send_dgram(h, None, b"connected"));
    let mut buf = [0u8; 64];
    let (n, _) = native.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"connected");
    assert!(d
        .stat()
        .contains("\"kind\":\"udp\",\"state\":\"connected\""));
}

#[test]
fn connection_refused() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "refused");
    // A port nobody listens on and nobody else can take: bound, not listening.
    let holder = g.socket(AF_INET, STREAM);
    assert_eq!(
        g.request(op::BIND, holder, [0; 4], &localhost(0).encode())
            .0,
        0
    );
    let (_, out) = g.request(op::GETSOCKNAME, holder, [0; 4], &[]);
    let port = CanalAddr::decode(&out).unwrap().port;
    let h = g.socket(AF_INET, STREAM);
    let r = g.connect(h, &localhost(port));
    if r == EINPROGRESS {
        let f = g.wait_flags(h, sock_flag::ERROR | sock_flag::CONNECTED);
        assert_ne!(f & sock_flag::ERROR, 0);
        assert_ne!(f & sock_flag::HUP, 0);
        assert_eq!(f & (sock_flag::CONNECTING | sock_flag::CONNECTED), 0);
        assert_eq!(
            g.entry(h).pending_error.load(Ordering::Relaxed),
            errno::ECONNREFUSED as u32
        );
    } else {
        assert_eq!(r, -(errno::ECONNREFUSED as i64));
    }
}

#[test]
fn request_errors() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "errs");
    let ebadf = -(errno::EBADF as i64);
    assert_eq!(g.request(op::NOP, 0, [0; 4], &[]).0, 0);
    assert_eq!(g.request(99, 0, [0; 4], &[]).0, -(errno::ENOSYS as i64));
    assert_eq!(g.request(op::CLOSE, 12345, [0; 4], &[]).0, ebadf);
    let h = g.socket(AF_INET, STREAM);
    // Wrong generation, index out of range.
    assert_eq!(
        g.request(op::LISTEN, h ^ (1 << 16), [1, 0, 0, 0], &[]).0,
        ebadf
    );
    assert_eq!(g.request(op::LISTEN, 0xffff, [1, 0, 0, 0], &[]).0, ebadf);
    // Bad address and lengths.
    assert_eq!(
        g.request(op::BIND, h, [0; 4], &[1, 2, 3]).0,
        -(errno::EINVAL as i64)
    );
    // Options: the documented refusals (sockopt.rs), round trip.
    let (r, _) = g.request(
        op::SETSOCKOPT,
        h,
        [libc::SOL_SOCKET as u64, libc::SO_BINDTODEVICE as u64, 0, 0],
        b"lo\0",
    );
    assert_eq!(r, -(libc::EPERM as i64));
    let (r, _) = g.request(
        op::SETSOCKOPT,
        h,
        [
            libc::SOL_SOCKET as u64,
            26, /* SO_ATTACH_FILTER */
            0,
            0,
        ],
        &[0u8; 16],
    );
    assert_eq!(r, -(errno::ENOPROTOOPT as i64));
    // Reading SO_BINDTODEVICE is harmless (sshd does): the kernel's answer, empty.
    let (r, out) = g.request(
        op::GETSOCKOPT,
        h,
        [libc::SOL_SOCKET as u64, libc::SO_BINDTODEVICE as u64, 16, 0],
        &[],
    );
    assert_eq!((r, out.len()), (0, 0));
    let one = 1i32.to_ne_bytes();
    let nodelay = [libc::IPPROTO_TCP as u64, libc::TCP_NODELAY as u64, 4, 0];
    assert_eq!(g.request(op::SETSOCKOPT, h, nodelay, &one).0, 0);
    let (r, out) = g.request(op::GETSOCKOPT, h, nodelay, &[]);
    assert_eq!(r, 0);
    assert_eq!(out, one);
    let (r, out) = g.request(
        op::GETSOCKOPT,
        h,
        [libc::SOL_SOCKET as u64, libc::SO_TYPE as u64, 4, 0],
        &[],
    );
    assert_eq!((r, out), (0, (libc::SOCK_STREAM).to_ne_bytes().to_vec()));
    // Kernel errors come back as the native errno.
    assert_eq!(
        g.request(op::SHUTDOWN, h, [1, 0, 0, 0], &[]).0,
        -(errno::ENOTCONN as i64)
    );
    let (r, _) = g.request(op::GETPEERNAME, h, [0; 4], &[]);
    assert_eq!(r, -(errno::ENOTCONN as i64));
    // Unsupported families/types.
    let (r, _) = g.request(op::SOCKET, 0, [1, 1, 0, 0], &[]);
    assert_eq!(r, -(errno::EAFNOSUPPORT as i64));
    // Caps: the socket table fills up with EMFILE.
    drop(g);
    let d2 = TestDaemon::start(&["--sockets", "4", "--data-mib", "4"]);
    let mut g = TestGuest::attach(&d2.path, "caps");
    for _ in 0..4 {
        g.socket(AF_INET, DGRAM);
    }
    let (r, _) = g.request(op::SOCKET, 0, [2, 2, 0, 0], &[]);
    assert_eq!(r, -(errno::EMFILE as i64));
    drop(d);
}

#[test]
fn data_area_bounds_buffers() {
    // The area holds the smallest rings for every entry of the quota, so the quota's
    // last socket still gets rings: the table fills (EMFILE), never the area.
    let d = TestDaemon::start(&["--data-mib", "1", "--ring-kib", "64", "--sockets", "40"]);
    let mut g = TestGuest::attach(&d.path, "bufcap");
    for _ in 0..40 {
        g.socket(AF_INET, STREAM);
    }
    let (r, _) = g.request(op::SOCKET, 0, [2, 1, 0, 0], &[]);
    assert_eq!(r, -(errno::EMFILE as i64));
    // A ring size the data area cannot hold twice is refused at start.
    let mut bad = std::process::Command::new(env!("CARGO_BIN_EXE_canald"))
        .args([
            "--socket",
            "/nonexistent/x.sock",
            "--data-mib",
            "1",
            "--ring-kib",
            "1024",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = bad.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(bad.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(
        !status.success() && err.contains("--ring-kib too large"),
        "{status}: {err}"
    );
}

/// Sockets get the configured ring size while the data area can still give every
/// other free table entry the smallest rings; later ones get smaller rings, so the
/// table fills (EMFILE) and the data area never refuses.
#[test]
fn rings_shrink_so_every_entry_fits() {
    let d = TestDaemon::start(&["--data-mib", "1", "--ring-kib", "256", "--sockets", "4"]);
    let mut g = TestGuest::attach(&d.path, "shrink");
    let sizes: Vec<u32> = (0..4)
        .map(|_| {
            let h = g.socket(AF_INET, STREAM);
            let e = g.region.socket(canal_abi::handle_index(h)).unwrap();
            let (tx, rx) = (
                e.tx_size.load(Ordering::Acquire),
                e.rx_size.load(Ordering::Acquire),
            );
            assert_eq!(tx, rx);
            tx
        })
        .collect();
    // 1 MiB pool + 4 × 128 KiB: 2×256 KiB twice (each leaving the smallest rings for
    // the entries still free), then 2×128 KiB twice.
    assert_eq!(sizes, [256 << 10, 256 << 10, 128 << 10, 128 << 10]);
    let (r, _) = g.request(op::SOCKET, 0, [2, 1, 0, 0], &[]);
    assert_eq!(r, -(errno::EMFILE as i64));
    // The default ring leaves room for four sockets in a small area.
    drop(g);
    let d2 = TestDaemon::start(&["--data-mib", "1", "--sockets", "4"]);
    let mut g = TestGuest::attach(&d2.path, "small");
    let h = g.socket(AF_INET, STREAM);
    let e = g.region.socket(canal_abi::handle_index(h)).unwrap();
    assert_eq!(e.tx_size.load(Ordering::Acquire), 128 << 10);
    drop(d);
}

#[test]
fn wakes_sleeping_guest_on_events() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "sleeper");
    let (h, mut peer) = connected_pair(&mut g);
    // canald goes to sleep when idle (§6: host_sleeping = 1).
    let t0 = Instant::now();
    while g.region.header().host_sleeping.load(Ordering::SeqCst) != 1 {
        assert!(t0.elapsed() < T, "canald never slept");
        std::thread::sleep(Duration::from_millis(1));
    }
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        peer.write_all(b"wake").unwrap();
        peer
    });
    let t0 = Instant::now();
    let fired = g.sleep_on_events(Some(h), 5000, || g.rx_queued(h) > 0);
    assert!(fired, "no wake-up within 5 s");
    assert!(t0.elapsed() < Duration::from_secs(4));
    assert_eq!(g.recv_exact(h, 4), b"wake");
    let _peer = writer.join().unwrap();
    // A request to a sleeping canald goes through the doorbell.
    let t0 = Instant::now();
    while g.region.header().host_sleeping.load(Ordering::SeqCst) != 1 {
        assert!(t0.elapsed() < T, "canald never slept");
        std::thread::sleep(Duration::from_millis(1));
    }
    let kicks = g.region.header().kicks.load(Ordering::Relaxed);
    assert_eq!(g.request(op::NOP, 0, [0; 4], &[]).0, 0);
    assert_eq!(g.region.header().kicks.load(Ordering::Relaxed), kicks + 1);
}

#[test]
fn tx_drain_is_an_event_only_after_a_full_ring() {
    // Protocol §6: draining a stream's tx ring is a readiness change (event_seq, and a
    // wake-up of its sleepers) only if the guest may have found the ring full.
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "drain");
    let (h, mut peer) = connected_pair(&mut g);
    let seq = |g: &TestGuest| g.entry(h).event_seq.load(Ordering::SeqCst);
    let drained = |g: &TestGuest| {
        let e = g.entry(h);
        e.tx_tail.load(Ordering::SeqCst) == e.tx_head.load(Ordering::SeqCst)
    };
    // Let the connect's own change settle.
    g.wait_until("event_seq settled", || {
        let a = seq(&g);
        std::thread::sleep(Duration::from_millis(20));
        seq(&g) == a
    });
    let before = seq(&g);
    for i in 0..20u8 {
        g.send_all(h, &[i; 64]);
        let mut buf = [0u8; 64];
        peer.read_exact(&mut buf).unwrap();
        assert_eq!(buf, [i; 64]);
        g.wait_until("tx drained", || drained(&g));
    }
    assert_eq!(
        seq(&g),
        before,
        "a drain of a ring that never filled was an event"
    );
    // Fill the ring while the peer does not read, until canald cannot drain it.
    let chunk = vec![7u8; 64 << 10];
    let mut sent = 0usize;
    g.wait_until("tx ring full", || {
        sent += g.send_some(h, &chunk);
        let e = g.entry(h);
        let used = e.tx_head.load(Ordering::SeqCst) - e.tx_tail.load(Ordering::SeqCst);
        used == e.tx_size.load(Ordering::SeqCst) as u64
    });
    let full = seq(&g);
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0usize;
        while got < sent {
            got += peer.read(&mut buf).unwrap();
        }
        peer
    });
    g.wait_until("an event for the drain of the full ring", || {
        seq(&g) != full
    });
    let _peer = reader.join().unwrap();
}

#[test]
fn fin_before_connect_completes_still_reads_eof() {
    // The peer sends and closes before canald has seen the connect complete: the data
    // and then the EOF must both arrive (the HUP an unconnected socket reports is
    // not taken for a FIN, and a real FIN already pending is not lost).
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "earlyfin");
    for round in 0..5u8 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let h = g.socket(AF_INET, STREAM);
        let r = g.connect(h, &localhost(port));
        assert!(r == 0 || r == EINPROGRESS, "connect: {r}");
        let (mut peer, _) = l.accept().unwrap();
        peer.write_all(&[round; 3]).unwrap();
        drop(peer);
        let f = g.wait_flags(h, sock_flag::RX_EOF | sock_flag::ERROR);
        assert_eq!(f & sock_flag::ERROR, 0, "flags {f:#x}");
        assert_eq!(g.recv_exact(h, 3), [round; 3]);
        // A second exchange on a connection that stays open: one reply, read once.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let h2 = g.socket(AF_INET, STREAM);
        let r = g.connect(h2, &localhost(port));
        assert!(r == 0 || r == EINPROGRESS, "connect: {r}");
        let (mut peer, _) = l.accept().unwrap();
        g.wait_flags(h2, sock_flag::CONNECTED);
        peer.write_all(b"reply").unwrap();
        assert_eq!(g.recv_exact(h2, 5), b"reply");
        drop(peer);
        let f = g.wait_flags(h2, sock_flag::RX_EOF | sock_flag::ERROR);
        assert_eq!(f & sock_flag::ERROR, 0, "flags {f:#x}");
    }
}

#[test]
fn stat_lists_guest_and_sockets() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "statguest");
    let (h, peer) = connected_pair(&mut g);
    let s = d.stat();
    assert!(s.starts_with("{\"daemon\":{\"pid\":"), "{s}");
    assert!(s.contains(&format!("\"pid\":{}", d.child.id())), "{s}");
    assert!(
        s.contains(&format!("\"socket\":\"{}\"", d.path.display())),
        "{s}"
    );
    assert!(
        s.contains(&format!(
            "\"id\":{},\"pid\":{},\"comm\":\"statguest\"",
            g.id,
            std::process::id()
        )),
        "{s}"
    );
    assert!(s.contains(&format!(
        "\"handle\":{h},\"kind\":\"tcp\",\"state\":\"connected\""
    )));
    assert!(
        s.contains(&format!("\"peer\":\"{}\"", peer.local_addr().unwrap())),
        "{s}"
    );
    assert!(
        s.contains(&format!("\"local\":\"{}\"", peer.peer_addr().unwrap())),
        "{s}"
    );
    let t = canald::fetch_stat(&d.path, true).unwrap();
    assert!(t.contains("statguest") && t.contains("connected"), "{t}");
}

#[test]
fn close_drains_queued_bytes_first() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "closer");
    let (h, mut peer) = connected_pair(&mut g);
    let data = pattern(11, 200 * 1024);
    // Queue without letting canald's socket drain first (the peer is not reading).
    g.send_all(h, &data);
    assert_eq!(g.request(op::CLOSE, h, [0; 4], &[]).0, 0);
    let mut got = Vec::new();
    peer.read_to_end(&mut got).unwrap();
    assert!(
        got == data,
        "close lost or garbled queued bytes ({} of {})",
        got.len(),
        data.len()
    );
    let e = g.entry(h);
    g.wait_until("entry freed", || {
        e.kind.load(Ordering::Acquire) == sock_kind::FREE
    });
}

#[test]
fn peer_reset_reports_econnreset() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "reset");
    let (h, peer) = connected_pair(&mut g);
    // The peer closes with unread bytes in its receive queue: the kernel sends RST.
    g.send_all(h, b"unread");
    std::thread::sleep(Duration::from_millis(50));
    drop(peer);
    let deadline = Instant::now() + T;
    // Keep sending until canald's write meets the reset.
    while g.flags(h) & sock_flag::ERROR == 0 {
        assert!(Instant::now() < deadline, "no reset seen");
        g.send_some(h, b"more");
        std::thread::sleep(Duration::from_millis(5));
    }
    let f = g.flags(h);
    let want = sock_flag::RX_EOF | sock_flag::TX_CLOSED | sock_flag::HUP;
    assert_eq!(f & want, want, "flags {f:#x}");
    let pe = g.entry(h).pending_error.load(Ordering::Relaxed);
    assert!(
        pe == errno::ECONNRESET as u32 || pe == errno::EPIPE as u32,
        "pending_error {pe}"
    );
    // The tx ring was discarded.
    let e = g.entry(h);
    g.wait_until("tx discarded", || {
        e.tx_tail.load(Ordering::Acquire) == e.tx_head.load(Ordering::Relaxed)
    });
}

#[test]
fn closing_listener_drops_unclaimed_connections() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "lclose");
    let l = g.socket(AF_INET, STREAM);
    assert_eq!(g.request(op::BIND, l, [0; 4], &localhost(0).encode()).0, 0);
    assert_eq!(g.request(op::LISTEN, l, [8, 0, 0, 0], &[]).0, 0);
    let (_, out) = g.request(op::GETSOCKNAME, l, [0; 4], &[]);
    let port = CanalAddr::decode(&out).unwrap().port;
    let c1 = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let c2 = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c1.set_read_timeout(Some(T)).unwrap();
    c2.set_read_timeout(Some(T)).unwrap();
    // Take one record (canald accepts one ahead until the program takes one), wait
    // for the other to be accepted and left unclaimed, then close the listener.
    let (_, _, p) = g.wait_record(l);
    let taken = u32::from_le_bytes(p[..4].try_into().unwrap());
    g.wait_until("two accepted", || {
        d.stat().matches("\"kind\":\"tcp\"").count() == 2
    });
    assert_eq!(g.request(op::CLOSE, l, [0; 4], &[]).0, 0);
    g.wait_until("unclaimed freed", || {
        let s = d.stat();
        s.matches("\"handle\"").count() == 1 && s.contains(&format!("\"handle\":{taken},"))
    });
    // Whichever client was not taken sees the end; the taken one still works.
    let mut b = [0u8; 1];
    let taken_port = {
        let s = d.stat();
        let i = s.find("\"peer\":\"127.0.0.1:").unwrap() + 18;
        s[i..s[i..].find('"').unwrap() + i].parse::<u16>().unwrap()
    };
    let (mut live, mut dead) = if c1.local_addr().unwrap().port() == taken_port {
        (c1, c2)
    } else {
        (c2, c1)
    };
    assert!(matches!(dead.read(&mut b), Ok(0) | Err(_)));
    g.send_all(taken, b"x");
    live.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"x");
}

#[test]
fn ipv6_loopback() {
    let Ok(l) = TcpListener::bind("[::1]:0") else {
        eprintln!("skipped: no IPv6 loopback here");
        return;
    };
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "v6");
    let port = l.local_addr().unwrap().port();
    let h = g.socket(10, STREAM);
    let mut one = [0u8; 16];
    one[15] = 1;
    let r = g.connect(h, &CanalAddr::v6(one, port, 0, 0));
    assert!(r == 0 || r == EINPROGRESS, "{r}");
    let (mut peer, _) = l.accept().unwrap();
    g.wait_flags(h, sock_flag::CONNECTED);
    g.send_all(h, b"six");
    let mut b = [0u8; 3];
    peer.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"six");
    assert!(d.stat().contains("\"peer\":\"[::1]:"));
}

#[test]
fn large_stat_listing_in_chunks() {
    let d = TestDaemon::start(&["--ring-kib", "64", "--sockets", "1024"]);
    let mut g = TestGuest::attach(&d.path, "many");
    let mut handles = Vec::new();
    for _ in 0..1024 {
        handles.push(g.socket(AF_INET, DGRAM));
    }
    let (r, _) = g.request(op::SOCKET, 0, [2, 2, 0, 0], &[]);
    assert_eq!(
        r,
        -(errno::EMFILE as i64),
        "the 1025th socket is over the cap"
    );
    let s = d.stat();
    assert!(
        s.len() > 64 * 1024,
        "listing spans several chunks: {}",
        s.len()
    );
    assert_eq!(s.matches("\"kind\":\"udp\"").count(), 1024);
    assert!(s.ends_with("]}],\"networks\":[]}"));
    let t = canald::fetch_stat(&d.path, true).unwrap();
    assert_eq!(t.lines().filter(|l| l.contains(" udp ")).count(), 1024);

    // A client that asks and does not read must not stall the poller.
    let slow = canald::sys::seqpacket_connect(&d.path).unwrap();
    for _ in 0..4 {
        send_ctl(
            &slow,
            canal_abi::control::kind::STAT,
            &0u32.to_le_bytes(),
            &[],
        );
    }
    let t0 = Instant::now();
    for _ in 0..100 {
        assert_eq!(g.request(op::NOP, 0, [0; 4], &[]).0, 0);
    }
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "poller stalled by a slow reader"
    );
    std::thread::sleep(Duration::from_millis(100));
    let mut whole = Vec::new();
    let mut ends = 0;
    while ends < 4 {
        let (k, body, _) = recv_ctl(&slow);
        assert_eq!(k, canal_abi::control::kind::STAT_CHUNK);
        if body.is_empty() {
            ends += 1;
        }
        whole.extend_from_slice(&body);
    }
    let whole = String::from_utf8(whole).unwrap();
    assert_eq!(whole.matches("{\"daemon\"").count(), 4);
    // Each listing is complete. (Not byte-equal to `s`: the workers' live counters —
    // rounds, sleeps, wakes — move between listings and may change their width.)
    let listings: Vec<&str> = whole.split("{\"daemon\"").skip(1).collect();
    assert_eq!(listings.len(), 4);
    for l in listings {
        assert_eq!(l.matches("\"kind\":\"udp\"").count(), 1024);
        assert!(l.ends_with("]}],\"networks\":[]}"));
        assert!(
            l.len().abs_diff(s.len()) < 256,
            "{} vs {}",
            l.len(),
            s.len()
        );
    }
}

#[test]
fn many_concurrent_connections_hashes_match() {
    const CONNS: usize = 16;
    const EACH: usize = 2 << 20;
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "many-conns");
    let mut socks = Vec::new();
    let mut threads = Vec::new();
    for i in 0..CONNS {
        let (h, peer) = connected_pair(&mut g);
        let mut rd = peer.try_clone().unwrap();
        let mut wr = peer;
        // Native side: hash what arrives, send its own pattern.
        threads.push(std::thread::spawn(move || {
            let w = std::thread::spawn(move || {
                wr.write_all(&pattern(100 + i as u64, EACH)).unwrap();
                wr.shutdown(std::net::Shutdown::Write).unwrap();
            });
            let mut got = Vec::with_capacity(EACH);
            rd.read_to_end(&mut got).unwrap();
            w.join().unwrap();
            got
        }));
        socks.push(h);
    }
    let outs: Vec<Vec<u8>> = (0..CONNS).map(|i| pattern(200 + i as u64, EACH)).collect();
    let mut sent = [0usize; CONNS];
    let mut recvd: Vec<Vec<u8>> = vec![Vec::new(); CONNS];
    let mut eof = [false; CONNS];
    let mut buf = vec![0u8; 256 * 1024];
    let t0 = Instant::now();
    // One guest thread interleaves all connections, as an event loop would.
    while eof.iter().any(|e| !e) || sent.iter().any(|&s| s < EACH) {
        assert!(t0.elapsed() < Duration::from_secs(60), "transfer stalled");
        let mut progress = false;
        for i in 0..CONNS {
            let h = socks[i];
            if sent[i] < EACH {
                let n = g.send_some(h, &outs[i][sent[i]..]);
                sent[i] += n;
                if sent[i] == EACH {
                    assert_eq!(g.request(op::SHUTDOWN, h, [1, 0, 0, 0], &[]).0, 0);
                }
                progress |= n > 0;
            }
            if !eof[i] {
                let n = g.recv_some(h, &mut buf);
                recvd[i].extend_from_slice(&buf[..n]);
                progress |= n > 0;
                if n == 0 && g.flags(h) & sock_flag::RX_EOF != 0 && g.rx_queued(h) == 0 {
                    eof[i] = true;
                }
            }
        }
        if !progress {
            g.kick();
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    for (i, t) in threads.into_iter().enumerate() {
        let got = t.join().unwrap();
        assert!(got == outs[i], "connection {i}: guest→native bytes differ");
        assert!(
            recvd[i] == pattern(100 + i as u64, EACH),
            "connection {i}: native→guest differ"
        );
    }
}

#[test]
fn corrupt_indices_break_only_that_socket() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "corrupt");
    let (bad_tx, mut peer1) = connected_pair(&mut g);
    let (bad_rx, mut peer2) = connected_pair(&mut g);
    let (good, mut peer3) = connected_pair(&mut g);
    let want = sock_flag::BROKEN | sock_flag::ERROR | sock_flag::HUP;

    // tx_head more than a ring ahead of the host's tail.
    let e = g.entry(bad_tx);
    let size = e.tx_size.load(Ordering::Relaxed) as u64;
    e.tx_head.store(
        e.tx_tail.load(Ordering::Relaxed) + size + 1,
        Ordering::Release,
    );
    g.region.raise_attention(canal_abi::handle_index(bad_tx));
    g.kick();
    let f = g.wait_flags(bad_tx, sock_flag::BROKEN);
    assert_eq!(f & want, want);
    assert_eq!(e.pending_error.load(Ordering::Relaxed), errno::EIO as u32);

    // rx_tail moved past the host's head, then data arrives.
    let e2 = g.entry(bad_rx);
    e2.rx_tail.store(12345, Ordering::Release);
    peer2.write_all(b"data").unwrap();
    let f = g.wait_flags(bad_rx, sock_flag::BROKEN);
    assert_eq!(f & want, want);

    // Their host sockets are closed: the peers see the end.
    let mut b = [0u8; 8];
    assert!(matches!(peer1.read(&mut b), Ok(0) | Err(_)));
    assert!(matches!(peer2.read(&mut b), Ok(0) | Err(_)));
    // Requests on a broken socket fail with EIO; CLOSE frees it.
    let (r, _) = g.request(op::GETSOCKNAME, bad_tx, [0; 4], &[]);
    assert_eq!(r, -(errno::EIO as i64));
    assert_eq!(g.request(op::CLOSE, bad_tx, [0; 4], &[]).0, 0);

    // The other socket of the same guest is unaffected.
    g.send_all(good, b"still fine");
    let mut got = [0u8; 10];
    peer3.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"still fine");
    assert_eq!(g.flags(good) & sock_flag::BROKEN, 0);
}
