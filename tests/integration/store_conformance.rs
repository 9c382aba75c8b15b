//! The `LeaseStore` conformance suite: every scenario runs against `MemoryStore` and against
//! `EtcdStore` on a real etcd (`store_conformance::memory::*`, `store_conformance::etcd::*`).
//! A few etcd-only tests (connection failures, dead endpoints, outages) follow.
//!
//! Each scenario is `async fn(store, prefix, exclusive)`. Scenarios work under a unique key
//! prefix and compare revisions they produced themselves, so they also pass against a shared
//! cluster (`ETCD_ENDPOINTS`); `exclusive` (nobody else writes to the store, so the global
//! revision moves only with our writes) enables the exact revision checks.

mod events;
mod sessions;
mod single;
mod watches;

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use kafka_assigner::store::{Compare, KeyValue, LeaseStore, Op, Revision, Txn, WatchEvent, WatchEventKind};
use tokio::sync::Barrier;

use self::events::{next_event, watch};
use self::sessions::{
    expired_session_deletes_its_records, kept_alive_session_keeps_its_records,
    revoked_session_deletes_its_records,
};
use self::watches::{
    revisions_arrive_whole_under_concurrent_writers, session_ends_arrive_whole,
    watch_delivers_every_event_live_and_replayed, watch_from_compacted_revision_fails,
    watch_from_now_or_the_future_skips_earlier_events,
};

/// Generous bound for anything that should be prompt (a watch event, a read).
const PROMPT: Duration = Duration::from_secs(5);
/// Session TTL for expiry scenarios (etcd TTLs are whole seconds).
const SHORT_TTL: Duration = Duration::from_secs(1);
/// Bound for a 1 s session to be gone: etcd checks expiry every 500 ms, plus slack.
const EXPIRY_DEADLINE: Duration = Duration::from_secs(6);

type Store = Arc<dyn LeaseStore>;

/// Generates `memory::$name` and `etcd::$name` tests running the scenario `$name`.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let store: super::Store = std::sync::Arc::new(kafka_assigner::store::MemoryStore::new());
                    super::$name(store, concat!("/conformance/", stringify!($name), "/"), true).await;
                }
            )*
        }

        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let server = crate::support::EtcdServer::start().await;
                    let store: super::Store = std::sync::Arc::new(server.store().await);
                    super::$name(store, &server.unique_prefix(stringify!($name)), !server.is_shared()).await;
                }
            )*
        }
    };
}

conformance!(
    put_get_delete,
    get_prefix_is_scoped_and_ordered,
    cas_succeeds_on_each_compare,
    failed_cas_changes_nothing,
    multi_op_txn_is_atomic_at_one_revision,
    revoked_session_deletes_its_records,
    expired_session_deletes_its_records,
    kept_alive_session_keeps_its_records,
    watch_delivers_every_event_live_and_replayed,
    watch_from_compacted_revision_fails,
    watch_from_now_or_the_future_skips_earlier_events,
    concurrent_cas_has_one_winner_per_round,
    revisions_arrive_whole_under_concurrent_writers,
    session_ends_arrive_whole,
);

async fn get(store: &Store, key: &str) -> Option<KeyValue> {
    store.get(key).await.unwrap_or_else(|e| panic!("get {key}: {e}"))
}

async fn put(store: &Store, key: &str, value: &str) -> Revision {
    store.put(key, value.as_bytes().to_vec(), None).await.unwrap_or_else(|e| panic!("put {key}: {e}"))
}

async fn revision(store: &Store, prefix: &str) -> Revision {
    store.get_prefix(prefix).await.unwrap().revision
}

/// The event we expect: `Some(value)` for a put, `None` for a delete.
fn summary(event: &WatchEvent) -> (String, Revision, Option<Vec<u8>>) {
    let value = match &event.kind {
        WatchEventKind::Put(kv) => {
            assert_eq!(
                (kv.key.as_str(), kv.mod_revision),
                (event.key.as_str(), event.revision),
                "put event record"
            );
            Some(kv.value.clone())
        }
        WatchEventKind::Delete => None,
    };
    (event.key.clone(), event.revision, value)
}

