//! The token API, in lmstfy's shapes: `POST /token/{ns}`, `GET /token/{ns}`,
//! `DELETE /token/{ns}/{token}`. Admin only (see [`crate::auth`]).
//!
//! Tokens are replicated state: creating or deleting one is a command through the Raft log,
//! so every node authenticates the same set.

use std::collections::{BTreeMap, HashMap};

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use axum::{Json, Router};
use delayd_core::{query, Command, Reply, TokenRecord};
use serde_json::json;

use crate::error::ServiceError;
use crate::http::{ApiError, Path};
use crate::node::Node;
use crate::service::check_name;

/// The token routes.
pub fn routes() -> Router<Node> {
    Router::new()
        .route("/token/{ns}", post(create).get(list))
        .route("/token/{ns}/{token}", delete(remove))
}

/// Most a rate limit may be set to, per second; a typo of a few zeros should not pass as "no
/// limit in practice".
const MAX_LIMIT: u32 = 1_000_000;

impl Node {
    /// Creates a token for `namespace` and returns it: drawn here and carried in the command,
    /// like every other non-deterministic value.
    pub async fn create_token(
        &self,
        namespace: &str,
        description: String,
        read_limit: u32,
        write_limit: u32,
    ) -> Result<String, ServiceError> {
        check_name("namespace", namespace)?;
        if description.len() > 1024 {
            return Err(ServiceError::BadRequest("description is longer than 1024 bytes".into()));
        }
        let token = crate::auth::new_secret();
        let command = Command::CreateToken {
            token: token.clone(),
            namespace: namespace.to_string(),
            description,
            read_limit,
            write_limit,
        };
        self.write_one(command).await?;
        Ok(token)
    }

    /// Deletes a token of `namespace`; false when the namespace has no such token.
    pub async fn delete_token(&self, namespace: &str, token: &str) -> Result<bool, ServiceError> {
        check_name("namespace", namespace)?;
        let command =
            Command::DeleteToken { namespace: namespace.to_string(), token: token.to_string() };
        Ok(matches!(self.write_one(command).await?, Reply::Removed(true)))
    }

    /// The tokens of `namespace`, ordered by token.
    pub async fn tokens(
        &self,
        namespace: &str,
    ) -> Result<Vec<(String, TokenRecord)>, ServiceError> {
        check_name("namespace", namespace)?;
        self.read(false, |v| query::tokens(v, Some(namespace))).await
    }
}

fn limit(q: &HashMap<String, String>, name: &str) -> Result<u32, ApiError> {
    match q.get(name) {
        None => Ok(0),
        Some(v) => v.trim().parse::<u32>().ok().filter(|n| *n <= MAX_LIMIT).ok_or_else(|| {
            ApiError(ServiceError::BadRequest(format!(
                "invalid {name} {v:?}: expected requests per second, 0 (no limit) to {MAX_LIMIT}"
            )))
        }),
    }
}

async fn create(
    State(node): State<Node>,
    Path(ns): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let description = q.get("description").cloned().unwrap_or_default();
    let (read, write) = (limit(&q, "read_limit")?, limit(&q, "write_limit")?);
    let token = node.create_token(&ns, description, read, write).await?;
    tracing::info!(namespace = %ns, "token created");
    Ok((StatusCode::CREATED, Json(json!({ "token": token }))).into_response())
}

async fn list(State(node): State<Node>, Path(ns): Path<String>) -> Result<Response, ApiError> {
    let tokens = node.tokens(&ns).await?;
    // lmstfy answers a map of token to description; the details carry delayd's extra fields.
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

async fn remove(
    State(node): State<Node>,
    Path((ns, token)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    if node.delete_token(&ns, &token).await? {
        tracing::info!(namespace = %ns, "token deleted");
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError(ServiceError::NotFound(format!("namespace {ns:?} has no such token"))))
    }
}
