//! One host socket driven for a guest: its kind, phase, ring positions, linger, and
//! the epoll token that names it.
use crate::guest::netview::{NetTie, PROTO_TCP, PROTO_UDP};
use crate::sys;
use canal_abi::errno;
use canal_abi::CanalAddr;
use std::os::fd::OwnedFd;
use std::time::Instant;

/// Epoll token layout: `type:8 | conn:24 | generation:16 | index:16`.
pub(crate) mod token {
    pub(crate) const LISTENER: u64 = 0;
    pub(crate) const CONTROL: u64 = 1;
    pub(crate) const DOORBELL: u64 = 2;
    pub(crate) const SOCKET: u64 = 3;
    pub(crate) const SIGNAL: u64 = 4;
    /// A worker's own eventfd (new guest, shutdown).
    pub(crate) const POKE: u64 = 5;
    /// A WATCH descriptor (`crate::watch`); distinct from every type above, since
    /// worker 0's poller consumes its own types before the daemon sees the rest.
    pub(crate) const WATCH: u64 = 6;
    /// The pidfd of a VM guest's VM process (`vm.rs`).
    pub(crate) const VM_PROCESS: u64 = 7;
    /// A guest's doorbell on a worker that is not its home (virtual RSS).
    pub(crate) const VRSS_DOORBELL: u64 = 8;
    /// A doorbell VM's ivshmem server (`ivshmem_server.rs`): index 0 its listener,
    /// 1 the QEMU client.
    pub(crate) const IVSHMEM: u64 = 9;

    pub(crate) fn make(ty: u64, conn: u32, gen: u16, index: u16) -> u64 {
        (ty << 56) | ((conn as u64 & 0xff_ffff) << 32) | ((gen as u64) << 16) | index as u64
    }
    pub(crate) fn ty(t: u64) -> u64 {
        t >> 56
    }
    pub(crate) fn conn(t: u64) -> u32 {
        ((t >> 32) & 0xff_ffff) as u32
    }
    pub(crate) fn gen(t: u64) -> u16 {
        (t >> 16) as u16
    }
    pub(crate) fn index(t: u64) -> u16 {
        t as u16
    }
}

// ---- address view -----------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Stream,
    Dgram,
    Listener,
}

/// The connection state machine of a host socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Created (maybe bound), neither connected nor listening.
    Open,
    Connecting,
    /// Connected (stream) or with a default peer (datagram).
    Connected,
    Listening,
    /// The connect failed or the connection was reset; the host socket may remain
    /// until the guest closes (so getsockname still works).
    Failed,
    /// The guest broke the protocol on this socket; the host socket is closed.
    Broken,
}

/// A ring as the host sees it: where it lives (host copy), the host's own index and
/// the last index the guest published.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RingPos {
    pub(crate) off: u64,
    pub(crate) size: u64,
    /// Host index: tx tail (consumer) or rx head (producer).
    pub(crate) idx: u64,
    /// Last guest index seen: tx head or rx tail.
    pub(crate) seen: u64,
}

/// SO_RCVLOWAT: a stream's is the library's to apply (protocol §3.4 `rcvlowat`).
pub(crate) fn is_rcvlowat(level: i32, name: i32) -> bool {
    level == libc::SOL_SOCKET && name == libc::SO_RCVLOWAT
}

pub(crate) fn is_linger(level: i32, name: i32) -> bool {
    level == libc::SOL_SOCKET && name == libc::SO_LINGER
}

/// A guest's `struct linger` as the kernel reads it: EINVAL if short; on when
/// `l_onoff` is non-zero (a negative time lingers "forever", as the kernel's
/// MAX_SCHEDULE_TIMEOUT does).
pub(crate) fn decode_linger(v: &[u8]) -> Result<Option<i32>, i32> {
    if v.len() < 8 {
        return Err(errno::EINVAL);
    }
    let on = i32::from_ne_bytes([v[0], v[1], v[2], v[3]]);
    let secs = i32::from_ne_bytes([v[4], v[5], v[6], v[7]]);
    Ok((on != 0).then_some(if secs < 0 { i32::MAX } else { secs }))
}

