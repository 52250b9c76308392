//! The RocksDB instance: column families, reserved keys, write options and the [`KvRead`]
//! implementation the state machine and queries run on.

use std::path::Path;

use delayd_core::{codec, Cf, KvError, KvRead};
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, DBCompressionType,
    FlushOptions, Options, ReadOptions, SnapshotWithThreadMode, WriteOptions,
};
use serde::de::DeserializeOwned;

use crate::error::StoreError;

/// The RocksDB handle type. Spelled out (rather than `rocksdb::DB`) so that a feature switch
/// elsewhere in the build cannot change how column-family handles are borrowed.
pub(crate) type Db = rocksdb::DBWithThreadMode<rocksdb::SingleThreaded>;

/// Where Raft log entries were kept, keyed by log index as 8 big-endian bytes, before the log
/// had files of its own (`log_files.rs`). Opened because RocksDB must open every column family
/// it has; emptied on the first start of such a data directory (`LogStore::open`).
pub(crate) const CF_LOG: &str = "raft_log";
/// Snapshot bookkeeping and the cluster identity (before the log had files of its own, also
/// the vote, the commit index and the last purged log id).
pub(crate) const CF_RAFT_META: &str = "raft_meta";

/// Keys in [`CF_RAFT_META`].
pub(crate) mod meta_key {
    /// `Vote<NodeId>`: read only to move it to the log's files.
    pub(crate) const VOTE: &[u8] = b"vote";
    /// `Option<LogId>`: the last committed log id; read only to move it to the log's files.
    pub(crate) const COMMITTED: &[u8] = b"committed";
    /// `LogId`: the last purged log id; read only to move it to the log's files.
    pub(crate) const LAST_PURGED: &[u8] = b"last_purged";
    /// `SnapshotRecord`: the current snapshot file and its meta.
    pub(crate) const SNAPSHOT: &[u8] = b"snapshot";
    /// `SnapshotRecord`: present while a snapshot install is incomplete.
    pub(crate) const INSTALLING: &[u8] = b"installing";
    /// `String`: the identity of the cluster this node belongs to, when it has one (a cluster
    /// made by a restore or a recovery; see `identity.rs`).
    pub(crate) const CLUSTER_ID: &[u8] = b"cluster_id";
}

/// Every key the store itself keeps in the state machine's [`Cf::Meta`] starts with this; the
/// core must not write under it (apply rejects such writes).
pub(crate) const SM_RESERVED_PREFIX: &[u8] = b"raft/";
/// `Option<LogId>` in [`Cf::Meta`]: the last applied log id, written with the data it covers.
pub(crate) const SM_LAST_APPLIED: &[u8] = b"raft/last_applied";
/// `StoredMembership` in [`Cf::Meta`]: the last applied membership.
pub(crate) const SM_MEMBERSHIP: &[u8] = b"raft/membership";

/// The memory all memtables together may hold before they are flushed, on a store opened
/// without a node id; a node's adds a step or more of [`MEMTABLE_STEP`] ([`memtable_budget`]).
const MEMTABLE_BUDGET: usize = 128 << 20;

/// How far apart the memtable budgets of nodes with neighbouring ids are.
const MEMTABLE_STEP: usize = 12 << 20;

/// How many different budgets node ids map to, [`MEMTABLE_STEP`] apart.
const MEMTABLE_STEPS: u64 = 4;

/// The memtable budget of `node`'s store: [`MEMTABLE_BUDGET`] and `node % 4` steps of
/// [`MEMTABLE_STEP`] more (128, 140, 152 or 164 MiB); [`MEMTABLE_BUDGET`] without a node.
///
/// Replicas apply the same writes, so with one budget every node of a cluster reached it at
/// the same entry and flushed at the same moment (within half a second on three local nodes).
/// Each flush slows its node's foreground while a commit needs two of the three: in six timer
/// runs on one cluster, three of the four runs that had a flush had their latest deliveries
/// (62–141 ms) in its second. Budgets a step apart put the flushes of nodes 1 to 3 one to
/// eight seconds apart under a steady load, so that two nodes that are not flushing can
/// commit. Random draws did not do: three drew 143, 144 and 146 MiB and flushed within half a
/// second of each other.
pub(crate) fn memtable_budget(node: Option<u64>) -> usize {
    // `id % 4` fits any usize.
    MEMTABLE_BUDGET + MEMTABLE_STEP * node.map_or(0, |id| (id % MEMTABLE_STEPS) as usize)
}

/// The block cache the state machine's column families share: RocksDB's default size.
const SM_BLOCK_CACHE: usize = 32 << 20;

/// Where the state machine's memtables start each insert's search.
///
/// A memtable is a skip list, and by default an insert reuses the place of the one before
/// only if the new key falls in the very same gap; anything else is searched for from the
/// top. That gap holds for appends of new keys (a publish) but hardly ever for what a
/// consumer does: the tombstone or new version of a key already in the memtable lands just
/// before that key, so the next one, a little further on, no longer falls in the gap (34 key
/// comparisons per insert for an ack and the next reserve against 10 for a publish, counted
/// under callgrind with memtables of some tens of thousands of entries).
/// With an insert-hint prefix extractor, RocksDB keeps one remembered place per prefix and
/// moves it up the skip list only as far as the next key needs. The prefix is the key's
/// first byte: keys of one kind share it (in the Meta column family floors, the sequence,
/// the clock and the number index start with different letters), so a few places per
/// column family serve every insert, and the map of places stays tiny. The option exists in
/// RocksDB's options strings only, not in the C API. RocksDB uses the hints only where one
/// thread inserts into a memtable at a time; writes it inserts in parallel take the plain
/// path, as before.
const INSERT_HINTS: &str = "memtable_insert_with_hint_prefix_extractor=rocksdb.CappedPrefix.1";

