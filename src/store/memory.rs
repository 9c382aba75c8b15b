//! [`MemoryStore`]: an in-process [`LeaseStore`] with etcd semantics.
//!
//! It is what the `memory` backend runs on and what tests use, so it keeps etcd's contract,
//! not a simplification of it:
//!
//! * one global revision, `1` in an empty store, incremented once per write transaction that
//!   changes something (every op of a transaction commits at the same revision); a
//!   transaction that changes nothing (failed compares, deleting an absent key) leaves the
//!   revision alone and reports the current one;
//! * per-key create / mod revisions; a missing key compares as create and mod revision `0`,
//!   and never equal on [`Compare::Value`];
//! * one transaction may touch a key once (etcd refuses duplicates: "duplicate key given in
//!   txn request"); an empty key is refused as well;
//! * sessions (leases) with a deadline on **tokio time** ([`tokio::time::Instant`]): a
//!   background task deletes the records of an expired session (one revision, delete events
//!   to watchers) as soon as its deadline passes, so tests under `tokio::time::pause()` are
//!   driven by auto-advance. Expiry is also applied lazily before every operation, so a
//!   session past its deadline is never observed alive;
//! * watches get every revision whole ([`WatchBatch`]: all events of one commit under the
//!   prefix, in op order), in revision order, first replayed from a bounded history
//!   (default [`MemoryStore::DEFAULT_HISTORY_LIMIT`] events, see [`MemoryStore::with_history_limit`]),
//!   then live. Batches are sent while the commit holds the store lock, so every watcher
//!   sees one total order. History that was trimmed or [`compacted`](LeaseStore::compact)
//!   away makes a watch from an older revision fail with [`StoreError::Compacted`].
//!   As in etcd, a start revision of `0` (or less) means "from the next revision on".
//!
//! `MemoryStore` is a cheap handle (`Arc` inside): clone it to share one store.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    fmt,
    ops::Bound,
    sync::{Arc, Mutex, MutexGuard, PoisonError, Weak},
    time::Duration,
};

use async_trait::async_trait;
use futures::StreamExt;
use tokio::{
    sync::{Notify, mpsc},
    task::JoinHandle,
    time::Instant,
};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::{
    Compare, KeyValue, LeaseStore, Malformed, Op, PrefixSnapshot, Revision, SessionId, StoreError, Txn,
    TxnOutcome, WatchBatch, WatchEvent, WatchEventKind, WatchStream,
};

/// An in-process [`LeaseStore`] with etcd semantics (see the module docs).
///
/// Cloning is cheap and every clone is the same store. The store and everything it holds
/// are freed when the last clone is dropped; the session expiry task (spawned on the tokio
/// runtime of the first [`grant_session`](LeaseStore::grant_session)) then stops, and open
/// watch streams end with [`StoreError::Closed`].
///
/// `new()` does not need a runtime; granting a session does (it is an `async fn`, so it
/// always runs inside one).
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    /// Wakes the expiry task: sessions changed, or the store is gone.
    wake: Arc<Notify>,
    /// The runtime the store was made on, where its expiry task runs: a session granted
    /// from another runtime (the instance lease's keeper thread) must not tie expiry to
    /// that runtime's life.
    home: Option<tokio::runtime::Handle>,
}

struct Record {
    value: Vec<u8>,
    create_revision: Revision,
    mod_revision: Revision,
    session: Option<SessionId>,
}

struct Session {
    deadline: Instant,
    ttl: Duration,
    keys: BTreeSet<String>,
}

struct Watcher {
    prefix: String,
    /// Events before this revision are not for this watcher (a start in the future).
    from: Revision,
    tx: mpsc::UnboundedSender<Result<WatchBatch, StoreError>>,
}

