//! # delayd-server: the service around the state machine
//!
//! A [`Node`] owns one openraft node over the RocksDB store and everything that must live
//! beside it on the leader:
//!
//! - the **proposer** ([`propose`]): stamps time, ids and lease seeds, then coalesces concurrent
//!   commands into one log entry per Raft round — while one entry is being fsynced the next
//!   fills up, so throughput follows the number of waiting clients, not the fsync rate;
//! - the **timer pump** ([`pump`]): sleeps until the earliest deadline in the timer index (or
//!   until an applied entry adds an earlier one), then proposes a bounded `Tick`;
//! - the **waiters** ([`waiters`]): long-poll reserves park here and are woken when an applied
//!   entry makes jobs ready in one of their queues;
//! - the **service** ([`service`]): validated operations that the HTTP handlers ([`http`]) are
//!   thin over.
//!
//! - the gRPC client API ([`api`]), on the node's gRPC port beside the internal services;
//! - **authentication** ([`auth`]): the admin token and namespace tokens, which live in the
//!   replicated state and are managed through the token API ([`tokens`]); a request id per
//!   HTTP request ([`request_id`]);
//! - the HTTP **transport** ([`serve`]): header and idle timeouts and a connection limit, so
//!   no client can hold connections it does not use.
//!
//! Errors are mapped to HTTP status codes in exactly one place, [`http::error`], and to gRPC
//! statuses in one place, [`api::status`].

pub mod admin;
pub mod api;
pub mod auth;
pub mod clock;
pub mod config;
pub mod dashboard;
pub mod error;
pub mod forward;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod network;
pub mod node;
pub mod propose;
pub mod pump;
pub mod request_id;
pub mod serve;
pub mod service;
pub mod tokens;
pub mod waiters;

pub use config::Config;
pub use error::ServiceError;
pub use node::Node;
