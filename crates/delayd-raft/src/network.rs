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
//! (`proto/raft.proto`), except log replication. The request payload is openraft's own
//! request, and the reply payload is the receiver's whole `Result<Response, Error>`, both
//! encoded with [`delayd_core::codec`] (a version byte, then postcard). A Raft-level error on
//! the receiver (it stopped, its storage failed, a snapshot chunk arrived out of order)
//! therefore travels back as a value, and a gRPC status always means the transport failed.
//!
//! An AppendEntries request is encoded exactly so, but not always from scratch: each entry
//! the leader's log still holds among its latest ([`EncodedEntries`]) is copied from the bytes
//! the log stored for it, and the follower's server reads the request in parts and stores each
//! entry with the bytes it came in (`decode_append`). An entry is thus encoded once,
//! on the leader that proposed it, and not once more per follower and once more on each.
//!
//! ## Pipelined replication
//!
//! openraft replicates to each follower through one stream of AppendEntries requests
//! ([`RaftNetworkV2::stream_append`]), generated as the leader's log grows. Its default sends
//! a request, waits for the reply and only then sends the next: every entry then waits out a
//! round trip and the follower's fsync of the one before. Here the stream is one
//! bidirectional gRPC call (`Raft.StreamAppend`): requests go out as openraft produces them,
//! and the follower's `Raft::stream_append` answers each in order once it is on disk, so
//! replication is limited by the follower's disk and not by the round trip, and a message
//! costs one HTTP/2 DATA frame instead of a call's headers, trailers and stream set-up.
//! Ordering is the HTTP/2 stream's. A reply that does not come within the call's soft time
//! to live (at least [`STREAM_PATIENCE`]) while requests are outstanding ends the stream with
//! an error; openraft then opens another. A peer of an older build answers `UNIMPLEMENTED`:
//! the connection then falls back to unary calls for good.
//!
//! A request that only carries a new commit index waits up to [`crate::fold::COMMIT_HOLD`]
//! on the stream and is folded into the request that follows it; its answer is derived from
//! that request's ([`crate::fold`]). Under load a follower then receives and answers one
//! message per entry where it took two. The fault filter judges each message on the wire, so
//! a dropped or delayed message takes the requests folded into it along.
//!
//! Every request handed to the network, on a stream or in a call of its own, is counted in
//! [`ReplicationMetrics`] before the fault filter sees it.
//!
//! ## How failures reach openraft
//!
//! | what happened | openraft sees | openraft does |
//! |---|---|---|
//! | the receiver returned `Err(RaftError)` | [`RPCError::RemoteError`] | reports it |
//! | no connection: refused, reset, peer shutting down (`UNAVAILABLE`), bad address | [`RPCError::Unreachable`] | backs off ([`GrpcConnection`]'s `backoff`) |
//! | the peer speaks another protocol or refuses our credential: `UNIMPLEMENTED`, `INVALID_ARGUMENT`, `UNAUTHENTICATED`, undecodable reply | [`RPCError::Unreachable`] | backs off: retrying at once cannot help |
//! | the receiver's Raft has stopped (`Fatal`) | [`RPCError::Unreachable`] | backs off |
//! | the deadline passed, or any other status | [`RPCError::Network`] | retries with the next heartbeat |
//! | the fault filter (tests) dropped the call | [`RPCError::Unreachable`] | backs off |
//!
//! ## Timeouts
//!
//! openraft passes each call its own time to live (the heartbeat interval for replication,
//! the election timeout for votes, `install_snapshot_timeout` for a whole snapshot). It is
//! sent as the gRPC deadline, so the receiver abandons work nobody waits for, and enforced
//! here as well.
//!
//! ## Snapshots
//!
//! openraft 0.10 hands the network a whole snapshot (an open file). It travels as one
//! client-streaming call: a header with the leader's vote and the snapshot's metadata, then
//! the file in 1 MiB messages read as HTTP/2 flow control asks for them. The receiver writes
//! them to a file in its snapshot directory and installs it when the stream ends.
//!
//! ## Fault injection
//!
//! A [`FaultFilter`] (tests only) sees every outgoing call — Raft and forwarding alike — and
//! may pass, delay or drop it. The in-process cluster harness uses it to partition nodes and
//! slow links without processes or network namespaces.
//!
//! ## Caveats
//!
//! - Snapshot messages share the connection with heartbeats. HTTP/2 interleaves them, but on
//!   a slow link a large message can still delay a heartbeat past its timeout.
//! - `install_snapshot_timeout` must cover sending *and* installing the whole snapshot on the
//!   receiver; otherwise the leader starts the transfer again.
//! - Only a connection that could not be opened is [`ForwardError::Unreachable`] (the call
//!   was never sent). A connection that breaks mid-call is a [`ForwardError::Status`], and a
//!   forwarded write may then have happened. openraft's calls are safe to repeat, so the
//!   Raft side does not need the distinction.
//! - A channel's background task runs on the tokio runtime that first used the address.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use delayd_core::codec::{decode, encode, encode_more, encode_sized, take, VERSION};
use delayd_core::KvError;
use delayd_proto::raft::internal_client::InternalClient;
use delayd_proto::raft::raft_client::RaftClient;
use delayd_proto::raft::{RaftReply, RaftRequest};
use delayd_store::{
    EncodedEntries, LogEntry, LogId, NodeId, Snapshot, SnapshotData, TypeConfig, Vote,
};
use futures::StreamExt;
use openraft::base::{BoxFuture, BoxStream};
use openraft::error::{
    Fatal, NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::{stream_append_sequential, Backoff, RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, OptionalSend, RaftNetworkV2};
use serde::de::DeserializeOwned;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};

