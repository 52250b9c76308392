//! The plan of a run — workload settings and the fault schedule — generated up front from one
//! seed and saved as `plan.json`, and the fault windows as they really happened.
//!
//! The same seed gives the same plan and the same per-worker choices; the interleaving of real
//! processes and networks is not reproducible, and the run says so.

use serde::{Deserialize, Serialize};

/// A kind of fault the nemesis can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// Cut the leader off from its peers (clients can still reach it).
    IsolateLeader,
    /// Cut a random node off from its peers.
    IsolateNode,
    /// A bridge: two nodes cannot talk to each other, both still talk to the third.
    Bridge,
    /// Disconnect a node from the network entirely (peers and clients).
    FullIsolation,
    /// `kill -9` one random node, restart it when the window ends.
    KillNode,
    /// `kill -9` the leader, restart it when the window ends.
    KillLeader,
    /// `kill -9` every node, restart them all when the window ends.
    KillAll,
    /// SIGSTOP a random node for longer than the election timeout.
    PauseNode,
    /// SIGSTOP the leader for longer than the election timeout.
    PauseLeader,
    /// Shift one node's wall clock by seconds (through its test-only clock hook).
    ClockOffset,
    /// SIGTERM a node, wait for it to exit, start it again.
    GracefulRestart,
    /// Remove a follower from the membership, then add it back (learner, then voter).
    Membership,
}

impl FaultKind {
    /// Every kind, in a fixed order.
    pub const ALL: [FaultKind; 12] = [
        FaultKind::IsolateLeader,
        FaultKind::IsolateNode,
        FaultKind::Bridge,
        FaultKind::FullIsolation,
        FaultKind::KillNode,
        FaultKind::KillLeader,
        FaultKind::KillAll,
        FaultKind::PauseNode,
        FaultKind::PauseLeader,
        FaultKind::ClockOffset,
        FaultKind::GracefulRestart,
        FaultKind::Membership,
    ];

    /// The name used in plans, summaries and pictures.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::IsolateLeader => "isolate-leader",
            FaultKind::IsolateNode => "isolate-node",
            FaultKind::Bridge => "bridge",
            FaultKind::FullIsolation => "full-isolation",
            FaultKind::KillNode => "kill-node",
            FaultKind::KillLeader => "kill-leader",
            FaultKind::KillAll => "kill-all",
            FaultKind::PauseNode => "pause-node",
            FaultKind::PauseLeader => "pause-leader",
            FaultKind::ClockOffset => "clock-offset",
            FaultKind::GracefulRestart => "graceful-restart",
            FaultKind::Membership => "membership",
        }
    }
}

/// A fault as it really happened, in harness time (ms since the run's start).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultWindow {
    /// What was done.
    pub kind: FaultKind,
    /// The nodes it was done to.
    pub nodes: Vec<u64>,
    /// When the fault began.
    pub start_ms: u64,
    /// When it was healed.
    pub end_ms: u64,
    /// Free text: the offset applied, the pairs cut, an error while healing, ...
    pub detail: String,
}

/// One fault the nemesis will inject, as planned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedFault {
    /// When to begin, in ms after the workload starts.
    pub at_ms: u64,
    /// How long to hold it before healing.
    pub hold_ms: u64,
    /// What to do.
    pub kind: FaultKind,
    /// The node for kinds that pick one at random (leader kinds resolve the leader at run
    /// time and ignore it); for a bridge, the node in the middle.
    pub node: u64,
    /// For [`FaultKind::ClockOffset`]: the shift in ms (either sign).
    pub offset_ms: i64,
}

/// What the workload does, decided by the seed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadPlan {
    /// Producer tasks.
    pub producers: u32,
    /// Consumer tasks.
    pub consumers: u32,
    /// Queues the producers spread jobs over (consumers reserve from all of them).
    pub queues: Vec<String>,
    /// Largest publish delay in ms (a share of publishes has none).
    pub max_delay_ms: u64,
    /// Deliveries that may time out before a job goes to the dead letter.
    pub tries: u32,
    /// Each worker's RNG seed, derived from the run's seed.
    pub worker_seeds: Vec<u64>,
}

/// Everything a run will do, written to `plan.json` before it starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The seed everything below came from.
    pub seed: u64,
    /// `ci` or `long`.
    pub mode: String,
    /// The backend the plan was made for (it decides which fault kinds are possible).
    pub backend: String,
    /// How long the workload and nemesis run, in ms (recovery and drain come after).
    pub duration_ms: u64,
    /// The workload.
    pub workload: WorkloadPlan,
    /// The faults, in time order, never overlapping.
    pub faults: Vec<PlannedFault>,
}

/// How much earlier than publish-invoke + delay a delivery may complete without a clock
/// fault: the node stamps time in whole ms, so a hair of rounding, nothing more.
pub const EARLY_MARGIN_MS: u64 = 10;

impl Plan {
    /// The largest clock offset planned, in ms.
    pub fn max_offset_ms(&self) -> u64 {
        self.faults.iter().map(|f| f.offset_ms.unsigned_abs()).max().unwrap_or(0)
    }

    /// The tolerance of the early and lease checks: the largest planned clock offset plus
    /// [`EARLY_MARGIN_MS`].
    pub fn tolerance_ms(&self) -> u64 {
        self.max_offset_ms() + EARLY_MARGIN_MS
    }
}

