//! The fault wrapper, on a `MemoryStore` under paused tokio time.

use super::*;
use crate::store::{Compare, MemoryStore, Op, WatchBatch};

fn wrapped(seed: u64) -> (FaultyStore, MemoryStore) {
    let memory = MemoryStore::new();
    (FaultyStore::new(Arc::new(memory.clone()), seed), memory)
}

fn unavailable<T: fmt::Debug>(result: Result<T, StoreError>) -> String {
    match result {
        Err(StoreError::Unavailable(message)) => message,
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

async fn next_batch(watch: &mut WatchStream) -> Result<WatchBatch, StoreError> {
    match tokio::time::timeout(Duration::from_secs(3600), watch.next()).await {
        Ok(Some(item)) => item,
        other => panic!("no watch item: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_is_applied_all_the_same() {
    let (store, memory) = wrapped(1);
    store.lose_next_answers(1);
    let create = || Txn::new().when(Compare::ModRevision("k".into(), 0)).then(Op::put("k", "1"));
    assert!(unavailable(store.txn(create()).await).contains("lost"));
    assert_eq!(memory.get("k").await.unwrap().unwrap().value, b"1", "applied");
    // The caller's retry finds its own write: the compare no longer holds.
    assert!(!store.txn(create()).await.unwrap().succeeded);
    assert_eq!(store.stats().lost_answers, 1);
    // Reads never lose answers.
    store.lose_answers(1.0);
    assert!(store.get("k").await.unwrap().is_some());
    unavailable(store.put("k", b"2".to_vec(), None).await);
    assert_eq!(memory.get("k").await.unwrap().unwrap().value, b"2");
}

#[tokio::test(start_paused = true)]
async fn a_lost_grant_still_tracks_the_session() {
    let (store, memory) = wrapped(1);
    store.lose_next_answers(1);
    unavailable(store.grant_session(Duration::from_secs(5)).await);
    let sessions = store.sessions();
    assert_eq!(sessions.len(), 1);
    // It exists in the store: a record can be bound to it.
    memory.put("k", b"1".to_vec(), Some(sessions[0])).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn delays_apply_to_answers_and_keep_watch_order() {
    let (store, memory) = wrapped(2);
    let mut watch = store.watch_prefix("", 0).await.unwrap();
    store.delay(Duration::from_millis(100), Duration::from_millis(100));
    let start = Instant::now();
    let revision = store.put("a", b"1".to_vec(), None).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(100), "half before, half after the store");
    // Committed at +50 ms, delivered 100 ms later.
    assert_eq!(next_batch(&mut watch).await.unwrap().revision, revision);
    assert_eq!(start.elapsed(), Duration::from_millis(150));

    // Random delays never reorder batches.
    store.delay(Duration::ZERO, Duration::from_millis(200));
    let mut written = Vec::new();
    for i in 0..30 {
        written.push(memory.put(&format!("k{i}"), b"v".to_vec(), None).await.unwrap());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut seen = Vec::new();
    while seen.len() < written.len() {
        seen.push(next_batch(&mut watch).await.unwrap().revision);
    }
    assert_eq!(seen, written);
}

#[tokio::test(start_paused = true)]
async fn a_cut_off_refuses_calls_breaks_watches_and_ends() {
    let (store, memory) = wrapped(3);
    let mut watch = store.watch_prefix("", 0).await.unwrap();
    store.cut_off_for(Duration::from_secs(5));
    assert!(store.is_cut_off());
    assert!(unavailable(store.get("k").await).contains("cut off"));
    unavailable(store.put("k", b"1".to_vec(), None).await);
    unavailable(store.watch_prefix("", 0).await.map(|_| ()));
    assert_eq!(memory.get("k").await.unwrap(), None, "a refused call never reaches the store");
    assert!(unavailable(next_batch(&mut watch).await).contains("cut off"));
    assert!(watch.next().await.is_none(), "nothing after the error item");

    // Under paused time the cut ends exactly 5 s after it started.
    tokio::time::sleep(Duration::from_secs(5) - Duration::from_millis(1)).await;
    assert!(store.is_cut_off());
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(!store.is_cut_off());
    let mut watch = store.watch_prefix("", 0).await.unwrap();
    let revision = store.put("k", b"1".to_vec(), None).await.unwrap();
    assert_eq!(next_batch(&mut watch).await.unwrap().revision, revision);
    let stats = store.stats();
    assert_eq!((stats.refused_calls, stats.broken_watches), (3, 1));

    // Until restored.
    store.cut_off();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    unavailable(store.get("k").await);
    unavailable(next_batch(&mut watch).await);
    store.restore();
    assert!(store.get("k").await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_cut_during_a_call_loses_its_answer() {
    let (store, memory) = wrapped(4);
    store.delay(Duration::from_millis(100), Duration::from_millis(100));
    let cutter = store.clone();
    let cut = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(75)).await;
        cutter.cut_off();
    });
    // Reaches the store at +50 ms, answer back at +100 ms: the cut at +75 ms loses it.
    unavailable(store.put("k", b"1".to_vec(), None).await);
    cut.await.unwrap();
    assert!(memory.get("k").await.unwrap().is_some());
    assert_eq!(store.stats().lost_answers, 1);
}

#[tokio::test(start_paused = true)]
async fn sessions_expire_on_demand_even_when_cut_off() {
    let (store, memory) = wrapped(5);
    let a = store.grant_session(Duration::from_secs(60)).await.unwrap();
    let b = store.grant_session(Duration::from_secs(60)).await.unwrap();
    store.put("a", b"1".to_vec(), Some(a)).await.unwrap();
    store.put("b", b"1".to_vec(), Some(b)).await.unwrap();
    store.expire_session(a).await.unwrap();
    assert_eq!(memory.get("a").await.unwrap(), None);
    assert!(matches!(store.keep_alive(a).await, Err(StoreError::SessionExpired(s)) if s == a));
    store.cut_off();
    assert_eq!(store.expire_all_sessions().await.unwrap(), vec![b]);
    assert_eq!(memory.get("b").await.unwrap(), None);
    assert_eq!(store.stats().expired_sessions, 2);
    assert!(store.sessions().is_empty());
}

/// What a seeded run of random faults does: which writes lost their answer, and when.
async fn seeded_run(seed: u64) -> Vec<(bool, Duration)> {
    let (store, _) = wrapped(seed);
    store.lose_answers(0.5);
    store.delay(Duration::from_millis(1), Duration::from_millis(50));
    let start = Instant::now();
    let mut outcomes = Vec::new();
    for i in 0..40 {
        let lost = store.put(&format!("k{i}"), b"v".to_vec(), None).await.is_err();
        outcomes.push((lost, start.elapsed()));
    }
    outcomes
}

#[tokio::test(start_paused = true)]
async fn the_same_seed_gives_the_same_faults() {
    let first = seeded_run(42).await;
    assert_eq!(first, seeded_run(42).await);
    assert_ne!(first, seeded_run(43).await);
    let lost = first.iter().filter(|(lost, _)| *lost).count();
    assert!((5..=35).contains(&lost), "about half the answers lost, got {lost} of 40");
}

#[tokio::test(start_paused = true)]
async fn txn_losses_skip_session_calls() {
    let (store, memory) = wrapped(6);
    store.lose_next_txn_answers(1);
    let session = store.grant_session(Duration::from_secs(5)).await.unwrap();
    store.keep_alive(session).await.unwrap();
    unavailable(store.put("k", b"1".to_vec(), Some(session)).await);
    assert!(memory.get("k").await.unwrap().is_some());
    store.put("k", b"2".to_vec(), None).await.unwrap();
}
