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

pub mod backend;
pub mod checker;
pub mod client;
pub mod history;
pub mod nemesis;
pub mod plan;
pub mod render;
pub mod run;
pub mod stats;
pub mod workload;
