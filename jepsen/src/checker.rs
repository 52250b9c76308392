//! Checkers: what a history must satisfy. Each returns the anomalies it finds; an empty list
//! means the property held for this run (which proves nothing about runs not made).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::history::{Call, Op, Outcome};

/// A broken promise found in a history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Anomaly {
    /// (a) An acknowledged publish never came out, nor reached the dead letter.
    Lost {
        /// The body published.
        body: String,
    },
    /// (a) Something came out that was never (possibly) published.
    Unexpected {
        /// The body delivered.
        body: String,
    },
    /// (b) Delivered before its due time (beyond the tolerance).
    Early {
        /// The body.
        body: String,
        /// How early, in ms.
        by_ms: u64,
    },
    /// (c) A second reservation began inside the first one's ttr without a release.
    LeaseOverlap {
        /// The job.
        job_id: String,
        /// Attempts of the two deliveries.
        attempts: (u32, u32),
    },
    /// (c) Two deliveries of one job carried the same delivery number.
    AttemptRepeated {
        /// The job.
        job_id: String,
        /// The repeated attempt.
        attempt: u32,
    },
    /// (c) An ack with an old lease was accepted after a newer delivery.
    StaleAckAccepted {
        /// The job.
        job_id: String,
        /// The stale lease.
        lease: String,
    },
    /// (d) A job was delivered again after an ack of it succeeded.
    DeliveredAfterAck {
        /// The job.
        job_id: String,
    },
    /// (d) An acked job is in the dead letter.
    AckedInDeadLetter {
        /// The body.
        body: String,
    },
    /// (e) Publishes with the same key created more than one job.
    DuplicateKey {
        /// The key.
        key: String,
        /// The distinct ids answered.
        job_ids: Vec<String>,
    },
    /// (h) Nodes at the same applied index disagree, or did not reach the same index.
    Diverged {
        /// `(node, applied index, digest)` per node.
        nodes: Vec<(u64, Option<u64>, String)>,
    },
}

/// The verdict of [`check`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Broken promises.
    pub anomalies: Vec<Anomaly>,
    /// Acknowledged publishes.
    pub published_ok: usize,
    /// Publishes with an unknown outcome that were delivered anyway.
    pub recovered: usize,
    /// Deliveries beyond each job's first (allowed: at-least-once).
    pub redeliveries: usize,
}

struct Seen<'a> {
    job_id: &'a str,
    body: &'a str,
    attempt: u32,
    lease: &'a str,
    invoke_ms: u64,
    complete_ms: u64,
    ttr_ms: u64,
}

