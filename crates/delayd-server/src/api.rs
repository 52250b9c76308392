//! # The gRPC client API (`proto/delayd.proto`, service `delayd.v1.Delayd`)
//!
//! The same operations as the HTTP API, served on the node's gRPC port beside the internal
//! services (see `delayd_raft::server::routes`). Handlers only convert messages; every decision is
//! in [`crate::service`], so validation and error messages are the HTTP API's. Service errors
//! become gRPC statuses in exactly one place, [`status`].
//!
//! Every call is authenticated from its metadata before its message is read ([`Authenticated`],
//! which [`server`] always puts in front), and messages are bounded by the node's largest log
//! entry ([`max_request_bytes`], [`max_reply_bytes`]): a caller without a credential cannot
//! make the node buffer or decode anything, and one with a credential nothing that could not
//! be written anyway.
//!
//! What gRPC adds:
//!
//! - **PublishStream**: each inbound message is a batch for one queue. Batches are proposed
//!   as they arrive, up to [`MAX_BATCHES_IN_FLIGHT`] at once per stream (the proposer packs
//!   concurrent batches into few log entries), and the single reply lists every batch's result
//!   in the order sent. A failed batch does not fail the stream: the other batches were
//!   committed, and a client must be able to tell which. A stream carries at most
//!   [`MAX_STREAM_BATCHES`] batches, so that its reply stays bounded: the server answers once
//!   it has that many, and batches sent after them are neither read nor written (the reply
//!   has fewer results than batches were sent).
//! - **ReserveStream**: credit-based push. A reader task takes credit grants and acks off the
//!   inbound stream; a reserver task long-polls [`Node::reserve`] for at most the outstanding
//!   credit and pushes what it gets, so the server never holds more leases for a worker than
//!   it asked for. A reserve in progress is only abandoned when the stream ends (client closed,
//!   node stopping): jobs it had reserved then come back when their ttr runs out — the
//!   at-least-once contract, never a loss.
//! - **Batched ack/release/touch/bury**: items are independent and run concurrently; each is
//!   answered with its own result.
//! - **Leader metadata** on every answer, error or not (`x-delayd-node`, `x-delayd-leader`,
//!   `x-delayd-leader-addr`), so clients can go straight to the leader and save the
//!   forwarding hop; `x-delayd-written: no` marks errors that certainly wrote nothing.
//!
//! Caveat: an `UNAVAILABLE` from a write may or may not have been applied (the service
//! cannot always tell, e.g. when the commit timed out); only `x-delayd-written: no` says it
//! certainly was not.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use delayd_core::{Delivery, Due, Job, JobState, QueueName};
use delayd_proto::v1 as pb;
use delayd_proto::v1::delayd_server::{Delayd, DelaydServer};
use futures::future::join_all;
use futures::Stream;
use openraft::async_runtime::watch::WatchReceiver;
use openraft::ServerState;
use tokio::sync::{mpsc, watch, Notify, Semaphore};
use tonic::codegen::{http, BoxFuture, Context, Poll, Service};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::server::NamedService;
use tonic::{Code, Request, Response, Status, Streaming};

use crate::auth::{Access, Principal};
use crate::error::ServiceError;
use crate::node::{Inner, Node};
use crate::service::{job_id, queue_name, PublishParams, MAX_BULK, MAX_RESERVE_COUNT};

/// Metadata key: the id of the node that answered.
pub const NODE_HEADER: &str = "x-delayd-node";
/// Metadata key: the id of the leader the answering node knows of.
pub const LEADER_HEADER: &str = "x-delayd-leader";
/// Metadata key: the leader's gRPC address, when known.
pub const LEADER_ADDR_HEADER: &str = "x-delayd-leader-addr";
/// Metadata key on errors: `no` when certainly nothing was written, so a retry is safe.
pub const WRITTEN_HEADER: &str = "x-delayd-written";

