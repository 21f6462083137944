//! Virtual RSS (protocol §6.3): with `--workers 2`, one guest's connections are owned
//! by both workers; requests on sockets of the non-home worker are forwarded there,
//! data kicks reach the owner (the daemon sleeps as soon as a round is idle, so a kick
//! that went to the wrong worker would leave the data unsent), freed entries go back
//! to the home. A guest that did not announce VRSS keeps every socket on its home.
mod common;
use canal_abi::control::{hello_flag, kind};
use canal_abi::sync::Ordering;
use canal_abi::{errno, feature, handle_index, op, sock_flag, sock_kind, CanalAddr};
use common::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

const CONNS: usize = 16;

/// Opens CONNS connected sockets to `l`; returns the handles and the server ends
/// (in the same order).
fn connect_all(g: &mut TestGuest, l: &TcpListener) -> (Vec<u32>, Vec<TcpStream>) {
    let port = l.local_addr().unwrap().port();
    let mut hs = Vec::new();
    let mut srv = Vec::new();
    for _ in 0..CONNS {
        let h = g.socket(libc::AF_INET as u64, libc::SOCK_STREAM as u64);
        let r = g.connect(h, &localhost(port));
        assert!(r == 0 || r == -(errno::EINPROGRESS as i64), "connect: {r}");
        g.wait_flags(h, sock_flag::CONNECTED | sock_flag::ERROR);
        assert_eq!(g.flags(h) & sock_flag::ERROR, 0);
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        hs.push(h);
        srv.push(s);
    }
    // Pair server ends with handles by the client's port.
    let mut by_port = Vec::new();
    for &h in &hs {
        let (r, out) = g.request(op::GETSOCKNAME, h, [0; 4], &[]);
        assert_eq!(r, 0);
        by_port.push(CanalAddr::decode(&out).unwrap().port);
    }
    let mut ordered = Vec::new();
    for p in by_port {
        let i = srv
            .iter()
            .position(|s| s.peer_addr().unwrap().port() == p)
            .expect("server end of each connection");
        ordered.push(srv.swap_remove(i));
    }
    (hs, ordered)
}

fn owner(g: &TestGuest, h: u32) -> u32 {
    g.entry(h).owner.load(Ordering::Acquire)
}

/// A hung canald fails the test instead of hanging it.
fn set_ctl_timeout(g: &TestGuest) {
    let tv = libc::timeval {
        tv_sec: 10,
        tv_usec: 0,
    };
    // SAFETY: setsockopt with a valid descriptor and a timeval of the right size.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&g.ctl),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
}

/// Requests on every socket, whichever worker owns it (forwarded or not).
fn requests_on_every_socket(g: &mut TestGuest, hs: &[u32], port: u16) {
    let one = 1i32.to_ne_bytes();
    let nodelay = [libc::IPPROTO_TCP as u64, libc::TCP_NODELAY as u64, 4, 0];
    for &h in hs {
        let (r, out) = g.request(op::GETPEERNAME, h, [0; 4], &[]);
        assert_eq!(r, 0);
        assert_eq!(CanalAddr::decode(&out).unwrap(), localhost(port));
        assert_eq!(g.request(op::SETSOCKOPT, h, nodelay, &one).0, 0);
        assert_eq!(
            g.request(op::GETSOCKOPT, h, nodelay, &[]),
            (0, one.to_vec())
        );
        // Native errno from the owner's kernel socket.
        assert_eq!(
            g.request(op::LISTEN, h, [1, 0, 0, 0], &[]).0,
            -(errno::EINVAL as i64)
        );
    }
}

