//! What a handler takes from a request: the caller, names from the path, parameters from the
//! query string and the body — each refused with a JSON 400 naming what is wrong.
//!
//! This is syntax only: a number that does not parse, a name that is not UTF-8. Whether a
//! value is in range is the service's call (`service/validate.rs`), made after it has
//! authorized the caller.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, RawPathParams, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use delayd_core::{Due, JobId, QueueName};
use serde::de::DeserializeOwned;

use super::error::{bad, ApiError};
use crate::error::ServiceError;
use crate::service::auth::{header_credential, Scope};
use crate::service::reserve::AckFirst;
use crate::service::validate::{self, job_id, queue_name, MAX_RESERVE_COUNT};
use crate::service::{Principal, PublishParams, Service};

/// The credential a request shows: `Authorization: Bearer`, `X-Token`, or `?token=`.
pub(crate) fn credential(parts: &Parts) -> Option<String> {
    let headers = &parts.headers;
    header_credential(|name| headers.get(name).and_then(|v| v.to_str().ok()))
        .or_else(|| Params::of(&parts.uri).str("token").map(str::to_string))
}

/// The authenticated caller. Taken first by every handler that needs one, so a request
/// without a valid credential is refused before anything else of it is read.
pub(crate) struct Caller(pub Principal);

impl FromRequestParts<Service> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, service: &Service) -> Result<Self, ApiError> {
        let credential = credential(parts);
        Ok(Caller(service.authenticate(credential.as_deref()).await?))
    }
}

/// An authenticated caller holding the admin scope, for the admin routes. Taken first like
/// [`Caller`], so a token that may not call the route gets its 403 before the route's
/// arguments are read: a namespace token never learns which arguments would have been bad.
/// (The service still authorizes each call itself.)
pub(crate) struct Admin(pub Principal);

impl FromRequestParts<Service> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, service: &Service) -> Result<Self, ApiError> {
        let Caller(caller) = Caller::from_request_parts(parts, service).await?;
        service.authorize(&caller, Scope::Admin)?;
        Ok(Admin(caller))
    }
}

/// axum's `Path`, rejecting with a JSON error like every other bad parameter (axum's own
/// rejection is plain text, e.g. for a segment that is not UTF-8).
pub(crate) struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(t)) => Ok(Path(t)),
            Err(r) if r.status().is_client_error() => Err(bad(r.body_text())),
            Err(r) => Err(ApiError(ServiceError::Internal(r.body_text()))),
        }
    }
}

/// The path's named segments, percent-decoded. axum's `RawPathParams` hands out the router's
/// own decoded copies: nothing is deserialized into a map of new strings, which every publish
/// and ack would otherwise pay for.
async fn segments(parts: &mut Parts) -> Result<RawPathParams, ApiError> {
    match RawPathParams::from_request_parts(parts, &()).await {
        Ok(segments) => Ok(segments),
        Err(r) if r.status().is_client_error() => Err(bad(r.body_text())),
        Err(r) => Err(ApiError(ServiceError::Internal(r.body_text()))),
    }
}

/// The segment `name` of `segments`, or "" when the route has none of that name (a name
/// the checks that follow refuse).
fn segment<'a>(segments: &'a RawPathParams, name: &str) -> &'a str {
    segments.iter().find_map(|(k, v)| (k == name).then_some(v)).unwrap_or_default()
}

/// `/api/{ns}/{q}/...`: a checked queue name.
pub(crate) struct QueueRef(pub QueueName);

impl<S: Send + Sync> FromRequestParts<S> for QueueRef {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let s = segments(parts).await?;
        Ok(QueueRef(queue_name(segment(&s, "ns"), segment(&s, "q"))?))
    }
}

/// `/api/{ns}/{q}/job/{id}`: a checked queue name and a parsed job id.
pub(crate) struct JobRef(pub QueueName, pub JobId);

impl<S: Send + Sync> FromRequestParts<S> for JobRef {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let s = segments(parts).await?;
        let queue = queue_name(segment(&s, "ns"), segment(&s, "q"))?;
        Ok(JobRef(queue, job_id(segment(&s, "id"))?))
    }
}

