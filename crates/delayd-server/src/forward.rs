//! Follower → leader forwarding: the envelope carried by the internal `Forward` RPC.
//!
//! Any node serves clients. Writes, read-index requests and membership changes that only the
//! leader can perform travel to it as a [`ForwardOp`]; the leader answers a [`ForwardReply`].
//! Errors travel as values so the follower can tell "not applied, safe to retry" (no leader,
//! not the leader any more) from everything else.

use std::collections::BTreeSet;

use delayd_core::{Command, Outcome};
use serde::{Deserialize, Serialize};

use crate::error::ServiceError;

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
    /// Report this node's view (not forwarded to the leader: asked of every member).
    Status,
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
    /// The operation failed.
    Failed(WireError),
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
}

/// A [`ServiceError`] on the wire.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WireError {
    /// Which variant.
    pub kind: u8,
    /// Its message.
    pub message: String,
    /// For "not the leader": the leader it names.
    pub leader: Option<u64>,
}

impl From<&ServiceError> for WireError {
    fn from(e: &ServiceError) -> Self {
        let (kind, message, leader) = match e {
            ServiceError::BadRequest(m) => (0, m.clone(), None),
            ServiceError::TooLarge(m) => (1, m.clone(), None),
            ServiceError::NotFound(m) => (2, m.clone(), None),
            ServiceError::Conflict(m) => (3, m.clone(), None),
            ServiceError::Unavailable(m) => (4, m.clone(), None),
            ServiceError::NotLeader(l) => (5, String::new(), *l),
            ServiceError::Internal(m) => (6, m.clone(), None),
            ServiceError::Unauthenticated(m) => (7, m.clone(), None),
            ServiceError::Forbidden(m) => (8, m.clone(), None),
            ServiceError::RateLimited(m) => (9, m.clone(), None),
        };
        WireError { kind, message, leader }
    }
}

impl From<WireError> for ServiceError {
    fn from(w: WireError) -> Self {
        match w.kind {
            0 => ServiceError::BadRequest(w.message),
            1 => ServiceError::TooLarge(w.message),
            2 => ServiceError::NotFound(w.message),
            3 => ServiceError::Conflict(w.message),
            4 => ServiceError::Unavailable(w.message),
            5 => ServiceError::NotLeader(w.leader),
            7 => ServiceError::Unauthenticated(w.message),
            8 => ServiceError::Forbidden(w.message),
            9 => ServiceError::RateLimited(w.message),
            _ => ServiceError::Internal(w.message),
        }
    }
}
