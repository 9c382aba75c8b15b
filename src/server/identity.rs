//! `--bind-consumer-identity`: under mTLS, the only consumer name a connection may use is
//! the one its client certificate names.
//!
//! **Which name.** The certificate's URI SANs first (a SPIFFE ID such as
//! `spiffe://cluster.local/ns/kafka/sa/ingest/pod/ingest-3` is what a service mesh or
//! cert-manager's CSI driver issues per workload), then its DNS SANs. The subject CN is
//! **not** used: RFC 6125 deprecates it for naming, verifiers ignore it, and a CA may put
//! anything there. SANs are what the TLS verification actually checked the CA signed.
//!
//! **Mapping.** Without `--consumer-identity-pattern`, the identity is the first URI SAN,
//! or else the first DNS SAN, verbatim. With a pattern (a regex), the identity is capture
//! group 1 (or the whole match) of the first SAN, in the same order, that the pattern
//! matches, e.g. `^spiffe://[^/]+/ns/[^/]+/pod/([^/]+)$` turns a SPIFFE ID into the pod
//! name, `^([^.]+)\.consumers\.svc$` a DNS name into its first label.

use regex::Regex;
use tonic::Status;

use super::tls::{ConnInfo, PeerNames};

/// Errors building the rule.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The pattern is not a regex.
    #[error("--consumer-identity-pattern: {0}")]
    Pattern(#[from] regex::Error),
}

/// How a client certificate maps to a consumer name.
#[derive(Clone, Debug, Default)]
pub struct IdentityRule {
    pattern: Option<Regex>,
}

impl IdentityRule {
    /// The rule with an optional mapping pattern.
    pub fn new(pattern: Option<&str>) -> Result<Self, IdentityError> {
        Ok(Self { pattern: pattern.map(Regex::new).transpose()? })
    }

    /// The consumer name `peer` stands for, or `None` when its certificate names none.
    pub fn identity(&self, peer: &PeerNames) -> Option<String> {
        let mut names = peer.uris.iter().chain(peer.dns.iter());
        match &self.pattern {
            None => names.next().cloned(),
            Some(pattern) => names.find_map(|name| {
                let captures = pattern.captures(name)?;
                captures.get(1).or_else(|| captures.get(0)).map(|m| m.as_str().to_string())
            }),
        }
    }

    /// `Ok` when the connection `info` may act as consumer `claimed`; otherwise
    /// `PERMISSION_DENIED` naming both identities.
    pub fn check(&self, info: Option<&ConnInfo>, claimed: &str, rpc: &str) -> Result<(), Status> {
        let Some(peer) = info.and_then(|i| i.peer.as_ref()) else {
            return Err(Status::permission_denied(format!(
                "{rpc}: consumer identity is bound to the client certificate, and this connection presented none"
            )));
        };
        match self.identity(peer) {
            Some(identity) if identity == claimed => Ok(()),
            Some(identity) => Err(Status::permission_denied(format!(
                "{rpc}: this connection's client certificate identifies consumer '{identity}', \
                 but the request names consumer '{claimed}'"
            ))),
            None => Err(Status::permission_denied(format!(
                "{rpc}: the client certificate names no consumer (URI SANs {:?}, DNS SANs {:?}{}), \
                 so it may not act as consumer '{claimed}'",
                peer.uris,
                peer.dns,
                self.pattern.as_ref().map(|p| format!(", pattern {p}")).unwrap_or_default()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uris: &[&str], dns: &[&str]) -> PeerNames {
        PeerNames {
            uris: uris.iter().map(|s| s.to_string()).collect(),
            dns: dns.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn uri_before_dns_and_mapping() {
        let plain = IdentityRule::new(None).unwrap();
        assert_eq!(
            plain.identity(&peer(&["spiffe://td/pod/a"], &["b"])).as_deref(),
            Some("spiffe://td/pod/a")
        );
        assert_eq!(plain.identity(&peer(&[], &["b", "c"])).as_deref(), Some("b"));
        assert_eq!(plain.identity(&peer(&[], &[])), None);
        let spiffe = IdentityRule::new(Some("^spiffe://[^/]+/ns/[^/]+/pod/([^/]+)$")).unwrap();
        let p = peer(&["spiffe://cluster.local/ns/kafka/pod/ingest-3"], &["x"]);
        assert_eq!(spiffe.identity(&p).as_deref(), Some("ingest-3"));
        assert_eq!(spiffe.identity(&peer(&[], &["x"])), None);
        assert!(IdentityRule::new(Some("(")).is_err());
    }

    #[test]
    fn check_names_both_identities() {
        let rule = IdentityRule::new(None).unwrap();
        let info = ConnInfo { remote_addr: ([127, 0, 0, 1], 1).into(), peer: Some(peer(&[], &["pod-a"])) };
        assert!(rule.check(Some(&info), "pod-a", "Register").is_ok());
        let denied = rule.check(Some(&info), "pod-b", "Register").unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert!(denied.message().contains("'pod-a'") && denied.message().contains("'pod-b'"));
        let none = ConnInfo { peer: None, ..info };
        assert_eq!(
            rule.check(Some(&none), "pod-a", "Deregister").unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
    }
}
