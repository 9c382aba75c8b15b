//! Placement by load, end to end (docs/design.md §11): producers write skewed traffic to a
//! topic on rdkafka's `MockCluster`; two assigner instances on a real etcd learn the
//! partitions' rates from Kafka ([`KafkaLoad`]) and place by load; four consumers run
//! through the client library. Checked from what each consumer's handler was told:
//!
//! * once the rates are learned, max/mean consumer load (by the rates the test produces) is
//!   at most 1.15, where placement by count leaves it at 1.18;
//! * every move is a warm handoff (the new owner warmed the partition before it was
//!   assigned), and no partition moves twice within its cool-down;
//! * when the hot producer stops, the placement stays within the tolerance and nothing moves.
//!
//! The topic: 96 partitions, each written one message per tick, and partition 0 six more
//! (its rate is 7× the others'). By count each consumer holds 24, so the one with partition
//! 0 carries 30 of a mean 25.5 (1.18); by load it gives partitions away until it is within
//! the 10 % tolerance (two: 28, 1.10). Once partition 0 cools down to the others' rate the
//! mean is 24 and the most loaded carries 25 (1.04, within tolerance): no move.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use kafka_assigner::client::AssignerClient;
use kafka_assigner::coordinator::TopicStatus;
use kafka_assigner::handoff::{PlacementMode, PlacementSettings};
use kafka_assigner::kafka::KafkaMetadata;
use kafka_assigner::kafka_load::{KafkaLoad, KafkaLoadSettings, Learning};
use kafka_assigner::weights::WeightSource;
use rdkafka::{
    ClientConfig as KafkaClientConfig,
    mocking::MockCluster,
    producer::{DefaultProducerContext, FutureProducer, FutureRecord},
};

use crate::client::{Call, Recorder, config};
use crate::support::{
    assigner::{Backend, PROMPT, TestCluster, is_stable, try_topic},
    wait_until,
};

const TOPIC: &str = "loads";
const PARTITIONS: u32 = 96;
/// Extra messages partition 0 gets per tick while the hot producer runs.
const HOT_EXTRA: u32 = 6;
const TICK: Duration = Duration::from_millis(200);
const COOLDOWN: Duration = Duration::from_secs(20);
const CONSUMERS: [&str; 4] = ["c0", "c1", "c2", "c3"];

/// What each consumer was told it owns now, from its handler's calls.
fn owned(recorders: &[(&str, Arc<Recorder>)]) -> BTreeMap<String, BTreeSet<u32>> {
    recorders
        .iter()
        .map(|(name, r)| {
            let mut owned = BTreeSet::new();
            for (_, call) in r.calls() {
                match call {
                    Call::Assigned(p) => {
                        owned.insert(p);
                    }
                    Call::Release(p) | Call::Unassigned(p) => {
                        owned.remove(&p);
                    }
                    _ => {}
                }
            }
            (name.to_string(), owned)
        })
        .collect()
}

/// Max/mean consumer load of `owned` with partition 0 weighing `hot` and the others 1.
fn imbalance(owned: &BTreeMap<String, BTreeSet<u32>>, hot: u32) -> f64 {
    let load = |ps: &BTreeSet<u32>| ps.iter().map(|p| if *p == 0 { hot } else { 1 }).sum::<u32>();
    let total = f64::from(PARTITIONS - 1 + hot);
    let mean = total / owned.len() as f64;
    owned.values().map(|ps| f64::from(load(ps)) / mean).fold(0.0, f64::max)
}

/// No handoff in flight and every partition owned by a registered consumer (by load, not
/// by count: [`is_stable`] wants counts balanced).
fn settled(topic: &TopicStatus) -> bool {
    topic.handoffs.is_empty()
        && topic
            .owners
            .iter()
            .all(|o| o.as_deref().is_some_and(|o| topic.consumers.iter().any(|c| c.name == o)))
}

