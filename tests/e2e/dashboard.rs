//! End-to-end: the web dashboard of a real `delayd` process, rendered by a real headless
//! Chromium, must show the numbers the JSON APIs give.
//!
//! The browser runs with `--dump-dom` under a virtual-time budget, which lets the page's
//! fetches finish before the DOM is serialised; the page marks `data-loaded="1"` on `<body>`
//! once the cluster and queue tables have rendered, and the test runs the browser again (a few
//! times at most) until it sees that mark. Numbers are read from the `data-testid` /
//! `data-value` attributes of the dumped DOM by plain string scanning.
//!
//! The queue it inspects also pushes to a webhook nobody listens at and has a schedule, so
//! the page must show both, and the jobs whose push failed must show why in the dead letter.
//!
//! Without a browser the test is skipped with a message, unless `DELAYD_REQUIRE_BROWSER=1`
//! (CI), when it fails. `UPDATE_SCREENSHOT=1` copies the screenshot it takes to
//! `docs/dashboard.png`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use delayd_tests::{eventually, free_port, n, s, Server};
use serde_json::Value;

/// The admin token the node is started with and the page is given.
const ADMIN_TOKEN: &str = "dashboard-test-admin-token-0001";

/// Extra `delayd` flags for this test: authentication on, with a known admin token.
fn auth_args() -> Vec<String> {
    vec!["--admin-token".into(), ADMIN_TOKEN.into()]
}

/// HTTP with the admin credential on every request.
struct Admin {
    http: reqwest::Client,
    base: String,
}

impl Admin {
    async fn send(&self, method: reqwest::Method, path: &str, body: &str) -> Result<(u16, Value)> {
        let resp = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(ADMIN_TOKEN)
            .body(body.to_string())
            .send()
            .await?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await?;
        let json = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes)? };
        Ok((status, json))
    }

    async fn get(&self, path: &str) -> Result<Value> {
        let (st, v) = self.send(reqwest::Method::GET, path, "").await?;
        ensure!(st == 200, "GET {path}: {st} {v}");
        Ok(v)
    }

    async fn put(&self, path: &str, body: &str) -> Result<(u16, Value)> {
        self.send(reqwest::Method::PUT, path, body).await
    }

    /// Publishes and returns the job id.
    async fn publish(&self, queue: &str, params: &str, body: &str) -> Result<String> {
        let (st, v) = self.put(&format!("/api/{queue}?{params}"), body).await?;
        ensure!(st == 201, "publish {queue}?{params}: {st} {v}");
        s(&v, "job_id")
    }

    /// Reserves one job and returns its id.
    async fn reserve(&self, queue: &str, params: &str) -> Result<String> {
        let v = self.get(&format!("/api/{queue}?{params}")).await?;
        s(&v, "job_id")
    }
}

/// The browser, if one is installed: `$CHROMIUM`, else the first of the usual names on PATH.
fn find_browser() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"]
        .iter()
        .find_map(|name| std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file()))
}

