//! Each beanstalkd command as calls on the service, with beanstalkd's replies.

use std::collections::HashMap;
use std::time::Duration;

use delayd_core::{Delivery, Due, Job, JobId, JobState, QueueMeta, QueueName, Target};
use tokio::time::Instant;

use super::wire::{line, with_body, yaml_list, yaml_map, Body, Request};
use super::Tubes;
use crate::error::ServiceError;
use crate::service::reserve::{ReserveOrder, ReserveRequest};
use crate::service::validate::{check_name, MAX_DEAD_LETTER_LIMIT, MAX_WAIT};
use crate::service::{Principal, PublishParams, Service};

/// beanstalkd's safety margin: within the last second of a reservation's ttr, a `reserve`
/// of the same connection answers `DEADLINE_SOON` instead of waiting.
const SAFETY_MARGIN: Duration = Duration::from_secs(1);
/// beanstalkd's tube of a new connection.
const DEFAULT_TUBE: &str = "default";
/// `current-jobs-urgent` counts ready jobs with a priority below this (beanstalkd's).
const URGENT_PRIORITY: u32 = 1024;

/// A job this connection reserved, by number.
struct Held {
    queue: QueueName,
    id: JobId,
    lease: u64,
    /// When its ttr runs out, by this node's clock.
    deadline: Instant,
}

/// A client connection's state.
pub(super) struct Connection {
    service: Service,
    principal: Principal,
    namespace: String,
    tubes: Tubes,
    /// The tube `put` goes to.
    used: String,
    /// The tubes `reserve` takes from, in the order watched.
    watched: Vec<String>,
    /// The jobs it holds.
    held: HashMap<u64, Held>,
    /// Set by `quit`: the connection closes after the reply.
    pub(super) quit: bool,
}

/// Whether a reply is one of beanstalkd's errors (for metrics).
pub(super) fn is_error(reply: &[u8]) -> bool {
    const ERRORS: [&[u8]; 7] = [
        b"BAD_FORMAT",
        b"UNKNOWN_COMMAND",
        b"INTERNAL_ERROR",
        b"OUT_OF_MEMORY",
        b"EXPECTED_CRLF",
        b"JOB_TOO_BIG",
        b"DRAINING",
    ];
    ERRORS.iter().any(|e| reply.starts_with(e))
}

/// A service error as beanstalkd would answer it. beanstalkd has no "unavailable": a
/// cluster without a leader answers `INTERNAL_ERROR`, which clients report and retry.
fn failed(e: &ServiceError) -> Vec<u8> {
    match e {
        ServiceError::BadRequest(_) => line("BAD_FORMAT"),
        ServiceError::TooLarge(_) => line("JOB_TOO_BIG"),
        ServiceError::NotFound(_) | ServiceError::Conflict(_) => line("NOT_FOUND"),
        e => {
            tracing::debug!(error = %e, "beanstalkd command failed");
            line("INTERNAL_ERROR")
        }
    }
}

fn seconds(ms: u64) -> String {
    (ms / 1000).to_string()
}

impl Connection {
    pub(super) fn new(service: &Service, tubes: Tubes) -> Connection {
        let namespace = service.config().beanstalk_namespace.clone();
        tubes.update(DEFAULT_TUBE, |c| {
            c.using += 1;
            c.watching += 1;
        });
        Connection {
            service: service.clone(),
            principal: Principal::Listener { namespace: namespace.clone() },
            namespace,
            tubes,
            used: DEFAULT_TUBE.into(),
            watched: vec![DEFAULT_TUBE.into()],
            held: HashMap::new(),
            quit: false,
        }
    }

    /// Runs one command (with the body a `put` came with) and returns the reply's bytes.
    pub(super) async fn run(&mut self, request: Request, body: Option<Body>) -> Vec<u8> {
        match self.command(request, body).await {
            Ok(reply) => reply,
            Err(e) => failed(&e),
        }
    }

    /// Releases what the connection still holds, as beanstalkd does when a client goes, and
    /// forgets its tubes.
    pub(super) async fn close(mut self) {
        self.tubes.update(&self.used, |c| c.using -= 1);
        for tube in &self.watched {
            self.tubes.update(tube, |c| c.watching -= 1);
        }
        // Those whose ttr ran out are back in line already.
        let now = Instant::now();
        let held = self.held.drain().map(|(_, h)| h).filter(|h| h.deadline > now);
        self.service.return_jobs(held.map(|h| (h.queue, h.id, h.lease)).collect()).await;
    }

