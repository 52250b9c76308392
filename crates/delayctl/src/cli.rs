//! The command line: every command, its arguments and their checks, as clap reads them.
//!
//! Time flags take what they always took — a plain number in the unit their name says
//! (`--delay` seconds, `--delay-ms` milliseconds) — and also a duration with units (`90s`,
//! `5m`, `1h30m`); points in time take unix milliseconds or an RFC 3339 date. Both are
//! parsed here ([`crate::time`]), so that a typo is a usage error (exit 2) naming the flag,
//! never a request.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use reqwest::Url;

use crate::http;
use crate::time::{self, Unit};

/// `delayctl --version`: the version and the git revision it was built from (`build.rs`).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("DELAYCTL_GIT_SHA"), ")");

/// Operator CLI for delayd: cluster, tokens, jobs, queues, dead letters, webhooks and
/// schedules over the HTTP API.
#[derive(Parser)]
#[command(
    name = "delayctl",
    version = VERSION,
    after_help = "Exit codes: 0 ok, 1 error, 2 usage, 3 nothing to consume.\n\
                  Durations: 90 (the flag's unit), 90s, 5m, 1h30m, 250ms, 2d. \
                  Times: unix ms or RFC 3339."
)]
pub struct Cli {
    /// Options every command takes.
    #[command(flatten)]
    pub global: Global,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes, before or after it.
#[derive(Args)]
#[command(next_help_heading = "Global options")]
pub struct Global {
    /// Nodes to try in order (comma-separated); the next is tried only when one cannot be
    /// connected to.
    #[arg(
        long,
        global = true,
        env = "DELAYD_ADDR",
        value_name = "URL[,URL...]",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7777",
        value_parser = http::parse_addr
    )]
    pub addr: Vec<Url>,
    /// Token sent as `Authorization: Bearer <token>`: the admin token or a namespace token.
    #[arg(long, global = true, env = "DELAYD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the server's JSON (pretty) instead of tables.
    #[arg(long, global = true, env = "DELAYD_JSON", value_parser = clap::builder::FalseyValueParser::new())]
    pub json: bool,
    /// Per-request timeout in milliseconds, or a duration such as `30s` (a consume's long
    /// poll is added to it).
    #[arg(
        long,
        global = true,
        env = "DELAYD_TIMEOUT_MS",
        default_value = "10000",
        value_name = "MS",
        value_parser = positive_ms
    )]
    pub timeout_ms: u64,
    /// PEM CA certificate(s) to verify `https://` nodes with, besides the system's roots.
    #[arg(long, global = true, env = "DELAYCTL_CA_FILE", value_name = "PEM")]
    pub ca_file: Option<PathBuf>,
}

