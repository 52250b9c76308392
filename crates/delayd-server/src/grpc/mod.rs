//! # The gRPC client API (`proto/delayd.proto`, service `delayd.v1.Delayd`)
//!
//! The same operations as the HTTP API, served on the node's gRPC port beside the internal
//! services (see `delayd_raft::server::routes`). Handlers convert messages ([`convert`]) and
//! make one [`Service`] call; every decision is the service's, so authorization, validation
//! and error messages are the HTTP API's. Service errors become gRPC statuses in exactly one
//! place, [`status`].
//!
//! Every call is authenticated from its metadata before its message is read ([`Authenticated`],
//! which [`server`] always puts in front; the service then authorizes each operation), and
//! messages are bounded by the node's largest log entry ([`max_request_bytes`],
//! [`max_reply_bytes`]): a caller without a credential cannot
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
//!   inbound stream; a reserver task long-polls [`Service::reserve`] for at most the outstanding
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

mod convert;
mod metered;
mod status;
mod streams;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use delayd_core::JobState;
use delayd_proto::v1 as pb;
use delayd_proto::v1::delayd_server::{Delayd, DelaydServer};
use futures::future::join_all;
use futures::Stream;
use tokio::sync::{mpsc, watch, Semaphore};
use tonic::codegen::{http, BoxFuture, Context, Poll, Service as TowerService};
use tonic::server::NamedService;
use tonic::{Request, Response, Status, Streaming};

use crate::config::Config;
use crate::error::ServiceError;
use crate::service::auth::header_credential;
use crate::service::reserve::{ReserveOrder, ReserveRequest};
use crate::service::validate::{job_id, queue_name, queue_names, ttr};
use crate::service::{Principal, Service, WeakService};
use status::{answer, fail, item_error};

pub use metered::Metered;
pub use status::{status, LEADER_ADDR_HEADER, LEADER_HEADER, NODE_HEADER, WRITTEN_HEADER};
pub use streams::MAX_ACKS_IN_FLIGHT;

/// Most publish batches of one stream being proposed at once; the next batch is read only
/// when one finishes, which pushes back on the client through HTTP/2 flow control. Each may
/// hold up to a log entry's worth of bodies, so this bounds what one stream holds in memory
/// to a few entries; a handful in flight already lets the proposer pack them together.
pub const MAX_BATCHES_IN_FLIGHT: usize = 8;
/// Most batches one publish stream carries: its reply lists a result per batch, which must
/// stay far below [`max_reply_bytes`] (a result of 64 ids is about 2 KiB).
pub const MAX_STREAM_BATCHES: usize = 1024;
/// Most items in one batched ack, release, touch or bury.
pub const MAX_BATCH_ITEMS: usize = 1000;

/// Room for a message's protobuf framing beyond the log entry it becomes (field tags and
/// lengths, options, queue names).
pub const MESSAGE_FRAMING_BYTES: usize = crate::config::MESSAGE_FRAMING_BYTES;

/// The largest request message the client API decodes: whatever a request carries must fit
/// one log entry ([`Config::max_entry_bytes`]), so a larger message is refused
/// (`OUT_OF_RANGE`) before it is buffered whole.
pub fn max_request_bytes(config: &Config) -> usize {
    config.max_request_bytes()
}

/// The largest reply message the client API encodes: a reserve's bodies (at most
/// [`delayd_core::limits::MAX_RESERVE_BYTES`], or one entry's worth, which a single job may
/// fill) and as much again for the metadata of its jobs (keys, attributes).
pub fn max_reply_bytes(config: &Config) -> usize {
    config
        .max_entry_bytes
        .max(delayd_core::limits::MAX_RESERVE_BYTES)
        .saturating_mul(2)
        .saturating_add(MESSAGE_FRAMING_BYTES)
}

/// The client API over one node's service. Holds it weakly, like the internal services, so
/// a server that outlives its node answers UNAVAILABLE instead of keeping it alive.
pub struct Api {
    service: WeakService,
}

