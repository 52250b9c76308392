//! Progress of a long-mode run: a bar over the workload's planned time (operations recorded
//! and faults injected so far beside it), then a spinner while the cluster recovers and the
//! queues drain.
//!
//! Drawn on stderr, and only when stderr is a terminal; otherwise nothing is drawn and the
//! output is what it would be without them. The lines the harness prints while a bar is up
//! (the nemesis's faults) go through [`println()`], which lifts the bar off the screen for the
//! line instead of writing across it.

use std::io::IsTerminal;
use std::sync::OnceLock;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often the bar is redrawn.
const TICK: Duration = Duration::from_millis(500);

/// The bars of this process: drawn on stderr if it is a terminal, else hidden.
fn bars() -> &'static MultiProgress {
    static BARS: OnceLock<MultiProgress> = OnceLock::new();
    BARS.get_or_init(|| {
        let target = if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        MultiProgress::with_draw_target(target)
    })
}

/// Prints `line` on stdout, above the bars.
pub fn println(line: &str) {
    bars().suspend(|| println!("{line}"));
}

fn style(template: &str) -> ProgressStyle {
    // The templates are constants of this file; a broken one falls back to a plain bar.
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// A bar or spinner on the screen while it lives; cleared when dropped.
pub struct Bar(ProgressBar);

impl Bar {
    fn new(bar: ProgressBar) -> Bar {
        let bar = bars().add(bar);
        if !bars().is_hidden() {
            bar.enable_steady_tick(TICK);
        }
        Bar(bar)
    }

    /// The workload's bar: `planned` of workload time.
    pub fn workload(planned: Duration) -> Bar {
        let template = "workload [{bar:30}] {pos}/{len} s, {msg}";
        Bar::new(ProgressBar::new(planned.as_secs()).with_style(style(template)))
    }

    /// A spinner with the time elapsed, for a phase of unknown length.
    pub fn phase(what: &str) -> Bar {
        let bar =
            Bar::new(ProgressBar::new_spinner().with_style(style("{spinner} {msg} {elapsed}")));
        bar.0.set_message(what.to_string());
        bar
    }

    /// Moves the workload's bar to `elapsed`, with the operations recorded and the planned
    /// faults whose time has come.
    pub fn workload_at(&self, elapsed: Duration, operations: usize, begun: usize, planned: usize) {
        self.0.set_position(elapsed.as_secs().min(self.0.length().unwrap_or(u64::MAX)));
        self.0.set_message(format!("{operations} operations, faults {begun}/{planned}"));
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.0.finish_and_clear();
        bars().remove(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_bar_follows_time_and_stops_at_its_end() {
        let bar = Bar::workload(Duration::from_secs(900));
        bar.workload_at(Duration::from_millis(12_400), 1_000, 2, 40);
        assert_eq!((bar.0.position(), bar.0.length()), (12, Some(900)));
        assert_eq!(bar.0.message(), "1000 operations, faults 2/40");
        // Read a little after the planned time: the bar stays full, not past it.
        bar.workload_at(Duration::from_secs(905), 2_000, 40, 40);
        assert_eq!(bar.0.position(), 900);
        let handle = bar.0.clone();
        drop(bar);
        assert!(handle.is_finished());
        drop(Bar::phase("draining"));
        println("a line above the bars");
    }
}
