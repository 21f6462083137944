//! A guest's quotas in force: the destination policy and the counters every holder of
//! the guest's view shares (its workers, a network's seccomp service), and the rate
//! buckets its home worker keeps. Every quota hit is counted (`canal stat`, metrics)
//! and logged, at most once per guest and kind every LOG_EVERY.
#![forbid(unsafe_code)]

use super::bucket::Bucket;
use super::rules::DestPolicy;
use super::table::Limits;
use canal_abi::CanalAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const LOG_EVERY: Duration = Duration::from_secs(10);

/// What a quota stopped or slowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hit {
    /// A destination outside allow, or inside deny: EPERM.
    Denied = 0,
    /// A connect waited for the connection rate.
    ConnectRate = 1,
    /// Requests waited for the request rate.
    RequestRate = 2,
    /// A WATCH refused: the guest's descriptors in canald are at its quota.
    Watch = 3,
}

impl Hit {
    fn what(self) -> &'static str {
        match self {
            Hit::Denied => "a destination refused by its policy (EPERM)",
            Hit::ConnectRate => "over its connection rate: connects wait",
            Hit::RequestRate => "over its request rate: requests wait",
            Hit::Watch => {
                "at its descriptor quota: a WATCH refused (that socket closes by request; \
                 a process killed without its hooks leaves it open until the guest leaves)"
            }
        }
    }
}

/// The shared part: policy and counters.
#[derive(Debug, Default)]
pub struct GuestPolicy {
    /// Who, for log lines ("guest 3 (pid 77 nginx)").
    pub label: String,
    pub dest: Option<DestPolicy>,
    hits: [AtomicU64; 4],
    /// When each kind was last logged (ms since `born`; 0: never).
    logged: [AtomicU64; 4],
    born: Option<Instant>,
}

impl GuestPolicy {
    pub fn new(label: String, limits: &Limits) -> GuestPolicy {
        GuestPolicy {
            label,
            dest: limits.policy(),
            born: Some(Instant::now()),
            ..Default::default()
        }
    }

    /// Whether `a` (a host address) may be reached; counts and logs a refusal.
    pub fn admits(&self, a: &CanalAddr) -> bool {
        let ok = self.dest.as_ref().is_none_or(|p| p.allows(a));
        if !ok {
            self.hit(Hit::Denied);
        }
        ok
    }

    /// Counts a hit and logs it unless this kind was logged within LOG_EVERY.
    pub fn hit(&self, h: Hit) {
        let i = h as usize;
        let n = self.hits[i].fetch_add(1, Ordering::Relaxed) + 1;
        let now_ms = self
            .born
            .map_or(0, |b| b.elapsed().as_millis() as u64)
            .max(1);
        let last = self.logged[i].load(Ordering::Relaxed);
        if (last == 0 || now_ms.saturating_sub(last) >= LOG_EVERY.as_millis() as u64)
            && self.logged[i]
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            log::warn!("{}: {} ({n} so far)", self.label, h.what());
        }
    }

    /// (denied, connect waits, request waits, watches refused).
    pub fn hits(&self) -> [u64; 4] {
        [0, 1, 2, 3].map(|i| self.hits[i].load(Ordering::Relaxed))
    }
}

/// The home worker's part: rate buckets, and the connects waiting for a token.
#[derive(Default)]
pub(crate) struct Rates {
    pub connect: Option<Bucket>,
    pub requests: Option<Bucket>,
    /// Connect requests (slot index, request) waiting for the connection rate, in
    /// arrival order. At most one per slot: bounded by the slot count.
    pub(crate) held: std::collections::VecDeque<(u32, crate::request::Request)>,
    /// Nothing more until then (a bucket is empty); None: not throttled.
    pub until: Option<Instant>,
}

impl Rates {
    pub fn new(limits: &Limits, now: Instant) -> Rates {
        let bucket = |r: Option<u32>| r.filter(|r| *r > 0).map(|r| Bucket::new(r, now));
        Rates {
            connect: bucket(limits.connect_rate),
            requests: bucket(limits.request_rate),
            ..Default::default()
        }
    }

    /// Throttled now (its queue is not work until `until`).
    pub fn throttled(&self) -> bool {
        self.until.is_some_and(|t| t > Instant::now())
    }

    /// Notes that nothing more can be done before `at`.
    pub fn wait_until(&mut self, at: Instant) {
        self.until = Some(self.until.map_or(at, |u| u.min(at)));
    }
}
