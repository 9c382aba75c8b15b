//! [`StoreCoordinator`]: the one implementation of [`ConsumerGroupCoordinator`] for the
//! store-backed backends.
//!
//! The handoff and fleet backends differ in what they decide (their [`Backend`]: records,
//! relay, calls, status), not in their plumbing: registration, readiness, the session TTL,
//! shutdown and crash are the same code for both, here and in the shared [`Core`].
//!
//! A local consumer's ownership epochs are served here as a stream (docs/design.md §10):
//! the backend's answer from its cache at once, then again after every change of the cache
//! that alters it. It ends when the consumer's stream on this instance ends (the epochs are
//! served by the instance that relays its commands, from the same cache) or the instance
//! stops.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use tokio::sync::watch;

use super::registrar::Registrar;
use crate::coordinator::{
    CommandStream, ConsumerGroupCoordinator, CoordinatorError, EpochStream, PartitionEpoch, StatusView,
    TopicPlacement,
};
use crate::proto::v1::DeregisterAction;

/// What a consumer reports about a handoff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Report {
    /// `PartitionReady`: it finished warming the partition.
    Ready,
    /// `PartitionReleased`: it released the partition.
    Released,
}

/// A consumer's `PartitionReady` or `PartitionReleased`, as the backend receives it.
#[derive(Clone, Copy, Debug)]
pub struct HandoffCall<'a> {
    /// What it reports.
    pub report: Report,
    /// The consumer that reports it.
    pub consumer: &'a str,
    /// The topic.
    pub topic: &'a str,
    /// The partition.
    pub partition: u32,
}

/// What a store-backed backend decides on top of the shared registration ([`Registrar`]):
/// the consumer calls and the status view.
#[async_trait]
pub trait Backend: Registrar {
    /// A consumer's `PartitionReady` or `PartitionReleased`.
    async fn handoff_call(&self, call: HandoffCall<'_>) -> Result<(), CoordinatorError>;

    /// `consumer` is shutting down.
    async fn deregister(&self, consumer: &str) -> Result<DeregisterAction, CoordinatorError>;

    /// The read-only status view.
    fn status(&self) -> StatusView;

    /// The epochs of the partitions `consumer` owns or is warming in `topic`, from the
    /// cache (docs/design.md §10), in partition order; `None` when the backend has no
    /// epochs.
    fn epochs(&self, topic: &str, consumer: &str) -> Option<Vec<PartitionEpoch>> {
        let _ = (topic, consumer);
        None
    }

    /// How each topic is placed (the handoff backend's loads and shadow plan).
    fn placement(&self) -> Vec<TopicPlacement> {
        Vec::new()
    }

    /// What a graceful stop does beyond ending the streams (the handoff leader resigns).
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
}

#[async_trait]
impl<B: Backend> ConsumerGroupCoordinator for StoreCoordinator<B> {
    async fn register(&self, consumer: &str, topic: &str) -> Result<CommandStream, CoordinatorError> {
        super::register::register(&self.backend, consumer, topic).await
    }

    async fn partition_ready(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
    ) -> Result<(), CoordinatorError> {
        let call = HandoffCall { report: Report::Ready, consumer, topic, partition };
        self.backend.handoff_call(call).await
    }

    async fn partition_released(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
    ) -> Result<(), CoordinatorError> {
        let call = HandoffCall { report: Report::Released, consumer, topic, partition };
        self.backend.handoff_call(call).await
    }

    async fn deregister(&self, consumer: &str) -> Result<DeregisterAction, CoordinatorError> {
        self.backend.deregister(consumer).await
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
        return Err(CoordinatorError::UnknownConsumer(format!(
            "consumer '{consumer}' has no registration for topic '{topic}' on this assigner instance: \
             call Register first, on the instance you ask for its epochs"
        )));
    };
    let key = (topic.to_string(), consumer.to_string(), session);
    // Closed when the consumer's stream ends (its receiver is dropped).
    let Some(commands) = core.streams().with(&key, |stream| stream.tx.clone()) else {
        return Err(CoordinatorError::UnknownConsumer(format!(
            "consumer '{consumer}' of topic '{topic}' just left this assigner instance; register again"
        )));
    };
    if backend.epochs(topic, consumer).is_none() {
        return Err(CoordinatorError::NoEpochs(
            "this assigner's backend hands out no ownership epochs".into(),
        ));
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
    /// The next snapshot that differs from the last one, or the end.
    async fn next(mut self) -> Option<(Vec<PartitionEpoch>, Self)> {
        loop {
            if !self.backend.core().streams().contains(&self.key) {
                return None;
            }
            let (topic, consumer, _) = &self.key;
            let now = self.backend.epochs(topic, consumer)?;
            if self.last.as_ref() != Some(&now) {
                self.last = Some(now.clone());
                return Some((now, self));
            }
            tokio::select! {
                changed = self.changed.changed() => changed.ok()?,
                () = self.commands.closed() => return None,
                () = self.stopping.cancelled() => return None,
            }
        }
    }
}
