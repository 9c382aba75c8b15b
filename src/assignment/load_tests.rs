//! Tests of [`super::LoadBalanced`]: worked cases, and the properties of the module docs on
//! random topics (uniform topics are [`Balanced`]'s; every partition placed on an active
//! consumer; nothing moves within tolerance; the tolerance is reached when feasible; the
//! budget and cool-downs hold).

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::{LoadBalanced, LoadSettings, imbalance};
use crate::assignment::{Assignor, Balanced, ConsumerInfo, Placement, moves};

/// One topic, owning what a [`Placement`] borrows.
#[derive(Clone, Debug, Default)]
struct Topic {
    count: u32,
    weights: BTreeMap<u32, u64>,
    active: BTreeMap<String, ConsumerInfo>,
    draining: BTreeSet<String>,
    current: BTreeMap<u32, String>,
    keep_first: BTreeSet<u32>,
}

impl Topic {
    fn placement(&self) -> Placement<'_> {
        Placement {
            partition_count: self.count,
            weights: &self.weights,
            active: &self.active,
            draining: &self.draining,
            current: &self.current,
            keep_first: &self.keep_first,
        }
    }

    fn names(&self) -> BTreeSet<String> {
        self.active.keys().cloned().collect()
    }

    /// Whether the plain algorithm runs (not the delegation to `Balanced`).
    fn weighed(&self) -> bool {
        let w: BTreeSet<u64> = (0..self.count).map(|p| super::weight(&self.placement(), p)).collect();
        let caps: BTreeSet<u32> = self.active.values().map(|i| super::capacity(i.capacity)).collect();
        w.len() > 1 || caps.len() > 1
    }

    /// Whether some partition has no active owner.
    fn has_orphans(&self) -> bool {
        (0..self.count).any(|p| self.current.get(&p).is_none_or(|o| !self.active.contains_key(o)))
    }
}

fn consumer(zone: Option<&str>, capacity: u32) -> ConsumerInfo {
    ConsumerInfo { zone: zone.map(str::to_string), capacity, generation: None }
}

fn load_of(topic: &Topic, target: &BTreeMap<u32, String>, name: &str) -> u64 {
    target.iter().filter(|(_, o)| *o == name).map(|(p, _)| super::weight(&topic.placement(), *p)).sum()
}

const EPSILON: f64 = 1e-9;

#[test]
fn a_departed_consumers_partitions_spread_heaviest_first_and_nothing_else_moves() {
    // c (30) leaves a (45) and b (40): its 10, 10, 5, 5 go heaviest first to the one left
    // lower, and end 60 / 55 against shares of 57.5.
    let mut topic = Topic { count: 12, ..Topic::default() };
    let weights = [10, 10, 5, 5, 15, 15, 10, 5, 5, 5, 20, 10];
    topic.weights = weights.iter().enumerate().map(|(p, &w)| (p as u32, w)).collect();
    for (p, owner) in ["c", "c", "c", "c", "a", "a", "a", "a", "b", "b", "b", "b"].iter().enumerate() {
        topic.current.insert(p as u32, owner.to_string());
    }
    topic.active = ["a", "b"].iter().map(|n| (n.to_string(), ConsumerInfo::default())).collect();
    let target = LoadBalanced::default().assign(&topic.placement());
    assert_eq!(moves(&topic.current, &target, &topic.names()), 0);
    assert_eq!((load_of(&topic, &target, "a"), load_of(&topic, &target, "b")), (60, 55));
    assert!(imbalance(&topic.placement(), &target) <= 1.10);
}

#[test]
fn failover_places_the_heaviest_first() {
    // Weights 1, 1, 2 onto two empty consumers: in partition order it would end 3 / 1,
    // which a 60 % tolerance would then leave as it is.
    let mut topic = Topic { count: 3, ..Topic::default() };
    topic.weights = [(0, 1), (1, 1), (2, 2)].into();
    topic.active = ["a", "b"].iter().map(|n| (n.to_string(), ConsumerInfo::default())).collect();
    let loose = LoadSettings { tolerance: 0.6, ..LoadSettings::default() };
    let target = LoadBalanced::new(loose).assign(&topic.placement());
    assert_eq!((load_of(&topic, &target, "a"), load_of(&topic, &target, "b")), (2, 2), "{target:?}");
}

