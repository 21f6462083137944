//! The co-resident short-circuit (protocol §8): a TCP connection from one canal guest
//! to a canal listener (of another guest or the same one) flows over a pair segment
//! that both guests map, without the kernel's TCP and without canald while both ends
//! are active.
//!
//! canald's part: it keeps a registry of canal listeners, turns a matching CONNECT
//! into a pending short-circuit (the connector sees EINPROGRESS/CONNECTING), and the
//! daemon completes it between service rounds ([`run`]): it creates the segment,
//! installs the accepted entry in the listener's guest (ACCEPT record), converts the
//! connector's entry and sets it CONNECTED. Afterwards canald only relays wake-ups
//! (a side raises its own attention bit when its peer sleeps) and state changes
//! (SHUT_WR → the peer's RX_EOF; close or guest death → the peer's RX_EOF/TX_CLOSED,
//! or ECONNRESET when the closer left unread bytes).
//!
//! With several workers (protocol §8.5) a short-circuited socket always lives on its
//! guest's home worker (it has no host data path to spread), and every piece of work
//! is a [`Job`] queued for the worker that serves the guest it touches: the pairing
//! runs in two steps (the listener's home installs the accepted end, then the
//! connector's home completes the connect), and peer events go to the peer's home.
//! Each worker's queue is FIFO, so a peer's close never overtakes the completion it
//! follows.
use crate::guest::addr_view::GuestView;
use crate::guest::netview::Dest;
use crate::guest::ports::PortHold;
use crate::guest::segmem::{acceptor_link, arena_segment, connector_link, new_segment, Accepted};
use crate::guest::shared::is_unspecified;
use crate::guest::shared::lock;
use crate::guest::shared::loopback;
use crate::guest::shared::zone_classes;
use crate::guest::shared::Event;
use crate::guest::shared::Job;
use crate::guest::shared::ListenerReg;
use crate::guest::shared::Pending;
use crate::guest::shared::ScAccept;
use crate::guest::shared::SegmentRec;
use crate::guest::shared::SharedRef;
use crate::guest::shared::TCP_CLOSE;
use crate::guest::shared::TCP_CLOSE_WAIT;
use crate::guest::shared::TCP_ESTABLISHED;
use crate::guest::shared::TCP_FIN_WAIT2;
use crate::guest::socket::KindState;
use crate::guest::socket::SegLink;

use crate::guest::socket::HostSocket;
use crate::guest::socket::Kind;
use crate::guest::socket::Phase;
use crate::guest::state::Guest;
use crate::sys::{self, Epoll};
use canal_abi::segment::{self, side, ArenaLayout};
use canal_abi::sync::Ordering;
use canal_abi::{errno, sock_flag, sock_kind, CanalAddr};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};

impl HostSocket {
    pub(crate) fn is_shortcut(&self) -> bool {
        self.seg.is_some()
    }
}

impl Guest {
    /// Lets this guest take part in short-circuits (it announced SHORTCUT in HELLO);
    /// `home` is the worker serving its requests (and all its short-circuited sockets).
    pub(crate) fn enable_shortcut(&mut self, shared: SharedRef, home: u32) {
        let mut sh = lock(&shared);
        sh.homes.insert(self.conn, home);
        if self.region.header().features & canal_abi::feature::FAST_CONNECT != 0 {
            sh.fast.register(self.conn, self.region);
        }
        drop(sh);
        self.sc = Some(shared);
    }

    /// After a successful LISTEN: registers the listener.
    pub(super) fn sc_listened(&mut self, index: u32, backlog: i32) {
        let Some(sc) = self.sc.clone() else { return };
        let Some(Some(s)) = self.sockets.get(index as usize) else {
            return;
        };
        let Some(addr) = s.fd.as_ref().and_then(|f| sys::sockname(f).ok()) else {
            return;
        };
        let handle = s.handle;
        // IPv4 clients reach it too: the host socket's IPV6_V6ONLY, or in a network's
        // view the guest's, which canald keeps (its host sockets are all dual-stack).
        let dual_stack = addr.family == libc::AF_INET6 as u16
            && match self.cfg.net {
                Some(_) => !s.v6only,
                None => s.fd.as_ref().is_some_and(|f| {
                    sys::sockopt_int(f, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY).is_ok_and(|v| v == 0)
                }),
            };
        let conn = self.conn;
        lock(&sc).listen(ListenerReg {
            conn,
            handle,
            addr,
            // Linux queues backlog + 1 connections; a negative or huge backlog is
            // clamped like somaxconn (4096).
            backlog: (backlog.clamp(0, 4096) as u32) + 1,
            dual_stack,
            queued: 0,
            fast_out: 0,
        });
    }

