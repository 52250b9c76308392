//! Run statistics: (f) how late delayed jobs came out while the cluster was healthy, and (g)
//! availability — outcomes per second, split by fault windows, and how long the cluster took
//! to accept publishes again after each heal.
//!
//! These are measurements, not verdicts: nothing here fails a run. All times are harness
//! monotonic ms since the run started, as in [`crate::history`].

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use crate::history::{Call, Op, Outcome};
use crate::plan::{FaultKind, FaultWindow};

/// How long after a fault window ends the cluster is still considered disturbed (elections
/// settling, clients reconnecting, the backlog of due jobs draining). Lateness measured in that
/// margin says more about the fault than about the scheduler, so it is not "healthy".
pub const SETTLE_MS: u64 = 2_000;

/// Nearest-rank percentiles of a set of millisecond values.
///
/// Computed by [`delayd_percentiles`], as every figure of the bench and the tests: the `p`-th
/// percentile is the value at rank `ceil(p × n)` (1-based, at least 1) in ascending order, so
/// `p999_ms` of fewer than 1000 samples is simply the maximum. Values below 2048 ms are exact;
/// above, a percentile holds 3 significant digits (at most 0.1 % high, never above the
/// maximum, which is exact).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Percentiles {
    /// Number of values.
    pub count: usize,
    /// Median.
    pub p50_ms: u64,
    /// 99th percentile.
    pub p99_ms: u64,
    /// 99.9th percentile.
    pub p999_ms: u64,
    /// Largest value.
    pub max_ms: u64,
}

impl Percentiles {
    /// The percentiles of `values` (in any order); `None` when there are none.
    pub fn of(values: &[u64]) -> Option<Percentiles> {
        let mut recorder = delayd_percentiles::Recorder::new();
        for &v in values {
            recorder.record(v);
        }
        let s = recorder.summary()?;
        Some(Percentiles {
            count: values.len(),
            p50_ms: s.p50,
            p99_ms: s.p99,
            p999_ms: s.p999,
            max_ms: s.max,
        })
    }
}

/// One acknowledged delayed publish and its first delivery.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FirstDelivery {
    /// The body published.
    pub body: String,
    /// Publish invoke + delay.
    pub due_ms: u64,
    /// Completion of the earliest successful reserve that returned the body.
    pub delivered_ms: u64,
    /// `delivered_ms − due_ms`, or 0 when delivered before due.
    pub lateness_ms: u64,
    /// Delivered before its due time (the checker decides whether that is an anomaly).
    pub before_due: bool,
    /// No fault window (extended by [`SETTLE_MS`]) touches the span from due to delivery.
    pub healthy: bool,
}

/// Whether the span `[a, b]` (in either order) meets any fault window extended by
/// [`SETTLE_MS`] after its end.
pub fn disturbed(a: u64, b: u64, faults: &[FaultWindow]) -> bool {
    let (lo, hi) = (a.min(b), a.max(b));
    faults.iter().any(|w| lo <= w.end_ms.saturating_add(SETTLE_MS) && w.start_ms <= hi)
}

/// The first delivery of every acknowledged publish with `delay_ms > 0` that came out, sorted
/// by due time (then body, so the order is deterministic).
///
/// The harness only knows when it *sent* the publish, not when the server accepted it, so the
/// due time is taken as publish invoke + delay: this overstates lateness by up to the publish
/// latency, which errs on the conservative side. The delivery time is the completion of the
/// reserve, which likewise includes the reserve's own latency.
pub fn first_deliveries(history: &[Op], faults: &[FaultWindow]) -> Vec<FirstDelivery> {
    let mut due: BTreeMap<&str, u64> = BTreeMap::new();
    let mut first: BTreeMap<&str, u64> = BTreeMap::new();
    for op in history {
        if op.outcome != Outcome::Ok {
            continue;
        }
        match &op.call {
            // A keyed body is published many times and only one publish (maybe one with
            // an unknown outcome, maybe one without delay) created the job: its due time is
            // unknowable, so keyed jobs are left out of lateness (the checker still judges
            // them early or not).
            Call::Publish { body, delay_ms, key: None, .. } if *delay_ms > 0 => {
                // Bodies are unique per publish; should one repeat, the earliest due time
                // is kept because it gives the larger (conservative) lateness.
                let t = op.invoke_ms.saturating_add(*delay_ms);
                due.entry(body).and_modify(|d| *d = (*d).min(t)).or_insert(t);
            }
            Call::Reserve { got, .. } => {
                for d in got {
                    first
                        .entry(&d.body)
                        .and_modify(|t| *t = (*t).min(op.complete_ms))
                        .or_insert(op.complete_ms);
                }
            }
            _ => {}
        }
    }
    let mut out: Vec<FirstDelivery> = due
        .iter()
        .filter_map(|(body, &due_ms)| {
            let delivered_ms = *first.get(body)?;
            Some(FirstDelivery {
                body: body.to_string(),
                due_ms,
                delivered_ms,
                lateness_ms: delivered_ms.saturating_sub(due_ms),
                before_due: delivered_ms < due_ms,
                // The whole span, not just its two ends: a job due before a fault and
                // delivered after it waited through the fault.
                healthy: !disturbed(due_ms, delivered_ms, faults),
            })
        })
        .collect();
    out.sort_by(|a, b| (a.due_ms, &a.body).cmp(&(b.due_ms, &b.body)));
    out
}

