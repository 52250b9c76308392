//! Rendering: the stdout table, the ratios delayd / peer (beanstalkd, lmstfy-redis), the JSON
//! file, and the
//! markdown report with hand-written SVG charts (no scripts, no external resources, so the
//! report renders the same on GitHub, in a browser or offline).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;
use serde_json::Value;

use crate::stats::{Row, Status};

/// Which delayd workload is compared with which workload of a peer (when the peer ran it).
const PAIRS: [(&str, &str); 11] = [
    ("publish-http", "publish"),
    ("publish-bulk", "publish"),
    ("publish-grpc-stream", "publish"),
    ("drain", "drain"),
    ("drain-lease", "drain"),
    ("drain-ackfirst", "drain"),
    ("drain-count10", "drain"),
    ("drain-count10-ackfirst", "drain"),
    ("lifecycle", "lifecycle"),
    ("disque-add", "publish"),
    ("disque-drain", "drain"),
];

/// The systems delayd is compared with, by the start of their labels.
const PEERS: [&str; 2] = ["beanstalkd", "lmstfy-redis"];

/// delayd's rate over a peer's, for one workload pair at one client count, measured in the
/// same run.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// The delayd system, e.g. `delayd 3 nodes`.
    pub delayd: String,
    /// The delayd workload.
    pub delayd_workload: String,
    /// The peer system, e.g. a beanstalkd mode or `lmstfy-redis …`.
    pub peer: String,
    /// The peer's workload it is compared with.
    pub peer_workload: String,
    /// Concurrent clients on both sides (rows are compared only at equal counts).
    pub clients: Option<usize>,
    /// delayd jobs/s ÷ peer jobs/s.
    pub ratio: f64,
}

/// Every ratio the rows allow.
pub fn ratios(rows: &[Row]) -> Vec<Ratio> {
    let ok = |r: &&Row| r.status == Status::Ok && r.jobs_per_s.is_some_and(|v| v > 0.0);
    let is_peer = |r: &&Row| PEERS.iter().any(|p| r.system.starts_with(p));
    let mut out = Vec::new();
    for d in rows.iter().filter(ok).filter(|r| r.system.starts_with("delayd")) {
        for (dw, pw) in PAIRS.iter().filter(|(dw, _)| *dw == d.workload) {
            for p in rows.iter().filter(ok).filter(is_peer) {
                if p.workload == *pw && p.clients == d.clients {
                    if let (Some(x), Some(y)) = (d.jobs_per_s, p.jobs_per_s) {
                        out.push(Ratio {
                            delayd: d.system.clone(),
                            delayd_workload: dw.to_string(),
                            peer: p.system.clone(),
                            peer_workload: pw.to_string(),
                            clients: d.clients,
                            ratio: x / y,
                        });
                    }
                }
            }
        }
    }
    out
}

/// The label of round `round` (from 1) of a `--rounds` run, put at the end of its rows'
/// system names.
pub fn round_label(round: usize) -> String {
    format!("(round {round})")
}

/// `system` without its round label, and the round; `None` for a name without one.
fn without_round(system: &str) -> Option<(&str, usize)> {
    let (base, tag) = system.rsplit_once(" (round ")?;
    Some((base, tag.strip_suffix(')')?.parse().ok()?))
}

/// One ratio to a peer over the rounds of a `--rounds` run.
#[derive(Debug, Clone, Serialize)]
pub struct OverRounds {
    /// The delayd system without its round label.
    pub delayd: String,
    pub delayd_workload: String,
    /// The peer without its round label.
    pub peer: String,
    pub peer_workload: String,
    pub clients: Option<usize>,
    /// Each round's ratio, in round order (a round whose row failed has none).
    pub ratios: Vec<f64>,
    /// Their median.
    pub median: f64,
}

/// Groups per-round ratios (each taken within its round) by what they compare, in the order
/// first seen; ratios without a round label are left out.
pub fn over_rounds(ratios: &[Ratio]) -> Vec<OverRounds> {
    let mut out: Vec<OverRounds> = Vec::new();
    for r in ratios {
        let (Some((delayd, _)), Some((peer, _))) =
            (without_round(&r.delayd), without_round(&r.peer))
        else {
            continue;
        };
        let same = |o: &&mut OverRounds| {
            o.delayd == delayd
                && o.delayd_workload == r.delayd_workload
                && o.peer == peer
                && o.peer_workload == r.peer_workload
                && o.clients == r.clients
        };
        match out.iter_mut().find(same) {
            Some(o) => o.ratios.push(r.ratio),
            None => out.push(OverRounds {
                delayd: delayd.to_string(),
                delayd_workload: r.delayd_workload.clone(),
                peer: peer.to_string(),
                peer_workload: r.peer_workload.clone(),
                clients: r.clients,
                ratios: vec![r.ratio],
                median: 0.0,
            }),
        }
    }
    for o in &mut out {
        o.median = crate::compare::median(o.ratios.clone()).unwrap_or(f64::NAN);
    }
    out
}

