//! Tests of the leader's plan (`plan.rs`).

use super::*;
use crate::assignment::Rollout;
use crate::handoff::{ConsumerStatus, apply_ready, apply_released};

fn state(p: u32, consumers: &[&str]) -> TopicState {
    let mut s = TopicState { partition_count: p, ..Default::default() };
    for c in consumers {
        s.consumers.insert(c.to_string(), ConsumerStatus::Active);
    }
    s
}

fn cfg() -> PlanConfig {
    PlanConfig { warm_timeout_ms: 1_000, release_timeout_ms: 500, max_warming_per_consumer: 100 }
}

#[test]
fn first_consumer_gets_everything_directly() {
    let mut s = state(4, &["a"]);
    let r = plan(&mut s, 0, &cfg(), &mut Cooldowns::default());
    assert_eq!(r.assigned_directly.len(), 4);
    assert!(s.owners.values().all(|o| o == "a"));
    assert!(s.handoffs.is_empty());
}

#[test]
fn joining_consumer_warms_before_it_owns() {
    let mut s = state(4, &["a"]);
    let mut cd = Cooldowns::default();
    plan(&mut s, 0, &cfg(), &mut cd);
    s.consumers.insert("b".into(), ConsumerStatus::Active);
    let r = plan(&mut s, 10, &cfg(), &mut cd);
    assert_eq!(r.started.len(), 2);
    assert!(s.owners.values().all(|o| o == "a"), "ownership does not change before ready");
    // Planning again changes nothing while the warm is pending.
    let before = s.clone();
    assert!(plan(&mut s, 20, &cfg(), &mut cd).is_empty());
    assert_eq!(s, before);
    for p in r.started.iter().map(|(p, _, _)| *p) {
        apply_ready(&mut s, "b", p, 30).unwrap();
        apply_released(&mut s, "a", p).unwrap();
    }
    assert!(plan(&mut s, 40, &cfg(), &mut cd).is_empty());
    assert_eq!(s.owners.values().filter(|o| *o == "b").count(), 2);
}

#[test]
fn warm_cap_limits_concurrent_warms_per_target() {
    let mut s = state(8, &["a"]);
    let mut cd = Cooldowns::default();
    plan(&mut s, 0, &cfg(), &mut cd);
    s.consumers.insert("b".into(), ConsumerStatus::Active);
    let config = PlanConfig { max_warming_per_consumer: 1, ..cfg() };
    assert_eq!(plan(&mut s, 1, &config, &mut cd).started.len(), 1);
    assert_eq!(plan(&mut s, 2, &config, &mut cd).started.len(), 0);
}

#[test]
fn target_death_cancels_and_source_death_hands_over() {
    let mut s = state(2, &["a"]);
    let mut cd = Cooldowns::default();
    plan(&mut s, 0, &cfg(), &mut cd);
    s.consumers.insert("b".into(), ConsumerStatus::Active);
    plan(&mut s, 1, &cfg(), &mut cd);
    let p = *s.handoffs.keys().next().unwrap();
    let mut b_dies = s.clone();
    b_dies.consumers.remove("b");
    let r = plan(&mut b_dies, 2, &cfg(), &mut cd);
    assert_eq!(r.cancelled, vec![p]);
    assert!(b_dies.owners.values().all(|o| o == "a"));
    let mut a_dies = s.clone();
    a_dies.consumers.remove("a");
    plan(&mut a_dies, 2, &cfg(), &mut cd);
    assert!(a_dies.owners.values().all(|o| o == "b"));
    assert!(a_dies.handoffs.is_empty());
}

#[test]
fn timeouts_cancel_warms_with_cooldown_and_force_releases() {
    let mut s = state(2, &["a"]);
    let mut cd = Cooldowns::default();
    plan(&mut s, 0, &cfg(), &mut cd);
    s.consumers.insert("b".into(), ConsumerStatus::Active);
    plan(&mut s, 0, &cfg(), &mut cd);
    let p = *s.handoffs.keys().next().unwrap();
    let r = plan(&mut s, 1_000, &cfg(), &mut cd);
    assert_eq!(r.warm_timeouts, vec![p]);
    assert!(r.started.is_empty(), "no retry during the cooldown");
    let r = plan(&mut s, 2_000, &cfg(), &mut cd);
    assert_eq!(r.started.len(), 1, "retried after the cooldown");
    apply_ready(&mut s, "b", p, 2_000).unwrap();
    let r = plan(&mut s, 2_500, &cfg(), &mut cd);
    assert_eq!(r.release_timeouts, vec![p]);
    assert!(s.handoffs.is_empty());
    assert_eq!(s.owners[&p], "b");
}

#[test]
fn draining_consumer_hands_everything_off() {
    let mut s = state(4, &["a", "b"]);
    let mut cd = Cooldowns::default();
    plan(&mut s, 0, &cfg(), &mut cd);
    s.consumers.insert("a".into(), ConsumerStatus::Draining);
    let r = plan(&mut s, 1, &cfg(), &mut cd);
    assert_eq!(r.started.len(), 2);
    assert!(r.started.iter().all(|(_, from, to)| from == "a" && to == "b"));
}

#[test]
fn during_a_rollout_a_draining_old_consumer_waits_for_room_in_the_new_generation() {
    // Old a and b split 4; new c joined and took its share (2) from them.
    let mut s = state(4, &["a", "b"]);
    let mut cd = Cooldowns::default();
    plan(&mut s, 0, &cfg(), &mut cd);
    s.consumers.insert("c".into(), ConsumerStatus::Active);
    let rollout = Rollout { outgoing: ["a".to_string(), "b".to_string()].into(), final_members: 2 };
    let r = plan_with(&mut s, 1, &cfg(), &mut cd, Some(&rollout));
    assert_eq!(r.started.len(), 2, "c warms its final share: {r:?}");
    for (p, _, _) in &r.started {
        apply_ready(&mut s, "c", *p, 2).unwrap();
        let from = s.handoffs[p].from.clone();
        apply_released(&mut s, &from, *p).unwrap();
    }
    // a drains: c is full, b is old, so a's partition waits for d.
    let a_holds: Vec<u32> = s.owners.iter().filter(|(_, o)| *o == "a").map(|(p, _)| *p).collect();
    s.consumers.insert("a".into(), ConsumerStatus::Draining);
    let r = plan_with(&mut s, 3, &cfg(), &mut cd, Some(&rollout));
    assert!(r.is_empty(), "nothing moves to an old pod or beyond c's share: {r:?}");
    // Without the rollout, b (old) would take it.
    let mut plain = s.clone();
    assert!(!plan(&mut plain, 3, &cfg(), &mut cd.clone()).started.is_empty());
    // d (new) joins: a's partitions go to d, and b's last one too.
    s.consumers.insert("d".into(), ConsumerStatus::Active);
    let r = plan_with(&mut s, 4, &cfg(), &mut cd, Some(&rollout));
    assert!(r.started.iter().all(|(_, _, to)| to == "d"), "{r:?}");
    let from_a: Vec<u32> = r.started.iter().filter(|(_, f, _)| f == "a").map(|(p, _, _)| *p).collect();
    assert_eq!(from_a, a_holds);
}
