//! The replicated state machine: [`StateMachineStore`], its snapshots, and read access for
//! queries ([`StateReader`]).

use std::fs::{File, OpenOptions};
use std::io::{self, Seek};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, TryLockError};
use std::time::Instant;

use delayd_core::{codec, Cf, Effects, KvRead, Outcome, Overlay};
use futures::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use rocksdb::{ColumnFamily, WriteBatch};
use tokio::io::AsyncWriteExt;

use crate::apply_cache::{self, ApplyCache, ApplyView, Change};
use crate::db::{
    self, meta_key, BackgroundWork, Db, ReadView, StorageSizes, WriteStalls, CF_RAFT_META,
    SM_LAST_APPLIED, SM_MEMBERSHIP, SM_RESERVED_PREFIX,
};
use crate::error::StoreError;
use crate::log::FlushStats;
use crate::metrics::{since, StoreMetrics};
use crate::snapshot::{self, SnapshotDir, SnapshotReader, SnapshotRecord};
use crate::{
    blocking, in_background, LogEntry, LogId, Snapshot, SnapshotData, SnapshotMeta as Meta,
    StoredMembership, TypeConfig,
};

/// Called after every applied batch with what the batch means for waiters and timers; see
/// [`StateMachineStore::set_listener`].
pub type ApplyListener = Arc<dyn Fn(&Effects) + Send + Sync>;

/// What `applied_state` reports: the last applied log id and membership.
type AppliedState = (Option<LogId>, StoredMembership);

/// Batches of at most this many commands are applied on the state machine's own task; larger
/// ones on the blocking pool (see `apply`).
const INLINE_APPLY_COMMANDS: usize = 64;

/// The commands an entry carries (0 for blank and membership entries).
fn entry_commands(entry: &LogEntry) -> usize {
    match &entry.payload {
        EntryPayload::Normal(e) => e.commands.len(),
        _ => 0,
    }
}

/// Applying writes what it has buffered once it holds this many bytes, so a long run of
/// committed entries (a log replayed at start) never sits in memory at once.
const APPLY_FLUSH_BYTES: usize = 64 << 20;

/// An applied batch of at most this many bytes hands the values it wrote to the apply
/// cache; a larger one only tells it which keys changed (see `write_applied`).
const KEEP_WRITES_BYTES: usize = 1 << 20;

/// Bytes of framing RocksDB's write batch adds to each write, at most for apply's keys and
/// values (a type byte, a column family id and two lengths, as varints), with room for the
/// batch's header and `last_applied` on the side: what a batch is sized for up front.
const BATCH_FRAMING_BYTES: usize = 16;

/// Installing a snapshot writes in batches of at most this many records...
const INSTALL_BATCH_RECORDS: usize = 10_000;
/// ...or this many bytes, whichever comes first.
const INSTALL_BATCH_BYTES: usize = 32 << 20;

/// What the state machine, its snapshot builder and its readers share.
pub(crate) struct Shared {
    pub(crate) db: Arc<Db>,
    pub(crate) dir: SnapshotDir,
    /// The current snapshot; its lock also orders changes of the on-disk pointer to it.
    current: Mutex<Option<SnapshotRecord>>,
    /// Held exclusively for a whole snapshot install, when the state is incomplete; taken
    /// shared to create a consistent view.
    install_gate: RwLock<()>,
    /// Number of the next snapshot or temporary file.
    next_file: AtomicU64,
    /// Temporary files handed out by `begin_receiving_snapshot` and not yet installed.
    receiving: Mutex<Vec<std::path::PathBuf>>,
    listener: RwLock<Option<ApplyListener>>,
    metrics: StoreMetrics,
    /// What apply reads again and again (`apply_cache.rs`).
    pub(crate) apply_cache: Mutex<ApplyCache>,
    /// The Raft log's flush statistics, for `/metrics`.
    log_flushes: FlushStats,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its data consistent, so a panic elsewhere does not make
    // the data unusable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn ctx_io(what: &'static str) -> impl Fn(io::Error) -> StoreError {
    move |e| StoreError::io(what, e)
}

impl Shared {
    fn open(
        db: Arc<Db>,
        dir: SnapshotDir,
        metrics: StoreMetrics,
        log_flushes: FlushStats,
    ) -> Result<Self, StoreError> {
        let mut current: Option<SnapshotRecord> =
            db::get_decoded(&db, CF_RAFT_META, meta_key::SNAPSHOT)?;
        if let Some(record) = &current {
            if !dir.path(&record.file).exists() {
                // The state machine is complete without it; openraft builds a new one when
                // it needs to.
                tracing::warn!(file = %record.file, "current snapshot file is missing");
                current = None;
            }
        }
        let shared = Shared {
            next_file: AtomicU64::new(dir.next_number()?),
            db,
            dir,
            current: Mutex::new(current),
            install_gate: RwLock::new(()),
            receiving: Mutex::new(Vec::new()),
            listener: RwLock::new(None),
            metrics,
            apply_cache: Mutex::new(ApplyCache::default()),
            log_flushes,
        };
        let unfinished: Option<SnapshotRecord> =
            db::get_decoded(&shared.db, CF_RAFT_META, meta_key::INSTALLING)?;
        if let Some(record) = unfinished {
            tracing::warn!(file = %record.file, "finishing an interrupted snapshot install");
            shared.load(&record)?;
        }
        let keep = lock(&shared.current).as_ref().map(|r| r.file.clone());
        shared.dir.remove_all_but(keep.as_deref())?;
        Ok(shared)
    }

    pub(crate) fn next_file(&self) -> u64 {
        self.next_file.fetch_add(1, Ordering::Relaxed)
    }

