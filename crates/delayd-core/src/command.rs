//! Commands (what enters the Raft log) and their replies.
//!
//! Everything that is not deterministic — the clock, job ids, lease tokens — is chosen by the
//! leader and carried inside the command, so every replica computes the same state.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::kv::{KvError, KvRead};
use crate::model::{Job, JobId, QueueName, Schedule, Webhook};

/// One Raft log entry: a batch of commands applied in order at one leader timestamp.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The leader's wall clock when it proposed the entry (unix ms). The state machine uses
    /// `max(now_ms, clock)`, so replicated time never runs backwards.
    pub now_ms: u64,
    /// The commands, applied in order; each gets its own reply. Shared rather than owned:
    /// the log keeps recent entries in memory for replication and apply to read
    /// (`delayd-store`), and handing one out must not copy every job body it carries. On
    /// the wire and on disk it is the same sequence as a `Vec` (serde's `rc` feature).
    pub commands: Arc<[Command]>,
}

impl Entry {
    /// An entry of `commands` stamped `now_ms`.
    pub fn new(now_ms: u64, commands: Vec<Command>) -> Entry {
        Entry { now_ms, commands: commands.into() }
    }

    /// An upper estimate of the entry's encoded size in bytes: its commands'
    /// [`Command::size_bytes`] and the stamp's and count's varints.
    pub fn size_bytes(&self) -> usize {
        20 + self.commands.iter().map(Command::size_bytes).sum::<usize>()
    }
}

impl std::fmt::Display for Entry {
    /// A one-line summary for Raft's logs: the stamp and how many commands, not their bodies.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "entry at {} ms with {} commands", self.now_ms, self.commands.len())
    }
}

/// Everything needed to create a job, validated before it is proposed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewJob {
    /// Drawn by the node that proposes the publish (a new ULID), never one of a job the state
    /// holds: the state machine stores a publish without looking for the id, and the store
    /// deletes the job's index keys on the ground that each was put once
    /// ([`Cf::written_once`](crate::Cf::written_once)).
    pub id: JobId,
    /// Optional idempotency key.
    pub key: Option<String>,
    /// Payload. Encoded as one byte string (the same bytes on the wire as a sequence of u8
    /// in postcard, but copied at once instead of element by element).
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
    /// Attributes.
    pub attributes: BTreeMap<String, String>,
    /// When the job should be due.
    pub due: Due,
    /// Time to live from publish; `None` never expires.
    pub ttl_ms: Option<u64>,
    /// Maximum deliveries (≥ 1).
    pub tries: u16,
    /// Default time-to-run.
    pub ttr_ms: u64,
    /// 0 is most urgent.
    pub priority: u32,
}

/// A due time, relative to the replicated clock or absolute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Due {
    /// `delay_ms` after the command's time.
    After(u64),
    /// At this unix ms (in the past means now).
    At(u64),
}

/// Which job a command addresses: by id or by client key, always within a queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Target {
    /// By server id.
    Id(JobId),
    /// By client key.
    Key(String),
}

