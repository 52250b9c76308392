//! The streaming calls: PublishStream's batches and ReserveStream's credit-based push.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use delayd_core::QueueName;
use delayd_proto::v1 as pb;
use tokio::sync::{mpsc, watch, Notify, Semaphore};
use tonic::{Status, Streaming};

use super::convert;
use super::status::{fail, item_error, status};
use crate::error::ServiceError;
use crate::service::reserve::{ReserveOrder, ReserveRequest};
use crate::service::validate::{queue_name, MAX_RESERVE_COUNT};
use crate::service::{Principal, Service};

/// Most acks of one reserve stream being committed at once; the next message of the stream
/// is read only when one finishes.
pub const MAX_ACKS_IN_FLIGHT: usize = 64;
/// How long one long-poll of a reserve stream waits before it polls again.
const STREAM_POLL: Duration = Duration::from_secs(30);
/// How long a reserve stream whose token's write budget is spent waits before trying again.
const RATE_LIMITED_PAUSE: Duration = Duration::from_millis(100);

/// One batch of a publish stream, answered on its own: a failed batch does not fail the
/// stream, whose other batches were committed.
pub(super) async fn publish_batch(
    service: &Service,
    caller: &Principal,
    b: pb::PublishBatch,
) -> pb::BatchResult {
    let result = async {
        // The stream may outlive its token.
        service.revalidate(caller).await?;
        let queue = queue_name(&b.namespace, &b.queue)?;
        let p = convert::params(b.options, None)?;
        service.publish_bulk(caller, queue, &p, || Ok(b.bodies), b.keys).await
    };
    match result.await {
        Ok(published) => pb::BatchResult {
            job_ids: published.iter().map(|p| p.id.to_string()).collect(),
            existed: published.iter().map(|p| p.existed).collect(),
            error: None,
        },
        Err(e) => pb::BatchResult {
            job_ids: Vec::new(),
            existed: Vec::new(),
            error: Some(item_error(&e)),
        },
    }
}

/// Credit and end-of-stream shared by a reserve stream's reader and reserver.
#[derive(Default)]
pub(super) struct Flow {
    state: Mutex<FlowState>,
    changed: Notify,
}

#[derive(Default)]
struct FlowState {
    credit: u64,
    closed: bool,
}

impl Flow {
    fn update(&self, f: impl FnOnce(&mut FlowState)) {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner));
        self.changed.notify_one();
    }

    fn get(&self) -> (u64, bool) {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (s.credit, s.closed)
    }
}

pub(super) type Out = mpsc::Sender<Result<pb::ReserveStreamReply, Status>>;

/// Reads credits and acks until the client closes its side or the reserver is done.
pub(super) async fn read_stream(
    service: Service,
    caller: Principal,
    mut inbound: Streaming<pb::ReserveStreamRequest>,
    flow: Arc<Flow>,
    out: Out,
    mut done: watch::Receiver<bool>,
) {
    use pb::reserve_stream_request::Msg;
    let acks = Arc::new(Semaphore::new(MAX_ACKS_IN_FLIGHT));
    loop {
        // An ack slot before the next message: a client acking faster than acks commit is
        // slowed down instead of spawning without bound.
        let slot = tokio::select! {
            s = acks.clone().acquire_owned() => s,
            _ = done.wait_for(|d| *d) => break,
        };
        let Ok(slot) = slot else { break };
        let msg = tokio::select! {
            m = inbound.message() => m,
            _ = done.wait_for(|d| *d) => break,
        };
        match msg {
            Ok(Some(pb::ReserveStreamRequest { msg: Some(Msg::Credit(c)) })) => {
                flow.update(|s| s.credit = s.credit.saturating_add(c.n.into()));
            }
            Ok(Some(pb::ReserveStreamRequest { msg: Some(Msg::Ack(r)) })) => {
                let (service, out, caller) = (service.clone(), out.clone(), caller.clone());
                // Acks run beside the stream so a slow commit never delays credit.
                tokio::spawn(async move {
                    let _slot = slot;
                    let result = async {
                        service.revalidate(&caller).await?;
                        let (queue, id) = convert::job_ref(&r)?;
                        service.ack(&caller, queue, id, r.lease).await
                    };
                    let ack = match result.await {
                        Ok(removed) => pb::AckResult { job_id: r.job_id, removed, error: None },
                        Err(e) => pb::AckResult {
                            job_id: r.job_id,
                            removed: false,
                            error: Some(item_error(&e)),
                        },
                    };
                    let reply = pb::ReserveStreamReply {
                        msg: Some(pb::reserve_stream_reply::Msg::Ack(ack)),
                    };
                    let _ = out.send(Ok(reply)).await;
                });
            }
            Ok(Some(_)) => {
                let e =
                    ServiceError::bad_request("after subscribe, send only credit and ack messages");
                let _ = out.send(Err(status(&e))).await;
                break;
            }
            Ok(None) | Err(_) => break,
        }
    }
    flow.update(|s| s.closed = true);
}

