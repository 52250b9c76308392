//! # The HTTP API: lmstfy's data plane, with delayd's extensions and admin API beside it
//!
//! [`router`] below is the one route table: every endpoint, its method and its handler. A
//! handler does three things — extract ([`extract`]: the caller first, then path, query and
//! body), make one [`Service`] call, render the answer ([`render`]) — and decides nothing:
//! who may call it, which values are in range and what gets written are the service's.
//! Errors become status codes in one place ([`error`]).
//!
//! Times in lmstfy's parameters are seconds; the `_ms` extensions are milliseconds.
//! Connections are served by [`serve::serve_http`], which bounds what a client may hold.

mod admin;
mod backup;
mod dashboard;
mod deadletter;
pub mod error;
mod extract;
mod jobs;
mod middleware;
mod queues;
mod render;
mod schedules;
pub mod serve;
mod tokens;
mod webhooks;

use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post, put};
use axum::Router;

use crate::service::Service;

pub use serve::{serve_http, serve_http_with_tls};

/// The HTTP API over `service`.
pub fn router(service: &Service) -> Router {
    let config = service.config();
    // A bulk's bodies must fit one log entry together; its JSON framing is small beside them.
    let bulk_limit = DefaultBodyLimit::max(config.max_request_bytes());
    let mut router = Router::new()
        // Open: liveness, readiness, the dashboard's static files (it asks for a token
        // itself).
        .route("/health", get(admin::health))
        .route("/ready", get(admin::ready))
        .merge(dashboard::routes())
        // The admin token, or nothing when metrics are public.
        .route("/metrics", get(admin::metrics))
        // The admin token.
        .route("/admin/cluster", get(admin::cluster))
        .route("/admin/queues", get(admin::queues))
        .route("/admin/nodes", post(admin::add_learner))
        .route("/admin/nodes/{id}/promote", post(admin::promote))
        .route("/admin/nodes/{id}", delete(admin::remove))
        .route("/admin/leader", post(admin::transfer_leader))
        .route("/admin/snapshot", post(admin::snapshot).get(backup::save))
        .route("/admin/digest", get(admin::digest))
        .route("/token/{ns}", post(tokens::create).get(tokens::list))
        .route("/token/{ns}/{token}", delete(tokens::remove))
        // The admin token or a token of the namespace.
        .route("/api/{ns}/{q}", put(jobs::publish).get(jobs::reserve).delete(queues::destroy))
        .route("/api/{ns}/{q}/bulk", put(jobs::bulk).layer(bulk_limit))
        .route(
            "/api/{ns}/{q}/job/{id}",
            get(jobs::peek_job).put(jobs::republish).delete(jobs::ack).patch(jobs::update),
        )
        .route("/api/{ns}/{q}/job/{id}/release", put(jobs::release))
        .route("/api/{ns}/{q}/job/{id}/touch", put(jobs::touch))
        .route("/api/{ns}/{q}/job/{id}/bury", put(jobs::bury))
        .route("/api/{ns}/{q}/key/{key}", get(jobs::by_key).delete(jobs::cancel_key))
        .route("/api/{ns}/{q}/peek", get(jobs::peek))
        .route("/api/{ns}/{q}/size", get(queues::size))
        .route("/api/{ns}/{q}/stats", get(queues::stats))
        .route("/api/{ns}/{q}/pause", put(queues::pause).delete(queues::resume))
        .route(
            "/api/{ns}/{q}/deadletter",
            get(deadletter::head).put(deadletter::respawn).delete(deadletter::purge),
        )
        .route("/api/{ns}/{q}/deadletter/size", get(deadletter::size))
        .route("/api/{ns}/{q}/deadletter/jobs", get(deadletter::jobs))
        .route(
            "/api/{ns}/{q}/webhook",
            put(webhooks::set).get(webhooks::show).delete(webhooks::remove),
        )
        .route("/api/{ns}/{q}/schedules", get(schedules::list))
        .route(
            "/api/{ns}/{q}/schedules/{name}",
            put(schedules::set).get(schedules::show).delete(schedules::remove),
        );
    if config.debug_clock {
        // Test-only, and the admin token's.
        router = router.route("/debug/clock", get(admin::clock).put(admin::set_clock));
    }
    router
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(service.clone(), middleware::track))
        // Outermost: the request id's span covers everything else.
        .layer(axum::middleware::from_fn(middleware::request_id))
        .with_state(service.clone())
}
