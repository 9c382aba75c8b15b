//! The coordinator: the one interface the gRPC layer talks to.
//!
//! [`ConsumerGroupCoordinator`] is what a backend provides: register a consumer and get its
//! command stream (first message: the snapshot), apply `PartitionReady` /
//! `PartitionReleased`, deregister, and a read-only status view for the admin surface.
//!
//! * [`HandoffCoordinator`] is the warm-handoff coordinator over any
//!   [`LeaseStore`](crate::store::LeaseStore): the `memory` and `etcd` backends are this one
//!   implementation with a different store.
//! * [`FleetCoordinator`] (`fleet` backend): per-partition leases in a `LeaseStore`,
//!   claimed up to a fair share by the instance holding each consumer's stream; no leader,
//!   no warm handoffs.
//! * [`StaticCoordinator`] (`static` backend): fixed partitions from the environment, no
//!   store, for local development.

pub mod cache;
mod cas;
pub mod fleet;
mod handoff_coordinator;
mod mirror;
pub mod records;
pub mod static_backend;
mod streams;
mod validate;
mod wire;

pub use fleet::{FleetConfig, FleetCoordinator};
pub use handoff_coordinator::{HandoffConfig, HandoffCoordinator};
pub use static_backend::{StaticAssignment, StaticConfig, StaticCoordinator};
pub use validate::{validate_consumer_name, validate_topic_name};

use std::pin::Pin;

use async_trait::async_trait;
use futures::Stream;
use serde::Serialize;

use crate::handoff::HandoffError;
use crate::proto::v1::{AssignmentCommand, DeregisterAction};
use crate::store::StoreError;

/// Commands for one registered consumer. Ends when the server ends the registration
/// (drained: cleanly; replaced, expired or shutting down: with an error item).
pub type CommandStream = Pin<Box<dyn Stream<Item = Result<AssignmentCommand, CoordinatorError>> + Send>>;

/// Errors of a coordinator, each mapping to one gRPC status code.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// The request is malformed (empty or invalid name, partition out of range).
    #[error("{0}")]
    InvalidArgument(String),
    /// A named thing does not exist (unknown topic, unknown consumer).
    #[error("{0}")]
    NotFound(String),
    /// The call is valid but not in the current state (not warming, not releasing).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The operation lost a race with a concurrent change; retrying may succeed.
    #[error("{0}")]
    Aborted(String),
    /// The store (or this instance) cannot serve the call right now.
    #[error("{0}")]
    Unavailable(String),
    /// The store returned something unexpected.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<StoreError> for CoordinatorError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Unavailable(_) | StoreError::Closed => {
                CoordinatorError::Unavailable(error.to_string())
            }
            other => CoordinatorError::Internal(other.to_string()),
        }
    }
}

impl CoordinatorError {
    /// Maps a refused handoff call, naming the topic in the message.
    pub fn from_handoff(topic: &str, error: HandoffError) -> Self {
        let message = format!("topic '{topic}': {error}");
        match error {
            HandoffError::PartitionOutOfRange { .. } => CoordinatorError::InvalidArgument(message),
            HandoffError::UnknownConsumer(_) => CoordinatorError::NotFound(message),
            HandoffError::NotWarmingTarget { .. } | HandoffError::NotReleasing { .. } => {
                CoordinatorError::FailedPrecondition(message)
            }
        }
    }
}

/// Read-only state for the admin surface.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StatusView {
    /// This instance's id.
    pub instance: String,
    /// The backend's name.
    pub backend: String,
    /// The leading instance, if known.
    pub leader: Option<String>,
    /// Whether this instance is ready to serve (store reachable, state loaded).
    pub ready: bool,
    /// Per-topic state.
    pub topics: Vec<TopicStatus>,
}

/// One topic in the [`StatusView`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct TopicStatus {
    /// Topic name.
    pub topic: String,
    /// Partition count.
    pub partition_count: u32,
    /// Registered consumers: name, status, holding instance.
    pub consumers: Vec<ConsumerStatusView>,
    /// Owner by partition (`None`: unowned).
    pub owners: Vec<Option<String>>,
    /// Handoffs in flight: partition, from, to, phase.
    pub handoffs: Vec<HandoffStatusView>,
}

/// A consumer in the [`StatusView`].
#[derive(Clone, Debug, Serialize)]
pub struct ConsumerStatusView {
    /// Consumer name.
    pub name: String,
    /// `Active` or `Draining`.
    pub status: String,
    /// The instance holding its stream.
    pub instance: String,
    /// Partitions it owns.
    pub partitions: usize,
}

/// A handoff in the [`StatusView`].
#[derive(Clone, Debug, Serialize)]
pub struct HandoffStatusView {
    /// Partition.
    pub partition: u32,
    /// Old owner.
    pub from: String,
    /// New owner.
    pub to: String,
    /// `Warming` or `Releasing`.
    pub phase: String,
    /// Unix milliseconds when the phase began.
    pub since: u64,
}

/// What a backend provides to the gRPC layer (DESIGN.md §2).
#[async_trait]
pub trait ConsumerGroupCoordinator: Send + Sync + 'static {
    /// Registers `consumer` for `topic` and returns its command stream; the first item is
    /// the snapshot of its partitions.
    async fn register(&self, consumer: &str, topic: &str) -> Result<CommandStream, CoordinatorError>;

    /// `consumer` finished warming `partition` of `topic`.
    async fn partition_ready(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
    ) -> Result<(), CoordinatorError>;

    /// `consumer` released `partition` of `topic`.
    async fn partition_released(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
    ) -> Result<(), CoordinatorError>;

    /// `consumer` is shutting down; the answer says whether to wait for the drain.
    async fn deregister(&self, consumer: &str) -> Result<DeregisterAction, CoordinatorError>;

    /// A read-only view of the state, for the admin surface.
    async fn status(&self) -> StatusView;

    /// Stops serving: ends every stream with `UNAVAILABLE`, keeping consumer sessions
    /// alive for their TTL so consumers can reconnect to another instance.
    async fn shutdown(&self);
}
