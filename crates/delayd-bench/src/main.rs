//! `delayd-bench`: delayd's benchmark suite, side by side with beanstalkd and lmstfy's Redis
//! data path.
//!
//! It starts its own delayd clusters (1 and/or 3 nodes, fresh temp data dirs, loopback ports)
//! or targets given addresses, runs the workloads in [`workloads`] (and through Disque's
//! protocol, [`disque`]) against each, optionally
//! runs the same publish and drain workloads against beanstalkd processes it starts itself
//! ([`beanstalk`]) and publish, drain, lifecycle and timer against lmstfy's Redis commands on
//! a redis-server it starts ([`lmstfy`]), and prints a table plus the ratios delayd / peer.
//! With `--compare-bin` it runs two delayd builds in alternating pairs and compares them row
//! by row ([`compare`]).
//! Absolute figures on a shared 2-core machine move from run to run; ratios measured in the
//! same run move much less, which is why the comparison is built in rather than taken from a
//! table elsewhere. Every row also carries the servers' CPU time per job and the bench's own
//! CPU share (see [`stats::CpuMeter`]), so that a run starved by its own load generator shows.
//!
//! Exit status: 0 when every workload ran, 1 when the timer saw an early delivery (a
//! correctness failure, whatever else happened), 2 when a workload failed, 130 on Ctrl-C.
//! Every process started is killed on the way out, including on Ctrl-C.

mod beanstalk;
mod cluster;
mod compare;
mod conn;
mod disque;
mod lmstfy;
mod machine;
mod procstat;
mod progress;
mod report;
mod settle;
mod stats;
mod workloads;

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Result};
use clap::Parser;
use serde_json::json;

use crate::cluster::Cluster;
use crate::stats::{CpuMeter, Row, Status};
use crate::workloads::{Ctx, Opts, RESERVE_COUNT};

/// Every workload, in the order they run. `failover` restarts the node it kills, and
/// `storage` runs last because it leaves millions of jobs behind.
const WORKLOADS: [&str; 17] = [
    "publish-http",
    "publish-bulk",
    "publish-grpc-stream",
    "drain",
    "drain-lease",
    "drain-ackfirst",
    "drain-count10",
    "drain-count10-ackfirst",
    "lifecycle",
    "timer",
    "timer-ackfirst",
    "timer-count10-ackfirst",
    "disque-add",
    "disque-drain",
    "publish-latency",
    "failover",
    "storage",
];

/// The workloads run once per `--clients` level (the rest run at the largest level).
const PER_LEVEL: [&str; 6] = [
    "publish-http",
    "drain",
    "drain-lease",
    "drain-ackfirst",
    "drain-count10",
    "drain-count10-ackfirst",
];

/// Workloads without a client count: open-loop publishing, and failover's fixed publishers.
const NO_CLIENTS: [&str; 2] = ["publish-latency", "failover"];

