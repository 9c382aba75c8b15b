//! The client library (`kafka_assigner::client`) against real assigner instances, on the
//! memory and etcd backends: handler order, reconnect to a second instance within the TTL
//! with no movement, drain on shutdown, and the client-side lease (cut off by a TCP proxy
//! the test controls).

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use kafka_assigner::client::{
    AssignerClient, Backoff, ClientConfig, Handler, Partition, ShutdownOutcome, WarmError,
};
use kafka_assigner::config::DrainPolicy;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::support::{
    assigner::{
        Backend, PROMPT, SMALL, TOPIC, TTL, TestCluster, is_stable, on_both_backends, owned_by, try_topic,
    },
    proxy::Proxy,
    wait_until,
};

/// A handler call, as recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `warm` started.
    Warm(u32),
    /// `warm` returned.
    WarmDone(u32),
    /// `assigned` started.
    Assigned(u32),
    /// `assigned` returned.
    AssignedDone(u32),
    /// `release` started.
    Release(u32),
    /// `unassigned` started.
    Unassigned(u32),
    /// `assigned` gave up waiting for the peer's `release` (see [`Recorder::gate_on`]).
    GateTimedOut(u32),
}

/// A handler that records every call with its time.
#[derive(Default)]
pub struct Recorder {
    calls: Mutex<Vec<(Instant, Call)>>,
    /// When set, `assigned(p)` returns only once this peer has started `release(p)`.
    gate: Mutex<Option<Arc<Recorder>>>,
}

impl Recorder {
    /// A new recorder.
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder::default())
    }

    fn push(&self, call: Call) {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).push((Instant::now(), call));
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<(Instant, Call)> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Calls so far, without times.
    pub fn kinds(&self) -> Vec<Call> {
        self.calls().into_iter().map(|(_, c)| c).collect()
    }

    /// When `call` first happened.
    pub fn when(&self, call: Call) -> Option<Instant> {
        self.calls().into_iter().find(|(_, c)| *c == call).map(|(t, _)| t)
    }

    /// Makes `assigned(p)` wait (up to [`PROMPT`]) until `peer` has started `release(p)`.
    pub fn gate_on(&self, peer: Arc<Recorder>) {
        *self.gate.lock().unwrap_or_else(|p| p.into_inner()) = Some(peer);
    }
}

#[async_trait]
impl Handler for Recorder {
    async fn warm(&self, p: Partition) -> Result<(), WarmError> {
        self.push(Call::Warm(p.partition));
        tokio::task::yield_now().await;
        self.push(Call::WarmDone(p.partition));
        Ok(())
    }