/// Opens (creating if needed) the database at `path` with every column family.
pub(crate) fn open(path: &Path, node: Option<u64>) -> Result<Db, StoreError> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    open_with_jobs(path, node, background_jobs(cores))
}

/// [`open`] with RocksDB's background jobs given (the tests set what a host's cores would).
fn open_with_jobs(path: &Path, node: Option<u64>, jobs: usize) -> Result<Db, StoreError> {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    // Compactions run [`COMPACTION_NICE_STEPS`] below the node's own CPU priority (nice 10
    // for a node at the default 0), below the threads that serve requests, replicate and sync
    // the log. They are bursts of tens of milliseconds of CPU and more; at the same priority one
    // can take a core from a busy node for that long, and commits and deliveries wait behind
    // it. No write waits for a compaction until level 0 of some column family holds 20 files;
    // from there RocksDB slows every write of the node down step by step, and at 36 stops
    // them. Not at nice 19, the lowest: beside processes at nice 0 a thread there gets some
    // 1/70 of a core (CFS weights 15 against 1,024), at nice 10 some 1/10. Three nodes bulk
    // publishing up to ten million jobs beside three spinning processes had level 0 of their
    // log and state fill up behind compactions at nice 19, their writes slowed and stopped, and
    // 2,778 bulk publishes were answered 503; at nice 10 the same run went through at 27,077
    // jobs/s (docs/bench/consume-path.md). RocksDB's own call (in the Rust bindings) puts a
    // pool only at nice 19, so `open` sets the threads' priority itself
    // (`lower_compaction_threads`).
    //
    // Flushes keep the normal priority. A write waits for a flush as soon as the memtables
    // are full, and starving a flush then stops every write of the node. Its own load cannot
    // starve it for long (stalled writes free the cores), but other processes' load can: with
    // two processes spinning beside a node, a flush at nice 19 gets some 1/70 of a core, bulk
    // publishes met flushes of up to 4.5 s and writes stopped until they were answered 503
    // "not committed within 5 s", while at normal priority the same runs never stopped
    // (docs/bench/consume-path.md). Timed in four pairs without such load, in a drifting
    // hour, flushes at normal priority showed no loss in the timer's lateness.
    //
    // One background job more than the cores (`background_jobs`): RocksDB splits its jobs
    // into a quarter for flushes (at least one, on a pool of its own) and the rest for
    // compactions, so on two cores that allows two compactions at a time instead of one.
    // RocksDB runs more than one only while it deems compactions behind (eight level-0 files
    // in some column family, twice the compaction trigger, or a backlog of compaction bytes,
    // or writes already slowed), so a node that keeps up runs as before; the allowance is the
    // database's, so one column family behind lets another's compaction run beside. With one,
    // a column family whose level 0 fills up (the Raft log's, the small metadata ones that
    // every atomic flush adds a file to) waits for the jobs column family's long compaction
    // to finish before its own short one can start. Beside three spinning processes, three
    // nodes bulk publishing ten million jobs had writes slowed in 0–20 seconds a node (29 and
    // 31 node-seconds a run) with one, and in one node-second in two runs with two
    // (docs/bench/consume-path.md). Both run at nice 10, below the node.
    opts.increase_parallelism(i32::try_from(jobs).unwrap_or(i32::MAX));
    // The WAL is shared by every column family; a rarely written one (raft_meta) would pin old
    // WAL files forever without this bound, which forces flushes of the column families
    // holding them.
    opts.set_max_total_wal_size(512 << 20);
    // The state machine's writes skip the WAL (see `unlogged`), so after a crash its column
    // families hold whatever their last flush wrote. Flushed together, that is one applied
    // batch boundary for all of them, with `raft/last_applied` beside it; flushed one by one,
    // the jobs could be ahead of the ready index and of `last_applied`, and re-applying the log
    // over them would not reproduce the state. Automatic flushes then take every column family
    // with data in its memtable.
    opts.set_atomic_flush(true);
    opts.set_keep_log_file_num(10);
    // Smooth out the IO of memtable flushes and compactions instead of bursty writeback that
    // stalls the synced log appends.
    opts.set_bytes_per_sync(1 << 20);
    // One budget for the memtables of every column family. Without it each of the dozen
    // fills up to two 64 MiB memtables before flushing, and a node's memory grows with the
    // number of column families written to (RSS rose by some 150 MB from 1M to 10M stored jobs
    // on a three-node cluster) instead of staying flat.
    // Not the same on every node: see `memtable_budget`.
    opts.set_db_write_buffer_size(memtable_budget(node));
    // The unit tests count WAL syncs (see `wal_syncs`); statistics cost every write a little.
    #[cfg(test)]
    opts.enable_statistics();

    // The state machine's column families share one block cache of RocksDB's default size, as
    // they shared RocksDB's own default one when their options were copies of one (a copy
    // shares the table factory, and a factory makes its default cache once).
    let cache = Cache::new_lru_cache(SM_BLOCK_CACHE);
    let hinted = Options::default().get_options_from_string(INSERT_HINTS)?;
    let sm_opts = |bloom: bool| {
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);
        if bloom {
            table.set_bloom_filter(10.0, false);
        }
        let mut sm_opts = hinted.clone();
        sm_opts.set_compression_type(DBCompressionType::Lz4);
        sm_opts.set_block_based_table_factory(&table);
        sm_opts
    };

    let mut cfs = vec![
        ColumnFamilyDescriptor::new(CF_LOG, Options::default()),
        ColumnFamilyDescriptor::new(CF_RAFT_META, Options::default()),
    ];
    // Job records are read by key on every reserve, ack and tick. A backlog consumed long after
    // it was published sits in SST files, and without a filter every lookup searches the index
    // and a block of every overlapping level-0 file it is not in; a bloom filter (10 bits per
    // key, about 1 % false positives, 1.25 bytes per stored job) lets it skip those. The other
    // column families are scanned or rarely read by key.
    cfs.extend(
        Cf::ALL.iter().map(|cf| ColumnFamilyDescriptor::new(cf.name(), sm_opts(*cf == Cf::Jobs))),
    );
    let db = Db::open_cf_descriptors(&opts, path, cfs)?;
    // The pool's threads exist once a database is open: `increase_parallelism` above sized
    // the pool, and RocksDB started and named its threads then, on this thread. RocksDB leaves
    // their priority alone after that: it changes a pool thread's priority only when asked to
    // lower the whole pool, which nothing here does.
    lower_compaction_threads();
    Ok(db)
}