/// delayd's benchmark suite: starts its own cluster(s) (or targets given ones), runs the
/// workloads, optionally beanstalkd side by side, and prints a table, JSON and a report.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Cluster sizes to start and measure, one after the other (e.g. `1,3`).
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    nodes: Vec<usize>,
    /// Measure running nodes instead of starting any: their HTTP base URLs, comma-separated.
    /// `storage` and `failover` are skipped (they need the processes).
    #[arg(long, value_delimiter = ',')]
    target: Vec<String>,
    /// With --target: the token every request shows (the admin token, or a token of the
    /// bench's namespaces); the clusters the bench starts run with --dev and need none
    /// (unless --auth).
    #[arg(long, env = "DELAYD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Start the clusters with authentication on (no --dev): the nodes generate a shared
    /// admin token, and every request shows it.
    #[arg(long)]
    auth: bool,
    /// The namespace the workloads use (default: a fresh `bench<unix time>` per run, so runs
    /// against a target never mix); give it to measure with a namespace token.
    #[arg(long)]
    namespace: Option<String>,
    /// The delayd binary (default: target/release/delayd if it exists, else target/debug).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Compare two builds: run the delayd workloads with `--bin` (A) and with this binary (B)
    /// in `--pairs` pairs of runs on fresh clusters, A B then B A and so on, and print B ÷ A
    /// per row (see `compare.rs`). A wrapper script that sets an environment variable and runs
    /// a binary works as either side.
    #[arg(long)]
    compare_bin: Option<PathBuf>,
    /// Pairs of runs with `--compare-bin`.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=100))]
    pairs: u64,
    /// Runs every selected system and workload this many times over, in the same order each
    /// round, and gives every ratio to a peer per round (within the round) and its median and
    /// range over the rounds. One run on a shared machine can move a ratio by half from one
    /// half hour to the next.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=20))]
    rounds: u64,
    /// Workloads to run, comma-separated (default: all).
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(WORKLOADS))]
    workloads: Vec<String>,
    /// Concurrent clients (connections) per workload: a list runs publish-http, the drains
    /// and the peers' publish and drain once per level (e.g. `1,16,64`), and every other
    /// workload at the largest.
    #[arg(long, value_delimiter = ',', default_value = "64")]
    clients: Vec<usize>,
    /// Stop each closed-loop publish workload after this many jobs (default: time only).
    #[arg(long)]
    jobs: Option<u64>,
    /// Seconds each closed-loop publish workload runs (unless --jobs ends it first).
    #[arg(long, default_value_t = 10.0)]
    secs: f64,
    /// Delay of jobs published by the publish workloads, ms: long, so they never come due
    /// while later workloads run.
    #[arg(long, default_value_t = 3_600_000)]
    publish_delay_ms: u64,
    /// Ready jobs preloaded and then reserved + acked by `drain`.
    #[arg(long, default_value_t = 50_000)]
    drain_jobs: u64,
    /// Seconds of `lifecycle`.
    #[arg(long, default_value_t = 10.0)]
    lifecycle_secs: f64,
    /// Jobs coming due per second in `timer`.
    #[arg(long, default_value_t = 5_000)]
    timer_rate: u64,
    /// Seconds over which `timer` jobs come due.
    #[arg(long, default_value_t = 10.0)]
    timer_secs: f64,
    /// How long before its due time each `timer` job is published, ms.
    #[arg(long, default_value_t = 2_000)]
    timer_lead_ms: u64,
    /// Write every timer delivery's due time (Unix ms) and lateness (ms) to a CSV file in
    /// this directory, one file per run, to line the late ones up with the servers' own
    /// logs and samples.
    #[arg(long)]
    timer_trace: Option<PathBuf>,
    /// Offered publishes per second in `publish-latency` (open loop).
    #[arg(long, default_value_t = 5_000)]
    latency_rate: u64,
    /// Seconds of `publish-latency`.
    #[arg(long, default_value_t = 10.0)]
    latency_secs: f64,
    /// Cumulative stored delayed jobs at which `storage` reads RSS and disk.
    #[arg(long, value_delimiter = ',', default_value = "1000000,10000000")]
    storage_jobs: Vec<u64>,
    /// Publishes per second of the background load in `failover`.
    #[arg(long, default_value_t = 200)]
    failover_rate: u64,
    /// Also run the publish and drain workloads against beanstalkd (-f0 and default modes).
    #[arg(long)]
    beanstalkd: bool,
    /// The beanstalkd binary (default: `beanstalkd` on PATH).
    #[arg(long)]
    beanstalkd_bin: Option<PathBuf>,
    /// Also run publish, drain, lifecycle and timer against lmstfy's Redis data path (the
    /// Redis commands lmstfy issues, on a redis-server with appendfsync always).
    #[arg(long)]
    lmstfy_redis: bool,
    /// The redis-server binary (default: `redis-server` on PATH).
    #[arg(long)]
    redis_server_bin: Option<PathBuf>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write report.md and SVG charts into this directory.
    #[arg(long)]
    report: Option<PathBuf>,
    /// A few-seconds run of every workload (1 node, tiny counts) for CI: checks that each
    /// runs and that no job is delivered early; no timing is judged.
    #[arg(long)]
    smoke: bool,
    /// Keep this many processes spinning at the bench's own CPU priority (the default, unless
    /// the bench was started niced) while every system runs: a machine whose cores other work
    /// holds, as a host shared with other services or a build does. The peers run under the
    /// same load, and the machine is read before they start.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=64))]
    cpu_hogs: u64,
    /// Send every client to the leader instead of spreading them over the nodes: how clients
    /// behind a load balancer that checks `/ready?role=leader` reach a cluster. Followers
    /// then forward nothing. The rows are labelled "via the leader".
    #[arg(long)]
    via_leader: bool,
}

