//! Partition counts from Kafka (docs/design.md §3), against librdkafka's mock cluster: a real
//! Kafka protocol endpoint on loopback (`rdkafka::mocking::MockCluster`).
//!
//! * the count is fetched and stored on the first `Register`, and `--topic-partitions`
//!   still overrides Kafka;
//! * two instances racing on the first `Register` store one value (each instance asks
//!   its own mock cluster, with different counts, so two writes would show);
//! * an unknown topic is `NOT_FOUND` naming it (the mock is not allowed to auto-create);
//! * brokers down (a closed port, or the mock cluster dropped) is `UNAVAILABLE` within
//!   the Kafka timeout, and stores nothing; the runtime is never blocked meanwhile;
//! * growth: the mock cannot add partitions to a topic (no CreatePartitions), so "Kafka
//!   after the growth" is a second mock cluster holding the larger topic, asked by the
//!   instance that becomes leader; the new partitions reach the consumers directly, and
//!   the partitions they had do not move. A smaller count from Kafka is ignored.

use std::{
    collections::BTreeSet,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use clap::Parser;
use kafka_assigner::{
    backend::coordinator_from_args,
    config::{Cli, Command as CliCommand},
    coordinator::{
        HandoffConfig, PartitionCounts,
        records::{Keys, TopicRecord, decode},
    },
    kafka::{KafkaError, KafkaMetadata},
    metrics::Metrics,
    proto::v1::assignment_command::Command,
    store::KeyValue,
};
use rdkafka::{mocking::MockCluster, producer::DefaultProducerContext};
use tonic::Code;

use crate::support::{
    assigner::{
        Backend, PROMPT, TestCluster, all_partitions, on_both_backends, owned_by, settle, topic, try_topic,
    },
    wait_until,
};

/// The Kafka timeout of these tests.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(2);
/// Topic refresh interval of these tests.
const REFRESH: Duration = Duration::from_millis(200);
/// Slack on top of [`KAFKA_TIMEOUT`] for an `UNAVAILABLE` answer on a loaded machine.
const SLACK: Duration = Duration::from_secs(2);

type Mock = MockCluster<'static, DefaultProducerContext>;

/// A one-broker mock cluster holding `topics` (name, partitions).
fn mock_cluster(topics: &[(&str, i32)]) -> Mock {
    let mock = MockCluster::new(1).expect("mock cluster");
    for (name, partitions) in topics {
        mock.create_topic(name, *partitions, 1).expect("mock topic");
    }
    mock
}

/// A metadata client of `brokers` with the test timeout.
fn kafka(brokers: &str) -> Arc<KafkaMetadata> {
    Arc::new(KafkaMetadata::new(&[brokers.to_string()], &[], KAFKA_TIMEOUT).expect("Kafka client"))
}

/// A partition-count source that counts how often it was asked, then asks Kafka.
struct Asked {
    kafka: Arc<KafkaMetadata>,
    asked: AtomicUsize,
}

impl Asked {
    fn new(kafka: Arc<KafkaMetadata>) -> Self {
        Self { kafka, asked: AtomicUsize::new(0) }
    }

    /// How many times Kafka was asked.
    fn count(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl PartitionCounts for Asked {
    async fn partition_count(&self, topic: &str) -> Result<u32, KafkaError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        self.kafka.partition_count(topic).await
    }

    fn describe(&self) -> String {
        PartitionCounts::describe(&*self.kafka)
    }
}

/// `host:port` where nothing listens.
async fn closed_port() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    drop(listener);
    addr.to_string()
}

/// A cluster of `instances` instances whose partition counts come from `kafka` (only
/// the topics of [`crate::support::assigner::test_config`] are configured).
async fn cluster(backend: Backend, instances: usize, kafka: Arc<dyn PartitionCounts>) -> TestCluster {
    TestCluster::start(backend, instances, |config: &mut HandoffConfig| {
        config.kafka = Some(kafka);
        config.topic_refresh_interval = REFRESH;
    })
    .await
}

/// The stored topic record of `name`, if any.
async fn stored_topic(cluster: &TestCluster, name: &str) -> Option<(TopicRecord, KeyValue)> {
    let key = Keys::new(&cluster.config.prefix).topic(name);
    let kv = cluster.store.get(&key).await.expect("store read")?;
    let record = decode::<TopicRecord>(&key, &kv.value).expect("topic record");
    Some((record, kv))
}

/// Register, expecting a refusal with `code`; returns the message.
async fn refused(cluster: &TestCluster, instance: usize, name: &str, topic: &str, code: Code) -> String {
    match cluster.try_consumer_on(instance, name, topic).await {
        Ok(consumer) => panic!("Register({name}, {topic}) must be refused with {code:?}: {consumer:?}"),
        Err(status) => {
            assert_eq!(status.code(), code, "Register({name}, {topic}): {status:?}");
            status.message().to_string()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_is_fetched_and_stored_on_first_register() {
    let mock = mock_cluster(&[("orders", 6), ("events", 9)]);
    let counted = Arc::new(Asked::new(kafka(&mock.bootstrap_servers())));
    let cluster = cluster(Backend::Memory, 1, counted.clone()).await;
    assert!(stored_topic(&cluster, "orders").await.is_none());

    let mut first = cluster.consumer_on(0, "c1", "orders").await;
    first.expect_snapshot().await;
    first.wait_owned(6, PROMPT).await;
    assert_eq!(first.owned, all_partitions(6));
    let (record, kv) = stored_topic(&cluster, "orders").await.expect("the count is stored");
    assert_eq!(record.partition_count, 6);

    // Later registrations use the stored count: the record is not written again.
    let mut second = cluster.consumer_on(0, "c2", "orders").await;
    second.expect_snapshot().await;
    let (_, again) = stored_topic(&cluster, "orders").await.expect("still stored");
    assert_eq!(again.mod_revision, kv.mod_revision, "the topic record was rewritten");

    // --topic-partitions overrides Kafka (events: 4 configured, 9 in Kafka), and the
    // refresh leaves a configured topic alone.
    let mut third = cluster.consumer_on(0, "c3", "events").await;
    third.expect_snapshot().await;
    third.wait_owned(4, PROMPT).await;
    // Several refreshes (each asks Kafka about `orders`).
    let asked = counted.count() + 3;
    wait_until(REFRESH * 10 + SLACK, "Kafka was asked 3 more times", || async { counted.count() >= asked })
        .await;
    assert_eq!(stored_topic(&cluster, "events").await.expect("stored").0.partition_count, 4);
    assert_eq!(topic(&cluster.status().await, "events").partition_count, 4);
    third.assert_quiet(REFRESH).await;
}

/// Both instances see a topic for the first time at once; each asks its own mock
/// cluster (4 partitions vs 6): exactly one value is stored, and both serve it.
async fn racing_instances_store_one_value(backend: Backend) {
    const TOPICS: [&str; 3] = ["race-0", "race-1", "race-2"];
    let four = mock_cluster(&TOPICS.map(|t| (t, 4)));
    let six = mock_cluster(&TOPICS.map(|t| (t, 6)));
    let mut cluster = cluster(backend, 1, kafka(&four.bootstrap_servers())).await;
    cluster.config.kafka = Some(kafka(&six.bootstrap_servers()));
    cluster.add_instance().await;

    for name in TOPICS {
        let (a, b) = tokio::join!(cluster.consumer_on(0, "a", name), cluster.consumer_on(1, "b", name));
        let (mut a, mut b) = (a, b);
        let (record, kv) = stored_topic(&cluster, name).await.expect("the count is stored");
        let count = record.partition_count;
        assert!(count == 4 || count == 6, "{name}: stored {count}");
        assert_eq!(kv.create_revision, kv.mod_revision, "{name}: the topic record was written twice");

        let status = settle(&cluster, name, &mut [&mut a, &mut b], PROMPT).await;
        assert_eq!(topic(&status, name).partition_count, count);
        cluster
            .wait_status_of(1, PROMPT, "instance 1 serves the stored count", |s| {
                try_topic(s, name).is_some_and(|t| t.partition_count == count)
            })
            .await;
        let owned: BTreeSet<u32> = a.owned.union(&b.owned).copied().collect();
        assert_eq!(owned, all_partitions(count), "{name}");
    }
}

on_both_backends!(racing_instances_store_one_value);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_topic_is_not_found() {
    let mock = mock_cluster(&[("orders", 3)]);
    let cluster = cluster(Backend::Memory, 1, kafka(&mock.bootstrap_servers())).await;
    let started = Instant::now();
    let message = refused(&cluster, 0, "c1", "no-such-topic", Code::NotFound).await;
    assert!(message.contains("no-such-topic"), "{message}");
    assert!(started.elapsed() < KAFKA_TIMEOUT, "NOT_FOUND took {:?}", started.elapsed());
    // Asking did not create it in Kafka, and nothing was stored.
    let message = refused(&cluster, 0, "c1", "no-such-topic", Code::NotFound).await;
    assert!(message.contains("does not exist in Kafka"), "{message}");
    assert!(stored_topic(&cluster, "no-such-topic").await.is_none());
    // Not even when asked to: the mock would create a 4-partition topic.
    let allow = [("allow.auto.create.topics".to_string(), "true".to_string())];
    let direct = KafkaMetadata::new(&[mock.bootstrap_servers()], &allow, KAFKA_TIMEOUT).unwrap();
    assert_eq!(
        direct.partition_count("no-such-topic").await,
        Err(KafkaError::UnknownTopic("no-such-topic".into()))
    );
    assert_eq!(direct.partition_count("orders").await, Ok(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_port_is_unavailable_within_the_timeout() {
    let cluster = cluster(Backend::Memory, 1, kafka(&closed_port().await)).await;
    let started = Instant::now();
    let message = refused(&cluster, 0, "c1", "orders", Code::Unavailable).await;
    let took = started.elapsed();
    assert!(took < KAFKA_TIMEOUT + SLACK, "UNAVAILABLE after {took:?}");
    assert!(message.contains("orders"), "{message}");
    assert!(stored_topic(&cluster, "orders").await.is_none(), "a guess was stored");
    // Configured topics do not need Kafka.
    let mut consumer = cluster.consumer_on(0, "c2", crate::support::assigner::TOPIC).await;
    consumer.expect_snapshot().await;
    eprintln!("closed port: UNAVAILABLE after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_cluster_is_unavailable_within_the_timeout() {
    let mock = mock_cluster(&[("before", 2), ("after", 2)]);
    let cluster = cluster(Backend::Memory, 1, kafka(&mock.bootstrap_servers())).await;
    let mut early = cluster.consumer_on(0, "c1", "before").await;
    early.expect_snapshot().await;
    early.wait_owned(2, PROMPT).await;

    drop(mock);
    let started = Instant::now();
    let message = refused(&cluster, 0, "c2", "after", Code::Unavailable).await;
    let took = started.elapsed();
    assert!(took < KAFKA_TIMEOUT + SLACK, "UNAVAILABLE after {took:?}");
    assert!(message.contains("after"), "{message}");
    assert!(stored_topic(&cluster, "after").await.is_none(), "a guess was stored");
    // A stored topic still registers without Kafka, and the refresh failing (every
    // 200 ms) changes nothing for its consumers.
    let mut late = cluster.consumer_on(0, "c3", "before").await;
    late.expect_snapshot().await;
    let status = settle(&cluster, "before", &mut [&mut early, &mut late], PROMPT).await;
    assert_eq!(topic(&status, "before").partition_count, 2);
    eprintln!("dropped cluster: UNAVAILABLE after {took:?}");
}

/// librdkafka's calls block; they run on the blocking pool: a single-threaded runtime
/// keeps running other tasks while a request waits for dead brokers.
#[tokio::test(flavor = "current_thread")]
async fn metadata_requests_never_block_the_runtime() {
    let client = KafkaMetadata::new(&[closed_port().await], &[], KAFKA_TIMEOUT).unwrap();
    let ticks = Arc::new(AtomicUsize::new(0));
    let ticker = {
        let ticks = ticks.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                ticks.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let started = Instant::now();
    let answer = client.partition_count("orders").await;
    let took = started.elapsed();
    ticker.abort();
    assert!(matches!(answer, Err(KafkaError::Unavailable(_))), "{answer:?}");
    assert!(took < KAFKA_TIMEOUT + SLACK, "answered after {took:?}");
    let ticked = ticks.load(Ordering::SeqCst);
    assert!(
        ticked as u128 >= took.as_millis() / 50 / 2,
        "{ticked} ticks in {took:?}: the runtime was blocked"
    );
}

/// The leader picks up a partition increase: the new partitions go to the consumers
/// directly, and no partition they had moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_growth_reaches_consumers() {
    let before = mock_cluster(&[("grow", 2)]);
    let after = mock_cluster(&[("grow", 4)]);
    let mut cluster = cluster(Backend::Memory, 1, kafka(&before.bootstrap_servers())).await;
    assert_eq!(cluster.wait_leader(PROMPT).await, 0);

    // The topic is first seen while Kafka has 2 partitions.
    let mut seed = cluster.consumer_on(0, "seed", "grow").await;
    seed.expect_snapshot().await;
    assert_eq!(stored_topic(&cluster, "grow").await.expect("stored").0.partition_count, 2);
    seed.crash().await;

    // Instance 1 sees Kafka after the growth, but does not lead: nothing changes yet.
    cluster.config.kafka = Some(kafka(&after.bootstrap_servers()));
    cluster.add_instance().await;
    let mut c1 = cluster.consumer_on(1, "c1", "grow").await;
    let mut c2 = cluster.consumer_on(1, "c2", "grow").await;
    c1.expect_snapshot().await;
    c2.expect_snapshot().await;
    let status = settle(&cluster, "grow", &mut [&mut c1, &mut c2], PROMPT * 2).await;
    assert_eq!(topic(&status, "grow").partition_count, 2, "a non-leader refreshed");
    assert_eq!((c1.owned.len(), c2.owned.len()), (1, 1));
    let (had1, had2) = (c1.owned.clone(), c2.owned.clone());
    let (seen1, seen2) = (c1.seen(), c2.seen());

    // Instance 1 takes over and refreshes: 4 partitions.
    let started = Instant::now();
    cluster.stop(0).await;
    assert_eq!(cluster.wait_leader(PROMPT).await, 1);
    c1.wait_owned(2, PROMPT).await;
    c2.wait_owned(2, PROMPT).await;
    eprintln!("growth reached the consumers {:?} after the leader change", started.elapsed());
    assert!(c1.owned.is_superset(&had1) && c2.owned.is_superset(&had2), "a partition moved: {c1:?} {c2:?}");
    assert_eq!(c1.owned.union(&c2.owned).copied().collect::<BTreeSet<_>>(), all_partitions(4));
    for (consumer, from) in [(&c1, seen1), (&c2, seen2)] {
        for command in consumer.since(from) {
            match &command.command {
                Some(Command::Assignment(update)) => assert!(update.unassigned.is_empty(), "{consumer:?}"),
                other => panic!("{}: only direct assignments expected, got {other:?}", consumer.name),
            }
        }
    }
    let status = cluster.status_of(1).await;
    let grow = topic(&status, "grow");
    assert_eq!(grow.partition_count, 4);
    assert_eq!(owned_by(grow, "c1"), c1.owned);
    assert_eq!(stored_topic(&cluster, "grow").await.expect("stored").0.partition_count, 4);
}

/// Kafka cannot shrink a topic: a smaller count (here: a leader asking a cluster where
/// the topic has fewer partitions) is logged and ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smaller_count_is_ignored() {
    let big = mock_cluster(&[("shrink", 4)]);
    let small = mock_cluster(&[("shrink", 2)]);
    let mut cluster = cluster(Backend::Memory, 1, kafka(&big.bootstrap_servers())).await;
    let mut first = cluster.consumer_on(0, "c1", "shrink").await;
    first.expect_snapshot().await;
    assert_eq!(stored_topic(&cluster, "shrink").await.expect("stored").0.partition_count, 4);

    let counted = Arc::new(Asked::new(kafka(&small.bootstrap_servers())));
    cluster.config.kafka = Some(counted.clone());
    cluster.add_instance().await;
    cluster.stop(0).await;
    assert_eq!(cluster.wait_leader(PROMPT).await, 1);
    let mut second = cluster.consumer_on(1, "c2", "shrink").await;
    second.expect_snapshot().await;
    second.wait_owned(4, PROMPT * 2).await;
    // Several refreshes by the new leader, each told 2 partitions.
    let asked = counted.count() + 3;
    wait_until(REFRESH * 10 + SLACK, "the new leader asked Kafka 3 more times", || async {
        counted.count() >= asked
    })
    .await;
    assert_eq!(stored_topic(&cluster, "shrink").await.expect("stored").0.partition_count, 4);
    second.assert_quiet(REFRESH).await;
    assert_eq!(second.owned, all_partitions(4));
}

/// The flags end to end: `serve --kafka-brokers ... --kafka-config ...` builds a
/// coordinator that asks Kafka; a bad setting stops the start naming the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_flags_configure_the_coordinator() {
    let serve = |extra: &[&str]| {
        let mut argv = vec!["kafka-assigner", "serve"];
        argv.extend_from_slice(extra);
        let CliCommand::Serve(args) = Cli::try_parse_from(argv).expect("flags").command else {
            unreachable!("serve was asked for")
        };
        args
    };
    let args = serve(&["--kafka-brokers", "127.0.0.1:9", "--kafka-config", "no.such.property=1"]);
    let error = coordinator_from_args(&args, Arc::new(Metrics::new())).await.err().expect("must not start");
    let error = error.to_string();
    assert!(error.contains("--kafka-config") && error.contains("no.such.property"), "{error}");

    let mock = mock_cluster(&[("orders", 5)]);
    let brokers = mock.bootstrap_servers();
    let args = serve(&[
        "--kafka-brokers",
        &brokers,
        "--kafka-config",
        "client.id=flags-test,socket.keepalive.enable=true",
        "--kafka-timeout",
        "2s",
        "--topic-partitions",
        "events=3",
    ]);
    let coordinator = coordinator_from_args(&args, Arc::new(Metrics::new())).await.expect("starts");
    let _orders = coordinator.register("c1", "orders").await.expect("orders is in Kafka");
    let _events = coordinator.register("c2", "events").await.expect("events is configured");
    wait_until(PROMPT, "orders has 5 partitions and events 3", || async {
        let status = coordinator.status().await;
        let count = |name| try_topic(&status, name).map(|t| t.partition_count);
        count("orders") == Some(5) && count("events") == Some(3)
    })
    .await;
    coordinator.shutdown().await;
}
