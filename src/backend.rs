//! The backend factory: builds the coordinator (and its store) that `kafka-assigner serve`'s
//! flags ask for (DESIGN.md §2). The server only serves what this returns.

use std::sync::Arc;

use crate::config::{Backend, ServeArgs, StoreKind};
use crate::coordinator::{
    ConsumerGroupCoordinator, CoordinatorError, FleetConfig, FleetCoordinator, HandoffConfig,
    HandoffCoordinator, StaticConfig, StaticCoordinator,
};
use crate::handoff::PlanConfig;
use crate::kafka::KafkaMetadata;
use crate::metrics::Metrics;
use crate::store::{EtcdStore, EtcdStoreConfig, LeaseStore, MemoryStore};

/// Errors building a backend from flags.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend could not start (store unreachable, ...).
    #[error("backend failed to start: {0}")]
    Coordinator(#[from] CoordinatorError),
    /// A setting is malformed (the message names it).
    #[error("{0}")]
    Config(String),
    /// The Kafka client could not be created (`--kafka-brokers`, `--kafka-config`).
    #[error("--kafka-brokers / --kafka-config: {0}")]
    Kafka(#[from] crate::kafka::KafkaError),
}

/// Builds the coordinator `args` ask for.
pub async fn coordinator_from_args(
    args: &ServeArgs,
    metrics: Arc<Metrics>,
) -> Result<Arc<dyn ConsumerGroupCoordinator>, BackendError> {
    let store_kind = match args.backend {
        Backend::Static => return static_from_args(args, metrics),
        Backend::Fleet => return fleet_from_args(args, metrics).await,
        Backend::Memory => StoreKind::Memory,
        Backend::Etcd => StoreKind::Etcd,
    };
    // Kafka settings first: a bad one stops the start before anything connects.
    let kafka = if args.kafka_brokers.iter().all(|b| b.trim().is_empty()) {
        if !args.kafka_config.is_empty() {
            tracing::warn!("--kafka-config is ignored without --kafka-brokers");
        }
        None
    } else {
        let kafka = KafkaMetadata::new(&args.kafka_brokers, &args.kafka_settings(), args.kafka_timeout)?;
        tracing::info!(
            brokers = kafka.brokers(),
            "partition counts of topics not in --topic-partitions come from Kafka"
        );
        Some(Arc::new(kafka))
    };
    let store = open_store(store_kind, args).await?;
    let config = HandoffConfig {
        instance_id: args.instance_id.clone().unwrap_or_else(crate::config::default_instance_id),
        backend: format!("{:?}", args.backend).to_lowercase(),
        prefix: args.etcd_prefix.clone(),
        lease_ttl: args.lease_ttl,
        plan: PlanConfig {
            warm_timeout_ms: args.warm_timeout.as_millis() as u64,
            release_timeout_ms: args.release_timeout.as_millis() as u64,
            max_warming_per_consumer: args.max_warming as usize,
        },
        restart_grace: args.restart_grace,
        drain_policy: args.drain_policy,
        topic_partitions: args.topic_partitions.0.clone(),
        kafka,
        topic_refresh_interval: args.topic_refresh_interval,
        ..HandoffConfig::default()
    };
    Ok(Arc::new(HandoffCoordinator::start(store, config, metrics).await?))
}

/// Opens the lease store `kind` (etcd at `--etcd-endpoints`).
async fn open_store(kind: StoreKind, args: &ServeArgs) -> Result<Arc<dyn LeaseStore>, BackendError> {
    Ok(match kind {
        StoreKind::Memory => Arc::new(MemoryStore::new()),
        StoreKind::Etcd => {
            let security = args.etcd_security.security().map_err(BackendError::Config)?;
            let config = EtcdStoreConfig {
                endpoints: args.etcd_endpoints.clone(),
                security,
                ..EtcdStoreConfig::default()
            };
            Arc::new(EtcdStore::connect(config).await.map_err(CoordinatorError::from)?)
        }
    })
}

/// The `static` backend: parses `--static-assignment` / `--static-members` (or their
/// environment variables); a malformed value stops the start, naming the variable.
fn static_from_args(
    args: &ServeArgs,
    metrics: Arc<Metrics>,
) -> Result<Arc<dyn ConsumerGroupCoordinator>, BackendError> {
    let config = StaticConfig::from_settings(
        args.instance_id.clone().unwrap_or_else(crate::config::default_instance_id),
        args.topic_partitions.0.clone(),
        args.static_assignment.as_deref(),
        args.static_members.as_deref(),
    )
    .map_err(BackendError::Config)?;
    Ok(Arc::new(StaticCoordinator::new(config, metrics)))
}

/// The `fleet` backend over `--store`.
async fn fleet_from_args(
    args: &ServeArgs,
    metrics: Arc<Metrics>,
) -> Result<Arc<dyn ConsumerGroupCoordinator>, BackendError> {
    if !args.kafka_brokers.iter().all(|b| b.trim().is_empty()) {
        tracing::warn!("--kafka-brokers is not used by the fleet backend (only --topic-partitions)");
    }
    let store = open_store(args.store, args).await?;
    let config = FleetConfig {
        instance_id: args.instance_id.clone().unwrap_or_else(crate::config::default_instance_id),
        backend: format!("fleet-{:?}", args.store).to_lowercase(),
        prefix: args.etcd_prefix.clone(),
        lease_ttl: args.lease_ttl,
        topic_partitions: args.topic_partitions.0.clone(),
        ..FleetConfig::default()
    };
    Ok(Arc::new(FleetCoordinator::start(store, config, metrics).await?))
}
