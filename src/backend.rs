//! The backend factory: builds the coordinator (and its store) that `kafka-assigner serve`'s
//! flags ask for (docs/design.md §2). The server only serves what this returns.

use std::sync::Arc;

use crate::config::{Backend, DrainPolicy, PlacementArg, ServeArgs, StoreKind};
use crate::coordinator::{
    ConsumerGroupCoordinator, CoordinatorError, FleetConfig, HandoffConfig, PartitionCounts, StaticConfig,
    StaticCoordinator, fleet_backend, handoff_backend,
};
use crate::drain::{DrainDecider, FixedDecider, K8sDrainDecider, K8sSettings, RolloutView};
use crate::epoch_floor::{FloorError, FloorFile, Reservation, now_micros, spawn_keeper};
use crate::handoff::{PlacementMode, PlacementSettings, PlanConfig};
use crate::kafka::KafkaMetadata;
use crate::kafka_load::{KafkaLoad, Learning};
use crate::metrics::Metrics;
use crate::store::{EtcdStore, EtcdStoreConfig, LeaseStore, MemoryStore, MeteredStore, Revision};
use crate::weights::{ExplicitWeights, WeightSource, WeightsError};

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
    /// `--drain-policy k8s` could not build its Kubernetes client.
    #[error("{0}")]
    Drain(#[from] crate::drain::DrainError),
    /// `--partition-weights` / `--partition-weights-file` cannot be used.
    #[error("{0}")]
    Weights(#[from] WeightsError),
    /// The Kafka client that learns partition weights could not be created.
    #[error("{0}")]
    KafkaLoad(#[from] crate::kafka_load::KafkaLoadError),
    /// The epoch floor in `--state-dir` cannot be read or written.
    #[error(transparent)]
    EpochFloor(#[from] FloorError),
}

/// What `--drain-policy` builds: the `Deregister` decider and, under `k8s`, the Kubernetes
/// view (rollouts, and what is known of each consumer pod).
pub struct DrainSetup {
    /// Decides `Deregister`.
    pub decider: Arc<dyn DrainDecider>,
    /// Whether consumers are rolling out, and their zone, capacity and generation (`None`:
    /// not under `k8s`, or `--k8s-rollout-refresh 0s`).
    pub rollout: Option<Arc<dyn RolloutView>>,
}

/// The `Deregister` decider `--drain-policy` asks for: the Kubernetes API for `k8s`
/// (in-cluster config or kubeconfig), with its rollout view, else the fixed answer.
pub async fn drain_from_args(args: &ServeArgs) -> Result<DrainSetup, BackendError> {
    if args.drain_policy != DrainPolicy::K8s {
        return Ok(DrainSetup { decider: Arc::new(FixedDecider(args.drain_policy)), rollout: None });
    }
    let settings = K8sSettings { namespace: args.k8s_namespace.clone(), timeout: args.k8s_timeout };
    let decider = K8sDrainDecider::from_environment(&settings).await?;
    tracing::info!(namespace = decider.namespace(), "Deregister asks the Kubernetes API about consumer pods");
    let rollout: Option<Arc<dyn RolloutView>> = if args.k8s_rollout_refresh.is_zero() {
        None
    } else {
        Some(Arc::new(decider.rollout_view(args.k8s_rollout_refresh)))
    };
    Ok(DrainSetup { decider: Arc::new(decider), rollout })
}

/// Builds the coordinator `args` ask for.
pub async fn coordinator_from_args(
    args: &ServeArgs,
    metrics: Arc<Metrics>,
) -> Result<Arc<dyn ConsumerGroupCoordinator>, BackendError> {
    let store_kind = match args.backend {
        Backend::Static => return static_from_args(args, metrics),
        Backend::Fleet => args.store,
        Backend::Memory => StoreKind::Memory,
        Backend::Etcd => StoreKind::Etcd,
    };
    // Kafka settings and weights first: a bad one stops the start before anything connects.
    let kafka = kafka_from_args(args)?;
    let weights = weights_from_args(args)?;
    let drain = match args.backend {
        // The fleet drains nothing (Deregister is always SHUTDOWN_NOW), but under `k8s` its
        // member records take the consumers' info from the Kubernetes view.
        Backend::Fleet if args.drain_policy != DrainPolicy::K8s => None,
        _ => Some(drain_from_args(args).await?),
    };
    if store_kind == StoreKind::Etcd && args.state_dir.is_some() {
        tracing::warn!("--state-dir is ignored on etcd, which keeps the epochs' floors itself");
    }
    let store = open_store(store_kind, args, &metrics).await?;
    let instance_id = args.instance_id.clone().unwrap_or_else(crate::config::default_instance_id);
    if args.backend == Backend::Fleet {
        if weights.is_some() || args.placement == PlacementArg::Load {
            tracing::warn!(
                "the fleet backend places by count: --placement and partition weights are ignored"
            );
        }
        let config = FleetConfig {
            instance_id,
            backend: format!("fleet-{:?}", args.store).to_lowercase(),
            prefix: args.etcd_prefix.clone(),
            lease_ttl: args.lease_ttl,
            topic_partitions: args.topic_partitions.0.clone(),
            kafka,
            topic_refresh_interval: args.topic_refresh_interval,
            view: drain.and_then(|d| d.rollout),
            ..FleetConfig::default()
        };
        return Ok(Arc::new(fleet_backend::machine::start_driven(store, config, metrics).await?));
    }
    let config = HandoffConfig {
        instance_id,
        backend: format!("{:?}", args.backend).to_lowercase(),
        prefix: args.etcd_prefix.clone(),
        lease_ttl: args.lease_ttl,
        plan: PlanConfig {
            warm_timeout_ms: args.warm_timeout.as_millis() as u64,
            release_timeout_ms: args.release_timeout.as_millis() as u64,
            max_warming_per_consumer: args.max_warming as usize,
        },
        restart_grace: args.restart_grace,
        settle_period: args.settle_period,
        rebalance_delay: args.rebalance_delay,
        drain_policy: args.drain_policy,
        drain_decider: drain.as_ref().map(|d| d.decider.clone()),
        rollout: drain.and_then(|d| d.rollout),
        topic_partitions: args.topic_partitions.0.clone(),
        kafka,
        topic_refresh_interval: args.topic_refresh_interval,
        placement: placement_from_args(args),
        weights,
        weights_refresh: args.weights_refresh,
        leader_groups: args.leader_groups,
        ..HandoffConfig::default()
    };
    Ok(Arc::new(handoff_backend::machine::start_driven(store, config, metrics).await?))
}

/// The placement settings of `--placement`, `--load-tolerance`, `--load-min-gain`,
/// `--max-moves-per-minute` and `--move-cooldown`.
pub fn placement_from_args(args: &ServeArgs) -> PlacementSettings {
    let mode = match args.placement {
        PlacementArg::Count => PlacementMode::Count,
        PlacementArg::Load => PlacementMode::Load,
        PlacementArg::Shadow => PlacementMode::Shadow,
    };
    PlacementSettings {
        mode,
        tolerance: args.load_tolerance,
        min_gain: args.load_min_gain,
        max_moves_per_minute: args.max_moves_per_minute as usize,
        move_cooldown_ms: args.move_cooldown.as_millis() as u64,
    }
}

/// Where partition weights come from: the explicit weights of `--partition-weights` and
/// `--partition-weights-file` (the file watched every `--weights-refresh`) if either is
/// set; otherwise, with `--kafka-brokers`, weights learned from Kafka (produce rate, lag of
/// `--lag-group`; docs/design.md §11) every `--weights-refresh`. The operator's word wins:
/// someone who gives weights knows the load better than the offsets tell. A file that
/// cannot be read or parsed stops the start.
pub fn weights_from_args(args: &ServeArgs) -> Result<Option<Arc<dyn WeightSource>>, BackendError> {
    let kafka = !args.kafka_brokers.iter().all(|b| b.trim().is_empty());
    if args.partition_weights.is_none() && args.partition_weights_file.is_none() && kafka {
        let settings = args.kafka_load.settings(args.weights_refresh);
        let load = KafkaLoad::new(&args.kafka_brokers, &args.kafka_settings(), args.kafka_timeout, settings)?;
        let learning = Learning::start(load);
        tracing::info!(source = %learning.describe(), "partition weights are learned from Kafka");
        return Ok(Some(Arc::new(learning)));
    }
    if args.partition_weights.is_none() && args.partition_weights_file.is_none() {
        if args.placement == PlacementArg::Load {
            tracing::warn!(
                "--placement load without --partition-weights[-file]: partitions weigh what their topic \
                 records say (1 unless something stored weights)"
            );
        }
        return Ok(None);
    }
    let flag = args.partition_weights.clone().unwrap_or_default();
    let weights = Arc::new(ExplicitWeights::new(flag, args.partition_weights_file.clone())?);
    // The task ends when the coordinator drops the weights.
    let _ = ExplicitWeights::watch(&weights, args.weights_refresh);
    tracing::info!(source = %weights.describe(), "partition weights given by the operator");
    Ok(Some(weights))
}

/// The Kafka metadata client of `--kafka-brokers` (with `--kafka-config`), if set.
fn kafka_from_args(args: &ServeArgs) -> Result<Option<Arc<dyn PartitionCounts>>, BackendError> {
    if args.kafka_brokers.iter().all(|b| b.trim().is_empty()) {
        if !args.kafka_config.is_empty() {
            tracing::warn!("--kafka-config is ignored without --kafka-brokers");
        }
        return Ok(None);
    }
    let kafka = KafkaMetadata::new(&args.kafka_brokers, &args.kafka_settings(), args.kafka_timeout)?;
    tracing::info!(
        brokers = kafka.brokers(),
        "partition counts of topics not in --topic-partitions come from Kafka"
    );
    Ok(Some(Arc::new(kafka)))
}

/// Opens the lease store `kind` (etcd at `--etcd-endpoints`), metered into `metrics`.
async fn open_store(
    kind: StoreKind,
    args: &ServeArgs,
    metrics: &Arc<Metrics>,
) -> Result<Arc<dyn LeaseStore>, BackendError> {
    let store: Arc<dyn LeaseStore> = match kind {
        StoreKind::Memory => memory_store(args, metrics)?,
        StoreKind::Etcd => {
            let security = args.etcd_security.security().map_err(BackendError::Config)?;
            let config = EtcdStoreConfig {
                endpoints: args.etcd_endpoints.clone(),
                security,
                // A watch then speaks at least every quarter TTL; one silent for three
                // quarters is stale (`coordinator::shared::mirror`).
                watch_progress_every: args.lease_ttl / 4,
                ..EtcdStoreConfig::default()
            };
            Arc::new(EtcdStore::connect(config).await.map_err(CoordinatorError::from)?)
        }
    };
    Ok(Arc::new(MeteredStore::new(store, metrics.clone())))
}

/// The memory store. Its revisions (and so the ownership epochs, docs/design.md §10) start
/// at the clock, above any an earlier run handed out unless the clock went back; with
/// `--state-dir`, above the floor kept there too, which a task keeps ahead of the
/// revision and the clock while the store lives.
fn memory_store(args: &ServeArgs, metrics: &Metrics) -> Result<Arc<dyn LeaseStore>, BackendError> {
    let Some(dir) = &args.state_dir else {
        return Ok(Arc::new(MemoryStore::starting_now()));
    };
    let (start, reservation) = Reservation::begin(FloorFile::open(dir)?, now_micros())?;
    let start = Revision::try_from(start).unwrap_or(Revision::MAX / 2);
    let store = Arc::new(MemoryStore::starting_at(start));
    let failures = metrics.epoch_floor_renewal_failures.clone();
    spawn_keeper(
        reservation,
        Arc::downgrade(&store),
        |store: &MemoryStore| u64::try_from(store.revision()).unwrap_or(0).max(now_micros()),
        move || {
            failures.inc();
        },
    );
    Ok(store)
}

/// The `static` backend's epoch for this run with `--state-dir` (`dir`): above the floor
/// kept there and at least the clock, so a restart, which is how a static configuration
/// changes, raises every partition's epoch. Without it the configuration's default stands.
fn static_epoch(dir: &std::path::Path) -> Result<u64, BackendError> {
    let (epoch, _reservation) = Reservation::begin(FloorFile::open(dir)?, now_micros())?;
    Ok(epoch)
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
    let config = match &args.state_dir {
        Some(dir) => config.with_epoch(static_epoch(dir)?),
        None => config,
    };
    Ok(Arc::new(StaticCoordinator::new(config, metrics)))
}
