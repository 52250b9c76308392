//! delayd's workloads over its HTTP API. Each one uses its own queue (so none sees another's
//! leftovers), spreads its clients over every node (followers forward to the leader, as real
//! clients would see), and returns one [`Row`] per figure.
//!
//! Closed-loop workloads (`publish-*`, `drain`, `lifecycle`) measure throughput: C clients
//! each send their next request when the last one answered. Open-loop ones (`timer`,
//! `publish-latency`) send at a fixed rate whatever the answers do, and time each request
//! from when it *should* have been sent, so a stalled server shows as latency rather than as
//! fewer samples (coordinated omission).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use delayd_percentiles::MillisRecorder;
use reqwest::header::HeaderValue;
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::{json, Value};

use crate::cluster::Cluster;
use crate::conn::{Answer, Conn, REQUEST_TIMEOUT};
use crate::progress;
use crate::settle;
use crate::stats::{
    join_all, ms_since, wall_ms, Budget, CpuMeter, Percentiles, Row, Status, Tally,
};

/// Bodies are this many bytes, as in the peer table.
pub const BODY_BYTES: usize = 100;
/// Jobs per bulk publish (delayd's maximum).
pub const BULK_JOBS: usize = 64;
/// A long-poll reserve waits this long (s) before answering "no job".
const POLL_S: u64 = 1;
/// Consecutive empty long polls after which a drain consumer gives up.
const MAX_EMPTY_POLLS: u32 = 5;
/// Jobs per reserve in `drain-count10` and the other `count10` workloads.
pub const RESERVE_COUNT: usize = 10;

/// Workload parameters (see the CLI for their meaning and defaults).
#[derive(Debug, Clone)]
pub struct Opts {
    /// Concurrent clients.
    pub clients: usize,
    /// Closed-loop publish workloads stop after this many jobs...
    pub jobs: Option<u64>,
    /// ...or after this many seconds.
    pub secs: f64,
    /// Delay of jobs published by the publish workloads, ms (long, so they never come due
    /// while later workloads run).
    pub publish_delay_ms: u64,
    /// Jobs preloaded and drained by `drain`.
    pub drain_jobs: u64,
    /// Seconds of `lifecycle`.
    pub lifecycle_secs: f64,
    /// Jobs coming due per second in `timer`.
    pub timer_rate: u64,
    /// Seconds over which `timer` jobs come due.
    pub timer_secs: f64,
    /// How far ahead of its due time each `timer` job is published, ms.
    pub timer_lead_ms: u64,
    /// Where timer runs write each delivery's due time and lateness (none: not written).
    pub timer_trace: Option<std::path::PathBuf>,
    /// Offered publishes per second in `publish-latency`.
    pub latency_rate: u64,
    /// Seconds of `publish-latency`.
    pub latency_secs: f64,
    /// Cumulative stored-job counts at which `storage` measures.
    pub storage_jobs: Vec<u64>,
    /// Publishes per second during `failover`.
    pub failover_rate: u64,
}

/// What the workloads of one system share.
#[derive(Clone)]
pub struct Ctx {
    /// HTTP client (one connection pool) for setup, checks and open-loop requests;
    /// closed-loop workers each have a [`Conn`] of their own.
    pub http: reqwest::Client,
    /// The `Authorization` value every request shows, if any.
    auth: Option<HeaderValue>,
    /// Nodes' base URLs; client i talks to node i mod n.
    pub urls: Vec<String>,
    /// Every node's base URL, whichever the clients talk to: where the bench reads whether
    /// the nodes are done with the work a workload left behind.
    pub nodes: Vec<String>,
    /// Nodes' gRPC addresses (empty for a target given by HTTP URLs only).
    pub grpc: Vec<String>,
    /// Nodes' Disque-protocol addresses (empty for a target).
    pub disque: Vec<String>,
    /// The system's label in the table.
    pub system: String,
    /// The credential for the gRPC client (HTTP requests carry it as a default header).
    token: Option<String>,
    /// A per-run namespace, so reruns against a target never mix.
    pub ns: String,
    /// Parameters.
    pub opts: Opts,
    /// The CPU time of the cluster's processes and of the bench over the running workload.
    pub cpu: Arc<CpuMeter>,
}

impl Ctx {
    /// A context for `cluster`.
    pub fn new(cluster: &Cluster, opts: &Opts, ns: &str) -> Result<Ctx> {
        let mut headers = reqwest::header::HeaderMap::new();
        let auth = match &cluster.token {
            Some(t) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {t}"))?;
                v.set_sensitive(true);
                headers.insert(reqwest::header::AUTHORIZATION, v.clone());
                Some(v)
            }
            None => None,
        };
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .pool_max_idle_per_host(opts.clients.max(1) * 2)
            .timeout(REQUEST_TIMEOUT)
            .tcp_nodelay(true)
            .build()?;
        Ok(Ctx {
            http,
            auth,
            urls: cluster.client_urls(),
            nodes: cluster.urls.clone(),
            grpc: cluster.grpc.clone(),
            disque: cluster.disque.clone(),
            system: cluster.name.clone(),
            token: cluster.token.clone(),
            ns: ns.to_string(),
            opts: opts.clone(),
            cpu: Arc::new(CpuMeter::default()),
        })
    }

    /// The same context with `clients` concurrent clients (the HTTP pool is shared: build
    /// the context with the largest level, so its idle pool is big enough for all).
    pub fn with_clients(&self, clients: usize) -> Ctx {
        let mut ctx = self.clone();
        ctx.opts.clients = clients.max(1);
        ctx
    }

    /// Whether any node has a flush or compaction running or due; see
    /// [`settle::delayd_busy`].
    pub async fn busy(&self) -> Result<Option<bool>> {
        settle::delayd_busy(&self.http, &self.nodes).await
    }

    /// Waits until no node has a flush or compaction running or due, as [`settle::wait`]
    /// does.
    pub async fn settle(&self) -> settle::Settled {
        settle::wait(|| self.busy()).await
    }

    /// The credential requests show, if any.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The queue URL of `queue` on the node client `i` talks to.
    fn queue_url(&self, i: usize, queue: &str) -> String {
        format!("{}{}", self.urls[i % self.urls.len()], self.queue_path(queue))
    }

    /// The path of `queue`'s URL.
    fn queue_path(&self, queue: &str) -> String {
        format!("/api/{}/{}", self.ns, queue)
    }

    /// A connection of its own for closed-loop client `i`, to the node it talks to.
    fn conn(&self, i: usize) -> Result<Conn> {
        Conn::new(&self.urls[i % self.urls.len()], self.auth.clone())
    }
}

/// A 100-byte body.
pub fn body() -> Vec<u8> {
    vec![b'x'; BODY_BYTES]
}

/// A bulk body: a JSON array of `BULK_JOBS` strings whose JSON text is 100 bytes each.
fn bulk_body() -> Vec<u8> {
    let one = format!("\"{}\"", "x".repeat(BODY_BYTES - 2));
    format!("[{}]", vec![one; BULK_JOBS].join(",")).into_bytes()
}

