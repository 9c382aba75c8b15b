//! The detailed causes inside [`StoreError::Unavailable`](super::StoreError::Unavailable)
//! and [`StoreError::Invalid`](super::StoreError::Invalid): which failure it was, with the
//! library's error as the `source` where one exists. Messages are built from the fields;
//! library errors that are not `Clone` are shared behind an `Arc` (a [`StoreError`] is
//! handed to every waiter of a call).
//!
//! [`StoreError`]: super::StoreError

use std::{sync::Arc, time::Duration};

use super::Revision;
use super::etcd_tls::{EtcdSecurityError, error_chain};

/// Why the store could not be reached.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Unreachable {
    /// A call got no usable answer within its budget, retries included.
    #[error(
        "{what}: no answer from etcd at {endpoints} within {budget:?} ({attempts} attempt(s); last error: {last})"
    )]
    OutOfTime {
        /// The call (`txn`, `lease grant`, ...).
        what: &'static str,
        /// Every endpoint, comma-separated.
        endpoints: String,
        /// The call's budget.
        budget: Duration,
        /// How many attempts were made.
        attempts: u32,
        /// How the last attempt failed.
        #[source]
        last: AttemptFailure,
    },
    /// The client failed the call in a way that is not etcd refusing it (a broken
    /// connection after the retries, an internal client error).
    #[error("etcd at {endpoints}: {source}")]
    Client {
        /// Every endpoint, comma-separated.
        endpoints: String,
        /// The client's error.
        #[source]
        source: Arc<etcd_client::Error>,
    },
    /// No client could be made for the endpoints.
    #[error("etcd at {endpoints:?}: {}", error_chain(.source.as_ref()))]
    Connect {
        /// The endpoints.
        endpoints: Vec<String>,
        /// The client's error.
        #[source]
        source: Arc<etcd_client::Error>,
    },
    /// No client could be made for the endpoints in time.
    #[error("etcd at {endpoints:?}: no connection within {within:?}")]
    ConnectTimeout {
        /// The endpoints.
        endpoints: Vec<String>,
        /// The bound.
        within: Duration,
    },
    /// etcd answered a lease grant with an error of its own. The text is etcd's (the
    /// answer's `error` field, a string on the wire); nothing branches on it.
    #[error("etcd lease grant: {reason}")]
    LeaseGrant {
        /// etcd's text.
        reason: String,
    },
    /// A watch stream broke or went quiet.
    #[error(transparent)]
    Watch(#[from] WatchBroke),
    /// The instance's loop stopped before the call reached it, or before it answered.
    #[error("this assigner instance is stopping")]
    Stopping,
    /// The instance has not read its store's prefix yet (it has just started, or its first
    /// read failed): it cannot decide anything on an empty cache.
    #[error("this assigner instance has not read its store yet")]
    NotLoaded,
    /// A request's answer did not arrive within its deadline (the state machine's own
    /// timer): it may or may not have taken effect, and a later answer to it is ignored.
    #[error("no answer within {within:?}")]
    NoAnswer {
        /// The deadline.
        within: Duration,
    },
    /// A fault injected by `FaultyStore` (tests).
    #[error(transparent)]
    Injected(#[from] InjectedFault),
}

/// How one attempt of an etcd call failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum AttemptFailure {
    /// The client or etcd answered with a retryable error (no leader, a dead member, a
    /// broken connection).
    #[error("{endpoint}: {}", error_chain(.source.as_ref()))]
    Failed {
        /// The endpoint tried.
        endpoint: String,
        /// The error.
        #[source]
        source: Arc<etcd_client::Error>,
    },
    /// No answer came within the attempt's bound.
    #[error("{endpoint}: no answer within {within:?}")]
    NoAnswer {
        /// The endpoint tried.
        endpoint: String,
        /// The attempt's bound.
        within: Duration,
    },
}

/// How an etcd watch stream ended without etcd refusing it.
#[derive(Clone, Debug, thiserror::Error)]
pub enum WatchBroke {
    /// etcd cancelled the watch. The reason is etcd's text (the response's
    /// `cancel_reason`, a string on the wire); nothing branches on it.
    #[error("etcd at {endpoints} cancelled the watch: {reason}")]
    Cancelled {
        /// Every endpoint, comma-separated.
        endpoints: String,
        /// etcd's text.
        reason: String,
    },
    /// The stream ended right after it was created.
    #[error("etcd at {endpoints}: watch stream ended at once")]
    EndedAtOnce {
        /// Every endpoint, comma-separated.
        endpoints: String,
    },
    /// The stream ended.
    #[error("etcd at {endpoints}: watch stream ended")]
    Ended {
        /// Every endpoint, comma-separated.
        endpoints: String,
    },
    /// Asking for a progress mark failed.
    #[error("etcd at {endpoints}: watch progress request failed: {source}")]
    ProgressRequest {
        /// Every endpoint, comma-separated.
        endpoints: String,
        /// The client's error.
        #[source]
        source: Arc<etcd_client::Error>,
    },
    /// A quiet watch did not answer a progress request in time.
    #[error(
        "etcd at {endpoints}: the watch went quiet and a progress request got no answer within {within:?}"
    )]
    Quiet {
        /// Every endpoint, comma-separated.
        endpoints: String,
        /// How long the answer was waited for.
        within: Duration,
    },
    /// The stream failed.
    #[error("etcd at {endpoints}: watch stream broke: {source}")]
    Broke {
        /// Every endpoint, comma-separated.
        endpoints: String,
        /// The client's error.
        #[source]
        source: Arc<etcd_client::Error>,
    },
}

