//! Producing and consuming: `/api/{ns}/{q}` (publish, reserve), `/bulk`, `/job/{id}` and
//! `/key/{key}`.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use delayd_core::{Due, Job, Target};
use serde_json::json;

use super::error::{bad, ApiError, ApiResult};
use super::extract::{body, split_json_array, Caller, JobRef, Params, Path, Publishing, QueueRef};
use super::render;
use crate::error::ServiceError;
use crate::service::jobs::JobUpdate;
use crate::service::reserve::{ReserveOrder, ReserveRequest};
use crate::service::validate::queue_names;
use crate::service::Service;

/// `PUT /api/{ns}/{q}`: publishes the body as one job.
pub(crate) async fn publish(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    Publishing(p): Publishing,
    raw: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let data = body(raw, s.config().max_body_bytes)?;
    Ok(render::published(s.publish(&caller, queue, &p, data).await?))
}

/// `PUT /api/{ns}/{q}/bulk`: publishes each element of a JSON array as a job, all or none.
pub(crate) async fn bulk(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    Publishing(p): Publishing,
    raw: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let data = body(raw, s.config().max_request_bytes())?;
    // As lmstfy does, each element's JSON text is one job's body.
    let bodies = || split_json_array(&data);
    let published = s.publish_bulk(&caller, queue, &p, bodies, Vec::new()).await?;
    let ids: Vec<String> = published.iter().map(|p| p.id.to_string()).collect();
    Ok((StatusCode::CREATED, Json(json!({"msg": "published", "job_ids": ids}))).into_response())
}

/// `PUT /api/{ns}/{q}/job/{id}`: replaces the job by a new one.
pub(crate) async fn republish(
    State(s): State<Service>,
    Caller(caller): Caller,
    JobRef(queue, old): JobRef,
    Publishing(p): Publishing,
    raw: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let data = body(raw, s.config().max_body_bytes)?;
    Ok(render::published(s.republish(&caller, queue, old, &p, data).await?))
}

/// `GET /api/{ns}/{q1,q2,...}`: reserves, long-polling up to `timeout` seconds.
pub(crate) async fn reserve(
    State(s): State<Service>,
    Caller(caller): Caller,
    Path((ns, qs)): Path<(String, String)>,
    p: Params,
) -> ApiResult {
    let queues = queue_names(&ns, qs.split(','))?;
    let count = p.num::<u32>("count")?.unwrap_or(1);
    let request = ReserveRequest {
        acks: p.ack_first(&ns, &queues)?,
        order: ReserveOrder::QueueOrder,
        queues,
        count,
        ttr_ms: p.ttr()?,
        wait: Duration::from_secs(p.num::<u64>("timeout")?.unwrap_or(0)),
    };
    let got = s.reserve(&caller, request).await?;
    let acked = render::Acked::of(&got.acked);
    let now = s.now_ms();
    // lmstfy answers one object for count=1 and an array when more were asked for (the
    // array has no room for `acked`: it travels in a header as well, on every answer).
    let mut resp = match got.deliveries.as_slice() {
        [] => {
            let mut v = json!({"msg": "no job available"});
            if let Some(a) = acked {
                v["acked"] = json!(a);
            }
            (StatusCode::NOT_FOUND, Json(v)).into_response()
        }
        [one] if count == 1 => render::answers(&[render::delivery(one, now, acked)], false),
        all => {
            let answers: Vec<_> = all.iter().map(|d| render::delivery(d, now, None)).collect();
            render::answers(&answers, true)
        }
    };
    if let Some(header) = acked.and_then(|a| HeaderValue::from_str(&a.header()).ok()) {
        resp.headers_mut().insert("delayd-acked", header);
    }
    Ok(resp)
}

fn job_answer(s: &Service, job: &Job) -> Response {
    render::answers(&[render::job(job, s.now_ms())], false)
}

/// `DELETE /api/{ns}/{q}/job/{id}`: acks the job.
pub(crate) async fn ack(
    State(s): State<Service>,
    Caller(caller): Caller,
    JobRef(queue, id): JobRef,
    p: Params,
) -> ApiResult {
    // 204 whatever the ack finds: without a lease, nothing it finds changes the answer, so
    // it is answered once committed; a lease that may not be current waits for the outcome.
    match p.lease()? {
        None => s.ack_committed(&caller, queue, id).await?,
        lease => {
            s.ack(&caller, queue, id, lease).await?;
        }
    }
    Ok(render::no_content())
}

