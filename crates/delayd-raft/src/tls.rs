//! # TLS for the node's listeners and its connections to peers
//!
//! One [`Tls`] serves a whole node: the HTTP listener (`delayd-server`), the gRPC listener
//! (client API and the internal services, [`crate::server`]) and the node's connections to
//! its peers ([`crate::network`]). It holds rustls configurations built from three PEM files
//! ([`TlsFiles`]):
//!
//! - the node's certificate chain and private key, presented to every client and, when
//!   `peer_ca_file` is set, to peers as a client certificate;
//! - `peer_ca_file`, optional: the CA that signs node certificates. With it the gRPC
//!   listener asks every client for a certificate (optionally, as ordinary clients share the
//!   port) and verifies one that is shown against this CA, the `Raft` and `Internal` services
//!   refuse calls over a connection that showed none ([`crate::server::ClusterGuard`]), and
//!   the node verifies its peers' server certificates against it, by the host part of their
//!   advertised address.
//!
//! ## Reload
//!
//! Certificates expire, so they are reread without a restart: [`Tls::watch`] reloads on
//! SIGHUP and whenever a file's modification time changes (checked every
//! [`RELOAD_POLL`]). A reload builds all configurations anew and swaps them in; a connection
//! takes the configuration current at its handshake, so open connections keep theirs and new
//! ones see the new certificate. A reload that fails (a missing file, a key that does not
//! match its certificate, a half-written file) keeps the previous configuration and logs an
//! error naming the file.
//!
//! ## Caveats
//!
//! - Only the HTTP and gRPC listeners speak TLS; the Disque and beanstalkd listeners stay
//!   plain text.
//! - A client that shows a certificate on the gRPC port must show one the peer CA signed:
//!   an unverifiable client certificate fails the handshake.
//! - The crypto provider is *ring*, chosen explicitly, whatever provider another crate in
//!   the process installs as rustls' default.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures::Stream;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;

/// How often [`Tls::watch`] checks the files' modification times.
pub const RELOAD_POLL: Duration = Duration::from_secs(5);

/// How long a client may take to complete the TLS handshake on the gRPC port. (The HTTP
/// listener counts the handshake against its header timeout instead.)
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a node's TLS material lives; each path is named by its setting in errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The node's certificate chain, PEM, leaf first (`tls_cert_file`).
    pub cert_file: PathBuf,
    /// The private key of the leaf certificate, PEM: PKCS#8, PKCS#1 or SEC1 (`tls_key_file`).
    pub key_file: PathBuf,
    /// The CA certificates that sign node certificates, PEM (`peer_ca_file`); `None`: no
    /// mutual TLS between peers.
    pub peer_ca_file: Option<PathBuf>,
}

impl TlsFiles {
    /// The files named by the settings `tls_cert_file`, `tls_key_file` and `peer_ca_file`:
    /// `None` when none is set; an error naming the settings when the certificate comes
    /// without its key (or the other way round), or a peer CA without the node's certificate
    /// (a node must show one to its peers).
    pub fn from_settings(
        cert_file: Option<PathBuf>,
        key_file: Option<PathBuf>,
        peer_ca_file: Option<PathBuf>,
    ) -> Result<Option<TlsFiles>, String> {
        match (cert_file, key_file) {
            (Some(cert_file), Some(key_file)) => {
                Ok(Some(TlsFiles { cert_file, key_file, peer_ca_file }))
            }
            (Some(_), None) => Err("tls_cert_file is set without tls_key_file: give both".into()),
            (None, Some(_)) => Err("tls_key_file is set without tls_cert_file: give both".into()),
            (None, None) if peer_ca_file.is_some() => Err("peer_ca_file needs tls_cert_file and \
                 tls_key_file: a node shows its own certificate to its peers"
                .into()),
            (None, None) => Ok(None),
        }
    }
}

/// A TLS file that could not be used, or a configuration rustls refused.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds nothing usable.
    #[error("{setting} {}: {why}", path.display())]
    File {
        /// The setting that names the file.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// rustls refused the material (a key that does not match the certificate, say).
    #[error("tls_cert_file {} with tls_key_file {}: {why}", cert.display(), key.display())]
    Config {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' reason.
        why: String,
    },
}

/// The configurations built from one reading of the files.
struct Loaded {
    /// The HTTP listener's: ALPN h2 and http/1.1, no client certificates.
    http: Arc<ServerConfig>,
    /// The gRPC listener's: ALPN h2, client certificates verified against the peer CA.
    grpc: Arc<ServerConfig>,
    /// For connections to peers; `None` without a peer CA (nothing to verify peers with).
    peer: Option<Arc<ClientConfig>>,
}

/// A node's TLS material, reloadable; see the module docs. Shared as `Arc<Tls>`.
pub struct Tls {
    files: TlsFiles,
    current: RwLock<Arc<Loaded>>,
    /// The files' modification times at the last reload attempt.
    stamps: Mutex<Vec<Option<SystemTime>>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads `files` and builds the configurations; an error names the setting and the file.
    pub fn load(files: TlsFiles) -> Result<Arc<Tls>, TlsError> {
        let stamps = stamps(&files);
        let loaded = build(&files)?;
        Ok(Arc::new(Tls {
            files,
            current: RwLock::new(Arc::new(loaded)),
            stamps: Mutex::new(stamps),
        }))
    }