    /// A consistent view, refused while an install has the state half-written.
    pub(crate) fn try_view(&self) -> Result<ReadView<'_>, StoreError> {
        let _gate = match self.install_gate.try_read() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock) => return Err(StoreError::Installing),
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
        };
        Ok(ReadView::snapshot(&self.db))
    }

    /// A consistent view, waiting for an install to finish.
    pub(crate) fn view(&self) -> ReadView<'_> {
        let _gate = self.install_gate.read().unwrap_or_else(PoisonError::into_inner);
        ReadView::snapshot(&self.db)
    }

    pub(crate) fn applied_state(&self) -> Result<AppliedState, StoreError> {
        let last_applied: Option<Option<LogId>> =
            db::get_decoded(&self.db, Cf::Meta.name(), SM_LAST_APPLIED)?;
        let membership = db::get_decoded(&self.db, Cf::Meta.name(), SM_MEMBERSHIP)?;
        Ok((last_applied.flatten(), membership.unwrap_or_default()))
    }

    /// Applies a batch of entries as one atomic write; see the crate docs.
    pub(crate) fn apply(
        &self,
        entries: &[LogEntry],
    ) -> Result<(Vec<Vec<Outcome>>, Effects), StoreError> {
        let started = Instant::now();
        let live = ApplyView { live: ReadView::live(&self.db), cache: &self.apply_cache };
        let mut overlay = Overlay::new(&live);
        let mut replies = Vec::with_capacity(entries.len());
        let mut effects = Effects::default();
        let mut last_applied = None;
        let mut membership = None;
        for entry in entries {
            // openraft hands over every committed entry at once (thousands when a node
            // replays its log at start): write what is buffered before it grows past the
            // bound, with `last_applied` up to there, so memory stays bounded whatever the
            // backlog. Each part is atomic on its own, which is all a restart needs.
            if overlay.buffered_bytes() > APPLY_FLUSH_BYTES {
                self.write_applied(overlay, last_applied, membership.take())?;
                overlay = Overlay::new(&live);
            }
            last_applied = Some(entry.log_id);
            match &entry.payload {
                EntryPayload::Blank => replies.push(Vec::new()),
                EntryPayload::Normal(data) => {
                    let mut entry_effects = Effects::default();
                    replies.push(delayd_core::apply(&mut overlay, data, &mut entry_effects)?);
                    effects.merge(entry_effects);
                }
                EntryPayload::Membership(m) => {
                    membership = Some(StoredMembership::new(Some(entry.log_id), m.clone()));
                    replies.push(Vec::new());
                }
            }
        }
        self.write_applied(overlay, last_applied, membership)?;
        self.metrics.apply_seconds.observe(since(started));
        Ok((replies, effects))
    }

    /// [`Shared::apply`], then the listener, on the same thread and before any of the batch's
    /// clients is answered: what the listener keeps (a leader's hints of which queues have a
    /// job) then never lags behind what a reader or a client can see by more than the call
    /// itself, wherever the batch was applied.
    fn apply_and_tell(&self, entries: &[LogEntry]) -> Result<Vec<Vec<Outcome>>, StoreError> {
        let (replies, effects) = self.apply(entries)?;
        let listener = self.listener.read().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(listener) = listener {
            listener(&effects);
        }
        Ok(replies)
    }

    /// Writes one applied batch atomically with the last applied log id and, if the batch
    /// changed it, the membership.
    fn write_applied(
        &self,
        overlay: Overlay<'_, ApplyView<'_>>,
        last_applied: Option<LogId>,
        membership: Option<StoredMembership>,
    ) -> Result<(), StoreError> {
        // Sized once: RocksDB's batch is one growing string, and apply's batches are the
        // buffered keys and values plus a few bytes of framing per write.
        let framing = BATCH_FRAMING_BYTES * (overlay.len() + 4);
        let mut batch = WriteBatch::with_capacity_bytes(overlay.buffered_bytes() + framing);
        // The writes the apply cache follows, for it once they are in the database: the batch
        // copies each value, so the cache takes the one apply would drop. A batch far larger
        // than serving makes (a replay at start, up to APPLY_FLUSH_BYTES) keeps no values, so
        // that it never holds a second copy of them until its write.
        let keep = overlay.buffered_bytes() <= KEEP_WRITES_BYTES;
        let mut followed = Vec::with_capacity(overlay.len());
        // The writes come one column family after another: its handle is looked up (a search
        // of RocksDB's map by name) once per column family, not once per write.
        let mut handle: Option<(Cf, &ColumnFamily)> = None;
        for (cf, key, value) in overlay.into_writes() {
            if cf == Cf::Meta && key.starts_with(SM_RESERVED_PREFIX) {
                return Err(StoreError::Corrupt(format!(
                    "the state machine wrote the store's reserved key {}",
                    String::from_utf8_lossy(&key)
                )));
            }
            let handle = match handle {
                Some((of, h)) if of == cf => h,
                _ => {
                    let h = db::cf(&self.db, cf.name())?;
                    handle = Some((cf, h));
                    h
                }
            };
            match &value {
                Some(value) => batch.put_cf(handle, &key, value),
                // A key put once is deleted with a single delete, which a flush or a
                // compaction drops together with the put it meets (`Cf::written_once`).
                None if cf.written_once(&key) => batch.single_delete_cf(handle, &key),
                None => batch.delete_cf(handle, &key),
            }
            if apply_cache::follows(cf) {
                followed.push((cf, key, Change::of(value, keep)));
            }
        }
        let meta = db::cf(&self.db, Cf::Meta.name())?;
        batch.put_cf(meta, SM_LAST_APPLIED, codec::encode(&last_applied));
        if let Some(membership) = &membership {
            batch.put_cf(meta, SM_MEMBERSHIP, codec::encode(membership));
        }
        // Neither synced nor in the WAL: the log below it is both, and a crash that loses
        // this write also loses `last_applied` with it, so openraft re-applies the same
        // entries (see `db::unlogged`).
        let written = self.db.write_opt(batch, &db::unlogged());
        let mut cache = lock(&self.apply_cache);
        if let Err(e) = written {
            // Whether any of it reached the database is not known: nothing the cache holds
            // can be trusted. (openraft stops the node on this error anyway.)
            cache.clear();
            return Err(e.into());
        }
        for (cf, key, change) in followed {
            cache.wrote(cf, &key, change);
        }
        Ok(())
    }

    /// Builds a snapshot from one consistent view; returns its meta and the open file.
    pub(crate) fn build(&self) -> Result<(Meta, File), StoreError> {
        let started = Instant::now();
        let view = self.view();
        let meta = view_meta(&view)?;
        let n = self.next_file();
        let name = self.dir.write(n, &meta, &view)?;
        drop(view);
        // Once the snapshot is current openraft may purge the log up to it, and the applies
        // up to it are in no WAL: they are made durable first, so that no crash can take the
        // state back behind a log that no longer holds the entries to re-apply.
        db::flush_state(&self.db)?;
        // Open before promoting: if a newer snapshot wins, this file is removed, but the open
        // handle still reads it.
        let file = File::open(self.dir.path(&name)).map_err(ctx_io("open built snapshot"))?;
        self.metrics.snapshot_build_seconds.observe(since(started));
        self.record_snapshot_size(&file);
        self.promote(SnapshotRecord { file: name, meta: meta.clone() })?;
        Ok((meta, file))
    }

    /// Makes `record` the current snapshot unless the current one is newer, and removes the
    /// file that lost.
    fn promote(&self, record: SnapshotRecord) -> Result<(), StoreError> {
        let mut current = lock(&self.current);
        let loser = if is_newer(&record, current.as_ref()) {
            let mut batch = WriteBatch::default();
            batch.put_cf(
                db::cf(&self.db, CF_RAFT_META)?,
                meta_key::SNAPSHOT,
                codec::encode(&record),
            );
            self.db.write_opt(batch, &db::synced())?;
            current.replace(record)
        } else {
            Some(record)
        };
        drop(current);
        self.remove_loser(loser)
    }

    fn remove_loser(&self, loser: Option<SnapshotRecord>) -> Result<(), StoreError> {
        let Some(loser) = loser else { return Ok(()) };
        if lock(&self.current).as_ref().is_some_and(|c| c.file == loser.file) {
            return Ok(());
        }
        snapshot::remove_if_exists(&self.dir.path(&loser.file))
    }

    fn current_snapshot(&self) -> Result<Option<(Meta, File)>, StoreError> {
        let current = lock(&self.current);
        let Some(record) = current.as_ref() else {
            return Ok(None);
        };
        let file =
            File::open(self.dir.path(&record.file)).map_err(ctx_io("open current snapshot"))?;
        Ok(Some((record.meta.clone(), file)))
    }

    /// A new file for an incoming snapshot. openraft receives one snapshot at a time and
    /// starts a new transfer only by dropping the one under way, so files handed out before
    /// belong to abandoned transfers: they are removed here rather than left full-size until
    /// the next successful install. (A file still open elsewhere stays readable; `install`
    /// copies a file it no longer finds.) Files of a transfer cut off by a restart are
    /// removed when the store opens.
    fn begin_receiving(&self) -> Result<File, StoreError> {
        let abandoned = std::mem::take(&mut *lock(&self.receiving));
        for path in &abandoned {
            snapshot::remove_if_exists(path)?;
        }
        let path = self.dir.tmp_path(self.next_file());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(ctx_io("create snapshot receive file"))?;
        lock(&self.receiving).push(path);
        Ok(file)
    }

    /// Installs a received snapshot: keeps the file (without copying it when it is the one
    /// `begin_receiving` handed out), verifies it completely, then replaces the state.
    fn install(&self, mut received: File, meta: &Meta) -> Result<(), StoreError> {
        let started = Instant::now();
        let n = self.next_file();
        let name = SnapshotDir::snap_name(n);
        let pending = std::mem::take(&mut *lock(&self.receiving));
        let ours = pending.iter().position(|p| snapshot::is_same_file(&received, p));
        match ours {
            Some(i) => {
                received.sync_all().map_err(ctx_io("sync received snapshot"))?;
                self.dir.rename(&pending[i], &name)?;
            }
            None => {
                let tmp = self.dir.tmp_path(n);
                let mut copy = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&tmp)
                    .map_err(ctx_io("create snapshot copy"))?;
                received.rewind().map_err(ctx_io("rewind received snapshot"))?;
                io::copy(&mut received, &mut copy).map_err(ctx_io("copy received snapshot"))?;
                copy.sync_all().map_err(ctx_io("sync snapshot copy"))?;
                self.dir.rename(&tmp, &name)?;
            }
        }
        for (i, path) in pending.iter().enumerate() {
            if Some(i) != ours {
                snapshot::remove_if_exists(path)?;
            }
        }

        let path = self.dir.path(&name);
        let checked = snapshot::verify(&path).and_then(|file_meta| {
            if file_meta.last_log_id == meta.last_log_id
                && file_meta.last_membership == meta.last_membership
            {
                Ok(())
            } else {
                Err(StoreError::Corrupt(format!(
                    "snapshot file holds {file_meta}, expected {meta}"
                )))
            }
        });
        if let Err(e) = checked {
            snapshot::remove_if_exists(&path)?;
            return Err(e);
        }
        self.load(&SnapshotRecord { file: name, meta: meta.clone() })?;
        self.metrics.snapshot_install_seconds.observe(since(started));
        self.record_snapshot_size(&received);
        Ok(())
    }

    fn record_snapshot_size(&self, file: &File) {
        if let Ok(m) = file.metadata() {
            self.metrics.snapshot_bytes.set(i64::try_from(m.len()).unwrap_or(i64::MAX));
        }
    }

    /// Replaces the state machine with a verified snapshot file. Crash-safe: the first synced
    /// batch records `INSTALLING` (and clears the state); the last one sets last applied and
    /// membership and removes the marker. A restart in between calls this again.
    pub(crate) fn load(&self, record: &SnapshotRecord) -> Result<(), StoreError> {
        let _gate = self.install_gate.write().unwrap_or_else(PoisonError::into_inner);
        // Before the first write: whatever happens next, nothing of the old state may answer
        // apply's reads of the new one.
        lock(&self.apply_cache).clear();
        let db = &*self.db;
        let path = self.dir.path(&record.file);
        let file = File::open(&path).map_err(ctx_io("open snapshot to install"))?;
        let (_, mut reader) = SnapshotReader::new(file)?;

        // `clear` deletes the key range it sees, and it sees the applies since the last flush,
        // which are in no WAL: a key on disk that such an apply deleted (the last of its column
        // family, or all of them) would fall outside the range, and a crash after the install
        // would bring it back beside the snapshot's data. Flushed first, the state on disk is
        // the state `clear` sees.
        db::flush_state(db)?;
        let mut batch = WriteBatch::default();
        batch.put_cf(db::cf(db, CF_RAFT_META)?, meta_key::INSTALLING, codec::encode(record));
        for cf in Cf::ALL {
            clear(db, cf, &mut batch)?;
        }
        db.write_opt(batch, &db::synced())?;

        let mut batch = WriteBatch::default();
        while let Some((cf, key, value)) = reader.next_record()? {
            if cf == Cf::Meta && key.starts_with(SM_RESERVED_PREFIX) {
                continue;
            }
            batch.put_cf(db::cf(db, cf.name())?, key, value);
            if batch.len() >= INSTALL_BATCH_RECORDS || batch.size_in_bytes() >= INSTALL_BATCH_BYTES
            {
                db.write(std::mem::take(&mut batch))?;
            }
        }

        let meta_cf = db::cf(db, Cf::Meta.name())?;
        batch.put_cf(meta_cf, SM_LAST_APPLIED, codec::encode(&record.meta.last_log_id));
        batch.put_cf(meta_cf, SM_MEMBERSHIP, codec::encode(&record.meta.last_membership));
        let raft_meta = db::cf(db, CF_RAFT_META)?;
        batch.delete_cf(raft_meta, meta_key::INSTALLING);
        let mut current = lock(&self.current);
        let newer = is_newer(record, current.as_ref());
        if newer {
            batch.put_cf(raft_meta, meta_key::SNAPSHOT, codec::encode(record));
        }
        // Synced, and the WAL is sequential: every batch above is durable with this one.
        db.write_opt(batch, &db::synced())?;
        let loser = if newer { current.replace(record.clone()) } else { Some(record.clone()) };
        drop(current);
        self.remove_loser(loser)
    }
}

