//! Command-line and environment configuration of `kafka-assigner serve`.
//!
//! Every flag can also be set as `KAFKA_ASSIGNER_<FLAG_IN_CAPS>` (for example
//! `KAFKA_ASSIGNER_LEASE_TTL=5s`); a flag on the command line wins. Bad values stop the
//! server at start with a message naming the flag.

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Parser, Subcommand, ValueEnum};

pub mod kafka_load;
pub mod security;

pub use crate::drain::DrainPolicy;
use crate::duration::{humantime_or_zero, parse_duration};
pub use crate::weights::TopicWeights;
use crate::weights::parse_weights_flag;

/// Top-level command line.
#[derive(Debug, Parser)]
#[command(
    name = "kafka-assigner",
    version,
    about = "Assigns Kafka partitions to stateful consumers with warm handoffs"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,

    /// Log format: `plain` (human) or `json` (one object per line, for log pipelines);
    /// both carry the same fields.
    #[arg(long, global = true, env = "KAFKA_ASSIGNER_LOG_FORMAT", value_enum, default_value = "plain")]
    pub log_format: LogFormat,
}

/// How logs are written (to stderr).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
// Parsed once per process: the size of the larger variant does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Serve the gRPC API and the admin HTTP endpoints.
    Serve(ServeArgs),
    /// Show consumers, partitions, handoffs and the leader of a running assigner.
    Status(crate::cli::status::StatusArgs),
    /// Check a running assigner's admin `/ready` (exit 0 when ready): the images' healthcheck.
    Probe(crate::cli::probe::ProbeArgs),
}

/// Which coordinator and store to run (docs/design.md §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// Warm-handoff coordinator over the in-process store (one node).
    Memory,
    /// Warm-handoff coordinator over etcd (many instances).
    Etcd,
    /// Lease claiming without warm handoffs (Kinesis-KCL style) over `--store`.
    Fleet,
    /// Fixed partitions from the environment (`--static-assignment` or
    /// `--static-members`); no store, for local development.
    Static,
}

/// The lease store of the `fleet` backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    /// In-process (one node).
    Memory,
    /// etcd (`--etcd-endpoints`; many instances).
    Etcd,
}

/// How the handoff leader places partitions (docs/design.md §11); the fleet always places
/// by count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PlacementArg {
    /// By partition count, as before placement by load existed.
    Count,
    /// By partition weight, within `--load-tolerance`, budgeted and with cool-downs.
    Load,
    /// By count, and the load plan computed and published (`/status`, metrics) without
    /// acting on it: upgrading changes no placement.
    Shadow,
}

/// The values `--engine` accepts. The store-backed backends run one engine, their state
/// machine stepped by one driver task (docs/design.md §3); the flag is accepted so that a
/// deployment which names it keeps starting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Engine {
    /// The instance's state machine, stepped by one driver task
    /// (`coordinator/machine/driver/`): the step the whole-cluster simulation checks.
    Machine,
}

/// `kafka-assigner serve` flags.
#[derive(Clone, Debug, clap::Args)]
pub struct ServeArgs {
    /// Coordinator backend.
    #[arg(long, env = "KAFKA_ASSIGNER_BACKEND", value_enum, default_value = "memory")]
    pub backend: Backend,

    /// Lease store of the fleet backend.
    #[arg(long, env = "KAFKA_ASSIGNER_STORE", value_enum, default_value = "memory")]
    pub store: StoreKind,

    /// Static backend: partitions per consumer, e.g. `consumer-0=0-5;consumer-1=6,7,8-11`
    /// (inclusive ranges; `topic:` prefixes when several topics are configured).
    #[arg(long, env = "KAFKA_ASSIGNER_STATIC_ASSIGNMENT")]
    pub static_assignment: Option<String>,

    /// Static backend, when `--static-assignment` is unset: round-robin over this many
    /// members, by the number at the end of the consumer name (`pod-3` is member 3).
    #[arg(long, env = "KAFKA_ASSIGNER_STATIC_MEMBERS")]
    pub static_members: Option<String>,

    /// gRPC listen address.
    #[arg(long, env = "KAFKA_ASSIGNER_GRPC_ADDR", default_value = "127.0.0.1:50051")]
    pub grpc_addr: SocketAddr,

