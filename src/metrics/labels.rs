//! Label sets of the metric families, and the histogram buckets.
//!
//! Every label's values come from a small closed set (operations, methods, codes,
//! phases, statuses) or from the live fleet (topic and consumer names), and the live ones
//! are rebuilt from the status view at each scrape: nothing grows without bound.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::histogram::{Histogram, exponential_buckets},
};

/// A store operation (`get`, `get_prefix`, `txn`, `watch`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// The `LeaseStore` method.
    pub op: &'static str,
}

/// A failed store operation and what kind of failure it was.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreErrorLabels {
    /// The `LeaseStore` method.
    pub op: &'static str,
    /// `unavailable`, `session_expired`, `compacted`, `invalid` or `closed`.
    pub kind: &'static str,
}

/// A finished gRPC call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GrpcLabels {
    /// The RPC (`Register`, `PartitionReady`, ...).
    pub method: &'static str,
    /// The gRPC status code name (`OK`, `NOT_FOUND`, ...).
    pub code: &'static str,
}

/// Why a `Register` stream ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// `drained`, `replaced`, `expired`, `shutdown`, `fenced`, `crashed`, `unavailable`,
    /// `client_gone` or `error`.
    pub reason: &'static str,
}

/// What became of a change to the gRPC TLS files.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TlsReloadLabels {
    /// `reloaded`, or `refused` (the files cannot be used yet: the previous ones stay).
    pub result: &'static str,
}

/// The stream limit that refused a `Register`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// `max_streams` or `max_streams_per_ip`.
    pub limit: &'static str,
}

/// A `Deregister` decision and why it was taken.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DrainLabels {
    /// `wait_for_drain` or `shutdown_now`.
    pub decision: &'static str,
    /// What decided it (`policy`, `statefulset_restart`, `api_forbidden`, ...).
    pub reason: &'static str,
}

/// The backend an instance runs.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    /// `memory`, `etcd`, `fleet` or `static`.
    pub backend: String,
}

/// A topic's placement mode.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    /// The topic.
    pub topic: String,
    /// `count`, `load` or `shadow` (`--placement`).
    pub mode: String,
}

/// One topic.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabels {
    /// The topic.
    pub topic: String,
}

/// One consumer of one topic.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConsumerLabels {
    /// The topic.
    pub topic: String,
    /// The consumer.
    pub consumer: String,
}

/// Consumers of a topic in one status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    /// The topic.
    pub topic: String,
    /// `Active` or `Draining` (lower-cased).
    pub status: String,
}

/// Handoffs of a topic in one phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// The topic.
    pub topic: String,
    /// `warming` or `releasing`.
    pub phase: String,
}

/// A partition move of a topic.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MoveLabels {
    /// The topic.
    pub topic: String,
    /// `join`, `leave`, `balance`, `rollout` or `failover`.
    pub reason: &'static str,
}

/// A balance move held back.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeferredLabels {
    /// The topic.
    pub topic: String,
    /// `budget` or `cooldown`.
    pub why: &'static str,
}

/// Buckets for store requests and the handoff fast path: 0.25 ms to about 4 s.
pub fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_25, 2.0, 15))
}

/// Buckets for warms and whole handoffs, which wait on the consumer: 10 ms to about 3 h.
pub fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 21))
}
