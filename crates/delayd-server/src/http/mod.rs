//! # The HTTP API: lmstfy's data plane, with delayd's extensions and admin API beside it
//!
//! `table` below is the one route table: every endpoint, its method and its handler. It
//! builds the router and, from the same calls, the list of its routes ([`routes`]), which a
//! test holds against the OpenAPI document served at `/openapi.json` ([`openapi`]), so the
//! document cannot drift from the router. A handler does three things — extract
//! ([`extract`]: the caller first, then path, query and body), make one [`Service`] call,
//! render the answer ([`render`]) — and decides nothing: who may call it, which values are in
//! range and what gets written are the service's. Errors become status codes in one place
//! ([`error`]).
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
pub mod openapi;
mod queues;
mod render;
mod schedules;
pub mod serve;
mod tokens;
mod webhooks;

use axum::extract::DefaultBodyLimit;
use axum::handler::Handler;
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;

use crate::config::Config;
use crate::service::Service;

pub use serve::{serve_http, serve_http_with_tls};

/// An HTTP method a route answers. A `Get` route answers `HEAD` as well.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verb {
    /// `GET` (and `HEAD`).
    Get,
    /// `PUT`.
    Put,
    /// `POST`.
    Post,
    /// `DELETE`.
    Delete,
    /// `PATCH`.
    Patch,
}

impl Verb {
    /// Every verb a route may have.
    pub const ALL: [Verb; 5] = [Verb::Get, Verb::Put, Verb::Post, Verb::Delete, Verb::Patch];

    /// The method's name as an OpenAPI path item's key writes it: lower case.
    pub fn openapi_name(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::Put => "put",
            Verb::Post => "post",
            Verb::Delete => "delete",
            Verb::Patch => "patch",
        }
    }

    fn filter(self) -> MethodFilter {
        match self {
            Verb::Get => MethodFilter::GET,
            Verb::Put => MethodFilter::PUT,
            Verb::Post => MethodFilter::POST,
            Verb::Delete => MethodFilter::DELETE,
            Verb::Patch => MethodFilter::PATCH,
        }
    }
}

/// One route of the router: a method and a path template in axum's syntax, which is also
/// OpenAPI's (`/api/{ns}/{q}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Route {
    /// The method.
    pub verb: Verb,
    /// The path template.
    pub path: &'static str,
}

/// The route table as it is built: the router, and beside it the routes it was given. Every
/// route enters both through [`Table::route`], so the list is the router's.
struct Table {
    router: Router<Service>,
    routes: Vec<Route>,
}

impl Table {
    fn new() -> Table {
        Table { router: Router::new(), routes: Vec::new() }
    }

