//! Requests per second: a token bucket holding at most one second's worth. Namespace tokens'
//! rate limits (`service/auth.rs`) and webhooks' `rate_per_s` (`push.rs`) both count with it.

use std::time::{Duration, Instant};

/// A token bucket. A fresh one starts full, so a new budget gets its whole first second.
#[derive(Default)]
pub(crate) struct Bucket {
    tokens: f64,
    last: Option<Instant>,
}

impl Bucket {
    /// Refills at `per_second` since the last look, up to one second's worth.
    fn refill(&mut self, per_second: u32, now: Instant) {
        let rate = f64::from(per_second);
        self.tokens = match self.last {
            None => rate,
            Some(last) => (self.tokens + now.duration_since(last).as_secs_f64() * rate).min(rate),
        };
        self.last = Some(now);
    }

    /// Takes one request from the budget; false when it is spent.
    pub(crate) fn take(&mut self, per_second: u32, now: Instant) -> bool {
        self.take_up_to(1, per_second, now) == 1
    }

    /// Takes up to `want` whole requests from the budget; how many it took.
    pub(crate) fn take_up_to(&mut self, want: usize, per_second: u32, now: Instant) -> usize {
        self.refill(per_second, now);
        let n = (self.tokens.max(0.0).floor() as usize).min(want);
        self.tokens -= n as f64;
        n
    }

    /// How long until one whole request is in the budget again.
    pub(crate) fn until_one(&self, per_second: u32) -> Duration {
        let missing = (1.0 - self.tokens).max(0.0);
        Duration::from_secs_f64(missing / f64::from(per_second.max(1)))
    }

    /// Returns requests taken but not made.
    pub(crate) fn give_back(&mut self, n: usize, per_second: u32) {
        self.tokens = (self.tokens + n as f64).min(f64::from(per_second));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_rate_and_refills() {
        let mut b = Bucket::default();
        let t0 = Instant::now();
        let burst = (0..10).filter(|_| b.take(5, t0)).count();
        assert_eq!(burst, 5, "a fresh bucket holds one second of requests");
        assert!(!b.take(5, t0 + Duration::from_millis(100)), "0.5 of a request refilled");
        assert!(b.take(5, t0 + Duration::from_millis(250)), "a whole one after 200 ms");
        let later = t0 + Duration::from_secs(60);
        let burst = (0..10).filter(|_| b.take(5, later)).count();
        assert_eq!(burst, 5, "never more than one second's worth");
    }

    #[test]
    fn several_are_taken_at_once_and_unused_ones_come_back() {
        let mut b = Bucket::default();
        let t0 = Instant::now();
        assert_eq!(b.take_up_to(8, 5, t0), 5);
        assert_eq!(b.take_up_to(8, 5, t0), 0);
        assert_eq!(b.until_one(5), Duration::from_millis(200));
        b.give_back(2, 5);
        assert_eq!(b.take_up_to(8, 5, t0), 2);
    }
}
