//! The key-value view the state machine runs on.
//!
//! The core never names RocksDB: it reads through [`KvRead`] and writes into an [`Overlay`],
//! an ordered buffer of pending writes layered over a read view. Reads through the overlay see
//! the batch's own earlier writes, so several commands in one Raft entry (and several entries in
//! one apply call) compose exactly as if each had been applied on its own. When the batch is
//! done the store turns [`Overlay::into_writes`] into one atomic write together with the
//! last-applied log id; if anything fails before that, nothing of the batch is visible.
//!
//! One exception within an entry: the state machine keeps each queue's metadata
//! ([`Cf::Queues`]) decoded while it applies an entry, and writes it into the overlay when the
//! entry is done. A read of that column family through the overlay in the middle of an entry
//! would see it as it was before the entry; the state machine never reads it that way.
//!
//! Data is split into column families ([`Cf`]) so that each ordered index can be scanned on its
//! own; every key layout is documented where it is built, in `keys.rs`.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use crate::keys::NUMBER_PREFIX;

/// A storage failure. These are never business outcomes: they mean the state cannot be read or
/// written, and openraft stops the node when it sees one.
#[derive(Debug, thiserror::Error)]
#[error("storage: {0}")]
pub struct KvError(pub String);

/// The column families of the replicated state machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cf {
    /// Job records by id.
    Jobs,
    /// Every pending deadline: (deadline, kind, id) → payload.
    Timers,
    /// Ready jobs per queue in delivery order: (queue, priority, seq, id).
    Ready,
    /// Dead-letter jobs per queue in arrival order: (queue, seq, id).
    Dead,
    /// Every live job of a queue: (queue, id). Lets a queue be destroyed without a full scan.
    Members,
    /// Client keys per queue: (queue, key) → key record.
    Keys,
    /// Per-queue metadata (pause flag, counts per state).
    Queues,
    /// Per-queue count of delayed jobs per due minute: the upcoming-due histogram.
    DueHist,
    /// Scalars of the state machine (clock, sequence). The store keeps its own keys here too.
    Meta,
}

impl Cf {
    /// Every column family, in a fixed order.
    pub const ALL: [Cf; 9] = [
        Cf::Jobs,
        Cf::Timers,
        Cf::Ready,
        Cf::Dead,
        Cf::Members,
        Cf::Keys,
        Cf::Queues,
        Cf::DueHist,
        Cf::Meta,
    ];

    /// The column family's place in [`Cf::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The column family's name on disk. Stable: changing one is an on-disk format change.
    pub fn name(self) -> &'static str {
        match self {
            Cf::Jobs => "sm_jobs",
            Cf::Timers => "sm_timers",
            Cf::Ready => "sm_ready",
            Cf::Dead => "sm_dead",
            Cf::Members => "sm_members",
            Cf::Keys => "sm_keys",
            Cf::Queues => "sm_queues",
            Cf::DueHist => "sm_duehist",
            Cf::Meta => "sm_meta",
        }
    }

    /// Whether `key` of this column family is written at most once between deletes: an
    /// index entry names the job (and, where a job may enter the index again, a new place in
    /// line or a new deadline), so the state machine puts it only where it is absent, and
    /// deletes it once. The store may then delete such a key with RocksDB's single delete,
    /// which, unlike a plain delete, vanishes together with the put it deletes once a flush or
    /// a compaction sees both: a job that comes and goes within a memtable leaves no
    /// tombstone of its indexes on disk. [`MemKv`] checks the rule in builds with debug
    /// assertions (every test of the state machine).
    pub fn written_once(self, key: &[u8]) -> bool {
        match self {
            Cf::Timers | Cf::Ready | Cf::Dead | Cf::Members => true,
            Cf::Meta => key.starts_with(NUMBER_PREFIX),
            Cf::Jobs | Cf::Keys | Cf::Queues | Cf::DueHist => false,
        }
    }
}

