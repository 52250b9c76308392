//! The token API, in lmstfy's shapes: `POST /token/{ns}`, `GET /token/{ns}`,
//! `DELETE /token/{ns}/{token}`.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use super::error::ApiResult;
use super::extract::{Admin, Params, Path};
use super::render;
use crate::service::tokens::NewToken;
use crate::service::Service;

/// `POST /token/{ns}?description=&read_limit=&write_limit=`: a new token, answered once.
pub(crate) async fn create(
    State(s): State<Service>,
    Admin(caller): Admin,
    Path(ns): Path<String>,
    p: Params,
) -> ApiResult {
    let token = NewToken {
        description: p.str("description").unwrap_or_default().to_string(),
        read_limit: p.num("read_limit")?.unwrap_or(0),
        write_limit: p.num("write_limit")?.unwrap_or(0),
    };
    let token = s.create_token(&caller, &ns, token).await?;
    Ok((StatusCode::CREATED, Json(json!({ "token": token }))).into_response())
}

/// `GET /token/{ns}`: lmstfy's map of token to description, and delayd's details beside it.
pub(crate) async fn list(
    State(s): State<Service>,
    Admin(caller): Admin,
    Path(ns): Path<String>,
) -> ApiResult {
    let tokens = s.tokens(&caller, &ns).await?;
    let map: BTreeMap<&str, &str> =
        tokens.iter().map(|(t, r)| (t.as_str(), r.description.as_str())).collect();
    let details: Vec<_> = tokens
        .iter()
        .map(|(t, r)| {
            json!({
                "token": t,
                "description": r.description,
                "created_ms": r.created_ms,
                "read_limit": r.read_limit,
                "write_limit": r.write_limit,
            })
        })
        .collect();
    Ok(Json(json!({"namespace": ns, "tokens": map, "details": details})).into_response())
}

/// `DELETE /token/{ns}/{token}`.
pub(crate) async fn remove(
    State(s): State<Service>,
    Admin(caller): Admin,
    Path((ns, token)): Path<(String, String)>,
) -> ApiResult {
    s.delete_token(&caller, &ns, &token).await?;
    Ok(render::no_content())
}
