//! The instance's streams as its state holds them, and the relay pass: after every change
//! of the cache, each stream it concerns gets the relay model's step (`relay.rs`,
//! [`relay_step`]) applied by the shared rule ([`Book::apply`]); every stream's gains come
//! out before any stream's losses, so a new owner hears `assigned` before the old one
//! hears its release. The epoch streams get a snapshot when their epochs changed.

use super::Instance;
use crate::coordinator::causes::{EndOfStream, Fence};
use crate::coordinator::handoff_backend::relay::{relay_step, to_keep};
use crate::coordinator::machine::io::{Effect, EndReason, StreamId};
use crate::coordinator::machine::observe::Observation;
use crate::coordinator::shared::departures::Departed;
use crate::coordinator::shared::mirror::{Changes, Touched};
use crate::coordinator::shared::relay::{RelayStep, StreamSeen};
use crate::coordinator::shared::streams::Book;
use crate::coordinator::shared::streams::{Ending, StreamKey, replaced_error};
use crate::coordinator::{CoordinatorError, EpochsAt, PartitionEpoch};
use crate::handoff::ConsumerView;
use crate::store::{Revision, SessionId};

/// A command stream held by the instance.
#[derive(Debug)]
pub(super) struct Stream {
    /// Its id (what its effects name).
    pub id: StreamId,
    /// Its registration id.
    pub registration: SessionId,
    /// The revision its registration was written at (again, after a rebind).
    pub registered_at: Revision,
    /// The revision of the registration that opened it: epochs older than it belong to
    /// an earlier incarnation until raised.
    pub incarnation_at: Revision,
    /// What it told its consumer.
    pub book: Book<ConsumerView>,
    /// Since when the store has lost its registration (being written again), if it has.
    pub lost_since: Option<crate::coordinator::machine::io::Micros>,
    /// A rebind of its registration is in flight.
    pub rebinding: bool,
    /// Its registration record as last seen while it was its own, with its mod revision,
    /// when it said more than a fresh one: a lost registration is written again as this.
    pub kept: Option<(Revision, Vec<u8>)>,
}

/// An epoch stream: the consumer it shows, and the last snapshot it sent.
#[derive(Debug)]
pub(super) struct EpochWatch {
    /// (topic, consumer, registration) of the command stream it follows.
    pub key: StreamKey,
    /// The last epochs sent.
    pub last: Option<Vec<PartitionEpoch>>,
}

impl Stream {
    /// What the relay model sees of this stream.
    pub fn seen(&self) -> StreamSeen<'_, ConsumerView> {
        StreamSeen {
            session: self.registration,
            registered_at: self.registered_at,
            activated: self.book.activated,
            told: &self.book.told,
            told_complete: self.book.told_complete,
        }
    }
}

