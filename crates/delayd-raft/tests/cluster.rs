//! The cluster runtime in process: three [`Cluster`] nodes on loopback ports, each with its own
//! RocksDB store, and one [`Faults`] filter between them that cuts, slows and heals links. Each
//! scenario that a real-process test needs seconds of signals and sleeps for (a node cut off
//! and back, a graceful leader stop, forwarding to an unreachable leader) runs here in a
//! few seconds, with the real transport.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use delayd_core::{query, Command, Due, Effects, JobId, NewJob, Outcome, QueueName, Reply};
use delayd_raft::faults::Faults;
use delayd_raft::{
    Cluster, ClusterConfig, ClusterError, ForwardOp, Observer, ReplicationMetrics, Timing,
};
use delayd_store::StoreMetrics;
use openraft::ServerState;
use tempfile::TempDir;
use tokio::time::Instant;

type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

/// Longest wait for anything the cluster should do on its own.
const WAIT: Duration = Duration::from_secs(20);

struct Quiet;

impl Observer for Quiet {
    fn applied(&self, _: &Effects) {}
    fn replaced(&self) {}
}

struct TestCluster {
    nodes: Vec<Option<Cluster>>,
    /// Each node's replication counters, by node id - 1.
    replication: Vec<ReplicationMetrics>,
    faults: Arc<Faults>,
    dirs: Vec<TempDir>,
    next_job: u128,
}

fn config(id: u64, dir: &TempDir, faults: &Arc<Faults>, join: bool) -> ClusterConfig {
    let mut c = ClusterConfig {
        node_id: id,
        data_dir: dir.path().to_owned(),
        grpc_addr: "127.0.0.1:0".parse().expect("addr"),
        join,
        cluster_secret: Some("in-process-cluster-secret".into()),
        timing: Timing::default(),
        request_timeout: Duration::from_secs(3),
        faults: Some(faults.clone()),
        ..ClusterConfig::default()
    };
    c.proposer.timeout = c.request_timeout;
    c
}

async fn start(config: ClusterConfig, replication: ReplicationMetrics) -> Result<Cluster> {
    start_observed(config, Arc::new(Quiet), replication).await
}

/// [`start`], with `observer` told of every applied batch.
async fn start_observed(
    config: ClusterConfig,
    observer: Arc<dyn Observer>,
    replication: ReplicationMetrics,
) -> Result<Cluster> {
    let cluster = Cluster::open(config, observer, StoreMetrics::default(), replication).await?;
    cluster.serve(None).await?;
    Ok(cluster)
}

/// Polls `node`'s view until `ok` holds (every change of Raft's metrics is a poll).
async fn wait_for(node: &Cluster, what: &str, ok: impl Fn(&Cluster) -> bool) -> Result {
    let deadline = Instant::now() + WAIT;
    let mut metrics = node.raft().metrics();
    use openraft::async_runtime::watch::WatchReceiver;
    while !ok(node) {
        if Instant::now() >= deadline {
            return Err(format!("{what}: not within {WAIT:?}").into());
        }
        let _ = tokio::time::timeout(Duration::from_millis(20), metrics.changed()).await;
    }
    Ok(())
}

impl TestCluster {
    /// Node 1 forms a cluster alone; 2 and 3 join as learners and are promoted.
    async fn three() -> Result<TestCluster> {
        let faults = Arc::new(Faults::default());
        let mut dirs = Vec::new();
        let mut nodes = Vec::new();
        let mut replication = Vec::new();
        for id in 1..=3 {
            let dir = tempfile::tempdir()?;
            let metrics = ReplicationMetrics::default();
            nodes.push(Some(start(config(id, &dir, &faults, id != 1), metrics.clone()).await?));
            replication.push(metrics);
            dirs.push(dir);
        }
        let c = TestCluster { nodes, replication, faults, dirs, next_job: 0 };
        c.wait(1, "node 1 leads", |n| n.is_leader()).await?;
        for id in 2..=3 {
            let addr = c.node(id).config().advertised();
            c.node(1).change_members(ForwardOp::AddLearner { id, addr }).await?;
            c.node(1).change_members(ForwardOp::Promote { id }).await?;
        }
        for id in 1..=3 {
            c.wait(id, "three voters", |n| n.voters() == BTreeSet::from([1, 2, 3])).await?;
        }
        Ok(c)
    }