/// Puts the program's own SO_LINGER (`linger`, HostSocket::linger) on host socket
/// `fd` in place of canald's abortive close: for a socket the program holds itself
/// (handed over), or whose connections it holds itself (a NATIVE_ACCEPT listener:
/// the kernel copies a listener's SO_LINGER into each connection it queues, so
/// canald's {1, 0} would reset the program's connections at their close, dropping
/// what they had not sent).
pub(crate) fn put_program_linger(fd: &OwnedFd, linger: Option<i32>) {
    let _ = sys::set_abortive_close(fd, false);
    if let Some(secs) = linger {
        let _ = sys::setsockopt_bytes(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &encode_linger(Some(secs)),
        );
    }
}

pub(crate) fn encode_linger(l: Option<i32>) -> [u8; 8] {
    let mut v = [0u8; 8];
    v[..4].copy_from_slice(&(l.is_some() as i32).to_ne_bytes());
    v[4..].copy_from_slice(&l.unwrap_or(0).to_ne_bytes());
    v
}

/// The guest broke a ring's rules.
#[derive(Debug)]
pub(crate) struct Corrupt;

pub(crate) struct HostSocket {
    pub(crate) handle: u32,
    /// The kind and what only that kind carries.
    pub(crate) state: KindState,
    pub(crate) family: u16,
    /// None: not made yet (a spare, until a call needs it: `made_fd`), or a
    /// short-circuited end that never needed one.
    pub(crate) fd: Option<OwnedFd>,
    /// A short-circuited connector's local port, reserved without a socket of its own
    /// (`ports`); boxed, as only connectors have one.
    pub(crate) port: Option<Box<crate::guest::ports::PortHold>>,
    pub(crate) phase: Phase,
    pub(crate) tx: RingPos,
    pub(crate) rx: RingPos,
    /// Flags as last published to the entry.
    pub(crate) flags: u32,
    pub(crate) readable: bool,
    pub(crate) writable: bool,
    pub(crate) rdhup: bool,
    /// The peer sent urgent data (TCP MSG_OOB; canal carries none, the byte is dropped
    /// from the stream as natively): a read stops at its mark, so from now on a short
    /// read does not tell that the queue is empty.
    pub(crate) urgent: bool,
    pub(crate) shut_wr_pending: bool,
    /// Some(deadline): the guest closed it; the host drains tx and resets the
    /// connection if the deadline passes with bytes queued. Every drained byte moves
    /// the deadline DRAIN_STALL ahead.
    pub(crate) closing: Option<Instant>,
    /// The guest's SO_LINGER (emulated: the host socket's own is canald's, see
    /// `sys::set_abortive_close`): None off, Some(seconds) on. Some(0) makes close
    /// reset the connection.
    pub(crate) linger: Option<i32>,
    pub(crate) dirty: bool,
    pub(crate) tx_bytes: u64,
    pub(crate) rx_bytes: u64,
    /// Short-circuited to another canal socket through a pair segment (§8).
    /// Boxed: most sockets are not short-circuited, and every slot has the field.
    pub(crate) seg: Option<Box<SegLink>>,
    /// Its local address was seen bound (virtual RSS placement done once for it).
    pub(crate) named: bool,
    /// Its entry in its guest network's translation table (bound port, own client).
    pub(crate) net: NetTie,
    /// The guest's kept options (entry `options`, protocol §3.4) as last applied to
    /// the host socket (`sockopt::apply_kept`).
    pub(crate) applied_opts: u64,
    /// The guest's IPV6_V6ONLY in a network's view, where the host socket stays dual
    /// stack (its own addresses are IPv4-mapped private ones; `NetView::lo6`).
    pub(crate) v6only: bool,
    /// In a network's view: the guest named the resolver (10.0.2.3) as a destination,
    /// so the resolver's host address is 10.0.2.3:53 to it (`NetView::peer`).
    pub(crate) via_resolver: bool,
    /// Its host socket is in the worker's epoll (and, a stream, closes abortively while
    /// canald drives it). An unconnected stream is not, until it connects or listens
    /// (`Guest::poll_host`): a short-circuited connector never needs either.
    pub(crate) polled: bool,
    /// A NATIVE_ACCEPT listener of a NATIVE_QUIET guest: its host socket is watched
    /// for one arrival at a time (EPOLLONESHOT), not again until the guest relies on
    /// NATIVE_QUEUED (`guest_flag::NATIVE_LOOKS`: `Guest::watch_native`).
    pub(crate) native_quiet: bool,
}

