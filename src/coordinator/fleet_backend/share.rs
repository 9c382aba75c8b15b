//! The fair share: what one consumer should claim or give back. Pure, no I/O.
//!
//! The quota comes from the [`Assignor`] (today [`Balanced`](crate::assignment::Balanced)):
//! with `P` partitions and `N` live members (registered, not leaving) in name order, the
//! member of rank `i` has the quota `⌊P/N⌋ + (i < P mod N)`: the quotas sum to exactly `P`
//! and every member gets `⌊P/N⌋` or `⌈P/N⌉`. The extra partitions go to the first names,
//! so every instance computes the same quotas from the same membership and the quotas do
//! not depend on who holds what: once membership is stable, each consumer's target count is
//! fixed, which is what makes the fleet converge without a leader (claims stop at the quota,
//! give-backs stop at the quota, and the quotas fill `P` exactly).
//!
//! A consumer over its quota gives back its highest-numbered partitions. A consumer under
//! its quota claims free partitions (no lease, or a lease whose owner has no member record),
//! scanning from an offset that depends on its rank, so consumers claiming at the same time
//! mostly try different partitions instead of colliding on the same compare-and-swap.

use std::collections::BTreeMap;

use crate::assignment::{Assignor, ConsumerInfo, Placement};

/// What one consumer should do now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Share {
    /// Its quota.
    pub quota: usize,
    /// Partitions it holds beyond the quota, to give back (highest-numbered first).
    pub give_back: Vec<u32>,
    /// Free partitions to claim, up to the quota.
    pub claim: Vec<u32>,
}

