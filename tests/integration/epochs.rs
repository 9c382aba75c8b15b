//! The `OwnershipEpochs` service (`proto/kafka_assigner/v1/epochs.proto`, docs/design.md
//! §10) over real gRPC: the static backend's constant epochs, the fleet backend's (on the
//! memory store and on etcd) and the handoff backend's that grow with every new owner of a
//! partition, known to a warming consumer before it owns it; refused calls
//! with their codes, and a stream that ends with the consumer's registration.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use kafka_assigner::coordinator::{FleetConfig, StaticConfig, StaticCoordinator};
use kafka_assigner::metrics::Metrics;
use kafka_assigner::proto::v1::{
    EpochSnapshot, WatchEpochsRequest, kafka_assigner_client::KafkaAssignerClient,
    ownership_epochs_client::OwnershipEpochsClient,
};
use kafka_assigner::server::AssignerServer;
use tonic::{Code, Streaming};

use crate::support::assigner::{
    Backend, PROMPT, TTL, TestCluster, TestConsumer, TestStore, connect, on_both_backends,
};

/// Opens `WatchEpochs` for `consumer` on `url`.
pub(crate) async fn watch(
    url: &str,
    consumer: &str,
    topic: &str,
) -> Result<Streaming<EpochSnapshot>, tonic::Status> {
    let mut client = OwnershipEpochsClient::connect(url.to_string()).await.expect("connect");
    let request = WatchEpochsRequest { consumer_name: consumer.into(), topic: topic.into() };
    client.watch_epochs(request).await.map(|r| r.into_inner())
}

/// The next snapshot, as partition → (epoch, warming).
async fn next(stream: &mut Streaming<EpochSnapshot>) -> BTreeMap<u32, (u64, bool)> {
    let item = tokio::time::timeout(PROMPT, stream.next()).await.expect("a snapshot in time");
    let snapshot = item.expect("the stream is open").expect("not an error");
    snapshot.partitions.iter().map(|p| (p.partition, (p.epoch, p.warming))).collect()
}

/// The next snapshot that satisfies `done`.
pub(crate) async fn next_until(
    stream: &mut Streaming<EpochSnapshot>,
    done: impl Fn(&BTreeMap<u32, (u64, bool)>) -> bool,
) -> BTreeMap<u32, (u64, bool)> {
    loop {
        let snapshot = next(stream).await;
        if done(&snapshot) {
            return snapshot;
        }
    }
}

pub(crate) async fn register(url: &str, consumer: &str, topic: &str) -> TestConsumer {
    let client = KafkaAssignerClient::connect(url.to_string()).await.expect("connect");
    TestConsumer::register(client, consumer, topic).await.expect("registers")
}

/// The static backend: one snapshot of the configured partitions, all at epoch 1; calls
/// for nobody registered are refused with a code that says why; the stream ends when the
/// consumer's registration does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_backend_epochs_are_constant_and_end_with_the_registration() {
    let topics: BTreeMap<String, u32> = [("events".to_string(), 4)].into();
    let config =
        StaticConfig::from_settings("static-epochs".into(), topics, Some("a=events:0-1;b=events:2-3"), None)
            .expect("config");
    let metrics = Arc::new(Metrics::new());
    let coordinator = Arc::new(StaticCoordinator::new(config, metrics.clone()));
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let server = AssignerServer::start(coordinator, metrics, any, any).await.expect("serves");
    let url = server.grpc_url();

    let refused = |result: Result<Streaming<EpochSnapshot>, tonic::Status>| match result {
        Ok(_) => panic!("WatchEpochs was accepted"),
        Err(status) => status,
    };
    let status = refused(watch(&url, "a", "events").await);
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(status.message().contains("call Register first"), "{}", status.message());
    assert_eq!(refused(watch(&url, "", "events").await).code(), Code::InvalidArgument);
    assert_eq!(refused(watch(&url, "a", "").await).code(), Code::InvalidArgument);

    let mut a = register(&url, "a", "events").await;
    assert_eq!(a.expect_snapshot().await, BTreeSet::from([0, 1]));
    let mut epochs = watch(&url, "a", "events").await.expect("a is registered");
    assert_eq!(next(&mut epochs).await, BTreeMap::from([(0, (1, false)), (1, (1, false))]));
    a.crash().await;
    let end = tokio::time::timeout(PROMPT, epochs.next()).await.expect("the epochs end with a's stream");
    assert!(end.is_none(), "{end:?}");
}

