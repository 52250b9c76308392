//! The one place where service errors become HTTP answers: a status code and
//! `{"error": "..."}`, with `WWW-Authenticate: Bearer` on a 401 and `Retry-After` on a 429 (when
//! the token's budget holds a request again) and a 503 (a second: an election or a leadership
//! hand-over is over well within it, and a shed write may be retried as is).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::error::ServiceError;

/// The status code of a service error.
pub fn status(e: &ServiceError) -> StatusCode {
    match e {
        ServiceError::BadRequest(_) => StatusCode::BAD_REQUEST,
        ServiceError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        ServiceError::NotFound(_) => StatusCode::NOT_FOUND,
        ServiceError::Conflict(_) => StatusCode::CONFLICT,
        ServiceError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
        ServiceError::Forbidden(_) => StatusCode::FORBIDDEN,
        ServiceError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
        ServiceError::Unavailable(_) | ServiceError::NotLeader(_) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        ServiceError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The error of a request that failed on the server's side (a 5xx), carried on its response
/// to the middleware, which logs it with the request's id ([`super::middleware`]).
#[derive(Clone, Debug)]
pub(crate) struct Failure(pub(crate) String);

/// What every handler answers.
pub(crate) type ApiResult = Result<Response, ApiError>;

/// A service error as an HTTP response.
#[derive(Debug)]
pub struct ApiError(pub ServiceError);

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = status(&self.0);
        let error = self.0.to_string();
        let mut response = (status, Json(json!({ "error": &error }))).into_response();
        if status.is_server_error() {
            response.extensions_mut().insert(Failure(error));
        }
        let headers = response.headers_mut();
        match &self.0 {
            ServiceError::Unauthenticated(_) => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ServiceError::RateLimited { retry_after_ms, .. } => {
                headers
                    .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_s(*retry_after_ms)));
            }
            ServiceError::Unavailable(_) | ServiceError::NotLeader(_) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        response
    }
}

/// `Retry-After` is in whole seconds: a wait is rounded up, so a client that honours it is
/// never early, and is at least one second (0 would invite a retry loop).
pub(crate) fn retry_after_s(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

/// A 400 naming what is wrong.
pub(crate) fn bad(message: impl Into<String>) -> ApiError {
    ApiError(ServiceError::bad_request(message))
}

/// What no route matched.
pub(crate) async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, Json(json!({"error": "api not found"}))).into_response()
}

/// A route that exists, with another method.
pub(crate) async fn method_not_allowed() -> Response {
    (StatusCode::METHOD_NOT_ALLOWED, Json(json!({"error": "method not allowed"}))).into_response()
}
