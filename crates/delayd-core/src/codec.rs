//! Versioned value encodings: one version byte, then postcard.
//!
//! The version byte lets a later release read what an earlier one wrote (and refuse what it
//! cannot read) instead of misreading it.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::kv::KvError;

/// The encoding version this build writes.
///
/// - 1: the first layout.
/// - 2: a [`Job`](crate::Job) record ends with its counters and number. Every other value is laid out as
///   in version 1, so both versions decode (jobs through [`decode_job`]); a build that only
///   knows version 1 refuses version 2 values instead of misreading them.
pub const VERSION: u8 = 2;

/// Encodes a value with the current version byte.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Most values the state machine stores (queue metadata, key records, log ids) fit: a
    // buffer that starts at one byte grows three or four times on the way.
    encode_sized(value, SMALL_VALUE_BYTES)
}

/// The buffer [`encode`] starts with.
const SMALL_VALUE_BYTES: usize = 64;

/// Most bytes a job record takes besides its strings and attributes: the version byte, the
/// fixed fields as postcard varints at their longest (about 170 bytes) and the length
/// prefixes of the queue's names, the key, the body and the attribute count.
const JOB_RECORD_FIXED_BYTES: usize = 192;

/// Most bytes of the two length prefixes of one attribute.
const ATTRIBUTE_PREFIX_BYTES: usize = 10;

/// Encodes a job record into one buffer sized for it: a record goes through apply's
/// hottest path (every publish, reserve and release writes one), and a buffer grown from
/// one byte grew about five times for a 100-byte body (callgrind: some 1,100 instructions a
/// record).
pub fn encode_job(job: &crate::Job) -> Vec<u8> {
    let strings = job.payload_bytes() + job.queue.namespace.len() + job.queue.queue.len();
    let prefixes = ATTRIBUTE_PREFIX_BYTES * job.attributes.len();
    encode_sized(job, JOB_RECORD_FIXED_BYTES + strings + prefixes)
}

/// [`encode`] into a buffer that starts with room for `capacity` bytes: for values whose
/// size the caller can tell in advance (a log entry, a replication request), which would
/// otherwise be copied into a buffer twice as large a dozen times on the way to tens of
/// kilobytes.
pub fn encode_sized<T: Serialize>(value: &T, capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity);
    out.push(VERSION);
    encode_more(value, out)
}

/// Appends `value`'s postcard encoding to `out`, without a version byte: for a value written
/// in parts (an [`encode`]d message assembled from pieces some of which were encoded before).
pub fn encode_more<T: Serialize>(value: &T, out: Vec<u8>) -> Vec<u8> {
    // postcard only fails for types serde cannot describe (none of ours) or a full buffer
    // (impossible with a Vec), so this is a programming error if it ever happens.
    match postcard::to_extend(value, out) {
        Ok(v) => v,
        Err(e) => panic!("postcard cannot encode a delayd value: {e}"),
    }
}

/// Decodes a value written by [`encode`] (for a job record, use [`decode_job`]).
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, KvError> {
    match bytes.split_first() {
        Some((1 | 2, rest)) => from_postcard(rest),
        Some((v, _)) => Err(KvError(format!("unknown encoding version {v}"))),
        None => Err(KvError("empty value".into())),
    }
}

/// Decodes a stored job record of any version. A version 1 record predates job numbers and
/// counters: it decodes with zero counters and number 0, which the state machine replaces
/// with a number the next time the job changes.
pub fn decode_job(bytes: &[u8]) -> Result<crate::Job, KvError> {
    // What version 2 appended: four counters and the number, postcard varints, each one
    // 0 byte when zero. Appended to a version 1 record, they make the version 2 record of
    // the same job.
    const ZEROS_ADDED_BY_VERSION_2: [u8; 5] = [0; 5];
    match bytes.split_first() {
        Some((1, rest)) => from_postcard(&[rest, &ZEROS_ADDED_BY_VERSION_2].concat()),
        _ => decode(bytes),
    }
}

/// Decodes only the queue of a stored job record (of any version), without decoding the rest
/// (its body above all): a record starts with the job's id and queue.
pub fn decode_job_queue(bytes: &[u8]) -> Result<crate::QueueName, KvError> {
    #[derive(serde::Deserialize)]
    struct Head {
        _id: crate::JobId,
        queue: crate::QueueName,
    }
    match bytes.split_first() {
        // postcard reads a prefix and ignores the rest of the record.
        Some((1 | 2, rest)) => from_postcard::<Head>(rest).map(|h| h.queue),
        Some((v, _)) => Err(KvError(format!("unknown encoding version {v}"))),
        None => Err(KvError("empty value".into())),
    }
}

/// Decodes a value from the front of `bytes` (postcard, no version byte) and returns it with
/// the bytes after it: for a message read in parts ([`encode_more`]'s counterpart).
pub fn take<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, &[u8]), KvError> {
    postcard::take_from_bytes(bytes).map_err(|e| KvError(format!("corrupt value: {e}")))
}

fn from_postcard<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, KvError> {
    postcard::from_bytes(bytes).map_err(|e| KvError(format!("corrupt value: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Job, JobCounters, JobId, JobState, Lease, QueueName};

    /// A job with every field at its longest encoding.
    fn widest_job(body: usize, attributes: usize) -> Job {
        Job {
            id: JobId(u128::MAX),
            queue: QueueName::new("n".repeat(200), "q".repeat(200)),
            key: Some("k".repeat(300)),
            body: vec![0xff; body],
            attributes: (0..attributes).map(|i| (format!("a{i}"), "v".repeat(i % 7))).collect(),
            state: JobState::Reserved,
            priority: u32::MAX,
            created_ms: u64::MAX,
            due_ms: u64::MAX,
            expires_ms: Some(u64::MAX),
            tries: u16::MAX,
            attempts: u16::MAX,
            ttr_ms: u64::MAX,
            lease: Some(Lease { token: u64::MAX, deadline_ms: u64::MAX, ttr_ms: u64::MAX }),
            seq: u64::MAX,
            counters: JobCounters {
                timeouts: u32::MAX,
                releases: u32::MAX,
                buries: u32::MAX,
                kicks: u32::MAX,
            },
            number: u64::MAX,
        }
    }

    #[test]
    fn a_job_record_is_encoded_as_any_value_into_a_buffer_that_never_grows() {
        for (body, attributes) in [(0, 0), (100, 0), (100, 3), (70_000, 40), (0, 1_000)] {
            let job = widest_job(body, attributes);
            let record = encode_job(&job);
            assert_eq!(record, encode(&job), "body {body}, {attributes} attributes");
            let fits = JOB_RECORD_FIXED_BYTES
                + job.payload_bytes()
                + job.queue.namespace.len()
                + job.queue.queue.len()
                + ATTRIBUTE_PREFIX_BYTES * attributes;
            assert!(record.len() <= fits, "{} > {fits}", record.len());
            assert_eq!(decode_job(&record).expect("decodes"), job);
        }
    }
}
