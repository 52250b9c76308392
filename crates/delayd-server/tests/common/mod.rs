//! What every in-process test file starts: one node on RocksDB in a temporary directory.

use delayd_server::config::AuthConfig;
use delayd_server::{Config, Node};

/// Starts a node with its data in a fresh temporary directory (deleted when the returned
/// guard drops) and its gRPC port on loopback: an OS-chosen port unless `config` names one.
/// A test that says nothing about authentication gets none (`dev`); the default
/// authentication could not start a node anyway, it has no admin token.
pub async fn start_node(config: Config) -> (Node, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let defaults = Config::default();
    let grpc_addr = if config.grpc_addr == defaults.grpc_addr {
        "127.0.0.1:0".parse().expect("address")
    } else {
        config.grpc_addr
    };
    let auth = if config.auth == defaults.auth { AuthConfig::dev() } else { config.auth.clone() };
    let node =
        Node::start(Config { data_dir: dir.path().to_path_buf(), grpc_addr, auth, ..config })
            .await
            .expect("node starts");
    (node, dir)
}

/// The configurations of a three-node cluster on loopback, in id order: `base`, with each
/// node's id, an OS-chosen gRPC port and the three members filled in.
#[allow(dead_code)] // not every test file starts a cluster
pub async fn three_nodes(base: Config) -> Vec<Config> {
    let mut addrs = Vec::new();
    for _ in 0..3 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        addrs.push(l.local_addr().expect("address"));
    }
    let members: std::collections::BTreeMap<u64, String> =
        (1u64..).zip(&addrs).map(|(id, a)| (id, a.to_string())).collect();
    (1u64..)
        .zip(addrs)
        .map(|(node_id, grpc_addr)| Config {
            node_id,
            grpc_addr,
            initial_members: members.clone(),
            ..base.clone()
        })
        .collect()
}

/// The leader every one of `nodes` names, once they agree (within 20 s).
#[allow(dead_code)] // not every test file starts a cluster
pub async fn agreed_leader(nodes: &[&Node]) -> u64 {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let known: Vec<_> = nodes.iter().map(|n| n.cluster().metrics().current_leader).collect();
        if let Some(l) = known[0].filter(|l| known.iter().all(|k| *k == Some(*l))) {
            return l;
        }
        assert!(tokio::time::Instant::now() < deadline, "no leader agreed on: {known:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
