//! Memory-only behaviour; the shared contract is tested by the conformance suite.

use super::*;
use crate::store::Op;

#[tokio::test(start_paused = true)]
async fn expiry_runs_on_paused_time() {
    let store = MemoryStore::new();
    let session = store.grant_session(Duration::from_secs(10)).await.unwrap();
    store.put("a", b"1".to_vec(), Some(session)).await.unwrap();
    let mut watch = store.watch_prefix("", 0).await.unwrap();
    let start = Instant::now();
    // Nothing but the expiry task is pending: auto-advance jumps to the deadline.
    let event = watch.next().await.unwrap().unwrap().events.remove(0);
    assert_eq!(event.kind, WatchEventKind::Delete);
    assert_eq!(event.key, "a");
    assert_eq!(Instant::now() - start, Duration::from_secs(10));
    assert!(matches!(store.keep_alive(session).await, Err(StoreError::SessionExpired(_))));
}

#[tokio::test(start_paused = true)]
async fn keep_alive_pushes_the_deadline() {
    let store = MemoryStore::new();
    let session = store.grant_session(Duration::from_secs(3)).await.unwrap();
    store.put("a", b"1".to_vec(), Some(session)).await.unwrap();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        store.keep_alive(session).await.unwrap();
    }
    assert!(store.get("a").await.unwrap().is_some());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(store.get("a").await.unwrap().is_none());
}

#[tokio::test(start_paused = true)]
async fn earlier_session_granted_later_wakes_the_task() {
    let store = MemoryStore::new();
    let long = store.grant_session(Duration::from_secs(100)).await.unwrap();
    store.put("long", b"".to_vec(), Some(long)).await.unwrap();
    let short = store.grant_session(Duration::from_secs(1)).await.unwrap();
    store.put("short", b"".to_vec(), Some(short)).await.unwrap();
    let mut watch = store.watch_prefix("", 0).await.unwrap();
    let start = Instant::now();
    let event = watch.next().await.unwrap().unwrap().events.remove(0);
    assert_eq!((event.key.as_str(), Instant::now() - start), ("short", Duration::from_secs(1)));
}

#[tokio::test]
async fn dropping_the_store_stops_the_task_and_ends_watches() {
    let store = MemoryStore::new();
    store.grant_session(Duration::from_secs(3600)).await.unwrap();
    let task = store.inner.lock().expiry_task.as_ref().map(|t| t.id());
    assert!(task.is_some());
    let weak = Arc::downgrade(&store.inner);
    let mut watch = store.watch_prefix("", 0).await.unwrap();
    drop(store);
    assert!(weak.upgrade().is_none());
    assert!(matches!(watch.next().await, Some(Err(StoreError::Closed))));
    assert!(watch.next().await.is_none());
}

#[tokio::test]
async fn history_limit_compacts_whole_revisions() {
    let store = MemoryStore::with_history_limit(3);
    store.put("a", b"1".to_vec(), None).await.unwrap(); // rev 2
    let rev3 = store.txn(Txn::new().then(Op::put("b", "1")).then(Op::put("c", "1"))).await.unwrap().revision;
    assert_eq!(rev3, 3);
    store.put("d", b"1".to_vec(), None).await.unwrap(); // rev 4: history [b@3, c@3, d@4]
    assert_eq!(store.compacted_revision(), 3);
    store.put("e", b"1".to_vec(), None).await.unwrap(); // rev 5: b@3 dropped, so c@3 too
    assert_eq!(store.compacted_revision(), 4);
    assert!(matches!(
        store.watch_prefix("", 3).await,
        Err(StoreError::Compacted { requested: 3, compacted: 4 })
    ));
    let mut watch = store.watch_prefix("", 4).await.unwrap();
    assert_eq!(watch.next().await.unwrap().unwrap().events[0].key, "d");
    assert_eq!(watch.next().await.unwrap().unwrap().events[0].key, "e");
}

#[tokio::test]
async fn dropped_watches_are_forgotten() {
    let store = MemoryStore::new();
    let watch = store.watch_prefix("quiet/", 0).await.unwrap();
    let _kept = store.watch_prefix("", 0).await.unwrap();
    assert_eq!(store.inner.lock().watchers.len(), 2);
    drop(watch);
    store.put("elsewhere", b"1".to_vec(), None).await.unwrap();
    assert_eq!(store.inner.lock().watchers.len(), 1);
}

#[tokio::test]
async fn invalid_transactions_are_refused() {
    let store = MemoryStore::new();
    let dup = Txn::new().then(Op::put("a", "1")).then(Op::delete("a"));
    let twice = store.txn(dup).await;
    assert!(
        matches!(&twice, Err(StoreError::Invalid(Malformed::KeyWrittenTwice { key })) if key == "a"),
        "{twice:?}"
    );
    assert!(matches!(store.put("", b"".to_vec(), None).await, Err(StoreError::Invalid(Malformed::EmptyKey))));
    let no_ttl = store.grant_session(Duration::ZERO).await;
    assert!(matches!(no_ttl, Err(StoreError::Invalid(Malformed::ZeroTtl))));
    let future = store.compact(5).await;
    assert!(matches!(
        future,
        Err(StoreError::Invalid(Malformed::CompactInFuture { revision: 5, current: 1 }))
    ));
    assert_eq!(store.revision(), 1);
}

