//! The gRPC Raft transport end to end: in-process openraft nodes on loopback ports, each with
//! its own RocksDB store, [`GrpcNetwork`] and [`server::serve`] — the transport alone, without
//! the cluster runtime around it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use delayd_raft::network::{ForwardError, GrpcNetwork};
use delayd_raft::server::{self, ForwardHandler, Services};
use delayd_store::{Raft, Store};
use openraft::async_runtime::watch::WatchReceiver;
use openraft::{BasicNode, SnapshotPolicy};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Errors of any kind, reported with `?`.
type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

const WAIT: Duration = Duration::from_secs(20);

/// Answers a forwarded payload with the node's id followed by the payload.
struct Echo(u64);

#[tonic::async_trait]
impl ForwardHandler for Echo {
    async fn forward(&self, payload: Vec<u8>) -> Result<Vec<u8>, tonic::Status> {
        if payload.is_empty() {
            return Err(tonic::Status::failed_precondition("empty"));
        }
        let mut reply = self.0.to_be_bytes().to_vec();
        reply.extend(payload);
        Ok(reply)
    }
}

struct TestNode {
    id: u64,
    addr: String,
    raft: Raft,
    network: GrpcNetwork,
    stop: watch::Sender<bool>,
    server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
    _dir: TempDir,
}

impl TestNode {
    async fn start(id: u64) -> Result<TestNode> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().to_owned();
        let (log, sm) = tokio::task::spawn_blocking(move || Store::open(&path)).await??;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        // Replication through the log's stored bytes, as a node runs it.
        let encoded = log.encoded_entries();
        let network = GrpcNetwork::new(id, None)?.with_log(encoded.clone());
        let inbox = sm.inbox();
        let raft = Raft::new(id, Arc::new(raft_config()?), network.clone(), log, sm).await?;
        let (stop, stopping) = watch::channel(false);
        let services = Services {
            raft: raft.clone(),
            inbox,
            forward: Arc::new(Echo(id)),
            secret: None,
            previous_secrets: Vec::new(),
            contact: Default::default(),
            peer_certs: false,
            identity: Default::default(),
            stopping: stopping.clone(),
            log: Some(encoded),
        };
        let routes = server::routes(services, None);
        let mut stopped = stopping;
        let server = tokio::spawn(server::serve(listener, routes, async move {
            let _ = stopped.wait_for(|s| *s).await;
        }));
        Ok(TestNode { id, addr, raft, network, stop, server: Some(server), _dir: dir })
    }

    fn node(&self) -> BasicNode {
        BasicNode::new(&self.addr)
    }

    async fn stop(&mut self) -> Result {
        self.raft.shutdown().await.map_err(|e| format!("shutdown: {e}"))?;
        self.stop.send_replace(true);
        if let Some(server) = self.server.take() {
            server.await??;
        }
        Ok(())
    }
}

fn raft_config() -> Result<openraft::Config> {
    let config = openraft::Config {
        cluster_name: "transport-test".into(),
        heartbeat_interval: 150,
        election_timeout_min: 600,
        election_timeout_max: 1000,
        install_snapshot_timeout: 5000,
        // Snapshots only when the test asks for one.
        snapshot_policy: SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: 0,
        ..Default::default()
    };
    Ok(config.validate()?)
}

async fn wait_applied(node: &TestNode, index: u64) -> Result {
    node.raft
        .wait(Some(WAIT))
        .metrics(
            |m| m.last_applied.is_some_and(|l| l.index >= index),
            format!("node {} applies {index}", node.id),
        )
        .await?;
    Ok(())
}

/// Starts three voters, forms the cluster on the first and returns the nodes and the leader's
/// position among them.
async fn three_voters() -> Result<(Vec<TestNode>, usize)> {
    let mut nodes = Vec::new();
    for id in 1..=3 {
        nodes.push(TestNode::start(id).await?);
    }
    let members: BTreeMap<u64, BasicNode> = nodes.iter().map(|n| (n.id, n.node())).collect();
    nodes[0].raft.initialize(members).await?;

    let metrics = nodes[0]
        .raft
        .wait(Some(WAIT))
        .metrics(|m| m.current_leader.is_some(), "a leader is elected")
        .await?;
    let leader_id = metrics.current_leader.ok_or("no leader")?;
    let leader = nodes.iter().position(|n| n.id == leader_id).ok_or("leader is not a member")?;
    // Every node agrees.
    for node in &nodes {
        node.raft
            .wait(Some(WAIT))
            .metrics(|m| m.current_leader == Some(leader_id), "all nodes know the leader")
            .await?;
    }
    Ok((nodes, leader))
}

