//! The datagram pump: one ring record per datagram, in both directions.
use crate::guest::addr_view::translate_guest_addr;
use crate::guest::addr_view::translate_host_addr;
use crate::guest::dgram_control::rx_control;
use crate::guest::dgram_control::tx_control;
use crate::guest::dgram_local::Delivery;
use crate::guest::dgram_route;
use crate::guest::dgram_route::Route;
use crate::guest::netops::bind_own_source;
use crate::guest::netview::is_plain_v6;
use crate::guest::netview::is_resolver;
use crate::guest::netview::PROTO_UDP;
use crate::guest::shared::SharedRef;
use crate::guest::socket::Corrupt;
use crate::guest::socket::Phase;
use crate::guest::state::Guest;
use crate::guest::wake::RoundStats;
use crate::sys;
use canal_abi::addr::ADDR_SIZE;
use canal_abi::cmsg::MAX_CONTROL;
use canal_abi::ring::record_kind;
use canal_abi::ring::Consumer;
use canal_abi::ring::Producer;
use canal_abi::sync::Ordering;
use canal_abi::CanalAddr;

/// What a sent datagram costs against the round's transmit deficit: its bytes, but at
/// least DGRAM_CHARGE. A receiver served by the same worker reads its host socket
/// only between rounds, and a default receive buffer (208 KiB) holds about 128 small
/// datagrams: charged by bytes alone, a co-resident sender's round of 64-byte
/// datagrams (16,000 for the 1 MiB deficit) lost 98% of them there.
const DGRAM_CHARGE: u64 = 4096;

fn charge(len: u64) -> u64 {
    len.max(DGRAM_CHARGE)
}

/// Where a datagram record's address sends it: Ok(host destination), or Err(the errno
/// the socket reports next, if any) for a record that is dropped.
fn dgram_dest(
    view: &crate::guest::addr_view::GuestView,
    s: &mut crate::guest::socket::HostSocket,
    raw: &[u8; canal_abi::addr::ADDR_SIZE],
) -> Dest {
    let guest = CanalAddr::decode(raw);
    match guest.map(|a| translate_guest_addr(view, &a, PROTO_UDP, s.v6only)) {
        Some(Ok(d)) => {
            s.via_resolver |= guest.as_ref().is_some_and(is_resolver);
            if let (true, Some(net), Some(a)) = (d.own, &view.net, guest) {
                // Best effort: without it the datagram leaves from the kernel's
                // autobound address.
                let _ = bind_own_source(s, net, &d.addr, is_plain_v6(&a));
            } else if !d.own {
                s.net.note_contact(&d.addr);
            }
            Ok(Some(d.addr))
        }
        // A destination the quota policy refuses: dropped, and the socket's next call
        // reports EPERM (sendto returned before canald saw the datagram; an ICMP error
        // is reported the same way).
        Some(Err(e)) if e == libc::EPERM => Err(Some(libc::EPERM)),
        // An address the guest library should have refused: dropped.
        _ => Err(None),
    }
}

/// A datagram's destination (None: the connected peer), or the errno its socket
/// reports next (if any) for one that is dropped.
type Dest = Result<Option<CanalAddr>, Option<i32>>;

/// Where a tx record's address section (`section`: empty, or the address and any
/// control messages) sends its datagram, as `dgram_dest` answers, and where in
/// `ctl_bytes` its checked control messages went (appended; none for a dropped one).
fn record_dest(
    view: &crate::guest::addr_view::GuestView,
    s: &mut crate::guest::socket::HostSocket,
    section: &[u8],
    ctl_bytes: &mut Vec<u8>,
) -> Result<(Dest, (u32, u32)), Corrupt> {
    if section.is_empty() {
        return Ok((Ok(None), (0, 0)));
    }
    if section.len() < ADDR_SIZE {
        return Err(Corrupt);
    }
    let (to, ctl) = section.split_at(ADDR_SIZE);
    let to: &[u8; ADDR_SIZE] = to.try_into().map_err(|_| Corrupt)?;
    // With control messages, an all-zero address is the connected peer.
    let dest = if !ctl.is_empty() && *to == [0; ADDR_SIZE] {
        Ok(None)
    } else {
        dgram_dest(view, s, to)
    };
    let at = ctl_bytes.len();
    let dest = dest.and_then(|d| {
        tx_control(view, ctl, ctl_bytes).map_err(Some)?;
        Ok(d)
    });
    if dest.is_err() {
        ctl_bytes.truncate(at);
    }
    Ok((dest, (at as u32, (ctl_bytes.len() - at) as u32)))
}

