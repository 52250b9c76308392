//! delayd's settings: one TOML file, then environment variables, then flags, each layer
//! overriding the one before, and a default for every key.
//!
//! Every key has one name everywhere: the flag `--http-addr`, the file key `http_addr`, the
//! variable `DELAYD_HTTP_ADDR` (the log level alone reads `RUST_LOG`, as every tracing program
//! does). `delayd.example.toml` at the repository root lists every key with its default; a
//! test keeps it in step with [`Settings::defaults`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::builder::BoolishValueParser;
use delayd_server::config::{parse_members, AuthConfig, HttpLimits, MIN_ADMIN_TOKEN_LEN};
use delayd_server::Config;
use serde::{Deserialize, Serialize};

/// The keys whose values are credentials: never shown in a log line or an error.
const SECRET_KEYS: [&str; 4] =
    ["admin_token", "previous_admin_tokens", "cluster_secret", "previous_cluster_secrets"];

/// Every setting, each optional so that layers can be told apart; see the module docs.
#[derive(clap::Args, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// This node's Raft id [default: 1].
    #[arg(long, env = "DELAYD_NODE_ID")]
    pub node_id: Option<u64>,
    /// Directory for RocksDB and snapshots [default: data].
    #[arg(long, env = "DELAYD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// HTTP listen address [default: 0.0.0.0:7777].
    #[arg(long, env = "DELAYD_HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,
    /// Longest a client may take to send an HTTP request's header, in ms [default: 10000].
    #[arg(long, env = "DELAYD_HTTP_HEADER_TIMEOUT_MS")]
    pub http_header_timeout_ms: Option<u64>,
    /// An HTTP connection with no request in flight for this long is closed, in ms (a
    /// long-poll in flight is never cut) [default: 60000].
    #[arg(long, env = "DELAYD_HTTP_IDLE_TIMEOUT_MS")]
    pub http_idle_timeout_ms: Option<u64>,
    /// Most HTTP connections served at once; more wait in the accept backlog [default: 4096].
    #[arg(long, env = "DELAYD_HTTP_MAX_CONNECTIONS")]
    pub http_max_connections: Option<usize>,
    /// gRPC listen address: client API, Raft replication, forwarding [default: 0.0.0.0:7778].
    #[arg(long, env = "DELAYD_GRPC_ADDR")]
    pub grpc_addr: Option<SocketAddr>,
    /// The gRPC address peers use to reach this node [default: grpc_addr, loopback if
    /// unspecified].
    #[arg(long, env = "DELAYD_ADVERTISE_ADDR")]
    pub advertise_addr: Option<String>,
    /// Initial members as `id=host:port,...` (gRPC addresses), the same on every founding
    /// node [default: empty, a single-node cluster].
    #[arg(long, env = "DELAYD_PEERS")]
    pub peers: Option<String>,
    /// Start empty and wait to be added through the admin API of a running cluster
    /// [default: false].
    #[arg(long, env = "DELAYD_JOIN", num_args = 0..=1, default_missing_value = "true",
          value_parser = BoolishValueParser::new())]
    pub join: Option<bool>,
    /// Serve the Disque protocol (RESP2) on this address, e.g. 127.0.0.1:7711 [default: off].
    #[arg(long, env = "DELAYD_DISQUE_ADDR")]
    pub disque_addr: Option<SocketAddr>,
    /// The namespace Disque clients' queues live in [default: disque].
    #[arg(long, env = "DELAYD_DISQUE_NAMESPACE")]
    pub disque_namespace: Option<String>,
    /// A Disque or beanstalkd connection idle this long between commands is closed, in ms;
    /// 0: never, as beanstalkd and Redis do (a blocking reserve is not idle) [default: 0].
    #[arg(long, env = "DELAYD_PROTOCOL_IDLE_TIMEOUT_MS")]
    pub protocol_idle_timeout_ms: Option<u64>,
    /// Serve the beanstalkd protocol on this address, e.g. 127.0.0.1:11300 [default: off].
    /// beanstalkd has no authentication: whoever reaches it uses beanstalk_namespace.
    #[arg(long, env = "DELAYD_BEANSTALK_ADDR")]
    pub beanstalk_addr: Option<SocketAddr>,
    /// The namespace beanstalkd clients' tubes live in [default: beanstalk].
    #[arg(long, env = "DELAYD_BEANSTALK_NAMESPACE")]
    pub beanstalk_namespace: Option<String>,
    /// Largest job body accepted, in bytes [default: 1048576].
    #[arg(long, env = "DELAYD_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Largest Raft log entry, in bytes; a bulk publish must fit one [default: 4194304].
    #[arg(long, env = "DELAYD_MAX_ENTRY_BYTES")]
    pub max_entry_bytes: Option<usize>,
    /// How far ahead a delay, due time, ttl or ttr may reach, in s [default: 315360000, 10
    /// years; at most 4294967295].
    #[arg(long, env = "DELAYD_MAX_HORIZON_S")]
    pub max_horizon_s: Option<u64>,
    /// How long a request waits for the cluster before answering 503, in ms [default: 5000].
    #[arg(long, env = "DELAYD_REQUEST_TIMEOUT_MS")]
    pub request_timeout_ms: Option<u64>,
    /// Most commands packed into one Raft log entry [default: 512].
    #[arg(long, env = "DELAYD_MAX_BATCH")]
    pub max_batch: Option<usize>,
    /// Most log entries in flight at once [default: 1].
    #[arg(long, env = "DELAYD_MAX_IN_FLIGHT")]
    pub max_in_flight: Option<usize>,
    /// Longest the proposer waits under load for a batch to fill, in µs [default: 1000].
    #[arg(long, env = "DELAYD_BATCH_LINGER_US")]
    pub batch_linger_us: Option<u64>,
    /// Most deadlines one timer tick fires [default: 1024].
    #[arg(long, env = "DELAYD_TICK_LIMIT")]
    pub tick_limit: Option<u32>,
    /// How long a waiting reserve may hold its `ack=` for the entry of the reserve that takes
    /// a job, in ms; 0 never [default: 250; at most 10000].
    #[arg(long, env = "DELAYD_ACK_HOLD_MS")]
    pub ack_hold_ms: Option<u64>,
    /// Build a snapshot after this many log entries [default: 50000].
    #[arg(long, env = "DELAYD_SNAPSHOT_LOGS")]
    pub snapshot_logs: Option<u64>,
    /// Log entries kept behind a snapshot [default: 10000].
    #[arg(long, env = "DELAYD_KEEP_LOGS")]
    pub keep_logs: Option<u64>,
    /// Build a snapshot and purge the log up to it once the log's files hold more than this
    /// many bytes, whatever `keep_logs` says [default: 1073741824; at least 4 × max_entry_bytes].
    #[arg(long, env = "DELAYD_SNAPSHOT_LOG_BYTES")]
    pub snapshot_log_bytes: Option<u64>,
    /// Raft heartbeat interval, also each replication RPC's timeout, in ms [default: 75].
    #[arg(long, env = "DELAYD_HEARTBEAT_MS")]
    pub heartbeat_ms: Option<u64>,
    /// Shortest election timeout, in ms [default: 300].
    #[arg(long, env = "DELAYD_ELECTION_TIMEOUT_MIN_MS")]
    pub election_timeout_min_ms: Option<u64>,
    /// Longest election timeout, also the leader's lease, in ms [default: 400].
    #[arg(long, env = "DELAYD_ELECTION_TIMEOUT_MAX_MS")]
    pub election_timeout_max_ms: Option<u64>,
    /// How long a stopping leader waits for a voter to take over, in ms [default: 2000].
    #[arg(long, env = "DELAYD_TRANSFER_TIMEOUT_MS")]
    pub transfer_timeout_ms: Option<u64>,
    /// Serve linearizable reads on the leader's lease rather than a quorum round trip each
    /// [default: true].
    #[arg(long, env = "DELAYD_LEASE_READS", num_args = 0..=1, default_missing_value = "true")]
    pub lease_reads: Option<bool>,
    /// Turn authentication off: every API open to anyone. For a laptop, never a server
    /// [default: false].
    #[arg(long, env = "DELAYD_DEV", num_args = 0..=1, default_missing_value = "true",
          value_parser = BoolishValueParser::new())]
    pub dev: Option<bool>,
    /// The admin credential, at least 16 characters [default: read from admin_token_file].
    #[arg(long, env = "DELAYD_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// File holding the admin credential; created with a random one (mode 0600) when missing
    /// [default: <data_dir>/admin-token].
    #[arg(long, env = "DELAYD_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Further admin tokens still accepted, comma-separated: the old token while the admin
    /// token is rotated [default: none].
    #[arg(long, env = "DELAYD_PREVIOUS_ADMIN_TOKENS", hide_env_values = true)]
    pub previous_admin_tokens: Option<String>,
    /// The credential nodes show each other, the same on every node, at least 16 characters
    /// [default: the admin token].
    #[arg(long, env = "DELAYD_CLUSTER_SECRET", hide_env_values = true)]
    pub cluster_secret: Option<String>,
    /// File holding the cluster secret (instead of cluster_secret) [default: none].
    #[arg(long, env = "DELAYD_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// Further cluster secrets accepted from peers, comma-separated: the old one while the
    /// cluster secret is rotated [default: none].
    #[arg(long, env = "DELAYD_PREVIOUS_CLUSTER_SECRETS", hide_env_values = true)]
    pub previous_cluster_secrets: Option<String>,
    /// Serve /metrics without a credential [default: false].
    #[arg(long, env = "DELAYD_PUBLIC_METRICS", num_args = 0..=1, default_missing_value = "true",
          value_parser = BoolishValueParser::new())]
    pub public_metrics: Option<bool>,
    /// Log filter in tracing's `RUST_LOG` syntax [default: info,openraft=warn].
    #[arg(long, env = "RUST_LOG")]
    pub log_level: Option<String>,
    /// Log as JSON lines instead of text [default: false].
    #[arg(long, env = "DELAYD_LOG_JSON", num_args = 0..=1, default_missing_value = "true",
          value_parser = BoolishValueParser::new())]
    pub log_json: Option<bool>,
    /// How long a stopping node (SIGTERM) waits for requests in flight after answering
    /// long-polls, in ms; what is still running then is cut off [default: 5000].
    #[arg(long, env = "DELAYD_DRAIN_TIMEOUT_MS")]
    pub drain_timeout_ms: Option<u64>,
    /// Most log entries this node may trail the cluster's commit index and still answer
    /// /ready with 200 [default: 1000].
    #[arg(long, env = "DELAYD_READY_MAX_LAG")]
    pub ready_max_lag: Option<u64>,
    /// PEM certificate chain (leaf first) served on the HTTP and gRPC ports; with it both
    /// speak TLS only. Reloaded on SIGHUP and when the file changes [default: none, plain
    /// text].
    #[arg(long, env = "DELAYD_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of tls_cert_file [default: none].
    #[arg(long, env = "DELAYD_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA that signs node certificates: turns on mutual TLS between peers, whose internal
    /// calls must then show a certificate it signed (docs/tls.md) [default: none].
    #[arg(long, env = "DELAYD_PEER_CA_FILE")]
    pub peer_ca_file: Option<PathBuf>,
    /// Tokio worker threads serving requests, replication and the timer [default: one fewer
    /// than the cores the process may use, at least 1].
    #[arg(long, env = "DELAYD_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
    /// Test-only: serve /debug/clock to shift this node's clock (chaos testing) [default:
    /// false].
    #[arg(long, env = "DELAYD_DEBUG_CLOCK", num_args = 0..=1, default_missing_value = "true",
          value_parser = BoolishValueParser::new())]
    pub debug_clock: Option<bool>,
}