/// Checks properties (a)–(e) over a history. `tolerance_ms` absorbs clock offsets injected
/// into the nodes plus a margin; it applies to (b) and (c).
pub fn check(history: &[Op], tolerance_ms: u64) -> Report {
    let mut report = Report::default();
    // A keyed publish's body is its key, so several publishes can share one body.
    let mut publishes: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    let mut seen: Vec<Seen<'_>> = Vec::new();
    let mut dead: BTreeSet<&str> = BTreeSet::new();
    let mut acks: BTreeMap<&str, Vec<(&Op, &str)>> = BTreeMap::new();
    let mut releases: BTreeMap<&str, Vec<(&Op, &str)>> = BTreeMap::new();
    let mut keys: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();

    for op in history {
        match &op.call {
            Call::Publish { body, key, job_id, .. } => {
                publishes.entry(body).or_default().push(op);
                if op.outcome == Outcome::Ok {
                    report.published_ok += 1;
                    if let (Some(k), Some(id)) = (key, job_id) {
                        keys.entry(k).or_default().insert(id);
                    }
                }
            }
            Call::Reserve { ttr_ms, got } if op.outcome == Outcome::Ok => {
                for d in got {
                    seen.push(Seen {
                        job_id: &d.job_id,
                        body: &d.body,
                        attempt: d.attempt,
                        lease: &d.lease,
                        invoke_ms: op.invoke_ms,
                        complete_ms: op.complete_ms,
                        ttr_ms: *ttr_ms,
                    });
                }
            }
            Call::Ack { job_id, lease } if op.outcome == Outcome::Ok => {
                acks.entry(job_id).or_default().push((op, lease));
            }
            // A release with an unknown outcome may have happened: it excuses an early
            // second delivery just as a confirmed one does.
            Call::Release { job_id, lease } if op.outcome != Outcome::Fail => {
                releases.entry(job_id).or_default().push((op, lease));
            }
            Call::DeadLetter { bodies } if op.outcome == Outcome::Ok => {
                dead.extend(bodies.iter().map(String::as_str));
            }
            _ => {}
        }
    }

    // (a) lost, unexpected, recovered.
    let delivered: BTreeSet<&str> = seen.iter().map(|s| s.body).collect();
    for (body, ops) in &publishes {
        let out = delivered.contains(body) || dead.contains(body);
        let acked = ops.iter().any(|op| op.outcome == Outcome::Ok);
        let maybe = ops.iter().any(|op| op.outcome == Outcome::Unknown);
        if acked && !out {
            report.anomalies.push(Anomaly::Lost { body: body.to_string() });
        } else if !acked && maybe && out {
            report.recovered += 1;
        }
    }
    for body in delivered.iter().chain(dead.iter()) {
        let possible =
            publishes.get(body).is_some_and(|ops| ops.iter().any(|op| op.outcome != Outcome::Fail));
        if !possible {
            report.anomalies.push(Anomaly::Unexpected { body: body.to_string() });
        }
    }

    // (b) early delivery: the reserve answered before the job could have been due.
    // Of several publishes of one body, any that may have happened may have created the job:
    // the earliest of their due times is the bound.
    for s in &seen {
        let due = publishes.get(s.body).into_iter().flatten().filter_map(|op| match &op.call {
            Call::Publish { delay_ms, .. } if op.outcome != Outcome::Fail => {
                Some(op.invoke_ms + delay_ms)
            }
            _ => None,
        });
        if let Some(due) = due.min() {
            let earliest = due.saturating_sub(tolerance_ms);
            if s.complete_ms < earliest {
                report.anomalies.push(Anomaly::Early {
                    body: s.body.to_string(),
                    by_ms: earliest - s.complete_ms,
                });
            }
        }
    }

    // (c) and (d), per job, deliveries in the order they were answered.
    let mut per_job: BTreeMap<&str, Vec<&Seen<'_>>> = BTreeMap::new();
    for s in &seen {
        per_job.entry(s.job_id).or_default().push(s);
    }
    for (job, mut ds) in per_job {
        ds.sort_by_key(|d| (d.complete_ms, d.attempt));
        report.redeliveries += ds.len() - 1;
        let mut attempts = BTreeSet::new();
        for d in &ds {
            if !attempts.insert(d.attempt) {
                report
                    .anomalies
                    .push(Anomaly::AttemptRepeated { job_id: job.to_string(), attempt: d.attempt });
            }
        }
        let released = |lease: &str, before_ms: u64| {
            releases
                .get(job)
                .is_some_and(|rs| rs.iter().any(|(op, l)| *l == lease && op.invoke_ms <= before_ms))
        };
        for pair in ds.windows(2) {
            let (first, second) = (pair[0], pair[1]);
            let lease_end = (first.invoke_ms + first.ttr_ms).saturating_sub(tolerance_ms);
            if second.complete_ms < lease_end && !released(first.lease, second.complete_ms) {
                report.anomalies.push(Anomaly::LeaseOverlap {
                    job_id: job.to_string(),
                    attempts: (first.attempt, second.attempt),
                });
            }
            // An ack sent with the first lease after the second delivery was answered must
            // have been refused.
            for (ack, lease) in acks.get(job).into_iter().flatten() {
                if *lease == first.lease && ack.invoke_ms > second.complete_ms {
                    report.anomalies.push(Anomaly::StaleAckAccepted {
                        job_id: job.to_string(),
                        lease: lease.to_string(),
                    });
                }
            }
        }
        if let Some(acked_ms) =
            acks.get(job).and_then(|a| a.iter().map(|(op, _)| op.complete_ms).min())
        {
            if ds.iter().any(|d| d.invoke_ms > acked_ms) {
                report.anomalies.push(Anomaly::DeliveredAfterAck { job_id: job.to_string() });
            }
            if let Some(d) = ds.first() {
                if dead.contains(d.body) {
                    report.anomalies.push(Anomaly::AckedInDeadLetter { body: d.body.to_string() });
                }
            }
        }
    }

    // (e) one job per key.
    for (key, ids) in keys {
        if ids.len() > 1 {
            report.anomalies.push(Anomaly::DuplicateKey {
                key: key.to_string(),
                job_ids: ids.into_iter().map(str::to_string).collect(),
            });
        }
    }
    report
}

