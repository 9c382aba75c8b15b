//! Placement by load in the leader's plan (docs/design.md §11): the mode, its settings, the
//! leader's memory of recent moves (a per-minute budget and per-partition cool-downs), and
//! how each move is classified. Pure: the time is an input, the memory is the caller's.
//!
//! * `count`: [`crate::assignment::Balanced`], as before placement by load existed.
//! * `load`: [`LoadBalanced`], with `cooling` = the partitions whose cool-down has not
//!   ended and `max_moves` = what is left of the topic's budget for this minute.
//! * `shadow` (the default): places by count and computes the load plan alongside
//!   ([`preview`]) without acting on it, so operators can watch it before switching.
//!
//! The memory lives in the leader: a new leader starts with a fresh budget and no
//! cool-downs, which can only permit a move earlier than the old leader would have.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::Millis;
use crate::assignment::assignor::DEFAULT_WEIGHT;
use crate::assignment::load::imbalance;
use crate::assignment::{Assignor, LoadBalanced, LoadSettings, Placement};

/// The budget's window: moves started less than this long ago count against it.
const BUDGET_WINDOW_MS: Millis = 60_000;

/// How the leader places partitions (`--placement`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PlacementMode {
    /// By partition count ([`crate::assignment::Balanced`]).
    Count,
    /// By load ([`LoadBalanced`]).
    Load,
    /// By count, with the load plan computed and published but not acted on.
    #[default]
    Shadow,
}

impl PlacementMode {
    /// `count`, `load` or `shadow`, as the flag spells it.
    pub fn name(self) -> &'static str {
        match self {
            PlacementMode::Count => "count",
            PlacementMode::Load => "load",
            PlacementMode::Shadow => "shadow",
        }
    }
}

/// The placement settings of the leader's plan (from `--placement`, `--load-tolerance`,
/// `--load-min-gain`, `--max-moves-per-minute`, `--move-cooldown`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlacementSettings {
    /// Which placement acts.
    pub mode: PlacementMode,
    /// [`LoadSettings::tolerance`].
    pub tolerance: f64,
    /// [`LoadSettings::min_gain`].
    pub min_gain: f64,
    /// Moves of a partition away from a live, active owner that one topic may start per
    /// minute under `load` (failover and drains are never held back).
    pub max_moves_per_minute: usize,
    /// How long a partition that was handed off may not move again for balance.
    pub move_cooldown_ms: Millis,
}

impl Default for PlacementSettings {
    fn default() -> Self {
        Self {
            mode: PlacementMode::Shadow,
            tolerance: 0.10,
            min_gain: 0.01,
            max_moves_per_minute: 10,
            move_cooldown_ms: 300_000,
        }
    }
}

impl PlacementSettings {
    /// The [`LoadSettings`] of a plan allowed `max_moves` balance moves.
    pub fn load(&self, max_moves: Option<usize>) -> LoadSettings {
        LoadSettings { tolerance: self.tolerance, min_gain: self.min_gain, max_moves }
    }
}

/// Why a partition moved (the `reason` label of `kafka_assigner_partition_moves_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum MoveReason {
    /// A handoff from an active owner to a consumer still filling up to its count share
    /// (it joined); under `count` and `shadow`, every handoff between active consumers.
    Join,
    /// A handoff away from a draining consumer.
    Leave,
    /// Under `load`, a handoff between active consumers to a consumer that already held its
    /// count share: made for the balance of load.
    Balance,
    /// A handoff planned by the rollout rule (a generation of consumers is replaced).
    Rollout,
    /// A partition given with no live owner to hand off from (its owner died, or it never
    /// had one: a new topic or new partitions).
    Failover,
}

impl MoveReason {
    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            MoveReason::Join => "join",
            MoveReason::Leave => "leave",
            MoveReason::Balance => "balance",
            MoveReason::Rollout => "rollout",
            MoveReason::Failover => "failover",
        }
    }
}

/// Why a move the load plan wanted was not made (the `why` label of
/// `kafka_assigner_moves_deferred_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Deferral {
    /// The topic's moves for this minute are spent.
    Budget,
    /// The partition moved less than a cool-down ago.
    Cooldown,
}

impl Deferral {
    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Deferral::Budget => "budget",
            Deferral::Cooldown => "cooldown",
        }
    }
}

