//! Applying commands: every job transition of delayd, in one place.
//!
//! [`apply`] runs one log [`Entry`] against an [`Overlay`]. Each transition is written as
//! "take the job out of the indexes of its state, change it, put it into the indexes of its
//! new state" ([`Tx::unindex`] / [`Tx::index`]), so a job is always in exactly the indexes its
//! state calls for — which is also why a timer entry can never fire twice: firing removes it.
//!
//! Time: the entry's `now_ms` moves the replicated clock forward, never back. Every deadline is
//! absolute. A tick fires only what is due at the clock, so a tick proposed late by a deposed
//! leader finds nothing left to do (ticks are idempotent).
//!
//! Tries: `tries` bounds deliveries that time out. When the reservation of the last try
//! expires the job goes to the dead letter; an explicit release is the consumer's decision and
//! always puts the job back (its next delivery reports `remain_tries` 0).

use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};

use crate::codec::{decode, decode_job, encode, encode_job};
use crate::command::{Command, Delivery, Due, Entry, NewJob, Outcome, Rejection, Reply, Target};
use crate::keys::{self, KeyRecord, TimerKind, META_CLOCK, META_NUMBER, META_SEQ};
use crate::kv::{Cf, KvError, KvRead, Overlay};
use crate::limits::{MAX_JOBS_PER_COMMAND, MAX_RESERVE_BYTES, MAX_WORK_BYTES_PER_COMMAND};
use crate::model::{
    Job, JobId, JobState, Lease, QueueMeta, QueueName, Schedule, TokenRecord, LAST_ERROR_ATTRIBUTE,
};

/// How long a finished job's client key still dedups publishes.
pub const DEDUP_WINDOW_MS: u64 = 10 * 60 * 1000;

/// What an applied batch means for the world outside the state machine: which long-poll
/// waiters to wake, whether the timer pump must wake earlier than it planned, which queues
/// have a job to hand out (a leader's hint), and what happened to jobs (for metrics).
///
/// Every replica applies the same entries, so every replica computes the same effects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// Queues that gained ready jobs, with how many they gained (a resumed queue counts
    /// every ready job it holds): that many long-poll waiters are worth waking, no more.
    ///
    /// A job that the same entry made ready and reserved again still counts. Counted
    /// without them, the timer's p99 at saturation rose with one-job and `ack=` consumers in
    /// three pairs of four (tried). The likely reason, read from the code and not traced: the
    /// reserves that ride a tick are parked waiters themselves, mostly parked before the
    /// others, and a wake-up reaches the longest waiting first, so the wake-ups their jobs add
    /// are the ones they take.
    pub ready_queues: BTreeMap<QueueName, u64>,
    /// The earliest timer deadline added by the batch.
    pub earliest_timer_ms: Option<u64>,
    /// Job transitions per queue. A queue appears only once it had an event.
    pub events: BTreeMap<QueueName, JobEvents>,
    /// For every delayed job that a tick made ready: the replicated clock of the tick minus
    /// the job's due time, in ms. At most a tick's `limit` values per entry.
    pub timer_lateness_ms: Vec<u64>,
    /// Namespace tokens the batch deleted, so each node can drop what it keeps beside the
    /// replicated state (their rate limiters).
    pub deleted_tokens: Vec<String>,
    /// Whether the batch set or removed a webhook: the dispatcher looks at them again.
    pub webhooks_changed: bool,
    /// Whether the batch set, removed or fired a schedule: the schedule pump looks again.
    pub schedules_changed: bool,
    /// The queues whose metadata the batch changed, each with whether a reserve from it
    /// would find a job once the batch is applied (some ready and the queue not paused). Each
    /// node keeps these as hints, so that as leader it sends a reserve from a busy queue to the
    /// log without a look at the state for whether it would find nothing.
    pub reservable: BTreeMap<QueueName, bool>,
}

/// How many jobs of one queue went through each transition in an applied batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobEvents {
    /// Jobs created by a publish or republish (a publish answered "exists" creates none).
    pub published: u64,
    /// Deliveries: jobs handed out by a reserve.
    pub reserved: u64,
    /// Jobs removed by an ack (not by cancel, destroy or purge).
    pub acked: u64,
    /// Reserved jobs put back by an explicit release.
    pub released: u64,
    /// Reservations whose ttr ran out (the job went back to ready or, out of tries, dead).
    pub timed_out: u64,
    /// Jobs removed because their ttl passed.
    pub expired: u64,
    /// Jobs moved to the dead letter: buried, or their last try timed out.
    pub dead_lettered: u64,
}

impl JobEvents {
    /// Adds another count to this one.
    pub fn add(&mut self, o: &JobEvents) {
        self.published += o.published;
        self.reserved += o.reserved;
        self.acked += o.acked;
        self.released += o.released;
        self.timed_out += o.timed_out;
        self.expired += o.expired;
        self.dead_lettered += o.dead_lettered;
    }
}

impl Effects {
    /// Folds another batch's effects into this one.
    pub fn merge(&mut self, other: Effects) {
        for (queue, n) in other.ready_queues {
            let gained = self.ready_queues.entry(queue).or_default();
            *gained = gained.saturating_add(n);
        }
        if let Some(t) = other.earliest_timer_ms {
            self.timer_added(t);
        }
        if self.events.is_empty() {
            self.events = other.events;
        } else {
            for (queue, events) in other.events {
                self.events.entry(queue).or_default().add(&events);
            }
        }
        self.timer_lateness_ms.extend(other.timer_lateness_ms);
        self.deleted_tokens.extend(other.deleted_tokens);
        self.webhooks_changed |= other.webhooks_changed;
        self.schedules_changed |= other.schedules_changed;
        // Later batches are applied after: their word on a queue is the current one.
        self.reservable.extend(other.reservable);
    }

    /// Counts `n` jobs made ready in `queue`.
    fn made_ready(&mut self, queue: &QueueName, n: u64) {
        let gained = match self.ready_queues.get_mut(queue) {
            Some(gained) => gained,
            None => self.ready_queues.entry(queue.clone()).or_default(),
        };
        *gained = gained.saturating_add(n);
    }

    fn timer_added(&mut self, deadline_ms: u64) {
        self.earliest_timer_ms =
            Some(self.earliest_timer_ms.map_or(deadline_ms, |e| e.min(deadline_ms)));
    }

    /// Counts one event of `queue`. Clones the queue name only for its first event, so a
    /// busy queue costs one lookup per event.
    fn count(&mut self, queue: &QueueName, event: fn(&mut JobEvents) -> &mut u64) {
        let events = match self.events.get_mut(queue) {
            Some(events) => events,
            None => self.events.entry(queue.clone()).or_default(),
        };
        *event(events) += 1;
    }
}

/// Applies one log entry, returning one outcome per command.
///
/// Errors are storage failures only; every business rejection is an [`Outcome`].
pub fn apply<R: KvRead + ?Sized>(
    kv: &mut Overlay<'_, R>,
    entry: &Entry,
    effects: &mut Effects,
) -> Result<Vec<Outcome>, KvError> {
    let clock = read_u64(kv, Cf::Meta, META_CLOCK)?.unwrap_or(0).max(entry.now_ms);
    kv.put(Cf::Meta, META_CLOCK.to_vec(), clock.to_be_bytes().to_vec());
    let demand = entry.commands.iter().map(reserve_demand).fold(0u64, u64::saturating_add);
    let mut tx = Tx {
        kv,
        now: clock,
        effects,
        loaded_bytes: Cell::new(0),
        ahead: Vec::new(),
        demand_left: demand,
        metas: BTreeMap::new(),
        seq: None,
        number: None,
    };
    let outcomes = entry.commands.iter().map(|c| tx.command(c)).collect::<Result<_, _>>()?;
    tx.write_metas();
    tx.write_counters();
    Ok(outcomes)
}

/// How many ready jobs a command may take from the heads of ready indexes.
fn reserve_demand(command: &Command) -> u64 {
    match command {
        Command::Reserve { count, .. } | Command::ReserveUrgent { count, .. } => u64::from(*count),
        _ => 0,
    }
}

/// At most this many ready keys are read ahead for the later reserves of an entry.
const READ_AHEAD_MAX: u64 = 256;

fn read_u64(kv: &impl KvRead, cf: Cf, key: &[u8]) -> Result<Option<u64>, KvError> {
    match kv.get(cf, key)? {
        Some(v) => {
            let b: [u8; 8] = v.as_slice().try_into().map_err(|_| KvError("bad u64".into()))?;
            Ok(Some(u64::from_be_bytes(b)))
        }
        None => Ok(None),
    }
}

/// The next value of the counter under Meta key `key`, whose last value the entry gave so
/// far is `last` (`None` until the entry first advances it: then it is read from `kv`).
fn next_counter<R: KvRead + ?Sized>(
    kv: &Overlay<'_, R>,
    last: &mut Option<u64>,
    key: &[u8],
) -> Result<u64, KvError> {
    let n = match *last {
        Some(n) => n,
        None => read_u64(kv, Cf::Meta, key)?.unwrap_or(0),
    }
    .checked_add(1)
    .ok_or_else(|| KvError(format!("counter {} is exhausted", String::from_utf8_lossy(key))))?;
    *last = Some(n);
    Ok(n)
}

