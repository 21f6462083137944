//! Control operations sent as requests: bind, listen, connect, shutdown, names, FIONREAD.
use crate::conn::request::request;
use crate::conn::wait::wait_until;
use crate::conn::wait::Wait;
use crate::ready::local;
use crate::sock::core::dead_err;
use crate::sock::core::wait_err;
use crate::sock::core::Sock;
use canal_abi::addr::CanalAddr;
use canal_abi::addr::ADDR_SIZE;
use canal_abi::canal_opt;
use canal_abi::op;
use canal_abi::ring::Consumer;
use canal_abi::sock_flag as f;
use canal_abi::sock_kind;
use canal_abi::sync::Ordering;
use libc::c_int;

pub(crate) fn bind(s: Sock, a: &CanalAddr) -> Result<(), i32> {
    dead_err(s.g, false)?;
    request(s.g, op::BIND, s.handle, [0; 4], &a.encode(), &mut [])?;
    s.e.guest_flags.fetch_or(local::BOUND, Ordering::Relaxed);
    Ok(())
}

pub(crate) fn listen(s: Sock, backlog: c_int) -> Result<(), i32> {
    dead_err(s.g, false)?;
    request(
        s.g,
        op::LISTEN,
        s.handle,
        [backlog.max(0) as u64, 0, 0, 0],
        &[],
        &mut [],
    )?;
    // Its twin now, not at the first accept: readiness looks at it (sock::native).
    if crate::sock::native::applies(s.flags()) {
        crate::sock::native::prefetch(&s);
    }
    Ok(())
}

/// connect(2) on a stream socket follows the kernel's two-level state: the socket
/// layer stays "connecting" after a connect that returned EINPROGRESS (or timed out,
/// or was interrupted) until connect is called again, so a second connect returns 0
/// once the handshake is done, EALREADY while it runs, or the error; only then does
/// EISCONN follow. `local::CONNECT_PENDING` is that socket-layer state.
/// connect(AF_UNSPEC), the kernel's `disconnect`: on a datagram socket the
/// association is dissolved (the local address stays), datagrams from anyone arrive
/// again; a listener stops, as shut down for reading (tcp_disconnect stops it the
/// same way); a stream not connected has nothing to undo. A connected stream is not
/// taken apart yet (Linux aborts the connection and the socket can connect again):
/// EAFNOSUPPORT, as before.
pub(crate) fn disconnect(s: Sock) -> Result<(), i32> {
    dead_err(s.g, false)?;
    match s.kind() {
        sock_kind::DGRAM => {
            request(s.g, op::CONNECT, s.handle, [1, 0, 0, 0], &[], &mut []).map(|_| ())
        }
        sock_kind::LISTENER => shutdown(s, libc::SHUT_RD),
        _ if s.flags() & (f::CONNECTED | f::CONNECTING) == 0 => Ok(()),
        _ => Err(libc::EAFNOSUPPORT),
    }
}

