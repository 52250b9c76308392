//! The client examples of `examples/` — a producer and a consumer each in Python, JavaScript
//! (Node) and Go — run against a real node that requires tokens, with a namespace token
//! created through the token API as a user would.
//!
//! For each language: the producer publishes delayed jobs and prints their ids; while no job
//! can be due yet, the queue holds them all as delayed; the consumer gets every one of them
//! (ids and bodies exactly those published, none twice), none before its delay, and acks
//! them, leaving the queue empty. A producer with a wrong token fails with the 401 in its
//! message, and a consumer of an empty queue gives up at its timeout with exit status 3.
//!
//! Needs `python3`, `node` (18 or later, for the built-in `fetch`) and `go`; a test whose
//! tool is missing says so and passes, unless `DELAYD_REQUIRE_EXAMPLES` is set (CI sets it
//! and installs them).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use delayd_tests::{have_tool, now_ms, Server};
use serde_json::Value;

const ADMIN_TOKEN: &str = "examples-test-admin-token-0001";
const NAMESPACE: &str = "examples";
/// Jobs each producer publishes.
const JOBS: usize = 12;
/// Their delay, in seconds (the API's unit).
const DELAY_S: u64 = 2;
/// How long one run of an example may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// How to start one language's producer and consumer: a program and its leading arguments.
struct Programs {
    producer: Vec<String>,
    consumer: Vec<String>,
    /// Keeps the Go binaries' directory alive.
    _built: Option<tempfile::TempDir>,
}

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn path_arg(p: &Path) -> String {
    p.display().to_string()
}

/// Whether a tool the examples need is here (see [`have_tool`]).
async fn have(what: &str, check: &mut tokio::process::Command) -> Result<bool> {
    have_tool(what, "DELAYD_REQUIRE_EXAMPLES", "", check).await
}

async fn python() -> Result<Option<Programs>> {
    if !have("python3", tokio::process::Command::new("python3").arg("--version")).await? {
        return Ok(None);
    }
    let dir = examples_dir().join("python");
    Ok(Some(Programs {
        producer: vec!["python3".into(), path_arg(&dir.join("producer.py"))],
        consumer: vec!["python3".into(), path_arg(&dir.join("consumer.py"))],
        _built: None,
    }))
}

async fn javascript() -> Result<Option<Programs>> {
    let fetch = "if (typeof fetch !== 'function') process.exit(1)";
    if !have("node 18+ (built-in fetch)", tokio::process::Command::new("node").args(["-e", fetch]))
        .await?
    {
        return Ok(None);
    }
    let dir = examples_dir().join("javascript");
    Ok(Some(Programs {
        producer: vec!["node".into(), path_arg(&dir.join("producer.mjs"))],
        consumer: vec!["node".into(), path_arg(&dir.join("consumer.mjs"))],
        _built: None,
    }))
}

/// Builds the Go examples (standard library only: no module is downloaded, and the proxy
/// is switched off to make sure of it) into a temporary directory.
async fn go() -> Result<Option<Programs>> {
    if !have("go (apt-get install golang-go)", tokio::process::Command::new("go").arg("version"))
        .await?
    {
        return Ok(None);
    }
    let out = tempfile::tempdir()?;
    let cache = out.path().join("cache");
    let built = tokio::process::Command::new("go")
        .args(["build", "-o"])
        .arg(out.path())
        .arg("./...")
        .current_dir(examples_dir().join("go"))
        .env("GOPROXY", "off")
        .env("GOFLAGS", "-mod=readonly")
        .env("GOCACHE", &cache)
        .output()
        .await
        .context("go build")?;
    ensure!(built.status.success(), "go build failed:\n{}", String::from_utf8_lossy(&built.stderr));
    Ok(Some(Programs {
        producer: vec![path_arg(&out.path().join("producer"))],
        consumer: vec![path_arg(&out.path().join("consumer"))],
        _built: Some(out),
    }))
}

/// What a finished run of an example printed.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `program` with `args` to its end (at most [`RUN_TIMEOUT`]).
async fn run(program: &[String], args: &[String]) -> Result<Run> {
    let (exe, lead) = program.split_first().context("no program")?;
    let child = tokio::process::Command::new(exe)
        .args(lead)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(RUN_TIMEOUT, child)
        .await
        .with_context(|| format!("{program:?} ran longer than {RUN_TIMEOUT:?}"))??;
    let run = Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    println!("{program:?} {args:?} → {:?}\n{}{}", run.code, run.stdout, run.stderr);
    Ok(run)
}