#[test]
fn vrss_spreads_forwards_and_gives_back() {
    let d = TestDaemon::start(&["--workers", "2", "--notify", "sleep"]);
    let mut g = TestGuest::attach_with(&d.path, "vrss", hello_flag::VRSS);
    assert_ne!(g.region.header().features & feature::VRSS, 0);
    set_ctl_timeout(&g);
    g.doorbells().expect("DOORBELLS answered");
    assert_eq!(g.wdoors.len(), 2);
    // An exec'd image asks again: answered, and the eventfds stay the same ones (the
    // kicks below go through the first answer's descriptors, as the guest's other
    // processes would).
    let first = std::mem::take(&mut g.wdoors);
    g.doorbells().expect("DOORBELLS answered again");
    assert_eq!(g.wdoors.len(), 2);
    g.wdoors = first;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (hs, mut srv) = connect_all(&mut g, &l);
    let owners: Vec<u32> = hs.iter().map(|&h| owner(&g, h)).collect();
    assert!(owners.iter().all(|&o| o < 2), "{owners:?}");
    assert!(
        owners.contains(&0) && owners.contains(&1),
        "one guest's connections on both workers: {owners:?}"
    );
    let stat = d.stat();
    assert!(
        stat.contains("\"worker\":0") && stat.contains("\"worker\":1"),
        "{stat}"
    );

    // Data both ways on every connection (kicks to the owner).
    for (i, (&h, s)) in hs.iter().zip(srv.iter_mut()).enumerate() {
        let data = pattern(i as u64, 100_000 + i * 1000);
        g.send_all(h, &data);
        let mut got = vec![0u8; data.len()];
        s.read_exact(&mut got).unwrap();
        assert!(got == data, "conn {i}: guest → server bytes differ");
        s.write_all(&data[..5000]).unwrap();
        assert_eq!(
            g.recv_exact(h, 5000),
            &data[..5000],
            "conn {i}: server → guest"
        );
    }

    requests_on_every_socket(&mut g, &hs, port);

    // Shutdown(SHUT_WR) on a socket of the non-home worker: the server sees EOF after
    // the queued bytes; the connection still receives.
    let home = owner_home(&d);
    let (ai, &away) = hs
        .iter()
        .enumerate()
        .find(|(_, &h)| owner(&g, h) != home)
        .expect("a socket away from home");
    g.send_all(away, b"tail");
    assert_eq!(g.request(op::SHUTDOWN, away, [1, 0, 0, 0], &[]).0, 0);
    let mut rest = Vec::new();
    srv[ai].read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"tail");
    srv[ai].write_all(b"still").unwrap();
    assert_eq!(g.recv_exact(away, 5), b"still");

    // Close it: the server sees the end, the handle is dead, and the entry goes back
    // to the home (a new socket reuses the index, with a new generation).
    assert_eq!(g.request(op::CLOSE, away, [0; 4], &[]).0, 0);
    srv[ai].write_all(b"x").ok();
    g.wait_until("entry freed", || {
        g.entry(away).kind.load(Ordering::Acquire) == sock_kind::FREE
    });
    assert_eq!(
        g.request(op::GETSOCKNAME, away, [0; 4], &[]).0,
        -(errno::EBADF as i64)
    );
    let idx = handle_index(away);
    let lowest_away = hs
        .iter()
        .filter(|&&h| h != away)
        .all(|&h| handle_index(h) != idx);
    assert!(lowest_away);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let h2 = loop {
        let h = g.socket(libc::AF_INET as u64, libc::SOCK_STREAM as u64);
        if handle_index(h) == idx {
            break h;
        }
        assert_eq!(g.request(op::CLOSE, h, [0; 4], &[]).0, 0);
        assert!(
            std::time::Instant::now() < deadline,
            "the home never got the entry back"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_ne!(h2, away, "new generation");
    assert_eq!(owner(&g, h2), home, "unconnected sockets live at home");

    // Idle: both workers sleep; worker 1 (no guest homed there, only sockets it owns)
    // does no rounds while nothing happens.
    let hdr = g.region.header();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while hdr.worker_sleeping[0].load(Ordering::Acquire) != 1
        || hdr.worker_sleeping[1].load(Ordering::Acquire) != 1
    {
        assert!(std::time::Instant::now() < deadline, "workers never slept");
        std::thread::sleep(Duration::from_millis(1));
    }
    let r1 = worker_rounds(&d, 1);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(r1, worker_rounds(&d, 1), "worker 1 spins while idle");

    // The guest leaves with connections open on both workers: every one is closed.
    drop(g);
    for (i, s) in srv.iter_mut().enumerate() {
        if i == ai {
            continue;
        }
        let mut b = [0u8; 16];
        loop {
            match s.read(&mut b) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) => panic!("conn {i}: {e} (not closed by canald)"),
            }
        }
    }
}

