//! socket(): the table entry, the dummy descriptor the program holds, and arming it.
use crate::conn::guest::Guest;
use crate::conn::request::request;
use crate::fdtable::TABLE;
use crate::sock::core::Sock;
use crate::sys;
use canal_abi::op;
use canal_abi::sync::Ordering;
use libc::c_int;

/// A fresh dummy descriptor, so numbers never collide and fstat says S_IFSOCK.
///
/// With canald's WATCH feature it is one end of a Unix stream socketpair; the other end
/// (returned second) goes to canald (`arm`), which closes the socket when the kernel
/// says the last copy of this end is gone — after close, `_exit`, kill or exec, in any
/// process (docs/architecture.md). This end is shut for reading and non-blocking, so a
/// program that inherits it over exec without knowing it reads EOF and gets EAGAIN
/// on writes instead of hanging (docs/compat.md). Without the feature: a lone AF_UNIX
/// datagram socket, and the second value is -1.
pub(crate) fn dummy(g: &Guest, cloexec: bool) -> Result<(c_int, c_int), i32> {
    let ce = if cloexec { libc::SOCK_CLOEXEC } else { 0 };
    let (fd, peer) = if crate::conn::ctl::watch_enabled(g) {
        let mut sv = [-1 as c_int; 2];
        // SAFETY: sv is a writable array of two ints.
        sys::check(unsafe {
            libc::syscall(
                libc::SYS_socketpair,
                libc::AF_UNIX as libc::c_long,
                (libc::SOCK_STREAM | libc::SOCK_NONBLOCK | ce) as libc::c_long,
                0 as libc::c_long,
                sv.as_mut_ptr(),
            )
        })?;
        // The peer end must not leak into children: close-on-exec while we hold it
        // (already, when the program asked for SOCK_CLOEXEC: both ends got it).
        if ce == 0 {
            let _ = sys::fcntl_int(sv[1], libc::F_SETFD, libc::FD_CLOEXEC as libc::c_long);
        }
        // SAFETY: shutting down our own fresh socket.
        unsafe {
            libc::syscall(
                libc::SYS_shutdown,
                sv[0] as libc::c_long,
                libc::SHUT_RD as libc::c_long,
            )
        };
        (sv[0], sv[1])
    } else {
        (sys::socket(libc::AF_UNIX, libc::SOCK_DGRAM | ce, 0)?, -1)
    };
    if fd as usize >= TABLE.capacity() {
        let _ = sys::close(fd);
        if peer >= 0 {
            let _ = sys::close(peer);
        }
        return Err(libc::EMFILE);
    }
    Ok((fd, peer))
}

/// Hands the dummy's other end to canald for `handle` (WATCH) and closes our copy.
pub(crate) fn arm(g: &Guest, handle: u32, peer: c_int) {
    if peer >= 0 {
        crate::conn::ctl::send_watch(g, handle, peer);
        let _ = sys::close(peer);
    }
}

/// A fresh AF_INET stream socket from the header's spare ring (feature SPARES), taken
/// without a request; None when the ring is empty (or the feature is off).
fn take_spare(g: &Guest) -> Option<u32> {
    let h = g.region.header();
    if h.features & canal_abi::feature::SPARES == 0 {
        return None;
    }
    // A spare makes no request, so nothing else would notice a canald that died (its
    // sockets would fail later, one by one): a new socket must fail now (ENETDOWN).
    if crate::conn::guest::control_hung_up(g) {
        crate::conn::guest::mark_dead();
        return None;
    }
    loop {
        let head = h.spare_head.load(Ordering::Acquire);
        if h.spare_tail.load(Ordering::Acquire) == head {
            return None;
        }
        let handle = h.spares[head as usize % canal_abi::SPARES].load(Ordering::Relaxed);
        if h.spare_head
            .compare_exchange(
                head,
                head.wrapping_add(1),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            return Some(handle);
        }
    }
}

/// socket(2) for a supported (domain, type, protocol); `base` is SOCK_STREAM/DGRAM.
pub(crate) fn socket(
    g: &'static Guest,
    domain: c_int,
    base: c_int,
    proto: c_int,
    nonblock: bool,
    cloexec: bool,
) -> Result<c_int, i32> {
    let (fd, peer) = dummy(g, cloexec)?;
    let tcp4 = domain == libc::AF_INET
        && base == libc::SOCK_STREAM
        && (proto == 0 || proto == libc::IPPROTO_TCP);
    // A spare canald no longer has (cannot happen with an honest host) falls back to
    // the request.
    let spare = tcp4
        .then(|| take_spare(g))
        .flatten()
        .filter(|&h| Sock::new(g, h).is_ok_and(|s| s.kind() == canal_abi::sock_kind::STREAM));
    let r = match spare {
        Some(h) => Ok((h as i64, 0)),
        None => request(
            g,
            op::SOCKET,
            0,
            [domain as u64, base as u64, proto as u64, 0],
            &[],
            &mut [],
        ),
    };
    let handle = match r {
        Ok((h, _)) => h as u32,
        Err(e) => {
            let _ = sys::close(fd);
            let _ = (peer >= 0).then(|| sys::close(peer));
            return Err(e);
        }
    };
    let s = match Sock::new(g, handle) {
        Ok(s) => s,
        Err(e) => {
            let _ = sys::close(fd);
            let _ = (peer >= 0).then(|| sys::close(peer));
            return Err(e);
        }
    };
    crate::sock::core::init_guest_line(s.e, nonblock, None);
    arm(g, handle, peer);
    let _ = TABLE.set_canal(fd, handle);
    crate::rt::debug!(g, "canal: socket fd {fd} -> handle {handle:#x}\n");
    Ok(fd)
}

// ---- control operations ---------------------------------------------------------------
