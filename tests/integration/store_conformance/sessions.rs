//! Session scenarios of the conformance suite: records bound to a session go when it is
//! revoked or expires (in one revision), and stay while it is kept alive.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use kafka_assigner::store::{Compare, Op, SessionId, StoreError, Txn};

use super::{EXPIRY_DEADLINE, SHORT_TTL, Store, get, next_event, revision, summary, watch};
use crate::support::wait_until;

pub(super) async fn revoked_session_deletes_its_records(store: Store, prefix: &str, _exclusive: bool) {
    let session = store.grant_session(Duration::from_secs(30)).await.unwrap();
    let other = store.grant_session(Duration::from_secs(30)).await.unwrap();
    let (a, b, durable, others) =
        (format!("{prefix}a"), format!("{prefix}b"), format!("{prefix}durable"), format!("{prefix}others"));
    store.put(&a, b"1".to_vec(), Some(session)).await.unwrap();
    let last = store
        .txn(Txn::new().then(Op::put_in(b.clone(), "1", session)).then(Op::put(durable.clone(), "1")))
        .await;
    let last = last.unwrap().revision;
    store.put(&others, b"1".to_vec(), Some(other)).await.unwrap();
    assert_eq!(get(&store, &a).await.unwrap().session, Some(session));
    let mut events = watch(&store, prefix, last + 1).await;

    store.revoke_session(session).await.unwrap();
    // Revocation is synchronous: the records are gone when it returns.
    assert_eq!(get(&store, &a).await, None);
    assert_eq!(get(&store, &b).await, None);
    assert!(get(&store, &durable).await.is_some(), "unbound record must stay");
    assert!(get(&store, &others).await.is_some(), "another session's record must stay");

    next_event(&mut events, "the others put").await;
    let revocation = events.next_batch("the revocation's deletes, in one batch").await;
    assert_eq!(revocation.events.len(), 2, "{revocation:?}");
    let first = summary(&revocation.events[0]);
    let second = summary(&revocation.events[1]);
    assert_eq!(first.1, second.1, "a session's records go in one revision");
    assert_eq!(BTreeSet::from([first.0, second.0]), BTreeSet::from([a.clone(), b.clone()]));
    assert_eq!((first.2, second.2), (None, None));

    // Revoking again, or a session that never existed, is fine.
    store.revoke_session(session).await.unwrap();
    store.revoke_session(SessionId(0x7eed_beef)).await.unwrap();

    assert!(matches!(store.keep_alive(session).await, Err(StoreError::SessionExpired(s)) if s == session));
    let put = store.put(&a, b"2".to_vec(), Some(session)).await;
    assert!(
        matches!(put, Err(StoreError::SessionExpired(s)) if s == session),
        "put to a revoked session: {put:?}"
    );
    let txn = Txn::new().then(Op::put(format!("{prefix}c"), "1")).then(Op::put_in(a.clone(), "2", session));
    assert!(matches!(store.txn(txn).await, Err(StoreError::SessionExpired(_))));
    assert_eq!(get(&store, &a).await, None, "a failed put wrote");
    assert_eq!(get(&store, &format!("{prefix}c")).await, None, "a failed txn applied part of its ops");
    // A txn whose compares fail never looks at its sessions (etcd checks the branch taken).
    let skipped =
        Txn::new().when(Compare::ModRevision(durable.clone(), 0)).then(Op::put_in(a.clone(), "2", session));
    assert!(!store.txn(skipped).await.unwrap().succeeded);
    // The other session still works.
    store.keep_alive(other).await.unwrap();
    store.revoke_session(other).await.unwrap();
    assert_eq!(get(&store, &others).await, None);
}

pub(super) async fn expired_session_deletes_its_records(store: Store, prefix: &str, _exclusive: bool) {
    let key = format!("{prefix}ephemeral");
    let durable = format!("{prefix}durable");
    let session = store.grant_session(SHORT_TTL).await.unwrap();
    let granted = Instant::now();
    store.put(&key, b"1".to_vec(), Some(session)).await.unwrap();
    store.put(&durable, b"1".to_vec(), None).await.unwrap();
    let from = revision(&store, prefix).await + 1;
    let mut events = watch(&store, prefix, from).await;

    let expiry = next_event(&mut events, "the expiry delete").await;
    assert_eq!(summary(&expiry), (key.clone(), expiry.revision, None));
    assert!(
        granted.elapsed() >= SHORT_TTL - Duration::from_millis(50),
        "expired after {:?}, before its TTL",
        granted.elapsed()
    );
    assert_eq!(get(&store, &key).await, None);
    assert!(get(&store, &durable).await.is_some());

    let kept = store.keep_alive(session).await;
    assert!(
        matches!(kept, Err(StoreError::SessionExpired(s)) if s == session),
        "keep-alive after expiry: {kept:?}"
    );
    let put = store.put(&key, b"2".to_vec(), Some(session)).await;
    assert!(matches!(put, Err(StoreError::SessionExpired(_))), "put to an expired session: {put:?}");
    store.revoke_session(session).await.unwrap();
}

pub(super) async fn kept_alive_session_keeps_its_records(store: Store, prefix: &str, _exclusive: bool) {
    let key = format!("{prefix}kept");
    let session = store.grant_session(SHORT_TTL).await.unwrap();
    store.put(&key, b"1".to_vec(), Some(session)).await.unwrap();
    let until = Instant::now() + SHORT_TTL * 3;
    while Instant::now() < until {
        store.keep_alive(session).await.unwrap();
        assert!(get(&store, &key).await.is_some(), "record vanished while its session was kept alive");
        tokio::time::sleep(SHORT_TTL / 5).await;
    }
    // Stop keeping it alive: now it goes.
    wait_until(EXPIRY_DEADLINE, "the record is gone once keep-alives stop", || async {
        get(&store, &key).await.is_none()
    })
    .await;
}
