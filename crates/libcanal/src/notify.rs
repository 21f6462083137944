//! How a guest thread waits (`CANAL_NOTIFY=poll|sleep|hybrid`) and the adaptive spin
//! budget of the hybrid mode.
//!
//! The rule is canald's (`canald::engine::SpinBudget`, documented in
//! docs/architecture.md), kept per thread here: each wait records its *gap* (the time
//! from the start of the wait until the awaited change was seen, including a sleep);
//! every 4 gaps the budget T is re-chosen among {min, remembered gaps, max} to minimise
//! Σ (gap if gap ≤ T, else T + WAKE_COST) over the last 16 gaps. `CANAL_SPIN=N` fixes
//! the budget at N iterations instead.
use canal_abi::sync::Ordering;
use core::sync::atomic::AtomicBool;
use std::cell::RefCell;

/// How threads wait: canal-abi's mode, shared with canald's `--notify`.
pub(crate) use canal_abi::wait::NotifyMode as Mode;

/// Bounds of the hybrid budget and the cost charged for one sleep/wake-up (about what
/// waking a blocked thread on another vCPU costs on the small machines canal targets).
pub(crate) const MIN_NS: u64 = 1_000;
pub(crate) const MAX_NS: u64 = 100_000;
pub(crate) const WAKE_COST_NS: u64 = 30_000;
/// The budget a thread starts with.
pub(crate) const INITIAL_NS: u64 = 30_000;
const HISTORY: usize = 16;

struct Budget {
    hist: [u64; HISTORY],
    len: usize,
    pos: usize,
    since: usize,
    ns: u64,
}

impl Budget {
    const INIT: Budget = Budget {
        hist: [0; HISTORY],
        len: 0,
        pos: 0,
        since: 0,
        ns: INITIAL_NS,
    };

    fn cost(&self, t: u64) -> u64 {
        self.hist[..self.len].iter().fold(0u64, |a, &g| {
            a.saturating_add(if g <= t { g } else { t + WAKE_COST_NS })
        })
    }

    fn record(&mut self, gap: u64) {
        self.hist[self.pos] = gap;
        self.pos = (self.pos + 1) % HISTORY;
        self.len = (self.len + 1).min(HISTORY);
        self.since += 1;
        if self.since < 4 {
            return;
        }
        self.since = 0;
        let mut best = (self.cost(MIN_NS), MIN_NS);
        for i in 0..=self.len {
            let t = if i == self.len { MAX_NS } else { self.hist[i] };
            if t <= MIN_NS || t > MAX_NS {
                continue;
            }
            let c = self.cost(t);
            if c < best.0 || (c == best.0 && t < best.1) {
                best = (c, t);
            }
        }
        self.ns = best.1;
    }
}

thread_local! {
    static BUDGET: RefCell<Budget> = const { RefCell::new(Budget::INIT) };
}

/// How one process's threads wait, read from the environment at attach time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WaitSettings {
    /// `CANAL_NOTIFY`.
    pub(crate) mode: Mode,
    /// Iterations of a poll loop worth about 30 µs (or the fixed `CANAL_SPIN`).
    pub(crate) spin: u32,
    /// `CANAL_SPIN` fixed the budget (no adaptation).
    pub(crate) fixed_spin: bool,
}

/// Whether this guest's waits adapt (hybrid without a fixed `CANAL_SPIN`).
pub(crate) fn adaptive(w: &WaitSettings) -> bool {
    w.mode == Mode::Hybrid && !w.fixed_spin
}

/// Spin iterations before the calling thread sleeps.
pub(crate) fn spin_iters(w: &WaitSettings) -> u32 {
    match w.mode {
        Mode::Poll => u32::MAX,
        Mode::Sleep => 0,
        Mode::Hybrid if w.fixed_spin => w.spin,
        Mode::Hybrid => {
            let ns = BUDGET
                .try_with(|b| b.try_borrow().map(|b| b.ns).unwrap_or(INITIAL_NS))
                .unwrap_or(INITIAL_NS);
            // `spin` iterations take about 30 µs (calibrated at attach).
            ((ns as u128 * w.spin as u128) / 30_000).clamp(1, u32::MAX as u128) as u32
        }
    }
}

