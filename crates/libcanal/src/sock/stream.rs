//! The stream data path: bytes through the rings with no round trip when data or room
//! is there; waits otherwise.
use crate::conn::wait::wait_until;
use crate::conn::wait::Wait;
use crate::iov;
use crate::ready::local;
use crate::sock::core::dead_err;
use crate::sock::core::epipe;
use crate::sock::core::wait_err;
use crate::sock::core::Moved;
use crate::sock::core::Sock;
use canal_abi::ring::check_indices;
use canal_abi::ring::RingStorage;
use canal_abi::sock_flag as f;
use canal_abi::sync::AtomicU64;
use canal_abi::sync::Ordering;
use libc::c_int;
use libc::iovec;

/// A short-circuited stream whose peer closed in order (RX_EOF and TX_CLOSED, no
/// error), this end still open for writing, sending for the first time since: the
/// kernel's CLOSE_WAIT socket still accepts that send — the bytes go to the peer,
/// which has no socket left to read them and answers with a reset, so only a later
/// send fails (EPIPE). The bytes are dropped here, as there; the reset is recorded
/// (`local::RESET_SENT`: HUP in poll, and every later send fails) with the error the
/// kernel's tcp_reset gives a CLOSE_WAIT socket: EPIPE, pending (POLLERR, SO_ERROR
/// once; recv still says EOF first, as the FIN came first). A program that
/// writes a request on a kept-alive connection the server closed then sees the
/// failure where it reads the answer (EOF), as natively, instead of an EPIPE (and
/// SIGPIPE) on the write. Host-served streams need none of this: canald's host
/// socket behaves so itself.
/// `fin_word`: the peer's FIN word (§8.3) is set, which says its program closed the
/// connection before canald's flags say so.
fn first_send_after_peer_close(s: &Sock, fl: u32, fin_word: bool) -> bool {
    let peer_closed = f::RX_EOF | f::TX_CLOSED;
    if (fl & peer_closed != peer_closed && !fin_word)
        || fl & (f::ERROR | f::HUP | f::BROKEN) != 0
        || s.e.segment.load(Ordering::Relaxed) == 0
        || s.local() & (local::SHUT_WR | local::RESET_SENT) != 0
    {
        return false;
    }
    let was =
        s.e.guest_flags
            .fetch_or(local::RESET_SENT, Ordering::AcqRel);
    if was & local::RESET_SENT != 0 {
        return false;
    }
    // Only if no other error is pending (canald's, from the peer, would be newer).
    let _ = s.e.pending_error.compare_exchange(
        0,
        libc::EPIPE as u32,
        Ordering::AcqRel,
        Ordering::Relaxed,
    );
    // Its pollers see HUP and ERR now.
    crate::conn::sleep::wake_local(s.g, s.idx);
    true
}

