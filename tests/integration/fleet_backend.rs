//! The `fleet` backend (lease claiming, no warm handoffs) over real gRPC, on the memory
//! store and on a real etcd: snapshot first, convergence to balance with 1, 2 and 3
//! consumers, crash recovery within TTL + 1 s, reconnect keeping partitions, a replaced
//! registration, `Deregister` giving leases back, refused calls, and several instances
//! on one store.
//!
//! Every scenario runs an [`Auditor`] that follows the store's watch and checks, at every
//! revision, that every lease belongs to a registered member and lies below the partition
//! count; and after every change, [`settled`] checks that the leases are balanced and that
//! each consumer was told exactly the leases it holds (so no two consumers think they own
//! one partition) on every instance's status view.
//!
//! A consumer that gives partitions back hears `unassigned` before anyone is told
//! `assigned` for them, however slowly it reads; one that does not read at all has its
//! stream ended after one TTL and keeps the partitions until its registration ends.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use kafka_assigner::coordinator::{
    FleetConfig,
    fleet_backend::{FleetKeys, LeaseRecord, MemberRecord},
};
use kafka_assigner::metrics::Metrics;
use kafka_assigner::proto::v1::{
    AssignmentCommand, DeregisterAction, DeregisterRequest, PartitionReadyRequest, PartitionReleasedRequest,
    RegisterRequest, TopicPartition, assignment_command::Command, kafka_assigner_client::KafkaAssignerClient,
};
use kafka_assigner::server::AssignerServer;
use kafka_assigner::store::{LeaseStore, MemoryStore, PrefixSnapshot, WatchEventKind};
use tokio::task::JoinHandle;
use tonic::{
    Code, Status,
    transport::{Channel, Endpoint},
};

use crate::support::{
    EtcdServer,
    assigner::{
        Backend, EXPIRY, PARTITIONS, PROMPT, TOPIC, TTL, TestConsumer, TestCoordinator, TestStore, WIDE,
        connect, describe, on_both_backends,
    },
    wait_until,
};

on_both_backends!(
    snapshot_first_and_balance_with_one_two_three,
    crash_recovery_within_ttl,
    reconnect_keeps_partitions,
    second_register_replaces_the_first,
    deregister_gives_leases_back,
    refused_calls,
    several_instances_on_one_store,
    concurrent_joins_and_churn,
    the_giver_hears_first,
    a_deregistered_consumer_hears_first,
    a_giver_that_does_not_read_is_ended_and_keeps_its_leases_for_the_ttl,
);

/// Partitions of [`WIDE`].
const WIDE_PARTITIONS: u32 = 12;
/// The bound for a crashed consumer's leases to be taken: its session's TTL, plus the
/// second between two claiming rounds.
const TAKEOVER: Duration = Duration::from_secs(TTL.as_secs() + 1);

/// One assigner instance serving a fleet coordinator.
struct Node {
    coordinator: TestCoordinator,
    server: Option<AssignerServer>,
    url: String,
}

/// Fleet instances over one store, under one prefix.
struct Fleet {
    config: FleetConfig,
    keys: FleetKeys,
    nodes: Vec<Node>,
    /// Our own handle on the store, to read the state directly.
    store: Arc<dyn LeaseStore>,
    memory: Option<MemoryStore>,
    auditor: Option<Auditor>,
    /// Declared last: dropped after everything that talks to it.
    etcd: Option<EtcdServer>,
}

impl Fleet {
    async fn start(backend: Backend, nodes: usize) -> Fleet {
        Fleet::start_with(backend, nodes, |_| {}).await
    }

    /// [`Fleet::start`] with the config changed by `tweak`.
    async fn start_with(backend: Backend, nodes: usize, tweak: impl FnOnce(&mut FleetConfig)) -> Fleet {
        let TestStore { prefix, store, memory, etcd } = TestStore::start(backend, "fleet").await;
        let mut config = FleetConfig {
            backend: format!("fleet-{}", backend.name()),
            prefix,
            lease_ttl: TTL,
            claim_interval: Duration::from_millis(200),
            ..FleetConfig::default()
        };
        config.topic_partitions.insert(TOPIC.into(), PARTITIONS);
        config.topic_partitions.insert(WIDE.into(), WIDE_PARTITIONS);
        tweak(&mut config);
        let keys = FleetKeys::new(&config.prefix);
        let auditor = Some(Auditor::start(store.clone(), keys.clone()).await);
        let mut fleet = Fleet { config, keys, nodes: Vec::new(), store, memory, auditor, etcd };
        for _ in 0..nodes {
            fleet.add_node().await;
        }
        fleet
    }

    async fn add_node(&mut self) -> usize {
        let index = self.nodes.len();
        let mut config = self.config.clone();
        config.instance_id = format!("fleet-instance-{index}");
        let store = connect(self.memory.as_ref(), self.etcd.as_ref()).await;
        let metrics = Arc::new(Metrics::new());
        let coordinator = TestCoordinator::start_fleet(store, config, metrics.clone())
            .await
            .unwrap_or_else(|e| panic!("fleet instance {index} did not start: {e}"));
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let server = AssignerServer::start(coordinator.served(), metrics, any, any)
            .await
            .unwrap_or_else(|e| panic!("fleet instance {index} cannot serve: {e}"));
        let url = server.grpc_url();
        self.nodes.push(Node { coordinator, server: Some(server), url });
        index
    }

