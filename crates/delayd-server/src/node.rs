//! A running delayd node: the Raft node, its store and the leader-side tasks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use delayd_store::{Raft, StateReader, Store};
use openraft::error::{InitializeError, RaftError};
use openraft::{BasicNode, ServerState};
use tokio::sync::watch;

use crate::config::Config;
use crate::error::ServiceError;
use crate::network::SoloNetwork;
use crate::propose::Proposer;
use crate::pump::{self, PumpSignal};
use crate::waiters::Waiters;

/// A started node. Cheap to clone; every clone is the same node.
#[derive(Clone)]
pub struct Node {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: Config,
    pub(crate) raft: Raft,
    pub(crate) reader: StateReader,
    pub(crate) proposer: Proposer,
    pub(crate) waiters: Arc<Waiters>,
    shutdown: watch::Sender<bool>,
}

fn raft_config() -> Result<openraft::Config, ServiceError> {
    // Timeouts sized for fsync on a busy disk (notes/openraft.md): in 0.9 the heartbeat
    // interval is also every replication RPC's timeout.
    let config = openraft::Config {
        cluster_name: "delayd".into(),
        heartbeat_interval: 200,
        election_timeout_min: 1000,
        election_timeout_max: 2000,
        install_snapshot_timeout: 10_000,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(50_000),
        max_in_snapshot_log_to_keep: 10_000,
        ..Default::default()
    };
    config.validate().map_err(|e| ServiceError::Internal(format!("raft config: {e}")))
}

impl Node {
    /// Opens the store under `config.data_dir`, starts Raft, forms the single-node cluster on
    /// first start (a restart finds it formed), and waits until this node leads.
    pub async fn start(config: Config) -> Result<Node, ServiceError> {
        std::fs::create_dir_all(&config.data_dir).map_err(|e| {
            ServiceError::Internal(format!("cannot create {}: {e}", config.data_dir.display()))
        })?;
        let (log, sm) = Store::open(&config.data_dir)?;
        let reader = sm.reader();
        let raft = Raft::new(config.node_id, Arc::new(raft_config()?), SoloNetwork, log, sm)
            .await
            .map_err(|e| ServiceError::Internal(format!("raft: {e}")))?;

        let waiters = Arc::new(Waiters::default());
        let signal = Arc::new(PumpSignal::default());
        {
            let (waiters, signal) = (waiters.clone(), signal.clone());
            reader.set_listener(Arc::new(move |effects: &delayd_core::Effects| {
                waiters.wake(&effects.ready_queues);
                if let Some(t) = effects.earliest_timer_ms {
                    signal.timer_added(t);
                }
            }));
        }

        let initialized =
            raft.is_initialized().await.map_err(|e| ServiceError::Internal(e.to_string()))?;
        if !initialized {
            let addr = config.http_addr.to_string();
            let members = BTreeMap::from([(config.node_id, BasicNode::new(addr))]);
            match raft.initialize(members).await {
                Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(e) => return Err(ServiceError::Internal(format!("initialize: {e}"))),
            }
        }
        raft.wait(Some(Duration::from_secs(30)))
            .state(ServerState::Leader, "single node becomes leader")
            .await
            .map_err(|e| ServiceError::Unavailable(format!("no leadership: {e}")))?;

        let proposer = Proposer::spawn(raft.clone(), config.max_batch);
        let (shutdown, shutdown_rx) = watch::channel(false);
        tokio::spawn(pump::run(
            raft.clone(),
            reader.clone(),
            proposer.clone(),
            signal,
            config.tick_limit,
            shutdown_rx,
        ));
        tracing::info!(node_id = config.node_id, data_dir = %config.data_dir.display(), "node started");
        Ok(Node { inner: Arc::new(Inner { config, raft, reader, proposer, waiters, shutdown }) })
    }

    /// The node's configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The openraft handle (for metrics and administration).
    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    /// Stops the pump and Raft. Acknowledged writes are already durable; this only lets
    /// in-flight work finish and releases the database.
    pub async fn shutdown(&self) {
        let _ = self.inner.shutdown.send(true);
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
    }
}
