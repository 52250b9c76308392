//! # The schedule pump: the leader fires due occurrences of recurring jobs
//!
//! Like the timer pump, it runs on every node and works only while the node leads. It
//! sleeps until the earliest next occurrence in the schedule index (or until an applied
//! entry changes the schedules), then proposes that occurrence's firing through the service
//! (`service/schedules.rs`): the job(s) to publish, keyed `{name}@{occurrence_ms}`, and the
//! next occurrence. The state machine fires an occurrence only if it is still the
//! schedule's next one, so a retry or a deposed leader's late proposal publishes nothing
//! twice, and a new leader simply resumes from the index.

use std::time::Duration;

use delayd_raft::cluster::until_leading;
use openraft::async_runtime::watch::WatchReceiver;
use openraft::ServerState;

use crate::error::ServiceError;
use crate::service::Service;

/// The longest sleep without looking at the index again.
const MAX_SLEEP: Duration = Duration::from_secs(60);
/// How long the pump pauses after a firing could not be committed (leaders changing).
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// After this many failures in a row that are not about leadership, the occurrence is
/// skipped, so that one schedule cannot hold up every other.
const MAX_FAILURES: u32 = 3;

/// The pump: runs until the node's Raft stops.
pub(crate) async fn run(service: Service) {
    let mut raft = service.raft_watch();
    // Consecutive failures to fire the index's head other than leaders changing.
    let mut failures = 0;
    // Each round starts as the leader: a node that lost leadership waits here.
    while until_leading(&mut raft).await {
        let sleep = match service.next_schedule().await {
            Ok(Some((at, queue, name))) => {
                let now = service.now_ms();
                if at <= now {
                    let skip = failures >= MAX_FAILURES;
                    match service.fire_schedule(queue.clone(), name.clone(), at, now, skip).await {
                        Ok(n) => {
                            if skip {
                                tracing::warn!(%queue, name, at, "schedule could not fire; skipped");
                            }
                            tracing::debug!(%queue, name, at, jobs = n, "schedule fired");
                            failures = 0;
                        }
                        Err(e) => {
                            // Leaders changing is retried for as long as it lasts; anything
                            // else counts towards skipping the occurrence.
                            if !matches!(
                                e,
                                ServiceError::Unavailable(_) | ServiceError::NotLeader(_)
                            ) {
                                failures += 1;
                            }
                            tracing::debug!(%queue, name, error = %e, "schedule not fired");
                            tokio::time::sleep(RETRY_PAUSE).await;
                        }
                    }
                    continue;
                }
                Duration::from_millis(at - now).min(MAX_SLEEP)
            }
            Ok(None) => MAX_SLEEP,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the schedule index");
                RETRY_PAUSE
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = service.schedule_changes().notified() => {}
            _ = raft.wait_until(|m| m.state != ServerState::Leader) => {}
        }
    }
}
