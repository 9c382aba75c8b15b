//! The fleet instance's streams as its state holds them, and the relay pass: after every
//! change of the cache, each stream it concerns gets the relay model's step (`relay.rs`,
//! [`relay_step`]) applied by the shared rule ([`Book::apply`]). A member record marked
//! leaving whose stream is not here (it had dropped) is settled at once by this instance
//! if it names it. The epoch streams get a snapshot when their epochs changed.

use super::Instance;
use super::claim::Claimer;
use crate::coordinator::causes::{ConsumerUnknown, EndOfStream, Fence};
use crate::coordinator::fleet_backend::relay::{FleetTold, leaving_here, relay_step};
use crate::coordinator::machine::io::{CallId, Effect, EndReason, Micros, Replied, StreamId};
use crate::coordinator::shared::departures::Departed;
use crate::coordinator::shared::mirror::{Changes, Touched};
use crate::coordinator::shared::relay::StreamSeen;
use crate::coordinator::shared::streams::{Book, Ending, StreamKey, replaced_error};
use crate::coordinator::{CoordinatorError, EpochsAt, PartitionEpoch};
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
    /// The revision of the registration that opened it: leases older than it belong to an
    /// earlier incarnation until raised (what its epoch stream shows).
    pub incarnation_at: Revision,
    /// What it told its consumer.
    pub book: Book<FleetTold>,
    /// Since when the store has lost its registration (being written again), if it has.
    pub lost_since: Option<Micros>,
    /// A rebind of its registration is in flight.
    pub rebinding: bool,
    /// Its claim step.
    pub claimer: Claimer,
    /// Its epoch streams, with the last snapshot each was sent.
    pub epoch_streams: Vec<(StreamId, Option<Vec<PartitionEpoch>>)>,
}

impl Stream {
    /// What the relay model sees of this stream.
    fn seen(&self) -> StreamSeen<'_, FleetTold> {
        StreamSeen {
            session: self.registration,
            registered_at: self.registered_at,
            activated: self.book.activated,
            told: &self.book.told,
            told_complete: self.book.told_complete,
        }
    }

    /// Its key.
    pub fn key(&self, name: &(String, String)) -> StreamKey {
        (name.0.clone(), name.1.clone(), self.registration)
    }
}