/// A state-machine command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Create a job (or return the live job holding the same key).
    Publish {
        /// Destination.
        queue: QueueName,
        /// The job.
        job: NewJob,
    },
    /// Replace a job with a new one, atomically (lmstfy's `PUT …/job/{id}`).
    Republish {
        /// Destination.
        queue: QueueName,
        /// The job replaced; it is removed whatever its state.
        old: JobId,
        /// The replacement.
        job: NewJob,
    },
    /// Take up to `count` ready jobs from the queues, in the order given.
    Reserve {
        /// Queues in priority order.
        queues: Vec<QueueName>,
        /// At most this many jobs (≥ 1).
        count: u32,
        /// Time-to-run override; `None` uses each job's own.
        ttr_ms: Option<u64>,
        /// Leader-chosen randomness from which each delivery's lease token is derived.
        lease_seed: u64,
    },
    /// Remove a job. With a lease, only the holder of that reservation may.
    Ack {
        /// The queue.
        queue: QueueName,
        /// The job.
        id: JobId,
        /// Required current lease, if given.
        lease: Option<u64>,
    },
    /// Put a reserved job back, now or after a delay.
    Release {
        /// The queue.
        queue: QueueName,
        /// The job.
        id: JobId,
        /// Required current lease, if given.
        lease: Option<u64>,
        /// Delay before it is ready again.
        delay_ms: u64,
        /// New priority.
        priority: Option<u32>,
    },
    /// Extend a reservation.
    Touch {
        /// The queue.
        queue: QueueName,
        /// The job.
        id: JobId,
        /// Required current lease, if given.
        lease: Option<u64>,
        /// New time-to-run from now; `None` reuses the reservation's.
        ttr_ms: Option<u64>,
    },
    /// Move a reserved job to the dead letter.
    Bury {
        /// The queue.
        queue: QueueName,
        /// The job.
        id: JobId,
        /// Required current lease, if given.
        lease: Option<u64>,
    },
    /// Change a pending (delayed or ready) job.
    Update {
        /// The queue.
        queue: QueueName,
        /// The job.
        target: Target,
        /// New due time.
        due: Option<Due>,
        /// New body.
        #[serde(with = "serde_bytes")]
        body: Option<Vec<u8>>,
        /// New priority.
        priority: Option<u32>,
    },
    /// Delete a job in any state, by id or key.
    Cancel {
        /// The queue.
        queue: QueueName,
        /// The job.
        target: Target,
    },
    /// Move up to `limit` dead jobs back to ready, with one try and a new ttl (at most
    /// [`crate::limits::MAX_JOBS_PER_COMMAND`] per command).
    Respawn {
        /// The queue.
        queue: QueueName,
        /// At most this many.
        limit: u32,
        /// New time to live; `None` never expires.
        ttl_ms: Option<u64>,
    },
    /// Delete up to `limit` dead jobs, oldest first (at most
    /// [`crate::limits::MAX_JOBS_PER_COMMAND`] per command).
    Purge {
        /// The queue.
        queue: QueueName,
        /// At most this many.
        limit: u32,
    },
    /// Pause or resume reserving from a queue.
    SetPaused {
        /// The queue.
        queue: QueueName,
        /// New flag.
        paused: bool,
    },
    /// Remove the queue's ready jobs, or with `all` every job of the queue, at most
    /// [`crate::limits::MAX_JOBS_PER_COMMAND`] of them per command.
    Destroy {
        /// The queue.
        queue: QueueName,
        /// Every state, not just ready.
        all: bool,
    },
    /// Create a namespace token (the admin API's `POST /token/{ns}`). The token string is
    /// drawn by the node that took the request; a token that exists is rejected, never
    /// overwritten.
    CreateToken {
        /// The token.
        token: String,
        /// The namespace it opens.
        namespace: String,
        /// Operator's note.
        description: String,
        /// Read requests per second per node; 0 = no limit.
        read_limit: u32,
        /// Write requests per second per node; 0 = no limit.
        write_limit: u32,
    },
    /// Delete a token of a namespace; `Removed(false)` when the namespace has no such token.
    DeleteToken {
        /// The namespace it must belong to.
        namespace: String,
        /// The token.
        token: String,
    },
    /// Fire every deadline at or before the clock, at most `limit` of them.
    Tick {
        /// Bound on the work one entry does.
        limit: u32,
    },
    /// Set a queue's webhook (push delivery), replacing any; `Replaced(bool)` says whether
    /// one was replaced.
    SetWebhook {
        /// The queue.
        queue: QueueName,
        /// What to call and how.
        webhook: Webhook,
    },
    /// Remove a queue's webhook: the queue is pull-only again. `Removed(false)` when it had
    /// none.
    DeleteWebhook {
        /// The queue.
        queue: QueueName,
    },
    /// Create or replace a schedule, with its first occurrence already computed;
    /// `Replaced(bool)`.
    SetSchedule {
        /// The queue its jobs go to.
        queue: QueueName,
        /// The schedule.
        schedule: Schedule,
    },
    /// Remove a schedule; `Removed(false)` when there was none.
    DeleteSchedule {
        /// Its queue.
        queue: QueueName,
        /// Its name.
        name: String,
    },
    /// Fire a schedule's due occurrence `at_ms`: publish `jobs` (one per occurrence fired,
    /// none when missed occurrences are skipped) and move the schedule to `next_at_ms`.
    /// A schedule whose next occurrence is no longer `at_ms` (fired already, replaced,
    /// removed) is left alone: `Count { count: 0 }`.
    FireSchedule {
        /// Its queue.
        queue: QueueName,
        /// Its name.
        name: String,
        /// The occurrence the proposer saw due.
        at_ms: u64,
        /// The jobs of the occurrences fired, keys and due times set.
        jobs: Vec<NewJob>,
        /// The occurrence after them; `None`: the schedule has ended.
        next_at_ms: Option<u64>,
    },
    /// A delivery failed (a push that was refused, timed out or could not connect): the
    /// reserved job records `error` (attribute [`crate::model::LAST_ERROR_ATTRIBUTE`]) and
    /// goes back after `delay_ms` while tries remain, else to the dead letter.
    Fail {
        /// The job's queue.
        queue: QueueName,
        /// The job.
        id: JobId,
        /// The reservation that failed; only its holder may fail it.
        lease: Option<u64>,
        /// What went wrong, for whoever looks at the job next.
        error: String,
        /// Backoff before the next try.
        delay_ms: u64,
    },
    /// Take up to `count` ready jobs across the queues, most urgent first: the lowest
    /// priority value, then the longest in line, whatever the queue (beanstalkd's reserve
    /// over the tubes it watches). [`Command::Reserve`] instead empties the queues in the
    /// order given.
    ReserveUrgent {
        /// The queues.
        queues: Vec<QueueName>,
        /// At most this many jobs (≥ 1).
        count: u32,
        /// Time-to-run override; `None` uses each job's own.
        ttr_ms: Option<u64>,
        /// Leader-chosen randomness from which each delivery's lease token is derived.
        lease_seed: u64,
    },
    /// Reserve one job by id, out of line, when it is ready, delayed or dead (beanstalkd's
    /// `reserve-job`).
    ReserveJob {
        /// The queue.
        queue: QueueName,
        /// The job.
        id: JobId,
        /// Time-to-run override; `None` uses the job's own.
        ttr_ms: Option<u64>,
        /// Leader-chosen randomness from which the lease token is derived.
        lease_seed: u64,
    },
    /// Make up to `limit` dead jobs ready again, oldest first, keeping their tries and ttl;
    /// when the queue has no dead job, up to `limit` delayed jobs instead, the soonest due
    /// first (beanstalkd's `kick`). At most [`crate::limits::MAX_JOBS_PER_COMMAND`] per command.
    Kick {
        /// The queue.
        queue: QueueName,
        /// At most this many.
        limit: u32,
    },
    /// Make one dead or delayed job ready now (beanstalkd's `kick-job`).
    KickJob {
        /// The queue.
        queue: QueueName,
        /// The job.
        id: JobId,
    },
    /// Put a reserved job back in line at once because its holder is gone (its connection
    /// closed, or the answer that carried it never reached the consumer): a release that
    /// is not counted as the consumer's.
    Return {
        /// The queue.
        queue: QueueName,
        /// The job.
        id: JobId,
        /// The reservation given back; only its holder's is.
        lease: u64,
    },
    /// Move a reserved job to the dead letter with a new priority (beanstalkd's
    /// `bury <id> <pri>`).
    BuryWithPriority {
        /// The queue.
        queue: QueueName,
        /// The job.
        id: JobId,
        /// Required current lease, if given.
        lease: Option<u64>,
        /// Its priority from now on.
        priority: u32,
    },
}

