//! The failover mode against the real `delayd` binary: its loss check finds a job that is
//! gone, and one kill-leader trial runs from start to table.
//!
//! Like `backends.rs`, these need a delayd binary (`DELAYD_BIN`, or `target/debug/delayd`
//! next to the test binary) and pass with a note when there is none.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use delayd_jepsen::backend::local::LocalBackend;
use delayd_jepsen::backend::Backend;
use delayd_jepsen::client::{Answer, Client};
use delayd_jepsen::failover::{self, Scenario};
use delayd_jepsen::run::BackendKind;
use reqwest::Method;

mod common;
use common::{delayd_bin, work_dir};

/// The check must be able to fail: a job acknowledged and then deleted counts as lost, the
/// others do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reports_a_job_that_is_gone() -> Result<()> {
    let Some(bin) = delayd_bin() else {
        println!("skipped: no delayd binary (set DELAYD_BIN or build target/debug/delayd)");
        return Ok(());
    };
    let dir = work_dir("failover-verify");
    let mut backend = LocalBackend::new(bin, dir.clone(), false)?;
    tokio::task::block_in_place(|| backend.start())?;
    let result = async {
        let nodes: Vec<u64> = backend.nodes().iter().map(|n| n.id).collect();
        let urls = backend.nodes().iter().map(|n| n.http.clone()).collect();
        let client = Client::new(urls, Duration::from_secs(5))?;
        failover::await_healthy(&client, &nodes, Duration::from_secs(60)).await?;
        let mut ids = Vec::new();
        for i in 0..3 {
            match client.publish(i, "verify", &format!("job-{i}"), 3_600_000, None, 1).await {
                Answer::Ok(id) => ids.push(id),
                other => anyhow::bail!("publish {i}: {other:?}"),
            }
        }
        client
            .admin(0, Method::DELETE, &format!("/api/jepsen/verify/job/{}", ids[1]))
            .await
            .context("deleting a job")?;
        let (lost, unverified) = failover::verify(&client, nodes.len(), "verify", &ids).await;
        ensure!(lost == vec![ids[1].clone()], "lost {lost:?}, expected [{}]", ids[1]);
        ensure!(unverified == 0, "{unverified} unverified");
        Ok(())
    }
    .await;
    tokio::task::block_in_place(|| backend.teardown())?;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// One kill-leader trial end to end: a figure, nothing lost, exit code 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_kill_leader_trial() -> Result<()> {
    let Some(bin) = delayd_bin() else {
        println!("skipped: no delayd binary (set DELAYD_BIN or build target/debug/delayd)");
        return Ok(());
    };
    let out = work_dir("failover-run");
    let opts = failover::Options {
        backend: BackendKind::Local,
        trials: 1,
        bin,
        image: "delayd:local".into(),
        repo: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."),
        out: out.clone(),
        scenarios: vec![Scenario::KillLeader],
        pause: Duration::from_millis(10),
        publish_timeout: Duration::from_secs(1),
        reuse_cluster: false,
    };
    let report = failover::run(&opts).await?;
    let _ = std::fs::remove_dir_all(&out);
    let r = &report.results[0];
    ensure!(r.error.is_none(), "scenario error: {:?}", r.error);
    let t = &r.trials[0];
    ensure!(t.error.is_none(), "trial error: {:?}", t.error);
    ensure!(t.failover_ms.is_some_and(|ms| ms > 0.0), "no failover figure: {t:?}");
    ensure!(t.acked > 0 && t.lost == 0 && t.unverified == 0, "acked/lost/unverified: {t:?}");
    ensure!(t.after.is_some_and(|a| a.leader != t.target), "no new leader: {t:?}");
    ensure!(report.exit_code() == 0, "exit code {}", report.exit_code());
    Ok(())
}