impl Instance {
    /// Relays `changes` to the streams they concern (module docs), then the epoch streams.
    pub(super) fn relay(&mut self, changes: &Changes) {
        let Some(cache) = self.cache.as_ref() else { return };
        let mut concerned: Vec<(String, String)> = Vec::new();
        for (topic, touched) in changes.iter() {
            match touched {
                Touched::All => {
                    let from = (topic.clone(), String::new());
                    let of_topic = self.streams.range(from..).take_while(|((t, _), _)| t == topic);
                    concerned.extend(of_topic.map(|(name, _)| name.clone()))
                }
                Touched::Consumers(names) => {
                    concerned.extend(names.keys().map(|consumer| (topic.clone(), consumer.clone())))
                }
            }
        }
        let (mut later, mut ended) = (Vec::new(), Vec::new());
        for name in concerned {
            let Some(stream) = self.streams.get_mut(&name) else { continue };
            let (topic, consumer) = (&name.0, &name.1);
            let entry = cache.topics.get(topic);
            if let Some((mod_revision, encode)) = to_keep(entry, consumer, stream.registration)
                && stream.kept.as_ref().is_none_or(|(kept_at, _)| *kept_at != mod_revision)
            {
                stream.kept = encode().map(|record| (mod_revision, record));
            }
            let scope = changes.scope(topic, consumer);
            let step = relay_step(topic, consumer, stream.seen(), entry, scope, cache.revision);
            if let RelayStep::Tell(tell) = &step {
                // Each newly released partition's `ReleasePartition` goes out now; its
                // releasing phase began when `PartitionReady` was applied.
                let before = &stream.book.told.releasing;
                for partition in tell.told.releasing.keys().filter(|p| !before.contains_key(p)) {
                    let since = entry.and_then(|e| e.handoffs.get(partition)).map(|h| h.value.since);
                    if let Some(ready_since) = since {
                        let (topic, partition, at) = (topic.clone(), *partition, self.now / 1000);
                        let sent = Observation::ReleaseSent { topic, partition, ready_since, at };
                        self.out.push(Effect::Observe(sent));
                    }
                }
            }
            let said = stream.book.apply(topic, consumer, step);
            if said.lost && stream.lost_since.is_none() {
                stream.lost_since = Some(self.now);
                self.lost.insert(name.clone());
            }
            let id = stream.id;
            self.out.extend(said.now.into_iter().map(|command| Effect::Command { stream: id, command }));
            later.extend(said.later.into_iter().map(|command| Effect::Command { stream: id, command }));
            if let Some(end) = said.end {
                ended.push(((topic.clone(), consumer.clone(), stream.registration), end));
            }
        }
        self.out.extend(later);
        for (key, ending) in ended {
            self.end_stream(&key, ending);
        }
        self.tell_epochs(changes);
    }

    /// Relays the whole view to the stream of (`topic`, `consumer`), as after its
    /// admission: its first message is its snapshot.
    pub(super) fn relay_whole(&mut self, topic: &str, consumer: &str) {
        let mut changes = Changes::default();
        changes.consumers(topic, [consumer]);
        self.relay(&changes);
    }

    /// Ends the stream `key` (if it is still that registration's): its error goes last,
    /// and its registration is settled as its end says.
    pub(super) fn end_stream(&mut self, key: &StreamKey, (reason, error): Ending) {
        let name = (key.0.clone(), key.1.clone());
        if self.streams.get(&name).is_none_or(|s| s.registration != key.2) {
            return;
        }
        let Some(stream) = self.streams.remove(&name) else { return };
        self.lost.remove(&name);
        self.out.push(Effect::EndStream { stream: stream.id, reason, error });
        self.end_epoch_streams(key);
        let at = self.instant(self.now);
        let registered_at = stream.registered_at;
        match reason {
            EndReason::Left => {
                self.departures.add(Departed { key: key.clone(), registered_at, at, left: true })
            }
            EndReason::Disconnected => {
                self.departures.add(Departed { key: key.clone(), registered_at, at, left: false })
            }
            EndReason::Replaced | EndReason::Expired | EndReason::Shutdown => {}
        }
    }

    /// Tells the stream of `key` it owns nothing, then ends it with `ending`.
    pub(super) fn farewell_and_end(&mut self, key: &StreamKey, ending: Ending) {
        let name = (key.0.clone(), key.1.clone());
        if let Some(stream) = self.streams.get_mut(&name).filter(|s| s.registration == key.2) {
            let id = stream.id;
            let farewell = stream.book.farewell(&key.0);
            self.out.extend(farewell.into_iter().map(|command| Effect::Command { stream: id, command }));
        }
        self.end_stream(key, ending);
    }

    /// Fences every stream: told it owns nothing, ended `UNAVAILABLE` saying `why`; their
    /// registrations are kept for the TTL.
    pub(super) fn fence_all(&mut self, why: Fence) {
        let keys: Vec<StreamKey> =
            self.streams.iter().map(|((t, c), s)| (t.clone(), c.clone(), s.registration)).collect();
        for key in keys {
            let error = CoordinatorError::StreamEnded(EndOfStream::Fenced(why.clone()));
            self.farewell_and_end(&key, (EndReason::Disconnected, Some(error)));
        }
    }

