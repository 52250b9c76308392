//! The picture of a run: one self-contained SVG (no scripts, fonts or links), which is what
//! people look at first.
//!
//! Four panels share one time axis (seconds since the run started): the fault windows per
//! node, operations per time bucket by outcome, the latency of every operation, and the
//! lateness of every first delivery. Fault windows are shaded faintly behind all panels and
//! anomalies are marked as red vertical lines across them; hovering a window or an anomaly
//! line shows its details (SVG `<title>`), which the static PNG of course does not.

use std::collections::BTreeSet;
use std::fmt::{self, Write};

use crate::checker::Anomaly;
use crate::history::{Call, Delivery, Op, Outcome};
use crate::plan::{FaultKind, FaultWindow};
use crate::stats;

const WIDTH: f64 = 1400.0;
/// Left edge of the plots; the room on the left holds row and tick labels.
const X0: f64 = 92.0;
/// Right edge of the plots; the room on the right holds the legend.
const X1: f64 = 1212.0;
const LEGEND_X: f64 = 1232.0;
/// Above this many points a scatter keeps every non-ok point and thins the ok ones, so the
/// file stays a few MB at most and the browser stays responsive.
const MAX_POINTS: usize = 20_000;
/// Gap above each data panel, holding its title.
const PANEL_GAP: f64 = 34.0;

const OK: &str = "#2ca02c";
const FAIL: &str = "#ff7f0e";
const UNKNOWN: &str = "#d62728";
const ANOMALY: &str = "#c00000";
const PUBLISH_LINE: &str = "#1f3a93";
const LATE_HEALTHY: &str = "#1f77b4";
const LATE_DISTURBED: &str = "#9467bd";
const LATE_EARLY: &str = "#e377c2";

/// The colour of a fault kind; red, orange and green are left to outcomes and anomalies.
fn kind_colour(kind: FaultKind) -> &'static str {
    match kind {
        FaultKind::IsolateLeader => "#4e79a7",
        FaultKind::IsolateNode => "#76b7b2",
        FaultKind::Bridge => "#b07aa1",
        FaultKind::FullIsolation => "#9c755f",
        FaultKind::KillNode => "#edc948",
        FaultKind::KillLeader => "#ff9da7",
        FaultKind::KillAll => "#8c8c8c",
        FaultKind::PauseNode => "#bab0ac",
        FaultKind::PauseLeader => "#d4a6c8",
        FaultKind::ClockOffset => "#a0cbe8",
        FaultKind::GracefulRestart => "#8cd17d",
        FaultKind::Membership => "#b6992d",
    }
}

/// Escapes text for SVG content and attribute values. Characters XML 1.0 forbids (most
/// control characters) become `?`, so a stray byte in a body cannot break the document.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// Shortens `s` to at most `max` characters (not bytes), marking the cut.
fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(3)).collect();
    out.push_str("...");
    out
}

/// Rough width of a text in the sans-serif fonts renderers pick, to avoid overlapping labels.
fn text_width(s: &str, font_size: f64) -> f64 {
    s.chars().count() as f64 * font_size * 0.6
}

/// A duration in ms as a short label: "250 ms", "1.5 s", "2 min".
fn ms_label(ms: f64) -> String {
    if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else if ms < 120_000.0 {
        let s = ms / 1000.0;
        if (s - s.round()).abs() < 1e-9 {
            format!("{s:.0} s")
        } else {
            format!("{s:.1} s")
        }
    } else {
        format!("{:.0} min", ms / 60_000.0)
    }
}

/// The smallest 1, 2 or 5 × 10^k that is at least `v` (and at least 1).
fn nice_ceil(v: u64) -> u64 {
    let mut base = 1u64;
    loop {
        for m in [1, 2, 5] {
            let c = base.saturating_mul(m);
            if c >= v || c == u64::MAX {
                return c;
            }
        }
        base = base.saturating_mul(10);
    }
}

/// The smallest power of ten that is at least `v` and at least `floor`.
fn pow10_ceil(v: u64, floor: u64) -> u64 {
    let mut p = 1u64;
    while p < v.max(floor) && p < u64::MAX / 10 {
        p *= 10;
    }
    p
}

/// A horizontal band of the picture.
#[derive(Clone, Copy)]
struct Band {
    top: f64,
    height: f64,
}

impl Band {
    fn bottom(self) -> f64 {
        self.top + self.height
    }

    /// Maps `v` (ms, 0 allowed) onto a log scale from 1 ms at the bottom to `hi` at the top;
    /// values below 1 ms sit on the bottom edge, above `hi` on the top edge.
    fn log_y(self, v: u64, hi: u64) -> f64 {
        let top = (hi.max(10) as f64).log10();
        let frac = ((v.max(1) as f64).log10() / top).clamp(0.0, 1.0);
        self.bottom() - self.height * frac
    }
}

/// The shared time axis.
#[derive(Clone, Copy)]
struct Time {
    end_ms: f64,
}

impl Time {
    fn x(self, ms: u64) -> f64 {
        X0 + (X1 - X0) * (ms as f64 / self.end_ms).clamp(0.0, 1.0)
    }

    fn px_per_ms(self) -> f64 {
        (X1 - X0) / self.end_ms
    }
}

/// Outcome counts, for the header and the operations panel.
#[derive(Clone, Copy, Default)]
struct Tally {
    ok: u64,
    fail: u64,
    unknown: u64,
}

impl Tally {
    fn add(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Ok => self.ok += 1,
            Outcome::Fail => self.fail += 1,
            Outcome::Unknown => self.unknown += 1,
        }
    }

    fn total(self) -> u64 {
        self.ok + self.fail + self.unknown
    }
}

/// Client traffic: everything but the final dead-letter listing.
fn is_traffic(op: &Op) -> bool {
    !matches!(op.call, Call::DeadLetter { .. })
}

