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
    let out = vec![VERSION];
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

fn from_postcard<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, KvError> {
    postcard::from_bytes(bytes).map_err(|e| KvError(format!("corrupt value: {e}")))
}
