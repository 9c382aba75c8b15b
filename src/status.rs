//! [`StatusView`]: the read-only state a coordinator shows the admin surface (`/status`),
//! and that the fleet gauges are rebuilt from at every scrape. Plain data, below both the
//! coordinator and the metrics.

use serde::Serialize;

use crate::handoff::{ConsumerStatus, Phase};

/// Read-only state for the admin surface.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StatusView {
    /// This instance's id.
    pub instance: String,
    /// The backend's name.
    pub backend: String,
    /// The leading instance, if known.
    pub leader: Option<String>,
    /// Whether this instance is ready to serve (the coordinator's readiness value).
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
    /// `Active` or `Draining` (a fleet consumer that deregistered shows as `Draining`).
    pub status: ConsumerStatus,
    /// The instance holding its stream.
    pub instance: String,
    /// Partitions it owns.
    pub partitions: usize,
    /// Its zone as stored in its record at registration (its pod's node's, under the
    /// Kubernetes integration), if known.
    pub zone: Option<String>,
    /// Its capacity as stored in its record at registration (default 1).
    pub capacity: u32,
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
    pub phase: Phase,
    /// Unix milliseconds when the phase began.
    pub since: u64,
}

/// How one topic is placed (the handoff backends, docs/design.md §11): what `/status`
/// shows under `placement` and the placement gauges are rebuilt from. Every instance
/// computes it from its own copy of the store, like the rest of the status.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TopicPlacement {
    /// Topic name.
    pub topic: String,
    /// `count`, `load` or `shadow` (`--placement`).
    pub mode: String,
    /// The total weight of the partitions (a partition with no stored weight weighs 1).
    pub total_weight: u64,
    /// The highest consumer load over its share (max/mean, with capacities); 1.0 is a
    /// perfect split, 0.0 when no consumer is active.
    pub imbalance: f64,
    /// Each registered consumer's load.
    pub consumers: Vec<ConsumerLoad>,
    /// Under `shadow`: what placement by load would do now (not acted on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_plan: Option<LoadPlanView>,
}

/// One consumer's load in a [`TopicPlacement`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct ConsumerLoad {
    /// Consumer name.
    pub name: String,
    /// Partitions it owns.
    pub partitions: usize,
    /// The total weight of the partitions it owns.
    pub load: u64,
    /// The weight it would carry in a perfect split (total weight × its capacity over the
    /// active consumers' capacities); 0 for a draining consumer.
    pub share: f64,
    /// `load / share` (0 for a draining consumer).
    pub normalized: f64,
}

/// What placement by load would do from the current state ([`TopicPlacement::load_plan`]).
#[derive(Clone, Debug, Default, Serialize)]
pub struct LoadPlanView {
    /// How many partitions it would move from their active owner.
    pub moves: usize,
    /// The imbalance it would reach.
    pub imbalance_after: f64,
    /// The moves it would make.
    pub would_move: Vec<MoveView>,
}

/// One move of a [`LoadPlanView`].
#[derive(Clone, Debug, Serialize)]
pub struct MoveView {
    /// Partition.
    pub partition: u32,
    /// Its owner now.
    pub from: String,
    /// The consumer it would move to.
    pub to: String,
}

/// The `/status` document: the [`StatusView`] and, from a handoff backend, `placement`.
#[derive(Clone, Debug, Serialize)]
pub struct StatusDocument {
    /// Everything of the status view, at the top level.
    #[serde(flatten)]
    pub view: StatusView,
    /// How each topic is placed (absent from backends that place no load).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<TopicPlacement>,
}
