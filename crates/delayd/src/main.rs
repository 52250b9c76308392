//! `delayd`: run one node. With no arguments it is a single-node cluster with its data in
//! `./data`, serving lmstfy's HTTP API on port 7777.

mod fields;
#[cfg(test)]
mod log_sink;
mod probe;
mod repeats;
mod restore;
mod settings;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use delayd_server::config::BuildInfo;
use delayd_server::Node;
use fields::PlainFields;
use repeats::Repeats;
use settings::Settings;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter};

/// Every request allocates small buffers on several threads (HTTP, gRPC, Raft, RocksDB
/// callbacks); glibc's malloc showed up at ~10% of a 3-node publish profile, mimalloc's
/// thread-local pages make those allocations cheap.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The git revision this binary was built from (`build.rs`): 12 hex digits or `unknown`.
const GIT_SHA: &str = env!("DELAYD_GIT_SHA");

/// What `delayd --version` prints after the program's name: `0.1.0 (0123456789ab)`.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("DELAYD_GIT_SHA"), ")");

/// This build, as `delayd_build_info` shows it.
fn build_info() -> BuildInfo {
    BuildInfo { version: env!("CARGO_PKG_VERSION").into(), git_sha: GIT_SHA.into() }
}

/// A Raft-replicated delay queue with lmstfy's HTTP API.
///
/// Settings come from the config file, then `DELAYD_*` environment variables, then flags;
/// each key is documented with its default in delayd.example.toml.
#[derive(Parser, Debug)]
#[command(version = VERSION, about)]
struct Args {
    /// TOML settings file; environment variables and flags override it.
    #[arg(long, env = "DELAYD_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    settings: Settings,
    /// Without a command, run the node.
    #[command(subcommand)]
    command: Option<Cmd>,
}

/// What `delayd` does other than running a node.
#[derive(clap::Subcommand, Debug)]
enum Cmd {
    /// Build a new data directory from a backup (see docs/backup.md).
    Restore(restore::RestoreArgs),
    /// Turn a surviving node's data into a single-node cluster (see docs/backup.md).
    Recover(restore::RecoverArgs),
    /// Ask a node whether it is ready (`/ready`): exit 0 if it is, 1 with its reason if not.
    /// The container image's health check.
    Probe(probe::ProbeArgs),
}

/// How long the exit waits for the runtime's blocking tasks still running once the node has
/// stopped (the wait for a state flush given up at `delayd_raft::cluster::FLUSH_TIMEOUT`,
/// a store call stuck on the disk); dropping the runtime would wait for them for ever.
const EXIT_WAIT: Duration = Duration::from_secs(1);

fn main() -> anyhow::Result<()> {
    // RocksDB's per-thread counters, which nothing reads, off on this thread (a restore's or
    // a recovery's work runs here) and on each thread the runtime starts.
    delayd_store::without_perf_counters();
    let mut args = Args::parse();
    let (runtime, outcome) = match args.command.take() {
        // A probe, a restore or a recovery needs no pool of workers.
        Some(command) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .on_thread_start(delayd_store::without_perf_counters)
                .enable_all()
                .build()?;
            let outcome = runtime.block_on(run_command(command));
            (runtime, outcome)
        }
        // The settings are read before the runtime is built: its worker count is one of them.
        None => {
            let settings = layered(args.settings, args.config.as_deref())?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(settings.worker_threads()?)
                .on_thread_start(delayd_store::without_perf_counters)
                .enable_all()
                .build()?;
            let outcome = runtime.block_on(run(settings, args.config));
            (runtime, outcome)
        }
    };
    runtime.shutdown_timeout(EXIT_WAIT);
    outcome
}

/// `flags` (flags over the environment, both from clap) over the file, over the defaults.
fn layered(flags: Settings, config_file: Option<&Path>) -> anyhow::Result<Settings> {
    let file = match config_file {
        Some(path) => Settings::from_file(path)?,
        None => Settings::default(),
    };
    Ok(flags.over(file).over(Settings::defaults()))
}

async fn run_command(command: Cmd) -> anyhow::Result<()> {
    match command {
        Cmd::Restore(a) => restore::restore(a),
        Cmd::Recover(a) => restore::recover(a),
        Cmd::Probe(a) => probe::run(a).await,
    }
}

/// Runs the node with `settings` (fully layered, read from `config_file` if one was named).
async fn run(settings: Settings, config_file: Option<PathBuf>) -> anyhow::Result<()> {
    let mut config = settings.to_config()?;
    config.build = build_info();
    init_logging(&settings)?;

    if config.auth.dev {
        tracing::warn!(
            "*** --dev: AUTHENTICATION IS OFF. Anyone who can reach this node can read, write \
             and administer it. Never run a server like this. ***"
        );
    } else if config.auth.admin_token.is_none() {
        let path = settings.admin_token_path(&config);
        let (token, created) = settings::load_or_create_admin_token(&path)?;
        if created {
            tracing::warn!(file = %path.display(), "no admin token configured: generated one");
        } else {
            tracing::info!(file = %path.display(), "admin token read");
        }
        config.auth.admin_token = Some(token);
    }
    tracing::info!(
        version = %config.build.version,
        git_sha = %config.build.git_sha,
        settings = %serde_json::to_string(&settings.redacted()).unwrap_or_default(),
        config_file = ?config_file,
        // The count the runtime was built with, the default resolved.
        worker_threads = tokio::runtime::Handle::current().metrics().num_workers(),
        "effective configuration"
    );
    if config.debug_clock {
        tracing::warn!("--debug-clock: /debug/clock can shift this node's clock; test use only");
    }
    Node::run(config, shutdown_signal()).await.context("the node failed")?;
    tracing::info!("stopped");
    Ok(())
}

