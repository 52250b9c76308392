//! `delayd-apply-bench`: what applying a job's commands costs one node, without the cluster.
//!
//! Every node of a cluster applies every committed entry to its own RocksDB, so a
//! microsecond saved in apply is three saved on a three-node cluster. Measured inside a
//! cluster, that saving drowns in the run-to-run noise of a shared machine; measured here,
//! in one process with nothing else running, it does not. The tool opens a store in a
//! temporary directory (or `--dir`), builds log entries the way a leader batches them
//! (`--batch` commands per entry, 100-byte bodies, no ttl unless `--ttl-ms` gives one) and
//! hands them to the state machine through openraft's own `apply` call, then prints per
//! workload the wall time and the process's CPU time (RocksDB's background threads
//! included) per job.
//!
//! Workloads, each on the state the previous ones left (`--jobs` jobs each):
//! - `publish`: jobs published due in an hour (the cluster bench's publish row);
//! - `publish-ready`: jobs published due now;
//! - `ack-first`: a reserve of one that carries the ack of the consumer's previous job
//!   (`GET …?ack=`): `Ack` then `Reserve`, one pair per job, from a backlog published first;
//! - `count10-ackfirst`: ten acks then a reserve of ten, per round of ten jobs, likewise;
//! - `tick`: jobs published due at one instant, then fired by ticks of 1,000;
//! - `tick-riders`: the same jobs fired 50 at a time, each tick's entry carrying the
//!   reserves of ten of five consumers who ride it (each acking its previous ten first), as
//!   the timer pump's entries do under a steady due rate.
//!
//! Only the named work is measured: a drain's backlog and the tick's jobs are published
//! before the clock starts.
//!
//! With `--log`, every entry is first appended to the store's Raft log and waited for until
//! it is fsynced, as a node appends each entry before it applies it, and the log is purged
//! every [`PURGE_EVERY`] entries, as a node's snapshots let it: the cost of the log is then
//! in the figures too (under callgrind, its flush worker's instructions with it).
//!
//! Acks carry no lease (the lease check is a comparison on the record the ack loads
//! anyway), and each consumer's jobs are known from the order they were published in.

use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use delayd_core::{Command, Due, Entry, JobId, JobState, NewJob, QueueName};
use delayd_store::{LogEntry, LogStore, StateMachineStore, Store, TypeConfig};
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, RaftLogStorage, RaftLogStorageExt, RaftStateMachine};

// The cluster bench's file: what this binary does not use of it is the cluster bench's.
#[allow(dead_code)]
#[path = "../procstat.rs"]
mod procstat;

/// The allocator the delayd binary runs with, so that allocation costs what it costs a node.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const WORKLOADS: [&str; 6] =
    ["publish", "publish-ready", "ack-first", "count10-ackfirst", "tick", "tick-riders"];

/// The delay of the `publish` workload's jobs: an hour, as the cluster bench's publish row.
const PUBLISH_DELAY_MS: u64 = 3_600_000;

/// Jobs a `tick-riders` tick fires: what 5,000 jobs/s due bring in 10 ms.
const RIDDEN_TICK: u64 = 50;

/// With `--log`, the log is purged up to the entry just applied every this many entries: a
/// node's snapshot policy (`snapshot_logs_since_last`), after which openraft purges.
const PURGE_EVERY: u64 = 50_000;

/// Applies delayd commands to one store and prints the cost per job.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Jobs per workload.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    jobs: u64,
    /// Commands per log entry, as a leader under load batches them (64 or fewer are applied
    /// inline, as on a node).
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    batch: u64,
    /// Body size in bytes.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=1 << 20))]
    body: u64,
    /// Workloads to run, in this order (default: all).
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(WORKLOADS))]
    workloads: Vec<String>,
    /// Time-to-live of every published job, ms; 0 publishes without one, as the cluster
    /// bench's publish and drain rows do. A job with a ttl also keeps an expiry timer from
    /// its publish to its ack: `86400000` is what the HTTP API gives a job published without
    /// `ttl` (the cluster bench's `lifecycle` row). Otherwise more than an hour, the delay of
    /// the `publish` workload's jobs (a ttl must end after its job is due).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1 << 40))]
    ttl_ms: u64,
    /// Data directory (default: a fresh temporary one, removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Append every entry to the Raft log, synced, before applying it (see the module docs).
    #[arg(long)]
    log: bool,
}