impl std::fmt::Debug for Settings {
    /// As JSON, with the admin token redacted: settings may end up in a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match serde_json::to_string(&self.redacted()) {
            Ok(s) => f.write_str(&s),
            Err(_) => f.write_str("Settings(<unprintable>)"),
        }
    }
}

/// `a.or(b)` for every field: `self` wins where it is set.
macro_rules! layer {
    ($a:ident, $b:ident; $($f:ident),* $(,)?) => {
        Settings { $($f: $a.$f.or($b.$f)),* }
    };
}

impl Settings {
    /// The defaults, every key set (the optional ones to `None`).
    pub fn defaults() -> Settings {
        let c = Config::default();
        Settings {
            node_id: Some(c.node_id),
            data_dir: Some(c.data_dir),
            http_addr: Some(c.http_addr),
            http_header_timeout_ms: Some(millis(c.http.header_timeout)),
            http_idle_timeout_ms: Some(millis(c.http.idle_timeout)),
            http_max_connections: Some(c.http.max_connections),
            grpc_addr: Some(c.grpc_addr),
            advertise_addr: None,
            peers: Some(String::new()),
            join: Some(c.join),
            disque_addr: None,
            disque_namespace: Some(c.disque_namespace.clone()),
            protocol_idle_timeout_ms: Some(c.protocol_idle_timeout.map_or(0, millis)),
            beanstalk_addr: None,
            beanstalk_namespace: Some(c.beanstalk_namespace.clone()),
            max_body_bytes: Some(c.max_body_bytes),
            max_entry_bytes: Some(c.max_entry_bytes),
            max_horizon_s: Some(c.max_horizon.as_secs()),
            request_timeout_ms: Some(millis(c.request_timeout)),
            max_batch: Some(c.max_batch),
            max_in_flight: Some(c.max_in_flight),
            batch_linger_us: Some(c.batch_linger.as_micros().try_into().unwrap_or(u64::MAX)),
            tick_limit: Some(c.tick_limit),
            ack_hold_ms: Some(millis(c.ack_hold)),
            snapshot_logs: Some(c.snapshot_logs),
            keep_logs: Some(c.keep_logs),
            snapshot_log_bytes: Some(c.snapshot_log_bytes),
            heartbeat_ms: Some(c.heartbeat_ms),
            election_timeout_min_ms: Some(c.election_timeout_ms.0),
            election_timeout_max_ms: Some(c.election_timeout_ms.1),
            transfer_timeout_ms: Some(c.transfer_timeout_ms),
            lease_reads: Some(c.lease_reads),
            dev: Some(false),
            admin_token: None,
            admin_token_file: None,
            previous_admin_tokens: None,
            cluster_secret: None,
            cluster_secret_file: None,
            previous_cluster_secrets: None,
            public_metrics: Some(false),
            log_level: Some("info,openraft=warn".into()),
            log_json: Some(false),
            drain_timeout_ms: Some(millis(c.http.drain_timeout)),
            ready_max_lag: Some(c.ready_max_lag),
            debug_clock: Some(false),
            tls_cert_file: None,
            tls_key_file: None,
            peer_ca_file: None,
            worker_threads: None,
        }
    }

