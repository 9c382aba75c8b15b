//! A new incarnation of a consumer name is fenced (docs/design.md §10): a `Register` that
//! replaces an earlier registration of the same name raises the epoch of every partition
//! the name owns or is warming, moving nothing, so a paused process of the old incarnation,
//! which still holds the old epochs, is refused by a fenced sink once the new one wrote.
//! On the handoff backend (memory, and etcd with the new stream on another instance) and
//! on the fleet (memory and etcd).

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc, time::Duration};

use kafka_assigner::client::Fence;
use kafka_assigner::coordinator::{FleetConfig, FleetCoordinator};
use kafka_assigner::metrics::Metrics;
use kafka_assigner::server::AssignerServer;

use kafka_assigner::proto::INCARNATION_HEADER;
use kafka_assigner::proto::v1::{RegisterRequest, kafka_assigner_client::KafkaAssignerClient};

use crate::epochs::{next_until, register, watch};
use crate::support::assigner::{
    Backend, PROMPT, TTL, TestCluster, TestConsumer, TestStore, connect, on_both_backends,
};

on_both_backends!(
    a_new_incarnation_raises_the_owned_and_warming_epochs_and_the_old_one_is_fenced,
    a_new_fleet_incarnation_raises_its_lease_epochs_and_the_old_one_is_fenced,
    the_same_process_reconnecting_keeps_its_epochs_and_another_is_raised
);

/// Partition → epoch.
type Epochs = BTreeMap<u32, u64>;

/// The old incarnation's writes are refused once the new one wrote, partition by partition.
fn old_writes_are_refused(old: &Epochs, new: &Epochs) {
    let sink = Fence::new();
    for (partition, epoch) in new {
        sink.admit_epoch("events", *partition, *epoch).expect("the new incarnation writes");
        let refused = sink.admit_epoch("events", *partition, old[partition]);
        assert!(
            refused.is_err(),
            "the paused old incarnation's write to {partition} was admitted: {refused:?}"
        );
    }
}

/// The handoff backend: `a` owns four partitions, `b` warms two of them; `a` registers
/// again (on another instance where there is one). Nothing moves, every epoch of `a`'s is
/// raised, `b`'s coming epochs stay above `a`'s, and `b` owns what it warmed above them.
async fn a_new_incarnation_raises_the_owned_and_warming_epochs_and_the_old_one_is_fenced(backend: Backend) {
    let instances = if backend == Backend::Etcd { 2 } else { 1 };
    let cluster = TestCluster::start(backend, instances, |_| {}).await;
    let first_url = cluster.instance(0).grpc_url.clone();
    let mut a = register(&first_url, "a", "events").await;
    a.wait_owned(4, PROMPT).await;
    let mut a_epochs = watch(&first_url, "a", "events").await.expect("a is registered");
    let old: Epochs =
        next_until(&mut a_epochs, |s| s.len() == 4).await.into_iter().map(|(p, (e, _))| (p, e)).collect();
    let mut b = register(&first_url, "b", "events").await;
    b.wait_warms(2, PROMPT).await;

    // The new incarnation of `a`: the old stream is replaced, nothing moves.
    let url = cluster.instance(instances - 1).grpc_url.clone();
    let mut a2 = register(&url, "a", "events").await;
    a2.wait_owned(4, PROMPT).await;
    let mut a2_epochs = watch(&url, "a", "events").await.expect("a registered again");
    let raised = |s: &BTreeMap<u32, (u64, bool)>| s.len() == 4 && s.iter().all(|(p, (e, _))| *e > old[p]);
    let new: Epochs =
        next_until(&mut a2_epochs, raised).await.into_iter().map(|(p, (e, _))| (p, e)).collect();
    assert_eq!(new.keys().collect::<Vec<_>>(), old.keys().collect::<Vec<_>>(), "nothing moved");
    old_writes_are_refused(&old, &new);

    // `b` warms two of them: it will own them above `a`'s raised epochs.
    let mut b_epochs = watch(&first_url, "b", "events").await.expect("b is registered");
    let above_a = |s: &BTreeMap<u32, (u64, bool)>| s.len() == 2 && s.iter().all(|(p, (e, _))| *e > new[p]);
    let warming = next_until(&mut b_epochs, above_a).await;
    assert!(warming.values().all(|(_, w)| *w), "b still warms: {warming:?}");
    b.ready_all().await;
    let owned = next_until(&mut b_epochs, |s| s.len() == 2 && s.values().all(|(_, w)| !w)).await;
    for (partition, (epoch, _)) in &owned {
        assert!(*epoch > new[partition], "b owns {partition} at {epoch}, not above a's {}", new[partition]);
    }
    a2.wait_for(PROMPT, "it is told to release two", |c| c.releases.len() == 2).await;
    a2.release_all().await;
    drop(a);
}

