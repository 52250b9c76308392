//! # delayd-client: a Rust client for delayd's gRPC API
//!
//! A [`Client`] is given the gRPC addresses of some cluster nodes. It sends every call to the
//! leader it last heard of (each answer names the leader in its metadata), and moves on to
//! another node when a node cannot be reached or says it cannot serve. It retries only what
//! is safe to retry:
//!
//! - calls that certainly wrote nothing (no connection, "not the leader");
//! - reads, acks and touches, which are idempotent;
//! - publishes with a key: re-publishing a key returns the job it already names.
//!
//! A publish without a key whose outcome is unknown (the connection broke after sending, the
//! commit timed out) is returned as [`Error::Ambiguous`]: the job may or may not exist.
//! [`Client::publish_idempotent`] gives each job a random key so that never happens.
//!
//! ```no_run
//! # async fn demo() -> Result<(), delayd_client::Error> {
//! use delayd_client::{job_ref, Client, JobOptions};
//!
//! let client = Client::connect(&["127.0.0.1:7778".to_string()]).await?;
//! let opts = JobOptions { due: Some(delayd_client::Due::DelayMs(500)), ..Default::default() };
//! let published = client.publish_idempotent("ns", "emails", b"hello".to_vec(), opts).await?;
//! println!("published {}", published.job_id);
//!
//! // A worker: jobs are pushed as they come due, at most 10 unacked at a time.
//! let mut stream = client.reserve_stream("ns", &["emails"], None, 10).await?;
//! while let Some(delivery) = stream.next_delivery().await? {
//!     // ... do the work ...
//!     stream.ack(&delivery).await?;
//!     stream.credit(1).await?;
//! }
//! # let _ = job_ref;
//! # Ok(())
//! # }
//! ```

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use delayd_proto::tls::TlsConnector;
use delayd_proto::v1 as pb;
use delayd_proto::v1::delayd_client::DelaydClient;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status, Streaming};

pub use delayd_proto::v1 as proto;
pub use pb::job_options::Due;
pub use pb::{
    AckResult, BatchResult, Delivery, Job, JobOptions, JobRef, PublishBatch, ReleaseRequest,
    StatsReply, TouchRequest,
};

/// Metadata key naming the leader's id.
const LEADER_HEADER: &str = "x-delayd-leader";
/// Metadata key naming the leader's gRPC address.
const LEADER_ADDR_HEADER: &str = "x-delayd-leader-addr";
/// Metadata key naming the node that answered; only the server's own answers carry it.
const NODE_HEADER: &str = "x-delayd-node";
/// Metadata key set to `no` on errors that certainly wrote nothing.
const WRITTEN_HEADER: &str = "x-delayd-written";

/// Most batches one `PublishStream` carries: the server answers once it has that many and
/// reads no further, so the client refuses longer streams instead of losing their tail.
pub const MAX_STREAM_BATCHES: usize = 1024;

/// Why a call failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// Refused: the request is malformed or over a limit (gRPC INVALID_ARGUMENT). Nothing was
    /// written; sending it again will fail again.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// Refused: the job (or the next ready job) does not exist. Nothing was written.
    #[error("not found: {0}")]
    NotFound(String),
    /// Refused: the job is not in the state the call needs (stale lease, not reserved).
    /// Nothing was written.
    #[error("conflict: {0}")]
    Conflict(String),
    /// No node could serve the call before the retry budget ran out, and nothing was written.
    #[error("cluster unavailable, nothing was written: {0}")]
    Unavailable(String),
    /// The call may or may not have taken effect (for a publish: the job may exist). Retry
    /// with a key to find out safely.
    #[error("outcome unknown: {0}")]
    Ambiguous(String),
    /// Refused: no token, or one the cluster does not know (gRPC UNAUTHENTICATED).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// Refused: the token does not open this namespace or call (gRPC PERMISSION_DENIED).
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// Refused: the token's rate limit is spent for now (gRPC RESOURCE_EXHAUSTED); nothing
    /// was written, and the same call can succeed a moment later.
    #[error("rate limited: {0}")]
    RateLimited(String),
    /// The server failed (a bug or a storage failure).
    #[error("server error: {0}")]
    Internal(String),
    /// The client was given an address it cannot use.
    #[error("invalid address: {0}")]
    Address(String),
}

