//! Progress bars for the long phases: which workload is running and for how long, the jobs
//! a preload or the `storage` run has published (millions, for minutes), the jobs a drain has
//! acked, and the wait for followers to catch up.
//!
//! Bars are drawn on stderr, and only when stderr is a terminal: in CI, or with stderr sent
//! to a file, nothing is drawn and the output is what it would be without them. Every bar
//! belongs to one [`MultiProgress`]; the result lines printed while a bar is up go through
//! [`println()`], which lifts the bars off the screen for the line instead of writing across
//! them.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often a spinner turns, and a watched counter is read.
const TICK: Duration = Duration::from_millis(200);

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

/// Prints `line` on stderr, above the bars.
pub fn eprintln(line: &str) {
    bars().suspend(|| eprintln!("{line}"));
}

fn style(template: &str) -> ProgressStyle {
    // The templates are constants of this file; a broken one falls back to a plain bar.
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// A bar on the screen while it lives; dropped, it is cleared (whether or not it got to
/// the end) and its watcher, if any, stops.
pub struct Bar {
    bar: ProgressBar,
    watcher: Option<tokio::task::JoinHandle<()>>,
}

impl Bar {
    fn new(bar: ProgressBar, message: String) -> Bar {
        let bar = bars().add(bar);
        bar.set_message(message);
        if !bars().is_hidden() {
            bar.enable_steady_tick(TICK);
        }
        Bar { bar, watcher: None }
    }

    /// A handle for workers to advance the bar with [`ProgressBar::inc`].
    pub fn handle(&self) -> ProgressBar {
        self.bar.clone()
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        if let Some(w) = self.watcher.take() {
            w.abort();
        }
        self.bar.finish_and_clear();
        bars().remove(&self.bar);
    }
}

/// A spinner with the time elapsed, for a phase of unknown length.
pub fn phase(what: impl Into<String>) -> Bar {
    let bar = ProgressBar::new_spinner().with_style(style("{spinner} {msg} {elapsed}"));
    Bar::new(bar, what.into())
}

/// A bar of `total` jobs, advanced by the workers through [`Bar::handle`].
pub fn jobs(what: impl Into<String>, total: u64) -> Bar {
    let template = "  {msg} [{bar:30}] {human_pos}/{human_len} jobs, {per_sec:0}, eta {eta}";
    Bar::new(ProgressBar::new(total).with_style(style(template)), what.into())
}

/// A bar of `total` jobs that follows `done`, a counter the workers keep anyway (a drain's
/// acked jobs). Needs a tokio runtime.
pub fn watch(what: impl Into<String>, total: u64, done: Arc<AtomicU64>) -> Bar {
    let mut bar = jobs(what, total);
    if !bars().is_hidden() {
        let handle = bar.handle();
        bar.watcher = Some(tokio::spawn(async move {
            loop {
                handle.set_position(done.load(Ordering::Relaxed).min(total));
                tokio::time::sleep(TICK).await;
            }
        }));
    }
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bars_count_and_go_away() {
        // Whatever the test's stderr is, the bars keep their counts and vanish when dropped.
        let bar = jobs("publishing", 10);
        let h = bar.handle();
        h.inc(4);
        h.inc(6);
        assert_eq!((h.position(), h.length()), (10, Some(10)));
        drop(bar);
        assert!(h.is_finished());
        let acked = Arc::new(AtomicU64::new(3));
        let watched = watch("draining", 5, acked);
        assert_eq!(watched.handle().length(), Some(5));
        drop(watched);
        drop(phase("waiting"));
        println("a line above the bars");
    }
}
