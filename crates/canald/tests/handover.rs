//! HOST_SOCKET (protocol §2): a guest whose program passes a listener, a datagram
//! socket or an unconnected stream on with SCM_RIGHTS gets the host socket; canald
//! serves it no more. Only such sockets, only the asking guest's, and an unconnected
//! stream or a datagram socket only without a destination policy.
mod common;
use canal_abi::control::kind;
use canal_abi::{errno, op, sock_flag, CanalAddr};
use common::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};

/// Control message `ask` naming `handle`, answered `ok` with one socket: Ok(it) or
/// Err(errno).
fn socket_of(g: &TestGuest, ask: u16, ok: u16, handle: u32) -> Result<OwnedFd, i32> {
    let (k, body, mut fds) = ctl_call(&g.ctl, ask, &handle.to_le_bytes(), &[])?;
    assert_eq!((k, &body[..]), (ok, &handle.to_le_bytes()[..]));
    assert_eq!(fds.len(), 1);
    Ok(fds.remove(0))
}

/// HOST_SOCKET for `handle`: Ok(the socket) or Err(errno).
fn host_socket(g: &TestGuest, handle: u32) -> Result<OwnedFd, i32> {
    socket_of(g, kind::HOST_SOCKET, kind::HOST_SOCKET_OK, handle)
}

#[test]
fn a_handed_over_listener_is_the_guests_and_canald_accepts_no_more() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "handover");
    let (l, port) = tcp_listener(&mut g);
    // One connection canald accepts for the guest before the handover: reset with it.
    let mut early = TcpStream::connect(("127.0.0.1", port)).unwrap();
    g.wait_until("the early connection queued", || g.rx_queued(l) > 0);
    let fd = host_socket(&g, l).expect("the listener");
    assert_ne!(g.flags(l) & sock_flag::HANDED_OVER, 0);
    assert_eq!(g.flags(l) & sock_flag::LISTENING, 0);
    let queued = g.rx_queued(l);
    let mut b = [0u8; 1];
    early
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    assert!(matches!(early.read(&mut b), Ok(0) | Err(_)), "reset");
    // The kernel socket is the listener, at the guest's port, and its connections are
    // the guest's own: canald takes none of them (its epoll no longer has it).
    let k = TcpListener::from(fd);
    assert_eq!(k.local_addr().unwrap().port(), port);
    for i in 0..5u8 {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.write_all(&[i]).unwrap();
        let (mut s, _) = k.accept().unwrap();
        s.read_exact(&mut b).unwrap();
        assert_eq!(b[0], i);
    }
    assert_eq!(
        g.rx_queued(l),
        queued,
        "no ACCEPT record after the handover"
    );
    // Asked again (another process of the guest following): the same socket.
    let again = host_socket(&g, l).expect("again");
    let same = |a: i32, b: i32| {
        let (mut x, mut y) = (
            std::mem::MaybeUninit::zeroed(),
            std::mem::MaybeUninit::zeroed(),
        );
        // SAFETY: fstat fills the stat buffers.
        unsafe {
            libc::fstat(a, x.as_mut_ptr());
            libc::fstat(b, y.as_mut_ptr());
            let (x, y): (libc::stat, libc::stat) = (x.assume_init(), y.assume_init());
            x.st_ino == y.st_ino
        }
    };
    assert!(same(again.as_raw_fd(), k.as_raw_fd()));
    // Closing the entry leaves the guest's socket working.
    assert_eq!(g.request(op::CLOSE, l, [0; 4], &[]).0, 0);
    let _c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    k.accept().unwrap();
}

