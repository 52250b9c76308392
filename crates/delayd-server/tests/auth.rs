//! Authentication and authorization, end to end over a real single-node cluster: the matrix
//! of every route against every kind of credential, the token API's lifecycle, rate limits,
//! request ids, and the same rules on the gRPC client API.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use delayd_proto::v1 as pb;
use delayd_proto::v1::delayd_client::DelaydClient;
use delayd_server::config::AuthConfig;
use delayd_server::{Config, Node};
use http_body_util::BodyExt;
use serde_json::Value;
use tonic::Code;
use tower::ServiceExt;

const ADMIN: &str = "admin-token-for-tests-0123456789";
const JOB: &str = "01ARZ3NDEKTSV4RRFFQ69G5FAV";

struct TestNode {
    node: Node,
    router: Router,
    _dir: tempfile::TempDir,
}

/// How a request shows its credential.
#[derive(Clone, Copy)]
enum Via {
    Bearer,
    XToken,
    Query,
}

impl TestNode {
    async fn start(auth: AuthConfig) -> TestNode {
        let (node, dir) = common::start_node(Config { auth, ..Config::default() }).await;
        let router = node.router();
        TestNode { node, router, _dir: dir }
    }

    async fn secured() -> TestNode {
        TestNode::start(AuthConfig { admin_token: Some(ADMIN.into()), ..AuthConfig::default() })
            .await
    }

    /// One request; the answer's status, JSON body (or Null) and headers.
    async fn raw(
        &self,
        method: Method,
        uri: &str,
        token: Option<(&str, Via)>,
        body: &str,
    ) -> (StatusCode, Value, axum::http::HeaderMap) {
        let mut uri = uri.to_string();
        let mut req = Request::builder().method(method);
        match token {
            Some((t, Via::Bearer)) => req = req.header("authorization", format!("Bearer {t}")),
            Some((t, Via::XToken)) => req = req.header("x-token", t),
            Some((t, Via::Query)) => {
                uri.push(if uri.contains('?') { '&' } else { '?' });
                uri.push_str(&format!("token={t}"));
            }
            None => {}
        }
        let req = req.uri(&uri).body(Body::from(body.to_string())).unwrap();
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let (status, headers) = (resp.status(), resp.headers().clone());
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, v, headers)
    }

    async fn call(&self, method: Method, uri: &str, token: Option<&str>) -> (StatusCode, Value) {
        let (s, v, _) = self.raw(method, uri, token.map(|t| (t, Via::XToken)), "x").await;
        (s, v)
    }

    async fn create_token(&self, ns: &str, query: &str) -> String {
        let (s, v) = self.call(Method::POST, &format!("/token/{ns}?{query}"), Some(ADMIN)).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        let t = v["token"].as_str().unwrap().to_string();
        assert_eq!(t.len(), 32, "128 random bits in hex: {t}");
        t
    }
}

/// Who may call a route.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Needs {
    Nothing,
    Admin,
    /// A token of namespace ns1 (the paths below all use it).
    Ns1,
}