/// Query parameters, parsed on demand with errors that name the parameter.
///
/// A list, not a map: a request carries a handful of parameters, and every request pays for
/// building this; a scan of a few pairs spares hashing each name (the map and its hashing
/// were 2.4 % of a leader's CPU under publish load). The decoded names and values share one
/// string, each pair a pair of ranges into it, rather than two new strings a pair. A name
/// given twice reads as its last value, as a map built in order would hold.
pub(crate) struct Params {
    text: String,
    pairs: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>,
}

impl Params {
    /// The query of `uri`, percent-decoded (invalid UTF-8 is replaced, not refused, as
    /// axum's query extractor does).
    pub(crate) fn of(uri: &axum::http::Uri) -> Params {
        let query = uri.query().unwrap_or_default();
        // Decoding never lengthens a query, so the text is allocated once.
        let mut text = String::with_capacity(query.len());
        let mut pairs = Vec::new();
        for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
            let start = text.len();
            text.push_str(&name);
            let split = text.len();
            text.push_str(&value);
            pairs.push((start..split, split..text.len()));
        }
        Params { text, pairs }
    }

    fn pairs(&self) -> impl DoubleEndedIterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(k, v)| (&self.text[k.clone()], &self.text[v.clone()]))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        Ok(Params::of(&parts.uri))
    }
}

/// No request body, for the admin routes that take their arguments in the query string: a
/// client that sends them as a body instead (`{"to": 2}` to `POST /admin/leader`) gets a 400
/// saying where they go, rather than a call made as if it had sent none.
pub(crate) struct NoBody;

impl FromRequest<Service> for NoBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, service: &Service) -> Result<Self, ApiError> {
        // The router's body limit bounds what is read here.
        let sent = Bytes::from_request(request, service).await;
        match body_bytes(sent, service.config().max_body_bytes)?.len() {
            0 => Ok(NoBody),
            n => Err(bad(format!(
                "this route takes its parameters in the query string and no body; {n} bytes \
                 of body were sent"
            ))),
        }
    }
}

/// A publish's parameters: the query's, with the service's defaults for what is absent, and
/// attributes from `Job-Attr-{Name}` headers (read in place: taking the whole `HeaderMap`
/// would copy every header of every publish).
pub(crate) struct Publishing(pub PublishParams);

impl<S: Send + Sync> FromRequestParts<S> for Publishing {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        Ok(Publishing(Params::of(&parts.uri).publish(&parts.headers)?))
    }
}

impl Params {
    pub(crate) fn str(&self, name: &str) -> Option<&str> {
        self.pairs().rev().find(|(k, _)| *k == name).map(|(_, v)| v)
    }

    fn has(&self, name: &str) -> bool {
        self.pairs().any(|(k, _)| k == name)
    }

    /// A number, `None` when absent.
    pub(crate) fn num<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, ApiError> {
        match self.str(name) {
            None => Ok(None),
            Some(s) => s.trim().parse().map(Some).map_err(|_| {
                bad(format!("invalid {name} {s:?}: expected a non-negative integer in range"))
            }),
        }
    }

    /// A time in lmstfy's unit, whole seconds of 32 bits (lmstfy's width).
    pub(crate) fn secs(&self, name: &str) -> Result<Option<u32>, ApiError> {
        self.num::<u32>(name)
    }

    /// A time in lmstfy's unit, as ms.
    pub(crate) fn secs_as_ms(&self, name: &str) -> Result<Option<u64>, ApiError> {
        Ok(self.secs(name)?.map(|s| u64::from(s) * 1000))
    }

    pub(crate) fn flag(&self, name: &str) -> Result<bool, ApiError> {
        match self.str(name) {
            None | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") | Some("") => Ok(true),
            Some(s) => Err(bad(format!("invalid {name} {s:?}: expected true or false"))),
        }
    }

    /// `?stale=`: whether a read may be served from this replica without catching up.
    pub(crate) fn stale(&self) -> Result<bool, ApiError> {
        self.flag("stale")
    }

