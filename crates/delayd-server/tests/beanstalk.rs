//! The beanstalkd protocol over a real socket against a single-node cluster: the basics
//! byte for byte, and how long an idle connection lives.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use delayd_server::{Config, Node};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

async fn start(config: Config) -> (Node, tempfile::TempDir, BufReader<TcpStream>) {
    let config = Config { beanstalk_addr: Some("127.0.0.1:0".parse().unwrap()), ..config };
    let (node, dir) = common::start_node(config).await;
    let addr = node.config().beanstalk_addr.expect("bound");
    (node, dir, BufReader::new(TcpStream::connect(addr).await.unwrap()))
}

/// Sends `command` and reads one reply line (without its CRLF).
async fn send(c: &mut BufReader<TcpStream>, command: &[u8]) -> String {
    c.get_mut().write_all(command).await.unwrap();
    line(c).await
}

async fn line(c: &mut BufReader<TcpStream>) -> String {
    let mut reply = String::new();
    tokio::time::timeout(Duration::from_secs(5), c.read_line(&mut reply))
        .await
        .expect("a reply within 5 s")
        .unwrap();
    reply.trim_end_matches("\r\n").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_reserve_delete_with_beanstalkds_replies() {
    let (node, _dir, mut c) = start(Config::default()).await;
    assert_eq!(send(&mut c, b"use emails\r\n").await, "USING emails");
    let inserted = send(&mut c, b"put 5 0 60 5\r\nhello\r\n").await;
    let id: u64 = inserted.strip_prefix("INSERTED ").expect(&inserted).parse().unwrap();
    assert_eq!(send(&mut c, b"watch emails\r\n").await, "WATCHING 2");
    assert_eq!(send(&mut c, b"reserve-with-timeout 1\r\n").await, format!("RESERVED {id} 5"));
    assert_eq!(line(&mut c).await, "hello");
    assert_eq!(send(&mut c, b"put 1 0 60 3\r\nabcd\r\n").await, "EXPECTED_CRLF");
    assert_eq!(send(&mut c, b"frobnicate\r\n").await, "UNKNOWN_COMMAND");
    assert_eq!(send(&mut c, b"delete x\r\n").await, "BAD_FORMAT");
    assert_eq!(send(&mut c, format!("delete {id}\r\n").as_bytes()).await, "DELETED");
    assert_eq!(send(&mut c, format!("delete {id}\r\n").as_bytes()).await, "NOT_FOUND");
    assert_eq!(send(&mut c, b"reserve-with-timeout 0\r\n").await, "TIMED_OUT");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_stay_unless_the_protocol_idle_timeout_is_set() {
    // The HTTP idle timeout does not apply: beanstalkd's clients keep their connections.
    let mut config = Config::default();
    config.http.idle_timeout = Duration::from_millis(100);
    let (node, _dir, mut c) = start(config.clone()).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(send(&mut c, b"list-tube-used\r\n").await, "USING default");
    node.shutdown().await;

    config.protocol_idle_timeout = Some(Duration::from_millis(100));
    let (node, _dir, mut c) = start(config).await;
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut rest)).await;
    assert!(matches!(closed, Ok(Ok(0))), "closed by the server when idle: {closed:?}");
    node.shutdown().await;
}
