//! The operator's routes: `/health`, `/metrics`, the cluster admin API under `/admin`, and
//! `/debug/clock` for chaos tests.

use axum::extract::State;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use delayd_raft::NodeStatus;
use serde_json::{json, Value};

use super::error::{bad, ApiError, ApiResult};
use super::extract::{credential, Admin, Caller, NoBody, Params, Path};
use super::render;
use crate::error::ServiceError;
use crate::service::admin::MemberChange;
use crate::service::Service;

/// `GET /health`: this node's own view, without a credential.
pub(crate) async fn health(State(s): State<Service>) -> Response {
    let h = s.health();
    Json(json!({
        "node_id": h.id,
        "state": h.state,
        "leader": h.leader,
        "term": h.term,
        "last_log_index": h.last_log_index,
        "last_applied": h.last_applied,
    }))
    .into_response()
}

/// `GET /ready[?role=leader]`: 200 when this node serves clients now (with `role=leader`:
/// and leads), else 503 with the reason; without a credential (load balancers and
/// orchestrators ask). See `service/health.rs`.
pub(crate) async fn ready(State(s): State<Service>, p: Params) -> ApiResult {
    let ready = match p.str("role") {
        None | Some("any") => s.readiness(),
        Some("leader") => s.leader_readiness(),
        Some(_) => return Err(bad("role must be `any` or `leader`")),
    };
    Ok(match ready {
        Ok(()) => Json(json!({"ready": true})).into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            Json(json!({"ready": false, "error": why.to_string()})),
        )
            .into_response(),
    })
}

/// `GET /metrics`: every metric of the node in Prometheus' text format, gzipped when the
/// client accepts gzip (Prometheus always does; the text of many queues shrinks tenfold).
pub(crate) async fn metrics(State(s): State<Service>, parts: Parts) -> ApiResult {
    let text = s.metrics_text(credential(&parts).as_deref()).await?;
    let content_type = (header::CONTENT_TYPE, prometheus::TEXT_FORMAT);
    // Caches between the node and its scraper must not hand one client's encoding to another.
    let vary = (header::VARY, "accept-encoding");
    if !accepts_gzip(&parts.headers) {
        return Ok(([content_type, vary], text).into_response());
    }
    // Megabytes for a node with thousands of queues: compressed off the async workers.
    let body = tokio::task::spawn_blocking(move || gzip(text.as_bytes()))
        .await
        .map_err(|e| ServiceError::Internal(format!("metrics compression task: {e}")))?
        .map_err(|e| ServiceError::Internal(format!("compressing metrics: {e}")))?;
    Ok(([content_type, vary, (header::CONTENT_ENCODING, "gzip")], body).into_response())
}

/// Whether `Accept-Encoding` admits gzip (RFC 9110, section 12.5.3): `gzip` (or its alias
/// `x-gzip`) listed with a weight above 0, or else `*` with one. Without the header, no:
/// plain text is what every client can read.
fn accepts_gzip(headers: &HeaderMap) -> bool {
    let mut gzip = None;
    let mut any = false;
    let values = headers.get_all(header::ACCEPT_ENCODING).into_iter();
    for item in values.filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')) {
        let mut params = item.split(';').map(str::trim);
        let coding = params.next().unwrap_or_default();
        let weight = params
            .find_map(|p| p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")))
            .map_or(1.0, |q| q.trim().parse::<f32>().unwrap_or(0.0));
        if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
            gzip = Some(weight > 0.0);
        } else if coding == "*" {
            any = weight > 0.0;
        }
    }
    gzip.unwrap_or(any)
}

/// `bytes` as one gzip member, at the fastest level: the text is repetitive enough that
/// level 1 already takes most of the gain, for a fraction of the time.
fn gzip(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 8),
        flate2::Compression::fast(),
    );
    encoder.write_all(bytes)?;
    encoder.finish()
}

fn status_json(s: &NodeStatus) -> Value {
    json!({
        "id": s.id,
        "state": s.state,
        "term": s.term,
        "leader": s.leader,
        "last_log_index": s.last_log_index,
        "last_applied": s.last_applied,
        "snapshot": s.snapshot,
        "purged": s.purged,
    })
}

/// `GET /admin/cluster`: every member's own view, with its lag.
pub(crate) async fn cluster(State(s): State<Service>, Caller(caller): Caller) -> ApiResult {
    let view = s.cluster_view(&caller).await?;
    let nodes: Vec<Value> = view
        .members
        .iter()
        .map(|m| {
            let mut v = match &m.status {
                Ok(status) => status_json(status),
                Err(e) => json!({"id": m.id, "reachable": false, "error": e.to_string()}),
            };
            v["addr"] = json!(m.addr);
            v["role"] = json!(if m.voter { "voter" } else { "learner" });
            if m.status.is_ok() {
                v["reachable"] = json!(true);
                v["lag"] = json!(m.lag);
            }
            if let Some(matched) = m.matched_index {
                v["matched_index"] = json!(matched);
            }
            v
        })
        .collect();
    Ok(Json(json!({
        "node_id": view.node_id,
        "leader": view.leader,
        "term": view.term,
        "voters": view.voters,
        "learners": view.learners,
        "nodes": nodes,
    }))
    .into_response())
}