/// Every command.
#[derive(Subcommand)]
pub enum Command {
    /// Cluster status and membership.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// The answering node's own view: its id, state, leader, term and log position.
    Health,
    /// Whether the answering node serves clients now (exit 1 with the reason when not).
    Ready,
    /// Namespace tokens.
    #[command(subcommand)]
    Token(TokenCmd),
    /// Publish a job; prints its id.
    Publish(Publish),
    /// Publish many jobs at once, all or none, from a JSON array; prints their ids.
    Bulk(Bulk),
    /// Replace a job by a new one (a new id, published now); prints the new id.
    Republish(Republish),
    /// Reserve jobs from one or more queues (in priority order).
    Consume(Consume),
    /// Acknowledge (delete) a job.
    Ack {
        #[command(flatten)]
        job: JobArgs,
        /// Ack only if this is still the current lease (from consume).
        #[arg(long)]
        lease: Option<String>,
    },
    /// Put a reserved job back: ready now, or delayed.
    Release(Release),
    /// Extend a job's reservation (its time-to-run starts again from now).
    Touch(Touch),
    /// Move a reserved job to the dead letter.
    Bury {
        #[command(flatten)]
        job: JobArgs,
        /// Only if this is still the current lease (from consume).
        #[arg(long)]
        lease: Option<String>,
    },
    /// Change a pending (delayed or ready) job: its due time, priority or body.
    Update(Update),
    /// Show one job in any state, or the next ready job of a queue.
    Peek {
        #[command(flatten)]
        queue: QueueArgs,
        /// Job id; without it, the next ready job.
        job_id: Option<String>,
    },
    /// Jobs by their idempotency key (`publish --key`).
    #[command(subcommand)]
    Key(KeyCmd),
    /// Counts per state, pause flag, head age and upcoming due times of a queue.
    Stats(QueueArgs),
    /// How many jobs of a queue are ready.
    Size(QueueArgs),
    /// Pause a queue: consumers get nothing from it until it is resumed (publishing goes on).
    Pause(QueueArgs),
    /// Resume a paused queue.
    Resume(QueueArgs),
    /// Delete a queue's ready jobs (with `--all`, every job of it) for good.
    Destroy {
        #[command(flatten)]
        queue: QueueArgs,
        /// Every job of the queue, delayed, reserved and dead too, not just the ready ones.
        #[arg(long)]
        all: bool,
        /// Confirm: the jobs cannot be recovered.
        #[arg(long, required = true)]
        yes: bool,
    },
    /// Every queue with its counts, sorted by namespace and queue.
    Queues {
        /// Only this namespace's queues.
        #[arg(long)]
        namespace: Option<String>,
        /// At most this many queues (server default 1000).
        #[arg(long)]
        limit: Option<u32>,
    },
    /// A queue's dead letter.
    #[command(subcommand)]
    Deadletter(DeadCmd),
    /// A queue's webhook: push delivery of its due jobs.
    #[command(subcommand)]
    Webhook(WebhookCmd),
    /// A queue's schedules: recurring jobs.
    #[command(subcommand)]
    Schedule(ScheduleCmd),
    /// Backups of the cluster's state (restore them with `delayd restore`).
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
    /// Print a shell completion script, e.g. `delayctl completions bash >
    /// /etc/bash_completion.d/delayctl`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page, or with `--out` write one page per command into a directory.
    Man {
        /// Write `delayctl.1` and a `delayctl-<command>.1` per command into this directory
        /// (created if missing) instead of printing the main page.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
}

/// A queue: namespace and queue name.
#[derive(Args)]
pub struct QueueArgs {
    /// Namespace.
    pub ns: String,
    /// Queue.
    pub queue: String,
}

/// A job: namespace, queue and job id.
#[derive(Args)]
pub struct JobArgs {
    /// Namespace.
    pub ns: String,
    /// Queue.
    pub queue: String,
    /// Job id.
    pub job_id: String,
}

/// `snapshot ...`.
#[derive(Subcommand)]
pub enum SnapshotCmd {
    /// Save a consistent snapshot of the state, taken on the leader, to FILE (written aside,
    /// verified, then renamed); prints its applied index, size and checksum.
    Save {
        /// Where to write it; an existing file is replaced only once the new one is verified.
        file: PathBuf,
        /// Also have the leader report the state's digest (as `cluster digest` computes it)
        /// from the same view: one more pass over its data.
        #[arg(long)]
        digest: bool,
    },
}

/// `cluster ...`.
#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Members, leader, term and per-node progress.
    Status,
    /// Add a node as a learner (start it with `delayd --join`).
    Add {
        /// Raft node id (≥ 1).
        id: u64,
        /// The node's gRPC address, host:port.
        grpc_addr: String,
    },
    /// Promote a learner to voter.
    Promote {
        /// Raft node id.
        id: u64,
    },
    /// Remove a node (voter or learner, the leader too).
    Remove {
        /// Raft node id.
        id: u64,
    },
    /// Hand leadership to a voter (without `--to`, the most caught-up one that has answered
    /// the leader lately), e.g. before taking the leader down for maintenance.
    Transfer {
        /// The voter that should lead.
        #[arg(long)]
        to: Option<u64>,
    },
    /// Build a snapshot of the answering node's state now.
    Snapshot,
    /// The answering node's applied index and state digest.
    Digest,
}

