//! Assignment while consumers are being replaced (a Deployment rolling out): each
//! partition moves **once**, from an old-generation consumer to its final owner, instead of
//! once when a new consumer joins and again when an old one leaves.
//!
//! Pure, like [`super::assign`]. Inputs besides the plain ones: the *outgoing* consumers
//! (the old generation: they will all leave) and the size the group will have once the
//! rollout is over (its *final members*). Every other active consumer (a *stayer*: a pod of
//! the new generation, or a consumer outside the rollout) gets a quota, its share of the
//! final group (`⌊P/F⌋`, or `⌈P/F⌉` for the `P mod F` largest holders), and never more.
//!
//! 1. A stayer keeps up to its quota of what it holds (partitions in `keep_first` before
//!    the others, then its lowest-numbered); what it holds beyond is *excess*.
//! 2. The stayers' deficits are filled, in this order of preference, from: orphans (no live
//!    owner), partitions of draining consumers, partitions taken from the outgoing consumers
//!    (always from the one holding the most), and last excess. (Outgoing partitions must
//!    move anyway; excess only exists when the final size grew, perhaps for a moment while
//!    a new consumer is not yet known for what it is, so it moves last.) The chosen
//!    partitions go, ascending, to the stayers in name order, each taking a contiguous run.
//! 3. Whatever was not chosen stays where it is: an outgoing consumer keeps its partitions
//!    until a stayer has room, and a **draining** consumer's partitions wait for room too
//!    (its drain ends once a new consumer takes them). Only an orphan that no stayer has room
//!    for goes elsewhere, since it needs an owner now: to the least-loaded outgoing consumer,
//!    or, when there is none, to the least-loaded stayer.
//!
//! # Why each partition moves at most once
//!
//! Outgoing consumers never receive (step 3's orphans aside: a crash), so a partition moves
//! only *to* a stayer. A stayer only gives partitions up beyond its quota, and its quota
//! does not shrink while the final size stays the same: the extra slots go to the largest
//! holders, and a stayer only ever holds `⌈P/F⌉` with an extra slot, which it keeps. When
//! every old consumer is gone, the stayers hold exactly their quotas, which sum to `P`: a
//! balanced assignment that [`super::assign`] leaves as it is (a fixed point), so switching
//! back to the plain assignment moves nothing either.
//!
//! With no outgoing consumer and a final size no larger than the active group, the result
//! is exactly [`super::assign_keeping`]'s.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

/// A rollout in progress among a topic's consumers, as the planner needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rollout {
    /// Consumers of an old generation: they receive no partitions, and theirs move only to
    /// the other consumers (the new generation and consumers outside the rollout).
    pub outgoing: BTreeSet<String>,
    /// How many consumers the group will have once the rollout is over (the Deployment's
    /// desired replicas, plus the consumers outside it): the others are filled up to their
    /// share of this, never beyond.
    pub final_members: usize,
}

/// Where a partition is now, as step 2 of the module docs sorts it.
enum Holder {
    /// An active consumer that stays, by index.
    Stayer(usize),
    /// An active outgoing consumer, by index.
    Outgoing(usize),
    /// A live draining consumer (not active).
    Draining,
    /// Nobody live.
    Orphan,
}