    /// CONNECT: if `dst` is a canal listener's address, starts a short-circuit and
    /// returns the request's answer (EINPROGRESS; the daemon completes it), held until
    /// the round's pairing jobs ran (`answer_held`). `dest`: the host destination the
    /// guest's `named` one translated to in its `view`.
    pub(super) fn sc_try_connect(
        &mut self,
        view: &GuestView,
        index: u32,
        named: &CanalAddr,
        dest: &Dest,
    ) -> Option<Result<(i64, usize), i32>> {
        let dst = &dest.addr;
        let sc = self.sc.clone()?;
        // Short-circuited sockets live on the home (virtual RSS: a socket served by a
        // shadow had its flow placed already; a retried connect goes to the kernel).
        if self.is_shadow() {
            return None;
        }
        let features = self.region.header().features;
        let zones = features & canal_abi::feature::ZONES != 0;
        let arenas = ArenaLayout::for_features(features);
        let s = self.sockets.get_mut(index as usize)?.as_mut()?;
        if s.kind() != Kind::Stream || s.phase != Phase::Open || s.family != dst.family {
            return None;
        }
        {
            let sh = lock(&sc);
            if !sh.enabled {
                return None;
            }
            sh.find_listener(dst, dst)?;
        }
        // Reserve a real local address (an ephemeral port unless the guest bound
        // one) so both ends' names are real and cannot collide with kernel sockets.
        let mut a = *dst;
        if is_unspecified(&a) {
            a = loopback(a.family);
        }
        a.port = 0;
        let local = match s.fd.as_ref() {
            // Not made yet (a spare): a pooled reservation, no socket of its own.
            None => {
                let hold = PortHold::take(&a)?;
                let local = hold.local();
                s.port = Some(Box::new(hold));
                local
            }
            // The bind is tried first: a bound socket refuses it (EINVAL) and keeps
            // its name, so one getsockname serves both cases.
            Some(fd) => {
                let _ = sys::bind(fd, &a);
                sys::sockname(fd).ok().filter(|l| l.port != 0)?
            }
        };
        // The listener may have gone meanwhile: then the kernel's connect answers
        // (from the address reserved above, as its own autobind would have).
        let l = lock(&sc).find_listener(dst, &local)?;
        let seen = crate::guest::fast::seen(view, named, dest, &local);
        let handle = s.handle;
        s.phase = Phase::Connecting;
        s.readable = false;
        s.writable = false;
        self.set_flags(
            index,
            sock_flag::CONNECTING,
            sock_flag::ERROR | sock_flag::HUP,
        );
        let conn = self.conn;
        lock(&sc).post_from(
            conn,
            Job::Pair(Pending {
                conn,
                handle,
                dst: *dst,
                local,
                zones,
                arenas,
                lconn: l.conn,
                lhandle: l.handle,
                fast: 0,
                settled: false,
                seen,
            }),
        );
        // Answered after this round's pairing, usually with the entry CONNECTED: a
        // blocking connect then costs its thread one wake-up, not two.
        self.hold_answer = true;
        Some(Ok((-(errno::EINPROGRESS as i64), 0)))
    }

    pub(crate) fn sc_index(&self, handle: u32) -> Option<u32> {
        let i = canal_abi::handle_index(handle);
        match self.sockets.get(i as usize) {
            Some(Some(s)) if s.handle == handle => Some(i),
            _ => None,
        }
    }

