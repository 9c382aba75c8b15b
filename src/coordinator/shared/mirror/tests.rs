//! Tests of the mirror (`mod.rs`): following the store, own writes, re-reads.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio_util::sync::CancellationToken;

use super::{Mirror, Source};
use crate::coordinator::shared::test_backend::{PREFIX, Records};
use crate::store::{LeaseStore, MemoryStore};

/// Runs a mirror of [`PREFIX`] over `store`, recording the topics of every relay call.
fn run(
    store: MemoryStore,
    mirror: Arc<Mirror<Records>>,
    resync: Duration,
) -> (Arc<Mutex<Vec<BTreeSet<String>>>>, CancellationToken) {
    let relayed = Arc::new(Mutex::new(Vec::new()));
    let stop = CancellationToken::new();
    let (seen, token) = (relayed.clone(), stop.clone());
    tokio::spawn(async move {
        let source = Source {
            store: &store,
            keys: &(),
            resync_interval: resync,
            stale_after: Duration::from_secs(3),
            shutdown: &token,
        };
        let mut follower = mirror.follower(source);
        while let Some(changes) = follower.next().await {
            let cache = mirror.read();
            seen.lock().expect("lock").push(changes.topics());
            mirror.announce(&cache);
        }
    });
    (relayed, stop)
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(10)).await;
}

