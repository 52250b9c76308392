//! The Raft log's own files: the `raft-log` crate's chunked write-ahead log, typed for delayd.
//!
//! The log, the vote and the commit index live in `<data_dir>/log/`, in append-only chunk
//! files (`r-<offset>.wal`) of checksummed records: an append, a vote, a commit index, a
//! truncation, a purge, and at the head of every chunk the state they add up to. One worker
//! thread writes and `fdatasync`s each write the store hands it, then completes its callback
//! ([`FLUSH_BATCH_WAIT`] says why one fsync per write); a purge deletes whole chunks once its
//! record is synced.
//! On opening, the chunks are replayed into an index of every entry's place, and a torn
//! record at the tail (a crash mid-write) is cut off.
//!
//! Why not RocksDB, where the log was before: every entry was written to RocksDB's WAL, then
//! inserted into a memtable, flushed into a table file and compacted, only to be deleted once
//! a snapshot covered it. That was a third or more of the bytes RocksDB wrote to table files
//! under load, it took memtable space from the state machine (whose flushes are the costly
//! ones), and a flush of any column family flushed all of them. Here an entry is written once.
//!
//! Stored values: log ids and votes in [`delayd_core::codec`]'s encoding, each behind a
//! length; an entry as the bytes [`LogStore`](crate::LogStore) stores for it (the codec's
//! version byte, then the entry's postcard encoding) behind a length, LZ4-compressed when
//! that saves an eighth or more ([`StoredEntry`]).

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use delayd_core::codec;
use openraft::storage::IOFlushed;
use prometheus::Histogram;
use raft_log::codeq::{Decode, Encode};
use raft_log::RaftLog;

use crate::error::StoreError;
use crate::recent::Encoded;
use crate::{LogId, TypeConfig, Vote};

/// The directory of the log's chunk files, beside the RocksDB directory.
pub(crate) const DIR: &str = "log";

/// A chunk is closed, and a new one started, at this size on disk. Entries of the open chunk
/// stay in memory, decompressed, whatever [`CACHE_BYTES`] says, and purges delete whole
/// closed chunks, so this bounds both what the open chunk holds in memory and what a purge
/// leaves on disk. Small because entries compress: 100-byte bodies of one repeated letter
/// (the benchmarks') shrink about tenfold (a node's `log/` held 15 bytes a bulk-published job
/// against 156 uncompressed), and with 16 MiB chunks a node's RSS at a million stored jobs was
/// 569 MB against 302, most of it likely the open chunk's entries, decompressed.
const CHUNK_BYTES: usize = 2 << 20;

/// Most bytes of entries the log keeps in memory once their chunk is closed and synced. The
/// window of recent entries (`recent.rs`) serves almost every read; this covers a follower a
/// few seconds behind without reading the files.
const CACHE_BYTES: usize = 16 << 20;

/// The buffer that reads a chunk when it is replayed on opening.
const READ_BUFFER_BYTES: usize = 1 << 20;

/// How long the flush worker waits, after taking a write, for more to share its fsync. Not at
/// all: each write handed over gets an fsync of its own, which then covers everything the
/// write carries (an append's entries, and a commit index or anything else written since the
/// last one). A wait would be added to every commit, and a node has one append at a time to
/// sync: a leader proposes one entry at a time, and a follower gets the next one once the
/// leader committed this one.
const FLUSH_BATCH_WAIT: std::time::Duration = std::time::Duration::ZERO;

/// The types the `raft-log` crate stores for delayd.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct LogTypes;

impl raft_log::Types for LogTypes {
    type LogId = StoredLogId;
    type LogPayload = StoredEntry;
    type Vote = StoredVote;
    type Callback = Flushed;
    type UserData = ();

    fn log_index(log_id: &StoredLogId) -> u64 {
        log_id.0.index
    }

    fn payload_size(payload: &StoredEntry) -> u64 {
        payload.0.len() as u64
    }
}

/// The log as the store keeps it open.
pub(crate) type Wal = RaftLog<LogTypes>;

/// A value kept in [`delayd_core::codec`]'s encoding behind a length (codeq's byte-string
/// layout), ordered as the value is: log ids as openraft orders them (by leader, then
/// index), votes as openraft compares them (a vote is only ever replaced by a greater one).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Coded<T>(pub(crate) T);

/// A log id as the log keeps it.
pub(crate) type StoredLogId = Coded<LogId>;

/// A vote as the log keeps it.
pub(crate) type StoredVote = Coded<Vote>;