#[test]
fn within_tolerance_nothing_moves_beyond_it_the_largest_gain_moves_first() {
    // a carries 108 against b's 92 (shares 100): 1.08, within 10 %, so nothing moves.
    let mut topic = Topic { count: 4, ..Topic::default() };
    topic.weights = [(0, 100), (1, 8), (2, 90), (3, 2)].into();
    topic.current = [(0, "a"), (1, "a"), (2, "b"), (3, "b")].map(|(p, o)| (p, o.to_string())).into();
    topic.active = ["a", "b"].iter().map(|n| (n.to_string(), ConsumerInfo::default())).collect();
    let settings = LoadSettings { min_gain: 0.0, ..LoadSettings::default() };
    assert_eq!(LoadBalanced::new(settings).assign(&topic.placement()), topic.current);
    // At 1.15 (115 against 85), one move: partition 1 (weight 15) is the one that evens
    // them; moving the 100 would only make b the highest at 1.85.
    topic.weights.insert(1, 15);
    topic.weights.insert(2, 83);
    let target = LoadBalanced::new(settings).assign(&topic.placement());
    assert_eq!(moves(&topic.current, &target, &topic.names()), 1);
    assert_eq!(target[&1], "b");
}

#[test]
fn a_consumer_that_cannot_give_is_set_aside_and_the_next_goes_on() {
    // x carries one partition of 1.5 shares: nothing helps it. y at 1.2 still gives 50 to z.
    let mut topic = Topic { count: 4, ..Topic::default() };
    topic.weights = [(0, 150), (1, 70), (2, 50), (3, 30)].into();
    topic.current = [(0, "x"), (1, "y"), (2, "y"), (3, "z")].map(|(p, o)| (p, o.to_string())).into();
    topic.active = ["x", "y", "z"].iter().map(|n| (n.to_string(), ConsumerInfo::default())).collect();
    let target = LoadBalanced::default().assign(&topic.placement());
    assert_eq!(moves(&topic.current, &target, &topic.names()), 1);
    assert_eq!((target[&0].as_str(), target[&2].as_str()), ("x", "z"));
}

#[test]
fn between_equal_gains_the_receiver_left_lowest_takes_it() {
    // a (capacity 1) at 2.5 gives a 100: that leaves a at 1.5 whether b (capacity 1) or c
    // (capacity 2) takes it, but b would end at 1.5 and c at 1.0. c takes it, and the plan
    // ends balanced in two moves (with b it would take three).
    let mut topic = Topic { count: 5, ..Topic::default() };
    topic.weights = [(0, 100), (1, 100), (2, 50), (3, 50), (4, 100)].into();
    topic.current =
        [(0, "a"), (1, "a"), (2, "a"), (3, "b"), (4, "c")].map(|(p, o)| (p, o.to_string())).into();
    topic.active =
        [("a", 1), ("b", 1), ("c", 2)].iter().map(|(n, c)| (n.to_string(), consumer(None, *c))).collect();
    let target = LoadBalanced::default().assign(&topic.placement());
    assert_eq!(target[&0], "c");
    assert_eq!(moves(&topic.current, &target, &topic.names()), 2);
    assert!(imbalance(&topic.placement(), &target) <= 1.0 + EPSILON);
}

#[test]
fn a_move_below_the_minimum_gain_is_not_made() {
    // a can only give partitions of weight 1, each 0.1 % of a share.
    let mut topic = Topic { count: 44, ..Topic::default() };
    topic.active = ["a", "b"].iter().map(|n| (n.to_string(), ConsumerInfo::default())).collect();
    for p in 0..44 {
        let (owner, w) = if p == 0 {
            ("a", 1000)
        } else if p == 1 {
            ("b", 1000)
        } else if p < 42 {
            ("a", 1)
        } else {
            ("b", 1)
        };
        topic.current.insert(p, owner.to_string());
        topic.weights.insert(p, w);
    }
    // Loads 1040 and 1002 of 1021 each: 1.0186, within tolerance; tighten it to 1 %.
    let strict = LoadSettings { tolerance: 0.01, min_gain: 0.01, max_moves: None };
    assert_eq!(LoadBalanced::new(strict).assign(&topic.placement()), topic.current);
    let eager = LoadSettings { min_gain: 0.0, ..strict };
    let target = LoadBalanced::new(eager).assign(&topic.placement());
    assert!(moves(&topic.current, &target, &topic.names()) > 0);
}

#[test]
fn capacity_scales_the_share() {
    // b has twice a's capacity: from nothing, b ends with about two thirds of the weight.
    let mut topic = Topic { count: 60, ..Topic::default() };
    topic.weights = (0..60).map(|p| (p, 1 + u64::from(p % 7))).collect();
    topic.active = [("a".to_string(), consumer(None, 1)), ("b".to_string(), consumer(None, 2))].into();
    let target = LoadBalanced::default().assign(&topic.placement());
    let (a, b) = (load_of(&topic, &target, "a"), load_of(&topic, &target, "b"));
    assert!(imbalance(&topic.placement(), &target) <= 1.10, "a {a}, b {b}");
    assert!(b > a * 3 / 2, "a {a}, b {b}");
}

