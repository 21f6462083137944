//! Control-socket messages after attach: framing (SEQPACKET with passed descriptors),
//! wake-up ports (PORT), pair segments (SEGMENT) and watches (WATCH).
use crate::conn::guest::ctl_lock;
use crate::conn::guest::ctl_unlock;
use crate::conn::guest::is_dead;
use crate::conn::guest::mark_dead;
use crate::conn::guest::Guest;
use crate::rt::debug;
use crate::sys;
use canal_abi::control;
use canal_abi::control::kind as ck;
use canal_abi::control::CTL_HEADER;
use canal_abi::feature;
use canal_abi::MAX_WORKERS;
use libc::c_int;

/// Sends one control message, optionally with one descriptor.
pub(crate) fn send_msg(fd: c_int, kind: u16, body: &[u8], pass: c_int) -> Result<(), i32> {
    let mut msg = [0u8; 64];
    let n = CTL_HEADER + body.len();
    msg[..CTL_HEADER].copy_from_slice(&control::encode_header(kind, body.len() as u32));
    msg[CTL_HEADER..n].copy_from_slice(body);
    let mut iov = libc::iovec {
        iov_base: msg.as_mut_ptr() as *mut _,
        iov_len: n,
    };
    #[repr(C)]
    struct Cmsg {
        h: libc::cmsghdr,
        fd: c_int,
        pad: c_int,
    }
    // SAFETY: plain data.
    let mut cm: Cmsg = unsafe { core::mem::zeroed() };
    // SAFETY: msghdr is plain data.
    let mut mh: libc::msghdr = unsafe { core::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    if pass >= 0 {
        // SAFETY: CMSG_LEN is pure arithmetic.
        cm.h.cmsg_len = unsafe { libc::CMSG_LEN(4) } as usize;
        cm.h.cmsg_level = libc::SOL_SOCKET;
        cm.h.cmsg_type = libc::SCM_RIGHTS;
        cm.fd = pass;
        mh.msg_control = &mut cm as *mut Cmsg as *mut _;
        // SAFETY: CMSG_SPACE is pure arithmetic.
        mh.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as usize;
    }
    // SAFETY: mh points to live iovec/cmsg buffers for the duration of the call.
    let r = sys::check(unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_sendmsg,
            fd as libc::c_long,
            &mh as *const libc::msghdr,
            libc::MSG_NOSIGNAL as libc::c_long,
        )
    })?;
    if r != n {
        return Err(libc::EPROTO);
    }
    Ok(())
}

/// Receives one control message; returns (kind, total bytes, descriptors received).
pub(crate) fn recv_msg(
    fd: c_int,
    buf: &mut [u8],
    fds: &mut [c_int],
) -> Result<(u16, usize, usize), i32> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut _,
        iov_len: buf.len(),
    };
    // Room for MAX_WORKERS descriptors (DOORBELLS_OK).
    let mut cbuf = [0u64; 16];
    // SAFETY: msghdr is plain data.
    let mut mh: libc::msghdr = unsafe { core::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf.as_mut_ptr() as *mut _;
    mh.msg_controllen = core::mem::size_of_val(&cbuf);
    // SAFETY: mh points to live buffers for the duration of the call.
    let n = sys::check(unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_recvmsg,
            fd as libc::c_long,
            &mut mh as *mut libc::msghdr,
            libc::MSG_CMSG_CLOEXEC as libc::c_long,
        )
    })?;
    let mut nfds = 0;
    // SAFETY: walking the control buffer the kernel filled, with the libc macros that
    // bound every header by msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&mh);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const c_int;
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    let f = core::ptr::read_unaligned(data.add(i));
                    if nfds < fds.len() {
                        fds[nfds] = f;
                        nfds += 1;
                    } else {
                        let _ = sys::close(f);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&mh, c);
        }
    }
    if n == 0 {
        return Err(libc::ECONNRESET);
    }
    let (kind, _) = control::decode(&buf[..n]).ok_or(libc::EPROTO)?;
    Ok((kind, n, nfds))
}

