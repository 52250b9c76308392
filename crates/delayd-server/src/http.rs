//! The HTTP API: lmstfy's data plane, plus delayd's extensions beside it.
//!
//! Handlers only parse and render; every decision is in [`crate::service`]. Parameters are
//! parsed by hand so that a bad one is named in the 400 it causes. Times in lmstfy's
//! parameters are seconds; the `_ms` extensions are milliseconds.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use base64::Engine;
use delayd_core::{Delivery, Due, Job, QueueName, Target};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::error::ServiceError;
use crate::node::Node;
use crate::service::{job_id, queue_name, AckFirst, PublishParams};

/// The one place where service errors become HTTP statuses.
pub fn error(e: &ServiceError) -> StatusCode {
    match e {
        ServiceError::BadRequest(_) => StatusCode::BAD_REQUEST,
        ServiceError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        ServiceError::NotFound(_) => StatusCode::NOT_FOUND,
        ServiceError::Conflict(_) => StatusCode::CONFLICT,
        ServiceError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
        ServiceError::Forbidden(_) => StatusCode::FORBIDDEN,
        ServiceError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
        ServiceError::Unavailable(_) | ServiceError::NotLeader(_) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        ServiceError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A service error as an HTTP response: `{"error": "..."}`.
pub struct ApiError(pub ServiceError);

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        ApiError(e)
    }
}

impl From<delayd_raft::ClusterError> for ApiError {
    fn from(e: delayd_raft::ClusterError) -> Self {
        ApiError(e.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = error(&self.0);
        if status.is_server_error() {
            tracing::warn!(error = %self.0, "request failed");
        }
        (status, Json(json!({ "error": self.0.to_string() }))).into_response()
    }
}

type ApiResult = Result<Response, ApiError>;

/// axum's `Path`, rejecting with a JSON error like every other bad parameter (axum's own
/// rejection is plain text, e.g. for a segment that is not UTF-8).
pub(crate) struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(t)) => Ok(Path(t)),
            Err(r) if r.status().is_client_error() => Err(bad(r.body_text())),
            Err(r) => Err(ApiError(ServiceError::Internal(r.body_text()))),
        }
    }
}

/// `/api/{ns}/{q}/...`: a checked queue name.
struct QueueRef(QueueName);

impl<S: Send + Sync> FromRequestParts<S> for QueueRef {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(params) =
            Path::<HashMap<String, String>>::from_request_parts(parts, state).await?;
        let part = |k: &str| params.get(k).map_or("", String::as_str);
        Ok(QueueRef(queue_name(part("ns"), part("q"))?))
    }
}

/// `/api/{ns}/{q}/key/{key}`: the key (the queue comes from [`QueueRef`]).
#[derive(serde::Deserialize)]
struct KeyPath {
    key: String,
}

/// `/api/{ns}/{q}/job/{id}`: a checked queue name and a parsed job id.
struct JobRef(QueueName, delayd_core::JobId);

impl<S: Send + Sync> FromRequestParts<S> for JobRef {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(params) =
            Path::<HashMap<String, String>>::from_request_parts(parts, state).await?;
        let part = |k: &str| params.get(k).map_or("", String::as_str);
        Ok(JobRef(queue_name(part("ns"), part("q"))?, job_id(part("id"))?))
    }
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError(ServiceError::BadRequest(msg.into()))
}

/// Query parameters, parsed on demand with errors that name the parameter.
pub(crate) struct Params(pub HashMap<String, String>);

