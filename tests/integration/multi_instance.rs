//! Several assigner instances on one etcd under one prefix (docs/design.md §3, §9): handoffs
//! across instances, leader failover mid-handoff, a restart of every instance, a crashed
//! leader that does not resign, fenced writes of a deposed leader, and a measurement of
//! the handoff fast path.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use kafka_assigner::handoff::Phase;
use kafka_assigner::proto::v1::{
    PartitionReadyRequest, PartitionReleasedRequest, TopicPartition, assignment_command::Command,
};
use kafka_assigner::store::{Compare, LeaseStore, Op, Txn};
use tonic::Code;

use crate::support::assigner::{
    Backend, PARTITIONS, PROMPT, TOPIC, TTL, TestCluster, TestConsumer, all_partitions, consumer_names,
    describe, is_stable, owned_by, percentile, settle, topic,
};

fn tp(topic: &str, partition: u32) -> Option<TopicPartition> {
    Some(TopicPartition { topic: topic.into(), partition })
}

/// The next command must be `Release(p → new_owner)`.
async fn expect_release(consumer: &mut TestConsumer, p: u32, new_owner: &str) {
    let command = consumer.next(PROMPT, &format!("Release({p})")).await;
    match &command.command {
        Some(Command::Release(r)) if r.partition == tp(&consumer.topic, p) && r.new_owner == new_owner => {}
        _ => panic!("{}: expected Release({p} to {new_owner}), got {}", consumer.name, describe(&command)),
    }
}

/// The next command must be `AssignmentUpdate{assigned: [p]}`.
async fn expect_assigned(consumer: &mut TestConsumer, p: u32) {
    let command = consumer.next(PROMPT, &format!("assignment of {p}")).await;
    match &command.command {
        Some(Command::Assignment(u))
            if u.assigned == vec![tp(&consumer.topic, p).unwrap()] && u.unassigned.is_empty() => {}
        _ => panic!("{}: expected Assignment(+[{p}]), got {}", consumer.name, describe(&command)),
    }
}

/// A on instance 0, B on instance 1: the warms, the flip and the release cross instances,
/// and `PartitionReady` / `PartitionReleased` work on an instance that does not hold the
/// caller's stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoffs_complete_across_instances() {
    let cluster = TestCluster::start(Backend::Etcd, 2, |_| {}).await;
    let (mut a, mut b) = cluster.warming_pair(TOPIC, (0, 1), 2).await;
    let warmed: Vec<u32> = b.warms.keys().copied().collect();
    let (p1, p2) = (warmed[0], warmed[1]);

    // p1: ready to B's own instance; A, on the other instance, is told to release.
    b.ready(p1).await.unwrap_or_else(|s| panic!("ready({p1}) on instance 1: {s:?}"));
    expect_assigned(&mut b, p1).await;
    expect_release(&mut a, p1, "b").await;
    a.released(p1).await.unwrap_or_else(|s| panic!("released({p1}) on instance 0: {s:?}"));

    // p2: ready sent to instance 0, which does not hold B's stream; released to instance 1.
    let mut on0 = cluster.client(0).await;
    on0.partition_ready(PartitionReadyRequest { consumer_name: "b".into(), partition: tp(TOPIC, p2) })
        .await
        .unwrap_or_else(|s| panic!("B's ready({p2}) on instance 0: {s:?}"));
    expect_assigned(&mut b, p2).await;
    expect_release(&mut a, p2, "b").await;
    let mut on1 = cluster.client(1).await;
    on1.partition_released(PartitionReleasedRequest { consumer_name: "a".into(), partition: tp(TOPIC, p2) })
        .await
        .unwrap_or_else(|s| panic!("A's released({p2}) on instance 1: {s:?}"));
    a.owned.remove(&p2);
    a.releases.remove(&p2);

    for i in 0..2 {
        let status =
            cluster.wait_status_of(i, PROMPT, "the split is done", |s| is_stable(topic(s, TOPIC))).await;
        let t = topic(&status, TOPIC);
        assert_eq!(owned_by(t, "b"), warmed.iter().copied().collect(), "instance {i}: {t:?}");
        assert_eq!(owned_by(t, "a"), a.owned, "instance {i}: {t:?}");
        let holders: Vec<(&str, &str)> =
            t.consumers.iter().map(|c| (c.name.as_str(), c.instance.as_str())).collect();
        assert_eq!(
            holders,
            [("a", cluster.instance(0).id.as_str()), ("b", cluster.instance(1).id.as_str())],
            "instance {i}"
        );
    }
    a.assert_quiet(Duration::from_millis(200)).await;
    b.assert_quiet(Duration::ZERO).await;
}

