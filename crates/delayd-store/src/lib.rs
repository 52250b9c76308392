//! # delayd-store: the Raft log in files of its own, the state machine in RocksDB
//!
//! This crate is the only place that knows about RocksDB and the log's files. It gives
//! openraft the two storage halves of its storage API — [`LogStore`] (log, vote, commit index) and
//! [`StateMachineStore`] (the replicated job state and its snapshots) — and gives the service a
//! [`StateReader`] for queries. It holds no business rules: what a log entry *means* is
//! `delayd_core::apply`'s business; this crate decides only where the bytes go and when they
//! are durable.
//!
//! ## Layout
//!
//! `<data_dir>/log/` holds the Raft log, the vote and the commit index, in append-only chunk
//! files of checksummed records (the `raft-log` crate; see `log_files.rs`).
//!
//! `<data_dir>/db` is one RocksDB with these column families:
//!
//! | column family | key | value |
//! |---|---|---|
//! | `raft_meta` | `snapshot`, `installing`, `cluster_id` | see `db.rs` |
//! | `sm_*` (every [`delayd_core::Cf`]) | the core's key layouts | the core's values |
//! | `raft_log` | (empty) | where the log was kept before it had files of its own |
//!
//! A data directory from before then has its log, vote, commit index and last purged id
//! copied into `log/` on its first start, and removed from RocksDB once the copy is whole.
//!
//! The store keeps two keys of its own in [`Cf::Meta`](delayd_core::Cf::Meta), under the
//! reserved prefix `raft/`: `raft/last_applied` and `raft/membership`. They live beside the
//! data they describe so that one write batch covers both. Values are encoded with
//! `delayd_core::codec` (a version byte, then postcard).
//!
//! `<data_dir>/snapshots/` holds snapshot files (`<n>.snap`, format in `snapshot.rs`) and
//! temporary files (`<n>.tmp`) that are removed at start-up.
//!
//! ## Durability rules
//!
//! - `save_vote`, `truncate` and `purge` return, and `append` reports `log_io_completed`, only
//!   once the log's flush worker has written and fsynced them (one `fdatasync` per write,
//!   covering a commit index written before it too). Openraft counts an appended entry towards a quorum on the
//!   strength of that report.
//! - `save_committed` is not synced: a lost commit index is learned again.
//! - `apply` is neither synced nor in the WAL: the synced log is the state machine's
//!   write-ahead log. It writes the state changes *and* `raft/last_applied` in one atomic
//!   batch, so a crash loses both together (everything applied since the last memtable flush)
//!   and openraft re-applies from the log. The database flushes all column families together
//!   (`atomic_flush`), so the state a crash leaves is one batch boundary for every column
//!   family. Building a snapshot flushes the state before the snapshot becomes current, and
//!   openraft purges only entries a snapshot covers: the log never loses an entry the state
//!   machine has not durably applied. Installing a snapshot flushes the state before it
//!   clears it, so the key range it clears covers everything on disk. A node that stops on
//!   purpose flushes once Raft has stopped ([`StateReader::flush`]; RocksDB also flushes
//!   unlogged writes when the database closes), so its next start normally has nothing to
//!   re-apply; after a crash the start re-applies from the last flush.
//! - Snapshot files are written to a temporary name, fsynced, renamed and the directory
//!   fsynced; only then does the synced pointer in `raft_meta` name them. The current
//!   snapshot is never replaced by an older one.
//! - Installing a snapshot first verifies the whole file (checksum, structure), then in one
//!   synced batch sets the `installing` marker and clears the state-machine column families,
//!   loads the records in bounded batches, and finishes with one synced batch that writes
//!   `raft/last_applied`, `raft/membership` and the snapshot pointer and removes the marker.
//!   [`Store::open`] finishes an install the marker says was interrupted.
//!
//! ## Concurrency
//!
//! Openraft calls `apply` and `install_snapshot` one at a time, but builds snapshots
//! concurrently with both. A snapshot build reads data, last applied and membership from one
//! RocksDB snapshot, so it is consistent whatever apply does meanwhile; it waits for a running
//! install to finish before taking that snapshot. A build runs on a thread of its own at the
//! lowest CPU priority (`in_background`): it passes over the whole state, and every node
//! starts its own at the same log index. Every other RocksDB and file operation runs on
//! tokio's blocking pool, except those that take less than the hop to the pool and back and
//! run on the calling task: applying a batch of at most 64 commands, and the log's writes
//! and reads (a write hands its record to the log's flush worker, which does the IO; the
//! vote, truncations and purges then await it).
//!
//! The log's reads are mostly of the entries just appended (a leader reads each back once per
//! follower and once to apply it); the last ones stay decoded in memory for them, see
//! `recent.rs`. That window is the log's tail and changes only with the log's own writes.
//! Likewise apply reads mostly what it read or wrote a moment before: the job record a reserve
//! wrote a round trip before its ack, a queue's ready floor for every job that becomes ready,
//! the counters and the clock once per batch. Those stay in a small table for it, see
//! `apply_cache.rs`. The table follows apply's own writes and is cleared before an install
//! replaces the state; readers' consistent views never read it.
//!
//! ## Start-up
//!
//! The state machine here is persistent: `applied_state()` reads what the last apply (or
//! install) wrote, or after a crash what the last flush kept, which is never behind the
//! current snapshot, so openraft never needs to restore it from a snapshot at start-up and
//! replays the log from there.
//!
//! Data directories written by delayd on openraft 0.9 open unchanged: the log entries, vote,
//! log ids, memberships and snapshot metadata keep their serialized layout in 0.10 (a test
//! opens a directory the previous version wrote).
//!
//! ## Caveats
//!
//! - While a snapshot is installed (a follower far behind), [`StateReader::read_view`] fails
//!   with [`StoreError::Installing`] rather than show a half-loaded state.
//! - The apply listener is not called for installs: a snapshot replaces everything.
//! - Opening the store can take as long as a snapshot install when one was interrupted.
//!
//! Backups (an export of the state in the snapshot format), restores into a new data
//! directory and quorum-loss recovery are in `backup.rs`.

