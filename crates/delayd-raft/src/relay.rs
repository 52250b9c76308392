//! The follower's relay: writes bound for the leader share `Forward` calls.
//!
//! A follower serving many clients would otherwise make one call per request, and each call
//! costs an HTTP/2 stream, an encode and a decode and a task on both nodes. The relay queues
//! operations instead and sends whatever queued while earlier calls were in flight as one
//! [`ForwardOp::Batch`]; the leader serves the members concurrently (so its proposer packs
//! them into an entry together, as it would have packed separate calls) and answers one
//! [`ForwardReply::Batch`], in order. At low load a call carries one operation and nothing
//! waits: batching comes only from operations that arrive while calls are busy.
//!
//! Only short operations ride in batches — proposals and read-index requests. A batch is
//! answered when its slowest member is, so membership changes (which may wait for a learner
//! to catch up) are sent on their own.
//!
//! Bounds: at most [`MAX_IN_FLIGHT`] calls at once, [`MAX_OPS`] operations and `max_bytes`
//! bytes of commands per call (an operation larger than that alone travels alone). A batch
//! call's deadline is the latest of its members'; each caller still gives up at its own. A
//! caller that gives up while its operation is still queued removes it, and so can say that
//! nothing was written; once taken into a call, the outcome is unknown.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use delayd_core::{codec, Command};
use delayd_store::NodeId;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::Status;

use crate::forward::{ForwardOp, ForwardReply};
use crate::network::{ForwardError, GrpcNetwork};

/// Most `Forward` calls in flight at once. More calls would mean smaller batches and more
/// per-call work on both nodes; fewer would leave the leader's proposer idle between them.
pub const MAX_IN_FLIGHT: usize = 4;
/// Most operations in one call.
pub const MAX_OPS: usize = 256;

/// A queued operation's fate, settled once by whoever gets there first: the relay task
/// taking it into a call, or its caller giving up at the deadline. So a caller that gave up
/// knows whether the operation can still reach the leader.
const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const ABANDONED: u8 = 2;

struct Queued {
    op: ForwardOp,
    state: Arc<AtomicU8>,
    bytes: usize,
    leader: NodeId,
    addr: String,
    deadline: Instant,
    reply: oneshot::Sender<Result<ForwardReply, ForwardError>>,
}

/// Handle to the relay task.
#[derive(Clone)]
pub struct Relay {
    network: GrpcNetwork,
    tx: mpsc::Sender<Queued>,
    stats: Arc<Counters>,
}

#[derive(Default)]
struct Counters {
    calls: AtomicU64,
    ops: AtomicU64,
}

/// What the relay has sent since the node started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// `Forward` calls made.
    pub calls: u64,
    /// Operations they carried.
    pub ops: u64,
}

impl Relay {
    /// Starts the relay over `network`; its task ends when `shutdown` flips to true.
    pub fn spawn(
        network: GrpcNetwork,
        max_bytes: usize,
        shutdown: watch::Receiver<bool>,
    ) -> (Relay, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(MAX_OPS * MAX_IN_FLIGHT);
        let stats = Arc::new(Counters::default());
        let task = tokio::spawn(run(network.clone(), max_bytes, rx, stats.clone(), shutdown));
        (Relay { network, tx, stats }, task)
    }

    /// Calls and operations sent so far.
    pub fn stats(&self) -> RelayStats {
        RelayStats {
            calls: self.stats.calls.load(Ordering::Relaxed),
            ops: self.stats.ops.load(Ordering::Relaxed),
        }
    }

    /// Whether `op` may share a call with others (see the module docs).
    fn batches(op: &ForwardOp) -> bool {
        matches!(op, ForwardOp::Propose(_) | ForwardOp::ReadIndex)
    }

    /// Sends `op` to `leader` at `addr` and returns the leader's answer: in a call of its
    /// own when it may not share one (see the module docs), else in one with whatever else is
    /// queued. The errors mean what [`GrpcNetwork::forward`]'s do.
    pub async fn send(
        &self,
        leader: NodeId,
        addr: &str,
        op: ForwardOp,
        deadline: Instant,
    ) -> Result<ForwardReply, ForwardError> {
        if !Self::batches(&op) {
            return forward_alone(&self.network, leader, addr, &op, deadline).await;
        }
        let bytes = match &op {
            ForwardOp::Propose(commands) => commands.iter().map(Command::size_bytes).sum(),
            _ => 0,
        };
        let (reply, rx) = oneshot::channel();
        let state = Arc::new(AtomicU8::new(QUEUED));
        let queued = Queued {
            op,
            state: state.clone(),
            bytes,
            leader,
            addr: addr.to_string(),
            deadline,
            reply,
        };
        match tokio::time::timeout_at(deadline, self.tx.send(queued)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(ForwardError::Unreachable("node is shutting down".into())),
            Err(_) => return Err(ForwardError::Unreachable("the relay is saturated".into())),
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(answer)) => answer,
            // The relay drops what it holds only when it stops, before sending it.
            Ok(Err(_)) => Err(ForwardError::Unreachable("node is shutting down".into())),
            // Still queued: it never will be sent, so nothing was written.
            Err(_) if abandon(&state) => {
                Err(ForwardError::Unreachable("not sent before the deadline".into()))
            }
            Err(_) => Err(ForwardError::Status(Status::deadline_exceeded(
                "no answer from the leader in time",
            ))),
        }
    }
}

