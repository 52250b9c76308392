//! The cluster admin API, under `/admin`: status, the queues, membership, leadership
//! transfer, snapshots and a state digest.
//!
//! Any node answers; membership changes are carried out by the leader (forwarded there) and
//! go through openraft's joint consensus.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::future::join_all;
use serde_json::{json, Value};
use std::collections::HashMap;

use delayd_raft::{ForwardOp, NodeStatus};

use crate::error::ServiceError;
use crate::http::ApiError;
use crate::node::Node;

type ApiResult = Result<Response, ApiError>;

/// The admin routes.
pub fn routes() -> Router<Node> {
    Router::new()
        .route("/admin/cluster", get(cluster))
        .route("/admin/queues", get(queues))
        .route("/admin/nodes", post(add_learner))
        .route("/admin/nodes/{id}/promote", post(promote))
        .route("/admin/nodes/{id}", axum::routing::delete(remove))
        .route("/admin/leader", post(transfer_leader))
        .route("/admin/snapshot", post(snapshot))
        .route("/admin/digest", get(digest))
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

async fn cluster(State(node): State<Node>) -> ApiResult {
    let m = node.cluster().metrics();
    let membership = m.membership_config.membership();
    let voters: Vec<u64> = membership.voter_ids().collect();
    let learners: Vec<u64> = membership.learner_ids().collect();
    let nodes: Vec<(u64, String)> =
        membership.nodes().map(|(id, n)| (*id, n.addr.clone())).collect();
    let me = node.config().node_id;
    let views = join_all(nodes.iter().map(|(id, addr)| {
        let node = node.clone();
        async move {
            if *id == me {
                Ok(node.cluster().status())
            } else {
                node.cluster().peer_status(*id, addr).await
            }
        }
    }))
    .await;
    let newest = views.iter().flatten().filter_map(|s| s.last_log_index).max();
    let mut out = Vec::new();
    for ((id, addr), view) in nodes.iter().zip(views) {
        let role = if voters.contains(id) { "voter" } else { "learner" };
        let mut v = match &view {
            Ok(s) => status_json(s),
            Err(e) => json!({"id": id, "reachable": false, "error": e.to_string()}),
        };
        v["addr"] = json!(addr);
        v["role"] = json!(role);
        if let Ok(s) = &view {
            v["reachable"] = json!(true);
            v["lag"] = json!(newest.map(|n| n.saturating_sub(s.last_applied.unwrap_or(0))));
        }
        // The leader's own account of how far each follower's log matches its own.
        if let Some(rep) = &m.replication {
            if let Some(matched) = rep.get(id) {
                v["matched_index"] = json!(matched.map(|l| l.index));
            }
        }
        out.push(v);
    }
    Ok(Json(json!({
        "node_id": me,
        "leader": m.current_leader,
        "term": m.current_term,
        "voters": voters,
        "learners": learners,
        "nodes": out,
    }))
    .into_response())
}

/// Default and largest `limit` of `GET /admin/queues`.
const QUEUES_LIMIT: (usize, usize) = (1000, 10_000);

/// `GET /admin/queues?namespace=&limit=&stale=`: every queue with its counts, sorted by
/// namespace then queue; `truncated` when `limit` cut the list short.
async fn queues(State(node): State<Node>, Query(q): Query<HashMap<String, String>>) -> ApiResult {
    let bad = |msg: String| ApiError(ServiceError::BadRequest(msg));
    let p = crate::http::Params(q);
    let namespace = p.str("namespace");
    if let Some(ns) = namespace {
        crate::service::check_name("namespace", ns)?;
    }
    let (default, max) = QUEUES_LIMIT;
    let limit = match p.str("limit") {
        None => default,
        Some(s) => s
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| bad(format!("invalid limit {s:?}: expected 1 to {max}")))?,
    };
    let stale = p.flag("stale")?;
    // One more than asked for tells whether the list was cut short.
    let mut found = node.queues(namespace, limit + 1, stale).await?;
    let truncated = found.len() > limit;
    found.truncate(limit);
    let list: Vec<Value> = found
        .iter()
        .map(|(name, meta)| {
            let c = meta.counts;
            json!({
                "namespace": name.namespace,
                "queue": name.queue,
                "paused": meta.paused,
                "delayed": c[0], "ready": c[1], "reserved": c[2], "dead": c[3],
            })
        })
        .collect();
    Ok(Json(json!({"queues": list, "truncated": truncated})).into_response())
}

fn node_id(s: &str) -> Result<u64, ApiError> {
    s.parse::<u64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| ApiError(ServiceError::BadRequest(format!("invalid node id {s:?}"))))
}

fn members(voters: std::collections::BTreeSet<u64>) -> Response {
    Json(json!({"voters": voters})).into_response()
}

async fn add_learner(
    State(node): State<Node>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    let id = node_id(q.get("id").map_or("", String::as_str))?;
    let addr = q.get("addr").filter(|a| a.contains(':')).ok_or_else(|| {
        ApiError(ServiceError::BadRequest("addr=host:port (gRPC) is required".into()))
    })?;
    let voters =
        node.cluster().change_members(ForwardOp::AddLearner { id, addr: addr.clone() }).await?;
    Ok(members(voters))
}

async fn promote(State(node): State<Node>, Path(id): Path<String>) -> ApiResult {
    let id = node_id(&id)?;
    Ok(members(node.cluster().change_members(ForwardOp::Promote { id }).await?))
}

async fn remove(State(node): State<Node>, Path(id): Path<String>) -> ApiResult {
    let id = node_id(&id)?;
    Ok(members(node.cluster().change_members(ForwardOp::Remove { id }).await?))
}

/// `POST /admin/leader?to=N`: hands leadership to voter `N` (without `to`: to the most
/// caught-up voter) and answers once it leads.
async fn transfer_leader(
    State(node): State<Node>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    let to = q.get("to").map(|id| node_id(id)).transpose()?;
    let leader = node.cluster().transfer_leader(to).await?;
    Ok(Json(json!({"leader": leader})).into_response())
}

async fn snapshot(State(node): State<Node>) -> ApiResult {
    node.cluster().snapshot().await?;
    Ok((StatusCode::ACCEPTED, Json(json!({"msg": "snapshot triggered"}))).into_response())
}

async fn digest(State(node): State<Node>) -> ApiResult {
    let (applied, digest, entries) = node.digest()?;
    Ok(Json(json!({
        "node_id": node.config().node_id,
        "applied_index": applied,
        "digest": format!("{digest:016x}"),
        "entries": entries,
    }))
    .into_response())
}
