//! A running cluster node: the Raft node over its store, the internal gRPC server, the
//! leader-side tasks, and the routing of every operation to the node that can perform it.
//!
//! Writes go to the local proposer when this node leads and are forwarded to the leader
//! otherwise (one hop, over the internal service's cached channels). A retry happens only when
//! the request certainly was not proposed — the leader was unknown or unreachable, or the
//! node asked was not the leader — so a retry can never apply a write twice. Anything
//! ambiguous (a timeout after sending) is reported as such.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use delayd_core::{codec, Command, Effects, Outcome};
use delayd_store::{
    EncodedEntries, NodeId, Raft, ReadView, SnapshotInbox, StateReader, Store, StoreMetrics,
    TypeConfig,
};
use futures::FutureExt;
use openraft::async_runtime::watch::WatchReceiver;
use openraft::error::{InitializeError, LinearizableReadError, RaftError};
use openraft::{
    BasicNode, ChangeMembers, Instant as _, LinearizerOption, RaftMetrics, ReadPolicy, ServerState,
};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::service::Routes;

use crate::clock::Clock;
use crate::config::ClusterConfig;
use crate::error::ClusterError;
use crate::forward::{ForwardOp, ForwardReply, NodeStatus};
use crate::identity::Identity;
use crate::log_bound;
use crate::metrics::ReplicationMetrics;
use crate::network::{ForwardError, GrpcNetwork, MAX_MESSAGE_BYTES};
use crate::propose::Proposer;
use crate::pump::{self, PumpSignal};
use crate::relay::{Relay, RelayStats};
use crate::reservable::Reservable;
use crate::riders::Riders;
use crate::server::{self, ForwardHandler, LeaderContact, Services};

/// What the node's owner wants to hear about the replicated state.
pub trait Observer: Send + Sync + 'static {
    /// An applied batch of entries had these effects. Called on the apply path, on whichever
    /// thread applied the batch (an async worker, or the blocking pool for a large batch),
    /// before the batch's clients are answered: be quick, don't block, don't panic (a panic
    /// stops the node).
    fn applied(&self, effects: &Effects);

    /// A snapshot from the leader replaced the whole state without going through apply, so
    /// nothing reported which queues gained jobs or which tokens went: look at everything again.
    fn replaced(&self);
}

/// A started cluster node. Cheap to clone; every clone is the same node.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    config: ClusterConfig,
    clock: Clock,
    raft: Raft,
    reader: StateReader,
    inbox: SnapshotInbox,
    /// The log's stored bytes of its latest entries, for replication both ways.
    encoded: EncodedEntries,
    proposer: Proposer,
    riders: Arc<Riders>,
    /// Wakes the timer pump to read the timer index again.
    pump: Arc<PumpSignal>,
    /// Queues with a job to hand out, as last applied here: spares a leader's reserve from a
    /// busy queue the look at the state for an idle answer.
    reservable: Arc<Reservable>,
    network: GrpcNetwork,
    relay: Relay,
    shutdown: watch::Sender<bool>,
    /// The background tasks, joined by [`Cluster::shutdown`].
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// The bound gRPC listener until [`Cluster::serve`] takes it.
    listener: Mutex<Option<TcpListener>>,
    /// When a leader's AppendEntries was last accepted here.
    contact: LeaderContact,
    /// The cluster's identity, when it has one.
    identity: Identity,
}

/// A watch of the node's Raft server state: [`Cluster::server_watch`].
pub type ServerWatch = openraft::type_config::alias::WatchReceiverOf<
    TypeConfig,
    openraft::metrics::RaftServerMetrics<TypeConfig>,
>;

/// The role `watch` shows, or `None` once Raft has stopped. A closed watch keeps the last role
/// it published, often the leader's, so a task that acted on the role alone would go on
/// leading a stopped node, for ever: the closed watch is looked for first.
pub fn role(watch: &mut ServerWatch) -> Option<ServerState> {
    if let Some(Err(_)) = watch.changed().now_or_never() {
        return None;
    }
    Some(watch.borrow_watched().state)
}

/// Waits until this node leads: `true` once it does, `false` once its Raft has stopped.
pub async fn until_leading(watch: &mut ServerWatch) -> bool {
    loop {
        match role(watch) {
            None => return false,
            Some(ServerState::Leader) => return true,
            Some(_) => {}
        }
        if watch.changed().await.is_err() {
            return false;
        }
    }
}

/// How long [`Cluster::shutdown`] waits for its tasks (the gRPC server waits for calls in
/// flight, such as a client's long poll) before it abandons them.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How long [`Cluster::shutdown`] waits for the applied state's flush before it logs that it
/// did not finish and goes on. Skipping the flush loses nothing (the next start re-applies
/// from the log what it did not write). A flush RocksDB has begun runs on in its background
/// thread, which RocksDB joins when the process exits: a disk too slow for the memtables
/// still holds the exit up, and a supervisor's kill then is as safe as a crash.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