/// The caller's side: true when the operation was still queued and now never will be sent.
fn abandon(state: &AtomicU8) -> bool {
    state.compare_exchange(QUEUED, ABANDONED, Ordering::AcqRel, Ordering::Acquire).is_ok()
}

/// The relay's side: true when the operation may go into a call (its caller still waits).
fn take(q: &Queued) -> bool {
    q.state.compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire).is_ok()
}

async fn run(
    network: GrpcNetwork,
    max_bytes: usize,
    mut rx: mpsc::Receiver<Queued>,
    stats: Arc<Counters>,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    // An operation taken off the queue that did not fit the previous call: it opens the next.
    let mut carried: Option<Queued> = None;
    loop {
        // A slot first, then the operations: whatever queues while every call is busy goes
        // into the next one together.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return,
            },
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let first = match carried.take() {
            Some(q) => q,
            None => tokio::select! {
                q = rx.recv() => match q {
                    Some(q) => q,
                    None => return,
                },
                _ = shutdown.wait_for(|s| *s) => return,
            },
        };
        // Its caller gave up while it queued: drop it (the caller said nothing was written).
        if !take(&first) {
            continue;
        }
        let mut bytes = first.bytes;
        let mut batch = vec![first];
        while batch.len() < MAX_OPS {
            let Ok(next) = rx.try_recv() else { break };
            if next.state.load(Ordering::Acquire) == ABANDONED {
                continue;
            }
            let same = next.leader == batch[0].leader && next.addr == batch[0].addr;
            if !same || bytes + next.bytes > max_bytes {
                carried = Some(next);
                break;
            }
            if !take(&next) {
                continue;
            }
            bytes += next.bytes;
            batch.push(next);
        }
        stats.calls.fetch_add(1, Ordering::Relaxed);
        stats.ops.fetch_add(batch.len() as u64, Ordering::Relaxed);
        let network = network.clone();
        tokio::spawn(async move {
            call(&network, batch).await;
            drop(slot);
        });
    }
}

/// Sends one call and answers every operation in it.
async fn call(network: &GrpcNetwork, mut batch: Vec<Queued>) {
    let Some(deadline) = batch.iter().map(|q| q.deadline).max() else { return };
    let (leader, addr) = (batch[0].leader, batch[0].addr.clone());
    if batch.len() == 1 {
        if let Some(q) = batch.pop() {
            let _ = q.reply.send(forward_alone(network, leader, &addr, &q.op, deadline).await);
        }
        return;
    }
    let timeout = deadline.saturating_duration_since(Instant::now());
    let (ops, replies): (Vec<_>, Vec<_>) = batch.into_iter().map(|q| (q.op, q.reply)).unzip();
    let sent = network.forward(leader, &addr, codec::encode(&ForwardOp::Batch(ops)), timeout);
    let answers = match sent.await.and_then(|bytes| decode(&bytes)) {
        Ok(ForwardReply::Batch(answers)) if answers.len() == replies.len() => answers,
        // The leader refused the call as a whole (say, it is not the leader any more).
        Ok(ForwardReply::Failed(e)) => {
            for reply in replies {
                let _ = reply.send(Ok(ForwardReply::Failed(e.clone())));
            }
            return;
        }
        Ok(other) => {
            let e = Status::internal(format!("a batch answered with {other:?}"));
            for reply in replies {
                let _ = reply.send(Err(ForwardError::Status(e.clone())));
            }
            return;
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
            return;
        }
    };
    for (answer, reply) in answers.into_iter().zip(replies) {
        let _ = reply.send(Ok(answer));
    }
}

/// One operation in a call of its own.
async fn forward_alone(
    network: &GrpcNetwork,
    leader: NodeId,
    addr: &str,
    op: &ForwardOp,
    deadline: Instant,
) -> Result<ForwardReply, ForwardError> {
    let timeout = deadline.saturating_duration_since(Instant::now());
    decode(&network.forward(leader, addr, codec::encode(op), timeout).await?)
}

fn decode(bytes: &[u8]) -> Result<ForwardReply, ForwardError> {
    // An answer that cannot be read came after the leader served the call: outcome unknown.
    codec::decode(bytes)
        .map_err(|e| ForwardError::Status(Status::internal(format!("bad forward reply: {e}"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller giving up and the relay taking the operation exclude each other: an
    /// abandoned operation is never sent, a taken one is never reported as unsent.
    #[test]
    fn an_operation_is_either_abandoned_or_taken() {
        let state = AtomicU8::new(QUEUED);
        assert!(abandon(&state));
        assert!(state
            .compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_err());
        let state = AtomicU8::new(QUEUED);
        assert!(state.compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire).is_ok());
        assert!(!abandon(&state), "a taken operation may have reached the leader");
    }
}
