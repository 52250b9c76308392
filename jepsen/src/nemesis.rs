//! The nemesis: injects the planned faults one after another, heals each, and records the
//! windows as they really happened. [`Nemesis::recover`] undoes everything at the end of a run.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use reqwest::Method;

use crate::backend::Backend;
use crate::client::{Client, Recorder};
use crate::plan::{FaultKind, FaultWindow, PlannedFault};

/// The backend, shared between the nemesis and the runner's teardown.
pub type SharedBackend = Arc<Mutex<Box<dyn Backend>>>;

/// Runs a blocking backend call off the async workers.
pub async fn on_backend<T: Send + 'static>(
    backend: &SharedBackend,
    f: impl FnOnce(&mut dyn Backend) -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let backend = backend.clone();
    tokio::task::spawn_blocking(move || {
        let mut guard = backend.lock().map_err(|_| anyhow::anyhow!("backend lock poisoned"))?;
        f(guard.as_mut())
    })
    .await
    .context("backend task")?
}

/// Everything the nemesis needs.
pub struct Nemesis {
    /// Where the nodes run.
    pub backend: SharedBackend,
    /// HTTP to the nodes (clock hook, admin API, leader lookup).
    pub client: Client,
    /// The run's clock.
    pub recorder: Arc<Recorder>,
    /// Node ids, 1-based.
    pub nodes: Vec<u64>,
    /// gRPC addresses by node (index id-1), to re-add a removed node.
    pub grpc: Vec<String>,
}

impl Nemesis {
    /// Injects `faults`, whose `at_ms` count from `start_ms` (harness time), and returns the
    /// windows as they happened. Returns early (after healing) when `stop` resolves.
    pub async fn run(&self, start_ms: u64, faults: &[PlannedFault]) -> Vec<FaultWindow> {
        let mut windows = Vec::new();
        for f in faults {
            let due = start_ms + f.at_ms;
            let now = self.recorder.now_ms();
            if due > now {
                tokio::time::sleep(Duration::from_millis(due - now)).await;
            }
            let window = self.inject(f).await;
            crate::progress::println(&format!(
                "  [{:>6.1}s] {:<16} nodes {:?} for {:.1}s {}",
                window.start_ms as f64 / 1000.0,
                f.kind.name(),
                window.nodes,
                (window.end_ms - window.start_ms) as f64 / 1000.0,
                window.detail
            ));
            windows.push(window);
        }
        windows
    }

    async fn leader_or(&self, fallback: u64) -> u64 {
        self.client.leader().await.unwrap_or(fallback)
    }

    async fn inject(&self, f: &PlannedFault) -> FaultWindow {
        let hold = Duration::from_millis(f.hold_ms);
        let mut target = f.node;
        if matches!(
            f.kind,
            FaultKind::IsolateLeader | FaultKind::KillLeader | FaultKind::PauseLeader
        ) {
            target = self.leader_or(f.node).await;
        }
        let others: Vec<u64> = self.nodes.iter().copied().filter(|n| *n != target).collect();
        let mut nodes = vec![target];
        let mut detail = String::new();
        let start_ms = self.recorder.now_ms();
        let result: anyhow::Result<()> = async {
            match f.kind {
                FaultKind::IsolateLeader | FaultKind::IsolateNode => {
                    let pairs: Vec<(u64, u64)> = others.iter().map(|o| (target, *o)).collect();
                    on_backend(&self.backend, move |b| b.cut(&pairs)).await?;
                    tokio::time::sleep(hold).await;
                    on_backend(&self.backend, |b| b.heal()).await
                }
                FaultKind::Bridge => {
                    // `target` is the bridge: it still talks to both, they not to each other.
                    let (a, b) = (others[0], others[1]);
                    nodes = vec![a, b];
                    detail = format!("{a}-x-{b}, {target} bridges");
                    on_backend(&self.backend, move |be| be.cut(&[(a, b)])).await?;
                    tokio::time::sleep(hold).await;
                    on_backend(&self.backend, |b| b.heal()).await
                }
                FaultKind::FullIsolation => {
                    on_backend(&self.backend, move |b| b.disconnect(target)).await?;
                    tokio::time::sleep(hold).await;
                    on_backend(&self.backend, |b| b.heal()).await
                }
                FaultKind::KillNode | FaultKind::KillLeader => {
                    on_backend(&self.backend, move |b| b.kill(target)).await?;
                    tokio::time::sleep(hold).await;
                    on_backend(&self.backend, move |b| b.restart(target)).await
                }
                FaultKind::KillAll => {
                    nodes = self.nodes.clone();
                    let all = self.nodes.clone();
                    on_backend(&self.backend, move |b| all.iter().try_for_each(|n| b.kill(*n)))
                        .await?;
                    tokio::time::sleep(hold).await;
                    let all = self.nodes.clone();
                    on_backend(&self.backend, move |b| all.iter().try_for_each(|n| b.restart(*n)))
                        .await
                }
                FaultKind::PauseNode | FaultKind::PauseLeader => {
                    on_backend(&self.backend, move |b| b.pause(target)).await?;
                    tokio::time::sleep(hold).await;
                    on_backend(&self.backend, move |b| b.resume(target)).await
                }
                FaultKind::ClockOffset => {
                    detail = format!("offset {:+} ms", f.offset_ms);
                    self.set_clock(target, f.offset_ms).await?;
                    tokio::time::sleep(hold).await;
                    self.set_clock(target, 0).await
                }
                FaultKind::GracefulRestart => {
                    on_backend(&self.backend, move |b| b.stop(target)).await?;
                    tokio::time::sleep(hold).await;
                    on_backend(&self.backend, move |b| b.restart(target)).await
                }
                FaultKind::Membership => {
                    // Remove a follower (removing the leader is covered by the e2e tests and
                    // would leave nobody to ask for a while), then add it back.
                    let leader = self.leader_or(0).await;
                    if target == leader {
                        target = others[0];
                        nodes = vec![target];
                    }
                    self.admin_until_ok(Method::DELETE, &format!("/admin/nodes/{target}"), target)
                        .await?;
                    tokio::time::sleep(hold).await;
                    self.readd(target).await
                }
            }
        }
        .await;
        if let Err(e) = result {
            if !detail.is_empty() {
                detail.push_str("; ");
            }
            detail.push_str(&format!("error: {e:#}"));
        }
        FaultWindow { kind: f.kind, nodes, start_ms, end_ms: self.recorder.now_ms(), detail }
    }

