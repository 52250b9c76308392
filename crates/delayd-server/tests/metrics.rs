//! `GET /metrics` end to end: real nodes on RocksDB in temporary directories, driven through
//! the HTTP router in-process (and the gRPC client API on the node's port); every check reads
//! the exposition text the way Prometheus would.
//!
//! Nothing sleeps blindly: what happens in the background (a tick, a ttr or ttl running out,
//! a snapshot, replication) is awaited by polling the metrics under a deadline.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use delayd_proto::v1 as pb;
use delayd_proto::v1::delayd_client::DelaydClient;
use delayd_server::config::AuthConfig;
use delayd_server::{Config, Node};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

// ---- the exposition format, parsed ----

/// One sample: metric name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses the text exposition format (samples only; comments are skipped).
fn parse(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let name_end = line.find(['{', ' ']).unwrap();
        let name = line[..name_end].to_string();
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(mut body) = rest.strip_prefix('{') {
            // key="value" pairs; values may hold `{`, `}`, `,` and escaped quotes.
            loop {
                if let Some(after) = body.strip_prefix('}') {
                    rest = after;
                    break;
                }
                let body2 = body.trim_start_matches(',');
                let eq = body2.find("=\"").unwrap();
                let key = body2[..eq].to_string();
                let mut value = String::new();
                let mut chars = body2[eq + 2..].char_indices();
                let end = loop {
                    match chars.next().unwrap() {
                        (_, '\\') => value.push(chars.next().unwrap().1),
                        (i, '"') => break eq + 2 + i + 1,
                        (_, c) => value.push(c),
                    }
                };
                labels.insert(key, value);
                body = &body2[end..];
            }
        }
        let value = rest.trim().split(' ').next().unwrap();
        let value = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad sample value in {line:?}")),
        };
        samples.push((name, labels, value));
    }
    samples
}

/// One scrape's samples.
struct Scrape(Vec<Sample>);

impl Scrape {
    /// The value of the series with exactly these labels, if present.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> =
            labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.0.iter().find(|(n, l, _)| n == name && *l == want).map(|(_, _, v)| *v)
    }

    /// The value, 0 when the series is absent (a counter not yet incremented).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }

    /// Every series of a metric, by its labels.
    fn series(&self, name: &str) -> Vec<&BTreeMap<String, String>> {
        self.0.iter().filter(|(n, _, _)| n == name).map(|(_, l, _)| l).collect()
    }
}

// ---- harness ----

struct TestNode {
    node: Node,
    router: Router,
    _dir: tempfile::TempDir,
}

impl TestNode {
    async fn start(config: Config) -> TestNode {
        // Secured as in production: every call, the scrape included, shows the admin token.
        let auth = AuthConfig { admin_token: Some(ADMIN.into()), ..AuthConfig::default() };
        let (node, dir) = common::start_node(Config { auth, ..config }).await;
        let router = node.router();
        TestNode { node, router, _dir: dir }
    }

