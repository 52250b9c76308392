//! The cluster layer's error: one type, serializable, so a forwarded request's failure reaches
//! the follower that forwarded it exactly as the leader saw it.

use delayd_store::TypeConfig;
use openraft::error::{ClientWriteError, RaftError};
use serde::{Deserialize, Serialize};

/// Why a cluster operation failed.
///
/// It crosses the wire as it is (inside [`ForwardReply`](crate::forward::ForwardReply)), so a
/// variant added here is understood by every node of the same version; an older node decoding
/// an unknown variant fails the decode, which the forwarder reports as unavailable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ClusterError {
    /// The request is invalid for the cluster as it is (a membership change that cannot be
    /// made, a transfer to a node that is not a voter); the message names the problem.
    #[error("{0}")]
    BadRequest(String),
    /// The request's commands cannot fit one log entry; nothing was written.
    #[error("{0}")]
    TooLarge(String),
    /// This node is not the leader (the one it knows of, if any); nothing was proposed, so
    /// the request can be retried elsewhere. Forwarding resolves it before a client sees it.
    #[error("this node is not the leader (leader: {0:?})")]
    NotLeader(Option<u64>),
    /// No leader could serve the request in time, the node is overloaded or stopping; the
    /// message says whether anything may have been written.
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    /// A bug, a storage failure, or a peer that answered something this node cannot read.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<delayd_store::StoreError> for ClusterError {
    /// A snapshot install makes the replica unreadable for its duration: that is a transient
    /// refusal (retry, or ask another node), not a fault. Anything else from storage is.
    fn from(e: delayd_store::StoreError) -> Self {
        match e {
            delayd_store::StoreError::Installing => ClusterError::Unavailable(
                "this node is installing a snapshot from the leader and cannot read its state \
                 right now; retry shortly or ask another node"
                    .into(),
            ),
            e => ClusterError::Internal(e.to_string()),
        }
    }
}

impl From<RaftError<TypeConfig, ClientWriteError<TypeConfig>>> for ClusterError {
    /// A write (an entry, a membership change) openraft refused or could not finish.
    fn from(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> Self {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                ClusterError::NotLeader(f.leader_id)
            }
            // An invalid membership change (unknown learner, a change already in progress).
            RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
                ClusterError::BadRequest(e.to_string())
            }
            // The entry was appended here, then replaced by a new leader's log: it may still
            // have been committed through that leader.
            RaftError::APIError(e) => {
                ClusterError::Unavailable(format!("{e}; the outcome is unknown"))
            }
            RaftError::Fatal(f) => ClusterError::Unavailable(format!("raft stopped: {f}")),
        }
    }
}

impl From<delayd_core::KvError> for ClusterError {
    fn from(e: delayd_core::KvError) -> Self {
        ClusterError::Internal(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use delayd_core::codec;
    use delayd_store::StoreError;

    #[test]
    fn every_error_crosses_the_wire_unchanged() {
        let all = [
            ClusterError::BadRequest("b".into()),
            ClusterError::TooLarge("t".into()),
            ClusterError::NotLeader(Some(3)),
            ClusterError::NotLeader(None),
            ClusterError::Unavailable("u".into()),
            ClusterError::Internal("i".into()),
        ];
        for e in all {
            let back: ClusterError = codec::decode(&codec::encode(&e)).expect("decode");
            assert_eq!(back, e);
        }
    }

    #[test]
    fn a_read_during_a_snapshot_install_is_unavailable_not_internal() {
        let e = ClusterError::from(StoreError::Installing);
        assert!(matches!(&e, ClusterError::Unavailable(m) if m.contains("snapshot")), "{e:?}");
        let e = ClusterError::from(StoreError::Corrupt("x".into()));
        assert!(matches!(e, ClusterError::Internal(_)), "{e:?}");
    }
}
