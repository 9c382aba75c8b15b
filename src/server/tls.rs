//! The gRPC listener: plain TCP, or TLS (optionally mTLS) with certificates that are
//! reloaded when their files change.
//!
//! tonic's built-in TLS reads the certificate once. cert-manager rotates certificates by
//! rewriting the files, so this module runs its own accept loop (tokio-rustls) and feeds
//! tonic through `serve_with_incoming`:
//!
//! * A watcher polls the files' modification time and size every `reload_interval`; on a
//!   change it builds a whole new rustls `ServerConfig` (certificate, key and client CA) and
//!   swaps it in. New handshakes use it; open connections, and the streams on them, keep
//!   the session they negotiated. A half-written or mismatched pair is refused with a
//!   warning and the previous configuration stays (the watcher retries next tick).
//! * Handshakes run in their own tasks with a deadline, so a client that connects and sends
//!   nothing cannot stall the accept loop.
//! * Each connection carries a [`ConnInfo`] (peer address and, under mTLS, the names in the
//!   client certificate) that tonic puts into every request's extensions.

use std::{
    io,
    net::SocketAddr,
    path::{Path, PathBuf},
    pin::Pin,
    sync::{Arc, RwLock},
    task::{Context, Poll},
    time::{Duration, SystemTime},
};

use rustls::{ServerConfig, server::WebPkiClientVerifier};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Where the server's TLS material is, and how often to look for a new version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    /// PEM certificate chain (`--tls-cert`).
    pub cert: PathBuf,
    /// PEM private key (`--tls-key`).
    pub key: PathBuf,
    /// PEM CA bundle that client certificates must chain to (`--tls-client-ca`): mTLS.
    pub client_ca: Option<PathBuf>,
    /// How often the files are checked for changes (`--tls-reload-interval`).
    pub reload_interval: Duration,
}

/// Why TLS material cannot be used; the message names the flag.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or parsed.
    #[error("{flag} {path}: {reason}")]
    File {
        /// The flag.
        flag: &'static str,
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// rustls refused the combination (for example a key that does not match the certificate).
    #[error("--tls-cert / --tls-key: {0}")]
    Config(String),
}

/// The names a client certificate carries, for the identity rule (see `identity`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerNames {
    /// URI SANs (SPIFFE IDs), in certificate order.
    pub uris: Vec<String>,
    /// DNS SANs, in certificate order.
    pub dns: Vec<String>,
}

/// What tonic knows about the connection a request came on (in its extensions).
#[derive(Clone, Debug)]
pub struct ConnInfo {
    /// The client's address.
    pub remote_addr: SocketAddr,
    /// Under mTLS, the verified client certificate's names.
    pub peer: Option<PeerNames>,
}

/// One accepted connection, plain or TLS.
pub struct Conn {
    io: ConnIo,
    info: ConnInfo,
}

enum ConnIo {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            ConnIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            ConnIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            ConnIo::Plain(s) => Pin::new(s).poll_flush(cx),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            ConnIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The current rustls configuration, swapped by the reload watcher.
#[derive(Clone)]
pub struct ReloadingTls {
    settings: Arc<TlsSettings>,
    current: Arc<RwLock<Arc<ServerConfig>>>,
}

/// Modification time and length of each file: a change in either means "reload".
type Stamp = Vec<Option<(SystemTime, u64)>>;

impl ReloadingTls {
    /// Loads the files (any problem stops the start, naming the flag).
    pub fn load(settings: TlsSettings) -> Result<Self, TlsError> {
        let config = build_config(&settings)?;
        Ok(Self { settings: Arc::new(settings), current: Arc::new(RwLock::new(Arc::new(config))) })
    }

    fn acceptor(&self) -> TlsAcceptor {
        let config = match self.current.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        TlsAcceptor::from(config)
    }

