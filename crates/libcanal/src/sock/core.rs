//! A canal socket as the library sees it: `Sock` (its table entry and rings), readiness,
//! deadlines, and the errno rules shared by every operation.
use crate::conn::guest::Guest;
use crate::conn::request::attention;
use crate::conn::wait::Wait;
use crate::ready::local;
use crate::ready::SockState;
use crate::sys;
use canal_abi::addr::CanalAddr;
use canal_abi::guest_flag;
use canal_abi::handle_index;
use canal_abi::make_handle;
use canal_abi::ring::RawRing;
use canal_abi::sync::fence;
use canal_abi::sync::AtomicU64;
use canal_abi::sync::Ordering;
use canal_abi::SocketEntry;
use libc::c_int;

/// Initialises the guest line of a fresh entry: a new socket, or a connection accepted
/// on `listener`, whose timeouts and kept options (`sock::kept`) it inherits as a
/// kernel socket does.
#[inline]
pub(crate) fn init_guest_line(e: &SocketEntry, nonblock: bool, listener: Option<&SocketEntry>) {
    let inherit =
        |f: fn(&SocketEntry) -> &AtomicU64| listener.map_or(0, |l| f(l).load(Ordering::Relaxed));
    e.refs.store(1, Ordering::Relaxed);
    // Also here, not only by the host: a canald before minor 3 does not clear them.
    e.tx_tail_seen.store(0, Ordering::Relaxed);
    e.rx_head_seen.store(0, Ordering::Relaxed);
    e.guest_flags.store(
        if nonblock {
            canal_abi::guest_flag::NONBLOCK
        } else {
            0
        },
        Ordering::Relaxed,
    );
    e.tx_lock.store(0, Ordering::Relaxed);
    e.rx_lock.store(0, Ordering::Relaxed);
    e.clear_side_locks();
    e.rcvtimeo_ns
        .store(inherit(|l| &l.rcvtimeo_ns), Ordering::Relaxed);
    e.sndtimeo_ns
        .store(inherit(|l| &l.sndtimeo_ns), Ordering::Relaxed);
    e.options.store(inherit(|l| &l.options), Ordering::Relaxed);
    // Also here: a canald before minor 13 does not clear it.
    let lowat = listener.map_or(0, |l| l.rcvlowat.load(Ordering::Relaxed));
    e.rcvlowat.store(lowat, Ordering::Relaxed);
    // SO_LINGER too is the listener's, as for a kernel socket (canald's copy is
    // inherited on its side).
    let linger = listener.map_or(0, |l| l.linger.load(Ordering::Relaxed));
    e.linger.store(linger, Ordering::Relaxed);
}

/// A stream socket's two rings and their index words: in the region, or (protocol
/// §8) in a pair segment shared with the peer guest. One code path serves both.
pub(crate) struct Rings {
    pub(crate) tx: RawRing,
    pub(crate) tx_head: &'static AtomicU64,
    pub(crate) tx_tail: &'static AtomicU64,
    pub(crate) rx: RawRing,
    pub(crate) rx_head: &'static AtomicU64,
    pub(crate) rx_tail: &'static AtomicU64,
    /// Short-circuited: the segment and the peer's side.
    pub(crate) peer: Option<(crate::shortcut::seg::Seg, u32)>,
}

/// What a side did to a stream's rings, for `Rings::notify`.
#[derive(Clone, Copy)]
pub(crate) enum Moved {
    /// Published bytes (or its FIN word): the peer's readers must hear of it.
    Sent,
    /// Consumed bytes, freeing room: a short-circuit peer hears of it only if it asked
    /// for room (§8.4 room rule); a region socket's host likewise (§3.5).
    Received,
}

