//! The relay: turn every change into commands for the consumers connected to this
//! instance. The shared [`Mirror`](crate::coordinator::shared::mirror::Mirror) keeps the
//! cache equal to the store and calls the relay after every change.
//!
//! Commands come only from here, derived from the cache after a whole revision has been
//! applied, so a consumer never sees a half-applied transaction, and every instance derives
//! the same commands from the same revision.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use super::{Handoff, state::Cache, state::TopicEntry};
use crate::coordinator::shared::{
    streams::{EndReason, Ending, LocalStream, Told},
    wire::to_wire,
};
use crate::handoff::{Command, ConsumerStatus, ConsumerView, diff_views};
use crate::proto::v1::AssignmentCommand;
use crate::store::Revision;

impl Told for ConsumerView {
    fn farewell(&self, topic: &str) -> Vec<AssignmentCommand> {
        wire(topic, diff_views(self, &ConsumerView::default()))
    }
}

fn wire(topic: &str, commands: Vec<Command>) -> Vec<AssignmentCommand> {
    commands.into_iter().map(|c| to_wire(topic, c)).collect()
}

/// Brings one local stream up to date with the topic's cached state and the consumer's
/// `view` of it; returns why the stream must end, if it must.
pub(super) fn relay_one(
    topic: &str,
    consumer: &str,
    stream: &mut LocalStream<ConsumerView>,
    entry: Option<&TopicEntry>,
    view: ConsumerView,
    revision: Revision,
) -> Option<Ending> {
    let record = entry.and_then(|e| e.consumers.get(consumer));
    if record.is_none_or(|r| r.value.session != stream.session.0) {
        return stream.lost_registration(topic, consumer, record.is_some(), revision);
    }
    let draining = record.is_some_and(|r| r.value.status == ConsumerStatus::Draining);
    // Idle: owns nothing and takes part in no handoff. The view shows every role: a warm's
    // source and a release's target own the partition, the others are listed.
    let idle = view.owned.is_empty() && view.warming.is_empty() && view.releasing.is_empty();
    if !stream.activated {
        // The first message is always the snapshot, even when it is empty.
        stream.activated = true;
        let owned = view.owned.iter().copied().collect();
        stream.send(wire(topic, vec![Command::Assignment { assigned: owned, unassigned: vec![] }]));
        stream.told = ConsumerView { owned: view.owned.clone(), ..Default::default() };
    }
    stream.send(wire(topic, diff_views(&stream.told, &view)));
    stream.told = view;
    if draining && idle {
        return Some((EndReason::Left, None));
    }
    None
}

/// Relays the cache to every local stream of the given topics (all topics if `None`).
fn relay(inner: &Handoff, cache: &Cache, topics: Option<&BTreeSet<String>>) {
    let mut views: BTreeMap<String, BTreeMap<String, ConsumerView>> = BTreeMap::new();
    inner.core.streams.relay(topics, |topic, consumer, stream| {
        let entry = cache.topics.get(topic);
        let topic_views = views
            .entry(topic.to_string())
            .or_insert_with(|| entry.map(TopicEntry::views).unwrap_or_default());
        let view = topic_views.get(consumer).cloned().unwrap_or_default();
        let before = stream.told.releasing.clone();
        let ended = relay_one(topic, consumer, stream, entry, view, cache.revision);
        let phase_start = |p: u32| entry.and_then(|e| e.handoffs.get(&p)).map(|h| h.value.since);
        inner.core.metrics.observe_releases_sent(&before, &stream.told.releasing, phase_start);
        ended
    });
}

/// Keeps the cache equal to the store and relays every change. Runs until shutdown.
pub(super) async fn watch_loop(inner: Arc<Handoff>) {
    let resync = inner.config.resync_interval;
    inner.core.run_mirror(resync, |cache, topics| relay(&inner, cache, Some(topics))).await;
}
