//! Failover measurement: how long a three-node cluster stops taking writes when its leader
//! dies or stops, whether a paused or partitioned follower disturbs the leader, and whether
//! anything acknowledged is lost — all measured from outside, against real processes.
//!
//! Each trial of a [`Scenario`] starts a fresh cluster on a [`crate::backend`] (the nodes'
//! in-memory Raft state would otherwise carry over and bias the next trial; see
//! [`Options::reuse_cluster`]). In every trial one publisher per node publishes in a loop through that node only (a job
//! with a one-hour delay into a queue of the trial's own, a short per-request timeout, a short
//! pause after every attempt). After a warm-up in which every publisher succeeded, the fault
//! is injected; when the trial is over the load stops, the cluster is healed and restarted
//! and awaited until all three nodes agree on a leader and have applied everything, and then
//! every acknowledged job is looked up by id. Nothing here sleeps where it could wait for a
//! condition, except the fixed fault and observation windows the scenarios define.
//!
//! Figures (all times on the harness's monotonic clock):
//!
//! - **failover**: from the moment the old leader's process was seen gone (the backend's kill
//!   or stop returned: until then it may go on committing, also what survivors forward to it)
//!   to the completion of the first successful publish sent *after* that moment through a
//!   surviving node. Its resolution is one request (the pause plus the request's latency; at
//!   worst the per-request timeout, when a request was hung at the moment a leader appeared).
//! - **exited**: from the signal to the moment the process was seen gone.
//! - **gap**: the longest interval with no successful publish on any node, from the last
//!   success before the fault to the end of the trial's observation window.
//! - **unchanged**: whether all three nodes report the same leader and Raft term after the
//!   fault as before it (the terms only grow, so any election in between shows).
//! - **acked / lost / unverified**: the publishes answered 2xx, those whose job is gone
//!   afterwards (a linearizable read on two nodes answered 404), and those that could not be
//!   looked up.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use reqwest::Method;
use serde::Serialize;
use serde_json::Value;

use crate::backend::docker::DockerBackend;
use crate::backend::Backend;
use crate::client::{Answer, Client, NAMESPACE};
use crate::nemesis::{on_backend, SharedBackend};
use crate::run::{new_backend, BackendKind, Teardown};

/// Every published job's delay: long enough that nothing becomes ready during a run.
const JOB_DELAY_MS: u64 = 3_600_000;
/// How long a paused follower stays stopped.
const PAUSE_HOLD: Duration = Duration::from_secs(4);
/// How long a follower stays partitioned.
const PARTITION_HOLD: Duration = Duration::from_secs(10);
/// Observation after a follower's fault ends, and steady service after a leader's failover,
/// before the trial's window closes.
const SETTLE: Duration = Duration::from_secs(3);
/// Steady load before the fault, once every publisher has succeeded once.
const BASELINE: Duration = Duration::from_secs(1);
/// Bound on the warm-up (every publisher succeeds once).
const WARMUP_WITHIN: Duration = Duration::from_secs(20);
/// Bound on the first successful publish through a survivor after the leader went.
const FAILOVER_WITHIN: Duration = Duration::from_secs(30);
/// Bound on a cluster becoming healthy (three nodes agree on a leader, nothing lagging).
const HEALTHY_WITHIN: Duration = Duration::from_secs(60);
/// Bound on the whole lookup of one trial's acknowledged jobs.
const VERIFY_WITHIN: Duration = Duration::from_secs(120);
/// Bound on one trial, whatever happens inside it.
const TRIAL_LIMIT: Duration = Duration::from_secs(300);
/// Concurrent lookups when verifying.
const VERIFIERS: usize = 8;

/// One failover scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// `kill -9` the leader under load; figure: time to the first publish through a survivor.
    KillLeader,
    /// SIGTERM the leader under load; figure: the longest gap between successful publishes.
    TermLeader,
    /// SIGSTOP a follower for 4 s; check: the leader and its term are unchanged.
    PauseFollower,
    /// Cut a follower off from both peers for 10 s; check: the leader and its term are
    /// unchanged.
    PartitionFollower,
}

impl Scenario {
    /// Every scenario, in the order they run.
    pub const ALL: [Scenario; 4] = [
        Scenario::KillLeader,
        Scenario::TermLeader,
        Scenario::PauseFollower,
        Scenario::PartitionFollower,
    ];

    /// The name on the command line and in the output.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::KillLeader => "kill-leader",
            Scenario::TermLeader => "term-leader",
            Scenario::PauseFollower => "pause-follower",
            Scenario::PartitionFollower => "partition-follower",
        }
    }

    fn hurts_leader(self) -> bool {
        matches!(self, Scenario::KillLeader | Scenario::TermLeader)
    }
}

/// How to measure.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where the cluster runs.
    pub backend: BackendKind,
    /// Trials per scenario.
    pub trials: u32,
    /// The delayd binary (local backend).
    pub bin: PathBuf,
    /// The image the docker backend runs.
    pub image: String,
    /// The repository root (docker-compose.yml).
    pub repo: PathBuf,
    /// The directory under which this measurement's directory is made.
    pub out: PathBuf,
    /// The scenarios, in order.
    pub scenarios: Vec<Scenario>,
    /// Each publisher's pause after every attempt.
    pub pause: Duration,
    /// Each publish's client-side timeout.
    pub publish_timeout: Duration,
    /// Keep one cluster for all of a scenario's trials (healed and restarted in between)
    /// instead of a fresh one per trial. Trials are then not independent: in openraft,
    /// for one, a node's election timeout is drawn once per process, and a node whose vote
    /// request was refused for a shorter log waits an extra 2 × election_timeout_max before
    /// its next election.
    pub reuse_cluster: bool,
}

