//! Versioned value encodings: one version byte, then postcard.
//!
//! The version byte lets a later release read what an earlier one wrote (and refuse what it
//! cannot read) instead of misreading it.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::kv::KvError;

/// The encoding version this build writes.
pub const VERSION: u8 = 1;

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

/// Decodes a value written by [`encode`].
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, KvError> {
    match bytes.split_first() {
        Some((&VERSION, rest)) => {
            postcard::from_bytes(rest).map_err(|e| KvError(format!("corrupt value: {e}")))
        }
        Some((v, _)) => Err(KvError(format!("unknown encoding version {v}"))),
        None => Err(KvError("empty value".into())),
    }
}