/// The fleet: `a` holds every lease; `a` registers again; its leases stay its own, with
/// raised epochs, and the old incarnation's writes are refused.
async fn a_new_fleet_incarnation_raises_its_lease_epochs_and_the_old_one_is_fenced(backend: Backend) {
    let TestStore { prefix, memory, etcd, .. } = TestStore::start(backend, "fleet-incarnation").await;
    let mut config = FleetConfig {
        backend: format!("fleet-{}", backend.name()),
        prefix,
        lease_ttl: TTL,
        claim_interval: Duration::from_millis(200),
        ..FleetConfig::default()
    };
    config.topic_partitions.insert("events".into(), 4);
    let store = connect(memory.as_ref(), etcd.as_ref()).await;
    let metrics = Arc::new(Metrics::new());
    let fleet = FleetCoordinator::start(store, config, metrics.clone()).await.expect("fleet starts");
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let server = AssignerServer::start(Arc::new(fleet), metrics, any, any).await.expect("serves");
    let url = server.grpc_url();

    let mut a = register(&url, "a", "events").await;
    a.wait_owned(4, PROMPT).await;
    let mut a_epochs = watch(&url, "a", "events").await.expect("a is registered");
    let old: Epochs =
        next_until(&mut a_epochs, |s| s.len() == 4).await.into_iter().map(|(p, (e, _))| (p, e)).collect();

    let mut a2 = register(&url, "a", "events").await;
    a2.wait_owned(4, PROMPT).await;
    let mut a2_epochs = watch(&url, "a", "events").await.expect("a registered again");
    let raised = |s: &BTreeMap<u32, (u64, bool)>| s.len() == 4 && s.iter().all(|(p, (e, _))| *e > old[p]);
    let new: Epochs =
        next_until(&mut a2_epochs, raised).await.into_iter().map(|(p, (e, _))| (p, e)).collect();
    old_writes_are_refused(&old, &new);
    drop((a, a2, server, memory, etcd));
}

/// `Register` as the client process `incarnation` (the header the client crate sends).
async fn register_as(url: &str, consumer: &str, incarnation: u64) -> TestConsumer {
    let client = KafkaAssignerClient::connect(url.to_string()).await.expect("connect");
    let mut sent = client.clone();
    let mut request =
        tonic::Request::new(RegisterRequest { consumer_name: consumer.into(), topic: "events".into() });
    request.metadata_mut().insert(INCARNATION_HEADER, incarnation.into());
    let stream = sent.register(request).await.expect("registers").into_inner();
    TestConsumer::from_stream(client, consumer, "events", stream)
}

/// The epochs `consumer` is told on `url` once it owns all four partitions.
async fn owned_epochs(url: &str, consumer: &str, done: impl Fn(&Epochs) -> bool) -> Epochs {
    let mut epochs = watch(url, consumer, "events").await.expect("registered");
    let all = |s: &BTreeMap<u32, (u64, bool)>| {
        let owned: Epochs = s.iter().map(|(p, (e, _))| (*p, *e)).collect();
        owned.len() == 4 && done(&owned)
    };
    next_until(&mut epochs, all).await.into_iter().map(|(p, (e, _))| (p, e)).collect()
}

/// A `Register` with the process number of the registration it replaces is that process
/// reconnecting: its epochs stay as they are (nothing to fence, and its handler keeps its
/// partitions undisturbed). Another number is a new process: every epoch is raised.
async fn the_same_process_reconnecting_keeps_its_epochs_and_another_is_raised(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let url = cluster.instance(0).grpc_url.clone();
    let mut first = register_as(&url, "a", 7).await;
    first.wait_owned(4, PROMPT).await;
    let before = owned_epochs(&url, "a", |_| true).await;

    let mut again = register_as(&url, "a", 7).await;
    again.wait_owned(4, PROMPT).await;
    let kept = owned_epochs(&url, "a", |_| true).await;
    assert_eq!(kept, before, "the same process reconnected: its epochs are kept");

    let mut other = register_as(&url, "a", 8).await;
    other.wait_owned(4, PROMPT).await;
    let raised = owned_epochs(&url, "a", |e| e.iter().all(|(p, epoch)| *epoch > before[p])).await;
    old_writes_are_refused(&before, &raised);
    drop((first, again, other));
}