    /// These settings over `lower`: a key set here wins.
    pub fn over(self, lower: Settings) -> Settings {
        let a = self;
        let b = lower;
        layer!(a, b;
            node_id, data_dir, http_addr, http_header_timeout_ms, http_idle_timeout_ms,
            http_max_connections, grpc_addr, advertise_addr, peers, join,
            disque_addr, disque_namespace, protocol_idle_timeout_ms, beanstalk_addr,
            beanstalk_namespace, max_body_bytes, max_entry_bytes, max_horizon_s, request_timeout_ms, max_batch,
            max_in_flight, batch_linger_us,
            tick_limit, ack_hold_ms, snapshot_logs, keep_logs, snapshot_log_bytes, heartbeat_ms,
            election_timeout_min_ms, election_timeout_max_ms, transfer_timeout_ms, lease_reads, dev, admin_token,
            admin_token_file, previous_admin_tokens, cluster_secret, cluster_secret_file,
            previous_cluster_secrets, public_metrics, log_level, log_json, drain_timeout_ms,
            ready_max_lag, debug_clock, tls_cert_file, tls_key_file, peer_ca_file, worker_threads,
        )
    }

    /// Reads a settings file, naming the file and the offending line on any error.
    pub fn from_file(path: &Path) -> anyhow::Result<Settings> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the config file {}", path.display()))?;
        Self::from_toml(&text).with_context(|| format!("config file {}", path.display()))
    }

    /// Parses settings from TOML text; unknown keys are errors (a typo must not be ignored).
    pub fn from_toml(text: &str) -> anyhow::Result<Settings> {
        toml::from_str(text).map_err(|e| {
            // toml quotes the offending line and value; never when that is the admin token.
            let line_start = e
                .span()
                .map_or(0, |s| text[..s.start.min(text.len())].rfind('\n').map_or(0, |i| i + 1));
            let line = text[line_start..].lines().next().unwrap_or("");
            let secret = SECRET_KEYS.iter().find(|k| line.trim_start().starts_with(**k));
            if let Some(key) = secret {
                let n = text[..line_start].lines().count() + 1;
                anyhow::anyhow!("line {n}: {key} must be a string (value not shown)")
            } else {
                anyhow::anyhow!("{}", e.to_string().trim_end())
            }
        })
    }

    /// The settings as they will be used, for the start-up log: every credential redacted.
    pub fn redacted(&self) -> Settings {
        let mut s = self.clone();
        for secret in [
            &mut s.admin_token,
            &mut s.previous_admin_tokens,
            &mut s.cluster_secret,
            &mut s.previous_cluster_secrets,
        ] {
            if secret.is_some() {
                *secret = Some("<redacted>".into());
            }
        }
        s
    }

    /// The node configuration these (fully layered) settings describe, checked: the first
    /// problem found is named with the key it comes from.
    pub fn to_config(&self) -> anyhow::Result<Config> {
        let d = Config::default();
        let initial_members = match &self.peers {
            Some(p) => parse_members(p).map_err(|e| anyhow::anyhow!("peers: {e}"))?,
            None => Default::default(),
        };
        let positive = |name: &str, v: Option<u64>, default: u64| -> anyhow::Result<u64> {
            match v {
                Some(0) => bail!("{name} must be positive"),
                v => Ok(v.unwrap_or(default)),
            }
        };
        let heartbeat_ms = positive("heartbeat_ms", self.heartbeat_ms, d.heartbeat_ms)?;
        let min = positive(
            "election_timeout_min_ms",
            self.election_timeout_min_ms,
            d.election_timeout_ms.0,
        )?;
        let max = self.election_timeout_max_ms.unwrap_or(d.election_timeout_ms.1);
        if min >= max {
            bail!(
                "election_timeout_min_ms ({min}) must be less than election_timeout_max_ms ({max})"
            );
        }
        if heartbeat_ms >= min {
            bail!(
                "heartbeat_ms ({heartbeat_ms}) must be less than election_timeout_min_ms ({min})"
            );
        }
        let request_timeout_ms =
            positive("request_timeout_ms", self.request_timeout_ms, millis(d.request_timeout))?;
        let http = HttpLimits {
            header_timeout: Duration::from_millis(positive(
                "http_header_timeout_ms",
                self.http_header_timeout_ms,
                millis(d.http.header_timeout),
            )?),
            idle_timeout: Duration::from_millis(positive(
                "http_idle_timeout_ms",
                self.http_idle_timeout_ms,
                millis(d.http.idle_timeout),
            )?),
            max_connections: self.http_max_connections.unwrap_or(d.http.max_connections),
            drain_timeout: Duration::from_millis(positive(
                "drain_timeout_ms",
                self.drain_timeout_ms,
                millis(d.http.drain_timeout),
            )?),
        };
        let max_body_bytes = self.max_body_bytes.unwrap_or(d.max_body_bytes);
        if max_body_bytes == 0 {
            bail!("max_body_bytes must be positive");
        }
        let max_horizon_s = positive("max_horizon_s", self.max_horizon_s, d.max_horizon.as_secs())?;
        if self.admin_token.is_some() && self.admin_token_file.is_some() {
            bail!("give admin_token or admin_token_file, not both");
        }
        let dev = self.dev.unwrap_or(false);
        let admin_token = match &self.admin_token {
            Some(t) if t.len() < MIN_ADMIN_TOKEN_LEN => {
                bail!("admin_token must be at least {MIN_ADMIN_TOKEN_LEN} characters")
            }
            t => t.clone(),
        };
        let join = self.join.unwrap_or(d.join);
        if self.cluster_secret.is_some() && self.cluster_secret_file.is_some() {
            bail!("give cluster_secret or cluster_secret_file, not both");
        }
        let cluster_secret = match &self.cluster_secret_file {
            Some(path) => Some(read_secret(path, "cluster_secret_file")?),
            // Empty is unset: compose passes `${DELAYD_CLUSTER_SECRET:-}` through as is.
            None => self.cluster_secret.clone().filter(|s| !s.is_empty()),
        };
        // Nodes show each other the cluster secret, or the admin token when there is none
        // (see `AuthConfig::effective_cluster_secret`): nodes that each generated their own
        // admin token would then refuse one another and the cluster would never form. A
        // joining node must talk to a running cluster, so it needs the cluster's credential
        // too. An explicit admin_token_file is trusted: it may be one file the nodes share,
        // created by whichever starts first.
        let cluster = initial_members.len() > 1 || join;
        let shared = cluster_secret.is_some() || admin_token.is_some();
        if cluster && !dev && !shared && self.admin_token_file.is_none() {
            let why = if join {
                "join is set".to_string()
            } else {
                format!("peers lists {} members", initial_members.len())
            };
            bail!(
                "{why} but no cluster credential is configured: every node of a cluster needs \
                 the same cluster_secret (or, failing that, the same admin_token or \
                 admin_token_file; each node would otherwise generate its own)"
            );
        }
        let config = Config {
            node_id: self.node_id.unwrap_or(d.node_id),
            data_dir: self.data_dir.clone().unwrap_or(d.data_dir),
            http_addr: self.http_addr.unwrap_or(d.http_addr),
            http,
            grpc_addr: self.grpc_addr.unwrap_or(d.grpc_addr),
            advertise_addr: self.advertise_addr.clone().filter(|a| !a.is_empty()),
            initial_members,
            join,
            max_body_bytes,
            max_entry_bytes: self.max_entry_bytes.unwrap_or(d.max_entry_bytes),
            max_horizon: Duration::from_secs(max_horizon_s),
            request_timeout: Duration::from_millis(request_timeout_ms),
            max_batch: self.max_batch.unwrap_or(d.max_batch),
            max_in_flight: self.max_in_flight.unwrap_or(d.max_in_flight),
            batch_linger: self.batch_linger_us.map_or(d.batch_linger, Duration::from_micros),
            tick_limit: self.tick_limit.unwrap_or(d.tick_limit),
            ack_hold: self.ack_hold_ms.map_or(d.ack_hold, Duration::from_millis),
            snapshot_logs: positive("snapshot_logs", self.snapshot_logs, d.snapshot_logs)?,
            keep_logs: self.keep_logs.unwrap_or(d.keep_logs),
            snapshot_log_bytes: self.snapshot_log_bytes.unwrap_or(d.snapshot_log_bytes),
            heartbeat_ms,
            election_timeout_ms: (min, max),
            transfer_timeout_ms: positive(
                "transfer_timeout_ms",
                self.transfer_timeout_ms,
                d.transfer_timeout_ms,
            )?,
            lease_reads: self.lease_reads.unwrap_or(d.lease_reads),
            auth: AuthConfig {
                dev,
                admin_token,
                previous_admin_tokens: list(self.previous_admin_tokens.as_deref()),
                cluster_secret,
                previous_cluster_secrets: list(self.previous_cluster_secrets.as_deref()),
                public_metrics: self.public_metrics.unwrap_or(false),
            },
            disque_addr: self.disque_addr,
            disque_namespace: self.disque_namespace.clone().unwrap_or(d.disque_namespace.clone()),
            protocol_idle_timeout: match self.protocol_idle_timeout_ms {
                None | Some(0) => None,
                Some(ms) => Some(Duration::from_millis(ms)),
            },
            beanstalk_addr: self.beanstalk_addr,
            beanstalk_namespace: self
                .beanstalk_namespace
                .clone()
                .unwrap_or(d.beanstalk_namespace.clone()),
            ready_max_lag: self.ready_max_lag.unwrap_or(d.ready_max_lag),
            debug_clock: self.debug_clock.unwrap_or(false),
            tls: self.tls()?,
            build: d.build,
            faults: d.faults,
        };
        config.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(config)
    }

    /// The TLS files, read and checked now (see `delayd_raft::tls`); `None` without TLS.
    fn tls(&self) -> anyhow::Result<Option<std::sync::Arc<delayd_server::tls::Tls>>> {
        let files = delayd_server::tls::TlsFiles::from_settings(
            self.tls_cert_file.clone(),
            self.tls_key_file.clone(),
            self.peer_ca_file.clone(),
        )
        .map_err(|e| anyhow::anyhow!(e))?;
        Ok(files.map(delayd_server::tls::Tls::load).transpose()?)
    }

    /// How many Tokio worker threads the node runs: `worker_threads`, checked, or
    /// [`default_worker_threads`].
    pub fn worker_threads(&self) -> anyhow::Result<usize> {
        match self.worker_threads {
            Some(0) => bail!("worker_threads must be at least 1"),
            Some(n) if n > MAX_WORKER_THREADS => {
                bail!("worker_threads ({n}) must be at most {MAX_WORKER_THREADS}")
            }
            Some(n) => Ok(n),
            None => Ok(default_worker_threads()),
        }
    }

    /// Where the admin token is read from (and written to, when missing).
    pub fn admin_token_path(&self, config: &Config) -> PathBuf {
        self.admin_token_file.clone().unwrap_or_else(|| config.data_dir.join("admin-token"))
    }
}