async fn put_get_delete(store: Store, prefix: &str, exclusive: bool) {
    let key = format!("{prefix}k");
    let start = revision(&store, prefix).await;
    assert!(start >= 1, "revisions start at 1");
    assert_eq!(get(&store, &key).await, None);

    let r1 = put(&store, &key, "v1").await;
    assert!(r1 > start);
    let kv = get(&store, &key).await.expect("written");
    assert_eq!(
        kv,
        KeyValue {
            key: key.clone(),
            value: b"v1".to_vec(),
            create_revision: r1,
            mod_revision: r1,
            session: None
        }
    );

    let r2 = put(&store, &key, "v2").await;
    assert!(r2 > r1);
    let kv = get(&store, &key).await.expect("rewritten");
    assert_eq!((kv.value.as_slice(), kv.create_revision, kv.mod_revision), (&b"v2"[..], r1, r2));

    let r3 = store.delete(&key).await.unwrap();
    assert!(r3 > r2);
    assert_eq!(get(&store, &key).await, None);

    // Deleting what is absent changes nothing.
    let r4 = store.delete(&key).await.unwrap();
    if exclusive {
        assert_eq!(r4, r3, "a no-op delete must not create a revision");
    } else {
        assert!(r4 >= r3);
    }

    // Re-created: a new create revision.
    let r5 = put(&store, &key, "v3").await;
    let kv = get(&store, &key).await.expect("re-created");
    assert_eq!((kv.create_revision, kv.mod_revision), (r5, r5));
    if exclusive {
        assert_eq!((r1, r2, r3, r5), (start + 1, start + 2, start + 3, start + 4), "one revision per write");
    }
}

async fn get_prefix_is_scoped_and_ordered(store: Store, prefix: &str, exclusive: bool) {
    let inside = ["list/b", "list/a", "list/c", "list/a/deep"];
    let outside = ["list0", "lis", "lisu", "other/list/a"];
    let mut last = 0;
    for name in inside.iter().chain(&outside) {
        last = put(&store, &format!("{prefix}{name}"), name).await;
    }
    let snapshot = store.get_prefix(&format!("{prefix}list/")).await.unwrap();
    let keys: Vec<&str> = snapshot.kvs.iter().map(|kv| kv.key.strip_prefix(prefix).unwrap()).collect();
    assert_eq!(keys, ["list/a", "list/a/deep", "list/b", "list/c"]);
    for kv in &snapshot.kvs {
        assert_eq!(kv.value, kv.key.strip_prefix(prefix).unwrap().as_bytes());
        assert!(kv.mod_revision <= snapshot.revision);
    }
    assert!(
        snapshot.revision >= last,
        "snapshot revision {} predates the last write {last}",
        snapshot.revision
    );
    if exclusive {
        assert_eq!(snapshot.revision, last);
    }

    let empty = store.get_prefix(&format!("{prefix}nothing/")).await.unwrap();
    assert!(empty.kvs.is_empty());
    assert!(empty.revision >= last);

    let everything = store.get_prefix(prefix).await.unwrap();
    assert_eq!(everything.kvs.len(), inside.len() + outside.len());
    assert!(everything.kvs.windows(2).all(|w| w[0].key < w[1].key), "key order");
}

