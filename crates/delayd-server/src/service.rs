//! The operations of delayd, validated and stamped, on a [`Node`].
//!
//! Handlers of every protocol call these; they never build commands themselves. Validation
//! that needs no state happens here, before anything is proposed, so a bad request writes
//! nothing; checks that need the state (a lease, a job's state) are decided by the state
//! machine and come back as rejections.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use delayd_core::{
    query, Command, Delivery, Due, Job, JobId, KvError, NewJob, Outcome, QueueMeta, QueueName,
    Reply, Target,
};
use delayd_store::ReadView;
use futures::future::select_all;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::ServiceError;
use crate::node::Node;

/// Most attributes a job may carry.
pub const MAX_ATTRIBUTES: usize = 16;
/// Longest attribute name, in bytes.
pub const MAX_ATTRIBUTE_NAME_BYTES: usize = 64;
/// Longest attribute value, in bytes.
pub const MAX_ATTRIBUTE_VALUE_BYTES: usize = 1024;
/// Longest client key, in bytes.
pub const MAX_KEY_BYTES: usize = 255;
/// The outer bound of the `max_horizon` setting: lmstfy's parameters are 32-bit seconds.
pub const MAX_HORIZON_LIMIT: Duration = Duration::from_secs(u32::MAX as u64);
/// Most jobs one respawn or purge may name (it runs in chunks of
/// [`delayd_core::limits::MAX_JOBS_PER_COMMAND`]).
pub const MAX_DEAD_LETTER_LIMIT: u32 = 10_000;
/// Most jobs in one bulk publish.
pub const MAX_BULK: usize = 64;
/// Most jobs one reserve may take.
pub const MAX_RESERVE_COUNT: u32 = 100;
/// Longest long-poll.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// The job a consumer acks on its next reserve ([`Node::reserve_after_ack`]).
#[derive(Clone, Debug)]
pub struct AckFirst {
    /// Its queue.
    pub queue: QueueName,
    /// The job.
    pub id: JobId,
    /// The lease of its reservation; `None` acks whoever holds it.
    pub lease: Option<u64>,
}

/// How a job is to be published (everything but its body).
#[derive(Clone, Debug)]
pub struct PublishParams {
    /// When it becomes deliverable.
    pub due: Due,
    /// Time to live from publish; `None` never expires.
    pub ttl_ms: Option<u64>,
    /// Maximum deliveries, 1..=65535.
    pub tries: u16,
    /// Default time-to-run of its reservations.
    pub ttr_ms: u64,
    /// 0 is most urgent.
    pub priority: u32,
    /// Idempotency key.
    pub key: Option<String>,
    /// Attributes.
    pub attributes: BTreeMap<String, String>,
}

impl Default for PublishParams {
    fn default() -> Self {
        PublishParams {
            due: Due::After(0),
            ttl_ms: Some(86_400_000),
            tries: 1,
            ttr_ms: 120_000,
            priority: 1024,
            key: None,
            attributes: BTreeMap::new(),
        }
    }
}

/// The result of a publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// The job's id.
    pub id: JobId,
    /// True when the key already named a job and nothing was created.
    pub existed: bool,
}

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

/// Upper bounds of the due histogram: 1 min, 5 min, 1 h, 1 day.
pub const HISTOGRAM_BOUNDS_MS: [u64; 4] = [60_000, 300_000, 3_600_000, 86_400_000];

/// Checks a namespace or queue name: `^[-_A-Za-z0-9]{1,255}$`; queue names starting with `_`
/// are reserved.
pub fn check_name(kind: &str, name: &str) -> Result<(), ServiceError> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !ok {
        return Err(ServiceError::BadRequest(format!(
            "invalid {kind} name {name:?}: use 1-255 characters of A-Z a-z 0-9 - _"
        )));
    }
    if kind == "queue" && name.starts_with('_') {
        return Err(ServiceError::BadRequest(format!(
            "queue names starting with '_' are reserved: {name:?}"
        )));
    }
    Ok(())
}

/// Builds a checked queue name.
pub fn queue_name(namespace: &str, queue: &str) -> Result<QueueName, ServiceError> {
    check_name("namespace", namespace)?;
    check_name("queue", queue)?;
    Ok(QueueName::new(namespace, queue))
}

/// Parses a job id.
pub fn job_id(s: &str) -> Result<JobId, ServiceError> {
    s.parse().map_err(|_| ServiceError::BadRequest(format!("invalid job id {s:?}")))
}

