//! `delayctl`: the operator CLI for delayd.
//!
//! It speaks delayd's HTTP API only, so it works against any node (followers forward writes
//! to the leader) and needs nothing but an address. Each command is one request; its answer
//! is printed as a table or as `key  value` lines, or with `--json` as the server's JSON.
//! Every action of the API has a command: `docs/delayctl.md` maps each route to its
//! command, and a test (`coverage.rs`) keeps that map complete.
//!
//! Exit codes: 0 success, 1 any error (an HTTP error status, no node reachable), 2 bad usage
//! (clap), 3 `consume` found nothing to consume — not a failure, but scripts must be able to
//! tell it from a job.

mod backup;
mod cli;
#[cfg(test)]
mod coverage;
mod http;
mod manual;
mod render;
mod time;

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use base64::Engine;
use clap::Parser;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::cli::{
    Bulk, Cli, ClusterCmd, Command, Consume, DeadCmd, JobArgs, JobOptions, KeyCmd, Publish,
    QueueArgs, Release, Republish, ScheduleCmd, SnapshotCmd, TokenCmd, Touch, Update, WebhookCmd,
};
use crate::http::{Call, Client};

/// Exit code of `consume` when no job was available.
const EXIT_NOTHING_TO_CONSUME: u8 = 3;

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
    // The commands that print something about delayctl itself need no node.
    match &cli.command {
        Command::Completions { shell } => {
            manual::completions(*shell, &mut std::io::stdout().lock())?;
            return Ok(0);
        }
        Command::Man { out: None } => {
            manual::man_page(&mut std::io::stdout().lock())?;
            return Ok(0);
        }
        Command::Man { out: Some(dir) } => {
            for written in manual::man_pages(dir)? {
                println!("{}", written.display());
            }
            return Ok(0);
        }
        _ => {}
    }
    let client =
        Client::new(g.addr, g.token, Duration::from_millis(g.timeout_ms), g.ca_file.as_deref())?;
    let out = execute(&client, cli.command, time::now_ms()).await?;
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

