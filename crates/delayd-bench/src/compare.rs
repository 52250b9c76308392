//! Comparing two delayd builds (`--compare-bin`): whether a change pays, told from this
//! machine's noise.
//!
//! On a shared 2-core machine a workload's jobs/s and CPU per job move by 10–20 % between
//! runs of the same build, more than most single changes are worth, and three runs of each
//! side can point either way. So the bench runs the same delayd workloads with build A
//! (`--bin`) and build B (`--compare-bin`) in pairs, each run on fresh clusters, in the order
//! A B, B A, A B, … (so that a drift of the machine over the session weighs on both sides
//! alike), and reports for every row the per-pair ratios B ÷ A, their median, and in how many
//! pairs B did better. Beside jobs/s and CPU per job it compares the p99 latency (lateness,
//! for the timer rows, whose rate is fixed by the workload). A change is worth keeping when B does better in most pairs, not when
//! one pair's ratio looks good.
//!
//! The runs' rows carry the pair in their system name (`… [A1]`, `… [B1]`, …); this module
//! groups them back.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::report;
use crate::stats::{Row, Status};

/// The label of run `side` (`'A'` or `'B'`) of pair `pair` (from 1), put at the end of the
/// system name of its rows.
pub fn label(side: char, pair: usize) -> String {
    format!("[{side}{pair}]")
}

/// Which side runs first in pair `pair` (from 1): A in odd pairs, B in even ones.
pub fn order(pair: usize) -> [char; 2] {
    if pair % 2 == 1 {
        ['A', 'B']
    } else {
        ['B', 'A']
    }
}

/// One pair's figures for one row: A's, then B's.
#[derive(Debug, PartialEq, Serialize)]
pub struct Pair {
    pub jobs_per_s: (f64, f64),
    /// Server CPU per job, µs: over the workload and after it, until the work it left
    /// behind was done (a change that only defers work to RocksDB's compactions does not
    /// look cheaper).
    pub cpu_us_per_job: (f64, f64),
    /// The rows' p99 latency (or lateness), ms, when both have one.
    pub p99_ms: Option<(f64, f64)>,
}

/// One row of the comparison: a workload at one client level on one cluster size, over every
/// pair in which both sides finished it.
#[derive(Debug, Serialize)]
pub struct Comparison {
    /// The system without the pair's label, e.g. `delayd 3 nodes (auth) via the leader`.
    pub system: String,
    pub workload: String,
    pub clients: Option<usize>,
    pub pairs: Vec<Pair>,
    /// Median of B ÷ A over the pairs' jobs/s.
    pub jobs_per_s_ratio: Option<f64>,
    /// Median of B ÷ A over the pairs' CPU per job.
    pub cpu_ratio: Option<f64>,
    /// Median of B ÷ A over the pairs' p99 latency.
    pub p99_ratio: Option<f64>,
    /// Pairs in which B did more jobs/s than A.
    pub b_faster: usize,
    /// Pairs in which B spent less CPU per job than A.
    pub b_cheaper: usize,
}

/// Splits `system` into the system proper and its pair label's side and number.
fn unlabel(system: &str) -> Option<(&str, char, usize)> {
    let (base, tag) = system.rsplit_once(" [")?;
    let tag = tag.strip_suffix(']')?;
    let mut chars = tag.chars();
    let side = chars.next().filter(|c| *c == 'A' || *c == 'B')?;
    let pair = chars.as_str().parse().ok()?;
    Some((base, side, pair))
}

/// The median of `v`, `None` when it is empty.
pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 })
}

/// A row's jobs/s, CPU per job (its after-figure included) and p99 latency, when it has the
/// first two and they can be divided by.
fn figures(r: &Row) -> Option<(f64, f64, Option<f64>)> {
    let jobs = r.jobs_per_s?;
    let cpu = r.server_cpu_us_per_job? + r.after_cpu_us_per_job.unwrap_or(0.0);
    let p99 = r.latency_ms.map(|l| l.p99).filter(|p| *p > 0.0);
    (jobs > 0.0 && cpu > 0.0).then_some((jobs, cpu, p99))
}

