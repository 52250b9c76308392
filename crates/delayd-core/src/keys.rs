//! Key layouts of the state machine's column families.
//!
//! All integers are big-endian so that byte order is numeric order. A queue is encoded as
//! `[len(ns)] ns [len(q)] q`; names are at most 255 bytes, so one length byte suffices and no
//! queue's prefix is a prefix of another's.
//!
//! | cf       | key                                   | value          |
//! |----------|---------------------------------------|----------------|
//! | Jobs     | id(16)                                | [`Job`]        |
//! | Timers   | deadline_ms(8) kind(1) id(16)         | kind payload   |
//! | Ready    | queue priority(4) seq(8) id(16)       | —              |
//! | Dead     | queue seq(8) id(16)                   | —              |
//! | Members  | queue id(16)                          | —              |
//! | Keys     | queue key                             | [`KeyRecord`]  |
//! | Queues   | queue                                 | [`QueueMeta`]  |
//! | DueHist  | queue minute(8)                       | count(8)       |
//! | Meta     | name                                  | u64 (8)        |
//! | Meta     | `token/` token                        | [`TokenRecord`] |
//! | Meta     | `number/` number(8)                   | id(16) queue   |
//!
//! [`Job`]: crate::model::Job
//! [`QueueMeta`]: crate::model::QueueMeta
//! [`TokenRecord`]: crate::model::TokenRecord

use serde::{Deserialize, Serialize};

use crate::model::{JobId, QueueName};

/// Meta key of the replicated clock.
pub const META_CLOCK: &[u8] = b"clock";
/// Meta key of the ready/dead-letter sequence counter.
pub const META_SEQ: &[u8] = b"seq";

/// Meta key of the job number counter: the last number given (see [`crate::Job::number`]).
pub const META_NUMBER: &[u8] = b"number";

/// Prefix of the job number index in the Meta column family.
pub const NUMBER_PREFIX: &[u8] = b"number/";

/// Meta key of a job number in the number index; the value is [`numbered`].
pub fn number(n: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(NUMBER_PREFIX.len() + 8);
    k.extend_from_slice(NUMBER_PREFIX);
    k.extend_from_slice(&n.to_be_bytes());
    k
}

/// The number index's value for a job: its id, then its queue.
pub fn numbered(id: JobId, q: &QueueName) -> Vec<u8> {
    let mut v = id.to_bytes().to_vec();
    v.extend(queue(q));
    v
}

/// Decodes [`numbered`].
pub fn parse_numbered(value: &[u8]) -> Option<(JobId, QueueName)> {
    let id = JobId::from_bytes(value.get(..16)?.try_into().ok()?);
    let (queue, rest) = split_queue(&value[16..])?;
    rest.is_empty().then_some((id, queue))
}

/// Meta key of the timer index's floor (see [`floor`]).
pub const META_TIMERS_FLOOR: &[u8] = b"floor/timers";

/// Meta key of a queue's ready-index floor.
///
/// A floor is a key of an index below which the index holds no live entry. Queues are
/// consumed from their head, and RocksDB keeps the deleted head entries as tombstones until a
/// compaction; a scan from the start of the range would step over every one of them, so
/// reserving and ticking would slow down with every job consumed. Scans start at the floor
/// instead: after consuming the first entries, the floor moves to the first entry left, and
/// an insert below the floor lowers it. The floor is replicated state like any other, so
/// every node scans the same way.
pub fn floor(q: &QueueName) -> Vec<u8> {
    prefixed_queue(b"floor/ready/", q)
}

/// `prefix`, then the queue's prefix ([`queue`]), in one allocation.
fn prefixed_queue(prefix: &[u8], q: &QueueName) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + queue_len(q));
    k.extend_from_slice(prefix);
    push_queue(&mut k, q);
    k
}

/// Prefix of the namespace tokens in the Meta column family.
pub const TOKEN_PREFIX: &[u8] = b"token/";

/// Meta key of a namespace token. Keyed by the token so that authenticating a request is one
/// point lookup; listing a namespace's tokens scans them all, which is fine for the handful
/// an operator creates.
pub fn token(token: &str) -> Vec<u8> {
    let mut k = TOKEN_PREFIX.to_vec();
    k.extend_from_slice(token.as_bytes());
    k
}

/// Prefix of the queues' webhooks in the Meta column family.
pub const WEBHOOK_PREFIX: &[u8] = b"webhook/";

