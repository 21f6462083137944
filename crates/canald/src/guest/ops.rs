//! Socket operations a guest requests: create, listen, connect, shutdown, close, and
//! the table entries and rings behind them.
use crate::guest::config::DRAIN_STALL;
use crate::guest::config::MIN_RING;
use crate::guest::socket::fd_of;
use crate::guest::socket::token;
use crate::guest::socket::HostSocket;
use crate::guest::socket::Kind;
use crate::guest::socket::Phase;
use crate::guest::socket::RingPos;
use crate::guest::socket::{effective_backlog, AcceptQueue, KindState};
use crate::guest::state::Guest;
use crate::request::SOCK_DGRAM;
use crate::request::SOCK_STREAM;
use crate::sys;
use crate::sys::Epoll;
use canal_abi::canal_opt;
use canal_abi::errno;
use canal_abi::make_handle;
use canal_abi::sock_flag;
use canal_abi::sock_kind;
use canal_abi::sync::Ordering;
use canal_abi::CanalAddr;
use canal_abi::SocketEntry;
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::os::fd::OwnedFd;
use std::time::Instant;

/// Ring blocks of closed sockets a guest keeps warm (sixteen sockets' worth: with 16
/// concurrent short connections, two sockets' worth left most rings to be punched and
/// faulted in again, TLB shoot-downs included).
const WARM_RINGS: usize = 32;
/// A ring stays warm only if at most this many bytes went through it (its touched
/// pages, kept committed, are then at most four).
const WARM_TOUCHED: u64 = 16 << 10;

impl Guest {
    /// Index of a live (not closing) socket named by `handle`, else EBADF.
    pub(crate) fn lookup(&self, handle: u32) -> Result<u32, i32> {
        let index = canal_abi::handle_index(handle);
        match self.sockets.get(index as usize) {
            Some(Some(s)) if s.handle == handle && s.closing.is_none() => Ok(index),
            _ => Err(errno::EBADF),
        }
    }

    pub(crate) fn live(&mut self, index: u32) -> Result<&mut HostSocket, i32> {
        match self.sockets.get_mut(index as usize) {
            Some(Some(s)) => Ok(s),
            _ => Err(errno::EBADF),
        }
    }

    pub(crate) fn entry(&self, index: u32) -> &SocketEntry {
        self.region
            .socket(index)
            .expect("host socket indices are < socket_count")
    }

    /// A socket's two rings: the configured size while the data area has room for it
    /// and still for MIN_RING rings for every other free table entry; else the largest
    /// smaller power of two that leaves that room (down to MIN_RING). The area is
    /// sized for that (`--data-mib` on top of MIN_RING rings for every entry), so a
    /// guest with few sockets gets large rings, and one with many still gets every
    /// table entry (with smaller buffers, as the kernel's under memory pressure)
    /// rather than ENOBUFS. Returns (tx offset, rx offset, ring size).
    pub(crate) fn alloc_rings(&mut self) -> Result<(u64, u64, u64), i32> {
        let others = self.entries.available() as u64;
        let reserve = others.saturating_mul(2 * MIN_RING);
        let mut size = self.cfg.ring_size;
        while size > MIN_RING && 2 * size + reserve > self.ring_room() {
            size /= 2;
        }
        // A fragmented area may still lack a block of this size: halve on.
        loop {
            if let Some(tx) = self.ring_block(size) {
                if let Some(rx) = self.ring_block(size) {
                    return Ok((tx, rx, size));
                }
                // With its pages: it may have been a warm block.
                self.free_rings(&[(tx, size)]);
            }
            if !self.warm_rings.is_empty() {
                // Room the warm rings hold goes back first.
                for (off, size) in std::mem::take(&mut self.warm_rings) {
                    self.free_rings(&[(off, size)]);
                }
                continue;
            }
            if size <= MIN_RING {
                return Err(errno::ENOBUFS);
            }
            size /= 2;
        }
    }

    /// Data-area bytes rings can still have: the allocator's free blocks and the
    /// warm rings (which go back when the allocator runs short).
    pub(crate) fn ring_room(&self) -> u64 {
        self.alloc.free_bytes() + self.warm_rings.iter().map(|r| r.1).sum::<u64>()
    }

    /// A ring block of `size` bytes: a warm one (its touched pages still in every
    /// mapping) if there is one, else a fresh one from the allocator.
    fn ring_block(&mut self, size: u64) -> Option<u64> {
        // The last one kept: its lines are the likeliest to be still cached.
        match self.warm_rings.iter().rposition(|r| r.1 == size) {
            Some(i) => Some(self.warm_rings.swap_remove(i).0),
            None => self.alloc.alloc(size),
        }
    }

