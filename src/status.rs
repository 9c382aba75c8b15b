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