/// What an accepted socket takes from its listener, as the kernel's does, beyond the
/// kept options the library copies (entry `options`): IPV6_V6ONLY in a network's view
/// and the emulated SO_LINGER.
#[derive(Clone, Copy)]
pub(crate) struct Inherited {
    pub(crate) v6only: bool,
    pub(crate) linger: Option<i32>,
}

impl HostSocket {
    /// What a connection accepted on this listener inherits.
    pub(crate) fn inherited(&self) -> Inherited {
        Inherited {
            v6only: self.v6only,
            linger: self.linger,
        }
    }

    /// Takes what its listener passes on (`inherited`).
    pub(crate) fn inherit(&mut self, from: Inherited) {
        self.v6only = from.v6only;
        self.linger = from.linger;
    }

    /// Whether this socket listens and the kernel's accept queue of its host socket
    /// holds clients now (a `poll`).
    pub(crate) fn kernel_queued(&self) -> bool {
        self.phase == Phase::Listening && self.fd.as_ref().is_some_and(|fd| sys::poll_in(fd, 0))
    }
}

/// A listener's accept queue as canald sees it.
#[derive(Default)]
pub(crate) struct AcceptQueue {
    /// (record end index, handle) of ACCEPT records the guest has not consumed yet.
    /// Their sockets are freed with the listener.
    pub(crate) unclaimed: std::collections::VecDeque<(u64, u32)>,
    /// Listener served away from its guest's home: connections accepted and sent to
    /// the home for their entries, whose ACCEPT records are not written yet.
    pub(crate) accepting: u32,
    /// The program's backlog as the kernel applies it (`effective_backlog`).
    pub(crate) backlog: u32,
    /// The backlog last given to the host listener: the program's less the
    /// connections canald holds accepted for it, so that both queues together hold
    /// what the kernel's one queue would (backlog + 1) and later clients wait.
    pub(crate) host_backlog: i32,
    /// How many connections canald may hold accepted ahead of the program: one until
    /// the program takes one, then doubling with each take, up to the backlog. Every
    /// accept holds the host listener's lock, and SYNs arriving meanwhile are checked
    /// against the queue together when it is released, before any of their handshakes
    /// completes: near a full queue, a burst then gets more clients through the
    /// handshake than natively (7 with listen(4), natively 5). A program that does not
    /// accept leaves its queue to the kernel after one.
    pub(crate) ahead: u32,
    /// The program fell behind: the records it had not taken filled more than half
    /// the backlog. Until it has taken them all, its accepts raise attention, so that
    /// the host listener gets its backlog back as they go (`Guest::watch_claims`).
    pub(crate) behind: bool,
    /// The host listener's port (0: unknown): a connect of the same guest that
    /// reaches it serves the listener at once (`Guest::serve_listeners_on`).
    pub(crate) host_port: u16,
    /// The host listener drops every packet (`refuses`; `sys::refuse_all`).
    pub(crate) refusing: bool,
    /// The program asked for a connection (feature HOST_QUEUED: an accept raised
    /// attention while `sock_flag::HOST_QUEUED` was set; `Guest::accept_asked`).
    /// Until then canald takes no client off the host listener, whose queue is then
    /// the kernel's one queue; without the feature a listener counts as started from
    /// its LISTEN.
    pub(crate) started: bool,
}

