//! Hostile and careless input against a real 3-node cluster: no request a namespace token may
//! send can make the cluster spin, lose its leader, or accept what it cannot deliver.
//!
//! Each scenario is a defect that was found on a release cluster: a far-future ttl that made
//! the timer pump propose empty ticks forever, a legal bulk larger than the Raft transport's
//! message limit that cost an election, unbounded attributes, a ttl equal to the delay that
//! silently dropped the job, and a destroy whose work grew with the queue in one entry.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use delayd_tests::{n, now_ms, s, Cluster};
use serde_json::Value;

/// The scenarios run one at a time: each is a 3-node cluster under heavy load, and they
/// measure idleness and latency, which a neighbour's load would distort.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Raft term and leader id as node `i` reports them.
async fn term_and_leader(c: &Cluster, i: usize) -> Result<(u64, u64)> {
    let (_, h) = c.api(i).get("/health").await?;
    Ok((n(&h, "term")?, n(&h, "leader")?))
}

/// CPU seconds (user + system) the process has used so far, from `/proc/<pid>/stat`.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let rest = stat.rsplit_once(')').context("stat format")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

async fn applied(c: &Cluster, i: usize) -> Result<u64> {
    let (_, h) = c.api(i).get("/health").await?;
    n(&h, "last_applied")
}

#[tokio::test]
async fn a_far_future_ttl_is_refused_and_the_farthest_legal_one_leaves_the_cluster_idle(
) -> Result<()> {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, &[]).await?;
    let leader = c.leader(Duration::from_secs(20)).await?;
    let api = c.api(leader);

    // The request that made the pump spin: 18446744073709 s is beyond lmstfy's 32-bit seconds.
    let (st, e) = api.put("/api/t/q?ttl=18446744073709", "x").await?;
    ensure!(st == 400 && e["error"].as_str().is_some_and(|m| m.contains("ttl")), "{st} {e}");
    // Inside the width but beyond the horizon (10 years by default).
    let (st, e) = api.put("/api/t/q?delay=4000000000", "x").await?;
    ensure!(st == 400 && e["error"].as_str().is_some_and(|m| m.contains("horizon")), "{st} {e}");
    let (st, e) = api.put(&format!("/api/t/q?at={}", u64::MAX), "x").await?;
    ensure!(st == 400 && e["error"].as_str().is_some_and(|m| m.contains("at")), "{st} {e}");
    let (_, size) = api.get("/api/t/q/size").await?;
    ensure!(n(&size, "size")? == 0, "nothing written: {size}");

    // The farthest legal deadlines: a ttl and a delay at the horizon.
    let horizon_s = 10 * 365 * 86_400u64;
    let (st, e) = api.put(&format!("/api/t/far?ttl={horizon_s}"), "x").await?;
    ensure!(st == 201, "{st} {e}");
    let (st, e) =
        api.put(&format!("/api/t/far?delay={}&ttl={horizon_s}", horizon_s - 1), "y").await?;
    ensure!(st == 201, "{st} {e}");
    c.converged(&[0, 1, 2], Duration::from_secs(10)).await?;

    // Idle: no entry is applied and the nodes use next to no CPU.
    let window = Duration::from_millis(1500);
    let before = applied(&c, leader).await?;
    let cpu_before: f64 = c.nodes.iter().map(|s| cpu_seconds(s.pid())).sum::<Result<f64>>()?;
    tokio::time::sleep(window).await; // measuring idleness: the window is the point
    let cpu = c.nodes.iter().map(|s| cpu_seconds(s.pid())).sum::<Result<f64>>()? - cpu_before;
    let moved = applied(&c, leader).await? - before;
    eprintln!(
        "idle after far-future deadlines: {moved} entries applied, {cpu:.2} CPU s in {window:?}"
    );
    ensure!(moved == 0, "{moved} entries applied while idle");
    ensure!(cpu < 0.3 * window.as_secs_f64(), "{cpu:.2} CPU s across 3 nodes while idle");

    // The pump still serves near deadlines: a 300 ms job is delivered on time.
    let (st, e) = api.put("/api/t/soon?delay_ms=300", "z").await?;
    ensure!(st == 201, "{st} {e}");
    let (st, got) = api.get("/api/t/soon?timeout=5&ttr=30").await?;
    let late = now_ms() as i64 - n(&got, "due_at_ms")? as i64;
    ensure!(st == 200 && s(&got, "job_id").is_ok(), "{st} {got}");
    ensure!((0..500).contains(&late), "delivered {late} ms after its due time");
    Ok(())
}

