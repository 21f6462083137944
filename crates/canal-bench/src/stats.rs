//! Order statistics used for latencies (per sample) and for repetitions (per run).

/// Percentile of a sorted slice by linear interpolation between closest ranks
/// (`p` in 0..=100). Returns NaN for an empty slice.
pub(crate) fn percentile_sorted(v: &[f64], p: f64) -> f64 {
    percentile_of(v.len(), |i| v[i], p)
}

/// The same for integer samples (latencies in ns).
pub(crate) fn percentile_sorted_u64(v: &[u64], p: f64) -> f64 {
    percentile_of(v.len(), |i| v[i] as f64, p)
}

/// The percentile of `n` sorted values, value `i` being `at(i)`.
fn percentile_of(n: usize, at: impl Fn(usize) -> f64, p: f64) -> f64 {
    if n == 0 {
        return f64::NAN;
    }
    let rank = (p / 100.0).clamp(0.0, 1.0) * (n - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    at(lo) + (at(hi) - at(lo)) * (rank - lo as f64)
}

/// Median, spread and count of repeated measurements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Summary {
    pub(crate) n: usize,
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) p25: f64,
    pub(crate) p75: f64,
}

pub(crate) fn summarize(values: &[f64]) -> Option<Summary> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some(Summary {
        n: v.len(),
        median: percentile_sorted(&v, 50.0),
        min: v[0],
        max: v[v.len() - 1],
        p25: percentile_sorted(&v, 25.0),
        p75: percentile_sorted(&v, 75.0),
    })
}

/// CPU time (user + system) this process used so far, in seconds, all threads included.
pub(crate) fn self_cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes into the zeroed `rusage` we own; RUSAGE_SELF is valid.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile_sorted(&v, 50.0), 2.5);
        assert_eq!(percentile_sorted(&v, 0.0), 1.0);
        assert_eq!(percentile_sorted(&v, 100.0), 4.0);
        assert_eq!(percentile_sorted_u64(&[10, 20, 30], 50.0), 20.0);
        assert!(percentile_sorted(&[], 50.0).is_nan());
    }

    #[test]
    fn summary_ignores_nan_and_orders() {
        let s = summarize(&[3.0, f64::NAN, 1.0, 2.0]).unwrap();
        assert_eq!((s.n, s.median, s.min, s.max), (3, 2.0, 1.0, 3.0));
        assert!(summarize(&[f64::NAN]).is_none());
    }
}