/// An over-rounds line's cells, for the text table and the report alike: what it compares,
/// its median, and every round's figure; ratios end in `unit` and rounds are joined by `sep`.
fn over_rounds_cells(o: &OverRounds, unit: &str, sep: &str) -> [String; 7] {
    let each: Vec<String> = o.ratios.iter().map(|r| format!("{r:.2}{unit}")).collect();
    [
        o.delayd.clone(),
        o.delayd_workload.clone(),
        clients(o.clients),
        o.peer.clone(),
        o.peer_workload.clone(),
        format!("{:.2}{unit}", o.median),
        each.join(sep),
    ]
}

/// The ratios over the rounds as plain text: median, then each round's.
pub fn over_rounds_table(over: &[OverRounds]) -> String {
    let line = |c: &[String; 7]| {
        format!(
            "{:<36} {:<22} {:>3} {:<36} {:<10} {:>7}  {}\n",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6]
        )
    };
    let header =
        ["delayd", "workload", "c", "vs", "workload", "median", "rounds"].map(String::from);
    let mut s = line(&header);
    for o in over {
        let mut cells = over_rounds_cells(o, "", " ");
        cells[5].push('x');
        s.push_str(&line(&cells));
    }
    s
}

/// `v` with `prec` decimals, or `-`.
pub(crate) fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.prec$}"))
}

/// A client level, or `-` for a workload without one.
pub(crate) fn clients(c: Option<usize>) -> String {
    c.map_or("-".to_string(), |c| c.to_string())
}

/// A row's workload with its client count, for charts where one workload runs at several.
fn workload_label(r: &Row) -> String {
    match r.clients {
        Some(c) => format!("{} c={c}", r.workload),
        None => r.workload.clone(),
    }
}

fn status(r: &Row) -> &'static str {
    match r.status {
        Status::Ok => "ok",
        Status::Failed => "FAILED",
        Status::Skipped => "skipped",
        Status::Unavailable => "n/a",
    }
}

/// One line of the plain-text results table: the header and the rows share the column widths.
macro_rules! table_line {
    ($($cell:expr),* $(,)?) => {
        format!(
            concat!(
                "{:<36} {:<20} {:>3} {:>7} {:>11} {:>9} {:>9} {:>9} {:>9} ",
                "{:>11} {:>10} {:>10} {:>6} {:>6} {:>5}  {}"
            ),
            $($cell),*
        )
    };
}

/// The results table as plain text (also used for one row at a time while running). `srv
/// µs/job` is the servers' CPU per job, `aft µs/job` their CPU per job after the workload
/// until the work it left behind was done, `srv cs/job` their context switches per job,
/// `gen %` the bench's own CPU in percent of one core.
pub fn table_header() -> String {
    table_line!(
        "system",
        "workload",
        "c",
        "status",
        "jobs/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms",
        "srv µs/job",
        "aft µs/job",
        "srv cs/job",
        "gen %",
        "errors",
        "early",
        "note"
    )
}

/// One row of the plain-text table.
pub fn table_row(r: &Row) -> String {
    let l = r.latency_ms;
    table_line!(
        r.system,
        r.workload,
        clients(r.clients),
        status(r),
        opt(r.jobs_per_s, 0),
        opt(l.map(|l| l.p50), 2),
        opt(l.map(|l| l.p99), 2),
        opt(l.map(|l| l.p999), 2),
        opt(l.map(|l| l.max), 2),
        opt(r.server_cpu_us_per_job, 0),
        opt(r.after_cpu_us_per_job, 0),
        opt(r.server_switches_per_job, 1),
        opt(r.loadgen_cpu_pct, 0),
        r.errors,
        r.early.map_or("-".to_string(), |e| e.to_string()),
        r.note
    )
}

/// The ratio table as plain text.
pub fn ratio_table(ratios: &[Ratio]) -> String {
    let mut s = format!(
        "{:<23} {:<20} {:>3} {:<36} {:<10} {:>8}\n",
        "delayd", "workload", "c", "vs", "workload", "ratio"
    );
    for r in ratios {
        let _ = writeln!(
            s,
            "{:<23} {:<20} {:>3} {:<36} {:<10} {:>7.2}x",
            r.delayd,
            r.delayd_workload,
            clients(r.clients),
            r.peer,
            r.peer_workload,
            r.ratio
        );
    }
    s
}

