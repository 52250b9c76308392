//! A small single-node benchmark: publish latency and timer lateness, in-process through the
//! service (the same path the HTTP handlers take), on a fresh RocksDB in a temp directory.
//!
//! `cargo run --example latency -p delayd-server -- [--jobs N] [--clients C] [--timer-jobs M]`
//!
//! Prints figures; exits non-zero if any job was delivered before its due time.

use std::time::{Duration, Instant};

use delayd_core::{Due, QueueName};
use delayd_percentiles::MillisRecorder;
use delayd_server::service::reserve::{ReserveOrder, ReserveRequest};
use delayd_server::service::PublishParams;
use delayd_server::{Config, Node, Principal};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Prints one line of figures: nearest-rank percentiles of an HDR histogram (see
/// `delayd-percentiles`: µs resolution, 3 significant digits), as the bench reports them.
fn summary(name: &str, recorded: &MillisRecorder, unit: &str) {
    let Some(s) = recorded.summary() else {
        println!("{name:<34} n=0");
        return;
    };
    println!(
        "{name:<34} n={:<6} p50={:>8.3}{unit} p99={:>8.3}{unit} p99.9={:>8.3}{unit} max={:>8.3}{unit}",
        s.count, s.p50, s.p99, s.p999, s.max,
    );
}

fn wall_ms() -> u64 {
    delayd_raft::clock::wall_ms()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let jobs = arg("--jobs", 5000);
    let clients = arg("--clients", 64);
    let timer_jobs = arg("--timer-jobs", 2000);
    let in_flight = arg("--in-flight", Config::default().max_in_flight);
    let linger_us = arg("--linger-us", Config::default().batch_linger.as_micros() as usize);
    let dir = tempfile::tempdir()?;
    let node = Node::start(Config {
        data_dir: dir.path().to_path_buf(),
        grpc_addr: "127.0.0.1:0".parse()?,
        max_in_flight: in_flight,
        batch_linger: std::time::Duration::from_micros(linger_us as u64),
        auth: delayd_server::config::AuthConfig::dev(),
        ..Config::default()
    })
    .await?;
    let params = PublishParams { ttl_ms: None, ..PublishParams::default() };
    let body = vec![b'x'; 100];
    println!("delayd single node, fsync per log append, 100-byte bodies");

    // 1. Publish latency, one client at a time: one Raft round (append + fsync + apply) each.
    let q = QueueName::new("bench", "seq");
    let mut lat = MillisRecorder::new();
    for _ in 0..jobs / 5 {
        let t = Instant::now();
        node.service().publish(&Principal::Dev, q.clone(), &params, body.clone()).await?;
        lat.record(t.elapsed().as_secs_f64() * 1000.0);
    }
    summary("publish latency, 1 client", &lat, "ms");

    // 2. Publish with concurrent clients: the proposer packs waiting requests into one entry.
    let q = QueueName::new("bench", "par");
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (node, q, params, body) = (node.clone(), q.clone(), params.clone(), body.clone());
        let per = jobs / clients;
        tasks.push(tokio::spawn(async move {
            let mut lat = MillisRecorder::new();
            for _ in 0..per {
                let t = Instant::now();
                node.service().publish(&Principal::Dev, q.clone(), &params, body.clone()).await?;
                lat.record(t.elapsed().as_secs_f64() * 1000.0);
            }
            Ok::<_, delayd_server::ServiceError>(lat)
        }));
    }
    let mut lat = MillisRecorder::new();
    for t in tasks {
        lat.merge(&t.await??);
    }
    let secs = start.elapsed().as_secs_f64();
    println!("publish throughput, {clients} clients      {:.0} jobs/s", lat.len() as f64 / secs);
    summary(&format!("publish latency, {clients} clients"), &lat, "ms");

    // 3. Timer lateness: jobs due over the next 2 s, consumers long-polling; lateness is
    //    delivery time minus due time, and any negative value is an early delivery.
    let q = QueueName::new("bench", "timer");
    // Leave time to publish them all first (16 publishers), so every job is stored well
    // before it is due and lateness measures the timer, not the publishing.
    let base = wall_ms() + 1000 + timer_jobs as u64 / 4;
    let mut publishers = Vec::new();
    for p in 0..16 {
        let (node, q, params, body) = (node.clone(), q.clone(), params.clone(), body.clone());
        publishers.push(tokio::spawn(async move {
            for i in (p..timer_jobs).step_by(16) {
                let at = base + (i as u64 * 2000) / timer_jobs.max(1) as u64;
                let p = PublishParams { due: Due::At(at), ..params.clone() };
                node.service().publish(&Principal::Dev, q.clone(), &p, body.clone()).await?;
            }
            Ok::<_, delayd_server::ServiceError>(())
        }));
    }
    for p in publishers {
        p.await??;
    }
    if wall_ms() >= base {
        return Err("publishing the timer jobs took longer than planned".into());
    }
    let mut consumers = Vec::new();
    for _ in 0..8 {
        let (node, q) = (node.clone(), q.clone());
        consumers.push(tokio::spawn(async move {
            let mut lateness = MillisRecorder::new();
            loop {
                let request = ReserveRequest {
                    queues: vec![q.clone()],
                    count: 10,
                    ttr_ms: Some(60_000),
                    wait: Duration::from_secs(5),
                    acks: Vec::new(),
                    order: ReserveOrder::QueueOrder,
                };
                let got = node.service().reserve(&Principal::Dev, request).await?.deliveries;
                if got.is_empty() {
                    return Ok::<_, delayd_server::ServiceError>(lateness);
                }
                let now = wall_ms();
                for d in got {
                    lateness.record(now as f64 - d.job.due_ms as f64);
                    node.service().ack(&Principal::Dev, q.clone(), d.job.id, Some(d.lease)).await?;
                }
            }
        }));
    }
    let mut lateness = MillisRecorder::new();
    for c in consumers {
        lateness.merge(&c.await??);
    }
    // An early delivery is a negative lateness: counted apart (and as 0 in the percentiles).
    let early = lateness.below_zero();
    summary("timer lateness (delivery - due)", &lateness, "ms");
    println!("delivered {} of {timer_jobs} timer jobs, early deliveries: {early}", lateness.len());
    node.shutdown().await;
    if early > 0 || lateness.len() != timer_jobs as u64 {
        return Err(format!("{early} early deliveries, {} delivered", lateness.len()).into());
    }
    Ok(())
}
