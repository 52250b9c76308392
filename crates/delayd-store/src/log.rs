//! The Raft log and vote: [`LogStore`].

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use delayd_core::codec;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::OptionalSend;
use rocksdb::{ReadOptions, WriteBatch};

use crate::db::{self, log_key, meta_key, Db, CF_LOG, CF_RAFT_META};
use crate::error::StoreError;
use crate::metrics::{since, StoreMetrics};
use crate::recent::{Encoded, Recent};
use crate::{blocking, LogEntry, LogId, TypeConfig, Vote};

/// The Raft log, vote and commit index, in the `raft_log` and `raft_meta` column families.
///
/// Cloning is cheap (a few `Arc`s); the clone handed out by `get_log_reader` reads the same
/// database and the same window of recent entries ([`Recent`]). Every write openraft relies
/// on after a crash is synced before openraft is told it is durable: votes, truncations and
/// purges synchronously, appends by the [`Syncer`].
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Db>,
    syncer: Arc<SyncerHandle>,
    /// The last entries appended, decoded. Changed only by this store's own writes: an
    /// append after its RocksDB write succeeded, a truncation or purge before its write (a
    /// reader must never be handed an entry the log may no longer hold).
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

impl LogStore {
    /// What the log stored for its most recent entries, as they are appended: a leader's
    /// replication requests copy these instead of encoding each entry again per follower.
    pub fn encoded_entries(&self) -> EncodedEntries {
        EncodedEntries { recent: self.recent.clone() }
    }

    /// The handle on this node's cluster identity (kept beside the log).
    pub fn cluster_ids(&self) -> crate::ClusterIdStore {
        crate::ClusterIdStore::new(self.db.clone())
    }

    pub(crate) fn new(db: Arc<Db>, metrics: StoreMetrics) -> Result<Self, StoreError> {
        let syncer = Arc::new(Syncer {
            state: Mutex::default(),
            wake: Condvar::new(),
            metrics: metrics.clone(),
        });
        let thread = {
            let (db, syncer) = (db.clone(), syncer.clone());
            std::thread::Builder::new()
                .name("delayd-wal-sync".into())
                .spawn(move || {
                    crate::without_perf_counters();
                    syncer.run(&db)
                })
                .map_err(|e| StoreError::Task(format!("cannot start the WAL syncer: {e}")))?
        };
        let syncer = Arc::new(SyncerHandle { syncer, thread: Some(thread) });
        Ok(LogStore { db, syncer, recent: Arc::default(), metrics })
    }
}

/// Group commit for the log. `append` writes its entries to RocksDB at once (so they are
/// readable, e.g. for replication) without syncing, and hands its flush callback here; one
/// thread syncs the WAL and completes every callback that queued meanwhile. openraft's core
/// thus never waits for an fsync, and appends that arrive while one sync runs share the
/// next. One sync covers everything written to the WAL before it, and a callback is queued
/// only after its entries were written, so every completed callback is truly durable.
struct Syncer {
    state: Mutex<SyncState>,
    wake: Condvar,
    metrics: StoreMetrics,
}

#[derive(Default)]
struct SyncState {
    /// Callbacks of written appends, each with the time its `append` was called.
    pending: Vec<(Instant, IOFlushed<TypeConfig>)>,
    stop: bool,
}

impl Syncer {
    fn submit(&self, appended: Instant, callback: IOFlushed<TypeConfig>) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pending
            .push((appended, callback));
        self.wake.notify_one();
    }

    fn run(&self, db: &Db) {
        loop {
            let batch = {
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                while state.pending.is_empty() && !state.stop {
                    state = self.wake.wait(state).unwrap_or_else(PoisonError::into_inner);
                }
                if state.pending.is_empty() {
                    return;
                }
                std::mem::take(&mut state.pending)
            };
            let synced = Instant::now();
            let result = sync_wal(db);
            self.metrics.log_fsync_seconds.observe(since(synced));
            self.metrics.log_fsync_batch_entries.observe(batch.len() as f64);
            for (appended, callback) in batch {
                self.metrics.log_append_seconds.observe(since(appended));
                let result = match &result {
                    Ok(()) => Ok(()),
                    Err(e) => Err(std::io::Error::other(format!("syncing the WAL: {e}"))),
                };
                callback.io_completed(result);
            }
        }
    }
}

/// Makes every earlier WAL write durable: RocksDB's `SyncWAL`, an fdatasync of the WAL files
/// done beside the write queue rather than in it.
///
/// A synced write would do the same, but it holds RocksDB's single write queue for the whole
/// fsync: every other write meanwhile — the next `append` on openraft's core, an `apply` on
/// the state machine's task, both on async workers — spins, yields and then blocks its thread
/// until the fsync ends. `SyncWAL` only marks the files it syncs under a short lock, so writes
/// go on while the disk works; those that finished before it started are covered, which is
/// all the syncer promises (a callback is queued only after its append's write returned).
/// `flush_wal(true)` is `SyncWAL` here because the WAL is not in manual-flush mode: every
/// write has handed its record to the OS before it returns, so there is no buffer to flush.
fn sync_wal(db: &Db) -> Result<(), StoreError> {
    Ok(db.flush_wal(true)?)
}

