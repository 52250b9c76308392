//! Folding commit-only AppendEntries into the request that follows them.
//!
//! When an entry commits and the leader has no newer entry to send, openraft sends each
//! follower an AppendEntries with no entries, only to carry the new commit index. Under a
//! closed-loop load the next entry follows a fraction of a millisecond later (the clients
//! answered by the commit send their next requests), so every entry used to cost a follower
//! two messages, two trips through its Raft core and two answers.
//!
//! On a pipelined append stream ([`crate::network`]) such a request is now held for at most
//! [`COMMIT_HOLD`]. If a request arrives meanwhile that continues from the same place
//! (same vote, same previous log id), it is sent alone: its own commit index is at least as
//! new. The follower answers only that one, and the answer of each request it stood in for
//! is derived from it ([`stand_in_answer`]): a request that continues from log id `p` can
//! only be accepted if the follower's log matches at `p`, which is all that accepting an
//! empty request after `p` says; a conflict or a higher vote it meets would have met the
//! empty request the same way. So openraft still gets one answer per request, in order, and
//! never one the follower did not imply.
//!
//! openraft 0.10 would also accept the real answer alone (it matches answers to requests by
//! log id), but its contract is one answer per request, so the derived ones are sent too:
//! they cost the leader's core a notification each, not a message.
//!
//! The price is that a follower learns a commit up to [`COMMIT_HOLD`] later (rounded up to
//! the timer's 1 ms tick) when no new entry follows it, which delays its apply, and so a read
//! served on it, by as much at low load. A heartbeat is a stream of one request: its input
//! ends at once, and what is held leaves with it.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use delayd_store::{LogId, TypeConfig};
use futures::{Stream, StreamExt};
use openraft::raft::{AppendEntriesRequest, StreamAppendResult};
use tokio::time::Instant;

/// The longest a commit-only request waits for a request to ride on.
pub(crate) const COMMIT_HOLD: Duration = Duration::from_millis(1);

/// A request to send, and how many commit-only requests before it it stands in for.
#[derive(Debug)]
pub(crate) struct Folded {
    /// What goes on the wire.
    pub(crate) rpc: AppendEntriesRequest<TypeConfig>,
    /// The commit-only requests folded into it, whose answers are derived from its answer.
    pub(crate) stands_for: u32,
}

/// Sends what `input` yields, holding each commit-only request for up to `hold` and folding
/// it into the next request that continues from the same place (see the module docs).
/// Nothing is reordered: a request that does not continue from the held one's place sends
/// the held one first.
pub(crate) fn fold_commits<S>(input: S, hold: Duration) -> impl Stream<Item = Folded> + Send + Unpin
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
{
    struct State<S> {
        input: S,
        /// A commit-only request waiting, with the requests it already stands for and the
        /// time it must leave by.
        held: Option<(AppendEntriesRequest<TypeConfig>, u32, Instant)>,
        /// A request taken from `input` that must go after the held one.
        next: Option<AppendEntriesRequest<TypeConfig>>,
        ended: bool,
    }
    let state = State { input, held: None, next: None, ended: false };
    Box::pin(futures::stream::unfold(state, move |mut st| async move {
        loop {
            let arrived = if let Some(rpc) = st.next.take() {
                Some(rpc)
            } else if st.ended {
                None
            } else if let Some(&(_, _, until)) = st.held.as_ref() {
                match tokio::time::timeout_at(until, st.input.next()).await {
                    Ok(arrived) => arrived,
                    Err(_) => {
                        let (rpc, stands_for, _) = st.held.take()?;
                        return Some((Folded { rpc, stands_for }, st));
                    }
                }
            } else {
                st.input.next().await
            };
            let Some(rpc) = arrived else {
                st.ended = true;
                let (rpc, stands_for, _) = st.held.take()?;
                return Some((Folded { rpc, stands_for }, st));
            };
            let Some((held, n, until)) = st.held.take() else {
                if rpc.entries.is_empty() {
                    st.held = Some((rpc, 0, Instant::now() + hold));
                    continue;
                }
                return Some((Folded { rpc, stands_for: 0 }, st));
            };
            if held.vote != rpc.vote || held.prev_log_id != rpc.prev_log_id {
                st.next = Some(rpc);
                return Some((Folded { rpc: held, stands_for: n }, st));
            }
            debug_assert!(
                rpc.leader_commit >= held.leader_commit,
                "one leader's commit only grows"
            );
            if rpc.entries.is_empty() {
                // A newer commit from the same place: it replaces the held one, which keeps
                // its deadline so that a commit never waits longer than `hold`.
                st.held = Some((rpc, n + 1, until));
                continue;
            }
            return Some((Folded { rpc, stands_for: n + 1 }, st));
        }
    }))
}

