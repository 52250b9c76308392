//! Generated gRPC types for delayd's internal Raft transport (see `proto/`).
#![allow(missing_docs, clippy::all)]

/// `delayd.raft.v1`: the node-to-node Raft service.
pub mod raft {
    tonic::include_proto!("delayd.raft.v1");
}
