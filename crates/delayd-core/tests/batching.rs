//! Property test: how commands are grouped into entries changes nothing.
//!
//! A leader packs whatever is queued into one entry, so the same commands reach the log in
//! different groupings depending on load. Applying an entry keeps state across its commands
//! (the overlay of pending writes, the read-ahead of ready indexes that serves the entry's
//! later reserves, the cached queue metadata); none of that may show in the result. Here
//! random sequences of commands over two queues (publishes with priorities, delays, ttls and
//! one or two tries; republishes, some under a client key; reserves of both kinds, a queue
//! listed twice among them; returns and fails of delivered jobs with their lease or a stale
//! one; acks and releases of any job, without a lease; cancels, updates, buries with and without a priority, touches, reserve-job, kicks,
//! respawns, purges, destroys, pauses and ticks; schedules set, deleted and fired, their jobs
//! keyed by occurrence; webhooks and tokens set and deleted) are applied once as up to three
//! entries at advancing clocks and once as one entry per command at each entry's clock: every
//! reply, every effect and every stored byte must be the same. The second run folds its
//! entries' effects with `Effects::merge`, as the store folds a batch's, so merging is checked
//! against effects added up within one apply.

#![allow(clippy::unwrap_used)]

use delayd_core::kv::{Cf, MemKv, Overlay};
use delayd_core::{
    apply, query, CatchUp, Command, Due, Effects, Entry, JobId, JobState, JobTemplate, NewJob,
    Outcome, QueueName, Reply, Schedule, Target, Timetable, Webhook,
};
use proptest::prelude::*;

/// Stands for what the generator cannot know: a job's current lease (in a return or a fail)
/// or a schedule's next occurrence (in a fire). [`resolve`] puts in the value the commands
/// before it left; where there is none it stays, and matches nothing.
const CURRENT: u64 = u64::MAX;

/// Stands for a job (and its queue) handed out before the command: the latest delivery still
/// reserved, else the latest one, filled in by [`resolve`]; before any, it stays and names no
/// job (ids start at 1). Returns and fails are of delivered jobs, and a random id is rarely
/// reserved.
const DELIVERED: JobId = JobId(0);

/// The occurrences schedules are set to and fired at.
const OCCURRENCES: [u64; 4] = [1_000, 1_010, 1_020, 1_030];

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

/// A job to publish, without a key; its id is numbered by the test.
fn new_job() -> impl Strategy<Value = NewJob> {
    (
        0u32..3,
        prop_oneof![Just(0u64), Just(5), Just(50)],
        1usize..300,
        prop_oneof![Just(None), Just(Some(60u64)), Just(Some(500))],
        // One try: a timeout or a fail sends it to the dead letter, for purges and respawns.
        1u16..3,
    )
        .prop_map(|(priority, delay, body, ttl, tries)| NewJob {
            id: JobId(0), // numbered below
            key: None,
            body: vec![7; body],
            attributes: Default::default(),
            due: Due::After(delay),
            ttl_ms: ttl,
            tries,
            ttr_ms: 10,
            priority,
        })
}

fn occurrence() -> impl Strategy<Value = u64> {
    prop::sample::select(OCCURRENCES.to_vec())
}

/// Two names, one of them most of the time, so that schedules, tokens and webhooks are
/// replaced, deleted and fired about as often as they are created.
fn name(prefix: &'static str) -> impl Strategy<Value = String> {
    prop::bool::weighted(0.2).prop_map(move |b| format!("{prefix}{}", u8::from(b)))
}

/// The job a schedule publishes for `occurrence`, keyed as the schedule pump keys it.
fn occurrence_job(name: &str, occurrence: u64) -> NewJob {
    NewJob {
        id: JobId(0), // numbered below
        key: Some(format!("{name}@{occurrence}")),
        body: vec![9; 20],
        attributes: Default::default(),
        due: Due::At(occurrence),
        ttl_ms: None,
        tries: 2,
        ttr_ms: 10,
        priority: 1,
    }
}

