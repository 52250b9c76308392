//! Reserving: taking ready jobs under a lease, waiting for them with a long-poll, and
//! acking the previous jobs in the same round trip.
//!
//! A reserve that finds nothing parks on the [`super::waiters`] of its queues, which the
//! apply path wakes when an entry makes jobs ready there. On the leader it also rides the
//! timer pump's next tick ([`delayd_raft::riders`]), which delivers jobs coming due in the
//! tick's own entry. Deliveries whose caller has gone
//! by the time the entry commits are released at once, never left leased for their ttr.

use std::sync::Arc;
use std::time::Duration;

use delayd_core::{query, Command, Delivery, JobId, Outcome, QueueName, Reply};
use delayd_raft::{RideOutcome, Rider};
use futures::future::select_all;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::auth::{Access, Principal, Scope};
use super::validate::{MAX_RESERVE_COUNT, MAX_WAIT};
use super::{unexpected, Service};
use crate::error::ServiceError;

/// What a consumer asks for.
#[derive(Clone, Debug)]
pub struct ReserveRequest {
    /// The queues to take from, in order of preference, all of one namespace.
    pub queues: Vec<QueueName>,
    /// Most jobs to take, 1..=[`MAX_RESERVE_COUNT`].
    pub count: u32,
    /// The reservation's time to run; `None`: each job's own.
    pub ttr_ms: Option<u64>,
    /// How long to wait for a job when none is ready, at most [`MAX_WAIT`].
    pub wait: Duration,
    /// The consumer's previous jobs (at most [`MAX_RESERVE_COUNT`]), acked in the same log
    /// entry as a reserve attempt: the first, or, when nothing is ready and the reserve
    /// waits, the one a wake-up starts.
    pub acks: Vec<AckFirst>,
    /// Which ready jobs go first.
    pub order: ReserveOrder,
}

/// Which ready jobs a reserve over several queues takes first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReserveOrder {
    /// The first queue's, then the next queue's (lmstfy's and Disque's multi-queue reserve).
    #[default]
    QueueOrder,
    /// The most urgent across the queues: lowest priority value, then longest in line
    /// (beanstalkd's reserve over the tubes it watches).
    MostUrgent,
}

/// A job a consumer acks on its next reserve.
#[derive(Clone, Debug)]
pub struct AckFirst {
    /// Its queue.
    pub queue: QueueName,
    /// The job.
    pub id: JobId,
    /// The lease of its reservation; `None` acks whoever holds it.
    pub lease: Option<u64>,
}

/// What a reserve got.
#[derive(Clone, Debug, Default)]
pub struct Reserved {
    /// Whether each acked job was removed, in the order the acks were asked for; empty when
    /// none was. A lease that is no longer the job's acks nothing and answers `false`, as a
    /// plain ack would answer its conflict.
    pub acked: Vec<bool>,
    /// The jobs now leased to the caller.
    pub deliveries: Vec<Delivery>,
}

