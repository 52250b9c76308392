//! One job at a time: ack, release, touch, bury, update and cancel a job, and look one up.
//!
//! A `lease` names the reservation the caller holds; with one, only the current holder may
//! act (a stale lease is a conflict), without one any caller of the namespace may.

use delayd_core::{query, Command, Due, Job, JobId, KvError, QueueName, Reply, Target};
use delayd_store::ReadView;

use super::auth::{Access, Principal, Scope};
use super::{unexpected, Service};
use crate::error::ServiceError;

/// A change to a pending job; at least one field must be set.
#[derive(Clone, Debug, Default)]
pub struct JobUpdate {
    /// A new due time.
    pub due: Option<Due>,
    /// A new body.
    pub body: Option<Vec<u8>>,
    /// A new priority.
    pub priority: Option<u32>,
}

/// The most jobs [`Service::count_ready_below`] counts: a count reads one index key per job.
pub const MAX_COUNTED: u64 = 100_000;
/// The most jobs [`Service::jobs_in_queue`] lists at once.
pub const MAX_LISTED: usize = 1000;

impl Service {
    async fn job_reply(&self, command: Command) -> Result<Job, ServiceError> {
        match self.write_one(command).await? {
            Reply::Job(job) => Ok(*job),
            r => Err(unexpected(r)),
        }
    }