/// Whether canald takes WATCH messages (kernel-counted socket liveness).
pub(crate) fn watch_enabled(g: &Guest) -> bool {
    g.ctl() >= 0 && g.region.header().features & feature::WATCH != 0
}

/// WATCH: hands `end` (the other end of a socket's dummy descriptor) to canald.
/// No reply; a failure only loses the backstop (the reference count still works).
pub(crate) fn send_watch(g: &Guest, handle: u32, end: c_int) {
    if crate::ownfd::using(|| send_msg(g.ctl(), ck::WATCH, &handle.to_le_bytes(), end)).is_err() {
        debug!(g, "canal: WATCH for handle {handle:#x} failed\n");
    }
}

/// One request/reply exchange on the control socket, serialised among all threads and
/// processes sharing it: sends `kind` with `body` (and `fd` if ≥ 0), then reads replies
/// until `accept(kind, body, fds)` takes one. Descriptors of replies it does not take
/// are closed; an ERROR reply ends the exchange with its errno; other replies are stale
/// ones (a process that died mid-exchange) and are skipped. A reset connection marks
/// canald dead.
pub(crate) fn ctl_exchange<T>(
    g: &Guest,
    kind: u16,
    body: &[u8],
    fd: c_int,
    mut accept: impl FnMut(u16, &[u8], &[c_int]) -> Option<T>,
) -> Result<T, i32> {
    if is_dead(g) {
        return Err(libc::EIO);
    }
    ctl_lock(g);
    let r = (|| {
        send_msg(g.ctl(), kind, body, fd)?;
        let mut buf = [0u8; 256];
        let mut fds = [-1; MAX_WORKERS];
        loop {
            let (k, n, nfds) = recv_msg(g.ctl(), &mut buf, &mut fds)?;
            let reply = &buf[CTL_HEADER..n];
            if let Some(v) = accept(k, reply, &fds[..nfds]) {
                return Ok(v);
            }
            for f in fds.iter_mut().take(nfds) {
                let _ = sys::close(*f);
                *f = -1;
            }
            if k == ck::ERROR {
                let e = reply
                    .get(..4)
                    .map_or(libc::EIO, |b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                return Err(if e > 0 { e } else { libc::EIO });
            }
        }
    })();
    ctl_unlock(g);
    if matches!(r, Err(libc::ECONNRESET) | Err(libc::EPIPE)) {
        mark_dead();
    }
    r
}

/// Registers `efd` as the wake-up port of slot `idx` (PORT / PORT_OK).
pub(crate) fn register_port(g: &Guest, idx: u32, efd: c_int) -> Result<(), i32> {
    ctl_exchange(g, ck::PORT, &idx.to_le_bytes(), efd, |k, body, _| {
        (k == ck::PORT_OK && control::leading_u32(body) == Some(idx)).then_some(())
    })
}

/// Asks canald for pair segment `id` (SEGMENT / SEGMENT_OK): its memfd and size.
pub(crate) fn ctl_segment(g: &Guest, id: u32) -> Result<(c_int, u64), i32> {
    ctl_file(g, ck::SEGMENT, ck::SEGMENT_OK, id)
}

/// Asks canald for pair arena `id` (ARENA / ARENA_OK, protocol §8.7): its memfd and
/// size.
pub(crate) fn ctl_arena(g: &Guest, id: u32) -> Result<(c_int, u64), i32> {
    ctl_file(g, ck::ARENA, ck::ARENA_OK, id)
}

/// Registers `efd` as the calling thread's bell `tag` for the guest at the other side
/// of arena `arena` (BELL_SET / BELL_OK, protocol §8.8).
pub(crate) fn ctl_bell_set(g: &Guest, arena: u32, tag: u32, efd: c_int) -> Result<(), i32> {
    let bell = control::Bell { arena, tag };
    ctl_exchange(g, ck::BELL_SET, &bell.encode(), efd, |k, b, _| {
        (k == ck::BELL_OK && control::Bell::decode(b) == Some(bell)).then_some(())
    })
}

/// The bell that the guest at the other side of arena `arena` registered with `tag`
/// for us (BELL_GET / BELL_OK with the eventfd, protocol §8.8).
pub(crate) fn ctl_bell_get(g: &Guest, arena: u32, tag: u32) -> Result<c_int, i32> {
    let bell = control::Bell { arena, tag };
    ctl_exchange(g, ck::BELL_GET, &bell.encode(), -1, |k, b, fds| {
        let ok = k == ck::BELL_OK && control::Bell::decode(b) == Some(bell) && fds.len() == 1;
        ok.then(|| fds[0])
    })
}

/// Asks canald to hand socket `handle`'s host socket over (HOST_SOCKET /
/// HOST_SOCKET_OK): the kernel socket, or canald's errno and reason.
pub(crate) fn ctl_host_socket(g: &Guest, handle: u32) -> Result<c_int, (i32, String)> {
    socket_of(g, ck::HOST_SOCKET, ck::HOST_SOCKET_OK, handle)
}

/// LISTENER_SOCKET: a copy of NATIVE_ACCEPT listener `handle`'s host socket, which
/// this process accepts its native clients on (`sock::native`).
pub(crate) fn ctl_listener_socket(g: &Guest, handle: u32) -> Result<c_int, i32> {
    socket_of(g, ck::LISTENER_SOCKET, ck::LISTENER_SOCKET_OK, handle).map_err(|(e, _)| e)
}

/// Request `ask` naming socket `handle`, answered `ok` (the handle again) with one of
/// canald's host sockets: that socket, or canald's errno and reason.
fn socket_of(g: &Guest, ask: u16, ok: u16, handle: u32) -> Result<c_int, (i32, String)> {
    let r = ctl_exchange(g, ask, &handle.to_le_bytes(), -1, |k, b, fds| {
        if k == ck::ERROR && b.len() >= 4 {
            let e = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            return Some(Err((e, String::from_utf8_lossy(&b[4..]).into_owned())));
        }
        let answered = k == ok && control::leading_u32(b) == Some(handle);
        (answered && fds.len() == 1).then(|| Ok(fds[0]))
    });
    match r {
        Ok(v) => v,
        Err(e) => Err((e, "no answer from canald".into())),
    }
}

/// CLOSE_CHECK: closes socket `handle` now if its WATCH says no descriptor of it is
/// left (protocol §2). Ok(true) if canald closed it.
pub(crate) fn ctl_close_check(g: &Guest, handle: u32) -> Result<bool, i32> {
    ctl_exchange(g, ck::CLOSE_CHECK, &handle.to_le_bytes(), -1, |k, b, _| {
        let answered =
            k == ck::CLOSE_CHECK_OK && b.len() >= 8 && control::leading_u32(b) == Some(handle);
        answered.then(|| b[4..8] != [0; 4])
    })
}

/// DIRECTORY: the port directory's memfd and the size canald gives for it.
pub(crate) fn ctl_directory(g: &Guest) -> Result<(c_int, u64), i32> {
    ctl_exchange(g, ck::DIRECTORY, &[], -1, |k, body, fds| {
        let ok = k == ck::DIRECTORY_OK && body.len() >= 8 && fds.len() == 1;
        ok.then(|| {
            (
                fds[0],
                u64::from_le_bytes(body[..8].try_into().unwrap_or([0; 8])),
            )
        })
    })
}

/// A request for the memfd named `id` answered in the SEGMENT_OK shape.
fn ctl_file(g: &Guest, ask: u16, answer: u16, id: u32) -> Result<(c_int, u64), i32> {
    ctl_exchange(g, ask, &id.to_le_bytes(), -1, |k, body, fds| {
        let ok = k == answer
            && body.len() >= control::SEGMENT_OK_BODY
            && control::leading_u32(body) == Some(id)
            && fds.len() == 1;
        ok.then(|| {
            let size = u64::from_le_bytes(body[8..16].try_into().unwrap_or([0; 8]));
            (fds[0], size)
        })
    })
}