impl Command {
    /// The outcome of this command when `kv` shows that applying it would change nothing
    /// visible: a reserve with nothing ready answers "no jobs". The leader answers such a
    /// command from its state instead of spending a log entry (and an fsync on every node) on
    /// it; `None` means it must go through the log.
    pub fn idle_outcome(&self, kv: &impl KvRead) -> Result<Option<Outcome>, KvError> {
        match self {
            Command::Reserve { queues, .. } | Command::ReserveUrgent { queues, .. }
                if !crate::query::anything_ready(kv, queues)? =>
            {
                Ok(Some(Ok(Reply::Reserved(Vec::new()))))
            }
            _ => Ok(None),
        }
    }

    /// An upper estimate of the command's encoded size in bytes, cheap to compute: the
    /// variable-length parts (body, key, attributes, names) plus a fixed allowance for the
    /// rest. The proposer bounds an entry's size with it without encoding anything.
    pub fn size_bytes(&self) -> usize {
        // Tags, varint lengths and the fixed-width fields: about 80 bytes at their widest.
        const FIXED: usize = 128;
        let queue = |q: &QueueName| q.namespace.len() + q.queue.len();
        let job = |j: &NewJob| {
            j.body.len()
                + j.key.as_ref().map_or(0, String::len)
                + j.attributes.iter().map(|(k, v)| k.len() + v.len() + 4).sum::<usize>()
        };
        FIXED
            + match self {
                Command::Publish { queue: q, job: j }
                | Command::Republish { queue: q, job: j, .. } => queue(q) + job(j),
                Command::Reserve { queues, .. } | Command::ReserveUrgent { queues, .. } => {
                    queues.iter().map(|q| queue(q) + 4).sum()
                }
                Command::Update { queue: q, target, body, .. } => {
                    queue(q) + target_len(target) + body.as_ref().map_or(0, Vec::len)
                }
                Command::Cancel { queue: q, target } => queue(q) + target_len(target),
                Command::Ack { queue: q, .. }
                | Command::Release { queue: q, .. }
                | Command::Touch { queue: q, .. }
                | Command::Bury { queue: q, .. }
                | Command::Respawn { queue: q, .. }
                | Command::Purge { queue: q, .. }
                | Command::SetPaused { queue: q, .. }
                | Command::Destroy { queue: q, .. }
                | Command::ReserveJob { queue: q, .. }
                | Command::Kick { queue: q, .. }
                | Command::KickJob { queue: q, .. }
                | Command::BuryWithPriority { queue: q, .. }
                | Command::Return { queue: q, .. } => queue(q),
                Command::CreateToken { token, namespace, description, .. } => {
                    token.len() + namespace.len() + description.len()
                }
                Command::DeleteToken { namespace, token } => namespace.len() + token.len(),
                Command::Tick { .. } => 0,
                Command::SetWebhook { queue: q, webhook: w } => {
                    queue(q) + w.url.len() + w.secret.len()
                }
                Command::DeleteWebhook { queue: q } => queue(q),
                Command::Fail { queue: q, error, .. } => queue(q) + error.len(),
                Command::SetSchedule { queue: q, schedule: s } => {
                    queue(q)
                        + s.name.len()
                        + s.job.body.len()
                        + 64 * s.job.attributes.len()
                        + s.job.attributes.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
                        + match &s.timetable {
                            crate::model::Timetable::Every { .. } => 0,
                            crate::model::Timetable::Cron { expr, tz } => expr.len() + tz.len(),
                        }
                }
                Command::DeleteSchedule { queue: q, name } => queue(q) + name.len(),
                Command::FireSchedule { queue: q, name, jobs, .. } => {
                    queue(q) + name.len() + jobs.iter().map(|j| job(j) + 64).sum::<usize>()
                }
            }
    }
}

