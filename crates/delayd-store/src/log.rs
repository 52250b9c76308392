//! The Raft log and vote: [`LogStore`].

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use delayd_core::codec;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::OptionalSend;
use raft_log::api::raft_log_writer::RaftLogWriter;
use rocksdb::WriteBatch;

use crate::db::{self, log_key, meta_key, Db, CF_LOG, CF_RAFT_META};
use crate::error::StoreError;
use crate::log_files::{self, Coded, Flushed, StoredEntry, Wal};
use crate::metrics::StoreMetrics;
use crate::recent::{Encoded, Recent};
use crate::{LogEntry, LogId, TypeConfig, Vote};

/// The Raft log, vote and commit index, in files of their own (`<data_dir>/log/`, see
/// `log_files.rs`).
///
/// Cloning is cheap (a few `Arc`s); the clone handed out by `get_log_reader` reads the same
/// log and the same window of recent entries ([`Recent`]). Every write openraft relies on
/// after a crash is synced before openraft is told it is durable: votes, truncations and
/// purges before the call returns, appends by the log's flush worker, which completes the
/// append's callback once its fsync is done: openraft's core never waits for an fsync.
#[derive(Clone)]
pub struct LogStore {
    /// The cluster identity is kept in RocksDB, beside the state it names.
    db: Arc<Db>,
    wal: Arc<Mutex<Wal>>,
    /// The last entries appended, decoded. Changed only by this store's own writes: an
    /// append after its write succeeded, a truncation or purge before its write (a reader
    /// must never be handed an entry the log may no longer hold).
    recent: Arc<Mutex<Recent>>,
    metrics: StoreMetrics,
}

/// The bytes the log stored for its most recent entries, for replication requests that carry
/// them (see [`LogStore::encoded_entries`]).
#[derive(Clone)]
pub struct EncodedEntries {
    recent: Arc<Mutex<Recent>>,
}

impl EncodedEntries {
    /// The bytes stored for the entry `log_id` names ([`delayd_core::codec`]'s version byte,
    /// then the entry's postcard encoding), if it is among the log's most recent entries.
    /// They are those of that very entry: a truncated entry's index, appended again by a new
    /// leader, answers for the new entry only.
    pub fn get(&self, log_id: &LogId) -> Option<Arc<Vec<u8>>> {
        self.recent.lock().unwrap_or_else(PoisonError::into_inner).encoded(log_id)
    }

    /// On a follower: entries just received from the leader, each with its postcard
    /// encoding as it came on the wire. The append that stores them writes these bytes,
    /// behind the version byte, instead of encoding the entries again. Call it only with
    /// bytes of the current [`delayd_core::codec::VERSION`]'s encoding (a request whose own
    /// version byte is that version): stored behind that byte, they must read back as it
    /// reads.
    pub fn received<'a>(&self, entries: impl IntoIterator<Item = (LogId, &'a [u8])>) {
        let stored = entries.into_iter().map(|(log_id, bytes)| {
            let mut value = Vec::with_capacity(bytes.len() + 1);
            value.push(codec::VERSION);
            value.extend_from_slice(bytes);
            (log_id, Arc::new(value))
        });
        let stored: Vec<_> = stored.collect();
        self.recent.lock().unwrap_or_else(PoisonError::into_inner).received(stored);
    }
}

/// What the log's flush worker has done since the store opened, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogFlushes {
    /// fsyncs of the log's files: one per write handed to the worker (an append, a vote, a
    /// truncation, a purge).
    pub fsyncs: u64,
    /// Microseconds spent in those fsyncs.
    pub fsync_micros: u64,
    /// The log's chunk files on disk, in bytes.
    pub disk_bytes: u64,
}

impl LogStore {
    /// What the log stored for its most recent entries, as they are appended: a leader's
    /// replication requests copy these instead of encoding each entry again per follower.
    pub fn encoded_entries(&self) -> EncodedEntries {
        EncodedEntries { recent: self.recent.clone() }
    }

    /// The handle on this node's cluster identity (kept beside the state).
    pub fn cluster_ids(&self) -> crate::ClusterIdStore {
        crate::ClusterIdStore::new(self.db.clone())
    }

    /// Opens the log in `<data_dir>/log`. A data directory written before the log had files
    /// of its own (it kept the log in RocksDB) has its log, vote and commit index copied over
    /// first; see [`import_legacy`]. Blocking.
    pub(crate) fn open(
        data_dir: &Path,
        db: Arc<Db>,
        metrics: StoreMetrics,
        sizes: log_files::Sizes,
    ) -> Result<Self, StoreError> {
        let dir = data_dir.join(log_files::DIR);
        let legacy = Legacy::read(&db)?;
        if !dir.exists() && !legacy.is_empty() {
            import_legacy(&db, &legacy, &dir)?;
        }
        let wal = log_files::open(&dir, sizes)?;
        if !legacy.is_empty() {
            refuse_newer_legacy(&legacy, &wal)?;
            remove_legacy(&db)?;
        }
        Ok(LogStore { db, wal: Arc::new(Mutex::new(wal)), recent: Arc::default(), metrics })
    }

