//! What the workers share: the short-circuit registry (`Shared`: canal listeners,
//! pending pairs, segments, per-worker job queues) and the vRSS mailboxes (`Mailbox`,
//! `Msg`) through which workers hand each other sockets and accepted connections.
//! The two refer to each other (a vRSS message carries a pending short-circuit; the
//! registry pokes workers' mailboxes), so they live in one file.

use crate::guest::arena::ArenaMem;
use crate::guest::arena::Arenas;
use crate::guest::config::GuestConfig;
use crate::guest::socket::HostSocket;
use crate::guest::socket::SegLink;
use crate::guest::wake::Ports;
use crate::request::Request;
use crate::sys;
use canal_abi::segment;
use canal_abi::segment::side;
use canal_abi::segment::ArenaLayout;
use canal_abi::CanalAddr;
use canal_abi::Region;
use std::collections::HashMap;
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::sync::Mutex;

#[derive(Clone, Copy, Debug)]
pub(crate) struct ListenerReg {
    pub(crate) conn: u32,
    pub(crate) handle: u32,
    pub(crate) addr: CanalAddr,
    pub(crate) backlog: u32,
    /// An AF_INET6 listener that takes IPv4 connections too (IPV6_V6ONLY off: the host
    /// socket's, or in a network's view the guest's, which canald keeps).
    pub(crate) dual_stack: bool,
    /// Unaccepted connections its guest holds, as canald last counted them, and fast
    /// connect tickets outstanding against its backlog (`fast`).
    pub(crate) queued: u32,
    pub(crate) fast_out: u32,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Pending {
    pub(crate) conn: u32,
    pub(crate) handle: u32,
    pub(crate) dst: CanalAddr,
    /// The connector's reserved local address, whether its guest has zones, and the
    /// arena layout it understands best (None: no arenas).
    pub(crate) local: CanalAddr,
    pub(crate) zones: bool,
    pub(crate) arenas: Option<ArenaLayout>,
    pub(crate) lconn: u32,
    pub(crate) lhandle: u32,
    /// A fast connect (protocol §8.10): its ticket's segment id (0: a CONNECT), and
    /// whether its place in the listener's queue was settled already (a retry).
    pub(crate) fast: u32,
    pub(crate) settled: bool,
    /// How the connector's guest named the destination, if a connect by ticket there
    /// would give the names this pairing gives (`fast::seen`); None: not listed.
    pub(crate) seen: Option<crate::guest::fast_book::Seen>,
}

/// Work for the worker serving one guest's short-circuited sockets.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Job {
    /// Listener's home: create the segment and install the accepted end.
    Pair(Pending),
    /// Connector's home: the accepted end exists; complete the connect.
    Connected {
        conn: u32,
        handle: u32,
        link: SegLink,
    },
    /// Connector's home: no short-circuit after all (the listener went away).
    Fallback {
        conn: u32,
        handle: u32,
        dst: CanalAddr,
    },
    Event(Event),
}

