//! beanstalkd side by side: the bench starts its own `beanstalkd` processes and runs the same
//! publish and drain workloads against them, over a minimal client of beanstalkd's text
//! protocol (`use`, `watch`, `ignore`, `put`, `reserve-with-timeout`, `delete`) written here
//! on tokio TCP.
//!
//! The modes, from `beanstalkd -h`: `-b DIR` writes a binlog (write-ahead log) and "fsyncs at
//! most once every MS milliseconds (default is 50ms)"; `-f0` fsyncs on every write. Without
//! `-b` nothing is written at all, which is not a fair peer, so both modes keep a binlog.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufStream};
use tokio::net::TcpStream;

use crate::cluster::{free_ports, Proc};
use crate::stats::{join_all, ms_since, Budget, CpuMeter, Row, Tally};
use crate::workloads::{body, Drainer, Opts};

/// Priority of every job (beanstalkd's conventional default).
const PRI: u32 = 1024;
/// Time-to-run of every job, s (the same as delayd's `ttr=30`).
const TTR_S: u32 = 30;
/// Puts in flight per connection while preloading.
const PIPELINE: usize = 64;

/// A beanstalkd durability mode.
#[derive(Debug, Clone, Copy)]
pub enum Mode {
    /// `-b DIR -f0`: binlog, fsync on every write.
    Fsync,
    /// `-b DIR`: binlog, fsync at most every 50 ms (beanstalkd's default).
    Default,
}

impl Mode {
    /// Both modes, durable first.
    pub const ALL: [Mode; 2] = [Mode::Fsync, Mode::Default];

    /// The label used in tables.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Fsync => "beanstalkd -f0 (fsync every write)",
            Mode::Default => "beanstalkd default (fsync ≤ 50 ms)",
        }
    }
}

/// A beanstalkd process the bench started (killed on drop).
pub struct Server {
    /// `host:port`.
    pub addr: String,
    /// The mode it runs in.
    pub mode: Mode,
    // Dropping the server kills the process.
    proc: Proc,
    _dir: tempfile::TempDir,
}

/// The beanstalkd binary on `PATH`, if any.
pub fn find_binary() -> Option<PathBuf> {
    crate::cluster::on_path("beanstalkd")
}

