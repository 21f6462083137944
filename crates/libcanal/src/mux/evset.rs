//! One epoll instance's canal interest list (`Set`), what each item reports (`eval`),
//! and how a large set finds the items to look at (protocol §8.6).
//!
//! A small set looks at every item on every scan: a few dozen sockets cost less than
//! any bookkeeping. Once a set holds `log_at()` canal sockets it relies on the guest's
//! event log instead (`Logged`): canald appends every socket it changed, short-circuit
//! peers append the connections they moved, and the set keeps a queue of the items
//! named since its last scan — a scan costs in proportion to the sockets that changed,
//! as the kernel's ready list does. Level-triggered items that reported go back to the
//! queue's tail (the kernel requeues them too), so they are looked at again next time.
//!
//! A short-circuited connection is *armed* when the set first looks at it: its side
//! of the segment gets `watch_index` and `watched` + 1, after which the peer appends
//! it. A peer that published without a fence may have read `watched` before our
//! increment, so an armed item is still looked at directly until a global memory
//! barrier has passed since (`SETTLE_NS`, then `barrier::global`). Until then, and for
//! nested epoll sets, items are `direct`.
//!
//! Whatever the log cannot vouch for (overflow, a tail that went backwards, an entry
//! left unwritten for `PENDING_NS`) queues every item once; so does the passing of
//! `full_every_ns`, which bounds what any change the log missed could cost.
use crate::conn::guest::Guest;
use crate::sock::core::Sock;
use canal_abi::evlog::{EvLog, Sweep};
use canal_abi::handle_index;
use canal_abi::sync::Ordering;
use libc::{c_int, epoll_event};
use std::collections::{HashMap, VecDeque};

pub(super) const EPOLLIN: u32 = libc::EPOLLIN as u32;
pub(super) const EPOLLOUT: u32 = libc::EPOLLOUT as u32;
const EPOLLERR: u32 = libc::EPOLLERR as u32;
const EPOLLHUP: u32 = libc::EPOLLHUP as u32;
pub(super) const EPOLLET: u32 = libc::EPOLLET as u32;
pub(super) const EPOLLONESHOT: u32 = libc::EPOLLONESHOT as u32;
pub(super) const EPOLLEXCLUSIVE: u32 = libc::EPOLLEXCLUSIVE as u32;
const EPOLLWAKEUP: u32 = libc::EPOLLWAKEUP as u32;
/// The input flags that are not events.
pub(super) const CONTROL: u32 = EPOLLET | EPOLLONESHOT | EPOLLEXCLUSIVE | EPOLLWAKEUP;

/// A set with this many canal sockets relies on the event log (CANAL_EPOLL_LOG_AT).
const LOG_AT: usize = 32;
/// An armed connection is looked at directly until a barrier this long after arming.
const SETTLE_NS: i64 = 200_000;
/// An unwritten entry this old: look at everything (its appender may have died).
const PENDING_NS: i64 = 1_000_000;
/// A hot connection that has not reported for this long goes back to the log.
const HOT_NS: i64 = 1_000_000;
/// At most this many hot connections per set (each is a look on every scan).
const HOT_MAX: usize = 32;
/// Every item is looked at once per this interval whatever the log says
/// (CANAL_EPOLL_RESCAN_MS; 0: never, which tests use so that a change the log missed
/// shows as a stall).
const FULL_EVERY_MS: usize = 100;

/// A number from the environment, read once into `cache` (usize::MAX: not yet read).
fn tunable(
    cache: &core::sync::atomic::AtomicUsize,
    name: &core::ffi::CStr,
    default: usize,
) -> usize {
    let v = cache.load(Ordering::Relaxed);
    if v != usize::MAX {
        return v;
    }
    let v = crate::rt::env(name)
        .and_then(|b| core::str::from_utf8(b).ok()?.parse().ok())
        .unwrap_or(default)
        .min(usize::MAX - 1);
    cache.store(v, Ordering::Relaxed);
    v
}

/// The canal-socket count from which a set relies on the event log.
pub(super) fn log_at() -> usize {
    static AT: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(usize::MAX);
    tunable(&AT, c"CANAL_EPOLL_LOG_AT", LOG_AT)
}

