//! Spare stream sockets (feature SPARES): canald keeps fresh AF_INET stream sockets in
//! the header's ring for guests that announced them, refills what is taken, hides the
//! untaken ones from `canal stat`, and stops (without harming the guest) when the guest
//! moves the ring's head where it cannot be.
mod common;
use canal_abi::control::hello_flag;
use canal_abi::sync::Ordering;
use canal_abi::{errno, feature, op, sock_flag, sock_kind, SPARES};
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

#[test]
fn spares_are_published_taken_and_refilled() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach_with(&d.path, "spares", hello_flag::SPARES);
    assert_ne!(g.region.header().features & feature::SPARES, 0);
    nudge(&mut g);
    g.wait_until("four spares", || {
        g.region.header().spare_tail.load(Ordering::Acquire) >= 4
    });
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
    nudge(&mut g);
    g.wait_until("a fifth spare", || {
        g.region.header().spare_tail.load(Ordering::Acquire) >= 5
    });
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
    nudge(&mut g);
    g.wait_until("spares", || {
        g.region.header().spare_tail.load(Ordering::Acquire) >= 4
    });
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
    nudge(&mut g);
    g.wait_until("four spares", || {
        g.region.header().spare_tail.load(Ordering::Acquire) >= 4
    });
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
