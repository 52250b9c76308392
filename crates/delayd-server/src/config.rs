//! Node configuration.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use delayd_raft::faults::FaultFilter;
use delayd_raft::tls::Tls;

/// Everything a node needs to start. Defaults are the embedded single-node setup.
#[derive(Clone, Debug)]
pub struct Config {
    /// This node's Raft id.
    pub node_id: u64,
    /// Where RocksDB and snapshots live.
    pub data_dir: PathBuf,
    /// The HTTP API's listen address.
    pub http_addr: SocketAddr,
    /// Bounds on the HTTP API's connections (timeouts, how many at once).
    pub http: HttpLimits,
    /// The internal gRPC listen address (Raft replication and forwarding).
    pub grpc_addr: SocketAddr,
    /// The gRPC address other nodes use to reach this one (`host:port`); defaults to
    /// `grpc_addr`, with `127.0.0.1` for an unspecified host.
    pub advertise_addr: Option<String>,
    /// The initial members, `id → gRPC address`, identical on every founding node. Empty: a
    /// single-node cluster of this node. Ignored once the node has joined a cluster.
    pub initial_members: BTreeMap<u64, String>,
    /// Start without forming a cluster and wait to be added through the admin API.
    pub join: bool,
    /// Largest job body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Largest log entry the node proposes, in bytes: the proposer never packs more into
    /// one, and a request whose commands cannot fit in one (a bulk publish) is refused with
    /// 413. Well inside the transport's message limit, so no legal request can break
    /// replication.
    pub max_entry_bytes: usize,
    /// How far into the future a client may set a due time, a ttl or a ttr.
    pub max_horizon: Duration,
    /// How long a write may wait for the cluster before answering 503.
    pub request_timeout: Duration,
    /// Most commands packed into one log entry.
    pub max_batch: usize,
    /// Most log entries the proposer keeps in flight at once (pipelining; 1 = one round
    /// trip to the quorum per entry).
    pub max_in_flight: usize,
    /// Longest the proposer waits, under load, for an entry's batch to fill (0: never).
    pub batch_linger: Duration,
    /// Most deadlines one tick fires.
    pub tick_limit: u32,
    /// How long a reserve that waits may hold the `ack=` it carries, so that the ack rides
    /// in the log entry of the reserve that takes a job instead of one of its own (0: never
    /// held; at most [`MAX_ACK_HOLD`]). See `service/reserve.rs`.
    pub ack_hold: Duration,
    /// Build a snapshot after this many log entries.
    pub snapshot_logs: u64,
    /// Log entries kept behind a snapshot, for followers that are only a little behind.
    pub keep_logs: u64,
    /// Most bytes the log's files may hold before the node builds a snapshot and purges up
    /// to it (see `delayd_raft::ClusterConfig::snapshot_log_bytes`).
    pub snapshot_log_bytes: u64,
    /// Raft heartbeat interval in ms; also every replication RPC's timeout.
    pub heartbeat_ms: u64,
    /// Raft election timeout range in ms (min, max); a follower that hears no leader for a
    /// random time in it starts an election (after a Pre-Vote round).
    pub election_timeout_ms: (u64, u64),
    /// How long a leader that is stopped waits for a voter to take over, in ms.
    pub transfer_timeout_ms: u64,
    /// Serve linearizable reads on the leader's lease instead of a quorum round trip each.
    pub lease_reads: bool,
    /// Who may call what (see `service/auth.rs`).
    pub auth: AuthConfig,
    /// Where to serve the Disque protocol (RESP2); `None`: not served.
    pub disque_addr: Option<SocketAddr>,
    /// The namespace Disque clients' queues live in.
    pub disque_namespace: String,
    /// How long a Disque or beanstalkd connection may stay idle between commands before it is
    /// closed; `None`: never, as beanstalkd and Redis do (their clients keep connections).
    pub protocol_idle_timeout: Option<Duration>,
    /// Where to serve the beanstalkd protocol; `None`: not served. The protocol has no
    /// authentication: whoever reaches this address uses `beanstalk_namespace`.
    pub beanstalk_addr: Option<SocketAddr>,
    /// The namespace beanstalkd clients' tubes live in.
    pub beanstalk_namespace: String,
    /// Most log entries a node's applied state may trail what the cluster has committed
    /// while `/ready` still answers 200.
    pub ready_max_lag: u64,
    /// Test-only: serve `/debug/clock`, which shifts this node's wall clock. Chaos tests use
    /// it to inject clock skew; never enable it in production.
    pub debug_clock: bool,
    /// TLS for the HTTP and gRPC listeners and mutual TLS between peers, loaded; `None`:
    /// plain text. See `delayd_raft::tls`.
    pub tls: Option<Arc<Tls>>,
    /// Which build this node runs, exported as `delayd_build_info`.
    pub build: BuildInfo,
    /// Tests only: the filter every outgoing node-to-node call passes through
    /// (`delayd_raft::faults`). Production nodes have none.
    pub faults: Option<Arc<dyn FaultFilter>>,
}

