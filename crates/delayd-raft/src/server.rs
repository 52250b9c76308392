//! # The Raft transport, server side: the node's internal gRPC services
//!
//! Every node serves two services from `proto/raft.proto` on its internal address (the
//! address its peers know as `BasicNode::addr`):
//!
//! - `Raft` hands openraft's messages to the local [`Raft`] node: each request payload is
//!   openraft's own request and each reply payload is the node's whole `Result`, both in
//!   [`delayd_core::codec`]'s encoding (see [`network`](crate::network) for the client side
//!   and how errors are mapped). A payload that cannot be decoded is answered with
//!   `INVALID_ARGUMENT`; that and transport failures are the only gRPC errors. A snapshot
//!   arrives as a stream (header, then the file's bytes), is written to a file the store hands
//!   out ([`SnapshotInbox`]) and installed when the stream ends.
//! - `Internal.Forward` passes opaque payloads to a [`ForwardHandler`] — the
//!   [`Cluster`](crate::Cluster), which serves forwarded proposals, reads and membership
//!   changes.
//!
//! The node's owner may add its own services on the same port ([`Routes`]): delayd serves its
//! client API there, so the address a node advertises in the membership is also where clients
//! find it as leader.
//!
//! `Raft` and `Internal` are for the cluster's own nodes: with a cluster credential every call
//! must carry it in [`CLUSTER_HEADER`], so that a client of a public API on the same port can
//! neither inject Raft messages nor forward commands past authentication. With peer mutual
//! TLS ([`crate::tls`], `peer_ca_file`) every call must also come over a connection whose
//! client certificate the peer CA signed; the two checks stand beside each other.
//!
//! The gRPC deadline a caller sends is enforced by tonic: a handler whose caller gave up is
//! dropped. Dropping openraft's `append_entries` or `vote` only discards the reply, but a
//! snapshot install runs in its own task so a caller's deadline never stops a snapshot halfway
//! through being installed.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use delayd_core::codec::{decode, encode};
use delayd_proto::raft::internal_server::{Internal, InternalServer};
use delayd_proto::raft::raft_server::RaftServer;
use delayd_proto::raft::{RaftReply, RaftRequest};
use delayd_store::{EncodedEntries, Raft, Snapshot, SnapshotInbox, SnapshotMeta, Vote};
use futures::stream::BoxStream;
use futures::StreamExt;
use openraft::async_runtime::watch::WatchReceiver;
use openraft::raft::{AppendEntriesResponse, StreamAppendError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tonic::{Request, Response, Status, Streaming};

use crate::identity::{Identity, CLUSTER_ID_HEADER};
use crate::network::{decode_append, MAX_MESSAGE_BYTES};
use crate::tls::{incoming, Tls, TlsConnectInfo};

/// Handles `Internal.Forward` calls: what a forwarded payload means is the handler's business.
#[tonic::async_trait]
pub trait ForwardHandler: Send + Sync + 'static {
    /// Handles one forwarded request and returns the reply payload. An error status is sent
    /// to the caller as is.
    async fn forward(&self, payload: Vec<u8>) -> Result<Vec<u8>, Status>;
}

/// Metadata key of the cluster credential on `Raft` and `Internal` calls.
pub const CLUSTER_HEADER: &str = "x-delayd-cluster";

/// Refuses `Raft` and `Internal` calls that do not carry a cluster credential, and, when
/// peer certificates are required, calls over a connection that showed none.
#[derive(Clone)]
pub struct ClusterGuard {
    /// The credentials accepted: the node's own, then any still accepted during a rotation.
    /// Empty: the services are open.
    secrets: Arc<[String]>,
    /// The connection must have shown a client certificate. The TLS handshake verified it
    /// against the peer CA (an unverifiable one fails the handshake), so any shown is a peer's.
    peer_cert: bool,
    /// This node's cluster identity and its Raft node (to tell whether it has joined a
    /// cluster yet); without them, identities are not checked.
    identity: Option<(Identity, Raft)>,
    /// When a refusal was last logged (unix s): a misconfigured peer retries many times a
    /// second, one warning per interval is enough to find it.
    last_warning: Arc<AtomicU64>,
}