    fn node(&self, id: u64) -> &Cluster {
        self.nodes[id as usize - 1].as_ref().expect("node is running")
    }

    fn running(&self) -> impl Iterator<Item = &Cluster> {
        self.nodes.iter().flatten()
    }

    /// Polls node `id`'s view until `ok` holds (see [`wait_for`]).
    async fn wait(&self, id: u64, what: &str, ok: impl Fn(&Cluster) -> bool) -> Result {
        wait_for(self.node(id), &format!("node {id}: {what}"), ok).await
    }

    /// The leader every running node agrees on, with its term.
    async fn agreed_leader(&self) -> Result<(u64, u64)> {
        let deadline = Instant::now() + WAIT;
        loop {
            let views: BTreeSet<(Option<u64>, u64)> = self
                .running()
                .map(|n| {
                    let m = n.metrics();
                    (m.current_leader, m.current_term)
                })
                .collect();
            if let [(Some(leader), term)] = views.iter().copied().collect::<Vec<_>>()[..] {
                if self.node(leader).is_leader() {
                    return Ok((leader, term));
                }
            }
            if Instant::now() >= deadline {
                return Err(format!("no agreed leader within {WAIT:?}: {views:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Publishes one job through node `via`; its id when acknowledged.
    async fn publish(&mut self, via: u64) -> std::result::Result<JobId, ClusterError> {
        self.next_job += 1;
        let id = JobId(self.next_job);
        let job = new_job(id);
        let outcomes =
            self.node(via).propose(vec![Command::Publish { queue: queue(), job }]).await?;
        match &outcomes[..] {
            [Outcome::Ok(Reply::Published { id: got, .. })] if *got == id => Ok(id),
            other => panic!("unexpected outcome {other:?}"),
        }
    }

    /// Every acknowledged job is in node `id`'s replica (after a read barrier).
    async fn holds(&self, id: u64, jobs: &[JobId]) -> Result {
        let node = self.node(id);
        let view = node.read(false).await?;
        for job in jobs {
            if query::job(&view, &queue(), *job)?.is_none() {
                return Err(format!("node {id} lost acknowledged job {job:?}").into());
            }
        }
        Ok(())
    }

    async fn stop(&mut self, id: u64) {
        if let Some(node) = self.nodes[id as usize - 1].take() {
            node.shutdown().await;
        }
    }

    async fn stop_all(&mut self) {
        for id in 1..=self.nodes.len() as u64 {
            self.stop(id).await;
        }
        drop(std::mem::take(&mut self.dirs));
    }
}

/// A job due in an hour.
fn new_job(id: JobId) -> NewJob {
    NewJob {
        id,
        key: None,
        body: b"x".to_vec(),
        attributes: Default::default(),
        due: Due::After(3_600_000),
        ttl_ms: None,
        tries: 1,
        ttr_ms: 1000,
        priority: 0,
    }
}

fn queue() -> QueueName {
    QueueName::new("ns", "q")
}

/// A follower cut off from both peers for many election timeouts, then healed, rejoins
/// without deposing the leader: Pre-Vote keeps it from campaigning with a term it inflated
/// alone (without Pre-Vote its higher term forces an election the moment it is heard again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_follower_rejoins_without_deposing_the_leader() -> Result {
    let mut c = TestCluster::three().await?;
    let (leader, term) = c.agreed_leader().await?;
    let follower = (1..=3).find(|id| *id != leader).ok_or("no follower")?;
    let mut acked = vec![c.publish(leader).await?];

    c.faults.isolate(follower, [1, 2, 3]);
    // Several election timeouts alone: it would have campaigned, and failed, many times.
    tokio::time::sleep(Duration::from_millis(6 * Timing::default().election_timeout_ms.1)).await;
    acked.push(c.publish(leader).await?);
    assert_eq!(c.node(leader).metrics().current_term, term, "the majority kept its term");
    c.faults.heal();

    // It catches up with the leader...
    let target = c.node(leader).metrics().last_applied.map(|l| l.index);
    c.wait(follower, "catches up", |n| n.metrics().last_applied.map(|l| l.index) >= target).await?;
    // ...and over a few more election timeouts nobody is deposed.
    tokio::time::sleep(Duration::from_millis(3 * Timing::default().election_timeout_ms.1)).await;
    assert_eq!(c.agreed_leader().await?, (leader, term), "the healthy leader kept its term");
    acked.push(c.publish(follower).await?);
    for id in 1..=3 {
        c.holds(id, &acked).await?;
    }
    c.stop_all().await;
    Ok(())
}

/// A leader that is stopped hands leadership to a caught-up voter first: the other nodes
/// serve writes again without waiting out an election timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_hands_over_without_an_election_timeout() -> Result {
    let mut c = TestCluster::three().await?;
    let (leader, term) = c.agreed_leader().await?;
    let mut acked = vec![c.publish(leader).await?];

    let started = Instant::now();
    c.stop(leader).await;
    let (new_leader, new_term) = c.agreed_leader().await?;
    let survivor = (1..=3).find(|id| *id != leader).ok_or("no survivor")?;
    acked.push(c.publish(survivor).await?);
    let gap = started.elapsed();
    assert_ne!(new_leader, leader);
    assert!(new_term > term);
    // Without a hand-over the survivors would first wait out an election timeout (at least
    // 400 ms) for heartbeats that never come; with it, one round of votes suffices.
    assert!(
        gap < Duration::from_millis(Timing::default().election_timeout_ms.0),
        "a write was possible again only {gap:?} after the stop"
    );
    for id in (1..=3).filter(|id| *id != leader) {
        c.holds(id, &acked).await?;
    }
    c.stop_all().await;
    Ok(())
}

/// A follower stops promptly under a live leader. The leader keeps its replication stream to
/// the follower open while it has nothing to send, and the server's graceful shutdown waits
/// for open calls: the stream must end when the node stops, not when the leader next writes
/// (in an idle cluster, never; the stop would then give up on its server after its join
/// timeout of seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_stops_promptly_while_its_leader_streams_to_it() -> Result {
    let mut c = TestCluster::three().await?;
    let (leader, _) = c.agreed_leader().await?;
    let follower = (1..=3).find(|id| *id != leader).ok_or("no follower")?;
    let acked = vec![c.publish(leader).await?];
    // Every follower has applied the leader's last entry, so it has also heard the commit:
    // the leader has nothing more to send, and its streams are idle.
    let last = c.node(leader).metrics().last_log_index;
    for id in 1..=3 {
        c.wait(id, "applies everything", |n| n.metrics().last_applied.map(|l| l.index) >= last)
            .await?;
    }
    let started = Instant::now();
    c.stop(follower).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "stopping a follower took {took:?}");
    c.holds(leader, &acked).await?;
    c.stop_all().await;
    Ok(())
}

/// A node stopped on purpose leaves its applied state on disk although the state machine's
/// writes skip RocksDB's WAL, and even while something still holds its database open (which
/// keeps RocksDB from flushing at close): its files, copied after the stop, say it applied
/// everything it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_node_leaves_what_it_applied_on_disk() -> Result {
    use openraft::storage::RaftStateMachine;
    let mut c = TestCluster::three().await?;
    let (leader, _) = c.agreed_leader().await?;
    let follower = (1..=3).find(|id| *id != leader).ok_or("no follower")?;
    for _ in 0..3 {
        c.publish(leader).await?;
    }
    let last = c.node(leader).metrics().last_log_index;
    c.wait(follower, "applies everything", |n| n.metrics().last_applied.map(|l| l.index) >= last)
        .await?;
    let applied = c.node(follower).metrics().last_applied.map(|l| l.index);
    let held = c.node(follower).reader().clone();
    c.stop(follower).await;
    let copy = tempfile::tempdir()?;
    let from = c.dirs[follower as usize - 1].path().join(".");
    let copied = std::process::Command::new("cp").arg("-a").arg(from).arg(copy.path()).status()?;
    assert!(copied.success(), "cp: {copied}");
    drop(held);
    let (_log, mut state) = delayd_store::Store::open(copy.path())?;
    let (on_disk, _) = state.applied_state().await?;
    assert_eq!(on_disk.map(|l| l.index), applied, "applied on disk after the stop");
    c.stop_all().await;
    Ok(())
}

