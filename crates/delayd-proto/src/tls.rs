//! TLS for tonic channels without tonic's own TLS features: a connector that opens TCP to
//! the URI's host and port and completes a rustls handshake that verifies the server's
//! certificate for that host. Used by a node to reach its peers (with its client certificate
//! and the peer CA) and by `delayd-client` (with the CA a user gives).
//!
//! tonic's TLS features are left off on purpose: with them, tonic refuses an `https://`
//! endpoint that was not given tonic's own TLS configuration, and that configuration cannot
//! reload certificates.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tonic::transport::Uri;

/// A TLS connection to a server, as tonic's channel wants it.
pub type TlsIo = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;

type ConfigSource = Arc<dyn Fn() -> io::Result<Arc<ClientConfig>> + Send + Sync>;

/// Opens TLS connections for `Endpoint::connect_with_connector[_lazy]`; use `https://`
/// endpoints with it. The server's certificate is verified for the URI's host.
#[derive(Clone)]
pub struct TlsConnector {
    config: ConfigSource,
}

impl TlsConnector {
    /// Connects with `config`.
    pub fn new(config: Arc<ClientConfig>) -> TlsConnector {
        TlsConnector::with(move || Ok(config.clone()))
    }

    /// Connects with the configuration `source` gives at each new connection (so that a
    /// reconnect uses reloaded certificates); an error from it fails the connection.
    pub fn with(
        source: impl Fn() -> io::Result<Arc<ClientConfig>> + Send + Sync + 'static,
    ) -> TlsConnector {
        TlsConnector { config: Arc::new(source) }
    }
}

type Connecting = Pin<Box<dyn Future<Output = io::Result<TlsIo>> + Send>>;

impl tonic::codegen::Service<Uri> for TlsConnector {
    type Response = TlsIo;
    type Error = io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Connecting {
        let config = (self.config)();
        Box::pin(async move {
            let config = config?;
            let host = uri.host().ok_or_else(|| io::Error::other(format!("no host in {uri}")))?;
            // An IPv6 literal comes bracketed in a URI; neither TCP nor the name check wants
            // the brackets.
            let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
            let port = uri.port_u16().unwrap_or(443);
            let name = ServerName::try_from(host.clone())
                .map_err(|e| io::Error::other(format!("{host} is not a valid server name: {e}")))?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
            Ok(TokioIo::new(tls))
        })
    }
}

/// A client configuration that trusts the CA certificates in `ca_pem` (and nothing else) and
/// offers HTTP/2, with the ring provider. Fails when `ca_pem` holds no usable certificate.
pub fn client_config(ca_pem: &[u8]) -> Result<ClientConfig, String> {
    let roots = root_store(ca_pem)?;
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The CA certificates in `ca_pem` as trust roots; fails when it holds none or one is not a
/// usable CA certificate. Clients (above) and a node's peer CA (`delayd-raft`) read CAs so.
pub fn root_store(ca_pem: &[u8]) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem) {
        let ca = ca.map_err(|e| format!("not PEM certificates: {e}"))?;
        roots.add(ca).map_err(|e| format!("not a usable CA certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err("no CERTIFICATE block".into());
    }
    Ok(roots)
}
