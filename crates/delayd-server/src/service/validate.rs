//! Every bound a client's request is held to, and the checks that need no state.
//!
//! The front ends decode syntax (a query string, a protobuf message) into plain values; the
//! meaning of those values — ranges, names, horizons, defaults — is checked here, once, for
//! every protocol. A request that fails a check writes nothing. Checks that need the state (a
//! lease, a job's state) are the state machine's and come back as rejections.

use std::collections::BTreeMap;
use std::time::Duration;

use delayd_core::{Due, JobId, NewJob, QueueName};

use crate::config::Config;
use crate::error::ServiceError;

/// Most attributes a job may carry.
pub const MAX_ATTRIBUTES: usize = 16;
/// Longest attribute name, in bytes.
pub const MAX_ATTRIBUTE_NAME_BYTES: usize = 64;
/// Longest attribute value, in bytes.
pub const MAX_ATTRIBUTE_VALUE_BYTES: usize = 1024;
/// Attributes delayd sets itself (such as a failed push's error) start with this.
pub const RESERVED_ATTRIBUTE_PREFIX: &str = "delayd-";
/// Longest client key, in bytes.
pub const MAX_KEY_BYTES: usize = 255;
/// Most jobs one respawn or purge may name (it runs in chunks of
/// [`delayd_core::limits::MAX_JOBS_PER_COMMAND`]).
pub const MAX_DEAD_LETTER_LIMIT: u32 = 10_000;
/// Most dead jobs one listing shows, and how many it shows by default.
pub const DEAD_JOBS_LIMIT: Limit = Limit { name: "limit", min: 1, default: 10, max: 1000 };
/// Most queues one listing shows, and how many it shows by default.
pub const QUEUES_LIMIT: Limit = Limit { name: "limit", min: 1, default: 1000, max: 10_000 };
/// Most jobs in one bulk publish.
pub const MAX_BULK: usize = 64;
/// Most jobs one reserve may take.
pub const MAX_RESERVE_COUNT: u32 = 100;
/// Longest long-poll.
pub const MAX_WAIT: Duration = Duration::from_secs(600);
/// A token's read or write rate limit, in requests per second on each node; 0: no limit. At
/// most a million: a typo of a few zeros should not pass as "no limit in practice".
pub const RATE_LIMIT: Limit = Limit { name: "rate limit", min: 0, default: 0, max: 1_000_000 };
/// Longest token description, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 1024;
/// A job's time to live when the publisher gives none (lmstfy's default), and a respawned
/// job's.
pub const DEFAULT_TTL_MS: u64 = 86_400_000;
/// A reservation's time to run when the publisher gives none (lmstfy's default).
pub const DEFAULT_TTR_MS: u64 = 120_000;
/// A job's priority when the publisher gives none: mid-range, so both more and less urgent
/// jobs can be published beside it.
pub const DEFAULT_PRIORITY: u32 = 1024;
/// Upper bounds of the due histogram of a queue's stats: 1 min, 5 min, 1 h, 1 day.
pub const HISTOGRAM_BOUNDS_MS: [u64; 4] = [60_000, 300_000, 3_600_000, 86_400_000];

/// How a job is to be published (everything but its body).
#[derive(Clone, Debug)]
pub struct PublishParams {
    /// When it becomes deliverable.
    pub due: Due,
    /// Time to live from publish; `None` never expires.
    pub ttl_ms: Option<u64>,
    /// Maximum deliveries, 1..=65535.
    pub tries: u16,
    /// Default time-to-run of its reservations.
    pub ttr_ms: u64,
    /// 0 is most urgent.
    pub priority: u32,
    /// Idempotency key.
    pub key: Option<String>,
    /// Attributes.
    pub attributes: BTreeMap<String, String>,
}

impl Default for PublishParams {
    fn default() -> Self {
        PublishParams {
            due: Due::After(0),
            ttl_ms: Some(DEFAULT_TTL_MS),
            tries: 1,
            ttr_ms: DEFAULT_TTR_MS,
            priority: DEFAULT_PRIORITY,
            key: None,
            attributes: BTreeMap::new(),
        }
    }
}

/// A count a client may give, with its bounds and default.
#[derive(Clone, Copy, Debug)]
pub struct Limit {
    /// The parameter's name, for the error.
    pub name: &'static str,
    /// Smallest accepted.
    pub min: u64,
    /// Used when none is given.
    pub default: u64,
    /// Largest accepted.
    pub max: u64,
}

