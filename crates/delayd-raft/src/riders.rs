//! Riders: reserves parked on the leader that go into the timer pump's next tick entry.
//!
//! A long-poll parked on the leader used to learn of a job coming due only once the tick
//! that made it ready had been committed and applied; its reserve then went into a log entry
//! of its own, a second commit round (fsyncs and a quorum round trip) between the due time
//! and the delivery. A parked reserve can instead *ride*: it leaves its commands here (the
//! reserve, after the ack it holds, if any), and the pump appends them to its next `Tick`.
//! They apply right after the tick, in the same entry, so the jobs the tick made ready reach
//! those consumers one commit after they came due, in no entry of their own.
//!
//! The pump counts, per queue, the due timers that can make a job ready
//! ([`delayd_core::query::due_ready_by_queue`]) and takes riders of those queues, the
//! longest-parked first, until their reserves ask for that many jobs. A rider of a queue with
//! nothing due stays parked. The count is an upper bound (a lease that runs out may send its
//! job to the dead letter), so a rider can still come back with nothing; it then carries on
//! as a waiter woken for nothing would. A tick carries at most [`MAX_RIDERS_PER_TICK`]
//! riders, within the byte and command budget the pump gives it.
//!
//! The pump answers every rider it takes at most once, with the entry's outcomes or the
//! error that stopped it; should the pump's task end first, the rider's `deliver` is dropped
//! uncalled, which its owner must read as "outcome unknown". A rider its owner withdrew never
//! reaches an entry. Only the leader's pump takes riders.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use delayd_core::{Command, Outcome, QueueName};

use crate::error::ClusterError;

/// Most riders one tick entry carries. Far more long-polls than this rarely wait on one
/// leader; the rest ride the next tick or are woken by this one's apply, as before.
pub const MAX_RIDERS_PER_TICK: usize = 256;

/// What a rider's owner is told: the outcomes of its commands, in order, or why the entry
/// did not go through.
pub type RideOutcome = Result<Vec<Outcome>, ClusterError>;

/// Called at most once with the outcomes of a rider's commands (from the pump's task: be
/// quick).
pub type Deliver = Box<dyn FnOnce(RideOutcome) + Send>;

/// A parked reserve's commands and where their outcomes go.
pub struct Rider {
    /// The commands, applied after the tick in this order; the last is the reserve.
    pub(crate) commands: Vec<Command>,
    pub(crate) deliver: Deliver,
    /// The queues its reserve takes from, and how many jobs it asks for: read from the
    /// reserve once, for the pump's walk.
    queues: Vec<QueueName>,
    jobs: u32,
}

impl Rider {
    /// A rider of `commands` (a held ack, say, then the reserve), whose outcomes go to
    /// `deliver`. The last command must be the reserve (`Reserve` or `ReserveUrgent`): its
    /// queues and count decide which ticks take the rider. `None` when it is not.
    pub fn new(commands: Vec<Command>, deliver: Deliver) -> Option<Rider> {
        let (queues, jobs) = match commands.last()? {
            Command::Reserve { queues, count, .. }
            | Command::ReserveUrgent { queues, count, .. } => (queues.clone(), *count),
            _ => return None,
        };
        Some(Rider { commands, deliver, queues, jobs })
    }
}

impl std::fmt::Debug for Rider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rider").field("commands", &self.commands).finish_non_exhaustive()
    }
}

/// The riders parked on this node, by ticket: in the order they parked.
#[derive(Default)]
pub struct Riders {
    parked: Mutex<Parked>,
}

#[derive(Default)]
struct Parked {
    next_ticket: u64,
    riders: BTreeMap<u64, Rider>,
    /// The jobs the parked riders ask for, per queue (a rider of several queues counts on
    /// each); queues nobody waits on are not kept.
    demand: BTreeMap<QueueName, u64>,
}

impl Parked {
    fn remove(&mut self, ticket: u64) -> Option<Rider> {
        let rider = self.riders.remove(&ticket)?;
        for q in &rider.queues {
            if let Some(n) = self.demand.get_mut(q) {
                *n = n.saturating_sub(u64::from(rider.jobs.max(1)));
                if *n == 0 {
                    self.demand.remove(q);
                }
            }
        }
        Some(rider)
    }
}