    /// A tube of this listener's namespace; names beanstalkd allows but delayd does not (a
    /// dot, a slash, ...) are `BAD_FORMAT`.
    fn queue(&self, tube: &str) -> Result<QueueName, ServiceError> {
        check_name("queue", tube)?;
        Ok(QueueName::new(self.namespace.clone(), tube))
    }

    async fn command(
        &mut self,
        request: Request,
        body: Option<Body>,
    ) -> Result<Vec<u8>, ServiceError> {
        let s = self.service.clone();
        let me = &self.principal.clone();
        match request {
            Request::Put { pri, delay_s, ttr_s, .. } => {
                let body = match body {
                    Some(Body::Data(body)) => body,
                    Some(Body::TooBig) => return Ok(line("JOB_TOO_BIG")),
                    Some(Body::NoCrlf) | None => return Ok(line("EXPECTED_CRLF")),
                };
                let params = PublishParams {
                    due: Due::After(u64::from(delay_s) * 1000),
                    ttl_ms: None,
                    tries: u16::MAX,
                    ttr_ms: u64::from(ttr_s.max(1)) * 1000,
                    priority: pri,
                    ..PublishParams::default()
                };
                let published = s.publish(me, self.queue(&self.used)?, &params, body).await?;
                let number = published.number.ok_or_else(|| {
                    ServiceError::Internal("a job without a key was not created".into())
                })?;
                Ok(line(&format!("INSERTED {number}")))
            }
            Request::Use(tube) => {
                self.queue(&tube)?;
                self.tubes.update(&self.used, |c| c.using -= 1);
                self.tubes.update(&tube, |c| c.using += 1);
                let reply = line(&format!("USING {tube}"));
                self.used = tube;
                Ok(reply)
            }
            Request::Reserve { timeout_s } => self.reserve(timeout_s).await,
            Request::ReserveJob(number) => {
                // The reserve checks the job's state itself: finding it is enough here.
                let Some(job) = s.job_by_number(me, &self.namespace, number, true).await? else {
                    return Ok(line("NOT_FOUND"));
                };
                match s.reserve_job(me, job.queue, job.id, None).await? {
                    Some(delivery) => Ok(self.reserved(delivery)),
                    None => Ok(line("NOT_FOUND")),
                }
            }
            Request::Delete(number) => {
                if let Some(held) = self.held.remove(&number) {
                    let acked = s.ack(me, held.queue, held.id, Some(held.lease)).await;
                    return Ok(line(if acked? { "DELETED" } else { "NOT_FOUND" }));
                }
                // Any job but one another connection holds.
                match s.job_by_number(me, &self.namespace, number, false).await? {
                    Some(job) if job.state != JobState::Reserved => {
                        let removed = s.cancel(me, job.queue, Target::Id(job.id)).await?;
                        Ok(line(if removed { "DELETED" } else { "NOT_FOUND" }))
                    }
                    _ => Ok(line("NOT_FOUND")),
                }
            }
            Request::Release { id, pri, delay_s } => {
                let Some(held) = self.held.remove(&id) else { return Ok(line("NOT_FOUND")) };
                let delay_ms = u64::from(delay_s) * 1000;
                s.release(me, held.queue, held.id, Some(held.lease), delay_ms, Some(pri)).await?;
                Ok(line("RELEASED"))
            }
            Request::Bury { id, pri } => {
                let Some(held) = self.held.remove(&id) else { return Ok(line("NOT_FOUND")) };
                s.bury(me, held.queue, held.id, Some(held.lease), Some(pri)).await?;
                Ok(line("BURIED"))
            }
            Request::Touch(id) => {
                let Some(held) = self.held.get(&id) else { return Ok(line("NOT_FOUND")) };
                let (queue, job_id, lease) = (held.queue.clone(), held.id, held.lease);
                let job = s.touch(me, queue, job_id, Some(lease), None).await?;
                if let Some(l) = job.lease {
                    let deadline = self.deadline(l.deadline_ms);
                    if let Some(held) = self.held.get_mut(&id) {
                        held.deadline = deadline;
                    }
                }
                Ok(line("TOUCHED"))
            }
            Request::Watch(tube) => {
                self.queue(&tube)?;
                if !self.watched.contains(&tube) {
                    self.tubes.update(&tube, |c| c.watching += 1);
                    self.watched.push(tube);
                }
                Ok(line(&format!("WATCHING {}", self.watched.len())))
            }
            Request::Ignore(tube) => {
                if self.watched == [tube.as_str()] {
                    return Ok(line("NOT_IGNORED"));
                }
                if let Some(at) = self.watched.iter().position(|t| *t == tube) {
                    self.watched.remove(at);
                    self.tubes.update(&tube, |c| c.watching -= 1);
                }
                Ok(line(&format!("WATCHING {}", self.watched.len())))
            }
            Request::Peek(number) => {
                Ok(found(s.job_by_number(me, &self.namespace, number, false).await?))
            }
            Request::PeekReady => Ok(found(s.peek(me, &self.queue(&self.used)?, false).await?)),
            Request::PeekDelayed => {
                Ok(found(s.peek_delayed(me, &self.queue(&self.used)?, false).await?))
            }
            Request::PeekBuried => {
                let dead = s.dead_letter(me, &self.queue(&self.used)?, Some(1), false).await?;
                Ok(found(dead.jobs.into_iter().next()))
            }
            Request::Kick(bound) => {
                let bound = u64::from(bound).min(u64::from(MAX_DEAD_LETTER_LIMIT));
                let kicked = s.kick(me, self.queue(&self.used)?, bound).await?;
                Ok(line(&format!("KICKED {kicked}")))
            }
            Request::KickJob(number) => {
                let Some(job) = s.job_by_number(me, &self.namespace, number, true).await? else {
                    return Ok(line("NOT_FOUND"));
                };
                s.kick_job(me, job.queue, job.id).await?;
                Ok(line("KICKED"))
            }
            Request::StatsJob(number) => {
                match s.job_by_number(me, &self.namespace, number, false).await? {
                    Some(job) => Ok(self.job_stats(&job)),
                    None => Ok(line("NOT_FOUND")),
                }
            }
            Request::StatsTube(tube) => {
                let queue = self.queue(&tube)?;
                let Some(meta) = self.existing(&queue).await? else {
                    return Ok(line("NOT_FOUND"));
                };
                let urgent = s.count_ready_below(me, &queue, URGENT_PRIORITY).await?;
                let count = self.tubes.get(&tube);
                let pause = self.tubes.pause(&tube).map(|(d, left)| (d, left.as_secs()));
                Ok(tube_stats(&tube, &meta, urgent, count, pause))
            }
            Request::Stats => self.stats().await,
            Request::ListTubes => {
                let mut names: Vec<String> = s
                    .namespace_queues(me, &self.namespace, false)
                    .await?
                    .into_iter()
                    .map(|(q, _)| q.queue)
                    .collect();
                names.extend(self.tubes.names());
                names.push(DEFAULT_TUBE.into());
                names.sort();
                names.dedup();
                Ok(yaml_list(names.iter().map(String::as_str)))
            }
            Request::ListTubeUsed => Ok(line(&format!("USING {}", self.used))),
            Request::ListTubesWatched => Ok(yaml_list(self.watched.iter().map(String::as_str))),
            Request::PauseTube { tube, delay_s } => {
                let queue = self.queue(&tube)?;
                if self.existing(&queue).await?.is_none() {
                    return Ok(line("NOT_FOUND"));
                }
                s.set_paused(me, queue.clone(), delay_s > 0).await?;
                self.tubes.paused(&tube, delay_s);
                if delay_s > 0 {
                    // The resume is this node's timer: should the node stop first, the tube
                    // stays paused until resumed (pause-tube 0, or the HTTP API).
                    let (service, principal) = (s.clone(), me.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(delay_s.into())).await;
                        if let Err(e) = service.set_paused(&principal, queue, false).await {
                            tracing::warn!(error = %e, "cannot resume a paused tube");
                        }
                    });
                }
                Ok(line("PAUSED"))
            }
            Request::Quit => {
                self.quit = true;
                Ok(Vec::new())
            }
        }
    }

    /// The tube's counts if it exists: it has jobs, or it is `default`, or a connection of
    /// this node uses or watches it (beanstalkd's tubes live as long as one of those holds).
    async fn existing(&self, queue: &QueueName) -> Result<Option<QueueMeta>, ServiceError> {
        let meta = self.service.queue_meta(&self.principal, queue, false).await?;
        let tube = queue.queue.as_str();
        let known = tube == DEFAULT_TUBE || self.tubes.get(tube) != Default::default();
        Ok((known || meta.counts.iter().any(|c| *c > 0)).then_some(meta))
    }

    /// `reserve` and `reserve-with-timeout`: the most urgent job of the watched tubes,
    /// waiting up to the timeout (for ever without one), or `DEADLINE_SOON` once a held job
    /// is within [`SAFETY_MARGIN`] of its ttr.
    async fn reserve(&mut self, timeout_s: Option<u32>) -> Result<Vec<u8>, ServiceError> {
        let queues = self.watched.iter().map(|t| self.queue(t)).collect::<Result<Vec<_>, _>>()?;
        let until = timeout_s.map(|s| Instant::now() + Duration::from_secs(s.into()));
        for tube in &self.watched {
            self.tubes.update(tube, |c| c.waiting += 1);
        }
        let reply = loop {
            let now = Instant::now();
            self.held.retain(|_, h| h.deadline > now);
            // When the held job closest to running out enters its safety margin.
            let soon = self
                .held
                .values()
                .map(|h| h.deadline.checked_sub(SAFETY_MARGIN).unwrap_or(now))
                .min();
            if soon.is_some_and(|at| at <= now) {
                break Ok(line("DEADLINE_SOON"));
            }
            let mut wait = MAX_WAIT;
            if let Some(until) = until {
                wait = wait.min(until.saturating_duration_since(now));
            }
            if let Some(soon) = soon {
                wait = wait.min(soon - now);
            }
            let request = ReserveRequest {
                queues: queues.clone(),
                count: 1,
                ttr_ms: None,
                wait,
                acks: Vec::new(),
                order: ReserveOrder::MostUrgent,
            };
            let got = match self.service.reserve(&self.principal, request).await {
                Ok(got) => got,
                Err(e) => break Err(e),
            };
            if let Some(delivery) = got.deliveries.into_iter().next() {
                break Ok(self.reserved(delivery));
            }
            // A stopping node answers at once, as if the timeout had run out (also a plain
            // `reserve`: the client then reconnects to another node).
            if until.is_some_and(|until| Instant::now() >= until) || self.service.is_draining() {
                break Ok(line("TIMED_OUT"));
            }
        };
        for tube in &self.watched {
            self.tubes.update(tube, |c| c.waiting -= 1);
        }
        reply
    }

    /// Records a job this connection now holds and answers `RESERVED`.
    fn reserved(&mut self, delivery: Delivery) -> Vec<u8> {
        let Delivery { job, lease } = delivery;
        let deadline = self.deadline(job.lease.map_or(0, |l| l.deadline_ms));
        let reply = with_body(&format!("RESERVED {} {}", job.number, job.body.len()), &job.body);
        self.held.insert(job.number, Held { queue: job.queue, id: job.id, lease, deadline });
        reply
    }

    /// A replicated-clock deadline as an instant of this node's clock.
    fn deadline(&self, deadline_ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(deadline_ms.saturating_sub(self.service.now_ms()))
    }

    /// `stats-job`: what delayd keeps of beanstalkd's per-job statistics.
    fn job_stats(&self, job: &Job) -> Vec<u8> {
        let now = self.service.now_ms();
        let (state, time_left) = match job.state {
            JobState::Ready => ("ready", 0),
            JobState::Delayed => ("delayed", job.due_ms.saturating_sub(now)),
            JobState::Reserved => {
                ("reserved", job.lease.map_or(0, |l| l.deadline_ms.saturating_sub(now)))
            }
            JobState::Dead => ("buried", 0),
        };
        let ttr = job.lease.map_or(job.ttr_ms, |l| l.ttr_ms);
        yaml_map(&[
            ("id", job.number.to_string()),
            ("tube", job.queue.queue.clone()),
            ("state", state.into()),
            ("pri", job.priority.to_string()),
            ("age", seconds(now.saturating_sub(job.created_ms))),
            ("delay", seconds(job.due_ms.saturating_sub(job.created_ms))),
            ("ttr", seconds(ttr)),
            ("time-left", seconds(time_left)),
            ("file", "0".into()),
            ("reserves", job.attempts.to_string()),
            ("timeouts", job.counters.timeouts.to_string()),
            ("releases", job.counters.releases.to_string()),
            ("buries", job.counters.buries.to_string()),
            ("kicks", job.counters.kicks.to_string()),
        ])
    }

    /// `stats`: the namespace's job counts and this node's connections.
    async fn stats(&self) -> Result<Vec<u8>, ServiceError> {
        let queues = self.service.namespace_queues(&self.principal, &self.namespace, true).await?;
        let mut counts = [0u64; 4];
        for (_, meta) in &queues {
            for (total, n) in counts.iter_mut().zip(meta.counts) {
                *total += n;
            }
        }
        let [delayed, ready, reserved, buried] = counts;
        let config = self.service.config();
        Ok(yaml_map(&[
            ("current-jobs-urgent", "0".into()),
            ("current-jobs-ready", ready.to_string()),
            ("current-jobs-reserved", reserved.to_string()),
            ("current-jobs-delayed", delayed.to_string()),
            ("current-jobs-buried", buried.to_string()),
            ("job-timeouts", "0".into()),
            ("total-jobs", (delayed + ready + reserved + buried).to_string()),
            ("max-job-size", config.max_body_bytes.to_string()),
            ("current-tubes", queues.len().max(1).to_string()),
            ("pid", std::process::id().to_string()),
            ("version", format!("\"delayd {}\"", env!("CARGO_PKG_VERSION"))),
            ("id", config.node_id.to_string()),
            ("draining", "false".into()),
        ]))
    }
}

