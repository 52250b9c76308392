//! The Raft network of a single-node cluster: there is no peer to talk to.
//!
//! openraft never sends an RPC when the membership has one voter, so every call answers
//! `Unreachable`; the gRPC transport replaces this when nodes gain peers.

use delayd_store::TypeConfig;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;

/// Network factory for a cluster of one.
#[derive(Clone, Default)]
pub struct SoloNetwork;

/// A connection that never connects.
pub struct NoPeer;

fn unreachable<E: std::error::Error>() -> RPCError<u64, BasicNode, E> {
    let e = std::io::Error::new(std::io::ErrorKind::NotConnected, "single-node cluster");
    RPCError::Network(NetworkError::new(&e))
}

impl RaftNetworkFactory<TypeConfig> for SoloNetwork {
    type Network = NoPeer;

    async fn new_client(&mut self, _target: u64, _node: &BasicNode) -> NoPeer {
        NoPeer
    }
}

impl RaftNetwork<TypeConfig> for NoPeer {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        Err(unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(unreachable())
    }
}