/// Most publish batches of one stream being proposed at once; the next batch is read only
/// when one finishes, which pushes back on the client through HTTP/2 flow control. Each may
/// hold up to a log entry's worth of bodies, so this bounds what one stream holds in memory
/// to a few entries; a handful in flight already lets the proposer pack them together.
pub const MAX_BATCHES_IN_FLIGHT: usize = 8;
/// Most batches one publish stream carries: its reply lists a result per batch, which must
/// stay far below [`max_reply_bytes`] (a result of [`MAX_BULK`] ids is about 2 KiB).
pub const MAX_STREAM_BATCHES: usize = 1024;
/// Most acks of one reserve stream being committed at once; the next message of the stream
/// is read only when one finishes.
pub const MAX_ACKS_IN_FLIGHT: usize = 64;
/// Most items in one batched ack, release, touch or bury.
pub const MAX_BATCH_ITEMS: usize = 1000;
/// How long one long-poll of a reserve stream waits before it polls again.
const STREAM_POLL: Duration = Duration::from_secs(30);
/// How long a reserve stream whose token's write budget is spent waits before trying again.
const RATE_LIMITED_PAUSE: Duration = Duration::from_millis(100);

/// The one place where service errors become gRPC statuses.
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
        ServiceError::RateLimited(_) => Code::ResourceExhausted,
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
fn item_error(e: &ServiceError) -> pb::ErrorStatus {
    let s = status(e);
    pb::ErrorStatus { code: s.code() as i32, message: s.message().to_string() }
}

/// The client API over one node. Holds the node weakly, like the internal services, so a
/// server that outlives its node answers UNAVAILABLE instead of keeping it alive.
pub struct Api {
    node: Weak<Inner>,
}

/// Room for a message's protobuf framing beyond the log entry it becomes (field tags and
/// lengths, options, queue names).
pub const MESSAGE_FRAMING_BYTES: usize = 64 << 10;

/// The largest request message the client API decodes: whatever a request carries must fit
/// one log entry ([`Config::max_entry_bytes`](crate::Config::max_entry_bytes)), so a larger
/// message is refused (`OUT_OF_RANGE`) before it is buffered whole.
pub fn max_request_bytes(config: &crate::Config) -> usize {
    config.max_entry_bytes.saturating_add(MESSAGE_FRAMING_BYTES)
}

/// The largest reply message the client API encodes: a reserve's bodies (at most
/// [`delayd_core::limits::MAX_RESERVE_BYTES`], or one entry's worth, which a single job may fill) and as
/// much again for the metadata of its jobs (keys, attributes).
pub fn max_reply_bytes(config: &crate::Config) -> usize {
    config
        .max_entry_bytes
        .max(delayd_core::limits::MAX_RESERVE_BYTES)
        .saturating_mul(2)
        .saturating_add(MESSAGE_FRAMING_BYTES)
}

/// The `delayd.v1.Delayd` service over `node`, with message size limits derived from the
/// node's configuration, behind its credential check ([`Authenticated`]).
pub fn server(node: &Node) -> Authenticated<DelaydServer<Api>> {
    let config = node.config();
    let api = DelaydServer::new(Api { node: Arc::downgrade(&node.inner) })
        .max_decoding_message_size(max_request_bytes(config))
        .max_encoding_message_size(max_reply_bytes(config));
    Authenticated { inner: api, node: Arc::downgrade(&node.inner) }
}

/// The client API behind its credential check: a tower service in front of the generated
/// server that authenticates the `authorization: Bearer` or `x-token` metadata (see
/// [`crate::auth`]) from the request head, before the body is read. A caller without a valid
/// credential is answered `UNAUTHENTICATED` without the server decoding (or even receiving)
/// its message; an authenticated caller's [`Principal`] travels to the handler in the
/// request's extensions, where no client can put one.
#[derive(Clone)]
pub struct Authenticated<S> {
    inner: S,
    node: Weak<Inner>,
}

impl<S: NamedService> NamedService for Authenticated<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for Authenticated<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        // The service that was polled ready serves this call; a fresh clone waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let node = self.node.upgrade().map(|inner| Node { inner });
        Box::pin(async move {
            let Some(node) = node else {
                return Ok(Status::unavailable("node is shutting down").into_http());
            };
            let headers = request.headers();
            let credential = crate::auth::credential_in(
                |name| headers.get(name).and_then(|v| v.to_str().ok()),
                None,
            );
            match node.authenticate(credential.as_deref()).await {
                Ok(principal) => {
                    request.extensions_mut().insert(principal);
                    inner.call(request).await
                }
                Err(e) => Ok(fail(&node, &e).into_http()),
            }
        })
    }
}