    /// The files this was loaded from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Whether peers must show a certificate signed by the peer CA (`peer_ca_file` is set).
    pub fn peer_certs_required(&self) -> bool {
        self.files.peer_ca_file.is_some()
    }

    fn current(&self) -> Arc<Loaded> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Rereads the files now; on failure the configuration in use stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        *self.stamps.lock().unwrap_or_else(PoisonError::into_inner) = stamps(&self.files);
        let loaded = build(&self.files)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(loaded);
        Ok(())
    }

    /// Rereads the files if one of their modification times changed since the last attempt.
    /// Returns whether it reloaded.
    fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = stamps(&self.files);
        if *self.stamps.lock().unwrap_or_else(PoisonError::into_inner) == now {
            return Ok(false);
        }
        self.reload().map(|()| true)
    }

    /// Reloads on SIGHUP and when the files change (see the module docs) until `stop`
    /// completes. Failures are logged and keep the configuration in use.
    pub async fn watch(self: Arc<Self>, stop: impl Future<Output = ()>) {
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGHUP; TLS files are still polled");
                None
            }
        };
        let mut poll = tokio::time::interval(RELOAD_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            let hup = async {
                match &mut hangup {
                    Some(s) => s.recv().await,
                    None => std::future::pending().await,
                }
            };
            let result = tokio::select! {
                () = &mut stop => return,
                _ = hup => self.reload().map(|()| true),
                _ = poll.tick() => self.reload_if_changed(),
            };
            match result {
                Ok(true) => {
                    tracing::info!(cert = %self.files.cert_file.display(), "TLS certificates reloaded")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(error = %e, "TLS reload failed; still using the previous certificates")
                }
            }
        }
    }

    /// The acceptor for a new HTTP connection: the configuration current now.
    pub fn http_acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current().http.clone())
    }

    /// The acceptor for a new gRPC connection: the configuration current now.
    pub fn grpc_acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current().grpc.clone())
    }

    /// The client configuration for a new connection to a peer; `None` without a peer CA.
    pub fn peer_client(&self) -> Option<Arc<ClientConfig>> {
        self.current().peer.clone()
    }
}

fn stamps(files: &TlsFiles) -> Vec<Option<SystemTime>> {
    [Some(&files.cert_file), Some(&files.key_file), files.peer_ca_file.as_ref()]
        .into_iter()
        .flatten()
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates in a PEM file; at least one.
fn read_certs(
    setting: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let err = |why: String| TlsError::File { setting, path: path.to_path_buf(), why };
    // Read first, so that a missing or unreadable file says so rather than "no certificate".
    let pem = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(err("no CERTIFICATE block".into()));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let err =
        |why: String| TlsError::File { setting: "tls_key_file", path: path.to_path_buf(), why };
    let pem = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| err(format!("no usable private key: {e}")))
}

fn build(files: &TlsFiles) -> Result<Loaded, TlsError> {
    let certs = read_certs("tls_cert_file", &files.cert_file)?;
    let key = read_key(&files.key_file)?;
    let roots = match &files.peer_ca_file {
        Some(path) => {
            let err =
                |why: String| TlsError::File { setting: "peer_ca_file", path: path.clone(), why };
            // Read first, so that a missing or unreadable file says so.
            let pem = std::fs::read(path).map_err(|e| err(e.to_string()))?;
            Some(Arc::new(delayd_proto::tls::root_store(&pem).map_err(err)?))
        }
        None => None,
    };
    let config_err = |e: rustls::Error| TlsError::Config {
        cert: files.cert_file.clone(),
        key: files.key_file.clone(),
        why: e.to_string(),
    };
    let server = || {
        ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(config_err)
    };

    let mut http = server()?
        .with_no_client_auth()
        .with_single_cert(certs.clone(), key.clone_key())
        .map_err(config_err)?;
    http.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];

    let grpc = server()?;
    let grpc = match &roots {
        // Optional at the handshake: clients of the public API share the port and have no
        // certificate; the internal services check for one (`ClusterGuard`).
        Some(roots) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::File {
                    setting: "peer_ca_file",
                    path: files.peer_ca_file.clone().unwrap_or_default(),
                    why: e.to_string(),
                })?;
            grpc.with_client_cert_verifier(verifier)
        }
        None => grpc.with_no_client_auth(),
    };
    let mut grpc = grpc.with_single_cert(certs.clone(), key.clone_key()).map_err(config_err)?;
    grpc.alpn_protocols = vec![b"h2".to_vec()];

    let peer = match roots {
        Some(roots) => {
            let mut peer = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(config_err)?
                .with_root_certificates(roots)
                .with_client_auth_cert(certs, key)
                .map_err(config_err)?;
            peer.alpn_protocols = vec![b"h2".to_vec()];
            Some(Arc::new(peer))
        }
        None => None,
    };
    Ok(Loaded { http: Arc::new(http), grpc: Arc::new(grpc), peer })
}