fn raft_config(c: &ClusterConfig) -> Result<openraft::Config, ClusterError> {
    let t = c.timing;
    let config = openraft::Config {
        cluster_name: "delayd".into(),
        heartbeat_interval: t.heartbeat_ms,
        election_timeout_min: t.election_timeout_ms.0,
        election_timeout_max: t.election_timeout_ms.1,
        // A node that was cut off or paused asks before it campaigns, so it cannot depose a
        // healthy leader with the term it inflated while alone.
        enable_pre_vote: Some(true),
        // A leader that restarts wins an election before it leads again, never takes up its
        // old term where it left off. It replicates entries before its own write of them is
        // done, so the followers may have committed entries its log lost in the crash; leading
        // on in the same term, it would append other entries under those very log ids, which
        // the followers take for the ones they hold: the replicas' states part (seen in the
        // chaos harness after a kill of all three nodes). A new term makes the log ids new,
        // and the election takes the log of whoever holds the committed entries.
        enable_leader_restore: Some(false),
        // Covers sending and installing a whole snapshot: a 1M-job install takes seconds.
        install_snapshot_timeout: 120_000,
        // As many entries per AppendEntries as the transport's message surely holds when
        // every one is as large as allowed (openraft 0.10 cannot split a batch that is too
        // large), less one for the request's own fields, and at most 32: a catching-up
        // follower gets batches it can decode and fsync within the replication timeout.
        max_payload_entries: (MAX_MESSAGE_BYTES / c.proposer.max_entry_bytes.max(1))
            .saturating_sub(1)
            .clamp(1, 32) as u64,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(c.snapshot_logs),
        max_in_snapshot_log_to_keep: c.keep_logs,
        ..Default::default()
    };
    config.validate().map_err(|e| ClusterError::BadRequest(format!("raft config: {e}")))
}

/// Serves `Internal.Forward` for the node without keeping it alive.
struct Handler(Weak<Inner>);

#[tonic::async_trait]
impl ForwardHandler for Handler {
    async fn forward(&self, payload: Vec<u8>) -> Result<Vec<u8>, tonic::Status> {
        let inner = self.0.upgrade().ok_or_else(|| tonic::Status::unavailable("shutting down"))?;
        let op: ForwardOp = codec::decode(&payload)
            .map_err(|e| tonic::Status::invalid_argument(format!("bad forward payload: {e}")))?;
        let cluster = Cluster { inner };
        let reply = match cluster.serve_forwarded(op).await {
            Ok(r) => r,
            Err(e) => ForwardReply::Failed(e),
        };
        Ok(codec::encode(&reply))
    }
}

impl Cluster {
    /// Opens the store under `config.data_dir`, starts Raft, the proposer and the timer pump,
    /// and binds the gRPC listener; [`Cluster::serve`] then starts serving and forms the
    /// cluster. `observer` hears about every applied batch; the store records into
    /// `store_metrics`, the proposer and the transport into `replication_metrics`.
    pub async fn open(
        mut config: ClusterConfig,
        observer: Arc<dyn Observer>,
        store_metrics: StoreMetrics,
        replication_metrics: ReplicationMetrics,
    ) -> Result<Cluster, ClusterError> {
        config.validate().map_err(ClusterError::BadRequest)?;
        let listener = TcpListener::bind(config.grpc_addr).await.map_err(|e| {
            ClusterError::Unavailable(format!("cannot listen on {}: {e}", config.grpc_addr))
        })?;
        // Port 0 (tests): advertise the port the OS chose.
        if config.grpc_addr.port() == 0 && config.advertise_addr.is_none() {
            if let Ok(local) = listener.local_addr() {
                config.grpc_addr = local;
            }
        }
        std::fs::create_dir_all(&config.data_dir).map_err(|e| {
            ClusterError::Internal(format!("cannot create {}: {e}", config.data_dir.display()))
        })?;
        let dir = config.data_dir.clone();
        let node = config.node_id;
        let (log, sm) =
            tokio::task::spawn_blocking(move || Store::open_for_node(&dir, node, store_metrics))
                .await
                .map_err(|e| ClusterError::Internal(e.to_string()))??;
        let reader = sm.reader();
        let inbox = sm.inbox();
        let encoded = log.encoded_entries();
        let identity = Identity::load(log.cluster_ids())?;
        if let Some(id) = identity.get() {
            tracing::info!(cluster_id = %id, "cluster identity");
        }
        let network = GrpcNetwork::new(config.node_id, config.cluster_secret.as_deref())
            .map_err(ClusterError::BadRequest)?
            .with_filter(config.faults.clone())
            .with_tls(config.tls.clone())
            .with_identity(identity.clone())
            .with_metrics(replication_metrics.clone())
            .with_log(encoded.clone());
        let raft =
            Raft::new(config.node_id, Arc::new(raft_config(&config)?), network.clone(), log, sm)
                .await
                .map_err(|e| ClusterError::Internal(format!("raft: {e}")))?;

        let signal = Arc::new(PumpSignal::default());
        let reservable = Arc::new(Reservable::default());
        {
            let (observer, signal, reservable) =
                (observer.clone(), signal.clone(), reservable.clone());
            reader.set_listener(Arc::new(move |effects: &Effects| {
                // The hints first: the waiters the observer wakes reserve again, and should
                // find the queues they are woken for listed.
                reservable.applied(effects);
                observer.applied(effects);
                if let Some(t) = effects.earliest_timer_ms {
                    signal.timer_added(t);
                }
            }));
        }
        let clock = Clock::default();
        let riders = Arc::new(Riders::default());
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (proposer, proposer_task) = Proposer::spawn(
            raft.clone(),
            clock.clone(),
            config.proposer,
            replication_metrics.clone(),
            shutdown_rx.clone(),
        );
        let (relay, relay_task) =
            Relay::spawn(network.clone(), config.proposer.max_entry_bytes, shutdown_rx.clone());
        let tasks = vec![
            proposer_task,
            relay_task,
            tokio::spawn(watch_snapshots(
                raft.clone(),
                observer,
                signal.clone(),
                reservable.clone(),
                shutdown_rx.clone(),
            )),
            tokio::spawn(log_bound::run(
                raft.clone(),
                reader.clone(),
                config.snapshot_log_bytes,
                replication_metrics,
                shutdown_rx.clone(),
            )),
            tokio::spawn(pump::run(
                raft.clone(),
                reader.clone(),
                proposer.clone(),
                clock.clone(),
                signal.clone(),
                riders.clone(),
                config.tick_limit,
                shutdown_rx,
            )),
        ];
        Ok(Cluster {
            inner: Arc::new(Inner {
                config,
                clock,
                raft,
                reader,
                inbox,
                encoded,
                proposer,
                riders,
                pump: signal,
                reservable,
                network,
                relay,
                shutdown,
                tasks: Mutex::new(tasks),
                listener: Mutex::new(Some(listener)),
                contact: LeaderContact::default(),
                identity,
            }),
        })
    }