/// The operator's transfer: to a named voter from any node, and refused for a non-voter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_moves_to_a_named_voter_on_request() -> Result {
    let mut c = TestCluster::three().await?;
    let (leader, _) = c.agreed_leader().await?;
    let to = (1..=3).find(|id| *id != leader).ok_or("no follower")?;
    let asker = (1..=3).find(|id| *id != leader && *id != to).ok_or("no third node")?;

    assert_eq!(c.node(asker).transfer_leader(Some(to)).await?, to);
    assert_eq!(c.agreed_leader().await?.0, to);
    let err = c.node(asker).transfer_leader(Some(9)).await.expect_err("9 is no voter");
    assert!(matches!(&err, ClusterError::BadRequest(m) if m.contains("not a voter")), "{err}");
    // Without a target, the leader picks one.
    let picked = c.node(asker).transfer_leader(None).await?;
    assert_ne!(picked, to);
    assert_eq!(c.agreed_leader().await?.0, picked);
    c.publish(asker).await?;
    c.stop_all().await;
    Ok(())
}

/// A follower that cannot reach the leader retries while nothing can have been written and
/// then says so; once the link heals, its writes go through, each exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_retries_only_while_nothing_was_written() -> Result {
    let mut c = TestCluster::three().await?;
    let (leader, term) = c.agreed_leader().await?;
    let follower = (1..=3).find(|id| *id != leader).ok_or("no follower")?;
    // Only the follower → leader link is cut: the leader still reaches it, so it stays a
    // healthy follower that knows the leader, and Raft does not notice.
    c.faults.cut(follower, leader);
    let err = c.publish(follower).await.expect_err("the leader is unreachable");
    assert!(
        matches!(&err, ClusterError::Unavailable(m) if m.contains("nothing was written")),
        "{err}"
    );
    c.faults.heal();
    let acked = vec![c.publish(follower).await?, c.publish(follower).await?];
    assert_eq!(c.agreed_leader().await?, (leader, term));
    let view = c.node(leader).read(false).await?;
    // The refused publish (job 1) was never written; the two acknowledged ones were, once.
    assert!(query::job(&view, &queue(), JobId(1))?.is_none());
    drop(view);
    c.holds(leader, &acked).await?;
    c.stop_all().await;
    Ok(())
}

