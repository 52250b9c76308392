//! The service layer against one in-process node: what a request that is abandoned halfway
//! leaves behind.

mod common;

use std::time::Duration;

use delayd_core::{JobState, QueueName};
use delayd_server::service::reserve::{ReserveOrder, ReserveRequest};
use delayd_server::service::PublishParams;
use delayd_server::{Config, Principal};

/// A reserve whose caller goes away (a client that disconnects, a dropped request) must not
/// keep the jobs it leased: with one try, an expired lease would send them to the dead letter
/// without ever being handed out. The caller is dropped at many points of the reserve's
/// life; whenever it did not get its answer, the job must be ready again at once, long before
/// its 60 s ttr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_whose_caller_is_gone_releases_what_it_leased() {
    let (node, _dir) = common::start_node(Config::default()).await;
    let s = node.service().clone();
    let dev = Principal::Dev;
    let queue = QueueName::new("ns", "q");
    let params = PublishParams { tries: 1, ..PublishParams::default() };
    let id = s.publish(&dev, queue.clone(), &params, b"job".to_vec()).await.expect("publish").id;
    let mut abandoned_in_flight = 0;
    for i in 0..200u64 {
        let reserving = {
            let (s, queue) = (s.clone(), queue.clone());
            let request = ReserveRequest {
                queues: vec![queue],
                count: 1,
                ttr_ms: Some(60_000),
                wait: Duration::ZERO,
                ack: None,
                order: ReserveOrder::QueueOrder,
            };
            tokio::spawn(async move { s.reserve(&Principal::Dev, request).await })
        };
        // Drop the caller after a varying head start: before the proposal, while the entry
        // is being committed, or after the answer.
        tokio::time::sleep(Duration::from_micros(i * 37 % 2000)).await;
        reserving.abort();
        let delivered = match reserving.await {
            Ok(got) => !got.expect("reserve").deliveries.is_empty(),
            Err(_) => false,
        };
        if delivered {
            // The caller got it: put it back the normal way for the next round.
            let meta = s.queue_meta(&dev, &queue, false).await.expect("meta");
            assert_eq!(meta.count(JobState::Reserved), 1);
            let job = s.peek(&dev, &queue, false).await.expect("peek");
            assert!(job.is_none(), "a delivered job is not ready");
            s.release(&dev, queue.clone(), id, None, 0, None).await.expect("release");
            continue;
        }
        // Not delivered: the job is ready again within a moment (released, or never taken).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let meta = s.queue_meta(&dev, &queue, false).await.expect("meta");
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