/// RocksDB's background jobs for a host with `cores`: one more than the cores, which allows
/// two compactions at a time on two cores once compactions are behind (see `open_with_jobs`).
const fn background_jobs(cores: usize) -> usize {
    cores.saturating_add(1)
}

/// How far below the node's own CPU priority compactions run, in steps of nice: nice 10 for
/// a node at the default 0, at most 19 (see `open`).
pub(crate) const COMPACTION_NICE_STEPS: i32 = 10;

/// Puts RocksDB's compaction threads (its process-wide `rocksdb:low` pool, which every
/// database of the process shares) [`COMPACTION_NICE_STEPS`] below the process's priority.
/// Lowering a thread's priority needs no privilege. A thread that cannot be lowered keeps its
/// priority, which is only logged: the node works as before, with compactions competing on
/// equal terms.
fn lower_compaction_threads() {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpid, getpriority_process, setpriority_process};
        let own = getpriority_process(Some(getpid())).unwrap_or(0);
        let nice = (own + COMPACTION_NICE_STEPS).min(19);
        let threads = crate::threads_named("rocksdb:low").unwrap_or_default();
        // RocksDB names its pool threads only where the C library lets it (glibc): elsewhere
        // nothing matches, and compactions would silently keep the node's priority.
        if threads.is_empty() {
            tracing::warn!(
                "no RocksDB compaction thread found: compactions keep the node's priority"
            );
        }
        for tid in threads {
            if let Err(e) = setpriority_process(Some(tid), nice) {
                tracing::warn!(error = %e, "cannot lower a compaction thread's CPU priority");
            }
        }
    }
}

/// Looks up a column family handle by name.
pub(crate) fn cf<'a>(db: &'a Db, name: &'static str) -> Result<&'a ColumnFamily, StoreError> {
    db.cf_handle(name).ok_or(StoreError::MissingColumnFamily(name))
}

/// Write options for everything Raft relies on surviving a crash: the call returns only once
/// the WAL (and with it every earlier write of any column family) is on disk.
pub(crate) fn synced() -> WriteOptions {
    let mut wo = WriteOptions::default();
    wo.set_sync(true);
    wo
}

/// Write options for the state machine's applied batches: not in the WAL.
///
/// The Raft log is the state machine's write-ahead log: an applied batch is a function of log
/// entries that are already synced, and it carries `raft/last_applied` with it. Losing the
/// batch in a crash (with every later one: see `set_atomic_flush` in [`open`]) only sends
/// openraft back to re-apply those entries. Written to the WAL as well, every job's body and
/// record would be written and fsynced twice: once in the log entry, once in its state.
pub(crate) fn unlogged() -> WriteOptions {
    let mut wo = WriteOptions::default();
    wo.disable_wal(true);
    wo
}

/// Writes the state machine's memtables to disk, every column family at the same applied
/// batch, and returns once that is durable: from then on a crash cannot take the state (and
/// `raft/last_applied`) back before the batch applied last. Called before the log may be
/// purged, i.e. before a snapshot is made current (openraft purges only entries a snapshot
/// covers).
pub(crate) fn flush_state(db: &Db) -> Result<(), StoreError> {
    let handles = Cf::ALL.iter().map(|c| cf(db, c.name())).collect::<Result<Vec<_>, _>>()?;
    let mut opts = FlushOptions::default();
    opts.set_wait(true);
    Ok(db.flush_cfs_opt(&handles, &opts)?)
}

/// Reads and decodes one value.
pub(crate) fn get_decoded<T: DeserializeOwned>(
    db: &Db,
    cf_name: &'static str,
    key: &[u8],
) -> Result<Option<T>, StoreError> {
    match db.get_pinned_cf(cf(db, cf_name)?, key)? {
        Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
        None => Ok(None),
    }
}

