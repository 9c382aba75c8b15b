//! The example consumer (`kafka_assigner::client::kafka_example`, run in-process: the same
//! module `examples/consumer.rs` runs) against rdkafka's `MockCluster`: three consumers,
//! one drained, one killed, messages produced throughout. No produced message may be
//! skipped; a message processed twice must be one of the in-flight messages of a moved
//! partition (processed by the old owner during a handoff's overlap, or the one a killed
//! consumer was processing).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use async_trait::async_trait;
use kafka_assigner::client::{
    AssignerClient, Handler, Partition, ShutdownOutcome, WarmError,
    kafka_example::{KafkaHandler, KafkaSettings},
};
use kafka_assigner::config::DrainPolicy;
use kafka_assigner::kafka::KafkaMetadata;
use rdkafka::{
    ClientConfig as KafkaClientConfig,
    mocking::MockCluster,
    producer::{DefaultProducerContext, FutureProducer, FutureRecord},
};

use crate::client::config;
use crate::support::{
    assigner::{Backend, PROMPT, TestCluster, is_stable, owned_by, try_topic},
    wait_until,
};

const TOPIC: &str = "orders";
const PARTITIONS: u32 = 6;

/// What a consumer's handler did, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Warmed,
    AssignedStart,
    StoppedEnd,
}

#[derive(Default)]
struct Ledger {
    /// (consumer, partition, offset, when) for every message processed.
    processed: Mutex<Vec<(String, i32, i64, Instant)>>,
    /// (consumer, partition, step, when).
    steps: Mutex<Vec<(String, u32, Step, Instant)>>,
}

