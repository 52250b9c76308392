//! `/openapi.json` over a real HTTP server, and the authorization scope the document gives each
//! operation (`x-delayd-scope`) held against a secured node: every documented route is called
//! without a credential and with namespace tokens, and must refuse or serve as its scope says.
//! (That the document lists exactly the router's routes is checked beside the route table, in
//! `src/http/openapi.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use delayd_server::config::{AuthConfig, HttpLimits};
use delayd_server::http::openapi::DOCUMENT;
use delayd_server::http::serve_http;
use delayd_server::Config;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

const ADMIN: &str = "admin-token-for-tests-0123456789";
const JOB: &str = "01ARZ3NDEKTSV4RRFFQ69G5FAV";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_is_served_without_a_credential_over_http() {
    let auth = AuthConfig { admin_token: Some(ADMIN.into()), ..AuthConfig::default() };
    let (node, _dir) = common::start_node(Config { auth, ..Config::default() }).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, stop) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn({
        let router = node.router();
        async move {
            serve_http(listener, router, &HttpLimits::default(), async {
                let _ = stop.await;
            })
            .await
        }
    });

    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let resp = client.get(format!("http://{addr}/openapi.json")).send().await.expect("GET");
    assert_eq!(resp.status(), StatusCode::OK);
    let content_type = resp.headers().get("content-type").expect("a content type");
    assert_eq!(content_type, "application/json");
    let text = resp.text().await.expect("body");
    assert_eq!(text, DOCUMENT, "the checked-in document, as it is");
    let doc: Value = serde_json::from_str(&text).expect("JSON");
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    assert!(doc["paths"]["/openapi.json"]["get"].is_object(), "it describes itself");

    let _ = stop_tx.send(());
    server.await.expect("server task").expect("server");
    node.shutdown().await;
}

/// A concrete path for a documented operation: its template filled in, and a value for each
/// required query parameter (the handlers of the admin routes parse those before the service
/// authorizes the caller, so without them a namespace token would get 400, not 403).
fn concrete(template: &str, op: &Value) -> String {
    let required: Vec<String> = op["parameters"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["in"] == "query" && p["required"] == true)
        .map(|p| {
            let name = p["name"].as_str().unwrap();
            let value = match name {
                "addr" => "127.0.0.1:1",
                // Node id 0 and offset 0: refused, or harmless, after authorization.
                _ => "0",
            };
            format!("{name}={value}")
        })
        .collect();
    let path = fill(template);
    if required.is_empty() {
        path
    } else {
        format!("{path}?{}", required.join("&"))
    }
}

/// A documented template with a value for each path parameter.
fn fill(template: &str) -> String {
    let node_route = template.starts_with("/admin/nodes");
    template
        .split('/')
        .map(|segment| match segment {
            "{ns}" => "ns1",
            "{q}" => "q",
            // Node id 0 is refused (400) after authorization, so nothing changes.
            "{id}" if node_route => "0",
            "{id}" => JOB,
            "{key}" => "k",
            "{name}" => "s",
            "{token}" => "nosuchtoken",
            other => other,
        })
        .collect::<Vec<_>>()
        .join("/")
}

async fn status(router: &Router, method: &Method, path: &str, token: Option<&str>) -> StatusCode {
    let mut req = Request::builder().method(method.clone()).uri(path);
    if let Some(t) = token {
        req = req.header("x-token", t);
    }
    let resp = router.clone().oneshot(req.body(Body::from("x")).unwrap()).await.unwrap();
    let status = resp.status();
    // Drain the body (a backup streams one).
    let _ = resp.into_body().collect().await;
    status
}

async fn create_token(router: &Router, ns: &str) -> String {
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("/token/{ns}"))
        .header("authorization", format!("Bearer {ADMIN}"))
        .body(Body::empty())
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    v["token"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_scope_is_the_one_the_node_enforces() {
    let auth = AuthConfig { admin_token: Some(ADMIN.into()), ..AuthConfig::default() };
    // The document describes every optional route, the debug clock's included.
    let config = Config { auth, debug_clock: true, ..Config::default() };
    let (node, _dir) = common::start_node(config).await;
    let router = node.router();
    let ns1 = create_token(&router, "ns1").await;
    let ns2 = create_token(&router, "ns2").await;
    let denied = |s: StatusCode| s == StatusCode::UNAUTHORIZED || s == StatusCode::FORBIDDEN;

    let doc: Value = serde_json::from_str(DOCUMENT).unwrap();
    let mut checked = 0;
    for (template, item) in doc["paths"].as_object().unwrap() {
        for (verb, op) in item.as_object().unwrap() {
            let method = Method::from_bytes(verb.to_uppercase().as_bytes()).unwrap();
            let path = concrete(template, op);
            let what = format!("{method} {path}");
            let scope = op["x-delayd-scope"].as_str().unwrap();
            let anonymous = status(&router, &method, &path, None).await;
            let own = status(&router, &method, &path, Some(&ns1)).await;
            match scope {
                "open" => {
                    assert!(!denied(anonymous), "{what} is open, but: {anonymous}");
                    assert!(!denied(own), "{what} is open, but with a token: {own}");
                }
                "namespace" => {
                    assert_eq!(anonymous, StatusCode::UNAUTHORIZED, "{what} without a token");
                    assert!(!denied(own), "{what} with its namespace's token: {own}");
                    let other = status(&router, &method, &path, Some(&ns2)).await;
                    assert_eq!(other, StatusCode::FORBIDDEN, "{what} with another namespace's");
                }
                "admin" | "metrics" => {
                    assert_eq!(anonymous, StatusCode::UNAUTHORIZED, "{what} without a token");
                    assert_eq!(own, StatusCode::FORBIDDEN, "{what} with a namespace token");
                }
                other => panic!("{what}: unknown scope {other}"),
            }
            checked += 1;
        }
    }
    assert!(checked > 40, "only {checked} operations were checked");
    node.shutdown().await;
}
