//! One guest: its region, its request queue consumer, its host sockets, and one
//! service round over all of them. Everything a guest owns is in `Guest`, so guests
//! can later be split across worker threads without sharing state.
//!
//! Guest memory is hostile: every value read from the region is either copied and
//! validated (requests), checked against the host's own copy (ring indices), or only
//! used as a hint (attention bits, queue entries, sleep words).
#![forbid(unsafe_code)]

use crate::alloc::DataAlloc;
use crate::request::{self, Cmd, Request, SOCK_DGRAM, SOCK_STREAM};
use crate::sys::{self, Epoll};
use canal_abi::ring::{record_kind, Consumer, Producer};
use canal_abi::sync::{fence, Ordering};
use canal_abi::{
    errno, make_handle, op, sleep_kind, slot_state, sock_flag, sock_kind, CanalAddr, Layout,
    Region, SocketEntry, SLOT_PAYLOAD, WAIT_ANY,
};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Per-slot wake-up eventfds (PORT), shared by a guest's home and shadow instances
/// (virtual RSS): each slot's own mutex is only ever taken to register or to wake.
pub type Ports = Arc<Vec<Mutex<Option<OwnedFd>>>>;

/// A closed stream keeps draining its transmit ring as long as the peer takes bytes:
/// it is reset only after this long without progress (the kernel keeps an orphaned
/// connection for as long; `tcp_fin_timeout`'s default). Bytes a guest's `send`
/// accepted are thus delivered after `close` or `exit` as natively, and where they
/// cannot be the peer sees a reset, never a clean end of stream.
pub const DRAIN_STALL: Duration = Duration::from_secs(60);
/// Largest datagram canald receives in one call.
const DGRAM_MAX: usize = 65536;

pub mod shortcut;
pub mod vrss;
pub use shortcut::{SegLink, Shared as ShortcutShared, SharedRef as ShortcutRef};

/// The smallest ring a socket is given when the data area is short of the configured
/// size (one allocation chunk).
pub const MIN_RING: u64 = canal_abi::DATA_CHUNK;

/// `ring` halved (not below MIN_RING) until a data area of `data` bytes holds eight
/// rings: four sockets' tx and rx.
pub fn ring_for_four_sockets(mut ring: u64, data: u64) -> u64 {
    while ring > MIN_RING && 8 * ring > data {
        ring /= 2;
    }
    ring
}

/// Per-guest limits and sizes (from the command line).
#[derive(Clone, Debug)]
pub struct GuestConfig {
    pub layout: Layout,
    /// Bytes of each ring (tx and rx) given to a socket.
    pub ring_size: u64,
    /// Requests served per guest per round.
    pub budget: usize,
    /// Only loopback destinations are allowed (fuzzing, tests).
    pub loopback_only: bool,
    /// Largest byte count of one host send/receive call on a stream (`--no-batch`
    /// sets one guest send's worth; else unlimited: one writev/readv per batch).
    pub chunk: u64,
    /// Receive and transmit bytes a guest may move per round (deficit round robin).
    pub rx_quantum: u64,
    pub tx_quantum: u64,
    /// A VM guest's address view (`vm.rs`); None for a process guest.
    pub vm: Option<std::sync::Arc<crate::vm::VmNet>>,
}

impl GuestConfig {
    /// Defaults for everything but the layout.
    pub fn with_layout(layout: Layout, ring_size: u64) -> GuestConfig {
        GuestConfig {
            layout,
            ring_size,
            budget: 16,
            loopback_only: false,
            chunk: u64::MAX,
            rx_quantum: 256 << 10,
            tx_quantum: 1 << 20,
            vm: None,
        }
    }
}

// ---- epoll tokens -----------------------------------------------------------------

/// Epoll token layout: `type:8 | conn:24 | generation:16 | index:16`.
pub mod token {
    pub const LISTENER: u64 = 0;
    pub const CONTROL: u64 = 1;
    pub const DOORBELL: u64 = 2;
    pub const SOCKET: u64 = 3;
    pub const SIGNAL: u64 = 4;
    /// A worker's own eventfd (new guest, shutdown).
    pub const POKE: u64 = 5;
    /// A WATCH descriptor (`crate::watch`); distinct from every type above, since
    /// worker 0's poller consumes its own types before the daemon sees the rest.
    pub const WATCH: u64 = 6;
    /// The pidfd of a VM guest's VM process (`vm.rs`).
    pub const VM_PROCESS: u64 = 7;
    /// A guest's doorbell on a worker that is not its home (virtual RSS).
    pub const VRSS_DOORBELL: u64 = 8;
    /// A doorbell VM's ivshmem server (`ivshmem_server.rs`): index 0 its listener,
    /// 1 the QEMU client.
    pub const IVSHMEM: u64 = 9;

    pub fn make(ty: u64, conn: u32, gen: u16, index: u16) -> u64 {
        (ty << 56) | ((conn as u64 & 0xff_ffff) << 32) | ((gen as u64) << 16) | index as u64
    }
    pub fn ty(t: u64) -> u64 {
        t >> 56
    }
    pub fn conn(t: u64) -> u32 {
        ((t >> 32) & 0xff_ffff) as u32
    }
    pub fn gen(t: u64) -> u16 {
        (t >> 16) as u16
    }
    pub fn index(t: u64) -> u16 {
        t as u16
    }
}

// ---- address view -----------------------------------------------------------------

/// Guest view → host address for connect/sendto: identity for a process guest; a VM
/// guest's 10.0.2.2 is the host's 127.0.0.1 (`vm.rs`). Errors are errno values.
pub fn translate_guest_addr(guest: &GuestView, a: &CanalAddr) -> Result<CanalAddr, i32> {
    let a = match &guest.vm {
        Some(v) => v.dest_to_host(a),
        None => *a,
    };
    if guest.loopback_only && !is_loopback(&a) {
        return Err(errno::EACCES);
    }
    Ok(a)
}

/// Guest view → host address for bind: a VM guest's listeners live on the host's
/// loopback, on their published host port (`vm.rs`).
pub fn translate_guest_bind(guest: &GuestView, a: &CanalAddr) -> Result<CanalAddr, i32> {
    let a = match &guest.vm {
        Some(v) => v.bind_to_host(a),
        None => *a,
    };
    if guest.loopback_only && !is_loopback(&a) {
        return Err(errno::EACCES);
    }
    Ok(a)
}

/// Host address → guest view of a peer (getpeername, accept, recvfrom).
pub fn translate_host_addr(guest: &GuestView, a: &CanalAddr) -> CanalAddr {
    match &guest.vm {
        Some(v) => v.peer_to_guest(a),
        None => *a,
    }
}

/// Host address → guest view of a local address (getsockname).
pub fn translate_host_local(guest: &GuestView, a: &CanalAddr) -> CanalAddr {
    match &guest.vm {
        Some(v) => v.local_to_guest(a),
        None => *a,
    }
}

