//! Serving the HTTP API with bounds on what one client's connections may hold.
//!
//! `axum::serve` has no header-read timeout, no idle timeout and no connection limit: a client
//! that opens connections and sends half a request header keeps them open forever, and enough
//! of them exhaust the node's file descriptors. [`serve_http`] serves the same router over
//! hyper (HTTP/1.1, and HTTP/2 with prior knowledge) and enforces [`HttpLimits`]:
//!
//! - **header timeout**: a request's header must arrive within `header_timeout`, counted from
//!   the connection's accept for its first request and from the first byte of each later one;
//! - **idle timeout**: a connection with no request in flight for `idle_timeout` is closed. A
//!   request is in flight from its parsed header until its response has been written, so a
//!   long-poll reserve waiting 600 s is never cut;
//! - **connection limit**: at most `max_connections` are served at once.
//!
//! hyper's own `header_read_timeout` is not used: in hyper 1.x (`proto/h1/conn.rs`) its timer
//! starts whenever the connection is ready for a new request head, so it also ends the wait
//! between two keep-alive requests, and the idle timeout could never be longer than it. A small
//! per-connection watchdog ([`Activity`]) tells the two waits apart instead.
//!
//! HTTP/2: a connection is checked against the header timeout until its first request; after
//! that only the idle timeout applies (frames such as pings do not count as a request). Its
//! streams are bounded by [`H2_MAX_STREAMS`], and a peer that stops answering pings (every
//! [`H2_PING_INTERVAL`]) is dropped even with streams open.
//!
//! TLS ([`serve_http_with_tls`]): the handshake runs on the connection's own task and counts
//! against the header timeout; a client that does not complete it (a plain-text one) is
//! dropped. ALPN offers h2 and http/1.1.
//!
//! A request body that trickles in slowly is not bounded here (its request is in flight); the
//! connection limit bounds how many such clients can be served at once.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Version};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;
use tower::ServiceExt;

use delayd_raft::tls::Tls;
use tokio_rustls::TlsAcceptor;

use crate::config::HttpLimits;

/// Most concurrent streams on one HTTP/2 connection (the RFC's recommended minimum): each may
/// hold a long-poll, so together with the connection limit this bounds the requests in flight.
pub const H2_MAX_STREAMS: u32 = 100;

/// How often an HTTP/2 connection is pinged; a peer that does not answer within the same time
/// is gone and its connection is closed, whatever streams it had open.
pub const H2_PING_INTERVAL: Duration = Duration::from_secs(20);

/// Serves `router` on `listener` within `limits` until `shutdown` completes, then stops
/// accepting, lets in-flight requests finish (idle connections close at once) and returns
/// when every connection has closed, or once `limits.drain_timeout` has passed: connections
/// with a request still in flight then are cut off.
///
/// Connections beyond `limits.max_connections` are not accepted: they wait in the kernel's
/// accept backlog (their requests are answered as soon as a slot frees) rather than being
/// accepted and closed. A client of a saturated node then sees a slow answer instead of a
/// reset it would retry at once, which would only add load; and when the backlog itself is
/// full the kernel drops new connection attempts, which clients retry with back-off.
pub async fn serve_http(
    listener: TcpListener,
    router: Router,
    limits: &HttpLimits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    serve_http_with_tls(listener, router, limits, None, shutdown).await
}

