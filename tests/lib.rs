//! Helpers for end-to-end tests: start the real `delayd` binary, talk to it over HTTP, kill it.
//!
//! The binaries are found next to the test executable's directory (`target/<profile>/delayd`,
//! `target/<profile>/delayctl`), or at `$DELAYD_BIN` / `$DELAYCTL_BIN`; `scripts/test.sh`
//! builds them before the tests run.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

/// Path of the `delayd` binary under test.
pub fn delayd_bin() -> Result<PathBuf> {
    workspace_bin("delayd", "DELAYD_BIN")
}

/// Path of the `delayctl` binary under test.
pub fn delayctl_bin() -> Result<PathBuf> {
    workspace_bin("delayctl", "DELAYCTL_BIN")
}

/// A binary of this workspace: `$env` if set, else next to the test executable's directory.
fn workspace_bin(name: &str, env: &str) -> Result<PathBuf> {
    if let Ok(p) = std::env::var(env) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join(name))
        .context("cannot locate target directory")?;
    if !bin.exists() {
        bail!("{} not found: build it first (cargo build --workspace --bins)", bin.display());
    }
    Ok(bin)
}

/// Whether a tool an optional test needs is here: `check` runs and succeeds. `false` means
/// skip, after saying on stderr what is missing and `hint` (how to install it); when the
/// environment variable `require` is set (CI sets it), a missing tool is an error instead.
pub async fn have_tool(
    what: &str,
    require: &str,
    hint: &str,
    check: &mut tokio::process::Command,
) -> Result<bool> {
    let ok =
        check.stdout(Stdio::null()).stderr(Stdio::null()).status().await.is_ok_and(|s| s.success());
    if ok {
        return Ok(true);
    }
    if std::env::var_os(require).is_some() {
        bail!("{what} is missing ({require} is set)");
    }
    eprintln!("skipped: {what} is missing{hint}");
    Ok(false)
}