/// Read access to a consistent view of the state machine's data.
pub trait KvRead {
    /// Reads one value.
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, KvError>;

    /// Visits the entries with `from <= key < to` in key order (`to` empty: no upper bound)
    /// until `visit` returns false.
    fn scan(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), KvError>;
}

/// An in-memory ordered map: the base for golden tests and an empty view.
#[derive(Debug, Default, Clone)]
pub struct MemKv {
    map: BTreeMap<(Cf, Vec<u8>), Vec<u8>>,
}

impl MemKv {
    /// Applies writes produced by an [`Overlay`].
    ///
    /// With debug assertions, panics at a put of a key [`Cf::written_once`] that the map
    /// holds already: the state machine broke the rule the store relies on to delete such
    /// keys with single deletes.
    pub fn apply(&mut self, writes: impl IntoIterator<Item = Write>) {
        for (cf, key, value) in writes {
            match value {
                Some(v) => {
                    debug_assert!(
                        !cf.written_once(&key) || !self.map.contains_key(&(cf, key.clone())),
                        "a key of {cf:?} written once was put again without a delete: {key:?}"
                    );
                    self.map.insert((cf, key), v);
                }
                None => {
                    self.map.remove(&(cf, key));
                }
            }
        }
    }

    /// Every entry, in (column family, key) order.
    pub fn iter(&self) -> impl Iterator<Item = (Cf, &[u8], &[u8])> {
        self.map.iter().map(|((cf, k), v)| (*cf, k.as_slice(), v.as_slice()))
    }
}

fn upper(cf: Cf, to: &[u8]) -> Bound<(Cf, Vec<u8>)> {
    if to.is_empty() {
        Bound::Unbounded
    } else {
        Bound::Excluded((cf, to.to_vec()))
    }
}

impl KvRead for MemKv {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        Ok(self.map.get(&(cf, key.to_vec())).cloned())
    }

    fn scan(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), KvError> {
        let range = (Bound::Included((cf, from.to_vec())), upper(cf, to));
        for ((c, k), v) in self.map.range(range) {
            if *c != cf || !visit(k, v) {
                break;
            }
        }
        Ok(())
    }
}

/// One pending write: a put (`Some`) or a delete (`None`).
pub type Write = (Cf, Vec<u8>, Option<Vec<u8>>);

/// Pending writes over a read view; reads see the pending writes first.
pub struct Overlay<'a, R: KvRead + ?Sized> {
    base: &'a R,
    /// One ordered map per column family (indexed like [`Cf::ALL`]), so that a read looks a
    /// key up by reference, without building an owned `(Cf, key)` to compare with.
    pending: [BTreeMap<Vec<u8>, Option<Vec<u8>>>; Cf::ALL.len()],
    /// Keys [`Cf::written_once`] deleted and then put again in this batch (a job updated in
    /// place keeps its index entry's key): the delete must reach the store before the put,
    /// so that the key is never put twice without a delete between. Almost always empty.
    replaced: [BTreeSet<Vec<u8>>; Cf::ALL.len()],
    /// Bytes of keys and values buffered so far, counting overwritten ones too: an upper
    /// bound of the batch's memory, cheap to keep.
    buffered_bytes: usize,
}

impl<'a, R: KvRead + ?Sized> Overlay<'a, R> {
    /// Starts an empty batch over `base`.
    pub fn new(base: &'a R) -> Self {
        Overlay {
            base,
            pending: Default::default(),
            replaced: Default::default(),
            buffered_bytes: 0,
        }
    }

    /// Buffers a put.
    pub fn put(&mut self, cf: Cf, key: Vec<u8>, value: Vec<u8>) {
        self.buffered_bytes += key.len() + value.len();
        match self.pending[cf.index()].entry(key) {
            Entry::Occupied(mut pending) => {
                if pending.get().is_none() && cf.written_once(pending.key()) {
                    self.replaced[cf.index()].insert(pending.key().clone());
                }
                pending.insert(Some(value));
            }
            Entry::Vacant(pending) => {
                pending.insert(Some(value));
            }
        }
    }

