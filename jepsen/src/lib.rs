//! # delayd-jepsen: chaos testing for delayd
//!
//! A run starts a three-node cluster on a [`backend`] (docker-compose or local processes),
//! drives a seeded workload against it while a nemesis injects the faults of a [`plan`], and
//! records every client operation as an [`history::Op`]: who invoked it, when (one monotonic
//! clock in the harness), what it asked and what came back — `Ok`, `Fail`, or `Unknown` when
//! the client timed out or the answer was ambiguous. The checkers in [`checker`] then decide,
//! from the history alone, whether delayd kept its promises (properties (a)–(e) and (h) of
//! `notes/chaos.md`); [`stats`] measures (f) lateness and (g) availability, and [`render`]
//! draws the run.
//!
//! Every checker is proven able to fail: its unit tests feed it a synthetic history that
//! contains the anomaly it looks for.
//!
//! ## Failover measurement
//!
//! `delayd-jepsen failover [--backend local|docker] [--trials N] [--bin PATH]
//! [--scenario kill-leader,term-leader,pause-follower,partition-follower]` measures instead
//! of judging a history ([`failover`]): on a fresh cluster per trial, under a light publish
//! load through every node, it `kill -9`s the leader (time until a survivor takes a publish
//! again), SIGTERMs it (the longest stretch without any successful publish), SIGSTOPs a
//! follower for 4 s and cuts a follower off its peers for 10 s (are the leader and its term
//! unchanged afterwards?). After every trial each acknowledged job is looked up by id; the
//! exit code is 1 if one is missing. `docs/failover.md` explains every figure.

pub mod backend;
pub mod checker;
pub mod client;
pub mod failover;
pub mod history;
pub mod nemesis;
pub mod plan;
pub mod progress;
pub mod render;
pub mod run;
pub mod stats;
pub mod workload;