/// Meta key of a queue's webhook.
pub fn webhook(q: &QueueName) -> Vec<u8> {
    prefixed_queue(WEBHOOK_PREFIX, q)
}

/// Prefix of the schedules in the Meta column family: `schedule/{queue}{name}`.
pub const SCHEDULE_PREFIX: &[u8] = b"schedule/";
/// Prefix of the schedule index in the Meta column family:
/// `schedule-due/{next occurrence, 8 bytes big-endian}{queue}{name}`, sorted by time.
pub const SCHEDULE_DUE_PREFIX: &[u8] = b"schedule-due/";

/// Meta key of the schedule index's floor: no live entry sorts below it. Firing deletes the
/// index's head; without the floor every scan for the next occurrence would step over the
/// deleted entries until compaction removes them (see [`floor`]).
pub const META_SCHEDULES_FLOOR: &[u8] = b"floor/schedules";

/// Meta key of a schedule.
pub fn schedule(q: &QueueName, name: &str) -> Vec<u8> {
    let mut k = prefixed_queue(SCHEDULE_PREFIX, q);
    k.extend_from_slice(name.as_bytes());
    k
}

/// Meta key of a schedule's next occurrence in the schedule index.
pub fn schedule_due(at_ms: u64, q: &QueueName, name: &str) -> Vec<u8> {
    let mut k = SCHEDULE_DUE_PREFIX.to_vec();
    k.extend_from_slice(&at_ms.to_be_bytes());
    push_queue(&mut k, q);
    k.extend_from_slice(name.as_bytes());
    k
}

/// Decodes a schedule index key: the occurrence, the queue and the schedule's name.
pub fn parse_schedule_due(key: &[u8]) -> Option<(u64, QueueName, String)> {
    let rest = key.strip_prefix(SCHEDULE_DUE_PREFIX)?;
    let at = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
    let (queue, name) = split_queue(&rest[8..])?;
    Some((at, queue, String::from_utf8(name.to_vec()).ok()?))
}

/// What a timer entry fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum TimerKind {
    /// The job's ttl passed. Sorted first: a job whose ttl ends the instant it comes due expires.
    Expire = 0,
    /// A reservation's ttr passed.
    Lease = 1,
    /// A delayed job came due.
    Due = 2,
    /// A finished job's key leaves the dedup window; the payload names the key.
    KeyGc = 3,
}

impl TimerKind {
    fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            0 => TimerKind::Expire,
            1 => TimerKind::Lease,
            2 => TimerKind::Due,
            3 => TimerKind::KeyGc,
            _ => return None,
        })
    }
}

/// A client key's record: the job holding it, and when that job ended (then the key is only
/// remembered for the dedup window).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// The job that was published under the key.
    pub id: JobId,
    /// When the job finished, if it has.
    pub ended_ms: Option<u64>,
}

/// The queue prefix shared by every per-queue index.
pub fn queue(q: &QueueName) -> Vec<u8> {
    // Room for the longest suffix an index adds (a ready key's priority, sequence and id), so
    // that building any per-queue key allocates once.
    let mut k = Vec::with_capacity(queue_len(q) + 28);
    push_queue(&mut k, q);
    k
}

/// The length of the queue's prefix ([`queue`]): two length bytes and the two names.
fn queue_len(q: &QueueName) -> usize {
    2 + q.namespace.len() + q.queue.len()
}

/// Appends the queue's prefix ([`queue`]) to `k`.
fn push_queue(k: &mut Vec<u8>, q: &QueueName) {
    k.push(q.namespace.len() as u8);
    k.extend_from_slice(q.namespace.as_bytes());
    k.push(q.queue.len() as u8);
    k.extend_from_slice(q.queue.as_bytes());
}

/// Splits a per-queue key into its queue and the rest.
pub fn split_queue(key: &[u8]) -> Option<(QueueName, &[u8])> {
    let (&ns_len, rest) = key.split_first()?;
    let ns = rest.get(..ns_len as usize)?;
    let (&q_len, rest) = rest.get(ns_len as usize..)?.split_first()?;
    let q = rest.get(..q_len as usize)?;
    let name =
        QueueName::new(String::from_utf8(ns.to_vec()).ok()?, String::from_utf8(q.to_vec()).ok()?);
    Some((name, &rest[q_len as usize..]))
}

