//! A running delayd node: the Raft node, its store, the internal gRPC server and the
//! leader-side tasks, and the routing of every request to the node that can serve it.
//!
//! Writes go to the local proposer when this node leads and are forwarded to the leader
//! otherwise (one hop, over the internal service's cached channels). A retry happens only when
//! the request certainly was not proposed — the leader was unknown or unreachable, or the
//! node asked was not the leader — so a retry can never apply a write twice. Anything
//! ambiguous (a timeout after sending) is reported as such.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher;
use std::sync::Arc;
use std::time::Duration;

use delayd_core::{codec, Cf, Command, KvRead, Outcome};
use delayd_store::{Raft, StateReader, Store};
use openraft::error::{CheckIsLeaderError, ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, ChangeMembers, ServerState};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::clock::Clock;
use crate::config::Config;
use crate::error::ServiceError;
use crate::forward::{ForwardOp, ForwardReply, NodeStatus, WireError};
use crate::metrics::Metrics;
use crate::network::{ForwardError, GrpcNetwork};
use crate::propose::{Proposer, ProposerConfig};
use crate::pump::{self, PumpSignal};
use crate::waiters::Waiters;

/// A started node. Cheap to clone; every clone is the same node.
#[derive(Clone)]
pub struct Node {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) clock: Clock,
    pub(crate) config: Config,
    pub(crate) raft: Raft,
    pub(crate) reader: StateReader,
    pub(crate) proposer: Proposer,
    pub(crate) waiters: Arc<Waiters>,
    pub(crate) auth: Arc<crate::auth::Auth>,
    pub(crate) metrics: Arc<Metrics>,
    network: GrpcNetwork,
    shutdown: watch::Sender<bool>,
}

fn raft_config(c: &Config) -> Result<openraft::Config, ServiceError> {
    let config = openraft::Config {
        cluster_name: "delayd".into(),
        heartbeat_interval: c.heartbeat_ms,
        election_timeout_min: c.election_timeout_ms.0,
        election_timeout_max: c.election_timeout_ms.1,
        // openraft answers the last snapshot chunk only after installing the whole snapshot,
        // so this bounds the install, not one chunk: a 1M-job install takes seconds.
        install_snapshot_timeout: 120_000,
        // Each AppendEntries must be received, decoded and fsynced within one heartbeat
        // interval; a catching-up follower gets small batches rather than timing out forever.
        max_payload_entries: 32,
        snapshot_max_chunk_size: 4 * 1024 * 1024,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(c.snapshot_logs),
        max_in_snapshot_log_to_keep: c.keep_logs,
        ..Default::default()
    };
    config.validate().map_err(|e| ServiceError::Internal(format!("raft config: {e}")))
}

struct Handler(std::sync::Weak<Inner>);

#[tonic::async_trait]
impl crate::grpc::ForwardHandler for Handler {
    /// The node itself, so the gRPC port also serves the client API.
    fn node(&self) -> Option<Node> {
        self.0.upgrade().map(|inner| Node { inner })
    }

    fn cluster_secret(&self) -> Option<String> {
        self.0.upgrade()?.config.auth.cluster_secret().map(str::to_string)
    }

    async fn forward(&self, payload: Vec<u8>) -> Result<Vec<u8>, tonic::Status> {
        let inner = self.0.upgrade().ok_or_else(|| tonic::Status::unavailable("shutting down"))?;
        let op: ForwardOp = codec::decode(&payload)
            .map_err(|e| tonic::Status::invalid_argument(format!("bad forward payload: {e}")))?;
        let node = Node { inner };
        let reply = match node.serve_forwarded(op).await {
            Ok(r) => r,
            Err(e) => ForwardReply::Failed(WireError::from(&e)),
        };
        Ok(codec::encode(&reply))
    }
}

