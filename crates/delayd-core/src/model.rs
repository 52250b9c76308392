//! The job and the small value types around it.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A job id: a 128-bit ULID chosen by the leader before the command enters the log, shown to
/// clients as 26 Crockford base32 characters. Ids sort by creation time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobId(pub u128);

impl JobId {
    /// Big-endian bytes: the form used inside keys, so ids sort by time there too.
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    /// Inverse of [`JobId::to_bytes`].
    pub fn from_bytes(b: [u8; 16]) -> Self {
        JobId(u128::from_be_bytes(b))
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", ulid::Ulid(self.0))
    }
}

impl FromStr for JobId {
    type Err = ulid::DecodeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(JobId(ulid::Ulid::from_string(s)?.0))
    }
}

/// A queue, named by namespace and queue name (both `^[-_A-Za-z0-9]{1,255}$`, checked at the
/// edge before anything reaches the log).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct QueueName {
    /// Tenant.
    pub namespace: String,
    /// Queue within the namespace.
    pub queue: String,
}

impl QueueName {
    /// Builds a queue name.
    pub fn new(namespace: impl Into<String>, queue: impl Into<String>) -> Self {
        QueueName { namespace: namespace.into(), queue: queue.into() }
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.queue)
    }
}

/// Where a job is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    /// Waiting for its due time.
    Delayed,
    /// Deliverable now.
    Ready,
    /// Handed to a consumer under a lease.
    Reserved,
    /// In the dead letter: out of tries or buried. Never expires.
    Dead,
}

impl JobState {
    /// Every state, in the order of [`QueueMeta::counts`].
    pub const ALL: [JobState; 4] =
        [JobState::Delayed, JobState::Ready, JobState::Reserved, JobState::Dead];

    /// Lower-case name, as shown by the API.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Delayed => "delayed",
            JobState::Ready => "ready",
            JobState::Reserved => "reserved",
            JobState::Dead => "dead",
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            JobState::Delayed => 0,
            JobState::Ready => 1,
            JobState::Reserved => 2,
            JobState::Dead => 3,
        }
    }
}

/// The reservation a consumer holds on a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Token the consumer shows to ack, release, touch or bury; chosen by the leader.
    pub token: u64,
    /// When the reservation times out (unix ms).
    pub deadline_ms: u64,
    /// The time-to-run this reservation was taken with; touch extends by it.
    pub ttr_ms: u64,
}

/// A job record, stored under its id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// Server-chosen id.
    pub id: JobId,
    /// The queue it belongs to.
    pub queue: QueueName,
    /// Optional client key, unique per queue while the job lives.
    pub key: Option<String>,
    /// Opaque payload (one byte string on the wire, see [`crate::NewJob::body`]).
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
    /// Client attributes (lmstfy `Job-Attr-*`).
    pub attributes: BTreeMap<String, String>,
    /// Current state.
    pub state: JobState,
    /// 0 is most urgent.
    pub priority: u32,
    /// Publish time (unix ms, replicated clock).
    pub created_ms: u64,
    /// When the job is (or was) due.
    pub due_ms: u64,
    /// When the job expires unless finished; `None` never. Not applied while dead.
    pub expires_ms: Option<u64>,
    /// Maximum deliveries.
    pub tries: u16,
    /// Deliveries so far.
    pub attempts: u16,
    /// Default time-to-run of a reservation.
    pub ttr_ms: u64,
    /// The reservation, when reserved.
    pub lease: Option<Lease>,
    /// Position in the ready or dead-letter order, when ready or dead.
    pub seq: u64,
    /// How often the job went through the transitions beanstalkd counts per job.
    pub counters: JobCounters,
    /// The job's number: a second id, an integer unique in the cluster, given by the state
    /// machine in the order jobs are stored, from 1 (beanstalkd's job ids). 0 only for a job
    /// stored before numbers existed, until its next change numbers it. This field and
    /// `counters` came with encoding version 2 and must stay the last ones (see
    /// [`crate::codec::decode_job`]).
    pub number: u64,
}

/// How often a job went through the transitions beanstalkd counts per job (`stats-job`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobCounters {
    /// Reservations whose ttr ran out.
    pub timeouts: u32,
    /// Reservations the consumer released.
    pub releases: u32,
    /// Reservations the consumer buried.
    pub buries: u32,
    /// Kicks out of the dead letter or out of the delay.
    pub kicks: u32,
}

impl Job {
    /// Deliveries left after the current one (lmstfy's `remain_tries`).
    pub fn remain_tries(&self) -> u16 {
        self.tries.saturating_sub(self.attempts)
    }

