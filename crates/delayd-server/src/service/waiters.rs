//! Long-poll waiters: reserves that found nothing park here until a queue they named gains
//! ready jobs. Applied entries report such queues ([`delayd_core::Effects`]); the waiters of
//! those queues are woken and retry their reserve.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use delayd_core::QueueName;
use tokio::sync::Notify;

/// A queue that gains this many ready jobs at once wakes all its waiters: more long-polls
/// than this rarely wait on one queue of one node, and one `notify_waiters` is cheaper than
/// that many `notify_one`s.
const WAKE_ALL_FROM: u64 = 256;

/// The per-queue wake-up registry.
#[derive(Default)]
pub struct Waiters {
    queues: Mutex<HashMap<QueueName, Arc<Notify>>>,
}

impl Waiters {
    /// The notifier of a queue; hold it while waiting.
    pub fn subscribe(&self, queue: &QueueName) -> Arc<Notify> {
        let mut map = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(queue.clone()).or_default().clone()
    }

    /// Wakes, on each queue, as many waiters as it gained ready jobs.
    ///
    /// Waking every waiter would send them all to the leader for a handful of jobs: with 64
    /// consumers long-polling a queue that gains one job per tick, 63 reserves per tick
    /// would come back empty, each a log entry. One wake-up per job is enough because a
    /// woken waiter that finds nothing (another consumer, here or on another replica, took
    /// the job) checks again before it sleeps, and a waiter that goes away before it acts
    /// on its wake-up hands it to the next one (tokio's `Notify` does that for
    /// `notify_one`). Each replica wakes its own waiters, so a job is offered to at most one
    /// waiter per replica.
    pub fn wake<'a>(&self, queues: impl IntoIterator<Item = (&'a QueueName, &'a u64)>) {
        let map = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        for (q, gained) in queues {
            if let Some(n) = map.get(q) {
                // Past the number of waiters there can be, waking all costs less.
                if *gained >= WAKE_ALL_FROM {
                    n.notify_waiters();
                } else {
                    for _ in 0..*gained {
                        n.notify_one();
                    }
                }
            }
        }
    }

    /// Wakes every waiter (after a snapshot replaced the state).
    pub fn wake_all(&self) {
        let map = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        for n in map.values() {
            n.notify_waiters();
        }
    }

    /// Forgets queues nobody waits on, so the map stays as small as the set of live waits.
    pub fn release(&self, queues: &[QueueName]) {
        let mut map = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        for q in queues {
            if map.get(q).is_some_and(|n| Arc::strong_count(n) == 1) {
                map.remove(q);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    fn queue() -> QueueName {
        QueueName::new("ns", "q")
    }

    /// Long-polls as the service registers them: subscribed, then enabled before the check.
    fn waiting(notify: &Notify) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
        let mut w = Box::pin(notify.notified());
        w.as_mut().enable();
        w
    }

    #[test]
    fn one_job_wakes_one_waiter_and_a_burst_wakes_all() {
        let waiters = Waiters::default();
        let notify = waiters.subscribe(&queue());
        let mut parked: Vec<_> = (0..4).map(|_| waiting(&notify)).collect();
        waiters.wake([(&queue(), &1)]);
        let woken = parked.iter_mut().filter_map(|w| w.as_mut().now_or_never()).count();
        assert_eq!(woken, 1, "one job, one waiter");

        let mut parked: Vec<_> = (0..4).map(|_| waiting(&notify)).collect();
        waiters.wake([(&queue(), &WAKE_ALL_FROM)]);
        let woken = parked.iter_mut().filter_map(|w| w.as_mut().now_or_never()).count();
        assert_eq!(woken, 4);
    }

    /// A consumer that disconnects after its wake-up must not take the job's only wake-up
    /// with it: the next waiter gets it.
    #[test]
    fn a_wake_up_of_a_waiter_that_went_away_passes_on() {
        let waiters = Waiters::default();
        let notify = waiters.subscribe(&queue());
        let gone = waiting(&notify);
        let mut next = waiting(&notify);
        waiters.wake([(&queue(), &1)]);
        drop(gone);
        assert!(next.as_mut().now_or_never().is_some(), "the wake-up passed on");
    }

    /// Jobs made ready while nobody waits leave a wake-up behind, so the next long-poll
    /// looks at once instead of sleeping past them.
    #[test]
    fn a_job_made_ready_with_nobody_waiting_is_not_slept_past() {
        let waiters = Waiters::default();
        let notify = waiters.subscribe(&queue());
        waiters.wake([(&queue(), &3)]);
        assert!(waiting(&notify).as_mut().now_or_never().is_some());
    }
}
