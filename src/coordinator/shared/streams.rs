//! The registry of the consumer streams one instance holds: one type for every backend.
//!
//! A stream is identified by (topic, consumer, session): the registry holds at most one
//! stream per (topic, consumer), and every removal names the session it means, so the
//! cleanup of a stale stream can never remove the newer one that replaced it. It is a
//! [`DashMap`]: gRPC handlers (register, disconnect) and the relay use it at once.
//!
//! When two registrations of one name meet on this instance, the one whose registration
//! was written last (the higher store revision) stays; the other ends with `ABORTED`.

use std::{collections::BTreeSet, sync::Arc};

use super::outgoing::{CommandSender, Outgoing, PassGate};

use dashmap::DashMap;
use tokio::sync::{oneshot, watch};

use super::transport::{EndWatch, Ends, Stop};

use crate::coordinator::CoordinatorError;
use crate::coordinator::causes::{Fence, NotReadingStream};
use crate::metrics::Metrics;
use crate::proto::v1::AssignmentCommand;
use crate::store::{Revision, SessionId};

/// A local stream's identity: topic, consumer and the session of its registration.
pub type StreamKey = (String, String, SessionId);

/// Why the server ended a stream; tells the stream's session task what to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// The consumer left (drained, or deregistered on the fleet): revoke the session.
    Left,
    /// A newer registration of the same name replaced this one: revoke the old session.
    Replaced,
    /// The consumer's registration is gone and could not be written again within a TTL
    /// ([`super::rebind`]): nothing left to do.
    Expired,
    /// This instance is shutting down: keep nothing alive, and let the TTL give the
    /// consumer time to reconnect elsewhere.
    Shutdown,
    /// The client went away, or this instance fenced itself, or the consumer stopped
    /// reading: the registration is kept for the TTL so the consumer can come back.
    Disconnected,
}

/// Why a stream must end, and the last item to send it, if any.
pub type Ending = (EndReason, Option<CoordinatorError>);

/// What a backend's stream remembers having told its consumer.
pub trait Told: Default + Send + Sync + 'static {
    /// The commands that tell the consumer it owns nothing any more (sent before a
    /// stream ends because it was replaced, fenced or its session is gone). At most one
    /// command: the channel keeps one slot for it ([`LocalStream::farewell`]).
    fn farewell(&self, topic: &str) -> Vec<AssignmentCommand>;

    /// Replaces what the consumer was told about `partitions` by `part` (what it was told
    /// about them alone), after a relay step that compared only them ([`Tell::within`]).
    fn patch(&mut self, partitions: &BTreeSet<u32>, part: Self);
}

impl Told for () {
    fn farewell(&self, _topic: &str) -> Vec<AssignmentCommand> {
        Vec::new()
    }

    fn patch(&mut self, _: &BTreeSet<u32>, _: Self) {}
}

/// What a stream remembers of what it told its consumer: the part of a stream the relay
/// steps change (`relay.rs` applies a step to it, `Book::apply`).
#[derive(Debug, Default)]
pub struct Book<T> {
    /// Whether the snapshot (always the first message) has been sent.
    pub activated: bool,
    /// What the consumer has been told so far.
    pub told: T,
    /// Whether `told` followed every relay step since the snapshot.
    pub told_complete: bool,
}

impl<T: Told> Book<T> {
    /// Forgets what the consumer was told, and returns the commands that tell it it owns
    /// nothing any more ([`Told::farewell`]; none before its snapshot).
    pub fn farewell(&mut self, topic: &str) -> Vec<AssignmentCommand> {
        let commands = if self.activated { self.told.farewell(topic) } else { Vec::new() };
        self.told = T::default();
        self.told_complete = false;
        commands
    }
}

