//! The client library hands every partition to the handler with its ownership epoch
//! (docs/design.md §10), against real assigners: the fleet backend (epochs that grow with
//! every new owner, on the memory store and on etcd), the static backend (epoch 1), and
//! the handoff backend (epochs known at the warm, kept at the flip). And the
//! Kafka example (against rdkafka's `MockCluster`) commits with its epoch and will not
//! resume from a newer owner's commit.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use async_trait::async_trait;
use kafka_assigner::client::{
    AssignerClient, EpochPolicy, Fence, Handler, Partition, ShutdownOutcome, WarmError,
    kafka_example::{KafkaHandler, KafkaSettings},
};
use kafka_assigner::coordinator::{FleetConfig, StaticConfig, StaticCoordinator};
use kafka_assigner::metrics::Metrics;
use kafka_assigner::server::AssignerServer;
use rdkafka::{
    ClientConfig as KafkaClientConfig, Offset, TopicPartitionList,
    consumer::{BaseConsumer, Consumer},
    mocking::MockCluster,
    producer::{DefaultProducerContext, FutureProducer, FutureRecord},
};

use crate::client::{config, wait_owned};
use crate::support::{
    assigner::{Backend, PROMPT, TOPIC, TTL, TestCluster, TestStore, connect, on_both_backends},
    wait_until,
};

/// A handler call with the partition's epoch, as recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Warm(u32, u64),
    Assigned(u32, u64),
    Release(u32, u64),
    Unassigned(u32, u64),
}

/// Records every handler call with its epoch.
#[derive(Default)]
struct Epochs {
    calls: Mutex<Vec<Call>>,
}

impl Epochs {
    fn push(&self, call: Call) {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).push(call);
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// partition → epoch of the last `assigned` call.
    fn assigned(&self) -> BTreeMap<u32, u64> {
        let mut assigned = BTreeMap::new();
        for call in self.calls() {
            if let Call::Assigned(p, epoch) = call {
                assigned.insert(p, epoch);
            }
        }
        assigned
    }

    /// The epoch the partition was given up with (`release` or `unassigned`), if it was.
    fn given_up(&self, partition: u32) -> Option<u64> {
        self.calls().into_iter().find_map(|call| match call {
            Call::Release(p, epoch) | Call::Unassigned(p, epoch) if p == partition => Some(epoch),
            _ => None,
        })
    }
}

#[async_trait]
impl Handler for Epochs {
    async fn warm(&self, p: Partition) -> Result<(), WarmError> {
        self.push(Call::Warm(p.partition, p.epoch));
        Ok(())
    }

    async fn assigned(&self, p: Partition) {
        self.push(Call::Assigned(p.partition, p.epoch));
    }

    async fn release(&self, p: Partition) {
        self.push(Call::Release(p.partition, p.epoch));
    }

    async fn unassigned(&self, p: Partition) {
        self.push(Call::Unassigned(p.partition, p.epoch));
    }
}

/// Waits until `handler` has had `assigned` for exactly `partitions`.
async fn wait_assigned(handler: &Epochs, partitions: &BTreeSet<u32>, who: &str) -> BTreeMap<u32, u64> {
    wait_until(PROMPT, &format!("{who}'s assigned calls for {partitions:?}"), || {
        let done = handler.assigned().keys().copied().collect::<BTreeSet<_>>().is_superset(partitions);
        async move { done }
    })
    .await;
    handler.assigned().into_iter().filter(|(p, _)| partitions.contains(p)).collect()
}

on_both_backends!(fleet_backend_epochs_grow_with_every_new_owner);

