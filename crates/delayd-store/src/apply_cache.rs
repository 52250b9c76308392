//! What apply reads again and again, kept in memory: [`ApplyCache`].
//!
//! Every point read apply makes of RocksDB is a search down a memtable's skip list (and,
//! for a key flushed since, the block cache), some 4,000–8,000 instructions each by callgrind
//! (docs/bench/consume-path.md). Most of those reads are of something read or written a
//! moment before:
//!
//! - **job records**: an ack reads the record its reserve wrote a round trip earlier, a
//!   release or a touch the same. The records apply writes are kept in a direct-mapped table:
//!   a record goes to the slot its id's low bits name, replacing whatever was there, so
//!   keeping one costs no search and no allocation (the slot takes the value the write batch
//!   has just copied, which apply would otherwise drop) and the table never holds more than
//!   [`JOB_SLOTS`] records of at most [`MAX_VALUE`] bytes. Ids are random in their low bits,
//!   so of the records written in one round trip each is displaced by the others with a
//!   chance of about one in four at 300 writes (1 − (1023/1024)³⁰⁰), one in ten at 100;
//! - **the small, hot keys**: a queue's ready floor, read by every job that becomes ready
//!   (each publish of a ready job, each job a tick fires), the sequence and number counters
//!   and the replicated clock, read once per batch, a queue's metadata once per entry, the
//!   due-time histogram's count of a queue's minute once per batch that publishes into it.
//!   Of these column families ([`Cf::Meta`], [`Cf::Queues`], [`Cf::DueHist`]) the table keeps
//!   what apply *read*, up to [`MAX_KEPT`] keys, and the writes to a key it keeps; a
//!   publish's number-index key, written once and never read by apply, is not kept. Delays
//!   spread over more than [`MAX_KEPT`] queue-minutes start the table again empty often, and
//!   then it saves less: it never changes an answer.
//!
//! A record displaced, or never read, is read from RocksDB as before. The one rule that keeps
//! the table right: it holds a value for a key only while that is what the live database
//! holds under the key. Apply is the only writer of the state machine's column families
//! besides a snapshot install: every write apply makes passes through [`ApplyCache::wrote`]
//! once it is in the database (a failed write clears the table), and an install clears the
//! table before it touches them. openraft calls apply and install one at a time, so no apply
//! reads the table while an install replaces the state. Only apply's view of the live
//! database reads it ([`ApplyView`]): a reader's consistent view (a snapshot of the
//! database) must not see a later write, and goes to RocksDB.

use std::collections::BTreeMap;
use std::sync::Mutex;

use delayd_core::{Cf, KvError, KvRead};

use crate::db::{ReadView, SM_RESERVED_PREFIX};
use crate::state::lock;

/// Slots for job records. A power of two, so that an id's low bits name its slot. At about
/// 200 bytes a record (a 100-byte body) a full table holds some 250 KiB, small enough to stay
/// in a core's L2 beside everything else a node touches. A larger map of every record
/// written in the last two generations (8 MiB) was priced on 2026-12-01 and cost more than it
/// saved on cores the three nodes and the load generator share.
pub(crate) const JOB_SLOTS: usize = 1024;

/// Largest value kept, a job record with a body of some 4 KiB: the table's memory stays
/// within [`JOB_SLOTS`] × this (4 MiB) whatever the bodies, and a larger record, read once by
/// an ack, is not worth a copy. A larger value is forgotten instead.
pub(crate) const MAX_VALUE: usize = 4096;

/// Most keys of the small column families kept. A few per queue are hot; past this many the
/// table starts again empty, so a node with thousands of busy queues only reads RocksDB
/// more often.
pub(crate) const MAX_KEPT: usize = 1024;

/// A job record's key in [`Cf::Jobs`]: the id's 16 bytes.
type JobKey = [u8; 16];

/// A slot of the job table: a record and its key, or nothing.
type JobSlot = Option<(JobKey, Vec<u8>)>;

