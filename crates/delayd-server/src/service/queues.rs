//! Whole queues: their counts and statistics, pausing, destroying, and their dead letters.
//!
//! Operations on many jobs run as a sequence of bounded commands (see
//! [`delayd_core::limits`]), so a large one neither stalls the cluster nor is atomic: other
//! clients' entries interleave between its chunks.

use delayd_core::{query, Command, Job, JobState, QueueMeta, QueueName, Reply};

use super::auth::{Access, Principal, Scope};
use super::validate::{
    self, check_name, Limit, DEAD_JOBS_LIMIT, HISTOGRAM_BOUNDS_MS, MAX_DEAD_LETTER_LIMIT,
    QUEUES_LIMIT,
};
use super::{unexpected, Service};
use crate::error::ServiceError;

/// The jobs a respawn or purge may name.
const DEAD_LETTER_BATCH: Limit =
    Limit { name: "limit", min: 1, default: 1, max: MAX_DEAD_LETTER_LIMIT as u64 };

/// A queue's statistics.
#[derive(Clone, Debug)]
pub struct Stats {
    /// Pause flag and counts per state.
    pub meta: QueueMeta,
    /// How long the next job to be delivered has been ready, in ms.
    pub head_age_ms: Option<u64>,
    /// `(upper bound ms from now, delayed jobs due within it)`; the last bound is `None`: all.
    pub due_histogram: Vec<(Option<u64>, u64)>,
}

/// A page of a dead letter.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    /// How many jobs the dead letter holds.
    pub size: u64,
    /// The oldest of them, up to the limit asked for.
    pub jobs: Vec<Job>,
}

/// A page of the queue listing.
#[derive(Clone, Debug)]
pub struct QueueList {
    /// Queues with their counts, sorted by namespace then name.
    pub queues: Vec<(QueueName, QueueMeta)>,
    /// Whether the limit cut the list short.
    pub truncated: bool,
}

impl Service {
    /// Runs a bulk operation as a sequence of bounded commands: `command(n)` asks for at
    /// most `n` more jobs, until `total` jobs are done or a command reports nothing more.
    async fn chunked(
        &self,
        total: u64,
        command: impl Fn(u32) -> Command,
    ) -> Result<u64, ServiceError> {
        let mut done = 0u64;
        while done < total {
            // The state machine caps each command at its own bound.
            let want = u32::try_from(total - done).unwrap_or(u32::MAX);
            match self.write_one(command(want)).await? {
                Reply::Count { count, more } => {
                    done += count;
                    if !more {
                        break;
                    }
                }
                r => return Err(unexpected(r)),
            }
        }
        Ok(done)
    }

    /// Counts per state and the pause flag.
    pub async fn queue_meta(
        &self,
        caller: &Principal,
        queue: &QueueName,
        stale: bool,
    ) -> Result<QueueMeta, ServiceError> {
        self.authorize(caller, Scope::queue(queue, Access::Read))?;
        self.read(stale, |v| query::queue_meta(v, queue)).await
    }

    /// Counts, head age and the upcoming-due histogram.
    pub async fn stats(
        &self,
        caller: &Principal,
        queue: &QueueName,
        stale: bool,
    ) -> Result<Stats, ServiceError> {
        self.authorize(caller, Scope::queue(queue, Access::Read))?;
        let now = self.now_ms();
        self.read(stale, |v| {
            let meta = query::queue_meta(v, queue)?;
            let head_age_ms = query::peek_ready(v, queue)?.map(|j| now.saturating_sub(j.due_ms));
            let counts = query::due_histogram(v, queue, now, &HISTOGRAM_BOUNDS_MS)?;
            let bounds = HISTOGRAM_BOUNDS_MS.iter().map(|b| Some(*b)).chain([None]);
            Ok(Stats { meta, head_age_ms, due_histogram: bounds.zip(counts).collect() })
        })
        .await
    }

    /// Every queue (of `namespace`, if given) with its counts, sorted by name; at most
    /// `limit` (default 1000, at most 10,000).
    pub async fn queues(
        &self,
        caller: &Principal,
        namespace: Option<&str>,
        limit: Option<u64>,
        stale: bool,
    ) -> Result<QueueList, ServiceError> {
        self.authorize(caller, Scope::Admin)?;
        if let Some(ns) = namespace {
            check_name("namespace", ns)?;
        }
        let limit = QUEUES_LIMIT.check(limit)? as usize;
        // One more than asked for tells whether the list was cut short.
        let mut queues = self.read(stale, |v| query::queues(v, namespace, limit + 1)).await?;
        let truncated = queues.len() > limit;
        queues.truncate(limit);
        Ok(QueueList { queues, truncated })
    }

