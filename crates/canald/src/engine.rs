//! The exitless engine's policies: notification modes, the adaptive spin budget, the
//! two-layer coalescing split and the per-worker counters shown by `canal stat`.
//!
//! Nothing here touches guest memory; the poller loop (`daemon`) and the guest service
//! round (`guest`) consult these values.
#![forbid(unsafe_code)]

use crate::sys::{self, Epoll};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) use canal_abi::wait::NotifyMode;

/// Waits remembered by the adaptive budget.
pub(crate) const HISTORY: usize = 16;

/// The adaptive spin budget (a ski-rental rule over a short history).
///
/// Every idle period ends when work arrives; its *gap* is the time from the start of
/// the idle period to that arrival (if the waiter slept, the time until it was woken).
/// The last [`HISTORY`] gaps are kept. Every 4 recorded gaps the budget T is chosen
/// among {min, each remembered gap within [min, max], max} to minimise the cost the
/// history would have had under it:
///
/// ```text
///   cost(T) = Σ  gap            if gap ≤ T   (spun until the work came: no wake-up)
///             Σ  T + wake_cost  if gap > T   (spun T for nothing, then paid a wake-up)
/// ```
///
/// So the budget grows when work tends to arrive shortly after the waiter would have
/// slept (a wake-up would cost more than spinning through the gap) and shrinks to `min`
/// when spinning rarely pays (the gaps are much longer than `wake_cost`). Ties choose
/// the smaller T. `libcanal` applies the same rule per guest thread.
#[derive(Clone, Debug)]
pub(crate) struct SpinBudget {
    hist: [u64; HISTORY],
    len: usize,
    pos: usize,
    since: usize,
    budget_ns: u64,
    pub(crate) min_ns: u64,
    pub(crate) max_ns: u64,
    pub(crate) wake_cost_ns: u64,
}

impl SpinBudget {
    pub(crate) fn new(initial_ns: u64, min_ns: u64, max_ns: u64, wake_cost_ns: u64) -> SpinBudget {
        SpinBudget {
            hist: [0; HISTORY],
            len: 0,
            pos: 0,
            since: 0,
            budget_ns: initial_ns.clamp(min_ns, max_ns),
            min_ns,
            max_ns,
            wake_cost_ns,
        }
    }

    pub(crate) fn budget_ns(&self) -> u64 {
        self.budget_ns
    }

    /// Records one idle period's gap; re-chooses the budget every 4 records.
    pub(crate) fn record(&mut self, gap_ns: u64) {
        self.hist[self.pos] = gap_ns;
        self.pos = (self.pos + 1) % HISTORY;
        self.len = (self.len + 1).min(HISTORY);
        self.since += 1;
        if self.since >= 4 {
            self.since = 0;
            self.budget_ns = self.choose();
        }
    }

    fn cost(&self, t: u64) -> u64 {
        self.hist[..self.len]
            .iter()
            .map(|&g| {
                if g <= t {
                    g
                } else {
                    t.saturating_add(self.wake_cost_ns)
                }
            })
            .fold(0u64, |a, c| a.saturating_add(c))
    }

    fn choose(&self) -> u64 {
        let mut best = (self.cost(self.min_ns), self.min_ns);
        let cands = self.hist[..self.len]
            .iter()
            .copied()
            .filter(|&g| g > self.min_ns && g <= self.max_ns)
            .chain(std::iter::once(self.max_ns));
        for t in cands {
            let c = self.cost(t);
            if c < best.0 || (c == best.0 && t < best.1) {
                best = (c, t);
            }
        }
        best.1
    }
}

/// Host → guest wake-up coalescing (`--coalesce`, `--t-worst-us`, `--split-us`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum CoalesceCfg {
    Off,
    /// Adaptive split of `t_worst`: T_p = T_worst / (1 + sqrt(C_v/C_p)·sqrt(n)).
    Adaptive {
        t_worst: Duration,
    },
    /// A fixed host share T_p (ablation, B9).
    Fixed {
        t_worst: Duration,
        t_p: Duration,
    },
}

