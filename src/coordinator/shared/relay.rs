//! The relay: after every revision, each local stream it concerns is told what changed.
//!
//! A backend's relay model looks at its cache and at what one stream has told its consumer
//! ([`StreamSeen`]) and answers a [`RelayStep`] (pure: no I/O, no stream touched). The
//! backend drives a [`RelayPass`] over the streams the revision concerns and applies each
//! step to its stream ([`Visit::apply`], [`LocalStream::apply`]); the pass
//! keeps the books (the gains-before-losses order, the streams to end). Nothing here calls
//! back into a backend.

use std::collections::BTreeSet;

use super::mirror::{Changes, Touched};
use super::outgoing::PassGate;
pub use super::streams::{EndReason, Ending};
use super::streams::{LocalStream, StreamKey, Streams, Told, replaced_error};
use crate::proto::v1::AssignmentCommand;
use crate::store::{Revision, SessionId};

/// What the relay model sees of one stream (read-only).
pub struct StreamSeen<'a, T> {
    /// The session its registration is bound to.
    pub session: SessionId,
    /// Store revision of the registration write.
    pub registered_at: Revision,
    /// Whether the snapshot has been sent.
    pub activated: bool,
    /// What the consumer has been told so far.
    pub told: &'a T,
    /// Whether `told` followed every relay step since the snapshot (then a step may
    /// compare only what a revision changed).
    pub told_complete: bool,
}

/// Where a stream's registration stands in the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Registration {
    /// The record is this stream's.
    Ours,
    /// The cache has not reached the registration's write yet: nothing to relay.
    NotYet,
    /// Another registration of the name took the record.
    Replaced,
    /// The record is gone (the store lost it with the instance lease): the stream stays
    /// open and relayed while `rebind.rs` writes it again.
    Lost,
}

impl<T> StreamSeen<'_, T> {
    /// Where this stream's registration stands, given the session of the name's record in
    /// a cache at `revision` (`None`: no record).
    pub fn registration(&self, record_session: Option<i64>, revision: Revision) -> Registration {
        match record_session {
            Some(session) if session == self.session.0 => Registration::Ours,
            _ if revision < self.registered_at => Registration::NotYet,
            Some(_) => Registration::Replaced,
            None => Registration::Lost,
        }
    }
}

/// The relay model's decision for one stream.
#[derive(Debug)]
pub enum RelayStep<T> {
    /// Nothing to tell (the cache has not reached the registration yet).
    Wait,
    /// A newer registration took the name: the consumer is told it owns nothing and the
    /// stream ends `ABORTED`.
    Replaced,
    /// The consumer left: it is told it owns nothing and the stream ends cleanly.
    Farewell,
    /// Tell the consumer something (possibly nothing new).
    Tell(Tell<T>),
}

/// Commands for one stream and what the consumer knows after them.
#[derive(Debug)]
pub struct Tell<T> {
    /// Sent now, the snapshot first when the stream is new: what the consumer gains.
    pub gains: Vec<AssignmentCommand>,
    /// Sent once every stream of the relay pass heard its gains: what it loses.
    pub losses: Vec<AssignmentCommand>,
    /// What the consumer has been told once these are sent: all of it, or with `within`
    /// its part in those partitions alone (the rest is unchanged).
    pub told: T,
    /// The partitions `told` is about, when it is a part ([`Told::patch`]).
    ///
    /// [`Told::patch`]: super::streams::Told::patch
    pub within: Option<std::collections::BTreeSet<u32>>,
    /// The store lost the registration: the stream is marked lost (and stays open).
    pub lost: bool,
    /// Why the stream ends after these commands, if it does.
    pub end: Option<Ending>,
}

impl<T> RelayStep<T> {
    /// The step for a stream whose registration is not [`Registration::Ours`] and not
    /// [`Registration::Lost`] (those relay on).
    pub fn not_relayed(registration: Registration) -> Option<Self> {
        match registration {
            Registration::NotYet => Some(Self::Wait),
            Registration::Replaced => Some(Self::Replaced),
            Registration::Ours | Registration::Lost => None,
        }
    }
}

