//! Messages to the service's values and back.

use delayd_core::{CatchUp, Delivery, Due, Job, JobId, QueueName, Schedule, Timetable, Webhook};
use delayd_proto::v1 as pb;

use crate::error::ServiceError;
use crate::service::schedules::ScheduleRequest;
use crate::service::validate::{self, job_id, queue_name};
use crate::service::webhooks::WebhookRequest;
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
    p.ttl_ms = validate::ttl(o.ttl_ms);
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
        number: (job.number != 0).then_some(job.number),
    }
}

pub(super) fn delivery(d: Delivery, now: u64) -> pb::Delivery {
    pb::Delivery { lease: d.lease, job: Some(job(d.job, now)) }
}

/// A webhook request; the options absent take the service's defaults.
pub(super) fn webhook_request(r: pb::SetWebhookRequest) -> WebhookRequest {
    WebhookRequest {
        url: r.url,
        timeout_ms: r.timeout_ms,
        max_in_flight: r.max_in_flight,
        rate_per_s: r.rate_per_s,
        backoff_initial_ms: r.backoff_initial_ms,
        backoff_max_ms: r.backoff_max_ms,
        secret: r.secret,
    }
}

/// A webhook as answered; the secret only when `with_secret`.
pub(super) fn webhook(
    queue: QueueName,
    w: Webhook,
    with_secret: bool,
    replaced: bool,
) -> pb::WebhookReply {
    pb::WebhookReply {
        namespace: queue.namespace,
        queue: queue.queue,
        url: w.url,
        timeout_ms: w.timeout_ms,
        max_in_flight: w.max_in_flight,
        rate_per_s: w.rate_per_s,
        backoff_initial_ms: w.backoff_initial_ms,
        backoff_max_ms: w.backoff_max_ms,
        secret: with_secret.then_some(w.secret),
        replaced,
    }
}

/// A schedule request, its job options read like a publish's.
pub(super) fn schedule_request(r: pb::SetScheduleRequest) -> Result<ScheduleRequest, ServiceError> {
    let (cron, every_ms) = match r.timetable {
        Some(pb::set_schedule_request::Timetable::Cron(expr)) => (Some(expr), None),
        Some(pb::set_schedule_request::Timetable::EveryMs(ms)) => (None, Some(ms)),
        None => (None, None),
    };
    let o = r.options.unwrap_or_default();
    let tries = o
        .tries
        .map(|t| {
            u16::try_from(t).map_err(|_| {
                ServiceError::bad_request(format!("invalid tries {t}: at most {}", u16::MAX))
            })
        })
        .transpose()?;
    Ok(ScheduleRequest {
        cron,
        every_ms,
        tz: r.tz,
        body: r.body,
        ttl_ms: o.ttl_ms,
        tries,
        ttr_ms: validate::ttr(None, o.ttr_ms)?,
        priority: o.priority,
        attributes: o.attributes.into_iter().collect(),
        start_at_ms: r.start_at_ms,
        end_at_ms: r.end_at_ms,
        catch_up: r.catch_up,
    })
}

/// A schedule as answered.
pub(super) fn schedule(queue: &QueueName, s: Schedule, replaced: bool) -> pb::ScheduleReply {
    let (timetable, tz) = match s.timetable {
        Timetable::Every { ms } => (pb::schedule_reply::Timetable::EveryMs(ms), String::new()),
        Timetable::Cron { expr, tz } => (pb::schedule_reply::Timetable::Cron(expr), tz),
    };
    pb::ScheduleReply {
        namespace: queue.namespace.clone(),
        queue: queue.queue.clone(),
        name: s.name,
        timetable: Some(timetable),
        tz,
        next_at_ms: s.next_at_ms,
        start_at_ms: s.start_at_ms,
        end_at_ms: s.end_at_ms,
        catch_up: match s.catch_up {
            CatchUp::Latest => "latest",
            CatchUp::None => "none",
            CatchUp::All => "all",
        }
        .into(),
        replaced,
    }
}
