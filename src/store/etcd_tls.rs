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

use super::etcd::rpctypes::{AuthRefusal, auth_refusal};

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

    /// Turns a failed first contact into a message naming the flag to fix, when the
    /// failure (`failure`: the client's error, if there was one; `reason`: the whole
    /// failure's text, quoted in the message) points at one; `None` when it does not.
    pub fn diagnose(&self, failure: Option<&etcd_client::Error>, reason: &str) -> Option<String> {
        if let Some(problem) = self.client_cert_problem() {
            return Some(format!(
                "--etcd-cert {}: the client certificate is not usable ({problem}, checked against --etcd-ca); etcd's reason: {reason}",
                self.cert.as_ref().map(|p| p.display().to_string()).unwrap_or_default()
            ));
        }
        let flag = self.flag_to_fix(failure?)?;
        Some(format!("{flag}; etcd's reason: {reason}"))
    }

    /// The flag a failure points at, told by its type: rustls' error under the client's,
    /// or etcd's answer ([`auth_refusal`]).
    fn flag_to_fix(&self, failure: &etcd_client::Error) -> Option<&'static str> {
        use rustls::AlertDescription as Alert;
        let tls = tls_error_of(failure).cloned().or_else(|| alert_stringified_by_h2(failure));
        match tls {
            Some(rustls::Error::InvalidCertificate(_)) => {
                return Some(
                    "--etcd-ca: etcd's server certificate is not trusted (wrong CA, or not issued for the endpoint's host)",
                );
            }
            Some(rustls::Error::AlertReceived(
                Alert::BadCertificate
                | Alert::UnknownCA
                | Alert::CertificateExpired
                | Alert::CertificateRequired,
            )) => {
                return Some(
                    "--etcd-cert / --etcd-key: etcd refused our client certificate (expired, not yet valid, or not signed by a CA etcd trusts)",
                );
            }
            Some(rustls::Error::InvalidMessage(_)) => {
                return Some(
                    "--etcd-endpoints: the endpoint does not speak TLS (use http:// and no --etcd-ca, or point at etcd's TLS port)",
                );
            }
            _ => {}
        }
        if let Some(refusal) = auth_refusal(failure) {
            return Some(match refusal {
                AuthRefusal::Failed => "--etcd-username / --etcd-password: etcd refused the credentials",
                AuthRefusal::NotEnabled => {
                    "--etcd-username: etcd has authentication disabled; drop the credentials or enable auth"
                }
                AuthRefusal::UnknownUser => {
                    "--etcd-username: etcd knows no such user (with client-certificate auth, the certificate's CN is the user)"
                }
                AuthRefusal::PermissionDenied => {
                    "--etcd-username: the user lacks read/write permission on --etcd-prefix"
                }
            });
        }
        if self.cert.is_some() && closed_by_peer(failure) {
            // TLS 1.3: etcd checks the client certificate after our side of the handshake
            // is done, and refuses it by closing the connection, with no reason we can see.
            return Some(
                "--etcd-cert / --etcd-key: etcd closed the connection right after the TLS handshake, which is how it refuses a client certificate (not signed by its --trusted-ca-file?)",
            );
        }
        None
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

/// The errors an etcd client's error carries: it has no `source()` of its own, so its
/// variants are opened here.
fn inner_of(failure: &etcd_client::Error) -> Option<&(dyn std::error::Error + 'static)> {
    match failure {
        etcd_client::Error::GRpcStatus(status) => Some(status),
        etcd_client::Error::TransportError(error) => Some(error),
        etcd_client::Error::IoError(error) => Some(error),
        _ => None,
    }
}

/// Every error under `error`, itself first. tonic and hyper report a failed handshake as a
/// `std::io::Error` wrapping rustls' error, and an `io::Error`'s `source()` skips the error
/// it wraps (it returns that error's own source), so each one met is opened with `get_ref()`.
fn causes<'e>(error: &'e (dyn std::error::Error + 'static)) -> Vec<&'e (dyn std::error::Error + 'static)> {
    let mut found = Vec::new();
    let mut next = Some(error);
    while let Some(current) = next {
        found.push(current);
        if let Some(wrapped) = current.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref) {
            found.extend(causes(wrapped));
        }
        next = current.source();
    }
    found
}

/// The TLS error under an etcd client's error, if there is one.
pub fn tls_error_of(failure: &etcd_client::Error) -> Option<&rustls::Error> {
    causes(inner_of(failure)?).into_iter().find_map(|cause| cause.downcast_ref::<rustls::Error>())
}

