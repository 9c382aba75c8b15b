//! The leader's reconcile step: from the stored state and `now`, decide what moves.
//!
//! The targets come from the placement ([`plan_placed`], docs/design.md §11): the rollout
//! rule during a rollout, else by count (`count`, `shadow`) or by load (`load`).
//!
//! Per partition, in this order (docs/design.md §5):
//! 1. settle handoffs whose participants died, whose target is no longer the target, or
//!    whose time limit passed (a warm that never got ready is cancelled and the partition
//!    cools down before it is retried; a release never acknowledged is completed anyway);
//! 2. give partitions with no live owner straight to their target (nobody to hand off from);
//! 3. start a warming handoff for every partition whose live owner is not its target,
//!    at most `max_warming_per_consumer` per target at a time.
//!
//! Partitions with a handoff in flight are left alone, and nothing else waits for them:
//! one slow warm never blocks the rest of a rebalance.

use std::collections::{BTreeMap, BTreeSet};

use super::placement::{
    self, Holdings, LoadPreview, PlacementMemory, PlacementMode, PlacementReport, PlacementSettings,
};
use super::{Handoff, Millis, Phase, TopicState};
use crate::assignment::{Assignor, Balanced, ConsumerInfo, Placement, Rollout, RolloutRule};

/// Limits the leader applies to handoffs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanConfig {
    /// A warming handoff not ready after this long is cancelled.
    pub warm_timeout_ms: Millis,
    /// A releasing handoff not acknowledged after this long is completed anyway.
    pub release_timeout_ms: Millis,
    /// How many partitions one consumer may be warming at once (like Kafka Streams'
    /// `max.warmup.replicas`), so a new consumer is not asked to warm everything at once.
    pub max_warming_per_consumer: usize,
}

impl Default for PlanConfig {
    fn default() -> Self {
        Self { warm_timeout_ms: 300_000, release_timeout_ms: 60_000, max_warming_per_consumer: 4 }
    }
}

/// Partitions whose warm timed out, with the time before which no new handoff of them
/// starts. Kept in the leader's memory: losing it on failover only means an earlier retry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cooldowns(pub BTreeMap<u32, Millis>);

/// What one reconcile did, for logs and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanReport {
    /// Handoffs started (partition, from, to).
    pub started: Vec<(u32, String, String)>,
    /// Partitions given to a consumer directly, with no live owner to hand off from.
    pub assigned_directly: Vec<(u32, String)>,
    /// Warming handoffs cancelled because the target died, drained or stopped being the target.
    pub cancelled: Vec<u32>,
    /// Warming handoffs cancelled because they were not ready in time.
    pub warm_timeouts: Vec<u32>,
    /// Releasing handoffs completed without an acknowledgement (timeout or dead old owner).
    pub release_forced: Vec<u32>,
    /// Releasing handoffs that timed out (a subset of `release_forced`).
    pub release_timeouts: Vec<u32>,
}

impl PlanReport {
    /// Whether the reconcile changed nothing.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// What the assignors are given about a topic, built once per plan: the active consumers
/// with their info, the draining ones, the owners as if every warming handoff to an active
/// consumer had completed (so it counts towards its target's load), and those warms (kept
/// with their target first, so an in-flight move keeps its target).
struct Prepared {
    active: BTreeMap<String, ConsumerInfo>,
    draining: BTreeSet<String>,
    planned: BTreeMap<u32, String>,
    warming: BTreeSet<u32>,
}

impl Prepared {
    fn new(state: &TopicState) -> Self {
        let active: BTreeMap<String, ConsumerInfo> = state
            .consumers
            .keys()
            .filter(|c| state.is_active(c))
            .map(|c| (c.clone(), state.info.get(c).cloned().unwrap_or_default()))
            .collect();
        let draining: BTreeSet<String> =
            state.consumers.keys().filter(|c| !state.is_active(c)).cloned().collect();
        let mut planned = state.owners.clone();
        let mut warming = BTreeSet::new();
        for (partition, handoff) in &state.handoffs {
            if handoff.phase == Phase::Warming && state.is_active(&handoff.to) {
                planned.insert(*partition, handoff.to.clone());
                warming.insert(*partition);
            }
        }
        Self { active, draining, planned, warming }
    }