    /// Bytes a delivery of the job carries to the client: body, attributes and key.
    pub fn payload_bytes(&self) -> usize {
        let attributes: usize = self.attributes.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.body.len() + attributes + self.key.as_ref().map_or(0, String::len)
    }
}

/// Per-queue metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueMeta {
    /// Reserve hands nothing out while paused; publishes are still accepted.
    pub paused: bool,
    /// Jobs per state: delayed, ready, reserved, dead.
    pub counts: [u64; 4],
}

impl QueueMeta {
    /// Jobs in `state`.
    pub fn count(&self, state: JobState) -> u64 {
        self.counts[state.index()]
    }

    /// Whether a reserve from the queue would find a job: some ready, and not paused.
    pub fn has_job_to_hand_out(&self) -> bool {
        !self.paused && self.count(JobState::Ready) > 0
    }
}

/// The attribute in which a job records its last failed delivery (see
/// [`crate::Command::Fail`]). Client attributes may not use the `delayd-` prefix.
pub const LAST_ERROR_ATTRIBUTE: &str = "delayd-last-error";

/// A queue's push delivery: its due jobs are POSTed to `url` by the leader's dispatcher.
/// Kept in the replicated state, so every node agrees on it and a new leader resumes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Webhook {
    /// Where jobs are POSTed: an `http` or `https` URL.
    pub url: String,
    /// How long one request may take before it counts as failed.
    pub timeout_ms: u64,
    /// Most requests in flight at once for the queue.
    pub max_in_flight: u32,
    /// Most requests started per second; 0: no limit.
    pub rate_per_s: u32,
    /// The first retry's backoff ceiling; each further try doubles it.
    pub backoff_initial_ms: u64,
    /// The largest backoff.
    pub backoff_max_ms: u64,
    /// The HMAC-SHA256 key of the requests' signatures.
    pub secret: String,
}

/// A recurring job: each occurrence of its timetable publishes one ordinary job, under the
/// key `{name}@{occurrence_ms}` (so one job per occurrence, whatever is retried).
///
/// The timetable itself is computed outside the state machine (cron expressions and time
/// zones depend on a library's tz data, which must not decide replicated state): whoever
/// proposes a [`crate::Command::SetSchedule`] or [`crate::Command::FireSchedule`] carries
/// the next occurrence in it, and the state machine keeps it in the schedule index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// Its name, unique in its queue.
    pub name: String,
    /// When it fires.
    pub timetable: Timetable,
    /// The job each occurrence publishes.
    pub job: JobTemplate,
    /// No occurrence before this time (unix ms); also the anchor of `Every`.
    pub start_at_ms: u64,
    /// No occurrence after this time (unix ms).
    pub end_at_ms: Option<u64>,
    /// What to do with occurrences missed while no leader could fire them.
    pub catch_up: CatchUp,
    /// The next occurrence to fire; `None` once the schedule has ended.
    pub next_at_ms: Option<u64>,
}

/// When a schedule fires.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Timetable {
    /// Every `ms`, from the schedule's start.
    Every {
        /// The period.
        ms: u64,
    },
    /// A cron expression with seconds first (6 fields), in an IANA time zone.
    Cron {
        /// The expression.
        expr: String,
        /// The zone its fields are read in, e.g. `Europe/Berlin`.
        tz: String,
    },
}

/// What a schedule does about occurrences missed by more than one period (an outage).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CatchUp {
    /// Fire the most recent missed occurrence once.
    #[default]
    Latest,
    /// Fire none of them.
    None,
    /// Fire every one of them, oldest first (bounded by whoever fires them).
    All,
}

/// The job a schedule publishes, but for its id, key and due time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobTemplate {
    /// The body.
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
    /// Attributes; the schedule's name is added as `schedule`.
    pub attributes: BTreeMap<String, String>,
    /// Time to live from its occurrence; `None` never expires.
    pub ttl_ms: Option<u64>,
    /// Maximum deliveries.
    pub tries: u16,
    /// Default time-to-run of its reservations.
    pub ttr_ms: u64,
    /// 0 is most urgent.
    pub priority: u32,
}

/// A namespace's access token, kept in the replicated state so every node agrees on it.
///
/// The token string itself is the record's key (see [`crate::keys::token`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// The namespace the token opens; it grants nothing in any other namespace.
    pub namespace: String,
    /// Free text from the operator who created it.
    pub description: String,
    /// When it was created (unix ms, replicated clock).
    pub created_ms: u64,
    /// Most read requests (GET) per second on each node; 0 = no limit.
    pub read_limit: u32,
    /// Most write requests (everything else) per second on each node; 0 = no limit.
    pub write_limit: u32,
}