    /// A closed socket's rings: kept warm — allocated, pages not punched — when at
    /// most `WARM_TOUCHED` bytes went through each and fewer than `WARM_RINGS` are
    /// kept (a short connection's next socket then faults no page in, on either
    /// side: on one-client short connections punching and faulting the two ring pages
    /// was a sixth of all CPU); otherwise freed with their pages (`free_rings`). Stale
    /// bytes in a warm ring are this guest's own and count only between indices,
    /// which a new socket starts at zero.
    pub(crate) fn retire_rings(&mut self, rings: [&RingPos; 2]) {
        let small = |r: &RingPos| r.idx.max(r.seen) <= WARM_TOUCHED.min(r.size);
        if rings.iter().all(|r| small(r)) && self.warm_rings.len() + 2 <= WARM_RINGS {
            self.warm_rings
                .extend(rings.iter().map(|r| (r.off, r.size)));
        } else {
            self.free_rings(&rings.map(|r| (r.off, r.size)));
        }
    }

    /// Returns rings to the allocator and their pages to the system: the data area is
    /// sparse, so a guest's ring memory follows its live sockets down as well as up.
    pub(crate) fn free_rings(&mut self, rings: &[(u64, u64)]) {
        for &(off, size) in rings {
            if self.alloc.free(off, size) {
                self.map.release_data(&self.cfg.layout, off, size);
            }
        }
    }

    /// Returns rings no byte ever went through (their indices never moved) to the
    /// allocator only: their pages were punched out when they were last freed and
    /// neither side has written them since (a guest that wrote one anyway only keeps
    /// its own region's memory committed, within its data area).
    pub(crate) fn free_unused_rings(&mut self, rings: &[(u64, u64)]) {
        for &(off, size) in rings {
            self.alloc.free(off, size);
        }
    }

    /// Allocates an entry, rings and epoll registration for `fd`. Publishes the entry
    /// (kind last). Err(errno) leaves nothing allocated.
    pub(crate) fn install(
        &mut self,
        ep: &Epoll,
        fd: Option<OwnedFd>,
        kind: Kind,
        family: u16,
        phase: Phase,
    ) -> Result<u32, i32> {
        let index = self.take_entry().ok_or(errno::EMFILE)?;
        let (tx_off, rx_off, size) = match self.alloc_rings() {
            Ok(r) => r,
            Err(e) => {
                self.entries.give(index);
                return Err(e);
            }
        };
        let gen = self.generations[index as usize];
        let handle = make_handle(index, gen as u32);
        // An unconnected stream (a fresh socket, a spare) has no events canald needs
        // until it connects or listens; a short-circuited one never has.
        let polled = !(kind == Kind::Stream && phase == Phase::Open);
        if let Some(fd) = fd.as_ref().filter(|_| polled) {
            if let Err(e) = watch_host(ep, fd, self.conn, gen, index, kind) {
                self.alloc.free(tx_off, size);
                self.alloc.free(rx_off, size);
                self.entries.give(index);
                return Err(e);
            }
        }
        let flags = match phase {
            Phase::Connected => sock_flag::CONNECTED,
            _ => 0,
        };
        let e = self.entry(index);
        // Guest line: a fresh entry starts with empty rings and no guest state.
        e.reset_guest_line();
        // Host lines.
        e.flags.store(flags, Ordering::Relaxed);
        e.pending_error.store(0, Ordering::Relaxed);
        e.tx_tail.store(0, Ordering::Relaxed);
        e.rx_head.store(0, Ordering::Relaxed);
        e.generation.store(gen as u32, Ordering::Relaxed);
        e.family.store(family as u32, Ordering::Relaxed);
        e.tx_offset.store(tx_off, Ordering::Relaxed);
        e.tx_size.store(size as u32, Ordering::Relaxed);
        e.rx_offset.store(rx_off, Ordering::Relaxed);
        e.rx_size.store(size as u32, Ordering::Relaxed);
        e.owner.store(self.self_owner(), Ordering::Relaxed);
        let k = match kind {
            Kind::Stream => sock_kind::STREAM,
            Kind::Dgram => sock_kind::DGRAM,
            Kind::Listener => sock_kind::LISTENER,
        };
        // Release: everything above is visible before the kind (and before the handle
        // reaches the guest through a DONE result or an ACCEPT record).
        e.kind.store(k, Ordering::Release);
        let ring = |off| RingPos {
            off,
            size,
            idx: 0,
            seen: 0,
        };
        let mut s = HostSocket::new(
            handle,
            KindState::new(kind),
            family,
            fd,
            (phase, flags),
            (ring(tx_off), ring(rx_off)),
        );
        s.polled = polled && s.fd.is_some();
        self.put_socket(index, s);
        self.set_owned(index, true);
        Ok(handle)
    }