mod apply_cache;
mod backup;
mod db;
mod error;
mod identity;
mod log;
mod log_files;
mod metrics;
mod recent;
mod snapshot;
mod state;
#[cfg(test)]
mod test_entries;

use std::path::Path;
use std::sync::Arc;

pub use backup::{recover, restore, verify_file, Recovered, Restored, SnapshotSummary, Tail};
pub use db::{BackgroundWork, ReadView, StorageSizes, WriteStalls};
pub use error::StoreError;
pub use identity::ClusterIdStore;
pub use log::{EncodedEntries, LogFlushes, LogStore};
pub use metrics::StoreMetrics;
pub use state::{ApplyListener, SnapshotBuilder, SnapshotInbox, StateMachineStore, StateReader};

/// A node's id in the cluster.
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// The openraft type configuration of delayd: log entries carry a [`delayd_core::Entry`]
    /// (a batch of commands) and responses are one [`delayd_core::Outcome`] per command. The
    /// rest are openraft's defaults: `u64` terms, the advanced leader id (several leaders per
    /// term are impossible, but a term's leader is named in every log id), `BasicNode`.
    pub TypeConfig:
        D = delayd_core::Entry,
        R = Vec<delayd_core::Outcome>,
        NodeId = NodeId,
        Node = openraft::BasicNode,
);

/// A delayd Raft node.
pub type Raft = openraft::Raft<TypeConfig, StateMachineStore>;

/// One entry of delayd's Raft log.
pub type LogEntry = openraft::alias::EntryOf<TypeConfig>;

/// An upper estimate of a log entry's encoded size in bytes, for the buffer it is encoded
/// into (the log's write, a replication request): its log id and payload tag, and the
/// payload's [`delayd_core::Entry::size_bytes`]. A membership entry, rare and small, is given
/// a generous kilobyte; should one need more, its buffer grows as any would.
pub fn log_entry_size_bytes(entry: &LogEntry) -> usize {
    use openraft::EntryPayload;
    const LOG_ID_AND_TAG: usize = 32;
    LOG_ID_AND_TAG
        + match &entry.payload {
            EntryPayload::Blank => 0,
            EntryPayload::Normal(data) => data.size_bytes(),
            EntryPayload::Membership(_) => 1024,
        }
}

/// A position in the log: the leader that proposed the entry, and its index.
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;

/// A vote: the term and the candidate, and whether a quorum granted it.
pub type Vote = openraft::alias::VoteOf<TypeConfig>;

/// A membership with the log id of the entry that set it.
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;

/// A snapshot's metadata: the last log id it covers and the membership at that point.
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;

/// A snapshot: its metadata and its file, which is what travels to a follower.
pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotData>;

/// What a snapshot's data is: an open file (see `snapshot.rs` for its format).
pub type SnapshotData = tokio::fs::File;