/// The calling thread's adaptive budget in nanoseconds, for waits that bound their
/// spinning by time rather than by counted iterations (an epoll wait's round scans
/// every watched socket, so its cost per round depends on the interest list); None
/// when the budget is not adaptive (poll, sleep, or a fixed `CANAL_SPIN`).
pub(crate) fn adaptive_ns(w: &WaitSettings) -> Option<u64> {
    if !adaptive(w) {
        return None;
    }
    Some(
        BUDGET
            .try_with(|b| b.try_borrow().map(|b| b.ns).unwrap_or(INITIAL_NS))
            .unwrap_or(INITIAL_NS),
    )
}

/// About how long `spins` spin iterations take (`w.spin` iterations ≈ 30 µs, calibrated
/// at attach): a wait answered within its first spins records its gap from this instead
/// of reading the clock twice.
pub(crate) fn spins_ns(w: &WaitSettings, spins: u32) -> i64 {
    (spins as i64 * 30_000) / (w.spin.max(1) as i64)
}

/// Spins after which a hybrid wait starts its clock (`spins_ns` covers the spins before).
pub(crate) const CLOCK_AFTER: u32 = 128;

/// Records one wait's gap (ns) for the calling thread's budget.
pub(crate) fn record(w: &WaitSettings, gap_ns: i64) {
    if !adaptive(w) {
        return;
    }
    let _ = BUDGET.try_with(|b| {
        if let Ok(mut b) = b.try_borrow_mut() {
            b.record(gap_ns.max(0) as u64);
        }
    });
}

/// Records a wait's gap. A slept wait records its gap less the wake-up's own latency:
/// its end is the wake-up, which comes WAKE_COST_NS or more after the event, and
/// charging that to the gap makes sleeping look right because it was chosen — two
/// parties of a request/response exchange then each wait out the other's wake-up and
/// settle on sleeping (measured: docs/bench/why.md, "Slept-gap discount").
///
/// The discount makes the thread spin more, which is free only when nobody else wants
/// its core. Short-circuited peers are canal guests whose own waits yield (so the
/// discount always applies in a process that has such connections); a process whose
/// peers are all behind canald gets it only while the thread is not being preempted
/// (`core_free`): with canald and a native peer queued behind it on two cores, the
/// extra spinning took the core they needed.
pub(crate) fn record_wait(w: &WaitSettings, gap_ns: i64, slept: bool) {
    let floor = adaptive_ns(w).unwrap_or(0) as i64;
    let discount = slept && (crate::notify::segment_mapped() || core_free::now());
    record(w, slept_gap(gap_ns, discount, floor));
}

/// Whether the calling thread's core is free of other work: it was not preempted
/// (no involuntary context switch) during the last PERIOD_NS. Asked only for slept
/// waits, and the kernel at most once per period (one getrusage).
mod core_free {
    use crate::sys;
    use core::cell::Cell;
    const PERIOD_NS: i64 = 20_000_000;
    thread_local! {
        /// (when last asked, preemptions then, the verdict since)
        static STATE: Cell<(i64, u64, bool)> = const { Cell::new((0, 0, false)) };
    }
    pub(crate) fn now() -> bool {
        STATE
            .try_with(|s| {
                let (at, count, free) = s.get();
                let t = sys::now_ns();
                if at != 0 && t - at < PERIOD_NS {
                    return free;
                }
                let Some(c) = sys::thread_preemptions() else {
                    return false;
                };
                // The first look has no earlier count to compare: not free yet.
                let free = at != 0 && super::uncontended(count, c);
                s.set((t, c, free));
                free
            })
            .unwrap_or(false)
    }
}

/// No preemption between two counts of the thread's involuntary context switches.
fn uncontended(before: u64, after: u64) -> bool {
    after == before
}

