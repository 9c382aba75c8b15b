//! The leader as a part of the instance's loop, end to end through a coordinator on the
//! memory store behind the fault-injecting store (paused time): a plan's batches go to the
//! store one after another, and while one is in the store's hands the loop goes on
//! deciding the consumers' calls.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;

use crate::coordinator::handoff_backend::records::Keys;
use crate::coordinator::{ConsumerGroupCoordinator, CoordinatorError, HandoffConfig, HandoffCoordinator};
use crate::metrics::Metrics;
use crate::proto::v1::assignment_command::Command;
use crate::store::{FaultyStore, MemoryStore, WrittenTxn};

/// The partitions of `t` each written transaction assigned, for those that assigned any.
fn plan_batches(writes: &[WrittenTxn], keys: &Keys, partitions: u32) -> Vec<Vec<u32>> {
    writes
        .iter()
        .map(|txn| {
            (0..partitions).filter(|p| txn.keys.contains(&keys.assignment("t", *p))).collect::<Vec<_>>()
        })
        .filter(|assigned| !assigned.is_empty())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_plan_is_written_batch_after_batch_while_the_loop_decides_calls() {
    const PARTITIONS: u32 = 70; // three batches: 30, 30 and 10 partitions
    let faulty = FaultyStore::new(Arc::new(MemoryStore::new()), 1);
    let config = HandoffConfig {
        topic_partitions: [("t".to_string(), PARTITIONS)].into(),
        lease_ttl: Duration::from_secs(3),
        reconcile_interval: Duration::from_millis(100),
        ..HandoffConfig::default()
    };
    let coordinator = HandoffCoordinator::start(Arc::new(faulty.clone()), config, Arc::new(Metrics::new()))
        .await
        .expect("starts");
    let keys = Keys::new(&HandoffConfig::default().prefix);
    faulty.record_writes(true);
    let mut a = coordinator.register("a", "t").await.expect("a registers");
    let snapshot = a.next().await.expect("open").expect("not an error").command;
    assert!(matches!(snapshot, Some(Command::Assignment(ref u)) if u.assigned.is_empty()), "{snapshot:?}");
    // The first consumer of an empty group is planned after the rebalance delay (300 ms):
    // from now on every transaction's answer is held.
    faulty.hold_txn_answers();
    let mut writes = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while plan_batches(&writes, &keys, PARTITIONS).is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "no plan was written: {writes:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
        writes.extend(faulty.take_writes());
    }
    // Ten reconcile intervals later the leader still waits for that batch's answer.
    tokio::time::sleep(Duration::from_secs(1)).await;
    writes.extend(faulty.take_writes());
    assert_eq!(
        plan_batches(&writes, &keys, PARTITIONS),
        [(0..30).collect::<Vec<_>>()],
        "one batch in flight"
    );
    // Meanwhile the loop decides a call on its cache: `a` does not warm partition 69.
    let refused = tokio::time::timeout(Duration::from_secs(1), coordinator.partition_ready("a", "t", 69))
        .await
        .expect("answered while the leader's batch is in the store's hands");
    assert!(matches!(refused, Err(CoordinatorError::Handoff { .. })), "{refused:?}");
    faulty.release_held_answers();
    let mut owned = 0;
    while owned < PARTITIONS as usize {
        let item = tokio::time::timeout(Duration::from_secs(5), a.next()).await.expect("in time");
        if let Some(Command::Assignment(update)) = item.expect("open").expect("not an error").command {
            owned += update.assigned.len();
        }
    }
    writes.extend(faulty.take_writes());
    let batches = plan_batches(&writes, &keys, PARTITIONS);
    let expected: Vec<Vec<u32>> = vec![(0..30).collect(), (30..60).collect(), (60..70).collect()];
    assert_eq!(batches, expected, "three batches, in order, each once");
}

/// The next command of `stream`.
async fn next(stream: &mut crate::coordinator::CommandStream) -> Option<Command> {
    stream.next().await.expect("open").expect("not an error").command
}

/// The partitions an `assigned` command names (none for another command).
fn assigned(command: Option<Command>) -> Vec<u32> {
    match command {
        Some(Command::Assignment(update)) => update.assigned.iter().map(|tp| tp.partition).collect(),
        _ => Vec::new(),
    }
}

/// The leader's topic refresh runs among the loop's store calls, beside the leader's own
/// call: while Kafka holds its answer back, the leader goes on planning (a consumer of
/// another topic is given its partitions), and once Kafka answers, the topic's new
/// partitions reach its consumer.
#[tokio::test(start_paused = true)]
async fn a_slow_topic_refresh_holds_up_no_plan_and_its_growth_reaches_the_consumer() {
    use crate::coordinator::shared::topics::testing::HeldCounts;
    let counts = Arc::new(HeldCounts::new(2));
    let every = Duration::from_secs(1);
    let config = HandoffConfig {
        topic_partitions: [("u".to_string(), 2)].into(),
        kafka: Some(counts.clone()),
        topic_refresh_interval: every,
        lease_ttl: Duration::from_secs(3),
        reconcile_interval: Duration::from_millis(100),
        ..HandoffConfig::default()
    };
    let coordinator =
        HandoffCoordinator::start(Arc::new(MemoryStore::new()), config, Arc::new(Metrics::new()))
            .await
            .expect("starts");
    let mut a = coordinator.register("a", "t").await.expect("a registers");
    assert_eq!(assigned(next(&mut a).await), Vec::<u32>::new(), "the snapshot is empty");
    assert_eq!(assigned(next(&mut a).await), [0, 1]);

    // Kafka now has 4 partitions, and holds its answer to the next refresh back.
    counts.grow_and_hold(4, every / 10).await;
    let h = async {
        let mut h = coordinator.register("h", "u").await.expect("h registers");
        (assigned(next(&mut h).await), assigned(next(&mut h).await))
    };
    let told = tokio::time::timeout(Duration::from_secs(2), h).await;
    let told = told.expect("h registers and is given its partitions while the refresh waits for Kafka");
    assert_eq!(told, (vec![], vec![0, 1]));
    assert!(tokio::time::timeout(every * 5, next(&mut a)).await.is_err(), "t grew before Kafka answered");

    counts.hold(false);
    let told = tokio::time::timeout(every * 5, next(&mut a)).await;
    assert_eq!(assigned(told.expect("the growth reaches a")), [2, 3]);
}
