//! CI's smoke run of the benchmark suite: every workload runs for a moment against a
//! single-node `target/debug/delayd` (and beanstalkd and lmstfy's Redis data path, if
//! beanstalkd and redis-server are installed), and no job is delivered before its due time. Nothing about timing is asserted: CI machines are too noisy for that.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context, Result};
use serde_json::Value;

/// `target/<profile>/delayd`, beside this test's `delayd-bench`.
fn delayd_bin() -> Option<PathBuf> {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_delayd-bench"));
    let bin = bench.parent()?.join("delayd");
    bin.exists().then_some(bin)
}

/// Runs `cmd` and returns its standard output, failing with both outputs unless it
/// succeeded.
fn succeeded(cmd: &mut Command) -> Result<String> {
    let out = cmd.output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "{:?} failed: {}\n{stdout}\n{}",
        cmd,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// `target/<profile>/delayd`, or `None` with a line saying the test is skipped.
fn delayd_or_skip() -> Option<PathBuf> {
    let bin = delayd_bin();
    if bin.is_none() {
        eprintln!("skipped: target/debug/delayd is missing (cargo build -p delayd)");
    }
    bin
}

/// Runs `delayd-bench` with `args` against `delayd`, and returns the JSON it wrote and its
/// standard output.
fn bench_json(delayd: &Path, args: &[&str]) -> Result<(Value, String)> {
    let dir = tempfile::tempdir()?;
    let json = dir.path().join("bench.json");
    let stdout = succeeded(
        Command::new(env!("CARGO_BIN_EXE_delayd-bench"))
            .args(args)
            .arg("--bin")
            .arg(delayd)
            .arg("--json")
            .arg(&json),
    )?;
    Ok((serde_json::from_slice(&std::fs::read(&json)?)?, stdout))
}

fn beanstalkd_installed() -> bool {
    Command::new("beanstalkd").arg("-v").output().is_ok_and(|o| o.status.success())
}

fn redis_server_installed() -> bool {
    Command::new("redis-server").arg("--version").output().is_ok_and(|o| o.status.success())
}

#[test]
fn smoke_runs_every_workload_without_early_deliveries() -> Result<()> {
    let Some(delayd) = delayd_or_skip() else { return Ok(()) };
    let dir = tempfile::tempdir()?;
    let json = dir.path().join("smoke.json");
    let report = dir.path().join("report");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_delayd-bench"));
    cmd.arg("--smoke")
        .arg("--bin")
        .arg(&delayd)
        .arg("--json")
        .arg(&json)
        .arg("--report")
        .arg(&report);
    let beanstalkd = beanstalkd_installed();
    if beanstalkd {
        cmd.arg("--beanstalkd");
    } else {
        eprintln!("beanstalkd not installed: its part of the smoke is skipped");
    }
    let redis = redis_server_installed();
    if redis {
        cmd.arg("--lmstfy-redis");
    } else {
        eprintln!("redis-server not installed: the lmstfy-redis part of the smoke is skipped");
    }
    let stdout = succeeded(&mut cmd)?;

    let results: Value = serde_json::from_slice(&std::fs::read(&json)?)?;
    let rows = results["rows"].as_array().context("rows")?;
    let status = |system: &str, workload: &str| {
        rows.iter()
            .find(|r| {
                r["system"].as_str().is_some_and(|s| s.starts_with(system))
                    && r["workload"].as_str().is_some_and(|w| w.starts_with(workload))
            })
            .and_then(|r| r["status"].as_str())
            .map(str::to_string)
    };
    for w in [
        "publish-http",
        "publish-bulk",
        "drain",
        "drain-ackfirst",
        "drain-count10",
        "drain-count10-ackfirst",
        "lifecycle",
        "timer",
        "timer-ackfirst",
        "timer-count10-ackfirst",
        "publish-latency",
        "storage",
    ] {
        ensure!(
            status("delayd", w).as_deref() == Some("ok"),
            "{w}: {:?}\n{stdout}",
            status("delayd", w)
        );
    }
    // Not available until the gRPC client lands, or skipped on one node: present either way.
    for w in ["publish-grpc-stream", "failover"] {
        ensure!(status("delayd", w).is_some(), "{w} missing\n{stdout}");
    }
    let timers =
        rows.iter().filter(|r| r["workload"].as_str().is_some_and(|w| w.starts_with("timer")));
    for timer in timers {
        ensure!(timer["early"] == 0, "early deliveries: {timer}");
        ensure!(timer["jobs"].as_u64().unwrap_or(0) > 0, "timer delivered nothing: {timer}");
    }
    // Every row that ran carries the servers' CPU per job and the bench's own CPU.
    let publish = rows.iter().find(|r| r["workload"] == "publish-http").context("publish")?;
    ensure!(publish["server_cpu_us_per_job"].as_f64().is_some(), "no server CPU: {publish}");
    ensure!(publish["loadgen_cpu_pct"].as_f64().is_some(), "no load-gen CPU: {publish}");
    // ... and the servers' context switches, and their CPU split by thread. Which thread
    // carries it is the runtime's business (and a share can round to no clock tick in a run
    // this short), so only that some named thread did is asserted.
    let switches = publish["server_switches_per_job"].as_f64().unwrap_or(0.0);
    ensure!(switches > 0.0, "no server context switches: {publish}");
    let split = publish["server_cpu_us_per_job_by_thread"].as_object().context("no CPU split")?;
    ensure!(
        split.iter().any(|(name, us)| !name.is_empty() && us.as_f64().is_some_and(|us| us > 0.0)),
        "no thread's CPU in the split: {publish}"
    );
    // Every row that ran waited for the work it left behind and says how long that took:
    // the nodes answered the wait's question (a node that did not would leave it out).
    for r in rows.iter().filter(|r| r["status"] == "ok") {
        ensure!(r["after_secs"].as_f64().is_some(), "no wait for the work left behind: {r}");
    }
    // ... and the servers' CPU by node: the smoke's one node has it all.
    let by_node = publish["server_cpu_us_per_job_by_node"].as_object().context("no node split")?;
    ensure!(by_node.keys().eq(["n1"]), "the split names the one node: {publish}");
    if beanstalkd {
        for w in ["publish", "drain"] {
            ensure!(status("beanstalkd", w).as_deref() == Some("ok"), "beanstalkd {w}\n{stdout}");
        }
        ensure!(!results["ratios"].as_array().context("ratios")?.is_empty(), "no ratios");
    }
    if redis {
        for w in ["publish", "drain", "lifecycle", "timer"] {
            ensure!(status("lmstfy-redis", w).as_deref() == Some("ok"), "lmstfy {w}\n{stdout}");
        }
        let ratios = results["ratios"].as_array().context("ratios")?;
        ensure!(
            ratios.iter().any(|r| r["peer"].as_str().is_some_and(|p| p.starts_with("lmstfy"))),
            "no ratio against lmstfy-redis"
        );
    }
    ensure!(report.join("report.md").exists() && report.join("throughput.svg").exists());
    let md = std::fs::read_to_string(report.join("report.md"))?;
    ensure!(md.contains("## Server CPU per job, by thread"), "no CPU split in the report");
    Ok(())
}

/// `--rounds 2` runs each system twice, labels each round's rows, takes each round's ratios
/// within it and gives their median over the rounds.
#[test]
fn rounds_repeat_every_system_and_give_each_ratio_per_round() -> Result<()> {
    let Some(delayd) = delayd_or_skip() else { return Ok(()) };
    if !beanstalkd_installed() {
        eprintln!("skipped: beanstalkd is not installed (the rounds need a peer)");
        return Ok(());
    }
    let args = ["--smoke", "--rounds", "2", "--workloads", "publish-http", "--beanstalkd"];
    let (results, stdout) = bench_json(&delayd, &args)?;
    let rows = results["rows"].as_array().context("rows")?;
    for round in ["(round 1)", "(round 2)"] {
        let of_round = |system: &str| {
            rows.iter().any(|r| {
                r["system"].as_str().is_some_and(|s| s.starts_with(system) && s.ends_with(round))
            })
        };
        ensure!(of_round("delayd") && of_round("beanstalkd"), "no rows of {round}\n{stdout}");
    }
    let ratios = results["ratios"].as_array().context("ratios")?;
    ensure!(
        ratios.iter().all(|r| {
            fn round(s: &Value) -> Option<String> {
                Some(s.as_str()?.rsplit_once(" (round ")?.1.to_string())
            }
            round(&r["delayd"]).is_some() && round(&r["delayd"]) == round(&r["peer"])
        }),
        "a ratio across rounds: {ratios:?}"
    );
    let over = results["meta"]["ratios_over_rounds"].as_array().context("over rounds")?;
    ensure!(!over.is_empty(), "no ratio over the rounds\n{stdout}");
    for o in over {
        ensure!(o["ratios"].as_array().map(Vec::len) == Some(2), "two rounds each: {o}");
        ensure!(o["median"].as_f64().is_some_and(|m| m > 0.0), "a median: {o}");
    }
    Ok(())
}

/// With every client steered to the leader, `failover` still publishes through every node:
/// steered, it sent everything to the node it kills, and no publish succeeded after the kill.
#[test]
fn failover_via_the_leader_publishes_through_the_survivors() -> Result<()> {
    let Some(delayd) = delayd_or_skip() else { return Ok(()) };
    let args = ["--nodes", "3", "--via-leader", "--workloads", "failover"];
    let (results, stdout) = bench_json(&delayd, &args)?;
    let rows = results["rows"].as_array().context("rows")?;
    let row = rows.iter().find(|r| r["workload"] == "failover").context("no failover row")?;
    ensure!(row["status"] == "ok", "{row}\n{stdout}");
    let first = &row["extra"]["first_publish_after_kill_ms"];
    ensure!(first.as_f64().is_some_and(|ms| ms > 0.0), "no publish after the kill: {row}");
    Ok(())
}

#[test]
fn compare_mode_runs_both_builds_in_alternating_pairs() -> Result<()> {
    let Some(delayd) = delayd_or_skip() else { return Ok(()) };
    // The same build on both sides: the comparison's shape is what is checked, not its ratios.
    let other = delayd.to_str().context("delayd's path is not UTF-8")?;
    let args = ["--smoke", "--workloads", "publish-http", "--pairs", "2", "--compare-bin", other];
    let (results, stdout) = bench_json(&delayd, &args)?;
    // Four runs, labelled by side and pair, in the order A B, then B A.
    let systems: Vec<&str> = results["rows"]
        .as_array()
        .context("rows")?
        .iter()
        .filter_map(|r| r["system"].as_str())
        .collect();
    let order: Vec<&str> =
        systems.iter().filter_map(|s| s.rsplit_once(' ').map(|(_, label)| label)).collect();
    ensure!(order == ["[A1]", "[B1]", "[B2]", "[A2]"], "runs: {systems:?}");
    // One comparison row, over both pairs, with its ratios and counts.
    let comparison = results["meta"]["comparison"].as_array().context("comparison")?;
    ensure!(comparison.len() == 1, "{comparison:?}");
    let row = &comparison[0];
    ensure!(row["workload"] == "publish-http" && row["system"] == "delayd 1 node", "{row}");
    ensure!(row["pairs"].as_array().map(Vec::len) == Some(2), "{row}");
    ensure!(row["jobs_per_s_ratio"].as_f64().is_some_and(|r| r > 0.0), "{row}");
    ensure!(row["b_faster"].as_u64().is_some_and(|n| n <= 2), "{row}");
    ensure!(stdout.contains("jobs/s B÷A"), "no comparison table:\n{stdout}");
    Ok(())
}

/// The apply bench runs every workload on a store of its own and checks its own work (each
/// drain acks everything it took, the ticks fire every job due): a row per workload, with a
/// positive rate.
#[test]
fn apply_bench_runs_every_workload_and_checks_the_stored_counts() -> Result<()> {
    let stdout = succeeded(
        Command::new(env!("CARGO_BIN_EXE_delayd-apply-bench"))
            .args(["--jobs", "1500", "--batch", "7", "--body", "10"]),
    )?;
    every_apply_workload_has_a_rate(&stdout)
}

/// Every workload of the apply bench has a row in `stdout`, with a positive rate.
fn every_apply_workload_has_a_rate(stdout: &str) -> Result<()> {
    for workload in
        ["publish", "publish-ready", "ack-first", "count10-ackfirst", "tick", "tick-riders"]
    {
        let row = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(workload))
            .with_context(|| format!("no {workload} row in\n{stdout}"))?;
        let rate: f64 = row.split_whitespace().nth(1).context("rate")?.parse()?;
        ensure!(rate > 0.0, "{row}");
    }
    Ok(())
}

/// With a ttl, every workload still stores what it published (each job also keeps its expiry
/// timer); a ttl that would end before the publish workload's jobs are due is refused by
/// name instead of timing publishes the state machine refuses.
#[test]
fn apply_bench_publishes_with_a_ttl_and_refuses_one_shorter_than_its_delay() -> Result<()> {
    let bench = env!("CARGO_BIN_EXE_delayd-apply-bench");
    let stdout = succeeded(
        Command::new(bench)
            .args(["--jobs", "1500", "--batch", "7", "--body", "10", "--ttl-ms", "86400000"]),
    )?;
    ensure!(stdout.contains("a ttl of 86400000 ms"), "{stdout}");
    every_apply_workload_has_a_rate(&stdout)?;
    let out = Command::new(bench).args(["--jobs", "100", "--ttl-ms", "1000"]).output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "a ttl of 1 s was taken:\n{stderr}");
    ensure!(stderr.contains("--ttl-ms must be 0 or more than 3600000"), "{stderr}");
    Ok(())
}
