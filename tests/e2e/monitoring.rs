//! The monitoring kit (`deploy/monitoring/`) against real nodes: every `delayd_*` metric that
//! an alert rule, a rule unit test or a dashboard query names is one a running cluster
//! exports, with the labels the query selects on. A renamed metric, a misspelling or a label
//! that does not exist would otherwise leave an alert that never fires or a panel that stays
//! empty, and nothing else would say so. (`scripts/check-monitoring.sh` checks the syntax
//! with promtool; this checks the names.)
//!
//! Also: `delayd_build_info` and `delayd --version` name the build the binary came from.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use delayd_tests::{delayd_bin, eventually, free_port, Cluster};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use yaml_rust2::{Yaml, YamlLoader};

/// The admin token every node of the test cluster shares.
const ADMIN: &str = "monitoring-test-admin-token-0123";

/// Labels Prometheus attaches to every scraped series itself.
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

// ---- what the kit refers to ----

/// A metric the kit names, with the label names its selector matches on (`name{a="x"}`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Reference {
    metric: String,
    labels: Vec<String>,
}

/// Every `delayd_*` metric named in `text`, with its selector's label names. A name is a
/// maximal run of `[a-zA-Z0-9_:]` starting with `delayd_`.
fn references(text: &str) -> Vec<Reference> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("delayd_") {
        let preceded = rest[..at].chars().next_back().is_some_and(is_name);
        let tail = &rest[at..];
        let len = tail.find(|c: char| !is_name(c)).unwrap_or(tail.len());
        let (metric, after) = tail.split_at(len);
        rest = after;
        if preceded {
            continue;
        }
        let labels = match after.strip_prefix('{') {
            Some(selector) => selector_labels(selector),
            None => Vec::new(),
        };
        found.push(Reference { metric: metric.to_string(), labels });
    }
    found
}

/// The label names of a selector's matchers: `a="x", b=~"y|z"}...` gives `a`, `b`.
fn selector_labels(selector: &str) -> Vec<String> {
    let mut labels = Vec::new();
    let mut name = String::new();
    let mut chars = selector.chars();
    while let Some(c) = chars.next() {
        match c {
            '}' => break,
            '"' => {
                // A quoted value: skip to its closing quote, past escaped ones.
                while let Some(v) = chars.next() {
                    match v {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '=' | '!' | '~' => {
                if !name.trim().is_empty() {
                    labels.push(name.trim().to_string());
                }
                name.clear();
            }
            ',' => name.clear(),
            c => name.push(c),
        }
    }
    labels
}

/// Every string scalar of a YAML document tree (comments are not part of it).
fn yaml_strings(y: &Yaml, out: &mut Vec<String>) {
    match y {
        Yaml::String(s) => out.push(s.clone()),
        Yaml::Array(items) => items.iter().for_each(|i| yaml_strings(i, out)),
        Yaml::Hash(map) => map.iter().for_each(|(k, v)| {
            yaml_strings(k, out);
            yaml_strings(v, out);
        }),
        _ => {}
    }
}

/// Every string of a JSON tree.
fn json_strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|i| json_strings(i, out)),
        Value::Object(map) => map.values().for_each(|i| json_strings(i, out)),
        _ => {}
    }
}

/// The kit's files, each with the references in its strings.
fn kit_references() -> Result<Vec<(String, Vec<Reference>)>> {
    let dir = repo().join("deploy/monitoring");
    let mut files = Vec::new();
    for name in ["delayd.rules.yml", "rules-test.yml"] {
        let text = std::fs::read_to_string(dir.join(name)).with_context(|| name.to_string())?;
        let docs = YamlLoader::load_from_str(&text).with_context(|| format!("{name}: YAML"))?;
        let mut strings = Vec::new();
        docs.iter().for_each(|d| yaml_strings(d, &mut strings));
        files.push((name.to_string(), strings.iter().flat_map(|s| references(s)).collect()));
    }
    let name = "delayd-dashboard.json";
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(name))?)
        .with_context(|| format!("{name}: JSON"))?;
    let mut strings = Vec::new();
    json_strings(&dashboard, &mut strings);
    files.push((name.to_string(), strings.iter().flat_map(|s| references(s)).collect()));
    Ok(files)
}

