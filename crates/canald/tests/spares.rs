//! Spare stream sockets (feature SPARES): canald keeps fresh AF_INET stream sockets in
//! the header's ring for guests that announced them, refills what is taken, hides the
//! untaken ones from `canal stat`, and stops (without harming the guest) when the guest
//! moves the ring's head where it cannot be.
mod common;
use canal_abi::control::hello_flag;
use canal_abi::sync::Ordering;
use canal_abi::{errno, feature, op, sock_flag, sock_kind, CanalAddr, SPARES};
use common::*;
use std::net::TcpListener;

/// Takes one spare the way libcanal does; None if the ring is empty.
fn take(g: &TestGuest) -> Option<u32> {
    let h = g.region.header();
    let head = h.spare_head.load(Ordering::Acquire);
    if h.spare_tail.load(Ordering::Acquire) == head {
        return None;
    }
    let handle = h.spares[head as usize % SPARES].load(Ordering::Relaxed);
    h.spare_head
        .compare_exchange(head, head + 1, Ordering::AcqRel, Ordering::Relaxed)
        .ok()
        .map(|_| handle)
}

/// One request, so that canald runs a round (spares are refilled in rounds).
fn nudge(g: &mut TestGuest) {
    let (r, _) = g.request(op::NOP, 0, [0; 4], &[]);
    assert_eq!(r, 0);
}

/// Nudges canald, then waits until it has published `n` spares in all.
fn wait_spares(g: &mut TestGuest, n: u32) {
    nudge(g);
    g.wait_until("spares", || {
        g.region.header().spare_tail.load(Ordering::Acquire) >= n
    });
}

#[test]
fn spares_are_published_taken_and_refilled() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach_with(&d.path, "spares", hello_flag::SPARES);
    assert_ne!(g.region.header().features & feature::SPARES, 0);
    wait_spares(&mut g, 4);
    // Not the program's sockets yet: canal stat lists none.
    assert!(!d.stat().contains("\"kind\":\"tcp\""), "{}", d.stat());
    // A taken spare is an ordinary fresh stream socket: connect and move data.
    let h = take(&g).expect("a spare");
    let e = g.entry(h);
    assert_eq!(e.kind.load(Ordering::Acquire), sock_kind::STREAM);
    assert_eq!(e.family.load(Ordering::Acquire), 2);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let r = g.connect(h, &localhost(l.local_addr().unwrap().port()));
    assert!(
        r == 0 || r == -(canal_abi::errno::EINPROGRESS as i64),
        "{r}"
    );
    let (mut peer, _) = l.accept().unwrap();
    g.wait_flags(h, sock_flag::CONNECTED);
    echoes_both_ways(&g, h, &mut peer);
    assert!(
        d.stat().contains("\"kind\":\"tcp\""),
        "the taken spare is listed"
    );
    // Taken: canald publishes another in its next round.
    wait_spares(&mut g, 5);
}

#[test]
fn no_spares_without_the_hello_flag() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "nospares");
    nudge(&mut g);
    nudge(&mut g);
    let h = g.region.header();
    assert_eq!(h.features & feature::SPARES, 0);
    assert_eq!(h.spare_tail.load(Ordering::Acquire), 0);
}

#[test]
fn a_head_moved_past_the_tail_stops_spares_only() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach_with(&d.path, "badhead", hello_flag::SPARES);
    wait_spares(&mut g, 4);
    g.region.header().spare_head.store(1000, Ordering::Release);
    nudge(&mut g);
    nudge(&mut g);
    let tail = g.region.header().spare_tail.load(Ordering::Acquire);
    assert!(tail <= 4, "no more spares: {tail}");
    // The guest is still served: a socket by request works.
    let s = g.socket(2, 1);
    assert_eq!(g.entry(s).kind.load(Ordering::Acquire), sock_kind::STREAM);
}

/// Host sockets registered in canald's epoll sets (every `tfd:` line of its epoll
/// descriptors' fdinfo).
fn polled_host_sockets(d: &TestDaemon) -> usize {
    let pid = d.child.id();
    let mut n = 0;
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        let is_epoll = std::fs::read_link(e.path())
            .is_ok_and(|t| t.to_string_lossy() == "anon_inode:[eventpoll]");
        if is_epoll {
            let info = format!("/proc/{pid}/fdinfo/{}", e.file_name().to_string_lossy());
            let text = std::fs::read_to_string(info).unwrap_or_default();
            n += text.lines().filter(|l| l.starts_with("tfd:")).count();
        }
    }
    n
}