    /// Listener side of a pending short-circuit (on the worker serving the listener).
    /// Err: no such listener. `away` makes the pairing to send to the home when this
    /// instance is a shadow (it cannot allocate the entry).
    pub(crate) fn sc_accept(
        &mut self,
        lhandle: u32,
        backlog: u32,
        link: SegLink,
        away: impl FnOnce() -> ScAccept,
    ) -> Result<Accepted, ()> {
        let index = self.sc_index(lhandle).ok_or(())?;
        let l = self.sockets[index as usize].as_ref().ok_or(())?;
        if l.kind() != Kind::Listener || l.closing.is_some() || self.gone.is_some() {
            return Err(());
        }
        let (family, inherited) = (l.family, l.inherited());
        // Accepts in flight to the home (an away listener) hold queue places and
        // ring room too.
        let inflight = l.accepts().map_or(0, |q| q.accepting);
        let need = crate::guest::names::ACCEPT_RECORD;
        let free = self
            .want_rx_space(index, (inflight as u64 + 2) * need)
            .map_err(|_| ())?;
        self.drop_claimed(index);
        // Fast connect tickets outstanding hold places too (protocol §8.10).
        let tickets = self
            .sc
            .as_ref()
            .map_or(0, |sc| lock(sc).fast_out(self.conn, lhandle));
        let full = self.sockets[index as usize]
            .as_ref()
            .and_then(|l| l.accepts())
            .is_some_and(|q| q.unclaimed.len() as u32 + inflight + tickets >= backlog);
        if full {
            // Full accept queue: the connector stays CONNECTING (the kernel drops the
            // SYN and retries). The guest's accept frees a record and, seeing
            // RX_WANT_SPACE, raises attention.
            self.set_flags(index, sock_flag::RX_WANT_SPACE, 0);
            return Ok(Accepted::Full);
        }
        if free == 0 {
            return Ok(Accepted::Full);
        }
        if !self.is_shadow() && self.table_full() {
            self.listeners_stalled = true;
            return Ok(Accepted::Full);
        }
        // The connector as the listener's guest sees it.
        let peer = crate::guest::addr_view::translate_host_addr(&self.view(), &link.peer, false);
        if self.is_shadow() {
            // The home installs the entry; the hand-off carries a plain socket for
            // its options (the rare path: a listener another worker owns).
            let fd = sys::socket(family as i32, libc::SOCK_STREAM, 0).map_err(|_| ())?;
            if let Some(q) = self.sockets[index as usize]
                .as_mut()
                .and_then(|l| l.accepts_mut())
            {
                q.accepting += 1;
            }
            self.send_home_accepted(
                lhandle,
                crate::guest::shared::Accept {
                    family,
                    inherited,
                    peer,
                    fd,
                    host_peer: None,
                    sc: Some(Box::new(away())),
                },
            );
            return Ok(Accepted::Forwarded);
        }
        // No host socket: one is made if the program ever sets or reads an option
        // (`option_fd`), so a short connection costs no socket and close here.
        let handle = self.sc_install(None, family, link).map_err(|_| ())?;
        self.inherit_from_listener(handle, inherited);
        let names = self.final_names(&self.view(), canal_abi::handle_index(handle));
        if !self
            .push_accept(index, handle, &peer, names)
            .unwrap_or(false)
        {
            let ni = canal_abi::handle_index(handle);
            if let Some(s) = self.sockets.get_mut(ni as usize) {
                *s = None; // never published; nothing else refers to it
            }
            self.set_owned(ni, false);
            self.release_entry(ni);
            return Ok(Accepted::Full);
        }
        self.note_queued(index);
        self.wake_event_sleepers();
        Ok(Accepted::Now(handle))
    }

    /// Allocates an entry backed by segment `link.id` (no data-area rings).
    pub(super) fn sc_install(
        &mut self,
        fd: Option<OwnedFd>,
        family: u16,
        link: SegLink,
    ) -> Result<u32, i32> {
        // Virtual RSS: an index whose socket another worker serves is not free.
        let index = self.take_entry().ok_or(errno::EMFILE)?;
        let gen = self.generations[index as usize];
        let handle = canal_abi::make_handle(index, gen as u32);
        let e = self.entry(index);
        e.reset_guest_line();
        e.pending_error.store(0, Ordering::Relaxed);
        e.tx_tail.store(0, Ordering::Relaxed);
        e.rx_head.store(0, Ordering::Relaxed);
        e.generation.store(gen as u32, Ordering::Relaxed);
        e.family.store(family as u32, Ordering::Relaxed);
        // Virtual RSS: the entry may name the worker of a previous socket; this one's
        // attention bit is the home's (guest kicks go where `owner` says).
        e.owner.store(self.self_owner(), Ordering::Relaxed);
        self.sc_publish_link(index, &link);
        let e = self.entry(index);
        e.flags.store(sock_flag::CONNECTED, Ordering::Relaxed);
        e.kind.store(sock_kind::STREAM, Ordering::Release);
        let ring = crate::guest::socket::RingPos {
            off: 0,
            size: 0,
            idx: 0,
            seen: 0,
        };
        let mut s = HostSocket::new(
            handle,
            KindState::Stream,
            family,
            fd,
            (Phase::Connected, sock_flag::CONNECTED),
            (ring, ring),
        );
        s.seg = Some(Box::new(link));
        s.named = true;
        self.put_socket(index, s);
        // Its attention bit is this guest instance's to take.
        self.set_owned(index, true);
        Ok(handle)
    }