// ---- what a node exports ----

/// Sample names in an exposition text (`x_bucket`, `x_sum`, `x_count` for a histogram `x`),
/// each with every label name seen on it.
fn exported(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = names.entry(line[..end].to_string()).or_default();
        if let Some(selector) = line[end..].strip_prefix('{') {
            labels.extend(selector_labels(selector));
        }
    }
    names
}

/// What the kit names that `exported` lacks: unknown metrics, and labels a metric never has.
fn missing(
    references: &[Reference],
    exported: &BTreeMap<String, BTreeSet<String>>,
) -> BTreeSet<String> {
    let mut missing = BTreeSet::new();
    for r in references {
        match exported.get(&r.metric) {
            None => {
                missing.insert(format!("metric {}", r.metric));
            }
            Some(has) => {
                for l in &r.labels {
                    if !has.contains(l) && !TARGET_LABELS.contains(&l.as_str()) {
                        missing.insert(format!("label {l} of {}", r.metric));
                    }
                }
            }
        }
    }
    missing
}

#[test]
fn the_check_catches_misspelled_metrics_and_labels() {
    let scrape = "# HELP delayd_jobs Jobs.\n# TYPE delayd_jobs gauge\n\
                  delayd_jobs{namespace=\"a\",queue=\"b\",state=\"ready\"} 1\n\
                  delayd_log_append_seconds_bucket{le=\"0.001\"} 3\n\
                  delayd_log_append_seconds_count 3\n";
    let exported = exported(scrape);
    let check = |expr: &str| missing(&references(expr), &exported);

    let good = r#"histogram_quantile(0.99, sum by (instance, le) (rate(delayd_log_append_seconds_bucket{job="d"}[5m])))
                  + max by (queue) (delayd_jobs{state=~"ready|dead", namespace!="x"})"#;
    assert_eq!(check(good), BTreeSet::new());
    assert_eq!(
        check("rate(delayd_log_append_second_bucket[5m])"),
        BTreeSet::from(["metric delayd_log_append_second_bucket".to_string()]),
        "a misspelled name"
    );
    assert_eq!(
        check("rate(delayd_log_append_seconds[5m])"),
        BTreeSet::from(["metric delayd_log_append_seconds".to_string()]),
        "a histogram is queried by its _bucket, _sum or _count series"
    );
    assert_eq!(
        check(r#"delayd_jobs{status="ready", queue="x=\"}\""}"#),
        BTreeSet::from(["label status of delayd_jobs".to_string()]),
        "a label the metric does not have (quoted values may hold `=`, `}}` and quotes)"
    );
    // Names inside other names, and the recording-rule style, are not delayd's metrics.
    assert!(references("my_delayd_jobs + delayd:jobs:sum").is_empty());
}

/// GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to `-`.
fn anchor(heading: &str) -> String {
    let lower = heading.trim().to_lowercase();
    let kept = lower.chars().filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '));
    kept.map(|c| if c == ' ' { '-' } else { c }).collect()
}

#[test]
fn every_alert_has_its_section_in_the_runbook() -> Result<()> {
    let rules = std::fs::read_to_string(repo().join("deploy/monitoring/delayd.rules.yml"))?;
    let docs = std::fs::read_to_string(repo().join("docs/monitoring.md"))?;
    let anchors: BTreeSet<String> =
        docs.lines().filter_map(|l| l.strip_prefix("### ")).map(anchor).collect();
    let mut alerts = 0;
    for doc in YamlLoader::load_from_str(&rules)? {
        for group in doc["groups"].as_vec().context("groups")? {
            for rule in group["rules"].as_vec().context("rules")? {
                let Some(alert) = rule["alert"].as_str() else { continue };
                alerts += 1;
                let severity = rule["labels"]["severity"].as_str();
                ensure!(
                    matches!(severity, Some("critical" | "warning" | "info")),
                    "{alert}: severity {severity:?}"
                );
                let runbook = rule["annotations"]["runbook"].as_str().context("no runbook")?;
                let target = runbook
                    .strip_prefix("docs/monitoring.md#")
                    .with_context(|| format!("{alert}: runbook {runbook}"))?;
                ensure!(anchors.contains(target), "{alert}: no section #{target} in monitoring.md");
                ensure!(target == anchor(alert), "{alert}'s runbook is another alert's section");
                for key in ["summary", "description"] {
                    ensure!(rule["annotations"][key].as_str().is_some(), "{alert}: no {key}");
                }
            }
        }
    }
    ensure!(alerts >= 10, "only {alerts} alerts found");
    Ok(())
}

// ---- the live check ----

/// A client that shows the admin token.
fn admin_client() -> Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {ADMIN}").parse()?);
    Ok(reqwest::Client::builder()
        .default_headers(headers)
        .timeout(Duration::from_secs(10))
        .build()?)
}

