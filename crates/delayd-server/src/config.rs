//! Node configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Everything a node needs to start. Defaults are the embedded single-node setup.
#[derive(Clone, Debug)]
pub struct Config {
    /// This node's Raft id.
    pub node_id: u64,
    /// Where RocksDB and snapshots live.
    pub data_dir: PathBuf,
    /// The HTTP API's listen address.
    pub http_addr: SocketAddr,
    /// Largest job body accepted, in bytes.
    pub max_body_bytes: usize,
    /// How long a write may wait for the cluster before answering 503.
    pub request_timeout: Duration,
    /// Most commands packed into one log entry.
    pub max_batch: usize,
    /// Most deadlines one tick fires.
    pub tick_limit: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_id: 1,
            data_dir: PathBuf::from("data"),
            http_addr: SocketAddr::from(([0, 0, 0, 0], 7777)),
            max_body_bytes: 1024 * 1024,
            request_timeout: Duration::from_secs(10),
            max_batch: 512,
            tick_limit: 1024,
        }
    }
}
