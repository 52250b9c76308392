//! Every call of the client API counted and timed by method, in the node's metrics.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use tonic::codegen::http::HeaderMap;
use tonic::codegen::{http, BoxFuture, Context, Poll, Service};
use tonic::server::NamedService;

use crate::metrics::Metrics;

/// The gRPC client API wrapped to count and time its calls. The status code is read from the
/// response head: a stream that fails after it started is counted as `OK`.
#[derive(Clone)]
pub struct Metered<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S> Metered<S> {
    /// Wraps `inner`, recording into `metrics`.
    pub fn new(inner: S, metrics: Arc<Metrics>) -> Self {
        Metered { inner, metrics }
    }
}

impl<S: NamedService> NamedService for Metered<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> Service<http::Request<B>> for Metered<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let metrics = self.metrics.clone();
        let method = request.uri().path().rsplit('/').next().unwrap_or_default().to_string();
        let started = Instant::now();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            let code = grpc_code(response.headers());
            // An unknown method is answered UNIMPLEMENTED: don't let its name become a label.
            let method = if code == "UNIMPLEMENTED" { "unknown" } else { method.as_str() };
            metrics.grpc_request(method, code, started.elapsed());
            Ok(response)
        })
    }
}

/// The gRPC status of a response, from its head: an error answered before any message
/// carries `grpc-status` in the head (tonic's trailers-only response); without it the call
/// was accepted, and a unary call then succeeded. A stream that fails after it started
/// reports its status in the trailers, which this does not wait for: it counts as `OK`.
fn grpc_code(headers: &HeaderMap) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    match headers.get("grpc-status") {
        None => "OK",
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .and_then(|i| NAMES.get(i).copied())
            .unwrap_or("UNKNOWN"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn grpc_codes_come_from_the_response_head() {
        let mut h = HeaderMap::new();
        assert_eq!(grpc_code(&h), "OK");
        h.insert("grpc-status", "3".parse().unwrap());
        assert_eq!(grpc_code(&h), "INVALID_ARGUMENT");
        h.insert("grpc-status", "99".parse().unwrap());
        assert_eq!(grpc_code(&h), "UNKNOWN");
    }
}