    /// An accepted socket (`handle`, 0: none) inherits its listener's IPV6_V6ONLY and
    /// SO_LINGER, as the kernel's does.
    pub(crate) fn inherit_from_listener(
        &mut self,
        handle: u32,
        from: crate::guest::socket::Inherited,
    ) {
        let i = canal_abi::handle_index(handle) as usize;
        if let (true, Some(Some(s))) = (handle != 0, self.sockets.get_mut(i)) {
            s.inherit(from);
        }
    }

    /// Writes the segment fields of an entry (before its flags say CONNECTED).
    pub(crate) fn sc_publish_link(&self, index: u32, link: &SegLink) {
        let (rs, (arena, arena_offset), rings) = self.sc.as_ref().map_or((0, (0, 0), 0), |sc| {
            let sh = lock(sc);
            let seg = sh.segments.get(&link.id);
            let place = seg.map_or((0, 0), |r| r.place());
            let rings = seg.map_or(segment::ring_offset(0, sh.ring_size), |r| {
                r.rings_from_header()
            });
            (sh.ring_size, place, rings)
        });
        let e = self.entry(index);
        e.arena.store(arena, Ordering::Relaxed);
        e.arena_offset.store(arena_offset, Ordering::Relaxed);
        let (tx_dir, rx_dir) = if link.side == side::CONNECTOR {
            (0, 1)
        } else {
            (1, 0)
        };
        e.tx_offset.store(rings + tx_dir * rs, Ordering::Relaxed);
        e.tx_size.store(rs as u32, Ordering::Relaxed);
        e.rx_offset.store(rings + rx_dir * rs, Ordering::Relaxed);
        e.rx_size.store(rs as u32, Ordering::Relaxed);
        e.segment_side.store(link.side, Ordering::Relaxed);
        e.segment.store(link.id, Ordering::Release);
    }

    /// A freshly released entry that was never published (kind FREE, next generation).
    pub(crate) fn release_entry(&mut self, index: u32) {
        let g = &mut self.generations[index as usize];
        *g = if *g == u16::MAX { 1 } else { *g + 1 };
        let next = *g as u32;
        let e = self.entry(index);
        e.segment.store(0, Ordering::Relaxed);
        e.kind.store(sock_kind::FREE, Ordering::Release);
        e.generation.store(next, Ordering::Release);
    }

    /// Connector side: the short-circuit is complete.
    pub(crate) fn sc_connected(&mut self, ep: &Epoll, handle: u32, link: SegLink) -> bool {
        let Some(index) = self.sc_index(handle) else {
            return false;
        };
        let Some(Some(s)) = self.sockets.get_mut(index as usize) else {
            return false;
        };
        if s.phase != Phase::Connecting || s.closing.is_some() || s.seg.is_some() {
            return false;
        }
        // The data-area rings are no longer used.
        let (tx, rx) = (s.tx, s.rx);
        s.tx.size = 0;
        s.rx.size = 0;
        s.phase = Phase::Connected;
        s.seg = Some(Box::new(link));
        // A connector is polled only if it connected on the host before and was
        // disconnected (connect to AF_UNSPEC): out of epoll now, whatever it was.
        if let Some(fd) = s.fd.as_ref().filter(|_| s.polled) {
            ep.delete(fd.as_raw_fd());
        }
        s.polled = false;
        // A connecting stream moves no bytes: unless the guest's producer index says
        // otherwise, its rings are as clean as when they were last punched.
        let e = self.entry(index);
        if e.tx_head.load(Ordering::Acquire) == 0 && e.rx_head.load(Ordering::Relaxed) == 0 {
            self.free_unused_rings(&[(tx.off, tx.size), (rx.off, rx.size)]);
        } else {
            self.retire_rings([&tx, &rx]);
        }
        let e = self.entry(index);
        e.tx_head.store(0, Ordering::Relaxed);
        e.rx_tail.store(0, Ordering::Relaxed);
        e.tx_tail.store(0, Ordering::Relaxed);
        e.rx_head.store(0, Ordering::Relaxed);
        self.sc_publish_link(index, &link);
        self.set_flags(index, sock_flag::CONNECTED, sock_flag::CONNECTING);
        self.wake_event_sleepers();
        true
    }