/// A free loopback port for a child process to bind.
///
/// Ports come from below Linux's ephemeral range (32768+), so the OS never hands one of them
/// to an outgoing connection between our check and the child's bind; a per-process counter
/// keeps concurrent tests apart, and each candidate is checked by binding it.
pub fn free_port() -> Result<u16> {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 100) as u16 * 120;
    for _ in 0..120 {
        let port = base + NEXT.fetch_add(1, Ordering::Relaxed) % 120;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A running `delayd` process on loopback.
pub struct Server {
    child: Child,
    /// Base URL, e.g. `http://127.0.0.1:41234`.
    pub url: String,
    /// Raft node id.
    pub id: u64,
    /// Internal gRPC address.
    pub grpc: String,
    port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    /// The CA its HTTP certificate is verified with, when it serves TLS.
    trust: Option<reqwest::Certificate>,
}

impl Server {
    /// Starts a single-node delayd on `data_dir` with fresh ports and waits until it serves.
    pub async fn start(data_dir: &Path) -> Result<Server> {
        Self::spawn(1, data_dir, free_port()?, free_port()?, Vec::new()).await
    }

    /// Starts node `id` with the given ports and extra flags, and waits until it serves HTTP.
    pub async fn spawn(
        id: u64,
        data_dir: &Path,
        http_port: u16,
        grpc_port: u16,
        extra: Vec<String>,
    ) -> Result<Server> {
        Self::spawn_trusting(id, data_dir, http_port, grpc_port, extra, None).await
    }

    /// [`Server::spawn`]; with `trust`, a node serving TLS (`extra` names its certificate)
    /// reached over `https://` and verified with the CA `trust`.
    pub async fn spawn_trusting(
        id: u64,
        data_dir: &Path,
        http_port: u16,
        grpc_port: u16,
        extra: Vec<String>,
        trust: Option<reqwest::Certificate>,
    ) -> Result<Server> {
        let mut args = vec![
            "--node-id".to_string(),
            id.to_string(),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--http-addr".into(),
            format!("127.0.0.1:{http_port}"),
            "--grpc-addr".into(),
            format!("127.0.0.1:{grpc_port}"),
        ];
        // Authentication off, unless the test brings its own security flags.
        if !extra.iter().any(|a| a.starts_with("--admin-token") || a.starts_with("--dev")) {
            args.push("--dev".into());
        }
        args.extend(extra);
        let log = data_dir.with_extension("log");
        let mut server = Server {
            child: Self::launch(&args, &log)?,
            url: format!(
                "{}://127.0.0.1:{http_port}",
                if trust.is_some() { "https" } else { "http" }
            ),
            id,
            grpc: format!("127.0.0.1:{grpc_port}"),
            port: http_port,
            data_dir: data_dir.to_path_buf(),
            log,
            args,
            trust,
        };
        server.wait_ready().await?;
        Ok(server)
    }

    fn launch(args: &[String], log: &Path) -> Result<Child> {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        Command::new(delayd_bin()?)
            .args(args)
            .env("RUST_LOG", "info,openraft=warn")
            .stdout(out.try_clone()?)
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .context("spawn delayd")
    }

    /// The leader this node reports on `/health`, if it knows one (and answers within 500 ms).
    pub async fn reported_leader(&self) -> Option<u64> {
        let http = self.client_builder().timeout(Duration::from_millis(500)).build().ok()?;
        let api = Api { http, base: self.url.clone() };
        let Ok((200, h)) = api.get("/health").await else { return None };
        h["leader"].as_u64()
    }

    /// Waits until this node knows a leader, and returns its id. A node is ready (answers
    /// `/health`) before it has one; a write or a backup meanwhile gets 503.
    pub async fn wait_leader(&self, within: Duration) -> Result<u64> {
        eventually(within, || async { Ok(self.reported_leader().await) }).await
    }

    /// The value of the unlabelled series `name` in this node's `/metrics` (open with
    /// `--dev`), or `None` when the node does not export it.
    pub async fn metric(&self, name: &str) -> Result<Option<u64>> {
        let text = reqwest::get(format!("{}/metrics", self.url)).await?.text().await?;
        let prefix = format!("{name} ");
        Ok(text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.trim().parse().ok()))
    }

    /// An HTTP client builder that trusts this node's CA, if it serves TLS.
    pub fn client_builder(&self) -> reqwest::ClientBuilder {
        let builder = reqwest::Client::builder();
        match &self.trust {
            Some(ca) => builder.add_root_certificate(ca.clone()),
            None => builder,
        }
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let client = self.client_builder().build()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("delayd exited with {status}; log:\n{}", self.log_text());
            }
            if let Ok(r) = client.get(format!("{}/health", self.url)).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("delayd did not become ready; log:\n{}", self.log_text());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The process's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `kill -9`: no chance to flush anything.
    pub fn kill9(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Sends a signal by name (`STOP`, `CONT`, `TERM`).
    pub fn signal(&self, sig: &str) -> Result<()> {
        let status =
            Command::new("kill").args([format!("-{sig}"), self.pid().to_string()]).status()?;
        ensure!(status.success(), "kill -{sig} failed");
        Ok(())
    }

    /// Waits for the process to exit (after a signal sent with [`Server::signal`]).
    pub fn wait(&mut self) -> Result<std::process::ExitStatus> {
        Ok(self.child.wait()?)
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn terminate(&mut self) -> Result<std::process::ExitStatus> {
        self.signal("TERM")?;
        Ok(self.child.wait()?)
    }

    /// Starts a new process with the same flags, data directory and ports.
    pub async fn restart(&self) -> Result<Server> {
        self.restart_with(self.args.clone()).await
    }

    /// The flags this process was started with (ports and data directory included).
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// Starts a new process on the same data directory and ports with the flags `args`
    /// (the old process must be gone).
    pub async fn restart_with(&self, args: Vec<String>) -> Result<Server> {
        let mut server = Server {
            child: Self::launch(&args, &self.log)?,
            url: self.url.clone(),
            id: self.id,
            grpc: self.grpc.clone(),
            port: self.port,
            data_dir: self.data_dir.clone(),
            log: self.log.clone(),
            args,
            trust: self.trust.clone(),
        };
        server.wait_ready().await?;
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A small HTTP client that returns `(status, json)`.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    /// A client of `server`.
    pub fn new(server: &Server) -> Api {
        // Only a bad CA certificate fails the build, and `spawn_trusting` built with it.
        let http = server.client_builder().build().unwrap_or_default();
        Api { http, base: server.url.clone() }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<(u16, Value)> {
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await?;
        let json = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes)? };
        Ok((status, json))
    }

    /// GET `path`.
    pub async fn get(&self, path: &str) -> Result<(u16, Value)> {
        self.send(self.http.get(format!("{}{path}", self.base))).await
    }

    /// A client of an arbitrary base URL, with a per-request timeout.
    pub fn with_timeout(base: &str, timeout: Duration) -> Result<Api> {
        let http = reqwest::Client::builder().timeout(timeout).build()?;
        Ok(Api { http, base: base.to_string() })
    }

    /// POST `path` with an empty body.
    pub async fn post(&self, path: &str) -> Result<(u16, Value)> {
        self.send(self.http.post(format!("{}{path}", self.base))).await
    }

    /// PUT `path` with a body.
    pub async fn put(&self, path: &str, body: impl Into<reqwest::Body>) -> Result<(u16, Value)> {
        self.send(self.http.put(format!("{}{path}", self.base)).body(body)).await
    }

    /// DELETE `path`.
    pub async fn delete(&self, path: &str) -> Result<(u16, Value)> {
        self.send(self.http.delete(format!("{}{path}", self.base))).await
    }
}

/// Polls `check` until it returns `Some`, failing after `within`.
pub async fn eventually<T, F, Fut>(within: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("condition not met within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The wall clock in unix ms.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Fresh `(http, grpc)` loopback ports for `n` founding nodes, and the `--peers` list that
/// names node `i + 1` at the gRPC port of index `i`.
pub fn founding_ports(n: u64) -> Result<(Vec<(u16, u16)>, String)> {
    let ports: Vec<(u16, u16)> =
        (0..n).map(|_| Ok((free_port()?, free_port()?))).collect::<Result<_>>()?;
    let peers = ports
        .iter()
        .enumerate()
        .map(|(i, (_, g))| format!("{}=127.0.0.1:{g}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    Ok((ports, peers))
}

/// A cluster of delayd processes on loopback, formed from one initial member list.
pub struct Cluster {
    /// The nodes, index `i` holds node id `i + 1`; `None` once removed from the harness.
    pub nodes: Vec<Server>,
    /// Keeps the data directories alive.
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts `n` founding nodes with `extra` flags each and waits until one leads.
    pub async fn start(n: u64, extra: &[&str]) -> Result<Cluster> {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        Self::start_each(n, |_| extra.clone()).await
    }

    /// Starts `n` founding nodes, node index `i` with the flags `extra(i)`, and waits until
    /// one leads.
    pub async fn start_each(n: u64, extra: impl Fn(usize) -> Vec<String>) -> Result<Cluster> {
        Self::start_each_trusting(n, extra, None).await
    }

    /// [`Cluster::start_each`] with nodes serving TLS, verified with the CA `trust` (see
    /// [`Server::spawn_trusting`]).
    pub async fn start_each_trusting(
        n: u64,
        extra: impl Fn(usize) -> Vec<String>,
        trust: Option<reqwest::Certificate>,
    ) -> Result<Cluster> {
        let dir = tempfile::tempdir()?;
        let (ports, peers) = founding_ports(n)?;
        let mut nodes = Vec::new();
        for (i, (h, g)) in ports.iter().enumerate() {
            let mut args = vec!["--peers".to_string(), peers.clone()];
            args.extend(extra(i));
            let data = dir.path().join(format!("node{}", i + 1));
            let id = i as u64 + 1;
            nodes.push(Server::spawn_trusting(id, &data, *h, *g, args, trust.clone()).await?);
        }
        let cluster = Cluster { nodes, dir };
        cluster.leader(Duration::from_secs(20)).await?;
        Ok(cluster)
    }

    /// Starts an extra node that waits to be added through the admin API.
    pub async fn spawn_joiner(&self, id: u64, extra: &[&str]) -> Result<Server> {
        let data = self.dir.path().join(format!("node{id}"));
        let mut args = vec!["--join".to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        Server::spawn(id, &data, free_port()?, free_port()?, args).await
    }

    /// The index in `nodes` of the leader that every listed reachable node agrees on.
    pub async fn leader(&self, within: Duration) -> Result<usize> {
        self.leader_among(&(0..self.nodes.len()).collect::<Vec<_>>(), within).await
    }

    /// The leader as seen by the nodes at `among` (all must agree), as an index in `nodes`.
    pub async fn leader_among(&self, among: &[usize], within: Duration) -> Result<usize> {
        eventually(within, || async {
            let mut seen = None;
            for &i in among {
                let Some(l) = self.nodes[i].reported_leader().await else { return Ok(None) };
                if seen.is_some_and(|s| s != l) {
                    return Ok(None);
                }
                seen = Some(l);
            }
            Ok(seen.and_then(|l| self.nodes.iter().position(|n| n.id == l)))
        })
        .await
    }

    /// A client of node index `i`.
    pub fn api(&self, i: usize) -> Api {
        Api::new(&self.nodes[i])
    }

    /// Waits until the nodes at `among` report the same applied index and state digest.
    pub async fn converged(&self, among: &[usize], within: Duration) -> Result<Value> {
        eventually(within, || async {
            let mut first: Option<Value> = None;
            for &i in among {
                let (st, d) = self.api(i).get("/admin/digest").await?;
                if st != 200 {
                    return Ok(None);
                }
                match &first {
                    None => first = Some(d),
                    Some(f) => {
                        if f["applied_index"] != d["applied_index"] || f["digest"] != d["digest"] {
                            return Ok(None);
                        }
                    }
                }
            }
            Ok(first)
        })
        .await
    }
}

/// A string field of a JSON answer, or an error naming it.
pub fn s(v: &Value, field: &str) -> Result<String> {
    v[field].as_str().map(str::to_string).with_context(|| format!("no {field} in {v}"))
}

/// An integer field of a JSON answer, or an error naming it.
pub fn n(v: &Value, field: &str) -> Result<u64> {
    v[field].as_u64().with_context(|| format!("no {field} in {v}"))
}