/// Rounds done by worker `w` so far (STAT).
fn worker_rounds(d: &TestDaemon, w: u32) -> u64 {
    let st = d.stat();
    let at = st
        .find(&format!("{{\"id\":{w},\"notify\""))
        .expect("worker listed");
    let r = st[at..].find("\"rounds\":").expect("rounds") + at + 9;
    let end = st[r..].find(',').unwrap() + r;
    st[r..end].parse().unwrap()
}

/// The worker a single guest is homed on (the STAT listing's guest worker).
fn owner_home(d: &TestDaemon) -> u32 {
    let st = d.stat();
    let g = st.find("\"guests\":[").expect("guests");
    let w = st[g..].find("\"worker\":").expect("guest worker") + g + 9;
    st[w..w + 1].parse().unwrap()
}

#[test]
fn old_guest_stays_home() {
    let d = TestDaemon::start(&["--workers", "2", "--notify", "sleep"]);
    let mut g = TestGuest::attach(&d.path, "old");
    assert_eq!(g.region.header().features & feature::VRSS, 0);
    let (k, ..) = {
        send_ctl(&g.ctl, kind::DOORBELLS, &[], &[]);
        recv_ctl(&g.ctl)
    };
    assert_eq!(k, kind::ERROR, "DOORBELLS refused without the feature");
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let (hs, mut srv) = connect_all(&mut g, &l);
    for (i, (&h, s)) in hs.iter().zip(srv.iter_mut()).enumerate() {
        let data = pattern(i as u64, 20_000);
        g.send_all(h, &data);
        let mut got = vec![0u8; data.len()];
        s.read_exact(&mut got).unwrap();
        assert!(got == data);
    }
    let home = owner_home(&d);
    let st = d.stat();
    let socks = &st[st.find("\"sockets\":[{").expect("socket list")..];
    let other = format!("\"worker\":{}", 1 - home);
    assert!(
        !socks.contains(&other),
        "an old guest's socket left home: {st}"
    );
}

/// A guest with virtual RSS and a 10 s timeout on its control socket (a hung canald
/// fails the test instead of hanging it).
fn vrss_guest(d: &TestDaemon, comm: &str) -> TestGuest {
    let mut g = TestGuest::attach_with(&d.path, comm, hello_flag::VRSS);
    let s = socket2_timeout(&g.ctl);
    assert_eq!(s, 0);
    g.doorbells().expect("DOORBELLS answered");
    g
}

fn socket2_timeout(fd: &std::os::fd::OwnedFd) -> i32 {
    let tv = libc::timeval {
        tv_sec: 10,
        tv_usec: 0,
    };
    // SAFETY: setsockopt with a valid descriptor and a timeval of the right size.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(fd),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    }
}

fn local_of(g: &mut TestGuest, h: u32) -> CanalAddr {
    let (r, out) = g.request(op::GETSOCKNAME, h, [0; 4], &[]);
    assert_eq!(r, 0);
    CanalAddr::decode(&out).unwrap()
}

