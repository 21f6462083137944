//! Pollers: `canald --workers N` runs N pollers, each with its own epoll.
//!
//! Each guest has a *home* worker (new guests go to the worker with the fewest): it
//! serves the guest's request queue and owns its allocator and entry indices. With
//! virtual RSS (`guest::vrss`, protocol §6.3) a guest's connected streams and datagram
//! sockets are owned by the worker their flow hash names, its bound datagram sockets
//! and listeners by the worker their local address names; a worker keeps the sockets
//! it owns for guests homed elsewhere in *shadow* guests (`Shard::shadows`), and
//! workers pass sockets, forwarded requests, freed entries and an away listener's
//! accepts through their mailboxes (`Worker::mbox`). Without it (one worker, an older
//! guest library, a VM guest) all of a guest's sockets stay on its home worker.
//! Short-circuit jobs (`guest::shortcut`) run on the worker home to the guest they
//! touch, whichever it is.
//!
//! Worker 0 runs on the daemon's thread and also serves the control socket; the
//! others run in their own threads. A worker's guests sit behind a mutex that the
//! worker holds during a round (never while it sleeps); the control side takes it
//! briefly to add a guest, register a port, list, or mark a guest gone.
#![forbid(unsafe_code)]

use crate::config::Config;
use crate::engine::{NotifyMode, SpinBudget, Split, WorkerStats};
use crate::guest::shared::Mailbox;
use crate::guest::shared::SharedRef as ShortcutRef;
use crate::guest::shortcut;
use crate::guest::socket::token;
use crate::guest::state::Guest;
use crate::guest::vrss;
use crate::sys::{self, Epoll};
use canal_abi::sync::{fence, Ordering};
use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The hybrid poller's initial spin budget (then adapted, `engine::SpinBudget`): long
/// enough to catch the next request of a guest in a request/response loop without a
/// doorbell, short enough that an idle canald costs nothing measurable.
pub(crate) const SPIN_TARGET: Duration = Duration::from_micros(30);
/// Bounds of the adaptive host budget.
pub(crate) const SPIN_MIN: Duration = Duration::from_micros(2);
pub(crate) const SPIN_MAX: Duration = Duration::from_micros(200);
/// A spinning poller yields the core every this many empty rounds (2-core machines:
/// guests and pollers may outnumber cores). 8, not 64 (docs/bench/why.md, "Poller
/// yield interval").
const YIELD_EVERY: u32 = 8;
/// Longest sleep while a doorbell VM exists (ms): notices a process of that VM that
/// attached without doorbell access (the region's `backoff_kickers`; protocol §9.5).
const DOORBELL_TICK_MS: i32 = 100;
/// How often the coalescing split is recomputed.
const SPLIT_EVERY: Duration = Duration::from_millis(50);
/// A guest counts as active (n in the split) this long after it last did work.
const ACTIVE_FOR: Duration = Duration::from_secs(1);

/// The price of one sleep in the adaptive budget's rule: the poller's own wake-up
/// (C_p) plus the guest's wake-up it usually entails (C_v), measured on an idle
/// machine, and never below SLEEP_COST_MIN — on a loaded 2-vCPU machine waking a
/// blocked thread on the other vCPU costs ~30-35 µs (benchmarks.md), several times the
/// idle figures.
pub(crate) fn sleep_cost_ns(c_p: u64, c_v: u64) -> u64 {
    (c_p + c_v).max(SLEEP_COST_MIN.as_nanos() as u64)
}
pub(crate) const SLEEP_COST_MIN: Duration = Duration::from_micros(30);

/// Nanoseconds of one empty poller round: dominated by one epoll_wait(0), so time a
/// few of those (the guests' scans add a little on top).
pub(crate) fn round_cost_ns(ep: &Epoll) -> u64 {
    let mut ev = sys::empty_events(8);
    let n = 200u32;
    let t0 = Instant::now();
    for _ in 0..n {
        let _ = ep.wait(&mut ev, 0);
    }
    (t0.elapsed() / n).as_nanos().max(50) as u64
}