impl Rings {
    /// After moving an index (`moved`): tell whoever must know. Region sockets: the
    /// host (attention + kick) after a send, or after a receive it asked room of.
    /// Short-circuited ones: nobody, unless the peer sleeps (§8.4: fence, read its
    /// sleeper count, then attention + kick so canald wakes it) — and, after a
    /// receive, unless it asked for room (`shortcut::room`).
    #[inline]
    pub(crate) fn notify(&self, s: &Sock, moved: Moved) {
        match self.peer {
            None => {
                // The receive-room handshake (§3.5) with a host short of room.
                let asked = || canal_abi::region::room_asked_after_release(&s.e.flags);
                if matches!(moved, Moved::Sent) || asked() {
                    attention(s.g, s.idx);
                }
            }
            Some((seg, side)) => {
                // P1: SeqCst fence between our index store and the sleeper counts;
                // pairs with the sleeper's fence between counting itself and
                // re-checking. Skipped when the peer's sleepers issue the global
                // barrier instead (barrier.rs: the fence waits for our index line to
                // leave the peer's cache, a third of a small message's cost).
                if !crate::shortcut::barrier::may_skip_fence(seg.deferred_barrier(side)) {
                    fence(Ordering::SeqCst);
                }
                // Sleepers that re-check the socket itself (futex, poll, direct epoll)
                // are woken for room only when they asked; an epoll set following the
                // connection through its event log hears of every move (below), since
                // a fence-less consume may miss the word and the log's re-check would
                // not look at this socket again.
                let futex = seg.futex_sleepers(side).load(Ordering::Relaxed) != 0;
                let mut wake = seg.sleepers(side).load(Ordering::Relaxed) != 0;
                if (futex || wake)
                    && matches!(moved, Moved::Received)
                    && !crate::shortcut::room::wanted(seg.room_rule(side), seg.room_wanted(side))
                {
                    wake = false;
                } else {
                    if futex {
                        seg.futex_wake(side);
                    }
                    // §8.8: one sleeping thread with a bell for us: ring it ourselves.
                    if wake && crate::shortcut::bells::enabled(s.g) {
                        let word = seg.bell(side).load(Ordering::Relaxed);
                        if let Some(tag) = canal_abi::segment::bell::target(word) {
                            let arena = s.e.arena.load(Ordering::Relaxed);
                            wake = !crate::shortcut::bells::ring(s.g, arena, tag);
                        }
                    }
                }
                // §8.6: a large epoll set of the peer follows this connection through
                // its event log rather than looking at it on every round.
                if seg.watched(side).load(Ordering::Relaxed) != 0 {
                    match crate::evlog::tell(s.g, seg, side) {
                        crate::evlog::Tell::Quiet => {}
                        crate::evlog::Tell::Relay => wake = true,
                        crate::evlog::Tell::Ring(tag) => {
                            let arena = s.e.arena.load(Ordering::Relaxed);
                            if !crate::shortcut::bells::ring(s.g, arena, tag) {
                                wake = true;
                            }
                        }
                    }
                }
                if wake {
                    attention(s.g, s.idx);
                }
            }
        }
    }
}

impl Rings {
    /// RX_EOF if the peer of a short-circuited stream set its FIN word (§8.3, minor 9):
    /// it closed before canald told us so. Loaded (Acquire) before the caller reads
    /// the receive head, so every byte it sent is seen before the end.
    #[inline]
    pub(crate) fn peer_fin(&self) -> u32 {
        match self.peer {
            // The peer sends on the ring of its own side's number.
            Some((seg, side)) if seg.dir(side).fin.load(Ordering::Acquire) != 0 => {
                canal_abi::sock_flag::RX_EOF
            }
            _ => 0,
        }
    }

    /// Nothing queued to receive: the ring is empty and no zone piece waits.
    #[inline]
    pub(crate) fn rx_drained(&self) -> bool {
        self.rx_head.load(Ordering::Acquire) == self.rx_tail.load(Ordering::Relaxed)
            && !self.rx_zone_pending()
    }

    /// A short-circuit with buffer zones (§10.4) has zone-sent pieces waiting for us
    /// (they sit between ring bytes without moving the ring's head).
    #[inline]
    pub(crate) fn rx_zone_pending(&self) -> bool {
        self.peer.is_some_and(|(seg, dir)| {
            seg.has_zones() && crate::shortcut::zones::pending(seg, dir) > 0
        })
    }