/// How a plan is shaped.
#[derive(Clone, Debug)]
pub struct PlanSpec {
    /// The seed.
    pub seed: u64,
    /// Long mode plans every kind (membership changes too) at random for the whole time
    /// limit; CI mode plans each possible kind once, in a seeded order, and stops there.
    pub long: bool,
    /// How long the workload runs, in ms (in CI mode: at most; it ends when its faults are
    /// done).
    pub duration_ms: u64,
    /// The kinds the backend can do.
    pub kinds: Vec<FaultKind>,
    /// Nodes in the cluster (ids 1..=nodes).
    pub nodes: u64,
    /// Backend name, recorded in the plan.
    pub backend: String,
}

/// The fault kinds CI mode leaves out: a membership change re-adds a node while other faults
/// are still settling, which takes longer than CI's budget gives it.
const LONG_ONLY: [FaultKind; 1] = [FaultKind::Membership];

/// Makes the plan for `spec`. The same spec always gives the same plan.
pub fn generate(spec: &PlanSpec) -> Plan {
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);

    let workload = WorkloadPlan {
        producers: 4,
        consumers: 6,
        queues: vec!["q0".into(), "q1".into()],
        max_delay_ms: if spec.long { 10_000 } else { 4_000 },
        tries: 3,
        worker_seeds: (0..10).map(|_| rng.random()).collect(),
    };

    let mut kinds: Vec<FaultKind> =
        spec.kinds.iter().copied().filter(|k| spec.long || !LONG_ONLY.contains(k)).collect();
    kinds.sort();
    kinds.dedup();
    kinds.shuffle(&mut rng);

    // A quiet lead-in, so the first seconds show the healthy baseline, then fault, settle,
    // fault... The settle time after each heal lets the cluster recover before the next.
    let mut faults = Vec::new();
    let mut t = 5_000;
    let mut next = 0;
    while !kinds.is_empty() {
        let kind = if spec.long {
            kinds[rng.random_range(0..kinds.len())]
        } else if next < kinds.len() {
            next += 1;
            kinds[next - 1]
        } else {
            break;
        };
        let hold_ms = match kind {
            // Longer than the election timeout (0.6 s at most), so the others elect without it.
            FaultKind::PauseNode | FaultKind::PauseLeader => rng.random_range(3_000..7_000),
            FaultKind::KillAll => rng.random_range(2_000..5_000),
            FaultKind::GracefulRestart => rng.random_range(1_000..3_000),
            FaultKind::ClockOffset => rng.random_range(5_000..10_000),
            _ => rng.random_range(4_000..9_000),
        };
        if t + hold_ms + 3_000 > spec.duration_ms {
            break;
        }
        let offset_ms = if kind == FaultKind::ClockOffset {
            let magnitude = rng.random_range(2_000..5_000);
            if rng.random_bool(0.5) {
                magnitude
            } else {
                -magnitude
            }
        } else {
            0
        };
        let node = rng.random_range(1..=spec.nodes);
        faults.push(PlannedFault { at_ms: t, hold_ms, kind, node, offset_ms });
        t += hold_ms + rng.random_range(3_000..6_000);
    }
    // CI mode ends once its faults are done and the cluster had time to settle after the last.
    let duration_ms = if spec.long { spec.duration_ms } else { t.min(spec.duration_ms) };
    Plan {
        seed: spec.seed,
        mode: if spec.long { "long" } else { "ci" }.into(),
        backend: spec.backend.clone(),
        duration_ms,
        workload,
        faults,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(seed: u64, long: bool, duration_ms: u64) -> PlanSpec {
        PlanSpec {
            seed,
            long,
            duration_ms,
            kinds: FaultKind::ALL.to_vec(),
            nodes: 3,
            backend: "docker".into(),
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_plan() {
        assert_eq!(generate(&spec(7, false, 120_000)), generate(&spec(7, false, 120_000)));
        assert_ne!(generate(&spec(7, false, 120_000)), generate(&spec(8, false, 120_000)));
    }

    #[test]
    fn ci_mode_plans_each_kind_once_in_bounds_and_without_overlap() {
        let plan = generate(&spec(1, false, 240_000));
        let mut kinds: Vec<_> = plan.faults.iter().map(|f| f.kind).collect();
        kinds.sort();
        let mut all: Vec<_> =
            FaultKind::ALL.iter().copied().filter(|k| *k != FaultKind::Membership).collect();
        all.sort();
        assert_eq!(kinds, all, "{plan:?}");
        for pair in plan.faults.windows(2) {
            assert!(pair[0].at_ms + pair[0].hold_ms < pair[1].at_ms);
        }
        let last = plan.faults.last().expect("faults");
        assert!(last.at_ms + last.hold_ms < plan.duration_ms);
        assert!(plan.duration_ms < 200_000, "CI mode stays short: {}", plan.duration_ms);
        assert!(plan.max_offset_ms() >= 2_000 && plan.max_offset_ms() < 5_000);
    }

    #[test]
    fn long_mode_fills_the_time_limit_and_may_change_membership() {
        let plan = generate(&spec(3, true, 1_200_000));
        assert!(plan.faults.len() > 50, "{}", plan.faults.len());
        assert!(plan.faults.iter().any(|f| f.kind == FaultKind::Membership));
        let kinds: std::collections::BTreeSet<_> = plan.faults.iter().map(|f| f.kind).collect();
        assert_eq!(kinds.len(), FaultKind::ALL.len());
    }

    #[test]
    fn only_kinds_the_backend_can_do_are_planned() {
        let mut s = spec(5, false, 150_000);
        s.kinds = vec![FaultKind::KillNode, FaultKind::PauseLeader];
        let plan = generate(&s);
        assert_eq!(plan.faults.len(), 2);
        assert!(plan.faults.iter().all(|f| s.kinds.contains(&f.kind)));
    }
}
