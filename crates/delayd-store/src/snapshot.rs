//! The snapshot file format and the snapshot directory.
//!
//! A snapshot is one file, written and read as a stream so that no snapshot is ever held in
//! memory:
//!
//! ```text
//! header   "DLYDSNAP" | format u8 (=2) | meta_len u32 | meta (codec: SnapshotMeta)
//!          | cf_count u8 | cf_count × (name_len u8 | name)
//! records  tag u8 (< cf_count: index into the header's names) | key_len u32 | key
//!          | value_len u32 | value
//! trailer  0xFF | record_count u64 | checksum u64
//! ```
//!
//! Integers are big-endian. The checksum covers every byte before it, so a truncated or
//! damaged file (a broken transfer, a torn write) is detected before an install touches the
//! state machine: in format 2, CRC-32 (IEEE) zero-extended to 64 bits; in format 1, which is
//! still read (backups taken by earlier versions), FNV-1a 64 (see
//! [`delayd_core::checksum::SnapshotChecksum`]). Column families are named in the header
//! rather than numbered by [`Cf::ALL`]'s order, so reordering that list does not change the
//! meaning of old files.
//! The records carry the application's data only: the store's own keys in [`Cf::Meta`]
//! (last applied, membership) are described by the header's meta.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use delayd_core::checksum::{self, SnapshotChecksum, SnapshotStart, SNAPSHOT_MAGIC};
use delayd_core::{codec, Cf};
use serde::{Deserialize, Serialize};

use crate::db::{ReadView, SM_RESERVED_PREFIX};
use crate::error::StoreError;

/// A snapshot's metadata as openraft sees it.
pub(crate) type Meta = crate::SnapshotMeta;

/// A snapshot file in the snapshot directory and what it contains; stored in `raft_meta` as
/// the current snapshot, and as the marker of an unfinished install.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SnapshotRecord {
    /// File name within the snapshot directory.
    pub(crate) file: String,
    /// What the file holds.
    pub(crate) meta: Meta,
}

/// One record of a snapshot: a key and its value in a column family.
pub(crate) type Record = (Cf, Vec<u8>, Vec<u8>);

/// The format written.
const FORMAT: u8 = checksum::SNAPSHOT_FORMAT;
const END: u8 = 0xFF;
/// The longest key or value a reader accepts: a bound on what a damaged length can make it
/// allocate, far above anything the state machine stores.
const MAX_FIELD_BYTES: u64 = 1 << 30;

/// A writer that hashes what passes through it.
struct HashWriter<W> {
    inner: W,
    hash: SnapshotChecksum,
}

impl<W: Write> Write for HashWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that hashes what passes through it.
struct HashReader<R> {
    inner: R,
    hash: SnapshotChecksum,
}

impl<R: Read> Read for HashReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

