//! Jobs, deliveries and counts as the HTTP API shows them: lmstfy's fields, with delayd's
//! beside them.

use std::collections::BTreeMap;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use delayd_core::{Delivery, Job, JobId, JobState, QueueMeta, QueueName};
use serde::ser::Error as _;
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

// The fields below are written as finished strings rather than through `collect_str`, which
// runs each through `core::fmt` and serde_json's escaping adapter piece by piece: in a
// leader's profile under a drain, answering a reserve cost 13,600 instructions, most of them
// there and in writing through a growing `BytesMut` (see [`json`]).

/// Appends `bytes` in base64 to `out`, encoded in place.
fn base64_into(bytes: &[u8], out: &mut Vec<u8>) {
    let engine = &base64::engine::general_purpose::STANDARD;
    // `None` only for a length near `usize::MAX`, which no body comes near.
    let Some(len) = base64::encoded_len(bytes.len(), true) else { return };
    let start = out.len();
    out.resize(start + len, 0);
    // The room made is exactly the padded encoding's length, so this cannot fail; should it
    // ever, the answer loses the body rather than carrying zeros.
    match engine.encode_slice(bytes, &mut out[start..]) {
        Ok(n) => out.truncate(start + n),
        Err(_) => out.truncate(start),
    }
}

fn base64_text<S: Serializer>(bytes: &&[u8], s: S) -> Result<S::Ok, S::Error> {
    // A small body is encoded on the stack, a larger one into a new string. The buffer is
    // kept small: it is zeroed for every answer (a 4 KiB one cost more than the encoding).
    const ON_STACK: usize = 384;
    let engine = &base64::engine::general_purpose::STANDARD;
    if bytes.len() <= ON_STACK {
        let mut text = [0; ON_STACK / 3 * 4];
        match engine.encode_slice(bytes, &mut text) {
            Ok(n) => s.serialize_str(std::str::from_utf8(&text[..n]).map_err(S::Error::custom)?),
            Err(e) => Err(S::Error::custom(e)),
        }
    } else {
        s.serialize_str(&engine.encode(bytes))
    }
}

fn display<S: Serializer>(id: &JobId, s: S) -> Result<S::Ok, S::Error> {
    let mut text = [0; ulid::ULID_LEN];
    s.serialize_str(ulid::Ulid(id.0).array_to_str(&mut text))
}

/// A number shown as lower-case hex text (a lease, as the API takes it back).
struct Hex(u64);

impl Serialize for Hex {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut text = [0; 16];
        s.serialize_str(hex(self.0, &mut text))
    }
}

/// `n` in lower-case hex without leading zeros, written into `text`.
fn hex(n: u64, text: &mut [u8; 16]) -> &str {
    let digits = (16 - n.leading_zeros() as usize / 4).max(1);
    for (i, byte) in text[..digits].iter_mut().rev().enumerate() {
        *byte = b"0123456789abcdef"[((n >> (4 * i)) & 0xf) as usize];
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&text[..digits]).unwrap_or_default()
}

/// `value` as a JSON answer with `status`, written straight into a buffer of `capacity`
/// bytes (a hint: a longer text grows it). axum's `Json` writes through a `BytesMut` that
/// starts at 128 bytes and grows on the way, each of serde_json's small writes checked and
/// copied on its own; a `Vec` sized once takes them as plain appends.
pub(crate) fn json<T: Serialize>(status: StatusCode, value: &T, capacity: usize) -> Response {
    let mut text = Vec::with_capacity(capacity);
    let written = serde_json::to_writer(&mut text, value);
    json_response(status, written, text)
}

/// `text` as a JSON answer with `status` once it was `written` whole; else a 500, as axum's
/// `Json` answers (a value of ours always serializes).
fn json_response(status: StatusCode, written: serde_json::Result<()>, text: Vec<u8>) -> Response {
    match written {
        Ok(()) => {
            let json = HeaderValue::from_static("application/json");
            (status, [(header::CONTENT_TYPE, json)], text).into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("cannot write the answer: {e}"))
            .into_response(),
    }
}