impl Riders {
    /// Parks `rider` until the pump takes it or its owner withdraws it; returns its ticket.
    pub fn park(&self, rider: Rider) -> u64 {
        let mut parked = self.lock();
        let ticket = parked.next_ticket;
        parked.next_ticket += 1;
        for q in &rider.queues {
            let n = parked.demand.entry(q.clone()).or_default();
            *n = n.saturating_add(u64::from(rider.jobs.max(1)));
        }
        parked.riders.insert(ticket, rider);
        ticket
    }

    /// Takes a parked rider back. `None`: the pump has taken it, and its `deliver` is called
    /// (or about to be) with the outcome.
    pub fn withdraw(&self, ticket: u64) -> Option<Rider> {
        self.lock().remove(ticket)
    }

    /// How many jobs the parked riders ask for, per queue (empty: none is parked).
    pub fn demand(&self) -> BTreeMap<QueueName, u64> {
        self.lock().demand.clone()
    }

    /// The longest-parked riders of the queues in `due`, each taken while one of its queues
    /// has due jobs left, which its reserve's count then uses up. Stops at
    /// [`MAX_RIDERS_PER_TICK`] riders, `max_commands` commands or `max_bytes` bytes of them
    /// (a rider that does not fit is passed over). Each taken rider must be delivered.
    pub(crate) fn take(
        &self,
        due: &mut BTreeMap<QueueName, u64>,
        max_commands: usize,
        max_bytes: usize,
    ) -> Vec<Rider> {
        let mut parked = self.lock();
        let (mut commands, mut bytes, mut tickets) = (0usize, 0usize, Vec::new());
        // Queues with due jobs left: the walk ends when none is.
        let mut open = due.values().filter(|n| **n > 0).count();
        for (ticket, rider) in &parked.riders {
            if open == 0
                || tickets.len() >= MAX_RIDERS_PER_TICK
                || commands >= max_commands
                || bytes >= max_bytes
            {
                break;
            }
            if !rider.queues.iter().any(|q| due.get(q).is_some_and(|n| *n > 0)) {
                continue;
            }
            let size: usize = rider.commands.iter().map(Command::size_bytes).sum();
            if commands + rider.commands.len() > max_commands || bytes + size > max_bytes {
                continue;
            }
            commands += rider.commands.len();
            bytes += size;
            // Its reserve takes from its queues in order: use up their due jobs likewise.
            let mut wants = u64::from(rider.jobs.max(1));
            for q in &rider.queues {
                if let Some(n) = due.get_mut(q).filter(|n| **n > 0) {
                    let used = wants.min(*n);
                    *n -= used;
                    wants -= used;
                    if *n == 0 {
                        open -= 1;
                    }
                }
            }
            tickets.push(*ticket);
        }
        tickets.into_iter().filter_map(|t| parked.remove(t)).collect()
    }

    fn lock(&self) -> MutexGuard<'_, Parked> {
        self.parked.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use delayd_core::Reply;
    use std::sync::Arc;

    fn queue(name: &str) -> QueueName {
        QueueName::new("ns", name)
    }

    fn rider(queues: &[&str], jobs: u32, seen: &Arc<Mutex<Vec<u32>>>) -> Rider {
        let seen = seen.clone();
        let queues: Vec<_> = queues.iter().map(|q| queue(q)).collect();
        let reserve = Command::Reserve { queues, count: jobs, ttr_ms: None, lease_seed: 7 };
        let deliver = move |_| seen.lock().unwrap_or_else(|p| p.into_inner()).push(jobs);
        Rider::new(vec![reserve], Box::new(deliver)).expect("ends with a reserve")
    }

    fn due(queues: &[(&str, u64)]) -> BTreeMap<QueueName, u64> {
        queues.iter().map(|(q, n)| (queue(q), *n)).collect()
    }