    /// A handle on the log's flush statistics that does not keep the store open.
    pub(crate) fn flush_stats(&self) -> FlushStats {
        FlushStats(Arc::downgrade(&self.wal))
    }

    /// The last entry's index, if the log holds any.
    pub(crate) fn last_entry_index(&self) -> Option<u64> {
        let wal = self.wal();
        let state = wal.log_state();
        state.last().filter(|last| Some(*last) > state.purged()).map(|l| l.0.index)
    }

    /// The last commit index this log saved.
    pub(crate) fn committed(&self) -> Option<LogId> {
        self.wal().log_state().committed().map(|c| c.0)
    }

    /// For a restored data directory: an empty log that starts after `last` (everything up
    /// to it purged and committed), with `vote` saved. Blocking: returns once it is synced.
    pub(crate) fn start_after(&self, last: LogId, vote: Vote) -> Result<(), StoreError> {
        let mut wal = self.wal();
        let io = |e| StoreError::io("start the log after a restored snapshot", e);
        wal.save_vote(Coded(vote)).map_err(io)?;
        wal.purge(Coded(last)).map_err(io)?;
        wal.commit(Coded(last)).map_err(io)?;
        self.recent().purged_upto(last.index);
        log_files::sync_blocking(&mut wal)
    }

    /// Entries with `start <= index < end`. Blocking.
    pub(crate) fn read_range(&self, start: u64, end: u64) -> Result<Vec<LogEntry>, StoreError> {
        read_entries(&self.wal, start, Some(end))
    }

    fn wal(&self) -> MutexGuard<'_, Wal> {
        // Every write checks its record before it changes anything, so a panic elsewhere
        // leaves the log as its last write left it.
        self.wal.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn recent(&self) -> MutexGuard<'_, Recent> {
        // The window is rebuilt by appends; a panic elsewhere leaves it contiguous or empty.
        self.recent.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Hands what was written to the log's flush worker; the receiver hears once it is on disk.
/// A plain function, so that the caller's guard is gone before it awaits: a future that
/// holds a `MutexGuard` cannot move between threads.
fn hand_to_worker(wal: &mut Wal) -> Result<Synced, std::io::Error> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    wal.flush(true, Some(Flushed::Awaited(tx)))?;
    Ok(Synced(Some(rx)))
}

/// A write handed to the flush worker ([`hand_to_worker`]), or none (`Synced(None)`).
struct Synced(Option<tokio::sync::oneshot::Receiver<std::io::Result<()>>>);

impl Synced {
    async fn wait(self, what: &str) -> Result<(), std::io::Error> {
        let Some(rx) = self.0 else { return Ok(()) };
        match rx.await {
            Ok(result) => result.map_err(|e| std::io::Error::new(e.kind(), format!("{what}: {e}"))),
            Err(_) => Err(std::io::Error::other(format!("{what}: the log's flush worker stopped"))),
        }
    }
}

/// The log's flush statistics, read by `/metrics` through the state reader.
#[derive(Clone)]
pub(crate) struct FlushStats(std::sync::Weak<Mutex<Wal>>);

impl FlushStats {
    /// `f` over the log under its lock; `None` once the log has closed.
    fn with<T>(&self, f: impl FnOnce(&Wal) -> T) -> Option<T> {
        let wal = self.0.upgrade()?;
        let wal = wal.lock().unwrap_or_else(PoisonError::into_inner);
        Some(f(&wal))
    }

    /// `None` once the log has closed.
    pub(crate) fn read(&self) -> Option<LogFlushes> {
        self.with(|wal| {
            let m = wal.stat().flush_metrics;
            LogFlushes {
                fsyncs: m.sync_batch_count,
                fsync_micros: m.sync_us,
                disk_bytes: wal.on_disk_size(),
            }
        })
    }

    /// The log's chunk files on disk, in bytes; `None` once the log has closed. Unlike
    /// [`FlushStats::read`], which gathers every chunk's statistics under the log's lock,
    /// this holds the lock for one subtraction.
    pub(crate) fn disk_bytes(&self) -> Option<u64> {
        self.with(Wal::on_disk_size)
    }
}