fn len_u32(len: usize, what: &str) -> io::Result<[u8; 4]> {
    u32::try_from(len)
        .map(u32::to_be_bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{what} too long")))
}

/// How much of a snapshot [`write_to`] gathers before it hashes and writes it.
const WRITE_CHUNK: usize = 256 << 10;

/// Writes a snapshot of `view` described by `meta` to `out`, in chunks of [`WRITE_CHUNK`]
/// bytes (so `out` need not buffer).
pub(crate) fn write_to(
    out: impl Write,
    meta: &Meta,
    view: &ReadView<'_>,
) -> Result<(), StoreError> {
    write_format(out, meta, view, FORMAT)
}

/// [`write_to`] in a given format (the tests write format 1 to check it is still read).
fn write_format(
    out: impl Write,
    meta: &Meta,
    view: &ReadView<'_>,
    format: u8,
) -> Result<(), StoreError> {
    let hash = SnapshotChecksum::for_format(format)
        .ok_or_else(|| corrupt(format!("cannot write unknown format {format}")))?;
    // Hashed and written in chunks: the records are small pieces (a tag, a length, a key),
    // and hashing each on its own cost more than the hash itself.
    let mut w = BufWriter::with_capacity(WRITE_CHUNK, HashWriter { inner: out, hash });
    let io_err = |e| StoreError::io("writing snapshot", e);

    let meta_bytes = codec::encode(meta);
    w.write_all(SNAPSHOT_MAGIC).map_err(io_err)?;
    w.write_all(&[format]).map_err(io_err)?;
    w.write_all(&len_u32(meta_bytes.len(), "snapshot meta").map_err(io_err)?).map_err(io_err)?;
    w.write_all(&meta_bytes).map_err(io_err)?;
    let cf_count = u8::try_from(Cf::ALL.len())
        .map_err(|_| StoreError::Corrupt("too many column families".into()))?;
    w.write_all(&[cf_count]).map_err(io_err)?;
    for cf in Cf::ALL {
        let name = cf.name().as_bytes();
        let name_len = u8::try_from(name.len()).map_err(|_| {
            StoreError::Corrupt(format!("column family name {} too long", cf.name()))
        })?;
        w.write_all(&[name_len]).map_err(io_err)?;
        w.write_all(name).map_err(io_err)?;
    }

    let mut count: u64 = 0;
    for (tag, cf) in (0u8..).zip(Cf::ALL) {
        view.for_each(cf, b"", b"", |key, value| {
            if cf == Cf::Meta && key.starts_with(SM_RESERVED_PREFIX) {
                return Ok(true);
            }
            w.write_all(&[tag]).map_err(io_err)?;
            w.write_all(&len_u32(key.len(), "key").map_err(io_err)?).map_err(io_err)?;
            w.write_all(key).map_err(io_err)?;
            w.write_all(&len_u32(value.len(), "value").map_err(io_err)?).map_err(io_err)?;
            w.write_all(value).map_err(io_err)?;
            count += 1;
            Ok(true)
        })?;
    }

    w.write_all(&[END]).map_err(io_err)?;
    w.write_all(&count.to_be_bytes()).map_err(io_err)?;
    let HashWriter { mut inner, hash } = w.into_inner().map_err(|e| io_err(e.into_error()))?;
    inner.write_all(&hash.value().to_be_bytes()).map_err(io_err)?;
    inner.flush().map_err(io_err)
}

/// Reads a snapshot file record by record, verifying the trailer at the end.
pub(crate) struct SnapshotReader<R> {
    r: HashReader<BufReader<R>>,
    cfs: Vec<Cf>,
    count: u64,
    done: bool,
    checksum: Option<u64>,
}

fn corrupt(what: impl Into<String>) -> StoreError {
    StoreError::Corrupt(format!("snapshot: {}", what.into()))
}

fn read_io(e: io::Error) -> StoreError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        corrupt("truncated")
    } else {
        StoreError::io("reading snapshot", e)
    }
}

impl<R: Read> SnapshotReader<R> {
    /// Reads the header; returns the snapshot's meta and a reader positioned at the records.
    pub(crate) fn new(inner: R) -> Result<(Meta, Self), StoreError> {
        let mut inner = BufReader::with_capacity(1 << 20, inner);
        // The magic and the format are read before the checksum they choose, then added to it.
        let mut start = [0u8; 9];
        inner.read_exact(&mut start).map_err(read_io)?;
        let hash = SnapshotChecksum::for_file_start(&start).map_err(|e| match e {
            SnapshotStart::NotASnapshot => corrupt("not a delayd snapshot"),
            SnapshotStart::UnknownFormat(format) => corrupt(format!("unknown format {format}")),
        })?;
        let mut r = HashReader { inner, hash };
        let meta: Meta = codec::decode(&read_field(&mut r)?)?;
        let cf_count = read_u8(&mut r)?;
        let mut cfs = Vec::with_capacity(usize::from(cf_count));
        for _ in 0..cf_count {
            let mut name = vec![0u8; usize::from(read_u8(&mut r)?)];
            r.read_exact(&mut name).map_err(read_io)?;
            let cf = Cf::ALL
                .into_iter()
                .find(|cf| cf.name().as_bytes() == name)
                .ok_or_else(|| corrupt(format!("unknown column family {:?}", name)))?;
            cfs.push(cf);
        }
        Ok((meta, SnapshotReader { r, cfs, count: 0, done: false, checksum: None }))
    }