/// A log index as a key: big-endian, so that keys sort like indexes.
pub(crate) fn log_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// A [`KvRead`] over the state machine's column families, reading either the live database
/// or one RocksDB snapshot (a consistent point-in-time view).
///
/// The live form is what `apply` layers its overlay on: apply is the only writer, so its reads
/// are consistent without a snapshot. The snapshot form is what queries and snapshot building
/// use, since they run while apply keeps writing.
pub struct ReadView<'a> {
    db: &'a Db,
    snapshot: Option<SnapshotWithThreadMode<'a, Db>>,
}

impl<'a> ReadView<'a> {
    /// A view of the live database.
    pub(crate) fn live(db: &'a Db) -> Self {
        ReadView { db, snapshot: None }
    }

    /// A view of the database as it is now, unaffected by later writes.
    pub(crate) fn snapshot(db: &'a Db) -> Self {
        ReadView { db, snapshot: Some(db.snapshot()) }
    }

    /// The last log id applied to the state this view shows.
    pub fn last_applied(&self) -> Result<Option<crate::LogId>, StoreError> {
        match self.get(Cf::Meta, SM_LAST_APPLIED)? {
            Some(bytes) => Ok(codec::decode(&bytes)?),
            None => Ok(None),
        }
    }

    fn read_options(&self) -> ReadOptions {
        let mut ro = ReadOptions::default();
        if let Some(snapshot) = &self.snapshot {
            ro.set_snapshot(snapshot);
        }
        ro
    }

    /// Visits every entry of a column family in key order, including the store's reserved
    /// keys, stopping early when `visit` returns `Ok(false)`.
    pub(crate) fn for_each(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        mut visit: impl FnMut(&[u8], &[u8]) -> Result<bool, StoreError>,
    ) -> Result<(), StoreError> {
        let handle = crate::db::cf(self.db, cf.name())?;
        let mut ro = self.read_options();
        if !from.is_empty() {
            ro.set_iterate_lower_bound(from);
        }
        if !to.is_empty() {
            ro.set_iterate_upper_bound(to);
        }
        let mut it = self.db.raw_iterator_cf_opt(handle, ro);
        it.seek_to_first();
        while let Some((key, value)) = it.item() {
            if !visit(key, value)? {
                return Ok(());
            }
            it.next();
        }
        Ok(it.status()?)
    }
}

fn kv_err(e: StoreError) -> KvError {
    KvError(e.to_string())
}

impl KvRead for ReadView<'_> {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        let handle = crate::db::cf(self.db, cf.name()).map_err(kv_err)?;
        let value = match &self.snapshot {
            Some(snapshot) => snapshot.get_cf(handle, key),
            None => self.db.get_cf(handle, key),
        };
        value.map_err(|e| kv_err(e.into()))
    }

    fn scan(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), KvError> {
        self.for_each(cf, from, to, |k, v| Ok(visit(k, v))).map_err(kv_err)
    }
}

/// How much space the database takes, as RocksDB reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StorageSizes {
    /// Live SST files of every column family.
    pub sst_bytes: u64,
    /// Memtables (active, unflushed immutable and pinned) of every column family.
    pub memtable_bytes: u64,
    /// WAL files in the database directory.
    pub wal_bytes: u64,
    /// Memory, not disk: what the open SST files' readers hold outside the block cache (their
    /// index and filter blocks, `rocksdb.estimate-table-readers-mem`), every column family.
    /// It grows with the number of stored keys.
    pub table_readers_bytes: u64,
    /// Memory, not disk: what the state machine's shared block cache holds
    /// (`rocksdb.block-cache-usage`), at most its capacity.
    pub block_cache_bytes: u64,
}

/// Reads [`StorageSizes`]: RocksDB properties summed over the column families, and a listing
/// of the WAL files (RocksDB has no property for their size).
pub(crate) fn sizes(db: &Db) -> Result<StorageSizes, StoreError> {
    let mut sizes = StorageSizes::default();
    for name in every_cf_name() {
        let handle = cf(db, name)?;
        let int = |p| db.property_int_value_cf(handle, p).map(Option::unwrap_or_default);
        sizes.sst_bytes += int(rocksdb::properties::TOTAL_SST_FILES_SIZE)?;
        sizes.memtable_bytes += int(rocksdb::properties::CUR_SIZE_ALL_MEM_TABLES)?;
        sizes.table_readers_bytes += int(rocksdb::properties::ESTIMATE_TABLE_READERS_MEM)?;
    }
    // One cache behind every state machine column family: read through any one of them.
    let jobs = cf(db, Cf::Jobs.name())?;
    sizes.block_cache_bytes =
        db.property_int_value_cf(jobs, rocksdb::properties::BLOCK_CACHE_USAGE)?.unwrap_or_default();
    let dir = db.path();
    let entries =
        std::fs::read_dir(dir).map_err(|e| StoreError::io(format!("list {}", dir.display()), e))?;
    for entry in entries.flatten() {
        // WAL files are `<number>.log`; RocksDB's info log is `LOG`, without the extension.
        if entry.path().extension().is_some_and(|e| e == "log") {
            sizes.wal_bytes += entry.metadata().map_or(0, |m| m.len());
        }
    }
    Ok(sizes)
}

/// Every column family of the database: the emptied log's, the metadata's and the state
/// machine's.
fn every_cf_name() -> impl Iterator<Item = &'static str> {
    [CF_LOG, CF_RAFT_META].into_iter().chain(Cf::ALL.iter().map(|cf| cf.name()))
}