    /// Serves the internal services, and `extra` beside them, on the node's gRPC address until
    /// [`Cluster::shutdown`]; then forms the cluster on first start (a restart finds it
    /// formed; a `join` node waits to be added).
    pub async fn serve(&self, extra: Option<Routes>) -> Result<(), ClusterError> {
        let listener = self
            .inner
            .listener
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| ClusterError::Internal("the cluster is already serving".into()))?;
        let services = Services {
            raft: self.inner.raft.clone(),
            inbox: self.inner.inbox.clone(),
            forward: Arc::new(Handler(Arc::downgrade(&self.inner))),
            secret: self.inner.config.cluster_secret.clone(),
            previous_secrets: self.inner.config.previous_cluster_secrets.clone(),
            contact: self.inner.contact.clone(),
            peer_certs: self.inner.config.tls.as_ref().is_some_and(|t| t.peer_certs_required()),
            identity: self.inner.identity.clone(),
            stopping: self.inner.shutdown.subscribe(),
            log: Some(self.inner.encoded.clone()),
        };
        let routes = server::routes(services, extra);
        let stopped = {
            let mut stop = self.inner.shutdown.subscribe();
            move || async move {
                let _ = stop.wait_for(|s| *s).await;
            }
        };
        let tls = self.inner.config.tls.clone();
        let mut tasks = Vec::new();
        if let Some(tls) = &tls {
            tasks.push(tokio::spawn(tls.clone().watch(stopped.clone()())));
        }
        tasks.push(tokio::spawn(async move {
            if let Err(e) = server::serve_with_tls(listener, tls, routes, stopped()).await {
                tracing::error!(error = %e, "internal gRPC server stopped");
            }
        }));
        self.inner.tasks.lock().unwrap_or_else(PoisonError::into_inner).extend(tasks);
        self.form().await?;
        tracing::info!(
            node_id = self.inner.config.node_id,
            grpc = %self.inner.config.advertised(),
            data_dir = %self.inner.config.data_dir.display(),
            "cluster node serving"
        );
        Ok(())
    }

    async fn form(&self) -> Result<(), ClusterError> {
        let c = &self.inner.config;
        let raft = &self.inner.raft;
        let initialized =
            raft.is_initialized().await.map_err(|e| ClusterError::Internal(e.to_string()))?;
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
            Err(e) => Err(ClusterError::Internal(format!("initialize: {e}"))),
        }
    }

    /// If this node leads, hands leadership to the most caught-up voter and waits (at most
    /// the transfer timeout) until that voter leads, so the cluster does not wait out an
    /// election timeout when this node goes away. The node keeps running, as a follower.
    pub async fn step_down(&self) {
        if !self.is_leader() {
            return;
        }
        match self.hand_over(None).await {
            Ok(to) => tracing::info!(to, "handed leadership over"),
            // A single node, or no voter could take over in time: go on anyway.
            Err(e) => tracing::info!(reason = %e, "no leadership hand-over"),
        }
    }

    /// Stops the node: steps down first ([`Cluster::step_down`]), then the pump, the
    /// proposer, the gRPC server and Raft stop, and their tasks are joined. Acknowledged writes
    /// are already durable; last, the applied state is flushed so that the next start need not
    /// re-apply it.
    pub async fn shutdown(&self) {
        self.step_down().await;
        let _ = self.inner.shutdown.send(true);
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        let tasks =
            std::mem::take(&mut *self.inner.tasks.lock().unwrap_or_else(PoisonError::into_inner));
        let deadline = Instant::now() + JOIN_TIMEOUT;
        for task in tasks {
            let abort = task.abort_handle();
            if tokio::time::timeout_at(deadline, task).await.is_err() {
                tracing::warn!("a background task did not stop within {JOIN_TIMEOUT:?}; abandoned");
                abort.abort();
            }
        }
        // Raft has stopped: write what was applied to disk, so the next start does not
        // re-apply it from the log (applies skip RocksDB's WAL). openraft does not wait for
        // its state-machine worker, so an apply still queued may land after this flush; it
        // is then re-applied at the next start, and nothing is lost. RocksDB flushes such
        // writes when the database closes too, but only once every handle to it is dropped,
        // which a task abandoned above would prevent. Skipping both loses nothing; the next
        // start only re-applies more.
        let reader = self.inner.reader.clone();
        let started = Instant::now();
        match blocking_within(FLUSH_TIMEOUT, move || reader.flush()).await {
            Some(Ok(Ok(()))) => tracing::info!(took = ?started.elapsed(), "state flushed"),
            Some(failed) => tracing::warn!(outcome = ?failed, "state flush at shutdown failed"),
            None => tracing::warn!(
                "state flush did not finish within {FLUSH_TIMEOUT:?}; abandoned (the next \
                 start re-applies from the log what it did not write)"
            ),
        }
    }

    /// The node's configuration (with the advertised port filled in).
    pub fn config(&self) -> &ClusterConfig {
        &self.inner.config
    }

    /// The node's wall clock (the one that stamps entries when this node leads).
    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// Shifts this node's clock by `offset_ms` from the wall clock (test-only, see
    /// [`Clock::set_offset_ms`]) and wakes the timer pump, which may be sleeping towards a
    /// deadline the new time has already passed, or to one it has moved away from.
    pub fn shift_clock(&self, offset_ms: i64) {
        self.inner.clock.set_offset_ms(offset_ms);
        self.inner.pump.wake();
    }

    /// The openraft handle, for metrics.
    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    /// Watches this node's Raft role, leader, vote and membership; the watch closes when Raft
    /// stops. It never shows [`ServerState::Shutdown`]: read the role with [`role`], which
    /// tells a closed watch from the last role it published.
    ///
    /// Tasks that wait for a change of role (the pump, push, the scheduler, anything that
    /// must end with Raft) wait on this rather than on [`Raft::metrics`]: openraft publishes
    /// the full metrics on every turn of its loop, several times per log entry, and every
    /// task waiting on them wakes each time to find nothing it cares about changed. This one
    /// is published only when its contents change.
    pub fn server_watch(&self) -> ServerWatch {
        self.inner.raft.server_metrics()
    }

    /// Raft's current metrics.
    pub fn metrics(&self) -> RaftMetrics<TypeConfig> {
        self.inner.raft.metrics().borrow_watched().clone()
    }

    /// Whether this node currently leads.
    pub fn is_leader(&self) -> bool {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow_watched();
        m.state == ServerState::Leader && m.current_leader == Some(self.inner.config.node_id)
    }

    /// The leader this node knows of, with its address.
    pub fn leader(&self) -> Option<(NodeId, Option<String>)> {
        // On every forwarded request: borrow, don't clone. From the server state's watch,
        // which openraft publishes before the full metrics: a retry woken by it finds the
        // leader it announced.
        let server = self.inner.raft.server_metrics();
        let m = server.borrow_watched();
        let leader = m.current_leader?;
        let addr = m.membership_config.membership().get_node(&leader).map(|n| n.addr.clone());
        Some((leader, addr))
    }

    /// A view of the local replica. Unless `stale`, it first waits until the replica has
    /// applied everything the leader had committed when asked (the read-index protocol), so
    /// the view is linearizable; a stale view may lag the leader by a few entries.
    pub async fn read(&self, stale: bool) -> Result<ReadView<'_>, ClusterError> {
        if !stale {
            self.read_barrier().await?;
        }
        Ok(self.inner.reader.read_view()?)
    }

    /// How long ago this node last accepted a leader's AppendEntries (entries or a
    /// heartbeat); `None` before the first. On a follower, a value past the leader's lease
    /// means the leader it names may be gone.
    pub fn since_leader_contact(&self) -> Option<Duration> {
        self.inner.contact.elapsed()
    }

    /// Where a reserve parked on this node leaves its commands to ride the timer pump's
    /// next tick (taken only while this node leads).
    pub fn riders(&self) -> &Riders {
        &self.inner.riders
    }

    /// The replica's read handle (for reads that manage their own consistency).
    pub fn reader(&self) -> &StateReader {
        &self.inner.reader
    }

    /// Proposes `commands` atomically on the leader, wherever it is, and returns their
    /// outcomes once applied; bounded by the request timeout.
    pub async fn propose(&self, commands: Vec<Command>) -> Result<Vec<Outcome>, ClusterError> {
        let deadline = Instant::now() + self.inner.config.request_timeout;
        self.propose_until(commands, deadline).await
    }

    async fn propose_until(
        &self,
        commands: Vec<Command>,
        deadline: Instant,
    ) -> Result<Vec<Outcome>, ClusterError> {
        let fut = self.on_leader(ForwardOp::Propose(commands), deadline);
        match tokio::time::timeout_at(deadline, fut).await {
            Ok(Ok(ForwardReply::Outcomes(o))) => Ok(o),
            Ok(Ok(other)) => Err(ClusterError::Internal(format!("unexpected reply {other:?}"))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(self.outcome_unknown()),
        }
    }

    /// Proposes `commands` atomically, for a caller that does not need their outcomes (it
    /// answers the same whatever they are): on the leader, returns as soon as their entry is
    /// committed, without waiting for it to be applied ([`Proposer::propose_committed`]);
    /// elsewhere, or should this node lose the lead before the entry is appended, as
    /// [`Cluster::propose`] does. Bounded by the request timeout.
    pub async fn propose_committed(&self, commands: Vec<Command>) -> Result<(), ClusterError> {
        let deadline = Instant::now() + self.inner.config.request_timeout;
        let me = self.inner.config.node_id;
        if self.leader().is_some_and(|(leader, _)| leader == me) {
            // A copy for the one retry worth making: openraft refused the entry because this
            // node no longer leads, so nothing was appended and the new leader may take it.
            let here = self.inner.proposer.propose_committed(commands.clone());
            match tokio::time::timeout_at(deadline, here).await {
                Ok(Err(ClusterError::NotLeader(_))) => {}
                Ok(r) => return r,
                Err(_) => return Err(self.outcome_unknown()),
            }
        }
        self.propose_until(commands, deadline).await.map(drop)
    }

    fn outcome_unknown(&self) -> ClusterError {
        let timeout = self.inner.config.request_timeout;
        ClusterError::Unavailable(format!(
            "not committed within {timeout:?}; the outcome is unknown"
        ))
    }

    /// Waits until the local replica has applied everything the leader had committed when
    /// asked, so a local read after it is linearizable.
    pub async fn read_barrier(&self) -> Result<(), ClusterError> {
        let deadline = Instant::now() + self.inner.config.request_timeout;
        let index =
            match tokio::time::timeout_at(deadline, self.on_leader(ForwardOp::ReadIndex, deadline))
                .await
            {
                Ok(Ok(ForwardReply::ReadIndex(i))) => i,
                Ok(Ok(other)) => {
                    return Err(ClusterError::Internal(format!("unexpected reply {other:?}")))
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(ClusterError::Unavailable(
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
            .map_err(|e| ClusterError::Unavailable(format!("replica did not catch up: {e}")))?;
        Ok(())
    }

    /// Runs a membership operation (or a leadership transfer) on the leader.
    pub async fn change_members(&self, op: ForwardOp) -> Result<BTreeSet<u64>, ClusterError> {
        // Adding a learner waits for it to catch up, which may take a snapshot transfer.
        let deadline =
            Instant::now() + self.inner.config.request_timeout.max(Duration::from_secs(60));
        match self.on_leader(op, deadline).await? {
            ForwardReply::Members(m) => Ok(m),
            other => Err(ClusterError::Internal(format!("unexpected reply {other:?}"))),
        }
    }

    /// Hands leadership to voter `to`, or to the most caught-up voter when `None`, wherever
    /// the leader is; returns the new leader once it leads.
    pub async fn transfer_leader(&self, to: Option<u64>) -> Result<u64, ClusterError> {
        let timeout = Duration::from_millis(self.inner.config.timing.transfer_timeout_ms);
        let deadline = Instant::now() + self.inner.config.request_timeout.max(timeout * 2);
        let op = ForwardOp::TransferLeader { to };
        match self.on_leader(op, deadline).await? {
            ForwardReply::Leader(l) => Ok(l),
            other => Err(ClusterError::Internal(format!("unexpected reply {other:?}"))),
        }
    }

    /// On the leader: hands leadership to `to` (or the most caught-up voter) and waits until
    /// another node leads, at most the transfer timeout.
    async fn hand_over(&self, to: Option<u64>) -> Result<u64, ClusterError> {
        let me = self.inner.config.node_id;
        let metrics = self.metrics();
        if metrics.state != ServerState::Leader {
            return Err(ClusterError::NotLeader(metrics.current_leader));
        }
        let voters: BTreeSet<u64> = metrics.membership_config.membership().voter_ids().collect();
        let to = match to {
            Some(to) if to == me => return Ok(me),
            Some(to) if !voters.contains(&to) => {
                return Err(ClusterError::BadRequest(format!(
                    "node {to} is not a voter; voters: {voters:?}"
                )))
            }
            Some(to) => to,
            None if voters.iter().all(|v| *v == me) => {
                return Err(ClusterError::BadRequest("no other voter to hand leadership to".into()))
            }
            None => {
                // A voter that has not answered lately cannot take over within the timeout
                // (the last node of a cluster being stopped, or one cut off): waiting
                // `transfer_timeout_ms` for it would only hold the stop up. A leader elected
                // a moment ago has heard from no one yet, so the voters get one such span
                // to answer before the hand-over is given up.
                let recent = Duration::from_millis(self.inner.config.timing.election_timeout_ms.1);
                let none = || {
                    ClusterError::Unavailable(format!(
                        "no other voter has answered within {recent:?} to hand leadership to"
                    ))
                };
                // Returns at once when a voter has answered already.
                let answered = self
                    .inner
                    .raft
                    .wait(Some(recent))
                    .metrics(
                        |m| most_caught_up(m, me, &voters, recent).is_some(),
                        "a voter answers",
                    )
                    .await
                    .map_err(|_| none())?;
                most_caught_up(&answered, me, &voters, recent).ok_or_else(none)?
            }
        };
        self.inner
            .raft
            .trigger()
            .transfer_leader(to)
            .await
            .map_err(|e| ClusterError::Unavailable(format!("raft stopped: {e}")))?;
        let timeout = Duration::from_millis(self.inner.config.timing.transfer_timeout_ms);
        let moved = self
            .inner
            .raft
            .wait(Some(timeout))
            .metrics(|m| m.current_leader.is_some_and(|l| l != me), format!("node {to} takes over"))
            .await
            .map_err(|e| ClusterError::Unavailable(format!("no voter took over in time: {e}")))?;
        moved
            .current_leader
            .ok_or_else(|| ClusterError::Internal("a leader appeared and vanished".into()))
    }

    /// Sends `op` to the leader (itself included) until it is served or `deadline` passes,
    /// retrying only while nothing can have been applied.
    ///
    /// Boxed: serving a batch on the leader comes back here through `serve_forwarded`, and
    /// without a box every caller's future would nest the whole routing state machine (deep
    /// enough to overflow rustc's layout depth in the server's handlers).
    fn on_leader(
        &self,
        op: ForwardOp,
        deadline: Instant,
    ) -> futures::future::BoxFuture<'_, Result<ForwardReply, ClusterError>> {
        Box::pin(self.route(op, deadline))
    }

    async fn route(&self, op: ForwardOp, deadline: Instant) -> Result<ForwardReply, ClusterError> {
        let me = self.inner.config.node_id;
        // A retry waits for a new leader: the server state's watch changes with the role,
        // leader, vote and membership only (the full metrics change several times per entry).
        let mut server = self.inner.raft.server_metrics();
        loop {
            let attempt = match self.leader() {
                Some((leader, _)) if leader == me => match self.serve_forwarded(op.clone()).await {
                    Err(e @ ClusterError::NotLeader(_)) => Try::Retry(e),
                    r => Try::Done(r),
                },
                Some((leader, Some(addr))) => {
                    let sent = self.inner.relay.send(leader, &addr, op.clone(), deadline).await;
                    match sent {
                        Ok(ForwardReply::Failed(e @ ClusterError::NotLeader(_))) => Try::Retry(e),
                        Ok(ForwardReply::Failed(e)) => Try::Done(Err(e)),
                        Ok(reply) => Try::Done(Ok(reply)),
                        // Never sent: safe to try again.
                        Err(ForwardError::Unreachable(e)) => Try::Retry(ClusterError::Unavailable(
                            format!("leader {leader} unreachable: {e}"),
                        )),
                        Err(ForwardError::Status(s)) => {
                            Try::Done(Err(ClusterError::Unavailable(format!(
                                "forwarding to leader {leader} failed, outcome unknown: {}",
                                s.message()
                            ))))
                        }
                    }
                }
                _ => Try::Retry(ClusterError::NotLeader(None)),
            };
            match attempt {
                Try::Done(r) => return r,
                Try::Retry(e) => {
                    let gave_up = || {
                        ClusterError::Unavailable(format!(
                            "no leader could serve the request in time, nothing was written ({e})"
                        ))
                    };
                    if Instant::now() >= deadline {
                        return Err(gave_up());
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                        r = server.changed() => if r.is_err() {
                            // Raft has stopped: no leader will be known here again.
                            return Err(ClusterError::Unavailable(
                                "node is shutting down; nothing was written".into(),
                            ));
                        },
                        _ = tokio::time::sleep_until(deadline) => {}
                    }
                    // No attempt at the deadline itself: it could not be answered in time,
                    // and its "no answer in time" would turn "nothing was written" into
                    // "outcome unknown" for a request that was never sent.
                    if Instant::now() >= deadline {
                        return Err(gave_up());
                    }
                }
            }
        }
    }

    /// Serves an operation that must run on the leader; `NotLeader` when this node is not.
    async fn serve_forwarded(&self, op: ForwardOp) -> Result<ForwardReply, ClusterError> {
        let raft = &self.inner.raft;
        match op {
            ForwardOp::Propose(commands) => {
                if let Some(outcomes) = self.idle_outcomes(&commands).await? {
                    return Ok(ForwardReply::Outcomes(outcomes));
                }
                Ok(ForwardReply::Outcomes(self.inner.proposer.propose(commands).await?))
            }
            ForwardOp::ReadIndex => Ok(ForwardReply::ReadIndex(Some(self.read_index().await?))),
            ForwardOp::Batch(ops) => {
                let served = ops.into_iter().map(|op| async move {
                    let served = match op {
                        ForwardOp::Batch(_) => {
                            Err(ClusterError::BadRequest("batches do not nest".into()))
                        }
                        // Boxed: the future would otherwise contain itself.
                        op => Box::pin(self.serve_forwarded(op)).await,
                    };
                    served.unwrap_or_else(ForwardReply::Failed)
                });
                Ok(ForwardReply::Batch(futures::future::join_all(served).await))
            }
            ForwardOp::AddLearner { id, addr } => {
                raft.add_learner(id, BasicNode::new(addr), true)
                    .await
                    .map_err(ClusterError::from)?;
                Ok(ForwardReply::Members(self.voters()))
            }
            ForwardOp::Promote { id } => {
                let change = ChangeMembers::AddVoterIds(BTreeSet::from([id]));
                raft.change_membership(change, false).await.map_err(ClusterError::from)?;
                Ok(ForwardReply::Members(self.voters()))
            }
            ForwardOp::Remove { id } => {
                let change = if self.voters().contains(&id) {
                    ChangeMembers::RemoveVoters(BTreeSet::from([id]))
                } else {
                    ChangeMembers::RemoveNodes(BTreeSet::from([id]))
                };
                raft.change_membership(change, false).await.map_err(ClusterError::from)?;
                Ok(ForwardReply::Members(self.voters()))
            }
            ForwardOp::TransferLeader { to } => Ok(ForwardReply::Leader(self.hand_over(to).await?)),
            ForwardOp::Status => Ok(ForwardReply::Status(self.status())),
        }
    }

    /// On the leader: the index a linearizable read must wait for (its commit index, with
    /// leadership confirmed by its lease or by a quorum).
    ///
    /// A lease that is not held — a leader just elected, before a quorum has answered it, or
    /// one that has not heard from a quorum for a whole lease — does not refuse the read: the
    /// leader sends heartbeats at once and the read waits for a quorum's answer, as a read
    /// index would, for at most one lease (`election_timeout_max`). So a healthy new leader's
    /// first reads are answered, and an isolated one's still fail within a lease.
    async fn read_index(&self) -> Result<u64, ClusterError> {
        let option = if self.inner.config.lease_reads {
            LinearizerOption::new(None, true)
        } else {
            LinearizerOption::from(ReadPolicy::ReadIndex)
        };
        match self.inner.raft.get_read_linearizer(option).await {
            Ok(linearizer) => Ok(linearizer.read_log_id().index()),
            Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(f))) => {
                Err(ClusterError::NotLeader(f.leader_id))
            }
            Err(e) => Err(ClusterError::Unavailable(e.to_string())),
        }
    }

    /// On the leader: the outcomes of `commands` when every one of them would change nothing
    /// (a reserve with nothing ready), answered from the state without a log entry; `None`
    /// when they must be proposed. An idle answer is a linearizable read: it is given only
    /// after the leader confirmed its leadership and applied everything committed before, so
    /// a job whose publish was acknowledged anywhere is never answered "none ready".
    async fn idle_outcomes(
        &self,
        commands: &[Command],
    ) -> Result<Option<Vec<Outcome>>, ClusterError> {
        let idle = |view: &ReadView<'_>| -> Result<Option<Vec<Outcome>>, ClusterError> {
            let mut outcomes = Vec::with_capacity(commands.len());
            for c in commands {
                match c.idle_outcome(view)? {
                    Some(o) => outcomes.push(o),
                    None => return Ok(None),
                }
            }
            Ok(Some(outcomes))
        };
        // The cheap tests first: under load there is work to do and nothing more is spent
        // here. A queue that had a job at its last change needs no look at all; the others
        // are looked up in the state as it is.
        let must_propose = commands.iter().any(|c| match c {
            Command::Reserve { queues, .. } | Command::ReserveUrgent { queues, .. } => {
                self.inner.reservable.any(queues)
            }
            _ => true,
        });
        if must_propose || idle(&self.inner.reader.read_view()?)?.is_none() {
            return Ok(None);
        }
        // Then for real: after a read barrier, a job whose publish was acknowledged anywhere
        // is visible here.
        self.read_barrier().await?;
        idle(&self.inner.reader.read_view()?)
    }

    /// What this node's relay has forwarded to leaders: calls made and operations carried.
    pub fn relay_stats(&self) -> RelayStats {
        self.inner.relay.stats()
    }

    /// The current voters.
    pub fn voters(&self) -> BTreeSet<u64> {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow_watched();
        m.membership_config.membership().voter_ids().collect()
    }

    /// This node's own view.
    pub fn status(&self) -> NodeStatus {
        let m = self.metrics();
        NodeStatus {
            id: m.id,
            state: format!("{:?}", m.state),
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index,
            last_applied: m.last_applied.map(|l| l.index),
            snapshot: m.snapshot.map(|l| l.index),
            purged: m.purged.map(|l| l.index),
            services: self.inner.config.services.clone(),
        }
    }

    /// Asks member `id` at `addr` for its view over the internal service.
    pub async fn peer_status(&self, id: u64, addr: &str) -> Result<NodeStatus, ClusterError> {
        let payload = codec::encode(&ForwardOp::Status);
        let bytes = self
            .inner
            .network
            .forward(id, addr, payload, Duration::from_millis(500))
            .await
            .map_err(|e| ClusterError::Unavailable(e.to_string()))?;
        match codec::decode::<ForwardReply>(&bytes)? {
            ForwardReply::Status(s) => Ok(s),
            other => Err(ClusterError::Internal(format!("unexpected reply {other:?}"))),
        }
    }

    /// Triggers a snapshot of this node's state machine.
    pub async fn snapshot(&self) -> Result<(), ClusterError> {
        self.inner
            .raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| ClusterError::Internal(e.to_string()))
    }
}