impl<T: Told> Streams<LocalStream<T>> {
    /// A relay pass over the streams `changes` concerns ([`RelayPass`]): only the named
    /// consumers (a whole topic only when `changes` says so), so the work follows the
    /// change, not the number of streams.
    pub fn pass(&self, changes: &Changes) -> RelayPass<'_, T> {
        let whole: BTreeSet<&String> =
            changes.iter().filter(|(_, t)| matches!(t, Touched::All)).map(|(topic, _)| topic).collect();
        let mut concerned: Vec<(String, String)> = Vec::new();
        if !whole.is_empty() {
            concerned
                .extend(self.map.iter().map(|e| e.key().clone()).filter(|(topic, _)| whole.contains(topic)));
        }
        for (topic, touched) in changes.iter() {
            if let Touched::Consumers(names) = touched {
                concerned.extend(names.keys().map(|consumer| (topic.clone(), consumer.clone())));
            }
        }
        RelayPass {
            streams: self,
            concerned: concerned.into_iter(),
            book: PassBook {
                gate: PassGate::counting(self.metrics.losses_waited_out.clone()),
                deferred: Vec::new(),
                ended: Vec::new(),
                lost: false,
            },
        }
    }
}

/// One relay pass, driven by the backend's relay ([`Streams::pass`]): it visits each
/// stream the changes concern ([`next`](Self::next)), asks its relay model for the step
/// (pure: it only reads what the stream was told, [`super::relay`]) and applies it
/// ([`Visit::apply`]). Nothing is called back: the pass only keeps the books.
///
/// In two rounds: what a consumer gains (`assigned`, `WarmPartition`) is sent to every
/// stream as it is visited, what it loses ([`LocalStream::defer`]: `unassigned`,
/// `ReleasePartition`) only when the pass ends ([`finish`](Self::finish), or its drop),
/// and each loss waits in its channel until the transport took the pass's gains
/// ([`super::outgoing`]), so a partition moving between two consumers of this instance
/// never looks ownerless. Streams that must end are ended then too.
pub struct RelayPass<'s, T: Told> {
    streams: &'s Streams<LocalStream<T>>,
    /// The (topic, consumer) of the streams still to visit.
    concerned: std::vec::IntoIter<(String, String)>,
    book: PassBook,
}

/// What a relay pass settles at its end.
struct PassBook {
    /// The gains-before-losses gate of the pass.
    gate: PassGate,
    /// Streams holding losses back until the end of the pass.
    deferred: Vec<StreamKey>,
    /// Streams to end, and why.
    ended: Vec<(StreamKey, Ending)>,
    /// Whether a visited stream's registration is lost (`rebind.rs` writes it again).
    lost: bool,
}

/// One stream of a [`RelayPass`], held (its shard of the registry locked) until its step
/// is applied.
pub struct Visit<'p, T: Told> {
    topic: String,
    consumer: String,
    stream: dashmap::mapref::one::RefMut<'p, (String, String), LocalStream<T>>,
    book: &'p mut PassBook,
}

impl<'s, T: Told> RelayPass<'s, T> {
    /// The next stream to visit, while one the changes concern is still held.
    pub fn next(&mut self) -> Option<Visit<'_, T>> {
        for (topic, consumer) in self.concerned.by_ref() {
            let key = (topic, consumer);
            if let Some(stream) = self.streams.map.get_mut(&key) {
                let (topic, consumer) = key;
                return Some(Visit { topic, consumer, stream, book: &mut self.book });
            }
        }
        None
    }

    /// Ends the pass: the held-back losses go (each behind the pass's gains), then the
    /// streams that must end are ended. Dropping the pass does the same.
    pub fn finish(self) {}
}

impl<T: Told> Drop for RelayPass<'_, T> {
    fn drop(&mut self) {
        let book = &mut self.book;
        for key in std::mem::take(&mut book.deferred) {
            self.streams.with(&key, |stream| stream.flush_after(&book.gate));
        }
        // Removal takes the shard's lock: only after every visit has released it.
        for (key, (reason, last)) in std::mem::take(&mut book.ended) {
            self.streams.end(&key, reason, last);
        }
        if book.lost {
            self.streams.lost.notify_one();
        }
    }
}

impl<T: Told> Visit<'_, T> {
    /// The topic of the stream.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The consumer of the stream.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// What the relay model sees of the stream.
    pub fn seen(&self) -> StreamSeen<'_, T> {
        self.stream.seen()
    }

    /// Keeps what the stream's registration record says, as the cache holds it now at
    /// `mod_revision` (call it only while the record is this stream's): `encode` runs only
    /// when the record changed since it was last kept, and answers `None` when the record
    /// says nothing a fresh registration would not. A lost registration is written again
    /// as what was kept ([`super::rebind`]).
    pub fn keep(&mut self, mod_revision: Revision, encode: impl FnOnce() -> Option<Vec<u8>>) {
        let stream = &mut *self.stream;
        if stream.kept.as_ref().is_some_and(|kept| kept.0 == mod_revision) {
            return;
        }
        stream.kept = encode().map(|record| Box::new((mod_revision, record)));
    }

    /// Applies the relay model's `step` to the stream: its gains go now, its losses at the
    /// end of the pass, and so does its end if the step (or a full buffer) ends it.
    pub fn apply(mut self, step: RelayStep<T>) {
        let (topic, consumer) = (self.topic.as_str(), self.consumer.as_str());
        let stream = &mut *self.stream;
        stream.pass = Some(self.book.gate.clone());
        let end = stream.apply(topic, consumer, step);
        stream.pass = None;
        let end = end.or_else(|| stream.overflow(topic, consumer));
        let key = (self.topic.clone(), self.consumer.clone(), stream.session);
        if !stream.later.is_empty() {
            self.book.deferred.push(key.clone());
        }
        if let Some(end) = end {
            self.book.ended.push((key, end));
        } else if stream.is_lost() {
            self.book.lost = true;
        }
    }
}

