//! TLS and authentication to etcd: the settings behind `--etcd-ca`, `--etcd-cert`,
//! `--etcd-key`, `--etcd-username` and `--etcd-password[-file]`, and the diagnosis of a
//! failed start, so the message names the flag to fix and carries etcd's own reason.
//!
//! * The PEM files are read once, when the store connects (a client certificate rotated
//!   later is used from the next restart on).
//! * With a user name, etcd-client authenticates while connecting and **refreshes the token
//!   when etcd reports it expired** (`with_auto_token_refresh`): etcd's simple tokens expire
//!   after `--auth-token-ttl` (300 s by default) of disuse, and a lease keep-alive or a new
//!   watch made after that would otherwise fail with `invalid auth token`.

use std::{fmt, path::PathBuf};

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use rustls_pki_types::{CertificateDer, UnixTime, pem::PemObject};

/// How to authenticate to etcd. `Debug` never shows the password.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EtcdSecurity {
    /// PEM file of the CA that signed etcd's server certificate (`--etcd-ca`).
    pub ca: Option<PathBuf>,
    /// PEM client certificate (`--etcd-cert`), with `key`.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert` (`--etcd-key`).
    pub key: Option<PathBuf>,
    /// etcd user (`--etcd-username`).
    pub username: Option<String>,
    /// Its password (`--etcd-password` or the contents of `--etcd-password-file`).
    pub password: Option<String>,
}

impl fmt::Debug for EtcdSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdSecurity")
            .field("ca", &self.ca)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// A setting that cannot be used; the message names the flag.
#[derive(Debug, thiserror::Error)]
pub enum EtcdSecurityError {
    /// A file could not be read.
    #[error("{flag} {path}: cannot read: {source}")]
    Read {
        /// The flag.
        flag: &'static str,
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Settings that only work together.
    #[error("{0}")]
    Incomplete(String),
}

impl EtcdSecurity {
    /// Whether TLS is configured (the endpoints then default to `https://`).
    pub fn uses_tls(&self) -> bool {
        self.ca.is_some() || self.cert.is_some()
    }

    /// Adds TLS and credentials to `options`, reading the PEM files now.
    pub fn apply(&self, mut options: ConnectOptions) -> Result<ConnectOptions, EtcdSecurityError> {
        if self.cert.is_some() != self.key.is_some() {
            return Err(EtcdSecurityError::Incomplete(
                "--etcd-cert and --etcd-key go together: give both or neither".into(),
            ));
        }
        if self.username.is_some() != self.password.is_some() {
            return Err(EtcdSecurityError::Incomplete(
                "--etcd-username needs --etcd-password or --etcd-password-file (and the other way round)"
                    .into(),
            ));
        }
        if self.uses_tls() {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &self.ca {
                tls = tls.ca_certificate(Certificate::from_pem(read("--etcd-ca", ca)?));
            }
            if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
                tls = tls.identity(Identity::from_pem(read("--etcd-cert", cert)?, read("--etcd-key", key)?));
            }
            options = options.with_tls(tls);
        }
        if let (Some(user), Some(password)) = (&self.username, &self.password) {
            options = options.with_user(user.clone(), password.clone()).with_auto_token_refresh(true);
        }
        Ok(options)
    }

    /// Turns a failed first contact into a message naming the flag to fix, when the reason
    /// (the whole error chain, `reason`) points at one; `None` when it does not.
    pub fn diagnose(&self, reason: &str) -> Option<String> {
        let has = |needle: &str| reason.to_ascii_lowercase().contains(&needle.to_ascii_lowercase());
        if let Some(problem) = self.client_cert_problem() {
            return Some(format!(
                "--etcd-cert {}: the client certificate is not usable ({problem}, checked against --etcd-ca); etcd's reason: {reason}",
                self.cert.as_ref().map(|p| p.display().to_string()).unwrap_or_default()
            ));
        }
        let flag = if has("UnknownIssuer") || has("invalid peer certificate") || has("NotValidForName") {
            "--etcd-ca: etcd's server certificate is not trusted (wrong CA, or not issued for the endpoint's host)"
        } else if has("CertificateExpired")
            || has("BadCertificate")
            || has("UnknownCA")
            || has("certificate required")
        {
            "--etcd-cert / --etcd-key: etcd refused our client certificate (expired, not yet valid, or not signed by a CA etcd trusts)"
        } else if has("authentication failed") || has("invalid user ID or password") {
            "--etcd-username / --etcd-password: etcd refused the credentials"
        } else if has("authentication is not enabled") {
            "--etcd-username: etcd has authentication disabled; drop the credentials or enable auth"
        } else if has("user name is empty") || has("user name not found") {
            "--etcd-username: etcd knows no such user (with client-certificate auth, the certificate's CN is the user)"
        } else if has("permission denied") {
            "--etcd-username: the user lacks read/write permission on --etcd-prefix"
        } else if has("InvalidContentType")
            || has("corrupt message")
            || (has("http2 error") && self.uses_tls())
        {
            "--etcd-endpoints: the endpoint does not speak TLS (use http:// and no --etcd-ca, or point at etcd's TLS port)"
        } else if self.cert.is_some()
            && (has("connection closed") || has("Canceled") || has("reset by peer") || has("broken pipe"))
        {
            // TLS 1.3: etcd checks the client certificate after our side of the handshake
            // is done, and refuses it by closing the connection, with no reason we can see.
            "--etcd-cert / --etcd-key: etcd closed the connection right after the TLS handshake, which is how it refuses a client certificate (not signed by its --trusted-ca-file?)"
        } else {
            return None;
        };
        Some(format!("{flag}; etcd's reason: {reason}"))
    }
}

