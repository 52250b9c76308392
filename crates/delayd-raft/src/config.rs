//! What a cluster node needs to start.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::faults::FaultFilter;
use crate::propose::ProposerConfig;
use crate::tls::Tls;

/// A node's cluster settings. [`ClusterConfig::default`] is a single-node cluster on the
/// default ports with the timeouts documented in `docs/failover.md`.
#[derive(Clone)]
pub struct ClusterConfig {
    /// This node's Raft id (at least 1).
    pub node_id: u64,
    /// Where RocksDB and snapshots live.
    pub data_dir: PathBuf,
    /// The internal gRPC listen address (Raft, forwarding and whatever the owner adds).
    pub grpc_addr: SocketAddr,
    /// The gRPC address other nodes use to reach this one (`host:port`); defaults to
    /// `grpc_addr`, with `127.0.0.1` for an unspecified host.
    pub advertise_addr: Option<String>,
    /// Where this node serves its owner's protocols, by name (`http`, `disque`, ...) as
    /// `host:port`: reported in the node's status ([`crate::NodeStatus::services`]), so a
    /// client of any of them can learn every node's address from one node.
    pub services: BTreeMap<String, String>,
    /// The initial members, `id → gRPC address`, identical on every founding node. Empty: a
    /// single-node cluster of this node. Ignored once the node has joined a cluster.
    pub initial_members: BTreeMap<u64, String>,
    /// Start without forming a cluster and wait to be added by the leader.
    pub join: bool,
    /// The credential this node shows its peers on the internal services; `None` leaves them
    /// open (development only).
    pub cluster_secret: Option<String>,
    /// Other credentials peers may show, beside `cluster_secret`: while the secret is rotated
    /// node by node, the old and the new one are both accepted (see `docs/operations.md`).
    pub previous_cluster_secrets: Vec<String>,
    /// Raft's timing.
    pub timing: Timing,
    /// How the proposer packs and times entries.
    pub proposer: ProposerConfig,
    /// How long a routed request (a forwarded write, a read barrier) may take in all.
    pub request_timeout: Duration,
    /// Most deadlines one tick fires.
    pub tick_limit: u32,
    /// Build a snapshot after this many log entries.
    pub snapshot_logs: u64,
    /// Log entries kept behind a snapshot, for followers that are only a little behind.
    pub keep_logs: u64,
    /// Most bytes the log's files may hold: beyond them the node builds a snapshot and
    /// purges its log up to it, `keep_logs` notwithstanding (see `docs/operations.md`).
    /// At least [`MIN_LOG_BYTES_IN_ENTRIES`] of the largest entries.
    pub snapshot_log_bytes: u64,
    /// Serve linearizable reads on the leader's lease (no round trip to a quorum) instead of
    /// confirming leadership with a quorum for each read. Safe while clocks advance at nearly
    /// the same rate on every node; see `docs/failover.md`.
    pub lease_reads: bool,
    /// Tests only: every outgoing node-to-node call passes through this filter first.
    pub faults: Option<Arc<dyn FaultFilter>>,
    /// TLS for the gRPC listener and for connections to peers (mutual, with a peer CA);
    /// `None`: plain text. See [`crate::tls`].
    pub tls: Option<Arc<Tls>>,
}

/// `snapshot_log_bytes` must hold this many of the largest entries: a bound any lower would
/// have the node build a snapshot (a copy of its whole state) every entry or two.
pub const MIN_LOG_BYTES_IN_ENTRIES: u64 = 4;

/// Raft's timeouts, in milliseconds; `docs/failover.md` explains how each bounds failover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How often the leader sends heartbeats; also the time limit of each replication call.
    pub heartbeat_ms: u64,
    /// A follower that hears no leader for a random time in `[min, max)` starts an election
    /// (after a Pre-Vote round). `max` is also the leader's lease.
    pub election_timeout_ms: (u64, u64),
    /// How long a leader that stops waits for a voter to take over before it stops anyway.
    pub transfer_timeout_ms: u64,
}

impl Default for Timing {
    fn default() -> Self {
        // Chosen by measurement (docs/failover.md): a follower campaigns once the leader's
        // lease (the election maximum) has run out *and* then its own election timeout, so a
        // crash costs max + [min, max) ≈ 0.7–0.8 s; the heartbeat leaves four per minimum.
        Timing { heartbeat_ms: 75, election_timeout_ms: (300, 400), transfer_timeout_ms: 2000 }
    }
}