/// A worker's guests (behind its mutex).
#[derive(Default)]
pub(crate) struct Shard {
    /// Guests by control-connection key (departed ones stay until their sockets close).
    pub(crate) guests: BTreeMap<u32, Guest>,
    /// Doorbell eventfds by connection key.
    pub(crate) doorbells: BTreeMap<u32, OwnedFd>,
    /// Virtual RSS: this worker's share of guests homed elsewhere (the sockets it
    /// owns), and its doorbell for each of those guests (DOORBELLS).
    pub(crate) shadows: BTreeMap<u32, Guest>,
    pub(crate) vrss_doorbells: BTreeMap<u32, OwnedFd>,
    rr: usize,
    keys: Vec<u32>,
}

pub(crate) struct Worker {
    pub(crate) id: u32,
    /// Doorbells and host sockets of this worker's guests (worker 0: also control).
    pub(crate) ep: Epoll,
    pub(crate) shard: Mutex<Shard>,
    pub(crate) stats: Arc<WorkerStats>,
    /// Short-circuit jobs (pairings, peer events), queued per worker; shared by all.
    pub(crate) shortcut: ShortcutRef,
    /// Pokes the worker out of its sleep (a new guest, shutdown) and carries the
    /// other workers' messages (virtual RSS).
    pub(crate) mbox: Arc<Mailbox>,
    pub(crate) stop: AtomicBool,
}

impl Worker {
    pub(crate) fn new(id: u32, shortcut: ShortcutRef) -> io::Result<Worker> {
        let ep = Epoll::new()?;
        let poke = sys::eventfd()?;
        ep.add(
            poke.as_raw_fd(),
            sys::EP_IN,
            token::make(token::POKE, 0, 0, 0),
        )?;
        Ok(Worker {
            id,
            ep,
            shard: Mutex::new(Shard::default()),
            stats: Arc::new(WorkerStats::default()),
            shortcut,
            mbox: Arc::new(Mailbox::new(poke)),
            stop: AtomicBool::new(false),
        })
    }

    /// The shard, even if a panic poisoned the lock (guest state stays consistent
    /// per call; canald never panics on guest input by design).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Shard> {
        self.shard.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn poke(&self) {
        let _ = sys::eventfd_write(self.mbox.poke.as_raw_fd());
    }
}

/// One poller's loop state: its budget, its clock of idleness, its split.
pub(crate) struct Poller {
    pub(crate) w: Arc<Worker>,
    cfg: Config,
    mode: NotifyMode,
    spin: SpinBudget,
    /// Nanoseconds per empty round (converts the budget to counted rounds).
    round_ns: u64,
    idle_rounds: u32,
    idle_since: Option<Instant>,
    /// Since when this worker has been spinning without work (the spin time metric).
    spin_from: Option<Instant>,
    c_p: u64,
    c_v: u64,
    split: Split,
    split_at: Instant,
    /// Last wake-up from sleep caused by host sockets only (layer-1 coalescing).
    last_io_wake: Option<Instant>,
    /// Bounded sleeps while this worker serves a VM guest (worker 0 only).
    vm_sleep: crate::vm::SleepBackoff,
    events: Vec<sys::EpollEvent>,
}