    async fn client(&self, node: usize) -> KafkaAssignerClient<Channel> {
        let url = self.nodes[node].url.clone();
        KafkaAssignerClient::connect(url.clone())
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
    }

    /// Registers `name` for `topic` on instance `node` and checks that the first message is
    /// the snapshot; returns the consumer and its snapshot.
    async fn consumer(&self, node: usize, name: &str, topic: &str) -> (TestConsumer, Vec<u32>) {
        let mut consumer =
            TestConsumer::register(self.client(node).await, name, topic).await.unwrap_or_else(|status| {
                panic!("Register({name}, {topic}) on instance {node} refused: {status:?}")
            });
        let snapshot = consumer.expect_snapshot().await.into_iter().collect();
        (consumer, snapshot)
    }

    /// Crashes instance `node`: its tasks stop, no session is revoked, no stream is ended
    /// with a status; then its servers stop.
    async fn crash(&mut self, node: usize) {
        let node = &mut self.nodes[node];
        node.coordinator.crash();
        if let Some(server) = node.server.take() {
            tokio::time::timeout(PROMPT, server.stop())
                .await
                .expect("servers of a crashed instance did not stop");
        }
    }

    async fn read(&self) -> PrefixSnapshot {
        self.store.get_prefix(self.keys.root()).await.unwrap_or_else(|e| panic!("cannot read the store: {e}"))
    }

    /// Lease owner by partition, read from the store.
    async fn leases(&self, topic: &str) -> BTreeMap<u32, String> {
        let snapshot = self.store.get_prefix(&self.keys.leases(topic)).await.expect("read leases");
        snapshot
            .kvs
            .iter()
            .map(|kv| {
                let partition = kv.key.rsplit('/').next().and_then(|p| p.parse().ok()).expect("lease key");
                let record: LeaseRecord = serde_json::from_slice(&kv.value).expect("lease record");
                (partition, record.owner)
            })
            .collect()
    }

    /// Names of the topic's registered members, read from the store.
    async fn members(&self, topic: &str) -> Vec<String> {
        let prefix = format!("{}members/{topic}/", self.keys.root());
        let snapshot = self.store.get_prefix(&prefix).await.expect("read members");
        snapshot.kvs.iter().map(|kv| kv.key[prefix.len()..].to_string()).collect()
    }

    /// Stops every instance, then the auditor, and asserts it saw no violation.
    async fn finish(mut self) {
        for node in &mut self.nodes {
            if let Some(server) = node.server.take() {
                tokio::time::timeout(PROMPT, server.stop()).await.expect("instance did not stop");
            }
        }
        if let Some(auditor) = self.auditor.take() {
            auditor.finish().await;
        }
    }
}

/// Whether `leases` are a balanced assignment of all `count` partitions to `consumers`, and
/// each consumer was told exactly its leases.
fn balanced(count: u32, leases: &BTreeMap<u32, String>, consumers: &[&mut TestConsumer]) -> bool {
    let n = consumers.len() as u32;
    if leases.len() != count as usize || leases.keys().any(|p| *p >= count) {
        return false;
    }
    consumers.iter().all(|c| {
        let held: Vec<u32> = leases.iter().filter(|(_, o)| **o == c.name).map(|(p, _)| *p).collect();
        let fair = held.len() as u32 == count / n || held.len() as u32 == count.div_ceil(n);
        fair && c.owned.iter().copied().eq(held.iter().copied()) && c.ended.is_none()
    }) && leases.values().all(|o| consumers.iter().any(|c| c.name == *o))
}

