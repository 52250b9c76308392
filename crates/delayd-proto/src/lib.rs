//! Generated gRPC types for delayd's client API and internal Raft transport (see `proto/`).
#![allow(missing_docs, clippy::all)]

/// `delayd.raft.v1`: the node-to-node Raft service.
pub mod raft {
    tonic::include_proto!("delayd.raft.v1");
}

/// `delayd.v1`: the client API (publish, reserve, ack, ... and their streaming forms).
pub mod v1 {
    tonic::include_proto!("delayd.v1");
}

pub mod tls;

/// Whether tonic produced `status` because it could not open a connection (refused, timed
/// out, no route): then the call never left the caller, so nothing can have happened. A
/// status the peer sent has no such source. Shared by the node's transport and the client.
pub fn is_connect_failure(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if e.is::<tonic::ConnectError>() {
            return true;
        }
        source = e.source();
    }
    false
}