// Its only caller is `data::send`: inlined there as when both were one module (a 64 B
// short-circuited round trip paid ~20 ns for the call otherwise; docs/bench/why.md).
#[inline(always)]
pub(crate) fn send_stream(s: Sock, iov: &[iovec], flags: c_int) -> Result<usize, i32> {
    let total = iov::total_len(iov)?;
    let nonblock = flags & libc::MSG_DONTWAIT != 0 || s.nonblocking();
    let mut sent = 0usize;
    let mut deadline = None;
    loop {
        dead_err(s.g, true)?;
        s.live()?;
        let fl = s.flags();
        let pe = s.take_error();
        if pe != 0 {
            return match (sent, pe as i32) {
                (0, libc::EPIPE) => Err(epipe(flags)), // SIGPIPE too, as sk_stream_error
                (0, e) => Err(e),
                _ => Ok(sent),
            };
        }
        if sent == 0 && total > 0 && first_send_after_peer_close(&s, fl, false) {
            return Ok(total);
        }
        // RESET_SENT: the reset is recorded before canald's flags may say the peer
        // closed (the FIN word says it first, and across workers much earlier).
        if fl & f::TX_CLOSED != 0
            || s.local() & (local::SHUT_WR | local::RESET_SENT) != 0
            || fl & (f::ERROR | f::HUP | f::BROKEN) != 0
        {
            return if sent > 0 {
                Ok(sent)
            } else {
                Err(epipe(flags))
            };
        }
        let connecting = fl & f::CONNECTING != 0 && fl & f::CONNECTED == 0;
        if fl & f::CONNECTED == 0 && !connecting {
            return if sent > 0 {
                Ok(sent)
            } else {
                Err(epipe(flags))
            };
        }
        if !connecting {
            // Resolved here, not before a connect completed: a short-circuit moves
            // the rings into a pair segment.
            let r = s.rings()?;
            if sent == 0
                && total > 0
                && r.peer_fin() != 0
                && first_send_after_peer_close(&s, fl, true)
            {
                return Ok(total);
            }
            let ring = r.tx;
            let size = RingStorage::size(&ring);
            let held = crate::shortcut::sidelock::enter_tx(s.e);
            let head = r.tx_head.load(Ordering::Relaxed);
            // The consumer's index as last read (a lower bound, §3.4): reading the real
            // one moves the consumer's cache line here, so only when the space known
            // to be free is not enough for the rest of this call.
            // R1 (in `other_index`): the consumer has finished reading the bytes whose
            // space we reuse.
            let want = (total - sent) as u64;
            let Ok(used) = other_index(
                &s.e.tx_tail_seen,
                r.tx_tail,
                |used| size - used >= want,
                |tail| check_indices(head, tail, size),
            ) else {
                crate::shortcut::sidelock::exit_tx(s.e, held);
                return Err(libc::EIO);
            };
            let mut n = ((size - used) as usize).min(total - sent);
            if n > 0 {
                // SAFETY: the iovecs are the application's buffers (its promise, as
                // with the kernel); the ring span head..head+n is free (checked).
                unsafe { iov::gather_into(&ring, head, iov, sent, n) };
                // R2: Release publishes the bytes; pairs with the consumer's Acquire.
                r.tx_head
                    .store(head.wrapping_add(n as u64), Ordering::Release);
            }
            // What does not fit the ring goes by zone buffers (protocol §10.4).
            if let Some((seg, peer_side)) = r.peer.filter(|(g, _)| g.has_zones()) {
                if sent + n < total {
                    let id = s.e.segment.load(Ordering::Relaxed);
                    // SAFETY: the iovecs are the application's buffers (as above).
                    let z = unsafe {
                        crate::shortcut::zones::send(
                            seg,
                            1 - peer_side,
                            id,
                            head.wrapping_add(n as u64),
                            iov,
                            sent + n,
                            total - sent - n,
                        )
                    };
                    match z {
                        Ok(k) => n += k,
                        Err(e) => {
                            crate::shortcut::sidelock::exit_tx(s.e, held);
                            return if sent + n > 0 { Ok(sent + n) } else { Err(e) };
                        }
                    }
                }
            }
            crate::shortcut::sidelock::exit_tx(s.e, held);
            if n > 0 {
                r.notify(&s, Moved::Sent);
                sent += n;
            }
            if sent == total {
                return Ok(sent);
            }
        }
        if nonblock {
            if !connecting && s.e.segment.load(Ordering::Relaxed) != 0 {
                s.e.guest_flags.fetch_or(local::NOSPACE, Ordering::Relaxed);
            }
            return if sent > 0 {
                Ok(sent)
            } else {
                Err(libc::EAGAIN)
            };
        }
        if deadline.is_none() {
            deadline = Some(s.deadline(false));
        }
        let w = wait_until(s.g, s.idx, deadline.flatten(), || {
            let st = s.snapshot();
            st.tx_free() > 0
                || st.pending_error != 0
                || st.flags & (f::TX_CLOSED | f::ERROR | f::HUP | f::BROKEN) != 0
                || (st.flags & f::CONNECTING == 0 && st.flags & f::CONNECTED == 0)
                || st.guest_flags & local::SHUT_WR != 0
                || (connecting && st.flags & f::CONNECTED != 0)
        });
        if w != Wait::Ready {
            return if sent > 0 {
                Ok(sent)
            } else {
                Err(wait_err(w, true))
            };
        }
    }
}

/// The ring's used bytes from the other side's index: from `seen`, its value as this
/// side last read it (a lower bound, §3.4), when `enough` accepts what that implies;
/// else from the real index `real`, read with Acquire (R1/R3: pairs with the other
/// side's Release, so what it implies is published or freed) and remembered in `seen`.
/// Called with the side's ring lock held (an earlier holder read `seen` the same way).
fn other_index(
    seen: &AtomicU64,
    real: &AtomicU64,
    enough: impl Fn(u64) -> bool,
    used_at: impl Fn(u64) -> Result<u64, canal_abi::ring::RingCorrupt>,
) -> Result<u64, canal_abi::ring::RingCorrupt> {
    if let Ok(used) = used_at(seen.load(Ordering::Relaxed)) {
        if enough(used) {
            return Ok(used);
        }
    }
    let now = real.load(Ordering::Acquire);
    let used = used_at(now)?;
    seen.store(now, Ordering::Relaxed);
    Ok(used)
}

