//! # delayd-server: the service around the replicated state machine
//!
//! A [`Node`] is a cluster node ([`delayd_raft::Cluster`]: Raft, the proposer, the timer
//! pump, routing to the leader) and the client-facing service around it:
//!
//! - the **waiters** ([`waiters`]): long-poll reserves park here and are woken when an applied
//!   entry makes jobs ready in one of their queues;
//! - the **service** ([`service`]): validated operations that the HTTP handlers ([`http`]) and
//!   the gRPC client API ([`api`], on the node's gRPC port beside the internal services) are
//!   thin over;
//! - **authentication** ([`auth`]): the admin token and namespace tokens, which live in the
//!   replicated state and are managed through the token API ([`tokens`]); a request id per
//!   HTTP request ([`request_id`]);
//! - the **admin API** ([`admin`]): membership, leadership transfer, snapshots, digests;
//! - the HTTP **transport** ([`serve`]): header and idle timeouts and a connection limit, so
//!   no client can hold connections it does not use.
//!
//! Errors are mapped to HTTP status codes in exactly one place, [`http::error`], and to gRPC
//! statuses in one place, [`api::status`].

pub mod admin;
pub mod api;
pub mod auth;
pub mod config;
pub mod dashboard;
pub mod error;
pub mod http;
pub mod metrics;
pub mod node;
pub mod request_id;
pub mod serve;
pub mod service;
pub mod tokens;
pub mod waiters;

pub use config::Config;
pub use error::ServiceError;
pub use node::Node;
