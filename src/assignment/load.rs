//! [`LoadBalanced`]: placement by load (docs/design.md §11). It balances the *weight* of the
//! partitions (their produce rate, say) over the consumers in proportion to their
//! capacities, within a tolerance, with few moves. Pure like the rest of
//! [`crate::assignment`]: no I/O, no clock. What must remember across plans (a per-minute
//! move budget, the cool-down of a partition that just moved) belongs to the caller, which
//! passes what is left of it in: [`LoadSettings::max_moves`] and [`LoadBalanced::cooling`].
//!
//! # Terms
//!
//! `W` is the total weight of partitions `0..P`, `C` the sum of the active consumers'
//! capacities (a capacity of 0 counts as 1). Consumer `c`'s *share* is `W·cap(c)/C`, its
//! *load* the weight of the partitions it is given, and its *normalized load*
//! `n(c) = load(c)/share(c)`; the capacity-weighted mean of `n` is 1, so the *imbalance*
//! `max_c n(c)` is max/mean ([`imbalance`]). A *move* takes a partition from the live
//! (active) consumer that owns it; placing a partition with no active owner is *failover*.
//!
//! # Algorithm
//!
//! 1. **Uniform topics are today's.** When every partition has the same weight and every
//!    consumer the same capacity, the result is exactly [`super::Balanced`]'s (counting is
//!    then the same as weighing), and the tolerance, budget, cool-downs and zones play no
//!    part. So turning load placement on changes nothing until weights differ.
//! 2. **Failover first.** Every partition without an active owner (its owner gone or
//!    draining, or none) is placed, heaviest first, on the consumer whose normalized load
//!    after taking it is the lowest (ties: fewer partitions per capacity, then name order):
//!    a departed consumer's partitions spread at once, whatever the budget or tolerance.
//!    Where the partition's zone is known, the best consumer of that zone is taken instead
//!    if it stays within tolerance.
//! 3. **Hysteresis.** If the imbalance is now at most `1 + tolerance`, nothing moves.
//! 4. **Few moves, largest gain first.** Otherwise, repeatedly: the consumer `d` with the
//!    highest `n` (but those set aside, below) gives one partition `p` (weight `w`) to
//!    another consumer `r`. The *gain* of that move is how much it lowers the higher of the
//!    two, `n(d) − max(n(d) − w/share(d), n(r) + w/share(r))`: how much it lowers the
//!    imbalance when `d` alone is the highest. The move with the largest gain is made
//!    (ties: the receiver left lowest, then the one with fewer partitions per capacity,
//!    then name order, then the lower partition), except that a move placing `p` in its own
//!    zone that leaves `r` within tolerance is preferred to any other. A move with a gain
//!    below [`LoadSettings::min_gain`] (or of 0) is never made. When `d` has no move that
//!    qualifies (say it holds a single partition heavier than its share), it is set aside
//!    and the next highest goes on. It stops as soon as every consumer not set aside is
//!    within tolerance (when none is set aside: as soon as the imbalance is), or when none
//!    is left. With the budget of moves spent, only partitions without a live owner (just
//!    placed by step 2) may still be moved, which costs nothing.
//! 5. A partition moves at most once per plan, a cooling-down one never for balance, and
//!    `keep_first` ones (warms in progress) only when the donor has no other move.
//!
//! Zones never cause a move by themselves: they only choose between receivers.
//!
//! # Why it reaches the tolerance
//!
//! If no partition weighs more than `tolerance` times the smallest share, `min_gain` is 0,
//! nothing cools down and the budget is unlimited, the plan ends within tolerance: while
//! `n(d) > 1 + tolerance` some `r` has `n(r) < 1` (the weighted mean is 1), so `r` can take
//! any of `d`'s partitions and stay within tolerance, a move with a positive gain. The chosen
//! receiver always ends within tolerance (ties go to the receiver left lowest), so a
//! consumer that received never becomes the highest again, and the highest consumer's
//! partitions are never pinned. Each partition moves at most once, so it ends.
//! `load_tests.rs` checks this on random topics.
//!
//! # Cost
//!
//! `O(P log P)` to sort the failover partitions; `O(G log N)` per failover placement, `G`
//! being the number of distinct capacities (consumers of one capacity are kept ordered by
//! load, and only the first of each capacity, and of each capacity in the partition's
//! zone, is a candidate); `O(N + k·G log N)` per balance move, `k` being the donor's
//! partition count. Never `O(P·N)`.

use std::collections::{BTreeMap, BTreeSet};

use super::assignor::{Assignor, Balanced, DEFAULT_WEIGHT, Placement};

#[path = "load_plan.rs"]
mod plan;

/// The tuning of placement by load, from configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadSettings {
    /// How far above its share a consumer may be before anything moves for balance: nothing
    /// moves while every normalized load is at most `1 + tolerance` (default 0.10).
    pub tolerance: f64,
    /// The smallest gain (in fractions of a share: 0.01 = 1 % of a share off the highest
    /// normalized load) for which a partition is moved for balance (default 0.01).
    pub min_gain: f64,
    /// How many balance moves this plan may make (what is left of the caller's per-minute
    /// budget); `None` for no cap. Failover placements are not counted.
    pub max_moves: Option<usize>,
}

impl Default for LoadSettings {
    fn default() -> Self {
        Self { tolerance: 0.10, min_gain: 0.01, max_moves: None }
    }
}

static NO_PARTITIONS: BTreeSet<u32> = BTreeSet::new();
static NO_ZONES: BTreeMap<u32, String> = BTreeMap::new();