impl Service {
    /// Reserves up to `count` jobs from the queues in order, waiting up to `wait` for one,
    /// after acking the consumer's previous jobs named in `acks`: the acks ride in the same
    /// log entry as a reserve attempt, so a consumer that acks and reserves makes one round
    /// trip, and one that reserves many at a time acks them all on its next reserve. The
    /// acks happen even when nothing is ready: at once, or, when the reserve is going to
    /// wait, with the attempt a wake-up starts (see [`Service::ack_hold`]).
    pub async fn reserve(
        &self,
        caller: &Principal,
        request: ReserveRequest,
    ) -> Result<Reserved, ServiceError> {
        let ReserveRequest { queues, count, ttr_ms, wait, acks, order } = request;
        self.subscribe(caller, &queues, ttr_ms)?;
        if acks.iter().any(|a| a.queue.namespace != queues[0].namespace) {
            return Err(ServiceError::bad_request("a reserve's queues are of one namespace"));
        }
        if acks.len() > MAX_RESERVE_COUNT as usize {
            return Err(ServiceError::bad_request(format!(
                "at most {MAX_RESERVE_COUNT} jobs are acked on one reserve"
            )));
        }
        if count == 0 || count > MAX_RESERVE_COUNT {
            return Err(ServiceError::bad_request(format!(
                "count must be 1 to {MAX_RESERVE_COUNT}"
            )));
        }
        if wait > MAX_WAIT {
            return Err(ServiceError::bad_request("timeout must be at most 600 s"));
        }
        let started = Instant::now();
        let deadline = started + wait;
        // The queues' wake-ups, subscribed only once the first attempt found nothing: most
        // reserves under load find a job at once and never wait. Released however this
        // ends, a dropped request included.
        let mut guard: Option<WaitGuard<'_>> = None;
        // A stopping node answers its long-polls at once (module `health`); watched only
        // once the reserve is about to wait, so a reserve that finds a job at once pays
        // nothing for it.
        let mut drain = None;
        let mut ack = PendingAck {
            service: self,
            commands: acks
                .into_iter()
                .map(|a| Command::Ack { queue: a.queue, id: a.id, lease: a.lease })
                .collect(),
        };
        let mut acked = Vec::new();
        // When held acks must go at the latest; `None` when they are not held.
        let ack_due = self
            .ack_hold(&ack.commands, &queues, wait)
            .await
            .map(|hold| (started + hold).min(deadline));
        // The first attempt goes to the leader, which answers "nothing ready" from its own
        // (current) state without a log entry, so a follower needs no read-index round trip
        // first. Later attempts follow this replica's wake-ups: a job made ready anywhere
        // reaches every replica's waiters when the replica applies it. A reserve holding its
        // ack has just seen nothing ready here: its first round only subscribes, and the
        // next looks again.
        let mut first_round = true;
        loop {
            // Register before looking, so a job made ready in between still wakes us. The
            // first attempt needs none: a job made ready after the leader's answer reaches
            // this replica later, and is either applied before the subscription below (and
            // seen by the local look that follows it) or wakes it.
            let mut woken: Vec<_> = guard
                .iter()
                .flat_map(|g| g.notifies.iter())
                .map(|n| Box::pin(n.notified()))
                .collect();
            for w in &mut woken {
                w.as_mut().enable();
            }
            // One reading of the clock per round: held acks fall due by the deadline, so a
            // round past the deadline always sends them with an attempt.
            let now = Instant::now();
            let ack_overdue = !ack.commands.is_empty() && ack_due.is_some_and(|due| now >= due);
            let attempt = if std::mem::take(&mut first_round) {
                ack_due.is_none() || ack_overdue
            } else {
                ack_overdue || self.read(true, |v| query::anything_ready(v, &queues)).await?
            };
            if attempt {
                let reserve = reserve_command(&queues, count, ttr_ms, order);
                let acks = std::mem::take(&mut ack.commands);
                let got = self.reserve_once(acks, Some(reserve)).await?;
                self.metrics().reserve_attempt(!got.deliveries.is_empty(), false);
                // The acks go with one attempt only; later ones answer none.
                acked.extend(got.acked);
                if !got.deliveries.is_empty() || Instant::now() >= deadline {
                    return Ok(Reserved { acked, deliveries: got.deliveries });
                }
            } else if now >= deadline {
                return Ok(Reserved { acked, deliveries: Vec::new() });
            }
            if guard.is_none() {
                drop(woken); // empty: nothing was subscribed yet
                guard = Some(WaitGuard {
                    service: self,
                    queues: &queues,
                    notifies: queues.iter().map(|q| self.inner.waiters.subscribe(q)).collect(),
                });
                continue; // subscribed: look again before waiting
            }
            let drain = drain.get_or_insert_with(|| self.drain_watch());
            if *drain.borrow_and_update() {
                // Answered without waiting any longer, once held acks are written.
                if !ack.commands.is_empty() {
                    let acks = std::mem::take(&mut ack.commands);
                    acked.extend(self.reserve_once(acks, None).await?.acked);
                }
                return Ok(Reserved { acked, deliveries: Vec::new() });
            }
            let _parked = Parked::new(self);
            // Before the ride below takes the held acks: while they are held, the hold's end
            // wakes the reserve.
            let wake_at = ack_due.filter(|_| !ack.commands.is_empty()).unwrap_or(deadline);
            // On the leader the reserve, with its held acks, rides the timer pump's next tick,
            // which delivers in its own entry instead of waking us to propose another.
            let mut ride = if self.inner.cluster.is_leader() {
                let reserve = reserve_command(&queues, count, ttr_ms, order);
                Some(Ride::park(self, &mut ack.commands, reserve)?)
            } else {
                None
            };
            let rode = tokio::select! {
                _ = select_all(woken) => None,
                _ = tokio::time::sleep_until(wake_at) => None,
                _ = drain.changed() => None,
                got = async {
                    match ride.as_mut() {
                        Some(ride) => ride.outcome().await,
                        None => std::future::pending().await,
                    }
                } => Some(got),
            };
            let Some(mut ride) = ride else { continue };
            let got = match rode {
                Some(got) => got,
                // It never rode: the acks are held again, and the round looks again.
                None if ride.withdraw() => {
                    ack.commands = std::mem::take(&mut ride.acks);
                    continue;
                }
                // Taken by the pump: its entry is on the way (bounded by the proposer's
                // timeout), and the jobs it delivers are ours.
                None => ride.outcome().await,
            };
            let got = match got {
                Ok(got) => got,
                // This node stopped leading before the tick was proposed: nothing was
                // written, so the reserve goes on as a waiter, its acks held again.
                Err(ServiceError::NotLeader(_)) => {
                    ack.commands = std::mem::take(&mut ride.acks);
                    continue;
                }
                // The tick's outcome is unknown. Without acks there is nothing to tell: the
                // reserve waits on (should the entry have leased it jobs, they come back when
                // their ttr ends). The acks' outcome, the consumer must hear.
                Err(ServiceError::Unavailable(e)) if ride.acks.is_empty() => {
                    tracing::debug!(error = %e, "a reserve's ride failed; it waits on");
                    continue;
                }
                Err(e) => return Err(e),
            };
            self.metrics().reserve_attempt(!got.deliveries.is_empty(), true);
            acked.extend(got.acked);
            if !got.deliveries.is_empty() {
                return Ok(Reserved { acked, deliveries: got.deliveries });
            }
            // Nothing for it after all (the due lease sent its job to the dead letter, or an
            // earlier rider took the job): carry on as a waiter woken for nothing.
        }
    }

