//! The timer pump: runs only while this node is the leader.
//!
//! It reads the head of the timer index (one RocksDB seek), sleeps until that deadline, until
//! an applied entry adds an earlier one, or until woken to look again (a snapshot replaced the
//! state; the test-only clock moved), then proposes a `Tick` that fires at most
//! `tick_limit` deadlines; when the tick reports more, it proposes the next at once. The head
//! is re-read every round, so a new leader needs no warm-up: the index in RocksDB is the
//! whole truth. Waking slightly early is harmless — the tick fires only what is due at the
//! entry's timestamp — and a late tick from a deposed leader finds nothing left to fire.
//!
//! Reserves parked on the leader for the queues a tick makes jobs ready in ride in the tick's
//! entry ([`crate::riders`]), so those jobs are delivered in the same commit.
//!
//! Deadlines come from clients (bounded by the horizon at the edge, but the pump does not rely
//! on it): every conversion to microseconds saturates, and a sleep is capped at
//! [`MAX_SLEEP`], so no stored deadline can make the pump spin or panic. A tick that fires
//! nothing although the head looked due (clock skew between the pump and the replicated
//! clock) is followed by a short pause, never by a burst of empty entries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use delayd_core::{query, Command, Outcome, Reply};
use delayd_store::{Raft, StateReader};
use openraft::async_runtime::watch::WatchReceiver;
use openraft::ServerState;
use tokio::sync::{watch, Notify};

use crate::clock::Clock;
use crate::cluster::{role, until_leading};
use crate::error::ClusterError;
use crate::propose::Proposer;
use crate::riders::{Deliver, Rider, Riders};

/// The longest the pump sleeps without re-reading the timer index.
pub const MAX_SLEEP: Duration = Duration::from_secs(3600);

/// The pause after a tick that fired nothing.
const IDLE_TICK_PAUSE: Duration = Duration::from_millis(10);

/// Shared between the pump and the apply listener.
#[derive(Default)]
pub struct PumpSignal {
    /// Woken when an applied entry adds a deadline earlier than `planned_ms`, and by
    /// [`PumpSignal::wake`].
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

    /// Wakes the pump to read the timer index again, whatever it sleeps towards: for what
    /// changes the timers' meaning without adding one (a snapshot installed, the clock moved).
    pub fn wake(&self) {
        self.notify.notify_one();
    }

    /// Called after each applied batch that added timers.
    pub fn timer_added(&self, deadline_ms: u64) {
        if deadline_ms < self.planned_ms.load(Ordering::Acquire) {
            self.notify.notify_one();
        }
    }
}