/// Placement by load (module docs): balances weight in proportion to capacity, within
/// [`LoadSettings::tolerance`], with few moves.
#[derive(Clone, Copy, Debug)]
pub struct LoadBalanced<'a> {
    /// The tuning.
    pub settings: LoadSettings,
    /// Partitions that must not move for balance in this plan (they moved recently: the
    /// caller keeps their cool-downs). They are still placed if their owner is gone.
    pub cooling: &'a BTreeSet<u32>,
    /// The zone of each partition whose zone is known (for instance its leader broker's
    /// rack). Kept here rather than in [`Placement`] so that no existing construction of a
    /// `Placement` has to change.
    pub partition_zones: &'a BTreeMap<u32, String>,
}

impl LoadBalanced<'static> {
    /// With `settings`, nothing cooling down and no partition zones.
    pub fn new(settings: LoadSettings) -> Self {
        Self { settings, cooling: &NO_PARTITIONS, partition_zones: &NO_ZONES }
    }
}

impl Default for LoadBalanced<'static> {
    fn default() -> Self {
        Self::new(LoadSettings::default())
    }
}

impl Assignor for LoadBalanced<'_> {
    fn assign(&self, topic: &Placement<'_>) -> BTreeMap<u32, String> {
        if topic.active.is_empty() || topic.partition_count == 0 {
            return BTreeMap::new();
        }
        if uniform_weights(topic) && uniform_capacities(topic) {
            return Balanced.assign(topic);
        }
        plan::plan(topic, self)
    }

    /// A count, not a weight: the fleet claims partitions by position without a leader, and
    /// any set of partitions of the right count is a valid claim, while a weight quota would
    /// need every instance to pick the same partitions to add up to it. The count is
    /// proportional to capacity (`P·cap/C`, rounded by largest remainder, ties to the
    /// earlier name), so the quotas sum to `P`; with equal capacities that is exactly
    /// [`Balanced`]'s (`⌊P/N⌋`, plus one for the first `P mod N` names). Weights are not read, so it depends only on the consumers and the
    /// partition count.
    fn quota(&self, topic: &Placement<'_>, me: &str) -> usize {
        let Some(rank) = topic.active.keys().position(|name| name == me) else { return 0 };
        let caps: Vec<u128> = topic.active.values().map(|info| u128::from(capacity(info.capacity))).collect();
        let total: u128 = caps.iter().sum();
        let p = u128::from(topic.partition_count);
        let base = |c: u128| p * c / total;
        let remainder = |c: u128| p * c % total;
        let left = p - caps.iter().map(|&c| base(c)).sum::<u128>();
        // The consumers ranked before `me` in largest-remainder order (stable: name order).
        let mine = remainder(caps[rank]);
        let ahead = caps.iter().enumerate().filter(|&(i, &c)| {
            let r = remainder(c);
            r > mine || (r == mine && i < rank)
        });
        let extra = u128::from((ahead.count() as u128) < left);
        (base(caps[rank]) + extra) as usize
    }
}

/// A consumer's capacity as placement uses it: 0 (never valid in a record) counts as 1.
pub(super) fn capacity(stored: u32) -> u32 {
    stored.max(1)
}

/// The weight of partition `p`.
pub(super) fn weight(topic: &Placement<'_>, p: u32) -> u64 {
    topic.weights.get(&p).copied().unwrap_or(DEFAULT_WEIGHT)
}

/// Whether partitions `0..P` all weigh the same.
fn uniform_weights(topic: &Placement<'_>) -> bool {
    let mut stored = topic.weights.range(..topic.partition_count).map(|(_, &w)| w);
    let Some(first) = stored.next() else { return true };
    let all_stored = topic.weights.range(..topic.partition_count).count() == topic.partition_count as usize;
    // When some partition has no stored weight it weighs the default, so all must.
    let expected = if all_stored { first } else { DEFAULT_WEIGHT };
    first == expected && stored.all(|w| w == expected)
}

/// Whether the active consumers all have the same capacity.
fn uniform_capacities(topic: &Placement<'_>) -> bool {
    let mut caps = topic.active.values().map(|info| capacity(info.capacity));
    let first = caps.next();
    caps.all(|c| Some(c) == first)
}

/// The imbalance of `assignment`: the highest normalized load `load(c)/share(c)` over the
/// active consumers (module docs), i.e. max/mean with capacities; 1.0 for a perfect split.
/// Partitions assigned to a consumer outside `topic.active` are ignored; 0.0 with no active
/// consumer, and 1.0 when the total weight is 0.
pub fn imbalance(topic: &Placement<'_>, assignment: &BTreeMap<u32, String>) -> f64 {
    let total: u128 = (0..topic.partition_count).map(|p| u128::from(weight(topic, p))).sum();
    let caps: u128 = topic.active.values().map(|info| u128::from(capacity(info.capacity))).sum();
    if topic.active.is_empty() {
        return 0.0;
    }
    if total == 0 {
        return 1.0;
    }
    let mut load: BTreeMap<&str, u128> = topic.active.keys().map(|c| (c.as_str(), 0)).collect();
    for (&p, owner) in assignment.range(..topic.partition_count) {
        if let Some(l) = load.get_mut(owner.as_str()) {
            *l += u128::from(weight(topic, p));
        }
    }
    topic
        .active
        .iter()
        .map(|(c, info)| {
            let share = total as f64 * f64::from(capacity(info.capacity)) / caps as f64;
            load[c.as_str()] as f64 / share
        })
        .fold(0.0, f64::max)
}

#[cfg(test)]
#[path = "load_tests.rs"]
mod tests;
