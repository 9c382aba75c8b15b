//! Tests of [`super::assign_rollout`]: worked rollouts, and the property that a rollout
//! moves each partition once whatever the order of joins and departures.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::{Rollout, assign_rollout};
use crate::assignment::{assign, assign_keeping};

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

fn count(target: &BTreeMap<u32, String>, name: &str) -> usize {
    target.values().filter(|o| *o == name).count()
}

fn rollout(outgoing: &[&str], final_members: usize) -> Rollout {
    Rollout { outgoing: set(outgoing), final_members }
}

/// Owner changes from `before` to `after`.
fn changed(before: &BTreeMap<u32, String>, after: &BTreeMap<u32, String>) -> Vec<u32> {
    after.iter().filter(|(p, o)| before.get(p) != Some(o)).map(|(p, _)| *p).collect()
}

#[test]
fn a_surge_rollout_of_three_moves_each_partition_once() {
    // 12 partitions over old a, b, c; the new d, e, f replace them one by one
    // (maxSurge 1: a new pod joins, then an old one drains).
    let none: BTreeSet<u32> = BTreeSet::new();
    let mut owners = assign(12, &BTreeMap::new(), &set(&["a", "b", "c"]));
    let mut moved: BTreeMap<u32, usize> = BTreeMap::new();
    let mut step = |owners: &mut BTreeMap<u32, String>, active: &[&str], draining: &[&str], out: &[&str]| {
        let target = assign_rollout(12, owners, &set(active), &set(draining), &none, &rollout(out, 3));
        for p in changed(owners, &target) {
            *moved.entry(p).or_default() += 1;
        }
        *owners = target;
    };
    // d joins: it takes its final share (4) from the old pods, the largest holders first.
    step(&mut owners, &["a", "b", "c", "d"], &[], &["a", "b", "c"]);
    assert_eq!(count(&owners, "d"), 4);
    assert_eq!((count(&owners, "a"), count(&owners, "b"), count(&owners, "c")), (2, 3, 3));
    // a drains while e is not there yet: d is full, so a's partitions wait with a.
    let before = owners.clone();
    step(&mut owners, &["b", "c", "d"], &["a"], &["a", "b", "c"]);
    assert_eq!(owners, before, "nothing moves to an old pod, nor beyond d's share");
    // e joins: a's partitions first, then from the old pods.
    step(&mut owners, &["b", "c", "d", "e"], &["a"], &["a", "b", "c"]);
    assert_eq!((count(&owners, "a"), count(&owners, "e")), (0, 4));
    step(&mut owners, &["c", "d", "e"], &["b"], &["b", "c"]);
    step(&mut owners, &["c", "d", "e", "f"], &["b"], &["b", "c"]);
    step(&mut owners, &["d", "e", "f"], &["c"], &["c"]);
    for name in ["d", "e", "f"] {
        assert_eq!(count(&owners, name), 4, "{owners:?}");
    }
    assert!(moved.values().all(|&n| n == 1) && moved.len() == 12, "{moved:?}");
    // The plain assignment leaves the result as it is.
    assert_eq!(assign(12, &owners, &set(&["d", "e", "f"])), owners);
}

#[test]
fn the_extra_slots_of_an_uneven_split_are_not_given_twice() {
    // 10 over 3: final shares 4, 3, 3. Greedy caps of 4 each would leave the last pod 2
    // and move a partition again after the rollout.
    let (none, nobody): (BTreeSet<u32>, BTreeSet<String>) = (BTreeSet::new(), BTreeSet::new());
    let old = assign(10, &BTreeMap::new(), &set(&["a", "b", "c"]));
    let r = rollout(&["a", "b", "c"], 3);
    let t1 = assign_rollout(10, &old, &set(&["a", "b", "c", "d"]), &nobody, &none, &r);
    let t2 = assign_rollout(10, &t1, &set(&["a", "b", "c", "d", "e"]), &nobody, &none, &r);
    assert_eq!((count(&t2, "d"), count(&t2, "e")), (4, 3));
    let t3 = assign_rollout(10, &t2, &set(&["d", "e", "f"]), &set(&["a", "b", "c"]), &none, &r);
    assert_eq!(count(&t3, "f"), 3);
    assert_eq!(assign(10, &t3, &set(&["d", "e", "f"])), t3, "a fixed point of the plain assignment");
}

#[test]
fn an_orphan_without_room_goes_to_the_least_loaded_old_pod() {
    // d (new) is full; old a crashed (its partitions are orphans): b, the old pod with
    // less, takes them rather than d beyond its share.
    let (none, nobody): (BTreeSet<u32>, BTreeSet<String>) = (BTreeSet::new(), BTreeSet::new());
    let mut current = BTreeMap::new();
    for p in 0..4 {
        current.insert(p, "d".to_string());
    }
    for p in 4..8 {
        current.insert(p, "gone".to_string());
    }
    for p in 8..10 {
        current.insert(p, "b".to_string());
    }
    for p in 10..12 {
        current.insert(p, "c".to_string());
    }
    current.insert(11, "b".to_string());
    let target =
        assign_rollout(12, &current, &set(&["b", "c", "d"]), &nobody, &none, &rollout(&["b", "c"], 3));
    assert_eq!(count(&target, "d"), 4);
    assert_eq!(count(&target, "b") + count(&target, "c"), 8);
    assert_eq!((count(&target, "b"), count(&target, "c")), (4, 4), "{target:?}");
}