/// The `delayd.v1.Delayd` service over `service`, with message size limits derived from the
/// node's configuration, behind its credential check ([`Authenticated`]) and counted in the
/// node's metrics.
pub fn server(service: &Service) -> Metered<Authenticated<DelaydServer<Api>>> {
    let config = service.config();
    let api = DelaydServer::new(Api { service: service.downgrade() })
        .max_decoding_message_size(max_request_bytes(config))
        .max_encoding_message_size(max_reply_bytes(config));
    let authenticated = Authenticated { inner: api, service: service.downgrade() };
    Metered::new(authenticated, service.metrics().clone())
}

/// The client API behind its credential check: a tower service in front of the generated
/// server that authenticates the `authorization: Bearer` or `x-token` metadata from the
/// request head, before the body is read. A caller without a valid credential is answered
/// `UNAUTHENTICATED` without the server decoding (or even receiving) its message; an
/// authenticated caller's [`Principal`] travels to the handler in the request's extensions,
/// where no client can put one.
#[derive(Clone)]
pub struct Authenticated<S> {
    inner: S,
    service: WeakService,
}

impl<S: NamedService> NamedService for Authenticated<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> TowerService<http::Request<B>> for Authenticated<S>
where
    S: TowerService<
            http::Request<B>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + Clone
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
        let service = self.service.upgrade();
        Box::pin(async move {
            let Some(service) = service else {
                return Ok(Status::unavailable("node is shutting down").into_http());
            };
            let headers = request.headers();
            let credential =
                header_credential(|name| headers.get(name).and_then(|v| v.to_str().ok()));
            match service.authenticate(credential.as_deref()).await {
                Ok(principal) => {
                    request.extensions_mut().insert(principal);
                    inner.call(request).await
                }
                Err(e) => Ok(fail(&service, &e).into_http()),
            }
        })
    }
}

impl Api {
    /// The service and the caller [`Authenticated`] resolved for this request.
    fn caller<T>(&self, request: &Request<T>) -> Result<(Service, Principal), Status> {
        let service =
            self.service.upgrade().ok_or_else(|| Status::unavailable("node is shutting down"))?;
        // Only `server` builds an `Api`, always behind `Authenticated`: a request without a
        // principal is a wiring bug, refused rather than let through.
        match request.extensions().get::<Principal>() {
            Some(p) => Ok((service, p.clone())),
            None => Err(Status::internal("the request skipped the credential check")),
        }
    }
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<pb::ReserveStreamReply, Status>> + Send>>;

#[tonic::async_trait]
impl Delayd for Api {
    async fn publish(
        &self,
        request: Request<pb::PublishRequest>,
    ) -> Result<Response<pb::PublishReply>, Status> {
        let (s, caller) = self.caller(&request)?;
        let r = request.into_inner();
        let result = async {
            let queue = queue_name(&r.namespace, &r.queue)?;
            let p = convert::params(r.options, r.key)?;
            let published = s.publish(&caller, queue, &p, r.body).await?;
            Ok(pb::PublishReply { job_id: published.id.to_string(), existed: published.existed })
        };
        answer(&s, result.await)
    }

