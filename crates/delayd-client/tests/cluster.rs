//! The client against a real three-node cluster on loopback: leader following, retries of
//! keyed publishes, and `Ambiguous` for unkeyed ones.
//!
//! Each node is started in-process with `Node::start` and serves the client API on its own
//! gRPC port, the address it advertises.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use delayd_client::{job_ref, Client, Error, JobOptions, Options};
use delayd_server::{Config, Node};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const NS: &str = "ns";

struct Cluster {
    nodes: Vec<Node>,
    /// Client API address per node id.
    addrs: BTreeMap<u64, String>,
    _dirs: Vec<tempfile::TempDir>,
}

async fn free_port() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

impl Cluster {
    async fn start() -> Cluster {
        let mut addrs = BTreeMap::new();
        for id in 1..=3u64 {
            addrs.insert(id, free_port().await);
        }
        let mut starts = Vec::new();
        let mut dirs = Vec::new();
        for (&id, &addr) in &addrs {
            let dir = tempfile::tempdir().unwrap();
            let config = Config {
                node_id: id,
                data_dir: dir.path().to_path_buf(),
                grpc_addr: addr,
                initial_members: addrs.iter().map(|(id, a)| (*id, a.to_string())).collect(),
                auth: delayd_server::config::AuthConfig::dev(),
                ..Config::default()
            };
            dirs.push(dir);
            starts.push(async move { Node::start(config).await.unwrap() });
        }
        let addrs = addrs.into_iter().map(|(id, a)| (id, a.to_string())).collect();
        let nodes = futures::future::join_all(starts).await;
        let c = Cluster { nodes, addrs, _dirs: dirs };
        c.leader().await;
        c
    }

    /// The leader's id, once every node agrees on one.
    async fn leader(&self) -> u64 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let leaders: Vec<_> =
                self.nodes.iter().map(|n| n.cluster().metrics().current_leader).collect();
            if let Some(l) = leaders[0] {
                if leaders.iter().all(|x| *x == Some(l)) {
                    return l;
                }
            }
            assert!(tokio::time::Instant::now() < deadline, "no leader: {leaders:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn follower(&self) -> u64 {
        let l = self.leader().await;
        *self.addrs.keys().find(|id| **id != l).unwrap()
    }

    async fn ready(&self, queue: &str) -> u64 {
        let queue = delayd_server::service::validate::queue_name(NS, queue).unwrap();
        let dev = delayd_server::Principal::Dev;
        let meta = self.nodes[0].service().queue_meta(&dev, &queue, false).await.unwrap();
        meta.count(delayd_core::JobState::Ready)
    }

    async fn stop(self) {
        for n in &self.nodes {
            n.shutdown().await;
        }
    }
}