    pub(crate) fn op_socket(
        &mut self,
        ep: &Epoll,
        domain: i32,
        ty: i32,
        protocol: i32,
    ) -> Result<u32, i32> {
        // A TCP/IPv4 socket cannot fail to be made but for want of descriptors or
        // memory: made when a call needs it, like a spare (a short-circuited connect
        // never does). Other families and protocols are made now, so socket() gets
        // the kernel's answer (EAFNOSUPPORT where IPv6 is off, EPROTONOSUPPORT).
        if ty == SOCK_STREAM
            && domain == libc::AF_INET
            && [0, libc::IPPROTO_TCP].contains(&protocol)
        {
            return self.op_socket_unmade(ep, domain);
        }
        self.room_for_socket()?;
        let fd = crate::guest::socket::new_socket(domain, ty, protocol)?;
        let kind = if ty == SOCK_STREAM {
            Kind::Stream
        } else {
            debug_assert_eq!(ty, SOCK_DGRAM);
            Kind::Dgram
        };
        self.install(ep, Some(fd), kind, domain as u16, Phase::Open)
    }

    /// A stream socket of `domain` whose host socket is made when a call first needs
    /// it (`HostSocket::made_fd`): a spare or a TCP/IPv4 socket by request, which a
    /// short-circuited connect takes without ever making one.
    pub(crate) fn op_socket_unmade(&mut self, ep: &Epoll, domain: i32) -> Result<u32, i32> {
        self.room_for_socket()?;
        self.install(ep, None, Kind::Stream, domain as u16, Phase::Open)
    }

    /// The caps, checked before a socket is made: the table, then ring memory.
    fn room_for_socket(&self) -> Result<(), i32> {
        if self.table_full() {
            return Err(errno::EMFILE);
        }
        if self.ring_room() < 2 * MIN_RING {
            return Err(errno::ENOBUFS);
        }
        Ok(())
    }

    pub(crate) fn op_listen(
        &mut self,
        ep: &Epoll,
        index: u32,
        backlog: i32,
    ) -> Result<(i64, usize), i32> {
        // Options set on the stream before listen (§3.4 `options`, no request) are the
        // listener's: on the host socket before the first connection can arrive.
        self.sync_kept_options(index);
        let s = self.live(index)?;
        if s.kind() == Kind::Dgram {
            return Err(errno::EOPNOTSUPP);
        }
        if !matches!(s.phase, Phase::Open | Phase::Listening) {
            return Err(errno::EINVAL);
        }
        // Connections held for the program count against its backlog (a second
        // listen only changes the backlog, as natively).
        let eff = effective_backlog(backlog);
        let held = s.accepts().map_or(0, AcceptQueue::held);
        // A guest that accepts its native clients itself (feature NATIVE_ACCEPT): the
        // host listener's queue is its own, with its own backlog
        // (`look_at_queue`).
        let features = self.region.header().features;
        let native = features & canal_abi::feature::NATIVE_ACCEPT != 0 && !self.is_shadow();
        // A guest that waits on HOST_QUEUED gets no connection taken ahead before its
        // first accept asks (`Guest::accept_asked`).
        let first_asks = features & canal_abi::feature::HOST_QUEUED != 0;
        let host = if native {
            eff as i32
        } else {
            AcceptQueue::host_backlog(eff, held, 0)
        };
        // A listener's connections arrive as events.
        self.poll_host(ep, index)?;
        let s = self.live(index)?;
        if native {
            // Its connections are the program's: they inherit the program's SO_LINGER,
            // set before the first can be queued.
            crate::guest::socket::put_program_linger(fd_of(s)?, s.linger);
        }
        sys::listen(fd_of(s)?, host).map_err(|e| sys::errno_of(&e))?;
        let fd = s.fd.as_ref().ok_or(errno::EBADF)?;
        match s.state {
            KindState::Listener(ref mut q) => {
                (q.backlog, q.host_backlog) = (eff, host);
                q.sync_refusal(fd, 0);
            }
            _ => {
                let mut q = AcceptQueue::new(eff);
                q.started = !first_asks;
                q.host_port = sys::sockname(fd).map_or(0, |a| a.port);
                let port = q.host_port;
                s.state = KindState::Listener(Box::new(q));
                self.listener_ports.entry(port).or_default().push(index);
            }
        }
        let s = self.live(index)?;
        s.phase = Phase::Listening;
        s.net.listened();
        s.readable = true; // connections may already be queued
        let e = self.entry(index);
        e.kind.store(sock_kind::LISTENER, Ordering::Release);
        if native && features & canal_abi::feature::NATIVE_QUIET != 0 {
            self.watch_native(ep, index, true)?;
        }
        let native = if native { sock_flag::NATIVE_ACCEPT } else { 0 };
        self.set_flags(index, sock_flag::LISTENING | native, 0);
        self.sc_listened(index, backlog);
        self.mark_dirty(index);
        Ok((0, 0))
    }

