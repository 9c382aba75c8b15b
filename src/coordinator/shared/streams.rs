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
    /// (the machine's rebind): nothing left to do.
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
    /// Whether the snapshot (always the first message) has been sent.
    pub activated: bool,
    /// What the consumer has been told so far.
    pub told: T,
    /// Whether `told` followed every relay step since the snapshot. A step that told
    /// nothing (the cache had not reached a registration written again)
    /// leaves it behind what changed meanwhile, until a step compares the whole view.
    pub told_complete: bool,
    /// The stream's sender.
    pub tx: CommandSender,
    /// Set when the consumer stopped reading and the buffer filled: the stream must end.
    overflowed: bool,
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
            activated: false,
            told: T::default(),
            told_complete: true,
            tx,
            overflowed: false,
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

    /// Puts one item in the channel, unless the consumer stopped reading: the last two
    /// slots are kept, for the farewell and for the error that ends the stream.
    fn push(&mut self, outgoing: Outgoing) {
        if self.overflowed || self.tx.capacity() <= 2 {
            self.overflowed = true;
            return;
        }
        let _ = self.tx.try_send(outgoing);
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
    /// The bell every stream's transport reads ([`super::transport`]): rung by a fence or
    /// a stop, from any thread.
    ends: watch::Sender<Ends>,
}

impl<T: Told> Streams<LocalStream<T>> {
    /// An empty registry that keeps the `streams` gauge.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { map: DashMap::new(), metrics, ends: watch::Sender::new(Ends::default()) }
    }

    fn gauge(&self) {
        self.metrics.streams.set(self.map.len() as i64);
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
            tracing::info!(topic = %topic, consumer = %consumer, ?reason, "consumer stream ended");
            stream.finish(reason, last);
            self.gauge();
        }
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

    /// Lets every stream go once the instance stopped: their transports
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