    async fn publish_stream(
        &self,
        request: Request<Streaming<pb::PublishBatch>>,
    ) -> Result<Response<pb::PublishStreamReply>, Status> {
        let (s, caller) = self.caller(&request)?;
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
            let (s, caller) = (s.clone(), caller.clone());
            // Spawned, so a batch being committed finishes even if the client goes away.
            batches.push(tokio::spawn(async move {
                let result = streams::publish_batch(&s, &caller, batch).await;
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
        answer(&s, Ok(pb::PublishStreamReply { batches: results }))
    }

    async fn reserve(
        &self,
        request: Request<pb::ReserveRequest>,
    ) -> Result<Response<pb::ReserveReply>, Status> {
        let (s, caller) = self.caller(&request)?;
        let r = request.into_inner();
        let result = async {
            let request = ReserveRequest {
                queues: queue_names(&r.namespace, r.queues.iter().map(String::as_str))?,
                count: r.count.unwrap_or(1),
                ttr_ms: ttr(None, r.ttr_ms)?,
                wait: Duration::from_millis(r.wait_ms),
                acks: Vec::new(),
                order: ReserveOrder::QueueOrder,
            };
            let got = tokio::select! {
                got = s.reserve(&caller, request) => got?,
                _ = s.stopped() => {
                    return Err(ServiceError::Unavailable("node is shutting down".into()))
                }
            };
            let now = s.now_ms();
            Ok(pb::ReserveReply {
                deliveries: got.deliveries.into_iter().map(|d| convert::delivery(d, now)).collect(),
            })
        };
        answer(&s, result.await)
    }

    type ReserveStreamStream = ReplyStream;

    async fn reserve_stream(
        &self,
        request: Request<Streaming<pb::ReserveStreamRequest>>,
    ) -> Result<Response<ReplyStream>, Status> {
        use pb::reserve_stream_request::Msg;
        let (s, caller) = self.caller(&request)?;
        let mut inbound = request.into_inner();
        let first = match inbound.message().await? {
            Some(pb::ReserveStreamRequest { msg: Some(Msg::Subscribe(sub)) }) => Ok(sub),
            _ => Err(ServiceError::bad_request(
                "the first message of a reserve stream must be subscribe",
            )),
        };
        let checked = first.and_then(|sub| {
            let queues = queue_names(&sub.namespace, sub.queues.iter().map(String::as_str))?;
            let ttr_ms = ttr(None, sub.ttr_ms)?;
            s.subscribe(&caller, &queues, ttr_ms)?;
            Ok((queues, ttr_ms))
        });
        let (queues, ttr_ms) = checked.map_err(|e| fail(&s, &e))?;

        // Room for a full credit's deliveries plus ack results, so the reserver rarely
        // waits on the network.
        let (out, rx) = mpsc::channel(256);
        let flow = Arc::new(streams::Flow::default());
        let (done_tx, done_rx) = watch::channel(false);
        tokio::spawn(streams::read_stream(
            s.clone(),
            caller.clone(),
            inbound,
            flow.clone(),
            out.clone(),
            done_rx,
        ));
        let pusher = s.clone();
        tokio::spawn(async move {
            streams::push_deliveries(pusher, caller, queues, ttr_ms, flow, out).await;
            let _ = done_tx.send(true);
        });
        let stream =
            futures::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|item| (item, rx)) },
            );
        answer(&s, Ok(Box::pin(stream) as ReplyStream))
    }

    async fn ack(&self, request: Request<pb::JobRef>) -> Result<Response<pb::AckReply>, Status> {
        let (s, caller) = self.caller(&request)?;
        let r = request.into_inner();
        answer(&s, ack_one(&s, &caller, r).await.map(|removed| pb::AckReply { removed }))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        let (s, caller) = self.caller(&request)?;
        answer(&s, release_one(&s, &caller, request.into_inner()).await)
    }

    async fn touch(&self, request: Request<pb::TouchRequest>) -> Result<Response<pb::Job>, Status> {
        let (s, caller) = self.caller(&request)?;
        answer(&s, touch_one(&s, &caller, request.into_inner()).await)
    }

    async fn bury(&self, request: Request<pb::JobRef>) -> Result<Response<pb::Job>, Status> {
        let (s, caller) = self.caller(&request)?;
        answer(&s, bury_one(&s, &caller, request.into_inner()).await)
    }

    async fn ack_batch(
        &self,
        request: Request<pb::AckBatchRequest>,
    ) -> Result<Response<pb::BatchReply>, Status> {
        let (s, caller) = self.caller(&request)?;
        let items = request.into_inner().items;
        let result = batch(items, |r| async {
            ack_one(&s, &caller, r)
                .await
                .map(|removed| pb::ItemResult { removed, ..Default::default() })
        });
        answer(&s, result.await)
    }

