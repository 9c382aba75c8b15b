//! The cluster bench (issue 42): K instances of the server, as child processes, on one real
//! etcd; T topics whose consumers are spread over the instances as a load balancer would
//! (round robin); then a rolling restart of every consumer in waves: each consumer of a
//! wave leaves with `Deregister` (the instances run `--drain-policy drain`), serves its
//! releases until the server ends its stream, and comes back under a new name on the next
//! instance. The next wave starts once the views are stable again.

pub mod consumer;
// Shared with the scale bench.
#[path = "../support/call_errors.rs"]
pub mod call_errors;
// Shared with the scale bench.
#[path = "../support/grpc_clients.rs"]
pub mod grpc_clients;
pub mod measure;
// Shared with the scale bench.
#[path = "../support/ownership.rs"]
pub mod ownership;
pub mod report;
pub mod views;
// Shared with the scale bench.
#[path = "../support/watched.rs"]
pub mod watched;

use std::{path::PathBuf, time::Duration, time::Instant};

use kafka_assigner::proto::v1::kafka_assigner_client::KafkaAssignerClient;
use tokio::{sync::oneshot, task::JoinSet};
use tonic::transport::Channel;

use crate::error::{self, BenchError};
use crate::etcd::EtcdServer;
use crate::server::{ServerProcess, ServerSpec, Store};
use consumer::{Consumer, topic_name};
use grpc_clients::connect;
pub use report::Row;
use views::{Shared, Views};

/// What to run (from `CLUSTER_*` environment variables, see [`Config::from_env`]).
#[derive(Clone, Debug)]
pub struct Config {
    /// Instance counts to run, one run each.
    pub instances: Vec<usize>,
    /// Topics.
    pub topics: u32,
    /// Partitions per topic.
    pub partitions: u32,
    /// Consumers per topic (at most `waves`, so that a wave drains one per topic at most
    /// and the others take its partitions).
    pub consumers: u32,
    /// Waves of the rolling restart (10: 10 % of the consumers each).
    pub waves: u32,
    /// How long one step (connecting, a wave's drain, a wave's return) may take.
    pub deadline: Duration,
    /// The `kafka-assigner` binary.
    pub binary: PathBuf,
    /// `--leader-groups` of every instance.
    pub leader_groups: u32,
    /// More server flags.
    pub extra_args: Vec<String>,
}

impl Config {
    /// Reads `CLUSTER_INSTANCES` (`1,3,5`), `CLUSTER_TOPICS` (100), `CLUSTER_PARTITIONS`
    /// (16), `CLUSTER_CONSUMERS` (4 per topic), `CLUSTER_WAVES` (10), `CLUSTER_DEADLINE_S`
    /// (120), `CLUSTER_LEADER_GROUPS` (20) and `CLUSTER_SERVER_ARGS` (space-separated).
    pub fn from_env(binary: PathBuf) -> Result<Self, BenchError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let number = |name: &str, default: u64| -> Result<u64, BenchError> {
            var(name).map_or(Ok(default), |v| {
                v.trim().parse().map_err(|_| BenchError::Config(format!("{name}={v} is not a number")))
            })
        };
        let instances = match var("CLUSTER_INSTANCES") {
            None => vec![1, 3, 5],
            Some(list) => list
                .split(',')
                .map(|k| {
                    k.trim().parse().map_err(|_| BenchError::Config(format!("CLUSTER_INSTANCES={list}")))
                })
                .collect::<Result<_, _>>()?,
        };
        let config = Self {
            instances,
            topics: number("CLUSTER_TOPICS", 100)? as u32,
            partitions: number("CLUSTER_PARTITIONS", 16)? as u32,
            consumers: number("CLUSTER_CONSUMERS", 4)? as u32,
            waves: number("CLUSTER_WAVES", 10)? as u32,
            deadline: Duration::from_secs(number("CLUSTER_DEADLINE_S", 120)?),
            leader_groups: number("CLUSTER_LEADER_GROUPS", 20)? as u32,
            binary,
            extra_args: var("CLUSTER_SERVER_ARGS")
                .map(|a| a.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default(),
        };
        if config.consumers < 2 || config.consumers > config.waves || config.instances.contains(&0) {
            return Err(BenchError::Config(
                "need 2 <= CLUSTER_CONSUMERS <= CLUSTER_WAVES and at least one instance".into(),
            ));
        }
        Ok(config)
    }

    fn slots(&self) -> u32 {
        self.topics * self.consumers
    }
}

/// Streams per HTTP/2 connection of the bench's consumers.
const STREAMS_PER_CONNECTION: u32 = 500;

/// One instance with the consumers' connections to it.
struct Instance {
    server: ServerProcess,
    clients: Vec<KafkaAssignerClient<Channel>>,
}

/// The consumers of a run: who runs where, and how to make each leave.
struct Consumers {
    shared: Shared,
    tasks: JoinSet<()>,
    /// Per slot: the instance it is on, its generation, and what makes it leave.
    instance_of: Vec<usize>,
    generation: Vec<u32>,
    leave: Vec<Option<oneshot::Sender<()>>>,
}

impl Consumers {
    fn start(&mut self, config: &Config, instances: &[Instance], slot: u32) {
        let index = slot as usize;
        let instance = &instances[self.instance_of[index]];
        let (topic, member) = (slot / config.consumers, slot % config.consumers);
        let client = instance.clients[index % instance.clients.len()].clone();
        let name = format!("{}-c{member}-g{}", topic_name(topic), self.generation[index]);
        let consumer = Consumer { client, slot, topic, name, shared: self.shared.clone() };
        let (tx, rx) = oneshot::channel();
        self.leave[index] = Some(tx);
        self.tasks.spawn(consumer.run(rx));
    }
}

