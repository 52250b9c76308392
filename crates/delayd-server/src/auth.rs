//! Who may do what: the admin token, namespace tokens (lmstfy's model) and their rate limits.
//!
//! A request shows one credential, as `Authorization: Bearer <t>`, an `X-Token` header or a
//! `?token=` parameter (lmstfy's SDKs use the last two; gRPC uses the `authorization` or
//! `x-token` metadata). It is either
//! - the **admin token** from the node's configuration, which opens everything: the admin
//!   API, the token API, `/metrics` and every namespace's data plane; or
//! - a **namespace token**, created through the token API and kept in the replicated state
//!   (so every node agrees on it), which opens the data plane of its namespace only, within
//!   its optional per-node read and write rate limits.
//!
//! No credential or an unknown one is 401; a namespace token used outside its namespace, or
//! anywhere but the data plane, is 403; a spent rate limit is 429. With `dev` set (the
//! `--dev` flag, and nothing else) every request is let through.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use delayd_core::{query, TokenRecord};

use crate::config::AuthConfig;
use crate::error::ServiceError;
use crate::http::ApiError;
use crate::node::Node;

/// Whether a data-plane request reads or writes, for the token's rate limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Peeks, sizes, stats, lookups: lmstfy counts every GET as a read.
    Read,
    /// Everything else, reserve included: it changes the job.
    Write,
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
}

impl std::fmt::Debug for Principal {
    /// Never the token itself: a principal may end up in a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Principal::Dev => f.write_str("Dev"),
            Principal::Admin => f.write_str("Admin"),
            Principal::Namespace { record, .. } => write!(f, "Namespace({:?})", record.namespace),
        }
    }
}

impl AuthConfig {
    /// Whether `/metrics` is served without a credential.
    pub fn metrics_open(&self) -> bool {
        self.dev || self.public_metrics
    }

    /// Whether `credential` is the admin token.
    fn is_admin(&self, credential: &str) -> bool {
        self.admin_token.as_deref().is_some_and(|admin| same(admin, credential))
    }