/// Whether a receiver waiting on `s` (rings `r`, segment `seg` when it began) should
/// look again, read straight from the rings rather than through a whole snapshot (a
/// spinning wait polls this): `mark` bytes (SO_RCVLOWAT, 1 unless set), the peer's
/// end, an error, a local SHUT_RD, or the socket's rings changing under it (a connect
/// completing as a short-circuit). The caller's loop re-reads everything in order.
#[inline(always)]
fn recv_may_go_on(s: &Sock, r: &crate::sock::core::Rings, seg: u32, mark: u64) -> bool {
    let fl = s.flags() | r.peer_fin();
    r.rx_head
        .load(Ordering::Acquire)
        .wrapping_sub(r.rx_tail.load(Ordering::Relaxed))
        >= mark
        || r.rx_zone_pending()
        || fl & (f::RX_EOF | f::ERROR | f::HUP | f::BROKEN) != 0
        || fl & (f::CONNECTED | f::CONNECTING) == 0
        || s.e.pending_error.load(Ordering::Relaxed) != 0
        || s.local() & local::SHUT_RD != 0
        || s.e.segment.load(Ordering::Relaxed) != seg
}

/// A receive that found its ring empty (after `got` bytes): its answer if the
/// stream has nothing more to give — an error, the end, not connected — else None.
/// Inlined: a request/response receive comes here before every wait.
#[inline(always)]
fn recv_ended(s: &Sock, fl: u32, got: usize) -> Option<Result<usize, i32>> {
    // The reset a send after the peer's FIN provoked came after that FIN: the kernel's
    // recv says EOF (SOCK_DONE) and leaves the error.
    let after_fin = s.local() & local::RESET_SENT != 0
        && s.e.pending_error.load(Ordering::Relaxed) == libc::EPIPE as u32;
    let pe = if after_fin { 0 } else { s.take_error() };
    if pe != 0 {
        return Some(if got > 0 { Ok(got) } else { Err(pe as i32) });
    }
    if fl & (f::RX_EOF | f::ERROR | f::HUP | f::BROKEN) != 0 || s.local() & local::SHUT_RD != 0 {
        return Some(Ok(got));
    }
    if fl & (f::CONNECTED | f::CONNECTING) == 0 {
        return Some(if got > 0 {
            Ok(got)
        } else {
            Err(libc::ENOTCONN)
        });
    }
    None
}

/// Whether a blocking peek returns what it saw: the queue holds its `target`, the ring
/// is `full` (the target can never be queued), or what ends a receive's wait ends the
/// peek's (`recv_may_go_on`: an error is left for the next call, as the kernel's peek
/// leaves `sk_err`).
#[inline(always)]
fn peek_done(s: &Sock, r: &crate::sock::core::Rings, full: bool, target: usize) -> bool {
    full || recv_may_go_on(s, r, s.e.segment.load(Ordering::Relaxed), target as u64)
}

