//! Partition weights learned from Kafka (docs/design.md §11), against librdkafka's mock
//! cluster (`rdkafka::mocking::MockCluster`, a real Kafka protocol endpoint on loopback):
//!
//! * skewed produce traffic (one partition 10× the others) ranks that partition heaviest,
//!   with about that ratio;
//! * a lag group's committed offsets far behind on one partition raise its weight, and
//!   catching up lowers it again;
//! * zones: a partition's zone is its leader broker's rack (from `--broker-racks`);
//! * the Kafka requests of one refresh are bounded whatever the partition count: measured
//!   at 10,000 partitions from librdkafka's statistics (per-broker request counters).

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use kafka_assigner::{
    kafka_load::{KafkaLoad, KafkaLoadSettings, RequestCounts},
    weights::WeightSource,
};
use rdkafka::{
    ClientConfig, Offset, TopicPartitionList,
    consumer::{BaseConsumer, CommitMode, Consumer},
    error::{KafkaError, RDKafkaErrorCode},
    mocking::MockCluster,
    producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer},
};
use tokio_util::sync::CancellationToken;

use crate::support::wait_until;

/// How long a learned value may take to show (a few refreshes on a loaded machine).
const LEARN: Duration = Duration::from_secs(30);
/// The Kafka request timeout of these tests.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

type Mock = MockCluster<'static, DefaultProducerContext>;

/// A mock cluster of `brokers` brokers holding `topics` (name, partitions).
fn mock_cluster(brokers: i32, topics: &[(&str, i32)]) -> Mock {
    let mock = MockCluster::new(brokers).expect("mock cluster");
    for (name, partitions) in topics {
        mock.create_topic(name, *partitions, 1).expect("mock topic");
    }
    mock
}

/// A source of `mock` with `settings`.
fn source(mock: &Mock, settings: KafkaLoadSettings) -> Arc<KafkaLoad> {
    Arc::new(KafkaLoad::new(&[mock.bootstrap_servers()], &[], KAFKA_TIMEOUT, settings).expect("source"))
}

fn producer(mock: &Mock) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", mock.bootstrap_servers())
        .set("linger.ms", "5")
        .create()
        .expect("producer")
}

/// Sends one small message to `topic`'s `partition`, waiting for queue room if needed.
fn send(producer: &BaseProducer, topic: &str, partition: i32) {
    loop {
        match producer.send(BaseRecord::<(), str>::to(topic).partition(partition).payload("m")) {
            Ok(()) => return,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                producer.poll(Duration::from_millis(10));
            }
            Err((error, _)) => panic!("produce to {topic}/{partition}: {error}"),
        }
    }
}

