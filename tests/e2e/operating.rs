//! What an operator meets first, against the real binary: settings layered file → environment
//! → flags and refused with a precise message when wrong, the admin token generated on first
//! start, and JSON logs that carry each request's id.

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use delayd_tests::{delayd_bin, eventually, free_port, Server};
use serde_json::Value;

/// Runs delayd to completion with `args` and `env`, expecting it to refuse to start.
fn refused(args: &[&str], env: &[(&str, &str)]) -> Result<String> {
    let mut cmd = Command::new(delayd_bin()?);
    cmd.args(args).stdin(Stdio::null());
    // Only what the test gives: no credential or dev mode inherited from the caller.
    for k in ["DELAYD_ADMIN_TOKEN", "DELAYD_ADMIN_TOKEN_FILE", "DELAYD_DEV"] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output()?;
    ensure!(!out.status.success(), "delayd started with {args:?} {env:?}");
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn bad_settings_stop_delayd_with_the_key_named() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("delayd.toml");
    std::fs::write(&file, "node_id = 1\nhtp_addr = \"127.0.0.1:1\"\n")?;
    let config = file.display().to_string();
    let err = refused(&["--config", &config], &[])?;
    ensure!(err.contains(&config) && err.contains("unknown field `htp_addr`"), "{err}");

    let err = refused(&["--dev"], &[("DELAYD_HEARTBEAT_MS", "900")])?;
    ensure!(err.contains("heartbeat_ms (900) must be less than"), "{err}");
    let err = refused(&["--admin-token", "short"], &[])?;
    ensure!(err.contains("admin_token must be at least 16 characters"), "{err}");
    let err = refused(&["--dev"], &[("DELAYD_WORKER_THREADS", "0")])?;
    ensure!(err.contains("worker_threads must be at least 1"), "{err}");
    let err = refused(&["--config", "/nonexistent/delayd.toml"], &[])?;
    ensure!(err.contains("cannot read the config file /nonexistent/delayd.toml"), "{err}");
    Ok(())
}

/// Found by review: founding nodes without a configured admin token each generated their own,
/// refused one another (without a cluster secret the admin token is the cluster credential)
/// and never formed a cluster, with only a warning in the log. Now such a node does not start,
/// and says what to set.
#[test]
fn a_cluster_node_without_a_cluster_credential_refuses_to_start() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("node1");
    let data = data.display().to_string();
    let peers = "1=127.0.0.1:1,2=127.0.0.1:2,3=127.0.0.1:3";
    let err = refused(&["--data-dir", &data, "--peers", peers], &[])?;
    ensure!(
        err.contains("peers lists 3 members but no cluster credential is configured")
            && err.contains("every node of a cluster needs the same cluster_secret"),
        "{err}"
    );
    let err = refused(&["--data-dir", &data, "--node-id", "4", "--join"], &[])?;
    ensure!(err.contains("join is set but no cluster credential is configured"), "{err}");
    ensure!(!dir.path().join("node1/admin-token").exists(), "no token was generated");
    Ok(())
}

/// Waits until `url`'s /health answers.
async fn healthy(url: &str) -> Result<()> {
    eventually(Duration::from_secs(30), || async {
        Ok(match reqwest::get(format!("{url}/health")).await {
            Ok(r) if r.status().is_success() => Some(()),
            _ => None,
        })
    })
    .await
}

/// The status of `GET /admin/cluster` with `token` as the admin credential.
async fn admin_status(url: &str, token: &str) -> Result<u16> {
    let r = reqwest::Client::new()
        .get(format!("{url}/admin/cluster"))
        .bearer_auth(token)
        .send()
        .await?;
    Ok(r.status().as_u16())
}

/// A child process that is killed when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_is_overridden_by_the_environment_and_that_by_flags() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (http, grpc) = (free_port()?, free_port()?);
    let file = dir.path().join("delayd.toml");
    std::fs::write(
        &file,
        format!(
            "http_addr = \"127.0.0.1:{http}\"\ngrpc_addr = \"127.0.0.1:{grpc}\"\n\
             data_dir = \"{}\"\nadmin_token = \"admin-token-from-the-file\"\n",
            dir.path().join("data").display()
        ),
    )?;
    let url = format!("http://127.0.0.1:{http}");
    let start = |flags: &[&str]| -> Result<Child> {
        let child = Command::new(delayd_bin()?)
            .arg("--config")
            .arg(&file)
            .args(flags)
            .env("DELAYD_ADMIN_TOKEN", "admin-token-from-the-environment")
            .env_remove("DELAYD_DEV")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        Ok(Child(child))
    };

    // The file chose the ports; the environment's token beats the file's.
    let node = start(&[])?;
    healthy(&url).await?;
    ensure!(admin_status(&url, "admin-token-from-the-environment").await? == 200);
    ensure!(admin_status(&url, "admin-token-from-the-file").await? == 401);
    drop(node);

    // A flag beats both.
    let _node = start(&["--admin-token", "admin-token-from-the-flag"])?;
    healthy(&url).await?;
    ensure!(admin_status(&url, "admin-token-from-the-flag").await? == 200);
    ensure!(admin_status(&url, "admin-token-from-the-environment").await? == 401);
    Ok(())
}