    async fn set_clock(&self, node: u64, offset_ms: i64) -> anyhow::Result<()> {
        let path = format!("/debug/clock?offset_ms={offset_ms}");
        self.client.admin(index(node), Method::PUT, &path).await.map(|_| ())
    }

    /// Sends an admin request to any node but `avoid` until one accepts it (bounded).
    async fn admin_until_ok(&self, method: Method, path: &str, avoid: u64) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut last = String::new();
        while tokio::time::Instant::now() < deadline {
            for n in self.nodes.iter().filter(|n| **n != avoid) {
                match self.client.admin(index(*n), method.clone(), path).await {
                    Ok(_) => return Ok(()),
                    Err(e) => last = format!("{e:#}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        bail!("{method} {path} never succeeded: {last}")
    }

    async fn readd(&self, node: u64) -> anyhow::Result<()> {
        let addr = &self.grpc[index(node)];
        self.admin_until_ok(Method::POST, &format!("/admin/nodes?id={node}&addr={addr}"), node)
            .await?;
        self.admin_until_ok(Method::POST, &format!("/admin/nodes/{node}/promote"), node).await
    }

    /// Undoes every fault: heals the network, resumes and restarts every node, resets the
    /// clocks and puts any removed node back into the membership. Errors are collected, not
    /// fatal: recovery does as much as it can.
    pub async fn recover(&self) -> Vec<String> {
        let mut errors = Vec::new();
        let all = self.nodes.clone();
        if let Err(e) = on_backend(&self.backend, move |b| {
            b.heal()?;
            for n in &all {
                b.resume(*n)?;
                b.restart(*n)?;
            }
            Ok(())
        })
        .await
        {
            errors.push(format!("backend: {e:#}"));
        }
        for n in &self.nodes {
            // A node just restarted may need a moment before it answers.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                match self.set_clock(*n, 0).await {
                    Ok(()) => break,
                    Err(e) if tokio::time::Instant::now() >= deadline => {
                        errors.push(format!("clock reset on node {n}: {e:#}"));
                        break;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }
        match self.missing_voters().await {
            Ok(missing) => {
                for n in missing {
                    if let Err(e) = self.readd(n).await {
                        errors.push(format!("re-adding node {n}: {e:#}"));
                    }
                }
            }
            Err(e) => errors.push(format!("membership: {e:#}")),
        }
        errors
    }

    async fn missing_voters(&self) -> anyhow::Result<Vec<u64>> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            for n in &self.nodes {
                if let Ok(v) = self.client.get_json(index(*n), "/admin/cluster").await {
                    if v["leader"].is_u64() {
                        let voters: Vec<u64> = v["voters"]
                            .as_array()
                            .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
                            .unwrap_or_default();
                        return Ok(self
                            .nodes
                            .iter()
                            .copied()
                            .filter(|n| !voters.contains(n))
                            .collect());
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("no node reported a leader within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

fn index(node: u64) -> usize {
    node.saturating_sub(1) as usize
}