/// PUTs `body` over a raw connection while reading, and returns the server's answer: the
/// server refuses an oversized body as soon as it has read past the limit and closes the
/// connection, so a client that only reads after writing everything sees a broken pipe.
async fn put_reading_early(url: &str, path: &str, body: String) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("http://");
    let conn = tokio::net::TcpStream::connect(addr).await?;
    let (mut rx, mut tx) = conn.into_split();
    let head =
        format!("PUT {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n", body.len());
    let writer = tokio::spawn(async move {
        // Errors are expected once the server has answered and closed.
        let _ = tx.write_all(head.as_bytes()).await;
        let _ = tx.write_all(body.as_bytes()).await;
    });
    let mut answer = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(20), rx.read(&mut answer)).await??;
    writer.abort();
    Ok(String::from_utf8_lossy(&answer[..n]).into_owned())
}

/// A JSON bulk body of `n` jobs of `size` bytes each.
fn bulk(n: usize, size: usize) -> String {
    let one = format!("\"{}\"", "b".repeat(size - 2));
    format!("[{}]", vec![one; n].join(","))
}

#[tokio::test]
async fn oversized_requests_are_refused_whole_and_legal_large_ones_never_cost_an_election(
) -> Result<()> {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, &[]).await?;
    let leader = c.leader(Duration::from_secs(20)).await?;
    let follower = (leader + 1) % 3;
    let (term, leader_id) = term_and_leader(&c, leader).await?;
    const MIB: usize = 1024 * 1024;

    // 64 × 1 MiB is inside the per-job limits but not one entry: 413, nothing written,
    // through the leader and through a follower.
    for i in [leader, follower] {
        let answer = put_reading_early(&c.nodes[i].url, "/api/t/big/bulk", bulk(64, MIB)).await?;
        ensure!(answer.starts_with("HTTP/1.1 413"), "node {i}: {answer}");
    }
    ensure!(n(&c.api(leader).get("/api/t/big/size").await?.1, "size")? == 0);

    // A bulk that fits one entry lands whole.
    let (st, e) = c.api(follower).put("/api/t/big/bulk", bulk(3, MIB)).await?;
    ensure!(st == 201 && e["job_ids"].as_array().map(Vec::len) == Some(3), "{st} {e}");

    // 80 concurrent 1 MiB publishes over every node: more than the disks take within the
    // request timeout. Each is either written (201) or refused at once with nothing written
    // (503 saying so); none is left with an unknown outcome, and none costs an election.
    let mut tasks = Vec::new();
    for i in 0..80 {
        let api = c.api(i % 3);
        tasks.push(tokio::spawn(async move { api.put("/api/t/big", vec![b'p'; MIB]).await }));
    }
    let mut written = 0;
    for t in tasks {
        let (st, e) = t.await??;
        match st {
            201 => written += 1,
            503 if e["error"].as_str().is_some_and(|m| m.contains("nothing was written")) => {}
            _ => anyhow::bail!("{st} {e}"),
        }
    }
    eprintln!("80 concurrent 1 MiB publishes: {written} written, {} refused", 80 - written);
    ensure!(written > 0, "every publish was refused");
    let held = n(&c.api(leader).get("/api/t/big/size").await?.1, "size")?;
    ensure!(held == 3 + written, "{held} jobs held, {written} + 3 acknowledged");

    // A reserve of 100 such jobs through a follower answers with what fits one reply.
    let mut taken = 0;
    while taken < held as usize {
        let (st, got) = c.api(follower).get("/api/t/big?count=100&ttr=60").await?;
        ensure!(st == 200, "{st} {got}");
        let got = got.as_array().cloned().unwrap_or_default();
        ensure!(!got.is_empty() && got.len() <= 8, "{} jobs of 1 MiB in one reply", got.len());
        taken += got.len();
    }

    // Attributes are bounded, and a ttl that ends when the job is due is refused.
    let http = reqwest::Client::new();
    let r = http
        .put(format!("{}/api/t/q", c.nodes[leader].url))
        .header("Job-Attr-Big", "a".repeat(200 * 1024))
        .body("x")
        .send()
        .await?;
    let status = r.status().as_u16();
    let text = r.text().await?;
    ensure!(status == 400 && text.contains("attribute"), "{status} {text}");
    let (st, e) = c.api(leader).put("/api/t/q?delay=1&ttl=1", "x").await?;
    ensure!(st == 400 && e["error"].as_str().is_some_and(|m| m.contains("ttl")), "{st} {e}");

    ensure!(
        term_and_leader(&c, leader).await? == (term, leader_id),
        "the leader or its term changed"
    );
    Ok(())
}

