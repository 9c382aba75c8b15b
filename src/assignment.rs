//! Sticky, balanced partition assignment: a pure function of (partition count, current owners,
//! active consumers), with no I/O and no clock, so every instance computes the same target.
//!
//! # Algorithm
//!
//! Let `P` be the partition count, `N` the number of active consumers, `q = ⌊P/N⌋` and
//! `r = P mod N`. A balanced target gives `r` consumers a quota of `q + 1` and the others `q`.
//!
//! 1. Count `held(c)`: the partitions `0..P` each active consumer currently owns. Partitions of
//!    consumers outside `active` (dead, draining) and unowned partitions are *free*.
//! 2. Give the `r` extra slots to the consumers holding the most (ties: smaller name first).
//! 3. Every active consumer keeps `min(held, quota)` of its partitions — its lowest-numbered ones —
//!    and gives up the rest (its highest-numbered), which become free.
//! 4. Free partitions, in ascending order, fill the consumers still below quota, in name order,
//!    each consumer taking a contiguous run of the free list until it reaches its quota.
//!
//! Everything is iterated in a fixed order (`BTreeMap`/`BTreeSet`, sorted vectors, stable sorts),
//! so the same input gives the same output on every instance and every run.
//!
//! # Why it moves the minimum
//!
//! A *move* is a partition taken from an active consumer that owns it (orphaned partitions of
//! dead or draining consumers have to be reassigned anyway and are not counted). In any balanced
//! target, a consumer with quota `t` can keep at most `t` of its `held` partitions, so at least
//! `max(0, held − t)` are taken from it. Step 3 takes exactly that many, so the only freedom left
//! is which consumers get `q + 1`. Giving the extra slot to a consumer with `held > q` saves
//! exactly one move; giving it to one with `held ≤ q` saves nothing. Step 2 therefore hands the
//! extras to the largest holders first, which saves `min(r, #{c : held(c) > q})` moves — the
//! most any choice can. See [`minimum_moves`] for the resulting closed formula.
//!
//! Step 4 always fits exactly: the free partitions number `P − Σ min(held, quota)`, and since the
//! quotas sum to `P` that equals the total deficit `Σ (quota − min(held, quota))`.
//!
//! # Cost
//!
//! `O(P)` hash lookups of owner names (skipped while consecutive partitions share an owner),
//! `O(N log N)` for the quota choice, and `O(P)` to build the output; never `O(P·N)`. At
//! 100,000 partitions most of the time is allocating the output's owner `String`s.
//!
//! # Rollouts
//!
//! While consumers are being replaced (a Deployment rolling out), [`assign_rollout`] keeps
//! the old generation from receiving partitions and fills the others only up to their final
//! share, so each partition moves once (see [`rollout`]).
//!
//! # By load
//!
//! [`LoadBalanced`] balances the partitions' weights instead of their count, within a
//! tolerance and with few moves, and is exactly [`Balanced`] while all weigh the same (see
//! [`load`]).

pub mod assignor;
pub mod load;
pub mod rollout;

pub use assignor::{Assignor, Balanced, ConsumerInfo, Placement, RolloutRule};
pub use load::{LoadBalanced, LoadSettings};
pub use rollout::{Rollout, assign_rollout};

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Target owner of every partition `0..partition_count`.
///
/// The result is balanced (every active consumer owns `⌊P/N⌋` or `⌈P/N⌉` partitions), sticky (a
/// partition stays with its active owner unless that owner is over quota; the number of moves
/// equals [`minimum_moves`]) and deterministic. Consumers not in `active` get nothing; entries of
/// `current` at or beyond `partition_count` are ignored. With no active consumer, or no
/// partitions, the result is empty.
///
/// An over-quota consumer gives up its highest-numbered partitions; freed and orphaned
/// partitions go, in ascending order, to the under-quota consumers in name order.
pub fn assign(
    partition_count: u32,
    current: &BTreeMap<u32, String>,
    active: &BTreeSet<String>,
) -> BTreeMap<u32, String> {
    assign_keeping(partition_count, current, active, &BTreeSet::new())
}