/// Runs the bench with `k` instances; returns its row.
pub async fn run(config: &Config, k: usize) -> Result<Row, BenchError> {
    let etcd = EtcdServer::start().await;
    let endpoints = etcd.endpoints();
    let prefix = etcd.unique_prefix("cluster");
    let store = Store::Etcd { endpoints: endpoints.clone(), prefix: prefix.clone() };
    let dir = tempfile::Builder::new().prefix("kafka-assigner-cluster-").tempdir()?;
    let topics: Vec<String> =
        (0..config.topics).map(|t| format!("{}={}", topic_name(t), config.partitions)).collect();
    let topics = topics.join(",");
    let mut args =
        vec!["--drain-policy=drain".to_string(), format!("--leader-groups={}", config.leader_groups)];
    args.extend(config.extra_args.iter().cloned());
    let mut instances = Vec::with_capacity(k);
    let per_instance = config.slots().div_ceil(k as u32);
    for i in 0..k {
        let spec = ServerSpec {
            binary: &config.binary,
            store: &store,
            topics: &topics,
            // A newcomer's whole share: warming is not what limits a restart here.
            max_warming: config.partitions,
            extra_args: &args,
            log: dir.path().join(format!("instance-{i}.log")),
        };
        let server = ServerProcess::start(&spec).await?;
        let clients =
            connect(&server.grpc_url(), per_instance.div_ceil(STREAMS_PER_CONNECTION) as usize).await?;
        instances.push(Instance { server, clients });
    }
    let slots = config.slots() as usize;
    let mut consumers = Consumers {
        shared: Shared::new(Views::new(config.topics, config.partitions, config.consumers)),
        tasks: JoinSet::new(),
        instance_of: (0..slots).map(|s| s % k).collect(),
        generation: vec![0; slots],
        leave: (0..slots).map(|_| None).collect(),
    };
    let mut row = Row::new(config, k);
    row.load_before = load_average();

    let etcd_empty = measure::etcd(&endpoints[0]).await?;
    let connecting = Instant::now();
    for slot in 0..config.slots() {
        consumers.start(config, &instances, slot);
    }
    let shared = consumers.shared.clone();
    if shared.wait_for(connecting + config.deadline, |v| v.is_stable()).await.is_none() {
        row.note(format!(
            "not stable after connecting within {:?}: {}",
            config.deadline,
            shared.lock().describe()
        ));
        return Ok(finish(row, &instances, &mut consumers));
    }
    row.connect_s = Some(connecting.elapsed().as_secs_f64());
    let etcd_before = measure::etcd(&endpoints[0]).await?;
    row.connect_etcd = etcd_empty.to(&etcd_before);
    let mut before = Vec::with_capacity(k);
    for instance in &instances {
        before.push(measure::instance(&instance.server).await?);
    }
    let bench_cpu = self_cpu_seconds();
    shared.start_phase();
    let start = Instant::now();
    let mut completed = true;
    for wave in 0..config.waves {
        let wave_start = Instant::now();
        let leaving: Vec<u32> = (0..config.slots()).filter(|s| s % config.waves == wave).collect();
        for slot in &leaving {
            if let Some(leave) = consumers.leave[*slot as usize].take() {
                let _ = leave.send(());
            }
        }
        if shared.wait_for(Instant::now() + config.deadline, |v| v.all_down(&leaving)).await.is_none() {
            row.note(format!(
                "wave {wave}: drains not done within {:?}: {}",
                config.deadline,
                shared.lock().describe()
            ));
            completed = false;
            break;
        }
        for slot in &leaving {
            let index = *slot as usize;
            consumers.instance_of[index] = (consumers.instance_of[index] + 1) % k;
            consumers.generation[index] += 1;
            consumers.start(config, &instances, *slot);
        }
        if shared.wait_for(Instant::now() + config.deadline, |v| v.is_stable()).await.is_none() {
            row.note(format!(
                "wave {wave}: not stable within {:?}: {}",
                config.deadline,
                shared.lock().describe()
            ));
            completed = false;
            break;
        }
        row.slowest_wave_s = row.slowest_wave_s.max(wave_start.elapsed().as_secs_f64());
    }
    let elapsed = start.elapsed();
    row.stats = shared.end_phase();
    row.bench_cpu_s = self_cpu_seconds().zip(bench_cpu).map(|(after, before)| after - before);
    if completed {
        row.restart_s = Some(elapsed.as_secs_f64());
    }
    row.etcd = etcd_before.to(&measure::etcd(&endpoints[0]).await?);
    for (instance, before) in instances.iter().zip(&before) {
        let after = measure::instance(&instance.server).await?;
        row.instances.push(before.to(&after));
        row.rss_mib.push(instance.server.rss_bytes()? as f64 / (1024.0 * 1024.0));
    }
    row.prefix_read = Some(measure::prefix_read(&endpoints, &prefix, 5).await?);
    Ok(finish(row, &instances, &mut consumers))
}

/// The load average and the server logs' warnings; stops the consumers.
fn finish(mut row: Row, instances: &[Instance], consumers: &mut Consumers) -> Row {
    consumers.tasks.abort_all();
    row.load_after = load_average();
    for instance in instances {
        let (warn, error) = instance.server.log_warnings();
        row.warn_lines += warn;
        row.error_lines += error;
    }
    row
}

/// The 1-minute load average (`/proc/loadavg`), to say what the machine was doing.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// This process's CPU seconds (`/proc/self/stat`, ticks of 1/100 s).
fn self_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let tick = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    Some((tick(11)? + tick(12)?) as f64 / 100.0)
}
