//! The storage contract the coordinators need, and its two implementations.
//!
//! [`LeaseStore`] is deliberately small and shaped like etcd's v3 API, because etcd is the
//! production store: sessions with a TTL (etcd leases), records that may be bound to a
//! session (they vanish when it expires or is revoked), compare-and-swap transactions,
//! prefix reads that report the store revision, and prefix watches from a revision.
//!
//! * [`MemoryStore`] keeps everything in process (demos, tests, single-node use). Its
//!   session expiry runs on tokio time, so tests with paused time drive it.
//! * [`EtcdStore`] talks to a real etcd cluster.
//! * [`StoreModel`] is the same semantics as a plain value with time as an input, for the
//!   deterministic whole-cluster simulation (`crate::sim`).
//! * [`FaultyStore`] wraps either to inject faults (lost answers, delays, cut-offs, session
//!   expiry): a test tool for simulations and fault tests, never used by the service.
//!
//! Both pass the same conformance suite (`tests/integration/store_conformance.rs`), which is
//! what makes the memory store trustworthy rather than a mock.

mod causes;
mod etcd;
pub mod etcd_tls;
mod faulty;
mod memory;
mod metered;
mod model;

pub use causes::{AttemptFailure, InjectedFault, Malformed, Unreachable, WatchBroke};
pub use etcd::{DEFAULT_REQUEST_TIMEOUT, EtcdStore, EtcdStoreConfig};
pub use etcd_tls::EtcdSecurity;
pub use faulty::{AfterStall, FaultStats, FaultyStore, Stall, WrittenTxn};
pub use memory::MemoryStore;
pub use metered::MeteredStore;
pub use model::{StoreModel, WatchCursor};

use std::{fmt, sync::Arc, time::Duration};

use async_trait::async_trait;
use futures::stream::BoxStream;

/// A store revision: increases by one with every successful write (etcd semantics).
pub type Revision = i64;

/// A session (an etcd lease): it lives while it is kept alive and expires after its TTL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub i64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

/// One stored record, with the revisions etcd keeps for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    /// The full key.
    pub key: String,
    /// The value bytes.
    pub value: Vec<u8>,
    /// Revision of the write that created this key (since it last did not exist).
    pub create_revision: Revision,
    /// Revision of the last write to this key.
    pub mod_revision: Revision,
    /// The session the record is bound to, if any.
    pub session: Option<SessionId>,
}

/// The records under a prefix, read at one revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixSnapshot {
    /// Records in key order.
    pub kvs: Vec<KeyValue>,
    /// The store revision the read observed; watch from `revision + 1` to miss nothing.
    pub revision: Revision,
}

/// A condition of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compare {
    /// The key's mod revision equals this; `0` means "the key does not exist".
    ModRevision(String, Revision),
    /// The key's create revision equals this; `0` means "the key does not exist".
    /// Used for leadership fencing: a re-created leader key has a new create revision.
    CreateRevision(String, Revision),
    /// The key exists and holds exactly these bytes.
    Value(String, Vec<u8>),
}

/// A write inside a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Write `value` at `key`, bound to `session` if given (unbound otherwise).
    Put {
        /// The key.
        key: String,
        /// The value bytes.
        value: Vec<u8>,
        /// The session the record is tied to.
        session: Option<SessionId>,
    },
    /// Delete `key` (no error if absent).
    Delete {
        /// The key.
        key: String,
    },
}

impl Op {
    /// An unbound put.
    pub fn put(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Op::Put { key: key.into(), value: value.into(), session: None }
    }

    /// A put bound to a session.
    pub fn put_in(key: impl Into<String>, value: impl Into<Vec<u8>>, session: SessionId) -> Self {
        Op::Put { key: key.into(), value: value.into(), session: Some(session) }
    }

    /// A delete.
    pub fn delete(key: impl Into<String>) -> Self {
        Op::Delete { key: key.into() }
    }

    /// The key this operation writes.
    pub fn key(&self) -> &str {
        match self {
            Op::Put { key, .. } | Op::Delete { key } => key,
        }
    }
}

/// An atomic compare-and-swap: if every compare holds, every op applies, else none does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    /// Conditions that must all hold.
    pub compares: Vec<Compare>,
    /// Writes applied (in order, at one revision) when they do.
    pub ops: Vec<Op>,
}

impl Txn {
    /// An empty transaction.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a condition.
    pub fn when(mut self, compare: Compare) -> Self {
        self.compares.push(compare);
        self
    }

    /// Adds a write.
    pub fn then(mut self, op: Op) -> Self {
        self.ops.push(op);
        self
    }
}

/// What a transaction did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnOutcome {
    /// Whether the compares held and the ops were applied.
    pub succeeded: bool,
    /// The store revision after the transaction.
    pub revision: Revision,
}