    /// Admits the stream `stream` of `key`, written at `registered_at`: a stream of the
    /// same name registered earlier is told it owns nothing and ends replaced.
    pub(super) fn admit(
        &mut self,
        id: StreamId,
        key: &StreamKey,
        registered_at: Revision,
        same_process: bool,
    ) {
        let name = (key.0.clone(), key.1.clone());
        if let Some(old) = self.streams.get(&name) {
            let old_key = (key.0.clone(), key.1.clone(), old.registration);
            if old.registered_at > registered_at {
                let error = replaced_error(&key.0, &key.1);
                self.out.push(Effect::EndStream {
                    stream: id,
                    reason: EndReason::Replaced,
                    error: Some(error),
                });
                return;
            }
            self.farewell_and_end(&old_key, (EndReason::Replaced, Some(replaced_error(&key.0, &key.1))));
        }
        let stream = Stream {
            id,
            registration: key.2,
            registered_at,
            incarnation_at: if same_process { 0 } else { registered_at },
            book: Book { told_complete: true, ..Book::default() },
            lost_since: None,
            rebinding: false,
            kept: None,
        };
        self.streams.insert(name, stream);
        self.relay_whole(&key.0, &key.1);
    }

    /// Sends each epoch stream whose consumer's topic `changes` touched its epochs, if
    /// they changed.
    pub(super) fn tell_epochs(&mut self, changes: &Changes) {
        let touched = |topic: &String| changes.iter().any(|(t, _)| t == topic);
        let ids: Vec<StreamId> =
            self.epoch_streams.iter().filter(|(_, w)| touched(&w.key.0)).map(|(id, _)| *id).collect();
        for id in ids {
            self.tell_epochs_of(id);
        }
    }

    /// Sends the epoch stream `id` its epochs if they changed since its last snapshot.
    pub(super) fn tell_epochs_of(&mut self, id: StreamId) {
        let Some(watch) = self.epoch_streams.get(&id) else { return };
        let key = watch.key.clone();
        let name = (key.0.clone(), key.1.clone());
        let Some(since) =
            self.streams.get(&name).filter(|s| s.registration == key.2).map(|s| s.incarnation_at)
        else {
            return;
        };
        let revision = self.cache.as_ref().map_or(0, |c| c.revision);
        let epochs = self.epochs_of(&key.0, &key.1, since);
        let Some(watch) = self.epoch_streams.get_mut(&id) else { return };
        if watch.last.as_ref() == Some(&epochs) {
            return;
        }
        watch.last = Some(epochs.clone());
        let revision = u64::try_from(revision).unwrap_or(0);
        self.out.push(Effect::Epochs { stream: id, epochs: EpochsAt { revision, partitions: epochs } });
    }

    /// Ends the epoch streams that follow the command stream `key`.
    fn end_epoch_streams(&mut self, key: &StreamKey) {
        let ids: Vec<StreamId> =
            self.epoch_streams.iter().filter(|(_, w)| w.key == *key).map(|(id, _)| *id).collect();
        for id in ids {
            self.epoch_streams.remove(&id);
            self.out.push(Effect::EndStream { stream: id, reason: EndReason::Left, error: None });
        }
    }

    /// A stream went away on its own: an epoch stream is forgotten; a command stream's
    /// registration is kept for the TTL (the consumer may come back).
    pub(super) fn stream_closed(&mut self, id: StreamId) {
        if self.epoch_streams.remove(&id).is_some() {
            return;
        }
        let found = self
            .streams
            .iter()
            .find(|(_, s)| s.id == id)
            .map(|((t, c), s)| (t.clone(), c.clone(), s.registration));
        let Some(key) = found else {
            // Not admitted (yet): its Register's caller went away.
            self.closed.insert(id);
            return;
        };
        let name = (key.0.clone(), key.1.clone());
        if let Some(stream) = self.streams.remove(&name) {
            self.lost.remove(&name);
            self.end_epoch_streams(&key);
            let at = self.instant(self.now);
            self.departures.add(Departed { key, registered_at: stream.registered_at, at, left: false });
        }
    }
}
