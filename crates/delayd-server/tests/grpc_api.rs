//! The gRPC client API (`delayd.v1.Delayd`) end to end: a real single-node cluster on RocksDB
//! in a temporary directory, called on the node's own gRPC port with the generated client.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use delayd_proto::v1 as pb;
use delayd_proto::v1::delayd_client::DelaydClient;
use delayd_server::grpc::{self as api, LEADER_HEADER, NODE_HEADER, WRITTEN_HEADER};
use delayd_server::{Config, Node, ServiceError};
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::{Code, Status};

const NS: &str = "ns";
const Q: &str = "q";
const UNKNOWN_ID: &str = "01ARZ3NDEKTSV4RRFFQ69G5FAV";

struct TestNode {
    node: Node,
    client: DelaydClient<Channel>,
    _dir: tempfile::TempDir,
}

impl TestNode {
    async fn start() -> TestNode {
        TestNode::start_with(Config::default()).await
    }

    async fn start_with(config: Config) -> TestNode {
        let (node, dir) = common::start_node(config).await;
        // Port 0: the node binds a free port and advertises it.
        let addr = node.config().advertised();
        let client = DelaydClient::connect(format!("http://{addr}")).await.unwrap();
        TestNode { node, client, _dir: dir }
    }

    fn c(&self) -> DelaydClient<Channel> {
        self.client.clone()
    }

