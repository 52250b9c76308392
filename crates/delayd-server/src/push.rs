//! # Push delivery: the leader POSTs due jobs of queues that have a webhook
//!
//! The dispatcher runs on every node and works only while the node leads, like the timer
//! pump. For each queue with a webhook it runs one worker, which is an ordinary consumer of
//! the service: it reserves due jobs (ttr = the webhook's timeout plus [`TTR_MARGIN_MS`]) up
//! to the webhook's `max_in_flight` and `rate_per_s`, and POSTs each one:
//!
//! - the body as it is, with `Delayd-Job-Id`, `Delayd-Namespace`, `Delayd-Queue`,
//!   `Delayd-Attempt`, `Delayd-Remain-Tries`, `Delayd-Due-At-Ms`, the job's attributes as
//!   `Job-Attr-{name}`, and `Delayd-Signature: sha256=<hex>`, the HMAC-SHA256 of
//!   `{job_id}.{due_at_ms}.{body}` keyed by the webhook's secret;
//! - a 2xx answer acks the job; anything else (another status, the timeout, no connection)
//!   fails it ([`delayd_core::Command::Fail`]): it comes back after a backoff with full jitter
//!   (a random delay up to `backoff_initial_ms · 2^(attempt-1)`, capped by `backoff_max_ms`;
//!   a `Retry-After` in seconds is honoured up to the cap) while tries remain, and goes to the
//!   dead letter with the error after its last.
//!
//! Guarantees come from the replicated reserve: a job is posted only once it is due (only
//! ready jobs are reserved), and at least once across failover — a job the old leader was
//! posting comes back when its lease runs out, and the new leader's dispatcher posts it.
//! Receivers must therefore tolerate duplicates (the job id identifies one).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use delayd_core::{Delivery, QueueName, Webhook};
use delayd_raft::cluster::{until_leading, ServerWatch};
use hmac::{Hmac, Mac};
use openraft::async_runtime::watch::WatchReceiver;
use openraft::ServerState;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use sha2::Sha256;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::rate::Bucket;
use crate::service::reserve::{ReserveOrder, ReserveRequest};
use crate::service::validate::{MAX_RESERVE_COUNT, RESERVED_ATTRIBUTE_PREFIX};
use crate::service::{Principal, Service};

/// A dispatcher's reservation outlasts its request's timeout by this much, so the lease never
/// runs out while the answer is still on its way.
pub const TTR_MARGIN_MS: u64 = 5_000;
/// How long one reserve of a worker waits for a due job before it asks again.
const POLL: Duration = Duration::from_secs(30);
/// How long a worker pauses after a reserve failed (the cluster is changing leaders).
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// The longest error text recorded on a job.
const MAX_ERROR_BYTES: usize = 512;
/// How soon the webhooks are read again after a read failed.
const WEBHOOKS_RETRY: Duration = Duration::from_secs(1);

/// The dispatcher: runs until the node's Raft stops.
pub(crate) async fn run(service: Service) {
    let client =
        match reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build() {
            Ok(client) => client,
            Err(e) => {
                tracing::error!(error = %e, "no HTTP client: webhooks will not be called");
                return;
            }
        };
    let mut raft = service.raft_watch();
    while until_leading(&mut raft).await {
        lead(&service, &client, &mut raft).await;
    }
}