/// `PUT /api/{ns}/{q}/job/{id}/release`: puts a reserved job back, now or after a delay.
pub(crate) async fn release(
    State(s): State<Service>,
    Caller(caller): Caller,
    JobRef(queue, id): JobRef,
    p: Params,
) -> ApiResult {
    let delay_ms = match p.due()? {
        None => 0,
        Some(Due::After(ms)) => ms,
        Some(Due::At(_)) => return Err(bad("release takes delay or delay_ms, not at")),
    };
    let job = s.release(&caller, queue, id, p.lease()?, delay_ms, p.num("priority")?).await?;
    Ok(job_answer(&s, &job))
}

/// `PUT /api/{ns}/{q}/job/{id}/touch`: extends the reservation.
pub(crate) async fn touch(
    State(s): State<Service>,
    Caller(caller): Caller,
    JobRef(queue, id): JobRef,
    p: Params,
) -> ApiResult {
    let job = s.touch(&caller, queue, id, p.lease()?, p.ttr()?).await?;
    Ok(job_answer(&s, &job))
}

/// `PUT /api/{ns}/{q}/job/{id}/bury`: moves a reserved job to the dead letter.
pub(crate) async fn bury(
    State(s): State<Service>,
    Caller(caller): Caller,
    JobRef(queue, id): JobRef,
    p: Params,
) -> ApiResult {
    let job = s.bury(&caller, queue, id, p.lease()?, p.num("priority")?).await?;
    Ok(job_answer(&s, &job))
}

/// `PATCH /api/{ns}/{q}/job/{id}`: changes a pending job's due time, priority or body.
pub(crate) async fn update(
    State(s): State<Service>,
    Caller(caller): Caller,
    JobRef(queue, id): JobRef,
    p: Params,
    raw: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let data = body(raw, s.config().max_body_bytes)?;
    let change = JobUpdate {
        due: p.due()?,
        priority: p.num("priority")?,
        body: (!data.is_empty()).then_some(data),
    };
    let job = s.update(&caller, queue, Target::Id(id), change).await?;
    Ok(job_answer(&s, &job))
}

fn job_or_404(s: &Service, job: Option<Job>, missing: &str) -> ApiResult {
    match job {
        Some(job) => Ok(job_answer(s, &job)),
        None => Err(ApiError(ServiceError::NotFound(missing.into()))),
    }
}

/// `GET /api/{ns}/{q}/job/{id}`: the job, whatever its state.
pub(crate) async fn peek_job(
    State(s): State<Service>,
    Caller(caller): Caller,
    JobRef(queue, id): JobRef,
    p: Params,
) -> ApiResult {
    job_or_404(&s, s.job(&caller, &queue, id, p.stale()?).await?, "job not found")
}

/// `/api/{ns}/{q}/key/{key}`: the key (the queue comes from [`QueueRef`]).
#[derive(serde::Deserialize)]
pub(crate) struct KeyPath {
    key: String,
}

/// `GET /api/{ns}/{q}/key/{key}`: the live job holding the key.
pub(crate) async fn by_key(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    Path(KeyPath { key }): Path<KeyPath>,
    p: Params,
) -> ApiResult {
    job_or_404(&s, s.job_by_key(&caller, &queue, &key, p.stale()?).await?, "job not found")
}

/// `DELETE /api/{ns}/{q}/key/{key}`: deletes the job holding the key.
pub(crate) async fn cancel_key(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    Path(KeyPath { key }): Path<KeyPath>,
) -> ApiResult {
    s.cancel(&caller, queue, Target::Key(key)).await?;
    Ok(render::no_content())
}

/// `GET /api/{ns}/{q}/peek`: the next ready job.
pub(crate) async fn peek(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    p: Params,
) -> ApiResult {
    job_or_404(&s, s.peek(&caller, &queue, p.stale()?).await?, "the queue is empty")
}