    /// SO_RCVLOWAT on a stream or listener: the kernel's checks and its own value
    /// (it maps 0 to 1, caps large ones, grows the receive buffer to fit), answered
    /// back for the library to apply — readiness and blocking receives follow the
    /// entry's `rcvlowat` (protocol §3.4). The host socket itself goes back to 1:
    /// canald must see every byte arrive (with the mark there, 3 bytes of 10 stayed
    /// in the host socket and a non-blocking receive found nothing), and an accepted
    /// host socket inherits its listener's 1 (the entry inherits the mark).
    pub(crate) fn set_stream_rcvlowat(
        &mut self,
        index: u32,
        value: &[u8],
        out: &mut [u8; canal_abi::SLOT_PAYLOAD],
    ) -> Result<(i64, usize), i32> {
        let lvl = libc::SOL_SOCKET;
        let family = self.live(index)?.family;
        crate::sockopt::check_set(family, false, lvl, libc::SO_RCVLOWAT, value)?;
        let fd = self.option_fd(index)?;
        sys::setsockopt_bytes(fd, lvl, libc::SO_RCVLOWAT, value).map_err(|e| sys::errno_of(&e))?;
        let n = sys::getsockopt_bytes(fd, lvl, libc::SO_RCVLOWAT, &mut out[..4])
            .map_err(|e| sys::errno_of(&e))?;
        sys::setsockopt_bytes(fd, lvl, libc::SO_RCVLOWAT, &1i32.to_ne_bytes())
            .map_err(|e| sys::errno_of(&e))?;
        Ok((0, n))
    }

    /// connect(AF_UNSPEC) on a datagram socket: the kernel drops the default peer
    /// (and keeps the local address); other kinds: EOPNOTSUPP.
    pub(crate) fn op_disconnect(&mut self, index: u32) -> Result<(i64, usize), i32> {
        let s = self.live(index)?;
        if s.kind() != Kind::Dgram {
            return Err(errno::EOPNOTSUPP);
        }
        sys::disconnect(fd_of(s)?).map_err(|e| sys::errno_of(&e))?;
        if s.phase == Phase::Connected {
            s.phase = Phase::Open;
        }
        self.set_flags(index, 0, sock_flag::CONNECTED);
        self.mark_dirty(index);
        Ok((0, 0))
    }

    /// CONNECT on a host socket: the answer's value (0, or -EINPROGRESS) and, when a
    /// loopback handshake had settled already, the host peer it read (for the answer's
    /// names).
    pub(crate) fn op_connect(
        &mut self,
        ep: &Epoll,
        index: u32,
        a: &CanalAddr,
    ) -> Result<(i64, Option<CanalAddr>), i32> {
        let s = self.live(index)?;
        match (s.kind(), s.phase) {
            (Kind::Listener, _) => return Err(errno::EISCONN),
            (Kind::Stream, Phase::Connecting) => return Err(errno::EALREADY),
            (Kind::Stream, Phase::Connected) => return Err(errno::EISCONN),
            (_, Phase::Broken) => return Err(errno::EIO),
            _ => {}
        }
        // A socket made lazily, or a short-circuit that fell back, needs its own now.
        s.made_fd()?;
        // The handshake's completion comes as an event.
        self.poll_host(ep, index)?;
        let s = self.live(index)?;
        let kind = s.kind();
        let r = sys::connect(fd_of(s)?, a);
        match r {
            Ok(()) => {
                s.phase = Phase::Connected;
                s.writable = true;
                // A retry after a failed connect starts clean.
                self.set_flags(
                    index,
                    sock_flag::CONNECTED,
                    sock_flag::CONNECTING | sock_flag::ERROR | sock_flag::HUP,
                );
                self.mark_dirty(index);
                Ok((0, None))
            }
            Err(e) if kind == Kind::Stream && e.raw_os_error() == Some(libc::EINPROGRESS) => {
                s.phase = Phase::Connecting;
                // Events before the connect (a fresh socket reports OUT|HUP) say nothing
                // about its completion.
                s.readable = false;
                s.writable = false;
                self.set_flags(
                    index,
                    sock_flag::CONNECTING,
                    sock_flag::ERROR | sock_flag::HUP,
                );
                // A loopback handshake has ended before connect returns: finish it now
                // (the answer stays EINPROGRESS, as natively), so a blocking connect
                // finds CONNECTED when it wakes instead of waiting for the next round's
                // epoll event and a second wake-up. One getpeername tells: it names the
                // peer only once the connection is established, and the answer's names
                // reuse it; a refused connect has its error already.
                let settled = match self.sockets[index as usize]
                    .as_ref()
                    .and_then(|s| s.fd.as_ref())
                {
                    Some(fd) => sys::peername(fd).map_err(|_| sys::so_error(fd)),
                    None => Err(0),
                };
                let peer = match settled {
                    Ok(peer) => {
                        // Its own listener holds the connection now, as natively
                        // once connect returns: taken before the guest sees CONNECTED.
                        self.serve_listeners_on(ep, peer.port);
                        self.connect_done(index);
                        Some(peer)
                    }
                    Err(0) => None,
                    // (SO_ERROR is cleared by reading it: the error goes on from here.)
                    Err(e) => {
                        self.connect_failed(index, e);
                        None
                    }
                };
                self.mark_dirty(index);
                Ok((-(errno::EINPROGRESS as i64), peer))
            }
            Err(e) => Err(sys::errno_of(&e)),
        }
    }

