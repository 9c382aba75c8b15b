//! The consumer-facing scenarios of docs/design.md §5 and §6 over real gRPC, each run on the
//! memory backend and on a real etcd (`grpc_scenarios::memory::*`, `grpc_scenarios::etcd::*`).

use std::time::{Duration, Instant};

use kafka_assigner::config::DrainPolicy;
use kafka_assigner::handoff::{ConsumerStatus, Phase};
use kafka_assigner::proto::v1::{AssignmentCommand, DeregisterAction, assignment_command::Command};
use tonic::Code;

use crate::support::assigner::{
    Backend, EXPIRY, PARTITIONS, PROMPT, TOPIC, TTL, TestCluster, TestConsumer, all_partitions,
    consumer_names, describe, on_both_backends, owned_by, settle, topic,
};
use crate::support::{metric, wait_until};

on_both_backends!(
    one_consumer_gets_all_partitions,
    two_consumers_split_through_warm_handoffs,
    slow_warm_keeps_the_old_owner_until_ready,
    target_crash_while_warming_cancels_the_handoff,
    owner_crash_moves_partitions_directly,
    reconnect_within_ttl_moves_nothing,
    second_register_replaces_the_first,
    deregister_with_drain_hands_everything_off,
    deregister_shutdown_now_holds_partitions_for_the_restart,
    shutdown_now_partitions_move_after_the_grace,
    shutdown_now_after_the_stream_dropped_still_holds_partitions,
    owner_crash_while_warming_gives_the_partition_to_the_target,
    owner_crash_while_releasing_completes_the_handoff,
    warm_timeout_cancels_and_retries_later,
    release_timeout_completes_the_handoff_anyway,
);

/// `AssignmentUpdate{assigned, unassigned}` as partition lists, or a panic.
fn update(command: &AssignmentCommand) -> (Vec<u32>, Vec<u32>) {
    match &command.command {
        Some(Command::Assignment(u)) => (
            u.assigned.iter().map(|t| t.partition).collect(),
            u.unassigned.iter().map(|t| t.partition).collect(),
        ),
        _ => panic!("expected an AssignmentUpdate, got {}", describe(command)),
    }
}

/// `ReleasePartition{partition, new_owner}`, or a panic.
fn release(command: &AssignmentCommand) -> (u32, String) {
    match &command.command {
        Some(Command::Release(r)) => {
            (r.partition.as_ref().map_or(u32::MAX, |t| t.partition), r.new_owner.clone())
        }
        _ => panic!("expected a ReleasePartition, got {}", describe(command)),
    }
}

fn is_warm(command: &&AssignmentCommand) -> bool {
    matches!(command.command, Some(Command::Warm(_)))
}

fn is_release(command: &&AssignmentCommand) -> bool {
    matches!(command.command, Some(Command::Release(_)))
}

/// A and B registered on one instance and settled at P/2 each; returns them and the
/// owners of the partitions.
async fn split_pair(cluster: &TestCluster) -> (TestConsumer, TestConsumer, Vec<Option<String>>) {
    let (a, b, status) = cluster.settled_pair(TOPIC, (0, 0)).await;
    let t = topic(&status, TOPIC);
    assert_eq!(a.owned.len(), PARTITIONS as usize / 2, "{a:?}");
    assert_eq!(b.owned.len(), PARTITIONS as usize / 2, "{b:?}");
    assert!(a.owned.is_disjoint(&b.owned));
    assert_eq!(owned_by(t, "a"), a.owned);
    (a, b, t.owners.clone())
}

/// §5.1: the first consumer gets every partition directly, after its (first) snapshot.
async fn one_consumer_gets_all_partitions(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let a = cluster.sole_owner(0, "a", TOPIC).await;
    assert_eq!(a.owned, all_partitions(PARTITIONS));
    for (_, command) in &a.history {
        let (_, unassigned) = update(command);
        assert!(unassigned.is_empty(), "a lone consumer loses nothing: {a:?}");
    }
    let status = cluster
        .wait_status(PROMPT, "a owns every partition", |s| {
            topic(s, TOPIC).owners.iter().all(|o| o.as_deref() == Some("a"))
        })
        .await;
    let t = topic(&status, TOPIC);
    assert!(t.handoffs.is_empty(), "{t:?}");
    assert_eq!(t.partition_count, PARTITIONS);
    assert_eq!(consumer_names(t), ["a"]);
}

