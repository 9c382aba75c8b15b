//! The client's session bounds against real assigner instances (memory and etcd): the
//! session timeout is learned from the server, and a `release` that hangs stops counting
//! as ownership after the session timeout.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use kafka_assigner::client::{AssignerClient, Backoff, ClientConfig, Handler, Partition, WarmError};
use kafka_assigner::proto::v1::RegisterRequest;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::client::{Call, Recorder, config, settle, wait_owned};
use crate::support::{
    assigner::{Backend, PROMPT, SMALL, TOPIC, TestCluster, on_both_backends},
    proxy::Proxy,
    wait_until,
};

/// The server's `--lease-ttl` in the learning test: well below what a default client
/// assumes (10 s).
const SERVER_TTL: Duration = Duration::from_secs(3);

on_both_backends!(
    session_timeout_is_learned_from_the_server,
    a_hung_release_is_not_held_past_the_session_timeout
);

/// The value of metric `name` (no labels) in `registry`.
fn metric(registry: &Registry, name: &str) -> Option<f64> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).ok()?;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A client left at its defaults (made for a 10 s TTL: 6 s of session) learns the
/// server's 3 s TTL on `Register`: cut off, it stops before the server can give its
/// partitions away (two thirds of the TTL after the drop), not 5 s later.
async fn session_timeout_is_learned_from_the_server(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |c| c.lease_ttl = SERVER_TTL).await;
    // The announcement itself, on the wire.
    let mut raw = cluster.client(0).await;
    let request = RegisterRequest { consumer_name: "probe".into(), topic: SMALL.into() };
    let response = raw.register(request).await.expect("Register");
    let header = response.metadata().get("x-kafka-assigner-session-ttl-ms").and_then(|v| v.to_str().ok());
    assert_eq!(header, Some("3000"), "{:?}", response.metadata());
    drop(response);

    let url = cluster.instance(0).grpc_url.clone();
    let proxy = Proxy::start(url.trim_start_matches("http://").parse().expect("instance address")).await;
    let mut defaults = ClientConfig::new([proxy.url()], "a", TOPIC);
    defaults.backoff = Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200) };
    assert_eq!(defaults.session_timeout, Duration::from_secs(6), "the default assumes a 10 s TTL");
    let (a, b) = (Recorder::new(), Recorder::new());
    let mut registry = Registry::default();
    let client_a = AssignerClient::start(defaults, a.clone(), Some(&mut registry)).expect("client a");
    let client_b = AssignerClient::start(config(&[url], "b"), b.clone(), None).expect("client b");
    settle(&cluster, 0, &[("a", &client_a), ("b", &client_b)]).await;
    let in_force = metric(&registry, "kafka_assigner_client_session_timeout_seconds");
    assert!(in_force.is_some_and(|s| (s - 1.8).abs() < 0.01), "60% of the server's TTL: {in_force:?}");
    let owned_a = client_a.owned().borrow().clone();
    let before_b = b.calls().len();

    let cut = Instant::now();
    proxy.partition();
    let mut watch_a = client_a.owned();
    tokio::time::timeout(SERVER_TTL * 3, watch_a.wait_for(BTreeSet::is_empty))
        .await
        .expect("a stops at all")
        .expect("client a alive");
    let stopped = cut.elapsed();
    println!("{}: cut -> a holds nothing {stopped:?}", backend.name());
    let reassign_at = SERVER_TTL * 2 / 3;
    assert!(
        stopped < reassign_at,
        "a stopped {stopped:?} after the cut; the server may reassign {reassign_at:?} after it"
    );
    // And indeed before b starts any of them.
    wait_owned(&mut client_b.owned(), "b owns everything", |o| o.len() == 4).await;
    wait_until(PROMPT, "b's handler was called for a's partitions", || {
        let calls = b.kinds();
        let done = owned_a.iter().all(|p| calls[before_b..].contains(&Call::Assigned(*p)));
        async move { done }
    })
    .await;
    for p in &owned_a {
        let unassigned = a.when(Call::Unassigned(*p)).unwrap_or_else(|| panic!("a unassigned {p}"));
        let taken = b.calls()[before_b..].iter().find(|(_, c)| *c == Call::Assigned(*p)).map(|(t, _)| *t);
        let taken = taken.unwrap_or_else(|| panic!("b was assigned {p}: {:?}", b.kinds()));
        assert!(unassigned < taken, "a must stop {p} before b starts it");
        println!("{}: cut -> b assigned({p}) {:?}", backend.name(), taken - cut);
    }
}

