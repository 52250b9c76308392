//! What a workload measures and how it is summarised: nearest-rank percentiles of an HDR
//! histogram ([`delayd_percentiles`]: 3 significant digits, microsecond resolution, exact
//! below 2.048 ms; a worker's tally is a histogram, not a list of samples), the per-worker tally
//! that workers merge at the end, the shared job budget, the CPU time spent by the servers and
//! by the bench itself, and the result row that the table, the JSON file and the report are
//! all rendered from.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use delayd_percentiles::MillisRecorder;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::procstat::{clock_ticks_per_s, cpu_ticks, cpu_ticks_with_children, stat_ticks};

/// Latency (or lateness) percentiles in milliseconds, nearest rank (see
/// [`delayd_percentiles`] for the precision). Lateness below zero (an early delivery) counts
/// as 0 here; the timer rows report early deliveries apart.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    /// Number of samples.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
}

impl Percentiles {
    /// Percentiles of the samples of `recorded`; `None` when there are none.
    pub fn of(recorded: &MillisRecorder) -> Option<Percentiles> {
        let s = recorded.summary()?;
        Some(Percentiles {
            n: usize::try_from(s.count).unwrap_or(usize::MAX),
            p50: s.p50,
            p99: s.p99,
            p999: s.p999,
            max: s.max,
        })
    }
}

/// Wall-clock now in fractional unix milliseconds: lateness compares it with the server's
/// `due_at_ms`, which is stamped with the same machine's wall clock.
pub fn wall_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Milliseconds elapsed since `t`.
pub fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// How many jobs a closed-loop workload may still start: it stops at `max_jobs` or at the
/// deadline, whichever comes first. Shared by all workers so the count is global.
#[derive(Clone)]
pub struct Budget {
    issued: Arc<AtomicU64>,
    max_jobs: u64,
    deadline: Instant,
}

impl Budget {
    /// A budget of `max_jobs` (unbounded if `None`) over `secs` from now.
    pub fn new(max_jobs: Option<u64>, secs: f64) -> Budget {
        Budget {
            issued: Arc::new(AtomicU64::new(0)),
            max_jobs: max_jobs.unwrap_or(u64::MAX),
            deadline: Instant::now() + Duration::from_secs_f64(secs),
        }
    }

    /// Claims `n` jobs; false when the budget is spent or the time is up.
    pub fn take(&self, n: u64) -> bool {
        Instant::now() < self.deadline
            && self.issued.fetch_add(n, Ordering::Relaxed) < self.max_jobs
    }
}

/// What one worker saw; workers' tallies are merged into one.
#[derive(Default)]
pub struct Tally {
    /// Per-operation latency (or lateness) samples, ms.
    pub samples: MillisRecorder,
    /// Jobs completed (a bulk operation counts each of its jobs).
    pub jobs: u64,
    /// Failed operations.
    pub errors: u64,
    /// The first failure, to show what went wrong.
    pub first_error: Option<String>,
    /// Timer workloads: each delivery's due time (ms after the first job's) and lateness (ms),
    /// to show when in the run the late ones came due.
    pub due_lateness: Vec<(f64, f64)>,
}

impl Tally {
    /// Records a failed operation.
    pub fn error(&mut self, e: impl std::fmt::Display) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
    }

    /// Adds another worker's tally to this one.
    pub fn merge(&mut self, other: Tally) {
        self.samples.merge(&other.samples);
        self.jobs += other.jobs;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.due_lateness.extend(other.due_lateness);
    }
}

/// Joins worker tasks and merges their tallies.
pub async fn join_all(tasks: Vec<tokio::task::JoinHandle<Tally>>) -> anyhow::Result<Tally> {
    let mut all = Tally::default();
    for t in tasks {
        all.merge(t.await?);
    }
    Ok(all)
}

/// How a workload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// It ran; its figures are in the row.
    Ok,
    /// It could not run to the end; `note` says why.
    Failed,
    /// It does not apply to this setup (e.g. failover on one node); `note` says why.
    Skipped,
    /// Not implemented yet on this side (e.g. a client API that does not exist yet).
    Unavailable,
}

