//! How a [`MemoryStore`](super::MemoryStore) delivers revisions to watchers and keeps
//! history, and what it checks before a transaction.

use std::collections::HashSet;

use super::{State, Watcher};
use crate::store::{Compare, Malformed, Op, Revision, StoreError, Txn, WatchBatch, WatchEvent};

impl Watcher {
    /// The part of `batch` this watcher wants (`None` if nothing): whole or not at all
    /// per revision, filtered by prefix.
    pub(super) fn wants(prefix: &str, from: Revision, batch: &WatchBatch) -> Option<WatchBatch> {
        if batch.revision < from {
            return None;
        }
        let events: Vec<WatchEvent> =
            batch.events.iter().filter(|e| e.key.starts_with(prefix)).cloned().collect();
        (!events.is_empty()).then_some(WatchBatch { revision: batch.revision, events })
    }
}

impl State {
    /// Sends one revision to the matching watchers (whole, under the lock, so every watcher
    /// sees one order) and records it.
    pub(super) fn publish(&mut self, batch: WatchBatch) {
        // Watchers whose stream was dropped go away here.
        self.watchers.retain(|watcher| match Watcher::wants(&watcher.prefix, watcher.from, &batch) {
            Some(part) => watcher.tx.send(Ok(part)).is_ok(),
            None => !watcher.tx.is_closed(),
        });
        self.history_events += batch.events.len();
        self.history.push_back(batch);
        self.trim_history();
    }

    /// Drops the oldest revisions (whole) beyond the limit or before the compaction point.
    pub(super) fn trim_history(&mut self) {
        while self.history_events > self.history_limit
            || self.history.front().is_some_and(|b| b.revision < self.compacted)
        {
            let Some(dropped) = self.history.pop_front() else { break };
            self.history_events -= dropped.events.len();
            self.compacted = self.compacted.max(dropped.revision + 1);
        }
    }
}

/// Checks what etcd checks before looking at a transaction: non-empty keys, each key once.
pub(super) fn validate(txn: &Txn) -> Result<(), StoreError> {
    let mut seen = HashSet::new();
    for op in &txn.ops {
        let key = match op {
            Op::Put { key, .. } | Op::Delete { key } => key,
        };
        if key.is_empty() {
            return Err(StoreError::Invalid(Malformed::EmptyKey));
        }
        if !seen.insert(key.as_str()) {
            return Err(StoreError::Invalid(Malformed::KeyWrittenTwice { key: key.clone() }));
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