/// Property (f): lateness of first deliveries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Lateness {
    /// Acknowledged publishes with a delay > 0.
    pub delayed_ok: usize,
    /// Of those, how many came out at least once (the others are not measured).
    pub delivered: usize,
    /// Of those delivered, how many were first delivered before their due time; they count
    /// with lateness 0 in the percentiles, and are reported here so nothing is hidden.
    pub before_due: usize,
    /// Over jobs whose due-to-delivery span met no fault window (plus [`SETTLE_MS`]).
    pub healthy: Option<Percentiles>,
    /// Over every delivered job.
    pub all: Option<Percentiles>,
}

/// Measures (f): for each acknowledged publish with `delay_ms > 0`, its first delivery's
/// lateness = reserve completion − (publish invoke + delay), clamped at 0.
///
/// The harness only knows the publish's invoke time, so lateness is overstated by up to the
/// publish latency (conservative). Early deliveries are counted in `before_due` (the checker
/// judges them against its tolerance). Jobs never delivered are not counted. "Healthy" keeps
/// only jobs whose due time and delivery, and everything between, lie outside every fault
/// window extended by [`SETTLE_MS`]; see [`first_deliveries`].
pub fn lateness(history: &[Op], faults: &[FaultWindow]) -> Lateness {
    let delayed_ok = history
        .iter()
        .filter(|op| {
            op.outcome == Outcome::Ok
                && matches!(op.call, Call::Publish { delay_ms, key: None, .. } if delay_ms > 0)
        })
        .count();
    let firsts = first_deliveries(history, faults);
    let all: Vec<u64> = firsts.iter().map(|f| f.lateness_ms).collect();
    let healthy: Vec<u64> = firsts.iter().filter(|f| f.healthy).map(|f| f.lateness_ms).collect();
    Lateness {
        delayed_ok,
        delivered: firsts.len(),
        before_due: firsts.iter().filter(|f| f.before_due).count(),
        healthy: Percentiles::of(&healthy),
        all: Percentiles::of(&all),
    }
}

/// Outcome counts of a set of operations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Confirmed.
    pub ok: u64,
    /// Refused.
    pub fail: u64,
    /// Timed out or ambiguous.
    pub unknown: u64,
}

impl Counts {
    fn add(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Ok => self.ok += 1,
            Outcome::Fail => self.fail += 1,
            Outcome::Unknown => self.unknown += 1,
        }
    }

    /// All operations counted.
    pub fn total(&self) -> u64 {
        self.ok + self.fail + self.unknown
    }

    /// Share of ok operations, `None` when there were none at all.
    pub fn ok_ratio(&self) -> Option<f64> {
        let total = self.total();
        (total > 0).then(|| self.ok as f64 / total as f64)
    }
}

/// Outcomes of the operations invoked in one second of the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Bucket {
    /// The second: operations with `invoke_ms / 1000 == second`.
    pub second: u64,
    /// Publishes.
    pub publish: Counts,
    /// Reserves (one that found no job is ok), acks and releases.
    pub other: Counts,
}

/// Outcome totals over a part of the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    /// Publishes.
    pub publish: Counts,
    /// Reserves, acks and releases.
    pub other: Counts,
    /// `publish.ok / publish.total`.
    pub publish_ok_ratio: Option<f64>,
    /// `other.ok / other.total`.
    pub other_ok_ratio: Option<f64>,
}

