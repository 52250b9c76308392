//! # delayd-server: the client-facing half of a delayd node
//!
//! Below this crate, `delayd-raft`'s [`Cluster`](delayd_raft::Cluster) replicates job
//! commands, runs the timer pump on the leader and routes writes to it. This crate puts the
//! service clients talk to on top, in three layers that only ever call downwards:
//!
//! ```text
//!   http/  (axum, lmstfy's API)      grpc/  (tonic, delayd.v1.Delayd)      ← front ends
//!        extract → one Service call → render      convert → one Service call → convert
//!                         \                  /
//!   service/   Service: authorize → validate → build Commands → propose or read
//!                         |            (waiters: long-polls woken by applied entries)
//!   delayd_raft::Cluster   proposer → Raft log → state machine (RocksDB) → observer
//! ```
//!
//! - **Front ends** ([`http`], [`grpc`]) decode a request's syntax, take the caller's
//!   credential, make exactly one call on [`Service`] and render its answer; each maps
//!   [`ServiceError`] to its protocol's statuses in one place. They decide nothing: a new
//!   protocol is a new front end, with every rule already in force.
//! - **The service** ([`service`]) is the only code that builds state-machine commands.
//!   Every operation authorizes its caller first ([`service::auth`]: one decision for every
//!   protocol), then validates its arguments ([`service::validate`]: every bound, once),
//!   then writes through the cluster or reads the local replica. It names neither axum nor
//!   tonic.
//! - **The cluster** tells the service what each applied batch of entries did (an
//!   `Observer`): which queues gained ready jobs (their long-polls wake), which tokens were
//!   deleted (their rate limiters go), what to count in [`metrics`].
//!
//! Two leader-only tasks act through the service as well: [`push`] POSTs due jobs of queues
//! that have a webhook (the one part that calls out), and the schedule pump (`scheduler.rs`)
//! fires due occurrences of recurring jobs.
//!
//! [`Node`] (`node.rs`) is the composition root: it opens the cluster, builds the service,
//! serves the client API beside the Raft services on one gRPC port and the HTTP API on
//! another, and stops them in order. `docs/architecture.md` traces one request through all of
//! it, with file names.

mod beanstalk;
pub mod config;
mod disque;
mod error;
pub mod grpc;
pub mod http;
mod listener;
pub mod metrics;
mod node;
pub mod push;
mod rate;
mod scheduler;
pub mod service;

pub use config::Config;
/// TLS for the listeners and between peers (the settings are loaded into [`tls::Tls`]).
pub use delayd_raft::tls;
pub use error::ServiceError;
pub use node::Node;
pub use service::{Principal, Service};
