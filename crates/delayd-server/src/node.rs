//! A running delayd node: the cluster node ([`delayd_raft::Cluster`]) and what the service
//! keeps beside it — long-poll waiters, the token cache, metrics — and the client API on the
//! node's gRPC port.

use std::hash::Hasher;
use std::sync::Arc;

use delayd_core::{Cf, Command, Effects, KvRead, Outcome};
use delayd_raft::{Cluster, Observer};
use delayd_store::StoreMetrics;

use crate::config::Config;
use crate::error::ServiceError;
use crate::metrics::Metrics;
use crate::waiters::Waiters;

/// A started node. Cheap to clone; every clone is the same node.
#[derive(Clone)]
pub struct Node {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: Config,
    pub(crate) cluster: Cluster,
    pub(crate) waiters: Arc<Waiters>,
    pub(crate) auth: Arc<crate::auth::Auth>,
    pub(crate) metrics: Arc<Metrics>,
}

/// Tells the service's parts about applied entries.
struct Listener {
    waiters: Arc<Waiters>,
    auth: Arc<crate::auth::Auth>,
    metrics: Arc<Metrics>,
}

impl Observer for Listener {
    fn applied(&self, effects: &Effects) {
        self.waiters.wake(&effects.ready_queues);
        for token in &effects.deleted_tokens {
            self.auth.forget(token);
        }
        self.metrics.record_applied(effects);
    }

    fn replaced(&self) {
        self.waiters.wake_all();
    }
}

impl Node {
    /// Opens the store under `config.data_dir`, starts the cluster node and its gRPC server on
    /// `config.grpc_addr` (the internal services and the client API), and forms the cluster
    /// on first start (a restart finds it formed; a `join` node waits to be added).
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
        let metrics = Arc::new(
            Metrics::new(StoreMetrics::default())
                .map_err(|e| ServiceError::Internal(format!("metrics: {e}")))?,
        );
        let waiters = Arc::new(Waiters::default());
        let auth = Arc::new(crate::auth::Auth::default());
        let listener =
            Listener { waiters: waiters.clone(), auth: auth.clone(), metrics: metrics.clone() };
        let cluster =
            Cluster::open(config.cluster(), Arc::new(listener), metrics.store().clone()).await?;
        // With port 0 (tests) the cluster bound a port of the OS's choice: advertise it.
        config.grpc_addr = cluster.config().grpc_addr;
        let node = Node { inner: Arc::new(Inner { config, cluster, waiters, auth, metrics }) };
        let api =
            crate::metrics::GrpcMetered::new(crate::api::server(&node), node.inner.metrics.clone());
        node.inner.cluster.serve(Some(tonic::service::Routes::new(api))).await?;
        tokio::spawn(crate::metrics::watch_leader(node.clone()));
        Ok(node)
    }

    /// The node's configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The cluster node underneath.
    pub fn cluster(&self) -> &Cluster {
        &self.inner.cluster
    }

    /// The node's wall clock (the one that stamps entries when this node leads).
    pub fn clock(&self) -> &delayd_raft::clock::Clock {
        self.inner.cluster.clock()
    }

    /// The node's Prometheus metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// Stops the node: a leader hands leadership over first, then the cluster node stops and
    /// its tasks are joined. Acknowledged writes are already durable.
    pub async fn shutdown(&self) {
        self.inner.cluster.shutdown().await;
    }

    /// Whether this node currently leads.
    pub fn is_leader(&self) -> bool {
        self.inner.cluster.is_leader()
    }

    /// Proposes commands atomically on the leader, bounded by the request timeout.
    pub(crate) async fn propose(
        &self,
        commands: Vec<Command>,
    ) -> Result<Vec<Outcome>, ServiceError> {
        Ok(self.inner.cluster.propose(commands).await?)
    }

    /// Waits until the local replica has applied everything the leader had committed when
    /// asked (the read-index protocol), so a local read is linearizable.
    pub(crate) async fn read_barrier(&self) -> Result<(), ServiceError> {
        Ok(self.inner.cluster.read_barrier().await?)
    }

    /// A digest of the whole replicated state with the index it was taken at, read from one
    /// consistent view: replicas at the same index must have the same digest.
    pub fn digest(&self) -> Result<(Option<u64>, u64, u64), ServiceError> {
        let view = self.inner.cluster.reader().read_view()?;
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
