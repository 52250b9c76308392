//! `GET /admin/snapshot`: a backup of the replicated state, streamed from the leader.
//!
//! The leader answers `200` with the snapshot file (`application/octet-stream`) and what it
//! holds in headers: `x-delayd-applied-index`, `x-delayd-applied-term` and, with
//! `?digest=true`, `x-delayd-digest` / `x-delayd-digest-entries` (as `/admin/digest` computes
//! them, from the same view). Another node answers `307` to the leader's address, with the
//! leader in a JSON body; clients must carry their credential over themselves (HTTP clients
//! drop it on a redirect to another host).

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use super::error::ApiResult;
use super::extract::{Admin, Params};
use crate::service::backup::Backup;
use crate::service::Service;

/// `GET /admin/snapshot[?digest=true]`: see the module docs.
pub(crate) async fn save(State(s): State<Service>, Admin(caller): Admin, p: Params) -> ApiResult {
    let digest = p.flag("digest")?;
    let stream = match s.backup(&caller, digest).await? {
        Backup::Stream(stream) => stream,
        Backup::Elsewhere { leader, http } => {
            let mut response = (
                StatusCode::TEMPORARY_REDIRECT,
                Json(json!({
                    "error": format!("node {leader} leads: backups are taken from the leader"),
                    "leader": leader,
                    "leader_http": http,
                })),
            )
                .into_response();
            let scheme = if s.config().tls.is_some() { "https" } else { "http" };
            let location = http
                .and_then(|h| HeaderValue::try_from(format!("{scheme}://{h}/admin/snapshot")).ok());
            if let Some(location) = location {
                response.headers_mut().insert(header::LOCATION, location);
            }
            return Ok(response);
        }
    };
    let chunks = futures::stream::unfold(stream.body, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    let mut response = Body::from_stream(chunks).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    let mut put = |name: &'static str, value: String| {
        if let Ok(v) = HeaderValue::try_from(value) {
            headers.insert(name, v);
        }
    };
    if let Some(index) = stream.applied_index {
        put("x-delayd-applied-index", index.to_string());
    }
    if let Some(term) = stream.applied_term {
        put("x-delayd-applied-term", term.to_string());
    }
    if let Some(d) = stream.digest {
        put("x-delayd-digest", format!("{:016x}", d.digest));
        put("x-delayd-digest-entries", d.entries.to_string());
    }
    Ok(response)
}