/// The interval of the look at every item (None: never).
fn full_every_ns() -> Option<i64> {
    static MS: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(usize::MAX);
    let ms = tunable(&MS, c"CANAL_EPOLL_RESCAN_MS", FULL_EVERY_MS);
    (ms != 0).then(|| (ms as i64).saturating_mul(1_000_000))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    /// A canal socket with this handle.
    Canal(u32),
    /// An epoll fd that itself watches canal sockets.
    Nested(c_int),
}

/// A short-circuited connection armed in its segment (§8.6).
#[derive(Debug, Clone, Copy)]
pub(super) struct Armed {
    seg: u32,
    side: u32,
    /// When it was armed (ns); 0 once a barrier passed.
    at: i64,
    /// Hot (ns of its last report; 0: not hot): a connection that just reported is
    /// looked at directly, and its `logged` word is kept at 1 so the peer does not
    /// append it on every message (an active connection costs no appends).
    hot: i64,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Item {
    pub(super) fd: c_int,
    pub(super) target: Target,
    /// Requested events and control flags (EPOLLET, EPOLLONESHOT…).
    pub(super) events: u32,
    pub(super) data: u64,
    /// Edge state: the socket's event_seq at the last report, the bits last seen, and
    /// "report once whatever the sequence says" (set by ADD/MOD).
    pub(super) last_seq: u32,
    pub(super) last_bits: u32,
    /// A short-circuited socket's outgoing ring tail at the last report (the
    /// write-space edge after a send found the ring full, `Sock::edge_seq`).
    pub(super) last_tx: u32,
    pub(super) fresh: bool,
    /// EPOLLONESHOT fired: nothing is reported until MOD.
    pub(super) disarmed: bool,
    /// A native-accept listener whose twin the set's real epoll instance holds
    /// (`native::watch_twin`): the kernel's events on it are the item's edges for
    /// native clients, and canald need not look.
    pub(super) twin: bool,
    /// Such an event came and the item has not been looked at since.
    pub(super) kernel_edge: bool,
    /// Logged sets: in the queue.
    queued: bool,
    armed: Option<Armed>,
}

impl Item {
    pub(super) fn new(
        fd: c_int,
        target: Target,
        events: u32,
        data: u64,
        seq: (u32, Option<u32>),
    ) -> Item {
        Item {
            fd,
            target,
            events,
            data,
            last_seq: seq.0,
            last_bits: 0,
            last_tx: seq.1.unwrap_or(0),
            fresh: true,
            disarmed: false,
            twin: false,
            kernel_edge: false,
            queued: false,
            armed: None,
        }
    }

    fn index(&self) -> Option<u32> {
        match self.target {
            Target::Canal(h) => Some(handle_index(h)),
            Target::Nested(_) => None,
        }
    }

    /// Looked at on every scan of a logged set.
    fn direct(&self) -> bool {
        matches!(self.target, Target::Nested(_))
            || self.armed.is_some_and(|a| a.at != 0 || a.hot != 0)
    }

