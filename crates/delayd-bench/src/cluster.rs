//! The systems under test as processes: a delayd cluster the bench starts itself (fresh temp
//! data directories, loopback ports) or one it is pointed at, and the helpers that look at the
//! processes from outside (RSS from `/proc`, disk usage of a data directory; CPU time is in
//! [`crate::stats`]).
//!
//! Every process the bench starts is owned by a guard whose `Drop` kills it (`kill -9`) and
//! reaps it, so an error, a panic or Ctrl-C (which drops the running future) never leaves a
//! node behind; a bench killed outright, which runs no `Drop`, leaves none either (see
//! [`Proc`]). Waiting is bounded polling of `/health`, never a fixed sleep.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// How long a freshly started cluster may take to elect a leader.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A child process that is killed and reaped when the guard is dropped.
///
/// A bench killed outright (SIGKILL, or SIGTERM, which it does not catch) runs no `Drop`, and
/// nodes and peers left running would hold ports, disk and cores under every later run on
/// the machine. So each child has a watcher beside it: a shell blocked reading a pipe whose
/// only writing end the guard holds. Whenever the bench's process ends, however, the kernel
/// closes that end, the read returns, and the shell kills the child at once (the end is
/// close-on-exec, so no other process the bench starts holds it open). Nothing polls. (The
/// kernel's parent-death signal would need `pre_exec`, which is `unsafe`, and the workspace
/// forbids that.) While the bench lives the watcher does nothing, and the guard stops it
/// whenever it kills or reaps the child.
pub struct Proc {
    child: Option<Child>,
    watcher: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Spawns `bin args...` with stdout and stderr appended to `log`.
    pub fn spawn(bin: &Path, args: &[String], log: &Path) -> Result<Proc> {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        let child = Command::new(bin)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(out.try_clone()?)
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("spawn {}", bin.display()))?;
        let script = format!("read _; kill -9 {} 2>/dev/null", child.id());
        let mut proc = Proc { child: Some(child), watcher: None, log: log.to_path_buf() };
        // On an error the guard kills the child it already started (Drop).
        proc.watcher = Some(
            Command::new("sh")
                .args(["-c", &script])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()
                .context("cannot start a process watcher (sh)")?,
        );
        Ok(proc)
    }

    /// The process id, if it is still ours.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `kill -9` and reap, the watcher first.
    pub fn kill9(&mut self) {
        stop(self.watcher.take());
        stop(self.child.take());
    }

    /// Fails, with the end of its log, if the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(c) = self.child.as_mut() {
            if let Some(status) = c.try_wait()? {
                self.child = None;
                // Reaped, so the pid may be reused: the watcher must go before the bench can.
                stop(self.watcher.take());
                bail!("process exited with {status}; log tail:\n{}", self.log_tail());
            }
        }
        Ok(())
    }

    /// What the kernel does when the bench dies: closes the bench's end of the watcher's pipe.
    #[cfg(test)]
    pub(crate) fn as_if_the_bench_died(&mut self) {
        if let Some(w) = self.watcher.as_mut() {
            drop(w.stdin.take());
        }
    }

    /// The last lines of the process's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

