//! etcd's server errors that only their message tells apart. etcd answers each error as a
//! gRPC status whose code several errors share (`NotFound` is also "member not found";
//! `OutOfRange` is also "future revision"), and which error it was is said only by the
//! message, fixed per error in etcd's `api/v3rpc/rpctypes`. etcd-client exposes no type for
//! them (its error is the bare `tonic::Status`), and etcd's own Go client recognises them the
//! same way, by the exact message. So the comparison is made here, once, against etcd's exact
//! text; the store conformance suite checks it against a real etcd (a keep-alive, revoke or
//! write on a revoked lease, a compaction at an already-compacted revision).

use tonic::Code;

/// `rpctypes.ErrGRPCLeaseNotFound`.
const LEASE_NOT_FOUND: &str = "etcdserver: requested lease not found";
/// `rpctypes.ErrGRPCCompacted`.
const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";

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
    }
}
