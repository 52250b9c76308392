//! # delayd-percentiles: how delayd's measuring tools summarise latencies
//!
//! The benchmark suite (`delayd-bench`), the in-process latency example of `delayd-server`,
//! the chaos harness (`delayd-jepsen`) and the end-to-end tests all report p50 / p99 / p99.9
//! / max the same way, through this crate:
//!
//! - **Recording** goes into an HDR histogram ([`hdrhistogram`]) with
//!   [`SIGNIFICANT_DIGITS`] = 3 significant digits. It keeps a count per bucket instead of
//!   every sample, so a run of millions of jobs costs a few tens of kilobytes, and tallies of
//!   concurrent workers merge exactly ([`Recorder::merge`]).
//! - **Reading** is by nearest rank: the `p`-th percentile of `n` values is the value at rank
//!   `ceil(p × n)` (1-based, at least 1) in ascending order, computed with integer
//!   arithmetic. It is an observed value, never an interpolation, so p99.9 of fewer than
//!   1,000 values is the maximum.
//! - **Precision**: a bucket holds values that agree to 3 significant digits. Values below
//!   2,048 (in the unit recorded) have a bucket each and are reported exactly; above that a
//!   percentile is the highest value of its bucket, at most 1/1,024 (under 0.1 %) above the
//!   value at that rank, and never above the largest value recorded. The maximum itself is
//!   exact.
//!
//! [`Recorder`] takes non-negative integers in whatever unit the caller picks (the chaos
//! harness: whole milliseconds). [`MillisRecorder`] takes clock readings in fractional
//! milliseconds and records them in microseconds, so sub-millisecond latencies keep their
//! detail (exact below 2.048 ms); lateness can be negative (an early delivery), and such
//! values are counted apart and recorded as 0.

use hdrhistogram::Histogram;

/// Significant decimal digits every histogram keeps (see the crate's documentation).
pub const SIGNIFICANT_DIGITS: u8 = 3;

/// Ranks are computed in thousandths, so p99.9 needs no floating point.
const PER_MILLE: u64 = 1000;

/// Non-negative integer values (of one unit, the caller's choice), summarised by nearest rank.
#[derive(Clone, Debug)]
pub struct Recorder {
    hist: Histogram<u64>,
    /// The largest value recorded, exactly (the histogram only knows its bucket).
    max: u64,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    /// An empty recorder. It grows with the values recorded: no range is set in advance.
    pub fn new() -> Recorder {
        // `new` fails only for more than 5 significant digits; the crate's tests build one.
        let mut hist = Histogram::new(SIGNIFICANT_DIGITS)
            .expect("3 significant digits are within hdrhistogram's range");
        hist.auto(true);
        Recorder { hist, max: 0 }
    }

    /// Records one value.
    pub fn record(&mut self, value: u64) {
        // With auto-resize on, only a value past what the histogram can ever track (about
        // 2^62) fails: it is counted at the top of the range instead.
        if self.hist.record(value).is_err() {
            self.hist.saturating_record(value);
        }
        self.max = self.max.max(value);
    }

    /// Adds every value of `other` (another worker's tally) to this one.
    pub fn merge(&mut self, other: &Recorder) {
        if other.is_empty() {
            return;
        }
        // Both grow on demand, so adding can only fail for an untrackable range; then the
        // values go in one bucket at a time, each clamped like `record`'s.
        if self.hist.add(&other.hist).is_err() {
            for v in other.hist.iter_recorded() {
                self.hist.saturating_record_n(v.value_iterated_to(), v.count_at_value());
            }
        }
        self.max = self.max.max(other.max);
    }