/// What happened to a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEventKind {
    /// The key was written; the new record.
    Put(KeyValue),
    /// The key was deleted (explicitly or because its session ended).
    Delete,
}

/// One change seen by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    /// The key that changed.
    pub key: String,
    /// The revision of the change.
    pub revision: Revision,
    /// The change.
    pub kind: WatchEventKind,
}

/// Every change of one revision under a watched prefix, together: a watcher never sees part
/// of a transaction (or of a session's expiry), as with etcd's watch responses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchBatch {
    /// The revision of every event in the batch.
    pub revision: Revision,
    /// The changes under the watched prefix, in the transaction's op order. Empty only in
    /// a progress mark: the store says the watch is alive and has delivered everything up
    /// to `revision` ([`LeaseStore::watch_progress_every`]); there is nothing to apply.
    pub events: Vec<WatchEvent>,
}

/// A stream of whole revisions, in revision order (one [`WatchBatch`] per revision that
/// touched the prefix); it ends only with an error item.
pub type WatchStream = BoxStream<'static, Result<WatchBatch, StoreError>>;

/// Errors of a [`LeaseStore`].
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// The session expired or was revoked; records bound to it are gone.
    #[error("session {0} has expired or was revoked")]
    SessionExpired(SessionId),
    /// A watch asked for history the store has compacted away. Recover by re-reading
    /// the prefix and watching from the snapshot's revision + 1.
    #[error("revision {requested} is compacted (oldest kept is {compacted}); re-read and watch again")]
    Compacted {
        /// The revision the watch asked for.
        requested: Revision,
        /// The store's compaction revision.
        compacted: Revision,
    },
    /// The store cannot be reached (after retries).
    #[error("store unavailable: {0}")]
    Unavailable(#[source] Unreachable),
    /// A record could not be decoded or a request was malformed.
    #[error("invalid store data: {0}")]
    Invalid(#[source] Malformed),
    /// The store was closed.
    #[error("store closed")]
    Closed,
}

/// The storage contract shared by the coordinators (see the module docs).
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Starts a session that expires `ttl` after its last keep-alive.
    async fn grant_session(&self, ttl: Duration) -> Result<SessionId, StoreError>;

    /// Refreshes a session once. Fails with [`StoreError::SessionExpired`] when it is gone.
    async fn keep_alive(&self, session: SessionId) -> Result<(), StoreError>;

    /// Ends a session now, deleting its records. Revoking an unknown session is not an error.
    async fn revoke_session(&self, session: SessionId) -> Result<(), StoreError>;

    /// Reads one key.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError>;

    /// Reads every key starting with `prefix`, in key order, at one revision.
    async fn get_prefix(&self, prefix: &str) -> Result<PrefixSnapshot, StoreError>;

    /// Applies a transaction atomically.
    async fn txn(&self, txn: Txn) -> Result<TxnOutcome, StoreError>;

    /// Watches every change under `prefix` with revision `>= from_revision`, in order, one
    /// [`WatchBatch`] per revision. Fails (immediately or as the first item) with [`StoreError::Compacted`] when that
    /// history is gone.
    async fn watch_prefix(&self, prefix: &str, from_revision: Revision) -> Result<WatchStream, StoreError>;

    /// How often a quiet watch of this store sends a progress mark (a [`WatchBatch`]
    /// without events), if it does. A watch that has sent nothing, not even a mark, for
    /// much longer has hung without an error (a connection that stopped forwarding), and
    /// its follower counts itself stale (`coordinator::shared::mirror`). `None`: the
    /// store's watches cannot hang (an in-process store) and send no marks.
    fn watch_progress_every(&self) -> Option<Duration> {
        None
    }

    /// Discards history before `revision`: watches from older revisions then fail with
    /// [`StoreError::Compacted`]. Current records are untouched.
    async fn compact(&self, revision: Revision) -> Result<(), StoreError>;

    /// A connection of its own to the same store, for a caller on another runtime. A network
    /// client's connection is driven by tasks of the runtime that made it, so a caller on a
    /// different runtime (the instance lease's keeper thread, `coordinator::shared::lease`)
    /// would wait for this one's runtime at every call; it makes its own connection there.
    /// `None`: any runtime may call this store as it is (an in-process store).
    async fn connect_again(&self) -> Result<Option<Arc<dyn LeaseStore>>, StoreError> {
        Ok(None)
    }

    /// Writes one key unconditionally (bound to `session` if given).
    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        session: Option<SessionId>,
    ) -> Result<Revision, StoreError> {
        let op = Op::Put { key: key.to_string(), value, session };
        Ok(self.txn(Txn::new().then(op)).await?.revision)
    }

    /// Deletes one key unconditionally.
    async fn delete(&self, key: &str) -> Result<Revision, StoreError> {
        Ok(self.txn(Txn::new().then(Op::delete(key))).await?.revision)
    }
}
