//! # The service: delayd's operations, whatever protocol asks for them
//!
//! [`Service`] is the one way into the replicated state for clients. Every front end (the
//! HTTP API in `http/`, the gRPC client API in `grpc/`, and any later one) decodes a request
//! into plain values, calls one method here with the caller's [`Principal`], and renders
//! the answer or the [`ServiceError`]. Each method, in this order:
//!
//! 1. **authorizes** the caller for what the operation needs ([`auth`]), before it looks at
//!    its arguments, so a caller learns nothing from a request it may not make;
//! 2. **validates** the arguments against every bound ([`validate`]), so a bad request writes
//!    nothing;
//! 3. **builds the commands** and proposes them through the cluster (this module is the only
//!    code that builds [`Command`]s), or reads the local replica, linearizably unless the
//!    caller asked for a stale read.
//!
//! The operations are grouped by what they act on: publishing ([`publish`]), reserving with
//! long-polls ([`reserve`], over the [`waiters`]), single jobs ([`jobs`]), queues and their
//! dead letters ([`queues`]), tokens ([`tokens`]) and the cluster ([`admin`]); readiness and
//! draining are in [`health`].
//!
//! Nothing here names axum or tonic: the service neither knows nor cares how a request
//! arrived.

pub mod admin;
pub mod auth;
pub mod backup;
pub mod health;
pub mod jobs;
pub mod publish;
pub mod queues;
pub mod reserve;
pub mod schedules;
pub mod tokens;
pub mod validate;
mod waiters;
pub mod webhooks;

use std::sync::{Arc, Weak};

use delayd_core::{Command, Effects, KvError, Outcome, Reply};
use delayd_raft::{Cluster, Observer};
use delayd_store::ReadView;
use tokio::sync::{watch, Notify};

use crate::config::Config;
use crate::error::ServiceError;
use crate::metrics::Metrics;
use auth::Auth;
use waiters::Waiters;

pub use auth::{Access, Principal};
pub use validate::PublishParams;

/// delayd's operations on one node. Cheap to clone; every clone is the same service.
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

/// A [`Service`] that does not keep the node alive: what a server task holds, so that a
/// server outliving its node answers "shutting down" instead of keeping it running.
#[derive(Clone)]
pub struct WeakService(Weak<Inner>);

impl WeakService {
    /// The service, unless its node is gone.
    pub fn upgrade(&self) -> Option<Service> {
        self.0.upgrade().map(|inner| Service { inner })
    }
}

struct Inner {
    config: Config,
    cluster: Cluster,
    waiters: Arc<Waiters>,
    auth: Arc<Auth>,
    metrics: Arc<Metrics>,
    webhook_changes: Arc<Notify>,
    schedule_changes: Arc<Notify>,
    /// Set once the node starts stopping ([`health`]).
    drain: watch::Sender<bool>,
}

/// What the service keeps beside the cluster, made before the cluster opens because the
/// cluster reports applied entries to it from its first apply on ([`Parts::observer`]).
pub(crate) struct Parts {
    waiters: Arc<Waiters>,
    auth: Arc<Auth>,
    metrics: Arc<Metrics>,
    webhook_changes: Arc<Notify>,
    schedule_changes: Arc<Notify>,
}

impl Parts {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Parts {
        Parts {
            waiters: Arc::default(),
            auth: Arc::default(),
            metrics,
            webhook_changes: Arc::default(),
            schedule_changes: Arc::default(),
        }
    }

    /// What the cluster calls as entries are applied: wakes long-polls of queues that gained
    /// ready jobs, forgets the limiters of deleted tokens, tells the webhook dispatcher about
    /// changed webhooks and counts job events.
    pub(crate) fn observer(&self) -> Arc<dyn Observer> {
        Arc::new(Applied {
            waiters: self.waiters.clone(),
            auth: self.auth.clone(),
            metrics: self.metrics.clone(),
            webhook_changes: self.webhook_changes.clone(),
            schedule_changes: self.schedule_changes.clone(),
        })
    }
}

struct Applied {
    waiters: Arc<Waiters>,
    auth: Arc<Auth>,
    metrics: Arc<Metrics>,
    webhook_changes: Arc<Notify>,
    schedule_changes: Arc<Notify>,
}

impl Observer for Applied {
    fn applied(&self, effects: &Effects) {
        self.waiters.wake(&effects.ready_queues);
        for token in &effects.deleted_tokens {
            self.auth.forget(token);
        }
        if effects.webhooks_changed {
            self.webhook_changes.notify_one();
        }
        if effects.schedules_changed {
            self.schedule_changes.notify_one();
        }
        self.metrics.record_applied(effects);
    }

    fn replaced(&self) {
        self.waiters.wake_all();
        self.webhook_changes.notify_one();
        self.schedule_changes.notify_one();
    }
}

impl Service {
    /// The service over a started cluster node.
    pub(crate) fn new(config: Config, cluster: Cluster, parts: Parts) -> Service {
        let Parts { waiters, auth, metrics, webhook_changes, schedule_changes } = parts;
        let inner = Inner {
            config,
            cluster,
            waiters,
            auth,
            metrics,
            webhook_changes,
            schedule_changes,
            drain: watch::Sender::new(false),
        };
        Service { inner: Arc::new(inner) }
    }

    /// A handle that does not keep the service alive.
    pub fn downgrade(&self) -> WeakService {
        WeakService(Arc::downgrade(&self.inner))
    }

    /// The node's configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The cluster node underneath.
    pub(crate) fn cluster(&self) -> &Cluster {
        &self.inner.cluster
    }

    /// Notified whenever an applied entry set or removed a webhook (or a snapshot replaced
    /// the state): the dispatcher looks at the webhooks again.
    pub(crate) fn webhook_changes(&self) -> &Notify {
        &self.inner.webhook_changes
    }

    /// Notified whenever an applied entry set, removed or fired a schedule (or a snapshot
    /// replaced the state): the schedule pump looks at the schedule index again.
    pub(crate) fn schedule_changes(&self) -> &Notify {
        &self.inner.schedule_changes
    }

    /// The node's wall clock now, in unix ms (the clock that stamps entries when it leads).
    pub fn now_ms(&self) -> u64 {
        self.inner.cluster.clock().now_ms()
    }

    /// The checks that depend on the configuration, at this moment.
    fn checks(&self) -> validate::Checks<'_> {
        validate::Checks { config: &self.inner.config, clock: self.inner.cluster.clock() }
    }

    /// Proposes commands atomically on the leader (forwarded when this node is a follower),
    /// bounded by the request timeout.
    async fn write(&self, commands: Vec<Command>) -> Result<Vec<Outcome>, ServiceError> {
        Ok(self.inner.cluster.propose(commands).await?)
    }

    /// Proposes one command and returns its reply, a rejection as its error.
    async fn write_one(&self, command: Command) -> Result<Reply, ServiceError> {
        let outcome = self
            .write(vec![command])
            .await?
            .pop()
            .ok_or_else(|| ServiceError::Internal("no outcome".into()))?;
        Ok(outcome?)
    }

    /// Runs a read against the local replica; unless `stale`, first waits until it has
    /// applied everything the leader had committed when asked (read index).
    async fn read<T>(
        &self,
        stale: bool,
        f: impl FnOnce(&ReadView<'_>) -> Result<T, KvError>,
    ) -> Result<T, ServiceError> {
        let view = self.inner.cluster.read(stale).await?;
        Ok(f(&view)?)
    }
}

/// A reply of a kind the command never produces: a bug.
fn unexpected(r: Reply) -> ServiceError {
    ServiceError::Internal(format!("unexpected reply {r:?}"))
}
