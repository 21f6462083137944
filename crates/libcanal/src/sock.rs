//! Socket operations on canal sockets: the data path over the rings (no round trip
//! when data or room is there) and the control operations as requests.
//!
//! Every function returns `Result<_, errno>`; the hooks turn that into -1/errno.

use crate::client::{self, attention, request, wait_until, Guest, Wait};
use crate::fdtable::TABLE;
use crate::iov;
use crate::ready::{self, local, SockState};
use crate::sidelock;
use crate::sys;
use canal_abi::addr::{CanalAddr, ADDR_SIZE};
use canal_abi::ring::{check_indices, record_kind, Consumer, Producer, RawRing, RingStorage};
use canal_abi::sync::{fence, AtomicU64, Ordering};
use canal_abi::{
    guest_flag, handle_index, make_handle, op, sock_flag as f, sock_kind, SocketEntry,
};
use libc::{c_int, iovec};

/// A stream socket's two rings and their index words: in the region, or (protocol
/// §8) in a pair segment shared with the peer guest. One code path serves both.
pub struct Rings {
    pub tx: RawRing,
    pub tx_head: &'static AtomicU64,
    pub tx_tail: &'static AtomicU64,
    pub rx: RawRing,
    pub rx_head: &'static AtomicU64,
    pub rx_tail: &'static AtomicU64,
    /// Short-circuited: the segment and the peer's side.
    pub peer: Option<(crate::seg::Seg, u32)>,
}

impl Rings {
    /// After publishing tx bytes (or freeing rx space when `freed` on a region
    /// socket whose host asked for it): tell whoever must know. Region sockets: the
    /// host (attention + kick). Short-circuited ones: nobody, unless the peer sleeps
    /// (§8.4: fence, read its sleeper count, then attention + kick so canald wakes it).
    fn notify(&self, s: &Sock, region_wants: bool) {
        match self.peer {
            None => {
                if region_wants {
                    attention(s.g, s.idx);
                }
            }
            Some((seg, side)) => {
                // P1: SeqCst fence between our index store and the sleeper counts;
                // pairs with the sleeper's fence between counting itself and
                // re-checking. Skipped when the peer's sleepers issue the global
                // barrier instead (barrier.rs: the fence waits for our index line to
                // leave the peer's cache, a third of a small message's cost).
                if !crate::barrier::may_skip_fence(seg.deferred_barrier(side)) {
                    fence(Ordering::SeqCst);
                }
                if seg.futex_sleepers(side).load(Ordering::Relaxed) != 0 {
                    seg.futex_wake(side);
                }
                if seg.sleepers(side).load(Ordering::Relaxed) != 0 {
                    attention(s.g, s.idx);
                }
            }
        }
    }
}

/// A canal socket resolved from its handle.
#[derive(Clone, Copy)]
pub struct Sock {
    pub g: &'static Guest,
    pub handle: u32,
    pub idx: u32,
    pub e: &'static SocketEntry,
}

impl Sock {
    pub fn new(g: &'static Guest, handle: u32) -> Result<Sock, i32> {
        let idx = handle_index(handle);
        let e = g.region.socket(idx).ok_or(libc::EBADF)?;
        // Once canald is gone its entries may be freed: keep the socket so that every
        // call reports the dead daemon (ECONNRESET/EIO), not EBADF.
        if make_handle(idx, e.generation.load(Ordering::Acquire)) != handle && !client::is_dead(g) {
            return Err(libc::EBADF);
        }
        Ok(Sock { g, handle, idx, e })
    }

    /// The entry still belongs to this handle (another thread may have closed the
    /// last descriptor while we waited, and the entry may now be someone else's).
    pub fn live(&self) -> Result<(), i32> {
        if make_handle(self.idx, self.e.generation.load(Ordering::Acquire)) != self.handle
            && !client::is_dead(self.g)
        {
            return Err(libc::EBADF);
        }
        Ok(())
    }

    pub fn kind(&self) -> u32 {
        self.e.kind.load(Ordering::Acquire)
    }

    pub fn flags(&self) -> u32 {
        self.e.flags.load(Ordering::Acquire)
    }