#[test]
fn only_unconnected_sockets_of_the_asker_are_handed_over() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "handover");
    let mut other = TestGuest::attach(&d.path, "other");
    let (l, _) = tcp_listener(&mut g);
    assert_eq!(
        host_socket(&other, l).err(),
        Some(errno::EBADF),
        "another guest's"
    );
    assert_eq!(
        host_socket(&g, l ^ (1 << 16)).err(),
        Some(errno::EBADF),
        "stale handle"
    );
    let (s, _peer) = connected_pair(&mut g);
    assert_eq!(
        host_socket(&g, s).err(),
        Some(errno::EOPNOTSUPP),
        "connected"
    );
    // A stream not yet connected, bound: the guest's, bound where it was.
    let b = g.socket(libc::AF_INET as u64, libc::SOCK_STREAM as u64);
    assert_eq!(g.request(op::BIND, b, [0; 4], &localhost(0).encode()).0, 0);
    let (_, out) = g.request(op::GETSOCKNAME, b, [0; 4], &[]);
    let port = CanalAddr::decode(&out).unwrap().port;
    let fd = host_socket(&g, b).expect("unconnected stream");
    let k = TcpListener::from(fd);
    assert_eq!(k.local_addr().unwrap().port(), port);
    // canald makes no call on it any more (the library follows on the error), nor
    // listens on it for the guest; only its close is canald's.
    let ebadf = -(errno::EBADF as i64);
    assert_eq!(g.request(op::GETSOCKNAME, b, [0; 4], &[]).0, ebadf);
    assert_eq!(g.request(op::LISTEN, b, [4, 0, 0, 0], &[]).0, ebadf);
    assert_eq!(
        g.request(op::CONNECT, b, [0; 4], &localhost(port).encode())
            .0,
        ebadf
    );
    assert_eq!(g.request(op::CLOSE, b, [0; 4], &[]).0, 0);
    drop(other.request(op::NOP, 0, [0; 4], &[]));
}

#[test]
fn a_datagram_socket_is_handed_over_after_its_queued_sends() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "udp");
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sink.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let to = localhost(sink.local_addr().unwrap().port());
    let u = g.socket(libc::AF_INET as u64, libc::SOCK_DGRAM as u64);
    assert_eq!(g.request(op::BIND, u, [0; 4], &localhost(0).encode()).0, 0);
    let (_, out) = g.request(op::GETSOCKNAME, u, [0; 4], &[]);
    let port = CanalAddr::decode(&out).unwrap().port;
    // Queued, canald not told: the handover sends it before it gives the socket away.
    assert!(g.queue_dgram(u, Some(&to), b"queued before"));
    let fd = host_socket(&g, u).expect("datagram socket");
    let mut buf = [0u8; 64];
    let (n, from) = sink.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from.port()), (&b"queued before"[..], port));
    // The guest's own kernel socket now, where it was bound; canald makes no call on
    // it, nor reads what comes to it.
    let k = std::net::UdpSocket::from(fd);
    assert_eq!(k.local_addr().unwrap().port(), port);
    let ebadf = -(errno::EBADF as i64);
    assert_eq!(g.request(op::GETSOCKNAME, u, [0; 4], &[]).0, ebadf);
    sink.send_to(b"after", ("127.0.0.1", port)).unwrap();
    k.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let n = k.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"after");
    assert_eq!(g.rx_queued(u), 0, "canald still received for it");
    assert_eq!(g.request(op::CLOSE, u, [0; 4], &[]).0, 0);
}

#[test]
fn an_unconnected_stream_stays_in_canald_under_a_destination_policy() {
    let d = TestDaemon::start(&["--loopback-only"]);
    let mut g = TestGuest::attach(&d.path, "policy");
    let s = g.socket(libc::AF_INET as u64, libc::SOCK_STREAM as u64);
    assert_eq!(host_socket(&g, s).err(), Some(errno::EOPNOTSUPP));
    // So does a datagram socket: it could send anywhere.
    let u = g.socket(libc::AF_INET as u64, libc::SOCK_DGRAM as u64);
    assert_eq!(host_socket(&g, u).err(), Some(errno::EOPNOTSUPP));
    // A listener is still handed over: it only takes connections.
    let (l, _) = tcp_listener(&mut g);
    assert!(host_socket(&g, l).is_ok());
}

