//! `serve_http`'s shutdown, in process with a router whose handler the test holds open: the
//! in-flight request is answered, idle connections and new ones are not kept waiting.

use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use delayd_server::config::HttpLimits;
use delayd_server::http::serve_http;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::timeout;

const WITHIN: Duration = Duration::from_secs(5);

/// Reads until the peer closes the connection; what it sent.
async fn read_to_close(conn: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = timeout(WITHIN, conn.read_to_end(&mut out)).await.expect("the connection stayed open");
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn shutdown_answers_the_request_in_flight_and_closes_the_rest() {
    let (entered_tx, mut entered) = mpsc::channel::<()>(1);
    let release = Arc::new(Notify::new());
    let router = Router::new().route(
        "/slow",
        get({
            let release = release.clone();
            move || {
                let (entered, release) = (entered_tx.clone(), release.clone());
                async move {
                    let _ = entered.send(()).await;
                    release.notified().await;
                    "done"
                }
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, stop) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        // Patient enough that only the release below ends the request.
        let limits =
            HttpLimits { drain_timeout: Duration::from_secs(600), ..HttpLimits::default() };
        serve_http(listener, router, &limits, async {
            let _ = stop.await;
        })
        .await
    });

    // One connection with a request in flight, one idle after a first request.
    let mut busy = TcpStream::connect(addr).await.expect("connect");
    busy.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    timeout(WITHIN, entered.recv()).await.expect("the handler was not entered");
    let mut idle = TcpStream::connect(addr).await.expect("connect");
    idle.write_all(b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    let mut head = [0u8; 12];
    timeout(WITHIN, idle.read_exact(&mut head)).await.expect("no answer").expect("read");
    assert_eq!(&head, b"HTTP/1.1 404");

    stop_tx.send(()).expect("the server is running");
    // The idle connection is closed at once (what is left of its 404 may come first), and
    // nothing new is accepted, while the request in flight holds the server open.
    let rest = read_to_close(&mut idle).await;
    assert!(!rest.contains("HTTP/1.1"), "a second response on the idle connection: {rest}");
    let refused = timeout(WITHIN, async {
        loop {
            if TcpStream::connect(addr).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(refused.is_ok(), "new connections are still accepted after shutdown");
    assert!(!server.is_finished(), "the server returned with a request in flight");

    release.notify_one();
    let answer = read_to_close(&mut busy).await;
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("done"), "{answer}");
    timeout(WITHIN, server)
        .await
        .expect("the server did not return")
        .expect("the server task panicked")
        .expect("serve_http failed");
}

/// A request that never finishes cannot hold a stopping server past its drain timeout: its
/// connection is cut and `serve_http` returns.
#[tokio::test]
async fn a_request_still_in_flight_after_the_drain_timeout_is_cut_off() {
    let (entered_tx, mut entered) = mpsc::channel::<()>(1);
    let router = Router::new().route(
        "/forever",
        get(move || {
            let entered = entered_tx.clone();
            async move {
                let _ = entered.send(()).await;
                std::future::pending::<&str>().await
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, stop) = oneshot::channel::<()>();
    let drain = Duration::from_millis(300);
    let server = tokio::spawn(async move {
        let limits = HttpLimits { drain_timeout: drain, ..HttpLimits::default() };
        serve_http(listener, router, &limits, async {
            let _ = stop.await;
        })
        .await
    });
    let mut stuck = TcpStream::connect(addr).await.expect("connect");
    stuck.write_all(b"GET /forever HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    timeout(WITHIN, entered.recv()).await.expect("the handler was not entered");

    let stopped_at = tokio::time::Instant::now();
    stop_tx.send(()).expect("the server is running");
    timeout(WITHIN, server)
        .await
        .expect("the server waited for a request that never ends")
        .expect("the server task panicked")
        .expect("serve_http failed");
    assert!(stopped_at.elapsed() >= drain, "cut before the drain timeout");
    let rest = read_to_close(&mut stuck).await;
    assert!(rest.is_empty(), "the cut connection got an answer: {rest}");
}
