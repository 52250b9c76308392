//! The harness's HTTP client for delayd, and the recorder every operation goes through.
//!
//! Outcomes are judged conservatively: only an answer that proves nothing happened is a
//! `Fail` (a 4xx, or a connection that was never made); a timeout, a 5xx or a broken
//! connection after sending is `Unknown`, because a write may have committed anyway (the
//! lesson of Redis-Raft's "no leader" write that later appeared).

use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use base64::Engine;
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::history::{Call, Delivery, Op, Outcome};

/// The namespace every workload queue lives in.
pub const NAMESPACE: &str = "jepsen";

/// What a client operation came to.
#[derive(Debug)]
pub enum Answer<T> {
    /// Confirmed by the server.
    Ok(T),
    /// Refused: it did not happen.
    Fail(String),
    /// Timed out or ambiguous.
    Unknown(String),
}

impl<T> Answer<T> {
    /// The history outcome.
    pub fn outcome(&self) -> Outcome {
        match self {
            Answer::Ok(_) => Outcome::Ok,
            Answer::Fail(_) => Outcome::Fail,
            Answer::Unknown(_) => Outcome::Unknown,
        }
    }
}

/// Talks HTTP to the cluster's nodes, with a hard timeout on every request.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    nodes: Vec<String>,
    timeout: Duration,
}

impl Client {
    /// A client for the nodes at `nodes` (base URLs), giving up on any request after
    /// `timeout` (on top of a long-poll's own wait).
    pub fn new(nodes: Vec<String>, timeout: Duration) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(1))
            .pool_idle_timeout(Duration::from_secs(5))
            .build()
            .context("building the HTTP client")?;
        Ok(Client { http, nodes, timeout })
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    async fn call(
        &self,
        node: usize,
        method: Method,
        path: &str,
        body: Option<String>,
        extra: Duration,
    ) -> Answer<(StatusCode, Value)> {
        let url = format!("{}{}", self.nodes[node % self.nodes.len()], path);
        let mut req = self.http.request(method, &url).timeout(self.timeout + extra);
        if let Some(b) = body {
            req = req.body(b);
        }
        match req.send().await {
            Ok(resp) => {
                let status = resp.status();
                let text = match resp.text().await {
                    Ok(t) => t,
                    Err(e) => return Answer::Unknown(format!("{url}: reading the answer: {e}")),
                };
                let value = serde_json::from_str(&text).unwrap_or(Value::Null);
                if status.is_server_error() {
                    Answer::Unknown(format!("{status} {text}"))
                } else {
                    Answer::Ok((status, value))
                }
            }
            // Never connected: the request cannot have reached the cluster.
            Err(e) if e.is_connect() => Answer::Fail(format!("{url}: connect: {e}")),
            Err(e) => Answer::Unknown(format!("{url}: {e}")),
        }
    }

    /// Publishes `body` to `queue` and returns the job id (the existing job's when `key` was
    /// already used).
    pub async fn publish(
        &self,
        node: usize,
        queue: &str,
        body: &str,
        delay_ms: u64,
        key: Option<&str>,
        tries: u32,
    ) -> Answer<String> {
        let mut path = format!("/api/{NAMESPACE}/{queue}?delay_ms={delay_ms}&tries={tries}&ttl=0");
        if let Some(k) = key {
            path.push_str(&format!("&key={k}"));
        }
        match self.call(node, Method::PUT, &path, Some(body.to_string()), Duration::ZERO).await {
            Answer::Ok((s, v)) if s.is_success() => match v["job_id"].as_str() {
                Some(id) => Answer::Ok(id.to_string()),
                None => Answer::Unknown(format!("{s} without a job id: {v}")),
            },
            Answer::Ok((s, v)) => Answer::Fail(format!("{s} {v}")),
            Answer::Fail(e) => Answer::Fail(e),
            Answer::Unknown(e) => Answer::Unknown(e),
        }
    }

    /// Reserves one job from any of `queues` with a time-to-run, long-polling up to `wait_s`.
    /// Returns the delivery and its queue, or `None` when nothing was ready.
    pub async fn reserve(
        &self,
        node: usize,
        queues: &str,
        ttr_ms: u64,
        wait_s: u64,
    ) -> Answer<Option<(String, Delivery)>> {
        let path = format!("/api/{NAMESPACE}/{queues}?ttr_ms={ttr_ms}&timeout={wait_s}");
        let wait = Duration::from_secs(wait_s);
        match self.call(node, Method::GET, &path, None, wait).await {
            Answer::Ok((StatusCode::NOT_FOUND, v)) if v["msg"] == "no job available" => {
                Answer::Ok(None)
            }
            Answer::Ok((StatusCode::OK, v)) => match delivery(&v) {
                Ok(d) => Answer::Ok(Some(d)),
                Err(e) => Answer::Unknown(format!("unreadable delivery {v}: {e}")),
            },
            Answer::Ok((s, v)) => Answer::Fail(format!("{s} {v}")),
            Answer::Fail(e) => Answer::Fail(e),
            Answer::Unknown(e) => Answer::Unknown(e),
        }
    }

    /// Acks a delivery, only if `lease` is still the job's current lease.
    pub async fn ack(&self, node: usize, queue: &str, job: &str, lease: &str) -> Answer<()> {
        let path = format!("/api/{NAMESPACE}/{queue}/job/{job}?lease={lease}");
        self.expect_success(node, Method::DELETE, &path).await
    }

    /// Releases a delivery back to its queue after `delay_ms`.
    pub async fn release(
        &self,
        node: usize,
        queue: &str,
        job: &str,
        lease: &str,
        delay_ms: u64,
    ) -> Answer<()> {
        let path =
            format!("/api/{NAMESPACE}/{queue}/job/{job}/release?lease={lease}&delay_ms={delay_ms}");
        self.expect_success(node, Method::PUT, &path).await
    }

    /// Whether job `id` of `queue` exists, by a linearizable read through `node`
    /// (`GET /api/<ns>/<queue>/job/<id>`): `Ok(true)` on 200, `Ok(false)` on 404.
    pub async fn job_exists(&self, node: usize, queue: &str, id: &str) -> Answer<bool> {
        let path = format!("/api/{NAMESPACE}/{queue}/job/{id}");
        match self.call(node, Method::GET, &path, None, Duration::ZERO).await {
            Answer::Ok((StatusCode::OK, _)) => Answer::Ok(true),
            Answer::Ok((StatusCode::NOT_FOUND, _)) => Answer::Ok(false),
            Answer::Ok((s, v)) => Answer::Unknown(format!("{s} {v}")),
            Answer::Fail(e) => Answer::Fail(e),
            Answer::Unknown(e) => Answer::Unknown(e),
        }
    }

    async fn expect_success(&self, node: usize, method: Method, path: &str) -> Answer<()> {
        match self.call(node, method, path, None, Duration::ZERO).await {
            Answer::Ok((s, _)) if s.is_success() => Answer::Ok(()),
            Answer::Ok((s, v)) => Answer::Fail(format!("{s} {v}")),
            Answer::Fail(e) => Answer::Fail(e),
            Answer::Unknown(e) => Answer::Unknown(e),
        }
    }

    /// A GET that must answer 2xx with JSON.
    pub async fn get_json(&self, node: usize, path: &str) -> anyhow::Result<Value> {
        self.admin(node, Method::GET, path).await
    }

    /// Any request that must answer 2xx; the JSON body (`null` if none).
    pub async fn admin(&self, node: usize, method: Method, path: &str) -> anyhow::Result<Value> {
        match self.call(node, method, path, None, Duration::ZERO).await {
            Answer::Ok((s, v)) if s.is_success() => Ok(v),
            Answer::Ok((s, v)) => bail!("node {}: {path}: {s} {v}", node + 1),
            Answer::Fail(e) | Answer::Unknown(e) => bail!("node {}: {path}: {e}", node + 1),
        }
    }

    /// The leader as `node` sees it (a Raft node id), if it knows one.
    pub async fn leader_seen_by(&self, node: usize) -> Option<u64> {
        self.get_json(node, "/health").await.ok().and_then(|v| v["leader"].as_u64())
    }

    /// The leader most nodes agree on, if a majority of them answer with the same one.
    pub async fn leader(&self) -> Option<u64> {
        let mut votes = std::collections::BTreeMap::new();
        for n in 0..self.nodes.len() {
            if let Some(l) = self.leader_seen_by(n).await {
                *votes.entry(l).or_insert(0) += 1;
            }
        }
        votes.into_iter().find(|(_, v)| *v * 2 > self.nodes.len()).map(|(l, _)| l)
    }
}

