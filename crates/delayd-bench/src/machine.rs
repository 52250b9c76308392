//! A reading of the machine itself, taken before any workload: how fast one core computes,
//! how long it takes to hand a message to a parked thread, and how long a small durable
//! append takes where the clusters keep their data.
//!
//! The benchmark's figures move with the machine as much as with the code: the same build has
//! run at less than half the speed on one fresh machine of a kind than on another, peers
//! included. Ratios within one run cancel that out; these three figures, printed and kept in
//! the report beside the results, let a reader tell a slower machine from slower code when
//! comparing runs of different days.

use std::io::Write;
use std::path::Path;
use std::sync::mpsc;
use std::time::Instant;

use anyhow::{Context, Result};
use delayd_percentiles::MillisRecorder;
use serde::Serialize;

use crate::cluster::Proc;
use crate::stats::ms_since;

/// Rounds of the compute loop: about 0.1 s on a current server core.
const COMPUTE_ROUNDS: u64 = 50_000_000;
/// Round trips between two threads.
const HANDOFFS: u32 = 5_000;
/// Synced appends.
const SYNCS: u32 = 100;

/// What [`probe`] read.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Machine {
    /// Wall time of a fixed integer loop on one core, ms, the best of three (lower is
    /// faster).
    pub compute_ms: f64,
    /// One hand-off of a message to a thread blocked waiting for it, and that thread's
    /// wake-up, µs: half a round trip between two threads. Every hop between delayd's threads
    /// (workers, the log syncer, RocksDB's) pays this.
    pub handoff_us: f64,
    /// The median `fdatasync` of a 200-byte append, ms, in the directory the clusters' data
    /// goes to.
    pub fdatasync_ms: f64,
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "compute {:.0} ms, thread hand-off {:.1} µs, fdatasync p50 {:.2} ms",
            self.compute_ms, self.handoff_us, self.fdatasync_ms
        )
    }
}

/// Reads the machine, syncing in a temporary file under `dir`. Takes about half a second
/// where a hand-off costs 50 µs, less where it is cheaper.
pub fn probe(dir: &Path) -> Result<Machine> {
    let fdatasync_ms = fdatasync(dir)?;
    let compute_ms = (0..3).map(|_| compute()).fold(f64::INFINITY, f64::min);
    Ok(Machine { compute_ms, handoff_us: handoff()?, fdatasync_ms })
}

/// An xorshift loop whose result is kept, so that it is computed.
fn compute() -> f64 {
    let started = Instant::now();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..COMPUTE_ROUNDS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    std::hint::black_box(x);
    ms_since(started)
}

/// Half the mean round trip of a token between two threads over rendezvous channels, where
/// each side blocks until the other answers.
fn handoff() -> Result<f64> {
    let (to_echo, echo_rx) = mpsc::sync_channel::<u32>(0);
    let (to_main, main_rx) = mpsc::sync_channel::<u32>(0);
    let echo = std::thread::Builder::new().name("bench-probe".into()).spawn(move || {
        while let Ok(n) = echo_rx.recv() {
            if to_main.send(n).is_err() {
                break;
            }
        }
    })?;
    let started = Instant::now();
    for i in 0..HANDOFFS {
        to_echo.send(i).context("the probe's echo thread ended")?;
        main_rx.recv().context("the probe's echo thread ended")?;
    }
    let elapsed = started.elapsed();
    drop(to_echo);
    let _ = echo.join();
    Ok(elapsed.as_secs_f64() * 1e6 / f64::from(HANDOFFS) / 2.0)
}

/// The median time of `fdatasync` after a 200-byte append, in a file created under `dir`,
/// summarised like every latency of the bench.
fn fdatasync(dir: &Path) -> Result<f64> {
    let mut file = tempfile::Builder::new()
        .prefix("delayd-bench-probe-")
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a file in {}", dir.display()))?;
    let record = [b'x'; 200];
    let mut took = MillisRecorder::new();
    for _ in 0..SYNCS {
        file.write_all(&record)?;
        let started = Instant::now();
        file.as_file().sync_data()?;
        took.record(ms_since(started));
    }
    Ok(took.summary().map_or(f64::NAN, |s| s.p50))
}

