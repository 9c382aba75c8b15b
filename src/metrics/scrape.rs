//! The fleet gauges, rebuilt from the coordinator's status view at every scrape.
//!
//! Rebuilding (clear, then set) rather than updating in place is what bounds the label
//! cardinality: a consumer or topic that is gone from the status view is gone from the
//! next scrape.

use prometheus_client::{
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

use super::labels::{ConsumerLabels, PhaseLabels, StatusLabels, TopicLabels};
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
}

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
        }
    }

    /// Replaces every series with the state in `status`.
    pub(super) fn refresh(&self, status: &StatusView) {
        self.owned_by_consumer.clear();
        self.owned_by_topic.clear();
        self.unowned.clear();
        self.consumers.clear();
        self.handoffs.clear();
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
                let count = t.handoffs.iter().filter(|h| h.phase == phase).count();
                let labels = PhaseLabels { topic: t.topic.clone(), phase: name.to_string() };
                self.handoffs.get_or_create(&labels).set(count as i64);
            }
        }
    }
}