/// Entries with `start <= index < end` (`end` `None`: to the end of the log). Only the
/// stored bytes are taken under the log's lock (shared, or read from a closed chunk); the
/// entries are decoded after it is released, so that appends do not wait for the decoding.
fn read_entries(
    wal: &Mutex<Wal>,
    start: u64,
    end: Option<u64>,
) -> Result<Vec<LogEntry>, StoreError> {
    let end = end.unwrap_or(u64::MAX);
    if end <= start {
        return Ok(Vec::new());
    }
    let stored: Vec<Encoded> = {
        let wal = wal.lock().unwrap_or_else(PoisonError::into_inner);
        let read = wal.read(start, end).map(|r| r.map(|(_, StoredEntry(bytes))| bytes));
        read.collect::<Result<_, _>>().map_err(|e| StoreError::io("read the log", e))?
    };
    stored.iter().map(|bytes| Ok(codec::decode(bytes)?)).collect()
}

/// What a data directory from before the log had files of its own kept of the log in
/// RocksDB: read once on opening, to move it ([`import_legacy`]), to check it is not newer
/// than the files ([`refuse_newer_legacy`]) and to delete it ([`remove_legacy`]).
struct Legacy {
    vote: Option<Vote>,
    purged: Option<LogId>,
    committed: Option<LogId>,
    /// The log id of its last entry, if it holds any.
    last: Option<LogId>,
}

impl Legacy {
    fn read(db: &Db) -> Result<Self, StoreError> {
        let mut it = db.raw_iterator_cf(db::cf(db, CF_LOG)?);
        it.seek_to_last();
        let last = it.value().map(codec::decode::<LogEntry>).transpose()?.map(|e| e.log_id);
        it.status()?;
        Ok(Legacy {
            vote: db::get_decoded(db, CF_RAFT_META, meta_key::VOTE)?,
            purged: db::get_decoded(db, CF_RAFT_META, meta_key::LAST_PURGED)?,
            committed: db::get_decoded::<Option<LogId>>(db, CF_RAFT_META, meta_key::COMMITTED)?
                .flatten(),
            last,
        })
    }

    fn is_empty(&self) -> bool {
        self.vote.is_none()
            && self.purged.is_none()
            && self.committed.is_none()
            && self.last.is_none()
    }
}

/// Copies the log, vote, commit index and last purged id `legacy` found in RocksDB into a new
/// log at `dir`.
///
/// The copy is made in `<dir>.import`, synced, and renamed to `dir` (the parent directory
/// synced after): a crash during the copy leaves no `dir`, and the next start copies again
/// from scratch. RocksDB's copy is removed only once `dir` exists ([`remove_legacy`]).
fn import_legacy(db: &Db, legacy: &Legacy, dir: &Path) -> Result<(), StoreError> {
    let parent = dir.parent().unwrap_or(Path::new("."));
    let staging = dir.with_extension("import");
    if staging.exists() {
        std::fs::remove_dir_all(&staging)
            .map_err(|e| StoreError::io(format!("remove {}", staging.display()), e))?;
    }
    {
        let mut wal = log_files::open(&staging, log_files::Sizes::DEFAULT)?;
        let io = |e| StoreError::io("copy the log out of RocksDB", e);
        if let Some(vote) = legacy.vote {
            wal.save_vote(Coded(vote)).map_err(io)?;
        }
        if let Some(purged) = legacy.purged {
            wal.purge(Coded(purged)).map_err(io)?;
        }
        let mut it = db.raw_iterator_cf(db::cf(db, CF_LOG)?);
        it.seek_to_first();
        while let Some(value) = it.value() {
            let entry: LogEntry = codec::decode(value)?;
            let stored = StoredEntry(Arc::new(value.to_vec()));
            wal.append([(Coded(entry.log_id), stored)]).map_err(io)?;
            it.next();
        }
        it.status()?;
        let committed = legacy.committed.map(Coded).filter(|c| Some(c) <= wal.log_state().last());
        if let Some(committed) = committed {
            wal.commit(committed).map_err(io)?;
        }
        log_files::sync_blocking(&mut wal)?;
    }
    std::fs::rename(&staging, dir).map_err(|e| {
        StoreError::io(format!("rename {} to {}", staging.display(), dir.display()), e)
    })?;
    std::fs::File::open(parent)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io(format!("sync {}", parent.display()), e))?;
    tracing::info!(dir = %dir.display(), "moved the Raft log out of RocksDB into files of its own");
    Ok(())
}