/// The smallest key greater than every key starting with `prefix`, for exclusive upper bounds.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    Vec::new() // all 0xFF: unbounded
}

/// Timers key.
pub fn timer(deadline_ms: u64, kind: TimerKind, id: JobId) -> Vec<u8> {
    let mut k = Vec::with_capacity(25);
    k.extend_from_slice(&deadline_ms.to_be_bytes());
    k.push(kind as u8);
    k.extend_from_slice(&id.to_bytes());
    k
}

/// Decodes a Timers key.
pub fn parse_timer(key: &[u8]) -> Option<(u64, TimerKind, JobId)> {
    if key.len() != 25 {
        return None;
    }
    let deadline = u64::from_be_bytes(key[..8].try_into().ok()?);
    let kind = TimerKind::from_u8(key[8])?;
    Some((deadline, kind, trailing_id(key)?))
}

/// Ready key.
pub fn ready(q: &QueueName, priority: u32, seq: u64, id: JobId) -> Vec<u8> {
    let mut k = queue(q);
    k.extend_from_slice(&priority.to_be_bytes());
    k.extend_from_slice(&seq.to_be_bytes());
    k.extend_from_slice(&id.to_bytes());
    k
}

/// Dead-letter key.
pub fn dead(q: &QueueName, seq: u64, id: JobId) -> Vec<u8> {
    let mut k = queue(q);
    k.extend_from_slice(&seq.to_be_bytes());
    k.extend_from_slice(&id.to_bytes());
    k
}

/// Members key.
pub fn member(q: &QueueName, id: JobId) -> Vec<u8> {
    let mut k = queue(q);
    k.extend_from_slice(&id.to_bytes());
    k
}

/// Keys key.
pub fn client_key(q: &QueueName, key: &str) -> Vec<u8> {
    let mut k = queue(q);
    k.extend_from_slice(key.as_bytes());
    k
}

/// DueHist key for the minute containing `due_ms`.
pub fn due_minute(q: &QueueName, due_ms: u64) -> Vec<u8> {
    let mut k = queue(q);
    k.extend_from_slice(&(due_ms / 60_000).to_be_bytes());
    k
}

/// The job id that ends Timers, Ready, Dead and Members keys.
pub fn trailing_id(key: &[u8]) -> Option<JobId> {
    let start = key.len().checked_sub(16)?;
    Some(JobId::from_bytes(key[start..].try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_prefixes_do_not_nest() {
        let a = queue(&QueueName::new("ns", "q"));
        let b = queue(&QueueName::new("ns", "q2"));
        assert!(!b.starts_with(&a));
        assert!(prefix_end(&a) <= b || !b.starts_with(&a));
    }

    #[test]
    fn timer_keys_sort_by_deadline_then_kind() {
        let id = JobId(7);
        assert!(timer(5, TimerKind::Due, id) < timer(6, TimerKind::Expire, id));
        assert!(timer(5, TimerKind::Expire, id) < timer(5, TimerKind::Due, id));
        assert_eq!(parse_timer(&timer(9, TimerKind::Lease, id)), Some((9, TimerKind::Lease, id)));
    }

    #[test]
    fn prefixed_keys_are_their_prefix_then_the_queue() {
        // Stored keys: built in one allocation, they must stay byte for byte what they were.
        let q = QueueName::new("orders", "emails");
        assert_eq!(floor(&q), [b"floor/ready/".as_slice(), &queue(&q)].concat());
        assert_eq!(webhook(&q), [WEBHOOK_PREFIX, &queue(&q)].concat());
        assert_eq!(queue(&q), [&[6u8][..], b"orders", &[6], b"emails"].concat());
        let n = 0x0102_0304_0506_0708;
        assert_eq!(number(n), [NUMBER_PREFIX, &n.to_be_bytes()].concat());
        assert_eq!(schedule(&q, "daily"), [SCHEDULE_PREFIX, &queue(&q), b"daily"].concat());
        let due = [SCHEDULE_DUE_PREFIX, &n.to_be_bytes(), &queue(&q), b"daily"].concat();
        assert_eq!(schedule_due(n, &q, "daily"), due);
    }

    #[test]
    fn prefix_end_bounds_the_prefix() {
        assert_eq!(prefix_end(&[1, 2]), vec![1, 3]);
        assert_eq!(prefix_end(&[1, 255]), vec![2]);
        assert_eq!(prefix_end(&[255]), Vec::<u8>::new());
    }
}