/// Datagram sockets spread too: bound ones by their local address, connected ones by
/// the flow hash, an unbound one once its first send bound it; each owner serves the
/// socket's data both ways (kicks to the owner, received datagrams on its epoll).
#[test]
fn vrss_spreads_datagram_sockets() {
    use canald::guest::shared::{local_owner, owner_of};
    use std::net::UdpSocket;
    let d = TestDaemon::start(&["--workers", "2", "--notify", "sleep"]);
    let mut g = vrss_guest(&d, "udp");
    let home = owner_home(&d);
    let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let pport = peer.local_addr().unwrap().port();
    let udp = |g: &mut TestGuest| g.socket(libc::AF_INET as u64, libc::SOCK_DGRAM as u64);

    // Bound, unconnected: by the local address.
    let mut bound = Vec::new();
    for _ in 0..CONNS {
        let h = udp(&mut g);
        assert_eq!(owner(&g, h), home, "a fresh socket lives at home");
        let (r, _) = g.request(op::BIND, h, [0; 4], &localhost(0).encode());
        assert_eq!(r, 0);
        let local = local_of(&mut g, h);
        assert_eq!(owner(&g, h), local_owner(&local, 2), "bound {local:?}");
        bound.push((h, local));
    }
    // Connected: by the flow hash.
    let mut connected = Vec::new();
    for _ in 0..CONNS {
        let h = udp(&mut g);
        assert_eq!(g.connect(h, &localhost(pport)), 0);
        let local = local_of(&mut g, h);
        assert_eq!(owner(&g, h), owner_of(&local, &localhost(pport), 2));
        connected.push((h, local));
    }
    let owners: Vec<u32> = bound
        .iter()
        .chain(&connected)
        .map(|&(h, _)| owner(&g, h))
        .collect();
    assert!(
        owners.contains(&0) && owners.contains(&1),
        "one guest's datagram sockets on both workers: {owners:?}"
    );
    let stat = d.stat();
    assert!(
        stat.contains("\"worker\":0") && stat.contains("\"worker\":1"),
        "{stat}"
    );

    // Data both ways through every owner.
    let mut buf = [0u8; 2048];
    for (i, &(h, local)) in bound.iter().chain(&connected).enumerate() {
        let msg = format!("to peer {i}");
        let to = (i < CONNS).then(|| localhost(pport));
        assert!(g.send_dgram(h, to.as_ref(), msg.as_bytes()));
        let (n, from) = peer.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], msg.as_bytes(), "socket {i}");
        assert_eq!(from.port(), local.port);
        let back = format!("from peer {i}");
        peer.send_to(back.as_bytes(), from).unwrap();
        let (k, src, data) = g.wait_record(h);
        assert_eq!(k, canal_abi::ring::record_kind::DATAGRAM);
        assert_eq!(src.port, pport);
        assert_eq!(data, back.as_bytes(), "socket {i}");
    }

    // Unbound: stays home until its first send binds it, then moves by its address.
    let placed = loop {
        let h = udp(&mut g);
        assert!(g.send_dgram(h, Some(&localhost(pport)), b"autobind"));
        let (n, from) = peer.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"autobind");
        let local = local_of(&mut g, h);
        assert_eq!(local.port, from.port());
        let want = local_owner(&local, 2);
        g.wait_until("placement after autobind", || owner(&g, h) == want);
        if want != home {
            break h;
        }
        assert_eq!(g.request(op::CLOSE, h, [0; 4], &[]).0, 0);
    };
    peer.send_to(b"moved", ("127.0.0.1", local_of(&mut g, placed).port))
        .unwrap();
    assert_eq!(g.wait_record(placed).2, b"moved");

    // Closing an away datagram socket frees its entry (given back to the home).
    let &(away, _) = bound
        .iter()
        .find(|&&(h, _)| owner(&g, h) != home)
        .expect("a bound socket away from home");
    assert_eq!(g.request(op::CLOSE, away, [0; 4], &[]).0, 0);
    g.wait_until("entry freed", || {
        g.entry(away).kind.load(Ordering::Acquire) == sock_kind::FREE
    });
}

