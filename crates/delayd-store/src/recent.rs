//! The log's most recent entries, kept decoded in memory: [`Recent`].
//!
//! Every entry is read back soon after it is appended: on a leader by the replication
//! stream of each follower and by the state machine's apply, on a follower by its apply.
//! Read from RocksDB, each read costs an iterator, a memtable search and a decode of every
//! command, job bodies copied again. openraft's reads are almost all of the last few entries,
//! so the log store keeps them here as they are appended (an entry's commands are shared, see
//! [`delayd_core::Entry::commands`], so handing one out copies no body) and reads RocksDB only
//! for what has left the window: a follower far behind, a restart, a long replay.
//!
//! The window mirrors the tail of the stored log and nothing else: it holds a contiguous run
//! of indexes ending at the last appended entry, follows every truncation and purge, and
//! starts again from the appended entry whenever an append does not continue it. A range it
//! does not hold entirely is read from RocksDB, so it can only save work, never change an
//! answer. It is bounded by [`MAX_ENTRIES`] and [`MAX_BYTES`] of command payload and encoded
//! entries.
//!
//! Beside each entry it keeps the bytes the log stored for it: a leader sends every entry to
//! each follower, and a replication request built from these ([`Encoded`]) does not encode
//! the entry once more per follower.

use std::collections::VecDeque;
use std::sync::Arc;

use delayd_core::Command;
use openraft::EntryPayload;

use crate::{LogEntry, LogId};

/// An entry as the log stored it: [`delayd_core::codec`]'s version byte, then the entry's
/// postcard encoding.
pub(crate) type Encoded = Arc<Vec<u8>>;

/// Most entries kept. Apply and replication trail the last append by a few entries under
/// load; a thousand covers a pause of a second or more at the rates one node sustains.
pub(crate) const MAX_ENTRIES: usize = 1024;

/// Most bytes kept, commands (by [`Command::size_bytes`]) and encoded entries together, so
/// large bodies cannot make the window a second copy of the memtable.
pub(crate) const MAX_BYTES: usize = 32 << 20;

/// The window; see the module docs.
#[derive(Default)]
pub(crate) struct Recent {
    entries: VecDeque<Kept>,
    bytes: usize,
    /// On a follower: entries received from the leader and not yet appended, as they came
    /// on the wire, in index order (see [`Recent::received`]).
    received: VecDeque<(LogId, Encoded)>,
    received_bytes: usize,
}

/// An entry of the window, its stored bytes, and what it counts towards [`MAX_BYTES`].
struct Kept {
    entry: LogEntry,
    encoded: Encoded,
    bytes: usize,
}

fn payload_bytes(entry: &LogEntry) -> usize {
    match &entry.payload {
        EntryPayload::Normal(e) => e.commands.iter().map(Command::size_bytes).sum(),
        EntryPayload::Blank | EntryPayload::Membership(_) => 0,
    }
}