/// Queues `cf`'s whole key range for deletion: two range tombstones, whatever its size.
fn clear(db: &Db, cf: Cf, batch: &mut WriteBatch) -> Result<(), StoreError> {
    let handle = db::cf(db, cf.name())?;
    let mut it = db.raw_iterator_cf(handle);
    it.seek_to_last();
    let last = it.key().map(<[u8]>::to_vec);
    it.status()?;
    if let Some(last) = last {
        batch.delete_range_cf(handle, &[][..], last.as_slice());
        batch.delete_cf(handle, last);
    }
    Ok(())
}

fn decode_opt<T: serde::de::DeserializeOwned>(
    view: &ReadView<'_>,
    key: &[u8],
) -> Result<Option<T>, StoreError> {
    match view.get(Cf::Meta, key)? {
        Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
        None => Ok(None),
    }
}

/// The meta of a snapshot of `view`: its last applied log id and membership, read from the
/// view itself so that they describe exactly the data beside them.
pub(crate) fn view_meta(view: &ReadView<'_>) -> Result<Meta, StoreError> {
    let last_applied: Option<Option<LogId>> = decode_opt(view, SM_LAST_APPLIED)?;
    let membership: Option<StoredMembership> = decode_opt(view, SM_MEMBERSHIP)?;
    Ok(Meta {
        last_log_id: last_applied.flatten(),
        last_membership: membership.unwrap_or_default(),
    })
}

/// True when `record` should replace `current`: never go back to an older snapshot.
fn is_newer(record: &SnapshotRecord, current: Option<&SnapshotRecord>) -> bool {
    current.is_none_or(|c| record.meta.last_log_id >= c.meta.last_log_id)
}

/// The replicated state machine, persisted in the state-machine column families of the
/// store's RocksDB. Hand it to `Raft::new`; keep a [`StateReader`] for queries.
pub struct StateMachineStore {
    pub(crate) shared: Arc<Shared>,
}

