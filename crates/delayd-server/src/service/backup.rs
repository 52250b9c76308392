//! Backups: a consistent snapshot of the replicated state, streamed from the leader.
//!
//! The leader serves it, after a read barrier, so a backup holds every write acknowledged
//! before it was asked for. Another node answers with the leader's HTTP address instead
//! ([`Backup::Elsewhere`]), for the client to ask there: a follower's state may trail the
//! leader's, and relaying a large stream between nodes would only add a hop.
//!
//! The file is written by the store ([`delayd_store::StateReader::export`]) from one RocksDB
//! view on the blocking pool, in chunks through a small bounded channel: the node never holds
//! more than a few chunks of it, and a client that stops reading stops the export (the view
//! is released when the client goes).

use std::io::{self, Write};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::admin::Digest;
use super::auth::{Principal, Scope};
use super::Service;
use crate::error::ServiceError;

/// Bytes per chunk sent to the client.
const CHUNK_BYTES: usize = 256 << 10;
/// Chunks buffered between the export and the client.
const CHUNKS_IN_FLIGHT: usize = 4;
/// A client that takes no chunk for this long is given up on: the export stops and releases
/// its RocksDB view and its blocking thread rather than hold them for a stalled reader.
const STALL: Duration = Duration::from_secs(60);

/// A backup stream, with what it holds.
pub struct BackupStream {
    /// The index of the last entry applied to the state it holds.
    pub applied_index: Option<u64>,
    /// The term of the leader that proposed that entry.
    pub applied_term: Option<u64>,
    /// The digest of the state it holds (as `/admin/digest` computes it), when asked for.
    pub digest: Option<Digest>,
    /// The file, in chunks; an `Err` item ends it early (the client must discard what it got).
    pub body: mpsc::Receiver<Result<Bytes, io::Error>>,
}

/// The answer to a backup request.
pub enum Backup {
    /// This node leads: the file.
    Stream(BackupStream),
    /// Another node leads: ask it.
    Elsewhere {
        /// The leader's id.
        leader: u64,
        /// Its HTTP address (`host:port`), when it could be learned.
        http: Option<String>,
    },
}

impl Service {
    /// Starts a backup of the replicated state if this node leads; see the module docs.
    /// With `digest`, the state's digest is computed from the same view first (one more pass
    /// over the data).
    pub async fn backup(&self, caller: &Principal, digest: bool) -> Result<Backup, ServiceError> {
        self.authorize(caller, Scope::Admin)?;
        let cluster = self.cluster();
        let status = cluster.status();
        match status.leader {
            Some(leader) if leader == status.id => {}
            Some(leader) => {
                let http = self
                    .member_services()
                    .await
                    .into_iter()
                    .find(|(id, _)| *id == leader)
                    .and_then(|(_, mut services)| services.remove("http"));
                return Ok(Backup::Elsewhere { leader, http });
            }
            None => return Err(ServiceError::Unavailable("no leader is known".into())),
        }
        cluster.read_barrier().await?;

        let reader = cluster.reader().clone();
        let (started_tx, started_rx) = oneshot::channel();
        let (tx, mut body) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            let out = ChunkWriter {
                tx: tx.clone(),
                buf: Vec::with_capacity(CHUNK_BYTES),
                runtime: runtime.clone(),
            };
            let exported = reader.export(out, |meta, view| {
                let digest = digest.then(|| super::admin::digest_of(view)).transpose();
                let _ = started_tx.send((meta.last_log_id, digest));
            });
            if let Err(e) = exported {
                // The client sees a broken stream (or, before the first byte, an error).
                let failed = tx.send(Err(io::Error::other(e.to_string())));
                let _ = runtime.block_on(tokio::time::timeout(STALL, failed));
            }
        });
        let (last, digest) = match started_rx.await {
            Ok(started) => started,
            Err(_) => {
                let why = match body.recv().await {
                    Some(Err(e)) => e.to_string(),
                    _ => "the export stopped before it started".into(),
                };
                return Err(ServiceError::Unavailable(format!("cannot export the state: {why}")));
            }
        };
        Ok(Backup::Stream(BackupStream {
            applied_index: last.map(|l| l.index),
            applied_term: last.map(|l| l.committed_leader_id().term),
            digest: digest?,
            body,
        }))
    }
}

/// Writes into the channel in chunks of [`CHUNK_BYTES`]; fails once the receiver is gone or
/// has taken nothing for [`STALL`]. Runs on the blocking pool, which may wait on the runtime.
struct ChunkWriter {
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
    buf: Vec<u8>,
    runtime: tokio::runtime::Handle,
}

impl ChunkWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK_BYTES)));
        match self.runtime.block_on(tokio::time::timeout(STALL, self.tx.send(Ok(chunk)))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(io::Error::new(io::ErrorKind::BrokenPipe, "the client went away")),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took nothing for {STALL:?}"),
            )),
        }
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK_BYTES {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}
