//! In-process assigner clusters and scripted gRPC consumers, for scenario tests that run
//! on both backends.
//!
//! * [`TestCluster`] starts N assigner instances (each a [`TestCoordinator`] served by an
//!   [`AssignerServer`] on free loopback ports) sharing one store ([`TestStore`], also used
//!   by the fleet tests): one [`MemoryStore`] (memory) or one [`EtcdServer`] with an
//!   `EtcdStore` per instance under a unique prefix (etcd). The config is tuned for tests
//!   ([`test_config`]: 1 s TTL, 100 ms reconcile). Instances can be crashed
//!   ([`TestCluster::crash`]: tasks stop, sessions are not revoked, leadership is not
//!   resigned) or stopped gracefully.
//! * The preludes scenarios share: a consumer that owns every partition
//!   ([`TestCluster::sole_owner`]), a settled pair ([`TestCluster::settled_pair`]), and a
//!   warming handoff a → b ([`TestCluster::warming_pair`]).
//! * [`TestConsumer`] is a consumer on a real gRPC connection: a task reads its `Register`
//!   stream (timestamping every command), and the consumer tracks what it was told (owned
//!   partitions, pending warms, pending releases) and answers warms and releases.
//! * [`on_both_backends!`] turns one `async fn scenario(backend: Backend)` into a
//!   `memory::scenario` and an `etcd::scenario` test.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::SocketAddr,
    sync::Arc,
    time::Duration,
};

use kafka_assigner::coordinator::machine::driver::front::MachineCoordinator;
use kafka_assigner::coordinator::{ConsumerGroupCoordinator, HandoffConfig, StatusView, TopicStatus};
use kafka_assigner::handoff::PlanConfig;
use kafka_assigner::metrics::Metrics;
use kafka_assigner::proto::v1::{
    AssignmentCommand, DeregisterAction, DeregisterRequest, PartitionReadyRequest, PartitionReleasedRequest,
    RegisterRequest, TopicPartition, assignment_command::Command, kafka_assigner_client::KafkaAssignerClient,
};
use kafka_assigner::server::AssignerServer;
use kafka_assigner::store::{LeaseStore, MemoryStore, PrefixSnapshot};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::mpsc,
    task::JoinHandle,
};
use tonic::{Status, Streaming, transport::Channel};

use super::{EtcdServer, POLL_INTERVAL};

/// The topic most scenarios use, and its partition count.
pub const TOPIC: &str = "events";
/// Partitions of [`TOPIC`].
pub const PARTITIONS: u32 = 4;
/// A two-partition topic (three consumers on it leave one idle).
pub const SMALL: &str = "small";
/// A wider topic.
pub const WIDE: &str = "wide";
/// Session TTL of test clusters (etcd TTLs are whole seconds).
pub const TTL: Duration = Duration::from_secs(1);
/// Leader reconcile interval of test clusters.
pub const RECONCILE: Duration = Duration::from_millis(100);
/// Bound for anything that should be prompt (a command, a status change).
pub const PROMPT: Duration = Duration::from_secs(5);
/// Bound for a dropped consumer's session to be gone: the TTL, plus etcd's 500 ms expiry
/// check, plus generous slack for a loaded 2-core machine.
pub const EXPIRY: Duration = Duration::from_secs(5);

/// Which store the cluster runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// One shared in-process [`MemoryStore`].
    Memory,
    /// One real etcd (started for the test), an `EtcdStore` per instance.
    Etcd,
}

impl Backend {
    /// `"memory"` or `"etcd"`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Etcd => "etcd",
        }
    }
}

/// Generates `memory::$name` and `etcd::$name` tests, each calling the scenario
/// `async fn $name(backend: Backend)` of the invoking module.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::support::assigner::Backend::Memory).await;
                }
            )*
        }

        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::support::assigner::Backend::Etcd).await;
                }
            )*
        }
    };
}
pub(crate) use on_both_backends;

/// The config every test instance starts from: short TTL, fast reconcile, time limits
/// long enough never to fire unless a test lowers them, and a few known topics.
pub fn test_config(backend: Backend, prefix: &str) -> HandoffConfig {
    let mut config = HandoffConfig {
        instance_id: String::new(),
        backend: backend.name().into(),
        prefix: prefix.into(),
        lease_ttl: TTL,
        plan: PlanConfig { warm_timeout_ms: 60_000, release_timeout_ms: 60_000, max_warming_per_consumer: 4 },
        restart_grace: Duration::from_secs(10),
        reconcile_interval: RECONCILE,
        ..HandoffConfig::default()
    };
    config.topic_partitions.insert(TOPIC.into(), PARTITIONS);
    config.topic_partitions.insert(SMALL.into(), 2);
    config.topic_partitions.insert(WIDE.into(), 12);
    config
}