    /// The credential peers show each other on the internal services (the shared admin
    /// token); `None` with authentication off.
    pub fn cluster_secret(&self) -> Option<&str> {
        if self.dev {
            None
        } else {
            self.admin_token.as_deref()
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

/// The rate limiters of the namespace tokens this node has seen, and the node's catch-ups
/// for tokens it does not know.
#[derive(Default)]
pub struct Auth {
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
    /// Takes one request from the token's budget for `access`; false when it is spent.
    fn admit(&self, token: &str, record: &TokenRecord, access: Access) -> bool {
        let limit = match access {
            Access::Read => record.read_limit,
            Access::Write => record.write_limit,
        };
        if limit == 0 {
            return true;
        }
        let mut limiters = self.limiters.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let limiter = limiters.entry(token.to_string()).or_default();
        let bucket = match access {
            Access::Read => &mut limiter.read,
            Access::Write => &mut limiter.write,
        };
        bucket.take(limit, Instant::now())
    }

    /// Forgets a deleted token's limiter (every node, as it applies the delete).
    pub(crate) fn forget(&self, token: &str) {
        self.limiters.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(token);
    }
}

pub(crate) use delayd_raft::server::same;

/// The read and write budgets of one token on this node.
#[derive(Default)]
struct Limiter {
    read: Bucket,
    write: Bucket,
}

/// A token bucket holding at most one second's worth of requests.
#[derive(Default)]
struct Bucket {
    tokens: f64,
    last: Option<Instant>,
}

impl Bucket {
    fn take(&mut self, per_second: u32, now: Instant) -> bool {
        let rate = f64::from(per_second);
        self.tokens = match self.last {
            // A fresh bucket starts full, so a new token gets its whole first second.
            None => rate,
            Some(last) => (self.tokens + now.duration_since(last).as_secs_f64() * rate).min(rate),
        };
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The credential a request shows: `Authorization: Bearer`, `X-Token`, or `?token=`.
pub fn credential(headers: &HeaderMap, query: Option<&str>) -> Option<String> {
    credential_in(|name| headers.get(name).and_then(|v| v.to_str().ok()), query)
}

/// [`credential`] over any header lookup: gRPC metadata is HTTP/2 headers, so the client API
/// reads the same two headers without copying its metadata into a `HeaderMap`.
pub fn credential_in<'h>(
    get: impl Fn(&str) -> Option<&'h str>,
    query: Option<&str>,
) -> Option<String> {
    let header = |name: &str| get(name).map(str::trim);
    if let Some(t) = header("authorization").and_then(|v| v.strip_prefix("Bearer ")) {
        return Some(t.trim().to_string());
    }
    if let Some(t) = header("x-token") {
        return Some(t.to_string());
    }
    let query = query?;
    let pairs: Vec<(String, String)> =
        axum::extract::Query::try_from_uri(&format!("/?{query}").parse().ok()?).ok()?.0;
    pairs.into_iter().find(|(k, _)| k == "token").map(|(_, v)| v)
}

/// What a route needs from the caller.
#[derive(Debug, PartialEq, Eq)]
enum Need {
    /// Nothing: health, the dashboard's static files, unknown routes (they answer 404).
    Open,
    /// The admin token.
    Admin,
    /// The admin token, or nothing when metrics are public.
    Metrics,
    /// The admin token or a token of this namespace.
    Namespace(String, Access),
}

fn need(method: &Method, path: &str) -> Need {
    let mut parts = path.trim_start_matches('/').split('/');
    match parts.next() {
        Some("admin" | "token" | "debug") => Need::Admin,
        Some("metrics") => Need::Metrics,
        Some("api") => match parts.next() {
            Some(ns) => {
                let access = if method == Method::GET || method == Method::HEAD {
                    Access::Read
                } else {
                    Access::Write
                };
                // A reserve is a GET in lmstfy's API, yet it takes jobs: a write. Its path is
                // `/api/{ns}/{queues}` with nothing after the queues.
                let reserve = access == Access::Read && parts.clone().count() == 1;
                let access = if reserve { Access::Write } else { access };
                Need::Namespace(percent_decode(ns), access)
            }
            None => Need::Open,
        },
        _ => Need::Open,
    }
}

/// Decodes `%XX` escapes of a path segment (anything malformed is kept as it is: such a name
/// is rejected as invalid by the handler anyway).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, ..) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Node {
    /// Authenticates a credential: the admin token, or a namespace token from the replicated
    /// state. A token a follower does not know may have just been created on the leader, so
    /// before refusing it the follower catches up with the leader's commit index once.
    pub async fn authenticate(&self, credential: Option<&str>) -> Result<Principal, ServiceError> {
        let config = &self.inner.config.auth;
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
        if record.is_none() && !self.is_leader() && looks_like_token(token) {
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
        let outcome = self.read_barrier().await.map_err(|e| e.to_string());
        *last = Some((n, outcome.clone()));
        outcome
    }

    /// Checks that `principal` may use `namespace`'s data plane, and takes the request from
    /// the token's rate limit.
    pub fn authorize(
        &self,
        principal: &Principal,
        namespace: &str,
        access: Access,
    ) -> Result<(), ServiceError> {
        match principal {
            Principal::Dev | Principal::Admin => Ok(()),
            Principal::Namespace { record, .. } if record.namespace != namespace => {
                Err(ServiceError::Forbidden(format!(
                    "the token is for namespace {:?}, not {namespace:?}",
                    record.namespace
                )))
            }
            Principal::Namespace { token, record } => {
                if self.inner.auth.admit(token, record, access) {
                    Ok(())
                } else {
                    let kind = if access == Access::Read { "read" } else { "write" };
                    Err(ServiceError::RateLimited(format!(
                        "the token's {kind} rate limit is spent; retry shortly"
                    )))
                }
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

    /// Checks that `principal` holds the admin credential.
    pub fn authorize_admin(&self, principal: &Principal) -> Result<(), ServiceError> {
        match principal {
            Principal::Dev | Principal::Admin => Ok(()),
            Principal::Namespace { .. } => {
                Err(ServiceError::Forbidden("this needs the admin token".into()))
            }
        }
    }
}

/// HTTP middleware: every route's credential check, before its handler runs.
pub async fn middleware(State(node): State<Node>, request: Request, next: Next) -> Response {
    let need = need(request.method(), request.uri().path());
    let cred = match need {
        Need::Open => None,
        _ => credential(request.headers(), request.uri().query()),
    };
    match check(&node, need, cred).await {
        Ok(()) => next.run(request).await,
        Err(e) => {
            let unauthenticated = matches!(e, ServiceError::Unauthenticated(_));
            let mut response = ApiError(e).into_response();
            if unauthenticated {
                response
                    .headers_mut()
                    .insert("www-authenticate", axum::http::HeaderValue::from_static("Bearer"));
            }
            response
        }
    }
}

async fn check(node: &Node, need: Need, cred: Option<String>) -> Result<(), ServiceError> {
    match need {
        Need::Open => Ok(()),
        Need::Metrics if node.config().auth.metrics_open() => Ok(()),
        Need::Admin | Need::Metrics => {
            node.authorize_admin(&node.authenticate(cred.as_deref()).await?)
        }
        Need::Namespace(ns, access) => {
            node.authorize(&node.authenticate(cred.as_deref()).await?, &ns, access)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn routes_need_what_they_open() {
        let ns = |n: &str, a| Need::Namespace(n.to_string(), a);
        assert_eq!(need(&Method::GET, "/health"), Need::Open);
        assert_eq!(need(&Method::GET, "/dashboard/app.js"), Need::Open);
        assert_eq!(need(&Method::GET, "/admin/cluster"), Need::Admin);
        assert_eq!(need(&Method::POST, "/token/ns1"), Need::Admin);
        assert_eq!(need(&Method::PUT, "/debug/clock"), Need::Admin);
        assert_eq!(need(&Method::GET, "/metrics"), Need::Metrics);
        assert_eq!(need(&Method::PUT, "/api/ns1/q"), ns("ns1", Access::Write));
        assert_eq!(need(&Method::GET, "/api/ns1/q1,q2"), ns("ns1", Access::Write));
        // axum answers HEAD with the GET handler: a HEAD on the reserve route takes a job.
        assert_eq!(need(&Method::HEAD, "/api/ns1/q"), ns("ns1", Access::Write));
        assert_eq!(need(&Method::GET, "/api/ns1/q/size"), ns("ns1", Access::Read));
        assert_eq!(need(&Method::GET, "/api/n%73/q/peek"), ns("ns", Access::Read));
        assert_eq!(need(&Method::DELETE, "/api/ns1/q/job/x"), ns("ns1", Access::Write));
    }

    #[test]
    fn credentials_come_from_either_header_or_the_query() {
        let mut h = HeaderMap::new();
        assert_eq!(credential(&h, Some("a=1&token=t%2B1")), Some("t+1".into()));
        assert_eq!(credential(&h, Some("a=1")), None);
        h.insert("x-token", "x".parse().expect("header"));
        assert_eq!(credential(&h, Some("token=q")), Some("x".into()));
        h.insert("authorization", "Bearer b".parse().expect("header"));
        assert_eq!(credential(&h, None), Some("b".into()));
    }

    #[test]
    fn secrets_compare_by_content() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "abcd"));
    }

    #[test]
    fn a_bucket_allows_its_rate_and_refills() {
        let mut b = Bucket::default();
        let t0 = Instant::now();
        let burst = (0..10).filter(|_| b.take(5, t0)).count();
        assert_eq!(burst, 5, "a fresh bucket holds one second of requests");
        assert!(!b.take(5, t0 + Duration::from_millis(100)), "0.5 of a request refilled");
        assert!(b.take(5, t0 + Duration::from_millis(250)), "a whole one after 200 ms");
        let later = t0 + Duration::from_secs(60);
        let burst = (0..10).filter(|_| b.take(5, later)).count();
        assert_eq!(burst, 5, "never more than one second's worth");
    }
}
