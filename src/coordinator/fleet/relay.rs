//! The relay: tell every local consumer the difference between the leases it holds and
//! what it was told. The watcher that keeps the cache equal to the store is the shared
//! [`Mirror`](crate::coordinator::mirror::Mirror); it calls the relay after every change.
//!
//! Updates come from here, derived from the cache after a whole revision has been applied
//! (so a consumer never sees half a transaction), with one exception: a partition the
//! consumer's own claim step gives back is `unassigned` by the claim step *before* its
//! lease is deleted (`member.rs`), and kept out of the consumer's view meanwhile
//! ([`LocalStream::releasing`]).

use std::{collections::BTreeSet, sync::Arc};

use tokio::sync::oneshot;

use super::{
    Inner,
    state::{FleetCache, FleetTopic},
};
use crate::coordinator::wire::update;
use crate::coordinator::{
    CoordinatorError,
    mirror::Source,
    streams::{self, CommandSender, Ending, LocalStreamEnd},
};
use crate::store::{Revision, SessionId};

/// Why the server ended a local stream; tells the consumer task what to do with the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum EndReason {
    /// The consumer deregistered: revoke the session, freeing its leases now.
    Left,
    /// A newer registration of the same name took the record and the leases over: revoke
    /// the old session (nothing is bound to it any more).
    Replaced,
    /// The consumer's record is gone (session expired): nothing left to do.
    Expired,
    /// This instance is shutting down: leave the session to its TTL, so the consumer can
    /// reconnect elsewhere and keep its partitions.
    Shutdown,
}

/// A consumer stream held by this instance.
pub(super) struct LocalStream {
    /// The session the registration (and the consumer's leases) are bound to.
    pub session: SessionId,
    /// Revision of the registration write (= the member record's mod revision). Before
    /// the cache reaches it, a missing or different record means "not seen yet".
    pub registered_at: Revision,
    /// Whether the snapshot has been sent.
    pub activated: bool,
    /// Partitions the consumer has been told it owns.
    pub told: BTreeSet<u32>,
    /// Partitions given back (already `unassigned`) whose lease deletion is in flight.
    pub releasing: BTreeSet<u32>,
    /// The stream's sender.
    pub tx: CommandSender,
    /// Tells the consumer task why the stream ended.
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

/// Tells the stream `unassigned` for everything it was told, if anything.
fn unassign_all(topic: &str, stream: &mut LocalStream) {
    if stream.activated && !stream.told.is_empty() {
        let told = std::mem::take(&mut stream.told);
        let _ = stream.tx.send(Ok(update(topic, [], told)));
    }
}

/// Brings one local stream up to date with the cache; returns why it must end, if it must.
pub(super) fn relay_one(
    topic: &str,
    consumer: &str,
    stream: &mut LocalStream,
    entry: Option<&FleetTopic>,
    revision: Revision,
) -> Option<Ending<EndReason>> {
    let record = entry.and_then(|e| e.members.get(consumer));
    let Some(record) = record.filter(|r| r.value.session == stream.session.0) else {
        if revision < stream.registered_at {
            return None; // our registration is not in the cache yet
        }
        unassign_all(topic, stream);
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
    };
    if record.value.leaving {
        unassign_all(topic, stream);
        return Some((EndReason::Left, None));
    }
    let held = entry.map(|e| e.held_by(consumer)).unwrap_or_default();
    stream.releasing.retain(|p| held.contains(p));
    let view: BTreeSet<u32> = held.difference(&stream.releasing).copied().collect();
    if !stream.activated {
        // The first message is always the snapshot, even when it is empty.
        stream.activated = true;
        let _ = stream.tx.send(Ok(update(topic, view.iter().copied(), [])));
        stream.told = view;
        return None;
    }
    let assigned: Vec<u32> = view.difference(&stream.told).copied().collect();
    let unassigned: Vec<u32> = stream.told.difference(&view).copied().collect();
    if !assigned.is_empty() || !unassigned.is_empty() {
        // A closed receiver means the client is gone; its consumer task notices that.
        let _ = stream.tx.send(Ok(update(topic, assigned, unassigned)));
        stream.told = view;
    }
    None
}

/// Relays the cache to every local stream of the given topics (all topics if `None`).
pub(super) fn relay(inner: &Inner, cache: &FleetCache, topics: Option<&BTreeSet<String>>) {
    let mut streams = inner.lock_streams();
    streams.relay(topics, |topic, consumer, stream| {
        relay_one(topic, consumer, stream, cache.topics.get(topic), cache.revision)
    });
    inner.metrics.streams.set(streams.by_key.len() as i64);
    // A consumer that deregistered after its stream had dropped: no stream ends, so no
    // consumer task revokes its session. The instance it was registered through does, so
    // its leases are free now rather than after the TTL.
    let mut orphans = Vec::new();
    for (topic, entry) in &cache.topics {
        if topics.is_some_and(|t| !t.contains(topic)) {
            continue;
        }
        for (consumer, record) in &entry.members {
            let session = SessionId(record.value.session);
            if record.value.leaving
                && record.value.instance == inner.config.instance_id
                && !streams.by_key.contains_key(&(topic.clone(), consumer.clone(), session))
            {
                orphans.push(session);
            }
        }
    }
    drop(streams);
    for session in orphans {
        let store = inner.store.clone();
        tokio::spawn(async move {
            let _ = store.revoke_session(session).await;
        });
    }
}

/// Ends every local stream with `UNAVAILABLE` (instance shutdown); sessions are left to
/// their TTL.
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
