//! The one place where service errors become gRPC statuses, and the leader metadata every
//! answer carries.

use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Response, Status};

use crate::error::ServiceError;
use crate::service::Service;
use delayd_proto::v1 as pb;

/// Metadata key: the id of the node that answered.
pub const NODE_HEADER: &str = "x-delayd-node";
/// Metadata key: the id of the leader the answering node knows of.
pub const LEADER_HEADER: &str = "x-delayd-leader";
/// Metadata key: the leader's gRPC address, when known.
pub const LEADER_ADDR_HEADER: &str = "x-delayd-leader-addr";
/// Metadata key on errors: `no` when certainly nothing was written, so a retry is safe.
pub const WRITTEN_HEADER: &str = "x-delayd-written";

/// The gRPC status of a service error.
///
/// | service error | gRPC code |
/// |---|---|
/// | BadRequest | INVALID_ARGUMENT |
/// | TooLarge | INVALID_ARGUMENT — retrying the same body can never succeed, and generic retry policies treat RESOURCE_EXHAUSTED as transient |
/// | NotFound | NOT_FOUND |
/// | Conflict | FAILED_PRECONDITION — the job is not in the state the call needs (stale lease, wrong state); ABORTED would invite a blind retry |
/// | Unavailable | UNAVAILABLE |
/// | NotLeader | UNAVAILABLE with `x-delayd-leader` (when known) and `x-delayd-written: no` |
/// | Unauthenticated | UNAUTHENTICATED |
/// | Forbidden | PERMISSION_DENIED |
/// | RateLimited | RESOURCE_EXHAUSTED |
/// | Internal | INTERNAL |
pub fn status(e: &ServiceError) -> Status {
    let code = match e {
        ServiceError::BadRequest(_) | ServiceError::TooLarge(_) => Code::InvalidArgument,
        ServiceError::NotFound(_) => Code::NotFound,
        ServiceError::Conflict(_) => Code::FailedPrecondition,
        ServiceError::Unavailable(_) | ServiceError::NotLeader(_) => Code::Unavailable,
        ServiceError::Unauthenticated(_) => Code::Unauthenticated,
        ServiceError::Forbidden(_) => Code::PermissionDenied,
        ServiceError::RateLimited { .. } => Code::ResourceExhausted,
        ServiceError::Internal(_) => Code::Internal,
    };
    let mut s = Status::new(code, e.to_string());
    if let ServiceError::NotLeader(leader) = e {
        if let Some(id) = leader {
            s.metadata_mut().insert(LEADER_HEADER, MetadataValue::from(*id));
        }
        s.metadata_mut().insert(WRITTEN_HEADER, MetadataValue::from_static("no"));
    }
    s
}

/// A service error as a batch item's error.
pub(super) fn item_error(e: &ServiceError) -> pb::ErrorStatus {
    let s = status(e);
    pb::ErrorStatus { code: s.code() as i32, message: s.message().to_string() }
}

/// Adds the node's id and the leader it knows of, unless already set (a `NotLeader` error
/// names its own leader).
fn add_leader(service: &Service, meta: &mut MetadataMap) {
    meta.insert(NODE_HEADER, MetadataValue::from(service.config().node_id));
    let named = meta.get(LEADER_HEADER).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let leader = match named {
        Some(id) => Some((id, service.member_addr(id))),
        None => service.leader(),
    };
    if let Some((id, addr)) = leader {
        meta.insert(LEADER_HEADER, MetadataValue::from(id));
        if let Some(v) = addr.and_then(|a| MetadataValue::try_from(a).ok()) {
            meta.insert(LEADER_ADDR_HEADER, v);
        }
    }
}

/// A handler's result as a gRPC answer, with the leader metadata either way.
pub(super) fn answer<T>(
    service: &Service,
    r: Result<T, ServiceError>,
) -> Result<Response<T>, Status> {
    match r {
        Ok(t) => {
            let mut resp = Response::new(t);
            add_leader(service, resp.metadata_mut());
            Ok(resp)
        }
        Err(e) => Err(fail(service, &e)),
    }
}

/// A service error as the call's status, with the leader metadata.
pub(super) fn fail(service: &Service, e: &ServiceError) -> Status {
    if matches!(e, ServiceError::Internal(_) | ServiceError::Unavailable(_)) {
        tracing::warn!(error = %e, "gRPC request failed");
    }
    let mut s = status(e);
    add_leader(service, s.metadata_mut());
    s
}
