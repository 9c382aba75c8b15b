//! The fleet gauges, rebuilt from the coordinator's status view at every scrape.
//!
//! Rebuilding (clear, then set) rather than updating in place is what bounds the label
//! cardinality: a consumer or topic that is gone from the status view is gone from the
//! next scrape.

use prometheus_client::{
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

use std::{
    sync::atomic::AtomicU64,
    time::{SystemTime, UNIX_EPOCH},
};

use super::labels::{BackendLabels, ConsumerLabels, PhaseLabels, StatusLabels, TopicLabels};
use crate::handoff::Phase;
use crate::status::StatusView;

/// Gauges describing the fleet as this instance's cache sees it.
#[derive(Debug)]
pub(super) struct FleetGauges {
    owned_by_consumer: Family<ConsumerLabels, Gauge>,
    owned_by_topic: Family<TopicLabels, Gauge>,
    unowned: Family<TopicLabels, Gauge>,
    consumers: Family<StatusLabels, Gauge>,
    handoffs: Family<PhaseLabels, Gauge>,
    /// The age of the oldest handoff in each phase: the alert on a handoff stuck past its
    /// time limit needs an age, and the counts above cannot tell one stuck handoff from a
    /// stream of quick ones.
    oldest_handoff: Family<PhaseLabels, FloatGauge>,
    /// This instance's readiness (what `/ready` answers), for the readiness alert.
    ready: Gauge,
    /// 1, labelled with the backend: lets a rule select the backends that elect a leader.
    backend: Family<BackendLabels, Gauge>,
}

/// A gauge of fractional values.
type FloatGauge = Gauge<f64, AtomicU64>;

fn gauges<L: super::Labels>(registry: &mut Registry, name: &str, help: &str) -> Family<L, Gauge> {
    let f = Family::<L, Gauge>::default();
    registry.register(name, help, f.clone());
    f
}

impl FleetGauges {
    /// Registers the gauges.
    pub(super) fn register(r: &mut Registry) -> Self {
        Self {
            owned_by_consumer: gauges(r, "partitions_owned", "Partitions owned, by topic and consumer"),
            owned_by_topic: gauges(r, "topic_partitions_owned", "Partitions with an owner, by topic"),
            unowned: gauges(r, "partitions_unowned", "Partitions with no owner, by topic (should be 0)"),
            consumers: gauges(r, "consumers", "Registered consumers, by topic and status"),
            handoffs: gauges(r, "handoffs_in_flight", "Handoffs in flight, by topic and phase"),
            oldest_handoff: {
                let f = Family::<PhaseLabels, FloatGauge>::default();
                let help =
                    "Age of the oldest handoff in flight in its current phase, by topic and phase (0: none)";
                r.register("handoff_oldest_seconds", help, f.clone());
                f
            },
            ready: {
                let g = Gauge::default();
                r.register("ready", "1 while this instance is ready (what /ready answers)", g.clone());
                g
            },
            backend: gauges(r, "backend_info", "1, labelled with this instance's backend"),
        }
    }

    /// Replaces every series with the state in `status`.
    pub(super) fn refresh(&self, status: &StatusView) {
        self.owned_by_consumer.clear();
        self.owned_by_topic.clear();
        self.unowned.clear();
        self.consumers.clear();
        self.handoffs.clear();
        self.oldest_handoff.clear();
        self.backend.clear();
        self.ready.set(i64::from(status.ready));
        self.backend.get_or_create(&BackendLabels { backend: status.backend.clone() }).set(1);
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        for t in &status.topics {
            let topic = || TopicLabels { topic: t.topic.clone() };
            let owned = t.owners.iter().filter(|o| o.is_some()).count() as i64;
            self.owned_by_topic.get_or_create(&topic()).set(owned);
            self.unowned.get_or_create(&topic()).set(t.owners.len() as i64 - owned);
            for c in &t.consumers {
                let labels = ConsumerLabels { topic: t.topic.clone(), consumer: c.name.clone() };
                self.owned_by_consumer.get_or_create(&labels).set(c.partitions as i64);
                let status =
                    StatusLabels { topic: t.topic.clone(), status: format!("{:?}", c.status).to_lowercase() };
                self.consumers.get_or_create(&status).inc();
            }
            // Both phases are always present, so "0 releasing" is a series, not an absence.
            for (phase, name) in [(Phase::Warming, "warming"), (Phase::Releasing, "releasing")] {
                let in_phase = || t.handoffs.iter().filter(|h| h.phase == phase);
                let labels = PhaseLabels { topic: t.topic.clone(), phase: name.to_string() };
                self.handoffs.get_or_create(&labels).set(in_phase().count() as i64);
                // Phase starts are wall-clock (stored, so they survive failover); a clock
                // that went backwards gives 0, not a negative age.
                let oldest = in_phase().map(|h| now_ms.saturating_sub(h.since)).max().unwrap_or(0);
                self.oldest_handoff.get_or_create(&labels).set(oldest as f64 / 1000.0);
            }
        }
    }
}