    async fn release_batch(
        &self,
        request: Request<pb::ReleaseBatchRequest>,
    ) -> Result<Response<pb::BatchReply>, Status> {
        let (s, caller) = self.caller(&request)?;
        let items = request.into_inner().items;
        let result = batch(items, |r| async { release_one(&s, &caller, r).await.map(job_item) });
        answer(&s, result.await)
    }

    async fn touch_batch(
        &self,
        request: Request<pb::TouchBatchRequest>,
    ) -> Result<Response<pb::BatchReply>, Status> {
        let (s, caller) = self.caller(&request)?;
        let items = request.into_inner().items;
        let result = batch(items, |r| async { touch_one(&s, &caller, r).await.map(job_item) });
        answer(&s, result.await)
    }

    async fn bury_batch(
        &self,
        request: Request<pb::BuryBatchRequest>,
    ) -> Result<Response<pb::BatchReply>, Status> {
        let (s, caller) = self.caller(&request)?;
        let items = request.into_inner().items;
        let result = batch(items, |r| async { bury_one(&s, &caller, r).await.map(job_item) });
        answer(&s, result.await)
    }

    async fn peek(&self, request: Request<pb::PeekRequest>) -> Result<Response<pb::Job>, Status> {
        let (s, caller) = self.caller(&request)?;
        let r = request.into_inner();
        let result = async {
            let queue = queue_name(&r.namespace, &r.queue)?;
            let (job, missing) = if r.job_id.is_empty() {
                (s.peek(&caller, &queue, r.stale).await?, "the queue is empty")
            } else {
                let id = job_id(&r.job_id)?;
                (s.job(&caller, &queue, id, r.stale).await?, "job not found")
            };
            let job = job.ok_or_else(|| ServiceError::NotFound(missing.into()))?;
            Ok(convert::job(job, s.now_ms()))
        };
        answer(&s, result.await)
    }