#[tokio::test]
async fn moving_a_key_between_sessions() {
    let store = MemoryStore::new();
    let a = store.grant_session(Duration::from_secs(60)).await.unwrap();
    let b = store.grant_session(Duration::from_secs(60)).await.unwrap();
    store.put("k", b"1".to_vec(), Some(a)).await.unwrap();
    store.put("k", b"2".to_vec(), Some(b)).await.unwrap();
    store.revoke_session(a).await.unwrap();
    assert_eq!(store.get("k").await.unwrap().unwrap().session, Some(b));
    store.put("k", b"3".to_vec(), None).await.unwrap();
    store.revoke_session(b).await.unwrap();
    assert_eq!(store.get("k").await.unwrap().unwrap().value, b"3");
}

#[tokio::test(start_paused = true)]
async fn a_session_expiry_is_one_batch() {
    let store = MemoryStore::new();
    let session = store.grant_session(Duration::from_secs(2)).await.unwrap();
    for key in ["s/a", "s/b", "s/c"] {
        store.put(key, b"1".to_vec(), Some(session)).await.unwrap();
    }
    let mut watch = store.watch_prefix("s/", 0).await.unwrap();
    let batch = watch.next().await.unwrap().unwrap();
    let keys: Vec<&str> = batch.events.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["s/a", "s/b", "s/c"]);
    assert!(batch.events.iter().all(|e| e.revision == batch.revision && e.kind == WatchEventKind::Delete));
}

#[tokio::test]
async fn a_watch_gets_only_its_part_of_a_revision() {
    let store = MemoryStore::new();
    let mut watch = store.watch_prefix("in/", 0).await.unwrap();
    let txn = Txn::new().then(Op::put("in/a", "1")).then(Op::put("out/b", "1")).then(Op::put("in/c", "1"));
    let revision = store.txn(txn).await.unwrap().revision;
    store.put("out/d", b"1".to_vec(), None).await.unwrap();
    let marker = store.put("in/e", b"1".to_vec(), None).await.unwrap();
    let batch = watch.next().await.unwrap().unwrap();
    assert_eq!(batch.revision, revision);
    assert_eq!(batch.events.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["in/a", "in/c"]);
    // The revision with nothing under the prefix yields no (empty) batch.
    assert_eq!(watch.next().await.unwrap().unwrap().revision, marker);
}

/// A short TTL on real time, for the tests that use more than one runtime (a paused clock
/// belongs to one runtime).
const SHORT_TTL: Duration = Duration::from_millis(200);

/// Binds "a" to a new session of [`SHORT_TTL`] and waits (on real time, at most 5 s) for
/// the expiry task to delete it, with no other operation that could expire it lazily.
async fn bound_key_expires(store: &MemoryStore, session: Option<SessionId>) {
    let mut watch = store.watch_prefix("", 0).await.unwrap();
    let session = match session {
        Some(session) => session,
        None => store.grant_session(SHORT_TTL).await.unwrap(),
    };
    store.put("a", b"1".to_vec(), Some(session)).await.unwrap();
    let mut deleted = false;
    let waited = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(batch)) = watch.next().await {
            if batch.events.iter().any(|e| e.key == "a" && e.kind == WatchEventKind::Delete) {
                deleted = true;
                return;
            }
        }
    })
    .await;
    assert!(waited.is_ok() && deleted, "the session's key was not expired within 5 s");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[tokio::test]
async fn a_session_granted_from_another_runtime_expires_after_that_runtime_ended() {
    // The instance lease's keeper grants from a thread and runtime of its own.
    let store = MemoryStore::new();
    let granting = store.clone();
    let session = std::thread::spawn(move || runtime().block_on(granting.grant_session(SHORT_TTL)))
        .join()
        .unwrap()
        .unwrap();
    bound_key_expires(&store, Some(session)).await;
}

#[test]
fn a_store_whose_runtime_ended_expires_on_the_callers_runtime() {
    let first = runtime();
    let store = first.block_on(async { MemoryStore::new() });
    drop(first);
    runtime().block_on(bound_key_expires(&store, None));
}

/// A store started at a revision writes above it, and a watch from its start sees every
/// write: what the memory backend relies on so a restarted process never hands out lower
/// revisions (ownership epochs) than the run before.
#[tokio::test]
async fn a_store_starting_at_a_revision_writes_above_it() {
    let store = MemoryStore::starting_at(1_000_000);
    assert_eq!(store.revision(), 1_000_000);
    let mut watch = store.watch_prefix("", store.revision() + 1).await.unwrap();
    let written = store.put("a", b"1".to_vec(), None).await.unwrap();
    assert_eq!(written, 1_000_001);
    let kv = store.get("a").await.unwrap().unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision), (1_000_001, 1_000_001));
    assert_eq!(watch.next().await.unwrap().unwrap().revision, 1_000_001);
    let a_later_run = MemoryStore::starting_now();
    assert!(
        a_later_run.revision() > 1_700_000_000_000_000,
        "microseconds since 1970: {}",
        a_later_run.revision()
    );
    assert!(MemoryStore::starting_now().revision() >= a_later_run.revision());
}
