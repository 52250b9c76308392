//! Backups, restores and quorum-loss recovery with the real binaries (`docs/backup.md`):
//! `delayctl snapshot save` against a 3-node cluster under load, `delayd restore` into a new
//! 3-node cluster and into a single node, a damaged file refused, and `delayd recover` of the
//! last node of a cluster that lost two of three nodes for good.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use delayd_tests::{
    delayctl_bin, delayd_bin, eventually, founding_ports, free_port, n, s, Api, Cluster, Server,
};
use serde_json::Value;

/// One run of a binary: exit success, stdout, stderr.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs `bin args`, isolated from the caller's `DELAYD_*` environment.
fn run(bin: &Path, args: &[&str]) -> Result<Run> {
    let mut cmd = Command::new(bin);
    cmd.args(args).stdin(Stdio::null());
    for k in ["DELAYD_ADDR", "DELAYD_TOKEN", "DELAYD_JSON", "DELAYD_DATA_DIR", "DELAYD_NODE_ID"] {
        cmd.env_remove(k);
    }
    let out = cmd.output()?;
    Ok(Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

fn delayd(args: &[&str]) -> Result<Run> {
    run(&delayd_bin()?, args)
}

/// `delayd restore --from FROM --data-dir DATA --node-id ID <extra>`.
fn restore(from: &str, data: &Path, id: &str, extra: &[&str]) -> Result<Run> {
    let data = data.display().to_string();
    let mut args = vec!["restore", "--from", from, "--data-dir", &data, "--node-id", id];
    args.extend_from_slice(extra);
    delayd(&args)
}

/// `delayctl --json <args>` against `addr`, which must succeed with one JSON document.
fn delayctl_json(addr: &str, args: &[&str]) -> Result<Value> {
    let mut all = vec!["--addr", addr, "--json"];
    all.extend_from_slice(args);
    let r = run(&delayctl_bin()?, &all)?;
    ensure!(r.ok, "delayctl {args:?} failed: {}{}", r.stderr, r.stdout);
    serde_json::from_str(&r.stdout).with_context(|| format!("not JSON: {}", r.stdout))
}

/// A job as the API shows it, less the fields that depend on when it is read.
fn stable(mut job: Value) -> Value {
    if let Value::Object(fields) = &mut job {
        fields.remove("ttl");
        fields.remove("elapsed_ms");
    }
    job
}

/// Reads job `id` of `ns/q` through `api`: `Some(job)` or `None` when it does not exist.
async fn job(api: &Api, q: &str, id: &str) -> Result<Option<Value>> {
    let (st, v) = api.get(&format!("/api/bk/{q}/job/{id}")).await?;
    match st {
        200 => Ok(Some(stable(v))),
        404 => Ok(None),
        _ => anyhow::bail!("reading job {id}: {st} {v}"),
    }
}

async fn publish(api: &Api, q: &str, params: &str, body: String) -> Result<String> {
    let (st, v) = api.put(&format!("/api/bk/{q}?{params}"), body).await?;
    ensure!(st == 201 || st == 200, "publish: {st} {v}");
    s(&v, "job_id")
}

/// Jobs in every state that stay put on their own for the length of a test: ready, delayed
/// by an hour, reserved for an hour, and some published and acknowledged (gone). Returns the
/// ids of all of them.
async fn fixed_jobs(api: &Api) -> Result<Vec<String>> {
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(publish(api, "ready", "ttl=0", format!("ready-{i}")).await?);
        ids.push(publish(api, "later", "delay=3600", format!("later-{i}")).await?);
        ids.push(publish(api, "held", "ttr=3600", format!("held-{i}")).await?);
    }
    for _ in 0..10 {
        let (st, v) = api.get("/api/bk/held?ttr=3600").await?;
        ensure!(st == 200, "reserve: {st} {v}");
    }
    for i in 0..5 {
        let id = publish(api, "gone", "", format!("gone-{i}")).await?;
        let (st, v) = api.get("/api/bk/gone?ttr=60").await?;
        ensure!(st == 200, "reserve: {st} {v}");
        let (st, v) = api.delete(&format!("/api/bk/gone/job/{}", s(&v, "job_id")?)).await?;
        ensure!(st == 204 || st == 200, "ack: {st} {v}");
        ids.push(id);
    }
    Ok(ids)
}

/// What the load did to one job, in the test's clock.
#[derive(Clone, Debug)]
struct Loaded {
    id: String,
    sent: Instant,
    published: Instant,
    /// When its acknowledgement was sent.
    acked: Option<Instant>,
}

/// Publishes, reserves and acknowledges (every other job) on queue `load` until `stop`.
async fn load(api: Api, stop: Arc<AtomicBool>, log: Arc<Mutex<Vec<Loaded>>>) -> Result<()> {
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        let id = publish(&api, "load", "ttr=3600", format!("load-{i}")).await?;
        let published = Instant::now();
        log.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.push(Loaded {
            id,
            sent,
            published,
            acked: None,
        });
        let (st, v) = api.get("/api/bk/load?ttr=3600").await?;
        ensure!(st == 200, "reserve: {st} {v}");
        if i.is_multiple_of(2) {
            let got = s(&v, "job_id")?;
            let now = Instant::now();
            let (st, v) = api.delete(&format!("/api/bk/load/job/{got}")).await?;
            ensure!(st == 204 || st == 200, "ack: {st} {v}");
            let mut log = log.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
            if let Some(l) = log.iter_mut().find(|l| l.id == got) {
                l.acked = Some(now);
            }
        }
        i += 1;
    }
    Ok(())
}