impl AcceptQueue {
    pub(crate) fn new(backlog: u32) -> AcceptQueue {
        AcceptQueue {
            backlog,
            host_backlog: AcceptQueue::host_backlog(backlog, 0, 0),
            ahead: 1,
            started: true,
            ..AcceptQueue::default()
        }
    }

    /// Connections accepted from the host listener that the program has not taken.
    pub(crate) fn held(&self) -> u32 {
        self.unclaimed.len() as u32 + self.accepting
    }

    /// The host listener's backlog: the program's (`backlog`) less the connections
    /// held for it and `more` about to be accepted. With none held it is the
    /// program's own, so a burst that arrives before canald's first accept finds the
    /// kernel's whole queue (backlog + 1), as natively: one short, the last client of
    /// such a burst waited a second for its SYN's retry (`progs/native_accept.py`'s
    /// backlog case, 2 of 6 where natively 3). The price is a listen(2) before the
    /// first accept ahead and after the program takes it.
    pub(crate) fn host_backlog(backlog: u32, held: u32, more: u32) -> i32 {
        backlog.saturating_sub(held + more) as i32
    }

    /// Whether the host listener must let no client in at all: canald holds, with
    /// `more` about to be, the whole queue the kernel would (backlog + 1). Only
    /// listen(0) gets there, holding one: a host listener's queue cannot be made to
    /// hold none, and a second client got through where Linux lets one.
    pub(crate) fn refuses(&self, more: u32) -> bool {
        self.held() + more > self.backlog
    }

    /// Applies `refuses(more)` to host listener `fd`.
    pub(crate) fn sync_refusal(&mut self, fd: &OwnedFd, more: u32) {
        let on = self.refuses(more);
        if on != self.refusing && crate::sys::refuse_all(fd, on).is_ok() {
            self.refusing = on;
        }
    }

    /// Whether canald holds as many accepted connections as it may ahead of the
    /// program (`ahead`, never more than the backlog lets the kernel queue).
    pub(crate) fn holds_enough(&self) -> bool {
        self.held() >= self.backlog.max(1).min(self.ahead)
    }

    /// The program took `n` connections: it accepts, so canald may hold more for it.
    pub(crate) fn taken(&mut self, n: u32) {
        if n > 0 {
            self.ahead = self
                .ahead
                .saturating_mul(2)
                .max(n + 1)
                .min(self.backlog.max(1));
        }
    }

    /// Whether `accept_ahead` lowers the host listener's backlog before its accept:
    /// only when the kernel's queue (`queued`, unknown as None) is full by the backlog
    /// given now, so that no client let in at its last place loses it at its ACK.
    pub(crate) fn lower_before_accept(&self, queued: Option<u32>) -> bool {
        queued.is_none_or(|n| i64::from(n) > i64::from(self.host_backlog))
    }

    /// `host_backlog` for this queue.
    pub(crate) fn host_backlog_for(&self, more: u32) -> i32 {
        AcceptQueue::host_backlog(self.backlog, self.held(), more)
    }
}

/// listen(2)'s backlog as the kernel applies it: above `net.core.somaxconn` (or
/// negative) it is somaxconn.
pub(crate) fn effective_backlog(backlog: i32) -> u32 {
    let max = crate::sys::somaxconn();
    if backlog < 0 || backlog as u32 > max {
        max
    } else {
        backlog as u32
    }
}

/// A host socket's kind with the state only that kind has (Firecracker's vsock
/// `ConnState` is the model): a stream cannot have an accept queue, a listener no
/// pending datagram.
/// Boxed beyond a stream's (nothing): a held connection is a stream, and every socket
/// slot of a guest's table is as large as the largest variant.
pub(crate) enum KindState {
    Stream,
    Dgram(Box<DgramState>),
    Listener(Box<AcceptQueue>),
}