    /// The short-circuit cannot happen (the listener went away): connect for real.
    pub(crate) fn sc_fallback(&mut self, ep: &Epoll, handle: u32, dst: &CanalAddr) {
        let Some(index) = self.sc_index(handle) else {
            return;
        };
        if let Some(Some(s)) = self.sockets.get_mut(index as usize) {
            if s.phase != Phase::Connecting || s.seg.is_some() {
                return;
            }
            s.phase = Phase::Open;
        }
        match self.op_connect(ep, index, dst) {
            Ok(_) => {
                self.wake_event_sleepers();
                // A kernel connection after all: its flow's owner serves it.
                self.place(ep, index, Some(dst));
                return;
            }
            Err(e) => {
                if let Some(Some(s)) = self.sockets.get_mut(index as usize) {
                    s.phase = Phase::Failed;
                }
                self.set_error(index, e, 0, sock_flag::CONNECTING);
            }
        }
        self.wake_event_sleepers();
    }

    /// service_dirty for a short-circuited socket: its guest raised attention because
    /// the peer sleeps on the connection.
    pub(super) fn sc_service(&mut self, index: u32) {
        let Some(Some(s)) = self.sockets.get(index as usize) else {
            return;
        };
        let (Some(link), Some(sc)) = (s.link(), self.sc.as_ref()) else {
            return;
        };
        lock(sc).post_from(
            self.conn,
            Job::Event(Event::Wake {
                conn: link.peer_conn,
                handle: link.peer_handle,
            }),
        );
    }

    /// SHUTDOWN on a short-circuited socket.
    pub(super) fn sc_shutdown(
        &mut self,
        index: u32,
        how: i32,
    ) -> Option<Result<(i64, usize), i32>> {
        let s = self.sockets.get_mut(index as usize)?.as_mut()?;
        let link = s.link()?;
        if how == libc::SHUT_WR || how == libc::SHUT_RDWR {
            if let Some(l) = &mut s.seg {
                l.shut_wr = true;
            }
            if let Some(sc) = &self.sc {
                lock(sc).post_from(
                    self.conn,
                    Job::Event(Event::Fin {
                        conn: link.peer_conn,
                        handle: link.peer_handle,
                    }),
                );
            }
            self.set_flags(index, sock_flag::TX_CLOSED, 0);
            self.sc_futex_wake(index);
        }
        Some(Ok((0, 0)))
    }

    /// GETSOCKOPT TCP_INFO on a short-circuited socket: the host socket behind it is
    /// an unconnected port reservation (state CLOSE, zero counters), so the answer is
    /// its tcp_info with the connection's state (from this end's shutdown and the
    /// entry's flags) and byte counts (from the segment) written in. None: not ours.
    pub(super) fn sc_tcp_info(
        &mut self,
        index: u32,
        level: i32,
        name: i32,
        out: &mut [u8],
    ) -> Option<Result<(i64, usize), i32>> {
        if level != libc::IPPROTO_TCP || name != libc::TCP_INFO {
            return None;
        }
        let s = self.sockets.get(index as usize)?.as_ref()?;
        if s.is_closing() {
            return None; // the usual path answers
        }
        let link = s.link()?;
        let fd = match self.option_fd(index) {
            Ok(fd) => fd,
            Err(e) => return Some(Err(e)),
        };
        let n = match sys::getsockopt_bytes(fd, level, name, out) {
            Ok(n) => n,
            Err(e) => return Some(Err(sys::errno_of(&e))),
        };
        let s = self.sockets.get(index as usize)?.as_ref()?;
        let flags = s.flags;
        let state = if flags & sock_flag::ERROR != 0 {
            TCP_CLOSE
        } else {
            match (link.shut_wr, flags & sock_flag::RX_EOF != 0) {
                (false, false) => TCP_ESTABLISHED,
                (false, true) => TCP_CLOSE_WAIT,
                (true, false) => TCP_FIN_WAIT2,
                (true, true) => TCP_CLOSE,
            }
        };
        if n > 0 {
            out[0] = state;
        }
        if let Some((tx, rx)) = self.sc_bytes(s) {
            // tcpi_bytes_acked at 120, tcpi_bytes_received at 128 (u64 each).
            for (off, v) in [(120, tx), (128, rx)] {
                if n >= off + 8 {
                    out[off..off + 8].copy_from_slice(&v.to_ne_bytes());
                }
            }
        }
        Some(Ok((0, n)))
    }

    /// The host socket that holds socket `index`'s options, made on first need
    /// (`HostSocket::made_fd`).
    pub(crate) fn option_fd(&mut self, index: u32) -> Result<&OwnedFd, i32> {
        self.sockets
            .get_mut(index as usize)
            .and_then(|s| s.as_mut())
            .ok_or(errno::EBADF)?
            .made_fd()
    }

