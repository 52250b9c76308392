//! `delayctl`: the operator CLI for delayd.
//!
//! It speaks delayd's HTTP API only, so it works against any node (followers forward writes
//! to the leader) and needs nothing but an address. Each command is one request; its answer
//! is printed as a table or as `key  value` lines, or with `--json` as the server's JSON.
//!
//! Exit codes: 0 success, 1 any error (an HTTP error status, no node reachable), 2 bad usage
//! (clap), 3 `consume` found nothing to consume — not a failure, but scripts must be able to
//! tell it from a job.

mod backup;
mod http;
mod render;

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use base64::Engine;
use clap::{Args, Parser, Subcommand};
use reqwest::{Method, StatusCode, Url};
use serde_json::{json, Value};

use crate::http::{Call, Client};

/// Exit code of `consume` when no job was available.
const EXIT_NOTHING_TO_CONSUME: u8 = 3;

/// `delayctl --version`: the version and the git revision it was built from (`build.rs`).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("DELAYCTL_GIT_SHA"), ")");

/// Operator CLI for delayd: cluster, tokens, jobs, dead letters, webhooks and schedules over
/// the HTTP API.
#[derive(Parser)]
#[command(
    name = "delayctl",
    version = VERSION,
    after_help = "Exit codes: 0 ok, 1 error, 2 usage, 3 nothing to consume."
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
#[command(next_help_heading = "Global options")]
struct Global {
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
    addr: Vec<Url>,
    /// Token sent as `Authorization: Bearer <token>`: the admin token or a namespace token.
    #[arg(long, global = true, env = "DELAYD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print the server's JSON (pretty) instead of tables.
    #[arg(long, global = true, env = "DELAYD_JSON", value_parser = clap::builder::FalseyValueParser::new())]
    json: bool,
    /// Per-request timeout in milliseconds (a consume's long poll is added to it).
    #[arg(
        long,
        global = true,
        env = "DELAYD_TIMEOUT_MS",
        default_value_t = 10_000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    timeout_ms: u64,
    /// PEM CA certificate(s) to verify `https://` nodes with, besides the system's roots.
    #[arg(long, global = true, env = "DELAYCTL_CA_FILE", value_name = "PEM")]
    ca_file: Option<std::path::PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Cluster status and membership.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// Namespace tokens.
    #[command(subcommand)]
    Token(TokenCmd),
    /// Publish a job; prints its id.
    Publish(Publish),
    /// Reserve jobs from one or more queues (in priority order).
    Consume {
        /// Namespace.
        ns: String,
        /// Queues, comma-separated, most important first.
        queues: String,
        /// Time-to-run of the reservation in seconds (default: the job's own).
        #[arg(long)]
        ttr: Option<u64>,
        /// Wait up to this many seconds for a job (long poll, ≤ 600).
        #[arg(long)]
        timeout: Option<u64>,
        /// Reserve up to this many jobs (≤ 100).
        #[arg(long)]
        count: Option<u32>,
    },
    /// Acknowledge (delete) a job.
    Ack {
        /// Namespace.
        ns: String,
        /// Queue.
        queue: String,
        /// Job id.
        job_id: String,
        /// Ack only if this is still the current lease (from consume).
        #[arg(long)]
        lease: Option<String>,
    },
    /// Show one job in any state, or the next ready job of a queue.
    Peek {
        /// Namespace.
        ns: String,
        /// Queue.
        queue: String,
        /// Job id; without it, the next ready job.
        job_id: Option<String>,
    },
    /// Counts per state, pause flag, head age and upcoming due times of a queue.
    Stats {
        /// Namespace.
        ns: String,
        /// Queue.
        queue: String,
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
}

#[derive(Subcommand)]
enum SnapshotCmd {
    /// Save a consistent snapshot of the state, taken on the leader, to FILE (written aside,
    /// verified, then renamed); prints its applied index, size and checksum.
    Save {
        /// Where to write it; an existing file is replaced only once the new one is verified.
        file: std::path::PathBuf,
        /// Also have the leader report the state's digest (as `cluster digest` computes it)
        /// from the same view: one more pass over its data.
        #[arg(long)]
        digest: bool,
    },
}

#[derive(Subcommand)]
enum ClusterCmd {
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
    /// Hand leadership to a voter (the most caught-up one without `--to`), e.g. before
    /// taking the leader down for maintenance.
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

#[derive(Subcommand)]
enum TokenCmd {
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

#[derive(Args)]
#[command(group = clap::ArgGroup::new("due").multiple(false))]
struct Publish {
    /// Namespace.
    ns: String,
    /// Queue.
    queue: String,
    /// The body; read from stdin when absent or `-`.
    body: Option<String>,
    /// Delay in milliseconds.
    #[arg(long, group = "due")]
    delay_ms: Option<u64>,
    /// Delay in seconds.
    #[arg(long, group = "due")]
    delay: Option<u64>,
    /// Absolute due time, unix milliseconds.
    #[arg(long, group = "due")]
    at: Option<u64>,
    /// Seconds from publish until the job expires (0: never).
    #[arg(long)]
    ttl: Option<u64>,
    /// Maximum deliveries.
    #[arg(long)]
    tries: Option<u32>,
    /// Default time-to-run of a reservation, in seconds.
    #[arg(long)]
    ttr: Option<u64>,
    /// 0 is most urgent (default 1024).
    #[arg(long)]
    priority: Option<u32>,
    /// Idempotency key: publishing a live key again returns the existing job.
    #[arg(long)]
    key: Option<String>,
    /// An attribute `name=value` (repeatable), sent as a `Job-Attr-{name}` header.
    #[arg(long = "attr", value_name = "NAME=VALUE", value_parser = parse_attr)]
    attrs: Vec<(String, String)>,
}

#[derive(Subcommand)]
enum DeadCmd {
    /// Show dead jobs with their bodies.
    Peek {
        /// Namespace.
        ns: String,
        /// Queue.
        queue: String,
        /// At most this many jobs (server default 10, ≤ 1000).
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Put dead jobs back to ready (tries reset to 1).
    Respawn {
        /// Namespace.
        ns: String,
        /// Queue.
        queue: String,
        /// How many (server default 1).
        #[arg(long)]
        limit: Option<u32>,
        /// Their new ttl in seconds (server default 86400; 0: never).
        #[arg(long)]
        ttl: Option<u64>,
    },
    /// Delete dead jobs for good.
    Purge {
        /// Namespace.
        ns: String,
        /// Queue.
        queue: String,
        /// How many (server default 1).
        #[arg(long)]
        limit: Option<u32>,
    },
}

#[derive(Subcommand)]
enum WebhookCmd {
    /// Set or replace a queue's webhook; prints it with its signing secret, shown only once.
    Set(WebhookSet),
    /// Show a queue's webhook (without its secret).
    Show {
        /// Namespace.
        ns: String,
        /// Queue.
        queue: String,
    },
    /// Remove a queue's webhook: the queue is pull-only again.
    Delete {
        /// Namespace.
        ns: String,
        /// Queue.
        queue: String,
    },
}

#[derive(Args)]
struct WebhookSet {
    /// Namespace.
    ns: String,
    /// Queue.
    queue: String,
    /// Where due jobs are POSTed: an http or https URL.
    url: String,
    /// Time limit of each POST in milliseconds (server default 10000, ≤ 60000). (Not
    /// `--timeout-ms`: that is the global per-request timeout of delayctl itself.)
    #[arg(long = "webhook-timeout-ms", value_name = "N")]
    hook_timeout_ms: Option<u64>,
    /// POSTs in flight at once for this queue (server default 32, ≤ 1000).
    #[arg(long)]
    max_in_flight: Option<u64>,
    /// POSTs started per second (server default 0: no limit).
    #[arg(long)]
    rate_per_s: Option<u64>,
    /// Backoff before the first retry, in milliseconds (server default 1000).
    #[arg(long)]
    backoff_initial_ms: Option<u64>,
    /// Largest backoff between retries, in milliseconds (server default 300000).
    #[arg(long)]
    backoff_max_ms: Option<u64>,
    /// The signing secret, 16 to 256 visible ASCII characters (default: generated).
    #[arg(long)]
    secret: Option<String>,
}

#[derive(Subcommand)]
enum ScheduleCmd {
    /// Create or replace a schedule; prints it with its next occurrence.
    Set(ScheduleSet),
    /// A queue's schedules with their timetables and next occurrences.
    List {
        /// Namespace.
        ns: String,
        /// Queue.
        queue: String,
    },
    /// Show one schedule with the job it publishes.
    Show {
        /// Namespace.
        ns: String,
        /// Queue.
        queue: String,
        /// Schedule name.
        name: String,
    },
    /// Delete a schedule (the jobs it already published stay).
    Delete {
        /// Namespace.
        ns: String,
        /// Queue.
        queue: String,
        /// Schedule name.
        name: String,
    },
}

#[derive(Args)]
#[command(group = clap::ArgGroup::new("timetable").required(true).multiple(false))]
struct ScheduleSet {
    /// Namespace.
    ns: String,
    /// Queue.
    queue: String,
    /// Schedule name (A-Z a-z 0-9 - _).
    name: String,
    /// A cron expression, 6 fields with seconds first (a 7th is the year), e.g.
    /// `0 30 9 * * Mon-Fri`.
    #[arg(long, group = "timetable", value_name = "EXPR")]
    cron: Option<String>,
    /// The time zone the cron expression is read in, an IANA name (default UTC).
    #[arg(long, conflicts_with = "every_ms", value_name = "ZONE")]
    tz: Option<String>,
    /// A job every this many milliseconds (≥ 100), counted from the start.
    #[arg(long, group = "timetable", value_name = "N")]
    every_ms: Option<u64>,
    /// The jobs' body, as text (default: empty).
    #[arg(long, value_name = "TEXT")]
    data: Option<String>,
    /// Seconds from each occurrence until its job expires (0: never; default a day).
    #[arg(long)]
    ttl: Option<u32>,
    /// Maximum deliveries of each job (default 1).
    #[arg(long)]
    tries: Option<u16>,
    /// Default time-to-run of a reservation, in seconds.
    #[arg(long)]
    ttr: Option<u32>,
    /// 0 is most urgent (default 1024).
    #[arg(long)]
    priority: Option<u32>,
    /// An attribute `name=value` of the jobs (repeatable).
    #[arg(long = "attr", value_name = "NAME=VALUE", value_parser = parse_attr)]
    attrs: Vec<(String, String)>,
    /// No occurrence before this time, unix milliseconds (default: now).
    #[arg(long, value_name = "MS")]
    start_at_ms: Option<u64>,
    /// No occurrence after this time, unix milliseconds (default: none).
    #[arg(long, value_name = "MS")]
    end_at_ms: Option<u64>,
    /// Occurrences missed by more than a period (an outage): publish the latest (default),
    /// none or all of them.
    #[arg(long, value_parser = ["latest", "none", "all"])]
    catch_up: Option<String>,
}

/// `--attr NAME=VALUE`, checked here so that a name or value no header can carry is a usage
/// error rather than a failed request.
fn parse_attr(s: &str) -> Result<(String, String), String> {
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

/// What a command prints: the answer's JSON (for `--json`), or its human form and a note
/// for stderr; and the exit code.
struct Output {
    json: Value,
    human: String,
    note: Option<String>,
    code: u8,
}

impl Output {
    fn new(json: Value, human: String) -> Output {
        Output { json, human, note: None, code: 0 }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<u8> {
    let g = cli.global;
    let client =
        Client::new(g.addr, g.token, Duration::from_millis(g.timeout_ms), g.ca_file.as_deref())?;
    let out = execute(&client, cli.command).await?;
    let mut stdout = std::io::stdout().lock();
    if g.json {
        let text = serde_json::to_string_pretty(&out.json)?;
        writeln!(stdout, "{text}")?;
    } else {
        // Notes go to stderr so that stdout holds only what scripts capture (an id, a token).
        if let Some(note) = &out.note {
            eprintln!("{note}");
        }
        write!(stdout, "{}", out.human)?;
    }
    stdout.flush()?;
    Ok(out.code)
}

/// An answer with no body (204) as JSON: an empty object, so `--json` always prints one
/// document.
fn or_empty(v: Value) -> Value {
    if v.is_null() {
        json!({})
    } else {
        v
    }
}

fn line(s: impl std::fmt::Display) -> String {
    format!("{s}\n")
}

async fn execute(client: &Client, command: Command) -> Result<Output> {
    let get = |segments: &[&str]| Call::new(Method::GET, segments);
    Ok(match command {
        Command::Cluster(c) => return cluster(client, c).await,
        Command::Token(t) => return token(client, t).await,
        Command::Publish(p) => return publish(client, p).await,
        Command::Consume { ns, queues, ttr, timeout, count } => {
            let call = get(&["api", &ns, &queues])
                .param("ttr", ttr)
                .param("timeout", timeout)
                .param("count", count)
                .wait(Duration::from_secs(timeout.unwrap_or(0)));
            let reply = client.send(call).await?;
            if reply.status == StatusCode::NOT_FOUND && reply.body["msg"] == "no job available" {
                let note = Some(http::message(&reply.body));
                let (human, code) = (String::new(), EXIT_NOTHING_TO_CONSUME);
                return Ok(Output { json: reply.body, human, note, code });
            }
            let v = reply.ok()?;
            let human = match &v {
                Value::Array(list) => render::jobs(list),
                one => render::job(one),
            };
            Output::new(v, human)
        }
        Command::Ack { ns, queue, job_id, lease } => {
            let call = Call::new(Method::DELETE, &["api", &ns, &queue, "job", &job_id])
                .param("lease", lease);
            let v = client.send(call).await?.ok()?;
            Output::new(or_empty(v), line(format!("acked {job_id}")))
        }
        Command::Peek { ns, queue, job_id } => {
            let call = match &job_id {
                Some(id) => get(&["api", &ns, &queue, "job", id]),
                None => get(&["api", &ns, &queue, "peek"]),
            };
            let v = client.send(call).await?.ok()?;
            let human = render::job(&v);
            Output::new(v, human)
        }
        Command::Stats { ns, queue } => {
            let v = client.send(get(&["api", &ns, &queue, "stats"])).await?.ok()?;
            let human = render::stats(&v);
            Output::new(v, human)
        }
        Command::Queues { namespace, limit } => {
            let call =
                get(&["admin", "queues"]).param("namespace", namespace).param("limit", limit);
            let v = client.send(call).await?.ok()?;
            let human = render::queues(&v);
            Output::new(v, human)
        }
        Command::Deadletter(d) => return deadletter(client, d).await,
        Command::Webhook(w) => return webhook(client, w).await,
        Command::Schedule(sc) => return schedule(client, sc).await,
        Command::Snapshot(SnapshotCmd::Save { file, digest }) => {
            let saved = backup::save(client, &file, digest).await?;
            let mut v = saved.headers;
            v["file"] = json!(saved.path.display().to_string());
            v["node"] = json!(saved.node);
            v["bytes"] = json!(saved.bytes);
            v["checksum"] = json!(format!("{:016x}", saved.checksum));
            let mut rows = vec![
                ("file", render::cell(&v["file"])),
                ("node", render::cell(&v["node"])),
                ("applied_index", render::cell(&v["applied_index"])),
                ("applied_term", render::cell(&v["applied_term"])),
                ("bytes", render::cell(&v["bytes"])),
                ("checksum", render::cell(&v["checksum"])),
            ];
            if digest {
                rows.push(("digest", render::cell(&v["digest"])));
                rows.push(("digest_entries", render::cell(&v["digest_entries"])));
            }
            let human = render::pairs(&rows);
            Output::new(v, human)
        }
    })
}

async fn cluster(client: &Client, command: ClusterCmd) -> Result<Output> {
    let members = |v: Value| {
        let human = line(format!("voters  {}", render::cell(&v["voters"])));
        Output::new(v, human)
    };
    Ok(match command {
        ClusterCmd::Status => {
            let v = client.send(Call::new(Method::GET, &["admin", "cluster"])).await?.ok()?;
            let human = render::cluster(&v);
            Output::new(v, human)
        }
        ClusterCmd::Add { id, grpc_addr } => {
            let call = Call::new(Method::POST, &["admin", "nodes"])
                .param("id", Some(id))
                .param("addr", Some(grpc_addr));
            members(client.send(call).await?.ok()?)
        }
        ClusterCmd::Promote { id } => {
            let call = Call::new(Method::POST, &["admin", "nodes", &id.to_string(), "promote"]);
            members(client.send(call).await?.ok()?)
        }
        ClusterCmd::Remove { id } => {
            let call = Call::new(Method::DELETE, &["admin", "nodes", &id.to_string()]);
            members(client.send(call).await?.ok()?)
        }
        ClusterCmd::Transfer { to } => {
            let call = Call::new(Method::POST, &["admin", "leader"]).param("to", to);
            let v = client.send(call).await?.ok()?;
            let human = line(format!("leader  {}", render::cell(&v["leader"])));
            Output::new(v, human)
        }
        ClusterCmd::Snapshot => {
            let v = client.send(Call::new(Method::POST, &["admin", "snapshot"])).await?.ok()?;
            let human = line(http::message(&v));
            Output::new(v, human)
        }
        ClusterCmd::Digest => {
            let v = client.send(Call::new(Method::GET, &["admin", "digest"])).await?.ok()?;
            let human = render::pairs(&[
                ("node_id", render::cell(&v["node_id"])),
                ("applied_index", render::cell(&v["applied_index"])),
                ("digest", render::cell(&v["digest"])),
                ("entries", render::cell(&v["entries"])),
            ]);
            Output::new(v, human)
        }
    })
}

async fn token(client: &Client, command: TokenCmd) -> Result<Output> {
    Ok(match command {
        TokenCmd::Create { ns, description, read_limit, write_limit } => {
            let call = Call::new(Method::POST, &["token", &ns])
                .param("description", description)
                .param("read_limit", read_limit)
                .param("write_limit", write_limit);
            let v = client.send(call).await?.ok()?;
            let token = v["token"].as_str().context("the answer has no token")?;
            let human = line(token);
            Output::new(v, human)
        }
        TokenCmd::List { ns } => {
            let v = client.send(Call::new(Method::GET, &["token", &ns])).await?.ok()?;
            let human = render::tokens(&v);
            Output::new(v, human)
        }
        TokenCmd::Delete { ns, revoke } => {
            let v = client.send(Call::new(Method::DELETE, &["token", &ns, &revoke])).await?.ok()?;
            Output::new(or_empty(v), line("deleted"))
        }
    })
}

async fn publish(client: &Client, p: Publish) -> Result<Output> {
    let body = match p.body.as_deref() {
        Some(text) if text != "-" => text.as_bytes().to_vec(),
        _ => {
            if std::io::stdin().is_terminal() {
                eprintln!("reading the body from stdin (end it with Ctrl-D)");
            }
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).context("cannot read the body from stdin")?;
            buf
        }
    };
    let mut call = Call::new(Method::PUT, &["api", &p.ns, &p.queue])
        .param("delay_ms", p.delay_ms)
        .param("delay", p.delay)
        .param("at", p.at)
        .param("ttl", p.ttl)
        .param("tries", p.tries)
        .param("ttr", p.ttr)
        .param("priority", p.priority)
        .param("key", p.key)
        .body(body);
    for (name, value) in p.attrs {
        call = call.header(format!("Job-Attr-{name}"), value);
    }
    let reply = client.send(call).await?;
    let existed = reply.status == StatusCode::OK && reply.body["msg"] == "exists";
    let v = reply.ok()?;
    let human = line(v["job_id"].as_str().context("the answer has no job_id")?);
    let note = existed.then(|| "exists: a live job already has this key".to_string());
    Ok(Output { note, ..Output::new(v, human) })
}

async fn deadletter(client: &Client, command: DeadCmd) -> Result<Output> {
    Ok(match command {
        DeadCmd::Peek { ns, queue, limit } => {
            let call = Call::new(Method::GET, &["api", &ns, &queue, "deadletter", "jobs"])
                .param("limit", limit);
            let v = client.send(call).await?.ok()?;
            let human = render::dead_jobs(&v);
            Output::new(v, human)
        }
        DeadCmd::Respawn { ns, queue, limit, ttl } => {
            let call = Call::new(Method::PUT, &["api", &ns, &queue, "deadletter"])
                .param("limit", limit)
                .param("ttl", ttl);
            let v = client.send(call).await?.ok()?;
            let human = line(format!("respawned {}", render::cell(&v["count"])));
            Output::new(v, human)
        }
        DeadCmd::Purge { ns, queue, limit } => {
            let call = Call::new(Method::DELETE, &["api", &ns, &queue, "deadletter"])
                .param("limit", limit);
            let v = client.send(call).await?.ok()?;
            Output::new(or_empty(v), line("purged"))
        }
    })
}

async fn webhook(client: &Client, command: WebhookCmd) -> Result<Output> {
    Ok(match command {
        WebhookCmd::Set(w) => {
            let body = json!({
                "url": w.url,
                "timeout_ms": w.hook_timeout_ms,
                "max_in_flight": w.max_in_flight,
                "rate_per_s": w.rate_per_s,
                "backoff_initial_ms": w.backoff_initial_ms,
                "backoff_max_ms": w.backoff_max_ms,
                "secret": w.secret,
            });
            let call = Call::new(Method::PUT, &["api", &w.ns, &w.queue, "webhook"]).json(body);
            let reply = client.send(call).await?;
            let replaced = reply.status == StatusCode::OK;
            let v = reply.ok()?;
            let human = render::webhook(&v);
            let note = format!(
                "{}the secret is shown only this once: store it now",
                if replaced { "replaced the queue's webhook; " } else { "" }
            );
            Output { note: Some(note), ..Output::new(v, human) }
        }
        WebhookCmd::Show { ns, queue } => {
            let v = client.send(Call::new(Method::GET, &["api", &ns, &queue, "webhook"])).await?;
            let v = v.ok()?;
            let human = render::webhook(&v);
            Output::new(v, human)
        }
        WebhookCmd::Delete { ns, queue } => {
            let call = Call::new(Method::DELETE, &["api", &ns, &queue, "webhook"]);
            let v = client.send(call).await?.ok()?;
            Output::new(or_empty(v), line("deleted"))
        }
    })
}

async fn schedule(client: &Client, command: ScheduleCmd) -> Result<Output> {
    Ok(match command {
        ScheduleCmd::Set(sc) => {
            let data = sc.data.map(|d| base64::engine::general_purpose::STANDARD.encode(d));
            let attributes: serde_json::Map<String, Value> =
                sc.attrs.into_iter().map(|(name, value)| (name, Value::from(value))).collect();
            let body = json!({
                "cron": sc.cron,
                "every_ms": sc.every_ms,
                "tz": sc.tz,
                "data": data,
                "ttl": sc.ttl,
                "tries": sc.tries,
                "ttr": sc.ttr,
                "priority": sc.priority,
                "attributes": attributes,
                "start_at_ms": sc.start_at_ms,
                "end_at_ms": sc.end_at_ms,
                "catch_up": sc.catch_up,
            });
            let segments = ["api", &sc.ns, &sc.queue, "schedules", &sc.name];
            let reply = client.send(Call::new(Method::PUT, &segments).json(body)).await?;
            let replaced = reply.status == StatusCode::OK;
            let v = reply.ok()?;
            let human = render::schedule(&v);
            let note = replaced.then(|| format!("replaced the schedule {}", sc.name));
            Output { note, ..Output::new(v, human) }
        }
        ScheduleCmd::List { ns, queue } => {
            let call = Call::new(Method::GET, &["api", &ns, &queue, "schedules"]);
            let v = client.send(call).await?.ok()?;
            let human = render::schedules(&v);
            Output::new(v, human)
        }
        ScheduleCmd::Show { ns, queue, name } => {
            let call = Call::new(Method::GET, &["api", &ns, &queue, "schedules", &name]);
            let v = client.send(call).await?.ok()?;
            let human = render::schedule(&v);
            Output::new(v, human)
        }
        ScheduleCmd::Delete { ns, queue, name } => {
            let call = Call::new(Method::DELETE, &["api", &ns, &queue, "schedules", &name]);
            let v = client.send(call).await?.ok()?;
            Output::new(or_empty(v), line("deleted"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_is_consistent() {
        Cli::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("delayctl").chain(args.iter().copied()))
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
        assert_eq!(p.attrs, [("trace".to_string(), "a=b".to_string())]);
        assert_eq!((p.delay, p.body.as_deref()), (Some(3), Some("hi")));
        let both = parse(&["publish", "ns", "q", "--delay", "3", "--at", "5"]);
        assert_eq!(both.err().map(|e| e.kind()), Some(clap::error::ErrorKind::ArgumentConflict));
        for bad in ["=x", "no-equals", "a b=c", "a=\u{e9}"] {
            assert!(parse(&["publish", "ns", "q", "--attr", bad]).is_err(), "{bad}");
        }
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
        let kind = |args: &[&str]| parse(args).err().map(|e| e.kind());
        let base = ["schedule", "set", "ns", "q", "s"];
        use clap::error::ErrorKind;
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
    fn the_version_names_the_revision() {
        let v = Cli::command().render_version();
        let sha = v.trim().rsplit_once(" (").and_then(|(_, rest)| rest.strip_suffix(')'));
        let ok = sha.is_some_and(|s| {
            s == "unknown" || (s.len() == 12 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        });
        assert!(v.starts_with(concat!("delayctl ", env!("CARGO_PKG_VERSION"), " (")) && ok, "{v}");
    }

    #[test]
    fn global_options_go_anywhere() -> Result<()> {
        let cli = parse(&["cluster", "status", "--json", "--timeout-ms", "50"])?;
        assert!(cli.global.json);
        assert_eq!(cli.global.timeout_ms, 50);
        Ok(())
    }
}