    /// How long a reserve may hold the acks it carries, or `None` to send them at once.
    ///
    /// A consumer that acks its last jobs on the next reserve usually finds nothing ready
    /// when many consumers share a queue: its acks would take a log entry of their own, and
    /// the reserve a wake-up starts later a second one. Held, the acks go into the woken
    /// reserve's entry instead. They are held at most `ack_hold` and never past the
    /// reserve's own wait; then they go with a reserve attempt as before.
    ///
    /// Held only when this replica shows nothing ready (else the reserve goes at once, acks
    /// and all), and when every acked job's lease, as this replica knows it, has twice the
    /// hold left and the request timeout besides: a lease that ran out while its ack was
    /// held, or while the ack was being committed, would hand a finished job to another
    /// consumer. "Left" counts from the later of this node's clock and the replicated one,
    /// so a clock behind the leader's does not stretch it. A failed read only means no hold.
    async fn ack_hold(
        &self,
        acks: &[Command],
        queues: &[QueueName],
        wait: Duration,
    ) -> Option<Duration> {
        let hold = self.config().ack_hold.min(wait);
        if acks.is_empty() || hold.is_zero() {
            return None;
        }
        // The earliest of the acked jobs' lease deadlines, with the replicated clock;
        // `None` when a job is ready, or an acked job holds no such lease.
        let lease_deadline_ms = self
            .read(true, |v| {
                if query::anything_ready(v, queues)? {
                    return Ok(None);
                }
                let mut earliest = u64::MAX;
                for ack in acks {
                    let Command::Ack { queue, id, lease } = ack else { return Ok(None) };
                    let held_lease = query::job(v, queue, *id)?
                        .and_then(|job| job.lease)
                        .filter(|l| lease.is_none_or(|token| token == l.token));
                    let Some(l) = held_lease else { return Ok(None) };
                    earliest = earliest.min(l.deadline_ms);
                }
                Ok(Some((earliest, query::clock(v)?)))
            })
            .await
            .ok()
            .flatten();
        let (deadline_ms, replicated_now_ms) = lease_deadline_ms?;
        let now_ms = self.now_ms().max(replicated_now_ms);
        let left = Duration::from_millis(deadline_ms.saturating_sub(now_ms));
        let needed = hold.saturating_mul(2).saturating_add(self.config().request_timeout);
        (left >= needed).then_some(hold)
    }

