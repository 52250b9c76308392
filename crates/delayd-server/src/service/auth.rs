//! Who may do what: the admin token, namespace tokens (lmstfy's model) and their rate limits.
//!
//! A caller shows one credential; the front end finds it (an HTTP header or `?token=`, gRPC
//! metadata) and [`Service::authenticate`] turns it into a [`Principal`]:
//! - the **admin token** from the node's configuration opens everything: the admin API, the
//!   token API, `/metrics` and every namespace's data plane. Tokens listed in
//!   `previous_admin_tokens` open the same, so the admin token can be rotated node by node
//!   while clients move to the new one. Nodes do not authenticate each other with it: they
//!   show the separate `cluster_secret` (the admin token only when that is not set);
//! - a **namespace token**, created through the token API and kept in the replicated state
//!   (so every node agrees on it), opens the data plane of its namespace only, within its
//!   optional per-node read and write rate limits.
//!
//! Every operation of the service then decides, itself, what it needs ([`Scope`]) and calls
//! [`Service::authorize`] before it looks at its arguments — so the decision is made once, in
//! one place, whatever protocol the request came by. No credential or an unknown one is
//! `Unauthenticated`; a namespace token used outside its namespace, or anywhere but the data
//! plane, is `Forbidden`; a spent rate limit is `RateLimited`. With `dev` set (the `--dev`
//! flag, and nothing else) every caller is let through.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use delayd_core::{query, TokenRecord};

use super::Service;
use crate::config::AuthConfig;
use crate::error::ServiceError;
use crate::rate::Bucket;

/// Whether a data-plane operation reads or writes, for the token's rate limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Peeks, sizes, stats, lookups: lmstfy counts every GET as a read.
    Read,
    /// Everything else, reserve included: it changes the job.
    Write,
}

/// What an operation needs from its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope<'a> {
    /// The admin token: membership, tokens, snapshots, the node's clock.
    Admin,
    /// The admin token, or nothing when metrics are public.
    Metrics,
    /// The admin token or a token of this namespace, charged to its budget for this access.
    Namespace(&'a str, Access),
}

impl<'a> Scope<'a> {
    /// The data plane of `queue`'s namespace.
    pub(crate) fn queue(queue: &'a delayd_core::QueueName, access: Access) -> Scope<'a> {
        Scope::Namespace(&queue.namespace, access)
    }
}

/// The authenticated caller.
#[derive(Clone, PartialEq, Eq)]
pub enum Principal {
    /// Authentication is off (`--dev`).
    Dev,
    /// The admin token.
    Admin,
    /// A namespace token.
    Namespace {
        /// The token, which keys its rate limiter.
        token: String,
        /// What it opens and how fast.
        record: TokenRecord,
    },
    /// A client of a listener whose protocol has no authentication (beanstalkd's): it opens
    /// the data plane of the one namespace the operator gave that listener, without limits.
    Listener {
        /// The namespace the listener serves.
        namespace: String,
    },
}

impl std::fmt::Debug for Principal {
    /// Never the token itself: a principal may end up in a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Principal::Dev => f.write_str("Dev"),
            Principal::Admin => f.write_str("Admin"),
            Principal::Namespace { record, .. } => write!(f, "Namespace({:?})", record.namespace),
            Principal::Listener { namespace } => write!(f, "Listener({namespace:?})"),
        }
    }
}

impl AuthConfig {
    /// Whether `/metrics` is served without a credential.
    pub fn metrics_open(&self) -> bool {
        self.dev || self.public_metrics
    }

    /// Whether `credential` is the admin token or one still accepted during a rotation.
    /// Every candidate is compared, so the time taken does not tell which one matched.
    fn is_admin(&self, credential: &str) -> bool {
        let candidates = self.admin_token.iter().chain(&self.previous_admin_tokens);
        candidates.filter(|admin| same(admin, credential)).count() > 0
    }

    /// The credential this node shows its peers on the internal services: `cluster_secret`,
    /// else the admin token (how clusters authenticated before the setting existed); `None`
    /// with authentication off.
    pub fn effective_cluster_secret(&self) -> Option<&str> {
        if self.dev {
            None
        } else {
            self.cluster_secret.as_deref().or(self.admin_token.as_deref())
        }
    }
}

