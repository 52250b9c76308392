//! Where the three nodes run and how faults are done to them. Every method is blocking (it
//! runs `docker`, `ip`, `iptables` or signals processes) and is called from
//! `tokio::task::spawn_blocking` by the nemesis.

use std::path::Path;

pub mod docker;
pub mod local;

/// One node as the harness sees it.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    /// Raft node id (1-based).
    pub id: u64,
    /// Base URL of its HTTP API, reachable from the harness, e.g. `http://127.0.0.1:7771`.
    pub http: String,
    /// Its Raft/gRPC address as the peers know it (`host:port`), used to re-add it to the
    /// membership after a removal.
    pub grpc: String,
}

/// A three-node delayd cluster the nemesis can hurt.
pub trait Backend: Send + Sync {
    /// `docker` or `local`.
    fn name(&self) -> &'static str;
    /// The nodes, by id order.
    fn nodes(&self) -> &[NodeInfo];
    /// Starts every node from empty data directories, with the test-only clock hook enabled
    /// (`--debug-clock`). Returns once the processes/containers are started; the harness then
    /// waits for a leader over HTTP.
    fn start(&mut self) -> anyhow::Result<()>;
    /// `kill -9` a node. Idempotent.
    fn kill(&self, node: u64) -> anyhow::Result<()>;
    /// Starts a killed or stopped node again with its data. Idempotent.
    fn restart(&self, node: u64) -> anyhow::Result<()>;
    /// SIGTERM a node and waits (bounded) for it to exit.
    fn stop(&self, node: u64) -> anyhow::Result<()>;
    /// SIGSTOP a node.
    fn pause(&self, node: u64) -> anyhow::Result<()>;
    /// SIGCONT a node. Idempotent.
    fn resume(&self, node: u64) -> anyhow::Result<()>;
    /// Whether [`Backend::cut`] works here (it needs root for network namespaces locally).
    fn can_partition(&self) -> bool;
    /// Drops all traffic, both ways, between each pair of nodes; clients still reach every
    /// node.
    fn cut(&self, pairs: &[(u64, u64)]) -> anyhow::Result<()>;
    /// Whether [`Backend::disconnect`] works here.
    fn can_disconnect(&self) -> bool;
    /// Takes a node off the network completely: neither peers nor clients reach it.
    fn disconnect(&self, node: u64) -> anyhow::Result<()>;
    /// Undoes every [`Backend::cut`] and [`Backend::disconnect`].
    fn heal(&self) -> anyhow::Result<()>;
    /// Copies each node's log to `dir/node-<id>.log`.
    fn collect_logs(&self, dir: &Path) -> anyhow::Result<()>;
    /// Stops everything and removes containers, networks, namespaces and data. Idempotent;
    /// must be safe to call after a partial start.
    fn teardown(&mut self) -> anyhow::Result<()>;
}