// Its only caller is `data::recv` (see `send_stream`).
#[inline(always)]
pub(crate) fn recv_stream(s: Sock, iov: &[iovec], flags: c_int) -> Result<usize, i32> {
    let total = iov::total_len(iov)?;
    let peek = flags & libc::MSG_PEEK != 0;
    let waitall = flags & libc::MSG_WAITALL != 0;
    // What a blocking receive waits for, as tcp_recvmsg's target: everything with
    // MSG_WAITALL, else SO_RCVLOWAT bytes (at most the buffer); a peek too (what it
    // sees counts: it waits until the queue holds the target, `peek_done`). A
    // non-blocking one returns what is there.
    // While short of it, a blocking receive sleeps until the queue holds the mark
    // (tcp_data_ready wakes a receiver only then, however much it has copied).
    let lowat = u64::from(s.e.rcvlowat.load(Ordering::Relaxed).max(1));
    let target = if waitall {
        total
    } else {
        (lowat as usize).min(total)
    };
    let discard = flags & libc::MSG_TRUNC != 0;
    let nonblock = flags & libc::MSG_DONTWAIT != 0 || s.nonblocking();
    let mut got = 0usize;
    let mut deadline = None;
    loop {
        dead_err(s.g, true)?;
        s.live()?;
        if total == 0 {
            return Ok(0);
        }
        // Flags before the indices (see snapshot); the rings are resolved each time
        // round (a connect may have completed as a short-circuit meanwhile).
        let r = s.rings()?;
        let ring = r.rx;
        let size = RingStorage::size(&ring);
        let held = crate::shortcut::sidelock::enter_rx(s.e);
        let tail = r.rx_tail.load(Ordering::Relaxed);
        // A short-circuit with zones: zone-sent pieces sit between ring bytes.
        let zone = r.peer.filter(|(g, _)| g.has_zones());
        // The producer's index as last read (a lower bound, §3.4): reading the real
        // one moves the producer's cache line here, so only when the bytes known to
        // be queued do not fill the rest of the caller's buffer.
        // R3 (in `other_index`): the bytes are there. Zones: always the real head.
        let want = (total - got) as u64;
        let Ok(used) = other_index(
            &s.e.rx_head_seen,
            r.rx_head,
            |used| zone.is_none() && used >= want,
            |head| check_indices(head, tail, size),
        ) else {
            crate::shortcut::sidelock::exit_rx(s.e, held);
            return Err(libc::EIO);
        };
        let head = tail.wrapping_add(used);
        let limit = match zone {
            Some((seg, dir)) => match crate::shortcut::zones::ring_limit(seg, dir, tail, head) {
                Ok(l) => l,
                Err(e) => {
                    crate::shortcut::sidelock::exit_rx(s.e, held);
                    return if got > 0 { Ok(got) } else { Err(e) };
                }
            },
            None => None,
        };
        if let (Some((seg, dir)), Some(0)) = (zone, limit) {
            let id = s.e.segment.load(Ordering::Relaxed);
            // SAFETY: the iovecs are the application's writable buffers.
            let z = unsafe {
                crate::shortcut::zones::recv_front(
                    seg,
                    dir,
                    id,
                    iov,
                    got,
                    total - got,
                    peek,
                    discard,
                )
            };
            crate::shortcut::sidelock::exit_rx(s.e, held);
            let n = match z {
                Ok(n) => n,
                Err(e) => return if got > 0 { Ok(got) } else { Err(e) },
            };
            if peek {
                return Ok(n);
            }
            got += n;
            if n > 0 {
                r.notify(&s, Moved::Received);
            }
            if got > 0 && got >= target {
                return Ok(got);
            }
            continue;
        }
        let n = (used.min(limit.unwrap_or(u64::MAX)) as usize).min(total - got);
        if n > 0 {
            if !discard {
                // SAFETY: the iovecs are the application's writable buffers; the ring
                // span tail..tail+n holds queued bytes (checked).
                unsafe { iov::scatter_from(&ring, tail, iov, got, n) };
            }
            if !peek {
                // R4: Release orders our reads before the producer may reuse the space.
                r.rx_tail
                    .store(tail.wrapping_add(n as u64), Ordering::Release);
            }
        }
        crate::shortcut::sidelock::exit_rx(s.e, held);
        if n > 0 && !peek {
            got += n;
            r.notify(&s, Moved::Received);
        } else if n > 0 && (nonblock || peek_done(&s, &r, used >= size, target)) {
            return Ok(n);
        }
        if got > 0 && got >= target {
            return Ok(got);
        }
        // A peek short of its target waits for more below, and then looks again.
        let short_peek = peek && n > 0;
        if !short_peek {
            // Nothing (more) queued: errors, then EOF.
            if !r.rx_drained() {
                continue;
            }
            if let Some(end) = recv_ended(&s, s.flags() | r.peer_fin(), got) {
                return end;
            }
            if nonblock {
                return if got > 0 { Ok(got) } else { Err(libc::EAGAIN) };
            }
        }
        let until = *deadline.get_or_insert_with(|| s.deadline(true));
        let seg = s.e.segment.load(Ordering::Relaxed);
        // A mark beyond the ring could never be met: a full ring counts (the kernel
        // wakes a receiver under memory pressure too). A peek's mark is its target:
        // the bytes it saw are still queued.
        let mark = if short_peek { target as u64 } else { lowat }.min(size);
        let w = wait_until(s.g, s.idx, until, || recv_may_go_on(&s, &r, seg, mark));
        if w != Wait::Ready {
            // What it saw: a peek's bytes stay queued, a receive's were copied.
            let seen = if short_peek { n } else { got };
            return if seen > 0 {
                Ok(seen)
            } else {
                Err(wait_err(w, true))
            };
        }
    }
}
