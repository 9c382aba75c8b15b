//! The relay: turn every change into commands for the consumers connected to this
//! instance. The watcher that keeps the cache equal to the store is the shared
//! [`Mirror`](crate::coordinator::mirror::Mirror); it calls the relay after every change.
//!
//! Commands come only from here, derived from the cache after a whole revision has been
//! applied, so a consumer never sees a half-applied transaction, and every instance derives
//! the same commands from the same revision.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use tokio::sync::oneshot;

use super::Inner;
use crate::coordinator::wire::to_wire;
use crate::coordinator::{
    CoordinatorError,
    cache::{Cache, TopicEntry},
    mirror::Source,
    streams::{self, CommandSender, Ending, LocalStreamEnd},
};
use crate::handoff::{Command, ConsumerStatus, ConsumerView, diff_views};
use crate::store::{Revision, SessionId};

/// Why the server ended a local stream; tells the session task what to do with the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum EndReason {
    /// The consumer drained: revoke the session.
    Drained,
    /// A newer registration of the same name replaced this one: revoke the old session.
    Replaced,
    /// The consumer's record is gone (session expired): nothing left to do.
    Expired,
    /// This instance is shutting down: keep nothing alive, let the TTL give the consumer
    /// time to reconnect elsewhere.
    Shutdown,
}

/// A consumer stream held by this instance.
pub(super) struct LocalStream {
    /// The session the stream's registration is bound to.
    pub session: SessionId,
    /// Store revision of the registration write; before the cache reaches it, a missing
    /// or different record means "not seen yet", after it "replaced or expired".
    pub registered_at: Revision,
    /// Whether the snapshot has been sent.
    pub activated: bool,
    /// What the consumer has been told so far.
    pub told: ConsumerView,
    /// The stream's sender.
    pub tx: CommandSender,
    /// Tells the session task why the stream ended.
    pub end: Option<oneshot::Sender<EndReason>>,
}

impl LocalStreamEnd for LocalStream {
    type Reason = EndReason;

    fn sender(&self) -> &CommandSender {
        &self.tx
    }

    fn take_end(&mut self) -> Option<oneshot::Sender<EndReason>> {
        self.end.take()
    }
}

/// The local streams of this coordinator.
pub(super) type Streams = streams::Streams<LocalStream>;

/// Brings one local stream up to date with the cache; returns why it must end, if it must.
pub(super) fn relay_one(
    topic: &str,
    consumer: &str,
    stream: &mut LocalStream,
    entry: Option<&TopicEntry>,
    views: &BTreeMap<String, ConsumerView>,
    revision: Revision,
) -> Option<Ending<EndReason>> {
    let record = entry.and_then(|e| e.consumers.get(consumer));
    let ours = record.is_some_and(|r| r.value.session == stream.session.0);
    if !ours {
        if revision < stream.registered_at {
            return None; // our registration is not in the cache yet
        }
        // Tell the consumer it owns nothing any more before the stream ends.
        let commands = diff_views(&stream.told, &ConsumerView::default());
        send(topic, stream, commands);
        return Some(match record {
            Some(_) => (
                EndReason::Replaced,
                Some(CoordinatorError::Aborted(format!(
                    "consumer '{consumer}' registered again for topic '{topic}'; this stream was replaced"
                ))),
            ),
            None => (
                EndReason::Expired,
                Some(CoordinatorError::Unavailable(format!(
                    "the session of consumer '{consumer}' on topic '{topic}' expired; register again"
                ))),
            ),
        });
    }
    let view = views.get(consumer).cloned().unwrap_or_default();
    let draining = record.is_some_and(|r| r.value.status == ConsumerStatus::Draining);
    // Idle: owns nothing and takes part in no handoff. The view shows every role: a warm's
    // source and a release's target own the partition, the others are listed.
    let idle = view.owned.is_empty() && view.warming.is_empty() && view.releasing.is_empty();
    if !stream.activated {
        // The first message is always the snapshot, even when it is empty.
        stream.activated = true;
        let owned = view.owned.iter().copied().collect();
        send(topic, stream, vec![Command::Assignment { assigned: owned, unassigned: vec![] }]);
        stream.told = ConsumerView { owned: view.owned.clone(), ..Default::default() };
    }
    let commands = diff_views(&stream.told, &view);
    send(topic, stream, commands);
    stream.told = view;
    if draining && idle {
        return Some((EndReason::Drained, None));
    }
    None
}

fn send(topic: &str, stream: &LocalStream, commands: Vec<Command>) {
    for command in commands {
        // A closed receiver means the client is gone; its session task notices that.
        let _ = stream.tx.send(Ok(to_wire(topic, command)));
    }
}

/// Relays the cache to every local stream of the given topics (all topics if `None`).
pub(super) fn relay(inner: &Inner, cache: &Cache, topics: Option<&BTreeSet<String>>) {
    let mut streams = inner.lock_streams();
    let mut views: BTreeMap<String, BTreeMap<String, ConsumerView>> = BTreeMap::new();
    streams.relay(topics, |topic, consumer, stream| {
        let entry = cache.topics.get(topic);
        let topic_views = views
            .entry(topic.to_string())
            .or_insert_with(|| entry.map(TopicEntry::views).unwrap_or_default());
        let before = stream.told.releasing.clone(); // metrics hook
        let ended = relay_one(topic, consumer, stream, entry, topic_views, cache.revision);
        inner.metrics.observe_releases_sent(&before, &stream.told.releasing, |p| {
            entry.and_then(|e| e.handoffs.get(&p)).map(|h| h.value.since)
        }); // metrics hook
        ended
    });
    inner.metrics.streams.set(streams.by_key.len() as i64);
}

/// Ends every local stream (instance shutdown).
pub(super) fn end_all_streams(inner: &Inner) {
    inner.lock_streams().end_all(&inner.config.instance_id, EndReason::Shutdown);
    inner.metrics.streams.set(0);
}

/// Keeps the cache equal to the store and relays every change. Runs until shutdown.
pub(super) async fn watch_loop(inner: Arc<Inner>) {
    let source = Source {
        store: &*inner.store,
        keys: &inner.keys,
        resync_interval: inner.config.resync_interval,
        shutdown: &inner.shutdown,
    };
    inner.mirror.run(source, |cache, topics| relay(&inner, cache, Some(topics))).await;
}