    /// The last close of a short-circuited stream with nothing unread: tells the peer
    /// the end through the segment (after our last head, Release) and wakes it as
    /// bytes would, so its recv returns 0 without waiting for canald to see the close.
    /// With unread bytes or SO_LINGER {on, 0} the close is a reset, which only canald
    /// reports (it reads both rings' indices).
    pub(crate) fn fin_on_close(&self, s: &Sock) {
        let Some((seg, peer)) = self.peer else { return };
        let unread = self.rx_head.load(Ordering::Acquire) != self.rx_tail.load(Ordering::Relaxed)
            || self.rx_zone_pending();
        if unread || s.e.linger.load(Ordering::Relaxed) == 1 {
            return;
        }
        seg.dir(1 - peer).fin.store(1, Ordering::Release);
        self.notify(s, Moved::Sent);
    }
}

/// A canal socket resolved from its handle.
#[derive(Clone, Copy)]
pub(crate) struct Sock {
    pub(crate) g: &'static Guest,
    pub(crate) handle: u32,
    pub(crate) idx: u32,
    pub(crate) e: &'static SocketEntry,
}

impl Sock {
    #[inline]
    pub(crate) fn new(g: &'static Guest, handle: u32) -> Result<Sock, i32> {
        let idx = handle_index(handle);
        let e = g.region.socket(idx).ok_or(libc::EBADF)?;
        // Once canald is gone its entries may be freed: keep the socket so that every
        // call reports the dead daemon (ECONNRESET/EIO), not EBADF.
        if make_handle(idx, e.generation.load(Ordering::Acquire)) != handle
            && !crate::conn::guest::is_dead(g)
        {
            return Err(libc::EBADF);
        }
        Ok(Sock { g, handle, idx, e })
    }

    /// The entry still belongs to this handle (another thread may have closed the
    /// last descriptor while we waited, and the entry may now be someone else's).
    #[inline]
    pub(crate) fn live(&self) -> Result<(), i32> {
        if make_handle(self.idx, self.e.generation.load(Ordering::Acquire)) != self.handle
            && !crate::conn::guest::is_dead(self.g)
        {
            return Err(libc::EBADF);
        }
        Ok(())
    }

    #[inline]
    pub(crate) fn kind(&self) -> u32 {
        self.e.kind.load(Ordering::Acquire)
    }

    #[inline]
    /// A stream whose bytes go through a pair segment (protocol §8), not a host socket.
    pub(crate) fn short_circuited(&self) -> bool {
        self.kind() == canal_abi::sock_kind::STREAM && self.e.segment.load(Ordering::Acquire) != 0
    }

    pub(crate) fn flags(&self) -> u32 {
        self.e.flags.load(Ordering::Acquire)
    }

    /// The stream rings (mapping the pair segment on first use).
    #[inline]
    pub(crate) fn rings(&self) -> Result<Rings, i32> {
        let id = self.e.segment.load(Ordering::Acquire);
        if id == 0 {
            return Ok(Rings {
                tx: self.tx_ring()?,
                tx_head: &self.e.tx_head,
                tx_tail: &self.e.tx_tail,
                rx: self.rx_ring()?,
                rx_head: &self.e.rx_head,
                rx_tail: &self.e.rx_tail,
                peer: None,
            });
        }
        let place = (
            self.e.arena.load(Ordering::Relaxed),
            self.e.arena_offset.load(Ordering::Relaxed),
        );
        let seg = crate::shortcut::seg::get(self.g, id, place)?;
        crate::notify::note_segment_mapped();
        let side = self.e.segment_side.load(Ordering::Relaxed).min(1);
        // Our sleepers follow the deferred rule: the peer may publish fence-less.
        seg.announce_deferred_barrier(side);
        let (tx, rx) = (seg.dir(side), seg.dir(1 - side));
        Ok(Rings {
            tx: seg.ring(side),
            tx_head: &tx.head,
            tx_tail: &tx.tail,
            rx: seg.ring(1 - side),
            rx_head: &rx.head,
            rx_tail: &rx.tail,
            peer: Some((seg, 1 - side)),
        })
    }

    #[inline]
    pub(crate) fn tx_ring(&self) -> Result<RawRing, i32> {
        let size = self.e.tx_size.load(Ordering::Acquire) as u64;
        self.g
            .region
            .ring(self.e.tx_offset.load(Ordering::Acquire), size)
            .ok_or(libc::EIO)
    }