/// How RocksDB has held back this node's writes since the database was opened, as it
/// reports it. A stopped write waits in RocksDB until a flush or a compaction catches up, and
/// the client's request meanwhile runs into its deadline (503 "not committed within …").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteStalls {
    /// Every write of the node is stopped right now (`rocksdb.is-write-stopped`).
    pub stopped: bool,
    /// Times RocksDB found a limit reached that stops writes: a column family with as many
    /// unflushed memtables as it may hold, or level 0 with as many files. It checks a column
    /// family after each of its flushes, compactions and memtable switches and counts per
    /// column family; with atomic flushes one stop is found in every column family holding
    /// data, so this is the largest count of any one (a sum would count one stop a dozen
    /// times), and a stop that lasts across several checks counts once for each.
    pub stops: u64,
    /// Times it found a limit reached that slows writes down (level 0's files or the
    /// compactions' backlog over their soft limits), counted the same way.
    pub delays: u64,
}

/// Reads [`WriteStalls`]: the largest of RocksDB's write-stall counts over the column
/// families and the database's own (stops for the shared memtable budget, which stays 0 while
/// that budget only triggers flushes, as `open` sets it).
pub(crate) fn write_stalls(db: &Db) -> Result<WriteStalls, StoreError> {
    let stopped = db.property_int_value(rocksdb::properties::IS_WRITE_STOPPED)?.unwrap_or(0) != 0;
    let mut stalls = WriteStalls { stopped, ..WriteStalls::default() };
    // The database's own count has no totals: its one cause is the shared memtable budget.
    let text = db.property_value(DB_WRITE_STALL_STATS)?.unwrap_or_default();
    stalls.stops = stall_count(&text, "write-buffer-manager-limit-stops").unwrap_or(0);
    for name in every_cf_name() {
        let text = db.property_value_cf(cf(db, name)?, CF_WRITE_STALL_STATS)?.unwrap_or_default();
        // Each count only grows, so their largest does too: a counter can follow it.
        stalls.stops = stalls.stops.max(stall_count(&text, "total-stops").unwrap_or(0));
        stalls.delays = stalls.delays.max(stall_count(&text, "total-delays").unwrap_or(0));
    }
    Ok(stalls)
}

/// RocksDB's flushes and compactions on this node at one moment: those running, and the
/// column families with one due that has not started. A node whose load stopped a moment ago
/// is still paying for it until all four are zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackgroundWork {
    /// Flushes running (`rocksdb.num-running-flushes`).
    pub flushes_running: u64,
    /// Compactions running (`rocksdb.num-running-compactions`).
    pub compactions_running: u64,
    /// Column families with a flush due, waiting for a thread (`rocksdb.mem-table-flush-pending`).
    pub flushes_pending: u64,
    /// Column families whose levels call for a compaction not yet started
    /// (`rocksdb.compaction-pending`).
    pub compactions_pending: u64,
}

impl BackgroundWork {
    /// Nothing running and nothing due.
    pub fn is_idle(&self) -> bool {
        *self == BackgroundWork::default()
    }
}

/// Reads [`BackgroundWork`]: the two running counts are the database's, the pending ones are
/// counted over the column families.
pub(crate) fn background_work(db: &Db) -> Result<BackgroundWork, StoreError> {
    use rocksdb::properties::{
        COMPACTION_PENDING, MEM_TABLE_FLUSH_PENDING, NUM_RUNNING_COMPACTIONS, NUM_RUNNING_FLUSHES,
    };
    let mut work = BackgroundWork {
        flushes_running: db.property_int_value(NUM_RUNNING_FLUSHES)?.unwrap_or(0),
        compactions_running: db.property_int_value(NUM_RUNNING_COMPACTIONS)?.unwrap_or(0),
        ..BackgroundWork::default()
    };
    for name in every_cf_name() {
        let handle = cf(db, name)?;
        let due = |p| db.property_int_value_cf(handle, p).map(|v| u64::from(v.unwrap_or(0) > 0));
        work.flushes_pending += due(MEM_TABLE_FLUSH_PENDING)?;
        work.compactions_pending += due(COMPACTION_PENDING)?;
    }
    Ok(work)
}

/// The write-stall properties; the string forms, which the C API gives (the map forms it
/// does not).
const CF_WRITE_STALL_STATS: &str = "rocksdb.cf-write-stall-stats";
const DB_WRITE_STALL_STATS: &str = "rocksdb.db-write-stall-stats";

/// One count out of a write-stall property's text, which RocksDB writes as
/// `Write Stall (count): name: n, name: n, …`; `None` when `name` is not in it.
fn stall_count(text: &str, name: &str) -> Option<u64> {
    let list = text.split_once("): ").map_or(text, |(_, list)| list);
    list.split(',').find_map(|pair| {
        let (key, value) = pair.split_once(':')?;
        (key.trim() == name).then(|| value.trim().parse().ok()).flatten()
    })
}

/// How many times RocksDB synced the WAL, by synced writes and by `SyncWAL` alike (its
/// `rocksdb.wal.synced` ticker; statistics are on in this crate's unit tests only).
#[cfg(test)]
pub(crate) fn wal_syncs(db: &Db) -> u64 {
    let stats = db.property_value("rocksdb.options-statistics").expect("stats").expect("on");
    let line = stats.lines().find(|l| l.starts_with("rocksdb.wal.synced ")).expect("ticker");
    // "rocksdb.wal.synced COUNT : 3"
    line.rsplit(' ').next().and_then(|n| n.parse().ok()).expect("count")
}