/// The leader dies while a handoff is in flight: the other instance leads within about
/// a TTL, the handoff completes, and the new leader carries the rebalance on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_crash_mid_handoff_fails_over_and_completes() {
    // One warm at a time, so the second half of the rebalance needs the new leader.
    let mut cluster = TestCluster::start(Backend::Etcd, 2, |c| c.plan.max_warming_per_consumer = 1).await;
    let leader = cluster.wait_leader(PROMPT).await;
    let survivor = 1 - leader;
    let (mut a, mut b) = cluster.warming_pair(TOPIC, (survivor, survivor), 1).await;
    let p = *b.warms.keys().next().expect("a warm");
    cluster
        .wait_status_of(survivor, PROMPT, "one handoff warming", |s| topic(s, TOPIC).handoffs.len() == 1)
        .await;

    let crashed = Instant::now();
    cluster.crash(leader).await;
    let give_up = TTL + Duration::from_secs(1);
    while !cluster.instance(survivor).coordinator.is_leader() {
        assert!(
            crashed.elapsed() < give_up,
            "instance {survivor} does not lead {give_up:?} after the leader crashed: {}",
            crate::support::assigner::json(&cluster.status_of(survivor).await)
        );
        tokio::time::sleep(crate::support::POLL_INTERVAL).await;
    }
    eprintln!("[etcd] leader crash → new leader after {:?}", crashed.elapsed());
    // The instance leads once its campaign commits; its status names the leader from the
    // mirror, which sees the key when the watch delivers it (later on a loaded machine).
    let survivor_id = cluster.instance(survivor).id.clone();
    let status = cluster
        .wait_status_of(survivor, PROMPT, "the status names the new leader", |s| {
            s.leader.as_deref() == Some(survivor_id.as_str())
        })
        .await;
    let t = topic(&status, TOPIC);
    let h = t.handoffs.iter().find(|h| h.partition == p).unwrap_or_else(|| panic!("handoff {p} kept: {t:?}"));
    assert_eq!((h.from.as_str(), h.to.as_str(), h.phase), ("a", "b", Phase::Warming));

    b.ready(p).await.unwrap_or_else(|s| panic!("ready({p}) after failover: {s:?}"));
    expect_assigned(&mut b, p).await;
    expect_release(&mut a, p, "b").await;
    a.released(p).await.unwrap_or_else(|s| panic!("released({p}) after failover: {s:?}"));
    // The next warm can only come from the new leader.
    b.wait_warms(1, PROMPT).await;
    let status = settle(&cluster, TOPIC, &mut [&mut a, &mut b], PROMPT).await;
    let t = topic(&status, TOPIC);
    assert_eq!(owned_by(t, "a").len(), 2, "{t:?}");
    assert_eq!(owned_by(t, "b").len(), 2, "{t:?}");
}

