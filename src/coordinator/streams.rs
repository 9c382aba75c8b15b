//! The registry of the consumer streams held by one instance, shared by the store-backed
//! coordinators. What a stream remembers, and why it ends, is each coordinator's own
//! ([`LocalStreamEnd`]); keeping, ending and relaying to them is the same everywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use tokio::sync::{mpsc, oneshot};

use super::CoordinatorError;
use crate::proto::v1::AssignmentCommand;
use crate::store::SessionId;

/// A local stream's key: topic, consumer *and* session, so the cleanup of a stale stream
/// can never remove the newer one that replaced it.
pub(crate) type StreamKey = (String, String, SessionId);

/// The sending half of a consumer's command stream.
pub(crate) type CommandSender = mpsc::UnboundedSender<Result<AssignmentCommand, CoordinatorError>>;

/// Why a stream must end, and the last item to send it, if any.
pub(crate) type Ending<R> = (R, Option<CoordinatorError>);

/// The part of a local stream the registry needs to end it.
pub(crate) trait LocalStreamEnd {
    /// Why the server ended a stream; tells the stream's task what to do with the session.
    type Reason: Copy + Debug;

    /// The stream's sender.
    fn sender(&self) -> &CommandSender;

    /// The channel that tells the stream's task why the stream ended (once).
    fn take_end(&mut self) -> Option<oneshot::Sender<Self::Reason>>;
}

/// The local streams, by [`StreamKey`].
pub(crate) struct Streams<S> {
    /// The streams.
    pub by_key: BTreeMap<StreamKey, S>,
}

impl<S> Default for Streams<S> {
    fn default() -> Self {
        Self { by_key: BTreeMap::new() }
    }
}

impl<S: LocalStreamEnd> Streams<S> {
    /// Ends and removes one stream (if it is still there), telling its task why.
    pub fn end(&mut self, key: &StreamKey, reason: S::Reason, last: Option<CoordinatorError>) {
        if let Some(mut stream) = self.by_key.remove(key) {
            if let Some(error) = last {
                let _ = stream.sender().send(Err(error));
            }
            if let Some(end) = stream.take_end() {
                let _ = end.send(reason);
            }
        }
    }

    /// Brings every stream of the given topics (all topics if `None`) up to date with
    /// `relay_one(topic, consumer, stream)`, then ends those it says must end.
    pub fn relay(
        &mut self,
        topics: Option<&BTreeSet<String>>,
        mut relay_one: impl FnMut(&str, &str, &mut S) -> Option<Ending<S::Reason>>,
    ) {
        let mut ended = Vec::new();
        for (key, stream) in self.by_key.iter_mut() {
            let (topic, consumer, _) = key;
            if topics.is_some_and(|t| !t.contains(topic)) {
                continue;
            }
            if let Some(end) = relay_one(topic, consumer, stream) {
                ended.push((key.clone(), end));
            }
        }
        for (key, (reason, last)) in ended {
            tracing::info!(topic = %key.0, consumer = %key.1, ?reason, "consumer stream ended");
            self.end(&key, reason, last);
        }
    }

    /// Drops every stream as a dead process would: each consumer gets an `UNAVAILABLE`
    /// error (a broken connection, never a clean end of stream, which would mean
    /// "drained"), and no task is told a reason, so no session is revoked.
    pub fn crash_all(&mut self) {
        for (_, stream) in std::mem::take(&mut self.by_key) {
            let _ =
                stream.sender().send(Err(CoordinatorError::Unavailable("assigner instance crashed".into())));
        }
    }

    /// Ends every stream with `UNAVAILABLE` (instance shutdown), telling each task
    /// `reason`.
    pub fn end_all(&mut self, instance_id: &str, reason: S::Reason) {
        let keys: Vec<_> = self.by_key.keys().cloned().collect();
        for key in keys {
            let error = CoordinatorError::Unavailable(format!(
                "assigner instance '{instance_id}' is shutting down; reconnect to another instance"
            ));
            self.end(&key, reason, Some(error));
        }
    }
}
