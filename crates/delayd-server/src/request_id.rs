//! A request id for every HTTP request: taken from the client's `x-request-id` when it sends
//! a sensible one (so a trace can cross services), made up otherwise, carried by a tracing
//! span around the whole request — every log line the request causes names it — and returned
//! in the response's `x-request-id`.

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

/// The header both ways.
pub const HEADER: &str = "x-request-id";

/// A client's id is used when it is 1–64 characters of letters, digits, `-`, `_` and `.`:
/// anything else could forge log lines or blow up their size.
fn acceptable(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The middleware.
pub async fn middleware(request: Request, next: Next) -> Response {
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
