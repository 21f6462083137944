//! The state behind datagrams between canal guests (protocol §8.9): the registry of
//! receivers that all workers share, the deliveries queued for each worker, and each
//! datagram socket's own part (its registration, its inbox, its counts). What goes
//! which way, and canald's work with it, is `dgram_route`.
use canal_abi::CanalAddr;
use std::collections::HashMap;
use std::collections::VecDeque;

/// What a queued datagram costs against its receiver's SO_RCVBUF besides its bytes
/// (about the truesize of a small datagram's buffer in the kernel).
const OVERHEAD: usize = 768;

/// Deliveries a worker takes per round before the guests' next service.
const PER_ROUND: usize = 4096;

/// Deliveries one worker may have queued: beyond, a datagram is dropped as a full
/// receive buffer drops it (senders on other workers outpacing this one's rounds
/// cannot grow canald's memory without bound).
const QUEUE_MAX: usize = 16 * PER_ROUND;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Key {
    family: u16,
    addr: [u8; 16],
    port: u16,
}

impl From<&CanalAddr> for Key {
    fn from(a: &CanalAddr) -> Key {
        Key {
            family: a.family,
            addr: a.addr,
            port: a.port,
        }
    }
}

/// A registered receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reg {
    pub(crate) conn: u32,
    pub(crate) handle: u32,
    /// Its connected peer: only that address's datagrams reach it.
    pub(crate) peer: Option<CanalAddr>,
}

/// One datagram on its way to a receiver's socket.
pub(crate) struct Delivery {
    pub(crate) conn: u32,
    pub(crate) handle: u32,
    pub(crate) from: CanalAddr,
    pub(crate) data: Vec<u8>,
}

/// The registry of receivers and the deliveries waiting for their workers (in the
/// short-circuit state all workers share).
#[derive(Default)]
pub(crate) struct LocalDgrams {
    by_addr: HashMap<Key, Vec<Reg>>,
    /// The receivers' ports in the port directory.
    ports: super::directory::PortCounts,
    /// Deliveries by the worker serving the receiver.
    queues: Vec<Vec<Delivery>>,
}

impl LocalDgrams {
    /// An empty registry that shows its ports in the port directory `file`.
    pub(crate) fn with_directory(
        file: Option<std::sync::Arc<super::directory::DirFile>>,
    ) -> LocalDgrams {
        LocalDgrams {
            ports: super::directory::PortCounts::udp(file),
            ..Default::default()
        }
    }

    pub(crate) fn register(&mut self, at: &CanalAddr, reg: Reg) {
        self.unregister(at, reg.conn, reg.handle);
        self.by_addr.entry(Key::from(at)).or_default().push(reg);
        self.ports.add(at.port);
    }

    pub(crate) fn unregister(&mut self, at: &CanalAddr, conn: u32, handle: u32) {
        let key = Key::from(at);
        if let Some(regs) = self.by_addr.get_mut(&key) {
            let before = regs.len();
            regs.retain(|r| !(r.conn == conn && r.handle == handle));
            for _ in regs.len()..before {
                self.ports.remove(at.port);
            }
            if regs.is_empty() {
                self.by_addr.remove(&key);
            }
        }
    }

    /// Registers socket (`conn`, `handle`) under `at` with its peer, and its part
    /// remembers where.
    pub(crate) fn enroll(&mut self, at: CanalAddr, conn: u32, handle: u32, local: &mut Local) {
        let peer = local.peer;
        self.register(&at, Reg { conn, handle, peer });
        local.key = Some(at);
        local.was_registered = true;
    }

    /// Takes socket (`conn`, `handle`) out of the registry, if its part says it is in.
    pub(crate) fn withdraw(&mut self, conn: u32, handle: u32, local: &mut Local) {
        if let Some(k) = local.key.take() {
            self.unregister(&k, conn, handle);
        }
    }