/// `token ...`.
#[derive(Subcommand)]
pub enum TokenCmd {
    /// Create a token for a namespace; prints the token.
    Create {
        /// Namespace.
        ns: String,
        /// What the token is for.
        #[arg(long)]
        description: Option<String>,
        /// Read requests per second allowed with this token.
        #[arg(long)]
        read_limit: Option<u64>,
        /// Write requests per second allowed with this token.
        #[arg(long)]
        write_limit: Option<u64>,
    },
    /// List a namespace's tokens.
    List {
        /// Namespace.
        ns: String,
    },
    /// Delete a token.
    Delete {
        /// Namespace.
        ns: String,
        /// The token to delete. (Not named `token`: clap would then confuse it with the
        /// global `--token` credential and send it as the credential.)
        #[arg(value_name = "TOKEN")]
        revoke: String,
    },
}

/// When a job comes due: after a delay or at a time, at most one of them.
#[derive(Args)]
#[command(group = clap::ArgGroup::new("due").multiple(false))]
pub struct DueArgs {
    /// Delay before the job is due: plain seconds, or a duration such as `90s`, `5m`,
    /// `1h30m`.
    #[arg(long, group = "due", value_name = "DURATION", value_parser = seconds_as_ms)]
    pub delay: Option<u64>,
    /// Delay in milliseconds (or a duration with units).
    #[arg(long, group = "due", value_name = "MS", value_parser = millis)]
    pub delay_ms: Option<u64>,
    /// When the job is due: unix milliseconds or an RFC 3339 time
    /// (`2026-01-01T09:00:00Z`).
    #[arg(long, group = "due", value_name = "TIME", value_parser = time::parse_instant_ms)]
    pub at: Option<u64>,
}

impl DueArgs {
    /// The delay in milliseconds, whichever flag gave it.
    pub fn delay_ms(&self) -> Option<u64> {
        self.delay.or(self.delay_ms)
    }
}

/// What a new job is, besides its body and key: publish, republish and bulk take these.
#[derive(Args)]
pub struct JobOptions {
    #[command(flatten)]
    pub due: DueArgs,
    /// Time from publish until the job expires: plain seconds or a duration (0: never).
    #[arg(long, value_name = "DURATION", value_parser = time::parse_whole_seconds)]
    pub ttl: Option<u64>,
    /// Maximum deliveries.
    #[arg(long)]
    pub tries: Option<u32>,
    /// Default time-to-run of a reservation: plain seconds or a duration.
    #[arg(long, value_name = "DURATION", value_parser = time::parse_whole_seconds)]
    pub ttr: Option<u64>,
    /// 0 is most urgent (default 1024).
    #[arg(long)]
    pub priority: Option<u32>,
    /// An attribute `name=value` (repeatable), sent as a `Job-Attr-{name}` header.
    #[arg(long = "attr", value_name = "NAME=VALUE", value_parser = parse_attr)]
    pub attrs: Vec<(String, String)>,
}

/// `publish`.
#[derive(Args)]
pub struct Publish {
    #[command(flatten)]
    pub queue: QueueArgs,
    /// The body; read from stdin when absent or `-`.
    pub body: Option<String>,
    #[command(flatten)]
    pub options: JobOptions,
    /// Idempotency key: publishing a live key again returns the existing job.
    #[arg(long)]
    pub key: Option<String>,
}

/// `republish`.
#[derive(Args)]
pub struct Republish {
    #[command(flatten)]
    pub job: JobArgs,
    /// The new job's body; read from stdin when absent or `-`.
    pub body: Option<String>,
    #[command(flatten)]
    pub options: JobOptions,
    /// The new job's idempotency key. A live job of another id holding it wins: nothing is
    /// replaced and its id is printed.
    #[arg(long)]
    pub key: Option<String>,
}

/// `bulk`.
#[derive(Args)]
pub struct Bulk {
    #[command(flatten)]
    pub queue: QueueArgs,
    /// A file holding a JSON array whose elements' JSON texts are the bodies (lmstfy's bulk
    /// format: `["a", {"b": 1}]` makes the bodies `"a"` and `{"b": 1}`); stdin when absent
    /// or `-`.
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub options: JobOptions,
}

