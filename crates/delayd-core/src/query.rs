//! Read-only queries over a consistent view of the state machine.
//!
//! These never change state, so they run outside the log against a snapshot of the local
//! replica (made linearizable by the caller when it needs to be).

use std::collections::BTreeMap;

use crate::codec::{decode, decode_job, decode_job_queue};
use crate::keys::{self, KeyRecord, TimerKind, META_CLOCK};
use crate::kv::{Cf, KvError, KvRead};
use crate::limits::MAX_WORK_BYTES_PER_COMMAND;
use crate::model::{Job, JobId, QueueMeta, QueueName, Schedule, TokenRecord, Webhook};

/// The job with this id, if it exists in `queue`.
pub fn job(kv: &impl KvRead, queue: &QueueName, id: JobId) -> Result<Option<Job>, KvError> {
    Ok(job_anywhere(kv, id)?.filter(|j| &j.queue == queue))
}

/// One job by id, whatever its queue (for protocols whose job ids are global).
pub fn job_anywhere(kv: &impl KvRead, id: JobId) -> Result<Option<Job>, KvError> {
    kv.get(Cf::Jobs, &id.to_bytes())?.map(|v| decode_job(&v)).transpose()
}

/// The job with this number ([`Job::number`]), whatever its queue.
pub fn job_by_number(kv: &impl KvRead, number: u64) -> Result<Option<Job>, KvError> {
    let Some(v) = kv.get(Cf::Meta, &keys::number(number))? else { return Ok(None) };
    let Some((id, queue)) = keys::parse_numbered(&v) else {
        return Err(KvError("corrupt job number index".into()));
    };
    job(kv, &queue, id)
}

/// The live job holding a client key.
pub fn job_by_key(kv: &impl KvRead, queue: &QueueName, key: &str) -> Result<Option<Job>, KvError> {
    let rec: Option<KeyRecord> =
        kv.get(Cf::Keys, &keys::client_key(queue, key))?.map(|v| decode(&v)).transpose()?;
    match rec {
        Some(KeyRecord { id, ended_ms: None }) => job(kv, queue, id),
        _ => Ok(None),
    }
}

/// The jobs of `queue` with these ids, in order; ids of no job of the queue are skipped.
fn jobs_of(kv: &impl KvRead, queue: &QueueName, ids: Vec<JobId>) -> Result<Vec<Job>, KvError> {
    let mut jobs = Vec::with_capacity(ids.len());
    for id in ids {
        jobs.extend(job(kv, queue, id)?);
    }
    Ok(jobs)
}

/// Up to `limit` jobs from the head of a per-queue index (Ready or Dead), in order.
fn head(kv: &impl KvRead, cf: Cf, queue: &QueueName, limit: usize) -> Result<Vec<Job>, KvError> {
    let prefix = keys::queue(queue);
    // The ready index is consumed from its head: start past its tombstones (keys::floor).
    let from = match cf {
        Cf::Ready => kv.get(Cf::Meta, &keys::floor(queue))?.unwrap_or_else(|| prefix.clone()),
        _ => prefix.clone(),
    };
    let mut ids = Vec::new();
    if limit > 0 {
        kv.scan(cf, &from, &keys::prefix_end(&prefix), &mut |k, _| {
            ids.extend(keys::trailing_id(k));
            ids.len() < limit
        })?;
    }
    jobs_of(kv, queue, ids)
}

/// The next job a reserve would hand out.
pub fn peek_ready(kv: &impl KvRead, queue: &QueueName) -> Result<Option<Job>, KvError> {
    Ok(head(kv, Cf::Ready, queue, 1)?.pop())
}

/// The delayed job of `queue` that comes due first (the earliest published of those due
/// the same millisecond).
pub fn peek_delayed(kv: &impl KvRead, queue: &QueueName) -> Result<Option<Job>, KvError> {
    Ok(delayed(kv, queue, 1)?.pop())
}

