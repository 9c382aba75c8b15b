//! Placement modes in the plan: the budget and cool-downs, mode selection and how moves are
//! classified. Pure: times are plain numbers.

use std::collections::BTreeMap;

use super::*;
use crate::assignment::Rollout;
use crate::handoff::{
    ConsumerStatus, Cooldowns, PlacementInputs, PlanConfig, TopicState, plan_placed, plan_with,
};

fn cfg() -> PlanConfig {
    PlanConfig { warm_timeout_ms: 60_000, release_timeout_ms: 60_000, max_warming_per_consumer: 100 }
}

fn settings(mode: PlacementMode) -> PlacementSettings {
    PlacementSettings { mode, max_moves_per_minute: 10, move_cooldown_ms: 300_000, ..Default::default() }
}

/// Four partitions: 0 and 1 weigh 10, 2 and 3 weigh 1; `a` owns 0 and 1, `b` owns 2 and 3.
/// Balanced by count, not by load (a: 20, b: 2, shares 11: imbalance 1.82).
fn skewed() -> TopicState {
    let mut s = TopicState { partition_count: 4, ..Default::default() };
    for c in ["a", "b"] {
        s.consumers.insert(c.into(), ConsumerStatus::Active);
    }
    s.owners = [(0, "a"), (1, "a"), (2, "b"), (3, "b")].into_iter().map(|(p, o)| (p, o.into())).collect();
    s.weights = [(0, 10), (1, 10), (2, 1), (3, 1)].into_iter().collect();
    s
}

fn run(
    state: &mut TopicState,
    now: Millis,
    settings: &PlacementSettings,
    memory: &PlacementMemory,
    rollout: Option<&Rollout>,
) -> (crate::handoff::PlanReport, PlacementReport) {
    let zones = BTreeMap::new();
    let inputs = PlacementInputs { settings, zones: &zones, memory };
    plan_placed(state, now, &cfg(), &mut Cooldowns::default(), rollout, inputs)
}

#[test]
fn the_budget_is_a_sliding_minute_and_only_load_moves_spend_it() {
    let load = settings(PlacementMode::Load);
    let mut memory = PlacementMemory::default();
    memory.record(1_000, &[(0, MoveReason::Balance), (1, MoveReason::Join)], &load);
    memory.record(1_000, &[(2, MoveReason::Leave), (3, MoveReason::Failover)], &load);
    assert_eq!(memory.budget_left(1_000, 10), 8, "join and balance spend, leave and failover do not");
    assert_eq!(memory.budget_left(60_999, 10), 8);
    assert_eq!(memory.budget_left(61_000, 10), 10, "a minute later the moves no longer count");
    assert_eq!(memory.budget_left(1_000, 1), 0, "never below zero");
    let mut counted = PlacementMemory::default();
    counted.record(1_000, &[(0, MoveReason::Join)], &settings(PlacementMode::Shadow));
    assert_eq!(counted.budget_left(1_000, 10), 10, "count placement spends no budget");
    assert!(counted.cooling(1_000).is_empty(), "nor starts cool-downs");
}

#[test]
fn a_handoff_cools_down_for_the_cool_down_a_failover_does_not() {
    let load = settings(PlacementMode::Load);
    let mut memory = PlacementMemory::default();
    memory.record(
        1_000,
        &[(0, MoveReason::Balance), (1, MoveReason::Leave), (2, MoveReason::Failover)],
        &load,
    );
    assert_eq!(memory.cooling(1_000), [0, 1].into());
    assert_eq!(memory.cooling(300_999), [0, 1].into());
    assert!(memory.cooling(301_000).is_empty(), "the cool-down ended");
}

#[test]
fn a_deferral_is_counted_once_while_it_lasts() {
    let mut memory = PlacementMemory::default();
    let deferred: BTreeMap<u32, Deferral> = [(0, Deferral::Budget)].into();
    assert_eq!(memory.note_deferred(&deferred), vec![(0, Deferral::Budget)]);
    assert!(memory.note_deferred(&deferred).is_empty(), "the same deferral, next plan: not counted again");
    let changed: BTreeMap<u32, Deferral> = [(0, Deferral::Cooldown), (1, Deferral::Budget)].into();
    assert_eq!(memory.note_deferred(&changed), vec![(0, Deferral::Cooldown), (1, Deferral::Budget)]);
    memory.note_deferred(&BTreeMap::new());
    assert_eq!(memory.note_deferred(&deferred), vec![(0, Deferral::Budget)], "deferred again later: counted");
}

#[test]
fn count_and_shadow_place_by_count_load_places_by_load() {
    let memory = PlacementMemory::default();
    let mut counted = skewed();
    let (report, placed) = run(&mut counted, 0, &settings(PlacementMode::Count), &memory, None);
    assert!(report.is_empty() && placed.shadow.is_none(), "balanced by count: {report:?}");

    let mut shadowed = skewed();
    let (report, placed) = run(&mut shadowed, 0, &settings(PlacementMode::Shadow), &memory, None);
    assert!(report.is_empty(), "shadow acts by count: {report:?}");
    assert_eq!(shadowed, skewed(), "and changes nothing");
    let shadow = placed.shadow.expect("a shadow plan");
    assert_eq!(shadow.moves, vec![(0, "a".to_string(), "b".to_string())]);
    assert!((shadow.imbalance_before - 20.0 / 11.0).abs() < 1e-9, "{shadow:?}");
    assert!((shadow.imbalance_after - 12.0 / 11.0).abs() < 1e-9, "{shadow:?}");

    let mut loaded = skewed();
    let (report, placed) = run(&mut loaded, 0, &settings(PlacementMode::Load), &memory, None);
    assert_eq!(report.started, vec![(0, "a".to_string(), "b".to_string())], "the shadow plan, acted on");
    assert_eq!(placed.moves, vec![(0, MoveReason::Balance)], "b already held its count share");
    assert!(placed.deferred.is_empty() && placed.shadow.is_none());
}