/// A fault `FaultyStore` injected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InjectedFault {
    /// The store is cut off: the call was refused.
    #[error("{what}: cut off from the store (injected fault)")]
    CutOff {
        /// The call.
        what: &'static str,
    },
    /// The call was applied, but the connection reset after a stall lost its answer.
    #[error("{what}: the connection reset after a stall; the answer was lost (injected fault)")]
    ResetAfterStall {
        /// The call.
        what: &'static str,
    },
    /// The call was applied, but its answer was lost.
    #[error("{what}: the answer was lost (injected fault)")]
    AnswerLost {
        /// The call.
        what: &'static str,
    },
    /// A watch was cut.
    #[error("watch: cut off from the store (injected fault)")]
    WatchCut,
}

/// Why a request or a record is not acceptable.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Malformed {
    /// A record is not the JSON it should be.
    #[error("{key}: {source}")]
    Undecodable {
        /// The record's key.
        key: String,
        /// The decoder's error.
        #[source]
        source: Arc<serde_json::Error>,
    },
    /// A record was written by a newer release.
    #[error("{key}: record version {version} is newer than this release ({supported})")]
    NewerRecord {
        /// The record's key.
        key: String,
        /// Its version.
        version: u32,
        /// The newest version this release reads.
        supported: u32,
    },
    /// A key is not UTF-8 (shown lossily).
    #[error("etcd key is not UTF-8: {key:?}")]
    KeyNotUtf8 {
        /// The key, with invalid bytes replaced.
        key: String,
    },
    /// A watch event came without its record.
    #[error("etcd watch event without a key")]
    EventWithoutKey,
    /// A transaction writes an empty key.
    #[error("empty key in transaction")]
    EmptyKey,
    /// A transaction writes one key twice.
    #[error("key {key:?} written twice in one transaction")]
    KeyWrittenTwice {
        /// The key.
        key: String,
    },
    /// A transaction compares an empty key.
    #[error("empty key in transaction compare")]
    EmptyCompareKey,
    /// A session was asked for with no TTL.
    #[error("session TTL must be positive")]
    ZeroTtl,
    /// An answer came back for a request of another kind than the one it names (a driver
    /// that mixed up its request ids).
    #[error("the store answered another kind of request")]
    WrongAnswerKind,
    /// A compaction was asked for past the current revision.
    #[error("cannot compact at revision {revision}: the current revision is {current}")]
    CompactInFuture {
        /// The revision asked for.
        revision: Revision,
        /// The store's revision.
        current: Revision,
    },
    /// The client refused to start for the endpoints (not a failure worth retrying).
    #[error("etcd at {endpoints:?}: {}", error_chain(.source.as_ref()))]
    Connect {
        /// The endpoints.
        endpoints: Vec<String>,
        /// The client's error.
        #[source]
        source: Arc<etcd_client::Error>,
    },
    /// The store was configured without endpoints.
    #[error("no etcd endpoints given")]
    NoEndpoints,
    /// The TLS or credential settings cannot be used.
    #[error(transparent)]
    Security(Arc<EtcdSecurityError>),
    /// etcd refused the request as malformed (`InvalidArgument`, `OutOfRange`,
    /// `FailedPrecondition`).
    #[error("etcd refused the request: {}", grpc_message(.0.as_ref()))]
    Refused(#[source] Arc<etcd_client::Error>),
    /// The client refused the request before sending it (a bad argument or URI).
    #[error(transparent)]
    Client(Arc<etcd_client::Error>),
    /// The first contact failed in a way that points at a TLS or credentials flag.
    /// `diagnosis` is free text naming the flag and quoting etcd's reason (nothing
    /// branches on it); `cause` is the failure itself.
    #[error("{diagnosis}")]
    Misconfigured {
        /// The message naming the flag.
        diagnosis: String,
        /// The failure that was diagnosed.
        #[source]
        cause: Box<super::StoreError>,
    },
}

/// The status message of a gRPC answer, or the whole error.
fn grpc_message(error: &etcd_client::Error) -> String {
    match error {
        etcd_client::Error::GRpcStatus(status) => status.message().to_string(),
        other => other.to_string(),
    }
}
