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
