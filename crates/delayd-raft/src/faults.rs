//! Fault injection for tests: a filter every outgoing node-to-node call passes through.
//!
//! [`GrpcNetwork`](crate::network::GrpcNetwork) asks its [`FaultFilter`] about each call
//! (Raft messages and forwarded requests alike) before it sends anything: pass it, delay it,
//! or drop it as if the peer were unreachable. [`Faults`] is the filter the in-process cluster
//! harness shares between its nodes to cut links, isolate a node, slow a link and heal — the
//! idea of TiKV's simulated transport and openraft's test router, on the real transport.
//!
//! Production nodes have no filter; the check is one `Option` test per call.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use delayd_store::NodeId;

use crate::network::Method;

/// What happens to one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send it.
    Pass,
    /// Send it after this pause.
    Delay(Duration),
    /// Do not send it: the caller sees the peer as unreachable.
    Drop,
}

/// Decides the fate of every outgoing call of the nodes that share it.
pub trait FaultFilter: Send + Sync + 'static {
    /// The verdict on a `method` call from node `from` to node `to`.
    fn check(&self, from: NodeId, to: NodeId, method: Method) -> Verdict;
}

/// Shown only as being there, so that a configuration holding a filter can derive `Debug`.
impl std::fmt::Debug for dyn FaultFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FaultFilter")
    }
}

/// Link faults between nodes, changed at will while the nodes run. Links are directed inside;
/// the methods cut or slow both directions, as a real partition or slow link would.
#[derive(Default)]
pub struct Faults {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    cut: HashSet<(NodeId, NodeId)>,
    delay: HashMap<(NodeId, NodeId), Duration>,
}

impl Faults {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Cuts the link between `a` and `b`, both ways.
    pub fn cut(&self, a: NodeId, b: NodeId) {
        let mut state = self.state();
        state.cut.insert((a, b));
        state.cut.insert((b, a));
    }

    /// Cuts `node` off from every node in `others`.
    pub fn isolate(&self, node: NodeId, others: impl IntoIterator<Item = NodeId>) {
        for other in others {
            if other != node {
                self.cut(node, other);
            }
        }
    }

    /// Delays every call between `a` and `b`, both ways, by `pause`.
    pub fn slow(&self, a: NodeId, b: NodeId, pause: Duration) {
        let mut state = self.state();
        state.delay.insert((a, b), pause);
        state.delay.insert((b, a), pause);
    }

    /// Restores every link.
    pub fn heal(&self) {
        let mut state = self.state();
        state.cut.clear();
        state.delay.clear();
    }
}

impl FaultFilter for Faults {
    fn check(&self, from: NodeId, to: NodeId, _method: Method) -> Verdict {
        let state = self.state();
        if state.cut.contains(&(from, to)) {
            Verdict::Drop
        } else if let Some(pause) = state.delay.get(&(from, to)) {
            Verdict::Delay(*pause)
        } else {
            Verdict::Pass
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_and_delays_apply_both_ways_until_healed() {
        let faults = Faults::default();
        faults.isolate(1, [1, 2, 3]);
        faults.slow(2, 3, Duration::from_millis(5));
        assert_eq!(faults.check(1, 2, Method::Vote), Verdict::Drop);
        assert_eq!(faults.check(3, 1, Method::AppendEntries), Verdict::Drop);
        assert_eq!(faults.check(3, 2, Method::Forward), Verdict::Delay(Duration::from_millis(5)));
        faults.heal();
        assert_eq!(faults.check(1, 2, Method::Vote), Verdict::Pass);
        assert_eq!(faults.check(2, 3, Method::Vote), Verdict::Pass);
    }
}