/// The answer a commit-only request continuing from `prev` would have got, given the answer
/// to the request that stood in for it.
pub(crate) fn stand_in_answer(
    answer: &StreamAppendResult<TypeConfig>,
    prev: Option<LogId>,
) -> StreamAppendResult<TypeConfig> {
    match answer {
        Ok(_) => Ok(prev),
        Err(e) => Err(e.clone()),
    }
}

/// Which requests on the wire stand in for folded ones, shared by the two halves of an
/// append stream: the sender records, the receiver takes as the answers come.
#[derive(Default)]
pub(crate) struct Ledger(Mutex<VecDeque<StandIn>>);

struct StandIn {
    /// The request's place on the stream (0 for the first sent).
    seq: u64,
    stands_for: u32,
    prev: Option<LogId>,
}

impl Ledger {
    /// Records that request `seq`, continuing from `prev`, stands in for `stands_for`
    /// folded requests. Requests are recorded in the order they are sent.
    pub(crate) fn record(&self, seq: u64, stands_for: u32, prev: Option<LogId>) {
        if stands_for > 0 {
            let mut ledger = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            ledger.push_back(StandIn { seq, stands_for, prev });
        }
    }

    /// For the answer to request `seq`: how many folded requests it answers too, and the
    /// place they continued from. `None` when it stands in for none.
    pub(crate) fn take(&self, seq: u64) -> Option<(u32, Option<LogId>)> {
        let mut ledger = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        while ledger.front().is_some_and(|s| s.seq < seq) {
            ledger.pop_front();
        }
        if ledger.front().is_some_and(|s| s.seq == seq) {
            return ledger.pop_front().map(|s| (s.stands_for, s.prev));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use delayd_core::Entry;
    use delayd_store::Vote;
    use futures::channel::mpsc;
    use openraft::raft::StreamAppendError;
    use openraft::EntryPayload;

    fn log_id(term: u64, index: u64) -> LogId {
        openraft::testing::log_id::<TypeConfig>(term, 1, index)
    }

    fn request(
        term: u64,
        prev: u64,
        entries: u64,
        commit: u64,
    ) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(term, 1),
            prev_log_id: Some(log_id(term, prev)),
            leader_commit: Some(log_id(term, commit)),
            entries: (prev + 1..=prev + entries)
                .map(|i| openraft::Entry {
                    log_id: log_id(term, i),
                    payload: EntryPayload::Normal(Entry::new(0, Vec::new())),
                })
                .collect(),
        }
    }

    /// What went on the wire: (prev index, entries, commit index, stands for).
    type Sent = (u64, usize, u64, u32);

    fn sent(f: &Folded) -> Sent {
        let index = |l: &Option<LogId>| l.as_ref().map_or(0, |l| l.index);
        (index(&f.rpc.prev_log_id), f.rpc.entries.len(), index(&f.rpc.leader_commit), f.stands_for)
    }

    /// A folded stream fed by hand, so a test controls what arrives when.
    fn folder(
    ) -> (mpsc::UnboundedSender<AppendEntriesRequest<TypeConfig>>, impl Stream<Item = Folded> + Unpin)
    {
        let (tx, rx) = mpsc::unbounded();
        (tx, fold_commits(rx, COMMIT_HOLD))
    }

