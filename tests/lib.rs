//! Helpers for end-to-end tests: start the real `delayd` binary, talk to it over HTTP, kill it.
//!
//! The binary is found next to the test executable's directory (`target/<profile>/delayd`),
//! or at `$DELAYD_BIN`; `scripts/test.sh` builds it before the tests run.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// Path of the `delayd` binary under test.
pub fn delayd_bin() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("DELAYD_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test> → target/<profile>/delayd
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("delayd"))
        .context("cannot locate target directory")?;
    if !bin.exists() {
        bail!("{} not found: build it first (cargo build -p delayd)", bin.display());
    }
    Ok(bin)
}

/// A free loopback port (the OS picks it; we release it for the child to bind).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A running `delayd` process on loopback.
pub struct Server {
    child: Child,
    /// Base URL, e.g. `http://127.0.0.1:41234`.
    pub url: String,
    port: u16,
    data_dir: PathBuf,
    log: PathBuf,
}

impl Server {
    /// Starts delayd on `data_dir` with a fresh port and waits until it serves.
    pub async fn start(data_dir: &Path) -> Result<Server> {
        Self::start_on(data_dir, free_port()?).await
    }

    /// Starts delayd on `data_dir` and `port` and waits until it serves.
    pub async fn start_on(data_dir: &Path, port: u16) -> Result<Server> {
        let log = data_dir.with_extension("log");
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
        let child = Command::new(delayd_bin()?)
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--http-addr")
            .arg(format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "info,openraft=warn")
            .stdout(out.try_clone()?)
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .context("spawn delayd")?;
        let mut server = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
            port,
            data_dir: data_dir.to_path_buf(),
            log,
        };
        server.wait_ready().await?;
        Ok(server)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let client = reqwest::Client::new();
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

    /// `kill -9`: no chance to flush anything.
    pub fn kill9(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn terminate(&mut self) -> Result<std::process::ExitStatus> {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status()?;
        Ok(self.child.wait()?)
    }

    /// Starts a new process on the same data directory and port.
    pub async fn restart(&self) -> Result<Server> {
        Server::start_on(&self.data_dir, self.port).await
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
        Api { http: reqwest::Client::new(), base: server.url.clone() }
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