/// The digest of a node: `(applied_index, digest, entries)`.
async fn digest(api: &Api) -> Result<(u64, String, u64)> {
    let (st, d) = api.get("/admin/digest").await?;
    ensure!(st == 200, "digest: {st} {d}");
    Ok((n(&d, "applied_index")?, s(&d, "digest")?, n(&d, "entries")?))
}

/// Checks the restored cluster behind `api` against the source: the same state digest as
/// the backup (taken by the leader from the view it streamed), every fixed job as the source
/// shows it (they did not change since), and every loaded job consistent with the load's
/// history around the save.
async fn check_restored(
    api: &Api,
    saved: &Value,
    source: &Api,
    fixed: &[String],
    loaded: &[Loaded],
    save_started: Instant,
    save_done: Instant,
) -> Result<()> {
    let (index, got_digest, entries) = digest(api).await?;
    // A new leader's first (blank) entry moves the index on; it does not touch the state.
    ensure!(index >= n(saved, "applied_index")?, "restored at {index}, saved {saved}");
    ensure!(got_digest == s(saved, "digest")?, "digest {got_digest} != saved {saved}");
    ensure!(entries == n(saved, "digest_entries")?, "entries {entries} != saved {saved}");
    for q_id in fixed {
        for q in ["ready", "later", "held", "gone"] {
            let here = job(api, q, q_id).await?;
            let there = job(source, q, q_id).await?;
            ensure!(here == there, "job {q_id} in {q}: restored {here:?}, source {there:?}");
        }
    }
    for l in loaded {
        let here = job(api, "load", &l.id).await?;
        // Published and not yet acknowledged when the save was asked for: it must be there.
        // Published before the save was asked for, and not acknowledged before it ended:
        // it must be there.
        let surely_in = l.published < save_started && l.acked.is_none_or(|a| a > save_done);
        if surely_in {
            ensure!(here.is_some(), "job {} published before the save is missing", l.id);
        }
        // Sent after the backup was complete: it cannot be in it.
        if l.sent > save_done {
            ensure!(here.is_none(), "job {} published after the save was restored", l.id);
        }
        if let Some(job) = here {
            ensure!(
                job["data"].is_string() && job["queue"] == "load",
                "job {} restored as {job}",
                l.id
            );
        }
    }
    Ok(())
}

/// Starts restored node `id` on `data` with `peers`.
async fn start_restored(id: u64, data: &Path, http: u16, grpc: u16, peers: &str) -> Result<Server> {
    let extra = if peers.is_empty() { vec![] } else { vec!["--peers".into(), peers.into()] };
    Server::spawn(id, data, http, grpc, extra).await
}