/// The kept keys of one column family: each key's value, `None` for a key the database does
/// not hold. Ordered rather than hashed: a lookup among the few hot keys of a node is a
/// handful of short comparisons, cheaper than hashing the key (most lookups are of written
/// keys that are not kept, such as every publish's number-index key), and no key a client
/// chooses can make it slower than a search among [`MAX_KEPT`] keys.
type Kept = BTreeMap<Box<[u8]>, Option<Vec<u8>>>;

/// Whether apply's point reads of `cf` are kept (see the module docs).
fn read_through(cf: Cf) -> bool {
    matches!(cf, Cf::Meta | Cf::Queues | Cf::DueHist)
}

/// Whether [`ApplyCache::wrote`] needs to hear of writes to `cf`.
pub(crate) fn follows(cf: Cf) -> bool {
    cf == Cf::Jobs || read_through(cf)
}

/// The table; see the module docs.
pub(crate) struct ApplyCache {
    jobs: Box<[JobSlot]>,
    /// Per column family, indexed like [`Cf::ALL`]; only [`read_through`] ones are used.
    kept: [Kept; Cf::ALL.len()],
    /// [`MAX_KEPT`], but for tests.
    max_kept: usize,
    /// Per column family, reads answered from the table and reads it sent to the database.
    #[cfg(test)]
    pub(crate) hits: [u64; Cf::ALL.len()],
    #[cfg(test)]
    pub(crate) misses: [u64; Cf::ALL.len()],
}

impl Default for ApplyCache {
    fn default() -> Self {
        ApplyCache {
            jobs: vec![None; JOB_SLOTS].into_boxed_slice(),
            kept: Default::default(),
            max_kept: MAX_KEPT,
            #[cfg(test)]
            hits: [0; Cf::ALL.len()],
            #[cfg(test)]
            misses: [0; Cf::ALL.len()],
        }
    }
}

/// The slot of a job record's key, by the id's low bits (a ULID's random part).
fn slot_of(key: &JobKey) -> usize {
    usize::from(u16::from_be_bytes([key[14], key[15]])) % JOB_SLOTS
}

/// What one applied batch did to a key, for [`ApplyCache::wrote`].
pub(crate) enum Change {
    /// The key now holds this value.
    Put(Vec<u8>),
    /// The key was deleted.
    Delete,
    /// The key was written with a value the table does not keep: whatever it held for the
    /// key is out of date.
    Forget,
}

impl Change {
    /// The change a batch's write makes (`value` the value written, `None` a delete), with the
    /// value kept only if `keep` and it is small enough.
    pub(crate) fn of(value: Option<Vec<u8>>, keep: bool) -> Change {
        match value {
            None => Change::Delete,
            Some(v) if keep && v.len() <= MAX_VALUE => Change::Put(v),
            Some(_) => Change::Forget,
        }
    }
}

impl ApplyCache {
    /// What the table holds under `key` in `cf`: `Some(value)` (the value `None` for a key
    /// the database does not hold), or `None` when it does not know.
    fn get(&mut self, cf: Cf, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let held = if cf == Cf::Jobs {
            let key: JobKey = key.try_into().ok()?;
            match &self.jobs[slot_of(&key)] {
                Some((k, value)) if *k == key => Some(Some(value.clone())),
                _ => None,
            }
        } else {
            self.kept[cf.index()].get(key).cloned()
        };
        #[cfg(test)]
        match held {
            Some(_) => self.hits[cf.index()] += 1,
            None => self.misses[cf.index()] += 1,
        }
        held
    }

    /// Keeps what a read of the database found under `key`, if `cf` is one whose reads are
    /// kept.
    fn read(&mut self, cf: Cf, key: &[u8], value: &Option<Vec<u8>>) {
        if !read_through(cf) || (cf == Cf::Meta && key.starts_with(SM_RESERVED_PREFIX)) {
            return;
        }
        if self.kept_len() >= self.max_kept {
            self.kept.iter_mut().for_each(BTreeMap::clear);
        }
        self.kept[cf.index()].insert(key.into(), value.clone());
    }