/// What only a datagram socket carries.
#[derive(Default)]
pub(crate) struct DgramState {
    /// A datagram received but not yet fitting in the rx ring: its payload and its
    /// record's address section (the source, then any control messages).
    pub(crate) pending: Option<(Vec<u8>, Vec<u8>)>,
    /// Its part in datagrams between canal guests (`dgram_local`).
    pub(crate) local: crate::guest::dgram_local::Local,
}

impl KindState {
    pub(crate) fn new(kind: Kind) -> KindState {
        match kind {
            Kind::Stream => KindState::Stream,
            Kind::Dgram => KindState::Dgram(Box::default()),
            Kind::Listener => {
                KindState::Listener(Box::new(AcceptQueue::new(crate::sys::somaxconn())))
            }
        }
    }
}

impl HostSocket {
    /// A socket canald just installed: nothing seen or sent yet.
    pub(crate) fn new(
        handle: u32,
        state: KindState,
        family: u16,
        fd: Option<OwnedFd>,
        (phase, flags): (Phase, u32),
        (tx, rx): (RingPos, RingPos),
    ) -> HostSocket {
        HostSocket {
            handle,
            state,
            family,
            fd,
            phase,
            tx,
            rx,
            flags,
            readable: false,
            writable: false,
            rdhup: false,
            urgent: false,
            shut_wr_pending: false,
            closing: None,
            linger: None,
            dirty: false,
            tx_bytes: 0,
            rx_bytes: 0,
            seg: None,
            named: false,
            net: NetTie::default(),
            applied_opts: 0,
            port: None,
            v6only: false,
            via_resolver: false,
            polled: false,
            native_quiet: false,
        }
    }

    /// The transport protocol for the network's table.
    pub(crate) fn proto(&self) -> u8 {
        match self.kind() {
            Kind::Dgram => PROTO_UDP,
            _ => PROTO_TCP,
        }
    }

    pub(crate) fn kind(&self) -> Kind {
        match self.state {
            KindState::Stream => Kind::Stream,
            KindState::Dgram(_) => Kind::Dgram,
            KindState::Listener(_) => Kind::Listener,
        }
    }

    /// A listener's accept queue (None for other kinds).
    pub(crate) fn accepts(&self) -> Option<&AcceptQueue> {
        match &self.state {
            KindState::Listener(q) => Some(q),
            _ => None,
        }
    }

    pub(crate) fn accepts_mut(&mut self) -> Option<&mut AcceptQueue> {
        match &mut self.state {
            KindState::Listener(q) => Some(q),
            _ => None,
        }
    }

    /// A datagram socket's datagram waiting for room (None for other kinds).
    pub(crate) fn pending_dgram(&mut self) -> Option<&mut Option<(Vec<u8>, Vec<u8>)>> {
        match &mut self.state {
            KindState::Dgram(d) => Some(&mut d.pending),
            _ => None,
        }
    }

    /// A datagram socket's part in datagrams between canal guests.
    pub(crate) fn dgram_local(&self) -> Option<&crate::guest::dgram_local::Local> {
        match &self.state {
            KindState::Dgram(d) => Some(&d.local),
            _ => None,
        }
    }

    /// A datagram socket's handle, host socket and local part, borrowed together.
    pub(crate) fn dgram_parts(
        &mut self,
    ) -> Option<(u32, &OwnedFd, &mut crate::guest::dgram_local::Local)> {
        match (self.fd.as_ref(), &mut self.state) {
            (Some(fd), KindState::Dgram(d)) => Some((self.handle, fd, &mut d.local)),
            _ => None,
        }
    }

    /// A copy of its short-circuit link (§8), if it has one.
    pub(crate) fn link(&self) -> Option<SegLink> {
        self.seg.as_deref().copied()
    }

    pub(crate) fn dgram_local_mut(&mut self) -> Option<&mut crate::guest::dgram_local::Local> {
        match &mut self.state {
            KindState::Dgram(d) => Some(&mut d.local),
            _ => None,
        }
    }

