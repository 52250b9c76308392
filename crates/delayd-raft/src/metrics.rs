//! The transport's own Prometheus metrics: what replication puts on the wire.
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

use prometheus::{IntCounter, Opts, Registry};

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
}

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
        }
    }
}

impl ReplicationMetrics {
    /// Registers every handle in `registry`.
    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        for c in [&self.append_requests, &self.append_entries, &self.commits_folded] {
            registry.register(Box::new(c.clone()))?;
        }
        Ok(())
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

    /// Counts one request handed to the network, carrying `entries` entries and standing in for
    /// `folded` commit-only requests.
    pub(crate) fn sent(&self, entries: usize, folded: u32) {
        self.append_requests.inc();
        self.append_entries.inc_by(entries as u64);
        self.commits_folded.inc_by(u64::from(folded));
    }
}
