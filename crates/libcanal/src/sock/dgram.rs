//! The datagram data path: one record per datagram in the rings.
use crate::conn::request::attention;
use crate::conn::wait::wait_until;
use crate::conn::wait::Wait;
use crate::iov;
use crate::ready::local;
use crate::sock::core::dead_err;
use crate::sock::core::epipe;
use crate::sock::core::wait_err;
use crate::sock::core::RecvMeta;
use crate::sock::core::Sock;
use canal_abi::addr::CanalAddr;
use canal_abi::addr::ADDR_SIZE;
use canal_abi::cmsg::MAX_CONTROL;
use canal_abi::feature::DGRAM_CONTROL;
use canal_abi::feature::DGRAM_MORE;
use canal_abi::ring::check_indices;
use canal_abi::ring::record_kind;
use canal_abi::ring::Consumer;
use canal_abi::ring::Producer;
use canal_abi::ring::RingStorage;
use canal_abi::sock_flag as f;
use canal_abi::sync::Ordering;
use libc::c_int;
use libc::iovec;

/// Largest UDP payload the kernel would take.
fn udp_max(family: u32) -> usize {
    if family == libc::AF_INET6 as u32 {
        65527
    } else {
        65507
    }
}

pub(crate) fn send_dgram(
    s: Sock,
    iov: &[iovec],
    flags: c_int,
    to: Option<&CanalAddr>,
    control: &[u8],
) -> Result<usize, i32> {
    let total = iov::total_len(iov)?;
    let nonblock = flags & libc::MSG_DONTWAIT != 0 || s.nonblocking();
    if s.local() & local::SHUT_WR != 0 {
        return Err(epipe(flags));
    }
    let connected = s.flags() & f::CONNECTED != 0;
    if to.is_none() && !connected {
        return Err(libc::EDESTADDRREQ);
    }
    // The address section: the destination (none on a connected socket), then, after
    // a 32-byte address (all zero for the connected peer), the control messages. An
    // older canald without DGRAM_CONTROL gets none.
    let features = s.g.region.header().features;
    let with_control = !control.is_empty() && features & DGRAM_CONTROL != 0;
    let enc = to.map(|a| a.encode());
    let section: [u8; ADDR_SIZE + MAX_CONTROL];
    let addr: &[u8] = match &enc {
        _ if with_control => {
            section = with_address(enc.unwrap_or([0; ADDR_SIZE]), control);
            &section[..ADDR_SIZE + control.len().min(MAX_CONTROL)]
        }
        Some(b) => &b[..],
        None => &[],
    };
    // MSG_MORE: a part the host socket holds for the next send (UDP_CORK is the
    // host socket's own option, set in order with the datagrams: canald sends what
    // was queued before it applies any request).
    let kind = if flags & libc::MSG_MORE != 0 && features & DGRAM_MORE != 0 {
        record_kind::DATAGRAM_MORE
    } else {
        record_kind::DATAGRAM
    };
    let ring = s.tx_ring()?;
    let size = RingStorage::size(&ring);
    if total > udp_max(s.e.family.load(Ordering::Relaxed))
        || total as u64 > canal_abi::ring::max_record_payload(size, addr.len() as u64)
    {
        return Err(libc::EMSGSIZE);
    }
    // Payload pieces without allocating for the common case.
    let mut small: [&[u8]; 16] = [&[]; 16];
    let mut big: Vec<&[u8]> = Vec::new();
    let parts: &[&[u8]] = if iov.len() <= small.len() {
        let mut k = 0;
        // SAFETY: the iovecs are the application's readable buffers, alive for the call.
        unsafe {
            iov::for_each_slice(iov, total, |p| {
                small[k] = p;
                k += 1;
            })
        };
        &small[..k]
    } else {
        // SAFETY: as above.
        unsafe { iov::for_each_slice(iov, total, |p| big.push(p)) };
        &big
    };
    let mut deadline = None;
    loop {
        dead_err(s.g, true)?;
        s.live()?;
        passed_on(&s)?;
        let pe = s.take_error();
        if pe != 0 {
            return Err(pe as i32);
        }
        let held = crate::shortcut::sidelock::enter_tx(s.e);
        let mut p = Producer {
            storage: &ring,
            head_shared: &s.e.tx_head,
            tail_shared: &s.e.tx_tail,
            head: s.e.tx_head.load(Ordering::Relaxed),
        };
        let r = p.push_record(kind, addr, parts);
        crate::shortcut::sidelock::exit_tx(s.e, held);
        match r {
            Err(_) => return Err(libc::EIO),
            Ok(true) => {
                attention(s.g, s.idx);
                return Ok(total);
            }
            Ok(false) => {}
        }
        if nonblock {
            return Err(libc::EAGAIN);
        }
        if deadline.is_none() {
            deadline = Some(s.deadline(false));
        }
        let need = canal_abi::ring::record_size(addr.len() as u64, total as u64);
        let w = wait_until(s.g, s.idx, deadline.flatten(), || {
            let head = s.e.tx_head.load(Ordering::Relaxed);
            let tail = s.e.tx_tail.load(Ordering::Acquire);
            record_fits(head, tail, size, need)
                || s.e.pending_error.load(Ordering::Relaxed) != 0
                || s.handed_over()
        });
        if w != Wait::Ready {
            return Err(wait_err(w, true));
        }
    }
}