/// Runs the browser headless on `url` with `args` and returns its stdout.
async fn browse(browser: &Path, profile: &Path, args: &[String], url: &str) -> Result<String> {
    let mut cmd = tokio::process::Command::new(browser);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        // Virtual time runs only while nothing is loading, so fetches finish within it.
        "--virtual-time-budget=8000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args)
    .arg(url)
    .stdin(std::process::Stdio::null())
    .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(90), cmd.output())
        .await
        .context("the browser did not finish within 90 s")??;
    ensure!(
        out.status.success(),
        "{} failed ({}): {}",
        browser.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Dumps the page's DOM once it has loaded its data (`<body data-loaded="1">` and each of the
/// `marks` on `<body>` too), trying a few times.
async fn loaded_dom(browser: &Path, profile: &Path, url: &str, marks: &[&str]) -> Result<Dom> {
    let mut last = String::new();
    for _ in 0..5 {
        let dom = Dom(browse(browser, profile, &["--dump-dom".to_string()], url).await?);
        let body = dom.tag_of("<body").unwrap_or_default();
        if ["data-loaded"].iter().chain(marks).all(|m| body.contains(&format!(r#"{m}="1""#))) {
            return Ok(dom);
        }
        last = dom.0;
    }
    bail!("the page never marked itself loaded; last DOM:\n{last}")
}

/// A serialised DOM, read by attribute.
struct Dom(String);

impl Dom {
    /// The whole start tag that contains `needle`.
    fn tag_of(&self, needle: &str) -> Option<&str> {
        let at = self.0.find(needle)?;
        let start = self.0[..=at].rfind('<')?;
        let end = at + self.0[at..].find('>')?;
        Some(&self.0[start..=end])
    }

    /// The start tag of the element with this `data-testid`.
    fn tag(&self, testid: &str) -> Result<&str> {
        self.tag_of(&format!(r#"data-testid="{testid}""#))
            .with_context(|| format!("no element with data-testid={testid}"))
    }

    /// An attribute of the element with this `data-testid`.
    fn attr(&self, testid: &str, name: &str) -> Result<String> {
        let tag = self.tag(testid)?;
        let key = format!(r#" {name}=""#);
        let at = tag.find(&key).with_context(|| format!("{testid} has no {name}: {tag}"))?;
        let rest = &tag[at + key.len()..];
        let value = &rest[..rest.find('"').context("unterminated attribute")?];
        Ok(unescape(value))
    }

    /// The raw number the element with this `data-testid` shows (`data-value`).
    fn num(&self, testid: &str) -> Result<u64> {
        let v = self.attr(testid, "data-value")?;
        v.parse().with_context(|| format!("{testid}: data-value {v:?} is not a number"))
    }

    /// The text right after the element's start tag.
    fn text(&self, testid: &str) -> Result<String> {
        let tag = self.tag(testid)?;
        let at = self.0.find(tag).context("tag vanished")? + tag.len();
        let rest = &self.0[at..];
        Ok(unescape(rest[..rest.find('<').unwrap_or(rest.len())].trim()))
    }

    /// How many elements have a `data-testid` starting with `prefix`.
    fn count(&self, prefix: &str) -> usize {
        self.0.matches(&format!(r#"data-testid="{prefix}"#)).count()
    }
}

/// Undoes the escaping of serialised HTML text and attribute values.
fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}

const STATES: [&str; 4] = ["delayed", "ready", "reserved", "dead"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_what_the_api_says() -> Result<()> {
    let Some(browser) = find_browser() else {
        if std::env::var("DELAYD_REQUIRE_BROWSER").is_ok_and(|v| v == "1") {
            bail!(
                "DELAYD_REQUIRE_BROWSER=1 but no chromium was found (set $CHROMIUM or install it)"
            );
        }
        println!(
            "SKIPPED dashboard test: no chromium on PATH (DELAYD_REQUIRE_BROWSER=1 fails instead)"
        );
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let server =
        Server::spawn(1, &dir.path().join("node1"), free_port()?, free_port()?, auth_args())
            .await?;
    let api = Admin { http: reqwest::Client::new(), base: server.url.clone() };

    // billing/invoices: 3 delayed (two due in an hour, one in a day), 1 reserved, 4 dead. The
    // most urgent job (priority 0, one try) is reserved with a 1 s ttr and left to expire into
    // the dead letter. Then the queue gets a webhook at a port nobody listens on, and an hourly
    // schedule, whose first occurrence is due at once: the dispatcher pushes the 2 ready jobs
    // and that occurrence, each push fails, and with one try each they go to the dead letter
    // with the error in `delayd-last-error`.
    let inv = "billing/invoices";
    let dead_id = api.publish(inv, "priority=0&tries=1", "invoice 4411: card declined").await?;
    for i in 0..3 {
        api.publish(inv, "priority=5", &format!("{{\"invoice\": {}}}", 4500 + i)).await?;
    }
    api.publish(inv, "delay=3600", "reminder 1").await?;
    api.publish(inv, "delay=3600", "reminder 2").await?;
    api.publish(inv, "delay=86400&ttl=0", "yearly report").await?;
    ensure!(api.reserve(inv, "ttr=1").await? == dead_id, "the priority 0 job comes first");
    api.reserve(inv, "ttr=600").await?;
    eventually(Duration::from_secs(10), || async {
        Ok((n(&api.get(&format!("/api/{inv}/stats")).await?, "dead")? == 1).then_some(()))
    })
    .await?;
    let hook_url = "http://127.0.0.1:9/hook";
    let (st, v) =
        api.put(&format!("/api/{inv}/webhook"), &format!(r#"{{"url": "{hook_url}"}}"#)).await?;
    ensure!(st == 201, "set webhook: {st} {v}");
    let schedule = "hourly-summary";
    let (st, v) =
        api.put(&format!("/api/{inv}/schedules/{schedule}"), r#"{"every_ms": 3600000}"#).await?;
    ensure!(st == 201, "set schedule: {st} {v}");
    eventually(Duration::from_secs(20), || async {
        let stats = api.get(&format!("/api/{inv}/stats")).await?;
        let counts = STATES.iter().map(|st| n(&stats, st)).collect::<Result<Vec<_>>>()?;
        Ok((counts == [3, 0, 1, 4]).then_some(()))
    })
    .await
    .context("the failed pushes never settled in the dead letter")?;

    // mail/welcome: 4 ready, 1 delayed; mail/digest: 2 delayed a day, paused.
    for i in 0..4 {
        api.publish("mail/welcome", "", &format!("welcome user {i}")).await?;
    }
    api.publish("mail/welcome", "delay=3600", "follow-up").await?;
    for _ in 0..2 {
        api.publish("mail/digest", "delay=86400&ttl=0", "weekly digest").await?;
    }
    let (st, v) = api.put("/api/mail/digest/pause", "").await?;
    ensure!(st == 204, "pause: {st} {v}");

    // The API's view, read before the browser's, so the page's indexes can only be newer.
    let queues = api.get("/admin/queues").await?;
    let cluster = api.get("/admin/cluster").await?;
    let list = queues["queues"].as_array().context("queues")?;
    let counts: BTreeMap<String, Vec<u64>> = list
        .iter()
        .map(|q| {
            let name = format!("{}/{}", s(q, "namespace")?, s(q, "queue")?);
            Ok((name, STATES.iter().map(|st| n(q, st)).collect::<Result<_>>()?))
        })
        .collect::<Result<_>>()?;
    let want: BTreeMap<String, Vec<u64>> = [
        ("billing/invoices", vec![3, 0, 1, 4]),
        ("mail/digest", vec![2, 0, 0, 0]),
        ("mail/welcome", vec![1, 4, 0, 0]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    ensure!(counts == want, "/admin/queues: {queues}");

    let profile = tempfile::tempdir()?;
    let page = format!("{}/dashboard/#token={ADMIN_TOKEN}", server.url);
    let dom = loaded_dom(&browser, profile.path(), &page, &[]).await?;

    // Every queue's counts and pause flag, the totals and nothing more.
    ensure!(dom.count("q-row-") == list.len(), "queue rows");
    for q in list {
        let name = format!("{}/{}", s(q, "namespace")?, s(q, "queue")?);
        for st in STATES {
            let shown = dom.num(&format!("q-{st}-{name}"))?;
            ensure!(shown == n(q, st)?, "{name} {st}: page {shown}, API {q}");
        }
        let paused = if q["paused"] == true { "paused" } else { "no" };
        ensure!(dom.text(&format!("q-paused-{name}"))? == paused, "{name} paused");
    }
    for (i, st) in STATES.iter().enumerate() {
        let total: u64 = counts.values().map(|c| c[i]).sum();
        ensure!(dom.num(&format!("q-total-{st}"))? == total, "total {st}");
    }

    // The cluster: leader, members, and indexes no older than the API's.
    let nodes = cluster["nodes"].as_array().context("nodes")?;
    ensure!(dom.num("cluster-leader")? == n(&cluster, "leader")?, "leader");
    ensure!(dom.num("cluster-node-count")? == nodes.len() as u64, "node count");
    ensure!(dom.num("cluster-term")? >= n(&cluster, "term")?, "term");
    ensure!(dom.count("node-row-") == nodes.len(), "node rows");
    for node in nodes {
        let id = n(node, "id")?;
        ensure!(dom.num(&format!("node-applied-{id}"))? >= n(node, "last_applied")?, "applied");
        ensure!(dom.num(&format!("node-last-log-{id}"))? >= n(node, "last_log_index")?, "log");
        ensure!(dom.text(&format!("node-role-{id}"))? == s(node, "role")?, "role");
        ensure!(dom.text(&format!("node-reachable-{id}"))? == "yes", "reachable");
    }

    // One queue selected, with a job looked up: its stats, due-time chart and dead letter.
    let selected = format!("{page}&queue={inv}&job={dead_id}");
    let marks = ["data-selected-loaded", "data-job-loaded"];
    let dom = loaded_dom(&browser, profile.path(), &selected, &marks).await?;
    let stats = api.get(&format!("/api/{inv}/stats")).await?;
    for st in STATES {
        ensure!(dom.num(&format!("stats-{st}"))? == n(&stats, st)?, "stats {st}: {stats}");
    }
    let hist = stats["due_histogram"].as_array().context("due_histogram")?;
    let mut below = 0;
    let mut per_bucket = Vec::new();
    for (i, b) in hist.iter().enumerate() {
        let cumulative = n(b, "count")?;
        per_bucket.push(cumulative - below);
        ensure!(dom.num(&format!("hist-bucket-{i}"))? == cumulative - below, "bucket {i}");
        below = cumulative;
    }
    // Two jobs due within the hour, one within the day.
    ensure!(per_bucket == [0, 0, 2, 1, 0], "histogram {stats}");
    ensure!(dom.attr("hist-bucket-2", "data-label")? == "≤1h", "bucket label");
    ensure!(dom.num("dl-size")? == 4, "dead letter size");
    ensure!(dom.num(&format!("dl-attempts-{dead_id}"))? == 1, "dead job attempts");
    ensure!(dom.text("job-state")? == "dead", "looked-up job state");
    ensure!(dom.text("job-body")? == "invoice 4411: card declined", "looked-up job body");

    // The dead jobs' last failed push: shown for the three the webhook failed, none for the one
    // whose lease ran out.
    let dead = api.get(&format!("/api/{inv}/deadletter/jobs?limit=50")).await?;
    let mut failed_pushes = 0;
    for job in dead["jobs"].as_array().context("dead jobs")? {
        let id = s(job, "job_id")?;
        ensure!(dom.count(&format!("dl-row-{id}")) == 1, "dead job {id} listed");
        match job["attributes"]["delayd-last-error"].as_str() {
            Some(error) => {
                failed_pushes += 1;
                let shown = dom.text(&format!("dl-error-{id}"))?;
                ensure!(shown == error, "{id}'s last error: page {shown:?}, API {error:?}");
            }
            None => ensure!(dom.count(&format!("dl-error-{id}")) == 0, "{id} has no last error"),
        }
    }
    ensure!(failed_pushes == 3, "three failed pushes: {dead}");
    ensure!(dom.count(&format!("dl-error-{dead_id}")) == 0, "the expired job has no push error");

    // The webhook, as the API shows it.
    let hook = api.get(&format!("/api/{inv}/webhook")).await?;
    ensure!(dom.text("webhook-mode")? == "push", "webhook mode");
    ensure!(dom.text("webhook-url")? == hook_url, "webhook url");
    ensure!(dom.num("webhook-timeout")? == n(&hook, "timeout_ms")?, "webhook timeout");
    ensure!(dom.text("webhook-timeout")? == "10s", "webhook timeout shown");
    ensure!(dom.num("webhook-max-in-flight")? == n(&hook, "max_in_flight")?, "max in flight");
    ensure!(dom.num("webhook-rate")? == n(&hook, "rate_per_s")?, "rate");
    ensure!(dom.text("webhook-rate")? == "no limit", "rate shown");
    ensure!(dom.num("webhook-backoff-initial")? == n(&hook, "backoff_initial_ms")?, "backoff");
    ensure!(dom.num("webhook-backoff-max")? == n(&hook, "backoff_max_ms")?, "backoff max");
    ensure!(dom.text("webhook-backoff-max")? == "5m", "largest backoff shown");

    // The schedule: its name, timetable and next occurrence (an hour after the first).
    let schedules = api.get(&format!("/api/{inv}/schedules")).await?;
    let listed = schedules["schedules"].as_array().context("schedules")?;
    ensure!(listed.len() == 1, "one schedule: {schedules}");
    ensure!(dom.num("sc-count")? == 1, "schedule count");
    ensure!(dom.count("sc-row-") == 1, "schedule rows");
    ensure!(dom.text(&format!("sc-name-{schedule}"))? == schedule, "schedule name");
    ensure!(dom.text(&format!("sc-timetable-{schedule}"))? == "every 1h", "timetable");
    ensure!(dom.num(&format!("sc-timetable-{schedule}"))? == 3_600_000, "period");
    let next = n(&listed[0], "next_at_ms")?;
    ensure!(dom.num(&format!("sc-next-{schedule}"))? == next, "next occurrence: {schedules}");
    ensure!(dom.text(&format!("sc-next-{schedule}"))?.contains(" UTC (in "), "next shown");
    ensure!(dom.text(&format!("sc-catchup-{schedule}"))? == s(&listed[0], "catch_up")?, "catch-up");

    // A pull-only queue without schedules says so.
    let welcome = format!("{page}&queue=mail/welcome");
    let dom = loaded_dom(&browser, profile.path(), &welcome, &["data-selected-loaded"]).await?;
    ensure!(dom.text("selected-queue")? == "mail/welcome", "selected queue");
    ensure!(dom.text("webhook-mode")? == "pull only", "no webhook");
    ensure!(dom.text("webhook-message")? == "Pull only: no webhook.", "no webhook message");
    ensure!(dom.num("sc-count")? == 0, "no schedules");
    ensure!(dom.count("sc-row-") == 0, "no schedule rows");

    // The screenshot, of the same view.
    let shot = dir.path().join("dashboard.png");
    let args = [format!("--screenshot={}", shot.display()), "--window-size=1400,1360".into()];
    browse(&browser, profile.path(), &args, &selected).await?;
    let png = std::fs::read(&shot).context("no screenshot written")?;
    ensure!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "screenshot looks empty");
    if std::env::var("UPDATE_SCREENSHOT").is_ok_and(|v| v == "1") {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/dashboard.png");
        std::fs::copy(&shot, &docs)?;
        println!("screenshot written to {}", docs.display());
    }
    Ok(())
}
