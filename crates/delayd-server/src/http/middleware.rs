//! What every request passes through, in one layer ([`observe`]) around the router:
//!
//! - **a request id**: taken from the client's `x-request-id` when it sends a sensible one
//!   (so a trace can cross services), made up otherwise, and returned in the response's
//!   `x-request-id`. A request that fails on the server's side (a 5xx with an error) is
//!   logged as a warning naming its id, method and route. With this module's target at
//!   `debug` (`RUST_LOG=info,delayd_server::http=debug`) a tracing span carries the id
//!   around the whole request, so every line the request causes names it, and each request
//!   ends with a line of its own;
//! - **metrics**: every answer counted and timed by route template, refused requests
//!   (401/403/429) included.
//!
//! One layer rather than one per concern: each `from_fn` layer costs every request a boxed
//! future and a clone of the inner service, and these two see the same request and answer.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use crate::http::error::Failure;
use crate::service::Service;

/// The header both ways.
pub const HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// A client's id is used when it is 1–64 characters of letters, digits, `-`, `_` and `.`:
/// anything else could forge log lines or blow up their size.
fn acceptable(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The request's id: the client's when [`acceptable`], else a new ULID.
fn request_id(request: &Request) -> HeaderValue {
    let given = request.headers().get(&HEADER).filter(|v| v.to_str().is_ok_and(acceptable));
    match given {
        Some(id) => id.clone(),
        None => {
            let mut text = [0; ulid::ULID_LEN];
            // Crockford base32 is ASCII: always a valid header value.
            HeaderValue::from_str(ulid::Ulid::new().array_to_str(&mut text))
                .unwrap_or_else(|_| HeaderValue::from_static("unknown"))
        }
    }
}

/// The middleware: the request id's span around the request, its metrics once answered.
pub(crate) async fn observe(State(s): State<Service>, request: Request, next: Next) -> Response {
    let id = request_id(&request);
    // The route's template, not the path: `DELETE /token/{ns}/{token}` carries a secret in
    // its path, and templates keep log lines and label sets bounded. Unmatched paths are
    // logged as sent (escaped) and counted as `unmatched`.
    let matched = request.extensions().get::<MatchedPath>().cloned();
    let method = method_label(request.method());
    // Fields as `Display`: the text formatter writes each span's fields out when the span
    // is made, and `Debug` would escape a `str` character by character (about 2 % of a
    // leader's CPU under load). The id is checked to be plain, the method is a token and a
    // matched route one of the router's templates; only a path no route matched, as the
    // client sent it, is escaped ([`Route`]).
    let route = match &matched {
        Some(m) => Route::Template(m.as_str()),
        None => Route::Unmatched(request.uri().path()),
    };
    // At `debug`: made, entered, left and closed on every request, the span cost about 5 %
    // of a leader's instructions per reserve + ack (docs/bench/consume-path.md). Disabled,
    // it is one cached check and its fields are never formatted.
    let span = tracing::debug_span!(
        "request",
        request_id = %id.to_str().unwrap_or_default(),
        method = %request.method().as_str(),
        route = %route,
    );
    let started = Instant::now();
    // The line that closes the request is written inside the instrumented future, where the
    // span is already entered: no second handle to the span, no second entry into it.
    let (mut response, took) = async move {
        let response = next.run(request).await;
        let took = started.elapsed();
        tracing::debug!(
            status = response.status().as_u16(),
            micros = took.as_micros() as u64,
            "request done"
        );
        (response, took)
    }
    .instrument(span)
    .await;
    let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
    // Outside the span, so that the id is named once whether the span is on or off.
    if let Some(Failure(error)) = response.extensions_mut().remove::<Failure>() {
        tracing::warn!(
            request_id = %id.to_str().unwrap_or_default(),
            method = %method,
            route = %route,
            status = response.status().as_u16(),
            error = %error,
            "request failed"
        );
    }
    s.metrics().http_request(route, method, response.status().as_str(), took);
    response.headers_mut().insert(HEADER, id);
    response
}

/// A request's route as a log field: the router's template as it is, or the path a client
/// sent when no route matched it, escaped (a path may hold any UTF-8, control characters and
/// bidirectional overrides among it).
enum Route<'a> {
    Template(&'a str),
    Unmatched(&'a str),
}

impl std::fmt::Display for Route<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Route::Template(t) => f.write_str(t),
            Route::Unmatched(path) => write!(f, "{}", path.escape_debug()),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmatched_paths_are_logged_escaped_and_templates_as_they_are() {
        let sent = "/api/ns/q\u{85}x\u{202e}\"";
        assert_eq!(Route::Unmatched(sent).to_string(), r#"/api/ns/q\u{85}x\u{202e}\""#);
        let template = "/api/{namespace}/{queue}";
        assert_eq!(Route::Template(template).to_string(), template);
    }

    #[test]
    fn only_plain_short_ids_are_taken_from_clients() {
        assert!(acceptable("abc-123_x.y"));
        assert!(!acceptable(""));
        assert!(!acceptable("a b"));
        assert!(!acceptable("x\ny"));
        assert!(!acceptable(&"a".repeat(65)));
    }
}