/// Every `assigned` of a partition some other consumer was told before (a move) with when
/// it happened; the new owner must have warmed it first.
fn moves(recorders: &[(&str, Arc<Recorder>)]) -> Vec<(Instant, u32, String)> {
    let mut calls: Vec<(Instant, String, Call)> = recorders
        .iter()
        .flat_map(|(name, r)| r.calls().into_iter().map(|(at, call)| (at, name.to_string(), call)))
        .collect();
    calls.sort_by_key(|(at, ..)| *at);
    let mut owner: BTreeMap<u32, String> = BTreeMap::new();
    let mut warmed: BTreeSet<(String, u32)> = BTreeSet::new();
    let mut moves = Vec::new();
    for (at, name, call) in calls {
        match call {
            Call::WarmDone(p) => {
                warmed.insert((name, p));
            }
            Call::Assigned(p) => {
                if let Some(previous) = owner.insert(p, name.clone())
                    && previous != name
                {
                    assert!(
                        warmed.remove(&(name.clone(), p)),
                        "partition {p} moved from {previous} to {name} without a warm"
                    );
                    moves.push((at, p, name));
                }
            }
            _ => {}
        }
    }
    moves
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn load_placement_learns_kafka_rates_and_moves_few_partitions_warm() {
    let mock = MockCluster::<'static, DefaultProducerContext>::new(1).expect("mock cluster");
    mock.create_topic(TOPIC, PARTITIONS as i32, 1).expect("topic");
    let brokers = mock.bootstrap_servers();
    let metadata = Arc::new(
        KafkaMetadata::new(std::slice::from_ref(&brokers), &[], Duration::from_secs(5)).expect("metadata"),
    );
    // Quick learning for a test: a refresh every 500 ms, rates smoothed over 2 s.
    let settings = KafkaLoadSettings {
        refresh: Duration::from_millis(500),
        window: Duration::from_secs(2),
        ..Default::default()
    };
    let learning = Arc::new(Learning::start(
        KafkaLoad::new(std::slice::from_ref(&brokers), &[], Duration::from_secs(5), settings)
            .expect("kafka load"),
    ));
    let load = learning.load().clone();
    let source: Arc<dyn WeightSource> = learning;
    let cluster = TestCluster::start(Backend::Etcd, 2, |c| {
        c.kafka = Some(metadata);
        c.weights = Some(source);
        c.weights_refresh = Duration::from_millis(500);
        c.placement = PlacementSettings {
            mode: PlacementMode::Load,
            move_cooldown_ms: COOLDOWN.as_millis() as u64,
            ..PlacementSettings::default()
        };
    })
    .await;

    // Four consumers, two on each instance, settle by count before any traffic.
    let mut recorders = Vec::new();
    let mut clients = Vec::new();
    for (i, name) in CONSUMERS.iter().enumerate() {
        let recorder = Recorder::new();
        let url = [cluster.instance(i % 2).grpc_url.clone()];
        let mut config = config(&url, name);
        config.topic = TOPIC.into();
        clients.push(AssignerClient::start(config, recorder.clone(), None).expect("client"));
        recorders.push((*name, recorder));
    }
    cluster
        .wait_status(PROMPT * 4, "four consumers share the topic by count", |s| {
            try_topic(s, TOPIC).is_some_and(|t| is_stable(t) && t.consumers.len() == 4)
        })
        .await;
    wait_until(PROMPT, "each consumer is told it owns 24 partitions", || {
        let done = owned(&recorders).values().all(|ps| ps.len() == 24);
        async move { done }
    })
    .await;
    let by_count = imbalance(&owned(&recorders), 1 + HOT_EXTRA);
    let learning_from = Instant::now();

    // Skewed traffic: every partition one message per tick, partition 0 six more.
    let producer: FutureProducer = KafkaClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let hot = Arc::new(AtomicBool::new(true));
    let producing = Arc::new(AtomicBool::new(true));
    let producer_task = {
        let (hot, producing) = (hot.clone(), producing.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            while producing.load(Ordering::SeqCst) {
                tick.tick().await;
                let extra = if hot.load(Ordering::SeqCst) { HOT_EXTRA } else { 0 };
                let sends = (0..PARTITIONS + extra).map(|i| {
                    let partition = if i < PARTITIONS { i } else { 0 };
                    producer.send(
                        FutureRecord::<(), _>::to(TOPIC).payload("m").partition(partition as i32),
                        Duration::from_secs(5),
                    )
                });
                for result in futures::future::join_all(sends).await {
                    if let Err((error, _)) = result {
                        panic!("produce failed: {error}");
                    }
                }
            }
        })
    };

    // Load placement moves partitions off the hot consumer, warm, until within tolerance.
    wait_until(PROMPT * 12, "max/mean consumer load is at most 1.15 and the topic is settled", || {
        let balanced = imbalance(&owned(&recorders), 1 + HOT_EXTRA) <= 1.15;
        let cluster = &cluster;
        async move {
            balanced && cluster.status().await.topics.iter().any(|t| t.topic == TOPIC && settled(t))
        }
    })
    .await;
    let balanced_after = learning_from.elapsed();
    let by_load = imbalance(&owned(&recorders), 1 + HOT_EXTRA);
    let moved = moves(&recorders);
    let learned: Vec<_> = moved.iter().filter(|(at, ..)| *at >= learning_from).collect();
    assert!(!learned.is_empty(), "load placement moved something off the hot consumer");
    let mut last_move: BTreeMap<u32, Instant> = BTreeMap::new();
    for (at, p, _) in &learned {
        if let Some(before) = last_move.insert(*p, *at) {
            assert!(*at - before >= COOLDOWN, "partition {p} moved twice within its cool-down: {learned:?}");
        }
    }

    // The hot producer stops: once its rate is relearned and the leader planned with it,
    // nothing has moved (the placement stays within the tolerance).
    hot.store(false, Ordering::SeqCst);
    let stopped_at = Instant::now();
    wait_until(PROMPT * 6, "partition 0's learned weight falls to the others'", || {
        let cooled = load.weights(TOPIC).is_some_and(|w| {
            let (hot, other) = (w.get(&0).copied().unwrap_or(1), w.get(&1).copied().unwrap_or(1));
            (hot as f64) <= other as f64 * 1.05
        });
        async move { cooled }
    })
    .await;
    // Two more refreshes: the leader has stored the cooled weights and planned with them.
    let refreshes = load.stats().refreshes;
    wait_until(PROMPT * 2, "two more weight refreshes", || {
        let done = load.stats().refreshes >= refreshes + 2;
        async move { done }
    })
    .await;
    cluster.wait_status(PROMPT, "the topic is settled", |s| try_topic(s, TOPIC).is_some_and(settled)).await;
    let after_stop: Vec<_> = moves(&recorders).into_iter().filter(|(at, ..)| *at >= stopped_at).collect();
    let cooled = imbalance(&owned(&recorders), 1);
    producing.store(false, Ordering::SeqCst);
    producer_task.await.expect("producer");
    let when: Vec<_> =
        learned.iter().map(|(at, p, to)| (at.duration_since(learning_from), *p, to.clone())).collect();
    println!("load placement e2e: moves after traffic began {when:?}");
    println!(
        "load placement e2e: max/mean by count {by_count:.3}, by load {by_load:.3} after {balanced_after:?} \
         ({} moves, all warm); hot producer stopped: max/mean {cooled:.3}, {} moves",
        learned.len(),
        after_stop.len()
    );
    assert!(by_count > 1.15, "by count the hot consumer is over 1.15: {by_count:.3}");
    assert!(after_stop.is_empty(), "nothing moves within the tolerance: {after_stop:?}");
    assert!(cooled <= 1.10, "{cooled:.3}");
    for client in clients {
        client.shutdown().await.ok();
    }
}