#[tokio::test(start_paused = true)]
async fn follows_the_store_and_relays_whole_revisions() {
    let store = MemoryStore::new();
    let mirror = Arc::new(Mirror::<Records>::load(&store, &(), "test").await.expect("loads"));
    let (relayed, stop) = run(store.clone(), mirror.clone(), Duration::from_secs(300));
    let txn = crate::store::Txn::new()
        .then(crate::store::Op::put(format!("{PREFIX}a/x"), "1"))
        .then(crate::store::Op::put(format!("{PREFIX}b/x"), "2"));
    let revision = store.txn(txn).await.expect("written").revision;
    settle().await;
    assert_eq!(mirror.read().revision, revision);
    assert_eq!(mirror.read().kvs.len(), 2, "both keys of the transaction");
    let relayed = relayed.lock().expect("lock").clone();
    assert!(relayed.iter().any(|t| t.contains("a") && t.contains("b")), "{relayed:?}");
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_watch_that_cannot_resume_re_reads_and_relays_what_differs() {
    let store = MemoryStore::new();
    store.put(&format!("{PREFIX}a/x"), b"1".to_vec(), None).await.expect("written");
    let mirror = Arc::new(Mirror::<Records>::load(&store, &(), "test").await.expect("loads"));
    // Changes, then history compacted past them, before the mirror starts watching:
    // its watch from the snapshot's revision fails and it must re-read.
    store.put(&format!("{PREFIX}b/x"), b"2".to_vec(), None).await.expect("written");
    store.put(&format!("{PREFIX}b/y"), b"3".to_vec(), None).await.expect("written");
    store.compact(store.revision()).await.expect("compacted");
    let (relayed, stop) = run(store.clone(), mirror.clone(), Duration::from_secs(300));
    settle().await;
    assert_eq!(mirror.read().revision, store.revision(), "caught up by the re-read");
    assert_eq!(mirror.read().kvs.len(), 3);
    let relayed = relayed.lock().expect("lock").clone();
    assert_eq!(relayed.first(), Some(&BTreeSet::from(["b".to_string()])), "only the topic that changed");
    // And it follows the store again afterwards.
    store.put(&format!("{PREFIX}c/x"), b"4".to_vec(), None).await.expect("written");
    settle().await;
    assert_eq!(mirror.read().kvs.len(), 4);
    stop.cancel();
}

fn own_put(revision: crate::store::Revision, key: &str, value: &str) -> crate::store::WatchBatch {
    let ops = [crate::store::Op::put(format!("{PREFIX}{key}"), value)];
    super::own_batch(PREFIX, revision, &ops).expect("a put under the prefix")
}

#[tokio::test(start_paused = true)]
async fn an_own_write_is_applied_without_the_watch_and_its_watched_copy_is_skipped() {
    let store = MemoryStore::new();
    let mirror = Arc::new(Mirror::<Records>::load(&store, &(), "test").await.expect("loads"));
    let (relayed, stop) = run(store.clone(), mirror.clone(), Duration::from_secs(300));
    let next = store.revision() + 1;
    // Offered before the store has it: only the offer can bring it into the cache.
    mirror.offer(own_put(next, "a/x", "1"));
    settle().await;
    assert_eq!(mirror.read().revision, next);
    assert!(mirror.read().kvs.contains_key(&format!("{PREFIX}a/x")));
    assert_eq!(relayed.lock().expect("lock").len(), 1, "relayed once");
    // The same write now reaches the store and comes back through the watch: skipped.
    store.put(&format!("{PREFIX}a/x"), b"1".to_vec(), None).await.expect("written");
    assert_eq!(store.revision(), next);
    settle().await;
    assert_eq!(relayed.lock().expect("lock").len(), 1, "the watched copy is not relayed again");
    // And the watch is still followed.
    store.put(&format!("{PREFIX}b/x"), b"2".to_vec(), None).await.expect("written");
    settle().await;
    assert_eq!(mirror.read().kvs.len(), 2);
    assert_eq!(relayed.lock().expect("lock").len(), 2);
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn an_own_write_after_unseen_revisions_waits_for_them() {
    let store = MemoryStore::new();
    let mirror = Arc::new(Mirror::<Records>::load(&store, &(), "test").await.expect("loads"));
    let base = store.revision();
    // Revision base + 1 is somebody else's and not seen yet: base + 2 must wait for it,
    // or the cache would claim a revision it has not fully seen.
    mirror.offer(own_put(base + 2, "b/x", "2"));
    let (relayed, stop) = run(store.clone(), mirror.clone(), Duration::from_secs(300));
    settle().await;
    assert_eq!(mirror.read().revision, base, "held back");
    assert!(relayed.lock().expect("lock").is_empty());
    store.put(&format!("{PREFIX}a/x"), b"1".to_vec(), None).await.expect("written");
    settle().await;
    assert_eq!(mirror.read().revision, base + 2, "the watched revision, then the own write after it");
    assert_eq!(mirror.read().kvs.len(), 2);
    // An offer the cache has already passed is ignored.
    mirror.offer(own_put(base + 1, "z/x", "9"));
    settle().await;
    assert!(!mirror.read().kvs.contains_key(&format!("{PREFIX}z/x")));
    stop.cancel();
}

/// Commits a put of `key` (under the prefix) guarded by its mod revision `held`, and
/// returns its batch as the committing task has it, with the compares.
async fn commit_put(
    store: &MemoryStore,
    key: &str,
    value: &str,
    held: crate::store::Revision,
) -> (crate::store::WatchBatch, Vec<crate::store::Compare>) {
    use crate::store::{Compare, Op, Txn};
    let key = format!("{PREFIX}{key}");
    let txn = Txn::new().when(Compare::ModRevision(key.clone(), held)).then(Op::put(key, value));
    let outcome = store.txn(txn.clone()).await.expect("committed");
    assert!(outcome.succeeded);
    (super::own_batch(PREFIX, outcome.revision, &txn.ops).expect("a put"), txn.compares)
}

#[tokio::test(start_paused = true)]
async fn an_own_write_whose_compares_hold_its_keys_is_applied_ahead_of_unseen_revisions() {
    let store = MemoryStore::new();
    let mirror = Arc::new(Mirror::<Records>::load(&store, &(), "test").await.expect("loads"));
    let base = store.revision();
    // Another writer of the same store, outside the prefix: a revision the watch of the
    // prefix never delivers.
    store.put("/elsewhere/k", b"0".to_vec(), None).await.expect("written");
    let (batch, compares) = commit_put(&store, "a/x", "1", 0).await;
    assert_eq!(batch.revision, base + 2);
    // Without the compares the gap cannot be crossed: offered, nothing applied.
    assert!(mirror.apply_own_now(&(), batch.clone(), &[]).is_none());
    assert!(mirror.read().kvs.is_empty());
    let changes = mirror.apply_own_now(&(), batch, &compares).expect("applied ahead");
    assert_eq!(changes.topics(), BTreeSet::from(["a".to_string()]));
    assert_eq!(mirror.read().kvs[&format!("{PREFIX}a/x")].value, b"1");
    assert_eq!(mirror.read().revision, base, "the revision stays where the watch is");
    // A write decided from the store while the cache lags (it has not seen `b/x`
    // written): applying it ahead would delete a record the cache does not have, and
    // the watch would then bring that record back. Its compare says so: offered.
    let key = format!("{PREFIX}b/x");
    let written = store.put(&key, b"2".to_vec(), None).await.expect("written");
    let txn = crate::store::Txn::new()
        .when(crate::store::Compare::ModRevision(key.clone(), written))
        .when(crate::store::Compare::ModRevision(format!("{PREFIX}b/y"), 0))
        .then(crate::store::Op::delete(key))
        .then(crate::store::Op::put(format!("{PREFIX}b/y"), "3"));
    let outcome = store.txn(txn.clone()).await.expect("committed");
    let lagging = super::own_batch(PREFIX, outcome.revision, &txn.ops).expect("a put");
    assert!(mirror.apply_own_now(&(), lagging, &txn.compares).is_none());
    assert!(!mirror.read().kvs.contains_key(&format!("{PREFIX}b/y")));
    // The watch brings both revisions: the own write's copy changes nothing, the other is applied.
    let (relayed, stop) = run(store.clone(), mirror.clone(), Duration::from_secs(300));
    settle().await;
    assert_eq!(mirror.read().revision, store.revision());
    let keys: Vec<String> = mirror.read().kvs.keys().cloned().collect();
    assert_eq!(keys, [format!("{PREFIX}a/x"), format!("{PREFIX}b/y")]);
    let relayed = relayed.lock().expect("lock").clone();
    assert!(relayed.iter().all(|topics| !topics.contains("a")), "'a' told twice: {relayed:?}");
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_watched_revision_never_takes_a_key_back_behind_an_own_write_applied_ahead() {
    let store = MemoryStore::new();
    let mirror = Arc::new(Mirror::<Records>::load(&store, &(), "test").await.expect("loads"));
    store.put("/elsewhere/k", b"0".to_vec(), None).await.expect("written");
    let (first, compares) = commit_put(&store, "a/x", "1", 0).await;
    let (held, first_events) = (first.revision, first.events.clone());
    assert!(mirror.apply_own_now(&(), first, &compares).is_some());
    let (second, compares) = commit_put(&store, "a/x", "2", held).await;
    let second_events = second.events.clone();
    assert!(mirror.apply_own_now(&(), second, &compares).is_some(), "its compare holds the first");
    // The watch now delivers the first revision alone, then the second: the key must
    // stay at the second's record after each of them.
    for (revision, events) in [(held, first_events), (held + 1, second_events)] {
        let mut changes = super::Changes::default();
        let mut cache = mirror.cache.write().expect("lock");
        mirror.apply_revision(&mut cache, &(), revision, events, &mut changes);
        assert_eq!(cache.revision, revision);
        assert_eq!(cache.kvs[&format!("{PREFIX}a/x")].value, b"2", "taken back at {revision}");
        assert!(changes.topics().is_empty(), "nothing new to tell at {revision}");
    }
    // A re-read older than the write applied ahead would take it back as well: the
    // follower reads again until it has the write.
    assert_eq!(mirror.newest(&mirror.read()), held + 1);
}

#[test]
fn own_batches_carry_puts_and_deletes_under_the_prefix_only() {
    use crate::store::Op;
    let ops =
        [Op::put(format!("{PREFIX}a/x"), "1"), Op::delete(format!("{PREFIX}a/y")), Op::put("/other/k", "2")];
    let batch = super::own_batch(PREFIX, 7, &ops).expect("has a put");
    assert_eq!(batch.revision, 7);
    let keys: Vec<&str> = batch.events.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, [format!("{PREFIX}a/x"), format!("{PREFIX}a/y")]);
    assert_eq!(super::own_batch(PREFIX, 7, &[Op::delete(format!("{PREFIX}a/x"))]), None, "deletes alone");
}

#[tokio::test(start_paused = true)]
async fn the_periodic_resync_re_reads_without_relaying_anything_unchanged() {
    let store = MemoryStore::new();
    store.put(&format!("{PREFIX}a/x"), b"1".to_vec(), None).await.expect("written");
    let mirror = Arc::new(Mirror::<Records>::load(&store, &(), "test").await.expect("loads"));
    let (relayed, stop) = run(store.clone(), mirror.clone(), Duration::from_secs(1));
    tokio::time::sleep(Duration::from_millis(4000)).await;
    let relayed = relayed.lock().expect("lock").clone();
    assert!(relayed.len() >= 3, "three resyncs (each 1 s ± 25 %) relayed: {relayed:?}");
    assert!(relayed.iter().all(BTreeSet::is_empty), "nothing differed: {relayed:?}");
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_late_writer_of_a_batch_applied_ahead_never_takes_its_keys_back() {
    let store = MemoryStore::new();
    let mirror = Arc::new(Mirror::<Records>::load(&store, &(), "test").await.expect("loads"));
    // Somebody else's revision under the prefix, not seen yet.
    let unseen = store.put(&format!("{PREFIX}c/x"), b"0".to_vec(), None).await.expect("written");
    let (first, compares) = commit_put(&store, "a/x", "1", 0).await;
    assert!(mirror.apply_own_now(&(), first.clone(), &compares).is_some(), "applied ahead");
    let (second, compares) = commit_put(&store, "a/x", "2", first.revision).await;
    assert!(mirror.apply_own_now(&(), second, &compares).is_some(), "applied ahead");
    // The watch brings the unseen revision: the first write now follows without a gap.
    let events = vec![crate::store::WatchEvent {
        key: format!("{PREFIX}c/x"),
        revision: unseen,
        kind: crate::store::WatchEventKind::Put(crate::store::KeyValue {
            key: format!("{PREFIX}c/x"),
            value: b"0".to_vec(),
            create_revision: unseen,
            mod_revision: unseen,
            session: None,
        }),
    }];
    {
        let mut cache = mirror.cache.write().expect("lock");
        mirror.apply_revision(&mut cache, &(), unseen, events, &mut super::Changes::default());
    }
    // Another writer of the first write's batch hears its answer only now.
    let changes = mirror.apply_own_now(&(), first, &[]).expect("it follows the cache");
    assert_eq!(mirror.read().kvs[&format!("{PREFIX}a/x")].value, b"2", "taken back");
    assert!(changes.topics().is_empty(), "nothing to tell: {changes:?}");
}

/// A loop waits on its follower beside other inputs, so `next` is often dropped while the
/// watch is being opened: the call goes on, and is not made again (nor counted as a resync).
#[tokio::test(start_paused = true)]
async fn a_follower_dropped_while_its_watch_is_being_opened_opens_it_once() {
    let memory = MemoryStore::new();
    let mirror = Mirror::<Records>::load(&memory, &(), "test").await.expect("loads");
    let faulty = crate::store::FaultyStore::new(Arc::new(memory.clone()), 1);
    faulty.delay(Duration::from_millis(100), Duration::from_millis(100));
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let store = crate::store::MeteredStore::new(Arc::new(faulty), metrics.clone());
    let token = CancellationToken::new();
    let source = Source {
        store: &store,
        keys: &(),
        resync_interval: Duration::from_secs(300),
        stale_after: Duration::from_secs(3),
        shutdown: &token,
    };
    let mut follower = mirror.follower(source);
    // Other inputs of the caller win three times while the watch is being opened.
    for _ in 0..3 {
        let waited = tokio::time::timeout(Duration::from_millis(30), follower.next()).await;
        assert!(waited.is_err(), "nothing to follow yet");
    }
    let revision = memory.put(&format!("{PREFIX}a/x"), b"1".to_vec(), None).await.expect("written");
    let changes = tokio::time::timeout(Duration::from_secs(1), follower.next()).await.expect("followed");
    assert!(changes.expect("running").topics().contains("a"));
    assert_eq!(mirror.read().revision, revision);
    assert_eq!(metrics.watch_resyncs.get(), 0, "the watch was opened once");
}