/// A handler whose `release` records its call and then hangs until the test opens it.
struct HungRelease {
    calls: Arc<Recorder>,
    open: watch::Receiver<bool>,
    returned: Mutex<Vec<u32>>,
}

#[async_trait]
impl Handler for HungRelease {
    async fn warm(&self, p: Partition) -> Result<(), WarmError> {
        self.calls.warm(p).await
    }

    async fn assigned(&self, p: Partition) {
        self.calls.assigned(p).await
    }

    async fn release(&self, p: Partition) {
        let partition = p.partition;
        self.calls.release(p).await;
        let _ = self.open.clone().wait_for(|open| *open).await;
        self.returned.lock().unwrap_or_else(|e| e.into_inner()).push(partition);
    }

    async fn unassigned(&self, p: Partition) {
        self.calls.unassigned(p).await
    }
}

/// The old owner's `release` hangs while the new owner already processes the partitions
/// (the server waits up to its 60 s release timeout). After the session timeout the
/// partitions leave the old owner's `owned()`, with the handler still running, counted.
/// When the handler returns at last, `PartitionReleased` still completes the handoff.
async fn a_hung_release_is_not_held_past_the_session_timeout(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let url = [cluster.instance(0).grpc_url.clone()];
    let (open_tx, open) = watch::channel(false);
    let a = Arc::new(HungRelease { calls: Recorder::new(), open, returned: Mutex::new(Vec::new()) });
    let mut registry = Registry::default();
    let config_a = config(&url, "a");
    let session = config_a.session_timeout;
    let client_a = AssignerClient::start(config_a, a.clone(), Some(&mut registry)).expect("client a");
    wait_owned(&mut client_a.owned(), "a owns everything", |o| o.len() == 4).await;
    let client_b = AssignerClient::start(config(&url, "b"), Recorder::new(), None).expect("client b");

    let releasing = || -> BTreeSet<u32> {
        a.calls
            .kinds()
            .iter()
            .filter_map(|c| if let Call::Release(p) = c { Some(*p) } else { None })
            .collect()
    };
    wait_until(PROMPT, "a is asked to release half", || {
        let n = releasing().len();
        async move { n == 2 }
    })
    .await;
    let moved = releasing();
    wait_owned(&mut client_b.owned(), "b owns what a releases", |o| *o == moved).await;
    let kept = wait_owned(&mut client_a.owned(), "a stops holding what it releases", |o| {
        o.len() == 2 && o.is_disjoint(&moved)
    })
    .await;
    let left = Instant::now();
    assert!(a.returned.lock().unwrap_or_else(|e| e.into_inner()).is_empty(), "release still runs");
    for p in &moved {
        let started = a.calls.when(Call::Release(*p)).expect("release started");
        println!(
            "{}: release({p}) started -> not held {:?} (session {session:?})",
            backend.name(),
            left - started
        );
    }
    assert_eq!(metric(&registry, "kafka_assigner_client_abandoned_releases_total"), Some(2.0));

    // The handler returns at last: acknowledged, the handoffs complete, all agree.
    open_tx.send_replace(true);
    settle(&cluster, 0, &[("a", &client_a), ("b", &client_b)]).await;
    assert_eq!(*client_a.owned().borrow(), kept);
    assert_eq!(a.returned.lock().unwrap_or_else(|e| e.into_inner()).len(), 2);
}
