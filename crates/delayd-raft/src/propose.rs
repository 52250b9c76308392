//! The proposer: one task that turns concurrent requests into few Raft entries.
//!
//! openraft appends and fsyncs entries in the order they come, so a log entry per request caps
//! throughput at the fsync rate. Instead every request hands its commands to this task, which
//! proposes whatever has queued up as one [`Entry`] and, while that entry is being replicated,
//! lets the next batch gather. The batch is stamped with the leader's clock here, once.
//!
//! Up to `max_in_flight` entries are in flight at once: while one waits for its fsync and
//! the followers' acknowledgements, the next is already appended and sent, so a round trip
//! to the quorum no longer bounds throughput to one batch per round trip. When every slot is
//! busy, requests keep queueing and the next entry carries them all. Requests that are in
//! flight together come from different clients (each waits for its own answer), so the
//! order in which their entries reach the log is theirs to race for; replicated time never
//! runs backwards whatever the stamps' order.
//!
//! Bounds: an entry holds at most `max_batch` commands and `max_entry_bytes` bytes (by
//! [`Command::size_bytes`]); a request larger than that alone is refused with 413 before it
//! queues, so every entry fits the transport. Every proposal has a deadline: openraft can
//! leave a write unanswered for long (a deposed leader that catches up by snapshot), so an
//! entry that is not answered within `timeout` frees its in-flight slot and its requests get
//! 503 "outcome unknown" instead of stalling every later write and the timer pump.
//!
//! Answers: a request's outcomes exist once its entry is applied, and it is answered then.
//! A request whose caller does not need them ([`Proposer::propose_committed`], a plain ack,
//! which HTTP answers 204 whatever it found) is answered as soon as its entry is committed:
//! durable on a quorum, so applied by every node and every later leader, before any entry
//! proposed after it. Nothing a client does next can see the state without it: later writes go
//! through the log after it, and linearizable reads wait until the commit index is applied.
//! A one-job consumer waits for two entries per job, and this spares one of them the apply.
//!
//! Load shedding: the bytes of requests queued or in flight are bounded by
//! [`PENDING_ENTRIES`] entries' worth. What the disks cannot take within the request timeout
//! (say, 80 concurrent 1 MiB publishes on three nodes sharing one disk) is refused at once with
//! 503 "nothing was written" — a clear answer the client can retry — instead of waiting in
//! line until its deadline passes with an unknown outcome.

use delayd_core::{Command, Entry, Outcome};
use delayd_store::Raft;
use openraft::async_runtime::watch::WatchReceiver;
use openraft::error::{Fatal, RaftError};
use openraft::impls::ProgressResponder;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::task::JoinHandle;

use crate::clock::Clock;
use crate::error::ClusterError;
use crate::metrics::ReplicationMetrics;

struct Pending {
    commands: Vec<Command>,
    /// Answered (with no outcomes) once the entry is committed, not once it is applied.
    at_commit: bool,
    bytes: usize,
    /// How many entries had been answered when the request was queued: it tells a request
    /// that waited through the last entry from one sent after that entry's answers.
    answered: u64,
    reply: oneshot::Sender<Result<Vec<Outcome>, ClusterError>>,
}

/// How many full entries' worth of request bytes may be queued or in flight at once.
pub const PENDING_ENTRIES: usize = 4;

/// How the proposer packs and times entries.
#[derive(Clone, Copy, Debug)]
pub struct ProposerConfig {
    /// Most commands in one entry.
    pub max_batch: usize,
    /// Most bytes in one entry.
    pub max_entry_bytes: usize,
    /// Most entries in flight at once.
    pub max_in_flight: usize,
    /// Longest wait for a batch to fill under load.
    pub linger: Duration,
    /// Longest wait for an entry to be committed and applied.
    pub timeout: Duration,
}

/// Handle to the proposer task.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Pending>,
    max_batch: usize,
    max_entry_bytes: usize,
    timeout: Duration,
    /// One permit per byte of request queued or in flight.
    pending_bytes: Arc<Semaphore>,
    /// Entries answered so far (each counted before its requests are answered).
    answered: Arc<AtomicU64>,
}