/// `GET /admin/queues?namespace=&limit=&stale=`: every queue with its counts, sorted by
/// namespace then queue; `truncated` when `limit` cut the list short.
pub(crate) async fn queues(State(s): State<Service>, Admin(caller): Admin, p: Params) -> ApiResult {
    let list = s.queues(&caller, p.str("namespace"), p.num("limit")?, p.stale()?).await?;
    let queues: Vec<Value> =
        list.queues.iter().map(|(name, meta)| Value::Object(render::queue(name, meta))).collect();
    Ok(Json(json!({"queues": queues, "truncated": list.truncated})).into_response())
}

/// A node id from the path or the query.
fn node_id(s: Option<&str>) -> Result<u64, ApiError> {
    let s = s.unwrap_or_default();
    s.trim().parse().map_err(|_| bad(format!("invalid node id {s:?}")))
}

fn members(voters: std::collections::BTreeSet<u64>) -> Response {
    Json(json!({"voters": voters})).into_response()
}

/// `POST /admin/nodes?id=&addr=`: adds a learner.
pub(crate) async fn add_learner(
    State(s): State<Service>,
    Admin(caller): Admin,
    p: Params,
    _: NoBody,
) -> ApiResult {
    let id = node_id(p.str("id"))?;
    let addr = p.str("addr").unwrap_or_default().to_string();
    Ok(members(s.change_members(&caller, MemberChange::AddLearner { id, addr }).await?))
}

/// `POST /admin/nodes/{id}/promote`: makes a learner a voter.
pub(crate) async fn promote(
    State(s): State<Service>,
    Admin(caller): Admin,
    Path(id): Path<String>,
) -> ApiResult {
    let id = node_id(Some(&id))?;
    Ok(members(s.change_members(&caller, MemberChange::Promote(id)).await?))
}

/// `DELETE /admin/nodes/{id}`: removes a member.
pub(crate) async fn remove(
    State(s): State<Service>,
    Admin(caller): Admin,
    Path(id): Path<String>,
) -> ApiResult {
    let id = node_id(Some(&id))?;
    Ok(members(s.change_members(&caller, MemberChange::Remove(id)).await?))
}

/// `POST /admin/leader?to=N`: hands leadership to voter `N` (without `to`: to the most
/// caught-up voter) and answers once it leads.
pub(crate) async fn transfer_leader(
    State(s): State<Service>,
    Admin(caller): Admin,
    p: Params,
    _: NoBody,
) -> ApiResult {
    let to = p.str("to").map(|id| node_id(Some(id))).transpose()?;
    let leader = s.transfer_leader(&caller, to).await?;
    Ok(Json(json!({"leader": leader})).into_response())
}

/// `POST /admin/snapshot`: triggers a snapshot on this node.
pub(crate) async fn snapshot(State(s): State<Service>, Caller(caller): Caller) -> ApiResult {
    s.snapshot(&caller).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({"msg": "snapshot triggered"}))).into_response())
}

/// `GET /admin/digest`: a digest of the replicated state at this node's applied index.
pub(crate) async fn digest(State(s): State<Service>, Caller(caller): Caller) -> ApiResult {
    let d = s.digest(&caller)?;
    Ok(Json(json!({
        "node_id": s.config().node_id,
        "applied_index": d.applied_index,
        "digest": format!("{:016x}", d.digest),
        "entries": d.entries,
    }))
    .into_response())
}

/// `GET /debug/clock`: this node's clock and its offset from the wall clock.
pub(crate) async fn clock(State(s): State<Service>, Caller(caller): Caller) -> ApiResult {
    let (offset, now) = s.clock(&caller)?;
    Ok(Json(json!({"offset_ms": offset, "now_ms": now})).into_response())
}

/// `PUT /debug/clock?offset_ms=N`: shifts this node's wall clock by N ms (negative: behind).
pub(crate) async fn set_clock(
    State(s): State<Service>,
    Admin(caller): Admin,
    p: Params,
) -> ApiResult {
    let offset = match p.str("offset_ms") {
        None => return Err(bad("offset_ms is required")),
        Some(v) => v.parse().map_err(|_| bad("offset_ms must be an integer (ms)"))?,
    };
    let (offset, now) = s.set_clock(&caller, offset)?;
    Ok(Json(json!({"offset_ms": offset, "now_ms": now})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepts(values: &[&str]) -> bool {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(header::ACCEPT_ENCODING, v.parse().expect("header value"));
        }
        accepts_gzip(&headers)
    }

    #[test]
    fn gzip_is_sent_only_to_clients_that_accept_it() {
        // Prometheus' own header, and the usual spellings.
        assert!(accepts(&["gzip"]));
        assert!(accepts(&["identity, gzip;q=0.5"]));
        assert!(accepts(&["deflate", "GZIP"]), "codings are case-insensitive, headers add up");
        assert!(accepts(&["x-gzip"]));
        assert!(accepts(&["*"]));
        // No header, other codings only, or gzip refused by weight.
        assert!(!accepts(&[]));
        assert!(!accepts(&["br, deflate"]));
        assert!(!accepts(&["gzip;q=0"]));
        assert!(!accepts(&["*, gzip; q=0"]), "gzip refused by name beats the wildcard");
        assert!(!accepts(&["*;q=0"]));
        assert!(!accepts(&["gzip;q=zero"]), "an unreadable weight refuses");
    }
}