    pub(crate) fn op_close(&mut self, index: u32) {
        if let Some(Some(s)) = self.sockets.get_mut(index as usize) {
            let d = Instant::now() + DRAIN_STALL;
            s.closing = Some(d);
            self.note_deadline(d);
            self.set_flags(index, sock_flag::CLOSING, 0);
            self.mark_dirty(index);
        }
    }

    /// Whether socket `index` exists with this generation (a WATCH target).
    pub(crate) fn has_live_socket(&self, index: u32, gen: u16) -> bool {
        matches!(self.sockets.get(index as usize), Some(Some(s)) if s.generation() == gen)
            || self.has_away(index, gen)
    }

    /// The guest's last descriptor of socket (index, gen) is gone (its WATCH fired):
    /// close it as a CLOSE request would, unless it is already closing.
    pub(crate) fn close_unreferenced(&mut self, index: u32, gen: u16) {
        if self.close_away(index, gen) {
            return; // served by another worker: forwarded there
        }
        if matches!(self.sockets.get(index as usize),
            Some(Some(s)) if s.generation() == gen && !s.is_closing())
        {
            self.op_close(index);
        }
    }

    /// Socket (index, gen)'s WATCH hung up (seen by epoll, or by CLOSE_CHECK): the
    /// socket closes as by CLOSE, its address freed now if nothing is left to send,
    /// and the WATCH end leaves the quota.
    pub(crate) fn close_watched(&mut self, ep: &Epoll, index: u32, gen: u16) {
        self.close_unreferenced(index, gen);
        self.finish_if_closed(ep, index, std::time::Instant::now());
        self.watch_closed(ep);
    }

    /// A WATCH end was closed: its descriptor leaves the guest's quota.
    pub(crate) fn watch_closed(&mut self, ep: &Epoll) {
        self.entries.release_apart();
        self.quota_freed(ep);
    }

    /// Room in the guest's quota came back (an entry or a WATCH end freed): a listener
    /// that stopped accepting for lack of it can go on, and so can connections an away
    /// listener accepted. Both are no-ops when nothing waits.
    pub(crate) fn quota_freed(&mut self, ep: &Epoll) {
        if self.gone.is_none() {
            self.rearm_listeners();
            self.retry_accepts(ep);
        }
    }

    /// The guest wrote bytes to socket (index, gen)'s dummy descriptor, through a
    /// path no hook sees (io_uring, a raw system call, a program exec'd without the
    /// library): they cannot reach the peer. A host stream is reset (its descriptor
    /// is abortive), so the peer never takes the stream as whole, and the socket's
    /// later calls fail with EIO: an error instead of a silent loss. Other sockets
    /// (datagram, short-circuited, served by another worker) are only reported.
    pub(crate) fn unseen_send(&mut self, ep: &Epoll, index: u32, gen: u16) {
        let handle = canal_abi::make_handle(index, gen as u32);
        let reset = matches!(self.sockets.get(index as usize),
            Some(Some(s)) if s.generation() == gen && s.kind() == Kind::Stream
                && s.seg.is_none() && s.fd.is_some() && !s.is_closing());
        log::warn!(
            "guest {} ({}): bytes written to socket {handle:#x}'s descriptor outside \
             canal's hooks (io_uring, a raw system call, or a program without the \
             library) cannot be delivered{}",
            self.id,
            self.comm,
            if reset {
                "; its connection is reset"
            } else {
                ""
            }
        );
        if reset {
            self.break_socket(ep, index);
        }
    }

    /// A socket's send queue (GETSOCKOPT at `canal_opt::LEVEL`): the bytes of its tx
    /// ring canald has not taken plus what the host socket's SIOCOUTQ (or SIOCOUTQNSD)
    /// counts, read together here, where no byte can move from one to the other in
    /// between. A short-circuited socket's queue is its segment ring, which the guest
    /// counts itself.
    pub(crate) fn send_queue(&mut self, index: u32, name: i32) -> Result<i32, i32> {
        let req = match name {
            canal_opt::OUTQ => sys::SIOCOUTQ,
            canal_opt::OUTQ_NOT_SENT => sys::SIOCOUTQNSD,
            _ => return Err(errno::ENOPROTOOPT),
        };
        let s = self.live(index)?;
        if s.kind() == Kind::Listener {
            return Err(errno::EINVAL); // as tcp_ioctl answers for a listener
        }
        let host = match s.fd.as_ref().filter(|_| s.seg.is_none()) {
            Some(fd) => sys::ioctl_int(fd, req).map_err(|e| sys::errno_of(&e))?,
            None => 0,
        };
        let ring = self.tx_avail(index).map_err(|_| errno::EIO)?;
        Ok((ring + host.max(0) as u64).min(i32::MAX as u64) as i32)
    }

