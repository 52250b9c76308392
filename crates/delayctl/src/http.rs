//! A small HTTP client for delayd's API that fails over between nodes.
//!
//! Every node serves every request (followers forward writes to the leader), so the client
//! just needs one that answers. Nodes are tried in the order given; only a failure to
//! *connect* moves on to the next one. Any other failure (a timeout after the request was
//! sent, a broken answer) may have left the request applied, so it is reported rather than
//! retried elsewhere, and an HTTP error status is the server's answer, returned as it is.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use reqwest::{Method, StatusCode, Url};
use serde_json::Value;

/// One request: a method, path segments (each percent-encoded as needed), query
/// parameters, headers and an optional body.
pub struct Call {
    method: Method,
    segments: Vec<String>,
    query: Vec<(String, String)>,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
    extra_timeout: Duration,
}

impl Call {
    /// A request to the path made of `segments` (`["api", ns, q]` is `/api/{ns}/{q}`).
    pub fn new(method: Method, segments: &[&str]) -> Call {
        Call {
            method,
            segments: segments.iter().map(|s| s.to_string()).collect(),
            query: Vec::new(),
            headers: Vec::new(),
            body: None,
            extra_timeout: Duration::ZERO,
        }
    }

    /// Adds the query parameter `name` when `value` is given.
    pub fn param(mut self, name: &str, value: Option<impl ToString>) -> Call {
        if let Some(v) = value {
            self.query.push((name.to_string(), v.to_string()));
        }
        self
    }

    /// Adds a header.
    pub fn header(mut self, name: String, value: String) -> Call {
        self.headers.push((name, value));
        self
    }

    /// Sets the raw body.
    pub fn body(mut self, body: Vec<u8>) -> Call {
        self.body = Some(body);
        self
    }

    /// Sets a JSON body, leaving out the fields that are `null` (options not given, which
    /// the server then defaults).
    pub fn json(self, mut body: Value) -> Call {
        if let Value::Object(fields) = &mut body {
            fields.retain(|_, v| !v.is_null());
        }
        self.header("Content-Type".to_string(), "application/json".to_string())
            .body(body.to_string().into_bytes())
    }

    /// Lets the server take this much longer than the per-request timeout (a long poll).
    pub fn wait(mut self, extra: Duration) -> Call {
        self.extra_timeout = extra;
        self
    }

    fn url(&self, base: &Url) -> Result<Url> {
        let mut url = base.clone();
        url.path_segments_mut()
            .map_err(|()| anyhow::anyhow!("{base} cannot be a base URL"))?
            .pop_if_empty()
            .extend(&self.segments);
        if !self.query.is_empty() {
            url.query_pairs_mut().extend_pairs(&self.query);
        }
        Ok(url)
    }
}

/// A server's answer: its status and its body as JSON (`Null` when empty, a JSON string
/// holding the text when the body is not JSON).
#[derive(Debug)]
pub struct Reply {
    /// The HTTP status.
    pub status: StatusCode,
    /// The body.
    pub body: Value,
}

impl Reply {
    /// The body of a 2xx answer, or an error `<status>: <the server's message>`.
    pub fn ok(self) -> Result<Value> {
        if self.status.is_success() {
            return Ok(self.body);
        }
        bail!("{}: {}", self.status, message(&self.body))
    }
}

/// The message in an error body: its `error` field, else `msg`, else the body itself.
pub fn message(body: &Value) -> String {
    match body {
        Value::Null => "(empty answer)".to_string(),
        Value::String(text) => text.trim().to_string(),
        _ => ["error", "msg"]
            .iter()
            .find_map(|f| body[*f].as_str())
            .map_or_else(|| body.to_string(), str::to_string),
    }
}

/// The client: the nodes to try, the token and the per-request timeout.
pub struct Client {
    http: reqwest::Client,
    nodes: Vec<Url>,
    token: Option<String>,
    timeout: Duration,
}

impl Client {
    /// A client of `nodes` (tried in order) that sends `token`, if any, on every request and
    /// also trusts the CA certificates in the PEM file `ca_file`, if any.
    pub fn new(
        nodes: Vec<Url>,
        token: Option<String>,
        timeout: Duration,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Client> {
        // delayd redirects only a backup to the leader, and that request needs its
        // credential, which reqwest drops on a redirect to another host: the caller follows
        // it itself.
        let mut builder = reqwest::Client::builder()
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none());
        if let Some(path) = ca_file {
            let pem = std::fs::read(path)
                .with_context(|| format!("cannot read the CA file {}", path.display()))?;
            let cas = reqwest::Certificate::from_pem_bundle(&pem)
                .ok()
                .filter(|cas| !cas.is_empty())
                .with_context(|| format!("{} holds no PEM certificate", path.display()))?;
            for ca in cas {
                builder = builder.add_root_certificate(ca);
            }
        }
        let http = builder.build().context("cannot build the HTTP client")?;
        Ok(Client { http, nodes, token, timeout })
    }