/// LISTENER_SOCKET for `handle`: Ok(a copy of the host listener) or Err(errno).
fn listener_socket(g: &TestGuest, handle: u32) -> Result<OwnedFd, i32> {
    socket_of(g, kind::LISTENER_SOCKET, kind::LISTENER_SOCKET_OK, handle)
}

/// A guest announcing NATIVE_ACCEPT; whether canald granted it.
fn native_guest(d: &TestDaemon) -> (TestGuest, bool) {
    use canal_abi::control::hello_flag as hf;
    let g = TestGuest::attach_with(
        &d.path,
        "native-accept",
        hf::SHORTCUT | hf::DIRECT | hf::NATIVE_ACCEPT,
    );
    let granted = g.region.header().features & canal_abi::feature::NATIVE_ACCEPT != 0;
    (g, granted)
}

#[test]
fn a_native_accept_listener_leaves_its_native_clients_to_the_guest() {
    let d = TestDaemon::start(&[]);
    let (mut g, granted) = native_guest(&d);
    assert!(
        granted,
        "a guest in canald's network without a policy gets NATIVE_ACCEPT"
    );
    let (l, port) = tcp_listener(&mut g);
    assert_ne!(g.flags(l) & sock_flag::NATIVE_ACCEPT, 0);
    let k = TcpListener::from(listener_socket(&g, l).expect("the listener's copy"));
    assert_eq!(k.local_addr().unwrap().port(), port);
    // canald sees the client queued and says so; it accepts nothing itself.
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    g.wait_until("NATIVE_QUEUED", || {
        g.flags(l) & sock_flag::NATIVE_QUEUED != 0
    });
    assert_eq!(g.rx_queued(l), 0, "no ACCEPT record for a native client");
    let (mut s, _) = k.accept().expect("the client, in the kernel's queue");
    c.write_all(b"x").unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
    assert!(k.accept().is_err(), "non-blocking, nothing more queued");
    // The guest's attention after an empty accept: canald looks again and clears it.
    g.attention(l);
    g.wait_until("NATIVE_QUEUED cleared", || {
        g.flags(l) & sock_flag::NATIVE_QUEUED == 0
    });
    // The copy is the guest's: closing it leaves canald's listener listening.
    drop(k);
    let _again = TcpStream::connect(("127.0.0.1", port)).expect("still listening");
    g.wait_until("NATIVE_QUEUED again", || {
        g.flags(l) & sock_flag::NATIVE_QUEUED != 0
    });
}

#[test]
fn listener_socket_is_only_for_the_guests_native_accept_listeners() {
    let d = TestDaemon::start(&[]);
    let (mut g, granted) = native_guest(&d);
    assert!(
        granted,
        "a guest in canald's network without a policy gets NATIVE_ACCEPT"
    );
    let s = g.socket(libc::AF_INET as u64, libc::SOCK_STREAM as u64);
    assert_eq!(
        listener_socket(&g, s).err(),
        Some(errno::EOPNOTSUPP),
        "a stream"
    );
    assert_eq!(
        listener_socket(&g, s ^ 0x0001_0000).err(),
        Some(errno::EBADF),
        "another generation"
    );
    assert_eq!(listener_socket(&g, 0xffff).err(), Some(errno::EBADF));
    // A guest that did not announce NATIVE_ACCEPT: canald accepts for it, as before,
    // and gives no copy.
    let mut old = TestGuest::attach(&d.path, "relayed");
    let (l, port) = tcp_listener(&mut old);
    assert_eq!(old.flags(l) & sock_flag::NATIVE_ACCEPT, 0);
    assert_eq!(listener_socket(&old, l).err(), Some(errno::EOPNOTSUPP));
    let _c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    old.wait_until("canald's ACCEPT record", || old.rx_queued(l) > 0);
    // Nor under a policy (no DIRECT): `--loopback-only`.
    let p = TestDaemon::start(&["--loopback-only"]);
    assert!(!native_guest(&p).1, "no NATIVE_ACCEPT under a policy");
}

