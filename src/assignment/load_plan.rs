//! The steps 2 to 5 of [`super::LoadBalanced`]'s algorithm (see `load.rs`), over indices:
//! consumers by their rank in name order, partitions by number.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{LoadBalanced, capacity, weight};
use crate::assignment::Placement;

/// No consumer / no zone.
const NONE: u32 = u32::MAX;

/// The plan being built.
struct Plan<'t> {
    names: Vec<&'t String>,
    /// Each consumer's capacity and share (`W·cap/C`).
    cap: Vec<u32>,
    share: Vec<f64>,
    /// Each consumer's load, exact, and its partitions (in no particular order).
    load: Vec<u128>,
    held: Vec<Vec<u32>>,
    /// Each consumer's zone id, and each partition's (`NONE` when unknown).
    consumer_zone: Vec<u32>,
    partition_zone: Vec<u32>,
    weight: Vec<u64>,
    /// The target owner of each partition (`NONE` until placed).
    owner: Vec<u32>,
    /// Whether the partition had an active owner before this plan (moving it is a move).
    live: Vec<bool>,
    /// Whether the partition may not move for balance any more in this plan.
    pinned: Vec<bool>,
    keep_first: Vec<bool>,
    /// `1 + tolerance`.
    limit: f64,
    /// The consumers by (zone, capacity), and all of them by (`NONE`, capacity), each
    /// group in [`Rank`] order. Consumers of one capacity have the same share, so the
    /// first of a group is its best receiver for any partition: choosing a receiver looks
    /// at the first of each group, not at every consumer.
    groups: BTreeMap<(u32, u32), BTreeSet<Rank>>,
}

/// A consumer's place in its groups: (load, partitions, rank), lowest first.
type Rank = (u128, usize, u32);

/// How a receiver compares: its normalized load after taking the partition, then its
/// partitions per capacity (zero-weight partitions spread by count), then its rank.
type Fit = (f64, f64, usize);

fn fit_order(a: &Fit, b: &Fit) -> Ordering {
    a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2))
}

/// A candidate move for balance: `p` from the donor to the receiver of `fit`.
#[derive(Clone, Copy)]
struct Move {
    p: u32,
    gain: f64,
    fit: Fit,
}

impl Move {
    /// Whether `self` is a better move than `other`: larger gain, then the receiver's
    /// [`Fit`] (left lowest), then lower partition (so the result is the same on every
    /// instance).
    fn beats(&self, other: &Option<Move>) -> bool {
        let Some(o) = other else { return true };
        let order = o.gain.total_cmp(&self.gain).then(fit_order(&self.fit, &o.fit)).then(self.p.cmp(&o.p));
        order == Ordering::Less
    }
}

/// The target of every partition (steps 2 to 5 of the algorithm in `load.rs`).
pub(super) fn plan(topic: &Placement<'_>, assignor: &LoadBalanced<'_>) -> BTreeMap<u32, String> {
    let mut plan = Plan::new(topic, assignor);
    plan.failover();
    plan.balance(assignor);
    plan.owner.iter().enumerate().map(|(p, &c)| (p as u32, plan.names[c as usize].clone())).collect()
}

impl<'t> Plan<'t> {
    fn new(topic: &Placement<'t>, assignor: &LoadBalanced<'t>) -> Self {
        let count = topic.partition_count as usize;
        let names: Vec<&String> = topic.active.keys().collect();
        let index: HashMap<&str, u32> =
            names.iter().enumerate().map(|(i, c)| (c.as_str(), i as u32)).collect();
        let weights: Vec<u64> = (0..topic.partition_count).map(|p| weight(topic, p)).collect();
        let total: u128 = weights.iter().map(|&w| u128::from(w)).sum();
        let cap: Vec<u32> = topic.active.values().map(|i| capacity(i.capacity)).collect();
        let caps: f64 = cap.iter().map(|&c| f64::from(c)).sum();
        // With no weight at all every load is 0; any positive total keeps shares finite.
        let shares_of = total.max(1) as f64;
        let share = cap.iter().map(|&c| shares_of * f64::from(c) / caps).collect();

        // Zones as small ids (only equality matters).
        let mut zones: HashMap<&str, u32> = HashMap::new();
        let mut zone_id = |z: &'t str| {
            let next = zones.len() as u32;
            *zones.entry(z).or_insert(next)
        };
        let consumer_zone =
            topic.active.values().map(|i| i.zone.as_deref().map_or(NONE, &mut zone_id)).collect();
        let mut partition_zone = vec![NONE; count];
        for (&p, z) in assignor.partition_zones.range(..topic.partition_count) {
            partition_zone[p as usize] = zone_id(z);
        }

