//! The work a workload leaves behind. A delayd node flushes and compacts what a row wrote
//! after the row has ended, and Redis may be rewriting its AOF in a child process; either
//! way the CPU lands in whatever runs next. After each workload (and after a drain's preload)
//! the bench waits until that work is done, and charges the server CPU spent meanwhile to the
//! workload's jobs as a figure of its own, so a row neither carries the rows before it nor
//! leaves its own cost uncounted.
//!
//! Memtables that are not full are not flushed by the wait: a flush happens when one fills,
//! in whichever row that is.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::stats::{self, CpuMeter, CpuUsage, Row};

/// How long the bench waits for the work left behind before it goes on regardless (and says
/// so in the row's note).
pub const DEADLINE: Duration = Duration::from_secs(120);

/// How often the servers are asked.
const POLL: Duration = Duration::from_millis(100);

/// What a wait found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Settled {
    /// Nothing left to do after this long.
    Done(Duration),
    /// Still busy at the deadline.
    TimedOut(Duration),
    /// The servers could not say: a delayd build from before `delayd_rocksdb_background_jobs`,
    /// or a server that could not be asked (see [`wait`]).
    Unknown,
}

impl Settled {
    /// What a row says of a wait that ran out, about `what` was left behind; `None` for one
    /// that did not.
    pub fn timed_out_note(&self, what: &str) -> Option<String> {
        match self {
            Settled::TimedOut(d) => Some(format!("{what} not done after {:.0} s", d.as_secs_f64())),
            Settled::Done(_) | Settled::Unknown => None,
        }
    }

    /// A drain's row, noted when this wait, after its preload, ran out (the preload's work
    /// then ran beside the drain).
    pub fn note_preload(&self, row: Result<Row>) -> Result<Row> {
        let note = self.timed_out_note("the work the preload left behind (run beside the drain)");
        row.map(|mut row| {
            if let Some(note) = note {
                row.prefix_note(note);
            }
            row
        })
    }
}

/// Waits as [`until_idle`] does, up to [`DEADLINE`]. A server that could not be asked (a
/// target whose token may not read `/metrics`, a Redis that did not answer) makes the wait
/// [`Settled::Unknown`], with a line on stderr: the workload's own figures stand without it.
pub async fn wait<F, Fut>(busy: F) -> Settled
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<bool>>>,
{
    until_idle(DEADLINE, busy).await.unwrap_or_else(|e| {
        eprintln!("delayd-bench: cannot tell whether the servers are done: {e:#}");
        Settled::Unknown
    })
}

/// Waits until `busy` says the servers have nothing left to do, asking every [`POLL`] up to
/// `deadline`. `busy` answers `None` when the servers cannot tell.
pub async fn until_idle<F, Fut>(deadline: Duration, mut busy: F) -> Result<Settled>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<bool>>>,
{
    let start = Instant::now();
    loop {
        match busy().await? {
            None => return Ok(Settled::Unknown),
            Some(false) => return Ok(Settled::Done(start.elapsed())),
            Some(true) if start.elapsed() >= deadline => {
                return Ok(Settled::TimedOut(start.elapsed()))
            }
            Some(true) => tokio::time::sleep(POLL).await,
        }
    }
}

/// The delayd series that counts RocksDB's flushes and compactions, running and due.
const BACKGROUND_JOBS: &str = "delayd_rocksdb_background_jobs";

/// The flushes and compactions a node's scrape counts (running jobs and column families with
/// one due), or `None` when it has no such series.
pub fn background_jobs(scrape: &str) -> Option<f64> {
    let mut seen = false;
    let mut sum = 0.0;
    for line in scrape.lines() {
        let Some(rest) = line.strip_prefix(BACKGROUND_JOBS) else { continue };
        // The name must end where the labels or the value begin (not a longer name).
        if !rest.starts_with(['{', ' ']) {
            continue;
        }
        let value = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok())?;
        seen = true;
        sum += value;
    }
    seen.then_some(sum)
}

/// Whether any of the delayd nodes at `urls` is flushing or compacting, or has either due;
/// `None` when one does not report it.
pub async fn delayd_busy(http: &reqwest::Client, urls: &[String]) -> Result<Option<bool>> {
    let mut busy = false;
    for url in urls {
        let scrape = http
            .get(format!("{url}/metrics"))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .with_context(|| format!("{url}/metrics"))?
            .text()
            .await?;
        match background_jobs(&scrape) {
            None => return Ok(None),
            Some(n) => busy |= n > 0.0,
        }
    }
    Ok(Some(busy))
}

/// The servers' CPU from the end of a workload until its work was done.
pub struct After {
    /// What the wait found.
    pub settled: Settled,
    /// The CPU spent meanwhile; `None` when the processes are not the bench's own.
    pub usage: Option<CpuUsage>,
}