/// Draws the run as a self-contained SVG of about 1400 × 700 px: a header (title, duration,
/// operation counts, anomaly count), then fault lanes per node, operations per time bucket by
/// outcome, per-operation latency (log scale) and first-delivery lateness (as in
/// [`stats::first_deliveries`]), all on one time axis in seconds since the run started.
///
/// Every anomaly is marked with a red vertical line at the time of the operation it concerns
/// (the publish for `Lost`, the reserve for `Early`, `LeaseOverlap` and the like, the end of
/// the run for `Diverged`). Scatters with more than 20,000 points keep all non-ok points and
/// every n-th ok one, deterministically. All text is escaped.
pub fn svg(history: &[Op], faults: &[FaultWindow], anomalies: &[Anomaly], title: &str) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail; the Result carries nothing.
    let _ = draw(&mut out, history, faults, anomalies, title);
    out
}

fn draw(
    out: &mut String,
    history: &[Op],
    faults: &[FaultWindow],
    anomalies: &[Anomaly],
    title: &str,
) -> fmt::Result {
    let end_ms = history
        .iter()
        .map(|op| op.complete_ms.max(op.invoke_ms))
        .chain(faults.iter().map(|w| w.end_ms))
        .max()
        .unwrap_or(0)
        .max(1000);
    let time = Time { end_ms: end_ms as f64 };
    let layout = lane_layout(faults);

    // Vertical layout: header, anomaly labels, top time labels, then the panels.
    let strip = Band { top: 56.0, height: 30.0 };
    let track_h = (126.0 / layout.tracks as f64).clamp(8.0, 18.0);
    let lanes = Band { top: strip.bottom() + 18.0, height: track_h * layout.tracks as f64 };
    let ops = Band { top: lanes.bottom() + PANEL_GAP, height: 130.0 };
    let lat = Band { top: ops.bottom() + PANEL_GAP, height: 150.0 };
    let late = Band { top: lat.bottom() + PANEL_GAP, height: 130.0 };
    let height = late.bottom() + 48.0;
    let data = Band { top: lanes.top, height: late.bottom() - lanes.top };

    writeln!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="11" fill="#222">"##
    )?;
    writeln!(out, "<title>{}</title>", esc(title))?;
    writeln!(out, r##"<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>"##)?;

    // Panel frames and the time grid first, so everything else draws over them.
    writeln!(out, r##"<g class="frames" fill="#fbfbfb" stroke="#c8c8c8">"##)?;
    for b in [lanes, ops, lat, late] {
        writeln!(
            out,
            r#"<rect x="{X0}" y="{:.1}" width="{:.1}" height="{:.1}"/>"#,
            b.top,
            X1 - X0,
            b.height
        )?;
    }
    writeln!(out, "</g>")?;
    time_axis(out, time, lanes, data)?;

    // Fault windows, faintly behind all panels.
    writeln!(out, r#"<g class="fault-shading">"#)?;
    for w in faults {
        let (x, wd) = span(time, w.start_ms, w.end_ms);
        writeln!(
            out,
            r#"<rect class="fault-bg" x="{x:.1}" y="{:.1}" width="{wd:.1}" height="{:.1}" fill="{}" fill-opacity="0.13"/>"#,
            data.top,
            data.height,
            kind_colour(w.kind)
        )?;
    }
    writeln!(out, "</g>")?;

    fault_lanes(out, time, lanes, &layout, faults)?;
    operations(out, time, ops, history)?;
    latency(out, time, lat, history)?;
    lateness(out, time, late, history, faults)?;
    let unlabeled = anomaly_marks(out, time, strip, data, history, anomalies, end_ms)?;
    header(out, history, faults, anomalies, unlabeled, title, end_ms)?;
    legend(out, lanes.top, faults)?;
    write!(out, "</svg>")
}

/// The x and width of a time span, at least one pixel wide so short faults stay visible.
fn span(time: Time, start_ms: u64, end_ms: u64) -> (f64, f64) {
    let x = time.x(start_ms);
    (x, (time.x(end_ms) - x).max(1.0))
}

fn time_axis(out: &mut String, time: Time, lanes: Band, data: Band) -> fmt::Result {
    const STEPS: [u64; 16] = [
        100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000,
        600_000, 900_000, 1_800_000, 3_600_000,
    ];
    let step = STEPS.iter().copied().find(|s| time.end_ms / *s as f64 <= 15.0).unwrap_or(7_200_000);
    writeln!(out, r##"<g class="time-axis" stroke="#e2e2e2">"##)?;
    let mut labels = String::new();
    let mut t = 0u64;
    while t as f64 <= time.end_ms {
        let x = time.x(t);
        writeln!(
            out,
            r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}"/>"#,
            data.top,
            data.bottom()
        )?;
        let label =
            if step < 1000 { format!("{:.1}", t as f64 / 1000.0) } else { format!("{}", t / 1000) };
        for y in [lanes.top - 5.0, data.bottom() + 14.0] {
            writeln!(labels, r#"<text x="{x:.1}" y="{y:.1}" text-anchor="middle">{label}</text>"#)?;
        }
        t += step;
    }
    writeln!(out, "</g>")?;
    writeln!(out, r##"<g class="time-labels" fill="#555">{labels}"##)?;
    writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12">time since start of run (s)</text>"#,
        (X0 + X1) / 2.0,
        data.bottom() + 34.0
    )?;
    writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="end">time (s)</text>"#,
        X0 - 8.0,
        lanes.top - 5.0
    )?;
    writeln!(out, "</g>")
}

/// A panel's title, in the gap above it.
fn panel_title(out: &mut String, band: Band, text: &str) -> fmt::Result {
    writeln!(
        out,
        r#"<text x="{X0}" y="{:.1}" font-size="12" font-weight="bold">{}</text>"#,
        band.top - 8.0,
        esc(text)
    )
}

/// Where the rows and bars of the fault-lane panel go. Windows that overlap in time on one
/// node get separate tracks within its row, so neither hides the other or its label.
struct LaneLayout {
    /// Per node, in order: the node, its first track and its number of tracks.
    rows: Vec<(u64, usize, usize)>,
    /// Per fault window, in order: the tracks of its bars, one per node it concerns.
    bars: Vec<Vec<usize>>,
    /// Tracks in all.
    tracks: usize,
}

fn lane_layout(faults: &[FaultWindow]) -> LaneLayout {
    // Nodes 1 to 3 always, so a run without faults still shows the cluster.
    let mut nodes: BTreeSet<u64> = (1..=3).collect();
    nodes.extend(faults.iter().flat_map(|w| w.nodes.iter().copied()));
    let targets = |w: &FaultWindow| -> Vec<u64> {
        // A fault with no node listed (none should be) is drawn across every row.
        if w.nodes.is_empty() {
            nodes.iter().copied().collect()
        } else {
            w.nodes.iter().copied().collect::<BTreeSet<u64>>().into_iter().collect()
        }
    };
    let mut bars: Vec<Vec<usize>> = faults.iter().map(|_| Vec::new()).collect();
    let mut rows = Vec::new();
    let mut tracks = 0;
    for &node in &nodes {
        let mut mine: Vec<usize> =
            (0..faults.len()).filter(|i| targets(&faults[*i]).contains(&node)).collect();
        mine.sort_by_key(|i| (faults[*i].start_ms, faults[*i].end_ms));
        // Greedy interval colouring: each window takes the first track free by its start.
        let mut track_ends: Vec<u64> = Vec::new();
        let mut local = Vec::new();
        for i in mine {
            let w = &faults[i];
            let t = match track_ends.iter().position(|end| *end <= w.start_ms) {
                Some(t) => t,
                None => {
                    track_ends.push(0);
                    track_ends.len() - 1
                }
            };
            track_ends[t] = w.end_ms.max(w.start_ms);
            local.push((i, t));
        }
        let n = track_ends.len().max(1);
        for (i, t) in local {
            bars[i].push(tracks + t);
        }
        rows.push((node, tracks, n));
        tracks += n;
    }
    LaneLayout { rows, bars, tracks }
}

fn fault_lanes(
    out: &mut String,
    time: Time,
    lanes: Band,
    layout: &LaneLayout,
    faults: &[FaultWindow],
) -> fmt::Result {
    let track_h = lanes.height / layout.tracks.max(1) as f64;
    writeln!(out, r#"<g class="lanes">"#)?;
    for (i, (node, first, n)) in layout.rows.iter().enumerate() {
        let y = lanes.top + track_h * *first as f64;
        writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">node {node}</text>"#,
            X0 - 8.0,
            y + track_h * *n as f64 / 2.0 + 4.0
        )?;
        if i > 0 {
            writeln!(
                out,
                r##"<line x1="{X0}" y1="{y:.1}" x2="{X1}" y2="{y:.1}" stroke="#d8d8d8"/>"##
            )?;
        }
    }
    let font = (track_h - 5.0).clamp(7.0, 10.0);
    // Horizontal extents taken per track, by bars and by labels placed beside a bar, so a
    // label that does not fit inside its bar goes to its right only where that is free.
    let mut taken: Vec<Vec<(f64, f64)>> = vec![Vec::new(); layout.tracks];
    for (w, tracks) in faults.iter().zip(&layout.bars) {
        let (x, wd) = span(time, w.start_ms, w.end_ms);
        for t in tracks {
            if let Some(v) = taken.get_mut(*t) {
                v.push((x, x + wd));
            }
        }
    }
    for (w, tracks) in faults.iter().zip(&layout.bars) {
        let (x, wd) = span(time, w.start_ms, w.end_ms);
        let tip = format!(
            "{} on {:?}: {:.1} s to {:.1} s{}{}",
            w.kind.name(),
            w.nodes,
            w.start_ms as f64 / 1000.0,
            w.end_ms as f64 / 1000.0,
            if w.detail.is_empty() { "" } else { " - " },
            w.detail
        );
        writeln!(out, r#"<g class="fault"><title>{}</title>"#, esc(&tip))?;
        for track in tracks {
            let y = lanes.top + track_h * *track as f64 + 1.5;
            writeln!(
                out,
                r##"<rect x="{x:.1}" y="{y:.1}" width="{wd:.1}" height="{:.1}" fill="{}" fill-opacity="0.85" stroke="#666" stroke-width="0.5"/>"##,
                track_h - 3.0,
                kind_colour(w.kind)
            )?;
            // The name inside the bar where it fits, else just right of it where that is
            // free, else nowhere: the legend names every colour and the tooltip tells.
            let name = w.kind.name();
            let tw = text_width(name, font);
            let baseline = y + (track_h - 3.0) / 2.0 + font * 0.35;
            if tw + 4.0 <= wd {
                writeln!(
                    out,
                    r#"<text x="{:.1}" y="{baseline:.1}" text-anchor="middle" font-size="{font}">{name}</text>"#,
                    x + wd / 2.0,
                )?;
            } else if let Some(used) = taken.get_mut(*track) {
                let (from, to) = (x + wd + 3.0, x + wd + 3.0 + tw);
                let free = to <= X1 && used.iter().all(|(a, b)| *b <= from || to <= *a);
                if free {
                    used.push((from, to));
                    writeln!(
                        out,
                        r#"<text x="{from:.1}" y="{baseline:.1}" font-size="{font}">{name}</text>"#
                    )?;
                }
            }
        }
        writeln!(out, "</g>")?;
    }
    writeln!(out, "</g>")
}

/// Horizontal grid lines with labels at the left, for a linear count axis.
fn count_ticks(out: &mut String, band: Band, max: u64) -> fmt::Result {
    writeln!(out, r##"<g class="y-axis" fill="#555">"##)?;
    for tick in [0, max / 2, max] {
        let y = band.bottom() - band.height * tick as f64 / max.max(1) as f64;
        if tick > 0 {
            writeln!(
                out,
                r##"<line x1="{X0}" y1="{y:.1}" x2="{X1}" y2="{y:.1}" stroke="#e2e2e2"/>"##
            )?;
        }
        writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{tick}</text>"#,
            X0 - 6.0,
            y + 4.0
        )?;
    }
    writeln!(out, "</g>")
}

/// Horizontal grid lines at every power of ten, for a log axis in ms.
fn log_ticks(out: &mut String, band: Band, hi: u64, bottom_label: &str) -> fmt::Result {
    writeln!(out, r##"<g class="y-axis" fill="#555">"##)?;
    let mut v = 1u64;
    while v <= hi {
        let y = band.log_y(v, hi);
        if v > 1 {
            writeln!(
                out,
                r##"<line x1="{X0}" y1="{y:.1}" x2="{X1}" y2="{y:.1}" stroke="#e2e2e2"/>"##
            )?;
        }
        let label = if v == 1 { bottom_label.to_string() } else { ms_label(v as f64) };
        writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            X0 - 6.0,
            y + 4.0,
            esc(&label)
        )?;
        v = v.saturating_mul(10);
    }
    writeln!(out, "</g>")
}

fn operations(out: &mut String, time: Time, band: Band, history: &[Op]) -> fmt::Result {
    // One-second buckets, finer for short runs so there are enough bars to see a shape, and
    // coarser for long ones so a bar stays at least about two pixels wide.
    const SIZES: [u64; 10] = [100, 250, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 300_000];
    let fits = |s: u64| time.end_ms / s as f64 <= (X1 - X0) / 2.0;
    let bucket_ms = if time.end_ms < 60_000.0 {
        SIZES.iter().copied().rev().find(|s| *s <= 1_000 && time.end_ms / *s as f64 >= 60.0)
    } else {
        SIZES.iter().copied().find(|s| *s >= 1_000 && fits(*s))
    }
    .unwrap_or(if time.end_ms < 60_000.0 { 100 } else { 300_000 });

    let n = (time.end_ms as u64 / bucket_ms + 1) as usize;
    let mut all = vec![Tally::default(); n];
    let mut publish_ok = vec![0u64; n];
    for op in history.iter().filter(|op| is_traffic(op)) {
        let i = ((op.invoke_ms / bucket_ms) as usize).min(n - 1);
        all[i].add(op.outcome);
        if op.outcome == Outcome::Ok && matches!(op.call, Call::Publish { .. }) {
            publish_ok[i] += 1;
        }
    }
    let max = nice_ceil(all.iter().map(|t| t.total()).max().unwrap_or(0));
    panel_title(
        out,
        band,
        &format!(
            "operations per {} (bars: all operations stacked by outcome; line: ok publishes)",
            ms_label(bucket_ms as f64)
        ),
    )?;
    count_ticks(out, band, max)?;
    let scale = band.height / max as f64;
    let bar_w = (bucket_ms as f64 * time.px_per_ms() * 0.8).max(0.8);
    writeln!(out, r#"<g class="ops">"#)?;
    for (i, t) in all.iter().enumerate() {
        let x = time.x(i as u64 * bucket_ms);
        let mut y = band.bottom();
        for (count, colour) in [(t.ok, OK), (t.fail, FAIL), (t.unknown, UNKNOWN)] {
            if count == 0 {
                continue;
            }
            let h = count as f64 * scale;
            y -= h;
            writeln!(
                out,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{bar_w:.1}" height="{h:.1}" fill="{colour}"/>"#
            )?;
        }
    }
    let points: Vec<String> = publish_ok
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let x = time.x(i as u64 * bucket_ms) + bar_w / 2.0;
            format!("{x:.1},{:.1}", band.bottom() - *c as f64 * scale)
        })
        .collect();
    writeln!(
        out,
        r#"<polyline points="{}" fill="none" stroke="{PUBLISH_LINE}" stroke-width="1.3"/>"#,
        points.join(" ")
    )?;
    writeln!(out, "</g>")
}

/// Which of `n` ok points to keep so that, with `others` points always kept, about
/// [`MAX_POINTS`] remain: every `k`-th one.
fn keep_every(ok: usize, others: usize) -> usize {
    let total = ok + others;
    if total <= MAX_POINTS {
        return 1;
    }
    // Some ok points always stay, even when the non-ok ones alone exceed the budget.
    let budget = MAX_POINTS.saturating_sub(others).max(MAX_POINTS / 10);
    ok.div_ceil(budget).max(1)
}

/// Keeps the first of every `every` items it is asked about: a deterministic thinning.
struct Thin {
    every: usize,
    skip: usize,
}

impl Thin {
    fn new(every: usize) -> Thin {
        Thin { every: every.max(1), skip: 0 }
    }

    fn keep(&mut self) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        self.skip = self.every - 1;
        true
    }
}

fn latency(out: &mut String, time: Time, band: Band, history: &[Op]) -> fmt::Result {
    let traffic: Vec<&Op> = history.iter().filter(|op| is_traffic(op)).collect();
    let ok = traffic.iter().filter(|op| op.outcome == Outcome::Ok).count();
    let every = keep_every(ok, traffic.len() - ok);
    let max = traffic.iter().map(|op| op.complete_ms.saturating_sub(op.invoke_ms)).max();
    let hi = pow10_ceil(max.unwrap_or(0), 10_000);
    let sampled =
        if every > 1 { format!("; every {every}th ok operation shown") } else { String::new() };
    panel_title(
        out,
        band,
        &format!("latency per operation, invoked to answered (log scale, by outcome{sampled})"),
    )?;
    log_ticks(out, band, hi, "1 ms")?;
    // Ok first and translucent, so failures and unknowns stay visible on top.
    for (outcome, colour, opacity) in
        [(Outcome::Ok, OK, 0.45), (Outcome::Fail, FAIL, 0.9), (Outcome::Unknown, UNKNOWN, 0.9)]
    {
        writeln!(out, r#"<g class="latency" fill="{colour}" fill-opacity="{opacity}">"#)?;
        let mut thin = Thin::new(every);
        for op in traffic.iter().filter(|op| op.outcome == outcome) {
            if outcome == Outcome::Ok && !thin.keep() {
                continue;
            }
            let y = band.log_y(op.complete_ms.saturating_sub(op.invoke_ms), hi);
            writeln!(out, r#"<circle cx="{:.1}" cy="{y:.1}" r="1.6"/>"#, time.x(op.invoke_ms))?;
        }
        writeln!(out, "</g>")?;
    }
    Ok(())
}

fn lateness(
    out: &mut String,
    time: Time,
    band: Band,
    history: &[Op],
    faults: &[FaultWindow],
) -> fmt::Result {
    let firsts = stats::first_deliveries(history, faults);
    let plain = |f: &stats::FirstDelivery| f.healthy && !f.before_due;
    let healthy_n = firsts.iter().filter(|f| plain(f)).count();
    let every = keep_every(healthy_n, firsts.len() - healthy_n);
    let hi = pow10_ceil(firsts.iter().map(|f| f.lateness_ms).max().unwrap_or(0), 1_000);
    let summary = match stats::lateness(history, faults).healthy {
        Some(p) => {
            format!("; healthy p50 {} ms, p99 {} ms, max {} ms", p.p50_ms, p.p99_ms, p.max_ms)
        }
        None => String::new(),
    };
    let sampled =
        if every > 1 { format!("; every {every}th healthy job shown") } else { String::new() };
    panel_title(
        out,
        band,
        &format!(
            "lateness of first delivery over due time (answered - (publish sent + delay), log scale{summary}{sampled})"
        ),
    )?;
    log_ticks(out, band, hi, "0-1 ms")?;
    if firsts.is_empty() {
        return writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#888">no delayed job was delivered</text>"##,
            (X0 + X1) / 2.0,
            band.top + band.height / 2.0
        );
    }
    // 0: healthy, 1: near a fault, 2: before due (whether healthy or not).
    let group = |f: &stats::FirstDelivery| match (f.before_due, f.healthy) {
        (true, _) => 2,
        (false, true) => 0,
        (false, false) => 1,
    };
    for (g, colour) in [LATE_HEALTHY, LATE_DISTURBED, LATE_EARLY].into_iter().enumerate() {
        writeln!(out, r#"<g class="lateness" fill="{colour}" fill-opacity="0.7">"#)?;
        let mut thin = Thin::new(every);
        for f in firsts.iter().filter(|f| group(f) == g) {
            if plain(f) && !thin.keep() {
                continue;
            }
            let y = band.log_y(f.lateness_ms, hi);
            writeln!(out, r#"<circle cx="{:.1}" cy="{y:.1}" r="1.8"/>"#, time.x(f.due_ms))?;
        }
        writeln!(out, "</g>")?;
    }
    Ok(())
}

/// Short label of an anomaly, for the picture; the full one is in its tooltip.
fn anomaly_label(a: &Anomaly) -> &'static str {
    match a {
        Anomaly::Lost { .. } => "lost",
        Anomaly::Unexpected { .. } => "unexpected",
        Anomaly::Early { .. } => "early",
        Anomaly::LeaseOverlap { .. } => "lease overlap",
        Anomaly::AttemptRepeated { .. } => "attempt repeated",
        Anomaly::StaleAckAccepted { .. } => "stale ack",
        Anomaly::DeliveredAfterAck { .. } => "after ack",
        Anomaly::AckedInDeadLetter { .. } => "acked in DLQ",
        Anomaly::DuplicateKey { .. } => "duplicate key",
        Anomaly::Diverged { .. } => "diverged",
    }
}

/// Completion times of the ok reserves that returned a delivery matching `pred`, in order.
fn reserves_of(history: &[Op], pred: impl Fn(&Delivery) -> bool) -> Vec<u64> {
    let mut times: Vec<u64> = history
        .iter()
        .filter(|op| op.outcome == Outcome::Ok)
        .filter_map(|op| match &op.call {
            Call::Reserve { got, .. } if got.iter().any(&pred) => Some(op.complete_ms),
            _ => None,
        })
        .collect();
    times.sort_unstable();
    times
}

/// When the operation an anomaly concerns happened; the end of the run when it cannot be
/// found (or, for divergence, concerns no operation).
fn anomaly_time(a: &Anomaly, history: &[Op], end_ms: u64) -> u64 {
    let found = match a {
        Anomaly::Lost { body } => history
            .iter()
            .filter(|op| matches!(&op.call, Call::Publish { body: b, .. } if b == body))
            .map(|op| op.invoke_ms)
            .min(),
        Anomaly::Unexpected { body } | Anomaly::Early { body, .. } => {
            reserves_of(history, |d| d.body == *body).first().copied()
        }
        Anomaly::LeaseOverlap { job_id, attempts: (_, second) } => {
            reserves_of(history, |d| d.job_id == *job_id && d.attempt == *second).first().copied()
        }
        Anomaly::AttemptRepeated { job_id, attempt } => {
            let times = reserves_of(history, |d| d.job_id == *job_id && d.attempt == *attempt);
            times.get(1).or(times.first()).copied()
        }
        Anomaly::StaleAckAccepted { job_id, lease } => history
            .iter()
            .filter(|op| op.outcome == Outcome::Ok)
            .filter(|op| {
                matches!(&op.call, Call::Ack { job_id: j, lease: l } if j == job_id && l == lease)
            })
            .map(|op| op.invoke_ms)
            .max(),
        Anomaly::DeliveredAfterAck { job_id } => {
            reserves_of(history, |d| d.job_id == *job_id).last().copied()
        }
        Anomaly::AckedInDeadLetter { body } => history
            .iter()
            .filter(|op| matches!(&op.call, Call::DeadLetter { bodies } if bodies.contains(body)))
            .map(|op| op.complete_ms)
            .min(),
        Anomaly::DuplicateKey { key, .. } => {
            // The first publish under the key that answered a different id than the first.
            let mut ids = history.iter().filter(|op| op.outcome == Outcome::Ok).filter_map(|op| {
                match &op.call {
                    Call::Publish { key: Some(k), job_id: Some(id), .. } if k == key => {
                        Some((op.invoke_ms, id))
                    }
                    _ => None,
                }
            });
            ids.next().and_then(|(_, first)| ids.find(|(_, id)| *id != first).map(|(t, _)| t))
        }
        Anomaly::Diverged { .. } => None,
    };
    found.unwrap_or(end_ms)
}

/// Red lines across the panels, labels in the strip above; returns how many lines had no
/// room for a label.
fn anomaly_marks(
    out: &mut String,
    time: Time,
    strip: Band,
    data: Band,
    history: &[Op],
    anomalies: &[Anomaly],
    end_ms: u64,
) -> Result<usize, fmt::Error> {
    let mut marks: Vec<(u64, &Anomaly)> =
        anomalies.iter().map(|a| (anomaly_time(a, history, end_ms), a)).collect();
    marks.sort_by_key(|(t, _)| *t);
    // Labels go into the first of two rows where they do not overlap the previous one;
    // when neither has room the line stays unlabeled (its tooltip still tells).
    let rows = [strip.top + 11.0, strip.top + 25.0];
    let mut free_from = [f64::MIN; 2];
    let mut unlabeled = 0;
    writeln!(out, r#"<g class="anomalies">"#)?;
    for (t, a) in marks {
        let x = time.x(t);
        let detail = serde_json::to_string(a).unwrap_or_default();
        writeln!(
            out,
            r#"<g class="anomaly"><title>{} at {:.1} s: {}</title>"#,
            anomaly_label(a),
            t as f64 / 1000.0,
            esc(&detail)
        )?;
        writeln!(
            out,
            r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="{ANOMALY}" stroke-width="1.5" stroke-opacity="0.85"/>"#,
            strip.top + 2.0,
            data.bottom()
        )?;
        let label = anomaly_label(a);
        let width = text_width(label, 10.0);
        // Near the right edge the label goes to the left of its line.
        let (lx, anchor, from, to) = if x + 3.0 + width > X1 {
            (x - 3.0, "end", x - 3.0 - width, x)
        } else {
            (x + 3.0, "start", x, x + 3.0 + width)
        };
        match (0..rows.len()).find(|r| free_from[*r] <= from) {
            Some(r) => {
                free_from[r] = to + 6.0;
                writeln!(
                    out,
                    r#"<text x="{lx:.1}" y="{:.1}" text-anchor="{anchor}" font-size="10" fill="{ANOMALY}">{label}</text>"#,
                    rows[r]
                )?;
            }
            None => unlabeled += 1,
        }
        writeln!(out, "</g>")?;
    }
    writeln!(out, "</g>")?;
    Ok(unlabeled)
}

fn header(
    out: &mut String,
    history: &[Op],
    faults: &[FaultWindow],
    anomalies: &[Anomaly],
    unlabeled: usize,
    title: &str,
    end_ms: u64,
) -> fmt::Result {
    let (mut publish, mut other) = (Tally::default(), Tally::default());
    for op in history.iter().filter(|op| is_traffic(op)) {
        match op.call {
            Call::Publish { .. } => publish.add(op.outcome),
            _ => other.add(op.outcome),
        }
    }
    let t = |t: Tally| format!("ok {}, fail {}, unknown {}", t.ok, t.fail, t.unknown);
    let line = format!(
        "duration {:.1} s  |  {} operations  |  publish {}: {}  |  reserve/ack/release {}: {}  |  {} fault windows",
        end_ms as f64 / 1000.0,
        publish.total() + other.total(),
        publish.total(),
        t(publish),
        other.total(),
        t(other),
        faults.len()
    );
    writeln!(out, r#"<g class="header">"#)?;
    writeln!(
        out,
        r#"<text x="16" y="26" font-size="18" font-weight="bold">{}</text>"#,
        esc(&truncate(title, 90))
    )?;
    writeln!(out, r##"<text x="16" y="46" font-size="12" fill="#444">{}</text>"##, esc(&line))?;
    let (text, colour) = match anomalies.len() {
        0 => ("no anomalies".to_string(), OK),
        1 => ("1 anomaly".to_string(), ANOMALY),
        n => (format!("{n} anomalies"), ANOMALY),
    };
    writeln!(
        out,
        r#"<text class="verdict" x="{:.1}" y="26" font-size="18" font-weight="bold" text-anchor="end" fill="{colour}">{text}</text>"#,
        WIDTH - 16.0
    )?;
    if unlabeled > 0 {
        writeln!(
            out,
            r#"<text x="{:.1}" y="46" font-size="11" text-anchor="end" fill="{ANOMALY}">{unlabeled} not labeled (crowded); see the checker report</text>"#,
            WIDTH - 16.0
        )?;
    }
    writeln!(out, "</g>")
}

fn legend(out: &mut String, top: f64, faults: &[FaultWindow]) -> fmt::Result {
    let kinds: BTreeSet<FaultKind> = faults.iter().map(|w| w.kind).collect();
    let mut y = top + 4.0;
    let x = LEGEND_X;
    writeln!(out, r#"<g class="legend">"#)?;
    let heading = |out: &mut String, y: &mut f64, text: &str| -> fmt::Result {
        *y += 6.0;
        writeln!(out, r#"<text x="{x}" y="{:.1}" font-weight="bold">{text}</text>"#, *y + 4.0)?;
        *y += 16.0;
        Ok(())
    };
    let entry = |out: &mut String, y: &mut f64, colour: &str, shape: &str, text: &str| {
        let swatch = match shape {
            "dot" => {
                format!(r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{colour}"/>"#, x + 6.0, *y)
            }
            "line" => format!(
                r#"<line x1="{x}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{colour}" stroke-width="2"/>"#,
                x + 12.0,
                y = *y
            ),
            _ => format!(
                r#"<rect x="{x}" y="{:.1}" width="12" height="10" fill="{colour}"/>"#,
                *y - 5.0
            ),
        };
        let r = writeln!(
            out,
            r#"{swatch}<text x="{:.1}" y="{:.1}">{}</text>"#,
            x + 18.0,
            *y + 4.0,
            esc(text)
        );
        *y += 15.0;
        r
    };
    heading(out, &mut y, "faults")?;
    if kinds.is_empty() {
        entry(out, &mut y, "#ffffff", "box", "none injected")?;
    }
    for k in kinds {
        entry(out, &mut y, kind_colour(k), "box", k.name())?;
    }
    heading(out, &mut y, "operations")?;
    entry(out, &mut y, OK, "box", "ok")?;
    entry(out, &mut y, FAIL, "box", "fail")?;
    entry(out, &mut y, UNKNOWN, "box", "unknown")?;
    entry(out, &mut y, PUBLISH_LINE, "line", "ok publishes")?;
    heading(out, &mut y, "first delivery")?;
    entry(out, &mut y, LATE_HEALTHY, "dot", "healthy")?;
    entry(out, &mut y, LATE_DISTURBED, "dot", "near a fault (+2 s)")?;
    entry(out, &mut y, LATE_EARLY, "dot", "before due")?;
    heading(out, &mut y, "checker")?;
    entry(out, &mut y, ANOMALY, "line", "anomaly")?;
    writeln!(out, "</g>")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator, so the sample run is the same every time.
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self, bound: u64) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 33) % bound.max(1)
        }
    }

    fn window(kind: FaultKind, nodes: &[u64], start_ms: u64, end_ms: u64) -> FaultWindow {
        FaultWindow { kind, nodes: nodes.to_vec(), start_ms, end_ms, detail: String::new() }
    }

    /// A 90-second run: publishes with delays, reserves that collect what is due, acks;
    /// slow and failing during faults.
    fn sample_run() -> (Vec<Op>, Vec<FaultWindow>) {
        let faults = vec![
            window(FaultKind::IsolateLeader, &[1], 15_000, 25_000),
            window(FaultKind::KillNode, &[3], 40_000, 48_000),
            window(FaultKind::ClockOffset, &[2], 55_000, 75_000),
            window(FaultKind::PauseLeader, &[2], 60_000, 64_000),
        ];
        let mut rng = Lcg(7);
        let mut ops = Vec::new();
        let mut pending: Vec<(u64, String)> = Vec::new();
        let mut t = 0u64;
        let mut n = 0u64;
        while t < 90_000 {
            t += 20 + rng.next(30);
            let faulty = faults.iter().any(|w| w.start_ms <= t && t <= w.end_ms);
            let latency = if faulty { 5 + rng.next(3_000) } else { 2 + rng.next(25) };
            let outcome = match (faulty, rng.next(100)) {
                (true, r) if r < 30 => Outcome::Unknown,
                (true, r) if r < 60 => Outcome::Fail,
                (false, r) if r < 1 => Outcome::Fail,
                _ => Outcome::Ok,
            };
            n += 1;
            if rng.next(2) == 0 {
                let body = format!("b{n}");
                let delay_ms = rng.next(4) * 1_000;
                if outcome == Outcome::Ok && delay_ms > 0 {
                    pending.push((t + delay_ms, body.clone()));
                }
                ops.push(Op {
                    process: 1,
                    invoke_ms: t,
                    complete_ms: t + latency,
                    outcome,
                    call: Call::Publish {
                        body,
                        delay_ms,
                        key: None,
                        job_id: Some(format!("j{n}")),
                    },
                });
            } else {
                let mut got = Vec::new();
                if outcome == Outcome::Ok {
                    let due: Vec<usize> =
                        (0..pending.len()).filter(|i| pending[*i].0 <= t).take(2).collect();
                    for i in due.into_iter().rev() {
                        let (_, body) = pending.remove(i);
                        got.push(Delivery {
                            job_id: format!("j-{body}"),
                            body,
                            attempt: 1,
                            lease: "l".into(),
                        });
                    }
                }
                ops.push(Op {
                    process: 2,
                    invoke_ms: t,
                    complete_ms: t + latency,
                    outcome,
                    call: Call::Reserve { ttr_ms: 5_000, got },
                });
            }
        }
        (ops, faults)
    }

    /// Checks that start and end tags nest properly: a poor man's XML parser, enough to catch
    /// an unclosed group or a `<` that escaped escaping.
    fn assert_balanced(svg: &str) {
        let mut stack: Vec<&str> = Vec::new();
        let mut rest = svg;
        while let Some(open) = rest.find('<') {
            let close = rest[open..].find('>').expect("unterminated tag") + open;
            let tag = &rest[open + 1..close];
            assert!(!tag.contains('<'), "stray < inside {tag:?}");
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(stack.pop(), Some(name.trim()), "mismatched </{name}>");
            } else if !tag.ends_with('/') {
                let name = tag.split_whitespace().next().expect("tag name");
                stack.push(name);
            }
            rest = &rest[close + 1..];
        }
        assert!(stack.is_empty(), "unclosed: {stack:?}");
    }

    #[test]
    fn the_picture_is_well_formed_and_escaped() {
        let (ops, faults) = sample_run();
        let s = svg(&ops, &faults, &[], "run <seed 7> & \"friends\"");
        assert!(s.starts_with("<svg"), "{}", &s[..40]);
        assert!(s.ends_with("</svg>"));
        assert_eq!(s.matches("<g ").count() + s.matches("<g>").count(), s.matches("</g>").count());
        assert_balanced(&s);
        assert_eq!(s.matches(r#"class="fault-bg""#).count(), faults.len());
        assert!(s.contains("run &lt;seed 7&gt; &amp; &quot;friends&quot;"));
        assert!(!s.contains("<seed"));
        assert!(s.contains("no anomalies"));
        assert!(!s.contains(r#"class="anomaly""#));
        for k in ["isolate-leader", "kill-node", "clock-offset", "pause-leader"] {
            assert!(s.contains(k), "{k} missing");
        }
    }

    #[test]
    fn anomalies_are_marked_where_their_operation_happened() {
        let (ops, faults) = sample_run();
        let body = ops
            .iter()
            .find_map(|op| match &op.call {
                Call::Publish { body, .. } if op.invoke_ms > 30_000 => Some(body.clone()),
                _ => None,
            })
            .expect("a publish after 30 s");
        let invoked = ops
            .iter()
            .find(|op| matches!(&op.call, Call::Publish { body: b, .. } if *b == body))
            .map(|op| op.invoke_ms)
            .expect("its op");
        let anomalies = vec![
            Anomaly::Lost { body: body.clone() },
            Anomaly::Diverged { nodes: vec![(1, Some(3), "a<b".into()), (2, None, "c".into())] },
        ];
        assert_eq!(anomaly_time(&anomalies[0], &ops, 99), invoked);
        assert_eq!(anomaly_time(&anomalies[1], &ops, 99), 99);
        let s = svg(&ops, &faults, &anomalies, "with anomalies");
        assert_balanced(&s);
        assert_eq!(s.matches(r#"class="anomaly""#).count(), 2);
        assert!(s.contains(">2 anomalies</text>"));
        assert!(!s.contains("no anomalies"));
        assert!(s.contains("a&lt;b"), "tooltip escaped");
    }

    #[test]
    fn anomaly_times_follow_the_operation_concerned() {
        let d = |job: &str, body: &str, attempt| Delivery {
            job_id: job.into(),
            body: body.into(),
            attempt,
            lease: format!("l{attempt}"),
        };
        let op = |t: u64, call| Op {
            process: 1,
            invoke_ms: t,
            complete_ms: t + 5,
            outcome: Outcome::Ok,
            call,
        };
        let h = vec![
            op(
                100,
                Call::Publish {
                    body: "b".into(),
                    delay_ms: 0,
                    key: Some("k".into()),
                    job_id: Some("j".into()),
                },
            ),
            op(
                150,
                Call::Publish {
                    body: "c".into(),
                    delay_ms: 0,
                    key: Some("k".into()),
                    job_id: Some("j2".into()),
                },
            ),
            op(200, Call::Reserve { ttr_ms: 1_000, got: vec![d("j", "b", 1)] }),
            op(300, Call::Reserve { ttr_ms: 1_000, got: vec![d("j", "b", 1)] }),
            op(400, Call::Reserve { ttr_ms: 1_000, got: vec![d("j", "b", 2)] }),
            op(500, Call::Ack { job_id: "j".into(), lease: "l1".into() }),
            op(600, Call::DeadLetter { bodies: vec!["b".into()] }),
        ];
        let at = |a: Anomaly| anomaly_time(&a, &h, 9_999);
        assert_eq!(at(Anomaly::Lost { body: "b".into() }), 100);
        assert_eq!(at(Anomaly::Early { body: "b".into(), by_ms: 1 }), 205);
        assert_eq!(at(Anomaly::LeaseOverlap { job_id: "j".into(), attempts: (1, 2) }), 405);
        assert_eq!(at(Anomaly::AttemptRepeated { job_id: "j".into(), attempt: 1 }), 305);
        assert_eq!(at(Anomaly::StaleAckAccepted { job_id: "j".into(), lease: "l1".into() }), 500);
        assert_eq!(at(Anomaly::DeliveredAfterAck { job_id: "j".into() }), 405);
        assert_eq!(at(Anomaly::AckedInDeadLetter { body: "b".into() }), 605);
        assert_eq!(at(Anomaly::DuplicateKey { key: "k".into(), job_ids: vec![] }), 150);
        assert_eq!(at(Anomaly::Unexpected { body: "nowhere".into() }), 9_999);
    }

    #[test]
    fn large_scatters_are_thinned_but_keep_every_failure() {
        assert_eq!(keep_every(100, 5), 1);
        assert_eq!(keep_every(40_000, 0), 2);
        assert_eq!(keep_every(30_000, 10_000), 3);
        let ops: Vec<Op> = (0..50_000u64)
            .map(|i| Op {
                process: 1,
                invoke_ms: i,
                complete_ms: i + 3,
                outcome: if i % 100 == 0 { Outcome::Unknown } else { Outcome::Ok },
                call: Call::Ack { job_id: "j".into(), lease: "l".into() },
            })
            .collect();
        let s = svg(&ops, &[], &[], "big");
        let circles = s.matches("<circle").count();
        assert!(circles <= MAX_POINTS + 500 + 10, "{circles}");
        let unknown =
            s.split(&format!(r#"fill="{UNKNOWN}" fill-opacity="0.9">"#)).nth(1).expect("group");
        let unknown = &unknown[..unknown.find("</g>").expect("end")];
        assert_eq!(unknown.matches("<circle").count(), 500);
    }

    #[test]
    fn overlapping_faults_on_a_node_get_their_own_tracks() {
        let faults = vec![
            window(FaultKind::ClockOffset, &[2], 0, 100),
            window(FaultKind::PauseNode, &[2], 50, 60),
            window(FaultKind::KillNode, &[2, 4], 100, 200),
            window(FaultKind::KillAll, &[], 300, 400),
        ];
        let l = lane_layout(&faults);
        assert_eq!(l.rows, vec![(1, 0, 1), (2, 1, 2), (3, 3, 1), (4, 4, 1)]);
        assert_eq!(l.tracks, 5);
        assert_eq!(l.bars, vec![vec![1], vec![2], vec![1, 4], vec![0, 1, 3, 4]]);
    }

    #[test]
    fn an_empty_run_still_draws() {
        let s = svg(&[], &[], &[], "");
        assert_balanced(&s);
        assert!(s.contains("no anomalies"));
        assert!(s.contains("no delayed job was delivered"));
    }

    /// Writes the sample picture for a human to look at:
    /// `rsvg-convert /tmp/jepsen-sample.svg -o /tmp/jepsen-sample.png`.
    #[test]
    fn writes_a_sample_picture() {
        let (ops, faults) = sample_run();
        let lost = ops.iter().find_map(|op| match &op.call {
            Call::Publish { body, .. } if op.invoke_ms > 42_000 => Some(body.clone()),
            _ => None,
        });
        let mut anomalies: Vec<Anomaly> =
            lost.into_iter().map(|body| Anomaly::Lost { body }).collect();
        anomalies.push(Anomaly::Diverged { nodes: vec![] });
        let s = svg(&ops, &faults, &anomalies, "delayd chaos run - seed 7 (sample)");
        let path = std::env::temp_dir().join("jepsen-sample.svg");
        std::fs::write(&path, s).expect("write sample");
    }
}