        let mut plan = Plan {
            load: vec![0; names.len()],
            held: vec![Vec::new(); names.len()],
            names,
            cap,
            share,
            consumer_zone,
            partition_zone,
            weight: weights,
            owner: vec![NONE; count],
            live: vec![false; count],
            pinned: vec![false; count],
            keep_first: vec![false; count],
            limit: 1.0 + assignor.settings.tolerance,
            groups: BTreeMap::new(),
        };
        for &p in topic.keep_first.range(..topic.partition_count) {
            plan.keep_first[p as usize] = true;
        }
        // Owners usually come in runs of consecutive partitions: hash only when it changes.
        let mut last: Option<(&str, Option<u32>)> = None;
        for (&p, owner) in topic.current.range(..topic.partition_count) {
            let c = match last {
                Some((name, c)) if name == owner.as_str() => c,
                _ => {
                    let c = index.get(owner.as_str()).copied();
                    last = Some((owner.as_str(), c));
                    c
                }
            };
            if let Some(c) = c {
                plan.live[p as usize] = true;
                plan.owner[p as usize] = c;
                plan.load[c as usize] += u128::from(plan.weight[p as usize]);
                plan.held[c as usize].push(p);
            }
        }
        for c in 0..plan.names.len() {
            plan.regroup(c, true);
        }
        plan
    }

    /// The groups consumer `c` belongs to.
    fn group_keys(&self, c: usize) -> impl Iterator<Item = (u32, u32)> + use<> {
        let (zone, cap) = (self.consumer_zone[c], self.cap[c]);
        [(NONE, cap), (zone, cap)].into_iter().take(if zone == NONE { 1 } else { 2 })
    }

    /// Adds `c` to its groups (`add`), or removes it, at its current rank.
    fn regroup(&mut self, c: usize, add: bool) {
        let rank = (self.load[c], self.held[c].len(), c as u32);
        for key in self.group_keys(c) {
            let group = self.groups.entry(key).or_default();
            if add {
                group.insert(rank);
            } else {
                group.remove(&rank);
            }
        }
    }

    fn put(&mut self, p: u32, c: u32) {
        self.regroup(c as usize, false);
        self.owner[p as usize] = c;
        self.load[c as usize] += u128::from(self.weight[p as usize]);
        self.held[c as usize].push(p);
        self.regroup(c as usize, true);
    }

    fn take(&mut self, p: u32, c: u32) {
        self.regroup(c as usize, false);
        self.load[c as usize] -= u128::from(self.weight[p as usize]);
        let held = &mut self.held[c as usize];
        if let Some(i) = held.iter().position(|&q| q == p) {
            held.swap_remove(i);
        }
        self.regroup(c as usize, true);
    }

    /// The best receiver of each capacity in `zone` (`NONE`: all consumers) for weight `w`
    /// but `except`, with its [`Fit`].
    fn receivers(&self, zone: u32, w: u128, except: Option<usize>) -> impl Iterator<Item = Fit> + '_ {
        self.groups.range((zone, 0)..=(zone, u32::MAX)).filter_map(move |(_, group)| {
            let c = group.iter().map(|&(_, _, c)| c as usize).find(|&c| Some(c) != except)?;
            let fill = self.held[c].len() as f64 / f64::from(self.cap[c]);
            Some((self.normalized(c, self.load[c] + w), fill, c))
        })
    }

    /// `c`'s normalized load if it carried `load`.
    fn normalized(&self, c: usize, load: u128) -> f64 {
        load as f64 / self.share[c]
    }

    /// Step 2: partitions without an active owner, heaviest first, to the consumer left
    /// lowest (same zone preferred when it stays within tolerance).
    fn failover(&mut self) {
        let mut free: Vec<u32> =
            (0..self.owner.len() as u32).filter(|&p| self.owner[p as usize] == NONE).collect();
        free.sort_by(|&a, &b| self.weight[b as usize].cmp(&self.weight[a as usize]).then(a.cmp(&b)));
        for p in free {
            let w = u128::from(self.weight[p as usize]);
            let zone = self.partition_zone[p as usize];
            let in_zone = if zone == NONE { None } else { self.receivers(zone, w, None).min_by(fit_order) };
            let chosen = match (in_zone, self.receivers(NONE, w, None).min_by(fit_order)) {
                (Some(z), _) if z.0 <= self.limit => z.2,
                (_, Some(any)) => any.2,
                // No consumer at all: `assign` returned before planning.
                (_, None) => return,
            };
            self.put(p, chosen as u32);
        }
    }

    /// Steps 3 to 5: moves for balance, largest gain first, until within tolerance.
    fn balance(&mut self, assignor: &LoadBalanced<'_>) {
        for &p in assignor.cooling.range(..self.owner.len() as u32) {
            self.pinned[p as usize] = true;
        }
        let settings = assignor.settings;
        let mut moves = 0usize;
        // Consumers that could not give anything (a single partition above a share, say):
        // the next highest goes on without them.
        let mut set_aside = vec![false; self.names.len()];
        loop {
            let Some(donor) = self.highest(&set_aside) else { return };
            if self.normalized(donor, self.load[donor]) <= self.limit {
                return;
            }
            // With the budget spent, only partitions without a live owner may still move.
            let budget_left = settings.max_moves.is_none_or(|max| moves < max);
            let best = self
                .best_move(donor, budget_left, false, settings.min_gain)
                .or_else(|| self.best_move(donor, budget_left, true, settings.min_gain));
            let Some(m) = best else {
                set_aside[donor] = true;
                continue;
            };
            self.take(m.p, donor as u32);
            self.put(m.p, m.fit.2 as u32);
            self.pinned[m.p as usize] = true;
            if self.live[m.p as usize] {
                moves += 1;
            }
        }
    }

    /// The consumer with the highest normalized load but those set aside (the first in name
    /// order on ties).
    fn highest(&self, set_aside: &[bool]) -> Option<usize> {
        (0..self.names.len())
            .filter(|&c| !set_aside[c])
            .map(|c| (self.normalized(c, self.load[c]), c))
            .reduce(|a, b| if b.0 > a.0 { b } else { a })
            .map(|(_, c)| c)
    }

    /// The best move of one of `donor`'s partitions (step 4), `keep_first` ones only when
    /// `with_keep_first`; `None` when no move has a gain of at least `min_gain` and above 0.
    fn best_move(
        &self,
        donor: usize,
        budget_left: bool,
        with_keep_first: bool,
        min_gain: f64,
    ) -> Option<Move> {
        let now = self.normalized(donor, self.load[donor]);
        let (mut best, mut best_in_zone): (Option<Move>, Option<Move>) = (None, None);
        for &p in &self.held[donor] {
            let i = p as usize;
            let w = u128::from(self.weight[i]);
            if self.pinned[i]
                || w == 0
                || (self.live[i] && !budget_left)
                || self.keep_first[i] != with_keep_first
            {
                continue;
            }
            let donor_after = self.normalized(donor, self.load[donor] - w);
            let zone = self.partition_zone[i];
            let qualifies = |fit: Fit| {
                let gain = now - donor_after.max(fit.0);
                (gain > 0.0 && gain >= min_gain).then_some(Move { p, gain, fit })
            };
            for m in self.receivers(NONE, w, Some(donor)).filter_map(qualifies) {
                if m.beats(&best) {
                    best = Some(m);
                }
            }
            if zone != NONE {
                let fits = self.receivers(zone, w, Some(donor)).filter(|fit| fit.0 <= self.limit);
                for m in fits.filter_map(qualifies) {
                    if m.beats(&best_in_zone) {
                        best_in_zone = Some(m);
                    }
                }
            }
        }
        best_in_zone.or(best)
    }
}
