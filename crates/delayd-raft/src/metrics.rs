//! The runtime's own Prometheus metrics: how the proposer packs requests into log entries,
//! what replication puts on the wire, and what the log's byte bound asked for.
//!
//! Like the store's metrics, [`ReplicationMetrics::default`] creates handles that are not
//! registered anywhere; the server passes handles it registered in its node's registry to
//! [`Cluster::open`](crate::Cluster::open). Clones record into the same series.
//!
//! With these and the commit index, an operator can see how many messages each log entry
//! costs: `rate(delayd_raft_append_requests_total)` over
//! `rate(delayd_raft_append_entries_sent_total)` is the requests per entry sent, averaged
//! over the followers, and `delayd_raft_append_commits_folded_total` counts the commit-only
//! requests that never left because the next request carried their commit index.
//!
//! The proposer's counters say how full entries are and what filling them costs:
//! `delayd_proposer_requests_total` over `delayd_proposer_entries_total` is the requests per
//! entry, and `delayd_proposer_linger_expired_total` over the entries is the share of entries
//! that waited the whole linger for clients that did not come.

use prometheus::{Histogram, HistogramOpts, IntCounter, Opts, Registry};

/// Handles for the replication metrics; see `docs/metrics.md` for their meaning.
#[derive(Clone)]
pub struct ReplicationMetrics {
    /// AppendEntries requests handed to the network for followers (streamed or one call
    /// each), heartbeats included.
    append_requests: IntCounter,
    /// Log entries those requests carried (an entry sent to two followers counts twice).
    append_entries: IntCounter,
    /// Commit-only requests folded into the request after them instead of being sent.
    commits_folded: IntCounter,
    /// Append streams to a follower that could not be opened.
    stream_failures: IntCounter,
    /// Log entries the proposer handed to Raft.
    proposed_entries: IntCounter,
    /// Client requests those entries carried.
    proposed_requests: IntCounter,
    /// Commands those entries carried.
    proposed_commands: IntCounter,
    /// Entries proposed because the linger ran out before their fill target was met.
    linger_expired: IntCounter,
    /// From handing an entry to Raft until it was committed and applied (or failed).
    commit_seconds: Histogram,
    /// Purges the log's byte bound asked for (see `log_bound`).
    log_bound_purges: IntCounter,
    /// Snapshots the log's byte bound asked for.
    log_bound_snapshots: IntCounter,
}

/// Bucket bounds for an entry's commit: 250 µs to 10 s, finest around a few fsyncs and a
/// round trip.
const COMMIT_SECONDS: &[f64] = &[
    0.000_25, 0.000_5, 0.001, 0.002, 0.003, 0.005, 0.007_5, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 10.0,
];

fn counter(name: &str, help: &str) -> IntCounter {
    // Only an invalid name or help fails, and those are constants: every test run would show it.
    IntCounter::with_opts(Opts::new(name, help)).expect("valid counter options")
}

impl Default for ReplicationMetrics {
    fn default() -> Self {
        ReplicationMetrics {
            append_requests: counter(
                "delayd_raft_append_requests_total",
                "AppendEntries requests this node sent to followers, heartbeats included.",
            ),
            append_entries: counter(
                "delayd_raft_append_entries_sent_total",
                "Log entries carried by the AppendEntries requests this node sent (once per \
                 follower).",
            ),
            commits_folded: counter(
                "delayd_raft_append_commits_folded_total",
                "Commit-only AppendEntries requests not sent because the next request to the \
                 same follower carried their commit index.",
            ),
            stream_failures: counter(
                "delayd_raft_append_stream_failures_total",
                "Append streams to a follower that could not be opened (refused, unreachable, \
                 not answered in time); each retry waits out a backoff of 50 ms doubling to 1 s.",
            ),
            proposed_entries: counter(
                "delayd_proposer_entries_total",
                "Log entries this node's proposer handed to Raft (nonzero only while it leads).",
            ),
            proposed_requests: counter(
                "delayd_proposer_requests_total",
                "Client requests carried by the entries this node's proposer handed to Raft.",
            ),
            proposed_commands: counter(
                "delayd_proposer_commands_total",
                "Commands carried by the entries this node's proposer handed to Raft.",
            ),
            linger_expired: counter(
                "delayd_proposer_linger_expired_total",
                "Entries proposed because the batch linger ran out before the entry's fill \
                 target was met.",
            ),
            commit_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "delayd_proposer_commit_seconds",
                    "From handing an entry to Raft until it was committed and applied on this \
                     node (or failed).",
                )
                .buckets(COMMIT_SECONDS.to_vec()),
            )
            .expect("valid histogram options"),
            log_bound_purges: counter(
                "delayd_log_bound_purges_total",
                "Purges of the log up to the latest snapshot, past keep_logs, that this node \
                 asked for because its log's files held more than snapshot_log_bytes.",
            ),
            log_bound_snapshots: counter(
                "delayd_log_bound_snapshots_total",
                "Snapshots this node asked for because its log's files held more than \
                 snapshot_log_bytes with the log already purged up to the latest snapshot.",
            ),
        }
    }
}