    /// Serves `verb path` with `handler`.
    fn route<H, T>(self, verb: Verb, path: &'static str, handler: H) -> Table
    where
        H: Handler<T, Service>,
        T: 'static,
    {
        self.route_with(verb, path, handler, |endpoint| endpoint)
    }

    /// Serves `verb path` with `handler`, wrapped by `wrap` (a layer of its own).
    fn route_with<H, T>(
        mut self,
        verb: Verb,
        path: &'static str,
        handler: H,
        wrap: impl FnOnce(MethodRouter<Service>) -> MethodRouter<Service>,
    ) -> Table
    where
        H: Handler<T, Service>,
        T: 'static,
    {
        // Routes of one path with different methods merge into one endpoint.
        self.router = self.router.route(path, wrap(on(verb.filter(), handler)));
        self.routes.push(Route { verb, path });
        self
    }
}

/// The route table for a node configured as `config`.
fn table(config: &Config) -> Table {
    use Verb::{Delete, Get, Patch, Post, Put};
    // A bulk's bodies must fit one log entry together; its JSON framing is small beside them.
    let bulk_limit = DefaultBodyLimit::max(config.max_request_bytes());
    let mut table = Table::new()
        // Open: liveness, readiness, this API's description, the dashboard's static files
        // (it asks for a token itself).
        .route(Get, "/health", admin::health)
        .route(Get, "/ready", admin::ready)
        .route(Get, "/openapi.json", openapi::serve);
    table = dashboard::routes(table)
        // The admin token, or nothing when metrics are public.
        .route(Get, "/metrics", admin::metrics)
        // The admin token.
        .route(Get, "/admin/cluster", admin::cluster)
        .route(Get, "/admin/queues", admin::queues)
        .route(Post, "/admin/nodes", admin::add_learner)
        .route(Post, "/admin/nodes/{id}/promote", admin::promote)
        .route(Delete, "/admin/nodes/{id}", admin::remove)
        .route(Post, "/admin/leader", admin::transfer_leader)
        .route(Post, "/admin/snapshot", admin::snapshot)
        .route(Get, "/admin/snapshot", backup::save)
        .route(Get, "/admin/digest", admin::digest)
        .route(Post, "/token/{ns}", tokens::create)
        .route(Get, "/token/{ns}", tokens::list)
        .route(Delete, "/token/{ns}/{token}", tokens::remove)
        // The admin token or a token of the namespace.
        .route(Put, "/api/{ns}/{q}", jobs::publish)
        .route(Get, "/api/{ns}/{q}", jobs::reserve)
        .route(Delete, "/api/{ns}/{q}", queues::destroy)
        .route_with(Put, "/api/{ns}/{q}/bulk", jobs::bulk, |e| e.layer(bulk_limit))
        .route(Get, "/api/{ns}/{q}/job/{id}", jobs::peek_job)
        .route(Put, "/api/{ns}/{q}/job/{id}", jobs::republish)
        .route(Delete, "/api/{ns}/{q}/job/{id}", jobs::ack)
        .route(Patch, "/api/{ns}/{q}/job/{id}", jobs::update)
        .route(Put, "/api/{ns}/{q}/job/{id}/release", jobs::release)
        .route(Put, "/api/{ns}/{q}/job/{id}/touch", jobs::touch)
        .route(Put, "/api/{ns}/{q}/job/{id}/bury", jobs::bury)
        .route(Get, "/api/{ns}/{q}/key/{key}", jobs::by_key)
        .route(Delete, "/api/{ns}/{q}/key/{key}", jobs::cancel_key)
        .route(Get, "/api/{ns}/{q}/peek", jobs::peek)
        .route(Get, "/api/{ns}/{q}/size", queues::size)
        .route(Get, "/api/{ns}/{q}/stats", queues::stats)
        .route(Put, "/api/{ns}/{q}/pause", queues::pause)
        .route(Delete, "/api/{ns}/{q}/pause", queues::resume)
        .route(Get, "/api/{ns}/{q}/deadletter", deadletter::head)
        .route(Put, "/api/{ns}/{q}/deadletter", deadletter::respawn)
        .route(Delete, "/api/{ns}/{q}/deadletter", deadletter::purge)
        .route(Get, "/api/{ns}/{q}/deadletter/size", deadletter::size)
        .route(Get, "/api/{ns}/{q}/deadletter/jobs", deadletter::jobs)
        .route(Put, "/api/{ns}/{q}/webhook", webhooks::set)
        .route(Get, "/api/{ns}/{q}/webhook", webhooks::show)
        .route(Delete, "/api/{ns}/{q}/webhook", webhooks::remove)
        .route(Get, "/api/{ns}/{q}/schedules", schedules::list)
        .route(Put, "/api/{ns}/{q}/schedules/{name}", schedules::set)
        .route(Get, "/api/{ns}/{q}/schedules/{name}", schedules::show)
        .route(Delete, "/api/{ns}/{q}/schedules/{name}", schedules::remove);
    if config.debug_clock {
        // Test-only, and the admin token's.
        table = table.route(Get, "/debug/clock", admin::clock).route(
            Put,
            "/debug/clock",
            admin::set_clock,
        );
    }
    table
}

/// Every route the HTTP API of a node configured as `config` serves: what `/openapi.json`
/// describes.
pub fn routes(config: &Config) -> Vec<Route> {
    table(config).routes
}

/// The HTTP API over `service`.
pub fn router(service: &Service) -> Router {
    let config = service.config();
    table(config)
        .router
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        // Outermost: the request id's span covers everything else.
        .layer(axum::middleware::from_fn_with_state(service.clone(), middleware::observe))
        .with_state(service.clone())
}