fn delivery(v: &Value) -> anyhow::Result<(String, Delivery)> {
    let field = |k: &str| v[k].as_str().map(str::to_string).ok_or_else(|| anyhow!("no {k}"));
    let data = base64::engine::general_purpose::STANDARD
        .decode(field("data")?)
        .context("data is not base64")?;
    let d = Delivery {
        job_id: field("job_id")?,
        body: String::from_utf8(data).context("body is not UTF-8")?,
        attempt: v["attempt"].as_u64().ok_or_else(|| anyhow!("no attempt"))? as u32,
        lease: field("lease")?,
    };
    Ok((field("queue")?, d))
}

/// Timestamps operations on the harness's one monotonic clock and keeps the history, also
/// streaming it to `history.jsonl` so a crashed harness still leaves what it saw.
pub struct Recorder {
    start: Instant,
    ops: Mutex<Vec<Op>>,
    file: Mutex<std::io::BufWriter<std::fs::File>>,
}

impl Recorder {
    /// A recorder whose time zero is now, writing to `path`.
    pub fn create(path: &std::path::Path) -> anyhow::Result<Self> {
        let file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Recorder {
            start: Instant::now(),
            ops: Mutex::new(Vec::new()),
            file: Mutex::new(std::io::BufWriter::new(file)),
        })
    }

    /// Harness time: ms since the recorder was made.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Records one finished operation.
    pub fn record(&self, process: u64, invoke_ms: u64, outcome: Outcome, call: Call) {
        let op = Op { process, invoke_ms, complete_ms: self.now_ms(), outcome, call };
        if let Ok(line) = serde_json::to_string(&op) {
            if let Ok(mut f) = self.file.lock() {
                // The in-memory history is what gets checked; the file is for people.
                let _ = writeln!(f, "{line}");
            }
        }
        if let Ok(mut ops) = self.ops.lock() {
            ops.push(op);
        }
    }

    /// Operations recorded so far.
    pub fn len(&self) -> usize {
        self.ops.lock().map(|o| o.len()).unwrap_or_default()
    }

    /// Whether nothing was recorded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The history so far, flushed to disk.
    pub fn history(&self) -> Vec<Op> {
        if let Ok(mut f) = self.file.lock() {
            let _ = f.flush();
        }
        self.ops.lock().map(|o| o.clone()).unwrap_or_default()
    }
}
