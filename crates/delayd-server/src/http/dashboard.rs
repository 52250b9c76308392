//! The web dashboard: three static files, compiled into the binary, under `/dashboard/`.
//!
//! The files hold no data and no secrets. The page asks for the admin token, keeps it in the
//! tab's `sessionStorage` and reads everything through the JSON APIs (`/admin/cluster`,
//! `/admin/queues`, `/api/...`), sending the token as `Authorization: Bearer`; so serving the
//! files themselves needs no credential. `cache-control: no-cache` makes a browser revalidate
//! them, so an upgraded node never runs with a stale script.

use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Redirect, Response};

use super::{Table, Verb};

const INDEX_HTML: &str = include_str!("dashboard/index.html");
const APP_JS: &str = include_str!("dashboard/app.js");
const STYLE_CSS: &str = include_str!("dashboard/style.css");

/// Adds the dashboard's routes to `table`: `/dashboard` (redirects to `/dashboard/`), the page
/// and its script and style sheet.
pub(super) fn routes(table: Table) -> Table {
    table
        .route(Verb::Get, "/dashboard", || async { Redirect::permanent("/dashboard/") })
        .route(Verb::Get, "/dashboard/", index)
        .route(Verb::Get, "/dashboard/app.js", || async {
            file("text/javascript; charset=utf-8", APP_JS)
        })
        .route(Verb::Get, "/dashboard/style.css", || async {
            file("text/css; charset=utf-8", STYLE_CSS)
        })
}

/// The page, with a content security policy that allows only its own script and style sheet
/// and its own origin's APIs: whatever text the APIs return is shown, never run.
async fn index() -> Response {
    let csp = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
               img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
    let mut response = file("text/html; charset=utf-8", INDEX_HTML);
    response.headers_mut().insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(csp));
    response
}

fn file(content_type: &'static str, body: &'static str) -> Response {
    ([(CONTENT_TYPE, content_type), (CACHE_CONTROL, "no-cache")], body).into_response()
}