/// The leader's memory of one topic's recent moves under `load` (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct PlacementMemory {
    /// When each join or balance move of the last minute started.
    budget: VecDeque<Millis>,
    /// Until when each recently handed-off partition cools down.
    cooldowns: BTreeMap<u32, Millis>,
    /// Partitions whose wanted move is being held back, and why (each is counted once).
    deferred: BTreeMap<u32, Deferral>,
}

impl PlacementMemory {
    /// Balance and join moves that may still start in the minute before `now`.
    pub fn budget_left(&self, now: Millis, per_minute: usize) -> usize {
        let spent = self.budget.iter().filter(|at| now < **at + BUDGET_WINDOW_MS).count();
        per_minute.saturating_sub(spent)
    }

    /// The partitions still cooling down at `now`.
    pub fn cooling(&self, now: Millis) -> BTreeSet<u32> {
        self.cooldowns.iter().filter(|(_, until)| now < **until).map(|(p, _)| *p).collect()
    }

    /// Records the moves a plan made (once they are written): under `load`, each handoff
    /// starts the partition's cool-down, and joins and balance moves spend the budget.
    /// Failover starts no cool-down: nobody had warmed the partition to lose.
    pub fn record(&mut self, now: Millis, moves: &[(u32, MoveReason)], settings: &PlacementSettings) {
        self.budget.retain(|at| now < *at + BUDGET_WINDOW_MS);
        self.cooldowns.retain(|_, until| now < *until);
        if settings.mode != PlacementMode::Load {
            return;
        }
        for (p, reason) in moves {
            if matches!(reason, MoveReason::Join | MoveReason::Balance) {
                self.budget.push_back(now);
            }
            if *reason != MoveReason::Failover {
                self.cooldowns.insert(*p, now + settings.move_cooldown_ms);
            }
        }
    }

    /// Notes the moves held back by the latest plan; returns those that were not held back
    /// (for that reason) by the plan before: each deferral is counted once, not once per plan.
    pub fn note_deferred(&mut self, deferred: &BTreeMap<u32, Deferral>) -> Vec<(u32, Deferral)> {
        let new = deferred.iter().filter(|(p, why)| self.deferred.get(p) != Some(why)).map(|(p, w)| (*p, *w));
        let new = new.collect();
        self.deferred = deferred.clone();
        new
    }
}

/// What the load plan would do from the current state, without doing it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadPreview {
    /// Partitions it would take from their active owner: (partition, from, to).
    pub moves: Vec<(u32, String, String)>,
    /// The imbalance (max/mean of normalized load) now.
    pub imbalance_before: f64,
    /// The imbalance it would reach.
    pub imbalance_after: f64,
}

/// The placement side of one plan.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlacementReport {
    /// Every handoff started and every direct assignment, classified.
    pub moves: Vec<(u32, MoveReason)>,
    /// Under `load`: moves the plan wanted but held back, and why.
    pub deferred: BTreeMap<u32, Deferral>,
    /// Under `shadow`, when weights or capacities differ: the load plan, not acted on (with
    /// every weight and capacity equal it is the count plan itself, and is not computed).
    pub shadow: Option<LoadPreview>,
}

/// Whether every partition weighs the same and every active consumer has the same
/// capacity: then [`LoadBalanced`] is exactly [`crate::assignment::Balanced`], and neither
/// the budget nor the cool-downs play a part.
pub fn uniform(topic: &Placement<'_>) -> bool {
    let stored = topic.weights.range(..topic.partition_count);
    let all_stored = stored.clone().count() == topic.partition_count as usize;
    let mut weights = stored.map(|(_, w)| *w);
    let weights_equal = match weights.next() {
        None => true,
        Some(first) => (all_stored || first == DEFAULT_WEIGHT) && weights.all(|w| w == first),
    };
    let mut caps = topic.active.values().map(|info| info.capacity.max(1));
    let first = caps.next();
    weights_equal && caps.all(|c| Some(c) == first)
}

/// Partitions `target` takes away from an active owner in `topic.current`.
pub fn live_moves(topic: &Placement<'_>, target: &BTreeMap<u32, String>) -> BTreeSet<u32> {
    topic
        .current
        .range(..topic.partition_count)
        .filter(|(p, owner)| topic.active.contains_key(*owner) && target.get(p) != Some(*owner))
        .map(|(p, _)| *p)
        .collect()
}

