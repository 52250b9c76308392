//! # The Disque protocol: Disque's commands over RESP2, on the same service
//!
//! Disque clients connect to `disque_addr` and work on the queues of one namespace,
//! `disque_namespace`. Each command is one or a few [`Service`] calls (`commands.rs`), so
//! authorization, validation and errors are the HTTP API's; every node serves it (followers
//! forward writes like any front end). How Disque's model maps onto delayd's:
//!
//! - a job id is `D-` followed by the job's ULID;
//! - `ADDJOB`'s `RETRY` is the job's ttr (default 300 s, Disque's) and `TTL` its ttl (default
//!   a day); a job is requeued whenever its ttr runs out, until its ttl ends (as many tries as
//!   a job may have), except with `RETRY 0`: delivered at most once, like Disque's;
//! - `REPLICATE`, `ASYNC` and `ADDJOB`'s timeout are accepted and change nothing: delayd
//!   answers only once a majority has the job;
//! - `ACKJOB` and `FASTACK` both delete the job; `NACK` puts it back at once; `WORKING`
//!   extends its lease by its ttr;
//! - `PAUSE q out|all|in` stops deliveries (delayd's pause: publishes are still taken),
//!   `PAUSE q none` resumes;
//! - `HELLO` names only the node answering (peers' Disque addresses are not known);
//!   `DEQUEUE`, `QSCAN` and `JSCAN` are not supported.
//!
//! With authentication on, a connection must first send `AUTH <token>` with a token of the
//! namespace (or the admin token); until then every command but `AUTH`, `PING`, `HELLO` and
//! `QUIT` is answered `-NOAUTH`.

mod commands;
mod resp;

use std::net::SocketAddr;
use std::time::Instant;

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::service::{Principal, Service};
use resp::{read_command, ProtocolError, Reply};

/// The most a connection may send before it has authenticated.
const MAX_BYTES_BEFORE_AUTH: usize = 64 * 1024;

/// Serves Disque clients on `listener` until the node's Raft stops, within the HTTP API's
/// connection limit (`http_max_connections` at once); a connection idle between commands
/// for `protocol_idle_timeout_ms` (if set) is closed.
pub(crate) async fn serve(listener: TcpListener, service: Service) {
    crate::listener::serve(listener, &service, "disque", |stream, peer| {
        connection(service.clone(), stream, peer)
    })
    .await;
}

/// One client's connection: its commands in order, each answered before the next is read.
async fn connection(service: Service, stream: TcpStream, peer: SocketAddr) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut conn = commands::Connection {
        principal: service.config().auth.dev.then_some(Principal::Dev),
        quit: false,
    };
    let idle = service.config().protocol_idle_timeout;
    let mut out = Vec::new();
    loop {
        let max_bytes = match conn.principal {
            Some(_) => service.config().max_request_bytes(),
            None => MAX_BYTES_BEFORE_AUTH,
        };
        let Some(next) = crate::listener::within(idle, read_command(&mut read, max_bytes)).await
        else {
            return; // idle too long
        };
        let command = match next {
            Ok(Some(command)) if command.is_empty() => continue,
            Ok(Some(command)) => command,
            Ok(None) | Err(ProtocolError::Io(_)) => return,
            Err(ProtocolError::Bad(why)) => {
                Reply::Error(format!("ERR Protocol error: {why}")).write(&mut out);
                let _ = write.write_all(&out).await;
                tracing::debug!(%peer, why, "Disque client sent a malformed command");
                return;
            }
        };
        let started = Instant::now();
        let name = String::from_utf8_lossy(&command[0]).to_ascii_uppercase();
        // A client that goes away mid-command (a GETJOB it gave up on) ends the command: a
        // reserve dropped before its answer puts back what it took.
        let reply = tokio::select! {
            reply = commands::run(&service, &mut conn, &name, &command[1..]) => reply,
            () = crate::listener::closed(&mut read) => return,
        };
        let outcome = if matches!(reply, Reply::Error(_)) { "error" } else { "ok" };
        let label =
            if commands::KNOWN.contains(&name.as_str()) { name.as_str() } else { "unknown" };
        service.metrics().protocol_request("disque", label, outcome, started.elapsed());
        out.clear();
        reply.write(&mut out);
        if write.write_all(&out).await.is_err() || conn.quit {
            return;
        }
    }
}
