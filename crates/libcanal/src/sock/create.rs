//! socket(): the table entry and the dummy descriptor the program holds (`watch`).
use crate::conn::guest::Guest;
use crate::conn::request::request;
use crate::fdtable::TABLE;
use crate::sock::core::Sock;
use crate::sys;
use canal_abi::op;
use canal_abi::sync::Ordering;
use libc::c_int;

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
    let (fd, peer) = crate::sock::watch::dummy(g, cloexec)?;
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
    crate::sock::names::forget(handle);
    let _ = TABLE.set_canal(fd, handle);
    crate::sock::watch::created(g, handle, fd, peer);
    crate::rt::debug!(g, "canal: socket fd {fd} -> handle {handle:#x}\n");
    Ok(fd)
}

// ---- control operations ---------------------------------------------------------------
