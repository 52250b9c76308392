//! What the listeners of the other wire protocols (Disque, beanstalkd) share: accepting
//! connections within the HTTP API's connection limit until the node stops, the idle limit
//! between commands, and telling a client that went away from one that is merely quiet.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::service::Service;

/// Accepts connections on `listener` until the node's Raft stops, at most
/// `http_max_connections` at once (more wait in the accept backlog), and runs `connection`
/// for each on its own task. `protocol` names the listener in logs.
pub(crate) async fn serve<F, Fut>(
    listener: TcpListener,
    service: &Service,
    protocol: &'static str,
    connection: F,
) where
    F: Fn(TcpStream, SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(service.config().http.max_connections));
    let stopped = service.stopped();
    tokio::pin!(stopped);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot,
            () = &mut stopped => return,
        };
        let Ok(slot) = slot else { return };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stopped => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let served = connection(stream, peer);
                tokio::spawn(async move {
                    served.await;
                    drop(slot);
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, protocol, "a protocol listener cannot accept");
                // Out of file descriptors, typically: pause instead of spinning.
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// Completes when the client has closed its side (or the connection failed); never while it
/// is merely quiet or has sent its next command already. A command that waits (a blocking
/// reserve) races this, so a client that gives up ends it.
pub(crate) async fn closed<R: AsyncBufRead + Unpin>(read: &mut R) {
    match read.fill_buf().await {
        Ok([]) | Err(_) => {}
        Ok(_) => std::future::pending().await,
    }
}

/// Waits for `next` (a client's next command) at most `idle` (`None`: for ever): `None`
/// when the client stayed idle longer.
pub(crate) async fn within<T>(idle: Option<Duration>, next: impl Future<Output = T>) -> Option<T> {
    match idle {
        Some(idle) => tokio::time::timeout(idle, next).await.ok(),
        None => Some(next.await),
    }
}