/// The store a test's instances share (see the module docs): built once here for every
/// test cluster, whatever coordinator it runs.
pub struct TestStore {
    /// The key prefix to work under: `/{name}-test/` on memory, unique to the test on etcd.
    pub prefix: String,
    /// A handle of the test's own, to read (or write) the shared state directly.
    pub store: Arc<dyn LeaseStore>,
    /// The shared in-process store (memory).
    pub memory: Option<MemoryStore>,
    /// The etcd server started for the test (etcd).
    pub etcd: Option<EtcdServer>,
}

impl TestStore {
    /// Starts `backend`'s store; `name` names the prefix.
    pub async fn start(backend: Backend, name: &str) -> TestStore {
        let (memory, etcd, prefix) = match backend {
            Backend::Memory => (Some(MemoryStore::new()), None, format!("/{name}-test/")),
            Backend::Etcd => {
                let etcd = EtcdServer::start().await;
                let prefix = etcd.unique_prefix(name);
                (None, Some(etcd), prefix)
            }
        };
        let store = connect(memory.as_ref(), etcd.as_ref()).await;
        TestStore { prefix, store, memory, etcd }
    }
}

/// A new handle on a [`TestStore`]'s store, for one instance: the same [`MemoryStore`], or
/// an etcd client of its own (as a separate process would have).
pub async fn connect(memory: Option<&MemoryStore>, etcd: Option<&EtcdServer>) -> Arc<dyn LeaseStore> {
    match (memory, etcd) {
        (Some(memory), _) => Arc::new(memory.clone()),
        (None, Some(etcd)) => Arc::new(etcd.store().await),
        (None, None) => unreachable!("a test store is a MemoryStore or an etcd server"),
    }
}

/// One assigner instance of a [`TestCluster`].
pub struct Instance {
    /// Its instance id.
    pub id: String,
    /// The concrete coordinator (for `crash()`, `is_leader()`, `status()`).
    pub coordinator: TestCoordinator,
    server: Option<AssignerServer>,
    /// `http://127.0.0.1:port` of its gRPC server.
    pub grpc_url: String,
    /// Its admin server.
    pub admin_addr: SocketAddr,
}

impl Instance {
    /// Whether it still serves (neither crashed nor stopped).
    pub fn is_up(&self) -> bool {
        self.server.is_some()
    }
}

/// N assigner instances over one store (see the module docs).
pub struct TestCluster {
    /// The backend.
    pub backend: Backend,
    /// The config new instances start with (`instance_id` is set per instance).
    pub config: HandoffConfig,
    /// The instances, in start order (crashed and stopped ones stay, marked down).
    pub instances: Vec<Instance>,
    /// A store handle of our own, to read (or write) the shared state directly.
    pub store: Arc<dyn LeaseStore>,
    memory: Option<MemoryStore>,
    /// Declared last: dropped after everything that talks to it.
    pub etcd: Option<EtcdServer>,
}

impl TestCluster {
    /// Starts a cluster of `instances` instances with [`test_config`] changed by `tweak`.
    pub async fn start(backend: Backend, instances: usize, tweak: impl FnOnce(&mut HandoffConfig)) -> Self {
        let TestStore { prefix, store, memory, etcd } = TestStore::start(backend, "assigner").await;
        let mut config = test_config(backend, &prefix);
        tweak(&mut config);
        let mut cluster = TestCluster { backend, config, instances: Vec::new(), store, memory, etcd };
        for _ in 0..instances {
            cluster.add_instance().await;
        }
        cluster
    }

    /// Starts one more instance on the same store and prefix; returns its index.
    pub async fn add_instance(&mut self) -> usize {
        assert!(
            self.memory.is_some() || self.etcd.is_some(),
            "a cluster made with_store() adds instances with add_instance_on()"
        );
        let store = connect(self.memory.as_ref(), self.etcd.as_ref()).await;
        self.add_instance_on(store).await
    }

    /// A cluster with no instance yet, on a store the test made (a 3-member etcd cluster,
    /// a store behind a proxy); add instances with [`add_instance_on`](Self::add_instance_on).
    pub fn with_store(backend: Backend, store: Arc<dyn LeaseStore>, prefix: &str) -> Self {
        let config = test_config(backend, prefix);
        TestCluster { backend, config, instances: Vec::new(), store, memory: None, etcd: None }
    }