impl StateMachineStore {
    pub(crate) fn open(
        db: Arc<Db>,
        dir: SnapshotDir,
        metrics: StoreMetrics,
        log_flushes: FlushStats,
    ) -> Result<Self, StoreError> {
        let shared = Shared::open(db, dir, metrics, log_flushes)?;
        Ok(StateMachineStore { shared: Arc::new(shared) })
    }

    /// A cheap, cloneable handle for reading the state (and setting the listener) after this
    /// store has been moved into `Raft::new`.
    pub fn reader(&self) -> StateReader {
        StateReader { shared: self.shared.clone() }
    }

    /// Sets the function called after every applied batch, replacing any previous one.
    ///
    /// It runs on openraft's apply path, on the thread that wrote the batch (the state
    /// machine's task, or the blocking pool for a large batch), right after the write and
    /// before the batch's clients are answered or the next batch is applied: it must be quick
    /// and must not block (wake tasks, don't do work), and a panic in it stops the node. It
    /// is not called for snapshot installs, which replace the whole state: treat a change of
    /// the snapshot in `Raft::metrics()` as "everything may have changed".
    pub fn set_listener(&self, listener: ApplyListener) {
        self.reader().set_listener(listener);
    }

    /// Reads the state as of now; see [`StateReader::read_view`].
    pub fn read_view(&self) -> Result<ReadView<'_>, StoreError> {
        self.shared.try_view()
    }
}

/// Read access to the state machine, independent of openraft. Cloning is cheap.
#[derive(Clone)]
pub struct StateReader {
    pub(crate) shared: Arc<Shared>,
}

impl StateReader {
    /// A consistent point-in-time view of the state machine (a RocksDB snapshot): later
    /// applies do not show through it. Drop it promptly; it pins old data in RocksDB.
    ///
    /// Fails with [`StoreError::Installing`] while a snapshot is being installed, when the
    /// state is incomplete.
    pub fn read_view(&self) -> Result<ReadView<'_>, StoreError> {
        self.shared.try_view()
    }

    /// Whether a snapshot is being installed now (the state is half-written meanwhile).
    pub fn installing(&self) -> bool {
        matches!(self.shared.install_gate.try_read(), Err(TryLockError::WouldBlock))
    }

    /// How much space the database takes now (RocksDB properties, cheap to read).
    pub fn storage_sizes(&self) -> Result<StorageSizes, StoreError> {
        db::sizes(&self.shared.db)
    }

    /// How RocksDB has held back this node's writes; see [`WriteStalls`].
    pub fn write_stalls(&self) -> Result<WriteStalls, StoreError> {
        db::write_stalls(&self.shared.db)
    }

    /// RocksDB's flushes and compactions running or due now; see [`BackgroundWork`].
    pub fn background_work(&self) -> Result<BackgroundWork, StoreError> {
        db::background_work(&self.shared.db)
    }

    /// The Raft log's fsyncs and size on disk; `None` once the log has closed.
    pub fn log_flushes(&self) -> Option<crate::LogFlushes> {
        self.shared.log_flushes.read()
    }

    /// The Raft log's size on disk alone (what [`StateReader::log_flushes`] reports as
    /// `disk_bytes`), cheaper to read; `None` once the log has closed.
    pub fn log_disk_bytes(&self) -> Option<u64> {
        self.shared.log_flushes.disk_bytes()
    }

    /// Sets the apply listener; see [`StateMachineStore::set_listener`].
    pub fn set_listener(&self, listener: ApplyListener) {
        *self.shared.listener.write().unwrap_or_else(PoisonError::into_inner) = Some(listener);
    }

    /// Writes the applied state to disk, every column family at the same applied batch, and
    /// returns once it is durable. Applies skip RocksDB's WAL, so a node that starts again
    /// re-applies from its log whatever it applied after the last flush; a node that stops on
    /// purpose calls this once Raft has stopped, and its next start normally has nothing to
    /// re-apply. Safe at any moment: an atomic flush keeps every column family at one
    /// applied batch, so an apply landing during or after it is only re-applied later.
    /// Blocking: call it off the async workers.
    pub fn flush(&self) -> Result<(), StoreError> {
        db::flush_state(&self.shared.db)
    }
}

/// Builds snapshots for openraft, concurrently with apply: everything it reads comes from one
/// RocksDB snapshot.
pub struct SnapshotBuilder {
    shared: Arc<Shared>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let shared = self.shared.clone();
        let (meta, file) = in_background("delayd-snapshot", move || shared.build()).await?;
        tracing::info!(snapshot = %meta, "built snapshot");
        Ok(Snapshot { meta, snapshot: tokio::fs::File::from_std(file) })
    }
}

/// Creates the files incoming snapshots are received into. The transport holds one: openraft
/// 0.10 leaves receiving a snapshot to the application and hands the finished file to
/// [`RaftStateMachine::install_snapshot`]. Cheap to clone.
#[derive(Clone)]
pub struct SnapshotInbox {
    shared: Arc<Shared>,
}

impl SnapshotInbox {
    /// A new, empty file for an incoming snapshot in the store's snapshot directory. Handing
    /// one out removes the files of transfers that were abandoned before it (see
    /// `Shared::begin_receiving`); [`RaftStateMachine::install_snapshot`] keeps the file
    /// without copying it.
    pub async fn create(&self) -> Result<SnapshotData, io::Error> {
        let shared = self.shared.clone();
        let file = blocking(move || shared.begin_receiving()).await?;
        Ok(tokio::fs::File::from_std(file))
    }
}

