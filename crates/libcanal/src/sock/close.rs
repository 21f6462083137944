//! Dropping references: the last one closes the socket (after SO_LINGER's wait, if set).
use crate::conn::guest::Guest;
use crate::conn::request::request;
use crate::conn::wait::Wait;
use crate::sock::core::Sock;
use crate::sock::opts::getsockopt;
use crate::sys;
use canal_abi::op;
use canal_abi::sock_kind;
use canal_abi::sync::Ordering;

/// SO_LINGER {1, N > 0}: a close blocks until the transmit ring has drained (canald
/// has handed every byte to the host socket) or N seconds passed, as a lingering
/// close blocks natively (regardless of O_NONBLOCK). canald itself never lingers.
/// Short-circuited streams (rings in a pair segment) do not wait.
fn linger_before_close(s: &Sock) {
    let word = s.e.linger.load(Ordering::Relaxed);
    if word <= 1 || s.kind() != sock_kind::STREAM || s.e.segment.load(Ordering::Acquire) != 0 {
        return;
    }
    let secs = i64::from(word - 1).min(i64::MAX / 1_000_000_000);
    let deadline = sys::now_ns().saturating_add(secs * 1_000_000_000);
    let e = s.e;
    let over = || {
        let flags = e.flags.load(Ordering::Acquire);
        let done = canal_abi::sock_flag::TX_CLOSED | canal_abi::sock_flag::ERROR;
        flags & done != 0
    };
    let r = crate::conn::wait::wait_until(s.g, s.idx, Some(deadline), || {
        over() || e.tx_tail.load(Ordering::Acquire) == e.tx_head.load(Ordering::Relaxed)
    });
    if !matches!(r, Wait::Ready) {
        return;
    }
    // The ring is empty; natively the close waits until the peer has acknowledged
    // every byte: ask the host socket (TCP_INFO: unacked segments, bytes not sent).
    let mut info = [0u8; 160];
    while sys::now_ns() < deadline && !over() {
        match getsockopt(*s, libc::IPPROTO_TCP, libc::TCP_INFO, &mut info) {
            Ok(n) if n >= 148 => {
                let word =
                    |o: usize| u32::from_ne_bytes([info[o], info[o + 1], info[o + 2], info[o + 3]]);
                if word(TCPI_UNACKED) == 0 && word(TCPI_NOTSENT_BYTES) == 0 {
                    return;
                }
            }
            _ => return,
        }
        sys::sleep_ns(2_000_000);
    }
}

/// Offsets in Linux's `struct tcp_info` (include/uapi/linux/tcp.h).
const TCPI_UNACKED: usize = 24;

const TCPI_NOTSENT_BYTES: usize = 144;

/// Entries a table must still have never used for a close to go without CLOSE: then
/// no `socket` or `accept` can find the table full before canald has seen the close.
const ASYNC_CLOSE_ROOM: u32 = 64;

/// Whether the last close of `s` needs no CLOSE round trip once something else tells
/// canald: a connected stream, not lingering, in a table far from full. Listeners
/// and datagram sockets keep the synchronous CLOSE: a program may bind their address
/// again right after closing them. (An older canald sets no `entries_used`, so the
/// bound is then the whole table: never room.)
fn closes_without_request(s: &Sock) -> bool {
    s.kind() == sock_kind::STREAM
        && s.flags() & canal_abi::sock_flag::CONNECTED != 0
        && s.e.linger.load(Ordering::Relaxed) == 0
        && s.g.region.entries_in_use_bound() + ASYNC_CLOSE_ROOM <= s.g.region.layout().socket_count
}

/// Such a stream whose WATCH canald holds (WATCHED): the hang-up of our descriptor's
/// last copy, which the caller is about to close, closes it as CLOSE would.
fn close_by_watch(s: &Sock) -> bool {
    s.flags() & canal_abi::sock_flag::WATCHED != 0 && closes_without_request(s)
}

/// Such a stream in a process whose sockets have lone dummies (feature CLOSE_MARK,
/// `sock::watch`: no WATCH; nothing else holds a copy of its descriptors): a close
/// mark tells canald.
fn close_by_mark(s: &Sock) -> bool {
    crate::sock::watch::marked() && closes_without_request(s)
}

/// Whether a socket this process just let go of, whose reference count says other
/// holders remain, should be checked once the descriptor is closed (control
/// CLOSE_CHECK): a listener or a datagram socket, whose address a program may use the
/// moment its close returns, in a process whose sockets are watched (`sock::watch`:
/// shared with processes that may have ended without closing it, `_exit` or a signal,
/// their references still counted). Not the WATCHED flag: canald may not have set it
/// yet, but the WATCH went first on the control connection, so canald holds it when
/// it reads CLOSE_CHECK. Connected streams need no check: their close is the FIN,
/// which the WATCH's hang-up sends as soon as canald sees it.
fn worth_asking(g: &Guest, s: &Sock, others: u32) -> bool {
    let flags = s.flags();
    others > 0
        && g.region.header().features & canal_abi::feature::CLOSE_CHECK != 0
        && !crate::sock::watch::marked()
        && (flags & canal_abi::sock_flag::LISTENING != 0 || s.kind() == sock_kind::DGRAM)
        && !crate::conn::guest::is_dead(g)
}

