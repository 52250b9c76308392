//! Recurring jobs: `PUT`, `GET` and `DELETE /api/{ns}/{q}/schedules/{name}`, and
//! `GET /api/{ns}/{q}/schedules`.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use base64::Engine;
use delayd_core::{CatchUp, QueueName, Schedule, Timetable};
use serde_json::{json, Value};

use super::error::ApiResult;
use super::extract::{body, Caller, Params, Path, QueueRef};
use super::render;
use crate::error::ServiceError;
use crate::service::schedules::ScheduleRequest;
use crate::service::Service;

/// The body of a `PUT`. Times of the jobs (`ttl`, `ttr`) are seconds, as in a publish.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    cron: Option<String>,
    every_ms: Option<u64>,
    tz: Option<String>,
    /// The jobs' body, base64.
    data: Option<String>,
    ttl: Option<u32>,
    tries: Option<u16>,
    ttr: Option<u32>,
    priority: Option<u32>,
    #[serde(default)]
    attributes: BTreeMap<String, String>,
    start_at_ms: Option<u64>,
    end_at_ms: Option<u64>,
    catch_up: Option<String>,
}

fn decode(data: &[u8]) -> Result<ScheduleRequest, ServiceError> {
    let b: Body = serde_json::from_slice(data)
        .map_err(|e| ServiceError::bad_request(format!("invalid schedule: {e}")))?;
    let body = match b.data {
        None => Vec::new(),
        Some(d) => base64::engine::general_purpose::STANDARD
            .decode(d.as_bytes())
            .map_err(|e| ServiceError::bad_request(format!("data is not base64: {e}")))?,
    };
    if b.ttr == Some(0) {
        return Err(ServiceError::bad_request("ttr must be positive"));
    }
    Ok(ScheduleRequest {
        cron: b.cron,
        every_ms: b.every_ms,
        tz: b.tz,
        body,
        ttl_ms: b.ttl.map(|s| u64::from(s) * 1000),
        tries: b.tries,
        ttr_ms: b.ttr.map(|s| u64::from(s) * 1000),
        priority: b.priority,
        attributes: b.attributes,
        start_at_ms: b.start_at_ms,
        end_at_ms: b.end_at_ms,
        catch_up: b.catch_up,
    })
}

fn schedule_json(queue: &QueueName, s: &Schedule) -> Value {
    let mut v = json!({
        "namespace": queue.namespace,
        "queue": queue.queue,
        "name": s.name,
        "data": base64::engine::general_purpose::STANDARD.encode(&s.job.body),
        "ttl": s.job.ttl_ms.map_or(0, |ms| ms / 1000),
        "tries": s.job.tries,
        "ttr": s.job.ttr_ms / 1000,
        "priority": s.job.priority,
        "attributes": s.job.attributes,
        "start_at_ms": s.start_at_ms,
        "end_at_ms": s.end_at_ms,
        "catch_up": match s.catch_up {
            CatchUp::Latest => "latest",
            CatchUp::None => "none",
            CatchUp::All => "all",
        },
        "next_at_ms": s.next_at_ms,
    });
    match &s.timetable {
        Timetable::Every { ms } => v["every_ms"] = json!(ms),
        Timetable::Cron { expr, tz } => {
            v["cron"] = json!(expr);
            v["tz"] = json!(tz);
        }
    }
    v
}

/// `PUT /api/{ns}/{q}/schedules/{name}`: 201 when created, 200 when it replaced one.
pub(crate) async fn set(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    Path(NamePath { name, .. }): Path<NamePath>,
    raw: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let data = body(raw, s.config().max_body_bytes)?;
    let (schedule, replaced) =
        s.set_schedule(&caller, queue.clone(), &name, || decode(&data)).await?;
    let status = if replaced { StatusCode::OK } else { StatusCode::CREATED };
    Ok((status, Json(schedule_json(&queue, &schedule))).into_response())
}

/// `/api/{ns}/{q}/schedules/{name}`: the name (the queue comes from [`QueueRef`]).
#[derive(serde::Deserialize)]
pub(crate) struct NamePath {
    name: String,
}

/// `GET /api/{ns}/{q}/schedules/{name}`.
pub(crate) async fn show(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    Path(NamePath { name }): Path<NamePath>,
    p: Params,
) -> ApiResult {
    let schedule = s.schedule(&caller, &queue, &name, p.stale()?).await?;
    Ok(Json(schedule_json(&queue, &schedule)).into_response())
}

/// `GET /api/{ns}/{q}/schedules`: every schedule of the queue with its next occurrence.
pub(crate) async fn list(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    p: Params,
) -> ApiResult {
    let all = s.schedules(&caller, &queue, p.stale()?).await?;
    let list: Vec<Value> = all.iter().map(|sc| schedule_json(&queue, sc)).collect();
    Ok(Json(json!({"namespace": queue.namespace, "queue": queue.queue, "schedules": list}))
        .into_response())
}

/// `DELETE /api/{ns}/{q}/schedules/{name}`: jobs it already published stay.
pub(crate) async fn remove(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    Path(NamePath { name }): Path<NamePath>,
) -> ApiResult {
    s.delete_schedule(&caller, queue, &name).await?;
    Ok(render::no_content())
}