/// The store and the log position entries are applied at.
struct Bench {
    sm: StateMachineStore,
    /// The log every entry is appended to first, with `--log`.
    log: Option<LogStore>,
    index: u64,
    /// The replicated clock the entries carry.
    now_ms: u64,
    queue: QueueName,
    body: Vec<u8>,
    /// The ttl of every job published (`None`: none).
    ttl_ms: Option<u64>,
    next_id: u128,
    /// Ids of the ready jobs, in line order, not yet handed to a consumer.
    ready: std::collections::VecDeque<JobId>,
}

impl Bench {
    async fn apply(&mut self, commands: Vec<Command>) -> Result<()> {
        self.index += 1;
        let entry = LogEntry::new_normal(
            openraft::testing::log_id::<TypeConfig>(1, 1, self.index),
            Entry::new(self.now_ms, commands),
        );
        if let Some(log) = &mut self.log {
            log.blocking_append([entry.clone()]).await?;
            if self.index.is_multiple_of(PURGE_EVERY) {
                log.purge(entry.log_id).await?;
            }
        }
        let items: Vec<Result<EntryResponder<TypeConfig>, io::Error>> = vec![Ok((entry, None))];
        RaftStateMachine::apply(&mut self.sm, futures::stream::iter(items)).await?;
        Ok(())
    }

    fn publish(&mut self, due: Due) -> Command {
        self.next_id += 1;
        let job = NewJob {
            id: JobId(self.next_id),
            key: None,
            body: self.body.clone(),
            attributes: Default::default(),
            due,
            ttl_ms: self.ttl_ms,
            tries: 1,
            ttr_ms: 30_000,
            priority: 0,
        };
        Command::Publish { queue: self.queue.clone(), job }
    }

    fn reserve(&self, count: u32, seed: u64) -> Command {
        Command::Reserve { queues: vec![self.queue.clone()], count, ttr_ms: None, lease_seed: seed }
    }

    fn ack(&self, id: JobId) -> Command {
        Command::Ack { queue: self.queue.clone(), id, lease: None }
    }

    /// How many of the queue's jobs are stored in `state`.
    fn count(&self, state: JobState) -> Result<u64> {
        let view = self.sm.read_view()?;
        Ok(delayd_core::query::queue_meta(&view, &self.queue)?.count(state))
    }

    /// Fails unless the queue holds `want` jobs in `state` (checked after each workload, so
    /// that a figure is never printed for work that was not done).
    fn expect(&self, state: JobState, want: u64) -> Result<()> {
        let got = self.count(state)?;
        if got != want {
            bail!("{got} {} jobs stored, {want} expected", state.as_str());
        }
        Ok(())
    }

    /// Publishes `jobs` jobs due at `due`, `batch` per entry.
    async fn publish_all(&mut self, jobs: u64, batch: u64, due: Due, ready: bool) -> Result<()> {
        let mut left = jobs;
        while left > 0 {
            let n = left.min(batch);
            let commands: Vec<Command> = (0..n).map(|_| self.publish(due)).collect();
            if ready {
                self.ready.extend((self.next_id + 1 - u128::from(n)..=self.next_id).map(JobId));
            }
            self.apply(commands).await?;
            left -= n;
        }
        Ok(())
    }

    /// Consumers taking `per` jobs per reserve and acking them on their next one: each
    /// entry holds `batch` commands' worth of such requests (a request is `per` acks and a
    /// reserve). Ends with the last round's acks. The backlog is published first, unmeasured.
    async fn drain(&mut self, jobs: u64, batch: u64, per: u32) -> Result<Measured> {
        self.publish_all(jobs, batch, Due::After(0), true).await?;
        let started = Started::now()?;
        let requests_per_entry = (batch / (u64::from(per) + 1)).max(1);
        let mut held: Vec<Vec<JobId>> = vec![Vec::new(); requests_per_entry as usize];
        let mut left = jobs;
        let mut seed = 0u64;
        while left > 0 {
            let mut commands = Vec::new();
            self.requests(&mut held, per, &mut left, &mut seed, &mut commands);
            self.apply(commands).await?;
        }
        self.settle(held, started).await
    }

