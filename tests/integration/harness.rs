//! Tests of the fault harness itself, so the fault suites can trust it: the proxy really
//! cuts, refuses, holds and black-holes; a frozen etcd answers nothing and comes back when
//! thawed; a 3-member cluster survives its leader's SIGKILL, and `EtcdStore` gets through
//! on the remaining endpoints (also past a frozen member).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use kafka_assigner::store::{LeaseStore, StoreError};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

use crate::support::{EtcdServer, cluster::EtcdCluster, next_within, proxy::Proxy, wait_until};

const PROMPT: Duration = Duration::from_secs(5);
/// How long "nothing arrives" is watched for (a negative check costs its whole length).
const QUIET: Duration = Duration::from_millis(300);

/// An echo server on loopback.
async fn echo_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local_addr");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0u8; 1024];
                while let Ok(n) = socket.read(&mut buffer).await {
                    if n == 0 || socket.write_all(&buffer[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Sends `text` and reads the echo within `deadline`; `Err` on timeout, EOF or error.
async fn echo(socket: &mut TcpStream, text: &str, deadline: Duration) -> Result<String, String> {
    socket.write_all(text.as_bytes()).await.map_err(|e| format!("write: {e}"))?;
    read_echo(socket, text.len(), deadline).await
}

async fn read_echo(socket: &mut TcpStream, len: usize, deadline: Duration) -> Result<String, String> {
    let mut buffer = vec![0u8; len];
    match tokio::time::timeout(deadline, socket.read_exact(&mut buffer)).await {
        Ok(Ok(_)) => Ok(String::from_utf8_lossy(&buffer).into_owned()),
        Ok(Err(e)) => Err(format!("read: {e}")),
        Err(_) => Err("timed out".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_forwards_cuts_refuses_holds_and_blackholes() {
    let proxy = Proxy::start(echo_server().await).await;
    let mut a = TcpStream::connect(proxy.addr()).await.expect("connect");
    assert_eq!(echo(&mut a, "ping", PROMPT).await, Ok("ping".into()));
    assert_eq!(proxy.open_connections(), 1);

    // Cut: the open connection is reset; a new one works (the mode is still Forward).
    proxy.cut();
    let mut buffer = [0u8; 1];
    let read = tokio::time::timeout(PROMPT, a.read(&mut buffer)).await.expect("the cut is seen at once");
    assert!(matches!(read, Ok(0) | Err(_)), "after a cut: {read:?}");
    wait_until(PROMPT, "the cut connection is gone", || async { proxy.open_connections() == 0 }).await;
    let mut b = TcpStream::connect(proxy.addr()).await.expect("connect after a cut");
    assert_eq!(echo(&mut b, "again", PROMPT).await, Ok("again".into()));

    // Black hole: nothing moves on the open connection, nothing is reset; then it flows on.
    proxy.blackhole();
    assert_eq!(echo(&mut b, "held", QUIET).await, Err("timed out".into()));
    proxy.restore();
    assert_eq!(read_echo(&mut b, 4, PROMPT).await, Ok("held".into()));

    // Refuse: new connections are reset at once; the open one still works.
    proxy.refuse();
    // The reset may even beat the connect's return.
    let refused = match TcpStream::connect(proxy.addr()).await {
        Ok(mut c) => echo(&mut c, "no", PROMPT).await,
        Err(error) => Err(format!("connect: {error}")),
    };
    assert!(refused.is_err() && refused != Err("timed out".into()), "refused: {refused:?}");
    assert_eq!(echo(&mut b, "still", PROMPT).await, Ok("still".into()));

    // Hold: a new connection hangs until the mode changes, then goes through.
    proxy.hold();
    let mut d = TcpStream::connect(proxy.addr()).await.expect("connect");
    assert_eq!(echo(&mut d, "wait", QUIET).await, Err("timed out".into()));
    proxy.restore();
    assert_eq!(read_echo(&mut d, 4, PROMPT).await, Ok("wait".into()));

    // Partition: open connections reset, new ones refused.
    proxy.partition();
    let read = tokio::time::timeout(PROMPT, b.read(&mut buffer)).await.expect("the partition is seen");
    assert!(matches!(read, Ok(0) | Err(_)), "after a partition: {read:?}");
    if let Ok(mut e) = TcpStream::connect(proxy.addr()).await {
        assert!(echo(&mut e, "x", PROMPT).await.is_err(), "a new connection during a partition");
    }
    wait_until(PROMPT, "every connection is gone", || async { proxy.open_connections() == 0 }).await;
}

/// An `EtcdStore` behind the proxy: a partition makes calls fail `Unavailable` within the
/// request timeout and breaks the watch; restoring lets it work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_cuts_an_etcd_store_off_and_back() {
    let server = EtcdServer::start().await;
    let proxy = Proxy::in_front_of(&server.endpoints()[0]).await;
    let request_timeout = Duration::from_secs(1);
    let config = server.store_config();
    let config = kafka_assigner::store::EtcdStoreConfig { endpoints: vec![proxy.url()], ..config }
        .with_request_timeout(request_timeout);
    let store = kafka_assigner::store::EtcdStore::connect(config).await.expect("connect through the proxy");
    let prefix = server.unique_prefix("proxy");
    store.put(&format!("{prefix}a"), b"1".to_vec(), None).await.expect("put through the proxy");

    for (what, cut_off) in [("partition", true), ("black hole", false)] {
        let from = store.get_prefix(&prefix).await.expect("read").revision + 1;
        let mut watch = store.watch_prefix(&prefix, from).await.expect("watch");
        if cut_off {
            proxy.partition();
        } else {
            // The connection stays open; nothing moves on it.
            proxy.blackhole();
        }
        let started = Instant::now();
        let result = store.put(&format!("{prefix}b"), b"1".to_vec(), None).await;
        let elapsed = started.elapsed();
        assert!(matches!(result, Err(StoreError::Unavailable(_))), "{what}: {result:?}");
        assert!(elapsed < request_timeout + Duration::from_millis(500), "{what}: took {elapsed:?}");
        // Reset, the watch breaks at once; black-holed, once a progress request (after 2 s
        // of silence) goes unanswered for the request timeout.
        match next_within(&mut watch, PROMPT, "the watch to break").await {
            Err(StoreError::Unavailable(_)) => {}
            other => panic!("{what}: expected the watch to break, got {other:?}"),
        }
        eprintln!("[proxy] {what}: the watch broke {:?} after the cut", started.elapsed());
        proxy.restore();
        wait_until(PROMPT, "the store works through the proxy again", || async {
            store.put(&format!("{prefix}c"), b"1".to_vec(), None).await.is_ok()
        })
        .await;
    }
}

/// A frozen etcd answers nothing: calls fail `Unavailable` within their timeout instead of
/// hanging; once thawed, it serves again with its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_etcd_times_calls_out_then_thaws() {
    let mut server = EtcdServer::start().await;
    if server.is_shared() {
        eprintln!("NOT RUN on a shared ETCD_ENDPOINTS cluster: it cannot be frozen");
        return;
    }
    let request_timeout = Duration::from_secs(1);
    let store = store_with_timeout(&server, request_timeout).await;
    let prefix = server.unique_prefix("freeze");
    store.put(&format!("{prefix}before"), b"1".to_vec(), None).await.expect("put");

    server.freeze();
    let started = Instant::now();
    let result = store.get(&format!("{prefix}before")).await;
    let elapsed = started.elapsed();
    assert!(matches!(result, Err(StoreError::Unavailable(_))), "get from a frozen etcd: {result:?}");
    // Bounded by the request timeout (plus slack for a loaded machine), not a hang.
    assert!(
        elapsed >= request_timeout && elapsed < request_timeout + Duration::from_secs(2),
        "a frozen etcd costs the request timeout, took {elapsed:?}"
    );
    server.thaw();
    wait_until(PROMPT, "a thawed etcd answers", || async {
        store.get(&format!("{prefix}before")).await.is_ok_and(|kv| kv.is_some())
    })
    .await;
}

/// A store on `server` with this request timeout.
async fn store_with_timeout(server: &EtcdServer, request_timeout: Duration) -> Arc<dyn LeaseStore> {
    let config = server.store_config().with_request_timeout(request_timeout);
    Arc::new(kafka_assigner::store::EtcdStore::connect(config).await.expect("connect"))
}

/// The raft leader is SIGKILLed: a new one is elected among the two others, and the very
/// next put through `EtcdStore` (all three endpoints configured) succeeds within one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_survives_a_leader_kill() {
    let mut cluster = EtcdCluster::start(3).await;
    let store = cluster.store().await;
    let prefix = cluster.unique_prefix("leader-kill");
    store.put(&format!("{prefix}before"), b"1".to_vec(), None).await.expect("put before");

    let pinned = store.pinned_endpoint().to_string();
    let killed = cluster.kill_leader().await;
    let started = Instant::now();
    let rev = store
        .put(&format!("{prefix}after"), b"1".to_vec(), None)
        .await
        .unwrap_or_else(|e| panic!("the first put after the leader (member {killed}) died failed: {e}"));
    let first_put = started.elapsed();
    let leader = cluster.leader(PROMPT).await;
    assert_ne!(leader, killed);
    // Every later call works too, whichever endpoint the client picks.
    let mut slowest = Duration::ZERO;
    for i in 0..30 {
        let started = Instant::now();
        store.put(&format!("{prefix}k{i}"), b"v".to_vec(), None).await.expect("put after the kill");
        assert!(store.get(&format!("{prefix}before")).await.expect("get").is_some());
        slowest = slowest.max(started.elapsed());
    }
    let mut watch = store.watch_prefix(&prefix, rev).await.expect("a watch after the kill");
    let batch = next_within(&mut watch, PROMPT, "the put after the kill").await.expect("a batch");
    assert_eq!(batch.revision, rev);
    eprintln!(
        "[etcd cluster] leader m{killed} SIGKILLed (store pinned to {pinned}, now {}): first put after \
         {first_put:?}; new leader m{leader}; slowest of 30 put+get after: {slowest:?}",
        store.pinned_endpoint()
    );
    cluster.restart(killed).await;
    store.put(&format!("{prefix}rejoined"), b"1".to_vec(), None).await.expect("put after the rejoin");
}

/// The member the store's calls go to is frozen (its connections stay open, it answers
/// nothing): the first call fails over after one attempt timeout, the others go straight to
/// a healthy member, and every call succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_calls_get_past_a_frozen_member() {
    let mut cluster = EtcdCluster::start(3).await;
    let store = cluster.store().await;
    let attempt_timeout = cluster.store_config().attempt_timeout;
    let prefix = cluster.unique_prefix("frozen-member");
    // Freeze the member the store's calls go to, with its connection open.
    store.put(&format!("{prefix}warm"), b"v".to_vec(), None).await.expect("put");
    let pinned = store.pinned_endpoint().to_string();
    let frozen = cluster.endpoints().iter().position(|e| *e == pinned).expect("a member is pinned");
    // A frozen raft leader also costs an election, during which one more call may wait.
    let allowed = if cluster.leader(PROMPT).await == frozen { 2 } else { 1 };
    cluster.freeze(frozen);
    let (mut slow, mut slowest) = (0, Duration::ZERO);
    for i in 0..40 {
        let started = Instant::now();
        store
            .put(&format!("{prefix}k{i}"), b"v".to_vec(), None)
            .await
            .unwrap_or_else(|e| panic!("put {i} with member {frozen} frozen: {e}"));
        let elapsed = started.elapsed();
        slowest = slowest.max(elapsed);
        if elapsed >= attempt_timeout {
            slow += 1;
        }
        assert!(elapsed < attempt_timeout * 2 + Duration::from_millis(500), "put {i} took {elapsed:?}");
    }
    eprintln!(
        "[etcd cluster] member m{frozen} frozen: 40 puts, {slow} needed a failover, slowest {slowest:?}"
    );
    assert!((1..=allowed).contains(&slow), "only the first call pays for the frozen member: {slow} slow");
    assert_ne!(store.pinned_endpoint(), pinned, "calls moved off the frozen member");
    cluster.thaw(frozen);
}

/// The member an `EtcdStore`'s watch is on is SIGKILLed: the watch ends at once, and since
/// a broken watch moves the store off its endpoint, the re-watch and the next calls get
/// through without waiting out an attempt timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_watch_on_a_killed_member_moves_on() {
    let mut cluster = EtcdCluster::start(3).await;
    let store = cluster.store().await;
    let attempt_timeout = cluster.store_config().attempt_timeout;
    let prefix = cluster.unique_prefix("watch-kill");
    let rev = store.put(&format!("{prefix}a"), b"1".to_vec(), None).await.expect("put");
    let mut watch = store.watch_prefix(&prefix, rev + 1).await.expect("watch");
    let pinned = store.pinned_endpoint().to_string();
    let member = cluster.endpoints().iter().position(|e| *e == pinned).expect("a member is pinned");
    cluster.kill(member);
    let killed = Instant::now();
    match next_within(&mut watch, PROMPT, "the watch to break").await {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("expected the watch on the killed member to break, got {other:?}"),
    }
    let broke = killed.elapsed();
    assert_ne!(store.pinned_endpoint(), pinned, "the broken watch moved the store off the dead member");
    let started = Instant::now();
    let from = store.get_prefix(&prefix).await.expect("re-read").revision + 1;
    let mut watch = store.watch_prefix(&prefix, from).await.expect("re-watch");
    let rewatched = started.elapsed();
    let rev = store.put(&format!("{prefix}b"), b"1".to_vec(), None).await.expect("put after the kill");
    let batch = next_within(&mut watch, PROMPT, "the put after the kill").await.expect("a batch");
    assert_eq!(batch.revision, rev);
    assert!(rewatched < attempt_timeout, "re-read and re-watch took {rewatched:?}");
    eprintln!(
        "[etcd cluster] m{member} killed under a watch: broke after {broke:?}, re-read + re-watch {rewatched:?}"
    );
}