/// The gap to record: less WAKE_COST_NS if `discount` (a slept wait), but never below
/// `floor` (the spin budget it waited out before sleeping).
fn slept_gap(gap_ns: i64, discount: bool, floor: i64) -> i64 {
    if discount {
        (gap_ns - WAKE_COST_NS as i64).max(floor)
    } else {
        gap_ns
    }
}

/// Spinning in poll mode yields the core this often (iterations), so a guest and the
/// poller can share one core without livelock, and checks that canald still lives.
pub(crate) const POLL_YIELD_EVERY: u32 = 1024;

/// Set once this process mapped a pair segment (`crate::shortcut::seg::get` succeeded): until then no
/// socket can have a sleeper word for `SegSleepers` to count.
pub(crate) static SEGMENT_MAPPED: AtomicBool = AtomicBool::new(false);

/// Whether this process has short-circuited connections (another guest is its peer).
pub(crate) fn segment_mapped() -> bool {
    SEGMENT_MAPPED.load(Ordering::Relaxed)
}

pub(crate) fn note_segment_mapped() {
    if !SEGMENT_MAPPED.load(Ordering::Relaxed) {
        SEGMENT_MAPPED.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slept_gap_is_discounted_by_the_wake_up_but_not_below_the_spin() {
        assert_eq!(slept_gap(80_000, false, 10_000), 80_000);
        assert_eq!(slept_gap(80_000, true, 10_000), 50_000);
        assert_eq!(slept_gap(35_000, true, 10_000), 10_000);
        // A pair that sleeps because the other sleeps: 20 µs of work behind a 40 µs
        // wake-up each time. The raw gaps keep the budget at the minimum (sleep); the
        // discounted ones bring it up to spinning through the work.
        let (mut raw, mut fixed) = (Budget::INIT, Budget::INIT);
        raw.ns = MIN_NS;
        fixed.ns = MIN_NS;
        for _ in 0..16 {
            raw.record(slept_gap(60_000, false, MIN_NS as i64) as u64);
            fixed.record(slept_gap(60_000, true, MIN_NS as i64) as u64);
        }
        assert_eq!(raw.ns, MIN_NS);
        assert_eq!(fixed.ns, 30_000);
    }

    /// Pins the calling thread to CPU 0; false if the kernel refuses.
    fn pin_to_cpu0() -> bool {
        // SAFETY: an all-zero cpu_set_t is the empty set; CPU_SET and
        // sched_setaffinity only read and write that local value and the calling
        // thread's affinity.
        unsafe {
            let mut set: libc::cpu_set_t = core::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            libc::sched_setaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }

    #[test]
    fn a_preempted_thread_keeps_the_raw_gap() {
        assert!(uncontended(7, 7));
        assert!(!uncontended(7, 8));
        // The kernel counts this thread's preemptions: a thread that spins on the
        // only core it may use while another thread wants it gets preempted.
        let before = crate::sys::thread_preemptions().expect("getrusage(RUSAGE_THREAD)");
        assert!(pin_to_cpu0(), "sched_setaffinity(CPU 0)");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let rival = std::thread::spawn(move || {
            pin_to_cpu0();
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                core::hint::spin_loop();
            }
        });
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_millis(200) {
            core::hint::spin_loop();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        rival.join().unwrap();
        let after = crate::sys::thread_preemptions().unwrap();
        assert!(
            !uncontended(before, after),
            "spinning beside a rival on one core: {before} → {after}"
        );
    }

    #[test]
    fn grows_for_near_misses_and_shrinks_for_long_gaps() {
        let mut b = Budget::INIT;
        // Work comes 20 µs into each wait: spinning through it beats a 30 µs wake-up.
        for _ in 0..8 {
            b.record(20_000);
        }
        assert_eq!(b.ns, 20_000);
        for _ in 0..16 {
            b.record(10_000_000);
        }
        assert_eq!(b.ns, MIN_NS);
        for _ in 0..16 {
            b.record(500_000); // beyond MAX: a wake-up each time is cheapest
        }
        assert_eq!(b.ns, MIN_NS);
    }
}
