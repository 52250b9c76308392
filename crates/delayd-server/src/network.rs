//! # The Raft transport, client side: openraft's network over gRPC
//!
//! One [`GrpcNetwork`] serves a whole node. openraft clones it as its network factory and
//! asks it for one [`GrpcConnection`] per peer; the service keeps another clone to forward
//! requests to the leader ([`GrpcNetwork::forward`]). Every clone shares one cache of tonic
//! [`Channel`]s keyed by the peer's address (`BasicNode::addr`, `host:port`), so replication,
//! elections, snapshots and forwarding to a peer all ride on one HTTP/2 connection. Channels
//! connect lazily, on the first call, and reconnect by themselves after the peer restarts; a
//! connection attempt gives up after [`CONNECT_TIMEOUT`], and HTTP/2 keep-alive pings close a
//! connection whose peer vanished without a FIN (a partition), so the next call reconnects
//! instead of timing out forever on a dead socket.
//!
//! ## Wire format
//!
//! Each openraft call is one unary call of the `delayd.raft.v1.Raft` service
//! (`proto/raft.proto`). The request payload is openraft's own request, and the reply payload
//! is the receiver's whole `Result<Response, RaftError>`, both encoded with
//! [`delayd_core::codec`] (a version byte, then postcard). A Raft-level error on the receiver
//! (it stopped, its storage failed, a snapshot chunk arrived out of order) therefore travels
//! back as a value, and a gRPC status always means the transport failed.
//!
//! ## How failures reach openraft
//!
//! | what happened | openraft sees | openraft does |
//! |---|---|---|
//! | the receiver returned `Err(RaftError)` | [`RPCError::RemoteError`] | reports it |
//! | no connection: refused, reset, peer shutting down (`UNAVAILABLE`), bad address | [`RPCError::Unreachable`] | backs off ([`GrpcConnection`]'s `backoff`) |
//! | the peer speaks another protocol: `UNIMPLEMENTED`, `INVALID_ARGUMENT`, undecodable reply | [`RPCError::Unreachable`] | backs off: retrying at once cannot help |
//! | the deadline passed, or any other status | [`RPCError::Network`] | retries with the next heartbeat |
//! | an `AppendEntries` request above [`MAX_MESSAGE_BYTES`] | [`RPCError::PayloadTooLarge`] | resends fewer entries |
//!
//! ## Timeouts
//!
//! openraft passes each call its own time to live (the heartbeat interval for replication,
//! `election_timeout_min` for votes, `install_snapshot_timeout` for each snapshot chunk). It is sent as the gRPC deadline,
//! so the receiver abandons work nobody waits for, and enforced here as well.
//!
//! ## Caveats
//!
//! - Snapshot chunks share the connection with heartbeats. HTTP/2 interleaves them, but on a
//!   slow link a large chunk can still delay a heartbeat past its timeout.
//! - openraft's chunked snapshot transfer installs the snapshot while it answers the last
//!   chunk, so `install_snapshot_timeout` must cover installing the whole snapshot on the
//!   receiver, not just moving one chunk; otherwise the leader restarts the transfer.
//! - Only a connection that could not be opened is [`ForwardError::Unreachable`] (the call
//!   was never sent). A connection that breaks mid-call is a [`ForwardError::Status`], and a
//!   forwarded write may then have happened. openraft's calls are safe to repeat, so the
//!   Raft side does not need the distinction.
//! - A channel's background task runs on the tokio runtime that first used the address.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use delayd_core::codec::{decode, encode};
use delayd_proto::raft::internal_client::InternalClient;
use delayd_proto::raft::raft_client::RaftClient;
use delayd_proto::raft::{RaftReply, RaftRequest};
use delayd_store::{NodeId, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

/// The largest gRPC message a node sends or accepts, on both the client and the server side.
/// tonic's default of 4 MiB is smaller than a batch of log entries can be.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// How long one attempt to open a connection to a peer may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How often an HTTP/2 connection is pinged, and how long a ping may stay unanswered before
/// the connection is dropped.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(3);

/// The first and the longest pause after a peer was found unreachable.
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// An openraft transport error for an RPC whose remote error type is `E`.
type RpcError<E = openraft::error::Infallible> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

/// The node's gRPC client side: openraft's network factory and the forwarding client, over
/// one shared cache of channels. Cheap to clone; clones share the cache.
#[derive(Clone, Default)]
pub struct GrpcNetwork {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// The cluster credential every call carries (see [`crate::grpc::CLUSTER_HEADER`]).
    secret: Option<MetadataValue<Ascii>>,
}

/// Why [`GrpcNetwork::forward`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// No connection to the peer could be opened (or its address is invalid): the call was
    /// never sent, so retrying it elsewhere is safe.
    #[error("peer unreachable: {0}")]
    Unreachable(String),
    /// The call failed with this status: the peer handler's own status, a connection that
    /// broke mid-call, or `DEADLINE_EXCEEDED` when the timeout passed. Unless the handler
    /// answered, the call may or may not have run on the peer.
    #[error("forwarded call failed: {0}")]
    Status(Status),
}