/// Listeners spread by their local address. A listener away from home accepts on its
/// owner, which sends each connection to the home for its entry and writes the ACCEPT
/// record when the home answers; the accepted streams are placed by their flow hash
/// like any. Closing such a listener releases the connections the guest never took.
#[test]
fn vrss_spreads_listeners() {
    use canald::guest::shared::local_owner;
    let d = TestDaemon::start(&["--workers", "2", "--notify", "sleep"]);
    let mut g = vrss_guest(&d, "listen");
    let home = owner_home(&d);
    let mut ls = Vec::new();
    for _ in 0..CONNS {
        let l = g.socket(libc::AF_INET as u64, libc::SOCK_STREAM as u64);
        assert_eq!(g.request(op::BIND, l, [0; 4], &localhost(0).encode()).0, 0);
        assert_eq!(g.request(op::LISTEN, l, [64, 0, 0, 0], &[]).0, 0);
        let local = local_of(&mut g, l);
        assert_eq!(owner(&g, l), local_owner(&local, 2), "listener {local:?}");
        assert_eq!(g.entry(l).kind.load(Ordering::Acquire), sock_kind::LISTENER);
        ls.push((l, local.port));
    }
    assert!(
        ls.iter().any(|&(l, _)| owner(&g, l) != home)
            && ls.iter().any(|&(l, _)| owner(&g, l) == home),
        "listeners on both workers"
    );
    // Every listener accepts (24 connections each, more than the records an owner
    // keeps in flight), and every accepted connection carries data both ways.
    let mut accepted_owners = std::collections::BTreeSet::new();
    for (i, &(l, port)) in ls.iter().enumerate() {
        let mut clients: Vec<TcpStream> = (0..24)
            .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
            .collect();
        let mut handles = Vec::new();
        while handles.len() < clients.len() {
            let (k, peer, p) = g.wait_record(l);
            assert_eq!(k, canal_abi::ring::record_kind::ACCEPT);
            let h = u32::from_le_bytes(p[..4].try_into().unwrap());
            assert_eq!(g.entry(h).kind.load(Ordering::Acquire), sock_kind::STREAM);
            handles.push((h, peer.port));
        }
        for (h, cport) in handles {
            accepted_owners.insert(owner(&g, h));
            let c = clients
                .iter_mut()
                .find(|c| c.local_addr().unwrap().port() == cport)
                .expect("the accepted peer is one of ours");
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let data = pattern(i as u64, 3000);
            c.write_all(&data).unwrap();
            assert_eq!(g.recv_exact(h, data.len()), data);
            g.send_all(h, b"back");
            let mut b = [0u8; 4];
            c.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"back");
            assert_eq!(g.request(op::CLOSE, h, [0; 4], &[]).0, 0);
        }
    }
    assert_eq!(accepted_owners.len(), 2, "accepted streams spread too");

    // An away listener closed with connections it never handed out: their sockets
    // are released (the clients see the end), and so is the listener's entry.
    let &(away, port) = ls
        .iter()
        .find(|&&(l, _)| owner(&g, l) != home)
        .expect("an away listener");
    let mut waiting: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let mut records = 0;
    g.wait_until("4 ACCEPT records", || {
        records = g.rx_queued(away);
        records
            >= 4 * canal_abi::ring::record_size(
                canal_abi::addr::ADDR_SIZE as u64,
                canal_abi::ACCEPT_PAYLOAD as u64,
            )
    });
    let stat = d.stat();
    let streams = stat.matches("\"kind\":\"tcp\"").count();
    assert_eq!(streams, 4, "{stat}");
    assert_eq!(g.request(op::CLOSE, away, [0; 4], &[]).0, 0);
    for c in &mut waiting {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 1];
        assert!(
            matches!(c.read(&mut b), Ok(0) | Err(_)),
            "an unclaimed connection stays open"
        );
    }
    g.wait_until("listener entry freed", || {
        g.entry(away).kind.load(Ordering::Acquire) == sock_kind::FREE
    });
    g.wait_until("unclaimed sockets freed", || {
        !d.stat().contains("\"kind\":\"tcp\"")
    });
}