/// Text logs (colours only on a terminal, so log files and `docker logs` stay plain, written
/// by [`PlainFields`]) or JSON lines, filtered by `log_level` (`RUST_LOG`).
///
/// A filter that only names targets and levels (the default, `info,openraft=warn`, is one)
/// is applied as a [`Targets`] filter. `EnvFilter` parses the same lists but also span and
/// field directives, and for those it takes a lock on every enter and exit of every span:
/// work each HTTP request paid for nothing (about 1 % of a leader's CPU under publish load).
/// Only a filter with such directives gets it.
///
/// openraft's warnings that repeat for every failed call to an absent peer are sampled
/// ([`repeats`]).
fn init_logging(settings: &Settings) -> anyhow::Result<()> {
    let (targets, env) = log_filter(settings.log_level.as_deref().unwrap_or("info"))?;
    let logs = tracing_subscriber::registry().with(targets).with(env).with(Repeats::default());
    // To stderr, as documented (fmt's own default is stdout), so that stdout carries only
    // what a command prints, and whether stderr is a terminal decides the colours.
    let layer = fmt::layer().with_writer(std::io::stderr);
    if settings.log_json == Some(true) {
        logs.with(layer.json().with_current_span(true)).init();
    } else {
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        if ansi {
            logs.with(layer.with_ansi(true)).init();
        } else {
            logs.with(layer.with_ansi(false).fmt_fields(PlainFields)).init();
        }
    }
    Ok(())
}

/// The filter `init_logging` installs for `level`: a [`Targets`] when it can express it, else
/// an `EnvFilter` (exactly one of the two is `Some`).
fn log_filter(level: &str) -> anyhow::Result<(Option<Targets>, Option<EnvFilter>)> {
    match level.parse::<Targets>() {
        Ok(targets) => Ok((Some(targets), None)),
        Err(_) => {
            let env = EnvFilter::try_new(level)
                .with_context(|| format!("log_level {level:?} is not valid"))?;
            Ok((None, Some(env)))
        }
    }
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

    #[test]
    fn the_version_names_the_release_and_the_revision() {
        let err = Args::try_parse_from(["delayd", "--version"]).expect_err("prints and exits");
        assert_eq!(err.kind(), clap::error::ErrorKind::DisplayVersion);
        let shown = err.to_string();
        let expected = format!("delayd {} ({})", env!("CARGO_PKG_VERSION"), build_info().git_sha);
        assert_eq!(shown.trim(), expected);
        let sha = build_info().git_sha;
        assert!(
            sha == "unknown" || (!sha.is_empty() && sha.chars().all(|c| c.is_ascii_hexdigit())),
            "{sha:?} is neither a revision nor `unknown`"
        );
    }

    #[test]
    fn target_lists_get_the_cheap_filter_and_span_directives_the_full_one() {
        for plain in ["info", "info,openraft=warn", "delayd_raft::network=trace", "off"] {
            let (targets, env) = log_filter(plain).expect("valid");
            assert!(targets.is_some() && env.is_none(), "{plain}");
        }
        let (targets, env) = log_filter("info,[request{route=/api}]=debug").expect("valid");
        assert!(targets.is_none() && env.is_some());
        let err = log_filter("info,delayd=loud").expect_err("not a level");
        assert!(err.to_string().contains("is not valid"), "{err}");
    }

    /// Found by the chaos harness: `DELAYD_DEBUG_CLOCK=1` made the node exit at start,
    /// because clap's plain boolean flags accept only `true`/`false` from the environment.
    /// Also: the environment sits between the file and the flags.
    #[test]
    fn the_environment_takes_the_usual_spellings_and_flags_override_it() {
        // The only test in this binary that touches the process environment, so it is safe.
        let vars = ["DELAYD_DEBUG_CLOCK", "DELAYD_LOG_JSON", "DELAYD_JOIN", "DELAYD_DEV"];
        for (value, expected) in [("1", true), ("yes", true), ("true", true), ("0", false)] {
            for v in vars {
                std::env::set_var(v, value);
            }
            let s = Args::try_parse_from(["delayd"]).expect("parses").settings;
            assert_eq!(
                (s.debug_clock, s.log_json, s.join, s.dev),
                (Some(expected), Some(expected), Some(expected), Some(expected))
            );
        }
        std::env::set_var("DELAYD_KEEP_LOGS", "11");
        let s = Args::try_parse_from(["delayd", "--keep-logs", "12", "--dev", "false"])
            .expect("parses")
            .settings;
        assert_eq!((s.keep_logs, s.dev), (Some(12), Some(false)), "flags win");
        let s = Args::try_parse_from(["delayd"]).expect("parses").settings;
        let file = Settings::from_toml("keep_logs = 10\nmax_batch = 3").expect("toml");
        let s = s.over(file);
        assert_eq!((s.keep_logs, s.max_batch), (Some(11), Some(3)), "env over file");
        for v in vars.iter().chain(&["DELAYD_KEEP_LOGS"]) {
            std::env::remove_var(v);
        }
        let s = Args::try_parse_from(["delayd", "--debug-clock"]).expect("parses").settings;
        assert_eq!((s.debug_clock, s.log_json), (Some(true), None));
    }
}
