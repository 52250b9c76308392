//! What a workload measures and how it is summarised: nearest-rank percentiles over sorted
//! samples (no histogram crate: a run keeps at most a few million `f64`s), the per-worker tally
//! that workers merge at the end, the shared job budget, and the result row that the table,
//! the JSON file and the report are all rendered from.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::{Map, Value};

/// Latency (or lateness) percentiles in milliseconds, nearest rank.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    /// Number of samples.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
}

impl Percentiles {
    /// Percentiles of `samples` (sorted here); `None` when there are none.
    pub fn of(samples: &mut [f64]) -> Option<Percentiles> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        Some(Percentiles {
            n: samples.len(),
            p50: nearest_rank(samples, 0.50),
            p99: nearest_rank(samples, 0.99),
            p999: nearest_rank(samples, 0.999),
            max: samples[samples.len() - 1],
        })
    }
}

/// The nearest-rank percentile of sorted, non-empty `sorted`: the smallest sample such that
/// at least `p` of all samples are at or below it.
pub fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Wall-clock now in fractional unix milliseconds: lateness compares it with the server's
/// `due_at_ms`, which is stamped with the same machine's wall clock.
pub fn wall_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Milliseconds elapsed since `t`.
pub fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// How many jobs a closed-loop workload may still start: it stops at `max_jobs` or at the
/// deadline, whichever comes first. Shared by all workers so the count is global.
#[derive(Clone)]
pub struct Budget {
    issued: Arc<AtomicU64>,
    max_jobs: u64,
    deadline: Instant,
}

impl Budget {
    /// A budget of `max_jobs` (unbounded if `None`) over `secs` from now.
    pub fn new(max_jobs: Option<u64>, secs: f64) -> Budget {
        Budget {
            issued: Arc::new(AtomicU64::new(0)),
            max_jobs: max_jobs.unwrap_or(u64::MAX),
            deadline: Instant::now() + Duration::from_secs_f64(secs),
        }
    }

    /// Claims `n` jobs; false when the budget is spent or the time is up.
    pub fn take(&self, n: u64) -> bool {
        Instant::now() < self.deadline
            && self.issued.fetch_add(n, Ordering::Relaxed) < self.max_jobs
    }
}

/// What one worker saw; workers' tallies are merged into one.
#[derive(Default)]
pub struct Tally {
    /// Per-operation latency (or lateness) samples, ms.
    pub samples_ms: Vec<f64>,
    /// Jobs completed (a bulk operation counts each of its jobs).
    pub jobs: u64,
    /// Failed operations.
    pub errors: u64,
    /// The first failure, to show what went wrong.
    pub first_error: Option<String>,
}

impl Tally {
    /// Records a failed operation.
    pub fn error(&mut self, e: impl std::fmt::Display) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
    }

    /// Adds another worker's tally to this one.
    pub fn merge(&mut self, other: Tally) {
        self.samples_ms.extend(other.samples_ms);
        self.jobs += other.jobs;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// Joins worker tasks and merges their tallies.
pub async fn join_all(tasks: Vec<tokio::task::JoinHandle<Tally>>) -> anyhow::Result<Tally> {
    let mut all = Tally::default();
    for t in tasks {
        all.merge(t.await?);
    }
    Ok(all)
}

/// How a workload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// It ran; its figures are in the row.
    Ok,
    /// It could not run to the end; `note` says why.
    Failed,
    /// It does not apply to this setup (e.g. failover on one node); `note` says why.
    Skipped,
    /// Not implemented yet on this side (e.g. a client API that does not exist yet).
    Unavailable,
}

/// One result line: a workload on a system.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The system measured, e.g. `delayd 3 nodes` or `beanstalkd -f0`.
    pub system: String,
    /// The workload's name, e.g. `publish-http`.
    pub workload: String,
    /// How it ended.
    pub status: Status,
    /// Jobs completed.
    pub jobs: u64,
    /// Seconds measured.
    pub secs: f64,
    /// The headline rate in jobs/s (what the workload says it measures).
    pub jobs_per_s: Option<f64>,
    /// Latency (or lateness, for `timer` and `lifecycle`) percentiles, ms.
    pub latency_ms: Option<Percentiles>,
    /// What the latency column means for this row.
    pub latency_of: &'static str,
    /// Failed operations.
    pub errors: u64,
    /// Early deliveries (only `timer`); must be 0.
    pub early: Option<u64>,
    /// A short human note (why it failed, or a headline figure that is not a rate).
    pub note: String,
    /// Workload-specific figures (RSS per node, lateness histogram, ...).
    pub extra: Map<String, Value>,
}

impl Row {
    /// An empty row with the given status.
    pub fn new(system: &str, workload: &str, status: Status) -> Row {
        Row {
            system: system.to_string(),
            workload: workload.to_string(),
            status,
            jobs: 0,
            secs: 0.0,
            jobs_per_s: None,
            latency_ms: None,
            latency_of: "",
            errors: 0,
            early: None,
            note: String::new(),
            extra: Map::new(),
        }
    }

    /// A row from a merged tally measured over `secs`.
    pub fn from_tally(
        system: &str,
        workload: &str,
        mut tally: Tally,
        secs: f64,
        latency_of: &'static str,
    ) -> Row {
        let mut row = Row::new(system, workload, Status::Ok);
        row.jobs = tally.jobs;
        row.secs = secs;
        row.jobs_per_s = (secs > 0.0).then(|| tally.jobs as f64 / secs);
        row.latency_ms = Percentiles::of(&mut tally.samples_ms);
        row.latency_of = latency_of;
        row.errors = tally.errors;
        if let Some(e) = tally.first_error {
            row.note = format!("first error: {e}");
        }
        if tally.jobs == 0 {
            row.status = Status::Failed;
        }
        row
    }

    /// Puts `text` in front of the note (which may hold the first error).
    pub fn prefix_note(&mut self, text: impl Into<String>) {
        let text = text.into();
        self.note = if self.note.is_empty() { text } else { format!("{text}; {}", self.note) };
    }

    /// A row for a workload that failed with `e`.
    pub fn failed(system: &str, workload: &str, e: &anyhow::Error) -> Row {
        let mut row = Row::new(system, workload, Status::Failed);
        row.note = format!("{e:#}");
        row
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<f64> = (1..=1000).rev().map(f64::from).collect();
        let p = Percentiles::of(&mut v);
        let p = p.map(|p| (p.n, p.p50, p.p99, p.p999, p.max));
        assert_eq!(p, Some((1000, 500.0, 990.0, 999.0, 1000.0)));
        assert_eq!(nearest_rank(&[7.0], 0.999), 7.0);
        assert_eq!(nearest_rank(&[1.0, 2.0], 0.5), 1.0);
        assert!(Percentiles::of(&mut []).is_none());
    }

    #[test]
    fn budget_stops_at_the_job_count() {
        let b = Budget::new(Some(3), 60.0);
        assert!(b.take(1) && b.take(1) && b.take(1));
        assert!(!b.take(1));
    }
}
