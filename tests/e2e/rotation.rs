//! Rotating the admin token and the cluster secret on a live three-node cluster, one node at a
//! time, as `docs/operations.md` describes: the cluster keeps a leader and keeps committing
//! writes through every step, and at the end only the new credentials open anything.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use delayd_tests::{eventually, Api, Cluster, Server};

const ADMIN_OLD: &str = "admin-token-old-0123456789";
const ADMIN_NEW: &str = "admin-token-new-0123456789";
const SECRET_OLD: &str = "cluster-secret-old-0123456";
const SECRET_NEW: &str = "cluster-secret-new-0123456";
const SECRET_WRONG: &str = "cluster-secret-wrong-01234";

/// The flags that carry credentials, replaced at every step.
const CREDENTIAL_FLAGS: [&str; 4] =
    ["--admin-token", "--previous-admin-tokens", "--cluster-secret", "--previous-cluster-secrets"];

/// `args` without the credential flags (each is `--flag value`), then `credentials`.
fn with_credentials(args: &[String], credentials: &[(&str, &str)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if CREDENTIAL_FLAGS.contains(&a.as_str()) {
            it.next();
        } else {
            out.push(a.clone());
        }
    }
    for (flag, value) in credentials {
        out.extend([flag.to_string(), value.to_string()]);
    }
    out
}

/// Restarts node index `i` gracefully (SIGTERM) with new credentials.
async fn restart(cluster: &mut Cluster, i: usize, credentials: &[(&str, &str)]) -> Result<()> {
    let status = cluster.nodes[i].terminate()?;
    ensure!(status.success(), "node index {i} exited with {status:?}");
    let args = with_credentials(cluster.nodes[i].args(), credentials);
    cluster.nodes[i] = cluster.nodes[i].restart_with(args).await?;
    Ok(())
}

/// Publishes one job through node index `i` with `token` (forwarded to the leader when the
/// node follows: the node must be a working member), and waits until all three nodes have
/// applied it. Returns the job id.
async fn publish_everywhere(cluster: &Cluster, i: usize, token: &str) -> Result<String> {
    let path = format!("/api/rot/q?delay=3600&token={token}");
    let (st, v) = eventually(Duration::from_secs(15), || async {
        let (st, v) = cluster.api(i).put(&path, "x").await?;
        Ok((st != 503).then_some((st, v)))
    })
    .await
    .with_context(|| format!("node index {i} kept answering 503"))?;
    ensure!(st == 201, "publish through node index {i}: {st} {v}");
    let id = v["job_id"].as_str().context("no job id")?.to_string();
    for j in 0..3 {
        let job = format!("/api/rot/q/job/{id}?token={token}");
        eventually(Duration::from_secs(15), || async {
            let (st, _) = cluster.api(j).get(&format!("{job}&stale=true")).await?;
            Ok((st == 200).then_some(()))
        })
        .await
        .with_context(|| format!("job {id} never reached node index {j}"))?;
    }
    Ok(id)
}

/// The status of an admin call to node index `i` with `token`.
async fn admin_status(node: &Server, token: &str) -> Result<u16> {
    Ok(Api::new(node).get(&format!("/admin/cluster?token={token}")).await?.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_token_and_cluster_secret_rotate_node_by_node_without_downtime() -> Result<()> {
    let mut cluster =
        Cluster::start(3, &["--admin-token", ADMIN_OLD, "--cluster-secret", SECRET_OLD]).await?;
    let mut published = vec![publish_everywhere(&cluster, 0, ADMIN_OLD).await?];

    // Step 1, node by node: accept the new admin token beside the old one, and accept the
    // new cluster secret while still showing the old one.
    let step1 = [
        ("--admin-token", ADMIN_NEW),
        ("--previous-admin-tokens", ADMIN_OLD),
        ("--cluster-secret", SECRET_OLD),
        ("--previous-cluster-secrets", SECRET_NEW),
    ];
    for i in 0..3 {
        restart(&mut cluster, i, &step1).await?;
        published.push(publish_everywhere(&cluster, i, ADMIN_OLD).await?);
    }
    // Every node takes both admin tokens now: clients move to the new one.
    for node in &cluster.nodes {
        ensure!(admin_status(node, ADMIN_OLD).await? == 200, "old token refused mid-rotation");
        ensure!(admin_status(node, ADMIN_NEW).await? == 200, "new token refused mid-rotation");
    }

    // Step 2: show the new cluster secret, still accepting the old one from nodes not yet
    // restarted; the old admin token is dropped.
    let step2 = [
        ("--admin-token", ADMIN_NEW),
        ("--cluster-secret", SECRET_NEW),
        ("--previous-cluster-secrets", SECRET_OLD),
    ];
    for i in 0..3 {
        restart(&mut cluster, i, &step2).await?;
        published.push(publish_everywhere(&cluster, i, ADMIN_NEW).await?);
    }

    // Step 3: the old cluster secret is no longer accepted.
    let step3 = [("--admin-token", ADMIN_NEW), ("--cluster-secret", SECRET_NEW)];
    for i in 0..3 {
        restart(&mut cluster, i, &step3).await?;
        published.push(publish_everywhere(&cluster, i, ADMIN_NEW).await?);
    }
    for node in &cluster.nodes {
        ensure!(admin_status(node, ADMIN_OLD).await? == 401, "the old admin token still works");
        ensure!(admin_status(node, ADMIN_NEW).await? == 200, "the new admin token is refused");
    }
    // Nothing acknowledged during the rotation was lost.
    for id in &published {
        let (st, v) = cluster.api(0).get(&format!("/api/rot/q/job/{id}?token={ADMIN_NEW}")).await?;
        ensure!(st == 200, "job {id} lost: {v}");
    }

    // A node with a cluster secret the others do not accept is refused by them (and
    // refuses them): the others log the refusal and keep committing without it.
    let odd = 2;
    restart(&mut cluster, odd, &[("--admin-token", ADMIN_NEW), ("--cluster-secret", SECRET_WRONG)])
        .await?;
    let leader = cluster.leader_among(&[0, 1], Duration::from_secs(10)).await?;
    eventually(Duration::from_secs(15), || async {
        let refused = cluster.nodes[..2].iter().chain(&cluster.nodes[odd..]).any(|n| {
            n.log_text().contains("refused an internal call without the cluster credential")
        });
        Ok(refused.then_some(()))
    })
    .await
    .context("nobody refused the node with the wrong secret")?;
    let (st, v) = cluster
        .api(leader)
        .put(&format!("/api/rot/q?delay=3600&token={ADMIN_NEW}"), "without node 3")
        .await?;
    ensure!(st == 201, "the two nodes with the right secret stopped committing: {st} {v}");
    Ok(())
}