    /// Sends `call` to the first node that accepts a connection.
    pub async fn send(&self, call: Call) -> Result<Reply> {
        let (node, resp) = self.open(&call).await?;
        read(resp).await.with_context(|| format!("from {node}"))
    }

    /// The per-request timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sends `call` to `node` and returns the answer unread (for a streamed body).
    pub async fn open_at(&self, node: &Url, call: &Call) -> Result<reqwest::Response> {
        let url = call.url(node)?;
        self.send_to(url, call).await.with_context(|| format!("request to {node} failed"))
    }

    async fn send_to(&self, url: Url, call: &Call) -> reqwest::Result<reqwest::Response> {
        let mut req =
            self.http.request(call.method.clone(), url).timeout(self.timeout + call.extra_timeout);
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        for (name, value) in &call.headers {
            req = req.header(name, value);
        }
        if let Some(body) = &call.body {
            req = req.body(body.clone());
        }
        req.send().await
    }

    /// Sends `call` to the first node that accepts a connection; returns that node and its
    /// answer, unread.
    pub async fn open(&self, call: &Call) -> Result<(Url, reqwest::Response)> {
        let mut tried = Vec::new();
        let mut last_error = None;
        for node in &self.nodes {
            match self.send_to(call.url(node)?, call).await {
                Ok(resp) => return Ok((node.clone(), resp)),
                Err(e) if e.is_connect() => {
                    tried.push(node.as_str().trim_end_matches('/').to_string());
                    last_error = Some(e);
                }
                Err(e) => {
                    return Err(anyhow::Error::new(e).context(format!("request to {node} failed")))
                }
            }
        }
        let tried = tried.join(", ");
        match last_error {
            Some(e) => {
                Err(anyhow::Error::new(e).context(format!("no node reachable (tried {tried})")))
            }
            None => bail!("no node address given"),
        }
    }
}

/// Reads an answer whole: its status and its body as JSON.
pub async fn read(resp: reqwest::Response) -> Result<Reply> {
    let status = resp.status();
    let bytes = resp.bytes().await.context("cannot read the answer")?;
    let body = if bytes.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    Ok(Reply { status, body })
}

/// Parses a node address: a URL, or `host:port` meaning `http://host:port`.
pub fn parse_addr(s: &str) -> Result<Url, String> {
    let s = s.trim();
    let full = if s.contains("://") { s.to_string() } else { format!("http://{s}") };
    let url = Url::parse(&full).map_err(|e| format!("invalid address {s:?}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
        return Err(format!("invalid address {s:?}: expected http://host:port"));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn urls_encode_segments_and_query() -> Result<()> {
        let base = parse_addr("127.0.0.1:7777").map_err(anyhow::Error::msg)?;
        let call = Call::new(Method::PUT, &["api", "ns", "q1,q2", "key/x y"])
            .param("key", Some("a&b=c"))
            .param("ttl", None::<u64>);
        assert_eq!(
            call.url(&base)?.as_str(),
            "http://127.0.0.1:7777/api/ns/q1,q2/key%2Fx%20y?key=a%26b%3Dc"
        );
        let prefixed = parse_addr("http://lb.example:80/delayd/").map_err(anyhow::Error::msg)?;
        assert_eq!(
            Call::new(Method::GET, &["admin", "cluster"]).url(&prefixed)?.as_str(),
            "http://lb.example/delayd/admin/cluster"
        );
        Ok(())
    }

    #[test]
    fn addresses() {
        assert!(parse_addr("http://10.0.0.1:7777").is_ok());
        assert!(parse_addr("ftp://10.0.0.1").is_err());
        assert!(parse_addr("http://").is_err());
    }

    #[test]
    fn json_bodies_leave_out_absent_options() {
        let call = Call::new(Method::PUT, &["x"]).json(json!({"url": "u", "secret": null}));
        assert_eq!(call.body.as_deref(), Some(&br#"{"url":"u"}"#[..]));
        assert_eq!(call.headers, [("Content-Type".to_string(), "application/json".to_string())]);
    }

    #[test]
    fn error_messages() {
        let reply = |status: u16, body: Value| Reply {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::IM_A_TEAPOT),
            body,
        };
        let e = reply(400, json!({"error": "tries must be at least 1"})).ok();
        assert_eq!(
            e.err().map(|e| e.to_string()).as_deref(),
            Some("400 Bad Request: tries must be at least 1")
        );
        let e = reply(404, json!({"msg": "no job available"})).ok();
        assert_eq!(
            e.err().map(|e| e.to_string()).as_deref(),
            Some("404 Not Found: no job available")
        );
        let e = reply(502, json!("<html>bad gateway</html>\n")).ok();
        assert_eq!(
            e.err().map(|e| e.to_string()).as_deref(),
            Some("502 Bad Gateway: <html>bad gateway</html>")
        );
        assert!(reply(204, Value::Null).ok().is_ok());
    }
}