/// More worker threads than this is a typo, not a machine.
const MAX_WORKER_THREADS: usize = 1024;

/// One Tokio worker fewer than the cores this process may use, at least one.
///
/// The workers are not the node's only busy threads: the log's flush worker, the blocking pool
/// that applies large batches, RocksDB's flushes and compactions and snapshot builds run
/// beside them, and with a worker on every core those threads preempt workers in the
/// middle of a request. On two cores, with three nodes and the load generator sharing
/// them, one worker per node served more jobs per second at less CPU per job than two in
/// every pair measured (docs/bench/consume-path.md).
fn default_worker_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.saturating_sub(1).max(1)
}

fn millis(d: Duration) -> u64 {
    d.as_millis().try_into().unwrap_or(u64::MAX)
}

/// The items of a comma-separated list, trimmed, empty ones dropped.
fn list(text: Option<&str>) -> Vec<String> {
    let items = text.unwrap_or("").split(',').map(str::trim).filter(|t| !t.is_empty());
    items.map(str::to_string).collect()
}

/// A credential kept in a file (trailing whitespace dropped); `setting` names the key in
/// errors, never the content.
fn read_secret(path: &Path, setting: &str) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{setting}: cannot read {}", path.display()))?;
    let secret = text.trim().to_string();
    if secret.is_empty() {
        bail!("{setting}: {} is empty", path.display());
    }
    Ok(secret)
}

