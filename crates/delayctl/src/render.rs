//! Human output: aligned tables and `key  value` lines built from the server's JSON.
//!
//! Everything here reads JSON defensively: a missing or oddly typed field shows as `-`, never
//! a panic, so a newer or older server still renders.
//!
//! Times are shown for people ([`crate::time`]): a field the API names `*_ms` that holds a
//! point in time is shown without the suffix as RFC 3339 UTC with how far it is from `now`
//! (e.g. `due_at  2026-01-01T03:00:00Z (in 4m12s)`), and one that holds a duration as a
//! duration with units (`timeout  10s`). Every function that shows a point in time takes
//! `now`, unix milliseconds, so that its output can be tested.

use base64::Engine;
use serde_json::Value;

use crate::time;

/// A field as table text: strings unquoted, `null` or missing as `-`, lists comma-separated.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        Value::Array(items) if items.is_empty() => "-".to_string(),
        Value::Array(items) => items.iter().map(cell).collect::<Vec<_>>().join(","),
        Value::Object(m) if m.is_empty() => "-".to_string(),
        Value::Object(m) => {
            m.iter().map(|(k, v)| format!("{k}={}", cell(v))).collect::<Vec<_>>().join(",")
        }
        other => other.to_string(),
    }
}

/// A point in time given in unix milliseconds, for people: RFC 3339 UTC and how far it is
/// from `now`; `-` when absent.
pub fn instant(v: &Value, now: i64) -> String {
    match v.as_i64() {
        Some(ms) => time::instant(ms, now),
        None => cell(v),
    }
}

/// A duration given in milliseconds, with units (`1h2m`); `-` when absent.
pub fn millis(v: &Value) -> String {
    match v.as_u64() {
        Some(ms) => time::duration(ms),
        None => cell(v),
    }
}

/// A duration given in seconds, with units; `never` for 0 when `zero_is_never` (a ttl).
pub fn seconds(v: &Value, zero_is_never: bool) -> String {
    match v.as_u64() {
        Some(0) if zero_is_never => "never".to_string(),
        Some(s) => time::duration(s.saturating_mul(1_000)),
        None => cell(v),
    }
}

/// Rows under a header, each column as wide as its widest cell, two spaces apart.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = line(header.iter().copied(), &widths);
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str), &widths));
    }
    out
}

fn line<'a>(cells: impl Iterator<Item = &'a str>, widths: &[usize]) -> String {
    let padded: Vec<String> = cells.zip(widths).map(|(c, w)| format!("{c:<w$}", w = *w)).collect();
    format!("{}\n", padded.join("  ").trim_end())
}

/// `key  value` lines with the values aligned.
pub fn pairs(items: &[(&str, String)]) -> String {
    let width = items.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    items.iter().map(|(k, v)| format!("{k:<width$}  {v}\n")).collect()
}

/// A job body from its base64 `data`: the text if it is UTF-8, else the base64 itself.
/// The flag says whether it is text.
pub fn body(job: &Value) -> (String, bool) {
    let data = job["data"].as_str().unwrap_or_default();
    match base64::engine::general_purpose::STANDARD.decode(data) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => (text, true),
            Err(_) => (data.to_string(), false),
        },
        Err(_) => (data.to_string(), false),
    }
}

/// A body shortened to one table cell: control characters escaped, at most `max` characters.
fn preview(job: &Value, max: usize) -> String {
    let (text, is_text) = body(job);
    let text: String = if is_text { text.escape_debug().collect() } else { format!("b64:{text}") };
    if text.chars().count() <= max {
        return text;
    }
    let mut short: String = text.chars().take(max.saturating_sub(1)).collect();
    short.push('…');
    short
}

