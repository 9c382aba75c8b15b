//! The fault wrapper, on a `MemoryStore` under paused tokio time.

use super::*;
use crate::store::{Compare, InjectedFault, MemoryStore, Op, Unreachable, WatchBatch};

fn wrapped(seed: u64) -> (FaultyStore, MemoryStore) {
    let memory = MemoryStore::new();
    (FaultyStore::new(Arc::new(memory.clone()), seed), memory)
}

/// The injected fault a call failed with.
fn unavailable<T: fmt::Debug>(result: Result<T, StoreError>) -> InjectedFault {
    match result {
        Err(StoreError::Unavailable(Unreachable::Injected(fault))) => fault,
        other => panic!("expected an injected Unavailable, got {other:?}"),
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
    assert_eq!(unavailable(store.txn(create()).await), InjectedFault::AnswerLost { what: "txn" });
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
    assert_eq!(unavailable(store.get("k").await), InjectedFault::CutOff { what: "get" });
    unavailable(store.put("k", b"1".to_vec(), None).await);
    unavailable(store.watch_prefix("", 0).await.map(|_| ()));
    assert_eq!(memory.get("k").await.unwrap(), None, "a refused call never reaches the store");
    assert_eq!(unavailable(next_batch(&mut watch).await), InjectedFault::WatchCut);
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

/// Whether `memory` holds `key` now.
async fn holds(memory: &MemoryStore, key: &str) -> bool {
    memory.get(key).await.unwrap().is_some()
}

#[tokio::test(start_paused = true)]
async fn a_stall_holds_requests_and_answers_then_delivers_them_late() {
    let (store, memory) = wrapped(7);
    let mut watch = store.watch_prefix("", 0).await.unwrap();
    let start = Instant::now();
    store.stall(Duration::from_secs(5), AfterStall::Deliver);
    let writer = store.clone();
    let put = tokio::spawn(async move { writer.put("k", b"1".to_vec(), None).await });
    // Written by someone else meanwhile: its batch is held too.
    let other = memory.put("other", b"1".to_vec(), None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(4_999)).await;
    assert!(!holds(&memory, "k").await, "the request waits at the door");
    let revision = put.await.unwrap().unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert!(revision > other, "it reached the store after the other write: late");
    // Batches come after the stall, in order.
    assert_eq!(next_batch(&mut watch).await.unwrap().revision, other);
    assert_eq!(next_batch(&mut watch).await.unwrap().revision, revision);
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    let stall = store.last_stall().unwrap();
    assert_eq!((stall.id, stall.since, stall.until), (1, start, start + Duration::from_secs(5)));
    assert_eq!(store.stats().lost_answers, 0);
    assert!(store.stats().stalled_calls >= 1);
}

#[tokio::test(start_paused = true)]
async fn a_stall_that_resets_applies_the_held_write_late_and_loses_its_answer() {
    let (store, memory) = wrapped(8);
    let mut watch = store.watch_prefix("", 0).await.unwrap();
    // An answer on its way back (delayed) when the stall begins is lost too.
    store.delay(Duration::from_millis(100), Duration::from_millis(100));
    let writer = store.clone();
    let early = tokio::spawn(async move { writer.put("early", b"1".to_vec(), None).await });
    tokio::time::sleep(Duration::from_millis(75)).await;
    assert!(holds(&memory, "early").await, "applied at +50 ms, answer due at +100 ms");
    store.stall(Duration::from_secs(2), AfterStall::Lose);
    store.delay(Duration::ZERO, Duration::ZERO);
    let late = store.put("late", b"1".to_vec(), None).await;
    assert!(matches!(unavailable(late), InjectedFault::ResetAfterStall { .. }));
    assert!(matches!(unavailable(early.await.unwrap()), InjectedFault::ResetAfterStall { .. }));
    assert!(holds(&memory, "late").await, "the held write reached the store, late");
    // Reads held by it fail as well; the watch open across it broke.
    assert_eq!(unavailable(next_batch(&mut watch).await), InjectedFault::WatchCut);
    assert_eq!(store.stats().lost_answers, 2);
    // After it, everything works again.
    assert!(store.get("late").await.unwrap().is_some());
    store.put("after", b"1".to_vec(), None).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_armed_stall_starts_at_the_transaction_it_picks() {
    let (store, memory) = wrapped(9);
    store.stall_at_txn(Duration::from_secs(3), AfterStall::Deliver, |txn: &Txn| {
        txn.ops.iter().any(|op| matches!(op, Op::Put { key, .. } if key.starts_with("plan/")))
    });
    // Reads and other writes go through.
    store.put("other", b"1".to_vec(), None).await.unwrap();
    assert!(store.get("other").await.unwrap().is_some());
    assert_eq!(store.last_stall(), None);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let picked_at = Instant::now();
    let writer = store.clone();
    let plan = tokio::spawn(async move { writer.put("plan/1", b"1".to_vec(), None).await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let stall = store.last_stall().expect("the picked transaction started it");
    assert_eq!((stall.since, stall.until), (picked_at, picked_at + Duration::from_secs(3)));
    assert!(!holds(&memory, "plan/1").await, "the picked transaction is the first one held");
    // Everything else waits with it; ending it early lets all go.
    let reader = store.clone();
    let read = tokio::spawn(async move { reader.get("other").await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!read.is_finished());
    store.end_stall();
    plan.await.unwrap().unwrap();
    assert!(read.await.unwrap().unwrap().is_some());
    assert_eq!(Instant::now(), picked_at + Duration::from_millis(20));
    // Armed once: the next plan write passes.
    store.put("plan/2", b"1".to_vec(), None).await.unwrap();
    assert_eq!(store.last_stall().unwrap().id, 1);
}

#[tokio::test(start_paused = true)]
async fn applied_transactions_are_logged_with_their_keys_while_recording() {
    let (store, _) = wrapped(10);
    store.put("before", b"1".to_vec(), None).await.unwrap();
    store.record_writes(true);
    let first = store.put("a", b"1".to_vec(), None).await.unwrap();
    store.lose_next_answers(1);
    unavailable(store.delete("a").await);
    // A refused compare writes nothing.
    let refused = Txn::new().when(Compare::ModRevision("a".into(), 1)).then(Op::put("b", "1"));
    assert!(!store.txn(refused).await.unwrap().succeeded);
    let writes = store.take_writes();
    assert_eq!(writes.len(), 2);
    assert_eq!(writes[0], WrittenTxn { revision: first, keys: vec!["a".into()] });
    assert_eq!((writes[1].revision, writes[1].keys.clone()), (first + 1, vec!["a".to_string()]));
    assert!(store.take_writes().is_empty(), "taken");
    store.record_writes(false);
    store.put("c", b"1".to_vec(), None).await.unwrap();
    assert!(store.take_writes().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_second_stall_extends_the_first_and_never_shortens_it() {
    let (store, _) = wrapped(11);
    let start = Instant::now();
    store.stall(Duration::from_secs(3), AfterStall::Deliver);
    tokio::time::sleep(Duration::from_secs(1)).await;
    store.stall(Duration::from_millis(500), AfterStall::Lose);
    let stall = store.last_stall().unwrap();
    assert_eq!((stall.id, stall.since, stall.until), (2, start, start + Duration::from_secs(3)));
    assert_eq!(stall.then, AfterStall::Lose, "its answers are lost if either stall's are");
    store.stall(Duration::from_secs(4), AfterStall::Deliver);
    let stall = store.last_stall().unwrap();
    assert_eq!(
        (stall.since, stall.until, stall.then),
        (start, start + Duration::from_secs(5), AfterStall::Lose)
    );
    // A call held through it all is applied when the last one ends, and its answer lost.
    unavailable(store.put("k", b"1".to_vec(), None).await);
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert!(store.get("k").await.unwrap().is_some());
}