impl Params {
    pub(crate) fn str(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    fn num<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, ApiError> {
        match self.str(name) {
            None => Ok(None),
            Some(s) => s.trim().parse().map(Some).map_err(|_| {
                bad(format!("invalid {name} {s:?}: expected a non-negative integer in range"))
            }),
        }
    }

    /// A time in lmstfy's unit, whole seconds of 32 bits (lmstfy's width), as ms.
    fn secs(&self, name: &str) -> Result<Option<u64>, ApiError> {
        Ok(self.num::<u32>(name)?.map(|s| u64::from(s) * 1000))
    }

    pub(crate) fn flag(&self, name: &str) -> Result<bool, ApiError> {
        match self.str(name) {
            None | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") | Some("") => Ok(true),
            Some(s) => Err(bad(format!("invalid {name} {s:?}: expected true or false"))),
        }
    }

    fn lease(&self) -> Result<Option<u64>, ApiError> {
        match self.str("lease") {
            None => Ok(None),
            Some(s) => u64::from_str_radix(s, 16)
                .map(Some)
                .map_err(|_| bad(format!("invalid lease {s:?}: expected the token from reserve"))),
        }
    }

    /// A reserve's `ack` extension: `ack` (a job id) with its `ack_lease`, in `ack_queue`
    /// (default: the first queue reserved from), all of namespace `ns`.
    fn ack_first(&self, ns: &str, queues: &[QueueName]) -> Result<Option<AckFirst>, ApiError> {
        let Some(id) = self.str("ack") else {
            if self.0.contains_key("ack_lease") || self.0.contains_key("ack_queue") {
                return Err(bad("ack_lease and ack_queue need ack (the job id to ack)"));
            }
            return Ok(None);
        };
        let id = job_id(id)?;
        let lease = match self.str("ack_lease") {
            None => None,
            Some(s) => Some(u64::from_str_radix(s, 16).map_err(|_| {
                bad(format!("invalid ack_lease {s:?}: expected the token from reserve"))
            })?),
        };
        let queue = match self.str("ack_queue") {
            Some(q) => queue_name(ns, q)?,
            None => queues.first().cloned().ok_or_else(|| bad("no queue named"))?,
        };
        Ok(Some(AckFirst { queue, id, lease }))
    }

    /// `delay` (s), `delay_ms` or `at` (unix ms); at most one.
    fn due(&self) -> Result<Option<Due>, ApiError> {
        let given = ["delay", "delay_ms", "at"].iter().filter(|p| self.0.contains_key(**p)).count();
        if given > 1 {
            return Err(bad("give only one of delay, delay_ms and at"));
        }
        if let Some(ms) = self.secs("delay")? {
            return Ok(Some(Due::After(ms)));
        }
        if let Some(ms) = self.num::<u64>("delay_ms")? {
            return Ok(Some(Due::After(ms)));
        }
        Ok(self.num::<u64>("at")?.map(Due::At))
    }

    fn publish(&self, headers: &HeaderMap) -> Result<PublishParams, ApiError> {
        let mut p = PublishParams::default();
        if let Some(due) = self.due()? {
            p.due = due;
        }
        if let Some(ttl_ms) = self.secs("ttl")? {
            p.ttl_ms = (ttl_ms > 0).then_some(ttl_ms);
        }
        if let Some(tries) = self.num::<u16>("tries")? {
            p.tries = tries;
        }
        if let Some(ttr_ms) = self.secs("ttr")? {
            if ttr_ms == 0 {
                return Err(bad("ttr must be at least 1 second"));
            }
            p.ttr_ms = ttr_ms;
        }
        if let Some(priority) = self.num::<u32>("priority")? {
            p.priority = priority;
        }
        p.key = self.str("key").map(str::to_string);
        p.attributes = attributes(headers)?;
        Ok(p)
    }
}

/// Attributes from `Job-Attr-{Name}` headers.
fn attributes(headers: &HeaderMap) -> Result<BTreeMap<String, String>, ApiError> {
    let mut attrs = BTreeMap::new();
    for (name, value) in headers {
        if let Some(attr) = name.as_str().strip_prefix("job-attr-") {
            let value = value
                .to_str()
                .map_err(|_| bad(format!("attribute {attr} is not visible ASCII")))?;
            attrs.insert(attr.to_string(), value.to_string());
        }
    }
    Ok(attrs)
}

fn body(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Vec<u8>, ApiError> {
    match body {
        Ok(b) => Ok(b.to_vec()),
        Err(r) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Err(ApiError(ServiceError::TooLarge(format!(
                "the request body is larger than the limit of {limit} bytes"
            ))))
        }
        Err(r) => Err(bad(format!("cannot read body: {}", r.body_text()))),
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A job as lmstfy shows it, with delayd's fields beside lmstfy's.
fn job_json(job: &Job, now: u64) -> Value {
    let ttl_s = job.expires_ms.map_or(0, |e| e.saturating_sub(now).div_ceil(1000));
    json!({
        "namespace": job.queue.namespace,
        "queue": job.queue.queue,
        "job_id": job.id.to_string(),
        "data": b64(&job.body),
        "ttl": ttl_s,
        "elapsed_ms": now.saturating_sub(job.created_ms),
        "remain_tries": job.remain_tries(),
        "attributes": if job.attributes.is_empty() { Value::Null } else { json!(job.attributes) },
        "state": job.state.as_str(),
        "priority": job.priority,
        "due_at_ms": job.due_ms,
        "attempt": job.attempts,
        "key": job.key,
    })
}

fn delivery_json(d: &Delivery, now: u64) -> Value {
    let mut v = job_json(&d.job, now);
    v["msg"] = json!("new job");
    v["lease"] = json!(format!("{:x}", d.lease));
    v["lease_deadline_ms"] = json!(d.job.lease.map(|l| l.deadline_ms));
    v
}

fn no_content() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

/// Builds the router over a node.
pub fn router(node: Node) -> Router {
    let limit = node.config().max_body_bytes;
    // A bulk's bodies must fit one log entry together; its JSON framing is small beside them.
    let bulk_limit = node.config().max_entry_bytes.saturating_add(64 * 1024);
    let debug = node.config().debug_clock;
    let router = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(crate::metrics::scrape))
        .merge(crate::admin::routes())
        .merge(crate::tokens::routes())
        .merge(crate::dashboard::routes())
        .route("/api/{ns}/{q}", put(publish).get(reserve).delete(destroy))
        .route("/api/{ns}/{q}/bulk", put(bulk).layer(DefaultBodyLimit::max(bulk_limit)))
        .route("/api/{ns}/{q}/job/{id}", get(peek_job).put(republish).delete(ack).patch(update))
        .route("/api/{ns}/{q}/job/{id}/release", put(release))
        .route("/api/{ns}/{q}/job/{id}/touch", put(touch))
        .route("/api/{ns}/{q}/job/{id}/bury", put(bury))
        .route("/api/{ns}/{q}/key/{key}", get(by_key).delete(cancel_key))
        .route("/api/{ns}/{q}/peek", get(peek))
        .route("/api/{ns}/{q}/size", get(size))
        .route("/api/{ns}/{q}/stats", get(stats))
        .route("/api/{ns}/{q}/pause", put(pause).delete(resume))
        .route("/api/{ns}/{q}/deadletter", get(dead_head).put(respawn).delete(purge))
        .route("/api/{ns}/{q}/deadletter/size", get(dead_size))
        .route("/api/{ns}/{q}/deadletter/jobs", get(dead_jobs));
    let router =
        if debug { router.route("/debug/clock", get(clock).put(set_clock)) } else { router };
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(node.clone(), crate::auth::middleware))
        // Outside authentication, so refused requests (401/403/429) are counted too.
        .layer(axum::middleware::from_fn_with_state(node.clone(), crate::metrics::track_http))
        // Outermost: the request id's span covers authentication too.
        .layer(axum::middleware::from_fn(crate::request_id::middleware))
        .with_state(node)
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, Json(json!({"error": "api not found"}))).into_response()
}