/// [`serve_http`], over TLS only when `tls` is given (see the module docs); each connection
/// takes the certificates current at its handshake.
pub async fn serve_http_with_tls(
    listener: TcpListener,
    router: Router,
    limits: &HttpLimits,
    tls: Option<Arc<Tls>>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let max = u32::try_from(limits.max_connections)
        .map_err(|_| io::Error::other("http_max_connections is too large"))?;
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let (cut_tx, cut_rx) = watch::channel(false);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The header timeout is the watchdog's (see the module docs); a timer alone would turn on
    // hyper's default of 30 s, which would also cut idle keep-alive connections.
    builder.http1().timer(TokioTimer::new()).header_read_timeout(None::<Duration>);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .keep_alive_interval(H2_PING_INTERVAL)
        .keep_alive_timeout(H2_PING_INTERVAL);
    let builder = Arc::new(builder);

    tokio::pin!(shutdown);
    loop {
        // A slot first: until one is free, new connections stay in the accept backlog.
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break, // never closed
            },
            () = &mut shutdown => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let conn = Connection {
            builder: builder.clone(),
            router: router.clone(),
            limits: limits.clone(),
            stop: stop_rx.clone(),
            cut: cut_rx.clone(),
            tls: tls.as_ref().map(|t| t.http_acceptor()),
        };
        tokio::spawn(async move {
            conn.serve(tcp).await;
            tracing::trace!(%peer, "HTTP connection closed");
            drop(permit);
        });
    }
    // Connections still in the backlog are refused; open ones finish what is in flight.
    drop(listener);
    let _ = stop_tx.send(true);
    if tokio::time::timeout(limits.drain_timeout, slots.acquire_many(max)).await.is_err() {
        let open = max as usize - slots.available_permits();
        tracing::warn!(
            connections = open,
            "requests still in flight after drain_timeout_ms; cutting their connections"
        );
        let _ = cut_tx.send(true);
        // Each connection's task returns as soon as it sees the cut.
        let _ = tokio::time::timeout(CUT_WAIT, slots.acquire_many(max)).await;
    }
    Ok(())
}

/// How long connections cut off at the end of a drain get to close.
const CUT_WAIT: Duration = Duration::from_secs(1);