impl Error {
    /// Whether the server refused the request (4xx-like): nothing was written and the same
    /// request will be refused again.
    pub fn is_refused(&self) -> bool {
        matches!(
            self,
            Error::Invalid(_)
                | Error::NotFound(_)
                | Error::Conflict(_)
                | Error::Unauthenticated(_)
                | Error::PermissionDenied(_)
                | Error::RateLimited(_)
        )
    }
}

/// Tuning of a [`Client`].
#[derive(Clone)]
pub struct Options {
    /// Longest wait for one attempt's answer (a long-poll reserve adds its wait to it).
    pub request_timeout: Duration,
    /// How long a call keeps retrying (other nodes, a new leader) before giving up.
    pub retry_for: Duration,
    /// Longest wait to open a connection to one node.
    pub connect_timeout: Duration,
    /// The credential sent with every call (`authorization: Bearer`): a namespace token, or
    /// the admin token. `None` for a node started with `--dev`.
    pub token: Option<String>,
    /// Talk TLS to nodes served with `tls_cert_file`, verifying them with this configuration
    /// (e.g. [`tls_config`] with the CA that signed them); `host:port` addresses then mean
    /// `https://`. `None`: plain text.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// A TLS configuration that trusts the CA certificates in the PEM text `ca_pem` (and only
/// them), for [`Options::tls`].
pub fn tls_config(ca_pem: &[u8]) -> Result<Arc<rustls::ClientConfig>, Error> {
    delayd_proto::tls::client_config(ca_pem)
        .map(Arc::new)
        .map_err(|e| Error::Invalid(format!("CA certificates: {e}")))
}

impl std::fmt::Debug for Options {
    /// The token is a secret: shown only as present or not.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("request_timeout", &self.request_timeout)
            .field("retry_for", &self.retry_for)
            .field("connect_timeout", &self.connect_timeout)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            request_timeout: Duration::from_secs(10),
            retry_for: Duration::from_secs(15),
            connect_timeout: Duration::from_secs(1),
            token: None,
            tls: None,
        }
    }
}

/// The result of a publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    /// The job's id.
    pub job_id: String,
    /// True when the key already named a job and nothing was created.
    pub existed: bool,
}

/// Whether a call may be sent again after an attempt whose outcome is unknown.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Idempotent: retry until the budget runs out.
    Safe,
    /// Not idempotent: an unknown outcome is returned as [`Error::Ambiguous`].
    Unsafe,
}

/// How one failed attempt counts.
enum Failure {
    /// Certainly not applied: try another node.
    NotSent(String),
    /// May have been applied.
    Unknown(String),
    /// Final.
    Final(Error),
}

/// A client of a delayd cluster. Cheap to clone; clones share connections and the leader
/// they know of.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    seeds: Vec<String>,
    options: Options,
    channels: Mutex<HashMap<String, Channel>>,
    leader: Mutex<Option<String>>,
    next: AtomicUsize,
}

/// The generated client over a channel that adds the credential to every call.
type Grpc = DelaydClient<InterceptedService<Channel, Credential>>;

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
struct Credential(Option<MetadataValue<Ascii>>);

