//! [`StoreModel`]: etcd's semantics as a plain value, with time as an input.
//!
//! It keeps the contract [`MemoryStore`](super::MemoryStore) keeps (see `memory.rs`), with no
//! lock, no task and no clock, so a deterministic simulation can run a whole cluster over it
//! in one thread (`crate::sim`):
//!
//! * one global revision, `1` in an empty store, incremented once per write transaction that
//!   changes something (every op of a transaction commits at the same revision); a
//!   transaction that changes nothing leaves the revision alone and reports the current one;
//! * per-key create / mod revisions; a missing key compares as create and mod revision `0`,
//!   and never equal on [`Compare::Value`];
//! * one transaction may touch a key once, and no key is empty;
//! * sessions (leases) with a deadline on the caller's clock: every operation first ends the
//!   sessions whose deadline is at or before its `now` (earliest first, each in one revision
//!   of delete events), so a session past its deadline is never observed alive;
//!   [`StoreModel::expire_due`] does only that, for a simulation whose clock moved on;
//! * a transaction whose compares hold but which puts under a session that is gone fails
//!   whole with [`StoreError::SessionExpired`];
//! * history of whole revisions, bounded by a number of events and by compaction. A watch is
//!   a [`WatchCursor`] (a prefix and the next revision it wants): [`StoreModel::poll`] hands
//!   it every revision under its prefix since then, or [`StoreError::Compacted`] when that
//!   history is gone. When the batches reach the watcher is the caller's choice (a
//!   simulation delivers them late, or cuts the watch). A start revision of `0` (or less)
//!   means "from the next revision on".
//!
//! It lives beside the other stores, not in the simulation, because it is an implementation
//! of the store's contract in the store's own types, tested against the same points.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    ops::Bound,
    time::Duration,
};

use super::{
    Compare, KeyValue, Malformed, Op, PrefixSnapshot, Revision, SessionId, StoreError, Txn, TxnOutcome,
    WatchBatch, WatchEvent, WatchEventKind,
};

/// etcd's semantics as a plain value (see the module docs). `now` is the caller's virtual
/// time, as a duration since any fixed start; it must not go backwards.
#[derive(Clone, Debug)]
pub struct StoreModel {
    revision: Revision,
    compacted: Revision,
    kvs: BTreeMap<String, Record>,
    sessions: BTreeMap<i64, Session>,
    /// Sessions by deadline, so expiry finds the due ones first.
    deadlines: BTreeSet<(Duration, i64)>,
    next_session: i64,
    history: VecDeque<WatchBatch>,
    /// Events in `history` (the limit counts events, not revisions).
    history_events: usize,
    history_limit: usize,
}

#[derive(Clone, Debug)]
struct Record {
    value: Vec<u8>,
    create_revision: Revision,
    mod_revision: Revision,
    session: Option<SessionId>,
}

#[derive(Clone, Debug)]
struct Session {
    deadline: Duration,
    ttl: Duration,
    keys: BTreeSet<String>,
}

/// A watch of a prefix: where it stands in the store's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchCursor {
    /// The watched prefix.
    pub prefix: String,
    /// The first revision not yet handed to the watcher.
    pub next: Revision,
}

impl Default for StoreModel {
    fn default() -> Self {
        Self::new()
    }
}

impl StoreModel {
    /// How many events the model keeps for watches, by default (as the memory store).
    pub const DEFAULT_HISTORY_LIMIT: usize = 10_000;

    /// An empty store at revision 1.
    pub fn new() -> Self {
        Self::with_history_limit(Self::DEFAULT_HISTORY_LIMIT)
    }

    /// An empty store keeping the last `limit` events for watches (whole revisions).
    pub fn with_history_limit(limit: usize) -> Self {
        StoreModel {
            revision: 1,
            compacted: 1,
            kvs: BTreeMap::new(),
            sessions: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            next_session: 1,
            history: VecDeque::new(),
            history_events: 0,
            history_limit: limit,
        }
    }

    /// The current revision.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// The oldest revision a watch can still start from.
    pub fn compacted_revision(&self) -> Revision {
        self.compacted
    }