    pub(crate) fn op_shutdown(
        &mut self,
        ep: &Epoll,
        index: u32,
        how: i32,
    ) -> Result<(i64, usize), i32> {
        if let Some(r) = self.sc_shutdown(index, how) {
            return r;
        }
        let s = self.live(index)?;
        let fd = fd_of(s)?;
        if !(s.kind() == Kind::Stream && s.phase == Phase::Connected) {
            // Listeners (wakes accept), datagram sockets, unconnected streams: the
            // kernel's answer is the native one (ENOTCONN where it applies).
            sys::shutdown(fd, how).map_err(|e| sys::errno_of(&e))?;
            let stopped = s.kind() == Kind::Listener && s.phase == Phase::Listening;
            s.readable = true;
            if stopped && how != libc::SHUT_WR {
                self.stop_listening(ep, index);
            }
            self.mark_dirty(index);
            return Ok((0, 0));
        }
        if how == libc::SHUT_RD || how == libc::SHUT_RDWR {
            sys::shutdown(fd, libc::SHUT_RD).map_err(|e| sys::errno_of(&e))?;
            s.readable = true;
        }
        if how == libc::SHUT_WR || how == libc::SHUT_RDWR {
            // Takes effect once the tx ring has drained (flush_stream_tx).
            s.shut_wr_pending = true;
        }
        self.mark_dirty(index);
        Ok((0, 0))
    }

    /// A listener shut down for reading: Linux disconnects it (inet_shutdown): it
    /// listens no more, its queued connections are reset, and a later listen() starts
    /// it again on its address (HAProxy pauses its listeners this way for a reload).
    /// canald's part: out of the short-circuit's listeners, the connections it held
    /// for the program reset, LISTENING cleared; the host socket did the rest.
    fn stop_listening(&mut self, ep: &Epoll, index: u32) {
        self.unserve_listener(ep, index);
        if let Some(Some(s)) = self.sockets.get_mut(index as usize) {
            s.phase = Phase::Open;
            s.readable = false;
        }
        self.set_flags(index, 0, sock_flag::LISTENING);
    }

    /// Publishes flag changes (adds HUP when both directions are over: the kernel's
    /// POLLHUP once it has shut down both ways).
    pub(crate) fn set_flags(&mut self, index: u32, add: u32, remove: u32) {
        let region = self.region;
        let Some(Some(s)) = self.sockets.get_mut(index as usize) else {
            return;
        };
        // A fast connect's CONNECTED (protocol §8.10) is the guest's own store until
        // canald reads its mark: an unpaired stream keeps it, also when the guest
        // sets it while canald writes (a WATCH's flag, say, must not take the
        // connection away from the program meanwhile).
        let guest_may_connect = s.kind() == Kind::Stream
            && s.phase == Phase::Open
            && s.seg.is_none()
            && remove & sock_flag::CONNECTED == 0;
        let mut f = (s.flags | add) & !remove;
        let both = sock_flag::RX_EOF | sock_flag::TX_CLOSED;
        // A short-circuited peer's close sets TX_CLOSED too (nobody reads: a write
        // fails with EPIPE), but this end has only received the FIN, as in the
        // kernel's CLOSE_WAIT (POLLIN|POLLRDHUP, no POLLHUP) until it shuts down
        // writing itself.
        let sent_fin = s.seg.as_ref().is_none_or(|l| l.shut_wr);
        if f & both == both && sent_fin {
            f |= sock_flag::HUP;
        }
        if f == s.flags {
            return;
        }
        let Some(e) = region.socket(index) else {
            return;
        };
        // The event first (`count_event`), as a reader of both expects.
        e.event_seq.fetch_add(1, Ordering::Release);
        if guest_may_connect {
            let keep = |cur: u32| Some(f | (cur & sock_flag::CONNECTED));
            let before = e
                .flags
                .fetch_update(Ordering::Release, Ordering::Acquire, keep)
                .unwrap_or(f);
            f |= before & sock_flag::CONNECTED;
        } else {
            e.flags.store(f, Ordering::Release);
        }
        s.flags = f;
        self.mark_to_wake(index);
    }

    pub(crate) fn set_error(&mut self, index: u32, err: i32, add: u32, remove: u32) {
        self.entry(index)
            .pending_error
            .store(err as u32, Ordering::Release);
        self.set_flags(index, add | sock_flag::ERROR, remove);
    }

    /// The guest violated the ring protocol on this socket: close the host side.
    pub(crate) fn break_socket(&mut self, ep: &Epoll, index: u32) {
        let Some(Some(s)) = self.sockets.get_mut(index as usize) else {
            return;
        };
        s.phase = Phase::Broken;
        if let Some(p) = s.pending_dgram() {
            *p = None;
        }
        if let Some(fd) = s.fd.take().filter(|_| s.polled) {
            ep.delete(fd.as_raw_fd());
        }
        s.polled = false;
        s.net = Default::default(); // the address went with the descriptor
        self.set_error(
            index,
            errno::EIO,
            sock_flag::BROKEN | sock_flag::HUP | sock_flag::RX_EOF | sock_flag::TX_CLOSED,
            sock_flag::CONNECTING | sock_flag::RX_WANT_SPACE,
        );
    }