/// One result line: a workload on a system.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The system measured, e.g. `delayd 3 nodes` or `beanstalkd -f0`.
    pub system: String,
    /// The workload's name, e.g. `publish-http`.
    pub workload: String,
    /// How it ended.
    pub status: Status,
    /// Jobs completed.
    pub jobs: u64,
    /// Seconds measured.
    pub secs: f64,
    /// The headline rate in jobs/s (what the workload says it measures).
    pub jobs_per_s: Option<f64>,
    /// Latency (or lateness, for `timer` and `lifecycle`) percentiles, ms.
    pub latency_ms: Option<Percentiles>,
    /// What the latency column means for this row.
    pub latency_of: &'static str,
    /// Failed operations.
    pub errors: u64,
    /// Early deliveries (only `timer`); must be 0.
    pub early: Option<u64>,
    /// A short human note (why it failed, or a headline figure that is not a rate).
    pub note: String,
    /// Concurrent clients (connections) the workload ran with; `None` where it has no such
    /// knob (open-loop publishing, failover's fixed publishers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clients: Option<usize>,
    /// CPU time (user + system) of every server process of the system under test, and of the
    /// children it reaped, over the measured part of the workload, in µs per job of `jobs`;
    /// `None` when the processes are not the bench's own (`--target`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_cpu_us_per_job: Option<f64>,
    /// Context switches (voluntary and involuntary) of the server processes' threads over the
    /// same span, per job. A lower bound: a thread that ended before the span's end is not
    /// counted. `None` as for `server_cpu_us_per_job`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_switches_per_job: Option<f64>,
    /// The server CPU per job split by thread name (digits at the end dropped, so a pool's
    /// threads add up): where the CPU went, e.g. Tokio's workers against the WAL syncer. The
    /// parts can fall short of `server_cpu_us_per_job`, which also counts threads that ended
    /// during the span; empty as `server_cpu_us_per_job` is `None`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub server_cpu_us_per_job_by_thread: BTreeMap<String, f64>,
    /// The server CPU per job split by delayd node (`n1`, `n2 (leader)`, …; the leader as it
    /// was when the workload began): what the leader pays against each follower. Empty for
    /// the peers and for `--target`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub server_cpu_us_per_job_by_node: BTreeMap<String, f64>,
    /// CPU time of the bench process itself (the load generator, and lmstfy's pump for
    /// `lmstfy-redis`) over the same span, in percent of one core: on a 2-core machine 200 is
    /// everything, so a high figure says the server was starved by its own load.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loadgen_cpu_pct: Option<f64>,
    /// CPU time of the same server processes after the measured span, until the work it left
    /// behind was done (RocksDB's flushes and compactions on every delayd node; a Redis AOF
    /// rewrite), in µs per job of `jobs`: a cost of these jobs that the measured span did not
    /// see. `None` as for `server_cpu_us_per_job`, or when the servers could not say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_cpu_us_per_job: Option<f64>,
    /// Seconds that wait took; `None` when the servers could not say when they were done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_secs: Option<f64>,
    /// Workload-specific figures (RSS per node, lateness histogram, ...).
    pub extra: Map<String, Value>,
}

impl Row {
    /// An empty row with the given status.
    pub fn new(system: &str, workload: &str, status: Status) -> Row {
        Row {
            system: system.to_string(),
            workload: workload.to_string(),
            status,
            jobs: 0,
            secs: 0.0,
            jobs_per_s: None,
            latency_ms: None,
            latency_of: "",
            errors: 0,
            early: None,
            note: String::new(),
            clients: None,
            server_cpu_us_per_job: None,
            server_switches_per_job: None,
            server_cpu_us_per_job_by_thread: BTreeMap::new(),
            server_cpu_us_per_job_by_node: BTreeMap::new(),
            loadgen_cpu_pct: None,
            after_cpu_us_per_job: None,
            after_secs: None,
            extra: Map::new(),
        }
    }

