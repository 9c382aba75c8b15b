//! Placement metrics (docs/design.md §11).
//!
//! * Counters, updated by the leader as it writes its plans: partitions moved, by topic and
//!   reason (`join`, `leave`, `balance`, `rollout`, `failover`), and balance moves held
//!   back, by topic and why (`budget`, `cooldown`; each counted once when it starts being
//!   held back, not once per plan).
//! * Gauges, rebuilt at every scrape from the placement status ([`TopicPlacement`]), like
//!   the fleet gauges: the imbalance now, and under `shadow` the imbalance the load plan
//!   would reach and how many partitions it would move. Every instance reports them from
//!   its own copy of the store: aggregate with `max`.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::labels::{DeferredLabels, ModeLabels, MoveLabels, TopicLabels};
use crate::status::TopicPlacement;

/// A gauge of fractional values.
type FloatGauge = Gauge<f64, AtomicU64>;

/// The placement metrics.
#[derive(Debug)]
pub(super) struct PlacementMetrics {
    pub(super) moves: Family<MoveLabels, Counter>,
    pub(super) deferred: Family<DeferredLabels, Counter>,
    imbalance: Family<TopicLabels, FloatGauge>,
    shadow_imbalance: Family<TopicLabels, FloatGauge>,
    shadow_moves: Family<TopicLabels, Gauge>,
    /// 1, labelled with the topic's mode: the imbalance alert applies under `load` only
    /// (under `count` an uneven load is expected and nothing acts on it).
    mode: Family<ModeLabels, Gauge>,
}

impl PlacementMetrics {
    /// Registers them.
    pub(super) fn register(r: &mut Registry) -> Self {
        let moves = Family::<MoveLabels, Counter>::default();
        r.register("partition_moves", "Partitions moved by the leader, by topic and reason", moves.clone());
        let deferred = Family::<DeferredLabels, Counter>::default();
        r.register(
            "moves_deferred",
            "Balance moves held back by the per-minute budget or a cool-down, by topic and why",
            deferred.clone(),
        );
        let imbalance = Family::<TopicLabels, FloatGauge>::default();
        r.register(
            "load_imbalance",
            "Highest consumer load over its share (max/mean), by topic",
            imbalance.clone(),
        );
        let shadow_imbalance = Family::<TopicLabels, FloatGauge>::default();
        r.register(
            "shadow_load_imbalance",
            "Under --placement shadow: the imbalance the load plan would reach, by topic",
            shadow_imbalance.clone(),
        );
        let shadow_moves = Family::<TopicLabels, Gauge>::default();
        r.register(
            "shadow_moves",
            "Under --placement shadow: partitions the load plan would move, by topic",
            shadow_moves.clone(),
        );
        let mode = Family::<ModeLabels, Gauge>::default();
        r.register("placement_mode", "1, labelled with the topic's --placement mode", mode.clone());
        Self { moves, deferred, imbalance, shadow_imbalance, shadow_moves, mode }
    }

    /// Replaces the gauges with `placement`'s values.
    pub(super) fn refresh(&self, placement: &[TopicPlacement]) {
        self.imbalance.clear();
        self.shadow_imbalance.clear();
        self.shadow_moves.clear();
        self.mode.clear();
        for t in placement {
            let topic = TopicLabels { topic: t.topic.clone() };
            self.mode.get_or_create(&ModeLabels { topic: t.topic.clone(), mode: t.mode.clone() }).set(1);
            self.imbalance.get_or_create(&topic).set(t.imbalance);
            if let Some(plan) = &t.load_plan {
                self.shadow_imbalance.get_or_create(&topic).set(plan.imbalance_after);
                self.shadow_moves.get_or_create(&topic).set(plan.moves as i64);
            }
        }
    }
}