impl JobAnswer<'_> {
    /// Appends the answer's JSON to `out`: the same bytes as its `Serialize` (a test holds
    /// the two to that), written by hand. Through serde_json every key and every string value
    /// went through its escaping scan, about half of a reserve's answer; here the keys are
    /// literals, the base64 body, id, lease and state are written as they are (their
    /// alphabets need no escapes), and only the client's names, key and attributes, the
    /// acks' outcomes and the message (rare: a few fixed texts) go through serde_json.
    pub(crate) fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        let mut numbers = itoa::Buffer::new();
        let mut number = |out: &mut Vec<u8>, n: u64| {
            out.extend_from_slice(numbers.format(n).as_bytes());
        };
        out.push(b'{');
        if let Some(acked) = &self.acked {
            out.extend_from_slice(b"\"acked\":");
            serde_json::to_writer(&mut *out, acked)?;
            out.push(b',');
        }
        out.extend_from_slice(b"\"attempt\":");
        number(out, self.attempt.into());
        out.extend_from_slice(b",\"attributes\":");
        serde_json::to_writer(&mut *out, &self.attributes)?;
        out.extend_from_slice(b",\"data\":\"");
        base64_into(self.data, out);
        out.extend_from_slice(b"\",\"due_at_ms\":");
        number(out, self.due_at_ms);
        out.extend_from_slice(b",\"elapsed_ms\":");
        number(out, self.elapsed_ms);
        out.extend_from_slice(b",\"job_id\":\"");
        let mut id = [0; ulid::ULID_LEN];
        out.extend_from_slice(ulid::Ulid(self.job_id.0).array_to_str(&mut id).as_bytes());
        out.extend_from_slice(b"\",\"key\":");
        serde_json::to_writer(&mut *out, &self.key)?;
        if let Some(Hex(lease)) = self.lease {
            out.extend_from_slice(b",\"lease\":\"");
            out.extend_from_slice(hex(lease, &mut [0; 16]).as_bytes());
            out.push(b'"');
        }
        if let Some(deadline) = self.lease_deadline_ms {
            out.extend_from_slice(b",\"lease_deadline_ms\":");
            match deadline {
                Some(ms) => number(out, ms),
                None => out.extend_from_slice(b"null"),
            }
        }
        if let Some(msg) = self.msg {
            // One of this module's fixed messages.
            out.extend_from_slice(b",\"msg\":");
            serde_json::to_writer(&mut *out, msg)?;
        }
        out.extend_from_slice(b",\"namespace\":");
        serde_json::to_writer(&mut *out, self.namespace)?;
        out.extend_from_slice(b",\"number\":");
        match self.number {
            Some(n) => number(out, n),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"priority\":");
        number(out, self.priority.into());
        out.extend_from_slice(b",\"queue\":");
        serde_json::to_writer(&mut *out, self.queue)?;
        out.extend_from_slice(b",\"remain_tries\":");
        number(out, self.remain_tries.into());
        out.extend_from_slice(b",\"state\":\"");
        out.extend_from_slice(self.state.as_bytes());
        out.extend_from_slice(b"\",\"ttl\":");
        number(out, self.ttl);
        out.push(b'}');
        Ok(())
    }

    /// About how long the answer's JSON is: its fixed part, the body in base64, and the
    /// client's key and attributes.
    pub(crate) fn json_len(&self) -> usize {
        let attributes: usize =
            self.attributes.map_or(0, |a| a.iter().map(|(k, v)| k.len() + v.len() + 6).sum());
        let key = self.key.map_or(0, str::len);
        400 + base64::encoded_len(self.data.len(), true).unwrap_or(0)
            + key
            + attributes
            + self.namespace.len()
            + self.queue.len()
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

/// Reserved jobs as a JSON answer (`status` 200): one object, or an array of them when
/// `array` (a reserve of more than one), written by [`JobAnswer::write_json`] into a buffer
/// sized once.
pub(crate) fn answers(answers: &[JobAnswer<'_>], array: bool) -> Response {
    let len = answers.iter().map(|a| a.json_len() + 1).sum::<usize>() + 2;
    let mut text = Vec::with_capacity(len);
    let written = write_answers(answers, array, &mut text);
    json_response(StatusCode::OK, written, text)
}

fn write_answers(
    answers: &[JobAnswer<'_>],
    array: bool,
    text: &mut Vec<u8>,
) -> serde_json::Result<()> {
    if array {
        text.push(b'[');
    }
    for (i, answer) in answers.iter().enumerate() {
        if i > 0 {
            text.push(b',');
        }
        answer.write_json(text)?;
    }
    if array {
        text.push(b']');
    }
    Ok(())
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
    json(status, &Answer { job_id: r.id, msg }, 64)
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

    /// What [`JobAnswer::write_json`] writes, as text.
    fn written(answer: &JobAnswer<'_>) -> String {
        let mut out = Vec::new();
        answer.write_json(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn answers_written_by_hand_are_the_bytes_serde_writes() {
        let mut jobs = Vec::new();
        for len in [0, 1, 2, 3, 100, 384, 385, 5_000] {
            let mut j = stored_job();
            j.body = (0..len).map(|i| (i * 7 % 256) as u8).collect();
            jobs.push(j);
        }
        let mut j = stored_job();
        // Everything a client names, with characters JSON escapes.
        j.queue = QueueName::new("n\"s\\", "q\u{1}\n\u{7f}é");
        j.key = Some("k\"\t\u{2028}".into());
        j.attributes.insert("a\"".into(), "b\\\r".into());
        j.attributes.insert("plain".into(), String::new());
        j.number = u64::MAX;
        j.id = JobId(u128::MAX);
        j.expires_ms = None;
        j.priority = u32::MAX;
        j.attempts = u16::MAX;
        jobs.push(j);
        jobs.push(Job { lease: None, ..stored_job() });
        let many = [true, false, true];
        let acks = [None, Some(Acked::One(true)), Some(Acked::One(false)), Acked::of(&many)];
        for j in &jobs {
            assert_eq!(written(&job(j, 2_000)), text(job(j, 2_000)));
            for lease in [0, 1, 0xabc, u64::MAX] {
                let d = Delivery { job: j.clone(), lease };
                for acked in acks {
                    let answer = delivery(&d, 2_000, acked);
                    assert_eq!(written(&answer), text(&answer), "lease {lease}, {acked:?}");
                }
            }
        }
        // One answer as an object, several as an array, each exactly as serde has them.
        let ds: Vec<_> = jobs.iter().map(|j| Delivery { job: j.clone(), lease: 9 }).collect();
        let all: Vec<_> = ds.iter().map(|d| delivery(d, 2_000, None)).collect();
        let body = |resp: Response| {
            assert_eq!(resp.status(), StatusCode::OK);
            assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
            let bytes =
                futures::executor::block_on(axum::body::to_bytes(resp.into_body(), 1 << 20));
            String::from_utf8(bytes.unwrap().to_vec()).unwrap()
        };
        assert_eq!(body(answers(&all, true)), text(&all));
        assert_eq!(body(answers(&all[..1], false)), text(&all[0]));
    }

    #[test]
    fn leases_are_lower_case_hex_without_leading_zeros() {
        for n in [0, 1, 9, 10, 15, 16, 255, 0xabc, u64::from(u32::MAX), u64::MAX - 1, u64::MAX] {
            assert_eq!(hex(n, &mut [0; 16]), format!("{n:x}"));
        }
    }

    #[test]
    fn bodies_of_any_length_are_base64_and_answers_are_json_with_their_type() {
        for len in [0, 1, 2, 3, 100, 384, 385, 10_000] {
            let mut j = stored_job();
            j.body = (0..len).map(|i| (i * 7 % 256) as u8).collect();
            let want = base64::engine::general_purpose::STANDARD.encode(&j.body);
            let answer = job(&j, 2_000);
            let v: Value = serde_json::from_str(&text(&answer)).unwrap();
            assert_eq!(v["data"], want, "{len} bytes");
            assert_eq!(v["job_id"], JobId(7).to_string());
            assert!(answer.json_len() >= text(&answer).len(), "{len} bytes: room for the text");
        }
        let resp = json(StatusCode::CREATED, &job(&stored_job(), 2_000), 0);
        assert_eq!(resp.status(), StatusCode::CREATED);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
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
