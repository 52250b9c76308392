//! The real `delayctl` binary against real `delayd` processes: cluster status and membership,
//! the job commands through a follower, node failover, dead letters, exit codes, webhooks and
//! schedules, and (once authentication lands) tokens.

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
    ensure!(field(&out, "timeout_ms")? == "2000" && field(&out, "max_in_flight")? == "4", "{out}");
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
    ensure!(field(&out, "next_at_ms")?.parse::<u64>()? > now_ms, "{out}");
    ensure!(field(&out, "body")? == "hello" && field(&out, "attributes")? == "team=ops", "{out}");
    ensure!(field(&out, "tries")? == "2" && field(&out, "catch_up")? == "latest", "{out}");
    let replaced = ctl(a, &cron).await?;
    ensure!(replaced.code == 0 && replaced.stderr.contains("replaced"), "{replaced:?}");
    let start = (now_ms + 3_600_000).to_string();
    let every = [
        "schedule",
        "set",
        "ns",
        "sched",
        "tick",
        "--every-ms",
        "60000",
        "--start-at-ms",
        &start,
        "--catch-up",
        "none",
        "--json",
    ];
    let tick = ctl(a, &every).await?.json()?;
    ensure!(n(&tick, "every_ms")? == 60_000 && s(&tick, "catch_up")? == "none", "{tick}");
    ensure!(n(&tick, "next_at_ms")?.to_string() == start, "{tick}");

    let out = ctl(a, &["schedule", "list", "ns", "sched"]).await?.ok()?;
    let lines: Vec<&str> = out.lines().collect();
    ensure!(lines.len() == 3, "{out}");
    ensure!(lines[0].split_whitespace().collect::<Vec<_>>() == ["name", "timetable", "next_at_ms"]);
    ensure!(lines[1].starts_with("nightly  cron 0 0 3 * * * (Europe/Paris)"), "{out}");
    ensure!(lines[2].starts_with("tick ") && lines[2].ends_with(&start), "{out}");
    ensure!(lines[2].contains(" every 60000 ms "), "{out}");
    let list = ctl(a, &["schedule", "list", "ns", "sched", "--json"]).await?.json()?;
    ensure!(list["schedules"].as_array().map(Vec::len) == Some(2), "{list}");
    let out = ctl(a, &["schedule", "show", "ns", "sched", "tick"]).await?.ok()?;
    ensure!(field(&out, "timetable")? == "every 60000 ms", "{out}");
    ensure!(field(&out, "start_at_ms")? == start && field(&out, "body")?.is_empty(), "{out}");

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

/// `--version` names the git revision the binary was built from.
#[tokio::test]
async fn version_names_the_revision() -> Result<()> {
    let nowhere = dead_addr()?;
    let version = ctl(&nowhere, &["--version"]).await?.ok()?;
    let rest = version.trim().strip_prefix("delayctl ").context("starts with delayctl")?;
    let (semver, sha) = rest.split_once(" (").context("has a revision")?;
    let sha = sha.strip_suffix(')').context("in parentheses")?;
    ensure!(semver.split('.').count() == 3, "{version}");
    let hex = sha.len() == 12 && sha.bytes().all(|b| b.is_ascii_hexdigit());
    ensure!(sha == "unknown" || hex, "{version}");
    // Built from a git checkout (as here, when git answers), the revision is known. It may
    // be older than HEAD: the binary is not rebuilt for a commit the tests do not need.
    let checkout = std::process::Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "--git-dir"])
        .output()
        .is_ok_and(|o| o.status.success());
    ensure!(!checkout || sha != "unknown", "built in a git checkout, yet: {version}");
    Ok(())
}