/// An address section with control messages (`control` at most MAX_CONTROL bytes,
/// as `ancillary::outgoing` makes them).
fn with_address(addr: [u8; ADDR_SIZE], control: &[u8]) -> [u8; ADDR_SIZE + MAX_CONTROL] {
    let mut b = [0u8; ADDR_SIZE + MAX_CONTROL];
    b[..ADDR_SIZE].copy_from_slice(&addr);
    let n = control.len().min(MAX_CONTROL);
    b[ADDR_SIZE..ADDR_SIZE + n].copy_from_slice(&control[..n]);
    b
}

/// Writes a received record's control messages into recvmsg's buffer, if it gave
/// one, with MSG_CTRUNC where they did not all fit.
fn take_control(from_record: &[u8], meta: &mut RecvMeta) {
    if from_record.is_empty() {
        return;
    }
    let out = meta.control.map(|(p, n)| {
        // SAFETY: recvmsg's caller gave `n` writable bytes at `p` (msg_control).
        unsafe { core::slice::from_raw_parts_mut(p, n) }
    });
    let (n, cut) = crate::ancillary::deliver(from_record, out);
    meta.control_len = n;
    if cut {
        meta.msg_flags |= libc::MSG_CTRUNC;
    }
}

/// Whether a record of `need` bytes fits now, with the padding `push_record` would
/// put before it (records never wrap).
pub(crate) fn record_fits(head: u64, tail: u64, size: u64, need: u64) -> bool {
    let Ok(used) = check_indices(head, tail, size) else {
        return true; // corrupt: let push_record report it
    };
    let to_end = size - (head & (size - 1));
    let pad = if to_end < need { to_end } else { 0 };
    size - used >= pad + need
}

/// Another process passed the socket on (HANDED_OVER, handoff.rs): canald serves it no
/// more, and the call fails with EBADF, which the hook takes as its cue to follow the
/// socket to the kernel and make the call there (hooks/common.rs `dispatch!`) — also
/// for a non-blocking call, which must not answer EAGAIN from a ring nobody fills.
fn passed_on(s: &Sock) -> Result<(), i32> {
    if s.handed_over() {
        Err(libc::EBADF)
    } else {
        Ok(())
    }
}