    /// Buffers a delete.
    ///
    /// A key [`Cf::written_once`] that this batch put is put only where it was absent, so
    /// deleting it again leaves nothing to write: the put is dropped instead of being
    /// followed by a delete (a tick that makes a job ready and the reserve riding it in the
    /// same entry write neither the ready key nor its tombstone). A key the batch deleted and
    /// put again was in the store, and keeps its delete.
    pub fn delete(&mut self, cf: Cf, key: Vec<u8>) {
        self.buffered_bytes += key.len();
        match self.pending[cf.index()].entry(key) {
            Entry::Occupied(mut pending) => {
                let put_here = pending.get().is_some() && cf.written_once(pending.key());
                if put_here && !self.replaced[cf.index()].remove(pending.key()) {
                    pending.remove();
                } else {
                    pending.insert(None);
                }
            }
            Entry::Vacant(pending) => {
                pending.insert(None);
            }
        }
    }

    /// Number of buffered writes.
    pub fn len(&self) -> usize {
        self.pending.iter().map(BTreeMap::len).sum()
    }

    /// An upper bound of the bytes buffered (keys and values, overwritten ones included).
    pub fn buffered_bytes(&self) -> usize {
        self.buffered_bytes
    }

    /// True when nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.pending.iter().all(BTreeMap::is_empty)
    }

    /// The buffered writes, in (column family, key) order, to be written atomically in this
    /// order. A key [`Cf::written_once`] that the batch deleted and then put again comes
    /// twice: its delete, then its put.
    pub fn into_writes(self) -> Writes {
        let (mut pending, mut replaced) = (self.pending, self.replaced);
        let families = std::array::from_fn(|i| Family {
            cf: Cf::ALL[i],
            writes: std::mem::take(&mut pending[i]).into_iter(),
            replaced: std::mem::take(&mut replaced[i]),
        });
        Writes { families: families.into_iter(), current: None, then: None }
    }
}

/// The writes of an [`Overlay`], from [`Overlay::into_writes`].
pub struct Writes {
    families: std::array::IntoIter<Family, { Cf::ALL.len() }>,
    /// The column family being written.
    current: Option<Family>,
    /// The put that follows the delete just returned.
    then: Option<Write>,
}

/// One column family's writes left, and its keys deleted and put again.
struct Family {
    cf: Cf,
    writes: std::collections::btree_map::IntoIter<Vec<u8>, Option<Vec<u8>>>,
    replaced: BTreeSet<Vec<u8>>,
}

impl Iterator for Writes {
    type Item = Write;

    fn next(&mut self) -> Option<Write> {
        if let Some(put) = self.then.take() {
            return Some(put);
        }
        loop {
            if let Some(Family { cf, writes, replaced }) = &mut self.current {
                if let Some((key, value)) = writes.next() {
                    if value.is_some() && replaced.contains(&key) {
                        self.then = Some((*cf, key.clone(), value));
                        return Some((*cf, key, None));
                    }
                    return Some((*cf, key, value));
                }
            }
            self.current = Some(self.families.next()?);
        }
    }
}