/// A graceful stop (SIGTERM) of the leading instance: its consumers' streams end with
/// UNAVAILABLE, the other instance leads at once (resigned, not expired), and the
/// consumers reconnect there within the TTL keeping their partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_of_the_leader_hands_over_at_once() {
    let mut cluster = TestCluster::start(Backend::Etcd, 2, |_| {}).await;
    let leader = cluster.wait_leader(PROMPT).await;
    let survivor = 1 - leader;
    let (mut a, mut b, status) = cluster.settled_pair(TOPIC, (leader, survivor)).await;
    let owners_before = topic(&status, TOPIC).owners.clone();

    let stopped = Instant::now();
    cluster.stop(leader).await;
    let end = a.expect_end(PROMPT).await;
    assert_eq!(end.as_ref().map_err(|s| s.code()), Err(Code::Unavailable), "{end:?}");
    let mut a2 = cluster.consumer_on(survivor, "a", TOPIC).await;
    assert_eq!(a2.expect_snapshot().await, a.owned, "a keeps its partitions on the other instance");
    cluster.wait_leader(PROMPT).await;
    let took = stopped.elapsed();
    eprintln!("[etcd] graceful stop of the leader → new leader and a reconnected after {took:?}");
    assert!(took < TTL, "a resigned leader is replaced before any TTL runs out ({took:?})");
    assert_eq!(cluster.leader(), Some(survivor));

    let quiet = TTL + Duration::from_secs(1);
    tokio::join!(a2.assert_quiet(quiet), b.assert_quiet(quiet));
    let status = cluster.status_of(survivor).await;
    let t = topic(&status, TOPIC);
    assert_eq!(t.owners, owners_before, "{t:?}");
    assert!(t.handoffs.is_empty(), "{t:?}");
}

/// Every instance goes away (one crashes, one stops gracefully) and new ones start on the
/// same etcd and prefix; the consumers re-register within the TTL and keep their
/// partitions: same owners, no warm, nothing moves even after the old sessions expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_every_instance_preserves_assignments() {
    let ttl = TTL;
    let mut cluster = TestCluster::start(Backend::Etcd, 2, |_| {}).await;
    let (mut a, mut b, status) = cluster.settled_pair(TOPIC, (0, 1)).await;
    let owners_before = topic(&status, TOPIC).owners.clone();
    let leader = cluster.wait_leader(PROMPT).await;

    let down = Instant::now();
    cluster.crash(leader).await;
    cluster.stop(1 - leader).await;
    let first = cluster.add_instance().await;
    let second = cluster.add_instance().await;
    let mut a2 = cluster.consumer_on(first, "a", TOPIC).await;
    let mut b2 = cluster.consumer_on(second, "b", TOPIC).await;
    assert_eq!(a2.expect_snapshot().await, a.owned, "a keeps its partitions");
    assert_eq!(b2.expect_snapshot().await, b.owned, "b keeps its partitions");
    let took = down.elapsed();
    eprintln!("[etcd] all instances down → consumers re-registered on new instances after {took:?}");
    assert!(took < ttl, "the test must re-register within the TTL (took {took:?})");

    // The gracefully stopped instance told its consumer to go elsewhere.
    let stopped = if leader == 0 { &mut b } else { &mut a };
    let end = stopped.expect_end(PROMPT).await;
    assert_eq!(end.as_ref().map_err(|s| s.code()), Err(Code::Unavailable), "{end:?}");

    let new_leader = cluster.wait_leader(ttl + Duration::from_secs(2)).await;
    assert!(new_leader == first || new_leader == second);
    // Past the expiry of every old session: nothing moves.
    let quiet = ttl + Duration::from_secs(1);
    tokio::join!(a2.assert_quiet(quiet), b2.assert_quiet(quiet));
    for i in [first, second] {
        let status = cluster.status_of(i).await;
        let t = topic(&status, TOPIC);
        assert_eq!(t.owners, owners_before, "instance {i}: {t:?}");
        assert!(t.handoffs.is_empty(), "instance {i}: {t:?}");
        assert_eq!(consumer_names(t), ["a", "b"]);
    }
}

/// A graceful stop resigns leadership at once; a crash does not (the crashed instance's
/// server still stops, and its `shutdown()` must then do nothing): its leader key stays
/// until its session expires, here after a long TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_leader_does_not_resign() {
    let mut cluster = TestCluster::start(Backend::Etcd, 3, |c| c.lease_ttl = Duration::from_secs(30)).await;
    let leader_key = format!("{}leader", cluster.config.prefix);
    let stopped = cluster.wait_leader(PROMPT).await;
    cluster.stop(stopped).await;
    // Only a resign lets another instance lead before the 30 s TTL.
    let crashed = cluster.wait_leader(PROMPT).await;
    let before = cluster.store.get(&leader_key).await.expect("read the leader key").expect("a leader key");
    assert_eq!(before.value, cluster.instance(crashed).id.as_bytes(), "the leader key names the leader");

    cluster.crash(crashed).await;
    let after = cluster.store.get(&leader_key).await.expect("read the leader key");
    let after = after.unwrap_or_else(|| panic!("the crashed leader resigned: its leader key is gone"));
    assert_eq!(
        (after.create_revision, after.value),
        (before.create_revision, before.value),
        "the crashed leader's key stays"
    );
    assert_eq!(cluster.leader(), None, "nobody else leads while the crashed leader's key stands");
}

