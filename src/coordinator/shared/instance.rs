//! [`StoreCoordinator`]: the one implementation of [`ConsumerGroupCoordinator`] for the
//! store-backed backends.
//!
//! The handoff and fleet backends differ in what they decide (their [`Backend`]: records,
//! relay, calls, status), not in their plumbing: registration, readiness, the session TTL,
//! shutdown and crash are the same code for both, here and in the shared [`Core`].

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
        super::epochs::watch(&self.backend, consumer, topic)
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
