//! Log entries, and a copy of a data directory, for the crate's unit tests.

use std::fs;
use std::path::Path;

use delayd_core::{Command, Due, Entry, JobId, NewJob, QueueName, Target};
use openraft::testing::log_id;
use openraft::EntryPayload;

use crate::{LogEntry, TypeConfig};

/// Entry `index` of `term` (node 0), stamped at 1,000 ms, publishing job `index` with `body`
/// to the ready queue `ns/q`.
pub(crate) fn publish_entry(term: u64, index: u64, body: Vec<u8>) -> LogEntry {
    let job = NewJob {
        id: JobId(u128::from(index)),
        key: None,
        body,
        attributes: Default::default(),
        due: Due::After(0),
        ttl_ms: None,
        tries: 1,
        ttr_ms: 1000,
        priority: 0,
    };
    command_entry(term, index, Command::Publish { queue: QueueName::new("ns", "q"), job })
}

/// Entry `index` of `term` (node 0), stamped at 1,000 ms, cancelling job `id` of `ns/q`.
pub(crate) fn cancel_entry(term: u64, index: u64, id: u128) -> LogEntry {
    let target = Target::Id(JobId(id));
    command_entry(term, index, Command::Cancel { queue: QueueName::new("ns", "q"), target })
}

/// Entry `index` of `term` (node 0), stamped at 1,000 ms, carrying `command` alone.
fn command_entry(term: u64, index: u64, command: Command) -> LogEntry {
    openraft::Entry {
        log_id: log_id::<TypeConfig>(term, 0, index),
        payload: EntryPayload::Normal(Entry::new(1000, vec![command])),
    }
}

/// Copies the directory `from` to `to`, files as they are on disk: of an open store, what a
/// process killed at that moment would leave behind (nothing is flushed first).
pub(crate) fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("mkdir");
    for entry in fs::read_dir(from).expect("list") {
        let entry = entry.expect("entry");
        let dest = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_tree(&entry.path(), &dest);
        } else {
            fs::copy(entry.path(), dest).expect("copy");
        }
    }
}