fn routes() -> Vec<(Method, String, Needs)> {
    let job = format!("/api/ns1/q/job/{JOB}");
    let mut r = vec![
        (Method::GET, "/health".to_string(), Needs::Nothing),
        (Method::GET, "/dashboard/".to_string(), Needs::Nothing),
        (Method::GET, "/dashboard/app.js".to_string(), Needs::Nothing),
        (Method::GET, "/no/such/route".to_string(), Needs::Nothing),
        (Method::GET, "/admin/cluster".to_string(), Needs::Admin),
        (Method::GET, "/admin/queues".to_string(), Needs::Admin),
        // Node id 0 is invalid: the admin's calls are refused (400) without touching the
        // membership, after authentication has passed.
        (Method::POST, "/admin/nodes?id=0&addr=127.0.0.1:1".to_string(), Needs::Admin),
        (Method::POST, "/admin/nodes/0/promote".to_string(), Needs::Admin),
        (Method::DELETE, "/admin/nodes/0".to_string(), Needs::Admin),
        // Unreadable arguments too: a token that may not call these gets 403, not a 400
        // that would tell it about arguments it may not send.
        (Method::POST, "/admin/nodes?addr=127.0.0.1:1".to_string(), Needs::Admin),
        (Method::POST, "/admin/nodes/abc/promote".to_string(), Needs::Admin),
        (Method::DELETE, "/admin/nodes/abc".to_string(), Needs::Admin),
        (Method::POST, "/admin/leader?to=abc".to_string(), Needs::Admin),
        (Method::GET, "/admin/queues?limit=abc".to_string(), Needs::Admin),
        (Method::GET, "/admin/snapshot?digest=maybe".to_string(), Needs::Admin),
        (Method::POST, "/token/ns1?read_limit=abc".to_string(), Needs::Admin),
        (Method::POST, "/admin/snapshot".to_string(), Needs::Admin),
        (Method::GET, "/admin/digest".to_string(), Needs::Admin),
        (Method::GET, "/metrics".to_string(), Needs::Admin),
        (Method::POST, "/token/ns1".to_string(), Needs::Admin),
        (Method::GET, "/token/ns1".to_string(), Needs::Admin),
        (Method::DELETE, "/token/ns1/nosuchtoken".to_string(), Needs::Admin),
        (Method::PUT, "/api/ns1/q".to_string(), Needs::Ns1),
        (Method::GET, "/api/ns1/q".to_string(), Needs::Ns1),
        (Method::GET, "/api/ns1/q,r?count=2".to_string(), Needs::Ns1),
        (Method::DELETE, "/api/ns1/q".to_string(), Needs::Ns1),
        (Method::PUT, "/api/ns1/q/bulk".to_string(), Needs::Ns1),
        (Method::GET, job.clone(), Needs::Ns1),
        (Method::PUT, job.clone(), Needs::Ns1),
        (Method::PATCH, job.clone(), Needs::Ns1),
        (Method::DELETE, job.clone(), Needs::Ns1),
        (Method::PUT, format!("{job}/release"), Needs::Ns1),
        (Method::PUT, format!("{job}/touch"), Needs::Ns1),
        (Method::PUT, format!("{job}/bury"), Needs::Ns1),
        (Method::GET, "/api/ns1/q/key/k".to_string(), Needs::Ns1),
        (Method::DELETE, "/api/ns1/q/key/k".to_string(), Needs::Ns1),
        (Method::GET, "/api/ns1/q/peek".to_string(), Needs::Ns1),
        (Method::GET, "/api/ns1/q/size".to_string(), Needs::Ns1),
        (Method::GET, "/api/ns1/q/stats".to_string(), Needs::Ns1),
        (Method::PUT, "/api/ns1/q/pause".to_string(), Needs::Ns1),
        (Method::DELETE, "/api/ns1/q/pause".to_string(), Needs::Ns1),
        (Method::GET, "/api/ns1/q/deadletter".to_string(), Needs::Ns1),
        (Method::PUT, "/api/ns1/q/deadletter".to_string(), Needs::Ns1),
        (Method::DELETE, "/api/ns1/q/deadletter".to_string(), Needs::Ns1),
        (Method::GET, "/api/ns1/q/deadletter/size".to_string(), Needs::Ns1),
        (Method::GET, "/api/ns1/q/deadletter/jobs".to_string(), Needs::Ns1),
        (Method::PUT, "/api/ns1/q/webhook".to_string(), Needs::Ns1),
        (Method::GET, "/api/ns1/q/webhook".to_string(), Needs::Ns1),
        (Method::DELETE, "/api/ns1/q/webhook".to_string(), Needs::Ns1),
        (Method::GET, "/api/ns1/q/schedules".to_string(), Needs::Ns1),
        (Method::PUT, "/api/ns1/q/schedules/s".to_string(), Needs::Ns1),
        (Method::GET, "/api/ns1/q/schedules/s".to_string(), Needs::Ns1),
        (Method::DELETE, "/api/ns1/q/schedules/s".to_string(), Needs::Ns1),
    ];
    // The same data-plane routes of another namespace, which an ns1 token must not open.
    let other: Vec<_> = r
        .iter()
        .filter(|(_, p, n)| *n == Needs::Ns1 && p.starts_with("/api/ns1/q/"))
        .map(|(m, p, _)| (m.clone(), p.replace("/api/ns1/", "/api/ns2/"), Needs::Admin))
        .collect();
    r.extend(other);
    r
}