/// A consumer stream held by this instance.
pub struct LocalStream<T> {
    /// The session its registration is bound to.
    pub session: SessionId,
    /// Store revision of the registration write. Before the cache reaches it, a missing
    /// or different record means "not seen yet"; after it, "replaced or expired".
    pub registered_at: Revision,
    /// Store revision of the registration that opened this stream: unlike
    /// `registered_at`, kept when a lost registration is written again. Epochs stored before
    /// it belong to an earlier incarnation of the name until raised (docs/design.md §10).
    pub incarnation_at: Revision,
    /// Whether the snapshot (always the first message) has been sent.
    pub activated: bool,
    /// How many fences had rung when the stream was admitted ([`Streams::fence`]): a later
    /// one ends it.
    pub fences_at: u64,
    /// Since when the store has lost this stream's registration while the stream is open
    /// (the instance lease expired before this instance fenced itself). The stream stays
    /// open and relayed while [`super::rebind`] writes the registration again.
    pub lost_since: Option<tokio::time::Instant>,
    /// The registration record as the cache last held it while it was this stream's, with
    /// its mod revision, when it said more than a fresh registration would (a drain, a
    /// restart hold, placement info; kept by the backend's relay, [`super::relay::Visit::keep`]).
    /// A lost registration is written again as this ([`super::rebind`]), so the consumer
    /// does not forget that it is draining.
    /// Boxed: most streams keep nothing, and every stream carries the field.
    pub kept: Option<Box<(Revision, Vec<u8>)>>,
    /// What the consumer has been told so far.
    pub told: T,
    /// Whether `told` followed every relay step since the snapshot. A step that told
    /// nothing (the cache had not reached a registration written again, [`super::rebind`])
    /// leaves it behind what changed meanwhile, until a step compares the whole view.
    pub told_complete: bool,
    /// The stream's sender.
    pub tx: CommandSender,
    /// Set when the consumer stopped reading and the buffer filled: the stream must end.
    overflowed: bool,
    /// Commands held back until every stream of the relay pass has heard its gains.
    pub(super) later: Vec<AssignmentCommand>,
    /// The gate of the relay pass visiting this stream: what it sends meanwhile is a gain.
    pub(super) pass: Option<PassGate>,
    /// Tells the session task why the stream ended (once).
    end: Option<oneshot::Sender<EndReason>>,
}

impl<T: Told> LocalStream<T> {
    /// A stream not yet activated, and the receiver its session task waits on.
    pub fn new(
        session: SessionId,
        registered_at: Revision,
        tx: CommandSender,
    ) -> (Self, oneshot::Receiver<EndReason>) {
        let (end, end_rx) = oneshot::channel();
        let stream = Self {
            session,
            registered_at,
            incarnation_at: registered_at,
            activated: false,
            fences_at: 0,
            lost_since: None,
            kept: None,
            told: T::default(),
            told_complete: true,
            tx,
            overflowed: false,
            later: Vec::new(),
            pass: None,
            end: Some(end),
        };
        (stream, end_rx)
    }

    /// Sends commands; a closed receiver means the client is gone, which its stream task
    /// notices. Beyond [`STREAM_BUFFER`](super::outgoing::STREAM_BUFFER) commands nothing is sent: the last two slots are
    /// kept for the farewell and the error that ends an overflowing stream.
    pub fn send(&mut self, commands: impl IntoIterator<Item = AssignmentCommand>) {
        for command in commands {
            let outgoing = match &self.pass {
                Some(gate) => gate.gain(command),
                None => Outgoing::free(Ok(command)),
            };
            self.push(outgoing);
        }
    }

    /// Sends `commands` as gains of `gate`, outside any relay pass: [`PassGate::taken`]
    /// then tells when the transport took them. False if the consumer stopped reading and
    /// they were not queued.
    pub fn send_held(
        &mut self,
        gate: &PassGate,
        commands: impl IntoIterator<Item = AssignmentCommand>,
    ) -> bool {
        for command in commands {
            self.push(gate.gain(command));
        }
        !self.overflowed
    }

    /// Puts one item in the channel, unless the consumer stopped reading: the last two
    /// slots are kept, for the farewell and for the error that ends the stream.
    fn push(&mut self, outgoing: Outgoing) {
        if self.overflowed || self.tx.capacity() <= 2 {
            self.overflowed = true;
            return;
        }
        let _ = self.tx.try_send(outgoing);
    }