    /// Each consumer's next request: the acks of the jobs it holds, then a reserve of up to
    /// `per` of the ready jobs, at most `left` in all; what it takes is what it holds next.
    fn requests(
        &mut self,
        held: &mut [Vec<JobId>],
        per: u32,
        left: &mut u64,
        seed: &mut u64,
        commands: &mut Vec<Command>,
    ) {
        for consumer in held.iter_mut() {
            commands.extend(consumer.drain(..).map(|id| self.ack(id)));
            let take = u64::from(per).min(*left).min(self.ready.len() as u64);
            if take > 0 {
                *seed += 1;
                commands.push(self.reserve(take as u32, *seed));
                consumer.extend(self.ready.drain(..take as usize));
                *left -= take;
            }
        }
    }

    /// Acks what the consumers still hold, ends the measured phase, and checks that every
    /// job taken was acked and the jobs left ready are the ones this bench counts.
    async fn settle(&mut self, held: Vec<Vec<JobId>>, started: Started) -> Result<Measured> {
        let acks: Vec<Command> = held.iter().flatten().map(|&id| self.ack(id)).collect();
        self.apply(acks).await?;
        let measured = started.stop()?;
        self.expect(JobState::Reserved, 0)?;
        self.expect(JobState::Ready, self.ready.len() as u64)?;
        Ok(measured)
    }

    /// Jobs published due at one instant, then fired by ticks of 1,000 (the pump's limit),
    /// with the clock past the instant. Only the ticks are measured.
    async fn tick(&mut self, jobs: u64, batch: u64) -> Result<Measured> {
        let due = self.now_ms + 1_000;
        self.publish_all(jobs, batch, Due::At(due), false).await?;
        self.now_ms = due + 1;
        let delayed_before = self.count(JobState::Delayed)?;
        let started = Started::now()?;
        for _ in 0..jobs.div_ceil(1_000) {
            self.apply(vec![Command::Tick { limit: 1_000 }]).await?;
        }
        let measured = started.stop()?;
        // Every job of the instant fired (the ones due in an hour stay).
        self.expect(JobState::Delayed, delayed_before.saturating_sub(jobs))?;
        self.ready.extend((self.next_id + 1 - u128::from(jobs)..=self.next_id).map(JobId));
        self.expect(JobState::Ready, self.ready.len() as u64)?;
        Ok(measured)
    }

    /// Jobs published due at one instant, then fired [`RIDDEN_TICK`] at a time by entries
    /// that carry, after the `Tick`, a reserve of ten per ten jobs fired, each preceded by
    /// the acks of that consumer's previous ten. Only the ticks are measured.
    async fn tick_riders(&mut self, jobs: u64, batch: u64) -> Result<Measured> {
        let due = self.now_ms + 1_000;
        self.publish_all(jobs, batch, Due::At(due), false).await?;
        self.now_ms = due + 1;
        let riders = RIDDEN_TICK.div_ceil(10) as usize;
        let mut held: Vec<Vec<JobId>> = vec![Vec::new(); riders];
        let first = self.next_id + 1 - u128::from(jobs);
        let mut fired = 0u64;
        let mut seed = 0u64;
        // The riders take whatever is ready: the count is bounded by the ticks.
        let mut unbounded = u64::MAX;
        let started = Started::now()?;
        while fired < jobs {
            let n = RIDDEN_TICK.min(jobs - fired);
            self.ready.extend((0..n).map(|i| JobId(first + u128::from(fired + i))));
            fired += n;
            let mut commands = vec![Command::Tick { limit: n as u32 }];
            self.requests(&mut held, 10, &mut unbounded, &mut seed, &mut commands);
            self.apply(commands).await?;
        }
        self.settle(held, started).await
    }

    /// Publishes `jobs` jobs due after `delay_ms`, measured.
    async fn publish_measured(&mut self, jobs: u64, batch: u64, delay_ms: u64) -> Result<Measured> {
        let delayed_before = self.count(JobState::Delayed)?;
        let started = Started::now()?;
        self.publish_all(jobs, batch, Due::After(delay_ms), delay_ms == 0).await?;
        let measured = started.stop()?;
        self.expect(JobState::Ready, self.ready.len() as u64)?;
        // A refused publish (say, a ttl that ends before the delay) stores nothing: every
        // delayed job must be there, or the figure is of work not done.
        let delayed = if delay_ms == 0 { 0 } else { jobs };
        self.expect(JobState::Delayed, delayed_before + delayed)?;
        Ok(measured)
    }
}