    /// Reserves one job by id, out of line, if it is ready, delayed or dead (beanstalkd's
    /// `reserve-job`): `Ok(None)` when it does not exist or is reserved already.
    pub async fn reserve_job(
        &self,
        caller: &Principal,
        queue: QueueName,
        id: JobId,
        ttr_ms: Option<u64>,
    ) -> Result<Option<Delivery>, ServiceError> {
        self.subscribe(caller, std::slice::from_ref(&queue), ttr_ms)?;
        let command = Command::ReserveJob { queue, id, ttr_ms, lease_seed: rand::random() };
        match self.reserve_once(Vec::new(), Some(command)).await {
            Ok(got) => Ok(got.deliveries.into_iter().next()),
            Err(ServiceError::NotFound(_) | ServiceError::Conflict(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Authorizes a consumer to reserve from `queues` (one write of its budget) and checks
    /// the queues and ttr: the first step of every reserve, and on its own the opening of a
    /// stream that will reserve again and again (each reserve is authorized again), so a bad
    /// subscription is refused before it starts.
    pub fn subscribe(
        &self,
        caller: &Principal,
        queues: &[QueueName],
        ttr_ms: Option<u64>,
    ) -> Result<(), ServiceError> {
        let Some(namespace) = queues.first().map(|q| q.namespace.as_str()) else {
            return Err(ServiceError::bad_request("no queue named"));
        };
        self.authorize(caller, Scope::Namespace(namespace, Access::Write))?;
        if queues.iter().any(|q| q.namespace != namespace) {
            return Err(ServiceError::bad_request("a reserve's queues are of one namespace"));
        }
        if let Some(ttr) = ttr_ms {
            self.checks().horizon("ttr", ttr)?;
        }
        Ok(())
    }

    /// Proposes `acks`, then `reserve` when there is one (without, the acks go alone, as
    /// when a reserve ends without another attempt), in one entry written by a task of its
    /// own, so that a caller going away while it is under way cannot cancel it: deliveries
    /// whose caller has gone (the client disconnected, the request was dropped) while the
    /// entry was being committed are released at once instead of staying leased for their
    /// ttr — with one try left they would otherwise go to the dead letter without ever being
    /// handed out — and acks whose write failed after their caller had gone are sent again:
    /// nobody else would, and the finished jobs would be delivered again when their ttr ran
    /// out.
    async fn reserve_once(
        &self,
        acks: Vec<Command>,
        reserve: Option<Command>,
    ) -> Result<Reserved, ServiceError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let service = self.clone();
        let reserves = reserve.is_some();
        let commands = acks.iter().cloned().chain(reserve).collect();
        tokio::spawn(async move {
            let got = match service.write(commands).await {
                Ok(outcomes) => reserved(outcomes, reserves),
                Err(e) => Err(e),
            };
            hand_over(&service, tx, got, acks);
        });
        let mut outcome = ReserveOutcome { rx: Some(rx), service: self };
        outcome.recv(|| ServiceError::Internal("the reserve task ended".into())).await
    }

    /// Puts back deliveries that never reached their consumer: returned at once with their
    /// lease (so a consumer that did get one can still tell), best effort — whatever fails
    /// here comes back when its ttr runs out. The caller was authorized when it reserved them.
    pub async fn return_deliveries(&self, deliveries: Vec<Delivery>) {
        let jobs = deliveries.into_iter().map(|d| (d.job.queue, d.job.id, d.lease)).collect();
        self.return_jobs(jobs).await;
    }

    /// Puts reserved jobs back in line at once because their holder is gone, not counted
    /// as releases (see [`Command::Return`]); each with the lease it was reserved under.
    /// Best effort, as [`Service::return_deliveries`].
    pub async fn return_jobs(&self, jobs: Vec<(QueueName, JobId, u64)>) {
        if jobs.is_empty() {
            return;
        }
        let n = jobs.len();
        let commands = jobs
            .into_iter()
            .map(|(queue, id, lease)| Command::Return { queue, id, lease })
            .collect();
        match self.write(commands).await {
            Ok(_) => tracing::debug!(jobs = n, "returned jobs whose holder is gone"),
            Err(e) => {
                tracing::warn!(jobs = n, error = %e, "cannot return jobs whose holder is gone")
            }
        }
    }
}

/// One reserve attempt's command, with a fresh lease seed.
fn reserve_command(
    queues: &[QueueName],
    count: u32,
    ttr_ms: Option<u64>,
    order: ReserveOrder,
) -> Command {
    let (queues, lease_seed) = (queues.to_vec(), rand::random());
    match order {
        ReserveOrder::QueueOrder => Command::Reserve { queues, count, ttr_ms, lease_seed },
        ReserveOrder::MostUrgent => Command::ReserveUrgent { queues, count, ttr_ms, lease_seed },
    }
}

/// A parked reserve riding the timer pump's next tick ([`delayd_raft::riders`]): its
/// commands wait with the pump until a tick takes them or the reserve withdraws them.
///
/// Dropped while still parked (the client went away), it withdraws them and still sends the
/// acks among them, as [`PendingAck`] would; dropped after the pump took them, the
/// deliveries are returned, as for any reserve whose caller has gone ([`ReserveOutcome`]).
struct Ride<'a> {
    service: &'a Service,
    /// Its place with the pump, until it is withdrawn.
    ticket: Option<u64>,
    /// The acks that ride with the reserve (copies; the pump holds the commands).
    acks: Vec<Command>,
    outcome: ReserveOutcome<'a>,
}

impl<'a> Ride<'a> {
    /// Parks `reserve`, after the held acks (taken from `held` once parked), with the pump.
    /// `reserve` must be a reserve command (`Reserve` or `ReserveUrgent`); anything else is
    /// refused, and the acks stay held.
    fn park(
        service: &'a Service,
        held: &mut Vec<Command>,
        reserve: Command,
    ) -> Result<Ride<'a>, ServiceError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (owner, unsent) = (service.clone(), held.clone());
        let deliver = move |outcomes: RideOutcome| {
            let got = outcomes.map_err(ServiceError::from).and_then(|o| reserved(o, true));
            hand_over(&owner, tx, got, unsent);
        };
        let commands = held.iter().cloned().chain([reserve]).collect();
        let rider = Rider::new(commands, Box::new(deliver))
            .ok_or_else(|| ServiceError::Internal("a ride without a reserve".into()))?;
        let acks = std::mem::take(held);
        Ok(Ride {
            service,
            ticket: Some(service.inner.cluster.riders().park(rider)),
            acks,
            outcome: ReserveOutcome { rx: Some(rx), service },
        })
    }

    /// Waits for the ride's outcome: once the pump took it, it comes within the proposer's
    /// timeout, or the pump's end closes the channel (the outcome is then unknown).
    async fn outcome(&mut self) -> Result<Reserved, ServiceError> {
        let unknown =
            || ServiceError::Unavailable("the timer pump stopped; the outcome is unknown".into());
        self.outcome.recv(unknown).await
    }

    /// Takes the commands back from the pump, if it has not taken them: `true` when it had
    /// not, and the acks in [`Ride::acks`] are the caller's to send again; `false` when it had,
    /// and the outcome is coming.
    fn withdraw(&mut self) -> bool {
        let Some(ticket) = self.ticket.take() else { return false };
        self.service.inner.cluster.riders().withdraw(ticket).is_some()
    }
}

impl Drop for Ride<'_> {
    fn drop(&mut self) {
        if self.withdraw() {
            drop(PendingAck { service: self.service, commands: std::mem::take(&mut self.acks) });
        }
    }
}