/// The fleet backend: the first client gets every partition with an epoch above 0; when a
/// second joins, the partitions that move reach it with greater epochs than the first
/// held them with, and the first gave them up with its own. A [`Fence`] fed both then
/// refuses the first client's epochs.
async fn fleet_backend_epochs_grow_with_every_new_owner(backend: Backend) {
    let TestStore { prefix, memory, etcd, .. } = TestStore::start(backend, "client-epochs").await;
    let mut fleet_config = FleetConfig {
        backend: format!("fleet-{}", backend.name()),
        prefix,
        lease_ttl: TTL,
        claim_interval: Duration::from_millis(200),
        ..FleetConfig::default()
    };
    fleet_config.topic_partitions.insert(TOPIC.into(), 4);
    let store = connect(memory.as_ref(), etcd.as_ref()).await;
    let metrics = Arc::new(Metrics::new());
    let fleet = crate::support::assigner::TestCoordinator::start_fleet(store, fleet_config, metrics.clone())
        .await
        .expect("fleet starts");
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let server = AssignerServer::start(fleet.served(), metrics, any, any).await.expect("serves");
    let url = [server.grpc_url()];

    let (a, b) = (Arc::new(Epochs::default()), Arc::new(Epochs::default()));
    let mut required = config(&url, "a");
    required.epochs = EpochPolicy::Required;
    let client_a = AssignerClient::start(required, a.clone(), None).expect("client a");
    let everything = wait_owned(&mut client_a.owned(), "a owns everything", |o| o.len() == 4).await;
    let first = wait_assigned(&a, &everything, "a").await;
    assert!(first.values().all(|epoch| *epoch > 0), "a's epochs: {first:?}");

    let client_b = AssignerClient::start(config(&url, "b"), b.clone(), None).expect("client b");
    let taken = wait_owned(&mut client_b.owned(), "b owns half", |o| o.len() == 2).await;
    let kept = wait_owned(&mut client_a.owned(), "a keeps half", |o| o.len() == 2).await;
    assert!(taken.is_disjoint(&kept), "b {taken:?}, a {kept:?}");
    let second = wait_assigned(&b, &taken, "b").await;
    let fence = Fence::new();
    for p in &taken {
        assert!(second[p] > first[p], "b's epoch of {p} ({}) is above a's ({})", second[p], first[p]);
        wait_until(PROMPT, &format!("a gave {p} up"), || {
            let done = a.given_up(*p).is_some();
            async move { done }
        })
        .await;
        assert_eq!(a.given_up(*p), Some(first[p]), "a gives {p} up with the epoch it held it with");
        let partition = |epoch| Partition { topic: TOPIC.into(), partition: *p, epoch };
        fence.admit(&partition(second[p])).expect("the new owner writes");
        let stale = fence.admit(&partition(first[p])).expect_err("the old owner is fenced");
        assert_eq!((stale.offered, stale.highest), (first[p], second[p]));
    }
    for p in &kept {
        let calls: Vec<Call> =
            a.calls().into_iter().filter(|c| matches!(c, Call::Assigned(q, _) if q == p)).collect();
        assert_eq!(calls, vec![Call::Assigned(*p, first[p])], "a kept {p} with its epoch, no new call");
    }
    // The fleet gives leases back on Deregister: drained or left at once, either is fine.
    client_a.shutdown().await.expect("a stops");
    client_b.shutdown().await.expect("b stops");
    drop((server, memory, etcd));
}

/// The static backend: every partition comes with epoch 1, even under `Required`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_backend_hands_out_epoch_one() {
    let topics: BTreeMap<String, u32> = [(TOPIC.to_string(), 4)].into();
    let layout = format!("a={TOPIC}:0-2;b={TOPIC}:3");
    let static_config =
        StaticConfig::from_settings("static-client-epochs".into(), topics, Some(&layout), None)
            .expect("config");
    let metrics = Arc::new(Metrics::new());
    let coordinator = Arc::new(StaticCoordinator::new(static_config, metrics.clone()));
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let server = AssignerServer::start(coordinator, metrics, any, any).await.expect("serves");

    let a = Arc::new(Epochs::default());
    let mut required = config(&[server.grpc_url()], "a");
    required.epochs = EpochPolicy::Required;
    let client = AssignerClient::start(required, a.clone(), None).expect("client a");
    let owned = wait_owned(&mut client.owned(), "a owns its three", |o| o.len() == 3).await;
    assert_eq!(owned, BTreeSet::from([0, 1, 2]));
    let epochs = wait_assigned(&a, &owned, "a").await;
    assert_eq!(epochs, BTreeMap::from([(0, 1), (1, 1), (2, 1)]));
    assert_eq!(client.shutdown().await.expect("a stops"), ShutdownOutcome::ShutdownNow);
    // Partitions run concurrently: their calls come in any order.
    let mut unassigned: Vec<(u32, u64)> = a
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Unassigned(p, epoch) => Some((p, epoch)),
            _ => None,
        })
        .collect();
    unassigned.sort_unstable();
    assert_eq!(unassigned, vec![(0, 1), (1, 1), (2, 1)], "stopping gives up epoch 1");
}