/// Processes that keep cores busy for as long as this value lives (`--cpu-hogs`): a machine
/// whose other work holds the cores, as on a host shared with other services or a build. Each
/// is a shell spinning in an empty loop at the bench's own priority (the default, unless the
/// bench was started niced), outside every system's measured processes and the bench's own.
///
/// Each is a [`Proc`], so it also ends once the bench's process is gone: a bench killed
/// outright (SIGKILL, or SIGTERM, which it does not catch) runs no `Drop`, and hogs left
/// spinning would skew every later run on the machine.
pub struct CpuHogs {
    /// Held for their `Drop`, which kills and reaps them.
    _hogs: Vec<Proc>,
}

impl CpuHogs {
    /// Starts `n` of them.
    pub fn start(n: u64) -> Result<CpuHogs> {
        let args = ["-c".to_string(), "while :; do :; done".to_string()];
        let hogs = (0..n)
            .map(|_| Proc::spawn(Path::new("sh"), &args, Path::new("/dev/null")))
            .collect::<Result<_>>()
            .context("cannot start a CPU hog (sh)")?;
        Ok(CpuHogs { _hogs: hogs })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_reading_has_every_figure_and_a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let m = probe(dir.path()).unwrap();
        for figure in [m.compute_ms, m.handoff_us, m.fdatasync_ms] {
            assert!(figure.is_finite() && figure > 0.0, "{m:?}");
        }
        // The probe's file is gone with the reading.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let gone = dir.path().join("missing");
        let err = probe(&gone).unwrap_err();
        assert!(format!("{err:#}").contains("missing"), "{err:#}");
    }

    /// Each hog is a running process that uses a core while it lives, and is gone once the
    /// guard is dropped.
    #[cfg(target_os = "linux")]
    #[test]
    fn cpu_hogs_spin_while_they_live_and_stop_with_the_guard() {
        let ticks = |pid: u32| crate::procstat::cpu_ticks(&pid.to_string());
        let hogs = CpuHogs::start(2).expect("start");
        assert_eq!(hogs._hogs.len(), 2);
        let pids: Vec<u32> = hogs._hogs.iter().filter_map(Proc::pid).collect();
        assert_eq!(pids.len(), 2);
        // A spinning process accrues CPU time; one clock tick (10 ms) of it is awaited, with
        // a deadline far beyond what a loaded machine needs.
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        for pid in &pids {
            while ticks(*pid).unwrap_or(0) == 0 {
                assert!(Instant::now() < deadline, "hog {pid} used no CPU in 30 s");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        drop(hogs);
        for pid in pids {
            // Reaped by the guard: the process no longer exists.
            assert!(ticks(pid).is_none(), "hog {pid} still runs after the guard was dropped");
        }
    }

    /// A hog spins while the bench lives, and stops by itself once the bench is gone, though
    /// its guard still lives (as when the bench is killed outright and runs no `Drop`).
    #[cfg(target_os = "linux")]
    #[test]
    fn cpu_hogs_stop_once_the_process_they_serve_is_gone() {
        let mut hogs = CpuHogs::start(1).unwrap();
        let hog = &mut hogs._hogs[0];
        let pid = hog.pid().unwrap().to_string();
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        // Spinning, as long as the bench lives: it has used CPU and not ended.
        while crate::procstat::cpu_ticks(&pid).unwrap_or(0) == 0 {
            assert!(hog.check_alive().is_ok(), "the hog ended while the bench lived");
            assert!(Instant::now() < deadline, "the hog used no CPU in 30 s");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(hog.check_alive().is_ok(), "the hog ended while the bench lived");
        hog.as_if_the_bench_died();
        while hog.check_alive().is_ok() {
            assert!(Instant::now() < deadline, "the hog still spins after the bench ended");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