/// Hands a reserve's outcome to its caller. When the caller has gone, nobody else will act
/// on it: the jobs it was given are returned (in a task of its own), and, if it failed,
/// `unsent` (the acks that went with it, of which the caller no longer holds a copy) are
/// sent again; an ack that did go removes nothing the second time.
fn hand_over(
    service: &Service,
    tx: tokio::sync::oneshot::Sender<Result<Reserved, ServiceError>>,
    got: Result<Reserved, ServiceError>,
    unsent: Vec<Command>,
) {
    match tx.send(got) {
        Ok(()) => {}
        Err(Ok(undelivered)) => spawn_return(service, undelivered.deliveries),
        Err(Err(_)) => drop(PendingAck { service, commands: unsent }),
    }
}

/// Returns `deliveries` in a task of its own, if there are any and a runtime is still there
/// to run it.
fn spawn_return(service: &Service, deliveries: Vec<Delivery>) {
    if deliveries.is_empty() {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let service = service.clone();
    runtime.spawn(async move { service.return_deliveries(deliveries).await });
}

/// The outcomes of acks and, when `reserve`, the reserve after them: whether each ack
/// removed its job, and the deliveries. A rejected ack (its lease is no longer the job's)
/// removed nothing.
fn reserved(mut outcomes: Vec<Outcome>, reserve: bool) -> Result<Reserved, ServiceError> {
    let mut deliveries = Vec::new();
    if reserve {
        // The reserve comes last, after the acks.
        let outcome = outcomes.pop().ok_or_else(|| ServiceError::Internal("no outcome".into()))?;
        match outcome? {
            Reply::Reserved(d) => deliveries = d,
            r => return Err(unexpected(r)),
        }
    }
    Ok(Reserved { acked: outcomes.iter().map(removed).collect(), deliveries })
}

/// Whether an ack's outcome removed its job. A rejected ack (its lease is no longer the
/// job's) removed nothing.
fn removed(outcome: &Outcome) -> bool {
    matches!(outcome, Ok(Reply::Removed(true)))
}

/// The receiving end of a reserve's outcome. Dropped before it was read (the caller went
/// away), it closes the channel and returns whatever arrived in the meantime: together with
/// the sender's check, no outcome can fall between the two.
struct ReserveOutcome<'a> {
    rx: Option<tokio::sync::oneshot::Receiver<Result<Reserved, ServiceError>>>,
    service: &'a Service,
}