impl After {
    /// Waits as [`wait`] does and measures server processes `pids` meanwhile (from the first
    /// poll: the idle servers' own CPU and what answering the polls costs them count too, a
    /// few ms a second).
    pub async fn measure<F, Fut>(pids: &[u32], busy: F) -> After
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<bool>>>,
    {
        let cpu = CpuMeter::default();
        cpu.start(pids);
        let settled = wait(busy).await;
        After { settled, usage: cpu.finish(pids) }
    }

    /// Fills the after-figures of `rows`, which together completed the measured jobs: CPU per
    /// job over all of them, as [`CpuUsage::apply`] does. Rows that did not run get nothing.
    pub fn apply(&self, rows: &mut [Row]) {
        let secs = match self.settled {
            Settled::Done(d) | Settled::TimedOut(d) => d.as_secs_f64(),
            Settled::Unknown => return,
        };
        let server_s = self.usage.as_ref().and_then(|u| u.server_s);
        let note = self.settled.timed_out_note("work left behind (its CPU so far counted)");
        let jobs = stats::jobs_of_rows_that_ran(rows);
        let cpu = server_s.filter(|_| jobs > 0).map(|s| s * 1e6 / jobs as f64);
        for r in rows.iter_mut().filter(|r| stats::ran(r)) {
            r.after_secs = Some(secs);
            r.after_cpu_us_per_job = cpu;
            if let Some(note) = &note {
                r.prefix_note(note.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::stats::Status;

    #[test]
    fn background_jobs_are_summed_from_a_scrape() {
        let scrape = "\
# HELP delayd_rocksdb_background_jobs RocksDB's flushes and compactions
# TYPE delayd_rocksdb_background_jobs gauge
delayd_rocksdb_background_jobs{kind=\"compaction\",state=\"pending\"} 2
delayd_rocksdb_background_jobs{kind=\"compaction\",state=\"running\"} 1
delayd_rocksdb_background_jobs{kind=\"flush\",state=\"pending\"} 0
delayd_rocksdb_background_jobs{kind=\"flush\",state=\"running\"} 0
delayd_rocksdb_background_jobs_other 7
delayd_rocksdb_write_stopped 0
";
        assert_eq!(background_jobs(scrape), Some(3.0));
        let idle = scrape.replace("} 2", "} 0").replace("} 1", "} 0");
        assert_eq!(background_jobs(&idle), Some(0.0));
        // An older node without the series cannot say.
        assert_eq!(background_jobs("delayd_rocksdb_write_stopped 0\n"), None);
    }

    #[tokio::test]
    async fn the_wait_ends_once_idle_and_says_when_it_cannot_tell_or_gave_up() {
        let asked = AtomicU32::new(0);
        let busy_twice = || {
            let n = asked.fetch_add(1, Ordering::Relaxed);
            async move { Ok::<_, anyhow::Error>(Some(n < 2)) }
        };
        let settled = until_idle(Duration::from_secs(10), busy_twice).await.expect("wait");
        assert!(matches!(settled, Settled::Done(d) if d >= 2 * POLL), "{settled:?}");
        assert_eq!(asked.load(Ordering::Relaxed), 3);

        let unknown =
            until_idle(Duration::from_secs(10), || async { Ok::<_, anyhow::Error>(None) }).await;
        assert_eq!(unknown.expect("wait"), Settled::Unknown);

        let always =
            until_idle(Duration::from_millis(250), || async { Ok::<_, anyhow::Error>(Some(true)) })
                .await;
        assert!(
            matches!(always.expect("wait"), Settled::TimedOut(d) if d >= Duration::from_millis(250))
        );
    }

    #[test]
    fn the_after_figures_are_per_job_of_the_rows_that_ran() {
        let mut rows = vec![Row::new("s", "w", Status::Ok), Row::new("s", "w", Status::Skipped)];
        rows[0].jobs = 1000;
        let usage = CpuUsage {
            server_s: Some(0.5),
            server_switches: None,
            server_s_by_thread: Default::default(),
            server_s_by_pid: Default::default(),
            server_s_by_node: Default::default(),
            own_s: 0.0,
            wall_s: 1.0,
        };
        let after = After { settled: Settled::TimedOut(DEADLINE), usage: Some(usage) };
        after.apply(&mut rows);
        assert_eq!(rows[0].after_cpu_us_per_job, Some(500.0));
        assert_eq!(rows[0].after_secs, Some(DEADLINE.as_secs_f64()));
        assert!(rows[0].note.contains("not done after 120 s"), "{}", rows[0].note);
        assert_eq!(Settled::Done(DEADLINE).timed_out_note("x"), None);
        let drained =
            Settled::TimedOut(DEADLINE).note_preload(Ok(Row::new("s", "drain", Status::Ok)));
        assert!(drained.expect("row").note.contains("preload"), "the drain's row says so");
        assert_eq!(rows[1].after_secs, None);
        assert!(rows[1].note.is_empty());
    }
}
