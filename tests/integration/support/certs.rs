//! Certificates generated for one test (rcgen): a CA, server certificates for the loopback
//! address, and client certificates naming a consumer (DNS or URI SAN) or an etcd user (CN).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use tempfile::TempDir;
use time::{Duration, OffsetDateTime};

/// A PEM certificate and its PEM private key.
#[derive(Clone, Debug)]
pub struct Pem {
    /// The certificate.
    pub cert: String,
    /// Its key.
    pub key: String,
}

impl Pem {
    /// Writes `{name}.crt` and `{name}.key` into `dir`; returns both paths.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        write_atomically(&cert, &self.cert);
        write_atomically(&key, &self.key);
        (cert, key)
    }
}

/// Replaces `path` with `text` in one rename, as cert-manager's atomic writer does.
pub fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("rename to {}: {e}", path.display()));
}

/// A certificate authority for one test, with a temp dir for the files.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// Where the test's PEM files go.
    pub dir: TempDir,
}

/// What a leaf certificate is for.
#[derive(Clone, Debug)]
pub enum Leaf<'a> {
    /// A server on 127.0.0.1 / localhost (also usable as a client: etcd's own gateway).
    Server,
    /// A client whose certificate has this DNS SAN.
    ClientDns(&'a str),
    /// A client whose certificate has this URI SAN (e.g. a SPIFFE ID).
    ClientUri(&'a str),
    /// A client with only a subject CN (etcd client-certificate auth: the CN is the user).
    ClientCn(&'a str),
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("CA key: {e}"));
        let issuer = CertifiedIssuer::self_signed(params, key).unwrap_or_else(|e| panic!("CA cert: {e}"));
        let dir = tempfile::Builder::new()
            .prefix("kat-certs-")
            .tempdir()
            .unwrap_or_else(|e| panic!("temp dir: {e}"));
        TestCa { issuer, dir }
    }

    /// The CA certificate (PEM).
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// Writes the CA certificate as `{name}.crt`; returns its path.
    pub fn write_ca(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join(format!("{name}.crt"));
        write_atomically(&path, &self.cert_pem());
        path
    }

    /// A leaf certificate valid from an hour ago for a day.
    pub fn issue(&self, leaf: Leaf<'_>) -> Pem {
        let now = OffsetDateTime::now_utc();
        self.issue_valid(leaf, now - Duration::hours(1), now + Duration::days(1))
    }

    /// A leaf certificate that expired an hour ago.
    pub fn issue_expired(&self, leaf: Leaf<'_>) -> Pem {
        let now = OffsetDateTime::now_utc();
        self.issue_valid(leaf, now - Duration::days(2), now - Duration::hours(1))
    }

    fn issue_valid(&self, leaf: Leaf<'_>, not_before: OffsetDateTime, not_after: OffsetDateTime) -> Pem {
        let mut params = CertificateParams::default();
        params.not_before = not_before;
        params.not_after = not_after;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        let ia5 = |s: &str| s.to_string().try_into().unwrap_or_else(|e| panic!("SAN {s}: {e}"));
        match leaf {
            Leaf::Server => {
                params.distinguished_name = dn("localhost");
                params.subject_alt_names =
                    vec![SanType::DnsName(ia5("localhost")), SanType::IpAddress([127, 0, 0, 1].into())];
                params.extended_key_usages =
                    vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
            }
            Leaf::ClientDns(name) => {
                params.distinguished_name = dn(name);
                params.subject_alt_names = vec![SanType::DnsName(ia5(name))];
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            }
            Leaf::ClientUri(uri) => {
                params.distinguished_name = dn("workload");
                params.subject_alt_names = vec![SanType::URI(ia5(uri))];
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            }
            Leaf::ClientCn(cn) => {
                params.distinguished_name = dn(cn);
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            }
        }
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("leaf key: {e}"));
        let cert = params.signed_by(&key, &self.issuer).unwrap_or_else(|e| panic!("leaf cert: {e}"));
        Pem { cert: cert.pem(), key: key.serialize_pem() }
    }
}

fn dn(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}