/// A TCP relay to `upstream` that, once `blackhole` is set, stops passing the server's
/// bytes back: requests still arrive and run, their answers never do.
async fn relay(upstream: String, blackhole: Arc<AtomicBool>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(&upstream).await else { continue };
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            tokio::spawn(async move { tokio::io::copy(&mut cr, &mut sw).await });
            let blackhole = blackhole.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match sr.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    if !blackhole.load(Ordering::SeqCst) && cw.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn quick() -> Options {
    Options {
        request_timeout: Duration::from_millis(700),
        retry_for: Duration::from_secs(10),
        connect_timeout: Duration::from_millis(500),
        token: None,
        tls: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follows_the_leader_and_skips_dead_nodes() {
    let c = Cluster::start().await;
    let leader = c.leader().await;
    let follower = c.follower().await;
    let dead = free_port().await.to_string();

    // Told only of a dead node and a follower: the first answer names the leader.
    let client = Client::connect(&[dead.clone(), c.addrs[&follower].clone()]).await.unwrap();
    assert_eq!(client.leader(), None);
    let p = client.publish("ns", "follow", b"x".to_vec(), JobOptions::default()).await.unwrap();
    assert_eq!(client.leader().as_deref(), Some(c.addrs[&leader].as_str()));
    let job = client.peek("ns", "follow", Some(&p.job_id)).await.unwrap();
    assert_eq!(job.body, b"x");
    let stats = client.stats("ns", "follow").await.unwrap();
    assert_eq!(stats.ready, 1);

    // Reserve, touch, ack through the client.
    let got = client.reserve("ns", &["follow"], 1, Some(30_000), Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 1);
    client.touch(job_ref(&got[0]), None).await.unwrap();
    assert!(client.ack(job_ref(&got[0])).await.unwrap());
    assert!(matches!(client.peek("ns", "follow", None).await, Err(Error::NotFound(_))));
    let bad = client.publish("ns", "_bad", vec![], JobOptions::default()).await.unwrap_err();
    assert!(bad.is_refused(), "{bad}");

    // A worker stream on the leader, with credits.
    let ids = client
        .publish_bulk(
            "ns",
            "work",
            vec![b"1".to_vec(), b"2".to_vec(), b"3".to_vec()],
            JobOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(ids.len(), 3);
    let mut stream = client.reserve_stream("ns", &["work"], Some(30_000), 2).await.unwrap();
    let a = stream.next_delivery().await.unwrap().unwrap();
    let b = stream.next_delivery().await.unwrap().unwrap();
    stream.ack(&a).await.unwrap();
    stream.ack(&b).await.unwrap();
    for _ in 0..2 {
        let r = stream.next_ack_result().await.unwrap().unwrap();
        assert!(r.removed, "{r:?}");
    }
    stream.credit(1).await.unwrap();
    let last = stream.next_delivery().await.unwrap().unwrap();
    let done = client.ack_batch(vec![job_ref(&last)]).await.unwrap();
    assert!(matches!(done[..], [Ok(true)]), "{done:?}");
    assert!(stream.close().await.unwrap().is_empty());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keyed_publish_is_retried_into_one_job_and_unkeyed_is_ambiguous() {
    let c = Cluster::start().await;
    let leader = c.leader().await;
    let follower = c.follower().await;
    let blackhole = Arc::new(AtomicBool::new(false));
    let lossy = relay(c.addrs[&leader].clone(), blackhole.clone()).await;
    let seeds = [lossy, c.addrs[&follower].clone()];

    // The first attempt reaches the leader and is committed, but its answer is lost; the
    // retry goes elsewhere and finds the job the key already names.
    let client = Client::connect_with(&seeds, quick()).await.unwrap();
    blackhole.store(true, Ordering::SeqCst);
    let p = client
        .publish_keyed(NS, "keyed", "order-42", b"x".to_vec(), JobOptions::default())
        .await
        .unwrap();
    assert!(p.existed, "the lost first attempt created the job");
    assert_eq!(c.ready("keyed").await, 1);

    // Without a key the same loss is reported as such, and the job does exist.
    let client = Client::connect_with(&seeds, quick()).await;
    blackhole.store(false, Ordering::SeqCst);
    let client = match client {
        Ok(c) => c,
        Err(_) => Client::connect_with(&seeds, quick()).await.unwrap(),
    };
    blackhole.store(true, Ordering::SeqCst);
    let e = client.publish(NS, "plain", b"y".to_vec(), JobOptions::default()).await.unwrap_err();
    assert!(matches!(e, Error::Ambiguous(_)), "{e}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while c.ready("plain").await != 1 {
        assert!(tokio::time::Instant::now() < deadline, "the ambiguous publish was not applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // publish_idempotent survives the same loss.
    let client = Client::connect_with(&seeds[1..], quick()).await.unwrap();
    let p =
        client.publish_idempotent(NS, "idem", b"z".to_vec(), JobOptions::default()).await.unwrap();
    assert!(!p.existed);
    assert_eq!(c.ready("idem").await, 1);
    c.stop().await;
}

/// The server answers a publish stream after its 1024th batch and reads no further; the
/// client refuses a longer stream up front, with nothing written, rather than lose its tail.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_publish_stream_longer_than_the_servers_bound_is_refused_whole() {
    let c = Cluster::start().await;
    let client = Client::connect(&[c.addrs[&c.leader().await].clone()]).await.unwrap();
    let batch = delayd_client::PublishBatch {
        namespace: NS.into(),
        queue: "streamed".into(),
        bodies: vec![b"x".to_vec()],
        options: Some(JobOptions::default()),
        keys: Vec::new(),
    };
    let e = client
        .publish_stream(vec![batch.clone(); delayd_client::MAX_STREAM_BATCHES + 1])
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Invalid(ref m) if m.contains("at most 1024")), "{e}");
    assert_eq!(c.ready("streamed").await, 0);
    let results = client.publish_stream(vec![batch; 3]).await.unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(c.ready("streamed").await, 3);
    c.stop().await;
}
