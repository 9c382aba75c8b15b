//! Tests of the sticky, balanced assignment (`assignment.rs`), with proptests.

use super::*;
use proptest::prelude::*;

fn names(range: std::ops::Range<usize>) -> BTreeSet<String> {
    range.map(|i| format!("c{i:02}")).collect()
}

fn counts(target: &BTreeMap<u32, String>) -> BTreeMap<&str, usize> {
    let mut c = BTreeMap::new();
    for o in target.values() {
        *c.entry(o.as_str()).or_default() += 1;
    }
    c
}

fn assert_balanced(p: u32, target: &BTreeMap<u32, String>, active: &BTreeSet<String>) {
    if active.is_empty() || p == 0 {
        assert!(target.is_empty());
        return;
    }
    let n = active.len();
    let (lo, hi) = (p as usize / n, (p as usize).div_ceil(n));
    let c = counts(target);
    for a in active {
        let k = c.get(a.as_str()).copied().unwrap_or(0);
        assert!(lo <= k && k <= hi, "{a} owns {k}, want {lo}..={hi}");
    }
}

#[test]
fn partitions_to_keep_first_are_given_up_last_with_the_same_moves() {
    // c00 holds all 8 (two of them, 6 and 7, warming towards it); c01 joins.
    let current: BTreeMap<u32, String> = (0..8).map(|p| (p, "c00".to_string())).collect();
    let active = names(0..2);
    let plain = assign(8, &current, &active);
    let keeping = assign_keeping(8, &current, &active, &[6, 7].into());
    assert!(plain[&6] != "c00" && plain[&7] != "c00", "plain gives up its highest: {plain:?}");
    assert_eq!((keeping[&6].as_str(), keeping[&7].as_str()), ("c00", "c00"), "{keeping:?}");
    assert_balanced(8, &keeping, &active);
    assert_eq!(moves(&current, &keeping, &active), moves(&current, &plain, &active));
    assert_eq!(moves(&current, &keeping, &active), minimum_moves(8, &current, &active));
}

#[test]
fn no_active_consumers_gives_empty() {
    let current: BTreeMap<u32, String> = (0..10).map(|p| (p, "gone".to_string())).collect();
    let active = BTreeSet::new();
    assert!(assign(10, &current, &active).is_empty());
    assert_eq!(minimum_moves(10, &current, &active), 0);
}

#[test]
fn no_partitions_gives_empty() {
    let current: BTreeMap<u32, String> = [(3, "c00".to_string())].into();
    let active = names(0..3);
    let target = assign(0, &current, &active);
    assert!(target.is_empty());
    assert_eq!(moves(&current, &target, &active), 0);
    assert_eq!(minimum_moves(0, &current, &active), 0);
}

#[test]
fn from_empty_is_contiguous_and_balanced() {
    let active = names(0..3);
    let target = assign(10, &BTreeMap::new(), &active);
    let owners: Vec<&str> = target.values().map(String::as_str).collect();
    // 10 = 3·3 + 1: the extra slot goes to the first name (all hold 0).
    assert_eq!(owners, ["c00", "c00", "c00", "c00", "c01", "c01", "c01", "c02", "c02", "c02"]);
}

#[test]
fn one_joins_balanced_12_over_3_moves_exactly_3() {
    let before = assign(12, &BTreeMap::new(), &names(0..3));
    let active = names(0..4);
    let after = assign(12, &before, &active);
    assert_balanced(12, &after, &active);
    assert_eq!(moves(&before, &after, &active), 3);
    assert_eq!(minimum_moves(12, &before, &active), 3);
    // Each old owner gives up its highest-numbered partition to the newcomer.
    let newcomer: Vec<u32> = after.iter().filter(|(_, o)| o.as_str() == "c03").map(|(&p, _)| p).collect();
    assert_eq!(newcomer, [3, 7, 11]);
}

#[test]
fn one_leaves_moves_nothing_from_live_owners() {
    let before = assign(12, &BTreeMap::new(), &names(0..4));
    let mut active = names(0..4);
    active.remove("c01");
    let after = assign(12, &before, &active);
    assert_balanced(12, &after, &active);
    assert_eq!(moves(&before, &after, &active), 0);
    assert_eq!(minimum_moves(12, &before, &active), 0);
    for (p, o) in &before {
        if o != "c01" {
            assert_eq!(&after[p], o, "partition {p} of a live owner moved");
        }
    }
    assert!(after.values().all(|o| o != "c01"));
}

#[test]
fn stable_input_is_a_fixed_point() {
    let active = names(0..7);
    let current: BTreeMap<u32, String> =
        (0..100u32).map(|p| (p, format!("c{:02}", (p * 31 + 5) % 9))).collect();
    let once = assign(100, &current, &active);
    let twice = assign(100, &once, &active);
    assert_eq!(once, twice);
    assert_eq!(moves(&once, &twice, &active), 0);
    assert_eq!(minimum_moves(100, &once, &active), 0);
}