    /// Acks (deletes) a job. Returns whether a job was removed.
    pub async fn ack(
        &self,
        caller: &Principal,
        queue: QueueName,
        id: JobId,
        lease: Option<u64>,
    ) -> Result<bool, ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        match self.write_one(Command::Ack { queue, id, lease }).await? {
            Reply::Removed(b) => Ok(b),
            r => Err(unexpected(r)),
        }
    }

    /// Acks a job without a lease and without waiting to learn whether it was still there:
    /// for a caller that answers the same either way (HTTP's 204). Returns once the ack is
    /// committed, before it is applied (see `delayd_raft::propose`), which spares a one-job
    /// consumer the apply on one of its two entries per job.
    pub async fn ack_committed(
        &self,
        caller: &Principal,
        queue: QueueName,
        id: JobId,
    ) -> Result<(), ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        let ack = Command::Ack { queue, id, lease: None };
        Ok(self.inner.cluster.propose_committed(vec![ack]).await?)
    }

    /// Puts a reserved job back, now or after `delay_ms`, optionally with a new priority.
    pub async fn release(
        &self,
        caller: &Principal,
        queue: QueueName,
        id: JobId,
        lease: Option<u64>,
        delay_ms: u64,
        priority: Option<u32>,
    ) -> Result<Job, ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        self.checks().horizon("delay", delay_ms)?;
        self.job_reply(Command::Release { queue, id, lease, delay_ms, priority }).await
    }

    /// Extends a reservation by `ttr_ms` from now (`None`: the job's own ttr).
    pub async fn touch(
        &self,
        caller: &Principal,
        queue: QueueName,
        id: JobId,
        lease: Option<u64>,
        ttr_ms: Option<u64>,
    ) -> Result<Job, ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        if let Some(ttr) = ttr_ms {
            self.checks().horizon("ttr", ttr)?;
        }
        self.job_reply(Command::Touch { queue, id, lease, ttr_ms }).await
    }

    /// Buries a reserved job in the dead letter, with a new priority when one is given.
    pub async fn bury(
        &self,
        caller: &Principal,
        queue: QueueName,
        id: JobId,
        lease: Option<u64>,
        priority: Option<u32>,
    ) -> Result<Job, ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        self.job_reply(match priority {
            None => Command::Bury { queue, id, lease },
            Some(priority) => Command::BuryWithPriority { queue, id, lease, priority },
        })
        .await
    }

    /// Changes a pending job.
    pub async fn update(
        &self,
        caller: &Principal,
        queue: QueueName,
        target: Target,
        change: JobUpdate,
    ) -> Result<Job, ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        let JobUpdate { due, body, priority } = change;
        if due.is_none() && priority.is_none() && body.is_none() {
            return Err(ServiceError::bad_request(
                "nothing to update: give delay, delay_ms, at, priority or a body",
            ));
        }
        let checks = self.checks();
        if let Some(body) = &body {
            checks.body(body)?;
        }
        if let Some(due) = due {
            checks.due(due)?;
        }
        self.job_reply(Command::Update { queue, target, due, body, priority }).await
    }

    /// Deletes a job by id or key; returns whether one was removed.
    pub async fn cancel(
        &self,
        caller: &Principal,
        queue: QueueName,
        target: Target,
    ) -> Result<bool, ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        match self.write_one(Command::Cancel { queue, target }).await? {
            Reply::Removed(b) => Ok(b),
            r => Err(unexpected(r)),
        }
    }

    /// One job by id.
    pub async fn job(
        &self,
        caller: &Principal,
        queue: &QueueName,
        id: JobId,
        stale: bool,
    ) -> Result<Option<Job>, ServiceError> {
        self.authorize(caller, Scope::queue(queue, Access::Read))?;
        self.read(stale, |v| query::job(v, queue, id)).await
    }

    /// The live job holding a key.
    pub async fn job_by_key(
        &self,
        caller: &Principal,
        queue: &QueueName,
        key: &str,
        stale: bool,
    ) -> Result<Option<Job>, ServiceError> {
        self.authorize(caller, Scope::queue(queue, Access::Read))?;
        self.read(stale, |v| query::job_by_key(v, queue, key)).await
    }

    /// One job by id in any queue of `namespace` (for protocols whose job ids are global,
    /// like Disque's), found as [`Service::job_by_number`] finds one with `stale`.
    pub async fn job_in_namespace(
        &self,
        caller: &Principal,
        namespace: &str,
        id: JobId,
    ) -> Result<Option<Job>, ServiceError> {
        self.find_in_namespace(caller, namespace, true, |v| query::job_anywhere(v, id)).await
    }

    /// One job by number ([`Job::number`]) in any queue of `namespace` (beanstalkd's ids).
    /// Linearizable, unless `stale`: then this replica is read first, and only a job it does
    /// not know is looked up again after catching up with the leader — enough to find a
    /// job's queue and id for a command that checks the job's state itself.
    pub async fn job_by_number(
        &self,
        caller: &Principal,
        namespace: &str,
        number: u64,
        stale: bool,
    ) -> Result<Option<Job>, ServiceError> {
        self.find_in_namespace(caller, namespace, stale, |v| query::job_by_number(v, number)).await
    }

    /// The job `find` finds, if it is of `namespace`: read as [`Service::job_by_number`]
    /// describes.
    async fn find_in_namespace(
        &self,
        caller: &Principal,
        namespace: &str,
        stale: bool,
        find: impl Fn(&ReadView<'_>) -> Result<Option<Job>, KvError>,
    ) -> Result<Option<Job>, ServiceError> {
        self.authorize(caller, Scope::Namespace(namespace, Access::Read))?;
        let mine = |job: Option<Job>| job.filter(|j| j.queue.namespace == namespace);
        if stale {
            if let Some(job) = mine(self.read(true, &find).await?) {
                return Ok(Some(job));
            }
        }
        Ok(mine(self.read(false, &find).await?))
    }

    /// Makes a dead or delayed job ready now (beanstalkd's `kick-job`).
    pub async fn kick_job(
        &self,
        caller: &Principal,
        queue: QueueName,
        id: JobId,
    ) -> Result<Job, ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        self.job_reply(Command::KickJob { queue, id }).await
    }

    /// Up to `limit` (at most [`MAX_LISTED`]) jobs of `queue` in any state, in publish
    /// order, after the job `after` when given: a cursor over the queue (Disque's `JSCAN`).
    pub async fn jobs_in_queue(
        &self,
        caller: &Principal,
        queue: &QueueName,
        after: Option<JobId>,
        limit: usize,
    ) -> Result<Vec<Job>, ServiceError> {
        self.authorize(caller, Scope::queue(queue, Access::Read))?;
        let limit = limit.min(MAX_LISTED);
        self.read(false, |v| query::members(v, queue, after, limit)).await
    }

    /// The delayed job that comes due first.
    pub async fn peek_delayed(
        &self,
        caller: &Principal,
        queue: &QueueName,
        stale: bool,
    ) -> Result<Option<Job>, ServiceError> {
        self.authorize(caller, Scope::queue(queue, Access::Read))?;
        self.read(stale, |v| query::peek_delayed(v, queue)).await
    }

    /// How many ready jobs of `queue` have a priority below `priority` (beanstalkd's
    /// urgent jobs), counting at most [`MAX_COUNTED`].
    pub async fn count_ready_below(
        &self,
        caller: &Principal,
        queue: &QueueName,
        priority: u32,
    ) -> Result<u64, ServiceError> {
        self.authorize(caller, Scope::queue(queue, Access::Read))?;
        self.read(true, |v| query::ready_below(v, queue, priority, MAX_COUNTED)).await
    }

    /// The next ready job.
    pub async fn peek(
        &self,
        caller: &Principal,
        queue: &QueueName,
        stale: bool,
    ) -> Result<Option<Job>, ServiceError> {
        self.authorize(caller, Scope::queue(queue, Access::Read))?;
        self.read(stale, |v| query::peek_ready(v, queue)).await
    }
}
