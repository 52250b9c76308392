//! Samples openraft's warnings that repeat for every call to a peer that is away.
//!
//! A leader sends each follower a heartbeat (every 75 ms by default) and retries replication
//! after each failure; openraft logs a warning for every one that fails. While a member is
//! down that is about a dozen lines a second, each several hundred bytes, for as long as it
//! stays down. The node keeps its own account of each peer instead (one line when calls to
//! it start failing, a reminder every minute, one when a call succeeds again: `delayd_raft`'s
//! `links`), and this layer lets each of openraft's repeating warnings through at most once
//! every [`SAMPLE_EVERY`], so the detail of the failure stays in the log.
//!
//! The sample is per callsite, not per peer, and covers every warning of the three modules,
//! not only the three that repeat. The log filter runs first (tracing checks `enabled`
//! before `event_enabled`), so only events that would be printed are counted.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::callsite::Identifier;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// The modules whose warnings repeat for every failed call to a peer: the heartbeat worker
/// ("failed to send a heartbeat"), the replication task ("ReplicationCore recv RPCError") and
/// the leader's handling of its result ("update progress error").
const REPEATING: [&str; 3] = [
    "openraft::core::heartbeat::worker",
    "openraft::replication",
    "openraft::engine::handler::replication_handler",
];

/// How often each repeating warning is let through.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(30);

/// The layer: drops a repeating warning seen less than [`SAMPLE_EVERY`] ago at the same place
/// in openraft's code; every other event passes.
#[derive(Debug, Default)]
pub struct Repeats {
    /// When each repeating callsite was last let through.
    last: Mutex<HashMap<Identifier, Instant>>,
}

impl Repeats {
    /// Whether an event from `callsite` at `now` is let through.
    fn allows(&self, callsite: Identifier, now: Instant) -> bool {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        match last.get(&callsite) {
            Some(at) if now.duration_since(*at) < SAMPLE_EVERY => false,
            _ => {
                last.insert(callsite, now);
                true
            }
        }
    }
}

impl<S: Subscriber> Layer<S> for Repeats {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if *meta.level() != Level::WARN || !REPEATING.contains(&meta.target()) {
            return true;
        }
        self.allows(meta.callsite(), Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use crate::log_sink::Sink;

    #[test]
    fn a_repeating_warning_passes_once_per_period_and_others_always() {
        let sink = Sink::default();
        let subscriber = tracing_subscriber::registry()
            .with(Repeats::default())
            .with(tracing_subscriber::fmt::layer().with_ansi(false).with_writer(sink.clone()));
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..20 {
                tracing::warn!(target: "openraft::core::heartbeat::worker", i, "failed heartbeat");
                tracing::warn!(target: "openraft::replication", i, "recv RPCError");
                tracing::info!(target: "openraft::core::heartbeat::worker", i, "an info line");
                tracing::warn!(target: "openraft::core::raft_core", i, "another warning");
            }
        });
        let text = sink.text();
        let count = |what: &str| text.lines().filter(|l| l.contains(what)).count();
        assert_eq!(count("failed heartbeat"), 1, "{text}");
        assert_eq!(count("recv RPCError"), 1, "{text}");
        assert_eq!(count("an info line"), 20, "{text}");
        assert_eq!(count("another warning"), 20, "{text}");
    }

    #[test]
    fn a_callsite_passes_again_once_the_period_is_over() {
        let repeats = Repeats::default();
        let site = tracing::callsite!(
            name: "repeating",
            kind: tracing::metadata::Kind::EVENT,
            target: "openraft::replication",
            level: Level::WARN,
            fields: []
        );
        let callsite = tracing::callsite::Callsite::metadata(site).callsite();
        let t0 = Instant::now();
        assert!(repeats.allows(callsite.clone(), t0));
        assert!(!repeats.allows(callsite.clone(), t0 + SAMPLE_EVERY / 2));
        assert!(repeats.allows(callsite.clone(), t0 + SAMPLE_EVERY));
        assert!(!repeats.allows(callsite, t0 + SAMPLE_EVERY + Duration::from_secs(1)));
    }
}
