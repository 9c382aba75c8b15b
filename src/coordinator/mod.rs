//! The coordinator: the one interface the gRPC layer talks to.
//!
//! [`ConsumerGroupCoordinator`] is what a backend provides: register a consumer and get its
//! command stream (first message: the snapshot), apply `PartitionReady` /
//! `PartitionReleased`, deregister, readiness, and a read-only status view for the admin
//! surface. One folder per backend, one for what they share:
//!
//! * [`machine`]: what the store-backed backends' state machines share (inputs, effects,
//!   the watchdog, the topic refresh) and the [`driver`](machine::driver) that runs either
//!   one: [`MachineCoordinator`] is the trait's implementation for every memory, etcd and
//!   fleet instance.
//! * `shared/`: the pieces both machines and their driver use — the cache contract, the
//!   relay as a pure step, the streams' books, channels and transports, the lease keeper,
//!   departures and the sweep, the topic record, readiness.
//! * [`handoff_backend`]: the warm-handoff backend over any `LeaseStore`; the `memory`
//!   and `etcd` backends are this one implementation with a different store. Its leader
//!   is election, reconcile and topic refresh.
//! * [`fleet_backend`]: per-partition leases claimed up to a fair share by the instance
//!   holding each consumer's stream; no leader, no warm handoffs.
//! * [`static_backend`]: fixed partitions from the environment ([`StaticCoordinator`]),
//!   no store, for local development.
//!
//! Each backend folder uses the same file names for the same jobs: `state.rs` (its cache of
//! the store), `records.rs` (its keys and records), `register.rs`, `relay.rs` (its relay
//! step), `calls.rs` (what it answers to the calls) and `status.rs`.

pub mod causes;
mod error;
pub mod fleet_backend;
pub mod handoff_backend;
pub mod machine;
mod shared;
pub mod static_backend;

pub use crate::status::{ConsumerStatusView, HandoffStatusView, StatusView, TopicPlacement, TopicStatus};
pub use error::{CoordinatorError, StreamEnd};
pub use fleet_backend::FleetConfig;
pub use handoff_backend::{HandoffConfig, leader_groups, records};
pub use machine::driver::front::MachineCoordinator;
pub use shared::topics::PartitionCounts;
pub use shared::validate::{validate_consumer_name, validate_topic_name};
/// The instance lease's periods, for a model of its keeper (`crate::sim`).
pub use shared::{keep_alive_period, lease::fence_after};
pub use static_backend::{StaticAssignment, StaticConfig, StaticCoordinator};

use std::{pin::Pin, time::Duration};

use async_trait::async_trait;
use futures::Stream;
use tokio::sync::watch;

use crate::proto::v1::{AssignmentCommand, DeregisterAction};

/// One partition a consumer owns or is warming, with the epoch of that ownership
/// (docs/design.md §10): greater than every earlier owner's, never 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PartitionEpoch {
    /// The partition.
    pub partition: u32,
    /// Its epoch; for a partition being warmed, the one the consumer will own it with.
    pub epoch: u64,
    /// Whether the consumer is warming it (it does not own it yet).
    pub warming: bool,
}

/// One snapshot of a consumer's epochs, with the store revision it was read at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochsAt {
    /// The revision of the cache the epochs were read from: every change up to it is in
    /// `partitions` (which may hold newer ones too, never older). Never goes down along one
    /// stream. A constant on a backend whose epochs never change.
    pub revision: u64,
    /// The partitions, in partition order.
    pub partitions: Vec<PartitionEpoch>,
}

/// The epochs of one consumer's partitions: a snapshot at once, then a new one after each
/// change. Ends with the consumer's registration on this instance.
pub type EpochStream = Pin<Box<dyn Stream<Item = EpochsAt> + Send>>;

/// Commands for one registered consumer. Ends when the server ends the registration
/// (drained: cleanly; replaced, expired or shutting down: with an error item).
pub type CommandStream = Pin<Box<dyn Stream<Item = Result<AssignmentCommand, CoordinatorError>> + Send>>;

/// What a backend provides to the gRPC layer (docs/design.md §2).
#[async_trait]
pub trait ConsumerGroupCoordinator: Send + Sync + 'static {
    /// Registers `consumer` for `topic` and returns its command stream; the first item is
    /// the snapshot of its partitions.
    async fn register(&self, consumer: &str, topic: &str) -> Result<CommandStream, CoordinatorError>;

    /// [`register`](Self::register), sent by the client process `incarnation` (the
    /// `INCARNATION_HEADER` of the request; 0: none): a registration that replaces one of
    /// the same process is a reconnect, any other a new incarnation of the name, whose
    /// epochs are raised (docs/design.md §10). Backends without epochs ignore it.
    async fn register_as(
        &self,
        consumer: &str,
        topic: &str,
        incarnation: u64,
    ) -> Result<CommandStream, CoordinatorError> {
        let _ = incarnation;
        self.register(consumer, topic).await
    }

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

    /// The epochs of the partitions `consumer` (registered on this instance) owns or is
    /// warming in `topic` ([`EpochStream`]). A backend without epochs answers
    /// [`CoordinatorError::NoEpochs`].
    async fn watch_epochs(&self, consumer: &str, topic: &str) -> Result<EpochStream, CoordinatorError> {
        let _ = (consumer, topic);
        Err(CoordinatorError::NoEpochs)
    }

    /// `consumer` is shutting down; the answer says whether to wait for the drain.
    async fn deregister(&self, consumer: &str) -> Result<DeregisterAction, CoordinatorError>;

    /// A read-only view of the state, for the admin surface.
    async fn status(&self) -> StatusView;

    /// How each topic is placed (loads, shares, the shadow load plan: docs/design.md §11),
    /// for `/status` and the placement gauges; empty for backends that do not place by load.
    async fn placement(&self) -> Vec<TopicPlacement> {
        Vec::new()
    }

    /// How long a consumer's session may outlive its stream (the backend's lease TTL), so
    /// a client can stop before the partitions can move; the gRPC layer announces it on
    /// `Register`. `None`: sessions never expire (fixed assignments).
    fn session_ttl(&self) -> Option<Duration> {
        None
    }

    /// Whether this instance serves, as a value that changes (shutdown clears it); what
    /// `/ready` and gRPC health report.
    fn readiness(&self) -> watch::Receiver<bool>;

    /// Stops serving: ends every stream with `UNAVAILABLE`, keeping consumer sessions
    /// alive for their TTL so consumers can reconnect to another instance. After
    /// `crash` (test backends), does nothing.
    async fn shutdown(&self);
}