/// §5.2–5.4: B warms first (ownership unchanged), owns after its ready while A is told to
/// release; after A's released no handoff remains and the split is even.
async fn two_consumers_split_through_warm_handoffs(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let half = PARTITIONS as usize / 2;
    // b warms half (not owning them), from a; a was told nothing.
    let (mut a, mut b) = cluster.warming_pair(TOPIC, (0, 0), half).await;
    let warmed: Vec<u32> = b.warms.keys().copied().collect();

    // Nothing has moved: a owns everything, the handoffs are Warming.
    let status = cluster
        .wait_status(PROMPT, "two warming handoffs a -> b", |s| topic(s, TOPIC).handoffs.len() == half)
        .await;
    let t = topic(&status, TOPIC);
    assert!(t.owners.iter().all(|o| o.as_deref() == Some("a")), "{t:?}");
    for h in &t.handoffs {
        assert_eq!((h.from.as_str(), h.to.as_str(), h.phase), ("a", "b", Phase::Warming), "{t:?}");
        assert!(warmed.contains(&h.partition), "{t:?}");
    }

    for &p in &warmed {
        b.ready(p).await.unwrap_or_else(|s| panic!("PartitionReady({p}): {s:?}"));
        assert_eq!(
            update(&b.next(PROMPT, "b's assignment of the warmed partition").await),
            (vec![p], vec![])
        );
        assert_eq!(release(&a.next(PROMPT, "a's release").await), (p, "b".to_string()));
        let status = cluster
            .wait_status(PROMPT, "the handoff is releasing with b owning", |s| {
                let t = topic(s, TOPIC);
                t.owners[p as usize].as_deref() == Some("b")
                    && t.handoffs.iter().any(|h| h.partition == p && h.phase == Phase::Releasing)
            })
            .await;
        let h = topic(&status, TOPIC).handoffs.iter().find(|h| h.partition == p).cloned();
        assert_eq!(h.map(|h| (h.from, h.to)), Some(("a".into(), "b".into())));
        a.released(p).await.unwrap_or_else(|s| panic!("PartitionReleased({p}): {s:?}"));
    }

    let status =
        cluster.wait_status(PROMPT, "no handoff left", |s| topic(s, TOPIC).handoffs.is_empty()).await;
    let t = topic(&status, TOPIC);
    assert_eq!(owned_by(t, "a").len(), half, "{t:?}");
    assert_eq!(owned_by(t, "b").len(), half, "{t:?}");
    assert_eq!(owned_by(t, "b"), warmed.iter().copied().collect());
    assert_eq!(a.owned, owned_by(t, "a"));
    assert_eq!(b.owned, owned_by(t, "b"));

    // The admin surface shows the same.
    let admin = cluster.admin_status(0).await;
    let topics = admin["topics"].as_array().expect("topics");
    let events = topics.iter().find(|t| t["topic"] == TOPIC).expect("events in /status");
    assert_eq!(events["handoffs"].as_array().map(Vec::len), Some(0), "{admin}");
    let owners: Vec<&str> =
        events["owners"].as_array().expect("owners").iter().filter_map(|o| o.as_str()).collect();
    assert_eq!(owners.iter().filter(|o| **o == "b").count(), half, "{admin}");

    // Stable: nothing more for either.
    a.assert_quiet(Duration::from_millis(300)).await;
    b.assert_quiet(Duration::ZERO).await;
}

/// §5.2: a warm that takes its time keeps the old owner (and keeps the handoff Warming)
/// until the target is ready, even past the session TTL.
async fn slow_warm_keeps_the_old_owner_until_ready(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let (mut a, mut b) = cluster.warming_pair(TOPIC, (0, 0), PARTITIONS as usize / 2).await;
    let a_seen = a.seen();
    let b_seen = b.seen();
    let p = *b.warms.keys().next().expect("a warm");

    // Deliberately let time pass without answering the warm.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let status = cluster.status().await;
    let t = topic(&status, TOPIC);
    assert!(t.owners.iter().all(|o| o.as_deref() == Some("a")), "the owner stays a: {t:?}");
    let h = t.handoffs.iter().find(|h| h.partition == p).unwrap_or_else(|| panic!("handoff of {p}: {t:?}"));
    assert_eq!((h.from.as_str(), h.to.as_str(), h.phase), ("a", "b", Phase::Warming));
    assert_eq!(t.handoffs.len(), PARTITIONS as usize / 2, "{t:?}");
    a.poll_now();
    b.poll_now();
    assert_eq!((a.seen(), b.seen()), (a_seen, b_seen), "nobody was told anything: {a:?} {b:?}");

    b.ready(p).await.unwrap_or_else(|s| panic!("late PartitionReady({p}): {s:?}"));
    assert_eq!(update(&b.next(PROMPT, "b's assignment").await), (vec![p], vec![]));
    assert_eq!(release(&a.next(PROMPT, "a's release").await), (p, "b".to_string()));
    a.released(p).await.unwrap_or_else(|s| panic!("PartitionReleased({p}): {s:?}"));
    let status = settle(&cluster, TOPIC, &mut [&mut a, &mut b], PROMPT).await;
    assert!(owned_by(topic(&status, TOPIC), "b").contains(&p));
}