    /// Holds `commands` back until the end of the relay pass ([`super::relay::RelayPass`]), or the
    /// next [`flush`](Self::flush).
    pub fn defer(&mut self, commands: impl IntoIterator<Item = AssignmentCommand>) {
        self.later.extend(commands);
    }

    /// Sends what [`defer`](Self::defer) held back.
    pub fn flush(&mut self) {
        let later = std::mem::take(&mut self.later);
        self.send(later);
    }

    /// Sends what [`defer`](Self::defer) held back as losses of the pass `gate`: each waits
    /// in the channel until the pass's gains were taken ([`super::outgoing`]).
    pub(super) fn flush_after(&mut self, gate: &PassGate) {
        for command in std::mem::take(&mut self.later) {
            self.push(gate.loss(command));
        }
    }

    /// The ending of a stream whose consumer stopped reading, if it did.
    pub(super) fn overflow(&self, topic: &str, consumer: &str) -> Option<Ending> {
        self.overflowed.then(|| {
            let error = CoordinatorError::NotReading(NotReadingStream::BufferFull {
                consumer: consumer.to_string(),
                topic: topic.to_string(),
            });
            (EndReason::Disconnected, Some(error))
        })
    }

    /// Tells the consumer it owns nothing any more ([`Told::farewell`]). Unlike
    /// [`send`](Self::send), this takes the slot `push` keeps for it, even when the buffer
    /// is full or overflowed: a consumer that is behind hears it (after its backlog) before
    /// the error that ends the stream, which keeps the last slot.
    pub fn farewell(&mut self, topic: &str) {
        let mut book = Book {
            activated: self.activated,
            told: std::mem::take(&mut self.told),
            told_complete: self.told_complete,
        };
        let commands = book.farewell(topic);
        (self.told, self.told_complete) = (book.told, book.told_complete);
        self.send_farewell(commands);
    }

    /// Sends a farewell's `commands` in the slot [`push`](Self::push) keeps for them.
    pub(super) fn send_farewell(&mut self, commands: Vec<AssignmentCommand>) {
        for command in commands {
            let outgoing = match &self.pass {
                Some(gate) => gate.gain(command),
                None => Outgoing::free(Ok(command)),
            };
            if self.tx.capacity() >= 2 {
                let _ = self.tx.try_send(outgoing);
            }
        }
    }

    /// Whether the stream is waiting for its registration to be written again.
    pub fn is_lost(&self) -> bool {
        self.lost_since.is_some()
    }

    fn finish(mut self, reason: EndReason, last: Option<CoordinatorError>) {
        if let Some(error) = last {
            let _ = self.tx.try_send(Outgoing::free(Err(error)));
        }
        if let Some(end) = self.end.take() {
            let _ = end.send(reason);
        }
    }
}

/// The error that ends a stream replaced by a newer registration of its name.
pub fn replaced_error(topic: &str, consumer: &str) -> CoordinatorError {
    CoordinatorError::Replaced { consumer: consumer.to_string(), topic: topic.to_string() }
}

/// The local streams, at most one per (topic, consumer).
pub struct Streams<S> {
    pub(super) map: DashMap<(String, String), S>,
    pub(super) metrics: Arc<Metrics>,
    /// Woken when a relay pass found a stream whose registration the store lost.
    pub(super) lost: tokio::sync::Notify,
    /// The bell every stream's transport reads ([`super::transport`]): rung by a fence or
    /// a stop, from any thread; the one thing here not written by the loop.
    ends: watch::Sender<Ends>,
    /// Held while a stream is admitted ([`Streams::admit`]) and while a fence rings
    /// ([`Streams::fence`]): a registration answered late (a slow store answer, a busy
    /// runtime) can then never slip its stream in after the fence rang.
    gate: std::sync::Mutex<()>,
    /// Registrations whose consumer left, not yet deleted: their stream's last commands
    /// are still on their way (`register.rs`), or the loop is deleting them
    /// (`departures.rs`); nothing else settles them meanwhile.
    departing: std::sync::Mutex<std::collections::HashSet<StreamKey>>,
}