async fn cas_succeeds_on_each_compare(store: Store, prefix: &str, _exclusive: bool) {
    let key = format!("{prefix}cas");
    let create_if_absent =
        || Txn::new().when(Compare::ModRevision(key.clone(), 0)).then(Op::put(key.clone(), "first"));

    let created = store.txn(create_if_absent()).await.unwrap();
    assert!(created.succeeded);
    let kv = get(&store, &key).await.unwrap();
    assert_eq!((kv.value.as_slice(), kv.mod_revision), (&b"first"[..], created.revision));
    let again = store.txn(create_if_absent()).await.unwrap();
    assert!(!again.succeeded, "mod revision 0 means absent");
    assert!(again.revision >= created.revision);

    let other = format!("{prefix}other");
    let outcome = store
        .txn(Txn::new().when(Compare::CreateRevision(other.clone(), 0)).then(Op::put(other.clone(), "x")))
        .await
        .unwrap();
    assert!(outcome.succeeded, "create revision 0 means absent");

    let by_mod = store
        .txn(
            Txn::new()
                .when(Compare::ModRevision(key.clone(), kv.mod_revision))
                .then(Op::put(key.clone(), "second")),
        )
        .await
        .unwrap();
    assert!(by_mod.succeeded);
    assert!(by_mod.revision > outcome.revision);

    let by_create = store
        .txn(
            Txn::new()
                .when(Compare::CreateRevision(key.clone(), kv.create_revision))
                .then(Op::put(key.clone(), "third")),
        )
        .await
        .unwrap();
    assert!(by_create.succeeded, "create revision survives rewrites");

    let by_value = store
        .txn(Txn::new().when(Compare::Value(key.clone(), b"third".to_vec())).then(Op::delete(key.clone())))
        .await
        .unwrap();
    assert!(by_value.succeeded);
    assert_eq!(get(&store, &key).await, None);

    // All compares together.
    let both = store
        .txn(
            Txn::new()
                .when(Compare::ModRevision(key.clone(), 0))
                .when(Compare::Value(other.clone(), b"x".to_vec()))
                .then(Op::put(key.clone(), "fourth")),
        )
        .await
        .unwrap();
    assert!(both.succeeded);
    assert_eq!(get(&store, &key).await.unwrap().value, b"fourth");
}

async fn failed_cas_changes_nothing(store: Store, prefix: &str, exclusive: bool) {
    let a = format!("{prefix}a");
    let b = format!("{prefix}b");
    let absent = format!("{prefix}absent");
    put(&store, &a, "1").await;
    put(&store, &b, "1").await;
    let before = store.get_prefix(prefix).await.unwrap();
    let kv_a = before.kvs[0].clone();
    let mut events = watch(&store, prefix, before.revision + 1).await;

    let ops = |txn: Txn| {
        txn.then(Op::put(a.clone(), "changed"))
            .then(Op::delete(b.clone()))
            .then(Op::put(absent.clone(), "new"))
    };
    let failing = [
        ("stale mod revision", Txn::new().when(Compare::ModRevision(a.clone(), kv_a.mod_revision + 100))),
        ("mod revision 0 on an existing key", Txn::new().when(Compare::ModRevision(a.clone(), 0))),
        (
            "wrong create revision",
            Txn::new().when(Compare::CreateRevision(a.clone(), kv_a.create_revision - 1)),
        ),
        ("create revision 0 on an existing key", Txn::new().when(Compare::CreateRevision(a.clone(), 0))),
        ("wrong value", Txn::new().when(Compare::Value(a.clone(), b"2".to_vec()))),
        ("value of an absent key", Txn::new().when(Compare::Value(absent.clone(), Vec::new()))),
        (
            "absent key has a revision",
            Txn::new().when(Compare::ModRevision(absent.clone(), kv_a.mod_revision)),
        ),
        (
            "one of two compares fails",
            Txn::new()
                .when(Compare::Value(a.clone(), b"1".to_vec()))
                .when(Compare::ModRevision(b.clone(), 0)),
        ),
    ];
    for (what, txn) in failing {
        let outcome = store.txn(ops(txn)).await.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(!outcome.succeeded, "{what}: must fail");
        if exclusive {
            assert_eq!(outcome.revision, before.revision, "{what}: a failed txn must not create a revision");
        } else {
            assert!(outcome.revision >= before.revision);
        }
    }

    let after = store.get_prefix(prefix).await.unwrap();
    assert_eq!(after.kvs, before.kvs, "failed transactions changed records");
    if exclusive {
        assert_eq!(after.revision, before.revision);
    }
    // No event was produced: the first one is our marker.
    let marker = put(&store, &format!("{prefix}marker"), "m").await;
    let first = next_event(&mut events, "the marker").await;
    assert_eq!((first.key.as_str(), first.revision), (format!("{prefix}marker").as_str(), marker));
}