/// Runs the pump until `shutdown` flips to true; each tick carries the [`Riders`] parked
/// for the jobs it is about to make ready.
#[allow(clippy::too_many_arguments)] // the node's parts, passed once at start
pub async fn run(
    raft: Raft,
    reader: StateReader,
    proposer: Proposer,
    clock: Clock,
    signal: Arc<PumpSignal>,
    riders: Arc<Riders>,
    tick_limit: u32,
    mut shutdown: watch::Receiver<bool>,
) {
    // Only the role matters here: the server metrics change with it alone, where the full
    // metrics change several times per log entry and would wake the pump each time.
    let mut metrics = raft.server_metrics();
    let mut ride = true;
    loop {
        if *shutdown.borrow() {
            return;
        }
        // `None`: Raft has stopped (a fatal storage error stops it without the shutdown flag).
        let Some(role) = role(&mut metrics) else { return };
        if role != ServerState::Leader {
            signal.planned_ms.store(u64::MAX, Ordering::Release);
            tokio::select! {
                led = until_leading(&mut metrics) => if !led { return },
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
                let taken = if ride {
                    take_riders(&reader, &riders, now / 1000, tick_limit, &proposer)
                } else {
                    Vec::new()
                };
                let carried = !taken.is_empty();
                let ticked = tick(&proposer, tick_limit, taken).await;
                // A tick that carried riders and failed is retried bare: the riders must never
                // be why timers stall.
                ride = ticked.is_ok() || !carried;
                match ticked {
                    Ok(Ok(Reply::Ticked { fired: 0, more: false })) => {
                        tracing::debug!(deadline, "tick fired nothing");
                        tokio::time::sleep(IDLE_TICK_PAUSE).await;
                    }
                    Ok(Ok(Reply::Ticked { fired, more })) => {
                        tracing::trace!(fired, more, "tick");
                    }
                    Ok(other) => tracing::warn!(?other, "unexpected tick outcome"),
                    Err(e) if carried => {
                        tracing::debug!(error = %e, "tick with riders not committed; next bare");
                    }
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
            r = metrics.wait_until(|m| m.state != ServerState::Leader) => if r.is_err() { return },
            _ = shutdown.changed() => {}
        }
    }
}

/// Most bytes of rider commands one tick carries: small against an entry, so that a tick
/// with riders is refused by the proposer's load shedding no more often than a bare one.
const RIDER_BYTES: usize = 64 * 1024;

/// The riders for the tick about to be proposed: of the queues where the timers due at
/// `now_ms` can make jobs ready, as many as those jobs. Only read when some rider is parked;
/// a failed read means a tick without riders.
fn take_riders(
    reader: &StateReader,
    riders: &Riders,
    now_ms: u64,
    tick_limit: u32,
    proposer: &Proposer,
) -> Vec<Rider> {
    let wanted = riders.demand();
    if wanted.is_empty() {
        return Vec::new();
    }
    let due = reader
        .read_view()
        .and_then(|v| Ok(query::due_ready_by_queue(&v, now_ms, tick_limit, &wanted)?));
    match due {
        Ok(mut due) => riders.take(
            &mut due,
            proposer.max_batch().saturating_sub(1),
            RIDER_BYTES.min(proposer.max_entry_bytes() / 2),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "timer pump cannot count the due timers");
            Vec::new()
        }
    }
}

/// A rider's share of the entry: how many outcomes are its own, and where they go.
type Handout = (usize, Deliver);

/// Proposes one `Tick` firing at most `limit` deadlines, with `riders`' commands after it in
/// the same entry, and hands each rider its outcomes; returns the tick's.
async fn tick(
    proposer: &Proposer,
    limit: u32,
    riders: Vec<Rider>,
) -> Result<Outcome, ClusterError> {
    let mut commands = vec![Command::Tick { limit }];
    let mut handouts: Vec<Handout> = Vec::with_capacity(riders.len());
    for rider in riders {
        handouts.push((rider.commands.len(), rider.deliver));
        commands.extend(rider.commands);
    }
    hand_out(proposer.propose(commands).await, handouts)
}

/// Splits an entry's outcomes: the first is the tick's, returned; each rider gets the next
/// as many as it sent commands. A failed entry fails every rider alike.
fn hand_out(
    outcomes: Result<Vec<Outcome>, ClusterError>,
    handouts: Vec<Handout>,
) -> Result<Outcome, ClusterError> {
    match outcomes {
        Ok(outcomes) => {
            let mut outcomes = outcomes.into_iter();
            let tick = outcomes.next();
            for (len, deliver) in handouts {
                deliver(Ok(outcomes.by_ref().take(len).collect()));
            }
            tick.ok_or_else(|| ClusterError::Internal("entry applied without an outcome".into()))
        }
        Err(e) => {
            for (_, deliver) in handouts {
                deliver(Err(e.clone()));
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    /// Each rider gets exactly its own outcomes, however many commands it sent; a failed
    /// entry fails them all.
    #[test]
    fn an_entrys_outcomes_go_to_the_tick_and_each_rider_in_order() {
        use crate::riders::RideOutcome;
        use delayd_core::{Rejection, Reply};
        use std::sync::Mutex;
        let got = Arc::new(Mutex::new(Vec::new()));
        let handout = |len: usize, name: &'static str| -> Handout {
            let got = got.clone();
            let deliver = move |o: RideOutcome| {
                got.lock().unwrap_or_else(|p| p.into_inner()).push((name, o));
            };
            (len, Box::new(deliver))
        };
        let outcomes = vec![
            Ok(Reply::Ticked { fired: 2, more: false }),
            Ok(Reply::Removed(true)), // the first rider's ack
            Ok(Reply::Reserved(Vec::new())),
            Err(Rejection::JobNotFound),
        ];
        let tick = hand_out(Ok(outcomes), vec![handout(2, "ack+reserve"), handout(1, "reserve")]);
        assert_eq!(tick, Ok(Ok(Reply::Ticked { fired: 2, more: false })));
        let got = std::mem::take(&mut *got.lock().unwrap_or_else(|p| p.into_inner()));
        assert_eq!(
            got,
            [
                (
                    "ack+reserve",
                    Ok(vec![Ok(Reply::Removed(true)), Ok(Reply::Reserved(Vec::new()))])
                ),
                ("reserve", Ok(vec![Err(Rejection::JobNotFound)])),
            ]
        );
        let failed = ClusterError::NotLeader(Some(2));
        let got2 = Arc::new(Mutex::new(0));
        let counted = |got2: &Arc<Mutex<u32>>| -> Handout {
            let got2 = got2.clone();
            let deliver = move |o: RideOutcome| {
                assert_eq!(o, Err(ClusterError::NotLeader(Some(2))));
                *got2.lock().unwrap_or_else(|p| p.into_inner()) += 1;
            };
            (1, Box::new(deliver))
        };
        assert_eq!(
            hand_out(Err(failed.clone()), vec![counted(&got2), counted(&got2)]),
            Err(failed)
        );
        assert_eq!(*got2.lock().unwrap_or_else(|p| p.into_inner()), 2);
    }

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