impl<T: Told> Streams<LocalStream<T>> {
    /// An empty registry that keeps the `streams` gauge.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            map: DashMap::new(),
            metrics,
            lost: tokio::sync::Notify::new(),
            ends: watch::Sender::new(Ends::default()),
            gate: std::sync::Mutex::new(()),
            departing: Default::default(),
        }
    }

    /// Waits until a relay pass finds a stream whose registration the store lost.
    pub async fn lost_found(&self) {
        self.lost.notified().await
    }

    /// The streams whose registration the store lost, with since when.
    pub fn lost(&self) -> Vec<(StreamKey, tokio::time::Instant)> {
        self.map
            .iter()
            .filter_map(|e| {
                let (topic, consumer) = e.key().clone();
                e.lost_since.map(|since| ((topic, consumer, e.session), since))
            })
            .collect()
    }

    fn gauge(&self) {
        self.metrics.streams.set(self.map.len() as i64);
    }

    /// Adds a stream if `open()` says the instance may still serve it, checked under the
    /// same lock [`fence`](Self::fence) takes: either the stream is in before a fence
    /// rings, and the fence ends it, or `open()` already sees the fence and the stream is
    /// dropped, never relayed (`None`). `open()` must not block. Returns what the stream's
    /// transport watches to end ([`super::transport`]).
    pub fn admit(
        &self,
        topic: &str,
        consumer: &str,
        mut stream: LocalStream<T>,
        open: impl FnOnce() -> bool,
    ) -> Option<EndWatch> {
        let _gate = self.gate.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !open() {
            return None;
        }
        let watch = self.end_watch();
        stream.fences_at = watch.admitted_at();
        self.insert(topic, consumer, stream);
        Some(watch)
    }

    /// A receiver of the bell, for the loop to let the fenced streams go when it rings.
    pub fn bell(&self) -> watch::Receiver<Ends> {
        self.ends.subscribe()
    }

    /// What a stream admitted now watches to end: the fences rung after now, and a stop.
    pub fn end_watch(&self) -> EndWatch {
        let bell = self.ends.subscribe();
        let fences = bell.borrow().fences;
        EndWatch::new(bell, fences)
    }

    /// Adds a stream. Of two streams of one (topic, consumer), the one registered later
    /// stays and the other ends with `ABORTED` (its consumer is told it owns nothing).
    pub fn insert(&self, topic: &str, consumer: &str, mut stream: LocalStream<T>) {
        use dashmap::Entry;
        let ended = match self.map.entry((topic.to_string(), consumer.to_string())) {
            Entry::Vacant(slot) => {
                slot.insert(stream);
                None
            }
            Entry::Occupied(mut slot) => {
                if slot.get().registered_at > stream.registered_at {
                    stream.farewell(topic);
                    Some(stream)
                } else {
                    let mut old = slot.insert(stream);
                    old.farewell(topic);
                    Some(old)
                }
            }
        };
        if let Some(stream) = ended {
            tracing::info!(topic, consumer, "consumer stream replaced by a newer registration");
            stream.finish(EndReason::Replaced, Some(replaced_error(topic, consumer)));
        }
        self.gauge();
    }

    /// Ends and removes the stream `key` (if it is still there), telling its task why.
    pub fn end(&self, key: &StreamKey, reason: EndReason, last: Option<CoordinatorError>) {
        let (topic, consumer, session) = key;
        let removed = self.map.remove_if(&(topic.clone(), consumer.clone()), |_, s| s.session == *session);
        if let Some((_, stream)) = removed {
            if reason == EndReason::Left {
                // Marked before anyone can see the stream gone: its stream task hands it to the loop.
                self.set_departing(key, true);
            }
            tracing::info!(topic = %topic, consumer = %consumer, ?reason, "consumer stream ended");
            stream.finish(reason, last);
            self.gauge();
        }
    }

    /// Marks the registration `key`, whose consumer left, as departing ([`end`] does for a
    /// stream that ends so, `Core::leave` when it hands it to the loop), or no longer once
    /// the loop deleted it (`upkeep.rs`).
    ///
    /// [`end`]: Self::end
    pub fn set_departing(&self, key: &StreamKey, departing: bool) {
        let mut set = self.departing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if departing {
            set.insert(key.clone());
        } else {
            set.remove(key);
        }
    }

    /// Whether the registration `key` is this instance's to settle: its stream is held, or
    /// departing.
    pub fn holds(&self, key: &StreamKey) -> bool {
        self.contains(key)
            || self.departing.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(key)
    }

    /// Whether the stream `key` is held.
    pub fn contains(&self, key: &StreamKey) -> bool {
        self.map.get(&(key.0.clone(), key.1.clone())).is_some_and(|s| s.session == key.2)
    }

    /// The session of the stream `consumer` holds for `topic` here, if it holds one.
    pub fn session_of(&self, topic: &str, consumer: &str) -> Option<SessionId> {
        self.map.get(&(topic.to_string(), consumer.to_string())).map(|s| s.session)
    }

    /// Runs `f` on the stream `key`, if it is held.
    pub fn with<R>(&self, key: &StreamKey, f: impl FnOnce(&mut LocalStream<T>) -> R) -> Option<R> {
        let mut stream = self.map.get_mut(&(key.0.clone(), key.1.clone()))?;
        (stream.session == key.2).then(|| f(&mut stream))
    }

    /// The (topic, consumer) of every stream, in order.
    pub fn names(&self) -> Vec<(String, String)> {
        let mut names: Vec<_> = self.map.iter().map(|e| e.key().clone()).collect();
        names.sort_unstable();
        names
    }

    /// Fences every stream admitted so far (the instance lost its store session, see
    /// `lease.rs`, or cannot relay, see `upkeep.rs`): rings the bell their transports read,
    /// from any thread. Each transport sends what was queued, tells its consumer it owns
    /// nothing, and ends with `UNAVAILABLE` saying `why`; the loop removes them
    /// ([`reap_fenced`](Self::reap_fenced)); registrations are kept for the TTL.
    pub fn fence(&self, why: Fence) {
        let _gate = self.gate.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.ends.send_modify(|ends| {
            ends.fences += 1;
            ends.fence = Some(why);
        });
    }

    /// Removes the streams a fence ended ([`fence`](Self::fence)); their transports tell
    /// the consumers, their tasks hear `Disconnected` (the registration is kept for the TTL).
    pub fn reap_fenced(&self) {
        let fences = self.ends.borrow().fences;
        for (topic, consumer) in self.names() {
            let key = (topic, consumer);
            if let Some((_, stream)) = self.map.remove_if(&key, |_, s| s.fences_at < fences) {
                tracing::info!(topic = %key.0, consumer = %key.1, "fenced consumer stream removed");
                stream.finish(EndReason::Disconnected, None);
            }
        }
        self.gauge();
    }

    /// Lets every stream go, once the loop ended (the instance stopped): their transports
    /// end them ([`stop`](Self::stop)); their tasks are told nothing more to do.
    pub fn drop_all(&self) {
        for name in self.names() {
            if let Some((_, stream)) = self.map.remove(&name) {
                stream.finish(EndReason::Shutdown, None);
            }
        }
        self.gauge();
    }

    /// Ends every stream for good (the instance stops): their transports send what was
    /// queued and end with `UNAVAILABLE`. A crash wins over a graceful stop: the stream of a
    /// dead process just breaks.
    pub fn stop(&self, stop: Stop) {
        self.ends.send_modify(|ends| {
            if ends.stop.is_none() || stop == Stop::Crashed {
                ends.stop = Some(stop);
            }
        });
    }
}

#[cfg(test)]
#[path = "streams_tests.rs"]
mod tests;
