//! The Disque protocol over a real socket, driven by the `redis` crate's raw commands (as
//! Disque clients send them), against a single-node cluster.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use delayd_server::config::AuthConfig;
use delayd_server::{Config, Node};
use redis::aio::MultiplexedConnection;
use redis::{cmd, RedisResult, Value};

const ADMIN: &str = "admin-token-for-disque-tests-0001";

async fn start(auth: AuthConfig) -> (Node, tempfile::TempDir, MultiplexedConnection) {
    let config =
        Config { disque_addr: Some("127.0.0.1:0".parse().unwrap()), auth, ..Config::default() };
    let (node, dir) = common::start_node(config).await;
    let addr = node.config().disque_addr.expect("bound");
    let client = redis::Client::open(format!("redis://{addr}")).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    (node, dir, conn)
}

async fn addjob(c: &mut MultiplexedConnection, queue: &str, body: &str, opts: &[&str]) -> String {
    cmd("ADDJOB").arg(queue).arg(body).arg(0).arg(opts).query_async(c).await.unwrap()
}

/// GETJOB's answer: `(queue, id, body)` per job; empty for the null reply.
async fn getjob(c: &mut MultiplexedConnection, args: &[&str]) -> Vec<(String, String, String)> {
    let v: Value = cmd("GETJOB").arg(args).query_async(c).await.unwrap();
    let Value::Array(jobs) = v else { return Vec::new() };
    jobs.into_iter()
        .map(|j| {
            let items: Vec<String> = redis::from_redis_value(&j).unwrap();
            (items[0].clone(), items[1].clone(), items[2].clone())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_get_ack_nack_and_working_behave_as_disque() {
    let (node, _dir, mut c) = start(AuthConfig::dev()).await;
    let pong: String = cmd("PING").query_async(&mut c).await.unwrap();
    assert_eq!(pong, "PONG");

    let id = addjob(&mut c, "q", "hello", &["RETRY", "30"]).await;
    assert!(id.starts_with("D-"), "{id}");
    let len: i64 = cmd("QLEN").arg("q").query_async(&mut c).await.unwrap();
    assert_eq!(len, 1);
    let got = getjob(&mut c, &["NOHANG", "FROM", "q"]).await;
    assert_eq!(got, vec![("q".to_string(), id.clone(), "hello".to_string())]);
    assert!(getjob(&mut c, &["NOHANG", "FROM", "q"]).await.is_empty(), "leased: nothing else");

    // WORKING extends the lease by the job's RETRY; NACK puts it back at once.
    let secs: i64 = cmd("WORKING").arg(&id).query_async(&mut c).await.unwrap();
    assert_eq!(secs, 30);
    let nacked: i64 = cmd("NACK").arg(&id).query_async(&mut c).await.unwrap();
    assert_eq!(nacked, 1);
    let again: Value = cmd("GETJOB")
        .arg(&["NOHANG", "WITHCOUNTERS", "FROM", "q"])
        .query_async(&mut c)
        .await
        .unwrap();
    let Value::Array(jobs) = again else { panic!("{again:?}") };
    let fields: Vec<Value> = redis::from_redis_value(&jobs[0]).unwrap();
    assert_eq!(fields.len(), 7, "queue, id, body and two counters: {fields:?}");
    assert_eq!(fields[4], Value::Int(1), "one NACK");
    assert_eq!(fields[6], Value::Int(0), "no additional delivery: its RETRY never ran out");

    let acked: i64 = cmd("ACKJOB")
        .arg(&id)
        .arg("D-01ARZ3NDEKTSV4RRFFQ69G5FAV")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(acked, 1, "the unknown id is not counted");
    let shown: Value = cmd("SHOW").arg(&id).query_async(&mut c).await.unwrap();
    assert_eq!(shown, Value::Nil, "acked jobs are gone");

    // A delayed job: not before its time; GETJOB with a timeout waits for it.
    let started = Instant::now();
    let delayed = addjob(&mut c, "later", "x", &["DELAY", "1"]).await;
    let got = getjob(&mut c, &["TIMEOUT", "5000", "FROM", "other", "later"]).await;
    assert_eq!(got.first().map(|g| g.1.clone()), Some(delayed.clone()));
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "delivered after {:?}",
        started.elapsed()
    );
    let deleted: i64 = cmd("DELJOB").arg(&delayed).query_async(&mut c).await.unwrap();
    assert_eq!(deleted, 1);
    let empty = getjob(&mut c, &["TIMEOUT", "100", "FROM", "later"]).await;
    assert!(empty.is_empty());
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_commands_are_refused_and_auth_is_required() {
    let (node, _dir, mut c) = start(AuthConfig::dev()).await;
    let refused: RedisResult<String> = cmd("ADDJOB")
        .arg("q")
        .arg("x")
        .arg(0)
        .arg("TTL")
        .arg(1)
        .arg("DELAY")
        .arg(5)
        .query_async(&mut c)
        .await;
    let e = refused.expect_err("ttl before the delay ends").to_string();
    assert!(e.contains("ttl"), "{e}");
    let refused: RedisResult<String> =
        cmd("ADDJOB").arg("bad.q").arg("x").arg(0).query_async(&mut c).await;
    assert!(refused.expect_err("bad name").to_string().contains("invalid queue name"));
    let refused: RedisResult<Value> =
        cmd("GETJOB").arg("COUNT").arg(0).arg("FROM").arg("q").query_async(&mut c).await;
    assert!(refused.expect_err("count 0").to_string().contains("COUNT"));
    let refused: RedisResult<Value> = cmd("NOSUCH").query_async(&mut c).await;
    assert!(refused.expect_err("unknown").to_string().contains("unknown command"));
    node.shutdown().await;

    let auth = AuthConfig { admin_token: Some(ADMIN.into()), ..AuthConfig::default() };
    let (node, _dir, mut c) = start(auth).await;
    let refused: RedisResult<i64> = cmd("QLEN").arg("q").query_async(&mut c).await;
    assert!(refused.expect_err("no auth").to_string().contains("NOAUTH"));
    let refused: RedisResult<String> = cmd("AUTH").arg("not-a-token").query_async(&mut c).await;
    assert!(refused.expect_err("bad token").to_string().contains("unknown token"));
    let ok: String = cmd("AUTH").arg(ADMIN).query_async(&mut c).await.unwrap();
    assert_eq!(ok, "OK");
    let len: i64 = cmd("QLEN").arg("q").query_async(&mut c).await.unwrap();
    assert_eq!(len, 0);
    node.shutdown().await;
}

/// A client that gives up on a blocking GETJOB (closes its connection) must not leave a
/// reserve behind that takes the next job for nobody: the next client gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_getjob_whose_client_left_takes_nothing() {
    use tokio::io::AsyncWriteExt;
    let (node, _dir, mut c) = start(AuthConfig::dev()).await;
    let addr = node.config().disque_addr.expect("bound");
    for _ in 0..3 {
        let mut gone = tokio::net::TcpStream::connect(addr).await.unwrap();
        gone.write_all(
            b"*5\r\n$6\r\nGETJOB\r\n$7\r\nTIMEOUT\r\n$1\r\n0\r\n$4\r\nFROM\r\n$1\r\nq\r\n",
        )
        .await
        .unwrap();
        drop(gone);
    }
    let id = addjob(&mut c, "q", "for the living", &["RETRY", "300"]).await;
    let got = getjob(&mut c, &["TIMEOUT", "5000", "FROM", "q"]).await;
    assert_eq!(got.first().map(|g| g.1.clone()), Some(id), "the job went to a closed connection");
    node.shutdown().await;
}

/// Namespace tokens: only one of the Disque namespace opens it, and a connection whose token
/// is deleted is cut off at its next command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_tokens_open_only_their_namespace_and_deletion_cuts_off() {
    use delayd_server::service::tokens::NewToken;
    use delayd_server::Principal;
    let auth = AuthConfig { admin_token: Some(ADMIN.into()), ..AuthConfig::default() };
    let (node, _dir, mut c) = start(auth).await;
    let s = node.service();
    let mine = s.create_token(&Principal::Admin, "disque", NewToken::default()).await.unwrap();
    let other = s.create_token(&Principal::Admin, "other", NewToken::default()).await.unwrap();

    let refused: RedisResult<String> = cmd("AUTH").arg(&other).query_async(&mut c).await;
    let e = refused.expect_err("another namespace's token").to_string();
    assert!(e.contains("the token is for namespace \"other\""), "{e}");
    let ok: String = cmd("AUTH").arg(&mine).query_async(&mut c).await.unwrap();
    assert_eq!(ok, "OK");
    addjob(&mut c, "q", "x", &[]).await;

    s.delete_token(&Principal::Admin, "disque", &mine).await.unwrap();
    let refused: RedisResult<i64> = cmd("QLEN").arg("q").query_async(&mut c).await;
    assert!(refused.expect_err("deleted").to_string().contains("deleted"), "cut off");
    let refused: RedisResult<i64> = cmd("QLEN").arg("q").query_async(&mut c).await;
    assert!(refused.expect_err("no auth").to_string().contains("NOAUTH"), "until AUTH again");
    node.shutdown().await;
}
