//! Why a request failed, in the service's terms. Each front end turns a [`ServiceError`] into
//! its protocol's answer in exactly one place (`http/error.rs`, `grpc/status.rs`).

use delayd_core::Rejection;
use serde::Serialize;

/// Why a request failed. The message is meant for the client: it names the parameter, limit
/// or state at fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "kind", content = "message", rename_all = "snake_case")]
pub enum ServiceError {
    /// The request is malformed or violates a limit; nothing was written.
    #[error("{0}")]
    BadRequest(String),
    /// The request is over a size limit (body, bulk, entry); nothing was written.
    #[error("{0}")]
    TooLarge(String),
    /// The thing addressed does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with the current state (stale lease, wrong state).
    #[error("{0}")]
    Conflict(String),
    /// No leader could commit the request within its deadline; the message says whether the
    /// outcome is unknown.
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    /// This node is not the leader (the one it knows of, if any); nothing was proposed, so the
    /// request can be retried elsewhere. Resolved by forwarding before it reaches a client.
    #[error("this node is not the leader (leader: {0:?})")]
    NotLeader(Option<u64>),
    /// No credential, or one that is neither the admin token nor a namespace token.
    #[error("{0}")]
    Unauthenticated(String),
    /// A valid credential that does not open what was asked for.
    #[error("{0}")]
    Forbidden(String),
    /// The token's per-node rate limit is spent for now; one more request fits in its budget
    /// after `retry_after_ms`.
    #[error("{message}")]
    RateLimited {
        /// Which budget is spent.
        message: String,
        /// How long until the budget holds a request again, in ms.
        retry_after_ms: u64,
    },
    /// A bug or a storage failure.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ServiceError {
    /// A [`ServiceError::BadRequest`] with `message`.
    pub fn bad_request(message: impl Into<String>) -> ServiceError {
        ServiceError::BadRequest(message.into())
    }
}

impl From<Rejection> for ServiceError {
    fn from(r: Rejection) -> Self {
        match r {
            Rejection::JobNotFound => ServiceError::NotFound(r.to_string()),
            Rejection::LeaseNotCurrent | Rejection::WrongState(..) => {
                ServiceError::Conflict(r.to_string())
            }
            Rejection::Invalid(m) => ServiceError::BadRequest(m),
        }
    }
}

impl From<delayd_raft::ClusterError> for ServiceError {
    fn from(e: delayd_raft::ClusterError) -> Self {
        use delayd_raft::ClusterError as C;
        match e {
            C::BadRequest(m) => ServiceError::BadRequest(m),
            C::TooLarge(m) => ServiceError::TooLarge(m),
            C::NotLeader(l) => ServiceError::NotLeader(l),
            C::Unavailable(m) => ServiceError::Unavailable(m),
            C::Internal(m) => ServiceError::Internal(m),
        }
    }
}

impl From<delayd_core::KvError> for ServiceError {
    fn from(e: delayd_core::KvError) -> Self {
        ServiceError::Internal(e.to_string())
    }
}

impl From<delayd_store::StoreError> for ServiceError {
    /// As the cluster maps it: a snapshot install is a transient refusal, the rest a fault.
    fn from(e: delayd_store::StoreError) -> Self {
        delayd_raft::ClusterError::from(e).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use delayd_store::StoreError;

    #[test]
    fn a_read_during_a_snapshot_install_is_unavailable_not_internal() {
        let e = ServiceError::from(StoreError::Installing);
        assert!(matches!(&e, ServiceError::Unavailable(m) if m.contains("snapshot")), "{e:?}");
        let e = ServiceError::from(StoreError::Corrupt("x".into()));
        assert!(matches!(e, ServiceError::Internal(_)), "{e:?}");
    }

    #[test]
    fn errors_serialize_with_their_kind() {
        let e = ServiceError::bad_request("count must be 1 to 100");
        let json = serde_json::to_value(&e).expect("serializes");
        assert_eq!(json, serde_json::json!({"kind": "bad_request", "message": e.to_string()}));
    }
}
