//! What every request passes through, outermost first:
//!
//! - **a request id** ([`request_id`]): taken from the client's `x-request-id` when it sends
//!   a sensible one (so a trace can cross services), made up otherwise, carried by a tracing
//!   span around the whole request — every log line the request causes names it — and
//!   returned in the response's `x-request-id`;
//! - **metrics** ([`track`]): every answer counted and timed by route template, refused
//!   requests (401/403/429) included.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use crate::service::Service;

/// The header both ways.
pub const HEADER: &str = "x-request-id";

/// A client's id is used when it is 1–64 characters of letters, digits, `-`, `_` and `.`:
/// anything else could forge log lines or blow up their size.
fn acceptable(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The request-id middleware.
pub(crate) async fn request_id(request: Request, next: Next) -> Response {
    let given =
        request.headers().get(HEADER).and_then(|v| v.to_str().ok()).filter(|v| acceptable(v));
    let id = match given {
        Some(id) => id.to_string(),
        None => ulid::Ulid::new().to_string(),
    };
    // The route's template, not the path: `DELETE /token/{ns}/{token}` carries a secret in
    // its path, and templates keep log lines greppable. Unmatched paths are logged as sent.
    let route = match request.extensions().get::<MatchedPath>() {
        Some(m) => m.as_str().to_string(),
        None => request.uri().path().to_string(),
    };
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        method = %request.method(),
        route = %route,
    );
    let started = std::time::Instant::now();
    let mut response = next.run(request).instrument(span.clone()).await;
    span.in_scope(|| {
        tracing::debug!(
            status = response.status().as_u16(),
            micros = started.elapsed().as_micros() as u64,
            "request done"
        );
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(HEADER, v);
    }
    response
}

/// The method label: the standard methods by name, anything else as `other` (a client can
/// send any token as a method, and labels must stay bounded).
fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::PUT => "PUT",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Counts and times requests by route template; requests no route matched are labelled
/// `unmatched`, so the number of series is bounded by the router.
pub(crate) async fn track(State(s): State<Service>, request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().cloned();
    let method = method_label(request.method());
    let started = Instant::now();
    let response = next.run(request).await;
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    s.metrics().http_request(route, method, response.status().as_str(), started.elapsed());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_short_ids_are_taken_from_clients() {
        assert!(acceptable("abc-123_x.y"));
        assert!(!acceptable(""));
        assert!(!acceptable("a b"));
        assert!(!acceptable("x\ny"));
        assert!(!acceptable(&"a".repeat(65)));
    }
}