/// [`assign`], except that an over-quota consumer gives up the partitions of `keep_first`
/// last: the planner passes the partitions that are warming towards their target, so a
/// started warm is not retargeted by the burst of joins that follows (its target keeps it
/// unless its warms alone exceed its quota). The number of moves is the same.
pub fn assign_keeping(
    partition_count: u32,
    current: &BTreeMap<u32, String>,
    active: &BTreeSet<String>,
    keep_first: &BTreeSet<u32>,
) -> BTreeMap<u32, String> {
    let n = active.len();
    if n == 0 || partition_count == 0 {
        return BTreeMap::new();
    }
    // BTreeSet iterates in name order, so `members` is sorted and the index of a member is a
    // deterministic identity.
    let members: Vec<&String> = active.iter().collect();
    let p_total = partition_count as usize;

    // Name → member index. A HashMap is fine here: it is only looked up, never iterated, so
    // its order cannot leak into the result. (A binary search over names that share a long
    // prefix such as `consumer-` cost ~10x more at 100k partitions.)
    let index: HashMap<&str, usize> = members.iter().enumerate().map(|(i, m)| (m.as_str(), i)).collect();

    // Each active member's current partitions, ascending (BTreeMap iteration order).
    let mut held: Vec<Vec<u32>> = vec![Vec::new(); n];
    // Owners usually come in runs of consecutive partitions, so remember the last lookup
    // (including "not active") and only hash when the owner changes.
    let mut last: Option<(&str, Option<usize>)> = None;
    for (&p, owner) in current.range(..partition_count) {
        let i = match last {
            Some((name, i)) if name == owner.as_str() => i,
            _ => {
                let i = index.get(owner.as_str()).copied();
                last = Some((owner.as_str(), i));
                i
            }
        };
        if let Some(i) = i {
            held[i].push(p);
        }
    }

    // Quota choice: the r extra slots go to the largest holders, which is what makes the number
    // of moves minimal (module doc). `members` is in name order and the sort is stable, so equal
    // holders are ordered by name.
    let q = p_total / n;
    let r = p_total % n;
    let mut by_held: Vec<usize> = (0..n).collect();
    by_held.sort_by(|&a, &b| held[b].len().cmp(&held[a].len()));
    let mut quota = vec![q; n];
    for &i in &by_held[..r] {
        quota[i] = q + 1;
    }

    // Keep the lowest-numbered min(held, quota) partitions (`keep_first` ones before the
    // others); the rest stay `None` (free).
    let mut owner_of: Vec<Option<u32>> = vec![None; p_total];
    let mut deficit = vec![0usize; n];
    for (i, parts) in held.iter_mut().enumerate() {
        let keep = parts.len().min(quota[i]);
        if keep < parts.len() && !keep_first.is_empty() {
            // Stable: `keep_first` ones first, each group still ascending.
            parts.sort_by_key(|p| !keep_first.contains(p));
        }
        for &p in &parts[..keep] {
            // `i < n <= active.len()`; members are indexed by u32 to halve the vector size.
            owner_of[p as usize] = Some(i as u32);
        }
        deficit[i] = quota[i] - keep;
    }

    // Fill: free partitions ascending, consumers in name order, each taking a contiguous run
    // of the free list (contiguous runs keep a consumer's new partitions together).
    let mut fill = deficit.iter().enumerate().flat_map(|(i, &d)| std::iter::repeat_n(i, d));
    for slot in owner_of.iter_mut().filter(|s| s.is_none()) {
        // Free slots == total deficit (module doc), so `fill` cannot run dry.
        let i = fill.next().expect("free partitions equal total deficit");
        *slot = Some(i as u32);
    }
    debug_assert!(fill.next().is_none(), "total deficit equals free partitions");

    // Partition numbers are produced ascending, so the map is bulk-built from sorted input.
    owner_of
        .into_iter()
        .enumerate()
        .map(|(p, i)| {
            let i = i.expect("every partition was assigned") as usize;
            (p as u32, members[i].clone())
        })
        .collect()
}

/// Partitions taken from a consumer that is in `active` and currently owns them (what `assign`
/// moved away from live owners).
///
/// Counts every partition `p` present in both maps whose `current` owner is in `active` and
/// whose `target` owner differs. Partitions missing from `target` (out of range, or no active
/// consumer at all) are not counted: nothing takes them. Reassigning a partition of a consumer
/// outside `active` is not a move — it has no live owner to hand off from.
pub fn moves(
    current: &BTreeMap<u32, String>,
    target: &BTreeMap<u32, String>,
    active: &BTreeSet<String>,
) -> usize {
    current
        .iter()
        .filter(|&(p, owner)| active.contains(owner) && target.get(p).is_some_and(|new| new != owner))
        .count()
}

/// The minimum possible number of [`moves`] for any balanced target.
///
/// With `P = partition_count`, `N = active.len()`, `q = ⌊P/N⌋`, `r = P mod N`, and `held(c)` the
/// number of partitions in `0..P` that active consumer `c` currently owns:
///
/// ```text
/// minimum = Σ_{c ∈ active} max(0, held(c) − q)  −  min(r, |{c ∈ active : held(c) > q}|)
/// ```
///
/// This is `Σ_c max(0, held(c) − quota(c))` for the best choice of which `r` consumers get
/// quota `q + 1`: each extra slot given to a consumer holding more than `q` saves exactly one
/// move, one given to any other consumer saves none, so the best choice saves
/// `min(r, #{held > q})` (see the module doc for the lower-bound argument). Returns 0 when
/// `N = 0` or `P = 0`.
///
/// Computed without running [`assign`], so tests can check `assign` against it.
pub fn minimum_moves(
    partition_count: u32,
    current: &BTreeMap<u32, String>,
    active: &BTreeSet<String>,
) -> usize {
    let n = active.len();
    if n == 0 || partition_count == 0 {
        return 0;
    }
    let mut held: BTreeMap<&str, usize> = BTreeMap::new();
    for owner in current.range(..partition_count).map(|(_, o)| o) {
        if active.contains(owner) {
            *held.entry(owner.as_str()).or_default() += 1;
        }
    }
    let q = partition_count as usize / n;
    let r = partition_count as usize % n;
    let excess: usize = held.values().map(|&h| h.saturating_sub(q)).sum();
    let over = held.values().filter(|&&h| h > q).count();
    excess - r.min(over)
}

#[cfg(test)]
#[path = "assignment/tests.rs"]
mod tests;
