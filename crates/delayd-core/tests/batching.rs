//! Property test: how commands are grouped into entries changes nothing.
//!
//! A leader packs whatever is queued into one entry, so the same commands reach the log in
//! different groupings depending on load. Applying an entry keeps state across its commands
//! (the overlay of pending writes, the read-ahead of ready indexes that serves the entry's
//! later reserves); none of that may show in the result. Here random sequences of commands
//! over two queues (publishes with priorities, delays and ttls; reserves of both kinds,
//! a queue listed twice among them; acks, releases, cancels, updates, buries, touches,
//! reserve-job, kicks, respawns, destroys, pauses and ticks) are applied once as a single entry
//! and once as one entry per command at the same clock: every reply and every stored byte
//! must be the same.

#![allow(clippy::unwrap_used)]

use delayd_core::kv::{Cf, MemKv, Overlay};
use delayd_core::{apply, Command, Due, Effects, Entry, JobId, NewJob, Outcome, QueueName, Target};
use proptest::prelude::*;

fn queue(b: bool) -> QueueName {
    QueueName::new("ns", if b { "b" } else { "a" })
}

fn queues() -> impl Strategy<Value = Vec<QueueName>> {
    prop_oneof![
        Just(vec![queue(false)]),
        Just(vec![queue(true)]),
        Just(vec![queue(false), queue(true)]),
        Just(vec![queue(true), queue(false)]),
        Just(vec![queue(false), queue(false)]),
    ]
}

fn command() -> impl Strategy<Value = Command> {
    // Ids 1..40 are published in order below; the others name any of them.
    let id = (1u128..40).prop_map(JobId);
    prop_oneof![
        4 => (
            any::<bool>(),
            0u32..3,
            prop_oneof![Just(0u64), Just(5), Just(50)],
            1usize..300,
            prop_oneof![Just(None), Just(Some(60u64)), Just(Some(500))],
        )
            .prop_map(|(b, priority, delay, body, ttl)| Command::Publish {
                queue: queue(b),
                job: NewJob {
                    id: JobId(0), // numbered below
                    key: None,
                    body: vec![7; body],
                    attributes: Default::default(),
                    due: Due::After(delay),
                    ttl_ms: ttl,
                    tries: 2,
                    ttr_ms: 10,
                    priority,
                },
            }),
        3 => (queues(), 1u32..4, any::<u64>()).prop_map(|(queues, count, seed)| {
            Command::Reserve { queues, count, ttr_ms: None, lease_seed: seed }
        }),
        1 => (queues(), 1u32..4, any::<u64>()).prop_map(|(queues, count, seed)| {
            Command::ReserveUrgent { queues, count, ttr_ms: None, lease_seed: seed }
        }),
        2 => (any::<bool>(), id.clone()).prop_map(|(b, id)| Command::Ack {
            queue: queue(b),
            id,
            lease: None,
        }),
        1 => (any::<bool>(), id.clone(), prop_oneof![Just(0u64), Just(5)], prop::option::of(0u32..3))
            .prop_map(|(b, id, delay_ms, priority)| Command::Release {
                queue: queue(b),
                id,
                lease: None,
                delay_ms,
                priority,
            }),
        1 => (any::<bool>(), id.clone()).prop_map(|(b, id)| Command::Cancel {
            queue: queue(b),
            target: Target::Id(id),
        }),
        1 => (any::<bool>(), id.clone()).prop_map(|(b, id)| Command::KickJob { queue: queue(b), id }),
        1 => (any::<bool>(), id.clone(), prop::option::of(0u32..3), any::<bool>()).prop_map(
            |(b, id, priority, now)| Command::Update {
                queue: queue(b),
                target: Target::Id(id),
                due: now.then_some(Due::After(0)),
                body: None,
                priority,
            }
        ),
        1 => (any::<bool>(), id.clone())
            .prop_map(|(b, id)| Command::Bury { queue: queue(b), id, lease: None }),
        1 => (any::<bool>(), id.clone()).prop_map(|(b, id)| Command::Touch {
            queue: queue(b),
            id,
            lease: None,
            ttr_ms: None,
        }),
        1 => (any::<bool>(), id, any::<u64>()).prop_map(|(b, id, seed)| Command::ReserveJob {
            queue: queue(b),
            id,
            ttr_ms: None,
            lease_seed: seed,
        }),
        1 => (any::<bool>(), 1u32..4).prop_map(|(b, limit)| Command::Kick { queue: queue(b), limit }),
        1 => (any::<bool>(), 1u32..4)
            .prop_map(|(b, limit)| Command::Respawn { queue: queue(b), limit, ttl_ms: None }),
        1 => (any::<bool>(), any::<bool>())
            .prop_map(|(b, all)| Command::Destroy { queue: queue(b), all }),
        1 => (any::<bool>(), any::<bool>())
            .prop_map(|(b, paused)| Command::SetPaused { queue: queue(b), paused }),
        1 => (1u32..5).prop_map(|limit| Command::Tick { limit }),
    ]
}

/// Every stored record: column family, key and value.
type Stored = Vec<(Cf, Vec<u8>, Vec<u8>)>;

/// Applies `entries` (each a clock and its commands) to an empty store: the replies in order,
/// everything stored, and the effects of all entries together.
fn run(entries: &[(u64, Vec<Command>)]) -> (Vec<Outcome>, Stored, Effects) {
    let mut kv = MemKv::default();
    let mut outcomes = Vec::new();
    let mut effects = Effects::default();
    for (now_ms, commands) in entries {
        let mut overlay = Overlay::new(&kv);
        let entry = Entry::new(*now_ms, commands.clone());
        outcomes.extend(apply(&mut overlay, &entry, &mut effects).unwrap());
        let writes: Vec<_> = overlay.into_writes().collect();
        kv.apply(writes);
    }
    let stored = kv.iter().map(|(cf, k, v)| (cf, k.to_vec(), v.to_vec())).collect();
    (outcomes, stored, effects)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn one_entry_or_one_entry_per_command_store_and_answer_the_same(
        groups in prop::collection::vec((0u64..30, prop::collection::vec(command(), 1..40)), 1..4)
    ) {
        let mut next_id = 0u128;
        let mut together = Vec::new();
        let mut apart = Vec::new();
        let mut now_ms = 1_000u64;
        for (advance, mut commands) in groups {
            now_ms += advance;
            for c in &mut commands {
                if let Command::Publish { job, .. } = c {
                    next_id += 1;
                    job.id = JobId(next_id);
                }
            }
            apart.extend(commands.iter().map(|c| (now_ms, vec![c.clone()])));
            together.push((now_ms, commands));
        }
        let (replies_together, stored_together, effects_together) = run(&together);
        let (replies_apart, stored_apart, effects_apart) = run(&apart);
        prop_assert_eq!(replies_together, replies_apart);
        prop_assert_eq!(stored_together, stored_apart);
        prop_assert_eq!(effects_together, effects_apart);
    }
}