/// Sends `req`, failing unless the answer has status `want`.
async fn expect(req: reqwest::RequestBuilder, want: StatusCode) -> Result<()> {
    let resp = req.send().await?;
    let status = resp.status();
    // The whole body is read either way, so the connection goes back to the pool.
    let body = resp.bytes().await?;
    Answer { status, headers: Default::default(), body }.expect(want)
}

/// One reserve on the queue at path `qpath`: `Some((job_id, lease, due_at_ms))`, or `None`
/// when the long poll ran out.
async fn reserve(conn: &mut Conn, qpath: &str) -> Result<Option<(String, String, f64)>> {
    let answer = conn.get(&format!("{qpath}?ttr=30&timeout={POLL_S}")).await?;
    let status = answer.status;
    if status == StatusCode::NOT_FOUND {
        return Ok(None);
    }
    let v = answer.json()?;
    if status != StatusCode::OK {
        bail!("reserve: HTTP {status}: {v}");
    }
    delivery(&v).map(Some)
}

/// A reserve answer's `(job_id, lease, due_at_ms)`.
fn delivery(v: &Value) -> Result<(String, String, f64)> {
    let id = v["job_id"].as_str().context("reserve answer without job_id")?.to_string();
    let lease = v["lease"].as_str().context("reserve answer without lease")?.to_string();
    let due = v["due_at_ms"].as_f64().context("reserve answer without due_at_ms")?;
    Ok((id, lease, due))
}

/// Acks a reserved job, `DELETE …/job/{id}`: with `lease`, only while that lease is current
/// (delayd's check, answered once applied, since it may refuse); without, as lmstfy's clients
/// send it (answered once committed: it removes the job whatever its state).
async fn ack(conn: &mut Conn, qpath: &str, id: &str, lease: Option<&str>) -> Result<()> {
    let path = match lease {
        Some(lease) => format!("{qpath}/job/{id}?lease={lease}"),
        None => format!("{qpath}/job/{id}"),
    };
    conn.delete(&path).await?.expect(StatusCode::NO_CONTENT)
}

/// `publish-http` and `publish-bulk`: closed-loop publishes until the budget is spent.
pub async fn publish(ctx: &Ctx, bulk: bool) -> Result<Row> {
    let name = if bulk { "publish-bulk" } else { "publish-http" };
    let per_op = if bulk { BULK_JOBS as u64 } else { 1 };
    let budget = Budget::new(ctx.opts.jobs, ctx.opts.secs);
    let tally = publish_loop(ctx, name, budget, bulk, ctx.opts.publish_delay_ms, "0", None).await?;
    let mut row = Row::from_tally(&ctx.system, name, tally.0, tally.1, "request");
    row.prefix_note(format!("{per_op} job(s)/request, delay {} ms", ctx.opts.publish_delay_ms));
    Ok(row)
}

/// C clients publishing singly or in bulk with `delay_ms` until `budget` is spent; returns
/// the tally and the seconds it took. Jobs published advance `progress`, if given.
async fn publish_loop(
    ctx: &Ctx,
    queue: &str,
    budget: Budget,
    bulk: bool,
    delay_ms: u64,
    ttl_s: &str,
    progress: Option<&progress::Bar>,
) -> Result<(Tally, f64)> {
    let per_op = if bulk { BULK_JOBS as u64 } else { 1 };
    let payload = Bytes::from(if bulk { bulk_body() } else { body() });
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..ctx.opts.clients {
        let path = if bulk { "/bulk" } else { "" };
        let pq = format!("{}{path}?delay_ms={delay_ms}&ttl={ttl_s}", ctx.queue_path(queue));
        let (mut conn, budget, payload) = (ctx.conn(i)?, budget.clone(), payload.clone());
        let bar = progress.map(progress::Bar::handle);
        tasks.push(tokio::spawn(async move {
            let mut t = Tally::default();
            while budget.take(per_op) {
                let t0 = Instant::now();
                let sent = conn.put(&pq, payload.clone()).await;
                match sent.and_then(|a| a.expect(StatusCode::CREATED)) {
                    Ok(_) => {
                        t.samples.record(ms_since(t0));
                        t.jobs += per_op;
                        if let Some(bar) = &bar {
                            bar.inc(per_op);
                        }
                    }
                    Err(e) => t.error(e),
                }
            }
            t
        }));
    }
    let tally = join_all(tasks).await?;
    Ok((tally, start.elapsed().as_secs_f64()))
}

/// Batches per `PublishStream` call in `publish-grpc-stream`.
const STREAM_BATCHES: usize = 16;

