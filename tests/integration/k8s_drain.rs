//! `--drain-policy k8s` end to end over gRPC: the coordinator asks the Kubernetes decider
//! (kube-rs against the recorded-response server of `k8s_api`) on `Deregister`.
//!
//! * a StatefulSet pod deregisters (`SHUTDOWN_NOW`), comes back within the grace, and
//!   keeps every partition: nothing moves, the other consumer is told nothing;
//! * a Deployment (ReplicaSet) pod deregisters (`WAIT_FOR_DRAIN`) and drains by handoff;
//! * RBAC refuses the lookup: `SHUTDOWN_NOW`, no error, and the metric says why.

use std::{sync::Arc, time::Duration};

use kafka_assigner::config::DrainPolicy;
use kafka_assigner::proto::v1::DeregisterAction;

use crate::k8s_api::{FakeApi, PODS, Reply, STS};
use crate::metrics::{http_get, parse_metrics};
use crate::support::assigner::{
    Backend, PARTITIONS, PROMPT, TOPIC, TTL, TestCluster, TestConsumer, all_partitions, consumer_names,
    on_both_backends, owned_by, settle, topic,
};

on_both_backends!(
    statefulset_pod_comes_back_with_zero_movement,
    replicaset_pod_drains_by_handoff,
    forbidden_lookup_answers_shutdown_now_with_a_metric,
);

async fn cluster(backend: Backend, api: &FakeApi) -> TestCluster {
    let decider = Arc::new(api.decider(Duration::from_secs(5)));
    TestCluster::start(backend, 1, move |c| {
        c.drain_policy = DrainPolicy::K8s;
        c.drain_decider = Some(decider);
    })
    .await
}

/// Two consumers splitting [`TOPIC`], settled.
async fn pair(cluster: &TestCluster, first: &str, second: &str) -> (TestConsumer, TestConsumer) {
    let mut a = cluster.consumer(first).await;
    a.expect_snapshot().await;
    a.wait_owned(PARTITIONS as usize, PROMPT).await;
    let mut b = cluster.consumer(second).await;
    b.expect_snapshot().await;
    settle(cluster, TOPIC, &mut [&mut a, &mut b], PROMPT).await;
    assert_eq!(a.owned.len(), PARTITIONS as usize / 2, "{a:?}");
    (a, b)
}

async fn statefulset_pod_comes_back_with_zero_movement(backend: Backend) {
    let pod = format!("{PODS}consumer-1");
    let api = FakeApi::start(&[
        (&pod, Reply::Fixture(200, "pod-statefulset.json")),
        (STS, Reply::Fixture(200, "statefulset.json")),
    ])
    .await;
    let cluster = cluster(backend, &api).await;
    let (mut other, mut leaving) = pair(&cluster, "consumer-0", "consumer-1").await;
    let owners_before = topic(&cluster.status().await, TOPIC).owners.clone();
    let other_seen = other.seen();

    assert_eq!(leaving.deregister().await.expect("Deregister"), DeregisterAction::ShutdownNow);
    leaving.crash().await; // the pod restarts
    // Deliberately past the TTL: an unheld registration would be gone by now.
    tokio::time::sleep(TTL + Duration::from_secs(1)).await;
    let mut back = cluster.consumer("consumer-1").await;
    assert_eq!(back.expect_snapshot().await, leaving.owned, "the restarted pod gets its partitions back");
    back.assert_quiet(Duration::from_millis(300)).await;
    other.poll_now();
    assert_eq!(other.seen(), other_seen, "the other consumer was told nothing: {other:?}");
    let t = topic(&cluster.status().await, TOPIC).clone();
    assert_eq!(t.owners, owners_before, "zero movement");
    assert!(t.handoffs.is_empty(), "{t:?}");
}

async fn replicaset_pod_drains_by_handoff(backend: Backend) {
    let name = "consumer-7d9f8b6c5-x2lqp";
    let pod = format!("{PODS}{name}");
    let api = FakeApi::start(&[(&pod, Reply::Fixture(200, "pod-replicaset.json"))]).await;
    let cluster = cluster(backend, &api).await;
    let (mut leaving, mut other) = pair(&cluster, name, "consumer-7d9f8b6c5-b8k2m").await;
    let parts = leaving.owned.clone();

    assert_eq!(leaving.deregister().await.expect("Deregister"), DeregisterAction::WaitForDrain);
    other.wait_warms(parts.len(), PROMPT).await;
    assert_eq!(other.warms.keys().copied().collect::<std::collections::BTreeSet<_>>(), parts);
    other.ready_all().await;
    leaving.wait_for(PROMPT, "every release", |c| c.releases.len() == parts.len()).await;
    leaving.release_all().await;
    let end = leaving.expect_end(PROMPT).await;
    assert!(end.is_ok(), "a drained stream ends cleanly: {end:?}");
    let status = cluster
        .wait_status(PROMPT, "the other pod owns everything", |s| {
            let t = topic(s, TOPIC);
            t.handoffs.is_empty() && consumer_names(t) == ["consumer-7d9f8b6c5-b8k2m"]
        })
        .await;
    assert_eq!(owned_by(topic(&status, TOPIC), "consumer-7d9f8b6c5-b8k2m"), all_partitions(PARTITIONS));
}

async fn forbidden_lookup_answers_shutdown_now_with_a_metric(backend: Backend) {
    let pod = format!("{PODS}consumer-1");
    let api = FakeApi::start(&[(&pod, Reply::Fixture(403, "status-403.json"))]).await;
    let cluster = cluster(backend, &api).await;
    let (_other, mut leaving) = pair(&cluster, "consumer-0", "consumer-1").await;
    assert_eq!(leaving.deregister().await.expect("no error to the consumer"), DeregisterAction::ShutdownNow);
    let (code, body) = http_get(cluster.instance(0).admin_addr, "/metrics").await;
    assert_eq!(code, 200);
    let m = parse_metrics(&body);
    let series = r#"kafka_assigner_drain_decisions_total{decision="shutdown_now",reason="forbidden"}"#;
    assert_eq!(m.get(series), Some(&1.0), "{body}");
}