/// Writes `{meta, rows, ratios}` as JSON.
pub fn write_json(path: &Path, meta: &Value, rows: &[Row], ratios: &[Ratio]) -> Result<()> {
    let v = serde_json::json!({"meta": meta, "rows": rows, "ratios": ratios});
    std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
    Ok(())
}

/// Writes `report.md` and its SVG charts into `dir`.
pub fn write_report(
    dir: &Path,
    meta: &Value,
    rows: &[Row],
    ratios: &[Ratio],
    over: &[OverRounds],
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut md = String::from("# delayd benchmark\n\n");
    let _ = writeln!(md, "Run: `{}`\n", meta["command"].as_str().unwrap_or(""));
    let m = &meta["machine"];
    let _ = writeln!(
        md,
        "Machine: {} CPUs; one core's compute loop {:.0} ms, a thread hand-off {:.1} µs, \
         `fdatasync` p50 {:.2} ms (read before the run; see benchmarks.md); delayd binary `{}`; \
         started {} (unix s). Figures from one run on a shared machine: compare systems \
         through the ratios, measured side by side.\n",
        meta["cpus"],
        m["compute_ms"].as_f64().unwrap_or(f64::NAN),
        m["handoff_us"].as_f64().unwrap_or(f64::NAN),
        m["fdatasync_ms"].as_f64().unwrap_or(f64::NAN),
        meta["delayd_bin"].as_str().unwrap_or("?"),
        meta["started_unix_s"]
    );
    if let Some(hogs) = meta["cpu_hogs"].as_u64().filter(|n| *n > 0) {
        let _ = writeln!(
            md,
            "Every system ran beside {hogs} processes spinning at the bench's own CPU priority \
             (`--cpu-hogs`): cores held by other work.\n"
        );
    }
    md.push_str("## Results\n\n");
    md.push_str(
        "`c` is the number of concurrent clients; `server CPU µs/job` the CPU time (user + \
         system) of every server process of the system over the measured part of the workload, \
         per job, children it reaped included; `after: CPU µs/job (s)` the same processes' CPU \
         from the end of the workload until the work it left behind was done (a delayd node's \
         RocksDB flushes and compactions, a Redis AOF rewrite or RDB save), per job, and how long that \
         took: a cost of the row's jobs that its measured span did not see, and that the next \
         row no longer carries; `server switches/job` the context switches of every server thread over the \
         same span, per job (a lower bound: threads that ended are not counted); `load-gen CPU \
         %` the bench process's own CPU time over the same span, in percent of one core (on a \
         shared 2-core machine the load generator competes with the server for the same \
         cores).\n\n",
    );
    md.push_str(
        "| system | workload | c | status | jobs/s | latency of | p50 ms | p99 ms | p99.9 ms \
         | max ms | server CPU µs/job | after: CPU µs/job (s) | server switches/job \
         | load-gen CPU % | errors | early | note |\n\
         |---|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        let l = r.latency_ms;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.system,
            r.workload,
            clients(r.clients),
            status(r),
            opt(r.jobs_per_s, 0),
            r.latency_of,
            opt(l.map(|l| l.p50), 2),
            opt(l.map(|l| l.p99), 2),
            opt(l.map(|l| l.p999), 2),
            opt(l.map(|l| l.max), 2),
            opt(r.server_cpu_us_per_job, 0),
            after(r),
            opt(r.server_switches_per_job, 1),
            opt(r.loadgen_cpu_pct, 0),
            r.errors,
            r.early.map_or("-".to_string(), |e| e.to_string()),
            r.note.replace('|', "\\|")
        );
    }
    md.push_str(&by_thread_md(rows));
    md.push_str(&by_node_md(rows));
    md.push_str(&by_due_second_md(rows));
    if !ratios.is_empty() {
        md.push_str("\n## delayd ÷ peers (same run, same client count)\n\n");
        md.push_str(
            "| delayd | workload | c | peer | workload | ratio |\n|---|---|---:|---|---|---:|\n",
        );
        for r in ratios {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {:.2}× |",
                r.delayd,
                r.delayd_workload,
                clients(r.clients),
                r.peer,
                r.peer_workload,
                r.ratio
            );
        }
    }
    if !over.is_empty() {
        let _ = write!(
            md,
            "\n## delayd ÷ peers over {} rounds\n\nEach round ran every system once, in the \
             same order; a round's ratio is taken within it. The median, then each round's.\n\n\
             | delayd | workload | c | peer | workload | median | each round |\n\
             |---|---|---:|---|---|---:|---|\n",
            meta["rounds"]
        );
        for o in over {
            let _ = writeln!(md, "| {} |", over_rounds_cells(o, "×", ", ").join(" | "));
        }
    }
    md.push_str("\n## Charts\n\n");
    std::fs::write(dir.join("throughput.svg"), throughput_svg(rows))?;
    md.push_str("![throughput](throughput.svg)\n\n");
    std::fs::write(dir.join("latency.svg"), latency_svg(rows))?;
    md.push_str("![latency percentiles](latency.svg)\n\n");
    if rows.iter().any(|r| r.extra.contains_key("lateness_histogram")) {
        std::fs::write(dir.join("lateness.svg"), lateness_svg(rows))?;
        md.push_str("![timer lateness](lateness.svg)\n\n");
    }
    if !ratios.is_empty() {
        std::fs::write(dir.join("ratios.svg"), ratios_svg(ratios))?;
        md.push_str("![ratios](ratios.svg)\n\n");
    }
    md.push_str(WORKLOADS_MD);
    std::fs::write(dir.join("report.md"), md)?;
    Ok(())
}

