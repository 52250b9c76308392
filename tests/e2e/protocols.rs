//! beanstalkd's and Disque's protocols as their users meet them: client libraries of their
//! ecosystems (Python's `greenstalk`, and `redis` sending Disque's commands) run scenarios
//! against three real `delayd` processes through a follower, and one script of raw
//! beanstalkd commands is sent to the real beanstalkd and to delayd, the replies compared
//! line by line (`tests/protocols/`).
//!
//! The scripts need `python3` with `greenstalk` and `redis`, and the differential test the
//! `beanstalkd` binary; without them these tests say so and pass, unless
//! `DELAYD_REQUIRE_PROTOCOL_CLIENTS` is set (CI sets it and installs them).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use delayd_tests::{free_port, have_tool, Cluster, Server};

/// How long one script may run.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

/// Whether the tools the scripts need are here (see [`have_tool`]).
async fn have(what: &str, check: &mut tokio::process::Command) -> Result<bool> {
    let hint = " (pip install greenstalk redis; apt-get install beanstalkd)";
    have_tool(what, "DELAYD_REQUIRE_PROTOCOL_CLIENTS", hint, check).await
}

async fn python_clients() -> Result<bool> {
    have(
        "python3 with greenstalk and redis",
        tokio::process::Command::new("python3").args(["-c", "import greenstalk, redis"]),
    )
    .await
}

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("protocols").join(name)
}

/// Runs a script with `args` and fails with its output unless it exits 0.
async fn run(name: &str, args: &[String]) -> Result<()> {
    let child = tokio::process::Command::new("python3")
        .arg(script(name))
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(SCRIPT_TIMEOUT, child)
        .await
        .with_context(|| format!("{name} ran longer than {SCRIPT_TIMEOUT:?}"))??;
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{name}:\n{text}");
    ensure!(out.status.success(), "{name} failed ({}):\n{text}", out.status);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_libraries_work_through_a_follower() -> Result<()> {
    if !python_clients().await? {
        return Ok(());
    }
    let beanstalk: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_>>()?;
    let disque: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_>>()?;
    let cluster = Cluster::start_each(3, |i| {
        vec![
            "--beanstalk-addr".into(),
            format!("127.0.0.1:{}", beanstalk[i]),
            "--disque-addr".into(),
            format!("127.0.0.1:{}", disque[i]),
        ]
    })
    .await?;
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let follower = (0..3).find(|i| *i != leader).context("no follower")?;
    run("beanstalk_clients.py", &["--addr".into(), format!("127.0.0.1:{}", beanstalk[follower])])
        .await?;
    let addr = format!("127.0.0.1:{}", disque[follower]);
    run("disque_clients.py", &["--addr".into(), addr, "--nodes".into(), "3".into()]).await
}

/// A real beanstalkd on a free loopback port, stopped when dropped.
struct Beanstalkd {
    child: tokio::process::Child,
    port: u16,
}

impl Beanstalkd {
    async fn start() -> Result<Beanstalkd> {
        let port = free_port()?;
        let child = tokio::process::Command::new("beanstalkd")
            .args(["-l", "127.0.0.1", "-p", &port.to_string()])
            .kill_on_drop(true)
            .spawn()
            .context("start beanstalkd")?;
        // Ready once it accepts a connection.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            ensure!(tokio::time::Instant::now() < deadline, "beanstalkd did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Beanstalkd { child, port })
    }
}

impl Drop for Beanstalkd {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn beanstalk_replies_match_beanstalkd_line_by_line() -> Result<()> {
    let mut beanstalkd = tokio::process::Command::new("beanstalkd");
    if !python_clients().await? || !have("beanstalkd", beanstalkd.arg("-v")).await? {
        return Ok(());
    }
    let real = Beanstalkd::start().await?;
    let dir = tempfile::tempdir()?;
    let port = free_port()?;
    let extra = vec!["--beanstalk-addr".into(), format!("127.0.0.1:{port}")];
    let _delayd =
        Server::spawn(1, &dir.path().join("node1"), free_port()?, free_port()?, extra).await?;
    run(
        "beanstalk_differential.py",
        &[
            "--expected".into(),
            format!("127.0.0.1:{}", real.port),
            "--actual".into(),
            format!("127.0.0.1:{port}"),
        ],
    )
    .await
}
