//! The real `delayctl` binary against real `delayd` processes: cluster status and membership,
//! the job commands through a follower, node failover, dead letters, exit codes, webhooks and
//! schedules, tokens; the reserved-job commands (release, touch, bury), updates, republish,
//! keys, bulk, pause and destroy, each checked by its effect through the API; human times;
//! and what the binary says about itself (version, completions, manual pages).

use std::process::Stdio;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use delayd_tests::{delayctl_bin, eventually, free_port, n, s, Cluster, Server};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

/// The admin token the token test gives the server and `delayctl`.
const ADMIN_TOKEN: &str = "delayctl-test-admin-token-000";

/// How a test server is secured.
#[derive(Clone, Copy)]
enum Auth {
    /// Open to every request.
    Off,
    /// Admin endpoints need [`ADMIN_TOKEN`]; the data plane needs a namespace token.
    Admin,
}

/// Every auth-related flag these tests give `delayd`.
fn auth_flags(auth: Auth) -> &'static [&'static str] {
    match auth {
        Auth::Off => &["--dev"],
        Auth::Admin => &["--admin-token", ADMIN_TOKEN],
    }
}

/// One `delayctl` run.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The stdout of a successful run.
    fn ok(self) -> Result<String> {
        ensure!(self.code == 0, "delayctl exited {}: {}{}", self.code, self.stderr, self.stdout);
        Ok(self.stdout)
    }

    /// The stdout of a successful `--json` run, which must be one JSON document.
    fn json(self) -> Result<Value> {
        let out = self.ok()?;
        serde_json::from_str(&out).with_context(|| format!("not one JSON document: {out}"))
    }
}

