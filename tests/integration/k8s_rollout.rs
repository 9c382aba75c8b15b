//! A Deployment rollout end to end over gRPC: the leader plans with the Kubernetes rollout
//! view (kube-rs against the recorded-response server of `k8s_api`, whose pod and
//! ReplicaSet lists the test changes as the rollout proceeds), consumers deregister through
//! the `k8s` decider, and each partition moves exactly once, from an old pod to a new one.
//!
//! The rollout is `maxSurge: 1`, three replicas, 12 partitions: a new pod comes, an old one
//! drains, and so on. The first old pod drains while the first new pod already holds its
//! final share and the second is not there yet: its partitions wait for the second.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kafka_assigner::coordinator::TopicStatus;
use kafka_assigner::handoff::ConsumerStatus;
use kafka_assigner::proto::v1::{DeregisterAction, assignment_command::Command};
use serde_json::{Value, json};

use crate::k8s_api::{FakeApi, POD_LIST, PODS, RS_LIST, Reply, fixture, k8s_cluster, wait_view};
use crate::support::POLL_INTERVAL;
use crate::support::assigner::{
    Backend, PROMPT, TestCluster, TestConsumer, WIDE, on_both_backends, owned_by, try_topic,
};

on_both_backends!(each_partition_moves_exactly_once_during_a_rollout);

const OLD_RS: &str = "consumer-7d9f8b6c5";
const NEW_RS: &str = "consumer-5c4b8f7d9";
const DESIRED: u32 = 3;
const SHARE: usize = 12 / DESIRED as usize;

/// The pods and ReplicaSets the fake API lists, and serves one by one.
struct Namespace {
    api: FakeApi,
    /// Pod name → (ReplicaSet, terminating).
    pods: BTreeMap<String, (&'static str, bool)>,
    /// ReplicaSets and their revisions.
    sets: Vec<(&'static str, u64)>,
}

impl Namespace {
    fn pod(name: &str, set: &str, terminating: bool) -> Value {
        let mut pod: Value = serde_json::from_str(&fixture("pod-replicaset.json")).expect("pod fixture");
        let meta = &mut pod["metadata"];
        meta["name"] = json!(name);
        meta["generateName"] = json!(format!("{set}-"));
        meta["ownerReferences"][0]["name"] = json!(set);
        meta["labels"]["pod-template-hash"] = json!(set.rsplit('-').next());
        if !terminating && let Some(meta) = meta.as_object_mut() {
            meta.remove("deletionTimestamp");
            meta.remove("deletionGracePeriodSeconds");
        }
        pod
    }

    fn replicaset(name: &str, revision: u64) -> Value {
        let list: Value = serde_json::from_str(&fixture("replicasetlist-rollout.json")).expect("rs fixture");
        let mut rs = list["items"][1].clone();
        rs["metadata"]["name"] = json!(name);
        rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = json!(revision.to_string());
        rs["metadata"]["annotations"]["deployment.kubernetes.io/desired-replicas"] =
            json!(DESIRED.to_string());
        rs
    }

    /// Serves the current lists, and each pod at its own path.
    fn publish(&self) {
        let pods: Vec<Value> =
            self.pods.iter().map(|(name, (set, terminating))| Self::pod(name, set, *terminating)).collect();
        for pod in &pods {
            let path = format!("{PODS}{}", pod["metadata"]["name"].as_str().unwrap_or_default());
            self.api.set(&path, Some(Reply::Json(200, pod.to_string())));
        }
        let list = json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods});
        self.api.set(POD_LIST, Some(Reply::Json(200, list.to_string())));
        let sets: Vec<Value> = self.sets.iter().map(|(name, rev)| Self::replicaset(name, *rev)).collect();
        let list = json!({"kind": "ReplicaSetList", "apiVersion": "apps/v1", "metadata": {}, "items": sets});
        self.api.set(RS_LIST, Some(Reply::Json(200, list.to_string())));
    }

    fn add(&mut self, name: &str, set: &'static str) {
        self.pods.insert(name.to_string(), (set, false));
        self.publish();
    }

    fn terminate(&mut self, name: &str) {
        if let Some(pod) = self.pods.get_mut(name) {
            pod.1 = true;
        }
        self.publish();
    }

    fn remove(&mut self, name: &str) {
        self.pods.remove(name);
        self.api.set(&format!("{PODS}{name}"), None);
        self.publish();
    }
}