/// Opens the store.
pub struct Store;

impl Store {
    /// Opens (creating if needed) the store in `data_dir`, finishing an interrupted snapshot
    /// install if there is one, and returns its two halves for `Raft::new`.
    ///
    /// Blocks: call it before starting the node, or from `spawn_blocking`. The database stays
    /// open until both halves and every handle derived from them are dropped.
    pub fn open(data_dir: &Path) -> Result<(LogStore, StateMachineStore), StoreError> {
        Store::open_inner(data_dir, None, StoreMetrics::default())
    }

    /// [`Store::open`] for the node `node`, recording into `metrics` (which the caller
    /// registers wherever it exposes them). The node's id sets its memtable budget, so that
    /// the replicas of a cluster do not all flush at the same entry.
    pub fn open_for_node(
        data_dir: &Path,
        node: NodeId,
        metrics: StoreMetrics,
    ) -> Result<(LogStore, StateMachineStore), StoreError> {
        Store::open_inner(data_dir, Some(node), metrics)
    }

    fn open_inner(
        data_dir: &Path,
        node: Option<NodeId>,
        metrics: StoreMetrics,
    ) -> Result<(LogStore, StateMachineStore), StoreError> {
        let db_dir = data_dir.join("db");
        std::fs::create_dir_all(&db_dir)
            .map_err(|e| StoreError::io(format!("create {}", db_dir.display()), e))?;
        let db = Arc::new(db::open(&db_dir, node)?);
        let log = LogStore::open(data_dir, db.clone(), metrics.clone(), log_files::Sizes::DEFAULT)?;
        let snapshots = snapshot::SnapshotDir::open(data_dir.join("snapshots"))?;
        let state = StateMachineStore::open(db, snapshots, metrics, log.flush_stats())?;
        Ok((log, state))
    }
}

/// Turns RocksDB's performance counters off for the calling thread; call it on every thread
/// that works with the store (the node's runtime does, on each of its threads).
///
/// RocksDB keeps a thread-local record of what each thread's calls did (its perf context)
/// and, by default, counts into it on every thread: every key comparison, memtable lookup
/// and block read adds to a counter behind a thread-local access. Nothing in delayd reads
/// those counters, and the comparisons alone are a dozen per memtable insert, some 130 per
/// job a node applies. RocksDB's own flush and compaction threads keep counting: they are
/// not ours to set.
pub fn without_perf_counters() {
    rocksdb::perf::set_perf_stats(rocksdb::perf::PerfStatsLevel::Disable);
}

/// Runs blocking storage work on tokio's blocking pool.
async fn blocking<T, F>(f: F) -> Result<T, StoreError>
where
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f).await.map_err(|e| StoreError::Task(e.to_string()))?
}

/// Runs long blocking storage work (building a snapshot) on a thread of its own named `name`,
/// at the lowest CPU priority (nice 19).
///
/// A snapshot build reads and writes the whole state: some 3–4 µs of CPU per stored job on
/// each node (0.3–0.4 s for 88,000 jobs), and every node reaches the snapshot's log index, and
/// so starts its build, at the same moment. At normal priority that is a burst that takes
/// the cores from the threads that serve, replicate and sync the log for as long as it
/// lasts. A priority matters only while the cores are contended: on idle cores the build
/// runs as fast as before. The thread is new for each call because a thread cannot raise
/// its priority again without privileges, and a pool thread left at nice 19 would run
/// foreground work later.
async fn in_background<T, F>(name: &str, f: F) -> Result<T, StoreError>
where
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
    T: Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            lower_this_threads_priority();
            without_perf_counters();
            // The receiver is gone only if the caller stopped waiting; the result is moot.
            let _ = tx.send(f());
        })
        .map_err(|e| StoreError::Task(format!("cannot start the {name} thread: {e}")))?;
    rx.await.map_err(|_| StoreError::Task(format!("the {name} thread ended without a result")))?
}

/// The lowest CPU priority, for the calling thread only: Linux keeps a nice value per
/// thread. A failure leaves the thread at its priority and is only logged.
fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 19) {
        tracing::warn!(error = %e, "cannot lower a background thread's CPU priority");
    }
}