/// One job (a delivery or a peeked job): its fields, then its body. `ttl` is the time left
/// before it expires, `age` the time since it was published.
pub fn job(job: &Value, now: i64) -> String {
    let mut items: Vec<(&str, String)> = vec![("id", cell(&job["job_id"]))];
    for field in ["queue", "state", "attempt", "lease"] {
        if !job[field].is_null() {
            items.push((field, cell(&job[field])));
        }
    }
    if !job["lease_deadline_ms"].is_null() {
        items.push(("lease_until", instant(&job["lease_deadline_ms"], now)));
    }
    for field in ["remain_tries", "priority"] {
        if !job[field].is_null() {
            items.push((field, cell(&job[field])));
        }
    }
    items.push(("due_at", instant(&job["due_at_ms"], now)));
    items.push(("ttl", seconds(&job["ttl"], true)));
    if !job["elapsed_ms"].is_null() {
        items.push(("age", millis(&job["elapsed_ms"])));
    }
    for field in ["key", "attributes"] {
        if !job[field].is_null() {
            items.push((field, cell(&job[field])));
        }
    }
    let (text, is_text) = body(job);
    items.push((if is_text { "body" } else { "body_base64" }, text));
    pairs(&items)
}

/// Jobs as blocks of [`job`], a blank line apart.
pub fn jobs(jobs: &[Value], now: i64) -> String {
    jobs.iter().map(|j| job(j, now)).collect::<Vec<_>>().join("\n")
}

/// `GET /admin/cluster`: the leader line, then a row per node (and the error of each
/// unreachable one).
pub fn cluster(c: &Value) -> String {
    let mut out = pairs(&[
        ("leader", cell(&c["leader"])),
        ("term", cell(&c["term"])),
        ("voters", cell(&c["voters"])),
        ("learners", cell(&c["learners"])),
        ("answered_by", cell(&c["node_id"])),
    ]);
    out.push('\n');
    let columns = [
        "id",
        "addr",
        "role",
        "state",
        "term",
        "last_log_index",
        "last_applied",
        "lag",
        "reachable",
    ];
    let nodes = c["nodes"].as_array().map(Vec::as_slice).unwrap_or_default();
    let rows: Vec<Vec<String>> =
        nodes.iter().map(|n| columns.iter().map(|f| cell(&n[*f])).collect()).collect();
    out.push_str(&table(&columns, &rows));
    for n in nodes.iter().filter(|n| !n["error"].is_null()) {
        out.push_str(&format!("node {}: {}\n", cell(&n["id"]), cell(&n["error"])));
    }
    out
}

/// `GET /token/{ns}`: one row per token, from `details` when the server gives them.
pub fn tokens(t: &Value, now: i64) -> String {
    let columns = ["token", "description", "created", "read_limit", "write_limit"];
    let rows: Vec<Vec<String>> = match t["details"].as_array() {
        Some(details) => details
            .iter()
            .map(|d| {
                vec![
                    cell(&d["token"]),
                    cell(&d["description"]),
                    instant(&d["created_ms"], now),
                    cell(&d["read_limit"]),
                    cell(&d["write_limit"]),
                ]
            })
            .collect(),
        None => t["tokens"].as_object().map_or_else(Vec::new, |m| {
            m.iter().map(|(tok, desc)| vec![tok.clone(), cell(desc)]).collect()
        }),
    };
    table(&columns, &rows)
}

/// `GET /api/{ns}/{q}/stats`: counts, then the cumulative due-time histogram (how many
/// delayed jobs come due within each time from now).
pub fn stats(s: &Value) -> String {
    let mut items: Vec<(&str, String)> = Vec::new();
    for field in ["paused", "delayed", "ready", "reserved", "dead"] {
        items.push((field, cell(&s[field])));
    }
    items.push(("head_age", millis(&s["head_age_ms"])));
    let mut out = pairs(&items);
    let buckets = s["due_histogram"].as_array().map(Vec::as_slice).unwrap_or_default();
    if !buckets.is_empty() {
        let rows: Vec<Vec<String>> = buckets
            .iter()
            .map(|b| {
                let le =
                    if b["le_ms"].is_null() { "+inf".to_string() } else { millis(&b["le_ms"]) };
                vec![le, cell(&b["count"])]
            })
            .collect();
        out.push_str("\ndue within (cumulative)\n");
        out.push_str(&table(&["within", "count"], &rows));
    }
    out
}