/// `publish-grpc-stream`: C clients each sending client-streaming `PublishStream` calls of
/// [`STREAM_BATCHES`] batches of [`BULK_JOBS`] jobs through `delayd-client` (which goes to
/// the leader); latency is per call.
pub async fn publish_grpc_stream(ctx: &Ctx) -> Result<Row> {
    let name = "publish-grpc-stream";
    if ctx.grpc.is_empty() {
        let mut row = Row::new(&ctx.system, name, Status::Unavailable);
        row.note = "no gRPC addresses for a target given by HTTP URLs".into();
        return Ok(row);
    }
    let per_call = (STREAM_BATCHES * BULK_JOBS) as u64;
    let batch = delayd_client::PublishBatch {
        namespace: ctx.ns.clone(),
        queue: name.into(),
        bodies: vec![body(); BULK_JOBS],
        options: Some(delayd_client::JobOptions {
            due: Some(delayd_client::Due::DelayMs(ctx.opts.publish_delay_ms)),
            ttl_ms: Some(0),
            ..Default::default()
        }),
        keys: Vec::new(),
    };
    let budget = Budget::new(ctx.opts.jobs, ctx.opts.secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..ctx.opts.clients {
        let options = delayd_client::Options {
            token: ctx.token.clone(),
            ..delayd_client::Options::default()
        };
        let client = delayd_client::Client::connect_with(&ctx.grpc, options).await?;
        let (budget, batches) = (budget.clone(), vec![batch.clone(); STREAM_BATCHES]);
        tasks.push(tokio::spawn(async move {
            let mut t = Tally::default();
            while budget.take(per_call) {
                let t0 = Instant::now();
                match client.publish_stream(batches.clone()).await {
                    Ok(results) => {
                        t.samples.record(ms_since(t0));
                        for r in results {
                            match r.error {
                                None => t.jobs += r.job_ids.len() as u64,
                                Some(e) => t.error(format!("batch: {}", e.message)),
                            }
                        }
                    }
                    Err(e) => t.error(e),
                }
            }
            t
        }));
    }
    let tally = join_all(tasks).await?;
    let mut row = Row::from_tally(&ctx.system, name, tally, start.elapsed().as_secs_f64(), "call");
    row.prefix_note(format!(
        "{STREAM_BATCHES} batches x {BULK_JOBS} jobs per call, delay {} ms",
        ctx.opts.publish_delay_ms
    ));
    Ok(row)
}

/// Preloads `n` ready jobs into `queue` with bulk publishes and waits until all are ready.
async fn preload(ctx: &Ctx, queue: &str, n: u64) -> Result<()> {
    let n = n.div_ceil(BULK_JOBS as u64) * BULK_JOBS as u64;
    let bar = progress::jobs(format!("preloading {queue}"), n);
    let (t, _) =
        publish_loop(ctx, queue, Budget::new(Some(n), 3600.0), true, 0, "0", Some(&bar)).await?;
    if t.errors > 0 {
        bail!("preload: {} failed bulk publishes: {:?}", t.errors, t.first_error);
    }
    let url = format!("{}/size", ctx.queue_url(0, queue));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let size: Value = ctx.http.get(&url).send().await?.json().await?;
        if size["size"].as_u64().unwrap_or(0) >= t.jobs {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("preloaded jobs not all ready after 60 s: {size}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Preloads a drain's ready jobs into a queue of its own (per workload and client level, so
/// one level's leftovers never reach the next), waits until the nodes have flushed and
/// compacted what the preload left them (up to [`settle::DEADLINE`]), leaves the preload's
/// CPU out of the measurement, and returns the queue and how many jobs there are.
async fn drain_setup(ctx: &Ctx, workload: &str) -> Result<(String, u64, settle::Settled)> {
    let queue = format!("{workload}-c{}", ctx.opts.clients);
    preload(ctx, &queue, ctx.opts.drain_jobs).await?;
    let settled = ctx.settle().await;
    ctx.cpu.restart();
    Ok((queue, ctx.opts.drain_jobs.div_ceil(BULK_JOBS as u64) * BULK_JOBS as u64, settled))
}

/// `drain`: preload ready jobs, then C consumers reserve + ack (two requests per job) until
/// all are gone. The ack is lmstfy's, by id alone; with `leased` (`drain-lease`) it shows
/// the reserve's lease.
pub async fn drain(ctx: &Ctx, leased: bool) -> Result<Row> {
    let (name, latency_of) =
        if leased { ("drain-lease", "reserve+ack with lease") } else { ("drain", "reserve+ack") };
    drain_with(ctx, name, latency_of, |mut conn, qpath, mut d| async move {
        while d.more() {
            let t0 = Instant::now();
            let done = async {
                let Some((id, lease, _)) = reserve(&mut conn, &qpath).await? else {
                    return Ok(false);
                };
                ack(&mut conn, &qpath, &id, leased.then_some(lease.as_str())).await?;
                Ok::<_, anyhow::Error>(true)
            };
            // An HTTP error ends one request (the connection is dialled again): go on.
            d.record(t0, done.await);
        }
        d.finish()
    })
    .await
}

/// `drain-ackfirst`: as `drain`, but each consumer acks its previous job on its next reserve
/// (`?ack={job_id}&ack_lease={lease}`), one request per job; a job counts once the answer
/// says its ack took. Once every job has been taken there is nothing left to reserve, and
/// the jobs still held are acked with a plain ack.
pub async fn drain_ackfirst(ctx: &Ctx) -> Result<Row> {
    let taken = Arc::new(AtomicU64::new(0));
    let latency_of = "ack+reserve (1 request)";
    drain_with(ctx, "drain-ackfirst", latency_of, |mut conn, qpath, mut d| {
        let taken = taken.clone();
        async move {
            let total = d.total;
            let mut held: Option<(String, String)> = None;
            while d.more() {
                let t0 = Instant::now();
                let Some(prev) = held.take() else {
                    // Nothing to ack yet: a plain reserve, not a sample (no job is done by it).
                    match reserve(&mut conn, &qpath).await {
                        Ok(Some((id, lease, _))) => {
                            taken.fetch_add(1, Ordering::Relaxed);
                            held = Some((id, lease));
                        }
                        nothing_or_error => {
                            d.record(t0, nothing_or_error.map(|_| false));
                        }
                    }
                    continue;
                };
                if taken.load(Ordering::Relaxed) >= total {
                    let acked = ack(&mut conn, &qpath, &prev.0, Some(&prev.1)).await;
                    d.record(t0, acked.map(|()| true));
                    continue;
                }
                // On an error the held job is lost to this run: it comes back only after its
                // ttr, and the row reports it as not drained.
                // No long poll: when the queue has just run dry, the answer, and with it the
                // news that the ack took, would come back only when the poll ran out, and the
                // drain's end (its last ack) would be counted up to a second late. A drain's
                // queue is full until its end.
                let acking = std::slice::from_ref(&prev);
                let r =
                    reserve_acking(&mut conn, &qpath, 1, acking, 0).await.and_then(|(n, next)| {
                        let next = next.into_iter().next();
                        if next.is_some() {
                            taken.fetch_add(1, Ordering::Relaxed);
                        }
                        held = next.map(|(id, lease, _)| (id, lease));
                        if n == 1 {
                            Ok(true)
                        } else {
                            bail!("the ack of job {} on the next reserve did not take", prev.0)
                        }
                    });
                d.record(t0, r);
            }
            d.finish()
        }
    })
    .await
}

/// The jobs a reserve answer hands out, each as `(job_id, lease, due_at_ms)`: one object
/// (`count=1`) or an array.
fn deliveries(v: &Value) -> Result<Vec<(String, String, f64)>> {
    match v.as_array() {
        Some(all) => all.iter().map(delivery).collect(),
        None => Ok(vec![delivery(v)?]),
    }
}

/// A reserve of up to `count` jobs that first acks every job in `held` (delayd's `ack=`
/// extension, the ids and their leases each joined by commas), long-polling up to
/// `timeout_s`: how many of those acks took (from the `Delayd-Acked` header), and the jobs
/// it handed out.
async fn reserve_acking(
    conn: &mut Conn,
    qpath: &str,
    count: usize,
    held: &[(String, String)],
    timeout_s: u64,
) -> Result<(usize, Vec<(String, String, f64)>)> {
    let mut pq = format!("{qpath}?ttr=30&timeout={timeout_s}&count={count}");
    if !held.is_empty() {
        let join = |pick: fn(&(String, String)) -> &str| {
            held.iter().map(pick).collect::<Vec<_>>().join(",")
        };
        pq.push_str(&format!("&ack={}&ack_lease={}", join(|h| &h.0), join(|h| &h.1)));
    }
    let answer = conn.get(&pq).await?;
    let status = answer.status;
    if status != StatusCode::OK && status != StatusCode::NOT_FOUND {
        bail!("reserve with {} acks: HTTP {status}: {}", held.len(), answer.json()?);
    }
    let mut acked = 0;
    if !held.is_empty() {
        let words = answer
            .headers
            .get("delayd-acked")
            .and_then(|h| h.to_str().ok())
            .context("a reserve with ack= answered without Delayd-Acked")?;
        if words.split(',').count() != held.len() {
            bail!("Delayd-Acked {words:?} does not answer the {} acks sent", held.len());
        }
        acked = words.split(',').filter(|w| *w == "true").count();
    }
    if status == StatusCode::NOT_FOUND {
        return Ok((acked, Vec::new()));
    }
    Ok((acked, deliveries(&answer.json()?)?))
}

/// `drain-count10-ackfirst`: each reserve asks for up to [`RESERVE_COUNT`] jobs and carries
/// the acks of every job the consumer's previous reserve handed out (`ack=id1,id2,…` with
/// `ack_lease=l1,l2,…`): one request per round of up to ten jobs. A job counts once the
/// answer's `Delayd-Acked` says its ack took.
pub async fn drain_count10_ackfirst(ctx: &Ctx) -> Result<Row> {
    let latency_of = "acks + reserve of ≤10 (1 request)";
    drain_with(ctx, "drain-count10-ackfirst", latency_of, |mut conn, qpath, mut d| async move {
        let mut held: Vec<(String, String)> = Vec::new();
        while d.more() {
            let t0 = Instant::now();
            // No long poll, for the reason `drain-ackfirst` gives; once the queue is
            // empty the held acks still go, with a reserve answered 404 at once.
            let got = reserve_acking(&mut conn, &qpath, RESERVE_COUNT, &held, 0).await;
            let sent = std::mem::take(&mut held);
            match got {
                Ok((n, next)) => {
                    // The jobs handed out are held whatever became of the acks.
                    held = next.into_iter().map(|(id, lease, _)| (id, lease)).collect();
                    // The first round acks nothing but is not an empty poll.
                    if n > 0 || (sent.is_empty() && held.is_empty()) {
                        d.record_acked(t0, Ok(n as u64));
                    }
                    // Jobs whose ack did not take are lost to this run: they come back
                    // only after their ttr, and the row reports them as not drained.
                    if n < sent.len() {
                        let failed = sent.len() - n;
                        d.record(t0, Err(anyhow::anyhow!("{failed} carried acks did not take")));
                    }
                }
                // On an error the held jobs are lost to this run, as above.
                Err(e) => {
                    d.record(t0, Err(e));
                }
            }
        }
        d.finish()
    })
    .await
}

/// `drain-count10`: as `drain`, but each reserve asks for up to [`RESERVE_COUNT`] jobs
/// (`count=10`, answered with an array), and the consumer then acks each of them one by one.
/// The latency is that of a whole round: the reserve and its acks.
pub async fn drain_count10(ctx: &Ctx) -> Result<Row> {
    let latency_of = "reserve of ≤10 + their acks";
    drain_with(ctx, "drain-count10", latency_of, |mut conn, qpath, mut d| async move {
        while d.more() {
            let t0 = Instant::now();
            let jobs = match reserve_acking(&mut conn, &qpath, RESERVE_COUNT, &[], POLL_S).await {
                Ok((_, jobs)) => jobs,
                Err(e) => {
                    d.record(t0, Err(e));
                    continue;
                }
            };
            // Acks that went through count even when a later one of the round fails.
            let mut n = 0;
            let mut failed = None;
            for (id, _, _) in &jobs {
                match ack(&mut conn, &qpath, id, None).await {
                    Ok(()) => n += 1,
                    Err(e) => failed = Some(e),
                }
            }
            if n > 0 || failed.is_none() {
                d.record_acked(t0, Ok(n));
            }
            if let Some(e) = failed {
                d.record(t0, Err(e));
            }
        }
        d.finish()
    })
    .await
}

/// Runs a drain of `workload` against delayd: preloads the jobs, then runs `consumer` once
/// per client, each with a connection of its own, the queue's path and its [`Drainer`], and
/// makes the row of their tallies.
async fn drain_with<F, Fut>(
    ctx: &Ctx,
    workload: &str,
    latency_of: &'static str,
    consumer: F,
) -> Result<Row>
where
    F: Fn(Conn, String, Drainer) -> Fut,
    Fut: Future<Output = (Tally, f64)> + Send + 'static,
{
    let (queue, total, settled) = drain_setup(ctx, workload).await?;
    let acked = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..ctx.opts.clients {
        let d = Drainer::new(acked.clone(), total, start);
        tasks.push(tokio::spawn(consumer(ctx.conn(i)?, ctx.queue_path(&queue), d)));
    }
    settled.note_preload(drain_row(&ctx.system, workload, latency_of, tasks, total, acked).await)
}

/// One drain consumer's bookkeeping, the same for every system: how long each reserve + ack
/// took, when its last ack came, and when to stop — once every job is acked (by any
/// consumer), or after [`MAX_EMPTY_POLLS`] polls in a row found nothing.
pub struct Drainer {
    acked: Arc<AtomicU64>,
    total: u64,
    start: Instant,
    tally: Tally,
    empty: u32,
    last_ack: f64,
}

impl Drainer {
    /// A consumer of a drain of `total` jobs that began at `start`; `acked` is shared by
    /// all its consumers.
    pub fn new(acked: Arc<AtomicU64>, total: u64, start: Instant) -> Drainer {
        Drainer { acked, total, start, tally: Tally::default(), empty: 0, last_ack: 0.0 }
    }

    /// Whether to try for another job.
    pub fn more(&self) -> bool {
        self.acked.load(Ordering::Relaxed) < self.total && self.empty < MAX_EMPTY_POLLS
    }

    /// Records one attempt begun at `t0`: `Ok(true)` a job taken and acked, `Ok(false)`
    /// nothing ready. Returns false for an error.
    pub fn record(&mut self, t0: Instant, attempt: Result<bool>) -> bool {
        self.record_acked(t0, attempt.map(u64::from))
    }

    /// Records one attempt begun at `t0` that acked `n` jobs (`Ok(0)`: nothing was ready):
    /// one latency sample for the attempt, whatever `n`. Returns false for an error.
    pub fn record_acked(&mut self, t0: Instant, attempt: Result<u64>) -> bool {
        match attempt {
            Ok(0) => self.empty += 1,
            Ok(n) => {
                self.empty = 0;
                self.tally.samples.record(ms_since(t0));
                self.tally.jobs += n;
                self.acked.fetch_add(n, Ordering::Relaxed);
                self.last_ack = self.start.elapsed().as_secs_f64();
            }
            Err(e) => {
                self.tally.error(e);
                return false;
            }
        }
        true
    }

    /// The tally and the seconds to this consumer's last ack, for [`drain_row`].
    pub fn finish(self) -> (Tally, f64) {
        (self.tally, self.last_ack)
    }
}

/// The `drain` row of any system from its consumers' `(tally, seconds to their last ack)`:
/// the run ends at the last ack, not at the last consumer's final empty poll, and any job
/// left undrained fails it. `acked` (the consumers' shared count) drives a progress bar
/// while they run.
pub async fn drain_row(
    system: &str,
    workload: &str,
    latency_of: &'static str,
    tasks: Vec<tokio::task::JoinHandle<(Tally, f64)>>,
    total: u64,
    acked: Arc<AtomicU64>,
) -> Result<Row> {
    let _bar = progress::watch(format!("{workload}: acked"), total, acked);
    let mut all = Tally::default();
    let mut secs: f64 = 0.0;
    for task in tasks {
        let (t, last_ack) = task.await?;
        secs = secs.max(last_ack);
        all.merge(t);
    }
    let missing = total.saturating_sub(all.jobs);
    let mut row = Row::from_tally(system, workload, all, secs, latency_of);
    row.prefix_note(format!("{total} preloaded ready jobs"));
    if missing > 0 {
        row.status = Status::Failed;
        row.prefix_note(format!("{missing} of {total} jobs not drained"));
    }
    Ok(row)
}

/// `lifecycle`: C/2 producers (delay 0) and C/2 consumers (reserve + ack) for T seconds.
/// The rate is acked jobs/s; the latency is how long a job waited: delivery − due.
pub async fn lifecycle(ctx: &Ctx) -> Result<Row> {
    let queue = "lifecycle";
    let half = (ctx.opts.clients / 2).max(1);
    let budget = Budget::new(None, ctx.opts.lifecycle_secs);
    let deadline = Instant::now() + Duration::from_secs_f64(ctx.opts.lifecycle_secs);
    let start = Instant::now();
    let mut producers = Vec::new();
    for i in 0..half {
        let pq = format!("{}?delay_ms=0", ctx.queue_path(queue));
        let (mut conn, budget, payload) = (ctx.conn(i)?, budget.clone(), Bytes::from(body()));
        producers.push(tokio::spawn(async move {
            let mut t = Tally::default();
            while budget.take(1) {
                let sent = conn.put(&pq, payload.clone()).await;
                match sent.and_then(|a| a.expect(StatusCode::CREATED)) {
                    Ok(_) => t.jobs += 1,
                    Err(e) => t.error(e),
                }
            }
            t
        }));
    }
    let mut consumers = Vec::new();
    for i in 0..half {
        let (mut conn, qpath) = (ctx.conn(i + half)?, ctx.queue_path(queue));
        consumers.push(tokio::spawn(async move {
            let mut t = Tally::default();
            while Instant::now() < deadline {
                match reserve(&mut conn, &qpath).await {
                    Ok(Some((id, _, due))) => {
                        t.samples.record(wall_ms() - due);
                        match ack(&mut conn, &qpath, &id, None).await {
                            Ok(()) => t.jobs += 1,
                            Err(e) => t.error(e),
                        }
                    }
                    Ok(None) => {}
                    Err(e) => t.error(e),
                }
            }
            t
        }));
    }
    let produced = join_all(producers).await?;
    let consumed = join_all(consumers).await?;
    let secs = start.elapsed().as_secs_f64();
    let mut row =
        Row::from_tally(&ctx.system, "lifecycle", consumed, secs, "wait (delivery − due)");
    row.errors += produced.errors;
    let published_per_s = produced.jobs as f64 / secs;
    row.extra.insert("published_per_s".into(), json!(published_per_s));
    if let Some(e) = produced.first_error {
        row.prefix_note(format!("first producer error: {e}"));
    }
    row.prefix_note(format!(
        "acked/s with {half} producers + {half} consumers; published {published_per_s:.0}/s"
    ));
    Ok(row)
}

/// Runs `op(i, intended_start)` for i in 0..n at `rate` per second, each in its own task, at
/// most `in_flight` at once; waits for all of them.
pub async fn open_loop<F, Fut>(rate: u64, n: u64, in_flight: usize, op: F) -> Result<()>
where
    F: Fn(u64, Instant) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(tokio::sync::Semaphore::new(in_flight));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(n as usize);
    for i in 0..n {
        let at = start + Duration::from_secs_f64(i as f64 / rate.max(1) as f64);
        tokio::time::sleep_until(at.into()).await;
        let permit = permits.clone().acquire_owned().await?;
        let fut = op(i, at);
        tasks.push(tokio::spawn(async move {
            fut.await;
            drop(permit);
        }));
    }
    for t in tasks {
        t.await?;
    }
    Ok(())
}

/// `publish-latency`: open-loop single publishes at a fixed offered rate; latency from each
/// request's intended send time.
pub async fn publish_latency(ctx: &Ctx) -> Result<Row> {
    let queue = "publish-latency";
    let rate = ctx.opts.latency_rate;
    let n = (rate as f64 * ctx.opts.latency_secs).round() as u64;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let start = Instant::now();
    let delay = ctx.opts.publish_delay_ms;
    open_loop(rate, n, 4096, |i, at| {
        let url = format!("{}?delay_ms={delay}", ctx.queue_url(i as usize, queue));
        let (http, tally) = (ctx.http.clone(), tally.clone());
        async move {
            let r = expect(http.put(&url).body(body()), StatusCode::CREATED).await;
            let ms = ms_since(at);
            if let Ok(mut t) = tally.lock() {
                match r {
                    Ok(_) => {
                        t.samples.record(ms);
                        t.jobs += 1;
                    }
                    Err(e) => t.error(e),
                }
            }
        }
    })
    .await?;
    let secs = start.elapsed().as_secs_f64();
    let tally = take(&tally);
    let mut row = Row::from_tally(&ctx.system, "publish-latency", tally, secs, "request");
    row.prefix_note(format!("open loop, offered {rate}/s"));
    row.extra.insert("offered_per_s".into(), json!(rate));
    Ok(row)
}

/// The tally out of a shared one, leaving it empty.
pub fn take(t: &Mutex<Tally>) -> Tally {
    t.lock().map(|mut t| std::mem::take(&mut *t)).unwrap_or_default()
}

/// Lateness histogram bucket upper bounds, ms (the first bucket is "early": below 0).
const LATENESS_BUCKETS_MS: [f64; 11] =
    [0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0];

/// `(label, count)` pairs of a lateness histogram. Bounds are met to the recorder's precision
/// (3 significant digits: exact up to 2 ms, within 0.1 % above).
pub fn lateness_histogram(samples: &MillisRecorder) -> Vec<(String, u64)> {
    let mut counts = vec![samples.below_zero()];
    for w in LATENESS_BUCKETS_MS.windows(2) {
        counts.push(samples.count_between(w[0], w[1]));
    }
    // Early deliveries were recorded as 0, in the first bucket from 0: they count as early.
    counts[1] = counts[1].saturating_sub(samples.below_zero());
    counts
        .push(samples.count_between(LATENESS_BUCKETS_MS[LATENESS_BUCKETS_MS.len() - 1], f64::MAX));
    let mut labels = vec!["early".to_string()];
    for w in LATENESS_BUCKETS_MS.windows(2) {
        labels.push(format!("{}–{}", w[0], w[1]));
    }
    labels.push(format!("≥{}", LATENESS_BUCKETS_MS[LATENESS_BUCKETS_MS.len() - 1]));
    labels.into_iter().zip(counts).collect()
}

/// `timer`: jobs come due at a steady rate over the next seconds, each published `lead` ms
/// before its due time; consumers long-poll; lateness = delivery wall time − server's due
/// time. Early deliveries are counted (must be 0).
pub async fn timer(ctx: &Ctx, ack_first: bool, count: usize) -> Result<Row> {
    let workload = match (ack_first, count) {
        (false, _) => "timer",
        (true, 1) => "timer-ackfirst",
        (true, _) => "timer-count10-ackfirst",
    };
    let queue = workload;
    let rate = ctx.opts.timer_rate;
    let n = (rate as f64 * ctx.opts.timer_secs).round() as u64;
    let lead_ms = ctx.opts.timer_lead_ms;
    let wall0 = wall_ms() + lead_ms as f64;
    let received = Arc::new(AtomicU64::new(0));
    let published = Arc::new(AtomicU64::new(0));
    let publishing = Arc::new(AtomicU64::new(1));
    // Consumers stop when everything published has come out, or well after the last due time.
    let deadline = Instant::now()
        + Duration::from_millis(lead_ms)
        + Duration::from_secs_f64(ctx.opts.timer_secs)
        + Duration::from_secs(15);
    let mut consumers = Vec::new();
    for i in 0..ctx.opts.clients {
        let (mut conn, qpath) = (ctx.conn(i)?, ctx.queue_path(queue));
        let (received, published, publishing) =
            (received.clone(), published.clone(), publishing.clone());
        consumers.push(tokio::spawn(async move {
            let mut t = Tally::default();
            // With `ack_first`, the jobs held since the last reserve, acked by the next one.
            let mut held: Vec<(String, String)> = Vec::new();
            loop {
                let done = publishing.load(Ordering::Acquire) == 0
                    && received.load(Ordering::Relaxed) >= published.load(Ordering::Relaxed);
                if done || Instant::now() > deadline {
                    for (id, lease) in held.drain(..) {
                        match ack(&mut conn, &qpath, &id, Some(&lease)).await {
                            Ok(()) => t.jobs += 1,
                            Err(e) => t.error(e),
                        }
                    }
                    return t;
                }
                let got = if ack_first {
                    let sent = std::mem::take(&mut held);
                    let got = reserve_acking(&mut conn, &qpath, count, &sent, POLL_S).await;
                    if let Ok((n, _)) = &got {
                        // The acks that took count; the jobs handed out are taken either way.
                        t.jobs += *n as u64;
                        if *n < sent.len() {
                            let failed = sent.len() - n;
                            t.error(anyhow::anyhow!(
                                "{failed} of the {} acks carried by a reserve failed",
                                sent.len()
                            ));
                        }
                    }
                    got.map(|(_, jobs)| jobs)
                } else {
                    reserve(&mut conn, &qpath).await.map(|got| got.into_iter().collect())
                };
                match got {
                    Ok(jobs) => {
                        for (id, lease, due) in jobs {
                            let late = wall_ms() - due;
                            t.samples.record(late);
                            t.due_lateness.push((due - wall0, late));
                            received.fetch_add(1, Ordering::Relaxed);
                            if ack_first {
                                held.push((id, lease));
                            } else {
                                match ack(&mut conn, &qpath, &id, None).await {
                                    Ok(()) => t.jobs += 1,
                                    Err(e) => t.error(e),
                                }
                            }
                        }
                    }
                    Err(e) => t.error(e),
                }
            }
        }));
    }
    let late_publishes = Arc::new(AtomicU64::new(0));
    let pub_errors = Arc::new(Mutex::new(Tally::default()));
    // Publishing runs `lead` ahead of the due times: job i is sent at (its due − lead).
    open_loop(rate, n, 4096, |i, _| {
        let due = wall0 + i as f64 * 1000.0 / rate.max(1) as f64;
        let (http, qurl) = (ctx.http.clone(), ctx.queue_url(i as usize, queue));
        let (published, late, errs) =
            (published.clone(), late_publishes.clone(), pub_errors.clone());
        async move {
            let delay = due - wall_ms();
            if delay < 0.0 {
                late.fetch_add(1, Ordering::Relaxed);
            }
            let url = format!("{qurl}?delay_ms={}", delay.max(0.0).round() as u64);
            match expect(http.put(&url).body(body()), StatusCode::CREATED).await {
                Ok(_) => {
                    published.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    if let Ok(mut t) = errs.lock() {
                        t.error(e);
                    }
                }
            }
        }
    })
    .await?;
    publishing.store(0, Ordering::Release);
    let consumed = join_all(consumers).await?;
    let published = published.load(Ordering::Relaxed);
    let late = late_publishes.load(Ordering::Relaxed);
    let pub_errors = take(&pub_errors);
    Ok(timer_row(
        &ctx.system,
        workload,
        &ctx.opts,
        wall0,
        consumed,
        published,
        late,
        pub_errors,
        "",
    ))
}

/// The row of a timer run (delayd's or a peer's): lateness percentiles and histogram, early
/// deliveries, and what was published. `how` describes the peer's way of delaying, in the
/// note.
/// `wall0` is the first job's due time (Unix ms), which the deliveries' due times in
/// `consumed` count from; with `--timer-trace` the deliveries are also written to a file.
#[allow(clippy::too_many_arguments)]
pub fn timer_row(
    system: &str,
    workload: &str,
    opts: &Opts,
    wall0: f64,
    consumed: Tally,
    published: u64,
    late: u64,
    pub_errors: Tally,
    how: &str,
) -> Row {
    let hist = lateness_histogram(&consumed.samples);
    let by_second = lateness_by_due_second(&consumed.due_lateness);
    if let Some(dir) = &opts.timer_trace {
        match write_timer_trace(dir, system, workload, wall0, &consumed.due_lateness) {
            Ok(path) => {
                eprintln!("  {system} {workload}: deliveries written to {}", path.display())
            }
            Err(e) => eprintln!("  {system} {workload}: cannot write the timer trace: {e:#}"),
        }
    }
    let (early, delivered) = (consumed.samples.below_zero(), consumed.samples.len());
    let mut row =
        Row::from_tally(system, workload, consumed, opts.timer_secs, "lateness (delivery − due)");
    row.jobs_per_s = Some(row.jobs as f64 / opts.timer_secs);
    row.early = Some(early);
    row.errors += pub_errors.errors;
    let missing = published.saturating_sub(row.jobs);
    row.prefix_note(format!(
        "{}/s due over {}s, published {} ms ahead{how}; {published} published, {} delivered{}{}",
        opts.timer_rate,
        opts.timer_secs,
        opts.timer_lead_ms,
        delivered,
        if missing > 0 { format!(", {missing} missing") } else { String::new() },
        if late > 0 { format!(", {late} published after their due time") } else { String::new() }
    ));
    row.extra.insert("published".into(), json!(published));
    row.extra.insert("published_late".into(), json!(late));
    let hist: Vec<Value> = hist
        .into_iter()
        .map(|(label, count)| json!({"bucket_ms": label, "count": count}))
        .collect();
    row.extra.insert("lateness_histogram".into(), Value::Array(hist));
    if !by_second.is_empty() {
        let p99s: Vec<String> = by_second.iter().map(|s| format!("{:.0}", s.p99)).collect();
        eprintln!("  {system} {workload}: p99 lateness (ms) by due second: {}", p99s.join(" "));
        row.extra.insert("lateness_by_due_second".into(), json!(by_second));
    }
    if missing > 0 || early > 0 {
        row.status = Status::Failed;
    }
    row
}

/// Writes `due_unix_ms,lateness_ms` for every delivery, ordered by due time, into a file
/// named after the run's first due time, the system and the workload; returns its path.
fn write_timer_trace(
    dir: &std::path::Path,
    system: &str,
    workload: &str,
    wall0: f64,
    pairs: &[(f64, f64)],
) -> Result<std::path::PathBuf> {
    use std::fmt::Write as _;
    let name: String = format!("{wall0:.0}-{system}-{workload}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
        .collect();
    let mut sorted = pairs.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut csv = String::from("due_unix_ms,lateness_ms\n");
    for (due, late) in sorted {
        let _ = writeln!(csv, "{:.1},{late:.2}", wall0 + due);
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{name}.csv"));
    std::fs::write(&path, csv).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Lateness percentiles of the jobs due in one second of a timer run.
#[derive(Debug, Clone, Serialize)]
pub struct SecondLateness {
    /// Seconds after the first job's due time.
    pub second: u64,
    /// Jobs due in that second.
    pub n: u64,
    /// Median lateness, ms.
    pub p50: f64,
    /// 99th percentile lateness, ms.
    pub p99: f64,
    /// Largest lateness, ms.
    pub max: f64,
}

/// Lateness per second of due time, from `(due offset ms, lateness ms)` pairs: whether a
/// run's tail is one stall, a slow start or a steady backlog.
pub fn lateness_by_due_second(pairs: &[(f64, f64)]) -> Vec<SecondLateness> {
    let mut seconds: BTreeMap<u64, MillisRecorder> = BTreeMap::new();
    for &(due, late) in pairs {
        seconds.entry((due.max(0.0) / 1000.0) as u64).or_default().record(late);
    }
    seconds
        .into_iter()
        .filter_map(|(second, rec)| {
            let s = rec.summary()?;
            Some(SecondLateness { second, n: s.count, p50: s.p50, p99: s.p99, max: s.max })
        })
        .collect()
}

/// `failover`: light publish load through every node; `kill -9` the leader; time until the
/// first publish *sent after the kill* succeeds through a surviving node. The killed node is
/// then restarted and caught up so later workloads see the full cluster again.
pub async fn failover(ctx: &Ctx, cluster: &mut Cluster) -> Result<Row> {
    if !cluster.is_local() || cluster.urls.len() < 3 {
        let mut row = Row::new(&ctx.system, "failover", Status::Skipped);
        row.note = "needs a cluster of ≥ 3 nodes started by the bench".into();
        return Ok(row);
    }
    let queue = "failover";
    let leader = cluster.wait_leader(Duration::from_secs(30)).await?;
    // Short timeouts: a request to the dead node fails at once, one stuck behind the
    // election is abandoned and retried rather than holding a publisher.
    let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
    let stop = Arc::new(AtomicU64::new(0));
    let killed_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let first_ok_after: Arc<Mutex<Option<f64>>> = Arc::new(Mutex::new(None));
    let publishers = 4usize;
    let pause = Duration::from_secs_f64(publishers as f64 / ctx.opts.failover_rate.max(1) as f64);
    let mut tasks = Vec::new();
    // Every node, even with the clients steered to the leader (`--via-leader`): steered, they
    // would all send to the node that is killed, and no publish could succeed after it.
    let path = ctx.queue_path(queue);
    let urls: Vec<String> = cluster.urls.iter().map(|u| format!("{u}{path}")).collect();
    for p in 0..publishers {
        let urls = urls.clone();
        let (http, stop, killed_at, first) =
            (http.clone(), stop.clone(), killed_at.clone(), first_ok_after.clone());
        let delay = ctx.opts.publish_delay_ms;
        tasks.push(tokio::spawn(async move {
            let mut t = Tally::default();
            let mut k = p;
            while stop.load(Ordering::Relaxed) == 0 {
                let url = format!("{}?delay_ms={delay}", urls[k % urls.len()]);
                k += 1;
                let sent = Instant::now();
                let r = expect(http.put(&url).body(body()), StatusCode::CREATED).await;
                match r {
                    Ok(_) => {
                        t.jobs += 1;
                        let kill = killed_at.lock().ok().and_then(|k| *k);
                        if let (Some(kill), Ok(mut first)) = (kill, first.lock()) {
                            if sent >= kill && first.is_none() {
                                *first = Some(ms_since(kill));
                            }
                        }
                    }
                    Err(e) => t.error(e),
                }
                tokio::time::sleep(pause).await;
            }
            t
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.kill9(leader)?;
    let kill = Instant::now();
    if let Ok(mut k) = killed_at.lock() {
        *k = Some(kill);
    }
    let new_leader = cluster.wait_new_leader(Some(leader), Duration::from_secs(30)).await;
    let election_ms = ms_since(kill);
    let wait_deadline = Instant::now() + Duration::from_secs(30);
    while first_ok_after.lock().map(|f| f.is_none()).unwrap_or(false)
        && Instant::now() < wait_deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(1, Ordering::Relaxed);
    let tally = join_all(tasks).await?;
    let first = first_ok_after.lock().ok().and_then(|f| *f);
    let mut row = Row::new(&ctx.system, "failover", Status::Ok);
    row.jobs = tally.jobs;
    row.errors = tally.errors;
    row.extra.insert("killed_leader".into(), json!(leader));
    row.extra.insert("first_publish_after_kill_ms".into(), json!(first));
    match (&new_leader, first) {
        (Ok(new), Some(ms)) => {
            row.latency_ms = Some(Percentiles { n: 1, p50: ms, p99: ms, p999: ms, max: ms });
            row.latency_of = "kill → first publish ok";
            row.extra.insert("new_leader".into(), json!(new));
            row.extra.insert("leader_agreed_ms".into(), json!(election_ms));
            row.note = format!(
                "killed leader {leader}; first publish ok {ms:.0} ms after; all nodes agreed on \
                 leader {new} after {election_ms:.0} ms; {} failed requests during",
                tally.errors
            );
        }
        _ => {
            row.status = Status::Failed;
            row.note = format!(
                "killed leader {leader}; no successful publish within 30 s ({:?}; {:?})",
                new_leader.as_ref().err(),
                tally.first_error
            );
        }
    }
    cluster.restart(leader).await.context("restart the killed leader")?;
    Ok(row)
}

/// `storage`: bulk-publish delayed jobs (delay 1 day) up to each cumulative count, let the
/// followers catch up, then read RSS and disk per node. One row per step; the last row
/// carries the RSS growth from the first step.
pub async fn storage(ctx: &Ctx, cluster: &mut Cluster) -> Result<Vec<Row>> {
    if !cluster.is_local() {
        let mut row = Row::new(&ctx.system, "storage", Status::Skipped);
        row.note = "needs processes started by the bench (reads /proc and the data dirs)".into();
        return Ok(vec![row]);
    }
    let queue = "storage";
    let day_ms = 86_400_000;
    let mut stored = 0u64;
    let mut rows = Vec::new();
    let mut first_rss: Vec<(u64, Option<u64>)> = Vec::new();
    for &target in &ctx.opts.storage_jobs {
        let more = target.saturating_sub(stored).div_ceil(BULK_JOBS as u64) * BULK_JOBS as u64;
        let budget = Budget::new(Some(more), 24.0 * 3600.0);
        let bar = progress::jobs(format!("storage: {stored} → {target}"), more);
        // ttl 0 (never): a ttl equal to the delay would expire each job as it comes due.
        let (tally, secs) = publish_loop(ctx, queue, budget, true, day_ms, "0", Some(&bar)).await?;
        drop(bar);
        stored += tally.jobs;
        if tally.errors > 0 {
            bail!("storage: {} failed bulk publishes: {:?}", tally.errors, tally.first_error);
        }
        let catching_up = progress::phase(format!("storage: followers applying {stored} jobs"));
        let leader = cluster.wait_leader(Duration::from_secs(30)).await?;
        cluster.wait_applied(leader, Duration::from_secs(300)).await?;
        drop(catching_up);
        let name = format!("storage {target}");
        let mut row = Row::from_tally(&ctx.system, &name, tally, secs, "bulk request");
        let feet = cluster.footprint();
        // The disk again once the flushes and compactions are done: a reading taken while they
        // run moves by hundreds of MB within seconds, as a compaction holds its input and its
        // output at once. The next step starts after this wait.
        let settling = progress::phase(format!("storage: compactions settling at {stored} jobs"));
        let settled = ctx.settle().await;
        let settled_disk: Vec<Option<u64>> = match settled {
            settle::Settled::Done(_) => {
                let now = cluster.footprint();
                feet.iter()
                    .map(|(id, ..)| now.iter().find(|(n, ..)| n == id).map(|(.., d)| *d))
                    .collect()
            }
            settle::Settled::TimedOut(_) | settle::Settled::Unknown => vec![None; feet.len()],
        };
        drop(settling);
        let mb = |b: u64| b as f64 / 1e6;
        let mut parts = Vec::new();
        let mut nodes = Vec::new();
        for ((id, rss, disk), settled) in feet.iter().zip(&settled_disk) {
            let rss_txt = rss.map_or("?".to_string(), |r| format!("{:.0}", mb(r)));
            let settled_txt = settled.map_or(String::new(), |d| format!(" ({:.0} settled)", mb(d)));
            parts.push(format!("n{id} RSS {rss_txt} MB disk {:.0}{settled_txt} MB", mb(*disk)));
            nodes.push(json!({
                "node": id, "rss_bytes": rss, "disk_bytes": disk, "settled_disk_bytes": settled
            }));
        }
        row.extra.insert("stored_jobs".into(), json!(stored));
        row.extra.insert("nodes".into(), Value::Array(nodes));
        let mut note = format!("{stored} stored (publish rate shown): {}", parts.join(", "));
        if let Some(text) = settled.timed_out_note("flushes and compactions (no settled disk)") {
            note.push_str(&format!("; {text}"));
        }
        if first_rss.is_empty() {
            first_rss = feet.iter().map(|(id, rss, _)| (*id, *rss)).collect();
        } else {
            let mut growth = Vec::new();
            for ((id, rss, _), (_, rss0)) in feet.iter().zip(&first_rss) {
                let g = match (rss, rss0) {
                    (Some(a), Some(b)) => Some(*a as i64 - *b as i64),
                    _ => None,
                };
                growth.push(json!({"node": id, "rss_growth_bytes": g}));
                if let Some(g) = g {
                    note.push_str(&format!("; n{id} RSS growth {:+.0} MB", g as f64 / 1e6));
                }
            }
            row.extra.insert("rss_growth_since_first_step".into(), Value::Array(growth));
        }
        row.note = note;
        rows.push(row);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timer_trace_lists_every_delivery_by_due_time() {
        let dir = tempfile::tempdir().expect("dir");
        let pairs = [(2.5, 7.0), (0.0, 1.25), (1.0, -0.5)];
        let path = write_timer_trace(dir.path(), "delayd 3 nodes (auth)", "timer", 1_000.0, &pairs)
            .expect("trace");
        assert_eq!(
            path.file_name().and_then(|n| n.to_str()),
            Some("1000-delayd_3_nodes__auth_-timer.csv")
        );
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text, "due_unix_ms,lateness_ms\n1000.0,1.25\n1001.0,-0.50\n1002.5,7.00\n");
    }

    #[test]
    fn lateness_is_summarised_per_second_of_due_time() {
        // Second 0: three on time and one 200 ms late; second 2: one job; none due in 1.
        let pairs = [(0.0, 1.0), (10.0, 2.0), (999.0, 3.0), (500.0, 200.0), (2_500.0, 7.0)];
        let by = lateness_by_due_second(&pairs);
        let got: Vec<(u64, u64, f64)> = by.iter().map(|s| (s.second, s.n, s.max)).collect();
        assert_eq!(got, [(0, 4, 200.0), (2, 1, 7.0)]);
        assert_eq!(by[0].p50, 2.0);
        assert!(lateness_by_due_second(&[]).is_empty());
    }

    #[test]
    fn lateness_histogram_counts_early_apart_and_buckets_the_rest() {
        let mut m = MillisRecorder::new();
        for ms in [-2.0, -0.001, 0.0, 0.5, 0.999, 1.0, 4.0, 999.0, 1000.0, 60_000.0] {
            m.record(ms);
        }
        let hist = lateness_histogram(&m);
        let counts: Vec<(&str, u64)> = hist.iter().map(|(l, c)| (l.as_str(), *c)).collect();
        assert_eq!(
            counts,
            [
                ("early", 2),
                ("0–1", 3),
                ("1–2", 1),
                ("2–5", 1),
                ("5–10", 0),
                ("10–20", 0),
                ("20–50", 0),
                ("50–100", 0),
                ("100–200", 0),
                ("200–500", 0),
                ("500–1000", 1),
                ("≥1000", 2),
            ]
        );
        assert_eq!(counts.iter().map(|c| c.1).sum::<u64>(), m.len());
    }
}
