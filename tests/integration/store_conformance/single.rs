//! Store tests that are not one scenario on both stores: the memory store under paused
//! time, and etcd-only behaviour (connection failures, dead endpoints, outages, a second
//! connection for the instance lease's keeper).

use std::{
    net::TcpListener,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use futures::StreamExt;
use kafka_assigner::metrics::Metrics;
use kafka_assigner::store::{
    Compare, EtcdStore, EtcdStoreConfig, FaultyStore, LeaseStore, MemoryStore, MeteredStore, Op, StoreError,
    Txn, Unreachable,
};

use super::{PROMPT, Store, get, next_event, put, revision, summary, watch};
use crate::support::{EtcdServer, next_within, wait_until};

// ---- MemoryStore under paused time: the same contract, driven by tokio's clock. ----

#[tokio::test(start_paused = true)]
async fn memory_session_expiry_under_paused_time() {
    let store: Store = Arc::new(MemoryStore::new());
    let session = store.grant_session(Duration::from_secs(10)).await.unwrap();
    store.put("/p/k", b"1".to_vec(), Some(session)).await.unwrap();
    let mut events = watch(&store, "/p/", 0).await;
    let start = tokio::time::Instant::now();
    // Under paused time the deadline must exceed the TTL: auto-advance would fire it first.
    let batch = next_within(&mut events.stream, Duration::from_secs(60), "the expiry").await.unwrap();
    assert_eq!(batch.events.iter().map(summary).collect::<Vec<_>>(), [("/p/k".to_string(), 3, None)]);
    assert_eq!(start.elapsed(), Duration::from_secs(10));
}

// ---- EtcdStore only. ----

#[tokio::test]
async fn etcd_connect_to_closed_port_fails_within_the_timeout() {
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let connect_timeout = Duration::from_secs(1);
    let config =
        EtcdStoreConfig::new([format!("http://127.0.0.1:{port}")]).with_connect_timeout(connect_timeout);
    let started = Instant::now();
    let result = EtcdStore::connect(config).await;
    let elapsed = started.elapsed();
    match result {
        Err(StoreError::Unavailable(Unreachable::OutOfTime { what: "connect", endpoints, .. })) => {
            assert!(endpoints.contains(&port.to_string()), "{endpoints}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(elapsed < connect_timeout + Duration::from_millis(500), "took {elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_works_when_the_first_endpoint_is_dead() {
    let server = EtcdServer::start().await;
    let dead = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port())
    };
    let mut endpoints = vec![dead];
    endpoints.extend(server.endpoints());
    let config = EtcdStoreConfig { endpoints, ..server.store_config() };
    let store: Store = Arc::new(EtcdStore::connect(config).await.expect("connect with one dead endpoint"));
    let prefix = server.unique_prefix("dead-endpoint");
    let start = revision(&store, &prefix).await;
    let mut events = watch(&store, &prefix, start + 1).await;
    let session = store.grant_session(Duration::from_secs(10)).await.unwrap();
    for i in 0..40 {
        let key = format!("{prefix}{i}");
        let rev = store.put(&key, b"v".to_vec(), Some(session)).await.unwrap();
        assert_eq!(get(&store, &key).await.unwrap().mod_revision, rev);
        let txn = Txn::new().when(Compare::ModRevision(key.clone(), rev)).then(Op::delete(key.clone()));
        assert!(store.txn(txn).await.unwrap().succeeded);
        store.keep_alive(session).await.unwrap();
    }
    for _ in 0..80 {
        next_event(&mut events, "events through the live endpoint").await;
    }
    store.revoke_session(session).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_outage_is_unavailable_then_recovers() {
    let mut server = EtcdServer::start().await;
    if server.is_shared() {
        return; // cannot stop a shared cluster; the other tests cover it
    }
    let request_timeout = Duration::from_secs(1);
    let config = server.store_config().with_request_timeout(request_timeout);
    let store: Store = Arc::new(EtcdStore::connect(config).await.unwrap());
    let prefix = server.unique_prefix("outage");
    let rev = put(&store, &format!("{prefix}before"), "1").await;
    let mut events = watch(&store, &prefix, rev + 1).await;

    server.stop();
    let started = Instant::now();
    let result = store.put(&format!("{prefix}during"), b"1".to_vec(), None).await;
    let elapsed = started.elapsed();
    assert!(matches!(result, Err(StoreError::Unavailable(_))), "put during an outage: {result:?}");
    assert!(elapsed < request_timeout + Duration::from_millis(500), "took {elapsed:?}");
    match next_within(&mut events.stream, PROMPT, "the watch to break").await {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("expected the watch to end with Unavailable, got {other:?}"),
    }
    assert!(events.stream.next().await.is_none(), "nothing after the error item");

    server.restart().await;
    wait_until(PROMPT, "the store works again", || async {
        store.put(&format!("{prefix}after"), b"1".to_vec(), None).await.is_ok()
    })
    .await;
    assert!(get(&store, &format!("{prefix}before")).await.is_some(), "data survives a restart");
}

/// Calls under way, or sent on the old connection, when etcd dies are retried like any
/// call during the outage: each ends `Unavailable` when its budget is spent, never at once
/// with whatever error its half-closed connection gave (a consumer would be told
/// "unavailable" before its own deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_calls_cut_by_a_crash_wait_out_their_budget() {
    let mut server = EtcdServer::start().await;
    if server.is_shared() {
        return; // cannot stop a shared cluster
    }
    let request_timeout = Duration::from_secs(1);
    let config = server.store_config().with_request_timeout(request_timeout);
    let store: Store = Arc::new(EtcdStore::connect(config).await.unwrap());
    let key = format!("{}k", server.unique_prefix("cut"));
    put(&store, &key, "1").await;
    // Each caller reads in a loop until a read fails, and reports how long that read took.
    let reads = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let (store, key, reads) = (store.clone(), key.clone(), reads.clone());
            tokio::spawn(async move {
                loop {
                    let started = Instant::now();
                    match store.get(&key).await {
                        Ok(_) => reads.fetch_add(1, Ordering::Relaxed),
                        Err(error) => return (error, started.elapsed()),
                    };
                }
            })
        })
        .collect();
    wait_until(PROMPT, "the readers to be under way", || async { reads.load(Ordering::Relaxed) >= 200 })
        .await;
    server.stop();
    // The retries stop one backoff (at most 250 ms) before the budget ends.
    let earliest = request_timeout - Duration::from_millis(300);
    for caller in callers {
        let (error, took) = tokio::time::timeout(PROMPT, caller).await.expect("a read ends").unwrap();
        assert!(matches!(error, StoreError::Unavailable(_)), "{error:?}");
        assert!(took >= earliest, "a read failed after {took:?}, before its budget: {error:?}");
    }
    server.restart().await;
}

/// A watch with nothing to report stays open: its liveness checks (a progress request after
/// `watch_progress_every` of silence) are answered by a live etcd, each answer reaches the
/// caller as a progress mark (a batch without events), and the next change still arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_quiet_watch_stays_open() {
    let server = EtcdServer::start().await;
    let every = Duration::from_millis(200);
    let config =
        server.store_config().with_request_timeout(Duration::from_secs(1)).with_watch_progress_every(every);
    let store: Store = Arc::new(EtcdStore::connect(config).await.unwrap());
    let prefix = server.unique_prefix("quiet");
    let mut events = watch(&store, &prefix, 0).await;
    // Ten idle periods: nothing but progress marks, one at least every two periods.
    let (quiet, mut marks) = (tokio::time::Instant::now(), 0);
    while quiet.elapsed() < every * 10 {
        let what = "a progress mark";
        match crate::support::next_within(&mut events.stream, every * 2 + every / 2, what).await {
            Ok(batch) if batch.events.is_empty() => marks += 1,
            other => panic!("a quiet watch sent {other:?}"),
        }
    }
    assert!(marks >= 5, "{marks} progress marks in {:?}", quiet.elapsed());
    let rev = put(&store, &format!("{prefix}k"), "1").await;
    let event = next_event(&mut events, "the change after the quiet").await;
    assert_eq!(event.revision, rev);
}

/// `connect_again` (the instance lease's keeper thread uses it): on etcd, through the
/// metering and fault wrappers, a second connection to the same data, still under the fault
/// wrapper's faults; the in-process store needs none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_connect_again_reaches_the_same_data_under_the_same_faults() {
    let memory = MemoryStore::new();
    assert!(memory.connect_again().await.unwrap().is_none(), "the memory store is shared as it is");

    let server = EtcdServer::start().await;
    let prefix = server.unique_prefix("again");
    let etcd: Store = Arc::new(server.store().await);
    let metrics = Arc::new(Metrics::new());
    let metered: Store = Arc::new(MeteredStore::new(etcd, metrics));
    let faulty = FaultyStore::new(metered, 7);
    let again = faulty.connect_again().await.unwrap().expect("etcd connects again");

    let session = again.grant_session(Duration::from_secs(5)).await.unwrap();
    faulty.put(&format!("{prefix}bound"), b"1".to_vec(), Some(session)).await.unwrap();
    let read = again.get(&format!("{prefix}bound")).await.unwrap();
    assert_eq!(read.and_then(|kv| kv.session), Some(session), "both connections see one store");

    faulty.cut_off();
    let cut = again.keep_alive(session).await;
    assert!(matches!(cut, Err(StoreError::Unavailable(_))), "a cut reaches the new connection: {cut:?}");
    faulty.restore();
    again.keep_alive(session).await.expect("restored");
}