/// Groups the labelled rows of a comparison run by system, workload and client level, and
/// pairs A's with B's. Rows without a label (the peers), failed rows and pairs with a side
/// missing are left out.
pub fn compare(rows: &[Row]) -> Vec<Comparison> {
    // Per system, workload and client level; per pair: A's figures and B's.
    type Key = (String, String, Option<usize>);
    type Sides = [Option<(f64, f64, Option<f64>)>; 2];
    let mut sides: BTreeMap<Key, BTreeMap<usize, Sides>> = BTreeMap::new();
    for row in rows.iter().filter(|r| r.status == Status::Ok) {
        let (Some((base, side, pair)), Some(f)) = (unlabel(&row.system), figures(row)) else {
            continue;
        };
        let key = (base.to_owned(), row.workload.clone(), row.clients);
        let slot = sides.entry(key).or_default().entry(pair).or_default();
        slot[usize::from(side == 'B')] = Some(f);
    }
    sides
        .into_iter()
        .map(|((system, workload, clients), by_pair)| {
            let pairs: Vec<Pair> = by_pair
                .values()
                .filter_map(|[a, b]| {
                    let ((ja, ca, pa), (jb, cb, pb)) = ((*a)?, (*b)?);
                    let p99_ms = pa.zip(pb);
                    Some(Pair { jobs_per_s: (ja, jb), cpu_us_per_job: (ca, cb), p99_ms })
                })
                .collect();
            let ratios = |f: fn(&Pair) -> Option<(f64, f64)>| {
                median(pairs.iter().filter_map(f).map(|(a, b)| b / a).collect())
            };
            Comparison {
                system,
                workload,
                clients,
                jobs_per_s_ratio: ratios(|p| Some(p.jobs_per_s)),
                cpu_ratio: ratios(|p| Some(p.cpu_us_per_job)),
                p99_ratio: ratios(|p| p.p99_ms),
                b_faster: pairs.iter().filter(|p| p.jobs_per_s.1 > p.jobs_per_s.0).count(),
                b_cheaper: pairs.iter().filter(|p| p.cpu_us_per_job.1 < p.cpu_us_per_job.0).count(),
                pairs,
            }
        })
        .collect()
}