/// `kill -9` and reap `child`, if any. Already gone is fine; nothing else can be done about a
/// failure here.
fn stop(child: Option<Child>) {
    if let Some(mut c) = child {
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Free loopback ports, all bound at once before any is released so that the same port is
/// never handed out twice within one call.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let listeners: Vec<TcpListener> =
        (0..n).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<std::io::Result<_>>()?;
    listeners.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

/// One delayd node the bench started.
struct Node {
    id: u64,
    args: Vec<String>,
    data_dir: PathBuf,
    log: PathBuf,
    proc: Option<Proc>,
}

/// A delayd cluster: either started here (and killed on drop) or given by address.
pub struct Cluster {
    /// A label for tables, e.g. `delayd 3 nodes`.
    pub name: String,
    /// Each node's HTTP base URL, in node-id order.
    pub urls: Vec<String>,
    /// Each node's gRPC address (`host:port`), in node-id order; empty for a target.
    pub grpc: Vec<String>,
    /// Each node's Disque-protocol address, in node-id order; empty for a target.
    pub disque: Vec<String>,
    /// The credential every request shows: a target's token, or the admin token of a
    /// cluster the bench started with auth on; `None` for one started with `--dev`.
    pub token: Option<String>,
    /// The only node clients talk to, when they are steered to the leader.
    steered: Option<String>,
    bin: PathBuf,
    nodes: Vec<Node>,
    // Dropped after `nodes` (field order): the processes die before their directories go.
    _dir: Option<tempfile::TempDir>,
}

impl Cluster {
    /// Starts `n` nodes of `bin` on fresh ports and temp data dirs and waits for a leader.
    /// With `auth` the nodes run as in production, without `--dev`: they share one admin
    /// token file, which the first node to start generates, and every request shows it.
    pub async fn start(bin: &Path, n: usize, auth: bool) -> Result<Cluster> {
        let dir = tempfile::Builder::new().prefix("delayd-bench-").tempdir()?;
        // Not a node's default `<data_dir>/admin-token`: the nodes of one cluster must all
        // know the same token, and delayd lets nodes share a file (the first one writes it).
        let token_file = dir.path().join("admin-token");
        let ports = free_ports(3 * n)?;
        let (http, rest) = ports.split_at(n);
        let (grpc, disque) = rest.split_at(n);
        let peers = if n > 1 {
            (0..n).map(|i| format!("{}=127.0.0.1:{}", i + 1, grpc[i])).collect::<Vec<_>>().join(",")
        } else {
            String::new()
        };
        let mut nodes = Vec::new();
        for i in 0..n {
            let id = i as u64 + 1;
            let data_dir = dir.path().join(format!("node{id}"));
            let mut args = if auth {
                vec!["--admin-token-file".to_string(), token_file.display().to_string()]
            } else {
                // By default the bench measures the queue, not authentication.
                vec!["--dev".to_string()]
            };
            args.extend([
                "--node-id".to_string(),
                id.to_string(),
                "--data-dir".into(),
                data_dir.display().to_string(),
                "--http-addr".into(),
                format!("127.0.0.1:{}", http[i]),
                "--grpc-addr".into(),
                format!("127.0.0.1:{}", grpc[i]),
                "--advertise-addr".into(),
                format!("127.0.0.1:{}", grpc[i]),
                "--disque-addr".into(),
                format!("127.0.0.1:{}", disque[i]),
            ]);
            if !peers.is_empty() {
                args.extend(["--peers".to_string(), peers.clone()]);
            }
            let log = dir.path().join(format!("node{id}.log"));
            nodes.push(Node { id, args, data_dir, log, proc: None });
        }
        let name = format!(
            "delayd {n} node{}{}",
            if n == 1 { "" } else { "s" },
            if auth { " (auth)" } else { "" }
        );
        let urls = http.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
        let grpc = grpc.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let disque = disque.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut cluster = Cluster {
            name,
            urls,
            grpc,
            disque,
            token: None,
            steered: None,
            bin: bin.to_path_buf(),
            nodes,
            _dir: Some(dir),
        };
        for i in 0..n {
            cluster.launch(i)?;
        }
        cluster.wait_leader(READY_TIMEOUT).await?;
        if auth {
            // A node writes the file before it serves anything, so it is there by now.
            let text = std::fs::read_to_string(&token_file)
                .with_context(|| format!("read the generated {}", token_file.display()))?;
            cluster.token = Some(text.trim().to_string());
        }
        Ok(cluster)
    }

    /// A cluster the bench did not start: only its HTTP addresses are known.
    pub fn target(urls: Vec<String>, token: Option<String>) -> Cluster {
        let urls = urls.into_iter().map(|u| u.trim_end_matches('/').to_string()).collect();
        Cluster {
            name: "delayd target".into(),
            urls,
            grpc: Vec::new(),
            disque: Vec::new(),
            token,
            steered: None,
            bin: PathBuf::new(),
            nodes: Vec::new(),
            _dir: None,
        }
    }

    /// Whether the bench started these processes (so it can kill them and read `/proc`).
    pub fn is_local(&self) -> bool {
        !self.nodes.is_empty()
    }

    /// Process ids of the running nodes the bench started (none for a target).
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().filter_map(|n| n.proc.as_ref()?.pid()).collect()
    }

    /// Each running node's id and process id (none for a target).
    pub fn node_pids(&self) -> Vec<(u64, u32)> {
        self.nodes.iter().filter_map(|n| Some((n.id, n.proc.as_ref()?.pid()?))).collect()
    }

    fn launch(&mut self, i: usize) -> Result<()> {
        let node = &mut self.nodes[i];
        node.proc = Some(Proc::spawn(&self.bin, &node.args, &node.log)?);
        Ok(())
    }

    fn check_alive(&mut self) -> Result<()> {
        for n in &mut self.nodes {
            if let Some(p) = n.proc.as_mut() {
                p.check_alive().with_context(|| format!("delayd node {}", n.id))?;
            }
        }
        Ok(())
    }

    /// Makes the leader the only node the workloads talk to (`--via-leader`), as a load
    /// balancer that checks `/ready?role=leader` would; the other nodes still run and
    /// replicate.
    pub async fn steer_to_leader(&mut self) -> Result<()> {
        let leader = self.wait_leader(READY_TIMEOUT).await?;
        let url = self.url_of(leader).context("the leader has no URL")?.to_string();
        self.steered = Some(url);
        self.name.push_str(" via the leader");
        Ok(())
    }

    /// Sends the clients to `leader` when they are steered to another node (the leader moved
    /// since [`Cluster::steer_to_leader`]); says whether they were.
    pub fn follow_leader(&mut self, leader: u64) -> Result<bool> {
        let Some(steered) = &self.steered else { return Ok(false) };
        let url = self.url_of(leader).context("the leader has no URL")?.to_string();
        if *steered == url {
            return Ok(false);
        }
        self.steered = Some(url);
        Ok(true)
    }

    /// The base URLs clients spread over: every node, or only the leader after
    /// [`Cluster::steer_to_leader`].
    pub fn client_urls(&self) -> Vec<String> {
        match &self.steered {
            Some(url) => vec![url.clone()],
            None => self.urls.clone(),
        }
    }

    /// Waits until every live node reports the same leader, and returns its id.
    pub async fn wait_leader(&mut self, timeout: Duration) -> Result<u64> {
        self.wait_new_leader(None, timeout).await
    }

    /// Like [`Cluster::wait_leader`], but a leader equal to `not` does not count: after a
    /// leader is killed the survivors keep naming it until their election timeout fires.
    pub async fn wait_new_leader(&mut self, not: Option<u64>, timeout: Duration) -> Result<u64> {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            let mut leaders = Vec::new();
            for url in self.live_urls() {
                leaders.push(health(&http, &url).await.ok().and_then(|h| h["leader"].as_u64()));
            }
            if let Some(Some(first)) = leaders.first() {
                if Some(*first) != not && leaders.iter().all(|l| *l == Some(*first)) {
                    return Ok(*first);
                }
            }
            if Instant::now() > deadline {
                bail!("no leader agreed on by all nodes within {timeout:?}: {leaders:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// HTTP URLs of nodes that are running (all of them for a target cluster).
    pub fn live_urls(&self) -> Vec<String> {
        if self.nodes.is_empty() {
            return self.urls.clone();
        }
        self.nodes
            .iter()
            .zip(&self.urls)
            .filter(|(n, _)| n.proc.is_some())
            .map(|(_, u)| u.clone())
            .collect()
    }

    /// The HTTP URL of node `id`.
    pub fn url_of(&self, id: u64) -> Option<&str> {
        self.urls.get((id as usize).checked_sub(1)?).map(String::as_str)
    }

    /// `kill -9` node `id`.
    pub fn kill9(&mut self, id: u64) -> Result<()> {
        let node = self.nodes.iter_mut().find(|n| n.id == id).context("no such local node")?;
        if let Some(mut p) = node.proc.take() {
            p.kill9();
        }
        Ok(())
    }

    /// Starts node `id` again with its old flags and data, and waits until it agrees on the
    /// leader and has applied as far as the leader had when it came back.
    pub async fn restart(&mut self, id: u64) -> Result<()> {
        let i = self.nodes.iter().position(|n| n.id == id).context("no such local node")?;
        self.launch(i)?;
        let leader = self.wait_leader(READY_TIMEOUT).await?;
        self.wait_applied(leader, READY_TIMEOUT).await
    }

    /// Waits until every live node has applied at least what `leader` has applied now, so
    /// that what is measured on followers includes the work just done.
    pub async fn wait_applied(&mut self, leader: u64, timeout: Duration) -> Result<()> {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        let url = self.url_of(leader).context("leader has no URL")?.to_string();
        let target = health(&http, &url).await?["last_applied"].as_u64().unwrap_or(0);
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            let mut behind = Vec::new();
            for url in self.live_urls() {
                let applied =
                    health(&http, &url).await.ok().and_then(|h| h["last_applied"].as_u64());
                if applied.unwrap_or(0) < target {
                    behind.push(url);
                }
            }
            if behind.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("nodes {behind:?} did not reach applied index {target} within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Per live local node: (id, RSS bytes, data-dir bytes on disk).
    pub fn footprint(&self) -> Vec<(u64, Option<u64>, u64)> {
        self.nodes
            .iter()
            .filter_map(|n| {
                let pid = n.proc.as_ref()?.pid()?;
                Some((n.id, rss_bytes(pid), du_bytes(&n.data_dir)))
            })
            .collect()
    }
}

/// `GET {url}/health` as JSON.
pub async fn health(http: &reqwest::Client, url: &str) -> Result<Value> {
    Ok(http.get(format!("{url}/health")).send().await?.error_for_status()?.json().await?)
}

/// Resident set size of `pid` from `/proc/<pid>/status` (`VmRSS`, in kB there).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Bytes allocated on disk under `dir`, like `du -s` (blocks, not apparent sizes, so sparse
/// or preallocated RocksDB files count as what they really take).
pub fn du_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => du_bytes(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

/// The first file named `name` on `PATH`, if any.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// The delayd binary to start: `--bin` if given, else the release build next to this
/// binary's target directory if it exists, else the debug build.
pub fn default_bin() -> PathBuf {
    let target = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.to_path_buf()))
        .unwrap_or_else(|| PathBuf::from("target"));
    let release = target.join("release/delayd");
    if release.exists() {
        return release;
    }
    let debug = target.join("debug/delayd");
    if debug.exists() {
        return debug;
    }
    // Run from the workspace root without a built bench next to it.
    let cwd_release = PathBuf::from("target/release/delayd");
    if cwd_release.exists() {
        cwd_release
    } else {
        PathBuf::from("target/debug/delayd")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Clients steered to the leader follow it when it moves, and say so once; clients spread
    /// over every node stay spread.
    #[test]
    fn steered_clients_follow_a_leader_that_moved() {
        let urls: Vec<String> = (1..=3).map(|i| format!("http://127.0.0.1:{i}")).collect();
        let mut spread = Cluster::target(urls.clone(), None);
        assert!(!spread.follow_leader(2).unwrap());
        assert_eq!(spread.client_urls(), urls);

        let mut steered = Cluster::target(urls.clone(), None);
        steered.steered = Some(urls[0].clone());
        assert!(!steered.follow_leader(1).unwrap(), "still the leader");
        assert!(steered.follow_leader(3).unwrap());
        assert_eq!(steered.client_urls(), [urls[2].clone()]);
        assert!(!steered.follow_leader(3).unwrap(), "moved once");
        assert!(steered.follow_leader(9).is_err(), "no such node");
    }

    /// The watcher waits while the bench lives, and once the bench's end of its pipe closes
    /// (as the kernel closes it when the bench dies, however) it kills the child and ends.
    #[cfg(target_os = "linux")]
    #[test]
    fn children_are_killed_once_the_bench_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let args = ["600".to_string()];
        let mut proc = Proc::spawn(Path::new("sleep"), &args, &dir.path().join("log")).unwrap();
        let watcher = proc.watcher.as_ref().unwrap().id();
        // The watcher is waiting once its shell is blocked (state S) with its pipe open: a
        // watcher that killed at once would have ended instead.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{watcher}/stat")).unwrap();
            let state = stat.rsplit(')').next().unwrap().split_whitespace().next().unwrap();
            let comm = std::fs::read_to_string(format!("/proc/{watcher}/comm")).unwrap();
            if state == "S" && comm.trim() == "sh" {
                break;
            }
            assert!(Instant::now() < deadline, "the watcher did not settle in 30 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        let alive = |c: &mut Option<Child>| c.as_mut().unwrap().try_wait().unwrap().is_none();
        assert!(alive(&mut proc.child), "the child was killed while the bench lived");
        assert!(alive(&mut proc.watcher), "the watcher ended while the bench lived");
        proc.as_if_the_bench_died();
        while alive(&mut proc.child) {
            assert!(Instant::now() < deadline, "the child outlived the bench by 30 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        let status = proc.watcher.as_mut().unwrap().wait().unwrap();
        assert!(status.success(), "the watcher's kill failed: {status}");
    }

    /// A child that exits by itself is reaped with its watcher.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_watcher_goes_with_a_child_that_exited() {
        let dir = tempfile::tempdir().unwrap();
        let mut proc = Proc::spawn(Path::new("true"), &[], &dir.path().join("log")).unwrap();
        let watcher = proc.watcher.as_ref().unwrap().id();
        let deadline = Instant::now() + Duration::from_secs(30);
        while proc.check_alive().is_ok() {
            assert!(Instant::now() < deadline, "`true` ran for 30 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(proc.child.is_none() && proc.watcher.is_none());
        // Killed and reaped: its process is gone.
        assert!(!Path::new(&format!("/proc/{watcher}")).exists());
    }
}
