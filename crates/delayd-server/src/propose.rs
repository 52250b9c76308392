//! The proposer: one task that turns concurrent requests into few Raft entries.
//!
//! openraft 0.9 appends and fsyncs entries one after another, so a log entry per request caps
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

use delayd_core::{Command, Entry, Outcome};
use delayd_store::Raft;
use openraft::error::{ClientWriteError, RaftError};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::clock::Clock;
use crate::error::ServiceError;

struct Pending {
    commands: Vec<Command>,
    reply: oneshot::Sender<Result<Vec<Outcome>, ServiceError>>,
}

/// Handle to the proposer task.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Pending>,
}

impl Proposer {
    /// Starts the proposer over `raft`, packing at most `max_batch` commands per entry,
    /// keeping at most `max_in_flight` entries in flight, waiting at most `linger` for a
    /// batch to fill under load, and stamping each entry with `clock`.
    pub fn spawn(
        raft: Raft,
        clock: Clock,
        max_batch: usize,
        max_in_flight: usize,
        linger: Duration,
    ) -> Self {
        let (tx, rx) = mpsc::channel(max_batch.max(1) * 4);
        tokio::spawn(run(raft, clock, rx, max_batch.max(1), max_in_flight.max(1), linger));
        Proposer { tx }
    }

    /// Proposes `commands` atomically (they land in the same entry) and returns their
    /// outcomes once the entry is committed and applied.
    pub async fn propose(&self, commands: Vec<Command>) -> Result<Vec<Outcome>, ServiceError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Pending { commands, reply })
            .await
            .map_err(|_| ServiceError::Unavailable("node is shutting down".into()))?;
        rx.await.map_err(|_| ServiceError::Unavailable("node is shutting down".into()))?
    }

    /// Proposes one command.
    pub async fn propose_one(&self, command: Command) -> Result<Outcome, ServiceError> {
        self.propose(vec![command])
            .await?
            .pop()
            .ok_or_else(|| ServiceError::Internal("entry applied without an outcome".into()))
    }
}

async fn run(
    raft: Raft,
    clock: Clock,
    mut rx: mpsc::Receiver<Pending>,
    max_batch: usize,
    max_in_flight: usize,
    linger: Duration,
) {
    let slots = Arc::new(Semaphore::new(max_in_flight));
    let mut last_size = 0;
    loop {
        // A slot first, then the requests: whatever queues while all slots are busy goes
        // into the next entry together.
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let Some(first) = rx.recv().await else { return };
        let mut size = first.commands.len();
        let mut batch = vec![first];
        // Closed-loop clients answered by the previous entry send their next requests over
        // the following fraction of a millisecond. Proposing at once would send a handful
        // and leave the rest for a whole round trip later; so, under load, linger until half
        // as many commands as last time have arrived, or `linger` has passed. At low load
        // the target is one command, and nothing waits.
        let target = (last_size / 2).clamp(1, max_batch);
        let until = tokio::time::Instant::now() + linger;
        while size < max_batch {
            let next = match rx.try_recv() {
                Ok(p) => Some(p),
                Err(_) if size >= target || linger.is_zero() => None,
                Err(_) => tokio::time::timeout_at(until, rx.recv()).await.ok().flatten(),
            };
            let Some(p) = next else { break };
            size += p.commands.len();
            batch.push(p);
        }
        last_size = size;
        let mut commands = Vec::with_capacity(size);
        let mut lens = Vec::with_capacity(batch.len());
        let mut replies = Vec::with_capacity(batch.len());
        for p in batch {
            lens.push(p.commands.len());
            commands.extend(p.commands);
            replies.push(p.reply);
        }
        let entry = Entry { now_ms: clock.now_ms(), commands };
        let raft = raft.clone();
        tokio::spawn(async move {
            match raft.client_write(entry).await {
                Ok(resp) => {
                    let mut outcomes = resp.data.into_iter();
                    for (len, reply) in lens.into_iter().zip(replies) {
                        let _ = reply.send(Ok(outcomes.by_ref().take(len).collect()));
                    }
                }
                Err(e) => {
                    let err = write_error(e);
                    for reply in replies {
                        let _ = reply.send(Err(clone_error(&err)));
                    }
                }
            }
            drop(slot);
        });
    }
}

fn write_error(e: RaftError<u64, ClientWriteError<u64, openraft::BasicNode>>) -> ServiceError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            ServiceError::NotLeader(f.leader_id)
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            ServiceError::Internal(e.to_string())
        }
        RaftError::Fatal(f) => ServiceError::Unavailable(format!("raft stopped: {f}")),
    }
}

fn clone_error(e: &ServiceError) -> ServiceError {
    match e {
        ServiceError::Unavailable(m) => ServiceError::Unavailable(m.clone()),
        ServiceError::NotLeader(l) => ServiceError::NotLeader(*l),
        other => ServiceError::Internal(other.to_string()),
    }
}