    /// Starts one more instance on `store` (the same state, reached another way: through a
    /// proxy, a fault wrapper...); returns its index.
    pub async fn add_instance_on(&mut self, store: Arc<dyn LeaseStore>) -> usize {
        let index = self.instances.len();
        let id = format!("{}-instance-{index}", self.backend.name());
        let mut config = self.config.clone();
        config.instance_id = id.clone();
        let metrics = Arc::new(Metrics::new());
        let coordinator = TestCoordinator::start(store, config, metrics.clone())
            .await
            .unwrap_or_else(|e| panic!("instance {id} did not start: {e}"));
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        // `crash()` makes the server's later graceful stop a no-op for the coordinator.
        let server = AssignerServer::start(coordinator.served(), metrics, any, any)
            .await
            .unwrap_or_else(|e| panic!("instance {id} cannot serve: {e}"));
        let grpc_url = server.grpc_url();
        let admin_addr = server.admin_addr;
        self.instances.push(Instance { id, coordinator, server: Some(server), grpc_url, admin_addr });
        index
    }

    /// The configured partition count of `topic_name`.
    pub fn partitions(&self, topic_name: &str) -> u32 {
        self.config.topic_partitions.get(topic_name).copied().unwrap_or_else(|| {
            panic!("topic {topic_name} has no configured partition count");
        })
    }

    /// Instance `i`.
    pub fn instance(&self, i: usize) -> &Instance {
        &self.instances[i]
    }

    /// The index of the first instance still up.
    fn first_up(&self) -> usize {
        self.instances.iter().position(Instance::is_up).expect("no instance of the cluster is up")
    }

    /// Kills instance `i` as if its process died: its coordinator's tasks stop (no session
    /// revoked, leadership not resigned), then its gRPC and admin servers stop (the
    /// server's `shutdown()` of a crashed coordinator does nothing).
    pub async fn crash(&mut self, i: usize) {
        let instance = &mut self.instances[i];
        instance.coordinator.crash();
        if let Some(server) = instance.server.take() {
            tokio::time::timeout(PROMPT, server.stop())
                .await
                .unwrap_or_else(|_| panic!("servers of crashed instance {} did not stop", instance.id));
        }
    }

    /// Stops instance `i` gracefully (streams end with UNAVAILABLE, sessions left to their
    /// TTL, leadership resigned).
    pub async fn stop(&mut self, i: usize) {
        let instance = &mut self.instances[i];
        if let Some(server) = instance.server.take() {
            tokio::time::timeout(PROMPT, server.stop())
                .await
                .unwrap_or_else(|_| panic!("instance {} did not stop", instance.id));
        }
    }

    /// The index of the instance that is up and leads, if any.
    pub fn leader(&self) -> Option<usize> {
        self.instances.iter().position(|i| i.is_up() && i.coordinator.is_leader())
    }

