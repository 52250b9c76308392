//! Jobs, deliveries and counts as the HTTP API shows them: lmstfy's fields, with delayd's
//! beside them.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use delayd_core::{Delivery, Job, JobId, JobState, QueueMeta, QueueName};
use serde::{Serialize, Serializer};
use serde_json::{json, Map, Value};

use crate::service::publish::Published;

/// A job as the API shows it: lmstfy's fields with delayd's beside them, and for a delivery
/// the lease as well. Serialized straight from the job (a reserve answers thousands of these
/// a second), with its keys in the alphabetical order a JSON object built by hand had.
#[derive(Serialize)]
pub(crate) struct JobAnswer<'a> {
    /// Whether the previous jobs acked on this reserve went (the `ack=` extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    acked: Option<Acked<'a>>,
    attempt: u16,
    /// `null` when there are none.
    attributes: Option<&'a BTreeMap<String, String>>,
    /// The body, base64.
    #[serde(serialize_with = "base64_text")]
    data: &'a [u8],
    due_at_ms: u64,
    elapsed_ms: u64,
    #[serde(serialize_with = "display")]
    job_id: JobId,
    key: Option<&'a str>,
    /// A delivery's lease.
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<Hex>,
    /// A delivery's lease deadline (`Some(None)` shows as `null`).
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_deadline_ms: Option<Option<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    msg: Option<&'static str>,
    namespace: &'a str,
    /// `null` for a job stored before numbers existed.
    number: Option<u64>,
    priority: u32,
    queue: &'a str,
    remain_tries: u16,
    state: &'static str,
    /// Whole seconds left to live, rounded up; 0 when the job never expires.
    ttl: u64,
}

fn base64_text<S: Serializer>(bytes: &&[u8], s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&base64::display::Base64Display::new(
        bytes,
        &base64::engine::general_purpose::STANDARD,
    ))
}

fn display<S: Serializer>(id: &JobId, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(id)
}

/// A number shown as lower-case hex text (a lease, as the API takes it back).
struct Hex(u64);

impl Serialize for Hex {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{:x}", self.0))
    }
}

/// A job as lmstfy shows it, with delayd's fields beside lmstfy's.
pub(crate) fn job(job: &Job, now: u64) -> JobAnswer<'_> {
    JobAnswer {
        acked: None,
        attempt: job.attempts,
        attributes: (!job.attributes.is_empty()).then_some(&job.attributes),
        data: &job.body,
        due_at_ms: job.due_ms,
        elapsed_ms: now.saturating_sub(job.created_ms),
        job_id: job.id,
        key: job.key.as_deref(),
        lease: None,
        lease_deadline_ms: None,
        msg: None,
        namespace: &job.queue.namespace,
        number: (job.number != 0).then_some(job.number),
        priority: job.priority,
        queue: &job.queue.queue,
        remain_tries: job.remain_tries(),
        state: job.state.as_str(),
        ttl: job.expires_ms.map_or(0, |e| e.saturating_sub(now).div_ceil(1000)),
    }
}

/// Whether the acks that rode on a reserve (`ack=`) removed their jobs: `true` or `false`
/// for one id, an array in the order of the ids for several.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub(crate) enum Acked<'a> {
    One(bool),
    Many(&'a [bool]),
}

impl<'a> Acked<'a> {
    /// The answer for `acked`, one per ack asked for; `None` when none was.
    pub(crate) fn of(acked: &'a [bool]) -> Option<Acked<'a>> {
        match acked {
            [] => None,
            [one] => Some(Acked::One(*one)),
            many => Some(Acked::Many(many)),
        }
    }

    /// The `Delayd-Acked` header's value: `true`, `false`, or such words joined by commas.
    pub(crate) fn header(self) -> String {
        let one;
        let all = match self {
            Acked::One(a) => {
                one = [a];
                &one[..]
            }
            Acked::Many(all) => all,
        };
        let mut text = String::with_capacity(all.len() * 6);
        for (i, a) in all.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            text.push_str(if *a { "true" } else { "false" });
        }
        text
    }
}

/// A job handed to a consumer: the job, its lease (hex) and the lease's deadline; with
/// `acked`, whether the acks that rode on the reserve went.
pub(crate) fn delivery<'a>(d: &'a Delivery, now: u64, acked: Option<Acked<'a>>) -> JobAnswer<'a> {
    JobAnswer {
        acked,
        lease: Some(Hex(d.lease)),
        lease_deadline_ms: Some(d.job.lease.map(|l| l.deadline_ms)),
        msg: Some("new job"),
        ..job(&d.job, now)
    }
}