impl Node {
    /// Opens the store under `config.data_dir`, starts Raft and the internal gRPC server on
    /// `config.grpc_addr`, and forms the cluster on first start (a restart finds it formed; a
    /// `join` node waits to be added).
    pub async fn start(mut config: Config) -> Result<Node, ServiceError> {
        config.validate().map_err(ServiceError::BadRequest)?;
        if !config.auth.dev && config.auth.admin_token.is_none() {
            // Peers authenticate each other with the admin token; without one (and without
            // dev) nothing could be administered and no peer could join. (The binary always
            // has one: configured, or generated into the data directory.)
            return Err(ServiceError::BadRequest(
                "set an admin token, or dev for no authentication at all".into(),
            ));
        }
        let grpc = tokio::net::TcpListener::bind(config.grpc_addr).await.map_err(|e| {
            ServiceError::Unavailable(format!("cannot listen on {}: {e}", config.grpc_addr))
        })?;
        // Port 0 (tests): advertise the port the OS chose.
        if config.grpc_addr.port() == 0 && config.advertise_addr.is_none() {
            if let Ok(local) = grpc.local_addr() {
                config.grpc_addr = local;
            }
        }
        std::fs::create_dir_all(&config.data_dir).map_err(|e| {
            ServiceError::Internal(format!("cannot create {}: {e}", config.data_dir.display()))
        })?;
        let metrics = Arc::new(
            Metrics::new(delayd_store::StoreMetrics::default())
                .map_err(|e| ServiceError::Internal(format!("metrics: {e}")))?,
        );
        let dir = config.data_dir.clone();
        let store_metrics = metrics.store().clone();
        let (log, sm) =
            tokio::task::spawn_blocking(move || Store::open_with_metrics(&dir, store_metrics))
                .await
                .map_err(|e| ServiceError::Internal(e.to_string()))??;
        let reader = sm.reader();
        // Peers prove they belong to the cluster with the shared admin token.
        let network = match config.auth.cluster_secret() {
            Some(secret) => GrpcNetwork::with_secret(secret).map_err(ServiceError::BadRequest)?,
            None => GrpcNetwork::new(),
        };
        let raft =
            Raft::new(config.node_id, Arc::new(raft_config(&config)?), network.clone(), log, sm)
                .await
                .map_err(|e| ServiceError::Internal(format!("raft: {e}")))?;

        let waiters = Arc::new(Waiters::default());
        let auth = Arc::new(crate::auth::Auth::default());
        let signal = Arc::new(PumpSignal::default());
        {
            let (waiters, signal, metrics) = (waiters.clone(), signal.clone(), metrics.clone());
            let auth = auth.clone();
            reader.set_listener(Arc::new(move |effects: &delayd_core::Effects| {
                waiters.wake(&effects.ready_queues);
                for token in &effects.deleted_tokens {
                    auth.forget(token);
                }
                metrics.record_applied(effects);
                if let Some(t) = effects.earliest_timer_ms {
                    signal.timer_added(t);
                }
            }));
        }

        let clock = Clock::default();
        let proposer = Proposer::spawn(
            raft.clone(),
            clock.clone(),
            ProposerConfig {
                max_batch: config.max_batch,
                max_entry_bytes: config.max_entry_bytes,
                max_in_flight: config.max_in_flight,
                linger: config.batch_linger,
                timeout: config.request_timeout,
            },
        );
        let (shutdown, shutdown_rx) = watch::channel(false);
        let inner = Arc::new(Inner {
            auth,
            config,
            raft: raft.clone(),
            reader: reader.clone(),
            proposer: proposer.clone(),
            clock: clock.clone(),
            waiters: waiters.clone(),
            metrics: metrics.clone(),
            network,
            shutdown,
        });

        let handler = Arc::new(Handler(Arc::downgrade(&inner)));
        let mut grpc_shutdown = shutdown_rx.clone();
        tokio::spawn(async move {
            let stop = async move {
                let _ = grpc_shutdown.wait_for(|s| *s).await;
            };
            if let Err(e) = crate::grpc::serve(grpc, raft, handler, stop).await {
                tracing::error!(error = %e, "internal gRPC server stopped");
            }
        });
        tokio::spawn(crate::metrics::watch_leader(
            inner.raft.clone(),
            metrics,
            shutdown_rx.clone(),
        ));
        tokio::spawn(watch_snapshots(
            inner.raft.clone(),
            waiters,
            signal.clone(),
            shutdown_rx.clone(),
        ));
        tokio::spawn(pump::run(
            inner.raft.clone(),
            reader,
            proposer,
            clock,
            signal,
            inner.config.tick_limit,
            shutdown_rx,
        ));

        let node = Node { inner };
        node.form_cluster().await?;
        tracing::info!(
            node_id = node.inner.config.node_id,
            grpc = %node.inner.config.advertised(),
            data_dir = %node.inner.config.data_dir.display(),
            "node started"
        );
        Ok(node)
    }