/// Logs go to stderr, as the configuration guide says, and without colours when stderr is
/// not a terminal: stdout is left to what a command prints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_go_to_stderr_and_stdout_stays_empty() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (http, grpc) = (free_port()?, free_port()?);
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let child = Command::new(delayd_bin()?)
        .args(["--dev", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out)?)
        .stderr(std::fs::File::create(&err)?)
        .spawn()?;
    let node = Child(child);
    healthy(&format!("http://127.0.0.1:{http}")).await?;
    let logged = eventually(Duration::from_secs(10), || async {
        let text = std::fs::read_to_string(&err)?;
        Ok(text.contains("effective configuration").then_some(text))
    })
    .await?;
    drop(node);
    ensure!(!logged.contains('\u{1b}'), "colour codes in a log that is not a terminal");
    let printed = std::fs::read_to_string(&out)?;
    ensure!(printed.is_empty(), "stdout carried: {printed}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_admin_token_one_is_generated_into_the_data_dir() -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("node1");
    // `--dev=false`: the secure default, spelled out so the harness adds no `--dev`.
    let flags = vec!["--dev=false".to_string()];
    let server = Server::spawn(1, &data, free_port()?, free_port()?, flags).await?;
    let path = data.join("admin-token");
    let token = std::fs::read_to_string(&path).context("the generated token")?;
    let token = token.trim();
    ensure!(token.len() == 32, "{token:?}");
    ensure!(std::fs::metadata(&path)?.permissions().mode() & 0o777 == 0o600);
    ensure!(admin_status(&server.url, token).await? == 200);
    let anonymous = reqwest::get(format!("{}/api/ns/q/size", server.url)).await?;
    ensure!(anonymous.status().as_u16() == 401, "the data plane is closed too");
    let log = server.log_text();
    ensure!(log.contains("no admin token configured: generated one"), "{log}");
    ensure!(!log.contains(token), "the token itself is never logged");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_each_request_id_and_hide_the_admin_token() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let secret = "admin-token-that-must-not-be-logged";
    let flags = [
        "--admin-token",
        secret,
        "--log-json",
        "--log-level",
        "info,delayd_server=debug",
        "--worker-threads",
        "3",
    ];
    let flags = flags.iter().map(|f| f.to_string()).collect();
    let server =
        Server::spawn(1, &dir.path().join("node1"), free_port()?, free_port()?, flags).await?;
    let r = reqwest::Client::new()
        .put(format!("{}/api/ns/q", server.url))
        .bearer_auth(secret)
        .header("x-request-id", "e2e-trace-42")
        .body("hello")
        .send()
        .await?;
    ensure!(r.status().as_u16() == 201);
    ensure!(r.headers()["x-request-id"] == "e2e-trace-42");

    // The request's lines name its id, as JSON fields of its span.
    let line = eventually(Duration::from_secs(10), || async {
        Ok(server.log_text().lines().find_map(|l| {
            let v: Value = serde_json::from_str(l).ok()?;
            let done = v["fields"]["message"] == "request done";
            (done && v["span"]["request_id"] == "e2e-trace-42").then_some(v)
        }))
    })
    .await?;
    ensure!(line["span"]["method"] == "PUT" && line["fields"]["status"] == 201, "{line}");
    ensure!(line["level"] == "DEBUG", "{line}");

    let log = server.log_text();
    for l in log.lines() {
        ensure!(serde_json::from_str::<Value>(l).is_ok(), "not a JSON line: {l}");
    }
    ensure!(!log.contains(secret), "the admin token reached the log");
    ensure!(log.contains("effective configuration") && log.contains("<redacted>"), "{log}");
    // The runtime was built with the worker count the settings asked for.
    let effective = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["fields"]["message"] == "effective configuration")
        .context("no effective configuration line")?;
    ensure!(effective["fields"]["worker_threads"] == 3, "{effective}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_created_through_one_node_works_at_once_on_every_node() -> Result<()> {
    let admin = "cluster-admin-token-0000000";
    let cluster = delayd_tests::Cluster::start(3, &["--admin-token", admin]).await?;
    let http = reqwest::Client::new();
    // Created through a follower (forwarded to the leader), then used on every node at once:
    // a follower that has not applied it yet catches up before it would refuse it.
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let follower = (leader + 1) % 3;
    for round in 0..5 {
        let r = http
            .post(format!("{}/token/ns{round}", cluster.nodes[follower].url))
            .bearer_auth(admin)
            .send()
            .await?;
        ensure!(r.status().as_u16() == 201, "create: {}", r.status());
        let v: Value = r.json().await?;
        let token = v["token"].as_str().context("token")?.to_string();
        for node in &cluster.nodes {
            let r = http
                .put(format!("{}/api/ns{round}/q", node.url))
                .header("x-token", &token)
                .body("x")
                .send()
                .await?;
            ensure!(
                r.status().as_u16() == 201,
                "node {} refused a new token: {}",
                node.id,
                r.status()
            );
        }
    }
    Ok(())
}
