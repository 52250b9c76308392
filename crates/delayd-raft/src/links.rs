//! Whether each peer answers this node's Raft calls, logged when that changes.
//!
//! While a peer is away, every call to it fails: a leader's heartbeat (every 75 ms by
//! default), and each replication retry. openraft logs a warning for each failure, a dozen
//! lines a second for as long as the peer is down (the node's log setup lets only a sample of
//! those through). This module keeps the node's own account instead, one line per change:
//!
//! - a warning once every call to a peer has failed for [`LOST_AFTER`] (a single lost
//!   heartbeat is a blip, not news), whether the peer is gone or refuses the calls (a wrong
//!   cluster credential, say), with the last error;
//! - a reminder every [`REMIND_EVERY`] while the calls keep failing, with how many did (a
//!   node calls its peers only while it leads or campaigns);
//! - one line when a call succeeds again, if the peer was reported.

use std::collections::HashMap;
use std::fmt::Display;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use delayd_store::NodeId;

/// How long a peer must fail every call before it is reported lost.
pub(crate) const LOST_AFTER: Duration = Duration::from_secs(1);

/// How often a lost peer is reported again while it stays away.
pub(crate) const REMIND_EVERY: Duration = Duration::from_secs(60);

/// The peers whose last call failed. Cheap when every peer answers: an answer takes no lock
/// while no peer is failing.
#[derive(Debug, Default)]
pub(crate) struct Links {
    failing: Mutex<HashMap<NodeId, Failing>>,
    /// Whether `failing` holds any peer.
    any_failing: AtomicBool,
}

/// A peer whose calls have failed since `since`.
#[derive(Clone, Copy, Debug)]
struct Failing {
    since: Instant,
    /// The last failed call.
    last: Instant,
    failed: u64,
    /// When it was last reported lost; `None` while it has not been.
    reported: Option<Instant>,
}

/// What a call's outcome changed, for the log.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// The peer has failed every call for `down_for` and is reported lost.
    Lost { down_for: Duration, failed: u64 },
    /// A lost peer is still away.
    StillLost { down_for: Duration, failed: u64 },
    /// A peer reported lost answers again.
    Back { after: Duration, failed: u64 },
}

impl Links {
    /// Records that `peer` answered a call at `now` ([`Links::record`] skips this while no
    /// peer is failing).
    pub(crate) fn answered(&self, peer: NodeId, now: Instant) -> Option<Change> {
        let mut failing = self.failing.lock().unwrap_or_else(PoisonError::into_inner);
        let was = failing.remove(&peer)?;
        self.any_failing.store(!failing.is_empty(), Ordering::Relaxed);
        was.reported
            .map(|_| Change::Back { after: now.duration_since(was.since), failed: was.failed })
    }

    /// Records that a call to `peer` failed at `now`.
    pub(crate) fn failed(&self, peer: NodeId, now: Instant) -> Option<Change> {
        let mut failing = self.failing.lock().unwrap_or_else(PoisonError::into_inner);
        self.any_failing.store(true, Ordering::Relaxed);
        let fresh = Failing { since: now, last: now, failed: 0, reported: None };
        let f = failing.entry(peer).or_insert(fresh);
        // A node calls its peers only while it leads or campaigns: failures further apart
        // than that are separate blips, unless the peer is already reported lost.
        if f.reported.is_none() && now.duration_since(f.last) > LOST_AFTER {
            *f = fresh;
        }
        f.last = now;
        f.failed += 1;
        let down_for = now.duration_since(f.since);
        match f.reported {
            None if down_for >= LOST_AFTER => {
                f.reported = Some(now);
                Some(Change::Lost { down_for, failed: f.failed })
            }
            Some(last) if now.duration_since(last) >= REMIND_EVERY => {
                f.reported = Some(now);
                Some(Change::StillLost { down_for, failed: f.failed })
            }
            _ => None,
        }
    }