impl Proposer {
    /// Starts the proposer over `raft`, stamping each entry with `clock` and counting the
    /// entries it proposes in `metrics`. Its task ends when `shutdown` flips to true (entries
    /// already handed to Raft finish or time out on their own); the handle lets the cluster
    /// join it.
    pub fn spawn(
        raft: Raft,
        clock: Clock,
        config: ProposerConfig,
        metrics: ReplicationMetrics,
        shutdown: watch::Receiver<bool>,
    ) -> (Self, JoinHandle<()>) {
        let config = ProposerConfig {
            max_batch: config.max_batch.max(1),
            max_in_flight: config.max_in_flight.max(1),
            ..config
        };
        let (tx, rx) = mpsc::channel(config.max_batch * 4);
        let answered = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(run(raft, clock, rx, config, answered.clone(), metrics, shutdown));
        let pending_bytes = Arc::new(Semaphore::new(config.max_entry_bytes * PENDING_ENTRIES));
        let proposer = Proposer {
            tx,
            max_batch: config.max_batch,
            max_entry_bytes: config.max_entry_bytes,
            timeout: config.timeout,
            pending_bytes,
            answered,
        };
        (proposer, task)
    }

    /// Proposes `commands` atomically (they land in the same entry) and returns their
    /// outcomes once the entry is committed and applied, or 503 once the deadline passed.
    pub async fn propose(&self, commands: Vec<Command>) -> Result<Vec<Outcome>, ClusterError> {
        self.submit(commands, false).await
    }

    /// Proposes `commands` atomically and returns once their entry is committed, without
    /// waiting for it to be applied and without their outcomes: for a caller that answers
    /// the same whatever they are (see the module docs). 503 once the deadline passed.
    pub async fn propose_committed(&self, commands: Vec<Command>) -> Result<(), ClusterError> {
        self.submit(commands, true).await.map(drop)
    }

    async fn submit(
        &self,
        commands: Vec<Command>,
        at_commit: bool,
    ) -> Result<Vec<Outcome>, ClusterError> {
        let bytes: usize = commands.iter().map(Command::size_bytes).sum();
        if bytes > self.max_entry_bytes {
            return Err(ClusterError::TooLarge(format!(
                "the request needs {bytes} bytes in the log, more than one entry holds \
                 ({}, max_entry_bytes)",
                self.max_entry_bytes
            )));
        }
        // Held until the outcome is known (or the deadline passed).
        let permits = u32::try_from(bytes).unwrap_or(u32::MAX);
        let Ok(_pending) = self.pending_bytes.clone().try_acquire_many_owned(permits) else {
            return Err(ClusterError::Unavailable(format!(
                "overloaded: {} bytes of writes are already waiting for the log; nothing was \
                 written, retry later",
                self.max_entry_bytes * PENDING_ENTRIES
            )));
        };
        let (reply, rx) = oneshot::channel();
        let deadline = tokio::time::Instant::now() + self.timeout;
        let answered = self.answered.load(Ordering::Acquire);
        let pending = Pending { commands, at_commit, bytes, answered, reply };
        let queued = tokio::time::timeout_at(deadline, self.tx.send(pending));
        match queued.await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(ClusterError::Unavailable("node is shutting down".into())),
            Err(_) => {
                return Err(ClusterError::Unavailable(format!(
                    "the proposer is saturated: not queued within {:?}; nothing was written",
                    self.timeout
                )))
            }
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(ClusterError::Unavailable("node is shutting down".into())),
            Err(_) => Err(not_committed(self.timeout)),
        }
    }

    /// Most commands one entry holds.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// Most bytes of commands one entry holds.
    pub fn max_entry_bytes(&self) -> usize {
        self.max_entry_bytes
    }

    /// Proposes one command.
    pub async fn propose_one(&self, command: Command) -> Result<Outcome, ClusterError> {
        self.propose(vec![command])
            .await?
            .pop()
            .ok_or_else(|| ClusterError::Internal("entry applied without an outcome".into()))
    }
}

/// What the next entry waits for (up to the linger) before it is proposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fill {
    /// This many requests sent since the last entry was answered, besides every request
    /// that was already waiting.
    Returned(usize),
    /// This many commands.
    Commands(usize),
}