    /// How many values were recorded.
    pub fn len(&self) -> u64 {
        self.hist.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// The largest value recorded (exact); `None` when empty.
    pub fn max(&self) -> Option<u64> {
        (!self.is_empty()).then_some(self.max)
    }

    /// The nearest-rank percentile `per_mille / 10` (`990` is p99, `999` p99.9): the value at
    /// rank `ceil(per_mille × n / 1000)`, to the histogram's precision; `None` when empty.
    pub fn per_mille(&self, per_mille: u64) -> Option<u64> {
        let n = self.len();
        if n == 0 {
            return None;
        }
        let rank = (u128::from(n) * u128::from(per_mille.min(PER_MILLE)))
            .div_ceil(u128::from(PER_MILLE))
            .max(1);
        let mut seen: u128 = 0;
        for bucket in self.hist.iter_recorded() {
            seen += u128::from(bucket.count_at_value());
            if seen >= rank {
                return Some(bucket.value_iterated_to().min(self.max));
            }
        }
        Some(self.max)
    }

    /// How many values lie in `[low, high)`, each placed by the highest value of its bucket,
    /// as percentiles are: a bound met exactly counts above it, and a bucket that straddles
    /// a bound (only possible from 2,048 up) counts above it whole.
    pub fn count_between(&self, low: u64, high: u64) -> u64 {
        self.hist
            .iter_recorded()
            .filter(|b| (low..high).contains(&b.value_iterated_to()))
            .map(|b| b.count_at_value())
            .sum()
    }

    /// Count, p50, p99, p99.9 and max; `None` when empty.
    pub fn summary(&self) -> Option<Summary> {
        Some(Summary {
            count: self.len(),
            p50: self.per_mille(500)?,
            p99: self.per_mille(990)?,
            p999: self.per_mille(999)?,
            max: self.max()?,
        })
    }
}

/// The figures every report shows, in the recorder's unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    /// Number of values.
    pub count: u64,
    /// Median (nearest rank).
    pub p50: u64,
    /// 99th percentile (nearest rank).
    pub p99: u64,
    /// 99.9th percentile (nearest rank).
    pub p999: u64,
    /// Largest value, exact.
    pub max: u64,
}

/// Microseconds in a millisecond.
const MICROS_PER_MS: f64 = 1000.0;

/// Clock readings in fractional milliseconds (latency, or lateness that may be negative),
/// recorded to the microsecond.
#[derive(Clone, Debug, Default)]
pub struct MillisRecorder {
    micros: Recorder,
    below_zero: u64,
}

impl MillisRecorder {
    /// An empty recorder.
    pub fn new() -> MillisRecorder {
        MillisRecorder::default()
    }

    /// Records `ms`, rounded to the microsecond. A value below zero (or NaN) is recorded as 0
    /// and counted in [`MillisRecorder::below_zero`].
    pub fn record(&mut self, ms: f64) {
        if ms >= 0.0 {
            // `as` saturates: a value past u64's range in µs (half a million years) is kept
            // at the top.
            self.micros.record((ms * MICROS_PER_MS).round() as u64);
        } else {
            self.below_zero += 1;
            self.micros.record(0);
        }
    }

    /// Adds every value of `other` to this one.
    pub fn merge(&mut self, other: &MillisRecorder) {
        self.micros.merge(&other.micros);
        self.below_zero += other.below_zero;
    }

    /// How many values were recorded.
    pub fn len(&self) -> u64 {
        self.micros.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.micros.is_empty()
    }

    /// How many of them were below zero (recorded as 0).
    pub fn below_zero(&self) -> u64 {
        self.below_zero
    }

    /// How many values lie in `[low_ms, high_ms)` (see [`Recorder::count_between`]); the ones
    /// below zero count as 0.
    pub fn count_between(&self, low_ms: f64, high_ms: f64) -> u64 {
        let micros = |ms: f64| (ms.max(0.0) * MICROS_PER_MS).round() as u64;
        self.micros.count_between(micros(low_ms), micros(high_ms))
    }

    /// Count, p50, p99, p99.9 and max in milliseconds; `None` when empty.
    pub fn summary(&self) -> Option<MillisSummary> {
        let s = self.micros.summary()?;
        let ms = |us: u64| us as f64 / MICROS_PER_MS;
        Some(MillisSummary {
            count: s.count,
            p50: ms(s.p50),
            p99: ms(s.p99),
            p999: ms(s.p999),
            max: ms(s.max),
        })
    }
}

