//! The workload: producers and consumers driving the cluster while the nemesis works.
//!
//! - Producers publish unique bodies with random delays (a third with none), a fifth of them
//!   under a key from a small, reused pool, so the same key is published again and again
//!   while its job lives (idempotence, property (e)). A keyed publish's body is the key
//!   itself: whichever publish created the job, the body that comes out is the same.
//! - Consumers reserve with a random time-to-run and then, at random: ack; release with a
//!   delay; crash (walk away without acking); or ack late, after the lease ran out, with the
//!   stale token — which must be refused if someone else got the job meanwhile (property (c)).
//!
//! Every choice comes from the worker's own seeded RNG; a worker takes a new process id after
//! every unknown outcome and after a crash, as Jepsen does.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::client::{Answer, Client, Recorder};
use crate::history::{Call, Outcome};
use crate::plan::WorkloadPlan;

/// Shared by every worker of a run.
pub struct Shared {
    /// The cluster.
    pub client: Client,
    /// The history.
    pub recorder: Arc<Recorder>,
    /// Cleared to make the workers finish their current operation and return.
    pub running: AtomicBool,
    /// Hands out process ids.
    pub processes: AtomicU64,
}

impl Shared {
    fn new_process(&self) -> u64 {
        self.processes.fetch_add(1, Ordering::Relaxed)
    }

    fn running(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }
}

/// Starts the producers and consumers of `plan`; they run until `shared.running` is cleared.
pub fn spawn(plan: &WorkloadPlan, shared: &Arc<Shared>) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    let mut seeds = plan.worker_seeds.iter().copied().cycle();
    for w in 0..plan.producers {
        let (shared, plan, seed) = (shared.clone(), plan.clone(), seeds.next().unwrap_or(w.into()));
        tasks.push(tokio::spawn(producer(w, seed, plan, shared)));
    }
    for w in 0..plan.consumers {
        let (shared, plan, seed) = (shared.clone(), plan.clone(), seeds.next().unwrap_or(w.into()));
        tasks.push(tokio::spawn(consumer(seed, plan, shared, false)));
    }
    tasks
}

async fn producer(worker: u32, seed: u64, plan: WorkloadPlan, shared: Arc<Shared>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut process = shared.new_process();
    let mut seq = 0u64;
    let mut node = rng.random_range(0..shared.client.len());
    while shared.running() {
        seq += 1;
        let queue = &plan.queues[rng.random_range(0..plan.queues.len())];
        let delay_ms =
            if rng.random_bool(0.33) { 0 } else { rng.random_range(1..=plan.max_delay_ms) };
        // Keys live in five-minute epochs: the server remembers a key for ten minutes after its
        // job ends, so within an epoch a reused key must always answer the first job.
        let key = rng.random_bool(0.2).then(|| {
            let epoch = shared.recorder.now_ms() / 300_000;
            format!("k{epoch}-{}-{}", queue, rng.random_range(0..40))
        });
        let body = match &key {
            Some(k) => k.clone(),
            None => format!("p{worker}-{seq}"),
        };
        let invoke = shared.recorder.now_ms();
        let answer =
            shared.client.publish(node, queue, &body, delay_ms, key.as_deref(), plan.tries).await;
        let outcome = answer.outcome();
        let job_id = match answer {
            Answer::Ok(id) => Some(id),
            _ => None,
        };
        shared.recorder.record(
            process,
            invoke,
            outcome,
            Call::Publish { body, delay_ms, key, job_id },
        );
        if outcome == Outcome::Unknown {
            process = shared.new_process();
        }
        node = next_node(&mut rng, node, outcome, shared.client.len());
        // Think time keeps the history a size people can look at, and the consumers ahead of
        // the producers, so lateness measures the server rather than a backlog.
        tokio::time::sleep(Duration::from_millis(rng.random_range(10..50))).await;
    }
}

