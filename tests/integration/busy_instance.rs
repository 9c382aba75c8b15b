//! A busy instance delivers late; it never loses its session or its leadership because it
//! was busy (docs/design.md §9: nothing starves the keep-alive).
//!
//! The fault injected is the worst case of being busy: every worker thread of the runtime
//! that serves the instance (and its consumers' connections) is blocked for twice the
//! session TTL, so no task of that runtime runs at all. The instance's lease is kept on a
//! thread of its own (`coordinator::shared::lease`), so after the freeze the consumer's
//! stream is still open, it was told nothing, and every record bound to the instance's
//! session (its registration, the leader record) is the one written before the freeze.
//! With the keep-alive on the serving runtime, the instance fences itself (the stream ends
//! `UNAVAILABLE`) and on etcd the session expires.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use kafka_assigner::store::PrefixSnapshot;

use crate::support::{
    POLL_INTERVAL,
    assigner::{Backend, PARTITIONS, PROMPT, TOPIC, TTL, TestCluster, on_both_backends},
};

/// Worker threads of the test runtime (`on_both_backends!`): every one is frozen.
const WORKERS: usize = 2;

/// How long the runtime is frozen: twice the TTL, well past the moment the instance
/// would fence itself (¾ TTL) and the store would expire its session (1 TTL).
const FREEZE: Duration = Duration::from_secs(2);

on_both_backends!(a_runtime_frozen_past_the_ttl_keeps_the_session_the_leadership_and_the_streams);

async fn a_runtime_frozen_past_the_ttl_keeps_the_session_the_leadership_and_the_streams(backend: Backend) {
    assert!(FREEZE >= TTL * 2);
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    cluster.wait_leader(PROMPT).await;
    let mut consumer = cluster.sole_owner(0, "steady", TOPIC).await;
    let before = bound_records(&cluster.stored().await);
    assert!(
        before.iter().any(|(key, ..)| key.ends_with("leader")),
        "the leader record is bound to the instance session: {before:?}"
    );

    // Block every worker. The test's own future runs on this thread (`block_on`), not on a
    // worker, so it can see them all blocked and wait for the freeze to end.
    let frozen = Arc::new(AtomicUsize::new(0));
    let blockers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let frozen = frozen.clone();
            tokio::spawn(async move {
                frozen.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(FREEZE);
            })
        })
        .collect();
    let give_up = std::time::Instant::now() + PROMPT;
    while frozen.load(Ordering::SeqCst) < WORKERS {
        assert!(std::time::Instant::now() < give_up, "the workers were not all frozen within {PROMPT:?}");
        std::thread::sleep(POLL_INTERVAL);
    }
    for blocker in blockers {
        blocker.await.expect("a blocker task");
    }

    // Thawed. Give the instance the time it would take to act on a lost session (fence
    // the stream, re-register), then check from the consumer's side and the store's.
    consumer.assert_quiet(TTL).await;
    assert!(consumer.ended.is_none(), "the consumer's stream ended: {:?}", consumer.ended);
    assert_eq!(consumer.owned.len(), PARTITIONS as usize, "the consumer was told to stop: {consumer:?}");
    assert!(cluster.instance(0).coordinator.is_leader(), "the instance lost its leadership");
    let after = bound_records(&cluster.stored().await);
    assert_eq!(after, before, "records bound to the instance session were lost or written again");
}

/// Every record bound to a session, with its creation revision and session: a session
/// that expired and was replaced shows as a different session or a later creation.
fn bound_records(snapshot: &PrefixSnapshot) -> Vec<(String, i64, i64)> {
    let bound =
        snapshot.kvs.iter().filter_map(|kv| Some((kv.key.clone(), kv.create_revision, kv.session?.0)));
    bound.collect()
}
