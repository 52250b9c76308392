//! One chaos run from start to verdict, and the files it leaves behind.
//!
//! Start the cluster → workload and nemesis for the planned time → recover (heal, restart,
//! reset clocks, restore membership) → drain every queue → read the dead letter → wait for
//! convergence → check → write `plan.json`, `history.jsonl`, `faults.json`, `summary.json`,
//! `summary.md`, `timeline.svg` and `node-<id>.log`. Teardown always runs, also when the run
//! fails, times out or is interrupted, because the backend lives in a guard that tears it
//! down on drop.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use reqwest::Method;
use serde::Serialize;
use serde_json::{json, Value};

use crate::backend::{docker::DockerBackend, local::LocalBackend, Backend};
use crate::checker::{self, Anomaly};
use crate::client::{Client, Recorder, NAMESPACE};
use crate::history::{Call, Outcome};
use crate::nemesis::{on_backend, Nemesis, SharedBackend};
use crate::plan::{self, FaultKind, Plan, PlanSpec};
use crate::progress::Bar;
use crate::workload::{self, Shared};

/// Where the cluster runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// The top-level docker-compose.yml (image `delayd:local`).
    Docker,
    /// Local processes (network namespaces when root, plain loopback otherwise).
    Local,
}

/// How to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where the cluster runs.
    pub backend: BackendKind,
    /// Long mode: every fault kind at random for the whole time limit.
    pub long: bool,
    /// Workload time (CI mode: at most).
    pub time_limit: Duration,
    /// Where each run's directory goes.
    pub out: PathBuf,
    /// The repository root (for docker-compose.yml).
    pub repo: PathBuf,
    /// The delayd binary (local backend).
    pub bin: PathBuf,
    /// Most recovery + drain time before the verdict is "unknown".
    pub drain_limit: Duration,
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Every property held.
    Valid,
    /// The run could not be judged (cluster never formed, drain did not finish, ...).
    Unknown,
    /// A property was broken.
    Invalid,
}

impl Verdict {
    /// The process exit code: 0 valid, 1 anomaly found, 2 unknown.
    pub fn exit_code(self) -> i32 {
        match self {
            Verdict::Valid => 0,
            Verdict::Invalid => 1,
            Verdict::Unknown => 2,
        }
    }
}

/// Tears the backend down when dropped, however the run ends.
pub struct Teardown(pub SharedBackend);

impl Drop for Teardown {
    fn drop(&mut self) {
        if let Ok(mut b) = self.0.lock() {
            if let Err(e) = b.teardown() {
                eprintln!("teardown: {e:#}");
            }
        }
    }
}

fn make_backend(opts: &Options, dir: &Path) -> anyhow::Result<Box<dyn Backend>> {
    new_backend(opts.backend, &opts.repo, &opts.bin, &dir.join("nodes"))
}

/// A backend of `kind`: docker-compose from the repository at `repo` (image `delayd:local`),
/// or local processes running `bin` with their data and logs under `work_dir` (in network
/// namespaces when this process may create them).
pub fn new_backend(
    kind: BackendKind,
    repo: &Path,
    bin: &Path,
    work_dir: &Path,
) -> anyhow::Result<Box<dyn Backend>> {
    Ok(match kind {
        BackendKind::Docker => {
            Box::new(DockerBackend::new(repo.to_path_buf(), "delayd-jepsen".to_string())?)
        }
        BackendKind::Local => {
            let netns = LocalBackend::netns_available();
            if !netns {
                println!("local backend without network namespaces: no partition faults");
            }
            Box::new(LocalBackend::new(bin.to_path_buf(), work_dir.to_path_buf(), netns)?)
        }
    })
}

/// The fault kinds `backend` can inject.
pub fn possible_kinds(backend: &dyn Backend) -> Vec<FaultKind> {
    FaultKind::ALL
        .iter()
        .copied()
        .filter(|k| match k {
            FaultKind::IsolateLeader | FaultKind::IsolateNode | FaultKind::Bridge => {
                backend.can_partition()
            }
            FaultKind::FullIsolation => backend.can_disconnect(),
            _ => true,
        })
        .collect()
}