impl Recent {
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|k| k.entry.log_id.index)
    }

    fn last_index(&self) -> Option<u64> {
        self.entries.back().map(|k| k.entry.log_id.index)
    }

    /// Entries just written to the log, in index order, each with the bytes stored for it.
    pub(crate) fn appended(&mut self, entries: impl IntoIterator<Item = (LogEntry, Encoded)>) {
        for (entry, encoded) in entries {
            let index = entry.log_id.index;
            // An append that does not continue the window (the first after opening, or after
            // a purge emptied it) starts a new one: the window must stay contiguous.
            if self.last_index().is_some_and(|last| last.checked_add(1) != Some(index)) {
                self.clear();
            }
            let bytes = payload_bytes(&entry) + encoded.len();
            self.bytes += bytes;
            self.entries.push_back(Kept { entry, encoded, bytes });
        }
        while self.entries.len() > MAX_ENTRIES
            || (self.bytes > MAX_BYTES && !self.entries.is_empty())
        {
            self.pop_front();
        }
    }

    /// The log dropped every entry at or after `index`.
    pub(crate) fn truncated_from(&mut self, index: u64) {
        while self.last_index().is_some_and(|last| last >= index) {
            if let Some(kept) = self.entries.pop_back() {
                self.bytes -= kept.bytes;
            }
        }
    }

    /// The log dropped every entry at or before `index`.
    pub(crate) fn purged_upto(&mut self, index: u64) {
        while self.first_index().is_some_and(|first| first <= index) {
            self.pop_front();
        }
    }

    /// The entries with `start <= index < end`, if the window holds every one of them.
    pub(crate) fn get(&self, start: u64, end: u64) -> Option<Vec<LogEntry>> {
        let (first, last) = (self.first_index()?, self.last_index()?);
        if start < first || end > last.checked_add(1)? || start >= end {
            return None;
        }
        let from = usize::try_from(start - first).ok()?;
        let len = usize::try_from(end - start).ok()?;
        Some(self.entries.range(from..from + len).map(|k| k.entry.clone()).collect())
    }

    /// Entries a follower just received, each as its leader encoded it, for the append that
    /// stores them to take instead of encoding them again ([`Recent::take_received`]). Only
    /// the latest are held, within the window's own bounds: entries that never get appended
    /// (a resent request whose entries the log already holds) are pushed out by later ones.
    pub(crate) fn received(&mut self, entries: impl IntoIterator<Item = (LogId, Encoded)>) {
        for (log_id, encoded) in entries {
            self.received_bytes += encoded.len();
            self.received.push_back((log_id, encoded));
        }
        while self.received.len() > MAX_ENTRIES || self.received_bytes > MAX_BYTES {
            let Some((_, dropped)) = self.received.pop_front() else { break };
            self.received_bytes -= dropped.len();
        }
    }

    /// The bytes received for the entry `log_id` names, if they are held: a log id names one
    /// entry only (Raft's log matching), so they are that entry's. Held entries of lower
    /// indexes are dropped on the way: appends come in index order.
    pub(crate) fn take_received(&mut self, log_id: &LogId) -> Option<Encoded> {
        while let Some((held, _)) = self.received.front() {
            if held.index >= log_id.index {
                break;
            }
            self.pop_received();
        }
        if self.received.front().is_some_and(|(held, _)| held == log_id) {
            return self.pop_received();
        }
        None
    }

    fn pop_received(&mut self) -> Option<Encoded> {
        let (_, encoded) = self.received.pop_front()?;
        self.received_bytes -= encoded.len();
        Some(encoded)
    }

    /// The bytes stored for the entry `log_id` names, if the window holds that very entry
    /// (the same index proposed by the same leader).
    pub(crate) fn encoded(&self, log_id: &LogId) -> Option<Encoded> {
        let first = self.first_index()?;
        let at = usize::try_from(log_id.index.checked_sub(first)?).ok()?;
        let kept = self.entries.get(at)?;
        (kept.entry.log_id == *log_id).then(|| kept.encoded.clone())
    }

    fn pop_front(&mut self) {
        if let Some(kept) = self.entries.pop_front() {
            self.bytes -= kept.bytes;
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use openraft::testing::log_id;

    use super::*;
    use crate::test_entries::publish_entry;
    use crate::TypeConfig;

    fn entry(term: u64, index: u64, body: usize) -> (LogEntry, Encoded) {
        let entry = publish_entry(term, index, vec![1; body]);
        let encoded = Arc::new(delayd_core::codec::encode(&entry));
        (entry, encoded)
    }

    fn indexes(entries: Option<Vec<LogEntry>>) -> Option<Vec<u64>> {
        entries.map(|es| es.iter().map(|e| e.log_id.index).collect())
    }

    #[test]
    fn serves_only_ranges_it_holds_whole() {
        let mut r = Recent::default();
        r.appended((5..=9).map(|i| entry(1, i, 10)));
        assert_eq!(indexes(r.get(5, 10)), Some(vec![5, 6, 7, 8, 9]));
        assert_eq!(indexes(r.get(7, 9)), Some(vec![7, 8]));
        assert_eq!(indexes(r.get(4, 6)), None, "starts before the window");
        assert_eq!(indexes(r.get(8, 11)), None, "ends after the last entry");
        assert_eq!(indexes(r.get(7, 7)), None, "empty ranges are the caller's");
    }

    #[test]
    fn follows_truncation_purge_and_gaps() {
        let mut r = Recent::default();
        r.appended((1..=6).map(|i| entry(1, i, 10)));
        r.truncated_from(5);
        assert_eq!(indexes(r.get(1, 5)), Some(vec![1, 2, 3, 4]));
        assert_eq!(r.get(5, 6), None);
        // A new leader's entries replace the truncated ones.
        r.appended(vec![entry(2, 5, 10)]);
        assert_eq!(r.get(5, 6).map(|es| es[0].log_id), Some(log_id::<TypeConfig>(2, 0, 5)));
        // The bytes stored for an entry are handed out for that entry only: not for the
        // truncated entry of the same index, nor for an index the window lost.
        let stored = r.encoded(&log_id::<TypeConfig>(2, 0, 5)).expect("kept");
        assert_eq!(*stored, delayd_core::codec::encode(&entry(2, 5, 10).0));
        assert_eq!(r.encoded(&log_id::<TypeConfig>(1, 0, 5)), None);
        assert_eq!(r.encoded(&log_id::<TypeConfig>(1, 0, 6)), None);
        r.purged_upto(2);
        assert_eq!(r.get(2, 4), None);
        assert_eq!(r.encoded(&log_id::<TypeConfig>(1, 0, 2)), None);
        assert!(r.encoded(&log_id::<TypeConfig>(1, 0, 3)).is_some());
        assert_eq!(indexes(r.get(3, 6)), Some(vec![3, 4, 5]));
        // An append that skips ahead (after a snapshot) starts a new window.
        r.appended(vec![entry(2, 20, 10)]);
        assert_eq!(r.get(3, 4), None);
        assert_eq!(indexes(r.get(20, 21)), Some(vec![20]));
        r.purged_upto(30);
        assert_eq!(r.get(20, 21), None);
        assert_eq!(r.bytes, 0);
    }

    #[test]
    fn bytes_received_are_taken_for_their_own_entry_only() {
        let mut r = Recent::default();
        let id = |term, index| log_id::<TypeConfig>(term, 0, index);
        r.received((3..=6).map(|i| (id(1, i), entry(1, i, 10).1)));
        assert_eq!(r.take_received(&id(2, 3)), None, "another leader's entry 3");
        assert_eq!(r.take_received(&id(1, 4)).as_deref(), Some(&*entry(1, 4, 10).1));
        // Entry 3 was skipped: appends come in index order, so it is gone.
        assert_eq!(r.take_received(&id(1, 3)), None);
        assert_eq!(r.take_received(&id(1, 6)).as_deref(), Some(&*entry(1, 6, 10).1));
        assert_eq!(r.received_bytes, 0);
        assert!(r.received.is_empty());

        r.received((1..=(MAX_ENTRIES as u64 + 5)).map(|i| (id(1, i), entry(1, i, 0).1)));
        assert_eq!(r.received.len(), MAX_ENTRIES);
        assert_eq!(r.take_received(&id(1, 5)), None, "pushed out by later ones");
        assert!(r.take_received(&id(1, 6)).is_some());
    }

    #[test]
    fn stays_within_its_bounds() {
        let mut r = Recent::default();
        let n = MAX_ENTRIES as u64 + 10;
        r.appended((1..=n).map(|i| entry(1, i, 0)));
        assert_eq!(r.entries.len(), MAX_ENTRIES);
        assert_eq!(r.get(10, 11), None);
        assert!(r.get(11, n + 1).is_some());

        let mut r = Recent::default();
        // Each entry counts its commands and its stored bytes: about twice its body.
        let body = MAX_BYTES / 8;
        r.appended((1..=6).map(|i| entry(1, i, body)));
        assert!(r.bytes <= MAX_BYTES, "{} bytes kept", r.bytes);
        assert_eq!(indexes(r.get(4, 7)), Some(vec![4, 5, 6]));
        assert_eq!(r.get(3, 4), None);
    }
}