/// `FOUND <id> <bytes>` with the body, or `NOT_FOUND`.
fn found(job: Option<Job>) -> Vec<u8> {
    match job {
        Some(job) => with_body(&format!("FOUND {} {}", job.number, job.body.len()), &job.body),
        None => line("NOT_FOUND"),
    }
}

/// `stats-tube`: the tube's counts, this node's connections on it, and the pause this node
/// took for it (its delay and seconds left), if one runs.
fn tube_stats(
    tube: &str,
    meta: &QueueMeta,
    urgent: u64,
    count: super::TubeCount,
    pause: Option<(u32, u64)>,
) -> Vec<u8> {
    let n = |state| meta.count(state).to_string();
    let total: u64 = meta.counts.iter().sum();
    yaml_map(&[
        ("name", tube.to_string()),
        ("current-jobs-urgent", urgent.to_string()),
        ("current-jobs-ready", n(JobState::Ready)),
        ("current-jobs-reserved", n(JobState::Reserved)),
        ("current-jobs-delayed", n(JobState::Delayed)),
        ("current-jobs-buried", n(JobState::Dead)),
        ("total-jobs", total.to_string()),
        ("current-using", count.using.to_string()),
        ("current-watching", count.watching.to_string()),
        ("current-waiting", count.waiting.to_string()),
        ("cmd-delete", "0".into()),
        ("cmd-pause-tube", "0".into()),
        // A pause taken through another node, or over HTTP, has no delay known here.
        ("pause", pause.map_or(u64::from(meta.paused), |(d, _)| d.into()).to_string()),
        ("pause-time-left", pause.map_or(0, |(_, left)| left).to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_recognised() {
        assert!(is_error(b"BAD_FORMAT\r\n"));
        assert!(is_error(b"JOB_TOO_BIG\r\n"));
        assert!(!is_error(b"NOT_FOUND\r\n"));
        assert!(!is_error(b"INSERTED 1\r\n"));
    }

    #[test]
    fn service_errors_map_to_beanstalkd_replies() {
        assert_eq!(failed(&ServiceError::bad_request("x")), b"BAD_FORMAT\r\n");
        assert_eq!(failed(&ServiceError::NotFound("x".into())), b"NOT_FOUND\r\n");
        assert_eq!(failed(&ServiceError::Unavailable("x".into())), b"INTERNAL_ERROR\r\n");
    }

    #[test]
    fn tube_names_beanstalkd_allows_may_still_be_refused() {
        assert!(super::super::wire::valid_tube("a.b"));
        assert!(check_name("queue", "a.b").is_err());
    }
}
