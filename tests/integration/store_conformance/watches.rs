//! Watch scenarios of the conformance suite: every event, live and replayed, compaction,
//! start revisions, and whole revisions (a transaction's or a session end's events arrive
//! as one batch, even with writers racing and a reader watching).

use std::{collections::BTreeSet, time::Duration};

use kafka_assigner::store::{Op, Revision, StoreError, Txn, WatchEventKind};

use super::{PROMPT, SHORT_TTL, Store, next_event, put, summary, watch};
use crate::support::next_within;

pub(super) async fn watch_delivers_every_event_live_and_replayed(
    store: Store,
    prefix: &str,
    _exclusive: bool,
) {
    let key = |name: &str| format!("{prefix}{name}");
    let start = store.get_prefix(prefix).await.unwrap();
    let mut live = watch(&store, prefix, start.revision + 1).await;
    // Outside the prefix: never seen.
    store.put(&format!("{}-sibling", prefix.trim_end_matches('/')), b"x".to_vec(), None).await.unwrap();

    let session = store.grant_session(Duration::from_secs(30)).await.unwrap();
    let short = store.grant_session(SHORT_TTL).await.unwrap();
    let mut expected = Vec::new();
    let r = put(&store, &key("a"), "1").await;
    expected.push((key("a"), r, Some(b"1".to_vec())));
    let r = store.put(&key("b"), b"2".to_vec(), Some(session)).await.unwrap();
    expected.push((key("b"), r, Some(b"2".to_vec())));
    let r = put(&store, &key("a"), "3").await;
    expected.push((key("a"), r, Some(b"3".to_vec())));
    let r = store.delete(&key("a")).await.unwrap();
    expected.push((key("a"), r, None));
    let r = store
        .txn(Txn::new().then(Op::put(key("c"), "4")).then(Op::put(key("d"), "5")))
        .await
        .unwrap()
        .revision;
    expected.push((key("c"), r, Some(b"4".to_vec())));
    expected.push((key("d"), r, Some(b"5".to_vec())));
    store.revoke_session(session).await.unwrap();
    // The revocation's revision is not returned: take it from the event below.
    let r = store.put(&key("e"), b"6".to_vec(), Some(short)).await.unwrap();

    let mut seen = Vec::new();
    while seen.len() < expected.len() + 2 {
        seen.push(next_event(&mut live, "live events").await);
    }
    let revoked = seen[expected.len()].clone();
    assert_eq!(summary(&revoked), (key("b"), revoked.revision, None), "revocation delete");
    assert!(revoked.revision > expected.last().unwrap().1 && revoked.revision < r);
    expected.push((key("b"), revoked.revision, None));
    expected.push((key("e"), r, Some(b"6".to_vec())));

    // Then the short session expires on its own; then one more write.
    let expiry = next_event(&mut live, "the session-expiry delete").await;
    assert_eq!(summary(&expiry), (key("e"), expiry.revision, None));
    assert!(expiry.revision > r);
    expected.push((key("e"), expiry.revision, None));
    seen.push(expiry);
    let r = put(&store, &key("f"), "7").await;
    expected.push((key("f"), r, Some(b"7".to_vec())));
    seen.push(next_event(&mut live, "the last put").await);

    let summaries: Vec<_> = seen.iter().map(summary).collect();
    assert_eq!(summaries, expected, "live events");
    assert!(seen.windows(2).all(|w| w[0].revision <= w[1].revision), "revision order");
    if let WatchEventKind::Put(kv) = &seen[1].kind {
        assert_eq!(kv.session, Some(session), "a put event carries its session");
    }

    // Replay from the first of our revisions: the same events, in the same order, then live.
    let mut replay = watch(&store, prefix, expected[0].1).await;
    let mut replayed = Vec::new();
    while replayed.len() < seen.len() {
        replayed.push(next_event(&mut replay, "replayed events").await);
    }
    assert_eq!(replayed, seen, "replay differs from the live events");
    // Replay from the middle: exactly the tail.
    let middle = seen[3].revision;
    let mut tail = watch(&store, prefix, middle).await;
    for event in seen.iter().filter(|e| e.revision >= middle) {
        assert_eq!(&next_event(&mut tail, "the tail").await, event);
    }
    let r = put(&store, &key("g"), "8").await;
    for stream in [&mut live, &mut replay, &mut tail] {
        let event = next_event(stream, "a live event after the replay").await;
        assert_eq!((event.key.as_str(), event.revision), (key("g").as_str(), r));
    }
}

