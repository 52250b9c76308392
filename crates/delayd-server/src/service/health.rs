//! Liveness, readiness and draining: what a load balancer, an orchestrator or a stopping
//! node needs to know about this node.
//!
//! - **Liveness** ([`Service::health`](super::Service::health)) is the process answering at
//!   all: `/health` answers 200 whatever the node's state, with that state in the body.
//! - **Readiness** ([`Service::readiness`]) is whether clients sent here are served now. A
//!   node is ready when it knows a leader and has heard from it within the leader's lease (a
//!   leader needs a quorum's acknowledgement within it: a leader cut off from its followers
//!   cannot commit, and a follower's silent leader may be gone), its applied state
//!   trails the cluster's commit index by at most `ready_max_lag` entries, it is not
//!   installing a snapshot, and it is not draining. `/ready` and gRPC's `grpc.health.v1`
//!   both report it, with the reason when it is not ready.
//! - **Draining** ([`Service::drain`]) is the first step of a graceful stop: the node stops
//!   reporting ready, every waiting long-poll is answered at once as having found nothing
//!   (lmstfy's 404 "no job available"), and new ones do not wait. A client therefore learns
//!   within milliseconds to go elsewhere instead of holding the stop up for up to 600 s.

use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::{Instant as _, ServerState};
use tokio::sync::watch;

use super::Service;

/// Why the node is not ready, for `/ready`'s 503 and the gRPC health status's log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotReady(pub String);

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The gRPC services whose health `grpc.health.v1` reports: the server as a whole (`""`) and
/// the client API, both with the node's readiness.
const GRPC_SERVICES: [&str; 2] = ["", "delayd.v1.Delayd"];

/// How often the gRPC health status is re-evaluated when nothing else wakes it: a follower
/// falling behind changes no watched value by itself.
const HEALTH_POLL: Duration = Duration::from_millis(250);

impl Service {
    /// Whether this node serves clients now; the reason when it does not.
    pub fn readiness(&self) -> Result<(), NotReady> {
        self.readiness_as(false)
    }

    /// [`Service::readiness`], and this node leads: what a load balancer that sends every
    /// client to the leader checks (`GET /ready?role=leader`). A follower serves every request
    /// too, but forwards each write to the leader, which on three nodes costs about as much
    /// CPU again as the write itself; clients sent to the leader skip that hop.
    pub fn leader_readiness(&self) -> Result<(), NotReady> {
        self.readiness_as(true)
    }

    fn readiness_as(&self, leader_only: bool) -> Result<(), NotReady> {
        let not = |why: String| Err(NotReady(why));
        if self.is_draining() {
            return not("the node is stopping".into());
        }
        let lease_ms = self.config().election_timeout_ms.1;
        let (state, leader, applied, committed, quorum_acked) = {
            let watch = self.cluster().raft().metrics();
            let m = watch.borrow_watched();
            (
                m.state,
                m.current_leader,
                m.last_applied.map_or(0, |l| l.index),
                m.cluster_committed.map_or(0, |l| l.index),
                m.last_quorum_acked,
            )
        };
        match state {
            ServerState::Leader => {
                // A leader's lease is renewed by every quorum acknowledgement; past it, the
                // followers may already have elected another.
                let fresh =
                    quorum_acked.is_some_and(|at| at.elapsed().as_millis() <= lease_ms.into());
                if !fresh && self.cluster().voters().len() > 1 {
                    return not("this node leads but no quorum has acknowledged it lately".into());
                }
            }
            ServerState::Shutdown => return not("the node is shut down".into()),
            _ => {
                let Some(leader) = leader else { return not("no leader is known".into()) };
                if leader_only {
                    return not(format!("this node does not lead (node {leader} does)"));
                }
                // openraft names a silent leader until another is elected, which without a
                // quorum never happens: what counts is having heard from it within its lease.
                let heard = self.cluster().since_leader_contact();
                if heard.is_none_or(|d| d.as_millis() > lease_ms.into()) {
                    let ago = heard.map_or("never".into(), |d| format!("{} ms ago", d.as_millis()));
                    return not(format!("last heard from leader {leader} {ago}"));
                }
            }
        }
        let lag = committed.saturating_sub(applied);
        let max = self.config().ready_max_lag;
        if lag > max {
            return not(format!(
                "{lag} committed entries are not applied here yet (at most {max})"
            ));
        }
        if self.cluster().reader().installing() {
            return not("a snapshot is being installed".into());
        }
        Ok(())
    }

    /// Starts draining: long-polls are answered at once and `/ready` says the node is
    /// stopping. There is no way back; the node is about to stop.
    pub fn drain(&self) {
        self.inner.drain.send_replace(true);
    }

    /// Whether [`Service::drain`] was called.
    pub fn is_draining(&self) -> bool {
        *self.inner.drain.borrow()
    }

    /// Watches the drain flag; it turns true once and stays so.
    pub(crate) fn drain_watch(&self) -> watch::Receiver<bool> {
        self.inner.drain.subscribe()
    }

    /// Reports [`Service::readiness`] through `reporter` (the `grpc.health.v1` service) until
    /// the node's Raft stops: at once when the node starts draining, else every
    /// [`HEALTH_POLL`] (a follower falling behind changes nothing that could wake it).
    pub(crate) async fn report_health(self, reporter: tonic_health::server::HealthReporter) {
        let mut drain = self.drain_watch();
        let mut last: Option<bool> = None;
        loop {
            if self.cluster().raft().metrics().borrow_watched().state == ServerState::Shutdown {
                return;
            }
            let ready = self.readiness();
            if last != Some(ready.is_ok()) {
                let status = match &ready {
                    Ok(()) => tonic_health::ServingStatus::Serving,
                    Err(why) => {
                        tracing::debug!(reason = %why, "gRPC health: not serving");
                        tonic_health::ServingStatus::NotServing
                    }
                };
                for name in GRPC_SERVICES {
                    reporter.set_service_status(name, status).await;
                }
                last = Some(ready.is_ok());
            }
            tokio::select! {
                _ = drain.changed() => {}
                _ = tokio::time::sleep(HEALTH_POLL) => {}
            }
        }
    }
}