/// Writes an empty entry through the leader. A leader refuses writes until a quorum has
/// acknowledged it within its lease (openraft 0.10), which on a loaded machine can lag the
/// election: that refusal names no other leader, and the write is tried again.
async fn write(raft: &Raft, now_ms: u64) -> Result<u64> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match raft.client_write(delayd_core::Entry::new(now_ms, vec![])).await {
            Ok(resp) => return Ok(resp.log_id.index),
            Err(e)
                if e.forward_to_leader().is_some_and(|f| f.leader_id.is_none())
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_replicate_and_a_learner_gets_a_snapshot() -> Result {
    let (mut nodes, leader) = three_voters().await?;

    // Replication: every node applies what the leader committed.
    let mut last = 0;
    for now_ms in 1..=10 {
        last = write(&nodes[leader].raft, now_ms).await?;
    }
    for node in &nodes {
        wait_applied(node, last).await?;
    }

    // A write on a follower is refused with the leader's address, which forwarding uses.
    let follower = (leader + 1) % nodes.len();
    let err = nodes[follower]
        .raft
        .client_write(delayd_core::Entry::new(11, vec![]))
        .await
        .expect_err("a follower does not accept writes");
    let to_leader = err.forward_to_leader().ok_or("expected ForwardToLeader")?;
    assert_eq!(to_leader.leader_node.as_ref().map(|n| n.addr.as_str()), Some(&*nodes[leader].addr));

    // Snapshot, then purge every log it covers: a new node can only catch up by snapshot.
    nodes[leader].raft.trigger().snapshot().await?;
    let metrics = nodes[leader]
        .raft
        .wait(Some(WAIT))
        .metrics(|m| m.snapshot.is_some_and(|s| s.index >= last), "leader builds a snapshot")
        .await?;
    let snapshot = metrics.snapshot.ok_or("no snapshot")?;
    let file = nodes[leader].raft.get_snapshot().await?.ok_or("no snapshot")?.snapshot;
    let snapshot_bytes = file.metadata().await?.len();
    assert!(snapshot_bytes > 0, "an empty snapshot file");
    nodes[leader].raft.trigger().purge_log(snapshot.index).await?;
    nodes[leader]
        .raft
        .wait(Some(WAIT))
        .metrics(|m| m.purged.is_some_and(|p| p.index >= snapshot.index), "leader purges")
        .await?;

    let learner = TestNode::start(4).await?;
    nodes[leader].raft.add_learner(learner.id, learner.node(), true).await?;
    learner
        .raft
        .wait(Some(WAIT))
        .metrics(
            |m| m.snapshot.is_some_and(|s| s.index >= snapshot.index),
            "learner installs the snapshot",
        )
        .await?;
    wait_applied(&learner, snapshot.index).await?;

    // And it keeps up by log replication afterwards.
    let last = write(&nodes[leader].raft, 12).await?;
    wait_applied(&learner, last).await?;
    let voters: BTreeSet<u64> = learner
        .raft
        .metrics()
        .borrow_watched()
        .membership_config
        .membership()
        .voter_ids()
        .collect();
    assert_eq!(voters, BTreeSet::from([1, 2, 3]));

    nodes.push(learner);
    for node in &mut nodes {
        node.stop().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_round_trips_through_internal_forward() -> Result {
    let mut a = TestNode::start(1).await?;
    let mut b = TestNode::start(2).await?;

    let reply = a.network.forward(2, &b.addr, b"hello".to_vec(), Duration::from_secs(5)).await?;
    assert_eq!(reply, [&2u64.to_be_bytes()[..], b"hello"].concat());

    // The handler's status reaches the caller as is.
    match a.network.forward(2, &b.addr, Vec::new(), Duration::from_secs(5)).await {
        Err(ForwardError::Status(status)) => {
            assert_eq!(status.code(), tonic::Code::FailedPrecondition);
            assert_eq!(status.message(), "empty");
        }
        other => panic!("expected the handler's status, got {other:?}"),
    }

    // A stopped peer is unreachable. The first call may still find the old connection, not
    // yet seen to be closed, and fail on it; the channel then reconnects, and fails to.
    let b_addr = b.addr.clone();
    b.stop().await?;
    let mut last = None;
    for _ in 0..3 {
        match a.network.forward(2, &b_addr, b"x".to_vec(), Duration::from_secs(5)).await {
            Err(ForwardError::Unreachable(_)) => {
                last = None;
                break;
            }
            other => last = Some(other),
        }
    }
    assert!(last.is_none(), "expected Unreachable, got {last:?}");
    a.stop().await?;
    Ok(())
}