/// The targets under `load`: [`LoadBalanced`] with what is left of the budget and the
/// partitions cooling down, and the moves it wanted but held back. The plans without the
/// budget and without the cool-downs are only computed when they could differ.
pub fn load_targets(
    topic: &Placement<'_>,
    settings: &PlacementSettings,
    zones: &BTreeMap<u32, String>,
    memory: &PlacementMemory,
    now: Millis,
) -> (BTreeMap<u32, String>, BTreeMap<u32, Deferral>) {
    let cooling = memory.cooling(now);
    let left = memory.budget_left(now, settings.max_moves_per_minute);
    let run = |cooling: &BTreeSet<u32>, max_moves: Option<usize>| {
        LoadBalanced { settings: settings.load(max_moves), cooling, partition_zones: zones }.assign(topic)
    };
    let target = run(&cooling, Some(left));
    let mut deferred = BTreeMap::new();
    if uniform(topic) {
        return (target, deferred);
    }
    let made = live_moves(topic, &target);
    if made.len() >= left {
        let unbudgeted = run(&cooling, None);
        for p in live_moves(topic, &unbudgeted).difference(&made) {
            deferred.insert(*p, Deferral::Budget);
        }
    }
    if !cooling.is_empty() {
        let free = run(&BTreeSet::new(), None);
        for p in live_moves(topic, &free).intersection(&cooling) {
            deferred.entry(*p).or_insert(Deferral::Cooldown);
        }
    }
    (target, deferred)
}

/// The load plan from `topic` as it stands, with a full budget and nothing cooling down:
/// what `shadow` publishes.
pub fn preview(
    topic: &Placement<'_>,
    settings: &PlacementSettings,
    zones: &BTreeMap<u32, String>,
) -> LoadPreview {
    let none = BTreeSet::new();
    let max_moves = Some(settings.max_moves_per_minute);
    let target = LoadBalanced { settings: settings.load(max_moves), cooling: &none, partition_zones: zones }
        .assign(topic);
    let moves = live_moves(topic, &target)
        .into_iter()
        .filter_map(|p| Some((p, topic.current.get(&p)?.clone(), target.get(&p)?.clone())))
        .collect();
    LoadPreview {
        moves,
        imbalance_before: imbalance(topic, topic.current),
        imbalance_after: imbalance(topic, &target),
    }
}

/// What classification needs of the state before the plan: the active consumers and how
/// many partitions each holds or is warming.
#[derive(Clone, Debug, Default)]
pub struct Holdings {
    /// Active consumer → partitions it owns or is the target of a warm.
    held: BTreeMap<String, usize>,
    /// `⌊P/N⌋`: a consumer below it is still filling up to its count share.
    floor: usize,
}

impl Holdings {
    /// From `topic` (its `current` counts warms at their target); the counts only under
    /// `load`, the one mode that reads them.
    pub fn of(topic: &Placement<'_>, mode: PlacementMode) -> Self {
        let mut held: BTreeMap<String, usize> = topic.active.keys().map(|c| (c.clone(), 0)).collect();
        if mode == PlacementMode::Load {
            for owner in topic.current.values() {
                if let Some(n) = held.get_mut(owner) {
                    *n += 1;
                }
            }
        }
        let floor = (topic.partition_count as usize).checked_div(held.len()).unwrap_or(0);
        Self { held, floor }
    }
}

/// Classifies a plan's moves (see [`MoveReason`]): `started` handoffs (partition, from, to)
/// and `direct` assignments (partition, to).
pub fn classify(
    started: &[(u32, String, String)],
    direct: &[(u32, String)],
    before: &Holdings,
    mode: PlacementMode,
    rollout: bool,
) -> Vec<(u32, MoveReason)> {
    let handoffs = started.iter().map(|(p, from, to)| {
        let reason = if rollout {
            MoveReason::Rollout
        } else if !before.held.contains_key(from) {
            MoveReason::Leave
        } else if mode != PlacementMode::Load || before.held.get(to).is_some_and(|n| *n < before.floor) {
            MoveReason::Join
        } else {
            MoveReason::Balance
        };
        (*p, reason)
    });
    let failovers = direct.iter().map(|(p, _)| (*p, MoveReason::Failover));
    handoffs.chain(failovers).collect()
}

#[cfg(test)]
#[path = "placement_tests.rs"]
mod tests;