fn command() -> impl Strategy<Value = Command> {
    // Weights: the commands that move jobs carry most of it, so that sequences of a few dozen
    // commands keep jobs in every state; webhooks and tokens, which no job command reads, are
    // few.
    // Ids 1..40 are published in order below; the others name any of them.
    let id = (1u128..40).prop_map(JobId);
    let delivered = prop_oneof![2 => Just(DELIVERED), 1 => id.clone()];
    // Mostly the job's own lease, so that returns and fails take effect when it is reserved.
    let lease = prop_oneof![3 => Just(CURRENT), 1 => Just(1u64)];
    prop_oneof![
        12 => (any::<bool>(), new_job())
            .prop_map(|(b, job)| Command::Publish { queue: queue(b), job }),
        2 => (any::<bool>(), delivered.clone(), new_job(), prop::option::of(name("k"))).prop_map(
            |(b, old, mut job, key)| {
                // Two keys over two queues: a republish finds its key held by the job it
                // replaces, by another job, or free.
                job.key = key;
                Command::Republish { queue: queue(b), old, job }
            }
        ),
        9 => (queues(), 1u32..4, any::<u64>()).prop_map(|(queues, count, seed)| {
            Command::Reserve { queues, count, ttr_ms: None, lease_seed: seed }
        }),
        3 => (queues(), 1u32..4, any::<u64>()).prop_map(|(queues, count, seed)| {
            Command::ReserveUrgent { queues, count, ttr_ms: None, lease_seed: seed }
        }),
        6 => (any::<bool>(), id.clone()).prop_map(|(b, id)| Command::Ack {
            queue: queue(b),
            id,
            lease: None,
        }),
        3 => (any::<bool>(), id.clone(), prop_oneof![Just(0u64), Just(5)], prop::option::of(0u32..3))
            .prop_map(|(b, id, delay_ms, priority)| Command::Release {
                queue: queue(b),
                id,
                lease: None,
                delay_ms,
                priority,
            }),
        3 => (any::<bool>(), id.clone()).prop_map(|(b, id)| Command::Cancel {
            queue: queue(b),
            target: Target::Id(id),
        }),
        3 => (any::<bool>(), id.clone()).prop_map(|(b, id)| Command::KickJob { queue: queue(b), id }),
        3 => (any::<bool>(), id.clone(), prop::option::of(0u32..3), any::<bool>()).prop_map(
            |(b, id, priority, now)| Command::Update {
                queue: queue(b),
                target: Target::Id(id),
                due: now.then_some(Due::After(0)),
                body: None,
                priority,
            }
        ),
        3 => (any::<bool>(), delivered.clone(), lease.clone())
            .prop_map(|(b, id, lease)| Command::Return { queue: queue(b), id, lease }),
        3 => (
            any::<bool>(),
            delivered.clone(),
            prop_oneof![Just(None), lease.prop_map(Some)],
            name("error "),
            prop_oneof![Just(0u64), Just(5), Just(100)],
        )
            .prop_map(|(b, id, lease, error, delay_ms)| Command::Fail {
                queue: queue(b),
                id,
                lease,
                error,
                delay_ms,
            }),
        3 => (any::<bool>(), id.clone())
            .prop_map(|(b, id)| Command::Bury { queue: queue(b), id, lease: None }),
        1 => (any::<bool>(), delivered, 0u32..3).prop_map(|(b, id, priority)| {
            Command::BuryWithPriority { queue: queue(b), id, lease: None, priority }
        }),
        3 => (any::<bool>(), id.clone()).prop_map(|(b, id)| Command::Touch {
            queue: queue(b),
            id,
            lease: None,
            ttr_ms: None,
        }),
        3 => (any::<bool>(), id, any::<u64>()).prop_map(|(b, id, seed)| Command::ReserveJob {
            queue: queue(b),
            id,
            ttr_ms: None,
            lease_seed: seed,
        }),
        3 => (any::<bool>(), 1u32..4).prop_map(|(b, limit)| Command::Kick { queue: queue(b), limit }),
        3 => (any::<bool>(), 1u32..4)
            .prop_map(|(b, limit)| Command::Respawn { queue: queue(b), limit, ttl_ms: None }),
        3 => (any::<bool>(), 1u32..4)
            .prop_map(|(b, limit)| Command::Purge { queue: queue(b), limit }),
        3 => (any::<bool>(), any::<bool>())
            .prop_map(|(b, all)| Command::Destroy { queue: queue(b), all }),
        3 => (any::<bool>(), any::<bool>())
            .prop_map(|(b, paused)| Command::SetPaused { queue: queue(b), paused }),
        3 => (1u32..5).prop_map(|limit| Command::Tick { limit }),
        3 => (any::<bool>(), name("s"), prop::option::weighted(0.9, occurrence())).prop_map(
            |(b, name, next_at_ms)| Command::SetSchedule {
                queue: queue(b),
                schedule: Schedule {
                    name,
                    timetable: Timetable::Every { ms: 10 },
                    job: JobTemplate {
                        body: vec![9; 20],
                        attributes: Default::default(),
                        ttl_ms: None,
                        tries: 2,
                        ttr_ms: 10,
                        priority: 1,
                    },
                    start_at_ms: OCCURRENCES[0],
                    end_at_ms: None,
                    catch_up: CatchUp::All,
                    next_at_ms,
                },
            }
        ),
        1 => (any::<bool>(), name("s"))
            .prop_map(|(b, name)| Command::DeleteSchedule { queue: queue(b), name }),
        3 => (
            any::<bool>(),
            name("s"),
            prop_oneof![3 => Just(CURRENT), 1 => occurrence()],
            prop::collection::vec(occurrence(), 0..3),
            // Mostly on: a schedule that ends is fired no more.
            prop::option::weighted(0.8, occurrence()),
        )
            .prop_map(|(b, name, at_ms, fired, next_at_ms)| {
                // Occurrences repeat across fires: a job already published under its key is
                // not published again.
                let jobs = fired.iter().map(|&at| occurrence_job(&name, at)).collect();
                Command::FireSchedule { queue: queue(b), name, at_ms, jobs, next_at_ms }
            }),
        1 => (any::<bool>(), name("http://hook/")).prop_map(|(b, url)| Command::SetWebhook {
            queue: queue(b),
            webhook: Webhook { url, timeout_ms: 1_000, max_in_flight: 1, ..Webhook::default() },
        }),
        1 => any::<bool>().prop_map(|b| Command::DeleteWebhook { queue: queue(b) }),
        1 => (name("t"), name("ns"), 0u32..2).prop_map(|(token, namespace, limit)| {
            Command::CreateToken {
                token,
                namespace,
                description: String::new(),
                read_limit: limit,
                write_limit: limit,
            }
        }),
        1 => (name("ns"), name("t"))
            .prop_map(|(namespace, token)| Command::DeleteToken { namespace, token }),
    ]
}