/// A leader and the Raft term it leads in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LeaderTerm {
    /// The leader's node id.
    pub leader: u64,
    /// Its term.
    pub term: u64,
}

/// What one trial measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Trial {
    /// 1-based.
    pub trial: u32,
    /// The node the fault hit.
    pub target: u64,
    /// Leader and term before the fault.
    pub before: Option<LeaderTerm>,
    /// Leader and term the nodes agreed on at the end of the observation window.
    pub after: Option<LeaderTerm>,
    /// Every node's (id, leader, term) at the end of the observation window (follower
    /// scenarios).
    pub views: Vec<(u64, Option<u64>, Option<u64>)>,
    /// Leader scenarios: from the old leader's exit (the backend's kill or stop returned) to
    /// the first successful publish sent after that moment through a survivor, in ms.
    pub failover_ms: Option<f64>,
    /// Leader scenarios: from the signal until the process had exited (the backend's kill or
    /// stop returned), in ms.
    pub exit_ms: Option<f64>,
    /// Diagnostic (leader scenarios): fault → a survivor's `/health` first names a new
    /// leader (polled every 50 ms), in ms.
    pub leader_seen_ms: Option<f64>,
    /// Wall-clock time of the fault (unix ms), to find it in the node logs.
    pub fault_unix_ms: u64,
    /// Longest interval without any successful publish, in ms.
    pub gap_ms: Option<f64>,
    /// Leader and term unchanged (follower scenarios).
    pub unchanged: Option<bool>,
    /// Publish attempts, and how many succeeded.
    pub attempts: usize,
    /// Publishes answered 2xx (their job ids were checked afterwards).
    pub acked: usize,
    /// Acknowledged jobs found missing.
    pub lost: usize,
    /// Ids of (the first 20) lost jobs.
    pub lost_ids: Vec<String>,
    /// Acknowledged jobs whose lookup never got an answer.
    pub unverified: usize,
    /// What went wrong, if the trial could not measure everything.
    pub error: Option<String>,
}

/// One scenario's trials.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioResult {
    /// Which.
    pub scenario: Scenario,
    /// `local` or `docker`.
    pub backend: String,
    /// How the fault was done, when it matters (partition: cut or disconnect).
    pub method: Option<String>,
    /// Why it did not run.
    pub skipped: Option<String>,
    /// A failure that ended the scenario early.
    pub error: Option<String>,
    /// The trials that ran.
    pub trials: Vec<Trial>,
}

/// Every scenario's results.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// In the order they ran.
    pub results: Vec<ScenarioResult>,
}

impl Report {
    /// 1 if an acknowledged job was lost; else 2 if something could not be measured or
    /// checked (a trial's error, an unverified job); else 0.
    pub fn exit_code(&self) -> i32 {
        let trials = || self.results.iter().flat_map(|r| &r.trials);
        if trials().any(|t| t.lost > 0) {
            1
        } else if self.results.iter().any(|r| r.error.is_some())
            || trials().any(|t| t.error.is_some() || t.unverified > 0)
        {
            2
        } else {
            0
        }
    }

    /// The results as a markdown table, one row per scenario.
    pub fn markdown(&self) -> String {
        let mut s = String::from(
            "| scenario | backend | trials | failover ms (from the old leader's exit), median / max \
             | longest gap ms, median / max | leader & term unchanged | acked | lost | unverified |\n\
             |---|---|---|---|---|---|---|---|---|\n",
        );
        for r in &self.results {
            if let Some(why) = &r.skipped {
                s.push_str(&format!(
                    "| {} | {} | skipped: {why} | | | | | | |\n",
                    r.scenario.name(),
                    r.backend
                ));
                continue;
            }
            let sum = Summary::of(r);
            let backend = match &r.method {
                Some(m) => format!("{} ({m})", r.backend),
                None => r.backend.clone(),
            };
            let failover = if r.scenario.hurts_leader() { sum.failover() } else { "—".into() };
            let unchanged = if r.scenario.hurts_leader() {
                "—".to_string()
            } else {
                format!("{}/{}", sum.unchanged, sum.checked)
            };
            s.push_str(&format!(
                "| {} | {} | {}{} | {failover} | {} | {unchanged} | {} | {} | {} |\n",
                r.scenario.name(),
                backend,
                r.trials.len(),
                if sum.errors > 0 {
                    format!(" ({} with errors)", sum.errors)
                } else {
                    String::new()
                },
                sum.gap(),
                sum.acked,
                sum.lost,
                sum.unverified
            ));
        }
        s
    }
}

/// The summary figures of one scenario.
struct Summary {
    failover: Vec<f64>,
    gap: Vec<f64>,
    unchanged: usize,
    checked: usize,
    acked: usize,
    lost: usize,
    unverified: usize,
    errors: usize,
}