    async fn form_cluster(&self) -> Result<(), ServiceError> {
        let c = &self.inner.config;
        let raft = &self.inner.raft;
        let initialized =
            raft.is_initialized().await.map_err(|e| ServiceError::Internal(e.to_string()))?;
        if initialized || c.join {
            return Ok(());
        }
        let members: BTreeMap<u64, BasicNode> = if c.initial_members.is_empty() {
            BTreeMap::from([(c.node_id, BasicNode::new(c.advertised()))])
        } else {
            c.initial_members.iter().map(|(id, a)| (*id, BasicNode::new(a.clone()))).collect()
        };
        // Every founding node proposes the same membership: whichever wins the first
        // election commits it, and the others' attempts are refused as NotAllowed.
        match raft.initialize(members).await {
            Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(ServiceError::Internal(format!("initialize: {e}"))),
        }
    }

    /// The node's configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The node's wall clock (the one that stamps entries when this node leads).
    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// The node's Prometheus metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The openraft handle (for metrics and administration).
    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    /// Stops the pump, the gRPC server and Raft. Acknowledged writes are already durable.
    pub async fn shutdown(&self) {
        let _ = self.inner.shutdown.send(true);
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
    }

    /// Whether this node currently leads.
    pub fn is_leader(&self) -> bool {
        self.inner.raft.metrics().borrow().current_leader == Some(self.inner.config.node_id)
    }

    fn leader(&self) -> Option<(u64, Option<String>)> {
        // On every forwarded request: borrow the metrics, don't clone them.
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow();
        let leader = m.current_leader?;
        let addr = m.membership_config.membership().get_node(&leader).map(|n| n.addr.clone());
        Some((leader, addr))
    }

    /// Sends `op` to the leader (itself included) until it is served or `deadline` passes,
    /// retrying only while nothing can have been applied.
    async fn on_leader(
        &self,
        op: ForwardOp,
        deadline: Instant,
    ) -> Result<ForwardReply, ServiceError> {
        let me = self.inner.config.node_id;
        let mut metrics = self.inner.raft.metrics();
        loop {
            let attempt = match self.leader() {
                Some((leader, _)) if leader == me => match self.serve_forwarded(op.clone()).await {
                    Err(e @ ServiceError::NotLeader(_)) => Try::Retry(e),
                    r => Try::Done(r),
                },
                Some((leader, Some(addr))) => {
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    match self.inner.network.forward(&addr, codec::encode(&op), remaining).await {
                        Ok(bytes) => match codec::decode::<ForwardReply>(&bytes)? {
                            ForwardReply::Failed(w) => match ServiceError::from(w) {
                                e @ ServiceError::NotLeader(_) => Try::Retry(e),
                                e => Try::Done(Err(e)),
                            },
                            reply => Try::Done(Ok(reply)),
                        },
                        // Never sent: safe to try again.
                        Err(ForwardError::Unreachable(e)) => Try::Retry(ServiceError::Unavailable(
                            format!("leader {leader} unreachable: {e}"),
                        )),
                        Err(ForwardError::Status(s)) => {
                            Try::Done(Err(ServiceError::Unavailable(format!(
                                "forwarding to leader {leader} failed, outcome unknown: {}",
                                s.message()
                            ))))
                        }
                    }
                }
                _ => Try::Retry(ServiceError::NotLeader(None)),
            };
            match attempt {
                Try::Done(r) => return r,
                Try::Retry(e) => {
                    if Instant::now() >= deadline {
                        return Err(ServiceError::Unavailable(format!(
                            "no leader could serve the request in time, nothing was written ({e})"
                        )));
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                        _ = metrics.changed() => {}
                        _ = tokio::time::sleep_until(deadline) => {}
                    }
                }
            }
        }
    }

