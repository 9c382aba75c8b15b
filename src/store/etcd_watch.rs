//! The [`WatchStream`] of an [`EtcdStore`](super::EtcdStore): etcd watch responses turned
//! into whole revisions.
//!
//! etcd never splits one revision's events across responses (unless a watch asks for
//! fragments, which ours do not), but one response may hold several revisions (a replay, or
//! a burst of commits): each response is split by revision, in order.
//!
//! **Liveness.** A watch on a frozen member, or behind a network that drops everything,
//! never errors: it just goes quiet (HTTP/2 keep-alive notices only after 15 s). So after
//! [`Timing::progress_every`] of silence the watch asks etcd for a progress notification,
//! which a live member answers at once. Each answer goes to the caller as a progress mark
//! (a [`WatchBatch`] without events), so the caller hears from a live watch at least that
//! often, and counts a watch that says nothing at all as stale (the mirror's follower).
//! No answer within the call timeout ends the watch with [`StoreError::Unavailable`], and
//! the caller re-watches (through the store's failover to a healthy endpoint).

use std::{collections::VecDeque, sync::Arc, time::Duration};

use etcd_client::{EventType, WatchResponse};
use futures::StreamExt;

use super::{
    call::Clients,
    codec::{key_string, key_value},
};
use crate::store::{
    Malformed, Revision, StoreError, WatchBatch, WatchBroke, WatchEvent, WatchEventKind, WatchStream,
};

/// When a watch asks for progress, and how long it waits for the answer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Timing {
    /// Silence after which the watch asks its member for a progress notification.
    pub progress_every: Duration,
    /// How long a progress request may wait for its answer before the watch ends.
    pub answer_within: Duration,
}

/// The state behind a [`WatchStream`] from etcd.
pub(super) struct Watch {
    stream: etcd_client::WatchStream,
    pending: VecDeque<Result<WatchBatch, StoreError>>,
    /// An error item was queued: nothing after it.
    failed: bool,
    from_revision: Revision,
    endpoints: String,
    /// When it asks for progress, and how long it waits for the answer.
    timing: Timing,
    /// The store's clients and the endpoint this watch is on: told when the stream breaks,
    /// so the re-watch (and other calls) go to another endpoint at once.
    on_break: (Arc<Clients>, usize),
}

impl Watch {
    /// A watch on an etcd stream that asked for history from `from_revision`, asking for
    /// progress and ending as `timing` says.
    pub(super) fn new(
        stream: etcd_client::WatchStream,
        from_revision: Revision,
        endpoints: String,
        timing: Timing,
        on_break: (Arc<Clients>, usize),
    ) -> Self {
        Watch { stream, pending: VecDeque::new(), failed: false, from_revision, endpoints, timing, on_break }
    }

    /// The stream broke (not a refusal by etcd): fail, and move calls off its endpoint.
    fn broke(&mut self, how: WatchBroke) {
        let (clients, endpoint) = &self.on_break;
        clients.failed(*endpoint);
        self.fail(StoreError::Unavailable(how.into()));
    }

    /// Takes the error the first response reported, if it is a compaction (reported by
    /// `watch_prefix` itself rather than as an item).
    pub(super) fn take_compacted(&mut self) -> Option<StoreError> {
        if let Some(Err(StoreError::Compacted { .. })) = self.pending.front() {
            return self.pending.pop_front().and_then(Result::err);
        }
        None
    }

    /// The stream of batches.
    pub(super) fn into_stream(self) -> WatchStream {
        futures::stream::unfold(self, |mut watch| async move { watch.next().await.map(|item| (item, watch)) })
            .boxed()
    }

    /// Queues the batches (or the error) of one etcd response, in order.
    pub(super) fn absorb(&mut self, response: WatchResponse) {
        if self.failed {
            return;
        }
        if response.compact_revision() > 0 {
            self.fail(StoreError::Compacted {
                requested: self.from_revision,
                compacted: response.compact_revision(),
            });
            return;
        }
        if response.canceled() {
            let reason = response.cancel_reason().to_string();
            self.broke(WatchBroke::Cancelled { endpoints: self.endpoints.clone(), reason });
            return;
        }
        let mut batch: Option<WatchBatch> = None;
        for event in response.events() {
            let Some(kv) = event.kv() else {
                self.fail(StoreError::Invalid(Malformed::EventWithoutKey));
                return;
            };
            // A delete's record is a tombstone whose mod revision is the delete's.
            let revision = kv.mod_revision();
            let item = match event.event_type() {
                EventType::Put => key_value(kv).map(|record| WatchEvent {
                    key: record.key.clone(),
                    revision,
                    kind: WatchEventKind::Put(record),
                }),
                EventType::Delete => {
                    key_string(kv).map(|key| WatchEvent { key, revision, kind: WatchEventKind::Delete })
                }
            };
            let event = match item {
                Ok(event) => event,
                Err(error) => {
                    self.fail(error);
                    return;
                }
            };
            match &mut batch {
                Some(current) if current.revision == revision => current.events.push(event),
                _ => {
                    if let Some(done) = batch.replace(WatchBatch { revision, events: vec![event] }) {
                        self.pending.push_back(Ok(done));
                    }
                }
            }
        }
        if let Some(done) = batch {
            self.pending.push_back(Ok(done));
        } else if !response.created() {
            // A progress notification: everything up to its revision was delivered.
            let revision = response.header().map_or(0, |h| h.revision());
            self.pending.push_back(Ok(WatchBatch { revision, events: Vec::new() }));
        }
    }

    fn fail(&mut self, error: StoreError) {
        self.failed = true;
        self.pending.push_back(Err(error));
    }

    /// The next item: queued ones first, then the next response; `None` after an error item.
    async fn next(&mut self) -> Option<Result<WatchBatch, StoreError>> {
        loop {
            if let Some(item) = self.pending.pop_front() {
                return Some(item);
            }
            if self.failed {
                return None;
            }
            // `message()` keeps its state in the stream, so timing it out loses nothing.
            let Timing { progress_every, answer_within } = self.timing;
            let message = match tokio::time::timeout(progress_every, self.stream.message()).await {
                Ok(message) => message,
                Err(_quiet) => {
                    if let Err(error) = self.stream.request_progress().await {
                        let endpoints = self.endpoints.clone();
                        self.broke(WatchBroke::ProgressRequest { endpoints, source: Arc::new(error) });
                        continue;
                    }
                    match tokio::time::timeout(answer_within, self.stream.message()).await {
                        Ok(message) => message,
                        Err(_) => {
                            let endpoints = self.endpoints.clone();
                            self.broke(WatchBroke::Quiet { endpoints, within: answer_within });
                            continue;
                        }
                    }
                }
            };
            match message {
                // A progress notification holds no event: nothing is queued.
                Ok(Some(response)) => self.absorb(response),
                Ok(None) => self.broke(WatchBroke::Ended { endpoints: self.endpoints.clone() }),
                Err(error) => {
                    let endpoints = self.endpoints.clone();
                    self.broke(WatchBroke::Broke { endpoints, source: Arc::new(error) });
                }
            }
        }
    }
}