/// What a flush did so far: bytes sent (or delivered), their charge against the
/// round's deficit, the errno the socket reports next, and the datagrams for other
/// canal sockets (posted once the flush ends).
#[derive(Default)]
struct Flushed {
    sent: u64,
    charged: u64,
    err: Option<i32>,
    out_of_budget: bool,
    local: Vec<Delivery>,
}

/// One `sendmmsg` as the scout planned it.
struct Batch {
    dgrams: [sys::RingDatagram; sys::SEND_BATCH],
    /// Where each datagram's record ends (the consumer releases up to there).
    ends: [u64; sys::SEND_BATCH],
    n: usize,
    /// The batch's control messages (none allocated without any).
    ctl: Vec<u8>,
    /// The end of dropped records after the last datagram, released with a whole batch.
    drops_end: Option<u64>,
    /// A MSG_MORE part: it goes alone (sendmmsg's flags are the batch's).
    part: bool,
}

/// What a scout works with.
struct Plan<'a> {
    view: &'a crate::guest::addr_view::GuestView,
    ring: &'a canal_abi::ring::RawRing,
    head: &'a canal_abi::sync::AtomicU64,
    budget: i64,
    /// The shared state and this guest's key, if the socket may deliver locally.
    local: Option<(&'a SharedRef, u32)>,
}

impl Plan<'_> {
    /// Reads records from the consumer's tail into a batch. Records that need no
    /// `sendmmsg` — dropped, or delivered to a canal socket — are released at once
    /// while the batch is empty; a delivered one after a kernel datagram ends the
    /// batch unread, so that a batch the kernel takes in part never has it behind.
    fn batch(
        &self,
        s: &mut crate::guest::socket::HostSocket,
        c: &mut Consumer<'_, canal_abi::ring::RawRing>,
        f: &mut Flushed,
    ) -> Result<Batch, Corrupt> {
        let none = sys::RingDatagram {
            pos: 0,
            len: 0,
            to: None,
            control: (0, 0),
        };
        let mut b = Batch {
            dgrams: [none; sys::SEND_BATCH],
            ends: [0; sys::SEND_BATCH],
            n: 0,
            ctl: Vec::new(),
            drops_end: None,
            part: false,
        };
        let ahead = canal_abi::sync::AtomicU64::new(0);
        let mut scout = Consumer {
            storage: self.ring,
            head_shared: self.head,
            tail_shared: &ahead,
            tail: c.tail,
        };
        let mut planned = f.charged;
        // One record's address section at a time (overwritten, never zeroed again).
        let mut sect = [0u8; ADDR_SIZE + MAX_CONTROL];
        while b.n < sys::SEND_BATCH {
            if (planned as i64) >= self.budget {
                f.out_of_budget = true;
                break;
            }
            let Some(info) = scout.next_record().map_err(|_| Corrupt)? else {
                break;
            };
            let more = match info.kind {
                record_kind::DATAGRAM => false,
                record_kind::DATAGRAM_MORE => true,
                _ => return Err(Corrupt),
            };
            if more && b.n > 0 {
                break;
            }
            if let (true, Some(l)) = (more, s.dgram_local_mut()) {
                l.assembles = true;
            }
            let section = match info.addr_len as usize {
                n if n <= sect.len() => &mut sect[..n],
                _ => return Err(Corrupt),
            };
            scout.record_addr(&info, section);
            let (mut dest, control) = record_dest(self.view, s, section, &mut b.ctl)?;
            let route = match (&dest, self.local) {
                (Ok(to), Some((sc, conn))) if control.1 == 0 && !more => {
                    dgram_route::route(sc, conn, s, to.as_ref())
                }
                _ => Route::Kernel,
            };
            let pos = scout.record_payload_pos(&info);
            match route {
                Route::Deliver(..) if b.n > 0 => break,
                Route::Deliver(reg, from) => {
                    let mut data = vec![0u8; info.len as usize];
                    canal_abi::ring::copy_out(self.ring, pos, &mut data);
                    scout.consume_record(&info);
                    c.release(scout.tail.wrapping_sub(c.tail));
                    f.local.push(Delivery {
                        conn: reg.conn,
                        handle: reg.handle,
                        from,
                        data,
                    });
                    f.sent += info.len as u64;
                    f.charged += charge(info.len as u64);
                    planned += charge(info.len as u64);
                    continue;
                }
                Route::Drop => dest = Err(None),
                Route::Kernel => {}
            }
            scout.consume_record(&info);
            match dest {
                Ok(to) => {
                    b.dgrams[b.n] = sys::RingDatagram {
                        pos,
                        len: info.len as u64,
                        to,
                        control,
                    };
                    b.ends[b.n] = scout.tail;
                    b.n += 1;
                    planned += charge(info.len as u64);
                    b.drops_end = None;
                    if more {
                        b.part = true;
                        break;
                    }
                }
                Err(code) => {
                    f.err = code.or(f.err);
                    if b.n == 0 {
                        c.release(scout.tail.wrapping_sub(c.tail));
                    } else {
                        b.drops_end = Some(scout.tail);
                    }
                }
            }
        }
        Ok(b)
    }
}