    /// A row from a merged tally measured over `secs`.
    pub fn from_tally(
        system: &str,
        workload: &str,
        tally: Tally,
        secs: f64,
        latency_of: &'static str,
    ) -> Row {
        let mut row = Row::new(system, workload, Status::Ok);
        row.jobs = tally.jobs;
        row.secs = secs;
        row.jobs_per_s = (secs > 0.0).then(|| tally.jobs as f64 / secs);
        row.latency_ms = Percentiles::of(&tally.samples);
        row.latency_of = latency_of;
        row.errors = tally.errors;
        if let Some(e) = tally.first_error {
            row.note = format!("first error: {e}");
        }
        if tally.jobs == 0 {
            row.status = Status::Failed;
        }
        row
    }

    /// Puts `text` in front of the note (which may hold the first error).
    pub fn prefix_note(&mut self, text: impl Into<String>) {
        let text = text.into();
        self.note = if self.note.is_empty() { text } else { format!("{text}; {}", self.note) };
    }

    /// A row for a workload that failed with `e`.
    pub fn failed(system: &str, workload: &str, e: &anyhow::Error) -> Row {
        let mut row = Row::new(system, workload, Status::Failed);
        row.note = format!("{e:#}");
        row
    }
}

/// One thread of a server process, as `/proc` shows it.
#[derive(Debug, Clone, PartialEq)]
struct ThreadCounts {
    /// The thread's name without the digits at its end (`rocksdb:low3` → `rocksdb:low`).
    name: String,
    /// CPU time (user + system) so far, in clock ticks.
    ticks: u64,
    /// Context switches so far, voluntary and involuntary.
    switches: u64,
}

/// Every thread of process `pid` now, by thread id. A thread that ends before the next
/// reading takes its counts with it, so the figures are a lower bound (Tokio's blocking
/// threads end after ten idle seconds; the busy ones live as long as the process).
fn threads(pid: u32) -> BTreeMap<u32, ThreadCounts> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return out };
    for task in dir.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        if let Some(t) = parse_thread(&stat, &status) {
            out.insert(tid, t);
        }
    }
    out
}

/// A thread's name and CPU ticks from its `stat`, and its context switches from its
/// `status`.
fn parse_thread(stat: &str, status: &str) -> Option<ThreadCounts> {
    let name = stat.get(stat.find('(')? + 1..stat.rfind(')')?)?;
    let ticks = stat_ticks(stat)?;
    let counts: Vec<u64> = status
        .lines()
        .filter_map(|l| {
            let (key, value) = l.split_once(':')?;
            matches!(key, "voluntary_ctxt_switches" | "nonvoluntary_ctxt_switches")
                .then(|| value.trim().parse::<u64>().ok())?
        })
        .collect();
    // Both counts or no reading: a thread counted as zero at the start and in full at the end
    // would be charged its whole life.
    let [voluntary, involuntary] = counts[..] else { return None };
    let switches = voluntary + involuntary;
    Some(ThreadCounts {
        name: name.trim_end_matches(|c: char| c.is_ascii_digit()).trim_end().to_string(),
        ticks,
        switches,
    })
}

/// Where a CPU measurement began.
struct CpuMark {
    at: Instant,
    server: Vec<(u32, u64)>,
    /// Each server process's threads, by process id.
    threads: BTreeMap<u32, BTreeMap<u32, ThreadCounts>>,
    own: u64,
}

/// CPU time of the server processes and of the bench over one workload: [`CpuMeter::start`]
/// before it, [`CpuMeter::restart`] by workloads with a setup phase (a preload) that should
/// not count, [`CpuMeter::finish`] after it. Shared by reference between the runner and the
/// workload, hence the lock.
#[derive(Default)]
pub struct CpuMeter {
    mark: Mutex<Option<CpuMark>>,
}