    #[test]
    fn the_longest_parked_of_the_due_queues_ride_until_they_ask_for_the_due_jobs() {
        let (riders, seen) = (Riders::default(), Arc::new(Mutex::new(Vec::new())));
        for (q, jobs) in [("a", 1), ("b", 5), ("a", 3), ("a", 1), ("a", 1)] {
            riders.park(rider(&[q], jobs, &seen));
        }
        assert_eq!(riders.demand(), due(&[("a", 6), ("b", 5)]));
        // Three jobs due on a, none on b: b's rider stays, a's first two ask for four.
        let taken = riders.take(&mut due(&[("a", 3)]), usize::MAX, usize::MAX);
        assert_eq!(taken.iter().map(|r| r.jobs).collect::<Vec<_>>(), [1, 3]);
        for r in taken {
            (r.deliver)(Ok(vec![Ok(Reply::Reserved(Vec::new()))]));
        }
        assert_eq!(*seen.lock().unwrap_or_else(|p| p.into_inner()), [1, 3]);
        assert_eq!(riders.demand(), due(&[("a", 2), ("b", 5)]), "b's five and two of a's");
        assert!(riders.take(&mut due(&[]), usize::MAX, usize::MAX).is_empty(), "nothing due");
        // A reserve over several queues rides for any of them, and uses them up in order.
        let multi = riders.park(rider(&["c", "a"], 2, &seen));
        let mut left = due(&[("a", 2), ("c", 1)]);
        let taken = riders.take(&mut left, usize::MAX, usize::MAX);
        assert_eq!(taken.iter().map(|r| r.jobs).collect::<Vec<_>>(), [1, 1, 2]);
        assert_eq!(left, due(&[("a", 0), ("c", 0)]));
        assert_eq!(riders.demand(), due(&[("b", 5)]), "b's rider is left");
        assert!(riders.withdraw(multi).is_none(), "taken");
    }

    /// A rider is its reserve's: queues and count come from its last command, which must be
    /// a reserve of either order.
    #[test]
    fn a_rider_reads_its_queues_and_count_from_its_reserve() {
        let deliver = || -> Deliver { Box::new(|_| {}) };
        let ack = Command::Ack { queue: queue("a"), id: delayd_core::JobId(1), lease: None };
        let urgent = Command::ReserveUrgent {
            queues: vec![queue("b"), queue("a")],
            count: 3,
            ttr_ms: None,
            lease_seed: 7,
        };
        let rider = Rider::new(vec![ack.clone(), urgent], deliver()).expect("a reserve last");
        assert_eq!((rider.queues.clone(), rider.jobs), (vec![queue("b"), queue("a")], 3));
        assert_eq!(rider.commands.len(), 2);
        assert!(Rider::new(vec![ack], deliver()).is_none(), "no reserve");
        assert!(Rider::new(Vec::new(), deliver()).is_none(), "no command");
    }

    #[test]
    fn a_withdrawn_rider_never_rides_and_a_taken_one_cannot_be_withdrawn() {
        let (riders, seen) = (Riders::default(), Arc::new(Mutex::new(Vec::new())));
        let first = riders.park(rider(&["a"], 1, &seen));
        let second = riders.park(rider(&["a"], 2, &seen));
        assert!(riders.withdraw(first).is_some());
        assert_eq!(riders.demand(), due(&[("a", 2)]));
        let taken = riders.take(&mut due(&[("a", 10)]), usize::MAX, usize::MAX);
        assert_eq!(taken.len(), 1);
        assert!(riders.withdraw(second).is_none(), "the pump has it");
        assert!(riders.demand().is_empty());
    }

    #[test]
    fn an_entry_holds_only_as_many_riders_as_fit() {
        let (riders, seen) = (Riders::default(), Arc::new(Mutex::new(Vec::new())));
        for _ in 0..MAX_RIDERS_PER_TICK + 10 {
            riders.park(rider(&["a"], 1, &seen));
        }
        let mut plenty = due(&[("a", u64::MAX)]);
        assert_eq!(riders.take(&mut plenty, usize::MAX, usize::MAX).len(), MAX_RIDERS_PER_TICK);
        let one: usize = rider(&["a"], 1, &seen).commands.iter().map(Command::size_bytes).sum();
        assert_eq!(riders.take(&mut plenty, usize::MAX, one * 3 + 1).len(), 3, "bytes");
        assert_eq!(riders.take(&mut plenty, 2, usize::MAX).len(), 2, "commands");
    }
}