impl Instance {
    /// Relays `changes` to the streams they concern (module docs), then settles the
    /// registrations marked leaving whose streams had dropped.
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
        let mut ended = Vec::new();
        for name in concerned {
            let Some(stream) = self.streams.get_mut(&name) else { continue };
            let (topic, consumer) = (&name.0, &name.1);
            let step = relay_step(topic, consumer, stream.seen(), cache.topics.get(topic), cache.revision);
            let said = stream.book.apply(topic, consumer, step);
            if said.lost && stream.lost_since.is_none() {
                stream.lost_since = Some(self.now);
                self.lost.insert(name.clone());
            }
            let id = stream.id;
            let commands = said.now.into_iter().chain(said.later);
            self.out.extend(commands.map(|command| Effect::Command { stream: id, command }));
            if let Some(end) = said.end {
                ended.push((stream.key(&name), end));
            }
        }
        for (key, ending) in ended {
            self.end_stream(&key, ending);
        }
        self.settle_left(changes);
        self.tell_epochs(changes);
    }

    /// A consumer that deregistered after its stream had dropped: no stream ends, so the
    /// instance its record names settles it, at once (its leases are free now rather than
    /// after the TTL).
    fn settle_left(&mut self, changes: &Changes) {
        let Some(cache) = self.cache.as_ref() else { return };
        let at = self.instant(self.now);
        for (key, registered_at) in leaving_here(cache, changes, &self.config.instance_id) {
            let name = (key.0.clone(), key.1.clone());
            let held = self.streams.get(&name).is_some_and(|s| s.registration == key.2);
            // A registration already waiting out its TTL (its stream dropped) is due at
            // once now: its consumer deregistered.
            if !held && !self.departures.is_left(&key) {
                self.departures.add(Departed { key, registered_at, at, left: true });
            }
        }
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
        self.end_epoch_streams(&stream);
        let at = self.instant(self.now);
        let registered_at = stream.registered_at;
        let left = match reason {
            EndReason::Left => true,
            EndReason::Disconnected => false,
            EndReason::Replaced | EndReason::Expired | EndReason::Shutdown => return,
        };
        self.departures.add(Departed { key: key.clone(), registered_at, at, left });
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
        let keys: Vec<StreamKey> = self.streams.iter().map(|(name, s)| s.key(name)).collect();
        for key in keys {
            let error = CoordinatorError::StreamEnded(EndOfStream::Fenced(why.clone()));
            self.farewell_and_end(&key, (EndReason::Disconnected, Some(error)));
        }
    }

    /// Admits the stream `id` of `key`, written at `registered_at`: a stream of the same
    /// name registered earlier is told it owns nothing and ends replaced. Its claim step
    /// runs from now on.
    pub(super) fn admit(
        &mut self,
        id: StreamId,
        key: &StreamKey,
        registered_at: Revision,
        same_process: bool,
    ) {
        let name = (key.0.clone(), key.1.clone());
        if let Some(old) = self.streams.get(&name) {
            if old.registered_at > registered_at {
                let error = replaced_error(&key.0, &key.1);
                self.out.push(Effect::EndStream {
                    stream: id,
                    reason: EndReason::Replaced,
                    error: Some(error),
                });
                return;
            }
            let old_key = old.key(&name);
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
            claimer: Claimer::new(registered_at),
            epoch_streams: Vec::new(),
        };
        self.streams.insert(name, stream);
        self.relay_whole(&key.0, &key.1);
    }

    /// A stream went away on its own: an epoch stream is forgotten; a command stream's
    /// registration is kept for the TTL (the consumer may come back).
    pub(super) fn stream_closed(&mut self, id: StreamId) {
        for stream in self.streams.values_mut() {
            stream.epoch_streams.retain(|(epochs, _)| *epochs != id);
        }
        let found = self.streams.iter().find(|(_, s)| s.id == id).map(|(name, s)| s.key(name));
        let Some(key) = found else {
            // Not admitted (yet): its Register's caller went away.
            self.closed.insert(id);
            return;
        };
        let name = (key.0.clone(), key.1.clone());
        if let Some(stream) = self.streams.remove(&name) {
            self.lost.remove(&name);
            self.end_epoch_streams(&stream);
            let at = self.instant(self.now);
            self.departures.add(Departed { key, registered_at: stream.registered_at, at, left: false });
        }
    }

    /// `WatchEpochs`: the epoch stream `id` follows the command stream of `consumer` on
    /// `topic` held here, and is sent its epochs at once.
    pub(super) fn watch_epochs(&mut self, call: CallId, id: StreamId, consumer: String, topic: String) {
        let name = (topic, consumer);
        let Some(stream) = self.streams.get_mut(&name) else {
            let (topic, consumer) = name;
            let error =
                CoordinatorError::UnknownConsumer(ConsumerUnknown::NotRegisteredHere { consumer, topic });
            return self.reply(call, Err(error));
        };
        stream.epoch_streams.push((id, None));
        self.reply(call, Ok(Replied::WatchingEpochs));
        let mut changes = Changes::default();
        changes.topic(&name.0);
        self.tell_epochs(&changes);
    }

    /// Sends each epoch stream of a topic `changes` touched its epochs, if they changed.
    fn tell_epochs(&mut self, changes: &Changes) {
        let Some(cache) = self.cache.as_ref() else { return };
        let revision = u64::try_from(cache.revision).unwrap_or(0);
        for ((topic, consumer), stream) in self.streams.iter_mut() {
            if stream.epoch_streams.is_empty() || !changes.iter().any(|(t, _)| t == topic) {
                continue;
            }
            let entry = cache.topics.get(topic);
            let epochs = entry.map(|e| e.epochs_of(consumer, stream.incarnation_at)).unwrap_or_default();
            for (id, last) in
                stream.epoch_streams.iter_mut().filter(|(_, last)| last.as_ref() != Some(&epochs))
            {
                *last = Some(epochs.clone());
                let partitions = epochs.clone();
                self.out.push(Effect::Epochs { stream: *id, epochs: EpochsAt { revision, partitions } });
            }
        }
    }

    /// Ends the epoch streams of `stream`.
    fn end_epoch_streams(&mut self, stream: &Stream) {
        for (id, _) in &stream.epoch_streams {
            self.out.push(Effect::EndStream { stream: *id, reason: EndReason::Left, error: None });
        }
    }
}
