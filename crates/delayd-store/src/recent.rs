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
//! answer. It is bounded by [`MAX_ENTRIES`] and [`MAX_BYTES`] of command payload.

use std::collections::VecDeque;

use delayd_core::Command;
use openraft::EntryPayload;

use crate::LogEntry;

/// Most entries kept. Apply and replication trail the last append by a few entries under
/// load; a thousand covers a pause of a second or more at the rates one node sustains.
pub(crate) const MAX_ENTRIES: usize = 1024;

/// Most command bytes kept (by [`Command::size_bytes`]), so large bodies cannot make the
/// window a second copy of the memtable.
pub(crate) const MAX_BYTES: usize = 32 << 20;

/// The window; see the module docs.
#[derive(Default)]
pub(crate) struct Recent {
    entries: VecDeque<(LogEntry, usize)>,
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
        self.entries.front().map(|(e, _)| e.log_id.index)
    }

    fn last_index(&self) -> Option<u64> {
        self.entries.back().map(|(e, _)| e.log_id.index)
    }

    /// Entries just written to the log, in index order.
    pub(crate) fn appended(&mut self, entries: Vec<LogEntry>) {
        for entry in entries {
            let index = entry.log_id.index;
            // An append that does not continue the window (the first after opening, or after
            // a purge emptied it) starts a new one: the window must stay contiguous.
            if self.last_index().is_some_and(|last| last.checked_add(1) != Some(index)) {
                self.clear();
            }
            let bytes = payload_bytes(&entry);
            self.bytes += bytes;
            self.entries.push_back((entry, bytes));
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
            if let Some((_, bytes)) = self.entries.pop_back() {
                self.bytes -= bytes;
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
        Some(self.entries.range(from..from + len).map(|(e, _)| e.clone()).collect())
    }

    fn pop_front(&mut self) {
        if let Some((_, bytes)) = self.entries.pop_front() {
            self.bytes -= bytes;
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

    fn entry(term: u64, index: u64, body: usize) -> LogEntry {
        publish_entry(term, index, vec![1; body])
    }

    fn indexes(entries: Option<Vec<LogEntry>>) -> Option<Vec<u64>> {
        entries.map(|es| es.iter().map(|e| e.log_id.index).collect())
    }

    #[test]
    fn serves_only_ranges_it_holds_whole() {
        let mut r = Recent::default();
        r.appended((5..=9).map(|i| entry(1, i, 10)).collect());
        assert_eq!(indexes(r.get(5, 10)), Some(vec![5, 6, 7, 8, 9]));
        assert_eq!(indexes(r.get(7, 9)), Some(vec![7, 8]));
        assert_eq!(indexes(r.get(4, 6)), None, "starts before the window");
        assert_eq!(indexes(r.get(8, 11)), None, "ends after the last entry");
        assert_eq!(indexes(r.get(7, 7)), None, "empty ranges are the caller's");
    }

    #[test]
    fn follows_truncation_purge_and_gaps() {
        let mut r = Recent::default();
        r.appended((1..=6).map(|i| entry(1, i, 10)).collect());
        r.truncated_from(5);
        assert_eq!(indexes(r.get(1, 5)), Some(vec![1, 2, 3, 4]));
        assert_eq!(r.get(5, 6), None);
        // A new leader's entries replace the truncated ones.
        r.appended(vec![entry(2, 5, 10)]);
        assert_eq!(r.get(5, 6).map(|es| es[0].log_id), Some(log_id::<TypeConfig>(2, 0, 5)));
        r.purged_upto(2);
        assert_eq!(r.get(2, 4), None);
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
    fn stays_within_its_bounds() {
        let mut r = Recent::default();
        let n = MAX_ENTRIES as u64 + 10;
        r.appended((1..=n).map(|i| entry(1, i, 0)).collect());
        assert_eq!(r.entries.len(), MAX_ENTRIES);
        assert_eq!(r.get(10, 11), None);
        assert!(r.get(11, n + 1).is_some());

        let mut r = Recent::default();
        let body = MAX_BYTES / 4;
        r.appended((1..=6).map(|i| entry(1, i, body)).collect());
        assert!(r.bytes <= MAX_BYTES, "{} bytes kept", r.bytes);
        assert_eq!(indexes(r.get(4, 7)), Some(vec![4, 5, 6]));
        assert_eq!(r.get(3, 4), None);
    }
}
