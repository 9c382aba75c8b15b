//! The placement part of the status (docs/design.md §11): per topic, the mode, each
//! consumer's load and share, the imbalance, and under `shadow` the load plan. Computed on
//! request from this instance's cache (the states are copied under the lock, the plan is
//! computed after), so every instance answers the same for the same store; the load plan
//! shown has a full budget and no cool-downs (those are the leader's memory).

use std::collections::BTreeMap;

use super::state::Cache;
use crate::assignment::assignor::DEFAULT_WEIGHT;
use crate::assignment::{ConsumerInfo, Placement};
use crate::handoff::{PlacementMode, PlacementSettings, TopicState, load_preview};
use crate::status::{ConsumerLoad, LoadPlanView, MoveView, TopicPlacement};
use crate::weights::WeightSource;

/// Each configured topic's state in `cache`.
pub(crate) fn states_of(cache: &Cache) -> Vec<(String, TopicState)> {
    cache
        .topics
        .iter()
        .filter(|(_, e)| e.config.is_some())
        .map(|(topic, entry)| (topic.clone(), entry.state()))
        .collect()
}

/// The placement of every topic of `states` under `settings`, the zones (under `shadow`)
/// from `weights`.
pub(crate) fn placement_of(
    states: Vec<(String, TopicState)>,
    settings: &PlacementSettings,
    weights: Option<&dyn WeightSource>,
) -> Vec<TopicPlacement> {
    states
        .into_iter()
        .map(|(topic, state)| {
            let zones = match (settings.mode, weights) {
                (PlacementMode::Shadow, Some(source)) => source.zones(&topic).unwrap_or_default(),
                _ => BTreeMap::new(),
            };
            topic_placement(&topic, &state, settings, &zones)
        })
        .collect()
}

/// One topic's placement view (see the module docs).
pub(super) fn topic_placement(
    topic: &str,
    state: &TopicState,
    settings: &PlacementSettings,
    zones: &BTreeMap<u32, String>,
) -> TopicPlacement {
    let weight = |p: u32| state.weights.get(&p).copied().unwrap_or(DEFAULT_WEIGHT);
    let total: u64 = (0..state.partition_count).map(weight).sum();
    let info = |c: &str| state.info.get(c).cloned().unwrap_or_default();
    let active: BTreeMap<String, ConsumerInfo> =
        state.consumers.keys().filter(|c| state.is_active(c)).map(|c| (c.clone(), info(c))).collect();
    let capacities: u64 = active.values().map(|i| u64::from(i.capacity.max(1))).sum();
    let mut loads: BTreeMap<&str, (usize, u64)> =
        state.consumers.keys().map(|c| (c.as_str(), (0, 0))).collect();
    for (p, owner) in state.owners.range(..state.partition_count) {
        if let Some((count, load)) = loads.get_mut(owner.as_str()) {
            *count += 1;
            *load += weight(*p);
        }
    }
    let consumers = loads
        .into_iter()
        .map(|(name, (partitions, load))| {
            let share = match active.get(name) {
                Some(i) if capacities > 0 => total as f64 * f64::from(i.capacity.max(1)) / capacities as f64,
                _ => 0.0,
            };
            let normalized = if share > 0.0 { load as f64 / share } else { 0.0 };
            ConsumerLoad { name: name.to_string(), partitions, load, share, normalized }
        })
        .collect();
    let (draining, keep) = Default::default();
    let now = Placement {
        partition_count: state.partition_count,
        weights: &state.weights,
        active: &active,
        draining: &draining,
        current: &state.owners,
        keep_first: &keep,
    };
    let load_plan = (settings.mode == PlacementMode::Shadow).then(|| {
        let preview = load_preview(state, settings, zones);
        LoadPlanView {
            moves: preview.moves.len(),
            imbalance_after: preview.imbalance_after,
            would_move: preview
                .moves
                .into_iter()
                .map(|(partition, from, to)| MoveView { partition, from, to })
                .collect(),
        }
    });
    TopicPlacement {
        topic: topic.to_string(),
        mode: settings.mode.name().to_string(),
        total_weight: total,
        imbalance: crate::assignment::load::imbalance(&now, &state.owners),
        consumers,
        load_plan,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handoff::ConsumerStatus;

    #[test]
    fn loads_shares_and_the_shadow_plan() {
        let mut state = TopicState { partition_count: 4, ..Default::default() };
        for (c, status) in
            [("a", ConsumerStatus::Active), ("b", ConsumerStatus::Active), ("d", ConsumerStatus::Draining)]
        {
            state.consumers.insert(c.into(), status);
        }
        state.owners =
            [(0, "a"), (1, "a"), (2, "b"), (3, "d")].into_iter().map(|(p, o)| (p, o.into())).collect();
        state.weights = [(0, 10), (1, 10)].into_iter().collect();
        let shadow = PlacementSettings { mode: PlacementMode::Shadow, ..Default::default() };
        let view = topic_placement("t", &state, &shadow, &BTreeMap::new());
        assert_eq!((view.mode.as_str(), view.total_weight), ("shadow", 22));
        let a = &view.consumers[0];
        assert_eq!((a.name.as_str(), a.partitions, a.load, a.share), ("a", 2, 20, 11.0));
        assert!((view.imbalance - 20.0 / 11.0).abs() < 1e-9, "{view:?}");
        let d = &view.consumers[2];
        assert_eq!((d.name.as_str(), d.partitions, d.load, d.share, d.normalized), ("d", 1, 1, 0.0, 0.0));
        let plan = view.load_plan.expect("shadow shows the load plan");
        assert_eq!(plan.moves, 1, "{plan:?}");
        assert!(plan.imbalance_after <= 1.10 + 1e-9, "{plan:?}");
        let load = PlacementSettings { mode: PlacementMode::Load, ..shadow };
        assert!(topic_placement("t", &state, &load, &BTreeMap::new()).load_plan.is_none());
    }
}