impl Interceptor for Credential {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The handle to act on a delivery: its queue, id and lease.
pub fn job_ref(d: &Delivery) -> JobRef {
    let job = d.job.as_ref();
    JobRef {
        namespace: job.map(|j| j.namespace.clone()).unwrap_or_default(),
        queue: job.map(|j| j.queue.clone()).unwrap_or_default(),
        job_id: job.map(|j| j.job_id.clone()).unwrap_or_default(),
        lease: Some(d.lease),
    }
}

fn refused(s: &Status) -> Option<Error> {
    let m = s.message().to_string();
    match s.code() {
        Code::InvalidArgument | Code::OutOfRange => Some(Error::Invalid(m)),
        Code::NotFound => Some(Error::NotFound(m)),
        Code::FailedPrecondition | Code::Aborted | Code::AlreadyExists => Some(Error::Conflict(m)),
        // The server checks credentials before running a call: nothing was written.
        Code::Unauthenticated => Some(Error::Unauthenticated(m)),
        Code::PermissionDenied => Some(Error::PermissionDenied(m)),
        Code::ResourceExhausted => Some(Error::RateLimited(m)),
        _ => None,
    }
}

fn classify(s: &Status) -> Failure {
    if let Some(e) = refused(s) {
        return Failure::Final(e);
    }
    let from_server = s.metadata().contains_key(NODE_HEADER);
    let msg = s.message().to_string();
    if delayd_proto::is_connect_failure(s)
        || s.metadata().get(WRITTEN_HEADER).is_some_and(|v| v.as_bytes() == b"no")
        // A node that does not serve the client API rejects the call before running it.
        || s.code() == Code::Unimplemented
    {
        return Failure::NotSent(msg);
    }
    match s.code() {
        Code::Internal if from_server => Failure::Final(Error::Internal(msg)),
        _ => Failure::Unknown(format!("{:?}: {msg}", s.code())),
    }
}

impl Client {
    /// Connects to a cluster through any of `addrs` (`host:port` of nodes' gRPC ports),
    /// failing only if none can be reached.
    pub async fn connect(addrs: &[String]) -> Result<Client, Error> {
        Client::connect_with(addrs, Options::default()).await
    }

    /// [`Client::connect`] with tuning.
    pub async fn connect_with(addrs: &[String], options: Options) -> Result<Client, Error> {
        if addrs.is_empty() {
            return Err(Error::Address("no address given".into()));
        }
        let client = Client {
            inner: Arc::new(Inner {
                seeds: addrs.to_vec(),
                options,
                channels: Mutex::new(HashMap::new()),
                leader: Mutex::new(None),
                next: AtomicUsize::new(0),
            }),
        };
        let mut last = String::new();
        for addr in addrs {
            let endpoint = client.endpoint(addr)?;
            let connected = match &client.inner.options.tls {
                Some(tls) => endpoint.connect_with_connector(TlsConnector::new(tls.clone())).await,
                None => endpoint.connect().await,
            };
            match connected {
                Ok(channel) => {
                    lock(&client.inner.channels).insert(addr.clone(), channel);
                    return Ok(client);
                }
                Err(e) => last = format!("{addr}: {e}"),
            }
        }
        Err(Error::Unavailable(format!("no node reachable ({last})")))
    }

    fn endpoint(&self, addr: &str) -> Result<Endpoint, Error> {
        let scheme = if self.inner.options.tls.is_some() { "https" } else { "http" };
        let uri = if addr.contains("://") { addr.to_owned() } else { format!("{scheme}://{addr}") };
        Ok(Endpoint::from_shared(uri)
            .map_err(|e| Error::Address(format!("{addr}: {e}")))?
            .connect_timeout(self.inner.options.connect_timeout)
            .tcp_nodelay(true))
    }

    fn credential(&self) -> Result<Credential, Error> {
        match &self.inner.options.token {
            None => Ok(Credential(None)),
            Some(t) => {
                let mut v: MetadataValue<Ascii> = format!("Bearer {t}")
                    .parse()
                    .map_err(|_| Error::Invalid("the token is not visible ASCII".into()))?;
                // Never put into HTTP/2's header compression tables.
                v.set_sensitive(true);
                Ok(Credential(Some(v)))
            }
        }
    }

    fn channel(&self, addr: &str) -> Result<Channel, Error> {
        if let Some(c) = lock(&self.inner.channels).get(addr) {
            return Ok(c.clone());
        }
        let endpoint = self.endpoint(addr)?;
        let channel = match &self.inner.options.tls {
            Some(tls) => endpoint.connect_with_connector_lazy(TlsConnector::new(tls.clone())),
            None => endpoint.connect_lazy(),
        };
        lock(&self.inner.channels).insert(addr.to_owned(), channel.clone());
        Ok(channel)
    }

