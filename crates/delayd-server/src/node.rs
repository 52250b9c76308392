//! The composition root: a running node is its cluster node, the service over it, and the
//! two listeners — one gRPC server holding the Raft services and the client API side by
//! side, and the HTTP server. Nothing else in the crate imports this module; it only wires
//! the parts together and owns the tasks it starts.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use delayd_raft::Cluster;
use delayd_store::StoreMetrics;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::error::ServiceError;
use crate::metrics::{watch_leader, Metrics};
use crate::service::{Parts, Service};

/// How long shutdown waits for a background task of the node's before abandoning it.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// A started node. Cheap to clone; every clone is the same node.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

struct Inner {
    service: Service,
    cluster: Cluster,
    /// Background tasks of the node's own (the cluster joins its own on shutdown).
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Node {
    /// Opens the store under `config.data_dir`, starts the cluster node, and serves the
    /// internal services and the client API on `config.grpc_addr`; forms the cluster on first
    /// start (a restart finds it formed; a `join` node waits to be added). HTTP is served by
    /// [`Node::run`], or by the caller over [`Node::router`].
    pub async fn start(mut config: Config) -> Result<Node, ServiceError> {
        config.validate().map_err(ServiceError::BadRequest)?;
        if !config.auth.dev && config.auth.admin_token.is_none() {
            // Peers authenticate each other with the admin token; without one (and without
            // dev) nothing could be administered and no peer could join. (The binary always
            // has one: configured, or generated into the data directory.)
            return Err(ServiceError::bad_request(
                "set an admin token, or dev for no authentication at all",
            ));
        }
        let metrics = Arc::new(
            Metrics::new(StoreMetrics::default(), &config.build)
                .map_err(|e| ServiceError::Internal(format!("metrics: {e}")))?,
        );
        // Bound before the cluster opens, so a port in use fails before anything started.
        let disque = bind_protocol(&mut config.disque_addr, "disque_addr").await?;
        let beanstalk = bind_protocol(&mut config.beanstalk_addr, "beanstalk_addr").await?;
        let parts = Parts::new(metrics.clone());
        let cluster = Cluster::open(
            config.cluster(),
            parts.observer(),
            metrics.store().clone(),
            metrics.replication().clone(),
        )
        .await?;
        // With port 0 (tests) the cluster bound a port of the OS's choice: advertise it.
        config.grpc_addr = cluster.config().grpc_addr;

        let service = Service::new(config, cluster.clone(), parts);
        let (health, health_service) = tonic_health::server::health_reporter();
        let api =
            tonic::service::Routes::new(crate::grpc::server(&service)).add_service(health_service);
        cluster.serve(Some(api)).await?;
        let leader_watch = tokio::spawn(watch_leader(cluster.clone(), metrics));
        let dispatcher = tokio::spawn(crate::push::run(service.clone()));
        let scheduler = tokio::spawn(crate::scheduler::run(service.clone()));
        let health = tokio::spawn(service.clone().report_health(health));
        let mut tasks = vec![leader_watch, dispatcher, scheduler, health];
        if let Some(listener) = disque {
            tracing::info!(addr = ?service.config().disque_addr, "serving the Disque protocol");
            tasks.push(tokio::spawn(crate::disque::serve(listener, service.clone())));
        }
        if let Some(listener) = beanstalk {
            tracing::info!(addr = ?service.config().beanstalk_addr, "serving the beanstalkd protocol");
            tasks.push(tokio::spawn(crate::beanstalk::serve(listener, service.clone())));
        }
        let tasks = Mutex::new(tasks);
        Ok(Node { inner: Arc::new(Inner { service, cluster, tasks }) })
    }

    /// Runs a node until `shutdown` completes: binds `config.http_addr` first (so a port in
    /// use fails before anything starts), starts the node and serves HTTP.
    ///
    /// On `shutdown` the node drains: it reports not ready, answers every waiting long-poll
    /// at once (a consumer learns to go elsewhere instead of holding the stop up for its
    /// whole timeout), stops accepting HTTP connections and lets the requests in flight
    /// finish, for at most `http.drain_timeout`. Meanwhile a leader hands leadership over
    /// (its clients' writes in flight are forwarded to the new leader), so the cluster
    /// never waits out an election. Then the cluster node stops.
    pub async fn run(
        config: Config,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ServiceError> {
        let addr = config.http_addr;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| ServiceError::Internal(format!("cannot listen on {addr}: {e}")))?;
        let limits = config.http.clone();
        let tls = config.tls.clone();
        let node = Node::start(config).await?;
        match listener.local_addr() {
            Ok(addr) => tracing::info!(%addr, tls = node.config().tls.is_some(), "serving HTTP"),
            Err(e) => tracing::warn!(error = %e, "serving HTTP on an address the OS cannot name"),
        }
        let service = node.service().clone();
        let serving = async {
            let stop = async {
                shutdown.await;
                service.drain();
            };
            let served =
                crate::http::serve_http_with_tls(listener, node.router(), &limits, tls, stop).await;
            // Also when serving failed: the step-down below waits for the drain.
            service.drain();
            served
        };
        let mut draining = service.drain_watch();
        let step_down = async {
            if draining.wait_for(|d| *d).await.is_ok() {
                node.cluster().step_down().await;
            }
        };
        let (served, ()) = tokio::join!(serving, step_down);
        node.shutdown().await;
        served.map_err(|e| ServiceError::Internal(format!("HTTP server: {e}")))
    }

    /// The HTTP API over this node's service.
    pub fn router(&self) -> axum::Router {
        crate::http::router(&self.inner.service)
    }

    /// The node's service: every client operation.
    pub fn service(&self) -> &Service {
        &self.inner.service
    }

    /// The node's configuration.
    pub fn config(&self) -> &Config {
        self.inner.service.config()
    }

    /// The cluster node underneath.
    pub fn cluster(&self) -> &Cluster {
        &self.inner.cluster
    }

    /// The node's Prometheus metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        self.inner.service.metrics()
    }

    /// Stops the node: a leader hands leadership over first, then the cluster node stops and
    /// its tasks and the node's are joined. Acknowledged writes are already durable.
    pub async fn shutdown(&self) {
        self.inner.cluster.shutdown().await;
        let tasks =
            std::mem::take(&mut *self.inner.tasks.lock().unwrap_or_else(PoisonError::into_inner));
        for task in tasks {
            let abort = task.abort_handle();
            // Each ends when Raft has stopped, which it now has.
            if tokio::time::timeout(JOIN_TIMEOUT, task).await.is_err() {
                tracing::warn!("a node task did not stop within {JOIN_TIMEOUT:?}; abandoned");
                abort.abort();
            }
        }
    }
}

/// Binds a protocol listener's address, when one is configured, and records the address it
/// got (port 0 asks the OS for one). `setting` names the address in errors.
async fn bind_protocol(
    addr: &mut Option<std::net::SocketAddr>,
    setting: &str,
) -> Result<Option<tokio::net::TcpListener>, ServiceError> {
    let Some(want) = *addr else { return Ok(None) };
    let listener = tokio::net::TcpListener::bind(want)
        .await
        .map_err(|e| ServiceError::Internal(format!("cannot listen on {want} ({setting}): {e}")))?;
    *addr =
        Some(listener.local_addr().map_err(|e| ServiceError::Internal(format!("{setting}: {e}")))?);
    Ok(Some(listener))
}