async fn method_not_allowed() -> Response {
    (StatusCode::METHOD_NOT_ALLOWED, Json(json!({"error": "method not allowed"}))).into_response()
}

async fn health(State(node): State<Node>) -> Response {
    let m = node.cluster().metrics();
    Json(json!({
        "node_id": m.id,
        "state": format!("{:?}", m.state),
        "leader": m.current_leader,
        "term": m.current_term,
        "last_applied": m.last_applied.map(|l| l.index),
    }))
    .into_response()
}

/// `GET /debug/clock`: this node's clock and its offset from the wall clock.
async fn clock(State(node): State<Node>) -> Response {
    let clock = node.clock();
    Json(json!({"offset_ms": clock.offset_ms(), "now_ms": clock.now_ms()})).into_response()
}

/// `PUT /debug/clock?offset_ms=N`: shift this node's wall clock by N ms (negative: behind).
/// Only routed with `--debug-clock`.
async fn set_clock(State(node): State<Node>, Query(p): Q) -> ApiResult {
    let offset: i64 = match p.get("offset_ms") {
        None => return Err(bad("offset_ms is required")),
        Some(v) => v.parse().map_err(|_| bad("offset_ms must be an integer (ms)"))?,
    };
    // A day either way is far more skew than any test needs, and keeps the arithmetic safe.
    if offset.unsigned_abs() > 86_400_000 {
        return Err(bad("offset_ms must be within ±86400000"));
    }
    node.clock().set_offset_ms(offset);
    tracing::warn!(offset_ms = offset, "debug clock offset set");
    Ok(Json(json!({"offset_ms": offset, "now_ms": node.clock().now_ms()})).into_response())
}