on_both_backends!(
    handoff_epochs_are_known_at_the_warm_and_kept_at_the_flip,
    fleet_epochs_grow_with_every_new_owner,
    snapshot_revisions_are_served_and_never_go_down
);

/// The handoff backend: a partition being warmed shows the epoch its target will own it
/// with, above the owner's; after `PartitionReady` the target owns it with that epoch, and
/// the old owner's snapshot no longer has it.
async fn handoff_epochs_are_known_at_the_warm_and_kept_at_the_flip(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let url = cluster.instance(0).grpc_url.clone();
    let mut a = register(&url, "a", "events").await;
    a.wait_owned(4, PROMPT).await;
    let mut a_epochs = watch(&url, "a", "events").await.expect("a is registered");
    let first = next_until(&mut a_epochs, |s| s.len() == 4).await;
    assert!(first.values().all(|(epoch, warming)| *epoch > 0 && !warming), "{first:?}");

    let mut b = register(&url, "b", "events").await;
    b.wait_warms(2, PROMPT).await;
    let mut b_epochs = watch(&url, "b", "events").await.expect("b is registered");
    let warming = next_until(&mut b_epochs, |s| s.len() == 2).await;
    for (partition, (epoch, is_warming)) in &warming {
        assert!(is_warming, "b warms {partition}: {warming:?}");
        assert!(
            *epoch > first[partition].0,
            "b's coming epoch of {partition} is above a's: {warming:?} {first:?}"
        );
    }
    b.ready_all().await;
    let owned = next_until(&mut b_epochs, |s| s.values().all(|(_, w)| !w)).await;
    let expected: BTreeMap<u32, (u64, bool)> = warming.iter().map(|(p, (e, _))| (*p, (*e, false))).collect();
    assert_eq!(owned, expected, "b owns what it warmed, with the epoch it was told");
    let kept = next_until(&mut a_epochs, |s| s.len() == 2).await;
    for (partition, epoch) in &kept {
        assert_eq!(first[partition], *epoch, "a keeps {partition} with its epoch");
    }
    a.release_all().await;
}

/// The fleet backend: a consumer's leases carry epochs; when a second consumer joins, the
/// partitions the first gives back are owned by the second with greater epochs, and the
/// first's snapshot no longer holds them; the epochs of what the first kept do not change.
async fn fleet_epochs_grow_with_every_new_owner(backend: Backend) {
    let fleet = FleetServer::start(backend, "fleet-epochs").await;
    let url = fleet.server.grpc_url();

    let mut a = register(&url, "a", "events").await;
    a.wait_owned(4, PROMPT).await;
    let mut a_epochs = watch(&url, "a", "events").await.expect("a is registered");
    let first = next_until(&mut a_epochs, |s| s.len() == 4).await;
    assert!(first.values().all(|(epoch, warming)| *epoch > 0 && !warming), "{first:?}");

    let mut b = register(&url, "b", "events").await;
    b.wait_owned(2, PROMPT * 2).await;
    let kept = next_until(&mut a_epochs, |s| s.len() == 2).await;
    let mut b_epochs = watch(&url, "b", "events").await.expect("b is registered");
    let taken = next_until(&mut b_epochs, |s| s.len() == 2).await;
    for (partition, (epoch, _)) in &kept {
        assert_eq!(first[partition].0, *epoch, "a's kept partition {partition} keeps its epoch");
    }
    for (partition, (epoch, _)) in &taken {
        assert!(
            *epoch > first[partition].0,
            "b's epoch of partition {partition} ({epoch}) is above a's ({})",
            first[partition].0
        );
        assert!(!kept.contains_key(partition));
    }
    drop((a, b, fleet));
}