/// `consume`.
#[derive(Args)]
pub struct Consume {
    /// Namespace.
    pub ns: String,
    /// Queues, comma-separated, most important first.
    pub queues: String,
    /// Time-to-run of the reservation: plain seconds or a duration (default: the job's own).
    #[arg(long, value_name = "DURATION", value_parser = seconds_as_ms)]
    pub ttr: Option<u64>,
    /// Wait up to this long for a job (long poll, ≤ 600 s): plain seconds or a duration.
    #[arg(long, value_name = "DURATION", value_parser = time::parse_whole_seconds)]
    pub timeout: Option<u64>,
    /// Reserve up to this many jobs (≤ 100).
    #[arg(long)]
    pub count: Option<u32>,
}

/// `release`.
#[derive(Args)]
pub struct Release {
    #[command(flatten)]
    pub job: JobArgs,
    /// Only if this is still the current lease (from consume).
    #[arg(long)]
    pub lease: Option<String>,
    /// Ready again after this delay (default: now): plain seconds or a duration.
    #[arg(long, value_name = "DURATION", value_parser = seconds_as_ms)]
    pub delay: Option<u64>,
    /// The delay in milliseconds (or a duration with units).
    #[arg(long, value_name = "MS", value_parser = millis, conflicts_with = "delay")]
    pub delay_ms: Option<u64>,
    /// A new priority (0 is most urgent).
    #[arg(long)]
    pub priority: Option<u32>,
}

/// `touch`.
#[derive(Args)]
pub struct Touch {
    #[command(flatten)]
    pub job: JobArgs,
    /// Only if this is still the current lease (from consume).
    #[arg(long)]
    pub lease: Option<String>,
    /// The new time-to-run from now: plain seconds or a duration (default: the
    /// reservation's).
    #[arg(long, value_name = "DURATION", value_parser = seconds_as_ms)]
    pub ttr: Option<u64>,
}

/// `update`: at least one change.
#[derive(Args)]
#[command(group = clap::ArgGroup::new("change")
    .required(true)
    .multiple(true)
    .args(["body", "delay", "delay_ms", "at", "priority"]))]
pub struct Update {
    #[command(flatten)]
    pub job: JobArgs,
    /// A new body; `-` reads it from stdin. Without it the body stays.
    pub body: Option<String>,
    #[command(flatten)]
    pub due: DueArgs,
    /// A new priority (0 is most urgent).
    #[arg(long)]
    pub priority: Option<u32>,
}

/// `key ...`.
#[derive(Subcommand)]
pub enum KeyCmd {
    /// Show the live job holding a key.
    Show(KeyArgs),
    /// Delete the job holding a key, in whatever state it is.
    Cancel(KeyArgs),
}

/// A key of a queue.
#[derive(Args)]
pub struct KeyArgs {
    /// Namespace.
    pub ns: String,
    /// Queue.
    pub queue: String,
    /// The idempotency key.
    pub key: String,
}