/// Stops the syncer thread when the last `LogStore` clone goes, after it completed every
/// callback still queued.
struct SyncerHandle {
    syncer: Arc<Syncer>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for SyncerHandle {
    fn drop(&mut self) {
        self.syncer.state.lock().unwrap_or_else(PoisonError::into_inner).stop = true;
        self.syncer.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Entries with `start <= index < end` (`end` `None`: to the end of the log).
pub(crate) fn read_entries(
    db: &Db,
    start: u64,
    end: Option<u64>,
) -> Result<Vec<LogEntry>, StoreError> {
    if end.is_some_and(|end| end <= start) {
        return Ok(Vec::new());
    }
    let mut ro = ReadOptions::default();
    ro.set_iterate_lower_bound(log_key(start));
    if let Some(end) = end {
        ro.set_iterate_upper_bound(log_key(end));
    }
    let mut it = db.raw_iterator_cf_opt(db::cf(db, CF_LOG)?, ro);
    it.seek_to_first();
    let mut entries = Vec::new();
    while let Some(value) = it.value() {
        entries.push(codec::decode(value)?);
        it.next();
    }
    it.status()?;
    Ok(entries)
}

pub(crate) fn last_entry(db: &Db) -> Result<Option<LogEntry>, StoreError> {
    let mut it = db.raw_iterator_cf(db::cf(db, CF_LOG)?);
    it.seek_to_last();
    match it.value() {
        Some(value) => Ok(Some(codec::decode(value)?)),
        None => {
            it.status()?;
            Ok(None)
        }
    }
}

fn log_state(db: &Db) -> Result<LogState<TypeConfig>, StoreError> {
    let last_purged_log_id: Option<LogId> =
        db::get_decoded(db, CF_RAFT_META, meta_key::LAST_PURGED)?;
    let last_log_id = match last_entry(db)? {
        Some(entry) => Some(entry.log_id),
        None => last_purged_log_id,
    };
    Ok(LogState { last_purged_log_id, last_log_id })
}

fn put_meta_synced(db: &Db, key: &[u8], value: Vec<u8>) -> Result<(), StoreError> {
    let mut batch = WriteBatch::default();
    batch.put_cf(db::cf(db, CF_RAFT_META)?, key, value);
    Ok(db.write_opt(batch, &db::synced())?)
}

/// Writes entries to the WAL and memtable without syncing; the [`Syncer`] makes them durable.
/// `encoded` holds, for each entry, the bytes to store if they are known already (a follower's
/// received entries), else `None`: the entry is encoded here. Returns the bytes written for
/// each entry.
fn append_entries(
    db: &Db,
    entries: &[LogEntry],
    encoded: Vec<Option<Encoded>>,
) -> Result<Vec<Encoded>, StoreError> {
    let cf = db::cf(db, CF_LOG)?;
    let mut batch = WriteBatch::default();
    let mut written = Vec::with_capacity(entries.len());
    for (entry, known) in entries.iter().zip(encoded) {
        let value = known.unwrap_or_else(|| {
            Arc::new(codec::encode_sized(entry, crate::log_entry_size_bytes(entry)))
        });
        batch.put_cf(cf, log_key(entry.log_id.index), value.as_slice());
        written.push(value);
    }
    db.write(batch)?;
    Ok(written)
}

/// Deletes every entry at or after `index`.
fn truncate_from(db: &Db, index: u64) -> Result<(), StoreError> {
    let cf = db::cf(db, CF_LOG)?;
    let mut batch = WriteBatch::default();
    batch.delete_range_cf(cf, log_key(index), log_key(u64::MAX));
    batch.delete_cf(cf, log_key(u64::MAX));
    Ok(db.write_opt(batch, &db::synced())?)
}

/// Deletes every entry up to and including `upto`, recording it as the last purged id in the
/// same batch so that `get_log_state` never sees one without the other.
fn purge_upto(db: &Db, upto: LogId) -> Result<(), StoreError> {
    let mut batch = WriteBatch::default();
    batch.put_cf(db::cf(db, CF_RAFT_META)?, meta_key::LAST_PURGED, codec::encode(&upto));
    let log = db::cf(db, CF_LOG)?;
    batch.delete_range_cf(log, log_key(0), log_key(upto.index));
    batch.delete_cf(log, log_key(upto.index));
    Ok(db.write_opt(batch, &db::synced())?)
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
        // Inline: what misses the window is mostly just behind it, in the memtable, and read
        // in microseconds; a hop to the blocking pool would cost more than the read.
        read_entries(&self.db, start, end).map_err(std::io::Error::from)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, std::io::Error> {
        let db = self.db.clone();
        blocking(move || db::get_decoded(&db, CF_RAFT_META, meta_key::VOTE))
            .await
            .map_err(std::io::Error::from)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, std::io::Error> {
        let db = self.db.clone();
        blocking(move || log_state(&db)).await.map_err(std::io::Error::from)
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), std::io::Error> {
        let db = self.db.clone();
        let value = codec::encode(vote);
        blocking(move || put_meta_synced(&db, meta_key::VOTE, value))
            .await
            .map_err(std::io::Error::from)
    }

    /// Not synced: losing the latest commit index in a crash only means re-learning it from
    /// the leader; it rides along with the next synced append anyway. Inline, like `append`:
    /// openraft saves it on every commit, and an unsynced put of a few bytes costs less than
    /// the hop to the blocking pool and back.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), std::io::Error> {
        let index = committed.map_or(0, |c| c.index);
        let saved = db::cf(&self.db, CF_RAFT_META).and_then(|cf| {
            Ok(self.db.put_cf(cf, meta_key::COMMITTED, codec::encode(&committed))?)
        });
        saved.map_err(std::io::Error::from)?;
        self.metrics.commit_index.set(i64::try_from(index).unwrap_or(i64::MAX));
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, std::io::Error> {
        let db = self.db.clone();
        blocking(move || {
            let committed: Option<Option<LogId>> =
                db::get_decoded(&db, CF_RAFT_META, meta_key::COMMITTED)?;
            Ok(committed.flatten())
        })
        .await
        .map_err(std::io::Error::from)
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
        // Inline: an unsynced write goes to the memtable and the WAL's page cache in
        // microseconds (the fsync is the syncer's); a hop to the blocking pool would cost more.
        let known = {
            let mut recent = self.recent();
            entries.iter().map(|e| recent.take_received(&e.log_id)).collect()
        };
        let written = append_entries(&self.db, &entries, known).map_err(std::io::Error::from)?;
        // Readable from the window at once, like from RocksDB: replication sends entries
        // before they are durable, and only a quorum's durability commits them.
        self.recent().appended(entries.into_iter().zip(written));
        // Written but not yet synced: the syncer completes the callback once it is on disk,
        // and only then may openraft count it towards a quorum.
        self.syncer.syncer.submit(appended, callback);
        Ok(())
    }

    /// Keeps the log up to and including `last_log_id` and deletes everything after it.
    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), std::io::Error> {
        let db = self.db.clone();
        let from = last_log_id.map_or(0, |l| l.index.saturating_add(1));
        self.recent().truncated_from(from);
        blocking(move || truncate_from(&db, from)).await.map_err(std::io::Error::from)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), std::io::Error> {
        let db = self.db.clone();
        self.recent().purged_upto(log_id.index);
        blocking(move || purge_upto(&db, log_id)).await.map_err(std::io::Error::from)
    }
}

impl LogStore {
    fn recent(&self) -> MutexGuard<'_, Recent> {
        // The window is rebuilt by appends; a panic elsewhere leaves it contiguous or empty.
        self.recent.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorageExt;
    use openraft::testing::{blank_ent, log_id};

    use super::*;
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
        let db = log.db.clone();
        let syncs = || db::wal_syncs(&db);

        let before = syncs();
        log.blocking_append((1..=6).map(|i| blank_ent::<TypeConfig>(1, 0, i)))
            .await
            .expect("append");
        assert_eq!(syncs(), before + 1, "append");
        log.save_vote(&Vote::new(2, 7)).await.expect("vote");
        assert_eq!(syncs(), before + 2, "save_vote");
        log.truncate_after(Some(log_id::<TypeConfig>(1, 0, 4))).await.expect("truncate");
        assert_eq!(syncs(), before + 3, "truncate");
        log.purge(log_id::<TypeConfig>(1, 0, 2)).await.expect("purge");
        assert_eq!(syncs(), before + 4, "purge");
        log.save_committed(Some(log_id::<TypeConfig>(1, 0, 3))).await.expect("committed");
        assert_eq!(syncs(), before + 4, "save_committed rides on the next sync");
        drop((log, db));

        let mut log = open(dir.path());
        assert_eq!(indexes(&mut log).await, [3, 4]);
        assert_eq!(log.read_vote().await.expect("vote"), Some(Vote::new(2, 7)));
        assert_eq!(
            log.read_committed().await.expect("committed"),
            Some(log_id::<TypeConfig>(1, 0, 3))
        );
        let state = log.get_log_state().await.expect("state");
        assert_eq!(state.last_purged_log_id, Some(log_id::<TypeConfig>(1, 0, 2)));
        assert_eq!(state.last_log_id, Some(log_id::<TypeConfig>(1, 0, 4)));
    }

    #[tokio::test]
    async fn range_reads_honour_every_bound_kind() {
        let dir = tempfile::tempdir().expect("dir");
        let mut log = open(dir.path());
        log.blocking_append((0..10).map(|i| blank_ent::<TypeConfig>(1, 0, i)))
            .await
            .expect("append");
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
        assert!(read((Bound::Excluded(u64::MAX), Bound::Unbounded)).await.is_empty());
        assert_eq!(read((Bound::Included(9), Bound::Included(u64::MAX))).await, [9]);
        // The purged-only log still reports where it ends.
        log.purge(log_id::<TypeConfig>(1, 0, 9)).await.expect("purge");
        assert!(indexes(&mut log).await.is_empty());
        let state = log.get_log_state().await.expect("state");
        assert_eq!(state.last_log_id, Some(log_id::<TypeConfig>(1, 0, 9)));
    }
}