/// `/api/{ns}/{q}` followed by `rest`.
fn queue_path<'a>(q: &'a QueueArgs, rest: &[&'a str]) -> Vec<&'a str> {
    let mut segments = vec!["api", q.ns.as_str(), q.queue.as_str()];
    segments.extend_from_slice(rest);
    segments
}

/// `/api/{ns}/{q}/job/{id}` followed by `rest`.
fn job_path<'a>(j: &'a JobArgs, rest: &[&'a str]) -> Vec<&'a str> {
    let mut segments = vec!["api", j.ns.as_str(), j.queue.as_str(), "job", j.job_id.as_str()];
    segments.extend_from_slice(rest);
    segments
}

/// A command's answer that is one job, shown as one.
fn job_output(v: Value, now: i64) -> Output {
    let human = render::job(&v, now);
    Output::new(v, human)
}

/// Runs one command; `now` (unix ms) is what relative times in the human form count from.
async fn execute(client: &Client, command: Command, now: i64) -> Result<Output> {
    let get = |segments: &[&str]| Call::new(Method::GET, segments);
    Ok(match command {
        Command::Cluster(c) => return cluster(client, c).await,
        Command::Health => {
            let v = client.send(get(&["health"])).await?.ok()?;
            let human = render::health(&v);
            Output::new(v, human)
        }
        Command::Ready => {
            let v = client.send(get(&["ready"])).await?.ok()?;
            Output::new(v, line("ready"))
        }
        Command::Token(t) => return token(client, t, now).await,
        Command::Publish(p) => return publish(client, p).await,
        Command::Bulk(b) => return bulk(client, b).await,
        Command::Republish(r) => return republish(client, r).await,
        Command::Consume(c) => return consume(client, c, now).await,
        Command::Ack { job, lease } => {
            let call = Call::new(Method::DELETE, &job_path(&job, &[])).param("lease", lease);
            let v = client.send(call).await?.ok()?;
            Output::new(or_empty(v), line(format!("acked {}", job.job_id)))
        }
        Command::Release(r) => return release(client, r, now).await,
        Command::Touch(t) => return touch(client, t, now).await,
        Command::Bury { job, lease } => {
            let call = Call::new(Method::PUT, &job_path(&job, &["bury"])).param("lease", lease);
            job_output(client.send(call).await?.ok()?, now)
        }
        Command::Update(u) => return update(client, u, now).await,
        Command::Peek { queue, job_id } => {
            let call = match &job_id {
                Some(id) => get(&queue_path(&queue, &["job", id])),
                None => get(&queue_path(&queue, &["peek"])),
            };
            job_output(client.send(call).await?.ok()?, now)
        }
        Command::Key(KeyCmd::Show(k)) => {
            let call = get(&["api", &k.ns, &k.queue, "key", &k.key]);
            job_output(client.send(call).await?.ok()?, now)
        }
        Command::Key(KeyCmd::Cancel(k)) => {
            let call = Call::new(Method::DELETE, &["api", &k.ns, &k.queue, "key", &k.key]);
            let v = client.send(call).await?.ok()?;
            Output::new(or_empty(v), line(format!("cancelled the job holding key {:?}", k.key)))
        }
        Command::Stats(q) => {
            let v = client.send(get(&queue_path(&q, &["stats"]))).await?.ok()?;
            let human = render::stats(&v);
            Output::new(v, human)
        }
        Command::Size(q) => {
            let v = client.send(get(&queue_path(&q, &["size"]))).await?.ok()?;
            let human = line(render::cell(&v["size"]));
            Output::new(v, human)
        }
        Command::Pause(q) => {
            let call = Call::new(Method::PUT, &queue_path(&q, &["pause"]));
            let v = client.send(call).await?.ok()?;
            Output::new(or_empty(v), line(format!("paused {}/{}", q.ns, q.queue)))
        }
        Command::Resume(q) => {
            let call = Call::new(Method::DELETE, &queue_path(&q, &["pause"]));
            let v = client.send(call).await?.ok()?;
            Output::new(or_empty(v), line(format!("resumed {}/{}", q.ns, q.queue)))
        }
        Command::Destroy { queue, all, yes: _ } => {
            let call = Call::new(Method::DELETE, &queue_path(&queue, &[]))
                .param("all", all.then_some("true"));
            let v = client.send(call).await?.ok()?;
            let which = if all { "every job" } else { "the ready jobs" };
            Output::new(
                or_empty(v),
                line(format!("deleted {which} of {}/{}", queue.ns, queue.queue)),
            )
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
        Command::Schedule(sc) => return schedule(client, sc, now).await,
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
        Command::Completions { .. } | Command::Man { .. } => {
            anyhow::bail!("this command talks to no node")
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

async fn token(client: &Client, command: TokenCmd, now: i64) -> Result<Output> {
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
            let human = render::tokens(&v, now);
            Output::new(v, human)
        }
        TokenCmd::Delete { ns, revoke } => {
            let v = client.send(Call::new(Method::DELETE, &["token", &ns, &revoke])).await?.ok()?;
            Output::new(or_empty(v), line("deleted"))
        }
    })
}

/// A body given as an argument, or read from stdin when it is absent or `-`.
fn body_or_stdin(arg: Option<&str>) -> Result<Vec<u8>> {
    match arg {
        Some(text) if text != "-" => Ok(text.as_bytes().to_vec()),
        _ => {
            if std::io::stdin().is_terminal() {
                eprintln!("reading the body from stdin (end it with Ctrl-D)");
            }
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).context("cannot read the body from stdin")?;
            Ok(buf)
        }
    }
}

/// Adds a new job's options to `call`: query parameters and `Job-Attr-*` headers.
fn with_job_options(mut call: Call, o: JobOptions) -> Call {
    call = call
        .param("delay_ms", o.due.delay_ms())
        .param("at", o.due.at)
        .param("ttl", o.ttl)
        .param("tries", o.tries)
        .param("ttr", o.ttr)
        .param("priority", o.priority);
    for (name, value) in o.attrs {
        call = call.header(format!("Job-Attr-{name}"), value);
    }
    call
}

/// The answer of a publish or a republish: the job's id, and a note when its key named a
/// job that already existed.
async fn published(client: &Client, call: Call) -> Result<Output> {
    let reply = client.send(call).await?;
    let existed = reply.status == StatusCode::OK && reply.body["msg"] == "exists";
    let v = reply.ok()?;
    let human = line(v["job_id"].as_str().context("the answer has no job_id")?);
    let note = existed.then(|| "exists: a live job already has this key".to_string());
    Ok(Output { note, ..Output::new(v, human) })
}

async fn publish(client: &Client, p: Publish) -> Result<Output> {
    let body = body_or_stdin(p.body.as_deref())?;
    let call = Call::new(Method::PUT, &queue_path(&p.queue, &[])).param("key", p.key).body(body);
    published(client, with_job_options(call, p.options)).await
}

async fn republish(client: &Client, r: Republish) -> Result<Output> {
    let body = body_or_stdin(r.body.as_deref())?;
    let call = Call::new(Method::PUT, &job_path(&r.job, &[])).param("key", r.key).body(body);
    published(client, with_job_options(call, r.options)).await
}

async fn bulk(client: &Client, b: Bulk) -> Result<Output> {
    let data = match &b.file {
        Some(path) if path.as_os_str() != "-" => std::fs::read(path)
            .with_context(|| format!("cannot read the jobs from {}", path.display()))?,
        _ => body_or_stdin(None)?,
    };
    // Checked here too so that a file that is not a JSON array is named as such, before
    // anything is sent.
    let jobs: Value = serde_json::from_slice(&data).context("the jobs are not valid JSON")?;
    let Some(list) = jobs.as_array() else {
        anyhow::bail!("the jobs must be a JSON array (each element's JSON text is one body)");
    };
    anyhow::ensure!(!list.is_empty(), "the JSON array of jobs is empty");
    let call = Call::new(Method::PUT, &queue_path(&b.queue, &["bulk"]))
        .header("Content-Type".to_string(), "application/json".to_string())
        .body(data);
    let v = client.send(with_job_options(call, b.options)).await?.ok()?;
    let ids = v["job_ids"].as_array().context("the answer has no job_ids")?;
    let human: String = ids.iter().map(|id| line(render::cell(id))).collect();
    Ok(Output::new(v, human))
}

async fn consume(client: &Client, c: Consume, now: i64) -> Result<Output> {
    let call = Call::new(Method::GET, &["api", &c.ns, &c.queues])
        .param("ttr_ms", c.ttr)
        .param("timeout", c.timeout)
        .param("count", c.count)
        .wait(Duration::from_secs(c.timeout.unwrap_or(0)));
    let reply = client.send(call).await?;
    if reply.status == StatusCode::NOT_FOUND && reply.body["msg"] == "no job available" {
        let note = Some(http::message(&reply.body));
        let (human, code) = (String::new(), EXIT_NOTHING_TO_CONSUME);
        return Ok(Output { json: reply.body, human, note, code });
    }
    let v = reply.ok()?;
    let human = match &v {
        Value::Array(list) => render::jobs(list, now),
        one => render::job(one, now),
    };
    Ok(Output::new(v, human))
}

async fn release(client: &Client, r: Release, now: i64) -> Result<Output> {
    let call = Call::new(Method::PUT, &job_path(&r.job, &["release"]))
        .param("lease", r.lease)
        .param("delay_ms", r.delay.or(r.delay_ms))
        .param("priority", r.priority);
    Ok(job_output(client.send(call).await?.ok()?, now))
}

async fn touch(client: &Client, t: Touch, now: i64) -> Result<Output> {
    let call = Call::new(Method::PUT, &job_path(&t.job, &["touch"]))
        .param("lease", t.lease)
        .param("ttr_ms", t.ttr);
    Ok(job_output(client.send(call).await?.ok()?, now))
}

async fn update(client: &Client, u: Update, now: i64) -> Result<Output> {
    let mut call = Call::new(Method::PATCH, &job_path(&u.job, &[]))
        .param("delay_ms", u.due.delay_ms())
        .param("at", u.due.at)
        .param("priority", u.priority);
    if let Some(text) = u.body.as_deref() {
        let body = body_or_stdin(Some(text))?;
        // An empty body means "keep the body" to the server: say so rather than let an
        // update that asked for an empty body pass as done.
        anyhow::ensure!(!body.is_empty(), "a job's body cannot be changed to an empty one");
        call = call.body(body);
    }
    Ok(job_output(client.send(call).await?.ok()?, now))
}

async fn deadletter(client: &Client, command: DeadCmd) -> Result<Output> {
    Ok(match command {
        DeadCmd::Head(q) => {
            let v = client.send(Call::new(Method::GET, &queue_path(&q, &["deadletter"]))).await?;
            let v = v.ok()?;
            let human = render::dead_head(&v);
            Output::new(v, human)
        }
        DeadCmd::Size(q) => {
            let call = Call::new(Method::GET, &queue_path(&q, &["deadletter", "size"]));
            let v = client.send(call).await?.ok()?;
            let human = line(render::cell(&v["size"]));
            Output::new(v, human)
        }
        DeadCmd::Peek { queue, limit } => {
            let call = Call::new(Method::GET, &queue_path(&queue, &["deadletter", "jobs"]))
                .param("limit", limit);
            let v = client.send(call).await?.ok()?;
            let human = render::dead_jobs(&v);
            Output::new(v, human)
        }
        DeadCmd::Respawn { queue, limit, ttl } => {
            let call = Call::new(Method::PUT, &queue_path(&queue, &["deadletter"]))
                .param("limit", limit)
                .param("ttl", ttl);
            let v = client.send(call).await?.ok()?;
            let human = line(format!("respawned {}", render::cell(&v["count"])));
            Output::new(v, human)
        }
        DeadCmd::Purge { queue, limit } => {
            let call = Call::new(Method::DELETE, &queue_path(&queue, &["deadletter"]))
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
            let call = Call::new(Method::PUT, &queue_path(&w.queue, &["webhook"])).json(body);
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
        WebhookCmd::Show(q) => {
            let v = client.send(Call::new(Method::GET, &queue_path(&q, &["webhook"]))).await?;
            let v = v.ok()?;
            let human = render::webhook(&v);
            Output::new(v, human)
        }
        WebhookCmd::Delete(q) => {
            let call = Call::new(Method::DELETE, &queue_path(&q, &["webhook"]));
            let v = client.send(call).await?.ok()?;
            Output::new(or_empty(v), line("deleted"))
        }
    })
}

async fn schedule(client: &Client, command: ScheduleCmd, now: i64) -> Result<Output> {
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
            let human = render::schedule(&v, now);
            let note = replaced.then(|| format!("replaced the schedule {}", sc.name));
            Output { note, ..Output::new(v, human) }
        }
        ScheduleCmd::List(q) => {
            let call = Call::new(Method::GET, &queue_path(&q, &["schedules"]));
            let v = client.send(call).await?.ok()?;
            let human = render::schedules(&v, now);
            Output::new(v, human)
        }
        ScheduleCmd::Show(s) => {
            let call = Call::new(Method::GET, &["api", &s.ns, &s.queue, "schedules", &s.name]);
            let v = client.send(call).await?.ok()?;
            let human = render::schedule(&v, now);
            Output::new(v, human)
        }
        ScheduleCmd::Delete(s) => {
            let call = Call::new(Method::DELETE, &["api", &s.ns, &s.queue, "schedules", &s.name]);
            let v = client.send(call).await?.ok()?;
            Output::new(or_empty(v), line("deleted"))
        }
    })
}