/// The admin token from `path`, or a new random one written there (readable by its owner
/// only) when the file does not exist. Returns the token and whether it was created.
pub fn load_or_create_admin_token(path: &Path) -> anyhow::Result<(String, bool)> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let token = text.trim().to_string();
            if token.len() < MIN_ADMIN_TOKEN_LEN {
                bail!(
                    "the admin token in {} is shorter than {MIN_ADMIN_TOKEN_LEN} characters",
                    path.display()
                );
            }
            Ok((token, false))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
            }
            let token = delayd_server::service::auth::new_secret();
            match write_private(path, &format!("{token}\n")) {
                Ok(()) => Ok((token, true)),
                // Another node sharing the file made it first: use theirs.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    load_or_create_admin_token(path)
                }
                Err(e) => Err(e)
                    .with_context(|| format!("cannot write the admin token to {}", path.display())),
            }
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Writes `text` to a new file at `path` readable by its owner only. The file appears
/// complete or not at all (written aside, then linked into place), so nodes sharing it never
/// read half a token; `AlreadyExists` when another got there first.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let aside = path.with_extension(format!("new-{}", std::process::id()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&aside)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::hard_link(&aside, path)
    })();
    let _ = std::fs::remove_file(&aside);
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> Settings {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../delayd.example.toml");
        Settings::from_file(Path::new(path)).expect("the example parses")
    }

    #[test]
    fn the_example_file_lists_every_key_with_its_default() {
        // Every key the example leaves commented out is one without a default value.
        assert_eq!(example(), Settings::defaults());
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../delayd.example.toml"
        ))
        .expect("read");
        let keys = serde_json::to_value(Settings::defaults()).expect("json");
        for key in keys.as_object().expect("object").keys() {
            assert!(text.contains(&format!("{key} =")), "the example does not mention {key}");
        }
    }

    #[test]
    fn layers_override_in_order_file_env_flags() {
        let file = Settings::from_toml("http_addr = \"127.0.0.1:1\"\nnode_id = 2\nkeep_logs = 7\n")
            .expect("parse");
        let env = Settings { node_id: Some(3), keep_logs: Some(8), ..Settings::default() };
        let flags = Settings { keep_logs: Some(9), ..Settings::default() };
        let s = flags.over(env).over(file).over(Settings::defaults());
        assert_eq!(s.http_addr, Some("127.0.0.1:1".parse().expect("addr")), "from the file");
        assert_eq!(s.node_id, Some(3), "the environment beats the file");
        assert_eq!(s.keep_logs, Some(9), "a flag beats both");
        assert_eq!(s.max_batch, Some(512), "the default fills the rest");
        let config = s.to_config().expect("valid");
        assert_eq!((config.node_id, config.keep_logs), (3, 9));
    }

    #[test]
    fn bad_settings_are_named() {
        let err = |toml: &str| -> String {
            match Settings::from_toml(toml).and_then(|s| s.over(Settings::defaults()).to_config()) {
                Ok(_) => panic!("{toml:?} was accepted"),
                Err(e) => format!("{e:#}"),
            }
        };
        assert!(err("htp_addr = \"x\"").contains("unknown field `htp_addr`"));
        assert!(err("http_addr = \"nowhere\"").contains("http_addr"));
        assert!(err("node_id = \"one\"").contains("node_id"));
        assert!(err("peers = \"1=a\"").contains("peers: peer address \"a\" has no port"));
        assert!(err("election_timeout_min_ms = 2000").contains("must be less than"));
        assert!(err("heartbeat_ms = 800").contains("heartbeat_ms (800)"));
        assert!(err("admin_token = \"short\"").contains("at least 16"));
        let secret = err("node_id = 1\nadmin_token = 12345678901234567890");
        assert!(secret.contains("line 2: admin_token must be a string"), "{secret}");
        assert!(!secret.contains("1234567890"), "the value is not shown: {secret}");
        assert!(err("max_body_bytes = 0").contains("max_body_bytes"));
        assert!(err("request_timeout_ms = 0").contains("request_timeout_ms must be positive"));
        assert!(err("ack_hold_ms = 10001").contains("ack_hold_ms (10001) must be at most 10000"));
        assert!(err("admin_token = \"0123456789abcdef\"\nadmin_token_file = \"t\"")
            .contains("not both"));
    }

    #[test]
    fn worker_threads_default_to_one_fewer_than_the_cores_and_must_be_positive() {
        let workers = |toml: &str| {
            Settings::from_toml(toml).and_then(|s| s.over(Settings::defaults()).worker_threads())
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(workers("").expect("default"), cores.saturating_sub(1).max(1));
        assert_eq!(workers("worker_threads = 3").expect("set"), 3);
        let zero = workers("worker_threads = 0").expect_err("zero");
        assert!(zero.to_string().contains("worker_threads must be at least 1"), "{zero}");
        let huge = workers("worker_threads = 100000").expect_err("huge");
        assert!(huge.to_string().contains("worker_threads (100000) must be at most"), "{huge}");
    }

    #[test]
    fn a_cluster_node_needs_a_configured_cluster_credential() {
        let config = |toml: &str| {
            Settings::from_toml(toml).and_then(|s| s.over(Settings::defaults()).to_config())
        };
        let three = "peers = \"1=a:1,2=b:2,3=c:3\"\n";
        let err = format!("{:#}", config(three).expect_err("no token"));
        assert!(
            err.contains("peers lists 3 members but no cluster credential is configured")
                && err.contains("the same cluster_secret")
                && err.contains("admin_token or admin_token_file"),
            "{err}"
        );
        let err = format!("{:#}", config("join = true").expect_err("no token"));
        assert!(err.contains("join is set but no cluster credential is configured"), "{err}");
        // A single node generates its own; a cluster secret, a shared admin token, a token
        // file or dev will do.
        for ok in [
            format!("{three}cluster_secret = \"0123456789abcdef\""),
            String::new(),
            "peers = \"1=a:1\"".into(),
            format!("{three}admin_token = \"0123456789abcdef\""),
            format!("{three}admin_token_file = \"/shared/admin-token\""),
            format!("{three}dev = true"),
            "join = true\ndev = true".into(),
        ] {
            config(&ok).unwrap_or_else(|e| panic!("{ok:?} refused: {e:#}"));
        }
    }

    #[test]
    fn http_limits_come_from_their_keys_and_must_be_positive() {
        let s = Settings::from_toml(
            "http_header_timeout_ms = 500\nhttp_idle_timeout_ms = 700\nhttp_max_connections = 3\n\
             drain_timeout_ms = 900",
        )
        .expect("parse");
        let c = s.over(Settings::defaults()).to_config().expect("valid");
        assert_eq!(
            c.http,
            HttpLimits {
                header_timeout: Duration::from_millis(500),
                idle_timeout: Duration::from_millis(700),
                max_connections: 3,
                drain_timeout: Duration::from_millis(900),
            }
        );
        let keys = [
            "http_header_timeout_ms",
            "http_idle_timeout_ms",
            "http_max_connections",
            "drain_timeout_ms",
        ];
        for key in keys {
            let s = Settings::from_toml(&format!("{key} = 0")).expect("parse");
            let err = format!("{:#}", s.over(Settings::defaults()).to_config().expect_err(key));
            assert!(err.contains(key), "{err}");
        }
    }

    #[test]
    fn tls_files_come_in_pairs_and_are_named_when_unreadable() {
        let err = |toml: &str| -> String {
            match Settings::from_toml(toml).and_then(|s| s.over(Settings::defaults()).to_config()) {
                Ok(_) => panic!("{toml:?} was accepted"),
                Err(e) => format!("{e:#}"),
            }
        };
        assert!(
            err("tls_cert_file = \"c.pem\"").contains("tls_cert_file is set without tls_key_file")
        );
        assert!(
            err("tls_key_file = \"k.pem\"").contains("tls_key_file is set without tls_cert_file")
        );
        assert!(err("peer_ca_file = \"ca.pem\"").contains("peer_ca_file needs tls_cert_file"));
        let missing = err("tls_cert_file = \"/nonexistent/c.pem\"\ntls_key_file = \"k.pem\"");
        assert!(missing.contains("tls_cert_file /nonexistent/c.pem: No such file"), "{missing}");
    }

    #[test]
    fn redaction_hides_the_admin_token_only() {
        let s = Settings {
            admin_token: Some("0123456789abcdef".into()),
            node_id: Some(4),
            ..Settings::default()
        };
        let shown = serde_json::to_string(&s.redacted()).expect("json");
        assert!(!shown.contains("0123456789abcdef") && shown.contains("<redacted>"));
        assert!(shown.contains("\"node_id\":4"));
        let debug = format!("{s:?} {:?}", s.to_config().map(|c| c.auth).ok());
        assert!(!debug.contains("0123456789abcdef") && debug.contains("<redacted>"), "{debug}");
    }

    #[test]
    fn credentials_for_rotation_are_lists_and_are_redacted() {
        let s = Settings::from_toml(
            "admin_token = \"new-admin-token-0123\"\n\
             previous_admin_tokens = \"old-admin-token-0123, older-admin-token-01\"\n\
             cluster_secret = \"new-cluster-secret-01\"\n\
             previous_cluster_secrets = \"old-cluster-secret-01\"\n",
        )
        .expect("parse");
        let c = s.clone().over(Settings::defaults()).to_config().expect("valid");
        assert_eq!(c.auth.previous_admin_tokens, ["old-admin-token-0123", "older-admin-token-01"]);
        assert_eq!(c.auth.cluster_secret.as_deref(), Some("new-cluster-secret-01"));
        assert_eq!(c.auth.previous_cluster_secrets, ["old-cluster-secret-01"]);
        let cluster = c.cluster();
        assert_eq!(cluster.cluster_secret.as_deref(), Some("new-cluster-secret-01"));
        assert_eq!(cluster.previous_cluster_secrets, ["old-cluster-secret-01"]);
        let shown = format!("{:?} {:?} {:?}", s.redacted(), c.auth, s);
        for secret in ["admin-token-0123", "cluster-secret-01", "admin-token-01"] {
            assert!(!shown.contains(secret), "{secret} shown: {shown}");
        }
        // A secret's value never appears in a parse error either.
        let err = format!(
            "{:#}",
            Settings::from_toml("cluster_secret = 1234567890123456789").expect_err("not a string")
        );
        assert!(err.contains("cluster_secret must be a string") && !err.contains("12345"), "{err}");
    }

    #[test]
    fn the_cluster_secret_defaults_to_the_admin_token_and_comes_from_a_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("cluster-secret");
        std::fs::write(&file, "secret-from-a-file-0123\n").expect("write");
        let config = |toml: String| {
            Settings::from_toml(&toml).and_then(|s| s.over(Settings::defaults()).to_config())
        };
        let admin = "admin_token = \"admin-token-0123456\"\n";
        let c = config(admin.to_string()).expect("valid");
        assert_eq!(c.cluster().cluster_secret.as_deref(), Some("admin-token-0123456"));
        let c = config(format!("{admin}cluster_secret_file = {:?}", file.display().to_string()))
            .expect("valid");
        assert_eq!(c.cluster().cluster_secret.as_deref(), Some("secret-from-a-file-0123"));
        // Empty means unset (compose passes an unset variable through as "").
        let c = config(format!("{admin}cluster_secret = \"\"")).expect("valid");
        assert_eq!(c.cluster().cluster_secret.as_deref(), Some("admin-token-0123456"));
        let err = |toml: String| format!("{:#}", config(toml).expect_err("refused"));
        assert!(err("cluster_secret = \"short\"".into()).contains("cluster_secret must be"));
        assert!(err("previous_admin_tokens = \"short\"".into()).contains("previous_admin_tokens"));
        let missing = err("cluster_secret_file = \"/nowhere/secret\"".into());
        assert!(missing.contains("cluster_secret_file: cannot read /nowhere/secret"), "{missing}");
        assert!(err(format!(
            "cluster_secret = \"0123456789abcdef\"\ncluster_secret_file = {:?}",
            file.display().to_string()
        ))
        .contains("not both"));
        assert!(err("previous_cluster_secrets = \"0123456789abcdef\"".into())
            .contains("needs a cluster_secret"));
    }

    #[test]
    fn a_missing_admin_token_file_is_created_private_and_then_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/admin-token");
        let (token, created) = load_or_create_admin_token(&path).expect("create");
        assert!(created && token.len() == 32);
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(load_or_create_admin_token(&path).expect("reuse"), (token, false));
        std::fs::write(&path, "short\n").expect("write");
        assert!(load_or_create_admin_token(&path).is_err());
    }
}
