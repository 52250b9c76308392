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

/// How often the task looks at the log's size: a look is a lock of the log and a read of two
/// numbers, and a second of writes is what the bound may overshoot by.
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
        let Some(log) = reader.log_flushes() else { return };
        if log.disk_bytes <= limit {
            continue;
        }
        let step = {
            let metrics = raft.metrics();
            let m = metrics.borrow_watched();
            next_step(
                log.disk_bytes,
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
            tracing::info!(
                disk_bytes = log.disk_bytes,
                limit,
                ?step,
                "the log's files passed snapshot_log_bytes"
            );
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
    fn within_the_bound_nothing_happens() {
        assert_eq!(next_step(100, 100, Some(50), Some(10), Some(0)), Step::Nothing);
        assert_eq!(next_step(0, 100, Some(50), None, None), Step::Nothing);
    }

    #[test]
    fn over_the_bound_the_entries_kept_behind_the_snapshot_go_first() {
        assert_eq!(next_step(101, 100, Some(50), Some(40), Some(30)), Step::Purge(40));
        // Nothing purged yet (openraft's own purge keeps `keep_logs` entries).
        assert_eq!(next_step(101, 100, Some(50), Some(40), None), Step::Purge(40));
    }

    #[test]
    fn over_the_bound_with_the_log_purged_to_the_snapshot_a_new_one_is_built() {
        assert_eq!(next_step(101, 100, Some(50), Some(40), Some(40)), Step::Snapshot);
        // No snapshot at all yet.
        assert_eq!(next_step(101, 100, Some(50), None, None), Step::Snapshot);
    }

    #[test]
    fn over_the_bound_with_nothing_applied_since_the_snapshot_there_is_nothing_to_do() {
        assert_eq!(next_step(101, 100, Some(40), Some(40), Some(40)), Step::Nothing);
        assert_eq!(next_step(101, 100, None, None, None), Step::Nothing);
    }
}