/// Which build a node runs: shown by `delayd --version` and exported as the labels of the
/// `delayd_build_info` gauge, so a dashboard can tell which nodes an upgrade has reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildInfo {
    /// The release, e.g. `0.1.0`.
    pub version: String,
    /// The git revision it was built from (12 hex digits), or `unknown` when it was built
    /// outside a git checkout.
    pub git_sha: String,
}

impl Default for BuildInfo {
    /// This library's version and an unknown revision: what an embedding program that says
    /// nothing else gets. The `delayd` binary fills in its own.
    fn default() -> Self {
        BuildInfo { version: env!("CARGO_PKG_VERSION").into(), git_sha: "unknown".into() }
    }
}

impl Default for Config {
    /// The cluster's defaults ([`delayd_raft::ClusterConfig::default`]) for the cluster's
    /// settings, and the service's own for the rest.
    fn default() -> Self {
        let c = delayd_raft::ClusterConfig::default();
        Config {
            node_id: c.node_id,
            data_dir: c.data_dir,
            http_addr: SocketAddr::from(([0, 0, 0, 0], 7777)),
            http: HttpLimits::default(),
            grpc_addr: c.grpc_addr,
            advertise_addr: c.advertise_addr,
            initial_members: c.initial_members,
            join: c.join,
            max_body_bytes: 1024 * 1024,
            max_entry_bytes: c.proposer.max_entry_bytes,
            max_horizon: Duration::from_secs(10 * 365 * 86_400),
            request_timeout: c.request_timeout,
            max_batch: c.proposer.max_batch,
            max_in_flight: c.proposer.max_in_flight,
            batch_linger: c.proposer.linger,
            tick_limit: c.tick_limit,
            ack_hold: Duration::from_millis(250),
            snapshot_logs: c.snapshot_logs,
            keep_logs: c.keep_logs,
            snapshot_log_bytes: c.snapshot_log_bytes,
            heartbeat_ms: c.timing.heartbeat_ms,
            election_timeout_ms: c.timing.election_timeout_ms,
            transfer_timeout_ms: c.timing.transfer_timeout_ms,
            lease_reads: c.lease_reads,
            auth: AuthConfig::default(),
            disque_addr: None,
            disque_namespace: "disque".into(),
            protocol_idle_timeout: None,
            beanstalk_addr: None,
            beanstalk_namespace: "beanstalk".into(),
            ready_max_lag: 1000,
            debug_clock: false,
            tls: None,
            build: BuildInfo::default(),
            faults: None,
        }
    }
}

impl Config {
    /// The largest request a client may send: a log entry's worth of bodies (a bulk publish
    /// fills at most one entry) and room for the request's own framing beside them. Bounds
    /// HTTP bulk bodies and gRPC messages alike.
    pub fn max_request_bytes(&self) -> usize {
        self.max_entry_bytes.saturating_add(MESSAGE_FRAMING_BYTES)
    }

    /// The gRPC address this node advertises to its peers.
    pub fn advertised(&self) -> String {
        delayd_raft::config::advertised(self.grpc_addr, self.advertise_addr.as_deref())
    }

