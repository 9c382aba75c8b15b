//! Tests of [`super::Generations`] on recorded pod and ReplicaSet lists.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::{apps::v1::ReplicaSet, core::v1::Pod};

use super::{DESIRED_REPLICAS, Generations, REVISION, Rolling};
use crate::assignment::Rollout;

const OLD_DRAINING: &str = "consumer-7d9f8b6c5-x2lqp";
const OLD: &str = "consumer-7d9f8b6c5-b8k2m";
const EVICTED: &str = "consumer-7d9f8b6c5-q4zrt";
const NEW: &str = "consumer-5c4b8f7d9-m7wfn";
const RETAIN: Duration = Duration::from_secs(60);

fn list<T: serde::de::DeserializeOwned>(name: &str) -> Vec<T> {
    let path = format!("{}/tests/fixtures/k8s/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let list: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_value(list["items"].clone()).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn fixtures() -> (Vec<Pod>, Vec<ReplicaSet>) {
    (list("podlist-rollout.json"), list("replicasetlist-rollout.json"))
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|n| n.to_string()).collect()
}

fn observe(pods: &[Pod], sets: &[ReplicaSet]) -> Generations {
    Generations::observe(pods, sets, &Generations::default(), Instant::now(), RETAIN)
}

#[test]
fn two_live_generations_are_a_rollout_and_the_old_pods_are_outgoing() {
    let (pods, sets) = fixtures();
    let view = observe(&pods, &sets);
    assert_eq!(view.rolling().get("consumer"), Some(&Rolling { newest: 4, desired: 3 }));
    assert!(view.knows(OLD) && view.knows(NEW) && !view.knows(EVICTED), "an evicted pod is not alive");
    assert!(!view.knows("indexer-0") && !view.knows("debug-shell"), "not Deployment pods");
    // OLD_DRAINING is draining: live, not active. A consumer outside the Deployment counts
    // towards the final group.
    let live = names(&[OLD_DRAINING, OLD, NEW, "indexer-0"]);
    let active = names(&[OLD, NEW, "indexer-0"]);
    let rollout = view.rollout(&live, &active).expect("rolling out");
    assert_eq!(rollout, Rollout { outgoing: names(&[OLD_DRAINING, OLD]), final_members: 4 });
}

#[test]
fn one_generation_left_is_no_rollout() {
    let (mut pods, sets) = fixtures();
    pods.retain(|p| p.metadata.name.as_deref() == Some(NEW));
    let view = observe(&pods, &sets);
    assert!(view.rolling().is_empty());
    assert_eq!(view.rollout(&names(&[NEW]), &names(&[NEW])), None);
}

#[test]
fn the_last_old_pod_terminating_still_caps_the_new_ones() {
    let (mut pods, sets) = fixtures();
    pods.retain(|p| matches!(p.metadata.name.as_deref(), Some(OLD_DRAINING | NEW)));
    let view = observe(&pods, &sets);
    let rollout = view.rollout(&names(&[OLD_DRAINING, NEW]), &names(&[NEW])).expect("rolling out");
    assert_eq!(rollout, Rollout { outgoing: names(&[OLD_DRAINING]), final_members: 3 });
}

#[test]
fn a_new_replicaset_without_pods_yet_makes_every_pod_outgoing() {
    // maxSurge 0: the old ReplicaSet scales down before the new one has a pod.
    let (mut pods, sets) = fixtures();
    pods.retain(|p| p.metadata.name.as_deref() != Some(NEW));
    let view = observe(&pods, &sets);
    let rollout = view.rollout(&names(&[OLD]), &names(&[OLD])).expect("rolling out");
    assert_eq!(rollout.outgoing, names(&[OLD]));
}

#[test]
fn consumers_not_of_a_rolling_deployment_see_no_rollout() {
    let (pods, sets) = fixtures();
    let view = observe(&pods, &sets);
    let others = names(&["indexer-0", "debug-shell", "someone-else"]);
    assert_eq!(view.rollout(&others, &others), None);
}

#[test]
fn vanished_pods_are_remembered_for_a_while() {
    let (pods, sets) = fixtures();
    let t0 = Instant::now();
    let first = Generations::observe(&pods, &sets, &Generations::default(), t0, RETAIN);
    let only_new: Vec<Pod> =
        pods.iter().filter(|p| p.metadata.name.as_deref() == Some(NEW)).cloned().collect();
    let soon = Generations::observe(&only_new, &sets, &first, t0 + RETAIN / 2, RETAIN);
    assert!(soon.knows(OLD), "a crashed old pod's registration still counts as old");
    assert!(soon.rolling().is_empty(), "but no old pod is alive: the rollout is over");
    let later = Generations::observe(&only_new, &sets, &soon, t0 + RETAIN * 2, RETAIN);
    assert!(!later.knows(OLD));
}

#[test]
fn a_deployment_without_its_annotations_is_not_treated_as_rolling() {
    let (pods, mut sets) = fixtures();
    for rs in &mut sets {
        if let Some(a) = rs.metadata.annotations.as_mut() {
            a.remove(DESIRED_REPLICAS);
        }
    }
    assert!(observe(&pods, &sets).rolling().is_empty(), "no desired replicas: no cap to apply");
    let (pods, mut sets) = fixtures();
    for rs in &mut sets {
        if let Some(a) = rs.metadata.annotations.as_mut() {
            a.insert(REVISION.into(), "not a number".into());
        }
    }
    let view = observe(&pods, &sets);
    assert!(view.rolling().is_empty() && !view.knows(OLD));
}

#[test]
fn a_pod_not_listed_yet_is_classified_by_its_replicaset_name() {
    let (mut pods, sets) = fixtures();
    pods.retain(|p| p.metadata.name.as_deref() != Some(NEW));
    let view = observe(&pods, &sets);
    let fresh = "consumer-5c4b8f7d9-zz9k4";
    assert!(!view.knows(fresh));
    let rollout = view.rollout(&names(&[OLD, fresh]), &names(&[OLD, fresh])).expect("rolling out");
    assert_eq!(rollout, Rollout { outgoing: names(&[OLD]), final_members: 3 }, "new, not outside");
    // An old-generation name is old; a name of no listed ReplicaSet is outside.
    let r = view.rollout(&names(&[OLD, "consumer-7d9f8b6c5-aaaaa", "x-1"]), &names(&[OLD, "x-1"]));
    assert_eq!(r, Some(Rollout { outgoing: names(&[OLD, "consumer-7d9f8b6c5-aaaaa"]), final_members: 4 }));
}
