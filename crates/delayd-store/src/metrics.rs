//! The store's own Prometheus metrics: log appends, applies, snapshots, the commit index.
//!
//! [`StoreMetrics::default`] creates the handles without registering them anywhere, so a
//! store opened by [`Store::open`](crate::Store::open) (its tests, tools) records into handles
//! nobody reads; the server opens the store with
//! [`Store::open_for_node`](crate::Store::open_for_node) and registers the same
//! handles in its node's registry.
//! Handles are cheap to clone: clones record into the same series.

use std::time::Instant;

use prometheus::{Histogram, HistogramOpts, IntGauge, Opts, Registry};

/// Handles for the metrics the store records; see `docs/metrics.md` for their meaning.
#[derive(Clone)]
pub struct StoreMetrics {
    /// From an `append` call to its durable callback: the write plus the wait for the log's
    /// flush worker and its fsync. (The worker's own counts are read from the log at scrape
    /// time: see `StateReader::log_flushes`.)
    pub(crate) log_append_seconds: Histogram,
    /// Applying a batch of committed entries to the state machine.
    pub(crate) apply_seconds: Histogram,
    /// Building a snapshot file from a consistent view.
    pub(crate) snapshot_build_seconds: Histogram,
    /// Installing a received snapshot: verify, then replace the state.
    pub(crate) snapshot_install_seconds: Histogram,
    /// Size of the last snapshot file built or installed.
    pub(crate) snapshot_bytes: IntGauge,
    /// The last commit index openraft handed to `save_committed`.
    pub(crate) commit_index: IntGauge,
}

/// Bucket bounds for a histogram of seconds: 1 ms to 10 s, for fsyncs and appends, with
/// sub-millisecond ones for fast disks.
const IO_SECONDS: &[f64] = &[
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0,
];

/// Bucket bounds for snapshot builds and installs: 10 ms to 10 minutes.
const SNAPSHOT_SECONDS: &[f64] = &[0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];

fn histogram(name: &str, help: &str, buckets: &[f64]) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    // Only an invalid name, help or bucket list fails, and those are constants here: a
    // failure is a bug that every test run would show.
    Histogram::with_opts(opts).expect("valid histogram options")
}

fn gauge(name: &str, help: &str) -> IntGauge {
    IntGauge::with_opts(Opts::new(name, help)).expect("valid gauge options")
}

impl Default for StoreMetrics {
    fn default() -> Self {
        StoreMetrics {
            log_append_seconds: histogram(
                "delayd_log_append_seconds",
                "Raft log appends, from the append call until the entries are fsynced.",
                IO_SECONDS,
            ),
            apply_seconds: histogram(
                "delayd_apply_seconds",
                "Applying one batch of committed entries to the state machine, from the first \
                 command to the last write (answers and effects not included).",
                IO_SECONDS,
            ),
            snapshot_build_seconds: histogram(
                "delayd_snapshot_build_seconds",
                "Building a state-machine snapshot file.",
                SNAPSHOT_SECONDS,
            ),
            snapshot_install_seconds: histogram(
                "delayd_snapshot_install_seconds",
                "Installing a snapshot received from the leader.",
                SNAPSHOT_SECONDS,
            ),
            snapshot_bytes: gauge(
                "delayd_snapshot_bytes",
                "Size of the last snapshot file this node built or installed.",
            ),
            commit_index: gauge(
                "delayd_raft_commit_index",
                "The last log index this node knows to be committed.",
            ),
        }
    }
}

impl StoreMetrics {
    /// Registers every handle in `registry`.
    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        for h in [
            &self.log_append_seconds,
            &self.apply_seconds,
            &self.snapshot_build_seconds,
            &self.snapshot_install_seconds,
        ] {
            registry.register(Box::new(h.clone()))?;
        }
        registry.register(Box::new(self.snapshot_bytes.clone()))?;
        registry.register(Box::new(self.commit_index.clone()))
    }
}

/// Seconds since `start`, for a histogram.
pub(crate) fn since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64()
}