impl Guest {
    /// Sends everything a datagram socket has queued, whatever the round's budget has
    /// left (a request on the socket is about to change what later datagrams get).
    /// Stops where the host socket is full (EAGAIN); no-op for other kinds.
    pub(crate) fn drain_dgram_tx(&mut self, index: u32) {
        let dgram = self
            .sockets
            .get(index as usize)
            .and_then(|s| s.as_ref())
            .is_some_and(|s| {
                matches!(s.state, crate::guest::socket::KindState::Dgram(_))
                    && s.phase != Phase::Broken
            });
        if !dgram {
            return;
        }
        let budget = std::mem::replace(&mut self.tx_deficit, i64::MAX / 2);
        // A guest that broke its ring is found again by the round's own service.
        let _ = self.flush_dgram_tx(index, &mut RoundStats::default());
        let spent = i64::MAX / 2 - self.tx_deficit;
        self.tx_deficit = budget - spent;
    }

    pub(crate) fn service_dgram(&mut self, index: u32, st: &mut RoundStats) -> Result<(), Corrupt> {
        if self.sockets[index as usize].as_ref().ok_or(Corrupt)?.phase == Phase::Broken {
            return Ok(());
        }
        self.flush_dgram_tx(index, st)?;
        self.fill_dgram_rx(index, st)
    }

