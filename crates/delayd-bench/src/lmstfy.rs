//! lmstfy's Redis data path side by side: the bench starts its own `redis-server` and issues
//! the Redis commands that lmstfy's Redis engine issues for each API call, with the same round
//! trips, so delayd can be compared with the store lmstfy keeps its jobs in.
//!
//! Keys, per namespace `ns` and queue `q`: the job body at `j/{ns}/{q}/{id}` (a string with
//! the job's TTL as its expiry), the ready list `q/{ns}/{q}` (entries `{tries}/{id}`), the
//! dead-letter list `d/{ns}/{q}`, and one timer sorted set for everything, scored by due
//! time in whole unix seconds (members `{ns}/{q}/{tries}/{id}`, so the pump can route them).
//!
//! - publish: `SET j/… body EX ttl NX`, then `LPUSH` onto the ready list for delay 0, else
//!   `ZADD` onto the timer at now + delay: two round trips.
//! - reserve: `BRPOP` the ready list, `ZADD` the job back onto the timer at now + ttr with one
//!   try fewer (it comes back, or goes to the dead letters, unless acked by then), then `GET`
//!   and `TTL` of the body in one pipeline: three round trips. ack: `DEL` of the body.
//! - the pump: once a second a Lua script moves due timer members (score ≤ now) whose body
//!   still exists to their ready list, or to the dead letters when no try is left, 100 at a
//!   time, looping while a batch comes back full. Members whose body is gone (acked or
//!   expired) are dropped.
//!
//! Durability as for every system here: AOF with `appendfsync always`, so each write is
//! fsynced before it is answered (Redis groups the writes of one event-loop turn into one
//! fsync). Each concurrent client has its own connection, as lmstfy's pool would give it.
//!
//! **This is an upper bound for lmstfy, not lmstfy**: there is no HTTP layer (lmstfy's clients
//! speak HTTP to lmstfy, which then speaks to Redis), no auth, no metrics, and the pump runs
//! in the bench's process. Real lmstfy can only be slower and use more CPU per job; its server
//! CPU here is redis-server's alone.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use delayd_percentiles::MillisRecorder;
use redis::aio::MultiplexedConnection;
use serde_json::json;

use crate::cluster::{free_ports, Proc};
use crate::settle;
use crate::stats::{join_all, ms_since, wall_ms, Budget, CpuMeter, Percentiles, Row, Tally};
use crate::workloads::{drain_row, open_loop, take, timer_row, Drainer, Opts, BODY_BYTES};

/// The system's label in tables.
pub const SYSTEM: &str = "lmstfy-redis (appendfsync always)";
/// The namespace of every job.
const NS: &str = "bench";
/// The timer's sorted set.
const TIMER_KEY: &str = "timer";
/// Time-to-live of every job, s: lmstfy's bodies always carry an expiry; a day outlives any
/// run (and the publish workloads' one-hour delay).
const TTL_S: u64 = 86_400;
/// Time-to-run of a reserved job, s (the same as delayd's `ttr=30`).
const TTR_S: u64 = 30;
/// Tries of a new job: lmstfy's default, one delivery.
const TRIES: u32 = 1;
/// A reserve's `BRPOP` waits this long (s) before answering "no job".
const POLL_S: u64 = 1;
/// Timer members the pump moves per script run.
const PUMP_BATCH: u64 = 100;
/// Jobs per pipeline while preloading (not measured).
const PRELOAD_PIPELINE: u64 = 64;

/// The pump's script: moves up to `ARGV[2]` members of the timer (`KEYS[1]`) due at or
/// before `ARGV[1]` (unix s) and returns how many it looked at.
const PUMP_LUA: &str = r"
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local ns, q, tries, id = string.match(member, '^([^/]+)/([^/]+)/(%d+)/(.+)$')
  if ns and redis.call('EXISTS', 'j/' .. ns .. '/' .. q .. '/' .. id) == 1 then
    if tonumber(tries) > 0 then
      redis.call('LPUSH', 'q/' .. ns .. '/' .. q, tries .. '/' .. id)
    else
      redis.call('LPUSH', 'd/' .. ns .. '/' .. q, id)
    end
  end
