//! The relay: tell every local consumer the difference between the leases it holds and
//! what it was told. The shared mirror keeps the cache equal to the store and calls the
//! relay after every change.
//!
//! Updates come from here, derived from the cache after a whole revision has been applied
//! (so a consumer never sees half a transaction), with one exception: a partition the
//! consumer's own claim step gives back is `unassigned` by the claim step *before* its
//! lease is deleted, once the stream's transport took it (`claim.rs`), and kept out of the
//! consumer's view meanwhile ([`FleetTold::releasing`]).

use std::{collections::BTreeSet, sync::Arc};

use super::{
    Fleet,
    state::{FleetCache, FleetTopic},
};
use crate::coordinator::shared::{
    mirror::{Changes, Touched},
    streams::{EndReason, Ending, LocalStream, Told},
    wire::update,
};
use crate::proto::v1::AssignmentCommand;
use crate::store::{Revision, SessionId};

/// What a fleet stream remembers.
#[derive(Debug, Default)]
pub struct FleetTold {
    /// Partitions the consumer has been told it owns.
    pub owned: BTreeSet<u32>,
    /// Partitions given back (already `unassigned`) whose lease deletion is in flight.
    pub releasing: BTreeSet<u32>,
}

impl Told for FleetTold {
    fn farewell(&self, topic: &str) -> Vec<AssignmentCommand> {
        if self.owned.is_empty() {
            return Vec::new();
        }
        vec![update(topic, [], self.owned.iter().copied())]
    }
}

/// Brings one local stream up to date with the cache; returns why it must end, if it must.
pub(super) fn relay_one(
    topic: &str,
    consumer: &str,
    stream: &mut LocalStream<FleetTold>,
    entry: Option<&FleetTopic>,
    revision: Revision,
) -> Option<Ending> {
    let record = entry.and_then(|e| e.members.get(consumer));
    let ours = record.filter(|r| r.value.session == stream.session.0);
    // A lost registration (being written again) keeps the stream relayed.
    if ours.is_none()
        && let std::ops::ControlFlow::Break(ending) =
            stream.lost_registration(topic, consumer, record.is_some(), revision)
    {
        return ending;
    }
    if ours.is_some_and(|r| r.value.leaving) {
        stream.farewell(topic);
        return Some((EndReason::Left, None));
    }
    let held = entry.map(|e| e.held_by(consumer)).unwrap_or_default();
    stream.told.releasing.retain(|p| held.contains(p));
    let view: BTreeSet<u32> = held.difference(&stream.told.releasing).copied().collect();
    if !stream.activated {
        // The first message is always the snapshot, even when it is empty.
        stream.activated = true;
        stream.send([update(topic, view.iter().copied(), [])]);
        stream.told.owned = view;
        return None;
    }
    let assigned: Vec<u32> = view.difference(&stream.told.owned).copied().collect();
    let unassigned: Vec<u32> = stream.told.owned.difference(&view).copied().collect();
    if !assigned.is_empty() || !unassigned.is_empty() {
        stream.send([update(topic, assigned, unassigned)]);
        stream.told.owned = view;
    }
    None
}

/// Relays the cache to the local streams `changes` concerns.
pub(super) fn relay(inner: &Arc<Fleet>, cache: &FleetCache, changes: &Changes) {
    let core = &inner.core;
    core.streams().relay(changes, |topic, consumer, stream| {
        relay_one(topic, consumer, stream, cache.topics.get(topic), cache.revision)
    });
    // A consumer that deregistered after its stream had dropped: no stream ends, so no
    // stream task deletes its registration. The instance it was registered through does,
    // so its leases are free now rather than after the TTL.
    let mut orphans = Vec::new();
    for (topic, touched) in changes.iter() {
        let Some(entry) = cache.topics.get(topic) else { continue };
        let names: Vec<&String> = match touched {
            Touched::All => entry.members.keys().collect(),
            Touched::Consumers(names) => names.iter().collect(),
        };
        for consumer in names {
            let Some(record) = entry.members.get(consumer) else { continue };
            let key = (topic.clone(), consumer.clone(), SessionId(record.value.session));
            if record.value.leaving
                && record.value.instance == core.instance_id()
                && !core.streams().holds(&key)
            {
                orphans.push(key);
            }
        }
    }
    for key in orphans {
        let inner = inner.clone();
        tokio::spawn(async move {
            if let Err(error) = super::register::unregister(&inner, &key).await {
                tracing::warn!(%error, topic = %key.0, consumer = %key.1, "cannot free a departed member's leases; the next change retries");
            }
        });
    }
}

/// Keeps the cache equal to the store and tells the consumers every change, then announces
/// the revision. Runs until shutdown.
pub(super) async fn watch_loop(inner: Arc<Fleet>) {
    let mut follower = inner.core.follower(inner.config.resync_interval);
    while let Some(changes) = follower.next().await {
        let cache = inner.core.mirror().read();
        relay(&inner, &cache, &changes);
        inner.core.mirror().announce(&cache);
    }
}