    /// The receiver a datagram to `dst` reaches, if it is a registered canal socket:
    /// one bound to `dst` itself, else one bound to the wildcard address of `dst`'s
    /// port when `dst` is an address of this host. Two canal sockets on one address
    /// (which the kernel allows only with SO_REUSEADDR, so never registered ones: a
    /// leftover) leave the choice to the kernel.
    /// `is_local`: whether an address is one of this host's.
    pub(crate) fn route(
        &self,
        dst: &CanalAddr,
        is_local: impl FnOnce(&CanalAddr) -> bool,
    ) -> Option<Reg> {
        if dst.addr == [0; 16] {
            return None; // the kernel's "this host": its own rules
        }
        let only = |k: &Key| match self.by_addr.get(k).map(Vec::as_slice) {
            Some([r]) => Some(Some(*r)),
            Some([_, ..]) => Some(None),
            _ => None,
        };
        if let Some(r) = only(&Key::from(dst)) {
            return r;
        }
        let mut wild = Key::from(dst);
        wild.addr = [0; 16];
        match only(&wild) {
            Some(r) if is_local(dst) => r,
            _ => None,
        }
    }

    /// Guest `conn` is gone: none of its sockets stays registered (a port it held may
    /// be a native socket's next).
    pub(crate) fn forget(&mut self, conn: u32) {
        self.by_addr.retain(|_, regs| {
            regs.retain(|r| r.conn != conn);
            !regs.is_empty()
        });
    }

    pub(crate) fn has_work(&self, me: u32) -> bool {
        self.queues.get(me as usize).is_some_and(|q| !q.is_empty())
    }

    /// Queues a delivery for worker `w`; false if its queue is full (dropped).
    pub(crate) fn push(&mut self, w: u32, d: Delivery) -> bool {
        if self.queues.len() <= w as usize {
            self.queues.resize_with(w as usize + 1, Vec::new);
        }
        let q = &mut self.queues[w as usize];
        if q.len() >= QUEUE_MAX {
            return false;
        }
        q.push(d);
        true
    }

    /// Takes up to `PER_ROUND` of the deliveries queued for worker `me`.
    pub(crate) fn take(&mut self, me: u32) -> Vec<Delivery> {
        match self.queues.get_mut(me as usize) {
            Some(q) if !q.is_empty() => {
                let n = q.len().min(PER_ROUND);
                let rest = q.split_off(n);
                std::mem::replace(q, rest)
            }
            _ => Vec::new(),
        }
    }
}

/// A datagram socket's part (in `KindState::Dgram`).
#[derive(Default)]
pub(crate) struct Local {
    /// The address it is registered under (None: not registered).
    key: Option<CanalAddr>,
    /// An option other than SO_SNDBUF / SO_RCVBUF was set on it: the kernel's path
    /// from then on, both ways.
    pub(crate) tainted: bool,
    /// It sent a MSG_MORE part: the host socket may hold a datagram being assembled,
    /// which the kernel completes with the next send, so every later datagram goes
    /// through the kernel too.
    pub(crate) assembles: bool,
    /// Its connected peer's host address.
    pub(crate) peer: Option<CanalAddr>,
    /// Datagrams delivered to it and not yet in its receive ring, with their sources.
    inbox: VecDeque<(Vec<u8>, CanalAddr)>,
    inbox_bytes: usize,
    /// The host socket's SO_RCVBUF, which bounds `inbox` as it bounds the kernel's
    /// queue.
    pub(crate) rcvbuf: usize,
    /// The host socket's datagram goes next (the two sources take turns).
    host_next: bool,
    /// Datagrams taken into the inbox, and those dropped for a full one (the
    /// kernel's receive-buffer errors).
    received: u64,
    dropped: u64,
    /// It was registered once (`canal stat` shows its counts).
    was_registered: bool,
}

impl Local {
    /// The address it is registered under, if it is.
    pub(crate) fn registered_at(&self) -> Option<CanalAddr> {
        self.key
    }

