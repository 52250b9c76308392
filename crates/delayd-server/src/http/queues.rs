//! A queue as a whole: `/api/{ns}/{q}/size`, `/stats`, `/pause`, and `DELETE /api/{ns}/{q}`.

use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use delayd_core::JobState;
use serde_json::{json, Value};

use super::error::ApiResult;
use super::extract::{Caller, Params, QueueRef};
use super::render;
use crate::service::Service;

/// `GET /api/{ns}/{q}/size`: how many jobs are ready.
pub(crate) async fn size(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    p: Params,
) -> ApiResult {
    let meta = s.queue_meta(&caller, &queue, p.stale()?).await?;
    Ok(render::size(&queue, meta.count(JobState::Ready)))
}

/// `GET /api/{ns}/{q}/stats`: counts per state, the head's age and when delayed jobs come due.
pub(crate) async fn stats(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    p: Params,
) -> ApiResult {
    let stats = s.stats(&caller, &queue, p.stale()?).await?;
    let hist: Vec<Value> =
        stats.due_histogram.iter().map(|(le, n)| json!({"le_ms": le, "count": n})).collect();
    let mut v = render::queue(&queue, &stats.meta);
    v.insert("head_age_ms".into(), json!(stats.head_age_ms));
    v.insert("due_histogram".into(), json!(hist));
    Ok(Json(v).into_response())
}

/// `PUT /api/{ns}/{q}/pause`: reserves hand nothing out until resumed.
pub(crate) async fn pause(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
) -> ApiResult {
    s.set_paused(&caller, queue, true).await?;
    Ok(render::no_content())
}

/// `DELETE /api/{ns}/{q}/pause`: resumes the queue.
pub(crate) async fn resume(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
) -> ApiResult {
    s.set_paused(&caller, queue, false).await?;
    Ok(render::no_content())
}

/// `DELETE /api/{ns}/{q}?all=`: removes the ready jobs (every job with `all`).
pub(crate) async fn destroy(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    p: Params,
) -> ApiResult {
    s.destroy(&caller, queue, p.flag("all")?).await?;
    Ok(render::no_content())
}
