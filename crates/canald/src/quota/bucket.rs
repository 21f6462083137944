//! A token bucket: `rate` per second, at most one second's worth banked.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct Bucket {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// Full at start: a guest may do one second's worth at once.
    pub fn new(rate_per_sec: u32, now: Instant) -> Bucket {
        let rate = f64::from(rate_per_sec.max(1));
        Bucket {
            rate,
            tokens: rate,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate).min(self.rate);
        self.last = now;
    }

    /// Takes a token if there is one; else how long until there is.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }

    /// Whether a token is there (none is taken); else how long until there is.
    pub fn ready(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= 1.0 {
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_and_burst() {
        let t0 = Instant::now();
        let mut b = Bucket::new(10, t0);
        for _ in 0..10 {
            assert!(b.take(t0).is_ok());
        }
        let wait = b.take(t0).unwrap_err();
        assert!(
            wait > Duration::from_millis(99) && wait <= Duration::from_millis(100),
            "{wait:?}"
        );
        assert!(b.ready(t0 + Duration::from_millis(50)).is_err());
        assert!(b.take(t0 + Duration::from_millis(100)).is_ok());
        // At most one second banked, however long it was idle.
        let later = t0 + Duration::from_secs(60);
        let n = (0..100).take_while(|_| b.take(later).is_ok()).count();
        assert_eq!(n, 10);
    }
}
