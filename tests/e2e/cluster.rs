//! Three (and four) real `delayd` processes on loopback: forwarding, failover, isolation,
//! membership changes and snapshots. After every scenario all nodes must report the same
//! applied index and state digest.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use base64::Engine;
use delayd_tests::{eventually, n, now_ms, s, Api, Cluster};
use serde_json::Value;

fn body_of(job: &Value) -> Result<String> {
    let data = base64::engine::general_purpose::STANDARD.decode(s(job, "data")?)?;
    Ok(String::from_utf8(data)?)
}

/// Reserves (count up to 10, long-poll) and acks until `want` jobs of `queue` were received
/// or `within` passes; returns `(job_id, body, received_at_ms, due_at_ms)` per delivery.
async fn drain(
    apis: Vec<Api>,
    queue: &str,
    want: usize,
    within: Duration,
) -> Result<Vec<(String, String, u64, u64)>> {
    let got = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + within;
    let mut tasks = Vec::new();
    for (i, api) in apis.into_iter().cycle().take(6).enumerate() {
        let (got, queue) = (got.clone(), queue.to_string());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                if got.lock().map(|g: std::sync::MutexGuard<'_, Vec<_>>| g.len()).unwrap_or(0)
                    >= want
                {
                    break;
                }
                let Ok((st, r)) =
                    api.get(&format!("/api/t/{queue}?count=10&timeout=1&ttr=60")).await
                else {
                    continue; // a node being killed; the others carry on
                };
                if st != 200 {
                    continue;
                }
                let now = now_ms();
                for job in r.as_array().cloned().unwrap_or_default() {
                    let id = s(&job, "job_id")?;
                    let lease = s(&job, "lease")?;
                    got.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.push((
                        id.clone(),
                        body_of(&job)?,
                        now,
                        n(&job, "due_at_ms")?,
                    ));
                    let (st, _) =
                        api.delete(&format!("/api/t/{queue}/job/{id}?lease={lease}")).await?;
                    ensure!(st == 204, "consumer {i}: ack of {id} answered {st}");
                }
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let got = got.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
    Ok(got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_jobs_through_followers_are_delivered_exactly_once() -> Result<()> {
    let cluster = Cluster::start(3, &[]).await?;
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();

    let mut publishers = Vec::new();
    for p in 0..16 {
        let api = cluster.api(followers[p % 2]);
        publishers.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in (p..1000).step_by(16) {
                let delay = if i % 5 == 0 { "delay_ms=200" } else { "delay=0" };
                let (st, r) = api.put(&format!("/api/t/once?{delay}"), format!("job-{i}")).await?;
                ensure!(st == 201, "publish {i} through a follower: {st} {r}");
                ids.push(s(&r, "job_id")?);
            }
            Ok::<_, anyhow::Error>(ids)
        }));
    }
    let mut published = BTreeSet::new();
    for p in publishers {
        published.extend(p.await??);
    }
    ensure!(published.len() == 1000);

    let apis = (0..3).map(|i| cluster.api(i)).collect();
    let got = drain(apis, "once", 1000, Duration::from_secs(60)).await?;
    let mut per_body: BTreeMap<String, usize> = BTreeMap::new();
    for (id, body, received, due) in &got {
        ensure!(published.contains(id), "unexpected job {id}");
        ensure!(received >= due, "job {id} delivered {} ms early", due - received);
        *per_body.entry(body.clone()).or_default() += 1;
    }
    ensure!(per_body.len() == 1000, "{} distinct jobs delivered", per_body.len());
    ensure!(per_body.values().all(|c| *c == 1), "a job was delivered twice");
    cluster.converged(&[0, 1, 2], Duration::from_secs(10)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_kill9_loses_nothing_and_respects_leases() -> Result<()> {
    let mut cluster = Cluster::start(3, &[]).await?;
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let follower = (0..3).find(|i| *i != leader).context("no follower")?;
    let api = cluster.api(follower);

    // A job reserved before the failover, with a 4 s ttr: nobody else may get it before its
    // lease deadline, failover or not.
    let (st, _) = api.put("/api/t/leased?tries=2", "held").await?;
    ensure!(st == 201);
    let (st, held) = api.get("/api/t/leased?ttr=4").await?;
    ensure!(st == 200, "reserve: {st} {held}");
    let lease_deadline = n(&held, "lease_deadline_ms")?;

    // Delayed jobs that come due while there is no leader.
    let mut delayed = BTreeSet::new();
    for i in 0..20 {
        let (st, r) = api.put("/api/t/fail?delay_ms=1500", format!("delayed-{i}")).await?;
        ensure!(st == 201);
        delayed.insert(s(&r, "job_id")?);
    }

    // Load through both followers while the leader dies.
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for i in (0..3).filter(|i| *i != leader) {
        let api = Api::with_timeout(&cluster.nodes[i].url, Duration::from_secs(8))?;
        let (acked, stop) = (acked.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let mut k = 0;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                if let Ok((201, r)) = api.put("/api/t/fail", format!("load-{i}-{k}")).await {
                    if let Ok(id) = s(&r, "job_id") {
                        acked.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.insert(id);
                    }
                }
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // let some load land first
    let killed_at = Instant::now();
    cluster.nodes[leader].kill9()?;

    // Failover: the first publish that succeeds after the kill.
    let survivor = Api::with_timeout(&cluster.nodes[follower].url, Duration::from_secs(8))?;
    let failover = eventually(Duration::from_secs(15), || async {
        match survivor.put("/api/t/probe", "probe").await {
            Ok((201, _)) => Ok(Some(killed_at.elapsed())),
            _ => Ok(None),
        }
    })
    .await?;
    println!("failover: leader kill -9 → first successful publish in {failover:?}");
    ensure!(failover < Duration::from_secs(10), "failover took {failover:?}");
    tokio::time::sleep(Duration::from_millis(300)).await; // load on the new leader too
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await??;
    }

    // Everything acknowledged, and every delayed job, is delivered by the survivors.
    let survivors: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let expected: BTreeSet<String> =
        acked.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.union(&delayed).cloned().collect();
    let apis: Vec<Api> = survivors.iter().map(|i| cluster.api(*i)).collect();
    let got = drain(apis.clone(), "fail", expected.len(), Duration::from_secs(30)).await?;
    let got_ids: BTreeSet<String> = got.iter().map(|g| g.0.clone()).collect();
    let lost: Vec<&String> = expected.difference(&got_ids).collect();
    ensure!(lost.is_empty(), "{} acknowledged jobs lost, e.g. {:?}", lost.len(), lost.first());
    for (id, _, received, due) in &got {
        ensure!(received >= due, "job {id} delivered early");
    }

    // The held job comes back only once its lease has run out.
    let again = drain(apis, "leased", 1, Duration::from_secs(15)).await?;
    ensure!(again.len() == 1, "the held job was not redelivered after its ttr");
    ensure!(
        again[0].2 >= lease_deadline,
        "held job redelivered {} ms before its lease ended",
        lease_deadline - again[0].2
    );

    // The killed node comes back and catches up.
    cluster.nodes[leader] = cluster.nodes[leader].restart().await?;
    cluster.converged(&[0, 1, 2], Duration::from_secs(20)).await?;
    Ok(())
}

/// A node's applied state is in no write-ahead log of RocksDB's: the Raft log is its
/// write-ahead log, and the state is flushed before a snapshot lets that log be purged. A
/// follower killed with its log purged behind a snapshot, and with applies since, comes back
/// to the same state as the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_killed_after_purging_its_log_comes_back_to_the_same_state() -> Result<()> {
    let flags = ["--snapshot-logs", "64", "--keep-logs", "8"];
    let mut cluster = Cluster::start(3, &flags).await?;
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let follower = (0..3).find(|i| *i != leader).context("no follower")?;
    let api = cluster.api(leader);
    for i in 0..200 {
        let (st, _) = api.put(&format!("/api/t/purged?delay=0&key=k{i}"), format!("v{i}")).await?;
        ensure!(st == 201);
    }
    let (st, r) = api.get("/api/t/purged?count=5&ttr=600").await?;
    ensure!(st == 200, "reserve: {st} {r}");
    let (st, _) = api.put("/api/t/purged?delay=0", "last").await?;
    ensure!(st == 201);
    // The follower has built a snapshot and purged its own log behind it.
    let id = cluster.nodes[follower].id;
    eventually(Duration::from_secs(10), || async {
        let (_, c) = cluster.api(follower).get("/admin/cluster").await?;
        let me = c["nodes"].as_array().and_then(|ns| ns.iter().find(|x| x["id"] == id).cloned());
        Ok(me.filter(|m| m["purged"].as_u64().is_some_and(|p| p > 0)).map(|_| ()))
    })
    .await?;
    cluster.converged(&[0, 1, 2], Duration::from_secs(10)).await?;

    cluster.nodes[follower].kill9()?;
    restart_and_converge(&mut cluster, follower, "purged", 196).await?;
    // Its state was on disk up to its snapshot at least: openraft did not have to install the
    // snapshot file again at start-up, which it does for a state behind the snapshot.
    let installs = cluster.nodes[follower].metric("delayd_snapshot_install_seconds_count").await?;
    ensure!(installs == Some(0), "the restarted node installed {installs:?} snapshot(s)");
    Ok(())
}

/// Log entries are bounded in number by the snapshot policy, not in size: bulk publishes of
/// bodies that do not compress must not fill the disk with log. Past `snapshot_log_bytes` a
/// node purges up to its snapshot, the `keep_logs` entries too, and builds a new snapshot
/// when that is not enough; a follower that was down meanwhile catches up from the snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_log_stays_within_its_byte_bound_and_a_follower_down_meanwhile_catches_up() -> Result<()>
{
    use rand::{RngCore, SeedableRng};
    const BOUND: u64 = 16 << 20;
    const JOBS: u64 = 64;
    let bound = BOUND.to_string();
    // The entry policy alone would keep every entry here: 64 entries, nowhere near 50,000.
    let flags = ["--snapshot-log-bytes", &bound, "--max-entry-bytes", "4194304"];
    let mut cluster = Cluster::start(3, &flags).await?;
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let down = (0..3).find(|i| *i != leader).context("no follower")?;
    let up: Vec<usize> = (0..3).filter(|i| *i != down).collect();
    cluster.nodes[down].kill9()?;

    // 48 MiB of bodies that LZ4 cannot shrink: the log stores them as they are.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let api = cluster.api(leader);
    for i in 0..JOBS {
        let mut body = vec![0u8; 768 << 10];
        rng.fill_bytes(&mut body);
        let (st, r) = api.put(&format!("/api/t/big?delay=0&key=b{i}"), body).await?;
        ensure!(st == 201, "publish {i}: {st} {r}");
    }
    let log_bytes = |i: usize| {
        let node = &cluster.nodes[i];
        async move { node.metric("delayd_log_size_bytes").await }
    };
    for &i in &up {
        let within = eventually(Duration::from_secs(60), || async {
            Ok(log_bytes(i).await?.filter(|b| *b <= BOUND))
        })
        .await;
        ensure!(within.is_ok(), "node {}'s log stayed at {:?} bytes", i + 1, log_bytes(i).await?);
        // The bound did it, not openraft's own policy: purges past `keep_logs` and snapshots.
        let node = &cluster.nodes[i];
        let purges = node.metric("delayd_log_bound_purges_total").await?;
        let snapshots = node.metric("delayd_log_bound_snapshots_total").await?;
        ensure!(
            purges.is_some_and(|n| n > 0) && snapshots.is_some_and(|n| n > 0),
            "node {}: {purges:?} purges, {snapshots:?} snapshots for the bound",
            i + 1
        );
    }

    // The leader purged past the entries the stopped follower lacks: it can only catch up
    // from a snapshot.
    cluster.nodes[down] = cluster.nodes[down].restart().await?;
    cluster.converged(&[0, 1, 2], Duration::from_secs(60)).await?;
    let installs = cluster.nodes[down].metric("delayd_snapshot_install_seconds_count").await?;
    ensure!(installs.is_some_and(|n| n > 0), "the follower installed {installs:?} snapshots");
    let (st, got) = cluster.api(down).get("/api/t/big/size?stale=true").await?;
    ensure!(st == 200 && n(&got, "size")? == JOBS, "the follower's size: {st} {got}");
    Ok(())
}

/// Applies skip RocksDB's WAL, so a node re-applies at start whatever it applied after the
/// last flush; a node stopped on purpose flushes last and has nothing to re-apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_stopped_gracefully_has_nothing_to_apply_again_at_start() -> Result<()> {
    let mut cluster = Cluster::start(3, &[]).await?;
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let follower = (0..3).find(|i| *i != leader).context("no follower")?;
    let api = cluster.api(leader);
    for i in 0..50 {
        let (st, _) = api.put("/api/t/stopped?delay=0", format!("v{i}")).await?;
        ensure!(st == 201);
    }
    cluster.converged(&[0, 1, 2], Duration::from_secs(10)).await?;
    let applied = cluster.nodes[follower].metric("delayd_apply_seconds_count").await?;
    ensure!(applied.is_some_and(|n| n > 0), "the follower applied {applied:?} batches");

    let status = cluster.nodes[follower].terminate()?;
    ensure!(status.success(), "the follower's graceful stop: {status}");
    restart_and_converge(&mut cluster, follower, "stopped", 50).await?;
    let reapplied = cluster.nodes[follower].metric("delayd_apply_seconds_count").await?;
    ensure!(reapplied == Some(0), "the restarted node applied {reapplied:?} batches again");
    Ok(())
}

/// Starts the stopped node at index `i` again, waits until all three agree, and checks that
/// its replica of queue `t/{queue}` holds `size` jobs.
async fn restart_and_converge(
    cluster: &mut Cluster,
    i: usize,
    queue: &str,
    size: u64,
) -> Result<()> {
    cluster.nodes[i] = cluster.nodes[i].restart().await?;
    cluster.converged(&[0, 1, 2], Duration::from_secs(20)).await?;
    let (st, got) = cluster.api(i).get(&format!("/api/t/{queue}/size?stale=true")).await?;
    ensure!(st == 200 && n(&got, "size")? == size, "the restarted node's size: {st} {got}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_isolated_leader_serves_nothing_and_the_majority_carries_on() -> Result<()> {
    let cluster = Cluster::start(3, &[]).await?;
    let old = cluster.leader(Duration::from_secs(10)).await?;
    let (st, _) = cluster.api(old).put("/api/t/iso?delay=0", "before").await?;
    ensure!(st == 201);

    cluster.nodes[old].signal("STOP")?;
    let cut_off = Api::with_timeout(&cluster.nodes[old].url, Duration::from_secs(2))?;
    ensure!(
        cut_off.put("/api/t/iso", "to-the-isolated").await.is_err(),
        "the isolated node answered a write"
    );
    ensure!(cut_off.get("/api/t/iso").await.is_err(), "the isolated node handed out a job");

    let majority: Vec<usize> = (0..3).filter(|i| *i != old).collect();
    let new = cluster.leader_among(&majority, Duration::from_secs(15)).await?;
    ensure!(new != old);
    let api = cluster.api(majority[0]);
    let (st, r) = api.put("/api/t/iso", "during").await?;
    ensure!(st == 201, "majority publish: {st} {r}");
    let got = drain(
        majority.iter().map(|i| cluster.api(*i)).collect(),
        "iso",
        2,
        Duration::from_secs(10),
    )
    .await?;
    let bodies: BTreeSet<String> = got.iter().map(|g| g.1.clone()).collect();
    ensure!(bodies == BTreeSet::from(["before".to_string(), "during".to_string()]), "{bodies:?}");

    cluster.nodes[old].signal("CONT")?;
    cluster.converged(&[0, 1, 2], Duration::from_secs(20)).await?;
    let (_, h) = cluster.api(old).get("/health").await?;
    ensure!(
        s(&h, "state")? != "Leader" || n(&h, "node_id")? == cluster.nodes[new].id,
        "two leaders: {h}"
    );
    // The healed node serves again, through forwarding.
    let (st, _) = cluster.api(old).put("/api/t/iso", "after").await?;
    ensure!(st == 201);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_node_catches_up_by_snapshot_then_the_leader_is_removed() -> Result<()> {
    let flags = ["--snapshot-logs", "64", "--keep-logs", "8"];
    let mut cluster = Cluster::start(3, &flags).await?;
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let api = cluster.api(leader);
    for i in 0..200 {
        let (st, _) = api.put(&format!("/api/t/snap?delay=3600&key=k{i}"), format!("v{i}")).await?;
        ensure!(st == 201);
    }
    // The leader snapshots and purges its log behind the snapshot.
    eventually(Duration::from_secs(10), || async {
        let (_, c) = cluster.api(leader).get("/admin/cluster").await?;
        let me = c["nodes"]
            .as_array()
            .and_then(|ns| ns.iter().find(|x| x["id"] == c["leader"]).cloned());
        Ok(me.filter(|m| m["purged"].as_u64().is_some_and(|p| p > 0)).map(|_| ()))
    })
    .await?;

    // A fourth node joins through a follower's admin API; it can only catch up by snapshot.
    let joiner = cluster.spawn_joiner(4, &flags).await?;
    let follower = (0..3).find(|i| *i != leader).context("no follower")?;
    let (st, r) =
        cluster.api(follower).post(&format!("/admin/nodes?id=4&addr={}", joiner.grpc)).await?;
    ensure!(st == 200, "add learner: {st} {r}");
    cluster.nodes.push(joiner);
    cluster.converged(&[0, 1, 2, 3], Duration::from_secs(20)).await?;
    let (_, c) = cluster.api(3).get("/admin/cluster").await?;
    let four = c["nodes"]
        .as_array()
        .and_then(|ns| ns.iter().find(|x| x["id"] == 4).cloned())
        .context("node 4")?;
    ensure!(four["snapshot"].as_u64().is_some(), "node 4 did not install a snapshot: {four}");
    ensure!(four["role"] == "learner");

    let (st, r) = cluster.api(3).post("/admin/nodes/4/promote").await?;
    ensure!(st == 200 && r["voters"].as_array().map(Vec::len) == Some(4), "promote: {st} {r}");
    let (st, _) = cluster.api(3).put("/api/t/snap", "after-promote").await?;
    ensure!(st == 201);

    // Remove the leader itself; the other three elect a new one and keep serving.
    let old_id = cluster.nodes[leader].id;
    let (st, r) = cluster.api(follower).delete(&format!("/admin/nodes/{old_id}")).await?;
    ensure!(
        st == 200 && r["voters"].as_array().map(Vec::len) == Some(3),
        "remove leader: {st} {r}"
    );
    let rest: Vec<usize> = (0..4).filter(|i| *i != leader).collect();
    // Followers remember the old leader until they elect a new one.
    let new = eventually(Duration::from_secs(15), || async {
        let l = cluster.leader_among(&rest, Duration::from_secs(2)).await?;
        Ok((cluster.nodes[l].id != old_id).then_some(l))
    })
    .await?;
    println!("removed leader {old_id}; new leader {}", cluster.nodes[new].id);
    let (st, _) = cluster.api(rest[0]).put("/api/t/snap", "after-remove").await?;
    ensure!(st == 201);
    let d = cluster.converged(&rest, Duration::from_secs(20)).await?;
    ensure!(n(&d, "entries")? > 200, "{d}");
    Ok(())
}

/// A leader stopped while no other voter answers does not wait for a hand-over that cannot
/// happen; the others elect a leader once they are back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_stopped_with_its_followers_gone_skips_the_hand_over() -> Result<()> {
    let mut cluster = Cluster::start(3, &[]).await?;
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let (st, job) = cluster.api(leader).put("/api/t/alone?delay=3600", "kept").await?;
    ensure!(st == 201, "{job}");
    for i in &followers {
        cluster.nodes[*i].signal("STOP")?;
    }
    // Past its lease the leader knows no voter has answered lately.
    let api = cluster.api(leader);
    eventually(Duration::from_secs(10), || async {
        let (st, r) = api.get("/ready").await?;
        Ok((st == 503 && r.to_string().contains("no quorum")).then_some(()))
    })
    .await?;
    let status = cluster.nodes[leader].terminate()?;
    ensure!(status.success(), "exit {status:?}");
    let log = cluster.nodes[leader].log_text();
    ensure!(
        log.contains("no other voter has answered within"),
        "the stop did not skip the hand-over:\n{log}"
    );
    for i in &followers {
        cluster.nodes[*i].signal("CONT")?;
    }
    // They name the stopped leader until one of them is elected.
    let new_leader = eventually(Duration::from_secs(15), || async {
        let seen = cluster.leader_among(&followers, Duration::from_secs(1)).await.ok();
        Ok(seen.filter(|l| followers.contains(l)))
    })
    .await?;
    let (st, got) =
        cluster.api(new_leader).get(&format!("/api/t/alone/job/{}", s(&job, "job_id")?)).await?;
    ensure!(st == 200, "{got}");
    Ok(())
}

/// A follower that stops answering is news once, not at every heartbeat: the leader logs it
/// when every call to the follower has failed for a second, lets openraft's per-call warnings
/// through only as a sample, and logs once more when a call succeeds again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_that_stops_answering_is_logged_once_and_once_back() -> Result<()> {
    let cluster = Cluster::start(3, &[]).await?;
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let away = (0..3).find(|i| *i != leader).context("a follower")?;
    let peer = format!("peer={}", cluster.nodes[away].id);
    let lost = |log: &str| {
        log.lines().filter(|l| l.contains("calls to peer fail") && l.contains(&peer)).count()
    };
    // Only what follows the stop is about it: a node slow to start may have been reported
    // (and welcomed back) while the cluster formed.
    let from = cluster.nodes[leader].log_text().len();
    let since_stop = || cluster.nodes[leader].log_text().get(from..).unwrap_or_default().to_owned();
    cluster.nodes[away].signal("STOP")?;
    eventually(Duration::from_secs(10), || async { Ok((lost(&since_stop()) > 0).then_some(())) })
        .await?;
    // What must not happen needs a window: 40 more heartbeats.
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.nodes[away].signal("CONT")?;
    eventually(Duration::from_secs(10), || async {
        Ok(since_stop()
            .lines()
            .any(|l| l.contains("calls to peer succeed again") && l.contains(&peer))
            .then_some(()))
    })
    .await?;
    let log = since_stop();
    ensure!(lost(&log) == 1, "the loss was not logged exactly once:\n{log}");
    // Every heartbeat to the stopped follower timed out; one warning of them is let through
    // (or was, while the cluster formed, less than the sampling period ago).
    let log = cluster.nodes[leader].log_text();
    let heartbeats = log.lines().filter(|l| l.contains("failed to send a heartbeat")).count();
    ensure!(heartbeats == 1, "{heartbeats} heartbeat warnings in 4 s, where one is let through");
    for repeating in ["recv RPCError", "update progress error"] {
        let n = log.lines().filter(|l| l.contains(repeating)).count();
        ensure!(n <= 1, "{n} lines of {repeating:?} in 4 s, where one is let through:\n{log}");
    }
    Ok(())
}

/// SIGTERM of the leader of real processes: it hands leadership over before it exits (its
/// log says to whom), the new leader is elected in the next term, and every job acknowledged
/// before and after is on the survivors.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_terminated_leader_hands_over_before_it_exits() -> Result<()> {
    let mut cluster = Cluster::start(3, &[]).await?;
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let survivors: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let (st, before) = cluster.api(leader).put("/api/t/handover?delay=3600", "before").await?;
    ensure!(st == 201, "{before}");
    let (_, health) = cluster.api(survivors[0]).get("/health").await?;
    let term = n(&health, "term")?;

    let status = cluster.nodes[leader].terminate()?;
    ensure!(status.success(), "exit {status:?}");
    let log = cluster.nodes[leader].log_text();
    ensure!(log.contains("handed leadership over"), "no hand-over in the log:\n{log}");

    let new_leader = cluster.leader_among(&survivors, Duration::from_secs(10)).await?;
    let (_, health) = cluster.api(new_leader).get("/health").await?;
    // One election, started by the hand-over: no candidate raised the term before it.
    ensure!(n(&health, "term")? == term + 1, "{health}");
    let (st, after) = cluster.api(survivors[0]).put("/api/t/handover?delay=3600", "after").await?;
    ensure!(st == 201, "{after}");
    for i in survivors {
        for job in [&before, &after] {
            let (st, got) =
                cluster.api(i).get(&format!("/api/t/handover/job/{}", s(job, "job_id")?)).await?;
            ensure!(st == 200, "node index {i}: {got}");
        }
    }
    Ok(())
}

/// A leader killed and started again before any follower's election timeout leads again only
/// through an election, in a higher term. It sends entries to the followers before its own
/// write of them is done: a quorum of followers can commit entries that its log lost in the
/// kill, and had it taken up its old term at once, it would have appended other entries under
/// the same log ids, which the followers take for the ones they hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_killed_and_back_at_once_leads_again_only_in_a_new_term() -> Result<()> {
    // Followers that wait 8 s or more before they campaign: the killed leader is back well
    // before, and would be leading already if it took up its term again.
    let timeouts = ["--election-timeout-min-ms", "8000", "--election-timeout-max-ms", "9000"];
    let mut cluster = Cluster::start(3, &timeouts).await?;
    let leader = cluster.leader(Duration::from_secs(20)).await?;
    let (st, before) = cluster.api(leader).put("/api/t/restore?delay=3600", "before").await?;
    ensure!(st == 201, "{before}");
    let (_, health) = cluster.api(leader).get("/health").await?;
    let term = n(&health, "term")?;

    cluster.nodes[leader].kill9()?;
    cluster.nodes[leader] = cluster.nodes[leader].restart().await?;
    let (_, health) = cluster.api(leader).get("/health").await?;
    // Leading already, it can only have been elected (a slow start can outlast the timeouts).
    let back_leading = s(&health, "state")? == "Leader";
    ensure!(
        !back_leading || n(&health, "term")? > term,
        "back as leader without an election: {health}"
    );

    let new_leader = cluster.leader(Duration::from_secs(30)).await?;
    let (_, health) = cluster.api(new_leader).get("/health").await?;
    ensure!(n(&health, "term")? > term, "led again in term {term}: {health}");
    let (st, after) = cluster.api(new_leader).put("/api/t/restore?delay=3600", "after").await?;
    ensure!(st == 201, "{after}");
    for job in [&before, &after] {
        let path = format!("/api/t/restore/job/{}", s(job, "job_id")?);
        let (st, got) = cluster.api(leader).get(&path).await?;
        ensure!(st == 200, "{got}");
    }
    cluster.converged(&[0, 1, 2], Duration::from_secs(20)).await?;
    Ok(())
}
