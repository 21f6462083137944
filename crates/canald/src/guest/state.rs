//! The `Guest` itself: what one guest owns (region, request queue consumer, host
//! sockets, wake-up state), how it is made, and its lifecycle (departure, close-all).

use crate::alloc::DataAlloc;
use crate::guest::addr_view::GuestView;
use crate::guest::config::GuestConfig;
use crate::guest::config::DGRAM_MAX;
use crate::guest::config::DRAIN_STALL;
use crate::guest::entries::EntryPool;
use crate::guest::shared::SharedRef as ShortcutRef;
use crate::guest::socket::HostSocket;
use crate::guest::wake::DoorbellStats;
use crate::guest::wake::Ports;
use crate::guest::wake::RoundStats;
use crate::guest::wake::WakeState;
use crate::sys::{self, Epoll};
use canal_abi::sync::Ordering;
use canal_abi::Region;
use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) struct Guest {
    pub(crate) id: u32,
    pub(crate) pid: u32,
    pub(crate) comm: String,
    /// Control-connection key (epoll tokens).
    pub(crate) conn: u32,
    pub(crate) region: Region,
    pub(crate) cfg: GuestConfig,
    pub(crate) queue: canal_abi::queue::QueueConsumer,
    /// Per-slot wake-up eventfds registered with PORT.
    pub(crate) ports: Ports,
    /// Host sockets by entry index; grown on demand up to the entries' high-water
    /// mark (`put_socket`), so a guest with few sockets costs few bytes here.
    pub(crate) sockets: Vec<Option<HostSocket>>,
    /// Which table entries are free (the home hands them out).
    pub(crate) entries: EntryPool,
    /// A listener stopped accepting for lack of an entry or rings: freeing one looks
    /// at the listeners again.
    pub(crate) listeners_stalled: bool,
    /// This instance's listeners by host port (`Guest::serve_listeners_on`); an index
    /// whose socket no longer listens there is dropped when met.
    pub(crate) listener_ports: HashMap<u16, Vec<u32>>,
    /// Spare stream sockets published in the header (feature SPARES).
    pub(crate) spares: SpareRing,
    /// Next generation per entry index (1..=0xffff; handles are never 0).
    pub(crate) generations: Vec<u16>,
    pub(crate) alloc: DataAlloc,
    /// Rings of closed sockets kept allocated with their few touched pages
    /// (`Guest::retire_rings`): the next sockets take them without faulting pages in.
    pub(crate) warm_rings: Vec<(u64, u64)>,
    pub(crate) dirty: Vec<u32>,
    pub(crate) changed: Vec<u32>,
    pub(crate) changed_mark: Vec<u64>,
    /// Some socket of this round's `changed` was not appended to the event log when it
    /// was marked (no set relied on the log then): the round's end appends them all.
    pub(crate) log_behind: bool,
    pub(crate) scratch: Vec<u8>,
    /// Some(when): the guest's control connection closed.
    pub(crate) gone: Option<Instant>,
    /// Eventfd wake-ups written to this guest's slots, and those deferred.
    pub(crate) wakes: u64,
    pub(crate) deferred_wakes: u64,
    /// Guest-side coalescing window T_v (0: off), set by the poller each round.
    pub(crate) wake_window: Duration,
    /// When this guest last did work (the poller counts active guests).
    pub(crate) last_active: Option<Instant>,
    /// A VM served with ivshmem doorbells (protocol §9.5): its counters.
    pub(crate) doorbell: Option<DoorbellStats>,
    pub(crate) wake: WakeState,
    /// Deficit round robin: bytes this guest may still receive / transmit.
    pub(crate) rx_deficit: i64,
    pub(crate) tx_deficit: i64,
    /// Set when a socket stopped for lack of budget (it stays dirty).
    pub(crate) out_of_budget: bool,
    /// Set when this guest may short-circuit connections (§8).
    pub(crate) sc: Option<ShortcutRef>,
    /// Short-circuit CONNECTs answered only after this round's pairing (slot, seq,
    /// result, socket handle): the connector then wakes once, already CONNECTED and
    /// with its names (`answer_held`).
    pub(crate) held_answers: Vec<(u32, u32, i64, u32)>,
    /// Set by the request being executed when its answer is to be held so.
    pub(crate) hold_answer: bool,
    /// Requests (slot, request) on sockets whose fast connect is being paired: run
    /// once the pairing completed (`run_fast_waiting`), as if they came after it.
    pub(crate) fast_waiting: Vec<(u32, crate::request::Request)>,
    /// No closing socket has a deadline before this (a lower bound; None: none).
    pub(crate) earliest_close: Option<Instant>,
    /// Sockets this instance owns, one bit per entry index: it takes only their
    /// attention bits (virtual RSS: other workers own the rest).
    pub(crate) owned: Vec<u64>,
    /// 1 + the highest word of `owned` ever set: attention scans stop there, so a
    /// round costs the same with a 65,535-entry table as with a 64-entry one.
    pub(crate) owned_words: usize,
    /// Virtual RSS state (None: every socket of the guest stays here).
    pub(crate) vr: Option<Box<crate::guest::shared::State>>,
    /// Rate quotas (home worker only) and the connects waiting for them.
    pub(crate) rates: crate::quota::Rates,
    /// Requests completed, and those that failed with an error other than EAGAIN or
    /// EINPROGRESS (metrics).
    pub(crate) served: u64,
    /// Connects completed with a ticket (protocol §8.10).
    pub(crate) fast_connects: u64,
    pub(crate) failed: u64,
    /// Bytes sent and received by sockets already freed.
    pub(crate) freed_bytes: (u64, u64),
    /// The guest's event log (protocol §8.6; None for a VM guest, or if it could not
    /// be created: the guest's epoll sets then look at every socket).
    pub(crate) evlog: Option<Arc<sys::EvLogFile>>,
    // The mapping must outlive every use of `region`; it is dropped last.
    pub(crate) map: Arc<sys::Mapping>,
}

