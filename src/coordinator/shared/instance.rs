//! [`StoreCoordinator`]: the one implementation of [`ConsumerGroupCoordinator`] for the
//! store-backed backends.
//!
//! The handoff and fleet backends differ in what they decide (their [`Backend`]: records,
//! relay, status, and how their loop decides a call), not in their plumbing: registration,
//! the consumers' calls, readiness, the session TTL, shutdown and crash are the same code
//! for both, here and in the shared [`Core`]. A consumer's `PartitionReady`,
//! `PartitionReleased` or `Deregister` is checked here, then handed to the instance's loop
//! as a [`Call`] (an event of the loop, like a store change), which decides it, applies it
//! and answers.
//!
//! A local consumer's ownership epochs are served here as a stream (docs/design.md §10):
//! the backend's answer from its cache at once, then again after every change of the cache
//! that alters it. It ends when the consumer's stream on this instance ends (the epochs are
//! served by the instance that relays its commands, from the same cache) or the instance
//! stops.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use tokio::sync::{oneshot, watch};

use super::{mirror::MirrorCache, registrar::Registrar};
use crate::coordinator::causes::ConsumerUnknown;
use crate::coordinator::{
    CommandStream, ConsumerGroupCoordinator, CoordinatorError, EpochStream, EpochsAt, PartitionEpoch,
    StatusView, TopicPlacement, validate_consumer_name, validate_topic_name,
};
use crate::proto::v1::DeregisterAction;
use crate::store::StoreError;

/// What a consumer reports about a handoff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Report {
    /// `PartitionReady`: it finished warming the partition.
    Ready,
    /// `PartitionReleased`: it released the partition.
    Released,
}

/// What a call that reached no loop, or whose loop stopped before answering, is told.
pub(crate) fn stopping() -> StoreError {
    StoreError::Unavailable(crate::store::Unreachable::Stopping)
}

/// A consumer's call, its names checked, on its way into the instance's loop
/// ([`Core::call`](super::Core::call)) with where its answer goes.
#[derive(Debug)]
pub enum Call {
    /// `PartitionReady` or `PartitionReleased`.
    Handoff {
        /// What the consumer reports.
        report: Report,
        /// The consumer.
        consumer: String,
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// Where the answer goes.
        reply: oneshot::Sender<Result<(), CoordinatorError>>,
    },
    /// `Deregister`.
    Leave {
        /// The consumer.
        consumer: String,
        /// What the drain policy said ([`Backend::wants_drain`]).
        wants_drain: bool,
        /// Where the answer goes.
        reply: oneshot::Sender<Result<DeregisterAction, CoordinatorError>>,
    },
}

/// What a store-backed backend adds to the shared registration ([`Registrar`]): the status
/// view, and what its consumers' calls need before they reach its loop. The loop itself
/// takes the calls in ([`Core::calls`](super::Core::calls)).
#[async_trait]
pub trait Backend: Registrar {
    /// What the drain policy says of `consumer`'s `Deregister`, asked before the loop
    /// takes the call in (the policy may ask Kubernetes), or why the call is refused at
    /// once. A backend without drains answers `false`.
    async fn wants_drain(&self, consumer: &str) -> Result<bool, CoordinatorError> {
        let _ = consumer;
        Ok(false)
    }

    /// The read-only status view.
    fn status(&self) -> StatusView;

    /// The epochs of the partitions `consumer` owns or is warming in `topic`, from the
    /// cache (docs/design.md §10), in partition order, save those whose record was last
    /// written before `since` (the consumer's registration): those are an earlier
    /// incarnation's epochs, which a new incarnation is never told, until they are raised;
    /// `None` when the backend has no epochs.
    fn epochs(
        &self,
        topic: &str,
        consumer: &str,
        since: crate::store::Revision,
    ) -> Option<Vec<PartitionEpoch>> {
        let _ = (topic, consumer, since);
        None
    }

    /// How each topic is placed (the handoff backend's loads and shadow plan).
    fn placement(&self) -> Vec<TopicPlacement> {
        Vec::new()
    }

    /// What a graceful stop waits for beyond ending the streams (the handoff loop's end, after
    /// it resigned leadership).
    async fn on_shutdown(&self) {}

    /// What a crash drops beyond the streams (the handoff backend's leadership value).
    fn on_crash(&self) {}
}

/// A store-backed coordinator instance: its [`Backend`] over the shared core.
pub struct StoreCoordinator<B> {
    backend: Arc<B>,
}

impl<B> Clone for StoreCoordinator<B> {
    fn clone(&self) -> Self {
        Self { backend: self.backend.clone() }
    }
}

impl<B: Backend> StoreCoordinator<B> {
    /// Wraps a started backend.
    pub(crate) fn new(backend: Arc<B>) -> Self {
        Self { backend }
    }

    /// The backend.
    pub(crate) fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// Stops every task of this instance abruptly, as if the process died: streams break
    /// with an error, no session is revoked and no leadership resigned (sessions then
    /// expire after their TTL). A later `shutdown` does nothing. For failover tests.
    pub fn crash(&self) {
        self.backend.on_crash();
        self.backend.core().crash();
    }

    /// A `PartitionReady` or `PartitionReleased`: its names checked, then decided and
    /// applied by the instance's loop.
    async fn handoff_call(
        &self,
        report: Report,
        consumer: &str,
        topic: &str,
        partition: u32,
    ) -> Result<(), CoordinatorError> {
        validate_consumer_name(consumer)?;
        validate_topic_name(topic)?;
        let (reply, answer) = oneshot::channel();
        let (consumer, topic) = (consumer.to_string(), topic.to_string());
        self.to_loop(Call::Handoff { report, consumer, topic, partition, reply }, answer).await
    }