    /// The next record, or `None` after the trailer has been read and checked.
    pub(crate) fn next_record(&mut self) -> Result<Option<Record>, StoreError> {
        if self.done {
            return Ok(None);
        }
        let tag = read_u8(&mut self.r)?;
        if tag == END {
            self.finish()?;
            return Ok(None);
        }
        let cf = *self
            .cfs
            .get(usize::from(tag))
            .ok_or_else(|| corrupt(format!("bad column family tag {tag}")))?;
        let key = read_field(&mut self.r)?;
        let value = read_field(&mut self.r)?;
        self.count += 1;
        Ok(Some((cf, key, value)))
    }

    fn finish(&mut self) -> Result<(), StoreError> {
        let mut count = [0u8; 8];
        self.r.read_exact(&mut count).map_err(read_io)?;
        if u64::from_be_bytes(count) != self.count {
            return Err(corrupt("record count does not match"));
        }
        let expected = self.r.hash.value();
        let mut checksum = [0u8; 8];
        self.r.inner.read_exact(&mut checksum).map_err(read_io)?;
        if u64::from_be_bytes(checksum) != expected {
            return Err(corrupt("checksum mismatch"));
        }
        let mut rest = [0u8; 1];
        if self.r.inner.read(&mut rest).map_err(read_io)? != 0 {
            return Err(corrupt("trailing bytes"));
        }
        self.done = true;
        self.checksum = Some(expected);
        Ok(())
    }

    /// The number of records and the verified checksum, once the trailer has been read.
    pub(crate) fn summary(&self) -> Option<(u64, u64)> {
        self.checksum.map(|c| (self.count, c))
    }
}

fn read_u8(r: &mut impl Read) -> Result<u8, StoreError> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b).map_err(read_io)?;
    Ok(b[0])
}

/// Reads a u32-length-prefixed field. Reads through `take` rather than allocating the
/// announced length up front, so a damaged length fails at end of file, not in the allocator.
fn read_field(r: &mut impl Read) -> Result<Vec<u8>, StoreError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(read_io)?;
    let len = u64::from(u32::from_be_bytes(len));
    if len > MAX_FIELD_BYTES {
        return Err(corrupt(format!("field of {len} bytes")));
    }
    let mut field = Vec::new();
    r.take(len).read_to_end(&mut field).map_err(read_io)?;
    if field.len() as u64 != len {
        return Err(corrupt("truncated"));
    }
    Ok(field)
}

/// Reads a whole snapshot file, checking its structure and checksum; returns its meta.
pub(crate) fn verify(path: &Path) -> Result<Meta, StoreError> {
    let file =
        File::open(path).map_err(|e| StoreError::io(format!("open {}", path.display()), e))?;
    let (meta, mut reader) = SnapshotReader::new(file)?;
    while reader.next_record()?.is_some() {}
    Ok(meta)
}

/// The directory holding snapshot files. Names are `<n>.snap` for complete files and
/// `<n>.tmp` for files being written or received, `n` a 16-digit hex counter unique within
/// the directory.
pub(crate) struct SnapshotDir {
    path: PathBuf,
}

impl SnapshotDir {
    /// Creates the directory if needed.
    pub(crate) fn open(path: PathBuf) -> Result<Self, StoreError> {
        fs::create_dir_all(&path)
            .map_err(|e| StoreError::io(format!("create {}", path.display()), e))?;
        Ok(SnapshotDir { path })
    }

    /// Path of a file in the directory.
    pub(crate) fn path(&self, file: &str) -> PathBuf {
        self.path.join(file)
    }

    /// The name of the complete file number `n`.
    pub(crate) fn snap_name(n: u64) -> String {
        format!("{n:016x}.snap")
    }

    /// Path of the temporary file number `n`.
    pub(crate) fn tmp_path(&self, n: u64) -> PathBuf {
        self.path.join(format!("{n:016x}.tmp"))
    }

    /// One more than the largest file number present, so numbers stay unique across restarts.
    pub(crate) fn next_number(&self) -> Result<u64, StoreError> {
        let mut next = 0;
        for name in self.file_names()? {
            if let Some(n) = name
                .strip_suffix(".snap")
                .or_else(|| name.strip_suffix(".tmp"))
                .and_then(|n| u64::from_str_radix(n, 16).ok())
            {
                next = next.max(n.saturating_add(1));
            }
        }
        Ok(next)
    }