/// The voter other than `me` whose log matches the leader's furthest, of those that answered
/// the leader within `recent`.
fn most_caught_up(
    metrics: &RaftMetrics<TypeConfig>,
    me: u64,
    voters: &BTreeSet<u64>,
    recent: Duration,
) -> Option<u64> {
    let replication = metrics.replication.as_ref()?;
    let heartbeat = metrics.heartbeat.as_ref()?;
    let answered = |id: &u64| {
        heartbeat.get(id).and_then(|at| at.as_ref()).is_some_and(|at| at.elapsed() <= recent)
    };
    voters
        .iter()
        .filter(|id| **id != me && answered(id))
        .max_by_key(|id| replication.get(id).and_then(|m| m.as_ref().map(|l| l.index)))
        .copied()
}

/// One attempt to reach the leader.
enum Try {
    /// Certainly not applied; may be retried.
    Retry(ClusterError),
    /// Served, or failed in a way a retry could make worse.
    Done(Result<ForwardReply, ClusterError>),
}

/// A snapshot installed from the leader replaces the state wholesale without going through
/// apply: tell the observer, and wake the pump to look at the timer index again. The hints of
/// which queues have a job are forgotten whenever the snapshot changes, on a leader too (a node
/// may install a snapshot and win an election before this task sees the install); a snapshot
/// this node built itself changes nothing, and only costs the hints' rebuilding.
async fn watch_snapshots(
    raft: Raft,
    observer: Arc<dyn Observer>,
    signal: Arc<PumpSignal>,
    reservable: Arc<Reservable>,
    mut shutdown: watch::Receiver<bool>,
) {
    // The snapshot's own watch, published only when it changes (the full metrics change
    // several times per log entry).
    let mut snapshots = raft.watch_snapshot_progress();
    let server = raft.server_metrics();
    let mut last = snapshots.get();
    loop {
        tokio::select! {
            r = snapshots.changed() => if r.is_err() { return },
            _ = shutdown.wait_for(|s| *s) => return,
        }
        let snapshot = snapshots.get();
        if snapshot != last {
            last = snapshot;
            reservable.clear();
            if server.borrow_watched().state != ServerState::Leader {
                observer.replaced();
                signal.wake();
            }
        }
    }
}

/// Runs blocking `work` off the async workers and waits for it at most `limit`: `None` when
/// it has not finished by then. The work itself cannot be stopped and runs on; what waits
/// for it (the runtime's shutdown, see `delayd`'s `main`) must bound its own wait too.
async fn blocking_within<T: Send + 'static>(
    limit: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<Result<T, tokio::task::JoinError>> {
    tokio::time::timeout(limit, tokio::task::spawn_blocking(work)).await.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn blocking_work_past_its_limit_is_abandoned_at_the_limit() {
        // Real time: paused time does not advance while blocking work runs.
        let limit = Duration::from_millis(200);
        let (release, hold) = std::sync::mpsc::channel::<()>();
        // Held until the test lets go: a flush on a disk that does not answer.
        let stuck = blocking_within(limit, move || hold.recv().is_ok());
        let started = Instant::now();
        assert!(stuck.await.is_none(), "work that never finished was waited for");
        let waited = started.elapsed();
        assert!(waited >= limit && waited < Duration::from_secs(5), "waited {waited:?}");
        drop(release);

        let quick = blocking_within(Duration::from_secs(30), || 7).await;
        assert_eq!(quick.map(|r| r.ok()), Some(Some(7)));
    }
}