/// An entry's stored bytes, shared with the window of recent entries and the replication
/// requests that carry them.
///
/// On disk the bytes are compressed with LZ4 (a block, its size before it) when they are at
/// least [`COMPRESS_FROM_BYTES`] long and shrink by an eighth or more, and then follow a
/// [`COMPRESSED`] byte; otherwise they are written as they are, starting with the codec's
/// version byte, as logs written before compression were. Until a snapshot covers them the
/// log keeps every entry (up to `snapshot_logs` of them, however large), so this is most of
/// the log's disk: job bodies are usually text, and bulk publishes repeat a queue and
/// attributes in every command. Memory, the window and replication keep the plain bytes.
#[derive(Debug, Clone)]
pub(crate) struct StoredEntry(pub(crate) Encoded);

/// The first byte of a compressed entry: never a codec version byte, which counts up from 1.
const COMPRESSED: u8 = 0xC4;

/// Entries shorter than this are written as they are: too little to gain.
const COMPRESS_FROM_BYTES: usize = 128;

/// The most an entry may decompress to: above any entry the proposer makes (4 MiB of
/// commands, `max_entry_bytes`, plus their framing) and a bound on what a damaged size can
/// make a read allocate.
const MAX_ENTRY_BYTES: usize = 64 << 20;

impl<T: serde::Serialize> Encode for Coded<T> {
    fn encode<W: io::Write>(&self, w: W) -> io::Result<usize> {
        codec::encode(&self.0).encode(w)
    }
}

impl<T: serde::de::DeserializeOwned> Decode for Coded<T> {
    fn decode<R: io::Read>(r: R) -> io::Result<Self> {
        // codeq reads at most the length it finds; a corrupt length ends at the end of the
        // record and fails its checksum.
        let bytes = Vec::<u8>::decode(r)?;
        let value = codec::decode(&bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        Ok(Coded(value))
    }
}

impl Encode for StoredEntry {
    fn encode<W: io::Write>(&self, w: W) -> io::Result<usize> {
        let plain: &Vec<u8> = &self.0;
        // Compressed straight behind its marker and size (the layout of LZ4's
        // `compress_prepend_size`, which `uncompressed_size` reads), in one buffer: this runs
        // on the append path, under the log's lock.
        let size = u32::try_from(plain.len()).ok().filter(|_| plain.len() >= COMPRESS_FROM_BYTES);
        if let Some(size) = size {
            let mut stored = vec![0; 5 + lz4_flex::block::get_maximum_output_size(plain.len())];
            stored[0] = COMPRESSED;
            stored[1..5].copy_from_slice(&size.to_le_bytes());
            if let Ok(packed) = lz4_flex::block::compress_into(plain, &mut stored[5..]) {
                stored.truncate(5 + packed);
                // Everything included, an eighth or more smaller.
                if stored.len() < plain.len() - plain.len() / 8 {
                    return stored.encode(w);
                }
            }
        }
        plain.encode(w)
    }
}

impl Decode for StoredEntry {
    fn decode<R: io::Read>(r: R) -> io::Result<Self> {
        let stored = Vec::<u8>::decode(r)?;
        let Some((&COMPRESSED, packed)) = stored.split_first() else {
            return Ok(StoredEntry(Arc::new(stored)));
        };
        let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        let (size, block) = lz4_flex::block::uncompressed_size(packed)
            .map_err(|e| invalid(format!("a compressed log entry: {e}")))?;
        if size > MAX_ENTRY_BYTES {
            return Err(invalid(format!(
                "a compressed log entry claims {size} bytes, more than any entry ({MAX_ENTRY_BYTES})"
            )));
        }
        let plain = lz4_flex::block::decompress(block, size)
            .map_err(|e| invalid(format!("a compressed log entry: {e}")))?;
        Ok(StoredEntry(Arc::new(plain)))
    }
}

/// What the flush worker completes once a write is on disk (or failed).
pub(crate) enum Flushed {
    /// An openraft append: tell openraft, and record how long the append took.
    Append {
        /// When openraft called `append`.
        appended: Instant,
        callback: IOFlushed<TypeConfig>,
        seconds: Histogram,
    },
    /// A write an async caller awaits (a vote, a truncation, a purge).
    Awaited(tokio::sync::oneshot::Sender<io::Result<()>>),
    /// A write a blocking caller waits for (opening, importing, recovery).
    Blocking(std::sync::mpsc::SyncSender<io::Result<()>>),
}

impl raft_log::Callback for Flushed {
    fn send(self, res: io::Result<()>) {
        match self {
            Flushed::Append { appended, callback, seconds } => {
                seconds.observe(appended.elapsed().as_secs_f64());
                callback.io_completed(res);
            }
            // A receiver that is gone stopped waiting; the write stands either way.
            Flushed::Awaited(tx) => {
                let _ = tx.send(res);
            }
            // raft-log's own callback for a sync channel, which ignores a gone receiver too.
            Flushed::Blocking(tx) => raft_log::Callback::send(tx, res),
        }
    }
}

/// How large the log's chunks and its cache of closed chunks' entries are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    pub(crate) chunk_bytes: usize,
    pub(crate) cache_bytes: usize,
}