impl Args {
    /// Shrinks everything for `--smoke`.
    fn apply_smoke(&mut self) {
        self.nodes = vec![1];
        self.clients = self.clients.iter().map(|c| (*c).min(8)).collect();
        self.jobs = None;
        self.secs = 1.0;
        self.drain_jobs = 256;
        self.lifecycle_secs = 1.0;
        self.timer_rate = 200;
        self.timer_secs = 2.0;
        self.timer_lead_ms = 1_000;
        self.latency_rate = 200;
        self.latency_secs = 1.0;
        self.storage_jobs = vec![1_024, 2_048];
    }

    /// The client levels, ascending, without repeats; at least one.
    fn levels(&self) -> Vec<usize> {
        let mut levels: Vec<usize> = self.clients.iter().map(|c| (*c).max(1)).collect();
        levels.sort_unstable();
        levels.dedup();
        if levels.is_empty() {
            levels.push(64);
        }
        levels
    }

    /// The workload parameters, at the largest client level.
    fn opts(&self) -> Opts {
        Opts {
            clients: self.levels().last().copied().unwrap_or(64),
            jobs: self.jobs,
            secs: self.secs,
            publish_delay_ms: self.publish_delay_ms,
            drain_jobs: self.drain_jobs,
            lifecycle_secs: self.lifecycle_secs,
            timer_rate: self.timer_rate,
            timer_secs: self.timer_secs,
            timer_lead_ms: self.timer_lead_ms,
            timer_trace: self.timer_trace.clone(),
            latency_rate: self.latency_rate,
            latency_secs: self.latency_secs,
            storage_jobs: self.storage_jobs.clone(),
            failover_rate: self.failover_rate,
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.smoke {
        args.apply_smoke();
    }
    // Ctrl-C drops `run`, and with it every process guard, which kills the processes.
    tokio::select! {
        r = run(args) => match r {
            Ok(code) => code,
            Err(e) => {
                eprintln!("delayd-bench: {e:#}");
                ExitCode::from(2)
            }
        },
        _ = tokio::signal::ctrl_c() => {
            eprintln!("delayd-bench: interrupted; stopping every process it started");
            ExitCode::from(130)
        }
    }
}

/// Prints a row as soon as it is measured (above any progress bar) and keeps it.
fn emit(rows: &mut Vec<Row>, row: Row) {
    progress::println(&report::table_row(&row));
    rows.push(row);
}

async fn run(args: Args) -> Result<ExitCode> {
    let opts = args.opts();
    let selected: Vec<&str> = if args.workloads.is_empty() {
        WORKLOADS.to_vec()
    } else {
        WORKLOADS.iter().copied().filter(|w| args.workloads.iter().any(|a| a == w)).collect()
    };
    let bin = args.bin.clone().unwrap_or_else(cluster::default_bin);
    let started = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let ns = args.namespace.clone().unwrap_or_else(|| format!("bench{started}"));
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    if args.target.is_empty() && !bin.exists() {
        bail!("{} not found: build it (cargo build -p delayd) or pass --bin", bin.display());
    }
    let profile = build_profile(&bin);
    eprintln!(
        "delayd-bench: {} ({profile} build), {cpus} CPUs{}",
        bin.display(),
        match profile {
            "debug" => "; a debug build: figures are not representative",
            "unknown" => "; only a release build gives representative figures",
            _ => "",
        }
    );

    // Read before anything starts, in the file system the clusters' data goes to.
    let machine = machine::probe(&std::env::temp_dir())?;
    eprintln!("delayd-bench: machine: {machine}");

    let _hogs = machine::CpuHogs::start(args.cpu_hogs)?;
    if args.cpu_hogs > 0 {
        eprintln!("delayd-bench: {} CPU hogs spin throughout the run", args.cpu_hogs);
    }

    let compare_bin = match &args.compare_bin {
        Some(_) if !args.target.is_empty() => {
            bail!("--compare-bin starts the clusters of both builds itself: drop --target")
        }
        Some(b) if !b.exists() => bail!("{} not found (--compare-bin)", b.display()),
        other => other.clone(),
    };

    if args.rounds > 1 && compare_bin.is_some() {
        bail!("--rounds with --compare-bin: the pairs already repeat the runs; give one of them");
    }
    let rounds = usize::try_from(args.rounds).unwrap_or(1);

    let mut rows = Vec::new();
    let mut ratios = Vec::new();
    println!("{}", report::table_header());
    let levels = args.levels();
    let delayd = Delayd { args: &args, opts: &opts, selected: &selected, levels: &levels, ns: &ns };
    for round in 1..=rounds {
        let first = rows.len();
        if rounds > 1 {
            println!("round {round} of {rounds}");
        }
        match &compare_bin {
            None => delayd.run(&bin, None, &mut rows).await,
            Some(other) => {
                for pair in 1..=usize::try_from(args.pairs).unwrap_or(1) {
                    for side in compare::order(pair) {
                        let side_bin = if side == 'A' { &bin } else { other };
                        let label = compare::label(side, pair);
                        delayd.run(side_bin, Some(&label), &mut rows).await;
                    }
                }
            }
        }
        if args.beanstalkd {
            run_beanstalkd(&args, &opts, &levels, &selected, &mut rows).await;
        }
        if args.lmstfy_redis {
            run_lmstfy(&args, &opts, &levels, &selected, &mut rows).await;
        }
        // Ratios within the round only: its systems ran side by side.
        if rounds > 1 {
            let label = report::round_label(round);
            rows[first..].iter_mut().for_each(|r| r.system = labelled(&r.system, Some(&label)));
        }
        ratios.extend(report::ratios(&rows[first..]));
    }

    if !ratios.is_empty() {
        println!("\n{}", report::ratio_table(&ratios));
    }
    let over_rounds = if rounds > 1 { report::over_rounds(&ratios) } else { Vec::new() };
    if !over_rounds.is_empty() {
        println!("\n{}", report::over_rounds_table(&over_rounds));
    }
    let comparisons = compare::compare(&rows);
    if let Some(other) = &compare_bin {
        println!("\nA: {}\nB: {}\n", bin.display(), other.display());
        println!("{}", compare::table(&comparisons));
    }
    let meta = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "cpus": cpus,
        "machine": machine,
        "delayd_bin": bin.display().to_string(),
        "delayd_profile": profile,
        "compare_bin": compare_bin.as_ref().map(|b| b.display().to_string()),
        "comparison": comparisons,
        "rounds": rounds,
        "ratios_over_rounds": over_rounds,
        "started_unix_s": started,
        "smoke": args.smoke,
        "client_levels": levels,
        "auth": args.auth,
        "cpu_hogs": args.cpu_hogs,
        "opts": format!("{opts:?}"),
    });
    if let Some(path) = &args.json {
        report::write_json(path, &meta, &rows, &ratios)?;
        eprintln!("delayd-bench: wrote {}", path.display());
    }
    if let Some(dir) = &args.report {
        report::write_report(dir, &meta, &rows, &ratios, &over_rounds)?;
        eprintln!("delayd-bench: wrote {}/report.md", dir.display());
    }