    fn topic<'a>(&'a self, state: &'a TopicState) -> Placement<'a> {
        Placement {
            partition_count: state.partition_count,
            weights: &state.weights,
            active: &self.active,
            draining: &self.draining,
            current: &self.planned,
            keep_first: &self.warming,
        }
    }
}

/// Target owner of each partition (see [`Prepared`]). During a `rollout`, the rollout rule
/// ([`RolloutRule`]): outgoing consumers receive nothing, the others are filled up to their
/// final share, and a draining consumer's partitions may wait (their target is then their
/// owner). Otherwise [`Balanced`].
fn targets(state: &TopicState, rollout: Option<&Rollout>) -> BTreeMap<u32, String> {
    let prepared = Prepared::new(state);
    let topic = prepared.topic(state);
    match rollout {
        None => Balanced.assign(&topic),
        Some(rollout) => RolloutRule(rollout).assign(&topic),
    }
}

/// Reconciles `state` at `now`, mutating it into the state the leader should write.
pub fn plan(
    state: &mut TopicState,
    now: Millis,
    config: &PlanConfig,
    cooldowns: &mut Cooldowns,
) -> PlanReport {
    plan_with(state, now, config, cooldowns, None)
}

/// [`plan`], during a `rollout` of the topic's consumers when one is given: the targets are
/// then the [`RolloutRule`]'s, so each partition moves once.
pub fn plan_with(
    state: &mut TopicState,
    now: Millis,
    config: &PlanConfig,
    cooldowns: &mut Cooldowns,
    rollout: Option<&Rollout>,
) -> PlanReport {
    prune(state, now, cooldowns);
    let target = targets(state, rollout);
    apply_targets(state, now, config, cooldowns, &target)
}

/// How the leader places partitions in [`plan_placed`] (docs/design.md §11).
#[derive(Clone, Copy, Debug)]
pub struct PlacementInputs<'a> {
    /// The mode and the tuning.
    pub settings: &'a PlacementSettings,
    /// The zone of each partition whose zone is known.
    pub zones: &'a BTreeMap<u32, String>,
    /// The leader's memory of the topic's recent moves (its budget and cool-downs).
    pub memory: &'a PlacementMemory,
}

/// [`plan_with`] under a placement mode: a rollout plans by the rollout rule as always;
/// otherwise `count` and `shadow` by [`Balanced`] (`shadow` computing the load plan
/// alongside, into the report only) and `load` by [`crate::assignment::LoadBalanced`]
/// within what is left of the budget and outside the cool-downs. The memory is only read:
/// the caller records the moves once they are written ([`PlacementMemory::record`]).
pub fn plan_placed(
    state: &mut TopicState,
    now: Millis,
    config: &PlanConfig,
    cooldowns: &mut Cooldowns,
    rollout: Option<&Rollout>,
    inputs: PlacementInputs<'_>,
) -> (PlanReport, PlacementReport) {
    prune(state, now, cooldowns);
    let prepared = Prepared::new(state);
    let topic = prepared.topic(state);
    let settings = inputs.settings;
    let holdings = Holdings::of(&topic, settings.mode);
    let mut placed = PlacementReport::default();
    let target = match (rollout, settings.mode) {
        (Some(rollout), _) => RolloutRule(rollout).assign(&topic),
        (None, PlacementMode::Count) => Balanced.assign(&topic),
        (None, PlacementMode::Shadow) => {
            let target = Balanced.assign(&topic);
            if !placement::uniform(&topic) {
                placed.shadow = Some(placement::preview(&topic, settings, inputs.zones));
            }
            target
        }
        (None, PlacementMode::Load) => {
            let (target, deferred) =
                placement::load_targets(&topic, settings, inputs.zones, inputs.memory, now);
            placed.deferred = deferred;
            target
        }
    };
    let report = apply_targets(state, now, config, cooldowns, &target);
    placed.moves = placement::classify(
        &report.started,
        &report.assigned_directly,
        &holdings,
        settings.mode,
        rollout.is_some(),
    );
    (report, placed)
}

/// The load plan of `state` as it stands (warms counted at their target), with a full
/// budget and nothing cooling down: what `shadow` publishes ([`placement::preview`]).
pub fn load_preview(
    state: &TopicState,
    settings: &PlacementSettings,
    zones: &BTreeMap<u32, String>,
) -> LoadPreview {
    let prepared = Prepared::new(state);
    placement::preview(&prepared.topic(state), settings, zones)
}

/// What every plan does first: expired cool-downs go, and records of partitions beyond
/// the count (never produced by us; defensive) too.
fn prune(state: &mut TopicState, now: Millis, cooldowns: &mut Cooldowns) {
    cooldowns.0.retain(|_, until| *until > now);
    state.owners.retain(|p, _| *p < state.partition_count);
    state.epochs.retain(|p, _| *p < state.partition_count);
    state.handoffs.retain(|p, _| *p < state.partition_count);
}