pub(crate) fn connect(s: Sock, a: &CanalAddr) -> Result<(), i32> {
    dead_err(s.g, false)?;
    if s.kind() == sock_kind::DGRAM {
        return request(s.g, op::CONNECT, s.handle, [0; 4], &a.encode(), &mut []).map(|_| ());
    }
    let fl = s.flags();
    let pending = s.local() & local::CONNECT_PENDING != 0;
    let closed = fl & (f::ERROR | f::HUP | f::BROKEN) != 0;
    let connecting = fl & f::CONNECTING != 0 && fl & f::CONNECTED == 0 && !closed;
    if pending {
        if !connecting {
            return finish_connect(s);
        }
        if s.nonblocking() {
            return Err(libc::EALREADY);
        }
        return wait_connect(s, libc::EALREADY);
    }
    if fl & f::CONNECTED != 0 {
        return Err(libc::EISCONN);
    }
    if connecting {
        return Err(libc::EALREADY);
    }
    // A listener reached ring to ring before: a ticket, no request (§8.10).
    if let Some(r) = crate::shortcut::fast::connect(&s, a) {
        return r;
    }
    // A connect that settled (loopback) or was paired comes with the socket's final
    // names (§4 Names), also when the answer is EINPROGRESS.
    let mut names = [0u8; canal_abi::names::NAMES_SIZE];
    let r = request(s.g, op::CONNECT, s.handle, [0; 4], &a.encode(), &mut names);
    if matches!(r, Ok(_) | Err(libc::EINPROGRESS)) {
        crate::sock::names::remember(s.handle, &names);
    }
    match r {
        Ok(_) => return Ok(()),
        Err(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    s.e.guest_flags
        .fetch_or(local::CONNECT_PENDING, Ordering::Relaxed);
    if s.nonblocking() {
        return Err(libc::EINPROGRESS);
    }
    wait_connect(s, libc::EINPROGRESS)
}

/// Waits for the handshake; `on_timeout` is what a timed-out wait reports.
fn wait_connect(s: Sock, on_timeout: i32) -> Result<(), i32> {
    let w = wait_until(s.g, s.idx, s.deadline(false), || {
        let fl = s.flags();
        fl & (f::CONNECTED | f::ERROR | f::HUP | f::BROKEN) != 0 || fl & f::CONNECTING == 0
    });
    match w {
        Wait::Ready => finish_connect(s),
        Wait::Timeout => Err(on_timeout),
        other => Err(wait_err(other, false)),
    }
}

/// The handshake is over: report its outcome once and leave the pending state.
fn finish_connect(s: Sock) -> Result<(), i32> {
    s.e.guest_flags
        .fetch_and(!local::CONNECT_PENDING, Ordering::Relaxed);
    let fl = s.flags();
    let pe = s.take_error();
    if pe != 0 {
        return Err(pe as i32);
    }
    // Established, then closed in order by the peer before we looked (HUP: both
    // directions over) is still a connect that succeeded, as natively (the kernel's
    // socket is in CLOSE_WAIT, and recv returns the peer's bytes, then EOF); only a
    // reset or a broken socket fails it.
    if fl & f::CONNECTED != 0 && fl & (f::ERROR | f::BROKEN) == 0 {
        Ok(())
    } else if fl & f::CONNECTED != 0 {
        Err(libc::ECONNRESET)
    } else {
        // The error was already collected (SO_ERROR), as Linux says then.
        Err(libc::ECONNABORTED)
    }
}

pub(crate) fn shutdown(s: Sock, how: c_int) -> Result<(), i32> {
    dead_err(s.g, false)?;
    let bits = match how {
        libc::SHUT_RD => local::SHUT_RD,
        libc::SHUT_WR => local::SHUT_WR,
        libc::SHUT_RDWR => local::SHUT_RD | local::SHUT_WR,
        _ => return Err(libc::EINVAL),
    };
    let r = request(
        s.g,
        op::SHUTDOWN,
        s.handle,
        [how as u64, 0, 0, 0],
        &[],
        &mut [],
    );
    match r {
        Ok(_) => {}
        // A socket that is not connected answers ENOTCONN, but the kernel shuts it
        // down all the same (inet_shutdown), so its later sends fail with EPIPE.
        Err(libc::ENOTCONN) if s.kind() != sock_kind::LISTENER => {}
        Err(e) => return Err(e),
    }
    // A listener keeps no shutdown state: SHUT_WR does nothing to it, SHUT_RD
    // disconnects it (canald clears LISTENING), and listen() starts it afresh.
    if s.kind() != sock_kind::LISTENER {
        s.e.guest_flags.fetch_or(bits, Ordering::Relaxed);
    }
    crate::conn::sleep::wake_local(s.g, s.idx);
    r.map(|_| ())
}

pub(crate) fn name(s: Sock, peer: bool) -> Result<CanalAddr, i32> {
    dead_err(s.g, false)?;
    if let Some(r) = crate::sock::names::kept(&s, peer) {
        return r;
    }
    // Room for both names: a connected stream's come together, as final (§4 Names).
    let mut out = [0u8; canal_abi::names::NAMES_SIZE];
    let o = if peer {
        op::GETPEERNAME
    } else {
        op::GETSOCKNAME
    };
    let (_, n) = request(s.g, o, s.handle, [0; 4], &[], &mut out)?;
    if n < ADDR_SIZE {
        return Err(libc::EIO);
    }
    let asked = CanalAddr::decode(&out[..ADDR_SIZE]).ok_or(libc::EIO)?;
    if n == out.len() {
        // The name asked for came first: the pair is kept local name first.
        let (first, second) = out.split_at(ADDR_SIZE);
        let (local, remote) = if peer {
            (second, first)
        } else {
            (first, second)
        };
        let mut pair = [0u8; canal_abi::names::NAMES_SIZE];
        pair[..ADDR_SIZE].copy_from_slice(local);
        pair[ADDR_SIZE..].copy_from_slice(remote);
        crate::sock::names::remember(s.handle, &pair);
    }
    Ok(asked)
}

/// Bytes SIOCOUTQ (or, with `not_sent`, SIOCOUTQNSD) reports: a short-circuited
/// socket's are those its peer has not read from the segment ring; a host socket's
/// are canald's count of its tx ring and host socket together (`canal_opt`), or the
/// ring alone from a canald without it.
pub(crate) fn outq(s: Sock, not_sent: bool) -> Result<c_int, i32> {
    let st = s.snapshot();
    if st.kind == sock_kind::LISTENER {
        return Err(libc::EINVAL); // as tcp_ioctl answers for a listener
    }
    let clamp = |n: u64| n.min(i32::MAX as u64) as c_int;
    if s.e.segment.load(Ordering::Acquire) != 0 {
        return Ok(clamp(st.tx_used));
    }
    dead_err(s.g, false)?;
    let name = if not_sent {
        canal_opt::OUTQ_NOT_SENT
    } else {
        canal_opt::OUTQ
    };
    let mut out = [0u8; 4];
    match request(
        s.g,
        op::GETSOCKOPT,
        s.handle,
        [canal_opt::LEVEL as u64, name as u64, 4, 0],
        &[],
        &mut out,
    ) {
        Ok((_, 4)) => Ok(i32::from_ne_bytes(out).max(0)),
        Ok(_) | Err(libc::ENOPROTOOPT) => Ok(clamp(s.snapshot().tx_used)),
        Err(e) => Err(e),
    }
}

/// Bytes FIONREAD reports: queued stream bytes, or the next datagram's size.
pub(crate) fn fionread(s: Sock) -> Result<c_int, i32> {
    let st = s.snapshot();
    if st.kind == sock_kind::LISTENER {
        return Err(libc::EINVAL); // as tcp_ioctl answers for a listener
    }
    if st.kind != sock_kind::DGRAM {
        return Ok(st.rx_used.min(i32::MAX as u64) as c_int);
    }
    let ring = s.rx_ring()?;
    let held = crate::shortcut::sidelock::enter_rx(s.e);
    let mut c = Consumer {
        storage: &ring,
        head_shared: &s.e.rx_head,
        tail_shared: &s.e.rx_tail,
        tail: s.e.rx_tail.load(Ordering::Relaxed),
    };
    let r = match c.next_record() {
        Ok(Some(i)) => Ok(i.len as c_int),
        Ok(None) => Ok(0),
        Err(_) => Err(libc::EIO),
    };
    crate::shortcut::sidelock::exit_rx(s.e, held);
    r
}