    pub(crate) fn index(&self) -> u32 {
        canal_abi::handle_index(self.handle)
    }
    pub(crate) fn generation(&self) -> u16 {
        canal_abi::handle_generation(self.handle) as u16
    }
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.is_some()
    }
    pub(crate) fn local(&self) -> Option<CanalAddr> {
        if let Some(l) = &self.seg {
            return Some(l.local);
        }
        if let Some(h) = &self.port {
            return Some(h.local());
        }
        self.fd.as_ref().and_then(|f| sys::sockname(f).ok())
    }
    pub(crate) fn peer(&self) -> Option<CanalAddr> {
        if let Some(l) = &self.seg {
            return Some(l.peer);
        }
        self.fd.as_ref().and_then(|f| sys::peername(f).ok())
    }

    /// Its host socket, made on first need where it has none: a stream not yet
    /// connected (spares are made without one: a short-circuited connect never needs
    /// it), or a short-circuited end whose program sets or reads an option. A
    /// connector's port reservation becomes its socket, keeping its name.
    pub(crate) fn made_fd(&mut self) -> Result<&OwnedFd, i32> {
        let unmade = self.unmade();
        if unmade || (self.fd.is_none() && self.seg.is_some()) {
            self.fd = Some(match self.port.take() {
                Some(hold) => hold.into_fd(),
                None => new_stream(self.family)?,
            });
            if unmade {
                // A fresh socket: the program's kept options are yet to be applied.
                self.applied_opts = 0;
            }
        }
        fd_of(self)
    }

    /// A stream whose host socket is not made yet (`made_fd`).
    pub(crate) fn unmade(&self) -> bool {
        self.fd.is_none()
            && self.seg.is_none()
            && self.kind() == Kind::Stream
            && matches!(self.phase, Phase::Open | Phase::Connecting)
    }
}

/// A fresh host socket. canald out of descriptors is the whole
/// system's table for the guest: ENFILE.
pub(crate) fn new_socket(family: i32, ty: i32, protocol: i32) -> Result<OwnedFd, i32> {
    sys::socket(family, ty, protocol).map_err(|e| match sys::errno_of(&e) {
        libc::EMFILE => libc::ENFILE,
        e => e,
    })
}

fn new_stream(family: u16) -> Result<OwnedFd, i32> {
    new_socket(family as i32, libc::SOCK_STREAM, 0)
}

pub(crate) fn fd_of(s: &HostSocket) -> Result<&OwnedFd, i32> {
    s.fd.as_ref().ok_or(match s.phase {
        Phase::Broken => errno::EIO,
        // A short-circuited end (no host socket until an option needs one,
        // `HostSocket::made_fd`): what needs one more is bind/listen/connect, which a
        // connected stream refuses natively with EINVAL.
        _ if s.seg.is_some() => errno::EINVAL,
        _ => errno::EBADF,
    })
}

/// What one accept on a listener's host socket gave.
pub(crate) enum Accepted {
    Conn(OwnedFd, Option<CanalAddr>),
    /// A connection that died in the queue, or a signal: accept again.
    Again,
    /// Nothing queued (the listener is no longer readable), out of host descriptors
    /// (it stays readable) or no host socket: retried on a later round.
    Later,
}

/// Accepts one connection on listener `s`'s host socket.
pub(crate) fn accept_one(s: &mut HostSocket) -> Accepted {
    // A listener shut down for reading or handed over to its guest listens no more
    // for canald, whichever loop asks (home or away).
    let Some(fd) = s.fd.as_ref().filter(|_| s.phase == Phase::Listening) else {
        return Accepted::Later;
    };
    match sys::accept_inet(fd) {
        // An unpublished listener of a guest network admits only that network's own
        // connections: a host process that found its private loopback is reset.
        Ok(Some((c, p)))
            if s.net.private_bound().is_some_and(|n| {
                !p.as_ref()
                    .is_some_and(|p| n.admits_any(PROTO_TCP, p, || sys::sockname(fd).ok()))
            }) =>
        {
            let _ = sys::set_abortive_close(&c, true);
            Accepted::Again
        }
        Ok(Some((c, p))) => Accepted::Conn(c, p),
        Ok(None) => {
            s.readable = false;
            Accepted::Later
        }
        Err(e) => match e.raw_os_error() {
            Some(libc::ECONNABORTED) | Some(libc::EINTR) | Some(libc::EPROTO) => Accepted::Again,
            _ => Accepted::Later,
        },
    }
}

