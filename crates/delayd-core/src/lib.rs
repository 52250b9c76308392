//! # delayd-core: the job state machine, pure
//!
//! Everything delayd promises about jobs is decided here, by [`machine::apply`]: a deterministic
//! function of the stored state and one log [`Entry`]. It does no IO of its own, reads no clock
//! and draws no random numbers — time comes with each entry (the leader's clock), ids and lease
//! seeds inside the commands (drawn by the node that took the request) — so every replica that
//! applies the same log holds the same state, and a golden script can replay any history
//! exactly.
//!
//! The state lives in a key-value store behind [`kv::KvRead`]; the machine writes into a
//! [`kv::Overlay`] that the store commits atomically. Indexes are ordered keys (see [`keys`]), so
//! memory does not grow with the number of jobs: the machine only ever touches the jobs a
//! command names and the heads of the indexes it drains.
//!
//! Caveats, on purpose:
//! - A command that would be rejected leaves no trace; rejections are values ([`Rejection`]).
//! - `Destroy`, `Respawn`, `Purge` and `Tick` do bounded work per command ([`limits`]) and say
//!   when more is left; a large operation is several entries, so it is not atomic.

pub mod checksum;
pub mod codec;
pub mod command;
pub mod keys;
pub mod kv;
pub mod limits;
pub mod machine;
pub mod model;
pub mod query;

pub use command::{Command, Delivery, Due, Entry, NewJob, Outcome, Rejection, Reply, Target};
pub use kv::{Cf, KvError, KvRead, MemKv, Overlay, Write};
pub use machine::{apply, Effects, JobEvents};
pub use model::{
    CatchUp, Job, JobCounters, JobId, JobState, JobTemplate, Lease, QueueMeta, QueueName, Schedule,
    Timetable, TokenRecord, Webhook,
};
