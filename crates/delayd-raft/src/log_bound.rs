//! Keeps the Raft log's files within `snapshot_log_bytes`.
//!
//! openraft builds a snapshot every `snapshot_logs` entries and then purges all but the last
//! `keep_logs` of those the snapshot covers: a bound in entries. An entry may be up to
//! `max_entry_bytes` (4 MiB by default), so bulk publishes of bodies that do not compress
//! could fill gigabytes of log before the first snapshot. This task watches the size of the
//! log's files and, once it passes the bound, first purges everything the last snapshot
//! covers (the `keep_logs` entries too: a follower that needed them catches up from the
//! snapshot instead), then, if that is not enough, builds a snapshot so that the next purge
//! can go further. Each node does this for its own log.
//!
//! The bound is soft: the log grows on while a snapshot builds (a build writes the whole
//! state, seconds for millions of jobs), and by up to a second between two looks.

use std::time::Duration;

use delayd_store::{Raft, StateReader};
use openraft::async_runtime::watch::WatchReceiver;
use tokio::sync::watch;

use crate::metrics::ReplicationMetrics;

/// How often the task looks at the log's size: a look holds the log's lock for one
/// subtraction, and a second of writes is what the bound may overshoot by.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// What a node over its log bound does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Within the bound, or nothing can be done yet (no entry applied since the snapshot).
    Nothing,
    /// Purge the log up to this index, the last one the snapshot covers.
    Purge(u64),
    /// Build a snapshot of everything applied, so that a purge can go further.
    Snapshot,
}

/// The log's files hold `disk_bytes` against a bound of `limit`; `applied`, `snapshot` and
/// `purged` are the last log indexes applied, covered by the latest snapshot and purged.
pub(crate) fn next_step(
    disk_bytes: u64,
    limit: u64,
    applied: Option<u64>,
    snapshot: Option<u64>,
    purged: Option<u64>,
) -> Step {
    if disk_bytes <= limit {
        return Step::Nothing;
    }
    match snapshot {
        // The cheap step first: the entries kept behind the snapshot for slow followers.
        Some(s) if purged < Some(s) => Step::Purge(s),
        _ if applied > snapshot => Step::Snapshot,
        _ => Step::Nothing,
    }
}

/// Runs until `shutdown`, or until the log has closed. Each step taken is counted in
/// `metrics` once, however many looks repeat it while openraft carries it out.
pub(crate) async fn run(
    raft: Raft,
    reader: StateReader,
    limit: u64,
    metrics: ReplicationMetrics,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last = Step::Nothing;
    let mut looks = tokio::time::interval(LOOK_EVERY);
    looks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = looks.tick() => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        let Some(disk_bytes) = reader.log_disk_bytes() else { return };
        if disk_bytes <= limit {
            continue;
        }
        let step = {
            let metrics = raft.metrics();
            let m = metrics.borrow_watched();
            next_step(
                disk_bytes,
                limit,
                m.last_applied.map(|l| l.index),
                m.snapshot.map(|l| l.index),
                m.purged.map(|l| l.index),
            )
        };
        // A step repeats while openraft carries it out (a purge waits for replication to
        // leave the entries, a build takes seconds): counted and logged once.
        let fresh = step != last;
        last = step;
        if fresh && step != Step::Nothing {
            metrics.log_bound_acted(step == Step::Snapshot);
            tracing::info!(disk_bytes, limit, ?step, "the log's files passed snapshot_log_bytes");
        }
        let done = match step {
            Step::Nothing => Ok(()),
            Step::Purge(upto) => raft.trigger().purge_log(upto).await,
            // openraft ignores the trigger while a build is under way.
            Step::Snapshot => raft.trigger().snapshot().await,
        };
        if let Err(e) = done {
            // Raft has stopped: so has this task's purpose.
            tracing::debug!(error = %e, "log bound: raft stopped");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_follows_from_the_log_size_and_where_snapshot_and_purge_stand() {
        // (disk bytes against a bound of 100, applied, snapshot, purged) → step.
        let cases = [
            // Within the bound, nothing happens.
            ((100, Some(50), Some(10), Some(0)), Step::Nothing),
            ((0, Some(50), None, None), Step::Nothing),
            // Over it, the entries kept behind the snapshot go first, purged or not yet
            // (openraft's own purge keeps `keep_logs` entries).
            ((101, Some(50), Some(40), Some(30)), Step::Purge(40)),
            ((101, Some(50), Some(40), None), Step::Purge(40)),
            // Purged up to the snapshot, or no snapshot yet: a new one is built.
            ((101, Some(50), Some(40), Some(40)), Step::Snapshot),
            ((101, Some(50), None, None), Step::Snapshot),
            // Nothing applied since the snapshot: nothing to do.
            ((101, Some(40), Some(40), Some(40)), Step::Nothing),
            ((101, None, None, None), Step::Nothing),
        ];
        for ((disk, applied, snapshot, purged), want) in cases {
            let got = next_step(disk, 100, applied, snapshot, purged);
            assert_eq!(
                got, want,
                "{disk} bytes, applied {applied:?}, snapshot {snapshot:?}, purged {purged:?}"
            );
        }
    }
}