impl Poller {
    /// `c_p`, `c_v`: measured wake-up costs (ns) of a poller and of a guest thread.
    pub(crate) fn new(w: Arc<Worker>, cfg: &Config, c_p: u64, c_v: u64) -> Poller {
        let round_ns = round_cost_ns(&w.ep);
        let spin = SpinBudget::new(
            SPIN_TARGET.as_nanos() as u64,
            SPIN_MIN.as_nanos() as u64,
            SPIN_MAX.as_nanos() as u64,
            sleep_cost_ns(c_p, c_v),
        );
        let split = Split::compute(cfg.coalesce, c_p, c_v, 1);
        let p = Poller {
            w,
            cfg: cfg.clone(),
            mode: cfg.notify,
            spin,
            round_ns,
            idle_rounds: 0,
            idle_since: None,
            spin_from: None,
            c_p,
            c_v,
            split,
            split_at: Instant::now(),
            last_io_wake: None,
            vm_sleep: Default::default(),
            events: sys::empty_events(256),
        };
        WorkerStats::set(&p.w.stats.spin_ns, p.spin.budget_ns());
        p.publish_split();
        p
    }

    fn budget_rounds(&self) -> u32 {
        match (self.mode, self.cfg.spin) {
            (NotifyMode::Poll, _) => u32::MAX,
            (NotifyMode::Sleep, _) => 0,
            (NotifyMode::Hybrid, Some(r)) => r,
            (NotifyMode::Hybrid, None) => {
                (self.spin.budget_ns() / self.round_ns.max(1)).clamp(1, u32::MAX as u64) as u32
            }
        }
    }

    fn publish_split(&self) {
        let (st, s) = (&self.w.stats, &self.split);
        WorkerStats::set(&st.t_p_ns, s.t_p_ns);
        WorkerStats::set(&st.t_v_ns, s.t_v_ns);
        WorkerStats::set(&st.c_p_ns, s.c_p_ns);
        WorkerStats::set(&st.c_v_ns, s.c_v_ns);
        WorkerStats::set(&st.active, s.n as u64);
    }

