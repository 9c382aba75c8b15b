//! The registry of the consumer streams one instance holds: one type for every backend.
//!
//! A stream is identified by (topic, consumer, session): the registry holds at most one
//! stream per (topic, consumer), and every removal names the session it means, so the
//! cleanup of a stale stream can never remove the newer one that replaced it. It is a
//! [`DashMap`]: gRPC handlers (register, disconnect) and the relay use it at once.
//!
//! When two registrations of one name meet on this instance, the one whose registration
//! was written last (the higher store revision) stays; the other ends with `ABORTED`.

use std::{collections::BTreeSet, fmt::Debug, sync::Arc};

use super::mirror::{Changes, Touched};
use super::outgoing::{CommandSender, Outgoing, PassGate, STREAM_BUFFER};
use super::relay_step::{RelayStep, StreamSeen};

use dashmap::DashMap;
use tokio::sync::oneshot;

use crate::coordinator::{CoordinatorError, StreamEnd};
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
}

impl Told for () {
    fn farewell(&self, _topic: &str) -> Vec<AssignmentCommand> {
        Vec::new()
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
    /// Since when the store has lost this stream's registration while the stream is open
    /// (the instance lease expired before this instance fenced itself). The stream stays
    /// open and relayed while [`super::rebind`] writes the registration again.
    pub lost_since: Option<tokio::time::Instant>,
    /// What the consumer has been told so far.
    pub told: T,
    /// The stream's sender.
    pub tx: CommandSender,
    /// Set when the consumer stopped reading and the buffer filled: the stream must end.
    overflowed: bool,
    /// Commands held back until every stream of the relay pass has heard its gains.
    later: Vec<AssignmentCommand>,
    /// The gate of the relay pass visiting this stream: what it sends meanwhile is a gain.
    pass: Option<PassGate>,
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
            lost_since: None,
            told: T::default(),
            tx,
            overflowed: false,
            later: Vec::new(),
            pass: None,
            end: Some(end),
        };
        (stream, end_rx)
    }

    /// Sends commands; a closed receiver means the client is gone, which its stream task
    /// notices. Beyond [`STREAM_BUFFER`] commands nothing is sent: the last two slots are
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

    /// Holds `commands` back until the end of the relay pass ([`Streams::relay`]), or the
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
    fn flush_after(&mut self, gate: &PassGate) {
        for command in std::mem::take(&mut self.later) {
            self.push(gate.loss(command));
        }
    }

    /// The ending of a stream whose consumer stopped reading, if it did.
    fn overflow(&self, topic: &str, consumer: &str) -> Option<Ending> {
        self.overflowed.then(|| {
            let error = CoordinatorError::NotReading(format!(
                "consumer '{consumer}' of topic '{topic}' is not reading its stream ({STREAM_BUFFER} commands \
                 waiting): the stream is ended; its partitions are kept for the session TTL, reconnect to resume"
            ));
            (EndReason::Disconnected, Some(error))
        })
    }

    /// Tells the consumer it owns nothing any more ([`Told::farewell`]). Unlike
    /// [`send`](Self::send), this takes the slot `push` keeps for it, even when the buffer
    /// is full or overflowed: a consumer that is behind hears it (after its backlog) before
    /// the error that ends the stream, which keeps the last slot.
    pub fn farewell(&mut self, topic: &str) {
        if self.activated {
            for command in self.told.farewell(topic) {
                let outgoing = match &self.pass {
                    Some(gate) => gate.gain(command),
                    None => Outgoing::free(Ok(command)),
                };
                if self.tx.capacity() >= 2 {
                    let _ = self.tx.try_send(outgoing);
                }
            }
        }
        self.told = T::default();
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
    CoordinatorError::Replaced(format!(
        "consumer '{consumer}' registered again for topic '{topic}'; this stream was replaced"
    ))
}