/// Steps 1 to 3 towards `target` (see the module docs).
fn apply_targets(
    state: &mut TopicState,
    now: Millis,
    config: &PlanConfig,
    cooldowns: &mut Cooldowns,
    target: &BTreeMap<u32, String>,
) -> PlanReport {
    let mut report = PlanReport::default();
    settle_handoffs(state, now, config, target, cooldowns, &mut report);

    for partition in 0..state.partition_count {
        let owner_live = state.owners.get(&partition).is_some_and(|o| state.is_live(o));
        if owner_live || state.handoffs.contains_key(&partition) {
            continue;
        }
        if let Some(to) = target.get(&partition) {
            state.owners.insert(partition, to.clone());
            state.epochs.insert(partition, state.next_epoch);
            report.assigned_directly.push((partition, to.clone()));
        }
    }

    let mut warming: BTreeMap<String, usize> = BTreeMap::new();
    for h in state.handoffs.values().filter(|h| h.phase == Phase::Warming) {
        *warming.entry(h.to.clone()).or_default() += 1;
    }
    for (partition, to) in target {
        let Some(owner) = state.owners.get(partition) else { continue };
        if owner == to || state.handoffs.contains_key(partition) || cooldowns.0.contains_key(partition) {
            continue;
        }
        let count = warming.entry(to.clone()).or_default();
        if *count >= config.max_warming_per_consumer {
            continue;
        }
        *count += 1;
        report.started.push((*partition, owner.clone(), to.clone()));
        let handoff = Handoff {
            from: owner.clone(),
            to: to.clone(),
            phase: Phase::Warming,
            since: now,
            epoch: state.next_epoch,
        };
        state.handoffs.insert(*partition, handoff);
    }
    report
}

/// Step 1 of [`plan`]: cancel, time out or complete the handoffs that cannot go on.
fn settle_handoffs(
    state: &mut TopicState,
    now: Millis,
    config: &PlanConfig,
    target: &BTreeMap<u32, String>,
    cooldowns: &mut Cooldowns,
    report: &mut PlanReport,
) {
    let handoffs: Vec<(u32, Handoff)> = state.handoffs.iter().map(|(p, h)| (*p, h.clone())).collect();
    for (partition, h) in handoffs {
        let owner = state.owners.get(&partition).cloned();
        let age = now.saturating_sub(h.since);
        match h.phase {
            Phase::Warming => {
                if owner.as_deref() != Some(h.from.as_str()) {
                    // The source no longer owns it (should not happen): drop the handoff;
                    // step 2 or a later plan fixes ownership.
                    state.handoffs.remove(&partition);
                    report.cancelled.push(partition);
                } else if !state.is_live(&h.from) && target.get(&partition) == Some(&h.to) {
                    // The owner died while the target warmed: the target takes it now.
                    // (If the target is no longer the target, the handoff is cancelled
                    // below and step 2 gives the orphan to its real target: one move.)
                    state.handoffs.remove(&partition);
                    state.owners.insert(partition, h.to.clone());
                    // The epoch it was warming for, as it was told.
                    state.epochs.insert(partition, h.epoch);
                    report.assigned_directly.push((partition, h.to.clone()));
                } else if !state.is_active(&h.to) || target.get(&partition) != Some(&h.to) {
                    state.handoffs.remove(&partition);
                    report.cancelled.push(partition);
                } else if age >= config.warm_timeout_ms {
                    state.handoffs.remove(&partition);
                    // Retry no sooner than another warm timeout from now (at least 1 s).
                    cooldowns.0.insert(partition, now + config.warm_timeout_ms.max(1_000));
                    report.warm_timeouts.push(partition);
                }
            }
            Phase::Releasing => {
                if owner.as_deref() != Some(h.to.as_str()) || !state.is_live(&h.to) {
                    // The new owner died mid-release: drop the handoff; step 2 gives the
                    // orphaned partition to its target in this same tick.
                    state.handoffs.remove(&partition);
                    report.cancelled.push(partition);
                } else if !state.is_live(&h.from) {
                    // Nobody left to acknowledge: the handoff is complete.
                    state.handoffs.remove(&partition);
                    report.release_forced.push(partition);
                } else if age >= config.release_timeout_ms {
                    state.handoffs.remove(&partition);
                    report.release_forced.push(partition);
                    report.release_timeouts.push(partition);
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