    let early: u64 = rows.iter().filter_map(|r| r.early).sum();
    if early > 0 {
        eprintln!("delayd-bench: {early} EARLY DELIVERIES");
        return Ok(ExitCode::from(1));
    }
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| r.status == Status::Failed)
        .map(|r| format!("{} / {}", r.system, r.workload))
        .collect();
    if !failed.is_empty() {
        eprintln!("delayd-bench: failed: {}", failed.join(", "));
        return Ok(ExitCode::from(2));
    }
    Ok(ExitCode::SUCCESS)
}

/// What every delayd run of one invocation shares.
struct Delayd<'a> {
    args: &'a Args,
    opts: &'a Opts,
    selected: &'a [&'a str],
    levels: &'a [usize],
    ns: &'a str,
}

impl Delayd<'_> {
    /// Runs the selected workloads on each cluster size with `bin`, the rows' system names
    /// ending in `label` when there is one.
    async fn run(&self, bin: &std::path::Path, label: Option<&str>, rows: &mut Vec<Row>) {
        let args = self.args;
        let sizes: Vec<Option<usize>> = if args.target.is_empty() {
            args.nodes.iter().map(|n| Some(*n)).collect()
        } else {
            vec![None]
        };
        for size in sizes {
            self.run_size(bin, size, label, rows).await;
        }
    }

    async fn run_size(
        &self,
        bin: &std::path::Path,
        size: Option<usize>,
        label: Option<&str>,
        rows: &mut Vec<Row>,
    ) {
        let (args, opts, ns) = (self.args, self.opts, self.ns);
        let started_cluster = match size {
            Some(n) => Cluster::start(bin, n, args.auth).await,
            None => Ok(Cluster::target(args.target.clone(), args.token.clone())),
        };
        let mut cluster = match started_cluster {
            Ok(c) => c,
            Err(e) => {
                let name = labelled(&format!("delayd {} nodes", size.unwrap_or(0)), label);
                emit(rows, Row::failed(&name, "start", &e));
                return;
            }
        };
        if args.via_leader && cluster.urls.len() > 1 {
            if let Err(e) = cluster.steer_to_leader().await {
                emit(rows, Row::failed(&labelled(&cluster.name, label), "start", &e));
                return;
            }
        }
        // Last, after anything the cluster adds to its name ("via the leader").
        cluster.name = labelled(&cluster.name, label);
        // Built at the largest level, so its connection pool serves every level.
        let base = match Ctx::new(&cluster, opts, ns) {
            Ok(base) => base,
            Err(e) => {
                emit(rows, Row::failed(&cluster.name, "start", &e));
                return;
            }
        };
        for w in self.selected {
            for c in levels_of(w, self.levels) {
                let mut ctx = base.with_clients(c);
                let _running = progress::phase(format!("{} · {w} · {c} clients", cluster.name));
                let mut watch = LeaderWatch::begin(&mut cluster).await;
                if *w == "failover" {
                    // It kills the leader on purpose, whose CPU goes with its pid: the row
                    // names no leader and notes no change.
                    watch.leader = None;
                }
                ctx.urls = cluster.client_urls();
                ctx.cpu.start(&cluster.pids());
                let result = match *w {
                    "publish-http" => workloads::publish(&ctx, false).await.map(|r| vec![r]),
                    "publish-bulk" => workloads::publish(&ctx, true).await.map(|r| vec![r]),
                    "publish-grpc-stream" => {
                        workloads::publish_grpc_stream(&ctx).await.map(|r| vec![r])
                    }
                    "drain" => workloads::drain(&ctx, false).await.map(|r| vec![r]),
                    "drain-lease" => workloads::drain(&ctx, true).await.map(|r| vec![r]),
                    "drain-ackfirst" => workloads::drain_ackfirst(&ctx).await.map(|r| vec![r]),
                    "drain-count10" => workloads::drain_count10(&ctx).await.map(|r| vec![r]),
                    "drain-count10-ackfirst" => {
                        workloads::drain_count10_ackfirst(&ctx).await.map(|r| vec![r])
                    }
                    "lifecycle" => workloads::lifecycle(&ctx).await.map(|r| vec![r]),
                    "timer" => workloads::timer(&ctx, false, 1).await.map(|r| vec![r]),
                    "timer-ackfirst" => workloads::timer(&ctx, true, 1).await.map(|r| vec![r]),
                    "timer-count10-ackfirst" => {
                        workloads::timer(&ctx, true, RESERVE_COUNT).await.map(|r| vec![r])
                    }
                    "disque-add" => disque::add(&ctx).await.map(|r| vec![r]),
                    "disque-drain" => disque::drain(&ctx).await.map(|r| vec![r]),
                    "publish-latency" => workloads::publish_latency(&ctx).await.map(|r| vec![r]),
                    "failover" => workloads::failover(&ctx, &mut cluster).await.map(|r| vec![r]),
                    "storage" => workloads::storage(&ctx, &mut cluster).await,
                    _ => Ok(Vec::new()),
                };
                // After a failover the restarted node has a new pid: it counts from its start.
                let mut usage = ctx.cpu.finish(&cluster.pids());
                let after = settle::After::measure(&cluster.pids(), || ctx.busy()).await;
                if let Some(u) = usage.as_mut() {
                    u.name_nodes(&cluster.node_pids(), watch.leader);
                }
                let result = watch.end(&mut cluster).await.note(result);
                emit_all(rows, &cluster.name, w, c, result, usage, Some(after));
            }
        }
    }
}