/// §5.5: the target dies while warming → after its TTL the handoff is cancelled and the
/// owner keeps everything; the owner is never told to release.
async fn target_crash_while_warming_cancels_the_handoff(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let (mut a, mut b) = cluster.warming_pair(TOPIC, (0, 0), PARTITIONS as usize / 2).await;
    cluster.wait_status(PROMPT, "handoffs warming", |s| !topic(s, TOPIC).handoffs.is_empty()).await;

    let crashed = Instant::now();
    b.crash().await;
    let status = cluster
        .wait_status(EXPIRY, "b's session expired and its handoffs are cancelled", |s| {
            let t = topic(s, TOPIC);
            t.handoffs.is_empty() && consumer_names(t) == ["a"]
        })
        .await;
    eprintln!("[{}] warming target crash → handoffs cancelled after {:?}", backend.name(), crashed.elapsed());
    let t = topic(&status, TOPIC);
    assert!(t.owners.iter().all(|o| o.as_deref() == Some("a")), "a keeps everything: {t:?}");
    // The relay of that revision may trail the cache by a moment.
    a.assert_quiet(Duration::from_millis(300)).await;
    assert!(!a.history.iter().any(|(_, c)| is_release(&c)), "a must never be told to release: {a:?}");
    assert_eq!(a.owned, all_partitions(PARTITIONS));
}

/// §5.1 / §6: the owner dies → its partitions go to the other consumer directly (no warm)
/// within the TTL plus 1 s.
async fn owner_crash_moves_partitions_directly(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let (mut a, mut b, _) = split_pair(&cluster).await;
    let b_seen = b.seen();
    let a_parts = a.owned.clone();

    let crashed = Instant::now();
    a.crash().await;
    b.wait_for(TTL + Duration::from_secs(1), "b owns a's partitions", |c| {
        c.owned.len() == PARTITIONS as usize
    })
    .await;
    let took = crashed.elapsed();
    eprintln!("[{}] owner crash → partitions re-owned after {took:?}", backend.name());
    let moved = b.since(b_seen);
    assert!(!moved.iter().any(is_warm), "no warm when the owner is dead: {b:?}");
    let mut assigned = std::collections::BTreeSet::new();
    for command in moved {
        let (plus, minus) = update(command);
        assert!(minus.is_empty(), "{b:?}");
        assigned.extend(plus);
    }
    assert_eq!(assigned, a_parts);
    let status = cluster
        .wait_status(PROMPT, "b owns everything, a is gone", |s| consumer_names(topic(s, TOPIC)) == ["b"])
        .await;
    let t = topic(&status, TOPIC);
    assert!(t.handoffs.is_empty(), "{t:?}");
    assert_eq!(owned_by(t, "b"), all_partitions(PARTITIONS));
}

/// §6: the same name registering again within the TTL resumes its partitions; nothing
/// moves, not even when the old session expires.
async fn reconnect_within_ttl_moves_nothing(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let (mut a, mut b, owners_before) = split_pair(&cluster).await;
    let b_seen = b.seen();

    let dropped = Instant::now();
    a.crash().await;
    let mut a2 = cluster.consumer("a").await;
    let snapshot = a2.expect_snapshot().await;
    let took = dropped.elapsed();
    assert!(took < TTL, "the test must reconnect within the TTL (took {took:?})");
    assert_eq!(snapshot, a.owned, "same partitions in the snapshot");

    // Past the old session's expiry: still nothing moves.
    let quiet = TTL + Duration::from_secs(1);
    tokio::join!(a2.assert_quiet(quiet), b.assert_quiet(quiet));
    assert_eq!(b.seen(), b_seen);
    let status = cluster.status().await;
    let t = topic(&status, TOPIC);
    assert!(t.handoffs.is_empty(), "{t:?}");
    assert_eq!(t.owners, owners_before);
    assert_eq!(consumer_names(t), ["a", "b"]);
}