impl Api {
    /// The node and the caller [`Authenticated`] resolved for this request.
    fn caller<T>(&self, request: &Request<T>) -> Result<(Node, Principal), Status> {
        let node = self
            .node
            .upgrade()
            .map(|inner| Node { inner })
            .ok_or_else(|| Status::unavailable("node is shutting down"))?;
        // Only `server` builds an `Api`, always behind `Authenticated`: a request without a
        // principal is a wiring bug, refused rather than let through.
        match request.extensions().get::<Principal>() {
            Some(p) => Ok((node, p.clone())),
            None => Err(Status::internal("the request skipped the credential check")),
        }
    }
}

/// Adds the node's id and the leader it knows of, unless already set (a `NotLeader` error
/// names its own leader).
fn add_leader(node: &Node, meta: &mut MetadataMap) {
    meta.insert(NODE_HEADER, MetadataValue::from(node.config().node_id));
    let metrics = node.cluster().raft().metrics();
    let m = metrics.borrow_watched();
    let leader = match meta.get(LEADER_HEADER).and_then(|v| v.to_str().ok()?.parse().ok()) {
        Some(id) => Some(id),
        None => m.current_leader,
    };
    if let Some(id) = leader {
        meta.insert(LEADER_HEADER, MetadataValue::from(id));
        let addr = m.membership_config.membership().get_node(&id).map(|n| n.addr.clone());
        if let Some(v) = addr.and_then(|a| MetadataValue::try_from(a).ok()) {
            meta.insert(LEADER_ADDR_HEADER, v);
        }
    }
}

/// A handler's result as a gRPC answer, with the leader metadata either way.
fn answer<T>(node: &Node, r: Result<T, ServiceError>) -> Result<Response<T>, Status> {
    match r {
        Ok(t) => {
            let mut resp = Response::new(t);
            add_leader(node, resp.metadata_mut());
            Ok(resp)
        }
        Err(e) => Err(fail(node, &e)),
    }
}

fn fail(node: &Node, e: &ServiceError) -> Status {
    if matches!(e, ServiceError::Internal(_) | ServiceError::Unavailable(_)) {
        tracing::warn!(error = %e, "gRPC request failed");
    }
    let mut s = status(e);
    add_leader(node, s.metadata_mut());
    s
}

fn bad(msg: impl Into<String>) -> ServiceError {
    ServiceError::BadRequest(msg.into())
}

/// `ttr_ms` given as 0 is refused, as HTTP refuses `ttr=0`.
fn ttr(ttr_ms: Option<u64>) -> Result<Option<u64>, ServiceError> {
    match ttr_ms {
        Some(0) => Err(bad("ttr must be positive")),
        t => Ok(t),
    }
}

/// Publish options with the HTTP API's defaults for whatever is absent.
fn params(o: Option<pb::JobOptions>, key: Option<String>) -> Result<PublishParams, ServiceError> {
    let mut p = PublishParams { key, ..PublishParams::default() };
    let Some(o) = o else { return Ok(p) };
    match o.due {
        Some(pb::job_options::Due::DelayMs(ms)) => p.due = Due::After(ms),
        Some(pb::job_options::Due::AtMs(at)) => p.due = Due::At(at),
        None => {}
    }
    if let Some(ttl) = o.ttl_ms {
        p.ttl_ms = (ttl > 0).then_some(ttl);
    }
    if let Some(tries) = o.tries {
        p.tries = u16::try_from(tries)
            .map_err(|_| bad(format!("invalid tries {tries}: at most {}", u16::MAX)))?;
    }
    if let Some(ttr_ms) = ttr(o.ttr_ms)? {
        p.ttr_ms = ttr_ms;
    }
    if let Some(priority) = o.priority {
        p.priority = priority;
    }
    p.attributes = o.attributes.into_iter().collect::<BTreeMap<_, _>>();
    Ok(p)
}