    async fn assigned(&self, p: Partition) {
        self.push(Call::Assigned(p.partition));
        let peer = self.gate.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(peer) = peer {
            let give_up = Instant::now() + PROMPT;
            while peer.when(Call::Release(p.partition)).is_none() {
                if Instant::now() >= give_up {
                    self.push(Call::GateTimedOut(p.partition));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        self.push(Call::AssignedDone(p.partition));
    }

    async fn release(&self, p: Partition) {
        self.push(Call::Release(p.partition));
    }

    async fn unassigned(&self, p: Partition) {
        self.push(Call::Unassigned(p.partition));
    }
}

/// Client settings for tests: the cluster's TTL, quick backoff.
pub fn config(urls: &[String], name: &str) -> ClientConfig {
    let mut config = ClientConfig::new(urls.to_vec(), name, TOPIC).with_server_lease_ttl(TTL);
    config.backoff = Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200) };
    config.call_timeout = Duration::from_secs(2);
    config.drain_timeout = Duration::from_secs(10);
    config
}

/// Waits until the owned watch satisfies `pred`.
pub async fn wait_owned(
    owned: &mut watch::Receiver<BTreeSet<u32>>,
    what: &str,
    pred: impl FnMut(&BTreeSet<u32>) -> bool,
) -> BTreeSet<u32> {
    let result = tokio::time::timeout(PROMPT, owned.wait_for(pred)).await.map(|r| r.map(|set| set.clone()));
    match result {
        Ok(Ok(set)) => set,
        Ok(Err(_)) => panic!("the client ended while waiting until {what}"),
        Err(_) => panic!("timed out waiting until {what}; owned: {:?}", *owned.borrow()),
    }
}

/// Waits until the topic is stable and every client's owned set matches the status.
pub async fn settle(cluster: &TestCluster, on: usize, clients: &[(&str, &AssignerClient)]) {
    cluster
        .wait_status_of(on, PROMPT * 2, "the clients settle", |status| {
            try_topic(status, TOPIC).is_some_and(|t| {
                is_stable(t)
                    && t.consumers.len() == clients.len()
                    && clients.iter().all(|(name, c)| *c.owned().borrow() == owned_by(t, name))
            })
        })
        .await;
}

on_both_backends!(
    handler_order,
    reconnect_to_second_instance_keeps_partitions,
    drain_on_shutdown,
    client_side_lease,
    client_side_lease_on_a_silent_connection,
    drain_of_an_idle_client
);

/// `warm` returns before `assigned` starts on the new owner, and the old owner's `release`
/// starts while the new owner's `assigned` is still running (the server does not wait).
async fn handler_order(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let url = [cluster.instance(0).grpc_url.clone()];
    let a = Recorder::new();
    let b = Recorder::new();
    b.gate_on(a.clone());
    let client_a = AssignerClient::start(config(&url, "a"), a.clone(), None).expect("client a");
    wait_owned(&mut client_a.owned(), "a owns everything", |o| o.len() == 4).await;
    let client_b = AssignerClient::start(config(&url, "b"), b.clone(), None).expect("client b");
    settle(&cluster, 0, &[("a", &client_a), ("b", &client_b)]).await;
    // The owned watch moves when a command is applied; the handler calls follow.
    wait_until(PROMPT, "b's assigned calls returned", || {
        let n = b.kinds().iter().filter(|c| matches!(c, Call::AssignedDone(_))).count();
        async move { n == 2 }
    })
    .await;

    let moved: BTreeSet<u32> = b
        .kinds()
        .iter()
        .filter_map(|c| matches!(c, Call::Assigned(_)).then_some(*c))
        .map(|c| match c {
            Call::Assigned(p) => p,
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(moved.len(), 2, "b takes half: {:?}", b.kinds());
    for p in moved {
        let warmed =
            b.when(Call::WarmDone(p)).unwrap_or_else(|| panic!("b was not warmed for {p}: {:?}", b.kinds()));
        let assigned = b.when(Call::Assigned(p)).expect("assigned");
        let assigned_done = b.when(Call::AssignedDone(p)).expect("assigned returned");
        let released =
            a.when(Call::Release(p)).unwrap_or_else(|| panic!("a never released {p}: {:?}", a.kinds()));
        assert!(warmed <= assigned, "warm({p}) must return before assigned({p}) starts: {:?}", b.kinds());
        assert!(released <= assigned_done, "a's release({p}) must start before b's assigned({p}) returns");
        assert!(
            !b.kinds().contains(&Call::GateTimedOut(p)),
            "b's assigned({p}) waited in vain: {:?}",
            a.kinds()
        );
        assert!(!a.kinds().contains(&Call::Unassigned(p)), "a handoff is a release, not an unassign");
    }
    assert_eq!(client_a.shutdown().await.expect("a stops"), ShutdownOutcome::ShutdownNow);
    assert_eq!(client_b.shutdown().await.expect("b stops"), ShutdownOutcome::ShutdownNow);
}

/// The instance holding the client's stream crashes; the client reconnects to the second
/// endpoint within the TTL and keeps its partitions: no handler call, nothing moves.
async fn reconnect_to_second_instance_keeps_partitions(backend: Backend) {
    let mut cluster = TestCluster::start(backend, 2, |_| {}).await;
    let urls: Vec<String> = (0..2).map(|i| cluster.instance(i).grpc_url.clone()).collect();
    let (a, b) = (Recorder::new(), Recorder::new());
    let mut registry = Registry::default();
    let client_a =
        AssignerClient::start(config(&urls, "a"), a.clone(), Some(&mut registry)).expect("client a");
    wait_owned(&mut client_a.owned(), "a owns everything", |o| o.len() == 4).await;
    let client_b = AssignerClient::start(config(&urls[1..], "b"), b.clone(), None).expect("client b");
    settle(&cluster, 1, &[("a", &client_a), ("b", &client_b)]).await;
    let before_a = a.kinds().len();
    let before_b = b.kinds().len();
    let owned_a = client_a.owned().borrow().clone();

    let mut connected = client_a.connected();
    cluster.crash(0).await;
    // Down, then up again (on instance 1, the only one left).
    tokio::time::timeout(PROMPT, connected.wait_for(|c| !*c))
        .await
        .expect("a notices")
        .expect("client alive");
    tokio::time::timeout(TTL, connected.wait_for(|c| *c))
        .await
        .expect("a reconnects within the TTL")
        .expect("alive");
    let t = cluster
        .wait_status_of(1, PROMPT, "a is held by instance 1", |s| {
            try_topic(s, TOPIC).is_some_and(|t| {
                t.consumers.iter().any(|c| c.name == "a" && c.instance == cluster.instance(1).id)
            })
        })
        .await;
    let topic = try_topic(&t, TOPIC).expect("topic");
    assert_eq!(owned_by(topic, "a"), owned_a, "nothing moved: {t:?}");
    // Past the TTL and a settle period: still nothing moved.
    tokio::time::sleep(TTL * 2).await;
    let t = cluster.status_of(1).await;
    assert_eq!(owned_by(try_topic(&t, TOPIC).expect("topic"), "a"), owned_a);
    assert_eq!(a.kinds().len(), before_a, "no handler call on a: {:?}", &a.kinds()[before_a..]);
    assert_eq!(b.kinds().len(), before_b, "no handler call on b: {:?}", &b.kinds()[before_b..]);
    assert_eq!(*client_a.owned().borrow(), owned_a);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    assert!(text.contains("kafka_assigner_client_connects_total 2"), "{text}");
    assert!(text.contains("kafka_assigner_client_lease_expirations_total 0"), "{text}");
}

/// `WAIT_FOR_DRAIN`: the leaving client releases everything to the other, and its
/// shutdown returns once the server has ended the stream.
async fn drain_on_shutdown(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |c| c.drain_policy = DrainPolicy::Drain).await;
    let url = [cluster.instance(0).grpc_url.clone()];
    let (a, b) = (Recorder::new(), Recorder::new());
    let client_a = AssignerClient::start(config(&url, "a"), a.clone(), None).expect("client a");
    let client_b = AssignerClient::start(config(&url, "b"), b.clone(), None).expect("client b");
    settle(&cluster, 0, &[("a", &client_a), ("b", &client_b)]).await;
    let owned_a = client_a.owned().borrow().clone();
    assert_eq!(owned_a.len(), 2);
    let mut owned_b = client_b.owned();

    let outcome = tokio::time::timeout(PROMPT * 2, client_a.shutdown()).await.expect("drain ends in time");
    assert_eq!(outcome.expect("a stops"), ShutdownOutcome::Drained);
    for p in &owned_a {
        assert!(a.kinds().contains(&Call::Release(*p)), "a released {p}: {:?}", a.kinds());
        assert!(
            !a.kinds().contains(&Call::Unassigned(*p)),
            "drained by release, not unassign: {:?}",
            a.kinds()
        );
        let warmed = b.when(Call::WarmDone(*p)).unwrap_or_else(|| panic!("b warmed {p}: {:?}", b.kinds()));
        assert!(warmed <= a.when(Call::Release(*p)).expect("released"));
    }
    wait_owned(&mut owned_b, "b owns everything", |o| o.len() == 4).await;
    cluster
        .wait_status(PROMPT, "only b is left, owning everything", |s| {
            try_topic(s, TOPIC).is_some_and(|t| {
                t.consumers.len() == 1 && owned_by(t, "b").len() == 4 && t.handoffs.is_empty()
            })
        })
        .await;
}

/// Cut off by the proxy, the client unassigns everything before the server's TTL gives
/// its partitions to the other consumer.
async fn client_side_lease(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let url = cluster.instance(0).grpc_url.clone();
    let target = url.trim_start_matches("http://").parse().expect("instance address");
    let proxy = Proxy::start(target).await;
    let (a, b) = (Recorder::new(), Recorder::new());
    let mut registry = Registry::default();
    let client_a =
        AssignerClient::start(config(&[proxy.url()], "a"), a.clone(), Some(&mut registry)).expect("a");
    let client_b = AssignerClient::start(config(&[url], "b"), b.clone(), None).expect("client b");
    settle(&cluster, 0, &[("a", &client_a), ("b", &client_b)]).await;
    let owned_a = client_a.owned().borrow().clone();
    let before_b = b.calls().len();

    let cut = Instant::now();
    proxy.partition();
    wait_owned(&mut client_a.owned(), "a holds nothing", BTreeSet::is_empty).await;
    wait_owned(&mut client_b.owned(), "b owns everything", |o| o.len() == 4).await;
    // The owned watch moves when a command is applied; the handler call follows.
    wait_until(PROMPT, "b's handler was called for a's partitions", || {
        let calls = b.kinds();
        let done = owned_a.iter().all(|p| calls[before_b..].contains(&Call::AssignedDone(*p)));
        async move { done }
    })
    .await;
    for p in &owned_a {
        let unassigned =
            a.when(Call::Unassigned(*p)).unwrap_or_else(|| panic!("a unassigned {p}: {:?}", a.kinds()));
        let taken = b.calls()[before_b..]
            .iter()
            .find(|(_, c)| *c == Call::Assigned(*p))
            .map(|(t, _)| *t)
            .unwrap_or_else(|| panic!("b was assigned {p}: {:?}", b.kinds()));
        assert!(unassigned < taken, "a must stop {p} before b starts it");
        assert!(unassigned < cut + TTL, "a stops {p} within the server's TTL ({:?})", unassigned - cut);
        println!(
            "{}: cut -> a unassigned({p}) {:?}, -> b assigned({p}) {:?}",
            backend.name(),
            unassigned - cut,
            taken - cut
        );
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    assert!(text.contains("kafka_assigner_client_lease_expirations_total 1"), "{text}");

    // Back on: a registers again and gets its share back (through warm handoffs from b).
    proxy.restore();
    settle(&cluster, 0, &[("a", &client_a), ("b", &client_b)]).await;
}

/// The path to the assigner goes silent (nothing closed): keepalives notice, and the client
/// unassigns everything within the server's TTL. Once the path is back, it registers again
/// (replacing its stale stream) and its share comes back.
async fn client_side_lease_on_a_silent_connection(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let url = cluster.instance(0).grpc_url.clone();
    let target = url.trim_start_matches("http://").parse().expect("instance address");
    let proxy = Proxy::start(target).await;
    let (a, b) = (Recorder::new(), Recorder::new());
    let client_a = AssignerClient::start(config(&[proxy.url()], "a"), a.clone(), None).expect("client a");
    let client_b = AssignerClient::start(config(&[url], "b"), b.clone(), None).expect("client b");
    settle(&cluster, 0, &[("a", &client_a), ("b", &client_b)]).await;
    let owned_a = client_a.owned().borrow().clone();

    let frozen = Instant::now();
    proxy.blackhole();
    wait_owned(&mut client_a.owned(), "a holds nothing", BTreeSet::is_empty).await;
    wait_until(PROMPT, "a's unassigned calls ran", || {
        let calls = a.kinds();
        let done = owned_a.iter().all(|p| calls.contains(&Call::Unassigned(*p)));
        async move { done }
    })
    .await;
    for p in &owned_a {
        let unassigned = a.when(Call::Unassigned(*p)).expect("unassigned");
        assert!(unassigned < frozen + TTL, "a stops {p} within the server's TTL ({:?})", unassigned - frozen);
        println!("{}: silent path -> a unassigned({p}) {:?}", backend.name(), unassigned - frozen);
    }

    // Forward again, and reset the connections that went silent.
    proxy.restore();
    proxy.cut();
    settle(&cluster, 0, &[("a", &client_a), ("b", &client_b)]).await;
}

/// A client that holds nothing drains at once (the server ends its stream right after
/// `Deregister`) and does not register again.
async fn drain_of_an_idle_client(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |c| c.drain_policy = DrainPolicy::Drain).await;
    let url = [cluster.instance(0).grpc_url.clone()];
    let small = |name: &str| {
        let mut c = config(&url, name);
        c.topic = SMALL.into();
        c
    };
    let clients: Vec<AssignerClient> = ["a", "b", "c"]
        .iter()
        .map(|n| AssignerClient::start(small(n), Recorder::new(), None).expect("client"))
        .collect();
    cluster
        .wait_status(PROMPT, "two own one partition each, one is idle", |s| {
            try_topic(s, SMALL).is_some_and(|t| t.consumers.len() == 3 && is_stable(t))
        })
        .await;
    let mut clients: Vec<(String, AssignerClient)> =
        ["a", "b", "c"].iter().map(|n| n.to_string()).zip(clients).collect();
    let idle = clients.iter().position(|(_, c)| c.owned().borrow().is_empty()).expect("an idle client");
    let (name, client) = clients.remove(idle);
    let outcome = tokio::time::timeout(PROMPT, client.shutdown()).await.expect("prompt");
    assert_eq!(outcome.expect("stops"), ShutdownOutcome::Drained);
    cluster
        .wait_status(PROMPT, "the idle client is gone", |s| {
            try_topic(s, SMALL)
                .is_some_and(|t| t.consumers.len() == 2 && !t.consumers.iter().any(|c| c.name == name))
        })
        .await;
}
