//! The closed-loop workers' HTTP/1.1 client: one keep-alive connection per worker, requests
//! written straight onto it.
//!
//! The load generator shares the machine with the servers it measures, so every microsecond
//! it spends per request is taken from them. A pooled general-purpose client (reqwest) costs
//! several times what the server's own HTTP layer does per request: it parses the URL, clones
//! default headers, checks a connection out of a shared pool and arms a timer for each one.
//! A worker here owns its connection, as wrk's do, and sends prepared paths; what is left is
//! the request's encoding and the socket calls. Open-loop publishers and the setup and
//! health checks keep reqwest: they are not what a row measures.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{handshake, SendRequest};
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

/// The longest a request may take, here and on the pooled client (`workloads::Ctx`).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A status and the whole body of an answer.
#[derive(Debug)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl Answer {
    /// The body as JSON.
    pub fn json(&self) -> Result<Value> {
        serde_json::from_slice(&self.body).with_context(|| {
            format!("HTTP {}: not JSON: {}", self.status, String::from_utf8_lossy(&self.body))
        })
    }

    /// Fails unless the status is `want`, naming the status and the start of the body.
    pub fn expect(self, want: StatusCode) -> Result<()> {
        if self.status != want {
            let body = &self.body[..self.body.len().min(200)];
            bail!("HTTP {}: {}", self.status, String::from_utf8_lossy(body));
        }
        Ok(())
    }
}

/// One worker's connection to one node; (re)connected on first use and after any error.
pub struct Conn {
    /// `host:port` of the node.
    addr: String,
    host: HeaderValue,
    auth: Option<HeaderValue>,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Conn {
    /// A connection to the node at `base` (`http://host:port`), showing `auth` (an
    /// `Authorization` value) with every request. Nothing is dialled until the first one.
    pub fn new(base: &str, auth: Option<HeaderValue>) -> Result<Conn> {
        let addr = base
            .strip_prefix("http://")
            .ok_or_else(|| anyhow!("the bench speaks plain HTTP only, not {base}"))?
            .trim_end_matches('/')
            .to_string();
        let host = HeaderValue::from_str(&addr)?;
        Ok(Conn { addr, host, auth, sender: None })
    }

    /// Sends `method path_and_query` with `body` and reads the whole answer.
    pub async fn send(
        &mut self,
        method: Method,
        path_and_query: &str,
        body: Bytes,
    ) -> Result<Answer> {
        let result =
            tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(method, path_and_query, body))
                .await
                .unwrap_or_else(|_| Err(anyhow!("no answer within {REQUEST_TIMEOUT:?}")));
        if result.is_err() {
            // The connection's state is unknown after a failure: start afresh next time.
            self.sender = None;
        }
        result
    }

    /// `GET path_and_query`.
    pub async fn get(&mut self, path_and_query: &str) -> Result<Answer> {
        self.send(Method::GET, path_and_query, Bytes::new()).await
    }

    /// `PUT path_and_query` with `body`.
    pub async fn put(&mut self, path_and_query: &str, body: Bytes) -> Result<Answer> {
        self.send(Method::PUT, path_and_query, body).await
    }

    /// `DELETE path_and_query`.
    pub async fn delete(&mut self, path_and_query: &str) -> Result<Answer> {
        self.send(Method::DELETE, path_and_query, Bytes::new()).await
    }