    /// Leaves its segment's watchers (the socket left the set, or the set went).
    fn disarm(&mut self) {
        if let Some(a) = self.armed.take() {
            if let Some(seg) = crate::shortcut::seg::mapped(a.seg) {
                seg.watched(a.side).fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

/// A logged set's view of the event log.
struct Logged {
    log: EvLog<'static>,
    cursor: u64,
    /// When the sweep first stopped at an unwritten entry (0: it did not).
    pending_since: i64,
    last_full: i64,
    /// Items to look at (by fd; an fd whose item left is skipped).
    queue: VecDeque<c_int>,
    /// Socket index → the set's fds of that socket (dup'ed descriptors are items each).
    by_index: HashMap<u32, Fds>,
    /// Items looked at on every scan (`Item::direct`).
    direct: Vec<c_int>,
    /// Hot items among them, and the time of the last refill.
    hot: usize,
    now: i64,
    /// Which side goes first in the next scan (neither starves the other).
    direct_first: bool,
}

/// A logged set's descriptors of one socket: almost always one, held without an
/// allocation (a server's set of 10,000 held connections paid a heap block each).
#[derive(Debug)]
enum Fds {
    One(c_int),
    Many(Vec<c_int>),
}

impl Fds {
    fn note(by_index: &mut HashMap<u32, Fds>, index: u32, fd: c_int) {
        match by_index.get_mut(&index) {
            None => {
                by_index.insert(index, Fds::One(fd));
            }
            Some(Fds::One(f)) => {
                let first = *f;
                by_index.insert(index, Fds::Many(vec![first, fd]));
            }
            Some(Fds::Many(v)) => v.push(fd),
        }
    }

    /// Drops `fd` from socket `index`'s descriptors, and the socket once none is left.
    fn forget(by_index: &mut HashMap<u32, Fds>, index: u32, fd: c_int) {
        let empty = match by_index.get_mut(&index) {
            None => false,
            Some(Fds::One(f)) => *f == fd,
            Some(Fds::Many(v)) => {
                v.retain(|&f| f != fd);
                v.is_empty()
            }
        };
        if empty {
            by_index.remove(&index);
        }
    }

    fn as_slice(&self) -> &[c_int] {
        match self {
            Fds::One(f) => core::slice::from_ref(f),
            Fds::Many(v) => v,
        }
    }
}

pub(super) struct Set {
    pub(super) epfd: c_int,
    items: Vec<Item>,
    /// fd → position in `items`.
    pos: HashMap<c_int, usize>,
    /// Rotates the scan start of a small set so that level-triggered sockets cannot
    /// starve others when maxevents is small (the kernel requeues them at the tail).
    rot: usize,
    logged: Option<Box<Logged>>,
    /// Canal sockets and nested epoll sets among the items.
    canal: usize,
    nested: usize,
    /// A scan's buffers, kept between scans (no allocation per spin round).
    order: Vec<usize>,
    again: Vec<c_int>,
    /// The set's kick (mux/kick.rs), made with its first canal item.
    pub(super) kick: Option<c_int>,
    /// The request slots of this process's threads asleep in a wait on the set
    /// (`NO_SLOT` for one without): an item added or re-armed meanwhile wakes them.
    pub(super) sleepers: Vec<u32>,
    /// The set existed at a fork: another process may use its real instance, and the
    /// twins in it (`Item::twin`), with a copy of its items. A twin is then left in
    /// the instance when an item leaves (a child closing its copy of the listener
    /// would take the parent's wake-ups away; natively a close in one process leaves a
    /// shared instance as it is), and no twin is put in (its events could go to a
    /// process that has no item for them).
    pub(super) shared: bool,
}

impl Set {
    pub(super) fn new(epfd: c_int) -> Set {
        Set {
            epfd,
            items: Vec::new(),
            pos: HashMap::new(),
            rot: 0,
            logged: None,
            canal: 0,
            nested: 0,
            order: Vec::new(),
            again: Vec::new(),
            kick: None,
            sleepers: Vec::new(),
            shared: false,
        }
    }

    pub(super) fn get_mut(&mut self, fd: c_int) -> Option<&mut Item> {
        let p = *self.pos.get(&fd)?;
        self.items.get_mut(p)
    }

    pub(super) fn contains(&self, fd: c_int) -> bool {
        self.pos.contains_key(&fd)
    }

    /// Whether adding one more canal socket makes this set rely on the log.
    pub(super) fn wants_log(&self) -> bool {
        self.logged.is_none() && self.canal + 1 >= log_at()
    }

    pub(super) fn nested_fds(&self) -> Vec<c_int> {
        if self.nested == 0 {
            return Vec::new(); // the common case, without a walk over every item
        }
        self.items
            .iter()
            .filter_map(|i| match i.target {
                Target::Nested(f) => Some(f),
                _ => None,
            })
            .collect()
    }

    pub(super) fn add(&mut self, it: Item) {
        let fd = it.fd;
        match it.target {
            Target::Canal(_) => self.canal += 1,
            Target::Nested(_) => self.nested += 1,
        }
        self.pos.insert(fd, self.items.len());
        self.items.push(it);
        if let Some(l) = self.logged.as_mut() {
            match it.index() {
                Some(i) => Fds::note(&mut l.by_index, i, fd),
                None => l.direct.push(fd),
            }
        }
        self.enqueue(fd);
    }

    /// After MOD: the item is looked at again (its fresh edge).
    pub(super) fn touched(&mut self, fd: c_int) {
        self.enqueue(fd);
    }

    /// The kernel said twin-watched listeners `handles` had native arrivals: each of
    /// their items is looked at, and an edge-triggered one reports them, at the next
    /// scan.
    pub(super) fn kernel_edges(&mut self, handles: &[u32]) {
        let mut hit = Vec::new();
        for it in self.items.iter_mut().filter(|it| it.twin) {
            if matches!(it.target, Target::Canal(h) if handles.contains(&h)) {
                it.kernel_edge = true;
                hit.push(it.fd);
            }
        }
        for fd in hit {
            self.enqueue(fd);
        }
    }

    /// Whether an item of listener `handle` is twin-watched (the set's real instance
    /// holds its twin: another descriptor of it shares that).
    pub(super) fn twin_watched(&self, handle: u32) -> bool {
        self.items
            .iter()
            .any(|it| it.twin && it.target == Target::Canal(handle))
    }

    pub(super) fn remove(&mut self, fd: c_int) -> Option<Item> {
        let p = self.pos.remove(&fd)?;
        let mut it = self.items.swap_remove(p);
        if let (true, Target::Canal(h)) = (it.twin, it.target) {
            // The last descriptor of the listener in the set takes its twin out.
            if !self.shared && !self.twin_watched(h) {
                crate::sock::native::unwatch_twin(self.epfd, h);
            }
        }
        if let Some(moved) = self.items.get(p) {
            self.pos.insert(moved.fd, p);
        }
        match it.target {
            Target::Canal(_) => self.canal -= 1,
            Target::Nested(_) => self.nested -= 1,
        }
        if let Some(l) = self.logged.as_mut() {
            if let Some(i) = it.index() {
                Fds::forget(&mut l.by_index, i, fd);
            }
            l.direct.retain(|&f| f != fd);
            if it.armed.is_some_and(|a| a.hot != 0) {
                l.hot -= 1;
            }
        }
        it.disarm();
        Some(it)
    }

    /// The set goes (its epoll fd closed): it leaves every segment and the log.
    pub(super) fn drop_all(&mut self) {
        for it in &mut self.items {
            it.disarm();
        }
        if let Some(l) = self.logged.take() {
            l.log.header.readers.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(k) = self.kick.take() {
            crate::mux::kick::forget(k);
        }
    }

    /// A forked child has its own copy of the set: it counts itself again. Its one
    /// thread is not asleep on the set.
    pub(super) fn forked(&mut self) {
        self.sleepers.clear();
        for it in &self.items {
            if let Some(seg) = it
                .armed
                .and_then(|a| crate::shortcut::seg::mapped(a.seg).map(|s| (s, a.side)))
            {
                seg.0.watched(seg.1).fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(l) = &self.logged {
            l.log.header.readers.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// From now on the set relies on `log`: it counts itself a reader (canald appends
    /// only while some set does), then looks at every item once.
    pub(super) fn enter_log(&mut self, log: EvLog<'static>) {
        if self.logged.is_some() {
            return;
        }
        log.header.readers.fetch_add(1, Ordering::SeqCst);
        // Pairs with canald's fence between its changes and reading `readers`.
        canal_abi::sync::fence(Ordering::SeqCst);
        let mut by_index = HashMap::new();
        let mut direct = Vec::new();
        for it in &self.items {
            match it.index() {
                Some(i) => Fds::note(&mut by_index, i, it.fd),
                None => direct.push(it.fd),
            }
        }
        self.logged = Some(Box::new(Logged {
            log,
            cursor: log.tail(),
            pending_since: 0,
            last_full: crate::sys::now_ns(),
            queue: VecDeque::new(),
            by_index,
            direct,
            hot: 0,
            now: 0,
            direct_first: false,
        }));
        self.enqueue_all();
    }

    fn enqueue(&mut self, fd: c_int) {
        if let Some(l) = self.logged.as_mut() {
            enqueue_in(&mut l.queue, &mut self.items, &self.pos, fd);
        }
    }

    fn enqueue_all(&mut self) {
        if let Some(l) = self.logged.as_mut() {
            self.items.iter_mut().for_each(|it| queue(&mut l.queue, it));
        }
    }

    /// Moves what the log named since the last look into the queue; settles armed
    /// items whose barrier is due.
    fn refill(&mut self) {
        let Set {
            items, pos, logged, ..
        } = self;
        let Some(l) = logged.as_mut() else {
            return;
        };
        let now = crate::sys::now_ns();
        l.now = now;
        if l.hot > 0 {
            cool(l, items, pos, now);
        }
        let mut named = Vec::new();
        let sweep = l.log.sweep(&mut l.cursor, |i| named.push(i));
        let mut all = match sweep {
            Sweep::Done => {
                l.pending_since = 0;
                false
            }
            Sweep::Pending if l.pending_since == 0 => {
                l.pending_since = now;
                false
            }
            Sweep::Pending => {
                if now - l.pending_since < PENDING_NS {
                    false
                } else {
                    l.cursor = l.log.tail();
                    l.pending_since = 0;
                    true
                }
            }
            Sweep::Rescan => true,
        };
        if full_every_ns().is_some_and(|every| now - l.last_full >= every) {
            l.last_full = now;
            all = true;
        }
        let due_at = |it: &Item| {
            it.armed
                .is_some_and(|a| a.at != 0 && now - a.at >= SETTLE_NS)
        };
        let due: Vec<c_int> = l
            .direct
            .iter()
            .filter(|fd| pos.get(fd).is_some_and(|&p| due_at(&items[p])))
            .copied()
            .collect();
        if !due.is_empty() && crate::shortcut::barrier::global() {
            // Every peer publish before the barrier is visible now, and every one after
            // it reads our `watched`: one more look and the log covers them.
            l.direct.retain(|fd| !due.contains(fd));
            for &fd in &due {
                if let Some(a) = pos.get(&fd).and_then(|&p| items[p].armed.as_mut()) {
                    a.at = 0;
                }
                enqueue_in(&mut l.queue, items, pos, fd);
            }
        }
        if all {
            items.iter_mut().for_each(|it| queue(&mut l.queue, it));
            return;
        }
        for i in named {
            for &fd in l.by_index.get(&i).map_or(&[][..], Fds::as_slice) {
                enqueue_in(&mut l.queue, items, pos, fd);
            }
        }
    }

    /// The socket indices of the short-circuited items looked at directly (a sleeper
    /// counts itself in their segments, §8.4).
    pub(super) fn direct_sockets(&self) -> Vec<u32> {
        let Some(l) = &self.logged else {
            return Vec::new();
        };
        l.direct
            .iter()
            .filter_map(|fd| self.pos.get(fd))
            .filter_map(|&p| self.items[p].index())
            .collect()
    }

    /// A set without nested sets: its canal sockets, all a sleeper on it waits for
    /// (so only their connections count it as a sleeper: protocol §8.8). None with
    /// nested sets (their sockets are not listed here).
    pub(super) fn canal_sockets(&self) -> Option<Vec<u32>> {
        (self.nested == 0).then(|| self.items.iter().filter_map(Item::index).collect())
    }

    pub(super) fn log(&self) -> Option<EvLog<'static>> {
        self.logged.as_ref().map(|l| l.log)
    }

    /// Arms the short-circuited socket of a logged set's item on first sight.
    fn arm(g: &'static Guest, it: &mut Item, now: &mut i64) {
        let Target::Canal(h) = it.target else {
            return;
        };
        if it.armed.is_some() {
            return;
        }
        let Ok(s) = Sock::new(g, h) else {
            return;
        };
        if s.e.segment.load(Ordering::Acquire) == 0 {
            return;
        }
        let Ok(r) = s.rings() else {
            return;
        };
        let Some((seg, peer_side)) = r.peer else {
            return;
        };
        let side = 1 - peer_side;
        seg.watch_index(side).store(s.idx, Ordering::Relaxed);
        seg.watched(side).fetch_add(1, Ordering::SeqCst);
        if *now == 0 {
            *now = crate::sys::now_ns();
        }
        it.armed = Some(Armed {
            seg: seg.id(),
            side,
            at: *now,
            hot: 0,
        });
    }

    /// The items a look should cover, in order: every item of a small set, else the
    /// direct ones and the queue (alternating which goes first). Queue
    /// entries taken here are the caller's to requeue.
    fn candidates(&mut self, g: &'static Guest, take: bool, order: &mut Vec<usize>) {
        order.clear();
        if self.logged.is_none() {
            order.extend(0..self.items.len());
            return;
        }
        self.refill();
        let Set {
            items, pos, logged, ..
        } = self;
        let Some(l) = logged.as_mut() else {
            return;
        };
        // The direct items first or last (alternating), the queue in between; written
        // into `order` without allocating (a scan runs on every spin round).
        let direct_first = l.direct_first;
        l.direct_first = !direct_first;
        let direct_fds = |order: &mut Vec<usize>, l: &Logged| {
            order.extend(l.direct.iter().filter_map(|fd| pos.get(fd).copied()));
        };
        if direct_first {
            direct_fds(order, l);
        }
        let from = order.len();
        if take {
            while let Some(fd) = l.queue.pop_front() {
                // An entry whose item left (or was taken already: a reused fd queued
                // twice) is skipped.
                if let Some(&p) = pos.get(&fd) {
                    if items[p].queued {
                        items[p].queued = false;
                        order.push(p);
                    }
                }
            }
        } else {
            order.extend(l.queue.iter().filter_map(|fd| pos.get(fd).copied()));
        }
        // First sight of a queued short-circuited socket: arm it (it becomes direct
        // until settled, and is looked at as such).
        let mut now = 0;
        for &p in &order[from..] {
            let it = &mut items[p];
            if it.armed.is_none() {
                Set::arm(g, it, &mut now);
                if it.direct() {
                    l.direct.push(it.fd);
                }
            }
        }
        // A direct item is looked at once, not again from the queue.
        let mut k = from;
        for i in from..order.len() {
            if !items[order[i]].direct() {
                order[k] = order[i];
                k += 1;
            }
        }
        order.truncate(k);
        if !direct_first {
            direct_fds(order, l);
        }
    }

    /// What item `p` reports now, committing edge and one-shot state. `nested`:
    /// readiness of nested epoll fds, evaluated by the caller outside the lock.
    fn look(&mut self, g: &'static Guest, p: usize, nested: &[(c_int, bool)]) -> u32 {
        let it = &mut self.items[p];
        match it.target {
            Target::Canal(_) => eval(g, it, true, 0, |_, _, _| false),
            Target::Nested(f) => {
                let ready = nested.iter().any(|&(nf, r)| nf == f && r);
                let interest = it.events & !CONTROL;
                if it.disarmed || !ready || interest & EPOLLIN == 0 {
                    0
                } else {
                    if it.events & EPOLLONESHOT != 0 {
                        it.disarmed = true;
                    }
                    EPOLLIN
                }
            }
        }
    }

    /// Collects events into `out`; returns how many.
    pub(super) fn scan(
        &mut self,
        g: &'static Guest,
        nested: &[(c_int, bool)],
        out: &mut [epoll_event],
    ) -> usize {
        let mut n = 0;
        if self.logged.is_none() {
            // A small set: every item, from a rotating start.
            let len = self.items.len();
            let start = if len == 0 { 0 } else { self.rot % len };
            let mut last = None;
            for k in 0..len {
                if n == out.len() {
                    break;
                }
                let p = (start + k) % len;
                let ev = self.look(g, p, nested);
                if ev != 0 {
                    out[n] = epoll_event {
                        events: ev,
                        u64: self.items[p].data,
                    };
                    n += 1;
                    last = Some(p);
                }
            }
            if let Some(p) = last {
                self.rot = p + 1;
            }
            return n;
        }
        let mut order = core::mem::take(&mut self.order);
        self.candidates(g, true, &mut order);
        let mut again = core::mem::take(&mut self.again);
        again.clear();
        for &p in &order {
            if n == out.len() {
                // Not looked at for want of room: next time.
                again.push(self.items[p].fd);
                continue;
            }
            let ev = self.look(g, p, nested);
            if ev != 0 {
                let it = &self.items[p];
                out[n] = epoll_event {
                    events: ev,
                    u64: it.data,
                };
                n += 1;
                let fd = it.fd;
                // Level-triggered: looked at again next time (the kernel requeues it).
                let lt = it.events & (EPOLLET | EPOLLONESHOT) == 0;
                if !self.heat(p) && lt {
                    again.push(fd);
                }
            }
        }
        for &fd in &again {
            self.enqueue(fd);
        }
        self.order = order;
        self.again = again;
        n
    }

    /// Item `p` of a logged set just reported: a settled connection becomes (or stays)
    /// hot. Returns whether it is hot (looked at directly from now on).
    fn heat(&mut self, p: usize) -> bool {
        let Some(l) = self.logged.as_mut() else {
            return false;
        };
        let it = &mut self.items[p];
        let Some(a) = it.armed.as_mut() else {
            return false;
        };
        if a.hot != 0 {
            a.hot = l.now.max(1);
            return true;
        }
        if a.at != 0 || l.hot >= HOT_MAX || it.events & EPOLLONESHOT != 0 {
            return false;
        }
        let Some(seg) = crate::shortcut::seg::mapped(a.seg) else {
            return false;
        };
        // Only a connection no other set of ours follows (another set relies on the
        // appends this suppresses; `cool` also ends it once another set arms it).
        if seg.watched(a.side).load(Ordering::Relaxed) != 1 {
            return false;
        }
        // From now on the peer does not append it: we look at it on every scan.
        seg.logged(a.side).store(1, Ordering::Relaxed);
        a.hot = l.now.max(1);
        l.hot += 1;
        l.direct.push(it.fd);
        true
    }

    /// Copies of the items a look would cover now (peeks evaluate them outside the
    /// lock: a nested item's look takes it).
    pub(super) fn peek_items(&mut self, g: &'static Guest) -> Vec<Item> {
        let mut order = Vec::new();
        self.candidates(g, false, &mut order);
        order.into_iter().map(|p| self.items[p]).collect()
    }
}

/// What an item reports now (0: nothing). With `commit`, edge and one-shot state
/// advance as for a delivered event; without, this only peeks. An armed item's
/// `logged` word is cleared first: a peer publish after this look appends again.
/// `peek_nested(g, epfd, depth)`: whether a nested epoll set has anything to report.
pub(super) fn eval(
    g: &'static Guest,
    it: &mut Item,
    commit: bool,
    depth: u32,
    peek_nested: fn(&'static Guest, c_int, u32) -> bool,
) -> u32 {
    if it.disarmed {
        return 0;
    }
    if let Some(a) = it.armed.filter(|a| a.hot == 0) {
        if let Some(seg) = crate::shortcut::seg::mapped(a.seg) {
            if seg.logged(a.side).load(Ordering::Relaxed) != 0 {
                seg.logged(a.side).swap(0, Ordering::SeqCst);
            }
        }
    }
    let interest = (it.events & !CONTROL) | EPOLLERR | EPOLLHUP;
    let mut sock = None;
    // A twin-watched listener canald does not look at, and whether canal clients'
    // ACCEPT records wait in its ring.
    let mut kernel = false;
    let mut records = false;
    let (seq, tx, bits) = match it.target {
        Target::Canal(h) => {
            if crate::conn::guest::is_dead(g) {
                (
                    it.last_seq,
                    None,
                    crate::sock::dead::readiness(g, h) as u16 as u32,
                )
            } else {
                match Sock::new(g, h) {
                    Ok(s) => {
                        let edge = it.events & EPOLLET != 0;
                        sock = Some(s);
                        kernel = it.twin && !crate::sock::native::canald_looks(&s);
                        if kernel {
                            records = s.e.rx_head.load(Ordering::Acquire)
                                != s.e.rx_tail.load(Ordering::Acquire);
                            let bits = crate::sock::native::twin_readiness(&s, it.kernel_edge);
                            (crate::mux::edge::twin_seq(&s).0, None, bits as u16 as u32)
                        } else {
                            crate::mux::edge::look(&s, edge)
                        }
                    }
                    // The socket is gone (closed behind our back): nothing to report.
                    Err(_) => return 0,
                }
            }
        }
        Target::Nested(inner) => {
            let r = if depth < 4 && peek_nested(g, inner, depth + 1) {
                EPOLLIN
            } else {
                0
            };
            (it.last_seq, None, r)
        }
    };
    let m = bits & interest;
    let fire = if it.events & EPOLLET != 0 {
        let space = tx.is_some_and(|t| t != it.last_tx);
        // A twin-watched listener's native clients are edges by the kernel's event
        // alone (one per arrival; also one at ADD or MOD if any are queued, as the
        // kernel re-checks the twin then): readiness showing a client first is no
        // second edge, nor is a fresh item's first look unless it has something else
        // to report (records, an error).
        let (news, edge, fresh) = if kernel {
            let other = m & !EPOLLIN != 0 || records;
            (
                m & !it.last_bits & !EPOLLIN,
                it.kernel_edge,
                it.fresh && other,
            )
        } else {
            (m & !it.last_bits, false, it.fresh)
        };
        let f = m != 0 && (fresh || seq != it.last_seq || space || news != 0 || edge);
        if commit {
            it.kernel_edge = false;
            it.last_bits = m;
            if f {
                it.last_seq = seq;
                it.last_tx = tx.unwrap_or(it.last_tx);
                it.fresh = false;
                if m & EPOLLOUT != 0 {
                    if let Some(s) = sock {
                        s.clear_nospace();
                    }
                }
            }
        }
        f
    } else {
        if commit {
            it.kernel_edge = false;
        }
        m != 0
    };
    if fire && commit && it.events & EPOLLONESHOT != 0 {
        it.disarmed = true;
    }
    if fire {
        m
    } else {
        0
    }
}

/// Puts an item in the queue `q` unless it is there already.
fn queue(q: &mut VecDeque<c_int>, it: &mut Item) {
    if !it.queued {
        it.queued = true;
        q.push_back(it.fd);
    }
}

/// `queue` for the item at `fd`, if the set has one.
fn enqueue_in(q: &mut VecDeque<c_int>, items: &mut [Item], pos: &HashMap<c_int, usize>, fd: c_int) {
    if let Some(it) = pos.get(&fd).and_then(|&p| items.get_mut(p)) {
        queue(q, it);
    }
}

/// Hot items that have not reported for HOT_NS, or that another set now follows too,
/// go back to the log: `logged` cleared first, then one look (a peer publish after the
/// clear appends; one before it is seen by the look).
fn cool(l: &mut Logged, items: &mut [Item], pos: &HashMap<c_int, usize>, now: i64) {
    let mut cooled = Vec::new();
    for &fd in &l.direct {
        let Some(&p) = pos.get(&fd) else {
            continue;
        };
        let Some(a) = items[p].armed.as_mut() else {
            continue;
        };
        if a.hot == 0 {
            continue;
        }
        let seg = crate::shortcut::seg::mapped(a.seg);
        let shared = seg.is_some_and(|s| s.watched(a.side).load(Ordering::Relaxed) != 1);
        if shared || now - a.hot >= HOT_NS {
            a.hot = 0;
            if let Some(seg) = seg {
                seg.logged(a.side).swap(0, Ordering::SeqCst);
            }
            cooled.push(fd);
        }
    }
    if cooled.is_empty() {
        return;
    }
    l.hot -= cooled.len();
    l.direct.retain(|fd| !cooled.contains(fd));
    for fd in cooled {
        enqueue_in(&mut l.queue, items, pos, fd);
    }
}

#[cfg(test)]
mod tests {
    use super::Fds;
    use std::collections::HashMap;

    fn fds(m: &HashMap<u32, Fds>, i: u32) -> Vec<i32> {
        m.get(&i).map_or(Vec::new(), |f| f.as_slice().to_vec())
    }

    /// A socket's descriptors in a logged set: one kept inline, dup'ed ones listed, and
    /// the socket dropped with its last one.
    #[test]
    fn descriptors_of_a_socket() {
        let mut m = HashMap::new();
        Fds::note(&mut m, 7, 10);
        assert!(matches!(m[&7], Fds::One(10)));
        Fds::note(&mut m, 7, 11);
        Fds::note(&mut m, 7, 12);
        Fds::note(&mut m, 8, 20);
        assert_eq!(fds(&m, 7), [10, 11, 12]);
        Fds::forget(&mut m, 7, 11);
        assert_eq!(fds(&m, 7), [10, 12]);
        Fds::forget(&mut m, 7, 99); // not one of its descriptors: nothing changes
        Fds::forget(&mut m, 8, 21);
        assert_eq!((fds(&m, 7), fds(&m, 8)), (vec![10, 12], vec![20]));
        Fds::forget(&mut m, 7, 10);
        Fds::forget(&mut m, 7, 12);
        Fds::forget(&mut m, 8, 20);
        assert!(m.is_empty(), "a socket without descriptors leaves the map");
    }
}