fn reply(outcome: Outcome) -> Result<Reply, ServiceError> {
    outcome.map_err(ServiceError::from)
}

fn published(r: Reply) -> Result<Published, ServiceError> {
    match r {
        Reply::Published { id } => Ok(Published { id, existed: false }),
        Reply::Exists { id } => Ok(Published { id, existed: true }),
        r => Err(unexpected(r)),
    }
}

/// What a reserve (after an optional ack) got: whether the ack removed its job (`None` when
/// no ack was asked for) and the deliveries.
type Reserved = (Option<bool>, Vec<Delivery>);

/// The outcomes of a reserve, possibly after an ack: whether the ack removed its job, and
/// the deliveries. A rejected ack (its lease is no longer the job's) removed nothing.
fn reserved(mut outcomes: Vec<Outcome>) -> Result<Reserved, ServiceError> {
    // The reserve comes last, after the ack when there is one.
    let outcome = outcomes.pop().ok_or_else(|| ServiceError::Internal("no outcome".into()))?;
    let acked = outcomes.pop().map(|ack| matches!(ack, Ok(Reply::Removed(true))));
    match reply(outcome)? {
        Reply::Reserved(got) => Ok((acked, got)),
        r => Err(unexpected(r)),
    }
}

fn unexpected(r: Reply) -> ServiceError {
    ServiceError::Internal(format!("unexpected reply {r:?}"))
}

/// The receiving end of a reserve's outcome. Dropped before it was read (the caller went
/// away), it closes the channel and returns whatever arrived in the meantime: together with
/// the sender's check, no outcome can fall between the two.
struct ReserveOutcome<'a> {
    rx: Option<tokio::sync::oneshot::Receiver<Result<Reserved, ServiceError>>>,
    node: &'a Node,
}

impl Drop for ReserveOutcome<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else { return };
        rx.close();
        if let Ok(Ok((_, undelivered))) = rx.try_recv() {
            let node = self.node.clone();
            tokio::spawn(async move { node.return_deliveries(undelivered).await });
        }
    }
}

/// Releases a reserve's waiter subscriptions when the reserve ends or is dropped.
struct WaitGuard<'a> {
    node: &'a Node,
    queues: &'a [QueueName],
    notifies: Vec<Arc<Notify>>,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.notifies.clear();
        self.node.inner.waiters.release(self.queues);
    }
}

impl Node {
    /// Refuses a duration a client gave (`name`, in ms) that reaches past the configured
    /// horizon. Every relative time a client sends passes here before it is proposed, so no
    /// deadline the state machine computes from it comes near overflowing.
    pub(crate) fn check_horizon(&self, name: &str, ms: u64) -> Result<(), ServiceError> {
        let horizon = self.inner.config.max_horizon;
        if u128::from(ms) > horizon.as_millis() {
            return Err(ServiceError::BadRequest(format!(
                "{name} is beyond the maximum horizon of {} s (max_horizon_s)",
                horizon.as_secs()
            )));
        }
        Ok(())
    }

    /// Checks a due time against the horizon; returns its delay from now in ms.
    fn check_due(&self, due: Due) -> Result<u64, ServiceError> {
        match due {
            Due::After(delay) => self.check_horizon("delay", delay).map(|()| delay),
            Due::At(at) => {
                let delay = at.saturating_sub(self.clock().now_ms());
                self.check_horizon("at", delay).map(|()| delay)
            }
        }
    }

    fn check_body(&self, body: &[u8]) -> Result<(), ServiceError> {
        let limit = self.inner.config.max_body_bytes;
        if body.len() > limit {
            return Err(ServiceError::TooLarge(format!(
                "body is larger than the limit of {limit} bytes (max_body_bytes)"
            )));
        }
        Ok(())
    }

