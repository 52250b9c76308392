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