    /// An entry is being freed: tell the other end (FIN, or RESET if this end left
    /// bytes unread — the kernel's rule for close) and drop the listener's
    /// registration.
    pub(super) fn sc_freed(&mut self, s: &HostSocket) {
        let Some(sc) = self.sc.clone() else { return };
        let mut sh = lock(&sc);
        if s.kind() == Kind::Listener {
            sh.unlisten(self.conn, s.handle);
            return;
        }
        let Some(link) = s.link() else {
            return;
        };
        let rx_dir = 1 - link.side.min(1);
        let unread = sh.segments.get(&link.id).is_some_and(|r| {
            let h = r.read_u64(segment::head_offset(rx_dir));
            let t = r.read_u64(segment::tail_offset(rx_dir));
            let ring = matches!((h, t), (Some(h), Some(t)) if h != t);
            // Zone-sent bytes not consumed yet are unread data too (§10.4).
            let zone = r.zone_size != 0 && {
                let h = r.read_u64(segment::zone_head_offset(rx_dir));
                let t = r.read_u64(segment::zone_tail_offset(rx_dir));
                matches!((h, t), (Some(h), Some(t)) if h != t)
            };
            ring || zone
        });
        let reset = unread || s.linger == Some(0);
        sh.post_from(
            self.conn,
            Job::Event(Event::Closed {
                id: link.id,
                side: link.side,
                conn: link.peer_conn,
                handle: link.peer_handle,
                reset,
            }),
        );
    }

    /// Bytes sent and received on a short-circuited socket (from the segment's
    /// indices; guest-written, so statistics only).
    pub(crate) fn sc_bytes(&self, s: &HostSocket) -> Option<(u64, u64)> {
        let link = s.link()?;
        let sh = lock(self.sc.as_ref()?);
        let r = sh.segments.get(&link.id)?;
        let tx = r.read_u64(segment::head_offset(link.side.min(1)))?;
        let rx = r.read_u64(segment::tail_offset(1 - link.side.min(1)))?;
        Some((tx, rx))
    }

    /// Zone buffers a short-circuited socket with zones has posted (statistics only).
    pub(crate) fn sc_zone_sends(&self, s: &HostSocket) -> Option<u64> {
        let link = s.link()?;
        let sh = lock(self.sc.as_ref()?);
        let r = sh.segments.get(&link.id)?;
        if r.zone_size == 0 {
            return None;
        }
        r.read_u64(segment::zone_head_offset(link.side.min(1)))
    }

    pub(crate) fn sc_event(&mut self, ev: Event) {
        let (handle, add, err) = match ev {
            Event::Wake { handle, .. } => (handle, 0, 0),
            Event::Fin { handle, .. } => (handle, sock_flag::RX_EOF, 0),
            Event::Closed { handle, reset, .. } => (
                handle,
                sock_flag::RX_EOF | sock_flag::TX_CLOSED,
                if reset { errno::ECONNRESET } else { 0 },
            ),
        };
        let Some(index) = self.sc_index(handle) else {
            return;
        };
        if self.sockets[index as usize]
            .as_ref()
            .is_none_or(|s| s.seg.is_none())
        {
            return;
        }
        // A reset after the peer's FIN finds this end in CLOSE_WAIT, where the kernel's
        // tcp_reset reports EPIPE, not ECONNRESET.
        let after_fin = self.entry(index).flags.load(Ordering::Relaxed) & sock_flag::RX_EOF != 0;
        let err = if err == errno::ECONNRESET && after_fin {
            errno::EPIPE
        } else {
            err
        };
        if err != 0 {
            self.set_error(index, err, add, 0);
        } else if add != 0 {
            self.set_flags(index, add, 0);
        } else {
            // A relayed wake-up is no event of its own: the bytes that caused it moved
            // the ring head, which is the edge (libcanal's `edge_seq`). Counting it too
            // made an edge-triggered epoll report a second edge for one arrival when
            // the relay landed after the reader had looked (likelier across workers).
            self.mark_to_wake(index);
        }
        self.wake_event_sleepers();
        if add != 0 {
            self.sc_futex_wake(index);
        }
    }

    /// After changing a short-circuited socket's flags: wake its threads that sleep
    /// in FUTEX_WAIT (they do not sleep on their slot eventfd).
    pub(crate) fn sc_futex_wake(&self, index: u32) {
        let Some(Some(s)) = self.sockets.get(index as usize) else {
            return;
        };
        let (Some(link), Some(sc)) = (s.link(), self.sc.as_ref()) else {
            return;
        };
        if let Some(r) = lock(sc).segments.get(&link.id) {
            r.futex_bump_wake(segment::wake_seq_offset(link.side.min(1)));
        }
    }
}