    fn file_names(&self) -> Result<Vec<String>, StoreError> {
        let ctx = || format!("list {}", self.path.display());
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.path).map_err(|e| StoreError::io(ctx(), e))? {
            let entry = entry.map_err(|e| StoreError::io(ctx(), e))?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    /// Removes every snapshot or temporary file except `keep`.
    pub(crate) fn remove_all_but(&self, keep: Option<&str>) -> Result<(), StoreError> {
        for name in self.file_names()? {
            let ours = name.ends_with(".snap") || name.ends_with(".tmp");
            if ours && Some(name.as_str()) != keep {
                remove_if_exists(&self.path.join(&name))?;
            }
        }
        Ok(())
    }

    /// Makes renames and removals in the directory durable.
    pub(crate) fn sync(&self) -> Result<(), StoreError> {
        File::open(&self.path)
            .and_then(|d| d.sync_all())
            .map_err(|e| StoreError::io(format!("sync {}", self.path.display()), e))
    }

    /// Writes a snapshot of `view` as file number `n`: to a temporary file first, synced, then
    /// renamed into place, so a complete-looking name always holds a complete file. Returns
    /// the file name.
    pub(crate) fn write(
        &self,
        n: u64,
        meta: &Meta,
        view: &ReadView<'_>,
    ) -> Result<String, StoreError> {
        let tmp = self.tmp_path(n);
        let ctx = || format!("write {}", tmp.display());
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| StoreError::io(ctx(), e))?;
        let mut out = SyncEvery::new(file, SYNC_EVERY);
        let written = write_to(&mut out, meta, view)
            .and_then(|()| out.file.sync_all().map_err(|e| StoreError::io(ctx(), e)));
        if let Err(e) = written {
            // Best effort: the directory is cleaned at the next start anyway.
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        let name = Self::snap_name(n);
        self.rename(&tmp, &name)?;
        Ok(name)
    }

    /// Renames a temporary file to its final name and syncs the directory.
    pub(crate) fn rename(&self, tmp: &Path, name: &str) -> Result<(), StoreError> {
        let dest = self.path.join(name);
        fs::rename(tmp, &dest).map_err(|e| {
            StoreError::io(format!("rename {} to {}", tmp.display(), dest.display()), e)
        })?;
        self.sync()
    }
}

/// How much of a snapshot file is written between two syncs of it.
const SYNC_EVERY: usize = 4 << 20;

/// A file writer that syncs the file's data every `every` bytes, so that a large file never
/// has more than that much waiting in the page cache. Written whole and synced once at the
/// end, a snapshot (tens of MB or more) reaches the disk in one burst, and the log's small
/// synced appends queue behind it; RocksDB's own files are paced the same way
/// (`bytes_per_sync` in `db.rs`).
struct SyncEvery {
    file: File,
    every: usize,
    unsynced: usize,
}

impl SyncEvery {
    fn new(file: File, every: usize) -> Self {
        SyncEvery { file, every, unsynced: 0 }
    }
}

impl Write for SyncEvery {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.unsynced += n;
        if self.unsynced >= self.every {
            self.file.sync_data()?;
            self.unsynced = 0;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Removes a file; a file that is already gone is fine.
pub(crate) fn remove_if_exists(path: &Path) -> Result<(), StoreError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(StoreError::io(format!("remove {}", path.display()), e))
        }
        _ => Ok(()),
    }
}