/// A deposed leader's write fails and changes nothing: a transaction fenced with the
/// crashed leader's election (create revision of its leader key) is refused once another
/// instance leads, while the same shape fenced with the current election applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deposed_leader_writes_are_fenced() {
    let mut cluster = TestCluster::start(Backend::Etcd, 2, |_| {}).await;
    let leader = cluster.wait_leader(PROMPT).await;
    let survivor = 1 - leader;
    let mut a = cluster.sole_owner(survivor, "a", TOPIC).await;

    let prefix = cluster.config.prefix.clone();
    let leader_key = format!("{prefix}leader");
    let old = cluster.store.get(&leader_key).await.expect("read the leader key").expect("a leader key");
    assert_eq!(old.value, cluster.instance(leader).id.as_bytes(), "the leader key names the leader");

    cluster.crash(leader).await;
    cluster
        .wait_status_of(survivor, TTL + Duration::from_secs(3), "the survivor leads", |s| {
            s.leader.as_deref() == Some(cluster.instance(survivor).id.as_str())
        })
        .await;
    let new = cluster.store.get(&leader_key).await.expect("read the leader key").expect("a leader key");
    assert_ne!(new.create_revision, old.create_revision, "a new election");

    let before = cluster.stored().await;
    let a_seen = a.seen();
    let assignment = format!("{prefix}assignments/{TOPIC}/0");
    let handoff = format!("{prefix}handoffs/{TOPIC}/1");
    let deposed = Txn::new()
        .when(Compare::CreateRevision(leader_key.clone(), old.create_revision))
        .then(Op::put(&assignment, br#"{"v":1,"owner":"intruder"}"#.to_vec()))
        .then(Op::put(
            &handoff,
            br#"{"v":1,"from":"a","to":"intruder","phase":"Warming","since":0}"#.to_vec(),
        ));
    let outcome = cluster.store.txn(deposed).await.expect("the fenced txn runs");
    assert!(!outcome.succeeded, "a write fenced with the old election must fail");
    assert_eq!(cluster.stored().await, before, "the failed write changed nothing");

    // Control: the same shape, fenced with the current election, applies (to a key
    // outside the assigner's prefix, so the cluster is undisturbed).
    let probe = format!("{}-fence-probe", prefix.trim_end_matches('/'));
    let current = Txn::new()
        .when(Compare::CreateRevision(leader_key.clone(), new.create_revision))
        .then(Op::put(&probe, b"ok".to_vec()));
    assert!(cluster.store.txn(current).await.expect("the control txn runs").succeeded);

    a.assert_quiet(Duration::from_millis(300)).await;
    assert_eq!(a.seen(), a_seen);
    let status = cluster.status_of(survivor).await;
    assert_eq!(owned_by(topic(&status, TOPIC), "a"), all_partitions(PARTITIONS));
}

/// Measures the handoff fast path on etcd: `PartitionReady` sent → the old owner receives
/// `ReleasePartition`. Prints p50 / p99; asserts nothing about time (a measurement, not
/// a benchmark gate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_fast_path_latency() {
    const BENCH: &str = "bench";
    const BENCH_X: &str = "bench-x";
    let cluster = TestCluster::start(Backend::Etcd, 2, |c| {
        c.topic_partitions.insert(BENCH.into(), 100);
        c.topic_partitions.insert(BENCH_X.into(), 100);
        c.plan.max_warming_per_consumer = 64;
    })
    .await;
    raw_etcd_chain(&cluster).await;
    for (topic_name, a_on, b_on, what) in
        [(BENCH, 0, 0, "same instance"), (BENCH_X, 0, 1, "across instances (ready to B's instance)")]
    {
        let (mut a, mut b) = cluster.warming_pair(topic_name, (a_on, b_on), 50).await;
        let mut to_release = Vec::new();
        let mut round_trips = Vec::new();
        for p in b.warms.keys().copied().collect::<Vec<_>>() {
            let sent = Instant::now();
            b.ready(p).await.unwrap_or_else(|s| panic!("ready({p}): {s:?}"));
            round_trips.push(sent.elapsed());
            let from = a.seen();
            a.wait_for(PROMPT, &format!("Release({p})"), |c| c.releases.contains_key(&p)).await;
            let (arrived, _) = a.history[from..]
                .iter()
                .find(|(_, c)| matches!(&c.command, Some(Command::Release(r)) if r.partition == tp(topic_name, p)))
                .unwrap_or_else(|| panic!("Release({p}) in a's history"));
            to_release.push(arrived.duration_since(sent));
        }
        let mut samples = to_release.clone();
        samples.sort();
        round_trips.sort();
        let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
        eprintln!(
            "[etcd] handoff fast path, {what}: PartitionReady → ReleasePartition over {} handoffs: \
             p50 {:?}, p99 {:?}, max {:?}, mean {mean:?} (PartitionReady RPC alone: p50 {:?}, p99 {:?})",
            samples.len(),
            percentile(&samples, 0.50),
            percentile(&samples, 0.99),
            samples.last().copied().unwrap_or_default(),
            percentile(&round_trips, 0.50),
            percentile(&round_trips, 0.99),
        );
        a.release_all().await;
        let status = settle(&cluster, topic_name, &mut [&mut a, &mut b], Duration::from_secs(10)).await;
        let t = topic(&status, topic_name);
        assert_eq!(owned_by(t, "a").len(), 50);
        assert_eq!(owned_by(t, "b").len(), 50);
        let b_parts: BTreeSet<u32> = owned_by(t, "b");
        assert_eq!(b_parts, b.owned);
    }
}