/// Whether worker `me` has short-circuit jobs queued (it must not sleep).
pub(crate) fn has_work(shared: &SharedRef, me: u32) -> bool {
    lock(shared).has_work(me)
}

/// Drops a guest that left (its home reaped it) from the routing table.
pub(crate) fn forget(shared: &SharedRef, conn: u32) {
    let mut sh = lock(shared);
    sh.fast_forget(conn);
    sh.homes.remove(&conn);
    sh.arenas.forget(conn);
    sh.bells.forget(conn);
    sh.locals.forget(conn);
}

/// Runs worker `me`'s jobs: pairings, completions and peer events for the guests it
/// is home to (`guests`). Called by each worker after every service round.
/// `shadows`: the guests whose listeners this worker owns (virtual RSS).
pub(crate) fn run(
    shared: &SharedRef,
    me: u32,
    guests: &mut BTreeMap<u32, Guest>,
    shadows: &mut BTreeMap<u32, Guest>,
    ep: &Epoll,
) -> bool {
    let mut work = false;
    let mut retry = Vec::new();
    for _ in 0..4 {
        let jobs = {
            let mut sh = lock(shared);
            match sh.jobs.get_mut(me as usize) {
                Some(q) if !q.is_empty() => std::mem::take(q),
                _ => {
                    // The jobs done: fast connects' tickets given back or used are
                    // granted again, under the lock every round takes anyway.
                    sh.fast_refill();
                    break;
                }
            }
        };
        work = true;
        for job in jobs {
            match job {
                Job::Pair(p) => {
                    let again = if p.fast != 0 {
                        crate::guest::fast::pair_fast(shared, me, guests, p)
                    } else {
                        pair(shared, me, guests, shadows, p)
                    };
                    if let Some(p) = again {
                        retry.push(Job::Pair(p));
                    }
                }
                Job::Connected { conn, handle, link } => {
                    let ok = guests
                        .get_mut(&conn)
                        .is_some_and(|c| c.sc_connected(ep, handle, link));
                    if !ok {
                        // The connector vanished meanwhile: the accepted end sees a
                        // closed peer.
                        lock(shared).post(
                            me,
                            Job::Event(Event::Closed {
                                id: link.id,
                                side: side::CONNECTOR,
                                conn: link.peer_conn,
                                handle: link.peer_handle,
                                reset: false,
                            }),
                        );
                    }
                }
                Job::Fallback { conn, handle, dst } => {
                    if let Some(c) = guests.get_mut(&conn) {
                        c.sc_fallback(ep, handle, &dst);
                    }
                }
                Job::Event(ev) => {
                    if let Event::Closed { id, side, .. } = ev {
                        let mut sh = lock(shared);
                        if let Some(r) = sh.segments.get_mut(&id) {
                            r.open[side.min(1) as usize] = false;
                            if r.open == [false, false] {
                                sh.drop_segment(id);
                            }
                        }
                    }
                    if let Some(g) = guests.get_mut(&job.conn()) {
                        g.sc_event(ev);
                    }
                }
            }
        }
    }
    if !retry.is_empty() {
        let mut sh = lock(shared);
        for j in retry {
            sh.post(me, j);
        }
    }
    work
}