/// Fills in every [`CURRENT`] and [`DELIVERED`] of `entries`: applies their commands one
/// entry each and looks up, before each command, what they stand for.
fn resolve(entries: &mut [(u64, Vec<Command>)]) {
    let mut kv = MemKv::default();
    let mut delivered: Vec<(QueueName, JobId)> = Vec::new();
    for (now_ms, commands) in entries.iter_mut() {
        for command in commands.iter_mut() {
            let mut lease = None;
            match command {
                Command::Return { queue, id, lease: l }
                | Command::Fail { queue, id, lease: Some(l), .. } => lease = Some((queue, id, l)),
                Command::Fail { queue, id, .. }
                | Command::BuryWithPriority { queue, id, .. }
                | Command::Republish { queue, old: id, .. } => {
                    fill_delivered(&kv, &delivered, queue, id);
                }
                Command::FireSchedule { queue, name, at_ms, .. } if *at_ms == CURRENT => {
                    let schedule = query::schedule(&kv, queue, name).unwrap();
                    *at_ms = schedule.and_then(|s| s.next_at_ms).unwrap_or(CURRENT);
                }
                _ => {}
            }
            if let Some((queue, id, lease)) = lease {
                fill_delivered(&kv, &delivered, queue, id);
                if *lease == CURRENT {
                    let job = query::job(&kv, queue, *id).unwrap();
                    *lease = job.and_then(|j| j.lease).map_or(CURRENT, |l| l.token);
                }
            }
            let mut overlay = Overlay::new(&kv);
            let entry = Entry::new(*now_ms, vec![command.clone()]);
            let outcomes = apply(&mut overlay, &entry, &mut Effects::default()).unwrap();
            if let Some(Ok(Reply::Reserved(deliveries))) = outcomes.last() {
                delivered.extend(deliveries.iter().map(|d| (d.job.queue.clone(), d.job.id)));
            }
            let writes: Vec<_> = overlay.into_writes().collect();
            kv.apply(writes);
        }
    }
}