/// One end of a short-circuited connection, as canald keeps it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SegLink {
    pub(crate) id: u32,
    /// segment::side::*
    pub(crate) side: u32,
    /// The other end: its guest's control-connection key and its handle.
    pub(crate) peer_conn: u32,
    pub(crate) peer_handle: u32,
    /// Addresses reported by getsockname/getpeername.
    pub(crate) local: CanalAddr,
    pub(crate) peer: CanalAddr,
    /// This end shut down its sending side (SHUTDOWN SHUT_WR / SHUT_RDWR).
    pub(crate) shut_wr: bool,
}

#[cfg(test)]
mod tests {
    use super::AcceptQueue;

    /// Every slot of a guest's socket table is one HostSocket, for each of up to tens of
    /// thousands of held connections (B13): what only some sockets need (a listener's
    /// queue, a datagram's state, a network tie, a short-circuit link) is boxed. It was
    /// 360 bytes before; this catches a large field added inline. (176 until a
    /// connector's port reservation took a pointer's 8 more.)
    #[test]
    fn a_socket_slot_stays_small() {
        let size = std::mem::size_of::<Option<super::HostSocket>>();
        assert!(
            size <= 184,
            "a socket slot is {size} bytes; box what only some sockets need"
        );
    }

    #[test]
    fn a_program_that_does_not_accept_leaves_its_queue_to_the_kernel() {
        let mut q = AcceptQueue::new(4);
        // With nothing held the host listener has the program's backlog: the kernel's
        // queue holds what it holds natively; one place is given up for an accept.
        assert_eq!(q.host_backlog, 4);
        assert_eq!(q.host_backlog_for(1), 3);
        assert!(!q.holds_enough());
        q.unclaimed.push_back((64, 1));
        assert!(q.holds_enough(), "one held until the program takes it");
        // Held plus the host's queue (backlog + 1) hold what the kernel's one would.
        assert_eq!(q.held() + q.host_backlog_for(0) as u32 + 1, 4 + 1);
    }

    #[test]
    fn the_backlog_is_lowered_before_an_accept_only_on_a_full_queue() {
        let q = AcceptQueue::new(2);
        // listen(2) queues three (backlog + 1); a fourth SYN is dropped.
        assert!(
            q.lower_before_accept(Some(3)),
            "full: its last ACK is refused anyway"
        );
        assert!(
            !q.lower_before_accept(Some(2)),
            "a handshake may hold the last place"
        );
        assert!(!q.lower_before_accept(Some(0)));
        assert!(q.lower_before_accept(None), "unknown: as before");
        let q0 = AcceptQueue::new(0);
        assert!(q0.lower_before_accept(Some(1)));
        assert!(!q0.lower_before_accept(Some(0)));
    }

    #[test]
    fn taking_connections_lets_canald_hold_more_up_to_the_backlog() {
        let mut q = AcceptQueue::new(8);
        q.taken(0);
        assert_eq!(q.ahead, 1);
        q.taken(1);
        assert_eq!(q.ahead, 2);
        q.taken(1);
        assert_eq!(q.ahead, 4);
        q.taken(5);
        assert_eq!(q.ahead, 8, "never past the backlog");
        for h in 0..8 {
            assert!(!q.holds_enough());
            q.unclaimed.push_back((64 * (h + 1), h as u32));
        }
        assert!(q.holds_enough());
        assert_eq!(q.host_backlog_for(0), 0);
        // listen(0): one held, none left to the host listener beyond its own one.
        let q0 = AcceptQueue::new(0);
        assert_eq!(q0.host_backlog, 0);
    }
}
