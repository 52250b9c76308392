//! Push delivery's settings: a queue's webhook, set, shown and removed through the log, and
//! the failures the dispatcher (`push.rs`) reports.
//!
//! A queue with a webhook is still an ordinary queue: the leader's dispatcher reserves its
//! due jobs like any consumer and POSTs them; pull consumers may reserve from it too.

use delayd_core::{query, Command, JobId, QueueName, Reply, Webhook};

use super::auth::{new_secret, Access, Principal, Scope};
use super::validate::Limit;
use super::{unexpected, Service};
use crate::error::ServiceError;

/// A request's time limit: 1 ms to a minute, 10 s by default.
pub const TIMEOUT_MS: Limit = Limit { name: "timeout_ms", min: 1, default: 10_000, max: 60_000 };
/// Requests in flight per queue: 1 to 1000, 32 by default.
pub const MAX_IN_FLIGHT: Limit = Limit { name: "max_in_flight", min: 1, default: 32, max: 1000 };
/// Requests started per second: 0 (no limit) to 100,000.
pub const RATE_PER_S: Limit = Limit { name: "rate_per_s", min: 0, default: 0, max: 100_000 };
/// The first retry's backoff ceiling: 1 ms to an hour, 1 s by default.
pub const BACKOFF_INITIAL_MS: Limit =
    Limit { name: "backoff_initial_ms", min: 1, default: 1000, max: 3_600_000 };
/// The largest backoff: up to a day, 5 min by default; never below the initial one.
pub const BACKOFF_MAX_MS: Limit =
    Limit { name: "backoff_max_ms", min: 1, default: 300_000, max: 86_400_000 };
/// A secret's length in bytes, when the caller chooses it.
const SECRET_BYTES: (usize, usize) = (16, 256);
/// Longest URL accepted.
const MAX_URL_BYTES: usize = 2048;

/// A webhook as a client asks for it: anything absent takes its default.
#[derive(Clone, Debug, Default)]
pub struct WebhookRequest {
    /// Where to POST: an `http` or `https` URL.
    pub url: String,
    /// See [`TIMEOUT_MS`].
    pub timeout_ms: Option<u64>,
    /// See [`MAX_IN_FLIGHT`].
    pub max_in_flight: Option<u64>,
    /// See [`RATE_PER_S`].
    pub rate_per_s: Option<u64>,
    /// See [`BACKOFF_INITIAL_MS`].
    pub backoff_initial_ms: Option<u64>,
    /// See [`BACKOFF_MAX_MS`].
    pub backoff_max_ms: Option<u64>,
    /// The signing key; generated when absent.
    pub secret: Option<String>,
}

/// A webhook that was set, and whether it replaced one.
#[derive(Clone, Debug)]
pub struct WebhookSet {
    /// The webhook, secret included: the only time it is shown.
    pub webhook: Webhook,
    /// Whether the queue had one before.
    pub replaced: bool,
}

fn narrow(n: u64) -> u32 {
    // Every bound above is far below u32::MAX.
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Checks a webhook request and fills in its defaults.
fn checked(r: WebhookRequest) -> Result<Webhook, ServiceError> {
    if r.url.len() > MAX_URL_BYTES {
        return Err(ServiceError::bad_request(format!("url is longer than {MAX_URL_BYTES} bytes")));
    }
    let url = url::Url::parse(&r.url)
        .map_err(|e| ServiceError::bad_request(format!("invalid url {:?}: {e}", r.url)))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(ServiceError::bad_request(format!(
            "invalid url {:?}: only http and https URLs with a host",
            r.url
        )));
    }
    let backoff_initial_ms = BACKOFF_INITIAL_MS.check(r.backoff_initial_ms)?;
    let backoff_max_ms = BACKOFF_MAX_MS.check(r.backoff_max_ms)?;
    if backoff_max_ms < backoff_initial_ms {
        return Err(ServiceError::bad_request(
            "backoff_max_ms must be at least backoff_initial_ms",
        ));
    }
    let secret = match r.secret {
        None => new_secret(),
        Some(s) => {
            let (min, max) = SECRET_BYTES;
            if s.len() < min || s.len() > max || !s.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ServiceError::bad_request(format!(
                    "secret must be {min} to {max} visible ASCII characters"
                )));
            }
            s
        }
    };
    Ok(Webhook {
        url: r.url,
        timeout_ms: TIMEOUT_MS.check(r.timeout_ms)?,
        max_in_flight: narrow(MAX_IN_FLIGHT.check(r.max_in_flight)?),
        rate_per_s: narrow(RATE_PER_S.check(r.rate_per_s)?),
        backoff_initial_ms,
        backoff_max_ms,
        secret,
    })
}

