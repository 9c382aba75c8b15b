//! etcd's server errors that only their message tells apart. etcd answers each error as a
//! gRPC status whose code several errors share (`NotFound` is also "member not found";
//! `OutOfRange` is also "future revision"), and which error it was is said only by the
//! message, fixed per error in etcd's `api/v3rpc/rpctypes`. etcd-client exposes no type for
//! them (its error is the bare `tonic::Status`), and etcd's own Go client recognises them the
//! same way, by the exact message. So the comparison is made here, once, against etcd's exact
//! text; the store conformance suite checks it against a real etcd (a keep-alive, revoke or
//! write on a revoked lease, a compaction at an already-compacted revision), and the TLS
//! suite the refused credentials (`tls_etcd`).

use tonic::Code;

/// `rpctypes.ErrGRPCLeaseNotFound`.
const LEASE_NOT_FOUND: &str = "etcdserver: requested lease not found";
/// `rpctypes.ErrGRPCCompacted`.
const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";

/// `rpctypes.ErrGRPCAuthFailed`.
const AUTH_FAILED: &str = "etcdserver: authentication failed, invalid user ID or password";
/// `rpctypes.ErrGRPCAuthNotEnabled`.
const AUTH_NOT_ENABLED: &str = "etcdserver: authentication is not enabled";
/// `rpctypes.ErrGRPCUserEmpty`.
const USER_EMPTY: &str = "etcdserver: user name is empty";
/// `rpctypes.ErrGRPCUserNotFound`.
const USER_NOT_FOUND: &str = "etcdserver: user name not found";
/// `rpctypes.ErrGRPCPermissionDenied`.
const PERMISSION_DENIED: &str = "etcdserver: permission denied";

/// How etcd refused our credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AuthRefusal {
    /// Wrong user name or password.
    Failed,
    /// etcd has authentication disabled, and we sent credentials.
    NotEnabled,
    /// No such user (or none given: with client-certificate auth, the certificate's CN).
    UnknownUser,
    /// The user may not do what was asked.
    PermissionDenied,
}

/// How etcd refused our credentials, if that is what `error` says.
pub(crate) fn auth_refusal(error: &etcd_client::Error) -> Option<AuthRefusal> {
    let refusals = [
        (Code::InvalidArgument, AUTH_FAILED, AuthRefusal::Failed),
        (Code::FailedPrecondition, AUTH_NOT_ENABLED, AuthRefusal::NotEnabled),
        (Code::InvalidArgument, USER_EMPTY, AuthRefusal::UnknownUser),
        (Code::FailedPrecondition, USER_NOT_FOUND, AuthRefusal::UnknownUser),
        (Code::PermissionDenied, PERMISSION_DENIED, AuthRefusal::PermissionDenied),
    ];
    refusals
        .into_iter()
        .find(|(code, message, _)| is_etcd_error(error, *code, message))
        .map(|(_, _, why)| why)
}

/// Whether etcd said the lease named in the request does not exist (expired or revoked).
pub(super) fn is_lease_not_found(error: &etcd_client::Error) -> bool {
    is_etcd_error(error, Code::NotFound, LEASE_NOT_FOUND)
}

/// Whether etcd said the revision asked for is compacted away.
pub(super) fn is_compacted(error: &etcd_client::Error) -> bool {
    is_etcd_error(error, Code::OutOfRange, COMPACTED)
}

/// Whether `error` is etcd's answer `code` with `message`: the one comparison by text.
fn is_etcd_error(error: &etcd_client::Error, code: Code, message: &str) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(status) if status.code() == code && status.message() == message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_and_the_whole_message_must_match() {
        let status = |code, message: &str| etcd_client::Error::GRpcStatus(tonic::Status::new(code, message));
        assert!(is_lease_not_found(&status(Code::NotFound, LEASE_NOT_FOUND)));
        assert!(!is_lease_not_found(&status(Code::NotFound, "etcdserver: member not found")));
        assert!(!is_lease_not_found(&status(Code::Unavailable, LEASE_NOT_FOUND)));
        assert!(is_compacted(&status(Code::OutOfRange, COMPACTED)));
        assert!(!is_compacted(&status(
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision"
        )));
        assert_eq!(auth_refusal(&status(Code::InvalidArgument, AUTH_FAILED)), Some(AuthRefusal::Failed));
        assert_eq!(
            auth_refusal(&status(Code::FailedPrecondition, USER_NOT_FOUND)),
            Some(AuthRefusal::UnknownUser)
        );
        assert_eq!(auth_refusal(&status(Code::InvalidArgument, LEASE_NOT_FOUND)), None);
    }
}
