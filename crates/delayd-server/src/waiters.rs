//! Long-poll waiters: reserves that found nothing park here until a queue they named gains
//! ready jobs. Applied entries report such queues ([`delayd_core::Effects`]); the waiters of
//! those queues are woken and retry their reserve.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use delayd_core::QueueName;
use tokio::sync::Notify;

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

    /// Wakes every waiter on these queues.
    pub fn wake<'a>(&self, queues: impl IntoIterator<Item = &'a QueueName>) {
        let map = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        for q in queues {
            if let Some(n) = map.get(q) {
                n.notify_waiters();
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
