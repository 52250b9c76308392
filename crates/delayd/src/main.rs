//! `delayd`: run one node. With no arguments it is a single-node cluster with its data in
//! `./data`, serving lmstfy's HTTP API on port 7777.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::builder::BoolishValueParser;
use clap::Parser;
use delayd_server::{http, Config, Node};
use tracing_subscriber::EnvFilter;

/// Every request allocates small buffers on several threads (HTTP, gRPC, Raft, RocksDB
/// callbacks); glibc's malloc showed up at ~10% of a 3-node publish profile, mimalloc's
/// thread-local pages make those allocations cheap.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A Raft-replicated delay queue with lmstfy's HTTP API.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Directory for RocksDB and snapshots.
    #[arg(long, env = "DELAYD_DATA_DIR", default_value = "data")]
    data_dir: PathBuf,
    /// HTTP listen address.
    #[arg(long, env = "DELAYD_HTTP_ADDR", default_value = "0.0.0.0:7777")]
    http_addr: SocketAddr,
    /// Internal gRPC listen address (Raft replication, forwarding).
    #[arg(long, env = "DELAYD_GRPC_ADDR", default_value = "0.0.0.0:7778")]
    grpc_addr: SocketAddr,
    /// The gRPC address peers use to reach this node (default: --grpc-addr, loopback if
    /// unspecified).
    #[arg(long, env = "DELAYD_ADVERTISE_ADDR")]
    advertise_addr: Option<String>,
    /// This node's Raft id.
    #[arg(long, env = "DELAYD_NODE_ID", default_value_t = 1)]
    node_id: u64,
    /// Initial members as `id=host:port,...` (gRPC addresses), the same on every founding
    /// node. Empty: a single-node cluster.
    #[arg(long, env = "DELAYD_PEERS", default_value = "")]
    peers: String,
    /// Start empty and wait to be added through the admin API of a running cluster.
    #[arg(long, env = "DELAYD_JOIN", value_parser = BoolishValueParser::new())]
    join: bool,
    /// Largest job body accepted, in bytes.
    #[arg(long, env = "DELAYD_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    max_body_bytes: usize,
    /// How long a write waits for the cluster before answering 503, in ms.
    #[arg(long, env = "DELAYD_REQUEST_TIMEOUT_MS", default_value_t = 5_000)]
    request_timeout_ms: u64,
    /// Build a snapshot after this many log entries.
    #[arg(long, env = "DELAYD_SNAPSHOT_LOGS", default_value_t = 50_000)]
    snapshot_logs: u64,
    /// Log entries kept behind a snapshot.
    #[arg(long, env = "DELAYD_KEEP_LOGS", default_value_t = 10_000)]
    keep_logs: u64,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "DELAYD_LOG_JSON", value_parser = BoolishValueParser::new())]
    log_json: bool,
    /// Test-only: serve `/debug/clock` to shift this node's wall clock (chaos testing).
    /// Never in production.
    #[arg(long, env = "DELAYD_DEBUG_CLOCK", value_parser = BoolishValueParser::new())]
    debug_clock: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,openraft=warn"));
    if args.log_json {
        tracing_subscriber::fmt().json().with_env_filter(filter).init();
    } else {
        // Colours only on a terminal: log files and `docker logs` stay plain text.
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        tracing_subscriber::fmt().with_ansi(ansi).with_env_filter(filter).init();
    }

    let initial_members = delayd_server::config::parse_members(&args.peers)
        .map_err(|e| anyhow::anyhow!("--peers: {e}"))?;
    let config = Config {
        node_id: args.node_id,
        grpc_addr: args.grpc_addr,
        advertise_addr: args.advertise_addr,
        initial_members,
        join: args.join,
        data_dir: args.data_dir,
        http_addr: args.http_addr,
        max_body_bytes: args.max_body_bytes,
        request_timeout: Duration::from_millis(args.request_timeout_ms),
        snapshot_logs: args.snapshot_logs,
        keep_logs: args.keep_logs,
        debug_clock: args.debug_clock,
        ..Config::default()
    };
    let listener = tokio::net::TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("cannot listen on {}", config.http_addr))?;
    if config.debug_clock {
        tracing::warn!("--debug-clock: /debug/clock can shift this node's clock; test use only");
    }
    let node = Node::start(config).await.context("cannot start the node")?;
    tracing::info!(addr = %listener.local_addr()?, "serving HTTP");

    axum::serve(listener, http::router(node.clone()))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("HTTP server")?;
    node.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the chaos harness: `DELAYD_DEBUG_CLOCK=1` made the node exit at start,
    /// because clap's plain boolean flags accept only `true`/`false` from the environment.
    #[test]
    fn boolean_flags_accept_the_usual_spellings_from_the_environment() {
        // The only test in this binary that touches these variables, so setting them is safe.
        for (value, expected) in [("1", true), ("yes", true), ("true", true), ("0", false)] {
            std::env::set_var("DELAYD_DEBUG_CLOCK", value);
            std::env::set_var("DELAYD_LOG_JSON", value);
            std::env::set_var("DELAYD_JOIN", value);
            let args = Args::try_parse_from(["delayd"]).expect("parses");
            assert_eq!(
                (args.debug_clock, args.log_json, args.join),
                (expected, expected, expected)
            );
        }
        std::env::remove_var("DELAYD_DEBUG_CLOCK");
        std::env::remove_var("DELAYD_LOG_JSON");
        std::env::remove_var("DELAYD_JOIN");
        let args = Args::try_parse_from(["delayd", "--debug-clock"]).expect("parses");
        assert!(args.debug_clock && !args.log_json);
    }
}