type QueuePath = Path<(String, String)>;
type Q = Query<HashMap<String, String>>;

async fn publish(
    State(node): State<Node>,
    QueueRef(queue): QueueRef,
    Query(params): Q,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let p = Params(params).publish(&headers)?;
    let data = body(raw, node.config().max_body_bytes)?;
    let r = node.publish(queue, &p, data).await?;
    Ok(published(r))
}

fn published(r: crate::service::Published) -> Response {
    if r.existed {
        (StatusCode::OK, Json(json!({"msg": "exists", "job_id": r.id.to_string()}))).into_response()
    } else {
        (StatusCode::CREATED, Json(json!({"msg": "published", "job_id": r.id.to_string()})))
            .into_response()
    }
}

async fn bulk(
    State(node): State<Node>,
    QueueRef(queue): QueueRef,
    Query(params): Q,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let p = Params(params).publish(&headers)?;
    let data = body(raw, node.config().max_entry_bytes.saturating_add(64 * 1024))?;
    // As lmstfy does, each element's JSON text is one job's body.
    let jobs: Vec<Box<serde_json::value::RawValue>> = serde_json::from_slice(&data)
        .map_err(|e| bad(format!("bulk body must be a JSON array of jobs: {e}")))?;
    let bodies = jobs.into_iter().map(|j| j.get().as_bytes().to_vec()).collect();
    let ids = node.publish_bulk(queue, &p, bodies).await?;
    let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
    Ok((StatusCode::CREATED, Json(json!({"msg": "published", "job_ids": ids}))).into_response())
}

async fn republish(
    State(node): State<Node>,
    JobRef(queue, id): JobRef,
    Query(params): Q,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let old = id;
    let p = Params(params).publish(&headers)?;
    let data = body(raw, node.config().max_body_bytes)?;
    Ok(published(node.republish(queue, old, &p, data).await?))
}

async fn reserve(
    State(node): State<Node>,
    Path((ns, qs)): QueuePath,
    Query(params): Q,
) -> ApiResult {
    let queues = qs
        .split(',')
        .map(|q| queue_name(&ns, q))
        .collect::<Result<Vec<QueueName>, ServiceError>>()?;
    let p = Params(params);
    let ttr_ms = match (p.secs("ttr")?, p.num::<u64>("ttr_ms")?) {
        (Some(_), Some(_)) => return Err(bad("give only one of ttr and ttr_ms")),
        (Some(0), None) | (None, Some(0)) => return Err(bad("ttr must be positive")),
        (Some(ms), None) | (None, Some(ms)) => Some(ms),
        // Each job's own ttr, which defaults to lmstfy's 120 s.
        (None, None) => None,
    };
    let wait = Duration::from_secs(p.num::<u64>("timeout")?.unwrap_or(0));
    let count_given = p.num::<u32>("count")?;
    let count = count_given.unwrap_or(1);
    let ack = p.ack_first(&ns, &queues)?;
    let (acked, got) = node.reserve_after_ack(queues, count, ttr_ms, wait, ack).await?;
    // The extension's answer says whether the previous job went; lmstfy's shape otherwise.
    let with_acked = |mut v: Value| {
        if let Some(a) = acked {
            v["acked"] = json!(a);
        }
        v
    };
    if got.is_empty() {
        let v = with_acked(json!({"msg": "no job available"}));
        return Ok((StatusCode::NOT_FOUND, Json(v)).into_response());
    }
    let now = node.clock().now_ms();
    // lmstfy answers one object for count=1 and an array when more were asked for (the
    // array has no room for `acked`: it travels in a header as well).
    let mut resp = if count > 1 {
        let all: Vec<Value> = got.iter().map(|d| delivery_json(d, now)).collect();
        Json(Value::Array(all)).into_response()
    } else {
        Json(with_acked(delivery_json(&got[0], now))).into_response()
    };
    if let Some(a) = acked {
        resp.headers_mut()
            .insert("delayd-acked", HeaderValue::from_static(if a { "true" } else { "false" }));
    }
    Ok(resp)
}