#[test]
fn with_equal_weights_every_mode_is_todays_plan() {
    for mode in [PlacementMode::Count, PlacementMode::Load, PlacementMode::Shadow] {
        // a owns everything, b joins, c drains.
        let mut state = TopicState { partition_count: 7, ..Default::default() };
        for (c, status) in [("a", ConsumerStatus::Active), ("b", ConsumerStatus::Active)] {
            state.consumers.insert(c.into(), status);
        }
        state.consumers.insert("c".into(), ConsumerStatus::Draining);
        state.owners = (0..7).map(|p| (p, if p < 5 { "a" } else { "c" }.to_string())).collect();
        state.weights = (0..7).map(|p| (p, 3)).collect();
        let mut today = state.clone();
        let expected = plan_with(&mut today, 5, &cfg(), &mut Cooldowns::default(), None);
        // A budget of 0 and every partition cooling change nothing either.
        let mut memory = PlacementMemory::default();
        let tight = PlacementSettings { max_moves_per_minute: 1, ..settings(mode) };
        memory.record(0, &(0..7).map(|p| (p, MoveReason::Balance)).collect::<Vec<_>>(), &tight);
        let (report, placed) = run(&mut state, 5, &PlacementSettings { mode, ..tight }, &memory, None);
        assert_eq!(report, expected, "{mode:?}");
        assert_eq!(state, today, "{mode:?}");
        assert!(placed.deferred.is_empty(), "{mode:?}");
        assert!(placed.shadow.is_none(), "the load plan of a uniform topic is the count plan: {mode:?}");
    }
}

#[test]
fn a_spent_budget_defers_balance_moves_until_the_minute_has_passed() {
    let load = PlacementSettings { max_moves_per_minute: 1, ..settings(PlacementMode::Load) };
    let mut memory = PlacementMemory::default();
    memory.record(10_000, &[(9, MoveReason::Balance)], &load);
    let mut state = skewed();
    let (report, placed) = run(&mut state, 20_000, &load, &memory, None);
    assert!(report.is_empty(), "the budget is spent: {report:?}");
    assert_eq!(placed.deferred, [(0, Deferral::Budget)].into());
    let (report, placed) = run(&mut state, 70_000, &load, &memory, None);
    assert_eq!(report.started.len(), 1, "a minute after the last move: {report:?}");
    assert!(placed.deferred.is_empty());
}

#[test]
fn a_cooling_partition_waits_for_balance_but_never_for_failover() {
    let load = settings(PlacementMode::Load);
    let mut memory = PlacementMemory::default();
    memory.record(0, &[(0, MoveReason::Balance), (1, MoveReason::Balance)], &load);
    let mut state = skewed();
    let (report, placed) = run(&mut state, 1_000, &load, &memory, None);
    assert!(report.is_empty(), "both heavy partitions cool down: {report:?}");
    assert_eq!(placed.deferred, [(0, Deferral::Cooldown)].into());
    let (report, _) = run(&mut state, 300_000, &load, &memory, None);
    assert_eq!(report.started.len(), 1, "the cool-down ended: {report:?}");

    // a dies while its partitions cool down: b takes them at once.
    let mut state = skewed();
    state.consumers.remove("a");
    let (report, placed) = run(&mut state, 1_000, &load, &memory, None);
    assert_eq!(report.assigned_directly, vec![(0, "b".to_string()), (1, "b".to_string())]);
    assert_eq!(placed.moves, vec![(0, MoveReason::Failover), (1, MoveReason::Failover)]);
}

#[test]
fn moves_are_classified_join_leave_rollout_failover() {
    let load = settings(PlacementMode::Load);
    let memory = PlacementMemory::default();
    // b joins a that owns everything: under load, the moves to b are joins (b is below ⌊P/N⌋).
    let mut state = skewed();
    for p in 2..4 {
        state.owners.insert(p, "a".into());
    }
    let (_, placed) = run(&mut state.clone(), 0, &load, &memory, None);
    assert!(
        !placed.moves.is_empty() && placed.moves.iter().all(|(_, r)| *r == MoveReason::Join),
        "{placed:?}"
    );
    let (_, placed) = run(&mut state.clone(), 0, &settings(PlacementMode::Count), &memory, None);
    assert_eq!(placed.moves.len(), 2);
    assert!(placed.moves.iter().all(|(_, r)| *r == MoveReason::Join), "{placed:?}");
    // a drains: its partitions leave.
    let mut draining = state.clone();
    draining.consumers.insert("a".into(), ConsumerStatus::Draining);
    let (_, placed) = run(&mut draining, 0, &load, &memory, None);
    assert_eq!(placed.moves.len(), 4);
    assert!(placed.moves.iter().all(|(_, r)| *r == MoveReason::Leave), "{placed:?}");
    // During a rollout, a handoff is a rollout move whatever the mode.
    let rollout = Rollout { outgoing: ["a".to_string()].into(), final_members: 1 };
    let (report, placed) = run(&mut state.clone(), 0, &load, &memory, Some(&rollout));
    assert_eq!(report.started.len(), 4, "{report:?}");
    assert!(placed.moves.iter().all(|(_, r)| *r == MoveReason::Rollout), "{placed:?}");
    // Nobody owns anything yet: every partition is placed directly.
    let mut fresh = skewed();
    fresh.owners.clear();
    let (_, placed) = run(&mut fresh, 0, &load, &memory, None);
    assert_eq!(placed.moves.len(), 4);
    assert!(placed.moves.iter().all(|(_, r)| *r == MoveReason::Failover), "{placed:?}");
}
