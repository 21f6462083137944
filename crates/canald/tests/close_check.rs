//! CLOSE_CHECK (protocol §2, minor 19): a guest that closed its last descriptor of a
//! shared listener asks canald to look at the listener's WATCH at once. canald closes
//! only a socket of the asking guest whose WATCH has hung up; the address is free when
//! the reply comes.
mod common;
use canal_abi::control::kind;
use canal_abi::op;
use common::*;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

/// CLOSE_CHECK for `handle`: canald's `closed` word.
fn close_check(g: &TestGuest, handle: u32) -> u32 {
    let (k, body, fds) = ctl_call(&g.ctl, kind::CLOSE_CHECK, &handle.to_le_bytes(), &[])
        .expect("CLOSE_CHECK answered");
    assert_eq!(k, kind::CLOSE_CHECK_OK);
    assert!(fds.is_empty());
    assert_eq!(&body[..4], &handle.to_le_bytes());
    u32::from_le_bytes(body[4..8].try_into().unwrap())
}

/// Arms socket `h`'s WATCH as the library does: canald gets one end, the guest keeps
/// the other (returned: its copies are the guest's descriptors of the socket).
fn watch(g: &mut TestGuest, h: u32) -> UnixStream {
    let (mine, theirs) = UnixStream::pair().unwrap();
    send_ctl(&g.ctl, kind::WATCH, &h.to_le_bytes(), &[theirs.as_raw_fd()]);
    mine
}

#[test]
fn close_check_closes_only_a_listener_no_descriptor_holds() {
    let d = TestDaemon::start(&[]);
    let mut a = TestGuest::attach(&d.path, "holder");
    let (l, port) = tcp_listener(&mut a);
    let end = watch(&mut a, l);
    // A second process's copy.
    let copy = end.try_clone().unwrap();
    // Held: nothing changes, and the listener still takes clients.
    assert_eq!(close_check(&a, l), 0);
    drop(end);
    assert_eq!(close_check(&a, l), 0, "one copy is still open");
    assert!(TcpStream::connect(("127.0.0.1", port)).is_ok());
    // Another guest naming the same handle names nothing of its own.
    let b = TestGuest::attach(&d.path, "other");
    drop(copy);
    assert_eq!(close_check(&b, l), 0);
    // The last copy gone: by the time the reply comes (whether this check or canald's
    // own look at the hang-up closed it) the port is closed and free, as natively after
    // close() returns.
    let closed = close_check(&a, l);
    assert!(closed <= 1);
    let refused = TcpStream::connect(("127.0.0.1", port));
    assert_eq!(
        refused.err().map(|e| e.kind()),
        Some(std::io::ErrorKind::ConnectionRefused)
    );
    assert!(TcpListener::bind(("127.0.0.1", port)).is_ok());
    // A stale handle (that socket is gone) answers 0.
    assert_eq!(close_check(&a, l), 0);
    assert_eq!(a.request(op::NOP, 0, [0; 4], &[]).0, 0, "canald answers");
}
