//! The `serve` flags of security and limits, flattened into [`super::ServeArgs`]:
//! the gRPC server's TLS, identity binding and limits, and TLS and credentials to etcd.
//! See docs/operating.md, "Security" and "Limits".

use std::{path::PathBuf, time::Duration};

use crate::duration::parse_duration;
use crate::server::{
    ServerOptions,
    identity::IdentityRule,
    limits::Limits,
    tls::{ReloadingTls, TlsSettings},
};

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

    /// Open Register streams one client IP address may hold. Behind a sidecar proxy
    /// (Istio, Linkerd) every consumer connects from the proxy's local address: set it to
    /// --max-streams there.
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
        if let Some(settings) = &tls {
            // Unreadable or mismatched files stop the start before anything connects.
            ReloadingTls::load(settings.clone()).map_err(|e| e.to_string())?;
        }
        Ok(ServerOptions { tls, bind_identity, limits })
    }
}

/// TLS and credentials to etcd (the `etcd` backend and `--store etcd`).
#[derive(Clone, Debug, clap::Args)]
pub struct EtcdSecurityArgs {
    /// PEM CA that signed etcd's server certificate (TLS to etcd; endpoints then `https://`).
    #[arg(long, env = "KAFKA_ASSIGNER_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,

    /// PEM client certificate for etcd (`--client-cert-auth`), with --etcd-key.
    #[arg(long, env = "KAFKA_ASSIGNER_ETCD_CERT", requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,

    /// PEM private key of --etcd-cert.
    #[arg(long, env = "KAFKA_ASSIGNER_ETCD_KEY", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,

    /// etcd user (auth enabled); the token is refreshed when etcd expires it.
    #[arg(long, env = "KAFKA_ASSIGNER_ETCD_USERNAME")]
    pub etcd_username: Option<String>,

    /// Password of --etcd-username (prefer --etcd-password-file: flags show in `ps`).
    #[arg(
        long,
        env = "KAFKA_ASSIGNER_ETCD_PASSWORD",
        hide_env_values = true,
        conflicts_with = "etcd_password_file"
    )]
    pub etcd_password: Option<String>,

    /// File holding the password of --etcd-username (one trailing newline is ignored).
    #[arg(long, env = "KAFKA_ASSIGNER_ETCD_PASSWORD_FILE")]
    pub etcd_password_file: Option<PathBuf>,
}

impl EtcdSecurityArgs {
    /// The etcd TLS and credentials these flags ask for (reads --etcd-password-file).
    pub fn security(&self) -> Result<crate::store::EtcdSecurity, String> {
        let password = match (&self.etcd_password, &self.etcd_password_file) {
            (Some(password), _) => Some(password.clone()),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("--etcd-password-file {}: cannot read: {e}", path.display()))?;
                let text = text.strip_suffix('\n').unwrap_or(&text);
                Some(text.strip_suffix('\r').unwrap_or(text).to_string())
            }
            (None, None) => None,
        };
        Ok(crate::store::EtcdSecurity {
            ca: self.etcd_ca.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
            username: self.etcd_username.clone(),
            password,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::config::{Cli, Command, ServeArgs};

    fn serve(args: &[&str]) -> Result<ServeArgs, String> {
        let mut all = vec!["kafka-assigner", "serve"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all).map_err(|e| e.to_string())?.command {
            Command::Serve(args) => Ok(args),
            other => Err(format!("not serve: {other:?}")),
        }
    }

    #[test]
    fn server_security_flags() {
        let plain = serve(&[]).unwrap().security.options().unwrap();
        assert!(plain.tls.is_none() && plain.bind_identity.is_none());
        let args = serve(&[
            "--tls-cert=c.pem",
            "--tls-key=k.pem",
            "--tls-client-ca=ca.pem",
            "--bind-consumer-identity",
            "--consumer-identity-pattern=^spiffe://[^/]+/pod/([^/]+)$",
            "--max-streams=5",
            "--unary-timeout=2s",
        ])
        .unwrap();
        let error = args.security.options().unwrap_err();
        assert!(error.contains("--tls-cert c.pem"), "{error}");
        assert!(args.security.bind_consumer_identity);
        assert_eq!(args.security.max_streams, 5);
        for (bad, flag) in [
            (&["--tls-cert=c.pem"][..], "--tls-key"),
            (&["--bind-consumer-identity"][..], "--tls-client-ca"),
            (&["--max-streams=0"][..], "--max-streams"),
            (&["--unary-timeout=0s"][..], "--unary-timeout"),
        ] {
            let error = match serve(bad).and_then(|a| a.security.options().map(|_| ())) {
                Ok(()) => panic!("{bad:?} was accepted"),
                Err(error) => error,
            };
            assert!(error.contains(flag), "{bad:?}: {error}");
        }
        let args = serve(&[
            "--tls-cert=c.pem",
            "--tls-key=k.pem",
            "--tls-client-ca=ca.pem",
            "--bind-consumer-identity",
            "--consumer-identity-pattern=(",
        ])
        .unwrap();
        assert!(args.security.options().unwrap_err().contains("--consumer-identity-pattern"));
    }

    #[test]
    fn etcd_security_flags() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "s3cret\n").unwrap();
        let file = file.display().to_string();
        let args = serve(&["--etcd-ca=ca.pem", "--etcd-username=u", "--etcd-password-file", &file]).unwrap();
        let security = args.etcd_security.security().unwrap();
        assert_eq!(security.password.as_deref(), Some("s3cret"));
        assert!(security.uses_tls());
        assert!(
            serve(&["--etcd-password=a", "--etcd-password-file=b"]).unwrap_err().contains("--etcd-password")
        );
        assert!(serve(&["--etcd-cert=c.pem"]).unwrap_err().contains("--etcd-key"));
        let missing = serve(&["--etcd-username=u", "--etcd-password-file=/nonexistent"]).unwrap();
        assert!(missing.etcd_security.security().unwrap_err().contains("--etcd-password-file /nonexistent"));
    }
}