/// `GET /admin/queues`: one row per queue, and a last line when the list was cut short.
pub fn queues(q: &Value) -> String {
    let columns = ["namespace", "queue", "paused", "delayed", "ready", "reserved", "dead"];
    let list = q["queues"].as_array().map(Vec::as_slice).unwrap_or_default();
    let rows: Vec<Vec<String>> =
        list.iter().map(|q| columns.iter().map(|f| cell(&q[*f])).collect()).collect();
    let mut out = table(&columns, &rows);
    if q["truncated"] == true {
        out.push_str(&format!("(first {} queues only: raise --limit)\n", list.len()));
    }
    out
}

/// `GET /api/{ns}/{q}/deadletter/jobs`: the size, then one row per dead job.
pub fn dead_jobs(d: &Value) -> String {
    let mut out = pairs(&[("size", cell(&d["size"]))]);
    let list = d["jobs"].as_array().map(Vec::as_slice).unwrap_or_default();
    if !list.is_empty() {
        let rows: Vec<Vec<String>> = list
            .iter()
            .map(|j| {
                let mut row: Vec<String> =
                    ["job_id", "attempt", "priority", "key"].iter().map(|f| cell(&j[*f])).collect();
                row.push(preview(j, 60));
                row
            })
            .collect();
        out.push('\n');
        out.push_str(&table(&["id", "attempt", "priority", "key", "body"], &rows));
    }
    out
}

/// `/api/{ns}/{q}/webhook`: its settings, and its secret when the answer has it (a set).
pub fn webhook(w: &Value) -> String {
    let mut items: Vec<(&str, String)> = vec![
        ("url", cell(&w["url"])),
        ("timeout", millis(&w["timeout_ms"])),
        ("max_in_flight", cell(&w["max_in_flight"])),
        ("rate_per_s", cell(&w["rate_per_s"])),
        ("backoff_initial", millis(&w["backoff_initial_ms"])),
        ("backoff_max", millis(&w["backoff_max_ms"])),
    ];
    if !w["secret"].is_null() {
        items.push(("secret", cell(&w["secret"])));
    }
    pairs(&items)
}

/// A schedule's timetable in one cell: `cron <expr> (<zone>)` or `every <duration>`.
pub fn timetable(s: &Value) -> String {
    if !s["cron"].is_null() {
        format!("cron {} ({})", cell(&s["cron"]), cell(&s["tz"]))
    } else if !s["every_ms"].is_null() {
        format!("every {}", millis(&s["every_ms"]))
    } else {
        "-".to_string()
    }
}

/// `/api/{ns}/{q}/schedules/{name}`: its timetable and window, then the job it publishes.
/// `next_at` is `-` once the window has no occurrence left.
pub fn schedule(s: &Value, now: i64) -> String {
    let mut items: Vec<(&str, String)> = vec![
        ("name", cell(&s["name"])),
        ("timetable", timetable(s)),
        ("next_at", instant(&s["next_at_ms"], now)),
        ("start_at", instant(&s["start_at_ms"], now)),
        ("end_at", instant(&s["end_at_ms"], now)),
        ("catch_up", cell(&s["catch_up"])),
        ("ttl", seconds(&s["ttl"], true)),
        ("tries", cell(&s["tries"])),
        ("ttr", seconds(&s["ttr"], false)),
        ("priority", cell(&s["priority"])),
        ("attributes", cell(&s["attributes"])),
    ];
    let (text, is_text) = body(s);
    items.push((if is_text { "body" } else { "body_base64" }, text));
    pairs(&items)
}

/// `GET /api/{ns}/{q}/schedules`: one row per schedule.
pub fn schedules(list: &Value, now: i64) -> String {
    let list = list["schedules"].as_array().map(Vec::as_slice).unwrap_or_default();
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|s| vec![cell(&s["name"]), timetable(s), instant(&s["next_at_ms"], now)])
        .collect();
    table(&["name", "timetable", "next_at"], &rows)
}