/// Waits until `topic` is balanced over `consumers` (see [`balanced`]) in the store and in
/// the consumers' views, and every running instance's status view shows the same owners;
/// returns the leases and how long it took.
async fn settled(
    fleet: &Fleet,
    topic: &str,
    count: u32,
    consumers: &mut [&mut TestConsumer],
    deadline: Duration,
) -> (BTreeMap<u32, String>, Duration) {
    let start = Instant::now();
    let give_up = tokio::time::Instant::now() + deadline;
    loop {
        for consumer in consumers.iter_mut() {
            consumer.poll_now();
        }
        let leases = fleet.leases(topic).await;
        if balanced(count, &leases, consumers) {
            let owners: Vec<Option<String>> = (0..count).map(|p| leases.get(&p).cloned()).collect();
            let mut views_agree = true;
            for node in fleet.nodes.iter().filter(|n| n.server.is_some()) {
                let status = node.coordinator.status().await;
                let view = status.topics.iter().find(|t| t.topic == topic);
                views_agree &= view.is_some_and(|t| t.owners == owners && t.handoffs.is_empty());
            }
            if views_agree {
                return (leases, start.elapsed());
            }
        }
        if tokio::time::Instant::now() >= give_up {
            panic!(
                "topic {topic} did not settle within {deadline:?}: leases {leases:?}; consumers {consumers:#?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Follows the store's watch and checks the store invariants at every revision: every
/// lease's owner has a member record, and every lease is below the topic's count.
struct Auditor {
    task: JoinHandle<()>,
    violations: Arc<Mutex<Vec<String>>>,
    revisions: Arc<Mutex<u64>>,
}

#[derive(Default)]
struct Replica {
    counts: BTreeMap<String, u32>,
    members: BTreeMap<(String, String), MemberRecord>,
    leases: BTreeMap<(String, u32), String>,
}

impl Replica {
    fn apply(&mut self, keys: &FleetKeys, key: &str, value: Option<&[u8]>) {
        let rest = &key[keys.root().len()..];
        let parts: Vec<&str> = rest.splitn(3, '/').collect();
        match (parts.as_slice(), value) {
            (["topics", topic], Some(v)) => {
                let record: serde_json::Value = serde_json::from_slice(v).expect("topic record");
                self.counts.insert(topic.to_string(), record["partition_count"].as_u64().unwrap() as u32);
            }
            (["members", topic, name], Some(v)) => {
                self.members
                    .insert((topic.to_string(), name.to_string()), serde_json::from_slice(v).unwrap());
            }
            (["members", topic, name], None) => {
                self.members.remove(&(topic.to_string(), name.to_string()));
            }
            (["leases", topic, p], Some(v)) => {
                let record: LeaseRecord = serde_json::from_slice(v).unwrap();
                self.leases.insert((topic.to_string(), p.parse().unwrap()), record.owner);
            }
            (["leases", topic, p], None) => {
                self.leases.remove(&(topic.to_string(), p.parse().unwrap()));
            }
            _ => {}
        }
    }

    fn check(&self, revision: i64) -> Vec<String> {
        let mut violations = Vec::new();
        for ((topic, p), owner) in &self.leases {
            if !self.members.contains_key(&(topic.clone(), owner.clone())) {
                violations.push(format!(
                    "revision {revision}: lease {topic}/{p} of '{owner}', who has no member record"
                ));
            }
            if self.counts.get(topic).is_none_or(|c| p >= c) {
                violations.push(format!("revision {revision}: lease {topic}/{p} beyond the topic's count"));
            }
        }
        violations
    }
}

impl Auditor {
    async fn start(store: Arc<dyn LeaseStore>, keys: FleetKeys) -> Auditor {
        let snapshot = store.get_prefix(keys.root()).await.expect("auditor snapshot");
        let mut replica = Replica::default();
        for kv in &snapshot.kvs {
            replica.apply(&keys, &kv.key, Some(&kv.value));
        }
        let mut watch = store.watch_prefix(keys.root(), snapshot.revision + 1).await.expect("auditor watch");
        let violations = Arc::new(Mutex::new(Vec::new()));
        let revisions = Arc::new(Mutex::new(0));
        let (v, r) = (violations.clone(), revisions.clone());
        let task = tokio::spawn(async move {
            let mut current = snapshot.revision;
            while let Some(Ok(batch)) = watch.next().await {
                for event in batch.events {
                    // Check the state left by a whole revision, before the next one applies.
                    if event.revision != current {
                        v.lock().unwrap().extend(replica.check(current));
                        *r.lock().unwrap() += 1;
                        current = event.revision;
                    }
                    let value = match &event.kind {
                        WatchEventKind::Put(kv) => Some(kv.value.as_slice()),
                        WatchEventKind::Delete => None,
                    };
                    replica.apply(&keys, &event.key, value);
                }
            }
        });
        Auditor { task, violations, revisions }
    }

    async fn finish(self) {
        self.task.abort();
        let _ = self.task.await;
        let violations = self.violations.lock().unwrap().clone();
        assert!(violations.is_empty(), "store invariants violated: {violations:#?}");
        assert!(*self.revisions.lock().unwrap() > 0, "the auditor saw no revision");
    }
}

fn tp(topic: &str, partition: u32) -> Option<TopicPartition> {
    Some(TopicPartition { topic: topic.into(), partition })
}

/// One consumer gets every partition (snapshot first, then claims); a second and a third
/// join and the leases converge to 6/6 and 4/4/4 without a leader; the consumers that give
/// partitions back are told `unassigned`.
async fn snapshot_first_and_balance_with_one_two_three(backend: Backend) {
    let fleet = Fleet::start(backend, 1).await;
    let (mut a, snapshot) = fleet.consumer(0, "a", WIDE).await;
    assert!(
        snapshot.is_empty(),
        "the first consumer's snapshot is empty (nothing claimed yet): {snapshot:?}"
    );
    settled(&fleet, WIDE, WIDE_PARTITIONS, &mut [&mut a], PROMPT).await;

    let (mut b, snapshot) = fleet.consumer(0, "b", WIDE).await;
    assert!(snapshot.is_empty(), "{snapshot:?}");
    let (leases, took) = settled(&fleet, WIDE, WIDE_PARTITIONS, &mut [&mut a, &mut b], PROMPT).await;
    eprintln!("[{}] 2 consumers balanced in {took:?}: {leases:?}", backend.name());
    let unassigned: Vec<u32> = a
        .history
        .iter()
        .filter_map(|(_, c)| match &c.command {
            Some(Command::Assignment(u)) => {
                Some(u.unassigned.iter().map(|t| t.partition).collect::<Vec<_>>())
            }
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(unassigned.len(), 6, "a was told to stop exactly the 6 it gave back: {a:?}");

    let (mut c, _) = fleet.consumer(0, "c", WIDE).await;
    let (leases, took) = settled(&fleet, WIDE, WIDE_PARTITIONS, &mut [&mut a, &mut b, &mut c], PROMPT).await;
    eprintln!("[{}] 3 consumers balanced in {took:?}: {leases:?}", backend.name());
    // Only the fleet's own commands: no warms, no releases.
    for consumer in [&a, &b, &c] {
        assert!(
            consumer.history.iter().all(|(_, c)| matches!(c.command, Some(Command::Assignment(_)))),
            "{consumer:?}"
        );
    }
    // A 4-partition topic with 3 consumers: 2/1/1, and the topics do not interfere.
    let (mut x, _) = fleet.consumer(0, "a", TOPIC).await;
    let (mut y, _) = fleet.consumer(0, "b", TOPIC).await;
    let (mut z, _) = fleet.consumer(0, "c", TOPIC).await;
    settled(&fleet, TOPIC, PARTITIONS, &mut [&mut x, &mut y, &mut z], PROMPT).await;
    settled(&fleet, WIDE, WIDE_PARTITIONS, &mut [&mut a, &mut b, &mut c], PROMPT).await;
    fleet.finish().await;
}

/// A consumer whose stream drops loses its leases when its session expires, and the
/// others take them within TTL + 1 s, back to balance.
async fn crash_recovery_within_ttl(backend: Backend) {
    let fleet = Fleet::start(backend, 1).await;
    let (mut a, _) = fleet.consumer(0, "a", WIDE).await;
    let (mut b, _) = fleet.consumer(0, "b", WIDE).await;
    let (mut c, _) = fleet.consumer(0, "c", WIDE).await;
    let (before, _) = settled(&fleet, WIDE, WIDE_PARTITIONS, &mut [&mut a, &mut b, &mut c], PROMPT).await;
    let orphans: Vec<u32> = before.iter().filter(|(_, o)| *o == "b").map(|(p, _)| *p).collect();

    let crashed = Instant::now();
    b.crash().await;
    let (after, _) = settled(&fleet, WIDE, WIDE_PARTITIONS, &mut [&mut a, &mut c], EXPIRY).await;
    let took = crashed.elapsed();
    eprintln!("[{}] a crashed consumer's {} leases were taken in {took:?}", backend.name(), orphans.len());
    assert!(
        took <= TAKEOVER,
        "leases of the crashed consumer taken after {took:?} (> TTL + 1 s = {TAKEOVER:?})"
    );
    // Sticky: the survivors kept what they had.
    for (p, owner) in &before {
        if owner != "b" {
            assert_eq!(
                after.get(p),
                Some(owner),
                "partition {p} moved between survivors: {before:?} -> {after:?}"
            );
        }
    }
    assert_eq!(fleet.members(WIDE).await, vec!["a", "c"]);
    fleet.finish().await;
}

/// A consumer that reconnects within the TTL (to another instance) gets its partitions
/// back in the snapshot, and they stay its own after the old session's TTL has passed;
/// the other consumer is told nothing.
async fn reconnect_keeps_partitions(backend: Backend) {
    let mut fleet = Fleet::start(backend, 1).await;
    fleet.add_node().await;
    let (mut a, _) = fleet.consumer(0, "a", TOPIC).await;
    let (mut b, _) = fleet.consumer(1, "b", TOPIC).await;
    let (before, _) = settled(&fleet, TOPIC, PARTITIONS, &mut [&mut a, &mut b], PROMPT).await;
    let mine: Vec<u32> = a.owned.iter().copied().collect();

    a.crash().await;
    let (mut a, snapshot) = fleet.consumer(1, "a", TOPIC).await;
    assert_eq!(snapshot, mine, "the reconnected consumer's snapshot has its partitions");
    // Past the old session's TTL: nothing moves, nobody is told anything.
    b.assert_quiet(TAKEOVER).await;
    a.assert_quiet(Duration::ZERO).await;
    let (after, _) = settled(&fleet, TOPIC, PARTITIONS, &mut [&mut a, &mut b], PROMPT).await;
    assert_eq!(before, after);
    fleet.finish().await;
}

/// A second live `Register` with the same name takes the leases over (no movement); the
/// first stream is told `unassigned` and ends with `ABORTED`.
async fn second_register_replaces_the_first(backend: Backend) {
    let mut fleet = Fleet::start(backend, 1).await;
    fleet.add_node().await;
    let (mut a, _) = fleet.consumer(0, "a", TOPIC).await;
    let (mut b, _) = fleet.consumer(0, "b", TOPIC).await;
    let (before, _) = settled(&fleet, TOPIC, PARTITIONS, &mut [&mut a, &mut b], PROMPT).await;
    let mine: Vec<u32> = a.owned.iter().copied().collect();
    let (mut again, snapshot) = fleet.consumer(1, "a", TOPIC).await;
    assert_eq!(snapshot, mine);
    let end = a.expect_end(PROMPT).await;
    assert_eq!(end.as_ref().map_err(Status::code), Err(Code::Aborted), "{a:?}");
    assert!(end.unwrap_err().message().contains("replaced"));
    assert!(a.owned.is_empty(), "the replaced stream was told to stop: {a:?}");
    let (after, _) = settled(&fleet, TOPIC, PARTITIONS, &mut [&mut again, &mut b], PROMPT).await;
    assert_eq!(before, after);
    fleet.finish().await;
}

/// `Deregister` answers `SHUTDOWN_NOW`; the consumer is told `unassigned` for everything,
/// its stream ends cleanly, and the others take its leases at once (well within the TTL).
async fn deregister_gives_leases_back(backend: Backend) {
    let mut fleet = Fleet::start(backend, 1).await;
    fleet.add_node().await;
    let (mut a, _) = fleet.consumer(0, "a", TOPIC).await;
    let (mut b, _) = fleet.consumer(1, "b", TOPIC).await;
    settled(&fleet, TOPIC, PARTITIONS, &mut [&mut a, &mut b], PROMPT).await;
    let start = Instant::now();
    // Deregister through the instance that does not hold a's stream.
    let mut other = fleet.client(1).await;
    let action =
        other.deregister(DeregisterRequest { consumer_name: "a".into() }).await.unwrap().into_inner();
    assert_eq!(action.action(), DeregisterAction::ShutdownNow);
    assert_eq!(a.expect_end(PROMPT).await.map_err(|s| s.code()), Ok(()), "{a:?}");
    assert!(a.owned.is_empty(), "a was told to stop everything: {a:?}");
    let (_, _) = settled(&fleet, TOPIC, PARTITIONS, &mut [&mut b], PROMPT).await;
    let took = start.elapsed();
    eprintln!("[{}] deregistered consumer's leases taken in {took:?}", backend.name());
    assert!(took < TTL, "a deregistered consumer's leases are free at once, not after the TTL ({took:?})");
    assert_eq!(fleet.members(TOPIC).await, vec!["b"]);
    // A second Deregister: not registered any more.
    let err = other.deregister(DeregisterRequest { consumer_name: "a".into() }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");

    // A consumer whose stream already dropped deregisters (its session still alive): the
    // instance it registered through revokes the session, so nobody waits for the TTL.
    let (mut c, _) = fleet.consumer(0, "c", TOPIC).await;
    settled(&fleet, TOPIC, PARTITIONS, &mut [&mut b, &mut c], PROMPT).await;
    c.crash().await;
    let start = Instant::now();
    let action =
        other.deregister(DeregisterRequest { consumer_name: "c".into() }).await.unwrap().into_inner();
    assert_eq!(action.action(), DeregisterAction::ShutdownNow);
    settled(&fleet, TOPIC, PARTITIONS, &mut [&mut b], PROMPT).await;
    let took = start.elapsed();
    assert!(took < TTL, "a deregistered consumer's leases are free at once, not after the TTL ({took:?})");
    fleet.finish().await;
}

/// What was called, its result, the expected code and what the message must mention.
type RefusalCase = (&'static str, Result<(), Status>, Code, &'static [&'static str]);

/// Refused calls get their precise status, name what was wrong, and change nothing.
async fn refused_calls(backend: Backend) {
    let fleet = Fleet::start(backend, 1).await;
    let (mut a, _) = fleet.consumer(0, "a", TOPIC).await;
    settled(&fleet, TOPIC, PARTITIONS, &mut [&mut a], PROMPT).await;
    let before = fleet.read().await;
    let mut client = fleet.client(0).await;
    let register =
        |name: &str, topic: &str| RegisterRequest { consumer_name: name.into(), topic: topic.into() };
    let cases: Vec<RefusalCase> = vec![
        (
            "empty consumer",
            client.register(register("", TOPIC)).await.map(|_| ()),
            Code::InvalidArgument,
            &["consumer_name"],
        ),
        (
            "empty topic",
            client.register(register("x", "")).await.map(|_| ()),
            Code::InvalidArgument,
            &["topic"],
        ),
        (
            "bad topic",
            client.register(register("x", "a/b")).await.map(|_| ()),
            Code::InvalidArgument,
            &["a/b"],
        ),
        (
            "unknown topic",
            client.register(register("x", "nope")).await.map(|_| ()),
            Code::NotFound,
            &["'nope'"],
        ),
        (
            "ready",
            client
                .partition_ready(PartitionReadyRequest { consumer_name: "a".into(), partition: tp(TOPIC, 0) })
                .await
                .map(|_| ()),
            Code::FailedPrecondition,
            &["fleet backend performs no handoffs"],
        ),
        (
            "released",
            client
                .partition_released(PartitionReleasedRequest {
                    consumer_name: "a".into(),
                    partition: tp(TOPIC, 0),
                })
                .await
                .map(|_| ()),
            Code::FailedPrecondition,
            &["fleet backend performs no handoffs"],
        ),
        (
            "ready with an empty name",
            client
                .partition_ready(PartitionReadyRequest { consumer_name: "".into(), partition: tp(TOPIC, 0) })
                .await
                .map(|_| ()),
            Code::InvalidArgument,
            &["consumer_name"],
        ),
        (
            "ready without a partition",
            client
                .partition_ready(PartitionReadyRequest { consumer_name: "a".into(), partition: None })
                .await
                .map(|_| ()),
            Code::InvalidArgument,
            &["partition"],
        ),
        (
            "deregister unknown",
            client.deregister(DeregisterRequest { consumer_name: "ghost".into() }).await.map(|_| ()),
            Code::NotFound,
            &["'ghost'"],
        ),
        (
            "deregister empty",
            client.deregister(DeregisterRequest { consumer_name: "".into() }).await.map(|_| ()),
            Code::InvalidArgument,
            &["consumer_name"],
        ),
    ];
    for (what, result, code, mentions) in cases {
        let status = result.expect_err(what);
        assert_eq!(status.code(), code, "{what}: {status:?}");
        for needle in mentions {
            assert!(status.message().contains(needle), "{what}: should mention {needle:?}: {status:?}");
        }
    }
    assert_eq!(fleet.read().await, before, "refused calls must change nothing in the store");
    a.assert_quiet(Duration::from_millis(100)).await;
    fleet.finish().await;
}

/// Two instances on one store: consumers on both converge to one balanced assignment that
/// both status views show. One instance crashes: a consumer that reconnects to the other
/// within the TTL keeps its partitions; the one that does not loses them to the others
/// within TTL + 1 s.
async fn several_instances_on_one_store(backend: Backend) {
    let mut fleet = Fleet::start(backend, 2).await;
    let (mut a, _) = fleet.consumer(0, "a", WIDE).await;
    let (mut b, _) = fleet.consumer(0, "b", WIDE).await;
    let (mut c, _) = fleet.consumer(1, "c", WIDE).await;
    let (before, took) = settled(&fleet, WIDE, WIDE_PARTITIONS, &mut [&mut a, &mut b, &mut c], PROMPT).await;
    eprintln!("[{}] 3 consumers on 2 instances balanced in {took:?}", backend.name());
    let a_had: Vec<u32> = a.owned.iter().copied().collect();

    let crashed = Instant::now();
    fleet.crash(0).await;
    a.crash().await;
    b.crash().await;
    let (mut a, snapshot) = fleet.consumer(1, "a", WIDE).await;
    assert_eq!(snapshot, a_had, "a reconnected within the TTL and kept its partitions");
    let (after, _) = settled(&fleet, WIDE, WIDE_PARTITIONS, &mut [&mut a, &mut c], EXPIRY).await;
    let took = crashed.elapsed();
    eprintln!("[{}] a crashed instance's unclaimed leases were taken in {took:?}", backend.name());
    assert!(took <= TAKEOVER, "took {took:?} (> TTL + 1 s)");
    for p in &a_had {
        assert_eq!(after.get(p).map(String::as_str), Some("a"), "a kept {p}: {before:?} -> {after:?}");
    }
    // A new instance joins and a consumer on it gets its share.
    fleet.add_node().await;
    let (mut d, _) = fleet.consumer(2, "d", WIDE).await;
    settled(&fleet, WIDE, WIDE_PARTITIONS, &mut [&mut a, &mut c, &mut d], PROMPT).await;
    for consumer in [&a, &c, &d] {
        for (_, command) in &consumer.history {
            assert!(matches!(command.command, Some(Command::Assignment(_))), "{}", describe(command));
        }
    }
    fleet.finish().await;
}

/// Consumers registering at the same time on two instances contend for the same free
/// leases (compare-and-swap decides) and still converge to balance; then one crashes while
/// another joins, and one deregisters while two more join, converging again each time.
async fn concurrent_joins_and_churn(backend: Backend) {
    let fleet = Fleet::start(backend, 2).await;
    let names = ["c0", "c1", "c2", "c3", "c4"];
    let joins = names.iter().enumerate().map(|(i, name)| fleet.consumer(i % 2, name, WIDE));
    let mut consumers: Vec<TestConsumer> =
        futures::future::join_all(joins).await.into_iter().map(|(c, _)| c).collect();
    let mut refs: Vec<&mut TestConsumer> = consumers.iter_mut().collect();
    let (_, took) = settled(&fleet, WIDE, WIDE_PARTITIONS, &mut refs, PROMPT).await;
    eprintln!("[{}] 5 concurrent joins on 2 instances balanced in {took:?}", backend.name());

    // c1 crashes while c5 joins.
    consumers[1].crash().await;
    let (c5, _) = fleet.consumer(1, "c5", WIDE).await;
    let mut consumers: Vec<TestConsumer> = consumers.into_iter().filter(|c| c.name != "c1").collect();
    consumers.push(c5);
    let mut refs: Vec<&mut TestConsumer> = consumers.iter_mut().collect();
    settled(&fleet, WIDE, WIDE_PARTITIONS, &mut refs, EXPIRY).await;

    // c2 deregisters while c6 and c7 join.
    let mut client = fleet.client(0).await;
    let (leave, (c6, _), (c7, _)) = tokio::join!(
        client.deregister(DeregisterRequest { consumer_name: "c2".into() }),
        fleet.consumer(0, "c6", WIDE),
        fleet.consumer(1, "c7", WIDE),
    );
    assert_eq!(leave.unwrap().into_inner().action(), DeregisterAction::ShutdownNow);
    let mut consumers: Vec<TestConsumer> = consumers.into_iter().filter(|c| c.name != "c2").collect();
    consumers.extend([c6, c7]);
    let mut refs: Vec<&mut TestConsumer> = consumers.iter_mut().collect();
    let (leases, _) = settled(&fleet, WIDE, WIDE_PARTITIONS, &mut refs, PROMPT).await;
    assert_eq!(fleet.members(WIDE).await, vec!["c0", "c3", "c4", "c5", "c6", "c7"], "{leases:?}");
    fleet.finish().await;
}

/// The partitions an `AssignmentUpdate` assigns and unassigns (empty for other commands).
fn moves(command: &AssignmentCommand) -> (BTreeSet<u32>, BTreeSet<u32>) {
    match &command.command {
        Some(Command::Assignment(u)) => (
            u.assigned.iter().map(|t| t.partition).collect(),
            u.unassigned.iter().map(|t| t.partition).collect(),
        ),
        _ => Default::default(),
    }
}

/// Waits until every partition of [`WIDE`] is leased by `owner` (read from the store).
async fn all_leased_by(fleet: &Fleet, owner: &str) {
    wait_until(PROMPT, &format!("{owner} holds every partition of {WIDE}"), || async {
        let leases = fleet.leases(WIDE).await;
        leases.len() == WIDE_PARTITIONS as usize && leases.values().all(|o| o == owner)
    })
    .await;
}

/// How long the slow giver leaves its stream unread after a consumer joined.
const SLOW_READER: Duration = Duration::from_secs(1);

/// The giver hears first. `g` holds every partition, and its stream's transport has not
/// taken its last commands (the snapshot and its claims wait in the channel, as behind a
/// slow connection or a busy consumer). `c` joins on the other instance, so `g` gives half
/// back: nobody is told `assigned` for those partitions before `g`'s transport took its
/// `unassigned`. Here the test is `g`'s transport: it reads the coordinator's stream
/// directly, so it sees the very moment a command is taken, which the wire cannot show.
async fn the_giver_hears_first(backend: Backend) {
    // The bound on the wait is one TTL: well above the slow reader's pause.
    let ttl = SLOW_READER * 5;
    let fleet = Fleet::start_with(backend, 2, |config| config.lease_ttl = ttl).await;
    let mut giver = fleet.nodes[0].coordinator.register("g", WIDE).await.expect("g registers");
    all_leased_by(&fleet, "g").await;
    let joined = Instant::now();
    let (mut c, snapshot) = fleet.consumer(1, "c", WIDE).await;
    assert!(snapshot.is_empty(), "g holds everything: {snapshot:?}");
    // g is slow: it takes nothing from its stream for a while (the scenario, not a hope).
    tokio::time::sleep(SLOW_READER).await;
    // Then its transport takes the commands one by one, noting when it took each.
    let mut taken = Vec::new();
    let (given_back, heard_at) = loop {
        // Read before the take: the command is waiting, so the take happens in this call,
        // and nobody can be told before it (a time read after it could be later than c's).
        let at = Instant::now();
        let next = tokio::time::timeout(PROMPT, giver.next()).await;
        let command = match next {
            Ok(Some(Ok(command))) => command,
            other => panic!("g: no unassigned among {taken:?}: {other:?}"),
        };
        let (_, unassigned) = moves(&command);
        taken.push(describe(&command));
        if !unassigned.is_empty() {
            break (unassigned, at);
        }
    };
    assert_eq!(given_back, (6..WIDE_PARTITIONS).collect(), "g gives back its highest half: {taken:?}");
    c.wait_owned(given_back.len(), PROMPT).await;
    for (at, command) in &c.history {
        let (assigned, _) = moves(command);
        let early: Vec<&u32> = assigned.intersection(&given_back).collect();
        assert!(
            early.is_empty() || *at > heard_at,
            "c was told assigned {early:?} {:?} after joining, before g's stream took its unassigned \
             ({:?} after joining; g took {taken:?})",
            at.duration_since(joined),
            heard_at.duration_since(joined),
        );
    }
    assert_eq!(c.owned, given_back);
    let told = c.history.iter().map(|(at, _)| *at).find(|at| *at > heard_at);
    eprintln!(
        "[{}] g took its unassigned {:?} after c joined; c was told assigned {:?} later",
        backend.name(),
        heard_at.duration_since(joined),
        told.map(|at| at.duration_since(heard_at)),
    );
    drop(giver);
    fleet.finish().await;
}

/// A giver that does not read at all cannot keep partitions forever, nor lose them before
/// it could have heard. `g` connects with a one-byte HTTP/2 window and reads nothing: its
/// snapshot fills the window, the server's HTTP/2 stream takes one more command and holds
/// it for want of window (hyper takes a chunk ahead), and nothing more is taken from its
/// channel, whether its claims came as one command or two. (With a window that let the
/// snapshot through, two claims relayed as one left that slot free for the `unassigned`.)
/// `c` joins: `g`'s give-back
/// waits one TTL for the transport, then `g`'s stream is ended (`RESOURCE_EXHAUSTED`) and
/// its registration, with every lease, ends one TTL later; only then is `c` told anything.
/// When `g` reads at last it finds the `unassigned`, then why its stream ended.
async fn a_giver_that_does_not_read_is_ended_and_keeps_its_leases_for_the_ttl(backend: Backend) {
    let fleet = Fleet::start(backend, 2).await;
    let (mut f, _) = fleet.consumer(1, "f", WIDE).await;
    settled(&fleet, WIDE, WIDE_PARTITIONS, &mut [&mut f], PROMPT).await;
    let endpoint =
        Endpoint::from_shared(fleet.nodes[0].url.clone()).expect("url").initial_stream_window_size(1);
    let channel = endpoint.connect().await.expect("g connects");
    let request = RegisterRequest { consumer_name: "g".into(), topic: WIDE.into() };
    let mut giver =
        KafkaAssignerClient::new(channel).register(request).await.expect("g registers").into_inner();
    wait_until(PROMPT, "f and g hold half each", || async {
        fleet.leases(WIDE).await.values().filter(|o| *o == "g").count() == WIDE_PARTITIONS as usize / 2
    })
    .await;
    f.wait_owned(WIDE_PARTITIONS as usize / 2, PROMPT).await;
    let mut client = fleet.client(1).await;
    let action =
        client.deregister(DeregisterRequest { consumer_name: "f".into() }).await.expect("deregister");
    assert_eq!(action.into_inner().action(), DeregisterAction::ShutdownNow);
    all_leased_by(&fleet, "g").await;

    let joined = Instant::now();
    let (mut c, _) = fleet.consumer(1, "c", WIDE).await;
    // The bound (one TTL), then g's registration's TTL, then c claims everything.
    c.wait_for(TTL + EXPIRY, "it is told assigned", |c| !c.owned.is_empty()).await;
    let first = c.history.iter().find(|(_, command)| !moves(command).0.is_empty()).map(|(at, _)| *at);
    let first = first.map(|at| at.duration_since(joined)).unwrap_or_default();
    eprintln!("[{}] c was told assigned {first:?} after joining a giver that does not read", backend.name());
    assert!(
        first >= TTL,
        "c was told assigned {first:?} after joining, before g's stream was ended for not reading: {c:?}"
    );
    c.wait_owned(WIDE_PARTITIONS as usize, PROMPT).await;

    let mut heard = Vec::new();
    let ended = loop {
        match tokio::time::timeout(PROMPT, giver.message()).await.expect("g's stream answers") {
            Ok(Some(command)) => heard.push(command),
            Ok(None) => panic!("g's stream ended cleanly after {heard:?}"),
            Err(status) => break status,
        }
    };
    let last = heard.last().map(moves).unwrap_or_default();
    assert_eq!(last.1, (6..WIDE_PARTITIONS).collect(), "g's last command stops what it gave back: {heard:?}");
    assert_eq!(ended.code(), Code::ResourceExhausted, "{ended:?}");
    assert!(ended.message().contains("is not reading its stream"), "{ended:?}");
    fleet.finish().await;
}

/// A consumer that deregisters hears that it owns nothing before anyone else is told it
/// owns its partitions. `g` holds every partition and reads nothing for a while; it
/// deregisters (`SHUTDOWN_NOW` on the fleet) and `c` joins at once. Its leases go only once
/// its transport took everything queued for it, the `unassigned` last.
async fn a_deregistered_consumer_hears_first(backend: Backend) {
    let ttl = SLOW_READER * 5;
    let fleet = Fleet::start_with(backend, 2, |config| config.lease_ttl = ttl).await;
    let mut giver = fleet.nodes[0].coordinator.register("g", WIDE).await.expect("g registers");
    all_leased_by(&fleet, "g").await;
    let mut client = fleet.client(1).await;
    client.deregister(DeregisterRequest { consumer_name: "g".into() }).await.expect("g deregisters");
    let (mut c, _) = fleet.consumer(1, "c", WIDE).await;
    // g is slow: it takes nothing from its stream for a while (the scenario, not a hope).
    tokio::time::sleep(SLOW_READER).await;
    let mut taken = Vec::new();
    let heard_at = loop {
        // Read before the take (see `the_giver_hears_first`).
        let at = Instant::now();
        let next = tokio::time::timeout(PROMPT, giver.next()).await;
        let command = match next {
            Ok(Some(Ok(command))) => command,
            other => panic!("g: no unassigned among {taken:?}: {other:?}"),
        };
        taken.push(describe(&command));
        if !moves(&command).1.is_empty() {
            break at;
        }
    };
    c.wait_owned(WIDE_PARTITIONS as usize, PROMPT).await;
    let first = c.history.iter().find(|(_, command)| !moves(command).0.is_empty()).map(|(at, _)| *at);
    assert!(
        first.is_some_and(|at| at > heard_at),
        "c was told assigned before g's stream took its unassigned (g took {taken:?})"
    );
    eprintln!(
        "[{}] c was told assigned {:?} after g took its unassigned",
        backend.name(),
        first.map(|at| at.duration_since(heard_at))
    );
    drop(giver);
    fleet.finish().await;
}