/// A consumer. In `drain` mode it always acks at once with a generous ttr, so the queues
/// empty out after the faults.
pub async fn consumer(seed: u64, plan: WorkloadPlan, shared: Arc<Shared>, drain: bool) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut process = shared.new_process();
    let queues = plan.queues.join(",");
    let mut node = rng.random_range(0..shared.client.len());
    while shared.running() {
        let ttr_ms = if drain { 10_000 } else { rng.random_range(500..3_000) };
        let invoke = shared.recorder.now_ms();
        let answer = shared.client.reserve(node, &queues, ttr_ms, 1).await;
        let outcome = answer.outcome();
        let got = match answer {
            Answer::Ok(Some((queue, d))) => Some((queue, d)),
            _ => None,
        };
        let delivered = got.iter().map(|(_, d)| d.clone()).collect();
        shared.recorder.record(process, invoke, outcome, Call::Reserve { ttr_ms, got: delivered });
        if outcome == Outcome::Unknown {
            process = shared.new_process();
        }
        node = next_node(&mut rng, node, outcome, shared.client.len());
        let Some((queue, d)) = got else {
            if outcome != Outcome::Ok {
                // The node is down or cut off; don't spin on it.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            continue;
        };

        let roll: f64 = if drain { 0.0 } else { rng.random() };
        if roll < 0.60 {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..50))).await;
            let outcome;
            (process, outcome) = ack(&shared, process, node, &queue, &d.job_id, &d.lease).await;
            node = next_node(&mut rng, node, outcome, shared.client.len());
        } else if roll < 0.75 {
            let delay_ms = rng.random_range(0..1_000);
            let invoke = shared.recorder.now_ms();
            let answer = shared.client.release(node, &queue, &d.job_id, &d.lease, delay_ms).await;
            let outcome = answer.outcome();
            let call = Call::Release { job_id: d.job_id.clone(), lease: d.lease.clone() };
            shared.recorder.record(process, invoke, outcome, call);
            if outcome == Outcome::Unknown {
                process = shared.new_process();
            }
            node = next_node(&mut rng, node, outcome, shared.client.len());
        } else if roll < 0.85 {
            // Crash: the job is abandoned mid-work; its lease must run out and it comes back.
            process = shared.new_process();
        } else {
            // Too slow: a worker thread that got stuck acks after the lease ran out, with the
            // token it was given, while this consumer goes on (as another process), so stuck
            // workers don't starve delivery and lateness stays the server's figure.
            let late = ttr_ms + rng.random_range(200..800);
            let slow = shared.new_process();
            let shared = shared.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(late)).await;
                ack(&shared, slow, node, &queue, &d.job_id, &d.lease).await;
            });
        }
    }
}

/// The node for a worker's next operation. A worker sticks to its node, as a real client
/// holds a connection, and moves to the next one when an operation there did not succeed,
/// so a dead or cut-off node costs each worker one timeout rather than a third of all its
/// operations. Now and then it moves anyway, to spread the load over every node.
fn next_node(rng: &mut StdRng, node: usize, outcome: Outcome, nodes: usize) -> usize {
    let nodes = nodes.max(1);
    if outcome != Outcome::Ok {
        (node + 1) % nodes
    } else if rng.random_bool(0.05) {
        rng.random_range(0..nodes)
    } else {
        node
    }
}

/// Acks and records it; returns the process id to go on with and the outcome.
async fn ack(
    shared: &Shared,
    process: u64,
    node: usize,
    queue: &str,
    job: &str,
    lease: &str,
) -> (u64, Outcome) {
    let invoke = shared.recorder.now_ms();
    let answer = shared.client.ack(node, queue, job, lease).await;
    let outcome = answer.outcome();
    let call = Call::Ack { job_id: job.to_string(), lease: lease.to_string() };
    shared.recorder.record(process, invoke, outcome, call);
    let process = if outcome == Outcome::Unknown { shared.new_process() } else { process };
    (process, outcome)
}