    /// The leader's address, as last learned, if any.
    pub fn leader(&self) -> Option<String> {
        lock(&self.inner.leader).clone()
    }

    /// Where the next attempt goes: the known leader, else the next seed in turn.
    fn target(&self) -> String {
        if let Some(l) = self.leader() {
            return l;
        }
        let seeds = &self.inner.seeds;
        seeds[self.inner.next.fetch_add(1, Ordering::Relaxed) % seeds.len()].clone()
    }

    fn learn(&self, meta: &tonic::metadata::MetadataMap, from: &str) {
        let addr = meta.get(LEADER_ADDR_HEADER).and_then(|v| v.to_str().ok());
        let mut leader = lock(&self.inner.leader);
        match addr {
            Some(a) => *leader = Some(a.to_string()),
            // The node knows no leader, or cannot name its address: stop insisting on `from`.
            None if meta.contains_key(NODE_HEADER)
                && !meta.contains_key(LEADER_HEADER)
                && leader.as_deref() == Some(from) =>
            {
                *leader = None;
            }
            None => {}
        }
    }

    fn forget(&self, addr: &str) {
        let mut leader = lock(&self.inner.leader);
        if leader.as_deref() == Some(addr) {
            *leader = None;
        }
    }

    /// Runs one call against the cluster, following the leader and retrying as `retry` allows.
    async fn call<T, F, Fut>(&self, retry: Retry, extra: Duration, f: F) -> Result<T, Error>
    where
        F: Fn(Grpc, Duration) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let deadline = Instant::now() + self.inner.options.retry_for;
        let timeout = self.inner.options.request_timeout + extra;
        let mut pause = Duration::from_millis(20);
        let mut unknown: Option<String> = None;
        loop {
            let addr = self.target();
            let client = DelaydClient::with_interceptor(self.channel(&addr)?, self.credential()?)
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX);
            let failure = match tokio::time::timeout(timeout, f(client, timeout)).await {
                Ok(Ok(resp)) => {
                    self.learn(resp.metadata(), &addr);
                    return Ok(resp.into_inner());
                }
                Ok(Err(s)) => {
                    self.learn(s.metadata(), &addr);
                    classify(&s)
                }
                Err(_) => Failure::Unknown(format!("no answer from {addr} within {timeout:?}")),
            };
            let last = match failure {
                Failure::Final(e) => return Err(e),
                Failure::NotSent(m) => {
                    // A node that sent us away without naming a leader is no better than any
                    // other: try the next.
                    self.forget(&addr);
                    format!("{addr}: {m}")
                }
                Failure::Unknown(m) => {
                    if retry == Retry::Unsafe {
                        return Err(Error::Ambiguous(format!("{addr}: {m}")));
                    }
                    self.forget(&addr);
                    let m = format!("{addr}: {m}");
                    unknown = Some(m.clone());
                    m
                }
            };
            if Instant::now() + pause >= deadline {
                return Err(match unknown {
                    Some(m) => Error::Ambiguous(m),
                    None => Error::Unavailable(last),
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// Publishes one job without a key. An unknown outcome is [`Error::Ambiguous`].
    pub async fn publish(
        &self,
        namespace: &str,
        queue: &str,
        body: Vec<u8>,
        options: JobOptions,
    ) -> Result<Published, Error> {
        self.publish_inner(namespace, queue, body, options, None).await
    }

    /// Publishes one job with an idempotency key, retrying until the outcome is known: the
    /// key makes a retried publish return the job the first attempt created.
    pub async fn publish_keyed(
        &self,
        namespace: &str,
        queue: &str,
        key: &str,
        body: Vec<u8>,
        options: JobOptions,
    ) -> Result<Published, Error> {
        self.publish_inner(namespace, queue, body, options, Some(key.to_string())).await
    }

    /// Publishes one job under a fresh random key, so that it can be retried safely.
    pub async fn publish_idempotent(
        &self,
        namespace: &str,
        queue: &str,
        body: Vec<u8>,
        options: JobOptions,
    ) -> Result<Published, Error> {
        self.publish_keyed(namespace, queue, &random_key(), body, options).await
    }

    async fn publish_inner(
        &self,
        namespace: &str,
        queue: &str,
        body: Vec<u8>,
        options: JobOptions,
        key: Option<String>,
    ) -> Result<Published, Error> {
        let retry = if key.is_some() { Retry::Safe } else { Retry::Unsafe };
        let msg = pb::PublishRequest {
            namespace: namespace.into(),
            queue: queue.into(),
            body,
            options: Some(options),
            key,
        };
        let r = self
            .call(retry, Duration::ZERO, |mut c, t| {
                let msg = msg.clone();
                async move { c.publish(timed(msg, t)).await }
            })
            .await?;
        Ok(Published { job_id: r.job_id, existed: r.existed })
    }

    /// Publishes 1-64 jobs atomically (all or none) and returns their ids.
    pub async fn publish_bulk(
        &self,
        namespace: &str,
        queue: &str,
        bodies: Vec<Vec<u8>>,
        options: JobOptions,
    ) -> Result<Vec<String>, Error> {
        let batch = PublishBatch {
            namespace: namespace.into(),
            queue: queue.into(),
            bodies,
            options: Some(options),
            keys: Vec::new(),
        };
        let mut results = self.publish_stream(vec![batch]).await?;
        let result = results.pop().ok_or_else(|| Error::Internal("no batch result".into()))?;
        batch_ids(result)
    }

    /// Sends batches over one `PublishStream`: the server proposes them as they arrive,
    /// several at once, and answers with each batch's result in order (a failed batch has
    /// `error` set; the others were published). Retried on an unknown outcome only when every
    /// batch is keyed.
    pub async fn publish_stream(
        &self,
        batches: Vec<PublishBatch>,
    ) -> Result<Vec<BatchResult>, Error> {
        if batches.len() > MAX_STREAM_BATCHES {
            return Err(Error::Invalid(format!(
                "a publish stream carries at most {MAX_STREAM_BATCHES} batches, not {}",
                batches.len()
            )));
        }
        let sent = batches.len();
        let keyed = batches.iter().all(|b| !b.keys.is_empty());
        let retry = if keyed { Retry::Safe } else { Retry::Unsafe };
        let r = self
            .call(retry, Duration::ZERO, |mut c, t| {
                let batches = batches.clone();
                async move {
                    let mut req = Request::new(futures::stream::iter(batches));
                    req.set_timeout(t);
                    c.publish_stream(req).await
                }
            })
            .await?;
        if r.batches.len() != sent {
            return Err(Error::Internal(format!(
                "the server answered {} of {sent} batches",
                r.batches.len()
            )));
        }
        Ok(r.batches)
    }

    /// Reserves up to `count` jobs from the queues (in priority order), waiting up to `wait`
    /// for one. An empty result means nothing was available. A reserve whose outcome is
    /// unknown is [`Error::Ambiguous`]: any job it took comes back when its ttr runs out.
    pub async fn reserve(
        &self,
        namespace: &str,
        queues: &[&str],
        count: u32,
        ttr_ms: Option<u64>,
        wait: Duration,
    ) -> Result<Vec<Delivery>, Error> {
        let msg = pb::ReserveRequest {
            namespace: namespace.into(),
            queues: queues.iter().map(|q| q.to_string()).collect(),
            count: Some(count),
            ttr_ms,
            wait_ms: wait.as_millis().try_into().unwrap_or(u64::MAX),
        };
        let r = self
            .call(Retry::Unsafe, wait, |mut c, t| {
                let msg = msg.clone();
                async move { c.reserve(timed(msg, t)).await }
            })
            .await?;
        Ok(r.deliveries)
    }

    /// Acks (deletes) a job; with a lease in `job`, only if it is still current. Returns
    /// whether a job was removed. Retried safely: a repeated ack removes nothing.
    pub async fn ack(&self, job: JobRef) -> Result<bool, Error> {
        let r = self
            .call(Retry::Safe, Duration::ZERO, |mut c, t| {
                let job = job.clone();
                async move { c.ack(timed(job, t)).await }
            })
            .await?;
        Ok(r.removed)
    }

    /// Puts a reserved job back, after `delay_ms`, optionally with a new priority.
    pub async fn release(
        &self,
        job: JobRef,
        delay_ms: u64,
        priority: Option<u32>,
    ) -> Result<Job, Error> {
        let msg = ReleaseRequest { job: Some(job), delay_ms, priority };
        self.call(Retry::Unsafe, Duration::ZERO, |mut c, t| {
            let msg = msg.clone();
            async move { c.release(timed(msg, t)).await }
        })
        .await
    }

    /// Extends a reservation by its ttr, or by `ttr_ms`. Retried safely: a repeated touch
    /// only extends it again from now.
    pub async fn touch(&self, job: JobRef, ttr_ms: Option<u64>) -> Result<Job, Error> {
        let msg = TouchRequest { job: Some(job), ttr_ms };
        self.call(Retry::Safe, Duration::ZERO, |mut c, t| {
            let msg = msg.clone();
            async move { c.touch(timed(msg, t)).await }
        })
        .await
    }

    /// Moves a reserved job to the dead letter.
    pub async fn bury(&self, job: JobRef) -> Result<Job, Error> {
        self.call(Retry::Unsafe, Duration::ZERO, |mut c, t| {
            let job = job.clone();
            async move { c.bury(timed(job, t)).await }
        })
        .await
    }

    /// Acks many jobs in one call; each item is answered on its own.
    pub async fn ack_batch(&self, items: Vec<JobRef>) -> Result<Vec<Result<bool, Error>>, Error> {
        let msg = pb::AckBatchRequest { items };
        let r = self
            .call(Retry::Safe, Duration::ZERO, |mut c, t| {
                let msg = msg.clone();
                async move { c.ack_batch(timed(msg, t)).await }
            })
            .await?;
        Ok(r.results.into_iter().map(|i| item(i).map(|i| i.removed)).collect())
    }

    /// Releases many jobs in one call; each item is answered on its own.
    pub async fn release_batch(
        &self,
        items: Vec<ReleaseRequest>,
    ) -> Result<Vec<Result<Job, Error>>, Error> {
        let msg = pb::ReleaseBatchRequest { items };
        let r = self
            .call(Retry::Unsafe, Duration::ZERO, |mut c, t| {
                let msg = msg.clone();
                async move { c.release_batch(timed(msg, t)).await }
            })
            .await?;
        Ok(job_items(r))
    }

    /// Touches many reservations in one call; each item is answered on its own.
    pub async fn touch_batch(
        &self,
        items: Vec<TouchRequest>,
    ) -> Result<Vec<Result<Job, Error>>, Error> {
        let msg = pb::TouchBatchRequest { items };
        let r = self
            .call(Retry::Safe, Duration::ZERO, |mut c, t| {
                let msg = msg.clone();
                async move { c.touch_batch(timed(msg, t)).await }
            })
            .await?;
        Ok(job_items(r))
    }

    /// Buries many jobs in one call; each item is answered on its own.
    pub async fn bury_batch(&self, items: Vec<JobRef>) -> Result<Vec<Result<Job, Error>>, Error> {
        let msg = pb::BuryBatchRequest { items };
        let r = self
            .call(Retry::Unsafe, Duration::ZERO, |mut c, t| {
                let msg = msg.clone();
                async move { c.bury_batch(timed(msg, t)).await }
            })
            .await?;
        Ok(job_items(r))
    }

    /// One job by id, or with `job_id` `None` the next ready job of the queue
    /// ([`Error::NotFound`] when there is none). Linearizable.
    pub async fn peek(
        &self,
        namespace: &str,
        queue: &str,
        job_id: Option<&str>,
    ) -> Result<Job, Error> {
        let msg = pb::PeekRequest {
            namespace: namespace.into(),
            queue: queue.into(),
            job_id: job_id.unwrap_or_default().into(),
            stale: false,
        };
        self.call(Retry::Safe, Duration::ZERO, |mut c, t| {
            let msg = msg.clone();
            async move { c.peek(timed(msg, t)).await }
        })
        .await
    }

    /// A queue's statistics (the HTTP `/stats` data).
    pub async fn stats(&self, namespace: &str, queue: &str) -> Result<StatsReply, Error> {
        let msg =
            pb::StatsRequest { namespace: namespace.into(), queue: queue.into(), stale: false };
        self.call(Retry::Safe, Duration::ZERO, |mut c, t| {
            let msg = msg.clone();
            async move { c.stats(timed(msg, t)).await }
        })
        .await
    }

    /// Opens a worker's stream on the leader: jobs from `queues` are pushed as they come due,
    /// never more than the credit granted (`initial_credit` now, more with
    /// [`ReserveStream::credit`]).
    pub async fn reserve_stream(
        &self,
        namespace: &str,
        queues: &[&str],
        ttr_ms: Option<u64>,
        initial_credit: u32,
    ) -> Result<ReserveStream, Error> {
        let subscribe = pb::Subscribe {
            namespace: namespace.into(),
            queues: queues.iter().map(|q| q.to_string()).collect(),
            ttr_ms,
        };
        // Opening the stream writes nothing, so it is retried until a node accepts it.
        let opened = std::sync::Mutex::new(None);
        self.call(Retry::Safe, Duration::ZERO, |mut c, _| {
            let (tx, rx) = mpsc::channel::<pb::ReserveStreamRequest>(64);
            let subscribe = subscribe.clone();
            let opened = &opened;
            async move {
                use pb::reserve_stream_request::Msg;
                let first = pb::ReserveStreamRequest { msg: Some(Msg::Subscribe(subscribe)) };
                let credit = pb::ReserveStreamRequest {
                    msg: Some(Msg::Credit(pb::Credit { n: initial_credit })),
                };
                // The channel holds 64, so these never wait.
                let _ = tx.send(first).await;
                if initial_credit > 0 {
                    let _ = tx.send(credit).await;
                }
                let outbound = futures::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|m| (m, rx))
                });
                let resp = c.reserve_stream(outbound).await?;
                let meta = resp.metadata().clone();
                *lock(opened) = Some((tx, resp.into_inner()));
                Ok(Response::from_parts(meta, (), Default::default()))
            }
        })
        .await?;
        let (tx, inbound) = lock(&opened)
            .take()
            .ok_or_else(|| Error::Internal("reserve stream did not open".into()))?;
        Ok(ReserveStream { tx, inbound, acks: VecDeque::new() })
    }
}

fn timed<T>(msg: T, timeout: Duration) -> Request<T> {
    let mut req = Request::new(msg);
    req.set_timeout(timeout);
    req
}

fn random_key() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn item_status(e: &pb::ErrorStatus) -> Error {
    let s = Status::new(Code::from_i32(e.code), e.message.clone());
    match refused(&s) {
        Some(e) => e,
        None if s.code() == Code::Unavailable => Error::Ambiguous(e.message.clone()),
        None => Error::Internal(e.message.clone()),
    }
}

fn item(i: pb::ItemResult) -> Result<pb::ItemResult, Error> {
    match &i.error {
        Some(e) => Err(item_status(e)),
        None => Ok(i),
    }
}

fn job_items(r: pb::BatchReply) -> Vec<Result<Job, Error>> {
    r.results
        .into_iter()
        .map(|i| item(i)?.job.ok_or_else(|| Error::Internal("item without a job".into())))
        .collect()
}

/// A batch result's ids, or its error.
pub fn batch_ids(r: BatchResult) -> Result<Vec<String>, Error> {
    match r.error {
        Some(e) => Err(item_status(&e)),
        None => Ok(r.job_ids),
    }
}

/// A worker's stream of pushed deliveries (see [`Client::reserve_stream`]). Dropping it
/// closes the stream; jobs delivered and not acked come back when their ttr runs out.
pub struct ReserveStream {
    tx: mpsc::Sender<pb::ReserveStreamRequest>,
    inbound: Streaming<pb::ReserveStreamReply>,
    acks: VecDeque<AckResult>,
}

impl ReserveStream {
    async fn send(&self, msg: pb::reserve_stream_request::Msg) -> Result<(), Error> {
        self.tx
            .send(pb::ReserveStreamRequest { msg: Some(msg) })
            .await
            .map_err(|_| Error::Unavailable("reserve stream closed".into()))
    }