    /// Waits until some instance that is up leads; returns its index.
    pub async fn wait_leader(&self, deadline: Duration) -> usize {
        let give_up = tokio::time::Instant::now() + deadline;
        loop {
            if let Some(i) = self.leader() {
                return i;
            }
            if tokio::time::Instant::now() >= give_up {
                panic!("no instance leads after {deadline:?}; status: {}", json(&self.status().await));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// A new gRPC client of instance `i` (its own connection).
    pub async fn client(&self, i: usize) -> KafkaAssignerClient<Channel> {
        let url = self.instances[i].grpc_url.clone();
        KafkaAssignerClient::connect(url.clone())
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
    }

    /// Registers `name` for [`TOPIC`] on the first instance that is up.
    pub async fn consumer(&self, name: &str) -> TestConsumer {
        self.consumer_on(self.first_up(), name, TOPIC).await
    }

    /// Registers `name` for `topic` on instance `i`, panicking if refused.
    pub async fn consumer_on(&self, i: usize, name: &str, topic: &str) -> TestConsumer {
        self.try_consumer_on(i, name, topic)
            .await
            .unwrap_or_else(|status| panic!("Register({name}, {topic}) on instance {i} refused: {status:?}"))
    }

    /// Registers `name` for `topic` on instance `i`.
    pub async fn try_consumer_on(&self, i: usize, name: &str, topic: &str) -> Result<TestConsumer, Status> {
        TestConsumer::register(self.client(i).await, name, topic).await
    }

    /// Registers `name` for `topic_name` on instance `i` as the topic's first consumer and
    /// waits until it owns every partition.
    pub async fn sole_owner(&self, i: usize, name: &str, topic_name: &str) -> TestConsumer {
        let partitions = self.partitions(topic_name);
        let mut consumer = self.consumer_on(i, name, topic_name).await;
        consumer.expect_snapshot().await;
        consumer.wait_owned(partitions as usize, PROMPT).await;
        consumer
    }

    /// `a` on instance `on.0` owns every partition of `topic_name`, then `b` joins on
    /// instance `on.1` and both answer every warm and release until the topic is stable
    /// ([`settle`]). Returns `(a, b)` and the settled status.
    pub async fn settled_pair(
        &self,
        topic_name: &str,
        on: (usize, usize),
    ) -> (TestConsumer, TestConsumer, StatusView) {
        let mut a = self.sole_owner(on.0, "a", topic_name).await;
        let mut b = self.consumer_on(on.1, "b", topic_name).await;
        b.expect_snapshot().await;
        let status = settle(self, topic_name, &mut [&mut a, &mut b], PROMPT).await;
        (a, b, status)
    }

    /// The warming prelude of many scenarios: `a` registers for `topic` on instance `on.0`
    /// and is given every partition; then `b` registers on instance `on.1`, gets an empty
    /// snapshot and is asked to warm `warms` partitions from `a`, which is told nothing
    /// meanwhile. Returns `(a, b)` as soon as the warms arrived (a warm timeout may be
    /// short), with nothing answered.
    pub async fn warming_pair(
        &self,
        topic_name: &str,
        on: (usize, usize),
        warms: usize,
    ) -> (TestConsumer, TestConsumer) {
        let mut a = self.sole_owner(on.0, "a", topic_name).await;
        let a_seen = a.seen();
        let mut b = self.consumer_on(on.1, "b", topic_name).await;
        assert!(b.expect_snapshot().await.is_empty(), "b owns nothing yet: {b:?}");
        b.wait_warms(warms, PROMPT).await;
        assert!(b.owned.is_empty(), "warming is not owning: {b:?}");
        assert!(b.warms.values().all(|owner| owner == "a"), "current_owner is a: {b:?}");
        a.poll_now();
        assert_eq!(a.seen(), a_seen, "a is told nothing while b warms: {a:?}");
        (a, b)
    }

    /// The status view of the first instance that is up.
    pub async fn status(&self) -> StatusView {
        self.status_of(self.first_up()).await
    }

    /// The status view of instance `i`.
    pub async fn status_of(&self, i: usize) -> StatusView {
        self.instances[i].coordinator.status().await
    }

    /// Waits until `pred` holds on the first instance's status view; returns that view.
    pub async fn wait_status(
        &self,
        deadline: Duration,
        what: &str,
        pred: impl FnMut(&StatusView) -> bool,
    ) -> StatusView {
        self.wait_status_of(self.first_up(), deadline, what, pred).await
    }

    /// Waits until `pred` holds on instance `i`'s status view; returns that view.
    pub async fn wait_status_of(
        &self,
        i: usize,
        deadline: Duration,
        what: &str,
        mut pred: impl FnMut(&StatusView) -> bool,
    ) -> StatusView {
        let give_up = tokio::time::Instant::now() + deadline;
        loop {
            let status = self.status_of(i).await;
            if pred(&status) {
                return status;
            }
            if tokio::time::Instant::now() >= give_up {
                panic!(
                    "timed out after {deadline:?} waiting until {what}; status of instance {i}: {}",
                    json(&status)
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Everything stored under the cluster's prefix, with the store revision: equal before
    /// and after a call exactly when the call wrote nothing.
    pub async fn stored(&self) -> PrefixSnapshot {
        self.store
            .get_prefix(&self.config.prefix)
            .await
            .unwrap_or_else(|e| panic!("cannot read the store: {e}"))
    }

    /// What a refused call must not change: the store (records and revision) and every
    /// running instance's status view.
    pub async fn fingerprint(&self) -> (PrefixSnapshot, Vec<String>) {
        let mut views = Vec::new();
        for (i, instance) in self.instances.iter().enumerate() {
            if instance.is_up() {
                views.push(json(&self.status_of(i).await));
            }
        }
        (self.stored().await, views)
    }

    /// `GET /status` from instance `i`'s admin server, parsed.
    pub async fn admin_status(&self, i: usize) -> serde_json::Value {
        let addr = self.instances[i].admin_addr;
        let mut conn =
            tokio::net::TcpStream::connect(addr).await.unwrap_or_else(|e| panic!("admin {addr}: {e}"));
        conn.write_all(b"GET /status HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap_or_else(|e| panic!("admin {addr}: {e}"));
        let mut response = String::new();
        tokio::time::timeout(PROMPT, conn.read_to_string(&mut response))
            .await
            .unwrap_or_else(|_| panic!("admin {addr}: no response"))
            .unwrap_or_else(|e| panic!("admin {addr}: {e}"));
        let (head, body) =
            response.split_once("\r\n\r\n").unwrap_or_else(|| panic!("bad response: {response}"));
        assert!(head.starts_with("HTTP/1.1 200"), "GET /status: {head}");
        serde_json::from_str(body).unwrap_or_else(|e| panic!("GET /status body is not JSON ({e}): {body}"))
    }
}

/// A status view as JSON, for messages and comparisons.
pub fn json(status: &StatusView) -> String {
    serde_json::to_string(status).unwrap_or_default()
}

/// The topic's part of a status view (panics if absent).
pub fn topic<'a>(status: &'a StatusView, name: &str) -> &'a TopicStatus {
    try_topic(status, name).unwrap_or_else(|| panic!("topic {name} is not in the status: {}", json(status)))
}

/// The topic's part of a status view.
pub fn try_topic<'a>(status: &'a StatusView, name: &str) -> Option<&'a TopicStatus> {
    status.topics.iter().find(|t| t.topic == name)
}

/// Partitions `consumer` owns according to the status view.
pub fn owned_by(topic: &TopicStatus, consumer: &str) -> BTreeSet<u32> {
    (0..).zip(&topic.owners).filter(|(_, o)| o.as_deref() == Some(consumer)).map(|(p, _)| p).collect()
}

/// Names of the consumers registered for the topic.
pub fn consumer_names(topic: &TopicStatus) -> Vec<&str> {
    topic.consumers.iter().map(|c| c.name.as_str()).collect()
}

/// No handoff in flight, every partition owned by an active consumer, and the active
/// consumers balanced (⌊P/N⌋ or ⌈P/N⌉ each).
pub fn is_stable(topic: &TopicStatus) -> bool {
    let active: Vec<&str> = topic
        .consumers
        .iter()
        .filter(|c| c.status == kafka_assigner::handoff::ConsumerStatus::Active)
        .map(|c| c.name.as_str())
        .collect();
    if !topic.handoffs.is_empty() || active.is_empty() {
        return false;
    }
    if !topic.owners.iter().all(|o| o.as_deref().is_some_and(|o| active.contains(&o))) {
        return false;
    }
    let counts: Vec<usize> = active.iter().map(|c| owned_by(topic, c).len()).collect();
    let (min, max) = (counts.iter().min(), counts.iter().max());
    matches!((min, max), (Some(min), Some(max)) if max - min <= 1)
}

/// Every partition of `topic`.
pub fn all_partitions(count: u32) -> BTreeSet<u32> {
    (0..count).collect()
}

fn tp(topic: &str, partition: u32) -> Option<TopicPartition> {
    Some(TopicPartition { topic: topic.to_string(), partition })
}

/// What a consumer's stream reader saw.
#[derive(Debug)]
pub enum Received {
    /// A command, and when it arrived.
    Command(std::time::Instant, AssignmentCommand),
    /// The end of the stream: `Ok` for a clean end, the status otherwise.
    End(std::time::Instant, Result<(), Status>),
}

async fn read_stream(mut stream: Streaming<AssignmentCommand>, tx: mpsc::UnboundedSender<Received>) {
    loop {
        let item = stream.message().await;
        let now = std::time::Instant::now();
        let received = match item {
            Ok(Some(command)) => Received::Command(now, command),
            Ok(None) => Received::End(now, Ok(())),
            Err(status) => Received::End(now, Err(status)),
        };
        let end = matches!(received, Received::End(..));
        if tx.send(received).is_err() || end {
            return;
        }
    }
}

/// A consumer on its own gRPC connection (see the module docs).
pub struct TestConsumer {
    /// Its consumer name.
    pub name: String,
    /// Its topic.
    pub topic: String,
    client: KafkaAssignerClient<Channel>,
    events: mpsc::UnboundedReceiver<Received>,
    reader: Option<JoinHandle<()>>,
    /// Partitions it was told it owns (and has not released).
    pub owned: BTreeSet<u32>,
    /// Warms not answered yet: partition → current owner.
    pub warms: BTreeMap<u32, String>,
    /// Releases not answered yet: partition → new owner.
    pub releases: BTreeMap<u32, String>,
    /// Every command received, in order, with its arrival time.
    pub history: Vec<(std::time::Instant, AssignmentCommand)>,
    /// How the stream ended, once it has.
    pub ended: Option<Result<(), Status>>,
    /// When the stream ended, once it has.
    pub ended_at: Option<std::time::Instant>,
}

impl fmt::Debug for TestConsumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestConsumer")
            .field("name", &self.name)
            .field("owned", &self.owned)
            .field("warms", &self.warms)
            .field("releases", &self.releases)
            .field("history", &self.history.iter().map(|(_, c)| describe(c)).collect::<Vec<_>>())
            .field("ended", &self.ended)
            .finish()
    }
}

/// A short description of a command, for messages.
pub fn describe(command: &AssignmentCommand) -> String {
    let part = |tp: &Option<TopicPartition>| tp.as_ref().map_or(u32::MAX, |tp| tp.partition);
    match &command.command {
        Some(Command::Assignment(u)) => format!(
            "Assignment(+{:?} -{:?})",
            u.assigned.iter().map(|t| t.partition).collect::<Vec<_>>(),
            u.unassigned.iter().map(|t| t.partition).collect::<Vec<_>>()
        ),
        Some(Command::Warm(w)) => format!("Warm({} from {})", part(&w.partition), w.current_owner),
        Some(Command::Release(r)) => format!("Release({} to {})", part(&r.partition), r.new_owner),
        None => "empty".into(),
    }
}

impl TestConsumer {
    /// Calls `Register` on `client` and starts reading the stream.
    pub async fn register(
        mut client: KafkaAssignerClient<Channel>,
        name: &str,
        topic: &str,
    ) -> Result<TestConsumer, Status> {
        let request = RegisterRequest { consumer_name: name.into(), topic: topic.into() };
        let stream = client.register(request).await?.into_inner();
        Ok(Self::from_stream(client, name, topic, stream))
    }

    /// Starts reading a `Register` stream opened on `client`.
    pub fn from_stream(
        client: KafkaAssignerClient<Channel>,
        name: &str,
        topic: &str,
        stream: tonic::Streaming<AssignmentCommand>,
    ) -> TestConsumer {
        let (tx, events) = mpsc::unbounded_channel();
        let reader = tokio::spawn(read_stream(stream, tx));
        TestConsumer {
            name: name.into(),
            topic: topic.into(),
            client,
            events,
            reader: Some(reader),
            owned: BTreeSet::new(),
            warms: BTreeMap::new(),
            releases: BTreeMap::new(),
            history: Vec::new(),
            ended: None,
            ended_at: None,
        }
    }

    /// A clone of its gRPC client (same connection).
    pub fn client(&self) -> KafkaAssignerClient<Channel> {
        self.client.clone()
    }

    /// Number of commands received so far.
    pub fn seen(&self) -> usize {
        self.history.len()
    }

    /// Commands received since `from` (an earlier [`seen`](Self::seen)).
    pub fn since(&self, from: usize) -> Vec<&AssignmentCommand> {
        self.history[from..].iter().map(|(_, c)| c).collect()
    }

    fn apply(&mut self, received: Received) {
        match received {
            Received::End(at, end) => {
                self.ended = Some(end);
                self.ended_at = Some(at);
            }
            Received::Command(at, command) => {
                match &command.command {
                    Some(Command::Assignment(update)) => {
                        for tp in &update.assigned {
                            assert_eq!(
                                tp.topic, self.topic,
                                "{}: assigned a partition of another topic",
                                self.name
                            );
                            self.owned.insert(tp.partition);
                            self.warms.remove(&tp.partition);
                        }
                        for tp in &update.unassigned {
                            self.owned.remove(&tp.partition);
                            self.warms.remove(&tp.partition);
                            self.releases.remove(&tp.partition);
                        }
                    }
                    Some(Command::Warm(warm)) => {
                        let tp = warm.partition.as_ref().expect("WarmPartition without a partition");
                        self.warms.insert(tp.partition, warm.current_owner.clone());
                    }
                    Some(Command::Release(release)) => {
                        let tp = release.partition.as_ref().expect("ReleasePartition without a partition");
                        self.releases.insert(tp.partition, release.new_owner.clone());
                    }
                    None => panic!("{}: a command with nothing in it", self.name),
                }
                self.history.push((at, command));
            }
        }
    }

    /// Applies everything received so far, without waiting.
    pub fn poll_now(&mut self) {
        while self.ended.is_none() {
            match self.events.try_recv() {
                Ok(received) => self.apply(received),
                Err(_) => break,
            }
        }
    }

    /// Waits up to `deadline` for the next stream event and applies it; false on timeout.
    async fn pump(&mut self, deadline: Duration) -> bool {
        if self.ended.is_some() {
            return false;
        }
        match tokio::time::timeout(deadline, self.events.recv()).await {
            Ok(Some(received)) => {
                self.apply(received);
                true
            }
            Ok(None) => {
                self.ended.get_or_insert(Ok(()));
                self.ended_at.get_or_insert_with(std::time::Instant::now);
                true
            }
            Err(_) => false,
        }
    }

    /// The next command, panicking if none comes within `deadline` or the stream ends.
    pub async fn next(&mut self, deadline: Duration, what: &str) -> AssignmentCommand {
        let before = self.history.len();
        if !self.pump(deadline).await {
            panic!("{}: timed out after {deadline:?} waiting for {what}; {self:?}", self.name);
        }
        if self.history.len() == before {
            panic!("{}: stream ended while waiting for {what}: {self:?}", self.name);
        }
        self.history[before].1.clone()
    }

    /// The first message must be the snapshot: an `AssignmentUpdate` with nothing
    /// unassigned. Returns its partitions.
    pub async fn expect_snapshot(&mut self) -> BTreeSet<u32> {
        assert!(self.history.is_empty(), "{}: the snapshot was already received: {self:?}", self.name);
        let first = self.next(PROMPT, "the snapshot").await;
        match first.command {
            Some(Command::Assignment(update)) if update.unassigned.is_empty() => {
                update.assigned.iter().map(|tp| tp.partition).collect()
            }
            other => {
                panic!("{}: the first message must be an AssignmentUpdate snapshot, got {other:?}", self.name)
            }
        }
    }

    /// Applies commands until `pred` holds; panics after `deadline` or if the stream ends.
    pub async fn wait_for(&mut self, deadline: Duration, what: &str, pred: impl Fn(&TestConsumer) -> bool) {
        let give_up = tokio::time::Instant::now() + deadline;
        loop {
            self.poll_now();
            if pred(self) {
                return;
            }
            if self.ended.is_some() {
                panic!("{}: stream ended while waiting until {what}: {self:?}", self.name);
            }
            let left = give_up.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() || !self.pump(left).await {
                panic!("{}: timed out after {deadline:?} waiting until {what}: {self:?}", self.name);
            }
        }
    }

    /// Waits until it owns exactly `n` partitions.
    pub async fn wait_owned(&mut self, n: usize, deadline: Duration) {
        self.wait_for(deadline, &format!("it owns {n} partitions"), |c| c.owned.len() == n).await;
    }

    /// Waits until it has `n` warms to answer.
    pub async fn wait_warms(&mut self, n: usize, deadline: Duration) {
        self.wait_for(deadline, &format!("it has {n} warms to answer"), |c| c.warms.len() == n).await;
    }

    /// Sends `PartitionReady(p)` on its own connection.
    pub async fn ready(&mut self, partition: u32) -> Result<(), Status> {
        let request =
            PartitionReadyRequest { consumer_name: self.name.clone(), partition: tp(&self.topic, partition) };
        self.client.partition_ready(request).await?;
        self.warms.remove(&partition);
        Ok(())
    }

    /// Answers every pending warm with `PartitionReady`; panics on a refusal.
    pub async fn ready_all(&mut self) {
        for partition in self.warms.keys().copied().collect::<Vec<_>>() {
            if let Err(status) = self.ready(partition).await {
                panic!("{}: PartitionReady({partition}) refused: {status:?}", self.name);
            }
        }
    }

    /// Sends `PartitionReleased(p)` on its own connection; it then no longer owns `p`.
    pub async fn released(&mut self, partition: u32) -> Result<(), Status> {
        let request = PartitionReleasedRequest {
            consumer_name: self.name.clone(),
            partition: tp(&self.topic, partition),
        };
        self.client.partition_released(request).await?;
        self.releases.remove(&partition);
        self.owned.remove(&partition);
        Ok(())
    }

    /// Answers every pending release with `PartitionReleased`; panics on a refusal.
    pub async fn release_all(&mut self) {
        for partition in self.releases.keys().copied().collect::<Vec<_>>() {
            if let Err(status) = self.released(partition).await {
                panic!("{}: PartitionReleased({partition}) refused: {status:?}", self.name);
            }
        }
    }

    /// Applies what has arrived, then answers every pending warm (`PartitionReady`; a
    /// refusal means the warm was cancelled meanwhile and an unassign follows, so it is
    /// dropped) and every pending release.
    pub async fn answer_all(&mut self) {
        self.poll_now();
        for partition in self.warms.keys().copied().collect::<Vec<_>>() {
            if self.ready(partition).await.is_err() {
                self.warms.remove(&partition);
            }
        }
        self.release_all().await;
    }

    /// Calls `Deregister` for itself.
    pub async fn deregister(&mut self) -> Result<DeregisterAction, Status> {
        let response = self.client.deregister(DeregisterRequest { consumer_name: self.name.clone() }).await?;
        let action = response.into_inner().action;
        Ok(DeregisterAction::try_from(action).unwrap_or_else(|_| panic!("unknown DeregisterAction {action}")))
    }

    /// Drops its stream, like a consumer process dying (the connection's stream is reset).
    pub async fn crash(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.abort();
            let _ = reader.await;
        }
        self.events.close();
        self.ended.get_or_insert(Ok(()));
        self.ended_at.get_or_insert_with(std::time::Instant::now);
    }

    /// Applies commands until the stream ends; returns how it ended.
    pub async fn expect_end(&mut self, deadline: Duration) -> Result<(), Status> {
        let give_up = tokio::time::Instant::now() + deadline;
        while self.ended.is_none() {
            let left = give_up.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() || !self.pump(left).await {
                panic!("{}: the stream did not end within {deadline:?}: {self:?}", self.name);
            }
        }
        self.ended.clone().unwrap_or(Ok(()))
    }

    /// Asserts that nothing arrives for `quiet` (it costs `quiet`).
    pub async fn assert_quiet(&mut self, quiet: Duration) {
        self.poll_now();
        let before = self.history.len();
        let ended_before = self.ended.is_some();
        let _ = self.pump(quiet).await;
        assert!(
            self.history.len() == before && self.ended.is_some() == ended_before,
            "{}: expected nothing for {quiet:?}, got {:?}",
            self.name,
            self.since(before).iter().map(|c| describe(c)).collect::<Vec<_>>()
        );
    }
}

impl Drop for TestConsumer {
    fn drop(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.abort();
        }
    }
}

