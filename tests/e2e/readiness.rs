//! Readiness and draining against real processes: `/ready` and `grpc.health.v1` follow the
//! cluster's state (a leader, a quorum), a refused write asks to be retried after a second,
//! and SIGTERM answers waiting long-polls at once, hands leadership over and exits.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use delayd_tests::{eventually, Api, Cluster};
use serde_json::{json, Value};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// `/ready`'s status and body on node index `i`.
async fn ready(cluster: &Cluster, i: usize) -> Result<(u16, Value)> {
    Api::with_timeout(&cluster.nodes[i].url, Duration::from_secs(2))?.get("/ready").await
}

/// What `grpc.health.v1` says of `service` on node index `i`.
async fn grpc_health(cluster: &Cluster, i: usize, service: &str) -> Result<ServingStatus> {
    let url = format!("http://{}", cluster.nodes[i].grpc);
    let channel = tonic::transport::Endpoint::from_shared(url)?.connect().await?;
    let mut client = HealthClient::new(channel);
    let request = HealthCheckRequest { service: service.to_string() };
    let status = client.check(request).await.context("health check")?.into_inner().status;
    ServingStatus::try_from(status).context("unknown serving status")
}

/// The raw answer to a publish on node index `i`, sent with request id `id`: status and
/// `Retry-After`.
async fn publish_retry_after(
    cluster: &Cluster,
    i: usize,
    id: &str,
) -> Result<(u16, Option<String>)> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let url = format!("{}/api/r/q", cluster.nodes[i].url);
    let r = http.put(url).header("x-request-id", id).body("x").send().await?;
    let retry = r.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
    Ok((r.status().as_u16(), retry))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ready_and_grpc_health_follow_the_leader_and_the_quorum() -> Result<()> {
    let mut cluster = Cluster::start(3, &["--request-timeout-ms", "1000"]).await?;
    for i in 0..3 {
        eventually(Duration::from_secs(10), || async {
            let (st, v) = ready(&cluster, i).await?;
            Ok((st == 200).then_some(v))
        })
        .await
        .with_context(|| format!("node index {i} never ready"))?;
        for service in ["", "delayd.v1.Delayd"] {
            let status = eventually(Duration::from_secs(5), || async {
                let s = grpc_health(&cluster, i, service).await?;
                Ok((s == ServingStatus::Serving).then_some(s))
            })
            .await;
            ensure!(status.is_ok(), "gRPC health of {service:?} on node index {i}: not serving");
        }
    }

    // `role=leader`: only the leader says it is ready, for a load balancer that sends every
    // client there; the others name the reason.
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    for i in 0..3 {
        let api = Api::with_timeout(&cluster.nodes[i].url, Duration::from_secs(2))?;
        let (st, v) = api.get("/ready?role=leader").await?;
        if i == leader {
            ensure!(st == 200 && v == json!({"ready": true}), "leader, role=leader: {st} {v}");
        } else {
            let why = v["error"].as_str().unwrap_or_default();
            ensure!(st == 503 && why.contains("does not lead"), "follower, role=leader: {st} {v}");
        }
    }

    // Two of three gone for good: the survivor has no quorum and says so.
    let survivor = (leader + 1) % 3;
    for i in (0..3).filter(|i| *i != survivor) {
        cluster.nodes[i].kill9()?;
    }
    let why = eventually(Duration::from_secs(10), || async {
        let (st, v) = ready(&cluster, survivor).await?;
        Ok((st == 503).then_some(v))
    })
    .await?;
    let reason = why["error"].as_str().unwrap_or_default();
    ensure!(why["ready"] == json!(false) && !reason.is_empty(), "{why}");
    let status = eventually(Duration::from_secs(5), || async {
        let s = grpc_health(&cluster, survivor, "delayd.v1.Delayd").await?;
        Ok((s == ServingStatus::NotServing).then_some(s))
    })
    .await;
    ensure!(status.is_ok(), "gRPC health still serving without a quorum");
    // A write it cannot commit is a 503 asking for a retry a second later, and logged as a
    // failed request under its id at the default log level (no per-request span there).
    let (st, retry) = publish_retry_after(&cluster, survivor, "no-quorum-7").await?;
    ensure!(st == 503 && retry.as_deref() == Some("1"), "{st} Retry-After {retry:?}");
    let log = cluster.nodes[survivor].log_text();
    let failed = log.lines().find(|l| l.contains("request failed") && l.contains("no-quorum-7"));
    let failed = failed.with_context(|| format!("the 503 was not logged with its id:\n{log}"))?;
    for field in ["request_id=no-quorum-7", "method=PUT", "route=/api/{ns}/{q}", "status=503"] {
        ensure!(failed.contains(field), "{field} missing: {failed}");
    }
    ensure!(!failed.contains("request{"), "the request span is on at info: {failed}");

    // One node back: a quorum again, and the survivor is ready again.
    let back = (survivor + 1) % 3;
    cluster.nodes[back] = cluster.nodes[back].restart().await?;
    eventually(Duration::from_secs(20), || async {
        let (st, v) = ready(&cluster, survivor).await?;
        Ok((st == 200).then_some(v))
    })
    .await
    .context("the survivor never became ready again")?;
    Ok(())
}

/// A leader stopped by SIGTERM with a consumer long-polling it for 600 s: the long-poll is
/// answered "no job available" at once, leadership moves to another node without an
/// election timeout, and the process exits well before the long-poll would have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_answers_long_polls_hands_over_and_exits() -> Result<()> {
    let mut cluster = Cluster::start(3, &["--drain-timeout-ms", "3000"]).await?;
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let consumer = Api::with_timeout(&cluster.nodes[leader].url, Duration::from_secs(700))?;
    let waiting = tokio::spawn(async move {
        let answer = consumer.get("/api/drain/q?timeout=600").await;
        (answer, Instant::now())
    });
    eventually(Duration::from_secs(10), || async {
        Ok((cluster.nodes[leader].metric("delayd_reserves_waiting").await? == Some(1))
            .then_some(()))
    })
    .await
    .context("the long-poll never parked")?;

    let stopped_at = Instant::now();
    cluster.nodes[leader].signal("TERM")?;
    let (answer, answered_at) =
        tokio::time::timeout(Duration::from_secs(10), waiting).await.context("not answered")??;
    let (st, body) = answer?;
    ensure!(st == 404 && body == json!({"msg": "no job available"}), "{st} {body}");
    let answered = answered_at - stopped_at;
    ensure!(answered < Duration::from_secs(2), "answered after {answered:?}");

    let exit = tokio::task::block_in_place(|| cluster.nodes[leader].wait())?;
    let stopped = stopped_at.elapsed();
    ensure!(exit.success(), "exit {exit:?}");
    // The drain (3 s at most), the hand-over (2 s at most) and closing the store, not the
    // long-poll's 600 s; with room for a loaded machine.
    ensure!(stopped < Duration::from_secs(15), "stopped after {stopped:?}");
    let log = cluster.nodes[leader].log_text();
    ensure!(log.contains("handed leadership over"), "no hand-over in the log:\n{log}");
    let survivors: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    cluster.leader_among(&survivors, Duration::from_secs(10)).await?;
    Ok(())
}