    async fn call(&self, method: Method, uri: &str, body: &str) -> (StatusCode, Value) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", format!("Bearer {ADMIN}"))
            .body(Body::from(body.to_string()));
        let resp = self.router.clone().oneshot(req.unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    async fn publish(&self, uri: &str) -> String {
        let (status, v) = self.call(Method::PUT, uri, "body").await;
        assert_eq!(status, StatusCode::CREATED, "{uri}: {v}");
        v["job_id"].as_str().unwrap().to_string()
    }

    async fn reserve(&self, uri: &str) -> String {
        let (status, v) = self.call(Method::GET, uri, "").await;
        assert_eq!(status, StatusCode::OK, "{uri}: {v}");
        v["job_id"].as_str().unwrap().to_string()
    }

    async fn ack(&self, queue: &str, id: &str) {
        let (status, _) = self.call(Method::DELETE, &format!("{queue}/job/{id}"), "").await;
        assert_eq!(status, StatusCode::NO_CONTENT);
    }

    async fn scrape(&self) -> Scrape {
        let req = Request::get("/metrics")
            .header("authorization", format!("Bearer {ADMIN}"))
            .body(Body::empty())
            .unwrap();
        let resp = self.router.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/plain; version=0.0.4");
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        Scrape(parse(std::str::from_utf8(&bytes).unwrap()))
    }

    /// Scrapes until `done` holds, for at most 10 s.
    async fn scrape_until(&self, what: &str, done: impl Fn(&Scrape) -> bool) -> Scrape {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = self.scrape().await;
            if done(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "never saw {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The admin token every call shows.
const ADMIN: &str = "metrics-test-admin-token-0000";
const Q: &str = "/api/ns/q";
const ROUTE: &str = "/api/{ns}/{q}";
const JOB_ROUTE: &str = "/api/{ns}/{q}/job/{id}";

fn queue(q: &str) -> [(&'static str, &str); 2] {
    [("namespace", "ns"), ("queue", q)]
}

fn state<'a>(q: &'a str, state: &'a str) -> [(&'static str, &'a str); 3] {
    [("namespace", "ns"), ("queue", q), ("state", state)]
}

fn within<'a>(q: &'a str, w: &'a str) -> [(&'static str, &'a str); 3] {
    [("namespace", "ns"), ("queue", q), ("within", w)]
}

#[tokio::test]
async fn metrics_follow_requests_jobs_raft_and_storage() {
    let n = TestNode::start(Config::default()).await;
    let before = n.scrape().await;
    let published = |s: &Scrape, q| s.value("delayd_jobs_published_total", &queue(q));

    // Traffic: a ready job reserved and acked, one due in 30 minutes, one due in 50 ms that
    // the timer pump makes ready (reserved with a long poll) and acked, a bad request and an
    // unknown route.
    let first = n.publish(Q).await;
    n.publish(&format!("{Q}?delay=1800")).await;
    n.publish(&format!("{Q}?delay_ms=50")).await;
    assert_eq!(n.reserve(&format!("{Q}?ttr=60")).await, first);
    n.ack(Q, &first).await;
    let timed = n.reserve(&format!("{Q}?timeout=5")).await;
    n.ack(Q, &timed).await;
    assert_eq!(n.call(Method::PUT, &format!("{Q}?delay=soon"), "x").await.0, 400);
    assert_eq!(n.call(Method::GET, "/no/such/route", "").await.0, 404);

    // A reservation whose 100 ms ttr runs out on its only try: dead letter. A job whose 1 s
    // ttl passes while it waits: expired.
    n.publish("/api/ns/dl").await;
    n.reserve("/api/ns/dl?ttr_ms=100").await;
    n.publish("/api/ns/exp?ttl=1").await;

    // The gRPC client API: one publish that works, one refused.
    let mut grpc =
        DelaydClient::connect(format!("http://{}", n.node.config().advertised())).await.unwrap();
    let publish = |queue: &str| {
        let mut req = tonic::Request::new(pb::PublishRequest {
            namespace: "ns".into(),
            queue: queue.into(),
            body: b"g".to_vec(),
            options: None,
            key: None,
        });
        req.metadata_mut().insert("x-token", ADMIN.parse().unwrap());
        req
    };
    grpc.publish(publish("g")).await.unwrap();
    assert_eq!(
        grpc.publish(publish("bad name!")).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );

    let after = n
        .scrape_until("the ttr and ttl run out", |s| {
            s.value("delayd_jobs_dead_lettered_total", &queue("dl")) >= 1.0
                && s.value("delayd_jobs_expired_total", &queue("exp")) >= 1.0
        })
        .await;
    let moved = |name: &str, labels: &[(&str, &str)]| {
        after.value(name, labels) - before.value(name, labels)
    };

    // Requests, by route template.
    let requests = "delayd_http_requests_total";
    let req = |route, method, status| [("route", route), ("method", method), ("status", status)];
    assert_eq!(moved(requests, &req(ROUTE, "PUT", "201")), 5.0);
    assert_eq!(moved(requests, &req(ROUTE, "PUT", "400")), 1.0);
    assert_eq!(moved(requests, &req(ROUTE, "GET", "200")), 3.0);
    assert_eq!(moved(requests, &req(JOB_ROUTE, "DELETE", "204")), 2.0);
    assert_eq!(moved(requests, &req("unmatched", "GET", "404")), 1.0);
    assert!(after.value(requests, &req("/metrics", "GET", "200")) >= 1.0);
    let duration = "delayd_http_request_duration_seconds_count";
    assert_eq!(moved(duration, &[("route", ROUTE), ("method", "PUT")]), 6.0);
    let grpc_req = |code| [("method", "Publish"), ("code", code)];
    assert_eq!(after.value("delayd_grpc_requests_total", &grpc_req("OK")), 1.0);
    assert_eq!(after.value("delayd_grpc_requests_total", &grpc_req("INVALID_ARGUMENT")), 1.0);
    let grpc_duration = "delayd_grpc_request_duration_seconds_count";
    assert_eq!(after.value(grpc_duration, &[("method", "Publish")]), 2.0);

    // Job events per queue, as applied.
    assert_eq!(published(&after, "q") - published(&before, "q"), 3.0);
    assert_eq!(after.value("delayd_jobs_reserved_total", &queue("q")), 2.0);
    assert_eq!(after.value("delayd_jobs_acked_total", &queue("q")), 2.0);
    assert_eq!(after.value("delayd_jobs_released_total", &queue("q")), 0.0);
    assert_eq!(after.value("delayd_jobs_reserved_total", &queue("dl")), 1.0);
    assert_eq!(after.value("delayd_jobs_timed_out_total", &queue("dl")), 1.0);
    assert_eq!(after.value("delayd_jobs_dead_lettered_total", &queue("dl")), 1.0);
    assert_eq!(after.value("delayd_jobs_expired_total", &queue("exp")), 1.0);
    assert_eq!(published(&after, "g"), 1.0);
    assert!(after.value("delayd_timer_lateness_seconds_count", &[]) >= 1.0);

    // Gauges from the local state: what is left in each queue and when it comes due.
    assert_eq!(after.get("delayd_jobs", &state("q", "delayed")), Some(1.0));
    assert_eq!(after.get("delayd_jobs", &state("q", "ready")), Some(0.0));
    assert_eq!(after.get("delayd_jobs", &state("q", "reserved")), Some(0.0));
    assert_eq!(after.get("delayd_jobs", &state("dl", "dead")), Some(1.0));
    assert_eq!(after.get("delayd_jobs", &state("g", "ready")), Some(1.0));
    let due = "delayd_jobs_due_within";
    assert_eq!(after.get(due, &within("q", "1m")), Some(0.0));
    assert_eq!(after.get(due, &within("q", "15m")), Some(0.0));
    assert_eq!(after.get(due, &within("q", "1h")), Some(1.0));
    assert_eq!(after.get(due, &within("q", "+Inf")), Some(1.0));
    assert_eq!(after.get(due, &within("g", "+Inf")), Some(0.0));

    // Raft: a single node leads in a term ≥ 1, and everything is committed and applied.
    assert!(after.value("delayd_raft_term", &[]) >= 1.0);
    assert_eq!(after.get("delayd_raft_leader_id", &[]), Some(1.0));
    assert_eq!(after.get("delayd_raft_state", &[("state", "leader")]), Some(1.0));
    assert_eq!(after.get("delayd_raft_state", &[("state", "follower")]), Some(0.0));
    assert!(after.value("delayd_raft_leader_changes_total", &[]) >= 1.0);
    let last_log = after.value("delayd_raft_last_log_index", &[]);
    assert!(last_log > 0.0);
    assert!(after.value("delayd_raft_commit_index", &[]) > 0.0);
    assert!(after.value("delayd_raft_applied_index", &[]) > 0.0);
    assert!(after.series("delayd_raft_replication_lag_entries").is_empty(), "no followers");

    // Storage: the log was fsynced; RocksDB reports its memtables.
    assert!(after.value("delayd_log_fsyncs_total", &[]) > 0.0);
    // Whole microseconds each: on a disk fsyncs that fast (tmpfs) it may read 0.
    assert!(after.get("delayd_log_fsync_seconds_total", &[]).is_some());
    assert!(after.value("delayd_log_size_bytes", &[]) > 0.0);
    assert!(after.value("delayd_log_append_seconds_count", &[]) > 0.0);
    assert!(after.value("delayd_rocksdb_size_bytes", &[("kind", "memtable")]) > 0.0);
    assert!(after.get("delayd_rocksdb_size_bytes", &[("kind", "sst")]).is_some());
    assert!(after.get("delayd_rocksdb_size_bytes", &[("kind", "wal")]).is_some());
    assert!(after.get("delayd_rocksdb_memory_bytes", &[("kind", "table_readers")]).is_some());
    assert!(after.get("delayd_rocksdb_memory_bytes", &[("kind", "block_cache")]).is_some());
    // Nothing held this node's writes back.
    assert_eq!(after.get("delayd_rocksdb_write_stopped", &[]), Some(0.0));
    for kind in ["stop", "delay"] {
        assert_eq!(after.get("delayd_rocksdb_write_stalls_total", &[("kind", kind)]), Some(0.0));
    }
    // RocksDB's background work is read: every kind and state has its series.
    for kind in ["flush", "compaction"] {
        for state in ["running", "pending"] {
            let labels = [("kind", kind), ("state", state)];
            assert!(after.get("delayd_rocksdb_background_jobs", &labels).is_some(), "{labels:?}");
        }
    }
    // The data directory's filesystem: some room left, less than all of it.
    let size = after.value("delayd_filesystem_size_bytes", &[]);
    let available = after.value("delayd_filesystem_available_bytes", &[]);
    assert!(size > 0.0 && available > 0.0 && available <= size, "{available} of {size}");

    // Which build: the library's version, and no revision (only the binary knows it).
    let build = [("version", env!("CARGO_PKG_VERSION")), ("git_sha", "unknown")];
    assert_eq!(after.get("delayd_build_info", &build), Some(1.0));
    assert_eq!(after.series("delayd_build_info").len(), 1);

    // A snapshot is timed and sized.
    n.node.cluster().snapshot().await.unwrap();
    let s = n
        .scrape_until("a snapshot", |s| s.value("delayd_snapshot_build_seconds_count", &[]) >= 1.0)
        .await;
    assert!(s.value("delayd_snapshot_bytes", &[]) > 0.0);

    n.node.shutdown().await;
}

#[tokio::test]
async fn the_leader_reports_lag_per_follower_and_every_replica_the_same_job_counts() {
    let configs = common::three_nodes(Config::default()).await;
    let nodes = futures::future::join_all(configs.into_iter().map(TestNode::start)).await;

    // Publish through node 1, whoever leads; every replica counts it once applied.
    nodes[0].scrape_until("a leader", |s| s.value("delayd_raft_leader_id", &[]) > 0.0).await;
    nodes[0].publish("/api/ns/c").await;
    for n in &nodes {
        n.scrape_until("the publish applied", |s| {
            s.value("delayd_jobs_published_total", &queue("c")) == 1.0
        })
        .await;
    }

    let leader = nodes[0].scrape().await.value("delayd_raft_leader_id", &[]) as u64;
    assert!((1..=3).contains(&leader));
    let on_leader = nodes[leader as usize - 1]
        .scrape_until("lag series for both followers", |s| {
            s.series("delayd_raft_replication_lag_entries").len() == 2
        })
        .await;
    let mut followers: Vec<String> = on_leader
        .series("delayd_raft_replication_lag_entries")
        .iter()
        .map(|l| l["follower"].clone())
        .collect();
    followers.sort();
    let expected: Vec<String> =
        (1..=3).filter(|id| *id != leader).map(|id| id.to_string()).collect();
    assert_eq!(followers, expected);
    let since_ack = on_leader.get("delayd_raft_seconds_since_quorum_ack", &[]);
    // In seconds: heartbeats keep it well under the 0.4 s lease, never thousands (ms).
    assert!(since_ack.is_some_and(|s| (0.0..5.0).contains(&s)), "{since_ack:?}");
    for (i, n) in nodes.iter().enumerate() {
        let s = n.scrape().await;
        assert_eq!(s.value("delayd_raft_leader_id", &[]), leader as f64);
        // Every replica counted the leader established, followers too (from their written
        // vote), and at most once per term.
        let changes = s.value("delayd_raft_leader_changes_total", &[]);
        let term = s.value("delayd_raft_term", &[]);
        assert!(
            changes >= 1.0 && changes <= term,
            "node {}: {changes} changes, term {term}",
            i + 1
        );
        if i as u64 + 1 != leader {
            assert!(s.series("delayd_raft_replication_lag_entries").is_empty());
            assert_eq!(s.get("delayd_raft_state", &[("state", "follower")]), Some(1.0));
        }
    }

    for n in &nodes {
        n.node.shutdown().await;
    }
}

/// Prometheus asks for gzip; the answer is then gzipped, and decompresses to the same text
/// format a plain scrape gets. A client that does not ask, or refuses gzip, gets plain text.
#[tokio::test]
async fn metrics_are_gzipped_for_clients_that_accept_gzip() {
    let n = TestNode::start(Config::default()).await;
    n.publish(Q).await;
    let get = |encoding: Option<&'static str>| {
        let mut req = Request::get("/metrics").header("authorization", format!("Bearer {ADMIN}"));
        if let Some(e) = encoding {
            req = req.header(header::ACCEPT_ENCODING, e);
        }
        n.router.clone().oneshot(req.body(Body::empty()).unwrap())
    };

    let resp = get(Some("gzip")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()[header::CONTENT_ENCODING], "gzip");
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/plain; version=0.0.4");
    assert_eq!(resp.headers()[header::VARY], "accept-encoding");
    let compressed = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&compressed[..2], &[0x1f, 0x8b], "a gzip member starts with its magic bytes");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&compressed[..]), &mut text)
        .unwrap();
    assert!(compressed.len() * 3 < text.len(), "{} of {} bytes", compressed.len(), text.len());
    let gzipped = Scrape(parse(&text));
    assert!(text.contains("# TYPE delayd_jobs_published_total counter"));
    assert_eq!(gzipped.get("delayd_jobs_published_total", &queue("q")), Some(1.0));

    // The same series as a plain scrape taken now (values such as durations move between
    // the two; the names and labels do not).
    let plain = n.scrape().await;
    let names = |s: &Scrape| {
        let mut v: Vec<_> = s.0.iter().map(|(n, l, _)| (n.clone(), l.clone())).collect();
        v.sort();
        v.dedup();
        v
    };
    let (a, b) = (names(&gzipped), names(&plain));
    let request_series =
        |(n, _): &&(String, BTreeMap<String, String>)| !n.starts_with("delayd_http");
    assert_eq!(
        a.iter().filter(request_series).collect::<Vec<_>>(),
        b.iter().filter(request_series).collect::<Vec<_>>(),
        "the scrapes differ beyond the requests they count"
    );

    for refused in [None, Some("gzip;q=0"), Some("br")] {
        let resp = get(refused).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.headers().get(header::CONTENT_ENCODING).is_none(), "{refused:?}");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(body.starts_with(b"# HELP "), "{refused:?}: plain text");
    }
    n.node.shutdown().await;
}
