//! Property test: no value a command can carry makes the state machine overflow, panic or
//! break its own bookkeeping.
//!
//! The edge bounds every client number (the horizon, the bulk and body limits), but the state
//! machine must not rely on it: a log written by an older edge, or a bug there, must never
//! turn into a panic on every replica at once. Commands here draw their times from the
//! extremes (0, 1, values around `u32::MAX` seconds, `u64::MAX`) and the entries' clocks too;
//! this crate's tests build with overflow checks on, so any unchecked arithmetic panics.
//! After every entry the counts per state must agree with the indexes.

#![allow(clippy::unwrap_used)]

use delayd_core::kv::{Cf, KvRead, MemKv, Overlay};
use delayd_core::{apply, keys, Command, Due, Effects, Entry, JobId, JobState, NewJob, QueueName};
use proptest::prelude::*;

fn queue() -> QueueName {
    QueueName::new("ns", "q")
}

/// Times from the edges of every width a client or a clock could produce.
fn time() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        0u64..5_000,
        Just(u64::from(u32::MAX) * 1000),
        Just(u64::MAX / 1000),
        Just(u64::MAX / 2),
        Just(u64::MAX - 1),
        Just(u64::MAX),
        any::<u64>(),
    ]
}

fn command() -> impl Strategy<Value = Command> {
    let id = 1u128..6;
    let lease = prop_oneof![Just(None), any::<u64>().prop_map(Some)];
    prop_oneof![
        (id.clone(), time(), prop::option::of(time()), time(), any::<bool>(), any::<u16>())
            .prop_map(|(id, t, ttl, ttr, absolute, tries)| Command::Publish {
                queue: queue(),
                job: NewJob {
                    id: JobId(id),
                    key: None,
                    body: vec![1, 2, 3],
                    attributes: Default::default(),
                    due: if absolute { Due::At(t) } else { Due::After(t) },
                    ttl_ms: ttl,
                    tries,
                    ttr_ms: ttr,
                    priority: 0,
                },
            }),
        (1u32..4, prop::option::of(time()), any::<u64>()).prop_map(|(count, ttr_ms, seed)| {
            Command::Reserve { queues: vec![queue()], count, ttr_ms, lease_seed: seed }
        }),
        (id.clone(), time(), prop::option::of(any::<u32>())).prop_map(
            |(id, delay_ms, priority)| {
                Command::Release { queue: queue(), id: JobId(id), lease: None, delay_ms, priority }
            }
        ),
        (id.clone(), prop::option::of(time())).prop_map(|(id, ttr_ms)| Command::Touch {
            queue: queue(),
            id: JobId(id),
            lease: None,
            ttr_ms
        }),
        (id.clone(), lease.clone()).prop_map(|(id, lease)| Command::Ack {
            queue: queue(),
            id: JobId(id),
            lease
        }),
        (id.clone(), lease).prop_map(|(id, lease)| Command::Bury {
            queue: queue(),
            id: JobId(id),
            lease
        }),
        (id, time(), any::<bool>()).prop_map(|(id, t, absolute)| Command::Update {
            queue: queue(),
            target: delayd_core::Target::Id(JobId(id)),
            due: Some(if absolute { Due::At(t) } else { Due::After(t) }),
            body: None,
            priority: None,
        }),
        (any::<u32>(), prop::option::of(time())).prop_map(|(limit, ttl_ms)| Command::Respawn {
            queue: queue(),
            limit,
            ttl_ms
        }),
        any::<u32>().prop_map(|limit| Command::Purge { queue: queue(), limit }),
        any::<u32>().prop_map(|limit| Command::Tick { limit }),
    ]
}

/// Publishes with every variable part at its widest: long names, keys, attributes, bodies.
fn wide_publish() -> impl Strategy<Value = Command> {
    (
        "[a-z]{1,255}",
        "[a-z]{1,255}",
        prop::option::of("[a-z]{1,255}"),
        prop::collection::btree_map("[a-z]{1,64}", "[a-z]{0,1024}", 0..16),
        0usize..5000,
        any::<u128>(),
        (time(), prop::option::of(time()), time(), any::<u16>(), any::<u32>()),
    )
        .prop_map(
            |(ns, q, key, attributes, body, id, (due, ttl_ms, ttr_ms, tries, priority))| {
                Command::Publish {
                    queue: QueueName::new(&ns, &q),
                    job: NewJob {
                        id: JobId(id),
                        key,
                        body: vec![0xff; body],
                        attributes,
                        due: Due::At(due),
                        ttl_ms,
                        tries,
                        ttr_ms,
                        priority,
                    },
                }
            },
        )
}

fn count(kv: &MemKv, cf: Cf) -> u64 {
    let prefix = keys::queue(&queue());
    let mut n = 0;
    kv.scan(cf, &prefix, &keys::prefix_end(&prefix), &mut |_, _| {
        n += 1;
        true
    })
    .unwrap();
    n
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn extreme_values_never_overflow_and_counts_match_the_indexes(
        entries in prop::collection::vec((time(), prop::collection::vec(command(), 1..4)), 1..12)
    ) {
        let mut kv = MemKv::default();
        // Job ids are unique (ULIDs chosen by the leader): publishes get fresh ones, the other
        // commands name any of them.
        let mut next_id = 0u128;
        for (now_ms, mut commands) in entries {
            for c in &mut commands {
                if let Command::Publish { job, .. } = c {
                    next_id += 1;
                    job.id = JobId(next_id);
                }
            }
            let mut overlay = Overlay::new(&kv);
            let mut effects = Effects::default();
            let outcomes = apply(&mut overlay, &Entry::new(now_ms, commands.clone()), &mut effects);
            prop_assert!(outcomes.is_ok(), "{outcomes:?}");
            let writes: Vec<_> = overlay.into_writes().collect();
            kv.apply(writes);

            let meta = delayd_core::query::queue_meta(&kv, &queue()).unwrap();
            prop_assert_eq!(meta.counts.iter().sum::<u64>(), count(&kv, Cf::Members));
            prop_assert_eq!(meta.count(JobState::Ready), count(&kv, Cf::Ready));
            prop_assert_eq!(meta.count(JobState::Dead), count(&kv, Cf::Dead));
        }
    }
}

proptest! {
    /// The proposer bounds an entry's bytes with `Command::size_bytes`; it must never be
    /// below what the command really takes in the log.
    #[test]
    fn size_bytes_is_an_upper_bound_of_the_encoded_size(
        command in prop_oneof![wide_publish(), command()]
    ) {
        let encoded = delayd_core::codec::encode(&command).len();
        prop_assert!(encoded <= command.size_bytes(), "{encoded} > {}", command.size_bytes());
    }

    /// An entry's buffer is sized with `Entry::size_bytes` before it is encoded; below the
    /// encoded size it would grow on the way.
    #[test]
    fn an_entry_size_bytes_is_an_upper_bound_too(
        commands in proptest::collection::vec(prop_oneof![wide_publish(), command()], 0..40),
        now_ms in any::<u64>(),
    ) {
        let entry = delayd_core::Entry::new(now_ms, commands);
        let encoded = delayd_core::codec::encode(&entry).len();
        prop_assert!(encoded <= entry.size_bytes(), "{encoded} > {}", entry.size_bytes());
    }
}