impl Ledger {
    fn processed(&self) -> Vec<(String, i32, i64, Instant)> {
        self.processed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    fn steps(&self) -> Vec<(String, u32, Step, Instant)> {
        self.steps.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    fn step(&self, consumer: &str, p: u32, step: Step) {
        self.steps.lock().unwrap_or_else(|p| p.into_inner()).push((consumer.into(), p, step, Instant::now()));
    }
    fn count_by(&self, consumer: &str) -> usize {
        self.processed().iter().filter(|(c, ..)| c == consumer).count()
    }
}

/// The example's handler, with its steps timed for the duplicate bound.
struct Timed {
    name: String,
    inner: KafkaHandler,
    ledger: Arc<Ledger>,
}

#[async_trait]
impl Handler for Timed {
    async fn warm(&self, p: Partition) -> Result<(), WarmError> {
        let n = p.partition;
        self.inner.warm(p).await?;
        self.ledger.step(&self.name, n, Step::Warmed);
        Ok(())
    }
    async fn assigned(&self, p: Partition) {
        self.ledger.step(&self.name, p.partition, Step::AssignedStart);
        self.inner.assigned(p).await;
    }
    async fn release(&self, p: Partition) {
        let n = p.partition;
        self.inner.release(p).await;
        self.ledger.step(&self.name, n, Step::StoppedEnd);
    }
    async fn unassigned(&self, p: Partition) {
        let n = p.partition;
        self.inner.unassigned(p).await;
        self.ledger.step(&self.name, n, Step::StoppedEnd);
    }
}

struct Consumer {
    client: AssignerClient,
    kafka: KafkaHandler,
}

fn start_consumer(name: &str, urls: &[String], brokers: &str, ledger: &Arc<Ledger>) -> Consumer {
    let settings = KafkaSettings {
        brokers: brokers.into(),
        topic: TOPIC.into(),
        group_id: "example-test".into(),
        timeout: Duration::from_secs(10),
    };
    let (who, sink) = (name.to_string(), ledger.clone());
    let on_message = Arc::new(move |p: i32, o: i64, _: &[u8]| {
        sink.processed.lock().unwrap_or_else(|p| p.into_inner()).push((who.clone(), p, o, Instant::now()));
    });
    let kafka = KafkaHandler::start(settings, on_message).expect("kafka consumer");
    let handler = Timed { name: name.into(), inner: kafka.clone(), ledger: ledger.clone() };
    let mut config = config(urls, name);
    config.topic = TOPIC.into();
    let client = AssignerClient::start(config, Arc::new(handler), None).expect("client");
    Consumer { client, kafka }
}

async fn wait_stable(cluster: &TestCluster, consumers: &[(&str, &Consumer)]) {
    cluster
        .wait_status(PROMPT * 4, "the consumers settle", |s| {
            try_topic(s, TOPIC).is_some_and(|t| {
                is_stable(t)
                    && t.consumers.len() == consumers.len()
                    && consumers.iter().all(|(name, c)| {
                        let kafka: BTreeSet<u32> = c.kafka.owned().into_iter().map(|p| p as u32).collect();
                        owned_by(t, name) == kafka
                    })
            })
        })
        .await;
}

async fn wait_progress(ledger: &Ledger, consumer: &str, more: usize) {
    let target = ledger.count_by(consumer) + more;
    wait_until(PROMPT * 2, &format!("{consumer} processes {more} more messages"), || {
        let n = ledger.count_by(consumer);
        async move { n >= target }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_consumers_drain_kill_no_skip() {
    let mock = MockCluster::<'static, DefaultProducerContext>::new(1).expect("mock cluster");
    mock.create_topic(TOPIC, PARTITIONS as i32, 1).expect("topic");
    let brokers = mock.bootstrap_servers();
    let kafka = Arc::new(
        KafkaMetadata::new(std::slice::from_ref(&brokers), &[], Duration::from_secs(5)).expect("metadata"),
    );
    let cluster = TestCluster::start(Backend::Memory, 1, |c| {
        c.kafka = Some(kafka);
        c.drain_policy = DrainPolicy::Drain;
    })
    .await;
    let urls = [cluster.instance(0).grpc_url.clone()];
    let ledger = Arc::new(Ledger::default());

    // Produce throughout, round-robin over the partitions, remembering every delivery.
    let producer: FutureProducer =
        KafkaClientConfig::new().set("bootstrap.servers", &brokers).create().expect("producer");
    let produced = Arc::new(Mutex::new(BTreeSet::<(i32, i64)>::new()));
    let producing = Arc::new(AtomicBool::new(true));
    let producer_task = {
        let (produced, producing) = (produced.clone(), producing.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while producing.load(Ordering::SeqCst) {
                let payload = format!("message-{i}");
                let record = FutureRecord::<(), _>::to(TOPIC).payload(&payload).partition((i % 6) as i32);
                match producer.send(record, Duration::from_secs(5)).await {
                    Ok(d) => {
                        produced.lock().unwrap_or_else(|p| p.into_inner()).insert((d.partition, d.offset));
                    }
                    Err((error, _)) => panic!("produce failed: {error}"),
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    };

    let c0 = start_consumer("c0", &urls, &brokers, &ledger);
    wait_stable(&cluster, &[("c0", &c0)]).await;
    wait_progress(&ledger, "c0", 20).await;
    let c1 = start_consumer("c1", &urls, &brokers, &ledger);
    let c2 = start_consumer("c2", &urls, &brokers, &ledger);
    wait_stable(&cluster, &[("c0", &c0), ("c1", &c1), ("c2", &c2)]).await;
    wait_progress(&ledger, "c1", 20).await;
    wait_progress(&ledger, "c2", 20).await;

    // c1 leaves gracefully: WAIT_FOR_DRAIN, its partitions are handed off warm.
    let Consumer { client, kafka: c1_kafka } = c1;
    let outcome = tokio::time::timeout(PROMPT * 2, client.shutdown()).await.expect("drain in time");
    assert_eq!(outcome.expect("c1 stops"), ShutdownOutcome::Drained);
    assert!(c1_kafka.owned().is_empty(), "c1 stopped processing everything");
    c1_kafka.stop();
    wait_stable(&cluster, &[("c0", &c0), ("c2", &c2)]).await;
    wait_progress(&ledger, "c2", 20).await;

    // c2 is killed: no Deregister, no commit, no handler call; its session expires.
    let killed: BTreeSet<i32> = c2.kafka.owned();
    c2.kafka.stop();
    drop(c2);
    wait_stable(&cluster, &[("c0", &c0)]).await;
    wait_progress(&ledger, "c0", 50).await;

    producing.store(false, Ordering::SeqCst);
    producer_task.await.expect("producer task");
    let produced = produced.lock().unwrap_or_else(|p| p.into_inner()).clone();
    wait_until(PROMPT * 4, "every produced message is processed", || {
        let seen: BTreeSet<(i32, i64)> = ledger.processed().iter().map(|(_, p, o, _)| (*p, *o)).collect();
        let done = produced.is_subset(&seen);
        async move { done }
    })
    .await;

    // Duplicates, and their bound: the old owner's messages of a partition between the new
    // owner's `assigned` and the old owner's stop, plus one per partition of the killed one.
    let processed = ledger.processed();
    let mut times: BTreeMap<(i32, i64), Vec<(String, Instant)>> = BTreeMap::new();
    for (c, p, o, t) in &processed {
        times.entry((*p, *o)).or_default().push((c.clone(), *t));
    }
    let duplicates: usize = times.values().map(|v| v.len() - 1).sum();
    let steps = ledger.steps();
    let mut in_flight = 0usize;
    let mut handoffs = 0usize;
    for (to, p, step, started) in &steps {
        if *step != Step::AssignedStart {
            continue;
        }
        // The previous holder's stop after this `assigned` began closes the overlap.
        for (from, q, s, stopped) in &steps {
            if q == p && from != to && *s == Step::StoppedEnd && stopped >= started {
                let window = processed
                    .iter()
                    .filter(|(c, pp, _, t)| c == from && *pp as u32 == *p && t >= started && t <= stopped)
                    .count();
                in_flight += window;
                handoffs += 1;
                break;
            }
        }
    }
    let bound = in_flight + killed.len();
    println!(
        "example consumer: produced {}, processed {}, duplicates {duplicates}, bound {bound} \
         ({handoffs} handoffs with {in_flight} in-flight messages, {} killed partitions)",
        produced.len(),
        processed.len(),
        killed.len()
    );
    assert!(handoffs >= 4, "c1's and c2's joins and c1's drain moved partitions: {steps:?}");
    assert!(duplicates <= bound, "{duplicates} duplicates exceed the in-flight bound {bound}");
    let warmed = steps.iter().filter(|(_, _, s, _)| *s == Step::Warmed).count();
    assert!(warmed >= 4, "handoffs warmed first: {steps:?}");
    let Consumer { client, kafka } = c0;
    client.shutdown().await.expect("c0 stops");
    kafka.stop();
}