/// An isolated leader loses its majority: the others elect a new one and keep writing, the
/// old one's proposals fail, and after healing it follows and holds every acknowledged job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_is_replaced_and_follows_after_healing() -> Result {
    let mut c = TestCluster::three().await?;
    let (old, term) = c.agreed_leader().await?;
    let mut acked = vec![c.publish(old).await?];
    c.faults.isolate(old, [1, 2, 3]);
    let survivor = (1..=3).find(|id| *id != old).ok_or("no survivor")?;
    c.wait(survivor, "a new leader", |n| {
        n.metrics().current_leader.is_some_and(|l| l != old) && n.metrics().current_term > term
    })
    .await?;
    acked.push(c.publish(survivor).await?);
    assert!(c.publish(old).await.is_err(), "an isolated leader cannot commit");
    c.faults.heal();
    c.wait(old, "follows", |n| n.metrics().state == ServerState::Follower).await?;
    for id in 1..=3 {
        c.holds(id, &acked).await?;
    }
    c.stop_all().await;
    Ok(())
}

/// Membership changes through any node: a voter is removed and the rest keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_is_removed_and_the_rest_keep_working() -> Result {
    let mut c = TestCluster::three().await?;
    let (leader, _) = c.agreed_leader().await?;
    let gone = (1..=3).find(|id| *id != leader).ok_or("no follower")?;
    let asker = (1..=3).find(|id| *id != leader && *id != gone).ok_or("no third node")?;
    let voters = c.node(asker).change_members(ForwardOp::Remove { id: gone }).await?;
    assert_eq!(voters, (1..=3).filter(|id| *id != gone).collect());
    c.stop(gone).await;
    let acked = vec![c.publish(asker).await?];
    c.holds(leader, &acked).await?;
    c.stop_all().await;
    Ok(())
}