/// The share of consumer `me` (see the module docs); `None` when it is not live.
///
/// * `assignor`: gives the quota ([`Assignor::quota`]), from the live members alone;
/// * `live`: the live members with their info;
/// * `registered`: whether a name has a member record (live or leaving); a lease whose
///   owner has none is free to take;
/// * `owners`: the lease owner of each leased partition.
pub fn share_of(
    assignor: &dyn Assignor,
    count: u32,
    live: &BTreeMap<String, ConsumerInfo>,
    registered: impl Fn(&str) -> bool,
    me: &str,
    owners: &BTreeMap<u32, &str>,
) -> Option<Share> {
    let rank = live.keys().position(|m| m == me)?;
    let (weights, draining, current, keep_first) = Default::default();
    let topic = Placement {
        partition_count: count,
        weights: &weights,
        active: live,
        draining: &draining,
        current: &current,
        keep_first: &keep_first,
    };
    let quota = assignor.quota(&topic, me);
    let held: Vec<u32> = owners.range(..count).filter(|(_, o)| **o == me).map(|(p, _)| *p).collect();
    let mut share = Share { quota, ..Share::default() };
    if held.len() > quota {
        share.give_back = held[quota..].iter().rev().copied().collect();
    } else if held.len() < quota {
        let start = (rank as u64 * u64::from(count) / live.len() as u64) as u32;
        let free = (start..count)
            .chain(0..start)
            .filter(|p| owners.get(p).is_none_or(|owner| *owner != me && !registered(owner)));
        share.claim = free.take(quota - held.len()).collect();
    }
    Some(share)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rand::{Rng, SeedableRng, rngs::StdRng, seq::IndexedRandom};

    use super::*;
    use crate::assignment::{Balanced, assignor::quota_by_rank as quota};

    fn infos<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> BTreeMap<String, ConsumerInfo> {
        names.into_iter().map(|n| (n.as_ref().to_string(), ConsumerInfo::default())).collect()
    }

    #[test]
    fn quotas_are_balanced_and_sum_to_the_count() {
        for count in 0..40 {
            for members in 1..12 {
                let quotas: Vec<usize> = (0..members).map(|r| quota(count, members, r)).collect();
                assert_eq!(quotas.iter().sum::<usize>(), count as usize, "P={count} N={members}");
                let (lo, hi) = (count as usize / members, (count as usize).div_ceil(members));
                assert!(quotas.iter().all(|q| *q == lo || *q == hi), "P={count} N={members}: {quotas:?}");
            }
        }
        assert_eq!(quota(5, 0, 0), 0);
    }

    #[test]
    fn claims_gives_back_and_steals_from_the_unregistered() {
        let owners: BTreeMap<u32, &str> = (0..4).map(|p| (p, "a")).collect();
        // a alone holds all 4; b joins: a gives back its two highest, b claims them.
        let live = ["a", "b"];
        let registered = |n: &str| n == "a" || n == "b";
        let a = share_of(&Balanced, 4, &infos(live), registered, "a", &owners).unwrap();
        assert_eq!(a, Share { quota: 2, give_back: vec![3, 2], claim: vec![] });
        let b = share_of(&Balanced, 4, &infos(live), registered, "b", &owners).unwrap();
        assert_eq!(b, Share { quota: 2, give_back: vec![], claim: vec![] });
        let after: BTreeMap<u32, &str> = [(0, "a"), (1, "a")].into();
        let b = share_of(&Balanced, 4, &infos(live), registered, "b", &after).unwrap();
        assert_eq!(b.claim, vec![2, 3]);
        // A lease of a consumer with no member record is free to take.
        let stale: BTreeMap<u32, &str> = [(0, "a"), (1, "a"), (2, "gone"), (3, "gone")].into();
        assert_eq!(share_of(&Balanced, 4, &infos(live), registered, "b", &stale).unwrap().claim, vec![2, 3]);
        // Not live: no plan.
        assert_eq!(share_of(&Balanced, 4, &infos(live), registered, "c", &owners), None);
    }

    /// Consumers acting in random order on views that lag the store, with
    /// compare-and-swap semantics (a claim succeeds only if the partition is still free
    /// in the store, a give-back only if the lease is still the giver's), converge to the
    /// balanced fixed point once the views catch up, and never hold a partition twice.
    #[test]
    fn random_schedules_converge_to_balance() {
        let mut rng = StdRng::seed_from_u64(7);
        for round in 0..300 {
            let count = rng.random_range(1..30u32);
            let names: Vec<String> = (0..rng.random_range(1..8)).map(|i| format!("c{i}")).collect();
            let mut store: BTreeMap<u32, String> = BTreeMap::new();
            let mut live: BTreeSet<String> = BTreeSet::new();
            let mut history: Vec<BTreeMap<u32, String>> = vec![store.clone()];
            for _ in 0..200 {
                // Membership churn now and then: a join, or a crash (its leases vanish).
                if rng.random_bool(0.05) {
                    let name = names.choose(&mut rng).unwrap().clone();
                    if !live.remove(&name) {
                        live.insert(name);
                    } else {
                        store.retain(|_, o| *o != name);
                    }
                }
                let Some(me) = live.iter().collect::<Vec<_>>().choose(&mut rng).map(|s| s.to_string()) else {
                    continue;
                };
                // A view up to 3 steps old.
                let lag = rng.random_range(0..history.len().min(4));
                let view = &history[history.len() - 1 - lag];
                let view: BTreeMap<u32, &str> = view.iter().map(|(p, o)| (*p, o.as_str())).collect();
                let share =
                    share_of(&Balanced, count, &infos(&live), |n| live.contains(n), &me, &view).unwrap();
                for p in share.give_back {
                    if store.get(&p) == Some(&me) {
                        store.remove(&p);
                    }
                }
                for p in share.claim {
                    if view.get(&p).copied() == store.get(&p).map(String::as_str) {
                        store.insert(p, me.clone());
                    }
                }
                history.push(store.clone());
            }
            // Views catch up: steps on the current state until nothing changes.
            let members: Vec<String> = live.iter().cloned().collect();
            for _ in 0..2 * members.len() + 2 {
                for me in &members {
                    let view: BTreeMap<u32, &str> = store.iter().map(|(p, o)| (*p, o.as_str())).collect();
                    let share =
                        share_of(&Balanced, count, &infos(&live), |n| live.contains(n), me, &view).unwrap();
                    let store_next = {
                        let mut s = store.clone();
                        for p in share.give_back {
                            s.remove(&p);
                        }
                        for p in share.claim {
                            s.insert(p, me.clone());
                        }
                        s
                    };
                    store = store_next;
                }
            }
            if members.is_empty() {
                continue;
            }
            assert_eq!(store.len(), count as usize, "round {round}: every partition is owned: {store:?}");
            for (rank, me) in members.iter().enumerate() {
                let held = store.values().filter(|o| *o == me).count();
                assert_eq!(held, quota(count, members.len(), rank), "round {round}: {me} in {store:?}");
            }
        }
    }
}
