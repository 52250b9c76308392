//! Which queues had a job to hand out when their metadata last changed, as this node applied
//! it: a hint that lets a leader send a reserve from a busy queue straight to the log.
//!
//! A leader answers a reserve that would find nothing from its own state, without a log entry
//! ([`crate::cluster::Cluster`]'s idle answer). To know, it read each queue's metadata from
//! RocksDB before proposing any reserve, busy queue or not: a point read of a record that
//! every entry rewrites, about 2.7 % of a leader's CPU while it drained a queue (a profile in
//! `docs/bench/consume-path.md`). The hint answers the common case from memory.
//!
//! A hint is never trusted for "nothing": a queue it does not list is looked up as before,
//! and an idle answer is still given only from the state after a read barrier. A queue it
//! lists wrongly costs a log entry for a reserve that finds nothing (what every reserve cost
//! before idle answers existed), never a wrong answer. That happens in the instant between an
//! apply's write and its listener, which runs right after it on the same thread; and after a
//! snapshot replaced the state, until the snapshot watcher clears the hints.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use delayd_core::{Effects, QueueName};

/// The queues with a job a reserve would find, as of the last applied change of each.
#[derive(Debug, Default)]
pub struct Reservable {
    queues: Mutex<HashSet<QueueName>>,
}

impl Reservable {
    /// Takes in an applied batch's word on the queues it changed.
    pub fn applied(&self, effects: &Effects) {
        if effects.reservable.is_empty() {
            return;
        }
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        for (queue, &reservable) in &effects.reservable {
            if !reservable {
                queues.remove(queue);
            } else if !queues.contains(queue) {
                queues.insert(queue.clone());
            }
        }
    }

    /// Whether some queue of `queues` had a job to hand out at its last change: a reserve
    /// from them is worth a log entry without a look at the state.
    pub fn any(&self, queues: &[QueueName]) -> bool {
        let known = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        queues.iter().any(|q| known.contains(q))
    }

    /// Forgets every hint: the state was replaced wholesale (a snapshot was installed).
    pub fn clear(&self) {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changed(queues: &[(&str, bool)]) -> Effects {
        let reservable = queues.iter().map(|(q, r)| (QueueName::new("ns", *q), *r)).collect();
        Effects { reservable, ..Effects::default() }
    }

    #[test]
    fn a_queue_is_listed_from_its_change_to_a_job_until_its_change_to_none() {
        let hints = Reservable::default();
        let (a, b) = (QueueName::new("ns", "a"), QueueName::new("ns", "b"));
        assert!(!hints.any(&[a.clone(), b.clone()]), "nothing applied, nothing listed");
        hints.applied(&changed(&[("a", true), ("b", false)]));
        assert!(hints.any(std::slice::from_ref(&a)));
        assert!(!hints.any(std::slice::from_ref(&b)));
        assert!(hints.any(&[b.clone(), a.clone()]), "one of several queues is enough");
        // A batch that does not change a queue says nothing of it.
        hints.applied(&changed(&[("b", true)]));
        assert!(hints.any(std::slice::from_ref(&a)) && hints.any(std::slice::from_ref(&b)));
        hints.applied(&changed(&[("a", false)]));
        assert!(!hints.any(std::slice::from_ref(&a)));
        hints.clear();
        assert!(!hints.any(&[a, b]), "a replaced state leaves nothing listed");
    }
}