/// The local streams, at most one per (topic, consumer).
pub struct Streams<S> {
    map: DashMap<(String, String), S>,
    metrics: Arc<Metrics>,
    /// Woken when a relay pass found a stream whose registration the store lost.
    lost: tokio::sync::Notify,
    /// Held while a stream is admitted ([`Streams::admit`]) and while every stream is
    /// fenced ([`Streams::fence_all`]): a registration answered late (a slow store answer,
    /// a busy runtime) can then never slip its stream in after the fence ran.
    gate: std::sync::Mutex<()>,
    /// Streams that ended because their consumer left, whose last commands are still on
    /// their way (`register.rs`): their registrations are their stream task's to delete.
    departing: std::sync::Mutex<std::collections::HashSet<StreamKey>>,
}

impl<T: Told> Streams<LocalStream<T>> {
    /// An empty registry that keeps the `streams` gauge.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            map: DashMap::new(),
            metrics,
            lost: tokio::sync::Notify::new(),
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
    /// same lock [`fence_all`](Self::fence_all) takes: either the stream is in before a
    /// fence removes every stream, or `open()` already sees the fence and the stream is
    /// handed back, never relayed. `open()` must not block.
    pub fn admit(
        &self,
        topic: &str,
        consumer: &str,
        stream: LocalStream<T>,
        open: impl FnOnce() -> bool,
    ) -> Result<(), LocalStream<T>> {
        let _gate = self.gate.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !open() {
            return Err(stream);
        }
        self.insert(topic, consumer, stream);
        Ok(())
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
                // Marked before anyone can see the stream gone: its stream task settles it.
                self.set_departing(key, true);
            }
            tracing::info!(topic = %topic, consumer = %consumer, ?reason, "consumer stream ended");
            stream.finish(reason, last);
            self.gauge();
        }
    }

    /// Marks the stream `key`, which ended because its consumer left, as departing ([`end`]
    /// does), or no longer once its registration was settled (its stream task does).
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

    /// Brings every stream `changes` concerns up to date with what the relay model `step`
    /// decides for it ([`super::relay_step`]; pure: it only reads what the stream was told),
    /// then ends those it says must end. Only the named consumers are visited
    /// (a whole topic only when `changes` says so), so the work follows the change, not
    /// the number of streams.
    ///
    /// In two rounds: what a consumer gains (`assigned`, `WarmPartition`) is sent to every
    /// stream first, what it loses ([`LocalStream::defer`]: `unassigned`, `ReleasePartition`)
    /// only after, and each loss waits in its channel until the transport took the pass's
    /// gains ([`super::outgoing`]), so a partition moving between two consumers of this
    /// instance never looks ownerless.
    pub fn relay(
        &self,
        changes: &Changes,
        mut step: impl FnMut(&str, &str, StreamSeen<'_, T>) -> RelayStep<T>,
    ) {
        let mut ended = Vec::new();
        let mut deferred = Vec::new();
        let gate = PassGate::new();
        let mut visit = |topic: &str, consumer: &str, stream: &mut LocalStream<T>| {
            stream.pass = Some(gate.clone());
            let decided = step(topic, consumer, stream.seen());
            let end = stream.apply(topic, consumer, decided);
            stream.pass = None;
            let end = end.or_else(|| stream.overflow(topic, consumer));
            let key = (topic.to_string(), consumer.to_string(), stream.session);
            if !stream.later.is_empty() {
                deferred.push(key.clone());
            }
            if let Some(end) = end {
                ended.push((key, end));
            } else if stream.is_lost() {
                self.lost.notify_one();
            }
        };
        let whole: BTreeSet<&String> =
            changes.iter().filter(|(_, t)| matches!(t, Touched::All)).map(|(topic, _)| topic).collect();
        if !whole.is_empty() {
            for mut entry in self.map.iter_mut() {
                let (topic, consumer) = entry.key().clone();
                if whole.contains(&topic) {
                    visit(&topic, &consumer, entry.value_mut());
                }
            }
        }
        for (topic, touched) in changes.iter() {
            let Touched::Consumers(names) = touched else { continue };
            for consumer in names {
                if let Some(mut stream) = self.map.get_mut(&(topic.clone(), consumer.clone())) {
                    visit(topic, consumer, &mut stream);
                }
            }
        }
        for key in deferred {
            self.with(&key, |stream| stream.flush_after(&gate));
        }
        // Removal takes the shard's lock: only after the iteration has released it.
        for (key, (reason, last)) in ended {
            self.end(&key, reason, last);
        }
    }

    /// Drops every stream as a dead process would: each consumer gets an `UNAVAILABLE`
    /// error (a broken connection, never a clean end of stream, which would mean
    /// "drained"), and no task is told a reason, so no session is revoked.
    pub fn crash_all(&self) {
        for name in self.names() {
            if let Some((_, stream)) = self.map.remove(&name) {
                let crashed =
                    CoordinatorError::StreamEnded(StreamEnd::Crashed, "assigner instance crashed".into());
                let _ = stream.tx.try_send(Outgoing::free(Err(crashed)));
            }
        }
        self.gauge();
    }

    /// Fences every stream: each consumer is told it owns nothing, then its stream ends
    /// with `UNAVAILABLE` saying `why` (the instance lost its store session, see
    /// `lease.rs`, or cannot relay, see `relay_watch.rs`); registrations are kept for the
    /// TTL.
    pub fn fence_all(&self, why: &str) {
        let _gate = self.gate.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (topic, consumer) in self.names() {
            if let Some((_, mut stream)) = self.map.remove(&(topic.clone(), consumer)) {
                stream.farewell(&topic);
                let error = CoordinatorError::StreamEnded(
                    StreamEnd::Fenced,
                    format!("{why}; stop processing and reconnect to another instance"),
                );
                stream.finish(EndReason::Disconnected, Some(error));
            }
        }
        self.gauge();
    }

    /// Ends every stream with `UNAVAILABLE` (instance shutdown).
    pub fn end_all(&self, instance_id: &str) {
        for (topic, consumer) in self.names() {
            if let Some((_, stream)) = self.map.remove(&(topic, consumer)) {
                let error = CoordinatorError::StreamEnded(
                    StreamEnd::Shutdown,
                    format!(
                        "assigner instance '{instance_id}' is shutting down; reconnect to another instance"
                    ),
                );
                stream.finish(EndReason::Shutdown, Some(error));
            }
        }
        self.gauge();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::{FutureExt, StreamExt};
    use tokio::sync::{mpsc::error::TryRecvError, oneshot};

    use super::{Changes, EndReason, LocalStream, STREAM_BUFFER, Streams};
    use crate::coordinator::shared::outgoing::{CommandReceiver, command_channel, command_stream};
    use crate::coordinator::shared::relay_step::{RelayStep, Tell};
    use crate::coordinator::shared::wire::update;
    use crate::coordinator::{CoordinatorError, StreamEnd};
    use crate::metrics::Metrics;
    use crate::proto::v1::AssignmentCommand;
    use crate::store::SessionId;

    /// A stream's channel, read without the gRPC layer.
    struct Rx(CommandReceiver);

    impl Rx {
        fn try_recv(&mut self) -> Result<Result<AssignmentCommand, CoordinatorError>, TryRecvError> {
            self.0.try_recv().map(|outgoing| outgoing.item)
        }
    }

    fn stream(session: i64, registered_at: i64) -> (LocalStream<()>, Rx, oneshot::Receiver<EndReason>) {
        let (tx, rx) = command_channel();
        let (stream, end) = LocalStream::new(SessionId(session), registered_at, tx);
        (stream, Rx(rx), end)
    }

    fn registry() -> (Streams<LocalStream<()>>, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        (Streams::new(metrics.clone()), metrics)
    }

    fn error_item(rx: &mut Rx) -> Option<CoordinatorError> {
        rx.try_recv().ok().and_then(Result::err)
    }

    #[test]
    fn the_later_registration_stays_and_the_other_ends_aborted() {
        let (streams, metrics) = registry();
        let (old, mut old_rx, mut old_end) = stream(1, 10);
        let (new, mut new_rx, _new_end) = stream(2, 11);
        streams.insert("t", "a", old);
        streams.insert("t", "a", new);
        assert!(matches!(error_item(&mut old_rx), Some(CoordinatorError::Replaced(_))));
        assert_eq!(old_end.try_recv(), Ok(EndReason::Replaced), "its session is revoked");
        assert!(new_rx.try_recv().is_err(), "the newer stream hears nothing");
        assert!(streams.contains(&("t".into(), "a".into(), SessionId(2))));
        // A registration that arrives late but was written earlier loses.
        let (stale, mut stale_rx, _stale_end) = stream(3, 5);
        streams.insert("t", "a", stale);
        assert!(matches!(error_item(&mut stale_rx), Some(CoordinatorError::Replaced(_))));
        assert!(streams.contains(&("t".into(), "a".into(), SessionId(2))));
        assert_eq!(metrics.streams.get(), 1);
    }

    #[test]
    fn ending_names_the_session_so_a_stale_cleanup_cannot_remove_the_newer_stream() {
        let (streams, _) = registry();
        let (s, _rx, _end) = stream(2, 11);
        streams.insert("t", "a", s);
        streams.end(&("t".into(), "a".into(), SessionId(1)), EndReason::Shutdown, None);
        assert!(streams.contains(&("t".into(), "a".into(), SessionId(2))), "session 1 is not the one held");
        streams.end(&("t".into(), "a".into(), SessionId(2)), EndReason::Shutdown, None);
        assert!(streams.names().is_empty());
    }

    #[test]
    fn relay_visits_the_given_topics_and_ends_what_it_says() {
        let (streams, _) = registry();
        let (a, _a_rx, mut a_end) = stream(1, 1);
        let (b, _b_rx, _b_end) = stream(2, 1);
        let (c, _c_rx, _c_end) = stream(3, 1);
        streams.insert("t", "a", a);
        streams.insert("t", "b", b);
        streams.insert("u", "c", c);
        let mut visited = Vec::new();
        let mut changes = Changes::default();
        changes.topic("t");
        streams.relay(&changes, |topic, consumer, _| {
            visited.push(format!("{topic}/{consumer}"));
            if consumer == "a" { RelayStep::Farewell } else { RelayStep::Wait }
        });
        visited.sort();
        assert_eq!(visited, ["t/a", "t/b"]);
        assert_eq!(a_end.try_recv(), Ok(EndReason::Left));
        assert_eq!(streams.names(), [("t".to_string(), "b".to_string()), ("u".to_string(), "c".to_string())]);
    }

    #[tokio::test(start_paused = true)]
    async fn in_one_pass_the_old_owner_hears_its_release_only_after_the_new_owner_took_its_assigned() {
        let (streams, _) = registry();
        let (old, old_rx, _old_end) = stream(1, 1);
        let (new, new_rx, _new_end) = stream(2, 1);
        streams.insert("t", "old", old);
        streams.insert("t", "new", new);
        let mut changes = Changes::default();
        changes.topic("t");
        // The old owner is visited first: the order of visits must not matter.
        streams.relay(&changes, |_, consumer, _| {
            let (gains, losses) = if consumer == "old" {
                (vec![], vec![update("t", [], [7])])
            } else {
                (vec![update("t", [7], [])], vec![])
            };
            RelayStep::Tell(Tell { gains, losses, told: (), lost: false, end: None })
        });
        let (mut old_rx, mut new_rx) = (command_stream(old_rx.0), command_stream(new_rx.0));
        assert!(old_rx.next().now_or_never().is_none(), "the release waits");
        let assigned = new_rx.next().await.and_then(Result::ok);
        assert_eq!(assigned, Some(update("t", [7], [])));
        let released = old_rx.next().now_or_never().flatten().and_then(Result::ok);
        assert_eq!(released, Some(update("t", [], [7])), "then it goes");
    }

    #[test]
    fn crash_breaks_every_stream_without_telling_any_task_and_shutdown_tells_them() {
        let (streams, metrics) = registry();
        let (a, mut a_rx, mut a_end) = stream(1, 1);
        streams.insert("t", "a", a);
        streams.crash_all();
        assert!(matches!(error_item(&mut a_rx), Some(CoordinatorError::StreamEnded(StreamEnd::Crashed, _))));
        assert!(a_end.try_recv().is_err(), "no reason: the session is left to expire");
        assert_eq!(metrics.streams.get(), 0);
        let (b, mut b_rx, mut b_end) = stream(2, 2);
        streams.insert("t", "b", b);
        streams.end_all("i-1");
        assert!(matches!(error_item(&mut b_rx), Some(CoordinatorError::StreamEnded(StreamEnd::Shutdown, _))));
        assert_eq!(b_end.try_recv(), Ok(EndReason::Shutdown));
        assert!(streams.names().is_empty());
    }

    #[test]
    fn a_consumer_that_stops_reading_is_ended_resource_exhausted() {
        let (streams, _) = registry();
        let (a, mut rx, mut end) = stream(1, 1);
        streams.insert("t", "a", a);
        let command = crate::coordinator::shared::wire::update("t", [0], []);
        for _ in 0..STREAM_BUFFER + 10 {
            let mut changes = Changes::default();
            changes.topic("t");
            streams.relay(&changes, |_, _, _| {
                RelayStep::Tell(Tell {
                    gains: vec![command.clone()],
                    losses: vec![],
                    told: (),
                    lost: false,
                    end: None,
                })
            });
        }
        assert!(streams.names().is_empty(), "the stream is ended");
        assert_eq!(end.try_recv(), Ok(EndReason::Disconnected), "its registration is kept for the TTL");
        let mut items = 0;
        let last = loop {
            match rx.try_recv() {
                Ok(Ok(_)) => items += 1,
                Ok(Err(error)) => break error,
                Err(e) => panic!("no error item after {items} commands: {e:?}"),
            }
        };
        assert_eq!(items, STREAM_BUFFER, "the buffer is bounded");
        assert!(matches!(last, CoordinatorError::NotReading(_)), "{last}");
    }

    /// What a test stream was told: whether it owns partition 0 (its farewell unassigns it).
    #[derive(Default)]
    struct OwnsZero(bool);

    impl super::Told for OwnsZero {
        fn farewell(&self, topic: &str) -> Vec<AssignmentCommand> {
            if self.0 { vec![update(topic, [], [0])] } else { Vec::new() }
        }
    }

    #[test]
    fn a_fenced_consumer_with_a_full_buffer_still_hears_its_farewell_before_the_end() {
        let streams: Streams<LocalStream<OwnsZero>> = Streams::new(Arc::new(Metrics::new()));
        let (tx, mut rx) = command_channel();
        let (mut a, _end) = LocalStream::new(SessionId(1), 1, tx);
        a.activated = true;
        a.told = OwnsZero(true);
        streams.insert("t", "a", a);
        let key = ("t".to_string(), "a".to_string(), SessionId(1));
        // The consumer is a whole buffer behind: every command fits, none was dropped.
        for _ in 0..STREAM_BUFFER {
            streams.with(&key, |s| s.send([update("t", [0], [])]));
        }
        streams.fence_all("i1");
        let mut items = Vec::new();
        while let Ok(outgoing) = rx.try_recv() {
            items.push(outgoing.item);
        }
        let n = items.len();
        assert!(n >= 2, "{n} items");
        assert!(
            matches!(&items[n - 2], Ok(c) if *c == update("t", [], [0])),
            "the farewell (unassigned 0) comes right before the end, got {:?}",
            items[n - 2]
        );
        assert!(items[..n - 2].iter().all(|i| matches!(i, Ok(c) if *c == update("t", [0], []))));
        assert_eq!(n - 2, STREAM_BUFFER, "the backlog is kept whole");
        let fenced = matches!(items[n - 1], Err(CoordinatorError::StreamEnded(super::StreamEnd::Fenced, _)));
        assert!(fenced, "then the stream ends as fenced: {:?}", items[n - 1]);
    }

    #[test]
    fn fencing_ends_streams_saying_so_for_the_metric() {
        let (streams, _metrics) = registry();
        let (a, mut a_rx, mut a_end) = stream(1, 1);
        streams.insert("t", "a", a);
        streams.fence_all("assigner instance 'i1' lost contact with its store");
        let ended =
            matches!(a_rx.try_recv(), Ok(Err(CoordinatorError::StreamEnded(super::StreamEnd::Fenced, _))));
        assert!(ended, "the stream ends as fenced");
        assert_eq!(a_end.try_recv(), Ok(EndReason::Disconnected), "the registration is kept for the TTL");
    }
}
