//! The cluster, for its operator: every member's view, membership changes, leadership
//! transfer, snapshots, a digest of the replicated state, the node's metrics and (in tests)
//! its clock.
//!
//! Any node answers; membership changes are carried out by the leader (forwarded there) and
//! go through openraft's joint consensus.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher;

use delayd_core::{Cf, KvRead};
use delayd_raft::cluster::ServerWatch;
use delayd_raft::{ForwardOp, NodeStatus};
use futures::future::join_all;
use openraft::async_runtime::watch::WatchReceiver;

use super::auth::{Principal, Scope};
use super::validate::node_id;
use super::Service;
use crate::error::ServiceError;

/// The cluster as one node sees it.
#[derive(Clone, Debug)]
pub struct ClusterView {
    /// The node that answered.
    pub node_id: u64,
    /// The leader it knows of.
    pub leader: Option<u64>,
    /// Its current term.
    pub term: u64,
    /// The voters of the membership.
    pub voters: Vec<u64>,
    /// The learners of the membership.
    pub learners: Vec<u64>,
    /// Every member, with its own view when it could be reached.
    pub members: Vec<Member>,
}

/// One member of the cluster.
#[derive(Clone, Debug)]
pub struct Member {
    /// Its id.
    pub id: u64,
    /// Its gRPC address.
    pub addr: String,
    /// Whether it votes.
    pub voter: bool,
    /// Its own view, or why it could not be had.
    pub status: Result<NodeStatus, ServiceError>,
    /// How many entries its applied index trails the newest log index seen among members.
    pub lag: Option<u64>,
    /// On a leader: the last log index known to match the leader's.
    pub matched_index: Option<Option<u64>>,
}

/// A digest of the replicated state, equal on replicas at the same applied index.
#[derive(Clone, Copy, Debug)]
pub struct Digest {
    /// The index it was taken at.
    pub applied_index: Option<u64>,
    /// The hash of every key and value of the job state.
    pub digest: u64,
    /// How many keys it covers.
    pub entries: u64,
}

/// A membership change.
#[derive(Clone, Debug)]
pub enum MemberChange {
    /// Adds a non-voting member that starts receiving the log.
    AddLearner {
        /// Its id.
        id: u64,
        /// Its gRPC address, `host:port`.
        addr: String,
    },
    /// Makes a learner a voter.
    Promote(u64),
    /// Removes a member.
    Remove(u64),
}

impl Service {
    /// This node's own view; needs no credential (it is the liveness check).
    pub fn health(&self) -> NodeStatus {
        self.cluster().status()
    }

    /// The leader this node knows of, with its gRPC address when the membership names it.
    pub fn leader(&self) -> Option<(u64, Option<String>)> {
        // Every gRPC answer asks: read the watched metrics in place, never a copy of them.
        let watch = self.cluster().raft().metrics();
        let m = watch.borrow_watched();
        let id = m.current_leader?;
        Some((id, m.membership_config.membership().get_node(&id).map(|n| n.addr.clone())))
    }

    /// The gRPC address of member `id`, when the membership names it.
    pub fn member_addr(&self, id: u64) -> Option<String> {
        let watch = self.cluster().raft().metrics();
        let m = watch.borrow_watched();
        m.membership_config.membership().get_node(&id).map(|n| n.addr.clone())
    }

    /// Watches this node's Raft state, for the tasks that work only while it leads.
    pub(crate) fn raft_watch(&self) -> ServerWatch {
        self.cluster().server_watch()
    }

    /// Completes when the node's Raft has stopped: long-polls and streams must end then.
    pub async fn stopped(&self) {
        let mut server = self.cluster().server_watch();
        // Ends with an error once Raft has stopped and dropped its end of the watch.
        while server.changed().await.is_ok() {}
    }

    /// Where each member of the cluster serves the client protocols (`http`, `disque`,
    /// `beanstalk`), by node id: this node's from its configuration, the others' by asking
    /// them. A member that does not answer within half a second is left out. Open to every
    /// caller: Disque clients ask before they authenticate (`HELLO`).
    pub async fn member_services(&self) -> Vec<(u64, BTreeMap<String, String>)> {
        let cluster = self.cluster();
        let m = cluster.metrics();
        let nodes: Vec<(u64, String)> =
            m.membership_config.membership().nodes().map(|(id, n)| (*id, n.addr.clone())).collect();
        let me = self.config().node_id;
        let asked = join_all(nodes.iter().map(|(id, addr)| async move {
            if *id == me {
                Some((*id, self.config().services()))
            } else {
                cluster.peer_status(*id, addr).await.ok().map(|s| (*id, s.services))
            }
        }))
        .await;
        asked.into_iter().flatten().collect()
    }

    /// Every member's view, asked of each in parallel.
    pub async fn cluster_view(&self, caller: &Principal) -> Result<ClusterView, ServiceError> {
        self.authorize(caller, Scope::Admin)?;
        let cluster = self.cluster();
        let m = cluster.metrics();
        let membership = m.membership_config.membership();
        let voters: Vec<u64> = membership.voter_ids().collect();
        let learners: Vec<u64> = membership.learner_ids().collect();
        let nodes: Vec<(u64, String)> =
            membership.nodes().map(|(id, n)| (*id, n.addr.clone())).collect();
        let me = self.config().node_id;
        let views = join_all(nodes.iter().map(|(id, addr)| async move {
            if *id == me {
                Ok(cluster.status())
            } else {
                cluster.peer_status(*id, addr).await.map_err(ServiceError::from)
            }
        }))
        .await;
        let newest = views.iter().flatten().filter_map(|s| s.last_log_index).max();
        let members = nodes
            .into_iter()
            .zip(views)
            .map(|((id, addr), status)| {
                let lag = status
                    .as_ref()
                    .ok()
                    .and_then(|s| newest.map(|n| n.saturating_sub(s.last_applied.unwrap_or(0))));
                // The leader's own account of how far each follower's log matches its own.
                let matched_index =
                    m.replication.as_ref().and_then(|r| r.get(&id)).map(|l| l.map(|l| l.index));
                Member { id, addr, voter: voters.contains(&id), status, lag, matched_index }
            })
            .collect();
        Ok(ClusterView {
            node_id: me,
            leader: m.current_leader,
            term: m.current_term,
            voters,
            learners,
            members,
        })
    }