impl Limit {
    /// `given`, or the default; refused outside `min..=max`.
    pub fn check(&self, given: Option<u64>) -> Result<u64, ServiceError> {
        let n = given.unwrap_or(self.default);
        if (self.min..=self.max).contains(&n) {
            Ok(n)
        } else {
            Err(ServiceError::bad_request(format!(
                "invalid {} {n}: expected {} to {}",
                self.name, self.min, self.max
            )))
        }
    }
}

/// Checks a namespace or queue name: `^[-_A-Za-z0-9]{1,255}$`; queue names starting with `_`
/// are reserved.
pub fn check_name(kind: &str, name: &str) -> Result<(), ServiceError> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !ok {
        return Err(ServiceError::bad_request(format!(
            "invalid {kind} name {name:?}: use 1-255 characters of A-Z a-z 0-9 - _"
        )));
    }
    if kind == "queue" && name.starts_with('_') {
        return Err(ServiceError::bad_request(format!(
            "queue names starting with '_' are reserved: {name:?}"
        )));
    }
    Ok(())
}

/// Builds a checked queue name.
pub fn queue_name(namespace: &str, queue: &str) -> Result<QueueName, ServiceError> {
    check_name("namespace", namespace)?;
    check_name("queue", queue)?;
    Ok(QueueName::new(namespace, queue))
}

/// Checked queue names of one namespace, in the order given.
pub fn queue_names<'a>(
    namespace: &str,
    queues: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<QueueName>, ServiceError> {
    let queues = queues.into_iter().map(|q| queue_name(namespace, q)).collect::<Result<_, _>>()?;
    Ok(queues)
}

/// Parses a job id.
pub fn job_id(s: &str) -> Result<JobId, ServiceError> {
    s.parse().map_err(|_| ServiceError::bad_request(format!("invalid job id {s:?}")))
}

/// Checks a cluster member's id: Raft ids start at 1.
pub fn node_id(id: u64) -> Result<u64, ServiceError> {
    if id == 0 {
        return Err(ServiceError::bad_request("invalid node id 0: ids start at 1"));
    }
    Ok(id)
}

/// A reservation's time to run, given in whole seconds (lmstfy's `ttr`) or in ms (`ttr_ms`),
/// at most one of them; `None` when neither is given (each job's own ttr applies).
pub fn ttr(secs: Option<u32>, ms: Option<u64>) -> Result<Option<u64>, ServiceError> {
    let ttr_ms = match (secs, ms) {
        (Some(_), Some(_)) => {
            return Err(ServiceError::bad_request("give only one of ttr and ttr_ms"))
        }
        (Some(s), None) => Some(u64::from(s) * 1000),
        (None, ms) => ms,
    };
    if ttr_ms == Some(0) {
        return Err(ServiceError::bad_request("ttr must be positive"));
    }
    Ok(ttr_ms)
}

/// A ttl as clients give it (ms): absent takes the default of a day, 0 never expires.
pub fn ttl(given: Option<u64>) -> Option<u64> {
    match given {
        None => Some(DEFAULT_TTL_MS),
        Some(0) => None,
        Some(ms) => Some(ms),
    }
}

/// A due time given as a delay in whole seconds (lmstfy's `delay`), a delay in ms
/// (`delay_ms`) or an absolute unix time in ms (`at`), at most one of them.
pub fn due(
    delay_secs: Option<u32>,
    delay_ms: Option<u64>,
    at_ms: Option<u64>,
) -> Result<Option<Due>, ServiceError> {
    match (delay_secs, delay_ms, at_ms) {
        (None, None, None) => Ok(None),
        (Some(s), None, None) => Ok(Some(Due::After(u64::from(s) * 1000))),
        (None, Some(ms), None) => Ok(Some(Due::After(ms))),
        (None, None, Some(at)) => Ok(Some(Due::At(at))),
        _ => Err(ServiceError::bad_request("give only one of delay, delay_ms and at")),
    }
}

/// The bounds that depend on the node's configuration.
pub(crate) struct Checks<'a> {
    pub(crate) config: &'a Config,
    /// The node's clock, read only for absolute due times.
    pub(crate) clock: &'a delayd_raft::clock::Clock,
}