/// How long the bench waits for the nodes to agree on a leader before and after a workload
/// (without one the CPU split names no leader, and the leader is not checked).
const LEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The leader of a cluster the bench started, as a workload began, and what the workload's
/// rows say of it. A leader that moved since the clients were steered to it (an election
/// under load) would have every request of a "via the leader" row forwarded; one that
/// changed during the workload changed what it measured.
#[derive(Default)]
struct LeaderWatch {
    /// `None` for a target (its URLs need not be in node-id order), a single node, or no
    /// agreed leader.
    leader: Option<u64>,
    notes: Vec<String>,
}

impl LeaderWatch {
    /// Finds the leader and sends steered clients to it if it moved.
    async fn begin(cluster: &mut Cluster) -> LeaderWatch {
        let mut watch = LeaderWatch::default();
        if cluster.node_pids().len() < 2 {
            return watch;
        }
        watch.leader = cluster.wait_leader(LEADER_TIMEOUT).await.ok();
        if let Some(l) = watch.leader {
            match cluster.follow_leader(l) {
                Ok(false) => {}
                Ok(true) => {
                    watch.notes.push(format!("the leader had moved to n{l}: clients sent there"))
                }
                Err(e) => watch.notes.push(format!("cannot follow the leader: {e:#}")),
            }
        }
        watch
    }