/// (h) After healing, every node must report the same applied index and digest.
pub fn check_convergence(nodes: &[(u64, Option<u64>, String)]) -> Vec<Anomaly> {
    let distinct: BTreeSet<(Option<u64>, &str)> =
        nodes.iter().map(|(_, i, d)| (*i, d.as_str())).collect();
    if distinct.len() > 1 {
        return vec![Anomaly::Diverged { nodes: nodes.to_vec() }];
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Delivery;

    fn op(process: u64, invoke_ms: u64, complete_ms: u64, outcome: Outcome, call: Call) -> Op {
        Op { process, invoke_ms, complete_ms, outcome, call }
    }

    fn publish(t: u64, body: &str, delay_ms: u64, id: &str, outcome: Outcome) -> Op {
        let call = Call::Publish {
            body: body.into(),
            delay_ms,
            key: None,
            job_id: (outcome == Outcome::Ok).then(|| id.into()),
        };
        op(1, t, t + 2, outcome, call)
    }

    fn reserve(t: u64, ttr_ms: u64, got: &[(&str, &str, u32, &str)]) -> Op {
        let got = got
            .iter()
            .map(|(id, body, attempt, lease)| Delivery {
                job_id: id.to_string(),
                body: body.to_string(),
                attempt: *attempt,
                lease: lease.to_string(),
            })
            .collect();
        op(2, t, t + 2, Outcome::Ok, Call::Reserve { ttr_ms, got })
    }

    fn ack(t: u64, id: &str, lease: &str, outcome: Outcome) -> Op {
        op(2, t, t + 2, outcome, Call::Ack { job_id: id.into(), lease: lease.into() })
    }

    fn kinds(r: &Report) -> Vec<&'static str> {
        r.anomalies
            .iter()
            .map(|a| match a {
                Anomaly::Lost { .. } => "lost",
                Anomaly::Unexpected { .. } => "unexpected",
                Anomaly::Early { .. } => "early",
                Anomaly::LeaseOverlap { .. } => "lease_overlap",
                Anomaly::AttemptRepeated { .. } => "attempt_repeated",
                Anomaly::StaleAckAccepted { .. } => "stale_ack",
                Anomaly::DeliveredAfterAck { .. } => "after_ack",
                Anomaly::AckedInDeadLetter { .. } => "acked_dead",
                Anomaly::DuplicateKey { .. } => "duplicate_key",
                Anomaly::Diverged { .. } => "diverged",
            })
            .collect()
    }

    #[test]
    fn a_clean_history_has_no_anomalies() {
        let h = vec![
            publish(0, "b1", 100, "j1", Outcome::Ok),
            publish(0, "b2", 0, "j2", Outcome::Unknown),
            reserve(50, 1000, &[("j2", "b2", 1, "l1")]),
            reserve(110, 1000, &[("j1", "b1", 1, "l2")]),
            ack(120, "j1", "l2", Outcome::Ok),
            // ttr of j2's first delivery ran out; redelivered after it, with a new attempt.
            reserve(1100, 1000, &[("j2", "b2", 2, "l3")]),
            ack(1101, "j2", "l1", Outcome::Fail), // stale ack refused
            ack(1102, "j2", "l3", Outcome::Ok),
        ];
        let r = check(&h, 0);
        assert!(r.anomalies.is_empty(), "{:?}", r.anomalies);
        assert_eq!((r.published_ok, r.recovered, r.redeliveries), (1, 1, 1));
    }

    #[test]
    fn finds_lost_and_unexpected() {
        let h = vec![
            publish(0, "b1", 0, "j1", Outcome::Ok),
            publish(0, "b2", 0, "j2", Outcome::Fail),
            reserve(10, 1000, &[("j2", "b2", 1, "l")]),
            reserve(10, 1000, &[("j9", "ghost", 1, "l")]),
        ];
        let mut k = kinds(&check(&h, 0));
        k.sort();
        assert_eq!(k, vec!["lost", "unexpected", "unexpected"]);
    }

    #[test]
    fn a_dead_letter_job_is_not_lost() {
        let h = vec![
            publish(0, "b1", 0, "j1", Outcome::Ok),
            op(3, 90, 91, Outcome::Ok, Call::DeadLetter { bodies: vec!["b1".into()] }),
        ];
        assert!(check(&h, 0).anomalies.is_empty());
    }

    #[test]
    fn finds_early_delivery_beyond_the_tolerance() {
        let h = vec![
            publish(1000, "b1", 500, "j1", Outcome::Ok),
            reserve(1300, 1000, &[("j1", "b1", 1, "l")]),
        ];
        assert_eq!(kinds(&check(&h, 0)), vec!["early"]);
        assert!(check(&h, 300).anomalies.is_empty());
    }

    #[test]
    fn finds_overlapping_leases_and_repeated_attempts() {
        let h = vec![
            publish(0, "b1", 0, "j1", Outcome::Ok),
            reserve(10, 1000, &[("j1", "b1", 1, "l1")]),
            reserve(500, 1000, &[("j1", "b1", 1, "l2")]),
        ];
        let mut k = kinds(&check(&h, 0));
        k.sort();
        assert_eq!(k, vec!["attempt_repeated", "lease_overlap"]);
    }

    #[test]
    fn a_release_allows_an_early_second_delivery() {
        let h = vec![
            publish(0, "b1", 0, "j1", Outcome::Ok),
            reserve(10, 1000, &[("j1", "b1", 1, "l1")]),
            op(2, 20, 22, Outcome::Ok, Call::Release { job_id: "j1".into(), lease: "l1".into() }),
            reserve(30, 1000, &[("j1", "b1", 2, "l2")]),
        ];
        assert!(check(&h, 0).anomalies.is_empty());
    }

    #[test]
    fn finds_a_stale_ack_that_was_accepted() {
        let h = vec![
            publish(0, "b1", 0, "j1", Outcome::Ok),
            reserve(10, 100, &[("j1", "b1", 1, "l1")]),
            reserve(200, 100, &[("j1", "b1", 2, "l2")]),
            ack(300, "j1", "l1", Outcome::Ok),
        ];
        assert_eq!(kinds(&check(&h, 0)), vec!["stale_ack"]);
    }

    #[test]
    fn finds_delivery_after_ack_and_acked_in_dead_letter() {
        let h = vec![
            publish(0, "b1", 0, "j1", Outcome::Ok),
            reserve(10, 100, &[("j1", "b1", 1, "l1")]),
            ack(20, "j1", "l1", Outcome::Ok),
            reserve(500, 100, &[("j1", "b1", 2, "l2")]),
            op(3, 900, 901, Outcome::Ok, Call::DeadLetter { bodies: vec!["b1".into()] }),
        ];
        let mut k = kinds(&check(&h, 0));
        k.sort();
        assert_eq!(k, vec!["acked_dead", "after_ack"]);
    }

    #[test]
    fn a_keyed_body_published_many_times_is_judged_once() {
        let keyed = |t, delay_ms, outcome| {
            let call = Call::Publish {
                body: "k1".into(),
                delay_ms,
                key: Some("k1".into()),
                job_id: (outcome == Outcome::Ok).then(|| "j1".into()),
            };
            op(1, t, t + 1, outcome, call)
        };
        // The unknown first publish created the job (due at 100); the later, acknowledged one
        // answered "exists". Delivery at 150 is on time for the first and not lost.
        let h = vec![
            keyed(0, 100, Outcome::Unknown),
            keyed(50, 500, Outcome::Ok),
            reserve(148, 1000, &[("j1", "k1", 1, "l1")]),
        ];
        let r = check(&h, 0);
        assert!(r.anomalies.is_empty(), "{:?}", r.anomalies);
        // Not delivered at all: the acknowledged publish is lost.
        assert_eq!(kinds(&check(&h[..2], 0)), vec!["lost"]);
        // Delivered before even the earliest publish could have come due: early.
        let early = vec![h[0].clone(), h[1].clone(), reserve(40, 1000, &[("j1", "k1", 1, "l1")])];
        assert_eq!(kinds(&check(&early, 0)), vec!["early"]);
    }

    #[test]
    fn an_unknown_release_excuses_an_early_redelivery_but_a_failed_one_does_not() {
        let release = |outcome| {
            op(2, 20, 22, outcome, Call::Release { job_id: "j1".into(), lease: "l1".into() })
        };
        let h = |outcome| {
            vec![
                publish(0, "b1", 0, "j1", Outcome::Ok),
                reserve(10, 1000, &[("j1", "b1", 1, "l1")]),
                release(outcome),
                reserve(30, 1000, &[("j1", "b1", 2, "l2")]),
            ]
        };
        assert!(check(&h(Outcome::Unknown), 0).anomalies.is_empty());
        assert_eq!(kinds(&check(&h(Outcome::Fail), 0)), vec!["lease_overlap"]);
    }

    #[test]
    fn finds_a_key_that_created_two_jobs() {
        let keyed = |t, id: &str, body: &str| {
            let call = Call::Publish {
                body: body.into(),
                delay_ms: 0,
                key: Some("k".into()),
                job_id: Some(id.into()),
            };
            op(1, t, t + 1, Outcome::Ok, call)
        };
        let h = vec![keyed(0, "j1", "b1"), keyed(5, "j1", "b2"), keyed(9, "j2", "b3")];
        let k = kinds(&check(&h, 0));
        assert!(k.contains(&"duplicate_key"), "{k:?}");
    }

    #[test]
    fn convergence_needs_equal_index_and_digest() {
        let same = vec![(1, Some(9), "ab".to_string()), (2, Some(9), "ab".to_string())];
        assert!(check_convergence(&same).is_empty());
        let behind = vec![(1, Some(9), "ab".to_string()), (2, Some(8), "ab".to_string())];
        assert_eq!(check_convergence(&behind).len(), 1);
        let forked = vec![(1, Some(9), "ab".to_string()), (2, Some(9), "cd".to_string())];
        assert_eq!(check_convergence(&forked).len(), 1);
    }

    #[test]
    fn histories_round_trip_as_jsonl() {
        let h =
            vec![publish(0, "b1", 0, "j1", Outcome::Ok), reserve(1, 5, &[("j1", "b1", 1, "l")])];
        let text = crate::history::to_jsonl(&h).expect("encode");
        assert_eq!(crate::history::parse(&text).expect("parse"), h);
    }
}
