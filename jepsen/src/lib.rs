//! # delayd-jepsen: judging a chaos run
//!
//! A run records every client operation as an [`history::Op`]: who invoked it, when (one
//! monotonic clock in the harness), what it asked and what came back — `Ok`, `Fail`, or
//! `Unknown` when the client timed out or the answer was ambiguous. The checkers in
//! [`checker`] then decide, from the history alone, whether delayd kept its promises
//! (properties (a)–(e) and (h) of `notes/chaos.md`).
//!
//! Every checker is proven able to fail: its unit tests feed it a synthetic history that
//! contains the anomaly it looks for.
//!
//! This crate holds the history model and the checkers; the workload generator, the nemesis
//! and the docker-compose / local-process backends come next (issue 4).

pub mod checker;
pub mod history;