#[test]
fn a_partition_goes_to_its_zone_when_that_stays_within_tolerance() {
    // x leaves; its partition 0 (weight 12, zone z2) goes to a (z1, the lightest), since c
    // (z2) would end at 62 of 47.3 (1.31): beyond 10 %, and then c would have to give up
    // a live partition. With a 35 % tolerance c takes it. Nothing moves either way.
    let mut topic = Topic { count: 5, ..Topic::default() };
    topic.weights = [(0, 12), (1, 30), (2, 50), (3, 34), (4, 16)].into();
    topic.current =
        [(0, "x"), (1, "a"), (2, "b"), (3, "c"), (4, "c")].map(|(p, o)| (p, o.to_string())).into();
    topic.active = [("a", "z1"), ("b", "z1"), ("c", "z2")]
        .iter()
        .map(|(n, z)| (n.to_string(), consumer(Some(z), 1)))
        .collect();
    let zones: BTreeMap<u32, String> = [(0, "z2".to_string())].into();
    let settings = LoadSettings::default();
    let plain = LoadBalanced { partition_zones: &zones, ..LoadBalanced::new(settings) };
    let target = plain.assign(&topic.placement());
    assert_eq!((target[&0].as_str(), moves(&topic.current, &target, &topic.names())), ("a", 0));
    let loose = LoadBalanced { settings: LoadSettings { tolerance: 0.35, ..settings }, ..plain };
    let target = loose.assign(&topic.placement());
    assert_eq!((target[&0].as_str(), moves(&topic.current, &target, &topic.names())), ("c", 0));
}

#[test]
fn a_balance_move_prefers_a_receiver_in_the_partitions_zone() {
    // a (z1) at 130 of 100 gives partition 1 (30, zone z2): b (z1, 80) would end lower
    // than c (z2, 90), but c stays within tolerance (1.20 of 1.25), so c takes it.
    let mut topic = Topic { count: 4, ..Topic::default() };
    topic.weights = [(0, 100), (1, 30), (2, 80), (3, 90)].into();
    topic.current = [(0, "a"), (1, "a"), (2, "b"), (3, "c")].map(|(p, o)| (p, o.to_string())).into();
    topic.active = [("a", "z1"), ("b", "z1"), ("c", "z2")]
        .iter()
        .map(|(n, z)| (n.to_string(), consumer(Some(z), 1)))
        .collect();
    let settings = LoadSettings { tolerance: 0.25, ..LoadSettings::default() };
    let target = LoadBalanced::new(settings).assign(&topic.placement());
    assert_eq!(target[&1], "b", "without zones the lowest receiver");
    let zones: BTreeMap<u32, String> = [(1, "z2".to_string())].into();
    let target =
        LoadBalanced { partition_zones: &zones, ..LoadBalanced::new(settings) }.assign(&topic.placement());
    assert_eq!(target[&1], "c");
}

#[test]
fn warms_in_progress_are_given_up_last() {
    // a holds 0..4 (weight 4 each) against b's 5; partitions 0 and 1 warm towards a. One
    // move is all that helps (1.52 to 1.14), and it takes partition 2, not 0.
    let mut topic = Topic { count: 5, ..Topic::default() };
    topic.weights = [(0, 4), (1, 4), (2, 4), (3, 4), (4, 5)].into();
    topic.current =
        [(0, "a"), (1, "a"), (2, "a"), (3, "a"), (4, "b")].map(|(p, o)| (p, o.to_string())).into();
    topic.active = ["a", "b"].iter().map(|n| (n.to_string(), ConsumerInfo::default())).collect();
    topic.keep_first = [0, 1].into();
    let target = LoadBalanced::default().assign(&topic.placement());
    assert_eq!(moves(&topic.current, &target, &topic.names()), 1);
    assert_eq!((target[&0].as_str(), target[&1].as_str()), ("a", "a"), "{target:?}");
}