end
if #due > 0 then
  redis.call('ZREM', KEYS[1], unpack(due))
end
return #due
";

/// The redis-server binary on `PATH`, if any.
pub fn find_binary() -> Option<PathBuf> {
    crate::cluster::on_path("redis-server")
}

/// A redis-server process the bench started (killed on drop), with lmstfy's timer pump.
pub struct Server {
    client: redis::Client,
    pump: tokio::task::JoinHandle<()>,
    // Dropping the server kills the process, then removes its directory.
    proc: Proc,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

impl Server {
    /// Starts `bin` on a fresh port and directory with fsync on every write, waits until it
    /// answers, and starts the pump.
    pub async fn start(bin: &Path) -> Result<Server> {
        let dir = tempfile::Builder::new().prefix("delayd-bench-redis-").tempdir()?;
        let port = free_ports(1)?[0];
        let args: Vec<String> = [
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--dir",
            &dir.path().display().to_string(),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            // No RDB snapshots: the AOF is the durability, as lmstfy's deployments run it.
            "--save",
            "",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut proc = Proc::spawn(bin, &args, &dir.path().join("redis.log"))?;
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ping = async {
                let mut con = client.get_multiplexed_async_connection().await?;
                redis::cmd("PING").query_async::<String>(&mut con).await
            };
            if ping.await.is_ok() {
                break;
            }
            proc.check_alive()?;
            if Instant::now() > deadline {
                bail!("redis-server did not answer on port {port} within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let con = client.get_multiplexed_async_connection().await?;
        let pump = tokio::spawn(pump(con));
        Ok(Server { client, pump, proc, _dir: dir })
    }

    /// The process id, for its CPU time.
    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }

    /// Whether Redis is still doing work that writes left behind: an AOF rewrite (or an RDB
    /// save) running in a child process or scheduled (`INFO persistence`). Redis starts one
    /// on its own once the AOF has doubled since the last (`auto-aof-rewrite-percentage`).
    pub async fn rewriting(&self) -> Result<Option<bool>> {
        let ask = async {
            let mut con = self.connect().await?;
            let info: String = redis::cmd("INFO").arg("persistence").query_async(&mut con).await?;
            Ok::<_, anyhow::Error>(Some(rewriting(&info)))
        };
        tokio::time::timeout(INFO_TIMEOUT, ask)
            .await
            .with_context(|| format!("INFO persistence not answered within {INFO_TIMEOUT:?}"))?
    }

    /// A connection of its own (a new TCP connection each call).
    async fn connect(&self) -> Result<MultiplexedConnection> {
        Ok(self.client.get_multiplexed_async_connection().await?)
    }

    /// `n` connections.
    async fn connect_n(&self, n: usize) -> Result<Vec<MultiplexedConnection>> {
        let mut conns = Vec::with_capacity(n);
        for _ in 0..n {
            conns.push(self.connect().await?);
        }
        Ok(conns)
    }
}

/// How long the bench waits for an answer to `INFO persistence`.
const INFO_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether an `INFO persistence` answer shows a child process at work or one scheduled.
fn rewriting(info: &str) -> bool {
    const BUSY: [&str; 3] =
        ["aof_rewrite_in_progress:1", "aof_rewrite_scheduled:1", "rdb_bgsave_in_progress:1"];
    info.lines().map(str::trim).any(|line| BUSY.contains(&line))
}

/// Runs the timer pump once a second until aborted, as lmstfy's timer does.
async fn pump(mut con: MultiplexedConnection) {
    let script = redis::Script::new(PUMP_LUA);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reported = false;
    loop {
        tick.tick().await;
        loop {
            let moved = script
                .key(TIMER_KEY)
                .arg(now_s())
                .arg(PUMP_BATCH)
                .invoke_async::<u64>(&mut con)
                .await;
            match moved {
                // A full batch: more may be due at once.
                Ok(n) if n >= PUMP_BATCH => continue,
                Ok(_) => break,
                Err(e) => {
                    // The timer workload then reports the jobs it misses.
                    if !reported {
                        crate::progress::eprintln(&format!("delayd-bench: lmstfy-redis pump: {e}"));
                        reported = true;
                    }
                    break;
                }
            }
        }
    }
}

/// Unix time in whole seconds: lmstfy's timer scores.
fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A fresh job id, as long as lmstfy's (a ULID's 26 characters).
fn new_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{:026x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn body_key(q: &str, id: &str) -> String {
    format!("j/{NS}/{q}/{id}")
}

fn ready_key(q: &str) -> String {
    format!("q/{NS}/{q}")
}

fn timer_member(q: &str, tries: u32, id: &str) -> String {
    format!("{NS}/{q}/{tries}/{id}")
}

/// A 100-byte body that starts with the given figures (times in ms), so that a consumer can
/// tell when its job was due.
fn stamped_body(figures: &[f64]) -> Vec<u8> {
    let mut b: Vec<u8> =
        figures.iter().map(|f| format!("{f:.3} ")).collect::<String>().into_bytes();
    b.resize(BODY_BYTES.max(b.len()), b'x');
    b
}

/// The `i`th figure a [`stamped_body`] starts with.
fn stamp(body: &[u8], i: usize) -> Option<f64> {
    std::str::from_utf8(body).ok()?.split(' ').nth(i)?.parse().ok()
}

/// lmstfy's publish of job `id`: the body, then the ready list (`due_s` is `None`) or the
/// timer at `due_s`, which lmstfy computes as now + delay in whole seconds.
async fn publish_job(
    con: &mut MultiplexedConnection,
    q: &str,
    id: &str,
    body: &[u8],
    due_s: Option<u64>,
) -> Result<()> {
    let set: Option<String> = redis::cmd("SET")
        .arg(body_key(q, id))
        .arg(body)
        .arg("EX")
        .arg(TTL_S)
        .arg("NX")
        .query_async(con)
        .await?;
    if set.is_none() {
        bail!("job {id} exists already");
    }
    match due_s {
        None => {
            let entry = format!("{TRIES}/{id}");
            redis::cmd("LPUSH").arg(ready_key(q)).arg(entry).query_async::<()>(con).await?;
        }
        Some(due) => {
            let member = timer_member(q, TRIES, id);
            redis::cmd("ZADD").arg(TIMER_KEY).arg(due).arg(member).query_async::<()>(con).await?;
        }
    }
    Ok(())
}

/// lmstfy's reserve (consume) from queue `q`: the job's id and body, or `None` when nothing
/// came within the poll.
async fn reserve(con: &mut MultiplexedConnection, q: &str) -> Result<Option<(String, Vec<u8>)>> {
    loop {
        let popped: Option<(String, String)> =
            redis::cmd("BRPOP").arg(ready_key(q)).arg(POLL_S).query_async(con).await?;
        let Some((_, entry)) = popped else { return Ok(None) };
        let (tries, id) = entry.split_once('/').context("ready entry without tries")?;
        let tries: u32 = tries.parse().context("ready entry's tries")?;
        // Back onto the timer first: should this consumer die, the job comes back after ttr.
        let member = timer_member(q, tries.saturating_sub(1), id);
        let due = now_s() + TTR_S;
        redis::cmd("ZADD").arg(TIMER_KEY).arg(due).arg(member).query_async::<()>(con).await?;
        let key = body_key(q, id);
        let (body, _ttl): (Option<Vec<u8>>, i64) =
            redis::pipe().cmd("GET").arg(&key).cmd("TTL").arg(&key).query_async(con).await?;
        // A body gone since (acked or expired) leaves a stale entry: lmstfy takes the next.
        if let Some(body) = body {
            return Ok(Some((id.to_string(), body)));
        }
    }
}

/// lmstfy's ack (delete): the body goes; the timer member is dropped by the pump when due.
async fn ack(con: &mut MultiplexedConnection, q: &str, id: &str) -> Result<()> {
    redis::cmd("DEL").arg(body_key(q, id)).query_async::<()>(con).await?;
    Ok(())
}

/// `publish`: C connections each publishing one job at a time, delayed as delayd's publish
/// workloads are (so they never come due).
pub async fn publish(server: &Server, opts: &Opts) -> Result<Row> {
    let budget = Budget::new(opts.jobs, opts.secs);
    let delay_s = opts.publish_delay_ms / 1000;
    let conns = server.connect_n(opts.clients).await?;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for mut con in conns {
        let budget = budget.clone();
        tasks.push(tokio::spawn(async move {
            let mut t = Tally::default();
            let data = stamped_body(&[]);
            while budget.take(1) {
                let t0 = Instant::now();
                let due = (delay_s > 0).then(|| now_s() + delay_s);
                match publish_job(&mut con, "publish", &new_id(), &data, due).await {
                    Ok(()) => {
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
    let mut row = Row::from_tally(SYSTEM, "publish", tally, secs, "SET NX + ZADD");
    row.prefix_note(format!("2 round trips, delay {delay_s} s"));
    Ok(row)
}

/// `drain`: preload ready jobs (pipelined, not measured), then C consumers reserve + ack
/// (four round trips) until all are gone.
pub async fn drain(server: &Server, opts: &Opts, cpu: &CpuMeter) -> Result<Row> {
    let total = opts.drain_jobs;
    let q = format!("drain-c{}", opts.clients);
    let loaders = opts.clients.clamp(1, 8) as u64;
    let mut tasks = Vec::new();
    for l in 0..loaders {
        let mut con = server.connect().await?;
        let q = q.clone();
        let mine = total / loaders + u64::from(l < total % loaders);
        tasks.push(tokio::spawn(async move {
            let data = stamped_body(&[]);
            let mut left = mine;
            while left > 0 {
                let n = left.min(PRELOAD_PIPELINE);
                let mut pipe = redis::pipe();
                for _ in 0..n {
                    let id = new_id();
                    let key = body_key(&q, &id);
                    pipe.cmd("SET").arg(key).arg(&data).arg("EX").arg(TTL_S).arg("NX").ignore();
                    pipe.cmd("LPUSH").arg(ready_key(&q)).arg(format!("{TRIES}/{id}")).ignore();
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
    // A rewrite the preload set off is not the drain's (delayd's drains wait the same way).
    let settled = settle::wait(|| server.rewriting()).await;
    cpu.restart();
    let conns = server.connect_n(opts.clients).await?;
    let acked = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for mut con in conns {
        let (acked, q) = (acked.clone(), q.clone());
        tasks.push(tokio::spawn(async move {
            let mut d = Drainer::new(acked, total, start);
            while d.more() {
                let t0 = Instant::now();
                let r = match reserve(&mut con, &q).await {
                    Ok(Some((id, _))) => ack(&mut con, &q, &id).await.map(|()| true),
                    Ok(None) => Ok(false),
                    Err(e) => Err(e),
                };
                // A failed command fails that command only: the connection goes on.
                d.record(t0, r);
            }
            d.finish()
        }));
    }
    settled.note_preload(
        drain_row(SYSTEM, "drain", "reserve+ack (4 round trips)", tasks, total, acked).await,
    )
}

/// `lifecycle`: C/2 producers (delay 0) and C/2 consumers (reserve + ack) for T seconds, as
/// delayd's; the latency is delivery − publish time, carried in the body.
pub async fn lifecycle(server: &Server, opts: &Opts) -> Result<Row> {
    let q = "lifecycle";
    let half = (opts.clients / 2).max(1);
    let budget = Budget::new(None, opts.lifecycle_secs);
    let deadline = Instant::now() + Duration::from_secs_f64(opts.lifecycle_secs);
    let start = Instant::now();
    let mut producers = Vec::new();
    for mut con in server.connect_n(half).await? {
        let budget = budget.clone();
        producers.push(tokio::spawn(async move {
            let mut t = Tally::default();
            while budget.take(1) {
                let data = stamped_body(&[wall_ms()]);
                match publish_job(&mut con, q, &new_id(), &data, None).await {
                    Ok(()) => t.jobs += 1,
                    Err(e) => t.error(e),
                }
            }
            t
        }));
    }
    let mut consumers = Vec::new();
    for mut con in server.connect_n(half).await? {
        consumers.push(tokio::spawn(async move {
            let mut t = Tally::default();
            while Instant::now() < deadline {
                match reserve(&mut con, q).await {
                    Ok(Some((id, body))) => {
                        if let Some(published) = stamp(&body, 0) {
                            t.samples.record(wall_ms() - published);
                        }
                        match ack(&mut con, q, &id).await {
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
    let mut row = Row::from_tally(SYSTEM, "lifecycle", consumed, secs, "wait (delivery − due)");
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

/// `timer`: as delayd's. Job i is meant to come due at a steady rate and is published `lead`
/// ms before; lmstfy takes a delay in whole seconds, so the publisher asks for the delay
/// rounded up, and the job's due time is the timer score lmstfy stores (now + delay, whole
/// seconds), which is what the pump honours. Lateness = delivery wall time − that due time,
/// as delayd's is measured from its own `due_at_ms`; the pump's one-second tick and the
/// whole-second scores show up in it. Lateness from the time the publisher meant is kept in
/// `extra` as well. Early deliveries are counted (must be 0).
pub async fn timer(server: &Server, opts: &Opts) -> Result<Row> {
    let q = "timer";
    let rate = opts.timer_rate;
    let n = (rate as f64 * opts.timer_secs).round() as u64;
    let lead_ms = opts.timer_lead_ms;
    let wall0 = wall_ms() + lead_ms as f64;
    let received = Arc::new(AtomicU64::new(0));
    let published = Arc::new(AtomicU64::new(0));
    let publishing = Arc::new(AtomicU64::new(1));
    let meant_lateness = Arc::new(Mutex::new(MillisRecorder::new()));
    let deadline = Instant::now()
        + Duration::from_millis(lead_ms)
        + Duration::from_secs_f64(opts.timer_secs)
        + Duration::from_secs(15);
    let mut consumers = Vec::new();
    for mut con in server.connect_n(opts.clients).await? {
        let (received, published, publishing) =
            (received.clone(), published.clone(), publishing.clone());
        let meant = meant_lateness.clone();
        consumers.push(tokio::spawn(async move {
            let mut t = Tally::default();
            let mut mine = MillisRecorder::new();
            loop {
                let done = publishing.load(Ordering::Acquire) == 0
                    && received.load(Ordering::Relaxed) >= published.load(Ordering::Relaxed);
                if done || Instant::now() > deadline {
                    break;
                }
                match reserve(&mut con, q).await {
                    Ok(Some((id, body))) => {
                        let now = wall_ms();
                        match (stamp(&body, 0), stamp(&body, 1)) {
                            (Some(due), Some(meant_due)) => {
                                t.samples.record(now - due);
                                t.due_lateness.push((due - wall0, now - due));
                                mine.record(now - meant_due);
                            }
                            _ => t.error("timer job without its due times"),
                        }
                        received.fetch_add(1, Ordering::Relaxed);
                        match ack(&mut con, q, &id).await {
                            Ok(()) => t.jobs += 1,
                            Err(e) => t.error(e),
                        }
                    }
                    Ok(None) => {}
                    Err(e) => t.error(e),
                }
            }
            if let Ok(mut m) = meant.lock() {
                m.merge(&mine);
            }
            t
        }));
    }
    // Publishers share a pool of C connections, each multiplexing the publishes given to it.
    let pool = server.connect_n(opts.clients.max(1)).await?;
    let late_publishes = Arc::new(AtomicU64::new(0));
    let pub_errors = Arc::new(Mutex::new(Tally::default()));
    open_loop(rate, n, 4096, |i, _| {
        let meant_due = wall0 + i as f64 * 1000.0 / rate.max(1) as f64;
        let mut con = pool[i as usize % pool.len()].clone();
        let (published, late, errs) =
            (published.clone(), late_publishes.clone(), pub_errors.clone());
        async move {
            let now = wall_ms();
            let ahead = meant_due - now;
            if ahead < 0.0 {
                late.fetch_add(1, Ordering::Relaxed);
            }
            let delay_s = (ahead / 1000.0).ceil().max(0.0) as u64;
            // The due time the job will be delivered against: the timer score, or now for a
            // delay of 0 (straight onto the ready list).
            let due_s = (delay_s > 0).then(|| now_s() + delay_s);
            let due_ms = due_s.map_or(now, |s| s as f64 * 1000.0);
            let data = stamped_body(&[due_ms, meant_due]);
            match publish_job(&mut con, q, &new_id(), &data, due_s).await {
                Ok(()) => {
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
    let how = " with whole-second delays";
    let mut row =
        timer_row(SYSTEM, "timer", opts, wall0, consumed, published, late, pub_errors, how);
    let meant = meant_lateness.lock().map(|mut m| std::mem::take(&mut *m)).unwrap_or_default();
    // Not an early delivery by lmstfy's own rules (the score is its due time), but what a
    // user asking for "in N seconds" sees: lmstfy truncates now to the second.
    let before_meant = meant.below_zero();
    let meant = Percentiles::of(&meant);
    if let Some(m) = meant {
        row.note.push_str(&format!(
            "; from the time meant: p50 {:.0} ms, max {:.0} ms, {before_meant} before it",
            m.p50, m.max
        ));
    }
    row.extra.insert("lateness_from_meant_due_ms".into(), json!(meant));
    row.extra.insert("before_meant_due".into(), json!(before_meant));
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewrite_running_or_scheduled_is_work_left_behind() {
        let info = "# Persistence\r\nloading:0\r\nrdb_bgsave_in_progress:0\r\n\
                    aof_enabled:1\r\naof_rewrite_in_progress:0\r\naof_rewrite_scheduled:0\r\n";
        assert!(!rewriting(info));
        assert!(rewriting(&info.replace("aof_rewrite_in_progress:0", "aof_rewrite_in_progress:1")));
        assert!(rewriting(&info.replace("aof_rewrite_scheduled:0", "aof_rewrite_scheduled:1")));
        assert!(rewriting(&info.replace("rdb_bgsave_in_progress:0", "rdb_bgsave_in_progress:1")));
    }

    #[test]
    fn bodies_carry_their_stamps_in_100_bytes() {
        let b = stamped_body(&[1_700_000_000_123.5, 42.0]);
        assert_eq!(b.len(), BODY_BYTES);
        assert_eq!(stamp(&b, 0), Some(1_700_000_000_123.5));
        assert_eq!(stamp(&b, 1), Some(42.0));
        assert_eq!(stamped_body(&[]).len(), BODY_BYTES);
        assert_eq!(stamp(&stamped_body(&[]), 0), None);
    }

    #[test]
    fn keys_route_a_timer_member_back_to_its_queue() {
        assert_eq!(body_key("q1", "abc"), "j/bench/q1/abc");
        assert_eq!(ready_key("q1"), "q/bench/q1");
        assert_eq!(timer_member("q1", 0, "abc"), "bench/q1/0/abc");
        assert_eq!(new_id().len(), 26);
    }
}