impl ReserveOutcome<'_> {
    /// Waits for the outcome; `closed` says what a sender that went without answering means.
    /// Once it is read, dropping this returns nothing.
    async fn recv(
        &mut self,
        closed: impl FnOnce() -> ServiceError,
    ) -> Result<Reserved, ServiceError> {
        let rx = self.rx.as_mut().ok_or_else(|| ServiceError::Internal("no receiver".into()))?;
        let got = rx.await.map_err(|_| closed());
        self.rx = None;
        got?
    }
}

impl Drop for ReserveOutcome<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else { return };
        rx.close();
        if let Ok(Ok(undelivered)) = rx.try_recv() {
            spawn_return(self.service, undelivered.deliveries);
        }
    }
}

/// The acks a reserve carries, until they go into the log. Should the reserve end without
/// sending them (the client went away while they were held, or an error ended the
/// reserve), they are still sent, in a task of their own: the consumer had finished the
/// jobs, and an ack lost would deliver its job again after its ttr.
struct PendingAck<'a> {
    service: &'a Service,
    commands: Vec<Command>,
}

impl Drop for PendingAck<'_> {
    fn drop(&mut self) {
        if self.commands.is_empty() {
            return;
        }
        // No runtime (it is shutting down): nothing can be sent any more.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (service, acks) = (self.service.clone(), std::mem::take(&mut self.commands));
        runtime.spawn(async move {
            if let Err(e) = service.write(acks).await {
                tracing::warn!(error = %e, "cannot send the acks of a reserve that ended without them");
            }
        });
    }
}

/// A reserve parked waiting, counted in `delayd_reserves_waiting` while it lives.
struct Parked<'a>(&'a Service);

impl<'a> Parked<'a> {
    fn new(service: &'a Service) -> Parked<'a> {
        service.metrics().reserve_waiting(1);
        Parked(service)
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.metrics().reserve_waiting(-1);
    }
}

/// Releases a reserve's waiter subscriptions when the reserve ends or is dropped.
struct WaitGuard<'a> {
    service: &'a Service,
    queues: &'a [QueueName],
    notifies: Vec<Arc<Notify>>,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.notifies.clear();
        self.service.inner.waiters.release(self.queues);
    }
}
