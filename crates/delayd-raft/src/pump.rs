//! The timer pump: runs only while this node is the leader.
//!
//! It reads the head of the timer index (one RocksDB seek), sleeps until that deadline or
//! until an applied entry adds an earlier one, then proposes a `Tick` that fires at most
//! `tick_limit` deadlines; when the tick reports more, it proposes the next at once. The head
//! is re-read every round, so a new leader needs no warm-up: the index in RocksDB is the
//! whole truth. Waking slightly early is harmless — the tick fires only what is due at the
//! entry's timestamp — and a late tick from a deposed leader finds nothing left to fire.
//!
//! Deadlines come from clients (bounded by the horizon at the edge, but the pump does not rely
//! on it): every conversion to microseconds saturates, and a sleep is capped at
//! [`MAX_SLEEP`], so no stored deadline can make the pump spin or panic. A tick that fires
//! nothing although the head looked due (clock skew between the pump and the replicated
//! clock) is followed by a short pause, never by a burst of empty entries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use delayd_core::{query, Command, Reply};
use delayd_store::{Raft, StateReader};
use openraft::async_runtime::watch::WatchReceiver;
use openraft::ServerState;
use tokio::sync::{watch, Notify};

use crate::clock::Clock;
use crate::propose::Proposer;

/// The longest the pump sleeps without re-reading the timer index.
pub const MAX_SLEEP: Duration = Duration::from_secs(3600);

/// The pause after a tick that fired nothing.
const IDLE_TICK_PAUSE: Duration = Duration::from_millis(10);

/// Shared between the pump and the apply listener.
#[derive(Default)]
pub struct PumpSignal {
    /// Woken when an applied entry adds a deadline earlier than `planned_ms`.
    pub notify: Notify,
    /// The deadline the pump currently sleeps towards (`u64::MAX`: none).
    pub planned_ms: AtomicU64,
}

impl PumpSignal {
    /// Called before the pump reads the head of the timer index: until it has planned its
    /// next sleep ([`PumpSignal::plan`]), any timer added counts as earlier than planned and
    /// leaves a wake-up permit, so a deadline applied between the read and the sleep is never
    /// missed.
    pub fn reading(&self) {
        self.planned_ms.store(u64::MAX, Ordering::Release);
    }

    /// Records the deadline the pump is about to sleep towards (`None`: no timer at all).
    pub fn plan(&self, deadline_ms: Option<u64>) {
        self.planned_ms.store(deadline_ms.unwrap_or(u64::MAX), Ordering::Release);
    }

    /// Called after each applied batch that added timers.
    pub fn timer_added(&self, deadline_ms: u64) {
        if deadline_ms < self.planned_ms.load(Ordering::Acquire) {
            self.notify.notify_one();
        }
    }
}

/// Runs the pump until `shutdown` flips to true.
pub async fn run(
    raft: Raft,
    reader: StateReader,
    proposer: Proposer,
    clock: Clock,
    signal: Arc<PumpSignal>,
    tick_limit: u32,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut metrics = raft.metrics();
    loop {
        if *shutdown.borrow() {
            return;
        }
        let leader = metrics.borrow_watched().state == ServerState::Leader;
        if !leader {
            signal.planned_ms.store(u64::MAX, Ordering::Release);
            tokio::select! {
                r = metrics.wait_until(|m| m.state == ServerState::Leader) => if r.is_err() { return },
                _ = shutdown.changed() => {}
            }
            continue;
        }
        // Open the window first, then look: a timer applied from here on wakes the sleep below.
        signal.reading();
        let next = match reader.read_view().and_then(|v| Ok(query::next_deadline(&v)?)) {
            Ok(next) => next,
            Err(e) => {
                tracing::error!(error = %e, "timer pump cannot read the timer index");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let now = clock.now_us();
        if let Some(deadline) = next {
            if deadline.saturating_mul(1000) <= now {
                match proposer.propose_one(Command::Tick { limit: tick_limit }).await {
                    Ok(Ok(Reply::Ticked { fired: 0, more: false })) => {
                        tracing::debug!(deadline, "tick fired nothing");
                        tokio::time::sleep(IDLE_TICK_PAUSE).await;
                    }
                    Ok(Ok(Reply::Ticked { fired, more })) => {
                        tracing::trace!(fired, more, "tick");
                    }
                    Ok(other) => tracing::warn!(?other, "unexpected tick outcome"),
                    Err(e) => {
                        // Lost leadership or shutting down: the loop re-checks both.
                        tracing::debug!(error = %e, "tick not committed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                continue;
            }
        }
        signal.plan(next);
        let sleep = match next {
            Some(deadline) => {
                Duration::from_micros(deadline.saturating_mul(1000).saturating_sub(now))
                    .min(MAX_SLEEP)
            }
            None => MAX_SLEEP,
        };
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = signal.notify.notified() => {}
            // Metrics change with every applied entry; only losing leadership matters here.
            r = metrics.wait_until(|m| m.state != ServerState::Leader) => if r.is_err() { return },
            _ = shutdown.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    /// Found in review: the pump stored 0 as its plan while it read the timer index, so a
    /// deadline applied in that window compared as "later than planned" and left no permit;
    /// the pump then slept towards the old head (up to an hour) past the new deadline.
    #[test]
    fn a_timer_added_while_the_pump_reads_the_index_wakes_it() {
        let signal = PumpSignal::default();
        signal.reading();
        signal.timer_added(5_000); // applied while the head (10_000) is being read
        signal.plan(Some(10_000));
        assert!(signal.notify.notified().now_or_never().is_some(), "the sleep wakes at once");

        // Once planned, only an earlier deadline wakes it.
        signal.timer_added(20_000);
        assert!(signal.notify.notified().now_or_never().is_none());
        signal.timer_added(9_000);
        assert!(signal.notify.notified().now_or_never().is_some());
    }
}
