//! The Disque protocol on three real `delayd` processes: a client on a follower adds and
//! consumes jobs with Disque's commands (the `redis` crate's raw commands, as Disque clients
//! send them), and across a `kill -9` of the leader nothing it was told was added is lost.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use delayd_tests::{free_port, Cluster};
use redis::aio::MultiplexedConnection;
use redis::{cmd, Value};

async fn connect(port: u16) -> Result<MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// Every job GETJOB hands out within `within`, acked as it comes: their ids.
async fn drain(
    c: &mut MultiplexedConnection,
    want: usize,
    within: Duration,
) -> Result<BTreeSet<String>> {
    let deadline = Instant::now() + within;
    let mut got = BTreeSet::new();
    while got.len() < want && Instant::now() < deadline {
        let v: Value = match cmd("GETJOB")
            .arg(&["TIMEOUT", "1000", "COUNT", "50", "FROM", "fail"])
            .query_async(c)
            .await
        {
            Ok(v) => v,
            Err(_) => continue, // an election: the command failed, nothing was taken
        };
        let Value::Array(jobs) = v else { continue };
        for job in jobs {
            let fields: Vec<String> = redis::from_redis_value(&job)?;
            let id = fields.get(1).context("job id")?.clone();
            let _: i64 = cmd("ACKJOB").arg(&id).query_async(c).await?;
            got.insert(id);
        }
    }
    Ok(got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disque_clients_lose_nothing_across_a_leader_kill() -> Result<()> {
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_>>()?;
    let mut cluster =
        Cluster::start_each(3, |i| vec!["--disque-addr".into(), format!("127.0.0.1:{}", ports[i])])
            .await?;
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let follower = (0..3).find(|i| *i != leader).context("no follower")?;
    let mut c = connect(ports[follower]).await?;

    // The basics through a follower: add, get, ack.
    let id: String = cmd("ADDJOB").arg("basic").arg("hello").arg(0).query_async(&mut c).await?;
    let v: Value =
        cmd("GETJOB").arg(&["TIMEOUT", "5000", "FROM", "basic"]).query_async(&mut c).await?;
    let Value::Array(jobs) = v else { anyhow::bail!("no job: {v:?}") };
    let fields: Vec<String> = redis::from_redis_value(&jobs[0])?;
    ensure!(fields == ["basic", id.as_str(), "hello"], "{fields:?}");
    let acked: i64 = cmd("ACKJOB").arg(&id).query_async(&mut c).await?;
    ensure!(acked == 1);

    // Adds through the follower while the leader dies: every id answered must come out.
    let mut added = BTreeSet::new();
    let started = Instant::now();
    let mut killed = false;
    while started.elapsed() < Duration::from_secs(4) {
        if !killed && started.elapsed() > Duration::from_millis(500) {
            cluster.nodes[leader].kill9()?;
            killed = true;
        }
        let r: redis::RedisResult<String> =
            cmd("ADDJOB").arg("fail").arg("x").arg(0).query_async(&mut c).await;
        if let Ok(id) = r {
            added.insert(id);
        }
    }
    ensure!(added.len() > 10, "only {} adds succeeded", added.len());
    let got = drain(&mut c, added.len(), Duration::from_secs(30)).await?;
    let lost: Vec<&String> = added.difference(&got).collect();
    ensure!(lost.is_empty(), "{} added jobs lost, e.g. {:?}", lost.len(), lost.first());
    println!("disque: {} jobs added across the leader kill, all consumed", added.len());
    cluster.nodes[leader] = cluster.nodes[leader].restart().await?;
    cluster.converged(&[0, 1, 2], Duration::from_secs(20)).await?;
    Ok(())
}
