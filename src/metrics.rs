//! Prometheus metrics, served by the admin server at `/metrics`.

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};

/// The metrics one instance exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Warming handoffs started by the leader.
    pub handoffs_started: Counter,
    /// Handoffs flipped to their new owner by `PartitionReady`.
    pub handoffs_ready: Counter,
    /// Handoffs completed by `PartitionReleased`.
    pub handoffs_released: Counter,
    /// Warming handoffs cancelled (target died, drained or stopped being the target).
    pub handoffs_cancelled: Counter,
    /// Warming handoffs cancelled because they were not ready in time.
    pub warm_timeouts: Counter,
    /// Releasing handoffs completed without an acknowledgement because it timed out.
    pub release_timeouts: Counter,
    /// Partitions given to a consumer directly (no live owner to hand off from).
    pub direct_assignments: Counter,
    /// Leader reconcile transactions that failed their compare (stale state or deposed).
    pub reconcile_conflicts: Counter,
    /// 1 while this instance leads.
    pub is_leader: Gauge,
    /// Consumer streams held by this instance.
    pub streams: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `kafka_assigner` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kafka_assigner");
        let m = |registry: &mut Registry, name: &str, help: &str| {
            let c = Counter::default();
            registry.register(name, help, c.clone());
            c
        };
        let handoffs_started = m(&mut registry, "handoffs_started", "Warming handoffs started");
        let handoffs_ready = m(&mut registry, "handoffs_ready", "Handoffs flipped by PartitionReady");
        let handoffs_released =
            m(&mut registry, "handoffs_released", "Handoffs completed by PartitionReleased");
        let handoffs_cancelled = m(&mut registry, "handoffs_cancelled", "Warming handoffs cancelled");
        let warm_timeouts = m(&mut registry, "warm_timeouts", "Warming handoffs that timed out");
        let release_timeouts = m(
            &mut registry,
            "release_timeouts",
            "Releases completed without acknowledgement after the timeout",
        );
        let direct_assignments =
            m(&mut registry, "direct_assignments", "Partitions assigned with no live owner");
        let reconcile_conflicts =
            m(&mut registry, "reconcile_conflicts", "Leader transactions refused by their compare");
        let is_leader = Gauge::default();
        registry.register("is_leader", "1 while this instance leads", is_leader.clone());
        let streams = Gauge::default();
        registry.register("streams", "Consumer streams held by this instance", streams.clone());
        Self {
            registry,
            handoffs_started,
            handoffs_ready,
            handoffs_released,
            handoffs_cancelled,
            warm_timeouts,
            release_timeouts,
            direct_assignments,
            reconcile_conflicts,
            is_leader,
            streams,
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