#[test]
fn a_warm_is_given_up_when_nothing_else_helps() {
    // a holds 0 and 1 (10 and 11, both warming towards it), b nothing: one must go.
    let mut topic = Topic { count: 2, ..Topic::default() };
    topic.weights = [(0, 10), (1, 11)].into();
    topic.current = [(0, "a"), (1, "a")].map(|(p, o)| (p, o.to_string())).into();
    topic.active = ["a", "b"].iter().map(|n| (n.to_string(), ConsumerInfo::default())).collect();
    topic.keep_first = [0, 1].into();
    let target = LoadBalanced::default().assign(&topic.placement());
    assert_eq!(moves(&topic.current, &target, &topic.names()), 1, "{target:?}");
}

#[test]
fn quota_is_by_count_in_proportion_to_capacity() {
    // 10 partitions over capacities 1, 2, 1: 2.5, 5, 2.5; the extra goes to the first name.
    let topic = Topic {
        count: 10,
        active: [("a", 1), ("b", 2), ("c", 1)]
            .iter()
            .map(|(n, c)| (n.to_string(), consumer(None, *c)))
            .collect(),
        ..Topic::default()
    };
    let by_load = LoadBalanced::default();
    let quotas: Vec<usize> =
        ["a", "b", "c", "nobody"].iter().map(|c| by_load.quota(&topic.placement(), c)).collect();
    assert_eq!(quotas, [3, 5, 2, 0]);
}

/// A random topic: up to `max_p` partitions with weights from `weights`, 1..=8 consumers
/// with capacities from `caps` and maybe zones, and random warms. In half the topics every
/// partition has an active owner; in the others owners are drawn among active, draining and
/// gone consumers or none.
fn topic(
    max_p: u32,
    weights: std::ops::Range<u64>,
    caps: std::ops::Range<u32>,
) -> impl Strategy<Value = Topic> {
    (0..=max_p, 1usize..=8, 0usize..3, any::<bool>()).prop_flat_map(move |(count, n, gone, owned)| {
        let p = count as usize;
        (
            proptest::collection::vec(weights.clone(), p),
            proptest::collection::vec((caps.clone(), proptest::option::of(0u8..3)), n),
            // Owner index: < n active, then draining (one), then gone, then none.
            proptest::collection::vec(0..(n + gone + 3), p),
            proptest::collection::btree_set(0..count.max(1), 0..(p / 4 + 1)),
        )
            .prop_map(move |(weights, infos, owners, keep_first)| {
                let name = |i: usize| format!("c{i}");
                let active = infos
                    .iter()
                    .enumerate()
                    .map(|(i, (cap, zone))| {
                        (name(i), consumer(zone.map(|z| format!("z{z}")).as_deref(), *cap))
                    })
                    .collect();
                let current = owners
                    .iter()
                    .map(|&o| if owned { o % n } else { o })
                    .enumerate()
                    .filter(|&(_, o)| o < n + 1 + gone)
                    .map(|(p, o)| (p as u32, name(o)))
                    .collect();
                Topic {
                    count,
                    weights: weights.into_iter().enumerate().map(|(p, w)| (p as u32, w)).collect(),
                    active,
                    draining: [name(n)].into(),
                    current,
                    keep_first: keep_first.into_iter().filter(|&q| q < count).collect(),
                }
            })
    })
}

