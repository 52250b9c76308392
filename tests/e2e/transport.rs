//! The HTTP transport's bounds, against the real binary over raw TCP: a connection that sends
//! half a header is closed after the header timeout, an idle keep-alive connection after the
//! idle timeout (never one with a long-poll in flight), and connections beyond the limit wait
//! until a slot frees.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use delayd_tests::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// Starts a single node (authentication off) with `flags`.
async fn node(flags: &[&str]) -> Result<(Server, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    let flags = flags.iter().map(|f| f.to_string()).collect();
    let port = delayd_tests::free_port()?;
    let server =
        Server::spawn(1, &dir.path().join("node1"), port, delayd_tests::free_port()?, flags)
            .await?;
    Ok((server, dir))
}

/// A raw TCP connection to `server`'s HTTP port.
async fn connect(server: &Server) -> Result<TcpStream> {
    let addr = server.url.trim_start_matches("http://");
    Ok(TcpStream::connect(addr).await?)
}

/// Sends `GET path` on a keep-alive connection.
async fn send_get(conn: &mut TcpStream, path: &str) -> Result<()> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: delayd\r\n\r\n");
    conn.write_all(req.as_bytes()).await?;
    Ok(())
}

/// Reads one response (head and a Content-Length body) and returns its status.
async fn read_response(conn: &mut TcpStream) -> Result<u16> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = conn.read(&mut chunk).await?;
        ensure!(
            n > 0,
            "the connection closed before a response: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in {head:?}"))?;
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(Ok(0), |v| v.trim().parse())?;
    let mut body = buf.len() - head_end;
    while body < length {
        let mut chunk = [0u8; 4096];
        let n = conn.read(&mut chunk).await?;
        ensure!(n > 0, "the connection closed mid-body");
        body += n;
    }
    Ok(status)
}

/// One request and its response on `conn`, within `within`.
async fn get(conn: &mut TcpStream, path: &str, within: Duration) -> Result<u16> {
    send_get(conn, path).await?;
    timeout(within, read_response(conn)).await.with_context(|| format!("no answer to {path}"))?
}

/// Waits (at most `within`) until the server closes `conn`: a read returns end of file or a
/// reset. Data instead is an error.
async fn closed_by_server(conn: &mut TcpStream, within: Duration) -> Result<()> {
    let mut byte = [0u8; 1];
    match timeout(within, conn.read(&mut byte)).await {
        Err(_) => bail!("the connection is still open after {within:?}"),
        Ok(Ok(0)) | Ok(Err(_)) => Ok(()),
        Ok(Ok(_)) => bail!("unexpected data: {byte:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_a_header_is_cut_off_while_others_are_served() -> Result<()> {
    let (server, _dir) = node(&["--http-header-timeout-ms", "500"]).await?;
    let mut slow = connect(&server).await?;
    let started = Instant::now();
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: delayd\r\nX-Slow: ").await?;

    // Meanwhile another connection is served as usual.
    let mut other = connect(&server).await?;
    ensure!(get(&mut other, "/health", Duration::from_secs(5)).await? == 200);

    closed_by_server(&mut slow, Duration::from_secs(5)).await?;
    let took = started.elapsed();
    ensure!(took >= Duration::from_millis(400), "closed after {took:?}, before the timeout");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_but_a_long_poll_is_not() -> Result<()> {
    // The idle timeout is three times the header timeout: waiting between keep-alive
    // requests must not count as reading a header.
    let flags = ["--http-header-timeout-ms", "500", "--http-idle-timeout-ms", "1500"];
    let (server, _dir) = node(&flags).await?;

    let mut idle = connect(&server).await?;
    ensure!(get(&mut idle, "/health", Duration::from_secs(5)).await? == 200);
    let answered = Instant::now();
    let mut byte = [0u8; 1];
    let early = timeout(Duration::from_millis(1000), idle.read(&mut byte)).await;
    ensure!(early.is_err(), "the idle connection ended within the header timeout: {early:?}");
    closed_by_server(&mut idle, Duration::from_secs(5)).await?;
    let took = answered.elapsed();
    ensure!(took >= Duration::from_millis(1400), "closed after {took:?}, before the timeout");

    // A reserve waiting 3 s (twice the idle timeout) with nothing to deliver gets its 404.
    let mut poll = connect(&server).await?;
    let asked = Instant::now();
    let status = get(&mut poll, "/api/ns/q?timeout=3", Duration::from_secs(10)).await?;
    ensure!(status == 404, "the long-poll answered {status}");
    ensure!(asked.elapsed() >= Duration::from_millis(2500), "answered after {:?}", asked.elapsed());
    Ok(())
}

/// The one change that brings a connection's deadline closer: an idle keep-alive connection
/// (idle timeout 4 s) starts a request and stalls half-way through its header, which must
/// then be cut off by the header timeout (500 ms), not left to the idle one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_stalled_after_an_idle_wait_is_cut_off_by_the_header_timeout() -> Result<()> {
    let flags = ["--http-header-timeout-ms", "500", "--http-idle-timeout-ms", "4000"];
    let (server, _dir) = node(&flags).await?;
    let mut conn = connect(&server).await?;
    ensure!(get(&mut conn, "/health", Duration::from_secs(5)).await? == 200);
    let mut byte = [0u8; 1];
    let idle = timeout(Duration::from_millis(1200), conn.read(&mut byte)).await;
    ensure!(idle.is_err(), "the idle connection ended within the idle timeout: {idle:?}");

    let started = Instant::now();
    conn.write_all(b"GET /health HTTP/1.1\r\nHost: delayd\r\nX-Slow: ").await?;
    closed_by_server(&mut conn, Duration::from_secs(5)).await?;
    let took = started.elapsed();
    ensure!(took >= Duration::from_millis(400), "closed after {took:?}, before the timeout");
    // The idle deadline was 2.8 s away when the header began.
    ensure!(took < Duration::from_millis(2000), "closed after {took:?}: by the idle timeout");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_wait_for_a_free_slot() -> Result<()> {
    let (server, _dir) = node(&["--http-max-connections", "2"]).await?;
    // Two connections take the slots (each has been served, so each was accepted), then
    // stay open, idle.
    let mut first = connect(&server).await?;
    ensure!(get(&mut first, "/health", Duration::from_secs(10)).await? == 200);
    let mut second = connect(&server).await?;
    ensure!(get(&mut second, "/health", Duration::from_secs(10)).await? == 200);

    // A third connects (the kernel completes the handshake) but is not served...
    let mut third = connect(&server).await?;
    send_get(&mut third, "/health").await?;
    let waiting = timeout(Duration::from_secs(1), read_response(&mut third)).await;
    ensure!(waiting.is_err(), "the third connection was served beyond the limit: {waiting:?}");

    // ...until one of the first two closes.
    drop(first);
    let status = timeout(Duration::from_secs(5), read_response(&mut third))
        .await
        .context("the third connection was not served after a slot freed")??;
    ensure!(status == 200);
    // The remaining slot holder is still served.
    ensure!(get(&mut second, "/health", Duration::from_secs(5)).await? == 200);
    Ok(())
}