/// A slow link between a follower and the leader slows the follower's forwarded writes by
/// about its delay, and loses nothing; the leader keeps its term (heartbeats still arrive
/// well within the election timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_link_slows_forwarding_but_loses_nothing() -> Result {
    let mut c = TestCluster::three().await?;
    let (leader, term) = c.agreed_leader().await?;
    let follower = (1..=3).find(|id| *id != leader).ok_or("no follower")?;
    let pause = Duration::from_millis(40);
    c.faults.slow(follower, leader, pause);
    let started = Instant::now();
    let acked = vec![c.publish(follower).await?, c.publish(follower).await?];
    // Each forwarded write waited for the link at least once.
    assert!(started.elapsed() >= pause * 2, "{:?}", started.elapsed());
    c.faults.heal();
    assert_eq!(c.agreed_leader().await?, (leader, term));
    for id in 1..=3 {
        c.holds(id, &acked).await?;
    }
    c.stop_all().await;
    Ok(())
}

/// Concurrent writes through a follower share `Forward` calls: while calls are in flight
/// (slowed here, so every write queues behind them) the rest wait in the relay and go
/// together. Every write is answered, in its own outcome, and held by every replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_concurrent_writes_share_forward_calls() -> Result {
    let mut c = TestCluster::three().await?;
    let (leader, _) = c.agreed_leader().await?;
    let follower = (1..=3).find(|id| *id != leader).ok_or("no follower")?;
    c.faults.slow(follower, leader, Duration::from_millis(30));
    let before = c.node(follower).relay_stats();
    const WRITES: u64 = 200;
    let jobs: Vec<NewJob> = (0..WRITES)
        .map(|_| {
            c.next_job += 1;
            new_job(JobId(c.next_job))
        })
        .collect();
    let node = c.node(follower).clone();
    let answers = futures::future::join_all(jobs.iter().map(|job| {
        let node = node.clone();
        let command = Command::Publish { queue: queue(), job: job.clone() };
        async move { node.propose(vec![command]).await }
    }))
    .await;
    let mut acked = Vec::new();
    for (job, answer) in jobs.iter().zip(answers) {
        match &answer?[..] {
            [Outcome::Ok(Reply::Published { id, .. })] => {
                assert_eq!(*id, job.id, "each write gets its own outcome");
                acked.push(*id);
            }
            other => return Err(format!("unexpected outcome {other:?}").into()),
        }
    }
    let sent = c.node(follower).relay_stats();
    let (calls, ops) = (sent.calls - before.calls, sent.ops - before.ops);
    assert_eq!(ops, WRITES, "every write went through the relay once");
    // One call per write would be 200; four in flight at 30 ms each leave the rest queued.
    assert!(calls <= WRITES / 4, "{calls} calls for {WRITES} writes");
    c.faults.heal();
    for id in 1..=3 {
        c.holds(id, &acked).await?;
    }
    c.stop_all().await;
    Ok(())
}

/// A reserve that finds nothing ready is answered by the leader without a log entry, also
/// when it came through a follower; one that finds a job goes through the log as before, and
/// once the queue is drained again, so are idle reserves (the leader's hint that the queue
/// had a job is gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_reserve_costs_no_log_entry() -> Result {
    let mut c = TestCluster::three().await?;
    let (leader, _) = c.agreed_leader().await?;
    let follower = (1..=3).find(|id| *id != leader).ok_or("no follower")?;
    // Leased for an hour: no lease runs out (and no tick is written) while the test runs.
    let reserve = || Command::Reserve {
        queues: vec![queue()],
        count: 1,
        ttr_ms: Some(3_600_000),
        lease_seed: 7,
    };
    let last_log = |c: &TestCluster| c.node(leader).metrics().last_log_index;
    let before = last_log(&c);
    for via in [leader, follower] {
        match &c.node(via).propose(vec![reserve()]).await?[..] {
            [Outcome::Ok(Reply::Reserved(got))] => assert!(got.is_empty(), "{got:?}"),
            other => return Err(format!("unexpected outcome {other:?}").into()),
        }
    }
    assert_eq!(last_log(&c), before, "idle reserves wrote nothing");
    c.next_job += 1;
    let mut job = new_job(JobId(c.next_job));
    job.due = Due::After(0);
    c.node(leader).propose(vec![Command::Publish { queue: queue(), job }]).await?;
    match &c.node(follower).propose(vec![reserve()]).await?[..] {
        [Outcome::Ok(Reply::Reserved(got))] => {
            assert_eq!(got.iter().map(|d| d.job.id).collect::<Vec<_>>(), [JobId(c.next_job)]);
        }
        other => return Err(format!("unexpected outcome {other:?}").into()),
    }
    // The leader's hints heard of the drain before its client did: the next idle reserve
    // is answered without an entry.
    let before = last_log(&c);
    match &c.node(leader).propose(vec![reserve()]).await?[..] {
        [Outcome::Ok(Reply::Reserved(got))] => assert!(got.is_empty(), "{got:?}"),
        other => return Err(format!("unexpected outcome {other:?}").into()),
    }
    assert_eq!(last_log(&c), before, "an idle reserve of a drained queue wrote nothing");
    c.stop_all().await;
    Ok(())
}