/// An accept error: a connection that failed before we took it is the client's problem; a
/// local one (out of file descriptors, most likely) is waited out rather than spun on.
async fn accept_failed(e: io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(e.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset) {
        return;
    }
    tracing::warn!(error = %e, "cannot accept an HTTP connection; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// What one connection's task needs.
struct Connection {
    builder: Arc<auto::Builder<TokioExecutor>>,
    router: Router,
    limits: HttpLimits,
    stop: watch::Receiver<bool>,
    /// Set when the drain deadline has passed: the connection is dropped, requests and all.
    cut: watch::Receiver<bool>,
    /// The TLS acceptor, when the listener speaks TLS.
    tls: Option<TlsAcceptor>,
}

impl Connection {
    /// Serves one connection until the client closes it, the watchdog or an error ends it,
    /// or the server stops (after its in-flight requests are answered).
    async fn serve(mut self, tcp: TcpStream) {
        // Answers are written whole; Nagle's algorithm would only hold a pipelined client's
        // next answer back behind the delayed ack of the previous one.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on an HTTP connection");
        }
        // Created before the handshake: the header timeout counts from the accept.
        let activity = Arc::new(Activity::new());
        match self.tls.take() {
            None => self.serve_io(tcp, activity).await,
            Some(acceptor) => {
                let handshake = acceptor.accept(tcp);
                match tokio::time::timeout(self.limits.header_timeout, handshake).await {
                    Ok(Ok(tls)) => self.serve_io(tls, activity).await,
                    Ok(Err(e)) => tracing::debug!(error = %e, "HTTP TLS handshake failed"),
                    Err(_) => tracing::debug!("HTTP TLS handshake timed out"),
                }
            }
        }
    }

    /// Serves the connection's (plain or TLS) stream.
    async fn serve_io<S>(mut self, stream: S, activity: Arc<Activity>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let io = TokioIo::new(Watched { inner: stream, activity: activity.clone() });
        let router = self.router.clone();
        let service = hyper::service::service_fn({
            let activity = activity.clone();
            move |req: Request<Incoming>| {
                let in_flight = activity.request_started(req.version() == Version::HTTP_2);
                let router = router.clone();
                async move {
                    let response = router.oneshot(req).await?;
                    // The request stays in flight until hyper drops the body, i.e. once it
                    // has been written in full (or the client went away).
                    Ok::<_, Infallible>(response.map(move |body| {
                        body.map_frame(move |frame| {
                            let _still_in_flight = &in_flight;
                            frame
                        })
                    }))
                }
            }
        });
        let conn = self.builder.serve_connection(io, service);
        tokio::pin!(conn);
        let mut stopping = false;
        loop {
            tokio::select! {
                done = conn.as_mut() => {
                    if let Err(e) = done {
                        tracing::debug!(error = %e, "HTTP connection ended with an error");
                    }
                    return;
                }
                why = activity.expired(&self.limits) => {
                    // No request is in flight (the watchdog only fires then): dropping the
                    // connection loses nothing.
                    tracing::debug!(reason = why, "closing an HTTP connection");
                    return;
                }
                _ = self.stop.wait_for(|stop| *stop), if !stopping => {
                    stopping = true;
                    conn.as_mut().graceful_shutdown();
                }
                _ = self.cut.wait_for(|cut| *cut) => return,
            }
        }
    }
}

/// One connection's activity, for its watchdog: whether a request is in flight, and since
/// when the connection has been waiting for a header or idle.
///
/// Requests only record what they do; nothing wakes the watchdog. It looks at the state
/// when the deadline it computed comes, and at least every `min(header, idle)` timeout: the
/// one change that can bring a deadline closer (bytes arriving on an idle connection, whose
/// header must then come within the header timeout) sets a deadline at least that far
/// ahead of itself, so a look that often is never late. Waking it on every change instead
/// cost each request two timer registrations on the runtime's shared timer wheel.
struct Activity {
    state: Mutex<State>,
}

struct State {
    /// Requests whose response has not been written yet.
    in_flight: usize,
    /// A request header has been started (or, fresh connection, is owed) since `since`.
    reading_header: bool,
    /// When the current wait (for a header, or idle) began.
    since: Instant,
    /// The connection speaks HTTP/2: bytes with no stream open are not a request header.
    h2: bool,
}

impl Activity {
    fn new() -> Activity {
        let state = State { in_flight: 0, reading_header: true, since: Instant::now(), h2: false };
        Activity { state: Mutex::new(state) }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state is a few plain fields; a panic elsewhere cannot leave it inconsistent.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Bytes arrived from the client: on an idle HTTP/1 connection, a new request begins and
    /// its header must arrive within the header timeout.
    fn bytes_read(&self) {
        let mut s = self.state();
        if s.in_flight == 0 && !s.reading_header && !s.h2 {
            s.reading_header = true;
            s.since = Instant::now();
        }
    }

    /// A request header was parsed; the request is in flight until the guard is dropped.
    fn request_started(self: &Arc<Self>, h2: bool) -> InFlight {
        let mut s = self.state();
        s.in_flight += 1;
        s.reading_header = false;
        s.h2 |= h2;
        InFlight(self.clone())
    }

    /// Resolves with the reason when the connection has waited too long for a header or
    /// been idle too long; never while a request is in flight.
    async fn expired(&self, limits: &HttpLimits) -> &'static str {
        // The longest a look may be put off (see `Activity`).
        let every = limits.header_timeout.min(limits.idle_timeout);
        loop {
            let now = Instant::now();
            let deadline = {
                let s = self.state();
                if s.in_flight > 0 {
                    None
                } else if s.reading_header {
                    Some((s.since + limits.header_timeout, "header timeout"))
                } else {
                    Some((s.since + limits.idle_timeout, "idle timeout"))
                }
            };
            let next_look = match deadline {
                Some((at, why)) if at <= now => return why,
                Some((at, _)) => at.min(now + every),
                None => now + every,
            };
            tokio::time::sleep_until(next_look).await;
        }
    }
}

/// A request in flight on a connection; dropping it ends the request.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.0.state();
        s.in_flight = s.in_flight.saturating_sub(1);
        if s.in_flight == 0 {
            s.since = Instant::now();
        }
    }
}

/// The client's socket, telling the watchdog when bytes arrive.
struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_read();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