/// The two-layer split now in force.
///
/// Layer 1 (host, T_p): a poller woken from sleep only by host-socket readiness holds
/// that data until T_p has passed since its previous such wake-up, so host-side
/// wake-ups happen at most once per T_p. Layer 2 (guest, T_v = T_worst - T_p): each
/// guest gets at most one eventfd wake-up per T_v; later ones in the window are
/// deferred to its end (the sleepers still sleeping then are woken once). A message's
/// wake-up is delayed by at most T_p + T_v = T_worst.
///
/// Cost per unit time ≈ C_p/T_p + n·C_v/T_v; minimising it under T_p + T_v = T_worst
/// gives T_v/T_p = sqrt(n·C_v/C_p), the formula above.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Split {
    pub(crate) t_worst_ns: u64,
    pub(crate) t_p_ns: u64,
    pub(crate) t_v_ns: u64,
    pub(crate) c_p_ns: u64,
    pub(crate) c_v_ns: u64,
    pub(crate) n: u32,
}

impl Split {
    pub(crate) fn compute(cfg: CoalesceCfg, c_p_ns: u64, c_v_ns: u64, n: u32) -> Split {
        let n = n.max(1);
        let (t_worst, t_p) = match cfg {
            CoalesceCfg::Off => (0, 0),
            CoalesceCfg::Fixed { t_worst, t_p } => {
                let w = t_worst.as_nanos() as u64;
                (w, (t_p.as_nanos() as u64).min(w))
            }
            CoalesceCfg::Adaptive { t_worst } => {
                let w = t_worst.as_nanos() as u64;
                let r = (c_v_ns.max(1) as f64 / c_p_ns.max(1) as f64).sqrt() * (n as f64).sqrt();
                (w, (w as f64 / (1.0 + r)) as u64)
            }
        };
        Split {
            t_worst_ns: t_worst,
            t_p_ns: t_p,
            t_v_ns: t_worst - t_p,
            c_p_ns,
            c_v_ns,
            n,
        }
    }
}

/// Counters of one poller (worker), shared with the STAT handler.
#[derive(Default, Debug)]
pub(crate) struct WorkerStats {
    pub(crate) rounds: AtomicU64,
    pub(crate) sleeps: AtomicU64,
    /// Eventfd wake-ups written to guest slots.
    pub(crate) wakes: AtomicU64,
    /// Doorbell kicks received (eventfd counts read).
    pub(crate) kicks: AtomicU64,
    /// Host-side holds (layer 1 coalescing).
    pub(crate) holds: AtomicU64,
    pub(crate) spin_ns: AtomicU64,
    /// Time spent spinning without work, in total (a sleep ends a spin).
    pub(crate) spun_ns: AtomicU64,
    /// Requests taken from guests' queues, and bytes moved for them (data rounds).
    pub(crate) requests: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) t_p_ns: AtomicU64,
    pub(crate) t_v_ns: AtomicU64,
    pub(crate) c_p_ns: AtomicU64,
    pub(crate) c_v_ns: AtomicU64,
    pub(crate) active: AtomicU64,
    pub(crate) guests: AtomicU64,
}