/// The next entry's [`Fill`].
///
/// With followers, every entry costs the whole cluster its appends, fsyncs, messages and
/// wake-ups, and fewer, fuller entries pay: the entry takes the requests that queued while
/// the last one was in flight and waits for as many new ones as that entry answered, whose
/// clients are expected back. At low load (one request answered) the first request sent
/// since meets it, so nothing waits.
///
/// Alone, a node's entry costs one local fsync, and the wait would cost more than it saves
/// (measured: 0.89× the publishes at 64 clients): it waits only for half as many commands as
/// its last entry carried.
fn fill_target(
    replicated: bool,
    last_requests: usize,
    last_commands: usize,
    max_batch: usize,
) -> Fill {
    if replicated {
        Fill::Returned(last_requests)
    } else {
        Fill::Commands((last_commands / 2).clamp(1, max_batch.max(1)))
    }
}

/// An entry being gathered: its requests, and their counts measured against its [`Fill`].
struct Gathered {
    target: Fill,
    /// Entries answered when the gathering began: a request queued at that count or later
    /// was sent after the last entry's answers.
    answered: u64,
    requests: Vec<Pending>,
    /// Of `requests`, those sent since the last entry was answered.
    returned: usize,
    commands: usize,
    bytes: usize,
    /// Whether the linger ran out before the target was met.
    expired: bool,
}

impl Gathered {
    fn new(target: Fill, answered: u64) -> Self {
        Gathered {
            target,
            answered,
            requests: Vec::new(),
            returned: 0,
            commands: 0,
            bytes: 0,
            expired: false,
        }
    }

    /// Takes queued requests until the entry is full, or the queue is empty and the target
    /// met; while the target is not met, waits for more up to `linger` from now. Returns a
    /// request that would have overfilled the entry: it opens the next one.
    async fn take_more(
        &mut self,
        rx: &mut mpsc::Receiver<Pending>,
        linger: Duration,
        max_batch: usize,
        max_entry_bytes: usize,
    ) -> Option<Pending> {
        let until = tokio::time::Instant::now() + linger;
        while self.commands < max_batch && self.bytes < max_entry_bytes {
            let next = match rx.try_recv() {
                Ok(p) => Some(p),
                Err(_) if self.filled() || linger.is_zero() => None,
                Err(_) => match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(p) => p,
                    Err(_) => {
                        self.expired = true;
                        None
                    }
                },
            };
            let p = next?;
            if self.commands + p.commands.len() > max_batch
                || self.bytes + p.bytes > max_entry_bytes
            {
                return Some(p);
            }
            self.add(p);
        }
        None
    }

    fn add(&mut self, p: Pending) {
        self.returned += usize::from(p.answered >= self.answered);
        self.commands += p.commands.len();
        self.bytes += p.bytes;
        self.requests.push(p);
    }

    /// Whether the entry may go without waiting for more. Requests that were already
    /// queued are taken whatever this says; it is asked only once the queue is empty.
    fn filled(&self) -> bool {
        match self.target {
            Fill::Returned(n) => self.returned >= n,
            Fill::Commands(n) => self.commands >= n,
        }
    }
}

/// How one request of an entry is answered.
struct Answer {
    /// How many commands it has: they follow the previous request's in the entry.
    len: usize,
    /// Answered at the commit ([`Proposer::propose_committed`]).
    at_commit: bool,
    /// `None` once answered.
    reply: Option<oneshot::Sender<Result<Vec<Outcome>, ClusterError>>>,
}

fn not_committed(timeout: Duration) -> ClusterError {
    ClusterError::Unavailable(format!("not committed within {timeout:?}; the outcome is unknown"))
}