    /// Records a call's outcome, `error` when it failed, and logs what that changed.
    pub(crate) fn record(&self, peer: NodeId, error: Option<&dyn Display>) {
        let Some(e) = error else {
            // Every reply of a replication stream comes here: no clock read while every peer
            // answers.
            if !self.any_failing.load(Ordering::Relaxed) {
                return;
            }
            if let Some(Change::Back { after, failed }) = self.answered(peer, Instant::now()) {
                tracing::info!(peer, ?after, failed_calls = failed, "calls to peer succeed again");
            }
            return;
        };
        match self.failed(peer, Instant::now()) {
            Some(Change::Lost { down_for, failed }) => tracing::warn!(
                peer,
                ?down_for,
                failed_calls = failed,
                error = %e,
                "calls to peer fail; logged again every {REMIND_EVERY:?} while they do, and when \
                 one succeeds"
            ),
            Some(Change::StillLost { down_for, failed }) => tracing::warn!(
                peer,
                ?down_for,
                failed_calls = failed,
                error = %e,
                "calls to peer still fail"
            ),
            _ => {}
        }
    }
}

/// One call to a peer, recorded on its link when it settles, however it ends. openraft gives
/// up on a call by dropping it (a heartbeat has one heartbeat interval), so a call dropped
/// before the peer answered counts as failed.
pub(crate) struct Watch {
    links: Arc<Links>,
    peer: NodeId,
    settled: bool,
}

impl Watch {
    /// Watches a call to `peer` that is about to be sent.
    pub(crate) fn new(links: Arc<Links>, peer: NodeId) -> Watch {
        Watch { links, peer, settled: false }
    }

    /// The peer answered (a stream's every reply counts: heartbeats may time out while a
    /// slow peer still answers replication).
    pub(crate) fn answered(&mut self) {
        self.settled = true;
        self.links.record(self.peer, None);
    }

    /// The call failed with `error`.
    pub(crate) fn failed(&mut self, error: &dyn Display) {
        self.settled = true;
        self.links.record(self.peer, Some(error));
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if !self.settled {
            self.links.record(self.peer, Some(&"given up before the peer answered"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_blip_is_not_news() {
        let links = Links::default();
        let t0 = Instant::now();
        assert_eq!(links.failed(2, t0), None);
        assert_eq!(links.failed(2, t0 + 500 * MS), None);
        assert_eq!(links.answered(2, t0 + 600 * MS), None);
        // Forgotten: the next failure starts a new count.
        assert_eq!(links.failed(2, t0 + 1_700 * MS), None);
        // Failures far apart (this node stopped calling in between) are blips too.
        assert_eq!(links.failed(2, t0 + 5_000 * MS), None);
        assert_eq!(links.failed(2, t0 + 20_000 * MS), None);
        let lost = links.failed(2, t0 + 21_000 * MS);
        assert_eq!(lost, Some(Change::Lost { down_for: 1_000 * MS, failed: 2 }));
    }

    #[test]
    fn a_lost_peer_is_reported_once_reminded_of_and_welcomed_back() {
        let links = Links::default();
        let t0 = Instant::now();
        let mut changes = Vec::new();
        // A heartbeat every 75 ms for three minutes.
        for i in 0..2_400u32 {
            changes.extend(links.failed(3, t0 + i * 75 * MS));
        }
        assert_eq!(
            changes,
            vec![
                Change::Lost { down_for: 1_050 * MS, failed: 15 },
                Change::StillLost { down_for: 61_050 * MS, failed: 815 },
                Change::StillLost { down_for: 121_050 * MS, failed: 1_615 },
            ]
        );
        let back = links.answered(3, t0 + 180_000 * MS);
        assert_eq!(back, Some(Change::Back { after: 180_000 * MS, failed: 2_400 }));
        assert_eq!(links.answered(3, t0 + 180_075 * MS), None);
    }

    #[test]
    fn peers_are_counted_apart() {
        let links = Links::default();
        let t0 = Instant::now();
        assert_eq!(links.failed(2, t0), None);
        assert_eq!(links.failed(3, t0 + 900 * MS), None);
        assert_eq!(
            links.failed(2, t0 + 1_000 * MS),
            Some(Change::Lost { down_for: 1_000 * MS, failed: 2 })
        );
        assert_eq!(links.failed(3, t0 + 1_000 * MS), None);
        assert_eq!(links.answered(3, t0 + 1_100 * MS), None);
        assert!(matches!(links.answered(2, t0 + 1_100 * MS), Some(Change::Back { .. })));
    }
}