#[test]
fn warms_towards_an_old_pod_are_given_up_first() {
    // b (old) holds 0..4, partition 0 warming towards it; the new c takes 2 of them.
    let nobody: BTreeSet<String> = BTreeSet::new();
    let current: BTreeMap<u32, String> = (0..4).map(|p| (p, "b".to_string())).collect();
    let keep: BTreeSet<u32> = [0].into();
    let target = assign_rollout(4, &current, &set(&["b", "c"]), &nobody, &keep, &rollout(&["b"], 2));
    assert_eq!(target[&0], "c", "{target:?}");
    assert_eq!(count(&target, "c"), 2);
}

/// A random rollout: `n` old pods replaced by `n` new ones, the joins and departures in
/// the order `order` says, each step's target applied for the partitions `applied` says
/// (the others wait, like handoffs still in flight or held back by the warm cap).
fn rollout_case() -> impl Strategy<Value = (u32, usize, Vec<bool>, Vec<bool>)> {
    (1u32..80, 1usize..6).prop_flat_map(|(p, n)| {
        let order = proptest::collection::vec(any::<bool>(), 2 * n);
        let applied = proptest::collection::vec(any::<bool>(), 64);
        (Just(p), Just(n), order, applied)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn each_partition_moves_once_across_a_rollout((p, n, order, applied) in rollout_case()) {
        let old: Vec<String> = (0..n).map(|i| format!("old-{i}")).collect();
        let new: Vec<String> = (0..n).map(|i| format!("new-{i}")).collect();
        let mut owners = assign(p, &BTreeMap::new(), &old.iter().cloned().collect());
        let mut moves: BTreeMap<u32, usize> = BTreeMap::new();
        let (mut joined, mut left) = (0, 0);
        let mut coin = applied.iter().copied().cycle();
        let mut events = order.into_iter();
        let mut draining: BTreeSet<String> = BTreeSet::new();
        let none: BTreeSet<u32> = BTreeSet::new();
        for round in 0..(8 * n + 8) {
            // Next event: a join or an old pod starting to drain, as drawn (each side
            // while it has any left); after the drawn ones, whatever is left.
            let join = match events.next() {
                Some(j) if (j && joined < n) || left == n => true,
                Some(_) => false,
                None => joined < n,
            };
            if join && joined < n {
                joined += 1;
            } else if left < n {
                draining.insert(old[left].clone());
                left += 1;
            }
            let active: BTreeSet<String> =
                old[left..].iter().chain(&new[..joined]).cloned().collect();
            let outgoing: BTreeSet<String> = old[..left].iter().chain(&old[left..]).cloned().collect();
            let target = if draining.is_empty() && left == n {
                assign(p, &owners, &active)
            } else {
                let r = Rollout { outgoing, final_members: n };
                assign_rollout(p, &owners, &active, &draining, &none, &r)
            };
            // Only some changes are applied this round, except once everything has happened.
            let settle = round >= 2 * n;
            for q in changed(&owners, &target) {
                if settle || coin.next().unwrap_or(true) {
                    *moves.entry(q).or_default() += 1;
                    owners.insert(q, target[&q].clone());
                }
            }
            draining.retain(|d| owners.values().any(|o| o == d));
        }
        let final_members: BTreeSet<String> = new.iter().cloned().collect();
        prop_assert!(draining.is_empty(), "every old pod drained: {:?}", owners);
        prop_assert!(owners.values().all(|o| final_members.contains(o)), "{:?}", owners);
        prop_assert_eq!(owners.len(), p as usize);
        prop_assert!(moves.values().all(|&m| m == 1), "a partition moved twice: {:?}", moves);
        prop_assert_eq!(moves.len(), p as usize, "every partition moved once");
        prop_assert_eq!(&assign(p, &owners, &final_members), &owners, "balanced: a fixed point");
    }

    #[test]
    fn without_outgoing_consumers_it_is_the_plain_assignment(
        (p, n, owners_seed) in (0u32..120, 1usize..8, proptest::collection::vec(0usize..12, 130)),
        keep_seed in proptest::collection::btree_set(0u32..120, 0..10),
    ) {
        // Owners drawn from active (< n), draining (n..n+2) and dead names.
        let name = |i: usize| format!("c{i:02}");
        let active: BTreeSet<String> = (0..n).map(name).collect();
        let draining: BTreeSet<String> = (n..n + 2).map(name).collect();
        let current: BTreeMap<u32, String> =
            owners_seed.iter().enumerate().take(p as usize).map(|(q, &o)| (q as u32, name(o))).collect();
        let r = Rollout { outgoing: BTreeSet::new(), final_members: n };
        prop_assert_eq!(
            assign_rollout(p, &current, &active, &draining, &keep_seed, &r),
            assign_keeping(p, &current, &active, &keep_seed)
        );
    }
}