/// The snapshots a stream sent, as (revision, partition → (epoch, warming)), until one
/// satisfies `done`.
async fn revisions_until(
    stream: &mut Streaming<EpochSnapshot>,
    done: impl Fn(&BTreeMap<u32, (u64, bool)>) -> bool,
) -> Vec<(u64, BTreeMap<u32, (u64, bool)>)> {
    let mut seen = Vec::new();
    loop {
        let item = tokio::time::timeout(PROMPT, stream.next()).await.expect("a snapshot in time");
        let snapshot = item.expect("the stream is open").expect("not an error");
        let partitions = snapshot.partitions.iter().map(|p| (p.partition, (p.epoch, p.warming))).collect();
        let finished = done(&partitions);
        seen.push((snapshot.revision, partitions));
        if finished {
            return seen;
        }
    }
}

/// `EpochSnapshot.revision` (docs/design.md §10) is filled in (an assigner without it
/// sends 0), and along a stream, through a warm handoff, it never goes down. Both streams
/// are read from one instance's cache, which only moves forward: `b`'s stream, opened after
/// `a`'s first snapshot was read, starts at or above that snapshot's revision.
async fn snapshot_revisions_are_served_and_never_go_down(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let url = cluster.instance(0).grpc_url.clone();
    let mut a = register(&url, "a", "events").await;
    a.wait_owned(4, PROMPT).await;
    let mut a_epochs = watch(&url, "a", "events").await.expect("a is registered");
    let mut seen_a = revisions_until(&mut a_epochs, |s| s.len() == 4).await;
    let mut b = register(&url, "b", "events").await;
    b.wait_warms(2, PROMPT).await;
    let mut b_epochs = watch(&url, "b", "events").await.expect("b is registered");
    let mut seen_b = revisions_until(&mut b_epochs, |s| s.len() == 2).await;
    b.ready_all().await;
    seen_b.extend(revisions_until(&mut b_epochs, |s| s.len() == 2 && s.values().all(|(_, w)| !w)).await);
    seen_a.extend(revisions_until(&mut a_epochs, |s| s.len() == 2).await);
    for (name, seen) in [("a", &seen_a), ("b", &seen_b)] {
        let revisions: Vec<u64> = seen.iter().map(|(revision, _)| *revision).collect();
        println!("{}: {name}'s snapshot revisions {revisions:?}", backend.name());
        assert!(revisions.iter().all(|r| *r > 0), "{name}'s snapshots carry no revision: {seen:?}");
        assert!(revisions.windows(2).all(|w| w[0] <= w[1]), "{name}'s revisions went down: {seen:?}");
    }
    assert!(seen_b[0].0 >= seen_a[0].0, "b's stream started below a's first snapshot: {seen_a:?} {seen_b:?}");
    a.release_all().await;
}

/// A fleet instance (four partitions of `events`, on `backend`'s store) serving real gRPC.
pub(crate) struct FleetServer {
    /// The server; dropping it stops serving.
    pub server: AssignerServer,
    /// The store the instance runs on, kept alive with it.
    _store: TestStore,
}

impl FleetServer {
    /// Starts one under a prefix of its own (`name`).
    pub(crate) async fn start(backend: Backend, name: &str) -> FleetServer {
        let store = TestStore::start(backend, name).await;
        let mut config = FleetConfig {
            backend: format!("fleet-{}", backend.name()),
            prefix: store.prefix.clone(),
            lease_ttl: TTL,
            claim_interval: Duration::from_millis(200),
            ..FleetConfig::default()
        };
        config.topic_partitions.insert("events".into(), 4);
        let lease_store = connect(store.memory.as_ref(), store.etcd.as_ref()).await;
        let metrics = Arc::new(Metrics::new());
        let fleet =
            crate::support::assigner::TestCoordinator::start_fleet(lease_store, config, metrics.clone())
                .await
                .expect("fleet starts");
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let server = AssignerServer::start(fleet.served(), metrics, any, any).await.expect("serves");
        FleetServer { server, _store: store }
    }
}
