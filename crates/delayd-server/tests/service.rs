//! The service layer against in-process nodes: what a request that is abandoned halfway
//! leaves behind.

mod common;

use std::time::Duration;

use delayd_core::{JobId, JobState, QueueName};
use std::sync::Arc;

use delayd_raft::faults::{FaultFilter, Verdict};
use delayd_raft::network::Method;
use delayd_server::service::reserve::{AckFirst, ReserveOrder, ReserveRequest};
use delayd_server::service::PublishParams;
use delayd_server::{Config, Node, Principal};

/// A reserve whose caller goes away (a client that disconnects, a dropped request) must not
/// keep the jobs it leased: with one try, an expired lease would send them to the dead letter
/// without ever being handed out. The caller is dropped at many points of the reserve's
/// life; whenever it did not get its answer, the job must be ready again at once, long before
/// its 60 s ttr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_whose_caller_is_gone_releases_what_it_leased() {
    let (node, _dir) = common::start_node(Config::default()).await;
    let s = node.service().clone();
    let dev = Principal::Dev;
    let queue = QueueName::new("ns", "q");
    let params = PublishParams { tries: 1, ..PublishParams::default() };
    let id = s.publish(&dev, queue.clone(), &params, b"job".to_vec()).await.expect("publish").id;
    let mut abandoned_in_flight = 0;
    for i in 0..200u64 {
        let reserving = {
            let (s, queue) = (s.clone(), queue.clone());
            let request = ReserveRequest {
                queues: vec![queue],
                count: 1,
                ttr_ms: Some(60_000),
                wait: Duration::ZERO,
                acks: Vec::new(),
                order: ReserveOrder::QueueOrder,
            };
            tokio::spawn(async move { s.reserve(&Principal::Dev, request).await })
        };
        // Drop the caller after a varying head start: before the proposal, while the entry
        // is being committed, or after the answer.
        tokio::time::sleep(Duration::from_micros(i * 37 % 2000)).await;
        reserving.abort();
        let delivered = match reserving.await {
            Ok(got) => !got.expect("reserve").deliveries.is_empty(),
            Err(_) => false,
        };
        if delivered {
            // The caller got it: put it back the normal way for the next round.
            let meta = s.queue_meta(&dev, &queue, false).await.expect("meta");
            assert_eq!(meta.count(JobState::Reserved), 1);
            let job = s.peek(&dev, &queue, false).await.expect("peek");
            assert!(job.is_none(), "a delivered job is not ready");
            s.release(&dev, queue.clone(), id, None, 0, None).await.expect("release");
            continue;
        }
        // Not delivered: the job is ready again within a moment (released, or never taken).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let meta = s.queue_meta(&dev, &queue, false).await.expect("meta");
            if meta.count(JobState::Ready) == 1 {
                break;
            }
            abandoned_in_flight += 1;
            assert_eq!(meta.count(JobState::Dead), 0, "round {i}: an undelivered job died");
            assert!(tokio::time::Instant::now() < deadline, "round {i}: still leased: {meta:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    eprintln!("{abandoned_in_flight} polls saw a lease of an abandoned reserve before its release");
    node.shutdown().await;
}

/// Once armed, drops every call a node forwards to its leader until a given instant: the
/// leader is out of reach for that node's writes, which retry until their request timeout
/// and then fail.
#[derive(Default)]
struct ForwardsDropped {
    /// The node and until when.
    armed: std::sync::Mutex<Option<(u64, std::time::Instant)>>,
}

impl ForwardsDropped {
    fn arm(&self, from: u64, until: std::time::Instant) {
        *self.armed.lock().expect("lock") = Some((from, until));
    }
}

impl FaultFilter for ForwardsDropped {
    fn check(&self, from: u64, _to: u64, method: Method) -> Verdict {
        let armed = *self.armed.lock().expect("lock");
        let now = std::time::Instant::now();
        match armed {
            Some((node, until)) if node == from && method == Method::Forward && now < until => {
                Verdict::Drop
            }
            _ => Verdict::Pass,
        }
    }
}
/// A write's request timeout in [`CutForwards`] clusters.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// Three in-process nodes whose follower's forwards to the leader can be cut for a while.
struct CutForwards {
    nodes: Vec<(Node, tempfile::TempDir)>,
    filter: Arc<ForwardsDropped>,
    leader: u64,
    follower: u64,
}

impl CutForwards {
    /// Starts the nodes with `ack_hold` and a request timeout of [`REQUEST_TIMEOUT`], and
    /// waits for them to agree on a leader.
    async fn start(ack_hold: Duration) -> CutForwards {
        let filter = Arc::new(ForwardsDropped::default());
        let configs = common::three_nodes(Config {
            request_timeout: REQUEST_TIMEOUT,
            ack_hold,
            faults: Some(filter.clone()),
            ..Config::default()
        })
        .await;
        let nodes = futures::future::join_all(configs.into_iter().map(common::start_node)).await;
        let leader = common::agreed_leader(&nodes.iter().map(|(n, _)| n).collect::<Vec<_>>()).await;
        let follower = (1..=3).find(|id| *id != leader).expect("a follower");
        CutForwards { nodes, filter, leader, follower }
    }

    fn node(&self, id: u64) -> &Node {
        &self.nodes.iter().find(|(n, _)| n.config().node_id == id).expect("node").0
    }

    /// From now on the follower cannot reach the leader for a while: longer than a write's
    /// request timeout, shorter than that timeout twice over.
    fn cut(&self) {
        let until = std::time::Instant::now() + REQUEST_TIMEOUT + Duration::from_millis(300);
        self.filter.arm(self.follower, until);
    }

    /// Waits until the leader no longer has job `id` of `queue`, long before a 60 s ttr.
    async fn await_gone(&self, queue: &QueueName, id: JobId, what: &str) {
        let leader = self.node(self.leader).service();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while leader.job(&Principal::Dev, queue, id, false).await.expect("job").is_some() {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) {
        for (n, _) in &self.nodes {
            n.shutdown().await;
        }
    }
}

/// A consumer that acks its job on its next reserve and goes away before that write fails
/// must not lose the ack: nobody else would send it, and the finished job would be delivered
/// again when its ttr ran out. The follower's write keeps failing for its whole request
/// timeout after its caller is gone; the ack must still remove the job, long before the
/// 60 s ttr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_on_a_reserve_whose_write_fails_after_its_caller_left_is_sent_again() {
    // The ack goes with the reserve at once instead of being held for a wake-up.
    let c = CutForwards::start(Duration::ZERO).await;
    let f = c.node(c.follower).service().clone();

    let dev = Principal::Dev;
    let queue = QueueName::new("ns", "q");
    let params = PublishParams { ttr_ms: 60_000, ..PublishParams::default() };
    for body in [b"first".to_vec(), b"second".to_vec()] {
        f.publish(&dev, queue.clone(), &params, body).await.expect("publish");
    }
    let request = |acks: Vec<AckFirst>| ReserveRequest {
        queues: vec![queue.clone()],
        count: 1,
        ttr_ms: Some(60_000),
        wait: Duration::ZERO,
        acks,
        order: ReserveOrder::QueueOrder,
    };
    let got = f.reserve(&dev, request(Vec::new())).await.expect("reserve");
    let first = got.deliveries.first().expect("a job ready");
    let (id, lease) = (first.job.id, first.lease);

    c.cut();
    let ack = AckFirst { queue: queue.clone(), id, lease: Some(lease) };
    let caller =
        tokio::time::timeout(Duration::from_millis(200), f.reserve(&dev, request(vec![ack])));
    assert!(caller.await.is_err(), "the reserve answered while its leader was out of reach");

    // The caller is gone; its write fails when its request timeout ends. The ack alone is
    // sent again and, once the link is back, removes the job.
    c.await_gone(&queue, id, "the acked job is still there").await;
    c.stop().await;
}

/// A draining node answers a waiting reserve at once, after writing the acks it holds. If
/// the caller goes away while that write is under way, and the write then fails, the acks
/// must still go: nobody else would send them. The follower's forwarded writes are dropped
/// for longer than the write's request timeout; the job must still be acked, long before its
/// 60 s ttr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_acks_written_as_a_node_drains_are_sent_again_when_their_caller_left() {
    // A hold long enough that only the drain sends the held ack.
    let c = CutForwards::start(Duration::from_secs(10)).await;
    let f = c.node(c.follower).service().clone();

    let dev = Principal::Dev;
    let queue = QueueName::new("ns", "q");
    let params = PublishParams { ttr_ms: 60_000, ..PublishParams::default() };
    f.publish(&dev, queue.clone(), &params, b"job".to_vec()).await.expect("publish");
    let request = |acks: Vec<AckFirst>, wait: Duration| ReserveRequest {
        queues: vec![queue.clone()],
        count: 1,
        ttr_ms: Some(60_000),
        wait,
        acks,
        order: ReserveOrder::QueueOrder,
    };
    let got = f.reserve(&dev, request(Vec::new(), Duration::ZERO)).await.expect("reserve");
    let first = got.deliveries.first().expect("a job ready");
    let (id, lease) = (first.job.id, first.lease);

    // A linearizable read: the follower has applied the reservation, so its next reserve
    // sees nothing ready there and holds its ack.
    let job = f.job(&dev, &queue, id, false).await.expect("job").expect("the job");
    assert_eq!(job.state, JobState::Reserved);

    // The consumer's next reserve finds nothing, holds its ack and waits.
    let ack = AckFirst { queue: queue.clone(), id, lease: Some(lease) };
    let waiting = {
        let (f, request) = (f.clone(), request(vec![ack], Duration::from_secs(30)));
        tokio::spawn(async move { f.reserve(&Principal::Dev, request).await })
    };
    let parked = "delayd_reserves_waiting 1\n";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let follower = c.node(c.follower);
    let metrics = || follower.metrics().render(follower.cluster()).expect("metrics");
    while !metrics().contains(parked) {
        assert!(tokio::time::Instant::now() < deadline, "the reserve never parked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    assert!(f.job(&dev, &queue, id, false).await.expect("job").is_some(), "the ack is held");
    // The follower cannot reach the leader for longer than one write's request timeout; it
    // drains, which sends the held ack; the caller goes away while that write is under way.
    c.cut();
    f.drain();
    tokio::time::sleep(Duration::from_millis(200)).await;
    if waiting.is_finished() {
        panic!("the reserve answered while its leader was out of reach: {:?}", waiting.await);
    }
    waiting.abort();

    c.await_gone(&queue, id, "the held ack was lost").await;
    c.stop().await;
}

/// What waits for the node to stop (gRPC long-polls and streams, the protocol listeners) is
/// told once Raft has stopped, and not before: a stream of writes, each moving Raft's state
/// along, does not end the wait. The tasks that work while the node leads (push, the
/// schedule pump) end with Raft too, although the role they last saw is the leader's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_the_stop_ends_when_raft_stops_and_not_on_writes() {
    let (node, _dir) = common::start_node(Config::default()).await;
    let s = node.service().clone();
    let stopped = tokio::spawn({
        let s = s.clone();
        async move { s.stopped().await }
    });
    let queue = QueueName::new("ns", "q");
    for _ in 0..50 {
        s.publish(&Principal::Dev, queue.clone(), &PublishParams::default(), b"j".to_vec())
            .await
            .expect("publish");
    }
    assert!(!stopped.is_finished(), "the wait ended while the node was running");
    // Every task of the node ends with Raft: one that does not is abandoned only after 5 s.
    tokio::time::timeout(Duration::from_secs(4), node.shutdown())
        .await
        .expect("the node's tasks end with Raft");
    tokio::time::timeout(Duration::from_secs(10), stopped)
        .await
        .expect("the wait ends once Raft has stopped")
        .expect("the waiting task");
}
