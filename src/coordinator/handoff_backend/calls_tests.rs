//! The handoff backend's consumer calls, end to end through a coordinator on the memory
//! store (paused time): batching, refusals, the flip and the release, `Deregister`, and
//! what a fenced instance answers.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;

use crate::coordinator::{
    CommandStream, ConsumerGroupCoordinator, CoordinatorError, HandoffConfig, HandoffCoordinator,
};
use crate::handoff::{HandoffError, Phase};
use crate::metrics::Metrics;
use crate::proto::v1::assignment_command::Command;
use crate::store::{LeaseStore, MemoryStore};

async fn next(stream: &mut CommandStream) -> Command {
    let item = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.expect("a command in time");
    item.expect("stream open").expect("not an error").command.expect("a command")
}

/// `a` owns all `partitions` of `t`, on a coordinator planned with `max_warming`.
async fn owning_all(partitions: u32, max_warming: usize) -> (HandoffCoordinator, MemoryStore, CommandStream) {
    let store = MemoryStore::new();
    let (coordinator, a) = owning_all_on(Arc::new(store.clone()), partitions, max_warming).await;
    (coordinator, store, a)
}

/// [`owning_all`] over `store`.
async fn owning_all_on(
    store: Arc<dyn LeaseStore>,
    partitions: u32,
    max_warming: usize,
) -> (HandoffCoordinator, CommandStream) {
    let config = HandoffConfig {
        topic_partitions: [("t".to_string(), partitions)].into(),
        lease_ttl: Duration::from_secs(3),
        reconcile_interval: Duration::from_millis(100),
        plan: crate::handoff::PlanConfig { max_warming_per_consumer: max_warming, ..Default::default() },
        ..HandoffConfig::default()
    };
    let coordinator =
        HandoffCoordinator::start(store, config, Arc::new(Metrics::new())).await.expect("starts");
    let mut a = coordinator.register("a", "t").await.expect("a registers");
    let mut owned = 0;
    while owned < partitions as usize {
        if let Command::Assignment(update) = next(&mut a).await {
            owned += update.assigned.len();
        }
    }
    (coordinator, a)
}

/// `a` owns both partitions of `t`; `b` joins and is asked to warm one of them.
async fn warming() -> (HandoffCoordinator, MemoryStore, CommandStream, CommandStream, u32) {
    let (coordinator, store, a) =
        owning_all(2, crate::handoff::PlanConfig::default().max_warming_per_consumer).await;
    let mut b = coordinator.register("b", "t").await.expect("b registers");
    let partition = loop {
        if let Command::Warm(warm) = next(&mut b).await {
            assert_eq!(warm.current_owner, "a");
            break warm.partition.expect("a partition").partition;
        }
    };
    (coordinator, store, a, b, partition)
}

#[tokio::test(start_paused = true)]
async fn a_deregister_changes_every_topic_in_one_transaction_and_refuses_an_unknown_name() {
    let store = MemoryStore::new();
    let faulty = crate::store::FaultyStore::new(Arc::new(store.clone()), 1);
    let config = HandoffConfig {
        topic_partitions: [("t".to_string(), 2), ("u".to_string(), 2)].into(),
        lease_ttl: Duration::from_secs(3),
        drain_policy: crate::drain::DrainPolicy::Drain,
        ..HandoffConfig::default()
    };
    let coordinator = HandoffCoordinator::start(Arc::new(faulty.clone()), config, Arc::new(Metrics::new()))
        .await
        .expect("starts");
    // `a` in both topics, `b` in `t` only: `a` can drain in `t`, not in `u`.
    let mut streams = Vec::new();
    for (consumer, topic) in [("a", "t"), ("a", "u"), ("b", "t")] {
        let mut stream = coordinator.register(consumer, topic).await.expect("registers");
        next(&mut stream).await;
        streams.push(stream);
    }
    let error = coordinator.deregister("ghost").await.expect_err("not registered");
    assert!(matches!(error, CoordinatorError::UnknownConsumer(_)), "{error}");
    faulty.record_writes(true);
    let action = coordinator.deregister("a").await.expect("deregisters");
    assert_eq!(action, crate::proto::v1::DeregisterAction::WaitForDrain);
    let keys = super::super::records::Keys::new(&HandoffConfig::default().prefix);
    let (in_t, in_u) = (keys.consumer("t", "a"), keys.consumer("u", "a"));
    let writes = faulty.take_writes();
    assert!(
        writes.iter().any(|txn| txn.keys.contains(&in_t) && txn.keys.contains(&in_u)),
        "both registrations change in one transaction: {writes:?}"
    );
    // Alone in `u`: its partitions are held for its return.
    let kv = store.get(&in_u).await.expect("read").expect("still registered in u");
    let record: super::super::records::ConsumerRecord =
        crate::coordinator::shared::records::decode(&in_u, &kv.value).expect("decodes");
    assert_eq!((record.status, record.hold_until.is_some()), (crate::handoff::ConsumerStatus::Active, true));
}