/// The raw etcd chain the fast path is built on, measured here for comparison: a fenced
/// transaction, and the transaction → another client's watch delivery.
async fn raw_etcd_chain(cluster: &TestCluster) {
    let etcd = cluster.etcd.as_ref().expect("an etcd cluster");
    let watcher = etcd.store().await;
    let prefix = format!("{}-raw-chain/", cluster.config.prefix.trim_end_matches('/'));
    let leader_key = format!("{}leader", cluster.config.prefix);
    let give_up = Instant::now() + PROMPT;
    let leader_kv = loop {
        if let Some(kv) = cluster.store.get(&leader_key).await.expect("read the leader key") {
            break kv;
        }
        assert!(Instant::now() < give_up, "no leader key within {PROMPT:?}");
        tokio::time::sleep(crate::support::POLL_INTERVAL).await;
    };
    let from = cluster.store.get_prefix(&prefix).await.expect("read").revision + 1;
    let mut watch = watcher.watch_prefix(&prefix, from).await.expect("watch");
    let (mut txns, mut chains) = (Vec::new(), Vec::new());
    for i in 0..50 {
        let sent = Instant::now();
        let txn = Txn::new()
            .when(Compare::CreateRevision(leader_key.clone(), leader_kv.create_revision))
            .then(Op::put(format!("{prefix}{i}"), b"x".to_vec()));
        assert!(cluster.store.txn(txn).await.expect("txn").succeeded);
        txns.push(sent.elapsed());
        crate::support::next_within(&mut watch, PROMPT, "the watch event").await.expect("a watch event");
        chains.push(sent.elapsed());
    }
    txns.sort();
    chains.sort();
    eprintln!(
        "[etcd] raw chain for comparison over 50: fenced txn p50 {:?}, p99 {:?}; txn → other client's watch \
         p50 {:?}, p99 {:?}",
        percentile(&txns, 0.5),
        percentile(&txns, 0.99),
        percentile(&chains, 0.5),
        percentile(&chains, 0.99)
    );
}
