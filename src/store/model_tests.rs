//! The model against the points of the store contract (`memory.rs`'s module docs).

use super::*;

const T0: Duration = Duration::ZERO;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn put(store: &mut StoreModel, key: &str, value: &str) -> Revision {
    store.txn(T0, &Txn::new().then(Op::put(key, value))).unwrap().revision
}

#[test]
fn revisions_count_changing_writes_only() {
    let mut store = StoreModel::new();
    assert_eq!(store.revision(), 1);
    assert_eq!(put(&mut store, "a", "1"), 2);
    let both = Txn::new().then(Op::put("b", "1")).then(Op::put("c", "1"));
    assert_eq!(store.txn(T0, &both).unwrap(), TxnOutcome { succeeded: true, revision: 3 });
    // Deleting an absent key changes nothing: same revision, still a success.
    let noop = store.txn(T0, &Txn::new().then(Op::delete("zz"))).unwrap();
    assert_eq!(noop, TxnOutcome { succeeded: true, revision: 3 });
    let failed = Txn::new().when(Compare::ModRevision("a".into(), 99)).then(Op::put("a", "2"));
    assert_eq!(store.txn(T0, &failed).unwrap(), TxnOutcome { succeeded: false, revision: 3 });
    assert_eq!(store.get(T0, "a").unwrap().value, b"1");
}

#[test]
fn create_and_mod_revisions_and_compares() {
    let mut store = StoreModel::new();
    put(&mut store, "k", "1");
    put(&mut store, "k", "2");
    let kv = store.get(T0, "k").unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision), (2, 3));
    let holds = |store: &mut StoreModel, c: Compare| store.txn(T0, &Txn::new().when(c)).unwrap().succeeded;
    assert!(holds(&mut store, Compare::CreateRevision("k".into(), 2)));
    assert!(holds(&mut store, Compare::ModRevision("k".into(), 3)));
    assert!(holds(&mut store, Compare::Value("k".into(), b"2".to_vec())));
    // A missing key: create and mod revision 0, never equal on value (not even empty).
    assert!(holds(&mut store, Compare::CreateRevision("none".into(), 0)));
    assert!(holds(&mut store, Compare::ModRevision("none".into(), 0)));
    assert!(!holds(&mut store, Compare::Value("none".into(), Vec::new())));
    // Deleted and written again: a new create revision.
    store.txn(T0, &Txn::new().then(Op::delete("k"))).unwrap();
    put(&mut store, "k", "3");
    assert_eq!(store.get(T0, "k").unwrap().create_revision, 5);
}

#[test]
fn malformed_transactions_are_refused() {
    let mut store = StoreModel::new();
    let twice = Txn::new().then(Op::put("a", "1")).then(Op::delete("a"));
    assert!(matches!(store.txn(T0, &twice), Err(StoreError::Invalid(_))));
    assert!(matches!(store.txn(T0, &Txn::new().then(Op::put("", "1"))), Err(StoreError::Invalid(_))));
    let empty_compare = Txn::new().when(Compare::ModRevision(String::new(), 0));
    assert!(matches!(store.txn(T0, &empty_compare), Err(StoreError::Invalid(_))));
    assert_eq!(store.revision(), 1);
}

#[test]
fn sessions_expire_on_the_given_clock_in_one_revision() {
    let mut store = StoreModel::new();
    assert!(matches!(store.grant_session(T0, Duration::ZERO), Err(StoreError::Invalid(_))));
    let session = store.grant_session(T0, secs(10)).unwrap();
    let txn = Txn::new().then(Op::put_in("a", "1", session)).then(Op::put_in("b", "1", session));
    store.txn(T0, &txn).unwrap();
    let mut watch = store.watch("", 0).unwrap();
    assert_eq!(store.next_deadline(), Some(secs(10)));
    // Just before the deadline it lives; at the deadline it is gone, whatever asks first.
    assert!(store.get(secs(10) - Duration::from_millis(1), "a").is_some());
    assert!(store.get(secs(10), "a").is_none());
    assert!(!store.session_alive(session));
    let batches = store.poll(&mut watch).unwrap();
    assert_eq!(batches.len(), 1, "{batches:?}");
    assert_eq!(batches[0].events.len(), 2);
    assert!(batches[0].events.iter().all(|e| e.kind == WatchEventKind::Delete));
    assert!(matches!(store.keep_alive(secs(11), session), Err(StoreError::SessionExpired(_))));
}

#[test]
fn keep_alive_pushes_the_deadline_and_revoke_ends_at_once() {
    let mut store = StoreModel::new();
    let session = store.grant_session(T0, secs(3)).unwrap();
    store.txn(T0, &Txn::new().then(Op::put_in("a", "1", session))).unwrap();
    for s in (2..=20).step_by(2) {
        store.keep_alive(secs(s), session).unwrap();
    }
    assert!(store.get(secs(22), "a").is_some());
    assert!(store.get(secs(23), "a").is_none());
    let other = store.grant_session(secs(23), secs(60)).unwrap();
    store.txn(secs(23), &Txn::new().then(Op::put_in("b", "1", other))).unwrap();
    store.revoke_session(secs(24), other);
    assert!(store.get(secs(24), "b").is_none());
    // Revoking an unknown session is no error and changes nothing.
    let revision = store.revision();
    store.revoke_session(secs(24), SessionId(999));
    assert_eq!(store.revision(), revision);
}