/// The listener's half of a pending short-circuit (on the listener guest's home):
/// creates the segment, installs the accepted end, then queues the connector's half
/// for its home. Some(p): retry later (the accept queue is full).
pub(crate) fn pair(
    shared: &SharedRef,
    me: u32,
    guests: &mut BTreeMap<u32, Guest>,
    shadows: &mut BTreeMap<u32, Guest>,
    p: Pending,
) -> Option<Pending> {
    // A listener its home handed to another worker: the pairing goes there.
    if let Some(w) = guests.get(&p.lconn).and_then(|g| g.away_owner(p.lhandle)) {
        lock(shared).post_to(me, w, Job::Pair(p));
        return None;
    }
    let has = |g: &Guest| g.sc_index(p.lhandle).is_some();
    let at_home = guests.get(&p.lconn).is_some_and(has);
    if !at_home && !shadows.get(&p.lconn).is_some_and(has) && !guests.contains_key(&p.lconn) {
        // Forwarded here, but the listener is not (yet) here: its hand-off may still
        // sit in this worker's mailbox, or it was freed and the home has not read
        // that yet. The home decides again (both agree once those are read).
        let mut sh = lock(shared);
        if sh.homes.get(&p.lconn).is_some_and(|&h| h != me) {
            sh.post(me, Job::Pair(p));
            return None;
        }
    }
    // A connector served by this worker too that closed or left meanwhile: nothing
    // to pair (one on another worker is checked by its home, in `Connected`).
    if let Some(c) = guests.get(&p.conn) {
        let live = c.sc_index(p.handle).is_some_and(|i| {
            c.sockets[i as usize]
                .as_ref()
                .is_some_and(|s| s.phase == Phase::Connecting && s.closing.is_none())
        });
        if !live || c.gone.is_some() {
            return None;
        }
    }
    // Zones only between two guests that both have the ZONES feature (§10.4); arenas
    // between two that both have ARENAS (§8.7), for segments without zones.
    let lfeatures = guests
        .get(&p.lconn)
        .or(shadows.get(&p.lconn))
        .map_or(0, |g| g.region.header().features);
    let want_zones = p.zones && lfeatures & canal_abi::feature::ZONES != 0;
    let want_arenas = match (p.arenas, ArenaLayout::for_features(lfeatures)) {
        (Some(ArenaLayout::Packed), Some(ArenaLayout::Packed)) => Some(ArenaLayout::Packed),
        (Some(_), Some(_)) => Some(ArenaLayout::Paged),
        _ => None,
    };
    let (id, ring_size, listener, zones, arenas) = {
        let mut sh = lock(shared);
        let zones = sh.zones && want_zones;
        let arenas = want_arenas.filter(|_| sh.use_arenas);
        let listener = sh.listener(p.lconn, p.lhandle).copied();
        let id = sh.next_id;
        sh.next_id = sh.next_id.wrapping_add(1).max(1);
        (id, sh.ring_size, listener, zones, arenas)
    };
    let (backlog, lfamily) = (listener.map(|l| l.backlog), listener.map(|l| l.addr.family));
    let mut dst = p.dst;
    if is_unspecified(&dst) {
        let port = dst.port;
        dst = loopback(dst.family);
        dst.port = port;
    }
    let accepted_link = acceptor_link(id, &p, &dst, lfamily);
    let zone_layout = zones
        .then(|| canal_abi::zone::plan(id, &zone_classes(ring_size)).ok())
        .flatten();
    let zone_size = zone_layout.map_or(0, |l| l.zone_size);
    let owners = [p.conn, p.lconn];
    let seg = backlog.and_then(|_| match arenas.filter(|_| zone_layout.is_none()) {
        Some(layout) => arena_segment(&mut lock(shared), id, (layout, ring_size), owners),
        None => new_segment(id, ring_size, zone_layout.as_ref(), owners),
    });
    // The listener's guest instance here: its home, or the shadow owning it.
    let lg = if at_home {
        guests.get_mut(&p.lconn)
    } else {
        shadows.get_mut(&p.lconn)
    };
    let accepted = match (backlog, seg, lg) {
        (Some(backlog), Some(mem), Some(l)) => {
            // Register the segment first: the accepted entry names it.
            lock(shared).segments.insert(
                id,
                SegmentRec {
                    mem,
                    conns: [p.conn, p.lconn],
                    open: [true, true],
                    ring_size,
                    zone_size,
                },
            );
            let away = || ScAccept {
                shared: shared.clone(),
                p,
                id,
                dst,
                link: accepted_link,
            };
            match l.sc_accept(p.lhandle, backlog, accepted_link, away) {
                Ok(Accepted::Now(h)) => Some(h),
                // The home installs the accepted end; then this worker publishes it
                // and completes the pair (`vrss::Guest::accept_done`).
                Ok(Accepted::Forwarded) => return None,
                other => {
                    lock(shared).drop_segment(id);
                    if matches!(other, Ok(Accepted::Full)) {
                        return Some(p); // accept queue full: retry
                    }
                    None
                }
            }
        }
        _ => None,
    };
    let job = match accepted {
        Some(ah) => Job::Connected {
            conn: p.conn,
            handle: p.handle,
            link: connector_link(id, &p, &dst, ah),
        },
        None => Job::Fallback {
            conn: p.conn,
            handle: p.handle,
            dst: p.dst,
        },
    };
    let mut sh = lock(shared);
    // Paired: the connector's next connects there may go fast (protocol §8.10).
    if let (Job::Connected { .. }, Some(l), Some(seen)) = (&job, listener, p.seen) {
        sh.fast_learn(p.conn, &l, &p.dst, seen);
    }
    sh.post(me, job);
    None
}