/// Runs one test with `seed` and writes its files under `opts.out/<seed>/`.
pub async fn run_once(opts: &Options, seed: u64) -> anyhow::Result<Verdict> {
    let dir = opts.out.join(format!("seed-{seed}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    println!("seed: {seed}");
    println!("output: {}", dir.display());

    let backend = make_backend(opts, &dir)?;
    let spec = PlanSpec {
        seed,
        long: opts.long,
        duration_ms: opts.time_limit.as_millis() as u64,
        kinds: possible_kinds(backend.as_ref()),
        nodes: backend.nodes().len() as u64,
        backend: backend.name().to_string(),
    };
    let plan = plan::generate(&spec);
    write_json(&dir.join("plan.json"), &plan)?;
    println!(
        "plan: {} mode, {} backend, {:.0}s of workload, {} faults: {}",
        plan.mode,
        plan.backend,
        plan.duration_ms as f64 / 1000.0,
        plan.faults.len(),
        plan.faults.iter().map(|f| f.kind.name()).collect::<Vec<_>>().join(", ")
    );

    let nodes = backend.nodes().to_vec();
    let backend: SharedBackend = Arc::new(Mutex::new(backend));
    let guard = Teardown(backend.clone());
    let outcome = drive(opts, &plan, &dir, &backend, &nodes).await;
    if let Err(e) = on_backend(&backend, {
        let dir = dir.clone();
        move |b| b.collect_logs(&dir)
    })
    .await
    {
        eprintln!("collecting logs: {e:#}");
    }
    drop(guard);
    let verdict = outcome?;
    println!("verdict: {verdict:?} (exit {})", verdict.exit_code());
    Ok(verdict)
}

async fn drive(
    opts: &Options,
    plan: &Plan,
    dir: &Path,
    backend: &SharedBackend,
    nodes: &[crate::backend::NodeInfo],
) -> anyhow::Result<Verdict> {
    on_backend(backend, |b| b.start()).await.context("starting the cluster")?;
    let client =
        Client::new(nodes.iter().map(|n| n.http.clone()).collect(), Duration::from_secs(7))?;
    let recorder = Arc::new(Recorder::create(&dir.join("history.jsonl"))?);
    if !await_leader(&client, Duration::from_secs(60)).await {
        println!("the cluster never elected a leader");
        return Ok(Verdict::Unknown);
    }
    println!("cluster up: leader node {}", client.leader().await.unwrap_or(0));

    let shared = Arc::new(Shared {
        client: client.clone(),
        recorder: recorder.clone(),
        running: AtomicBool::new(true),
        processes: AtomicU64::new(1),
    });
    let nemesis = Nemesis {
        backend: backend.clone(),
        client: client.clone(),
        recorder: recorder.clone(),
        nodes: nodes.iter().map(|n| n.id).collect(),
        grpc: nodes.iter().map(|n| n.grpc.clone()).collect(),
    };

    let start_ms = recorder.now_ms();
    let workers = workload::spawn(&plan.workload, &shared);
    let (windows, ()) = tokio::join!(
        nemesis.run(start_ms, &plan.faults),
        workload_time(plan, &recorder, start_ms, opts.long)
    );
    shared.running.store(false, Ordering::Relaxed);
    join_bounded(workers, Duration::from_secs(30)).await;
    let workload_end_ms = recorder.now_ms();
    println!("workload done: {} operations", recorder.len());

    // Recovery and drain share one bound; past it the run is unknown, not failed.
    let deadline = tokio::time::Instant::now() + opts.drain_limit;
    let recovering = opts.long.then(|| Bar::phase("recovering, draining, converging"));
    let mut problems = nemesis.recover().await;
    let leader = await_leader(&client, Duration::from_secs(60)).await;
    if !leader {
        problems.push("no leader after recovery".into());
    }
    let drained = leader && drain(plan, &shared, deadline).await;
    if !drained {
        problems.push("the queues did not drain in time".into());
    }
    read_dead_letter(plan, &shared).await;
    let convergence = converge(&client, nodes, Duration::from_secs(30)).await;
    drop(recovering);
    let history = recorder.history();
    write_json(&dir.join("faults.json"), &windows)?;

    let tolerance_ms = plan.tolerance_ms();
    let mut report = checker::check(&history, tolerance_ms);
    report.anomalies.extend(checker::check_convergence(&convergence));
    let lateness = crate::stats::lateness(&history, &windows);
    let availability = crate::stats::availability(&history, &windows);

    // An undrained run can't tell a lost job from one still waiting: its "lost" are unknown.
    let judged: Vec<&Anomaly> =
        report.anomalies.iter().filter(|a| drained || !matches!(a, Anomaly::Lost { .. })).collect();
    let verdict = if !judged.is_empty() {
        Verdict::Invalid
    } else if !problems.is_empty() {
        Verdict::Unknown
    } else {
        Verdict::Valid
    };

    let counts = op_counts(&history);
    let title = format!(
        "delayd jepsen · seed {} · {} mode · {} backend · {:?}",
        plan.seed, plan.mode, plan.backend, verdict
    );
    std::fs::write(
        dir.join("timeline.svg"),
        crate::render::svg(&history, &windows, &report.anomalies, &title),
    )?;
    let summary = json!({
        "seed": plan.seed,
        "mode": plan.mode,
        "backend": plan.backend,
        "verdict": verdict,
        "exit_code": verdict.exit_code(),
        "workload_ms": workload_end_ms - start_ms,
        "operations": counts,
        "faults": windows,
        "tolerance_ms": tolerance_ms,
        "report": report,
        "convergence": convergence,
        "lateness": lateness,
        "availability": availability,
        "problems": problems,
        "note": "interleavings of real processes are not reproducible: the seed fixes the plan \
                 and every worker's choices, not the timing",
    });
    write_json(&dir.join("summary.json"), &summary)?;
    let text = summary_text(plan, verdict, &counts, &windows, &report, &convergence, &problems)
        + "\n"
        + &crate::stats::render_text(&lateness, &availability);
    std::fs::write(dir.join("summary.md"), &text)?;
    println!("{text}");
    Ok(verdict)
}

/// The workload's planned time. In long mode (minutes to hours) a progress bar shows it
/// passing, with the operations recorded and the faults begun; it ends at the same instant
/// either way.
async fn workload_time(plan: &Plan, recorder: &Recorder, start_ms: u64, long: bool) {
    let planned = Duration::from_millis(plan.duration_ms);
    if !long {
        tokio::time::sleep(planned).await;
        return;
    }
    let end = tokio::time::Instant::now() + planned;
    let bar = Bar::workload(planned);
    loop {
        let elapsed_ms = recorder.now_ms().saturating_sub(start_ms);
        let begun = plan.faults.iter().filter(|f| f.at_ms <= elapsed_ms).count();
        let elapsed = Duration::from_millis(elapsed_ms);
        bar.workload_at(elapsed, recorder.len(), begun, plan.faults.len());
        let now = tokio::time::Instant::now();
        if now >= end {
            break;
        }
        tokio::time::sleep((end - now).min(Duration::from_secs(1))).await;
    }
}

async fn await_leader(client: &Client, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if client.leader().await.is_some() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

async fn join_bounded(tasks: Vec<tokio::task::JoinHandle<()>>, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    for t in tasks {
        let abort = t.abort_handle();
        if tokio::time::timeout_at(deadline, t).await.is_err() {
            abort.abort();
        }
    }
}

/// Consumes and acks until every queue is empty in every state (read linearizably), or the
/// deadline. Returns whether it emptied.
async fn drain(plan: &Plan, shared: &Arc<Shared>, deadline: tokio::time::Instant) -> bool {
    shared.running.store(true, Ordering::Relaxed);
    let workers: Vec<_> = (0..4u64)
        .map(|i| {
            let (plan, shared) = (plan.workload.clone(), shared.clone());
            tokio::spawn(workload::consumer(
                plan_seed(plan.worker_seeds.first(), i),
                plan,
                shared,
                true,
            ))
        })
        .collect();
    let mut empty_rounds = 0;
    let mut emptied = false;
    while tokio::time::Instant::now() < deadline {
        if queues_empty(plan, &shared.client).await {
            empty_rounds += 1;
            // Twice in a row, a second apart: a job released or expiring in between shows.
            if empty_rounds == 2 {
                emptied = true;
                break;
            }
        } else {
            empty_rounds = 0;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    shared.running.store(false, Ordering::Relaxed);
    join_bounded(workers, Duration::from_secs(20)).await;
    emptied
}

fn plan_seed(base: Option<&u64>, i: u64) -> u64 {
    base.copied().unwrap_or(0) ^ (0xd1a1_0000 + i)
}

async fn queues_empty(plan: &Plan, client: &Client) -> bool {
    for q in &plan.workload.queues {
        let mut answered = false;
        for n in 0..client.len() {
            if let Ok(v) = client.get_json(n, &format!("/api/{NAMESPACE}/{q}/stats")).await {
                let pending: u64 =
                    ["delayed", "ready", "reserved"].iter().filter_map(|k| v[*k].as_u64()).sum();
                if pending > 0 {
                    return false;
                }
                answered = true;
                break;
            }
        }
        if !answered {
            return false;
        }
    }
    true
}

/// Records every dead job's body as a `DeadLetter` operation (property (a) counts them as
/// delivered), paging by purging what was read.
async fn read_dead_letter(plan: &Plan, shared: &Shared) {
    for q in &plan.workload.queues {
        for _ in 0..100 {
            let invoke = shared.recorder.now_ms();
            let path = format!("/api/{NAMESPACE}/{q}/deadletter/jobs?limit=1000");
            let Some(v) = first_ok(&shared.client, Method::GET, &path).await else {
                shared.recorder.record(
                    0,
                    invoke,
                    Outcome::Unknown,
                    Call::DeadLetter { bodies: vec![] },
                );
                break;
            };
            let bodies: Vec<String> = v["jobs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|j| j["data"].as_str())
                .filter_map(|d| {
                    use base64::Engine;
                    base64::engine::general_purpose::STANDARD.decode(d).ok()
                })
                .filter_map(|b| String::from_utf8(b).ok())
                .collect();
            let read = bodies.len();
            shared.recorder.record(0, invoke, Outcome::Ok, Call::DeadLetter { bodies });
            if v["size"].as_u64().unwrap_or(0) <= read as u64 || read == 0 {
                break;
            }
            let purge = format!("/api/{NAMESPACE}/{q}/deadletter?limit={read}");
            if first_ok(&shared.client, Method::DELETE, &purge).await.is_none() {
                break;
            }
        }
    }
}

async fn first_ok(client: &Client, method: Method, path: &str) -> Option<Value> {
    for n in 0..client.len() {
        if let Ok(v) = client.admin(n, method.clone(), path).await {
            return Some(v);
        }
    }
    None
}

/// Waits for every node to report the same applied index and digest; returns what each
/// reported last (`None` index when it never answered).
async fn converge(
    client: &Client,
    nodes: &[crate::backend::NodeInfo],
    limit: Duration,
) -> Vec<(u64, Option<u64>, String)> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let mut seen = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            match client.get_json(i, "/admin/digest").await {
                Ok(v) => seen.push((
                    n.id,
                    v["applied_index"].as_u64(),
                    v["digest"].as_str().unwrap_or_default().to_string(),
                )),
                Err(e) => seen.push((n.id, None, format!("unreachable: {e}"))),
            }
        }
        if checker::check_convergence(&seen).is_empty() || tokio::time::Instant::now() >= deadline {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[derive(Serialize, Default)]
struct Counts {
    total: usize,
    ok: usize,
    fail: usize,
    unknown: usize,
    publishes: usize,
    deliveries: usize,
    acks_ok: usize,
    stale_acks_refused: usize,
    releases: usize,
}

fn op_counts(history: &[crate::history::Op]) -> Counts {
    let mut c = Counts { total: history.len(), ..Counts::default() };
    for op in history {
        match op.outcome {
            Outcome::Ok => c.ok += 1,
            Outcome::Fail => c.fail += 1,
            Outcome::Unknown => c.unknown += 1,
        }
        match &op.call {
            Call::Publish { .. } => c.publishes += 1,
            Call::Reserve { got, .. } => c.deliveries += got.len(),
            Call::Ack { .. } if op.outcome == Outcome::Ok => c.acks_ok += 1,
            Call::Ack { .. } if op.outcome == Outcome::Fail => c.stale_acks_refused += 1,
            Call::Release { .. } => c.releases += 1,
            _ => {}
        }
    }
    c
}

fn summary_text(
    plan: &Plan,
    verdict: Verdict,
    c: &Counts,
    windows: &[crate::plan::FaultWindow],
    report: &checker::Report,
    convergence: &[(u64, Option<u64>, String)],
    problems: &[String],
) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "# delayd jepsen run, seed {}", plan.seed);
    let _ = writeln!(s, "\nverdict: **{verdict:?}** (exit {})", verdict.exit_code());
    let _ = writeln!(
        s,
        "\noperations: {} ({} ok, {} fail, {} unknown); publishes {}, deliveries {}, acks {}, \
         refused acks {}, releases {}",
        c.total,
        c.ok,
        c.fail,
        c.unknown,
        c.publishes,
        c.deliveries,
        c.acks_ok,
        c.stale_acks_refused,
        c.releases
    );
    let _ = writeln!(
        s,
        "published ok {}, recovered (unknown but delivered) {}, redeliveries {}",
        report.published_ok, report.recovered, report.redeliveries
    );
    let _ = writeln!(s, "\nfaults ({}):", windows.len());
    for w in windows {
        let _ = writeln!(
            s,
            "- {:>6.1}s–{:>6.1}s {:<16} nodes {:?} {}",
            w.start_ms as f64 / 1000.0,
            w.end_ms as f64 / 1000.0,
            w.kind.name(),
            w.nodes,
            w.detail
        );
    }
    let _ = writeln!(s, "\nanomalies: {}", report.anomalies.len());
    for a in report.anomalies.iter().take(50) {
        let _ = writeln!(s, "- {}", serde_json::to_string(a).unwrap_or_default());
    }
    let _ = writeln!(s, "\nconvergence (node, applied, digest): {convergence:?}");
    if !problems.is_empty() {
        let _ = writeln!(s, "\nproblems: {problems:?}");
    }
    s
}

fn write_json(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