    /// How many small keys are kept.
    fn kept_len(&self) -> usize {
        self.kept.iter().map(BTreeMap::len).sum()
    }

    /// Records what one applied batch did to `key` in `cf`, once the batch is in the database.
    pub(crate) fn wrote(&mut self, cf: Cf, key: &[u8], change: Change) {
        if cf == Cf::Jobs {
            let Ok(key) = JobKey::try_from(key) else { return };
            let slot = &mut self.jobs[slot_of(&key)];
            match change {
                Change::Put(value) => *slot = Some((key, value)),
                // Only this key's record is out of date: another record in the slot is still
                // what the database holds.
                Change::Delete | Change::Forget => {
                    if slot.as_ref().is_some_and(|(k, _)| *k == key) {
                        *slot = None;
                    }
                }
            }
            return;
        }
        let kept = &mut self.kept[cf.index()];
        match change {
            Change::Put(value) => {
                if let Some(held) = kept.get_mut(key) {
                    *held = Some(value);
                }
            }
            Change::Delete => {
                if let Some(held) = kept.get_mut(key) {
                    *held = None;
                }
            }
            Change::Forget => {
                kept.remove(key);
            }
        }
    }

    /// A table that keeps at most `max_kept` small keys, for tests of a table that starts
    /// again often.
    #[cfg(test)]
    pub(crate) fn keeping(max_kept: usize) -> ApplyCache {
        ApplyCache { max_kept, ..ApplyCache::default() }
    }

    /// Forgets everything: the state machine's data is about to be replaced.
    pub(crate) fn clear(&mut self) {
        self.jobs.iter_mut().for_each(|s| *s = None);
        self.kept.iter_mut().for_each(BTreeMap::clear);
    }
}

/// Apply's view of the live database: point reads from [`ApplyCache`] where it holds them,
/// everything else (and every scan) from RocksDB.
pub(crate) struct ApplyView<'a> {
    pub(crate) live: ReadView<'a>,
    pub(crate) cache: &'a Mutex<ApplyCache>,
}