    #[inline]
    pub(crate) fn rx_ring(&self) -> Result<RawRing, i32> {
        let size = self.e.rx_size.load(Ordering::Acquire) as u64;
        self.g
            .region
            .ring(self.e.rx_offset.load(Ordering::Acquire), size)
            .ok_or(libc::EIO)
    }

    /// canald handed the host socket over (HOST_SOCKET): the program passed it on.
    #[inline]
    pub(crate) fn handed_over(&self) -> bool {
        self.flags() & canal_abi::sock_flag::HANDED_OVER != 0
    }

    #[inline]
    pub(crate) fn nonblocking(&self) -> bool {
        self.e.guest_flags.load(Ordering::Relaxed) & guest_flag::NONBLOCK != 0
    }

    #[inline]
    pub(crate) fn set_nonblocking(&self, on: bool) {
        if on {
            self.e
                .guest_flags
                .fetch_or(guest_flag::NONBLOCK, Ordering::Relaxed);
        } else {
            self.e
                .guest_flags
                .fetch_and(!guest_flag::NONBLOCK, Ordering::Relaxed);
        }
    }

    #[inline]
    pub(crate) fn local(&self) -> u32 {
        self.e.guest_flags.load(Ordering::Relaxed)
    }

    /// Takes the pending error, if any (reported once).
    #[inline]
    pub(crate) fn take_error(&self) -> u32 {
        if self.e.pending_error.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.e.pending_error.swap(0, Ordering::AcqRel)
    }

    #[inline]
    pub(crate) fn snapshot(&self) -> SockState {
        let e = self.e;
        // Flags first (Acquire): a short-circuit completing publishes the segment
        // fields before CONNECTED.
        let mut flags = e.flags.load(Ordering::Acquire);
        let tx_size = e.tx_size.load(Ordering::Relaxed) as u64;
        let rx_size = e.rx_size.load(Ordering::Relaxed) as u64;
        let mut zone = None;
        let mut peer = None;
        let (txh, txt, rxh, rxt) = match (e.segment.load(Ordering::Acquire), self.rings()) {
            (0, _) | (_, Err(_)) => (&e.tx_head, &e.tx_tail, &e.rx_head, &e.rx_tail),
            (_, Ok(r)) => {
                zone = r.peer.filter(|(g, _)| g.has_zones());
                let ends = (r.tx_head, r.tx_tail, r.rx_head, r.rx_tail);
                peer = Some(r);
                ends
            }
        };
        // R3-style Acquire loads of the other side's indices.
        let tx_used_now = || {
            txh.load(Ordering::Relaxed)
                .wrapping_sub(txt.load(Ordering::Acquire))
                .min(tx_size)
        };
        let mut tx_used = tx_used_now();
        // §8.4 room rule: a full outgoing ring seen by a sleeper's re-check (a waiter
        // for POLLOUT or a blocked send) asks the peer for room, then is read again.
        if tx_size > 0 && tx_used >= tx_size && crate::shortcut::room::rechecking() {
            if let Some((seg, side)) = peer.as_ref().and_then(|r| r.peer) {
                crate::shortcut::room::want(seg.room_wanted(1 - side));
                tx_used = tx_used_now();
            }
        }
        let rx_used_now = || {
            rxh.load(Ordering::Acquire)
                .wrapping_sub(rxt.load(Ordering::Relaxed))
                .min(rx_size)
                + zone.map_or(0, |(seg, dir)| crate::shortcut::zones::pending(seg, dir))
        };
        let mut rx_used = rx_used_now();
        // The peer's FIN word (§8.3) on the head's line, read after the head so a
        // spinning wait polls nothing more than before; seen set, the head is read
        // again after it (Acquire), so every byte sent before the end is counted.
        if let Some(fin) = peer.as_ref().map(Rings::peer_fin).filter(|&f| f != 0) {
            flags |= fin;
            rx_used = rx_used_now();
        }
        SockState {
            kind: e.kind.load(Ordering::Acquire),
            flags,
            pending_error: e.pending_error.load(Ordering::Relaxed),
            tx_used,
            tx_size,
            rx_used,
            guest_flags: e.guest_flags.load(Ordering::Relaxed),
            // A mark beyond the ring counts as a full ring (`recv_stream`).
            rcvlowat: e.rcvlowat.load(Ordering::Relaxed).min(rx_size as u32),
        }
    }

