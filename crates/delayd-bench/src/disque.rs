//! delayd through Disque's protocol (RESP2), with the `redis` crate's raw commands as Disque
//! clients send them: `disque-add` (ADDJOB, paired with the peers' publish) and
//! `disque-drain` (GETJOB + ACKJOB, paired with their drain). Client i talks to node
//! i mod n, as the HTTP workloads do.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use redis::aio::MultiplexedConnection;
use redis::Value;

use crate::stats::{join_all, ms_since, Budget, Row, Tally};
use crate::workloads::{drain_row, Ctx, Drainer, BODY_BYTES};

/// Jobs added per pipelined round while preloading a drain (not measured).
const PRELOAD_PIPELINE: u64 = 64;

/// One connection per client, spread over the nodes; authenticated when the cluster is.
async fn connect(ctx: &Ctx) -> Result<Vec<MultiplexedConnection>> {
    if ctx.disque.is_empty() {
        bail!("the Disque workloads need a cluster the bench started (--disque-addr on each node)");
    }
    let mut conns = Vec::with_capacity(ctx.opts.clients);
    for i in 0..ctx.opts.clients {
        let addr = &ctx.disque[i % ctx.disque.len()];
        let client = redis::Client::open(format!("redis://{addr}"))?;
        let mut con = client.get_multiplexed_async_connection().await?;
        if let Some(token) = ctx.token() {
            redis::cmd("AUTH").arg(token).query_async::<()>(&mut con).await?;
        }
        conns.push(con);
    }
    Ok(conns)
}

/// `ADDJOB queue body 0 [DELAY s]`: the job's id.
async fn addjob(
    con: &mut MultiplexedConnection,
    q: &str,
    body: &[u8],
    delay_s: u64,
) -> Result<String> {
    let mut cmd = redis::cmd("ADDJOB");
    cmd.arg(q).arg(body).arg(0);
    if delay_s > 0 {
        cmd.arg("DELAY").arg(delay_s);
    }
    Ok(cmd.query_async(con).await?)
}

/// `disque-add`: C clients each adding one job at a time, delayed as the publish workloads'.
pub async fn add(ctx: &Ctx) -> Result<Row> {
    let budget = Budget::new(ctx.opts.jobs, ctx.opts.secs);
    let delay_s = ctx.opts.publish_delay_ms / 1000;
    let conns = connect(ctx).await?;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for mut con in conns {
        let budget = budget.clone();
        tasks.push(tokio::spawn(async move {
            let mut t = Tally::default();
            let body = vec![b'x'; BODY_BYTES];
            while budget.take(1) {
                let t0 = Instant::now();
                match addjob(&mut con, "disque-add", &body, delay_s).await {
                    Ok(_) => {
                        t.samples.record(ms_since(t0));
                        t.jobs += 1;
                    }
                    Err(e) => t.error(e),
                }
            }
            t
        }));
    }
    let tally = join_all(tasks).await?;
    let secs = start.elapsed().as_secs_f64();
    let mut row = Row::from_tally(&ctx.system, "disque-add", tally, secs, "ADDJOB");
    row.prefix_note(format!("Disque protocol, 1 round trip, delay {delay_s} s"));
    Ok(row)
}

/// `disque-drain`: preload ready jobs (pipelined ADDJOBs, not measured), then C consumers
/// GETJOB NOHANG + ACKJOB until all are gone.
pub async fn drain(ctx: &Ctx) -> Result<Row> {
    let total = ctx.opts.drain_jobs;
    let q = format!("disque-drain-c{}", ctx.opts.clients);
    let mut loaders = connect(&ctx.with_clients(ctx.opts.clients.clamp(1, 8))).await?;
    let n_loaders = loaders.len() as u64;
    let mut tasks = Vec::new();
    for (l, mut con) in loaders.drain(..).enumerate() {
        let q = q.clone();
        let mine = total / n_loaders + u64::from((l as u64) < total % n_loaders);
        tasks.push(tokio::spawn(async move {
            let body = vec![b'x'; BODY_BYTES];
            let mut left = mine;
            while left > 0 {
                let n = left.min(PRELOAD_PIPELINE);
                let mut pipe = redis::pipe();
                for _ in 0..n {
                    pipe.cmd("ADDJOB").arg(&q).arg(&body).arg(0).ignore();
                }
                pipe.query_async::<()>(&mut con).await?;
                left -= n;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    // As the HTTP drains: the preload's flushes and compactions are not the drain's.
    let settled = ctx.settle().await;
    ctx.cpu.restart();
    let conns = connect(ctx).await?;
    let acked = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for mut con in conns {
        let (acked, q) = (acked.clone(), q.clone());
        tasks.push(tokio::spawn(async move {
            let mut d = Drainer::new(acked, total, start);
            while d.more() {
                let t0 = Instant::now();
                let r = async {
                    let got: Value = redis::cmd("GETJOB")
                        .arg("NOHANG")
                        .arg("FROM")
                        .arg(&q)
                        .query_async(&mut con)
                        .await?;
                    let Value::Array(jobs) = got else { return Ok(false) };
                    let job: Vec<Value> = redis::from_redis_value(jobs.first().context("a job")?)?;
                    let id: String = redis::from_redis_value(job.get(1).context("its id")?)?;
                    redis::cmd("ACKJOB").arg(id).query_async::<i64>(&mut con).await?;
                    Ok(true)
                };
                d.record(t0, r.await);
            }
            d.finish()
        }));
    }
    let latency_of = "GETJOB+ACKJOB (2 round trips)";
    settled
        .note_preload(drain_row(&ctx.system, "disque-drain", latency_of, tasks, total, acked).await)
}