/// Up to `limit` delayed jobs of `queue` in the order they come due. The due histogram says
/// in which minutes the queue has delayed jobs; the timers of those minutes are read in
/// order, loading each due timer's job until `limit` of them are the queue's. Timers of
/// other queues in those minutes are stepped over: the cost is the busiest minute's timers.
pub fn delayed(kv: &impl KvRead, queue: &QueueName, limit: usize) -> Result<Vec<Job>, KvError> {
    let prefix = keys::queue(queue);
    let mut minutes = Vec::new();
    kv.scan(Cf::DueHist, &prefix, &keys::prefix_end(&prefix), &mut |k, _| {
        let minute = k.get(prefix.len()..).and_then(|m| m.try_into().ok()).map(u64::from_be_bytes);
        minutes.extend(minute);
        true
    })?;
    let mut found = Vec::new();
    for minute in minutes {
        if found.len() >= limit {
            break;
        }
        let from = keys::timer(minute.saturating_mul(60_000), keys::TimerKind::Expire, JobId(0));
        let next = minute.saturating_add(1).saturating_mul(60_000);
        let to = keys::timer(next, keys::TimerKind::Expire, JobId(0));
        let mut failed = Ok(());
        kv.scan(Cf::Timers, &from, &to, &mut |k, _| {
            let Some((deadline, keys::TimerKind::Due, id)) = keys::parse_timer(k) else {
                return true;
            };
            match job(kv, queue, id) {
                Ok(Some(j))
                    if j.state == crate::model::JobState::Delayed && j.due_ms == deadline =>
                {
                    found.push(j)
                }
                Ok(_) => {}
                Err(e) => failed = Err(e),
            }
            failed.is_ok() && found.len() < limit
        })?;
        failed?;
    }
    Ok(found)
}

/// How many ready jobs of `queue` have a priority below `priority`, counting at most `cap`
/// (the ready index is in priority order, so this reads only those jobs' index keys).
pub fn ready_below(
    kv: &impl KvRead,
    queue: &QueueName,
    priority: u32,
    cap: u64,
) -> Result<u64, KvError> {
    let prefix = keys::queue(queue);
    let from = kv.get(Cf::Meta, &keys::floor(queue))?.unwrap_or_else(|| prefix.clone());
    let to = keys::ready(queue, priority, 0, JobId(0));
    let mut n = 0;
    if from < to {
        kv.scan(Cf::Ready, &from, &to, &mut |_, _| {
            n += 1;
            n < cap
        })?;
    }
    Ok(n)
}

/// Up to `limit` jobs of `queue` in any state, in id order (publish order), starting after
/// the job `after` when given: a cursor over a queue's jobs.
pub fn members(
    kv: &impl KvRead,
    queue: &QueueName,
    after: Option<JobId>,
    limit: usize,
) -> Result<Vec<Job>, KvError> {
    let prefix = keys::queue(queue);
    let from = match after {
        // The smallest key above the member `after`.
        Some(id) => {
            let mut k = keys::member(queue, id);
            k.push(0);
            k
        }
        None => prefix.clone(),
    };
    let mut ids = Vec::new();
    if limit > 0 {
        kv.scan(Cf::Members, &from, &keys::prefix_end(&prefix), &mut |k, _| {
            ids.extend(keys::trailing_id(k));
            ids.len() < limit
        })?;
    }
    jobs_of(kv, queue, ids)
}

/// Up to `limit` dead jobs, oldest first.
pub fn dead_letter(kv: &impl KvRead, queue: &QueueName, limit: usize) -> Result<Vec<Job>, KvError> {
    head(kv, Cf::Dead, queue, limit)
}

/// The queue's metadata: pause flag and counts per state. Read between entries: while an
/// entry is being applied, its changes to the metadata are not in the overlay yet (see the
/// `kv` module).
pub fn queue_meta(kv: &impl KvRead, queue: &QueueName) -> Result<QueueMeta, KvError> {
    Ok(kv
        .get(Cf::Queues, &keys::queue(queue))?
        .map(|v| decode(&v))
        .transpose()?
        .unwrap_or_default())
}

