//! The warm-handoff coordinator over a [`LeaseStore`] (the `memory` and `etcd` backends).
//!
//! Every instance runs three kinds of task around one shared [`Cache`]:
//! * the **watcher** (the shared `coordinator/mirror.rs`) keeps the cache equal to the
//!   store (snapshot, then a prefix watch; re-read on any watch error and periodically)
//!   and, after every revision, the relay (`relay.rs`) sends each locally connected
//!   consumer the commands derived from the new state;
//! * the **leader loop** (`leader.rs`) campaigns for the leader key and, while it leads,
//!   reconciles every topic with [`crate::handoff::plan`], writing the result in batched
//!   transactions fenced by its leadership;
//! * one **session task** per local stream (`session.rs`) keeps the consumer's session
//!   alive while its stream is open (and through a restart grace), then lets it go.
//!
//! `PartitionReady` / `PartitionReleased` are applied here, by whichever instance receives
//! them, with compare-and-swap on the handoff record (`calls.rs`): no leader round trip.

mod calls;
mod leader;
mod relay;
mod session;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, atomic::AtomicBool},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::{
    CommandStream, ConsumerGroupCoordinator, CoordinatorError, StatusView, cache::Cache, mirror::Mirror,
    records::Keys,
};
use crate::config::DrainPolicy;
use crate::handoff::{Millis, PlanConfig};
use crate::kafka::KafkaMetadata;
use crate::metrics::Metrics;
use crate::proto::v1::DeregisterAction;
use crate::store::LeaseStore;

use relay::Streams;

/// Settings of a [`HandoffCoordinator`].
#[derive(Clone, Debug)]
pub struct HandoffConfig {
    /// This instance's id (in consumer records and the leader key).
    pub instance_id: String,
    /// The backend's name, for the status view.
    pub backend: String,
    /// Key prefix everything is stored under.
    pub prefix: String,
    /// TTL of consumer and instance sessions.
    pub lease_ttl: Duration,
    /// Warm/release time limits and the warm cap.
    pub plan: PlanConfig,
    /// How long a `SHUTDOWN_NOW` consumer's partitions are held for its return.
    pub restart_grace: Duration,
    /// What `Deregister` answers.
    pub drain_policy: DrainPolicy,
    /// Decides `Deregister` instead of `drain_policy` when set (`--drain-policy k8s`).
    pub drain_decider: Option<Arc<dyn crate::drain::DrainDecider>>,
    /// Partition counts known without Kafka (topic → count); they override Kafka.
    pub topic_partitions: BTreeMap<String, u32>,
    /// Where the partition counts of other topics come from (`--kafka-brokers`); `None`:
    /// only `topic_partitions`.
    pub kafka: Option<Arc<KafkaMetadata>>,
    /// How often the leader asks Kafka for the counts of stored topics (growth).
    pub topic_refresh_interval: Duration,
    /// How often the leader reconciles without a change (time limits, resync).
    pub reconcile_interval: Duration,
    /// How often the watcher re-reads the whole prefix as a safety net.
    pub resync_interval: Duration,
}

impl Default for HandoffConfig {
    fn default() -> Self {
        Self {
            instance_id: "kafka-assigner".into(),
            backend: "memory".into(),
            prefix: "/kafka-assigner/".into(),
            lease_ttl: Duration::from_secs(10),
            plan: PlanConfig::default(),
            restart_grace: Duration::from_secs(30),
            drain_policy: DrainPolicy::ShutdownNow,
            drain_decider: None,
            topic_partitions: BTreeMap::new(),
            kafka: None,
            topic_refresh_interval: Duration::from_secs(60),
            reconcile_interval: Duration::from_secs(1),
            resync_interval: Duration::from_secs(300),
        }
    }
}

/// State shared by the coordinator's tasks.
struct Inner {
    store: Arc<dyn LeaseStore>,
    keys: Keys,
    config: HandoffConfig,
    /// The store's state as last seen by the watcher, and the channel bumped (with the
    /// cache revision) after every applied revision.
    mirror: Mirror<Cache>,
    /// Streams of the consumers connected to this instance.
    streams: Mutex<Streams>,
    /// Whether this instance currently leads.
    leading: AtomicBool,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
}

/// Wall-clock milliseconds: handoff ages are stored, so they must survive a failover.
fn now_ms() -> Millis {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as Millis)
}

impl Inner {
    fn lock_streams(&self) -> std::sync::MutexGuard<'_, Streams> {
        self.streams.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The warm-handoff coordinator (see the module docs).
#[derive(Clone)]
pub struct HandoffCoordinator {
    inner: Arc<Inner>,
}

impl HandoffCoordinator {
    /// Starts the coordinator's tasks over `store`. Returns once the first snapshot is
    /// loaded, or fails if the store cannot be read.
    pub async fn start(
        store: Arc<dyn LeaseStore>,
        config: HandoffConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, CoordinatorError> {
        let keys = Keys::new(&config.prefix);
        let mirror = Mirror::load(&*store, &keys, "handoff").await?;
        let inner = Arc::new(Inner {
            store,
            keys,
            config,
            mirror,
            streams: Mutex::new(Streams::default()),
            leading: AtomicBool::new(false),
            metrics,
            shutdown: CancellationToken::new(),
        });
        tokio::spawn(relay::watch_loop(inner.clone()));
        tokio::spawn(leader::leader_loop(inner.clone()));
        tracing::info!(instance = %inner.config.instance_id, backend = %inner.config.backend, "coordinator started");
        Ok(Self { inner })
    }

    /// Stops every task of this instance abruptly, as if the process died: no stream is
    /// ended cleanly, no session revoked, leadership not resigned (sessions then expire
    /// after their TTL). For failover tests.
    pub fn crash(&self) {
        self.inner.shutdown.cancel();
        self.inner.leading.store(false, std::sync::atomic::Ordering::SeqCst);
        self.inner.lock_streams().crash_all();
    }

    /// Whether this instance currently leads.
    pub fn is_leader(&self) -> bool {
        self.inner.leading.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[async_trait]
impl ConsumerGroupCoordinator for HandoffCoordinator {
    async fn register(&self, consumer: &str, topic: &str) -> Result<CommandStream, CoordinatorError> {
        session::register(&self.inner, consumer, topic).await
    }

    async fn partition_ready(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
    ) -> Result<(), CoordinatorError> {
        calls::partition_ready(&self.inner, consumer, topic, partition).await
    }

    async fn partition_released(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
    ) -> Result<(), CoordinatorError> {
        calls::partition_released(&self.inner, consumer, topic, partition).await
    }

    async fn deregister(&self, consumer: &str) -> Result<DeregisterAction, CoordinatorError> {
        calls::deregister(&self.inner, consumer).await
    }

    async fn status(&self) -> StatusView {
        calls::status(&self.inner)
    }

    async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        relay::end_all_streams(&self.inner);
        leader::resign(&self.inner).await;
    }
}