impl Totals {
    fn finish(mut self) -> Totals {
        self.publish_ok_ratio = self.publish.ok_ratio();
        self.other_ok_ratio = self.other.ok_ratio();
        self
    }
}

/// How long the cluster took to accept a publish again after a fault was healed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Recovery {
    /// The fault.
    pub kind: FaultKind,
    /// The nodes it was done to.
    pub nodes: Vec<u64>,
    /// When it began.
    pub start_ms: u64,
    /// When it was healed.
    pub end_ms: u64,
    /// From `end_ms` to the completion of the first ok publish invoked at or after `end_ms`;
    /// `None` when no publish invoked after the heal succeeded.
    pub recovery_ms: Option<u64>,
}

/// Property (g): availability.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Availability {
    /// One bucket per second from 0 to the last invoke, empty seconds included (an empty
    /// second is itself a sign of trouble: workers were all blocked).
    pub buckets: Vec<Bucket>,
    /// Operations invoked inside a fault window.
    pub during_faults: Totals,
    /// Operations invoked outside every fault window.
    pub healthy: Totals,
    /// Per fault window, in the order given.
    pub recovery: Vec<Recovery>,
    /// The longest time without an ok publish completing, while publishes were being made
    /// (from the first publish's invoke to the last one's completion; the drain at the end
    /// makes no publishes and would otherwise always win).
    pub max_publish_gap_ms: u64,
    /// Where that gap begins.
    pub max_publish_gap_start_ms: u64,
}

/// Whether `t` falls within any fault window (ends included).
fn during(t: u64, faults: &[FaultWindow]) -> bool {
    faults.iter().any(|w| w.start_ms <= t && t <= w.end_ms)
}

/// Measures (g) over a history; see [`Availability`]. The final dead-letter listing is not
/// client traffic and is left out.
pub fn availability(history: &[Op], faults: &[FaultWindow]) -> Availability {
    let mut buckets: Vec<Bucket> = Vec::new();
    let mut during_faults = Totals::default();
    let mut healthy = Totals::default();
    for op in history {
        let is_publish = match op.call {
            Call::Publish { .. } => true,
            Call::Reserve { .. } | Call::Ack { .. } | Call::Release { .. } => false,
            Call::DeadLetter { .. } => continue,
        };
        let second = op.invoke_ms / 1000;
        let index = usize::try_from(second).unwrap_or(usize::MAX);
        if index >= buckets.len() {
            let from = buckets.len() as u64;
            buckets.extend((from..=second).map(|s| Bucket { second: s, ..Bucket::default() }));
        }
        let totals = if during(op.invoke_ms, faults) { &mut during_faults } else { &mut healthy };
        if let Some(bucket) = buckets.get_mut(index) {
            if is_publish { &mut bucket.publish } else { &mut bucket.other }.add(op.outcome);
        }
        if is_publish { &mut totals.publish } else { &mut totals.other }.add(op.outcome);
    }

    let ok_publishes: Vec<&Op> = history
        .iter()
        .filter(|op| op.outcome == Outcome::Ok && matches!(op.call, Call::Publish { .. }))
        .collect();
    let recovery = faults
        .iter()
        .map(|w| Recovery {
            kind: w.kind,
            nodes: w.nodes.clone(),
            start_ms: w.start_ms,
            end_ms: w.end_ms,
            recovery_ms: ok_publishes
                .iter()
                .filter(|op| op.invoke_ms >= w.end_ms)
                .map(|op| op.complete_ms.saturating_sub(w.end_ms))
                .min(),
        })
        .collect();

    let (max_publish_gap_ms, max_publish_gap_start_ms) = publish_gap(history, &ok_publishes);
    Availability {
        buckets,
        during_faults: during_faults.finish(),
        healthy: healthy.finish(),
        recovery,
        max_publish_gap_ms,
        max_publish_gap_start_ms,
    }
}

/// The longest span without an ok publish completing, within the span publishes were made;
/// `(length, start)`, `(0, 0)` when nothing was published.
fn publish_gap(history: &[Op], ok_publishes: &[&Op]) -> (u64, u64) {
    let publishes = history.iter().filter(|op| matches!(op.call, Call::Publish { .. }));
    let Some(first) = publishes.clone().map(|op| op.invoke_ms).min() else {
        return (0, 0);
    };
    let last = publishes.map(|op| op.complete_ms).max().unwrap_or(first);
    let mut points: Vec<u64> = ok_publishes.iter().map(|op| op.complete_ms).collect();
    points.push(first);
    points.push(last);
    points.sort_unstable();
    points
        .windows(2)
        .map(|w| (w[1] - w[0], w[0]))
        // Longest first; on a tie the earliest, so the answer does not depend on sort order.
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        .unwrap_or((0, first))
}