struct State {
    /// The current revision.
    revision: Revision,
    /// The oldest revision a watch may start from.
    compacted: Revision,
    kvs: BTreeMap<String, Record>,
    sessions: HashMap<i64, Session>,
    /// Sessions by deadline, for the expiry task.
    deadlines: BTreeSet<(Instant, i64)>,
    next_session: i64,
    /// Recent revisions, whole, for watches that start in the past.
    history: VecDeque<WatchBatch>,
    /// Events in `history` (the limit counts events, not revisions).
    history_events: usize,
    history_limit: usize,
    watchers: Vec<Watcher>,
    expiry_task: Option<JoinHandle<()>>,
}

impl MemoryStore {
    /// How many events a store keeps for watches that start in the past, by default.
    pub const DEFAULT_HISTORY_LIMIT: usize = 10_000;

    /// An empty store (revision 1) keeping the last [`Self::DEFAULT_HISTORY_LIMIT`] events.
    pub fn new() -> Self {
        Self::with_history_limit(Self::DEFAULT_HISTORY_LIMIT)
    }

    /// An empty store keeping the last `limit` events for watches that start in the past.
    /// Older history is compacted away as new events arrive (whole revisions at a time).
    pub fn with_history_limit(limit: usize) -> Self {
        let state = State {
            revision: 1,
            compacted: 1,
            kvs: BTreeMap::new(),
            sessions: HashMap::new(),
            deadlines: BTreeSet::new(),
            next_session: 1,
            history: VecDeque::new(),
            history_events: 0,
            history_limit: limit,
            watchers: Vec::new(),
            expiry_task: None,
        };
        let home = tokio::runtime::Handle::try_current().ok();
        MemoryStore {
            inner: Arc::new(Inner { state: Mutex::new(state), wake: Arc::new(Notify::new()), home }),
        }
    }

    /// An empty store whose revisions start at `revision` (at least 1) instead of 1.
    ///
    /// The memory backend starts at the start time in microseconds since the Unix epoch, so
    /// revisions (and the ownership epochs made from them, docs/design.md §10) stay above
    /// those of an earlier run of the process, whose state is gone: it would take more than
    /// one write per microsecond, sustained, for a run to outpace the clock.
    pub fn starting_at(revision: Revision) -> Self {
        let store = Self::new();
        {
            let mut state = store.inner.lock_now();
            state.revision = revision.max(1);
            state.compacted = state.revision;
        }
        store
    }

    /// [`starting_at`](Self::starting_at) the current time in microseconds since the Unix
    /// epoch (1 if the clock is before it).
    pub fn starting_now() -> Self {
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |since| Revision::try_from(since.as_micros()).unwrap_or(Revision::MAX / 2));
        Self::starting_at(micros)
    }

    /// The current revision.
    pub fn revision(&self) -> Revision {
        self.inner.lock_now().revision
    }

    /// The oldest revision a watch can still start from.
    pub fn compacted_revision(&self) -> Revision {
        self.inner.lock_now().compacted
    }

    /// Starts the expiry task if it is not running (first grant, or its runtime went away).
    fn ensure_expiry_task(&self, state: &mut State) {
        if state.expiry_task.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let spawn = |runtime: &tokio::runtime::Handle| {
            runtime.spawn(expiry_loop(Arc::downgrade(&self.inner), self.inner.wake.clone()))
        };
        // On the store's home runtime; if that one has shut down (a task spawned there is
        // finished at once), on the caller's.
        let at_home = self.inner.home.as_ref().map(spawn).filter(|task| !task.is_finished());
        let task =
            at_home.or_else(|| tokio::runtime::Handle::try_current().ok().map(|runtime| spawn(&runtime)));
        // No runtime at all: lazy expiry (before every operation) still holds the contract.
        state.expiry_task = task;
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.inner.lock();
        f.debug_struct("MemoryStore")
            .field("revision", &state.revision)
            .field("compacted", &state.compacted)
            .field("keys", &state.kvs.len())
            .field("sessions", &state.sessions.len())
            .field("watchers", &state.watchers.len())
            .finish()
    }
}