/// When a measured phase began: the clock, and the CPU the process had used by then.
struct Started {
    at: Instant,
    cpu: Duration,
}

impl Started {
    fn now() -> Result<Started> {
        Ok(Started { at: Instant::now(), cpu: process_cpu()? })
    }

    /// The phase's wall time and the process's CPU time over it.
    fn stop(self) -> Result<Measured> {
        Ok(Measured { wall: self.at.elapsed(), cpu: process_cpu()?.saturating_sub(self.cpu) })
    }
}

/// Wall time and process CPU time of a measured phase.
struct Measured {
    wall: Duration,
    cpu: Duration,
}

/// The CPU time this process has used, every thread included (from `/proc/self/stat`).
fn process_cpu() -> Result<Duration> {
    let ticks = procstat::cpu_ticks("self").context("read /proc/self/stat")?;
    Ok(Duration::from_secs_f64(ticks as f64 / procstat::clock_ticks_per_s()))
}

fn main() -> Result<()> {
    // RocksDB's per-thread counters off as on every thread of a node: on this one, which
    // applies batches of 64 commands or fewer, and on the blocking threads that apply larger
    // ones.
    delayd_store::without_perf_counters();
    tokio::runtime::Builder::new_current_thread()
        .on_thread_start(delayd_store::without_perf_counters)
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> Result<()> {
    let args = Args::parse();
    let workloads: Vec<String> = if args.workloads.is_empty() {
        WORKLOADS.iter().map(|w| w.to_string()).collect()
    } else {
        args.workloads.clone()
    };
    if args.ttl_ms > 0 && args.ttl_ms <= PUBLISH_DELAY_MS {
        bail!(
            "--ttl-ms must be 0 or more than {PUBLISH_DELAY_MS} (the publish workload's delay): \
             a ttl must end after its job is due"
        );
    }
    let temp = tempfile::tempdir()?;
    let dir = args.dir.clone().unwrap_or_else(|| temp.path().to_path_buf());
    let (log, sm) = Store::open(&dir).context("open the store")?;
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis();
    let mut bench = Bench {
        sm,
        log: args.log.then_some(log),
        index: 0,
        now_ms: u64::try_from(now_ms)?,
        queue: QueueName::new("bench", "apply"),
        body: vec![b'x'; args.body as usize],
        ttl_ms: (args.ttl_ms > 0).then_some(args.ttl_ms),
        next_id: 1 << 100,
        ready: Default::default(),
    };
    let ttl = match bench.ttl_ms {
        Some(ms) => format!("a ttl of {ms} ms"),
        None => "no ttl".to_string(),
    };
    println!(
        "{} jobs per workload, {} commands per entry, {}-byte bodies, {ttl}, {}, store in {}",
        args.jobs,
        args.batch,
        args.body,
        if args.log { "each entry appended to the log first" } else { "no log" },
        dir.display()
    );
    println!("{:<18} {:>10} {:>12} {:>12}", "workload", "jobs/s", "wall µs/job", "CPU µs/job");
    for workload in &workloads {
        let (jobs, batch) = (args.jobs, args.batch);
        let m = match workload.as_str() {
            "publish" => bench.publish_measured(jobs, batch, PUBLISH_DELAY_MS).await?,
            "publish-ready" => bench.publish_measured(jobs, batch, 0).await?,
            "ack-first" => bench.drain(jobs, batch, 1).await?,
            "count10-ackfirst" => bench.drain(jobs, batch, 10).await?,
            "tick" => bench.tick(jobs, batch).await?,
            "tick-riders" => bench.tick_riders(jobs, batch).await?,
            other => bail!("unknown workload {other}"),
        };
        let per_job = |d: Duration| d.as_secs_f64() * 1e6 / jobs as f64;
        println!(
            "{:<18} {:>10.0} {:>12.2} {:>12.2}",
            workload,
            jobs as f64 / m.wall.as_secs_f64(),
            per_job(m.wall),
            per_job(m.cpu)
        );
    }
    Ok(())
}
