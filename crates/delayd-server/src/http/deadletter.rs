//! The dead letter: `/api/{ns}/{q}/deadletter` (head, respawn, purge), `/size` and `/jobs`.

use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use delayd_core::JobState;
use serde_json::json;

use super::error::ApiResult;
use super::extract::{Caller, Params, QueueRef};
use super::render;
use crate::service::Service;

/// `GET /api/{ns}/{q}/deadletter`: its size and the id of its oldest job.
pub(crate) async fn head(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    p: Params,
) -> ApiResult {
    let dead = s.dead_letter(&caller, &queue, Some(1), p.stale()?).await?;
    let head = dead.jobs.first().map_or(String::new(), |j| j.id.to_string());
    Ok(Json(json!({
        "namespace": queue.namespace,
        "queue": queue.queue,
        "deadletter_size": dead.size,
        "deadletter_head": head,
    }))
    .into_response())
}

/// `GET /api/{ns}/{q}/deadletter/size`.
pub(crate) async fn size(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    p: Params,
) -> ApiResult {
    let meta = s.queue_meta(&caller, &queue, p.stale()?).await?;
    Ok(render::size(&queue, meta.count(JobState::Dead)))
}

/// `GET /api/{ns}/{q}/deadletter/jobs?limit=`: the oldest dead jobs.
pub(crate) async fn jobs(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    p: Params,
) -> ApiResult {
    let dead = s.dead_letter(&caller, &queue, p.num("limit")?, p.stale()?).await?;
    let now = s.now_ms();
    let jobs: Vec<_> = dead.jobs.iter().map(|j| render::job(j, now)).collect();
    Ok(Json(json!({
        "namespace": queue.namespace,
        "queue": queue.queue,
        "size": dead.size,
        "jobs": jobs,
    }))
    .into_response())
}

/// `PUT /api/{ns}/{q}/deadletter?limit=&ttl=`: moves dead jobs back to ready.
pub(crate) async fn respawn(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    p: Params,
) -> ApiResult {
    let count = s.respawn(&caller, queue, p.num("limit")?, p.secs_as_ms("ttl")?).await?;
    Ok(Json(json!({"msg": "respawned", "count": count})).into_response())
}

/// `DELETE /api/{ns}/{q}/deadletter?limit=`: deletes dead jobs.
pub(crate) async fn purge(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    p: Params,
) -> ApiResult {
    s.purge(&caller, queue, p.num("limit")?).await?;
    Ok(render::no_content())
}