impl Inner {
    /// The state, without applying due expiries.
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing under the lock is expected to panic; if something did, keep serving the
        // state as it is rather than turning every later call into a panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The state, with every session whose deadline has passed already ended.
    fn lock_now(&self) -> MutexGuard<'_, State> {
        let mut state = self.lock();
        state.expire_due(Instant::now());
        state
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Stop the expiry task (it holds only a `Weak`) and end open watches.
        self.wake.notify_one();
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        for watcher in state.watchers.drain(..) {
            let _ = watcher.tx.send(Err(StoreError::Closed));
        }
    }
}

/// Ends sessions as their deadlines pass. Holds only a `Weak` so the store can be dropped.
async fn expiry_loop(store: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        let next_deadline = {
            let Some(inner) = store.upgrade() else { return };
            let mut state = inner.lock();
            state.expire_due(Instant::now());
            state.deadlines.first().map(|(deadline, _)| *deadline)
        };
        // `notify_one` stores a permit when nobody waits, so a change made between the
        // read above and the wait below is not lost.
        match next_deadline {
            Some(deadline) => {
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

fn snapshot_of(key: &str, record: &Record) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: record.value.clone(),
        create_revision: record.create_revision,
        mod_revision: record.mod_revision,
        session: record.session,
    }
}

impl State {
    /// Ends every session whose deadline is at or before `now`, earliest first.
    fn expire_due(&mut self, now: Instant) {
        while let Some(&(deadline, id)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            tracing::debug!(session = %SessionId(id), "memory store: session expired");
            self.end_session(id);
        }
    }

    /// Removes a session and deletes its records in one revision. Unknown ids are ignored.
    fn end_session(&mut self, id: i64) {
        let Some(session) = self.sessions.remove(&id) else { return };
        self.deadlines.remove(&(session.deadline, id));
        let ops: Vec<Op> = session.keys.into_iter().map(|key| Op::Delete { key }).collect();
        self.commit(&ops);
    }

    fn session_alive(&self, session: SessionId) -> bool {
        self.sessions.contains_key(&session.0)
    }

    fn compare_holds(&self, compare: &Compare) -> bool {
        match compare {
            Compare::ModRevision(key, rev) => self.kvs.get(key).map_or(0, |r| r.mod_revision) == *rev,
            Compare::CreateRevision(key, rev) => self.kvs.get(key).map_or(0, |r| r.create_revision) == *rev,
            Compare::Value(key, value) => self.kvs.get(key).is_some_and(|r| r.value == *value),
        }
    }

    /// Applies validated ops at one new revision (if anything changes) and publishes the
    /// events. Returns the revision after the commit.
    fn commit(&mut self, ops: &[Op]) -> Revision {
        let revision = self.revision + 1;
        let mut events = Vec::with_capacity(ops.len());
        for op in ops {
            match op {
                Op::Put { key, value, session } => {
                    let previous = self.kvs.remove(key);
                    let create_revision = previous.as_ref().map_or(revision, |r| r.create_revision);
                    if let Some(old) = previous.and_then(|r| r.session)
                        && Some(old) != *session
                        && let Some(old) = self.sessions.get_mut(&old.0)
                    {
                        old.keys.remove(key);
                    }
                    if let Some(new) = session
                        && let Some(new) = self.sessions.get_mut(&new.0)
                    {
                        new.keys.insert(key.clone());
                    }
                    let record = Record {
                        value: value.clone(),
                        create_revision,
                        mod_revision: revision,
                        session: *session,
                    };
                    events.push(WatchEvent {
                        key: key.clone(),
                        revision,
                        kind: WatchEventKind::Put(snapshot_of(key, &record)),
                    });
                    self.kvs.insert(key.clone(), record);
                }
                Op::Delete { key } => {
                    if let Some(old) = self.kvs.remove(key) {
                        if let Some(session) = old.session
                            && let Some(session) = self.sessions.get_mut(&session.0)
                        {
                            session.keys.remove(key);
                        }
                        events.push(WatchEvent { key: key.clone(), revision, kind: WatchEventKind::Delete });
                    }
                }
            }
        }
        if events.is_empty() {
            return self.revision;
        }
        self.revision = revision;
        self.publish(WatchBatch { revision, events });
        revision
    }
}

#[async_trait]
impl LeaseStore for MemoryStore {
    async fn grant_session(&self, ttl: Duration) -> Result<SessionId, StoreError> {
        if ttl.is_zero() {
            return Err(StoreError::Invalid(Malformed::ZeroTtl));
        }
        let mut state = self.inner.lock_now();
        let id = state.next_session;
        state.next_session += 1;
        let deadline = Instant::now() + ttl;
        state.sessions.insert(id, Session { deadline, ttl, keys: BTreeSet::new() });
        state.deadlines.insert((deadline, id));
        self.ensure_expiry_task(&mut state);
        drop(state);
        self.inner.wake.notify_one();
        Ok(SessionId(id))
    }

    async fn keep_alive(&self, session: SessionId) -> Result<(), StoreError> {
        let mut state = self.inner.lock_now();
        let state = &mut *state;
        let Some(entry) = state.sessions.get_mut(&session.0) else {
            return Err(StoreError::SessionExpired(session));
        };
        // A later deadline never needs the expiry task woken: it re-reads on its next wake.
        state.deadlines.remove(&(entry.deadline, session.0));
        entry.deadline = Instant::now() + entry.ttl;
        state.deadlines.insert((entry.deadline, session.0));
        Ok(())
    }

    async fn revoke_session(&self, session: SessionId) -> Result<(), StoreError> {
        self.inner.lock_now().end_session(session.0);
        self.inner.wake.notify_one();
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let state = self.inner.lock_now();
        Ok(state.kvs.get(key).map(|record| snapshot_of(key, record)))
    }

    async fn get_prefix(&self, prefix: &str) -> Result<PrefixSnapshot, StoreError> {
        let state = self.inner.lock_now();
        let kvs = state
            .kvs
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, record)| snapshot_of(key, record))
            .collect();
        Ok(PrefixSnapshot { kvs, revision: state.revision })
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        watch::validate(&txn)?;
        let mut state = self.inner.lock_now();
        if !txn.compares.iter().all(|c| state.compare_holds(c)) {
            return Ok(TxnOutcome { succeeded: false, revision: state.revision });
        }
        // Like etcd: the leases of the branch taken must exist, else the txn fails whole.
        for op in &txn.ops {
            if let Op::Put { session: Some(session), .. } = op
                && !state.session_alive(*session)
            {
                return Err(StoreError::SessionExpired(*session));
            }
        }
        let revision = state.commit(&txn.ops);
        Ok(TxnOutcome { succeeded: true, revision })
    }

    async fn watch_prefix(&self, prefix: &str, from_revision: Revision) -> Result<WatchStream, StoreError> {
        let mut state = self.inner.lock_now();
        // etcd: a start revision of 0 (or less) means "from now on".
        let from = if from_revision <= 0 { state.revision + 1 } else { from_revision };
        if from < state.compacted {
            return Err(StoreError::Compacted { requested: from, compacted: state.compacted });
        }
        let (tx, rx) = mpsc::unbounded_channel();
        for part in state.history.iter().filter_map(|batch| Watcher::wants(prefix, from, batch)) {
            // The receiver is alive: it is still in our hands.
            let _ = tx.send(Ok(part));
        }
        state.watchers.push(Watcher { prefix: prefix.to_string(), from, tx });
        Ok(UnboundedReceiverStream::new(rx).boxed())
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        let mut state = self.inner.lock_now();
        if revision > state.revision {
            return Err(StoreError::Invalid(Malformed::CompactInFuture {
                revision,
                current: state.revision,
            }));
        }
        state.compacted = state.compacted.max(revision);
        state.trim_history();
        Ok(())
    }
}

#[path = "memory_watch.rs"]
mod watch;

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