impl Summary {
    fn of(r: &ScenarioResult) -> Self {
        let t = &r.trials;
        Summary {
            failover: t.iter().filter_map(|t| t.failover_ms).collect(),
            gap: t.iter().filter_map(|t| t.gap_ms).collect(),
            unchanged: t.iter().filter(|t| t.unchanged == Some(true)).count(),
            checked: t.iter().filter(|t| t.unchanged.is_some()).count(),
            acked: t.iter().map(|t| t.acked).sum(),
            lost: t.iter().map(|t| t.lost).sum(),
            unverified: t.iter().map(|t| t.unverified).sum(),
            errors: t.iter().filter(|t| t.error.is_some()).count(),
        }
    }

    fn failover(&self) -> String {
        median_max(&self.failover)
    }

    fn gap(&self) -> String {
        median_max(&self.gap)
    }

    fn line(&self, scenario: Scenario) -> String {
        let mut s = format!("{}: ", scenario.name());
        if scenario.hurts_leader() {
            s.push_str(&format!(
                "failover median / max {} ms (n={}); ",
                self.failover(),
                self.failover.len()
            ));
        } else {
            s.push_str(&format!(
                "leader and term unchanged in {}/{} trials; ",
                self.unchanged, self.checked
            ));
        }
        s.push_str(&format!(
            "longest gap median / max {} ms; acked {}, lost {}, unverified {}",
            self.gap(),
            self.acked,
            self.lost,
            self.unverified
        ));
        if self.errors > 0 {
            s.push_str(&format!("; {} trial(s) with errors", self.errors));
        }
        s
    }
}

/// `median / max`, or `—` without values.
fn median_max(v: &[f64]) -> String {
    match (median(v), v.iter().copied().reduce(f64::max)) {
        (Some(m), Some(x)) => format!("{m:.0} / {x:.0}"),
        _ => "—".into(),
    }
}

/// The median (the mean of the middle two for an even count).
pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    Some(if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 })
}

/// The longest interval in `[from, to]` containing none of `points` (points outside it are
/// ignored). All in the same unit.
pub fn longest_gap(from: u64, to: u64, points: &[u64]) -> u64 {
    let mut inside: Vec<u64> = points.iter().copied().filter(|p| *p > from && *p < to).collect();
    inside.sort_unstable();
    let mut last = from;
    let mut gap = 0;
    for p in inside.into_iter().chain(std::iter::once(to.max(from))) {
        gap = gap.max(p - last);
        last = p;
    }
    gap
}

/// One publish attempt, in µs since the trial's origin.
#[derive(Clone, Copy, Debug)]
struct Attempt {
    node: u64,
    invoke_us: u64,
    complete_us: u64,
    ok: bool,
}

/// The trial's publish load: one publisher per node, each through its node only.
struct Load {
    running: Arc<AtomicBool>,
    attempts: Arc<Mutex<Vec<Attempt>>>,
    acked: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

fn since_us(origin: Instant) -> u64 {
    origin.elapsed().as_micros() as u64
}

impl Load {
    fn start(
        client: &Client,
        nodes: &[u64],
        queue: &str,
        pause: Duration,
        origin: Instant,
    ) -> Self {
        let running = Arc::new(AtomicBool::new(true));
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let tasks = nodes
            .iter()
            .enumerate()
            .map(|(i, &node)| {
                let (client, queue) = (client.clone(), queue.to_string());
                let (running, attempts, acked) = (running.clone(), attempts.clone(), acked.clone());
                tokio::spawn(async move {
                    let mut seq = 0u64;
                    while running.load(Ordering::Relaxed) {
                        seq += 1;
                        let body = format!("{queue}-n{node}-{seq}");
                        let invoke_us = since_us(origin);
                        let answer = client.publish(i, &queue, &body, JOB_DELAY_MS, None, 1).await;
                        let complete_us = since_us(origin);
                        let ok = match answer {
                            Answer::Ok(id) => {
                                lock(&acked).push(id);
                                true
                            }
                            Answer::Fail(_) | Answer::Unknown(_) => false,
                        };
                        lock(&attempts).push(Attempt { node, invoke_us, complete_us, ok });
                        tokio::time::sleep(pause).await;
                    }
                })
            })
            .collect();
        Load { running, attempts, acked, tasks }
    }

    fn snapshot(&self) -> Vec<Attempt> {
        lock(&self.attempts).clone()
    }