/// §6: a second live Register with the same name replaces the first: the old stream ends
/// with ABORTED, the new one gets the same partitions.
async fn second_register_replaces_the_first(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let mut a = cluster.sole_owner(0, "a", TOPIC).await;
    let a_seen = a.seen();

    let mut a2 = cluster.consumer("a").await;
    let end = a.expect_end(PROMPT).await;
    let status = end.expect_err("the replaced stream ends with an error status");
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(status.message().contains("'a'") && status.message().contains("replaced"), "{status:?}");
    for command in a.since(a_seen) {
        let (plus, _) = update(command);
        assert!(plus.is_empty(), "the replaced stream gains nothing: {a:?}");
    }
    assert_eq!(a2.expect_snapshot().await, all_partitions(PARTITIONS));

    // The old session is revoked: that must not touch the new registration.
    a2.assert_quiet(TTL + Duration::from_millis(500)).await;
    let status = cluster.status().await;
    let t = topic(&status, TOPIC);
    assert_eq!(consumer_names(t), ["a"]);
    assert_eq!(owned_by(t, "a"), all_partitions(PARTITIONS));
    assert!(t.handoffs.is_empty(), "{t:?}");
}

/// §6 `WAIT_FOR_DRAIN`: the leaving consumer hands every partition off (warm → ready →
/// release → released) and its stream ends cleanly after the last release.
async fn deregister_with_drain_hands_everything_off(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |c| c.drain_policy = DrainPolicy::Drain).await;
    let (mut a, mut b, _) = split_pair(&cluster).await;
    let a_parts = a.owned.clone();

    assert_eq!(a.deregister().await.expect("Deregister"), DeregisterAction::WaitForDrain);
    cluster
        .wait_status(PROMPT, "a is draining", |s| {
            topic(s, TOPIC).consumers.iter().any(|c| c.name == "a" && c.status == ConsumerStatus::Draining)
        })
        .await;
    b.wait_warms(a_parts.len(), PROMPT).await;
    assert_eq!(b.warms.keys().copied().collect::<std::collections::BTreeSet<_>>(), a_parts);
    assert!(b.warms.values().all(|o| o == "a"), "{b:?}");

    let last = *a_parts.iter().next_back().expect("a owns something");
    for &p in &a_parts {
        b.ready(p).await.unwrap_or_else(|s| panic!("PartitionReady({p}): {s:?}"));
        assert_eq!(update(&b.next(PROMPT, "b's assignment").await), (vec![p], vec![]));
        assert_eq!(release(&a.next(PROMPT, "a's release").await), (p, "b".to_string()));
        a.released(p).await.unwrap_or_else(|s| panic!("PartitionReleased({p}): {s:?}"));
        if p != last {
            a.poll_now();
            assert!(a.ended.is_none(), "a's stream must stay open until its last release: {a:?}");
        }
    }
    let end = a.expect_end(PROMPT).await;
    assert!(end.is_ok(), "a drained stream ends cleanly: {end:?}");
    let status = cluster
        .wait_status(PROMPT, "b owns everything and a is gone", |s| {
            let t = topic(s, TOPIC);
            t.handoffs.is_empty() && consumer_names(t) == ["b"]
        })
        .await;
    assert_eq!(owned_by(topic(&status, TOPIC), "b"), all_partitions(PARTITIONS));
    assert_eq!(b.owned, all_partitions(PARTITIONS));
}