/// Runs `delayctl --addr <addr> <args>` with `stdin` as its input, isolated from the
/// caller's `DELAYD_*` environment.
async fn ctl_with_input(addr: &str, args: &[&str], stdin: &[u8]) -> Result<Run> {
    let mut child = tokio::process::Command::new(delayctl_bin()?)
        .arg("--addr")
        .arg(addr)
        .args(args)
        .env_remove("DELAYD_ADDR")
        .env_remove("DELAYD_TOKEN")
        .env_remove("DELAYD_JSON")
        .env_remove("DELAYD_TIMEOUT_MS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawn delayctl")?;
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin).await?;
    }
    let out = child.wait_with_output().await?;
    Ok(Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Runs `delayctl --addr <addr> <args>` with empty input.
async fn ctl(addr: &str, args: &[&str]) -> Result<Run> {
    ctl_with_input(addr, args, b"").await
}

/// The value of the `key  value` line named `key` in human output.
fn field(out: &str, key: &str) -> Result<String> {
    out.lines()
        .find_map(|l| l.strip_prefix(key).filter(|rest| rest.starts_with(' ')))
        .map(|rest| rest.trim().to_string())
        .with_context(|| format!("no {key} line in:\n{out}"))
}

/// An address nothing listens on.
fn dead_addr() -> Result<String> {
    Ok(format!("http://127.0.0.1:{}", free_port()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_and_jobs_through_a_follower() -> Result<()> {
    let cluster = Cluster::start(3, auth_flags(Auth::Off)).await?;
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let follower = (0..3).find(|i| *i != leader).context("no follower")?;
    let f = cluster.nodes[follower].url.as_str();
    let leader_id = cluster.nodes[leader].id;

    // Cluster status, as JSON and as a table.
    let c = ctl(f, &["cluster", "status", "--json"]).await?.json()?;
    ensure!(n(&c, "leader")? == leader_id, "{c}");
    ensure!(c["voters"].as_array().map(Vec::len) == Some(3), "{c}");
    let nodes = c["nodes"].as_array().context("nodes")?;
    ensure!(nodes.len() == 3 && nodes.iter().all(|x| x["reachable"] == true), "{c}");
    let out = ctl(f, &["cluster", "status"]).await?.ok()?;
    ensure!(field(&out, "leader")? == leader_id.to_string(), "{out}");
    ensure!(field(&out, "voters")? == "1,2,3", "{out}");
    ensure!(out.lines().any(|l| l.starts_with("id") && l.contains("last_applied")), "{out}");
    ensure!(out.lines().filter(|l| l.contains(" voter ")).count() == 3, "{out}");
    ensure!(out.contains("Leader"), "{out}");

    // Publish through the follower: from an argument with options, then from stdin.
    let args = ["publish", "ns", "q", "hello", "--priority", "5", "--key", "k1", "--tries", "2"];
    let mut with_attr = args.to_vec();
    with_attr.extend(["--attr", "trace=abc"]);
    let first = ctl(f, &with_attr).await?.ok()?.trim().to_string();
    ensure!(first.len() == 26, "a job id: {first:?}");
    let again = ctl(f, &args).await?;
    ensure!(again.code == 0 && again.stdout.trim() == first, "{}", again.stdout);
    ensure!(again.stderr.contains("exists"), "{}", again.stderr);
    let second = ctl_with_input(f, &["publish", "ns", "q"], b"from\nstdin").await?.ok()?;
    let second = second.trim().to_string();
    ensure!(second.len() == 26 && second != first);

    // Peek one job, then the next ready one (the urgent first), then stats.
    let out = ctl(f, &["peek", "ns", "q", &first]).await?.ok()?;
    ensure!(field(&out, "body")? == "hello" && field(&out, "attributes")? == "trace=abc", "{out}");
    ensure!(field(&out, "state")? == "ready" && field(&out, "key")? == "k1", "{out}");
    let next = ctl(f, &["peek", "ns", "q", "--json"]).await?.json()?;
    ensure!(s(&next, "job_id")? == first, "{next}");
    let st = ctl(f, &["stats", "ns", "q", "--json"]).await?.json()?;
    ensure!(n(&st, "ready")? == 2 && st["paused"] == false, "{st}");
    let out = ctl(f, &["stats", "ns", "q"]).await?.ok()?;
    ensure!(field(&out, "ready")? == "2" && field(&out, "dead")? == "0", "{out}");

    // Consume and ack: with the lease (JSON), then by id (the human form).
    let job = ctl(f, &["consume", "ns", "q", "--ttr", "30", "--json"]).await?.json()?;
    ensure!(s(&job, "job_id")? == first && n(&job, "attempt")? == 1, "{job}");
    let lease = s(&job, "lease")?;
    let out = ctl(f, &["ack", "ns", "q", &first, "--lease", &lease]).await?.ok()?;
    ensure!(out.trim() == format!("acked {first}"), "{out}");
    let out = ctl(f, &["consume", "ns", "q,other", "--timeout", "2"]).await?.ok()?;
    ensure!(field(&out, "id")? == second && field(&out, "queue")? == "q", "{out}");
    ensure!(field(&out, "remain_tries")? == "0" && !field(&out, "lease")?.is_empty(), "{out}");
    ensure!(out.ends_with("body          from\nstdin\n"), "{out}");
    ctl(f, &["ack", "ns", "q", &second]).await?.ok()?;
    let gone = ctl(f, &["peek", "ns", "q", &second]).await?;
    ensure!(gone.code == 1 && gone.stderr.contains("404 Not Found: job not found"), "{gone:?}");

    // Nothing to consume: exit 3, stdout empty (or the server's JSON with --json).
    let empty = ctl(f, &["consume", "ns", "q"]).await?;
    ensure!(empty.code == 3 && empty.stdout.is_empty(), "{empty:?}");
    ensure!(empty.stderr.contains("no job available"), "{empty:?}");
    let empty = ctl(f, &["consume", "ns", "q", "--json"]).await?;
    ensure!(empty.code == 3 && empty.stdout.contains("no job available"), "{empty:?}");

    // Failover: a dead first address, then a live one; with none alive, the addresses named.
    let dead = dead_addr()?;
    let both = format!("{dead},{f}");
    let st = ctl(&both, &["stats", "ns", "q", "--json"]).await?.json()?;
    ensure!(n(&st, "ready")? == 0, "{st}");
    let dead2 = dead_addr()?;
    let none = ctl(&format!("{dead},{dead2}"), &["stats", "ns", "q"]).await?;
    ensure!(none.code == 1, "{none:?}");
    ensure!(none.stderr.contains(&dead) && none.stderr.contains(&dead2), "{}", none.stderr);

    // A refused command: exit 1 with the server's status and message.
    let bad = ctl(f, &["publish", "ns", "q", "x", "--tries", "0"]).await?;
    ensure!(bad.code == 1, "{bad:?}");
    ensure!(bad.stderr.trim() == "error: 400 Bad Request: tries must be at least 1", "{bad:?}");
    let usage = ctl(f, &["publish", "ns", "q", "x", "--delay", "1", "--at", "5"]).await?;
    ensure!(usage.code == 2, "{usage:?}");

    dead_letter(f).await?;

    // Snapshot and digest.
    let out = ctl(f, &["cluster", "snapshot"]).await?.ok()?;
    ensure!(out.trim() == "snapshot triggered", "{out}");
    let d = ctl(f, &["cluster", "digest", "--json"]).await?.json()?;
    ensure!(n(&d, "applied_index")? > 0 && s(&d, "digest")?.len() == 16, "{d}");

    // Leadership moves to the follower asked, then to whichever voter the leader picks.
    let follower_id = cluster.nodes[follower].id;
    let out = ctl(f, &["cluster", "transfer", "--to", &follower_id.to_string()]).await?.ok()?;
    ensure!(out.trim() == format!("leader  {follower_id}"), "{out}");
    let c = ctl(f, &["cluster", "status", "--json"]).await?.json()?;
    ensure!(n(&c, "leader")? == follower_id, "{c}");
    let moved = ctl(f, &["cluster", "transfer", "--json"]).await?.json()?;
    ensure!(n(&moved, "leader")? != follower_id, "{moved}");
    let bad = ctl(f, &["cluster", "transfer", "--to", "9"]).await?;
    ensure!(bad.code == 1 && bad.stderr.contains("node 9 is not a voter"), "{bad:?}");

    // Membership through the follower: add a learner, promote it, remove it.
    let joiner = cluster.spawn_joiner(4, auth_flags(Auth::Off)).await?;
    let out = ctl(f, &["cluster", "add", "4", &joiner.grpc]).await?.ok()?;
    ensure!(out.trim() == "voters  1,2,3", "{out}");
    let c = ctl(f, &["cluster", "status", "--json"]).await?.json()?;
    ensure!(c["learners"] == serde_json::json!([4]), "{c}");
    let out = ctl(f, &["cluster", "promote", "4"]).await?.ok()?;
    ensure!(out.trim() == "voters  1,2,3,4", "{out}");
    let out = ctl(f, &["cluster", "remove", "4"]).await?.ok()?;
    ensure!(out.trim() == "voters  1,2,3", "{out}");
    let bad = ctl(f, &["cluster", "add", "5", "no-port"]).await?;
    ensure!(bad.code == 1 && bad.stderr.contains("400 Bad Request: addr="), "{bad:?}");
    Ok(())
}

/// Two jobs run out of tries; peek, respawn one, purge the other.
async fn dead_letter(f: &str) -> Result<()> {
    let mut ids = Vec::new();
    for body in ["dead-1", "dead-2"] {
        ids.push(ctl(f, &["publish", "ns", "dl", body, "--tries", "1"]).await?.ok()?);
    }
    let got = ctl(f, &["consume", "ns", "dl", "--ttr", "1", "--count", "2", "--json"]).await?;
    ensure!(got.json()?.as_array().map(Vec::len) == Some(2));
    eventually(Duration::from_secs(15), || async {
        let st = ctl(f, &["stats", "ns", "dl", "--json"]).await?.json()?;
        Ok((n(&st, "dead")? == 2).then_some(()))
    })
    .await?;

    let dl = ctl(f, &["deadletter", "peek", "ns", "dl", "--json"]).await?.json()?;
    ensure!(n(&dl, "size")? == 2 && dl["jobs"].as_array().map(Vec::len) == Some(2), "{dl}");
    let out = ctl(f, &["deadletter", "peek", "ns", "dl", "--limit", "1"]).await?.ok()?;
    ensure!(field(&out, "size")? == "2", "{out}");
    ensure!(out.contains(ids[0].trim()) && out.contains("dead-1"), "{out}");
    ensure!(!out.contains("dead-2"), "limit 1 shows one job: {out}");

    let out = ctl(f, &["deadletter", "respawn", "ns", "dl", "--limit", "1", "--ttl", "60"]).await?;
    ensure!(out.ok()?.trim() == "respawned 1");
    let st = ctl(f, &["stats", "ns", "dl", "--json"]).await?.json()?;
    ensure!(n(&st, "dead")? == 1 && n(&st, "ready")? == 1, "{st}");
    let out = ctl(f, &["deadletter", "purge", "ns", "dl", "--limit", "1"]).await?.ok()?;
    ensure!(out.trim() == "purged", "{out}");
    let purged = ctl(f, &["deadletter", "purge", "ns", "dl", "--json"]).await?.json()?;
    ensure!(purged == serde_json::json!({}), "a 204 is an empty document: {purged}");
    let st = ctl(f, &["stats", "ns", "dl", "--json"]).await?.json()?;
    ensure!(n(&st, "dead")? == 0 && n(&st, "ready")? == 1, "{st}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_command() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let flags = auth_flags(Auth::Off).iter().map(|f| f.to_string()).collect();
    let server =
        Server::spawn(1, &dir.path().join("node1"), free_port()?, free_port()?, flags).await?;
    let a = server.url.as_str();
    ctl(a, &["publish", "ns", "later", "x", "--delay", "600"]).await?.ok()?;
    ctl(a, &["publish", "ns", "now", "y"]).await?.ok()?;
    let q = ctl(a, &["queues", "--json"]).await?.json()?;
    let list = q["queues"].as_array().context("queues")?;
    let later = list.iter().find(|x| x["queue"] == "later").context("later")?;
    ensure!(n(later, "delayed")? == 1 && n(later, "ready")? == 0, "{q}");
    let out = ctl(a, &["queues"]).await?.ok()?;
    let row = out.lines().find(|l| l.starts_with("ns ") && l.contains(" now ")).context("row")?;
    ensure!(
        row.split_whitespace().collect::<Vec<_>>() == ["ns", "now", "false", "0", "1", "0", "0"]
    );
    ctl(a, &["publish", "other", "q", "z"]).await?.ok()?;
    let q = ctl(a, &["queues", "--namespace", "other", "--json"]).await?.json()?;
    ensure!(q["queues"].as_array().map(Vec::len) == Some(1), "{q}");
    let out = ctl(a, &["queues", "--limit", "1"]).await?.ok()?;
    ensure!(out.lines().count() == 3 && out.contains("raise --limit"), "{out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_and_schedule_commands() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let flags = auth_flags(Auth::Off).iter().map(|f| f.to_string()).collect();
    let server =
        Server::spawn(1, &dir.path().join("node1"), free_port()?, free_port()?, flags).await?;
    let a = server.url.as_str();

    // Webhook: set with a chosen secret (shown once), replace it, show it, delete it. Nothing
    // is ever published to the queue, so nothing is POSTed to the dead URL.
    let none = ctl(a, &["webhook", "show", "ns", "hooked"]).await?;
    ensure!(none.code == 1 && none.stderr.contains("404 Not Found:"), "{none:?}");
    ensure!(none.stderr.contains("has no webhook"), "{none:?}");
    let secret = "0123456789abcdef-secret";
    let set = [
        "webhook",
        "set",
        "ns",
        "hooked",
        "http://127.0.0.1:9/hook",
        "--webhook-timeout-ms",
        "2000",
        "--max-in-flight",
        "4",
        "--secret",
        secret,
    ];
    let run = ctl(a, &set).await?;
    ensure!(run.stderr.contains("shown only this once"), "{run:?}");
    let out = run.ok()?;
    ensure!(field(&out, "url")? == "http://127.0.0.1:9/hook", "{out}");
    ensure!(field(&out, "timeout")? == "2s" && field(&out, "max_in_flight")? == "4", "{out}");
    ensure!(field(&out, "secret")? == secret, "{out}");
    let again = ctl(a, &["webhook", "set", "ns", "hooked", "http://127.0.0.1:9/other"]).await?;
    ensure!(again.code == 0 && again.stderr.contains("replaced"), "{again:?}");
    let generated = field(&again.stdout, "secret")?;
    ensure!(generated.len() >= 16 && generated != secret, "{again:?}");
    let w = ctl(a, &["webhook", "show", "ns", "hooked", "--json"]).await?.json()?;
    ensure!(s(&w, "url")? == "http://127.0.0.1:9/other" && w.get("secret").is_none(), "{w}");
    ensure!(n(&w, "timeout_ms")? == 10_000, "replacing resets to the defaults: {w}");
    let out = ctl(a, &["webhook", "show", "ns", "hooked"]).await?.ok()?;
    ensure!(field(&out, "max_in_flight")? == "32" && !out.contains("secret"), "{out}");
    let bad = ctl(a, &["webhook", "set", "ns", "hooked", "ftp://x/y"]).await?;
    ensure!(bad.code == 1, "{bad:?}");
    ensure!(bad.stderr.starts_with("error: 400 Bad Request: invalid url"), "{bad:?}");
    let out = ctl(a, &["webhook", "delete", "ns", "hooked"]).await?.ok()?;
    ensure!(out.trim() == "deleted", "{out}");
    let gone = ctl(a, &["webhook", "delete", "ns", "hooked"]).await?;
    ensure!(gone.code == 1 && gone.stderr.contains("404 Not Found:"), "{gone:?}");

    // Schedules: a cron one in a zone with a body and an attribute, and a periodic one that
    // starts in an hour (so neither fires during the test).
    let now_ms = u64::try_from(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis(),
    )?;
    let cron = [
        "schedule",
        "set",
        "ns",
        "sched",
        "nightly",
        "--cron",
        "0 0 3 * * *",
        "--tz",
        "Europe/Paris",
        "--data",
        "hello",
        "--attr",
        "team=ops",
        "--tries",
        "2",
    ];
    let run = ctl(a, &cron).await?;
    ensure!(run.code == 0 && run.stderr.is_empty(), "created, not replaced: {run:?}");
    let out = run.stdout;
    ensure!(field(&out, "timetable")? == "cron 0 0 3 * * * (Europe/Paris)", "{out}");
    // Tomorrow 03:00 in Paris at the latest: within a day and a bit, shown in UTC.
    let next = field(&out, "next_at")?;
    ensure!(next.contains(":00:00Z (in ") && next.ends_with(')'), "{out}");
    ensure!(field(&out, "body")? == "hello" && field(&out, "attributes")? == "team=ops", "{out}");
    ensure!(field(&out, "tries")? == "2" && field(&out, "catch_up")? == "latest", "{out}");
    let replaced = ctl(a, &cron).await?;
    ensure!(replaced.code == 0 && replaced.stderr.contains("replaced"), "{replaced:?}");
    // In an hour, on a whole second, given as RFC 3339 and every as a duration.
    let start_ms = (now_ms / 1_000 + 3_600) * 1_000;
    let start_at = chrono::DateTime::from_timestamp_millis(i64::try_from(start_ms)?)
        .context("start time")?
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let every = [
        "schedule",
        "set",
        "ns",
        "sched",
        "tick",
        "--every-ms",
        "1m",
        "--start-at-ms",
        &start_at,
        "--catch-up",
        "none",
        "--json",
    ];
    let tick = ctl(a, &every).await?.json()?;
    ensure!(n(&tick, "every_ms")? == 60_000 && s(&tick, "catch_up")? == "none", "{tick}");
    ensure!(n(&tick, "next_at_ms")? == start_ms, "{tick}");

    let out = ctl(a, &["schedule", "list", "ns", "sched"]).await?.ok()?;
    let lines: Vec<&str> = out.lines().collect();
    ensure!(lines.len() == 3, "{out}");
    ensure!(lines[0].split_whitespace().collect::<Vec<_>>() == ["name", "timetable", "next_at"]);
    ensure!(lines[1].starts_with("nightly  cron 0 0 3 * * * (Europe/Paris)"), "{out}");
    ensure!(lines[2].starts_with("tick ") && lines[2].contains(" every 1m "), "{out}");
    // An hour away, less the few seconds the test has taken.
    ensure!(lines[2].contains(&format!("{start_at} (in 59m")), "{out}");
    let list = ctl(a, &["schedule", "list", "ns", "sched", "--json"]).await?.json()?;
    ensure!(list["schedules"].as_array().map(Vec::len) == Some(2), "{list}");
    let out = ctl(a, &["schedule", "show", "ns", "sched", "tick"]).await?.ok()?;
    ensure!(field(&out, "timetable")? == "every 1m", "{out}");
    ensure!(field(&out, "start_at")?.starts_with(&start_at), "{out}");
    ensure!(field(&out, "body")?.is_empty() && field(&out, "ttl")? == "1d", "{out}");

    // Refused: a bad cron expression is the server's 400; both timetables is a usage error.
    let bad = ctl(a, &["schedule", "set", "ns", "sched", "bad", "--cron", "not a cron"]).await?;
    ensure!(bad.code == 1 && bad.stdout.is_empty(), "{bad:?}");
    let want = "error: 400 Bad Request: invalid cron expression \"not a cron\"";
    ensure!(bad.stderr.starts_with(want), "{bad:?}");
    let both = ["schedule", "set", "ns", "sched", "x", "--cron", "* * * * * *", "--every-ms", "1"];
    let usage = ctl(a, &both).await?;
    ensure!(usage.code == 2, "{usage:?}");

    let out = ctl(a, &["schedule", "delete", "ns", "sched", "tick"]).await?.ok()?;
    ensure!(out.trim() == "deleted", "{out}");
    let gone = ctl(a, &["schedule", "show", "ns", "sched", "tick"]).await?;
    ensure!(gone.code == 1 && gone.stderr.contains("404 Not Found:"), "{gone:?}");
    ensure!(gone.stderr.contains("has no schedule \"tick\""), "{gone:?}");
    let list = ctl(a, &["schedule", "list", "ns", "sched", "--json"]).await?.json()?;
    ensure!(list["schedules"].as_array().map(Vec::len) == Some(1), "{list}");
    Ok(())
}

/// `args` preceded by `--token <token>`.
fn with_token<'a>(token: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    [&["--token", token][..], args].concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_commands() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let flags = auth_flags(Auth::Admin).iter().map(|f| f.to_string()).collect();
    let server =
        Server::spawn(1, &dir.path().join("node1"), free_port()?, free_port()?, flags).await?;
    let a = server.url.as_str();

    // Admin endpoints need the admin token.
    let denied = ctl(a, &["token", "list", "ns1"]).await?;
    ensure!(denied.code == 1 && denied.stderr.contains("401"), "{denied:?}");

    let create = ["token", "create", "ns1", "--description", "ci", "--write-limit", "100"];
    let token = ctl(a, &with_token(ADMIN_TOKEN, &create)).await?.ok()?.trim().to_string();
    ensure!(!token.is_empty() && !token.contains(char::is_whitespace), "{token:?}");
    let list = ctl(a, &with_token(ADMIN_TOKEN, &["token", "list", "ns1", "--json"])).await?;
    let list = list.json()?;
    ensure!(list["tokens"][&token] == "ci", "{list}");
    let out = ctl(a, &with_token(ADMIN_TOKEN, &["token", "list", "ns1"])).await?.ok()?;
    let row = out.lines().find(|l| l.starts_with(&token)).context("token row")?;
    ensure!(row.contains(" ci "), "{out}");

    // The namespace token publishes; no token does not.
    let publish = ["publish", "ns1", "q", "x"];
    let id = ctl(a, &with_token(&token, &publish)).await?.ok()?;
    ensure!(id.trim().len() == 26, "{id}");
    let anonymous = ctl(a, &publish).await?;
    ensure!(anonymous.code == 1 && anonymous.stderr.contains("401"), "{anonymous:?}");

    // Deleted, it no longer works, and deleting it again is a 404.
    let delete = ["token", "delete", "ns1", token.as_str()];
    let out = ctl(a, &with_token(ADMIN_TOKEN, &delete)).await?.ok()?;
    ensure!(out.trim() == "deleted", "{out}");
    let revoked = ctl(a, &with_token(&token, &publish)).await?;
    ensure!(revoked.code == 1, "{revoked:?}");
    let again = ctl(a, &with_token(ADMIN_TOKEN, &delete)).await?;
    ensure!(again.code == 1 && again.stderr.contains("404"), "{again:?}");
    Ok(())
}

/// One `--dev` node for a test of its own.
async fn single_node(dir: &tempfile::TempDir) -> Result<Server> {
    let flags = auth_flags(Auth::Off).iter().map(|f| f.to_string()).collect();
    Server::spawn(1, &dir.path().join("node1"), free_port()?, free_port()?, flags).await
}

/// A job's state and its other fields, as the API shows it.
async fn job_json(a: &str, queue: &str, id: &str) -> Result<Value> {
    ctl(a, &["peek", "ns", queue, id, "--json"]).await?.json()
}

/// A queue's counts, as the API shows them.
async fn stats_json(a: &str, queue: &str) -> Result<Value> {
    ctl(a, &["stats", "ns", queue, "--json"]).await?.json()
}

/// The text a `--json` job answer holds in `data`.
fn body_of(job: &Value) -> Result<String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD.decode(s(job, "data")?)?;
    Ok(String::from_utf8(bytes)?)
}

/// Whether `text` is `YYYY-MM-DDTHH:MM:SS[.fff]Z (<relative>)`, the human form of a time.
fn is_human_time(text: &str) -> bool {
    let Some((stamp, relative)) = text.split_once(' ') else { return false };
    let stamp_ok = chrono::DateTime::parse_from_rfc3339(stamp).is_ok() && stamp.ends_with('Z');
    let relative_ok =
        relative.starts_with("(in ") || relative.ends_with(" ago)") || relative == "(now)";
    stamp_ok && relative_ok && relative.ends_with(')')
}

/// A reserved job released, touched and buried; pending jobs updated and republished; jobs
/// found and cancelled by key. Each command's effect is read back through the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_and_pending_job_commands() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = single_node(&dir).await?;
    let a = server.url.as_str();

    // A delayed job, shown with human times: due in an hour, published just now.
    let publish = ["publish", "ns", "jobs", "v1", "--delay", "1h", "--key", "order-1"];
    let id = ctl(a, &publish).await?.ok()?.trim().to_string();
    let out = ctl(a, &["peek", "ns", "jobs", &id]).await?.ok()?;
    let due = field(&out, "due_at")?;
    ensure!(is_human_time(&due), "{out}");
    ensure!(due.contains("(in 59m") || due.contains("(in 1h)"), "{out}");
    ensure!(field(&out, "ttl")? == "1d" && field(&out, "state")? == "delayed", "{out}");
    ensure!(field(&out, "age")?.ends_with('s'), "a duration such as 35ms: {out}");
    let j = job_json(a, "jobs", &id).await?;
    let due_ms = n(&j, "due_at_ms")?;
    ensure!(due_ms > delayd_tests::now_ms() + 3_500_000, "--delay 1h is an hour: {j}");

    // By key: found, as JSON and as a job.
    let by_key = ctl(a, &["key", "show", "ns", "jobs", "order-1", "--json"]).await?.json()?;
    ensure!(s(&by_key, "job_id")? == id, "{by_key}");
    let out = ctl(a, &["key", "show", "ns", "jobs", "order-1"]).await?.ok()?;
    ensure!(field(&out, "id")? == id && field(&out, "key")? == "order-1", "{out}");

    // Update: a new body and priority keep the job delayed; then due now makes it ready.
    let out = ctl(a, &["update", "ns", "jobs", &id, "v2", "--priority", "7"]).await?.ok()?;
    ensure!(field(&out, "priority")? == "7" && field(&out, "body")? == "v2", "{out}");
    let j = job_json(a, "jobs", &id).await?;
    ensure!(body_of(&j)? == "v2" && s(&j, "state")? == "delayed", "{j}");
    ensure!(n(&j, "due_at_ms")? == due_ms, "the due time stays: {j}");
    ctl(a, &["update", "ns", "jobs", &id, "--delay", "0"]).await?.ok()?;
    let st = stats_json(a, "jobs").await?;
    ensure!(n(&st, "ready")? == 1 && n(&st, "delayed")? == 0, "{st}");
    let nothing = ctl(a, &["update", "ns", "jobs", &id]).await?;
    ensure!(nothing.code == 2 && nothing.stderr.contains("required"), "{nothing:?}");

    // Reserve it for 1 s, then touch it for a minute: 3 s later it is still reserved,
    // where without the touch it would have been ready again after 1 s.
    let got = ctl(a, &["consume", "ns", "jobs", "--ttr", "1s", "--json"]).await?.json()?;
    ensure!(s(&got, "job_id")? == id, "{got}");
    let lease = s(&got, "lease")?;
    let stale = ctl(a, &["touch", "ns", "jobs", &id, "--lease", "abc", "--ttr", "1m"]).await?;
    ensure!(stale.code == 1, "{stale:?}");
    ensure!(stale.stderr.contains("409 Conflict: lease is not current"), "{stale:?}");
    let out = ctl(a, &["touch", "ns", "jobs", &id, "--lease", &lease, "--ttr", "1m"]).await?;
    ensure!(field(&out.ok()?, "state")? == "reserved");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let st = stats_json(a, "jobs").await?;
    ensure!(n(&st, "reserved")? == 1 && n(&st, "ready")? == 0, "touched: {st}");

    // Release it with a delay and a new priority: delayed, due then.
    let before = delayd_tests::now_ms();
    let release =
        ["release", "ns", "jobs", &id, "--lease", &lease, "--delay", "10m", "--priority", "3"];
    let out = ctl(a, &release).await?.ok()?;
    ensure!(field(&out, "state")? == "delayed" && field(&out, "priority")? == "3", "{out}");
    let j = job_json(a, "jobs", &id).await?;
    let due = n(&j, "due_at_ms")?;
    ensure!(due >= before + 600_000 && due < before + 660_000, "released for 10m: {j}");
    let again = ctl(a, &["release", "ns", "jobs", &id]).await?;
    ensure!(again.code == 1 && again.stderr.contains("409 Conflict"), "not reserved: {again:?}");

    // Due now, reserved again, buried: it is in the dead letter.
    ctl(a, &["update", "ns", "jobs", &id, "--at", "1000"]).await?.ok()?;
    let got = ctl(a, &["consume", "ns", "jobs", "--json"]).await?.json()?;
    let lease = s(&got, "lease")?;
    let out = ctl(a, &["bury", "ns", "jobs", &id, "--lease", &lease]).await?.ok()?;
    ensure!(field(&out, "state")? == "dead", "{out}");
    let out = ctl(a, &["deadletter", "head", "ns", "jobs"]).await?.ok()?;
    ensure!(field(&out, "size")? == "1" && field(&out, "head")? == id, "{out}");
    ensure!(ctl(a, &["deadletter", "size", "ns", "jobs"]).await?.ok()?.trim() == "1");
    let refused = ctl(a, &["update", "ns", "jobs", &id, "--priority", "1"]).await?;
    ensure!(refused.code == 1 && refused.stderr.contains("409 Conflict"), "dead: {refused:?}");

    // Back to ready, then republished: a new job with the new body, the old one gone.
    ctl(a, &["deadletter", "respawn", "ns", "jobs"]).await?.ok()?;
    let new_id = ctl(a, &["republish", "ns", "jobs", &id, "v3", "--ttl", "2h"]).await?.ok()?;
    let new_id = new_id.trim().to_string();
    ensure!(new_id.len() == 26 && new_id != id, "{new_id}");
    let j = job_json(a, "jobs", &new_id).await?;
    ensure!(body_of(&j)? == "v3" && n(&j, "ttl")? > 7_000, "{j}");
    let gone = ctl(a, &["peek", "ns", "jobs", &id]).await?;
    ensure!(gone.code == 1 && gone.stderr.contains("404 Not Found"), "{gone:?}");

    // Cancel by key: the job holding it is gone (the republished one has no key).
    let keyed = ctl(a, &["publish", "ns", "jobs", "k", "--key", "order-2"]).await?.ok()?;
    let out = ctl(a, &["key", "cancel", "ns", "jobs", "order-2"]).await?.ok()?;
    ensure!(out.trim() == "cancelled the job holding key \"order-2\"", "{out}");
    let gone = ctl(a, &["peek", "ns", "jobs", keyed.trim()]).await?;
    ensure!(gone.code == 1 && gone.stderr.contains("404"), "{gone:?}");
    let gone = ctl(a, &["key", "show", "ns", "jobs", "order-2"]).await?;
    ensure!(gone.code == 1 && gone.stderr.contains("404 Not Found: job not found"), "{gone:?}");

    // Bad input: named, exit 1 from the server, exit 2 from the command line.
    let bad = ctl(a, &["release", "ns", "jobs", "not-a-job-id"]).await?;
    ensure!(bad.code == 1, "{bad:?}");
    ensure!(
        bad.stderr.trim() == "error: 400 Bad Request: invalid job id \"not-a-job-id\"",
        "{bad:?}"
    );
    let bad = ctl(a, &["touch", "ns", "jobs", &new_id, "--ttr", "5x"]).await?;
    ensure!(bad.code == 2 && bad.stdout.is_empty(), "{bad:?}");
    ensure!(bad.stderr.contains("--ttr") && bad.stderr.contains("unknown unit"), "{bad:?}");
    let bad = ctl(a, &["publish", "ns", "jobs", "x", "--ttl", "1500ms"]).await?;
    ensure!(bad.code == 2 && bad.stderr.contains("not a whole number of seconds"), "{bad:?}");
    let bad = ctl(a, &["update", "ns", "jobs", &new_id, "--at", "next tuesday"]).await?;
    ensure!(bad.code == 2 && bad.stderr.contains("RFC 3339"), "{bad:?}");
    Ok(())
}

/// Pause and resume, size, destroy, bulk, health and ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_commands() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = single_node(&dir).await?;
    let a = server.url.as_str();

    // Ready once it leads (until then `ready` exits 1 with the reason); then its health
    // names it the leader.
    eventually(Duration::from_secs(15), || async {
        let r = ctl(a, &["ready"]).await?;
        ensure!(r.code == 0 || (r.code == 1 && r.stderr.contains("503")), "{r:?}");
        Ok((r.code == 0 && r.stdout.trim() == "ready").then_some(()))
    })
    .await?;
    let out = ctl(a, &["health"]).await?.ok()?;
    ensure!(field(&out, "node_id")? == "1" && field(&out, "leader")? == "1", "{out}");
    ensure!(field(&out, "state")? == "Leader", "{out}");
    let r = ctl(a, &["ready", "--json"]).await?.json()?;
    ensure!(r["ready"] == true, "{r}");

    // Bulk from stdin: each element's JSON text is one body, in order.
    let input = br#"[{"n": 1}, "two", 3]"#;
    let out = ctl_with_input(a, &["bulk", "ns", "q", "--priority", "9"], input).await?.ok()?;
    let ids: Vec<&str> = out.lines().collect();
    ensure!(ids.len() == 3 && ids.iter().all(|id| id.len() == 26), "{out}");
    let bodies = [r#"{"n": 1}"#, r#""two""#, "3"];
    for (id, want) in ids.iter().zip(bodies) {
        let j = job_json(a, "q", id).await?;
        ensure!(body_of(&j)? == want && n(&j, "priority")? == 9, "{j}");
    }
    let file = dir.path().join("jobs.json");
    std::fs::write(&file, r#"["later"]"#)?;
    let file = file.to_str().context("path")?;
    let later = ctl(a, &["bulk", "ns", "q", file, "--delay", "1h", "--json"]).await?.json()?;
    ensure!(later["job_ids"].as_array().map(Vec::len) == Some(1), "{later}");
    let bad = ctl_with_input(a, &["bulk", "ns", "q"], br#"{"not": "an array"}"#).await?;
    ensure!(bad.code == 1 && bad.stderr.contains("must be a JSON array"), "{bad:?}");
    let bad = ctl(a, &["bulk", "ns", "q", "/nonexistent/jobs.json"]).await?;
    ensure!(bad.code == 1 && bad.stderr.contains("cannot read the jobs from"), "{bad:?}");

    ensure!(ctl(a, &["size", "ns", "q"]).await?.ok()?.trim() == "3");
    let size = ctl(a, &["size", "ns", "q", "--json"]).await?.json()?;
    ensure!(n(&size, "size")? == 3, "{size}");

    // Paused, the queue hands out nothing though jobs are ready; resumed, it does.
    let out = ctl(a, &["pause", "ns", "q"]).await?.ok()?;
    ensure!(out.trim() == "paused ns/q", "{out}");
    ensure!(stats_json(a, "q").await?["paused"] == true);
    let none = ctl(a, &["consume", "ns", "q"]).await?;
    ensure!(none.code == 3, "paused: {none:?}");
    let out = ctl(a, &["resume", "ns", "q"]).await?.ok()?;
    ensure!(out.trim() == "resumed ns/q", "{out}");
    let got = ctl(a, &["consume", "ns", "q", "--json"]).await?.json()?;
    ensure!(s(&got, "job_id")? == ids[0], "{got}");

    // The human stats: the head's age and the due histogram with durations.
    let out = ctl(a, &["stats", "ns", "q"]).await?.ok()?;
    ensure!(field(&out, "paused")? == "false" && field(&out, "delayed")? == "1", "{out}");
    let head_age = field(&out, "head_age")?;
    ensure!(head_age.ends_with('s') && !head_age.contains(' '), "{out}");
    ensure!(out.contains("within  count\n") && out.contains("\n1h "), "{out}");

    // Destroy: refused without --yes; the ready jobs only; then every job.
    let refused = ctl(a, &["destroy", "ns", "q"]).await?;
    ensure!(refused.code == 2 && refused.stderr.contains("--yes"), "{refused:?}");
    let out = ctl(a, &["destroy", "ns", "q", "--yes"]).await?.ok()?;
    ensure!(out.trim() == "deleted the ready jobs of ns/q", "{out}");
    let st = stats_json(a, "q").await?;
    ensure!(n(&st, "ready")? == 0 && n(&st, "delayed")? == 1 && n(&st, "reserved")? == 1, "{st}");
    ctl(a, &["destroy", "ns", "q", "--all", "--yes"]).await?.ok()?;
    let st = stats_json(a, "q").await?;
    let total: u64 =
        ["delayed", "ready", "reserved", "dead"].iter().map(|f| n(&st, f)).sum::<Result<u64>>()?;
    ensure!(total == 0, "{st}");

    // A queue name the server refuses.
    let bad = ctl(a, &["pause", "ns", "bad queue!"]).await?;
    ensure!(bad.code == 1 && bad.stderr.contains("400 Bad Request"), "{bad:?}");
    Ok(())
}

/// `--version`, completions and manual pages come from the binary itself.
#[tokio::test]
async fn version_completions_and_manual() -> Result<()> {
    let nowhere = dead_addr()?;
    let version = ctl(&nowhere, &["--version"]).await?.ok()?;
    let rest = version.trim().strip_prefix("delayctl ").context("starts with delayctl")?;
    let (semver, sha) = rest.split_once(" (").context("has a revision")?;
    let sha = sha.strip_suffix(')').context("in parentheses")?;
    ensure!(semver.split('.').count() == 3, "{version}");
    ensure!(
        sha == "unknown" || (sha.len() == 12 && sha.bytes().all(|b| b.is_ascii_hexdigit())),
        "{version}"
    );
    // Built from a git checkout (as here, when git answers), the revision is known. It may
    // be older than HEAD: the binary is not rebuilt for a commit the tests do not need.
    let checkout = std::process::Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "--git-dir"])
        .output()
        .is_ok_and(|o| o.status.success());
    ensure!(!checkout || sha != "unknown", "built in a git checkout, yet: {version}");

    let script = ctl(&nowhere, &["completions", "bash"]).await?.ok()?;
    for command in
        ["release", "touch", "bury", "update", "republish", "bulk", "pause", "resume", "destroy"]
    {
        ensure!(
            script.contains(&format!("delayctl__subcmd__{command}")),
            "no {command} in the bash completions"
        );
    }
    let zsh = ctl(&nowhere, &["completions", "zsh"]).await?.ok()?;
    ensure!(zsh.starts_with("#compdef delayctl"), "{}", &zsh[..zsh.len().min(200)]);
    let bad = ctl(&nowhere, &["completions", "tcsh"]).await?;
    ensure!(bad.code == 2 && bad.stderr.contains("tcsh"), "{bad:?}");

    let page = ctl(&nowhere, &["man"]).await?.ok()?;
    ensure!(page.starts_with(".TH delayctl 1 "), "{}", &page[..page.len().min(200)]);
    let dir = tempfile::tempdir()?;
    let out_dir = dir.path().join("man1");
    let listed = ctl(&nowhere, &["man", "--out", out_dir.to_str().context("path")?]).await?.ok()?;
    let written: Vec<&str> = listed.lines().collect();
    ensure!(written.len() > 40 && written[0].ends_with("/delayctl.1"), "{listed}");
    let release = std::fs::read_to_string(out_dir.join("delayctl-release.1"))?;
    ensure!(
        release.starts_with(".TH delayctl-release 1 ") && release.contains("lease"),
        "{release}"
    );
    Ok(())
}
