//! send/recv entry points: stream or datagram path by socket kind.
use crate::sock::core::dead_err;
use crate::sock::core::epipe;
use crate::sock::core::RecvMeta;
use crate::sock::core::Sock;
use crate::sock::dgram::recv_dgram;
use crate::sock::dgram::send_dgram;
use crate::sock::stream::recv_stream;
use crate::sock::stream::send_stream;
use canal_abi::addr::CanalAddr;
use canal_abi::sock_kind;
use libc::c_int;
use libc::iovec;

/// send/sendto/write/writev.
pub(crate) fn send(
    s: Sock,
    iov: &[iovec],
    flags: c_int,
    to: Option<&CanalAddr>,
) -> Result<usize, i32> {
    send_msg(s, iov, flags, to, &[])
}

/// sendmsg: `control` holds the control messages a datagram carries (checked by
/// `ancillary::outgoing`); a stream's are not carried (docs/compat.md).
pub(crate) fn send_msg(
    s: Sock,
    iov: &[iovec],
    flags: c_int,
    to: Option<&CanalAddr>,
    control: &[u8],
) -> Result<usize, i32> {
    dead_err(s.g, true)?;
    if flags & libc::MSG_OOB != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    match s.kind() {
        sock_kind::DGRAM => send_dgram(s, iov, flags, to, control),
        sock_kind::STREAM if flags & libc::MSG_FASTOPEN != 0 => {
            // TCP Fast Open (sendto/sendmsg with an address on an unconnected socket):
            // connect, then send, as the kernel does without a cookie: a blocking
            // socket returns what it sent; a non-blocking one EINPROGRESS with nothing
            // sent (the program sends again once connected). No address: EINVAL; a
            // connected or connecting socket: EISCONN / EALREADY.
            let a = to.ok_or(libc::EINVAL)?;
            crate::sock::control::connect(s, a)?;
            send_stream(s, iov, flags & !libc::MSG_FASTOPEN)
        }
        // Linux ignores the address on a connected TCP socket (EISCONN only for TCP
        // Fast Open); we do the same.
        sock_kind::STREAM => send_stream(s, iov, flags),
        // A listening socket: not connected.
        _ => Err(epipe(flags)),
    }
}

/// recv/recvfrom/recvmsg/read/readv.
pub(crate) fn recv(
    s: Sock,
    iov: &[iovec],
    flags: c_int,
    meta: &mut RecvMeta,
) -> Result<usize, i32> {
    if s.kind() != sock_kind::DGRAM {
        // A datagram socket reports canald's death once (sock/dead.rs, in recv_dgram).
        dead_err(s.g, true)?;
    }
    if flags & libc::MSG_OOB != 0 {
        return Err(libc::EINVAL);
    }
    // The error queue (IP_RECVERR's extended errors, transmit timestamps) is not
    // carried: it reads as empty, as the kernel's does, never blocking and never
    // taking a datagram or stream bytes in its place. Errors still reach the program
    // through its next call and SO_ERROR (docs/compat.md "error queue").
    if flags & libc::MSG_ERRQUEUE != 0 {
        return Err(libc::EAGAIN);
    }
    match s.kind() {
        sock_kind::DGRAM => recv_dgram(s, iov, flags, meta),
        sock_kind::STREAM => recv_stream(s, iov, flags),
        _ => Err(libc::ENOTCONN),
    }
}