fn denied(s: StatusCode) -> bool {
    s == StatusCode::UNAUTHORIZED || s == StatusCode::FORBIDDEN
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_each_credential_as_it_should() {
    let t = TestNode::secured().await;
    let ns1 = t.create_token("ns1", "description=matrix").await;
    // The ns2 copies of the data-plane routes need the admin token; an ns1 token is 403.
    for (method, path, needs) in routes() {
        let what = format!("{method} {path}");
        let ns2_copy = path.starts_with("/api/ns2/");

        let (s, v, h) = t.raw(method.clone(), &path, None, "x").await;
        if needs == Needs::Nothing {
            assert!(!denied(s), "{what} without a token: {s} {v}");
        } else {
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{what} without a token: {v}");
            assert!(v["error"].as_str().unwrap().contains("token is required"), "{what}: {v}");
            assert_eq!(h.get("www-authenticate").unwrap(), "Bearer", "{what}");
        }

        let (s, v) = t.call(method.clone(), &path, Some("not-a-token")).await;
        if needs != Needs::Nothing {
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{what} with an unknown token: {v}");
            assert_eq!(v["error"], "unknown token", "{what}");
        }

        let (s, v) = t.call(method.clone(), &path, Some(&ns1)).await;
        match needs {
            Needs::Ns1 | Needs::Nothing => assert!(!denied(s), "{what} with ns1's token: {s} {v}"),
            Needs::Admin => {
                assert_eq!(s, StatusCode::FORBIDDEN, "{what} with ns1's token: {v}");
                let msg = v["error"].as_str().unwrap();
                let expected = if ns2_copy {
                    "the token is for namespace \"ns1\", not \"ns2\""
                } else {
                    "admin"
                };
                assert!(msg.contains(expected), "{what}: {msg}");
            }
        }

        for via in [Via::Bearer, Via::XToken, Via::Query] {
            let (s, v, _) = t.raw(method.clone(), &path, Some((ADMIN, via)), "x").await;
            assert!(!denied(s), "{what} with the admin token: {s} {v}");
        }
    }
    t.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_created_listed_used_and_deleted() {
    let t = TestNode::secured().await;
    let tok = t.create_token("ns1", "description=producers&read_limit=100&write_limit=50").await;
    let other = t.create_token("ns1", "").await;
    t.create_token("ns2", "description=elsewhere").await;

    let (s, v) = t.call(Method::GET, "/token/ns1", Some(ADMIN)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["namespace"], "ns1");
    assert_eq!(v["tokens"].as_object().unwrap().len(), 2, "only ns1's: {v}");
    assert_eq!(v["tokens"][&tok], "producers");
    assert_eq!(v["tokens"][&other], "");
    let detail = v["details"].as_array().unwrap().iter().find(|d| d["token"] == tok).unwrap();
    assert_eq!(
        (detail["read_limit"].as_u64(), detail["write_limit"].as_u64()),
        (Some(100), Some(50))
    );
    assert!(detail["created_ms"].as_u64().unwrap() > 1_600_000_000_000);

    let (s, v) = t.call(Method::PUT, "/api/ns1/q", Some(&tok)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = t.call(Method::GET, "/api/ns1/q", Some(&other)).await;
    assert_eq!(
        s,
        StatusCode::OK,
        "a token reserves what another token of its namespace published: {v}"
    );

    // Deleting through another namespace finds nothing; through its own it works once.
    let (s, _) = t.call(Method::DELETE, &format!("/token/ns2/{tok}"), Some(ADMIN)).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = t.call(Method::DELETE, &format!("/token/ns1/{tok}"), Some(ADMIN)).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, v) = t.call(Method::DELETE, &format!("/token/ns1/{tok}"), Some(ADMIN)).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    let (s, v) = t.call(Method::PUT, "/api/ns1/q", Some(&tok)).await;
    assert_eq!((s, v["error"].as_str()), (StatusCode::UNAUTHORIZED, Some("unknown token")));
    let (s, _) = t.call(Method::PUT, "/api/ns1/q", Some(&other)).await;
    assert_eq!(s, StatusCode::CREATED, "the other token still works");

    for (uri, needle) in [
        ("/token/bad%20ns", "invalid namespace"),
        ("/token/ns1?read_limit=lots", "invalid read_limit"),
        ("/token/ns1?write_limit=-1", "invalid write_limit"),
        ("/token/ns1?write_limit=1000001", "invalid write_limit"),
    ] {
        let (s, v) = t.call(Method::POST, uri, Some(ADMIN)).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{uri}: {v}");
        assert!(v["error"].as_str().unwrap().contains(needle), "{uri}: {v}");
    }
    t.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_apply_per_token_and_kind() {
    let t = TestNode::secured().await;
    // One request per second of each kind. However slow this machine is, no more get through
    // than the budget allows: one to start with, one more per second since.
    let limited = t.create_token("ns1", "read_limit=1&write_limit=1").await;
    let free = t.create_token("ns1", "").await;
    let started = std::time::Instant::now();
    // Each answer with its Retry-After, if any.
    let call = |method: Method, uri: &'static str| {
        let (t, limited) = (&t, &limited);
        async move {
            let (s, v, headers) = t.raw(method, uri, Some((limited, Via::XToken)), "x").await;
            let retry = headers.get("retry-after").map(|h| h.to_str().unwrap().to_string());
            ((s, v), retry)
        }
    };
    let (mut writes, mut reads, mut retries) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        let (answer, retry) = call(Method::PUT, "/api/ns1/q").await;
        retries.push((answer.0, retry));
        writes.push(answer);
    }
    for _ in 0..5 {
        let (answer, retry) = call(Method::GET, "/api/ns1/q/size").await;
        retries.push((answer.0, retry));
        reads.push(answer);
    }
    let budget = 1 + started.elapsed().as_secs() as usize;
    let kinds = [(&writes, StatusCode::CREATED, "write"), (&reads, StatusCode::OK, "read")];
    for (calls, ok, kind) in kinds {
        assert_eq!(calls[0].0, ok, "the first {kind} is within the budget: {:?}", calls[0]);
        let passed = calls.iter().filter(|(s, _)| *s == ok).count();
        assert!(passed <= budget, "{passed} {kind}s passed a budget of {budget}: {calls:?}");
        let refused: Vec<_> = calls.iter().filter(|(s, _)| *s != ok).collect();
        assert!(!refused.is_empty(), "no {kind} was refused: {calls:?}");
        for (s, v) in refused {
            assert_eq!(*s, StatusCode::TOO_MANY_REQUESTS, "{v}");
            assert!(v["error"].as_str().unwrap().contains(&format!("{kind} rate limit")), "{v}");
        }
    }
    // Every refusal says when to come back: a budget of one per second refills within 1 s.
    for (status, retry) in &retries {
        let expected = (*status == StatusCode::TOO_MANY_REQUESTS).then_some("1");
        assert_eq!(retry.as_deref(), expected, "{status}");
    }
    // A reserve counts as a write (it takes a job): with the write budget spent, refused.
    let mut reserve_refused = 0.0;
    if started.elapsed().as_secs() == 0 {
        let (s, _) = t.call(Method::GET, "/api/ns1/q", Some(&limited)).await;
        assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
        reserve_refused = 1.0;
    }
    // Every refusal is counted, by namespace and kind, for the rate-limit alert.
    let refused = |calls: &[(StatusCode, Value)]| {
        calls.iter().filter(|(s, _)| *s == StatusCode::TOO_MANY_REQUESTS).count() as f64
    };
    let limited_total = |access| {
        let labels = [("namespace", "ns1"), ("access", access)];
        let t = &t;
        async move { labelled(t, "delayd_rate_limited_total", &labels).await }
    };
    assert_eq!(limited_total("write").await, refused(&writes) + reserve_refused);
    assert_eq!(limited_total("read").await, refused(&reads));
    // Other tokens and the admin are not limited by it.
    for _ in 0..5 {
        assert_eq!(t.call(Method::PUT, "/api/ns1/q", Some(&free)).await.0, StatusCode::CREATED);
        assert_eq!(t.call(Method::PUT, "/api/ns1/q", Some(ADMIN)).await.0, StatusCode::CREATED);
    }
    t.node.shutdown().await;
}

/// Rotating the admin token: a node may accept the old token beside the new one, and each
/// opens everything; a token in neither place opens nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_admin_tokens_are_accepted_beside_the_admin_token() {
    const OLD: &str = "the-old-admin-token-0123456789";
    let t = TestNode::start(AuthConfig {
        admin_token: Some(ADMIN.into()),
        previous_admin_tokens: vec![OLD.into()],
        ..AuthConfig::default()
    })
    .await;
    for token in [ADMIN, OLD] {
        assert_eq!(t.call(Method::GET, "/admin/cluster", Some(token)).await.0, StatusCode::OK);
        assert_eq!(t.call(Method::PUT, "/api/ns/q", Some(token)).await.0, StatusCode::CREATED);
    }
    let (s, v) = t.call(Method::GET, "/admin/cluster", Some("not-an-admin-token-0123")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    t.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_be_made_public_and_dev_mode_opens_everything() {
    let t = TestNode::start(AuthConfig {
        admin_token: Some(ADMIN.into()),
        public_metrics: true,
        ..AuthConfig::default()
    })
    .await;
    assert!(!denied(t.call(Method::GET, "/metrics", None).await.0));
    assert_eq!(t.call(Method::GET, "/admin/cluster", None).await.0, StatusCode::UNAUTHORIZED);
    t.node.shutdown().await;

    let t = TestNode::start(AuthConfig::dev()).await;
    for (method, path, _) in routes() {
        let (s, v) = t.call(method.clone(), &path, None).await;
        assert!(!denied(s), "{method} {path} in dev mode: {s} {v}");
    }
    t.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_carries_a_request_id() {
    let t = TestNode::secured().await;
    let (_, _, h) = t.raw(Method::GET, "/health", None, "").await;
    let id = h.get("x-request-id").unwrap().to_str().unwrap().to_string();
    assert_eq!(id.len(), 26, "a fresh ULID: {id}");
    let (_, _, h2) = t.raw(Method::GET, "/health", None, "").await;
    assert_ne!(h2.get("x-request-id").unwrap(), id.as_str(), "one per request");
    // Refused requests have one too, and a client's own id is kept when it is sensible.
    let req =
        Request::get("/admin/cluster").header("x-request-id", "client-42").body(Body::empty());
    let resp = t.router.clone().oneshot(req.unwrap()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(resp.headers().get("x-request-id").unwrap(), "client-42");
    let req = Request::get("/health").header("x-request-id", "bad id!").body(Body::empty());
    let resp = t.router.clone().oneshot(req.unwrap()).await.unwrap();
    assert_ne!(resp.headers().get("x-request-id").unwrap(), "bad id!");
    t.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_api_applies_the_same_rules() {
    let t = TestNode::secured().await;
    let ns1 = t.create_token("ns1", "").await;
    let addr = t.node.config().advertised();
    let client = DelaydClient::connect(format!("http://{addr}")).await.unwrap();
    let publish = |ns: &str, token: Option<(&'static str, String)>| {
        let mut req = tonic::Request::new(pb::PublishRequest {
            namespace: ns.into(),
            queue: "q".into(),
            body: b"x".to_vec(),
            ..Default::default()
        });
        if let Some((key, value)) = token {
            req.metadata_mut().insert(key, value.parse().unwrap());
        }
        let mut c = client.clone();
        async move { c.publish(req).await }
    };
    let code = |r: Result<_, tonic::Status>| r.err().map(|s| s.code());
    assert_eq!(code(publish("ns1", None).await), Some(Code::Unauthenticated));
    let x = |t: &str| Some(("x-token", t.to_string()));
    let bearer = |t: &str| Some(("authorization", format!("Bearer {t}")));
    assert_eq!(code(publish("ns1", x("nope")).await), Some(Code::Unauthenticated));
    assert_eq!(code(publish("ns2", x(&ns1)).await), Some(Code::PermissionDenied));
    assert_eq!(code(publish("ns1", x(&ns1)).await), None);
    assert_eq!(code(publish("ns1", bearer(&ns1)).await), None);
    assert_eq!(code(publish("ns2", bearer(ADMIN)).await), None);

    // Batched items are checked one by one.
    let mut req = tonic::Request::new(pb::AckBatchRequest {
        items: vec![
            pb::JobRef {
                namespace: "ns1".into(),
                queue: "q".into(),
                job_id: JOB.into(),
                lease: None,
            },
            pb::JobRef {
                namespace: "ns2".into(),
                queue: "q".into(),
                job_id: JOB.into(),
                lease: None,
            },
        ],
    });
    req.metadata_mut().insert("x-token", ns1.parse().unwrap());
    let results = client.clone().ack_batch(req).await.unwrap().into_inner().results;
    assert!(results[0].error.is_none(), "{results:?}");
    assert_eq!(results[1].error.as_ref().map(|e| e.code), Some(Code::PermissionDenied as i32));
    t.node.shutdown().await;
}

/// The port also carries Raft and forwarding: without the cluster credential (the shared
/// admin token) a client could forward any command past authentication, e.g. mint a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_internal_services_need_the_cluster_credential() {
    use delayd_proto::raft::internal_client::InternalClient;
    use delayd_proto::raft::raft_client::RaftClient;
    use delayd_proto::raft::RaftRequest;
    use delayd_raft::server::CLUSTER_HEADER;

    let t = TestNode::secured().await;
    let url = format!("http://{}", t.node.config().advertised());
    let request = |credential: Option<&str>| {
        let mut r = tonic::Request::new(RaftRequest { payload: b"not a command".to_vec() });
        if let Some(c) = credential {
            r.metadata_mut().insert(CLUSTER_HEADER, c.parse().unwrap());
        }
        r
    };
    let mut internal = InternalClient::connect(url.clone()).await.unwrap();
    let mut raft = RaftClient::connect(url).await.unwrap();
    for shown in [None, Some("wrong-credential"), Some("admin-token-for-tests-012345678")] {
        let code = internal.forward(request(shown)).await.unwrap_err().code();
        assert_eq!(code, Code::Unauthenticated, "forward with {shown:?}");
        let code = raft.vote(request(shown)).await.unwrap_err().code();
        assert_eq!(code, Code::Unauthenticated, "vote with {shown:?}");
    }
    // With it, the call reaches the service (which refuses the garbage payload itself).
    let code = internal.forward(request(Some(ADMIN))).await.unwrap_err().code();
    assert_ne!(code, Code::Unauthenticated);
    let code = raft.vote(request(Some(ADMIN))).await.unwrap_err().code();
    assert_eq!(code, Code::InvalidArgument, "undecodable vote");
    t.node.shutdown().await;

    // With authentication off they are open, as they must be for --dev clusters.
    let t = TestNode::start(AuthConfig::dev()).await;
    let url = format!("http://{}", t.node.config().advertised());
    let mut raft = RaftClient::connect(url).await.unwrap();
    assert_eq!(raft.vote(request(None)).await.unwrap_err().code(), Code::InvalidArgument);
    t.node.shutdown().await;
}

/// A stream outlives the request that opened it: once its token is deleted, a reserve stream
/// ends (after at most the reserve already under way) and a publish stream's later batches
/// are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_stop_serving_a_deleted_token() {
    use pb::reserve_stream_request::Msg;
    let t = TestNode::secured().await;
    let tok = t.create_token("ns1", "").await;
    let addr = t.node.config().advertised();
    let mut client = DelaydClient::connect(format!("http://{addr}")).await.unwrap();

    let (tx, rx) = tokio::sync::mpsc::channel::<pb::ReserveStreamRequest>(8);
    let subscribe =
        pb::Subscribe { namespace: "ns1".into(), queues: vec!["s".into()], ttr_ms: None };
    tx.send(pb::ReserveStreamRequest { msg: Some(Msg::Subscribe(subscribe)) }).await.unwrap();
    tx.send(pb::ReserveStreamRequest { msg: Some(Msg::Credit(pb::Credit { n: 100 })) })
        .await
        .unwrap();
    let outbound =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut req = tonic::Request::new(outbound);
    req.metadata_mut().insert("x-token", tok.parse().unwrap());
    let mut inbound = client.reserve_stream(req).await.unwrap().into_inner();

    let (s, _) = t.call(Method::PUT, "/api/ns1/s", Some(&tok)).await;
    assert_eq!(s, StatusCode::CREATED);
    let first = inbound.message().await.unwrap().unwrap();
    assert!(matches!(first.msg, Some(pb::reserve_stream_reply::Msg::Delivery(_))), "{first:?}");

    let (s, _) = t.call(Method::DELETE, &format!("/token/ns1/{tok}"), Some(ADMIN)).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    // Wakes the reserve under way, which may still hand this job over; the next one is
    // refused, and the stream ends with the reason.
    let (s, _) = t.call(Method::PUT, "/api/ns1/s", Some(ADMIN)).await;
    assert_eq!(s, StatusCode::CREATED);
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            match inbound.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(status) => return Some(status.code()),
            }
        }
    })
    .await
    .expect("the stream ended");
    assert_eq!(ended, Some(Code::Unauthenticated));
    drop(tx);
    t.node.shutdown().await;
}