/// A new secret: 128 bits from a cryptographically secure generator, in lowercase hex. Both
/// namespace tokens and a generated admin token are made here.
pub fn new_secret() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Whether `t` has the shape of [`new_secret`]'s output.
fn looks_like_token(t: &str) -> bool {
    t.len() == 32 && t.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

use delayd_raft::server::same;

/// The credential in a request's headers: `Authorization: Bearer <t>` or `X-Token: <t>`.
/// HTTP/2 metadata is headers too, so both front ends read it through their own lookup.
pub fn header_credential<'h>(get: impl Fn(&str) -> Option<&'h str>) -> Option<String> {
    let header = |name: &str| get(name).map(str::trim);
    if let Some(t) = header("authorization").and_then(|v| v.strip_prefix("Bearer ")) {
        return Some(t.trim().to_string());
    }
    header("x-token").map(str::to_string)
}

/// The rate limiters of the namespace tokens this node has seen, and the node's catch-ups
/// for tokens it does not know.
#[derive(Default)]
pub(crate) struct Auth {
    limiters: Mutex<HashMap<String, Limiter>>,
    catch_ups: CatchUps,
}

/// A follower's catch-ups with the leader before it refuses an unknown token, coalesced: one
/// runs at a time, and every check that arrived before it started shares its outcome. A check
/// arriving while one runs waits for the next (the running one may have asked the leader
/// before the token was created), which then serves every check that queued up meanwhile. So
/// any number of concurrent bad tokens costs the leader at most one read-index round trip per
/// follower at a time, and a token created before a check began is still always seen.
#[derive(Default)]
struct CatchUps {
    /// How many catch-ups have started on this node; each is numbered by this count.
    started: AtomicU64,
    /// Held while a catch-up runs. The number and outcome of the last one that finished.
    last: tokio::sync::Mutex<Option<(u64, Result<(), String>)>>,
}

impl Auth {
    /// Takes one request from the token's budget for `access`; when it is spent, how long
    /// until it holds one again.
    fn admit(&self, token: &str, record: &TokenRecord, access: Access) -> Result<(), Duration> {
        let limit = match access {
            Access::Read => record.read_limit,
            Access::Write => record.write_limit,
        };
        if limit == 0 {
            return Ok(());
        }
        let mut limiters = self.limiters.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let limiter = limiters.entry(token.to_string()).or_default();
        let bucket = match access {
            Access::Read => &mut limiter.read,
            Access::Write => &mut limiter.write,
        };
        if bucket.take(limit, Instant::now()) {
            Ok(())
        } else {
            Err(bucket.until_one(limit))
        }
    }

    /// Forgets a deleted token's limiter (every node, as it applies the delete).
    pub(crate) fn forget(&self, token: &str) {
        self.limiters.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(token);
    }
}

/// The read and write budgets of one token on this node.
#[derive(Default)]
struct Limiter {
    read: Bucket,
    write: Bucket,
}

impl Service {
    /// Authenticates a credential: the admin token, or a namespace token from the replicated
    /// state. A token a follower does not know may have just been created on the leader, so
    /// before refusing it the follower catches up with the leader's commit index once.
    pub async fn authenticate(&self, credential: Option<&str>) -> Result<Principal, ServiceError> {
        let config = &self.config().auth;
        if config.dev {
            return Ok(Principal::Dev);
        }
        let Some(token) = credential.filter(|t| !t.is_empty()) else {
            return Err(ServiceError::Unauthenticated(
                "a token is required: send X-Token, ?token= or Authorization: Bearer".into(),
            ));
        };
        if config.is_admin(token) {
            return Ok(Principal::Admin);
        }
        let mut record = self.read(true, |v| query::token(v, token)).await?;
        // The leader answers a token's creation only once it has applied it, so only a
        // follower can be behind; a miss there costs one read-index round trip. Only for
        // strings shaped like our tokens, so garbage never reaches the leader.
        if record.is_none() && !self.cluster().is_leader() && looks_like_token(token) {
            self.catch_up_for_token().await.map_err(|e| {
                ServiceError::Unavailable(format!("cannot check the token with the leader: {e}"))
            })?;
            record = self.read(true, |v| query::token(v, token)).await?;
        }
        match record {
            Some(record) => Ok(Principal::Namespace { token: token.to_string(), record }),
            None => Err(ServiceError::Unauthenticated("unknown token".into())),
        }
    }