    /// Changes the membership; returns the voters after the change.
    pub async fn change_members(
        &self,
        caller: &Principal,
        change: MemberChange,
    ) -> Result<BTreeSet<u64>, ServiceError> {
        self.authorize(caller, Scope::Admin)?;
        let op = match change {
            MemberChange::AddLearner { id, addr } => {
                if !addr.contains(':') {
                    return Err(ServiceError::bad_request("addr=host:port (gRPC) is required"));
                }
                ForwardOp::AddLearner { id: node_id(id)?, addr }
            }
            MemberChange::Promote(id) => ForwardOp::Promote { id: node_id(id)? },
            MemberChange::Remove(id) => ForwardOp::Remove { id: node_id(id)? },
        };
        Ok(self.cluster().change_members(op).await?)
    }

    /// Hands leadership to voter `to` (`None`: the most caught-up voter) and answers the new
    /// leader once it leads.
    pub async fn transfer_leader(
        &self,
        caller: &Principal,
        to: Option<u64>,
    ) -> Result<u64, ServiceError> {
        self.authorize(caller, Scope::Admin)?;
        let to = to.map(node_id).transpose()?;
        Ok(self.cluster().transfer_leader(to).await?)
    }

    /// Triggers a snapshot of this node's state machine.
    pub async fn snapshot(&self, caller: &Principal) -> Result<(), ServiceError> {
        self.authorize(caller, Scope::Admin)?;
        Ok(self.cluster().snapshot().await?)
    }

    /// A digest of the whole replicated state with the index it was taken at, read from one
    /// consistent view: replicas at the same index must have the same digest.
    pub fn digest(&self, caller: &Principal) -> Result<Digest, ServiceError> {
        self.authorize(caller, Scope::Admin)?;
        let view = self.cluster().reader().read_view()?;
        digest_of(&view)
    }

    /// Every metric of the node in Prometheus' text format. Needs the admin token unless
    /// metrics are public, in which case the credential is not even looked at. Blocking: it
    /// reads RocksDB.
    pub async fn metrics_text(&self, credential: Option<&str>) -> Result<String, ServiceError> {
        if !self.config().auth.metrics_open() {
            let caller = self.authenticate(credential).await?;
            self.authorize(&caller, Scope::Metrics)?;
        }
        let service = self.clone();
        tokio::task::spawn_blocking(move || service.metrics().render(service.cluster()))
            .await
            .map_err(|e| ServiceError::Internal(format!("metrics task: {e}")))?
    }

    /// This node's clock: `(offset from the wall clock, now)` in ms.
    pub fn clock(&self, caller: &Principal) -> Result<(i64, u64), ServiceError> {
        self.authorize(caller, Scope::Admin)?;
        self.debug_clock_enabled()?;
        let clock = self.cluster().clock();
        Ok((clock.offset_ms(), clock.now_ms()))
    }

    /// Shifts this node's wall clock by `offset_ms` (negative: behind), within a day either
    /// way. Only with the `debug_clock` setting: chaos tests inject clock skew with it.
    pub fn set_clock(
        &self,
        caller: &Principal,
        offset_ms: i64,
    ) -> Result<(i64, u64), ServiceError> {
        self.authorize(caller, Scope::Admin)?;
        self.debug_clock_enabled()?;
        // A day either way is far more skew than any test needs, and keeps the arithmetic safe.
        if offset_ms.unsigned_abs() > 86_400_000 {
            return Err(ServiceError::bad_request("offset_ms must be within ±86400000"));
        }
        self.cluster().shift_clock(offset_ms);
        tracing::warn!(offset_ms, "debug clock offset set");
        Ok((offset_ms, self.cluster().clock().now_ms()))
    }

    fn debug_clock_enabled(&self) -> Result<(), ServiceError> {
        if self.config().debug_clock {
            Ok(())
        } else {
            Err(ServiceError::NotFound("api not found".into()))
        }
    }
}

/// The digest of the state `view` shows: what [`Service::digest`] answers, and what a backup
/// taken from the same view reports.
pub(crate) fn digest_of(view: &delayd_store::ReadView<'_>) -> Result<Digest, ServiceError> {
    let applied_index = view.last_applied()?.map(|l| l.index);
    let mut hash = std::collections::hash_map::DefaultHasher::new();

    let mut entries = 0u64;
    for cf in Cf::ALL {
        view.scan(cf, &[], &[], &mut |k, v| {
            // The store's own bookkeeping (last applied, membership) is not job state.
            if !(cf == Cf::Meta && k.starts_with(b"raft/")) {
                hash.write_u8(cf as u8);
                hash.write_usize(k.len());
                hash.write(k);
                hash.write_usize(v.len());
                hash.write(v);
                entries += 1;
            }
            true
        })?;
    }
    Ok(Digest { applied_index, digest: hash.finish(), entries })
}