impl EtcdSecurity {
    /// Verifies `--etcd-cert` against `--etcd-ca` here (when both are set), for the reason
    /// etcd does not give: an expired or not-yet-valid certificate. A certificate from
    /// another CA is not judged (etcd may trust a different CA for clients).
    pub fn client_cert_problem(&self) -> Option<String> {
        let (ca, cert) = (self.ca.as_ref()?, self.cert.as_ref()?);
        let ca_pem = std::fs::read(ca).ok()?;
        let roots: Vec<CertificateDer<'_>> =
            CertificateDer::pem_slice_iter(&ca_pem).filter_map(Result::ok).collect();
        let anchors: Vec<_> = roots.iter().filter_map(|c| webpki::anchor_from_trusted_cert(c).ok()).collect();
        let cert_pem = std::fs::read(cert).ok()?;
        let chain: Vec<CertificateDer<'_>> =
            CertificateDer::pem_slice_iter(&cert_pem).filter_map(Result::ok).collect();
        let (leaf, intermediates) = chain.split_first()?;
        let leaf = webpki::EndEntityCert::try_from(leaf).ok()?;
        let algorithms = rustls::crypto::ring::default_provider().signature_verification_algorithms.all;
        let usage = webpki::KeyUsage::client_auth();
        match leaf.verify_for_usage(algorithms, &anchors, intermediates, UnixTime::now(), usage, None, None) {
            Ok(_) | Err(webpki::Error::UnknownIssuer) => None,
            Err(error) => Some(format!("{error:?}")),
        }
    }
}

fn read(flag: &'static str, path: &PathBuf) -> Result<Vec<u8>, EtcdSecurityError> {
    std::fs::read(path).map_err(|source| EtcdSecurityError::Read {
        flag,
        path: path.display().to_string(),
        source,
    })
}

/// The TLS error under an etcd client's error, if there is one: the client's error has no
/// `source()` of its own, so its variants are opened here.
pub fn tls_error_of(error: &etcd_client::Error) -> Option<&rustls::Error> {
    let inner: &(dyn std::error::Error + 'static) = match error {
        etcd_client::Error::GRpcStatus(status) => status,
        etcd_client::Error::TransportError(error) => error,
        etcd_client::Error::IoError(error) => error,
        _ => return None,
    };
    tls_error(inner)
}

/// The TLS error somewhere under `error`, if there is one. tonic and hyper report a failed
/// handshake as a `std::io::Error` wrapping rustls' error, and an `io::Error`'s `source()`
/// skips the error it wraps (it returns that error's own source), so each one met on the
/// chain is opened with `get_ref()`.
pub fn tls_error<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e rustls::Error> {
    let mut next = Some(error);
    while let Some(current) = next {
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        let wrapped = current.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref);
        if let Some(tls) = wrapped.and_then(|inner| tls_error(inner)) {
            return Some(tls);
        }
        next = current.source();
    }
    None
}

/// An error with all its sources (`a: b: c`): tonic's transport errors say only
/// "transport error" at the top, and the reason (an unknown issuer, a TLS alert) is deep.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let next = cause.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_is_redacted_and_pairs_are_checked() {
        let security = EtcdSecurity {
            username: Some("u".into()),
            password: Some("hunter2".into()),
            ..EtcdSecurity::default()
        };
        assert!(!format!("{security:?}").contains("hunter2"));
        let half = EtcdSecurity { cert: Some("c.pem".into()), ..EtcdSecurity::default() };
        let error = half.apply(ConnectOptions::new()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("--etcd-key"), "{error}");
        let missing = EtcdSecurity { ca: Some("/nonexistent/ca.pem".into()), ..EtcdSecurity::default() };
        let error = missing.apply(ConnectOptions::new()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("--etcd-ca /nonexistent/ca.pem: cannot read"), "{error}");
    }

    #[test]
    fn a_tls_error_is_found_inside_the_io_errors_that_carry_it() {
        let refused = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, refused.clone());
        let error = etcd_client::Error::IoError(io);
        assert_eq!(tls_error_of(&error), Some(&refused));
        // Nested once more, as hyper's connector boxes the I/O error of its TLS stream.
        let outer =
            std::io::Error::other(std::io::Error::new(std::io::ErrorKind::InvalidData, refused.clone()));
        assert_eq!(tls_error(&outer), Some(&refused));
        let plain = etcd_client::Error::IoError(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(tls_error_of(&plain), None);
        let status = etcd_client::Error::GRpcStatus(tonic::Status::unavailable("no leader"));
        assert_eq!(tls_error_of(&status), None);
    }

    #[test]
    fn diagnosis_names_the_flag() {
        let security = EtcdSecurity::default();
        let cases = [
            ("invalid peer certificate: UnknownIssuer", "--etcd-ca"),
            ("received fatal alert: BadCertificate", "--etcd-cert"),
            ("etcdserver: authentication failed, invalid user ID or password", "--etcd-password"),
        ];
        for (reason, flag) in cases {
            let message = security.diagnose(reason).unwrap_or_default();
            assert!(message.contains(flag) && message.contains(reason), "{message}");
        }
        assert_eq!(security.diagnose("connection refused"), None);
    }
}