    /// The stream rings (mapping the pair segment on first use).
    pub fn rings(&self) -> Result<Rings, i32> {
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
        let seg = crate::seg::get(self.g, id)?;
        client::note_segment_mapped();
        let side = self.e.segment_side.load(Ordering::Relaxed).min(1);
        // Our sleepers follow the deferred rule: the peer may publish fence-less.
        crate::barrier::announce(seg.deferred_barrier(side));
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

    fn tx_ring(&self) -> Result<RawRing, i32> {
        let size = self.e.tx_size.load(Ordering::Acquire) as u64;
        self.g
            .region
            .ring(self.e.tx_offset.load(Ordering::Acquire), size)
            .ok_or(libc::EIO)
    }

    fn rx_ring(&self) -> Result<RawRing, i32> {
        let size = self.e.rx_size.load(Ordering::Acquire) as u64;
        self.g
            .region
            .ring(self.e.rx_offset.load(Ordering::Acquire), size)
            .ok_or(libc::EIO)
    }

    pub fn nonblocking(&self) -> bool {
        self.e.guest_flags.load(Ordering::Relaxed) & guest_flag::NONBLOCK != 0
    }

    pub fn set_nonblocking(&self, on: bool) {
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

    fn local(&self) -> u32 {
        self.e.guest_flags.load(Ordering::Relaxed)
    }

    /// Takes the pending error, if any (reported once).
    pub fn take_error(&self) -> u32 {
        if self.e.pending_error.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.e.pending_error.swap(0, Ordering::AcqRel)
    }

    pub fn snapshot(&self) -> SockState {
        let e = self.e;
        // Flags first (Acquire): a short-circuit completing publishes the segment
        // fields before CONNECTED.
        let flags = e.flags.load(Ordering::Acquire);
        let tx_size = e.tx_size.load(Ordering::Relaxed) as u64;
        let rx_size = e.rx_size.load(Ordering::Relaxed) as u64;
        let mut zone = None;
        let (txh, txt, rxh, rxt) = match (e.segment.load(Ordering::Acquire), self.rings()) {
            (0, _) | (_, Err(_)) => (&e.tx_head, &e.tx_tail, &e.rx_head, &e.rx_tail),
            (_, Ok(r)) => {
                zone = r.peer.filter(|(g, _)| g.has_zones());
                (r.tx_head, r.tx_tail, r.rx_head, r.rx_tail)
            }
        };
        // R3-style Acquire loads of the other side's indices.
        let tx_used = txh
            .load(Ordering::Relaxed)
            .wrapping_sub(txt.load(Ordering::Acquire))
            .min(tx_size);
        let rx_used = rxh
            .load(Ordering::Acquire)
            .wrapping_sub(rxt.load(Ordering::Relaxed))
            .min(rx_size)
            + zone.map_or(0, |(seg, dir)| crate::zones::pending(seg, dir));
        SockState {
            kind: e.kind.load(Ordering::Acquire),
            flags,
            pending_error: e.pending_error.load(Ordering::Relaxed),
            tx_used,
            tx_size,
            rx_used,
            guest_flags: e.guest_flags.load(Ordering::Relaxed),
        }
    }

    pub fn readiness(&self) -> libc::c_short {
        ready::readiness(&self.snapshot())
    }

    /// Moves whenever the socket had an event an edge-triggered epoll reports: the
    /// host's `event_seq`, plus, on a short-circuited socket, the incoming ring's head
    /// (the peer publishes bytes without canald, so each arrival — an edge natively —
    /// shows only there).
    ///
    /// Second value: the outgoing ring's tail while a send found that ring full
    /// (`local::NOSPACE`), else None — the peer freeing space is then an edge too, as
    /// the kernel's write-space wake-up is after SOCK_NOSPACE.
    pub fn edge_seq(&self) -> (u32, Option<u32>) {
        let seq = self.e.event_seq.load(Ordering::Acquire);
        if self.e.segment.load(Ordering::Acquire) == 0 {
            return (seq, None);
        }
        match self.rings() {
            Ok(r) if r.peer.is_some() => {
                let mut rx = seq.wrapping_add(r.rx_head.load(Ordering::Acquire) as u32);
                if let Some((seg, dir)) = r.peer.filter(|(g, _)| g.has_zones()) {
                    // A zone-sent piece arrives without moving the ring head.
                    rx = rx.wrapping_add(crate::zones::posted(seg, dir) as u32);
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
    pub fn clear_nospace(&self) {
        if self.e.guest_flags.load(Ordering::Relaxed) & local::NOSPACE != 0 {
            self.e
                .guest_flags
                .fetch_and(!local::NOSPACE, Ordering::Relaxed);
        }
    }

    fn deadline(&self, rcv: bool) -> Option<i64> {
        let t = if rcv {
            self.e.rcvtimeo_ns.load(Ordering::Relaxed)
        } else {
            self.e.sndtimeo_ns.load(Ordering::Relaxed)
        };
        (t != 0).then(|| sys::now_ns().saturating_add(t.min(i64::MAX as u64) as i64))
    }
}

fn wait_err(w: Wait, data: bool) -> i32 {
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

fn dead_err(g: &Guest, data: bool) -> Result<(), i32> {
    if client::is_dead(g) {
        client::mark_dead();
        return Err(if data { libc::ECONNRESET } else { libc::EIO });
    }
    Ok(())
}

fn epipe(flags: c_int) -> i32 {
    if flags & libc::MSG_NOSIGNAL == 0 {
        sys::raise_sigpipe();
    }
    libc::EPIPE
}

// ---- creation ------------------------------------------------------------------------

/// A fresh dummy descriptor, so numbers never collide and fstat says S_IFSOCK.
///
/// With canald's WATCH feature it is one end of a Unix stream socketpair; the other end
/// (returned second) goes to canald (`arm`), which closes the socket when the kernel
/// says the last copy of this end is gone — after close, `_exit`, kill or exec, in any
/// process (docs/architecture.md). This end is shut for reading and non-blocking, so a
/// program that inherits it over exec without knowing it reads EOF and gets EAGAIN
/// on writes instead of hanging (docs/compat.md). Without the feature: a lone AF_UNIX
/// datagram socket, and the second value is -1.
fn dummy(g: &Guest, cloexec: bool) -> Result<(c_int, c_int), i32> {
    let ce = if cloexec { libc::SOCK_CLOEXEC } else { 0 };
    let (fd, peer) = if client::watch_enabled(g) {
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
        // The peer end must not leak into children: close-on-exec while we hold it.
        let _ = sys::fcntl_int(sv[1], libc::F_SETFD, libc::FD_CLOEXEC as libc::c_long);
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
fn arm(g: &Guest, handle: u32, peer: c_int) {
    if peer >= 0 {
        client::send_watch(g, handle, peer);
        let _ = sys::close(peer);
    }
}

/// socket(2) for a supported (domain, type, protocol); `base` is SOCK_STREAM/DGRAM.
pub fn socket(
    g: &'static Guest,
    domain: c_int,
    base: c_int,
    proto: c_int,
    nonblock: bool,
    cloexec: bool,
) -> Result<c_int, i32> {
    let (fd, peer) = dummy(g, cloexec)?;
    let r = request(
        g,
        op::SOCKET,
        0,
        [domain as u64, base as u64, proto as u64, 0],
        &[],
        &mut [],
    );
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
    client::init_guest_line(s.e, nonblock, 0, 0);
    arm(g, handle, peer);
    let _ = TABLE.set_canal(fd, handle);
    client::debug!(g, "canal: socket fd {fd} -> handle {handle:#x}\n");
    Ok(fd)
}

// ---- control operations ---------------------------------------------------------------

pub fn bind(s: Sock, a: &CanalAddr) -> Result<(), i32> {
    dead_err(s.g, false)?;
    request(s.g, op::BIND, s.handle, [0; 4], &a.encode(), &mut []).map(|_| ())
}

pub fn listen(s: Sock, backlog: c_int) -> Result<(), i32> {
    dead_err(s.g, false)?;
    request(
        s.g,
        op::LISTEN,
        s.handle,
        [backlog.max(0) as u64, 0, 0, 0],
        &[],
        &mut [],
    )
    .map(|_| ())
}

/// connect(2) on a stream socket follows the kernel's two-level state: the socket
/// layer stays "connecting" after a connect that returned EINPROGRESS (or timed out,
/// or was interrupted) until connect is called again, so a second connect returns 0
/// once the handshake is done, EALREADY while it runs, or the error; only then does
/// EISCONN follow. `local::CONNECT_PENDING` is that socket-layer state.
/// connect(AF_UNSPEC) on a datagram socket: the association is dissolved (the local
/// address stays), datagrams from anyone arrive again.
pub fn disconnect(s: Sock) -> Result<(), i32> {
    dead_err(s.g, false)?;
    request(s.g, op::CONNECT, s.handle, [1, 0, 0, 0], &[], &mut []).map(|_| ())
}

pub fn connect(s: Sock, a: &CanalAddr) -> Result<(), i32> {
    dead_err(s.g, false)?;
    if s.kind() == sock_kind::DGRAM {
        return request(s.g, op::CONNECT, s.handle, [0; 4], &a.encode(), &mut []).map(|_| ());
    }
    let fl = s.flags();
    let pending = s.local() & local::CONNECT_PENDING != 0;
    let closed = fl & (f::ERROR | f::HUP | f::BROKEN) != 0;
    let connecting = fl & f::CONNECTING != 0 && fl & f::CONNECTED == 0 && !closed;
    if pending {
        if !connecting {
            return finish_connect(s);
        }
        if s.nonblocking() {
            return Err(libc::EALREADY);
        }
        return wait_connect(s, libc::EALREADY);
    }
    if fl & f::CONNECTED != 0 {
        return Err(libc::EISCONN);
    }
    if connecting {
        return Err(libc::EALREADY);
    }
    match request(s.g, op::CONNECT, s.handle, [0; 4], &a.encode(), &mut []) {
        Ok(_) => return Ok(()),
        Err(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    s.e.guest_flags
        .fetch_or(local::CONNECT_PENDING, Ordering::Relaxed);
    if s.nonblocking() {
        return Err(libc::EINPROGRESS);
    }
    wait_connect(s, libc::EINPROGRESS)
}

/// Waits for the handshake; `on_timeout` is what a timed-out wait reports.
fn wait_connect(s: Sock, on_timeout: i32) -> Result<(), i32> {
    let w = wait_until(s.g, s.idx, s.deadline(false), || {
        let fl = s.flags();
        fl & (f::CONNECTED | f::ERROR | f::HUP | f::BROKEN) != 0 || fl & f::CONNECTING == 0
    });
    match w {
        Wait::Ready => finish_connect(s),
        Wait::Timeout => Err(on_timeout),
        other => Err(wait_err(other, false)),
    }
}

/// The handshake is over: report its outcome once and leave the pending state.
fn finish_connect(s: Sock) -> Result<(), i32> {
    s.e.guest_flags
        .fetch_and(!local::CONNECT_PENDING, Ordering::Relaxed);
    let fl = s.flags();
    let pe = s.take_error();
    if pe != 0 {
        return Err(pe as i32);
    }
    if fl & f::CONNECTED != 0 && fl & (f::ERROR | f::HUP | f::BROKEN) == 0 {
        Ok(())
    } else if fl & f::CONNECTED != 0 {
        Err(libc::ECONNRESET)
    } else {
        // The error was already collected (SO_ERROR), as Linux says then.
        Err(libc::ECONNABORTED)
    }
}

pub fn shutdown(s: Sock, how: c_int) -> Result<(), i32> {
    dead_err(s.g, false)?;
    let bits = match how {
        libc::SHUT_RD => local::SHUT_RD,
        libc::SHUT_WR => local::SHUT_WR,
        libc::SHUT_RDWR => local::SHUT_RD | local::SHUT_WR,
        _ => return Err(libc::EINVAL),
    };
    request(
        s.g,
        op::SHUTDOWN,
        s.handle,
        [how as u64, 0, 0, 0],
        &[],
        &mut [],
    )?;
    s.e.guest_flags.fetch_or(bits, Ordering::Relaxed);
    client::wake_local(s.g, s.idx);
    Ok(())
}

pub fn name(s: Sock, peer: bool) -> Result<CanalAddr, i32> {
    dead_err(s.g, false)?;
    let mut out = [0u8; ADDR_SIZE];
    let o = if peer {
        op::GETPEERNAME
    } else {
        op::GETSOCKNAME
    };
    let (_, n) = request(s.g, o, s.handle, [0; 4], &[], &mut out)?;
    if n < ADDR_SIZE {
        return Err(libc::EIO);
    }
    CanalAddr::decode(&out).ok_or(libc::EIO)
}

// Option names answered by the library (x86-64/aarch64 values; the _NEW variants take
// the same 64-bit timeval).
const SO_RCVTIMEO_OLD: c_int = 20;
const SO_SNDTIMEO_OLD: c_int = 21;
const SO_RCVTIMEO_NEW: c_int = 66;
const SO_SNDTIMEO_NEW: c_int = 67;

/// Timeout option → (is_receive).
fn timeo_opt(level: c_int, name: c_int) -> Option<bool> {
    if level != libc::SOL_SOCKET {
        return None;
    }
    match name {
        SO_RCVTIMEO_OLD | SO_RCVTIMEO_NEW => Some(true),
        SO_SNDTIMEO_OLD | SO_SNDTIMEO_NEW => Some(false),
        _ => None,
    }
}

/// timeval bytes → nanoseconds (0 = no timeout), with Linux's rules.
pub fn timeval_to_ns(b: &[u8]) -> Result<u64, i32> {
    if b.len() < 16 {
        return Err(libc::EINVAL);
    }
    let sec = i64::from_ne_bytes(b[0..8].try_into().unwrap());
    let usec = i64::from_ne_bytes(b[8..16].try_into().unwrap());
    if !(0..1_000_000).contains(&usec) {
        return Err(libc::EDOM);
    }
    if sec < 0 {
        // Linux: a negative timeout means "do not wait".
        return Ok(1);
    }
    Ok((sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(usec as u64 * 1000))
}

pub fn ns_to_timeval(ns: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&((ns / 1_000_000_000) as i64).to_ne_bytes());
    b[8..16].copy_from_slice(&(((ns % 1_000_000_000) / 1000) as i64).to_ne_bytes());
    b
}

pub fn setsockopt(s: Sock, level: c_int, name: c_int, val: &[u8]) -> Result<(), i32> {
    dead_err(s.g, false)?;
    if let Some(rcv) = timeo_opt(level, name) {
        let ns = timeval_to_ns(val)?;
        if rcv {
            s.e.rcvtimeo_ns.store(ns, Ordering::Relaxed);
        } else {
            s.e.sndtimeo_ns.store(ns, Ordering::Relaxed);
        }
        return Ok(());
    }
    if val.len() > canal_abi::SLOT_PAYLOAD {
        return Err(libc::EINVAL);
    }
    request(
        s.g,
        op::SETSOCKOPT,
        s.handle,
        [level as u64, name as u64, 0, 0],
        val,
        &mut [],
    )?;
    if level == libc::SOL_SOCKET && name == libc::SO_LINGER && val.len() >= 8 {
        // canald accepted it (it emulates SO_LINGER): remember it for close.
        let on = i32::from_ne_bytes([val[0], val[1], val[2], val[3]]) != 0;
        let secs = i32::from_ne_bytes([val[4], val[5], val[6], val[7]]);
        let word = if on {
            1u32.saturating_add(if secs < 0 { u32::MAX } else { secs as u32 })
        } else {
            0
        };
        s.e.linger.store(word, Ordering::Relaxed);
    }
    Ok(())
}

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
    let r = client::wait_until(s.g, s.idx, Some(deadline), || {
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

/// getsockopt: writes up to `out.len()` bytes, returns the option's real length.
pub fn getsockopt(s: Sock, level: c_int, name: c_int, out: &mut [u8]) -> Result<usize, i32> {
    dead_err(s.g, false)?;
    let int = |v: i32, out: &mut [u8]| {
        let b = v.to_ne_bytes();
        let n = out.len().min(4);
        out[..n].copy_from_slice(&b[..n]);
        Ok(n)
    };
    if let Some(rcv) = timeo_opt(level, name) {
        let ns = if rcv {
            &s.e.rcvtimeo_ns
        } else {
            &s.e.sndtimeo_ns
        }
        .load(Ordering::Relaxed);
        let b = ns_to_timeval(ns);
        let n = out.len().min(16);
        out[..n].copy_from_slice(&b[..n]);
        return Ok(n);
    }
    if level == libc::SOL_SOCKET {
        let kind = s.kind();
        match name {
            libc::SO_ERROR => return int(s.take_error() as i32, out),
            libc::SO_TYPE => {
                return int(
                    if kind == sock_kind::DGRAM {
                        libc::SOCK_DGRAM
                    } else {
                        libc::SOCK_STREAM
                    },
                    out,
                )
            }
            libc::SO_PROTOCOL => {
                return int(
                    if kind == sock_kind::DGRAM {
                        libc::IPPROTO_UDP
                    } else {
                        libc::IPPROTO_TCP
                    },
                    out,
                )
            }
            libc::SO_DOMAIN => return int(s.e.family.load(Ordering::Relaxed) as i32, out),
            libc::SO_ACCEPTCONN => return int((kind == sock_kind::LISTENER) as i32, out),
            _ => {}
        }
    }
    let mut buf = [0u8; canal_abi::SLOT_PAYLOAD];
    let want = out.len().min(buf.len());
    let (_, n) = request(
        s.g,
        op::GETSOCKOPT,
        s.handle,
        [level as u64, name as u64, want as u64, 0],
        &[],
        &mut buf,
    )?;
    let c = n.min(out.len());
    out[..c].copy_from_slice(&buf[..c]);
    Ok(c)
}

/// Drops one descriptor's reference; the last one sends CLOSE.
pub fn release(g: &'static Guest, handle: u32) {
    let Ok(s) = Sock::new(g, handle) else { return };
    let prev =
        s.e.refs
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |r| {
                Some(r.saturating_sub(1))
            })
            .unwrap_or(1);
    if prev <= 1 {
        crate::policy::forget(handle);
        client::wake_local(g, s.idx);
        let seg = s.e.segment.load(Ordering::Acquire);
        if !client::is_dead(g) {
            linger_before_close(&s);
            let _ = request(g, op::CLOSE, handle, [0; 4], &[], &mut []);
        }
        crate::seg::forget(g, seg);
        client::debug!(g, "canal: close handle {handle:#x}\n");
    }
}

/// One more descriptor refers to the socket (dup, fcntl F_DUPFD).
pub fn add_ref(g: &'static Guest, handle: u32) {
    if let Ok(s) = Sock::new(g, handle) {
        s.e.refs.fetch_add(1, Ordering::Relaxed);
    }
}

// ---- data path --------------------------------------------------------------------------

/// Source address and flags a receive reports back.
#[derive(Default)]
pub struct RecvMeta {
    pub from: Option<CanalAddr>,
    pub msg_flags: c_int,
}

/// send/sendto/sendmsg/write/writev.
pub fn send(s: Sock, iov: &[iovec], flags: c_int, to: Option<&CanalAddr>) -> Result<usize, i32> {
    dead_err(s.g, true)?;
    if flags & libc::MSG_OOB != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    match s.kind() {
        sock_kind::DGRAM => send_dgram(s, iov, flags, to),
        sock_kind::STREAM => {
            if to.is_some() && s.flags() & f::CONNECTED != 0 {
                // Linux ignores the address on a connected TCP socket (EISCONN only
                // for TCP Fast Open); we do the same.
            }
            send_stream(s, iov, flags)
        }
        // A listening socket: not connected.
        _ => Err(epipe(flags)),
    }
}

fn send_stream(s: Sock, iov: &[iovec], flags: c_int) -> Result<usize, i32> {
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
            return if sent > 0 { Ok(sent) } else { Err(pe as i32) };
        }
        if fl & f::TX_CLOSED != 0
            || s.local() & local::SHUT_WR != 0
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
            let ring = r.tx;
            let size = RingStorage::size(&ring);
            let held = sidelock::enter_tx(s.e);
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
                sidelock::exit_tx(s.e, held);
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
                        crate::zones::send(
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
                            sidelock::exit_tx(s.e, held);
                            return if sent + n > 0 { Ok(sent + n) } else { Err(e) };
                        }
                    }
                }
            }
            sidelock::exit_tx(s.e, held);
            if n > 0 {
                r.notify(&s, true);
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

/// Largest UDP payload the kernel would take.
fn udp_max(family: u32) -> usize {
    if family == libc::AF_INET6 as u32 {
        65527
    } else {
        65507
    }
}

fn send_dgram(s: Sock, iov: &[iovec], flags: c_int, to: Option<&CanalAddr>) -> Result<usize, i32> {
    let total = iov::total_len(iov)?;
    let nonblock = flags & libc::MSG_DONTWAIT != 0 || s.nonblocking();
    if s.local() & local::SHUT_WR != 0 {
        return Err(epipe(flags));
    }
    let connected = s.flags() & f::CONNECTED != 0;
    if to.is_none() && !connected {
        return Err(libc::EDESTADDRREQ);
    }
    let enc = to.map(|a| a.encode());
    let addr: &[u8] = enc.as_ref().map_or(&[], |b| &b[..]);
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
        let pe = s.take_error();
        if pe != 0 {
            return Err(pe as i32);
        }
        let held = sidelock::enter_tx(s.e);
        let mut p = Producer {
            storage: &ring,
            head_shared: &s.e.tx_head,
            tail_shared: &s.e.tx_tail,
            head: s.e.tx_head.load(Ordering::Relaxed),
        };
        let r = p.push_record(record_kind::DATAGRAM, addr, parts);
        sidelock::exit_tx(s.e, held);
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
            record_fits(head, tail, size, need) || s.e.pending_error.load(Ordering::Relaxed) != 0
        });
        if w != Wait::Ready {
            return Err(wait_err(w, true));
        }
    }
}

/// Whether a record of `need` bytes fits now, with the padding `push_record` would
/// put before it (records never wrap).
pub fn record_fits(head: u64, tail: u64, size: u64, need: u64) -> bool {
    let Ok(used) = check_indices(head, tail, size) else {
        return true; // corrupt: let push_record report it
    };
    let to_end = size - (head & (size - 1));
    let pad = if to_end < need { to_end } else { 0 };
    size - used >= pad + need
}

/// recv/recvfrom/recvmsg/read/readv.
pub fn recv(s: Sock, iov: &[iovec], flags: c_int, meta: &mut RecvMeta) -> Result<usize, i32> {
    dead_err(s.g, true)?;
    if flags & libc::MSG_OOB != 0 {
        return Err(libc::EINVAL);
    }
    match s.kind() {
        sock_kind::DGRAM => recv_dgram(s, iov, flags, meta),
        sock_kind::STREAM => recv_stream(s, iov, flags),
        _ => Err(libc::ENOTCONN),
    }
}

fn recv_stream(s: Sock, iov: &[iovec], flags: c_int) -> Result<usize, i32> {
    let total = iov::total_len(iov)?;
    let peek = flags & libc::MSG_PEEK != 0;
    let waitall = flags & libc::MSG_WAITALL != 0 && !peek;
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
        let held = sidelock::enter_rx(s.e);
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
            sidelock::exit_rx(s.e, held);
            return Err(libc::EIO);
        };
        let head = tail.wrapping_add(used);
        let limit = match zone {
            Some((seg, dir)) => match crate::zones::ring_limit(seg, dir, tail, head) {
                Ok(l) => l,
                Err(e) => {
                    sidelock::exit_rx(s.e, held);
                    return if got > 0 { Ok(got) } else { Err(e) };
                }
            },
            None => None,
        };
        if let (Some((seg, dir)), Some(0)) = (zone, limit) {
            let id = s.e.segment.load(Ordering::Relaxed);
            // SAFETY: the iovecs are the application's writable buffers.
            let z = unsafe {
                crate::zones::recv_front(seg, dir, id, iov, got, total - got, peek, discard)
            };
            sidelock::exit_rx(s.e, held);
            let n = match z {
                Ok(n) => n,
                Err(e) => return if got > 0 { Ok(got) } else { Err(e) },
            };
            if peek {
                return Ok(n);
            }
            got += n;
            if n > 0 {
                r.notify(&s, false);
            }
            if got > 0 && (!waitall || got == total) {
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
        sidelock::exit_rx(s.e, held);
        if n > 0 && !peek {
            got += n;
            r.notify(&s, s.flags() & f::RX_WANT_SPACE != 0);
        } else if n > 0 {
            return Ok(n);
        }
        if got > 0 && (!waitall || got == total) {
            return Ok(got);
        }
        let fl = s.flags();
        // Nothing (more) queued: errors, then EOF.
        let zone_left = zone.is_some_and(|(seg, dir)| crate::zones::pending(seg, dir) > 0);
        if r.rx_head.load(Ordering::Acquire) == r.rx_tail.load(Ordering::Relaxed) && !zone_left {
            let pe = s.take_error();
            if pe != 0 {
                return if got > 0 { Ok(got) } else { Err(pe as i32) };
            }
            if fl & (f::RX_EOF | f::ERROR | f::HUP | f::BROKEN) != 0
                || s.local() & local::SHUT_RD != 0
            {
                return Ok(got);
            }
            if fl & (f::CONNECTED | f::CONNECTING) == 0 {
                return if got > 0 {
                    Ok(got)
                } else {
                    Err(libc::ENOTCONN)
                };
            }
        } else {
            continue;
        }
        if nonblock {
            return if got > 0 { Ok(got) } else { Err(libc::EAGAIN) };
        }
        if deadline.is_none() {
            deadline = Some(s.deadline(true));
        }
        let w = wait_until(s.g, s.idx, deadline.flatten(), || {
            let st = s.snapshot();
            st.rx_used > 0
                || st.pending_error != 0
                || st.flags & (f::RX_EOF | f::ERROR | f::HUP | f::BROKEN) != 0
                || st.guest_flags & local::SHUT_RD != 0
                || st.flags & (f::CONNECTED | f::CONNECTING) == 0
        });
        if w != Wait::Ready {
            return if got > 0 {
                Ok(got)
            } else {
                Err(wait_err(w, true))
            };
        }
    }
}

fn recv_dgram(s: Sock, iov: &[iovec], flags: c_int, meta: &mut RecvMeta) -> Result<usize, i32> {
    let total = iov::total_len(iov)?;
    let peek = flags & libc::MSG_PEEK != 0;
    let nonblock = flags & libc::MSG_DONTWAIT != 0 || s.nonblocking();
    let ring = s.rx_ring()?;
    let mut deadline = None;
    loop {
        dead_err(s.g, true)?;
        s.live()?;
        let held = sidelock::enter_rx(s.e);
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
                if info.addr_len as usize >= ADDR_SIZE {
                    let mut a = [0u8; ADDR_SIZE];
                    c.record_addr(&info, &mut a);
                    meta.from = CanalAddr::decode(&a);
                }
                meta.msg_flags = if len > total { libc::MSG_TRUNC } else { 0 };
                if !peek {
                    c.consume_record(&info);
                }
                Some(Ok(if flags & libc::MSG_TRUNC != 0 { len } else { n }))
            }
        };
        sidelock::exit_rx(s.e, held);
        match out {
            Some(r) => {
                if !peek && s.flags() & f::RX_WANT_SPACE != 0 {
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
        let pe = s.take_error();
        if pe != 0 {
            return Err(pe as i32);
        }
        if s.local() & local::SHUT_RD != 0 {
            return Ok(0);
        }
        if nonblock {
            return Err(libc::EAGAIN);
        }
        if deadline.is_none() {
            deadline = Some(s.deadline(true));
        }
        let w = wait_until(s.g, s.idx, deadline.flatten(), || {
            let st = s.snapshot();
            st.rx_used > 0 || st.pending_error != 0 || st.guest_flags & local::SHUT_RD != 0
        });
        if w != Wait::Ready {
            return Err(wait_err(w, true));
        }
    }
}

/// accept/accept4: returns the new descriptor and the peer address.
pub fn accept(s: Sock, flags: c_int) -> Result<(c_int, Option<CanalAddr>), i32> {
    dead_err(s.g, false)?;
    if s.kind() != sock_kind::LISTENER {
        return Err(if s.kind() == sock_kind::DGRAM {
            libc::EOPNOTSUPP
        } else {
            libc::EINVAL
        });
    }
    let nonblock = s.nonblocking();
    let ring = s.rx_ring()?;
    let mut deadline = None;
    loop {
        dead_err(s.g, false)?;
        s.live()?;
        let held = sidelock::enter_rx(s.e);
        let mut c = Consumer {
            storage: &ring,
            head_shared: &s.e.rx_head,
            tail_shared: &s.e.rx_tail,
            tail: s.e.rx_tail.load(Ordering::Relaxed),
        };
        let out: Option<Result<(c_int, Option<CanalAddr>), i32>> = match c.next_record() {
            Err(_) => Some(Err(libc::EIO)),
            Ok(None) => None,
            Ok(Some(info))
                if info.kind != record_kind::ACCEPT
                    || (info.len as usize) < canal_abi::ACCEPT_PAYLOAD =>
            {
                c.consume_record(&info);
                None
            }
            Ok(Some(info)) => match dummy(s.g, flags & libc::SOCK_CLOEXEC != 0) {
                // No descriptor for it: leave the connection queued (as the kernel does).
                Err(e) => Some(Err(e)),
                Ok((fd, wend)) => {
                    let mut p = [0u8; 8];
                    c.record_payload(&info, 0, &mut p);
                    let mut a = [0u8; ADDR_SIZE];
                    let peer = if info.addr_len as usize >= ADDR_SIZE {
                        c.record_addr(&info, &mut a);
                        CanalAddr::decode(&a)
                    } else {
                        None
                    };
                    c.consume_record(&info);
                    let h = u32::from_le_bytes([p[0], p[1], p[2], p[3]]);
                    match Sock::new(s.g, h) {
                        Ok(ns) if ns.kind() == sock_kind::STREAM => {
                            client::init_guest_line(
                                ns.e,
                                flags & libc::SOCK_NONBLOCK != 0,
                                s.e.rcvtimeo_ns.load(Ordering::Relaxed),
                                s.e.sndtimeo_ns.load(Ordering::Relaxed),
                            );
                            let _ = TABLE.set_canal(fd, h);
                            arm(s.g, h, wend);
                            Some(Ok((fd, peer)))
                        }
                        _ => {
                            let _ = sys::close(fd);
                            let _ = (wend >= 0).then(|| sys::close(wend));
                            Some(Err(libc::ECONNABORTED))
                        }
                    }
                }
            },
        };
        sidelock::exit_rx(s.e, held);
        if s.flags() & f::RX_WANT_SPACE != 0 {
            attention(s.g, s.idx);
        }
        match out {
            Some(Err(libc::ECONNABORTED)) => continue,
            Some(r) => {
                if let Ok((fd, _)) = &r {
                    client::debug!(s.g, "canal: accept on handle {:#x} -> fd {fd}\n", s.handle);
                }
                return r;
            }
            None => {
                if s.e.rx_head.load(Ordering::Acquire) != s.e.rx_tail.load(Ordering::Relaxed) {
                    continue;
                }
            }
        }
        let pe = s.take_error();
        if pe != 0 {
            return Err(pe as i32);
        }
        if nonblock {
            return Err(libc::EAGAIN);
        }
        if deadline.is_none() {
            deadline = Some(s.deadline(true));
        }
        let w = wait_until(s.g, s.idx, deadline.flatten(), || {
            let st = s.snapshot();
            st.rx_used > 0 || st.pending_error != 0 || st.kind != sock_kind::LISTENER
        });
        if w != Wait::Ready {
            return Err(wait_err(w, false));
        }
        if s.kind() != sock_kind::LISTENER {
            return Err(libc::EINVAL);
        }
    }
}

/// Bytes FIONREAD reports: queued stream bytes, or the next datagram's size.
pub fn fionread(s: Sock) -> Result<c_int, i32> {
    let st = s.snapshot();
    if st.kind != sock_kind::DGRAM {
        return Ok(st.rx_used.min(i32::MAX as u64) as c_int);
    }
    let ring = s.rx_ring()?;
    let held = sidelock::enter_rx(s.e);
    let mut c = Consumer {
        storage: &ring,
        head_shared: &s.e.rx_head,
        tail_shared: &s.e.rx_tail,
        tail: s.e.rx_tail.load(Ordering::Relaxed),
    };
    let r = match c.next_record() {
        Ok(Some(i)) => Ok(i.len as c_int),
        Ok(None) => Ok(0),
        Err(_) => Err(libc::EIO),
    };
    sidelock::exit_rx(s.e, held);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeval_rules() {
        let tv = |s: i64, u: i64| {
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&s.to_ne_bytes());
            b[8..].copy_from_slice(&u.to_ne_bytes());
            b
        };
        assert_eq!(timeval_to_ns(&tv(0, 0)), Ok(0));
        assert_eq!(timeval_to_ns(&tv(1, 500_000)), Ok(1_500_000_000));
        assert_eq!(timeval_to_ns(&tv(0, 1_000_000)), Err(libc::EDOM));
        assert_eq!(timeval_to_ns(&tv(-1, 0)), Ok(1));
        assert_eq!(timeval_to_ns(&tv(1, 0)[..8]), Err(libc::EINVAL));
        assert_eq!(ns_to_timeval(1_500_000_000), tv(1, 500_000));
        assert_eq!(timeo_opt(libc::SOL_SOCKET, libc::SO_RCVTIMEO), Some(true));
        assert_eq!(timeo_opt(libc::SOL_SOCKET, libc::SO_SNDTIMEO), Some(false));
        assert_eq!(timeo_opt(libc::IPPROTO_TCP, libc::SO_RCVTIMEO), None);
    }

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
