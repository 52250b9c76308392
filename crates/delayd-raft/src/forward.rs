//! Follower → leader forwarding: the envelope carried by the internal `Forward` RPC.
//!
//! Any node serves clients. Writes, read-index requests and membership changes that only the
//! leader can perform travel to it as a [`ForwardOp`]; the leader answers a [`ForwardReply`].
//! Errors travel as values ([`ClusterError`], serialized as it is) so the follower can tell
//! "not applied, safe to retry" (no leader, not the leader any more) from everything else.

use std::collections::BTreeSet;

use delayd_core::{Command, Outcome};
use serde::{Deserialize, Serialize};

use crate::error::ClusterError;

/// An operation forwarded to the leader.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ForwardOp {
    /// Propose these commands in one entry.
    Propose(Vec<Command>),
    /// Confirm leadership and return the log index a linearizable read must wait for.
    ReadIndex,
    /// Add a learner.
    AddLearner {
        /// Node id.
        id: u64,
        /// Its gRPC address.
        addr: String,
    },
    /// Make a learner a voter.
    Promote {
        /// Node id.
        id: u64,
    },
    /// Remove a node (voter or learner).
    Remove {
        /// Node id.
        id: u64,
    },
    /// Hand leadership to this voter, or to the most caught-up one.
    TransferLeader {
        /// Node id; `None`: the leader chooses.
        to: Option<u64>,
    },
    /// Report this node's view (not forwarded to the leader: asked of every member).
    Status,
    /// Several operations in one call, served concurrently and answered in order by a
    /// [`ForwardReply::Batch`] (see [`crate::relay`]). Batches do not nest.
    Batch(Vec<ForwardOp>),
}

/// The answer to a [`ForwardOp`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ForwardReply {
    /// Outcomes of a `Propose`.
    Outcomes(Vec<Outcome>),
    /// Index to wait for before reading.
    ReadIndex(Option<u64>),
    /// A membership change took effect; the new voters.
    Members(BTreeSet<u64>),
    /// A node's view, for cluster status.
    Status(NodeStatus),
    /// Leadership moved: the new leader.
    Leader(u64),
    /// The operation failed.
    Failed(ClusterError),
    /// The answers to a [`ForwardOp::Batch`], in its order.
    Batch(Vec<ForwardReply>),
}

/// One node's own report of where it is.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Node id.
    pub id: u64,
    /// Leader, Follower, Candidate or Learner.
    pub state: String,
    /// Current term.
    pub term: u64,
    /// The leader this node knows of.
    pub leader: Option<u64>,
    /// Last log index.
    pub last_log_index: Option<u64>,
    /// Last applied index.
    pub last_applied: Option<u64>,
    /// Index of the last snapshot.
    pub snapshot: Option<u64>,
    /// Index up to which the log was purged.
    pub purged: Option<u64>,
    /// Where the node serves its owner's protocols ([`crate::ClusterConfig::services`]).
    pub services: std::collections::BTreeMap<String, String>,
}