/// Refuses to open a log whose data directory was started, since its log was moved to its
/// files, by a delayd that keeps the log in RocksDB (a downgrade, then an upgrade again): that
/// binary voted and appended into RocksDB, and neither the files nor a copy of RocksDB's log
/// over them would be safe to go on with. What RocksDB holds after an ordinary move is what
/// the files started from, never newer: the move removes it only once the files are whole.
fn refuse_newer_legacy(legacy: &Legacy, wal: &Wal) -> Result<(), StoreError> {
    let state = wal.log_state();
    let newer_vote = legacy.vote.is_some_and(|v| Some(&Coded(v)) > state.vote());
    let newer_log = legacy.last.is_some_and(|l| Some(&Coded(l)) > state.last());
    if newer_vote || newer_log {
        return Err(StoreError::Refused(
            "this data directory was run by an older delayd (one that keeps the Raft log in \
             RocksDB) after its log moved to log/: its vote or log in RocksDB is newer than \
             log/'s. Going back to that version is not supported; restore the node from a \
             backup or let it rejoin as a new node"
                .into(),
        ));
    }
    Ok(())
}

/// Deletes what [`import_legacy`] copied out of RocksDB.
fn remove_legacy(db: &Db) -> Result<(), StoreError> {
    let log = db::cf(db, CF_LOG)?;
    let meta = db::cf(db, CF_RAFT_META)?;
    let mut batch = WriteBatch::default();
    batch.delete_range_cf(log, log_key(0), log_key(u64::MAX));
    batch.delete_cf(log, log_key(u64::MAX));
    for key in [meta_key::VOTE, meta_key::COMMITTED, meta_key::LAST_PURGED] {
        batch.delete_cf(meta, key);
    }
    db.write_opt(batch, &db::synced())?;
    // The range tombstone would otherwise stay in the column family's files until a
    // compaction happens to pass over it.
    db.compact_range_cf(log, None::<&[u8]>, None::<&[u8]>);
    Ok(())
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<LogEntry>, std::io::Error> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => match i.checked_add(1) {
                Some(i) => i,
                None => return Ok(Vec::new()),
            },
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&i) => i.checked_add(1),
            Bound::Excluded(&i) => Some(i),
            Bound::Unbounded => None,
        };
        if let Some(end) = end {
            if let Some(entries) = self.recent().get(start, end) {
                return Ok(entries);
            }
        }
        // Inline: what misses the window is mostly just behind it, in the log's cache, and
        // read in microseconds; a hop to the blocking pool would cost more than the read.
        read_entries(&self.wal, start, end).map_err(std::io::Error::from)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, std::io::Error> {
        Ok(self.wal().log_state().vote().map(|v| v.0))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, std::io::Error> {
        let wal = self.wal();
        let state = wal.log_state();
        // The log's `last` is the last entry appended or, once a purge passed it, the last
        // purged: what openraft expects as the last log id either way.
        Ok(LogState {
            last_purged_log_id: state.purged().map(|p| p.0),
            last_log_id: state.last().map(|l| l.0),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), std::io::Error> {
        let synced = {
            let mut wal = self.wal();
            wal.save_vote(Coded(*vote))?;
            hand_to_worker(&mut wal)?
        };
        synced.wait("saving the vote").await
    }

    /// Not synced: losing the latest commit index in a crash only means re-learning it from
    /// the leader. Its record rides along with the next synced write, and costs no write of
    /// its own.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), std::io::Error> {
        let Some(committed) = committed else { return Ok(()) };
        let index = committed.index;
        {
            let mut wal = self.wal();
            let state = wal.log_state();
            let committed = Coded(committed);
            // The log refuses a commit index that goes back or passes its last entry; openraft
            // gives neither, and a refusal here would stop the node for a value that may be lost.
            if Some(&committed) > state.committed() && Some(&committed) <= state.last() {
                wal.commit(committed)?;
            }
        }
        self.metrics.commit_index.set(i64::try_from(index).unwrap_or(i64::MAX));
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, std::io::Error> {
        Ok(self.committed())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), std::io::Error>
    where
        I: IntoIterator<Item = LogEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let appended = Instant::now();
        let entries: Vec<LogEntry> = entries.into_iter().collect();
        let known: Vec<Option<Encoded>> = {
            let mut recent = self.recent();
            entries.iter().map(|e| recent.take_received(&e.log_id)).collect()
        };
        let written: Vec<Encoded> = entries
            .iter()
            .zip(known)
            .map(|(entry, known)| {
                known.unwrap_or_else(|| {
                    Arc::new(codec::encode_sized(entry, crate::log_entry_size_bytes(entry)))
                })
            })
            .collect();
        // Inline: the write goes to the log's buffer and the entries to its cache in
        // microseconds (the worker writes and fsyncs); a hop to the blocking pool would cost
        // more. The callback tells openraft once the entries are on disk, and only then may it
        // count them towards a quorum.
        {
            let mut wal = self.wal();
            let stored = entries.iter().zip(&written);
            wal.append(stored.map(|(e, b)| (Coded(e.log_id), StoredEntry(b.clone()))))?;
            let seconds = self.metrics.log_append_seconds.clone();
            wal.flush(true, Some(Flushed::Append { appended, callback, seconds }))?;
        }
        // Readable from the window at once, like from the log: replication sends entries
        // before they are durable, and only a quorum's durability commits them.
        self.recent().appended(entries.into_iter().zip(written));
        Ok(())
    }

    /// Keeps the log up to and including `last_log_id` and deletes everything after it.
    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), std::io::Error> {
        let from = last_log_id.map_or(0, |l| l.index.saturating_add(1));
        self.recent().truncated_from(from);
        let synced = {
            let mut wal = self.wal();
            let state = wal.log_state();
            // Only entries the log holds: none after its last one, and from the first after
            // the purged ones at the lowest (openraft never cuts below them, and the log
            // could not name the entry before a purged index).
            let first_held = state.purged().map_or(0, |p| p.0.index.saturating_add(1));
            let last_held = state.last().filter(|last| Some(*last) > state.purged());
            if last_held.is_some_and(|last| from <= last.0.index) {
                wal.truncate(from.max(first_held))?;
                hand_to_worker(&mut wal)?
            } else {
                Synced(None)
            }
        };
        synced.wait("truncating the log").await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), std::io::Error> {
        self.recent().purged_upto(log_id.index);
        let synced = {
            let mut wal = self.wal();
            wal.purge(Coded(log_id))?;
            hand_to_worker(&mut wal)?
        };
        synced.wait("purging the log").await
    }
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorageExt;
    use openraft::testing::{blank_ent, log_id};

    use super::*;
    use crate::test_entries::publish_entry;
    use crate::Store;

    fn open(dir: &std::path::Path) -> LogStore {
        Store::open(dir).expect("open").0
    }

    async fn indexes(log: &mut LogStore) -> Vec<u64> {
        let entries = log.try_get_log_entries(..).await.expect("read");
        entries.iter().map(|e| e.log_id.index).collect()
    }

    #[tokio::test]
    async fn raft_writes_are_fsynced_and_survive_reopening() {
        let dir = tempfile::tempdir().expect("dir");
        let mut log = open(dir.path());
        let fsyncs = |log: &LogStore| log.flush_stats().read().expect("the log is open").fsyncs;

        let before = fsyncs(&log);
        log.blocking_append((1..=6).map(|i| blank_ent::<TypeConfig>(1, 0, i)))
            .await
            .expect("append");
        assert_eq!(fsyncs(&log), before + 1, "append");
        log.save_vote(&Vote::new(2, 7)).await.expect("vote");
        assert_eq!(fsyncs(&log), before + 2, "save_vote");
        log.truncate_after(Some(log_id::<TypeConfig>(1, 0, 4))).await.expect("truncate");
        assert_eq!(fsyncs(&log), before + 3, "truncate");
        log.purge(log_id::<TypeConfig>(1, 0, 2)).await.expect("purge");
        assert_eq!(fsyncs(&log), before + 4, "purge");
        log.save_committed(Some(log_id::<TypeConfig>(1, 0, 3))).await.expect("committed");
        assert_eq!(fsyncs(&log), before + 4, "save_committed rides on the next sync");
        // Nothing to truncate after the last entry: no write at all.
        log.truncate_after(Some(log_id::<TypeConfig>(1, 0, 4))).await.expect("truncate");
        assert_eq!(fsyncs(&log), before + 4, "an empty truncation");

        // What a crash would leave right now: the files as they are, the log still open (a
        // clean close writes what is pending, and would prove nothing).
        let crashed = tempfile::tempdir().expect("dir");
        crate::test_entries::copy_tree(dir.path(), crashed.path());
        let mut copy = open(crashed.path());
        assert_eq!(indexes(&mut copy).await, [3, 4]);
        assert_eq!(copy.read_vote().await.expect("vote"), Some(Vote::new(2, 7)));
        assert_eq!(copy.read_committed().await.expect("committed"), None, "not synced yet");
        let state = copy.get_log_state().await.expect("state");
        assert_eq!(state.last_purged_log_id, Some(log_id::<TypeConfig>(1, 0, 2)));
        assert_eq!(state.last_log_id, Some(log_id::<TypeConfig>(1, 0, 4)));
        drop(copy);

        // The next append carries the commit index to disk with it.
        log.blocking_append([blank_ent::<TypeConfig>(3, 1, 5)]).await.expect("append");
        let crashed = tempfile::tempdir().expect("dir");
        crate::test_entries::copy_tree(dir.path(), crashed.path());
        let mut copy = open(crashed.path());
        assert_eq!(indexes(&mut copy).await, [3, 4, 5], "the log goes on where it was cut");
        assert_eq!(
            copy.read_committed().await.expect("committed"),
            Some(log_id::<TypeConfig>(1, 0, 3))
        );
    }

    #[tokio::test]
    async fn range_reads_honour_every_bound_kind() {
        let dir = tempfile::tempdir().expect("dir");
        let mut log = open(dir.path());
        log.blocking_append((0..10).map(|i| blank_ent::<TypeConfig>(1, 0, i)))
            .await
            .expect("append");
        // Opened again, the window of recent entries is empty: every read is the files'.
        drop(log);
        let mut log = open(dir.path());
        let read = |r: (Bound<u64>, Bound<u64>)| {
            let mut log = log.clone();
            async move {
                let entries = log.try_get_log_entries(r).await.expect("read");
                entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>()
            }
        };
        assert_eq!(read((Bound::Included(3), Bound::Excluded(5))).await, [3, 4]);
        assert_eq!(read((Bound::Excluded(3), Bound::Included(5))).await, [4, 5]);
        assert_eq!(read((Bound::Unbounded, Bound::Excluded(2))).await, [0, 1]);
        assert_eq!(read((Bound::Included(8), Bound::Unbounded)).await, [8, 9]);
        assert!(read((Bound::Included(5), Bound::Excluded(5))).await.is_empty());
        assert!(read((Bound::Included(7), Bound::Excluded(5))).await.is_empty());
        assert!(read((Bound::Excluded(u64::MAX), Bound::Unbounded)).await.is_empty());
        assert_eq!(read((Bound::Included(9), Bound::Included(u64::MAX))).await, [9]);
        // The purged-only log still reports where it ends.
        log.purge(log_id::<TypeConfig>(1, 0, 9)).await.expect("purge");
        assert!(indexes(&mut log).await.is_empty());
        let state = log.get_log_state().await.expect("state");
        assert_eq!(state.last_log_id, Some(log_id::<TypeConfig>(1, 0, 9)));
        assert_eq!(log.last_entry_index(), None);
    }

    /// What the disk holds once a process dies mid-write: the last record cut short. The log
    /// opens with every entry before it.
    #[tokio::test]
    async fn a_torn_last_record_is_cut_off_on_opening() {
        let dir = tempfile::tempdir().expect("dir");
        let mut log = open(dir.path());
        // Incompressible, so that each record is at least as long as its body.
        let body = log_files::noise(300);
        log.blocking_append((1..=3).map(|i| publish_entry(1, i, body.clone())))
            .await
            .expect("append");
        drop(log);
        let chunks: Vec<_> = std::fs::read_dir(dir.path().join(log_files::DIR))
            .expect("list")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "wal"))
            .collect();
        let last = chunks.iter().max().expect("a chunk file");
        let len = std::fs::metadata(last).expect("size").len();
        // Cut into the middle of the last entry's record (its body alone is 300 bytes).
        let file = std::fs::OpenOptions::new().write(true).open(last).expect("open chunk");
        file.set_len(len - 100).expect("cut");
        drop(file);

        let mut log = open(dir.path());
        assert_eq!(indexes(&mut log).await, [1, 2]);
        let state = log.get_log_state().await.expect("state");
        assert_eq!(state.last_log_id.map(|l| l.index), Some(2));
        log.blocking_append([publish_entry(1, 3, body)]).await.expect("append after the cut");
        assert_eq!(indexes(&mut log).await, [1, 2, 3]);
    }

    /// The log against a model of what openraft may ask of it, with chunks a few KiB long
    /// (every few appends close one) and, in half the walks, a cache too small to hold a
    /// closed chunk's entries (reads go to the files): appends in the current term, a new
    /// leader truncating above the commit index and appending in its own term, commits,
    /// purges below the commit index, votes, and the process killed (the files copied as
    /// they are, then opened) or closed and opened again. After every step the log must
    /// hold exactly the model's entries, byte for byte.
    #[tokio::test]
    async fn a_random_walk_of_raft_writes_crashes_and_reopens_keeps_the_log_exact() {
        use rand::{Rng, SeedableRng};
        use std::collections::BTreeMap;

        #[derive(Default)]
        struct Model {
            entries: BTreeMap<u64, LogEntry>,
            purged: Option<LogId>,
            committed: Option<LogId>,
            vote: Option<Vote>,
            term: u64,
        }
        impl Model {
            fn last(&self) -> Option<LogId> {
                self.entries.values().next_back().map(|e| e.log_id).or(self.purged)
            }
        }

        fn open_small(dir: &std::path::Path, sizes: log_files::Sizes) -> LogStore {
            let db = db::open(&dir.join("db"), None).expect("db");
            LogStore::open(dir, Arc::new(db), StoreMetrics::default(), sizes).expect("open")
        }

        async fn check(log: &mut LogStore, model: &Model, step: &str) {
            let got = log.try_get_log_entries(..).await.expect("read");
            let want: Vec<&LogEntry> = model.entries.values().collect();
            assert_eq!(got.len(), want.len(), "{step}: entries held");
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(codec::encode(g), codec::encode(*w), "{step}: entry {}", w.log_id);
            }
            let state = log.get_log_state().await.expect("state");
            assert_eq!(state.last_purged_log_id, model.purged, "{step}: purged");
            assert_eq!(state.last_log_id, model.last(), "{step}: last");
            assert_eq!(log.read_vote().await.expect("vote"), model.vote, "{step}: vote");
            assert_eq!(log.committed(), model.committed, "{step}: committed");
        }

        for seed in 0..12u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let sizes = log_files::Sizes {
                chunk_bytes: rng.random_range(2_000..8_000),
                cache_bytes: if seed % 2 == 0 { 1_000 } else { 16 << 20 },
            };
            let mut dirs = vec![tempfile::tempdir().expect("dir")];
            let mut log = open_small(dirs[0].path(), sizes);
            let mut model = Model { term: 1, ..Model::default() };
            for step in 0..300 {
                let what = rng.random_range(0..100);
                let at = format!("seed {seed} step {step} ({what})");
                let last = model.last().map_or(0, |l| l.index);
                let floor = model.committed.max(model.purged).map_or(0, |l| l.index);
                if what < 55 {
                    // Append in the current term, bodies from tiny to several hundred bytes,
                    // compressible or not.
                    let entries: Vec<LogEntry> = (1..=rng.random_range(1..6u64))
                        .map(|i| {
                            let len = rng.random_range(0..700);
                            let body = if rng.random_bool(0.5) {
                                vec![b'x'; len]
                            } else {
                                log_files::noise(len)
                            };
                            publish_entry(model.term, last + i, body)
                        })
                        .collect();
                    log.blocking_append(entries.clone()).await.expect("append");
                    model.entries.extend(entries.into_iter().map(|e| (e.log_id.index, e)));
                } else if what < 65 && last > floor {
                    // A new leader keeps a prefix the old one's commit index lies in.
                    let keep = rng.random_range(floor..last);
                    // `keep` is at least the purged index: held, purged, or 0 (keep nothing).
                    let kept = model.entries.get(&keep).map(|e| e.log_id).or(model.purged);
                    log.truncate_after(kept).await.expect("truncate");
                    model.entries.split_off(&(keep + 1));
                    model.term += 1;
                } else if what < 80 && last > model.committed.map_or(0, |c| c.index) {
                    let from = model.committed.map_or(0, |c| c.index) + 1;
                    let index = rng.random_range(from..=last);
                    let Some(id) = model.entries.get(&index).map(|e| e.log_id) else { continue };
                    log.save_committed(Some(id)).await.expect("commit");
                    model.committed = Some(id);
                } else if what < 85 {
                    let Some(committed) = model.committed else { continue };
                    let below = model.purged.map_or(1, |p| p.index + 1);
                    if committed.index < below {
                        continue;
                    }
                    let index = rng.random_range(below..=committed.index);
                    let id = model.entries[&index].log_id;
                    log.purge(id).await.expect("purge");
                    model.entries = model.entries.split_off(&(index + 1));
                    model.purged = Some(id);
                } else if what < 88 {
                    model.term += 1;
                    let vote = Vote::new(model.term, rng.random_range(0..3));
                    log.save_vote(&vote).await.expect("vote");
                    model.vote = Some(vote);
                } else if what < 95 {
                    // Killed: what the files hold now. Every write above was awaited, but a
                    // commit index is saved with the next synced write and may be older.
                    let copy = tempfile::tempdir().expect("dir");
                    crate::test_entries::copy_tree(dirs.last().expect("dir").path(), copy.path());
                    drop(log);
                    log = open_small(copy.path(), sizes);
                    dirs.push(copy);
                    let committed = log.committed();
                    assert!(committed <= model.committed, "{at}: committed {committed:?}");
                    model.committed = committed;
                } else {
                    drop(log);
                    log = open_small(dirs.last().expect("dir").path(), sizes);
                }
                check(&mut log, &model, &at).await;
            }
        }
    }

    /// A data directory from before the log had files of its own kept it in RocksDB: it is
    /// copied out on the first start and removed from RocksDB, and later starts read the copy.
    #[tokio::test]
    async fn a_log_kept_in_rocksdb_is_moved_to_its_files() {
        let dir = tempfile::tempdir().expect("dir");
        {
            let db = db::open(&dir.path().join("db"), None).expect("db");
            let mut batch = WriteBatch::default();
            let log_cf = db::cf(&db, CF_LOG).expect("cf");
            let meta = db::cf(&db, CF_RAFT_META).expect("cf");
            for i in 4..=9 {
                let entry = publish_entry(2, i, format!("job {i}").into_bytes());
                batch.put_cf(log_cf, log_key(i), codec::encode(&entry));
            }
            batch.put_cf(meta, meta_key::VOTE, codec::encode(&Vote::new(2, 0)));
            batch.put_cf(
                meta,
                meta_key::LAST_PURGED,
                codec::encode(&log_id::<TypeConfig>(1, 0, 3)),
            );
            batch.put_cf(
                meta,
                meta_key::COMMITTED,
                codec::encode(&Some(log_id::<TypeConfig>(2, 0, 8))),
            );
            db.write_opt(batch, &db::synced()).expect("write");
        }
        for start in ["first", "second"] {
            let mut log = open(dir.path());
            assert_eq!(indexes(&mut log).await, [4, 5, 6, 7, 8, 9], "{start} start");
            let entries = log.try_get_log_entries(5..6).await.expect("read");
            let fifth = publish_entry(2, 5, b"job 5".to_vec());
            assert_eq!(codec::encode(&entries[0]), codec::encode(&fifth), "{start} start");
            assert_eq!(log.read_vote().await.expect("vote"), Some(Vote::new(2, 0)));
            assert_eq!(log.committed(), Some(log_id::<TypeConfig>(2, 0, 8)));
            let state = log.get_log_state().await.expect("state");
            assert_eq!(state.last_purged_log_id, Some(log_id::<TypeConfig>(1, 0, 3)));
            assert_eq!(state.last_log_id, Some(log_id::<TypeConfig>(2, 0, 9)));
            let mut it = log.db.raw_iterator_cf(db::cf(&log.db, CF_LOG).expect("cf"));
            it.seek_to_first();
            assert!(!it.valid(), "{start} start: RocksDB still holds log entries");
            let vote = log.db.get_cf(db::cf(&log.db, CF_RAFT_META).expect("cf"), meta_key::VOTE);
            assert_eq!(vote.expect("get"), None, "{start} start: RocksDB still holds the vote");
        }
        assert!(!dir.path().join("log.import").exists());
    }

    /// A data directory an older delayd ran again after its log moved to its files holds a
    /// newer vote in RocksDB than in the files: it is refused, not silently dropped.
    #[tokio::test]
    async fn a_newer_log_in_rocksdb_after_the_move_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let mut log = open(dir.path());
        log.save_vote(&Vote::new(2, 1)).await.expect("vote");
        let db = log.db.clone();
        drop(log);
        let meta = db::cf(&db, CF_RAFT_META).expect("cf");
        db.put_cf(meta, meta_key::VOTE, codec::encode(&Vote::new(3, 2))).expect("put");
        drop(db);
        let refused = Store::open(dir.path()).err().expect("refused");
        assert!(refused.to_string().contains("older delayd"), "{refused}");
    }

    /// A copy that a crash interrupted is started again from RocksDB's copy, which is still
    /// whole: the half-written files are not taken for the log.
    #[tokio::test]
    async fn an_interrupted_move_starts_again() {
        let dir = tempfile::tempdir().expect("dir");
        {
            let db = db::open(&dir.path().join("db"), None).expect("db");
            let log_cf = db::cf(&db, CF_LOG).expect("cf");
            let entry = publish_entry(1, 1, b"one".to_vec());
            db.put_cf(log_cf, log_key(1), codec::encode(&entry)).expect("put");
        }
        // What a crash mid-copy leaves: a staging directory with a log of its own (here one
        // that RocksDB's does not match, to tell them apart).
        {
            let mut staged =
                log_files::open(&dir.path().join("log.import"), log_files::Sizes::DEFAULT)
                    .expect("open");
            let stray = publish_entry(1, 7, b"stray".to_vec());
            let bytes = StoredEntry(Arc::new(codec::encode(&stray)));
            staged.append([(Coded(stray.log_id), bytes)]).expect("append");
            log_files::sync_blocking(&mut staged).expect("sync");
        }
        let mut log = open(dir.path());
        assert_eq!(indexes(&mut log).await, [1]);
        assert!(!dir.path().join("log.import").exists());
    }
}