pub(super) async fn watch_from_compacted_revision_fails(store: Store, prefix: &str, exclusive: bool) {
    if !exclusive {
        // Compaction is cluster-wide: on a shared cluster it would break other tests' replays.
        eprintln!("NOT RUN on a shared ETCD_ENDPOINTS cluster: compaction would disturb other tests");
        return;
    }
    let mut revisions = Vec::new();
    for i in 0..5 {
        revisions.push(put(&store, &format!("{prefix}k{i}"), "v").await);
    }
    let at = revisions[2];
    store.compact(at).await.unwrap();
    // Compacting the same or an older revision again is not an error.
    store.compact(at).await.unwrap();
    store.compact(revisions[0]).await.unwrap();
    // Compacting the future is.
    let future = store.compact(revisions[4] + 1_000_000).await;
    assert!(matches!(future, Err(StoreError::Invalid(_))), "compact in the future: {future:?}");

    // Too old: an error, at once or as the first item.
    let failure = match store.watch_prefix(prefix, revisions[0]).await {
        Err(error) => error,
        Ok(mut stream) => match next_within(&mut stream, PROMPT, "the compaction error").await {
            Err(error) => error,
            Ok(batch) => panic!("watch from a compacted revision yielded {batch:?}"),
        },
    };
    match failure {
        StoreError::Compacted { requested, compacted } => {
            assert_eq!(requested, revisions[0]);
            assert!(compacted >= at, "compacted revision {compacted} < {at}");
        }
        other => panic!("expected Compacted, got {other:?}"),
    }

    // From the compaction revision on, history is still there.
    let mut stream = watch(&store, prefix, at + 1).await;
    for (i, rev) in revisions.iter().enumerate().skip(3) {
        let event = next_event(&mut stream, "history after the compaction").await;
        assert_eq!((event.key, event.revision), (format!("{prefix}k{i}"), *rev));
    }
    // Current records are untouched.
    assert_eq!(store.get_prefix(prefix).await.unwrap().kvs.len(), 5);
}

pub(super) async fn watch_from_now_or_the_future_skips_earlier_events(
    store: Store,
    prefix: &str,
    _exclusive: bool,
) {
    let key = |i: usize| format!("{prefix}k{i}");
    put(&store, &key(0), "before").await;
    // Revision 0: from the next revision on.
    let mut from_now = watch(&store, prefix, 0).await;
    let r1 = put(&store, &key(1), "1").await;
    // A start in the future: nothing before it.
    let mut from_future = watch(&store, prefix, r1 + 3).await;
    let mut revisions = vec![r1];
    for i in 2..=5 {
        revisions.push(put(&store, &key(i), "v").await);
    }
    for (i, rev) in revisions.iter().enumerate() {
        let event = next_event(&mut from_now, "events from now").await;
        assert_eq!((event.key, event.revision), (key(i + 1), *rev));
    }
    for (i, rev) in revisions.iter().enumerate().filter(|(_, rev)| **rev >= r1 + 3) {
        let event = next_event(&mut from_future, "events from the future start").await;
        assert_eq!((event.key, event.revision), (key(i + 1), *rev));
    }
}