/// After `release` said so and the descriptor is closed: asks canald to close the
/// socket now if no descriptor of it is left anywhere (its WATCH hung up). If one is,
/// the socket closes as before, by the last holder's close or by its WATCH.
pub(crate) fn close_if_unheld(g: &'static Guest, handle: u32) {
    let _ = crate::conn::ctl::ctl_close_check(g, handle);
}

/// Drops one descriptor's reference; the last one sends CLOSE (or lets the WATCH
/// close it, `close_by_watch`, or marks it closed, `close_by_mark`). Returns true
/// when the caller, once it has closed the descriptor, should call
/// `close_if_unheld` (`worth_asking`).
pub(crate) fn release(g: &'static Guest, handle: u32) -> bool {
    let Ok(s) = Sock::new(g, handle) else {
        return false;
    };
    if crate::sock::native::applies(s.flags()) {
        crate::sock::native::forget_unused(handle);
    }
    // Before our references go: from then on the other end's close may find no live
    // socket naming the segment, and must not unmap it under the uses below.
    let hold = crate::shortcut::seg::Hold::new();
    let prev =
        s.e.refs
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |r| {
                Some(r.saturating_sub(1))
            })
            .unwrap_or(1);
    if prev <= 1 {
        crate::policy::forget(handle);
        crate::conn::sleep::wake_local(g, s.idx);
        let seg = s.e.segment.load(Ordering::Acquire);
        if seg != 0 && s.kind() == sock_kind::STREAM && !crate::conn::guest::is_dead(g) {
            if let Ok(r) = s.rings() {
                r.fin_on_close(&s);
            }
        }
        drop(hold);
        if !crate::conn::guest::is_dead(g) && !close_by_watch(&s) {
            if close_by_mark(&s) {
                // The mark before the attention bit (its Release): canald reads it
                // when it serves the bit, and closes the socket in that round.
                s.e.close_mark.store(handle, Ordering::Release);
                crate::conn::request::attention(g, s.idx);
            } else {
                linger_before_close(&s);
                let _ = request(g, op::CLOSE, handle, [0; 4], &[], &mut []);
            }
        }
        crate::shortcut::seg::forget(g, seg);
        crate::rt::debug!(g, "canal: close handle {handle:#x}\n");
        return false;
    }
    worth_asking(g, &s, prev - 1)
}

/// `release` for a descriptor the kernel has already closed (replaced by dup2, closed
/// by exec): the check, if any, follows at once.
pub(crate) fn release_closed(g: &'static Guest, handle: u32) {
    if release(g, handle) {
        close_if_unheld(g, handle);
    }
}

/// One more descriptor refers to the socket (dup, fcntl F_DUPFD).
pub(crate) fn add_ref(g: &'static Guest, handle: u32) {
    if let Ok(s) = Sock::new(g, handle) {
        s.e.refs.fetch_add(1, Ordering::Relaxed);
    }
}

// ---- data path --------------------------------------------------------------------------

/// Drops the reference the current call took while sleeping, if any (the last one
/// closes the socket, as the kernel does when the in-flight call releases the file).
pub(crate) fn unpin() {
    if let Some(p) = crate::conn::pin::take_pinned() {
        let g = crate::conn::guest::guest();
        // While the program still holds the call's descriptor, the pin was not this
        // process's last hold: only its reference goes. `release` would also look for
        // the process's other descriptors (a scan of the descriptor table) and ask
        // canald whether the socket is still held (a round trip): per blocked call,
        // which a forked accept server pays on every connection.
        let ask = match g {
            Some(g) if !(p.program_holds() && drop_extra_ref(g, p.handle)) => release(g, p.handle),
            _ => false,
        };
        if p.copy >= 0 {
            crate::conn::pin::close_pin(p.copy);
        }
        if let (true, Some(g)) = (ask, g) {
            close_if_unheld(g, p.handle);
        }
    }
}

/// Drops one reference of `handle` that is not its last (false, and nothing done, if
/// it would be).
fn drop_extra_ref(g: &'static Guest, handle: u32) -> bool {
    Sock::new(g, handle).is_ok_and(|s| {
        s.e.refs
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |r| {
                (r > 1).then(|| r - 1)
            })
            .is_ok()
    })
}