    /// Admin HTTP listen address (/live, /ready, /metrics, /status).
    #[arg(long, env = "KAFKA_ASSIGNER_ADMIN_ADDR", default_value = "127.0.0.1:9090")]
    pub admin_addr: SocketAddr,

    /// etcd endpoints, comma-separated (etcd backend).
    #[arg(
        long,
        env = "KAFKA_ASSIGNER_ETCD_ENDPOINTS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379"
    )]
    pub etcd_endpoints: Vec<String>,

    /// Key prefix for everything the assigner stores.
    #[arg(long, env = "KAFKA_ASSIGNER_ETCD_PREFIX", default_value = "/kafka-assigner/")]
    pub etcd_prefix: String,

    /// Partition counts known without asking Kafka, e.g. `events=12,orders=4`.
    #[arg(long, env = "KAFKA_ASSIGNER_TOPIC_PARTITIONS", value_parser = parse_topic_partitions, default_value = "")]
    pub topic_partitions: TopicPartitions,

    /// TTL of consumer sessions: a consumer whose stream drops loses its partitions after this.
    #[arg(long, env = "KAFKA_ASSIGNER_LEASE_TTL", value_parser = parse_duration, default_value = "10s")]
    pub lease_ttl: Duration,

    /// A warm not ready after this long is cancelled (and retried later).
    #[arg(long, env = "KAFKA_ASSIGNER_WARM_TIMEOUT", value_parser = parse_duration, default_value = "5m")]
    pub warm_timeout: Duration,

    /// A release not acknowledged after this long is completed anyway.
    #[arg(long, env = "KAFKA_ASSIGNER_RELEASE_TIMEOUT", value_parser = parse_duration, default_value = "1m")]
    pub release_timeout: Duration,

    /// How long a SHUTDOWN_NOW consumer's partitions are held for its return.
    #[arg(long, env = "KAFKA_ASSIGNER_RESTART_GRACE", value_parser = parse_duration, default_value = "30s")]
    pub restart_grace: Duration,

    /// After its view of the store was interrupted (just elected, watch broken, calls
    /// failed), how long the leader leaves the partitions of consumers whose registrations
    /// are gone, so that consumers coming straight back keep them (default: `--lease-ttl`).
    #[arg(long, env = "KAFKA_ASSIGNER_SETTLE_PERIOD", value_parser = parse_duration)]
    pub settle_period: Option<Duration>,

    /// While consumers of a topic are still arriving (joins less than this apart, or the
    /// first consumers of an empty group), the leader plans once they have been quiet this
    /// long (like Kafka's group.initial.rebalance.delay.ms); a single join is planned at once.
    #[arg(long, env = "KAFKA_ASSIGNER_REBALANCE_DELAY", value_parser = humantime_or_zero, default_value = "300ms")]
    pub rebalance_delay: Duration,

    /// What Deregister answers.
    #[arg(long, env = "KAFKA_ASSIGNER_DRAIN_POLICY", value_enum, default_value = "shutdown-now")]
    pub drain_policy: DrainPolicy,

    /// `--drain-policy k8s`: namespace of the consumers' pods (default: the assigner's own).
    #[arg(long, env = "KAFKA_ASSIGNER_K8S_NAMESPACE")]
    pub k8s_namespace: Option<String>,

    /// `--drain-policy k8s`: a Kubernetes lookup not answered within this is unknown.
    #[arg(long, env = "KAFKA_ASSIGNER_K8S_TIMEOUT", value_parser = parse_duration, default_value = "2s")]
    pub k8s_timeout: Duration,

    /// `--drain-policy k8s`: how often the Kubernetes view lists the consumers' pods and
    /// ReplicaSets (while a Deployment rolls out, its old pods receive no partitions and
    /// its new ones fill only to their final share; each pod's zone and capacity go into
    /// its consumer record). `0s`: no rollout awareness, and no zones or capacities.
    #[arg(long, env = "KAFKA_ASSIGNER_K8S_ROLLOUT_REFRESH", value_parser = humantime_or_zero, default_value = "2s")]
    pub k8s_rollout_refresh: Duration,

    /// Into how many groups the topics are split, each planned by its own elected
    /// instance, so that several instances share the planning and the fenced writes
    /// (handoff backend on etcd; docs/design.md §4). Every instance of one deployment must
    /// use the same count: an instance that sees another count's leader key does not
    /// campaign. 1: one leader plans every topic.
    #[arg(long, env = "KAFKA_ASSIGNER_LEADER_GROUPS", default_value = "1", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub leader_groups: u32,

    /// Accepted and ignored: `machine` is the only engine of the memory, etcd and fleet
    /// backends (hidden from `--help`).
    #[arg(long, env = "KAFKA_ASSIGNER_ENGINE", value_enum, hide = true)]
    pub engine: Option<Engine>,

    /// Partitions one consumer may warm at once (like Kafka Streams' max.warmup.replicas).
    #[arg(long, env = "KAFKA_ASSIGNER_MAX_WARMING", default_value = "4", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_warming: u32,

    /// This instance's id (default: host name and process id).
    #[arg(long, env = "KAFKA_ASSIGNER_INSTANCE_ID")]
    pub instance_id: Option<String>,

    /// Memory and static backends (and the fleet on `--store memory`): a directory where
    /// this instance keeps its epoch floor (`epoch-floor`), so the ownership epochs it hands
    /// out stay above every earlier run's even when the clock was stepped back (docs/design.md
    /// §10). One directory per instance, on a disk that survives restarts. Unset: epochs
    /// rest on the clock alone (memory), or are 1 for every run (static). etcd keeps its own.
    #[arg(long, env = "KAFKA_ASSIGNER_STATE_DIR")]
    pub state_dir: Option<PathBuf>,

    /// Kafka bootstrap brokers, comma-separated (`host:port`): partition counts of topics
    /// not in `--topic-partitions` are asked from Kafka. None: only `--topic-partitions`.
    #[arg(long, env = "KAFKA_ASSIGNER_KAFKA_BROKERS", value_delimiter = ',')]
    pub kafka_brokers: Vec<String>,

    /// Extra librdkafka setting `key=value` (SASL, TLS, ...), repeatable; in the
    /// environment, comma-separated.
    #[arg(long, env = "KAFKA_ASSIGNER_KAFKA_CONFIG", value_name = "KEY=VALUE", value_parser = parse_kafka_config)]
    pub kafka_config: Vec<KafkaConfig>,

    /// A Kafka metadata request not answered within this is `UNAVAILABLE`.
    #[arg(long, env = "KAFKA_ASSIGNER_KAFKA_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    pub kafka_timeout: Duration,

    /// How often the leader asks Kafka for the partition counts of known topics (growth).
    #[arg(long, env = "KAFKA_ASSIGNER_TOPIC_REFRESH_INTERVAL", value_parser = parse_duration, default_value = "60s")]
    pub topic_refresh_interval: Duration,

    /// How the leader places partitions (memory and etcd backends): `count`, `load` (by
    /// partition weight) or `shadow` (by count, publishing what `load` would move).
    #[arg(long, env = "KAFKA_ASSIGNER_PLACEMENT", value_enum, default_value = "shadow")]
    pub placement: PlacementArg,

    /// Placement by load: nothing moves for balance while every consumer's load is within
    /// this fraction above its share (max/mean ≤ 1 + tolerance).
    #[arg(long, env = "KAFKA_ASSIGNER_LOAD_TOLERANCE", value_parser = parse_fraction, default_value = "0.10")]
    pub load_tolerance: f64,

    /// Placement by load: a partition is never moved for balance to lower the highest
    /// normalized load by less than this (fraction of a share).
    #[arg(long, env = "KAFKA_ASSIGNER_LOAD_MIN_GAIN", value_parser = parse_fraction, default_value = "0.01")]
    pub load_min_gain: f64,

    /// Placement by load: moves of partitions away from a live consumer one topic may
    /// start per minute (failover and drains are never held back).
    #[arg(long, env = "KAFKA_ASSIGNER_MAX_MOVES_PER_MINUTE", default_value = "10", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_moves_per_minute: u32,

    /// Placement by load: after a partition was handed off, it does not move again for
    /// balance for this long (`0s`: no cool-down). Never holds back failover.
    #[arg(long, env = "KAFKA_ASSIGNER_MOVE_COOLDOWN", value_parser = humantime_or_zero, default_value = "5m")]
    pub move_cooldown: Duration,

    /// Partition weights, e.g. `events:0=10,1=3;orders:5=2` (unlisted partitions weigh 1).
    #[arg(long, env = "KAFKA_ASSIGNER_PARTITION_WEIGHTS", value_parser = parse_weights_flag)]
    pub partition_weights: Option<TopicWeights>,

    /// Partition weights as JSON, `{"events": {"0": 10, "1": 3}}`, re-read when it
    /// changes; where it and `--partition-weights` both give a topic, the file wins.
    #[arg(long, env = "KAFKA_ASSIGNER_PARTITION_WEIGHTS_FILE")]
    pub partition_weights_file: Option<PathBuf>,

    /// How often the weights file is looked at and the leader stores changed weights.
    #[arg(long, env = "KAFKA_ASSIGNER_WEIGHTS_REFRESH", value_parser = parse_duration, default_value = "10s")]
    pub weights_refresh: Duration,

    /// Partition weights learned from Kafka (with `--kafka-brokers`, unless weights are
    /// given): the rate window, the lag group and horizon, broker racks.
    #[command(flatten)]
    pub kafka_load: kafka_load::KafkaLoadArgs,

    /// TLS and credentials to etcd.
    #[command(flatten)]
    pub etcd_security: security::EtcdSecurityArgs,

    /// gRPC server TLS, consumer identity binding and limits.
    #[command(flatten)]
    pub security: security::ServerSecurityArgs,
}