fn target_len(t: &Target) -> usize {
    match t {
        Target::Id(_) => 16,
        Target::Key(k) => k.len(),
    }
}

/// A business rejection: a value returned to the client, never a storage error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Rejection {
    /// No such job in that queue.
    #[error("job not found")]
    JobNotFound,
    /// The job is not reserved, or the lease shown is not its current one.
    #[error("lease is not current")]
    LeaseNotCurrent,
    /// The job is not in a state the command applies to.
    #[error("job is {0}, not {1}")]
    WrongState(String, String),
    /// The command is invalid against the current state (e.g. due after expiry).
    #[error("{0}")]
    Invalid(String),
}

/// A delivered job with its lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// The job as it is now reserved.
    pub job: Job,
    /// Lease token.
    pub lease: u64,
}

/// A command's successful outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// A job was created.
    Published {
        /// Its id.
        id: JobId,
        /// Its number ([`Job::number`]).
        number: u64,
    },
    /// A live job (or one inside the dedup window) already holds the key.
    Exists {
        /// The existing job.
        id: JobId,
    },
    /// Jobs handed out (possibly none).
    Reserved(Vec<Delivery>),
    /// The job was acked or deleted; `false` when it did not exist.
    Removed(bool),
    /// The command took effect on the job; its new record.
    Job(Box<Job>),
    /// One chunk of a bulk operation (destroy, respawn, purge): jobs affected, and whether
    /// the command stopped at its bound ([`crate::limits`]) with more left to do.
    Count {
        /// Jobs affected by this command.
        count: u64,
        /// More jobs were left for the next command.
        more: bool,
    },
    /// A tick fired `fired` deadlines; `more` when it stopped at its limit.
    Ticked {
        /// Deadlines processed.
        fired: u64,
        /// More deadlines were due.
        more: bool,
    },
    /// Nothing to report.
    Done,
    /// A setting was stored; `true` when it replaced one.
    Replaced(bool),
}

/// A command's result.
pub type Outcome = Result<Reply, Rejection>;