    /// Grants `n` more deliveries.
    pub async fn credit(&self, n: u32) -> Result<(), Error> {
        self.send(pb::reserve_stream_request::Msg::Credit(pb::Credit { n })).await
    }

    /// Acks a delivery over the stream; its result arrives later (see
    /// [`ReserveStream::ack_results`]). Acking does not grant credit.
    pub async fn ack(&self, d: &Delivery) -> Result<(), Error> {
        self.send(pb::reserve_stream_request::Msg::Ack(job_ref(d))).await
    }

    /// The next delivery; `None` when the server ended the stream. Ack results that arrive
    /// meanwhile are kept for [`ReserveStream::ack_results`].
    pub async fn next_delivery(&mut self) -> Result<Option<Delivery>, Error> {
        loop {
            match self.next_reply().await? {
                None => return Ok(None),
                Some(pb::reserve_stream_reply::Msg::Delivery(d)) => return Ok(Some(d)),
                Some(pb::reserve_stream_reply::Msg::Ack(a)) => self.acks.push_back(a),
            }
        }
    }

    /// The next ack result, waiting for it if none has arrived (deliveries arriving
    /// meanwhile are an error: call this only when no more deliveries are expected, e.g.
    /// when the credit is used up). `None` when the server ended the stream.
    pub async fn next_ack_result(&mut self) -> Result<Option<AckResult>, Error> {
        if let Some(a) = self.acks.pop_front() {
            return Ok(Some(a));
        }
        match self.next_reply().await? {
            None => Ok(None),
            Some(pb::reserve_stream_reply::Msg::Ack(a)) => Ok(Some(a)),
            Some(pb::reserve_stream_reply::Msg::Delivery(_)) => {
                Err(Error::Internal("a delivery arrived while waiting for an ack result".into()))
            }
        }
    }