/// True when `file` is the file at `path` (same device and inode).
#[cfg(unix)]
pub(crate) fn is_same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Without inode identity the caller falls back to copying, which is always correct.
#[cfg(not(unix))]
pub(crate) fn is_same_file(_file: &File, _path: &Path) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db;
    use crate::StoredMembership;

    fn meta() -> Meta {
        Meta { last_log_id: None, last_membership: StoredMembership::default() }
    }

    fn sample(dir: &Path) -> Vec<u8> {
        sample_in(dir, FORMAT)
    }

    fn sample_in(dir: &Path, format: u8) -> Vec<u8> {
        let db = db::open(&dir.join("db"), None).expect("open");
        let jobs = db::cf(&db, Cf::Jobs.name()).expect("cf");
        db.put_cf(jobs, b"k1", b"v1").expect("put");
        db.put_cf(jobs, b"k2", vec![7u8; 100_000]).expect("put");
        let meta_cf = db::cf(&db, Cf::Meta.name()).expect("cf");
        db.put_cf(meta_cf, b"clock", b"1").expect("put");
        db.put_cf(meta_cf, db::SM_LAST_APPLIED, b"skipped").expect("put");
        let mut out = Vec::new();
        write_format(&mut out, &meta(), &ReadView::snapshot(&db), format).expect("write");
        out
    }

    fn read_all(bytes: &[u8]) -> Result<Vec<Record>, StoreError> {
        let (_, mut reader) = SnapshotReader::new(bytes)?;
        let mut records = Vec::new();
        while let Some(record) = reader.next_record()? {
            records.push(record);
        }
        Ok(records)
    }

    /// A snapshot file reaches the disk as it is written, never more than the bound behind,
    /// and its bytes are the ones written.
    #[test]
    fn a_file_is_synced_every_so_many_bytes_as_it_is_written() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("f");
        let mut w = SyncEvery::new(File::create(&path).expect("create"), 10);
        w.write_all(&[1; 6]).expect("write");
        assert_eq!(w.unsynced, 6, "below the bound: not synced yet");
        w.write_all(&[2; 6]).expect("write");
        assert_eq!(w.unsynced, 0, "past the bound: synced");
        w.write_all(&[3; 3]).expect("write");
        assert_eq!(w.unsynced, 3);
        drop(w);
        let expected: Vec<u8> = [[1u8; 6].as_slice(), &[2; 6], &[3; 3]].concat();
        assert_eq!(fs::read(&path).expect("read"), expected);
    }

    #[test]
    fn round_trips_application_records_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bytes = sample(dir.path());
        let (got_meta, _) = SnapshotReader::new(&bytes[..]).expect("header");
        assert_eq!(got_meta, meta());
        let records = read_all(&bytes).expect("read");
        let keys: Vec<(Cf, &[u8])> = records.iter().map(|(cf, k, _)| (*cf, k.as_slice())).collect();
        assert_eq!(keys, [(Cf::Jobs, &b"k1"[..]), (Cf::Jobs, b"k2"), (Cf::Meta, b"clock")]);
        assert_eq!(records[1].2.len(), 100_000);
    }

    /// Format 1 files (FNV-1a trailers: backups taken before format 2) are still read and
    /// checked; a format-2 file's trailer is the CRC-32 of what precedes it.
    #[test]
    fn reads_both_formats_and_checks_each_by_its_own_checksum() {
        let dir = tempfile::tempdir().expect("tempdir");
        let new = sample_in(&dir.path().join("2"), FORMAT);
        let old = sample_in(&dir.path().join("1"), checksum::SNAPSHOT_FORMAT_FNV);
        assert_eq!((new[8], old[8]), (2, 1), "the format byte follows the magic");
        assert_eq!(read_all(&old).expect("format 1"), read_all(&new).expect("format 2"));
        let (body, trailer) = new.split_at(new.len() - 8);
        assert_eq!(trailer, u64::from(crc32fast::hash(body)).to_be_bytes());
        for bytes in [new, old] {
            let mut damaged = bytes.clone();
            let mid = damaged.len() / 2;
            damaged[mid] ^= 1;
            assert!(matches!(read_all(&damaged), Err(StoreError::Corrupt(_))));
            let mut unknown = bytes;
            unknown[8] = 3;
            let err = read_all(&unknown).expect_err("unknown format");
            assert!(err.to_string().contains("unknown format 3"), "{err}");
        }
    }

    #[test]
    fn detects_truncation_and_damage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bytes = sample(dir.path());
        for cut in [1, 8, 20, bytes.len() / 2, bytes.len() - 9, bytes.len() - 1] {
            assert!(read_all(&bytes[..cut]).is_err(), "truncated at {cut} accepted");
        }
        let mut damaged = bytes.clone();
        let mid = damaged.len() / 2;
        damaged[mid] ^= 1;
        assert!(matches!(read_all(&damaged), Err(StoreError::Corrupt(_))));
        let mut longer = bytes;
        longer.push(0);
        assert!(matches!(read_all(&longer), Err(StoreError::Corrupt(_))));
    }
}