    /// Whether `session` is alive (as of the last operation; call [`Self::expire_due`] first
    /// to ask about `now`).
    pub fn session_alive(&self, session: SessionId) -> bool {
        self.sessions.contains_key(&session.0)
    }

    /// The earliest session deadline, if any session is alive: when the model next changes
    /// by itself.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.deadlines.first().map(|(deadline, _)| *deadline)
    }

    /// Ends every session whose deadline is at or before `now`, earliest first, each in one
    /// revision (delete events for its records).
    pub fn expire_due(&mut self, now: Duration) {
        while let Some(&(deadline, id)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.end_session(id);
        }
    }

    /// Starts every session's TTL again from `now`: what a new etcd leader does with the
    /// leases it takes over, so an outage of the store expires no session by itself.
    pub fn renew_all_sessions(&mut self, now: Duration) {
        self.deadlines.clear();
        for (id, session) in &mut self.sessions {
            session.deadline = now + session.ttl;
            self.deadlines.insert((session.deadline, *id));
        }
    }

    /// Starts a session that expires `ttl` after `now` unless kept alive.
    pub fn grant_session(&mut self, now: Duration, ttl: Duration) -> Result<SessionId, StoreError> {
        self.expire_due(now);
        if ttl.is_zero() {
            return Err(StoreError::Invalid(Malformed::ZeroTtl));
        }
        let id = self.next_session;
        self.next_session += 1;
        let deadline = now + ttl;
        self.sessions.insert(id, Session { deadline, ttl, keys: BTreeSet::new() });
        self.deadlines.insert((deadline, id));
        Ok(SessionId(id))
    }

    /// Moves a session's deadline to `now` + its TTL; [`StoreError::SessionExpired`] if gone.
    pub fn keep_alive(&mut self, now: Duration, session: SessionId) -> Result<(), StoreError> {
        self.expire_due(now);
        let Some(entry) = self.sessions.get_mut(&session.0) else {
            return Err(StoreError::SessionExpired(session));
        };
        self.deadlines.remove(&(entry.deadline, session.0));
        entry.deadline = now + entry.ttl;
        self.deadlines.insert((entry.deadline, session.0));
        Ok(())
    }

    /// Ends a session now, deleting its records (an unknown session is no error).
    pub fn revoke_session(&mut self, now: Duration, session: SessionId) {
        self.expire_due(now);
        self.end_session(session.0);
    }

    /// Reads one key.
    pub fn get(&mut self, now: Duration, key: &str) -> Option<KeyValue> {
        self.expire_due(now);
        self.kvs.get(key).map(|record| snapshot_of(key, record))
    }

    /// Reads every key under `prefix`, in key order, at the current revision.
    pub fn get_prefix(&mut self, now: Duration, prefix: &str) -> PrefixSnapshot {
        self.expire_due(now);
        let kvs = self
            .kvs
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, record)| snapshot_of(key, record))
            .collect();
        PrefixSnapshot { kvs, revision: self.revision }
    }

    /// Applies a transaction atomically.
    pub fn txn(&mut self, now: Duration, txn: &Txn) -> Result<TxnOutcome, StoreError> {
        validate(txn)?;
        self.expire_due(now);
        if !txn.compares.iter().all(|c| self.compare_holds(c)) {
            return Ok(TxnOutcome { succeeded: false, revision: self.revision });
        }
        for op in &txn.ops {
            if let Op::Put { session: Some(session), .. } = op
                && !self.session_alive(*session)
            {
                return Err(StoreError::SessionExpired(*session));
            }
        }
        let revision = self.commit(&txn.ops);
        Ok(TxnOutcome { succeeded: true, revision })
    }

    /// A watch of `prefix` from `from_revision` (`0` or less: from the next revision);
    /// [`StoreError::Compacted`] if that history is gone.
    pub fn watch(&self, prefix: &str, from_revision: Revision) -> Result<WatchCursor, StoreError> {
        let next = if from_revision <= 0 { self.revision + 1 } else { from_revision };
        if next < self.compacted {
            return Err(StoreError::Compacted { requested: next, compacted: self.compacted });
        }
        Ok(WatchCursor { prefix: prefix.to_string(), next })
    }

    /// Every revision under the cursor's prefix since it last polled, whole and in order,
    /// and the cursor moved past them (and past the current revision: nothing older is
    /// owed). [`StoreError::Compacted`] when part of that history is gone.
    pub fn poll(&self, cursor: &mut WatchCursor) -> Result<Vec<WatchBatch>, StoreError> {
        if cursor.next > self.revision {
            return Ok(Vec::new());
        }
        if cursor.next < self.compacted {
            return Err(StoreError::Compacted { requested: cursor.next, compacted: self.compacted });
        }
        // Revisions are consecutive in history, so the start is an index, not a search.
        let first = self.history.front().map_or(self.revision + 1, |batch| batch.revision);
        let skip = usize::try_from(cursor.next - first).unwrap_or(0);
        let batches = self
            .history
            .iter()
            .skip(skip)
            .filter(|batch| batch.revision >= cursor.next)
            .filter_map(|batch| part_under(&cursor.prefix, batch))
            .collect();
        cursor.next = self.revision + 1;
        Ok(batches)
    }

    /// Discards history before `revision`; [`StoreError::Invalid`] beyond the current one.
    pub fn compact(&mut self, revision: Revision) -> Result<(), StoreError> {
        if revision > self.revision {
            return Err(StoreError::Invalid(Malformed::CompactInFuture { revision, current: self.revision }));
        }
        self.compacted = self.compacted.max(revision);
        self.trim_history();
        Ok(())
    }

    fn end_session(&mut self, id: i64) {
        let Some(session) = self.sessions.remove(&id) else { return };
        self.deadlines.remove(&(session.deadline, id));
        let ops: Vec<Op> = session.keys.into_iter().map(|key| Op::Delete { key }).collect();
        self.commit(&ops);
    }

    fn compare_holds(&self, compare: &Compare) -> bool {
        match compare {
            Compare::ModRevision(key, rev) => self.kvs.get(key).map_or(0, |r| r.mod_revision) == *rev,
            Compare::CreateRevision(key, rev) => self.kvs.get(key).map_or(0, |r| r.create_revision) == *rev,
            Compare::Value(key, value) => self.kvs.get(key).is_some_and(|r| r.value == *value),
        }
    }

    /// Applies validated ops at one new revision, if anything changes; the revision after.
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
        self.history_events += events.len();
        self.history.push_back(WatchBatch { revision, events });
        self.trim_history();
        revision
    }

    /// Drops the oldest revisions (whole) beyond the limit or before the compaction point.
    fn trim_history(&mut self) {
        while self.history_events > self.history_limit
            || self.history.front().is_some_and(|b| b.revision < self.compacted)
        {
            let Some(dropped) = self.history.pop_front() else { break };
            self.history_events -= dropped.events.len();
            self.compacted = self.compacted.max(dropped.revision + 1);
        }
    }
}

/// The part of `batch` under `prefix`, whole, or `None` if nothing is.
fn part_under(prefix: &str, batch: &WatchBatch) -> Option<WatchBatch> {
    let events: Vec<WatchEvent> =
        batch.events.iter().filter(|e| e.key.starts_with(prefix)).cloned().collect();
    (!events.is_empty()).then_some(WatchBatch { revision: batch.revision, events })
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

/// What etcd checks before looking at a transaction: non-empty keys, each key written once.
fn validate(txn: &Txn) -> Result<(), StoreError> {
    let mut seen = BTreeSet::new();
    for op in &txn.ops {
        let key = op.key();
        if key.is_empty() {
            return Err(StoreError::Invalid(Malformed::EmptyKey));
        }
        if !seen.insert(key) {
            return Err(StoreError::Invalid(Malformed::KeyWrittenTwice { key: key.to_string() }));
        }
    }
    for compare in &txn.compares {
        let (Compare::ModRevision(key, _) | Compare::CreateRevision(key, _) | Compare::Value(key, _)) =
            compare;
        if key.is_empty() {
            return Err(StoreError::Invalid(Malformed::EmptyCompareKey));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