/// Drives `consumers` (answering every warm and release) until `topic` is stable on the
/// first instance's status, which lists every consumer, and every consumer's view matches
/// it; returns that status.
pub async fn settle(
    cluster: &TestCluster,
    topic_name: &str,
    consumers: &mut [&mut TestConsumer],
    deadline: Duration,
) -> StatusView {
    let give_up = tokio::time::Instant::now() + deadline;
    loop {
        for consumer in consumers.iter_mut() {
            consumer.answer_all().await;
        }
        let status = cluster.status().await;
        // Every consumer must be in the view: one registered on another instance may not
        // be in this instance's mirror yet, and the topic looks stable without it.
        if let Some(t) = try_topic(&status, topic_name)
            && is_stable(t)
            && consumers.iter().all(|c| {
                c.warms.is_empty()
                    && c.releases.is_empty()
                    && owned_by(t, &c.name) == c.owned
                    && c.ended.is_none()
                    && t.consumers.iter().any(|view| view.name == c.name)
            })
        {
            return status;
        }
        if tokio::time::Instant::now() >= give_up {
            panic!(
                "topic {topic_name} did not settle within {deadline:?}; status: {}; consumers: {consumers:#?}",
                json(&status)
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Percentile `q` (0..=1) of sorted `samples`.
pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// A test instance's coordinator: its state machine stepped by the production driver
/// (`handoff_backend::machine::start_driven`, `fleet_backend::machine::start_driven`).
#[derive(Clone)]
pub struct TestCoordinator(Arc<MachineCoordinator>);

impl TestCoordinator {
    /// Starts a warm-handoff instance of `config` over `store`.
    pub async fn start(
        store: Arc<dyn LeaseStore>,
        config: HandoffConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, kafka_assigner::coordinator::CoordinatorError> {
        let driven =
            kafka_assigner::coordinator::handoff_backend::machine::start_driven(store, config, metrics)
                .await?;
        Ok(Self(Arc::new(driven)))
    }

    /// Starts a fleet instance of `config` over `store`.
    pub async fn start_fleet(
        store: Arc<dyn LeaseStore>,
        config: kafka_assigner::coordinator::FleetConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, kafka_assigner::coordinator::CoordinatorError> {
        let driven =
            kafka_assigner::coordinator::fleet_backend::machine::start_driven(store, config, metrics).await?;
        Ok(Self(Arc::new(driven)))
    }

    /// What the servers serve.
    pub fn served(&self) -> Arc<dyn ConsumerGroupCoordinator> {
        self.0.clone()
    }

    /// Stops the instance as if its process died.
    pub fn crash(&self) {
        self.0.crash()
    }

    /// Whether the instance leads now (a fleet instance never does).
    pub fn is_leader(&self) -> bool {
        self.0.is_leader()
    }

    /// Its status view.
    pub async fn status(&self) -> StatusView {
        self.served().status().await
    }

    /// Registers `consumer` for `topic` directly (no gRPC).
    pub async fn register(
        &self,
        consumer: &str,
        topic: &str,
    ) -> Result<kafka_assigner::coordinator::CommandStream, kafka_assigner::coordinator::CoordinatorError>
    {
        self.served().register(consumer, topic).await
    }
}