/// `method url` with `body`; the status and the JSON answer (`Null` when empty).
async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: &str,
) -> Result<(u16, Value)> {
    let resp = http.request(method, url).body(body.to_string()).send().await?;
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await?;
    Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

/// A webhook receiver on loopback that accepts every push; its URL.
async fn receiver() -> Result<String> {
    let app = axum::Router::new().route("/hook", axum::routing::post(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

/// Drives every kind of event whose series exist only once it happened: job transitions of
/// each kind, a 429, a webhook push, a gRPC call and a beanstalkd command.
async fn exercise(cluster: &Cluster, beanstalk_port: u16) -> Result<()> {
    let http = admin_client()?;
    let url = |path: &str| format!("{}{path}", cluster.nodes[0].url);
    use reqwest::Method;
    let job = |v: &Value| v["job_id"].as_str().map(str::to_string).context("no job_id");

    // Publish, reserve, ack; release; a ttr running out on the last try (timed out, dead
    // letter); a bury (dead letter); a ttl running out (expired).
    let (st, v) = call(&http, Method::PUT, &url("/api/mon/q"), "a").await?;
    ensure!(st == 201, "publish: {st} {v}");
    let (st, v) = call(&http, Method::GET, &url("/api/mon/q?ttr=30"), "").await?;
    ensure!(st == 200, "reserve: {st} {v}");
    let id = job(&v)?;
    let (st, v) =
        call(&http, Method::PUT, &url(&format!("/api/mon/q/job/{id}/release")), "").await?;
    ensure!(st < 300, "release: {st} {v}");
    let (_, v) = call(&http, Method::GET, &url("/api/mon/q?ttr=30&timeout=5"), "").await?;
    let id = job(&v)?;
    let (st, v) = call(&http, Method::DELETE, &url(&format!("/api/mon/q/job/{id}")), "").await?;
    ensure!(st == 204, "ack: {st} {v}");
    call(&http, Method::PUT, &url("/api/mon/dl"), "b").await?;
    call(&http, Method::GET, &url("/api/mon/dl?ttr_ms=100"), "").await?;
    call(&http, Method::PUT, &url("/api/mon/bury"), "c").await?;
    let (_, v) = call(&http, Method::GET, &url("/api/mon/bury?ttr=30"), "").await?;
    let id = job(&v)?;
    let (st, v) =
        call(&http, Method::PUT, &url(&format!("/api/mon/bury/job/{id}/bury")), "").await?;
    ensure!(st < 300, "bury: {st} {v}");
    call(&http, Method::PUT, &url("/api/mon/exp?ttl=1"), "d").await?;
    call(&http, Method::PUT, &url("/api/mon/later?delay=600"), "e").await?;

    // A token with a write budget of one a second, spent at once: 429.
    let (st, v) = call(&http, Method::POST, &url("/token/mon?write_limit=1"), "").await?;
    ensure!(st < 300, "token: {st} {v}");
    let token = v["token"].as_str().context("no token")?.to_string();
    let plain = reqwest::Client::new();
    let mut refused = false;
    for _ in 0..5 {
        let resp =
            plain.put(url("/api/mon/limited")).header("x-token", &token).body("x").send().await?;
        refused |= resp.status().as_u16() == 429;
    }
    ensure!(refused, "the token's write limit never refused a request");

    // A webhook push.
    let hook = json!({"url": receiver().await?, "timeout_ms": 2000});
    let (st, v) =
        call(&http, Method::PUT, &url("/api/mon/hook/webhook"), &hook.to_string()).await?;
    ensure!(st == 201, "webhook: {st} {v}");
    call(&http, Method::PUT, &url("/api/mon/hook"), "f").await?;

    // A gRPC publish, through the client library.
    let grpc: Vec<String> = cluster.nodes.iter().map(|n| n.grpc.clone()).collect();
    let options =
        delayd_client::Options { token: Some(ADMIN.into()), ..delayd_client::Options::default() };
    let client = delayd_client::Client::connect_with(&grpc, options).await?;
    client.publish("mon", "grpc", b"g".to_vec(), Default::default()).await?;

    // A beanstalkd command.
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", beanstalk_port)).await?;
    conn.write_all(b"use mon\r\n").await?;
    let mut reply = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut reply)).await??;
    ensure!(reply[..n].starts_with(b"USING mon"), "beanstalkd: {:?}", &reply[..n]);
    Ok(())
}

/// The union of what every node of `cluster` exports (some series exist only on the leader).
async fn scrape_all(cluster: &Cluster) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let http = admin_client()?;
    let mut all: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for node in &cluster.nodes {
        let resp = http.get(format!("{}/metrics", node.url)).send().await?;
        ensure!(resp.status().as_u16() == 200, "scrape {}: {}", node.url, resp.status());
        for (name, labels) in exported(&resp.text().await?) {
            all.entry(name).or_default().extend(labels);
        }
    }
    Ok(all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_metric_the_alerts_and_the_dashboard_name_is_exported() -> Result<()> {
    let files = kit_references()?;
    let distinct: BTreeSet<&str> =
        files.iter().flat_map(|(_, refs)| refs.iter().map(|r| r.metric.as_str())).collect();
    // Not vacuous: the kit queries most of what delayd exports.
    ensure!(distinct.len() >= 30, "only {} metrics found in the kit: {distinct:?}", distinct.len());
    for name in ["delayd.rules.yml", "rules-test.yml", "delayd-dashboard.json"] {
        let refs = files.iter().find(|(f, _)| f == name).map_or(0, |(_, r)| r.len());
        ensure!(refs > 0, "no metric found in {name}");
    }

    let beanstalk = free_port()?;
    let cluster = Cluster::start_each(3, |i| {
        let mut args = vec!["--admin-token".to_string(), ADMIN.to_string()];
        if i == 0 {
            args.extend(["--beanstalk-addr".to_string(), format!("127.0.0.1:{beanstalk}")]);
        }
        args
    })
    .await?;
    exercise(&cluster, beanstalk).await?;

    // The ttr, the ttl and the push happen in the background: scrape until everything named
    // is there, or report what is still missing.
    let outcome = eventually(Duration::from_secs(30), || {
        let (files, cluster) = (&files, &cluster);
        async move {
            let exported = scrape_all(cluster).await?;
            Ok(files.iter().all(|(_, refs)| missing(refs, &exported).is_empty()).then_some(()))
        }
    })
    .await;
    if outcome.is_err() {
        let last = scrape_all(&cluster).await?;
        let report: Vec<String> = files
            .iter()
            .filter_map(|(file, refs)| {
                let m = missing(refs, &last);
                (!m.is_empty()).then(|| format!("{file}: {m:?}"))
            })
            .collect();
        bail!("the monitoring kit names what delayd does not export:\n{}", report.join("\n"));
    }

    // And the other way: everything the cluster exports, after that exercise, has its row in
    // the metrics reference.
    let docs = std::fs::read_to_string(repo().join("docs/metrics.md"))?;
    let undocumented = undocumented(&scrape_all(&cluster).await?, &docs);
    ensure!(undocumented.is_empty(), "exported but not in docs/metrics.md: {undocumented:?}");
    Ok(())
}

/// The `delayd_*` families in `exported` that `docs` does not name in backticks; a
/// histogram's `_bucket`, `_sum` and `_count` series count as their family.
fn undocumented(exported: &BTreeMap<String, BTreeSet<String>>, docs: &str) -> BTreeSet<String> {
    let named = |name: &str| docs.contains(&format!("`{name}`"));
    exported
        .keys()
        .filter(|name| name.starts_with("delayd_"))
        .filter(|name| {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix).filter(|f| named(f)))
                .unwrap_or(name);
            !named(family)
        })
        .cloned()
        .collect()
}

#[test]
fn every_exported_family_must_be_in_the_reference() {
    let exported: BTreeMap<String, BTreeSet<String>> = exported(
        "delayd_a_total 1\ndelayd_b_seconds_bucket{le=\"1\"} 1\ndelayd_b_seconds_sum 1\n\
         delayd_c 2\nother_metric 1\n",
    );
    let docs = "| `delayd_a_total` | counter |\n| `delayd_b_seconds` | histogram |";
    assert_eq!(undocumented(&exported, docs), BTreeSet::from(["delayd_c".to_string()]));
}

/// The `(version, git_sha)` labels of `delayd_build_info` in an exposition text.
fn build_info(text: &str) -> Result<(String, String)> {
    let line = text
        .lines()
        .find(|l| l.starts_with("delayd_build_info{"))
        .context("no delayd_build_info series")?;
    ensure!(line.ends_with("} 1"), "delayd_build_info is not 1: {line}");
    let label = |name: &str| -> Result<String> {
        let start = line.find(&format!("{name}=\"")).context(format!("no {name} in {line}"))?;
        let value = &line[start + name.len() + 2..];
        Ok(value[..value.find('"').context("unterminated")?].to_string())
    };
    Ok((label("version")?, label("git_sha")?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_info_and_version_name_the_build() -> Result<()> {
    // `delayd --version`: the release and the revision in parentheses.
    let out = Command::new(delayd_bin()?).arg("--version").output()?;
    ensure!(out.status.success(), "delayd --version failed");
    let shown = String::from_utf8(out.stdout)?.trim().to_string();
    let version = env!("CARGO_PKG_VERSION");
    let sha = shown
        .strip_prefix(&format!("delayd {version} ("))
        .and_then(|s| s.strip_suffix(')'))
        .with_context(|| format!("`delayd --version` printed {shown:?}"))?
        .to_string();

    // The metric says the same.
    let dir = tempfile::tempdir()?;
    let node = delayd_tests::Server::start(&dir.path().join("node")).await?;
    let text = reqwest::get(format!("{}/metrics", node.url)).await?.text().await?;
    assert_eq!(build_info(&text)?, (version.to_string(), sha.clone()));
    assert_eq!(text.lines().filter(|l| l.starts_with("delayd_build_info{")).count(), 1);

    // Built from a git checkout (as every test run is), the revision is a commit of this
    // repository: 12 hex digits that git knows, not `unknown`. (Not necessarily HEAD: the
    // binary may predate the last commit.)
    let git = |args: &[&str]| Command::new("git").args(args).current_dir(repo()).output();
    if git(&["rev-parse", "HEAD"]).is_ok_and(|o| o.status.success()) {
        ensure!(
            sha.len() == 12 && sha.chars().all(|c| c.is_ascii_hexdigit()),
            "built in a git checkout, yet the revision is {sha:?}"
        );
        let known = git(&["cat-file", "-e", &format!("{sha}^{{commit}}")])?;
        ensure!(known.status.success(), "{sha} is no commit of this repository");
    }
    Ok(())
}