impl Job {
    /// The guest this job is for (its home worker runs it).
    pub(crate) fn conn(&self) -> u32 {
        match *self {
            Job::Pair(p) => p.lconn,
            Job::Connected { conn, .. } | Job::Fallback { conn, .. } => conn,
            Job::Event(Event::Wake { conn, .. })
            | Job::Event(Event::Fin { conn, .. })
            | Job::Event(Event::Closed { conn, .. }) => conn,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    /// The peer may sleep on the connection: wake its event sleepers.
    Wake { conn: u32, handle: u32 },
    /// The peer sent FIN (SHUT_WR).
    Fin { conn: u32, handle: u32 },
    /// One end closed (or its guest died): tell the other end, release the segment
    /// once both are gone.
    Closed {
        id: u32,
        side: u32,
        conn: u32,
        handle: u32,
        reset: bool,
    },
}

/// Where a pair segment's memory is.
pub(crate) enum SegMem {
    /// A memfd of its own and canald's mapping (segments with zones, and guests
    /// without feature::ARENAS).
    File { fd: OwnedFd, map: sys::Mapping },
    /// Slot `slot` of a pair arena, its header `base` bytes into it (protocol §8.7).
    Arena {
        mem: Arc<ArenaMem>,
        slot: u32,
        base: u64,
    },
}

pub(crate) struct SegmentRec {
    pub(crate) mem: SegMem,
    pub(crate) conns: [u32; 2],
    pub(crate) open: [bool; 2],
    pub(crate) ring_size: u64,
    /// Bytes of each direction's zone (0: a segment without zones).
    pub(crate) zone_size: u64,
}

impl SegmentRec {
    /// canald's mapping that holds the segment, and the segment's offset in it.
    fn mapping(&self) -> (&sys::Mapping, usize) {
        match &self.mem {
            SegMem::File { map, .. } => (map, 0),
            SegMem::Arena { mem, base, .. } => (&mem.map, *base as usize),
        }
    }

    /// The u64 at `off` of the segment, through canald's mapping (no system call;
    /// guest-written: untrusted).
    pub(crate) fn read_u64(&self, off: u64) -> Option<u64> {
        let (map, base) = self.mapping();
        map.load_u64(base.checked_add(usize::try_from(off).ok()?)?)
    }

    /// Bumps the u32 at `off` and wakes its futex waiters (a side's `wake_seq`).
    pub(crate) fn futex_bump_wake(&self, off: u64) {
        let (map, base) = self.mapping();
        map.futex_bump_wake(base + off as usize);
    }

    /// The arena id and offset a socket entry names (0, 0: a file of its own).
    pub(crate) fn place(&self) -> (u32, u64) {
        match &self.mem {
            SegMem::File { .. } => (0, 0),
            SegMem::Arena { mem, base, .. } => (mem.id, *base),
        }
    }

    /// Where ring 0 starts, counted from the segment's header (ring 1 follows it).
    pub(crate) fn rings_from_header(&self) -> u64 {
        match &self.mem {
            SegMem::File { .. } => segment::ring_offset(0, self.ring_size),
            SegMem::Arena { mem, slot, base } => {
                mem.layout.rings_offset(*slot, self.ring_size) - base
            }
        }
    }
}

/// State shared by the daemon and every guest that may short-circuit.
pub(crate) struct Shared {
    pub(crate) enabled: bool,
    /// `--zones on`: segments between two guests that announced zones carry them.
    pub(crate) zones: bool,
    pub(crate) ring_size: u64,
    /// Canal listeners; change them with `listen` and `unlisten`, which keep the
    /// port directory true.
    pub(crate) listeners: Vec<ListenerReg>,
    /// The port directory's file (None: the kernel refused it; no DIRECT guests).
    pub(crate) directory: Option<Arc<super::directory::DirFile>>,
    /// The listeners' ports in the directory.
    pub(crate) tcp_ports: super::directory::PortCounts,
    /// Jobs by worker, each queue in the order they were posted.
    pub(crate) jobs: Vec<Vec<Job>>,
    /// The home worker of every guest that may short-circuit (by connection key).
    pub(crate) homes: HashMap<u32, u32>,
    /// Every worker's mailbox, to poke a worker that has jobs (several workers).
    pub(crate) boxes: Option<Boxes>,
    pub(crate) segments: HashMap<u32, SegmentRec>,
    /// `--arenas on`: segments between two guests that announced ARENAS are slots of
    /// their pair arenas (protocol §8.7).
    pub(crate) use_arenas: bool,
    pub(crate) arenas: Arenas,
    /// Direct peer wake-ups (protocol §8.8).
    pub(crate) bells: super::bells::Bells,
    pub(crate) next_id: u32,
    /// Fast connects' tables and tickets (protocol §8.10).
    pub(crate) fast: super::fast_book::FastBooks,
    /// Datagram receivers and deliveries between canal guests (`dgram_local`).
    pub(crate) locals: crate::guest::dgram_local::LocalDgrams,
    /// This host's addresses, for routing each of those datagrams.
    pub(crate) host_addrs: HostAddrs,
}

pub(crate) type SharedRef = Arc<Mutex<Shared>>;

impl Shared {
    /// Listener (`conn`, `handle`)'s registration, if it is registered.
    pub(crate) fn listener(&self, conn: u32, handle: u32) -> Option<&ListenerReg> {
        self.listeners
            .iter()
            .find(|l| l.conn == conn && l.handle == handle)
    }

    pub(crate) fn listener_mut(&mut self, conn: u32, handle: u32) -> Option<&mut ListenerReg> {
        self.listeners
            .iter_mut()
            .find(|l| l.conn == conn && l.handle == handle)
    }

    /// Registers a canal listener (replacing the same socket's earlier registration,
    /// whose queue and tickets it keeps: a second listen() changes only the backlog).
    pub(crate) fn listen(&mut self, mut reg: ListenerReg) {
        if let Some(old) = self.listener(reg.conn, reg.handle) {
            (reg.queued, reg.fast_out) = (old.queued, old.fast_out);
        }
        self.drop_listener(reg.conn, reg.handle);
        self.tcp_ports.add(reg.addr.port);
        self.listeners.push(reg);
    }

    /// Withdraws listener (`conn`, `handle`), if registered, and every fast connect
    /// record naming it.
    pub(crate) fn unlisten(&mut self, conn: u32, handle: u32) {
        self.fast_withdraw_listener(conn, handle);
        self.drop_listener(conn, handle);
    }

    fn drop_listener(&mut self, conn: u32, handle: u32) {
        let ports = &mut self.tcp_ports;
        self.listeners.retain(|l| {
            let gone = l.conn == conn && l.handle == handle;
            if gone {
                ports.remove(l.addr.port);
            }
            !gone
        });
    }

    pub(crate) fn new(enabled: bool, ring_size: u64) -> SharedRef {
        let directory = super::directory::DirFile::create();
        Arc::new(Mutex::new(Shared {
            enabled,
            zones: false,
            ring_size,
            listeners: Vec::new(),
            tcp_ports: super::directory::PortCounts::tcp(directory.clone()),
            locals: crate::guest::dgram_local::LocalDgrams::with_directory(directory.clone()),
            directory,
            jobs: Vec::new(),
            homes: HashMap::new(),
            boxes: None,
            segments: HashMap::new(),
            use_arenas: true,
            arenas: Arenas::default(),
            bells: Default::default(),
            fast: Default::default(),
            next_id: 1,
            host_addrs: Default::default(),
        }))
    }

    /// The memfd of segment `id` (one of its own) if guest `conn` is one of its two
    /// ends.
    pub(crate) fn segment_fd(&self, id: u32, conn: u32) -> Option<(&OwnedFd, u64)> {
        let s = self.segments.get(&id)?;
        match &s.mem {
            SegMem::File { fd, .. } if s.conns.contains(&conn) => {
                Some((fd, segment::segment_size_zones(s.ring_size, s.zone_size)))
            }
            _ => None,
        }
    }

    /// Segment `id` is gone from both guests (or was never handed out): its record
    /// goes, and an arena slot is free again.
    pub(crate) fn drop_segment(&mut self, id: u32) {
        if let Some(r) = self.segments.remove(&id) {
            if let SegMem::Arena { mem, slot, .. } = r.mem {
                let homes = &self.homes;
                self.arenas
                    .give_back(mem.id, slot, |c| homes.contains_key(&c));
            }
        }
    }

    /// Lets jobs for other workers poke them (the daemon, once every worker exists).
    pub(crate) fn set_boxes(&mut self, boxes: Boxes) {
        self.boxes = Some(boxes);
    }

    pub(crate) fn home(&self, conn: u32) -> u32 {
        self.homes.get(&conn).copied().unwrap_or(0)
    }

    /// Queues `job` for worker `w` (a listener's owner, not its guest's home).
    pub(crate) fn post_to(&mut self, from: u32, w: u32, job: Job) {
        if self.jobs.len() <= w as usize {
            self.jobs.resize_with(w as usize + 1, Vec::new);
        }
        self.jobs[w as usize].push(job);
        if w != from {
            self.poke(w);
        }
    }

    /// Wakes worker `w` to look at what was queued for it.
    pub(crate) fn poke(&self, w: u32) {
        if let Some(mb) = self.boxes.as_ref().and_then(|b| b.get(w as usize)) {
            let _ = sys::eventfd_write(mb.poke.as_raw_fd());
        }
    }

    /// Queues `job` for its guest's home worker; `from` (the posting worker) is not
    /// poked, any other is.
    pub(crate) fn post(&mut self, from: u32, job: Job) {
        let w = self.home(job.conn());
        self.post_to(from, w, job);
    }

    /// Queues a job posted by guest `from_conn` (running on its home).
    pub(crate) fn post_from(&mut self, from_conn: u32, job: Job) {
        let from = self.home(from_conn);
        self.post(from, job);
    }

    pub(crate) fn has_work(&self, me: u32) -> bool {
        self.jobs.get(me as usize).is_some_and(|q| !q.is_empty()) || self.locals.has_work(me)
    }

    /// The listener a connect from `src` to `dst` reaches, if it is a canal listener.
    /// The kernel's order: a listener bound to `dst`'s address beats a wildcard one,
    /// and for an IPv4 destination an AF_INET listener beats a dual-stack AF_INET6 one
    /// (bound to the IPv4-mapped address, or to `::`); among equals — an SO_REUSEPORT
    /// group — the connection's addresses pick one, as the kernel's reuseport hash
    /// spreads connections over the group.
    pub(crate) fn find_listener(&self, dst: &CanalAddr, src: &CanalAddr) -> Option<ListenerReg> {
        let on_port = |l: &&ListenerReg| l.addr.port == dst.port;
        let own = |l: &&ListenerReg| l.addr.family == dst.family;
        let dual = |l: &&ListenerReg| dst.family == libc::AF_INET as u16 && l.dual_stack;
        let mapped = v4_mapped(dst);
        let local = is_local(dst);
        let tiers: [&dyn Fn(&&ListenerReg) -> bool; 4] = [
            &|l| own(l) && l.addr.addr == dst.addr,
            &|l| dual(l) && l.addr.addr == mapped.addr,
            &|l| local && own(l) && is_unspecified(&l.addr),
            &|l| local && dual(l) && is_unspecified(&l.addr),
        ];
        tiers.iter().find_map(|tier| {
            let group: Vec<ListenerReg> = self
                .listeners
                .iter()
                .filter(on_port)
                .filter(|l| tier(l))
                .copied()
                .collect();
            (!group.is_empty()).then(|| group[reuseport_pick(src, dst, group.len())])
        })
    }
}

/// Index in `0..n` from the connection's 4-tuple (FNV-1a; any fixed spread will do).
pub(crate) fn reuseport_pick(src: &CanalAddr, dst: &CanalAddr, n: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let (sp, dp) = (src.port.to_be_bytes(), dst.port.to_be_bytes());
    for b in src.addr.iter().chain(&sp).chain(&dst.addr).chain(&dp) {
        h = (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    (h % n.max(1) as u64) as usize
}

pub(crate) fn lock(s: &SharedRef) -> std::sync::MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// An IPv4 address as a dual-stack AF_INET6 socket names it (`::ffff:a.b.c.d`); any
/// other address as it is.
pub(crate) fn v4_mapped(a: &CanalAddr) -> CanalAddr {
    if a.family != libc::AF_INET as u16 {
        return *a;
    }
    let ip = std::net::Ipv4Addr::from(a.ip4()).to_ipv6_mapped();
    CanalAddr::v6(ip.octets(), a.port, 0, 0)
}

pub(crate) fn is_unspecified(a: &CanalAddr) -> bool {
    a.addr == [0; 16]
}

/// Addresses that reach this host: loopback (127/8, ::1), the unspecified address
/// (connect to 0.0.0.0 means the local host on Linux) and the host's own addresses.
pub(crate) fn is_local(a: &CanalAddr) -> bool {
    is_loopback_or_any(a) || is_among(a, &sys::local_addrs())
}

/// The addresses `is_local` knows without asking the kernel.
fn is_loopback_or_any(a: &CanalAddr) -> bool {
    let v4 = a.family == libc::AF_INET as u16;
    is_unspecified(a)
        || (v4 && a.addr[0] == 127)
        || (!v4 && a.addr[..15] == [0; 15] && a.addr[15] == 1)
}

fn is_among(a: &CanalAddr, addrs: &[CanalAddr]) -> bool {
    addrs
        .iter()
        .any(|x| x.family == a.family && x.addr == a.addr)
}

/// `is_local` for a data path: the host's addresses read at most once a second
/// (`getifaddrs` is a netlink dump, too dear per datagram).
#[derive(Default)]
pub(crate) struct HostAddrs {
    read: Option<std::time::Instant>,
    addrs: Vec<CanalAddr>,
}

impl HostAddrs {
    pub(crate) fn is_local(&mut self, a: &CanalAddr) -> bool {
        if is_loopback_or_any(a) {
            return true;
        }
        let now = std::time::Instant::now();
        if self
            .read
            .is_none_or(|t| now.saturating_duration_since(t) >= std::time::Duration::from_secs(1))
        {
            self.addrs = sys::local_addrs();
            self.read = Some(now);
        }
        is_among(a, &self.addrs)
    }
}

/// A pairing whose listener is served by another worker than its guest's home
/// (protocol §8.5): the listener's owner checked the backlog and reserved the record,
/// the home installs the accepted end, the owner publishes it and completes the pair.
pub(crate) struct ScAccept {
    pub(crate) shared: SharedRef,
    pub(crate) p: Pending,
    pub(crate) id: u32,
    /// The connector's destination (loopback for an unspecified one).
    pub(crate) dst: CanalAddr,
    /// The accepted end's link.
    pub(crate) link: SegLink,
}

impl ScAccept {
    pub(crate) fn link(&self) -> SegLink {
        self.link
    }

    /// The accepted end `ah` is in the listener's ring: the connector's home completes
    /// the connect. `me`: the worker posting.
    pub(crate) fn published(&self, me: u32, ah: u32) {
        let link = SegLink {
            id: self.id,
            side: side::CONNECTOR,
            peer_conn: self.p.lconn,
            peer_handle: ah,
            local: self.p.local,
            peer: self.dst,
            shut_wr: false,
        };
        lock(&self.shared).post(
            me,
            Job::Connected {
                conn: self.p.conn,
                handle: self.p.handle,
                link,
            },
        );
    }

    /// No accepted end after all (the listener or its guest went away): the segment
    /// goes, the connector connects for real.
    pub(crate) fn failed(&self, me: u32) {
        let mut sh = lock(&self.shared);
        sh.drop_segment(self.id);
        sh.post(
            me,
            Job::Fallback {
                conn: self.p.conn,
                handle: self.p.handle,
                dst: self.p.dst,
            },
        );
    }
}

// tcpi_state values (include/net/tcp_states.h).
pub(crate) const TCP_ESTABLISHED: u8 = 1;

pub(crate) const TCP_FIN_WAIT2: u8 = 5;

pub(crate) const TCP_CLOSE: u8 = 7;

pub(crate) const TCP_CLOSE_WAIT: u8 = 8;

pub(crate) fn loopback(family: u16) -> CanalAddr {
    let mut a = CanalAddr {
        family,
        ..Default::default()
    };
    if family == libc::AF_INET as u16 {
        a.addr[..4].copy_from_slice(&[127, 0, 0, 1]);
    } else {
        a.addr[15] = 1;
    }
    a
}

/// The buffer classes of each direction's zone for rings of `ring_size` bytes: one
/// class of 64 KiB buffers holding twice the ring (at least 4, at most 1024 buffers).
pub(crate) fn zone_classes(ring_size: u64) -> [(u32, u32); 1] {
    let count = (2 * ring_size / 65536).clamp(4, 1024) as u32;
    [(65536, count)]
}

/// A fixed-key hash of a flow (host view): the same flow always maps to the same
/// value, in every canald. 64-bit multiply-xorshift mixing over the address family,
/// both addresses and both ports.
pub(crate) fn flow_hash(local: &CanalAddr, peer: &CanalAddr) -> u32 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    fn mix(h: u64, v: u64) -> u64 {
        let x = (h ^ v).wrapping_mul(K);
        x ^ (x >> 29)
    }
    let mut h = mix(0x6361_6e61_6c72_7373, local.family as u64);
    for a in [local, peer] {
        h = mix(
            h,
            u64::from_le_bytes(a.addr[..8].try_into().unwrap_or([0; 8])),
        );
        h = mix(
            h,
            u64::from_le_bytes(a.addr[8..].try_into().unwrap_or([0; 8])),
        );
        h = mix(h, a.port as u64);
    }
    let h = h.wrapping_mul(K);
    (h ^ (h >> 32)) as u32
}

/// The worker owning a flow among `workers` (≥ 1).
pub fn owner_of(local: &CanalAddr, peer: &CanalAddr, workers: u32) -> u32 {
    flow_hash(local, peer) % workers.max(1)
}

/// The worker owning an unconnected socket bound to `local` (its address and port;
/// the peer half of the flow hash is the unspecified address of its family).
pub fn local_owner(local: &CanalAddr, workers: u32) -> u32 {
    let none = CanalAddr {
        family: local.family,
        ..Default::default()
    };
    owner_of(local, &none, workers)
}

/// What one worker tells another about a guest's sockets.
pub(crate) enum Msg {
    /// Take over a socket (home → owner): create the guest's shadow if needed.
    Adopt {
        seed: Box<Seed>,
        sock: Box<HostSocket>,
    },
    /// Execute a request on a socket this worker owns and complete slot `slot`.
    Request {
        conn: u32,
        slot: u32,
        req: Box<Request>,
    },
    /// The guest's last descriptor of (index, gen) is gone (WATCH): close it.
    Close { conn: u32, index: u32, gen: u16 },
    /// The owner freed a socket (owner → home): the entry index may be reused with
    /// `next_gen`; the rings go back to the allocator.
    Freed {
        conn: u32,
        index: u32,
        next_gen: u16,
        rings: [(u64, u64); 2],
    },
    /// The owner of listener `listener` accepted a connection (owner `from` → home):
    /// install its entry (only the home allocates) and answer `AcceptDone`.
    Accepted {
        conn: u32,
        from: u32,
        listener: u32,
        acc: Box<Accept>,
    },
    /// The entry of an accepted connection (home → listener's owner; `handle` 0:
    /// none, the connection is dropped): the owner writes the ACCEPT record.
    AcceptDone {
        conn: u32,
        listener: u32,
        handle: u32,
        peer: CanalAddr,
        sc: Option<Box<ScAccept>>,
    },
    /// An accepted socket no listener will hand out (owner → home): release it.
    Release { conn: u32, index: u32, handle: u32 },
}

/// A connection accepted by an away listener's owner, on its way to the home.
pub(crate) struct Accept {
    pub(crate) family: u16,
    /// What the accepted socket inherits from the listener (IPV6_V6ONLY in a
    /// network's view, SO_LINGER).
    pub(crate) inherited: crate::guest::socket::Inherited,
    /// The peer as the guest sees it (the ACCEPT record's address).
    pub(crate) peer: CanalAddr,
    pub(crate) fd: OwnedFd,
    /// A kernel connection: its host peer (for the flow hash). A short-circuit: the
    /// pairing (the fd is then a plain socket for the accepted end's options).
    pub(crate) host_peer: Option<CanalAddr>,
    pub(crate) sc: Option<Box<ScAccept>>,
}

/// Accepts an away listener's owner may have in flight (it reserves room for their
/// records in the listener's ring).
pub(crate) const ACCEPT_INFLIGHT: u32 = 16;

/// A worker's inbox; `send` pokes the worker out of its sleep.
pub(crate) struct Mailbox {
    pub(crate) q: Mutex<Vec<Msg>>,
    pub(crate) poke: OwnedFd,
}

impl Mailbox {
    pub(crate) fn new(poke: OwnedFd) -> Mailbox {
        Mailbox {
            q: Mutex::new(Vec::new()),
            poke,
        }
    }
    pub(crate) fn send(&self, m: Msg) {
        self.q.lock().unwrap_or_else(|e| e.into_inner()).push(m);
        let _ = sys::eventfd_write(self.poke.as_raw_fd());
    }
    pub(crate) fn take(&self) -> Vec<Msg> {
        std::mem::take(&mut *self.q.lock().unwrap_or_else(|e| e.into_inner()))
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.q.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }
}

/// Every worker's mailbox, by worker id.
pub(crate) type Boxes = Arc<[Arc<Mailbox>]>;

/// What a worker needs to serve a guest's sockets without its home.
pub(crate) struct Seed {
    pub(crate) id: u32,
    pub(crate) conn: u32,
    pub(crate) pid: u32,
    pub(crate) comm: String,
    pub(crate) cfg: GuestConfig,
    pub(crate) map: Arc<sys::Mapping>,
    pub(crate) region: Region,
    pub(crate) ports: Ports,
    pub(crate) home: u32,
    pub(crate) boxes: Boxes,
    pub(crate) departed: Arc<AtomicBool>,
    pub(crate) sc: Option<SharedRef>,
    pub(crate) evlog: Option<Arc<sys::EvLogFile>>,
}

/// Per-instance virtual RSS state.
pub(crate) struct State {
    /// The worker this instance runs on, and the guest's home worker.
    pub(crate) me: u32,
    pub(crate) home: u32,
    pub(crate) boxes: Boxes,
    /// Home only: entry index → (owner worker, handle) of sockets served elsewhere.
    pub(crate) away: std::collections::HashMap<u32, (u32, u32)>,
    /// Set by the home when the guest's control connection closed.
    pub(crate) departed: Arc<AtomicBool>,
    /// Home only: sockets handed over so far.
    pub(crate) moved: u64,
    /// Home only: connections accepted by away listeners that wait for a free entry
    /// (owner worker, listener handle, connection).
    pub(crate) waiting: VecDeque<(u32, u32, Box<Accept>)>,
}

impl State {
    pub(crate) fn is_shadow(&self) -> bool {
        self.me != self.home
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(handle: u32, addr: CanalAddr, dual_stack: bool) -> ListenerReg {
        ListenerReg {
            conn: 1,
            handle,
            addr,
            backlog: 5,
            dual_stack,
            queued: 0,
            fast_out: 0,
        }
    }

    #[test]
    fn ipv4_connects_find_listeners_in_the_kernels_order() {
        let sh = Shared::new(true, 65536);
        let mut sh = lock(&sh);
        let dst = CanalAddr::v4([127, 0, 0, 1], 80);
        let src = CanalAddr::v4([127, 0, 0, 1], 40000);
        let any6 = CanalAddr::v6([0; 16], 80, 0, 0);
        let find = |sh: &Shared| sh.find_listener(&dst, &src).map(|l| l.handle);
        // An IPv6-only listener takes no IPv4 connection.
        sh.listeners.push(reg(1, any6, false));
        assert_eq!(find(&sh), None);
        // A dual-stack `[::]` one does.
        sh.listeners.push(reg(2, any6, true));
        assert_eq!(find(&sh), Some(2));
        // An AF_INET wildcard beats it.
        sh.listeners.push(reg(3, CanalAddr::v4([0; 4], 80), false));
        assert_eq!(find(&sh), Some(3));
        // A dual-stack one bound to the IPv4-mapped address beats both wildcards.
        sh.listeners.push(reg(4, v4_mapped(&dst), true));
        assert_eq!(find(&sh), Some(4));
        // An AF_INET one bound to the address beats everything.
        sh.listeners.push(reg(5, dst, false));
        assert_eq!(find(&sh), Some(5));
        // Another port is nobody's; an IPv6 destination never reaches AF_INET ones.
        let other = CanalAddr::v4([127, 0, 0, 1], 81);
        assert!(sh.find_listener(&other, &src).is_none());
        let lo6 = loopback(libc::AF_INET6 as u16);
        let dst6 = CanalAddr { port: 80, ..lo6 };
        let h6 = sh.find_listener(&dst6, &dst6).map(|l| l.handle);
        assert!(matches!(h6, Some(1 | 2)), "{h6:?}");
    }
}
