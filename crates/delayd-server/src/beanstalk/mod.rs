//! # The beanstalkd protocol: beanstalkd's text commands on the same service
//!
//! beanstalkd clients connect to `beanstalk_addr` and work on the tubes of one namespace,
//! `beanstalk_namespace`: a tube is a queue. Each command is one or a few [`Service`] calls
//! (`commands.rs`), so validation, limits and the state machine are the HTTP API's, and every
//! node serves it (followers forward writes). beanstalkd has no authentication: a client of
//! this listener acts as [`Principal::Listener`] of that namespace, so the listener must only
//! be reachable by those who may use the namespace.
//!
//! How beanstalkd's model maps onto delayd's:
//!
//! - a job's id is its number ([`delayd_core::Job::number`]), given by the state machine;
//! - a job never expires and has as many tries as a job may have (65,535), since beanstalkd
//!   requeues a job whose ttr ran out for ever; a ttr of 0 is 1 s, as in beanstalkd;
//! - `reserve` takes the most urgent ready job across the watched tubes (priority, then time
//!   in line), and answers `DEADLINE_SOON` when a job the connection holds is within a
//!   second of its ttr;
//! - buried is delayd's dead letter; `kick` makes buried jobs ready (or delayed ones, when
//!   the tube has no buried job) keeping their tries;
//! - jobs still reserved when their connection closes are released at once;
//! - what is per server in beanstalkd (connection counts, `stats`) is per node here.
//!
//! `docs/protocols.md` lists the differences.

mod commands;
mod wire;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::service::Service;
use commands::Connection;
use wire::{read_body, read_line, ReadError, Request};

/// Serves beanstalkd clients on `listener` until the node's Raft stops, within the HTTP
/// API's connection limit (`http_max_connections` at once); a connection idle between
/// commands for `protocol_idle_timeout_ms` (if set) is closed (a `reserve` that is waiting
/// is not idle).
pub(crate) async fn serve(listener: TcpListener, service: Service) {
    let tubes = Tubes::default();
    crate::listener::serve(listener, &service, "beanstalk", |stream, peer| {
        connection(service.clone(), tubes.clone(), stream, peer)
    })
    .await;
}

/// One client's connection: its commands in order, each answered before the next is read.
async fn connection(service: Service, tubes: Tubes, stream: TcpStream, peer: SocketAddr) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut conn = Connection::new(&service, tubes);
    let idle = service.config().protocol_idle_timeout;
    let max_body = service.config().max_body_bytes;
    loop {
        let Some(line) = crate::listener::within(idle, read_line(&mut read)).await else {
            break; // idle too long
        };
        let line = match line {
            Ok(Some(line)) => line,
            Ok(None) | Err(ReadError::Io) => break,
            Err(ReadError::TooLong) => {
                let _ = write.write_all(b"BAD_FORMAT\r\n").await;
                tracing::debug!(%peer, "beanstalkd client sent an overlong line");
                break;
            }
        };
        let started = Instant::now();
        let request = match wire::parse(&line) {
            Ok(request) => request,
            Err(e) => {
                service.metrics().protocol_request(
                    "beanstalk",
                    "unknown",
                    "error",
                    started.elapsed(),
                );
                if write.write_all(e.reply()).await.is_err() {
                    break;
                }
                continue;
            }
        };
        let body = match request {
            Request::Put { bytes, .. } => match read_body(&mut read, bytes, max_body).await {
                Ok(body) => Some(body),
                Err(_) => break,
            },
            _ => None,
        };
        let name = request.name();
        // A client that goes away mid-command (a reserve it gave up on) ends the command: a
        // reserve dropped before its answer puts back what it took.
        let reply = tokio::select! {
            reply = conn.run(request, body) => reply,
            () = crate::listener::closed(&mut read) => break,
        };
        let outcome = if commands::is_error(&reply) { "error" } else { "ok" };
        service.metrics().protocol_request("beanstalk", name, outcome, started.elapsed());
        if write.write_all(&reply).await.is_err() || conn.quit {
            break;
        }
    }
    conn.close().await;
}

/// What this node's connections do with each tube: beanstalkd's per-tube connection counts
/// (`current-using`, `-watching`, `-waiting`), and the pauses they asked for. Per node: a
/// cluster has no server-wide view of connections.
#[derive(Clone, Default)]
pub(crate) struct Tubes {
    inner: Arc<Mutex<TubesInner>>,
}

#[derive(Default)]
struct TubesInner {
    counts: HashMap<String, TubeCount>,
    /// `pause-tube` delays taken by this node: the delay, and when it ends.
    pauses: HashMap<String, (u32, Instant)>,
}

/// Connections of this node using, watching and waiting on one tube.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TubeCount {
    pub(crate) using: u64,
    pub(crate) watching: u64,
    pub(crate) waiting: u64,
}

impl Tubes {
    fn lock(&self) -> std::sync::MutexGuard<'_, TubesInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `change` to `tube`'s counts, forgetting a tube nobody uses any more.
    fn update(&self, tube: &str, change: impl FnOnce(&mut TubeCount)) {
        let mut inner = self.lock();
        let count = inner.counts.entry(tube.to_string()).or_default();
        change(count);
        if *count == TubeCount::default() {
            inner.counts.remove(tube);
        }
    }

    /// `tube`'s counts.
    fn get(&self, tube: &str) -> TubeCount {
        self.lock().counts.get(tube).copied().unwrap_or_default()
    }

    /// The tubes some connection of this node uses or watches.
    fn names(&self) -> Vec<String> {
        self.lock().counts.keys().cloned().collect()
    }

    /// Records a pause of `delay_s` seconds from now (0: none).
    fn paused(&self, tube: &str, delay_s: u32) {
        let mut inner = self.lock();
        match delay_s {
            0 => inner.pauses.remove(tube),
            d => inner
                .pauses
                .insert(tube.into(), (d, Instant::now() + Duration::from_secs(d.into()))),
        };
    }

    /// The pause this node took for `tube`, if one is running: its delay and the time left.
    fn pause(&self, tube: &str) -> Option<(u32, Duration)> {
        let mut inner = self.lock();
        let (delay, until) = *inner.pauses.get(tube)?;
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            inner.pauses.remove(tube);
            return None;
        }
        Some((delay, left))
    }
}