async fn run(
    raft: Raft,
    clock: Clock,
    mut rx: mpsc::Receiver<Pending>,
    config: ProposerConfig,
    answered: Arc<AtomicU64>,
    counters: ReplicationMetrics,
    mut shutdown: watch::Receiver<bool>,
) {
    let ProposerConfig { max_batch, max_entry_bytes, max_in_flight, linger, timeout } = config;
    let slots = Arc::new(Semaphore::new(max_in_flight));
    let mut last_size = 0;
    let mut last_requests = 0;
    // Whether the entry goes to followers too: read per entry, membership can change.
    let metrics = raft.metrics();
    // A request taken off the queue that did not fit the previous entry: it opens the next.
    let mut carried: Option<Pending> = None;
    loop {
        // A slot first, then the requests: whatever queues while all slots are busy goes
        // into the next entry together.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return,
            },
            _ = shutdown.wait_for(|s| *s) => return,
        };
        // Read once the slot is back, i.e. after the last entry's count went up: a request
        // stamped with this count or later was sent after that entry's answers.
        let answered_so_far = answered.load(Ordering::Acquire);
        let first = match carried.take() {
            Some(p) => p,
            None => tokio::select! {
                p = rx.recv() => match p {
                    Some(p) => p,
                    None => return,
                },
                _ = shutdown.wait_for(|s| *s) => return,
            },
        };
        // Closed-loop clients answered by the previous entry send their next requests over
        // the following fraction of a millisecond. Proposing at once would take only the
        // requests that queued while it was in flight and leave the answered clients for the
        // entry after: under load the clients then split into two cohorts whose entries
        // alternate, each half the size it could be. See `fill_target`.
        let replicated =
            metrics.borrow_watched().membership_config.membership().voter_ids().nth(1).is_some();
        let target = fill_target(replicated, last_requests, last_size, max_batch);
        let mut gathered = Gathered::new(target, answered_so_far);
        gathered.add(first);
        carried = gathered.take_more(&mut rx, linger, max_batch, max_entry_bytes).await;
        last_size = gathered.commands;
        last_requests = gathered.requests.len();
        counters.proposed(last_requests, last_size, gathered.expired);
        let mut commands = Vec::with_capacity(gathered.commands);
        let mut answers = Vec::with_capacity(last_requests);
        for p in gathered.requests {
            answers.push(Answer {
                len: p.commands.len(),
                at_commit: p.at_commit,
                reply: Some(p.reply),
            });
            commands.extend(p.commands);
        }
        let entry = Entry::new(clock.now_ms(), commands);
        let (raft, answered) = (raft.clone(), answered.clone());
        let commit_seconds = counters.commit_seconds();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let mut counted = false;
            // Counted before any client hears back, so that whatever they send next is known
            // to come after this entry (see `Gathered`): at the commit when it is reported,
            // else once the entry is done.
            let mut count_answered = || {
                if !std::mem::replace(&mut counted, true) {
                    answered.fetch_add(1, Ordering::Release);
                }
            };
            let written = tokio::time::timeout(timeout, async {
                let (responder, committed, applied) = ProgressResponder::new();
                raft.client_write_ff(entry, Some(responder)).await.map_err(RaftError::Fatal)?;
                if committed.await.is_ok() {
                    count_answered();
                    for answer in answers.iter_mut().filter(|a| a.at_commit) {
                        if let Some(reply) = answer.reply.take() {
                            let _ = reply.send(Ok(Vec::new()));
                        }
                    }
                }
                match applied.await {
                    Ok(result) => result.map_err(RaftError::APIError),
                    // The core dropped the responder: it stopped.
                    Err(_) => Err(RaftError::Fatal(Fatal::Stopped)),
                }
            })
            .await;
            commit_seconds.observe(started.elapsed().as_secs_f64());
            count_answered();
            let Ok(written) = written else {
                for reply in answers.into_iter().filter_map(|a| a.reply) {
                    let _ = reply.send(Err(not_committed(timeout)));
                }
                return; // the slot goes with it
            };
            match written {
                Ok(resp) => {
                    let mut outcomes = resp.data.into_iter();
                    for answer in answers {
                        let these = outcomes.by_ref().take(answer.len).collect();
                        if let Some(reply) = answer.reply {
                            let _ = reply.send(Ok(these));
                        }
                    }
                }
                Err(e) => {
                    let err = ClusterError::from(e);
                    for reply in answers.into_iter().filter_map(|a| a.reply) {
                        let _ = reply.send(Err(err.clone()));
                    }
                }
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether an entry of requests stamped `(answered, commands)` meets `target`.
    fn gather(target: Fill, answered: u64, requests: &[(u64, usize)]) -> bool {
        let mut g = Gathered::new(target, answered);
        for &(stamp, commands) in requests {
            g.add(Pending {
                commands: vec![Command::Tick { limit: 1 }; commands],
                at_commit: false,
                bytes: 0,
                answered: stamp,
                reply: oneshot::channel().0,
            });
        }
        g.filled()
    }

    #[test]
    fn with_followers_the_next_entry_waits_for_the_answered_clients() {
        assert_eq!(fill_target(true, 64, 64, 512), Fill::Returned(64));
        // One client: its next request, sent after the answer, is enough, however many
        // commands it carries (an ack riding on a reserve).
        assert!(gather(Fill::Returned(1), 7, &[(7, 2)]));
        // Nothing answered yet (the first entry): the first request goes at once.
        assert!(gather(fill_target(true, 0, 0, 512), 0, &[(0, 1)]));
    }

    #[test]
    fn a_request_that_waited_through_the_last_entry_is_not_counted_as_a_returning_one() {
        // 64 clients in two cohorts: 32 waited through entry 7 (queued when 6 entries were
        // answered), 32 were answered by it and come back.
        let mut batch = vec![(6, 1); 32];
        batch.extend([(7, 1); 31]);
        assert!(!gather(Fill::Returned(32), 7, &batch), "one answered client is still to come");
        batch.push((7, 1));
        assert!(gather(Fill::Returned(32), 7, &batch));
        // An answered client whose next request was queued before the proposer looked is
        // counted once: 32 returning requests meet the target of 32 on their own.
        assert!(gather(Fill::Returned(32), 7, &[(7, 1); 32]));
    }

    fn request(answered: u64, commands: usize) -> Pending {
        Pending {
            commands: vec![Command::Tick { limit: 1 }; commands],
            at_commit: false,
            bytes: commands,
            answered,
            reply: oneshot::channel().0,
        }
    }

    const LINGER: Duration = Duration::from_millis(40);

    #[tokio::test]
    async fn an_entry_short_of_its_returning_clients_waits_out_the_linger() {
        // The last entry (the 7th answered) carried two requests; only one of its clients is
        // back, so the entry waits for the other until the linger runs out.
        let (tx, mut rx) = mpsc::channel(8);
        let mut g = Gathered::new(Fill::Returned(2), 7);
        g.add(request(7, 1));
        let started = tokio::time::Instant::now();
        assert!(g.take_more(&mut rx, LINGER, 512, 1 << 20).await.is_none());
        assert!(g.expired);
        assert!(started.elapsed() >= LINGER);
        assert_eq!(g.requests.len(), 1);
        drop(tx);
    }

    #[tokio::test]
    async fn an_entry_whose_clients_are_back_goes_without_waiting() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut g = Gathered::new(Fill::Returned(2), 7);
        g.add(request(7, 1));
        // A request that waited through the last entry is taken but does not count; the
        // second returning client does.
        tx.send(request(6, 1)).await.expect("queued");
        tx.send(request(7, 1)).await.expect("queued");
        assert!(g.take_more(&mut rx, Duration::from_secs(60), 512, 1 << 20).await.is_none());
        assert!(!g.expired);
        assert_eq!((g.requests.len(), g.returned), (3, 2));
    }

    #[tokio::test]
    async fn a_request_that_would_overfill_the_entry_opens_the_next() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut g = Gathered::new(Fill::Returned(3), 7);
        g.add(request(7, 3));
        tx.send(request(7, 2)).await.expect("queued");
        let carried = g.take_more(&mut rx, LINGER, 4, 1 << 20).await;
        assert_eq!(carried.map(|p| p.commands.len()), Some(2));
        assert!(!g.expired, "a full entry goes without waiting out the linger");
        assert_eq!(g.commands, 3);
    }

    #[test]
    fn alone_the_next_entry_waits_for_half_the_last_one() {
        assert_eq!(fill_target(false, 32, 32, 512), Fill::Commands(16));
        assert_eq!(fill_target(false, 1, 1, 512), Fill::Commands(1));
        assert_eq!(fill_target(false, 2, 2000, 512), Fill::Commands(512));
        assert!(!gather(Fill::Commands(16), 0, &[(0, 15)]));
        assert!(gather(Fill::Commands(16), 0, &[(0, 15), (0, 1)]));
    }
}