/// The value of an unlabelled counter in the node's `/metrics`.
async fn counter(t: &TestNode, name: &str) -> f64 {
    let req = Request::get("/metrics").header("x-token", ADMIN).body(Body::empty()).unwrap();
    let resp = t.router.clone().oneshot(req).await.unwrap();
    let text =
        String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).expect(name);
    line[name.len() + 1..].trim().parse().unwrap()
}

/// The value of the series of `name` whose labels include `labels`, 0 when there is none.
async fn labelled(t: &TestNode, name: &str, labels: &[(&str, &str)]) -> f64 {
    let req = Request::get("/metrics").header("x-token", ADMIN).body(Body::empty()).unwrap();
    let resp = t.router.clone().oneshot(req).await.unwrap();
    let text =
        String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    let wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    let line = text.lines().find(|l| {
        l.starts_with(&format!("{name}{{")) && wanted.iter().all(|w| l.contains(w.as_str()))
    });
    line.map_or(0.0, |l| l.rsplit(' ').next().unwrap().parse().unwrap())
}

/// A follower checks a token it does not know with the leader before refusing it (it may have
/// just been created there), but concurrent checks share that round trip: a flood of bad
/// tokens costs the leader a few read barriers, not one each. A token created through one
/// node still works at once on every other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_coalesces_its_checks_of_unknown_tokens() {
    let auth = AuthConfig { admin_token: Some(ADMIN.into()), ..AuthConfig::default() };
    let configs = common::three_nodes(Config { auth, ..Config::default() }).await;
    let nodes = futures::future::join_all(configs.into_iter().map(|config| async move {
        let (node, dir) = common::start_node(config).await;
        TestNode { router: node.router(), node, _dir: dir }
    }))
    .await;
    let leader = common::agreed_leader(&nodes.iter().map(|n| &n.node).collect::<Vec<_>>()).await;
    let followers: Vec<&TestNode> =
        nodes.iter().filter(|n| n.node.config().node_id != leader).collect();

    // Created through one follower, used at once on the other.
    let token = followers[0].create_token("ns1", "").await;
    let (s, v) = followers[1].call(Method::GET, "/api/ns1/q/size", Some(&token)).await;
    assert_eq!(s, StatusCode::OK, "{v}");

    // Many distinct token-shaped strings at once: every one refused, few round trips.
    const N: usize = 200;
    let f = followers[1];
    let before = counter(f, "delayd_token_catch_ups_total").await;
    let answers = futures::future::join_all((0..N).map(|i| async move {
        let bogus = format!("{i:032x}");
        f.call(Method::GET, "/api/ns1/q/size", Some(&bogus)).await.0
    }))
    .await;
    assert!(answers.iter().all(|s| *s == StatusCode::UNAUTHORIZED), "{answers:?}");
    let catch_ups = counter(f, "delayd_token_catch_ups_total").await - before;
    assert!((1.0..=(N / 10) as f64).contains(&catch_ups), "{catch_ups} catch-ups for {N} checks");

    // A token created after that flood is still seen at once.
    let token = followers[0].create_token("ns1", "").await;
    let (s, v) = followers[1].call(Method::GET, "/api/ns1/q/size", Some(&token)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    for n in nodes {
        n.node.shutdown().await;
    }
}