    /// Checks the leader again once the workload is over.
    async fn end(mut self, cluster: &mut Cluster) -> LeaderWatch {
        if let Some(was) = self.leader {
            let now = cluster.wait_leader(LEADER_TIMEOUT).await.ok();
            if now != Some(was) {
                let now = now.map_or("none".to_string(), |l| format!("n{l}"));
                self.notes.push(format!("the leader changed during the workload: n{was} → {now}"));
            }
        }
        self
    }

    /// The workload's rows with what was seen put in front of their notes.
    fn note(&self, result: Result<Vec<Row>>) -> Result<Vec<Row>> {
        result.map(|mut rows| {
            if !self.notes.is_empty() {
                rows.iter_mut().for_each(|r| r.prefix_note(self.notes.join("; ")));
            }
            rows
        })
    }
}

/// `name` with ` label` at its end, when there is a label.
fn labelled(name: &str, label: Option<&str>) -> String {
    match label {
        Some(label) => format!("{name} {label}"),
        None => name.to_owned(),
    }
}

/// The client levels workload `w` runs at: each one, or only the largest.
fn levels_of(w: &str, levels: &[usize]) -> Vec<usize> {
    if PER_LEVEL.contains(&w) {
        levels.to_vec()
    } else {
        levels.last().copied().into_iter().collect()
    }
}

/// Fills in the client level and CPU figures of a workload's rows (or makes a failed row of
/// its error) and emits them.
fn emit_all(
    rows: &mut Vec<Row>,
    system: &str,
    workload: &str,
    clients: usize,
    result: Result<Vec<Row>>,
    usage: Option<stats::CpuUsage>,
    after: Option<settle::After>,
) {
    let mut out = result.unwrap_or_else(|e| vec![Row::failed(system, workload, &e)]);
    if let Some(u) = usage {
        u.apply(&mut out);
    }
    if let Some(a) = after {
        a.apply(&mut out);
    }
    for mut r in out {
        if !NO_CLIENTS.contains(&workload) {
            r.clients = Some(clients);
        }
        emit(rows, r);
    }
}

/// The cargo profile `bin` was built with, told by its place in a target directory
/// (`…/release/…` or `…/debug/…`); "unknown" for a binary copied elsewhere.
fn build_profile(bin: &std::path::Path) -> &'static str {
    let names: Vec<_> = bin.components().map(|c| c.as_os_str().to_string_lossy()).collect();
    if names.iter().any(|n| n == "release") {
        "release"
    } else if names.iter().any(|n| n == "debug") {
        "debug"
    } else {
        "unknown"
    }
}

/// What a peer's workload measured: its rows, the CPU over it, and the CPU after it.
type Measured = (Result<Vec<Row>>, Option<stats::CpuUsage>, Option<settle::After>);

/// Runs a peer's workload between two CPU readings of its server process `pid`, then waits
/// while `busy` says the server is still doing work the workload left behind.
async fn measured<F, B, Fut>(cpu: &CpuMeter, pid: Option<u32>, work: F, busy: B) -> Measured
where
    F: Future<Output = Result<Row>>,
    B: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<bool>>>,
{
    let pids: Vec<u32> = pid.into_iter().collect();
    cpu.start(&pids);
    let result = work.await.map(|r| vec![r]);
    let usage = cpu.finish(&pids);
    (result, usage, Some(settle::After::measure(&pids, busy).await))
}

/// beanstalkd leaves nothing behind: its binlog is written and synced as each command runs.
async fn never_busy() -> Result<Option<bool>> {
    Ok(Some(false))
}

/// A failed row for a peer whose server binary is missing.
fn not_installed(system: &str, binary: &str, package: &str) -> Row {
    let mut row = Row::new(system, "all", Status::Failed);
    row.note = format!("{binary} not found on PATH (apt-get install -y {package})");
    row
}