    /// One round: wait (or sleep, per the mode and budget), take this worker's events,
    /// serve its guests. Events of other kinds (control, listener, signal) are pushed
    /// to `other` for the caller. `extra_deadline` bounds a sleep (idle exit).
    pub(crate) fn round(
        &mut self,
        other: &mut Vec<(u64, u32)>,
        extra_deadline: Option<Instant>,
    ) -> io::Result<()> {
        let w = self.w.clone();
        let sleeping = self.mode != NotifyMode::Poll && self.idle_rounds >= self.budget_rounds();
        let (timeout, has_vm) = if sleeping {
            let sh = w.lock();
            let has_vm = sh.guests.values().any(|g| g.needs_bounded_sleep());
            let mut t = prepare_sleep(&sh, &w, extra_deadline);
            // A doorbell VM kicks us through its eventfd; the tick only notices a guest
            // process that attached without access to the doorbell (§9.5).
            if t != 0
                && sh
                    .guests
                    .values()
                    .any(|g| g.doorbell.is_some() && g.gone.is_none())
            {
                t = if t < 0 {
                    DOORBELL_TICK_MS
                } else {
                    t.min(DOORBELL_TICK_MS)
                };
            }
            (t, has_vm)
        } else {
            (0, false)
        };
        if sleeping && timeout != 0 {
            // A sleep ends the spin (what follows is not spin time).
            self.spun_until(Instant::now());
        }
        let n = if timeout != 0 && has_vm {
            // A VM guest cannot kick us: sleep in bounded backoff (vm.rs).
            let ns = self.vm_sleep.next_sleep_ns(timeout);
            w.ep.wait_ns(&mut self.events, ns)?
        } else {
            w.ep.wait(&mut self.events, timeout)?
        };
        let mut sh = w.lock();
        if sleeping {
            for g in sh.guests.values().chain(sh.shadows.values()) {
                g.set_host_sleeping(0);
            }
            if timeout != 0 {
                WorkerStats::add(&w.stats.sleeps, 1);
                drop(sh);
                self.hold_io_wake(n);
                sh = w.lock();
            }
            self.idle_rounds = 0;
        }
        let mut work = n > 0;
        for ev in &self.events[..n] {
            let (tok, bits) = (ev.u64, ev.events);
            match token::ty(tok) {
                token::DOORBELL => {
                    let shard = &mut *sh;
                    let key = token::conn(tok);
                    if let Some(d) = shard.doorbells.get(&key) {
                        let k = sys::eventfd_read(d).unwrap_or(0);
                        WorkerStats::add(&w.stats.kicks, k);
                        // A doorbell VM's kicks arrive here too (its ivshmem vector).
                        if let Some(b) =
                            shard.guests.get_mut(&key).and_then(|g| g.doorbell.as_mut())
                        {
                            b.kicks += k;
                        }
                    }
                }
                token::SOCKET if sh.guests.contains_key(&token::conn(tok)) => {
                    if let Some(g) = sh.guests.get_mut(&token::conn(tok)) {
                        g.socket_event(tok, bits);
                    }
                }
                token::VRSS_DOORBELL => {
                    if let Some(d) = sh.vrss_doorbells.get(&token::conn(tok)) {
                        let k = sys::eventfd_read(d).unwrap_or(0);
                        WorkerStats::add(&w.stats.kicks, k);
                    }
                }
                token::SOCKET => {
                    if let Some(g) = sh.shadows.get_mut(&token::conn(tok)) {
                        g.socket_event(tok, bits);
                    }
                }
                token::POKE => {
                    let _ = sys::eventfd_read(&w.mbox.poke);
                }
                _ => other.push((tok, bits)),
            }
        }
        // Virtual RSS hand-offs, forwarded requests, freed entries, accepts.
        for m in w.mbox.take() {
            let Shard {
                guests, shadows, ..
            } = &mut *sh;
            work |= vrss::deliver(guests, shadows, &w.ep, w.id, m);
        }
        let now = Instant::now();
        if now.saturating_duration_since(self.split_at) >= SPLIT_EVERY {
            self.split_at = now;
            let active = sh
                .guests
                .values()
                .filter(|g| {
                    g.last_active
                        .is_some_and(|t| now.saturating_duration_since(t) < ACTIVE_FOR)
                })
                .count() as u32;
            self.split = Split::compute(self.cfg.coalesce, self.c_p, self.c_v, active);
            self.publish_split();
        }
        let window = Duration::from_nanos(self.split.t_v_ns);
        work |= serve_guests(&mut sh, &w, now, window);
        work |= serve_shadows(&mut sh, &w, now, window);
        {
            let Shard {
                guests, shadows, ..
            } = &mut *sh;
            work |= shortcut::run(&w.shortcut, w.id, guests, shadows, &w.ep);
            work |= crate::guest::dgram_route::deliver(&w.shortcut, w.id, guests);
            for g in guests.values_mut() {
                if !g.held_answers.is_empty() {
                    g.answer_held();
                }
                if !g.fast_waiting.is_empty() {
                    g.run_fast_waiting(&w.ep);
                }
            }
        }
        // A departing guest's sockets close and the guest is dropped in rounds that may
        // have no other work (a drain deadline's timeout). (`canal stat` counts the
        // sockets itself, under the shard's lock: a count here walked every table.)
        reap(&mut sh, &w);
        WorkerStats::set(&w.stats.guests, sh.guests.len() as u64);
        drop(sh);
        self.end_round(work, now);
        Ok(())
    }

    /// Layer-1 coalescing: a wake-up from sleep caused only by host sockets (no
    /// doorbell, control or signal) within T_p of the previous such wake-up holds the
    /// data until T_p has passed, so host-side wake-ups happen at most once per T_p.
    fn hold_io_wake(&mut self, n: usize) {
        if self.split.t_p_ns == 0 || n == 0 {
            return;
        }
        if self.events[..n]
            .iter()
            .any(|e| token::ty(e.u64) != token::SOCKET)
        {
            return;
        }
        let now = Instant::now();
        let t_p = Duration::from_nanos(self.split.t_p_ns);
        if let Some(last) = self.last_io_wake {
            let since = now.saturating_duration_since(last);
            if since < t_p {
                WorkerStats::add(&self.w.stats.holds, 1);
                std::thread::sleep(t_p - since);
            }
        }
        self.last_io_wake = Some(Instant::now());
    }