impl WorkerStats {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn set(c: &AtomicU64, n: u64) {
        c.store(n, Ordering::Relaxed);
    }
    pub(crate) fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// Median time from an eventfd write to a thread blocked on it running again, in
/// nanoseconds: with `epoll` true the thread waits in epoll_wait (how the poller
/// sleeps: C_p), else in poll() (how a guest thread sleeps: C_v). Takes a few ms.
pub(crate) fn measure_wake_ns(epoll: bool) -> u64 {
    let Ok(efd) = sys::eventfd() else {
        return 20_000;
    };
    let efd = Arc::new(efd);
    let woke = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let base = Instant::now();
    let (e2, w2, s2) = (efd.clone(), woke.clone(), stop.clone());
    let t = std::thread::spawn(move || {
        let ep = Epoll::new().ok();
        if let Some(ep) = &ep {
            let _ = ep.add(e2.as_raw_fd(), sys::EP_IN, 1);
        }
        let mut ev = sys::empty_events(1);
        while !s2.load(Ordering::Relaxed) {
            match (&ep, epoll) {
                (Some(ep), true) => {
                    let _ = ep.wait(&mut ev, 100);
                }
                _ => {
                    let _ = sys::poll_in(&e2, 100);
                }
            }
            if sys::eventfd_read(&e2).unwrap_or(0) > 0 {
                w2.store(base.elapsed().as_nanos() as u64, Ordering::Release);
            }
        }
    });
    let mut samples = Vec::new();
    for _ in 0..15 {
        std::thread::sleep(Duration::from_micros(300));
        woke.store(0, Ordering::Relaxed);
        let t0 = base.elapsed().as_nanos() as u64;
        if sys::eventfd_write(efd.as_raw_fd()).is_err() {
            break;
        }
        let deadline = Instant::now() + Duration::from_millis(50);
        loop {
            let w = woke.load(Ordering::Acquire);
            if w != 0 {
                samples.push(w.saturating_sub(t0));
                break;
            }
            if Instant::now() > deadline {
                break;
            }
            std::thread::yield_now();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = sys::eventfd_write(efd.as_raw_fd());
    let _ = t.join();
    samples.sort_unstable();
    samples
        .get(samples.len() / 2)
        .copied()
        .unwrap_or(20_000)
        .clamp(500, 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_grows_when_work_comes_just_after() {
        // Work always arrives 40 µs into the idle period; a wake-up costs 50 µs: spinning
        // 40 µs beats spinning 1 µs then paying a wake.
        let mut b = SpinBudget::new(10_000, 1_000, 200_000, 50_000);
        for _ in 0..8 {
            b.record(40_000);
        }
        assert_eq!(b.budget_ns(), 40_000);
    }

    #[test]
    fn budget_shrinks_when_spinning_rarely_pays() {
        let mut b = SpinBudget::new(100_000, 1_000, 200_000, 30_000);
        for _ in 0..16 {
            b.record(5_000_000); // work comes 5 ms later: spinning never pays
        }
        assert_eq!(b.budget_ns(), 1_000);
        // A mix: 3 of 4 gaps are short (2 µs) — spinning 2 µs catches them.
        for i in 0..16 {
            b.record(if i % 4 == 0 { 5_000_000 } else { 2_000 });
        }
        assert_eq!(b.budget_ns(), 2_000);
    }

    #[test]
    fn budget_respects_bounds() {
        let mut b = SpinBudget::new(0, 1_000, 50_000, 1_000_000);
        assert_eq!(b.budget_ns(), 1_000);
        for _ in 0..16 {
            b.record(80_000); // beyond max: spinning up to max never catches it
        }
        assert_eq!(b.budget_ns(), 1_000);
        for _ in 0..16 {
            b.record(45_000); // within max and cheaper than a wake-up
        }
        assert_eq!(b.budget_ns(), 45_000);
    }

    #[test]
    fn split_formula() {
        let w = Duration::from_micros(100);
        let s = Split::compute(CoalesceCfg::Adaptive { t_worst: w }, 10_000, 10_000, 1);
        assert_eq!(s.t_p_ns, 50_000);
        assert_eq!(s.t_v_ns, 50_000);
        // n = 4, C_v = C_p: T_p = T / (1 + 2).
        let s = Split::compute(CoalesceCfg::Adaptive { t_worst: w }, 10_000, 10_000, 4);
        assert_eq!(s.t_p_ns, 33_333);
        assert_eq!(s.t_p_ns + s.t_v_ns, 100_000);
        // Costlier guest wake-ups push the window to the guest side.
        let s = Split::compute(CoalesceCfg::Adaptive { t_worst: w }, 10_000, 40_000, 1);
        assert_eq!(s.t_p_ns, 33_333);
        let s = Split::compute(
            CoalesceCfg::Fixed {
                t_worst: w,
                t_p: Duration::from_micros(150),
            },
            1,
            1,
            1,
        );
        assert_eq!((s.t_p_ns, s.t_v_ns), (100_000, 0));
        assert_eq!(Split::compute(CoalesceCfg::Off, 1, 1, 3).t_worst_ns, 0);
    }

    #[test]
    fn wake_cost_measures_something() {
        let v = measure_wake_ns(false);
        let p = measure_wake_ns(true);
        assert!((500..=1_000_000).contains(&v) && (500..=1_000_000).contains(&p));
    }
}