/// A row's after-figures as `µs (s)`: `12 (3.4 s)`, `- (0.0 s)` without CPU, `-` when the
/// servers could not say.
fn after(r: &Row) -> String {
    match r.after_secs {
        Some(s) => format!("{} ({s:.1} s)", opt(r.after_cpu_us_per_job, 0)),
        None => "-".to_string(),
    }
}

/// The timer rows' p99 lateness in each second of due time, as a Markdown section; empty
/// when no row has it. It tells a tail made by one stall from a slow start or a backlog that
/// grows through the run.
fn by_due_second_md(rows: &[Row]) -> String {
    let lines = rows.iter().filter_map(|r| {
        let seconds = r.extra.get("lateness_by_due_second")?.as_array()?;
        let p99s: Vec<String> = seconds
            .iter()
            .filter_map(|s| Some(format!("{:.0}", s.get("p99")?.as_f64()?)))
            .collect();
        Some((r, p99s.join(" ")))
    });
    per_row_md(
        "Timer lateness by due second",
        "p99 lateness in ms of the jobs due in each second of the run, first second first.",
        "p99 ms by due second",
        lines,
    )
}

/// Where each row's server CPU went, by thread name, as a Markdown section; empty when no
/// row has the split (the processes were not the bench's own).
fn by_thread_md(rows: &[Row]) -> String {
    let lines = rows.iter().filter(|r| !r.server_cpu_us_per_job_by_thread.is_empty()).map(|r| {
        let mut threads: Vec<(&String, &f64)> = r.server_cpu_us_per_job_by_thread.iter().collect();
        threads.sort_by(|a, b| b.1.total_cmp(a.1));
        // Shares that print as 0 are left out (judged on the printed figure: formatting
        // rounds half to even, `f64::round` does not).
        let text: Vec<String> = threads
            .iter()
            .map(|(name, us)| (name, format!("{us:.0}")))
            .filter(|(_, us)| us != "0")
            .map(|(name, us)| format!("`{name}` {us}"))
            .collect();
        (r, text.join(", "))
    });
    per_row_md(
        "Server CPU per job, by thread",
        "µs per job spent by each kind of server thread (threads named alike added up; a \
         thread that ended during the workload is missing; shares that round to 0 µs are left \
         out).",
        "µs/job by thread",
        lines,
    )
}

/// Where each row's server CPU went, by delayd node, as a Markdown section; empty when no row
/// ran on more than one node.
fn by_node_md(rows: &[Row]) -> String {
    let lines = rows.iter().filter(|r| r.server_cpu_us_per_job_by_node.len() > 1).map(|r| {
        let text: Vec<String> = r
            .server_cpu_us_per_job_by_node
            .iter()
            .map(|(node, us)| format!("{node} {us:.0}"))
            .collect();
        (r, text.join(", "))
    });
    per_row_md(
        "Server CPU per job, by node",
        "µs per job spent by each delayd node, the leader named as it was when the workload \
         began.",
        "µs/job by node",
        lines,
    )
}

/// A Markdown section `heading` with `intro` and a table of one line per row: system,
/// workload, clients and `column`; empty when there are no lines.
fn per_row_md<'a>(
    heading: &str,
    intro: &str,
    column: &str,
    lines: impl Iterator<Item = (&'a Row, String)>,
) -> String {
    let mut md = String::new();
    for (r, text) in lines {
        if md.is_empty() {
            let _ = write!(
                md,
                "\n## {heading}\n\n{intro}\n\n| system | workload | c | {column} |\n\
                 |---|---|---:|---|\n"
            );
        }
        let _ = writeln!(md, "| {} | {} | {} | {text} |", r.system, r.workload, clients(r.clients));
    }
    md
}