    async fn exchange(&mut self, method: Method, pq: &str, body: Bytes) -> Result<Answer> {
        let mut request = Request::builder().method(method).uri(pq).header(HOST, &self.host);
        if let Some(auth) = &self.auth {
            request = request.header(AUTHORIZATION, auth);
        }
        let request = request.body(Full::new(body))?;
        let sender = self.ready().await?;
        let response = sender.send_request(request).await?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Answer { status: parts.status, headers: parts.headers, body })
    }

    /// The connection, dialled if there is none or the server closed it, once it can take a
    /// request.
    async fn ready(&mut self) -> Result<&mut SendRequest<Full<Bytes>>> {
        if self.sender.as_ref().is_none_or(SendRequest::is_closed) {
            let stream = TcpStream::connect(&self.addr)
                .await
                .with_context(|| format!("connecting to {}", self.addr))?;
            stream.set_nodelay(true)?;
            let (sender, connection) = handshake(TokioIo::new(stream)).await?;
            // Ends when the connection closes or the sender is dropped.
            tokio::spawn(connection);
            self.sender = Some(sender);
        }
        let sender = self.sender.as_mut().context("no connection")?;
        sender.ready().await?;
        Ok(sender)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Reads one request head (the tests send no bodies).
    async fn read_head(socket: &mut TcpStream) -> Option<String> {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if socket.read(&mut byte).await.ok()? == 0 {
                return None;
            }
            head.push(byte[0]);
        }
        Some(String::from_utf8(head).unwrap())
    }

    async fn answer(socket: &mut TcpStream, status: &str, body: &str, close: bool) {
        let connection = if close { "connection: close\r\n" } else { "" };
        let text = format!(
            "HTTP/1.1 {status}\r\ncontent-length: {}\r\n{connection}\r\n{body}",
            body.len()
        );
        socket.write_all(text.as_bytes()).await.unwrap();
    }

    /// The test server's result, failing the test if it has not finished within 10 s.
    async fn within<T>(server: tokio::task::JoinHandle<T>) -> T {
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the test server did not finish within 10 s")
            .unwrap()
    }

    #[test]
    fn only_plain_http_bases_are_taken() {
        assert!(Conn::new("https://127.0.0.1:1", None).is_err());
        assert!(Conn::new("127.0.0.1:1", None).is_err());
        assert!(Conn::new("http://127.0.0.1:1/", None).is_ok());
    }

    #[tokio::test]
    async fn requests_share_a_connection_until_the_server_closes_it() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let mut heads = Vec::new();
            // First connection: two requests, the second answer closes it.
            let (mut socket, _) = listener.accept().await.unwrap();
            heads.push(read_head(&mut socket).await.unwrap());
            answer(&mut socket, "201 Created", "{\"n\":1}", false).await;
            heads.push(read_head(&mut socket).await.unwrap());
            answer(&mut socket, "404 Not Found", "none", true).await;
            drop(socket);
            // Second connection: the client dialled again.
            let (mut socket, _) = listener.accept().await.unwrap();
            heads.push(read_head(&mut socket).await.unwrap());
            answer(&mut socket, "204 No Content", "", false).await;
            heads
        });

        let auth = HeaderValue::from_static("Bearer t");
        let mut conn = Conn::new(&base, Some(auth)).unwrap();
        let first = conn.put("/api/ns/q?delay_ms=5", Bytes::new()).await.unwrap();
        assert_eq!(first.status, StatusCode::CREATED);
        assert_eq!(first.json().unwrap()["n"], 1);
        let second = conn.get("/api/ns/q?timeout=0").await.unwrap();
        assert_eq!(second.status, StatusCode::NOT_FOUND);
        let err = second.expect(StatusCode::OK).unwrap_err().to_string();
        assert!(err.contains("404") && err.contains("none"), "{err}");
        conn.delete("/api/ns/q/job/j?lease=1")
            .await
            .unwrap()
            .expect(StatusCode::NO_CONTENT)
            .unwrap();

        let heads = within(server).await;
        assert!(heads[0].starts_with("PUT /api/ns/q?delay_ms=5 HTTP/1.1\r\n"), "{}", heads[0]);
        assert!(heads[1].starts_with("GET /api/ns/q?timeout=0 HTTP/1.1\r\n"), "{}", heads[1]);
        assert!(
            heads[2].starts_with("DELETE /api/ns/q/job/j?lease=1 HTTP/1.1\r\n"),
            "{}",
            heads[2]
        );
        for head in &heads {
            let head = head.to_ascii_lowercase();
            assert!(head.contains("authorization: bearer t\r\n"), "{head}");
            assert!(head.contains("host: 127.0.0.1:"), "{head}");
        }
    }

    #[tokio::test]
    async fn a_refused_connection_is_an_error_and_the_next_request_dials_again() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let mut conn = Conn::new(&format!("http://{addr}"), None).unwrap();
        let err = conn.get("/health").await.unwrap_err();
        assert!(format!("{err:#}").contains("connecting to"), "{err:#}");
        // The port is listened on again: the same Conn reaches it.
        let listener = TcpListener::bind(addr).await.unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            read_head(&mut socket).await.unwrap();
            answer(&mut socket, "200 OK", "{}", false).await;
        });
        assert_eq!(conn.get("/health").await.unwrap().status, StatusCode::OK);
        within(server).await;
    }
}