impl ClusterGuard {
    /// A guard requiring `secret` or one of `previous` (no `secret`: open).
    pub fn new(secret: Option<String>, previous: Vec<String>) -> ClusterGuard {
        let secrets = match secret {
            Some(secret) => std::iter::once(secret).chain(previous).collect(),
            None => Arc::from([]),
        };
        ClusterGuard { secrets, peer_cert: false, identity: None, last_warning: Arc::default() }
    }

    /// Also requires a client certificate verified by the peer CA (`required`: mutual TLS).
    pub fn requiring_peer_certs(mut self, required: bool) -> ClusterGuard {
        self.peer_cert = required;
        self
    }

    /// Also requires the caller to be of this node's cluster ([`Identity::admit`]).
    pub fn checking_identity(mut self, identity: Identity, raft: Raft) -> ClusterGuard {
        self.identity = Some((identity, raft));
        self
    }

    /// Logs a refusal, at most once per interval.
    fn warn(&self, why: &str) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if now.saturating_sub(self.last_warning.swap(now, Ordering::Relaxed)) >= 10 {
            tracing::warn!("refused an internal call {why}");
        }
    }
}

/// Whether the call came over a TLS connection whose client showed a certificate.
fn shows_peer_cert<T>(request: &Request<T>) -> bool {
    request.extensions().get::<TlsConnectInfo>().is_some_and(|info| info.peer_certified)
}

impl tonic::service::Interceptor for ClusterGuard {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        if self.peer_cert && !shows_peer_cert(&request) {
            self.warn(
                "over a connection without a peer certificate: with peer_ca_file set, every \
                 node needs a certificate signed by that CA",
            );
            return Err(Status::unauthenticated(
                "internal services need a certificate signed by the peer CA",
            ));
        }
        if let Some((identity, raft)) = &self.identity {
            let shown = request.metadata().get(CLUSTER_ID_HEADER).and_then(|v| v.to_str().ok());
            // A node that has joined no cluster has neither a membership nor a log.
            let fresh = || {
                let m = raft.metrics();
                let m = m.borrow_watched();
                m.last_log_index.is_none() && m.membership_config.membership().nodes().count() == 0
            };
            if let Err(why) = identity.admit(shown, fresh) {
                self.warn(&format!("from another cluster: {why}"));
                return Err(Status::permission_denied(format!("another cluster: {why}")));
            }
        }
        if self.secrets.is_empty() {
            return Ok(request);
        }
        let shown = request.metadata().get(CLUSTER_HEADER).and_then(|v| v.to_str().ok());
        // Every candidate is compared, so the time taken does not tell which one matched.
        let matched = shown.map_or(0, |s| self.secrets.iter().filter(|k| same(s, k)).count());
        if matched > 0 {
            return Ok(request);
        }
        self.warn(
            "without the cluster credential: every node of a cluster needs the same \
             cluster_secret (or one in previous_cluster_secrets)",
        );
        Err(Status::unauthenticated("internal services need the cluster credential"))
    }
}