/// An unconnected stream (a spare, a socket made by request) has no events canald
/// needs: it enters canald's epoll when it connects or listens, and both still work.
#[test]
fn unconnected_streams_stay_out_of_canalds_epoll() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach_with(&d.path, "unpolled", hello_flag::SPARES);
    wait_spares(&mut g, 4);
    let base = polled_host_sockets(&d);
    let made: Vec<u32> = (0..8).map(|_| g.socket(2, 1)).collect();
    nudge(&mut g);
    assert_eq!(
        polled_host_sockets(&d),
        base,
        "8 fresh streams and 4 spares"
    );
    // A listener is polled: its connections arrive as events.
    let l = made[0];
    assert_eq!(g.request(op::BIND, l, [0; 4], &localhost(0).encode()).0, 0);
    assert_eq!(polled_host_sockets(&d), base, "bound, not listening");
    assert_eq!(g.request(op::LISTEN, l, [8, 0, 0, 0], &[]).0, 0);
    assert_eq!(polled_host_sockets(&d), base + 1);
    // A connect to a native server completes by its event.
    let native = TcpListener::bind("127.0.0.1:0").unwrap();
    let h = made[1];
    let r = g.connect(h, &localhost(native.local_addr().unwrap().port()));
    assert!(r == 0 || r == -(errno::EINPROGRESS as i64), "{r}");
    let (mut peer, _) = native.accept().unwrap();
    g.wait_flags(h, sock_flag::CONNECTED);
    echoes_both_ways(&g, h, &mut peer);
    assert_eq!(polled_host_sockets(&d), base + 2);
    // Closing the never-connected ones is fine and leaves the count alone.
    for &s in &made[2..] {
        assert_eq!(g.request(op::CLOSE, s, [0; 4], &[]).0, 0);
    }
    assert_eq!(polled_host_sockets(&d), base + 2);
}

/// canald's descriptors that are sockets (its control listener and connections, wake-up
/// ports and host sockets alike).
fn canald_sockets(d: &TestDaemon) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", d.child.id()))
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
        })
        .count()
}

fn spare(g: &mut TestGuest) -> u32 {
    nudge(g);
    g.wait_until("a spare", || {
        let h = g.region.header();
        h.spare_tail.load(Ordering::Acquire) != h.spare_head.load(Ordering::Acquire)
    });
    take(g).expect("a spare")
}

fn sockname(g: &mut TestGuest, h: u32) -> CanalAddr {
    let (r, out) = g.request(op::GETSOCKNAME, h, [0; 4], &[]);
    assert_eq!(r, 0, "getsockname");
    CanalAddr::decode(&out).unwrap()
}