/// Reserves up to the outstanding credit and pushes what it gets, until the stream ends.
pub(super) async fn push_deliveries(
    service: Service,
    caller: Principal,
    queues: Vec<QueueName>,
    ttr_ms: Option<u64>,
    flow: Arc<Flow>,
    out: Out,
) {
    let stop = service.stopped();
    tokio::pin!(stop);
    loop {
        let (credit, closed) = flow.get();
        if closed || out.is_closed() {
            return;
        }
        if credit == 0 {
            tokio::select! {
                _ = flow.changed.notified() => continue,
                _ = &mut stop => break,
                _ = out.closed() => return,
            }
        }
        // The token must still exist: a stream outlives the request that opened it.
        if let Err(e) = service.revalidate(&caller).await {
            let _ = out.send(Err(fail(&service, &e))).await;
            return;
        }
        let count = credit.min(MAX_RESERVE_COUNT.into()) as u32;
        let request = ReserveRequest {
            queues: queues.clone(),
            count,
            ttr_ms,
            wait: STREAM_POLL,
            acks: Vec::new(),
            order: ReserveOrder::QueueOrder,
        };
        let reserve = service.reserve(&caller, request);
        let got = tokio::select! {
            r = reserve => r,
            _ = &mut stop => break,
            _ = out.closed() => return,
            // Only the end of the stream interrupts a reserve; more credit waits for the
            // next round.
            _ = async { loop { flow.changed.notified().await; if flow.get().1 { return } } } => return,
        };
        match got {
            // A stopping node's reserves come back at once: end the stream so that the
            // client opens another one elsewhere.
            Ok(got) if got.deliveries.is_empty() && service.is_draining() => break,
            Ok(got) => {
                let n = got.deliveries.len() as u64;
                flow.update(|s| s.credit = s.credit.saturating_sub(n));
                let now = service.now_ms();
                let mut got = got.deliveries.into_iter();
                while let Some(d) = got.next() {
                    let reply = pb::ReserveStreamReply {
                        msg: Some(pb::reserve_stream_reply::Msg::Delivery(convert::delivery(
                            d.clone(),
                            now,
                        ))),
                    };
                    if out.send(Ok(reply)).await.is_err() {
                        // The stream is gone: what it never received goes back at once.
                        service.return_deliveries(std::iter::once(d).chain(got).collect()).await;
                        return;
                    }
                }
            }
            // Each reserve is one write of the token's budget: a spent budget waits, it does
            // not end the stream.
            Err(ServiceError::RateLimited { .. }) => {
                tokio::select! {
                    _ = tokio::time::sleep(RATE_LIMITED_PAUSE) => continue,
                    _ = &mut stop => break,
                    _ = out.closed() => return,
                }
            }
            Err(e) => {
                let _ = out.send(Err(fail(&service, &e))).await;
                return;
            }
        }
    }
    let _ = out.send(Err(Status::unavailable("node is shutting down"))).await;
}