#[test]
fn extra_slots_go_to_largest_holders() {
    // 10 partitions over 3: quotas 4,3,3. c02 holds 4 (the most), so it keeps all of them,
    // and c00/c01 (3 each, at quota) keep theirs: 0 moves although c00 sorts first.
    let active = names(0..3);
    let mut current = BTreeMap::new();
    for p in 0..3 {
        current.insert(p, "c00".to_string());
    }
    for p in 3..6 {
        current.insert(p, "c01".to_string());
    }
    for p in 6..10 {
        current.insert(p, "c02".to_string());
    }
    let target = assign(10, &current, &active);
    assert_eq!(target, current);
    assert_eq!(minimum_moves(10, &current, &active), 0);
}

#[test]
fn out_of_range_entries_are_ignored() {
    let active = names(0..2);
    let current: BTreeMap<u32, String> =
        [(0, "c00".into()), (1, "c00".into()), (7, "c00".into()), (9, "c01".into())].into();
    let target = assign(4, &current, &active);
    assert_eq!(target.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_balanced(4, &target, &active);
    assert_eq!(moves(&current, &target, &active), 0);
    assert_eq!(minimum_moves(4, &current, &active), 0);
}

#[test]
fn fast_enough_at_100k_over_1000() {
    // Smoke test only (debug build, shared machine): the real measurement is the bench.
    let active: BTreeSet<String> = (0..1000).map(|i| format!("consumer-{i:04}")).collect();
    let before = assign(100_000, &BTreeMap::new(), &active);
    let mut grown = active.clone();
    grown.insert("consumer-1000".into());
    let after = assign(100_000, &before, &grown);
    assert_eq!(moves(&before, &after, &grown), minimum_moves(100_000, &before, &grown));
}

/// Random case: P, the active set, and current owners drawn from active names, non-active
/// names (dead/draining) and "unowned", including partitions beyond P.
fn case() -> impl Strategy<Value = (u32, BTreeSet<String>, BTreeMap<u32, String>)> {
    (0u32..300, 0usize..20, 0usize..6).prop_flat_map(|(p, n, dead)| {
        let active = names(0..n);
        // Owner index: < n active, n..n+dead non-active, the rest unowned.
        let owner = 0..(n + dead + 3);
        (Just(p), Just(active), proptest::collection::vec(owner, (p + 5) as usize)).prop_map(
            move |(p, active, owners)| {
                let current = owners
                    .into_iter()
                    .enumerate()
                    .filter(|&(_, o)| o < n + dead)
                    .map(|(part, o)| (part as u32, format!("c{o:02}")))
                    .collect();
                (p, active, current)
            },
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn assign_properties((p, active, current) in case(), seed in any::<u64>()) {
        let target = assign(p, &current, &active);

        // Every partition 0..P assigned iff N > 0, nothing else, only to active consumers.
        if active.is_empty() {
            prop_assert!(target.is_empty());
        } else {
            prop_assert_eq!(target.keys().copied().collect::<Vec<_>>(), (0..p).collect::<Vec<_>>());
        }
        prop_assert!(target.values().all(|o| active.contains(o)));
        assert_balanced(p, &target, &active);

        // Minimal movement, against the independent closed formula.
        prop_assert_eq!(moves(&current, &target, &active), minimum_moves(p, &current, &active));

        // Sticky: an active owner at or under its target count keeps all its partitions;
        // one over it keeps exactly that many, its lowest-numbered.
        let c = counts(&target);
        for a in &active {
            let mine: Vec<u32> = current.range(..p).filter(|(_, o)| *o == a).map(|(&q, _)| q).collect();
            let keep = c.get(a.as_str()).copied().unwrap_or(0).min(mine.len());
            for (k, q) in mine.iter().enumerate() {
                prop_assert_eq!(target[q] == *a, k < keep, "partition {} of {}", q, a);
            }
        }

        // Deterministic: same call twice, and the same inputs built in another order.
        prop_assert_eq!(&assign(p, &current, &active), &target);
        let mut rng_state = seed | 1;
        let mut shuffled_entries: Vec<(u32, String)> = current.clone().into_iter().collect();
        let mut shuffled_names: Vec<String> = active.iter().cloned().collect();
        // Small xorshift Fisher–Yates: no dependency on rand's API for a test shuffle.
        let mut next = |bound: usize| {
            rng_state ^= rng_state << 13;
            rng_state ^= rng_state >> 7;
            rng_state ^= rng_state << 17;
            (rng_state % bound as u64) as usize
        };
        for i in (1..shuffled_entries.len()).rev() {
            let j = next(i + 1);
            shuffled_entries.swap(i, j);
        }
        for i in (1..shuffled_names.len()).rev() {
            let j = next(i + 1);
            shuffled_names.swap(i, j);
        }
        let current2: BTreeMap<u32, String> = shuffled_entries.into_iter().collect();
        let active2: BTreeSet<String> = shuffled_names.into_iter().collect();
        prop_assert_eq!(&assign(p, &current2, &active2), &target);

        // Stable: the target is a fixed point.
        let again = assign(p, &target, &active);
        prop_assert_eq!(&again, &target);
        prop_assert_eq!(moves(&target, &again, &active), 0);
    }
}