/// What each workload does, for the report's readers.
const WORKLOADS_MD: &str = "## Workloads\n\n\
- **publish-http**: C closed-loop clients, one `PUT /api/{ns}/{q}?delay_ms=…` of 100 bytes each, spread over all nodes (with `--via-leader`, all on the leader). Every closed-loop client of every workload sends over a keep-alive connection of its own, as wrk's do.\n\
- **publish-bulk**: the same with `PUT …/bulk`, 64 jobs of 100 bytes per request (jobs/s counts jobs).\n\
- **publish-grpc-stream**: gRPC `PublishStream` through `delayd-client`.\n\
- **drain**: N ready jobs preloaded, then C consumers `GET ?ttr=30&timeout=1` + `DELETE …/job/{id}` (the ack lmstfy's clients send: by id, no lease); jobs/s until the last ack. The preload is left out of the CPU figures.\n\
- **drain-lease**: the same, the ack showing the reserve's lease, `DELETE …/job/{id}?lease=…` (removed only while that lease is current, so answered once applied; lmstfy has no such check).\n\
- **drain-ackfirst**: the same, but each consumer acks its previous job on its next reserve, `GET ?ttr=30&timeout=0&ack={id}&ack_lease={lease}` (one request per job; the answer's `Delayd-Acked` header says the ack took); the jobs still held once all are taken are acked with a plain `DELETE`.\n\
- **drain-count10**: the same with `GET ?ttr=30&timeout=1&count=10` (an array of up to 10 jobs), then a `DELETE` (no lease) for each; latency per round.\n\
- **drain-count10-ackfirst**: `GET ?ttr=30&timeout=0&count=10` carrying the acks of every job the previous reserve handed out, `&ack={id1},{id2},…&ack_lease={lease1},{lease2},…` (one request per round of up to 10 jobs; the `Delayd-Acked` header says which acks took); latency per round.\n\
- **lifecycle**: C/2 producers (delay 0) and C/2 consumers (reserve + `DELETE` without a lease) together for T s; acked jobs/s; latency is delivery − due.\n\
- **timer**: R jobs/s coming due over S s, each published a lead time ahead; C consumers long-poll; lateness = delivery wall time − server `due_at_ms`; early deliveries must be 0. The consumers reserve one job and ack it with a `DELETE` without a lease (**timer**), reserve one job carrying the ack of the previous one (**timer-ackfirst**), or reserve up to 10 carrying the acks of every job of their previous reserve (**timer-count10-ackfirst**).\n\
- **publish-latency**: open-loop single publishes at a fixed offered rate; latency from each request's intended send time.\n\
- **storage N**: bulk-published jobs delayed by 1 day up to N stored; RSS (`VmRSS`) and disk (`du`) per node once the followers have applied every job, and the disk again once no flush or compaction is running or due (\"settled\"; the next step starts after that).\n\
- **failover**: light publish load over all nodes, `kill -9` of the leader, time to the first successful publish sent after the kill.\n\
- **beanstalkd publish / drain**: `put` one job at a time / `reserve-with-timeout 1` + `delete`, C connections, same bodies.\n\
- **lmstfy-redis publish / drain / lifecycle / timer**: the Redis commands lmstfy's Redis engine issues, with its round trips, against a `redis-server` with `appendfsync always` started by the bench: publish `SET j/… EX ttl NX` + `LPUSH` (delay 0) or `ZADD` on the timer (now + delay, whole seconds); reserve `BRPOP` + `ZADD` (back on the timer at now + ttr, one try fewer) + `GET`/`TTL` pipelined; ack `DEL`; a pump runs a Lua script once a second moving due timer members (100 at a time) to the ready list or the dead letters. No HTTP layer: an upper bound for lmstfy. Its timer lateness is measured from the whole-second score lmstfy stores.\n\
- **CPU**: `/proc/<pid>/stat` utime + stime (and cutime + cstime: the children a server reaped, such as Redis's AOF rewrites) of every server process the bench started (all delayd nodes, beanstalkd, redis-server) before and after each workload, per job completed; none for `--target`.\n\
- **After each workload** the bench waits (up to 120 s) until the servers are done with the work it left behind: every delayd node's `delayd_rocksdb_background_jobs` at 0 (no flush or compaction running or due), no Redis AOF rewrite or RDB save running or scheduled; beanstalkd leaves none. The servers' CPU over that wait is the row's `after` figure. Drains wait the same way after their preload, before their measured span. Memtables that are not full are not flushed: that happens in whichever row fills them.\n";