/// The apply listener hears of a batch before the batch's clients are answered, whether the
/// batch is applied on the state machine's task (a small one) or on the blocking pool (a large
/// one): what a node keeps from it, such as a leader's hints of which queues have a job, is
/// never behind what a client has been told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_hears_of_a_batch_before_its_clients_are_answered() -> Result {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    /// Takes its time over every batch that published something, then counts it. The wait
    /// hands its worker's queue to another thread (`block_in_place`), so a client woken
    /// before the listener was called could run meanwhile and see the count unchanged.
    struct Slow(Arc<AtomicUsize>);
    impl Observer for Slow {
        fn applied(&self, effects: &Effects) {
            if effects.events.values().any(|e| e.published > 0) {
                tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(100)));
                self.0.fetch_add(1, SeqCst);
            }
        }
        fn replaced(&self) {}
    }
    let told = Arc::new(AtomicUsize::new(0));
    let (dir, faults) = (tempfile::tempdir()?, Arc::new(Faults::default()));
    let observer = Arc::new(Slow(told.clone()));
    let config = config(1, &dir, &faults, false);
    let node = start_observed(config, observer, ReplicationMetrics::default()).await?;
    wait_for(&node, "node 1 leads", Cluster::is_leader).await?;
    let mut next = 0u128;
    // One publish is applied inline; 200 in one entry are more than the store applies inline
    // (64 commands), so they go to the blocking pool.
    for (batch, jobs) in [1, 200].into_iter().enumerate() {
        let commands = (0..jobs)
            .map(|_| {
                next += 1;
                Command::Publish { queue: queue(), job: new_job(JobId(next)) }
            })
            .collect();
        let outcomes = node.propose(commands).await?;
        assert!(outcomes.iter().all(|o| matches!(o, Ok(Reply::Published { .. }))), "{outcomes:?}");
        let seen = told.load(SeqCst);
        assert!(seen > batch, "batch {batch} answered before its listener was done ({seen} told)");
    }
    node.shutdown().await;
    Ok(())
}

/// An ack proposed for its commit only is answered once its entry is committed, while the
/// entry is still being applied; what it did is there for the next linearizable read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_proposed_for_its_commit_is_answered_before_it_is_applied() -> Result {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::{mpsc, Mutex};
    /// Holds the apply of every batch that acked something until told to go on, then
    /// counts it.
    struct Gate {
        go: Mutex<mpsc::Receiver<()>>,
        acks_applied: Arc<AtomicUsize>,
    }
    impl Observer for Gate {
        fn applied(&self, effects: &Effects) {
            if effects.events.values().any(|e| e.acked > 0) {
                let go = self.go.lock().expect("gate");
                let _ = tokio::task::block_in_place(|| go.recv_timeout(WAIT));
                self.acks_applied.fetch_add(1, SeqCst);
            }
        }
        fn replaced(&self) {}
    }
    let (go, gate) = mpsc::channel();
    let acks_applied = Arc::new(AtomicUsize::new(0));
    let observer = Arc::new(Gate { go: Mutex::new(gate), acks_applied: acks_applied.clone() });
    let (dir, faults) = (tempfile::tempdir()?, Arc::new(Faults::default()));
    let node =
        start_observed(config(1, &dir, &faults, false), observer, Default::default()).await?;
    wait_for(&node, "node 1 leads", Cluster::is_leader).await?;
    let id = JobId(7);
    node.propose(vec![Command::Publish { queue: queue(), job: new_job(id) }]).await?;

    node.propose_committed(vec![Command::Ack { queue: queue(), id, lease: None }]).await?;
    assert_eq!(acks_applied.load(SeqCst), 0, "answered only after the ack was applied");
    go.send(())?;
    let view = node.read(false).await?;
    assert!(query::job(&view, &queue(), id)?.is_none(), "the ack was not applied");
    assert_eq!(acks_applied.load(SeqCst), 1);
    drop(view);
    node.shutdown().await;
    Ok(())
}

