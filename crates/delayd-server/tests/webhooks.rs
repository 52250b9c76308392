//! Push delivery against a real receiver: a small HTTP server in the test, a single-node
//! cluster on RocksDB, the webhook set through the HTTP API. What the receiver gets (headers,
//! signature, timing) and what happens to the job after each kind of answer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::response::IntoResponse;
use axum::Router;
use delayd_server::{Config, Node};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tower::ServiceExt;

const Q: &str = "/api/ns/q";
const SECRET: &str = "test-secret-0123456789";

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// One request the receiver got: its headers, body and when it arrived (unix ms).
struct Received {
    headers: HeaderMap,
    body: Bytes,
    at_ms: u64,
}

/// A receiver on loopback that answers each request with the next of `answers` (the last
/// one again once they run out) and reports every request it gets.
async fn receiver(
    answers: Vec<(StatusCode, Option<&'static str>)>,
) -> (String, mpsc::UnboundedReceiver<Received>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let answers = Arc::new(Mutex::new(answers.into_iter().collect::<Vec<_>>()));
    let handler = move |headers: HeaderMap, body: Bytes| {
        let (tx, answers) = (tx.clone(), answers.clone());
        async move {
            let _ = tx.send(Received { headers, body, at_ms: now_ms() });
            let mut answers = answers.lock().unwrap();
            let (status, retry_after) =
                if answers.len() > 1 { answers.remove(0) } else { answers[0] };
            let mut response = status.into_response();
            if let Some(secs) = retry_after {
                response.headers_mut().insert("retry-after", secs.parse().unwrap());
            }
            response
        }
    };
    let app = Router::new().route("/hook", axum::routing::post(handler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, rx)
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

    async fn call(
        &self,
        method: Method,
        uri: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = self.router.clone().oneshot(req.body(Body::from(body.to_string())).unwrap());
        let resp = resp.await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    async fn set_webhook(&self, hook: Value) -> (StatusCode, Value) {
        self.call(Method::PUT, &format!("{Q}/webhook"), &[], &hook.to_string()).await
    }

    async fn publish(&self, query: &str, headers: &[(&str, &str)], body: &str) -> String {
        let (s, v) = self.call(Method::PUT, &format!("{Q}?{query}"), headers, body).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v["job_id"].as_str().unwrap().to_string()
    }

    /// Waits, up to 20 s, until `check` holds for the job's view (or its absence).
    async fn await_job(&self, id: &str, check: impl Fn(StatusCode, &Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (s, v) = self.call(Method::GET, &format!("{Q}/job/{id}"), &[], "").await;
            if check(s, &v) {
                return v;
            }
            assert!(Instant::now() < deadline, "job {id} never got there: {s} {v}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Received>) -> Received {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("the receiver got a request in time")
        .expect("receiver running")
}

fn header<'h>(r: &'h Received, name: &str) -> &'h str {
    r.headers.get(name).unwrap_or_else(|| panic!("no {name}")).to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_job_is_posted_signed_then_acked() {
    let t = TestNode::start().await;
    let (url, mut rx) = receiver(vec![(StatusCode::NO_CONTENT, None)]).await;

    let (s, v) = t.set_webhook(json!({"url": url, "secret": SECRET, "timeout_ms": 2000})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!((v["secret"].as_str(), v["max_in_flight"].as_u64()), (Some(SECRET), Some(32)));
    let (s, v) = t.set_webhook(json!({"url": url, "secret": SECRET, "timeout_ms": 2000})).await;
    assert_eq!(s, StatusCode::OK, "replacing: {v}");
    let (s, v) = t.call(Method::GET, &format!("{Q}/webhook"), &[], "").await;
    assert_eq!((s, v["url"].as_str()), (StatusCode::OK, Some(url.as_str())));
    assert!(v.get("secret").is_none(), "the secret is shown only when set: {v}");

    let id = t.publish("delay_ms=300", &[("job-attr-color", "blue")], "hello").await;
    let got = next(&mut rx).await;
    let due: u64 = header(&got, "delayd-due-at-ms").parse().unwrap();
    assert!(got.at_ms >= due, "posted {} ms early", due - got.at_ms);
    assert_eq!(header(&got, "delayd-job-id"), id);
    assert_eq!((header(&got, "delayd-namespace"), header(&got, "delayd-queue")), ("ns", "q"));
    assert_eq!((header(&got, "delayd-attempt"), header(&got, "delayd-remain-tries")), ("1", "0"));
    assert_eq!(header(&got, "job-attr-color"), "blue");
    assert_eq!(&got.body[..], b"hello");
    let signed = delayd_server::push::signature(SECRET, &id, due, b"hello");
    assert_eq!(header(&got, "delayd-signature"), format!("sha256={signed}"));

    // A 2xx acks the job.
    t.await_job(&id, |s, _| s == StatusCode::NOT_FOUND).await;
    t.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_back_off_then_the_last_one_dead_letters_the_job() {
    let t = TestNode::start().await;
    let (url, mut rx) = receiver(vec![(StatusCode::INTERNAL_SERVER_ERROR, None)]).await;
    let hook = json!({"url": url, "backoff_initial_ms": 200, "backoff_max_ms": 400});
    assert_eq!(t.set_webhook(hook).await.0, StatusCode::CREATED);

    let id = t.publish("tries=3", &[], "x").await;
    let mut attempts = Vec::new();
    for _ in 0..3 {
        let got = next(&mut rx).await;
        assert_eq!(header(&got, "delayd-job-id"), id);
        attempts.push(header(&got, "delayd-attempt").to_string());
    }
    assert_eq!(attempts, ["1", "2", "3"]);
    let dead = t.await_job(&id, |_, v| v["state"] == "dead").await;
    assert_eq!(dead["attributes"]["delayd-last-error"], "HTTP 500", "{dead}");
    let (s, v) = t.call(Method::GET, &format!("{Q}/deadletter/size"), &[], "").await;
    assert_eq!((s, v["size"].as_u64()), (StatusCode::OK, Some(1)));
    t.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured_and_a_refused_connection_is_a_failure() {
    let t = TestNode::start().await;
    // A 503 asking for a second's pause, then success.
    let (url, mut rx) =
        receiver(vec![(StatusCode::SERVICE_UNAVAILABLE, Some("1")), (StatusCode::OK, None)]).await;
    let hook = json!({"url": url, "backoff_initial_ms": 1, "backoff_max_ms": 5000});
    assert_eq!(t.set_webhook(hook).await.0, StatusCode::CREATED);
    let id = t.publish("tries=2", &[], "x").await;
    let first = next(&mut rx).await;
    let second = next(&mut rx).await;
    let gap = second.at_ms - first.at_ms;
    assert!(gap >= 900, "the retry came {gap} ms after a Retry-After of 1 s");
    t.await_job(&id, |s, _| s == StatusCode::NOT_FOUND).await;

    // Nothing listens here: the job fails with the connection error and, on its last try,
    // rests in the dead letter with it.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nowhere = format!("http://{}/hook", closed.local_addr().unwrap());
    drop(closed);
    assert_eq!(t.set_webhook(json!({"url": nowhere})).await.0, StatusCode::OK);
    let id = t.publish("tries=1", &[], "x").await;
    let dead = t.await_job(&id, |_, v| v["state"] == "dead").await;
    let error = dead["attributes"]["delayd-last-error"].as_str().unwrap();
    assert!(!error.is_empty() && !error.starts_with("HTTP"), "{error}");
    t.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_webhooks_are_refused_and_removal_makes_the_queue_pull_only() {
    let t = TestNode::start().await;
    for (body, needle) in [
        (json!({"url": "ftp://x/"}), "only http and https"),
        (json!({"url": "http://x/", "timeout_ms": 0}), "timeout_ms"),
        (json!({"url": "http://x/", "max_in_flight": 5000}), "max_in_flight"),
        (json!({"url": "http://x/", "surprise": 1}), "unknown field"),
        (json!({"timeout_ms": 5}), "url"),
    ] {
        let (s, v) = t.set_webhook(body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(needle), "{body}: {v}");
    }
    let (s, _) = t.call(Method::GET, &format!("{Q}/webhook"), &[], "").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "nothing was set");
    let (s, v) = t.publish_refused("job-attr-delayd-x").await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");

    assert_eq!(t.set_webhook(json!({"url": "http://127.0.0.1:9/"})).await.0, StatusCode::CREATED);
    let (s, _) = t.call(Method::DELETE, &format!("{Q}/webhook"), &[], "").await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = t.call(Method::DELETE, &format!("{Q}/webhook"), &[], "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    t.node.shutdown().await;
}

impl TestNode {
    /// A publish carrying a reserved attribute name.
    async fn publish_refused(&self, attribute: &str) -> (StatusCode, Value) {
        self.call(Method::PUT, Q, &[(attribute, "v")], "x").await
    }
}