/// Escapes text for SVG.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

const COLORS: [&str; 6] = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1"];

/// A color per system, stable within one chart.
fn color_of(systems: &[String], s: &str) -> &'static str {
    let i = systems.iter().position(|x| x == s).unwrap_or(0);
    COLORS[i % COLORS.len()]
}

fn systems(rows: &[&Row]) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for r in rows {
        if !v.contains(&r.system) {
            v.push(r.system.clone());
        }
    }
    v
}

fn svg_open(w: f64, h: f64, title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
        esc(title)
    )
}

fn legend(svg: &mut String, systems: &[String], x: f64, y: f64) {
    for (i, s) in systems.iter().enumerate() {
        let yy = y + i as f64 * 16.0;
        let _ = writeln!(
            svg,
            "<rect x=\"{x}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/>\
             <text x=\"{}\" y=\"{}\">{}</text>",
            yy - 9.0,
            color_of(systems, s),
            x + 14.0,
            yy,
            esc(s)
        );
    }
}

/// Horizontal bars of jobs/s, one per (workload, system), linear scale.
fn throughput_svg(rows: &[Row]) -> String {
    let bars: Vec<&Row> = rows
        .iter()
        .filter(|r| r.status == Status::Ok && r.jobs_per_s.is_some() && r.workload != "failover")
        .collect();
    let systems = systems(&bars);
    let max = bars.iter().filter_map(|r| r.jobs_per_s).fold(1.0, f64::max);
    let (label_w, bar_w, row_h) = (190.0, 460.0, 18.0);
    let top = 40.0 + systems.len() as f64 * 16.0;
    let h = top + bars.len() as f64 * row_h + 20.0;
    let mut svg = svg_open(label_w + bar_w + 120.0, h, "Throughput (jobs/s)");
    legend(&mut svg, &systems, 10.0, 40.0);
    for (i, r) in bars.iter().enumerate() {
        let y = top + i as f64 * row_h;
        let v = r.jobs_per_s.unwrap_or(0.0);
        let w = v / max * bar_w;
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\
             <rect x=\"{label_w}\" y=\"{}\" width=\"{w:.1}\" height=\"{}\" fill=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{}\">{v:.0}</text>",
            label_w - 6.0,
            y + 12.0,
            esc(&workload_label(r)),
            y + 2.0,
            row_h - 4.0,
            color_of(&systems, &r.system),
            label_w + w + 4.0,
            y + 12.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Grouped horizontal bars of p50 / p99 / p99.9 per row, log scale (µs to seconds).
fn latency_svg(rows: &[Row]) -> String {
    let bars: Vec<&Row> =
        rows.iter().filter(|r| r.status == Status::Ok && r.latency_ms.is_some()).collect();
    let systems = systems(&bars);
    let (label_w, bar_w, group_h) = (330.0, 420.0, 40.0);
    let top = 60.0 + systems.len() as f64 * 16.0;
    let h = top + bars.len() as f64 * group_h + 30.0;
    let mut svg = svg_open(
        label_w + bar_w + 90.0,
        h,
        "Latency percentiles (ms, log scale): p50 / p99 / p99.9",
    );
    legend(&mut svg, &systems, 10.0, 40.0);
    let (lo, hi) = (0.01f64.log10(), 10_000f64.log10());
    let x = |ms: f64| label_w + ((ms.max(0.01).log10() - lo) / (hi - lo)).clamp(0.0, 1.0) * bar_w;
    for tick in [0.01, 0.1, 1.0, 10.0, 100.0, 1000.0, 10_000.0] {
        let _ = writeln!(
            svg,
            "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#ddd\"/>\
             <text x=\"{0:.1}\" y=\"{3}\" text-anchor=\"middle\" fill=\"#666\">{tick}</text>",
            x(tick),
            top - 4.0,
            h - 24.0,
            h - 10.0
        );
    }
    for (i, r) in bars.iter().enumerate() {
        let Some(l) = r.latency_ms else { continue };
        let y = top + i as f64 * group_h;
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{} ({})</text>",
            label_w - 6.0,
            y + 20.0,
            esc(&workload_label(r)),
            esc(r.latency_of)
        );
        for (j, (name, v)) in [("p50", l.p50), ("p99", l.p99), ("p99.9", l.p999)].iter().enumerate()
        {
            let yy = y + 2.0 + j as f64 * 12.0;
            let opacity = 1.0 - j as f64 * 0.3;
            let _ = writeln!(
                svg,
                "<rect x=\"{label_w}\" y=\"{yy}\" width=\"{:.1}\" height=\"10\" fill=\"{}\" \
                 fill-opacity=\"{opacity:.1}\"/><text x=\"{:.1}\" y=\"{}\" font-size=\"10\">\
                 {name} {v:.2}</text>",
                x(*v) - label_w,
                color_of(&systems, &r.system),
                x(*v) + 4.0,
                yy + 9.0
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

/// Vertical histogram bars of timer lateness, one series per system.
fn lateness_svg(rows: &[Row]) -> String {
    let series: Vec<(&Row, Vec<(String, u64)>)> = rows
        .iter()
        .filter_map(|r| {
            let hist = r.extra.get("lateness_histogram")?.as_array()?;
            let buckets = hist
                .iter()
                .map(|b| {
                    let label = b["bucket_ms"].as_str().unwrap_or("").to_string();
                    (label, b["count"].as_u64().unwrap_or(0))
                })
                .collect();
            Some((r, buckets))
        })
        .collect();
    let refs: Vec<&Row> = series.iter().map(|(r, _)| *r).collect();
    let systems = systems(&refs);
    let nb = series.first().map_or(0, |(_, b)| b.len());
    let (left, plot_h, group_w) = (50.0, 260.0, 64.0);
    let top = 40.0 + systems.len() as f64 * 16.0;
    let w = left + nb as f64 * group_w + 20.0;
    let h = top + plot_h + 50.0;
    let mut svg = svg_open(w, h, "Timer lateness (delivery − due), share of jobs per bucket (ms)");
    legend(&mut svg, &systems, 10.0, 40.0);
    let base = top + plot_h;
    let _ = writeln!(
        svg,
        "<line x1=\"{left}\" x2=\"{}\" y1=\"{base}\" y2=\"{base}\" stroke=\"#333\"/>",
        w - 10.0
    );
    let bar_w = (group_w - 8.0) / series.len().max(1) as f64;
    for (s, (r, buckets)) in series.iter().enumerate() {
        let total: u64 = buckets.iter().map(|b| b.1).sum::<u64>().max(1);
        for (i, (label, count)) in buckets.iter().enumerate() {
            let share = *count as f64 / total as f64;
            let bh = share * plot_h;
            let x = left + i as f64 * group_w + 4.0 + s as f64 * bar_w;
            // Early deliveries are a correctness failure: drawn red whatever the series.
            let fill = if i == 0 && *count > 0 { "#d00" } else { color_of(&systems, &r.system) };
            let _ = writeln!(
                svg,
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{bar_w:.1}\" height=\"{bh:.1}\" \
                 fill=\"{fill}\"><title>{}: {label} ms: {count}</title></rect>",
                base - bh,
                esc(&r.system)
            );
            if s == 0 {
                let _ = writeln!(
                    svg,
                    "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\" font-size=\"10\">{}</text>",
                    left + i as f64 * group_w + group_w / 2.0,
                    base + 14.0,
                    esc(label)
                );
            }
        }
    }
    svg.push_str("</svg>\n");
    svg
}

/// Horizontal bars of delayd ÷ peer, with the 1× line.
fn ratios_svg(ratios: &[Ratio]) -> String {
    let (label_w, bar_w, row_h) = (560.0, 300.0, 18.0);
    let max = ratios.iter().map(|r| r.ratio).fold(1.0, f64::max) * 1.1;
    let top = 40.0;
    let h = top + ratios.len() as f64 * row_h + 20.0;
    let mut svg = svg_open(label_w + bar_w + 80.0, h, "delayd ÷ peers, jobs/s, same run");
    for (i, r) in ratios.iter().enumerate() {
        let y = top + i as f64 * row_h;
        let w = r.ratio / max * bar_w;
        let fill = if r.ratio >= 1.0 { "#59a14f" } else { "#e15759" };
        let label = format!(
            "{} {} c={} vs {} {}",
            r.delayd,
            r.delayd_workload,
            clients(r.clients),
            r.peer,
            r.peer_workload
        );
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" font-size=\"11\">{}</text>\
             <rect x=\"{label_w}\" y=\"{}\" width=\"{w:.1}\" height=\"{}\" fill=\"{fill}\"/>\
             <text x=\"{:.1}\" y=\"{}\">{:.2}×</text>",
            label_w - 6.0,
            y + 12.0,
            esc(&label),
            y + 2.0,
            row_h - 4.0,
            label_w + w + 4.0,
            y + 12.0,
            r.ratio
        );
    }
    let one = label_w + bar_w / max;
    let _ = writeln!(
        svg,
        "<line x1=\"{one:.1}\" x2=\"{one:.1}\" y1=\"{}\" y2=\"{}\" stroke=\"#333\" \
         stroke-dasharray=\"4 3\"/>",
        top - 4.0,
        h - 16.0
    );
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_rows_list_their_p99_by_due_second() {
        let mut row = Row::new("sys", "timer", Status::Ok);
        row.clients = Some(64);
        assert_eq!(by_due_second_md(std::slice::from_ref(&row)), "", "no seconds, no section");
        row.extra.insert(
            "lateness_by_due_second".into(),
            serde_json::json!([{"second": 0, "p99": 12.4}, {"second": 1, "p99": 198.0}]),
        );
        let md = by_due_second_md(&[row]);
        assert!(md.contains("| sys | timer | 64 | 12 198 |"), "{md}");
    }

    #[test]
    fn the_cpu_split_lists_threads_by_share_and_leaves_out_zeros() {
        let mut row = Row::new("sys", "publish", Status::Ok);
        row.clients = Some(64);
        assert_eq!(by_thread_md(std::slice::from_ref(&row)), "", "no split, no section");
        row.server_cpu_us_per_job_by_thread =
            [("wal", 4.6), ("workers", 82.2), ("half", 0.5), ("idle", 0.2)]
                .into_iter()
                .map(|(name, us)| (name.to_string(), us))
                .collect();
        let md = by_thread_md(&[row]);
        assert!(md.contains("| sys | publish | 64 | `workers` 82, `wal` 5 |"), "{md}");
        assert!(!md.contains("`half`") && !md.contains("`idle`"), "{md}");
    }

    /// Ratios taken within each round are grouped by what they compare, across rounds, with
    /// their median; one without a round label is left out.
    #[test]
    fn ratios_over_rounds_are_grouped_with_their_median() {
        let ratio = |round: usize, workload: &str, r: f64| Ratio {
            delayd: format!("delayd 3 nodes {}", round_label(round)),
            delayd_workload: workload.to_string(),
            peer: format!("lmstfy-redis (appendfsync always) {}", round_label(round)),
            peer_workload: "drain".to_string(),
            clients: Some(64),
            ratio: r,
        };
        let mut ratios = vec![
            ratio(1, "drain", 0.46),
            ratio(1, "drain-ackfirst", 0.86),
            ratio(2, "drain", 0.99),
            ratio(2, "drain-ackfirst", 1.04),
            ratio(3, "drain", 0.70),
        ];
        ratios.push(Ratio { delayd: "delayd 1 node".into(), ..ratio(1, "drain", 9.0) });
        let over = over_rounds(&ratios);
        assert_eq!(over.len(), 2, "{over:?}");
        assert_eq!(
            (over[0].delayd.as_str(), over[0].delayd_workload.as_str()),
            ("delayd 3 nodes", "drain")
        );
        assert_eq!(over[0].peer, "lmstfy-redis (appendfsync always)");
        assert_eq!(over[0].ratios, [0.46, 0.99, 0.70]);
        assert_eq!(over[0].median, 0.70);
        assert_eq!(over[1].ratios, [0.86, 1.04]);
        assert!((over[1].median - 0.95).abs() < 1e-9);
        let table = over_rounds_table(&over);
        assert!(table.contains("0.70x  0.46 0.99 0.70"), "{table}");
        assert_eq!(without_round("delayd 1 node (round 12)"), Some(("delayd 1 node", 12)));
        assert_eq!(without_round("delayd 1 node"), None);
    }

    #[test]
    fn the_cpu_split_by_node_names_the_leader_and_leaves_out_one_node_rows() {
        let mut one = Row::new("one", "drain", Status::Ok);
        one.server_cpu_us_per_job_by_node.insert("n1".into(), 60.0);
        assert_eq!(by_node_md(&[one]), "", "one node: nothing to split");
        let mut usage = crate::stats::CpuUsage {
            server_s: Some(0.3),
            server_switches: None,
            server_s_by_thread: Default::default(),
            server_s_by_pid: [(101, 0.15), (102, 0.05), (103, 0.1)].into_iter().collect(),
            server_s_by_node: Default::default(),
            own_s: 0.0,
            wall_s: 1.0,
        };
        usage.name_nodes(&[(1, 101), (2, 102), (3, 103)], Some(1));
        let mut rows = vec![Row::new("three", "drain", Status::Ok)];
        rows[0].jobs = 1000;
        rows[0].clients = Some(64);
        usage.apply(&mut rows);
        let md = by_node_md(&rows);
        assert!(md.contains("| three | drain | 64 | n1 (leader) 150, n2 50, n3 100 |"), "{md}");
    }
}
