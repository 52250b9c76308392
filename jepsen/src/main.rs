//! `delayd-jepsen`: run chaos tests against a three-node delayd cluster.
//!
//! ```text
//! delayd-jepsen                          # CI mode, docker backend, random seed
//! delayd-jepsen --seed 42                # the same plan again
//! delayd-jepsen --long --time-limit 900 --test-count 2
//! delayd-jepsen --backend local          # local processes (netns partitions when root)
//! delayd-jepsen check RUN_DIR            # re-check a recorded history
//! delayd-jepsen failover --bin target/debug/delayd --trials 10   # failover figures
//! ```
//!
//! Exit code: 0 every run valid, 1 an anomaly was found, 2 a run could not be judged.
//!
//! `failover` measures instead of checking a history (see [`delayd_jepsen::failover`] and
//! `docs/failover.md`): for each scenario (`--scenario kill-leader,term-leader,pause-follower,
//! partition-follower`, all by default) it runs `--trials` trials, each on a fresh three-node
//! cluster, under a light publish load through every node, printing per-trial figures,
//! a summary line per scenario and a final markdown table. Its exit code: 1 if any
//! acknowledged publish was lost, 2 if something could not be measured or checked, else 0.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use delayd_jepsen::failover::{self, Scenario};
use delayd_jepsen::run::{self, BackendKind, Options, Verdict};

/// Chaos tests for delayd: a seeded workload under a nemesis, checked afterwards.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Where the cluster runs.
    #[arg(long, value_enum, default_value = "docker")]
    backend: BackendKind,
    /// The seed of the first run (default: random, printed first). Later runs of
    /// `--test-count` use seed+1, seed+2, ...
    #[arg(long)]
    seed: Option<u64>,
    /// Long mode: every fault kind, membership changes included, at random for the whole
    /// time limit. Without it: CI mode, each fault kind once (about two minutes of faults).
    #[arg(long)]
    long: bool,
    /// Seconds of workload per run (CI mode: at most).
    #[arg(long, default_value_t = 600)]
    time_limit: u64,
    /// How many runs.
    #[arg(long, default_value_t = 1)]
    test_count: u32,
    /// Directory for the runs' files.
    #[arg(long, default_value = "jepsen/runs")]
    out: PathBuf,
    /// The delayd binary (local backend).
    #[arg(long, default_value = "target/debug/delayd")]
    bin: PathBuf,
    /// Seconds allowed for recovery and drain before a run counts as unknown.
    #[arg(long, default_value_t = 90)]
    drain_limit: u64,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Re-check a run directory's history.jsonl and faults.json without running anything.
    Check {
        /// A run directory (the one holding history.jsonl).
        dir: PathBuf,
        /// Early/lease tolerance in ms (default: the plan's largest clock offset + 10).
        #[arg(long)]
        tolerance_ms: Option<u64>,
    },
    /// Measure failover from outside: leader kill and SIGTERM, follower pause and partition,
    /// under a light publish load; every acknowledged publish is checked afterwards.
    Failover(FailoverArgs),
}

#[derive(clap::Args, Debug)]
struct FailoverArgs {
    /// Where the cluster runs (local: processes running --bin, in network namespaces when
    /// root; docker: compose project delayd-failover running --image, see
    /// scripts/docker-image.sh).
    #[arg(long, value_enum, default_value = "local")]
    backend: BackendKind,
    /// Trials per scenario.
    #[arg(long, default_value_t = 10)]
    trials: u32,
    /// The delayd binary (local backend).
    #[arg(long, default_value = "target/debug/delayd")]
    bin: PathBuf,
    /// The image the docker backend runs: tag a build's image (`docker tag delayd:local
    /// delayd:mine`) so that a later scripts/docker-image.sh elsewhere does not change it.
    #[arg(long, default_value = delayd_jepsen::backend::docker::IMAGE)]
    image: String,
    /// Scenarios to run, comma-separated or repeated (default: all, in this order).
    #[arg(long, value_enum, value_delimiter = ',')]
    scenario: Vec<Scenario>,
    /// Directory under which the measurement's directory (results.json, summary.md, node
    /// logs) is made.
    #[arg(long, default_value = "jepsen/runs")]
    out: PathBuf,
    /// Each publisher's pause after every publish attempt, in ms.
    #[arg(long, default_value_t = 10)]
    pause_ms: u64,
    /// Each publish's client-side timeout, in ms.
    #[arg(long, default_value_t = 1000)]
    publish_timeout_ms: u64,
    /// Keep one cluster per scenario, healed and restarted between trials, instead of a fresh
    /// cluster per trial (then trials are not independent: the nodes' Raft state carries over).
    #[arg(long)]
    reuse_cluster: bool,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let code = match &args.command {
        Some(Command::Check { dir, tolerance_ms }) => match recheck(dir, *tolerance_ms) {
            Ok(v) => v.exit_code(),
            Err(e) => {
                eprintln!("error: {e:#}");
                2
            }
        },
        Some(Command::Failover(f)) => failover(f).await,
        None => runs(&args).await,
    };
    std::process::exit(code);
}