    /// Checks the configuration, naming the first problem found.
    pub fn validate(&self) -> Result<(), String> {
        // Node id, members, timeouts and batching: the cluster's rules.
        self.cluster().validate()?;
        self.auth.validate()?;
        if self.max_entry_bytes < MIN_ENTRY_BYTES || self.max_entry_bytes > MAX_ENTRY_BYTES {
            return Err(format!(
                "max_entry_bytes ({}) must be {MIN_ENTRY_BYTES} to {MAX_ENTRY_BYTES} (a quarter \
                 of the transport's message limit)",
                self.max_entry_bytes
            ));
        }
        if self.max_body_bytes.saturating_add(JOB_OVERHEAD_BYTES) > self.max_entry_bytes {
            return Err(format!(
                "max_body_bytes ({}) must leave {JOB_OVERHEAD_BYTES} bytes for a job's \
                 attributes and key inside max_entry_bytes ({}): every legal publish must fit \
                 one log entry",
                self.max_body_bytes, self.max_entry_bytes
            ));
        }
        if self.max_horizon.is_zero() || self.max_horizon > MAX_HORIZON_LIMIT {
            return Err(format!(
                "max_horizon_s ({}) must be 1 to {} (lmstfy's 32-bit seconds)",
                self.max_horizon.as_secs(),
                MAX_HORIZON_LIMIT.as_secs()
            ));
        }
        if self.ack_hold > MAX_ACK_HOLD {
            return Err(format!(
                "ack_hold_ms ({}) must be at most {}",
                self.ack_hold.as_millis(),
                MAX_ACK_HOLD.as_millis()
            ));
        }
        crate::service::validate::check_name("namespace", &self.disque_namespace)
            .map_err(|e| format!("disque_namespace: {e}"))?;
        crate::service::validate::check_name("namespace", &self.beanstalk_namespace)
            .map_err(|e| format!("beanstalk_namespace: {e}"))?;
        let cluster = self.initial_members.len() > 1 || self.join;
        if cluster && self.tls.as_ref().is_some_and(|t| !t.peer_certs_required()) {
            // Peers are reached over TLS too, and there is nothing to verify them with.
            return Err("a cluster with tls_cert_file needs peer_ca_file, the CA that signs the \
                        nodes' certificates"
                .into());
        }
        self.http.validate()
    }

    /// Where this node serves each client protocol, as clients elsewhere reach it: a
    /// listener on an unspecified address (`0.0.0.0`) is shown with the host the node
    /// advertises to its peers.
    pub fn services(&self) -> BTreeMap<String, String> {
        let advertised =
            delayd_raft::config::advertised(self.grpc_addr, self.advertise_addr.as_deref());
        let host = advertised.rsplit_once(':').map_or(advertised.as_str(), |(h, _)| h).to_string();
        let shown = |addr: SocketAddr| match addr.ip().is_unspecified() {
            true => format!("{host}:{}", addr.port()),
            false => addr.to_string(),
        };
        let mut services = BTreeMap::from([("http".to_string(), shown(self.http_addr))]);
        if let Some(addr) = self.disque_addr {
            services.insert("disque".into(), shown(addr));
        }
        if let Some(addr) = self.beanstalk_addr {
            services.insert("beanstalk".into(), shown(addr));
        }
        services
    }

    /// The cluster node's part of the configuration.
    pub fn cluster(&self) -> delayd_raft::ClusterConfig {
        delayd_raft::ClusterConfig {
            node_id: self.node_id,
            data_dir: self.data_dir.clone(),
            grpc_addr: self.grpc_addr,
            advertise_addr: self.advertise_addr.clone(),
            services: self.services(),
            initial_members: self.initial_members.clone(),
            join: self.join,
            cluster_secret: self.auth.effective_cluster_secret().map(str::to_string),
            previous_cluster_secrets: self.auth.previous_cluster_secrets.clone(),
            timing: delayd_raft::Timing {
                heartbeat_ms: self.heartbeat_ms,
                election_timeout_ms: self.election_timeout_ms,
                transfer_timeout_ms: self.transfer_timeout_ms,
            },
            proposer: delayd_raft::ProposerConfig {
                max_batch: self.max_batch,
                max_entry_bytes: self.max_entry_bytes,
                max_in_flight: self.max_in_flight,
                linger: self.batch_linger,
                timeout: self.request_timeout,
            },
            request_timeout: self.request_timeout,
            tick_limit: self.tick_limit,
            snapshot_logs: self.snapshot_logs,
            keep_logs: self.keep_logs,
            snapshot_log_bytes: self.snapshot_log_bytes,
            lease_reads: self.lease_reads,
            faults: self.faults.clone(),
            tls: self.tls.clone(),
        }
    }
}