    /// Waits until this replica has applied everything the leader had committed at some point
    /// after this call began, sharing the round trip with concurrent callers ([`CatchUps`]).
    async fn catch_up_for_token(&self) -> Result<(), String> {
        let catch_ups = &self.inner.auth.catch_ups;
        // Catch-ups numbered up to `arrived` may have asked the leader before this check
        // began; only a later one is sure to see a token created before it.
        let arrived = catch_ups.started.load(Ordering::SeqCst);
        let mut last = catch_ups.last.lock().await;
        if let Some((_, outcome)) = last.as_ref().filter(|(n, _)| *n > arrived) {
            return outcome.clone();
        }
        let n = catch_ups.started.fetch_add(1, Ordering::SeqCst) + 1;
        self.inner.metrics.token_catch_up();
        // If this future is dropped halfway, `last` keeps the older outcome and the next
        // check in line runs its own catch-up.
        let outcome = self.cluster().read_barrier().await.map_err(|e| e.to_string());
        *last = Some((n, outcome.clone()));
        outcome
    }

    /// The one authorization decision: may `caller` do what needs `scope`? A namespace
    /// token's request is taken from its rate limit here.
    pub(crate) fn authorize(
        &self,
        caller: &Principal,
        scope: Scope<'_>,
    ) -> Result<(), ServiceError> {
        match (caller, scope) {
            (Principal::Dev | Principal::Admin, _) => Ok(()),
            (Principal::Namespace { .. }, Scope::Metrics) if self.config().auth.metrics_open() => {
                Ok(())
            }
            (
                Principal::Namespace { .. } | Principal::Listener { .. },
                Scope::Admin | Scope::Metrics,
            ) => Err(ServiceError::Forbidden("this needs the admin token".into())),
            (Principal::Listener { namespace: mine }, Scope::Namespace(namespace, _)) => {
                if mine == namespace {
                    Ok(())
                } else {
                    Err(ServiceError::Forbidden(format!(
                        "this listener serves namespace {mine:?}, not {namespace:?}"
                    )))
                }
            }
            (Principal::Namespace { record, .. }, Scope::Namespace(namespace, _))
                if record.namespace != namespace =>
            {
                Err(ServiceError::Forbidden(format!(
                    "the token is for namespace {:?}, not {namespace:?}",
                    record.namespace
                )))
            }
            (Principal::Namespace { token, record }, Scope::Namespace(_, access)) => {
                self.inner.auth.admit(token, record, access).map_err(|wait| {
                    let kind = if access == Access::Read { "read" } else { "write" };
                    self.inner.metrics.rate_limited(&record.namespace, kind);
                    ServiceError::RateLimited {
                        message: format!("the token's {kind} rate limit is spent; retry shortly"),
                        retry_after_ms: wait.as_millis().try_into().unwrap_or(u64::MAX),
                    }
                })
            }
        }
    }

    /// Checks that a principal authenticated earlier still holds: its token may have been
    /// deleted since (a long-lived stream outlives the request that opened it). Reads this
    /// replica's state, without a round trip.
    pub async fn revalidate(&self, principal: &Principal) -> Result<(), ServiceError> {
        let Principal::Namespace { token, record } = principal else { return Ok(()) };
        match self.read(true, |v| query::token(v, token)).await? {
            Some(now) if now.namespace == record.namespace => Ok(()),
            _ => Err(ServiceError::Unauthenticated("the token was deleted".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_from_either_header() {
        let none = header_credential(|_| None);
        assert_eq!(none, None);
        let x = header_credential(|n| (n == "x-token").then_some(" x "));
        assert_eq!(x, Some("x".into()));
        let both = header_credential(|n| match n {
            "authorization" => Some("Bearer b"),
            _ => Some("x"),
        });
        assert_eq!(both, Some("b".into()), "Bearer first");
    }

    #[test]
    fn secrets_compare_by_content() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "abcd"));
    }
}