/// Derives the i-th lease token of a reserve from the leader's seed (splitmix64): distinct per
/// delivery, and the same on every replica.
fn lease_token(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_add(i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The head of a queue's ready index: `(index key, id)` of each job, and the key after them.
type ReadyHead = (Vec<(Vec<u8>, JobId)>, Vec<u8>);

/// A queue's head in a round of [`Tx::reserve_urgent`]: its rank (priority, then place in
/// line), the queue, the head's index key and id, and where the queue's floor moves once the
/// head is taken.
type UrgentHead<'q> = (Vec<u8>, &'q QueueName, Vec<u8>, JobId, Vec<u8>);

/// A queue's ready index from its floor on, as far as one scan read it during an entry: the
/// entry's later reserves of the queue take their heads from here instead of each opening a
/// scan of its own (a RocksDB iterator, its seek and its drop), which was a sixth of applying
/// a consumer's ack and reserve.
///
/// It holds exactly the index keys of the queue in `[floor, next)`, as the overlay shows
/// them: every write to the ready index goes through [`Tx::index_keeping_seq`] or
/// [`Tx::unindex`], which keep it so (a key taken from the front is popped; any other change
/// inside the range drops the whole read-ahead, and the next reserve scans again).
struct ReadyAhead {
    queue: QueueName,
    /// The keys (and ids) from the head of the line on, in order.
    keys: VecDeque<(Vec<u8>, JobId)>,
    /// The first index key after them, or the end of the queue's range if the scan got there
    /// (no index key equals that end: scans stop before it).
    next: Vec<u8>,
}

/// One entry's application: the overlay, the clock and the effects being collected.
struct Tx<'t, 'a, R: KvRead + ?Sized> {
    kv: &'t mut Overlay<'a, R>,
    now: u64,
    effects: &'t mut Effects,
    /// Bytes of job records the current command has loaded: what bounds its work
    /// ([`MAX_WORK_BYTES_PER_COMMAND`]), since every record loaded may be rewritten.
    loaded_bytes: Cell<usize>,
    /// Ready indexes read ahead for the entry's later reserves, one per queue.
    ahead: Vec<ReadyAhead>,
    /// Jobs the entry's reserves after the current command may still take: how far a scan of
    /// a ready index reads ahead.
    demand_left: u64,
    /// The metadata of the queues the entry has touched, decoded, and whether it changed: a
    /// reserve or an ack changes its queue's counts once or twice per job, and each change
    /// was a read, a decode, an encode and a write of the same record. Read once per entry,
    /// written back once when the entry is done ([`Tx::write_metas`]); nothing else reads or
    /// writes the column family during an entry. A map: a tick may touch a queue per job.
    metas: BTreeMap<QueueName, (QueueMeta, bool)>,
    /// The last ready/dead-letter sequence number the entry gave, once it gave one: read on
    /// first use and written back once when the entry is done ([`Tx::write_counters`]), like
    /// `metas`. Every publish took a number (and a ready one a sequence number too) with a
    /// read and a write of the overlay's largest map, the `Meta` writes of the entry's jobs.
    seq: Option<u64>,
    /// The last job number the entry gave, once it gave one (see `seq`).
    number: Option<u64>,
}

type Result2<T> = Result<Result<T, Rejection>, KvError>;

impl<R: KvRead + ?Sized> Tx<'_, '_, R> {
    fn command(&mut self, command: &Command) -> Result<Outcome, KvError> {
        // Each command has its own budget, whatever else shares its entry.
        self.loaded_bytes.set(0);
        self.demand_left = self.demand_left.saturating_sub(reserve_demand(command));
        match command {
            Command::Publish { queue, job } => self.publish(queue, job),
            Command::Republish { queue, old, job } => {
                // A key held by another job wins: nothing is replaced.
                if let Some(key) = &job.key {
                    if let Some(rec) = self.key_record(queue, key)? {
                        if rec.id != *old {
                            return Ok(Ok(Reply::Exists { id: rec.id }));
                        }
                    }
                }
                if let Some(old) = self.job_in(queue, *old)? {
                    self.remove(old, false)?;
                }
                self.publish(queue, job)
            }
            Command::Reserve { queues, count, ttr_ms, lease_seed } => {
                self.reserve(queues, *count, *ttr_ms, *lease_seed).map(Ok)
            }
            Command::Ack { queue, id, lease } => self.ack(queue, *id, *lease),
            Command::Release { queue, id, lease, delay_ms, priority } => {
                self.release(queue, *id, *lease, *delay_ms, *priority, true)
            }
            Command::Return { queue, id, lease } => {
                self.release(queue, *id, Some(*lease), 0, None, false)
            }
            Command::Touch { queue, id, lease, ttr_ms } => self.touch(queue, *id, *lease, *ttr_ms),
            Command::Fail { queue, id, lease, error, delay_ms } => {
                self.fail(queue, *id, *lease, error, *delay_ms)
            }
            Command::SetSchedule { queue, schedule } => {
                let old = self.schedule(queue, &schedule.name)?;
                if let Some(at) = old.as_ref().and_then(|o| o.next_at_ms) {
                    self.kv.delete(Cf::Meta, keys::schedule_due(at, queue, &schedule.name));
                }
                self.save_schedule(queue, schedule)?;
                Ok(Ok(Reply::Replaced(old.is_some())))
            }
            Command::DeleteSchedule { queue, name } => match self.schedule(queue, name)? {
                Some(old) => {
                    if let Some(at) = old.next_at_ms {
                        self.kv.delete(Cf::Meta, keys::schedule_due(at, queue, name));
                    }
                    self.kv.delete(Cf::Meta, keys::schedule(queue, name));
                    self.effects.schedules_changed = true;
                    Ok(Ok(Reply::Removed(true)))
                }
                None => Ok(Ok(Reply::Removed(false))),
            },
            Command::FireSchedule { queue, name, at_ms, jobs, next_at_ms } => {
                let Some(mut schedule) = self.schedule(queue, name)? else {
                    return Ok(Ok(Reply::Count { count: 0, more: false }));
                };
                if schedule.next_at_ms != Some(*at_ms) {
                    return Ok(Ok(Reply::Count { count: 0, more: false }));
                }
                let mut count = 0;
                for job in jobs {
                    // A job of an occurrence fired before keeps its key: not published twice.
                    if let Ok(Reply::Published { .. }) = self.publish(queue, job)? {
                        count += 1;
                    }
                }
                self.kv.delete(Cf::Meta, keys::schedule_due(*at_ms, queue, name));
                schedule.next_at_ms = *next_at_ms;
                self.save_schedule(queue, &schedule)?;
                self.raise_schedule_floor()?;
                Ok(Ok(Reply::Count { count, more: false }))
            }
            Command::SetWebhook { queue, webhook } => {
                let key = keys::webhook(queue);
                let replaced = self.kv.get(Cf::Meta, &key)?.is_some();
                self.kv.put(Cf::Meta, key, encode(webhook));
                self.effects.webhooks_changed = true;
                Ok(Ok(Reply::Replaced(replaced)))
            }
            Command::DeleteWebhook { queue } => {
                let key = keys::webhook(queue);
                let existed = self.kv.get(Cf::Meta, &key)?.is_some();
                if existed {
                    self.kv.delete(Cf::Meta, key);
                    self.effects.webhooks_changed = true;
                }
                Ok(Ok(Reply::Removed(existed)))
            }
            Command::Bury { queue, id, lease } => self.bury(queue, *id, *lease, None),
            Command::BuryWithPriority { queue, id, lease, priority } => {
                self.bury(queue, *id, *lease, Some(*priority))
            }
            Command::Update { queue, target, due, body, priority } => {
                self.update(queue, target, *due, body.as_deref(), *priority)
            }
            Command::Cancel { queue, target } => match self.resolve(queue, target)? {
                Some(job) => {
                    self.remove(job, true)?;
                    Ok(Ok(Reply::Removed(true)))
                }
                None => Ok(Ok(Reply::Removed(false))),
            },
            Command::Respawn { queue, limit, ttl_ms } => {
                self.respawn(queue, *limit, *ttl_ms).map(Ok)
            }
            Command::Purge { queue, limit } => self.remove_chunk(Cf::Dead, queue, *limit).map(Ok),
            Command::SetPaused { queue, paused } => {
                let mut meta = self.meta(queue)?;
                meta.paused = *paused;
                if meta.has_job_to_hand_out() {
                    self.effects.made_ready(queue, meta.count(JobState::Ready));
                }
                self.save_meta(queue, meta)?;
                Ok(Ok(Reply::Done))
            }
            Command::Destroy { queue, all } => {
                let cf = if *all { Cf::Members } else { Cf::Ready };
                self.remove_chunk(cf, queue, MAX_JOBS_PER_COMMAND).map(Ok)
            }
            Command::CreateToken { token, namespace, description, read_limit, write_limit } => {
                let key = keys::token(token);
                if self.kv.get(Cf::Meta, &key)?.is_some() {
                    return Ok(Err(Rejection::Invalid("the token exists".into())));
                }
                let rec = TokenRecord {
                    namespace: namespace.clone(),
                    description: description.clone(),
                    created_ms: self.now,
                    read_limit: *read_limit,
                    write_limit: *write_limit,
                };
                self.kv.put(Cf::Meta, key, encode(&rec));
                Ok(Ok(Reply::Done))
            }
            Command::DeleteToken { namespace, token } => {
                let key = keys::token(token);
                let rec: Option<TokenRecord> =
                    self.kv.get(Cf::Meta, &key)?.map(|v| decode(&v)).transpose()?;
                match rec {
                    Some(rec) if rec.namespace == *namespace => {
                        self.kv.delete(Cf::Meta, key);
                        self.effects.deleted_tokens.push(token.clone());
                        Ok(Ok(Reply::Removed(true)))
                    }
                    _ => Ok(Ok(Reply::Removed(false))),
                }
            }
            Command::Tick { limit } => self.tick(*limit).map(Ok),
            Command::ReserveUrgent { queues, count, ttr_ms, lease_seed } => {
                self.reserve_urgent(queues, *count, *ttr_ms, *lease_seed).map(Ok)
            }
            Command::ReserveJob { queue, id, ttr_ms, lease_seed } => {
                let Some(job) = self.job_in(queue, *id)? else {
                    return Ok(Err(Rejection::JobNotFound));
                };
                if job.state == JobState::Reserved {
                    let state = job.state.as_str().to_string();
                    return Ok(Err(Rejection::WrongState(state, "ready, delayed or dead".into())));
                }
                if job.state == JobState::Dead {
                    // Out of the dead letter, the job's ttl applies again.
                    self.set_expiry(&job, true)?;
                }
                let delivery = self.lease_out(job, *ttr_ms, lease_token(*lease_seed, 0))?;
                Ok(Ok(Reply::Reserved(vec![delivery])))
            }
            Command::Kick { queue, limit } => self.kick(queue, *limit).map(Ok),
            Command::KickJob { queue, id } => {
                let Some(mut job) = self.job_in(queue, *id)? else {
                    return Ok(Err(Rejection::JobNotFound));
                };
                if !matches!(job.state, JobState::Dead | JobState::Delayed) {
                    let state = job.state.as_str().to_string();
                    return Ok(Err(Rejection::WrongState(state, "dead or delayed".into())));
                }
                self.kick_job(&mut job)?;
                Ok(Ok(Reply::Job(Box::new(job))))
            }
        }
    }

    // ---- commands ----

    fn publish(&mut self, queue: &QueueName, new: &NewJob) -> Result<Outcome, KvError> {
        if let Some(key) = &new.key {
            if let Some(rec) = self.key_record(queue, key)? {
                return Ok(Ok(Reply::Exists { id: rec.id }));
            }
        }
        let due_ms = self.due_ms(new.due);
        let expires_ms = new.ttl_ms.map(|ttl| self.now.saturating_add(ttl));
        if let Some(exp) = expires_ms {
            // A job whose ttl ends the instant it is due would expire instead of being
            // delivered: refused, like one that ends before.
            if exp <= due_ms {
                return Ok(Err(Rejection::Invalid(
                    "the ttl must end after the job is due (ttl > delay)".into(),
                )));
            }
        }
        let mut job = Job {
            id: new.id,
            queue: queue.clone(),
            key: new.key.clone(),
            body: new.body.clone(),
            attributes: new.attributes.clone(),
            state: if due_ms <= self.now { JobState::Ready } else { JobState::Delayed },
            priority: new.priority,
            created_ms: self.now,
            due_ms,
            expires_ms,
            tries: new.tries.max(1),
            attempts: 0,
            ttr_ms: new.ttr_ms,
            lease: None,
            seq: 0,
            counters: Default::default(),
            number: 0, // numbered when stored
        };
        if let Some(key) = &new.key {
            let rec = KeyRecord { id: job.id, ended_ms: None };
            self.kv.put(Cf::Keys, keys::client_key(queue, key), encode(&rec));
        }
        self.kv.put(Cf::Members, keys::member(queue, job.id), Vec::new());
        self.set_expiry(&job, true)?;
        self.index(&mut job)?;
        self.effects.count(queue, |e| &mut e.published);
        Ok(Ok(Reply::Published { id: job.id, number: job.number }))
    }

    fn reserve(
        &mut self,
        queues: &[QueueName],
        count: u32,
        ttr_ms: Option<u64>,
        seed: u64,
    ) -> Result<Reply, KvError> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        'queues: for queue in queues {
            let want = (count as usize).saturating_sub(out.len());
            if want == 0 {
                break;
            }
            if self.meta(queue)?.paused {
                continue;
            }
            let (ready, next) = self.head_of_ready(queue, want)?;
            let floor = keys::floor(queue);
            self.kv.put(Cf::Meta, floor.clone(), next);
            for (key, id) in &ready {
                let Some(job) = self.load(*id)? else {
                    // An index entry without its job: the floor steps past it, so the
                    // read-ahead, which still holds it, is dropped.
                    self.forget_ahead(queue);
                    continue;
                };
                // The reply must stay deliverable: stop before the job that would cross the
                // bound (never before the first), and leave it at the head of the line.
                bytes = bytes.saturating_add(job.payload_bytes());
                if bytes > MAX_RESERVE_BYTES && !out.is_empty() {
                    // Everything before it has left the index.
                    self.kv.put(Cf::Meta, floor, key.clone());
                    break 'queues;
                }
                let token = lease_token(seed, out.len() as u64);
                out.push(self.lease_out(job, ttr_ms, token)?);
                self.left_index(queue, key);
            }
        }
        Ok(Reply::Reserved(out))
    }

    /// Reserves the most urgent ready jobs across `queues`, one at a time: each round
    /// compares the queues' heads by priority, then by place in line (the sequence is global,
    /// so places compare across queues).
    fn reserve_urgent(
        &mut self,
        queues: &[QueueName],
        count: u32,
        ttr_ms: Option<u64>,
        seed: u64,
    ) -> Result<Reply, KvError> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut open = Vec::new();
        for queue in queues {
            if !self.meta(queue)?.paused && !open.contains(&queue) {
                open.push(queue);
            }
        }
        while out.len() < count as usize {
            let mut best: Option<UrgentHead<'_>> = None;
            for queue in &open {
                let (head, next) = self.head_of_ready(queue, 1)?;
                let Some((key, id)) = head.into_iter().next() else { continue };
                // The ready key after the queue's prefix: priority, then sequence.
                let rank = key.get(keys::queue(queue).len()..).unwrap_or_default().to_vec();
                if best.as_ref().is_none_or(|(r, ..)| rank < *r) {
                    best = Some((rank, queue, key, id, next));
                }
            }
            let Some((_, queue, key, id, next)) = best else { break };
            let Some(job) = self.load(id)? else {
                // An index entry without its job cannot be taken: step past it.
                self.kv.put(Cf::Meta, keys::floor(queue), next);
                self.forget_ahead(queue);
                continue;
            };
            bytes = bytes.saturating_add(job.payload_bytes());
            if bytes > MAX_RESERVE_BYTES && !out.is_empty() {
                break;
            }
            self.kv.put(Cf::Meta, keys::floor(queue), next);
            let token = lease_token(seed, out.len() as u64);
            out.push(self.lease_out(job, ttr_ms, token)?);
            self.left_index(queue, &key);
        }
        Ok(Reply::Reserved(out))
    }

    /// Hands `job` (out of whatever index it is in) to a consumer under lease `token`.
    fn lease_out(
        &mut self,
        mut job: Job,
        ttr_ms: Option<u64>,
        token: u64,
    ) -> Result<Delivery, KvError> {
        self.unindex(&job)?;
        job.attempts = job.attempts.saturating_add(1);
        let ttr = ttr_ms.unwrap_or(job.ttr_ms);
        job.lease = Some(Lease { token, deadline_ms: self.now.saturating_add(ttr), ttr_ms: ttr });
        job.state = JobState::Reserved;
        self.index(&mut job)?;
        self.effects.count(&job.queue, |e| &mut e.reserved);
        Ok(Delivery { job, lease: token })
    }

    /// Kicks up to `limit` dead jobs of `queue`, or delayed ones when none is dead.
    fn kick(&mut self, queue: &QueueName, limit: u32) -> Result<Reply, KvError> {
        let (ids, mut more) = if self.meta(queue)?.count(JobState::Dead) > 0 {
            self.chunk(Cf::Dead, queue, limit)?
        } else {
            self.delayed_ids(queue, limit)?
        };
        let mut count = 0;
        for id in ids {
            if self.work_spent() {
                more = true;
                break;
            }
            let Some(mut job) = self.load(id)? else { continue };
            self.kick_job(&mut job)?;
            count += 1;
        }
        Ok(Reply::Count { count, more })
    }

    /// The first `limit` (at most [`MAX_JOBS_PER_COMMAND`]) delayed jobs of `queue` in the
    /// order they come due, and whether more may be left.
    fn delayed_ids(&self, queue: &QueueName, limit: u32) -> Result<(Vec<JobId>, bool), KvError> {
        let want = limit.min(MAX_JOBS_PER_COMMAND) as usize;
        let mut jobs = crate::query::delayed(self.kv, queue, want.saturating_add(1))?;
        let more = jobs.len() > want;
        jobs.truncate(want);
        Ok((jobs.into_iter().map(|j| j.id).collect(), more))
    }

    /// Makes a dead or delayed job ready now, keeping its tries (and its ttl, which applies
    /// again to a job leaving the dead letter).
    fn kick_job(&mut self, job: &mut Job) -> Result<(), KvError> {
        self.unindex(job)?;
        job.counters.kicks = job.counters.kicks.saturating_add(1);
        if job.state == JobState::Dead {
            self.set_expiry(job, true)?;
        }
        job.due_ms = self.now;
        job.state = JobState::Ready;
        self.index(job)
    }

    fn ack(
        &mut self,
        queue: &QueueName,
        id: JobId,
        lease: Option<u64>,
    ) -> Result<Outcome, KvError> {
        let job = if lease.is_some() {
            match self.leased(queue, id, lease)? {
                Ok(job) => job,
                Err(r) => return Ok(Err(r)),
            }
        } else {
            match self.job_in(queue, id)? {
                Some(job) => job,
                None => return Ok(Ok(Reply::Removed(false))),
            }
        };
        self.remove(job, true)?;
        self.effects.count(queue, |e| &mut e.acked);
        Ok(Ok(Reply::Removed(true)))
    }

    fn release(
        &mut self,
        queue: &QueueName,
        id: JobId,
        lease: Option<u64>,
        delay_ms: u64,
        priority: Option<u32>,
        counted: bool,
    ) -> Result<Outcome, KvError> {
        let mut job = match self.leased(queue, id, lease)? {
            Ok(job) => job,
            Err(r) => return Ok(Err(r)),
        };
        let due_ms = self.now.saturating_add(delay_ms);
        if self.expires_by(&job, due_ms) {
            return Ok(Err(Rejection::Invalid(
                "the delay does not end before the job's ttl".into(),
            )));
        }
        self.unindex(&job)?;
        job.lease = None;
        job.priority = priority.unwrap_or(job.priority);
        if counted {
            job.counters.releases = job.counters.releases.saturating_add(1);
        }
        job.due_ms = due_ms;
        job.state = if delay_ms == 0 { JobState::Ready } else { JobState::Delayed };
        self.index(&mut job)?;
        self.effects.count(queue, |e| &mut e.released);
        Ok(Ok(Reply::Job(Box::new(job))))
    }

    fn bury(
        &mut self,
        queue: &QueueName,
        id: JobId,
        lease: Option<u64>,
        priority: Option<u32>,
    ) -> Result<Outcome, KvError> {
        let mut job = match self.leased(queue, id, lease)? {
            Ok(job) => job,
            Err(r) => return Ok(Err(r)),
        };
        job.priority = priority.unwrap_or(job.priority);
        job.counters.buries = job.counters.buries.saturating_add(1);
        self.bury_job(&mut job)?;
        Ok(Ok(Reply::Job(Box::new(job))))
    }

    fn schedule(&self, queue: &QueueName, name: &str) -> Result<Option<Schedule>, KvError> {
        self.kv.get(Cf::Meta, &keys::schedule(queue, name))?.map(|v| decode(&v)).transpose()
    }

    /// Stores a schedule and indexes its next occurrence (lowering the index's floor when
    /// the occurrence sorts below it).
    fn save_schedule(&mut self, queue: &QueueName, schedule: &Schedule) -> Result<(), KvError> {
        if let Some(at) = schedule.next_at_ms {
            let key = keys::schedule_due(at, queue, &schedule.name);
            if self.kv.get(Cf::Meta, keys::META_SCHEDULES_FLOOR)?.is_some_and(|f| key < f) {
                self.kv.put(Cf::Meta, keys::META_SCHEDULES_FLOOR.to_vec(), key.clone());
            }
            self.kv.put(Cf::Meta, key, Vec::new());
        }
        self.kv.put(Cf::Meta, keys::schedule(queue, &schedule.name), encode(schedule));
        self.effects.schedules_changed = true;
        Ok(())
    }

    /// Moves the schedule index's floor up to its first live entry. Each deleted entry is
    /// stepped over once here, not by every later scan.
    fn raise_schedule_floor(&mut self) -> Result<(), KvError> {
        let prefix = keys::SCHEDULE_DUE_PREFIX;
        let end = keys::prefix_end(prefix);
        let floor = self.kv.get(Cf::Meta, keys::META_SCHEDULES_FLOOR)?;
        let mut first = None;
        self.kv.scan(Cf::Meta, floor.as_deref().unwrap_or(prefix), &end, &mut |k, _| {
            first = Some(k.to_vec());
            false
        })?;
        self.kv.put(Cf::Meta, keys::META_SCHEDULES_FLOOR.to_vec(), first.unwrap_or(end));
        Ok(())
    }

    /// A failed delivery: recorded on the job, which goes back after `delay_ms` while it has
    /// tries left and to the dead letter after its last.
    fn fail(
        &mut self,
        queue: &QueueName,
        id: JobId,
        lease: Option<u64>,
        error: &str,
        delay_ms: u64,
    ) -> Result<Outcome, KvError> {
        let mut job = match self.leased(queue, id, lease)? {
            Ok(job) => job,
            Err(r) => return Ok(Err(r)),
        };
        job.attributes.insert(LAST_ERROR_ATTRIBUTE.to_string(), error.to_string());
        let due_ms = self.now.saturating_add(delay_ms);
        // Out of tries, or a backoff the job would not outlive: this failure was its last.
        if job.attempts >= job.tries || self.expires_by(&job, due_ms) {
            self.bury_job(&mut job)?;
            return Ok(Ok(Reply::Job(Box::new(job))));
        }
        self.unindex(&job)?;
        job.lease = None;
        job.due_ms = due_ms;
        job.state = if delay_ms == 0 { JobState::Ready } else { JobState::Delayed };
        self.index(&mut job)?;
        self.effects.count(queue, |e| &mut e.released);
        Ok(Ok(Reply::Job(Box::new(job))))
    }

    fn touch(
        &mut self,
        queue: &QueueName,
        id: JobId,
        lease: Option<u64>,
        ttr_ms: Option<u64>,
    ) -> Result<Outcome, KvError> {
        let mut job = match self.leased(queue, id, lease)? {
            Ok(job) => job,
            Err(r) => return Ok(Err(r)),
        };
        self.unindex(&job)?;
        if let Some(l) = job.lease.as_mut() {
            l.ttr_ms = ttr_ms.unwrap_or(l.ttr_ms);
            l.deadline_ms = self.now.saturating_add(l.ttr_ms);
        }
        self.index(&mut job)?;
        Ok(Ok(Reply::Job(Box::new(job))))
    }

    fn update(
        &mut self,
        queue: &QueueName,
        target: &Target,
        due: Option<Due>,
        body: Option<&[u8]>,
        priority: Option<u32>,
    ) -> Result<Outcome, KvError> {
        let Some(mut job) = self.resolve(queue, target)? else {
            return Ok(Err(Rejection::JobNotFound));
        };
        if !matches!(job.state, JobState::Delayed | JobState::Ready) {
            let state = job.state.as_str().to_string();
            return Ok(Err(Rejection::WrongState(state, "delayed or ready".into())));
        }
        let due_ms = due.map_or(job.due_ms, |d| self.due_ms(d));
        if self.expires_by(&job, due_ms) {
            return Ok(Err(Rejection::Invalid(
                "the new due time is not before the job's ttl ends".into(),
            )));
        }
        self.unindex(&job)?;
        let was_ready = job.state == JobState::Ready;
        job.due_ms = due_ms;
        job.priority = priority.unwrap_or(job.priority);
        if let Some(body) = body {
            job.body = body.to_vec();
        }
        job.state = if job.due_ms <= self.now { JobState::Ready } else { JobState::Delayed };
        if was_ready && job.state == JobState::Ready {
            // Keep its place in line: only the priority may have moved it.
            self.index_keeping_seq(&mut job)?;
        } else {
            self.index(&mut job)?;
        }
        Ok(Ok(Reply::Job(Box::new(job))))
    }

    fn respawn(
        &mut self,
        queue: &QueueName,
        limit: u32,
        ttl_ms: Option<u64>,
    ) -> Result<Reply, KvError> {
        let (ids, mut more) = self.chunk(Cf::Dead, queue, limit)?;
        let mut n = 0;
        for id in ids {
            if self.work_spent() {
                more = true;
                break;
            }
            let Some(mut job) = self.load(id)? else { continue };
            self.unindex(&job)?;
            job.attempts = 0;
            job.tries = 1;
            job.expires_ms = ttl_ms.map(|ttl| self.now.saturating_add(ttl));
            job.due_ms = self.now;
            job.state = JobState::Ready;
            self.set_expiry(&job, true)?;
            self.index(&mut job)?;
            n += 1;
        }
        Ok(Reply::Count { count: n, more })
    }

    fn tick(&mut self, limit: u32) -> Result<Reply, KvError> {
        let mut due = Vec::new();
        let (floor, end) = crate::query::due_timers(self.kv, self.now)?;
        let want = limit as usize + 1;
        self.kv.scan(Cf::Timers, &floor, &end, &mut |k, v| {
            due.push((k.to_vec(), v.to_vec()));
            due.len() < want
        })?;
        let more = due.len() > limit as usize;
        // Everything below `end` fires now, except past the limit: the floor moves to the
        // first timer left. Should a timer that is already due be added later, `put_timer`
        // lowers the floor again.
        let new_floor = if more { due[limit as usize].0.clone() } else { end.clone() };
        self.kv.put(Cf::Meta, keys::META_TIMERS_FLOOR.to_vec(), new_floor);
        due.truncate(limit as usize);
        let mut fired = 0;
        let mut more = more;
        for (key, payload) in due {
            if self.work_spent() {
                // Large jobs: the rest waits for the next tick, which starts here.
                self.kv.put(Cf::Meta, keys::META_TIMERS_FLOOR.to_vec(), key);
                more = true;
                break;
            }
            // Firing always consumes the entry, so a stray one can never wedge the pump.
            self.kv.delete(Cf::Timers, key.clone());
            let Some((deadline, kind, id)) = keys::parse_timer(&key) else {
                return Err(KvError("corrupt timer key".into()));
            };
            self.fire(deadline, kind, id, &payload)?;
            fired += 1;
        }
        Ok(Reply::Ticked { fired, more })
    }

    fn fire(
        &mut self,
        deadline: u64,
        kind: TimerKind,
        id: JobId,
        payload: &[u8],
    ) -> Result<(), KvError> {
        if kind == TimerKind::KeyGc {
            let (queue, key): (QueueName, String) = decode(payload)?;
            let k = keys::client_key(&queue, &key);
            if let Some(rec) = self.kv.get(Cf::Keys, &k)? {
                let rec: KeyRecord = decode(&rec)?;
                if rec.id == id && rec.ended_ms.is_some() {
                    self.kv.delete(Cf::Keys, k);
                }
            }
            return Ok(());
        }
        let Some(mut job) = self.load(id)? else { return Ok(()) };
        match kind {
            TimerKind::Expire
                if job.state != JobState::Dead && job.expires_ms == Some(deadline) =>
            {
                self.effects.count(&job.queue, |e| &mut e.expired);
                self.remove(job, true)?;
            }
            TimerKind::Due if job.state == JobState::Delayed && job.due_ms == deadline => {
                self.effects.timer_lateness_ms.push(self.now.saturating_sub(deadline));
                self.unindex(&job)?;
                job.state = JobState::Ready;
                self.index(&mut job)?;
            }
            TimerKind::Lease
                if job.state == JobState::Reserved
                    && job.lease.is_some_and(|l| l.deadline_ms == deadline) =>
            {
                self.effects.count(&job.queue, |e| &mut e.timed_out);
                job.counters.timeouts = job.counters.timeouts.saturating_add(1);
                if job.attempts >= job.tries {
                    self.bury_job(&mut job)?;
                } else {
                    self.unindex(&job)?;
                    job.lease = None;
                    job.due_ms = self.now;
                    job.state = JobState::Ready;
                    self.index(&mut job)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    // ---- transitions ----

    fn bury_job(&mut self, job: &mut Job) -> Result<(), KvError> {
        self.effects.count(&job.queue, |e| &mut e.dead_lettered);
        self.unindex(job)?;
        self.set_expiry(job, false)?; // a dead job never expires
        job.lease = None;
        job.state = JobState::Dead;
        self.index(job)
    }

    /// Deletes a job and every index entry of it. Its client key stays in the dedup window,
    /// unless `keep_key` is false (a republish replaces the job under the same key).
    fn remove(&mut self, job: Job, keep_key: bool) -> Result<(), KvError> {
        self.unindex(&job)?;
        if job.state != JobState::Dead {
            self.set_expiry(&job, false)?;
        }
        self.kv.delete(Cf::Members, keys::member(&job.queue, job.id));
        self.kv.delete(Cf::Jobs, job.id.to_bytes().to_vec());
        if job.number != 0 {
            self.kv.delete(Cf::Meta, keys::number(job.number));
        }
        if let Some(key) = &job.key {
            let k = keys::client_key(&job.queue, key);
            if keep_key {
                let rec = KeyRecord { id: job.id, ended_ms: Some(self.now) };
                self.kv.put(Cf::Keys, k, encode(&rec));
                let gc = self.now.saturating_add(DEDUP_WINDOW_MS);
                let payload = encode(&(job.queue.clone(), key.clone()));
                self.put_timer(keys::timer(gc, TimerKind::KeyGc, job.id), payload)?;
                self.effects.timer_added(gc);
            } else {
                self.kv.delete(Cf::Keys, k);
            }
        }
        Ok(())
    }

    /// The ids a chunked command works on: the first `limit` (at most
    /// [`MAX_JOBS_PER_COMMAND`]) of `queue` in the index `cf`, and whether more are left.
    fn chunk(&self, cf: Cf, queue: &QueueName, limit: u32) -> Result<(Vec<JobId>, bool), KvError> {
        let want = limit.min(MAX_JOBS_PER_COMMAND) as usize;
        let mut ids = self.scan_ids(cf, &keys::queue(queue), want.saturating_add(1))?;
        let more = ids.len() > want;
        ids.truncate(want);
        Ok((ids, more))
    }

    /// Whether the current command has loaded its [`MAX_WORK_BYTES_PER_COMMAND`]: it stops
    /// before the next job and reports `more`. Checked before a load, so a command always
    /// makes progress.
    fn work_spent(&self) -> bool {
        self.loaded_bytes.get() > MAX_WORK_BYTES_PER_COMMAND
    }

    /// Removes up to `limit` jobs of `queue` listed in the index `cf`, oldest first, in one
    /// chunk (see [`Tx::chunk`] and [`Tx::work_spent`]).
    fn remove_chunk(&mut self, cf: Cf, queue: &QueueName, limit: u32) -> Result<Reply, KvError> {
        let (ids, mut more) = self.chunk(cf, queue, limit)?;
        let mut count = 0;
        for id in ids {
            if self.work_spent() {
                more = true;
                break;
            }
            if let Some(job) = self.load(id)? {
                self.remove(job, true)?;
                count += 1;
            }
        }
        Ok(Reply::Count { count, more })
    }

    /// Adds the ttl timer (`on`) or removes it.
    fn set_expiry(&mut self, job: &Job, on: bool) -> Result<(), KvError> {
        if let Some(exp) = job.expires_ms {
            let key = keys::timer(exp, TimerKind::Expire, job.id);
            if on {
                self.put_timer(key, Vec::new())?;
                self.effects.timer_added(exp);
            } else {
                self.kv.delete(Cf::Timers, key);
            }
        }
        Ok(())
    }

    /// Removes the job from the indexes of its current state and from the state's count.
    fn unindex(&mut self, job: &Job) -> Result<(), KvError> {
        let q = &job.queue;
        match job.state {
            JobState::Delayed => {
                self.kv.delete(Cf::Timers, keys::timer(job.due_ms, TimerKind::Due, job.id));
                self.add_hist(q, job.due_ms, -1)?;
            }
            JobState::Ready => {
                let key = keys::ready(q, job.priority, job.seq, job.id);
                self.ready_key_deleted(q, &key);
                self.kv.delete(Cf::Ready, key)
            }
            JobState::Reserved => {
                if let Some(l) = job.lease {
                    self.kv
                        .delete(Cf::Timers, keys::timer(l.deadline_ms, TimerKind::Lease, job.id));
                }
            }
            JobState::Dead => self.kv.delete(Cf::Dead, keys::dead(q, job.seq, job.id)),
        }
        self.count(q, job.state, -1)
    }

    /// Puts the job into the indexes of its state (taking a new place in line when it becomes
    /// ready or dead), counts it, and stores the record.
    fn index(&mut self, job: &mut Job) -> Result<(), KvError> {
        if matches!(job.state, JobState::Ready | JobState::Dead) {
            job.seq = self.next_seq()?;
        }
        self.index_keeping_seq(job)
    }

    fn index_keeping_seq(&mut self, job: &mut Job) -> Result<(), KvError> {
        let q = job.queue.clone();
        match job.state {
            JobState::Delayed => {
                self.put_timer(keys::timer(job.due_ms, TimerKind::Due, job.id), Vec::new())?;
                self.effects.timer_added(job.due_ms);
                self.add_hist(&q, job.due_ms, 1)?;
            }
            JobState::Ready => {
                let key = keys::ready(&q, job.priority, job.seq, job.id);
                self.ready_key_added(&q, &key);
                let floor = keys::floor(&q);
                if self.kv.get(Cf::Meta, &floor)?.is_some_and(|f| key < f) {
                    self.kv.put(Cf::Meta, floor, key.clone());
                }
                self.kv.put(Cf::Ready, key, Vec::new());
                self.effects.made_ready(&q, 1);
            }
            JobState::Reserved => {
                if let Some(l) = job.lease {
                    self.put_timer(
                        keys::timer(l.deadline_ms, TimerKind::Lease, job.id),
                        Vec::new(),
                    )?;
                    self.effects.timer_added(l.deadline_ms);
                }
            }
            JobState::Dead => self.kv.put(Cf::Dead, keys::dead(&q, job.seq, job.id), Vec::new()),
        }
        self.count(&q, job.state, 1)?;
        if job.number == 0 {
            job.number = self.next_number()?;
            self.kv.put(Cf::Meta, keys::number(job.number), keys::numbered(job.id, &q));
        }
        self.kv.put(Cf::Jobs, job.id.to_bytes().to_vec(), encode_job(job));
        Ok(())
    }

    // ---- helpers ----

    /// Whether `job`, made due at `due_ms` in the future, would expire by then (and so never
    /// be delivered). A due time of now or earlier is always deliverable.
    fn expires_by(&self, job: &Job, due_ms: u64) -> bool {
        due_ms > self.now && job.expires_ms.is_some_and(|exp| exp <= due_ms)
    }

    fn due_ms(&self, due: Due) -> u64 {
        match due {
            Due::After(delay) => self.now.saturating_add(delay),
            Due::At(at) => at,
        }
    }

    fn next_seq(&mut self) -> Result<u64, KvError> {
        next_counter(self.kv, &mut self.seq, META_SEQ)
    }

    fn next_number(&mut self) -> Result<u64, KvError> {
        next_counter(self.kv, &mut self.number, META_NUMBER)
    }

    /// Writes the counters the entry advanced into the overlay.
    fn write_counters(&mut self) {
        for (key, last) in [(META_SEQ, self.seq.take()), (META_NUMBER, self.number.take())] {
            if let Some(n) = last {
                self.kv.put(Cf::Meta, key.to_vec(), n.to_be_bytes().to_vec());
            }
        }
    }

    fn load(&self, id: JobId) -> Result<Option<Job>, KvError> {
        let Some(v) = self.kv.get(Cf::Jobs, &id.to_bytes())? else { return Ok(None) };
        self.loaded_bytes.set(self.loaded_bytes.get().saturating_add(v.len()));
        decode_job(&v).map(Some)
    }

    /// The job, if it exists and belongs to `queue`: ids are only meaningful within their
    /// queue, as in lmstfy's paths.
    fn job_in(&self, queue: &QueueName, id: JobId) -> Result<Option<Job>, KvError> {
        Ok(self.load(id)?.filter(|j| &j.queue == queue))
    }

    fn key_record(&self, queue: &QueueName, key: &str) -> Result<Option<KeyRecord>, KvError> {
        self.kv.get(Cf::Keys, &keys::client_key(queue, key))?.map(|v| decode(&v)).transpose()
    }

    fn resolve(&self, queue: &QueueName, target: &Target) -> Result<Option<Job>, KvError> {
        match target {
            Target::Id(id) => self.job_in(queue, *id),
            Target::Key(key) => match self.key_record(queue, key)? {
                Some(KeyRecord { id, ended_ms: None }) => self.job_in(queue, id),
                _ => Ok(None),
            },
        }
    }

    /// The job, if it is reserved and `lease` (when given) is its current token.
    fn leased(&self, queue: &QueueName, id: JobId, lease: Option<u64>) -> Result2<Job> {
        let Some(job) = self.job_in(queue, id)? else {
            return Ok(Err(if lease.is_some() {
                Rejection::LeaseNotCurrent
            } else {
                Rejection::JobNotFound
            }));
        };
        match (job.lease, lease) {
            (Some(l), Some(given)) if l.token == given => Ok(Ok(job)),
            (Some(_), None) => Ok(Ok(job)),
            (_, Some(_)) => Ok(Err(Rejection::LeaseNotCurrent)),
            (None, None) => {
                Ok(Err(Rejection::WrongState(job.state.as_str().into(), "reserved".into())))
            }
        }
    }

    fn scan_ids(&self, cf: Cf, prefix: &[u8], limit: usize) -> Result<Vec<JobId>, KvError> {
        let mut ids = Vec::new();
        if limit == 0 {
            return Ok(ids);
        }
        self.kv.scan(cf, prefix, &keys::prefix_end(prefix), &mut |k, _| {
            if let Some(id) = keys::trailing_id(k) {
                ids.push(id);
            }
            ids.len() < limit
        })?;
        Ok(ids)
    }

    /// Adds a timer, lowering the timer floor when it lands below it.
    ///
    /// The floor never passes the first key of deadline `now + 1` (a tick moves it at most
    /// to there, and replicated time never runs backwards), so only a timer that is due
    /// already can land below it; every other insert, the publish path's included, skips the
    /// floor read.
    fn put_timer(&mut self, key: Vec<u8>, payload: Vec<u8>) -> Result<(), KvError> {
        let due_already =
            keys::parse_timer(&key).is_none_or(|(deadline, _, _)| deadline <= self.now);
        if due_already && self.kv.get(Cf::Meta, keys::META_TIMERS_FLOOR)?.is_some_and(|f| key < f) {
            self.kv.put(Cf::Meta, keys::META_TIMERS_FLOOR.to_vec(), key.clone());
        }
        self.kv.put(Cf::Timers, key, payload);
        Ok(())
    }

    /// The first `want` ready jobs of `queue` (index key and id), from the queue's floor on,
    /// and the key the floor moves to once they have all left the index. Served from the
    /// queue's read-ahead when it holds enough; otherwise the index is scanned from the floor,
    /// reading ahead as many keys as the entry's later reserves may take.
    fn head_of_ready(&mut self, queue: &QueueName, want: usize) -> Result<ReadyHead, KvError> {
        if let Some(ahead) = self.ahead.iter().find(|a| &a.queue == queue) {
            let next = match ahead.keys.get(want) {
                Some((key, _)) => Some(key.clone()),
                None if ahead.keys.len() == want => Some(ahead.next.clone()),
                // Fewer than wanted: all there is, if the scan reached the queue's end.
                None if ahead.next == keys::prefix_end(&keys::queue(queue)) => {
                    Some(ahead.next.clone())
                }
                None => None,
            };
            if let Some(next) = next {
                return Ok((ahead.keys.iter().take(want).cloned().collect(), next));
            }
        }
        self.forget_ahead(queue);
        let prefix = keys::queue(queue);
        let end = keys::prefix_end(&prefix);
        let from = self.kv.get(Cf::Meta, &keys::floor(queue))?.unwrap_or_else(|| prefix.clone());
        let extra = usize::try_from(self.demand_left.min(READ_AHEAD_MAX)).unwrap_or(0);
        let read = want.saturating_add(extra);
        let mut keys = VecDeque::new();
        let mut next = None;
        self.kv.scan(Cf::Ready, &from, &end, &mut |k, _| {
            if keys.len() == read {
                next = Some(k.to_vec());
                return false;
            }
            match keys::trailing_id(k) {
                Some(id) => keys.push_back((k.to_vec(), id)),
                // A key without an id is skipped within the `want` asked for, as it always
                // was; past them it ends the read-ahead, so that a later reserve whose last
                // job precedes it moves the floor onto it, as a scan of its own would.
                None if keys.len() >= want => {
                    next = Some(k.to_vec());
                    return false;
                }
                None => {}
            }
            true
        })?;
        let ahead = ReadyAhead { queue: queue.clone(), keys, next: next.unwrap_or(end) };
        let head = ahead.keys.iter().take(want).cloned().collect();
        let next = ahead.keys.get(want).map_or_else(|| ahead.next.clone(), |(k, _)| k.clone());
        self.ahead.push(ahead);
        Ok((head, next))
    }

    /// Drops the read-ahead of `queue`'s ready index, if there is one.
    fn forget_ahead(&mut self, queue: &QueueName) {
        self.ahead.retain(|a| &a.queue != queue);
    }

    /// After a reserve took the job indexed under `key` at the head of `queue`'s line: the
    /// floor has moved past `key`, and the read-ahead must have too. It has when leasing
    /// removed that very key from the index; when the index entry named a job that is not
    /// ready there (an inconsistent index), the key stays at its front, and the read-ahead
    /// is dropped so that the next reserve scans from the floor, as it would without it.
    fn left_index(&mut self, queue: &QueueName, key: &[u8]) {
        let stale = self.ahead.iter().any(|a| {
            &a.queue == queue && a.keys.front().is_some_and(|(front, _)| front.as_slice() == key)
        });
        if stale {
            self.forget_ahead(queue);
        }
    }

    /// Keeps the read-ahead of `queue` exact when `key` leaves its ready index: the head
    /// leaving is popped; a key leaving from inside the range drops the read-ahead.
    fn ready_key_deleted(&mut self, queue: &QueueName, key: &[u8]) {
        let Some(i) = self.ahead.iter().position(|a| &a.queue == queue) else { return };
        let ahead = &mut self.ahead[i];
        if ahead.keys.front().is_some_and(|(front, _)| front.as_slice() == key) {
            ahead.keys.pop_front();
        } else if key <= ahead.next.as_slice() {
            // Inside the range read, or its `next` itself: the next floor would differ.
            self.ahead.swap_remove(i);
        }
    }

    /// Keeps the read-ahead of `queue` exact when `key` joins its ready index: a key landing
    /// up to the end of the range read drops the read-ahead.
    fn ready_key_added(&mut self, queue: &QueueName, key: &[u8]) {
        if let Some(i) = self.ahead.iter().position(|a| &a.queue == queue) {
            if key <= self.ahead[i].next.as_slice() {
                self.ahead.swap_remove(i);
            }
        }
    }

    /// The queue's metadata as the entry has left it so far (see [`Tx::metas`]).
    fn meta(&mut self, queue: &QueueName) -> Result<QueueMeta, KvError> {
        self.meta_mut(queue).map(|(meta, _)| meta.clone())
    }

    /// The queue's metadata in the entry's cache and whether it changed, read on first use.
    fn meta_mut(&mut self, queue: &QueueName) -> Result<(&mut QueueMeta, &mut bool), KvError> {
        if !self.metas.contains_key(queue) {
            let stored = self.kv.get(Cf::Queues, &keys::queue(queue))?;
            let meta = stored.map(|v| decode(&v)).transpose()?.unwrap_or_default();
            self.metas.insert(queue.clone(), (meta, false));
        }
        let (meta, changed) = self
            .metas
            .get_mut(queue)
            .ok_or_else(|| KvError("queue metadata missing from the entry's cache".into()))?;
        Ok((meta, changed))
    }

    /// Replaces the queue's metadata (written back when the entry is done).
    fn save_meta(&mut self, queue: &QueueName, meta: QueueMeta) -> Result<(), KvError> {
        let (cached, changed) = self.meta_mut(queue)?;
        *cached = meta;
        *changed = true;
        Ok(())
    }

    /// Writes the metadata the entry changed into the overlay, and tells the effects whether
    /// each of those queues has a job a reserve would find.
    fn write_metas(&mut self) {
        for (queue, (meta, changed)) in std::mem::take(&mut self.metas) {
            if changed {
                self.kv.put(Cf::Queues, keys::queue(&queue), encode(&meta));
                self.effects.reservable.insert(queue, meta.has_job_to_hand_out());
            }
        }
    }

    /// Adds `delta` to the queue's count of jobs in `state` (written back when the entry is
    /// done).
    fn count(&mut self, queue: &QueueName, state: JobState, delta: i64) -> Result<(), KvError> {
        let (meta, changed) = self.meta_mut(queue)?;
        let c = &mut meta.counts[state.index()];
        *c = c.saturating_add_signed(delta);
        *changed = true;
        Ok(())
    }

    fn add_hist(&mut self, queue: &QueueName, due_ms: u64, delta: i64) -> Result<(), KvError> {
        let key = keys::due_minute(queue, due_ms);
        let n = read_u64(self.kv, Cf::DueHist, &key)?.unwrap_or(0).saturating_add_signed(delta);
        if n == 0 {
            self.kv.delete(Cf::DueHist, key);
        } else {
            self.kv.put(Cf::DueHist, key, n.to_be_bytes().to_vec());
        }
        Ok(())
    }
}

/// Helpers for the crate's unit tests: a job and one applied entry.
#[cfg(test)]
pub(crate) mod testing {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::kv::MemKv;

    /// A job due `delay_ms` after its entry, one try, a 1 s ttr.
    pub(crate) fn new_job(id: u128, delay_ms: u64) -> NewJob {
        NewJob {
            id: JobId(id),
            key: None,
            body: Vec::new(),
            attributes: Default::default(),
            due: Due::After(delay_ms),
            ttl_ms: None,
            tries: 1,
            ttr_ms: 1000,
            priority: 0,
        }
    }

    /// Applies one entry to `kv` and returns its effects.
    pub(crate) fn run(kv: &mut MemKv, now_ms: u64, commands: Vec<Command>) -> Effects {
        let mut effects = Effects::default();
        let mut overlay = Overlay::new(&*kv);
        apply(&mut overlay, &Entry::new(now_ms, commands), &mut effects).unwrap();
        let writes: Vec<_> = overlay.into_writes().collect();
        kv.apply(writes);
        effects
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{new_job, run};
    use super::*;
    use crate::kv::MemKv;

    /// A later batch's word on a queue's jobs replaces an earlier one's when batches fold.
    #[test]
    fn merged_effects_keep_the_later_batch_word_on_a_queue() {
        let (a, b) = (QueueName::new("ns", "a"), QueueName::new("ns", "b"));
        let with = |pairs: &[(&QueueName, bool)]| Effects {
            reservable: pairs.iter().map(|(q, r)| ((*q).clone(), *r)).collect(),
            ..Effects::default()
        };
        let mut folded = with(&[(&a, true), (&b, true)]);
        folded.merge(with(&[(&a, false)]));
        assert_eq!(folded.reservable, with(&[(&a, false), (&b, true)]).reservable);
    }

    /// The effects say, for each queue an entry changed, whether a reserve would find a job
    /// once it is applied, as `query::anything_ready` would read it from the state; queues
    /// the entry did not change are not named.
    #[test]
    fn effects_say_which_changed_queues_have_a_job_to_hand_out() {
        let (a, b) = (QueueName::new("ns", "a"), QueueName::new("ns", "b"));
        let reserve = |q: &QueueName, seed| Command::Reserve {
            queues: vec![q.clone()],
            count: 1,
            ttr_ms: None,
            lease_seed: seed,
        };
        let mut kv = MemKv::default();
        let mut says = |now, commands| {
            let effects = run(&mut kv, now, commands);
            for (q, &r) in &effects.reservable {
                assert_eq!(
                    r,
                    crate::query::anything_ready(&kv, std::slice::from_ref(q)).expect("read")
                );
            }
            effects.reservable.into_iter().map(|(q, r)| (q.queue, r)).collect::<Vec<_>>()
        };
        let publish = |q: &QueueName, id, delay| Command::Publish {
            queue: q.clone(),
            job: new_job(id, delay),
        };
        let (yes, no) = (true, false);
        let s = |q: &str, r| (q.to_string(), r);
        // A delayed job is not one to hand out yet.
        assert_eq!(
            says(1_000, vec![publish(&a, 1, 0), publish(&b, 2, 60_000)]),
            [s("a", yes), s("b", no)]
        );
        // Taking the last ready job; b untouched.
        assert_eq!(says(1_001, vec![reserve(&a, 1)]), [s("a", no)]);
        // A paused queue hands nothing out, whatever it holds.
        assert_eq!(
            says(
                1_002,
                vec![publish(&a, 3, 0), Command::SetPaused { queue: a.clone(), paused: true }]
            ),
            [s("a", no)]
        );
        assert_eq!(
            says(1_003, vec![Command::SetPaused { queue: a.clone(), paused: false }]),
            [s("a", yes)]
        );
        // An entry that reads a queue without changing it says nothing of it.
        assert_eq!(says(1_004, vec![reserve(&b, 2)]), []);
    }

    /// A queue's metadata is cached for the length of an entry (`Tx::metas`): later commands
    /// of the entry see the earlier ones' changes, the effects computed from it are those of
    /// applying the commands one by one, and the next entry on the same overlay reads what the
    /// first wrote back.
    #[test]
    fn queue_metadata_changed_in_an_entry_is_seen_by_its_later_commands_and_the_next_entry() {
        let q = QueueName::new("ns", "q");
        let mut kv = MemKv::default();
        let mut effects = Effects::default();
        let mut overlay = Overlay::new(&kv);
        let first = Entry::new(
            1_000,
            vec![
                Command::Publish { queue: q.clone(), job: new_job(1, 0) },
                Command::Publish { queue: q.clone(), job: new_job(2, 0) },
                Command::SetPaused { queue: q.clone(), paused: true },
                // Nothing is handed out while paused, within the same entry too.
                Command::Reserve { queues: vec![q.clone()], count: 1, ttr_ms: None, lease_seed: 1 },
                Command::SetPaused { queue: q.clone(), paused: false },
            ],
        );
        let replies = apply(&mut overlay, &first, &mut effects).expect("apply");
        assert!(matches!(&replies[3], Ok(Reply::Reserved(d)) if d.is_empty()), "{replies:?}");
        // One per publish, and the two ready jobs the unpause makes takeable again.
        assert_eq!(effects.ready_queues.get(&q), Some(&4));
        let second = Entry::new(
            1_001,
            vec![Command::Reserve {
                queues: vec![q.clone()],
                count: 1,
                ttr_ms: None,
                lease_seed: 2,
            }],
        );
        let replies = apply(&mut overlay, &second, &mut effects).expect("apply");
        assert!(matches!(&replies[0], Ok(Reply::Reserved(d)) if d.len() == 1), "{replies:?}");
        let writes: Vec<_> = overlay.into_writes().collect();
        kv.apply(writes);
        let meta = crate::query::queue_meta(&kv, &q).expect("read");
        assert_eq!((meta.paused, meta.counts), (false, [0, 1, 1, 0]));
    }

    #[test]
    fn effects_count_job_events_per_queue_and_merge_across_entries() {
        let (a, b) = (QueueName::new("ns", "a"), QueueName::new("ns", "b"));
        let mut kv = MemKv::default();
        let publish = |q: &QueueName, id, delay| Command::Publish {
            queue: q.clone(),
            job: new_job(id, delay),
        };
        let mut batch = run(
            &mut kv,
            1000,
            vec![
                publish(&a, 1, 0),
                publish(&a, 2, 0),
                publish(&b, 3, 50),
                Command::Reserve { queues: vec![a.clone()], count: 2, ttr_ms: None, lease_seed: 7 },
                Command::Ack { queue: a.clone(), id: JobId(1), lease: None },
            ],
        );
        assert!(batch.timer_lateness_ms.is_empty());
        batch.merge(run(&mut kv, 1070, vec![Command::Tick { limit: 10 }]));

        let a_events = JobEvents { published: 2, reserved: 2, acked: 1, ..JobEvents::default() };
        let b_events = JobEvents { published: 1, ..JobEvents::default() };
        assert_eq!(batch.events, BTreeMap::from([(a, a_events), (b, b_events)]));
        assert_eq!(batch.timer_lateness_ms, [20], "due at 1050, fired by the tick at 1070");
    }

    /// Applies `commands` to a copy of `kv` once as one entry and once as one entry each;
    /// both must store the same bytes and give the same replies, which are returned.
    fn grouped_and_apart(kv: &MemKv, commands: Vec<Command>) -> (MemKv, Vec<Outcome>) {
        let mut apart = kv.clone();
        let mut replies_apart = Vec::new();
        for c in &commands {
            let mut overlay = Overlay::new(&apart);
            let entry = Entry::new(2000, vec![c.clone()]);
            replies_apart
                .extend(apply(&mut overlay, &entry, &mut Effects::default()).expect("apply"));
            let writes: Vec<_> = overlay.into_writes().collect();
            apart.apply(writes);
        }
        let mut together = kv.clone();
        let mut overlay = Overlay::new(&together);
        let entry = Entry::new(2000, commands);
        let replies = apply(&mut overlay, &entry, &mut Effects::default()).expect("apply");
        let writes: Vec<_> = overlay.into_writes().collect();
        together.apply(writes);
        assert_eq!(replies, replies_apart);
        assert_eq!(together.iter().collect::<Vec<_>>(), apart.iter().collect::<Vec<_>>());
        (together, replies)
    }

    #[test]
    fn counters_an_entry_advances_are_stored_once_as_if_applied_command_by_command() {
        let q = QueueName::new("ns", "q");
        let publish = |id, delay| Command::Publish { queue: q.clone(), job: new_job(id, delay) };
        let mut kv = MemKv::default();
        run(&mut kv, 1000, vec![publish(1, 0), publish(2, 0)]);
        // Numbers for three new jobs; sequence numbers for the two of them that are ready at
        // once and for the job a reserve hands out and the release puts back in line.
        let commands = vec![
            publish(10, 0),
            publish(11, 60_000),
            reserve(&q, 1),
            Command::Release {
                queue: q.clone(),
                id: JobId(1),
                lease: None,
                delay_ms: 0,
                priority: None,
            },
            publish(12, 0),
        ];
        let (mut kv, replies) = grouped_and_apart(&kv, commands);
        let numbers: Vec<u64> = replies
            .iter()
            .filter_map(|r| match r {
                Ok(Reply::Published { number, .. }) => Some(*number),
                _ => None,
            })
            .collect();
        assert_eq!(numbers, [3, 4, 5]);
        assert_eq!(read_u64(&kv, Cf::Meta, META_NUMBER).expect("read"), Some(5));
        // Jobs 1 and 2 took 1 and 2; then 10, the released 1 and 12.
        assert_eq!(read_u64(&kv, Cf::Meta, META_SEQ).expect("read"), Some(5));
        // The next entry goes on from the stored counters.
        run(&mut kv, 3000, vec![publish(13, 0)]);
        assert_eq!(read_u64(&kv, Cf::Meta, META_NUMBER).expect("read"), Some(6));
        assert_eq!(read_u64(&kv, Cf::Meta, META_SEQ).expect("read"), Some(6));
        let job = crate::query::job(&kv, &q, JobId(13)).expect("read");
        assert_eq!(job.map(|j| (j.number, j.seq)), Some((6, 6)));
    }

    fn reserve(queue: &QueueName, count: u32) -> Command {
        Command::Reserve { queues: vec![queue.clone()], count, ttr_ms: None, lease_seed: 3 }
    }

    fn delivered(replies: &[Outcome]) -> Vec<Vec<u128>> {
        replies
            .iter()
            .map(|r| match r {
                Ok(Reply::Reserved(d)) => d.iter().map(|d| d.job.id.0).collect(),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    /// A key without a job id in the ready index (never written by delayd, but a read-ahead
    /// must not make replicas of different versions disagree about it): the floor lands on
    /// it, whether the reserve that passes it read ahead or not.
    #[test]
    fn a_ready_key_without_an_id_stops_the_read_ahead_where_a_scan_would() {
        let (a, b) = (QueueName::new("ns", "a"), QueueName::new("ns", "b"));
        let mut kv = MemKv::default();
        let mut second = new_job(2, 0);
        second.priority = 1;
        run(
            &mut kv,
            1000,
            vec![
                Command::Publish { queue: a.clone(), job: new_job(1, 0) },
                Command::Publish { queue: a.clone(), job: second },
            ],
        );
        // Between the two: after priority 0's keys, before priority 1's.
        let mut short = keys::queue(&a);
        short.extend_from_slice(&[0, 0, 0, 0, 0xff]);
        kv.apply([(Cf::Ready, short.clone(), Some(Vec::new()))]);

        let (kv, replies) = grouped_and_apart(&kv, vec![reserve(&a, 1), reserve(&b, 1)]);
        assert_eq!(delivered(&replies), [vec![1], vec![]]);
        assert_eq!(kv.get(Cf::Meta, &keys::floor(&a)).expect("read"), Some(short));
        let (_, replies) = grouped_and_apart(&kv, vec![reserve(&a, 1), reserve(&a, 1)]);
        assert_eq!(delivered(&replies), [vec![2], vec![]]);
    }

    /// An index entry whose job is ready elsewhere (here: a job published twice, which the
    /// server never does): taking it moves the floor past it, and later reserves of the same
    /// entry, or later rounds of one reserve, must not be handed the same key again.
    #[test]
    fn an_index_entry_of_a_job_ready_elsewhere_is_not_served_twice() {
        let a = QueueName::new("ns", "a");
        let mut kv = MemKv::default();
        let publish = |id| Command::Publish { queue: a.clone(), job: new_job(id, 0) };
        run(&mut kv, 1000, vec![publish(1), publish(2), publish(1)]);

        let (_, replies) = grouped_and_apart(&kv, vec![reserve(&a, 1), reserve(&a, 1)]);
        assert_eq!(delivered(&replies), [vec![1], vec![2]]);
        let urgent = Command::ReserveUrgent {
            queues: vec![a.clone()],
            count: 2,
            ttr_ms: None,
            lease_seed: 3,
        };
        let (_, replies) = grouped_and_apart(&kv, vec![urgent]);
        assert_eq!(delivered(&replies), [vec![1, 2]]);
    }

    #[test]
    fn effects_name_the_tokens_a_batch_deleted() {
        let mut kv = MemKv::default();
        let create = |token: &str| Command::CreateToken {
            token: token.into(),
            namespace: "ns".into(),
            description: String::new(),
            read_limit: 1,
            write_limit: 1,
        };
        assert!(run(&mut kv, 1, vec![create("t1"), create("t2")]).deleted_tokens.is_empty());
        let delete = |ns: &str, token: &str| Command::DeleteToken {
            namespace: ns.into(),
            token: token.into(),
        };
        let effects = run(&mut kv, 2, vec![delete("other", "t1"), delete("ns", "t2")]);
        assert_eq!(effects.deleted_tokens, ["t2"], "only a delete that took effect");
    }
}

/// The per-command bounds of [`crate::limits`]: large operations proceed in chunks, each
/// reporting whether more is left, and nothing is skipped or done twice across chunks.
#[cfg(test)]
mod bounded_work {
    #![allow(clippy::unwrap_used)]

    use super::testing::{new_job, run};
    use super::*;
    use crate::kv::MemKv;
    use crate::query;

    fn queue() -> QueueName {
        QueueName::new("ns", "q")
    }

    fn publish(kv: &mut MemKv, now: u64, ids: std::ops::Range<u128>, body: usize, delay: u64) {
        let commands = ids
            .map(|id| {
                let mut job = new_job(id, delay);
                job.body = vec![b'x'; body];
                Command::Publish { queue: queue(), job }
            })
            .collect();
        run(kv, now, commands);
    }

    /// Applies one command and returns its outcome.
    fn one(kv: &mut MemKv, now: u64, command: Command) -> Outcome {
        let mut effects = Effects::default();
        let mut overlay = Overlay::new(&*kv);
        let out = apply(&mut overlay, &Entry::new(now, vec![command]), &mut effects)
            .unwrap()
            .pop()
            .unwrap();
        let writes: Vec<_> = overlay.into_writes().collect();
        kv.apply(writes);
        out
    }

    fn counts(kv: &MemKv) -> [u64; 4] {
        query::queue_meta(kv, &queue()).unwrap().counts
    }

    #[test]
    fn destroy_proceeds_in_chunks_of_the_job_bound() {
        let mut kv = MemKv::default();
        let n = 2 * MAX_JOBS_PER_COMMAND as u128 + 500;
        publish(&mut kv, 1, 1..n + 1, 0, 0);
        let destroy = || Command::Destroy { queue: queue(), all: true };
        let chunk = u64::from(MAX_JOBS_PER_COMMAND);
        assert_eq!(one(&mut kv, 2, destroy()), Ok(Reply::Count { count: chunk, more: true }));
        assert_eq!(one(&mut kv, 3, destroy()), Ok(Reply::Count { count: chunk, more: true }));
        assert_eq!(one(&mut kv, 4, destroy()), Ok(Reply::Count { count: 500, more: false }));
        assert_eq!(counts(&kv), [0; 4]);
        assert_eq!(one(&mut kv, 5, destroy()), Ok(Reply::Count { count: 0, more: false }));
    }

    #[test]
    fn purge_and_respawn_stop_at_the_byte_bound_and_resume() {
        let mut kv = MemKv::default();
        // 10 dead jobs of 3 MiB: the byte bound lets a command touch three of them.
        let body = 3 << 20;
        publish(&mut kv, 1, 1..11, body, 0);
        // Each reserve stops at its own byte bound; reserve until every job is taken.
        while counts(&kv)[JobState::Ready.index()] > 0 {
            let reserve =
                Command::Reserve { queues: vec![queue()], count: 100, ttr_ms: None, lease_seed: 1 };
            run(&mut kv, 2, vec![reserve]);
        }
        for id in 1..11 {
            run(&mut kv, 3, vec![Command::Bury { queue: queue(), id: JobId(id), lease: None }]);
        }
        assert_eq!(counts(&kv)[JobState::Dead.index()], 10);
        let respawn = || Command::Respawn { queue: queue(), limit: 100, ttl_ms: None };
        let per = (MAX_WORK_BYTES_PER_COMMAND / body + 1) as u64;
        assert_eq!(one(&mut kv, 4, respawn()), Ok(Reply::Count { count: per, more: true }));
        assert_eq!(counts(&kv)[JobState::Ready.index()], per);
        let purge = || Command::Purge { queue: queue(), limit: 100 };
        let mut purged = 0;
        loop {
            match one(&mut kv, 5, purge()) {
                Ok(Reply::Count { count, more }) => {
                    assert!(count <= per, "{count} jobs of {body} bytes in one command");
                    purged += count;
                    if !more {
                        break;
                    }
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(purged, 10 - per);
        assert_eq!(counts(&kv), [0, per, 0, 0]);
    }

    #[test]
    fn a_reserve_stops_at_its_byte_bound_and_the_rest_stays_in_line() {
        let mut kv = MemKv::default();
        let body = 3 << 20;
        publish(&mut kv, 1, 1..6, body, 0);
        let reserve = |seed| Command::Reserve {
            queues: vec![queue()],
            count: 100,
            ttr_ms: None,
            lease_seed: seed,
        };
        let mut order = Vec::new();
        for seed in 0..3 {
            match one(&mut kv, 2, reserve(seed)) {
                Ok(Reply::Reserved(got)) => {
                    let bytes: usize = got.iter().map(|d| d.job.payload_bytes()).sum();
                    assert!(bytes <= MAX_RESERVE_BYTES, "{bytes} bytes in one reply");
                    assert!(!got.is_empty());
                    order.extend(got.iter().map(|d| d.job.id.0));
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(order, [1, 2, 3, 4, 5], "every job once, in order");
        // One job larger than the bound alone is still delivered.
        let mut kv = MemKv::default();
        publish(&mut kv, 1, 1..2, MAX_RESERVE_BYTES + 1, 0);
        assert!(matches!(one(&mut kv, 2, reserve(1)), Ok(Reply::Reserved(got)) if got.len() == 1));
    }

    #[test]
    fn a_tick_stops_at_the_byte_bound_and_the_next_resumes() {
        let mut kv = MemKv::default();
        let body = 3 << 20;
        publish(&mut kv, 1, 1..11, body, 10);
        let mut fired_total = 0;
        let mut ticks = 0;
        loop {
            ticks += 1;
            match one(&mut kv, 20, Command::Tick { limit: 1024 }) {
                Ok(Reply::Ticked { fired, more }) => {
                    fired_total += fired;
                    if !more {
                        break;
                    }
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(fired_total, 10);
        assert!(ticks >= 3, "10 jobs of 3 MiB in {ticks} ticks");
        assert_eq!(counts(&kv), [0, 10, 0, 0]);
    }

    #[test]
    fn a_ttl_that_ends_when_the_job_is_due_is_refused() {
        let mut kv = MemKv::default();
        let mut job = new_job(1, 1000);
        job.ttl_ms = Some(1000);
        let refused = one(&mut kv, 1, Command::Publish { queue: queue(), job: job.clone() });
        assert!(matches!(refused, Err(Rejection::Invalid(_))), "{refused:?}");
        job.ttl_ms = Some(1001);
        assert!(one(&mut kv, 1, Command::Publish { queue: queue(), job }).is_ok());
    }
}

#[cfg(test)]
mod numbers {
    #![allow(clippy::unwrap_used)]

    use super::testing::{new_job, run};
    use super::*;
    use crate::kv::MemKv;
    use crate::query;

    /// A job record as a release before job numbers wrote it: version 1, no number field.
    fn legacy_record(job: &Job) -> Vec<u8> {
        assert_eq!(job.number, 0);
        let mut bytes = encode(job);
        // The current layout ends with four counters and the number, all 0 here: one varint
        // byte each.
        for _ in 0..5 {
            assert_eq!(bytes.pop(), Some(0));
        }
        bytes[0] = 1;
        bytes
    }

    #[test]
    fn a_job_stored_before_numbers_decodes_and_is_numbered_on_its_next_change() {
        let queue = QueueName::new("ns", "q");
        let mut kv = MemKv::default();
        run(&mut kv, 1000, vec![Command::Publish { queue: queue.clone(), job: new_job(7, 0) }]);
        let mut job = query::job(&kv, &queue, JobId(7)).unwrap().unwrap();
        assert_eq!(job.number, 1);
        // Rewrite it as the old release stored it, without its number or its index entry.
        job.number = 0;
        kv.apply(vec![
            (Cf::Jobs, JobId(7).to_bytes().to_vec(), Some(legacy_record(&job))),
            (Cf::Meta, keys::number(1), None),
        ]);
        assert_eq!(query::job(&kv, &queue, JobId(7)).unwrap(), Some(job.clone()));

        let reserve =
            Command::Reserve { queues: vec![queue.clone()], count: 1, ttr_ms: None, lease_seed: 1 };
        run(&mut kv, 1001, vec![reserve]);
        let numbered = query::job(&kv, &queue, JobId(7)).unwrap().unwrap();
        assert_eq!(numbered.number, 2, "the counter's next number");
        assert_eq!(query::job_by_number(&kv, 2).unwrap().map(|j| j.id), Some(JobId(7)));
    }
}