/// [`Summary`] in milliseconds, from a [`MillisRecorder`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MillisSummary {
    /// Number of values.
    pub count: u64,
    /// Median (nearest rank), ms.
    pub p50: f64,
    /// 99th percentile (nearest rank), ms.
    pub p99: f64,
    /// 99.9th percentile (nearest rank), ms.
    pub p999: f64,
    /// Largest value, ms (exact to the microsecond).
    pub max: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(values: impl IntoIterator<Item = u64>) -> Recorder {
        let mut r = Recorder::new();
        for v in values {
            r.record(v);
        }
        r
    }

    #[test]
    fn small_values_are_exact_nearest_ranks() {
        assert_eq!(Recorder::new().summary(), None);
        assert_eq!(Recorder::new().max(), None);
        let one = of([7]).summary();
        assert_eq!(one, Some(Summary { count: 1, p50: 7, p99: 7, p999: 7, max: 7 }));
        // 1..=1000 in any order: ranks ceil(500) = 500, ceil(990) = 990, ceil(999) = 999.
        let s = of((1..=1000).rev()).summary();
        assert_eq!(s, Some(Summary { count: 1000, p50: 500, p99: 990, p999: 999, max: 1000 }));
        // Four values: ranks 2, ceil(3.96) = 4, ceil(3.996) = 4.
        let s = of([40, 10, 30, 20]).summary();
        assert_eq!(s.map(|s| (s.p50, s.p99, s.p999)), Some((20, 40, 40)));
        // Zero is a value like any other.
        assert_eq!(of([0, 0, 5]).summary().map(|s| (s.p50, s.max)), Some((0, 5)));
        // Ranks are integers: 0.57 × 100 is 56.99999... in floating point, rank 57 here.
        let r = of(1..=100);
        assert_eq!(r.per_mille(570), Some(57));
        assert_eq!(r.per_mille(0), Some(1));
        assert_eq!(r.per_mille(5000), Some(100));
    }

    #[test]
    fn large_values_hold_three_significant_digits() {
        // One value per µs from 1 ms to 1 s: each percentile is within 1/1024 above the
        // exact nearest rank, the maximum is exact.
        let r = of(1_000..=1_000_000);
        let n = 999_001u64;
        for per_mille in [500, 990, 999] {
            let exact = 1_000 + (n * per_mille).div_ceil(1000) - 1;
            let got = r.per_mille(per_mille).expect("values");
            assert!(got >= exact && got - exact <= exact / 1024, "p{per_mille}: {got} vs {exact}");
        }
        assert_eq!(r.max(), Some(1_000_000));
        // The top bucket's highest value is past the largest recorded: capped at it.
        let r = of([6_000, 300]);
        assert_eq!(r.summary().map(|s| (s.p99, s.max)), Some((6_000, 6_000)));
        // Past what the histogram can track at all: counted at the top, max still exact.
        let r = of([u64::MAX]);
        assert_eq!(r.len(), 1);
        assert_eq!(r.max(), Some(u64::MAX));
    }

    #[test]
    fn merged_workers_equal_one_recorder() {
        let (mut a, b) = (of(0..500), of(500..1000));
        a.merge(&b);
        a.merge(&Recorder::new());
        assert_eq!(a.summary(), of(0..1000).summary());
        let mut empty = Recorder::new();
        empty.merge(&of([3]));
        assert_eq!(empty.max(), Some(3));
    }

    #[test]
    fn counts_between_bounds() {
        let r = of([0, 1, 999, 1_000, 1_999, 2_000, 49_990, 50_000, 70_000]);
        assert_eq!(r.count_between(0, 1_000), 3);
        assert_eq!(r.count_between(1_000, 2_000), 2);
        // 49,990 and 50,000 share a bucket (32 wide at this magnitude: 49,984..=50,015):
        // both count at or above a bound of 50,000.
        assert_eq!(r.count_between(2_000, 50_000), 1);
        assert_eq!(r.count_between(50_000, u64::MAX), 3);
    }

    #[test]
    fn milliseconds_keep_microseconds_and_count_negatives() {
        let mut m = MillisRecorder::new();
        assert!(m.is_empty() && m.summary().is_none());
        for ms in [0.25, 0.5, 1.5, -3.0, f64::NAN] {
            m.record(ms);
        }
        assert_eq!((m.len(), m.below_zero()), (5, 2));
        let s = m.summary().expect("values");
        // Sorted: 0, 0, 0.25, 0.5, 1.5; ranks 3, 5, 5.
        assert_eq!((s.count, s.p50, s.p99, s.p999, s.max), (5, 0.25, 1.5, 1.5, 1.5));
        assert_eq!(m.count_between(0.0, 0.5), 3);
        assert_eq!(m.count_between(0.5, 2.0), 2);
        let mut other = MillisRecorder::new();
        other.record(-1.0);
        other.record(2_000.0);
        m.merge(&other);
        assert_eq!((m.len(), m.below_zero()), (7, 3));
        assert_eq!(m.summary().map(|s| s.max), Some(2_000.0));
    }
}
