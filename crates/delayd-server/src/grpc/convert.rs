//! Messages to the service's values and back.

use delayd_core::{Delivery, Due, Job, JobId, QueueName};
use delayd_proto::v1 as pb;

use crate::error::ServiceError;
use crate::service::validate::{self, job_id, queue_name};
use crate::service::PublishParams;

/// Publish options, with the service's defaults for whatever is absent.
pub(super) fn params(
    o: Option<pb::JobOptions>,
    key: Option<String>,
) -> Result<PublishParams, ServiceError> {
    let mut p = PublishParams { key, ..PublishParams::default() };
    let Some(o) = o else { return Ok(p) };
    match o.due {
        Some(pb::job_options::Due::DelayMs(ms)) => p.due = Due::After(ms),
        Some(pb::job_options::Due::AtMs(at)) => p.due = Due::At(at),
        None => {}
    }
    if let Some(ttl) = o.ttl_ms {
        // As lmstfy's ttl=0: never expires.
        p.ttl_ms = (ttl > 0).then_some(ttl);
    }
    if let Some(tries) = o.tries {
        p.tries = u16::try_from(tries).map_err(|_| {
            ServiceError::bad_request(format!("invalid tries {tries}: at most {}", u16::MAX))
        })?;
    }
    if let Some(ttr_ms) = validate::ttr(None, o.ttr_ms)? {
        p.ttr_ms = ttr_ms;
    }
    if let Some(priority) = o.priority {
        p.priority = priority;
    }
    p.attributes = o.attributes.into_iter().collect();
    Ok(p)
}

/// A job reference: its checked queue name and parsed id.
pub(super) fn job_ref(r: &pb::JobRef) -> Result<(QueueName, JobId), ServiceError> {
    Ok((queue_name(&r.namespace, &r.queue)?, job_id(&r.job_id)?))
}

pub(super) fn job(job: Job, now: u64) -> pb::Job {
    pb::Job {
        job_id: job.id.to_string(),
        remain_tries: job.remain_tries().into(),
        elapsed_ms: now.saturating_sub(job.created_ms),
        lease_deadline_ms: job.lease.map(|l| l.deadline_ms),
        state: job.state.as_str().to_string(),
        namespace: job.queue.namespace,
        queue: job.queue.queue,
        key: job.key,
        body: job.body,
        attributes: job.attributes.into_iter().collect(),
        priority: job.priority,
        created_ms: job.created_ms,
        due_at_ms: job.due_ms,
        expires_ms: job.expires_ms,
        tries: job.tries.into(),
        attempt: job.attempts.into(),
        ttr_ms: job.ttr_ms,
    }
}

pub(super) fn delivery(d: Delivery, now: u64) -> pb::Delivery {
    pb::Delivery { lease: d.lease, job: Some(job(d.job, now)) }
}