/// Target owner of every partition `0..partition_count` during a rollout (module docs).
///
/// `active` are the consumers that may hold partitions (those of `rollout.outgoing` among
/// them receive none); `draining` are live consumers handing theirs off, whose partitions
/// wait for a stayer with room (their target is then themselves). Partitions of
/// `keep_first` are given up last by a stayer, first by an outgoing consumer (warms towards
/// it). Empty when there is no active consumer or no partition.
pub fn assign_rollout(
    partition_count: u32,
    current: &BTreeMap<u32, String>,
    active: &BTreeSet<String>,
    draining: &BTreeSet<String>,
    keep_first: &BTreeSet<u32>,
    rollout: &Rollout,
) -> BTreeMap<u32, String> {
    if active.is_empty() || partition_count == 0 {
        return BTreeMap::new();
    }
    let (stayers, outgoing): (Vec<&String>, Vec<&String>) =
        active.iter().partition(|c| !rollout.outgoing.contains(*c));
    let stay_index: HashMap<&str, usize> = stayers.iter().enumerate().map(|(i, c)| (c.as_str(), i)).collect();
    let out_index: HashMap<&str, usize> = outgoing.iter().enumerate().map(|(i, c)| (c.as_str(), i)).collect();
    let holder = |owner: Option<&String>| match owner {
        Some(o) if stay_index.contains_key(o.as_str()) => Holder::Stayer(stay_index[o.as_str()]),
        Some(o) if out_index.contains_key(o.as_str()) => Holder::Outgoing(out_index[o.as_str()]),
        Some(o) if draining.contains(o) => Holder::Draining,
        _ => Holder::Orphan,
    };

    let mut held: Vec<Vec<u32>> = vec![Vec::new(); stayers.len()];
    let mut out_held: Vec<Vec<u32>> = vec![Vec::new(); outgoing.len()];
    let (mut orphans, mut from_draining) = (Vec::new(), Vec::new());
    for p in 0..partition_count {
        match holder(current.get(&p)) {
            Holder::Stayer(i) => held[i].push(p),
            Holder::Outgoing(j) => out_held[j].push(p),
            Holder::Draining => from_draining.push(p),
            Holder::Orphan => orphans.push(p),
        }
    }

    // Quotas: shares of the final group; the extra slots to the largest holders (stable
    // sort over name order: ties by name), as in the plain assignment.
    let p_total = partition_count as usize;
    let final_members = rollout.final_members.max(stayers.len()).max(1);
    let (q, r) = (p_total / final_members, p_total % final_members);
    let mut by_held: Vec<usize> = (0..stayers.len()).collect();
    by_held.sort_by_key(|&i| Reverse(held[i].len()));
    let mut quota = vec![q; stayers.len()];
    for &i in by_held.iter().take(r) {
        quota[i] = q + 1;
    }

    // Step 1: keep up to the quota; the rest is excess.
    let mut excess = Vec::new();
    let mut deficit = vec![0usize; stayers.len()];
    for (i, parts) in held.iter_mut().enumerate() {
        let keep = parts.len().min(quota[i]);
        if keep < parts.len() && !keep_first.is_empty() {
            parts.sort_by_key(|p| !keep_first.contains(p));
        }
        excess.extend(parts.drain(keep..));
        deficit[i] = quota[i] - keep;
    }
    let wanted: usize = deficit.iter().sum();

    // Step 2: choose what fills the deficits, by preference.
    let mut chosen: Vec<u32> = Vec::with_capacity(wanted);
    let mut spare_orphans = Vec::new();
    for p in orphans {
        if chosen.len() < wanted { chosen.push(p) } else { spare_orphans.push(p) }
    }
    chosen.extend(from_draining.into_iter().take(wanted - chosen.len()));
    for parts in &mut out_held {
        // Taken from the end: warms towards an outgoing consumer first, then its highest.
        parts.sort_by_key(|p| keep_first.contains(p));
    }
    let mut largest: BinaryHeap<(usize, Reverse<usize>)> =
        out_held.iter().enumerate().map(|(j, parts)| (parts.len(), Reverse(j))).collect();
    while chosen.len() < wanted {
        let Some((_, Reverse(j))) = largest.pop() else { break };
        let Some(p) = out_held[j].pop() else { continue };
        chosen.push(p);
        largest.push((out_held[j].len(), Reverse(j)));
    }
    // The quotas sum to at most P, so the pools cannot run dry before `wanted`.
    chosen.extend(excess.into_iter().take(wanted - chosen.len()));
    chosen.sort_unstable();

    let mut target: BTreeMap<u32, String> = BTreeMap::new();
    let mut fill = deficit.iter().enumerate().flat_map(|(i, &d)| std::iter::repeat_n(i, d));
    for p in chosen {
        if let Some(i) = fill.next() {
            target.insert(p, stayers[i].clone());
        }
    }
    for (i, parts) in held.iter().enumerate() {
        target.extend(parts.iter().map(|&p| (p, stayers[i].clone())));
    }
    for (j, parts) in out_held.iter().enumerate() {
        target.extend(parts.iter().map(|&p| (p, outgoing[j].clone())));
    }

    // Step 3: partitions nobody took stay where they are (waiting for room); an orphan
    // needs an owner now: the least-loaded outgoing consumer, else the least-loaded stayer.
    for p in 0..partition_count {
        if !target.contains_key(&p)
            && let Some(owner) = current.get(&p).filter(|o| draining.contains(*o) || active.contains(*o))
        {
            target.insert(p, owner.clone());
        }
    }
    if !spare_orphans.is_empty() {
        let takers = if outgoing.is_empty() { &stayers } else { &outgoing };
        let mut load: HashMap<&str, usize> = takers.iter().map(|c| (c.as_str(), 0)).collect();
        for owner in target.values() {
            if let Some(n) = load.get_mut(owner.as_str()) {
                *n += 1;
            }
        }
        let mut least: BinaryHeap<Reverse<(usize, usize)>> =
            takers.iter().enumerate().map(|(k, c)| Reverse((load[c.as_str()], k))).collect();
        for p in spare_orphans {
            if let Some(Reverse((n, k))) = least.pop() {
                target.insert(p, takers[k].clone());
                least.push(Reverse((n + 1, k)));
            }
        }
    }
    target
}

#[cfg(test)]
#[path = "rollout_tests.rs"]
mod tests;