fn job_pb(job: Job, now: u64) -> pb::Job {
    pb::Job {
        job_id: job.id.to_string(),
        remain_tries: job.remain_tries().into(),
        elapsed_ms: now.saturating_sub(job.created_ms),
        lease_deadline_ms: job.lease.map(|l| l.deadline_ms),
        state: job.state.as_str().to_string(),
        namespace: job.queue.namespace,
        queue: job.queue.queue,
        key: job.key,
        body: job.body,
        attributes: job.attributes.into_iter().collect(),
        priority: job.priority,
        created_ms: job.created_ms,
        due_at_ms: job.due_ms,
        expires_ms: job.expires_ms,
        tries: job.tries.into(),
        attempt: job.attempts.into(),
        ttr_ms: job.ttr_ms,
    }
}

fn delivery_pb(d: Delivery, now: u64) -> pb::Delivery {
    pb::Delivery { lease: d.lease, job: Some(job_pb(d.job, now)) }
}

/// A job reference the caller may write to.
fn job_ref(
    node: &Node,
    caller: &Principal,
    r: &pb::JobRef,
) -> Result<(QueueName, delayd_core::JobId), ServiceError> {
    let queue = queue(node, caller, &r.namespace, &r.queue, Access::Write)?;
    Ok((queue, job_id(&r.job_id)?))
}

/// A queue name the caller may use for `access`.
fn queue(
    node: &Node,
    caller: &Principal,
    namespace: &str,
    name: &str,
    access: Access,
) -> Result<QueueName, ServiceError> {
    let queue = queue_name(namespace, name)?;
    node.authorize(caller, namespace, access)?;
    Ok(queue)
}

/// Queue names of one namespace that the caller may reserve from.
fn queues(
    node: &Node,
    caller: &Principal,
    namespace: &str,
    names: &[String],
) -> Result<Vec<QueueName>, ServiceError> {
    let queues = names.iter().map(|q| queue_name(namespace, q)).collect::<Result<Vec<_>, _>>()?;
    node.authorize(caller, namespace, Access::Write)?;
    Ok(queues)
}

fn check_items(n: usize) -> Result<(), ServiceError> {
    if n == 0 || n > MAX_BATCH_ITEMS {
        return Err(bad(format!("a batch carries 1 to {MAX_BATCH_ITEMS} items, not {n}")));
    }
    Ok(())
}