#[tokio::test]
async fn a_backup_under_load_restores_into_a_new_cluster_and_a_single_node() -> Result<()> {
    let source = Cluster::start(3, &[]).await?;
    let leader = source.leader(Duration::from_secs(20)).await?;
    let api = source.api(leader);
    let fixed = fixed_jobs(&api).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(Vec::new()));
    let loader = tokio::spawn(load(api.clone(), stop.clone(), log.clone()));
    eventually(Duration::from_secs(20), || async {
        Ok((log.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.len() >= 30).then_some(()))
    })
    .await?;

    // Asked of a follower: it redirects to the leader, and delayctl follows.
    let follower = (leader + 1) % 3;
    let work = tempfile::tempdir()?;
    let file = work.path().join("backup.snap");
    let file_s = file.display().to_string();
    let save_started = Instant::now();
    let saved =
        delayctl_json(&source.nodes[follower].url, &["snapshot", "save", &file_s, "--digest"])?;
    let save_done = Instant::now();
    // Let the load go on a little past the save, then stop it.
    let after = log.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.len();
    eventually(Duration::from_secs(20), || async {
        Ok((log.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.len() >= after + 10).then_some(()))
    })
    .await?;
    stop.store(true, Ordering::Relaxed);
    loader.await??;
    let loaded = log.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();

    ensure!(s(&saved, "node")? == source.nodes[leader].url, "served by {saved}");
    let size = n(&saved, "bytes")?;
    ensure!(size == std::fs::metadata(&file)?.len(), "size {saved}");
    ensure!(s(&saved, "checksum")?.len() == 16, "checksum {saved}");
    ensure!(!work.path().join("backup.snap.partial").exists(), "the partial file is left");

    // A new three-node cluster from the file: each node restored with its own id, the same
    // peers.
    let (ports, peers) = founding_ports(3)?;
    let new_dir = tempfile::tempdir()?;
    let mut nodes = Vec::new();
    for (i, (h, g)) in ports.iter().enumerate() {
        let data = new_dir.path().join(format!("node{}", i + 1));
        let id = (i + 1).to_string();
        let r = restore(&file_s, &data, &id, &["--peers", &peers])?;
        ensure!(r.ok, "restore failed: {}{}", r.stderr, r.stdout);
        ensure!(
            r.stdout.contains(&format!("applied_index  {}", n(&saved, "applied_index")?)),
            "{}",
            r.stdout
        );
        nodes.push(start_restored(i as u64 + 1, &data, *h, *g, &peers).await?);
    }
    let restored = Cluster { nodes, dir: new_dir };
    let new_leader = restored.leader(Duration::from_secs(20)).await?;
    restored.converged(&[0, 1, 2], Duration::from_secs(20)).await?;
    for i in 0..3 {
        check_restored(&restored.api(i), &saved, &api, &fixed, &loaded, save_started, save_done)
            .await?;
    }
    // It is a cluster of its own: it takes writes, and the source never hears of them.
    let new_id = publish(&restored.api(new_leader), "after", "", "new".into()).await?;
    ensure!(job(&api, "after", &new_id).await?.is_none(), "the source sees the new write");
    let (_, members) = restored.api(0).get("/admin/cluster").await?;
    ensure!(members["voters"] == serde_json::json!([1, 2, 3]), "{members}");

    // And a single node from the same file.
    let single = tempfile::tempdir()?;
    let data = single.path().join("node");
    let (h, g) = (free_port()?, free_port()?);
    let r = restore(&file_s, &data, "7", &["--grpc-addr", &format!("127.0.0.1:{g}")])?;
    ensure!(r.ok, "restore failed: {}{}", r.stderr, r.stdout);
    let one = start_restored(7, &data, h, g, "").await?;
    let one_api = Api::new(&one);
    eventually(Duration::from_secs(20), || async {
        let (_, h) = one_api.get("/health").await?;
        Ok((h["leader"] == 7).then_some(()))
    })
    .await?;
    check_restored(&one_api, &saved, &api, &fixed, &loaded, save_started, save_done).await?;
    let single_id = publish(&one_api, "after", "", "single".into()).await?;

    // The restored cluster has an identity of its own: it and the old cluster refuse each
    // other's Raft messages, even with no cluster secret at all (these nodes run --dev).
    // Adding a learner waits for it to catch up, which these never do: not awaited in full.
    let add = |api: Api, id: u64, grpc: String| async move {
        let path = format!("/admin/nodes?id={id}&addr={grpc}");
        let _ = tokio::time::timeout(Duration::from_secs(2), api.post(&path)).await;
    };
    add(one_api.clone(), 1, source.nodes[0].grpc.clone()).await;
    add(api.clone(), 7, one.grpc.clone()).await;
    let refused = "refused an internal call from another cluster";
    eventually(Duration::from_secs(20), || async {
        let both = source.nodes[0].log_text().contains(refused) && one.log_text().contains(refused);
        Ok(both.then_some(()))
    })
    .await
    .context("the old and the restored cluster did not refuse each other")?;
    ensure!(job(&api, "after", &single_id).await?.is_none(), "the source took the new state");
    publish(&api, "after", "", "old".into()).await?;
    Ok(())
}