#[test]
fn another_guest_cannot_have_a_copy_of_a_listener_not_its_own() {
    // Two guests of one canald, same uid: a handle is an index in the asking guest's
    // own table, so B naming A's listener names nothing of B's.
    let d = TestDaemon::start(&[]);
    let (mut a, granted) = native_guest(&d);
    assert!(granted);
    let (l, _) = tcp_listener(&mut a);
    let (b, _) = native_guest(&d);
    assert_eq!(listener_socket(&b, l).err(), Some(errno::EBADF));
    assert_eq!(host_socket(&b, l).err(), Some(errno::EBADF));
    assert!(
        listener_socket(&a, l).is_ok(),
        "its own guest still gets it"
    );
}

/// Feature NATIVE_QUIET (protocol §2 Native accepts, minor 21): canald looks at a
/// NATIVE_ACCEPT listener's host queue for its first native client only, until the
/// guest sets NATIVE_LOOKS in the listener's `guest_flags` and raises its attention;
/// then it looks at once, and at every arrival after.
#[test]
fn a_quiet_native_listener_is_watched_once_the_guest_relies_on_it() {
    use canal_abi::control::hello_flag as hf;
    let d = TestDaemon::start(&[]);
    let flags = hf::SHORTCUT | hf::DIRECT | hf::NATIVE_ACCEPT | hf::NATIVE_QUIET;
    let mut g = TestGuest::attach_with(&d.path, "quiet", flags);
    let features = g.region.header().features;
    assert_ne!(features & canal_abi::feature::NATIVE_QUIET, 0);
    let (l, port) = tcp_listener(&mut g);
    let k = TcpListener::from(listener_socket(&g, l).expect("the listener's copy"));
    let queued = |g: &TestGuest| g.flags(l) & sock_flag::NATIVE_QUEUED != 0;
    // The first client after LISTEN: flagged.
    let _a = TcpStream::connect(("127.0.0.1", port)).unwrap();
    g.wait_until("NATIVE_QUEUED for the first client", || queued(&g));
    k.accept().expect("the first client");
    g.attention(l);
    g.wait_until("NATIVE_QUEUED cleared", || !queued(&g));
    // The next one: the kernel holds it, canald does not look.
    let _b = TcpStream::connect(("127.0.0.1", port)).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!queued(&g), "canald looked at a quiet listener's arrival");
    // The guest relies on the flag: canald looks now, and at every arrival after.
    let e = g.region.socket(canal_abi::handle_index(l)).unwrap();
    e.guest_flags.fetch_or(
        canal_abi::guest_flag::NATIVE_LOOKS,
        std::sync::atomic::Ordering::Relaxed,
    );
    g.attention(l);
    g.wait_until("NATIVE_QUEUED once relied on", || queued(&g));
    k.accept().expect("the second client");
    g.attention(l);
    g.wait_until("NATIVE_QUEUED cleared again", || !queued(&g));
    let _c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    g.wait_until("NATIVE_QUEUED for an arrival, unasked", || queued(&g));
}

/// Each native client arriving at a listener nobody accepts on is one event on it
/// (`event_seq` moves by one), as natively each is one edge for an edge-triggered
/// epoll item: the first sets NATIVE_QUEUED, which is its event; the next ones leave
/// the flag set and count their own. Two for one client would be two edges for a
/// guest looking between them.
#[test]
fn each_native_arrival_is_one_event() {
    let d = TestDaemon::start(&[]);
    let (mut g, granted) = native_guest(&d);
    assert!(granted);
    let (l, port) = tcp_listener(&mut g);
    let seq = |g: &TestGuest| {
        g.entry(l)
            .event_seq
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    let before = seq(&g);
    let mut clients = Vec::new();
    for n in 1..=3u32 {
        clients.push(TcpStream::connect(("127.0.0.1", port)).unwrap());
        g.wait_until("the arrival's event", || seq(&g).wrapping_sub(before) >= n);
        // Long enough for a second count of the same arrival to show.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(seq(&g).wrapping_sub(before), n, "events after {n} clients");
    }
    assert_ne!(g.flags(l) & sock_flag::NATIVE_QUEUED, 0);
}