/// A spare (or a TCP/IPv4 socket by request) has no host socket until a call needs
/// one, and every call that needs one finds it: bind, listen and a native client's
/// accept; an option set before a native connect, which the connection keeps.
#[test]
fn a_spare_makes_its_host_socket_at_the_first_call_that_needs_it() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach_with(&d.path, "lazy", hello_flag::SPARES);
    wait_spares(&mut g, 4);
    let before = canald_sockets(&d);
    let taken: Vec<u32> = (0..4).map(|_| take(&g).unwrap()).collect();
    wait_spares(&mut g, 8);
    assert_eq!(canald_sockets(&d), before, "eight spares, no host sockets");
    // So for TCP/IPv4 sockets made by request; other kinds are made at once (socket()
    // gets the kernel's answer).
    let by_request = g.socket(AF_INET, STREAM);
    assert_eq!(canald_sockets(&d), before, "a TCP/IPv4 socket by request");
    let _v6 = g.socket(libc::AF_INET6 as u64, STREAM);
    let _udp = g.socket(AF_INET, DGRAM);
    assert_eq!(
        canald_sockets(&d),
        before + 2,
        "a TCP/IPv6 and a UDP socket"
    );
    let before = before + 2;

    // bind + listen + a native client.
    let l = taken[0];
    assert_eq!(g.request(op::BIND, l, [0; 4], &localhost(0).encode()).0, 0);
    assert_eq!(canald_sockets(&d), before + 1, "made by the bind");
    let port = sockname(&mut g, l).port;
    assert_ne!(port, 0);
    assert_eq!(g.request(op::LISTEN, l, [8, 0, 0, 0], &[]).0, 0);
    let mut native = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (k, _, p) = g.wait_record(l);
    assert_eq!(k, canal_abi::ring::record_kind::ACCEPT);
    let a = u32::from_le_bytes(p[..4].try_into().unwrap());
    g.wait_flags(a, sock_flag::CONNECTED);
    echoes_both_ways(&g, a, &mut native);

    // An option first, then a connect to a native server: both on the same socket
    // (one by request: made by the option, like a spare).
    let h = by_request;
    let rcvbuf = 65536i32.to_ne_bytes();
    let (r, _) = g.request(
        op::SETSOCKOPT,
        h,
        [libc::SOL_SOCKET as u64, libc::SO_RCVBUF as u64, 0, 0],
        &rcvbuf,
    );
    assert_eq!(r, 0, "setsockopt");
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let r = g.connect(h, &localhost(server.local_addr().unwrap().port()));
    assert!(r == 0 || r == -(errno::EINPROGRESS as i64), "{r}");
    let (mut peer, from) = server.accept().unwrap();
    g.wait_flags(h, sock_flag::CONNECTED);
    assert_eq!(sockname(&mut g, h).port, from.port());
    let (r, out) = g.request(
        op::GETSOCKOPT,
        h,
        [libc::SOL_SOCKET as u64, libc::SO_RCVBUF as u64, 4, 0],
        &[],
    );
    assert_eq!(r, 0, "getsockopt");
    // The kernel doubles what was asked for: the option reached the connected socket.
    assert_eq!(i32::from_ne_bytes(out[..4].try_into().unwrap()), 2 * 65536);
    echoes_both_ways(&g, h, &mut peer);
}

/// A short-circuited connect from a spare makes no socket for the connector: its port
/// is a reservation canald keeps (`guest::ports`). While the connection lives no one
/// can bind that port; after it, the port is not given to the next connections at once;
/// and an option set on the connector keeps its name.
#[test]
fn short_circuited_spares_use_reserved_ports() {
    let d = TestDaemon::start(&[]);
    let flags = hello_flag::SPARES | hello_flag::SHORTCUT;
    let mut srv = TestGuest::attach_with(&d.path, "srv", hello_flag::SHORTCUT);
    let mut cli = TestGuest::attach_with(&d.path, "cli", flags);
    let (l, port) = tcp_listener(&mut srv);
    let mut ports: Vec<u16> = Vec::new();
    for round in 0..40 {
        let h = spare(&mut cli);
        let r = cli.connect(h, &localhost(port));
        assert!(r == 0 || r == -(errno::EINPROGRESS as i64), "{r}");
        cli.wait_flags(h, sock_flag::CONNECTED);
        assert_ne!(
            cli.entry(h).segment.load(Ordering::Acquire),
            0,
            "short-circuited"
        );
        let (_, peer, p) = srv.wait_record(l);
        let a = u32::from_le_bytes(p[..4].try_into().unwrap());
        let local = sockname(&mut cli, h);
        assert_eq!(local, peer, "the acceptor sees the connector's name");
        let taken = std::net::TcpListener::bind(("127.0.0.1", local.port));
        assert!(
            taken.is_err(),
            "round {round}: port {} was free",
            local.port
        );
        if round == 39 {
            // An option makes the reservation the connector's own socket: same name.
            let one = 1i32.to_ne_bytes();
            let o = [libc::IPPROTO_TCP as u64, libc::TCP_NODELAY as u64, 0, 0];
            assert_eq!(cli.request(op::SETSOCKOPT, h, o, &one).0, 0);
            assert_eq!(sockname(&mut cli, h), local);
        }
        let window = ports.len().saturating_sub(15);
        assert!(
            !ports[window..].contains(&local.port),
            "round {round}: port {} again within 16 connections: {ports:?}",
            local.port
        );
        ports.push(local.port);
        assert_eq!(cli.request(op::CLOSE, h, [0; 4], &[]).0, 0);
        assert_eq!(srv.request(op::CLOSE, a, [0; 4], &[]).0, 0);
    }
    // Ports were reused (40 connections did not take 40 ports).
    let mut distinct = ports.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() < ports.len(), "{ports:?}");
}