use crate::faults::{FaultFilter, Verdict};
use crate::fold::{fold_commits, stand_in_answer, Folded, Ledger, COMMIT_HOLD};
use crate::identity::Identity;
use crate::links::{Links, Watch};
use crate::metrics::ReplicationMetrics;
use crate::tls::{peer_connector, Tls};

/// The largest gRPC message a node sends or accepts, on both the client and the server side.
/// tonic's default of 4 MiB is smaller than a batch of log entries can be.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// How long one attempt to open a connection to a peer may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How often an HTTP/2 connection is pinged, and how long a ping may stay unanswered before
/// the connection is dropped.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(3);

/// The least time an append stream waits for its next reply while requests are outstanding.
/// openraft's time to live for a call is one heartbeat (75 ms by default), but a reply on a
/// pipelined stream comes after the follower has written everything sent before it: under a
/// burst of large entries that legitimately takes longer, and cutting the stream then would
/// only make the leader send it all again. Heartbeats travel on calls of their own, so a
/// patient stream does not delay failure detection; a dead connection is closed by HTTP/2
/// keep-alive.
const STREAM_PATIENCE: Duration = Duration::from_secs(2);

/// The first and the longest pause after a peer was found unreachable.
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The node's gRPC client side: openraft's network factory and the forwarding client, over
/// one shared cache of channels. Cheap to clone; clones share the cache.
#[derive(Clone, Default)]
pub struct GrpcNetwork {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// The cluster credential every call carries (see [`crate::server::CLUSTER_HEADER`]).
    secret: Option<MetadataValue<Ascii>>,
    /// This node's id, for the fault filter.
    me: NodeId,
    /// Tests: sees every outgoing call first.
    filter: Option<Arc<dyn FaultFilter>>,
    /// With TLS on, peers are reached over `https://` through [`peer_connector`].
    tls: Option<Arc<Tls>>,
    /// This node's cluster identity, carried on every call when it has one.
    identity: Identity,
    /// What replication puts on the wire.
    metrics: ReplicationMetrics,
    /// Which peers answer, for the log.
    links: Arc<Links>,
    /// The bytes this node's log stored for its latest entries, copied into replication
    /// requests instead of encoding each entry again for every follower.
    log: Option<EncodedEntries>,
}