/// Random settings and inputs: tolerance, minimum gain, budget, cooling partitions and
/// partition zones.
fn inputs(max_p: u32) -> impl Strategy<Value = (LoadSettings, BTreeSet<u32>, BTreeMap<u32, String>)> {
    (
        0.0f64..0.5,
        prop_oneof![Just(0.0), 0.0f64..0.1],
        proptest::option::of(0usize..6),
        proptest::collection::btree_set(0..max_p, 0..10),
        proptest::collection::btree_map(0..max_p, (0u8..3).prop_map(|z| format!("z{z}")), 0..20),
    )
        .prop_map(|(tolerance, min_gain, max_moves, cooling, zones)| {
            (LoadSettings { tolerance, min_gain, max_moves }, cooling, zones)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// With every weight equal (and capacities equal), whatever the settings, it is
    /// exactly today's sticky balanced assignment, and so is the quota.
    #[test]
    fn equal_weights_are_todays_assignment(
        mut topic in topic(200, 1..2, 1..2),
        (settings, cooling, zones) in inputs(200),
        (w, stored, cap) in (0u64..5, 0usize..3, 1u32..4),
    ) {
        // All weights w: none stored (the default 1), all stored, or some stored as 1.
        topic.weights = match stored {
            0 => BTreeMap::new(),
            1 => (0..topic.count).map(|p| (p, w)).collect(),
            _ => (0..topic.count).step_by(2).map(|p| (p, 1)).collect(),
        };
        for info in topic.active.values_mut() {
            info.capacity = cap;
        }
        let by_load = LoadBalanced { settings, cooling: &cooling, partition_zones: &zones };
        let t = topic.placement();
        prop_assert_eq!(by_load.assign(&t), Balanced.assign(&t));
        for c in topic.active.keys() {
            prop_assert_eq!(by_load.quota(&t, c), Balanced.quota(&t, c));
        }
    }

    /// Any topic, any settings: every partition is placed on an active consumer, the same
    /// way twice; balance moves stay within the budget; cooling partitions with a live owner
    /// stay; with no partition to fail over, nothing moves within tolerance, and the
    /// imbalance never grows.
    #[test]
    fn every_plan_places_all_and_respects_budget_cooling_and_tolerance(
        topic in topic(120, 0..50, 0..4),
        (settings, cooling, zones) in inputs(120),
    ) {
        let by_load = LoadBalanced { settings, cooling: &cooling, partition_zones: &zones };
        let t = topic.placement();
        let target = by_load.assign(&t);
        prop_assert_eq!(target.keys().copied().collect::<Vec<_>>(), (0..topic.count).collect::<Vec<_>>());
        prop_assert!(target.values().all(|o| topic.active.contains_key(o)));
        prop_assert_eq!(&by_load.assign(&t), &target);
        let quotas: usize = topic.active.keys().map(|c| by_load.quota(&t, c)).sum();
        prop_assert_eq!(quotas, topic.count as usize);
        prop_assume!(topic.weighed());

        let names = topic.names();
        if let Some(max) = settings.max_moves {
            prop_assert!(moves(&topic.current, &target, &names) <= max);
        }
        for p in &cooling {
            if let Some(owner) = topic.current.get(p).filter(|o| names.contains(*o)) {
                prop_assert_eq!(&target[p], owner, "cooling partition {} moved", p);
            }
        }
        if !topic.has_orphans() {
            let before = imbalance(&t, &topic.current);
            let after = imbalance(&t, &target);
            prop_assert!(after <= before + EPSILON, "imbalance grew from {} to {}", before, after);
            if before <= 1.0 + settings.tolerance {
                prop_assert_eq!(&target, &topic.current);
            }
        }
    }

    /// From a plan by load, small rate changes (±5 % on a few partitions) that leave every
    /// consumer within tolerance move nothing; with the default settings.
    #[test]
    fn small_changes_within_tolerance_move_nothing(
        topic in topic(300, 50..100, 1..3),
        changes in proptest::collection::vec((0u32..300, 0.95f64..1.05), 1..30),
    ) {
        let by_load = LoadBalanced::default();
        let mut topic = Topic { current: BTreeMap::new(), ..topic };
        topic.current = by_load.assign(&topic.placement());
        for (p, factor) in changes {
            if let Some(w) = topic.weights.get_mut(&p) {
                *w = (*w as f64 * factor).round() as u64;
            }
        }
        prop_assume!(topic.weighed());
        let t = topic.placement();
        let before = imbalance(&t, &topic.current);
        let target = by_load.assign(&t);
        if before <= 1.10 {
            prop_assert_eq!(&target, &topic.current);
        }
    }

    /// When no partition weighs more than `tolerance ×` the smallest share, with no
    /// minimum gain, no cool-down and no budget, the plan ends within tolerance. (The
    /// tolerance is raised to that bound where the random one is below it.)
    #[test]
    fn the_tolerance_is_reached_when_feasible(
        topic in topic(300, 0..5, 0..4),
        (settings, _, zones) in inputs(300),
    ) {
        let t = topic.placement();
        let total: u64 = (0..topic.count).map(|p| super::weight(&t, p)).sum();
        prop_assume!(topic.weighed() && total > 0);
        let caps: Vec<f64> = topic.active.values().map(|i| f64::from(super::capacity(i.capacity))).collect();
        let smallest_share = total as f64 * caps.iter().copied().fold(f64::INFINITY, f64::min) / caps.iter().sum::<f64>();
        let heaviest = (0..topic.count).map(|p| super::weight(&t, p)).max().unwrap_or(0);
        let tolerance = settings.tolerance.max(heaviest as f64 / smallest_share);
        let settings = LoadSettings { tolerance, min_gain: 0.0, max_moves: None };
        let by_load = LoadBalanced { partition_zones: &zones, ..LoadBalanced::new(settings) };
        let target = by_load.assign(&t);
        let after = imbalance(&t, &target);
        prop_assert!(after <= 1.0 + tolerance + EPSILON, "imbalance {} > 1 + {}", after, tolerance);
    }
}