impl ServeArgs {
    /// Every `--kafka-config` setting, in order (a later one for the same key wins).
    pub fn kafka_settings(&self) -> Vec<(String, String)> {
        self.kafka_config.iter().flat_map(|c| c.0.iter().cloned()).collect()
    }
}

/// librdkafka settings from one `--kafka-config` value. Debug shows the keys only
/// (values may be secrets).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaConfig(pub Vec<(String, String)>);

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|(key, _)| format!("{key}=<redacted>"))).finish()
    }
}

/// Partition counts by topic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicPartitions(pub BTreeMap<String, u32>);

/// Parses `events=12,orders=4` (empty: none).
pub fn parse_topic_partitions(text: &str) -> Result<TopicPartitions, String> {
    let mut map = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (topic, count) =
            part.split_once('=').ok_or_else(|| format!("'{part}' is not topic=count (e.g. events=12)"))?;
        let topic = topic.trim();
        crate::coordinator::validate_topic_name(topic).map_err(|e| e.to_string())?;
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| format!("'{part}': partition count '{}' is not a positive integer", count.trim()))?;
        if count == 0 {
            return Err(format!("'{part}': a topic has at least one partition"));
        }
        if map.insert(topic.to_string(), count).is_some() {
            return Err(format!("topic '{topic}' is listed twice"));
        }
    }
    Ok(TopicPartitions(map))
}