/// `deadletter ...`.
#[derive(Subcommand)]
pub enum DeadCmd {
    /// The dead letter's size and the id of its oldest job.
    Head(QueueArgs),
    /// How many jobs the dead letter holds.
    Size(QueueArgs),
    /// Show dead jobs with their bodies.
    Peek {
        #[command(flatten)]
        queue: QueueArgs,
        /// At most this many jobs (server default 10, ≤ 1000).
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Put dead jobs back to ready (tries reset to 1).
    Respawn {
        #[command(flatten)]
        queue: QueueArgs,
        /// How many (server default 1).
        #[arg(long)]
        limit: Option<u32>,
        /// Their new ttl: plain seconds or a duration (server default 1 day; 0: never).
        #[arg(long, value_name = "DURATION", value_parser = time::parse_whole_seconds)]
        ttl: Option<u64>,
    },
    /// Delete dead jobs for good.
    Purge {
        #[command(flatten)]
        queue: QueueArgs,
        /// How many (server default 1).
        #[arg(long)]
        limit: Option<u32>,
    },
}

/// `webhook ...`.
#[derive(Subcommand)]
pub enum WebhookCmd {
    /// Set or replace a queue's webhook; prints it with its signing secret, shown only once.
    Set(WebhookSet),
    /// Show a queue's webhook (without its secret).
    Show(QueueArgs),
    /// Remove a queue's webhook: the queue is pull-only again.
    Delete(QueueArgs),
}

/// `webhook set`.
#[derive(Args)]
pub struct WebhookSet {
    #[command(flatten)]
    pub queue: QueueArgs,
    /// Where due jobs are POSTed: an http or https URL.
    pub url: String,
    /// Time limit of each POST in milliseconds or a duration (server default 10s, ≤ 60s).
    /// (Not `--timeout-ms`: that is the global per-request timeout of delayctl itself.)
    #[arg(long = "webhook-timeout-ms", value_name = "MS", value_parser = millis)]
    pub hook_timeout_ms: Option<u64>,
    /// POSTs in flight at once for this queue (server default 32, ≤ 1000).
    #[arg(long)]
    pub max_in_flight: Option<u64>,
    /// POSTs started per second (server default 0: no limit).
    #[arg(long)]
    pub rate_per_s: Option<u64>,
    /// Backoff before the first retry, in milliseconds or a duration (server default 1s).
    #[arg(long, value_name = "MS", value_parser = millis)]
    pub backoff_initial_ms: Option<u64>,
    /// Largest backoff between retries, in milliseconds or a duration (server default 5m).
    #[arg(long, value_name = "MS", value_parser = millis)]
    pub backoff_max_ms: Option<u64>,
    /// The signing secret, 16 to 256 visible ASCII characters (default: generated).
    #[arg(long)]
    pub secret: Option<String>,
}

/// `schedule ...`.
#[derive(Subcommand)]
pub enum ScheduleCmd {
    /// Create or replace a schedule; prints it with its next occurrence.
    Set(ScheduleSet),
    /// A queue's schedules with their timetables and next occurrences.
    List(QueueArgs),
    /// Show one schedule with the job it publishes.
    Show(ScheduleName),
    /// Delete a schedule (the jobs it already published stay).
    Delete(ScheduleName),
}

/// A schedule of a queue.
#[derive(Args)]
pub struct ScheduleName {
    /// Namespace.
    pub ns: String,
    /// Queue.
    pub queue: String,
    /// Schedule name.
    pub name: String,
}

/// `schedule set`.
#[derive(Args)]
#[command(group = clap::ArgGroup::new("timetable").required(true).multiple(false))]
pub struct ScheduleSet {
    /// Namespace.
    pub ns: String,
    /// Queue.
    pub queue: String,
    /// Schedule name (A-Z a-z 0-9 - _).
    pub name: String,
    /// A cron expression, 6 fields with seconds first (a 7th is the year), e.g.
    /// `0 30 9 * * Mon-Fri`.
    #[arg(long, group = "timetable", value_name = "EXPR")]
    pub cron: Option<String>,
    /// The time zone the cron expression is read in, an IANA name (default UTC).
    #[arg(long, conflicts_with = "every_ms", value_name = "ZONE")]
    pub tz: Option<String>,
    /// A job every this many milliseconds (≥ 100) or this duration (`5m`), counted from the
    /// start.
    #[arg(long, group = "timetable", value_name = "MS", value_parser = millis)]
    pub every_ms: Option<u64>,
    /// The jobs' body, as text (default: empty).
    #[arg(long, value_name = "TEXT")]
    pub data: Option<String>,
    /// Time from each occurrence until its job expires: plain seconds or a duration (0:
    /// never; default a day).
    #[arg(long, value_name = "DURATION", value_parser = whole_seconds_u32)]
    pub ttl: Option<u32>,
    /// Maximum deliveries of each job (default 1).
    #[arg(long)]
    pub tries: Option<u16>,
    /// Default time-to-run of a reservation: plain seconds or a duration.
    #[arg(long, value_name = "DURATION", value_parser = whole_seconds_u32)]
    pub ttr: Option<u32>,
    /// 0 is most urgent (default 1024).
    #[arg(long)]
    pub priority: Option<u32>,
    /// An attribute `name=value` of the jobs (repeatable).
    #[arg(long = "attr", value_name = "NAME=VALUE", value_parser = parse_attr)]
    pub attrs: Vec<(String, String)>,
    /// No occurrence before this time, unix milliseconds or RFC 3339 (default: now).
    #[arg(long, value_name = "TIME", value_parser = time::parse_instant_ms)]
    pub start_at_ms: Option<u64>,
    /// No occurrence after this time, unix milliseconds or RFC 3339 (default: none).
    #[arg(long, value_name = "TIME", value_parser = time::parse_instant_ms)]
    pub end_at_ms: Option<u64>,
    /// Occurrences missed by more than a period (an outage): publish the latest (default),
    /// none or all of them.
    #[arg(long, value_parser = ["latest", "none", "all"])]
    pub catch_up: Option<String>,
}

/// A duration flag whose plain number is seconds, as milliseconds.
fn seconds_as_ms(s: &str) -> Result<u64, String> {
    time::parse_duration_ms(s, Unit::Seconds)
}

/// A duration flag whose plain number is milliseconds, as milliseconds.
fn millis(s: &str) -> Result<u64, String> {
    time::parse_duration_ms(s, Unit::Millis)
}

/// Like [`millis`], but at least 1 ms.
fn positive_ms(s: &str) -> Result<u64, String> {
    match millis(s)? {
        0 => Err("must be at least 1 ms".to_string()),
        ms => Ok(ms),
    }
}

/// A whole number of seconds that fits the schedule API's 32 bits.
fn whole_seconds_u32(s: &str) -> Result<u32, String> {
    let secs = time::parse_whole_seconds(s)?;
    u32::try_from(secs).map_err(|_| format!("{s:?} is too long (at most {} s)", u32::MAX))
}

/// `--attr NAME=VALUE`, checked here so that a name or value no header can carry is a usage
/// error rather than a failed request.
pub fn parse_attr(s: &str) -> Result<(String, String), String> {
    let (name, value) =
        s.split_once('=').ok_or_else(|| format!("expected NAME=VALUE, got {s:?}"))?;
    let header = format!("Job-Attr-{name}");
    if name.is_empty() || reqwest::header::HeaderName::from_bytes(header.as_bytes()).is_err() {
        return Err(format!("invalid attribute name {name:?}"));
    }
    // What the server accepts: a header value that is visible ASCII.
    let value_ok = reqwest::header::HeaderValue::from_str(value).is_ok_and(|v| v.to_str().is_ok());
    if !value_ok {
        return Err(format!("attribute {name}: the value must be visible ASCII"));
    }
    Ok((name.to_string(), value.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Result;
    use clap::error::ErrorKind;
    use clap::CommandFactory;

    #[test]
    fn the_cli_is_consistent() {
        Cli::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("delayctl").chain(args.iter().copied()))
    }

    fn kind(args: &[&str]) -> Option<ErrorKind> {
        parse(args).err().map(|e| e.kind())
    }

    #[test]
    fn addresses_split_on_commas_and_default_scheme() -> Result<()> {
        let cli = parse(&["--addr", "127.0.0.1:1,http://h:2/", "queues"])?;
        let addrs: Vec<&str> = cli.global.addr.iter().map(Url::as_str).collect();
        assert_eq!(addrs, ["http://127.0.0.1:1/", "http://h:2/"]);
        assert!(parse(&["--addr", "ftp://x", "queues"]).is_err());
        Ok(())
    }

    #[test]
    fn publish_options() -> Result<()> {
        let cli = parse(&["publish", "ns", "q", "hi", "--attr", "trace=a=b", "--delay", "3"])?;
        let Command::Publish(p) = cli.command else { anyhow::bail!("not a publish") };
        assert_eq!(p.options.attrs, [("trace".to_string(), "a=b".to_string())]);
        assert_eq!((p.options.due.delay_ms(), p.body.as_deref()), (Some(3_000), Some("hi")));
        assert_eq!((p.queue.ns.as_str(), p.queue.queue.as_str()), ("ns", "q"));
        assert_eq!(
            kind(&["publish", "ns", "q", "--delay", "3", "--at", "5"]),
            Some(ErrorKind::ArgumentConflict)
        );
        assert_eq!(
            kind(&["publish", "ns", "q", "--delay", "3", "--delay-ms", "5"]),
            Some(ErrorKind::ArgumentConflict)
        );
        for bad in ["=x", "no-equals", "a b=c", "a=\u{e9}"] {
            assert!(parse(&["publish", "ns", "q", "--attr", bad]).is_err(), "{bad}");
        }
        Ok(())
    }

    /// Plain numbers keep the unit the flag always had; durations with units and RFC 3339
    /// times are read too, and a bad one is a usage error naming the flag.
    #[test]
    fn time_flags_take_numbers_durations_and_dates() -> Result<()> {
        let publish = |extra: &[&str]| -> Result<JobOptions> {
            let cli = parse(&[&["publish", "ns", "q", "x"][..], extra].concat())?;
            let Command::Publish(p) = cli.command else { anyhow::bail!("not a publish") };
            Ok(p.options)
        };
        assert_eq!(publish(&["--delay", "90s"])?.due.delay_ms(), Some(90_000));
        assert_eq!(publish(&["--delay", "1h30m"])?.due.delay_ms(), Some(5_400_000));
        assert_eq!(publish(&["--delay-ms", "250"])?.due.delay_ms(), Some(250));
        assert_eq!(publish(&["--delay-ms", "2s"])?.due.delay_ms(), Some(2_000));
        assert_eq!(publish(&["--at", "2026-01-01T00:00:00Z"])?.due.at, Some(1_767_225_600_000));
        assert_eq!(publish(&["--at", "1767225600000"])?.due.at, Some(1_767_225_600_000));
        let o = publish(&["--ttl", "1d", "--ttr", "30"])?;
        assert_eq!((o.ttl, o.ttr), (Some(86_400), Some(30)));
        for bad in [&["--delay", "5x"][..], &["--ttl", "1500ms"], &["--at", "tomorrow"]] {
            let args = [&["publish", "ns", "q", "x"][..], bad].concat();
            let e = parse(&args).err().map(|e| (e.kind(), e.to_string()));
            let Some((ErrorKind::ValueValidation, text)) = e else {
                anyhow::bail!("{bad:?} was not refused as a bad value: {e:?}")
            };
            assert!(text.contains(bad[0]), "the error names the flag: {text}");
        }
        let cli = parse(&["consume", "ns", "q", "--ttr", "2m", "--timeout", "1m"])?;
        let Command::Consume(c) = cli.command else { anyhow::bail!("not a consume") };
        assert_eq!((c.ttr, c.timeout), (Some(120_000), Some(60)));
        let cli = parse(&["--timeout-ms", "30s", "queues"])?;
        assert_eq!(cli.global.timeout_ms, 30_000);
        assert_eq!(kind(&["--timeout-ms", "0", "queues"]), Some(ErrorKind::ValueValidation));
        let cli = parse(&["schedule", "set", "ns", "q", "s", "--every-ms", "5m", "--ttl", "2h"])?;
        let Command::Schedule(ScheduleCmd::Set(sc)) = cli.command else {
            anyhow::bail!("not a schedule set")
        };
        assert_eq!((sc.every_ms, sc.ttl), (Some(300_000), Some(7_200)));
        Ok(())
    }

    #[test]
    fn job_commands() -> Result<()> {
        let cli = parse(&["release", "ns", "q", "01J", "--delay", "5m", "--lease", "ab"])?;
        let Command::Release(r) = cli.command else { anyhow::bail!("not a release") };
        assert_eq!(
            (r.delay, r.lease.as_deref(), r.job.job_id.as_str()),
            (Some(300_000), Some("ab"), "01J")
        );
        assert_eq!(
            kind(&["release", "ns", "q", "id", "--delay", "1", "--delay-ms", "1"]),
            Some(ErrorKind::ArgumentConflict)
        );
        let cli = parse(&["touch", "ns", "q", "id", "--ttr", "90"])?;
        let Command::Touch(t) = cli.command else { anyhow::bail!("not a touch") };
        assert_eq!(t.ttr, Some(90_000));
        // An update must change something.
        assert_eq!(kind(&["update", "ns", "q", "id"]), Some(ErrorKind::MissingRequiredArgument));
        let cli = parse(&["update", "ns", "q", "id", "--priority", "3"])?;
        let Command::Update(u) = cli.command else { anyhow::bail!("not an update") };
        assert_eq!((u.priority, u.body), (Some(3), None));
        let cli = parse(&["update", "ns", "q", "id", "new body", "--at", "5"])?;
        let Command::Update(u) = cli.command else { anyhow::bail!("not an update") };
        assert_eq!((u.body.as_deref(), u.due.at), (Some("new body"), Some(5)));
        // Destroying needs --yes.
        assert_eq!(kind(&["destroy", "ns", "q"]), Some(ErrorKind::MissingRequiredArgument));
        assert!(parse(&["destroy", "ns", "q", "--all", "--yes"]).is_ok());
        assert_eq!(kind(&["key", "show", "ns", "q"]), Some(ErrorKind::MissingRequiredArgument));
        Ok(())
    }

    /// Found at merge: a positional named `token` shared clap's id with the global
    /// `--token`, so `token delete ns T` sent T as the credential (403).
    #[test]
    fn deleting_a_token_keeps_the_credential_apart() -> Result<()> {
        let cli = parse(&["--token", "admin", "token", "delete", "ns", "victim"])?;
        assert_eq!(cli.global.token.as_deref(), Some("admin"));
        let Command::Token(TokenCmd::Delete { revoke, .. }) = cli.command else {
            anyhow::bail!("not a token delete")
        };
        assert_eq!(revoke, "victim");
        Ok(())
    }

    #[test]
    fn schedule_timetables() -> Result<()> {
        let cli = parse(&["schedule", "set", "ns", "q", "s", "--cron", "0 * * * * *"])?;
        let Command::Schedule(ScheduleCmd::Set(sc)) = cli.command else {
            anyhow::bail!("not a schedule set")
        };
        assert_eq!(sc.cron.as_deref(), Some("0 * * * * *"));
        let base = ["schedule", "set", "ns", "q", "s"];
        assert_eq!(kind(&base), Some(ErrorKind::MissingRequiredArgument));
        let both = [&base[..], &["--cron", "* * * * * *", "--every-ms", "1000"]].concat();
        assert_eq!(kind(&both), Some(ErrorKind::ArgumentConflict));
        let tz_every = [&base[..], &["--every-ms", "1000", "--tz", "UTC"]].concat();
        assert_eq!(kind(&tz_every), Some(ErrorKind::ArgumentConflict));
        let catch_up = [&base[..], &["--every-ms", "1000", "--catch-up", "some"]].concat();
        assert_eq!(kind(&catch_up), Some(ErrorKind::InvalidValue));
        Ok(())
    }

    /// The webhook's own time limit must not take the global `--timeout-ms`.
    #[test]
    fn webhook_timeout_is_not_the_request_timeout() -> Result<()> {
        let args = ["webhook", "set", "ns", "q", "http://h/x", "--webhook-timeout-ms", "500"];
        let cli = parse(&[&args[..], &["--timeout-ms", "50"]].concat())?;
        assert_eq!(cli.global.timeout_ms, 50);
        let Command::Webhook(WebhookCmd::Set(w)) = cli.command else {
            anyhow::bail!("not a webhook set")
        };
        assert_eq!(w.hook_timeout_ms, Some(500));
        Ok(())
    }

    #[test]
    fn global_options_go_anywhere() -> Result<()> {
        let cli = parse(&["cluster", "status", "--json", "--timeout-ms", "50"])?;
        assert!(cli.global.json);
        assert_eq!(cli.global.timeout_ms, 50);
        Ok(())
    }

    #[test]
    fn the_version_names_the_revision() {
        let v = Cli::command().render_version();
        let sha = v.trim().rsplit_once(" (").and_then(|(_, rest)| rest.strip_suffix(')'));
        let ok = sha.is_some_and(|s| {
            s == "unknown" || (s.len() == 12 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        });
        assert!(v.starts_with(concat!("delayctl ", env!("CARGO_PKG_VERSION"), " (")) && ok, "{v}");
    }
}