async fn runs(args: &Args) -> i32 {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let opts = Options {
        backend: args.backend,
        long: args.long,
        time_limit: Duration::from_secs(args.time_limit),
        out: args.out.clone(),
        repo,
        bin: args.bin.clone(),
        drain_limit: Duration::from_secs(args.drain_limit),
    };
    let first = args.seed.unwrap_or_else(rand::random);
    let mut worst = Verdict::Valid;
    for i in 0..args.test_count.max(1) {
        let seed = first.wrapping_add(i.into());
        // A hard bound on the whole run: workload, recovery, drain, convergence and files.
        let limit = opts.time_limit + opts.drain_limit + Duration::from_secs(180);
        let verdict = tokio::select! {
            r = tokio::time::timeout(limit, run::run_once(&opts, seed)) => match r {
                Ok(Ok(v)) => v,
                Ok(Err(e)) => {
                    eprintln!("seed {seed}: run failed: {e:#}");
                    Verdict::Unknown
                }
                Err(_) => {
                    eprintln!("seed {seed}: run exceeded its hard limit of {}s", limit.as_secs());
                    Verdict::Unknown
                }
            },
            // Dropping the run future drops its teardown guard: containers, processes and
            // namespaces go away before we exit.
            _ = interrupted() => {
                eprintln!("interrupted; torn down");
                return 2;
            }
        };
        worst = worst.max(verdict);
    }
    worst.exit_code()
}

async fn failover(args: &FailoverArgs) -> i32 {
    let opts = failover::Options {
        backend: args.backend,
        trials: args.trials.max(1),
        bin: args.bin.clone(),
        image: args.image.clone(),
        repo: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."),
        out: args.out.clone(),
        scenarios: if args.scenario.is_empty() {
            Scenario::ALL.to_vec()
        } else {
            args.scenario.clone()
        },
        pause: Duration::from_millis(args.pause_ms),
        publish_timeout: Duration::from_millis(args.publish_timeout_ms.max(1)),
        reuse_cluster: args.reuse_cluster,
    };
    tokio::select! {
        r = failover::run(&opts) => match r {
            Ok(report) => report.exit_code(),
            Err(e) => {
                eprintln!("error: {e:#}");
                2
            }
        },
        // Dropping the measurement drops its teardown guard: the cluster goes away.
        _ = interrupted() => {
            eprintln!("interrupted; torn down");
            2
        }
    }
}

async fn interrupted() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

fn recheck(dir: &std::path::Path, tolerance_ms: Option<u64>) -> anyhow::Result<Verdict> {
    use anyhow::Context;
    let text = std::fs::read_to_string(dir.join("history.jsonl")).context("history.jsonl")?;
    let history = delayd_jepsen::history::parse(&text)?;
    let tolerance_ms = match tolerance_ms {
        Some(t) => t,
        None => {
            let plan: delayd_jepsen::plan::Plan =
                serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json"))?)?;
            plan.tolerance_ms()
        }
    };
    let report = delayd_jepsen::checker::check(&history, tolerance_ms);
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(if report.anomalies.is_empty() { Verdict::Valid } else { Verdict::Invalid })
}