    /// Ack results received so far and not yet taken.
    pub fn ack_results(&mut self) -> Vec<AckResult> {
        self.acks.drain(..).collect()
    }

    async fn next_reply(&mut self) -> Result<Option<pb::reserve_stream_reply::Msg>, Error> {
        loop {
            match self.inbound.message().await {
                Ok(None) => return Ok(None),
                Ok(Some(pb::ReserveStreamReply { msg: Some(m) })) => return Ok(Some(m)),
                Ok(Some(_)) => continue,
                Err(s) => {
                    return Err(refused(&s).unwrap_or_else(|| {
                        Error::Unavailable(format!("reserve stream ended: {}", s.message()))
                    }))
                }
            }
        }
    }

    /// Closes the client's side and waits for the server to end the stream, returning the
    /// ack results not taken yet. Deliveries still arriving are dropped: their jobs come back
    /// when their ttr runs out.
    pub async fn close(mut self) -> Result<Vec<AckResult>, Error> {
        let (tx, _) = mpsc::channel(1);
        drop(std::mem::replace(&mut self.tx, tx));
        while let Some(m) = self.next_reply().await? {
            if let pb::reserve_stream_reply::Msg::Ack(a) = m {
                self.acks.push_back(a);
            }
        }
        Ok(self.ack_results())
    }
}