/// While this node leads: one worker per queue with a webhook, restarted when its webhook
/// changes, all stopped when leadership goes.
async fn lead(service: &Service, client: &reqwest::Client, raft: &mut ServerWatch) {
    let mut workers: HashMap<QueueName, (Webhook, JoinHandle<()>)> = HashMap::new();
    loop {
        let read = service.webhooks().await;
        let failed = read.is_err();
        match read {
            Ok(hooks) => {
                let hooks: HashMap<QueueName, Webhook> = hooks.into_iter().collect();
                workers.retain(|queue, (hook, task)| {
                    let keep = hooks.get(queue) == Some(hook);
                    if !keep {
                        task.abort();
                    }
                    keep
                });
                for (queue, hook) in hooks {
                    if let std::collections::hash_map::Entry::Vacant(slot) =
                        workers.entry(queue.clone())
                    {
                        let task = tokio::spawn(serve_queue(
                            service.clone(),
                            client.clone(),
                            queue,
                            Arc::new(hook.clone()),
                        ));
                        slot.insert((hook, task));
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the webhooks"),
        }
        tokio::select! {
            _ = service.webhook_changes().notified() => {}
            // Nothing else would try the read again until a webhook or the role changes.
            _ = tokio::time::sleep(WEBHOOKS_RETRY), if failed => {}
            _ = raft.wait_until(|m| m.state != ServerState::Leader) => break,
        }
    }
    for (_, (_, task)) in workers {
        // Requests already sent finish on their own tasks; their jobs are acked or failed
        // through the new leader, or come back when their leases run out.
        task.abort();
    }
}

/// One queue's worker: reserves what its budget allows and posts each job on a task of its
/// own.
async fn serve_queue(
    service: Service,
    client: reqwest::Client,
    queue: QueueName,
    hook: Arc<Webhook>,
) {
    let slots = Arc::new(Semaphore::new(hook.max_in_flight as usize));
    let mut rate = Bucket::default();
    let ttr_ms = hook.timeout_ms.saturating_add(TTR_MARGIN_MS);
    loop {
        let Ok(first) = slots.clone().acquire_owned().await else { return };
        let mut permits = vec![first];
        while permits.len() < MAX_RESERVE_COUNT as usize {
            match slots.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        let allowed = take_rate(&mut rate, hook.rate_per_s, permits.len()).await;
        permits.truncate(allowed);
        let request = ReserveRequest {
            queues: vec![queue.clone()],
            count: u32::try_from(permits.len()).unwrap_or(1),
            ttr_ms: Some(ttr_ms),
            wait: POLL,
            acks: Vec::new(),
            order: ReserveOrder::QueueOrder,
        };
        match service.reserve(&Principal::Admin, request).await {
            // A stopping node's reserves come back at once: pause rather than spin until the
            // hand-over ends this worker.
            Ok(got) if got.deliveries.is_empty() && service.is_draining() => {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Ok(got) => {
                let unused = permits.len().saturating_sub(got.deliveries.len());
                rate.give_back(unused, hook.rate_per_s);
                for (delivery, permit) in got.deliveries.into_iter().zip(permits) {
                    let (service, client, hook) = (service.clone(), client.clone(), hook.clone());
                    tokio::spawn(post(service, client, hook, delivery, permit));
                }
            }
            Err(e) => {
                tracing::debug!(%queue, error = %e, "webhook worker cannot reserve");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}

/// Takes up to `want` requests from a webhook's `rate_per_s` (0: no limit), waiting until at
/// least one is in the budget.
async fn take_rate(bucket: &mut Bucket, per_s: u32, want: usize) -> usize {
    if per_s == 0 {
        return want;
    }
    loop {
        let n = bucket.take_up_to(want, per_s, Instant::now());
        if n > 0 {
            return n;
        }
        tokio::time::sleep(bucket.until_one(per_s)).await;
    }
}

/// The signature of a request: hex HMAC-SHA256 of `{job_id}.{due_at_ms}.{body}`, keyed by
/// the webhook's secret.
pub fn signature(secret: &str, job_id: &str, due_at_ms: u64, body: &[u8]) -> String {
    let mut message = format!("{job_id}.{due_at_ms}.").into_bytes();
    message.extend_from_slice(body);
    hmac_sha256_hex(secret.as_bytes(), &message)
}

fn hmac_sha256_hex(key: &[u8], message: &[u8]) -> String {
    // HMAC takes a key of any length, so this never fails.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else { return String::new() };
    mac.update(message);
    mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

/// The request's headers.
fn headers(hook: &Webhook, d: &Delivery) -> HeaderMap {
    let job = &d.job;
    let id = job.id.to_string();
    let mut h = HeaderMap::new();
    let mut put = |name: &str, value: String| {
        match (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(&value)) {
            (Ok(n), Ok(v)) => {
                h.insert(n, v);
            }
            // An attribute set through gRPC may not fit an HTTP header: left out.
            _ => tracing::debug!(header = name, "not a valid header; left out"),
        }
    };
    put("content-type", "application/octet-stream".into());
    put("delayd-job-id", id.clone());
    put("delayd-namespace", job.queue.namespace.clone());
    put("delayd-queue", job.queue.queue.clone());
    put("delayd-attempt", job.attempts.to_string());
    put("delayd-remain-tries", job.remain_tries().to_string());
    put("delayd-due-at-ms", job.due_ms.to_string());
    for (name, value) in &job.attributes {
        if !name.starts_with(RESERVED_ATTRIBUTE_PREFIX) {
            put(&format!("job-attr-{name}"), value.clone());
        }
    }
    let sig = signature(&hook.secret, &id, job.due_ms, &job.body);
    put("delayd-signature", format!("sha256={sig}"));
    h
}

/// How long a failed job waits before its next try: full jitter under an exponential
/// ceiling, or the receiver's `Retry-After`, both capped by `backoff_max_ms`.
fn backoff(hook: &Webhook, attempt: u16, retry_after_ms: Option<u64>) -> u64 {
    if let Some(ms) = retry_after_ms {
        return ms.min(hook.backoff_max_ms);
    }
    let doublings = u32::from(attempt.saturating_sub(1)).min(40);
    let ceiling =
        hook.backoff_initial_ms.saturating_mul(1u64 << doublings).min(hook.backoff_max_ms);
    rand::random_range(0..=ceiling)
}

/// `Retry-After` in whole seconds, as ms (an HTTP date is not honoured).
fn retry_after(h: &HeaderMap) -> Option<u64> {
    let secs: u64 = h.get(RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Some(secs.saturating_mul(1000))
}

/// Why a request got no answer, with its causes (reqwest's own message is often just
/// "error sending request").
fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    if text.len() > MAX_ERROR_BYTES {
        let mut end = MAX_ERROR_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// Posts one job and acks or fails it by the answer.
async fn post(
    service: Service,
    client: reqwest::Client,
    hook: Arc<Webhook>,
    d: Delivery,
    _slot: OwnedSemaphorePermit,
) {
    let queue = d.job.queue.clone();
    let metrics = service.metrics().clone();
    metrics.webhook_sent(&queue, service.now_ms().saturating_sub(d.job.due_ms));
    let started = Instant::now();
    let sent = client
        .post(&hook.url)
        .timeout(Duration::from_millis(hook.timeout_ms))
        .headers(headers(&hook, &d))
        .body(d.job.body.clone())
        .send()
        .await;
    let (outcome, failure) = match sent {
        Ok(answer) if answer.status().is_success() => ("ok", None),
        Ok(answer) => {
            let error = format!("HTTP {}", answer.status().as_u16());
            ("status", Some((error, retry_after(answer.headers()))))
        }
        Err(e) if e.is_timeout() => {
            ("timeout", Some((format!("no answer within {} ms", hook.timeout_ms), None)))
        }
        Err(e) => ("error", Some((describe(&e), None))),
    };
    metrics.webhook_done(&queue, outcome, started.elapsed());
    let (id, lease) = (d.job.id, d.lease);
    let settled = match failure {
        None => service.ack(&Principal::Admin, queue.clone(), id, Some(lease)).await.map(|_| ()),
        Some((error, retry_after_ms)) => {
            let delay = backoff(&hook, d.job.attempts, retry_after_ms);
            tracing::debug!(%queue, job = %id, %error, delay_ms = delay, "webhook failed");
            service.fail(queue.clone(), id, lease, error, delay).await
        }
    };
    if let Err(e) = settled {
        // The lease runs out and the job comes back: at least once, never lost.
        tracing::warn!(%queue, job = %id, error = %e, "cannot settle a pushed job");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_cap_and_honours_retry_after() {
        let hook = Webhook { backoff_initial_ms: 100, backoff_max_ms: 1000, ..Webhook::default() };
        for _ in 0..100 {
            assert!(backoff(&hook, 1, None) <= 100);
            assert!(backoff(&hook, 3, None) <= 400);
            assert!(backoff(&hook, 60, None) <= 1000);
        }
        assert_eq!(backoff(&hook, 1, Some(300)), 300);
        assert_eq!(backoff(&hook, 1, Some(60_000)), 1000, "capped");
    }

    #[test]
    fn signatures_are_hmac_sha256_of_id_due_and_body() {
        // RFC 4231, test case 2.
        assert_eq!(
            hmac_sha256_hex(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(signature("k", "01J", 5, b"body"), hmac_sha256_hex(b"k", b"01J.5.body"));
    }
}
