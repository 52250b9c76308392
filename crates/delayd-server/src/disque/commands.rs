//! Each Disque command as calls on the service. Replies follow Disque's shapes; errors are
//! the service's messages (`-ERR ...`).

use std::time::Duration;

use delayd_core::{Due, Job, JobId, JobState, QueueName, Target};
use tokio::time::Instant;

use super::resp::Reply;
use crate::error::ServiceError;
use crate::service::jobs::JobUpdate;
use crate::service::reserve::{ReserveOrder, ReserveRequest};
use crate::service::validate::{job_id, queue_name, MAX_RESERVE_COUNT, MAX_WAIT};
use crate::service::{Principal, PublishParams, Service};

/// Commands with their own metric label; anything else is counted as `unknown`.
pub(super) const KNOWN: &[&str] = &[
    "ADDJOB", "GETJOB", "ACKJOB", "FASTACK", "NACK", "WORKING", "QLEN", "QPEEK", "DELJOB", "SHOW",
    "JSHOW", "ENQUEUE", "DEQUEUE", "PAUSE", "INFO", "HELLO", "PING", "QUIT", "AUTH", "QSCAN",
    "JSCAN",
];

/// Disque's default `RETRY`, in seconds: how long a delivered job waits to be acked.
pub const DEFAULT_RETRY_S: u64 = 300;
/// Disque's default `TTL`, in seconds.
pub const DEFAULT_TTL_S: u64 = 86_400;

/// A client connection's state.
pub(super) struct Connection {
    /// Who the client is; `None` until `AUTH` when authentication is on.
    pub(super) principal: Option<Principal>,
    /// Set by `QUIT`: the connection closes after the reply.
    pub(super) quit: bool,
}

fn bad(message: impl Into<String>) -> ServiceError {
    ServiceError::bad_request(message)
}

fn text(arg: &[u8]) -> Result<&str, ServiceError> {
    std::str::from_utf8(arg).map_err(|_| bad("arguments must be UTF-8"))
}

fn num(arg: &[u8], what: &str) -> Result<u64, ServiceError> {
    text(arg)?.parse().map_err(|_| bad(format!("invalid {what}: expected a non-negative integer")))
}

/// A job id as Disque clients see it: `D-`, the job's ULID, `-` and its queue. Disque's ids
/// are global; carrying the queue lets ACKJOB, NACK and the rest act on the job without
/// first looking up where it lives.
fn disque_id(queue: &QueueName, id: JobId) -> String {
    format!("D-{id}-{}", queue.queue)
}

/// A job named by a client.
#[derive(Debug, PartialEq, Eq)]
enum IdRef {
    /// An id as [`disque_id`] makes it.
    Queued(QueueName, JobId),
    /// A bare ULID (with or without `D-`), as the HTTP and gRPC APIs show it: its queue must
    /// be looked up.
    Bare(JobId),
}

/// Parses a job id of namespace `ns`.
fn parse_id(ns: &str, arg: &[u8]) -> Result<IdRef, ServiceError> {
    let s = text(arg)?;
    let rest = s.strip_prefix("D-").unwrap_or(s);
    // A ULID is 26 characters; the queue, when there, follows after a dash.
    match (rest.get(..26), rest.get(26..)) {
        (Some(id), Some("")) => job_id(id).map(IdRef::Bare),
        (Some(id), Some(queue)) => match queue.strip_prefix('-') {
            Some(queue) => Ok(IdRef::Queued(queue_name(ns, queue)?, job_id(id)?)),
            None => Err(bad(format!("invalid job id {s:?}"))),
        },
        _ => Err(bad(format!("invalid job id {s:?}"))),
    }
}

/// Runs one command.
pub(super) async fn run(s: &Service, conn: &mut Connection, name: &str, args: &[Vec<u8>]) -> Reply {
    match name {
        "PING" => match args.first() {
            None => Reply::Simple("PONG".into()),
            Some(a) => Reply::Bulk(Some(a.clone())),
        },
        "QUIT" => {
            conn.quit = true;
            Reply::ok()
        }
        "AUTH" => match auth(s, args).await {
            Ok(principal) => {
                conn.principal = Some(principal);
                Reply::ok()
            }
            Err(e) => Reply::err(e),
        },
        "HELLO" => hello(s).await,
        _ => {
            let Some(caller) = conn.principal.clone() else {
                return Reply::Error("NOAUTH Authentication required.".into());
            };
            // The connection outlives the AUTH that opened it: its token may be gone.
            if let Err(e) = s.revalidate(&caller).await {
                conn.principal = None;
                return Reply::err(e);
            }
            match command(s, &caller, name, args).await {
                Ok(reply) => reply,
                Err(e) => Reply::err(e),
            }
        }
    }
}