    /// Its (received, dropped) counts if it was ever registered (`canal stat`).
    pub(crate) fn counts(&self) -> Option<(u64, u64)> {
        self.was_registered.then_some((self.received, self.dropped))
    }

    /// Whether delivered datagrams wait for room in its receive ring.
    pub(crate) fn waiting(&self) -> bool {
        !self.inbox.is_empty()
    }

    /// Takes a delivered datagram into the inbox, or drops it as the kernel drops one
    /// (a connected socket's stranger, a full receive buffer). True if taken.
    pub(crate) fn accept(&mut self, d: Delivery) -> bool {
        if self.peer.is_some_and(|p| p != d.from) {
            return false;
        }
        let cost = d.data.len() + OVERHEAD;
        if self.inbox_bytes + cost > self.rcvbuf.max(OVERHEAD) && !self.inbox.is_empty() {
            self.dropped += 1;
            return false;
        }
        self.inbox_bytes += cost;
        self.received += 1;
        self.inbox.push_back((d.data, d.from));
        true
    }

    /// The receive pump's next delivered datagram, when it is the inbox's turn: the
    /// host socket, if `readable`, takes every other one.
    pub(crate) fn next(&mut self, readable: bool) -> Option<(Vec<u8>, CanalAddr)> {
        if self.inbox.is_empty() || (self.host_next && readable) {
            self.host_next = false;
            return None;
        }
        let (data, from) = self.inbox.pop_front()?;
        self.inbox_bytes = self.inbox_bytes.saturating_sub(data.len() + OVERHEAD);
        self.host_next = true;
        Some((data, from))
    }
}

/// The source address of a datagram from a socket bound to `local` to `dst`: the
/// bound address, or for a wildcard-bound socket the one the kernel's local route
/// picks — 127.0.0.1 for all of 127/8, else the destination itself (::1, the host's
/// own addresses).
pub(crate) fn source_for(local: &CanalAddr, dst: &CanalAddr) -> CanalAddr {
    if local.addr != [0; 16] {
        return *local;
    }
    let mut a = *dst;
    if a.family == libc::AF_INET as u16 && a.addr[0] == 127 {
        a.addr[..4].copy_from_slice(&[127, 0, 0, 1]);
    }
    a.port = local.port;
    a.flowinfo = 0;
    a
}