/// §6 `SHUTDOWN_NOW` (the default policy): the consumer exits at once, its partitions are
/// held for it past the TTL, and when it comes back within the grace it gets them again.
async fn deregister_shutdown_now_holds_partitions_for_the_restart(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let (mut a, mut b, owners_before) = split_pair(&cluster).await;
    let b_seen = b.seen();

    assert_eq!(a.deregister().await.expect("Deregister"), DeregisterAction::ShutdownNow);
    a.crash().await; // SHUTDOWN_NOW: the consumer exits immediately.

    // Deliberately wait past the TTL: an unheld session would have expired by now.
    tokio::time::sleep(TTL + Duration::from_secs(1)).await;
    let status = cluster.status().await;
    let t = topic(&status, TOPIC);
    assert_eq!(t.owners, owners_before, "partitions held for a: {t:?}");
    assert!(t.handoffs.is_empty(), "{t:?}");
    assert_eq!(consumer_names(t), ["a", "b"]);
    b.poll_now();
    assert_eq!(b.seen(), b_seen, "b was told nothing: {b:?}");

    let mut a2 = cluster.consumer("a").await;
    assert_eq!(a2.expect_snapshot().await, a.owned, "a gets its partitions back");
    a2.assert_quiet(Duration::from_millis(300)).await;
    b.assert_quiet(Duration::ZERO).await;
    let status = cluster.status().await;
    let t = topic(&status, TOPIC);
    assert_eq!(t.owners, owners_before);
    assert!(t.handoffs.is_empty(), "{t:?}");
}

/// §6 `SHUTDOWN_NOW` when the consumer does not come back: after the grace its partitions
/// go to the others directly.
async fn shutdown_now_partitions_move_after_the_grace(backend: Backend) {
    let grace = Duration::from_secs(2);
    let cluster = TestCluster::start(backend, 1, |c| c.restart_grace = grace).await;
    let (mut a, mut b, _) = split_pair(&cluster).await;
    let b_seen = b.seen();
    let left = Instant::now();
    assert_eq!(a.deregister().await.expect("Deregister"), DeregisterAction::ShutdownNow);
    a.crash().await;
    b.wait_for(grace + EXPIRY, "b owns everything", |c| c.owned.len() == PARTITIONS as usize).await;
    let took = left.elapsed();
    eprintln!("[{}] SHUTDOWN_NOW with a {grace:?} grace → partitions moved after {took:?}", backend.name());
    assert!(took >= grace, "held for the whole grace (moved after {took:?})");
    assert!(!b.since(b_seen).iter().any(is_warm), "a direct move, no warm: {b:?}");
}

/// §6 `SHUTDOWN_NOW` answered to a consumer whose stream is already gone (it broke, or the
/// client closed it first) while its session is still live: the answer promises that the
/// partitions are held for the restart grace, so they must be, past the TTL.
async fn shutdown_now_after_the_stream_dropped_still_holds_partitions(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let (mut a, mut b, owners_before) = split_pair(&cluster).await;
    let b_seen = b.seen();
    let dropped = Instant::now();
    a.crash().await;
    // The server noticed the disconnect (b's stream is the one left), well within the TTL.
    let admin = cluster.instance(0).admin_addr;
    wait_until(TTL / 2, "the server ended a's stream", || async {
        metric(admin, "streams").await == Some(1.0)
    })
    .await;
    assert_eq!(a.deregister().await.expect("Deregister within the TTL"), DeregisterAction::ShutdownNow);
    assert!(dropped.elapsed() < TTL, "the Deregister must come within the TTL");

    // Deliberately wait past the TTL: an unheld session would have expired by now.
    tokio::time::sleep(TTL + Duration::from_secs(1)).await;
    let status = cluster.status().await;
    let t = topic(&status, TOPIC);
    assert_eq!(
        t.owners, owners_before,
        "SHUTDOWN_NOW was answered, so a's partitions must be held for its return: {t:?}"
    );
    b.poll_now();
    assert_eq!(b.seen(), b_seen, "b was told nothing: {b:?}");
    let mut a2 = cluster.consumer("a").await;
    assert_eq!(a2.expect_snapshot().await, a.owned, "a gets its partitions back");
}

/// §5.5: the owner dies while the target warms → the target gets the partition directly.
async fn owner_crash_while_warming_gives_the_partition_to_the_target(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let (mut a, mut b) = cluster.warming_pair(TOPIC, (0, 0), PARTITIONS as usize / 2).await;
    let warming = b.warms.clone();
    let b_seen = b.seen();

    a.crash().await;
    b.wait_for(EXPIRY, "b owns everything", |c| c.owned.len() == PARTITIONS as usize).await;
    assert!(b.warms.is_empty(), "the warms became ownership: {b:?}");
    for command in b.since(b_seen) {
        let (_, unassigned) = update(command);
        assert!(unassigned.is_empty(), "a warmed partition is not dropped: {b:?}");
    }
    let status = cluster
        .wait_status(PROMPT, "a is gone, no handoff", |s| {
            let t = topic(s, TOPIC);
            consumer_names(t) == ["b"] && t.handoffs.is_empty()
        })
        .await;
    assert_eq!(owned_by(topic(&status, TOPIC), "b"), all_partitions(PARTITIONS));
    // A late ready for a partition it now owns is accepted (a retry) and changes nothing.
    let p = *warming.keys().next().expect("a warm");
    b.ready(p).await.unwrap_or_else(|s| panic!("late PartitionReady({p}): {s:?}"));
    b.assert_quiet(Duration::from_millis(200)).await;
}