    fn check_publish(&self, p: &PublishParams, body: &[u8]) -> Result<(), ServiceError> {
        self.check_body(body)?;
        if p.tries == 0 {
            return Err(ServiceError::BadRequest("tries must be at least 1".into()));
        }
        if p.attributes.len() > MAX_ATTRIBUTES {
            return Err(ServiceError::BadRequest(format!(
                "at most {MAX_ATTRIBUTES} attributes per job"
            )));
        }
        for (name, value) in &p.attributes {
            if name.is_empty() || name.len() > MAX_ATTRIBUTE_NAME_BYTES {
                return Err(ServiceError::BadRequest(format!(
                    "attribute names are 1 to {MAX_ATTRIBUTE_NAME_BYTES} bytes"
                )));
            }
            if value.len() > MAX_ATTRIBUTE_VALUE_BYTES {
                return Err(ServiceError::BadRequest(format!(
                    "attribute {name} is longer than {MAX_ATTRIBUTE_VALUE_BYTES} bytes"
                )));
            }
        }
        if let Some(key) = &p.key {
            if key.is_empty() || key.len() > MAX_KEY_BYTES {
                return Err(ServiceError::BadRequest(format!(
                    "key must be 1 to {MAX_KEY_BYTES} bytes"
                )));
            }
        }
        let delay = self.check_due(p.due)?;
        self.check_horizon("ttr", p.ttr_ms)?;
        if p.ttr_ms == 0 {
            return Err(ServiceError::BadRequest("ttr must be positive".into()));
        }
        if let Some(ttl) = p.ttl_ms {
            self.check_horizon("ttl", ttl)?;
            // A ttl that ends when the job becomes due would remove it instead of delivering
            // it; refused rather than accepted and silently lost.
            if ttl <= delay {
                return Err(ServiceError::BadRequest(
                    "ttl must be longer than delay: the job would expire before it is delivered"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    fn new_job(p: &PublishParams, body: Vec<u8>) -> NewJob {
        NewJob {
            id: JobId(ulid::Ulid::new().0),
            key: p.key.clone(),
            body,
            attributes: p.attributes.clone(),
            due: p.due,
            ttl_ms: p.ttl_ms,
            tries: p.tries,
            ttr_ms: p.ttr_ms,
            priority: p.priority,
        }
    }

    /// Proposes commands atomically on the leader (forwarded when this node is a follower).
    async fn write(&self, commands: Vec<Command>) -> Result<Vec<Outcome>, ServiceError> {
        self.propose(commands).await
    }

    pub(crate) async fn write_one(&self, command: Command) -> Result<Reply, ServiceError> {
        let outcome = self
            .write(vec![command])
            .await?
            .pop()
            .ok_or_else(|| ServiceError::Internal("no outcome".into()))?;
        reply(outcome)
    }

    /// Runs a read against the local replica; unless `stale`, first waits until it has
    /// applied everything the leader had committed when asked (read index).
    pub async fn read<T>(
        &self,
        stale: bool,
        f: impl FnOnce(&ReadView<'_>) -> Result<T, KvError>,
    ) -> Result<T, ServiceError> {
        let view = self.inner.cluster.read(stale).await?;
        Ok(f(&view)?)
    }

    /// Publishes one job.
    pub async fn publish(
        &self,
        queue: QueueName,
        params: &PublishParams,
        body: Vec<u8>,
    ) -> Result<Published, ServiceError> {
        self.check_publish(params, &body)?;
        let job = Self::new_job(params, body);
        published(self.write_one(Command::Publish { queue, job }).await?)
    }

    /// Publishes 1..=64 jobs in one entry: all or none.
    pub async fn publish_bulk(
        &self,
        queue: QueueName,
        params: &PublishParams,
        bodies: Vec<Vec<u8>>,
    ) -> Result<Vec<JobId>, ServiceError> {
        if bodies.is_empty() || bodies.len() > MAX_BULK {
            return Err(ServiceError::BadRequest(format!(
                "a bulk publish carries 1 to {MAX_BULK} jobs, not {}",
                bodies.len()
            )));
        }
        if params.key.is_some() {
            return Err(ServiceError::BadRequest("key is not accepted in a bulk publish".into()));
        }
        self.check_publish(params, &[])?;
        let mut commands = Vec::with_capacity(bodies.len());
        for body in bodies {
            self.check_body(&body)?;
            commands
                .push(Command::Publish { queue: queue.clone(), job: Self::new_job(params, body) });
        }
        // Whether they fit one log entry together is the proposer's check (413).
        let mut ids = Vec::with_capacity(commands.len());
        for outcome in self.write(commands).await? {
            match reply(outcome)? {
                Reply::Published { id } => ids.push(id),
                r => return Err(unexpected(r)),
            }
        }
        Ok(ids)
    }

    /// Replaces a job by a new one (new id), atomically.
    pub async fn republish(
        &self,
        queue: QueueName,
        old: JobId,
        params: &PublishParams,
        body: Vec<u8>,
    ) -> Result<Published, ServiceError> {
        self.check_publish(params, &body)?;
        let job = Self::new_job(params, body);
        published(self.write_one(Command::Republish { queue, old, job }).await?)
    }

    /// Reserves up to `count` jobs from the queues in order, waiting up to `wait` for one.
    pub async fn reserve(
        &self,
        queues: Vec<QueueName>,
        count: u32,
        ttr_ms: Option<u64>,
        wait: Duration,
    ) -> Result<Vec<Delivery>, ServiceError> {
        Ok(self.reserve_after_ack(queues, count, ttr_ms, wait, None).await?.1)
    }

    /// [`Node::reserve`], first acking the consumer's previous job when `ack` names one: the
    /// ack rides in the same log entry as the first reserve attempt, so a consumer that acks
    /// and reserves makes one round trip and costs one entry instead of two. Returns whether
    /// the acked job was removed (`None` when none was named) with the deliveries. The ack
    /// happens even when nothing is ready; a lease that is no longer the job's acks nothing
    /// and answers `false`, as a plain ack would answer its conflict.
    pub async fn reserve_after_ack(
        &self,
        queues: Vec<QueueName>,
        count: u32,
        ttr_ms: Option<u64>,
        wait: Duration,
        ack: Option<AckFirst>,
    ) -> Result<Reserved, ServiceError> {
        if queues.is_empty() {
            return Err(ServiceError::BadRequest("no queue named".into()));
        }
        if count == 0 || count > MAX_RESERVE_COUNT {
            return Err(ServiceError::BadRequest(format!(
                "count must be 1 to {MAX_RESERVE_COUNT}"
            )));
        }
        if wait > MAX_WAIT {
            return Err(ServiceError::BadRequest("timeout must be at most 600 s".into()));
        }
        if let Some(ttr) = ttr_ms {
            self.check_horizon("ttr", ttr)?;
        }
        let deadline = Instant::now() + wait;
        // Forget the subscriptions however this ends, a dropped request included.
        let guard = WaitGuard {
            node: self,
            queues: &queues,
            notifies: queues.iter().map(|q| self.inner.waiters.subscribe(q)).collect(),
        };
        let notifies = &guard.notifies;
        let mut ack = ack.map(|a| Command::Ack { queue: a.queue, id: a.id, lease: a.lease });
        let mut acked = None;
        // The first attempt always goes to the leader, which answers "nothing ready" from its
        // own (current) state without a log entry, so a follower needs no read-index round
        // trip first. Later attempts follow this replica's wake-ups: a job made ready anywhere
        // reaches every replica's waiters when the replica applies it.
        let mut ask_leader = true;
        loop {
            // Register before trying, so a job made ready in between still wakes us.
            let mut woken: Vec<_> = notifies.iter().map(|n| Box::pin(n.notified())).collect();
            for w in &mut woken {
                w.as_mut().enable();
            }
            let attempt =
                ask_leader || self.read(true, |v| query::anything_ready(v, &queues)).await?;
            ask_leader = false;
            if attempt {
                let reserve = Command::Reserve {
                    queues: queues.clone(),
                    count,
                    ttr_ms,
                    lease_seed: rand::random(),
                };
                let commands = match ack.take() {
                    Some(a) => vec![a, reserve],
                    None => vec![reserve],
                };
                let (removed, got) = self.reserve_once(commands).await?;
                acked = acked.or(removed);
                if !got.is_empty() || Instant::now() >= deadline {
                    return Ok((acked, got));
                }
            } else if Instant::now() >= deadline {
                return Ok((acked, Vec::new()));
            }
            tokio::select! {
                _ = select_all(woken) => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// Proposes one reserve (after an ack, when `commands` holds two) in a task of its own,
    /// so that deliveries whose caller has gone (the client disconnected, the request was
    /// dropped) while the entry was being committed are released at once instead of staying
    /// leased for their ttr — with one try left they would otherwise go to the dead letter
    /// without ever being handed out.
    async fn reserve_once(&self, commands: Vec<Command>) -> Result<Reserved, ServiceError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let node = self.clone();
        tokio::spawn(async move {
            let got = match node.write(commands).await {
                Ok(outcomes) => reserved(outcomes),
                Err(e) => Err(e),
            };
            // The caller went away before the outcome: nobody will deliver these.
            if let Err(Ok((_, undelivered))) = tx.send(got) {
                node.return_deliveries(undelivered).await;
            }
        });
        let mut outcome = ReserveOutcome { rx: Some(rx), node: self };
        let rx = outcome.rx.as_mut().ok_or_else(|| ServiceError::Internal("no receiver".into()))?;
        let got = rx.await.map_err(|_| ServiceError::Internal("the reserve task ended".into()));
        outcome.rx = None;
        got?
    }

    /// Puts back deliveries that never reached their consumer: released at once with their
    /// lease (so a consumer that did get one can still tell), best effort — whatever fails
    /// here comes back when its ttr runs out.
    pub(crate) async fn return_deliveries(&self, deliveries: Vec<Delivery>) {
        if deliveries.is_empty() {
            return;
        }
        let n = deliveries.len();
        let commands = deliveries
            .into_iter()
            .map(|d| Command::Release {
                queue: d.job.queue,
                id: d.job.id,
                lease: Some(d.lease),
                delay_ms: 0,
                priority: None,
            })
            .collect();
        match self.write(commands).await {
            Ok(_) => tracing::debug!(jobs = n, "released deliveries nobody received"),
            Err(e) => tracing::warn!(jobs = n, error = %e, "cannot release undelivered jobs"),
        }
    }

    /// Acks (deletes) a job; with a lease only the current holder may. Returns whether a
    /// job was removed.
    pub async fn ack(
        &self,
        queue: QueueName,
        id: JobId,
        lease: Option<u64>,
    ) -> Result<bool, ServiceError> {
        match self.write_one(Command::Ack { queue, id, lease }).await? {
            Reply::Removed(b) => Ok(b),
            r => Err(unexpected(r)),
        }
    }

    async fn job_reply(&self, command: Command) -> Result<Job, ServiceError> {
        match self.write_one(command).await? {
            Reply::Job(job) => Ok(*job),
            r => Err(unexpected(r)),
        }
    }

    /// Puts a reserved job back, now or after `delay_ms`.
    pub async fn release(
        &self,
        queue: QueueName,
        id: JobId,
        lease: Option<u64>,
        delay_ms: u64,
        priority: Option<u32>,
    ) -> Result<Job, ServiceError> {
        self.check_horizon("delay", delay_ms)?;
        self.job_reply(Command::Release { queue, id, lease, delay_ms, priority }).await
    }

    /// Extends a reservation.
    pub async fn touch(
        &self,
        queue: QueueName,
        id: JobId,
        lease: Option<u64>,
        ttr_ms: Option<u64>,
    ) -> Result<Job, ServiceError> {
        if let Some(ttr) = ttr_ms {
            self.check_horizon("ttr", ttr)?;
        }
        self.job_reply(Command::Touch { queue, id, lease, ttr_ms }).await
    }

    /// Buries a reserved job in the dead letter.
    pub async fn bury(
        &self,
        queue: QueueName,
        id: JobId,
        lease: Option<u64>,
    ) -> Result<Job, ServiceError> {
        self.job_reply(Command::Bury { queue, id, lease }).await
    }

    /// Changes a pending job.
    pub async fn update(
        &self,
        queue: QueueName,
        target: Target,
        due: Option<Due>,
        body: Option<Vec<u8>>,
        priority: Option<u32>,
    ) -> Result<Job, ServiceError> {
        if let Some(body) = &body {
            self.check_body(body)?;
        }
        if let Some(due) = due {
            self.check_due(due)?;
        }
        self.job_reply(Command::Update { queue, target, due, body, priority }).await
    }

    /// Deletes a job by id or key; returns whether one was removed.
    pub async fn cancel(&self, queue: QueueName, target: Target) -> Result<bool, ServiceError> {
        match self.write_one(Command::Cancel { queue, target }).await? {
            Reply::Removed(b) => Ok(b),
            r => Err(unexpected(r)),
        }
    }

    /// Runs a bulk operation as a sequence of bounded commands (see
    /// [`delayd_core::limits`]): `command(n)` asks for at most `n` more jobs, until `total`
    /// jobs are done or a command reports nothing more. Other clients' entries interleave
    /// between the chunks, so a large operation neither stalls the cluster nor is atomic.
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

    fn check_limit(limit: u32) -> Result<(), ServiceError> {
        if limit == 0 || limit > MAX_DEAD_LETTER_LIMIT {
            return Err(ServiceError::BadRequest(format!(
                "limit must be 1 to {MAX_DEAD_LETTER_LIMIT}"
            )));
        }
        Ok(())
    }

    /// Moves up to `limit` dead jobs back to ready with one try and a new ttl.
    pub async fn respawn(
        &self,
        queue: QueueName,
        limit: u32,
        ttl_ms: Option<u64>,
    ) -> Result<u64, ServiceError> {
        Self::check_limit(limit)?;
        if let Some(ttl) = ttl_ms {
            self.check_horizon("ttl", ttl)?;
        }
        self.chunked(limit.into(), |limit| Command::Respawn { queue: queue.clone(), limit, ttl_ms })
            .await
    }

    /// Deletes up to `limit` dead jobs.
    pub async fn purge(&self, queue: QueueName, limit: u32) -> Result<u64, ServiceError> {
        Self::check_limit(limit)?;
        self.chunked(limit.into(), |limit| Command::Purge { queue: queue.clone(), limit }).await
    }

    /// Removes the ready jobs of a queue (`all`: every job): those it held when the call
    /// began, in chunks, plus whatever arrives meanwhile in a chunk's range.
    pub async fn destroy(&self, queue: QueueName, all: bool) -> Result<u64, ServiceError> {
        let meta = self.queue_meta(&queue, false).await?;
        let held = if all {
            meta.counts.iter().sum::<u64>()
        } else {
            meta.count(delayd_core::JobState::Ready)
        };
        // At least one command, so a destroy of an empty queue still goes through the log.
        self.chunked(held.max(1), |_| Command::Destroy { queue: queue.clone(), all }).await
    }

    /// Pauses or resumes a queue.
    pub async fn set_paused(&self, queue: QueueName, paused: bool) -> Result<(), ServiceError> {
        self.write_one(Command::SetPaused { queue, paused }).await.map(|_| ())
    }

    /// One job by id.
    pub async fn job(
        &self,
        queue: &QueueName,
        id: JobId,
        stale: bool,
    ) -> Result<Option<Job>, ServiceError> {
        self.read(stale, |v| query::job(v, queue, id)).await
    }

    /// The live job holding a key.
    pub async fn job_by_key(
        &self,
        queue: &QueueName,
        key: &str,
        stale: bool,
    ) -> Result<Option<Job>, ServiceError> {
        self.read(stale, |v| query::job_by_key(v, queue, key)).await
    }

    /// The next ready job.
    pub async fn peek(&self, queue: &QueueName, stale: bool) -> Result<Option<Job>, ServiceError> {
        self.read(stale, |v| query::peek_ready(v, queue)).await
    }

    /// Counts per state and the pause flag.
    pub async fn queue_meta(
        &self,
        queue: &QueueName,
        stale: bool,
    ) -> Result<QueueMeta, ServiceError> {
        self.read(stale, |v| query::queue_meta(v, queue)).await
    }

    /// Every queue (of `namespace`, if given) with its counts, sorted by name; at most `limit`.
    pub async fn queues(
        &self,
        namespace: Option<&str>,
        limit: usize,
        stale: bool,
    ) -> Result<Vec<(QueueName, QueueMeta)>, ServiceError> {
        self.read(stale, |v| query::queues(v, namespace, limit)).await
    }

    /// Dead jobs, oldest first, with the dead letter's size.
    pub async fn dead_letter(
        &self,
        queue: &QueueName,
        limit: usize,
        stale: bool,
    ) -> Result<(u64, Vec<Job>), ServiceError> {
        self.read(stale, |v| {
            let size = query::queue_meta(v, queue)?.count(delayd_core::JobState::Dead);
            Ok((size, query::dead_letter(v, queue, limit)?))
        })
        .await
    }

    /// Counts, head age and the upcoming-due histogram.
    pub async fn stats(&self, queue: &QueueName, stale: bool) -> Result<Stats, ServiceError> {
        let now = self.clock().now_ms();
        self.read(stale, |v| {
            let meta = query::queue_meta(v, queue)?;
            let head_age_ms = query::peek_ready(v, queue)?.map(|j| now.saturating_sub(j.due_ms));
            let counts = query::due_histogram(v, queue, now, &HISTOGRAM_BOUNDS_MS)?;
            let bounds = HISTOGRAM_BOUNDS_MS.iter().map(|b| Some(*b)).chain([None]);
            Ok(Stats { meta, head_age_ms, due_histogram: bounds.zip(counts).collect() })
        })
        .await
    }
}