impl Sizes {
    /// What a node runs with: [`CHUNK_BYTES`] and [`CACHE_BYTES`].
    pub(crate) const DEFAULT: Sizes = Sizes { chunk_bytes: CHUNK_BYTES, cache_bytes: CACHE_BYTES };
}

/// Opens (creating if needed) the log in `dir`: replays its chunks and cuts off a torn tail.
pub(crate) fn open(dir: &Path, sizes: Sizes) -> Result<Wal, StoreError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| StoreError::io(format!("create {}", dir.display()), e))?;
    let mut config = raft_log::Config::new(dir.display());
    config.wal.chunk_max_size = Some(sizes.chunk_bytes);
    config.wal.read_buffer_size = Some(READ_BUFFER_BYTES);
    config.wal.flush_batch_wait = Some(FLUSH_BATCH_WAIT);
    config.log_cache_capacity = Some(sizes.cache_bytes);
    RaftLog::open(Arc::new(config))
        .map_err(|e| StoreError::io(format!("open the Raft log in {}", dir.display()), e))
}

/// Hands everything written so far to the flush worker and waits until it is on disk.
/// Blocking: for opening, importing and offline tools.
pub(crate) fn sync_blocking(wal: &mut Wal) -> Result<(), StoreError> {
    use raft_log::api::raft_log_writer::RaftLogWriter;
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    wal.flush(true, Some(Flushed::Blocking(tx))).map_err(|e| StoreError::io("sync the log", e))?;
    match rx.recv() {
        Ok(result) => result.map_err(|e| StoreError::io("sync the log", e)),
        Err(_) => Err(StoreError::Task("the log's flush worker stopped".into())),
    }
}

/// Bytes no compressor shrinks (random, from a fixed seed), for tests that need an entry
/// stored at its full size.
#[cfg(test)]
pub(crate) fn noise(n: usize) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut bytes = vec![0; n];
    rand::rngs::StdRng::seed_from_u64(0x9E37_79B9).fill_bytes(&mut bytes);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(entry: &StoredEntry) -> Vec<u8> {
        let mut out = Vec::new();
        entry.encode(&mut out).expect("encode into memory");
        out
    }

    fn read(bytes: &[u8]) -> io::Result<Vec<u8>> {
        StoredEntry::decode(bytes).map(|e| e.0.as_ref().clone())
    }

    /// An entry as the store makes them: the codec's version byte, then the encoding.
    fn entry(body: &[u8]) -> Vec<u8> {
        let mut e = vec![codec::VERSION];
        e.extend_from_slice(body);
        e
    }

    #[test]
    fn compressible_entries_are_stored_compressed_and_read_back_the_same() {
        let plain = entry(&b"{\"queue\":\"orders\",\"body\":\"xxxxxxxx\"}".repeat(40));
        let bytes = stored(&StoredEntry(Arc::new(plain.clone())));
        assert!(bytes.len() < plain.len() / 4, "{} of {} bytes", bytes.len(), plain.len());
        assert!(bytes.contains(&COMPRESSED));
        assert_eq!(read(&bytes).expect("decodes"), plain);
    }

    #[test]
    fn short_or_incompressible_entries_are_stored_as_they_were_before_compression() {
        for plain in [entry(&[7; 40]), entry(&noise(4096))] {
            let bytes = stored(&StoredEntry(Arc::new(plain.clone())));
            let mut as_before = Vec::new();
            plain.encode(&mut as_before).expect("encode into memory");
            assert_eq!(bytes, as_before, "{} bytes", plain.len());
            assert_eq!(read(&bytes).expect("decodes"), plain);
        }
    }

    #[test]
    fn a_damaged_compressed_entry_is_an_error() {
        let mut huge = vec![COMPRESSED];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&[0; 16]);
        let mut garbage = vec![COMPRESSED];
        garbage.extend_from_slice(&1000u32.to_le_bytes());
        garbage.extend_from_slice(&noise(64));
        for (damaged, says) in [(huge, "more than any entry"), (garbage, "compressed log entry")] {
            let mut bytes = Vec::new();
            damaged.encode(&mut bytes).expect("encode into memory");
            let err = read(&bytes).expect_err("refused");
            assert_eq!(err.kind(), io::ErrorKind::InvalidData);
            assert!(err.to_string().contains(says), "{err}");
        }
    }
}