/// §5.5: the old owner dies while releasing → the handoff completes without its ack.
async fn owner_crash_while_releasing_completes_the_handoff(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let (mut a, mut b) = cluster.warming_pair(TOPIC, (0, 0), PARTITIONS as usize / 2).await;
    let p = *b.warms.keys().next().expect("a warm");
    b.ready(p).await.unwrap_or_else(|s| panic!("PartitionReady({p}): {s:?}"));
    assert_eq!(release(&a.next(PROMPT, "a's release").await), (p, "b".to_string()));

    a.crash().await; // never acknowledges
    b.wait_for(EXPIRY, "b owns everything", |c| c.owned.len() == PARTITIONS as usize).await;
    let status = cluster
        .wait_status(PROMPT, "a is gone, no handoff", |s| {
            let t = topic(s, TOPIC);
            consumer_names(t) == ["b"] && t.handoffs.is_empty()
        })
        .await;
    assert_eq!(owned_by(topic(&status, TOPIC), "b"), all_partitions(PARTITIONS));
}

/// §5.6: a warm never answered is cancelled after the warm timeout (the target is told to
/// drop it: `unassigned`) and retried later; the owner keeps the partition throughout.
async fn warm_timeout_cancels_and_retries_later(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |c| c.plan.warm_timeout_ms = 1_000).await;
    let (mut a, mut b) = cluster.warming_pair(TOPIC, (0, 0), PARTITIONS as usize / 2).await;
    let a_seen = a.seen();
    let first: Vec<u32> = b.warms.keys().copied().collect();
    let warned = Instant::now();

    b.wait_for(PROMPT, "the warms are cancelled", |c| c.warms.is_empty()).await;
    let cancelled_after = warned.elapsed();
    let cancelled_at = b.seen();
    let (plus, mut minus) = update(&b.history[cancelled_at - 1].1);
    minus.sort_unstable();
    assert!(plus.is_empty(), "{b:?}");
    assert_eq!(minus, first, "the cancelled warms are unassigned: {b:?}");
    assert!(cancelled_after >= Duration::from_millis(800), "not before the timeout ({cancelled_after:?})");
    let status = cluster.status().await;
    assert!(topic(&status, TOPIC).owners.iter().all(|o| o.as_deref() == Some("a")), "a keeps them");

    b.wait_warms(PARTITIONS as usize / 2, PROMPT).await;
    eprintln!(
        "[{}] warm timeout: cancelled after {cancelled_after:?}, retried after {:?}",
        backend.name(),
        warned.elapsed()
    );
    a.poll_now();
    assert!(!a.since(a_seen).iter().any(is_release), "a never released anything: {a:?}");
    settle(&cluster, TOPIC, &mut [&mut a, &mut b], PROMPT).await;
}

/// §5.6: a release never acknowledged is completed anyway after the release timeout.
async fn release_timeout_completes_the_handoff_anyway(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |c| c.plan.release_timeout_ms = 1_000).await;
    let (mut a, mut b) = cluster.warming_pair(TOPIC, (0, 0), PARTITIONS as usize / 2).await;
    let p = *b.warms.keys().next().expect("a warm");
    let flipped = Instant::now();
    b.ready(p).await.unwrap_or_else(|s| panic!("PartitionReady({p}): {s:?}"));
    assert_eq!(release(&a.next(PROMPT, "a's release").await), (p, "b".to_string()));

    let status = cluster
        .wait_status(PROMPT, "the unacknowledged release is completed", |s| {
            !topic(s, TOPIC).handoffs.iter().any(|h| h.partition == p)
        })
        .await;
    let took = flipped.elapsed();
    assert!(took >= Duration::from_millis(800), "not before the timeout ({took:?})");
    assert_eq!(topic(&status, TOPIC).owners[p as usize].as_deref(), Some("b"));
    b.wait_for(PROMPT, "b owns the partition", |c| c.owned.contains(&p)).await;
}