    /// The queues of `namespace` with their counts, sorted by name, at most
    /// [`QUEUES_LIMIT`]'s maximum: the namespace's own listing (beanstalkd's `list-tubes`),
    /// open to its tokens, where [`Service::queues`] is the admin's view of them all.
    pub async fn namespace_queues(
        &self,
        caller: &Principal,
        namespace: &str,
        stale: bool,
    ) -> Result<Vec<(QueueName, QueueMeta)>, ServiceError> {
        self.authorize(caller, Scope::Namespace(namespace, Access::Read))?;
        let limit = QUEUES_LIMIT.max as usize;
        self.read(stale, |v| query::queues(v, Some(namespace), limit)).await
    }

    /// Pauses or resumes a queue.
    pub async fn set_paused(
        &self,
        caller: &Principal,
        queue: QueueName,
        paused: bool,
    ) -> Result<(), ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        self.write_one(Command::SetPaused { queue, paused }).await.map(|_| ())
    }

    /// Removes the ready jobs of a queue (`all`: every job): those it held when the call
    /// began, in chunks, plus whatever arrives meanwhile in a chunk's range.
    pub async fn destroy(
        &self,
        caller: &Principal,
        queue: QueueName,
        all: bool,
    ) -> Result<u64, ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        let meta = self.read(false, |v| query::queue_meta(v, &queue)).await?;
        let held = if all { meta.counts.iter().sum::<u64>() } else { meta.count(JobState::Ready) };
        // At least one command, so a destroy of an empty queue still goes through the log.
        self.chunked(held.max(1), |_| Command::Destroy { queue: queue.clone(), all }).await
    }

    /// The dead letter's size and its oldest jobs, up to `limit` (default 10, at most 1000).
    pub async fn dead_letter(
        &self,
        caller: &Principal,
        queue: &QueueName,
        limit: Option<u64>,
        stale: bool,
    ) -> Result<DeadLetter, ServiceError> {
        self.authorize(caller, Scope::queue(queue, Access::Read))?;
        let limit = DEAD_JOBS_LIMIT.check(limit)? as usize;
        self.read(stale, |v| {
            let size = query::queue_meta(v, queue)?.count(JobState::Dead);
            Ok(DeadLetter { size, jobs: query::dead_letter(v, queue, limit)? })
        })
        .await
    }

    /// Moves up to `limit` (default 1) dead jobs back to ready with one try and a new ttl
    /// (`None`: lmstfy's default of a day; `Some(0)`: never expires). Returns how many moved.
    pub async fn respawn(
        &self,
        caller: &Principal,
        queue: QueueName,
        limit: Option<u64>,
        ttl_ms: Option<u64>,
    ) -> Result<u64, ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        let limit = DEAD_LETTER_BATCH.check(limit)?;
        if let Some(given) = ttl_ms.filter(|t| *t > 0) {
            self.checks().horizon("ttl", given)?;
        }
        let ttl_ms = validate::ttl(ttl_ms);
        self.chunked(limit, |limit| Command::Respawn { queue: queue.clone(), limit, ttl_ms }).await
    }

    /// Makes up to `limit` dead jobs ready again, keeping their tries and ttl, or, when the
    /// queue has none, up to `limit` delayed jobs (beanstalkd's `kick`). Returns how many.
    pub async fn kick(
        &self,
        caller: &Principal,
        queue: QueueName,
        limit: u64,
    ) -> Result<u64, ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        // Each command goes on with the kind it started with while it reports more, so a
        // kick of buried jobs does not go on to delayed ones.
        self.chunked(limit, |limit| Command::Kick { queue: queue.clone(), limit }).await
    }

    /// Deletes up to `limit` (default 1) dead jobs. Returns how many went.
    pub async fn purge(
        &self,
        caller: &Principal,
        queue: QueueName,
        limit: Option<u64>,
    ) -> Result<u64, ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        let limit = DEAD_LETTER_BATCH.check(limit)?;
        self.chunked(limit, |limit| Command::Purge { queue: queue.clone(), limit }).await
    }
}
