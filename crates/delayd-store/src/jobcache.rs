//! The job records the last applied batches wrote, kept for the applies that follow.
//!
//! Applying reads most job records soon after an earlier apply wrote them: an ack reads the
//! record its reserve rewrote one round trip before, a reserve reads the record of a job
//! published a moment ago or made ready by the tick just applied, a tick reads the records
//! of the leases and delays that come due. Each read would otherwise be a RocksDB point lookup
//! through the memtables and every level-0 file — on every node, since every node applies
//! every entry — and then a copy out of RocksDB.
//!
//! The cache is write-through and exact: a record enters when an applied batch writes it (its
//! bytes, or "absent" for a delete), and only once that batch is in RocksDB, so an entry is
//! always what the live database holds for its key. Nothing is read into it: a record nobody
//! wrote lately is read from RocksDB as before. Only the state machine's own reads consult it
//! (apply's view of the live database); queries read RocksDB snapshots, which may be older.
//! Whatever replaces the state outside apply (a snapshot installed, a backup restored, both
//! through `Shared::load`) clears it.
//!
//! It is bounded by bytes in two generations: writes go into the newer one; once that holds
//! half of [`BUDGET`], the older one is dropped and the newer one takes its place. A lookup
//! tries the newer first, so a key written again is found as last written. Dropping either
//! generation is always safe: an entry that is not there is read from RocksDB. The memory is
//! fixed whatever the number of stored jobs.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The most bytes of keys and records the cache holds (an entry's bookkeeping counted as
/// [`ENTRY_OVERHEAD`] more). A job lives in it from one write to the next apply that reads it,
/// which is a round trip for an ack and a job's delay for a reserve: 8 MiB holds some 30,000
/// records of 100-byte jobs, a few seconds of writes at the rates one node applies.
pub(crate) const BUDGET: usize = 8 << 20;

/// What an entry costs beyond its key and record: the map's slot and the two allocations.
const ENTRY_OVERHEAD: usize = 64;

/// One generation: key → the record, `None` for a job deleted.
type Generation = HashMap<Vec<u8>, Option<Vec<u8>>>;

#[derive(Default)]
struct Generations {
    newer: Generation,
    newer_bytes: usize,
    older: Generation,
}

/// See the module docs.
pub(crate) struct JobCache {
    inner: Mutex<Generations>,
    /// Bytes the newer generation may hold before it becomes the older.
    generation_bytes: usize,
}

impl Default for JobCache {
    fn default() -> Self {
        JobCache::with_budget(BUDGET)
    }
}

impl JobCache {
    /// A cache of at most `budget` bytes (see [`BUDGET`]).
    pub(crate) fn with_budget(budget: usize) -> Self {
        JobCache { inner: Mutex::default(), generation_bytes: budget / 2 }
    }

    fn lock(&self) -> MutexGuard<'_, Generations> {
        // Every critical section leaves both maps consistent: a panic elsewhere cannot
        // leave a half-made entry.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What the live database holds for `key` (`Some(None)`: nothing), when the cache knows;
    /// `None` when it does not and RocksDB must be asked.
    pub(crate) fn get(&self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let g = self.lock();
        g.newer.get(key).or_else(|| g.older.get(key)).cloned()
    }

    /// Records the writes of one applied batch; called only once the batch is in RocksDB.
    pub(crate) fn wrote(&self, writes: impl IntoIterator<Item = (Vec<u8>, Option<Vec<u8>>)>) {
        let mut g = self.lock();
        for (key, record) in writes {
            let bytes = key.len() + record.as_ref().map_or(0, Vec::len) + ENTRY_OVERHEAD;
            if g.newer_bytes + bytes > self.generation_bytes && !g.newer.is_empty() {
                let newer = std::mem::take(&mut g.newer);
                g.older = newer;
                g.newer_bytes = 0;
            }
            g.newer_bytes += bytes;
            g.newer.insert(key, record);
        }
    }

    /// Forgets everything: the state was replaced outside apply.
    pub(crate) fn clear(&self) {
        *self.lock() = Generations::default();
    }

    /// Entries held, in both generations (a key in both counted twice).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let g = self.lock();
        g.newer.len() + g.older.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(k: &[u8], v: &[u8]) -> (Vec<u8>, Option<Vec<u8>>) {
        (k.to_vec(), Some(v.to_vec()))
    }

    #[test]
    fn a_record_is_found_as_last_written_and_a_delete_as_absent() {
        let cache = JobCache::default();
        assert_eq!(cache.get(b"a"), None, "never written: ask RocksDB");
        cache.wrote([put(b"a", b"1"), put(b"b", b"2")]);
        cache.wrote([put(b"a", b"11"), (b"b".to_vec(), None)]);
        assert_eq!(cache.get(b"a"), Some(Some(b"11".to_vec())));
        assert_eq!(cache.get(b"b"), Some(None), "deleted: known to be absent");
        cache.clear();
        assert_eq!(cache.get(b"a"), None);
    }

    #[test]
    fn the_budget_bounds_what_is_kept_and_the_newest_write_always_wins() {
        // Room for about two 100-byte entries per generation.
        let entry = 1 + 100 + ENTRY_OVERHEAD;
        let cache = JobCache::with_budget(4 * entry + 1);
        for i in 0..100u8 {
            cache.wrote([put(&[i], &[i; 100])]);
            assert!(cache.len() <= 4, "{} entries after {i} writes", cache.len());
            assert_eq!(cache.get(&[i]), Some(Some(vec![i; 100])), "the write just made");
        }
        assert_eq!(cache.get(&[0]), None, "the oldest writes are gone");
        // A key rewritten after it went into the older generation is read as rewritten.
        let cache = JobCache::with_budget(4 * entry + 1);
        cache.wrote([put(b"k", &[1; 100])]);
        cache.wrote([put(b"x", &[0; 100]), put(b"y", &[0; 100])]); // "k" now in the older
        cache.wrote([(b"k".to_vec(), None)]);
        assert_eq!(cache.get(b"k"), Some(None));
    }
}