/// A queue's name, pause flag and a count per state.
pub(crate) fn queue(name: &QueueName, meta: &QueueMeta) -> Map<String, Value> {
    let mut v = Map::new();
    v.insert("namespace".into(), json!(name.namespace));
    v.insert("queue".into(), json!(name.queue));
    v.insert("paused".into(), json!(meta.paused));
    for state in JobState::ALL {
        v.insert(state.as_str().into(), json!(meta.count(state)));
    }
    v
}

/// A queue's size in lmstfy's shape (ready jobs, or the dead letter's).
pub(crate) fn size(queue: &QueueName, size: u64) -> Response {
    Json(json!({"namespace": queue.namespace, "queue": queue.queue, "size": size})).into_response()
}

/// 201 with the new job's id, or 200 when its key named a job that already existed.
pub(crate) fn published(r: Published) -> Response {
    #[derive(Serialize)]
    struct Answer {
        #[serde(serialize_with = "display")]
        job_id: JobId,
        msg: &'static str,
    }
    let (status, msg) =
        if r.existed { (StatusCode::OK, "exists") } else { (StatusCode::CREATED, "published") };
    (status, Json(Answer { job_id: r.id, msg })).into_response()
}

/// 204.
pub(crate) fn no_content() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use delayd_core::{JobCounters, Lease};

    use super::*;

    fn stored_job() -> Job {
        Job {
            id: JobId(7),
            queue: QueueName::new("ns", "q"),
            key: None,
            body: b"hi".to_vec(),
            attributes: BTreeMap::new(),
            state: JobState::Reserved,
            priority: 3,
            created_ms: 1_000,
            due_ms: 2_000,
            expires_ms: Some(11_001),
            tries: 3,
            attempts: 1,
            ttr_ms: 30_000,
            lease: Some(Lease { token: 255, deadline_ms: 32_000, ttr_ms: 30_000 }),
            seq: 9,
            counters: JobCounters::default(),
            number: 0,
        }
    }

    fn text(v: impl Serialize) -> String {
        serde_json::to_string(&v).unwrap()
    }

    #[test]
    fn a_job_shows_every_field_in_key_order_with_nulls_for_the_absent_ones() {
        let want = json!({
            "attempt": 1,
            "attributes": null,
            "data": "aGk=",
            "due_at_ms": 2000,
            "elapsed_ms": 1000,
            "job_id": JobId(7).to_string(),
            "key": null,
            "namespace": "ns",
            "number": null,
            "priority": 3,
            "queue": "q",
            "remain_tries": 2,
            "state": "reserved",
            "ttl": 10, // 9,001 ms left, rounded up
        });
        // The same text as the object above (serde_json orders its keys), byte for byte.
        assert_eq!(text(job(&stored_job(), 2_000)), want.to_string());
    }

    #[test]
    fn a_delivery_adds_its_lease_and_message_and_the_ack_when_one_rode_on_it() {
        let mut j = stored_job();
        j.key = Some("k".into());
        j.attributes.insert("a".into(), "b".into());
        j.number = 42;
        j.expires_ms = None;
        let d = Delivery { job: j, lease: 255 };
        let v: Value = serde_json::from_str(&text(delivery(&d, 2_000, None))).unwrap();
        assert_eq!(
            (&v["lease"], &v["lease_deadline_ms"], &v["msg"], &v["number"]),
            (&json!("ff"), &json!(32_000), &json!("new job"), &json!(42))
        );
        assert_eq!(
            (&v["key"], &v["attributes"], &v["ttl"]),
            (&json!("k"), &json!({"a": "b"}), &json!(0))
        );
        assert!(v.get("acked").is_none(), "{v}");
        let acked: Value =
            serde_json::from_str(&text(delivery(&d, 2_000, Some(Acked::One(false))))).unwrap();
        assert_eq!(acked["acked"], false);
        let many = [true, false];
        let acked: Value =
            serde_json::from_str(&text(delivery(&d, 2_000, Acked::of(&many)))).unwrap();
        assert_eq!(acked["acked"], serde_json::json!([true, false]));
        assert_eq!(Acked::of(&many).map(Acked::header).as_deref(), Some("true,false"));
        assert_eq!(Acked::of(&[true]).map(Acked::header).as_deref(), Some("true"));
        assert_eq!(Acked::of(&[]), None);
        // A delivery of a job without a lease (never the case once reserved) shows null.
        let d = Delivery { job: Job { lease: None, ..d.job }, lease: 1 };
        let v: Value = serde_json::from_str(&text(delivery(&d, 2_000, None))).unwrap();
        assert!(v["lease_deadline_ms"].is_null(), "{v}");
    }
}