/// The handoff backend serves epochs: under `EpochPolicy::Required`, the first client owns
/// everything with epochs above 0; a second client (the default policy) warms the
/// partitions that move with the epoch it then owns them with, above the first's, which
/// releases them with its own; a `Fence` then refuses the first client's epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_backend_epochs_from_warm_to_release() {
    let cluster = TestCluster::start(Backend::Memory, 1, |_| {}).await;
    let url = [cluster.instance(0).grpc_url.clone()];

    let a = Arc::new(Epochs::default());
    let mut required = config(&url, "a");
    required.epochs = EpochPolicy::Required;
    let client_a = AssignerClient::start(required, a.clone(), None).expect("client a");
    let owned = wait_owned(&mut client_a.owned(), "a owns everything", |o| o.len() == 4).await;
    let first = wait_assigned(&a, &owned, "a").await;
    assert!(first.values().all(|epoch| *epoch > 0), "epochs served: {first:?}");

    let b = Arc::new(Epochs::default());
    let client_b = AssignerClient::start(config(&url, "b"), b.clone(), None).expect("client b");
    let taken = wait_owned(&mut client_b.owned(), "b owns half", |o| o.len() == 2).await;
    let second = wait_assigned(&b, &taken, "b").await;
    let fence = Fence::new();
    for (partition, epoch) in &second {
        let warmed = b.calls().into_iter().find_map(|call| match call {
            Call::Warm(p, e) if p == *partition => Some(e),
            _ => None,
        });
        assert_eq!(warmed, Some(*epoch), "b warmed {partition} with the epoch it owns it with");
        assert!(*epoch > first[partition], "b's epoch of {partition} is above a's: {second:?} {first:?}");
        wait_until(PROMPT, &format!("a gives {partition} up"), || {
            let done = a.given_up(*partition).is_some();
            async move { done }
        })
        .await;
        assert_eq!(a.given_up(*partition), Some(first[partition]), "a gives {partition} up with its epoch");
        fence.admit_epoch(TOPIC, *partition, *epoch).expect("the new owner writes");
        assert!(
            fence.admit_epoch(TOPIC, *partition, first[partition]).is_err(),
            "a is fenced off {partition}"
        );
    }
    client_b.shutdown().await.expect("b stops");
    client_a.shutdown().await.expect("a stops");
}

/// The Kafka example commits its offsets with `epoch=<n>` in the metadata; a consumer with
/// a lower epoch does not resume from that commit (a newer owner committed), one with the
/// same or a greater epoch does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_example_commits_its_epoch_and_refuses_a_newer_owners_commit() {
    const LEDGER: &str = "ledger";
    let mock = MockCluster::<'static, DefaultProducerContext>::new(1).expect("mock cluster");
    mock.create_topic(LEDGER, 1, 1).expect("topic");
    let brokers = mock.bootstrap_servers();
    let producer: FutureProducer =
        KafkaClientConfig::new().set("bootstrap.servers", &brokers).create().expect("producer");
    for i in 0..5 {
        let payload = format!("entry-{i}");
        producer
            .send(FutureRecord::<(), _>::to(LEDGER).payload(&payload).partition(0), Duration::from_secs(5))
            .await
            .map_err(|(error, _)| error)
            .expect("produced");
    }
    let settings = KafkaSettings {
        brokers: brokers.clone(),
        topic: LEDGER.into(),
        group_id: "ledger-writers".into(),
        timeout: Duration::from_secs(10),
    };
    let seen = Arc::new(Mutex::new(Vec::new()));
    let on_message = {
        let seen = seen.clone();
        Arc::new(move |_: i32, offset: i64, _: &[u8]| {
            seen.lock().unwrap_or_else(|p| p.into_inner()).push(offset)
        })
    };
    let at = |epoch| Partition { topic: LEDGER.into(), partition: 0, epoch };

    let owner = KafkaHandler::start(settings.clone(), on_message).expect("consumer");
    owner.assigned(at(7)).await;
    wait_until(PROMPT, "the five entries are processed", || {
        let done = seen.lock().unwrap_or_else(|p| p.into_inner()).len() == 5;
        async move { done }
    })
    .await;
    owner.release(at(7)).await;
    owner.stop();

    let reader: BaseConsumer = KafkaClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", "ledger-writers")
        .create()
        .expect("reader");
    let mut partitions = TopicPartitionList::new();
    partitions.add_partition(LEDGER, 0);
    let committed = reader.committed_offsets(partitions, Duration::from_secs(10)).expect("committed");
    let element = committed.find_partition(LEDGER, 0).expect("partition 0");
    assert_eq!((element.offset(), element.metadata()), (Offset::Offset(5), "epoch=7"));

    let nothing: kafka_assigner::client::kafka_example::OnMessage = Arc::new(|_, _, _| {});
    let superseded = KafkaHandler::start(settings.clone(), nothing.clone()).expect("consumer");
    superseded.assigned(at(6)).await;
    assert!(superseded.owned().is_empty(), "an older ownership does not resume from epoch 7's commit");
    superseded.assigned(at(8)).await;
    assert_eq!(superseded.owned(), BTreeSet::from([0]), "a newer ownership does");
    superseded.stop();
}