/// A node that requires tokens, and a token of [`NAMESPACE`] made through the token API.
async fn node_and_token(dir: &Path) -> Result<(Server, String)> {
    let extra = vec!["--admin-token".into(), ADMIN_TOKEN.into()];
    let server =
        Server::spawn(1, dir, delayd_tests::free_port()?, delayd_tests::free_port()?, extra)
            .await?;
    let resp = reqwest::Client::new()
        .post(format!("{}/token/{NAMESPACE}?description=examples", server.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await?;
    ensure!(resp.status() == 201, "token create answered {}", resp.status());
    let token = delayd_tests::s(&resp.json::<Value>().await?, "token")?;
    Ok((server, token))
}

/// The queue's counts per state, read with the token in the query string.
async fn counts(server: &Server, queue: &str, token: &str) -> Result<[u64; 4]> {
    let url = format!("{}/api/{NAMESPACE}/{queue}/stats?token={token}", server.url);
    let resp = reqwest::get(url).await?;
    ensure!(resp.status() == 200, "stats answered {}", resp.status());
    let v: Value = resp.json().await?;
    let n = |f| delayd_tests::n(&v, f);
    Ok([n("delayed")?, n("ready")?, n("reserved")?, n("dead")?])
}

/// The whole scenario for one language's examples.
async fn exercise(lang: &str, programs: Option<Programs>) -> Result<()> {
    let Some(programs) = programs else { return Ok(()) };
    let dir = tempfile::tempdir()?;
    let (server, token) = node_and_token(&dir.path().join("node")).await?;
    let queue = format!("{lang}-jobs");
    let common = |extra: &[String]| {
        let mut args: Vec<String> = ["--url", &server.url, "--namespace", NAMESPACE, "--queue"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.push(queue.clone());
        args.extend_from_slice(extra);
        args
    };
    let strings = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    // A wrong token: the producer stops with the status in its message.
    let bad =
        run(&programs.producer, &common(&strings(&["--token", "wrong", "--count", "1"]))).await?;
    ensure!(bad.code == Some(1), "{lang} producer with a wrong token exited {:?}", bad.code);
    ensure!(bad.stderr.contains("HTTP 401"), "{lang} producer's error: {}", bad.stderr);

    // Publish.
    let t0 = now_ms();
    let count = JOBS.to_string();
    let delay = DELAY_S.to_string();
    let prefix = format!("{lang}-body");
    let published = run(
        &programs.producer,
        &common(&strings(&[
            "--token", &token, "--count", &count, "--delay", &delay, "--prefix", &prefix,
        ])),
    )
    .await?;
    ensure!(published.code == Some(0), "{lang} producer exited {:?}", published.code);
    let mut sent = Vec::new();
    for line in published.stdout.lines() {
        let mut f = line.splitn(3, ' ');
        match (f.next(), f.next(), f.next()) {
            (Some("published"), Some(id), Some(body)) => {
                sent.push((id.to_string(), body.to_string()))
            }
            _ => bail!("{lang} producer printed {line:?}"),
        }
    }
    let bodies: Vec<&str> = sent.iter().map(|(_, b)| b.as_str()).collect();
    let expected: Vec<String> = (0..JOBS).map(|i| format!("{prefix}-{i}")).collect();
    ensure!(bodies == expected, "{lang} producer published {bodies:?}");
    let sent: BTreeSet<(String, String)> = sent.into_iter().collect();
    ensure!(sent.len() == JOBS, "{lang} producer printed a job id twice");

    // No job can be due before t0 + delay: while that is still ahead, all are delayed.
    let c = counts(&server, &queue, &token).await?;
    if now_ms() < t0 + DELAY_S * 1000 {
        ensure!(c == [JOBS as u64, 0, 0, 0], "{lang}: before the delay, counts are {c:?}");
    } else {
        println!("{lang}: publishing took longer than the delay; the delayed count is not checked");
    }

    // Consume and ack everything.
    let consumed = run(
        &programs.consumer,
        &common(&strings(&["--token", &token, "--count", &count, "--timeout", "60"])),
    )
    .await?;
    ensure!(consumed.code == Some(0), "{lang} consumer exited {:?}", consumed.code);
    let mut got = Vec::new();
    for line in consumed.stdout.lines() {
        let mut f = line.splitn(4, ' ');
        match (f.next(), f.next(), f.next(), f.next()) {
            (Some("consumed"), Some(id), Some(ms), Some(body)) => {
                let ms: u64 = ms.parse().with_context(|| format!("{lang} consumer: {line:?}"))?;
                ensure!(
                    ms >= t0 + DELAY_S * 1000,
                    "{lang}: {body} received at {ms}, before its delay ended ({})",
                    t0 + DELAY_S * 1000
                );
                got.push((id.to_string(), body.to_string()));
            }
            _ => bail!("{lang} consumer printed {line:?}"),
        }
    }
    ensure!(got.len() == JOBS, "{lang} consumer got {} jobs", got.len());
    let got: BTreeSet<(String, String)> = got.into_iter().collect();
    ensure!(got == sent, "{lang}: consumed {got:?}, published {sent:?}");
    // Every job acked: nothing is left in any state.
    let c = counts(&server, &queue, &token).await?;
    ensure!(c == [0, 0, 0, 0], "{lang}: after the consumer, counts are {c:?}");

    // An empty queue: the consumer gives up at its timeout, with exit status 3.
    let idle = run(
        &programs.consumer,
        &common(&strings(&["--token", &token, "--count", "1", "--timeout", "1"])),
    )
    .await?;
    ensure!(idle.code == Some(3), "{lang} idle consumer exited {:?}", idle.code);
    ensure!(idle.stdout.is_empty() && idle.stderr.contains("timed out"), "{lang} idle consumer");
    Ok(())
}

#[tokio::test]
async fn python_examples_publish_and_consume() -> Result<()> {
    exercise("python", python().await?).await
}

#[tokio::test]
async fn javascript_examples_publish_and_consume() -> Result<()> {
    exercise("javascript", javascript().await?).await
}

#[tokio::test]
async fn go_examples_publish_and_consume() -> Result<()> {
    exercise("go", go().await?).await
}
