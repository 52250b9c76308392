//! The service layer against one in-process node: what a request that is abandoned halfway
//! leaves behind.

mod common;

use std::time::Duration;

use delayd_core::{JobState, QueueName};
use delayd_server::service::PublishParams;
use delayd_server::Config;

/// A reserve whose caller goes away (a client that disconnects, a dropped request) must not
/// keep the jobs it leased: with one try, an expired lease would send them to the dead letter
/// without ever being handed out. The caller is dropped at many points of the reserve's
/// life; whenever it did not get its answer, the job must be ready again at once, long before
/// its 60 s ttr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_whose_caller_is_gone_releases_what_it_leased() {
    let (node, _dir) = common::start_node(Config::default()).await;
    let queue = QueueName::new("ns", "q");
    let params = PublishParams { tries: 1, ..PublishParams::default() };
    let id = node.publish(queue.clone(), &params, b"job".to_vec()).await.expect("publish").id;
    let mut abandoned_in_flight = 0;
    for i in 0..200u64 {
        let reserving = {
            let (node, queue) = (node.clone(), queue.clone());
            tokio::spawn(
                async move { node.reserve(vec![queue], 1, Some(60_000), Duration::ZERO).await },
            )
        };
        // Drop the caller after a varying head start: before the proposal, while the entry
        // is being committed, or after the answer.
        tokio::time::sleep(Duration::from_micros(i * 37 % 2000)).await;
        reserving.abort();
        let delivered = match reserving.await {
            Ok(got) => !got.expect("reserve").is_empty(),
            Err(_) => false,
        };
        if delivered {
            // The caller got it: put it back the normal way for the next round.
            let meta = node.queue_meta(&queue, false).await.expect("meta");
            assert_eq!(meta.count(JobState::Reserved), 1);
            let job = node.peek(&queue, false).await.expect("peek");
            assert!(job.is_none(), "a delivered job is not ready");
            node.release(queue.clone(), id, None, 0, None).await.expect("release");
            continue;
        }
        // Not delivered: the job is ready again within a moment (released, or never taken).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let meta = node.queue_meta(&queue, false).await.expect("meta");
            if meta.count(JobState::Ready) == 1 {
                break;
            }
            abandoned_in_flight += 1;
            assert_eq!(meta.count(JobState::Dead), 0, "round {i}: an undelivered job died");
            assert!(tokio::time::Instant::now() < deadline, "round {i}: still leased: {meta:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    eprintln!("{abandoned_in_flight} polls saw a lease of an abandoned reserve before its release");
    node.shutdown().await;
}