    fn stamp(&self) -> Stamp {
        let s = &self.settings;
        [Some(&s.cert), Some(&s.key), s.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(|p| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len()))))
            .collect()
    }

    /// Polls the files until `stop`, swapping in a new configuration after each change,
    /// and counts what became of each change into `metrics`.
    async fn watch(self, stop: CancellationToken, metrics: Arc<Metrics>) {
        let mut last = self.stamp();
        let mut tick = tokio::time::interval(self.settings.reload_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = self.stamp();
            if now == last {
                continue;
            }
            match build_config(&self.settings) {
                Ok(config) => {
                    let config = Arc::new(config);
                    // Counted first: whoever is served the new files can see it counted.
                    metrics.observe_tls_reload(true);
                    match self.current.write() {
                        Ok(mut guard) => *guard = config,
                        Err(poisoned) => *poisoned.into_inner() = config,
                    }
                    last = now;
                    tracing::info!(cert = %self.settings.cert.display(), "reloaded the gRPC TLS certificate");
                }
                // Often a rotation caught between writing the certificate and the key.
                Err(error) => {
                    metrics.observe_tls_reload(false);
                    tracing::warn!(%error, "TLS files changed but cannot be used yet; keeping the previous ones")
                }
            }
        }
    }
}

fn read_file(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::File {
        flag,
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

fn certs(flag: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_file(flag, path)?;
    let bad = |reason: String| TlsError::File { flag, path: path.display().to_string(), reason };
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(bad("holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// Builds a rustls server configuration from the files (h2 only: this serves gRPC).
fn build_config(settings: &TlsSettings) -> Result<ServerConfig, TlsError> {
    let chain = certs("--tls-cert", &settings.cert)?;
    let key_pem = read_file("--tls-key", &settings.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::File {
        flag: "--tls-key",
        path: settings.key.display().to_string(),
        reason: format!("not a PEM private key: {e}"),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &settings.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certs("--tls-client-ca", ca)? {
                roots.add(cert).map_err(|e| TlsError::File {
                    flag: "--tls-client-ca",
                    path: ca.display().to_string(),
                    reason: e.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::File {
                    flag: "--tls-client-ca",
                    path: ca.display().to_string(),
                    reason: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The names in a verified client certificate (URI and DNS SANs).
fn peer_names(cert: &CertificateDer<'_>) -> PeerNames {
    match webpki::EndEntityCert::try_from(cert) {
        Ok(cert) => PeerNames {
            uris: cert.valid_uri_names().map(str::to_string).collect(),
            dns: cert.valid_dns_names().map(str::to_string).collect(),
        },
        Err(_) => PeerNames::default(),
    }
}

/// How long a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; beyond, new connections are closed at once (a flood of
/// clients that connect and stall must not pile up tasks and memory).
const MAX_HANDSHAKES: usize = 1024;

/// Accepts connections on `listener` (TLS when `tls` is set) until `stop`, and yields
/// them for `serve_with_incoming`. Also runs the certificate watcher, which counts its
/// reloads into `metrics`.
pub fn incoming(
    listener: TcpListener,
    tls: Option<ReloadingTls>,
    stop: CancellationToken,
    metrics: Arc<Metrics>,
) -> ReceiverStream<Result<Conn, io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    if let Some(tls) = &tls {
        tokio::spawn(tls.clone().watch(stop.clone(), metrics));
    }
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    tokio::spawn(async move {
        loop {
            let (tcp, remote_addr) = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(pair) => pair,
                    Err(error) => {
                        // EMFILE and friends: back off instead of spinning; never end serving.
                        tracing::warn!(%error, "gRPC accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            // Without TCP_NODELAY a small command waits for a delayed ACK (~40 ms).
            let _ = tcp.set_nodelay(true);
            let Some(tls) = &tls else {
                let conn = Conn { io: ConnIo::Plain(tcp), info: ConnInfo { remote_addr, peer: None } };
                if tx.send(Ok(conn)).await.is_err() {
                    return;
                }
                continue;
            };
            let Ok(slot) = handshakes.clone().try_acquire_owned() else {
                tracing::warn!(%remote_addr, "{MAX_HANDSHAKES} TLS handshakes in progress; closing a new connection");
                continue;
            };
            let acceptor = tls.acceptor();
            let tx = tx.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(error)) => {
                        tracing::debug!(%remote_addr, %error, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%remote_addr, "TLS handshake timed out");
                        return;
                    }
                };
                let peer = stream.get_ref().1.peer_certificates().and_then(|c| c.first()).map(peer_names);
                let conn = Conn { io: ConnIo::Tls(Box::new(stream)), info: ConnInfo { remote_addr, peer } };
                let _ = tx.send(Ok(conn)).await;
            });
        }
    });
    ReceiverStream::new(rx)
}