    /// Releases an entry: host socket, rings, then kind FREE and a new generation.
    pub(crate) fn free_socket(&mut self, ep: &Epoll, index: u32) {
        // A fast connect not yet read (its WATCH hung up first, or the guest left):
        // paired all the same, so the acceptor gets what was sent before the close.
        self.take_fast_mark(ep, index);
        let reset = self.close_must_reset(index);
        let Some(s) = self.sockets.get_mut(index as usize).and_then(|s| s.take()) else {
            return;
        };
        // The guest's byte counters outlive its sockets (metrics are counters).
        let (tx, rx) = self.sc_bytes(&s).unwrap_or((s.tx_bytes, s.rx_bytes));
        self.freed_bytes.0 = self.freed_bytes.0.wrapping_add(tx);
        self.freed_bytes.1 = self.freed_bytes.1.wrapping_add(rx);
        // A host socket out of epoll never carried a connection: a stream that never
        // connected or listened, or a short-circuited one's (bound connector, plain
        // accepted end; the pairing took it out). Closing it sends nothing.
        if let Some(fd) = s.fd.as_ref().filter(|_| s.polled) {
            ep.delete(fd.as_raw_fd());
            // Host streams are abortive ({1, 0}) while canald drives them, so canald's
            // death resets them; an orderly close clears that first. Neither blocks.
            if s.kind() == Kind::Stream && !reset {
                let _ = sys::set_abortive_close(fd, false);
            }
        } else if let Some(fd) = s.fd.as_ref().filter(|_| reset) {
            // Not yet driven by canald (an accepted connection the guest never took):
            // abortive only now.
            let _ = sys::set_abortive_close(fd, true);
        }
        self.sc_freed(&s);
        self.dl_freed(&s);
        if let Some(q) = s.accepts() {
            self.release_unclaimed(ep, index, &q.unclaimed);
            self.forget_listener(index, q.host_port);
        }
        let g = s.generation();
        drop(s.fd);
        self.set_owned(index, false);
        let next = if g == u16::MAX { 1 } else { g + 1 };
        let e = self.entry(index);
        e.segment.store(0, Ordering::Relaxed);
        e.kind.store(sock_kind::FREE, Ordering::Release);
        e.generation.store(next as u32, Ordering::Release);
        e.flags.store(0, Ordering::Release);
        self.mark_changed(index);
        let rings = [(s.tx.off, s.tx.size), (s.rx.off, s.rx.size)];
        if self.give_back(index, next, rings) {
            return; // a shadow: the home reuses the entry and the rings
        }
        self.retire_rings([&s.tx, &s.rx]);
        self.generations[index as usize] = next;
        self.entries.give(index);
        self.quota_freed(ep);
    }

    /// Connections accepted for listener `index` but never taken by the guest go
    /// (the guest's tail says which records it consumed), reset as the kernel resets
    /// a closed or stopped listener's queue (inet_csk_listen_stop): the client reads
    /// ECONNRESET, not an orderly end.
    fn release_unclaimed(&mut self, ep: &Epoll, index: u32, unclaimed: &VecDeque<(u64, u32)>) {
        let tail = self.entry(index).rx_tail.load(Ordering::Acquire);
        for &(end, h) in unclaimed {
            if (end.wrapping_sub(tail) as i64) > 0 {
                let i = canal_abi::handle_index(h);
                if let Some(Some(s)) = self.sockets.get_mut(i as usize) {
                    if s.handle == h {
                        s.linger = Some(0);
                    }
                }
                self.release(ep, i, h);
            }
        }
    }

    /// Listener `index` takes no more connections from canald: out of the
    /// short-circuit's listeners, and those canald queued for the guest that it has
    /// not taken released (their clients reset).
    pub(crate) fn unserve_listener(&mut self, ep: &Epoll, index: u32) {
        if let Some(s) = self.sockets[index as usize].take() {
            self.sc_freed(&s);
            self.sockets[index as usize] = Some(s);
        }
        self.drop_unclaimed(ep, index);
        // Its program takes the host socket: not one that drops every packet.
        if let Some(Some(s)) = self.sockets.get_mut(index as usize) {
            if let (Some(fd), KindState::Listener(q)) = (s.fd.as_ref(), &mut s.state) {
                q.sync_refusal(fd, 0);
            }
        }
    }

    /// Releases the connections queued for listener `index` that the guest has not
    /// taken, and forgets them.
    fn drop_unclaimed(&mut self, ep: &Epoll, index: u32) {
        let queued = self
            .sockets
            .get_mut(index as usize)
            .and_then(|s| s.as_mut())
            .and_then(|s| s.accepts_mut())
            .map(|q| std::mem::take(&mut q.unclaimed));
        if let Some(q) = queued {
            self.release_unclaimed(ep, index, &q);
        }
    }