    /// Serves an operation that must run on the leader; `NotLeader` when this node is not.
    async fn serve_forwarded(&self, op: ForwardOp) -> Result<ForwardReply, ServiceError> {
        let raft = &self.inner.raft;
        match op {
            ForwardOp::Propose(commands) => {
                Ok(ForwardReply::Outcomes(self.inner.proposer.propose(commands).await?))
            }
            ForwardOp::ReadIndex => match raft.ensure_linearizable().await {
                Ok(log_id) => Ok(ForwardReply::ReadIndex(log_id.map(|l| l.index))),
                Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                    Err(ServiceError::NotLeader(f.leader_id))
                }
                Err(e) => Err(ServiceError::Unavailable(e.to_string())),
            },
            ForwardOp::AddLearner { id, addr } => {
                raft.add_learner(id, BasicNode::new(addr), true).await.map_err(membership_error)?;
                Ok(ForwardReply::Members(self.voters()))
            }
            ForwardOp::Promote { id } => {
                let change = ChangeMembers::AddVoterIds(BTreeSet::from([id]));
                raft.change_membership(change, false).await.map_err(membership_error)?;
                Ok(ForwardReply::Members(self.voters()))
            }
            ForwardOp::Remove { id } => {
                let change = if self.voters().contains(&id) {
                    ChangeMembers::RemoveVoters(BTreeSet::from([id]))
                } else {
                    ChangeMembers::RemoveNodes(BTreeSet::from([id]))
                };
                raft.change_membership(change, false).await.map_err(membership_error)?;
                Ok(ForwardReply::Members(self.voters()))
            }
            ForwardOp::Status => Ok(ForwardReply::Status(self.status())),
        }
    }

    fn voters(&self) -> BTreeSet<u64> {
        let m = self.inner.raft.metrics().borrow().clone();
        m.membership_config.membership().voter_ids().collect()
    }

    /// Proposes commands atomically on the leader, bounded by the request timeout.
    pub(crate) async fn propose(
        &self,
        commands: Vec<Command>,
    ) -> Result<Vec<Outcome>, ServiceError> {
        let deadline = Instant::now() + self.inner.config.request_timeout;
        let op = ForwardOp::Propose(commands);
        let fut = self.on_leader(op, deadline);
        match tokio::time::timeout_at(deadline, fut).await {
            Ok(Ok(ForwardReply::Outcomes(o))) => Ok(o),
            Ok(Ok(other)) => Err(ServiceError::Internal(format!("unexpected reply {other:?}"))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ServiceError::Unavailable(format!(
                "not committed within {:?}; the outcome is unknown",
                self.inner.config.request_timeout
            ))),
        }
    }

    /// Waits until the local replica has applied everything the leader had committed when
    /// asked (the read-index protocol), so a local read is linearizable.
    pub(crate) async fn read_barrier(&self) -> Result<(), ServiceError> {
        let timeout = self.inner.config.request_timeout;
        let deadline = Instant::now() + timeout;
        let index =
            match tokio::time::timeout_at(deadline, self.on_leader(ForwardOp::ReadIndex, deadline))
                .await
            {
                Ok(Ok(ForwardReply::ReadIndex(i))) => i,
                Ok(Ok(other)) => {
                    return Err(ServiceError::Internal(format!("unexpected reply {other:?}")))
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(ServiceError::Unavailable(
                        "no quorum for a linearizable read".into(),
                    ))
                }
            };
        let remaining = deadline.saturating_duration_since(Instant::now());
        self.inner
            .raft
            .wait(Some(remaining))
            .applied_index_at_least(index, "read index")
            .await
            .map_err(|e| ServiceError::Unavailable(format!("replica did not catch up: {e}")))?;
        Ok(())
    }

    /// Runs a membership operation on the leader.
    pub async fn change_members(&self, op: ForwardOp) -> Result<BTreeSet<u64>, ServiceError> {
        // Adding a learner waits for it to catch up, which may take a snapshot transfer.
        let deadline =
            Instant::now() + self.inner.config.request_timeout.max(Duration::from_secs(60));
        match self.on_leader(op, deadline).await? {
            ForwardReply::Members(m) => Ok(m),
            other => Err(ServiceError::Internal(format!("unexpected reply {other:?}"))),
        }
    }

    /// This node's own view.
    pub fn status(&self) -> NodeStatus {
        let m = self.inner.raft.metrics().borrow().clone();
        NodeStatus {
            id: m.id,
            state: format!("{:?}", m.state),
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index,
            last_applied: m.last_applied.map(|l| l.index),
            snapshot: m.snapshot.map(|l| l.index),
            purged: m.purged.map(|l| l.index),
        }
    }

    /// Asks a member for its view over the internal service.
    pub async fn peer_status(&self, addr: &str) -> Result<NodeStatus, ServiceError> {
        let bytes = self
            .inner
            .network
            .forward(addr, codec::encode(&ForwardOp::Status), Duration::from_millis(500))
            .await
            .map_err(|e| ServiceError::Unavailable(e.to_string()))?;
        match codec::decode::<ForwardReply>(&bytes)? {
            ForwardReply::Status(s) => Ok(s),
            other => Err(ServiceError::Internal(format!("unexpected reply {other:?}"))),
        }
    }

    /// Triggers a snapshot of this node's state machine.
    pub async fn snapshot(&self) -> Result<(), ServiceError> {
        self.inner
            .raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| ServiceError::Internal(e.to_string()))
    }

    /// A digest of the whole replicated state with the index it was taken at, read from one
    /// consistent view: replicas at the same index must have the same digest.
    pub fn digest(&self) -> Result<(Option<u64>, u64, u64), ServiceError> {
        let view = self.inner.reader.read_view()?;
        let applied = view.last_applied()?.map(|l| l.index);
        let mut hash = std::collections::hash_map::DefaultHasher::new();
        let mut entries = 0u64;
        for cf in Cf::ALL {
            view.scan(cf, &[], &[], &mut |k, v| {
                // The store's own bookkeeping (last applied, membership) is not job state.
                if !(cf == Cf::Meta && k.starts_with(b"raft/")) {
                    hash.write_u8(cf as u8);
                    hash.write_usize(k.len());
                    hash.write(k);
                    hash.write_usize(v.len());
                    hash.write(v);
                    entries += 1;
                }
                true
            })?;
        }
        Ok((applied, hash.finish(), entries))
    }
}

