//! A data directory written by delayd on openraft 0.9 (the previous release) opens unchanged:
//! the vote, the log entries, the applied state, the membership, the snapshot's metadata and
//! the jobs all decode.
//!
//! The fixture `tests/fixtures/openraft-0.9/` was written by a single `--dev` node of the
//! 0.9 build: three jobs published, a snapshot taken, two more published, then SIGTERM. Its
//! `jobs.txt` lists the five job ids in order; each body is the job's ordinal in English.

use std::path::Path;

use delayd_core::{query, JobId, QueueName};
use delayd_store::{LogEntry, Store};
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{EntryPayload, RaftLogReader};

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_data_directory_written_on_openraft_0_9_opens() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/openraft-0.9");
    let dir = tempfile::tempdir().expect("dir");
    copy_dir(&fixture.join("db"), &dir.path().join("db")).expect("copy db");
    copy_dir(&fixture.join("snapshots"), &dir.path().join("snapshots")).expect("copy snapshots");
    let ids: Vec<JobId> = std::fs::read_to_string(fixture.join("jobs.txt"))
        .expect("jobs.txt")
        .lines()
        .map(|l| l.parse().expect("job id"))
        .collect();
    assert_eq!(ids.len(), 5);

    let (mut log, mut sm) = Store::open(dir.path()).expect("the 0.9 directory opens");
    // That version kept the log in RocksDB; it is moved to files of its own on this start.
    assert!(dir.path().join("log").is_dir(), "the log was not moved to log/");

    let vote = log.read_vote().await.expect("vote").expect("a vote was saved");
    assert!(vote.committed, "the single node's vote was granted: {vote}");
    let state = log.get_log_state().await.expect("log state");
    let last = state.last_log_id.expect("a log");
    let entries: Vec<LogEntry> = log.try_get_log_entries(..).await.expect("every entry decodes");
    assert_eq!(entries.last().map(|e| e.log_id), Some(last));
    let publishes = entries
        .iter()
        .filter(|e| matches!(&e.payload, EntryPayload::Normal(d) if !d.commands.is_empty()))
        .count();
    assert!(publishes >= 2, "the log still holds the publishes after the snapshot");

    let (applied, membership) = sm.applied_state().await.expect("applied state");
    assert_eq!(applied, Some(last), "everything was applied before the stop");
    assert_eq!(membership.membership().voter_ids().collect::<Vec<_>>(), [1]);
    let snapshot = sm.get_current_snapshot().await.expect("snapshot").expect("one was taken");
    assert!(snapshot.meta.last_log_id.is_some_and(|s| s < last), "{:?}", snapshot.meta);
    assert_eq!(snapshot.meta.last_membership.membership(), membership.membership());

    let view = sm.read_view().expect("view");
    let queue = QueueName::new("ns", "q");
    for (id, body) in ids.iter().zip(["one", "two", "three", "four", "five"]) {
        let job = query::job(&view, &queue, *id).expect("read").expect("the job is there");
        assert_eq!(job.body, body.as_bytes());
    }
}
