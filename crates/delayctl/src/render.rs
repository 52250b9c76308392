//! Human output: aligned tables and `key  value` lines built from the server's JSON.
//!
//! Everything here reads JSON defensively: a missing or oddly typed field shows as `-`, never
//! a panic, so a newer or older server still renders.

use base64::Engine;
use serde_json::Value;

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

/// One job (a delivery or a peeked job): its fields, then its body.
pub fn job(job: &Value) -> String {
    let mut items: Vec<(&str, String)> = vec![("id", cell(&job["job_id"]))];
    for field in ["queue", "state", "attempt", "lease", "remain_tries", "priority"] {
        if !job[field].is_null() {
            items.push((field, cell(&job[field])));
        }
    }
    items.push(("due_at_ms", cell(&job["due_at_ms"])));
    items.push(("ttl", format!("{} s", cell(&job["ttl"]))));
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
pub fn jobs(jobs: &[Value]) -> String {
    jobs.iter().map(job).collect::<Vec<_>>().join("\n")
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
pub fn tokens(t: &Value) -> String {
    let columns = ["token", "description", "created_ms", "read_limit", "write_limit"];
    let rows: Vec<Vec<String>> = match t["details"].as_array() {
        Some(details) => {
            details.iter().map(|d| columns.iter().map(|f| cell(&d[*f])).collect()).collect()
        }
        None => t["tokens"].as_object().map_or_else(Vec::new, |m| {
            m.iter().map(|(tok, desc)| vec![tok.clone(), cell(desc)]).collect()
        }),
    };
    table(&columns, &rows)
}

/// `GET /api/{ns}/{q}/stats`: counts, then the cumulative due-time histogram.
pub fn stats(s: &Value) -> String {
    let mut items: Vec<(&str, String)> = Vec::new();
    for field in ["paused", "delayed", "ready", "reserved", "dead", "head_age_ms"] {
        items.push((field, cell(&s[field])));
    }
    let mut out = pairs(&items);
    let buckets = s["due_histogram"].as_array().map(Vec::as_slice).unwrap_or_default();
    if !buckets.is_empty() {
        let rows: Vec<Vec<String>> = buckets
            .iter()
            .map(|b| {
                let le = if b["le_ms"].is_null() { "+inf".to_string() } else { cell(&b["le_ms"]) };
                vec![le, cell(&b["count"])]
            })
            .collect();
        out.push_str("\ndue within (cumulative)\n");
        out.push_str(&table(&["le_ms", "count"], &rows));
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
    let mut items: Vec<(&str, String)> = Vec::new();
    for field in [
        "url",
        "timeout_ms",
        "max_in_flight",
        "rate_per_s",
        "backoff_initial_ms",
        "backoff_max_ms",
        "secret",
    ] {
        if field != "secret" || !w[field].is_null() {
            items.push((field, cell(&w[field])));
        }
    }
    pairs(&items)
}

/// A schedule's timetable in one cell: `cron <expr> (<zone>)` or `every <n> ms`.
pub fn timetable(s: &Value) -> String {
    if !s["cron"].is_null() {
        format!("cron {} ({})", cell(&s["cron"]), cell(&s["tz"]))
    } else if !s["every_ms"].is_null() {
        format!("every {} ms", cell(&s["every_ms"]))
    } else {
        "-".to_string()
    }
}

/// `/api/{ns}/{q}/schedules/{name}`: its timetable and window, then the job it publishes.
/// `next_at_ms` is `-` once the window has no occurrence left.
pub fn schedule(s: &Value) -> String {
    let mut items: Vec<(&str, String)> = vec![
        ("name", cell(&s["name"])),
        ("timetable", timetable(s)),
        ("next_at_ms", cell(&s["next_at_ms"])),
        ("start_at_ms", cell(&s["start_at_ms"])),
        ("end_at_ms", cell(&s["end_at_ms"])),
        ("catch_up", cell(&s["catch_up"])),
        ("ttl", format!("{} s", cell(&s["ttl"]))),
        ("tries", cell(&s["tries"])),
        ("ttr", format!("{} s", cell(&s["ttr"]))),
        ("priority", cell(&s["priority"])),
        ("attributes", cell(&s["attributes"])),
    ];
    let (text, is_text) = body(s);
    items.push((if is_text { "body" } else { "body_base64" }, text));
    pairs(&items)
}

/// `GET /api/{ns}/{q}/schedules`: one row per schedule.
pub fn schedules(list: &Value) -> String {
    let list = list["schedules"].as_array().map(Vec::as_slice).unwrap_or_default();
    let rows: Vec<Vec<String>> =
        list.iter().map(|s| vec![cell(&s["name"]), timetable(s), cell(&s["next_at_ms"])]).collect();
    table(&["name", "timetable", "next_at_ms"], &rows)
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
            tokens(&t),
            "token  description  created_ms  read_limit  write_limit\nt1     ci\n"
        );
    }

    #[test]
    fn stats_with_histogram() {
        let s = json!({"paused": false, "delayed": 2, "ready": 0, "reserved": 0, "dead": 0,
            "head_age_ms": null,
            "due_histogram": [{"le_ms": 60000, "count": 1}, {"le_ms": null, "count": 2}]});
        let out = stats(&s);
        assert!(out.starts_with("paused       false\ndelayed      2\n"), "{out}");
        assert!(out.ends_with("le_ms  count\n60000  1\n+inf   2\n"), "{out}");
    }

    #[test]
    fn webhooks_show_the_secret_only_when_given() {
        let w = json!({"namespace": "ns", "queue": "q", "url": "http://h/x", "timeout_ms": 10000,
            "max_in_flight": 32, "rate_per_s": 0, "backoff_initial_ms": 1000,
            "backoff_max_ms": 300000});
        let out = webhook(&w);
        assert!(out.starts_with("url                 http://h/x\n"), "{out}");
        assert!(!out.contains("secret"), "{out}");
        let mut with_secret = w.clone();
        with_secret["secret"] = json!("s3cr3t");
        assert!(webhook(&with_secret).ends_with("secret              s3cr3t\n"));
    }

    #[test]
    fn schedules_as_a_table_and_one_by_one() {
        let list = json!({"schedules": [
            {"name": "nightly", "cron": "0 0 3 * * *", "tz": "Europe/Paris",
             "next_at_ms": 1767225600000u64},
            {"name": "tick", "every_ms": 60000, "next_at_ms": null}]});
        assert_eq!(
            schedules(&list),
            "name     timetable                        next_at_ms\n\
             nightly  cron 0 0 3 * * * (Europe/Paris)  1767225600000\n\
             tick     every 60000 ms                   -\n"
        );
        let s = json!({"name": "tick", "every_ms": 60000, "next_at_ms": 5, "ttl": 0,
            "ttr": 60, "attributes": {}, "data": "aGk="});
        let out = schedule(&s);
        assert!(out.starts_with("name         tick\ntimetable    every 60000 ms\n"), "{out}");
        assert!(out.contains("\nttr          60 s\n") && out.ends_with("body         hi\n"));
    }

    #[test]
    fn a_delivery() {
        let j = json!({"msg": "new job", "job_id": "01KA", "queue": "q", "attempt": 1,
            "lease": "9f", "remain_tries": 0, "priority": 1024, "due_at_ms": 5, "ttl": 86400,
            "attributes": null, "key": null, "data": "aGk="});
        let out = job(&j);
        assert!(out.starts_with("id            01KA\nqueue         q\n"), "{out}");
        assert!(out.ends_with("body          hi\n"), "{out}");
        assert!(!out.contains("attributes"), "{out}");
    }
}
