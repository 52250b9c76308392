//! Recurring jobs over the HTTP API on a single-node cluster: occurrences arrive as ordinary
//! jobs on time, one per occurrence under `{name}@{occurrence}`; bad schedules are refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use delayd_server::{Config, Node};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

const Q: &str = "/api/ns/q";

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

struct TestNode {
    node: Node,
    router: Router,
    _dir: tempfile::TempDir,
}

impl TestNode {
    async fn start() -> TestNode {
        let (node, dir) = common::start_node(Config::default()).await;
        TestNode { router: node.router(), node, _dir: dir }
    }

    async fn call(&self, method: Method, uri: &str, body: &str) -> (StatusCode, Value) {
        let req = Request::builder().method(method).uri(uri).body(Body::from(body.to_string()));
        let resp = self.router.clone().oneshot(req.unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn occurrences_arrive_on_time_one_job_each() {
    let t = TestNode::start().await;
    let start = now_ms() + 500;
    let body = json!({"every_ms": 200, "data": "aGk=", "start_at_ms": start, "ttr": 30,
                      "attributes": {"kind": "beat"}});
    let (s, v) = t.call(Method::PUT, &format!("{Q}/schedules/tick"), &body.to_string()).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["next_at_ms"].as_u64(), Some(start), "the first occurrence is the start");
    let (s, v) = t.call(Method::PUT, &format!("{Q}/schedules/tick"), &body.to_string()).await;
    assert_eq!(s, StatusCode::OK, "replaced: {v}");

    let mut seen = Vec::new();
    while seen.len() < 4 {
        let (s, v) = t.call(Method::GET, &format!("{Q}?timeout=5&ttr=30"), "").await;
        assert_eq!(s, StatusCode::OK, "an occurrence within 5 s: {v}");
        let received = now_ms();
        let due = v["due_at_ms"].as_u64().unwrap();
        assert!(received >= due, "delivered {} ms before its occurrence", due - received);
        assert_eq!(v["key"], format!("tick@{due}"));
        assert_eq!(
            (v["attributes"]["schedule"].as_str(), v["data"].as_str()),
            (Some("tick"), Some("aGk="))
        );
        assert_eq!(v["attributes"]["kind"], "beat");
        seen.push(due);
        let id = v["job_id"].as_str().unwrap();
        assert_eq!(
            t.call(Method::DELETE, &format!("{Q}/job/{id}"), "").await.0,
            StatusCode::NO_CONTENT
        );
    }
    // Consecutive occurrences of the timetable, each once.
    for pair in seen.windows(2) {
        assert_eq!(pair[1] - pair[0], 200, "{seen:?}");
    }
    assert_eq!((seen[0] - start) % 200, 0, "{seen:?}");

    let (s, v) = t.call(Method::GET, &format!("{Q}/schedules"), "").await;
    assert_eq!(s, StatusCode::OK);
    let listed = &v["schedules"][0];
    assert_eq!((listed["name"].as_str(), listed["every_ms"].as_u64()), (Some("tick"), Some(200)));
    assert!(listed["next_at_ms"].as_u64().unwrap() > *seen.last().unwrap());
    assert_eq!(
        t.call(Method::DELETE, &format!("{Q}/schedules/tick"), "").await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        t.call(Method::GET, &format!("{Q}/schedules/tick"), "").await.0,
        StatusCode::NOT_FOUND
    );
    t.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_schedules_are_refused_naming_the_problem() {
    let t = TestNode::start().await;
    for (body, needle) in [
        (json!({"cron": "every day"}), "invalid cron expression"),
        (json!({"cron": "0 * * * * *", "tz": "Mars/Base"}), "unknown time zone"),
        (json!({"cron": "0 * * * * *", "every_ms": 1000}), "one of cron and every_ms"),
        (json!({}), "one of cron and every_ms"),
        (json!({"every_ms": 10}), "every_ms must be at least"),
        (json!({"every_ms": 1000, "tz": "UTC"}), "tz applies to cron"),
        (json!({"every_ms": 1000, "catch_up": "some"}), "invalid catch_up"),
        (json!({"every_ms": 1000, "start_at_ms": 5, "end_at_ms": 5}), "end_at_ms"),
        (json!({"every_ms": 1000, "data": "***"}), "base64"),
        (json!({"every_ms": 1000, "tries": 0}), "tries"),
        (json!({"every_ms": 1000, "colour": 1}), "unknown field"),
    ] {
        let (s, v) = t.call(Method::PUT, &format!("{Q}/schedules/s"), &body.to_string()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(needle), "{body}: {v}");
    }
    let (s, v) =
        t.call(Method::PUT, &format!("{Q}/schedules/bad.name"), r#"{"every_ms": 1000}"#).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, v) = t.call(Method::GET, &format!("{Q}/schedules"), "").await;
    assert_eq!((s, v["schedules"].as_array().map(Vec::len)), (StatusCode::OK, Some(0)));
    // A cron schedule in a zone is accepted and knows its next occurrence.
    let cron = json!({"cron": "0 30 2 * * *", "tz": "Europe/Berlin"});
    let (s, v) = t.call(Method::PUT, &format!("{Q}/schedules/nightly"), &cron.to_string()).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert!(v["next_at_ms"].as_u64().unwrap() > now_ms());
    t.node.shutdown().await;
}