impl Timing {
    /// Checks the timeouts against each other, naming the first problem.
    pub fn validate(&self) -> Result<(), String> {
        let (min, max) = self.election_timeout_ms;
        if self.heartbeat_ms == 0 || self.heartbeat_ms >= min || min >= max {
            return Err(format!(
                "need 0 < heartbeat ({}) < election timeout min ({min}) < max ({max})",
                self.heartbeat_ms
            ));
        }
        if self.transfer_timeout_ms == 0 {
            return Err("the leadership transfer timeout must be positive".into());
        }
        Ok(())
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            node_id: 1,
            data_dir: PathBuf::from("data"),
            grpc_addr: SocketAddr::from(([0, 0, 0, 0], 7778)),
            advertise_addr: None,
            services: BTreeMap::new(),
            initial_members: BTreeMap::new(),
            join: false,
            cluster_secret: None,
            previous_cluster_secrets: Vec::new(),
            timing: Timing::default(),
            proposer: ProposerConfig {
                max_batch: 512,
                // openraft gives each AppendEntries one heartbeat to be sent, decoded and
                // fsynced on the follower; 4 MiB leaves room for that on a busy 2-core machine.
                max_entry_bytes: 4 * 1024 * 1024,
                max_in_flight: 1,
                linger: Duration::from_millis(1),
                timeout: Duration::from_secs(5),
            },
            request_timeout: Duration::from_secs(5),
            tick_limit: 1024,
            snapshot_logs: 50_000,
            keep_logs: 10_000,
            snapshot_log_bytes: 1 << 30,
            lease_reads: true,
            faults: None,
            tls: None,
        }
    }
}

impl std::fmt::Debug for ClusterConfig {
    /// Everything but the secret and the filter.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("node_id", &self.node_id)
            .field("data_dir", &self.data_dir)
            .field("grpc_addr", &self.grpc_addr)
            .field("advertise_addr", &self.advertise_addr)
            .field("services", &self.services)
            .field("initial_members", &self.initial_members)
            .field("join", &self.join)
            .field("timing", &self.timing)
            .field("proposer", &self.proposer)
            .field("request_timeout", &self.request_timeout)
            .field("tick_limit", &self.tick_limit)
            .field("snapshot_logs", &self.snapshot_logs)
            .field("keep_logs", &self.keep_logs)
            .field("snapshot_log_bytes", &self.snapshot_log_bytes)
            .field("lease_reads", &self.lease_reads)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// The gRPC address a node listening on `grpc_addr` advertises to its peers: `advertise_addr`
/// when set, else `grpc_addr` with `127.0.0.1` for an unspecified host.
pub fn advertised(grpc_addr: SocketAddr, advertise_addr: Option<&str>) -> String {
    if let Some(a) = advertise_addr {
        return a.to_owned();
    }
    let mut addr = grpc_addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    addr.to_string()
}

impl ClusterConfig {
    /// The gRPC address this node advertises to its peers.
    pub fn advertised(&self) -> String {
        advertised(self.grpc_addr, self.advertise_addr.as_deref())
    }

    /// Checks the configuration, naming the first problem found.
    pub fn validate(&self) -> Result<(), String> {
        if self.node_id == 0 {
            return Err("node id must be at least 1".into());
        }
        if !self.initial_members.is_empty() && !self.initial_members.contains_key(&self.node_id) {
            return Err(format!(
                "the initial members {:?} do not include this node ({})",
                self.initial_members.keys().collect::<Vec<_>>(),
                self.node_id
            ));
        }
        if self.join && !self.initial_members.is_empty() {
            return Err("--join and --peers exclude each other".into());
        }
        self.timing.validate()?;
        let p = &self.proposer;
        if p.max_batch == 0 || p.max_in_flight == 0 || self.tick_limit == 0 {
            return Err("max batch, max in flight and tick limit must be positive".into());
        }
        let entry = u64::try_from(p.max_entry_bytes).unwrap_or(u64::MAX);
        let least = MIN_LOG_BYTES_IN_ENTRIES.saturating_mul(entry);
        if self.snapshot_log_bytes < least {
            return Err(format!(
                "snapshot_log_bytes ({}) must hold at least {MIN_LOG_BYTES_IN_ENTRIES} entries of \
                 max_entry_bytes ({}): {least} or more",
                self.snapshot_log_bytes, p.max_entry_bytes
            ));
        }
        Ok(())
    }
}