    /// Waits until every node's publisher has succeeded once, then lets the load run steadily
    /// for [`BASELINE`].
    async fn warm_up(&self, nodes: &[u64]) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + WARMUP_WITHIN;
        loop {
            let ok: BTreeSet<u64> =
                self.snapshot().iter().filter(|a| a.ok).map(|a| a.node).collect();
            if nodes.iter().all(|n| ok.contains(n)) {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "warm-up: publishers through nodes {:?} had no success within {}s",
                    nodes.iter().filter(|n| !ok.contains(n)).collect::<Vec<_>>(),
                    WARMUP_WITHIN.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(BASELINE).await;
        Ok(())
    }

    /// Stops the publishers (each finishes its request, bounded) and returns every attempt
    /// and every acknowledged job id.
    async fn stop(mut self) -> (Vec<Attempt>, Vec<String>) {
        self.running.store(false, Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        for t in std::mem::take(&mut self.tasks) {
            let abort = t.abort_handle();
            if tokio::time::timeout_at(deadline, t).await.is_err() {
                abort.abort();
            }
        }
        (self.snapshot(), lock(&self.acked).clone())
    }
}

impl Drop for Load {
    /// A trial cut short (its time limit, an interrupt) leaves no publisher running.
    fn drop(&mut self) {
        self.running.store(false, Ordering::Relaxed);
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Everything a trial needs.
struct Ctx {
    backend: SharedBackend,
    /// Admin and lookups (generous timeout).
    client: Client,
    /// The publishers' client (the short per-request timeout).
    load_client: Client,
    nodes: Vec<u64>,
    pause: Duration,
    /// `cut` (peers only) or `disconnect` (peers and clients), for partitions.
    partition: Option<&'static str>,
}

fn index(node: u64) -> usize {
    node.saturating_sub(1) as usize
}

/// Each node's (leader, term) from `/health`; `None` for a node that did not answer.
async fn views(client: &Client, nodes: &[u64]) -> Vec<Option<(Option<u64>, u64)>> {
    let mut out = Vec::new();
    for n in nodes {
        out.push(client.get_json(index(*n), "/health").await.ok().and_then(|v| {
            let term = v["term"].as_u64()?;
            Some((v["leader"].as_u64(), term))
        }));
    }
    out
}

/// The leader and term every node in `nodes` reports, if they all answer and agree.
fn agreed(seen: &[Option<(Option<u64>, u64)>]) -> Option<LeaderTerm> {
    let first = seen.first().copied().flatten()?;
    let leader = first.0?;
    seen.iter()
        .all(|v| *v == Some((Some(leader), first.1)))
        .then_some(LeaderTerm { leader, term: first.1 })
}

/// The leader and term a majority of all `total` nodes report (survivors after a failover).
fn majority(seen: &[Option<(Option<u64>, u64)>], total: usize) -> Option<LeaderTerm> {
    let mut votes = std::collections::BTreeMap::new();
    for (l, t) in seen.iter().flatten() {
        if let Some(l) = l {
            *votes.entry((*l, *t)).or_insert(0usize) += 1;
        }
    }
    votes
        .into_iter()
        .find(|(_, c)| c * 2 > total)
        .map(|((leader, term), _)| LeaderTerm { leader, term })
}

fn describe(nodes: &[u64], seen: &[Option<(Option<u64>, u64)>]) -> String {
    nodes
        .iter()
        .zip(seen)
        .map(|(n, v)| match v {
            Some((Some(l), t)) => format!("node {n}: leader {l} term {t}"),
            Some((None, t)) => format!("node {n}: no leader, term {t}"),
            None => format!("node {n}: no answer"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Waits until every node answers, all agree on one leader and term, the leader counts all
/// of them as voters, reachable, and none lags behind the newest log. Returns the leader.
pub async fn await_healthy(
    client: &Client,
    nodes: &[u64],
    within: Duration,
) -> anyhow::Result<LeaderTerm> {
    let deadline = tokio::time::Instant::now() + within;
    let mut last;
    loop {
        let seen = views(client, nodes).await;
        last = describe(nodes, &seen);
        if let Some(lt) = agreed(&seen) {
            match client.get_json(index(lt.leader), "/admin/cluster").await {
                Ok(v) => match cluster_ready(&v, nodes) {
                    Ok(()) => return Ok(lt),
                    Err(why) => last = format!("{last}; {why}"),
                },
                Err(e) => last = format!("{last}; /admin/cluster: {e:#}"),
            }
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("the cluster was not healthy within {}s: {last}", within.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The leader and term all nodes agree on, read right before a fault (bounded: 10 s).
async fn await_agreed(client: &Client, nodes: &[u64]) -> anyhow::Result<LeaderTerm> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen = views(client, nodes).await;
        if let Some(lt) = agreed(&seen) {
            return Ok(lt);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "the nodes did not agree on a leader before the fault: {}",
                describe(nodes, &seen)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the leader's `/admin/cluster` shows every node as a reachable voter with no lag.
fn cluster_ready(v: &Value, nodes: &[u64]) -> Result<(), String> {
    let voters: Vec<u64> =
        v["voters"].as_array().into_iter().flatten().filter_map(Value::as_u64).collect();
    if let Some(n) = nodes.iter().find(|n| !voters.contains(n)) {
        return Err(format!("node {n} is not a voter"));
    }
    for n in nodes {
        let entry = v["nodes"].as_array().into_iter().flatten().find(|e| e["id"] == *n);
        let Some(e) = entry else { return Err(format!("node {n} missing from /admin/cluster")) };
        if e["reachable"] != true {
            return Err(format!("node {n} unreachable from the leader"));
        }
        if e["lag"].as_u64() != Some(0) {
            return Err(format!("node {n} lags by {}", e["lag"]));
        }
    }
    Ok(())
}

/// Heals the network, resumes and restarts every node, and waits for a healthy cluster.
async fn restore(ctx: &Ctx) -> anyhow::Result<LeaderTerm> {
    let nodes = ctx.nodes.clone();
    on_backend(&ctx.backend, move |b| {
        b.heal()?;
        for n in &nodes {
            b.resume(*n)?;
            b.restart(*n)?;
        }
        Ok(())
    })
    .await
    .context("healing and restarting")?;
    await_healthy(&ctx.client, &ctx.nodes, HEALTHY_WITHIN).await
}

/// Looks up every job of `ids` in `queue` through the `nodes` nodes of `client`; returns the
/// lost ids (two nodes answered 404) and how many got no answer in time.
pub async fn verify(
    client: &Client,
    nodes: usize,
    queue: &str,
    ids: &[String],
) -> (Vec<String>, usize) {
    let deadline = tokio::time::Instant::now() + VERIFY_WITHIN;
    let chunks: Vec<Vec<String>> =
        (0..VERIFIERS).map(|k| ids.iter().skip(k).step_by(VERIFIERS).cloned().collect()).collect();
    let tasks: Vec<_> = chunks
        .into_iter()
        .enumerate()
        .map(|(k, chunk)| {
            let (client, queue) = (client.clone(), queue.to_string());
            tokio::spawn(async move {
                let (mut lost, mut unverified) = (Vec::new(), 0usize);
                for (j, id) in chunk.iter().enumerate() {
                    match lookup(&client, nodes, k + j, &queue, id, deadline).await {
                        Some(true) => {}
                        Some(false) => lost.push(id.clone()),
                        None => unverified += 1,
                    }
                }
                (lost, unverified)
            })
        })
        .collect();
    let (mut lost, mut unverified) = (Vec::new(), 0);
    for t in tasks {
        match t.await {
            Ok((l, u)) => {
                lost.extend(l);
                unverified += u;
            }
            Err(_) => unverified += ids.len().div_ceil(VERIFIERS),
        }
    }
    (lost, unverified)
}

/// Whether job `id` exists: `Some(false)` only when two different nodes said 404 (reads are
/// linearizable, so one would do; the second rules out a node that answers wrongly).
async fn lookup(
    client: &Client,
    nodes: usize,
    start: usize,
    queue: &str,
    id: &str,
    deadline: tokio::time::Instant,
) -> Option<bool> {
    let mut absent_on = BTreeSet::new();
    for attempt in 0..12 {
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        let node = (start + attempt) % nodes;
        match client.job_exists(node, queue, id).await {
            Answer::Ok(true) => return Some(true),
            Answer::Ok(false) => {
                absent_on.insert(node);
                if absent_on.len() >= 2.min(nodes) {
                    return Some(false);
                }
            }
            Answer::Fail(_) | Answer::Unknown(_) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    None
}

/// Removes the trial's queue (best effort: it only keeps the cluster small).
async fn drop_queue(client: &Client, nodes: usize, queue: &str) {
    let path = format!("/api/{NAMESPACE}/{queue}?all=true");
    for n in 0..nodes {
        if client.admin(n, Method::DELETE, &path).await.is_ok() {
            return;
        }
    }
    eprintln!("  (could not delete queue {queue}; it stays)");
}

/// The trial's queue: unique, so a trial's lookups see only its own jobs.
fn queue_name(scenario: Scenario, trial: u32) -> String {
    format!("fo-{}-{trial}-{:08x}", scenario.name(), rand::random::<u32>())
}

/// How the window of one trial went, before the cluster is restored.
struct Window {
    attempts: Vec<Attempt>,
    acked: Vec<String>,
    fault_us: u64,
    end_us: u64,
}

impl Window {
    /// The longest gap without a successful publish, from the last success before the fault
    /// to the end of the window, in ms.
    fn gap_ms(&self) -> f64 {
        let ok: Vec<u64> = self.attempts.iter().filter(|a| a.ok).map(|a| a.complete_us).collect();
        let from =
            ok.iter().copied().filter(|t| *t <= self.fault_us).max().unwrap_or(self.fault_us);
        longest_gap(from, self.end_us, &ok) as f64 / 1000.0
    }
}

/// The first successful publish sent at or after `fault_us` through a node other than
/// `target`: its completion time.
fn first_survivor_success(attempts: &[Attempt], target: u64, fault_us: u64) -> Option<u64> {
    attempts
        .iter()
        .filter(|a| a.ok && a.node != target && a.invoke_us >= fault_us)
        .map(|a| a.complete_us)
        .min()
}

/// The start of every trial's window: a healthy cluster, the load running and warmed up, and
/// the leader and term all nodes agree on right before the fault (recorded in `trial`).
async fn start_window(
    ctx: &Ctx,
    queue: &str,
    trial: &mut Trial,
) -> anyhow::Result<(Instant, Load, LeaderTerm)> {
    await_healthy(&ctx.client, &ctx.nodes, HEALTHY_WITHIN).await?;
    let origin = Instant::now();
    let load = Load::start(&ctx.load_client, &ctx.nodes, queue, ctx.pause, origin);
    load.warm_up(&ctx.nodes).await?;
    let before = await_agreed(&ctx.client, &ctx.nodes).await?;
    trial.before = Some(before);
    Ok((origin, load, before))
}

/// kill-leader / term-leader: one trial's window.
async fn leader_window(
    ctx: &Ctx,
    scenario: Scenario,
    queue: &str,
    trial: &mut Trial,
) -> anyhow::Result<Window> {
    let (origin, load, before) = start_window(ctx, queue, trial).await?;
    let target = before.leader;
    trial.target = target;
    let kill = scenario == Scenario::KillLeader;
    let (fault_us, exited_us) = on_backend(&ctx.backend, move |b| {
        let t = since_us(origin);
        if kill {
            b.kill(target)?;
        } else {
            b.stop(target)?;
        }
        Ok((t, since_us(origin)))
    })
    .await
    .with_context(|| format!("signalling leader {target}"))?;

    trial.fault_unix_ms = unix_ms() - (since_us(origin) - fault_us) / 1000;
    trial.exit_ms = Some(exited_us.saturating_sub(fault_us) as f64 / 1000.0);
    // Until the process is gone the old leader may go on committing, also what survivors
    // forward to it: a SIGTERMed one while it shuts down, a killed container until the daemon
    // has delivered the signal. So failover counts from the exit the backend saw.
    let base_us = exited_us;
    let survivors: Vec<u64> = ctx.nodes.iter().copied().filter(|n| *n != target).collect();
    let deadline = tokio::time::Instant::now() + FAILOVER_WITHIN;
    let published = async {
        loop {
            if let Some(t) = first_survivor_success(&load.snapshot(), target, base_us) {
                return Some(t);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    // Diagnostic: when a survivor's /health first names a new leader.
    let elected = async {
        loop {
            for n in &survivors {
                if let Some(l) = ctx.client.leader_seen_by(index(*n)).await {
                    if l != target {
                        return Some(since_us(origin));
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (first, elected) = tokio::join!(published, elected);
    trial.failover_ms = first.map(|t| (t - base_us) as f64 / 1000.0);
    trial.leader_seen_ms = elected.map(|t| t.saturating_sub(fault_us) as f64 / 1000.0);
    if first.is_none() {
        trial.error = Some(format!(
            "no publish succeeded through a survivor within {}s",
            FAILOVER_WITHIN.as_secs()
        ));
    }
    // Steady service: the window closes SETTLE after both the first survivor success and the
    // signalled node's exit.
    let end_from = first.unwrap_or(since_us(origin)).max(exited_us);
    let end_us = end_from + SETTLE.as_micros() as u64;
    let now = since_us(origin);
    if end_us > now {
        tokio::time::sleep(Duration::from_micros(end_us - now)).await;
    }
    let seen = views(&ctx.client, &survivors).await;
    trial.after = majority(&seen, ctx.nodes.len());
    let (attempts, acked) = load.stop().await;
    Ok(Window { attempts, acked, fault_us, end_us })
}

/// pause-follower / partition-follower: one trial's window.
async fn follower_window(
    ctx: &Ctx,
    scenario: Scenario,
    queue: &str,
    trial: &mut Trial,
) -> anyhow::Result<Window> {
    let (origin, load, before) = start_window(ctx, queue, trial).await?;
    let followers: Vec<u64> = ctx.nodes.iter().copied().filter(|n| *n != before.leader).collect();
    let target = followers[(trial.trial as usize).saturating_sub(1) % followers.len()];
    trial.target = target;
    let (hold, partition) = match scenario {
        Scenario::PauseFollower => (PAUSE_HOLD, None),
        _ => (PARTITION_HOLD, ctx.partition),
    };
    let peers: Vec<(u64, u64)> = followers
        .iter()
        .copied()
        .chain(std::iter::once(before.leader))
        .filter(|n| *n != target)
        .map(|p| (target, p))
        .collect();
    let fault_us = on_backend(&ctx.backend, move |b| {
        let t = since_us(origin);
        match partition {
            None => b.pause(target)?,
            Some("cut") => b.cut(&peers)?,
            Some(_) => b.disconnect(target)?,
        }
        Ok(t)
    })
    .await
    .with_context(|| format!("hurting follower {target}"))?;
    trial.fault_unix_ms = unix_ms() - (since_us(origin) - fault_us) / 1000;
    tokio::time::sleep(hold).await;
    on_backend(
        &ctx.backend,
        move |b| if partition.is_none() { b.resume(target) } else { b.heal() },
    )
    .await
    .with_context(|| format!("ending the fault on follower {target}"))?;
    tokio::time::sleep(SETTLE).await;
    let end_us = since_us(origin);
    // Every node's view; a node slow to answer right after its fault gets a few more tries.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let seen = loop {
        let seen = views(&ctx.client, &ctx.nodes).await;
        if seen.iter().all(Option::is_some) || tokio::time::Instant::now() >= deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    trial.views = ctx
        .nodes
        .iter()
        .zip(&seen)
        .map(|(n, v)| (*n, v.and_then(|v| v.0), v.map(|v| v.1)))
        .collect();
    trial.after = majority(&seen, ctx.nodes.len());
    trial.unchanged = Some(seen.iter().all(|v| *v == Some((Some(before.leader), before.term))));
    let (attempts, acked) = load.stop().await;
    Ok(Window { attempts, acked, fault_us, end_us })
}

/// One trial: the window, then restore the cluster and check every acknowledged job.
async fn trial_once(ctx: &Ctx, scenario: Scenario, n: u32) -> (Trial, anyhow::Result<()>) {
    let mut trial = Trial { trial: n, ..Trial::default() };
    let queue = queue_name(scenario, n);
    let window = if scenario.hurts_leader() {
        leader_window(ctx, scenario, &queue, &mut trial).await
    } else {
        follower_window(ctx, scenario, &queue, &mut trial).await
    };
    let restored = restore(ctx).await;
    match window {
        Ok(w) => {
            trial.gap_ms = Some(w.gap_ms());
            trial.attempts = w.attempts.len();
            trial.acked = w.acked.len();
            let (lost, unverified) = verify(&ctx.client, ctx.nodes.len(), &queue, &w.acked).await;
            trial.lost = lost.len();
            trial.lost_ids = lost.into_iter().take(20).collect();
            trial.unverified = unverified;
        }
        Err(e) => {
            trial.error = Some(format!("{e:#}"));
        }
    }
    drop_queue(&ctx.client, ctx.nodes.len(), &queue).await;
    (trial, restored.map(drop))
}

fn trial_line(scenario: Scenario, trials: u32, t: &Trial) -> String {
    let lt = |v: Option<LeaderTerm>| match v {
        Some(v) => format!("leader {} term {}", v.leader, v.term),
        None => "no agreed leader".into(),
    };
    let ms = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.0} ms"));
    let mut s = format!("  {} trial {}/{}: ", scenario.name(), t.trial, trials);
    if scenario.hurts_leader() {
        s.push_str(&format!(
            "{} leader {} ({}); exited after {}; new leader named after {}; first publish \
             through a survivor {} after the exit; longest gap {}; then {}",
            if scenario == Scenario::KillLeader { "killed" } else { "SIGTERMed" },
            t.target,
            lt(t.before),
            ms(t.exit_ms),
            ms(t.leader_seen_ms),
            ms(t.failover_ms),
            ms(t.gap_ms),
            lt(t.after)
        ));
    } else {
        s.push_str(&format!(
            "follower {}; before {}, after {}; {}; longest gap {}",
            t.target,
            lt(t.before),
            lt(t.after),
            match t.unchanged {
                Some(true) => "unchanged".to_string(),
                Some(false) => format!("CHANGED (views {:?})", t.views),
                None => "not checked".into(),
            },
            ms(t.gap_ms)
        ));
    }
    s.push_str(&format!(
        "; {} publishes, acked {}, lost {}, unverified {}",
        t.attempts, t.acked, t.lost, t.unverified
    ));
    if !t.lost_ids.is_empty() {
        s.push_str(&format!(" (lost: {:?})", t.lost_ids));
    }
    if let Some(e) = &t.error {
        s.push_str(&format!("; error: {e}"));
    }
    s
}

/// Runs every scenario of `opts` and writes `results.json` and `summary.md` into a new
/// directory under `opts.out`.
pub async fn run(opts: &Options) -> anyhow::Result<Report> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let dir = opts.out.join(format!("failover-{stamp}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    println!("failover measurement: {} trials per scenario; output {}", opts.trials, dir.display());
    if opts.backend == BackendKind::Docker {
        println!("docker backend: the nodes run the image {} (--bin is not used)", opts.image);
    }
    let mut report = Report { results: Vec::new() };
    for &scenario in &opts.scenarios {
        let result = run_scenario(opts, scenario, &dir.join(scenario.name())).await;
        report.results.push(result);
        write_files(&dir, &report)?;
    }
    println!("\n{}", report.markdown());
    Ok(report)
}

fn write_files(dir: &Path, report: &Report) -> anyhow::Result<()> {
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(report)?)
        .context("writing results.json")?;
    std::fs::write(dir.join("summary.md"), report.markdown()).context("writing summary.md")
}

async fn run_scenario(opts: &Options, scenario: Scenario, dir: &Path) -> ScenarioResult {
    let mut result = ScenarioResult {
        scenario,
        backend: match opts.backend {
            BackendKind::Local => "local".into(),
            BackendKind::Docker => "docker".into(),
        },
        method: None,
        skipped: None,
        error: None,
        trials: Vec::new(),
    };
    println!("\n== {} ==", scenario.name());
    let backend = match make_backend(opts, dir) {
        Ok(b) => b,
        Err(e) => {
            println!("{}: cannot create the backend: {e:#}", scenario.name());
            result.error = Some(format!("backend: {e:#}"));
            return result;
        }
    };
    let partition = if backend.can_partition() {
        Some("cut")
    } else if backend.can_disconnect() {
        Some("disconnect")
    } else {
        None
    };
    if scenario == Scenario::PartitionFollower {
        match partition {
            None => {
                println!("{}: skipped: backend cannot partition", scenario.name());
                result.skipped = Some("backend cannot partition".into());
                return result;
            }
            Some(m) => result.method = Some(m.into()),
        }
    }
    let nodes = backend.nodes().to_vec();
    let urls: Vec<String> = nodes.iter().map(|n| n.http.clone()).collect();
    let backend: SharedBackend = Arc::new(Mutex::new(backend));
    let guard = Teardown(backend.clone());
    let ctx = match (
        Client::new(urls.clone(), Duration::from_secs(5)),
        Client::new(urls, opts.publish_timeout),
    ) {
        (Ok(client), Ok(load_client)) => Ctx {
            backend: backend.clone(),
            client,
            load_client,
            nodes: nodes.iter().map(|n| n.id).collect(),
            pause: opts.pause,
            partition,
        },
        (Err(e), _) | (_, Err(e)) => {
            result.error = Some(format!("{e:#}"));
            return result;
        }
    };
    if let Err(e) = fresh_cluster(&ctx).await {
        println!("{}: {e:#}", scenario.name());
        result.error = Some(format!("{e:#}"));
        return result;
    }
    for n in 1..=opts.trials {
        if n > 1 && !opts.reuse_cluster {
            if let Err(e) = fresh_cluster(&ctx).await {
                println!("{}: giving up: {e:#}", scenario.name());
                result.error = Some(format!("before trial {n}: {e:#}"));
                break;
            }
        }
        let (trial, restored) =
            match tokio::time::timeout(TRIAL_LIMIT, trial_once(&ctx, scenario, n)).await {
                Ok(r) => r,
                Err(_) => (
                    Trial {
                        trial: n,
                        error: Some(format!("exceeded {}s", TRIAL_LIMIT.as_secs())),
                        ..Trial::default()
                    },
                    Err(anyhow::anyhow!("trial cut short")),
                ),
            };
        println!("{}", trial_line(scenario, opts.trials, &trial));
        result.trials.push(trial);
        if !opts.reuse_cluster {
            // The next start empties the nodes' logs (docker: removes the containers).
            collect_logs(&backend, &dir.join(format!("trial-{n}"))).await;
            if let Err(e) = restored {
                println!("  the cluster did not recover: {e:#}");
            }
        } else if let Err(e) = restored {
            println!("  the cluster did not recover ({e:#}); starting a fresh one");
            if let Err(e) = fresh_cluster(&ctx).await {
                println!("{}: giving up: {e:#}", scenario.name());
                result.error = Some(format!("after trial {n}: {e:#}"));
                break;
            }
        }
    }
    if opts.reuse_cluster {
        collect_logs(&backend, dir).await;
    }
    drop(guard);
    println!("{}", Summary::of(&result).line(scenario));
    result
}

async fn collect_logs(backend: &SharedBackend, dir: &Path) {
    let dir = dir.to_path_buf();
    if let Err(e) = on_backend(backend, move |b| b.collect_logs(&dir)).await {
        eprintln!("collecting logs: {e:#}");
    }
}

/// The local backend as the chaos runs make it; docker as compose project `delayd-failover`
/// (not the chaos runs' project, whose containers a start would remove) running
/// `opts.image`.
fn make_backend(opts: &Options, dir: &Path) -> anyhow::Result<Box<dyn Backend>> {
    match opts.backend {
        BackendKind::Local => new_backend(opts.backend, &opts.repo, &opts.bin, &dir.join("nodes")),
        BackendKind::Docker => Ok(Box::new(DockerBackend::with_image(
            opts.repo.clone(),
            "delayd-failover".into(),
            opts.image.clone(),
        )?)),
    }
}

/// Starts the cluster from empty data and waits until it is healthy.
async fn fresh_cluster(ctx: &Ctx) -> anyhow::Result<LeaderTerm> {
    on_backend(&ctx.backend, |b| b.start()).await.context("starting the cluster")?;
    let lt = await_healthy(&ctx.client, &ctx.nodes, HEALTHY_WITHIN).await?;
    println!("  cluster up: leader {} term {}", lt.leader, lt.term);
    Ok(lt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gap_counts_the_bounds_and_ignores_points_outside() {
        assert_eq!(longest_gap(0, 100, &[]), 100);
        assert_eq!(longest_gap(10, 100, &[20, 30, 90]), 60);
        // The end of the window counts: a stall at the end is a gap.
        assert_eq!(longest_gap(0, 100, &[10, 20]), 80);
        // Points outside [from, to] do not shorten anything.
        assert_eq!(longest_gap(50, 100, &[0, 10, 200]), 50);
        assert_eq!(longest_gap(0, 10, &[5, 5, 5]), 5);
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn the_first_survivor_success_must_be_sent_after_the_fault() {
        let a = |node, invoke_us, complete_us, ok| Attempt { node, invoke_us, complete_us, ok };
        let attempts = [
            // In flight at the fault: may have been committed by the old leader.
            a(2, 90, 110, true),
            // Through the dead leader.
            a(1, 100, 120, true),
            a(3, 100, 900, false),
            a(3, 905, 1500, true),
            a(2, 120, 1400, true),
        ];
        assert_eq!(first_survivor_success(&attempts, 1, 100), Some(1400));
        assert_eq!(first_survivor_success(&attempts[..4], 1, 100), Some(1500));
        assert_eq!(first_survivor_success(&attempts[..3], 1, 100), None);
    }

    #[test]
    fn views_agree_only_when_everyone_answers_the_same() {
        let v = |l, t| Some((Some(l), t));
        assert_eq!(agreed(&[v(1, 3), v(1, 3), v(1, 3)]), Some(LeaderTerm { leader: 1, term: 3 }));
        assert_eq!(agreed(&[v(1, 3), v(1, 4), v(1, 3)]), None);
        assert_eq!(agreed(&[v(1, 3), None, v(1, 3)]), None);
        assert_eq!(majority(&[v(2, 4), None, v(2, 4)], 3), Some(LeaderTerm { leader: 2, term: 4 }));
        assert_eq!(majority(&[v(2, 4), None, v(3, 5)], 3), None);
    }

    #[test]
    fn exit_code_is_one_when_something_acknowledged_was_lost() {
        let trial = |lost, unverified| Trial { lost, unverified, ..Trial::default() };
        let report = |trials| Report {
            results: vec![ScenarioResult {
                scenario: Scenario::KillLeader,
                backend: "local".into(),
                method: None,
                skipped: None,
                error: None,
                trials,
            }],
        };
        assert_eq!(report(vec![trial(0, 0)]).exit_code(), 0);
        assert_eq!(report(vec![trial(0, 3)]).exit_code(), 2);
        assert_eq!(report(vec![trial(0, 3), trial(1, 0)]).exit_code(), 1);
        assert!(report(vec![trial(0, 0)]).markdown().contains("| kill-leader | local | 1 |"));
    }
}