    /// Hands `call` to the instance's loop and waits for its `answer`.
    async fn to_loop<T>(
        &self,
        call: Call,
        answer: oneshot::Receiver<Result<T, CoordinatorError>>,
    ) -> Result<T, CoordinatorError> {
        self.backend.core().call(call).map_err(|_| stopping())?;
        answer.await.map_err(|_| stopping())?
    }
}

#[async_trait]
impl<B: Backend> ConsumerGroupCoordinator for StoreCoordinator<B> {
    async fn register(&self, consumer: &str, topic: &str) -> Result<CommandStream, CoordinatorError> {
        self.register_as(consumer, topic, 0).await
    }

    async fn register_as(
        &self,
        consumer: &str,
        topic: &str,
        incarnation: u64,
    ) -> Result<CommandStream, CoordinatorError> {
        super::register::register(&self.backend, consumer, topic, incarnation).await
    }

    async fn partition_ready(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
    ) -> Result<(), CoordinatorError> {
        self.handoff_call(Report::Ready, consumer, topic, partition).await
    }

    async fn partition_released(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
    ) -> Result<(), CoordinatorError> {
        self.handoff_call(Report::Released, consumer, topic, partition).await
    }

    async fn deregister(&self, consumer: &str) -> Result<DeregisterAction, CoordinatorError> {
        validate_consumer_name(consumer)?;
        let wants_drain = self.backend.wants_drain(consumer).await?;
        let (reply, answer) = oneshot::channel();
        self.to_loop(Call::Leave { consumer: consumer.to_string(), wants_drain, reply }, answer).await
    }

    async fn watch_epochs(&self, consumer: &str, topic: &str) -> Result<EpochStream, CoordinatorError> {
        watch_epochs(&self.backend, consumer, topic)
    }

    async fn status(&self) -> StatusView {
        self.backend.status()
    }

    async fn placement(&self) -> Vec<TopicPlacement> {
        self.backend.placement()
    }

    fn session_ttl(&self) -> Option<Duration> {
        Some(self.backend.core().lease_ttl())
    }

    fn readiness(&self) -> watch::Receiver<bool> {
        self.backend.core().readiness().subscribe()
    }

    async fn shutdown(&self) {
        if self.backend.core().begin_shutdown() {
            self.backend.on_shutdown().await;
        }
    }
}

/// The epochs of `consumer`'s partitions of `topic` ([`EpochStream`]), as `backend` reads
/// them from its cache ([`Backend::epochs`]). `consumer` must hold a stream for `topic` on
/// this instance (`UnknownConsumer` otherwise); a backend without epochs answers
/// `NoEpochs`.
fn watch_epochs<B: Backend>(
    backend: &Arc<B>,
    consumer: &str,
    topic: &str,
) -> Result<EpochStream, CoordinatorError> {
    let core = backend.core();
    let Some(session) = core.streams().session_of(topic, consumer) else {
        return Err(CoordinatorError::UnknownConsumer(ConsumerUnknown::NotRegisteredHere {
            consumer: consumer.to_string(),
            topic: topic.to_string(),
        }));
    };
    let key = (topic.to_string(), consumer.to_string(), session);
    // Closed when the consumer's stream ends (its receiver is dropped).
    let Some(commands) = core.streams().with(&key, |stream| stream.tx.clone()) else {
        return Err(CoordinatorError::UnknownConsumer(ConsumerUnknown::JustLeft {
            consumer: consumer.to_string(),
            topic: topic.to_string(),
        }));
    };
    if backend.epochs(topic, consumer, 0).is_none() {
        return Err(CoordinatorError::NoEpochs);
    }
    let state = Watching {
        backend: backend.clone(),
        changed: core.mirror().subscribe(),
        stopping: core.shutdown().clone(),
        commands,
        key,
        last: None,
    };
    Ok(Box::pin(futures::stream::unfold(state, Watching::next)))
}

/// What one epochs stream keeps between snapshots.
struct Watching<B> {
    backend: Arc<B>,
    /// The cache's revision: every change of it may change the epochs.
    changed: tokio::sync::watch::Receiver<crate::store::Revision>,
    stopping: tokio_util::sync::CancellationToken,
    /// The consumer's command sender: its closing ends the epochs too.
    commands: super::outgoing::CommandSender,
    key: super::streams::StreamKey,
    /// The last snapshot sent.
    last: Option<Vec<PartitionEpoch>>,
}

impl<B: Backend> Watching<B> {
    /// The next snapshot whose epochs differ from the last one's, or the end.
    async fn next(mut self) -> Option<(EpochsAt, Self)> {
        loop {
            if !self.backend.core().streams().contains(&self.key) {
                return None;
            }
            let (topic, consumer, _) = &self.key;
            let since = self.backend.core().streams().with(&self.key, |s| s.incarnation_at)?;
            // Read before the epochs, not after: the cache only moves forward, so the epochs
            // hold every change up to this revision (a change applied between the two reads,
            // or an own write applied ahead of the watch, makes them newer, never older).
            // Read after, it could be a later revision than the epochs were read at.
            let revision = self.backend.core().mirror().read().revision();
            let now = self.backend.epochs(topic, consumer, since)?;
            if self.last.as_ref() != Some(&now) {
                self.last = Some(now.clone());
                // Revisions are positive; 0 (never sent from a store) only if one were not.
                let revision = u64::try_from(revision).unwrap_or(0);
                return Some((EpochsAt { revision, partitions: now }, self));
            }
            tokio::select! {
                changed = self.changed.changed() => changed.ok()?,
                () = self.commands.closed() => return None,
                () = self.stopping.cancelled() => return None,
            }
        }
    }
}