async fn multi_op_txn_is_atomic_at_one_revision(store: Store, prefix: &str, exclusive: bool) {
    let keys: Vec<String> = (0..4).map(|i| format!("{prefix}multi/{i}")).collect();
    let gone = format!("{prefix}multi/gone");
    put(&store, &gone, "x").await;
    let start = revision(&store, prefix).await;
    let mut events = watch(&store, prefix, start + 1).await;

    let txn = keys.iter().fold(Txn::new().when(Compare::Value(gone.clone(), b"x".to_vec())), |txn, key| {
        txn.then(Op::put(key.clone(), "v0"))
    });
    let outcome = store.txn(txn.then(Op::delete(gone.clone()))).await.unwrap();
    assert!(outcome.succeeded);
    if exclusive {
        assert_eq!(outcome.revision, start + 1, "one revision for the whole txn");
    }
    for key in &keys {
        let kv = get(&store, key).await.unwrap();
        assert_eq!((kv.create_revision, kv.mod_revision), (outcome.revision, outcome.revision));
    }
    assert_eq!(get(&store, &gone).await, None);
    let batch = events.next_batch("the txn's events").await;
    assert_eq!(batch.revision, outcome.revision);
    let seen: Vec<_> = batch.events.iter().map(summary).collect();
    let mut expected: Vec<_> =
        keys.iter().map(|k| (k.clone(), outcome.revision, Some(b"v0".to_vec()))).collect();
    expected.push((gone.clone(), outcome.revision, None));
    assert_eq!(seen, expected, "events of one txn: one revision, in op order");

    // Readers never see half a transaction.
    let writer = {
        let store = store.clone();
        let keys = keys.clone();
        tokio::spawn(async move {
            for round in 1..=30 {
                let value = format!("v{round}");
                let txn =
                    keys.iter().fold(Txn::new(), |txn, key| txn.then(Op::put(key.clone(), value.clone())));
                assert!(store.txn(txn).await.unwrap().succeeded);
            }
        })
    };
    let multi = format!("{prefix}multi/");
    let mut reads = 0;
    while !writer.is_finished() || reads == 0 {
        let snapshot = store.get_prefix(&multi).await.unwrap();
        let values: BTreeSet<&[u8]> = snapshot.kvs.iter().map(|kv| kv.value.as_slice()).collect();
        let revisions: BTreeSet<Revision> = snapshot.kvs.iter().map(|kv| kv.mod_revision).collect();
        assert_eq!(snapshot.kvs.len(), keys.len());
        assert_eq!((values.len(), revisions.len()), (1, 1), "torn read: {:?}", snapshot.kvs);
        reads += 1;
    }
    writer.await.unwrap();
}

async fn concurrent_cas_has_one_winner_per_round(store: Store, prefix: &str, _exclusive: bool) {
    const TASKS: usize = 16;
    const ROUNDS: usize = 8;
    let key = format!("{prefix}contended");
    put(&store, &key, "start").await;
    let barrier = Arc::new(Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (store, key, barrier) = (store.clone(), key.clone(), barrier.clone());
            tokio::spawn(async move {
                let mut wins = Vec::new();
                for round in 0..ROUNDS {
                    // Everyone reads before anyone writes, so everyone holds the same revision.
                    barrier.wait().await;
                    let seen = store.get(&key).await.unwrap().unwrap();
                    barrier.wait().await;
                    let txn = Txn::new()
                        .when(Compare::ModRevision(key.clone(), seen.mod_revision))
                        .then(Op::put(key.clone(), format!("{round}:{task}")));
                    wins.push(store.txn(txn).await.unwrap().succeeded);
                }
                wins
            })
        })
        .collect();
    let mut winners = vec![Vec::new(); ROUNDS];
    for (task, handle) in tasks.into_iter().enumerate() {
        for (round, won) in handle.await.unwrap().into_iter().enumerate() {
            if won {
                winners[round].push(task);
            }
        }
    }
    for (round, round_winners) in winners.iter().enumerate() {
        assert_eq!(round_winners.len(), 1, "round {round}: winners {round_winners:?}");
    }
    let last = winners[ROUNDS - 1][0];
    assert_eq!(get(&store, &key).await.unwrap().value, format!("{}:{last}", ROUNDS - 1).into_bytes());
}
