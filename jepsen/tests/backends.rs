//! The backends against the real `delayd` binary: a cluster forms, serves through any node,
//! survives each fault the backend can do, and teardown leaves nothing behind.
//!
//! - `local_loopback` always runs (it needs only `target/debug/delayd`);
//! - `local_netns` needs root and network namespaces;
//! - `docker` needs the `delayd:local` image (scripts/docker-image.sh).
//!
//! Each uses its own host resources (random loopback ports; 10.213.0.0/24; the compose ports
//! 7771–7773 and 172.30.77.0/24), so they run in parallel. A test whose prerequisites are
//! missing prints why and passes.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use delayd_jepsen::backend::docker::DockerBackend;
use delayd_jepsen::backend::local::LocalBackend;
use delayd_jepsen::backend::{Backend, NodeInfo};
use serde_json::Value;

mod common;
use common::{delayd_bin, work_dir};

/// Election plus catch-up on a loaded CI machine; every wait below is bounded by this.
const SETTLE: Duration = Duration::from_secs(30);

fn sh(program: &str, args: &[&str]) -> Result<String> {
    let out =
        Command::new(program).args(args).output().with_context(|| format!("run {program}"))?;
    ensure!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a blocking backend call without starving the runtime's other tasks.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

struct Http {
    client: reqwest::Client,
}

impl Http {
    fn new() -> Result<Self> {
        // Longer than the nodes' 2 s request timeout, so a 503 arrives before we give up.
        Ok(Http { client: reqwest::Client::builder().timeout(Duration::from_secs(6)).build()? })
    }

    async fn leader_of(&self, node: &NodeInfo) -> Option<u64> {
        let r = self
            .client
            .get(format!("{}/health", node.http))
            .timeout(Duration::from_secs(1))
            .send()
            .await
            .ok()?;
        let v: Value = r.json().await.ok()?;
        v.get("leader")?.as_u64()
    }

    /// Waits until every node of `ids` reports the same leader, itself one of `ids`.
    async fn agreed_leader(&self, nodes: &[NodeInfo], ids: &[u64]) -> Result<u64> {
        let deadline = Instant::now() + SETTLE;
        let mut last = Vec::new();
        loop {
            last.clear();
            for n in nodes.iter().filter(|n| ids.contains(&n.id)) {
                last.push(self.leader_of(n).await);
            }
            if let Some(Some(l)) = last.first() {
                if ids.contains(l) && last.iter().all(|x| *x == Some(*l)) {
                    return Ok(*l);
                }
            }
            if Instant::now() > deadline {
                bail!("nodes {ids:?} do not agree on a leader within {SETTLE:?}: {last:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// PUT one job through `node`: (status, body) or the transport error.
    async fn publish(&self, node: &NodeInfo, body: &str) -> Result<(u16, Value)> {
        let r = self
            .client
            .put(format!("{}/api/jepsen/q", node.http))
            .body(body.to_string())
            .send()
            .await?;
        let status = r.status().as_u16();
        Ok((status, r.json().await.unwrap_or(Value::Null)))
    }

    /// Publishes through `node` until it answers 201 (bounded); returns the job id.
    async fn publish_eventually(&self, node: &NodeInfo, body: &str) -> Result<String> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let last = match self.publish(node, body).await {
                Ok((201, v)) => {
                    return v
                        .get("job_id")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .context("201 without job_id");
                }
                Ok((st, v)) => format!("{st} {v}"),
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > deadline {
                bail!("node {} does not accept a publish within {SETTLE:?}: {last}", node.id);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn reserve(&self, node: &NodeInfo) -> Result<(u16, Value)> {
        let r = self.client.get(format!("{}/api/jepsen/q?timeout=5", node.http)).send().await?;
        let status = r.status().as_u16();
        Ok((status, r.json().await.unwrap_or(Value::Null)))
    }
}

fn node(b: &dyn Backend, id: u64) -> NodeInfo {
    b.nodes()[(id - 1) as usize].clone()
}

fn others(of: u64) -> Vec<u64> {
    [1, 2, 3].into_iter().filter(|&i| i != of).collect()
}

/// Whether the binary knows `--debug-clock` yet (it is being added); if it does, the backends
/// must have enabled it.
fn binary_has_debug_clock(bin: &Path) -> bool {
    sh(bin.to_str().unwrap_or("delayd"), &["--help"]).is_ok_and(|h| h.contains("--debug-clock"))
}

/// The whole tour. Leaves the cluster running; the caller tears down and checks.
async fn exercise(b: &mut dyn Backend, debug_clock: bool) -> Result<()> {
    let http = Http::new()?;
    blocking(|| b.start())?;
    let nodes = b.nodes().to_vec();
    let leader = http.agreed_leader(&nodes, &[1, 2, 3]).await?;
    println!("[{}] cluster formed, leader {leader}", b.name());

    if debug_clock {
        for n in &nodes {
            let r = http.client.get(format!("{}/debug/clock", n.http)).send().await?;
            ensure!(r.status() == 200, "node {}: /debug/clock answered {}", n.id, r.status());
        }
    } else {
        println!("[{}] binary has no --debug-clock yet; not checked", b.name());
    }

    // Publish through node 1, reserve through node 3.
    let (st, v) = http.publish(&nodes[0], "hello").await?;
    ensure!(st == 201, "publish through node 1 answered {st} {v}");
    let id = v.get("job_id").and_then(Value::as_str).context("no job_id")?.to_string();
    let (st, v) = http.reserve(&nodes[2]).await?;
    ensure!(st == 200, "reserve through node 3 answered {st} {v}");
    ensure!(v.get("job_id").and_then(Value::as_str) == Some(id.as_str()), "reserved {v}, not {id}");
    println!("[{}] published {id} through node 1, reserved through node 3", b.name());

    // Kill the leader (twice: idempotent); the other two elect a new one.
    blocking(|| b.kill(leader).and_then(|()| b.kill(leader)))?;
    let rest = others(leader);
    let new_leader = http.agreed_leader(&nodes, &rest).await?;
    ensure!(new_leader != leader, "the killed node {leader} is still the leader");
    http.publish_eventually(&node(b, rest[0]), "after kill").await?;
    blocking(|| b.restart(leader).and_then(|()| b.restart(leader)))?;
    let leader = http.agreed_leader(&nodes, &[1, 2, 3]).await?;
    println!("[{}] killed and restarted the leader; leader now {leader}", b.name());

    // Graceful stop of a follower, then start it again.
    let f = others(leader)[0];
    let t = Instant::now();
    blocking(|| b.stop(f))?;
    ensure!(t.elapsed() < Duration::from_secs(12), "stop took {:?}", t.elapsed());
    ensure!(http.leader_of(&node(b, f)).await.is_none(), "stopped node {f} still answers");
    blocking(|| b.restart(f))?;
    let leader = http.agreed_leader(&nodes, &[1, 2, 3]).await?;
    println!("[{}] stopped node {f} in {:?} and restarted it", b.name(), t.elapsed());

    // Pause a follower (twice: idempotent); the other two still take writes.
    let p = others(leader)[0];
    blocking(|| b.pause(p).and_then(|()| b.pause(p)))?;
    ensure!(http.leader_of(&node(b, p)).await.is_none(), "paused node {p} still answers");
    http.publish_eventually(&node(b, leader), "during pause").await?;
    blocking(|| b.resume(p).and_then(|()| b.resume(p)))?;
    http.publish_eventually(&node(b, p), "after pause").await?;
    let leader = http.agreed_leader(&nodes, &[1, 2, 3]).await?;
    println!("[{}] paused and resumed node {p}", b.name());

    if b.can_partition() {
        // Cut a follower off from both peers: it answers 503 within its request timeout
        // (2 s), the majority keeps taking writes.
        let c = others(leader)[0];
        let majority = others(c);
        blocking(|| b.cut(&[(c, majority[0]), (c, majority[1])]))?;
        let t = Instant::now();
        let (st, v) = http.publish(&node(b, c), "cut").await?;
        ensure!(st == 503, "cut node {c} answered a publish with {st} {v}");
        ensure!(t.elapsed() < Duration::from_secs(4), "the 503 took {:?}", t.elapsed());
        let took = t.elapsed();
        for &m in &majority {
            http.publish_eventually(&node(b, m), "majority").await?;
        }
        blocking(|| b.heal())?;
        http.publish_eventually(&node(b, c), "healed").await?;
        http.agreed_leader(&nodes, &[1, 2, 3]).await?;
        println!("[{}] cut node {c}: 503 after {took:?}; healed", b.name());
    } else {
        let e = blocking(|| b.cut(&[(1, 2)])).err().context("cut without support succeeded")?;
        println!("[{}] no partitions here: {e:#}", b.name());
    }

    if b.can_disconnect() {
        let leader = http.agreed_leader(&nodes, &[1, 2, 3]).await?;
        let d = others(leader)[0];
        blocking(|| b.disconnect(d).and_then(|()| b.disconnect(d)))?;
        match http.publish(&node(b, d), "disconnected").await {
            Ok((st, v)) if (200..300).contains(&st) => {
                bail!("disconnected node {d} accepted a publish: {st} {v}")
            }
            _ => {}
        }
        http.publish_eventually(&node(b, leader), "without d").await?;
        blocking(|| b.heal())?;
        http.publish_eventually(&node(b, d), "reconnected").await?;
        http.agreed_leader(&nodes, &[1, 2, 3]).await?;
        println!("[{}] disconnected node {d} and reconnected it", b.name());
    } else {
        ensure!(blocking(|| b.disconnect(1)).is_err(), "disconnect without support succeeded");
    }

    // Awkward orders the nemesis can produce: kill a paused node; pause a dead one (an
    // error); cut a dead node from a live one (applies on the live side); restart, heal.
    let leader = http.agreed_leader(&nodes, &[1, 2, 3]).await?;
    let (p, q) = (others(leader)[0], others(leader)[1]);
    blocking(|| b.pause(p).and_then(|()| b.kill(p)))?;
    ensure!(blocking(|| b.pause(p)).is_err(), "pausing dead node {p} succeeded");
    blocking(|| b.resume(p))?;
    if b.can_partition() {
        blocking(|| b.cut(&[(p, q)]))?;
    }
    blocking(|| b.restart(p))?;
    blocking(|| b.heal())?;
    http.agreed_leader(&nodes, &[1, 2, 3]).await?;
    http.publish_eventually(&node(b, p), "after kill while paused").await?;
    println!("[{}] killed paused node {p}, restarted it", b.name());

    let logs = work_dir(&format!("{}-logs", b.name()));
    blocking(|| b.collect_logs(&logs))?;
    for id in 1..=3 {
        let text = std::fs::read_to_string(logs.join(format!("node-{id}.log")))?;
        ensure!(text.contains("serving HTTP"), "node {id}'s collected log lacks the startup line");
    }
    let _ = std::fs::remove_dir_all(&logs);

    // Teardown must cope with a paused node.
    blocking(|| b.pause(1))?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_loopback() -> Result<()> {
    let Some(bin) = delayd_bin() else {
        println!("SKIP local_loopback: target/debug/delayd not built");
        return Ok(());
    };
    let dir = work_dir("loopback");
    let mut b = LocalBackend::new(bin.clone(), dir.clone(), false)?;
    assert!(!b.can_partition() && !b.can_disconnect());
    let r = exercise(&mut b, binary_has_debug_clock(&bin)).await;
    let pids: Vec<u32> = (1..=3).filter_map(|i| b.pid(i)).collect();
    blocking(|| b.teardown())?;
    r?;
    ensure!(pids.len() == 3, "not every node ran at the end: {pids:?}");
    for pid in pids {
        ensure!(!Path::new(&format!("/proc/{pid}")).exists(), "pid {pid} survived teardown");
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_netns() -> Result<()> {
    let Some(bin) = delayd_bin() else {
        println!("SKIP local_netns: target/debug/delayd not built");
        return Ok(());
    };
    if !LocalBackend::netns_available() {
        println!("SKIP local_netns: needs root and `ip netns`");
        return Ok(());
    }
    let dir = work_dir("netns");
    let mut b = LocalBackend::new(bin.clone(), dir.clone(), true)?;
    assert!(b.can_partition() && b.can_disconnect());
    let tag = b.netns_tag().context("no tag")?.to_string();
    let r = async {
        let r = exercise(&mut b, binary_has_debug_clock(&bin)).await;
        // `ip netns exec` must have exec'd delayd in place: the pid we signal is delayd's.
        for i in 1..=3 {
            let pid = b.pid(i).context("node not running at the end")?;
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))?;
            ensure!(comm.trim() == "delayd", "pid {pid} of node {i} is {comm:?}, not delayd");
        }
        r
    }
    .await;
    let pids: Vec<u32> = (1..=3).filter_map(|i| b.pid(i)).collect();
    blocking(|| b.teardown())?;
    r?;
    for pid in pids {
        ensure!(!Path::new(&format!("/proc/{pid}")).exists(), "pid {pid} survived teardown");
    }
    let netns = sh("ip", &["netns", "list"])?;
    ensure!(!netns.contains(&tag), "namespaces left behind: {netns}");
    let links = sh("ip", &["-o", "link", "show"])?;
    ensure!(!links.contains(&tag), "interfaces left behind: {links}");
    let rules = sh("iptables", &["-S", "FORWARD"])?;
    ensure!(!rules.contains(&tag), "FORWARD rules left behind: {rules}");
    // Idempotent, and Drop after an explicit teardown is harmless.
    blocking(|| b.teardown())?;
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker() -> Result<()> {
    if sh("docker", &["image", "inspect", "delayd:local"]).is_err() {
        println!("SKIP docker: no delayd:local image (scripts/docker-image.sh builds it)");
        return Ok(());
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().context("no repo root")?;
    let project = "delayd-jepsen-test";
    let mut b = DockerBackend::new(root.to_path_buf(), project.to_string())?;
    // The image is built from the binary next to us, if any; it decides the clock check.
    let debug_clock = delayd_bin().is_some_and(|bin| binary_has_debug_clock(&bin));
    let r = exercise(&mut b, debug_clock).await;
    blocking(|| b.teardown())?;
    r?;
    let label = format!("label=com.docker.compose.project={project}");
    let left = sh("docker", &["ps", "-a", "-q", "--filter", &label])?;
    ensure!(left.trim().is_empty(), "containers left behind: {left}");
    let left = sh("docker", &["network", "ls", "-q", "--filter", &label])?;
    ensure!(left.trim().is_empty(), "networks left behind: {left}");
    let left = sh("docker", &["volume", "ls", "-q", "--filter", &label])?;
    ensure!(left.trim().is_empty(), "volumes left behind: {left}");
    // Idempotent on nothing.
    blocking(|| b.teardown())?;
    Ok(())
}