/// Why [`GrpcNetwork::forward`] failed.
#[derive(Clone, Debug, thiserror::Error)]
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
    /// Creates the network of node `me` with an empty channel cache; every call carries
    /// `secret` as the cluster credential when there is one.
    pub fn new(me: NodeId, secret: Option<&str>) -> Result<GrpcNetwork, String> {
        let secret = match secret {
            Some(secret) => {
                let mut value: MetadataValue<Ascii> = secret
                    .parse()
                    .map_err(|_| "the cluster credential is not visible ASCII".to_string())?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        Ok(GrpcNetwork { secret, me, ..GrpcNetwork::default() })
    }

    /// Reaches peers over TLS with `tls`'s peer configuration (see [`crate::tls`]): the
    /// peer's certificate is verified against the peer CA for the host of its address.
    /// Applies to channels created afterwards.
    pub fn with_tls(mut self, tls: Option<Arc<Tls>>) -> GrpcNetwork {
        self.tls = tls;
        self
    }

    /// Builds replication requests from the bytes `log` stored for its entries, where it
    /// still holds them.
    pub fn with_log(mut self, log: EncodedEntries) -> GrpcNetwork {
        self.log = Some(log);
        self
    }

    /// Counts the AppendEntries requests sent into `metrics`.
    pub fn with_metrics(mut self, metrics: ReplicationMetrics) -> GrpcNetwork {
        self.metrics = metrics;
        self
    }

    /// Passes every outgoing call through `filter` first (tests).
    pub fn with_filter(mut self, filter: Option<Arc<dyn FaultFilter>>) -> GrpcNetwork {
        self.filter = filter;
        self
    }

    /// Applies the fault filter to a call to `to`: waits out a delay, or says why the call is
    /// dropped.
    async fn fault(&self, to: NodeId, method: Method) -> Result<(), String> {
        let Some(filter) = &self.filter else { return Ok(()) };
        match filter.check(self.me, to, method) {
            Verdict::Pass => Ok(()),
            Verdict::Delay(pause) => {
                tokio::time::sleep(pause).await;
                Ok(())
            }
            Verdict::Drop => Err(format!("{method:?} from node {} to node {to} dropped", self.me)),
        }
    }

    /// Carries `identity` on every call (see [`crate::identity`]).
    pub fn with_identity(mut self, identity: Identity) -> GrpcNetwork {
        self.identity = identity;
        self
    }

    /// Adds the cluster credential and identity to an outgoing request.
    fn sign<T>(&self, request: &mut tonic::Request<T>) {
        if let Some(v) = &self.secret {
            request.metadata_mut().insert(crate::server::CLUSTER_HEADER, v.clone());
        }
        if let Some(id) = self.identity.header() {
            request.metadata_mut().insert(crate::identity::CLUSTER_ID_HEADER, id);
        }
    }

    /// The cached channel to `addr`, creating it (unconnected) on first use. Fails only for an
    /// address that is not a valid URI authority.
    fn channel(&self, addr: &str) -> Result<Channel, String> {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(channel) = channels.get(addr) {
            return Ok(channel.clone());
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let uri = if addr.contains("://") { addr.to_owned() } else { format!("{scheme}://{addr}") };
        let endpoint = Endpoint::from_shared(uri)
            .map_err(|e| format!("invalid peer address {addr:?}: {e}"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let channel = match &self.tls {
            Some(tls) => endpoint.connect_with_connector_lazy(peer_connector(tls.clone())),
            None => endpoint.connect_lazy(),
        };
        channels.insert(addr.to_owned(), channel.clone());
        Ok(channel)
    }

    /// Calls `Internal.Forward` on node `to` at `addr` with `payload` and returns the reply
    /// payload, giving up after `timeout` (also sent as the gRPC deadline).
    ///
    /// The payload is opaque here: [`crate::forward`] defines the envelope.
    pub async fn forward(
        &self,
        to: NodeId,
        addr: &str,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, ForwardError> {
        let channel = self.channel(addr).map_err(ForwardError::Unreachable)?;
        self.fault(to, Method::Forward).await.map_err(ForwardError::Unreachable)?;
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
        GrpcConnection { target, client, network: self.clone(), unary_only: false }
    }
}

/// openraft's connection to one peer: a client of the peer's `Raft` service on the shared
/// channel.
pub struct GrpcConnection {
    target: NodeId,
    /// The client, or why the peer's address cannot be used.
    client: Result<RaftClient<Channel>, String>,
    /// Signs each call and applies the fault filter.
    network: GrpcNetwork,
    /// The peer does not serve `Raft.StreamAppend` (an older build): replicate with one
    /// unary call per request.
    unary_only: bool,
}

/// The unary methods of the `Raft` service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Log replication and heartbeats.
    AppendEntries,
    /// A real election's vote request.
    Vote,
    /// A Pre-Vote round's request.
    PreVote,
    /// A leadership hand-over.
    TransferLeader,
    /// A whole snapshot.
    InstallSnapshot,
    /// A forwarded client operation (`Internal.Forward`).
    Forward,
}

impl GrpcConnection {
    fn client(&self) -> Result<RaftClient<Channel>, RPCError<TypeConfig>> {
        match &self.client {
            Ok(client) => Ok(client.clone()),
            Err(msg) => Err(RPCError::Unreachable(Unreachable::new(&io_error(msg)))),
        }
    }

    /// Sends one encoded openraft request and decodes the receiver's answer, `Ok` or the
    /// receiver's Raft error.
    async fn call<T, E>(
        &self,
        method: Method,
        payload: Vec<u8>,
        option: &RPCOption,
    ) -> Result<Result<T, E>, RPCError<TypeConfig>>
    where
        T: DeserializeOwned,
        E: DeserializeOwned,
    {
        let mut client = self.client()?;
        let ttl = option.hard_ttl();
        let mut watch = Watch::new(self.network.links.clone(), self.target);
        if let Err(dropped) = self.network.fault(self.target, method).await {
            let dropped = io_error(&dropped);
            watch.failed(&dropped);
            return Err(RPCError::Unreachable(Unreachable::new(&dropped)));
        }
        let mut request = tonic::Request::new(RaftRequest { payload });
        request.set_timeout(ttl);
        self.network.sign(&mut request);
        let call = async move {
            match method {
                Method::AppendEntries => client.append_entries(request).await,
                Method::Vote => client.vote(request).await,
                Method::PreVote => client.pre_vote(request).await,
                _ => client.transfer_leader(request).await,
            }
        };
        let reply = match tokio::time::timeout(ttl, call).await {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) => Err(status_error(status)),
            Err(_) => {
                let msg = format!("{method:?} to node {} got no reply within {ttl:?}", self.target);
                Err(RPCError::Network(NetworkError::new(&io_error(&msg))))
            }
        };
        match &reply {
            Ok(_) => watch.answered(),
            Err(e) => watch.failed(e),
        }
        // A reply this build cannot read comes from a peer running an incompatible version:
        // retrying at once would fail the same way.
        decode(&reply?.payload).map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
    }

    /// A call whose receiver answers `Result<T, RaftError>`: a receiver that stopped (the only
    /// error those calls have) is as good as unreachable.
    async fn raft_call<T: DeserializeOwned>(
        &self,
        method: Method,
        payload: Vec<u8>,
        option: &RPCOption,
    ) -> Result<T, RPCError<TypeConfig>> {
        let result: Result<T, RaftError<TypeConfig>> = self.call(method, payload, option).await?;
        result.map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
    }
}

/// What [`RaftNetworkV2::stream_append`] returns: the stream of replies, or why it could not
/// be opened.
type AppendStreamResult<'s> = Result<
    BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
    RPCError<TypeConfig>,
>;

/// What the two halves of one append stream share.
#[derive(Default)]
struct StreamProgress {
    /// Requests handed to the transport.
    sent: AtomicU64,
    /// Which of them stand in for folded commit-only requests.
    folded: Ledger,
    /// The fault filter dropped a request: the stream ended early and must end in an error.
    dropped: AtomicBool,
}

/// The receiving half of an append stream.
struct Replies {
    replies: Streaming<RaftReply>,
    progress: Arc<StreamProgress>,
    received: u64,
    /// Answers ready to hand out: those derived for folded requests, then the real one.
    answered: VecDeque<Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
    /// How long a reply may take while a request is outstanding.
    patience: Duration,
    target: NodeId,
    /// Whether the peer answers, for the log (see [`Watch`]).
    watch: Watch,
}

impl GrpcConnection {
    /// Opens `Raft.StreamAppend` to the peer, sending `input` as openraft produces it.
    async fn open_append_stream<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> AppendStreamResult<'s>
    where
        S: futures::Stream<Item = AppendEntriesRequest<TypeConfig>>
            + OptionalSend
            + Unpin
            + 'static,
    {
        // openraft paces its retries to an unreachable peer (the backoff below) as it hands
        // out a stream's requests, and tonic polls the request stream only once connected: a
        // refused connection came back at once and was tried again at once, thousands of
        // times a second, while a follower was down. Taking openraft's first request before
        // connecting puts its pause before every attempt. Its own request, not the folded
        // one: folding may hold a commit-only request for up to `COMMIT_HOLD`, which opening
        // the stream would then wait out too.
        let mut input = input.peekable();
        if std::pin::Pin::new(&mut input).peek().await.is_none() {
            // Nothing to send: openraft ended the stream (replication cancelled or replaced).
            return Ok(Box::pin(futures::stream::empty()));
        }
        let mut client = self.client()?;
        let patience = option.soft_ttl().max(STREAM_PATIENCE);
        let target = self.target;
        let progress = Arc::new(StreamProgress::default());
        let input = fold_commits(input, COMMIT_HOLD);
        // The fault filter judges each request as it is sent: a link cut mid-stream ends it.
        let requests = futures::stream::unfold(
            (input, self.network.clone(), progress.clone()),
            move |(mut input, network, progress)| async move {
                let Folded { rpc, stands_for } = input.next().await?;
                network.metrics.sent(rpc.entries.len(), stands_for);
                if network.fault(target, Method::AppendEntries).await.is_err() {
                    progress.dropped.store(true, Ordering::Relaxed);
                    return None;
                }
                // Recorded before the request leaves, so before its answer can come.
                let seq = progress.sent.fetch_add(1, Ordering::Relaxed);
                progress.folded.record(seq, stands_for, rpc.prev_log_id);
                let payload = encode_append(&rpc, network.log.as_ref());
                Some((RaftRequest { payload }, (input, network, progress)))
            },
        );
        // No gRPC deadline: the call lives as long as this node leads and the peer answers.
        let mut request = tonic::Request::new(requests);
        self.network.sign(&mut request);
        // Every reply counts as an answer; openraft dropping the stream before one (a
        // heartbeat not answered in time) counts as a failed call.
        let mut watch = Watch::new(self.network.links.clone(), target);
        let replies = match tokio::time::timeout(patience, client.stream_append(request)).await {
            Ok(Ok(replies)) => replies.into_inner(),
            Ok(Err(status)) if status.code() == Code::Unimplemented => {
                // An older build answered.
                watch.answered();
                tracing::warn!(
                    peer = target,
                    "the peer does not serve streamed replication (an older build): \
                     replicating to it with one call per request"
                );
                self.unary_only = true;
                return Err(status_error(status));
            }
            Ok(Err(status)) => {
                watch.failed(&status);
                return Err(status_error(status));
            }
            Err(_) => {
                let msg = format!("no append stream to node {target} within {patience:?}");
                watch.failed(&msg);
                return Err(RPCError::Network(NetworkError::new(&io_error(&msg))));
            }
        };
        let state = Some(Replies {
            replies,
            progress,
            received: 0,
            answered: VecDeque::new(),
            patience,
            target,
            watch,
        });
        Ok(Box::pin(futures::stream::unfold(state, |state| async move {
            let mut state = state?;
            let item = state.next().await?;
            // The first error ends the stream.
            let more = item.is_ok().then_some(state);
            Some((item, more))
        })))
    }
}

impl Replies {
    /// The next reply in order; `None` once the follower ended the stream.
    async fn next(
        &mut self,
    ) -> Option<Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>> {
        if let Some(answer) = self.answered.pop_front() {
            return Some(answer);
        }
        loop {
            // Only a wait that began with a request outstanding may time out: between bursts
            // the stream is idle for as long as the leader has nothing to send.
            let waiting_for_reply = self.progress.sent.load(Ordering::Relaxed) > self.received;
            let reply = match tokio::time::timeout(self.patience, self.replies.message()).await {
                Ok(Ok(Some(reply))) => {
                    self.watch.answered();
                    reply
                }
                Ok(Ok(None)) if self.progress.dropped.load(Ordering::Relaxed) => {
                    let msg = format!("AppendEntries to node {} dropped", self.target);
                    self.watch.failed(&msg);
                    return Some(Err(RPCError::Unreachable(Unreachable::new(&io_error(&msg)))));
                }
                Ok(Ok(None)) if waiting_for_reply => {
                    // A stopping peer ends its streams with requests unanswered.
                    let msg = format!("node {} ended the stream unanswered", self.target);
                    self.watch.failed(&msg);
                    return None;
                }
                Ok(Ok(None)) => {
                    self.watch.answered();
                    return None;
                }
                Ok(Err(status)) => {
                    self.watch.failed(&status);
                    return Some(Err(status_error(status)));
                }
                Err(_) if waiting_for_reply => {
                    let msg = format!(
                        "AppendEntries to node {} got no reply within {:?}",
                        self.target, self.patience
                    );
                    self.watch.failed(&msg);
                    return Some(Err(RPCError::Network(NetworkError::new(&io_error(&msg)))));
                }
                Err(_) => continue,
            };
            let seq = self.received;
            self.received += 1;
            let result: Result<StreamAppendResult<TypeConfig>, Fatal<TypeConfig>> =
                match decode(&reply.payload) {
                    Ok(result) => result,
                    Err(e) => return Some(Err(RPCError::Unreachable(Unreachable::new(&e)))),
                };
            // A follower whose Raft stopped is as good as unreachable.
            let answer = result.map_err(|e| RPCError::Unreachable(Unreachable::new(&e)));
            // The requests this one stood in for are answered first, in their order. After an
            // error they get no answer: the stream ends with it.
            let folded = self.progress.folded.take(seq);
            if let (Some((stands_for, prev)), Ok(real)) = (folded, &answer) {
                let derived = stand_in_answer(real, prev);
                self.answered.extend((0..stands_for).map(|_| Ok(derived.clone())));
                self.answered.push_back(answer);
                return self.answered.pop_front();
            }
            return Some(answer);
        }
    }
}

/// An AppendEntries request, encoded as [`encode`] would, into one buffer sized for its
/// entries (a busy leader's request carries tens of kilobytes), with each entry the log still
/// holds copied from the bytes it stored rather than encoded again: every entry goes to every
/// follower, and encoding was some 4,500 instructions per job on a leader of three.
///
/// postcard writes a struct as its fields one after another and a sequence as its length
/// (a varint, as any `usize`) followed by its elements, so the request is its vote and
/// previous log id, the entries' count, each entry, then the commit index.
fn encode_append(rpc: &AppendEntriesRequest<TypeConfig>, log: Option<&EncodedEntries>) -> Vec<u8> {
    // The vote, the previous log id, the commit index and the entries' count.
    const HEADER: usize = 96;
    let Some(log) = log else {
        let entries: usize = rpc.entries.iter().map(delayd_store::log_entry_size_bytes).sum();
        return encode_sized(rpc, HEADER + entries);
    };
    // The stored bytes first, so that the buffer is sized from their lengths: an estimate
    // walks every command, and is needed only for the entries the log no longer holds.
    // Only what this build wrote is copied: the same version, so the same encoding.
    let stored: Vec<_> = rpc
        .entries
        .iter()
        .map(|e| log.get(&e.log_id).filter(|b| b.first() == Some(&VERSION)))
        .collect();
    let size: usize = rpc
        .entries
        .iter()
        .zip(&stored)
        .map(|(e, b)| b.as_ref().map_or_else(|| delayd_store::log_entry_size_bytes(e), |b| b.len()))
        .sum();
    let mut out = encode_sized(&(&rpc.vote, &rpc.prev_log_id), HEADER + size);
    out = encode_more(&rpc.entries.len(), out);
    for (entry, stored) in rpc.entries.iter().zip(stored) {
        match stored {
            Some(bytes) => out.extend_from_slice(&bytes[1..]),
            None => out = encode_more(entry, out),
        }
    }
    encode_more(&rpc.leader_commit, out)
}

/// Decodes an AppendEntries request as [`decode`] would and, when it was encoded with this
/// build's version, hands each entry's bytes to `log` for the append that stores the entries
/// (see [`EncodedEntries::received`]): the request is read in the parts [`encode_append`]
/// writes it in. Used by the server (`server.rs`) for every AppendEntries it receives.
pub(crate) fn decode_append(
    payload: &[u8],
    log: Option<&EncodedEntries>,
) -> Result<AppendEntriesRequest<TypeConfig>, KvError> {
    let Some(log) = log.filter(|_| payload.first() == Some(&VERSION)) else {
        return decode(payload);
    };
    let rest = &payload[1..];
    let ((vote, prev_log_id), mut rest) = take::<(Vote, Option<LogId>)>(rest)?;
    let (count, after) = take::<usize>(rest)?;
    rest = after;
    // Each entry takes at least a byte: a count beyond them is refused by the reads below,
    // and must not size the vectors first.
    let mut entries = Vec::with_capacity(count.min(rest.len()));
    let mut received = Vec::with_capacity(count.min(rest.len()));
    for _ in 0..count {
        let (entry, after) = take::<LogEntry>(rest)?;
        let bytes = &rest[..rest.len() - after.len()];
        received.push((entry.log_id, bytes));
        entries.push(entry);
        rest = after;
    }
    let (leader_commit, _) = take::<Option<LogId>>(rest)?;
    log.received(received);
    Ok(AppendEntriesRequest { vote, prev_log_id, entries, leader_commit })
}

/// Maps a gRPC status of a Raft call to openraft's view of the failure (see the module docs).
fn status_error(status: Status) -> RPCError<TypeConfig> {
    match status.code() {
        Code::Unavailable | Code::Unimplemented | Code::InvalidArgument | Code::Unauthenticated => {
            RPCError::Unreachable(Unreachable::new(&status))
        }
        _ => RPCError::Network(NetworkError::new(&status)),
    }
}

fn io_error(msg: &str) -> std::io::Error {
    std::io::Error::other(msg.to_owned())
}

/// How many bytes of a snapshot file travel in one message.
const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;

impl RaftNetworkV2<TypeConfig> for GrpcConnection {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.network.metrics.sent(rpc.entries.len(), 0);
        let payload = encode_append(&rpc, self.network.log.as_ref());
        self.raft_call(Method::AppendEntries, payload, &option).await
    }

    /// One `Raft.StreamAppend` call carries the whole stream (see the module docs).
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, AppendStreamResult<'s>>
    where
        S: futures::Stream<Item = AppendEntriesRequest<TypeConfig>>
            + OptionalSend
            + Unpin
            + 'static,
    {
        if self.unary_only {
            return stream_append_sequential(self, input, option);
        }
        let metrics = self.network.metrics.clone();
        Box::pin(async move {
            let opened = self.open_append_stream(input, option).await;
            if opened.is_err() {
                metrics.stream_failed();
            }
            opened
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.raft_call(Method::Vote, encode(&rpc), &option).await
    }

    /// Must not fall back to openraft's default (which grants): an unreachable peer is an
    /// error, so an isolated node never counts grants it did not get.
    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.raft_call(Method::PreVote, encode(&rpc), &option).await
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        let result: Result<TransferLeaderResponse<TypeConfig>, Fatal<TypeConfig>> =
            self.call(Method::TransferLeader, encode(&req), &option).await?;
        result.map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
    }

    /// Streams the snapshot file in [`SNAPSHOT_CHUNK_BYTES`] messages after a header with the
    /// vote and metadata; the receiver installs it when the stream ends and answers once.
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let mut client = self.client()?;
        if let Err(dropped) = self.network.fault(self.target, Method::InstallSnapshot).await {
            return Err(StreamingError::Unreachable(Unreachable::new(&io_error(&dropped))));
        }
        let ttl = option.hard_ttl();
        let Snapshot { meta, snapshot: file } = snapshot;
        let header = RaftRequest { payload: encode(&(vote, meta)) };
        // The file is read as the transport asks for more: the whole snapshot never sits in
        // memory. A read error ends the stream early; the receiver then refuses the
        // incomplete file when it verifies it.
        let chunks = futures::stream::unfold(Some(file), |file| async move {
            let mut file = file?;
            let mut buf = vec![0u8; SNAPSHOT_CHUNK_BYTES];
            match read_full(&mut file, &mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((RaftRequest { payload: buf }, Some(file)))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reading the snapshot to send failed");
                    None
                }
            }
        });
        let stream = futures::stream::once(async move { header }).chain(chunks);
        let mut request = tonic::Request::new(stream);
        request.set_timeout(ttl);
        self.network.sign(&mut request);
        let target = self.target;
        let reply = tokio::select! {
            r = tokio::time::timeout(ttl, client.install_snapshot(request)) => r,
            closed = cancel => return Err(StreamingError::Closed(closed)),
        };
        let reply = match reply {
            Ok(Ok(reply)) => reply.into_inner(),
            Ok(Err(status)) => return Err(status_error(status).into()),
            Err(_) => {
                let msg = format!("snapshot to node {target} not installed within {ttl:?}");
                return Err(StreamingError::Network(NetworkError::new(&io_error(&msg))));
            }
        };
        let result: Result<SnapshotResponse<TypeConfig>, Fatal<TypeConfig>> =
            decode(&reply.payload)
                .map_err(|e| StreamingError::Unreachable(Unreachable::new(&e)))?;
        result.map_err(|e| StreamingError::Unreachable(Unreachable::new(&e)))
    }

    /// Exponential from 50 ms up to 1 s: an unreachable peer is most often one that is
    /// restarting, and it should be caught up within a second of coming back.
    fn backoff(&self) -> Option<Backoff> {
        Some(Backoff::new(std::iter::successors(Some(BACKOFF_FIRST), |pause| {
            Some(pause.saturating_mul(2).min(BACKOFF_MAX))
        })))
    }
}

/// Reads until `buf` is full or the file ends; returns how many bytes were read.
async fn read_full(file: &mut SnapshotData, buf: &mut [u8]) -> std::io::Result<usize> {
    use tokio::io::AsyncReadExt;
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]).await? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rpc_option() -> RPCOption {
        RPCOption::new(Duration::from_millis(500))
    }

    fn vote_request() -> VoteRequest<TypeConfig> {
        VoteRequest::new(Vote::new(1, 1), None)
    }

    /// An address where nothing listens: bind a port, then free it.
    async fn closed_addr() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr").to_string();
        drop(listener);
        addr
    }

    fn network() -> GrpcNetwork {
        GrpcNetwork::new(1, None).expect("network")
    }

    #[test]
    fn remote_errors_round_trip_through_the_codec() {
        let stopped: Result<VoteResponse<TypeConfig>, RaftError<TypeConfig>> =
            Err(RaftError::Fatal(Fatal::Stopped));
        let back: Result<VoteResponse<TypeConfig>, RaftError<TypeConfig>> =
            decode(&encode(&stopped)).expect("decode");
        assert_eq!(back, stopped);
    }

    #[test]
    fn statuses_map_to_backoff_or_retry() {
        let unreachable =
            [Code::Unavailable, Code::Unimplemented, Code::InvalidArgument, Code::Unauthenticated];
        for code in unreachable {
            let e = status_error(Status::new(code, "x"));
            assert!(matches!(e, RPCError::Unreachable(_)), "{code:?}: {e}");
        }
        for code in [Code::DeadlineExceeded, Code::Cancelled, Code::Internal, Code::Unknown] {
            let e = status_error(Status::new(code, "x"));
            assert!(matches!(e, RPCError::Network(_)), "{code:?}: {e}");
        }
    }

    #[test]
    fn backoff_grows_to_a_cap() {
        let conn = GrpcConnection {
            target: 1,
            client: Err("unused".into()),
            network: network(),
            unary_only: false,
        };
        let pauses: Vec<Duration> = conn.backoff().expect("own backoff").take(30).collect();
        assert_eq!(pauses[0], BACKOFF_FIRST);
        assert!(pauses.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(pauses[29], BACKOFF_MAX);
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable() {
        let addr = closed_addr().await;
        let mut network = network();
        let mut conn = network.new_client(2, &BasicNode::new(&addr)).await;
        let err = conn.vote(vote_request(), rpc_option()).await.expect_err("unreachable");
        assert!(matches!(err, RPCError::Unreachable(_)), "{err}");
        // Pre-Vote must fail too, never be granted by default.
        let err = conn.pre_vote(vote_request(), rpc_option()).await.expect_err("unreachable");
        assert!(matches!(err, RPCError::Unreachable(_)), "{err}");

        let err = network
            .forward(2, &addr, vec![1], Duration::from_millis(500))
            .await
            .expect_err("unreachable");
        assert!(matches!(err, ForwardError::Unreachable(_)), "{err}");
    }

    /// A replication request built from the log's stored entries is byte for byte the
    /// request encoded whole, whichever of its entries the log still holds, and the follower
    /// decodes it as such.
    #[tokio::test]
    async fn a_request_built_from_the_stored_entries_is_the_request_encoded_whole() {
        use delayd_core::{Command, Due, Entry, JobId, NewJob, QueueName};
        use openraft::storage::{IOFlushed, RaftLogStorage};
        use openraft::testing::log_id;

        let dir = tempfile::tempdir().expect("tempdir");
        let (mut log, _sm) = delayd_store::Store::open(dir.path()).expect("store");
        let publish = |index: u64, body: usize| {
            let job = NewJob {
                id: JobId(u128::from(index) << 70 | 0xabc),
                key: Some(format!("key-{index}")),
                body: vec![0x5a; body],
                attributes: [("a".to_string(), "b".repeat(index as usize))].into(),
                due: Due::After(index * 1000),
                ttl_ms: Some(u64::MAX / 3),
                tries: 3,
                ttr_ms: 30_000,
                priority: 7,
            };
            let queue = QueueName::new("ns", format!("q{index}"));
            openraft::Entry {
                log_id: log_id::<TypeConfig>(4, 2, index),
                payload: openraft::EntryPayload::Normal(Entry::new(
                    1_700_000_000_000 + index,
                    vec![Command::Publish { queue, job }, Command::Tick { limit: 9 }],
                )),
            }
        };
        let stored: Vec<_> = (1..=5).map(|i| publish(i, 100 * i as usize)).collect();
        log.append(stored.clone(), IOFlushed::noop()).await.expect("append");
        let encoded = log.encoded_entries();
        assert!(encoded.get(&log_id::<TypeConfig>(4, 2, 3)).is_some(), "the log keeps its tail");

        let blank = openraft::Entry {
            log_id: log_id::<TypeConfig>(4, 2, 6),
            payload: openraft::EntryPayload::Blank,
        };
        // An entry of the same index from another leader is encoded, not copied.
        let mut other_leader = publish(2, 7);
        other_leader.log_id = log_id::<TypeConfig>(5, 1, 2);
        let requests = [
            stored.clone(),
            vec![stored[1].clone(), other_leader, stored[3].clone()],
            vec![stored[4].clone(), blank],
            Vec::new(),
        ];
        for entries in requests {
            let rpc = AppendEntriesRequest::<TypeConfig> {
                vote: Vote::new_committed(4, 2),
                prev_log_id: entries.first().map(|_| log_id::<TypeConfig>(4, 2, 0)),
                leader_commit: Some(log_id::<TypeConfig>(4, 2, 1)),
                entries,
            };
            let built = encode_append(&rpc, Some(&encoded));
            assert_eq!(built, encode(&rpc));
            assert_eq!(encode_append(&rpc, None), built);
            let back: AppendEntriesRequest<TypeConfig> = decode(&built).expect("decodes");
            assert_eq!(back.entries, rpc.entries);
        }
    }

    /// openraft waits out its backoff while it hands a stream its next request, so a stream
    /// must take its first request before it dials: a refused connection that came back
    /// without it was dialled again at once, in a tight loop, while a follower was down.
    #[tokio::test]
    async fn a_stream_takes_its_first_request_before_it_dials() {
        let addr = closed_addr().await;
        let mut network = network();
        let mut conn = network.new_client(2, &BasicNode::new(&addr)).await;
        let polled = Arc::new(AtomicBool::new(false));
        let flag = polled.clone();
        let input = futures::stream::once(async move {
            flag.store(true, Ordering::SeqCst);
            AppendEntriesRequest {
                vote: Vote::new_committed(1, 1),
                prev_log_id: None,
                leader_commit: None,
                entries: Vec::new(),
            }
        })
        .boxed();
        let Err(err) = conn.stream_append(input, rpc_option()).await else {
            panic!("a closed port accepted a stream");
        };
        assert!(matches!(err, RPCError::Unreachable(_)), "{err}");
        assert!(polled.load(Ordering::SeqCst), "dialled before openraft handed over a request");

        // A stream openraft ends before its first request (replication cancelled) dials
        // nothing and ends at once.
        let replies = conn.stream_append(futures::stream::empty(), rpc_option()).await;
        let Ok(mut replies) = replies else { panic!("an empty stream dialled the closed port") };
        assert!(replies.next().await.is_none());
    }

    #[tokio::test]
    async fn an_invalid_address_is_unreachable() {
        let mut network = network();
        let mut conn = network.new_client(2, &BasicNode::new("not an address")).await;
        let err = conn.vote(vote_request(), rpc_option()).await.expect_err("unreachable");
        assert!(matches!(err, RPCError::Unreachable(_)), "{err}");
    }

    #[tokio::test]
    async fn clones_share_one_channel_per_address() {
        let network = network();
        let mut clone = network.clone();
        clone.new_client(2, &BasicNode::new("127.0.0.1:1")).await;
        clone.new_client(3, &BasicNode::new("127.0.0.1:1")).await;
        clone.new_client(4, &BasicNode::new("127.0.0.1:2")).await;
        assert_eq!(network.channels.lock().expect("lock").len(), 2);
    }

    #[tokio::test]
    async fn the_fault_filter_drops_calls_before_they_are_sent() {
        let faults = Arc::new(crate::faults::Faults::default());
        faults.cut(1, 2);
        let mut network = network().with_filter(Some(faults.clone()));
        // A listening address: only the filter can make these fail.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let mut conn = network.new_client(2, &BasicNode::new(&addr)).await;
        let err = conn.vote(vote_request(), rpc_option()).await.expect_err("dropped");
        assert!(matches!(&err, RPCError::Unreachable(_)) && err.to_string().contains("dropped"));
        let err = network
            .forward(2, &addr, vec![1], Duration::from_millis(500))
            .await
            .expect_err("dropped");
        assert!(matches!(err, ForwardError::Unreachable(_)), "{err}");
    }
}