impl Server {
    /// Starts `bin` in `mode` on a fresh port and binlog directory; waits until it accepts.
    pub async fn start(bin: &Path, mode: Mode) -> Result<Server> {
        let dir = tempfile::Builder::new().prefix("delayd-bench-beanstalkd-").tempdir()?;
        let port = free_ports(1)?[0];
        let binlog = dir.path().join("binlog");
        std::fs::create_dir(&binlog)?;
        let mut args = vec![
            "-l".to_string(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string(),
            "-b".into(),
            binlog.display().to_string(),
        ];
        if let Mode::Fsync = mode {
            args.push("-f0".into());
        }
        let mut proc = Proc::spawn(bin, &args, &dir.path().join("beanstalkd.log"))?;
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(&addr).await.is_err() {
            proc.check_alive()?;
            if Instant::now() > deadline {
                bail!("beanstalkd did not listen on {addr} within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Server { addr, mode, proc, _dir: dir })
    }

    /// The process id, for its CPU time.
    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }
}

/// One connection speaking beanstalkd's text protocol.
pub struct Conn {
    io: BufStream<TcpStream>,
    line: String,
}

impl Conn {
    /// Connects to `addr`, and uses and watches only `tube`.
    pub async fn connect(addr: &str, tube: &str) -> Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let mut c = Conn { io: BufStream::new(stream), line: String::new() };
        c.command(&format!("use {tube}\r\n"), "USING").await?;
        c.command(&format!("watch {tube}\r\n"), "WATCHING").await?;
        c.command("ignore default\r\n", "WATCHING").await?;
        Ok(c)
    }

    async fn read_line(&mut self) -> Result<&str> {
        self.line.clear();
        if self.io.read_line(&mut self.line).await? == 0 {
            bail!("beanstalkd closed the connection");
        }
        Ok(self.line.trim_end())
    }

    async fn expect_reply(&mut self, want: &str) -> Result<()> {
        let line = self.read_line().await?;
        if !line.starts_with(want) {
            bail!("beanstalkd: expected {want}, got {line:?}");
        }
        Ok(())
    }

    async fn command(&mut self, cmd: &str, want: &str) -> Result<()> {
        self.io.write_all(cmd.as_bytes()).await?;
        self.io.flush().await?;
        self.expect_reply(want).await
    }

    async fn write_put(&mut self, delay_s: u64, data: &[u8]) -> Result<()> {
        let head = format!("put {PRI} {delay_s} {TTR_S} {}\r\n", data.len());
        self.io.write_all(head.as_bytes()).await?;
        self.io.write_all(data).await?;
        self.io.write_all(b"\r\n").await?;
        Ok(())
    }

    /// `put`: one job, waiting for `INSERTED`.
    pub async fn put(&mut self, delay_s: u64, data: &[u8]) -> Result<()> {
        self.write_put(delay_s, data).await?;
        self.io.flush().await?;
        self.expect_reply("INSERTED").await
    }

    /// `n` puts pipelined (for preloading, not measured).
    pub async fn put_many(&mut self, n: usize, data: &[u8]) -> Result<()> {
        for _ in 0..n {
            self.write_put(0, data).await?;
        }
        self.io.flush().await?;
        for _ in 0..n {
            self.expect_reply("INSERTED").await?;
        }
        Ok(())
    }

    /// `reserve-with-timeout`: a job id, or `None` when the timeout ran out.
    pub async fn reserve(&mut self, timeout_s: u64) -> Result<Option<u64>> {
        let cmd = format!("reserve-with-timeout {timeout_s}\r\n");
        self.io.write_all(cmd.as_bytes()).await?;
        self.io.flush().await?;
        let line = self.read_line().await?;
        if line.starts_with("TIMED_OUT") || line.starts_with("DEADLINE_SOON") {
            return Ok(None);
        }
        let mut parts = line.split_whitespace();
        let (Some("RESERVED"), Some(id), Some(bytes)) = (parts.next(), parts.next(), parts.next())
        else {
            bail!("beanstalkd: unexpected reserve reply {line:?}");
        };
        let id: u64 = id.parse().context("job id")?;
        let bytes: usize = bytes.parse().context("job size")?;
        let mut data = vec![0; bytes + 2];
        self.io.read_exact(&mut data).await?;
        Ok(Some(id))
    }

    /// `delete`: the ack.
    pub async fn delete(&mut self, id: u64) -> Result<()> {
        self.command(&format!("delete {id}\r\n"), "DELETED").await
    }
}

/// `publish` against beanstalkd: C connections putting one job at a time, delayed as
/// delayd's publish workloads are.
pub async fn publish(server: &Server, opts: &Opts) -> Result<Row> {
    let budget = Budget::new(opts.jobs, opts.secs);
    let delay_s = opts.publish_delay_ms / 1000;
    let mut conns = Vec::new();
    for _ in 0..opts.clients {
        conns.push(Conn::connect(&server.addr, "publish").await?);
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for mut c in conns {
        let budget = budget.clone();
        tasks.push(tokio::spawn(async move {
            let mut t = Tally::default();
            let data = body();
            while budget.take(1) {
                let t0 = Instant::now();
                match c.put(delay_s, &data).await {
                    Ok(()) => {
                        t.samples.record(ms_since(t0));
                        t.jobs += 1;
                    }
                    Err(e) => {
                        t.error(e);
                        break;
                    }
                }
            }
            t
        }));
    }
    let tally = join_all(tasks).await?;
    let secs = start.elapsed().as_secs_f64();
    let mut row = Row::from_tally(server.mode.label(), "publish", tally, secs, "request");
    row.prefix_note(format!("put, delay {delay_s} s"));
    Ok(row)
}

/// `drain` against beanstalkd: preload ready jobs (pipelined, and left out of `cpu`), then C
/// consumers `reserve-with-timeout` + `delete` until all are gone.
pub async fn drain(server: &Server, opts: &Opts, cpu: &CpuMeter) -> Result<Row> {
    let total = opts.drain_jobs;
    let loaders = opts.clients.clamp(1, 8) as u64;
    let mut tasks = Vec::new();
    for l in 0..loaders {
        let addr = server.addr.clone();
        let mine = total / loaders + u64::from(l < total % loaders);
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::connect(&addr, "drain").await?;
            let data = body();
            let mut left = mine as usize;
            while left > 0 {
                let n = left.min(PIPELINE);
                c.put_many(n, &data).await?;
                left -= n;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    cpu.restart();
    let mut conns = Vec::new();
    for _ in 0..opts.clients {
        conns.push(Conn::connect(&server.addr, "drain").await?);
    }
    let acked = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for mut c in conns {
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            let mut d = Drainer::new(acked, total, start);
            while d.more() {
                let t0 = Instant::now();
                let r = match c.reserve(1).await {
                    Ok(Some(id)) => c.delete(id).await.map(|()| true),
                    Ok(None) => Ok(false),
                    Err(e) => Err(e),
                };
                // A failed command leaves the protocol stream unusable: this consumer stops.
                if !d.record(t0, r) {
                    break;
                }
            }
            d.finish()
        }));
    }
    let label = server.mode.label();
    crate::workloads::drain_row(label, "drain", "reserve+ack", tasks, total, acked).await
}
