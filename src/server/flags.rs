//! The `serve` flags of the gRPC server's security and limits (flattened into
//! [`crate::config::ServeArgs`]); see the README's "Security" section.

use std::{path::PathBuf, time::Duration};

use super::{ServerOptions, identity::IdentityRule, limits::Limits, tls::TlsSettings};
use crate::config::parse_duration;

/// TLS, identity binding and limits of the gRPC server.
#[derive(Clone, Debug, clap::Args)]
pub struct ServerSecurityArgs {
    /// PEM certificate chain of the gRPC server: serve TLS (with --tls-key). Reloaded when
    /// the file changes.
    #[arg(long, env = "KAFKA_ASSIGNER_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "KAFKA_ASSIGNER_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA bundle: clients must present a certificate it signed (mTLS).
    #[arg(long, env = "KAFKA_ASSIGNER_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// How often the TLS files are checked for a rotation.
    #[arg(long, env = "KAFKA_ASSIGNER_TLS_RELOAD_INTERVAL", value_parser = parse_duration, default_value = "10s")]
    pub tls_reload_interval: Duration,

    /// With mTLS: a connection may only use the consumer name its client certificate
    /// carries (first URI SAN, else first DNS SAN; see --consumer-identity-pattern).
    #[arg(long, env = "KAFKA_ASSIGNER_BIND_CONSUMER_IDENTITY", requires = "tls_client_ca")]
    pub bind_consumer_identity: bool,

    /// Regex mapping a certificate SAN to the consumer name: capture group 1 (or the whole
    /// match) of the first SAN it matches, e.g. `^spiffe://[^/]+/ns/[^/]+/pod/([^/]+)$`.
    #[arg(long, env = "KAFKA_ASSIGNER_CONSUMER_IDENTITY_PATTERN", requires = "bind_consumer_identity")]
    pub consumer_identity_pattern: Option<String>,

    /// Open Register streams this instance serves at most (RESOURCE_EXHAUSTED beyond).
    #[arg(long, env = "KAFKA_ASSIGNER_MAX_STREAMS", default_value = "20000")]
    pub max_streams: usize,

    /// Open Register streams one client IP address may hold.
    #[arg(long, env = "KAFKA_ASSIGNER_MAX_STREAMS_PER_IP", default_value = "1000")]
    pub max_streams_per_ip: usize,

    /// Largest request message, in bytes (OUT_OF_RANGE beyond).
    #[arg(long, env = "KAFKA_ASSIGNER_MAX_REQUEST_BYTES", default_value = "65536")]
    pub max_request_bytes: usize,

    /// Longest a unary call may run (DEADLINE_EXCEEDED beyond).
    #[arg(long, env = "KAFKA_ASSIGNER_UNARY_TIMEOUT", value_parser = parse_duration, default_value = "30s")]
    pub unary_timeout: Duration,

    /// HTTP/2 ping interval: how soon a silent connection is probed.
    #[arg(long, env = "KAFKA_ASSIGNER_HTTP2_KEEPALIVE_INTERVAL", value_parser = parse_duration, default_value = "30s")]
    pub http2_keepalive_interval: Duration,

    /// A ping not answered within this closes the connection (and ends its streams).
    #[arg(long, env = "KAFKA_ASSIGNER_HTTP2_KEEPALIVE_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    pub http2_keepalive_timeout: Duration,
}

impl ServerSecurityArgs {
    /// The server options these flags ask for; a bad pattern is an error naming its flag.
    pub fn options(&self) -> Result<ServerOptions, String> {
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsSettings {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca.clone(),
                reload_interval: self.tls_reload_interval,
            }),
            _ => None,
        };
        let bind_identity = if self.bind_consumer_identity {
            Some(IdentityRule::new(self.consumer_identity_pattern.as_deref()).map_err(|e| e.to_string())?)
        } else {
            None
        };
        let limits = Limits {
            max_streams: self.max_streams,
            max_streams_per_ip: self.max_streams_per_ip,
            max_request_bytes: self.max_request_bytes,
            unary_timeout: self.unary_timeout,
            keepalive_interval: self.http2_keepalive_interval,
            keepalive_timeout: self.http2_keepalive_timeout,
        };
        limits.validate().map_err(|e| e.to_string())?;
        Ok(ServerOptions { tls, bind_identity, limits })
    }
}