    async fn next(out: &mut (impl Stream<Item = Folded> + Unpin)) -> Option<Sent> {
        out.next().await.as_ref().map(sent)
    }

    #[tokio::test]
    async fn a_commit_rides_on_the_entries_that_follow_it() {
        let (tx, mut out) = folder();
        tx.unbounded_send(request(1, 5, 0, 5)).expect("send");
        tx.unbounded_send(request(1, 5, 2, 5)).expect("send");
        assert_eq!(next(&mut out).await, Some((5, 2, 5, 1)));
        drop(tx);
        assert_eq!(next(&mut out).await, None);
    }

    #[tokio::test]
    async fn a_lone_commit_leaves_after_the_hold() {
        let (tx, mut out) = folder();
        let start = Instant::now();
        tx.unbounded_send(request(1, 5, 0, 5)).expect("send");
        assert_eq!(next(&mut out).await, Some((5, 0, 5, 0)));
        assert!(start.elapsed() >= COMMIT_HOLD);
        // Entries that come later go as they are.
        tx.unbounded_send(request(1, 5, 3, 5)).expect("send");
        assert_eq!(next(&mut out).await, Some((5, 3, 5, 0)));
    }

    #[tokio::test]
    async fn newer_commits_replace_the_held_one_within_its_deadline() {
        let (tx, mut out) = folder();
        let start = Instant::now();
        tx.unbounded_send(request(1, 5, 0, 4)).expect("send");
        tx.unbounded_send(request(1, 5, 0, 5)).expect("send");
        assert_eq!(next(&mut out).await, Some((5, 0, 5, 1)));
        assert!(start.elapsed() >= COMMIT_HOLD);
    }

    #[tokio::test]
    async fn a_request_from_another_place_sends_the_held_one_first() {
        let (tx, mut out) = folder();
        tx.unbounded_send(request(1, 5, 0, 5)).expect("send");
        tx.unbounded_send(request(1, 3, 2, 5)).expect("send");
        tx.unbounded_send(request(2, 5, 1, 5)).expect("send");
        assert_eq!(next(&mut out).await, Some((5, 0, 5, 0)));
        assert_eq!(next(&mut out).await, Some((3, 2, 5, 0)));
        assert_eq!(next(&mut out).await, Some((5, 1, 5, 0)));
    }

    #[tokio::test]
    async fn the_end_of_the_input_sends_what_is_held() {
        let (tx, mut out) = folder();
        tx.unbounded_send(request(1, 5, 0, 5)).expect("send");
        drop(tx);
        assert_eq!(next(&mut out).await, Some((5, 0, 5, 0)));
        assert_eq!(next(&mut out).await, None);
    }

    #[test]
    fn stand_in_answers_follow_the_real_one() {
        let prev = Some(log_id(1, 5));
        assert_eq!(stand_in_answer(&Ok(Some(log_id(1, 7))), prev), Ok(prev));
        let conflict = Err(StreamAppendError::Conflict(log_id(1, 5)));
        assert_eq!(stand_in_answer(&conflict, prev), conflict);
        let higher = Err(StreamAppendError::HigherVote(Vote::new(3, 2)));
        assert_eq!(stand_in_answer(&higher, prev), higher);
    }

    #[test]
    fn the_ledger_answers_by_place_on_the_stream() {
        let ledger = Ledger::default();
        let prev = Some(log_id(1, 5));
        ledger.record(0, 0, None);
        ledger.record(1, 2, prev);
        ledger.record(4, 1, None);
        assert_eq!(ledger.take(0), None);
        assert_eq!(ledger.take(1), Some((2, prev)));
        assert_eq!(ledger.take(2), None);
        assert_eq!(ledger.take(4), Some((1, None)));
        assert_eq!(ledger.take(5), None);
    }
}
