//! HTTP handler tests: the real router, driven in-process with `tower::ServiceExt::oneshot`,
//! over a real single-node cluster on RocksDB in a temporary directory.
//!
//! Each test starts its own node. Waiting is done the way a client would: a delayed or
//! redelivered job is awaited with a long-poll reserve; the only polling is for the dead letter,
//! which has no long-poll, and it is bounded by a deadline.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use base64::Engine;
use delayd_server::{Config, Node};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

/// The queue most tests use, and its API path.
const Q: &str = "/api/ns/q";

/// A job id that names no job.
const UNKNOWN_ID: &str = "01ARZ3NDEKTSV4RRFFQ69G5FAV";

// ---- harness ----

/// The router, called one request at a time; every answer is `(status, JSON body)`.
struct Client {
    router: Router,
}

impl Client {
    async fn call(
        &self,
        method: Method,
        uri: &str,
        headers: &[(&str, &str)],
        body: impl Into<Body>,
    ) -> (StatusCode, Value) {
        let (status, _, value) = self.send(method, uri, headers, body).await;
        (status, value)
    }

    /// As [`Client::call`], with the answer's headers.
    async fn send(
        &self,
        method: Method,
        uri: &str,
        headers: &[(&str, &str)],
        body: impl Into<Body>,
    ) -> (StatusCode, axum::http::HeaderMap, Value) {
        let mut req = Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let resp = self.router.clone().oneshot(req.body(body.into()).unwrap()).await.unwrap();
        let (parts, body) = resp.into_parts();
        let status = parts.status;
        let bytes = body.collect().await.unwrap().to_bytes();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                panic!(
                    "{uri}: {status} body is not JSON ({e}): {}",
                    String::from_utf8_lossy(&bytes)
                )
            })
        };
        (status, parts.headers, value)
    }

    async fn get(&self, uri: &str) -> (StatusCode, Value) {
        self.call(Method::GET, uri, &[], Body::empty()).await
    }

    /// A GET (a reserve carrying `ack=`), with the answer's `Delayd-Acked` header.
    async fn get_acked(&self, uri: &str) -> (StatusCode, Option<String>, Value) {
        let (status, headers, v) = self.send(Method::GET, uri, &[], Body::empty()).await;
        let acked = headers.get("delayd-acked").map(|h| h.to_str().unwrap().to_string());
        (status, acked, v)
    }

    async fn put(&self, uri: &str, body: impl Into<Body>) -> (StatusCode, Value) {
        self.call(Method::PUT, uri, &[], body).await
    }

    async fn patch(&self, uri: &str, body: impl Into<Body>) -> (StatusCode, Value) {
        self.call(Method::PATCH, uri, &[], body).await
    }

    async fn delete(&self, uri: &str) -> (StatusCode, Value) {
        self.call(Method::DELETE, uri, &[], Body::empty()).await
    }

    // ---- the calls most tests make, asserting their success ----

    /// Publishes `body` to `queue` (an API path plus query) and returns the new job id.
    async fn publish(&self, queue: &str, body: &str) -> String {
        let (status, v) = self.put(queue, body.to_string()).await;
        assert_eq!(status, StatusCode::CREATED, "publish {queue}: {v}");
        assert_eq!(v["msg"], "published", "{v}");
        let id = v["job_id"].as_str().unwrap().to_string();
        assert_eq!(id.len(), 26, "job ids are ULIDs: {id}");
        id
    }

    /// Reserves one job, asserting that there is one.
    async fn reserve(&self, uri: &str) -> Value {
        let (status, v) = self.get(uri).await;
        assert_eq!(status, StatusCode::OK, "reserve {uri}: {v}");
        assert_eq!(v["msg"], "new job", "{v}");
        v
    }

    /// Reserves, asserting that nothing is available.
    async fn reserve_none(&self, uri: &str) {
        assert_eq!(
            self.get(uri).await,
            (StatusCode::NOT_FOUND, json!({"msg": "no job available"})),
            "reserve {uri}"
        );
    }

    /// The number of ready jobs in `queue`.
    async fn size(&self, queue: &str) -> u64 {
        let (status, v) = self.get(&format!("{queue}/size")).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v["size"].as_u64().unwrap()
    }

    async fn dead_size(&self, queue: &str) -> u64 {
        let (status, v) = self.get(&format!("{queue}/deadletter/size")).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v["size"].as_u64().unwrap()
    }

    /// Job counts per state and the pause flag, without the time-dependent fields.
    async fn counts(&self, queue: &str) -> Value {
        let (status, v) = self.get(&format!("{queue}/stats")).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        json!({
            "paused": v["paused"], "delayed": v["delayed"], "ready": v["ready"],
            "reserved": v["reserved"], "dead": v["dead"],
        })
    }

    /// The last applied Raft log index: unchanged means nothing was written.
    /// The applied index once everything in the log is applied. openraft publishes its
    /// metrics after it answers a write, so an index read right after an answer may lag it.
    async fn applied(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (status, v) = self.get("/health").await;
            assert_eq!(status, StatusCode::OK, "{v}");
            let applied = v["last_applied"].as_u64().unwrap();
            if Some(applied) == v["last_log_index"].as_u64() {
                return applied;
            }
            assert!(Instant::now() < deadline, "the log is not applied: {v}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A running node and a client of its router; `stop` shuts the node down.
struct TestNode {
    node: Node,
    client: Client,
    _dir: tempfile::TempDir,
}

impl TestNode {
    async fn start() -> TestNode {
        TestNode::start_with(Config::default()).await
    }

    async fn start_with(config: Config) -> TestNode {
        let (node, dir) = common::start_node(config).await;
        let client = Client { router: node.router() };
        TestNode { node, client, _dir: dir }
    }

    async fn stop(self) {
        self.node.shutdown().await;
    }

    /// A GET in a task of its own, for a request that is to wait while the test goes on.
    fn spawn_get(&self, uri: String) -> tokio::task::JoinHandle<(StatusCode, Value)> {
        let client = Client { router: self.node.router() };
        tokio::spawn(async move { client.get(&uri).await })
    }

    /// Waits until exactly `n` reserves are parked on the node (`delayd_reserves_waiting`).
    async fn await_parked(&self, n: u64) {
        let want = format!("delayd_reserves_waiting {n}\n");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.node.metrics().render(self.node.cluster()).unwrap().contains(&want) {
            assert!(Instant::now() < deadline, "never {want}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until `uri` answers 404 (the job it names is gone).
    async fn await_gone(&self, uri: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.get(uri).await.0 != StatusCode::NOT_FOUND {
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl std::ops::Deref for TestNode {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A lease token that is not `lease` but has the same form.
fn other_lease(lease: &Value) -> String {
    let token = u64::from_str_radix(lease.as_str().unwrap(), 16).unwrap();
    format!("{:x}", token ^ 1)
}

/// Polls the dead letter of `queue` until it holds `n` jobs; the dead letter has no
/// long-poll to await.
async fn await_dead(c: &Client, queue: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.dead_size(queue).await != n {
        assert!(Instant::now() < deadline, "dead letter of {queue} never reached {n}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---- publish and consume ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_then_consume_shows_every_field() {
    let t = TestNode::start().await;
    let (status, v) = t
        .call(
            Method::PUT,
            &format!("{Q}?ttl=100&tries=3&priority=7"),
            &[("Job-Attr-Foo", "bar")],
            "hello",
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(v["msg"], "published");
    let id = v["job_id"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 26);

    let job = t.reserve(Q).await;
    assert_eq!(job["namespace"], "ns");
    assert_eq!(job["queue"], "q");
    assert_eq!(job["job_id"], id);
    assert_eq!(job["data"], b64("hello"));
    let ttl = job["ttl"].as_u64().unwrap();
    assert!((99..=100).contains(&ttl), "ttl {ttl}");
    assert!(job["elapsed_ms"].as_u64().unwrap() < 10_000, "{job}");
    assert_eq!(job["remain_tries"], 2);
    assert_eq!(job["attributes"], json!({"foo": "bar"}));
    assert_eq!(job["attempt"], 1);
    assert_eq!(job["priority"], 7);
    assert!(job["due_at_ms"].as_u64().unwrap() <= wall_ms());
    assert!(job["lease"].as_str().is_some_and(|l| !l.is_empty()), "{job}");
    assert_eq!(job["state"], "reserved");

    t.reserve_none(Q).await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_many_and_from_several_queues() {
    let t = TestNode::start().await;
    t.reserve_none(Q).await;

    let ids = [t.publish(Q, "a").await, t.publish(Q, "b").await, t.publish(Q, "c").await];
    let (status, v) = t.get(&format!("{Q}?count=3")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let got: Vec<&str> =
        v.as_array().unwrap().iter().map(|j| j["job_id"].as_str().unwrap()).collect();
    assert_eq!(got, ids, "in publish order");

    // count > 1 answers an array even when fewer jobs are ready.
    let one = t.publish(Q, "d").await;
    let (status, v) = t.get(&format!("{Q}?count=3")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert_eq!(v[0]["job_id"], one);

    // Queues are taken in the order named, whatever the publish order.
    let in_q2 = t.publish("/api/ns/q2", "2").await;
    let in_q1 = t.publish("/api/ns/q1", "1").await;
    assert_eq!(t.reserve("/api/ns/q1,q2").await["job_id"], in_q1);
    let job = t.reserve("/api/ns/q1,q2").await;
    assert_eq!((&job["job_id"], &job["queue"]), (&json!(in_q2), &json!("q2")));
    t.reserve_none("/api/ns/q1,q2").await;
    t.stop().await;
}

// ---- ack ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_deletes_and_checks_the_lease() {
    let t = TestNode::start().await;
    let unknown = format!("{Q}/job/{UNKNOWN_ID}");
    assert_eq!(t.delete(&unknown).await, (StatusCode::NO_CONTENT, Value::Null));

    // Without a lease: deleted in any state.
    let id = t.publish(Q, "x").await;
    assert_eq!(t.delete(&format!("{Q}/job/{id}")).await.0, StatusCode::NO_CONTENT);
    assert_eq!(t.get(&format!("{Q}/job/{id}")).await.0, StatusCode::NOT_FOUND);

    // With a lease: only the current one.
    let id = t.publish(Q, "y").await;
    let job = t.reserve(Q).await;
    let (status, v) = t.delete(&format!("{Q}/job/{id}?lease={}", other_lease(&job["lease"]))).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert!(v["error"].as_str().unwrap().contains("lease"), "{v}");
    assert_eq!(t.get(&format!("{Q}/job/{id}")).await.0, StatusCode::OK, "still there");
    let lease = job["lease"].as_str().unwrap();
    assert_eq!(t.delete(&format!("{Q}/job/{id}?lease={lease}")).await.0, StatusCode::NO_CONTENT);
    assert_eq!(t.get(&format!("{Q}/job/{id}")).await.0, StatusCode::NOT_FOUND);
    assert_eq!(
        t.counts(Q).await,
        json!({"paused": false, "delayed": 0, "ready": 0, "reserved": 0, "dead": 0})
    );
    t.stop().await;
}

/// The `ack` extension: a consumer acks its previous job on its next reserve, in one request
/// and one log entry; the answer says whether the previous job went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_acks_the_previous_job_in_the_same_request() {
    let t = TestNode::start().await;
    let first = t.publish(Q, "a").await;
    let second = t.publish(Q, "b").await;
    let job = t.reserve(Q).await;
    assert_eq!(job["job_id"], first.as_str());
    let lease = job["lease"].as_str().unwrap().to_string();

    let applied = t.applied().await;
    let v = t.reserve(&format!("{Q}?ack={first}&ack_lease={lease}")).await;
    assert_eq!(v["job_id"], second.as_str(), "{v}");
    assert_eq!(v["acked"], true, "{v}");
    assert_eq!(t.applied().await, applied + 1, "the ack and the reserve share one entry");
    assert_eq!(t.get(&format!("{Q}/job/{first}")).await.0, StatusCode::NOT_FOUND);

    // Nothing left: the ack still happens, and the 404 says so.
    let lease = v["lease"].as_str().unwrap().to_string();
    let (status, v) = t.get(&format!("{Q}?ack={second}&ack_lease={lease}&timeout=0")).await;
    assert_eq!(
        (status, v),
        (StatusCode::NOT_FOUND, json!({"msg": "no job available", "acked": true}))
    );
    assert_eq!(t.get(&format!("{Q}/job/{second}")).await.0, StatusCode::NOT_FOUND);

    // A lease that is not the job's acks nothing; the reserve is served all the same.
    let third = t.publish(Q, "c").await;
    let fourth = t.publish(Q, "d").await;
    let job = t.reserve(Q).await;
    assert_eq!(job["job_id"], third.as_str());
    let wrong = other_lease(&job["lease"]);
    let v = t.reserve(&format!("{Q}?ack={third}&ack_lease={wrong}")).await;
    assert_eq!((v["job_id"].as_str(), &v["acked"]), (Some(fourth.as_str()), &json!(false)));
    assert_eq!(t.get(&format!("{Q}/job/{third}")).await.0, StatusCode::OK, "still there");

    // Bad parameters are refused before anything is written.
    let applied = t.applied().await;
    for (uri, names) in [
        (format!("{Q}?ack=nope"), "job id"),
        (format!("{Q}?ack={third}&ack_lease=zz"), "ack_lease"),
        (format!("{Q}?ack_lease=1f"), "ack_lease"),
        (format!("{Q}?ack={third}&ack_queue=bad%20name"), "queue"),
    ] {
        let (status, v) = t.get(&uri).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {v}");
        assert!(v["error"].as_str().unwrap().contains(names), "{uri}: {v}");
    }
    assert_eq!(t.applied().await, applied, "refused requests wrote nothing");
    t.stop().await;
}

/// `ack=` with several ids: a consumer that reserved a batch acks all of it on its next
/// reserve, in the same entry; the answer says, id by id, which acks removed their job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_acks_every_job_of_the_previous_batch() {
    let t = TestNode::start().await;
    let lease_of = |job: &Value| job["lease"].as_str().unwrap().to_string();
    let id_of = |job: &Value| job["job_id"].as_str().unwrap().to_string();
    for body in ["a", "b", "c", "d", "e"] {
        t.publish(Q, body).await;
    }
    let (status, batch) = t.get(&format!("{Q}?count=3")).await;
    assert_eq!(status, StatusCode::OK, "{batch}");
    let batch = batch.as_array().unwrap().clone();
    assert_eq!(batch.len(), 3);
    let ids: Vec<String> = batch.iter().map(id_of).collect();
    let mut leases: Vec<String> = batch.iter().map(lease_of).collect();
    // The second lease is not its job's: that ack removes nothing; the others do.
    leases[1] = other_lease(&batch[1]["lease"]);

    let applied = t.applied().await;
    let uri =
        format!("{Q}?count=2&ack={}&ack_lease={}&ack_queue=q", ids.join(","), leases.join(","));
    let (status, acked, next) = t.get_acked(&uri).await;
    assert_eq!(status, StatusCode::OK, "{next}");
    assert_eq!(acked.as_deref(), Some("true,false,true"), "the header, in the order of the ids");
    let next = next.as_array().unwrap().clone();
    assert_eq!(next.len(), 2, "the reserve was served all the same");
    assert_eq!(t.applied().await, applied + 1, "the acks and the reserve share one entry");
    for (id, gone) in ids.iter().zip([true, false, true]) {
        let status = t.get(&format!("{Q}/job/{id}")).await.0;
        assert_eq!(status == StatusCode::NOT_FOUND, gone, "job {id}");
    }

    // With count=1 the delivery's `acked` is an array of the same answers; one of the acks
    // names its queue in `ack_queue`, one queue per id.
    let other = t.publish("/api/ns/r", "r").await;
    let other_lease_now = lease_of(&t.reserve("/api/ns/r").await);
    t.publish(Q, "f").await;
    let (ids, leases): (Vec<String>, Vec<String>) =
        next.iter().map(|j| (id_of(j), lease_of(j))).chain([(other, other_lease_now)]).unzip();
    let uri = format!("{Q}?ack={}&ack_lease={}&ack_queue=q,q,r", ids.join(","), leases.join(","));
    let (status, acked, v) = t.get_acked(&uri).await;
    assert_eq!((status, acked.as_deref()), (StatusCode::OK, Some("true,true,true")), "{v}");
    assert_eq!(v["acked"], json!([true, true, true]), "{v}");
    for id in &ids[..2] {
        assert_eq!(t.get(&format!("{Q}/job/{id}")).await.0, StatusCode::NOT_FOUND);
    }
    assert_eq!(t.get(&format!("/api/ns/r/job/{}", ids[2])).await.0, StatusCode::NOT_FOUND);

    // One id answers one word, in the header and in the 404 when nothing is ready.
    let uri = format!("{Q}?ack={}&ack_lease={}", id_of(&v), lease_of(&v));
    let (status, acked, v) = t.get_acked(&uri).await;
    assert_eq!((status, acked.as_deref()), (StatusCode::NOT_FOUND, Some("true")));
    assert_eq!(v, json!({"msg": "no job available", "acked": true}));

    // The first queue is every ack's by default: a job of another queue is not found there.
    let other = t.publish("/api/ns/r", "r2").await;
    let lease = lease_of(&t.reserve("/api/ns/r").await);
    let (status, acked, _) = t.get_acked(&format!("{Q}?ack={other}&ack_lease={lease}")).await;
    assert_eq!((status, acked.as_deref()), (StatusCode::NOT_FOUND, Some("false")));
    assert_eq!(t.get(&format!("/api/ns/r/job/{other}")).await.0, StatusCode::OK, "still there");

    // Lists that do not match, and more acks than one reserve carries, are refused before
    // anything is written.
    let applied = t.applied().await;
    let too_many = vec![UNKNOWN_ID; 101].join(",");
    for (uri, names) in [
        (format!("{Q}?ack={UNKNOWN_ID},,{UNKNOWN_ID}"), "job id"),
        (format!("{Q}?ack={too_many}"), "at most 100"),
        (format!("{Q}?ack={UNKNOWN_ID},{UNKNOWN_ID}&ack_lease=1f"), "1 tokens for 2 ids"),
        (format!("{Q}?ack={UNKNOWN_ID},{UNKNOWN_ID}&ack_lease=1f,zz"), "ack_lease"),
        (format!("{Q}?ack={UNKNOWN_ID},{UNKNOWN_ID}&ack_queue=q,r,s"), "3 queues for 2 ids"),
    ] {
        let (status, v) = t.get(&uri).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {v}");
        assert!(v["error"].as_str().unwrap().contains(names), "{uri}: {v}");
    }
    assert_eq!(t.applied().await, applied, "refused requests wrote nothing");
    t.stop().await;
}

/// A reserve that carries `ack=` and finds nothing ready holds the ack (`ack_hold`) and sends
/// it in the entry of the reserve a job wakes, instead of in an entry of its own. A held ack still goes when the hold ends, when the wait ends, when the caller goes away and
/// when the node drains; one whose lease is too short to outlast the hold goes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_reserve_holds_its_ack_for_the_entry_that_takes_a_job() {
    // A hold no slow machine outlasts by accident; each step below ends it on purpose.
    let config = Config { ack_hold: Duration::from_secs(10), ..Config::default() };
    let t = TestNode::start_with(config).await;
    let lease_of = |job: &Value| job["lease"].as_str().unwrap().to_string();

    // Held until a job comes, then sent with the reserve that takes it.
    let first = t.publish(Q, "a").await;
    let lease = lease_of(&t.reserve(Q).await);
    let applied = t.applied().await;
    let waiting = t.spawn_get(format!("{Q}?ack={first}&ack_lease={lease}&timeout=30"));
    t.await_parked(1).await;
    assert_eq!(t.applied().await, applied, "the ack is held, not written");
    assert_eq!(t.counts(Q).await["reserved"], 1);
    let second = t.publish(Q, "b").await;
    let (status, v) = waiting.await.unwrap();
    assert_eq!((status, &v["job_id"], &v["acked"]), (StatusCode::OK, &json!(second), &json!(true)));
    assert_eq!(t.applied().await, applied + 2, "the publish, then the ack with the reserve");
    assert_eq!(t.get(&format!("{Q}/job/{first}")).await.0, StatusCode::NOT_FOUND);

    // Nothing comes: the ack is held as long as the wait (shorter than the hold), and goes
    // when the wait ends.
    let lease = lease_of(&v);
    let applied = t.applied().await;
    let started = Instant::now();
    let waiting = t.spawn_get(format!("{Q}?ack={second}&ack_lease={lease}&timeout=1"));
    t.await_parked(1).await;
    assert_eq!(t.applied().await, applied, "held while the reserve waits");
    let (status, v) = waiting.await.unwrap();
    assert_eq!(
        (status, v),
        (StatusCode::NOT_FOUND, json!({"msg": "no job available", "acked": true}))
    );
    assert!(started.elapsed() >= Duration::from_millis(900), "{:?}", started.elapsed());
    assert_eq!(t.get(&format!("{Q}/job/{second}")).await.0, StatusCode::NOT_FOUND);

    // The caller goes away while the ack is held: it is sent all the same.
    let third = t.publish(Q, "c").await;
    let lease = lease_of(&t.reserve(Q).await);
    let waiting = t.spawn_get(format!("{Q}?ack={third}&ack_lease={lease}&timeout=30"));
    t.await_parked(1).await;
    waiting.abort();
    t.await_gone(&format!("{Q}/job/{third}"), "the ack of a dropped reserve was lost").await;
    t.await_parked(0).await;

    // A lease shorter than twice the hold and the request timeout is not held: the ack is
    // written before the wait.
    let fourth = t.publish(Q, "d").await;
    let lease = lease_of(&t.reserve(&format!("{Q}?ttr=15")).await);
    let applied = t.applied().await;
    let waiting = t.spawn_get(format!("{Q}?ack={fourth}&ack_lease={lease}&timeout=30"));
    t.await_parked(1).await;
    assert_eq!(t.applied().await, applied + 1, "the ack went before the reserve parked");
    assert_eq!(t.get(&format!("{Q}/job/{fourth}")).await.0, StatusCode::NOT_FOUND);
    waiting.abort();
    t.await_parked(0).await;

    // Draining answers a waiting reserve at once, and sends the ack it holds first.
    let fifth = t.publish(Q, "e").await;
    let lease = lease_of(&t.reserve(Q).await);
    let waiting = t.spawn_get(format!("{Q}?ack={fifth}&ack_lease={lease}&timeout=30"));
    t.await_parked(1).await;
    t.node.service().drain();
    let answer = tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap();
    assert_eq!(answer, (StatusCode::NOT_FOUND, json!({"msg": "no job available", "acked": true})));
    assert_eq!(t.get(&format!("{Q}/job/{fifth}")).await.0, StatusCode::NOT_FOUND);
    t.stop().await;
}

/// A hold shorter than the wait: the ack goes when the hold ends, while the reserve keeps
/// waiting, and the job it takes later still answers `acked: true`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_ack_goes_when_the_hold_ends_and_the_reserve_keeps_waiting() {
    let config = Config { ack_hold: Duration::from_millis(300), ..Config::default() };
    let t = TestNode::start_with(config).await;
    let first = t.publish(Q, "a").await;
    let lease = t.reserve(Q).await["lease"].as_str().unwrap().to_string();
    let applied = t.applied().await;
    let started = Instant::now();
    let waiting = t.spawn_get(format!("{Q}?ack={first}&ack_lease={lease}&timeout=30"));
    t.await_gone(&format!("{Q}/job/{first}"), "the held ack never went").await;
    assert!(started.elapsed() >= Duration::from_millis(300), "{:?}", started.elapsed());
    assert!(!waiting.is_finished(), "the reserve keeps waiting after its ack went");
    assert_eq!(t.applied().await, applied + 1, "the ack, with an attempt that found nothing");
    let second = t.publish(Q, "b").await;
    let (status, v) = waiting.await.unwrap();
    assert_eq!((status, &v["job_id"], &v["acked"]), (StatusCode::OK, &json!(second), &json!(true)));
    t.stop().await;
}

/// A reserve parked on the leader rides the timer pump's tick: the job the tick makes ready
/// is delivered in the tick's own entry, with the ack the reserve holds, not in an entry of
/// the reserve's own after the tick's. A reserve of a queue with nothing due stays parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_reserve_rides_the_tick_that_makes_its_job_ready() {
    let config = Config { ack_hold: Duration::from_secs(10), ..Config::default() };
    let t = TestNode::start_with(config).await;
    let rides = |outcome: &str| {
        let metrics = t.node.metrics().render(t.node.cluster()).unwrap();
        let line =
            format!("delayd_reserve_attempts_total{{entry=\"tick\",outcome=\"{outcome}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(&line)?.parse::<u64>().ok()).unwrap_or(0)
    };
    // Parked first, so the delayed job comes due while they wait, however slow the machine.
    let idle = t.spawn_get("/api/ns/idle?timeout=30".to_string());
    let waiting = t.spawn_get(format!("{Q}?timeout=30"));
    t.await_parked(2).await;
    let applied = t.applied().await;
    let first = t.publish(&format!("{Q}?delay_ms=300"), "a").await;
    let (status, v) = waiting.await.unwrap();
    assert_eq!((status, &v["job_id"]), (StatusCode::OK, &json!(first)));
    assert_eq!(t.applied().await, applied + 2, "the publish, then the tick with the reserve");
    assert_eq!((rides("delivered"), rides("empty")), (1, 0), "the idle queue's reserve stayed");

    // With the ack the reserve holds (nothing written while it waits).
    let lease = v["lease"].as_str().unwrap().to_string();
    let applied = t.applied().await;
    let waiting = t.spawn_get(format!("{Q}?ack={first}&ack_lease={lease}&timeout=30"));
    t.await_parked(2).await;
    assert_eq!(t.applied().await, applied, "the ack is held");
    let second = t.publish(&format!("{Q}?delay_ms=300"), "b").await;
    let (status, v) = waiting.await.unwrap();
    assert_eq!((status, &v["job_id"], &v["acked"]), (StatusCode::OK, &json!(second), &json!(true)));
    assert_eq!(t.applied().await, applied + 2, "the publish, then the tick, ack and reserve");
    assert_eq!(t.get(&format!("{Q}/job/{first}")).await.0, StatusCode::NOT_FOUND);
    assert_eq!((rides("delivered"), rides("empty")), (2, 0));
    assert!(!idle.is_finished(), "the idle queue's reserve still waits");
    idle.abort();
    t.stop().await;
}

// ---- time ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_job_is_delivered_when_due_not_before() {
    let t = TestNode::start().await;
    let id = t.publish(&format!("{Q}?delay_ms=300"), "later").await;
    t.reserve_none(Q).await;
    let (_, peeked) = t.get(&format!("{Q}/job/{id}")).await;
    assert_eq!(peeked["state"], "delayed");
    let due = peeked["due_at_ms"].as_u64().unwrap();

    let job = t.reserve(&format!("{Q}?timeout=2")).await;
    let now = wall_ms();
    assert_eq!(job["job_id"], id);
    assert_eq!(job["due_at_ms"], due);
    assert!(now >= due, "delivered {} ms before it was due", due - now);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_on_an_empty_queue_times_out() {
    let t = TestNode::start().await;
    let start = Instant::now();
    let (status, v) =
        tokio::time::timeout(Duration::from_secs(5), t.get(&format!("{Q}?timeout=1")))
            .await
            .expect("a long-poll of 1 s must not hang");
    let waited = start.elapsed();
    assert_eq!((status, v), (StatusCode::NOT_FOUND, json!({"msg": "no job available"})));
    assert!(waited >= Duration::from_millis(950), "answered after only {waited:?}");
    assert!(waited < Duration::from_secs(3), "answered after {waited:?}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_reservations_redeliver_then_dead_letter() {
    let t = TestNode::start().await;
    let a = t.publish(&format!("{Q}?tries=2"), "a").await;
    let b = t.publish(Q, "b").await; // one try

    let (status, v) = t.get(&format!("{Q}?count=2&ttr_ms=200")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let first = &v[0];
    assert_eq!(
        (&first["job_id"], &first["attempt"], &first["remain_tries"]),
        (&json!(a), &json!(1), &json!(1))
    );
    assert_eq!((&v[1]["job_id"], &v[1]["remain_tries"]), (&json!(b), &json!(0)));

    // When the ttr runs out, `a` comes back for its second try; `b` has none left.
    let again = t.reserve(&format!("{Q}?timeout=2&ttr_ms=200")).await;
    assert!(wall_ms() >= first["lease_deadline_ms"].as_u64().unwrap());
    assert_eq!(again["job_id"], a);
    assert_eq!(again["attempt"], 2);
    assert_eq!(again["remain_tries"], 0);
    assert_ne!(again["lease"], first["lease"]);
    let stale = format!("{Q}/job/{a}?lease={}", first["lease"].as_str().unwrap());
    assert_eq!(t.delete(&stale).await.0, StatusCode::CONFLICT);

    await_dead(&t, Q, 2).await;
    assert_eq!(t.size(Q).await, 0);
    assert_eq!(
        t.get(&format!("{Q}/deadletter")).await,
        (
            StatusCode::OK,
            json!({"namespace": "ns", "queue": "q", "deadletter_size": 2, "deadletter_head": b})
        )
    );
    assert_eq!(
        t.get(&format!("{Q}/deadletter/size")).await,
        (StatusCode::OK, json!({"namespace": "ns", "queue": "q", "size": 2}))
    );
    let (status, v) = t.get(&format!("{Q}/deadletter/jobs")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["size"], 2);
    let dead: Vec<(&Value, &Value, &Value)> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| (&j["job_id"], &j["state"], &j["data"]))
        .collect();
    assert_eq!(
        dead,
        [
            (&json!(b), &json!("dead"), &json!(b64("b"))),
            (&json!(a), &json!("dead"), &json!(b64("a")))
        ]
    );

    // Respawn the oldest: it is ready again with one try.
    assert_eq!(
        t.put(&format!("{Q}/deadletter?limit=1"), Body::empty()).await,
        (StatusCode::OK, json!({"msg": "respawned", "count": 1}))
    );
    assert_eq!((t.size(Q).await, t.dead_size(Q).await), (1, 1));
    let job = t.reserve(Q).await;
    assert_eq!((&job["job_id"], &job["remain_tries"]), (&json!(b), &json!(0)));

    assert_eq!(t.delete(&format!("{Q}/deadletter")).await, (StatusCode::NO_CONTENT, Value::Null));
    assert_eq!(t.dead_size(Q).await, 0);
    assert_eq!(
        t.get(&format!("{Q}/deadletter")).await.1,
        json!({"namespace": "ns", "queue": "q", "deadletter_size": 0, "deadletter_head": ""})
    );
    t.stop().await;
}

// ---- queries and queue administration ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek_size_stats_and_destroy() {
    let t = TestNode::start().await;
    assert_eq!(
        t.get(&format!("{Q}/job/{UNKNOWN_ID}")).await,
        (StatusCode::NOT_FOUND, json!({"error": "job not found"}))
    );
    assert_eq!(
        t.get(&format!("{Q}/peek")).await,
        (StatusCode::NOT_FOUND, json!({"error": "the queue is empty"}))
    );
    assert_eq!(
        t.get(&format!("{Q}/size")).await,
        (StatusCode::OK, json!({"namespace": "ns", "queue": "q", "size": 0}))
    );

    let delayed = t.publish(&format!("{Q}?delay=60"), "d").await;
    let ready = t.publish(Q, "r").await;
    let reserved = t.publish(Q, "s").await;
    let (status, v) = t.get(&format!("{Q}/peek")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (&v["job_id"], &v["state"], &v["data"]),
        (&json!(ready), &json!("ready"), &json!(b64("r")))
    );
    let (status, v) = t.get(&format!("{Q}/job/{delayed}")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (&v["state"], &v["data"], &v["attempt"]),
        (&json!("delayed"), &json!(b64("d")), &json!(0))
    );
    // Another queue does not see the job.
    assert_eq!(t.get(&format!("/api/ns/other/job/{delayed}")).await.0, StatusCode::NOT_FOUND);

    // Peeking takes nothing; make `reserved` the reserved one.
    assert_eq!(t.size(Q).await, 2);
    assert_eq!(t.reserve(Q).await["job_id"], ready);
    assert_eq!(t.delete(&format!("{Q}/job/{ready}")).await.0, StatusCode::NO_CONTENT);
    assert_eq!(t.reserve(Q).await["job_id"], reserved);
    let ready = t.publish(Q, "r2").await;

    let (status, v) = t.get(&format!("{Q}/stats")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (&v["namespace"], &v["queue"], &v["paused"]),
        (&json!("ns"), &json!("q"), &json!(false))
    );
    assert_eq!(
        [&v["delayed"], &v["ready"], &v["reserved"], &v["dead"]],
        [&json!(1), &json!(1), &json!(1), &json!(0)]
    );
    assert!(v["head_age_ms"].as_u64().is_some(), "{v}");
    let hist = v["due_histogram"].as_array().unwrap();
    assert_eq!(hist.len(), 5, "{v}");
    assert_eq!(
        hist[0],
        json!({"le_ms": 60_000, "count": 1}),
        "the delayed job is due within a minute"
    );
    assert_eq!(hist[4]["le_ms"], Value::Null);

    // Destroy removes the ready jobs only; `all=true` every job.
    assert_eq!(t.delete(Q).await, (StatusCode::NO_CONTENT, Value::Null));
    assert_eq!(t.size(Q).await, 0);
    assert_eq!(t.get(&format!("{Q}/job/{ready}")).await.0, StatusCode::NOT_FOUND);
    assert_eq!(
        t.counts(Q).await,
        json!({"paused": false, "delayed": 1, "ready": 0, "reserved": 1, "dead": 0})
    );
    assert_eq!(t.delete(&format!("{Q}?all=true")).await.0, StatusCode::NO_CONTENT);
    assert_eq!(
        t.counts(Q).await,
        json!({"paused": false, "delayed": 0, "ready": 0, "reserved": 0, "dead": 0})
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_queues_lists_every_queue_with_its_counts() {
    let t = TestNode::start().await;
    assert_eq!(
        t.get("/admin/queues").await,
        (StatusCode::OK, json!({"queues": [], "truncated": false}))
    );
    // Names of different lengths, published out of order: the answer is sorted by name.
    t.publish("/api/zz/a", "1").await;
    t.publish("/api/b/long-name?delay=60", "2").await;
    t.publish("/api/b/x", "3").await;
    t.publish("/api/b/x", "4").await;
    t.reserve("/api/b/x").await;
    assert_eq!(t.put("/api/zz/a/pause", "").await.0, StatusCode::NO_CONTENT);
    let row = |ns: &str, q: &str, paused: bool, c: [u64; 4]| {
        json!({"namespace": ns, "queue": q, "paused": paused,
               "delayed": c[0], "ready": c[1], "reserved": c[2], "dead": c[3]})
    };
    let all = [
        row("b", "long-name", false, [1, 0, 0, 0]),
        row("b", "x", false, [0, 1, 1, 0]),
        row("zz", "a", true, [0, 1, 0, 0]),
    ];
    assert_eq!(
        t.get("/admin/queues").await,
        (StatusCode::OK, json!({"queues": all, "truncated": false}))
    );
    assert_eq!(
        t.get("/admin/queues?limit=2&stale=true").await,
        (StatusCode::OK, json!({"queues": all[..2], "truncated": true}))
    );
    assert_eq!(
        t.get("/admin/queues?namespace=zz").await,
        (StatusCode::OK, json!({"queues": all[2..], "truncated": false}))
    );
    assert_eq!(
        t.get("/admin/queues?namespace=nothing").await,
        (StatusCode::OK, json!({"queues": [], "truncated": false}))
    );
    for (query, names) in [
        ("limit=0", "limit"),
        ("limit=10001", "limit"),
        ("limit=x", "limit"),
        ("namespace=a%20b", "namespace"),
        ("stale=maybe", "stale"),
    ] {
        let (status, v) = t.get(&format!("/admin/queues?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {v}");
        assert!(v["error"].as_str().unwrap().contains(names), "{query}: {v}");
    }
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_routes_that_read_the_query_refuse_a_body() {
    let t = TestNode::start().await;
    t.publish(Q, "a job").await;
    let applied = t.applied().await;
    // Arguments sent as a body would be ignored: the call would go ahead without them (a
    // leadership handed to whichever voter is ahead, a learner without its id).
    for (uri, body) in [
        ("/admin/leader", r#"{"to":1}"#),
        ("/admin/leader?to=1", "to=1"),
        ("/admin/nodes", r#"{"id":2,"addr":"127.0.0.1:1"}"#),
    ] {
        let (status, v) = t.call(Method::POST, uri, &[], body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {v}");
        let error = v["error"].as_str().unwrap();
        assert!(error.contains("query string") && error.contains("body"), "{uri}: {v}");
    }
    assert_eq!(t.applied().await, applied, "a refused call wrote nothing");
    assert_eq!(t.get("/admin/cluster").await.1["voters"], json!([1]));
    // The same calls with their arguments where they belong.
    assert_eq!(
        t.call(Method::POST, "/admin/leader?to=1", &[], Body::empty()).await,
        (StatusCode::OK, json!({"leader": 1}))
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_files_are_served_with_their_types() {
    let t = TestNode::start().await;
    let get = |uri: &'static str| {
        let router = t.client.router.clone();
        async move {
            let req = Request::builder().uri(uri).body(Body::empty()).unwrap();
            let resp = router.oneshot(req).await.unwrap();
            let status = resp.status();
            let headers = resp.headers().clone();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, headers, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    let (status, headers, _) = get("/dashboard").await;
    assert_eq!(status, StatusCode::PERMANENT_REDIRECT);
    assert_eq!(headers["location"], "/dashboard/");
    for (uri, content_type, marker) in [
        ("/dashboard/", "text/html; charset=utf-8", "<script src=\"app.js\""),
        ("/dashboard/app.js", "text/javascript; charset=utf-8", "/admin/queues"),
        ("/dashboard/style.css", "text/css; charset=utf-8", ".grid"),
    ] {
        let (status, headers, body) = get(uri).await;
        assert_eq!(status, StatusCode::OK, "{uri}");
        assert_eq!(headers["content-type"], content_type, "{uri}");
        assert_eq!(headers["cache-control"], "no-cache", "{uri}");
        assert!(body.contains(marker), "{uri}");
    }
    let (_, headers, _) = get("/dashboard/").await;
    assert!(headers["content-security-policy"].to_str().unwrap().contains("script-src 'self'"));
    assert_eq!(get("/dashboard/secret.txt").await.0, StatusCode::NOT_FOUND);
    t.stop().await;
}

// ---- bulk ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_publishes_all_or_nothing() {
    let t = TestNode::start().await;
    let (status, v) = t.put(&format!("{Q}/bulk"), r#"[{"a":1}, "two", 3]"#).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(v["msg"], "published");
    let ids = v["job_ids"].as_array().unwrap();
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().all(|id| id.as_str().unwrap().len() == 26), "{v}");
    assert_eq!(t.size(Q).await, 3);

    for (body, needle) in [
        ("[]".to_string(), "1 to 64"),
        (format!("[{}]", vec!["0"; 65].join(",")), "1 to 64"),
        ("not json".to_string(), "JSON array"),
        (r#"{"a":1}"#.to_string(), "JSON array"),
    ] {
        let (status, v) = t.put(&format!("{Q}/bulk"), body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(needle), "{body}: {v}");
    }
    assert_eq!(t.size(Q).await, 3, "a rejected bulk writes nothing");

    // Each element's JSON text is one job's body, in order.
    let (status, v) = t.get(&format!("{Q}?count=3")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let data: Vec<&Value> = v.as_array().unwrap().iter().map(|j| &j["data"]).collect();
    assert_eq!(data, [&json!(b64(r#"{"a":1}"#)), &json!(b64(r#""two""#)), &json!(b64("3"))]);
    assert_eq!(v[0]["job_id"], ids[0]);
    t.stop().await;
}

// ---- keys ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_dedups_and_addresses_a_job() {
    let t = TestNode::start().await;
    let id = t.publish(&format!("{Q}?key=k"), "first").await;
    assert_eq!(
        t.put(&format!("{Q}?key=k"), "second").await,
        (StatusCode::OK, json!({"msg": "exists", "job_id": id}))
    );
    assert_eq!(t.size(Q).await, 1);

    let (status, v) = t.get(&format!("{Q}/key/k")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (&v["job_id"], &v["key"], &v["data"]),
        (&json!(id), &json!("k"), &json!(b64("first")))
    );
    assert_eq!(t.get(&format!("{Q}/key/other")).await.0, StatusCode::NOT_FOUND);

    assert_eq!(t.delete(&format!("{Q}/key/k")).await, (StatusCode::NO_CONTENT, Value::Null));
    assert_eq!(
        t.get(&format!("{Q}/key/k")).await,
        (StatusCode::NOT_FOUND, json!({"error": "job not found"}))
    );
    assert_eq!(t.get(&format!("{Q}/job/{id}")).await.0, StatusCode::NOT_FOUND);
    assert_eq!(t.size(Q).await, 0);
    t.stop().await;
}

// ---- the extensions on one job ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_puts_a_reserved_job_back_later() {
    let t = TestNode::start().await;
    let id = t.publish(Q, "x").await;
    let job = t.reserve(Q).await;
    let release = format!("{Q}/job/{id}/release");

    let (status, v) =
        t.put(&format!("{release}?lease={}", other_lease(&job["lease"])), Body::empty()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert!(v["error"].as_str().unwrap().contains("lease"), "{v}");

    let lease = job["lease"].as_str().unwrap();
    let (status, v) =
        t.put(&format!("{release}?lease={lease}&delay_ms=200&priority=3"), Body::empty()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (&v["job_id"], &v["state"], &v["priority"]),
        (&json!(id), &json!("delayed"), &json!(3))
    );
    let due = v["due_at_ms"].as_u64().unwrap();
    t.reserve_none(Q).await;

    let again = t.reserve(&format!("{Q}?timeout=2")).await;
    assert!(wall_ms() >= due, "released job came back early");
    assert_eq!(
        (&again["job_id"], &again["attempt"], &again["priority"]),
        (&json!(id), &json!(2), &json!(3))
    );
    // The first lease is spent.
    assert_eq!(
        t.put(&format!("{release}?lease={lease}"), Body::empty()).await.0,
        StatusCode::CONFLICT
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn touch_extends_only_the_current_lease() {
    let t = TestNode::start().await;
    let id = t.publish(Q, "x").await;
    let job = t.reserve(&format!("{Q}?ttr=1")).await;
    let touch = format!("{Q}/job/{id}/touch");

    let (status, v) =
        t.put(&format!("{touch}?lease={}", other_lease(&job["lease"])), Body::empty()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    let lease = job["lease"].as_str().unwrap();
    let (status, v) = t.put(&format!("{touch}?lease={lease}&ttr=60"), Body::empty()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!((&v["job_id"], &v["state"]), (&json!(id), &json!("reserved")));
    // The reservation was 1 s; touched to 60 s it outlives a long-poll of 2 s.
    t.reserve_none(&format!("{Q}?timeout=2")).await;
    assert_eq!(t.delete(&format!("{Q}/job/{id}?lease={lease}")).await.0, StatusCode::NO_CONTENT);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bury_moves_a_reserved_job_to_the_dead_letter() {
    let t = TestNode::start().await;
    let id = t.publish(&format!("{Q}?tries=5"), "x").await;
    let job = t.reserve(Q).await;
    let bury = format!("{Q}/job/{id}/bury");

    let (status, v) =
        t.put(&format!("{bury}?lease={}", other_lease(&job["lease"])), Body::empty()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(t.dead_size(Q).await, 0);

    let lease = job["lease"].as_str().unwrap();
    let (status, v) = t.put(&format!("{bury}?lease={lease}"), Body::empty()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!((&v["job_id"], &v["state"]), (&json!(id), &json!("dead")));
    assert_eq!(t.dead_size(Q).await, 1);
    assert_eq!(t.get(&format!("{Q}/deadletter")).await.1["deadletter_head"], id);

    // The lease died with the reservation.
    let (status, v) = t.put(&format!("{bury}?lease={lease}"), Body::empty()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");

    // A bury may give the job a new priority, which it keeps in the dead letter.
    let second = t.publish(&format!("{Q}?priority=9"), "y").await;
    let job = t.reserve(Q).await;
    assert_eq!(job["job_id"], second);
    let lease = job["lease"].as_str().unwrap();
    let bury = format!("{Q}/job/{second}/bury?lease={lease}");
    let (status, v) = t.put(&format!("{bury}&priority=x"), Body::empty()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let (status, v) = t.put(&format!("{bury}&priority=2"), Body::empty()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!((&v["state"], &v["priority"]), (&json!("dead"), &json!(2)));
    assert_eq!(t.get(&format!("{Q}/job/{second}")).await.1["priority"], 2);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_updates_a_pending_job() {
    let t = TestNode::start().await;
    let first = t.publish(Q, "first").await;
    let later = t.publish(&format!("{Q}?delay=60"), "later").await;

    // Due now, most urgent, new body: it overtakes `first`.
    let (status, v) = t.patch(&format!("{Q}/job/{later}?delay_ms=0&priority=0"), "new body").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (&v["state"], &v["priority"], &v["data"]),
        (&json!("ready"), &json!(0), &json!(b64("new body")))
    );
    let job = t.reserve(Q).await;
    assert_eq!((&job["job_id"], &job["data"]), (&json!(later), &json!(b64("new body"))));

    // Delay a ready job.
    let (status, v) = t.patch(&format!("{Q}/job/{first}?delay=60"), Body::empty()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["state"], "delayed");
    t.reserve_none(Q).await;

    // A reserved job, an unknown job, and an empty update are refused.
    let (status, v) = t.patch(&format!("{Q}/job/{later}?priority=1"), Body::empty()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert!(v["error"].as_str().unwrap().contains("reserved"), "{v}");
    let (status, v) = t.patch(&format!("{Q}/job/{UNKNOWN_ID}?priority=1"), Body::empty()).await;
    assert_eq!((status, v), (StatusCode::NOT_FOUND, json!({"error": "job not found"})));
    let (status, v) = t.patch(&format!("{Q}/job/{first}"), Body::empty()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("nothing to update"), "{v}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_consumers_not_publishers() {
    let t = TestNode::start().await;
    assert_eq!(
        t.put(&format!("{Q}/pause"), Body::empty()).await,
        (StatusCode::NO_CONTENT, Value::Null)
    );
    let id = t.publish(Q, "x").await;
    assert_eq!(t.counts(Q).await["paused"], true);
    t.reserve_none(Q).await;
    t.reserve_none("/api/ns/q,other").await;

    assert_eq!(t.delete(&format!("{Q}/pause")).await, (StatusCode::NO_CONTENT, Value::Null));
    assert_eq!(t.counts(Q).await["paused"], false);
    assert_eq!(t.reserve(Q).await["job_id"], id);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn republish_replaces_a_job_with_a_new_one() {
    let t = TestNode::start().await;
    let old = t.publish(Q, "old").await;
    let (status, v) = t.put(&format!("{Q}/job/{old}?priority=9"), "new").await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(v["msg"], "published");
    let new = v["job_id"].as_str().unwrap();
    assert_eq!(new.len(), 26);
    assert_ne!(new, old);

    assert_eq!(t.get(&format!("{Q}/job/{old}")).await.0, StatusCode::NOT_FOUND);
    let (status, v) = t.get(&format!("{Q}/job/{new}")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!((&v["data"], &v["priority"]), (&json!(b64("new")), &json!(9)));
    assert_eq!(t.size(Q).await, 1);
    t.stop().await;
}

// ---- bad input: 4xx, an error that names the problem, nothing written ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_and_write_nothing() {
    const LIMIT: usize = 64;
    let t = TestNode::start_with(Config { max_body_bytes: LIMIT, ..Config::default() }).await;
    let id = t.publish(Q, "keep").await;
    let at_limit = "x".repeat(LIMIT);
    t.publish(Q, &at_limit).await;
    let counts = t.counts(Q).await;
    let applied = t.applied().await;

    let long_name = "a".repeat(256);
    let job = format!("{Q}/job/{id}");
    let cases: Vec<(Method, String, String, StatusCode, &str)> = vec![
        (
            Method::PUT,
            format!("{Q}?delay=abc"),
            "x".into(),
            StatusCode::BAD_REQUEST,
            "invalid delay",
        ),
        (
            Method::PUT,
            format!("{Q}?delay=10&ttl=5"),
            "x".into(),
            StatusCode::BAD_REQUEST,
            "ttl must be longer than delay",
        ),
        (
            Method::PUT,
            format!("{Q}?delay=1&delay_ms=5"),
            "x".into(),
            StatusCode::BAD_REQUEST,
            "only one of delay",
        ),
        (
            Method::PUT,
            format!("{Q}?delay=1&ttl=1"),
            "x".into(),
            StatusCode::BAD_REQUEST,
            "ttl must be longer than delay",
        ),
        (
            Method::PUT,
            format!("{Q}?ttl=18446744073709"),
            "x".into(),
            StatusCode::BAD_REQUEST,
            "invalid ttl",
        ),
        (
            Method::PUT,
            format!("{Q}?delay_ms=18446744073709551615"),
            "x".into(),
            StatusCode::BAD_REQUEST,
            "delay is beyond the maximum horizon",
        ),
        (
            Method::PUT,
            format!("{Q}?at=18446744073709551615"),
            "x".into(),
            StatusCode::BAD_REQUEST,
            "at is beyond the maximum horizon",
        ),
        (
            Method::PUT,
            format!("{Q}?ttl=4000000000"),
            "x".into(),
            StatusCode::BAD_REQUEST,
            "ttl is beyond the maximum horizon",
        ),
        (
            Method::PUT,
            format!("{Q}?ttr=4000000000"),
            "x".into(),
            StatusCode::BAD_REQUEST,
            "ttr is beyond the maximum horizon",
        ),
        (Method::PUT, format!("{Q}?tries=0"), "x".into(), StatusCode::BAD_REQUEST, "tries"),
        (
            Method::PUT,
            format!("{Q}?tries=70000"),
            "x".into(),
            StatusCode::BAD_REQUEST,
            "invalid tries",
        ),
        (Method::PUT, format!("{Q}?ttr=0"), "x".into(), StatusCode::BAD_REQUEST, "ttr"),
        (Method::PUT, format!("{Q}?key="), "x".into(), StatusCode::BAD_REQUEST, "key"),
        (
            Method::PUT,
            "/api/ns/bad.name".into(),
            "x".into(),
            StatusCode::BAD_REQUEST,
            "invalid queue name",
        ),
        (
            Method::PUT,
            format!("/api/ns/{long_name}"),
            "x".into(),
            StatusCode::BAD_REQUEST,
            "invalid queue name",
        ),
        (
            Method::PUT,
            "/api/bad.ns/q".into(),
            "x".into(),
            StatusCode::BAD_REQUEST,
            "invalid namespace name",
        ),
        (Method::PUT, "/api/ns/_q".into(), "x".into(), StatusCode::BAD_REQUEST, "reserved"),
        (Method::PUT, "/api/ns/%FF".into(), "x".into(), StatusCode::BAD_REQUEST, "UTF-8"),
        (
            Method::PUT,
            Q.into(),
            "x".repeat(LIMIT + 1),
            StatusCode::PAYLOAD_TOO_LARGE,
            "larger than the limit",
        ),
        (
            Method::PUT,
            format!("{Q}/bulk"),
            format!(r#"["{}"]"#, "x".repeat(LIMIT)),
            StatusCode::PAYLOAD_TOO_LARGE,
            "larger than the limit",
        ),
        (
            Method::PUT,
            job.clone(),
            "x".repeat(LIMIT + 1),
            StatusCode::PAYLOAD_TOO_LARGE,
            "larger than the limit",
        ),
        (
            Method::PATCH,
            job.clone(),
            "x".repeat(LIMIT + 1),
            StatusCode::PAYLOAD_TOO_LARGE,
            "larger than the limit",
        ),
        (Method::GET, format!("{Q}?count=101"), String::new(), StatusCode::BAD_REQUEST, "count"),
        (Method::GET, format!("{Q}?count=0"), String::new(), StatusCode::BAD_REQUEST, "count"),
        (
            Method::GET,
            format!("{Q}?timeout=601"),
            String::new(),
            StatusCode::BAD_REQUEST,
            "timeout",
        ),
        (Method::GET, format!("{Q}?ttr=0"), String::new(), StatusCode::BAD_REQUEST, "ttr"),
        (
            Method::GET,
            "/api/ns/q,bad.name".into(),
            String::new(),
            StatusCode::BAD_REQUEST,
            "invalid queue name",
        ),
        (Method::GET, "/nowhere".into(), String::new(), StatusCode::NOT_FOUND, "api not found"),
        (
            Method::GET,
            format!("{Q}/nowhere"),
            String::new(),
            StatusCode::NOT_FOUND,
            "api not found",
        ),
        (Method::POST, Q.into(), "x".into(), StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
        (
            Method::DELETE,
            format!("{Q}/job/not-an-id"),
            String::new(),
            StatusCode::BAD_REQUEST,
            "invalid job id",
        ),
        (
            Method::DELETE,
            format!("{job}?lease=xyz"),
            String::new(),
            StatusCode::BAD_REQUEST,
            "invalid lease",
        ),
        (
            Method::PUT,
            format!("{Q}/deadletter?limit=0"),
            String::new(),
            StatusCode::BAD_REQUEST,
            "limit",
        ),
        (
            Method::DELETE,
            format!("{Q}?all=maybe"),
            String::new(),
            StatusCode::BAD_REQUEST,
            "invalid all",
        ),
    ];
    for (method, uri, body, want, needle) in cases {
        let what = format!("{method} {}", &uri[..uri.len().min(80)]);
        let (status, v) = t.call(method, &uri, &[], body).await;
        assert_eq!(status, want, "{what}: {v}");
        let error = v["error"].as_str().unwrap_or_else(|| panic!("{what}: no error string in {v}"));
        assert!(error.contains(needle), "{what}: {error:?} does not name {needle:?}");
        assert_eq!(t.counts(Q).await, counts, "{what} changed the queue");
        assert_eq!(t.applied().await, applied, "{what} wrote to the log");
    }
    assert_eq!(t.get(&format!("{Q}/job/{id}")).await.1["data"], b64("keep"));

    // `at` against the ttl needs the replicated clock, so the state machine decides it: the
    // log gains an entry, the queue gains nothing.
    let (status, v) = t.put(&format!("{Q}?at={}&ttl=5", wall_ms() + 60_000), "x").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("ttl"), "{v}");
    assert_eq!(t.counts(Q).await, counts);

    // The body limit is per job: a bulk may be larger than one job's limit.
    let bulk = format!("[{}]", vec![format!("{:?}", "x".repeat(LIMIT - 2)); 4].join(","));
    assert!(bulk.len() > 4 * LIMIT);
    let (status, v) = t.put(&format!("{Q}/bulk"), bulk).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(t.size(Q).await, 6);
    t.stop().await;
}

// ---- test-only clock hook ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_debug_clock_exists_only_with_its_flag() {
    let t = TestNode::start().await;
    let (status, _) = t.get("/debug/clock").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = t.put("/debug/clock?offset_ms=5000", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shifted_clock_stamps_due_times_and_drives_the_pump() {
    let t = TestNode::start_with(Config { debug_clock: true, ..Config::default() }).await;
    for bad_uri in [
        "/debug/clock",
        "/debug/clock?offset_ms=soon",
        "/debug/clock?offset_ms=86400001",
        "/debug/clock?offset_ms=-86400001",
    ] {
        let (status, v) = t.put(bad_uri, "").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad_uri}: {v}");
        assert!(v["error"].as_str().unwrap().contains("offset_ms"), "{v}");
    }

    const HOUR: u64 = 3_600_000;
    let (status, v) = t.put(&format!("/debug/clock?offset_ms={HOUR}"), "").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (_, v) = t.get("/debug/clock").await;
    assert_eq!(v["offset_ms"], HOUR);
    assert!(v["now_ms"].as_u64().unwrap() >= wall_ms() + HOUR - 1_000, "{v}");

    // The entry is stamped an hour ahead, and the pump, on the same clock, still delivers
    // one second later in real time: neither early nor an hour late.
    let before = wall_ms();
    let (status, v) = t.put(&format!("{Q}?delay_ms=1000"), "skewed").await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let id = v["job_id"].as_str().unwrap().to_string();
    let (_, job) = t.get(&format!("/api/ns/q/job/{id}")).await;
    let due = job["due_at_ms"].as_u64().unwrap();
    assert!(due >= before + HOUR + 1_000 && due <= wall_ms() + HOUR + 1_000, "{job}");
    let got = t.reserve(&format!("{Q}?timeout=5")).await;
    assert_eq!(got["job_id"], id);
    let waited = wall_ms() - before;
    assert!((1_000..4_000).contains(&waited), "delivered after {waited} ms");

    // A job due in a minute, then the clock moved past it: the pump, asleep towards the
    // minute, is woken by the shift and delivers at once rather than a minute later.
    let (status, v) = t.put(&format!("{Q}?delay_ms=60000"), "jumped").await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let id = v["job_id"].as_str().unwrap().to_string();
    let (status, v) = t.put(&format!("/debug/clock?offset_ms={}", HOUR + 61_000), "").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let before = wall_ms();
    let got = t.reserve(&format!("{Q}?timeout=5")).await;
    assert_eq!(got["job_id"], id, "not delivered after the clock passed its due time");
    let waited = wall_ms() - before;
    assert!(waited < 4_000, "delivered after {waited} ms");

    let (status, v) = t.put("/debug/clock?offset_ms=0", "").await;
    assert_eq!((status, v["offset_ms"].as_i64()), (StatusCode::OK, Some(0)));
    t.stop().await;
}

/// A bulk whose jobs are each legal but do not fit one log entry together is refused whole
/// with 413, naming the limit; one that fits lands whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_larger_than_one_log_entry_is_refused_whole() {
    const ENTRY: usize = 64 * 1024;
    let config = Config { max_body_bytes: 2048, max_entry_bytes: ENTRY, ..Config::default() };
    let t = TestNode::start_with(config).await;
    let body = format!("\"{}\"", "x".repeat(2000));
    let too_many = format!("[{}]", vec![body.as_str(); 40].join(","));
    let (status, v) = t.call(Method::PUT, &format!("{Q}/bulk"), &[], too_many).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert!(v["error"].as_str().is_some_and(|e| e.contains("max_entry_bytes")), "{v}");
    assert_eq!(t.size(Q).await, 0, "nothing written");
    let fits = format!("[{}]", vec![body.as_str(); 20].join(","));
    let (status, v) = t.call(Method::PUT, &format!("{Q}/bulk"), &[], fits).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(t.size(Q).await, 20);
    t.stop().await;
}

/// A single node is ready once it leads; draining turns `/ready` into a 503 that says why,
/// answers a waiting long-poll at once with lmstfy's "no job available", and makes new ones
/// answer without waiting. Jobs already ready are still handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_until_draining_and_draining_answers_long_polls_at_once() {
    let t = TestNode::start().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while t.get("/ready").await.0 != StatusCode::OK {
        assert!(Instant::now() < deadline, "never ready: {:?}", t.get("/ready").await);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(t.get("/ready").await.1, json!({"ready": true}));
    // A single node leads, so it is also ready for a load balancer that wants the leader.
    assert_eq!(t.get("/ready?role=leader").await, (StatusCode::OK, json!({"ready": true})));
    let (status, v) = t.get("/ready?role=primary").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("role"), "{v}");

    let waiting = {
        let client = Client { router: t.node.router() };
        tokio::spawn(async move {
            let started = Instant::now();
            (client.get(&format!("{Q}?timeout=600")).await, started.elapsed())
        })
    };
    // Parked: the gauge counts it.
    t.await_parked(1).await;

    t.node.service().drain();
    let (answer, took) = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the long-poll was not answered")
        .unwrap();
    assert_eq!(answer, (StatusCode::NOT_FOUND, json!({"msg": "no job available"})));
    assert!(took < Duration::from_secs(5), "{took:?}");
    let (status, v) = t.get("/ready").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert!(v["error"].as_str().unwrap().contains("stopping"), "{v}");
    assert_eq!(t.get("/ready?role=leader").await.0, StatusCode::SERVICE_UNAVAILABLE);

    let started = Instant::now();
    t.reserve_none(&format!("{Q}?timeout=600")).await;
    assert!(started.elapsed() < Duration::from_secs(5), "a new long-poll waited");
    t.publish(Q, "still served").await;
    assert_eq!(t.reserve(&format!("{Q}?timeout=600")).await["data"], b64("still served"));
    t.stop().await;
}