fn is_loopback(a: &CanalAddr) -> bool {
    match a.family {
        canal_abi::addr::FAMILY_INET => a.addr[0] == 127 || a.ip4() == [0; 4],
        _ => {
            let v6 = std::net::Ipv6Addr::from(a.addr);
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// What the address translation needs to know about a guest.
pub struct GuestView {
    pub id: u32,
    pub loopback_only: bool,
    pub vm: Option<std::sync::Arc<crate::vm::VmNet>>,
}

// ---- sockets ----------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Stream,
    Dgram,
    Listener,
}

/// The connection state machine of a host socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
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
struct RingPos {
    off: u64,
    size: u64,
    /// Host index: tx tail (consumer) or rx head (producer).
    idx: u64,
    /// Last guest index seen: tx head or rx tail.
    seen: u64,
}

fn is_linger(level: i32, name: i32) -> bool {
    level == libc::SOL_SOCKET && name == libc::SO_LINGER
}

/// A guest's `struct linger` as the kernel reads it: EINVAL if short; on when
/// `l_onoff` is non-zero (a negative time lingers "forever", as the kernel's
/// MAX_SCHEDULE_TIMEOUT does).
fn decode_linger(v: &[u8]) -> Result<Option<i32>, i32> {
    if v.len() < 8 {
        return Err(errno::EINVAL);
    }
    let on = i32::from_ne_bytes([v[0], v[1], v[2], v[3]]);
    let secs = i32::from_ne_bytes([v[4], v[5], v[6], v[7]]);
    Ok((on != 0).then_some(if secs < 0 { i32::MAX } else { secs }))
}

fn encode_linger(l: Option<i32>) -> [u8; 8] {
    let mut v = [0u8; 8];
    v[..4].copy_from_slice(&(l.is_some() as i32).to_ne_bytes());
    v[4..].copy_from_slice(&l.unwrap_or(0).to_ne_bytes());
    v
}

/// The guest broke a ring's rules.
#[derive(Debug)]
struct Corrupt;

pub struct HostSocket {
    pub handle: u32,
    pub kind: Kind,
    pub family: u16,
    fd: Option<OwnedFd>,
    pub phase: Phase,
    tx: RingPos,
    rx: RingPos,
    /// Flags as last published to the entry.
    flags: u32,
    readable: bool,
    writable: bool,
    rdhup: bool,
    shut_wr_pending: bool,
    /// Some(deadline): the guest closed it; the host drains tx and resets the
    /// connection if the deadline passes with bytes queued. Every drained byte moves
    /// the deadline DRAIN_STALL ahead.
    closing: Option<Instant>,
    /// The guest's SO_LINGER (emulated: the host socket's own is canald's, see
    /// `sys::set_abortive_close`): None off, Some(seconds) on. Some(0) makes close
    /// reset the connection.
    pub linger: Option<i32>,
    dirty: bool,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    /// Listener: (record end index, handle) of ACCEPT records the guest has not
    /// consumed yet. Their sockets are freed with the listener.
    unclaimed: std::collections::VecDeque<(u64, u32)>,
    /// A datagram received but not yet fitting in the rx ring.
    pending_dgram: Option<(Vec<u8>, Option<CanalAddr>)>,
    /// Short-circuited to another canal socket through a pair segment (§8).
    pub seg: Option<SegLink>,
    /// Its local address was seen bound (virtual RSS placement done once for it).
    named: bool,
    /// Listener served away from its guest's home: connections accepted and sent to
    /// the home for their entries, whose ACCEPT records are not written yet.
    accepting: u32,
}

impl HostSocket {
    pub fn index(&self) -> u32 {
        canal_abi::handle_index(self.handle)
    }
    fn generation(&self) -> u16 {
        canal_abi::handle_generation(self.handle) as u16
    }
    pub fn is_closing(&self) -> bool {
        self.closing.is_some()
    }
    pub fn local(&self) -> Option<CanalAddr> {
        if let Some(l) = &self.seg {
            return Some(l.local);
        }
        self.fd.as_ref().and_then(|f| sys::sockname(f).ok())
    }
    pub fn peer(&self) -> Option<CanalAddr> {
        if let Some(l) = &self.seg {
            return Some(l.peer);
        }
        self.fd.as_ref().and_then(|f| sys::peername(f).ok())
    }
}

/// Kick-side bookkeeping of one service round.
#[derive(Default, Debug, Clone, Copy)]
pub struct RoundStats {
    pub requests: usize,
    pub sockets: usize,
    pub bytes: u64,
}

impl RoundStats {
    pub fn did_work(&self) -> bool {
        self.requests + self.sockets > 0 || self.bytes > 0
    }
}

/// Counters of a doorbell VM (`canal stat`): its kicks (doorbell writes that reached
/// canald's eventfd); the interrupts sent are the guest's `wakes`.
#[derive(Debug, Default, Clone, Copy)]
pub struct DoorbellStats {
    pub kicks: u64,
    /// The VM's QEMU got the setup from the ivshmem server: until then a guest in that
    /// region (say, a VM given the file as ivshmem-plain by mistake) cannot ring us.
    pub attached: bool,
}

/// Host → guest wake-up coalescing state of one guest.
struct WakeState {
    /// The current round's time.
    now: Instant,
    /// When the last wake-up round began.
    last: Option<Instant>,
    /// Slots whose wake-up waits for the window's end (each once: `mark`).
    deferred: Vec<u32>,
    mark: Vec<bool>,
}

impl WakeState {
    fn new(slots: usize) -> WakeState {
        WakeState {
            now: Instant::now(),
            last: None,
            deferred: Vec::new(),
            mark: vec![false; slots],
        }
    }
    fn begin_round(&mut self, now: Instant) {
        self.now = now;
    }
    /// A wake-up may go out now: no window, or this round already woke (one round
    /// counts once), or the window since the last wake-up round is over.
    fn may_wake(&self, window: Duration) -> bool {
        window.is_zero()
            || self
                .last
                .is_none_or(|l| l == self.now || self.now.saturating_duration_since(l) >= window)
    }
    fn woke_now(&mut self) {
        self.last = Some(self.now);
    }
    /// Remembers a deferred slot; true if it was not already deferred.
    fn defer(&mut self, slot: u32) -> bool {
        match self.mark.get_mut(slot as usize) {
            Some(m) if !*m => {
                *m = true;
                self.deferred.push(slot);
                true
            }
            _ => false,
        }
    }
}

pub struct Guest {
    pub id: u32,
    pub pid: u32,
    pub comm: String,
    /// Control-connection key (epoll tokens).
    pub conn: u32,
    region: Region,
    cfg: GuestConfig,
    queue: canal_abi::queue::QueueConsumer,
    /// Per-slot wake-up eventfds registered with PORT.
    ports: Ports,
    sockets: Vec<Option<HostSocket>>,
    /// Next generation per entry index (1..=0xffff; handles are never 0).
    generations: Vec<u16>,
    alloc: DataAlloc,
    dirty: Vec<u32>,
    changed: Vec<u32>,
    changed_mark: Vec<u64>,
    scratch: Vec<u8>,
    /// Some(when): the guest's control connection closed.
    pub gone: Option<Instant>,
    /// Eventfd wake-ups written to this guest's slots, and those deferred.
    pub wakes: u64,
    pub deferred_wakes: u64,
    /// Guest-side coalescing window T_v (0: off), set by the poller each round.
    pub wake_window: Duration,
    /// When this guest last did work (the poller counts active guests).
    pub last_active: Option<Instant>,
    /// A VM served with ivshmem doorbells (protocol §9.5): its counters.
    pub doorbell: Option<DoorbellStats>,
    wake: WakeState,
    /// Deficit round robin: bytes this guest may still receive / transmit.
    rx_deficit: i64,
    tx_deficit: i64,
    /// Set when a socket stopped for lack of budget (it stays dirty).
    out_of_budget: bool,
    /// Set when this guest may short-circuit connections (§8).
    sc: Option<ShortcutRef>,
    /// No closing socket has a deadline before this (a lower bound; None: none).
    earliest_close: Option<Instant>,
    /// Sockets this instance owns, one bit per entry index: it takes only their
    /// attention bits (virtual RSS: other workers own the rest).
    owned: Vec<u64>,
    /// Virtual RSS state (None: every socket of the guest stays here).
    vr: Option<Box<vrss::State>>,
    // The mapping must outlive every use of `region`; it is dropped last.
    map: Arc<sys::Mapping>,
}

impl Guest {
    /// Creates a guest with a fresh region. Returns the guest and the region memfd.
    pub fn new(
        id: u32,
        conn: u32,
        pid: u32,
        comm: String,
        cfg: GuestConfig,
    ) -> io::Result<(Guest, OwnedFd)> {
        Guest::with_features(
            id,
            conn,
            pid,
            comm,
            cfg,
            canal_abi::feature::ALL_V1 | canal_abi::feature::WATCH,
        )
    }

    /// As `new`, with the region's feature bits chosen by the caller (SHORTCUT for a
    /// guest that announced it).
    pub fn with_features(
        id: u32,
        conn: u32,
        pid: u32,
        comm: String,
        cfg: GuestConfig,
        features: u64,
    ) -> io::Result<(Guest, OwnedFd)> {
        let (memfd, map, region) = sys::Mapping::create_region(cfg.layout, id, features)?;
        Ok((
            Guest::with_region(id, conn, pid, comm, cfg, map, region),
            memfd,
        ))
    }

    /// A guest on a region already created and mapped (`map` holds `region`).
    pub fn with_region(
        id: u32,
        conn: u32,
        pid: u32,
        comm: String,
        cfg: GuestConfig,
        map: sys::Mapping,
        region: Region,
    ) -> Guest {
        Guest::from_parts(id, conn, pid, comm, cfg, Arc::new(map), region)
    }

    /// A guest instance over a shared mapping (a home, or a virtual-RSS shadow).
    fn from_parts(
        id: u32,
        conn: u32,
        pid: u32,
        comm: String,
        cfg: GuestConfig,
        map: Arc<sys::Mapping>,
        region: Region,
    ) -> Guest {
        let n = cfg.layout.socket_count as usize;
        Guest {
            id,
            pid,
            comm,
            conn,
            region,
            queue: Default::default(),
            ports: Arc::new(
                (0..cfg.layout.slot_count)
                    .map(|_| Mutex::new(None))
                    .collect(),
            ),
            sockets: (0..n).map(|_| None).collect(),
            generations: vec![1; n],
            alloc: DataAlloc::new(cfg.layout.data_size),
            dirty: Vec::new(),
            changed: Vec::new(),
            changed_mark: vec![0; n.div_ceil(64)],
            scratch: vec![0; DGRAM_MAX],
            gone: None,
            wakes: 0,
            deferred_wakes: 0,
            wake_window: Duration::ZERO,
            last_active: None,
            doorbell: None,
            wake: WakeState::new(cfg.layout.slot_count as usize),
            rx_deficit: 0,
            tx_deficit: 0,
            out_of_budget: false,
            sc: None,
            earliest_close: None,
            owned: vec![0; n.div_ceil(64)],
            vr: None,
            cfg,
            map,
        }
    }

    pub fn region(&self) -> &Region {
        &self.region
    }

    /// A VM guest (ivshmem region).
    pub fn is_vm(&self) -> bool {
        self.cfg.vm.is_some()
    }

    /// Whether the poller must bound its sleep for this guest (protocol §9.4): a live
    /// VM guest without doorbells, or a doorbell VM with a process that cannot ring.
    pub fn needs_bounded_sleep(&self) -> bool {
        self.is_vm()
            && self.gone.is_none()
            && (self.doorbell.is_none_or(|d| !d.attached)
                || self.region.header().backoff_kickers.load(Ordering::Relaxed) != 0)
    }

    /// The region's mapping (tests and fuzzing write guest bytes through it).
    pub fn mapping(&self) -> &sys::Mapping {
        &self.map
    }

    pub fn region_size(&self) -> u64 {
        self.cfg.layout.region_size
    }

    fn view(&self) -> GuestView {
        GuestView {
            id: self.id,
            loopback_only: self.cfg.loopback_only,
            vm: self.cfg.vm.clone(),
        }
    }

    /// Stores the wake-up eventfd of `slot` (PORT). The fd must be an eventfd; it is
    /// made non-blocking so a wake-up can never block the poller.
    pub fn set_port(&mut self, slot: u32, fd: OwnedFd) -> Result<(), i32> {
        let p = self.ports.get(slot as usize).ok_or(errno::EINVAL)?;
        if !sys::is_eventfd(&fd) {
            return Err(errno::EINVAL);
        }
        sys::set_nonblocking(&fd).map_err(|e| sys::errno_of(&e))?;
        *p.lock().unwrap_or_else(|e| e.into_inner()) = Some(fd);
        Ok(())
    }

    /// No entry is free here (held, or served by another worker).
    fn table_full(&self) -> bool {
        (0..self.sockets.len()).all(|i| self.sockets[i].is_some() || self.is_away(i as u32))
    }

    pub fn sockets(&self) -> impl Iterator<Item = &HostSocket> {
        self.sockets.iter().flatten()
    }

    pub fn socket_count(&self) -> usize {
        self.sockets.iter().flatten().count()
    }

    /// Earliest drain deadline of a closing socket (possibly earlier than any still
    /// pending: then the poller wakes once more than needed).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.earliest_close
    }

    fn note_deadline(&mut self, d: Instant) {
        self.earliest_close = Some(self.earliest_close.map_or(d, |e| e.min(d)));
    }

    /// The control connection closed: the guest is gone. Sockets with nothing queued
    /// close now; the others drain their tx rings as long as the peer takes bytes.
    pub fn depart(&mut self, ep: &Epoll, now: Instant) {
        let deadline = now + DRAIN_STALL;
        self.gone = Some(now);
        self.mark_departed();
        self.retry_accepts(ep); // answers every waiting accept: no entry
        self.region.header().host_state.store(2, Ordering::Release);
        for i in 0..self.sockets.len() {
            if let Some(s) = &mut self.sockets[i] {
                s.closing = Some(s.closing.map_or(deadline, |d| d.min(deadline)));
                s.shut_wr_pending = false;
                self.mark_dirty(i as u32);
                self.note_deadline(deadline);
            }
        }
        self.service_dirty(ep, now, &mut RoundStats::default());
    }

    /// Whether a departed guest has finished (no sockets left).
    pub fn finished(&self) -> bool {
        self.gone.is_some() && self.sockets.iter().all(|s| s.is_none()) && !self.any_away()
    }

    /// Closes every host socket at once (daemon exit, or a departed guest whose drain
    /// time ran out).
    pub fn close_all(&mut self, ep: &Epoll) {
        for i in 0..self.sockets.len() {
            if self.sockets[i].is_some() {
                self.free_socket(ep, i as u32);
            }
        }
        self.region.header().host_state.store(2, Ordering::Release);
    }

    fn mark_dirty(&mut self, index: u32) {
        if let Some(Some(s)) = self.sockets.get_mut(index as usize) {
            if !s.dirty {
                s.dirty = true;
                self.dirty.push(index);
            }
        }
    }

    fn mark_changed(&mut self, index: u32) {
        self.mark_to_wake(index);
        if let Some(e) = self.region.socket(index) {
            e.event_seq.fetch_add(1, Ordering::Release);
        }
    }

    /// Wakes the socket's event sleepers at the round's end without counting an event
    /// (its `event_seq` stays: an edge-triggered epoll reports nothing new).
    fn mark_to_wake(&mut self, index: u32) {
        let (w, b) = ((index / 64) as usize, index % 64);
        if let Some(word) = self.changed_mark.get_mut(w) {
            if *word & (1 << b) == 0 {
                *word |= 1 << b;
                self.changed.push(index);
            }
        }
    }

    /// An epoll event for one of this guest's host sockets.
    pub fn socket_event(&mut self, tok: u64, events: u32) {
        let index = token::index(tok) as u32;
        let Some(Some(s)) = self.sockets.get_mut(index as usize) else {
            return;
        };
        if s.generation() != token::gen(tok) {
            return; // a stale event for a previous socket on this index
        }
        if events & (sys::EP_IN | sys::EP_HUP | sys::EP_ERR | sys::EP_RDHUP) != 0 {
            s.readable = true;
        }
        if events & (sys::EP_OUT | sys::EP_HUP | sys::EP_ERR) != 0 {
            s.writable = true;
        }
        if events & (sys::EP_RDHUP | sys::EP_HUP) != 0 {
            s.rdhup = true;
        }
        self.mark_dirty(index);
    }

    /// Whether this guest has published work the host has not picked up yet (the
    /// re-check before sleeping, protocol §6).
    pub fn has_pending(&self) -> bool {
        let r = &self.region;
        // A shadow (virtual RSS) never pops the queue: requests are its home's.
        (!self.is_shadow() && self.queue.has_next(r.queue_cells()))
            || r.attention()
                .iter()
                .zip(&self.owned)
                .any(|(w, m)| w.load(Ordering::Relaxed) & m != 0)
            || !self.dirty.is_empty()
            || !self.wake.deferred.is_empty()
    }

    pub fn set_host_sleeping(&self, v: u32) {
        let h = self.region.header();
        if let Some(vr) = &self.vr {
            if let Some(word) = h.worker_sleeping.get(vr.me as usize) {
                word.store(v, Ordering::Relaxed);
            }
            if vr.is_shadow() {
                return; // the request doorbell's word belongs to the home worker
            }
        }
        h.host_sleeping.store(v, Ordering::Relaxed);
    }

    /// One service round: requests (bounded), attention bits, dirty sockets, then the
    /// wake-ups of sleepers whose sockets changed.
    pub fn service_round(&mut self, ep: &Epoll, now: Instant) -> RoundStats {
        let mut st = self.service_requests(ep, now);
        let d = self.service_data(ep, now);
        st.sockets += d.sockets;
        st.bytes += d.bytes;
        st
    }

    /// The command class of a round: up to `budget` requests (a short slice).
    pub fn service_requests(&mut self, ep: &Epoll, now: Instant) -> RoundStats {
        let mut st = RoundStats::default();
        self.wake.begin_round(now);
        if self.gone.is_none() {
            self.serve_requests(ep, &mut st);
        }
        if st.did_work() {
            self.last_active = Some(now);
        }
        st
    }

    /// The data classes of a round: attention bits, then each dirty socket's receive
    /// work, then its transmit work, within this guest's byte deficits; then the
    /// wake-ups of sleepers whose sockets changed (coalesced per `wake_window`).
    pub fn service_data(&mut self, ep: &Epoll, now: Instant) -> RoundStats {
        let mut st = RoundStats::default();
        self.wake.begin_round(now);
        if self.gone.is_none() {
            self.serve_attention();
        }
        // DRR: a backlogged guest earns one quantum per round (at most two banked); an
        // idle one starts from one quantum.
        let (rq, tq) = (self.cfg.rx_quantum as i64, self.cfg.tx_quantum as i64);
        if self.dirty.is_empty() {
            self.rx_deficit = rq;
            self.tx_deficit = tq;
        } else {
            self.rx_deficit = (self.rx_deficit.max(0) + rq).min(2 * rq);
            self.tx_deficit = (self.tx_deficit.max(0) + tq).min(2 * tq);
        }
        self.service_dirty(ep, now, &mut st);
        self.expire_closing(ep, now);
        self.wake_event_sleepers();
        self.flush_deferred_wakes(now);
        if st.did_work() {
            self.last_active = Some(now);
        }
        st
    }

    fn serve_requests(&mut self, ep: &Epoll, st: &mut RoundStats) {
        let region = self.region;
        let cells = region.queue_cells();
        for _ in 0..self.cfg.budget {
            let Some(idx) = self.queue.pop(cells) else {
                break;
            };
            st.requests += 1;
            let Some(slot) = region.slot(idx) else {
                continue; // garbage index: ignore
            };
            if slot
                .state
                .compare_exchange(
                    slot_state::REQUESTED,
                    slot_state::BUSY,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_err()
            {
                continue; // not a request: ignore the entry
            }
            let req = Request::copy_from(slot);
            if self.forward(idx, &req) {
                continue; // the owning worker completes the slot
            }
            self.run_request(ep, idx, &req);
        }
    }

    /// Executes a request taken from slot `idx` and completes the slot (DONE, then
    /// the §6 wake-up of its thread if it sleeps).
    fn run_request(&mut self, ep: &Epoll, idx: u32, req: &Request) {
        let region = self.region;
        let Some(slot) = region.slot(idx) else {
            return;
        };
        let mut out = [0u8; SLOT_PAYLOAD];
        let (result, out_len) = match self.execute(ep, req, &mut out) {
            Ok(v) => v,
            Err(e) => (-(e as i64), 0),
        };
        if out_len > 0 {
            slot.write_payload(0, &out[..out_len.min(SLOT_PAYLOAD)]);
        }
        slot.out_len.store(out_len as u32, Ordering::Relaxed);
        slot.result.store(result, Ordering::Relaxed);
        slot.done_seq.store(req.seq, Ordering::Relaxed);
        // Publishes result/payload; pairs with the guest's Acquire load of DONE.
        slot.state.store(slot_state::DONE, Ordering::Release);
        // §6 wake: the guest stores `sleep`, fences, re-checks `state`; we store
        // `state`, fence, read `sleep` — one of us sees the other.
        fence(Ordering::SeqCst);
        if slot.sleep.load(Ordering::Relaxed) != sleep_kind::AWAKE {
            self.wake_slot(idx);
        }
    }

    fn has_port(&self, slot: u32) -> bool {
        self.ports
            .get(slot as usize)
            .is_some_and(|p| p.lock().unwrap_or_else(|e| e.into_inner()).is_some())
    }

    /// Writes slot `slot`'s wake-up eventfd; false if it has none.
    fn signal_port(&self, slot: u32) -> bool {
        let Some(p) = self.ports.get(slot as usize) else {
            return false;
        };
        match &*p.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(fd) => {
                let _ = sys::eventfd_write(fd.as_raw_fd());
                true
            }
            None => false,
        }
    }

    /// Wakes a sleeping slot, at most one wake-up round per `wake_window` per guest
    /// (later ones are deferred to the window's end, see `flush_deferred_wakes`).
    fn wake_slot(&mut self, slot: u32) {
        if !self.has_port(slot) {
            return;
        }
        if !self.wake.may_wake(self.wake_window) {
            if self.wake.defer(slot) {
                self.deferred_wakes += 1;
            }
            return;
        }
        if self.wake.mark.get(slot as usize) == Some(&true) {
            return; // already deferred: this round's flush wakes it (once)
        }
        if self.signal_port(slot) {
            self.wakes += 1;
            self.wake.woke_now();
        }
    }

    /// Once the window is over, wakes the deferred slots that still sleep (§6: a slot
    /// that went to sleep after our change re-checked and saw it; one still asleep
    /// needs the wake-up; a spurious one costs it a look).
    fn flush_deferred_wakes(&mut self, _now: Instant) {
        if self.wake.deferred.is_empty() || !self.wake.may_wake(self.wake_window) {
            return;
        }
        fence(Ordering::SeqCst);
        let list = std::mem::take(&mut self.wake.deferred);
        for &i in &list {
            if let Some(m) = self.wake.mark.get_mut(i as usize) {
                *m = false;
            }
            let asleep = self
                .region
                .slot(i)
                .is_some_and(|s| s.sleep.load(Ordering::Relaxed) != sleep_kind::AWAKE);
            if asleep && self.signal_port(i) {
                self.wakes += 1;
            }
        }
        let mut list = list;
        list.clear();
        self.wake.deferred = list;
        self.wake.woke_now();
    }

    fn serve_attention(&mut self) {
        let region = self.region;
        for (w, word) in region.attention().iter().enumerate() {
            // Only the bits of sockets this instance owns (virtual RSS: the others
            // belong to other workers and stay set for them).
            let mask = self.owned.get(w).copied().unwrap_or(0);
            if word.load(Ordering::Relaxed) & mask == 0 {
                continue;
            }
            // A2: Acquire pairs with the guest's Release fetch_or (A1).
            let mut bits = word.fetch_and(!mask, Ordering::Acquire) & mask;
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                self.mark_dirty(w as u32 * 64 + b);
            }
        }
    }

    pub(crate) fn wake_event_sleepers(&mut self) {
        if self.changed.is_empty() {
            return;
        }
        self.last_active = Some(self.wake.now);
        let h = self.region.header();
        h.event_seq.fetch_add(1, Ordering::Release);
        // §6: we stored indices/flags/event_seq, fence, then read the sleep words; the
        // guest stores sleep, fences, re-checks readiness.
        fence(Ordering::SeqCst);
        if h.event_waiters.load(Ordering::Relaxed) > 0 {
            for i in 0..self.cfg.layout.slot_count {
                let Some(slot) = self.region.slot(i) else {
                    break;
                };
                if slot.sleep.load(Ordering::Relaxed) != sleep_kind::EVENTS {
                    continue;
                }
                let ws = slot.wait_socket.load(Ordering::Relaxed);
                let hit = ws == WAIT_ANY
                    || self
                        .changed_mark
                        .get((ws / 64) as usize)
                        .is_some_and(|w| w & (1 << (ws % 64)) != 0);
                if hit {
                    self.wake_slot(i);
                }
            }
        }
        for i in self.changed.drain(..) {
            if let Some(w) = self.changed_mark.get_mut((i / 64) as usize) {
                *w = 0;
            }
        }
    }

    // ---- requests -------------------------------------------------------------

    /// Executes a request copy. Ok((result, out_len)); Err(errno).
    pub fn execute(
        &mut self,
        ep: &Epoll,
        req: &Request,
        out: &mut [u8; SLOT_PAYLOAD],
    ) -> Result<(i64, usize), i32> {
        if req.op == 0 || req.op > op::MAX {
            return Err(errno::ENOSYS);
        }
        let index = if request::needs_handle(req.op) {
            Some(self.lookup(req.socket)?)
        } else {
            None
        };
        let cmd = request::decode(req)?;
        let Some(index) = index else {
            return match cmd {
                Cmd::Socket {
                    domain,
                    ty,
                    protocol,
                } => self
                    .op_socket(ep, domain, ty, protocol)
                    .map(|h| (h as i64, 0)),
                _ => Ok((0, 0)),
            };
        };
        let view = self.view();
        match cmd {
            Cmd::Bind(a) => {
                let a = translate_guest_bind(&view, &a)?;
                let s = self.live(index)?;
                sys::bind(fd_of(s)?, &a).map_err(|e| sys::errno_of(&e))?;
                // A datagram socket's local address is known: its owner serves it.
                self.place(ep, index, None);
                Ok((0, 0))
            }
            Cmd::Listen(backlog) => {
                let r = self.op_listen(index, backlog);
                if r.is_ok() {
                    // Listeners spread by their local address (virtual RSS).
                    self.place(ep, index, None);
                }
                r
            }
            Cmd::Connect(a) => {
                let a = translate_guest_addr(&view, &a)?;
                if let Some(r) = self.sc_try_connect(index, &a) {
                    return r;
                }
                let r = self.op_connect(index, &a);
                if r.is_ok() {
                    // The flow is known: its owner serves it from now on.
                    self.place(ep, index, Some(&a));
                }
                r
            }
            Cmd::Disconnect => self.op_disconnect(index),
            Cmd::Close => {
                self.op_close(index);
                // Nothing left to send (a listener, an idle connection): free it now,
                // so the port is released before the reply, as a native close does (a
                // bind to it may be the guest's very next request, in this round).
                self.finish_if_closed(ep, index, Instant::now());
                Ok((0, 0))
            }
            Cmd::Shutdown(how) => self.op_shutdown(index, how),
            Cmd::SetOpt { level, name, value } if is_linger(level, name) => {
                let l = decode_linger(&value)?;
                self.live(index)?.linger = l;
                Ok((0, 0))
            }
            Cmd::GetOpt { level, name, len } if is_linger(level, name) => {
                let l = self.live(index)?.linger;
                let v = encode_linger(l);
                let n = len.min(v.len());
                out[..n].copy_from_slice(&v[..n]);
                Ok((0, n))
            }
            Cmd::SetOpt { level, name, value } => {
                let s = self.live(index)?;
                sys::setsockopt_bytes(fd_of(s)?, level, name, &value)
                    .map_err(|e| sys::errno_of(&e))?;
                Ok((0, 0))
            }
            Cmd::GetOpt { level, name, len } => {
                if let Some(r) = self.sc_tcp_info(index, level, name, &mut out[..len]) {
                    return r;
                }
                let s = self.live(index)?;
                let n = sys::getsockopt_bytes(fd_of(s)?, level, name, &mut out[..len])
                    .map_err(|e| sys::errno_of(&e))?;
                Ok((0, n))
            }
            Cmd::SockName | Cmd::PeerName => {
                let s = self.live(index)?;
                if let Some(l) = &s.seg {
                    let a = if cmd == Cmd::SockName {
                        l.local
                    } else {
                        l.peer
                    };
                    let a = translate_host_addr(&view, &a).encode();
                    out[..a.len()].copy_from_slice(&a);
                    return Ok((0, a.len()));
                }
                let fd = fd_of(s)?;
                let a = if cmd == Cmd::SockName {
                    sys::sockname(fd).map(|a| translate_host_local(&view, &a))
                } else {
                    sys::peername(fd).map(|a| translate_host_addr(&view, &a))
                }
                .map_err(|e| sys::errno_of(&e))?
                .encode();
                out[..a.len()].copy_from_slice(&a);
                Ok((0, a.len()))
            }
            Cmd::Socket { .. } | Cmd::Nop => Ok((0, 0)),
        }
    }

    /// Index of a live (not closing) socket named by `handle`, else EBADF.
    fn lookup(&self, handle: u32) -> Result<u32, i32> {
        let index = canal_abi::handle_index(handle);
        match self.sockets.get(index as usize) {
            Some(Some(s)) if s.handle == handle && s.closing.is_none() => Ok(index),
            _ => Err(errno::EBADF),
        }
    }

    fn live(&mut self, index: u32) -> Result<&mut HostSocket, i32> {
        match self.sockets.get_mut(index as usize) {
            Some(Some(s)) => Ok(s),
            _ => Err(errno::EBADF),
        }
    }

    fn entry(&self, index: u32) -> &SocketEntry {
        self.region
            .socket(index)
            .expect("host socket indices are < socket_count")
    }

    /// Table entry `i` is neither in use here nor lent to another worker (vRSS).
    fn is_free_entry(&self, i: usize) -> bool {
        self.sockets[i].is_none() && !self.is_away(i as u32)
    }

    /// A socket's two rings: the configured size while the data area has room for it
    /// and still for MIN_RING rings for every other free table entry; else the largest
    /// smaller power of two that leaves that room (down to MIN_RING). So a guest with
    /// few sockets gets large rings, and one with many still gets every table entry
    /// (with smaller buffers, as the kernel's under memory pressure) rather than
    /// ENOBUFS. Returns (tx offset, rx offset, ring size).
    fn alloc_rings(&mut self) -> Result<(u64, u64, u64), i32> {
        let free_entries = (0..self.sockets.len())
            .filter(|&i| self.is_free_entry(i))
            .count();
        let others = free_entries.saturating_sub(1) as u64;
        let reserve = others.saturating_mul(2 * MIN_RING);
        let mut size = self.cfg.ring_size;
        while size > MIN_RING && 2 * size + reserve > self.alloc.free_bytes() {
            size /= 2;
        }
        // A fragmented area may still lack a block of this size: halve on.
        loop {
            if let Some(tx) = self.alloc.alloc(size) {
                if let Some(rx) = self.alloc.alloc(size) {
                    return Ok((tx, rx, size));
                }
                self.alloc.free(tx, size);
            }
            if size <= MIN_RING {
                return Err(errno::ENOBUFS);
            }
            size /= 2;
        }
    }

    /// Allocates an entry, rings and epoll registration for `fd`. Publishes the entry
    /// (kind last). Err(errno) leaves nothing allocated.
    fn install(
        &mut self,
        ep: &Epoll,
        fd: OwnedFd,
        kind: Kind,
        family: u16,
        phase: Phase,
    ) -> Result<u32, i32> {
        let index = (0..self.sockets.len())
            .position(|i| self.is_free_entry(i))
            .ok_or(errno::EMFILE)? as u32;
        let (tx_off, rx_off, size) = self.alloc_rings()?;
        let gen = self.generations[index as usize];
        let handle = make_handle(index, gen as u32);
        let tok = token::make(token::SOCKET, self.conn, gen, index as u16);
        let ev = sys::EP_IN | sys::EP_OUT | sys::EP_RDHUP | sys::EP_ET;
        if let Err(e) = ep.add(fd.as_raw_fd(), ev, tok) {
            self.alloc.free(tx_off, size);
            self.alloc.free(rx_off, size);
            return Err(sys::errno_of(&e));
        }
        let flags = match phase {
            Phase::Connected => sock_flag::CONNECTED,
            _ => 0,
        };
        if kind == Kind::Stream {
            // Until an orderly close clears it: canald's death must reset the
            // connection, not end it cleanly with the guest's bytes still in the ring.
            let _ = sys::set_abortive_close(&fd, true);
        }
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
        self.sockets[index as usize] = Some(HostSocket {
            handle,
            kind,
            family,
            fd: Some(fd),
            phase,
            tx: ring(tx_off),
            rx: ring(rx_off),
            flags,
            readable: false,
            writable: false,
            rdhup: false,
            shut_wr_pending: false,
            closing: None,
            linger: None,
            dirty: false,
            tx_bytes: 0,
            rx_bytes: 0,
            unclaimed: Default::default(),
            pending_dgram: None,
            seg: None,
            named: false,
            accepting: 0,
        });
        self.set_owned(index, true);
        Ok(handle)
    }

    fn op_socket(&mut self, ep: &Epoll, domain: i32, ty: i32, protocol: i32) -> Result<u32, i32> {
        // Check the caps before creating a host socket.
        if self.table_full() {
            return Err(errno::EMFILE);
        }
        if self.alloc.free_bytes() < 2 * MIN_RING {
            return Err(errno::ENOBUFS);
        }
        // canald out of descriptors is the whole system's table for the guest.
        let fd = sys::socket(domain, ty, protocol).map_err(|e| match sys::errno_of(&e) {
            libc::EMFILE => libc::ENFILE,
            e => e,
        })?;
        let kind = if ty == SOCK_STREAM {
            Kind::Stream
        } else {
            debug_assert_eq!(ty, SOCK_DGRAM);
            Kind::Dgram
        };
        self.install(ep, fd, kind, domain as u16, Phase::Open)
    }

    fn op_listen(&mut self, index: u32, backlog: i32) -> Result<(i64, usize), i32> {
        let s = self.live(index)?;
        if s.kind == Kind::Dgram {
            return Err(errno::EOPNOTSUPP);
        }
        if !matches!(s.phase, Phase::Open | Phase::Listening) {
            return Err(errno::EINVAL);
        }
        sys::listen(fd_of(s)?, backlog).map_err(|e| sys::errno_of(&e))?;
        s.kind = Kind::Listener;
        s.phase = Phase::Listening;
        s.readable = true; // connections may already be queued
        let e = self.entry(index);
        e.kind.store(sock_kind::LISTENER, Ordering::Release);
        self.set_flags(index, sock_flag::LISTENING, 0);
        self.sc_listened(index, backlog);
        self.mark_dirty(index);
        Ok((0, 0))
    }

    /// connect(AF_UNSPEC) on a datagram socket: the kernel drops the default peer
    /// (and keeps the local address); other kinds: EOPNOTSUPP.
    fn op_disconnect(&mut self, index: u32) -> Result<(i64, usize), i32> {
        let s = self.live(index)?;
        if s.kind != Kind::Dgram {
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

    fn op_connect(&mut self, index: u32, a: &CanalAddr) -> Result<(i64, usize), i32> {
        let s = self.live(index)?;
        match (s.kind, s.phase) {
            (Kind::Listener, _) => return Err(errno::EISCONN),
            (Kind::Stream, Phase::Connecting) => return Err(errno::EALREADY),
            (Kind::Stream, Phase::Connected) => return Err(errno::EISCONN),
            (_, Phase::Broken) => return Err(errno::EIO),
            _ => {}
        }
        let kind = s.kind;
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
                Ok((0, 0))
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
                self.mark_dirty(index);
                Ok((-(errno::EINPROGRESS as i64), 0))
            }
            Err(e) => Err(sys::errno_of(&e)),
        }
    }

    fn op_close(&mut self, index: u32) {
        if let Some(Some(s)) = self.sockets.get_mut(index as usize) {
            let d = Instant::now() + DRAIN_STALL;
            s.closing = Some(d);
            self.note_deadline(d);
            self.set_flags(index, sock_flag::CLOSING, 0);
            self.mark_dirty(index);
        }
    }

    /// Whether socket `index` exists with this generation (a WATCH target).
    pub fn has_live_socket(&self, index: u32, gen: u16) -> bool {
        matches!(self.sockets.get(index as usize), Some(Some(s)) if s.generation() == gen)
            || self.has_away(index, gen)
    }

    /// The guest's last descriptor of socket (index, gen) is gone (its WATCH fired):
    /// close it as a CLOSE request would, unless it is already closing.
    pub fn close_unreferenced(&mut self, index: u32, gen: u16) {
        if self.close_away(index, gen) {
            return; // served by another worker: forwarded there
        }
        if matches!(self.sockets.get(index as usize),
            Some(Some(s)) if s.generation() == gen && !s.is_closing())
        {
            self.op_close(index);
        }
    }

    fn op_shutdown(&mut self, index: u32, how: i32) -> Result<(i64, usize), i32> {
        if let Some(r) = self.sc_shutdown(index, how) {
            return r;
        }
        let s = self.live(index)?;
        let fd = fd_of(s)?;
        if !(s.kind == Kind::Stream && s.phase == Phase::Connected) {
            // Listeners (wakes accept), datagram sockets, unconnected streams: the
            // kernel's answer is the native one (ENOTCONN where it applies).
            sys::shutdown(fd, how).map_err(|e| sys::errno_of(&e))?;
            s.readable = true;
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

    /// Publishes flag changes (adds HUP when both directions are over).
    fn set_flags(&mut self, index: u32, add: u32, remove: u32) {
        let Some(Some(s)) = self.sockets.get_mut(index as usize) else {
            return;
        };
        let mut f = (s.flags | add) & !remove;
        let both = sock_flag::RX_EOF | sock_flag::TX_CLOSED;
        if f & both == both {
            f |= sock_flag::HUP;
        }
        if f != s.flags {
            s.flags = f;
            self.entry(index).flags.store(f, Ordering::Release);
            self.mark_changed(index);
        }
    }

    fn set_error(&mut self, index: u32, err: i32, add: u32, remove: u32) {
        self.entry(index)
            .pending_error
            .store(err as u32, Ordering::Release);
        self.set_flags(index, add | sock_flag::ERROR, remove);
    }

    /// The guest violated the ring protocol on this socket: close the host side.
    fn break_socket(&mut self, ep: &Epoll, index: u32) {
        let Some(Some(s)) = self.sockets.get_mut(index as usize) else {
            return;
        };
        s.phase = Phase::Broken;
        s.pending_dgram = None;
        if let Some(fd) = s.fd.take() {
            ep.delete(fd.as_raw_fd());
        }
        self.set_error(
            index,
            errno::EIO,
            sock_flag::BROKEN | sock_flag::HUP | sock_flag::RX_EOF | sock_flag::TX_CLOSED,
            sock_flag::CONNECTING | sock_flag::RX_WANT_SPACE,
        );
    }

    /// Releases an entry: host socket, rings, then kind FREE and a new generation.
    fn free_socket(&mut self, ep: &Epoll, index: u32) {
        let reset = self.close_must_reset(index);
        let Some(s) = self.sockets.get_mut(index as usize).and_then(|s| s.take()) else {
            return;
        };
        if let Some(fd) = &s.fd {
            ep.delete(fd.as_raw_fd());
            // Host streams are abortive ({1, 0}) while canald drives them, so canald's
            // death resets them; an orderly close clears that first. Neither blocks.
            if s.kind == Kind::Stream && !reset {
                let _ = sys::set_abortive_close(fd, false);
            }
        }
        self.sc_freed(&s);
        if !s.unclaimed.is_empty() {
            // Connections accepted for the guest but never taken by it go with the
            // listener (the guest's tail says which records it consumed).
            let tail = self.entry(index).rx_tail.load(Ordering::Acquire);
            for &(end, h) in &s.unclaimed {
                if (end.wrapping_sub(tail) as i64) > 0 {
                    self.release(ep, canal_abi::handle_index(h), h);
                }
            }
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
        self.alloc.free(s.tx.off, s.tx.size);
        self.alloc.free(s.rx.off, s.rx.size);
        self.generations[index as usize] = next;
        // A listener that stopped accepting for lack of entries can go on, and so can
        // connections an away listener accepted.
        if self.gone.is_some() {
            return;
        }
        self.rearm_listeners();
        self.retry_accepts(ep);
    }

    /// Listeners that stopped accepting for lack of entries or rings look again.
    fn rearm_listeners(&mut self) {
        for i in 0..self.sockets.len() {
            if let Some(l) = &self.sockets[i] {
                if l.kind == Kind::Listener && l.readable {
                    self.mark_dirty(i as u32);
                }
            }
        }
    }

    fn expire_closing(&mut self, ep: &Epoll, now: Instant) {
        if self.earliest_close.is_none_or(|d| d > now) {
            return;
        }
        let mut next: Option<Instant> = None;
        for i in 0..self.sockets.len() {
            let Some(d) = self.sockets[i].as_ref().and_then(|s| s.closing) else {
                continue;
            };
            if d <= now {
                self.free_socket(ep, i as u32);
            } else {
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        self.earliest_close = next;
    }

    // ---- data path ------------------------------------------------------------

    pub fn service_dirty(&mut self, ep: &Epoll, now: Instant, st: &mut RoundStats) {
        let list = std::mem::take(&mut self.dirty);
        for (k, &index) in list.iter().enumerate() {
            if self.gone.is_none() && (self.rx_deficit <= 0 || self.tx_deficit <= 0) {
                // Out of budget: the rest stays dirty for the next round, in order.
                self.dirty.extend_from_slice(&list[k..]);
                break;
            }
            let Some(Some(s)) = self.sockets.get_mut(index as usize) else {
                continue;
            };
            s.dirty = false;
            self.out_of_budget = false;
            st.sockets += 1;
            if s.seg.is_some() {
                self.sc_service(index);
                self.finish_if_closed(ep, index, now);
                continue;
            }
            let r = match s.kind {
                Kind::Stream => self.service_stream(index, st),
                Kind::Dgram => self.service_dgram(index, st),
                Kind::Listener => self.service_listener(ep, index),
            };
            if r.is_err() {
                self.break_socket(ep, index);
            } else if self.out_of_budget {
                self.mark_dirty(index);
            }
            self.finish_if_closed(ep, index, now);
            self.place_if_autobound(ep, index);
        }
        // Keep the allocation for the next round.
        let mut list = list;
        list.clear();
        if self.dirty.is_empty() {
            self.dirty = list;
        }
    }

    /// A closing socket whose tx ring drained (or that can send no more) is freed.
    fn finish_if_closed(&mut self, ep: &Epoll, index: u32, now: Instant) {
        let Some(Some(s)) = self.sockets.get(index as usize) else {
            return;
        };
        let Some(deadline) = s.closing else {
            return;
        };
        let can_send = s.kind != Kind::Listener
            && s.fd.is_some()
            && s.phase == Phase::Connected
            && s.flags & sock_flag::TX_CLOSED == 0;
        // A corrupt index counts as "nothing more to send".
        let queued = if can_send {
            self.tx_avail(index).unwrap_or(0)
        } else {
            0
        };
        if queued == 0 || deadline <= now {
            self.free_socket(ep, index);
        }
    }

    /// Whether closing socket `index` now must reset its connection: the guest asked
    /// for it (SO_LINGER {1, 0}), or bytes its sends accepted are still queued, which
    /// can no longer be delivered (the peer must not take the stream as complete).
    fn close_must_reset(&mut self, index: u32) -> bool {
        let Some(Some(s)) = self.sockets.get(index as usize) else {
            return false;
        };
        if s.kind != Kind::Stream || s.fd.is_none() || s.seg.is_some() {
            return false;
        }
        if s.linger == Some(0) {
            return true;
        }
        let sending = s.phase == Phase::Connected && s.flags & sock_flag::TX_CLOSED == 0;
        sending && self.tx_avail(index).map_or(true, |q| q > 0)
    }

    /// Bytes the guest has queued on tx, checked: head - tail ≤ size and the guest's
    /// head never moves backwards.
    fn tx_avail(&mut self, index: u32) -> Result<u64, Corrupt> {
        let head = self.entry(index).tx_head.load(Ordering::Acquire); // R3
        let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
        let used = head.wrapping_sub(s.tx.idx);
        let before = s.tx.seen.wrapping_sub(s.tx.idx);
        if used > s.tx.size || used < before {
            return Err(Corrupt);
        }
        s.tx.seen = head;
        Ok(used)
    }

    /// Free rx space, checked: the guest's tail lies between its last value and our head.
    fn rx_free(&mut self, index: u32) -> Result<u64, Corrupt> {
        let tail = self.entry(index).rx_tail.load(Ordering::Acquire); // R1
        let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
        let adv = tail.wrapping_sub(s.rx.seen);
        let unread = s.rx.idx.wrapping_sub(s.rx.seen);
        if adv > unread {
            return Err(Corrupt);
        }
        s.rx.seen = tail;
        Ok(s.rx.size - s.rx.idx.wrapping_sub(tail))
    }

    fn publish_tx_tail(&mut self, index: u32, n: u64) {
        let s = self.sockets[index as usize].as_mut().expect("live socket");
        let old = s.tx.idx;
        let size = s.tx.size;
        s.tx.idx = s.tx.idx.wrapping_add(n);
        s.tx_bytes = s.tx_bytes.wrapping_add(n);
        if s.closing.is_some() && n > 0 {
            // A closed socket whose peer still takes bytes keeps draining.
            s.closing = Some(Instant::now() + DRAIN_STALL);
        }
        let t = s.tx.idx;
        // R4: our reads of the bytes are done before the guest may reuse the space.
        self.entry(index).tx_tail.store(t, Ordering::Release);
        // A drain changes a stream's readiness only if the guest may have found the
        // ring full (POLLOUT is "tx_free > 0"; a blocked send waits for exactly that):
        // the kernel's write-space wake-up likewise needs SOCK_NOSPACE. Otherwise it is
        // no event, so a thread sleeping for the reply is not woken by its own request
        // leaving (protocol §6). Same fence pairing as the sleep words: we store the
        // tail, fence, read the head; a guest that stores its head, fences and re-reads
        // the tail either sees our tail or we see its head at `old + size`.
        fence(Ordering::SeqCst);
        let head = self.entry(index).tx_head.load(Ordering::Relaxed);
        if head.wrapping_sub(old) >= size {
            self.mark_changed(index);
        }
    }

    fn publish_rx_head(&mut self, index: u32, new_head: u64, payload: u64) {
        let s = self.sockets[index as usize].as_mut().expect("live socket");
        s.rx.idx = new_head;
        s.rx_bytes = s.rx_bytes.wrapping_add(payload);
        // R2: the bytes are written before the guest sees the new head.
        self.entry(index).rx_head.store(new_head, Ordering::Release);
        self.mark_changed(index);
    }

    /// Discards whatever the guest queued on tx (after a reset or EPIPE).
    fn discard_tx(&mut self, index: u32) -> Result<(), Corrupt> {
        let n = self.tx_avail(index)?;
        if n > 0 {
            let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
            s.tx.idx = s.tx.idx.wrapping_add(n);
            let t = s.tx.idx;
            self.entry(index).tx_tail.store(t, Ordering::Release);
            self.mark_changed(index);
        }
        Ok(())
    }

    fn reset(&mut self, index: u32, err: i32) -> Result<(), Corrupt> {
        if let Some(s) = self.sockets[index as usize].as_mut() {
            s.phase = Phase::Failed;
            s.readable = false;
            s.writable = false;
        }
        self.set_error(
            index,
            err,
            sock_flag::RX_EOF | sock_flag::TX_CLOSED | sock_flag::HUP,
            sock_flag::RX_WANT_SPACE | sock_flag::CONNECTING,
        );
        self.discard_tx(index)
    }

    fn service_stream(&mut self, index: u32, st: &mut RoundStats) -> Result<(), Corrupt> {
        let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
        if s.phase == Phase::Connecting {
            if !s.writable && !s.readable {
                return Ok(());
            }
            let Some(fd) = &s.fd else { return Ok(()) };
            match sys::so_error(fd) {
                // No error yet: connected only if the peer name is known (a stale event
                // may arrive while the handshake is still under way).
                0 if sys::peername(fd).is_err() => {
                    s.readable = false;
                    s.writable = false;
                    return Ok(());
                }
                0 => {
                    // The writable edge that completed the connect is consumed here.
                    s.phase = Phase::Connected;
                    s.writable = true;
                    s.readable = true;
                    self.set_flags(index, sock_flag::CONNECTED, sock_flag::CONNECTING);
                }
                e if e == libc::EINPROGRESS || e == libc::EALREADY => return Ok(()),
                e => {
                    s.phase = Phase::Failed;
                    self.set_error(index, e, sock_flag::HUP, sock_flag::CONNECTING);
                    return Ok(());
                }
            }
        }
        let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
        if s.phase == Phase::Failed {
            return self.discard_tx(index);
        }
        if s.phase != Phase::Connected {
            return Ok(());
        }
        // Receive work first, then transmit work (the channel scheduler's classes).
        self.fill_stream_rx(index, st)?;
        self.flush_stream_tx(index, st)?;
        Ok(())
    }

    fn flush_stream_tx(&mut self, index: u32, st: &mut RoundStats) -> Result<(), Corrupt> {
        loop {
            let s = self.sockets[index as usize].as_ref().ok_or(Corrupt)?;
            if s.flags & sock_flag::TX_CLOSED != 0 {
                return self.discard_tx(index);
            }
            if !s.writable {
                return Ok(());
            }
            let queued = self.tx_avail(index)?;
            if queued > 0 && self.gone.is_none() && self.tx_deficit <= 0 {
                self.out_of_budget = true;
                return Ok(());
            }
            let avail = queued.min(self.call_limit(self.tx_deficit));
            let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
            if avail == 0 {
                if s.shut_wr_pending {
                    s.shut_wr_pending = false;
                    if let Some(fd) = &s.fd {
                        let _ = sys::shutdown(fd, libc::SHUT_WR);
                    }
                    self.set_flags(index, sock_flag::TX_CLOSED, 0);
                }
                return Ok(());
            }
            let ring = self.region.ring(s.tx.off, s.tx.size).ok_or(Corrupt)?;
            let Some(fd) = &s.fd else { return Ok(()) };
            match sys::writev_ring(fd, &ring, s.tx.idx, avail) {
                Ok(n) => {
                    st.bytes += n as u64;
                    self.tx_deficit -= n as i64;
                    self.publish_tx_tail(index, n as u64);
                    if (n as u64) < avail {
                        continue; // the next call tells EAGAIN or takes more
                    }
                    // Everything queued went out: look once more for new bytes.
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::EAGAIN) => s.writable = false,
                    Some(libc::EINTR) => {}
                    Some(libc::EPIPE) => {
                        self.set_flags(index, sock_flag::TX_CLOSED, 0);
                    }
                    Some(libc::ECONNRESET) => return self.reset(index, libc::ECONNRESET),
                    _ => return self.reset(index, sys::errno_of(&e)),
                },
            }
        }
    }

    fn fill_stream_rx(&mut self, index: u32, st: &mut RoundStats) -> Result<(), Corrupt> {
        loop {
            let s = self.sockets[index as usize].as_ref().ok_or(Corrupt)?;
            if !s.readable || s.flags & sock_flag::RX_EOF != 0 {
                return Ok(());
            }
            let free = self.want_rx_space(index, 1)?;
            if free == 0 {
                return Ok(());
            }
            if self.gone.is_none() && self.rx_deficit <= 0 {
                self.out_of_budget = true;
                return Ok(());
            }
            let limit = self.call_limit(self.rx_deficit);
            let free = free.min(limit);
            let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
            let ring = self.region.ring(s.rx.off, s.rx.size).ok_or(Corrupt)?;
            let Some(fd) = &s.fd else { return Ok(()) };
            match sys::readv_ring(fd, &ring, s.rx.idx, free) {
                Ok(0) => {
                    s.readable = false;
                    self.set_flags(index, sock_flag::RX_EOF, 0);
                    return Ok(());
                }
                Ok(n) => {
                    // A read cut short by our own limit says nothing about the queue.
                    let drained = (n as u64) < free && free < limit && !s.rdhup;
                    if drained {
                        // epoll(7): a short read on a stream means the queue is empty;
                        // a new edge comes with new data (or the FIN, with RDHUP).
                        s.readable = false;
                    }
                    let head = s.rx.idx.wrapping_add(n as u64);
                    st.bytes += n as u64;
                    self.rx_deficit -= n as i64;
                    self.publish_rx_head(index, head, n as u64);
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::EAGAIN) => {
                        s.readable = false;
                        return Ok(());
                    }
                    Some(libc::EINTR) => {}
                    Some(libc::ECONNRESET) => return self.reset(index, libc::ECONNRESET),
                    _ => return self.reset(index, sys::errno_of(&e)),
                },
            }
        }
    }

    /// Largest byte count for one host call: the `--no-batch` chunk, and no more than
    /// the guest's remaining deficit (at least one byte: the caller checked > 0).
    fn call_limit(&self, deficit: i64) -> u64 {
        let d = if self.gone.is_some() {
            u64::MAX
        } else {
            deficit.max(1) as u64
        };
        self.cfg.chunk.min(d).max(1)
    }

    /// Free rx space, at least `need` bytes, or 0 after setting RX_WANT_SPACE (with the
    /// §6-style re-check, so a guest that freed space meanwhile is not missed).
    fn want_rx_space(&mut self, index: u32, need: u64) -> Result<u64, Corrupt> {
        let free = self.rx_free(index)?;
        let s = self.sockets[index as usize].as_ref().ok_or(Corrupt)?;
        if free >= need {
            if s.flags & sock_flag::RX_WANT_SPACE != 0 {
                self.set_flags(index, 0, sock_flag::RX_WANT_SPACE);
            }
            return Ok(free);
        }
        if s.flags & sock_flag::RX_WANT_SPACE == 0 {
            self.set_flags(index, sock_flag::RX_WANT_SPACE, 0);
        }
        // Dekker with the guest: we store the flag, fence, re-read its tail; the guest
        // stores its tail, fences, reads the flag (then raises attention).
        fence(Ordering::SeqCst);
        let free = self.rx_free(index)?;
        if free >= need {
            self.set_flags(index, 0, sock_flag::RX_WANT_SPACE);
            return Ok(free);
        }
        Ok(0)
    }

    fn service_listener(&mut self, ep: &Epoll, index: u32) -> Result<(), Corrupt> {
        if self.is_shadow() {
            return self.accept_away(index); // the home allocates the entries
        }
        let need = canal_abi::ring::record_size(canal_abi::addr::ADDR_SIZE as u64, 8);
        loop {
            let s = self.sockets[index as usize].as_ref().ok_or(Corrupt)?;
            if !s.readable || s.closing.is_some() {
                return Ok(());
            }
            // Room for the record even if padding is needed first.
            let free = self.want_rx_space(index, 2 * need)?;
            self.drop_claimed(index);
            if free == 0 {
                return Ok(());
            }
            if self.table_full() || self.alloc.free_bytes() < 2 * MIN_RING {
                return Ok(()); // retried when an entry is freed
            }
            let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
            let family = s.family;
            let (conn, peer) = match accept_one(s) {
                Accepted::Conn(c, p) => (c, p),
                Accepted::Again => continue,
                Accepted::Later => return Ok(()),
            };
            let peer = peer.unwrap_or_default();
            let peer = translate_host_addr(&self.view(), &peer);
            let handle = match self.install(ep, conn, Kind::Stream, family, Phase::Connected) {
                Ok(h) => h,
                Err(_) => continue, // the connection is dropped (closed)
            };
            let new_index = canal_abi::handle_index(handle);
            if let Some(Some(ns)) = self.sockets.get_mut(new_index as usize) {
                ns.writable = true;
                ns.readable = true;
            }
            self.mark_dirty(new_index);
            // Owner chosen (and written to the entry) before the handle is published.
            let host_peer = self.sockets[new_index as usize]
                .as_ref()
                .and_then(|s| s.peer());
            if let Some(hp) = host_peer {
                self.place(ep, new_index, Some(&hp));
            }
            if !self.push_accept(index, handle, &peer)? {
                // We checked the space; only a guest moving its tail backwards (caught
                // on the next check) gets here. Drop the connection.
                self.release(ep, new_index, handle);
                return Err(Corrupt);
            }
        }
    }

    fn service_dgram(&mut self, index: u32, st: &mut RoundStats) -> Result<(), Corrupt> {
        if self.sockets[index as usize].as_ref().ok_or(Corrupt)?.phase == Phase::Broken {
            return Ok(());
        }
        self.flush_dgram_tx(index, st)?;
        self.fill_dgram_rx(index, st)
    }

    fn flush_dgram_tx(&mut self, index: u32, st: &mut RoundStats) -> Result<(), Corrupt> {
        let avail = self.tx_avail(index)?;
        if avail == 0 {
            return Ok(());
        }
        let view = self.view();
        let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
        let ring = self.region.ring(s.tx.off, s.tx.size).ok_or(Corrupt)?;
        let e = self.region.socket(index).ok_or(Corrupt)?;
        let mut c = Consumer {
            storage: &ring,
            head_shared: &e.tx_head,
            tail_shared: &e.tx_tail,
            tail: s.tx.idx,
        };
        let mut sent = 0u64;
        let mut err = None;
        let start = c.tail;
        let budget = if self.gone.is_some() {
            i64::MAX
        } else {
            self.tx_deficit
        };
        while let Some(info) = c.next_record().map_err(|_| Corrupt)? {
            if (sent as i64) >= budget {
                self.out_of_budget = true;
                break;
            }
            if info.kind != record_kind::DATAGRAM {
                return Err(Corrupt);
            }
            let dest = match info.addr_len as usize {
                0 => None,
                canal_abi::addr::ADDR_SIZE => {
                    let mut b = [0u8; canal_abi::addr::ADDR_SIZE];
                    c.record_addr(&info, &mut b);
                    match CanalAddr::decode(&b).map(|a| translate_guest_addr(&view, &a)) {
                        Some(Ok(a)) => Some(a),
                        // An address the guest library should have refused: drop it.
                        _ => {
                            c.consume_record(&info);
                            continue;
                        }
                    }
                }
                _ => return Err(Corrupt),
            };
            let Some(fd) = &s.fd else { break };
            let pos = c.record_payload_pos(&info);
            match sys::sendmsg_ring(fd, &ring, pos, info.len as u64, dest.as_ref()) {
                Ok(_) => {
                    sent += info.len as u64;
                    c.consume_record(&info);
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                        s.writable = false;
                        break;
                    }
                    Some(libc::EINTR) => {}
                    // Like a datagram lost on the way; a refused peer is reported.
                    Some(code) => {
                        if code == libc::ECONNREFUSED {
                            err = Some(code);
                        }
                        c.consume_record(&info);
                    }
                    None => c.consume_record(&info),
                },
            }
        }
        let moved = c.tail.wrapping_sub(start);
        s.tx.idx = c.tail;
        s.tx_bytes = s.tx_bytes.wrapping_add(sent);
        st.bytes += sent;
        self.tx_deficit -= sent as i64;
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

    fn fill_dgram_rx(&mut self, index: u32, st: &mut RoundStats) -> Result<(), Corrupt> {
        let view = self.view();
        let mut errors = 0;
        loop {
            if self.gone.is_none() && self.rx_deficit <= 0 {
                let s = self.sockets[index as usize].as_ref().ok_or(Corrupt)?;
                self.out_of_budget = s.readable || s.pending_dgram.is_some();
                return Ok(());
            }
            let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
            if s.pending_dgram.is_none() {
                if !s.readable {
                    return Ok(());
                }
                let Some(fd) = &s.fd else { return Ok(()) };
                match sys::recvfrom(fd, &mut self.scratch) {
                    Ok(Some((n, src))) => {
                        let src = src.map(|a| translate_host_addr(&view, &a));
                        s.pending_dgram = Some((self.scratch[..n].to_vec(), src));
                    }
                    Ok(None) => {
                        s.readable = false;
                        return Ok(());
                    }
                    Err(e) => match e.raw_os_error() {
                        Some(libc::EINTR) => continue,
                        Some(_) if errors >= 8 => return Ok(()),
                        Some(code) => {
                            errors += 1;
                            // ICMP errors (ECONNREFUSED on a connected socket).
                            self.entry(index)
                                .pending_error
                                .store(code as u32, Ordering::Release);
                            self.mark_changed(index);
                            continue;
                        }
                        None => return Ok(()),
                    },
                }
            }
            let s = self.sockets[index as usize].as_ref().ok_or(Corrupt)?;
            let (data, src) = s.pending_dgram.as_ref().ok_or(Corrupt)?;
            let src = *src;
            let addr = src.unwrap_or_default().encode();
            let max = canal_abi::ring::max_record_payload(s.rx.size, addr.len() as u64);
            let len = (data.len() as u64).min(max) as usize;
            let rec = canal_abi::ring::record_size(addr.len() as u64, len as u64);
            let to_end = s.rx.size - (s.rx.idx & (s.rx.size - 1));
            let need = if to_end < rec { to_end + rec } else { rec };
            if self.want_rx_space(index, need)? == 0 {
                return Ok(());
            }
            let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
            let ring = self.region.ring(s.rx.off, s.rx.size).ok_or(Corrupt)?;
            let (data, _) = s.pending_dgram.take().ok_or(Corrupt)?;
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
                    self.rx_deficit -= len as i64;
                    self.publish_rx_head(index, h, len as u64);
                }
                Ok(false) => {
                    // Only a guest moving its tail backwards gets here (caught on the
                    // next check); keep the datagram.
                    s.pending_dgram = Some((data, src));
                    return Ok(());
                }
                Err(_) => return Err(Corrupt),
            }
        }
    }
}

fn fd_of(s: &HostSocket) -> Result<&OwnedFd, i32> {
    s.fd.as_ref().ok_or(match s.phase {
        Phase::Broken => errno::EIO,
        _ => errno::EBADF,
    })
}

/// What one accept on a listener's host socket gave.
enum Accepted {
    Conn(OwnedFd, Option<CanalAddr>),
    /// A connection that died in the queue, or a signal: accept again.
    Again,
    /// Nothing queued (the listener is no longer readable), out of host descriptors
    /// (it stays readable) or no host socket: retried on a later round.
    Later,
}

/// Accepts one connection on listener `s`'s host socket.
fn accept_one(s: &mut HostSocket) -> Accepted {
    let Some(fd) = &s.fd else {
        return Accepted::Later;
    };
    match sys::accept_inet(fd) {
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