impl Service {
    /// Sets `queue`'s webhook: from now on the leader POSTs its due jobs there. `request`
    /// decodes the front end's message, and runs only once the caller is authorized.
    pub async fn set_webhook(
        &self,
        caller: &Principal,
        queue: QueueName,
        request: impl FnOnce() -> Result<WebhookRequest, ServiceError>,
    ) -> Result<WebhookSet, ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        let webhook = checked(request()?)?;
        let command = Command::SetWebhook { queue: queue.clone(), webhook: webhook.clone() };
        match self.write_one(command).await? {
            Reply::Replaced(replaced) => {
                tracing::info!(%queue, url = %webhook.url, replaced, "webhook set");
                Ok(WebhookSet { webhook, replaced })
            }
            r => Err(unexpected(r)),
        }
    }

    /// `queue`'s webhook, if it has one.
    pub async fn webhook(
        &self,
        caller: &Principal,
        queue: &QueueName,
        stale: bool,
    ) -> Result<Option<Webhook>, ServiceError> {
        self.authorize(caller, Scope::queue(queue, Access::Read))?;
        self.read(stale, |v| query::webhook(v, queue)).await
    }

    /// Removes `queue`'s webhook: the queue is pull-only again. `NotFound` when it had none.
    pub async fn delete_webhook(
        &self,
        caller: &Principal,
        queue: QueueName,
    ) -> Result<(), ServiceError> {
        self.authorize(caller, Scope::queue(&queue, Access::Write))?;
        match self.write_one(Command::DeleteWebhook { queue: queue.clone() }).await? {
            Reply::Removed(true) => {
                tracing::info!(%queue, "webhook removed");
                Ok(())
            }
            Reply::Removed(false) => {
                Err(ServiceError::NotFound(format!("queue {queue} has no webhook")))
            }
            r => Err(unexpected(r)),
        }
    }

    /// Every queue with a webhook, from this replica's state (the leader's is current).
    pub(crate) async fn webhooks(&self) -> Result<Vec<(QueueName, Webhook)>, ServiceError> {
        self.read(true, |v| query::webhooks(v)).await
    }

    /// Reports a failed push of a job the dispatcher holds under `lease`: recorded on the
    /// job, which comes back after `delay_ms` or, out of tries, goes to the dead letter.
    pub(crate) async fn fail(
        &self,
        queue: QueueName,
        id: JobId,
        lease: u64,
        error: String,
        delay_ms: u64,
    ) -> Result<(), ServiceError> {
        let command = Command::Fail { queue, id, lease: Some(lease), error, delay_ms };
        self.write_one(command).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(url: &str) -> WebhookRequest {
        WebhookRequest { url: url.into(), ..WebhookRequest::default() }
    }

    #[test]
    fn webhooks_take_defaults_and_refuse_what_cannot_work() {
        let w = checked(request("http://receiver:8080/jobs")).expect("valid");
        assert_eq!((w.timeout_ms, w.max_in_flight, w.rate_per_s), (10_000, 32, 0));
        assert_eq!((w.backoff_initial_ms, w.backoff_max_ms), (1000, 300_000));
        assert_eq!(w.secret.len(), 32, "a generated secret");
        for (r, needle) in [
            (request("ftp://x/"), "only http and https"),
            (request("not a url"), "invalid url"),
            (WebhookRequest { timeout_ms: Some(0), ..request("http://x/") }, "timeout_ms"),
            (
                WebhookRequest {
                    backoff_initial_ms: Some(5000),
                    backoff_max_ms: Some(10),
                    ..request("http://x/")
                },
                "backoff_max_ms must be at least",
            ),
            (WebhookRequest { secret: Some("short".into()), ..request("http://x/") }, "secret"),
        ] {
            let e = checked(r).expect_err("refused").to_string();
            assert!(e.contains(needle), "{e:?} does not name {needle:?}");
        }
    }
}