impl ReplicationMetrics {
    /// Registers every handle in `registry`.
    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        for c in [
            &self.append_requests,
            &self.append_entries,
            &self.commits_folded,
            &self.stream_failures,
            &self.proposed_entries,
            &self.proposed_requests,
            &self.proposed_commands,
            &self.linger_expired,
            &self.log_bound_purges,
            &self.log_bound_snapshots,
        ] {
            registry.register(Box::new(c.clone()))?;
        }
        registry.register(Box::new(self.commit_seconds.clone()))
    }

    /// Requests sent so far.
    pub fn append_requests(&self) -> u64 {
        self.append_requests.get()
    }

    /// Entries sent so far (once per follower).
    pub fn append_entries(&self) -> u64 {
        self.append_entries.get()
    }

    /// Commit-only requests folded so far.
    pub fn commits_folded(&self) -> u64 {
        self.commits_folded.get()
    }

    /// Append streams that could not be opened so far.
    pub fn stream_failures(&self) -> u64 {
        self.stream_failures.get()
    }

    /// Counts one append stream that could not be opened.
    pub(crate) fn stream_failed(&self) {
        self.stream_failures.inc();
    }

    /// Entries proposed so far.
    pub fn proposed_entries(&self) -> u64 {
        self.proposed_entries.get()
    }

    /// Requests carried by the entries proposed so far.
    pub fn proposed_requests(&self) -> u64 {
        self.proposed_requests.get()
    }

    /// Commands carried by the entries proposed so far.
    pub fn proposed_commands(&self) -> u64 {
        self.proposed_commands.get()
    }

    /// Entries proposed so far because the linger ran out.
    pub fn linger_expired(&self) -> u64 {
        self.linger_expired.get()
    }

    /// Counts one entry handed to Raft, carrying `requests` requests of `commands` commands
    /// in all; `expired` when it went because the linger ran out before it was filled.
    pub(crate) fn proposed(&self, requests: usize, commands: usize, expired: bool) {
        self.proposed_entries.inc();
        self.proposed_requests.inc_by(requests as u64);
        self.proposed_commands.inc_by(commands as u64);
        if expired {
            self.linger_expired.inc();
        }
    }

    /// Entries whose commit was timed so far.
    pub fn commits_timed(&self) -> u64 {
        self.commit_seconds.get_sample_count()
    }

    /// The histogram of how long entries take from Raft's hands to applied (or failed): one
    /// handle to move into each entry's task, where cloning every handle here would not do.
    pub(crate) fn commit_seconds(&self) -> Histogram {
        self.commit_seconds.clone()
    }

    /// Counts one purge (`snapshot` false) or one snapshot the log's byte bound asked for.
    pub(crate) fn log_bound_acted(&self, snapshot: bool) {
        if snapshot {
            self.log_bound_snapshots.inc();
        } else {
            self.log_bound_purges.inc();
        }
    }

    /// Counts one request handed to the network, carrying `entries` entries and standing in for
    /// `folded` commit-only requests.
    pub(crate) fn sent(&self, entries: usize, folded: u32) {
        self.append_requests.inc();
        self.append_entries.inc_by(entries as u64);
        self.commits_folded.inc_by(u64::from(folded));
    }
}