/// Whether a socket option leaves a datagram socket on the local path.
pub(crate) fn keeps_local(level: i32, name: i32) -> bool {
    level == libc::SOL_SOCKET
        && matches!(
            name,
            libc::SO_SNDBUF | libc::SO_RCVBUF | libc::SO_SNDBUFFORCE | libc::SO_RCVBUFFORCE
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(ip: [u8; 4], port: u16) -> CanalAddr {
        CanalAddr::v4(ip, port)
    }

    impl LocalDgrams {
        /// `route` on a host whose own addresses are loopback and 192.0.2.2.
        fn route_here(&self, dst: &CanalAddr) -> Option<Reg> {
            self.route(dst, |a| a.addr[0] == 127 || a.addr[..4] == [192, 0, 2, 2])
        }
    }

    fn reg(handle: u32) -> Reg {
        Reg {
            conn: 1,
            handle,
            peer: None,
        }
    }

    #[test]
    fn an_exact_binding_beats_a_wildcard_one_and_two_leave_it_to_the_kernel() {
        let mut l = LocalDgrams::default();
        l.register(&v4([0, 0, 0, 0], 5000), reg(1));
        assert_eq!(l.route_here(&v4([127, 0, 0, 1], 5000)), Some(reg(1)));
        assert_eq!(l.route_here(&v4([127, 0, 0, 9], 5000)), Some(reg(1)));
        assert_eq!(l.route_here(&v4([127, 0, 0, 1], 5001)), None);
        assert_eq!(
            l.route_here(&v4([0, 0, 0, 0], 5000)),
            None,
            "unspecified: kernel"
        );
        assert_eq!(
            l.route_here(&v4([198, 51, 100, 1], 5000)),
            None,
            "not this host"
        );
        l.register(&v4([127, 0, 0, 1], 5000), reg(2));
        assert_eq!(l.route_here(&v4([127, 0, 0, 1], 5000)), Some(reg(2)));
        assert_eq!(l.route_here(&v4([127, 0, 0, 2], 5000)), Some(reg(1)));
        l.register(&v4([127, 0, 0, 1], 5000), reg(3));
        assert_eq!(l.route_here(&v4([127, 0, 0, 1], 5000)), None, "ambiguous");
        l.unregister(&v4([127, 0, 0, 1], 5000), 1, 3);
        l.unregister(&v4([127, 0, 0, 1], 5000), 1, 2);
        assert_eq!(l.route_here(&v4([127, 0, 0, 1], 5000)), Some(reg(1)));
        l.forget(1);
        assert_eq!(
            l.route_here(&v4([127, 0, 0, 1], 5000)),
            None,
            "its guest left"
        );
        let mut v6 = CanalAddr::v6([0; 16], 5000, 0, 0);
        v6.addr[15] = 1;
        assert_eq!(l.route_here(&v6), None, "families do not mix");
    }

    #[test]
    fn a_worker_queue_is_bounded_and_taken_a_round_at_a_time() {
        let mut l = LocalDgrams::default();
        let d = || Delivery {
            conn: 1,
            handle: 1,
            from: v4([127, 0, 0, 1], 1),
            data: vec![7],
        };
        for _ in 0..QUEUE_MAX {
            assert!(l.push(1, d()));
        }
        assert!(!l.push(1, d()), "full: dropped");
        assert!(!l.has_work(0) && l.has_work(1));
        assert_eq!(l.take(1).len(), PER_ROUND);
        assert!(l.push(1, d()), "room again");
        let mut left = QUEUE_MAX + 1 - PER_ROUND;
        while l.has_work(1) {
            left -= l.take(1).len();
        }
        assert_eq!(left, 0);
    }

    #[test]
    fn a_receiver_takes_its_peer_only_and_drops_past_its_buffer() {
        let mut r = Local {
            rcvbuf: 4 * (1000 + OVERHEAD),
            peer: Some(v4([127, 0, 0, 1], 9)),
            ..Local::default()
        };
        let from = |port| Delivery {
            conn: 1,
            handle: 1,
            from: v4([127, 0, 0, 1], port),
            data: vec![1; 1000],
        };
        assert!(!r.accept(from(8)), "a stranger to a connected socket");
        for _ in 0..4 {
            assert!(r.accept(from(9)));
        }
        assert!(!r.accept(from(9)), "past SO_RCVBUF");
        assert_eq!(r.counts(), None, "never registered");
        r.was_registered = true;
        assert_eq!(r.counts(), Some((4, 1)));
        // The inbox and a readable host socket take turns.
        assert!(r.next(true).is_some());
        assert!(r.next(true).is_none(), "the host socket's turn");
        assert!(r.next(false).is_some(), "nothing there: the inbox again");
        assert!(r.accept(from(9)), "room again");
    }

    #[test]
    fn a_wildcard_sender_speaks_from_the_address_the_kernel_picks() {
        let any = v4([0, 0, 0, 0], 4000);
        assert_eq!(
            source_for(&any, &v4([127, 0, 0, 5], 9)),
            v4([127, 0, 0, 1], 4000)
        );
        assert_eq!(
            source_for(&any, &v4([192, 0, 2, 2], 9)),
            v4([192, 0, 2, 2], 4000)
        );
        let bound = v4([127, 0, 0, 9], 4000);
        assert_eq!(source_for(&bound, &v4([127, 0, 0, 1], 9)), bound);
        let mut one = [0u8; 16];
        one[15] = 1;
        let any6 = CanalAddr::v6([0; 16], 4000, 0, 0);
        assert_eq!(
            source_for(&any6, &CanalAddr::v6(one, 9, 7, 0)),
            CanalAddr::v6(one, 4000, 0, 0)
        );
    }
}