impl KvRead for ApplyView<'_> {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        if !follows(cf) {
            return self.live.get(cf, key);
        }
        let mut cache = lock(self.cache);
        if let Some(held) = cache.get(cf, key) {
            return Ok(held);
        }
        let value = self.live.get(cf, key)?;
        cache.read(cf, key, &value);
        Ok(value)
    }

    fn scan(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), KvError> {
        self.live.scan(cf, from, to, visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(n: u128) -> JobKey {
        n.to_be_bytes()
    }

    #[test]
    fn a_job_record_is_held_until_its_delete_or_another_record_of_its_slot_replaces_it() {
        let mut c = ApplyCache::default();
        let (a, b) = (job(7), job(7 + JOB_SLOTS as u128));
        assert_eq!(slot_of(&a), slot_of(&b), "the test needs two keys of one slot");
        let one = Some(b"one".to_vec());

        c.wrote(Cf::Jobs, &a, Change::of(one.clone(), true));
        assert_eq!(c.get(Cf::Jobs, &a), Some(one.clone()));
        // A read of a job record from the database is not kept: the table holds only
        // what apply wrote.
        c.read(Cf::Jobs, &b, &Some(b"read".to_vec()));
        assert_eq!(c.get(Cf::Jobs, &b), None);
        assert_eq!(c.get(Cf::Jobs, &a), Some(one.clone()));

        // A delete of another key of the slot leaves the record; its own delete clears it.
        c.wrote(Cf::Jobs, &b, Change::Delete);
        assert_eq!(c.get(Cf::Jobs, &a), Some(one));
        c.wrote(Cf::Jobs, &a, Change::Delete);
        assert_eq!(c.get(Cf::Jobs, &a), None);

        // A write of another key of the slot displaces it.
        c.wrote(Cf::Jobs, &a, Change::Put(b"two".to_vec()));
        c.wrote(Cf::Jobs, &b, Change::Put(b"three".to_vec()));
        assert_eq!(c.get(Cf::Jobs, &a), None);
        assert_eq!(c.get(Cf::Jobs, &b), Some(Some(b"three".to_vec())));

        // A record too large to keep, or a batch that keeps none, makes the slot forget its
        // key's older record.
        c.wrote(Cf::Jobs, &b, Change::of(Some(vec![0; MAX_VALUE + 1]), true));
        assert_eq!(c.get(Cf::Jobs, &b), None);
        c.wrote(Cf::Jobs, &b, Change::Put(b"four".to_vec()));
        c.wrote(Cf::Jobs, &b, Change::of(Some(b"five".to_vec()), false));
        assert_eq!(c.get(Cf::Jobs, &b), None);

        c.wrote(Cf::Jobs, &b, Change::Put(b"six".to_vec()));
        c.clear();
        assert_eq!(c.get(Cf::Jobs, &b), None);
        let jobs = Cf::Jobs.index();
        assert_eq!((c.hits[jobs], c.misses[jobs]), (4, 6));
    }

    #[test]
    fn a_small_key_is_kept_once_read_and_follows_every_write() {
        let mut c = ApplyCache::default();
        // Not read yet: its writes are not kept.
        c.wrote(Cf::Meta, b"floor/ready/q", Change::Put(b"k1".to_vec()));
        assert_eq!(c.get(Cf::Meta, b"floor/ready/q"), None);

        c.read(Cf::Meta, b"floor/ready/q", &Some(b"k1".to_vec()));
        assert_eq!(c.get(Cf::Meta, b"floor/ready/q"), Some(Some(b"k1".to_vec())));
        c.wrote(Cf::Meta, b"floor/ready/q", Change::Put(b"k2".to_vec()));
        assert_eq!(c.get(Cf::Meta, b"floor/ready/q"), Some(Some(b"k2".to_vec())));
        c.wrote(Cf::Meta, b"floor/ready/q", Change::Delete);
        assert_eq!(c.get(Cf::Meta, b"floor/ready/q"), Some(None), "known absent");

        // Absent when read is kept as absent, until written.
        c.read(Cf::Queues, b"q", &None);
        assert_eq!(c.get(Cf::Queues, b"q"), Some(None));
        c.wrote(Cf::Queues, b"q", Change::Put(b"meta".to_vec()));
        assert_eq!(c.get(Cf::Queues, b"q"), Some(Some(b"meta".to_vec())));
        // Forgotten (written with a value not kept), it is read from the database again.
        c.wrote(Cf::Queues, b"q", Change::Forget);
        assert_eq!(c.get(Cf::Queues, b"q"), None);
        assert_eq!(c.kept_len(), 1, "the floor is still kept");
        // The same bytes in another column family are another key.
        assert_eq!(c.get(Cf::DueHist, b"q"), None);

        // The store's own keys and the indexes' column families are never kept.
        c.read(Cf::Meta, b"raft/last_applied", &Some(b"x".to_vec()));
        c.read(Cf::Ready, b"r", &Some(Vec::new()));
        assert_eq!(c.get(Cf::Meta, b"raft/last_applied"), None);
        assert_eq!(c.get(Cf::Ready, b"r"), None);
    }

    #[test]
    fn the_kept_keys_are_bounded() {
        let mut c = ApplyCache::default();
        for i in 0..MAX_KEPT {
            c.read(Cf::DueHist, &i.to_be_bytes(), &Some(Vec::new()));
        }
        assert_eq!(c.kept_len(), MAX_KEPT);
        assert!(c.get(Cf::DueHist, &0usize.to_be_bytes()).is_some());
        // One more starts the table again empty.
        c.read(Cf::Meta, b"clock", &Some(b"1".to_vec()));
        assert_eq!(c.kept_len(), 1);
        assert_eq!(c.get(Cf::DueHist, &0usize.to_be_bytes()), None);
        assert_eq!(c.get(Cf::Meta, b"clock"), Some(Some(b"1".to_vec())));
    }
}
