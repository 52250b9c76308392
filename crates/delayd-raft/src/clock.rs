//! The node's wall clock.
//!
//! Wall time only stamps entries (when a job comes due, when a lease ends) and tells the
//! timer pump how long to sleep; Raft's heartbeats, elections and leases, and every request
//! deadline, run on tokio's monotonic clock and never see it. The state machine never lets
//! replicated time run backwards, whatever a new leader's clock says.
//!
//! Chaos tests need a node whose clock is wrong by seconds, and a time namespace cannot move
//! wall-clock time. So the clock carries an offset, zero unless a test sets it through
//! `/debug/clock`, which exists only when the node was started with `--debug-clock`.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The real wall clock in unix ms, with no offset.
pub fn wall_ms() -> u64 {
    wall_us() / 1000
}

fn wall_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// A node's clock: the wall clock plus a test-only offset. Cheap to clone; clones share the
/// offset.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    offset_ms: Arc<AtomicI64>,
}

impl Clock {
    /// Now, in unix ms.
    pub fn now_ms(&self) -> u64 {
        self.now_us() / 1000
    }

    /// Now, in unix µs (the pump sleeps to the microsecond).
    pub fn now_us(&self) -> u64 {
        let offset_us = self.offset_ms().saturating_mul(1000);
        wall_us().saturating_add_signed(offset_us)
    }

    /// The offset applied to the wall clock, in ms.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }

    /// Shifts this clock by `offset_ms` from the wall clock (not from its current offset).
    pub fn set_offset_ms(&self, offset_ms: i64) {
        self.offset_ms.store(offset_ms, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_shifts_the_clock_both_ways_and_resets() {
        let clock = Clock::default();
        let shared = clock.clone();
        let base = wall_ms();
        shared.set_offset_ms(5_000);
        assert!(clock.now_ms() >= base + 5_000);
        clock.set_offset_ms(-5_000);
        assert!(clock.now_ms() + 4_000 < wall_ms());
        clock.set_offset_ms(0);
        let now = clock.now_ms();
        assert!(now >= base && now <= wall_ms());
    }
}