/// Through a follower, an ack proposed for its commit goes to the leader like any write and
/// is answered once applied there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_proposed_for_its_commit_on_a_follower_is_forwarded() -> Result {
    let mut c = TestCluster::three().await?;
    let (leader, _) = c.agreed_leader().await?;
    let follower = (1..=3).find(|&id| id != leader).ok_or("no follower")?;
    let id = c.publish(follower).await?;
    let ack = Command::Ack { queue: queue(), id, lease: None };
    c.node(follower).propose_committed(vec![ack]).await?;
    for node in 1..=3 {
        let view = c.node(node).read(false).await?;
        assert!(query::job(&view, &queue(), id)?.is_none(), "node {node} still holds the job");
    }
    c.stop_all().await;
    Ok(())
}

/// The leader counts what replication puts on the wire: every entry reaches both followers,
/// and under a steady stream of writes commit-only requests ride on the entries after them.
/// Its proposer counts the entries it packs and the requests they carry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_counts_requests_entries_and_folded_commits() -> Result {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let mut c = TestCluster::three().await?;
    let (leader, _) = c.agreed_leader().await?;
    let counters = c.replication[leader as usize - 1].clone();
    let followers: Vec<(u64, ReplicationMetrics)> = (1..=3)
        .filter(|id| *id != leader)
        .map(|id| (id, c.replication[id as usize - 1].clone()))
        .collect();
    let followers_before: Vec<u64> = followers.iter().map(|(_, m)| m.append_requests()).collect();
    let requests_before = counters.append_requests();
    let entries_before = counters.append_entries();
    let folded_before = counters.commits_folded();
    let (proposed_before, carried_before, commands_before, timed_before) = (
        counters.proposed_entries(),
        counters.proposed_requests(),
        counters.proposed_commands(),
        counters.commits_timed(),
    );
    let first_index = c.node(leader).metrics().last_log_index.unwrap_or(0);
    // Eight writers in closed loops, as clients are: a commit is nearly always followed by
    // another entry within the fold's hold, so folding must show up.
    let (stop, written) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let writers: Vec<_> = (0..8u128)
        .map(|w| {
            let (node, stop, written) = (c.node(leader).clone(), stop.clone(), written.clone());
            tokio::spawn(async move {
                let mut acked = Vec::new();
                for n in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let id = JobId(1_000_000 * (w + 1) + n);
                    let publish = Command::Publish { queue: queue(), job: new_job(id) };
                    node.propose(vec![publish]).await?;
                    acked.push(id);
                    written.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, ClusterError>(acked)
            })
        })
        .collect();
    let deadline = Instant::now() + WAIT;
    while counters.commits_folded() == folded_before || written.load(Ordering::Relaxed) < 200 {
        if Instant::now() >= deadline {
            return Err(format!(
                "{} writes and {} folded commit-only requests within {WAIT:?}",
                written.load(Ordering::Relaxed),
                counters.commits_folded() - folded_before
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut acked = Vec::new();
    for writer in writers {
        acked.extend(writer.await??);
    }
    // Each entry appended since the start goes to both followers (resends only add to the
    // count); the slower follower may still be receiving the last ones.
    let appended = c.node(leader).metrics().last_log_index.unwrap_or(0) - first_index;
    assert!(appended > 0);
    while counters.append_entries() - entries_before < 2 * appended {
        if Instant::now() >= deadline {
            return Err(format!(
                "{} entries sent for {appended} appended",
                counters.append_entries() - entries_before
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let requests = counters.append_requests() - requests_before;
    assert!(requests > 0, "no request counted for {appended} entries");
    // Followers send no AppendEntries while they follow, and propose nothing: every write
    // went through the leader's proposer.
    for ((id, m), before) in followers.iter().zip(followers_before) {
        assert_eq!(m.append_requests(), before, "node {id}");
        assert_eq!(m.proposed_entries(), 0, "node {id}");
    }
    // Every write is one request of one command; the timer pump's ticks may add a few more
    // (a tick may carry riders).
    let proposed = counters.proposed_entries() - proposed_before;
    let carried = counters.proposed_requests() - carried_before;
    assert!(carried >= acked.len() as u64, "{carried} requests counted for {} writes", acked.len());
    assert!(counters.proposed_commands() - commands_before >= carried);
    assert!((1..=appended).contains(&proposed), "{proposed} entries proposed, {appended} appended");
    // Eight closed-loop writers share entries: that is the proposer's purpose.
    assert!(carried > proposed, "{carried} requests in {proposed} entries");
    // Every entry the writers were answered by was timed (a tick may still be in flight).
    let timed = counters.commits_timed() - timed_before;
    assert!((1..=proposed).contains(&timed), "{timed} commits timed of {proposed} entries");
    for id in 1..=3 {
        c.holds(id, &acked).await?;
    }
    c.stop_all().await;
    Ok(())
}

/// A follower whose process is gone refuses connections at once. The leader retries it after
/// a backoff (50 ms doubling to 1 s), not in a loop: it used to redial about 6,000 times a
/// second, burning a core, because the refused dial failed before openraft's backoff ran.
/// The other follower keeps the cluster committing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_follower_is_retried_after_a_backoff_not_in_a_loop() -> Result {
    let mut c = TestCluster::three().await?;
    let (leader, _) = c.agreed_leader().await?;
    let down = (1..=3).find(|id| *id != leader).ok_or("no follower")?;
    let counters = c.replication[leader as usize - 1].clone();
    let before = counters.stream_failures();
    c.stop(down).await;
    // Replication to it breaks once there is something to send.
    let deadline = Instant::now() + WAIT;
    let mut n = 0u128;
    while counters.stream_failures() == before {
        if Instant::now() >= deadline {
            return Err(format!("no failed append stream to node {down} within {WAIT:?}").into());
        }
        n += 1;
        let publish = Command::Publish { queue: queue(), job: new_job(JobId(5_000_000 + n)) };
        c.node(leader).propose(vec![publish]).await?;
    }
    // From here every redial waits out the backoff: in one second at most a handful (50, 100,
    // 200, 400 ms ...), where the loop made thousands. 25 leaves room for replication being
    // restarted now and then; the point is the order of magnitude.
    let start = counters.stream_failures();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let redials = counters.stream_failures() - start;
    assert!(redials <= 25, "{redials} failed append streams to node {down} in one second");
    // And the cluster still commits with the other follower.
    let last = JobId(5_000_000 + n + 1);
    c.node(leader).propose(vec![Command::Publish { queue: queue(), job: new_job(last) }]).await?;
    c.holds(leader, &[last]).await?;
    c.stop_all().await;
    Ok(())
}

/// A leader just elected holds no lease until a quorum has answered it. Its first
/// linearizable reads wait for that answer instead of failing with "not enough for a
/// quorum" in a healthy cluster (a reserve finding nothing ready, on any node, is such a
/// read). Every message here takes 40 ms, so the new leader's first answer from a quorum
/// comes that long after its election, and the read below starts before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leaders_first_reads_wait_for_a_quorum_instead_of_failing() -> Result {
    let mut c = TestCluster::three().await?;
    let (leader, _) = c.agreed_leader().await?;
    let to = (1..=3).find(|id| *id != leader).ok_or("no follower")?;
    // Under the 75 ms time limit of a replication call, so every message still arrives.
    for (a, b) in [(1, 2), (1, 3), (2, 3)] {
        c.faults.slow(a, b, Duration::from_millis(40));
    }
    let read_at_once = async {
        c.wait(to, "leads", |n| n.is_leader()).await?;
        c.node(to).read(false).await.map(drop).map_err(|e| format!("its first read: {e}").into())
    };
    let (moved, read): (_, Result) =
        tokio::join!(c.node(leader).transfer_leader(Some(to)), read_at_once);
    assert_eq!(moved?, to);
    read?;
    c.faults.heal();
    c.stop_all().await;
    Ok(())
}
