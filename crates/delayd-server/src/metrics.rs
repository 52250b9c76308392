//! # Prometheus metrics of one node, served at `GET /metrics`
//!
//! Every node owns a [`Metrics`] with its own [`Registry`] (several nodes share a process in
//! tests, so nothing uses the global default registry). `docs/metrics.md` lists every series
//! with its meaning; this module is where they come from. There are four sources:
//!
//! - **Requests**, recorded as they are answered: the HTTP front end's middleware labels
//!   HTTP requests with the route *template* (`/api/{ns}/{q}`), never the raw path, so the
//!   number of series is bounded by the router; the gRPC front end wraps its client API
//!   the same way, by method name.
//! - **Applied entries**: the apply listener hands every batch's [`Effects`] to
//!   [`Metrics::record_applied`], which counts job events per queue and timer lateness.
//!   Every replica applies the same log, so every replica reports the same cluster-wide
//!   totals (since it started, and except what reached it by snapshot): aggregate with `max`
//!   across nodes, never `sum`.
//! - **Storage**: the store records log appends, fsyncs and snapshots into
//!   [`StoreMetrics`] handles registered here.
//! - **Scrape time**: gauges computed from local state when `/metrics` is read — queue
//!   sizes and upcoming due times from the local replica (a stale read: a follower may lag
//!   the leader by a few entries), Raft's view from `raft.metrics()`, RocksDB's sizes and
//!   the free space of the filesystem holding the data directory.
//!   Queues are listed up to [`MAX_QUEUES`], those that sort first by name; the rest are
//!   left out.
//!
//! Every name is in base units (seconds, bytes) or counts a thing it names (`_entries`,
//! `_total`), as Prometheus' conventions ask; `deploy/monitoring/` queries these names and
//! a test (`tests/e2e/monitoring.rs`) checks that each one it queries is exported.
//!
//! Caveat: per-queue counters are never removed, so a node that has seen many short-lived
//! queues keeps their series until it restarts; past [`MAX_QUEUES`] distinct queues, events
//! of further queues are counted under `namespace="_other", queue="_other"` (names starting
//! with `_` are reserved, so this never mixes with a real queue).

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use delayd_core::{query, Effects, JobState, QueueName};
use delayd_raft::{Cluster, ReplicationMetrics};
use delayd_store::{StateReader, StoreMetrics, TypeConfig};
use openraft::async_runtime::watch::WatchReceiver;
use openraft::vote::RaftLeaderId as _;
use openraft::{Instant as _, RaftMetrics, ServerState};
use prometheus::core::{Atomic, GenericCounter};
use prometheus::{
    CounterVec, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::config::BuildInfo;
use crate::error::ServiceError;

/// Most queues reported by the per-queue gauges, and most queues with their own event
/// counters; bounds the number of series a node exposes.
pub const MAX_QUEUES: usize = 10_000;

/// The `within` buckets of `delayd_jobs_due_within`, in ms, with their labels (`+Inf` is
/// added after them).
const DUE_WITHIN: [(u64, &str); 6] = [
    (60_000, "1m"),
    (5 * 60_000, "5m"),
    (15 * 60_000, "15m"),
    (3_600_000, "1h"),
    (6 * 3_600_000, "6h"),
    (24 * 3_600_000, "24h"),
];

/// Request durations: 0.5 ms to 60 s (a long-poll reserve may wait up to 600 s and lands in
/// `+Inf`).
const REQUEST_SECONDS: &[f64] = &[
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Timer lateness: 1 ms to 60 s.
const LATENESS_SECONDS: &[f64] =
    &[0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// The label set of an overflowing queue (see the module docs).
const OTHER_QUEUE: [&str; 2] = ["_other", "_other"];

/// Raft server states, as the `state` label shows them.
const RAFT_STATES: [(ServerState, &str); 5] = [
    (ServerState::Leader, "leader"),
    (ServerState::Follower, "follower"),
    (ServerState::Candidate, "candidate"),
    (ServerState::Learner, "learner"),
    (ServerState::Shutdown, "shutdown"),
];

/// Counters of one kind of job event, labelled by namespace and queue.
struct JobCounters {
    published: IntCounterVec,
    reserved: IntCounterVec,
    acked: IntCounterVec,
    released: IntCounterVec,
    timed_out: IntCounterVec,
    expired: IntCounterVec,
    dead_lettered: IntCounterVec,
}

/// One node's metrics: its registry and the handles recorded into it.
pub struct Metrics {
    registry: Registry,
    store: StoreMetrics,
    replication: ReplicationMetrics,

    http_requests: IntCounterVec,
    http_seconds: HistogramVec,
    grpc_requests: IntCounterVec,
    grpc_seconds: HistogramVec,
    token_catch_ups: IntCounter,
    rate_limited: IntCounterVec,
    reserves_waiting: IntGauge,
    reserve_attempts: IntCounterVec,
    protocol_requests: IntCounterVec,
    protocol_seconds: HistogramVec,

    jobs_events: JobCounters,
    timer_lateness: Histogram,
    /// Queues that have their own event counters (at most [`MAX_QUEUES`]).
    counted_queues: Mutex<HashSet<QueueName>>,

    jobs: IntGaugeVec,
    jobs_due_within: IntGaugeVec,

    raft_term: IntGauge,
    raft_state: IntGaugeVec,
    raft_leader_id: IntGauge,
    raft_leader_changes: IntCounter,
    raft_last_log_index: IntGauge,
    raft_applied_index: IntGauge,
    raft_replication_lag: IntGaugeVec,
    /// No labels: a vector so that the series can be absent when this node does not lead.
    raft_quorum_ack: GaugeVec,

    rocksdb_size: IntGaugeVec,
    rocksdb_memory: IntGaugeVec,
    /// No labels: a vector so that the series is absent when RocksDB cannot be asked.
    rocksdb_write_stopped: IntGaugeVec,
    rocksdb_write_stalls: IntCounterVec,
    rocksdb_background_jobs: IntGaugeVec,
    /// The Raft log's files and its flush worker. No labels: vectors, so that the series
    /// are absent once the log has closed.
    log_fsyncs: IntCounterVec,
    log_fsync_seconds: CounterVec,
    log_size: IntGaugeVec,
    /// No labels: vectors so that the series are absent, rather than 0, when the filesystem
    /// cannot be asked (0 bytes available would page someone).
    filesystem_available: IntGaugeVec,
    filesystem_size: IntGaugeVec,

    webhook_attempts: IntCounterVec,
    webhook_dispatch_latency: HistogramVec,
    webhook_answer_seconds: HistogramVec,
    webhook_in_flight: IntGaugeVec,

    /// Serialises scrapes: each resets and refills the scrape-time gauges before gathering.
    scrape: Mutex<()>,
}

/// Creates a metric and registers it, or returns the registry's error.
struct Builder<'r>(&'r Registry);

impl Builder<'_> {
    fn add<M: prometheus::core::Collector + Clone + 'static>(
        &self,
        m: prometheus::Result<M>,
    ) -> prometheus::Result<M> {
        let m = m?;
        self.0.register(Box::new(m.clone()))?;
        Ok(m)
    }

    fn counter(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> prometheus::Result<IntCounterVec> {
        self.add(IntCounterVec::new(Opts::new(name, help), labels))
    }

    fn gauge(&self, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntGaugeVec> {
        self.add(IntGaugeVec::new(Opts::new(name, help), labels))
    }

    fn histogram(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: &[f64],
    ) -> prometheus::Result<HistogramVec> {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.add(HistogramVec::new(opts, labels))
    }
}

/// Moves a counter up to `n`, a count kept elsewhere (RocksDB's, the log's flush worker's)
/// that only grows while its source is open; scrapes are serialised, so the counter follows it.
fn follow<P: Atomic>(counter: &GenericCounter<P>, n: P::T) {
    let at = counter.get();
    if n > at {
        let mut behind = n;
        behind -= at;
        counter.inc_by(behind);
    }
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Metrics {
    /// A registry with every metric of a node, recording into `store`'s handles too;
    /// `build` labels `delayd_build_info`.
    pub fn new(store: StoreMetrics, build: &BuildInfo) -> prometheus::Result<Metrics> {
        let registry = Registry::new();
        store.register(&registry)?;
        let replication = ReplicationMetrics::default();
        replication.register(&registry)?;
        let b = Builder(&registry);
        b.gauge(
            "delayd_build_info",
            "Always 1; its labels say which build this node runs.",
            &["version", "git_sha"],
        )?
        .with_label_values(&[build.version.as_str(), build.git_sha.as_str()])
        .set(1);
        let queue = &["namespace", "queue"];
        let events =
            |what: &str, help: &str| b.counter(&format!("delayd_jobs_{what}_total"), help, queue);
        let jobs_events = JobCounters {
            published: events("published", "Jobs created by a publish, as applied.")?,
            reserved: events("reserved", "Deliveries: jobs handed out by a reserve, as applied.")?,
            acked: events("acked", "Jobs removed by an ack, as applied.")?,
            released: events("released", "Reserved jobs put back by a release, as applied.")?,
            timed_out: events("timed_out", "Reservations whose ttr ran out, as applied.")?,
            expired: events("expired", "Jobs removed because their ttl passed, as applied.")?,
            dead_lettered: events(
                "dead_lettered",
                "Jobs moved to the dead letter (buried or out of tries), as applied.",
            )?,
        };
        let single = |name: &str, help: &str| b.add(IntGauge::new(name, help));
        Ok(Metrics {
            http_requests: b.counter(
                "delayd_http_requests_total",
                "HTTP requests answered, by route template, method and status.",
                &["route", "method", "status"],
            )?,
            http_seconds: b.histogram(
                "delayd_http_request_duration_seconds",
                "HTTP request durations until the response head, by route template and method.",
                &["route", "method"],
                REQUEST_SECONDS,
            )?,
            grpc_requests: b.counter(
                "delayd_grpc_requests_total",
                "gRPC client API calls answered, by method and status code.",
                &["method", "code"],
            )?,
            grpc_seconds: b.histogram(
                "delayd_grpc_request_duration_seconds",
                "gRPC client API call durations until the response head, by method.",
                &["method"],
                REQUEST_SECONDS,
            )?,
            protocol_requests: b.counter(
                "delayd_protocol_requests_total",
                "Commands of the other wire protocols (disque) answered, by command and \
                 outcome (ok, error).",
                &["protocol", "command", "outcome"],
            )?,
            protocol_seconds: b.histogram(
                "delayd_protocol_request_duration_seconds",
                "Command durations of the other wire protocols, by command.",
                &["protocol", "command"],
                REQUEST_SECONDS,
            )?,
            token_catch_ups: b.add(IntCounter::new(
                "delayd_token_catch_ups_total",
                "Read barriers a follower ran to check tokens it did not know (shared by the \
                 checks that arrived while one ran).",
            ))?,
            rate_limited: b.counter(
                "delayd_rate_limited_total",
                "Requests refused (HTTP 429, gRPC RESOURCE_EXHAUSTED) because a namespace \
                 token's read or write rate limit on this node was spent.",
                &["namespace", "access"],
            )?,
            reserves_waiting: b.add(IntGauge::new(
                "delayd_reserves_waiting",
                "Reserves (long-polls of any protocol) parked on this node until a job is \
                 ready or their timeout ends.",
            ))?,
            reserve_attempts: b.counter(
                "delayd_reserve_attempts_total",
                "Reserve attempts this node's consumers sent to the leader, by whether they \
                 took a job (delivered) or found the queues empty (empty), and whether they \
                 went on their own (own) or rode the timer pump's tick (tick).",
                &["outcome", "entry"],
            )?,
            jobs_events,
            timer_lateness: b.add(Histogram::with_opts(
                HistogramOpts::new(
                    "delayd_timer_lateness_seconds",
                    "For each delayed job made ready by a tick: the tick's replicated clock \
                     minus the job's due time.",
                )
                .buckets(LATENESS_SECONDS.to_vec()),
            ))?,
            counted_queues: Mutex::default(),
            jobs: b.gauge(
                "delayd_jobs",
                "Jobs per queue and state in the local replica, read at scrape time.",
                &["namespace", "queue", "state"],
            )?,
            jobs_due_within: b.gauge(
                "delayd_jobs_due_within",
                "Delayed jobs coming due within the given time from now (cumulative, minute \
                 resolution), in the local replica, read at scrape time.",
                &["namespace", "queue", "within"],
            )?,
            raft_term: single("delayd_raft_term", "The current Raft term.")?,
            raft_state: b.gauge(
                "delayd_raft_state",
                "1 for this node's current Raft state, 0 for the others.",
                &["state"],
            )?,
            raft_leader_id: single(
                "delayd_raft_leader_id",
                "The id of the leader this node knows of; 0 when it knows none.",
            )?,
            raft_leader_changes: b.add(IntCounter::new(
                "delayd_raft_leader_changes_total",
                "Leaders this node has seen established (a new leader, or a new term).",
            ))?,
            raft_last_log_index: single(
                "delayd_raft_last_log_index",
                "The last log index in this node's log.",
            )?,
            raft_applied_index: single(
                "delayd_raft_applied_index",
                "The last log index applied to this node's state machine.",
            )?,
            raft_replication_lag: b.gauge(
                "delayd_raft_replication_lag_entries",
                "On the leader: its last log index minus each follower's matched index.",
                &["follower"],
            )?,
            raft_quorum_ack: b.add(GaugeVec::new(
                Opts::new(
                    "delayd_raft_seconds_since_quorum_ack",
                    "On the leader: seconds since a quorum last acknowledged it.",
                ),
                &[],
            ))?,
            webhook_attempts: b.counter(
                "delayd_webhook_attempts_total",
                "Webhook requests by outcome: ok (2xx), status (another answer), timeout, error \
                 (no answer: connection refused, reset, DNS).",
                &["namespace", "queue", "outcome"],
            )?,
            webhook_dispatch_latency: b.histogram(
                "delayd_webhook_dispatch_latency_seconds",
                "For each webhook request: when it was sent minus the job's due time.",
                queue,
                LATENESS_SECONDS,
            )?,
            webhook_answer_seconds: b.histogram(
                "delayd_webhook_answer_seconds",
                "Webhook requests from sending to the receiver's answer (or the timeout).",
                queue,
                REQUEST_SECONDS,
            )?,
            webhook_in_flight: b.gauge(
                "delayd_webhook_in_flight",
                "Webhook requests in flight on this node (only the leader dispatches).",
                queue,
            )?,
            rocksdb_size: b.gauge(
                "delayd_rocksdb_size_bytes",
                "Space RocksDB uses, by kind: sst files, memtables, wal files.",
                &["kind"],
            )?,
            rocksdb_memory: b.gauge(
                "delayd_rocksdb_memory_bytes",
                "Memory RocksDB holds besides its memtables, by kind: table_readers (index and \
                 filter blocks of open SST files, outside the block cache), block_cache.",
                &["kind"],
            )?,
            rocksdb_write_stopped: b.gauge(
                "delayd_rocksdb_write_stopped",
                "1 while RocksDB stops every write of this node until a flush or compaction \
                 catches up, else 0; read at scrape time.",
                &[],
            )?,
            rocksdb_write_stalls: b.counter(
                "delayd_rocksdb_write_stalls_total",
                "Times RocksDB found a limit reached that stops (stop) or slows down (delay) \
                 this node's writes (unflushed memtables, level-0 files, compaction backlog): \
                 the largest count of any column family.",
                &["kind"],
            )?,
            log_fsyncs: b.counter(
                "delayd_log_fsyncs_total",
                "fdatasyncs of the Raft log's files: one per append, vote, truncation or purge.",
                &[],
            )?,
            log_fsync_seconds: b.add(CounterVec::new(
                Opts::new(
                    "delayd_log_fsync_seconds_total",
                    "Seconds the Raft log's fdatasyncs took, all together: divided by \
                     delayd_log_fsyncs_total, the mean fsync.",
                ),
                &[],
            ))?,
            log_size: b.gauge(
                "delayd_log_size_bytes",
                "The Raft log's files on disk (log/ in the data directory).",
                &[],
            )?,
            rocksdb_background_jobs: b.gauge(
                "delayd_rocksdb_background_jobs",
                "RocksDB's flushes and compactions at scrape time: running (state=running, a \
                 count of jobs) and due but not started (state=pending, a count of column \
                 families); all zero once the work a load left behind is done.",
                &["kind", "state"],
            )?,
            filesystem_available: b.gauge(
                "delayd_filesystem_available_bytes",
                "Bytes an unprivileged process may still write on the filesystem holding the \
                 data directory, read at scrape time.",
                &[],
            )?,
            filesystem_size: b.gauge(
                "delayd_filesystem_size_bytes",
                "Size of the filesystem holding the data directory, read at scrape time.",
                &[],
            )?,
            scrape: Mutex::new(()),
            store,
            replication,
            registry,
        })
    }

    /// The handles the store records into.
    pub fn store(&self) -> &StoreMetrics {
        &self.store
    }

    /// The handles the transport records replication into.
    pub fn replication(&self) -> &ReplicationMetrics {
        &self.replication
    }

    /// The node's registry, for callers that want to add their own metrics.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Counts an applied batch's job events and timer lateness. Runs on the apply path: a
    /// few map lookups per queue with events, nothing that blocks.
    pub fn record_applied(&self, effects: &Effects) {
        let c = &self.jobs_events;
        for (queue, e) in &effects.events {
            let labels = self.queue_labels(queue);
            for (counter, n) in [
                (&c.published, e.published),
                (&c.reserved, e.reserved),
                (&c.acked, e.acked),
                (&c.released, e.released),
                (&c.timed_out, e.timed_out),
                (&c.expired, e.expired),
                (&c.dead_lettered, e.dead_lettered),
            ] {
                if n > 0 {
                    counter.with_label_values(&labels).inc_by(n);
                }
            }
        }
        for ms in &effects.timer_lateness_ms {
            self.timer_lateness.observe(*ms as f64 / 1000.0);
        }
    }

    /// The labels of a queue's event counters: its own while fewer than [`MAX_QUEUES`]
    /// queues have counters, else the shared overflow labels.
    fn queue_labels<'q>(&self, queue: &'q QueueName) -> [&'q str; 2] {
        let mut counted = self.counted_queues.lock().unwrap_or_else(PoisonError::into_inner);
        if counted.contains(queue) || counted.len() < MAX_QUEUES && counted.insert(queue.clone()) {
            [queue.namespace.as_str(), queue.queue.as_str()]
        } else {
            OTHER_QUEUE
        }
    }

    /// Records one answered HTTP request: its route template, its method (one of a bounded
    /// set) and its status code.
    pub fn http_request(&self, route: &str, method: &str, status: &str, took: Duration) {
        self.http_requests.with_label_values(&[route, method, status]).inc();
        self.http_seconds.with_label_values(&[route, method]).observe(took.as_secs_f64());
    }

    /// Records one answered gRPC call.
    pub fn grpc_request(&self, method: &str, code: &str, took: Duration) {
        self.grpc_requests.with_label_values(&[method, code]).inc();
        self.grpc_seconds.with_label_values(&[method]).observe(took.as_secs_f64());
    }

    /// Records one command of another wire protocol (`command` from a bounded set).
    pub fn protocol_request(&self, protocol: &str, command: &str, outcome: &str, took: Duration) {
        self.protocol_requests.with_label_values(&[protocol, command, outcome]).inc();
        self.protocol_seconds.with_label_values(&[protocol, command]).observe(took.as_secs_f64());
    }

    /// Records a webhook request sent `late_ms` after its job was due.
    pub fn webhook_sent(&self, queue: &QueueName, late_ms: u64) {
        let labels = [queue.namespace.as_str(), queue.queue.as_str()];
        self.webhook_dispatch_latency.with_label_values(&labels).observe(late_ms as f64 / 1000.0);
        self.webhook_in_flight.with_label_values(&labels).inc();
    }

    /// Records a webhook request's end: its outcome and how long the answer took.
    pub fn webhook_done(&self, queue: &QueueName, outcome: &str, took: Duration) {
        let labels = [queue.namespace.as_str(), queue.queue.as_str()];
        self.webhook_in_flight.with_label_values(&labels).dec();
        self.webhook_answer_seconds.with_label_values(&labels).observe(took.as_secs_f64());
        let [ns, q] = labels;
        self.webhook_attempts.with_label_values(&[ns, q, outcome]).inc();
    }

    /// One more reserve parked waiting for a job (`1`), or one fewer (`-1`).
    pub(crate) fn reserve_waiting(&self, delta: i64) {
        self.reserves_waiting.add(delta);
    }

    /// Counts one reserve attempt sent to the leader, by whether it took a job and whether
    /// it rode a tick.
    pub(crate) fn reserve_attempt(&self, delivered: bool, rode: bool) {
        let outcome = if delivered { "delivered" } else { "empty" };
        let entry = if rode { "tick" } else { "own" };
        self.reserve_attempts.with_label_values(&[outcome, entry]).inc();
    }

    /// Counts one catch-up with the leader for unknown tokens (see `service/auth.rs`).
    pub fn token_catch_up(&self) {
        self.token_catch_ups.inc();
    }

    /// Counts one request refused because a token of `namespace` spent its `access` (`read`
    /// or `write`) rate limit. Namespaces are those that have tokens, so the series are
    /// bounded by the tokens an operator created.
    pub(crate) fn rate_limited(&self, namespace: &str, access: &str) {
        self.rate_limited.with_label_values(&[namespace, access]).inc();
    }

    /// Counts a leader newly seen by the leader watch.
    fn leader_changed(&self) {
        self.raft_leader_changes.inc();
    }

    /// Refreshes the scrape-time gauges from `cluster` and renders every metric in the text
    /// exposition format. Blocking: it reads RocksDB.
    pub fn render(&self, cluster: &Cluster) -> Result<String, ServiceError> {
        let _one_at_a_time = self.scrape.lock().unwrap_or_else(PoisonError::into_inner);
        let raft = cluster.metrics();
        self.refresh_raft(&raft);
        let reader = cluster.reader();
        if let Err(e) = self.refresh_queues(reader, cluster.clock().now_ms()) {
            // A follower installing a snapshot has no consistent state to show: leave the
            // queue gauges out of this scrape rather than fail all of it.
            tracing::debug!(error = %e, "queue gauges left out of this scrape");
        }
        self.refresh_storage(reader);
        self.refresh_filesystem(&cluster.config().data_dir);
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .map_err(|e| ServiceError::Internal(format!("encoding metrics: {e}")))
    }

    fn refresh_raft(&self, m: &RaftMetrics<TypeConfig>) {
        self.raft_term.set(to_i64(m.current_term));
        for (state, name) in RAFT_STATES {
            self.raft_state.with_label_values(&[name]).set(i64::from(m.state == state));
        }
        self.raft_leader_id.set(to_i64(m.current_leader.unwrap_or(0)));
        let last_log = m.last_log_index.unwrap_or(0);
        self.raft_last_log_index.set(to_i64(last_log));
        self.raft_applied_index.set(to_i64(m.last_applied.map_or(0, |l| l.index)));
        self.raft_replication_lag.reset();
        // Only a leader has a replication map; it includes the leader itself.
        for (id, matched) in m.replication.iter().flatten().filter(|(id, _)| **id != m.id) {
            let lag = last_log.saturating_sub(matched.map_or(0, |l| l.index));
            self.raft_replication_lag.with_label_values(&[id.to_string()]).set(to_i64(lag));
        }
        self.raft_quorum_ack.reset();
        if let Some(at) = m.last_quorum_acked.as_ref() {
            self.raft_quorum_ack.with_label_values::<&str>(&[]).set(at.elapsed().as_secs_f64());
        }
    }

    fn refresh_queues(&self, reader: &StateReader, now_ms: u64) -> Result<(), ServiceError> {
        self.jobs.reset();
        self.jobs_due_within.reset();
        let view = reader.read_view()?;
        let queues = query::queues(&view, None, MAX_QUEUES)?;
        if queues.len() == MAX_QUEUES {
            tracing::debug!(limit = MAX_QUEUES, "more queues than the gauges report");
        }
        let bounds = DUE_WITHIN.map(|(ms, _)| ms);
        for (queue, meta) in &queues {
            let (ns, q) = (queue.namespace.as_str(), queue.queue.as_str());
            for state in JobState::ALL {
                let n = meta.count(state);
                self.jobs.with_label_values(&[ns, q, state.as_str()]).set(to_i64(n));
            }
            // A queue without delayed jobs has nothing in its due histogram: skip the scan.
            let due = if meta.count(JobState::Delayed) == 0 {
                vec![0; bounds.len() + 1]
            } else {
                query::due_histogram(&view, queue, now_ms, &bounds)?
            };
            let labels = DUE_WITHIN.iter().map(|(_, l)| *l).chain(["+Inf"]);
            for (within, n) in labels.zip(due) {
                self.jobs_due_within.with_label_values(&[ns, q, within]).set(to_i64(n));
            }
        }
        Ok(())
    }

    fn refresh_storage(&self, reader: &StateReader) {
        match reader.storage_sizes() {
            Ok(s) => {
                for (kind, n) in
                    [("sst", s.sst_bytes), ("memtable", s.memtable_bytes), ("wal", s.wal_bytes)]
                {
                    self.rocksdb_size.with_label_values(&[kind]).set(to_i64(n));
                }
                let memory = [
                    ("table_readers", s.table_readers_bytes),
                    ("block_cache", s.block_cache_bytes),
                ];
                for (kind, n) in memory {
                    self.rocksdb_memory.with_label_values(&[kind]).set(to_i64(n));
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot read RocksDB's sizes"),
        }
        self.rocksdb_write_stopped.reset();
        match reader.write_stalls() {
            Ok(w) => {
                self.rocksdb_write_stopped.with_label_values::<&str>(&[]).set(i64::from(w.stopped));
                for (kind, n) in [("stop", w.stops), ("delay", w.delays)] {
                    follow(&self.rocksdb_write_stalls.with_label_values(&[kind]), n);
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot read RocksDB's write stalls"),
        }
        self.rocksdb_background_jobs.reset();
        match reader.background_work() {
            Ok(w) => {
                for (kind, state, n) in [
                    ("flush", "running", w.flushes_running),
                    ("flush", "pending", w.flushes_pending),
                    ("compaction", "running", w.compactions_running),
                    ("compaction", "pending", w.compactions_pending),
                ] {
                    self.rocksdb_background_jobs.with_label_values(&[kind, state]).set(to_i64(n));
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot read RocksDB's background work"),
        }
        self.log_size.reset();
        if let Some(log) = reader.log_flushes() {
            follow(&self.log_fsyncs.with_label_values::<&str>(&[]), log.fsyncs);
            let seconds = log.fsync_micros as f64 / 1e6;
            follow(&self.log_fsync_seconds.with_label_values::<&str>(&[]), seconds);
            self.log_size.with_label_values::<&str>(&[]).set(to_i64(log.disk_bytes));
        }
    }

    /// The free space and size of the filesystem holding `data_dir` (`statvfs`); both
    /// series are left out of a scrape that cannot ask.
    fn refresh_filesystem(&self, data_dir: &Path) {
        self.filesystem_available.reset();
        self.filesystem_size.reset();
        match rustix::fs::statvfs(data_dir) {
            Ok(fs) => {
                let block = fs.f_frsize;
                let available = fs.f_bavail.saturating_mul(block);
                let size = fs.f_blocks.saturating_mul(block);
                self.filesystem_available.with_label_values::<&str>(&[]).set(to_i64(available));
                self.filesystem_size.with_label_values::<&str>(&[]).set(to_i64(size));
            }
            Err(e) => tracing::debug!(error = %e, "cannot read the data directory's filesystem"),
        }
    }
}

/// Counts every leader this node sees established, until its Raft stops: a change of the
/// `(leader, term)` of its written vote once the vote is a granted one (committed), including
/// the first one after start.
pub(crate) async fn watch_leader(cluster: Cluster, metrics: Arc<Metrics>) {
    // The server state's watch changes with the leader and the vote alone (the full
    // metrics change several times per log entry); it closes when Raft stops.
    let mut server = cluster.server_watch();
    drop(cluster);
    let mut last = None;
    loop {
        // Leader and term both from the vote as written (`current_leader` comes from the
        // vote in memory, which may be a term ahead of it for a moment): a granted leader.
        // Not term 0: the node that forms the cluster writes itself a granted vote of term 0
        // to append the first membership entry, before any election (openraft's
        // `initialize`); counted, it made that node's count one more than the others'.
        let seen = {
            let m = server.borrow_and_update();
            let (vote, term) = (&m.vote, m.vote.leader_id().term());
            (vote.is_committed() && term > 0).then(|| (*vote.leader_id().node_id(), term))
        };
        if seen.is_some() && seen != last {
            metrics.leader_changed();
            last = seen;
        }
        if server.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn event_counters_stop_growing_new_queues_at_the_cap() {
        let m = Metrics::new(StoreMetrics::default(), &BuildInfo::default()).unwrap();
        let q = |i: usize| QueueName::new("ns", format!("q{i}"));
        for i in 0..MAX_QUEUES {
            assert_eq!(m.queue_labels(&q(i)), ["ns", format!("q{i}").as_str()]);
        }
        assert_eq!(m.queue_labels(&q(MAX_QUEUES)), OTHER_QUEUE);
        assert_eq!(m.queue_labels(&q(0)), ["ns", "q0"], "a counted queue keeps its labels");
    }
}