    /// The spin that began at `spin_from` ended (work came, or a sleep began).
    fn spun_until(&mut self, now: Instant) {
        if let Some(t) = self.spin_from.take() {
            let ns = now.saturating_duration_since(t).as_nanos() as u64;
            WorkerStats::add(&self.w.stats.spun_ns, ns);
        }
    }

    /// A round ended: with work, the idle period (if any) is over and its gap counts.
    fn end_round(&mut self, work: bool, now: Instant) {
        WorkerStats::add(&self.w.stats.rounds, 1);
        if work {
            self.spun_until(now);
        } else {
            self.spin_from.get_or_insert(now);
        }
        if work {
            self.vm_sleep.note_work();
            if let Some(t) = self.idle_since.take() {
                if self.mode == NotifyMode::Hybrid && self.cfg.spin.is_none() {
                    self.spin
                        .record(now.saturating_duration_since(t).as_nanos() as u64);
                    WorkerStats::set(&self.w.stats.spin_ns, self.spin.budget_ns());
                }
            }
            self.idle_rounds = 0;
        } else {
            self.idle_since.get_or_insert(now);
            self.idle_rounds = self.idle_rounds.saturating_add(1);
            if self.idle_rounds.is_multiple_of(YIELD_EVERY) {
                sys::sched_yield();
            }
        }
    }
}

/// Protocol §6, host side: publish "sleeping", fence, re-check every guest. Returns
/// the epoll timeout: 0 if work showed up, else until the next deadline (or -1).
fn prepare_sleep(sh: &Shard, w: &Worker, extra: Option<Instant>) -> i32 {
    let all = || sh.guests.values().chain(sh.shadows.values());
    for g in all() {
        if g.gone.is_none() {
            g.set_host_sleeping(1);
        }
    }
    fence(Ordering::SeqCst);
    if shortcut::has_work(&w.shortcut, w.id)
        || !w.mbox.is_empty()
        || all().any(|g| g.gone.is_none() && g.has_pending())
    {
        for g in all() {
            g.set_host_sleeping(0);
        }
        return 0;
    }
    let now = Instant::now();
    let until = all().filter_map(|g| g.next_deadline()).chain(extra).min();
    match until {
        None => -1,
        Some(t) => {
            let ms = t.saturating_duration_since(now).as_millis() + 1;
            ms.min(60_000) as i32
        }
    }
}

/// One scheduler round: the command class of every guest first (a short slice of
/// requests each), then every guest's data (receive, then transmit, within its byte
/// deficits), starting from a rotating guest.
fn serve_guests(sh: &mut Shard, w: &Worker, now: Instant, wake_window: Duration) -> bool {
    if sh.guests.is_empty() {
        return false;
    }
    let Shard {
        guests, rr, keys, ..
    } = sh;
    keys.clear();
    keys.extend(guests.keys().copied());
    let n = keys.len();
    *rr = rr.wrapping_add(1);
    let mut work = false;
    let mut wakes = 0;
    let (mut requests, mut bytes) = (0, 0);
    for i in 0..n {
        if let Some(g) = guests.get_mut(&keys[(*rr + i) % n]) {
            let before = g.wakes;
            let st = g.service_requests(&w.ep, now);
            work |= st.did_work();
            requests += st.requests as u64;
            wakes += g.wakes - before;
        }
    }
    for i in 0..n {
        if let Some(g) = guests.get_mut(&keys[(*rr + i) % n]) {
            g.wake_window = wake_window;
            let before = g.wakes;
            let st = g.service_data(&w.ep, now);
            work |= st.did_work();
            bytes += st.bytes;
            wakes += g.wakes - before;
        }
    }
    WorkerStats::add(&w.stats.wakes, wakes);
    if work {
        WorkerStats::add(&w.stats.requests, requests);
        WorkerStats::add(&w.stats.bytes, bytes);
    }
    work
}