fn secs(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

fn ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_string(), |r| format!("{:.1}% ok", r * 100.0))
}

fn percentiles_line(p: &Option<Percentiles>) -> String {
    match p {
        Some(p) => format!(
            "n={} p50={} ms p99={} ms p99.9={} ms max={} ms",
            p.count, p.p50_ms, p.p99_ms, p.p999_ms, p.max_ms
        ),
        None => "n=0".to_string(),
    }
}

fn totals_line(t: &Totals) -> String {
    let c = |c: &Counts| format!("{}/{}/{}", c.ok, c.fail, c.unknown);
    format!(
        "publish {} ({}), reserve/ack/release {} ({})",
        c(&t.publish),
        ratio(t.publish_ok_ratio),
        c(&t.other),
        ratio(t.other_ok_ratio)
    )
}

/// A short human-readable block of both measurements, for the console and `summary.md`.
pub fn render_text(lat: &Lateness, av: &Availability) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail; the Results carry nothing.
    let _ = writeln!(out, "lateness of first delivery (reserve answer - (publish sent + delay)):");
    let _ = writeln!(out, "  healthy: {}", percentiles_line(&lat.healthy));
    let _ = writeln!(out, "  all:     {}", percentiles_line(&lat.all));
    let _ = writeln!(
        out,
        "  unkeyed delayed publishes ok {}, delivered {}, first delivered before due {}",
        lat.delayed_ok, lat.delivered, lat.before_due
    );
    let _ = writeln!(out, "availability (ok/fail/unknown):");
    let _ = writeln!(out, "  healthy:       {}", totals_line(&av.healthy));
    let _ = writeln!(out, "  during faults: {}", totals_line(&av.during_faults));
    if !av.recovery.is_empty() {
        let list: Vec<String> = av
            .recovery
            .iter()
            .map(|r| {
                let took = r.recovery_ms.map_or_else(|| "never".to_string(), secs);
                format!("{} healed at {}: {}", r.kind.name(), secs(r.end_ms), took)
            })
            .collect();
        let _ = writeln!(out, "  first ok publish after heal: {}", list.join("; "));
    }
    let _ = writeln!(
        out,
        "  longest gap without an ok publish: {} from {}",
        secs(av.max_publish_gap_ms),
        secs(av.max_publish_gap_start_ms)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Delivery;

    fn publish(t: u64, done: u64, body: &str, delay_ms: u64, outcome: Outcome) -> Op {
        let call = Call::Publish { body: body.into(), delay_ms, key: None, job_id: None };
        Op { process: 1, invoke_ms: t, complete_ms: done, outcome, call }
    }

    fn reserve(t: u64, done: u64, outcome: Outcome, bodies: &[&str]) -> Op {
        let got = bodies
            .iter()
            .map(|b| Delivery {
                job_id: format!("j-{b}"),
                body: b.to_string(),
                attempt: 1,
                lease: "l".into(),
            })
            .collect();
        Op {
            process: 2,
            invoke_ms: t,
            complete_ms: done,
            outcome,
            call: Call::Reserve { ttr_ms: 1000, got },
        }
    }

    fn ack(t: u64, done: u64, outcome: Outcome) -> Op {
        let call = Call::Ack { job_id: "j".into(), lease: "l".into() };
        Op { process: 2, invoke_ms: t, complete_ms: done, outcome, call }
    }

    fn window(start_ms: u64, end_ms: u64) -> FaultWindow {
        FaultWindow {
            kind: FaultKind::KillLeader,
            nodes: vec![1],
            start_ms,
            end_ms,
            detail: String::new(),
        }
    }

    #[test]
    fn nearest_rank_percentiles() {
        assert_eq!(Percentiles::of(&[]), None);
        let one = Percentiles::of(&[7]).expect("one value");
        assert_eq!((one.p50_ms, one.p99_ms, one.p999_ms, one.max_ms), (7, 7, 7, 7));
        // 1..=1000: rank ceil(0.5 × 1000) = 500, ceil(0.99 × 1000) = 990, 999.
        let values: Vec<u64> = (1..=1000).rev().collect();
        let p = Percentiles::of(&values).expect("values");
        assert_eq!((p.count, p.p50_ms, p.p99_ms, p.p999_ms, p.max_ms), (1000, 500, 990, 999, 1000));
        // Four values: ranks ceil(2) = 2, ceil(3.96) = 4, ceil(3.996) = 4.
        let p = Percentiles::of(&[40, 10, 30, 20]).expect("values");
        assert_eq!((p.p50_ms, p.p99_ms, p.p999_ms), (20, 40, 40));
        // From 2048 ms up, 3 significant digits: 6001 is reported as the top of its bucket
        // (6000..=6003); the maximum stays exact.
        let p = Percentiles::of(&[9_000, 3_000, 6_001]).expect("values");
        assert_eq!((p.p50_ms, p.max_ms), (6_003, 9_000));
    }

    #[test]
    fn lateness_is_exact_and_excludes_jobs_near_faults() {
        let faults = [window(10_000, 12_000)];
        let h = vec![
            // Due 1_100, first delivered 1_150 (the later reserve does not count): 50.
            publish(100, 105, "a", 1_000, Outcome::Ok),
            reserve(1_140, 1_150, Outcome::Ok, &["a"]),
            reserve(3_000, 3_010, Outcome::Ok, &["a"]),
            // Due 2_200, delivered 2_180: before due, lateness 0.
            publish(200, 210, "b", 2_000, Outcome::Ok),
            reserve(2_170, 2_180, Outcome::Ok, &["b"]),
            // Due 5_000, delivered 5_300: 300.
            publish(4_000, 4_010, "c", 1_000, Outcome::Ok),
            reserve(5_290, 5_300, Outcome::Ok, &["c"]),
            // Due 11_000 inside the fault, delivered 12_500: 1_500, not healthy.
            publish(10_000, 10_010, "d", 1_000, Outcome::Ok),
            reserve(12_490, 12_500, Outcome::Ok, &["d"]),
            // Due 13_500, inside the settling margin (fault ends 12_000 + 2_000): 400, not
            // healthy.
            publish(12_500, 12_510, "e", 1_000, Outcome::Ok),
            reserve(13_890, 13_900, Outcome::Ok, &["e"]),
            // Due 9_000, delivered 15_000: both ends outside, but it waited through the
            // fault: 6_000, not healthy.
            publish(8_000, 8_010, "f", 1_000, Outcome::Ok),
            reserve(14_990, 15_000, Outcome::Ok, &["f"]),
            // Due 20_000, delivered 20_020: 20.
            publish(19_000, 19_010, "g", 1_000, Outcome::Ok),
            reserve(20_010, 20_020, Outcome::Ok, &["g"]),
            // Never delivered: not counted.
            publish(21_000, 21_010, "h", 1_000, Outcome::Ok),
            // No delay, failed publish, unknown publish, failed reserve: not counted.
            publish(22_000, 22_010, "i", 0, Outcome::Ok),
            reserve(22_020, 22_030, Outcome::Ok, &["i"]),
            publish(23_000, 23_010, "k", 1_000, Outcome::Fail),
            publish(23_000, 23_010, "m", 1_000, Outcome::Unknown),
            reserve(25_000, 25_010, Outcome::Ok, &["m"]),
            publish(26_000, 26_010, "n", 1_000, Outcome::Ok),
            reserve(26_500, 26_510, Outcome::Unknown, &["n"]),
        ];
        let lat = lateness(&h, &faults);
        // Ok and delayed: a b c d e f g h n; delivered: a to g.
        assert_eq!((lat.delayed_ok, lat.delivered, lat.before_due), (9, 7, 1));
        // Healthy: a 50, b 0, c 300, g 20 → sorted 0, 20, 50, 300.
        assert_eq!(
            lat.healthy,
            Some(Percentiles { count: 4, p50_ms: 20, p99_ms: 300, p999_ms: 300, max_ms: 300 })
        );
        // All: 0, 20, 50, 300, 400, 1_500, 6_000: ranks ceil(3.5) = 4 and 7.
        assert_eq!(
            lat.all,
            Some(Percentiles {
                count: 7,
                p50_ms: 300,
                p99_ms: 6_000,
                p999_ms: 6_000,
                max_ms: 6_000
            })
        );

        let firsts = first_deliveries(&h, &faults);
        let bodies: Vec<&str> = firsts.iter().map(|f| f.body.as_str()).collect();
        assert_eq!(bodies, ["a", "b", "c", "f", "d", "e", "g"]);
        let d = &firsts[4];
        assert_eq!(
            (d.due_ms, d.delivered_ms, d.lateness_ms, d.healthy),
            (11_000, 12_500, 1_500, false)
        );
    }

    #[test]
    fn availability_buckets_totals_and_recovery_are_exact() {
        let faults = [window(2_000, 3_000), window(5_000, 6_000)];
        let h = vec![
            publish(100, 150, "a", 0, Outcome::Ok),
            reserve(200, 210, Outcome::Ok, &[]), // found nothing: still ok
            ack(900, 910, Outcome::Fail),
            publish(1_500, 1_600, "b", 0, Outcome::Ok),
            // Second 2 is inside the first fault.
            publish(2_100, 2_900, "c", 0, Outcome::Unknown),
            publish(2_500, 2_600, "d", 0, Outcome::Fail),
            reserve(2_600, 2_700, Outcome::Unknown, &[]),
            // Invoked in the fault, completes after it: does not count as recovery.
            publish(2_950, 3_050, "e", 0, Outcome::Ok),
            // After the heal at 3_000: failed, then ok at 3_700 → recovery 700.
            publish(3_100, 3_200, "f", 0, Outcome::Fail),
            publish(3_500, 3_700, "g", 0, Outcome::Ok),
            // Nothing in second 4; second fault has no ok publish afterwards.
            publish(5_500, 5_600, "h", 0, Outcome::Fail),
            publish(6_200, 6_300, "i", 0, Outcome::Unknown),
            Op {
                process: 3,
                invoke_ms: 9_000,
                complete_ms: 9_001,
                outcome: Outcome::Ok,
                call: Call::DeadLetter { bodies: vec![] },
            },
        ];
        let av = availability(&h, &faults);
        let c = |ok, fail, unknown| Counts { ok, fail, unknown };
        let seconds: Vec<(u64, Counts, Counts)> =
            av.buckets.iter().map(|b| (b.second, b.publish, b.other)).collect();
        assert_eq!(
            seconds,
            vec![
                (0, c(1, 0, 0), c(1, 1, 0)),
                (1, c(1, 0, 0), c(0, 0, 0)),
                (2, c(1, 1, 1), c(0, 0, 1)),
                (3, c(1, 1, 0), c(0, 0, 0)),
                (4, c(0, 0, 0), c(0, 0, 0)),
                (5, c(0, 1, 0), c(0, 0, 0)),
                (6, c(0, 0, 1), c(0, 0, 0)),
            ]
        );
        assert_eq!((av.during_faults.publish, av.during_faults.other), (c(1, 2, 1), c(0, 0, 1)));
        assert_eq!((av.healthy.publish, av.healthy.other), (c(3, 1, 1), c(1, 1, 0)));
        assert_eq!(av.during_faults.publish_ok_ratio, Some(0.25));
        assert_eq!(av.healthy.other_ok_ratio, Some(0.5));
        let rec: Vec<Option<u64>> = av.recovery.iter().map(|r| r.recovery_ms).collect();
        assert_eq!(rec, vec![Some(700), None]);
        // Ok publish completions 150, 1_600, 3_050, 3_700 within publishes 100..6_300: the
        // longest gap is 3_700 → 6_300.
        assert_eq!((av.max_publish_gap_ms, av.max_publish_gap_start_ms), (2_600, 3_700));

        let text = render_text(&lateness(&h, &faults), &av);
        assert!(text.contains("longest gap without an ok publish: 2.6 s from 3.7 s"), "{text}");
        assert!(text.contains("kill-leader healed at 3.0 s: 0.7 s"), "{text}");
        assert!(serde_json::to_string(&av).is_ok());
    }

    #[test]
    fn an_empty_history_measures_nothing() {
        let lat = lateness(&[], &[]);
        assert_eq!((lat.delivered, lat.healthy, lat.all), (0, None, None));
        let av = availability(&[], &[window(0, 10)]);
        assert!(av.buckets.is_empty());
        assert_eq!(av.recovery[0].recovery_ms, None);
        assert_eq!((av.max_publish_gap_ms, av.max_publish_gap_start_ms), (0, 0));
        assert!(render_text(&lat, &av).contains("n=0"));
    }
}