impl Checks<'_> {
    /// Refuses a duration a client gave (`name`, in ms) that reaches past the configured
    /// horizon. Every relative time a client sends passes here before it is proposed, so no
    /// deadline the state machine computes from it comes near overflowing.
    pub(crate) fn horizon(&self, name: &str, ms: u64) -> Result<(), ServiceError> {
        let horizon = self.config.max_horizon;
        if u128::from(ms) > horizon.as_millis() {
            return Err(ServiceError::bad_request(format!(
                "{name} is beyond the maximum horizon of {} s (max_horizon_s)",
                horizon.as_secs()
            )));
        }
        Ok(())
    }

    /// Checks a due time against the horizon; returns its delay from now in ms.
    pub(crate) fn due(&self, due: Due) -> Result<u64, ServiceError> {
        match due {
            Due::After(delay) => self.horizon("delay", delay).map(|()| delay),
            Due::At(at) => {
                let delay = at.saturating_sub(self.clock.now_ms());
                self.horizon("at", delay).map(|()| delay)
            }
        }
    }

    /// A job body within `max_body_bytes`.
    pub(crate) fn body(&self, body: &[u8]) -> Result<(), ServiceError> {
        let limit = self.config.max_body_bytes;
        if body.len() > limit {
            return Err(ServiceError::TooLarge(format!(
                "body is larger than the limit of {limit} bytes (max_body_bytes)"
            )));
        }
        Ok(())
    }

    /// Everything about a publish but the bodies.
    pub(crate) fn publish(&self, p: &PublishParams) -> Result<(), ServiceError> {
        if p.tries == 0 {
            return Err(ServiceError::bad_request("tries must be at least 1"));
        }
        if p.attributes.len() > MAX_ATTRIBUTES {
            return Err(ServiceError::bad_request(format!(
                "at most {MAX_ATTRIBUTES} attributes per job"
            )));
        }
        for (name, value) in &p.attributes {
            if name.starts_with(RESERVED_ATTRIBUTE_PREFIX) {
                return Err(ServiceError::bad_request(format!(
                    "attribute {name}: names starting with {RESERVED_ATTRIBUTE_PREFIX:?} are \
                     reserved"
                )));
            }
            if name.is_empty() || name.len() > MAX_ATTRIBUTE_NAME_BYTES {
                return Err(ServiceError::bad_request(format!(
                    "attribute names are 1 to {MAX_ATTRIBUTE_NAME_BYTES} bytes"
                )));
            }
            if value.len() > MAX_ATTRIBUTE_VALUE_BYTES {
                return Err(ServiceError::bad_request(format!(
                    "attribute {name} is longer than {MAX_ATTRIBUTE_VALUE_BYTES} bytes"
                )));
            }
        }
        if let Some(key) = &p.key {
            if key.is_empty() || key.len() > MAX_KEY_BYTES {
                return Err(ServiceError::bad_request(format!(
                    "key must be 1 to {MAX_KEY_BYTES} bytes"
                )));
            }
        }
        let delay = self.due(p.due)?;
        self.horizon("ttr", p.ttr_ms)?;
        if p.ttr_ms == 0 {
            return Err(ServiceError::bad_request("ttr must be positive"));
        }
        if let Some(ttl) = p.ttl_ms {
            self.horizon("ttl", ttl)?;
            // A ttl that ends when the job becomes due would remove it instead of delivering
            // it; refused rather than accepted and silently lost.
            if ttl <= delay {
                return Err(ServiceError::bad_request(
                    "ttl must be longer than delay: the job would expire before it is delivered",
                ));
            }
        }
        Ok(())
    }
}

/// A new job from checked parameters, with a fresh id: drawn here, not in the state machine,
/// like every other non-deterministic value.
pub(crate) fn new_job(p: &PublishParams, body: Vec<u8>) -> NewJob {
    NewJob {
        id: JobId(ulid::Ulid::new().0),
        key: p.key.clone(),
        body,
        attributes: p.attributes.clone(),
        due: p.due,
        ttl_ms: p.ttl_ms,
        tries: p.tries,
        ttr_ms: p.ttr_ms,
        priority: p.priority,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttr_and_due_take_one_spelling() {
        assert_eq!(ttr(Some(2), None), Ok(Some(2000)));
        assert_eq!(ttr(None, Some(5)), Ok(Some(5)));
        assert_eq!(ttr(None, None), Ok(None));
        assert!(ttr(Some(1), Some(1)).is_err());
        assert!(ttr(Some(0), None).is_err() && ttr(None, Some(0)).is_err());
        assert_eq!(due(Some(1), None, None), Ok(Some(Due::After(1000))));
        assert_eq!(due(None, None, Some(7)), Ok(Some(Due::At(7))));
        assert!(due(Some(1), None, Some(7)).is_err());
    }

    #[test]
    fn limits_name_their_bounds() {
        assert_eq!(DEAD_JOBS_LIMIT.check(None), Ok(10));
        let e = DEAD_JOBS_LIMIT.check(Some(1001)).expect_err("over");
        assert_eq!(e.to_string(), "invalid limit 1001: expected 1 to 1000");
    }
}