/// Whether a reserve from `queues` would find anything: some queue is not paused and has
/// ready jobs. Reads one small metadata record per queue.
pub fn anything_ready(kv: &impl KvRead, queues: &[QueueName]) -> Result<bool, KvError> {
    for queue in queues {
        let meta = queue_meta(kv, queue)?;
        if meta.has_job_to_hand_out() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Every queue with its metadata, sorted by namespace then queue; only those of `namespace`
/// when one is given; at most `limit` (the first ones in that order).
///
/// A queue exists from its first publish on: its metadata stays when it empties, so an idle
/// queue is listed with zero counts. Keys order queues by name length first (see [`keys`]),
/// so the scan visits every queue (of the namespace) and keeps the `limit` smallest names;
/// queue metadata is a few bytes per queue.
pub fn queues(
    kv: &impl KvRead,
    namespace: Option<&str>,
    limit: usize,
) -> Result<Vec<(QueueName, QueueMeta)>, KvError> {
    let prefix = match namespace {
        // `[len] ns` is a prefix of exactly that namespace's queue keys.
        Some(ns) => match u8::try_from(ns.len()) {
            Ok(len) => [&[len][..], ns.as_bytes()].concat(),
            Err(_) => return Ok(Vec::new()),
        },
        None => Vec::new(),
    };
    let mut found: std::collections::BTreeMap<QueueName, Vec<u8>> = Default::default();
    let mut bad = false;
    if limit > 0 {
        kv.scan(
            Cf::Queues,
            &prefix,
            &keys::prefix_end(&prefix),
            &mut |k, v| match keys::split_queue(k) {
                Some((name, [])) => {
                    found.insert(name, v.to_vec());
                    if found.len() > limit {
                        found.pop_last();
                    }
                    true
                }
                _ => {
                    bad = true;
                    false
                }
            },
        )?;
    }
    if bad {
        return Err(KvError("corrupt queue key".into()));
    }
    found.into_iter().map(|(name, v)| Ok((name, decode(&v)?))).collect()
}

/// How many delayed jobs come due within each of `bounds_ms` from `now_ms` (cumulative
/// buckets: the last element counts everything). Minute resolution: a job is counted in the
/// first bucket its due minute's start falls in.
pub fn due_histogram(
    kv: &impl KvRead,
    queue: &QueueName,
    now_ms: u64,
    bounds_ms: &[u64],
) -> Result<Vec<u64>, KvError> {
    let prefix = keys::queue(queue);
    let mut counts = vec![0u64; bounds_ms.len() + 1];
    let mut bad = false;
    kv.scan(Cf::DueHist, &prefix, &keys::prefix_end(&prefix), &mut |k, v| {
        let (Some(minute), Ok(n)) = (
            k.get(prefix.len()..).and_then(|m| m.try_into().ok()).map(u64::from_be_bytes),
            <[u8; 8]>::try_from(v).map(u64::from_be_bytes),
        ) else {
            bad = true;
            return false;
        };
        let offset = (minute * 60_000).saturating_sub(now_ms);
        let first = bounds_ms.iter().position(|b| offset <= *b).unwrap_or(bounds_ms.len());
        for c in &mut counts[first..] {
            *c += n;
        }
        true
    })?;
    if bad {
        return Err(KvError("corrupt due histogram".into()));
    }
    Ok(counts)
}

/// The earliest pending deadline of any kind: when the timer pump must next run.
pub fn next_deadline(kv: &impl KvRead) -> Result<Option<u64>, KvError> {
    let mut next = None;
    // From the floor: the fired timers below it are tombstones until a compaction.
    let floor = kv.get(Cf::Meta, keys::META_TIMERS_FLOOR)?.unwrap_or_default();
    kv.scan(Cf::Timers, &floor, &[], &mut |k, _| {
        next = keys::parse_timer(k).map(|(d, _, _)| d);
        false
    })?;
    Ok(next)
}

/// The keys of the timers due at `now_ms`, as a half-open range: from the index's floor (the
/// fired timers below it are tombstones until a compaction) to the first key past `now_ms`
/// (`Expire` sorts first). What a tick fires, and what the pump counts before one.
pub fn due_timers(kv: &impl KvRead, now_ms: u64) -> Result<(Vec<u8>, Vec<u8>), KvError> {
    let floor = kv.get(Cf::Meta, keys::META_TIMERS_FLOOR)?.unwrap_or_default();
    Ok((floor, keys::timer(now_ms.saturating_add(1), TimerKind::Expire, JobId(0))))
}

/// Of the queues in `wanted`, those that a tick at `now_ms` firing at most `limit` timers may
/// make jobs ready in, with how many each (at most what `wanted` asks of it): the due timers
/// of delayed jobs coming due and of leases running out, among the first `limit` due, counted
/// by their job's queue. An upper bound: a lease that ends in the dead letter counts too.
///
/// Stops once every wanted queue has its count, or once the job records read pass
/// [`MAX_WORK_BYTES_PER_COMMAND`] (where the tick itself would stop).
pub fn due_ready_by_queue(
    kv: &impl KvRead,
    now_ms: u64,
    limit: u32,
    wanted: &BTreeMap<QueueName, u64>,
) -> Result<BTreeMap<QueueName, u64>, KvError> {
    let mut due = BTreeMap::new();
    if wanted.is_empty() {
        return Ok(due);
    }
    let (floor, end) = due_timers(kv, now_ms)?;
    let (mut seen, mut ids) = (0u32, Vec::new());
    kv.scan(Cf::Timers, &floor, &end, &mut |k, _| {
        if let Some((_, TimerKind::Due | TimerKind::Lease, id)) = keys::parse_timer(k) {
            ids.push(id);
        }
        seen += 1;
        seen < limit
    })?;
    let (mut unmet, mut read) = (wanted.len(), 0usize);
    for id in ids {
        if unmet == 0 || read >= MAX_WORK_BYTES_PER_COMMAND {
            break;
        }
        let Some(v) = kv.get(Cf::Jobs, &id.to_bytes())? else { continue };
        read += v.len();
        let queue = decode_job_queue(&v)?;
        let Some(want) = wanted.get(&queue) else { continue };
        let n: &mut u64 = due.entry(queue).or_default();
        if *n < *want {
            *n += 1;
            if n == want {
                unmet -= 1;
            }
        }
    }
    Ok(due)
}

/// The replicated clock: the latest `now_ms` applied.
pub fn clock(kv: &impl KvRead) -> Result<u64, KvError> {
    Ok(kv
        .get(Cf::Meta, META_CLOCK)?
        .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
        .map_or(0, u64::from_be_bytes))
}

/// A schedule of `queue`, if it exists.
pub fn schedule(
    kv: &impl KvRead,
    queue: &QueueName,
    name: &str,
) -> Result<Option<Schedule>, KvError> {
    kv.get(Cf::Meta, &keys::schedule(queue, name))?.map(|v| decode(&v)).transpose()
}

/// The schedules of `queue`, ordered by name.
pub fn schedules(kv: &impl KvRead, queue: &QueueName) -> Result<Vec<Schedule>, KvError> {
    let prefix = keys::schedule(queue, "");
    let mut out = Vec::new();
    let mut failed = None;
    kv.scan(Cf::Meta, &prefix, &keys::prefix_end(&prefix), &mut |_, v| {
        match decode::<Schedule>(v) {
            Ok(s) => out.push(s),
            Err(e) => failed = Some(e),
        }
        failed.is_none()
    })?;
    match failed {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// The earliest next occurrence of any schedule: its time, queue and name.
pub fn next_schedule(kv: &impl KvRead) -> Result<Option<(u64, QueueName, String)>, KvError> {
    let prefix = keys::SCHEDULE_DUE_PREFIX;
    let floor = kv.get(Cf::Meta, keys::META_SCHEDULES_FLOOR)?;
    let mut first = None;
    kv.scan(
        Cf::Meta,
        floor.as_deref().unwrap_or(prefix),
        &keys::prefix_end(prefix),
        &mut |k, _| {
            first = Some(keys::parse_schedule_due(k));
            false
        },
    )?;
    match first {
        None => Ok(None),
        Some(Some(next)) => Ok(Some(next)),
        Some(None) => Err(KvError("corrupt schedule index key".into())),
    }
}

/// A queue's webhook, if it has one.
pub fn webhook(kv: &impl KvRead, queue: &QueueName) -> Result<Option<Webhook>, KvError> {
    kv.get(Cf::Meta, &keys::webhook(queue))?.map(|v| decode(&v)).transpose()
}

/// Every queue with a webhook, ordered by queue.
pub fn webhooks(kv: &impl KvRead) -> Result<Vec<(QueueName, Webhook)>, KvError> {
    let prefix = keys::WEBHOOK_PREFIX;
    let mut out = Vec::new();
    let mut failed = None;
    kv.scan(Cf::Meta, prefix, &keys::prefix_end(prefix), &mut |k, v| {
        match (keys::split_queue(&k[prefix.len()..]), decode::<Webhook>(v)) {
            (Some((queue, [])), Ok(webhook)) => out.push((queue, webhook)),
            (Some(_) | None, Ok(_)) => failed = Some(KvError("corrupt webhook key".into())),
            (_, Err(e)) => failed = Some(e),
        }
        failed.is_none()
    })?;
    match failed {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// The record of a namespace token, if the token exists.
pub fn token(kv: &impl KvRead, token: &str) -> Result<Option<TokenRecord>, KvError> {
    kv.get(Cf::Meta, &keys::token(token))?.map(|v| decode(&v)).transpose()
}

/// Every token of `namespace` (of all namespaces when `None`), ordered by token.
pub fn tokens(
    kv: &impl KvRead,
    namespace: Option<&str>,
) -> Result<Vec<(String, TokenRecord)>, KvError> {
    let prefix = keys::TOKEN_PREFIX;
    let mut out = Vec::new();
    let mut failed = None;
    kv.scan(Cf::Meta, prefix, &keys::prefix_end(prefix), &mut |k, v| {
        match decode::<TokenRecord>(v) {
            Ok(rec) if namespace.is_none_or(|ns| ns == rec.namespace) => {
                out.push((String::from_utf8_lossy(&k[prefix.len()..]).into_owned(), rec));
            }
            Ok(_) => {}
            Err(e) => {
                failed = Some(e);
                return false;
            }
        }
        true
    })?;
    match failed {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::command::Command;
    use crate::kv::MemKv;
    use crate::machine::testing::{new_job, run};

    fn publish(ns: &str, q: &str, id: u128, delay_ms: u64) -> Command {
        Command::Publish { queue: QueueName::new(ns, q), job: new_job(id, delay_ms) }
    }

    fn reserve(ns: &str, q: &str) -> Command {
        Command::Reserve {
            queues: vec![QueueName::new(ns, q)],
            count: 1,
            ttr_ms: None,
            lease_seed: 7,
        }
    }

    fn listed(kv: &MemKv, ns: Option<&str>, limit: usize) -> Vec<(String, [u64; 4], bool)> {
        queues(kv, ns, limit)
            .unwrap()
            .into_iter()
            .map(|(q, m)| (q.to_string(), m.counts, m.paused))
            .collect()
    }

    #[test]
    fn due_ready_by_queue_counts_what_a_tick_would_make_ready() {
        let mut kv = MemKv::default();
        let mut expiring = new_job(4, 0);
        expiring.ttl_ms = Some(5); // an Expire timer at 1_005, which makes nothing ready
        run(
            &mut kv,
            1_000,
            vec![
                publish("ns", "a", 1, 10),
                publish("ns", "b", 2, 20),
                publish("ns", "a", 3, 500),
                Command::Publish { queue: QueueName::new("ns", "a"), job: expiring },
                publish("ns", "a", 5, 0),
            ],
        );
        // A reservation whose lease (ttr 1 s) runs out at 2_001.
        run(&mut kv, 1_001, vec![reserve("ns", "a")]);
        let wanted: BTreeMap<_, _> =
            [(QueueName::new("ns", "a"), 10), (QueueName::new("ns", "b"), 10)].into();
        let due = |kv: &MemKv, now, limit, wanted: &BTreeMap<QueueName, u64>| {
            due_ready_by_queue(kv, now, limit, wanted)
                .unwrap()
                .into_iter()
                .map(|(q, n)| (q.to_string(), n))
                .collect::<Vec<_>>()
        };
        let a = |n| ("ns/a".to_string(), n);
        let b = |n| ("ns/b".to_string(), n);
        assert!(due(&kv, 1_009, 100, &wanted).is_empty(), "only the expiry is due");
        assert_eq!(due(&kv, 1_010, 100, &wanted), [a(1)]);
        assert_eq!(due(&kv, 1_020, 100, &wanted), [a(1), b(1)]);
        assert_eq!(due(&kv, 1_020, 2, &wanted), [a(1)], "the limit counts the expiry");
        assert_eq!(due(&kv, 3_000, 100, &wanted), [a(3), b(1)], "the lease as well");
        // Only the queues wanted, each up to what it wants, however many of another's come
        // first.
        let only_b: BTreeMap<_, _> = [(QueueName::new("ns", "b"), 1)].into();
        assert_eq!(due(&kv, 3_000, 100, &only_b), [b(1)]);
        let one_of_a: BTreeMap<_, _> = [(QueueName::new("ns", "a"), 1)].into();
        assert_eq!(due(&kv, 3_000, 100, &one_of_a), [a(1)]);
        assert!(due(&kv, 3_000, 100, &BTreeMap::new()).is_empty(), "nobody waits");
        // Fired timers are not counted again.
        run(&mut kv, 1_020, vec![Command::Tick { limit: 100 }]);
        assert!(due(&kv, 1_020, 100, &wanted).is_empty());
    }

    /// The pump reads a due job's queue without decoding the rest of its record, of either
    /// encoding version.
    #[test]
    fn a_job_records_queue_decodes_from_either_version() {
        let mut kv = MemKv::default();
        run(&mut kv, 1_000, vec![publish("ns", "q", 1, 0)]);
        let v2 = kv.get(Cf::Jobs, &JobId(1).to_bytes()).unwrap().unwrap();
        assert_eq!(v2[0], 2);
        assert_eq!(decode_job_queue(&v2).unwrap(), QueueName::new("ns", "q"));
        // Version 1 is version 2 without the five trailing bytes that zero counters and a
        // zero number take.
        let mut job = decode_job(&v2).unwrap();
        (job.number, job.counters) = (0, Default::default());
        let zeroed = crate::codec::encode(&job);
        let v1 = [&[1u8][..], &zeroed[1..zeroed.len() - 5]].concat();
        assert_eq!(decode_job(&v1).unwrap(), job);
        assert_eq!(decode_job_queue(&v1).unwrap(), QueueName::new("ns", "q"));
        assert!(decode_job_queue(&[9, 0]).is_err(), "an unknown version is refused");
    }

    #[test]
    fn queues_lists_every_queue_sorted_with_counts() {
        let mut kv = MemKv::default();
        assert!(listed(&kv, None, 10).is_empty());
        // Names of different lengths: key order (length first) is not name order.
        run(
            &mut kv,
            1_000,
            vec![
                publish("zz", "a", 1, 0),
                publish("b", "long-name", 2, 0),
                publish("b", "x", 3, 60_000),
                publish("b", "x", 4, 0),
                publish("b", "x", 5, 0),
                Command::SetPaused { queue: QueueName::new("zz", "a"), paused: true },
            ],
        );
        run(&mut kv, 1_001, vec![reserve("b", "x")]);
        let all = vec![
            ("b/long-name".to_string(), [0, 1, 0, 0], false),
            ("b/x".to_string(), [1, 1, 1, 0], false),
            ("zz/a".to_string(), [0, 1, 0, 0], true),
        ];
        assert_eq!(listed(&kv, None, 10), all);
        assert_eq!(listed(&kv, None, 2), all[..2].to_vec());
        assert_eq!(listed(&kv, None, 0), vec![]);
        assert_eq!(listed(&kv, Some("b"), 10), all[..2].to_vec());
        assert_eq!(listed(&kv, Some("zz"), 10), all[2..].to_vec());
        // A namespace that is a prefix of another's name is not mixed up with it.
        assert_eq!(listed(&kv, Some("z"), 10), vec![]);
        assert_eq!(listed(&kv, Some("none"), 10), vec![]);
    }
}