#[tokio::test]
async fn damaged_files_and_used_directories_are_refused() -> Result<()> {
    const TOKEN: &str = "backup-test-admin-token-0001";
    let dir = tempfile::tempdir()?;
    let server = Server::spawn(
        1,
        &dir.path().join("node"),
        free_port()?,
        free_port()?,
        vec!["--admin-token".into(), TOKEN.into()],
    )
    .await?;
    server.wait_leader(Duration::from_secs(10)).await?;
    // A backup is admin-only.
    let (st, _) = Api::new(&server).get("/admin/snapshot").await?;
    ensure!(st == 401, "an anonymous backup got {st}");
    let r = run(&delayctl_bin()?, &["--addr", &server.url, "snapshot", "save", "x.snap"])?;
    ensure!(!r.ok && r.stderr.contains("401"), "{}", r.stderr);

    let file = dir.path().join("b.snap");
    let file_s = file.display().to_string();
    let saved = delayctl_json(&server.url, &["--token", TOKEN, "snapshot", "save", &file_s])?;
    ensure!(n(&saved, "bytes")? > 0, "{saved}");
    let good = std::fs::read(&file)?;

    let restore = |from: &str, data: &Path| restore(from, data, "1", &[]);
    // One flipped bit in the checksum, then a cut: each named, nothing created.
    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    std::fs::write(&file, &flipped)?;
    let target = dir.path().join("restored");
    let r = restore(&file_s, &target)?;
    ensure!(!r.ok && r.stderr.contains("checksum mismatch"), "{}", r.stderr);
    ensure!(r.stderr.contains(&file_s), "the file is not named: {}", r.stderr);
    ensure!(!target.exists(), "a refused restore left {}", target.display());

    std::fs::write(&file, &good[..good.len() / 2])?;
    let r = restore(&file_s, &target)?;
    ensure!(!r.ok && r.stderr.contains("truncated"), "{}", r.stderr);

    let mut body = good.clone();
    let mid = body.len() / 2;
    body[mid] ^= 0x10;
    std::fs::write(&file, &body)?;
    let r = restore(&file_s, &target)?;
    ensure!(!r.ok && r.stderr.contains("corrupt data"), "{}", r.stderr);

    // A directory in use is refused, whatever the file.
    std::fs::write(&file, &good)?;
    let used = dir.path().join("node");
    let r = restore(&file_s, &used)?;
    ensure!(!r.ok && r.stderr.contains("is not empty"), "{}", r.stderr);
    let r = restore(&file_s, &target)?;
    ensure!(r.ok, "the good file is refused: {}", r.stderr);
    Ok(())
}

#[tokio::test]
async fn the_last_node_of_a_cluster_that_lost_quorum_becomes_a_new_cluster() -> Result<()> {
    let mut cluster = Cluster::start(3, &[]).await?;
    let leader = cluster.leader(Duration::from_secs(20)).await?;
    let api = cluster.api(leader);
    let fixed = fixed_jobs(&api).await?;
    let mut acked = BTreeMap::new();
    for q in ["ready", "later", "held", "gone"] {
        for id in &fixed {
            if let Some(j) = job(&api, q, id).await? {
                acked.insert(id.clone(), (q, j));
            }
        }
    }
    // The survivor is a follower (the leader is among the lost), once it has everything.
    cluster.converged(&[0, 1, 2], Duration::from_secs(20)).await?;
    let survivor = (leader + 1) % 3;
    for i in 0..3 {
        if i != survivor {
            cluster.nodes[i].kill9()?;
        }
    }
    cluster.nodes[survivor].kill9()?;
    let data = cluster.dir.path().join(format!("node{}", survivor + 1));
    let id = cluster.nodes[survivor].id;
    let r = delayd(&[
        "recover",
        "--data-dir",
        &data.display().to_string(),
        "--node-id",
        &id.to_string(),
    ])?;
    ensure!(r.ok, "recover failed: {}{}", r.stderr, r.stdout);
    ensure!(r.stdout.contains(&cluster.nodes[survivor].grpc), "{}", r.stdout);
    let previous = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("previous data"))
        .map(str::trim)
        .context("no previous data line")?;
    ensure!(Path::new(previous).join("db").is_dir(), "{previous} is not kept");

    let node = cluster.nodes[survivor].restart().await?;
    let node_api = Api::new(&node);
    eventually(Duration::from_secs(20), || async {
        let (_, h) = node_api.get("/health").await?;
        Ok((h["leader"] == id).then_some(()))
    })
    .await?;
    for (job_id, (q, want)) in &acked {
        let got = job(&node_api, q, job_id).await?;
        ensure!(got.as_ref() == Some(want), "job {job_id}: {got:?}, acknowledged as {want}");
    }
    let written = publish(&node_api, "after", "", "after recovery".into()).await?;

    // Two fresh nodes join with empty directories and catch up.
    let mut joiners = Vec::new();
    for new_id in [4u64, 5] {
        let joiner = cluster.spawn_joiner(new_id, &[]).await?;
        let id_s = new_id.to_string();
        delayctl_json(&node.url, &["cluster", "add", &id_s, &joiner.grpc])?;
        delayctl_json(&node.url, &["cluster", "promote", &id_s])?;
        joiners.push(joiner);
    }
    let all = Cluster { nodes: vec![node, joiners.remove(0), joiners.remove(0)], dir: cluster.dir };
    let (_, members) = all.api(0).get("/admin/cluster").await?;
    let voters = members["voters"].clone();
    ensure!(voters == serde_json::json!([id, 4, 5]), "{members}");
    all.converged(&[0, 1, 2], Duration::from_secs(30)).await?;
    for i in 1..3 {
        let got = job(&all.api(i), "after", &written).await?;
        ensure!(got.is_some(), "node {} lacks the write made after recovery", all.nodes[i].id);
    }
    Ok(())
}
