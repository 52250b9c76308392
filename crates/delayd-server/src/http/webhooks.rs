//! A queue's webhook: `PUT`, `GET` and `DELETE /api/{ns}/{q}/webhook`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use delayd_core::{QueueName, Webhook};
use serde_json::{json, Value};

use super::error::{ApiError, ApiResult};
use super::extract::{body, Caller, Params, QueueRef};
use super::render;
use crate::error::ServiceError;
use crate::service::webhooks::WebhookRequest;
use crate::service::Service;

/// The body of a `PUT`: every field but `url` is optional.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    url: String,
    timeout_ms: Option<u64>,
    max_in_flight: Option<u64>,
    rate_per_s: Option<u64>,
    backoff_initial_ms: Option<u64>,
    backoff_max_ms: Option<u64>,
    secret: Option<String>,
}

/// A webhook as shown; the secret only when it was just set.
fn webhook_json(queue: &QueueName, w: &Webhook, with_secret: bool) -> Value {
    let mut v = json!({
        "namespace": queue.namespace,
        "queue": queue.queue,
        "url": w.url,
        "timeout_ms": w.timeout_ms,
        "max_in_flight": w.max_in_flight,
        "rate_per_s": w.rate_per_s,
        "backoff_initial_ms": w.backoff_initial_ms,
        "backoff_max_ms": w.backoff_max_ms,
    });
    if with_secret {
        v["secret"] = json!(w.secret);
    }
    v
}

/// `PUT /api/{ns}/{q}/webhook`: sets the queue's webhook; 201, or 200 when it replaced one.
/// The answer carries the secret, this once.
pub(crate) async fn set(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    raw: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let data = body(raw, s.config().max_body_bytes)?;
    let decode = || {
        let b: Body = serde_json::from_slice(&data).map_err(|e| {
            ServiceError::bad_request(format!("the webhook must be a JSON object with a url: {e}"))
        })?;
        Ok(WebhookRequest {
            url: b.url,
            timeout_ms: b.timeout_ms,
            max_in_flight: b.max_in_flight,
            rate_per_s: b.rate_per_s,
            backoff_initial_ms: b.backoff_initial_ms,
            backoff_max_ms: b.backoff_max_ms,
            secret: b.secret,
        })
    };
    let set = s.set_webhook(&caller, queue.clone(), decode).await?;
    let status = if set.replaced { StatusCode::OK } else { StatusCode::CREATED };
    Ok((status, Json(webhook_json(&queue, &set.webhook, true))).into_response())
}

/// `GET /api/{ns}/{q}/webhook`: the queue's webhook, without its secret.
pub(crate) async fn show(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
    p: Params,
) -> ApiResult {
    match s.webhook(&caller, &queue, p.stale()?).await? {
        Some(w) => Ok(Json(webhook_json(&queue, &w, false)).into_response()),
        None => Err(ApiError(ServiceError::NotFound(format!("queue {queue} has no webhook")))),
    }
}

/// `DELETE /api/{ns}/{q}/webhook`: the queue is pull-only again.
pub(crate) async fn remove(
    State(s): State<Service>,
    Caller(caller): Caller,
    QueueRef(queue): QueueRef,
) -> ApiResult {
    s.delete_webhook(&caller, queue).await?;
    Ok(render::no_content())
}