/// What a [`CpuMeter`] measured.
#[derive(Debug, Clone)]
pub struct CpuUsage {
    /// Seconds of CPU used by the server processes; `None` when there were none to read.
    pub server_s: Option<f64>,
    /// Context switches of the server processes' threads; `None` when no thread could be read.
    pub server_switches: Option<u64>,
    /// Seconds of server CPU by thread name (see [`Row::server_cpu_us_per_job_by_thread`]).
    pub server_s_by_thread: BTreeMap<String, f64>,
    /// Seconds of CPU of each server process, by process id.
    pub server_s_by_pid: BTreeMap<u32, f64>,
    /// The same by node name, once [`CpuUsage::name_nodes`] has named them.
    pub server_s_by_node: BTreeMap<String, f64>,
    /// Seconds of CPU used by the bench process.
    pub own_s: f64,
    /// Wall-clock seconds measured.
    pub wall_s: f64,
}

impl CpuMeter {
    /// Begins a measurement of the server processes `pids` (empty when they are not local).
    pub fn start(&self, pids: &[u32]) {
        let server = pids.iter().filter_map(|p| Some((*p, cpu_ticks_with_children(*p)?))).collect();
        let threads = pids.iter().map(|p| (*p, threads(*p))).collect();
        let own = cpu_ticks("self").unwrap_or(0);
        let mark = CpuMark { at: Instant::now(), server, threads, own };
        if let Ok(mut m) = self.mark.lock() {
            *m = Some(mark);
        }
    }

    /// Begins again from now with the same processes: called after a workload's setup, so
    /// that the CPU the preload took is not charged to the jobs measured after it.
    pub fn restart(&self) {
        let pids: Vec<u32> = self
            .mark
            .lock()
            .ok()
            .and_then(|m| m.as_ref().map(|m| m.server.iter().map(|(p, _)| *p).collect()))
            .unwrap_or_default();
        self.start(&pids);
    }

    /// Ends the measurement; `pids` are the server processes now. A process started since
    /// the mark (a restarted node) counts whole; one that died since (a killed node) is lost,
    /// so a workload that kills processes is undercounted.
    pub fn finish(&self, pids: &[u32]) -> Option<CpuUsage> {
        let mark = self.mark.lock().ok()?.take()?;
        let tick = clock_ticks_per_s();
        let mut server = 0u64;
        let mut by_pid = BTreeMap::new();
        for p in pids {
            let Some(now) = cpu_ticks_with_children(*p) else { continue };
            let before = mark.server.iter().find(|(q, _)| q == p).map_or(0, |(_, t)| *t);
            server += now.saturating_sub(before);
            by_pid.insert(*p, now.saturating_sub(before) as f64 / tick);
        }
        let mut switches = 0u64;
        let mut read_any = false;
        let mut by_thread: BTreeMap<String, f64> = BTreeMap::new();
        let none = BTreeMap::new();
        for p in pids {
            let before = mark.threads.get(p).unwrap_or(&none);
            for (tid, now) in threads(*p) {
                read_any = true;
                let (ticks, switched) = match before.get(&tid) {
                    Some(b) => {
                        (now.ticks.saturating_sub(b.ticks), now.switches.saturating_sub(b.switches))
                    }
                    None => (now.ticks, now.switches),
                };
                switches += switched;
                *by_thread.entry(now.name).or_default() += ticks as f64 / tick;
            }
        }
        by_thread.retain(|_, s| *s > 0.0);
        let own = cpu_ticks("self").unwrap_or(0).saturating_sub(mark.own);
        Some(CpuUsage {
            server_s: (!pids.is_empty()).then(|| server as f64 / tick),
            server_switches: read_any.then_some(switches),
            server_s_by_thread: by_thread,
            server_s_by_pid: by_pid,
            server_s_by_node: BTreeMap::new(),
            own_s: own as f64 / tick,
            wall_s: mark.at.elapsed().as_secs_f64(),
        })
    }
}