async fn ack(State(node): State<Node>, JobRef(queue, id): JobRef, Query(params): Q) -> ApiResult {
    node.ack(queue, id, Params(params).lease()?).await?;
    Ok(no_content())
}

async fn release(
    State(node): State<Node>,
    JobRef(queue, id): JobRef,
    Query(params): Q,
) -> ApiResult {
    let p = Params(params);
    let delay_ms = match p.due()? {
        None => 0,
        Some(Due::After(ms)) => ms,
        Some(Due::At(_)) => return Err(bad("release takes delay or delay_ms, not at")),
    };
    let job = node.release(queue, id, p.lease()?, delay_ms, p.num("priority")?).await?;
    Ok(Json(job_json(&job, node.clock().now_ms())).into_response())
}

async fn touch(State(node): State<Node>, JobRef(queue, id): JobRef, Query(params): Q) -> ApiResult {
    let p = Params(params);
    let ttr_ms = match (p.secs("ttr")?, p.num::<u64>("ttr_ms")?) {
        (Some(_), Some(_)) => return Err(bad("give only one of ttr and ttr_ms")),
        (Some(0), None) | (None, Some(0)) => return Err(bad("ttr must be positive")),
        (s, ms) => s.or(ms),
    };
    let job = node.touch(queue, id, p.lease()?, ttr_ms).await?;
    Ok(Json(job_json(&job, node.clock().now_ms())).into_response())
}

async fn bury(State(node): State<Node>, JobRef(queue, id): JobRef, Query(params): Q) -> ApiResult {
    let job = node.bury(queue, id, Params(params).lease()?).await?;
    Ok(Json(job_json(&job, node.clock().now_ms())).into_response())
}

async fn update(
    State(node): State<Node>,
    JobRef(queue, id): JobRef,
    Query(params): Q,
    raw: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let p = Params(params);
    let data = body(raw, node.config().max_body_bytes)?;
    let due = p.due()?;
    let priority = p.num("priority")?;
    let new_body = (!data.is_empty()).then_some(data);
    if due.is_none() && priority.is_none() && new_body.is_none() {
        return Err(bad("nothing to update: give delay, delay_ms, at, priority or a body"));
    }
    let job = node.update(queue, Target::Id(id), due, new_body, priority).await?;
    Ok(Json(job_json(&job, node.clock().now_ms())).into_response())
}

fn job_or_404(node: &Node, job: Option<Job>, missing: &str) -> ApiResult {
    match job {
        Some(job) => Ok(Json(job_json(&job, node.clock().now_ms())).into_response()),
        None => Err(ApiError(ServiceError::NotFound(missing.into()))),
    }
}

fn stale(p: &Params) -> Result<bool, ApiError> {
    p.flag("stale")
}

async fn peek_job(
    State(node): State<Node>,
    JobRef(queue, id): JobRef,
    Query(params): Q,
) -> ApiResult {
    job_or_404(&node, node.job(&queue, id, stale(&Params(params))?).await?, "job not found")
}

async fn by_key(
    State(node): State<Node>,
    QueueRef(queue): QueueRef,
    Path(KeyPath { key, .. }): Path<KeyPath>,
    Query(params): Q,
) -> ApiResult {
    job_or_404(
        &node,
        node.job_by_key(&queue, &key, stale(&Params(params))?).await?,
        "job not found",
    )
}

async fn cancel_key(
    State(node): State<Node>,
    QueueRef(queue): QueueRef,
    Path(KeyPath { key, .. }): Path<KeyPath>,
) -> ApiResult {
    node.cancel(queue, Target::Key(key)).await?;
    Ok(no_content())
}

async fn peek(State(node): State<Node>, QueueRef(queue): QueueRef, Query(params): Q) -> ApiResult {
    job_or_404(&node, node.peek(&queue, stale(&Params(params))?).await?, "the queue is empty")
}