impl StateMachineStore {
    /// The handle the transport receives snapshots with.
    pub fn inbox(&self) -> SnapshotInbox {
        SnapshotInbox { shared: self.shared.clone() }
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<AppliedState, io::Error> {
        let shared = self.shared.clone();
        Ok(blocking(move || shared.applied_state()).await?)
    }

    /// Takes every entry openraft has ready, applies them as one batch (see
    /// [`Shared::apply`]) and tells the listener, then answers each entry's client.
    async fn apply<Strm>(&mut self, entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        let items: Vec<EntryResponder<TypeConfig>> = entries.try_collect().await?;
        if items.is_empty() {
            return Ok(());
        }
        let (entries, responders): (Vec<LogEntry>, Vec<_>) = items.into_iter().unzip();
        // A small batch (the common case at low and moderate load) is applied inline: its
        // reads hit the memtable and block cache and its write is unsynced, so it takes tens
        // of microseconds — less than the hop to the blocking pool and back. Large batches
        // go to the pool so that one apply never holds an async worker for long.
        let commands: usize = entries.iter().map(entry_commands).sum();
        let replies = if commands <= INLINE_APPLY_COMMANDS {
            self.shared.apply_and_tell(&entries)?
        } else {
            let shared = self.shared.clone();
            blocking(move || shared.apply_and_tell(&entries)).await?
        };
        for (responder, reply) in responders.into_iter().zip(replies) {
            if let Some(responder) = responder {
                responder.send(reply);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder { shared: self.shared.clone() }
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        let mut file = snapshot;
        // Completes (and surfaces errors of) writes still in flight inside tokio's File.
        file.flush().await.map_err(|e| StoreError::io("flush received snapshot", e))?;
        let file = file.into_std().await;
        let shared = self.shared.clone();
        let owned_meta = meta.clone();
        blocking(move || shared.install(file, &owned_meta)).await?;
        tracing::info!(snapshot = %meta, "installed snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let shared = self.shared.clone();
        let current = blocking(move || shared.current_snapshot()).await?;
        Ok(current.map(|(meta, file)| Snapshot { meta, snapshot: tokio::fs::File::from_std(file) }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use openraft::testing::{blank_ent, log_id, membership_ent};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::{LogStore, Store};

    /// Applies `entries` the way openraft does, without clients to answer.
    async fn apply_entries(
        sm: &mut StateMachineStore,
        entries: impl IntoIterator<Item = LogEntry>,
    ) -> Result<(), io::Error> {
        let items: Vec<Result<EntryResponder<TypeConfig>, io::Error>> =
            entries.into_iter().map(|e| Ok((e, None))).collect();
        RaftStateMachine::apply(sm, futures::stream::iter(items)).await
    }

    type Dump = Vec<(Cf, Vec<u8>, Vec<u8>)>;

    fn open(dir: &Path) -> (LogStore, StateMachineStore) {
        Store::open(dir).expect("open store")
    }

    fn put(sm: &StateMachineStore, cf: Cf, key: &[u8], value: &[u8]) {
        let db = &sm.shared.db;
        db.put_cf(db::cf(db, cf.name()).expect("cf"), key, value).expect("put");
    }

    /// Every state-machine record, reserved keys included.
    fn dump(sm: &StateMachineStore) -> Dump {
        let view = ReadView::live(&sm.shared.db);
        let mut out = Vec::new();
        for cf in Cf::ALL {
            view.for_each(cf, b"", b"", |k, v| {
                out.push((cf, k.to_vec(), v.to_vec()));
                Ok(true)
            })
            .expect("scan");
        }
        out
    }

    fn snapshot_files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join("snapshots"))
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn voters(ids: &[u64]) -> Vec<BTreeSet<u64>> {
        vec![ids.iter().copied().collect()]
    }

    /// A state machine with data in several column families, applied up to (1, 3).
    async fn leader(dir: &Path) -> (LogStore, StateMachineStore) {
        let (log, mut sm) = open(dir);
        put(&sm, Cf::Jobs, b"job-1", b"one");
        put(&sm, Cf::Jobs, b"job-2", &[9u8; 50_000]);
        put(&sm, Cf::Ready, b"", b"empty key");
        put(&sm, Cf::Timers, &[0xff; 3], b"t");
        put(&sm, Cf::Meta, b"clock", b"42");
        apply_entries(
            &mut sm,
            [
                membership_ent::<TypeConfig>(1, 0, 2, voters(&[1, 2, 3])),
                blank_ent::<TypeConfig>(1, 0, 3),
            ],
        )
        .await
        .expect("apply");
        (log, sm)
    }

    async fn read_snapshot(snapshot: &mut Snapshot) -> Vec<u8> {
        let mut bytes = Vec::new();
        snapshot.snapshot.read_to_end(&mut bytes).await.expect("read snapshot");
        bytes
    }

    /// Feeds `bytes` to `sm` the way openraft does: into the file it handed out.
    async fn receive(
        sm: &mut StateMachineStore,
        meta: &Meta,
        bytes: &[u8],
    ) -> Result<(), io::Error> {
        let mut file = sm.inbox().create().await?;
        for chunk in bytes.chunks(4096) {
            file.write_all(chunk).await.expect("write chunk");
        }
        sm.install_snapshot(meta, file).await
    }

    #[tokio::test]
    async fn snapshot_transfer_reproduces_the_state() {
        let (leader_dir, follower_dir) =
            (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
        let (_log_l, mut sm_l) = leader(leader_dir.path()).await;
        let mut built = sm_l.get_snapshot_builder().await.build_snapshot().await.expect("build");
        assert_eq!(built.meta.last_log_id, Some(log_id::<TypeConfig>(1, 0, 3)));
        let bytes = read_snapshot(&mut built).await;

        let (log_f, mut sm_f) = open(follower_dir.path());
        put(&sm_f, Cf::Jobs, b"stale", b"x");
        put(&sm_f, Cf::DueHist, b"stale", b"x");
        apply_entries(&mut sm_f, [blank_ent::<TypeConfig>(1, 0, 1)]).await.expect("apply");
        receive(&mut sm_f, &built.meta, &bytes).await.expect("install");

        assert_eq!(dump(&sm_f), dump(&sm_l));
        assert_eq!(
            sm_f.applied_state().await.expect("state"),
            sm_l.applied_state().await.expect("state")
        );
        let current = sm_f.get_current_snapshot().await.expect("current").expect("some");
        assert_eq!(current.meta, built.meta);
        // The received file became the snapshot in place: no copy, no leftovers.
        assert_eq!(snapshot_files(follower_dir.path()).len(), 1);

        let want = dump(&sm_l);
        drop((log_f, sm_f));
        let (_log_f, mut sm_f) = open(follower_dir.path());
        assert_eq!(dump(&sm_f), want);
        let current = sm_f.get_current_snapshot().await.expect("current").expect("some");
        assert_eq!(current.meta, built.meta);
    }

    #[tokio::test]
    async fn a_damaged_snapshot_is_refused_before_the_state_is_touched() {
        let (leader_dir, follower_dir) =
            (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
        let (_log_l, mut sm_l) = leader(leader_dir.path()).await;
        let mut built = sm_l.get_snapshot_builder().await.build_snapshot().await.expect("build");
        let mut bytes = read_snapshot(&mut built).await;
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;

        let (_log_f, mut sm_f) = open(follower_dir.path());
        put(&sm_f, Cf::Jobs, b"mine", b"x");
        let before = dump(&sm_f);
        assert!(receive(&mut sm_f, &built.meta, &bytes).await.is_err());
        assert_eq!(dump(&sm_f), before);
        assert!(sm_f.get_current_snapshot().await.expect("current").is_none());
        assert!(snapshot_files(follower_dir.path()).is_empty());
    }

    /// Only `.tmp` files: what abandoned transfers may leave behind.
    fn temp_files(dir: &Path) -> Vec<String> {
        snapshot_files(dir).into_iter().filter(|n| n.ends_with(".tmp")).collect()
    }

    #[tokio::test]
    async fn an_abandoned_transfer_leaves_no_temporary_file() {
        let (leader_dir, follower_dir) =
            (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
        let (_log_l, mut sm_l) = leader(leader_dir.path()).await;
        let mut built = sm_l.get_snapshot_builder().await.build_snapshot().await.expect("build");
        let bytes = read_snapshot(&mut built).await;

        // A transfer that stops halfway, then a new one: the first file must go.
        let (log_f, mut sm_f) = open(follower_dir.path());
        let mut first = sm_f.inbox().create().await.expect("begin");
        first.write_all(&bytes[..bytes.len() / 2]).await.expect("write");
        first.flush().await.expect("flush");
        assert_eq!(temp_files(follower_dir.path()).len(), 1);
        let mut second = sm_f.inbox().create().await.expect("begin again");
        assert_eq!(temp_files(follower_dir.path()).len(), 1, "the abandoned file is removed");
        // Even if the abandoned handle is written and installed after all, it still works.
        first.write_all(&bytes[bytes.len() / 2..]).await.expect("write rest");
        sm_f.install_snapshot(&built.meta, first).await.expect("install the first");
        assert_eq!(dump(&sm_f), dump(&sm_l));
        assert!(temp_files(follower_dir.path()).is_empty());

        // A transfer cut off by a restart leaves nothing behind either.
        second.write_all(&bytes[..10]).await.expect("write");
        let _third = sm_f.inbox().create().await.expect("begin");
        drop((log_f, sm_f, second));
        assert_eq!(temp_files(follower_dir.path()).len(), 1);
        let (_log_f, _sm_f) = open(follower_dir.path());
        assert!(temp_files(follower_dir.path()).is_empty());
    }

    #[tokio::test]
    async fn an_interrupted_install_is_finished_on_open() {
        let (leader_dir, follower_dir) =
            (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
        let (_log_l, mut sm_l) = leader(leader_dir.path()).await;
        let built = sm_l.get_snapshot_builder().await.build_snapshot().await.expect("build");
        let leader_file = lock(&sm_l.shared.current).clone().expect("current").file;

        // Crash in the middle of an install: marker written, state cleared, part loaded.
        let (log_f, sm_f) = open(follower_dir.path());
        put(&sm_f, Cf::Jobs, b"stale", b"x");
        std::fs::copy(
            leader_dir.path().join("snapshots").join(&leader_file),
            follower_dir.path().join("snapshots").join("00000000000000aa.snap"),
        )
        .expect("copy");
        let record =
            SnapshotRecord { file: "00000000000000aa.snap".into(), meta: built.meta.clone() };
        let db = &sm_f.shared.db;
        let mut batch = WriteBatch::default();
        batch.put_cf(
            db::cf(db, CF_RAFT_META).expect("cf"),
            meta_key::INSTALLING,
            codec::encode(&record),
        );
        for cf in Cf::ALL {
            clear(db, cf, &mut batch).expect("clear");
        }
        batch.put_cf(db::cf(db, Cf::Jobs.name()).expect("cf"), b"job-1", b"one");
        db.write(batch).expect("write");
        drop((log_f, sm_f));

        let (_log_f, mut sm_f) = open(follower_dir.path());
        assert_eq!(dump(&sm_f), dump(&sm_l));
        let marker: Option<SnapshotRecord> =
            db::get_decoded(&sm_f.shared.db, CF_RAFT_META, meta_key::INSTALLING).expect("get");
        assert_eq!(marker, None);
        let current = sm_f.get_current_snapshot().await.expect("current").expect("some");
        assert_eq!(current.meta, built.meta);
        assert_eq!(snapshot_files(follower_dir.path()), ["00000000000000aa.snap"]);
    }

    /// A run of committed entries whose writes exceed the flush bound is written in parts,
    /// and the result is the same as applying them one by one: every job, the last id. Each
    /// part reads the queue's count the one before wrote, through the apply cache, which
    /// batches this large only tell which keys changed: a count it kept from before would
    /// come out short.
    #[tokio::test]
    async fn a_long_apply_is_written_in_bounded_parts() {
        use delayd_core::{JobId, QueueName};
        let dir = tempfile::tempdir().expect("dir");
        let (_log, sm) = open(dir.path());
        let body = vec![7u8; 4 << 20];
        let n = (APPLY_FLUSH_BYTES / body.len()) as u64 * 2 + 3;
        let entries: Vec<LogEntry> =
            (1..=n).map(|i| crate::test_entries::publish_entry(1, i, body.clone())).collect();
        let (replies, _) = sm.shared.apply(&entries).expect("apply");
        assert_eq!(replies.len() as u64, n);
        let view = sm.read_view().expect("view");
        assert_eq!(view.last_applied().expect("last applied"), Some(log_id::<TypeConfig>(1, 0, n)));
        let meta = delayd_core::query::queue_meta(&view, &QueueName::new("ns", "q")).expect("meta");
        assert_eq!(meta.count(delayd_core::JobState::Ready), n);
        for i in 1..=n {
            let job = delayd_core::query::job(&view, &QueueName::new("ns", "q"), JobId(i.into()));
            assert!(job.expect("read").is_some_and(|j| j.body == body), "job {i}");
        }
    }

    /// A build runs on a thread of its own at the lowest CPU priority (`in_background`): a
    /// watcher sees a `delayd-snapshot` thread at nice 19 while it runs. The state is large
    /// enough (32 MiB to write and sync) for the build to outlast many of the watcher's looks.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_snapshot_is_built_on_a_thread_of_its_own_at_the_lowest_priority() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().expect("dir");
        let (_log, mut sm) = leader(dir.path()).await;
        for i in 0..2_048u32 {
            put(&sm, Cf::Jobs, format!("bulk-{i:05}").as_bytes(), &[1u8; 16 << 10]);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                while !stop.load(Ordering::Acquire) {
                    seen.extend(crate::tests::nice_of("delayd-snapshot"));
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                seen
            })
        };
        sm.get_snapshot_builder().await.build_snapshot().await.expect("build");
        stop.store(true, Ordering::Release);
        let seen = watcher.join().expect("watcher");
        // The thread is named before it lowers its priority, so a look may catch it at 0.
        assert!(seen.contains(&19), "no delayd-snapshot thread at nice 19 seen: {seen:?}");
        // Handing over its result is the thread's last act: it is gone soon after, not at once.
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        while !crate::tests::nice_of("delayd-snapshot").is_empty() {
            assert!(Instant::now() < deadline, "the thread outlived the build");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[tokio::test]
    async fn an_older_snapshot_never_replaces_a_newer_one() {
        let dir = tempfile::tempdir().expect("dir");
        let (_log, mut sm) = leader(dir.path()).await;
        let first = sm.get_snapshot_builder().await.build_snapshot().await.expect("build");
        apply_entries(&mut sm, [blank_ent::<TypeConfig>(2, 0, 4)]).await.expect("apply");
        let second = sm.get_snapshot_builder().await.build_snapshot().await.expect("build");
        assert!(second.meta.last_log_id > first.meta.last_log_id);
        let files = snapshot_files(dir.path());
        assert_eq!(files.len(), 1, "the replaced snapshot's file is removed");

        // A build that finishes late with older data (say, it raced an install) loses.
        let stale = SnapshotRecord { file: SnapshotDir::snap_name(999), meta: first.meta.clone() };
        std::fs::write(sm.shared.dir.path(&stale.file), b"old").expect("write");
        sm.shared.promote(stale).expect("promote");
        let current = sm.get_current_snapshot().await.expect("current").expect("some");
        assert_eq!(current.meta, second.meta);
        assert_eq!(snapshot_files(dir.path()), files);
    }

    #[tokio::test]
    async fn apply_records_progress_with_the_data_and_tells_the_listener() {
        let dir = tempfile::tempdir().expect("dir");
        let (_log, mut sm) = open(dir.path());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        sm.set_listener(Arc::new(move |effects: &Effects| lock(&sink).push(effects.clone())));

        let syncs = db::wal_syncs(&sm.shared.db);
        apply_entries(
            &mut sm,
            [blank_ent::<TypeConfig>(1, 0, 1), membership_ent::<TypeConfig>(1, 0, 2, voters(&[1]))],
        )
        .await
        .expect("apply");
        assert_eq!(db::wal_syncs(&sm.shared.db), syncs, "apply does not fsync");
        assert_eq!(*lock(&seen), [Effects::default()]);
        // Both entries came in one call: one batch timed.
        assert_eq!(sm.shared.metrics.apply_seconds.get_sample_count(), 1);

        let (last_applied, membership) = sm.applied_state().await.expect("state");
        assert_eq!(last_applied, Some(log_id::<TypeConfig>(1, 0, 2)));
        assert_eq!(membership.log_id(), &Some(log_id::<TypeConfig>(1, 0, 2)));
        assert_eq!(membership.membership().voter_ids().collect::<Vec<_>>(), [1]);
        let view = sm.read_view().expect("view");
        assert_eq!(view.last_applied().expect("last applied"), Some(log_id::<TypeConfig>(1, 0, 2)));
    }

    /// Applies are in no WAL (`db::unlogged`): a crash leaves the state of the last flush,
    /// every column family and `last_applied` at the same batch, and never less than the
    /// current snapshot, which may already have let the log be purged. Re-applying the log
    /// from there gives the state the crash interrupted.
    #[tokio::test]
    async fn a_crash_leaves_the_last_flushed_batch_and_never_less_than_the_snapshot() {
        use crate::test_entries::{copy_tree, publish_entry};
        let dir = tempfile::tempdir().expect("dir");
        let data = dir.path().join("node");
        let (_log, mut sm) = open(&data);
        let fresh = dump(&sm);
        let first = [
            membership_ent::<TypeConfig>(1, 0, 1, voters(&[1])),
            publish_entry(1, 2, b"two".to_vec()),
        ];
        apply_entries(&mut sm, first.clone()).await.expect("apply");

        // Killed now: nothing was flushed, and nothing of the applies is on disk.
        copy_tree(&data, &dir.path().join("crash-1"));
        {
            let (_log, mut crashed) = open(&dir.path().join("crash-1"));
            assert_eq!(crashed.applied_state().await.expect("state").0, None);
            assert_eq!(dump(&crashed), fresh);
            apply_entries(&mut crashed, first).await.expect("re-apply");
            assert_eq!(dump(&crashed), dump(&sm), "re-applied from the log");
        }

        let built = sm.get_snapshot_builder().await.build_snapshot().await.expect("build");
        assert_eq!(built.meta.last_log_id, Some(log_id::<TypeConfig>(1, 0, 2)));
        let at_snapshot = dump(&sm);
        let second = publish_entry(1, 3, b"three".to_vec());
        apply_entries(&mut sm, [second.clone()]).await.expect("apply");

        // Killed after the snapshot: its applies survive, the later one does not.
        copy_tree(&data, &dir.path().join("crash-2"));
        let (_log, mut crashed) = open(&dir.path().join("crash-2"));
        let applied = crashed.applied_state().await.expect("state").0;
        assert_eq!(applied, built.meta.last_log_id);
        assert_eq!(dump(&crashed), at_snapshot);
        apply_entries(&mut crashed, [second]).await.expect("re-apply");
        assert_eq!(dump(&crashed), dump(&sm), "re-applied from the log");
    }

    /// An install clears the key range it sees; keys on disk that an unflushed apply deleted
    /// must not come back after a crash that follows the install.
    #[tokio::test]
    async fn a_crash_after_an_install_keeps_only_the_snapshot() {
        use crate::test_entries::{cancel_entry, copy_tree, publish_entry};
        let (leader_dir, dir) =
            (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
        let (_log_l, mut sm_l) = open(leader_dir.path());
        let entries = [
            membership_ent::<TypeConfig>(1, 0, 1, voters(&[1])),
            blank_ent::<TypeConfig>(1, 0, 2),
            blank_ent::<TypeConfig>(1, 0, 3),
        ];
        apply_entries(&mut sm_l, entries).await.expect("apply");
        let mut built = sm_l.get_snapshot_builder().await.build_snapshot().await.expect("build");
        let bytes = read_snapshot(&mut built).await;

        // The follower's only job is on disk, then deleted by an apply that is in no WAL: its
        // column families look empty to the install.
        let data = dir.path().join("node");
        let (_log, mut sm) = open(&data);
        apply_entries(&mut sm, [publish_entry(1, 1, b"one".to_vec())]).await.expect("apply");
        db::flush_state(&sm.shared.db).expect("flush");
        apply_entries(&mut sm, [cancel_entry(1, 2, 1)]).await.expect("apply");
        receive(&mut sm, &built.meta, &bytes).await.expect("install");
        assert_eq!(dump(&sm), dump(&sm_l));

        copy_tree(&data, &dir.path().join("crashed"));
        let (_log, crashed) = open(&dir.path().join("crashed"));
        assert_eq!(dump(&crashed), dump(&sm_l), "the deleted job came back");
    }

    /// The state machine's data: [`dump`] without the store's own keys (an install writes the
    /// membership, which a state that never applied a membership entry lacks).
    fn state_of(sm: &StateMachineStore) -> Dump {
        let ours = |cf: &Cf, k: &[u8]| *cf == Cf::Meta && k.starts_with(SM_RESERVED_PREFIX);
        dump(sm).into_iter().filter(|(cf, k, _)| !ours(cf, k)).collect()
    }

    /// The reads of job records apply's cache answered, and those it sent to the database.
    fn table(sm: &StateMachineStore) -> (u64, u64) {
        let c = lock(&sm.shared.apply_cache);
        (c.hits[Cf::Jobs.index()], c.misses[Cf::Jobs.index()])
    }

    #[tokio::test]
    async fn a_record_an_apply_wrote_is_read_back_from_memory() {
        use crate::test_entries::{cancel_entry, publish_entry};
        let dir = tempfile::tempdir().expect("dir");
        let (_log, mut sm) = open(dir.path());
        apply_entries(&mut sm, [publish_entry(1, 1, b"one".to_vec())]).await.expect("apply");
        let (hits, misses) = table(&sm);
        apply_entries(&mut sm, [cancel_entry(1, 2, 1)]).await.expect("apply");
        assert_eq!(table(&sm), (hits + 1, misses), "the cancel's read of job 1");
        assert!(dump(&sm).iter().all(|(cf, _, _)| *cf != Cf::Jobs), "job 1 is gone");

        // Deleted, the record is read from the database again (and is absent there).
        apply_entries(&mut sm, [cancel_entry(1, 3, 1)]).await.expect("apply");
        assert_eq!(table(&sm), (hits + 1, misses + 1));
    }

    /// A job that comes and goes between two flushes leaves no trace of its indexes on disk:
    /// their keys are deleted with single deletes, which the flush drops together with the
    /// puts they meet. Its record, rewritten in place over its life, is deleted with a plain
    /// delete, whose tombstone the flush must keep.
    #[tokio::test]
    async fn a_job_gone_before_the_flush_leaves_no_index_tombstone() {
        use crate::test_entries::{cancel_entry, publish_entry};
        let dir = tempfile::tempdir().expect("dir");
        let (_log, mut sm) = open(dir.path());
        apply_entries(&mut sm, [publish_entry(1, 1, b"one".to_vec())]).await.expect("apply");
        apply_entries(&mut sm, [cancel_entry(1, 2, 1)]).await.expect("apply");
        let db = &sm.shared.db;
        db::flush_state(db).expect("flush");
        let files = |cf: Cf| {
            let handle = db::cf(db, cf.name()).expect("cf");
            db.property_int_value_cf(handle, "rocksdb.num-files-at-level0")
                .expect("property")
                .expect("known")
        };
        assert_eq!(files(Cf::Jobs), 1, "the record's tombstone is flushed");
        for cf in [Cf::Ready, Cf::Members] {
            assert_eq!(files(cf), 0, "{cf:?}: the put and its single delete left nothing");
        }
        assert!(dump(&sm).iter().all(|(cf, _, _)| *cf != Cf::Ready && *cf != Cf::Members));
    }

    /// Nothing apply's cache held before an install may answer a read of the installed state:
    /// here the follower's stale job 3 sits at another place in line than the leader's (and
    /// its queue's counts and floor differ), and a cancel that read any of it would leave
    /// another state than the leader's.
    #[tokio::test]
    async fn an_install_leaves_nothing_of_the_old_state_in_the_apply_cache() {
        use crate::test_entries::{cancel_entry, publish_entry};
        let (leader_dir, follower_dir) =
            (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
        let (_log_l, mut sm_l) = open(leader_dir.path());
        let published = (1..=3).map(|i| publish_entry(1, i, b"leader".to_vec()));
        apply_entries(&mut sm_l, published).await.expect("apply");
        let mut built = sm_l.get_snapshot_builder().await.build_snapshot().await.expect("build");
        let bytes = read_snapshot(&mut built).await;

        let (_log_f, mut sm_f) = open(follower_dir.path());
        apply_entries(&mut sm_f, [publish_entry(1, 3, b"stale".to_vec())]).await.expect("apply");
        receive(&mut sm_f, &built.meta, &bytes).await.expect("install");
        let before = table(&sm_f);

        apply_entries(&mut sm_l, [cancel_entry(1, 4, 3)]).await.expect("apply");
        apply_entries(&mut sm_f, [cancel_entry(1, 4, 3)]).await.expect("apply");
        assert_eq!(state_of(&sm_f), state_of(&sm_l));
        assert_eq!(table(&sm_f), (before.0, before.1 + 1), "the cancel read job 3 from the store");
    }

    /// A command of a random workload over three queues and forty job ids: every kind a
    /// consumer's and a timer's path takes, so that the cache meets reads of what was just
    /// written, deleted, moved and fired. An id is published again only once its job is gone
    /// (`live` says which are not), as a node never publishes an id in use: its jobs' ids are
    /// new ULIDs, and the store deletes index keys on that ground (`Cf::written_once`).
    fn random_command(
        next: &mut impl FnMut(u64) -> u64,
        live: &mut impl FnMut(delayd_core::JobId) -> bool,
    ) -> delayd_core::Command {
        use delayd_core::{Command, Due, JobId, NewJob, QueueName, Target};
        let queue = QueueName::new("ns", ["a", "b", "c"][next(3) as usize]);
        // Ids n and n + 20 share a slot of the job table: displacements, and deletes of
        // another record of the slot, happen all the time.
        let n = next(40);
        let id = JobId(0xbeef << 64 | u128::from(n / 20) << 10 | u128::from(n % 20));
        match next(10) {
            0..=2 if live(id) => Command::Tick { limit: 1 + next(20) as u32 },
            0..=2 => Command::Publish {
                queue,
                job: NewJob {
                    id,
                    key: None,
                    body: vec![b'x'; next(200) as usize],
                    attributes: Default::default(),
                    due: Due::After(if next(2) == 0 { 0 } else { next(3_000) }),
                    ttl_ms: None,
                    tries: 1 + next(3) as u16,
                    ttr_ms: 500,
                    priority: next(3) as u32,
                },
            },
            3 => Command::Reserve {
                queues: vec![queue],
                count: 1 + next(3) as u32,
                ttr_ms: None,
                lease_seed: next(u64::MAX),
            },
            4 => Command::Ack { queue, id, lease: None },
            5 => Command::Release { queue, id, lease: None, delay_ms: next(1_000), priority: None },
            6 => Command::Cancel { queue, target: Target::Id(id) },
            7 => Command::Bury { queue, id, lease: None },
            8 => Command::Update {
                queue,
                target: Target::Id(id),
                due: Some(Due::After(next(2_000))),
                body: None,
                priority: Some(next(3) as u32),
            },
            _ => Command::Tick { limit: 1 + next(20) as u32 },
        }
    }

    /// Applying through the store (and its cache of what apply reads) leaves exactly the
    /// state and answers that applying the same entries to an in-memory map does, batch
    /// after batch.
    #[tokio::test]
    async fn the_apply_cache_changes_no_outcome_and_no_state() {
        the_same_as_in_memory(ApplyCache::default()).await;
    }

    /// The same, with a table that keeps so few small keys that it starts again every few
    /// reads.
    #[tokio::test]
    async fn an_apply_cache_that_starts_again_often_changes_nothing_either() {
        the_same_as_in_memory(ApplyCache::keeping(3)).await;
    }

    async fn the_same_as_in_memory(cache: ApplyCache) {
        use delayd_core::{Entry, MemKv, Overlay};
        let dir = tempfile::tempdir().expect("dir");
        let (_log, sm) = open(dir.path());
        *lock(&sm.shared.apply_cache) = cache;
        let mut mem = MemKv::default();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            // xorshift64*: deterministic, so a failure repeats.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
        };
        let (mut index, mut now) = (0u64, 1_000u64);
        for batch in 0..400 {
            let mut entries = Vec::new();
            // Ids this batch may publish: none held in the state before it, none published in
            // it already (a job published and removed within the batch is skipped too).
            let mut published = std::collections::HashSet::new();
            let mut live = |id: delayd_core::JobId| {
                let held = mem.get(Cf::Jobs, &id.to_bytes()).expect("get").is_some();
                held || !published.insert(id)
            };
            for _ in 0..1 + next(3) {
                index += 1;
                now += next(400);
                let commands =
                    (0..1 + next(5)).map(|_| random_command(&mut next, &mut live)).collect();
                entries.push(LogEntry {
                    log_id: log_id::<TypeConfig>(1, 0, index),
                    payload: EntryPayload::Normal(Entry::new(now, commands)),
                });
            }
            let (replies, _) = sm.shared.apply(&entries).expect("apply");

            let mut overlay = Overlay::new(&mem);
            let mut want = Vec::new();
            for entry in &entries {
                let EntryPayload::Normal(e) = &entry.payload else { unreachable!() };
                let mut effects = Effects::default();
                want.push(delayd_core::apply(&mut overlay, e, &mut effects).expect("apply"));
            }
            let writes: Vec<_> = overlay.into_writes().collect();
            mem.apply(writes);
            assert_eq!(replies, want, "the answers of batch {batch}");

            let stored = state_of(&sm);
            let expected: Dump =
                mem.iter().map(|(cf, k, v)| (cf, k.to_vec(), v.to_vec())).collect();
            assert_eq!(stored, expected, "the state after batch {batch}");
        }
        let c = lock(&sm.shared.apply_cache);
        let (jobs, meta) = (Cf::Jobs.index(), Cf::Meta.index());
        assert!(c.hits[jobs] > 50 && c.hits[meta] > 100, "the cache was used: {:?}", c.hits);
    }

    #[tokio::test]
    async fn reads_are_refused_while_an_install_runs() {
        let dir = tempfile::tempdir().expect("dir");
        let (_log, sm) = open(dir.path());
        let reader = sm.reader();
        {
            let _installing = sm.shared.install_gate.write().expect("gate");
            assert!(matches!(reader.read_view(), Err(StoreError::Installing)));
        }
        assert!(reader.read_view().is_ok());
    }
}
