//! [`Events`]: a watch under test, checking on the way that the store delivers whole
//! revisions.

use std::collections::VecDeque;

use kafka_assigner::store::{Revision, WatchBatch, WatchEvent, WatchStream};

use super::{PROMPT, Store};
use crate::support::next_within;

/// A watch under test: hands out whole revisions or single events, and checks on the way
/// that every batch is one non-empty revision, later than the one before. Progress marks
/// (batches without events, `LeaseStore::watch_progress_every`) are checked to be no
/// older than what was delivered, and skipped.
pub struct Events {
    /// The store's stream.
    pub stream: WatchStream,
    pending: VecDeque<WatchEvent>,
    last: Revision,
}

impl Events {
    /// The next whole revision (checked), panicking on an error item or after [`PROMPT`].
    pub async fn next_batch(&mut self, what: &str) -> WatchBatch {
        assert!(
            self.pending.is_empty(),
            "{what}: events of the last batch were not taken: {:?}",
            self.pending
        );
        let batch = loop {
            let batch = match next_within(&mut self.stream, PROMPT, what).await {
                Ok(batch) => batch,
                Err(error) => panic!("watch failed while waiting for {what}: {error}"),
            };
            if !batch.events.is_empty() {
                break batch;
            }
            assert!(
                batch.revision >= self.last,
                "{what}: a progress mark at {} after {}",
                batch.revision,
                self.last
            );
        };
        assert!(batch.revision > self.last, "{what}: revision {} after {}", batch.revision, self.last);
        for event in &batch.events {
            assert_eq!(event.revision, batch.revision, "{what}: an event of another revision in {batch:?}");
        }
        self.last = batch.revision;
        batch
    }

    /// The next event (of the current batch, or of the next one).
    pub async fn next_event(&mut self, what: &str) -> WatchEvent {
        if self.pending.is_empty() {
            let batch = self.next_batch(what).await;
            self.pending.extend(batch.events);
        }
        self.pending.pop_front().unwrap_or_else(|| unreachable!("batches are never empty"))
    }
}

pub(super) async fn watch(store: &Store, prefix: &str, from: Revision) -> Events {
    let stream =
        store.watch_prefix(prefix, from).await.unwrap_or_else(|e| panic!("watch {prefix} from {from}: {e}"));
    Events { stream, pending: VecDeque::new(), last: 0 }
}

pub(super) async fn next_event(events: &mut Events, what: &str) -> WatchEvent {
    events.next_event(what).await
}