/// The alert etcd sent once the HTTP/2 connection was up, which is when a TLS 1.3 server
/// refuses a client certificate. h2 keeps only the kind and the text of an I/O error
/// (`proto::Error::Io(kind, Option<String>)`), so rustls' typed error does not survive it:
/// this is the one place the text is compared, and only with rustls' own rendering of each
/// alert that refuses a client certificate.
fn alert_stringified_by_h2(failure: &etcd_client::Error) -> Option<rustls::Error> {
    use rustls::AlertDescription as Alert;
    let refusals =
        [Alert::BadCertificate, Alert::UnknownCA, Alert::CertificateExpired, Alert::CertificateRequired]
            .map(rustls::Error::AlertReceived);
    causes(inner_of(failure)?).into_iter().find_map(|cause| {
        let io = cause
            .downcast_ref::<std::io::Error>()
            .filter(|io| io.kind() == std::io::ErrorKind::InvalidData)?;
        let text = io.get_ref()?.to_string();
        refusals.iter().find(|alert| alert.to_string() == text).cloned()
    })
}

/// Whether the peer closed or reset the connection under the call.
fn closed_by_peer(failure: &etcd_client::Error) -> bool {
    use std::io::ErrorKind;
    let Some(inner) = inner_of(failure) else { return false };
    causes(inner).into_iter().any(|cause| {
        let io_closed = cause.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
                    | ErrorKind::UnexpectedEof
            )
        });
        let hyper_closed = cause
            .downcast_ref::<hyper::Error>()
            .is_some_and(|hyper| hyper.is_closed() || hyper.is_canceled() || hyper.is_incomplete_message());
        io_closed || hyper_closed
    })
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

    /// An etcd client error as tonic reports a failed handshake: an I/O error carrying
    /// rustls' error.
    fn handshake_failed(tls: rustls::Error) -> etcd_client::Error {
        etcd_client::Error::IoError(std::io::Error::new(std::io::ErrorKind::InvalidData, tls))
    }

    #[test]
    fn a_tls_error_is_found_inside_the_io_errors_that_carry_it() {
        let refused = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        assert_eq!(tls_error_of(&handshake_failed(refused.clone())), Some(&refused));
        // Nested once more, as hyper's connector boxes the I/O error of its TLS stream.
        let twice =
            std::io::Error::other(std::io::Error::new(std::io::ErrorKind::InvalidData, refused.clone()));
        assert_eq!(tls_error_of(&etcd_client::Error::IoError(twice)), Some(&refused));
        let plain = etcd_client::Error::IoError(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(tls_error_of(&plain), None);
        let status = etcd_client::Error::GRpcStatus(tonic::Status::unavailable("no leader"));
        assert_eq!(tls_error_of(&status), None);
    }

    #[test]
    fn diagnosis_names_the_flag_by_the_failures_type() {
        let security = EtcdSecurity::default();
        let auth_failed = etcd_client::Error::GRpcStatus(tonic::Status::invalid_argument(
            "etcdserver: authentication failed, invalid user ID or password",
        ));
        let cases = [
            (
                handshake_failed(rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)),
                "--etcd-ca",
            ),
            (
                handshake_failed(rustls::Error::AlertReceived(rustls::AlertDescription::BadCertificate)),
                "--etcd-cert",
            ),
            (auth_failed, "--etcd-password"),
        ];
        for (failure, flag) in cases {
            let reason = error_chain(&failure);
            let message = security.diagnose(Some(&failure), &reason).unwrap_or_default();
            assert!(message.contains(flag) && message.contains(&reason), "{message}");
        }
        // The text alone decides nothing.
        assert_eq!(security.diagnose(None, "invalid peer certificate: UnknownIssuer"), None);
        let refused =
            etcd_client::Error::IoError(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(security.diagnose(Some(&refused), "connection refused"), None);
        // An alert h2 passed on as text only, as a TLS 1.3 etcd refusing our certificate.
        let h2_io =
            std::io::Error::new(std::io::ErrorKind::InvalidData, "received fatal alert: BadCertificate");
        let message = security.diagnose(Some(&etcd_client::Error::IoError(h2_io)), "r").unwrap_or_default();
        assert!(message.contains("--etcd-cert"), "{message}");
        let h2_io = std::io::Error::new(std::io::ErrorKind::InvalidData, "received fatal alert: DecodeError");
        assert_eq!(security.diagnose(Some(&etcd_client::Error::IoError(h2_io)), "r"), None);
        // A closed connection points at the client certificate only when one is sent.
        let reset = etcd_client::Error::IoError(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(security.diagnose(Some(&reset), "reset"), None);
        let with_cert = EtcdSecurity { cert: Some("c.pem".into()), key: Some("k.pem".into()), ..security };
        let message = with_cert.diagnose(Some(&reset), "reset").unwrap_or_default();
        assert!(message.contains("--etcd-cert"), "{message}");
    }
}