pub(crate) fn recv_dgram(
    s: Sock,
    iov: &[iovec],
    flags: c_int,
    meta: &mut RecvMeta,
) -> Result<usize, i32> {
    let total = iov::total_len(iov)?;
    let peek = flags & libc::MSG_PEEK != 0;
    let nonblock = flags & libc::MSG_DONTWAIT != 0 || s.nonblocking();
    let ring = s.rx_ring()?;
    let mut deadline = None;
    loop {
        crate::sock::dead::check(
            &s,
            true,
            nonblock,
            *deadline.get_or_insert_with(|| s.deadline(true)),
        )?;
        s.live()?;
        let held = crate::shortcut::sidelock::enter_rx(s.e);
        let mut c = Consumer {
            storage: &ring,
            head_shared: &s.e.rx_head,
            tail_shared: &s.e.rx_tail,
            tail: s.e.rx_tail.load(Ordering::Relaxed),
        };
        let rec = c.next_record();
        let out = match rec {
            Err(_) => Some(Err(libc::EIO)),
            Ok(None) => None,
            Ok(Some(info)) if info.kind != record_kind::DATAGRAM => {
                // Not ours to receive (garbage): skip it.
                c.consume_record(&info);
                None
            }
            Ok(Some(info)) => {
                let len = info.len as usize;
                let n = len.min(total);
                let pos = c.record_payload_pos(&info);
                // SAFETY: the iovecs are the application's writable buffers; the payload
                // span lies inside the queued bytes (checked by next_record).
                unsafe { iov::scatter_from(&ring, pos, iov, 0, n) };
                meta.msg_flags = if len > total { libc::MSG_TRUNC } else { 0 };
                if info.addr_len as usize > ADDR_SIZE {
                    let mut a = [0u8; ADDR_SIZE + MAX_CONTROL];
                    let n = (info.addr_len as usize).min(a.len());
                    c.record_addr(&info, &mut a[..n]);
                    meta.from = CanalAddr::decode(&a);
                    take_control(&a[ADDR_SIZE..n], meta);
                } else if info.addr_len as usize == ADDR_SIZE {
                    let mut a = [0u8; ADDR_SIZE];
                    c.record_addr(&info, &mut a);
                    meta.from = CanalAddr::decode(&a);
                }
                if !peek {
                    c.consume_record(&info);
                }
                Some(Ok(if flags & libc::MSG_TRUNC != 0 { len } else { n }))
            }
        };
        crate::shortcut::sidelock::exit_rx(s.e, held);
        match out {
            Some(r) => {
                if !peek && canal_abi::region::room_asked_after_release(&s.e.flags) {
                    attention(s.g, s.idx);
                }
                return r;
            }
            None => {
                if s.e.rx_head.load(Ordering::Acquire) != s.e.rx_tail.load(Ordering::Relaxed) {
                    continue; // skipped a record; look again
                }
            }
        }
        // What canald had received before the socket was passed on is read here first.
        passed_on(&s)?;
        let pe = s.take_error();
        if pe != 0 {
            return Err(pe as i32);
        }
        // After SHUT_RD with nothing queued the kernel's UDP answers EAGAIN to a
        // non-blocking receive (its poll says readable all the same) and 0 to a
        // blocking one, which stops waiting (`__skb_wait_for_more_packets`).
        if nonblock {
            return Err(libc::EAGAIN);
        }
        if s.local() & local::SHUT_RD != 0 {
            return Ok(0);
        }
        if deadline.is_none() {
            deadline = Some(s.deadline(true));
        }
        let w = wait_until(s.g, s.idx, deadline.flatten(), || {
            let st = s.snapshot();
            st.rx_used > 0
                || st.pending_error != 0
                || st.guest_flags & local::SHUT_RD != 0
                || st.flags & canal_abi::sock_flag::HANDED_OVER != 0
        });
        match w {
            Wait::Ready | Wait::Dead => {} // the death: looked at above
            _ => return Err(wait_err(w, true)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use canal_abi::ring::RawRing;

    #[test]
    fn record_fit_counts_padding() {
        // Empty ring, head in the middle: a half-ring record needs the pad first.
        assert!(record_fits(0, 0, 1024, 512));
        assert!(
            record_fits(600, 600, 1024, 512),
            "pad 424 + 512 fits in an empty ring"
        );
        assert!(
            !record_fits(600, 200, 1024, 512),
            "600 free < 424 pad + 512"
        );
        assert!(record_fits(600, 400, 1024, 64));
        assert!(!record_fits(1024, 0, 1024, 8), "full");
        // Agrees with push_record on a real ring.
        use canal_abi::sync::AtomicU64;
        let mut mem = vec![0u8; 1024];
        // SAFETY: mem outlives the ring and 1024 is a power of two.
        let ring = unsafe { RawRing::new(mem.as_mut_ptr(), 1024) };
        for (h, t, len) in [
            (600u64, 200u64, 488u64),
            (600, 500, 488),
            (1000, 600, 100),
            (8, 0, 480),
        ] {
            let (hs, ts) = (AtomicU64::new(h), AtomicU64::new(t));
            let mut p = Producer {
                storage: &ring,
                head_shared: &hs,
                tail_shared: &ts,
                head: h,
            };
            let payload = vec![1u8; len as usize];
            let need = canal_abi::ring::record_size(0, len);
            assert_eq!(
                p.push_record(record_kind::DATAGRAM, &[], &[&payload])
                    .unwrap(),
                record_fits(h, t, 1024, need),
                "{h} {t} {len}"
            );
        }
    }

    #[test]
    fn udp_limits() {
        assert_eq!(udp_max(libc::AF_INET as u32), 65507);
        assert_eq!(udp_max(libc::AF_INET6 as u32), 65527);
    }
}