/// Writers racing with multi-key transactions (each also touching a shared sub-prefix)
/// while a reader follows the watch: every revision arrives as one batch holding exactly the
/// transaction's ops under the watched prefix, in op order, live, replayed, and on a
/// narrower prefix.
pub(super) async fn revisions_arrive_whole_under_concurrent_writers(
    store: Store,
    prefix: &str,
    _exclusive: bool,
) {
    const WRITERS: usize = 4;
    const TXNS: usize = 20;
    let start = store.get_prefix(prefix).await.unwrap().revision;
    let live = watch(&store, prefix, start + 1).await;
    let narrow_prefix = format!("{prefix}w0/");
    let narrow = watch(&store, &narrow_prefix, start + 1).await;
    // The reader runs while the writers write, and keeps every batch it saw.
    let reader = tokio::spawn(async move {
        let mut live = live;
        let mut batches = Vec::new();
        while batches.len() < WRITERS * TXNS {
            batches.push(live.next_batch("a writer's revision").await);
        }
        batches
    });
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (store, prefix) = (store.clone(), prefix.to_string());
            tokio::spawn(async move {
                let mut written = Vec::new();
                for round in 0..TXNS {
                    // Five keys of its own, a delete from round 1 on, and one shared key.
                    let mut keys: Vec<String> = (0..5).map(|k| format!("{prefix}w{w}/k{k}")).collect();
                    let mut txn = keys
                        .iter()
                        .fold(Txn::new(), |txn, key| txn.then(Op::put(key.clone(), round.to_string())));
                    if round > 0 {
                        let gone = format!("{prefix}w{w}/gone{}", round - 1);
                        txn = txn.then(Op::delete(gone.clone()));
                        keys.push(gone);
                    }
                    let marker = format!("{prefix}w{w}/gone{round}");
                    let shared = format!("{prefix}shared/w{w}");
                    txn = txn
                        .then(Op::put(marker.clone(), "x"))
                        .then(Op::put(shared.clone(), round.to_string()));
                    keys.extend([marker, shared]);
                    let outcome = store.txn(txn).await.unwrap();
                    assert!(outcome.succeeded);
                    written.push((outcome.revision, keys));
                }
                written
            })
        })
        .collect();
    let mut expected = Vec::new();
    for writer in writers {
        expected.extend(writer.await.unwrap());
    }
    expected.sort();
    let seen = reader.await.unwrap();
    let keys_of = |batch: &kafka_assigner::store::WatchBatch| -> (Revision, Vec<String>) {
        (batch.revision, batch.events.iter().map(|e| e.key.clone()).collect())
    };
    let seen_keys: Vec<_> = seen.iter().map(keys_of).collect();
    assert_eq!(seen_keys, expected, "live: one batch per transaction, whole, in op order");

    // The narrow watch: writer 0's part of each of its transactions, as one batch each.
    let mut narrow = narrow;
    for (revision, keys) in expected.iter().filter(|(_, keys)| keys[0].starts_with(&narrow_prefix)) {
        let batch = narrow.next_batch("writer 0's revision on the narrow watch").await;
        let mine: Vec<String> = keys.iter().filter(|k| k.starts_with(&narrow_prefix)).cloned().collect();
        assert_eq!(keys_of(&batch), (*revision, mine));
    }

    // Replayed (etcd sends many revisions per response then): the same batches.
    let mut replay = watch(&store, prefix, start + 1).await;
    for expected_batch in &seen {
        assert_eq!(&replay.next_batch("a replayed revision").await, expected_batch);
    }
}

/// A revoked session's records, and an expired session's, go in one batch each.
pub(super) async fn session_ends_arrive_whole(store: Store, prefix: &str, _exclusive: bool) {
    let revoked = store.grant_session(Duration::from_secs(30)).await.unwrap();
    let expiring = store.grant_session(SHORT_TTL).await.unwrap();
    let keys = |session, names: &[&str]| {
        let keys: Vec<String> = names.iter().map(|n| format!("{prefix}{n}")).collect();
        let txn = keys.iter().fold(Txn::new(), |txn, key| txn.then(Op::put_in(key.clone(), "v", session)));
        (keys, txn)
    };
    let (revoked_keys, txn) = keys(revoked, &["a/1", "a/2", "b/1", "c"]);
    store.txn(txn).await.unwrap();
    let (expiring_keys, txn) = keys(expiring, &["a/3", "b/2", "d"]);
    let last = store.txn(txn).await.unwrap().revision;
    let mut events = watch(&store, prefix, last + 1).await;
    store.revoke_session(revoked).await.unwrap();
    let sorted = |batch: kafka_assigner::store::WatchBatch| -> BTreeSet<String> {
        assert!(batch.events.iter().all(|e| e.kind == WatchEventKind::Delete), "{batch:?}");
        batch.events.into_iter().map(|e| e.key).collect()
    };
    let batch = events.next_batch("the revocation").await;
    assert_eq!(sorted(batch), revoked_keys.into_iter().collect());
    let batch = events.next_batch("the expiry").await;
    assert_eq!(sorted(batch), expiring_keys.into_iter().collect());
}