/// beanstalkd's publish and drain, in both durability modes, each on a fresh process.
async fn run_beanstalkd(
    args: &Args,
    opts: &Opts,
    levels: &[usize],
    selected: &[&str],
    rows: &mut Vec<Row>,
) {
    let Some(bin) = args.beanstalkd_bin.clone().or_else(beanstalk::find_binary) else {
        emit(rows, not_installed("beanstalkd", "beanstalkd", "beanstalkd"));
        return;
    };
    let publish = selected.iter().any(|w| w.starts_with("publish"));
    let drain = selected.iter().any(|w| w.starts_with("drain"));
    let cpu = CpuMeter::default();
    for mode in beanstalk::Mode::ALL {
        let server = match beanstalk::Server::start(&bin, mode).await {
            Ok(s) => s,
            Err(e) => {
                emit(rows, Row::failed(mode.label(), "start", &e));
                continue;
            }
        };
        let pid = server.pid();
        for &c in levels.iter().filter(|_| publish) {
            let opts = Opts { clients: c, ..opts.clone() };
            let _running = progress::phase(format!("{} · publish · {c} clients", mode.label()));
            let publish = beanstalk::publish(&server, &opts);
            let (result, usage, after) = measured(&cpu, pid, publish, never_busy).await;
            emit_all(rows, mode.label(), "publish", c, result, usage, after);
        }
        for &c in levels.iter().filter(|_| drain) {
            let opts = Opts { clients: c, ..opts.clone() };
            let _running = progress::phase(format!("{} · drain · {c} clients", mode.label()));
            let drain = beanstalk::drain(&server, &opts, &cpu);
            let (result, usage, after) = measured(&cpu, pid, drain, never_busy).await;
            emit_all(rows, mode.label(), "drain", c, result, usage, after);
        }
    }
}

/// lmstfy's Redis data path: publish and drain at every client level, lifecycle and timer at
/// the largest, all on one redis-server.
async fn run_lmstfy(
    args: &Args,
    opts: &Opts,
    levels: &[usize],
    selected: &[&str],
    rows: &mut Vec<Row>,
) {
    let system = lmstfy::SYSTEM;
    let Some(bin) = args.redis_server_bin.clone().or_else(lmstfy::find_binary) else {
        emit(rows, not_installed(system, "redis-server", "redis-server"));
        return;
    };
    let server = match lmstfy::Server::start(&bin).await {
        Ok(s) => s,
        Err(e) => {
            emit(rows, Row::failed(system, "start", &e));
            return;
        }
    };
    let cpu = CpuMeter::default();
    let runs = [
        ("publish", selected.iter().any(|w| w.starts_with("publish"))),
        ("drain", selected.iter().any(|w| w.starts_with("drain"))),
        ("lifecycle", selected.contains(&"lifecycle")),
        ("timer", selected.iter().any(|w| w.starts_with("timer"))),
    ];
    for (w, on) in runs {
        let at: Vec<usize> = match w {
            "publish" | "drain" => levels.to_vec(),
            _ => levels.last().copied().into_iter().collect(),
        };
        for &c in at.iter().filter(|_| on) {
            let opts = Opts { clients: c, ..opts.clone() };
            let pid = server.pid();
            let _running = progress::phase(format!("{system} · {w} · {c} clients"));
            let busy = || server.rewriting();
            let (result, usage, after) = match w {
                "publish" => measured(&cpu, pid, lmstfy::publish(&server, &opts), busy).await,
                "drain" => measured(&cpu, pid, lmstfy::drain(&server, &opts, &cpu), busy).await,
                "lifecycle" => measured(&cpu, pid, lmstfy::lifecycle(&server, &opts), busy).await,
                _ => measured(&cpu, pid, lmstfy::timer(&server, &opts), busy).await,
            };
            emit_all(rows, system, w, c, result, usage, after);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_profile_comes_from_the_binarys_target_directory() {
        let profile = |p: &str| build_profile(std::path::Path::new(p));
        assert_eq!(profile("target/release/delayd"), "release");
        assert_eq!(profile("/work/target/debug/delayd"), "debug");
        // A copy elsewhere says nothing about how it was built, nor does a name that only
        // contains the word.
        assert_eq!(profile("/tmp/base/delayd"), "unknown");
        assert_eq!(profile("/opt/debugger/delayd"), "unknown");
    }
}