#[cfg(test)]
mod tests {
    use rocksdb::WriteBatch;

    use super::*;

    fn collect(view: &ReadView<'_>, cf: Cf, from: &[u8], to: &[u8]) -> Vec<Vec<u8>> {
        let mut keys = Vec::new();
        view.scan(cf, from, to, &mut |k, _| {
            keys.push(k.to_vec());
            true
        })
        .expect("scan");
        keys
    }

    fn put(db: &Db, cf_: Cf, keys: &[&[u8]]) {
        let mut batch = WriteBatch::default();
        for k in keys {
            batch.put_cf(cf(db, cf_.name()).expect("cf"), k, b"v");
        }
        db.write(batch).expect("write");
    }

    /// Jobs flushed to a table file: its reader holds the table's index and bloom filter
    /// outside the block cache, and a read by key brings a data block into the cache. Both
    /// are reported with the disk sizes.
    #[test]
    fn sizes_report_table_readers_and_the_block_cache() {
        let dir = tempfile::tempdir().expect("dir");
        let db = open(dir.path(), None).expect("open");
        let before = sizes(&db).expect("sizes");
        assert_eq!((before.sst_bytes, before.table_readers_bytes), (0, 0));
        let keys: Vec<Vec<u8>> = (0u32..2000).map(|i| i.to_be_bytes().to_vec()).collect();
        put(&db, Cf::Jobs, &keys.iter().map(Vec::as_slice).collect::<Vec<_>>());
        flush_state(&db).expect("flush");
        let jobs = cf(&db, Cf::Jobs.name()).expect("cf");
        assert!(db.get_cf(jobs, &keys[1000]).expect("get").is_some());
        let after = sizes(&db).expect("sizes");
        assert!(after.sst_bytes > 0, "{after:?}");
        assert!(after.table_readers_bytes > 0, "{after:?}");
        assert!(after.block_cache_bytes > 0, "{after:?}");
        assert!(after.block_cache_bytes <= SM_BLOCK_CACHE as u64, "{after:?}");
    }

    /// The options RocksDB records it runs with, from the newest `OPTIONS-*` file of a store
    /// opened in `dir`.
    fn recorded_options(dir: &Path) -> String {
        recorded_options_of(dir, None)
    }