    /// Whether closing socket `index` now must reset its connection: the guest asked
    /// for it (SO_LINGER {1, 0}), or bytes its sends accepted are still queued, which
    /// can no longer be delivered (the peer must not take the stream as complete).
    pub(crate) fn close_must_reset(&mut self, index: u32) -> bool {
        let Some(Some(s)) = self.sockets.get(index as usize) else {
            return false;
        };
        if s.kind() != Kind::Stream || s.fd.is_none() || s.seg.is_some() {
            return false;
        }
        if s.linger == Some(0) {
            return true;
        }
        let sending = s.phase == Phase::Connected && s.flags & sock_flag::TX_CLOSED == 0;
        sending && self.tx_avail(index).map_or(true, |q| q > 0)
    }

    /// Puts socket `index`'s host socket in the worker's epoll if it is not yet (an
    /// unconnected stream, before it connects or listens).
    pub(crate) fn poll_host(&mut self, ep: &Epoll, index: u32) -> Result<(), i32> {
        let conn = self.conn;
        let s = self.live(index)?;
        if s.polled {
            return Ok(());
        }
        watch_host(ep, fd_of(s)?, conn, s.generation(), index, s.kind())?;
        s.polled = true;
        Ok(())
    }
}

/// Registers a guest socket's host socket in epoll (edge-triggered, every event);
/// a stream's close becomes abortive until an orderly close clears it: canald's death
/// must reset the connection, not end it cleanly with the guest's bytes in the ring.
fn watch_host(
    ep: &Epoll,
    fd: &OwnedFd,
    conn: u32,
    gen: u16,
    index: u32,
    kind: Kind,
) -> Result<(), i32> {
    let tok = token::make(token::SOCKET, conn, gen, index as u16);
    ep.add(fd.as_raw_fd(), sys::EP_HOST_SOCKET, tok)
        .map_err(|e| sys::errno_of(&e))?;
    if kind != Kind::Dgram {
        let _ = sys::set_abortive_close(fd, true);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::guest::config::GuestConfig;
    use crate::guest::state::Guest;
    use crate::request::Request;
    use crate::sys::Epoll;
    use canal_abi::sync::Ordering;
    use canal_abi::{op, Layout, SLOT_PAYLOAD};

    const RING: u64 = 64 * 1024;

    fn guest() -> (Guest, Epoll, std::os::fd::OwnedFd) {
        guest_of(4)
    }

    /// A guest with `n` entries and a data area for `n` sockets of whole rings.
    fn guest_of(n: u32) -> (Guest, Epoll, std::os::fd::OwnedFd) {
        let cfg = GuestConfig {
            loopback_only: true,
            ..GuestConfig::with_layout(Layout::new(4, n, 2 * n as u64 * RING).unwrap(), RING)
        };
        let (g, memfd) = Guest::new(1, 1, 0, "warm".into(), cfg).unwrap();
        (g, Epoll::new().unwrap(), memfd)
    }

    fn socket(g: &mut Guest, ep: &Epoll) -> (u32, u64, u64) {
        let mut out = [0u8; SLOT_PAYLOAD];
        let req = Request::new(op::SOCKET, 0, [2, 1, 0, 0], &[]);
        let h = g.execute(ep, &req, &mut out).unwrap().0 as u32;
        let e = g.entry(canal_abi::handle_index(h));
        let offs = (
            e.tx_offset.load(Ordering::Relaxed),
            e.rx_offset.load(Ordering::Relaxed),
        );
        (h, offs.0, offs.1)
    }

    fn close(g: &mut Guest, ep: &Epoll, h: u32) {
        let mut out = [0u8; SLOT_PAYLOAD];
        g.execute(ep, &Request::new(op::CLOSE, h, [0; 4], &[]), &mut out)
            .unwrap();
    }

    #[test]
    fn a_closed_sockets_rings_stay_warm_and_go_to_the_next_socket() {
        let (mut g, ep, _m) = guest();
        let (a, tx, rx) = socket(&mut g, &ep);
        close(&mut g, &ep, a);
        assert_eq!(g.warm_rings.len(), 2, "kept, not punched");
        assert_eq!(g.ring_room(), 8 * RING, "still room for them");
        let (_, tx2, rx2) = socket(&mut g, &ep);
        let (mut was, mut now) = ([tx, rx], [tx2, rx2]);
        was.sort();
        now.sort();
        assert_eq!(was, now, "the warm rings, reused");
        assert!(g.warm_rings.is_empty());
    }

    #[test]
    fn warm_rings_are_bounded_and_every_entry_still_gets_rings() {
        let n = super::WARM_RINGS as u32 / 2 + 2;
        let (mut g, ep, _m) = guest_of(n);
        let all: Vec<_> = (0..n).map(|_| socket(&mut g, &ep).0).collect();
        for h in all {
            close(&mut g, &ep, h);
        }
        assert_eq!(
            g.warm_rings.len(),
            super::WARM_RINGS,
            "sixteen sockets' worth"
        );
        // As many sockets of whole rings still fit: the warm ones first, then the
        // rest of the area, once the allocator has the punched ones back.
        for _ in 0..n {
            socket(&mut g, &ep);
        }
        assert!(g.warm_rings.is_empty());
    }
}
