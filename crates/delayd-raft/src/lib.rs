//! # delayd-raft: the replicated runtime
//!
//! This crate turns one RocksDB store ([`delayd_store`]) and the job state machine
//! ([`delayd_core`]) into a node of a Raft cluster. A [`Cluster`] is everything a node runs
//! that is about *agreement*, and nothing that is about *clients*:
//!
//! - the openraft node over the store, with Pre-Vote on and leadership hand-over on shutdown;
//! - the **proposer** ([`propose`]): stamps time, then coalesces concurrent commands into one
//!   log entry per Raft round, so throughput follows the number of waiting clients;
//! - the **timer pump** ([`pump`]): on the leader only, sleeps until the earliest deadline in
//!   the timer index and proposes a bounded `Tick`, which carries reserves parked on the
//!   leader for the queues it makes jobs ready in ([`riders`]), so those are delivered in
//!   the tick's own entry;
//! - **routing** ([`Cluster::propose`], [`Cluster::read_barrier`]): any node accepts any
//!   operation and sends what only the leader can do to it over the internal `Forward` RPC
//!   ([`forward`]), retrying only when nothing can have been written; a follower's
//!   concurrent requests share calls ([`relay`]);
//! - **membership** and **leadership transfer** ([`Cluster::change_members`],
//!   [`Cluster::transfer_leader`]);
//! - the node's **clock** ([`clock`]), which stamps entries;
//! - the **transport** ([`network`], the client side; [`server`], the server side): Raft and
//!   forwarding over gRPC between nodes, with a cluster credential, and a fault filter
//!   ([`faults`]) that tests use to cut and slow links in process; a peer that stops
//!   answering is logged once per change (`links`), not at every failed call.
//!
//! ## The boundary
//!
//! The crate knows [`Command`](delayd_core::Command)s and their
//! [`Outcome`](delayd_core::Outcome)s, log indexes and node ids. It does not know HTTP, the
//! gRPC client API, namespaces' tokens or what a request's caller may do: the service layer
//! (`delayd-server`) validates and authorizes a request, turns it into commands, and hands
//! them to [`Cluster::propose`]; it reads through [`Cluster::read`]. The service may serve its
//! own gRPC services on the node's port ([`Cluster::serve`] takes them), and hears about
//! applied entries through an [`Observer`]. Nothing here depends on `delayd-server`.
//!
//! Errors are one type, [`ClusterError`], which crosses the wire as it is: a follower that
//! forwarded a request gets the leader's error, not a reconstruction of it.
//!
//! ## Failover
//!
//! Timeouts are [`Timing`]; `docs/failover.md` explains how each bounds the time from a
//! leader's loss to the first committed write, and what a WAN deployment should set.

pub mod clock;
pub mod cluster;
pub mod config;
pub mod error;
pub mod faults;
mod fold;
pub mod forward;
pub mod identity;
mod links;
mod log_bound;
pub mod metrics;
pub mod network;
pub mod propose;
pub mod pump;
pub mod relay;
pub mod reservable;
pub mod riders;
pub mod server;
pub mod tls;

pub use cluster::{Cluster, Observer};
pub use config::{ClusterConfig, Timing};
pub use error::ClusterError;
pub use forward::{ForwardOp, NodeStatus};
pub use metrics::ReplicationMetrics;
pub use propose::ProposerConfig;
pub use riders::{Deliver, RideOutcome, Rider, Riders};