    /// Sends the datagrams the guest queued, up to SEND_BATCH per `sendmmsg`; those
    /// to another canal socket go to its ring instead (`dgram_local`). A scout reads
    /// records ahead of the consumer, which releases ring space only for what was
    /// sent, delivered or dropped; a batch the socket took in part is resumed at the
    /// first datagram it did not take (which then reports its error).
    pub(crate) fn flush_dgram_tx(
        &mut self,
        index: u32,
        st: &mut RoundStats,
    ) -> Result<(), Corrupt> {
        let avail = self.tx_avail(index)?;
        if avail == 0 {
            return Ok(());
        }
        let view = self.view();
        let budget = if self.gone.is_some() {
            i64::MAX
        } else {
            self.tx_deficit
        };
        let lsc = self.dl_sender(index);
        let conn = self.conn;
        let region = self.region;
        let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
        let ring = region.ring(s.tx.off, s.tx.size).ok_or(Corrupt)?;
        let e = region.socket(index).ok_or(Corrupt)?;
        let mut c = Consumer {
            storage: &ring,
            head_shared: &e.tx_head,
            tail_shared: &e.tx_tail,
            tail: s.tx.idx,
        };
        let mut f = Flushed::default();
        let start = c.tail;
        loop {
            let plan = Plan {
                view: &view,
                ring: &ring,
                head: &e.tx_head,
                budget,
                local: lsc.as_ref().map(|sc| (sc, conn)),
            };
            let b = plan.batch(s, &mut c, &mut f)?;
            let Some(fd) = s.fd.as_ref().filter(|_| b.n > 0) else {
                break;
            };
            match sys::sendmmsg_ring(fd, &ring, &b.dgrams[..b.n], &b.ctl, b.part) {
                Ok(k) if k > 0 => {
                    let k = k.min(b.n);
                    f.sent += b.dgrams[..k].iter().map(|d| d.len).sum::<u64>();
                    f.charged += b.dgrams[..k].iter().map(|d| charge(d.len)).sum::<u64>();
                    let end = match b.drops_end {
                        Some(d) if k == b.n => d,
                        _ => b.ends[k - 1],
                    };
                    c.release(end.wrapping_sub(c.tail));
                }
                Ok(_) => break,
                Err(e) => match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                        s.writable = false;
                        break;
                    }
                    Some(libc::EINTR) => {}
                    // The first datagram is lost, as on the way; a refused peer is
                    // reported.
                    code => {
                        if code == Some(libc::ECONNREFUSED) {
                            f.err = code;
                        }
                        c.release(b.ends[0].wrapping_sub(c.tail));
                    }
                },
            }
        }
        let moved = c.tail.wrapping_sub(start);
        s.tx.idx = c.tail;
        s.tx_bytes = s.tx_bytes.wrapping_add(f.sent);
        st.bytes += f.sent;
        self.tx_deficit -= f.charged as i64;
        self.out_of_budget |= f.out_of_budget;
        if let (Some(sc), false) = (lsc.as_ref(), f.local.is_empty()) {
            self.dl_post(sc, std::mem::take(&mut f.local));
        }
        self.after_dgram_flush(index, moved, f.err)
    }

    /// After a flush that freed `moved` ring bytes: the furthest head seen, the socket
    /// marked changed, and the errno its next call reports.
    fn after_dgram_flush(
        &mut self,
        index: u32,
        moved: u64,
        err: Option<i32>,
    ) -> Result<(), Corrupt> {
        // The consumer may have read a newer head than tx_avail: remember the furthest.
        let head_now = self.entry(index).tx_head.load(Ordering::Acquire);
        let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
        if head_now.wrapping_sub(s.tx.idx) <= s.tx.size {
            s.tx.seen = head_now;
        } else {
            return Err(Corrupt);
        }
        if moved > 0 {
            self.mark_changed(index);
        }
        if let Some(code) = err {
            self.entry(index)
                .pending_error
                .store(code as u32, Ordering::Release);
            self.mark_changed(index);
        }
        Ok(())
    }

    pub(crate) fn fill_dgram_rx(&mut self, index: u32, st: &mut RoundStats) -> Result<(), Corrupt> {
        let view = self.view();
        let mut errors = 0u32;
        // The host socket's control messages for one datagram at a time.
        let mut ctl = [0u8; MAX_CONTROL];
        loop {
            // Past the round's receive budget only delivered datagrams still go in:
            // their sender's round was charged for them (`dgram_route`).
            let over = self.gone.is_none() && self.rx_deficit <= 0;
            let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
            let pending = s.pending_dgram().ok_or(Corrupt)?.is_some();
            if over && (pending || !s.dgram_local().is_some_and(|l| l.waiting())) {
                self.out_of_budget = s.readable || pending;
                return Ok(());
            }
            let mut delivered = false;
            if !pending {
                let readable = s.readable && !over;
                if let Some((data, from)) = s.dgram_local_mut().and_then(|l| l.next(readable)) {
                    let src = translate_host_addr(&view, &from, s.via_resolver);
                    *s.pending_dgram().ok_or(Corrupt)? = Some((data, src.encode().to_vec()));
                    delivered = true;
                } else {
                    match self.read_host_dgram(index, &view, &mut ctl, &mut errors)? {
                        HostRead::Got => {}
                        HostRead::Again => continue,
                        HostRead::Done => return Ok(()),
                    }
                }
            }
            let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
            let rx_size = s.rx.size;
            let rx_idx = s.rx.idx;
            let (data, addr) = s.pending_dgram().ok_or(Corrupt)?.as_ref().ok_or(Corrupt)?;
            let max = canal_abi::ring::max_record_payload(rx_size, addr.len() as u64);
            let len = (data.len() as u64).min(max) as usize;
            let rec = canal_abi::ring::record_size(addr.len() as u64, len as u64);
            let to_end = rx_size - (rx_idx & (rx_size - 1));
            let need = if to_end < rec { to_end + rec } else { rec };
            if self.want_rx_space(index, need)? == 0 {
                return Ok(());
            }
            let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
            let ring = self.region.ring(s.rx.off, s.rx.size).ok_or(Corrupt)?;
            let (data, addr) = s.pending_dgram().ok_or(Corrupt)?.take().ok_or(Corrupt)?;
            let e = self.region.socket(index).ok_or(Corrupt)?;
            let mut p = Producer {
                storage: &ring,
                head_shared: &e.rx_head,
                tail_shared: &e.rx_tail,
                head: s.rx.idx,
            };
            match p.push_record(record_kind::DATAGRAM, &addr, &[&data[..len]]) {
                Ok(true) => {
                    let h = p.head;
                    st.bytes += len as u64;
                    if !delivered {
                        self.rx_deficit -= len as i64;
                    }
                    self.publish_rx_head(index, h, len as u64);
                }
                Ok(false) => {
                    // Only a guest moving its tail backwards gets here (caught on the
                    // next check); keep the datagram.
                    *s.pending_dgram().ok_or(Corrupt)? = Some((data, addr));
                    return Ok(());
                }
                Err(_) => return Err(Corrupt),
            }
        }
    }

    /// Reads the socket's host datagram into its pending slot (with the source in the
    /// guest's view and its control messages).
    fn read_host_dgram(
        &mut self,
        index: u32,
        view: &crate::guest::addr_view::GuestView,
        ctl: &mut [u8; MAX_CONTROL],
        errors: &mut u32,
    ) -> Result<HostRead, Corrupt> {
        let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
        if !s.readable {
            return Ok(HostRead::Done);
        }
        let Some(fd) = &s.fd else {
            return Ok(HostRead::Done);
        };
        Ok(match sys::recvmsg_dgram(fd, &mut self.scratch, ctl) {
            // A datagram socket on a network's private loopback takes datagrams from
            // its own network and from those it sent to only (a host process that
            // found it is not).
            Ok(Some(r))
                if !s
                    .net
                    .takes_datagram(r.from.as_ref(), || sys::sockname(fd).ok()) =>
            {
                HostRead::Again
            }
            Ok(Some(r)) => {
                let src = r
                    .from
                    .map(|a| translate_host_addr(view, &a, s.via_resolver));
                let mut section = src.unwrap_or_default().encode().to_vec();
                rx_control(view, &ctl[..r.control_len], r.from.as_ref(), &mut section);
                *s.pending_dgram().ok_or(Corrupt)? =
                    Some((self.scratch[..r.len].to_vec(), section));
                HostRead::Got
            }
            Ok(None) => {
                s.readable = false;
                HostRead::Done
            }
            Err(e) => match e.raw_os_error() {
                Some(libc::EINTR) => HostRead::Again,
                Some(_) if *errors >= 8 => HostRead::Done,
                Some(code) => {
                    *errors += 1;
                    // ICMP errors (ECONNREFUSED on a connected socket).
                    self.entry(index)
                        .pending_error
                        .store(code as u32, Ordering::Release);
                    self.mark_changed(index);
                    HostRead::Again
                }
                None => HostRead::Done,
            },
        })
    }
}

/// What reading a socket's host datagram came to.
enum HostRead {
    /// One is pending.
    Got,
    /// Look again (skipped one, or an error reported).
    Again,
    /// Nothing more now.
    Done,
}