/// The outer bound of the `max_horizon` setting: lmstfy's parameters are 32-bit seconds.
pub const MAX_HORIZON_LIMIT: Duration = Duration::from_secs(u32::MAX as u64);
/// Largest `ack_hold`: a held ack leaves a finished job counted as reserved, which an
/// operator reading the queue's counts should not be misled by for long.
pub const MAX_ACK_HOLD: Duration = Duration::from_secs(10);
/// Smallest `max_entry_bytes`.
pub const MIN_ENTRY_BYTES: usize = 64 * 1024;
/// Largest `max_entry_bytes`: a quarter of the transport's message limit, so a replication
/// message always has room for an entry and openraft's batching of several.
pub const MAX_ENTRY_BYTES: usize = delayd_raft::network::MAX_MESSAGE_BYTES / 4;
/// Room a request needs beyond the log entry it becomes: field tags and lengths, options,
/// queue names, a bulk's JSON punctuation.
pub const MESSAGE_FRAMING_BYTES: usize = 64 << 10;
/// Room a job needs in an entry beside its body: the largest attributes and key allowed, and
/// the command's own fields.
pub const JOB_OVERHEAD_BYTES: usize = 32 * 1024;
/// Bounds on the HTTP API's connections, enforced by `http/serve.rs`: a client
/// can hold a connection only while it is sending a request promptly, has one in flight, or
/// has been idle for less than `idle_timeout`; and only `max_connections` at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Longest a client may take to send a request's header, counted from the connection's
    /// accept (first request) or from the first byte of the next request (keep-alive).
    pub header_timeout: Duration,
    /// A connection with no request in flight for this long is closed. A long-poll reserve
    /// has its request in flight however long it waits, so it is never cut by this.
    pub idle_timeout: Duration,
    /// Most connections served at once; further ones wait in the kernel's accept backlog
    /// until one closes (see `http/serve.rs`).
    pub max_connections: usize,
    /// How long a stopping server lets requests in flight finish (long-polls are answered at
    /// once when the node drains) before it cuts their connections.
    pub drain_timeout: Duration,
}

/// The most `http_max_connections` accepted: far beyond any file-descriptor limit, and small
/// enough to count in the `u32` a semaphore acquires at once.
pub const MAX_HTTP_CONNECTIONS: usize = 1 << 20;

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 4096,
            drain_timeout: Duration::from_secs(5),
        }
    }
}

impl HttpLimits {
    /// Checks the limits, naming the setting at fault.
    pub fn validate(&self) -> Result<(), String> {
        if self.header_timeout.is_zero() {
            return Err("http_header_timeout_ms must be positive".into());
        }
        if self.idle_timeout.is_zero() {
            return Err("http_idle_timeout_ms must be positive".into());
        }
        if self.drain_timeout.is_zero() {
            return Err("drain_timeout_ms must be positive".into());
        }
        if self.max_connections == 0 || self.max_connections > MAX_HTTP_CONNECTIONS {
            return Err(format!("http_max_connections must be 1 to {MAX_HTTP_CONNECTIONS}"));
        }
        Ok(())
    }
}

/// Shortest admin token accepted: guessing 16 random characters is out of reach, a short
/// password is not.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;

/// Authentication settings (what they decide is in `service/auth.rs`). The default is secure:
/// every API but `/health` and `/ready` needs a token, and without an admin token nothing can
/// create one.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AuthConfig {
    /// Turn authentication off entirely (the `--dev` flag): for a laptop, never a server.
    pub dev: bool,
    /// The admin credential; `None` leaves the admin and token APIs closed.
    pub admin_token: Option<String>,
    /// Further admin credentials accepted beside `admin_token`: while the admin token is
    /// rotated, clients holding the old one keep working until the rotation ends.
    pub previous_admin_tokens: Vec<String>,
    /// The credential nodes show each other on the internal services. `None`: the admin
    /// token, as before this setting existed, so that a cluster upgraded in place keeps
    /// forming; but then rotating the admin token would split the cluster.
    pub cluster_secret: Option<String>,
    /// Further cluster credentials accepted from peers beside the node's own, during a
    /// rotation of the cluster secret.
    pub previous_cluster_secrets: Vec<String>,
    /// Serve `/metrics` without a credential (for scrapers on a trusted network).
    pub public_metrics: bool,
}

