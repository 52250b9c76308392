//! Publishing: one job, a bulk of jobs in one entry, or a job replacing another.

use delayd_core::{Command, JobId, NewJob, QueueName, Reply};
use futures::future::join_all;

use super::auth::{Access, Principal, Scope};
use super::validate::{new_job, PublishParams, MAX_BULK};
use super::{unexpected, Service};
use crate::error::ServiceError;

/// The result of a publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// The job's id.
    pub id: JobId,
    /// True when the key already named a job and nothing was created.
    pub existed: bool,
    /// The new job's number ([`delayd_core::Job::number`]); `None` when it `existed`.
    pub number: Option<u64>,
}

fn published(r: Reply) -> Result<Published, ServiceError> {
    match r {
        Reply::Published { id, number } => {
            Ok(Published { id, existed: false, number: Some(number) })
        }
        Reply::Exists { id } => Ok(Published { id, existed: true, number: None }),
        r => Err(unexpected(r)),
    }
}

impl Service {
    /// Publishes one job. With a key that already names a live job, nothing is created and
    /// that job's id is returned.
    pub async fn publish(
        &self,
        caller: &Principal,
        queue: QueueName,
        params: &PublishParams,
        body: Vec<u8>,
    ) -> Result<Published, ServiceError> {
        let job = self.checked_job(caller, &queue, params, body)?;
        published(self.write_one(Command::Publish { queue, job }).await?)
    }

    /// Publishes 1..=[`MAX_BULK`] jobs with the same parameters. `bodies` decodes the front
    /// end's message, and runs only once the caller is authorized. Without `keys`, in one log
    /// entry: all or none. With one key per body, each job is published on its own (the
    /// proposer still packs them together), so a bulk that failed halfway is simply sent
    /// again: each is idempotent.
    pub async fn publish_bulk(
        &self,
        caller: &Principal,
        queue: QueueName,
        params: &PublishParams,
        bodies: impl FnOnce() -> Result<Vec<Vec<u8>>, ServiceError>,
        keys: Vec<String>,
    ) -> Result<Vec<Published>, ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        let bodies = bodies()?;
        if bodies.is_empty() || bodies.len() > MAX_BULK {
            return Err(ServiceError::bad_request(format!(
                "a bulk publish carries 1 to {MAX_BULK} jobs, not {}",
                bodies.len()
            )));
        }
        if params.key.is_some() {
            return Err(ServiceError::bad_request("key is not accepted in a bulk publish"));
        }
        if !keys.is_empty() && keys.len() != bodies.len() {
            return Err(ServiceError::bad_request(format!(
                "give one key per body or none: {} keys for {} bodies",
                keys.len(),
                bodies.len()
            )));
        }
        let checks = self.checks();
        checks.publish(params)?;
        for body in &bodies {
            checks.body(body)?;
        }
        if !keys.is_empty() {
            return self.publish_keyed(queue, params, bodies, keys).await;
        }
        let commands = bodies
            .into_iter()
            .map(|body| Command::Publish { queue: queue.clone(), job: new_job(params, body) })
            .collect();
        // Whether they fit one log entry together is the proposer's check (413).
        let mut all = Vec::new();
        for outcome in self.write(commands).await? {
            match outcome? {
                Reply::Published { id, number } => {
                    all.push(Published { id, existed: false, number: Some(number) })
                }
                r => return Err(unexpected(r)),
            }
        }
        Ok(all)
    }

    /// Publishes checked keyed jobs one by one, concurrently.
    async fn publish_keyed(
        &self,
        queue: QueueName,
        params: &PublishParams,
        bodies: Vec<Vec<u8>>,
        keys: Vec<String>,
    ) -> Result<Vec<Published>, ServiceError> {
        let checks = self.checks();
        let mut commands = Vec::with_capacity(bodies.len());
        for (body, key) in bodies.into_iter().zip(keys) {
            let p = PublishParams { key: Some(key), ..params.clone() };
            checks.publish(&p)?;
            commands.push(Command::Publish { queue: queue.clone(), job: new_job(&p, body) });
        }
        let publishes = commands.into_iter().map(|c| async move { self.write_one(c).await });
        join_all(publishes).await.into_iter().map(|r| published(r?)).collect()
    }

    /// Replaces a job by a new one (new id), atomically.
    pub async fn republish(
        &self,
        caller: &Principal,
        queue: QueueName,
        old: JobId,
        params: &PublishParams,
        body: Vec<u8>,
    ) -> Result<Published, ServiceError> {
        let job = self.checked_job(caller, &queue, params, body)?;
        published(self.write_one(Command::Republish { queue, old, job }).await?)
    }

    /// A new job for `queue`, once the caller may write there and the job is within bounds.
    fn checked_job(
        &self,
        caller: &Principal,
        queue: &QueueName,
        params: &PublishParams,
        body: Vec<u8>,
    ) -> Result<NewJob, ServiceError> {
        self.authorize(caller, Scope::queue(queue, Access::Write))?;
        let checks = self.checks();
        checks.publish(params)?;
        checks.body(&body)?;
        Ok(new_job(params, body))
    }
}
