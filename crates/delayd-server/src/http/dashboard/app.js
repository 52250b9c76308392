// The delayd dashboard. Plain DOM, no framework: every value comes from the node's JSON APIs
// and is written with textContent, so nothing the API returns is ever parsed as HTML.
//
// The admin token lives in sessionStorage (this tab only). It can also arrive in the URL
// fragment, `#token=...`, for automation; the fragment never reaches the server, and the page
// removes the token from the address bar as soon as it has read it. `#queue=ns/q` preselects a
// queue, and `&job=<id>` then looks that job up in it. Numbers the API returns sit in elements
// with a stable `data-testid` and, for counts, a `data-value` holding the raw integer.
"use strict";

const REFRESH_MS = 3000;
const TOKEN_KEY = "delayd.adminToken";
const DEAD_LIMIT = 50;
// The attribute in which a job records its last failed push (a webhook's answer or error).
const LAST_ERROR = "delayd-last-error";

const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  selected: null, // {ns, q}
  job: null, // a job id from the fragment, looked up in the selected queue once
  timer: null,
  loaded: { cluster: false, queues: false },
  needLogin: false,
};

const $ = (id) => document.getElementById(id);

// ---- the URL fragment ----

function readFragment() {
  const params = new URLSearchParams(location.hash.replace(/^#/, ""));
  const token = params.get("token");
  if (token) {
    state.token = token;
    sessionStorage.setItem(TOKEN_KEY, token);
    params.delete("token");
  }
  const queue = params.get("queue");
  if (queue && queue.includes("/")) {
    const i = queue.indexOf("/");
    state.selected = { ns: queue.slice(0, i), q: queue.slice(i + 1) };
    state.job = params.get("job");
  }
  writeFragment(params);
}

function writeFragment(params) {
  const rest = params.toString();
  history.replaceState(null, "", location.pathname + location.search + (rest ? "#" + rest : ""));
}

function selectionToFragment() {
  const params = new URLSearchParams();
  if (state.selected) params.set("queue", state.selected.ns + "/" + state.selected.q);
  writeFragment(params);
}

// ---- the API ----

class AuthError extends Error {}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(method, path) {
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = "Bearer " + state.token;
  let resp;
  try {
    resp = await fetch(path, { method, headers, cache: "no-store" });
  } catch (e) {
    throw new ApiError(0, "cannot reach the node: " + e.message);
  }
  if (resp.status === 401 || resp.status === 403) {
    throw new AuthError(
      resp.status === 401
        ? "The admin token is missing or was not accepted (401). Enter it again."
        : "This token is not allowed to use the admin API (403). Enter the admin token.",
    );
  }
  const text = await resp.text();
  let body = null;
  if (text) {
    try {
      body = JSON.parse(text);
    } catch (e) {
      throw new ApiError(resp.status, `${resp.status}: the answer is not JSON`);
    }
  }
  if (!resp.ok) {
    const msg = (body && (body.error || body.msg)) || resp.statusText;
    throw new ApiError(resp.status, msg);
  }
  return body;
}

const enc = encodeURIComponent;
const queuePath = (sel) => `/api/${enc(sel.ns)}/${enc(sel.q)}`;

// ---- formatting ----

function fmtCount(n) {
  return typeof n === "number" ? n.toLocaleString("en-US") : "–";
}

function fmtDuration(ms) {
  if (ms === null || ms === undefined) return "–";
  const s = Math.round(ms / 1000);
  if (s < 60) return s + "s";
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${s % 60}s`;
  const h = Math.floor(m / 60);
  if (h < 24) return `${h}h ${m % 60}m`;
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

function fmtWindow(ms) {
  if (ms % 86400000 === 0) return ms / 86400000 + "d";
  if (ms % 3600000 === 0) return ms / 3600000 + "h";
  if (ms % 60000 === 0) return ms / 60000 + "m";
  return ms / 1000 + "s";
}

// An exact period: 3600000 → "1h", 5400000 → "1h 30m", 1500 → "1s 500ms".
function fmtPeriod(ms) {
  if (typeof ms !== "number") return "–";
  if (ms === 0) return "0ms";
  const units = [
    ["d", 86400000],
    ["h", 3600000],
    ["m", 60000],
    ["s", 1000],
    ["ms", 1],
  ];
  const parts = [];
  let rest = ms;
  for (const [unit, size] of units) {
    const n = Math.floor(rest / size);
    if (n > 0) parts.push(n + unit);
    rest -= n * size;
  }
  return parts.join(" ");
}

function fmtTime(ms) {
  const d = new Date(ms);
  const rel = ms - Date.now();
  const when = rel >= 0 ? "in " + fmtDuration(rel) : fmtDuration(-rel) + " ago";
  return `${d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC")} (${when})`;
}

// Decodes a base64 body as UTF-8 text; null when it is not valid UTF-8.
function decodeBody(b64) {
  const bytes = Uint8Array.from(atob(b64 || ""), (c) => c.charCodeAt(0));
  try {
    return { text: new TextDecoder("utf-8", { fatal: true }).decode(bytes), bytes: bytes.length };
  } catch (e) {
    return { text: null, bytes: bytes.length };
  }
}

function bodyPreview(b64, max) {
  const body = decodeBody(b64);
  if (body.text === null) return `(${body.bytes} bytes of binary data)`;
  if (body.bytes === 0) return "(empty)";
  const flat = body.text.replace(/\s+/g, " ");
  return flat.length > max ? flat.slice(0, max) + "…" : flat;
}

// ---- DOM helpers ----

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "testid") e.dataset.testid = v;
    else if (k === "value") e.dataset.value = String(v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) e.append(c instanceof Node ? c : String(c));
  return e;
}

// A table cell holding a count: shown formatted, raw in data-value.
function countCell(testid, n) {
  return el("td", { class: "num", testid, value: n }, fmtCount(n));
}

function setCount(id, n) {
  const e = $(id);
  e.textContent = fmtCount(n);
  e.dataset.value = String(n);
}

function setStatus(text, kind) {
  const s = $("status");
  s.textContent = text;
  s.className = "status " + (kind || "");
}

// ---- login ----

function showLogin(message) {
  state.needLogin = true;
  clearTimeout(state.timer);
  $("main").hidden = true;
  $("signout").hidden = true;
  $("login").hidden = false;
  $("login-message").textContent = message;
  $("login-message").className = "message error";
  setStatus("signed out", "warn");
  $("login-token").focus();
}

function signIn(token) {
  state.token = token;
  sessionStorage.setItem(TOKEN_KEY, token);
  state.needLogin = false;
  $("login").hidden = true;
  $("main").hidden = false;
  $("signout").hidden = false;
  refresh();
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = "";
  $("login-token").value = "";
  showLogin("Signed out. Enter the admin token to continue.");
}

// ---- cluster ----

function renderCluster(c) {
  const leader = c.leader === null || c.leader === undefined ? "none" : c.leader;
  $("cluster-leader").textContent = leader;
  $("cluster-leader").dataset.value = String(leader);
  $("cluster-leader").className = c.leader ? "" : "bad";
  setCount("cluster-term", c.term);
  setCount("cluster-node-count", c.nodes.length);
  $("cluster-self").textContent = "node " + c.node_id;
  $("cluster-self").dataset.value = String(c.node_id);
  const rows = c.nodes.map((n) => {
    const reachable = n.reachable === true;
    const isLeader = n.id === c.leader;
    return el(
      "tr",
      { testid: "node-row-" + n.id, class: reachable ? "" : "unreachable" },
      el("td", { testid: "node-id-" + n.id, value: n.id }, n.id, isLeader ? el("span", { class: "badge leader" }, "leader") : ""),
      el("td", { class: "mono", testid: "node-addr-" + n.id }, n.addr || "–"),
      el("td", { testid: "node-role-" + n.id }, n.role || "–"),
      el("td", { testid: "node-state-" + n.id }, reachable ? n.state : n.error || "unreachable"),
      el("td", { testid: "node-reachable-" + n.id, class: reachable ? "ok" : "bad" }, reachable ? "yes" : "no"),
      countCell("node-last-log-" + n.id, n.last_log_index),
      countCell("node-applied-" + n.id, n.last_applied),
      countCell("node-lag-" + n.id, n.lag),
    );
  });
  $("nodes").replaceChildren(...rows);
}

// ---- queues ----

const STATES = ["delayed", "ready", "reserved", "dead"];

function renderQueues(data) {
  const totals = { delayed: 0, ready: 0, reserved: 0, dead: 0 };
  const rows = data.queues.map((q) => {
    const name = q.namespace + "/" + q.queue;
    for (const s of STATES) totals[s] += q[s];
    const selected = state.selected && state.selected.ns === q.namespace && state.selected.q === q.queue;
    const row = el(
      "tr",
      { testid: "q-row-" + name, class: selected ? "selected" : "", tabindex: "0" },
      el("td", {}, q.namespace),
      el("td", {}, q.queue),
      ...STATES.map((s) => countCell(`q-${s}-${name}`, q[s])),
      el("td", { testid: "q-paused-" + name, class: q.paused ? "warn" : "muted" }, q.paused ? "paused" : "no"),
    );
    const pick = () => select({ ns: q.namespace, q: q.queue });
    row.addEventListener("click", pick);
    row.addEventListener("keydown", (e) => {
      if (e.key === "Enter" || e.key === " ") {
        e.preventDefault();
        pick();
      }
    });
    return row;
  });
  if (rows.length === 0) {
    rows.push(el("tr", {}, el("td", { colspan: "7", class: "muted" }, "No queues yet: publish a job to create one.")));
  }
  $("queue-rows").replaceChildren(...rows);
  for (const s of STATES) setCount("q-total-" + s, totals[s]);
  setCount("queue-count", data.queues.length);
  $("queue-count").textContent = `(${data.queues.length} queue${data.queues.length === 1 ? "" : "s"})`;
  $("queues-note").textContent = data.truncated ? "Only the first queues are listed; filter by namespace to see the rest." : "";
}

function select(sel) {
  state.selected = sel;
  selectionToFragment();
  $("lk-ns").value = sel.ns;
  $("lk-q").value = sel.q;
  $("dl-result").textContent = "";
  for (const row of $("queue-rows").children) {
    row.classList.toggle("selected", row.dataset.testid === `q-row-${sel.ns}/${sel.q}`);
  }
  refreshSelected().catch(selectedFailed).catch(handleError);
}

// ---- the selected queue: stats and chart ----

function renderStats(s) {
  $("sel-name").textContent = s.namespace + "/" + s.queue;
  $("sel-empty").hidden = true;
  $("sel-body").hidden = false;
  $("sel-paused").hidden = !s.paused;
  for (const k of STATES) setCount("stats-" + k, s[k]);
  const age = $("stats-head-age");
  age.textContent = s.head_age_ms === null ? "no ready job" : fmtDuration(s.head_age_ms);
  age.dataset.value = s.head_age_ms === null ? "" : String(s.head_age_ms);
  renderChart(s.due_histogram || []);
}

// The histogram is cumulative ([{le_ms, count}], the last bucket unbounded); the chart shows
// how many delayed jobs fall in each window: the differences.
function renderChart(hist) {
  const buckets = [];
  let prev = 0;
  let prevLe = null;
  for (const b of hist) {
    const label = b.le_ms === null ? (prevLe === null ? "all" : ">" + fmtWindow(prevLe)) : "≤" + fmtWindow(b.le_ms);
    buckets.push({ label, count: Math.max(0, b.count - prev) });
    prev = b.count;
    if (b.le_ms !== null) prevLe = b.le_ms;
  }
  const NS = "http://www.w3.org/2000/svg";
  const svgEl = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const width = 560;
  const height = 170;
  const top = 24;
  const bottom = 30;
  const left = 12;
  const plot = height - top - bottom;
  const slot = (width - 2 * left) / Math.max(1, buckets.length);
  const barWidth = Math.min(64, slot * 0.6);
  const max = Math.max(1, ...buckets.map((b) => b.count));
  const svg = svgEl("svg", {
    viewBox: `0 0 ${width} ${height}`,
    width,
    height,
    role: "img",
    "aria-label": "delayed jobs per due-time window",
  });
  svg.append(svgEl("line", { x1: left, x2: width - left, y1: top + plot, y2: top + plot, class: "axis" }));
  buckets.forEach((b, i) => {
    const x = left + slot * i + (slot - barWidth) / 2;
    const h = b.count === 0 ? 0 : Math.max(2, (b.count / max) * plot);
    const g = svgEl("g", { "data-testid": "hist-bucket-" + i, "data-label": b.label, "data-value": b.count });
    g.append(svgEl("rect", { x, y: top + plot - h, width: barWidth, height: h, rx: 3, class: "bar" }));
    g.append(
      svgEl("text", { x: x + barWidth / 2, y: top + plot - h - 6, class: "bar-value", "text-anchor": "middle", "data-testid": "hist-count-" + i }, fmtCount(b.count)),
    );
    g.append(svgEl("text", { x: x + barWidth / 2, y: top + plot + 19, class: "bar-label", "text-anchor": "middle" }, b.label));
    svg.append(g);
  });
  $("chart").replaceChildren(svg);
}

// ---- the selected queue: webhook ----

// `hook` is the webhook, null when the queue has none (404), or {error} when it could not be read.
function renderWebhook(sel, hook) {
  $("wh-name").textContent = sel.ns + "/" + sel.q;
  const mode = $("wh-mode");
  const message = $("wh-empty");
  if (!hook || hook.error) {
    $("wh-body").hidden = true;
    message.hidden = false;
    message.textContent = hook ? "Cannot read the webhook: " + hook.error : "Pull only: no webhook.";
    message.className = hook ? "message error" : "muted";
    mode.textContent = hook ? "" : "pull only";
    mode.dataset.value = hook ? "" : "pull";
    return;
  }
  message.hidden = true;
  $("wh-body").hidden = false;
  mode.textContent = "push";
  mode.dataset.value = "push";
  $("webhook-url").textContent = hook.url;
  const period = (id, ms) => {
    $(id).textContent = fmtPeriod(ms);
    $(id).dataset.value = String(ms);
  };
  period("webhook-timeout", hook.timeout_ms);
  setCount("webhook-max-in-flight", hook.max_in_flight);
  $("webhook-max-in-flight").textContent += hook.max_in_flight === 1 ? " request at most" : " requests at most";
  $("webhook-rate").textContent = hook.rate_per_s === 0 ? "no limit" : fmtCount(hook.rate_per_s) + " requests/s";
  $("webhook-rate").dataset.value = String(hook.rate_per_s);
  period("webhook-backoff-initial", hook.backoff_initial_ms);
  period("webhook-backoff-max", hook.backoff_max_ms);
}

// ---- the selected queue: schedules ----

// When a schedule fires: "every 1h" (the raw period in data-value), or its cron expression and
// time zone (the expression in data-value).
function timetable(sc, testid) {
  if (typeof sc.every_ms === "number") {
    return el("span", { testid, title: `every ${sc.every_ms} ms`, value: sc.every_ms }, "every " + fmtPeriod(sc.every_ms));
  }
  return el("span", { testid, class: "mono", title: "cron, in " + (sc.tz || "UTC"), value: sc.cron }, `${sc.cron || "–"} (${sc.tz || "UTC"})`);
}

// `data` is the answer of GET …/schedules, or {error} when it could not be read.
function renderSchedules(sel, data) {
  $("sc-name").textContent = sel.ns + "/" + sel.q;
  const message = $("sc-empty");
  if (data.error) {
    $("sc-body").hidden = true;
    message.hidden = false;
    message.textContent = "Cannot read the schedules: " + data.error;
    message.className = "message error";
    $("sc-count").textContent = "–";
    delete $("sc-count").dataset.value;
    return;
  }
  const list = data.schedules || [];
  setCount("sc-count", list.length);
  message.hidden = list.length > 0;
  message.textContent = "No schedules: nothing recurs in this queue.";
  message.className = "muted";
  $("sc-body").hidden = list.length === 0;
  const rows = list.map((sc) => {
    const span = [];
    if (sc.start_at_ms > Date.now()) span.push("from " + fmtTime(sc.start_at_ms));
    if (typeof sc.end_at_ms === "number") span.push("until " + fmtTime(sc.end_at_ms));
    const next = typeof sc.next_at_ms === "number";
    return el(
      "tr",
      { testid: "sc-row-" + sc.name },
      el("td", { class: "mono", testid: "sc-name-" + sc.name }, sc.name),
      el(
        "td",
        { class: "wrap" },
        timetable(sc, "sc-timetable-" + sc.name),
        span.length ? el("div", { class: "muted small", testid: "sc-window-" + sc.name }, span.join(", ")) : "",
      ),
      el(
        "td",
        { class: next ? "wrap" : "wrap muted", testid: "sc-next-" + sc.name, value: next ? sc.next_at_ms : "" },
        next ? fmtTime(sc.next_at_ms) : "ended",
      ),
      el("td", { testid: "sc-catchup-" + sc.name }, sc.catch_up || "–"),
    );
  });
  $("sc-rows").replaceChildren(...rows);
}

// ---- the selected queue: dead letter ----

function lastError(job) {
  const attrs = job.attributes || {};
  return Object.prototype.hasOwnProperty.call(attrs, LAST_ERROR) ? String(attrs[LAST_ERROR]) : null;
}

function renderDead(d) {
  $("dl-name").textContent = d.namespace + "/" + d.queue;
  $("dl-empty").hidden = true;
  $("dl-body").hidden = false;
  setCount("dl-size", d.size);
  const rows = d.jobs.flatMap((j) => {
    const error = lastError(j);
    const row = el(
      "tr",
      { testid: "dl-row-" + j.job_id, class: error === null ? "" : "has-error" },
      el("td", { class: "mono" }, el("a", { href: "#", "data-job": j.job_id, class: "job-link" }, j.job_id)),
      countCell("dl-attempts-" + j.job_id, j.attempt),
      el("td", { class: "num", testid: "dl-age-" + j.job_id, value: j.elapsed_ms }, fmtDuration(j.elapsed_ms)),
      el("td", { class: "preview" }, bodyPreview(j.data, 80)),
    );
    if (error === null) return [row];
    // The last failed push, under the job's row: why it is dead.
    const why = el(
      "tr",
      { class: "error-row" },
      el(
        "td",
        { colspan: "4" },
        el("span", { class: "error-label" }, "last error"),
        el("span", { class: "error-text mono", testid: "dl-error-" + j.job_id }, error),
      ),
    );
    return [row, why];
  });
  if (rows.length === 0) rows.push(el("tr", {}, el("td", { colspan: "4", class: "muted" }, "The dead letter is empty.")));
  $("dl-rows").replaceChildren(...rows);
  $("dl-note").textContent = d.size > d.jobs.length ? `Showing the oldest ${d.jobs.length} of ${fmtCount(d.size)}.` : "";
  const limit = $("dl-limit");
  if (!limit.dataset.touched) limit.value = String(Math.max(1, d.size));
}

async function refreshSelected() {
  const sel = state.selected;
  if (!sel) return;
  // The webhook and the schedules are read on the side: failing to read them (or a queue
  // without a webhook, 404) leaves the rest of the queue's view working.
  const aside = (p) =>
    p.catch((e) => {
      if (e instanceof AuthError) throw e;
      return { error: e.message, status: e.status };
    });
  const [stats, dead, hook, schedules] = await Promise.all([
    api("GET", queuePath(sel) + "/stats"),
    api("GET", `${queuePath(sel)}/deadletter/jobs?limit=${DEAD_LIMIT}`),
    aside(api("GET", queuePath(sel) + "/webhook")),
    aside(api("GET", queuePath(sel) + "/schedules")),
  ]);
  if (state.selected !== sel) return; // another queue was picked meanwhile
  renderStats(stats);
  renderWebhook(sel, hook.error && hook.status === 404 ? null : hook);
  renderSchedules(sel, schedules);
  renderDead(dead);
  document.body.dataset.selectedLoaded = "1";
}

async function deadAction(kind) {
  const sel = state.selected;
  if (!sel) return;
  const n = parseInt($("dl-limit").value, 10);
  const result = $("dl-result");
  if (!(n >= 1 && n <= 10000)) {
    result.textContent = "Give a number of jobs from 1 to 10000.";
    result.className = "message error";
    return;
  }
  const name = sel.ns + "/" + sel.q;
  if (kind === "purge" && !confirm(`Delete up to ${n} dead job${n === 1 ? "" : "s"} of ${name} for good?`)) return;
  try {
    if (kind === "respawn") {
      const r = await api("PUT", `${queuePath(sel)}/deadletter?limit=${n}`);
      result.textContent = `Respawned ${fmtCount(r.count)} job${r.count === 1 ? "" : "s"} of ${name}.`;
    } else {
      await api("DELETE", `${queuePath(sel)}/deadletter?limit=${n}`);
      result.textContent = `Purged up to ${fmtCount(n)} dead job${n === 1 ? "" : "s"} of ${name}.`;
    }
    result.className = "message ok";
    delete $("dl-limit").dataset.touched;
    await refresh();
  } catch (e) {
    if (e instanceof AuthError) return showLogin(e.message);
    result.textContent = `${kind} failed: ${e.message}`;
    result.className = "message error";
  }
}

// ---- job lookup ----

async function lookup(ns, q, id) {
  const msg = $("lk-message");
  const out = $("lk-result");
  out.hidden = true;
  msg.textContent = "looking up…";
  msg.className = "message";
  let j;
  try {
    j = await api("GET", `/api/${enc(ns)}/${enc(q)}/job/${enc(id)}`);
  } catch (e) {
    if (e instanceof AuthError) return showLogin(e.message);
    msg.textContent = e.status === 404 ? "job not found" : "lookup failed: " + e.message;
    msg.className = "message error";
    document.body.dataset.jobLoaded = "1";
    return;
  }
  msg.textContent = `${j.namespace}/${j.queue} · ${j.job_id}`;
  msg.className = "message mono";
  $("job-state").textContent = j.state;
  $("job-state").className = "state-" + j.state;
  $("job-due").textContent = fmtTime(j.due_at_ms);
  $("job-due").dataset.value = String(j.due_at_ms);
  setCount("job-attempt", j.attempt);
  setCount("job-remain-tries", j.remain_tries);
  $("job-priority").textContent = String(j.priority);
  $("job-priority").dataset.value = String(j.priority);
  $("job-ttl").textContent = j.ttl === 0 ? "never expires" : fmtDuration(j.ttl * 1000) + " left";
  $("job-ttl").dataset.value = String(j.ttl);
  $("job-age").textContent = fmtDuration(j.elapsed_ms);
  $("job-age").dataset.value = String(j.elapsed_ms);
  $("job-key").textContent = j.key || "–";
  const attrs = Object.entries(j.attributes || {});
  $("job-attributes").replaceChildren(
    ...(attrs.length ? attrs.map(([k, v]) => el("div", { class: "mono" }, `${k}: ${v}`)) : ["–"]),
  );
  const body = decodeBody(j.data);
  $("job-body").textContent =
    body.text === null ? `(${body.bytes} bytes of binary data, base64)\n${j.data}` : body.text || "(empty)";
  out.hidden = false;
  document.body.dataset.jobLoaded = "1";
}

// ---- the refresh loop ----

// A failure to read the selected queue leaves the rest of the page working.
function selectedFailed(e) {
  if (e instanceof AuthError) throw e;
  $("sel-body").hidden = true;
  $("sel-empty").hidden = false;
  $("sel-empty").textContent = "Cannot read this queue: " + e.message;
  for (const p of ["wh", "sc"]) {
    $(p + "-body").hidden = true;
    $(p + "-empty").hidden = false;
    $(p + "-empty").textContent = "Cannot read this queue.";
  }
}

function handleError(e) {
  if (e instanceof AuthError) {
    showLogin(e.message);
  } else {
    setStatus("error: " + e.message, "bad");
  }
}

async function refresh() {
  clearTimeout(state.timer);
  if (state.needLogin) return;
  try {
    const filter = $("ns-filter").value.trim();
    const queuesUrl = "/admin/queues" + (filter ? "?namespace=" + enc(filter) : "");
    const [cluster, queues] = await Promise.all([api("GET", "/admin/cluster"), api("GET", queuesUrl)]);
    renderCluster(cluster);
    state.loaded.cluster = true;
    renderQueues(queues);
    state.loaded.queues = true;
    await refreshSelected().catch(selectedFailed);
    setStatus("updated " + new Date().toLocaleTimeString("en-GB"), "ok");
    document.body.dataset.loaded = "1";
  } catch (e) {
    handleError(e);
  }
  if (!state.needLogin) state.timer = setTimeout(refresh, REFRESH_MS);
}

function start() {
  readFragment();
  $("login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const token = $("login-token").value.trim();
    if (token) signIn(token);
  });
  $("signout").addEventListener("click", signOut);
  $("lookup-form").addEventListener("submit", (e) => {
    e.preventDefault();
    lookup($("lk-ns").value.trim(), $("lk-q").value.trim(), $("lk-id").value.trim());
  });
  $("dl-respawn").addEventListener("click", () => deadAction("respawn"));
  $("dl-purge").addEventListener("click", () => deadAction("purge"));
  $("dl-limit").addEventListener("input", () => ($("dl-limit").dataset.touched = "1"));
  $("dl-rows").addEventListener("click", (e) => {
    const link = e.target.closest("a.job-link");
    if (!link || !state.selected) return;
    e.preventDefault();
    $("lk-id").value = link.dataset.job;
    lookup(state.selected.ns, state.selected.q, link.dataset.job);
  });
  let filterTimer = null;
  $("ns-filter").addEventListener("input", () => {
    clearTimeout(filterTimer);
    filterTimer = setTimeout(refresh, 300);
  });
  if (state.selected) {
    $("lk-ns").value = state.selected.ns;
    $("lk-q").value = state.selected.q;
  }
  $("main").hidden = false;
  $("signout").hidden = !state.token;
  refresh();
  if (state.selected && state.job) {
    $("lk-id").value = state.job;
    lookup(state.selected.ns, state.selected.q, state.job);
  }
}

start();