/// Drives `consumers` (answering warms and releases) until no handoff is in flight, every
/// connected consumer's view matches the status, and `pred` holds; returns the topic.
async fn drive(
    cluster: &TestCluster,
    consumers: &mut [&mut TestConsumer],
    what: &str,
    pred: impl Fn(&TopicStatus, &[&mut TestConsumer]) -> bool,
) -> TopicStatus {
    let give_up = tokio::time::Instant::now() + PROMPT * 2;
    loop {
        for consumer in consumers.iter_mut() {
            consumer.answer_all().await;
        }
        let status = cluster.status().await;
        if let Some(t) = try_topic(&status, WIDE)
            && t.handoffs.is_empty()
            && consumers.iter().all(|c| {
                c.ended.is_some()
                    || (c.warms.is_empty() && c.releases.is_empty() && owned_by(t, &c.name) == c.owned)
            })
            && pred(t, consumers)
        {
            return t.clone();
        }
        assert!(tokio::time::Instant::now() < give_up, "not reached: {what}; consumers: {consumers:#?}");
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

fn status_of(t: &TopicStatus, name: &str) -> Option<ConsumerStatus> {
    t.consumers.iter().find(|c| c.name == name).map(|c| c.status)
}

async fn each_partition_moves_exactly_once_during_a_rollout(backend: Backend) {
    let api = FakeApi::start(&[]).await;
    let mut ns = Namespace { api, pods: BTreeMap::new(), sets: vec![(OLD_RS, 1)] };
    let old: Vec<String> = ["aaaaa", "bbbbb", "ccccc"].iter().map(|s| format!("{OLD_RS}-{s}")).collect();
    let new: Vec<String> = ["ddddd", "eeeee", "fffff"].iter().map(|s| format!("{NEW_RS}-{s}")).collect();
    for name in &old {
        ns.add(name, OLD_RS);
    }
    let decider = ns.api.decider(Duration::from_secs(5));
    let view = Arc::new(decider.rollout_view(Duration::from_millis(100)));
    wait_view(&view, "the old pods", |g| old.iter().all(|n| g.knows(n))).await;
    let cluster = k8s_cluster(backend, decider, &view).await;

    // Before: three old pods, 4 partitions each.
    let mut a = cluster.consumer_on(0, &old[0], WIDE).await;
    let mut b = cluster.consumer_on(0, &old[1], WIDE).await;
    let mut c = cluster.consumer_on(0, &old[2], WIDE).await;
    drive(&cluster, &mut [&mut a, &mut b, &mut c], "the old pods balanced", |t, cs| {
        cs.iter().all(|c| owned_by(t, &c.name).len() == SHARE)
    })
    .await;
    let marks: BTreeMap<String, usize> = [&a, &b, &c].iter().map(|c| (c.name.clone(), c.seen())).collect();

    // The rollout starts: a new ReplicaSet and its first pod, which takes its final share
    // from the old pods.
    ns.sets.push((NEW_RS, 2));
    ns.add(&new[0], NEW_RS);
    wait_view(&view, "the rollout", |g| g.rolling().contains_key("consumer")).await;
    let mut d = cluster.consumer_on(0, &new[0], WIDE).await;
    drive(&cluster, &mut [&mut a, &mut b, &mut c, &mut d], "d holds its share", |t, _| {
        owned_by(t, &new[0]).len() == SHARE
    })
    .await;

    // The first old pod goes while d is full: its partitions wait for e.
    assert_eq!(a.deregister().await.expect("Deregister"), DeregisterAction::WaitForDrain);
    ns.terminate(&old[0]);
    let t = drive(&cluster, &mut [&mut a, &mut b, &mut c, &mut d], "a draining", |t, _| {
        status_of(t, &old[0]) == Some(ConsumerStatus::Draining)
    })
    .await;
    assert!(!owned_by(&t, &old[0]).is_empty(), "a still holds partitions: {t:?}");
    ns.add(&new[1], NEW_RS);
    let mut e = cluster.consumer_on(0, &new[1], WIDE).await;
    drive(&cluster, &mut [&mut a, &mut b, &mut c, &mut d, &mut e], "a drained into e", |t, _| {
        status_of(t, &old[0]).is_none() && owned_by(t, &new[1]).len() == SHARE
    })
    .await;
    assert_eq!(a.expect_end(PROMPT).await.map_err(|s| s.to_string()), Ok(()), "a drained cleanly");
    ns.remove(&old[0]);

    // The second old pod goes, the third new one comes; the third old pod is left empty.
    assert_eq!(b.deregister().await.expect("Deregister"), DeregisterAction::WaitForDrain);
    ns.terminate(&old[1]);
    ns.add(&new[2], NEW_RS);
    let mut f = cluster.consumer_on(0, &new[2], WIDE).await;
    drive(&cluster, &mut [&mut b, &mut c, &mut d, &mut e, &mut f], "b drained, f full", |t, _| {
        status_of(t, &old[1]).is_none() && owned_by(t, &new[2]).len() == SHARE
    })
    .await;
    ns.remove(&old[1]);
    assert_eq!(c.deregister().await.expect("Deregister"), DeregisterAction::WaitForDrain);
    ns.terminate(&old[2]);
    let t = drive(&cluster, &mut [&mut c, &mut d, &mut e, &mut f], "c gone", |t, _| {
        status_of(t, &old[2]).is_none()
    })
    .await;
    ns.remove(&old[2]);
    wait_view(&view, "the rollout's end", |g| g.rolling().is_empty()).await;
    for name in &new {
        assert_eq!(owned_by(&t, name).len(), SHARE, "{t:?}");
    }

    // What each stream was told since the rollout began: every partition assigned exactly
    // once, to a new pod, and no new pod ever gave one up.
    let mut assigned: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for consumer in [&a, &b, &c, &d, &e, &f] {
        let from = marks.get(&consumer.name).copied().unwrap_or(0);
        for command in consumer.since(from) {
            let Some(Command::Assignment(update)) = &command.command else { continue };
            for tp in &update.assigned {
                assigned.entry(tp.partition).or_default().push(consumer.name.clone());
            }
            if new.contains(&consumer.name) {
                assert!(update.unassigned.is_empty(), "a new pod gave a partition up: {consumer:?}");
            }
        }
        if new.contains(&consumer.name) {
            let released = consumer.since(0).iter().any(|c| matches!(c.command, Some(Command::Release(_))));
            assert!(!released, "a new pod was asked to release: {consumer:?}");
        }
    }
    assert_eq!(assigned.keys().copied().collect::<BTreeSet<_>>(), (0..12).collect(), "{assigned:?}");
    for (partition, owners) in &assigned {
        assert!(owners.len() == 1 && new.contains(&owners[0]), "partition {partition} moved: {owners:?}");
    }
}