/// The comparison as a plain-text table, one line per row.
pub fn table(comparisons: &[Comparison]) -> String {
    let mut out = format!(
        "{:<40} {:<22} {:>3}  {:>10} {:>6}  {:>10} {:>6}  {:>7}  per pair, A → B\n",
        "system", "workload", "c", "jobs/s B÷A", "B more", "µs/job B÷A", "B less", "p99 B÷A"
    );
    for c in comparisons {
        let pairs: Vec<String> = c
            .pairs
            .iter()
            .map(|p| {
                let ((ja, jb), (ca, cb)) = (p.jobs_per_s, p.cpu_us_per_job);
                let mut pair = format!("{ja:.0} → {jb:.0}/s, {ca:.0} → {cb:.0} µs");
                if let Some((pa, pb)) = p.p99_ms {
                    let _ = write!(pair, ", p99 {pa:.1} → {pb:.1} ms");
                }
                pair
            })
            .collect();
        let _ = writeln!(
            out,
            "{:<40} {:<22} {:>3}  {:>10} {:>6}  {:>10} {:>6}  {:>7}  {}",
            c.system,
            c.workload,
            report::clients(c.clients),
            report::opt(c.jobs_per_s_ratio, 3),
            format!("{}/{}", c.b_faster, c.pairs.len()),
            report::opt(c.cpu_ratio, 3),
            format!("{}/{}", c.b_cheaper, c.pairs.len()),
            report::opt(c.p99_ratio, 3),
            pairs.join("; "),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Percentiles;

    fn row(system: &str, workload: &str, jobs_per_s: f64, cpu: f64) -> Row {
        let mut r = Row::failed(system, workload, &anyhow::anyhow!("unused"));
        r.status = Status::Ok;
        r.jobs_per_s = Some(jobs_per_s);
        r.server_cpu_us_per_job = Some(cpu);
        r.clients = Some(64);
        // p99 in proportion to the CPU, to check its ratio too.
        r.latency_ms = Some(Percentiles {
            n: 1,
            p50: cpu / 20.0,
            p99: cpu / 10.0,
            p999: cpu / 10.0,
            max: cpu / 10.0,
        });
        r
    }

    #[test]
    fn pairs_are_matched_by_label_and_summarised_by_median_and_count() {
        let d = "delayd 3 nodes";
        let rows = vec![
            row(&format!("{d} {}", label('A', 1)), "publish-http", 100.0, 50.0),
            row(&format!("{d} {}", label('B', 1)), "publish-http", 110.0, 40.0),
            row(&format!("{d} {}", label('B', 2)), "publish-http", 90.0, 60.0),
            row(&format!("{d} {}", label('A', 2)), "publish-http", 100.0, 50.0),
            row(&format!("{d} {}", label('A', 3)), "publish-http", 100.0, 50.0),
            row(&format!("{d} {}", label('B', 3)), "publish-http", 120.0, 45.0),
            // A pair with one side missing is left out; so are the peers.
            row(&format!("{d} {}", label('A', 4)), "publish-http", 1.0, 1.0),
            row("lmstfy-redis (appendfsync always)", "publish", 500.0, 10.0),
        ];
        let c = compare(&rows);
        assert_eq!(c.len(), 1, "{c:?}");
        let c = &c[0];
        assert_eq!((c.system.as_str(), c.workload.as_str()), (d, "publish-http"));
        let jobs: Vec<(f64, f64)> = c.pairs.iter().map(|p| p.jobs_per_s).collect();
        assert_eq!(jobs, vec![(100.0, 110.0), (100.0, 90.0), (100.0, 120.0)]);
        assert_eq!(c.jobs_per_s_ratio, Some(1.1));
        assert_eq!((c.b_faster, c.b_cheaper), (2, 2));
        assert_eq!(c.cpu_ratio, Some(0.9));
        assert_eq!(c.p99_ratio, c.cpu_ratio);
        let table = table(&[]);
        assert!(table.starts_with("system"), "{table}");
        let line = super::table(std::slice::from_ref(c));
        assert!(line.contains("100 → 110/s, 50 → 40 µs, p99 5.0 → 4.0 ms; 100 → 90/s"), "{line}");
    }

    /// Work a row left behind counts in its CPU per job: B, which spent less during the row
    /// but more after it, is not the cheaper side.
    #[test]
    fn cpu_per_job_counts_the_work_left_behind() {
        let d = "delayd 1 node";
        let mut a = row(&format!("{d} {}", label('A', 1)), "drain", 100.0, 50.0);
        a.after_cpu_us_per_job = Some(2.0);
        let mut b = row(&format!("{d} {}", label('B', 1)), "drain", 100.0, 40.0);
        b.after_cpu_us_per_job = Some(20.0);
        let c = compare(&[a, b]);
        assert_eq!(c[0].pairs[0].cpu_us_per_job, (52.0, 60.0));
        assert_eq!(c[0].b_cheaper, 0);
    }

    #[test]
    fn the_order_alternates_and_labels_round_trip() {
        assert_eq!(order(1), ['A', 'B']);
        assert_eq!(order(2), ['B', 'A']);
        assert_eq!(
            unlabel(&format!("delayd 1 node {}", label('B', 12))),
            Some(("delayd 1 node", 'B', 12))
        );
        assert_eq!(unlabel("delayd 1 node"), None);
        assert_eq!(unlabel("delayd [C1]"), None);
    }
}