/// A gRPC connection after its TLS handshake. tonic puts its [`TlsConnectInfo`] into every
/// request's extensions (tonic's own TLS connection info is only compiled with its TLS
/// features, which would also make tonic's channels refuse our `https://` connector).
pub struct TlsConnection(tokio_rustls::server::TlsStream<TcpStream>);

/// What a request learns about its TLS connection (see [`TlsConnection`]).
#[derive(Clone, Debug)]
pub struct TlsConnectInfo {
    /// The client's address.
    pub remote_addr: Option<std::net::SocketAddr>,
    /// The client showed a certificate, which the handshake verified against the peer CA.
    pub peer_certified: bool,
}

impl tonic::transport::server::Connected for TlsConnection {
    type ConnectInfo = TlsConnectInfo;

    fn connect_info(&self) -> TlsConnectInfo {
        let (tcp, session) = self.0.get_ref();
        TlsConnectInfo {
            remote_addr: tcp.peer_addr().ok(),
            peer_certified: session.peer_certificates().is_some_and(|c| !c.is_empty()),
        }
    }
}

impl tokio::io::AsyncRead for TlsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for TlsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The gRPC listener's connections after their TLS handshake, for tonic's
/// `serve_with_incoming`. Handshakes run on their own tasks, so a slow client holds up no
/// other; one that fails or takes longer than [`HANDSHAKE_TIMEOUT`] is dropped (a plain-text
/// client among them). Accepting stops when the stream is dropped.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<Tls>,
) -> impl Stream<Item = io::Result<TlsConnection>> + Send + 'static {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = tx.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a gRPC connection");
                    // Out of file descriptors, typically: pause instead of spinning.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx) = (tls.grpc_acceptor(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(TlsConnection(stream))).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "gRPC TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "gRPC TLS handshake timed out"),
                }
            });
        }
    });
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|s| (s, rx)) })
}

/// The connector for connections to peers (`Endpoint::connect_with_connector_lazy`): TCP to
/// the URI's host and port, then a handshake that verifies the peer's certificate against the
/// peer CA for the URI's host and presents this node's certificate. The configuration is
/// taken at each connection, so a reconnect uses reloaded certificates.
pub fn peer_connector(tls: Arc<Tls>) -> delayd_proto::tls::TlsConnector {
    delayd_proto::tls::TlsConnector::with(move || {
        tls.peer_client().ok_or_else(|| {
            io::Error::other(
                "TLS to peers needs peer_ca_file (the CA that signs node certificates)",
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_named_with_its_setting() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = TlsFiles {
            cert_file: dir.path().join("node.pem"),
            key_file: dir.path().join("node.key"),
            peer_ca_file: None,
        };
        let err = Tls::load(files).expect_err("no files").to_string();
        assert!(err.starts_with("tls_cert_file ") && err.contains("node.pem"), "{err}");
    }

    /// Writes a fresh self-signed certificate and its key to `cert` and `key`.
    fn self_signed(cert: &Path, key: &Path) {
        let issued =
            rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
        std::fs::write(key, issued.key_pair.serialize_pem()).expect("write key");
        std::fs::write(cert, issued.cert.pem()).expect("write cert");
    }

    #[test]
    fn a_bad_reload_keeps_the_configuration_in_use_and_a_good_one_replaces_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = (dir.path().join("node.pem"), dir.path().join("node.key"));
        self_signed(&cert, &key);
        let files = TlsFiles { cert_file: cert.clone(), key_file: key.clone(), peer_ca_file: None };
        let tls = Tls::load(files).expect("loads");
        let first = tls.current();

        std::fs::write(&cert, "garbage\n").expect("write");
        let err = tls.reload().expect_err("garbage").to_string();
        assert!(err.contains("tls_cert_file") && err.contains("node.pem"), "{err}");
        assert!(Arc::ptr_eq(&first, &tls.current()), "the old configuration stays");

        // A certificate that does not belong to the key is refused too.
        let other =
            rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
        std::fs::write(&cert, other.cert.pem()).expect("write");
        assert!(tls.reload().is_err(), "a key of another certificate");
        assert!(Arc::ptr_eq(&first, &tls.current()));

        self_signed(&cert, &key);
        tls.reload().expect("a good pair reloads");
        assert!(!Arc::ptr_eq(&first, &tls.current()), "replaced");
    }

    #[test]
    fn a_file_without_pem_blocks_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cert = dir.path().join("node.pem");
        std::fs::write(&cert, "not a certificate\n").expect("write");
        let files =
            TlsFiles { cert_file: cert, key_file: dir.path().join("k"), peer_ca_file: None };
        let err = Tls::load(files).expect_err("no certificate").to_string();
        assert!(err.contains("no CERTIFICATE block"), "{err}");
    }
}