/// `a` and `b` leave at once, each through an instance whose cache has not seen the other
/// leave: the second must not drain too (its cache still counts `a` as able to take over),
/// or both drain with nobody to drain to, and neither drain ever ends. "Someone can take
/// over" is decided on the store, like the rest of a Deregister.
#[tokio::test(start_paused = true)]
async fn two_consumers_leaving_at_once_never_both_drain_with_nobody_left() {
    let store = MemoryStore::new();
    let config = |i: usize| HandoffConfig {
        instance_id: format!("i{i}"),
        topic_partitions: [("t".to_string(), 2)].into(),
        lease_ttl: Duration::from_secs(3),
        reconcile_interval: Duration::from_millis(100),
        drain_policy: crate::drain::DrainPolicy::Drain,
        ..HandoffConfig::default()
    };
    let mut instances = Vec::new();
    for i in 0..2 {
        let faulty = crate::store::FaultyStore::new(Arc::new(store.clone()), i as u64);
        let coordinator =
            HandoffCoordinator::start(Arc::new(faulty.clone()), config(i), Arc::new(Metrics::new()))
                .await
                .expect("starts");
        instances.push((coordinator, faulty));
    }
    let (i0, i1) = (&instances[0].0, &instances[1].0);
    let _a = i0.register("a", "t").await.expect("a registers");
    let _b = i1.register("b", "t").await.expect("b registers");
    // Both instances' caches see both consumers (owning a partition each).
    let both = |owners: &[Option<String>]| {
        owners.iter().any(|o| o.as_deref() == Some("a")) && owners.iter().any(|o| o.as_deref() == Some("b"))
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let (s0, s1) = (i0.status().await, i1.status().await);
            if [s0, s1].iter().all(|s| s.topics.iter().any(|t| both(&t.owners))) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("both instances see both consumers in time");
    // From now on neither cache hears of the other instance's writes.
    for (_, faulty) in &instances {
        faulty.hush_watches();
    }
    let action = i0.deregister("a").await.expect("a deregisters");
    assert_eq!(action, crate::proto::v1::DeregisterAction::WaitForDrain, "b can take a's partitions over");
    let action = i1.deregister("b").await.expect("b deregisters");
    assert_eq!(
        action,
        crate::proto::v1::DeregisterAction::ShutdownNow,
        "a drains already: nobody can take b's partitions over"
    );
    let keys = super::super::records::Keys::new(&HandoffConfig::default().prefix);
    let status = |name: &str| {
        let (store, key) = (store.clone(), keys.consumer("t", name));
        async move {
            let kv = store.get(&key).await.expect("read").expect("still registered");
            let record: super::super::records::ConsumerRecord =
                crate::coordinator::shared::records::decode(&key, &kv.value).expect("decodes");
            (record.status, record.hold_until.is_some())
        }
    };
    use crate::handoff::ConsumerStatus::{Active, Draining};
    assert_eq!(status("a").await, (Draining, false));
    assert_eq!(status("b").await, (Active, true), "b's partitions are held for its return");
}

#[tokio::test(start_paused = true)]
async fn calls_that_arrive_together_share_transactions() {
    let (coordinator, store, mut a) = owning_all(40, 20).await;
    let mut b = coordinator.register("b", "t").await.expect("b registers");
    let mut warms = Vec::new();
    while warms.len() < 20 {
        if let Command::Warm(warm) = next(&mut b).await {
            warms.push(warm.partition.expect("a partition").partition);
        }
    }
    let before = store.revision();
    let readies = warms.iter().map(|p| coordinator.partition_ready("b", "t", *p));
    for result in futures::future::join_all(readies).await {
        result.expect("ready");
    }
    let transactions = store.revision() - before;
    assert!(transactions <= 5, "20 readies at once took {transactions} transactions");
    let mut released = 0;
    while released < 20 {
        if let Command::Release(release) = next(&mut a).await {
            assert!(warms.contains(&release.partition.expect("a partition").partition));
            released += 1;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn refused_calls_name_the_problem_and_change_nothing() {
    let (coordinator, store, _a, _b, p) = warming().await;
    let before = store.revision();
    use CoordinatorError::{Handoff, InvalidName, UnknownTopic};
    type Cause = fn(&CoordinatorError) -> bool;
    let cases: [(&str, &str, u32, Cause, bool); 6] = [
        ("a", "t", p, |e| matches!(e, Handoff { source: HandoffError::NotWarmingTarget { .. }, .. }), true),
        (
            "b",
            "t",
            7,
            |e| matches!(e, Handoff { source: HandoffError::PartitionOutOfRange { .. }, .. }),
            true,
        ),
        ("ghost", "t", p, |e| matches!(e, Handoff { source: HandoffError::UnknownConsumer(_), .. }), true),
        ("b", "nope", p, |e| matches!(e, UnknownTopic(_)), true),
        ("", "t", p, |e| matches!(e, InvalidName(_)), true),
        ("b", "t", p, |e| matches!(e, Handoff { source: HandoffError::NotReleasing { .. }, .. }), false),
    ];
    for (consumer, topic, partition, cause, ready) in cases {
        let result = if ready {
            coordinator.partition_ready(consumer, topic, partition).await
        } else {
            coordinator.partition_released(consumer, topic, partition).await
        };
        let error = result.expect_err("refused");
        assert!(cause(&error), "{consumer}/{topic}/{partition}: {error}");
    }
    assert_eq!(store.revision(), before, "a refused call writes nothing");
}

#[tokio::test(start_paused = true)]
async fn ready_flips_ownership_in_one_step_and_released_completes_the_handoff() {
    let (coordinator, _store, mut a, mut b, p) = warming().await;
    coordinator.partition_ready("b", "t", p).await.expect("ready");
    coordinator.partition_ready("b", "t", p).await.expect("a repeated ready is already in effect");
    match next(&mut b).await {
        Command::Assignment(update) => {
            assert_eq!(update.assigned.iter().map(|tp| tp.partition).collect::<Vec<_>>(), [p])
        }
        other => panic!("the new owner hears `assigned` first: {other:?}"),
    }
    let release = loop {
        if let Command::Release(release) = next(&mut a).await {
            break release;
        }
    };
    assert_eq!((release.partition.map(|tp| tp.partition), release.new_owner.as_str()), (Some(p), "b"));
    let status = coordinator.status().await;
    let handoff = &status.topics[0].handoffs[0];
    assert_eq!((handoff.partition, handoff.phase), (p, Phase::Releasing));
    assert_eq!(status.topics[0].owners[p as usize].as_deref(), Some("b"));
    coordinator.partition_released("a", "t", p).await.expect("released");
    let error = coordinator.partition_released("a", "t", p).await.expect_err("the handoff is gone");
    assert!(
        matches!(error, CoordinatorError::Handoff { source: HandoffError::NotReleasing { .. }, .. }),
        "{error}"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(coordinator.status().await.topics[0].handoffs.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_fenced_instance_decides_no_call_and_says_so() {
    let faulty = crate::store::FaultyStore::new(Arc::new(MemoryStore::new()), 1);
    let (coordinator, _a) = owning_all_on(Arc::new(faulty.clone()), 2, 1).await;
    let mut b = coordinator.register("b", "t").await.expect("b registers");
    let partition = loop {
        if let Command::Warm(warm) = next(&mut b).await {
            break warm.partition.expect("a partition").partition;
        }
    };
    faulty.cut_off();
    // The fence ends b's stream (after telling it it owns nothing).
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(item) = b.next().await {
            if let Err(error) = item {
                return error;
            }
        }
        panic!("the stream ended without saying why");
    });
    let error = ended.await.expect("fenced in time");
    assert!(matches!(error, CoordinatorError::StreamEnded(..)), "{error}");
    // Nothing is decided or written for a consumer now: the answer says why, at once.
    for result in [
        coordinator.partition_ready("b", "t", partition).await.map(|_| ()),
        coordinator.deregister("a").await.map(|_| ()),
    ] {
        let error = result.expect_err("refused while fenced");
        let not_live = matches!(
            error,
            CoordinatorError::NoSession(crate::coordinator::causes::SessionMissing::NotLive { .. })
        );
        assert!(not_live, "{error}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_graceful_stop_returns_once_leadership_is_resigned_and_a_crash_resigns_nothing() {
    let leader_key = super::super::records::Keys::new(&HandoffConfig::default().prefix)
        .leader(crate::coordinator::handoff_backend::leader_groups::LeaderGroup::ONLY);
    for crash in [false, true] {
        // `a` was assigned its partitions by a plan: this instance leads.
        let (coordinator, store, _a) = owning_all(2, 1).await;
        assert!(coordinator.is_leader());
        assert!(store.get(&leader_key).await.expect("reads").is_some());
        if crash {
            coordinator.crash();
        } else {
            coordinator.shutdown().await;
        }
        // The loop has ended (a graceful stop waited for it): nothing is still in flight.
        coordinator.backend().stopped.cancelled().await;
        let key = store.get(&leader_key).await.expect("reads");
        assert_eq!(key.is_some(), crash, "crash {crash}: the leader key left as a dead process leaves it");
        assert!(!coordinator.is_leader());
    }
}