/// Completes when the node's Raft has stopped: streams and long polls must end then, or
/// the server's graceful shutdown would wait for them.
async fn stopped(node: Node) {
    let mut metrics = node.cluster().raft().metrics();
    loop {
        if metrics.borrow_and_update().state == ServerState::Shutdown {
            return;
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

async fn publish_batch(node: &Node, caller: &Principal, b: pb::PublishBatch) -> pb::BatchResult {
    let result = async {
        // The stream may outlive its token.
        node.revalidate(caller).await?;
        let queue = queue(node, caller, &b.namespace, &b.queue, Access::Write)?;
        let p = params(b.options, None)?;
        if b.keys.is_empty() {
            let ids = node.publish_bulk(queue, &p, b.bodies).await?;
            let existed = vec![false; ids.len()];
            return Ok((ids, existed));
        }
        if b.keys.len() != b.bodies.len() {
            return Err(bad(format!(
                "give one key per body or none: {} keys for {} bodies",
                b.keys.len(),
                b.bodies.len()
            )));
        }
        if b.bodies.len() > MAX_BULK {
            return Err(bad(format!(
                "a bulk publish carries 1 to {MAX_BULK} jobs, not {}",
                b.bodies.len()
            )));
        }
        // Keyed jobs are published one by one (the proposer still packs them together):
        // each is idempotent, so a batch that failed halfway is simply sent again.
        let publishes = b.bodies.into_iter().zip(b.keys).map(|(body, key)| {
            let p = PublishParams { key: Some(key), ..p.clone() };
            let queue = queue.clone();
            async move { node.publish(queue, &p, body).await }
        });
        let mut ids = Vec::new();
        let mut existed = Vec::new();
        for r in join_all(publishes).await {
            let r = r?;
            ids.push(r.id);
            existed.push(r.existed);
        }
        Ok((ids, existed))
    };
    match result.await {
        Ok((ids, existed)) => pb::BatchResult {
            job_ids: ids.iter().map(ToString::to_string).collect(),
            existed,
            error: None,
        },
        Err(e) => pb::BatchResult {
            job_ids: Vec::new(),
            existed: Vec::new(),
            error: Some(item_error(&e)),
        },
    }
}

/// Credit and end-of-stream shared by a reserve stream's reader and reserver.
#[derive(Default)]
struct Flow {
    state: Mutex<FlowState>,
    changed: Notify,
}

#[derive(Default)]
struct FlowState {
    credit: u64,
    closed: bool,
}

impl Flow {
    fn update(&self, f: impl FnOnce(&mut FlowState)) {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner));
        self.changed.notify_one();
    }

    fn get(&self) -> (u64, bool) {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (s.credit, s.closed)
    }
}

type Out = mpsc::Sender<Result<pb::ReserveStreamReply, Status>>;

/// Reads credits and acks until the client closes its side or the reserver is done.
async fn read_stream(
    node: Node,
    caller: Principal,
    mut inbound: Streaming<pb::ReserveStreamRequest>,
    flow: Arc<Flow>,
    out: Out,
    mut done: watch::Receiver<bool>,
) {
    use pb::reserve_stream_request::Msg;
    let acks = Arc::new(Semaphore::new(MAX_ACKS_IN_FLIGHT));
    loop {
        // An ack slot before the next message: a client acking faster than acks commit is
        // slowed down instead of spawning without bound.
        let slot = tokio::select! {
            s = acks.clone().acquire_owned() => s,
            _ = done.wait_for(|d| *d) => break,
        };
        let Ok(slot) = slot else { break };
        let msg = tokio::select! {
            m = inbound.message() => m,
            _ = done.wait_for(|d| *d) => break,
        };
        match msg {
            Ok(Some(pb::ReserveStreamRequest { msg: Some(Msg::Credit(c)) })) => {
                flow.update(|s| s.credit = s.credit.saturating_add(c.n.into()));
            }
            Ok(Some(pb::ReserveStreamRequest { msg: Some(Msg::Ack(r)) })) => {
                let (node, out, caller) = (node.clone(), out.clone(), caller.clone());
                // Acks run beside the stream so a slow commit never delays credit.
                tokio::spawn(async move {
                    let _slot = slot;
                    let checked = match node.revalidate(&caller).await {
                        Ok(()) => job_ref(&node, &caller, &r),
                        Err(e) => Err(e),
                    };
                    let result = match checked {
                        Ok((queue, id)) => node.ack(queue, id, r.lease).await,
                        Err(e) => Err(e),
                    };
                    let ack = match result {
                        Ok(removed) => pb::AckResult { job_id: r.job_id, removed, error: None },
                        Err(e) => pb::AckResult {
                            job_id: r.job_id,
                            removed: false,
                            error: Some(item_error(&e)),
                        },
                    };
                    let reply = pb::ReserveStreamReply {
                        msg: Some(pb::reserve_stream_reply::Msg::Ack(ack)),
                    };
                    let _ = out.send(Ok(reply)).await;
                });
            }
            Ok(Some(_)) => {
                let e = bad("after subscribe, send only credit and ack messages");
                let _ = out.send(Err(status(&e))).await;
                break;
            }
            Ok(None) | Err(_) => break,
        }
    }
    flow.update(|s| s.closed = true);
}

/// Reserves up to the outstanding credit and pushes what it gets, until the stream ends.
async fn push_deliveries(
    node: Node,
    caller: Principal,
    queues: Vec<QueueName>,
    ttr_ms: Option<u64>,
    flow: Arc<Flow>,
    out: Out,
) {
    let stop = stopped(node.clone());
    tokio::pin!(stop);
    loop {
        let (credit, closed) = flow.get();
        if closed || out.is_closed() {
            return;
        }
        if credit == 0 {
            tokio::select! {
                _ = flow.changed.notified() => continue,
                _ = &mut stop => break,
                _ = out.closed() => return,
            }
        }
        // Each reserve is one write of the token's budget, and the token must still exist:
        // a stream outlives the request that opened it. A spent budget waits, it does not end
        // the stream.
        let namespace = queues.first().map_or("", |q| q.namespace.as_str());
        let allowed = match node.revalidate(&caller).await {
            Ok(()) => node.authorize(&caller, namespace, Access::Write),
            Err(e) => Err(e),
        };
        match allowed {
            Ok(()) => {}
            Err(ServiceError::RateLimited(_)) => {
                tokio::select! {
                    _ = tokio::time::sleep(RATE_LIMITED_PAUSE) => continue,
                    _ = &mut stop => break,
                    _ = out.closed() => return,
                }
            }
            Err(e) => {
                let _ = out.send(Err(fail(&node, &e))).await;
                return;
            }
        }
        let count = credit.min(MAX_RESERVE_COUNT.into()) as u32;
        let reserve = node.reserve(queues.clone(), count, ttr_ms, STREAM_POLL);
        let got = tokio::select! {
            r = reserve => r,
            _ = &mut stop => break,
            _ = out.closed() => return,
            // Only the end of the stream interrupts a reserve; more credit waits for the
            // next round.
            _ = async { loop { flow.changed.notified().await; if flow.get().1 { return } } } => return,
        };
        match got {
            Ok(got) => {
                let n = got.len() as u64;
                flow.update(|s| s.credit = s.credit.saturating_sub(n));
                let now = node.clock().now_ms();
                let mut got = got.into_iter();
                while let Some(d) = got.next() {
                    let reply = pb::ReserveStreamReply {
                        msg: Some(pb::reserve_stream_reply::Msg::Delivery(delivery_pb(
                            d.clone(),
                            now,
                        ))),
                    };
                    if out.send(Ok(reply)).await.is_err() {
                        // The stream is gone: what it never received goes back at once.
                        node.return_deliveries(std::iter::once(d).chain(got).collect()).await;
                        return;
                    }
                }
            }
            Err(e) => {
                let _ = out.send(Err(fail(&node, &e))).await;
                return;
            }
        }
    }
    let _ = out.send(Err(Status::unavailable("node is shutting down"))).await;
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<pb::ReserveStreamReply, Status>> + Send>>;

#[tonic::async_trait]
impl Delayd for Api {
    async fn publish(
        &self,
        request: Request<pb::PublishRequest>,
    ) -> Result<Response<pb::PublishReply>, Status> {
        let (node, caller) = self.caller(&request)?;
        let r = request.into_inner();
        let result = async {
            let queue = queue(&node, &caller, &r.namespace, &r.queue, Access::Write)?;
            let p = params(r.options, r.key)?;
            let published = node.publish(queue, &p, r.body).await?;
            Ok(pb::PublishReply { job_id: published.id.to_string(), existed: published.existed })
        };
        answer(&node, result.await)
    }

    async fn publish_stream(
        &self,
        request: Request<Streaming<pb::PublishBatch>>,
    ) -> Result<Response<pb::PublishStreamReply>, Status> {
        let (node, caller) = self.caller(&request)?;
        let mut inbound = request.into_inner();
        let slots = Arc::new(Semaphore::new(MAX_BATCHES_IN_FLIGHT));
        let mut batches = Vec::new();
        while batches.len() < MAX_STREAM_BATCHES {
            let permit = slots
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| Status::internal("publish slots closed"))?;
            let Some(batch) = inbound.message().await? else { break };
            let (node, caller) = (node.clone(), caller.clone());
            // Spawned, so a batch being committed finishes even if the client goes away.
            batches.push(tokio::spawn(async move {
                let result = publish_batch(&node, &caller, batch).await;
                drop(permit);
                result
            }));
        }
        let mut results = Vec::with_capacity(batches.len());
        for b in batches {
            results.push(b.await.unwrap_or_else(|e| pb::BatchResult {
                job_ids: Vec::new(),
                existed: Vec::new(),
                error: Some(item_error(&ServiceError::Internal(format!("batch task: {e}")))),
            }));
        }
        answer(&node, Ok(pb::PublishStreamReply { batches: results }))
    }

    async fn reserve(
        &self,
        request: Request<pb::ReserveRequest>,
    ) -> Result<Response<pb::ReserveReply>, Status> {
        let (node, caller) = self.caller(&request)?;
        let r = request.into_inner();
        let result = async {
            let queues = queues(&node, &caller, &r.namespace, &r.queues)?;
            let ttr_ms = ttr(r.ttr_ms)?;
            let wait = Duration::from_millis(r.wait_ms);
            let got = tokio::select! {
                got = node.reserve(queues, r.count.unwrap_or(1), ttr_ms, wait) => got?,
                _ = stopped(node.clone()) => {
                    return Err(ServiceError::Unavailable("node is shutting down".into()))
                }
            };
            let now = node.clock().now_ms();
            Ok(pb::ReserveReply {
                deliveries: got.into_iter().map(|d| delivery_pb(d, now)).collect(),
            })
        };
        answer(&node, result.await)
    }

    type ReserveStreamStream = ReplyStream;

    async fn reserve_stream(
        &self,
        request: Request<Streaming<pb::ReserveStreamRequest>>,
    ) -> Result<Response<ReplyStream>, Status> {
        use pb::reserve_stream_request::Msg;
        let (node, caller) = self.caller(&request)?;
        let mut inbound = request.into_inner();
        let first = match inbound.message().await? {
            Some(pb::ReserveStreamRequest { msg: Some(Msg::Subscribe(s)) }) => Ok(s),
            _ => Err(bad("the first message of a reserve stream must be subscribe")),
        };
        let checked = first.and_then(|s| {
            let queues = queues(&node, &caller, &s.namespace, &s.queues)?;
            if queues.is_empty() {
                return Err(bad("no queue named"));
            }
            Ok((queues, ttr(s.ttr_ms)?))
        });
        let (queues, ttr_ms) = checked.map_err(|e| fail(&node, &e))?;

        // Room for a full credit's deliveries plus ack results, so the reserver rarely
        // waits on the network.
        let (out, rx) = mpsc::channel(256);
        let flow = Arc::new(Flow::default());
        let (done_tx, done_rx) = watch::channel(false);
        tokio::spawn(read_stream(
            node.clone(),
            caller.clone(),
            inbound,
            flow.clone(),
            out.clone(),
            done_rx,
        ));
        let pusher = node.clone();
        tokio::spawn(async move {
            push_deliveries(pusher, caller, queues, ttr_ms, flow, out).await;
            let _ = done_tx.send(true);
        });
        let stream =
            futures::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|item| (item, rx)) },
            );
        answer(&node, Ok(Box::pin(stream) as ReplyStream))
    }

    async fn ack(&self, request: Request<pb::JobRef>) -> Result<Response<pb::AckReply>, Status> {
        let (node, caller) = self.caller(&request)?;
        let r = request.into_inner();
        answer(&node, ack_one(&node, &caller, r).await.map(|removed| pb::AckReply { removed }))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        let (node, caller) = self.caller(&request)?;
        answer(&node, release_one(&node, &caller, request.into_inner()).await)
    }

    async fn touch(&self, request: Request<pb::TouchRequest>) -> Result<Response<pb::Job>, Status> {
        let (node, caller) = self.caller(&request)?;
        answer(&node, touch_one(&node, &caller, request.into_inner()).await)
    }

    async fn bury(&self, request: Request<pb::JobRef>) -> Result<Response<pb::Job>, Status> {
        let (node, caller) = self.caller(&request)?;
        answer(&node, bury_one(&node, &caller, request.into_inner()).await)
    }

    async fn ack_batch(
        &self,
        request: Request<pb::AckBatchRequest>,
    ) -> Result<Response<pb::BatchReply>, Status> {
        let (node, caller) = self.caller(&request)?;
        let items = request.into_inner().items;
        let result = batch(items, |r| async {
            ack_one(&node, &caller, r)
                .await
                .map(|removed| pb::ItemResult { removed, ..Default::default() })
        });
        answer(&node, result.await)
    }

    async fn release_batch(
        &self,
        request: Request<pb::ReleaseBatchRequest>,
    ) -> Result<Response<pb::BatchReply>, Status> {
        let (node, caller) = self.caller(&request)?;
        let items = request.into_inner().items;
        let result = batch(items, |r| async { release_one(&node, &caller, r).await.map(job_item) });
        answer(&node, result.await)
    }

    async fn touch_batch(
        &self,
        request: Request<pb::TouchBatchRequest>,
    ) -> Result<Response<pb::BatchReply>, Status> {
        let (node, caller) = self.caller(&request)?;
        let items = request.into_inner().items;
        let result = batch(items, |r| async { touch_one(&node, &caller, r).await.map(job_item) });
        answer(&node, result.await)
    }

    async fn bury_batch(
        &self,
        request: Request<pb::BuryBatchRequest>,
    ) -> Result<Response<pb::BatchReply>, Status> {
        let (node, caller) = self.caller(&request)?;
        let items = request.into_inner().items;
        let result = batch(items, |r| async { bury_one(&node, &caller, r).await.map(job_item) });
        answer(&node, result.await)
    }

    async fn peek(&self, request: Request<pb::PeekRequest>) -> Result<Response<pb::Job>, Status> {
        let (node, caller) = self.caller(&request)?;
        let r = request.into_inner();
        let result = async {
            let queue = queue(&node, &caller, &r.namespace, &r.queue, Access::Read)?;
            let (job, missing) = if r.job_id.is_empty() {
                (node.peek(&queue, r.stale).await?, "the queue is empty")
            } else {
                (node.job(&queue, job_id(&r.job_id)?, r.stale).await?, "job not found")
            };
            let job = job.ok_or_else(|| ServiceError::NotFound(missing.into()))?;
            Ok(job_pb(job, node.clock().now_ms()))
        };
        answer(&node, result.await)
    }

    async fn stats(
        &self,
        request: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsReply>, Status> {
        let (node, caller) = self.caller(&request)?;
        let r = request.into_inner();
        let result = async {
            let queue = queue(&node, &caller, &r.namespace, &r.queue, Access::Read)?;
            let s = node.stats(&queue, r.stale).await?;
            Ok(pb::StatsReply {
                paused: s.meta.paused,
                delayed: s.meta.count(JobState::Delayed),
                ready: s.meta.count(JobState::Ready),
                reserved: s.meta.count(JobState::Reserved),
                dead: s.meta.count(JobState::Dead),
                head_age_ms: s.head_age_ms,
                due_histogram: s
                    .due_histogram
                    .into_iter()
                    .map(|(le_ms, count)| pb::HistogramBucket { le_ms, count })
                    .collect(),
                namespace: queue.namespace,
                queue: queue.queue,
            })
        };
        answer(&node, result.await)
    }
}