impl<R: KvRead + ?Sized> KvRead for Overlay<'_, R> {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        match self.pending[cf.index()].get(key) {
            Some(v) => Ok(v.clone()),
            None => self.base.get(cf, key),
        }
    }

    fn scan(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), KvError> {
        // Merge the base's ordered entries with the pending ones; a pending entry shadows the
        // base entry with the same key, and a pending delete hides it.
        if !to.is_empty() && from >= to {
            // Nothing lies in the range (and `BTreeMap::range` refuses a reversed one).
            return Ok(());
        }
        let end = if to.is_empty() { Bound::Unbounded } else { Bound::Excluded(to) };
        let mut pending =
            self.pending[cf.index()].range::<[u8], _>((Bound::Included(from), end)).peekable();
        let mut stopped = false;
        self.base.scan(cf, from, to, &mut |key, value| {
            while let Some((pk, pv)) = pending.peek() {
                if pk.as_slice() > key {
                    break;
                }
                let shadows = pk.as_slice() == key;
                if let Some(v) = pv {
                    if !visit(pk, v) {
                        stopped = true;
                        return false;
                    }
                }
                pending.next();
                if shadows {
                    return true;
                }
            }
            if !visit(key, value) {
                stopped = true;
                return false;
            }
            true
        })?;
        if !stopped {
            for (k, v) in pending {
                if let Some(v) = v {
                    if !visit(k, v) {
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(kv: &impl KvRead, from: &[u8], to: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        kv.scan(Cf::Ready, from, to, &mut |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            true
        })
        .expect("scan");
        out
    }

    /// A key written once that a batch deletes and puts again reaches the store as a delete
    /// and then a put, so it is never put twice without a delete between; one the batch put
    /// and then deleted was absent before, and is not written at all; any other key comes
    /// once, as its last write.
    #[test]
    fn a_key_written_once_deleted_and_put_again_is_written_as_both() {
        let mut base = MemKv::default();
        base.apply([
            (Cf::Ready, b"r".to_vec(), Some(b"1".to_vec())),
            (Cf::Jobs, b"j".to_vec(), Some(b"1".to_vec())),
        ]);
        let mut o = Overlay::new(&base);
        o.delete(Cf::Ready, b"r".to_vec());
        o.put(Cf::Ready, b"r".to_vec(), b"2".to_vec());
        o.put(Cf::Ready, b"r".to_vec(), b"3".to_vec());
        o.put(Cf::Ready, b"s".to_vec(), b"4".to_vec());
        o.delete(Cf::Ready, b"s".to_vec());
        o.delete(Cf::Jobs, b"j".to_vec());
        o.put(Cf::Jobs, b"j".to_vec(), b"2".to_vec());
        assert_eq!(o.get(Cf::Ready, b"r").expect("get"), Some(b"3".to_vec()));
        let writes: Vec<Write> = o.into_writes().collect();
        assert_eq!(
            writes,
            [
                (Cf::Jobs, b"j".to_vec(), Some(b"2".to_vec())),
                (Cf::Ready, b"r".to_vec(), None),
                (Cf::Ready, b"r".to_vec(), Some(b"3".to_vec())),
            ]
        );
        base.apply(writes);
        assert_eq!(base.get(Cf::Ready, b"r").expect("get"), Some(b"3".to_vec()));
        assert_eq!(base.get(Cf::Ready, b"s").expect("get"), None);
    }

    /// A key written once that a batch deletes, puts again and deletes once more was in the
    /// store: one delete reaches it. A key the batch put twice over deletes (a job readied,
    /// taken, readied again at a new place and taken again) leaves nothing.
    #[test]
    fn a_key_written_once_that_ends_deleted_is_written_as_one_delete_or_not_at_all() {
        let mut base = MemKv::default();
        base.apply([(Cf::Timers, b"t".to_vec(), Some(Vec::new()))]);
        let mut o = Overlay::new(&base);
        o.delete(Cf::Timers, b"t".to_vec());
        o.put(Cf::Timers, b"t".to_vec(), Vec::new());
        o.delete(Cf::Timers, b"t".to_vec());
        for _ in 0..2 {
            o.put(Cf::Ready, b"q".to_vec(), b"1".to_vec());
            assert_eq!(collect(&o, b"", b"").len(), 1);
            o.delete(Cf::Ready, b"q".to_vec());
            assert!(collect(&o, b"", b"").is_empty());
        }
        assert_eq!(o.get(Cf::Timers, b"t").expect("get"), None);
        let writes: Vec<Write> = o.into_writes().collect();
        assert_eq!(writes, [(Cf::Timers, b"t".to_vec(), None)]);
        base.apply(writes);
        assert_eq!(base.get(Cf::Timers, b"t").expect("get"), None);
    }

    #[test]
    fn overlay_merges_shadows_and_hides() {
        let mut base = MemKv::default();
        base.apply([
            (Cf::Ready, b"a".to_vec(), Some(b"1".to_vec())),
            (Cf::Ready, b"c".to_vec(), Some(b"3".to_vec())),
            (Cf::Ready, b"e".to_vec(), Some(b"5".to_vec())),
            (Cf::Dead, b"b".to_vec(), Some(b"x".to_vec())),
        ]);
        let mut o = Overlay::new(&base);
        o.put(Cf::Ready, b"b".to_vec(), b"2".to_vec());
        o.put(Cf::Ready, b"c".to_vec(), b"33".to_vec());
        o.delete(Cf::Ready, b"e".to_vec());
        o.put(Cf::Ready, b"f".to_vec(), b"6".to_vec());
        let got = collect(&o, b"", b"");
        let want: Vec<(Vec<u8>, Vec<u8>)> = [("a", "1"), ("b", "2"), ("c", "33"), ("f", "6")]
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        assert_eq!(got, want);
        assert_eq!(collect(&o, b"b", b"d").len(), 2);
        assert_eq!(o.get(Cf::Ready, b"e").expect("get"), None);
        assert_eq!(o.get(Cf::Dead, b"b").expect("get"), Some(b"x".to_vec()));
    }

    #[test]
    fn column_family_indexes_follow_all() {
        for (i, cf) in Cf::ALL.into_iter().enumerate() {
            assert_eq!(cf.index(), i, "{cf:?}");
        }
    }

    #[test]
    fn overlay_writes_come_out_in_column_family_then_key_order() {
        let base = MemKv::default();
        let mut o = Overlay::new(&base);
        o.put(Cf::Meta, b"m".to_vec(), b"1".to_vec());
        o.delete(Cf::Ready, b"b".to_vec());
        o.put(Cf::Ready, b"a".to_vec(), b"2".to_vec());
        o.put(Cf::Jobs, b"z".to_vec(), b"3".to_vec());
        o.put(Cf::Ready, b"a".to_vec(), b"4".to_vec());
        assert_eq!(o.len(), 4);
        let writes: Vec<Write> = o.into_writes().collect();
        assert_eq!(
            writes,
            [
                (Cf::Jobs, b"z".to_vec(), Some(b"3".to_vec())),
                (Cf::Ready, b"a".to_vec(), Some(b"4".to_vec())),
                (Cf::Ready, b"b".to_vec(), None),
                (Cf::Meta, b"m".to_vec(), Some(b"1".to_vec())),
            ]
        );
    }

    #[test]
    fn overlay_scan_of_an_empty_or_reversed_range_visits_nothing() {
        let mut base = MemKv::default();
        base.apply([(Cf::Ready, b"b".to_vec(), Some(b"1".to_vec()))]);
        let mut o = Overlay::new(&base);
        o.put(Cf::Ready, b"c".to_vec(), b"2".to_vec());
        assert!(collect(&o, b"c", b"c").is_empty());
        assert!(collect(&o, b"d", b"a").is_empty());
        assert_eq!(collect(&o, b"c", b"").len(), 1);
    }

    #[test]
    fn overlay_scan_stops_when_asked() {
        let mut base = MemKv::default();
        base.apply((0u8..10).map(|i| (Cf::Ready, vec![i], Some(vec![i]))));
        let mut o = Overlay::new(&base);
        o.put(Cf::Ready, vec![3, 0], vec![]);
        let mut seen = Vec::new();
        o.scan(Cf::Ready, &[], &[], &mut |k, _| {
            seen.push(k.to_vec());
            seen.len() < 5
        })
        .expect("scan");
        assert_eq!(seen, vec![vec![0], vec![1], vec![2], vec![3], vec![3, 0]]);
    }
}