/// Compares a credential in time independent of where it differs.
pub fn same(shown: &str, secret: &str) -> bool {
    let (a, b) = (shown.as_bytes(), secret.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// When this node last accepted AppendEntries (entries or a heartbeat) from a leader whose
/// vote it holds: a follower's only evidence that its leader is still there. openraft keeps
/// naming a leader that has gone silent until an election succeeds, which without a quorum is
/// never, so readiness asks this instead.
#[derive(Clone)]
pub struct LeaderContact {
    since: std::time::Instant,
    /// Milliseconds from `since` to the last contact, plus one; 0: none yet.
    last_ms: Arc<AtomicU64>,
}

impl Default for LeaderContact {
    fn default() -> Self {
        LeaderContact { since: std::time::Instant::now(), last_ms: Arc::default() }
    }
}

impl LeaderContact {
    fn record(&self) {
        let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// How long ago the last contact was; `None` before the first.
    pub fn elapsed(&self) -> Option<std::time::Duration> {
        let last = self.last_ms.load(Ordering::Relaxed).checked_sub(1)?;
        Some(self.since.elapsed().saturating_sub(std::time::Duration::from_millis(last)))
    }
}

/// What the internal server needs from its node.
pub struct Services {
    /// The local Raft node.
    pub raft: Raft,
    /// Where incoming snapshots are written.
    pub inbox: SnapshotInbox,
    /// Serves `Internal.Forward`.
    pub forward: Arc<dyn ForwardHandler>,
    /// The credential peers must show; `None` leaves the internal services open.
    pub secret: Option<String>,
    /// Further credentials accepted beside `secret`, during a rotation.
    pub previous_secrets: Vec<String>,
    /// Updated whenever a leader's AppendEntries is accepted.
    pub contact: LeaderContact,
    /// Peers must also show a certificate signed by the peer CA (mutual TLS).
    pub peer_certs: bool,
    /// This node's cluster identity, which callers must share.
    pub identity: Identity,
    /// Flips to true when the node stops (a dropped sender counts as stopped).
    pub stopping: watch::Receiver<bool>,
    /// The local log's handle for entries received from the leader, which it stores as they
    /// came instead of encoding them again; `None` encodes them.
    pub log: Option<EncodedEntries>,
}

/// The node's internal services beside `extra` (the owner's own services, if any), ready to
/// serve.
pub fn routes(services: Services, extra: Option<Routes>) -> Routes {
    let Services {
        raft,
        inbox,
        forward,
        secret,
        previous_secrets,
        contact,
        peer_certs,
        identity,
        stopping,
        log,
    } = services;
    let guard = ClusterGuard::new(secret, previous_secrets)
        .requiring_peer_certs(peer_certs)
        .checking_identity(identity, raft.clone());
    let raft = RaftServer::new(RaftService { raft, inbox, contact, stopping, log })
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let raft = InterceptedService::new(raft, guard.clone());
    let internal = InternalServer::new(InternalService { handler: forward })
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let internal = InterceptedService::new(internal, guard);
    match extra {
        Some(routes) => routes.add_service(raft).add_service(internal),
        None => Routes::new(raft).add_service(internal),
    }
}

/// Most calls one HTTP/2 connection may have open at once (hyper sets no limit of its own
/// under tonic). A client past it waits for one of its calls to finish (HTTP/2 flow control,
/// nothing is refused), so one connection cannot hold an unbounded number of calls and their
/// buffers. Generous, because a follower forwards every write of its own clients to the
/// leader over one connection, beside its votes: a low limit would make those wait.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 1024;

/// Serves `routes` on `listener` until `shutdown` completes, then stops accepting connections
/// and waits for calls in flight.
pub async fn serve(
    listener: TcpListener,
    routes: Routes,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    serve_with_tls(listener, None, routes, shutdown).await
}

/// [`serve`], over TLS only when `tls` is given: a client that does not complete a TLS
/// handshake (a plain-text one) is dropped.
pub async fn serve_with_tls(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    routes: Routes,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let server =
        Server::builder().max_concurrent_streams(MAX_STREAMS_PER_CONNECTION).add_routes(routes);
    match tls {
        Some(tls) => server.serve_with_incoming_shutdown(incoming(listener, tls), shutdown).await,
        None => {
            let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
            server.serve_with_incoming_shutdown(incoming, shutdown).await
        }
    }
}

/// The `Raft` service over the local node.
struct RaftService {
    raft: Raft,
    inbox: SnapshotInbox,
    contact: LeaderContact,
    stopping: watch::Receiver<bool>,
    log: Option<EncodedEntries>,
}

fn decode_request<T: DeserializeOwned>(request: Request<RaftRequest>) -> Result<T, Status> {
    decode(&request.into_inner().payload)
        .map_err(|e| Status::invalid_argument(format!("undecodable Raft request: {e}")))
}

fn reply<T: Serialize>(result: &T) -> Response<RaftReply> {
    Response::new(RaftReply { payload: encode(result) })
}

#[tonic::async_trait]
impl delayd_proto::raft::raft_server::Raft for RaftService {
    async fn append_entries(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let rpc = decode_append(&request.into_inner().payload, self.log.as_ref())
            .map_err(|e| Status::invalid_argument(format!("undecodable Raft request: {e}")))?;
        let result = self.raft.append_entries(rpc).await;
        if matches!(&result, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
            self.contact.record();
        }
        Ok(reply(&result))
    }

    type StreamAppendStream = BoxStream<'static, Result<RaftReply, Status>>;

    /// Hands the leader's requests to openraft as they arrive and sends its answers back in
    /// order. A request that cannot be decoded, or a broken connection, ends the input: the
    /// answers to what came before are still sent, and the leader resends the rest on a new
    /// stream.
    ///
    /// The input also ends when this node stops. A leader keeps its stream open while it has
    /// nothing to send, and the server's graceful shutdown waits for every open call: without
    /// this, a node stopping under a live leader would wait for its next entry, which in an
    /// idle cluster never comes.
    async fn stream_append(
        &self,
        request: Request<Streaming<RaftRequest>>,
    ) -> Result<Response<Self::StreamAppendStream>, Status> {
        let mut stopping = self.stopping.clone();
        let stopped = async move {
            let _ = stopping.wait_for(|s| *s).await;
        };
        let log = self.log.clone();
        let requests = request.into_inner().take_until(stopped).scan((), move |_, message| {
            let rpc = match message {
                Ok(message) => match decode_append(&message.payload, log.as_ref()) {
                    Ok(rpc) => Some(rpc),
                    Err(e) => {
                        tracing::warn!(error = %e, "undecodable AppendEntries in a stream");
                        None
                    }
                },
                Err(status) => {
                    tracing::debug!(%status, "append stream from the leader ended");
                    None
                }
            };
            std::future::ready(rpc)
        });
        let contact = self.contact.clone();
        let replies = self.raft.stream_append(requests).map(move |result| {
            if matches!(&result, Ok(Ok(_) | Err(StreamAppendError::Conflict(_)))) {
                contact.record();
            }
            Ok(RaftReply { payload: encode(&result) })
        });
        Ok(Response::new(Box::pin(replies)))
    }

    async fn vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let rpc = decode_request(request)?;
        Ok(reply(&self.raft.vote(rpc).await))
    }

    async fn pre_vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let rpc = decode_request(request)?;
        Ok(reply(&self.raft.pre_vote(rpc).await))
    }

    async fn transfer_leader(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let rpc = decode_request(request)?;
        Ok(reply(&self.raft.handle_transfer_leader(rpc).await))
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<RaftRequest>>,
    ) -> Result<Response<RaftReply>, Status> {
        let mut stream = request.into_inner();
        let header = stream
            .next()
            .await
            .ok_or_else(|| Status::invalid_argument("empty snapshot stream"))??;
        let (vote, meta): (Vote, SnapshotMeta) = decode(&header.payload)
            .map_err(|e| Status::invalid_argument(format!("undecodable snapshot header: {e}")))?;
        let mut file = self
            .inbox
            .create()
            .await
            .map_err(|e| Status::internal(format!("cannot receive a snapshot: {e}")))?;
        while let Some(chunk) = stream.next().await {
            file.write_all(&chunk?.payload)
                .await
                .map_err(|e| Status::internal(format!("writing the snapshot: {e}")))?;
        }
        // Installing can take seconds; a sender that gives up meanwhile must not leave it half
        // done, so it runs on its own task.
        let raft = self.raft.clone();
        let snapshot = Snapshot { meta, snapshot: file };
        let result = tokio::spawn(async move { raft.install_full_snapshot(vote, snapshot).await })
            .await
            .map_err(|e| Status::internal(format!("snapshot install task failed: {e}")))?;
        Ok(reply(&result))
    }
}

/// The `Internal` service over the service's [`ForwardHandler`].
struct InternalService {
    handler: Arc<dyn ForwardHandler>,
}

#[tonic::async_trait]
impl Internal for InternalService {
    async fn forward(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let payload = self.handler.forward(request.into_inner().payload).await?;
        Ok(Response::new(RaftReply { payload }))
    }
}

#[cfg(test)]
mod tests {
    use tonic::service::Interceptor;
    use tonic::Code;

    use super::*;

    /// A follower reads a request as `decode` would, and stores each entry with the very
    /// bytes it came in: the same bytes as encoding it here.
    #[tokio::test]
    async fn a_follower_stores_the_entries_it_receives_as_they_came() {
        use delayd_core::{Command, Entry};
        use delayd_store::{LogEntry, TypeConfig};
        use openraft::raft::AppendEntriesRequest;
        use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
        use openraft::testing::log_id;

        let dir = tempfile::tempdir().expect("tempdir");
        let (mut log, _sm) = delayd_store::Store::open(dir.path()).expect("store");
        let encoded = log.encoded_entries();
        let entries: Vec<LogEntry> = (1..=4)
            .map(|i| openraft::Entry {
                log_id: log_id::<TypeConfig>(3, 1, i),
                payload: openraft::EntryPayload::Normal(Entry::new(
                    1_000 + i,
                    vec![Command::Tick { limit: 7 }; i as usize],
                )),
            })
            .collect();
        let rpc = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(3, 1),
            prev_log_id: None,
            entries: entries.clone(),
            leader_commit: Some(log_id::<TypeConfig>(3, 1, 2)),
        };
        let payload = encode(&rpc);
        let read = decode_append(&payload, Some(&encoded)).expect("decodes");
        let whole: AppendEntriesRequest<TypeConfig> = decode(&payload).expect("decodes");
        assert_eq!(
            (read.vote, read.prev_log_id, read.leader_commit),
            (whole.vote, None, whole.leader_commit)
        );
        assert_eq!(read.entries, whole.entries);

        log.append(read.entries, IOFlushed::noop()).await.expect("append");
        for entry in &entries {
            let stored = encoded.get(&entry.log_id).expect("kept");
            assert_eq!(*stored, encode(entry), "entry {}", entry.log_id);
        }
        // What the log stored reads back as the entries sent (reopened: from the disk, not
        // from the window of recent entries).
        drop((log, _sm));
        let (mut log, _sm) = delayd_store::Store::open(dir.path()).expect("reopen");
        let back = log.get_log_reader().await.try_get_log_entries(1..5).await.expect("read");
        assert_eq!(back, entries);

        // A request that claims more entries than it carries is refused, and so is one cut
        // short; neither leaves anything to store.
        let mut lying = encode(&AppendEntriesRequest::<TypeConfig> { entries: Vec::new(), ..rpc });
        let count_at = lying.len() - 1 - encode(&Some(log_id::<TypeConfig>(3, 1, 2)))[1..].len();
        lying[count_at] = 0x7f;
        assert!(decode_append(&lying, Some(&encoded)).is_err());
        assert!(decode_append(&payload[..payload.len() / 2], Some(&encoded)).is_err());
    }

    fn call(guard: &mut ClusterGuard, shown: Option<&str>) -> Result<(), Code> {
        let mut request = Request::new(());
        if let Some(s) = shown {
            let value = s.parse().expect("ascii");
            request.metadata_mut().insert(CLUSTER_HEADER, value);
        }
        guard.call(request).map(drop).map_err(|s| s.code())
    }

    #[test]
    fn the_guard_accepts_the_secret_and_the_previous_ones_during_a_rotation() {
        let mut guard =
            ClusterGuard::new(Some("new-secret-0123456".into()), vec!["old-secret-0123456".into()]);
        assert_eq!(call(&mut guard, Some("new-secret-0123456")), Ok(()));
        assert_eq!(call(&mut guard, Some("old-secret-0123456")), Ok(()), "still accepted");
        assert_eq!(call(&mut guard, Some("other-secret-01234")), Err(Code::Unauthenticated));
        assert_eq!(call(&mut guard, None), Err(Code::Unauthenticated));

        let mut open = ClusterGuard::new(None, Vec::new());
        assert_eq!(call(&mut open, None), Ok(()), "no secret: development only");
    }

    fn call_tls(guard: &mut ClusterGuard, secret: Option<&str>, certified: Option<bool>) -> bool {
        let mut request = Request::new(());
        if let Some(s) = secret {
            request.metadata_mut().insert(CLUSTER_HEADER, s.parse().expect("ascii"));
        }
        if let Some(peer_certified) = certified {
            request.extensions_mut().insert(TlsConnectInfo { remote_addr: None, peer_certified });
        }
        guard.call(request).is_ok()
    }

    #[test]
    fn with_peer_certificates_required_both_credentials_are_checked() {
        let mut guard =
            ClusterGuard::new(Some("s3cret".into()), Vec::new()).requiring_peer_certs(true);
        assert!(call_tls(&mut guard, Some("s3cret"), Some(true)));
        assert!(!call_tls(&mut guard, Some("s3cret"), Some(false)), "TLS without a certificate");
        assert!(!call_tls(&mut guard, Some("s3cret"), None), "not TLS at all");
        assert!(
            !call_tls(&mut guard, Some("wrong"), Some(true)),
            "a certificate is not the secret"
        );
        let mut open = ClusterGuard::new(None, Vec::new());
        assert!(call_tls(&mut open, None, None), "without either requirement the guard is open");
    }
}