impl GrpcNetwork {
    /// Creates a network with an empty channel cache.
    pub fn new() -> GrpcNetwork {
        GrpcNetwork::default()
    }

    /// A network whose calls carry `secret` as the cluster credential.
    pub fn with_secret(secret: &str) -> Result<GrpcNetwork, String> {
        let mut value: MetadataValue<Ascii> = secret
            .parse()
            .map_err(|_| "the cluster credential is not visible ASCII".to_string())?;
        value.set_sensitive(true);
        Ok(GrpcNetwork { secret: Some(value), ..GrpcNetwork::default() })
    }

    /// Adds the cluster credential to an outgoing request.
    fn sign<T>(&self, request: &mut tonic::Request<T>) {
        if let Some(v) = &self.secret {
            request.metadata_mut().insert(crate::grpc::CLUSTER_HEADER, v.clone());
        }
    }

    /// The cached channel to `addr`, creating it (unconnected) on first use. Fails only for an
    /// address that is not a valid URI authority.
    fn channel(&self, addr: &str) -> Result<Channel, String> {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(channel) = channels.get(addr) {
            return Ok(channel.clone());
        }
        let uri = if addr.contains("://") { addr.to_owned() } else { format!("http://{addr}") };
        let endpoint = Endpoint::from_shared(uri)
            .map_err(|e| format!("invalid peer address {addr:?}: {e}"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let channel = endpoint.connect_lazy();
        channels.insert(addr.to_owned(), channel.clone());
        Ok(channel)
    }

    /// Calls `Internal.Forward` on the node at `addr` with `payload` and returns the reply
    /// payload, giving up after `timeout` (also sent as the gRPC deadline).
    ///
    /// The payload is opaque here: the service defines the envelope and the peer's
    /// [`ForwardHandler`](crate::grpc::ForwardHandler) interprets it.
    pub async fn forward(
        &self,
        addr: &str,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, ForwardError> {
        let channel = self.channel(addr).map_err(ForwardError::Unreachable)?;
        let mut client = InternalClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let mut request = tonic::Request::new(RaftRequest { payload });
        request.set_timeout(timeout);
        self.sign(&mut request);
        match tokio::time::timeout(timeout, client.forward(request)).await {
            Ok(Ok(reply)) => Ok(reply.into_inner().payload),
            Ok(Err(status)) if delayd_proto::is_connect_failure(&status) => {
                Err(ForwardError::Unreachable(format!("{addr}: {}", status.message())))
            }
            Ok(Err(status)) => Err(ForwardError::Status(status)),
            Err(_) => Err(ForwardError::Status(Status::deadline_exceeded(format!(
                "no reply from {addr} within {timeout:?}"
            )))),
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for GrpcNetwork {
    type Network = GrpcConnection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> GrpcConnection {
        let client = self.channel(&node.addr).map(|channel| {
            RaftClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES)
        });
        GrpcConnection { target, node: node.clone(), client, network: self.clone() }
    }
}

/// openraft's connection to one peer: a client of the peer's `Raft` service on the shared
/// channel.
pub struct GrpcConnection {
    target: NodeId,
    node: BasicNode,
    /// The client, or why the peer's address cannot be used.
    client: Result<RaftClient<Channel>, String>,
    /// Signs each call with the cluster credential.
    network: GrpcNetwork,
}

/// The three methods of the `Raft` service.
#[derive(Clone, Copy, Debug)]
enum Method {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

impl GrpcConnection {
    /// Sends one encoded openraft request and decodes the receiver's `Result`.
    async fn call<T, E>(
        &self,
        method: Method,
        payload: Vec<u8>,
        option: &RPCOption,
    ) -> Result<T, RpcError<E>>
    where
        T: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let mut client = match &self.client {
            Ok(client) => client.clone(),
            Err(msg) => return Err(RPCError::Unreachable(Unreachable::new(&io_error(msg)))),
        };
        let ttl = option.hard_ttl();
        let mut request = tonic::Request::new(RaftRequest { payload });
        request.set_timeout(ttl);
        self.network.sign(&mut request);
        let call = async move {
            match method {
                Method::AppendEntries => client.append_entries(request).await,
                Method::Vote => client.vote(request).await,
                Method::InstallSnapshot => client.install_snapshot(request).await,
            }
        };
        let reply: RaftReply = match tokio::time::timeout(ttl, call).await {
            Ok(Ok(reply)) => reply.into_inner(),
            Ok(Err(status)) => return Err(status_error(status)),
            Err(_) => {
                let msg = format!("{method:?} to node {} got no reply within {ttl:?}", self.target);
                return Err(RPCError::Network(NetworkError::new(&io_error(&msg))));
            }
        };
        // A reply this build cannot read comes from a peer running an incompatible version:
        // retrying at once would fail the same way.
        let result: Result<T, RaftError<NodeId, E>> =
            decode(&reply.payload).map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        result.map_err(|e| {
            RPCError::RemoteError(RemoteError::new_with_node(self.target, self.node.clone(), e))
        })
    }
}

/// Maps a gRPC status of a Raft call to openraft's view of the failure (see the module docs).
fn status_error<E: std::error::Error>(status: Status) -> RpcError<E> {
    match status.code() {
        Code::Unavailable | Code::Unimplemented | Code::InvalidArgument => {
            RPCError::Unreachable(Unreachable::new(&status))
        }
        _ => RPCError::Network(NetworkError::new(&status)),
    }
}

fn io_error(msg: &str) -> std::io::Error {
    std::io::Error::other(msg.to_owned())
}

impl RaftNetwork<TypeConfig> for GrpcConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcError> {
        let payload = encode(&rpc);
        // The receiver would reject it; ask openraft to split the batch instead. A single
        // entry this large cannot be split and is sent anyway, to fail visibly.
        if payload.len() > MAX_MESSAGE_BYTES && rpc.entries.len() > 1 {
            let hint = (rpc.entries.len() / 2) as u64;
            return Err(RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(hint)));
        }
        self.call(Method::AppendEntries, payload, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcError<InstallSnapshotError>> {
        self.call(Method::InstallSnapshot, encode(&rpc), &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcError> {
        self.call(Method::Vote, encode(&rpc), &option).await
    }

    /// Exponential from 50 ms up to 1 s: an unreachable peer is most often one that is
    /// restarting, and it should be caught up within a second of coming back.
    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::successors(Some(BACKOFF_FIRST), |pause| {
            Some(pause.saturating_mul(2).min(BACKOFF_MAX))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::error::{Fatal, SnapshotMismatch};
    use openraft::{SnapshotSegmentId, Vote};

    fn rpc_option() -> RPCOption {
        RPCOption::new(Duration::from_millis(500))
    }

    /// An address where nothing listens: bind a port, then free it.
    async fn closed_addr() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr").to_string();
        drop(listener);
        addr
    }

    #[test]
    fn remote_errors_round_trip_through_the_codec() {
        let stopped: Result<VoteResponse<NodeId>, RaftError<NodeId>> =
            Err(RaftError::Fatal(Fatal::Stopped));
        let back: Result<VoteResponse<NodeId>, RaftError<NodeId>> =
            decode(&encode(&stopped)).expect("decode");
        assert_eq!(back, stopped);

        let mismatch: Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, _>> =
            Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(SnapshotMismatch {
                expect: SnapshotSegmentId { id: "1-2-3".into(), offset: 0 },
                got: SnapshotSegmentId { id: "1-2-3".into(), offset: 4096 },
            })));
        let back: Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> =
            decode(&encode(&mismatch)).expect("decode");
        assert_eq!(back, mismatch);
    }

    #[test]
    fn statuses_map_to_backoff_or_retry() {
        let unreachable = [Code::Unavailable, Code::Unimplemented, Code::InvalidArgument];
        for code in unreachable {
            let e: RpcError = status_error(Status::new(code, "x"));
            assert!(matches!(e, RPCError::Unreachable(_)), "{code:?}: {e}");
        }
        for code in [Code::DeadlineExceeded, Code::Cancelled, Code::Internal, Code::Unknown] {
            let e: RpcError = status_error(Status::new(code, "x"));
            assert!(matches!(e, RPCError::Network(_)), "{code:?}: {e}");
        }
    }

    #[test]
    fn backoff_grows_to_a_cap() {
        let conn = GrpcConnection {
            target: 1,
            node: BasicNode::new("127.0.0.1:1"),
            client: Err("unused".into()),
            network: GrpcNetwork::new(),
        };
        let pauses: Vec<Duration> = conn.backoff().take(30).collect();
        assert_eq!(pauses[0], BACKOFF_FIRST);
        assert!(pauses.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(pauses[29], BACKOFF_MAX);
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable() {
        let addr = closed_addr().await;
        let mut network = GrpcNetwork::new();
        let mut conn = network.new_client(2, &BasicNode::new(&addr)).await;
        let rpc = VoteRequest::new(Vote::new(1, 1), None);
        let err = conn.vote(rpc, rpc_option()).await.expect_err("unreachable");
        assert!(matches!(err, RPCError::Unreachable(_)), "{err}");

        let err = network
            .forward(&addr, vec![1], Duration::from_millis(500))
            .await
            .expect_err("unreachable");
        assert!(matches!(err, ForwardError::Unreachable(_)), "{err}");
    }

    #[tokio::test]
    async fn an_invalid_address_is_unreachable() {
        let mut network = GrpcNetwork::new();
        let mut conn = network.new_client(2, &BasicNode::new("not an address")).await;
        let rpc = VoteRequest::new(Vote::new(1, 1), None);
        let err = conn.vote(rpc, rpc_option()).await.expect_err("unreachable");
        assert!(matches!(err, RPCError::Unreachable(_)), "{err}");
    }

    #[tokio::test]
    async fn clones_share_one_channel_per_address() {
        let network = GrpcNetwork::new();
        let mut clone = network.clone();
        clone.new_client(2, &BasicNode::new("127.0.0.1:1")).await;
        clone.new_client(3, &BasicNode::new("127.0.0.1:1")).await;
        clone.new_client(4, &BasicNode::new("127.0.0.1:2")).await;
        assert_eq!(network.channels.lock().expect("lock").len(), 2);
    }
}