impl std::fmt::Debug for AuthConfig {
    /// Credentials only as how many there are: a configuration may end up in a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("dev", &self.dev)
            .field("admin_token", &self.admin_token.as_ref().map(|_| "<redacted>"))
            .field("previous_admin_tokens", &self.previous_admin_tokens.len())
            .field("cluster_secret", &self.cluster_secret.as_ref().map(|_| "<redacted>"))
            .field("previous_cluster_secrets", &self.previous_cluster_secrets.len())
            .field("public_metrics", &self.public_metrics)
            .finish()
    }
}

impl AuthConfig {
    /// No authentication at all (`--dev`); what tests and benchmarks use.
    pub fn dev() -> AuthConfig {
        AuthConfig { dev: true, ..AuthConfig::default() }
    }

    /// Checks every credential's shape, naming the setting at fault.
    fn validate(&self) -> Result<(), String> {
        let one = |name: &str, t: &str| {
            if t.len() < MIN_ADMIN_TOKEN_LEN || t.chars().any(|c| !c.is_ascii_graphic()) {
                Err(format!(
                    "{name} must be at least {MIN_ADMIN_TOKEN_LEN} visible ASCII characters \
                     without spaces"
                ))
            } else {
                Ok(())
            }
        };
        if let Some(t) = &self.admin_token {
            one("the admin token", t)?;
        }
        for t in &self.previous_admin_tokens {
            one("each of previous_admin_tokens", t)?;
        }
        if let Some(t) = &self.cluster_secret {
            one("cluster_secret", t)?;
        }
        for t in &self.previous_cluster_secrets {
            one("each of previous_cluster_secrets", t)?;
        }
        if self.cluster_secret.is_none() && !self.previous_cluster_secrets.is_empty() {
            return Err("previous_cluster_secrets needs a cluster_secret beside it".into());
        }
        Ok(())
    }
}

/// Parses `1=host:port,2=host:port` into a member map.
pub fn parse_members(s: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut members = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) =
            part.split_once('=').ok_or_else(|| format!("peer {part:?} is not id=host:port"))?;
        let id: u64 = id.trim().parse().map_err(|_| format!("peer id {id:?} is not a number"))?;
        if id == 0 {
            return Err("peer ids start at 1".into());
        }
        if !addr.contains(':') {
            return Err(format!("peer address {addr:?} has no port"));
        }
        if members.insert(id, addr.trim().to_string()).is_some() {
            return Err(format!("peer id {id} is given twice"));
        }
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_parse_and_validate() {
        let m = parse_members("1=a:1, 2=b:2").expect("parse");
        assert_eq!(m.len(), 2);
        assert!(parse_members("1=a").is_err());
        assert!(parse_members("x=a:1").is_err());
        assert!(parse_members("1=a:1,1=b:2").is_err());
        let c = Config { node_id: 3, initial_members: m, ..Config::default() };
        assert!(c.validate().expect_err("not a member").contains("do not include"));
    }

    #[test]
    fn entry_body_and_horizon_limits_are_checked_together() {
        let err = |c: Config| c.validate().expect_err("invalid");
        assert!(err(Config { max_entry_bytes: 1024, ..Config::default() })
            .contains("max_entry_bytes (1024) must be"));
        assert!(err(Config { max_entry_bytes: 64 << 20, ..Config::default() })
            .contains("max_entry_bytes"));
        let body_too_big = Config { max_body_bytes: 4 << 20, ..Config::default() };
        assert!(err(body_too_big).contains("every legal publish must fit one log entry"));
        assert!(err(Config { max_horizon: Duration::ZERO, ..Config::default() })
            .contains("max_horizon_s (0)"));
        let beyond = Duration::from_secs(u64::from(u32::MAX) + 1);
        assert!(err(Config { max_horizon: beyond, ..Config::default() }).contains("32-bit"));
        assert_eq!(Config::default().validate(), Ok(()));
    }

    #[test]
    fn the_log_bound_holds_a_few_of_the_largest_entries() {
        let bound = |bytes: u64, entry: usize| Config {
            snapshot_log_bytes: bytes,
            max_entry_bytes: entry,
            max_body_bytes: 256 << 10,
            ..Config::default()
        };
        let e = bound(16 << 20, 8 << 20).validate().expect_err("two entries");
        assert!(e.contains("snapshot_log_bytes (16777216)") && e.contains("33554432"), "{e}");
        assert_eq!(bound(32 << 20, 8 << 20).validate(), Ok(()));
        assert_eq!(bound(2 << 20, 512 << 10).validate(), Ok(()));
    }
}