/// One attempt to reach the leader.
enum Try {
    /// Certainly not applied; may be retried.
    Retry(ServiceError),
    /// Served, or failed in a way a retry could make worse.
    Done(Result<ForwardReply, ServiceError>),
}

fn membership_error(e: RaftError<u64, ClientWriteError<u64, BasicNode>>) -> ServiceError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            ServiceError::NotLeader(f.leader_id)
        }
        // An invalid change (unknown learner, a change already in progress, ...).
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            ServiceError::BadRequest(e.to_string())
        }
        RaftError::Fatal(f) => ServiceError::Unavailable(f.to_string()),
    }
}

/// A snapshot installed from the leader replaces the state wholesale without going through
/// apply, so nothing reported which queues gained jobs or which deadlines moved: wake every
/// waiter and the pump to look again.
async fn watch_snapshots(
    raft: Raft,
    waiters: Arc<Waiters>,
    signal: Arc<PumpSignal>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut metrics = raft.metrics();
    let mut last = metrics.borrow().snapshot;
    loop {
        tokio::select! {
            r = metrics.changed() => if r.is_err() { return },
            _ = shutdown.changed() => return,
        }
        let (snapshot, state) = {
            let m = metrics.borrow();
            (m.snapshot, m.state)
        };
        if snapshot != last {
            last = snapshot;
            if state != ServerState::Leader {
                waiters.wake_all();
                signal.timer_added(0);
            }
        }
    }
}
