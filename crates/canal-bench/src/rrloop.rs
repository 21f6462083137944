//! The timed request-response loop of the generators (`gen` over streams, `udpgen`
//! over datagrams): warm-up, one round trip at a time until the time or count runs
//! out, and the client's `RESULT` line.
use crate::stats::{percentile_sorted_u64, self_cpu_seconds};
use std::io;
use std::time::Instant;

/// Runs `one(seq)` (one checked round trip of `size` bytes) `warmup` times, then until
/// `max` round trips or `deadline`; returns the RESULT line. `cpu0`: the client's CPU
/// seconds when its connection was made.
pub(crate) fn run(
    size: usize,
    warmup: u64,
    max: u64,
    deadline: Option<Instant>,
    cpu0: f64,
    mut one: impl FnMut(u64) -> io::Result<()>,
) -> io::Result<String> {
    let mut seq = 0u64;
    for _ in 0..warmup {
        one(seq)?;
        seq += 1;
    }
    let mut lat: Vec<u64> = Vec::with_capacity(1 << 16);
    let start = Instant::now();
    while (lat.len() as u64) < max {
        let t0 = Instant::now();
        one(seq)?;
        let t1 = Instant::now();
        seq += 1;
        lat.push((t1 - t0).as_nanos() as u64);
        if deadline.is_some_and(|d| t1 >= d) || lat.len() >= 50_000_000 {
            break;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let n = lat.len() as u64;
    let mean = lat.iter().sum::<u64>() as f64 / n.max(1) as f64;
    lat.sort_unstable();
    let pct = |p: f64| percentile_sorted_u64(&lat, p);
    Ok(format!(
        "RESULT role=client mode=rr size={size} msgs={n} bytes={} elapsed_s={elapsed:.6} \
         p50_ns={:.0} p99_ns={:.0} mean_ns={mean:.0} min_ns={} max_ns={} cpu_s={:.6}",
        n * 2 * size as u64,
        pct(50.0),
        pct(99.0),
        lat.first().copied().unwrap_or(0),
        lat.last().copied().unwrap_or(0),
        self_cpu_seconds() - cpu0,
    ))
}