#[tokio::test]
async fn a_destroy_of_100k_jobs_runs_in_chunks_without_stalling_other_clients() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, &[]).await?;
    let leader = c.leader(Duration::from_secs(20)).await?;
    let api = c.api(leader);
    let total = 100_000usize;
    let batch = bulk(64, 64);
    let mut tasks = Vec::new();
    for w in 0..8 {
        let (api, batch) = (c.api(w % 3), batch.clone());
        tasks.push(tokio::spawn(async move {
            for _ in (w..total.div_ceil(64)).step_by(8) {
                let (st, e) = api.put("/api/t/doomed/bulk?ttl=0", batch.clone()).await?;
                ensure!(st == 201, "{st} {e}");
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let held = n(&api.get("/api/t/doomed/size").await?.1, "size")?;
    ensure!(held as usize >= total, "{held}");

    // Another client publishes and consumes on another queue meanwhile; its latencies are
    // what the destroy must not stall.
    let other = c.api((leader + 1) % 3);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let prober = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                let (st, e) = other.put("/api/t/alive", "x").await?;
                ensure!(st == 201, "{st} {e}");
                let (st, got) = other.get("/api/t/alive?ttr=30").await?;
                ensure!(st == 200, "{st} {got}");
                let (id, lease) = (s(&got, "job_id")?, s(&got, "lease")?);
                let (st, _) = other.delete(&format!("/api/t/alive/job/{id}?lease={lease}")).await?;
                ensure!(st == 204, "ack {st}");
                latencies.push(t.elapsed());
            }
            Ok::<_, anyhow::Error>(latencies)
        })
    };
    let t = Instant::now();
    let (st, e) = api.delete("/api/t/doomed?all=true").await?;
    let took = t.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut latencies = prober.await??;
    ensure!(st == 200 || st == 204, "{st} {e}");
    ensure!(n(&api.get("/api/t/doomed/size").await?.1, "size")? == 0);
    latencies.sort();
    ensure!(!latencies.is_empty(), "the other client made no progress during the destroy");
    let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
    eprintln!(
        "destroy of {held} jobs took {took:?}; meanwhile {} publish+reserve+ack rounds, p99 {p99:?}",
        latencies.len()
    );
    ensure!(p99 < Duration::from_secs(1), "p99 {p99:?} during the destroy");
    let digest: Value = c.converged(&[0, 1, 2], Duration::from_secs(20)).await?;
    ensure!(digest["applied_index"].as_u64().is_some());
    Ok(())
}