fn job_item(job: pb::Job) -> pb::ItemResult {
    pb::ItemResult { job: Some(job), ..Default::default() }
}

/// Runs every item concurrently; each answers for itself.
async fn batch<T, F, Fut>(items: Vec<T>, f: F) -> Result<pb::BatchReply, ServiceError>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<pb::ItemResult, ServiceError>>,
{
    check_items(items.len())?;
    let results = join_all(items.into_iter().map(f)).await;
    let results = results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|e| pb::ItemResult {
                error: Some(item_error(&e)),
                ..Default::default()
            })
        })
        .collect();
    Ok(pb::BatchReply { results })
}

async fn ack_one(node: &Node, caller: &Principal, r: pb::JobRef) -> Result<bool, ServiceError> {
    let (queue, id) = job_ref(node, caller, &r)?;
    node.ack(queue, id, r.lease).await
}

fn missing_job() -> ServiceError {
    bad("job is required")
}

async fn release_one(
    node: &Node,
    caller: &Principal,
    r: pb::ReleaseRequest,
) -> Result<pb::Job, ServiceError> {
    let job = r.job.ok_or_else(missing_job)?;
    let (queue, id) = job_ref(node, caller, &job)?;
    let released = node.release(queue, id, job.lease, r.delay_ms, r.priority).await?;
    Ok(job_pb(released, node.clock().now_ms()))
}

async fn touch_one(
    node: &Node,
    caller: &Principal,
    r: pb::TouchRequest,
) -> Result<pb::Job, ServiceError> {
    let job = r.job.ok_or_else(missing_job)?;
    let (queue, id) = job_ref(node, caller, &job)?;
    let touched = node.touch(queue, id, job.lease, ttr(r.ttr_ms)?).await?;
    Ok(job_pb(touched, node.clock().now_ms()))
}

async fn bury_one(node: &Node, caller: &Principal, r: pb::JobRef) -> Result<pb::Job, ServiceError> {
    let (queue, id) = job_ref(node, caller, &r)?;
    let buried = node.bury(queue, id, r.lease).await?;
    Ok(job_pb(buried, node.clock().now_ms()))
}