async fn size(State(node): State<Node>, QueueRef(queue): QueueRef, Query(params): Q) -> ApiResult {
    let meta = node.queue_meta(&queue, stale(&Params(params))?).await?;
    let size = meta.count(delayd_core::JobState::Ready);
    Ok(Json(json!({"namespace": queue.namespace, "queue": queue.queue, "size": size}))
        .into_response())
}

async fn stats(State(node): State<Node>, QueueRef(queue): QueueRef, Query(params): Q) -> ApiResult {
    let s = node.stats(&queue, stale(&Params(params))?).await?;
    let hist: Vec<Value> =
        s.due_histogram.iter().map(|(le, n)| json!({"le_ms": le, "count": n})).collect();
    let c = s.meta.counts;
    Ok(Json(json!({
        "namespace": queue.namespace,
        "queue": queue.queue,
        "paused": s.meta.paused,
        "delayed": c[0], "ready": c[1], "reserved": c[2], "dead": c[3],
        "head_age_ms": s.head_age_ms,
        "due_histogram": hist,
    }))
    .into_response())
}

async fn pause(State(node): State<Node>, QueueRef(queue): QueueRef) -> ApiResult {
    node.set_paused(queue, true).await?;
    Ok(no_content())
}

async fn resume(State(node): State<Node>, QueueRef(queue): QueueRef) -> ApiResult {
    node.set_paused(queue, false).await?;
    Ok(no_content())
}

async fn destroy(
    State(node): State<Node>,
    QueueRef(queue): QueueRef,
    Query(params): Q,
) -> ApiResult {
    node.destroy(queue, Params(params).flag("all")?).await?;
    Ok(no_content())
}

async fn dead_head(
    State(node): State<Node>,
    QueueRef(queue): QueueRef,
    Query(params): Q,
) -> ApiResult {
    let (size, jobs) = node.dead_letter(&queue, 1, stale(&Params(params))?).await?;
    let head = jobs.first().map_or(String::new(), |j| j.id.to_string());
    Ok(Json(json!({"namespace": queue.namespace, "queue": queue.queue, "deadletter_size": size, "deadletter_head": head}))
        .into_response())
}

async fn dead_size(
    State(node): State<Node>,
    QueueRef(queue): QueueRef,
    Query(params): Q,
) -> ApiResult {
    let (size, _) = node.dead_letter(&queue, 0, stale(&Params(params))?).await?;
    Ok(Json(json!({"namespace": queue.namespace, "queue": queue.queue, "size": size}))
        .into_response())
}

async fn dead_jobs(
    State(node): State<Node>,
    QueueRef(queue): QueueRef,
    Query(params): Q,
) -> ApiResult {
    let p = Params(params);
    let n = match p.num::<u32>("limit")? {
        None => 10,
        Some(n) if (1..=1000).contains(&n) => n,
        Some(_) => return Err(bad("limit must be 1 to 1000")),
    };
    let (size, jobs) = node.dead_letter(&queue, n as usize, stale(&p)?).await?;
    let now = node.clock().now_ms();
    let jobs: Vec<Value> = jobs.iter().map(|j| job_json(j, now)).collect();
    Ok(Json(
        json!({"namespace": queue.namespace, "queue": queue.queue, "size": size, "jobs": jobs}),
    )
    .into_response())
}

async fn respawn(
    State(node): State<Node>,
    QueueRef(queue): QueueRef,
    Query(params): Q,
) -> ApiResult {
    let p = Params(params);
    // Bounded by the service, like every protocol's respawn.
    let n = p.num::<u32>("limit")?.unwrap_or(1);
    let ttl_ms = match p.secs("ttl")? {
        None => Some(86_400_000),
        Some(0) => None,
        Some(ms) => Some(ms),
    };
    let count = node.respawn(queue, n, ttl_ms).await?;
    Ok(Json(json!({"msg": "respawned", "count": count})).into_response())
}

async fn purge(State(node): State<Node>, QueueRef(queue): QueueRef, Query(params): Q) -> ApiResult {
    let n = Params(params).num::<u32>("limit")?.unwrap_or(1);
    node.purge(queue, n).await?;
    Ok(no_content())
}