    /// A reservation's lease, in the hex reserve returned, from parameter `name`.
    fn lease_in(&self, name: &str) -> Result<Option<u64>, ApiError> {
        self.str(name).map(|s| lease_token(name, s)).transpose()
    }

    /// `?lease=`.
    pub(crate) fn lease(&self) -> Result<Option<u64>, ApiError> {
        self.lease_in("lease")
    }

    /// `ttr` (s) or `ttr_ms`.
    pub(crate) fn ttr(&self) -> Result<Option<u64>, ApiError> {
        Ok(validate::ttr(self.secs("ttr")?, self.num("ttr_ms")?)?)
    }

    /// `delay` (s), `delay_ms` or `at` (unix ms); at most one.
    pub(crate) fn due(&self) -> Result<Option<Due>, ApiError> {
        Ok(validate::due(self.secs("delay")?, self.num("delay_ms")?, self.num("at")?)?)
    }

    /// A reserve's `ack` extension: `ack`, one job id or several separated by commas (at
    /// most [`MAX_RESERVE_COUNT`]), with `ack_lease`, absent or one token per id in the same
    /// order, in `ack_queue`, absent (the first queue reserved from), one queue for every id,
    /// or one queue per id; all of namespace `ns`.
    pub(crate) fn ack_first(
        &self,
        ns: &str,
        queues: &[QueueName],
    ) -> Result<Vec<AckFirst>, ApiError> {
        let Some(ids) = self.str("ack") else {
            if self.has("ack_lease") || self.has("ack_queue") {
                return Err(bad("ack_lease and ack_queue need ack (the job id to ack)"));
            }
            return Ok(Vec::new());
        };
        let ids: Vec<&str> = ids.split(',').collect();
        if ids.len() > MAX_RESERVE_COUNT as usize {
            return Err(bad(format!(
                "ack names {} jobs; at most {MAX_RESERVE_COUNT} are acked on one reserve",
                ids.len()
            )));
        }
        let leases: Vec<Option<&str>> = match self.str("ack_lease") {
            None => vec![None; ids.len()],
            Some(all) => all.split(',').map(Some).collect(),
        };
        if leases.len() != ids.len() {
            return Err(bad(format!(
                "ack_lease has {} tokens for {} ids in ack: one per id, in the same order",
                leases.len(),
                ids.len()
            )));
        }
        let named: Vec<&str> =
            self.str("ack_queue").map(|q| q.split(',').collect()).unwrap_or_default();
        let queue_of = |i: usize| -> Result<QueueName, ApiError> {
            match named.as_slice() {
                [] => queues.first().cloned().ok_or_else(|| bad("no queue named")),
                [one] => Ok(queue_name(ns, one)?),
                many if many.len() == ids.len() => Ok(queue_name(ns, many[i])?),
                many => Err(bad(format!(
                    "ack_queue names {} queues for {} ids in ack: one for all, or one per id",
                    many.len(),
                    ids.len()
                ))),
            }
        };
        ids.iter()
            .zip(leases)
            .enumerate()
            .map(|(i, (id, lease))| {
                let lease = lease.map(|l| lease_token("ack_lease", l)).transpose()?;
                Ok(AckFirst { queue: queue_of(i)?, id: job_id(id)?, lease })
            })
            .collect()
    }

    /// A publish's parameters, with the service's defaults for what is absent; attributes
    /// come from `Job-Attr-{Name}` headers.
    fn publish(&self, headers: &HeaderMap) -> Result<PublishParams, ApiError> {
        let mut p = PublishParams::default();
        if let Some(due) = self.due()? {
            p.due = due;
        }
        p.ttl_ms = validate::ttl(self.secs_as_ms("ttl")?);
        if let Some(tries) = self.num::<u16>("tries")? {
            p.tries = tries;
        }
        if let Some(ttr_ms) = validate::ttr(self.secs("ttr")?, None)? {
            p.ttr_ms = ttr_ms;
        }
        if let Some(priority) = self.num::<u32>("priority")? {
            p.priority = priority;
        }
        p.key = self.str("key").map(str::to_string);
        p.attributes = attributes(headers)?;
        Ok(p)
    }
}