impl<T> LocalStream<T> {
    /// What the relay model sees of this stream.
    pub fn seen(&self) -> StreamSeen<'_, T> {
        StreamSeen {
            session: self.session,
            registered_at: self.registered_at,
            activated: self.activated,
            told: &self.told,
            told_complete: self.told_complete,
        }
    }
}

/// What a stream remembers of what it told its consumer: the part of a stream the relay
/// steps change.
#[derive(Debug, Default)]
pub struct Book<T> {
    /// Whether the snapshot (always the first message) has been sent.
    pub activated: bool,
    /// What the consumer has been told so far.
    pub told: T,
    /// Whether `told` followed every relay step since the snapshot.
    pub told_complete: bool,
}

/// What a relay step says to send one stream, once applied to its [`Book`].
#[derive(Debug, Default)]
pub struct Said {
    /// Sent at once, in order: gains (and a farewell).
    pub now: Vec<AssignmentCommand>,
    /// Sent once every stream of the relay pass heard its gains: losses.
    pub later: Vec<AssignmentCommand>,
    /// The step says the store lost the registration.
    pub lost: bool,
    /// Why the stream ends after these, if it does.
    pub end: Option<Ending>,
}

impl<T: Told> Book<T> {
    /// Applies the relay model's `step` for `consumer` on `topic` (pure): what to send,
    /// and why the stream must end, if it must. The one rule for both the running
    /// instance's streams ([`LocalStream::apply`]) and the state machine's.
    pub fn apply(&mut self, topic: &str, consumer: &str, step: RelayStep<T>) -> Said {
        match step {
            RelayStep::Wait => {
                self.told_complete = false;
                Said::default()
            }
            RelayStep::Replaced => Said {
                now: self.farewell(topic),
                end: Some((EndReason::Replaced, Some(replaced_error(topic, consumer)))),
                ..Said::default()
            },
            RelayStep::Farewell => {
                Said { now: self.farewell(topic), end: Some((EndReason::Left, None)), ..Said::default() }
            }
            RelayStep::Tell(tell) => {
                self.activated = true;
                match tell.within {
                    Some(partitions) => self.told.patch(&partitions, tell.told),
                    None => {
                        self.told = tell.told;
                        self.told_complete = true;
                    }
                }
                Said { now: tell.gains, later: tell.losses, lost: tell.lost, end: tell.end }
            }
        }
    }

    /// Forgets what the consumer was told, and returns the commands that tell it it owns
    /// nothing any more ([`Told::farewell`]; none before its snapshot).
    pub fn farewell(&mut self, topic: &str) -> Vec<AssignmentCommand> {
        let commands = if self.activated { self.told.farewell(topic) } else { Vec::new() };
        self.told = T::default();
        self.told_complete = false;
        commands
    }
}

impl<T: Told> LocalStream<T> {
    /// Applies the relay model's `step` to this stream of `consumer` on `topic`; returns why
    /// the stream must end, if it must.
    pub fn apply(&mut self, topic: &str, consumer: &str, step: RelayStep<T>) -> Option<Ending> {
        let farewell = matches!(step, RelayStep::Replaced | RelayStep::Farewell);
        let mut book = Book {
            activated: self.activated,
            told: std::mem::take(&mut self.told),
            told_complete: self.told_complete,
        };
        let said = book.apply(topic, consumer, step);
        (self.activated, self.told, self.told_complete) = (book.activated, book.told, book.told_complete);
        if said.lost && self.lost_since.is_none() {
            tracing::warn!(topic, consumer, "the store lost this consumer's registration; writing it again");
            self.lost_since = Some(tokio::time::Instant::now());
        }
        if farewell {
            self.send_farewell(said.now);
        } else {
            self.send(said.now);
        }
        self.defer(said.later);
        said.end
    }
}
