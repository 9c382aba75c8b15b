//! The `fleet` backend: per-partition leases claimed without a leader and without warm
//! handoffs (the Kinesis Client Library model), over any [`LeaseStore`].
//!
//! * Every partition has at most one lease record (`{prefix}fleet/leases/{topic}/{p}`),
//!   created with compare-and-swap on its absence and bound to the owning consumer's
//!   session: two live leases on one partition cannot exist, and a crashed consumer's
//!   leases vanish with its session, one TTL after its stream dropped.
//! * The instance that holds a consumer's stream claims and renews on its behalf: it keeps
//!   the consumer's session alive while the stream is open, and on every change it sees
//!   (and on a timer) runs the consumer's claim step ([`share`]): claim free leases up to
//!   the consumer's fair share, give back the excess when membership grew.
//! * Every instance watches the prefix (the shared cache of `coordinator/mirror.rs`) and
//!   its relay (`relay.rs`) tells the local consumers the difference between the leases
//!   they hold and what they were told, as `AssignmentUpdate{assigned, unassigned}`; the
//!   first message is the snapshot.
//! * A partition given back is first `unassigned` on the giver's stream, then its lease is
//!   deleted: a consumer that is alive has always been told to stop before anyone else can
//!   claim the partition. Without warm handoffs the new owner starts cold.
//! * `PartitionReady` / `PartitionReleased` are `FAILED_PRECONDITION` (no handoffs).
//!   `Deregister` marks the member as leaving: the holding instance tells the consumer
//!   `unassigned` for all its partitions, ends the stream cleanly and revokes the session,
//!   so its leases are free at once (not one TTL later); the answer is `SHUTDOWN_NOW`.
//! * Re-registering a name (within the TTL, on any instance) moves the member record and
//!   all its leases to the new session in one transaction: no partition moves, and the old
//!   stream ends with `ABORTED` (or, if it had dropped, is simply forgotten).

mod calls;
mod member;
mod relay;
pub mod share;
mod state;

pub use state::{FleetKeys, LeaseRecord, MemberRecord};

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::{CommandStream, ConsumerGroupCoordinator, CoordinatorError, StatusView, mirror::Mirror};
use crate::metrics::Metrics;
use crate::proto::v1::DeregisterAction;
use crate::store::LeaseStore;

use relay::Streams;
use state::FleetCache;

/// Settings of a [`FleetCoordinator`].
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// This instance's id (in member records and the status view).
    pub instance_id: String,
    /// The store's name, for the status view (`fleet-memory`, `fleet-etcd`).
    pub backend: String,
    /// Key prefix; the fleet stores everything under `{prefix}fleet/`.
    pub prefix: String,
    /// TTL of consumer sessions: a crashed consumer's leases are free after this.
    pub lease_ttl: Duration,
    /// Partition counts by topic (`--topic-partitions`); see [`FleetConfig::partition_count`].
    pub topic_partitions: BTreeMap<String, u32>,
    /// How often each local consumer's claim step runs without a change (safety net).
    pub claim_interval: Duration,
    /// How often the watcher re-reads the whole prefix as a safety net.
    pub resync_interval: Duration,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            instance_id: "kafka-assigner".into(),
            backend: "fleet".into(),
            prefix: "/kafka-assigner/".into(),
            lease_ttl: Duration::from_secs(10),
            topic_partitions: BTreeMap::new(),
            claim_interval: Duration::from_secs(1),
            resync_interval: Duration::from_secs(300),
        }
    }
}

impl FleetConfig {
    /// The configured partition count of `topic`, if any. The one place the fleet learns
    /// partition counts from outside the store (a Kafka lookup would go here).
    pub fn partition_count(&self, topic: &str) -> Option<u32> {
        self.topic_partitions.get(topic).copied()
    }
}

/// State shared by the coordinator's tasks.
struct Inner {
    store: Arc<dyn LeaseStore>,
    keys: FleetKeys,
    config: FleetConfig,
    /// The store's state as last seen by the watcher, and the channel bumped (with the
    /// cache revision) after every applied revision; it wakes claim steps.
    mirror: Mirror<FleetCache>,
    /// Streams of the consumers connected to this instance.
    streams: Mutex<Streams>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
}

impl Inner {
    fn lock_streams(&self) -> std::sync::MutexGuard<'_, Streams> {
        self.streams.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The fleet coordinator (see the module docs).
#[derive(Clone)]
pub struct FleetCoordinator {
    inner: Arc<Inner>,
}

impl FleetCoordinator {
    /// Starts the coordinator's watcher over `store`. Returns once the first snapshot is
    /// loaded, or fails if the store cannot be read.
    pub async fn start(
        store: Arc<dyn LeaseStore>,
        config: FleetConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, CoordinatorError> {
        let keys = FleetKeys::new(&config.prefix);
        let mirror = Mirror::load(&*store, &keys, "fleet").await?;
        let inner = Arc::new(Inner {
            store,
            keys,
            config,
            mirror,
            streams: Mutex::new(Streams::default()),
            metrics,
            shutdown: CancellationToken::new(),
        });
        tokio::spawn(relay::watch_loop(inner.clone()));
        tracing::info!(instance = %inner.config.instance_id, backend = %inner.config.backend, "fleet coordinator started");
        Ok(Self { inner })
    }

    /// Stops every task of this instance abruptly, as if the process died: streams break
    /// with an error, no session is revoked (the consumers' sessions then expire after
    /// their TTL and their leases are claimed by the others). For failover tests.
    pub fn crash(&self) {
        self.inner.shutdown.cancel();
        self.inner.lock_streams().crash_all();
    }
}

#[async_trait]
impl ConsumerGroupCoordinator for FleetCoordinator {
    async fn register(&self, consumer: &str, topic: &str) -> Result<CommandStream, CoordinatorError> {
        member::register(&self.inner, consumer, topic).await
    }

    async fn partition_ready(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
    ) -> Result<(), CoordinatorError> {
        calls::no_handoffs(consumer, topic, partition)
    }

    async fn partition_released(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
    ) -> Result<(), CoordinatorError> {
        calls::no_handoffs(consumer, topic, partition)
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
    }
}