/// Replaces a [`DELIVERED`] `id` (and its `queue`) with one of the jobs `delivered` so far.
fn fill_delivered(
    kv: &MemKv,
    delivered: &[(QueueName, JobId)],
    queue: &mut QueueName,
    id: &mut JobId,
) {
    if *id != DELIVERED {
        return;
    }
    let reserved = |(q, i): &&(QueueName, JobId)| {
        query::job(kv, q, *i).unwrap().is_some_and(|j| j.state == JobState::Reserved)
    };
    if let Some((q, i)) = delivered.iter().rev().find(reserved).or(delivered.last()) {
        (*queue, *id) = (q.clone(), *i);
    }
}

/// Every stored record: column family, key and value.
type Stored = Vec<(Cf, Vec<u8>, Vec<u8>)>;

/// Applies `entries` (each a clock and its commands) to an empty store: the replies in order,
/// everything stored, and the effects of all entries together. With `merged`, each entry's
/// effects are its own and are folded with [`Effects::merge`], as the store folds a batch's
/// entries; otherwise every entry adds to the same effects.
fn run(entries: &[(u64, Vec<Command>)], merged: bool) -> (Vec<Outcome>, Stored, Effects) {
    let mut kv = MemKv::default();
    let mut outcomes = Vec::new();
    let mut effects = Effects::default();
    for (now_ms, commands) in entries {
        let mut overlay = Overlay::new(&kv);
        let entry = Entry::new(*now_ms, commands.clone());
        if merged {
            let mut own = Effects::default();
            outcomes.extend(apply(&mut overlay, &entry, &mut own).unwrap());
            effects.merge(own);
        } else {
            outcomes.extend(apply(&mut overlay, &entry, &mut effects).unwrap());
        }
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
        let mut now_ms = 1_000u64;
        for (advance, mut commands) in groups {
            now_ms += advance;
            for c in &mut commands {
                let jobs = match c {
                    Command::Publish { job, .. } | Command::Republish { job, .. } => {
                        std::slice::from_mut(job)
                    }
                    Command::FireSchedule { jobs, .. } => jobs.as_mut_slice(),
                    _ => &mut [],
                };
                for job in jobs {
                    next_id += 1;
                    job.id = JobId(next_id);
                }
            }
            together.push((now_ms, commands));
        }
        resolve(&mut together);
        let apart: Vec<_> = together
            .iter()
            .flat_map(|(now_ms, commands)| commands.iter().map(|c| (*now_ms, vec![c.clone()])))
            .collect();
        // Apart, each entry's effects are merged into the others' (as a store's batch is);
        // together, they add up in place: both must say the same.
        let (replies_together, stored_together, effects_together) = run(&together, false);
        let (replies_apart, stored_apart, effects_apart) = run(&apart, true);
        prop_assert_eq!(replies_together, replies_apart);
        prop_assert_eq!(stored_together, stored_apart);
        prop_assert_eq!(effects_together, effects_apart);
    }
}