/// This process's threads named `name` (the name Linux keeps in `/proc/self/task/*/comm`),
/// or `None` when the list cannot be read.
#[cfg(target_os = "linux")]
pub(crate) fn threads_named(name: &str) -> Option<Vec<rustix::process::Pid>> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    let named = |task: &std::fs::DirEntry| {
        std::fs::read_to_string(task.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
    };
    let tid = |task: std::fs::DirEntry| {
        task.file_name().to_str()?.parse().ok().and_then(rustix::process::Pid::from_raw)
    };
    Some(tasks.flatten().filter(named).filter_map(tid).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread that called [`without_perf_counters`] adds nothing to RocksDB's perf
    /// context, while one that did not counts every key comparison (so the check can fail).
    #[test]
    fn rocksdb_counts_nothing_on_a_thread_without_perf_counters() {
        use rocksdb::perf::{PerfContext, PerfMetric};
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Arc::new(db::open(dir.path(), None).expect("open"));
        let comparisons = |quiet: bool| {
            let db = db.clone();
            std::thread::spawn(move || {
                if quiet {
                    without_perf_counters();
                }
                let mut perf = PerfContext::default();
                perf.reset();
                let cf = db::cf(&db, delayd_core::Cf::Jobs.name()).expect("column family");
                for i in 0..100u32 {
                    db.put_cf(cf, i.to_be_bytes(), b"v").expect("put");
                }
                for i in 0..100u32 {
                    db.get_cf(cf, i.to_be_bytes()).expect("get");
                }
                perf.metric(PerfMetric::UserKeyComparisonCount)
            })
            .join()
            .expect("thread")
        };
        assert!(comparisons(false) > 0);
        assert_eq!(comparisons(true), 0);
    }

    /// A log entry's buffer is sized before it is encoded, for the log and for replication:
    /// below the encoded size it would grow on the way.
    #[test]
    fn a_log_entry_size_estimate_holds_its_encoding() {
        use openraft::testing::log_id;
        let nodes = (1..=3)
            .map(|id| (id, openraft::BasicNode::new(format!("node-{id}.example.internal:7970"))))
            .collect::<std::collections::BTreeMap<NodeId, _>>();
        let voters = nodes.keys().copied().collect();
        let membership = openraft::Membership::new(vec![voters], nodes).expect("membership");
        let entries = [
            test_entries::publish_entry(u64::MAX, u64::MAX, vec![7; 5000]),
            test_entries::cancel_entry(3, 9, u128::MAX),
            openraft::Entry {
                log_id: log_id::<TypeConfig>(u64::MAX, u64::MAX, u64::MAX),
                payload: openraft::EntryPayload::Blank,
            },
            openraft::Entry {
                log_id: log_id::<TypeConfig>(u64::MAX, u64::MAX, u64::MAX),
                payload: openraft::EntryPayload::Membership(membership),
            },
        ];
        for entry in &entries {
            let encoded = delayd_core::codec::encode(entry).len();
            assert!(encoded <= log_entry_size_bytes(entry), "{encoded} bytes: {entry}");
        }
    }

    /// The nice values of this process's threads named `name`.
    #[cfg(target_os = "linux")]
    pub(crate) fn nice_of(name: &str) -> Vec<i32> {
        let threads = threads_named(name).expect("tasks");
        // A thread can end between the listing and this read (a snapshot build's does, while
        // a test watches for it): it has no nice value left to report.
        threads
            .into_iter()
            .filter_map(|t| rustix::process::getpriority_process(Some(t)).ok())
            .collect()
    }

    /// The CPU priority of the calling thread, as Linux keeps it.
    #[cfg(target_os = "linux")]
    pub(crate) fn own_nice() -> i32 {
        rustix::process::getpriority_process(Some(rustix::thread::gettid())).expect("priority")
    }

    /// Background work runs on a thread of its own, named, at nice 19, and hands back its
    /// result (or its error); the caller's own priority is left as it was.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn background_work_runs_at_the_lowest_priority_on_a_thread_of_its_own() {
        let caller = own_nice();
        let (name, nice) = in_background("delayd-test-bg", || {
            let name = std::thread::current().name().map(str::to_owned);
            Ok((name, own_nice()))
        })
        .await
        .expect("result");
        assert_eq!(name.as_deref(), Some("delayd-test-bg"));
        assert_eq!(nice, 19);
        assert_eq!(own_nice(), caller, "the caller's priority changed");
        let failed: Result<(), _> =
            in_background("delayd-test-bg", || Err(StoreError::Task("boom".into()))).await;
        assert!(matches!(&failed, Err(StoreError::Task(m)) if m == "boom"), "{failed:?}");
    }
}