#[test]
fn a_put_under_a_lost_session_fails_whole() {
    let mut store = StoreModel::new();
    let session = store.grant_session(T0, secs(1)).unwrap();
    let txn = Txn::new().then(Op::put("free", "1")).then(Op::put_in("bound", "1", session));
    assert!(matches!(store.txn(secs(2), &txn), Err(StoreError::SessionExpired(s)) if s == session));
    assert!(store.get(secs(2), "free").is_none());
    // Its compares failing comes first: the branch not taken does not need the session.
    let guarded = txn.clone().when(Compare::ModRevision("free".into(), 7));
    assert!(!store.txn(secs(2), &guarded).unwrap().succeeded);
}

#[test]
fn rebinding_a_key_moves_it_to_the_new_session() {
    let mut store = StoreModel::new();
    let old = store.grant_session(T0, secs(5)).unwrap();
    let new = store.grant_session(T0, secs(50)).unwrap();
    store.txn(T0, &Txn::new().then(Op::put_in("k", "1", old))).unwrap();
    store.txn(T0, &Txn::new().then(Op::put_in("k", "2", new))).unwrap();
    assert_eq!(store.get(secs(6), "k").unwrap().session, Some(new));
    store.txn(secs(6), &Txn::new().then(Op::put("k", "3"))).unwrap();
    store.revoke_session(secs(7), new);
    assert_eq!(store.get(secs(7), "k").unwrap().value, b"3", "an unbound record outlives sessions");
}

#[test]
fn prefix_reads_are_in_key_order_at_one_revision() {
    let mut store = StoreModel::new();
    for key in ["p/b", "p/a", "q/a", "p/c"] {
        put(&mut store, key, "v");
    }
    let snapshot = store.get_prefix(T0, "p/");
    let keys: Vec<&str> = snapshot.kvs.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["p/a", "p/b", "p/c"]);
    assert_eq!(snapshot.revision, 5);
}

#[test]
fn watches_get_whole_revisions_under_their_prefix_in_order() {
    let mut store = StoreModel::new();
    put(&mut store, "p/old", "1"); // 2
    let mut from_start = store.watch("p/", 2).unwrap();
    let mut from_next = store.watch("p/", 0).unwrap();
    assert_eq!(from_next.next, 3);
    let txn = Txn::new().then(Op::put("p/a", "1")).then(Op::put("q/x", "1")).then(Op::put("p/b", "1"));
    store.txn(T0, &txn).unwrap(); // 3
    put(&mut store, "q/y", "1"); // 4: nothing under p/
    store.txn(T0, &Txn::new().then(Op::delete("p/a"))).unwrap(); // 5
    let all = store.poll(&mut from_start).unwrap();
    assert_eq!(all.iter().map(|b| b.revision).collect::<Vec<_>>(), [2, 3, 5]);
    let keys: Vec<&str> = all[1].events.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["p/a", "p/b"], "op order, other prefixes left out");
    assert_eq!(all[2].events[0].kind, WatchEventKind::Delete);
    assert_eq!(store.poll(&mut from_next).unwrap().len(), 2);
    assert!(store.poll(&mut from_start).unwrap().is_empty(), "nothing is handed twice");
    // A watch from the future gets nothing until the store gets there.
    let mut future = store.watch("", 7).unwrap();
    put(&mut store, "x", "1"); // 6
    assert!(store.poll(&mut future).unwrap().is_empty());
    put(&mut store, "x", "2"); // 7
    assert_eq!(store.poll(&mut future).unwrap()[0].revision, 7);
}

#[test]
fn compaction_fails_watches_from_older_revisions() {
    let mut store = StoreModel::new();
    for value in ["1", "2", "3", "4"] {
        put(&mut store, "k", value); // 2..=5
    }
    let mut lagging = store.watch("", 2).unwrap();
    assert!(matches!(store.compact(9), Err(StoreError::Invalid(_))));
    store.compact(4).unwrap();
    assert_eq!(store.compacted_revision(), 4);
    assert!(matches!(store.watch("", 3), Err(StoreError::Compacted { requested: 3, compacted: 4 })));
    assert!(matches!(store.poll(&mut lagging), Err(StoreError::Compacted { requested: 2, compacted: 4 })));
    let mut kept = store.watch("", 4).unwrap();
    assert_eq!(store.poll(&mut kept).unwrap().iter().map(|b| b.revision).collect::<Vec<_>>(), [4, 5]);
    // Records are untouched by compaction.
    assert_eq!(store.get(T0, "k").unwrap().value, b"4");
}

#[test]
fn history_limit_compacts_whole_revisions() {
    let mut store = StoreModel::with_history_limit(3);
    put(&mut store, "a", "1"); // 2
    store.txn(T0, &Txn::new().then(Op::put("b", "1")).then(Op::put("c", "1"))).unwrap(); // 3
    put(&mut store, "d", "1"); // 4: history [b@3, c@3, d@4]
    assert_eq!(store.compacted_revision(), 3);
    put(&mut store, "e", "1"); // 5: b@3 dropped, so c@3 too
    assert_eq!(store.compacted_revision(), 4);
    assert!(matches!(store.watch("", 3), Err(StoreError::Compacted { requested: 3, compacted: 4 })));
    let mut watch = store.watch("", 4).unwrap();
    let batches = store.poll(&mut watch).unwrap();
    assert_eq!(batches.iter().map(|b| b.events[0].key.as_str()).collect::<Vec<_>>(), ["d", "e"]);
}

#[test]
fn a_new_leader_renews_every_session_even_past_its_deadline() {
    let mut store = StoreModel::new();
    let session = store.grant_session(T0, secs(2)).unwrap();
    store.txn(T0, &Txn::new().then(Op::put_in("a", "1", session))).unwrap();
    // The store was out from 1 s to 5 s: nothing asked it, so nothing expired.
    store.renew_all_sessions(secs(5));
    assert!(store.get(secs(6), "a").is_some());
    assert!(store.get(secs(7), "a").is_none());
}