/// Whether a row ran, and so takes its share of what was measured over its workload (a
/// skipped or unavailable row did not).
pub fn ran(r: &Row) -> bool {
    matches!(r.status, Status::Ok | Status::Failed)
}

/// The jobs that the rows which ran completed together: what a workload's measurements are
/// divided by (storage reports several rows for one run).
pub fn jobs_of_rows_that_ran(rows: &[Row]) -> u64 {
    rows.iter().filter(|r| ran(r)).map(|r| r.jobs).sum()
}

impl CpuUsage {
    /// Names the server processes: `nodes` holds each delayd node's id and process id, and
    /// `leader` the id of the node that led when the workload began, if known.
    pub fn name_nodes(&mut self, nodes: &[(u64, u32)], leader: Option<u64>) {
        for (id, pid) in nodes {
            let Some(s) = self.server_s_by_pid.get(pid) else { continue };
            let name =
                if Some(*id) == leader { format!("n{id} (leader)") } else { format!("n{id}") };
            self.server_s_by_node.insert(name, *s);
        }
    }

    /// Fills the CPU fields of `rows`, which together completed the measured jobs: the server
    /// figure is per job over all of them (storage reports several rows for one run).
    /// Rows that did not run (skipped, unavailable) get nothing.
    pub fn apply(&self, rows: &mut [Row]) {
        let jobs = jobs_of_rows_that_ran(rows);
        let per_job = |n: f64| (jobs > 0).then(|| n / jobs as f64);
        let us_per_job = |s: f64| per_job(s * 1e6);
        let cpu = self.server_s.and_then(us_per_job);
        let switches = self.server_switches.and_then(|n| per_job(n as f64));
        let split = |seconds: &BTreeMap<String, f64>| -> BTreeMap<String, f64> {
            seconds.iter().filter_map(|(name, s)| Some((name.clone(), us_per_job(*s)?))).collect()
        };
        let by_thread = split(&self.server_s_by_thread);
        let by_node = split(&self.server_s_by_node);
        let pct = (self.wall_s > 0.0).then(|| self.own_s / self.wall_s * 100.0);
        for r in rows.iter_mut().filter(|r| ran(r)) {
            r.server_cpu_us_per_job = cpu;
            r.server_switches_per_job = switches;
            r.server_cpu_us_per_job_by_thread = by_thread.clone();
            r.server_cpu_us_per_job_by_node = by_node.clone();
            r.loadgen_cpu_pct = pct;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut a = Tally::default();
        let mut b = Tally::default();
        // 1..=1000 ms over two workers, merged: ranks 500, 990, 999, each to 3 significant
        // digits (the top of its µs bucket: at most 1/1024 high); the maximum is exact.
        for ms in (1..=500).rev() {
            a.samples.record(f64::from(ms));
        }
        for ms in 501..=1000 {
            b.samples.record(f64::from(ms));
        }
        a.merge(b);
        let p = Percentiles::of(&a.samples).expect("samples");
        assert_eq!((p.n, p.max), (1000, 1000.0));
        for (got, exact) in [(p.p50, 500.0), (p.p99, 990.0), (p.p999, 999.0)] {
            assert!(got >= exact && got <= exact * (1.0 + 1.0 / 1024.0), "{got} for {exact}");
        }
        // Sub-millisecond detail is kept (µs resolution).
        let mut m = MillisRecorder::new();
        for ms in [0.125, 0.375, 1.75] {
            m.record(ms);
        }
        let p = Percentiles::of(&m).map(|p| (p.p50, p.max));
        assert_eq!(p, Some((0.375, 1.75)));
        assert!(Percentiles::of(&MillisRecorder::new()).is_none());
    }

    #[test]
    fn cpu_of_this_process_is_read_and_charged_per_job() {
        assert!(cpu_ticks("self").is_some());
        let meter = CpuMeter::default();
        meter.start(&[std::process::id()]);
        // Burn a little CPU so the figures are not all zero at 100 ticks per second.
        let t0 = Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        assert_ne!(x, 1);
        let usage = meter.finish(&[std::process::id()]).expect("started");
        let mut rows = vec![Row::new("s", "w", Status::Ok)];
        rows[0].jobs = 10;
        usage.apply(&mut rows);
        assert!(rows[0].server_cpu_us_per_job.is_some_and(|v| v >= 0.0));
        assert!(rows[0].loadgen_cpu_pct.is_some());
        // Not local: no server figure, the bench's own still.
        let meter = CpuMeter::default();
        meter.start(&[]);
        let usage = meter.finish(&[]).expect("started");
        assert!(usage.server_s.is_none());
        assert!(usage.server_switches.is_none());
    }

    #[test]
    fn a_threads_name_cpu_and_switches_are_read_from_proc() {
        // The name may hold spaces and parentheses; the fields count from the last `)`.
        let stat = "4242 (rocksdb:lo (w) 12) S 1 2 3 4 5 6 7 8 9 10 250 31 0 0 20 0 1 0";
        let status = "Name:\trocksdb:low12\nvoluntary_ctxt_switches:\t40\n\
                      nonvoluntary_ctxt_switches:\t2\n";
        let t = parse_thread(stat, status).expect("parsed");
        assert_eq!(t, ThreadCounts { name: "rocksdb:lo (w)".into(), ticks: 281, switches: 42 });
        assert_eq!(parse_thread("garbage", ""), None);
    }

    /// Burns about `ms` of CPU on the calling thread.
    fn burn(ms: u64) {
        let t0 = Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < Duration::from_millis(ms) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }

    /// A thread that runs and sleeps during the measurement shows up under its name, with
    /// its own switches; one that burned CPU only before the measurement began does not.
    #[test]
    fn cpu_and_switches_are_split_by_thread() {
        let spawn = |name: &str, work: fn()| {
            let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
            let thread = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    work();
                    let _ = done_tx.send(());
                    // Alive until the readings: a thread that ended would take its counts.
                    std::thread::park();
                })
                .expect("spawn");
            done_rx.recv().expect("worked");
            thread
        };
        // 150 ms of CPU before the measurement begins: its ticks must not be charged.
        let before = spawn("bench-before3", || burn(150));
        let meter = CpuMeter::default();
        meter.start(&[std::process::id()]);
        let during = spawn("bench-during7", || {
            for _ in 0..10 {
                burn(15);
                // Each sleep is at least one voluntary switch.
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let usage = meter.finish(&[std::process::id()]).expect("started");
        let during_now = threads(std::process::id())
            .into_values()
            .find(|t| t.name == "bench-during")
            .expect("the thread is alive");
        for t in [before, during] {
            t.thread().unpark();
            t.join().expect("joined");
        }
        // It started after the mark, so all its switches fall inside the span: its ten sleeps
        // at least, before it signalled (its park may come after the reading, so the total is
        // held to the sleeps, not to the count read later).
        assert!(during_now.switches >= 10, "{during_now:?}");
        assert!(usage.server_switches.is_some_and(|n| n >= 10), "{usage:?}");
        let cpu = |name: &str| usage.server_s_by_thread.get(name).copied().unwrap_or(0.0);
        assert!(cpu("bench-during") > 0.0, "{usage:?}");
        assert!(cpu("bench-before") < 0.05, "CPU from before the mark charged: {usage:?}");
        let mut rows = vec![Row::new("s", "w", Status::Ok)];
        rows[0].jobs = 10;
        usage.apply(&mut rows);
        assert!(rows[0].server_switches_per_job.is_some_and(|n| n >= 1.0));
        let split = &rows[0].server_cpu_us_per_job_by_thread;
        assert!(split.get("bench-during").is_some_and(|us| *us > 0.0), "{split:?}");
    }

    #[test]
    fn budget_stops_at_the_job_count() {
        let b = Budget::new(Some(3), 60.0);
        assert!(b.take(1) && b.take(1) && b.take(1));
        assert!(!b.take(1));
    }
}