/// Parses a fraction such as `0.10`: a finite number ≥ 0.
pub fn parse_fraction(text: &str) -> Result<f64, String> {
    let value: f64 =
        text.trim().parse().map_err(|_| format!("'{text}' is not a number (e.g. 0.10 for 10 %)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("'{text}' must be a number ≥ 0 (e.g. 0.10 for 10 %)"));
    }
    Ok(value)
}

/// Parses `key=value` librdkafka settings, comma-separated (`security.protocol=SASL_SSL,
/// sasl.mechanism=PLAIN`). A comma followed by text without `=` belongs to the value
/// before it (`ssl.cipher.suites=A,B`).
pub fn parse_kafka_config(text: &str) -> Result<KafkaConfig, String> {
    let mut settings: Vec<(String, String)> = Vec::new();
    for part in text.split(',') {
        match part.split_once('=') {
            Some((key, value)) => {
                let key = key.trim();
                if key.is_empty() {
                    return Err(format!(
                        "'{part}' has no key; use key=value (e.g. security.protocol=SASL_SSL)"
                    ));
                }
                settings.push((key.to_string(), value.trim().to_string()));
            }
            None => match settings.last_mut() {
                Some((_, value)) => {
                    value.push(',');
                    value.push_str(part.trim());
                }
                None if part.trim().is_empty() => {}
                None => return Err(format!("'{part}' is not key=value (e.g. security.protocol=SASL_SSL)")),
            },
        }
    }
    if settings.is_empty() {
        return Err(format!("'{text}' is not key=value (e.g. security.protocol=SASL_SSL)"));
    }
    Ok(KafkaConfig(settings))
}

/// The default instance id: host name and process id.
pub fn default_instance_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let host = if host.is_empty() { "kafka-assigner".to_string() } else { host };
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