    async fn stats(
        &self,
        request: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsReply>, Status> {
        let (s, caller) = self.caller(&request)?;
        let r = request.into_inner();
        let result = async {
            let queue = queue_name(&r.namespace, &r.queue)?;
            let stats = s.stats(&caller, &queue, r.stale).await?;
            Ok(pb::StatsReply {
                paused: stats.meta.paused,
                delayed: stats.meta.count(JobState::Delayed),
                ready: stats.meta.count(JobState::Ready),
                reserved: stats.meta.count(JobState::Reserved),
                dead: stats.meta.count(JobState::Dead),
                head_age_ms: stats.head_age_ms,
                due_histogram: stats
                    .due_histogram
                    .into_iter()
                    .map(|(le_ms, count)| pb::HistogramBucket { le_ms, count })
                    .collect(),
                namespace: queue.namespace,
                queue: queue.queue,
            })
        };
        answer(&s, result.await)
    }

    async fn set_webhook(
        &self,
        request: Request<pb::SetWebhookRequest>,
    ) -> Result<Response<pb::WebhookReply>, Status> {
        let (s, caller) = self.caller(&request)?;
        let r = request.into_inner();
        let result = async {
            let queue = queue_name(&r.namespace, &r.queue)?;
            let request = || Ok(convert::webhook_request(r));
            let set = s.set_webhook(&caller, queue.clone(), request).await?;
            Ok(convert::webhook(queue, set.webhook, true, set.replaced))
        };
        answer(&s, result.await)
    }

    async fn get_webhook(
        &self,
        request: Request<pb::QueueRef>,
    ) -> Result<Response<pb::WebhookReply>, Status> {
        let (s, caller) = self.caller(&request)?;
        let r = request.into_inner();
        let result = async {
            let queue = queue_name(&r.namespace, &r.queue)?;
            match s.webhook(&caller, &queue, r.stale).await? {
                Some(w) => Ok(convert::webhook(queue, w, false, false)),
                None => Err(ServiceError::NotFound(format!("queue {queue} has no webhook"))),
            }
        };
        answer(&s, result.await)
    }

    async fn delete_webhook(
        &self,
        request: Request<pb::QueueRef>,
    ) -> Result<Response<pb::DeleteReply>, Status> {
        let (s, caller) = self.caller(&request)?;
        let r = request.into_inner();
        let result = async {
            s.delete_webhook(&caller, queue_name(&r.namespace, &r.queue)?).await?;
            Ok(pb::DeleteReply {})
        };
        answer(&s, result.await)
    }

    async fn set_schedule(
        &self,
        request: Request<pb::SetScheduleRequest>,
    ) -> Result<Response<pb::ScheduleReply>, Status> {
        let (s, caller) = self.caller(&request)?;
        let r = request.into_inner();
        let result = async {
            let queue = queue_name(&r.namespace, &r.queue)?;
            let name = r.name.clone();
            let request = || convert::schedule_request(r);
            let (schedule, replaced) =
                s.set_schedule(&caller, queue.clone(), &name, request).await?;
            Ok(convert::schedule(&queue, schedule, replaced))
        };
        answer(&s, result.await)
    }

    async fn list_schedules(
        &self,
        request: Request<pb::QueueRef>,
    ) -> Result<Response<pb::ScheduleList>, Status> {
        let (s, caller) = self.caller(&request)?;
        let r = request.into_inner();
        let result = async {
            let queue = queue_name(&r.namespace, &r.queue)?;
            let all = s.schedules(&caller, &queue, r.stale).await?;
            let schedules =
                all.into_iter().map(|sc| convert::schedule(&queue, sc, false)).collect();
            Ok(pb::ScheduleList { schedules })
        };
        answer(&s, result.await)
    }

    async fn delete_schedule(
        &self,
        request: Request<pb::ScheduleRef>,
    ) -> Result<Response<pb::DeleteReply>, Status> {
        let (s, caller) = self.caller(&request)?;
        let r = request.into_inner();
        let result = async {
            s.delete_schedule(&caller, queue_name(&r.namespace, &r.queue)?, &r.name).await?;
            Ok(pb::DeleteReply {})
        };
        answer(&s, result.await)
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
    let n = items.len();
    if n == 0 || n > MAX_BATCH_ITEMS {
        return Err(ServiceError::bad_request(format!(
            "a batch carries 1 to {MAX_BATCH_ITEMS} items, not {n}"
        )));
    }
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

fn missing_job() -> ServiceError {
    ServiceError::bad_request("job is required")
}

async fn ack_one(s: &Service, caller: &Principal, r: pb::JobRef) -> Result<bool, ServiceError> {
    let (queue, id) = convert::job_ref(&r)?;
    s.ack(caller, queue, id, r.lease).await
}

async fn release_one(
    s: &Service,
    caller: &Principal,
    r: pb::ReleaseRequest,
) -> Result<pb::Job, ServiceError> {
    let job = r.job.ok_or_else(missing_job)?;
    let (queue, id) = convert::job_ref(&job)?;
    let released = s.release(caller, queue, id, job.lease, r.delay_ms, r.priority).await?;
    Ok(convert::job(released, s.now_ms()))
}

async fn touch_one(
    s: &Service,
    caller: &Principal,
    r: pb::TouchRequest,
) -> Result<pb::Job, ServiceError> {
    let job = r.job.ok_or_else(missing_job)?;
    let (queue, id) = convert::job_ref(&job)?;
    let touched = s.touch(caller, queue, id, job.lease, ttr(None, r.ttr_ms)?).await?;
    Ok(convert::job(touched, s.now_ms()))
}

async fn bury_one(s: &Service, caller: &Principal, r: pb::JobRef) -> Result<pb::Job, ServiceError> {
    let (queue, id) = convert::job_ref(&r)?;
    let buried = s.bury(caller, queue, id, r.lease, None).await?;
    Ok(convert::job(buried, s.now_ms()))
}