    async fn publish(&self, body: &str, options: pb::JobOptions) -> String {
        let r = self
            .c()
            .publish(pb::PublishRequest {
                namespace: NS.into(),
                queue: Q.into(),
                body: body.into(),
                options: Some(options),
                key: None,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(!r.existed);
        r.job_id
    }

    async fn reserve(&self, count: u32, wait_ms: u64) -> Vec<pb::Delivery> {
        self.c()
            .reserve(pb::ReserveRequest {
                namespace: NS.into(),
                queues: vec![Q.into()],
                count: Some(count),
                ttr_ms: None,
                wait_ms,
            })
            .await
            .unwrap()
            .into_inner()
            .deliveries
    }

    async fn stats(&self) -> pb::StatsReply {
        let req = pb::StatsRequest { namespace: NS.into(), queue: Q.into(), stale: false };
        self.c().stats(req).await.unwrap().into_inner()
    }

    async fn stop(self) {
        self.node.shutdown().await;
    }
}

fn job_ref(d: &pb::Delivery, lease: Option<u64>) -> pb::JobRef {
    let job = d.job.as_ref().unwrap();
    pb::JobRef { namespace: NS.into(), queue: Q.into(), job_id: job.job_id.clone(), lease }
}

fn publish_req(queue: &str, body: Vec<u8>, options: pb::JobOptions) -> pb::PublishRequest {
    pb::PublishRequest {
        namespace: NS.into(),
        queue: queue.into(),
        body,
        options: Some(options),
        key: None,
    }
}

#[track_caller]
fn assert_status<T: std::fmt::Debug>(r: Result<T, Status>, code: Code, message: &str) -> Status {
    let s = r.expect_err("expected an error");
    assert_eq!(s.code(), code, "{s:?}");
    assert!(s.message().contains(message), "{:?} does not contain {message:?}", s.message());
    s
}

#[test]
fn service_errors_map_to_statuses_in_one_place() {
    let cases = [
        (ServiceError::BadRequest("x".into()), Code::InvalidArgument),
        (ServiceError::TooLarge("x".into()), Code::InvalidArgument),
        (ServiceError::NotFound("x".into()), Code::NotFound),
        (ServiceError::Conflict("x".into()), Code::FailedPrecondition),
        (ServiceError::Unavailable("x".into()), Code::Unavailable),
        (ServiceError::NotLeader(Some(3)), Code::Unavailable),
        (ServiceError::NotLeader(None), Code::Unavailable),
        (ServiceError::Internal("x".into()), Code::Internal),
    ];
    for (e, code) in cases {
        let s = api::status(&e);
        assert_eq!(s.code(), code, "{e:?}");
        assert_eq!(s.message(), e.to_string());
        let written = s.metadata().get(WRITTEN_HEADER).map(|v| v.to_str().unwrap().to_string());
        match e {
            ServiceError::NotLeader(leader) => {
                assert_eq!(written.as_deref(), Some("no"));
                let l = s.metadata().get(LEADER_HEADER).map(|v| v.to_str().unwrap().to_string());
                assert_eq!(l, leader.map(|l| l.to_string()));
            }
            // An unavailable write may have been applied: never marked as unwritten.
            _ => assert_eq!(written, None, "{e:?}"),
        }
    }
}

#[tokio::test]
async fn publish_peek_and_stats() {
    let t = TestNode::start().await;
    let options = pb::JobOptions {
        priority: Some(7),
        tries: Some(3),
        ttl_ms: Some(100_000),
        attributes: HashMap::from([("foo".to_string(), "bar".to_string())]),
        ..Default::default()
    };
    let resp = t.c().publish(publish_req(Q, b"hello".to_vec(), options)).await.unwrap();
    let meta = resp.metadata();
    assert_eq!(meta.get(NODE_HEADER).unwrap(), "1");
    assert_eq!(meta.get(LEADER_HEADER).unwrap(), "1");
    assert!(meta.get(api::LEADER_ADDR_HEADER).is_some());
    let id = resp.into_inner().job_id;
    assert_eq!(id.len(), 26);

    let peek = |job_id: &str| pb::PeekRequest {
        namespace: NS.into(),
        queue: Q.into(),
        job_id: job_id.into(),
        stale: false,
    };
    let job = t.c().peek(peek(&id)).await.unwrap().into_inner();
    assert_eq!(job.body, b"hello");
    assert_eq!((job.priority, job.tries, job.remain_tries), (7, 3, 3));
    assert_eq!(job.state, "ready");
    assert_eq!(job.attributes.get("foo").map(String::as_str), Some("bar"));
    assert!(job.expires_ms.is_some());
    let next = t.c().peek(peek("")).await.unwrap().into_inner();
    assert_eq!(next.job_id, id);

    // A key: the second publish returns the first job.
    let keyed = pb::PublishRequest {
        key: Some("k1".into()),
        ..publish_req(Q, b"a".to_vec(), pb::JobOptions::default())
    };
    let first = t.c().publish(keyed.clone()).await.unwrap().into_inner();
    let again = t.c().publish(keyed).await.unwrap().into_inner();
    assert!(!first.existed && again.existed);
    assert_eq!(first.job_id, again.job_id);

    // Delayed by at_ms and by delay_ms.
    let later =
        pb::JobOptions { due: Some(pb::job_options::Due::DelayMs(60_000)), ..Default::default() };
    t.publish("later", later).await;
    let s = t.stats().await;
    assert_eq!((s.ready, s.delayed, s.reserved, s.dead, s.paused), (2, 1, 0, 0, false));
    assert_eq!(s.due_histogram.len(), 5);
    assert_eq!(s.due_histogram[0].le_ms, Some(60_000));
    assert_eq!(s.due_histogram.iter().map(|b| b.count).max(), Some(1));
    assert!(s.head_age_ms.is_some());
    t.stop().await;
}

#[tokio::test]
async fn bad_input_is_refused_with_the_http_messages() {
    let t = TestNode::start_with(Config { max_body_bytes: 16, ..Config::default() }).await;
    let none = pb::JobOptions::default;
    let r = t.c().publish(publish_req("_q", vec![], none())).await;
    assert_status(r, Code::InvalidArgument, "queue names starting with '_' are reserved");
    let r = t.c().publish(publish_req("a b", vec![], none())).await;
    assert_status(r, Code::InvalidArgument, "invalid queue name");
    let r = t.c().publish(publish_req(Q, vec![0; 17], none())).await;
    assert_status(r, Code::InvalidArgument, "body is larger than the limit of 16 bytes");
    let r =
        t.c().publish(publish_req(Q, vec![], pb::JobOptions { tries: Some(0), ..none() })).await;
    assert_status(r, Code::InvalidArgument, "tries must be at least 1");
    let r = t
        .c()
        .publish(publish_req(Q, vec![], pb::JobOptions { tries: Some(70_000), ..none() }))
        .await;
    assert_status(r, Code::InvalidArgument, "invalid tries 70000");
    let short_ttl = pb::JobOptions {
        ttl_ms: Some(1_000),
        due: Some(pb::job_options::Due::DelayMs(2_000)),
        ..none()
    };
    let r = t.c().publish(publish_req(Q, vec![], short_ttl)).await;
    assert_status(r, Code::InvalidArgument, "ttl must be longer than delay");
    let r =
        t.c().publish(publish_req(Q, vec![], pb::JobOptions { ttr_ms: Some(0), ..none() })).await;
    assert_status(r, Code::InvalidArgument, "ttr must be positive");
    let attrs = (0..17).map(|i| (format!("a{i}"), "v".to_string())).collect();
    let r =
        t.c().publish(publish_req(Q, vec![], pb::JobOptions { attributes: attrs, ..none() })).await;
    assert_status(r, Code::InvalidArgument, "at most 16 attributes");

    let reserve = |count, wait_ms, queues: Vec<String>| pb::ReserveRequest {
        namespace: NS.into(),
        queues,
        count,
        ttr_ms: None,
        wait_ms,
    };
    let r = t.c().reserve(reserve(Some(0), 0, vec![Q.into()])).await;
    assert_status(r, Code::InvalidArgument, "count must be 1 to 100");
    let r = t.c().reserve(reserve(Some(101), 0, vec![Q.into()])).await;
    assert_status(r, Code::InvalidArgument, "count must be 1 to 100");
    let r = t.c().reserve(reserve(None, 600_001, vec![Q.into()])).await;
    assert_status(r, Code::InvalidArgument, "timeout must be at most 600 s");
    let r = t.c().reserve(reserve(None, 0, vec![])).await;
    assert_status(r, Code::InvalidArgument, "no queue named");

    let bad_id =
        pb::JobRef { namespace: NS.into(), queue: Q.into(), job_id: "nope".into(), lease: None };
    assert_status(t.c().ack(bad_id.clone()).await, Code::InvalidArgument, "invalid job id");
    let peek = |job_id: &str| pb::PeekRequest {
        namespace: NS.into(),
        queue: Q.into(),
        job_id: job_id.into(),
        stale: false,
    };
    assert_status(t.c().peek(peek(UNKNOWN_ID)).await, Code::NotFound, "job not found");
    assert_status(t.c().peek(peek("")).await, Code::NotFound, "the queue is empty");
    let unknown = pb::JobRef { job_id: UNKNOWN_ID.into(), ..bad_id };
    let r = t.c().bury(unknown.clone()).await;
    let s = assert_status(r, Code::NotFound, "");
    assert_eq!(s.metadata().get(NODE_HEADER).unwrap(), "1", "errors carry the leader metadata");
    // An unknown id acks as lmstfy's DELETE does: nothing removed, no error.
    assert!(!t.c().ack(unknown).await.unwrap().into_inner().removed);
    let empty = pb::AckBatchRequest { items: vec![] };
    assert_status(
        t.c().ack_batch(empty).await,
        Code::InvalidArgument,
        "a batch carries 1 to 1000 items",
    );
    let r = t.c().release(pb::ReleaseRequest::default()).await;
    assert_status(r, Code::InvalidArgument, "job is required");
    t.stop().await;
}

#[tokio::test]
async fn reserve_touch_release_ack_bury_with_leases() {
    let t = TestNode::start().await;
    assert!(t.reserve(1, 0).await.is_empty(), "nothing to reserve yet");
    let a = t.publish("a", pb::JobOptions { tries: Some(5), ..Default::default() }).await;
    let got = t.reserve(1, 0).await;
    assert_eq!(got.len(), 1);
    let d = &got[0];
    let job = d.job.as_ref().unwrap();
    assert_eq!(
        (job.job_id.as_str(), job.state.as_str(), job.attempt, job.remain_tries),
        (a.as_str(), "reserved", 1, 4)
    );
    assert!(job.lease_deadline_ms.is_some());

    let stale = job_ref(d, Some(d.lease.wrapping_add(1)));
    let touch = |job, ttr_ms| pb::TouchRequest { job: Some(job), ttr_ms };
    assert_status(t.c().touch(touch(stale.clone(), None)).await, Code::FailedPrecondition, "lease");
    let touched =
        t.c().touch(touch(job_ref(d, Some(d.lease)), Some(60_000))).await.unwrap().into_inner();
    assert_eq!(touched.state, "reserved");
    assert_status(
        t.c().touch(touch(job_ref(d, Some(d.lease)), Some(0))).await,
        Code::InvalidArgument,
        "ttr must be positive",
    );

    let release =
        pb::ReleaseRequest { job: Some(job_ref(d, Some(d.lease))), delay_ms: 0, priority: Some(3) };
    let released = t.c().release(release.clone()).await.unwrap().into_inner();
    assert_eq!((released.state.as_str(), released.priority), ("ready", 3));
    assert_status(t.c().release(release).await, Code::FailedPrecondition, "");

    let d = t.reserve(1, 0).await.pop().unwrap();
    assert_eq!(d.job.as_ref().unwrap().attempt, 2);
    assert_status(t.c().ack(stale).await, Code::FailedPrecondition, "lease");
    assert!(t.c().ack(job_ref(&d, Some(d.lease))).await.unwrap().into_inner().removed);

    t.publish("b", pb::JobOptions::default()).await;
    let d = t.reserve(1, 0).await.pop().unwrap();
    let buried = t.c().bury(job_ref(&d, Some(d.lease))).await.unwrap().into_inner();
    assert_eq!(buried.state, "dead");
    assert_eq!(t.stats().await.dead, 1);

    // A long poll returns as soon as a job is published.
    let waiter = {
        let c = t.c();
        tokio::spawn(async move {
            let req = pb::ReserveRequest {
                namespace: NS.into(),
                queues: vec!["other".into(), Q.into()],
                count: Some(2),
                ttr_ms: Some(5_000),
                wait_ms: 10_000,
            };
            let mut c = c;
            c.reserve(req).await.unwrap().into_inner().deliveries
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    t.publish("c", pb::JobOptions::default()).await;
    let got = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
    assert_eq!(got.len(), 1);
    t.stop().await;
}

#[tokio::test]
async fn batched_operations_answer_each_item() {
    let t = TestNode::start().await;
    for i in 0..4 {
        t.publish(&format!("j{i}"), pb::JobOptions::default()).await;
    }
    let got = t.reserve(4, 0).await;
    assert_eq!(got.len(), 4);

    // Ack: one good, one stale lease, one invalid id, one unknown id.
    let items = vec![
        job_ref(&got[0], Some(got[0].lease)),
        job_ref(&got[1], Some(got[1].lease.wrapping_add(1))),
        pb::JobRef { job_id: "bad".into(), ..job_ref(&got[1], None) },
        pb::JobRef { job_id: UNKNOWN_ID.into(), ..job_ref(&got[1], None) },
    ];
    let r = t.c().ack_batch(pb::AckBatchRequest { items }).await.unwrap().into_inner().results;
    assert_eq!(r.len(), 4);
    assert!(r[0].error.is_none() && r[0].removed);
    assert_eq!(r[1].error.as_ref().unwrap().code, Code::FailedPrecondition as i32);
    assert_eq!(r[2].error.as_ref().unwrap().code, Code::InvalidArgument as i32);
    assert!(r[3].error.is_none() && !r[3].removed);

    let touch = vec![
        pb::TouchRequest { job: Some(job_ref(&got[1], Some(got[1].lease))), ttr_ms: None },
        pb::TouchRequest { job: Some(job_ref(&got[0], Some(got[0].lease))), ttr_ms: None },
    ];
    let r = t
        .c()
        .touch_batch(pb::TouchBatchRequest { items: touch })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(r[0].job.as_ref().unwrap().state, "reserved");
    // Acked above: its lease is no longer current.
    assert_eq!(r[1].error.as_ref().unwrap().code, Code::FailedPrecondition as i32);

    let release = vec![pb::ReleaseRequest {
        job: Some(job_ref(&got[1], Some(got[1].lease))),
        delay_ms: 60_000,
        priority: None,
    }];
    let r = t
        .c()
        .release_batch(pb::ReleaseBatchRequest { items: release })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(r[0].job.as_ref().unwrap().state, "delayed");

    let bury = vec![
        job_ref(&got[2], Some(got[2].lease)),
        job_ref(&got[3], Some(got[3].lease)),
        job_ref(&got[3], Some(got[3].lease)),
    ];
    let r =
        t.c().bury_batch(pb::BuryBatchRequest { items: bury }).await.unwrap().into_inner().results;
    assert_eq!(r[0].job.as_ref().unwrap().state, "dead");
    // The same job twice: exactly one of the two buries wins.
    let failed = r[1..].iter().filter(|i| i.error.is_some()).count();
    assert_eq!(failed, 1, "{r:?}");
    let s = t.stats().await;
    assert_eq!((s.ready, s.delayed, s.reserved, s.dead), (0, 1, 0, 2));
    t.stop().await;
}

fn batch(n: usize, keys: Option<&str>) -> pb::PublishBatch {
    pb::PublishBatch {
        namespace: NS.into(),
        queue: Q.into(),
        bodies: (0..n).map(|i| format!("b{i}").into_bytes()).collect(),
        options: None,
        keys: keys.map_or(Vec::new(), |k| (0..n).map(|i| format!("{k}-{i}")).collect()),
    }
}

#[tokio::test]
async fn publish_stream_answers_each_batch_in_order() {
    let t = TestNode::start().await;
    let (tx, rx) = mpsc::channel(64);
    let outbound =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    let call = {
        let mut c = t.c();
        tokio::spawn(async move { c.publish_stream(outbound).await })
    };
    tx.send(batch(64, None)).await.unwrap();
    // Proposed as it arrives, not when the stream ends: visible while the stream is open.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while t.stats().await.ready < 64 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "first batch not published while the stream is open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Many batches at once: they are in flight together, so the proposer packs them into
    // fewer log entries than batches.
    let before = t.node.cluster().metrics().last_log_index.unwrap_or(0);
    const BATCHES: usize = 32;
    for i in 0..BATCHES {
        let b = match i {
            5 => batch(65, None),     // too many jobs
            6 => batch(3, Some("k")), // keyed
            7 => pb::PublishBatch { queue: "_x".into(), ..batch(1, None) },
            _ => batch(64, None),
        };
        tx.send(b).await.unwrap();
    }
    tx.send(batch(3, Some("k"))).await.unwrap(); // the same keys again: the same jobs
    drop(tx);
    let reply = call.await.unwrap().unwrap().into_inner();
    let after = t.node.cluster().metrics().last_log_index.unwrap_or(0);
    assert_eq!(reply.batches.len(), BATCHES + 2);
    for (i, b) in reply.batches.iter().enumerate() {
        match i {
            6 => {
                let e = b.error.as_ref().unwrap();
                assert_eq!(e.code, Code::InvalidArgument as i32);
                assert!(e.message.contains("1 to 64 jobs"), "{}", e.message);
            }
            8 => assert_eq!(b.error.as_ref().unwrap().code, Code::InvalidArgument as i32),
            7 | 33 => {
                assert!(b.error.is_none());
                assert_eq!(b.job_ids.len(), 3);
            }
            _ => {
                assert!(b.error.is_none(), "batch {i}: {:?}", b.error);
                assert_eq!((b.job_ids.len(), b.existed.len()), (64, 64));
            }
        }
    }
    assert_eq!(reply.batches[7].job_ids, reply.batches[33].job_ids);
    assert_eq!(reply.batches[33].existed, vec![true; 3]);
    let good = (BATCHES - 3) as u64;
    assert!(after - before < good, "{} entries for {good} batches", after - before);
    assert_eq!(t.stats().await.ready, 64 + good * 64 + 3);

    // Keys with a different count than bodies.
    let bad = pb::PublishBatch { keys: vec!["x".into()], ..batch(2, None) };
    let reply = t.c().publish_stream(futures::stream::iter(vec![bad])).await.unwrap().into_inner();
    assert!(reply.batches[0].error.as_ref().unwrap().message.contains("one key per body"));
    t.stop().await;
}

type Sender = mpsc::Sender<pb::ReserveStreamRequest>;

async fn open_stream(
    t: &TestNode,
    first: pb::reserve_stream_request::Msg,
) -> Result<(Sender, tonic::Streaming<pb::ReserveStreamReply>), Status> {
    let (tx, rx) = mpsc::channel(16);
    tx.send(pb::ReserveStreamRequest { msg: Some(first) }).await.unwrap();
    let outbound =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let inbound = t.c().reserve_stream(outbound).await?.into_inner();
    Ok((tx, inbound))
}

fn subscribe() -> pb::reserve_stream_request::Msg {
    pb::reserve_stream_request::Msg::Subscribe(pb::Subscribe {
        namespace: NS.into(),
        queues: vec![Q.into()],
        ttr_ms: Some(30_000),
    })
}

async fn credit(tx: &Sender, n: u32) {
    let msg = pb::reserve_stream_request::Msg::Credit(pb::Credit { n });
    tx.send(pb::ReserveStreamRequest { msg: Some(msg) }).await.unwrap();
}

async fn next(
    inbound: &mut tonic::Streaming<pb::ReserveStreamReply>,
) -> pb::reserve_stream_reply::Msg {
    let m = tokio::time::timeout(Duration::from_secs(5), inbound.message()).await;
    m.expect("nothing pushed in time").unwrap().unwrap().msg.unwrap()
}

async fn next_delivery(inbound: &mut tonic::Streaming<pb::ReserveStreamReply>) -> pb::Delivery {
    match next(inbound).await {
        pb::reserve_stream_reply::Msg::Delivery(d) => d,
        other => panic!("expected a delivery, got {other:?}"),
    }
}

#[tokio::test]
async fn reserve_stream_pushes_no_more_than_the_credit() {
    let t = TestNode::start().await;
    for i in 0..5 {
        t.publish(&format!("j{i}"), pb::JobOptions::default()).await;
    }
    let (tx, mut inbound) = open_stream(&t, subscribe()).await.unwrap();
    // No credit yet: nothing is reserved.
    let quiet = tokio::time::timeout(Duration::from_millis(300), inbound.message()).await;
    assert!(quiet.is_err(), "pushed without credit: {quiet:?}");
    assert_eq!(t.stats().await.reserved, 0);

    credit(&tx, 2).await;
    let first = next_delivery(&mut inbound).await;
    next_delivery(&mut inbound).await;
    let quiet = tokio::time::timeout(Duration::from_millis(300), inbound.message()).await;
    assert!(quiet.is_err(), "pushed beyond the credit: {quiet:?}");
    let s = t.stats().await;
    assert_eq!((s.reserved, s.ready), (2, 3), "the server reserved more than the credit");

    credit(&tx, 10).await;
    for _ in 0..3 {
        next_delivery(&mut inbound).await;
    }
    // Credit left (7): a job published later is pushed when it comes due.
    let due =
        pb::JobOptions { due: Some(pb::job_options::Due::DelayMs(300)), ..Default::default() };
    let late = t.publish("late", due).await;
    let d = next_delivery(&mut inbound).await;
    let job = d.job.as_ref().unwrap();
    assert_eq!(job.job_id, late);
    assert!(job.lease_deadline_ms.is_some());

    // Acks on the stream are answered on it.
    let ack = pb::reserve_stream_request::Msg::Ack(job_ref(&first, Some(first.lease)));
    tx.send(pb::ReserveStreamRequest { msg: Some(ack) }).await.unwrap();
    match next(&mut inbound).await {
        pb::reserve_stream_reply::Msg::Ack(a) => {
            assert!(a.removed && a.error.is_none(), "{a:?}");
            assert_eq!(a.job_id, first.job.as_ref().unwrap().job_id);
        }
        other => panic!("expected an ack result, got {other:?}"),
    }
    assert_eq!(t.stats().await.reserved, 5);

    // Closing the client's side ends the stream cleanly.
    drop(tx);
    let end = tokio::time::timeout(Duration::from_secs(5), inbound.message()).await.unwrap();
    assert!(matches!(end, Ok(None)), "{end:?}");
    t.stop().await;
}

#[tokio::test]
async fn reserve_stream_refuses_bad_subscriptions_and_ends_on_shutdown() {
    let t = TestNode::start().await;
    let r = open_stream(&t, pb::reserve_stream_request::Msg::Credit(pb::Credit { n: 1 })).await;
    assert_status(
        r,
        Code::InvalidArgument,
        "the first message of a reserve stream must be subscribe",
    );
    let bad = pb::reserve_stream_request::Msg::Subscribe(pb::Subscribe {
        namespace: NS.into(),
        queues: vec!["_q".into()],
        ttr_ms: None,
    });
    assert_status(open_stream(&t, bad).await, Code::InvalidArgument, "reserved");
    let no_ttr = pb::reserve_stream_request::Msg::Subscribe(pb::Subscribe {
        namespace: NS.into(),
        queues: vec![Q.into()],
        ttr_ms: Some(0),
    });
    assert_status(open_stream(&t, no_ttr).await, Code::InvalidArgument, "ttr must be positive");

    // A stream waiting for jobs ends when the node stops.
    let (tx, mut inbound) = open_stream(&t, subscribe()).await.unwrap();
    credit(&tx, 1).await;
    let node = t.node.clone();
    let stop = tokio::spawn(async move { t.stop().await });
    let end = tokio::time::timeout(Duration::from_secs(10), inbound.message()).await;
    match end.expect("the stream outlived the node") {
        Ok(None) => {}
        Err(s) => assert_eq!(s.code(), Code::Unavailable, "{s:?}"),
        Ok(Some(m)) => panic!("unexpected {m:?}"),
    }
    tokio::time::timeout(Duration::from_secs(10), stop).await.unwrap().unwrap();
    drop((tx, node));
}

const ADMIN: &str = "admin-token-for-tests-0123456789";

fn secured() -> Config {
    Config {
        auth: delayd_server::config::AuthConfig {
            admin_token: Some(ADMIN.into()),
            ..Default::default()
        },
        ..Config::default()
    }
}

/// Adds the admin token to a request.
fn admin<T>(message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut().insert("x-token", ADMIN.parse().unwrap());
    r
}

/// A caller without a valid credential is refused from the request head: the server neither
/// waits for nor decodes its message.
#[tokio::test]
async fn the_credential_is_checked_before_the_message_is_read() {
    use tower::ServiceExt;
    let t = TestNode::start_with(secured()).await;

    // A publish whose 4 MiB message never finishes arriving: only a check made before the
    // body is read can answer it.
    let channel = Channel::from_shared(format!("http://{}", t.node.config().advertised()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    // A gRPC frame header announcing 4 MiB, 1 KiB of it, then nothing: the body never ends.
    let hanging = || {
        let mut head = vec![0u8];
        head.extend_from_slice(&(4u32 << 20).to_be_bytes());
        head.extend_from_slice(&[7u8; 1024]);
        let first = futures::stream::once(async move { Ok::<_, std::io::Error>(head) });
        let body = futures::StreamExt::chain(first, futures::stream::pending());
        tonic::body::Body::new(axum::body::Body::from_stream(body))
    };
    for token in [None, Some("0123456789abcdef0123456789abcdef"), Some("not-a-token")] {
        let mut req = tonic::codegen::http::Request::post("/delayd.v1.Delayd/Publish")
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if let Some(token) = token {
            req = req.header("x-token", token);
        }
        let req = req.body(hanging()).unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), channel.clone().oneshot(req))
            .await
            .expect("answered without waiting for the message")
            .unwrap();
        let status = answer.headers().get("grpc-status").map(|v| v.to_str().unwrap().to_string());
        assert_eq!(status.as_deref(), Some("16"), "UNAUTHENTICATED for {token:?}");
    }

    // A whole 4 MiB publish without a credential: refused, nothing written.
    let big = publish_req(Q, vec![1u8; 4 << 20], pb::JobOptions::default());
    assert_status(t.c().publish(big).await, Code::Unauthenticated, "token is required");
    let req = admin(pb::StatsRequest { namespace: NS.into(), queue: Q.into(), stale: false });
    let s = t.c().stats(req).await.unwrap().into_inner();
    assert_eq!((s.ready, s.delayed), (0, 0));
    // With it, the same client gets through.
    let small = admin(publish_req(Q, b"x".to_vec(), pb::JobOptions::default()));
    t.c().publish(small).await.unwrap();
    t.stop().await;
}

/// Messages are bounded by the largest log entry, not by bodies × bulk size: a bulk that
/// could never be one entry is refused by the decoder, and nothing is written.
#[tokio::test]
async fn a_message_larger_than_an_entry_is_refused_unread() {
    let config =
        Config { max_body_bytes: 128 << 10, max_entry_bytes: 256 << 10, ..Config::default() };
    assert_eq!(api::max_request_bytes(&config), (256 << 10) + api::MESSAGE_FRAMING_BYTES);
    let t = TestNode::start_with(config).await;
    let bodies =
        |n: usize| pb::PublishBatch { bodies: vec![vec![3u8; 100 << 10]; n], ..batch(1, None) };
    // 400 KiB of bodies, each under the body limit: over the 320 KiB message limit.
    let r = t.c().publish_stream(futures::stream::iter(vec![bodies(4)])).await;
    let s = r.expect_err("refused");
    assert!(matches!(s.code(), Code::OutOfRange | Code::ResourceExhausted), "{s:?}");
    assert_eq!(t.stats().await.ready, 0, "nothing written");
    // 200 KiB fits.
    let r = t.c().publish_stream(futures::stream::iter(vec![bodies(2)])).await.unwrap();
    assert!(r.into_inner().batches[0].error.is_none());
    assert_eq!(t.stats().await.ready, 2);
    t.stop().await;
}

/// One stream carries a bounded number of batches (its reply lists them all): the server
/// answers once it has that many, having written exactly those, each answered in order.
#[tokio::test]
async fn a_publish_stream_answers_at_most_its_bound_of_batches() {
    let t = TestNode::start().await;
    let sent = api::MAX_STREAM_BATCHES + 10;
    let batches = (0..sent)
        .map(|i| pb::PublishBatch { bodies: vec![format!("{i}").into_bytes()], ..batch(1, None) });
    let mut client = t.c();
    let call = client.publish_stream(futures::stream::iter(batches));
    let reply = tokio::time::timeout(Duration::from_secs(60), call)
        .await
        .expect("answered")
        .unwrap()
        .into_inner();
    assert_eq!(reply.batches.len(), api::MAX_STREAM_BATCHES);
    assert!(reply.batches.iter().all(|b| b.error.is_none() && b.job_ids.len() == 1));
    assert_eq!(t.stats().await.ready, api::MAX_STREAM_BATCHES as u64);
    // Answered in the order sent: result i names the job with body i.
    for (i, b) in reply.batches.iter().enumerate().step_by(97) {
        let req = pb::PeekRequest {
            namespace: NS.into(),
            queue: Q.into(),
            job_id: b.job_ids[0].clone(),
            stale: false,
        };
        let job = t.c().peek(req).await.unwrap().into_inner();
        assert_eq!(job.body, format!("{i}").into_bytes(), "batch {i}");
    }
    t.stop().await;
}

/// Webhooks and schedules through the client API: the HTTP API's rules and shapes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_and_schedules_are_managed_over_grpc() {
    let t = TestNode::start().await;
    let queue = || pb::QueueRef { namespace: NS.into(), queue: Q.into(), stale: false };
    let set = pb::SetWebhookRequest {
        namespace: NS.into(),
        queue: Q.into(),
        url: "http://127.0.0.1:9/hook".into(),
        timeout_ms: Some(500),
        ..Default::default()
    };
    let w = t.c().set_webhook(set.clone()).await.unwrap().into_inner();
    assert_eq!((w.timeout_ms, w.max_in_flight, w.replaced), (500, 32, false));
    assert_eq!(w.secret.as_ref().map(String::len), Some(32), "a generated secret, shown once");
    assert!(t.c().set_webhook(set).await.unwrap().into_inner().replaced);
    let shown = t.c().get_webhook(queue()).await.unwrap().into_inner();
    assert_eq!((shown.url.as_str(), shown.secret), ("http://127.0.0.1:9/hook", None));
    let bad = pb::SetWebhookRequest { url: "gopher://x".into(), ..Default::default() };
    let bad = pb::SetWebhookRequest { namespace: NS.into(), queue: Q.into(), ..bad };
    assert_status(t.c().set_webhook(bad).await, Code::InvalidArgument, "only http and https");
    t.c().delete_webhook(queue()).await.unwrap();
    assert_status(t.c().get_webhook(queue()).await, Code::NotFound, "no webhook");

    let schedule = pb::SetScheduleRequest {
        namespace: NS.into(),
        queue: Q.into(),
        name: "nightly".into(),
        timetable: Some(pb::set_schedule_request::Timetable::Cron("0 0 3 * * *".into())),
        tz: Some("Asia/Tokyo".into()),
        ..Default::default()
    };
    let s = t.c().set_schedule(schedule.clone()).await.unwrap().into_inner();
    assert_eq!((s.tz.as_str(), s.catch_up.as_str(), s.replaced), ("Asia/Tokyo", "latest", false));
    assert!(s.next_at_ms.is_some());
    let no_zone = pb::SetScheduleRequest { tz: Some("Nowhere/Land".into()), ..schedule };
    assert_status(t.c().set_schedule(no_zone).await, Code::InvalidArgument, "unknown time zone");
    let listed = t.c().list_schedules(queue()).await.unwrap().into_inner().schedules;
    assert_eq!(listed.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["nightly"]);
    let name = pb::ScheduleRef { namespace: NS.into(), queue: Q.into(), name: "nightly".into() };
    t.c().delete_schedule(name.clone()).await.unwrap();
    assert_status(t.c().delete_schedule(name).await, Code::NotFound, "no schedule");
    t.node.shutdown().await;
}