/// The host's copy of the spare-socket ring (`guest::spares`; the guest cannot change
/// it).
#[derive(Default)]
pub(crate) struct SpareRing {
    /// Spares published so far.
    pub(crate) tail: u32,
    /// Handles by ring slot, as published.
    pub(crate) handles: [u32; canal_abi::SPARES],
    /// The guest moved `spare_head` where it cannot be: no more spares for it.
    pub(crate) off: bool,
}

impl Guest {
    /// Creates a guest with a fresh region. Returns the guest and the region memfd.
    pub(crate) fn new(
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
    pub(crate) fn with_features(
        id: u32,
        conn: u32,
        pid: u32,
        comm: String,
        cfg: GuestConfig,
        features: u64,
    ) -> io::Result<(Guest, OwnedFd)> {
        let (memfd, map, region) = sys::Mapping::create_region(cfg.layout, id, features)?;
        let mut g = Guest::with_region(id, conn, pid, comm, cfg, map, region);
        g.evlog = sys::EvLogFile::create(conn).ok().map(Arc::new);
        Ok((g, memfd))
    }

    /// A guest on a region already created and mapped (`map` holds `region`).
    pub(crate) fn with_region(
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
    pub(crate) fn from_parts(
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
            sockets: Vec::new(),
            entries: EntryPool::new(n as u32),
            listeners_stalled: false,
            listener_ports: HashMap::new(),
            spares: Default::default(),
            generations: vec![1; n],
            alloc: DataAlloc::new(cfg.layout.data_size),
            warm_rings: Vec::new(),
            dirty: Vec::new(),
            changed: Vec::new(),
            changed_mark: vec![0; n.div_ceil(64)],
            log_behind: false,
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
            held_answers: Vec::new(),
            hold_answer: false,
            fast_waiting: Vec::new(),
            earliest_close: None,
            owned: vec![0; n.div_ceil(64)],
            owned_words: 0,
            vr: None,
            cfg,
            rates: Default::default(),
            served: 0,
            fast_connects: 0,
            failed: 0,
            freed_bytes: (0, 0),
            evlog: None,
            map,
        }
    }

    pub(crate) fn region(&self) -> &Region {
        &self.region
    }

    /// A VM guest (ivshmem region).
    pub(crate) fn is_vm(&self) -> bool {
        self.cfg.vm
    }

    /// Whether the poller must bound its sleep for this guest (protocol §9.4): a live
    /// VM guest without doorbells, or a doorbell VM with a process that cannot ring.
    pub(crate) fn needs_bounded_sleep(&self) -> bool {
        self.is_vm()
            && self.gone.is_none()
            && (self.doorbell.is_none_or(|d| !d.attached)
                || self.region.header().backoff_kickers.load(Ordering::Relaxed) != 0)
    }

    /// The region's mapping (tests and fuzzing write guest bytes through it).
    pub(crate) fn mapping(&self) -> &sys::Mapping {
        &self.map
    }

    pub(crate) fn region_size(&self) -> u64 {
        self.cfg.layout.region_size
    }

    pub(crate) fn view(&self) -> GuestView {
        GuestView {
            loopback_only: self.cfg.loopback_only,
            net: self.cfg.net.clone(),
            policy: self.cfg.policy.clone(),
        }
    }

    /// No entry is free here (held, or served by another worker).
    pub(crate) fn table_full(&self) -> bool {
        self.entries.exhausted()
    }

    /// Stores the socket of entry `index` (growing the table's host side to it).
    pub(crate) fn put_socket(&mut self, index: u32, s: HostSocket) {
        let i = index as usize;
        if i >= self.sockets.len() {
            self.sockets.resize_with(i + 1, || None);
        }
        self.sockets[i] = Some(s);
    }

    /// Takes the lowest free entry for a new socket (home only) and publishes the
    /// high-water mark before the caller publishes the handle. None: the guest is at
    /// its socket quota.
    pub(crate) fn take_entry(&mut self) -> Option<u32> {
        let (sockets, vr) = (&self.sockets, &self.vr);
        let index = self.entries.take(|i| {
            sockets.get(i as usize).is_none_or(Option::is_none)
                && !vr.as_ref().is_some_and(|v| v.away.contains_key(&i))
        })?;
        let high = self.entries.high_water();
        let h = self.region.header();
        if h.entries_used.load(Ordering::Relaxed) < high {
            h.entries_used.store(high, Ordering::Release);
        }
        Some(index)
    }

    pub(crate) fn sockets(&self) -> impl Iterator<Item = &HostSocket> {
        self.sockets.iter().flatten()
    }

    pub(crate) fn socket_count(&self) -> usize {
        self.sockets.iter().flatten().count()
    }

    /// Earliest drain deadline of a closing socket (possibly earlier than any still
    /// pending: then the poller wakes once more than needed).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        match (self.earliest_close, self.rates.until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub(crate) fn note_deadline(&mut self, d: Instant) {
        self.earliest_close = Some(self.earliest_close.map_or(d, |e| e.min(d)));
    }

    /// The control connection closed: the guest is gone. Sockets with nothing queued
    /// close now; the others drain their tx rings as long as the peer takes bytes.
    pub(crate) fn depart(&mut self, ep: &Epoll, now: Instant) {
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
    pub(crate) fn finished(&self) -> bool {
        self.gone.is_some() && self.sockets.iter().all(|s| s.is_none()) && !self.any_away()
    }

    /// Closes every host socket at once (daemon exit, or a departed guest whose drain
    /// time ran out).
    pub(crate) fn close_all(&mut self, ep: &Epoll) {
        // Dead to the guest first: from then on its library reads a freed entry as
        // the dead daemon's socket, not as one closed behind its back (EBADF).
        self.region.header().host_state.store(2, Ordering::Release);
        for i in 0..self.sockets.len() {
            if self.sockets[i].is_some() {
                let kind = self.entry(i as u32).kind.load(Ordering::Relaxed);
                self.free_socket(ep, i as u32);
                // What each socket was stays readable: the guest's library still tells
                // a listener or datagram socket (quiet after reporting the death once)
                // from a connection (libcanal sock/dead.rs).
                self.entry(i as u32).kind.store(kind, Ordering::Release);
            }
        }
    }
}