/// Attributes from `Job-Attr-{Name}` headers.
fn attributes(headers: &HeaderMap) -> Result<BTreeMap<String, String>, ApiError> {
    let mut attrs = BTreeMap::new();
    for (name, value) in headers {
        if let Some(attr) = name.as_str().strip_prefix("job-attr-") {
            let value = value
                .to_str()
                .map_err(|_| bad(format!("attribute {attr} is not visible ASCII")))?;
            attrs.insert(attr.to_string(), value.to_string());
        }
    }
    Ok(attrs)
}

/// Splits a bulk body in lmstfy's format — a JSON array whose elements' texts are the jobs'
/// bodies — into the bodies.
pub(crate) fn split_json_array(data: &[u8]) -> Result<Vec<Vec<u8>>, ServiceError> {
    let jobs: Vec<Box<serde_json::value::RawValue>> =
        serde_json::from_slice(data).map_err(|e| {
            ServiceError::bad_request(format!("bulk body must be a JSON array of jobs: {e}"))
        })?;
    Ok(jobs.into_iter().map(|j| j.get().as_bytes().to_vec()).collect())
}

/// A request body read within `limit` bytes (the route's body limit layer enforces it; this
/// names it in the 413).
pub(crate) fn body(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Vec<u8>, ApiError> {
    body_bytes(body, limit).map(|b| b.to_vec())
}

/// [`body`], as axum read it (no copy).
fn body_bytes(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    match body {
        Ok(b) => Ok(b),
        Err(r) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Err(ApiError(ServiceError::TooLarge(format!(
                "the request body is larger than the limit of {limit} bytes"
            ))))
        }
        Err(r) => Err(bad(format!("cannot read body: {}", r.body_text()))),
    }
}

/// A lease token as reserve hands it out (hex), from parameter `name`.
fn lease_token(name: &str, s: &str) -> Result<u64, ApiError> {
    u64::from_str_radix(s, 16)
        .map_err(|_| bad(format!("invalid {name} {s:?}: expected the token from reserve")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_decoded_and_the_last_of_a_name_wins() {
        let uri: axum::http::Uri =
            "/api/ns/q?delay=1&key=a%20b+c&stale&delay=2&bad=%FF&=empty".parse().expect("uri");
        let p = Params::of(&uri);
        assert_eq!(p.str("delay"), Some("2"));
        assert_eq!(p.str("key"), Some("a b c"));
        assert_eq!(p.str("stale"), Some(""));
        assert!(p.has("stale") && !p.has("ttl"));
        assert_eq!(p.str("bad"), Some("\u{fffd}"));
        assert_eq!(p.str(""), Some("empty"));
        assert_eq!(p.str("missing"), None);
        assert_eq!(Params::of(&"/api/ns/q".parse().expect("uri")).str("delay"), None);
    }

    #[test]
    fn bulk_bodies_are_the_elements_texts() {
        let bodies = split_json_array(br#"[{"a": 1}, "two", 3]"#).expect("array");
        assert_eq!(bodies, vec![br#"{"a": 1}"#.to_vec(), br#""two""#.to_vec(), b"3".to_vec()]);
        assert!(split_json_array(b"{}").is_err());
    }

    #[test]
    fn credentials_come_from_either_header_or_the_query() {
        let parts = |uri: &str, headers: &[(&str, &str)]| {
            let mut r = axum::http::Request::builder().uri(uri);
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            r.body(()).expect("request").into_parts().0
        };
        assert_eq!(credential(&parts("/?a=1&token=t%2B1", &[])), Some("t+1".into()));
        assert_eq!(credential(&parts("/?a=1", &[])), None);
        assert_eq!(credential(&parts("/?token=q", &[("x-token", "x")])), Some("x".into()));
        let both = [("x-token", "x"), ("authorization", "Bearer b")];
        assert_eq!(credential(&parts("/", &both)), Some("b".into()));
    }
}