    /// Moves whenever the socket had an event an edge-triggered epoll reports: the
    /// host's `event_seq`, plus, on a short-circuited socket, the incoming ring's head
    /// (the peer publishes bytes without canald, so each arrival — an edge natively —
    /// shows only there).
    ///
    /// Second value: the outgoing ring's tail while a send found that ring full
    /// (`local::NOSPACE`), else None — the peer freeing space is then an edge too, as
    /// the kernel's write-space wake-up is after SOCK_NOSPACE.
    #[inline]
    pub(crate) fn edge_seq(&self) -> (u32, Option<u32>) {
        let seq = self.e.event_seq.load(Ordering::Acquire);
        if self.e.segment.load(Ordering::Acquire) == 0 {
            return (seq, None);
        }
        match self.rings() {
            Ok(r) if r.peer.is_some() => {
                // The peer's FIN word is an edge too (the end arriving, natively).
                let mut rx = seq
                    .wrapping_add(r.rx_head.load(Ordering::Acquire) as u32)
                    .wrapping_add(r.peer_fin());
                if let Some((seg, dir)) = r.peer.filter(|(g, _)| g.has_zones()) {
                    // A zone-sent piece arrives without moving the ring head.
                    rx = rx.wrapping_add(crate::shortcut::zones::posted(seg, dir) as u32);
                }
                let nospace = self.e.guest_flags.load(Ordering::Relaxed) & local::NOSPACE != 0;
                (
                    rx,
                    nospace.then(|| r.tx_tail.load(Ordering::Acquire) as u32),
                )
            }
            _ => (seq, None),
        }
    }

    /// An edge-triggered report carried EPOLLOUT: the write-space edge is consumed.
    #[inline]
    pub(crate) fn clear_nospace(&self) {
        if self.e.guest_flags.load(Ordering::Relaxed) & local::NOSPACE != 0 {
            self.e
                .guest_flags
                .fetch_and(!local::NOSPACE, Ordering::Relaxed);
        }
    }

    #[inline]
    pub(crate) fn deadline(&self, rcv: bool) -> Option<i64> {
        let t = if rcv {
            self.e.rcvtimeo_ns.load(Ordering::Relaxed)
        } else {
            self.e.sndtimeo_ns.load(Ordering::Relaxed)
        };
        (t != 0).then(|| sys::now_ns().saturating_add(t.min(i64::MAX as u64) as i64))
    }
}

#[inline]
pub(crate) fn wait_err(w: Wait, data: bool) -> i32 {
    match w {
        Wait::Timeout => libc::EAGAIN,
        Wait::Interrupted => libc::EINTR,
        Wait::Dead => {
            if data {
                libc::ECONNRESET
            } else {
                libc::EIO
            }
        }
        Wait::Ready => 0,
    }
}

#[inline]
pub(crate) fn dead_err(g: &Guest, data: bool) -> Result<(), i32> {
    if crate::conn::guest::is_dead(g) {
        crate::conn::guest::mark_dead();
        return Err(if data { libc::ECONNRESET } else { libc::EIO });
    }
    Ok(())
}

#[inline]
pub(crate) fn epipe(flags: c_int) -> i32 {
    if flags & libc::MSG_NOSIGNAL == 0 {
        sys::raise_sigpipe();
    }
    libc::EPIPE
}

// ---- creation ------------------------------------------------------------------------

/// Source address and flags a receive reports back, and where its control messages
/// go.
#[derive(Default)]
pub(crate) struct RecvMeta {
    pub(crate) from: Option<CanalAddr>,
    pub(crate) msg_flags: c_int,
    /// recvmsg's control buffer (`msg_control`, `msg_controllen`), if it gave one.
    pub(crate) control: Option<(*mut u8, usize)>,
    /// Control bytes written there.
    pub(crate) control_len: usize,
}