/// `GET /health`: the answering node's own view of the cluster.
pub fn health(h: &Value) -> String {
    let fields = ["node_id", "state", "leader", "term", "last_log_index", "last_applied"];
    let items: Vec<(&str, String)> = fields.iter().map(|f| (*f, cell(&h[*f]))).collect();
    pairs(&items)
}

/// `GET /api/{ns}/{q}/deadletter`: the dead letter's size and its oldest job's id.
pub fn dead_head(d: &Value) -> String {
    let head = match d["deadletter_head"].as_str() {
        Some("") | None => "-".to_string(),
        Some(id) => id.to_string(),
    };
    pairs(&[("size", cell(&d["deadletter_size"])), ("head", head)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_align_and_trim() {
        let t =
            table(&["id", "name"], &[vec!["1".into(), "a".into()], vec!["22".into(), "".into()]]);
        assert_eq!(t, "id  name\n1   a\n22\n");
    }

    #[test]
    fn cells_never_fail() {
        assert_eq!(cell(&json!(null)), "-");
        assert_eq!(cell(&json!([1, 2, 3])), "1,2,3");
        assert_eq!(cell(&json!({"a": "x"})), "a=x");
        assert_eq!(cell(&json!(true)), "true");
        assert_eq!(cell(&json!({"nodes": 3})["missing"]), "-");
    }

    #[test]
    fn bodies_decode_as_text_or_stay_base64() {
        assert_eq!(body(&json!({"data": "aGVsbG8="})), ("hello".to_string(), true));
        assert_eq!(body(&json!({"data": "/w=="})), ("/w==".to_string(), false));
        assert_eq!(body(&json!({"data": "not base64!"})), ("not base64!".to_string(), false));
        assert_eq!(body(&json!({})), (String::new(), true));
        let long = base64::engine::general_purpose::STANDARD.encode("line\n".repeat(20));
        assert_eq!(preview(&json!({"data": long}), 12), "line\\nline\\…");
    }

    #[test]
    fn cluster_status() {
        let c = json!({
            "node_id": 2, "leader": 1, "term": 3, "voters": [1, 2, 3], "learners": [],
            "nodes": [
                {"id": 1, "addr": "127.0.0.1:7871", "role": "voter", "state": "Leader", "term": 3,
                 "last_log_index": 10, "last_applied": 10, "lag": 0, "reachable": true},
                {"id": 3, "addr": "127.0.0.1:7873", "role": "voter", "reachable": false,
                 "error": "connection refused"}
            ]
        });
        let want = "\
leader       1
term         3
voters       1,2,3
learners     -
answered_by  2

id  addr            role   state   term  last_log_index  last_applied  lag  reachable
1   127.0.0.1:7871  voter  Leader  3     10              10            0    true
3   127.0.0.1:7873  voter  -       -     -               -             -    false
node 3: connection refused
";
        assert_eq!(cluster(&c), want);
    }

    #[test]
    fn queue_list_and_tokens() {
        let q = json!({"queues": [{"namespace": "ns", "queue": "emails", "paused": false,
            "delayed": 3, "ready": 1, "reserved": 0, "dead": 2}], "truncated": true});
        assert_eq!(
            queues(&q),
            "namespace  queue   paused  delayed  ready  reserved  dead\n\
             ns         emails  false   3        1      0         2\n\
             (first 1 queues only: raise --limit)\n"
        );
        let t = json!({"namespace": "ns1", "tokens": {"t1": "ci"}});
        assert_eq!(
            tokens(&t, 0),
            "token  description  created  read_limit  write_limit\nt1     ci\n"
        );
        let t = json!({"details": [{"token": "t1", "description": "ci",
            "created_ms": 1_767_225_600_000u64, "read_limit": 0, "write_limit": 5}]});
        let out = tokens(&t, 1_767_225_600_000 + 2 * 3_600_000);
        assert!(
            out.ends_with("t1     ci           2026-01-01T00:00:00Z (2h ago)  0           5\n"),
            "{out}"
        );
    }

    #[test]
    fn stats_with_histogram() {
        let s = json!({"paused": false, "delayed": 2, "ready": 0, "reserved": 0, "dead": 0,
            "head_age_ms": null,
            "due_histogram": [{"le_ms": 60000, "count": 1}, {"le_ms": null, "count": 2}]});
        let out = stats(&s);
        assert!(out.starts_with("paused    false\ndelayed   2\n"), "{out}");
        assert!(out.contains("\nhead_age  -\n"), "{out}");
        assert!(out.ends_with("within  count\n1m      1\n+inf    2\n"), "{out}");
        let aged = stats(&json!({"head_age_ms": 252_000}));
        assert!(aged.contains("\nhead_age  4m12s\n"), "{aged}");
    }

    #[test]
    fn webhooks_show_the_secret_only_when_given() {
        let w = json!({"namespace": "ns", "queue": "q", "url": "http://h/x", "timeout_ms": 10000,
            "max_in_flight": 32, "rate_per_s": 0, "backoff_initial_ms": 1000,
            "backoff_max_ms": 300000});
        let out = webhook(&w);
        assert_eq!(
            out,
            "url              http://h/x\ntimeout          10s\nmax_in_flight    32\n\
             rate_per_s       0\nbackoff_initial  1s\nbackoff_max      5m\n"
        );
        let mut with_secret = w.clone();
        with_secret["secret"] = json!("s3cr3t");
        assert!(webhook(&with_secret).ends_with("secret           s3cr3t\n"));
    }

    #[test]
    fn schedules_as_a_table_and_one_by_one() {
        let list = json!({"schedules": [
            {"name": "nightly", "cron": "0 0 3 * * *", "tz": "Europe/Paris",
             "next_at_ms": 1767225600000u64},
            {"name": "tick", "every_ms": 60000, "next_at_ms": null}]});
        let now = 1_767_225_600_000 - 252_000;
        assert_eq!(
            schedules(&list, now),
            "name     timetable                        next_at\n\
             nightly  cron 0 0 3 * * * (Europe/Paris)  2026-01-01T00:00:00Z (in 4m12s)\n\
             tick     every 1m                         -\n"
        );
        let s = json!({"name": "tick", "every_ms": 60000, "next_at_ms": 5, "ttl": 0,
            "ttr": 60, "attributes": {}, "data": "aGk="});
        let out = schedule(&s, 3_725);
        assert!(out.starts_with("name        tick\ntimetable   every 1m\n"), "{out}");
        assert!(out.contains("\nnext_at     1970-01-01T00:00:00.005Z (3s ago)\n"), "{out}");
        assert!(out.contains("\nstart_at    -\n"), "{out}");
        assert!(out.contains("\nttl         never\n"), "{out}");
        assert!(out.contains("\nttr         1m\n") && out.ends_with("body        hi\n"), "{out}");
    }

    #[test]
    fn a_delivery() {
        let j = json!({"msg": "new job", "job_id": "01KA", "queue": "q", "attempt": 1,
            "lease": "9f", "lease_deadline_ms": 1_767_225_630_000u64, "remain_tries": 0,
            "priority": 1024, "due_at_ms": 1_767_225_000_000u64, "ttl": 86400,
            "elapsed_ms": 3_720_000, "attributes": null, "key": null, "data": "aGk="});
        let out = job(&j, 1_767_225_600_000);
        assert_eq!(
            out,
            "id            01KA\n\
             queue         q\n\
             attempt       1\n\
             lease         9f\n\
             lease_until   2026-01-01T00:00:30Z (in 30s)\n\
             remain_tries  0\n\
             priority      1024\n\
             due_at        2025-12-31T23:50:00Z (10m ago)\n\
             ttl           1d\n\
             age           1h2m\n\
             body          hi\n"
        );
        let never = job(&json!({"job_id": "x", "ttl": 0, "due_at_ms": 0}), 0);
        assert!(never.contains("\nttl     never\n"), "{never}");
    }
}