/// A round over the guests' sockets this worker owns for other home workers
/// (virtual RSS): their data classes only — their requests reach the home.
fn serve_shadows(sh: &mut Shard, w: &Worker, now: Instant, wake_window: Duration) -> bool {
    let mut work = false;
    let mut wakes = 0;
    let mut bytes = 0;
    for g in sh.shadows.values_mut() {
        g.wake_window = wake_window;
        let before = g.wakes;
        let st = g.service_data(&w.ep, now);
        work |= st.did_work();
        bytes += st.bytes;
        wakes += g.wakes - before;
    }
    WorkerStats::add(&w.stats.wakes, wakes);
    if bytes > 0 {
        WorkerStats::add(&w.stats.bytes, bytes);
    }
    work
}

/// The keys of departed guests whose sockets are all closed (to be dropped; each
/// closing socket drains while its peer takes bytes, `guest::config::DRAIN_STALL`).
fn departed_and_done(guests: &BTreeMap<u32, Guest>) -> Vec<u32> {
    let mut done = Vec::new();
    for (k, g) in guests.iter() {
        if g.gone.is_some() && g.finished() {
            done.push(*k);
        }
    }
    done
}

/// Drops departed guests and vRSS shadows whose sockets are all closed (or whose drain
/// time ran out).
pub(crate) fn reap(sh: &mut Shard, w: &Worker) {
    let mut freed = false;
    for k in departed_and_done(&sh.guests) {
        if let Some(g) = sh.guests.remove(&k) {
            shortcut::forget(&w.shortcut, k);
            freed = true;
            // Its life's totals: all its sockets are freed by now, so an operator (and
            // the compat tests, for a client too quick for `canal stat`) can tell
            // whether a program's traffic went through canal.
            log::info!(
                "guest {} (pid {}, {:?}) freed (worker {}): {} requests ({} failed), {} bytes sent, {} received",
                g.id,
                g.pid,
                g.comm,
                w.id,
                g.served,
                g.failed,
                g.freed_bytes.0,
                g.freed_bytes.1
            );
        }
    }
    // vRSS shadows of guests homed elsewhere, in the same sweep.
    for k in departed_and_done(&sh.shadows) {
        sh.shadows.remove(&k);
        freed = true;
    }
    if freed {
        return_memory(sh.guests.is_empty());
    }
}

/// Gives the heap that departed guests' tables used back to the system (glibc keeps
/// freed memory otherwise: 200 guests that came and went left canald at ~70 MB). At
/// once when no guest is left, else at most once a second.
fn return_memory(idle: bool) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST_MS: AtomicU64 = AtomicU64::new(0);
    let now = crate::sys::monotonic_ms();
    let last = LAST_MS.load(Ordering::Relaxed);
    if idle || now.saturating_sub(last) >= 1000 {
        LAST_MS.store(now, Ordering::Relaxed);
        crate::sys::malloc_trim();
    }
}

/// Pins the calling thread to `cpu` (`--pin`).
pub(crate) fn pin(cpu: usize) -> io::Result<()> {
    sys::pin_to_cpu(cpu)
}

/// The loop of workers 1..N (worker 0 is the daemon's own loop).
pub(crate) fn run_worker(mut p: Poller, cpu: Option<usize>) {
    if let Some(c) = cpu {
        if let Err(e) = pin(c) {
            log::warn!("worker {}: cannot pin to CPU {c}: {e}", p.w.id);
        }
    }
    let mut other = Vec::new();
    while !p.w.stop.load(std::sync::atomic::Ordering::Relaxed) {
        if let Err(e) = p.round(&mut other, None) {
            log::error!("worker {}: {e}", p.w.id);
            break;
        }
        other.clear(); // only worker 0's epoll holds control descriptors
    }
}