async fn auth(s: &Service, args: &[Vec<u8>]) -> Result<Principal, ServiceError> {
    let [token] = args else { return Err(bad("wrong number of arguments for 'auth'")) };
    let principal = s.authenticate(Some(text(token)?)).await?;
    let ns = &s.config().disque_namespace;
    match &principal {
        Principal::Namespace { record, .. } if &record.namespace != ns => {
            Err(ServiceError::Forbidden(format!(
                "the token is for namespace {:?}, not {ns:?}",
                record.namespace
            )))
        }
        _ => Ok(principal),
    }
}

/// The cluster's nodes that serve Disque, as its HELLO lists them:
/// `[version, my id, [id, host, port, priority]...]`. Every node has priority 1.
async fn hello(s: &Service) -> Reply {
    let me = s.config().node_id.to_string();
    let mut items = vec![Reply::Int(1), Reply::text(me)];
    for (id, services) in s.member_services().await {
        let Some((host, port)) = services.get("disque").and_then(|a| a.rsplit_once(':')) else {
            continue;
        };
        items.push(Reply::Array(Some(vec![
            Reply::text(id.to_string()),
            Reply::text(host),
            Reply::text(port),
            Reply::text("1"),
        ])));
    }
    Reply::Array(Some(items))
}

async fn command(
    s: &Service,
    caller: &Principal,
    name: &str,
    args: &[Vec<u8>],
) -> Result<Reply, ServiceError> {
    let ns = s.config().disque_namespace.clone();
    let queue = |arg: &[u8]| queue_name(&ns, text(arg)?);
    match name {
        "ADDJOB" => addjob(s, caller, &ns, args).await,
        "GETJOB" => getjob(s, caller, &ns, args).await,
        "ACKJOB" | "FASTACK" => {
            let mut n = 0;
            for (queue, id) in resolved(s, caller, &ns, args).await? {
                n += i64::from(s.ack(caller, queue, id, None).await?);
            }
            Ok(Reply::Int(n))
        }
        "NACK" => {
            let mut n = 0;
            for (queue, id) in resolved(s, caller, &ns, args).await? {
                match s.release(caller, queue, id, None, 0, None).await {
                    Ok(_) => n += 1,
                    // Not delivered (any more): nothing to put back.
                    Err(ServiceError::Conflict(_) | ServiceError::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(Reply::Int(n))
        }
        "WORKING" => {
            let [id] = args else { return Err(bad("wrong number of arguments for 'working'")) };
            let no_job = || Ok(Reply::Error("NOJOB Job not known".into()));
            let Some((queue, id)) = resolve(s, caller, &ns, id).await? else { return no_job() };
            let touched = match s.touch(caller, queue, id, None, None).await {
                Err(ServiceError::NotFound(_)) => return no_job(),
                touched => touched?,
            };
            let ttr = touched.lease.map_or(touched.ttr_ms, |l| l.ttr_ms);
            Ok(Reply::Int(i64::try_from(ttr / 1000).unwrap_or(i64::MAX)))
        }
        "QLEN" => {
            let [q] = args else { return Err(bad("wrong number of arguments for 'qlen'")) };
            let meta = s.queue_meta(caller, &queue(q)?, false).await?;
            Ok(Reply::Int(i64::try_from(meta.count(JobState::Ready)).unwrap_or(i64::MAX)))
        }
        "QPEEK" => {
            let [q, count] = args else { return Err(bad("wrong number of arguments for 'qpeek'")) };
            let count: i64 =
                text(count)?.parse().map_err(|_| bad("invalid count: expected an integer"))?;
            if count == 0 {
                return Ok(Reply::Array(Some(Vec::new())));
            }
            // delayd peeks the next job only: at most one whatever the count.
            let next = s.peek(caller, &queue(q)?, false).await?;
            Ok(Reply::Array(Some(next.iter().map(|j| job_reply(j, false)).collect())))
        }
        "DELJOB" => {
            let mut n = 0;
            for (queue, id) in resolved(s, caller, &ns, args).await? {
                n += i64::from(s.cancel(caller, queue, Target::Id(id)).await?);
            }
            Ok(Reply::Int(n))
        }
        "ENQUEUE" => {
            let mut n = 0;
            for arg in args {
                let Some(job) = locate(s, caller, &ns, arg).await? else { continue };
                let queued = match job.state {
                    JobState::Reserved => {
                        s.release(caller, job.queue, job.id, None, 0, None).await.map(|_| ())
                    }
                    JobState::Delayed => {
                        let now = JobUpdate { due: Some(Due::After(0)), ..JobUpdate::default() };
                        s.update(caller, job.queue, Target::Id(job.id), now).await.map(|_| ())
                    }
                    JobState::Ready | JobState::Dead => continue,
                };
                match queued {
                    Ok(()) => n += 1,
                    Err(ServiceError::Conflict(_) | ServiceError::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(Reply::Int(n))
        }
        "SHOW" | "JSHOW" => {
            let [id] = args else { return Err(bad("wrong number of arguments for 'show'")) };
            Ok(match locate(s, caller, &ns, id).await? {
                Some(job) => show(&job, s.now_ms()),
                None => Reply::Bulk(None),
            })
        }
        "PAUSE" => {
            let [q, options @ ..] = args else {
                return Err(bad("wrong number of arguments for 'pause'"));
            };
            let q = queue(q)?;
            let mut state = None;
            for o in options {
                match text(o)?.to_ascii_lowercase().as_str() {
                    "in" | "out" | "all" => state = Some(true),
                    "none" => state = Some(false),
                    "state" | "bcast" => {}
                    other => return Err(bad(format!("invalid PAUSE option {other:?}"))),
                }
            }
            let paused = match state {
                Some(paused) => {
                    s.set_paused(caller, q, paused).await?;
                    paused
                }
                None => s.queue_meta(caller, &q, false).await?.paused,
            };
            Ok(Reply::text(if paused { "out" } else { "none" }))
        }
        "INFO" => {
            let c = s.config();
            Ok(Reply::text(format!(
                "# Server\r\ndisque_version:delayd-{}\r\nnode_id:{}\r\nnamespace:{}\r\n",
                env!("CARGO_PKG_VERSION"),
                c.node_id,
                c.disque_namespace
            )))
        }
        "DEQUEUE" => {
            // Out of the queue without being delivered: back when its RETRY runs out.
            let mut n = 0;
            for arg in args {
                let Some(job) = locate(s, caller, &ns, arg).await? else { continue };
                if job.state == JobState::Ready
                    && s.reserve_job(caller, job.queue, job.id, None).await?.is_some()
                {
                    n += 1;
                }
            }
            Ok(Reply::Int(n))
        }
        "QSCAN" => qscan(s, caller, &ns, args).await,
        "JSCAN" => jscan(s, caller, &ns, args).await,
        other => Ok(Reply::err(format!("unknown command '{}'", other.to_ascii_lowercase()))),
    }
}

/// `ADDJOB queue job ms-timeout [REPLICATE n] [DELAY s] [RETRY s] [TTL s] [MAXLEN n] [ASYNC]`.
async fn addjob(
    s: &Service,
    caller: &Principal,
    ns: &str,
    args: &[Vec<u8>],
) -> Result<Reply, ServiceError> {
    let [q, body, timeout, options @ ..] = args else {
        return Err(bad("wrong number of arguments for 'addjob'"));
    };
    num(timeout, "timeout")?;
    let (mut delay, mut retry, mut ttl, mut maxlen) = (0, DEFAULT_RETRY_S, DEFAULT_TTL_S, None);
    let mut options = options.iter();
    while let Some(o) = options.next() {
        let mut value = |what: &str| match options.next() {
            Some(v) => num(v, what),
            None => Err(bad(format!("{what} needs a value"))),
        };
        match text(o)?.to_ascii_uppercase().as_str() {
            // delayd commits every job to a majority before it answers.
            "REPLICATE" => drop(value("REPLICATE")?),
            "ASYNC" => {}
            "DELAY" => delay = value("DELAY")?,
            "RETRY" => retry = value("RETRY")?,
            "TTL" => ttl = value("TTL")?,
            "MAXLEN" => maxlen = Some(value("MAXLEN")?),
            other => return Err(bad(format!("invalid ADDJOB option {other:?}"))),
        }
    }
    let queue = queue_name(ns, text(q)?)?;
    if let Some(max) = maxlen {
        if s.queue_meta(caller, &queue, false).await?.count(JobState::Ready) >= max {
            return Ok(Reply::Error(
                "MAXLEN Queue is already longer than the specified MAXLEN count".into(),
            ));
        }
    }
    let secs = |n: u64| n.saturating_mul(1000);
    let params = PublishParams {
        due: Due::After(secs(delay)),
        ttl_ms: Some(secs(ttl)),
        // RETRY 0: at most once. Otherwise requeued whenever its ttr runs out, until its ttl.
        tries: if retry == 0 { 1 } else { u16::MAX },
        ttr_ms: secs(if retry == 0 { DEFAULT_RETRY_S } else { retry }),
        ..PublishParams::default()
    };
    let published = s.publish(caller, queue.clone(), &params, body.clone()).await?;
    Ok(Reply::text(disque_id(&queue, published.id)))
}

/// `GETJOB [NOHANG] [TIMEOUT ms] [COUNT n] [WITHCOUNTERS] FROM queue...`.
async fn getjob(
    s: &Service,
    caller: &Principal,
    ns: &str,
    args: &[Vec<u8>],
) -> Result<Reply, ServiceError> {
    let (mut nohang, mut timeout_ms, mut count, mut counters) = (false, 0, 1, false);
    let mut queues = Vec::new();
    let mut args = args.iter();
    while let Some(a) = args.next() {
        let mut value = |what: &str| match args.next() {
            Some(v) => num(v, what),
            None => Err(bad(format!("{what} needs a value"))),
        };
        match text(a)?.to_ascii_uppercase().as_str() {
            "NOHANG" => nohang = true,
            "TIMEOUT" => timeout_ms = value("TIMEOUT")?,
            "COUNT" => count = value("COUNT")?,
            "WITHCOUNTERS" => counters = true,
            "FROM" => {
                for q in args.by_ref() {
                    queues.push(queue_name(ns, text(q)?)?);
                }
            }
            other => return Err(bad(format!("invalid GETJOB option {other:?}"))),
        }
    }
    if queues.is_empty() {
        return Err(bad("GETJOB needs FROM and at least one queue"));
    }
    let count = u32::try_from(count)
        .ok()
        .filter(|c| (1..=MAX_RESERVE_COUNT).contains(c))
        .ok_or_else(|| bad(format!("COUNT must be 1 to {MAX_RESERVE_COUNT}")))?;
    // TIMEOUT 0 blocks until a job comes, in rounds of the longest long-poll.
    let deadline =
        (!nohang && timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(timeout_ms));
    loop {
        let wait = match (nohang, deadline) {
            (true, _) => Duration::ZERO,
            (false, None) => MAX_WAIT,
            (false, Some(d)) => d.saturating_duration_since(Instant::now()).min(MAX_WAIT),
        };
        let request = ReserveRequest {
            queues: queues.clone(),
            count,
            ttr_ms: None,
            wait,
            acks: Vec::new(),
            order: ReserveOrder::QueueOrder,
        };
        let got = s.reserve(caller, request).await?.deliveries;
        if !got.is_empty() {
            let jobs = got.iter().map(|d| job_reply(&d.job, counters)).collect();
            return Ok(Reply::Array(Some(jobs)));
        }
        // A stopping node answers at once, as if the timeout had run out.
        if nohang || deadline.is_some_and(|d| Instant::now() >= d) || s.is_draining() {
            return Ok(Reply::Array(None));
        }
    }
}

/// `QSCAN [cursor] [COUNT n] [BUSYLOOP] [MINLEN len] [MAXLEN len] [IMPORTRATE rate]`: the
/// namespace's queues whose ready count is within the bounds, all in one reply (cursor 0:
/// done). `COUNT`, `BUSYLOOP` and `IMPORTRATE` change nothing.
async fn qscan(
    s: &Service,
    caller: &Principal,
    ns: &str,
    args: &[Vec<u8>],
) -> Result<Reply, ServiceError> {
    let (mut min, mut max) = (0, u64::MAX);
    let mut args = args.iter().peekable();
    if args.peek().is_some_and(|a| a.iter().all(u8::is_ascii_digit)) {
        args.next(); // the cursor: every reply is the whole scan
    }
    while let Some(a) = args.next() {
        let mut value = |what: &str| match args.next() {
            Some(v) => num(v, what),
            None => Err(bad(format!("{what} needs a value"))),
        };
        match text(a)?.to_ascii_uppercase().as_str() {
            "COUNT" => drop(value("COUNT")?),
            "IMPORTRATE" => drop(value("IMPORTRATE")?),
            "BUSYLOOP" => {}
            "MINLEN" => min = value("MINLEN")?,
            "MAXLEN" => max = value("MAXLEN")?,
            other => return Err(bad(format!("invalid QSCAN option {other:?}"))),
        }
    }
    let names = s
        .namespace_queues(caller, ns, false)
        .await?
        .into_iter()
        .filter(|(_, meta)| (min..=max).contains(&meta.count(JobState::Ready)))
        .map(|(q, _)| Reply::text(q.queue))
        .collect();
    Ok(Reply::Array(Some(vec![Reply::text("0"), Reply::Array(Some(names))])))
}

/// `JSCAN [cursor] [COUNT n] [BUSYLOOP] [QUEUE q] [STATE s]... [REPLY all|id]`: a page of
/// the namespace's jobs (of one queue with `QUEUE`) in queue, then publish, order, and the
/// cursor of the next page (`0` after the last). A cursor names the last job a page showed.
async fn jscan(
    s: &Service,
    caller: &Principal,
    ns: &str,
    args: &[Vec<u8>],
) -> Result<Reply, ServiceError> {
    const DEFAULT_COUNT: u64 = 100;
    let (mut count, mut only, mut states, mut full) = (DEFAULT_COUNT, None, Vec::new(), false);
    let mut cursor = None;
    let mut args = args.iter().peekable();
    if let Some(first) =
        args.next_if(|a| !a.is_empty() && a.iter().all(u8::is_ascii_digit) || a.starts_with(b"D-"))
    {
        if first.as_slice() != b"0" {
            cursor = match parse_id(ns, first)? {
                IdRef::Queued(queue, id) => Some((queue, id)),
                IdRef::Bare(_) => return Err(bad("invalid JSCAN cursor")),
            };
        }
    }
    while let Some(a) = args.next() {
        let mut value = || {
            args.next().ok_or_else(|| bad(format!("{} needs a value", String::from_utf8_lossy(a))))
        };
        match text(a)?.to_ascii_uppercase().as_str() {
            "COUNT" => count = num(value()?, "COUNT")?,
            "BUSYLOOP" => {}
            "QUEUE" => only = Some(queue_name(ns, text(value()?)?)?),
            "STATE" => {
                let state = text(value()?)?.to_ascii_lowercase();
                match state.as_str() {
                    "queued" => states.extend([JobState::Ready, JobState::Delayed]),
                    "active" => states.push(JobState::Reserved),
                    "acked" => states.push(JobState::Dead),
                    // delayd never holds a job waiting for replication.
                    "wait-repl" => {}
                    other => return Err(bad(format!("invalid JSCAN state {other:?}"))),
                }
            }
            "REPLY" => match text(value()?)?.to_ascii_lowercase().as_str() {
                "all" => full = true,
                "id" => full = false,
                other => return Err(bad(format!("invalid JSCAN reply type {other:?}"))),
            },
            other => return Err(bad(format!("invalid JSCAN option {other:?}"))),
        }
    }
    let count = usize::try_from(count.clamp(1, 1000)).unwrap_or(1000);
    let queues = match only {
        Some(queue) => vec![queue],
        None => s.namespace_queues(caller, ns, false).await?.into_iter().map(|(q, _)| q).collect(),
    };
    // A page looks at a bounded number of jobs, however few pass the STATE filter.
    let budget = count.saturating_mul(10);
    let (mut jobs, mut examined, mut last, mut more) = (Vec::new(), 0, None, false);
    let start = cursor.as_ref().and_then(|(q, _)| queues.iter().position(|x| x == q)).unwrap_or(0);
    'queues: for queue in &queues[start..] {
        let mut after = cursor.as_ref().filter(|(q, _)| q == queue).map(|(_, id)| *id);
        loop {
            if jobs.len() >= count || examined >= budget {
                more = true;
                break 'queues;
            }
            let page = s.jobs_in_queue(caller, queue, after, count - jobs.len()).await?;
            let Some(tail) = page.last() else { break };
            after = Some(tail.id);
            last = Some((queue.clone(), tail.id));
            examined += page.len();
            jobs.extend(
                page.into_iter().filter(|j| states.is_empty() || states.contains(&j.state)),
            );
        }
    }
    let next = match (&last, more) {
        (Some((queue, id)), true) => disque_id(queue, *id),
        _ => "0".into(),
    };
    let now = s.now_ms();
    let items = jobs
        .iter()
        .map(|j| if full { show(j, now) } else { Reply::text(disque_id(&j.queue, j.id)) })
        .collect();
    Ok(Reply::Array(Some(vec![Reply::text(next), Reply::Array(Some(items))])))
}

/// A job as GETJOB and QPEEK answer it: `[queue, id, body]`, and its counters on request.
fn job_reply(job: &Job, counters: bool) -> Reply {
    let mut items = vec![
        Reply::text(job.queue.queue.clone()),
        Reply::text(disque_id(&job.queue, job.id)),
        Reply::Bulk(Some(job.body.clone())),
    ];
    if counters {
        items.extend([
            Reply::text("nacks"),
            Reply::Int(job.counters.releases.into()),
            Reply::text("additional-deliveries"),
            Reply::Int(job.counters.timeouts.into()),
        ]);
    }
    Reply::Array(Some(items))
}

/// SHOW's flat list of fields.
fn show(job: &Job, now: u64) -> Reply {
    let state = match job.state {
        JobState::Delayed | JobState::Ready => "queued",
        JobState::Reserved => "active",
        JobState::Dead => "acked",
    };
    let ttl = job.expires_ms.map_or(0, |e| e.saturating_sub(now) / 1000);
    let int = |n: u64| Reply::Int(i64::try_from(n).unwrap_or(i64::MAX));
    Reply::Array(Some(vec![
        Reply::text("id"),
        Reply::text(disque_id(&job.queue, job.id)),
        Reply::text("queue"),
        Reply::text(job.queue.queue.clone()),
        Reply::text("state"),
        Reply::text(state),
        Reply::text("ttl"),
        int(ttl),
        Reply::text("ctime"),
        int(job.created_ms.saturating_mul(1_000_000)),
        Reply::text("retry"),
        int(job.ttr_ms / 1000),
        Reply::text("nacks"),
        Reply::Int(job.counters.releases.into()),
        Reply::text("additional-deliveries"),
        Reply::Int(job.counters.timeouts.into()),
        Reply::text("body"),
        Reply::Bulk(Some(job.body.clone())),
    ]))
}

/// The queue and id a Disque id names; `None` for a bare id of no job of the namespace.
async fn resolve(
    s: &Service,
    caller: &Principal,
    ns: &str,
    arg: &[u8],
) -> Result<Option<(QueueName, JobId)>, ServiceError> {
    Ok(match parse_id(ns, arg)? {
        IdRef::Queued(queue, id) => Some((queue, id)),
        IdRef::Bare(id) => s.job_in_namespace(caller, ns, id).await?.map(|j| (j.queue, j.id)),
    })
}

/// The job a Disque id names, if it exists.
async fn locate(
    s: &Service,
    caller: &Principal,
    ns: &str,
    arg: &[u8],
) -> Result<Option<Job>, ServiceError> {
    match resolve(s, caller, ns, arg).await? {
        Some((queue, id)) => s.job(caller, &queue, id, false).await,
        None => Ok(None),
    }
}

/// The queues and ids that ids name; bare ids of unknown jobs are left out, as Disque
/// counts them.
async fn resolved(
    s: &Service,
    caller: &Principal,
    ns: &str,
    ids: &[Vec<u8>],
) -> Result<Vec<(QueueName, JobId)>, ServiceError> {
    if ids.is_empty() {
        return Err(bad("give at least one job id"));
    }
    let mut jobs = Vec::with_capacity(ids.len());
    for id in ids {
        jobs.extend(resolve(s, caller, ns, id).await?);
    }
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_disques_prefix() {
        let id = JobId(7);
        let queue = QueueName::new("dq", "jobs-a");
        let shown = disque_id(&queue, id);
        assert!(shown.starts_with("D-"));
        assert_eq!(parse_id("dq", shown.as_bytes()), Ok(IdRef::Queued(queue, id)));
        assert_eq!(parse_id("dq", id.to_string().as_bytes()), Ok(IdRef::Bare(id)));
        assert!(parse_id("dq", b"D-nope").is_err());
        assert_eq!(parse_id("dq", format!("D-{id}").as_bytes()), Ok(IdRef::Bare(id)));
        assert!(parse_id("dq", format!("D-{id}queue").as_bytes()).is_err());
    }
}