/// Produces to `topic` at `rates[p]` messages per second on partition `p` until stopped,
/// paced by elapsed time (a late wake-up sends what is due, so the rates hold on a slow
/// machine).
struct Traffic {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Traffic {
    fn start(mock: &Mock, topic: &'static str, rates: Vec<u64>) -> Self {
        let producer = producer(mock);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let mut sent = vec![0u64; rates.len()];
            while !stopped.load(Ordering::Relaxed) {
                let elapsed = start.elapsed().as_secs_f64();
                for (p, &rate) in rates.iter().enumerate() {
                    let due = (elapsed * rate as f64) as u64;
                    while sent[p] < due {
                        send(&producer, topic, p as i32);
                        sent[p] += 1;
                    }
                }
                // Pacing the load (serving delivery reports meanwhile), not waiting on a result.
                producer.poll(Duration::from_millis(5));
            }
            let _ = producer.flush(Duration::from_secs(5));
        });
        Self { stop, thread: Some(thread) }
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_traffic_ranks_the_hot_partition_with_the_right_ratio() {
    let mock = mock_cluster(1, &[("skewed", 4)]);
    let _traffic = Traffic::start(&mock, "skewed", vec![1_000, 100, 100, 100]);
    let settings = KafkaLoadSettings {
        refresh: Duration::from_millis(200),
        window: Duration::from_secs(2),
        ..KafkaLoadSettings::default()
    };
    let source = source(&mock, settings);
    let stop = CancellationToken::new();
    let task = source.spawn(stop.clone());
    assert_eq!(source.weights("skewed"), None, "nothing is known before the first refresh");

    // Ratio and scale (milli-messages per second: p0 takes ~1,000 messages per second),
    // checked together: a producer that fell behind on a busy machine catches up in a
    // burst, which moves every weight for a moment.
    let mut last = None;
    wait_until(LEARN, "partition 0 weighs about 10× each other partition, at ~1,000,000", || {
        last = source.weights("skewed");
        let ok = last.as_ref().is_some_and(|w| {
            w.len() == 4
                && (600_000..=1_400_000).contains(&w[&0])
                && (1..4).all(|p| (7.0..=14.0).contains(&(w[&0] as f64 / w[&p] as f64)))
        });
        async move { ok }
    })
    .await;
    let weights = last.unwrap_or_default();
    println!("skewed weights (milli-messages/s): {weights:?}");
    let heaviest = weights.iter().max_by_key(|(_, w)| **w).map(|(p, _)| *p);
    assert_eq!(heaviest, Some(0));
    assert!(source.stats().errors == 0, "{:?}", source.stats());

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("the task stops").expect("no panic");
}

/// Commits `offsets` (partition, offset) of `topic` for `group` (not joining the group).
fn commit(mock: &Mock, group: &str, topic: &str, offsets: &[(i32, i64)]) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", mock.bootstrap_servers())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for &(partition, offset) in offsets {
        tpl.add_partition_offset(topic, partition, Offset::Offset(offset)).expect("tpl");
    }
    consumer.commit(&tpl, CommitMode::Sync).expect("commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_far_behind_weighs_more() {
    const BACKLOG: i64 = 6_000;
    let mock = mock_cluster(1, &[("lagging", 2)]);
    let producer = producer(&mock);
    for _ in 0..BACKLOG {
        send(&producer, "lagging", 0);
        send(&producer, "lagging", 1);
    }
    producer.flush(Duration::from_secs(10)).expect("flush");
    // p0 is consumed up to the end, p1 is 6,000 behind.
    commit(&mock, "readers", "lagging", &[(0, BACKLOG), (1, 0)]);

    let settings = KafkaLoadSettings {
        refresh: Duration::from_millis(200),
        lag_group: Some("readers".into()),
        lag_horizon: Duration::from_secs(60),
        ..KafkaLoadSettings::default()
    };
    let source = source(&mock, settings);
    let stop = CancellationToken::new();
    let task = source.spawn(stop.clone());
    assert!(source.describe().contains("readers"), "{}", source.describe());

    // Nothing is produced any more: rate 0 (weight 1) on p0; p1 drains 6,000 in 60 s,
    // 100 messages per second: 100,000.
    let expected = BTreeMap::from([(0, 1), (1, 100_000)]);
    let mut last = None;
    wait_until(LEARN, "p1's backlog raises its weight", || {
        last = source.weights("lagging");
        let ok = last.as_ref() == Some(&expected);
        async move { ok }
    })
    .await;

    // The consumers catch up: the lag (and the weight) is gone at the next refresh.
    commit(&mock, "readers", "lagging", &[(1, BACKLOG)]);
    let caught_up = BTreeMap::from([(0, 1), (1, 1)]);
    wait_until(LEARN, "p1's weight falls once it caught up", || {
        last = source.weights("lagging");
        let ok = last.as_ref() == Some(&caught_up);
        async move { ok }
    })
    .await;
    assert_eq!(source.stats().errors, 0, "{:?}", source.stats());
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("the task stops").expect("no panic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zones_are_the_leaders_racks() {
    let mock = mock_cluster(3, &[("zoned", 6)]);
    for p in 0..6 {
        mock.partition_leader("zoned", p, Some(p % 3 + 1)).expect("leader");
    }
    let settings = KafkaLoadSettings {
        refresh: Duration::from_millis(200),
        // Broker 3's rack is not given: its partitions have no zone.
        broker_racks: BTreeMap::from([(1, "zone-a".into()), (2, "zone-b".into())]),
        ..KafkaLoadSettings::default()
    };
    let source = source(&mock, settings);
    let stop = CancellationToken::new();
    let task = source.spawn(stop.clone());
    assert_eq!(source.zones("zoned"), None);
    let expected: BTreeMap<u32, String> = BTreeMap::from([
        (0, "zone-a".into()),
        (1, "zone-b".into()),
        (3, "zone-a".into()),
        (4, "zone-b".into()),
    ]);
    wait_until(LEARN, "zones from the leaders' racks", || {
        let ok = source.zones("zoned") == Some(expected.clone());
        async move { ok }
    })
    .await;
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("the task stops").expect("no panic");
}

/// `after - before`, per request type.
fn delta(before: &RequestCounts, after: &RequestCounts) -> RequestCounts {
    after
        .iter()
        .map(|(kind, &n)| (kind.clone(), n.saturating_sub(before.get(kind).copied().unwrap_or(0))))
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_refresh_are_bounded_at_10000_partitions() {
    const PARTITIONS: i32 = 10_000;
    const BROKERS: i32 = 3;
    const REFRESHES: u64 = 5;
    let mock = mock_cluster(BROKERS, &[("wide", PARTITIONS)]);
    let settings = KafkaLoadSettings {
        refresh: Duration::from_secs(3600), // refreshed by hand below
        lag_group: Some("wide-readers".into()),
        // Each report lists every partition (megabytes at 10,000): not too often.
        statistics_interval: Some(Duration::from_secs(1)),
        ..KafkaLoadSettings::default()
    };
    let source = source(&mock, settings);
    assert_eq!(source.weights("wide"), None);
    // Warm-up: connections, API versions, the coordinator; the second refresh gives rates.
    for _ in 0..2 {
        source.refresh().await.expect("refresh");
    }
    let weights = source.weights("wide").expect("rates after two refreshes");
    assert_eq!(weights.len(), PARTITIONS as usize);

    let stats_wait = Duration::from_secs(10);
    let before = source.requests_sent(stats_wait).await.expect("statistics");
    let started = Instant::now();
    for _ in 0..REFRESHES {
        source.refresh().await.expect("refresh");
    }
    let took = started.elapsed();
    let after = source.requests_sent(stats_wait).await.expect("statistics");
    let sent = delta(&before, &after);
    let per_refresh: BTreeMap<&str, f64> =
        sent.iter().map(|(kind, &n)| (kind.as_str(), n as f64 / REFRESHES as f64)).collect();
    let total: u64 = sent.values().sum();
    println!(
        "{PARTITIONS} partitions, {BROKERS} brokers, {REFRESHES} refreshes in {took:?} \
         ({:?} each): requests per refresh by type {per_refresh:?}, total {:.1}",
        took / REFRESHES as u32,
        total as f64 / REFRESHES as f64
    );
    let per = |kind: &str| sent.get(kind).copied().unwrap_or(0);
    // One ListOffsets per leader broker, one OffsetFetch, one Metadata per learned topic.
    assert!(per("ListOffsets") <= REFRESHES * BROKERS as u64, "{sent:?}");
    assert!(per("ListOffsets") >= REFRESHES, "the offsets are read every refresh: {sent:?}");
    assert!(per("OffsetFetch") <= REFRESHES, "{sent:?}");
    assert!(per("OffsetFetch") >= REFRESHES, "the lag is read every refresh: {sent:?}");
    assert!(per("Metadata") <= 2 * REFRESHES, "{sent:?}");
    // Everything else (coordinator look-ups, ...) is background, not per partition.
    assert!(total <= REFRESHES * (BROKERS as u64 + 4), "{sent:?}");
    assert_eq!(source.stats().errors, 0, "{:?}", source.stats());
}
