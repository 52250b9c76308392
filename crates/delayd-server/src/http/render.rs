//! Jobs, deliveries and counts as the HTTP API shows them: lmstfy's fields, with delayd's
//! beside them.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use delayd_core::{Delivery, Job, JobState, QueueMeta, QueueName};
use serde_json::{json, Map, Value};

use crate::service::publish::Published;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A job as lmstfy shows it, with delayd's fields beside lmstfy's.
pub(crate) fn job(job: &Job, now: u64) -> Value {
    let ttl_s = job.expires_ms.map_or(0, |e| e.saturating_sub(now).div_ceil(1000));
    json!({
        "namespace": job.queue.namespace,
        "queue": job.queue.queue,
        "job_id": job.id.to_string(),
        "number": (job.number != 0).then_some(job.number),
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

/// A job handed to a consumer: the job, its lease (hex) and the lease's deadline.
pub(crate) fn delivery(d: &Delivery, now: u64) -> Value {
    let mut v = job(&d.job, now);
    v["msg"] = json!("new job");
    v["lease"] = json!(format!("{:x}", d.lease));
    v["lease_deadline_ms"] = json!(d.job.lease.map(|l| l.deadline_ms));
    v
}

/// A queue's name, pause flag and a count per state.
pub(crate) fn queue(name: &QueueName, meta: &QueueMeta) -> Map<String, Value> {
    let mut v = Map::new();
    v.insert("namespace".into(), json!(name.namespace));
    v.insert("queue".into(), json!(name.queue));
    v.insert("paused".into(), json!(meta.paused));
    for state in JobState::ALL {
        v.insert(state.as_str().into(), json!(meta.count(state)));
    }
    v
}

/// A queue's size in lmstfy's shape (ready jobs, or the dead letter's).
pub(crate) fn size(queue: &QueueName, size: u64) -> Response {
    Json(json!({"namespace": queue.namespace, "queue": queue.queue, "size": size})).into_response()
}

/// 201 with the new job's id, or 200 when its key named a job that already existed.
pub(crate) fn published(r: Published) -> Response {
    if r.existed {
        (StatusCode::OK, Json(json!({"msg": "exists", "job_id": r.id.to_string()}))).into_response()
    } else {
        (StatusCode::CREATED, Json(json!({"msg": "published", "job_id": r.id.to_string()})))
            .into_response()
    }
}

/// 204.
pub(crate) fn no_content() -> Response {
    StatusCode::NO_CONTENT.into_response()
}