    /// [`recorded_options`] of a store opened for `node`.
    fn recorded_options_of(dir: &Path, node: Option<u64>) -> String {
        drop(open(dir, node).expect("open"));
        let options = std::fs::read_dir(dir)
            .expect("list")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("OPTIONS-")))
            .max()
            .expect("an OPTIONS file");
        std::fs::read_to_string(options).expect("read")
    }

    /// The memtables of all column families share one budget: the plain one for a store
    /// opened without a node id, a node's own for a node's.
    #[test]
    fn every_column_family_shares_one_memtable_budget() {
        for (node, want) in [(None, MEMTABLE_BUDGET), (Some(3), 164 << 20)] {
            let dir = tempfile::tempdir().expect("dir");
            let text = recorded_options_of(dir.path(), node);
            let line = format!("db_write_buffer_size={want}");
            assert!(text.lines().any(|l| l.trim() == line), "{line} not in the options");
        }
    }

    /// RocksDB's own text of a write-stall property is read: both totals are found, and a
    /// name that is only part of another's is not taken for it.
    #[test]
    fn stall_counts_are_read_from_rocksdbs_text() {
        let dir = tempfile::tempdir().expect("dir");
        let db = open(dir.path(), None).expect("open");
        let jobs = cf(&db, Cf::Jobs.name()).expect("cf");
        let text = db.property_value_cf(jobs, CF_WRITE_STALL_STATS).expect("read").expect("some");
        assert_eq!(stall_count(&text, "total-stops"), Some(0), "{text}");
        assert_eq!(stall_count(&text, "total-delays"), Some(0), "{text}");
        assert_eq!(stall_count(&text, "stops"), None, "{text}");
        let db_text = db.property_value(DB_WRITE_STALL_STATS).expect("read").expect("some");
        assert_eq!(stall_count(&db_text, "write-buffer-manager-limit-stops"), Some(0), "{db_text}");
        let made =
            "Write Stall (count): memtable-limit-stops: 4, total-delays: 2, total-stops: 7\n";
        assert_eq!(stall_count(made, "total-stops"), Some(7));
        assert_eq!(stall_count(made, "total-delays"), Some(2));
    }

    /// A write stop is seen while it lasts and counted after it, once however many column
    /// families it holds back: level 0's limits of two column families are lowered below the
    /// three files each holds, then set back. No write is made meanwhile: it would wait for
    /// the stop to end. (RocksDB enforces level 0's limits only with automatic compactions on;
    /// the compaction trigger is raised so that none starts.)
    #[test]
    fn a_write_stop_is_seen_while_it_lasts_and_counted_after_it() {
        let dir = tempfile::tempdir().expect("dir");
        let db = open(dir.path(), None).expect("open");
        assert_eq!(write_stalls(&db).expect("read"), WriteStalls::default());
        let families = [Cf::Jobs, Cf::Timers].map(|c| cf(&db, c.name()).expect("cf"));
        for key in [b"a", b"b", b"c"] {
            put(&db, Cf::Jobs, &[key]);
            put(&db, Cf::Timers, &[key]);
            for family in families {
                db.flush_cf(family).expect("flush");
            }
        }
        let level0 = |compact: &str, slowdown: &str, stop: &str| {
            let options = [
                ("level0_file_num_compaction_trigger", compact),
                ("level0_slowdown_writes_trigger", slowdown),
                ("level0_stop_writes_trigger", stop),
            ];
            for family in families {
                db.set_options_cf(family, &options).expect("set");
            }
        };
        level0("10", "2", "3");
        let during = write_stalls(&db).expect("read");
        assert!(during.stopped, "{during:?}");
        // Each column family counted the stop once (a sum would read 2).
        assert_eq!(during.stops, 1, "{during:?}");
        level0("4", "20", "36");
        let after = write_stalls(&db).expect("read");
        assert!(!after.stopped, "{after:?}");
        assert_eq!(after.stops, during.stops, "{after:?} after {during:?}");
    }

    /// Two column families compact at the same time once compactions are behind: each gets
    /// eight overlapping level-0 files of incompressible data with compactions off (RocksDB
    /// runs a second compaction only from eight files, twice the trigger), then compactions
    /// are turned back on for both, and RocksDB's count of running compactions is watched until
    /// both are done, with the background jobs of a two-core host. With one job per core, as
    /// before, it never passes 1. The
    /// compaction pool is shared by every database of the process, so other tests'
    /// compactions can take its threads for a moment: a few attempts are allowed, and any that
    /// sees two at once is enough.
    #[test]
    fn two_column_families_compact_at_the_same_time() {
        let mut most = 0;
        for attempt in 0..5u64 {
            let dir = tempfile::tempdir().expect("dir");
            let db = open_with_jobs(dir.path(), None, background_jobs(2)).expect("open");
            let families = [Cf::Jobs, Cf::Members].map(|c| cf(&db, c.name()).expect("cf"));
            for family in families {
                db.set_options_cf(family, &[("disable_auto_compactions", "true")]).expect("set");
            }
            for file in 0..8u64 {
                for family in families {
                    overlapping_level0_file(&db, family, (attempt << 48) ^ (file << 32));
                }
            }
            let level0 = |family| level0_files(&db, family);
            assert!(families.iter().all(|f| level0(*f) == 8), "eight level-0 files each");
            for family in families {
                db.set_options_cf(family, &[("disable_auto_compactions", "false")]).expect("set");
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while families.iter().any(|f| level0(*f) > 0) {
                assert!(std::time::Instant::now() < deadline, "level 0 not compacted in 60 s");
                most = most.max(background_work(&db).expect("read").compactions_running);
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            if most >= 2 {
                return;
            }
        }
        panic!("never more than {most} compaction at a time");
    }

    /// Writes 2,048 values of 1 KiB that LZ4 cannot shrink under the same keys every time
    /// and flushes them to a level-0 file of their own: files that overlap, so a compaction
    /// must merge them (files that do not overlap can be moved down unrewritten), and has real
    /// work to do.
    fn overlapping_level0_file(db: &Db, family: &ColumnFamily, seed: u64) {
        let mut batch = WriteBatch::default();
        for key in 0..2048u64 {
            // xorshift, seeded per key.
            let mut x = (seed ^ key) | 1;
            let value: Vec<u8> = (0..1024)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            batch.put_cf(family, key.to_be_bytes(), value);
        }
        db.write(batch).expect("write");
        db.flush_cf(family).expect("flush");
    }

    fn level0_files(db: &Db, family: &ColumnFamily) -> u64 {
        db.property_int_value_cf(family, "rocksdb.num-files-at-level0")
            .expect("property")
            .expect("level 0's file count")
    }

    /// A compaction shows as background work from the moment it is due, while it runs, and
    /// then nothing does: eight overlapping level-0 files wait with compactions off (due, but
    /// not started), compactions are turned back on, and the work is read until it is idle.
    #[test]
    fn background_work_is_seen_until_compactions_are_done() {
        let dir = tempfile::tempdir().expect("dir");
        let db = open(dir.path(), None).expect("open");
        assert!(background_work(&db).expect("read").is_idle(), "a new database has no work");
        let jobs = cf(&db, Cf::Jobs.name()).expect("cf");
        db.set_options_cf(jobs, &[("disable_auto_compactions", "true")]).expect("set");
        for file in 0..8u64 {
            overlapping_level0_file(&db, jobs, file << 32);
        }
        assert_eq!(level0_files(&db, jobs), 8);
        let due = background_work(&db).expect("read");
        assert_eq!((due.compactions_pending, due.compactions_running), (1, 0), "{due:?}");
        db.set_options_cf(jobs, &[("disable_auto_compactions", "false")]).expect("set");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut most_running = 0;
        loop {
            let work = background_work(&db).expect("read");
            most_running = most_running.max(work.compactions_running);
            if work.is_idle() {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "still busy after 60 s: {work:?}");
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        assert!(most_running >= 1, "the compaction was never seen running");
        assert!(level0_files(&db, jobs) < 8, "idle before level 0 was compacted");
    }

    /// Nodes 1 to 4 flush at budgets a step apart; ids further on take the same steps again.
    #[test]
    fn neighbouring_nodes_have_memtable_budgets_a_step_apart() {
        let budgets: Vec<usize> = (1..=8).map(|id| memtable_budget(Some(id)) >> 20).collect();
        assert_eq!(budgets, [140, 152, 164, 128, 140, 152, 164, 128]);
        assert_eq!(memtable_budget(None), MEMTABLE_BUDGET);
    }

    /// Every state-machine column family, and only those, starts its inserts from the place
    /// remembered for the key's prefix ([`INSERT_HINTS`]): RocksDB took the option from the
    /// string and runs with it.
    #[test]
    fn the_state_machines_memtables_insert_with_hints() {
        let dir = tempfile::tempdir().expect("dir");
        let text = recorded_options(dir.path());
        let mut hinted = Vec::new();
        let mut section = String::new();
        for line in text.lines().map(str::trim) {
            if let Some(name) = line.strip_prefix("[CFOptions \"") {
                section = name.trim_end_matches("\"]").to_string();
            } else if line == INSERT_HINTS {
                hinted.push(section.clone());
            }
        }
        let mut expected: Vec<String> = Cf::ALL.iter().map(|cf| cf.name().to_string()).collect();
        hinted.sort();
        expected.sort();
        assert_eq!(hinted, expected, "column families with {INSERT_HINTS}");
    }

    /// Compactions run [`COMPACTION_NICE_STEPS`] below the process's CPU priority (at most
    /// nice 19) and flushes at it: once a flush and a compaction are done (so that RocksDB has
    /// had every chance to set a thread's priority itself), the flush threads are at the nice
    /// value the test runs at and every compaction thread that many steps below.
    #[cfg(target_os = "linux")]
    #[test]
    fn compactions_run_ten_steps_below_the_process_and_flushes_at_its_priority() {
        let dir = tempfile::tempdir().expect("dir");
        let db = open(dir.path(), None).expect("open");
        let jobs = cf(&db, Cf::Jobs.name()).expect("cf");
        for key in [b"a", b"b"] {
            put(&db, Cf::Jobs, &[key]);
            db.flush_cf(jobs).expect("flush");
        }
        db.compact_range_cf(jobs, None::<&[u8]>, None::<&[u8]>);
        let process = rustix::process::getpriority_process(Some(rustix::process::getpid()))
            .expect("priority");
        assert!(process < 19, "the tests run at nice 19: compactions could not be told apart");
        let normal = crate::tests::own_nice();
        let flushers = crate::tests::nice_of("rocksdb:high");
        assert!(!flushers.is_empty(), "no flush thread found");
        assert!(flushers.iter().all(|n| *n == normal), "flush threads' nice values: {flushers:?}");
        let compactors = crate::tests::nice_of("rocksdb:low");
        assert!(!compactors.is_empty(), "no compaction thread found");
        let lowered = (process + COMPACTION_NICE_STEPS).min(19);
        assert!(
            compactors.iter().all(|n| *n == lowered),
            "compaction threads' nice values: {compactors:?}"
        );
    }

    #[test]
    fn scan_bounds_are_half_open_and_per_column_family() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = open(dir.path(), None).expect("open");
        put(&db, Cf::Ready, &[b"", b"a", b"b", b"b\0", b"c", b"d\xff"]);
        put(&db, Cf::Jobs, &[b"a", b"z"]);
        put(&db, Cf::Timers, &[b"b"]);
        let view = ReadView::live(&db);

        let all = collect(&view, Cf::Ready, b"", b"");
        assert_eq!(all, [&b""[..], b"a", b"b", b"b\0", b"c", b"d\xff"]);
        assert_eq!(collect(&view, Cf::Ready, b"b", b"c"), [&b"b"[..], b"b\0"]);
        assert_eq!(collect(&view, Cf::Ready, b"b\0", b""), [&b"b\0"[..], b"c", b"d\xff"]);
        assert_eq!(collect(&view, Cf::Ready, b"", b"a"), [&b""[..]]);
        assert!(collect(&view, Cf::Ready, b"e", b"").is_empty());
        assert!(collect(&view, Cf::Ready, b"c", b"c").is_empty());
        // Neighbouring column families never leak into a scan.
        assert_eq!(collect(&view, Cf::Jobs, b"", b""), [&b"a"[..], b"z"]);
        assert_eq!(collect(&view, Cf::Timers, b"", b""), [&b"b"[..]]);

        let mut first_two = Vec::new();
        view.scan(Cf::Ready, b"", b"", &mut |k, _| {
            first_two.push(k.to_vec());
            first_two.len() < 2
        })
        .expect("scan");
        assert_eq!(first_two, [&b""[..], b"a"]);

        assert_eq!(view.get(Cf::Ready, b"b\0").expect("get"), Some(b"v".to_vec()));
        assert_eq!(view.get(Cf::Jobs, b"b").expect("get"), None);
    }

    #[test]
    fn snapshot_view_ignores_later_writes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = open(dir.path(), None).expect("open");
        put(&db, Cf::Jobs, &[b"a"]);
        let view = ReadView::snapshot(&db);
        put(&db, Cf::Jobs, &[b"b"]);
        db.delete_cf(cf(&db, Cf::Jobs.name()).expect("cf"), b"a").expect("delete");

        assert_eq!(collect(&view, Cf::Jobs, b"", b""), [&b"a"[..]]);
        assert_eq!(view.get(Cf::Jobs, b"a").expect("get"), Some(b"v".to_vec()));
        assert_eq!(view.get(Cf::Jobs, b"b").expect("get"), None);
        assert_eq!(collect(&ReadView::live(&db), Cf::Jobs, b"", b""), [&b"b"[..]]);
    }
}
