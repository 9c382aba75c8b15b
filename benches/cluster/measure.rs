//! Counters read before and after the rolling restart: etcd's own `/metrics`, each
//! instance's `/metrics` and `/proc/<pid>/`, and the whole-prefix read an instance makes on
//! a resync, timed with the raw etcd client.

use std::time::Instant;

use etcd_client::{Client, GetOptions};

use crate::error::BenchError;
use crate::server::{ServerProcess, http_get, metric_sum};

/// etcd's counters at one moment (from its `/metrics`).
#[derive(Clone, Copy, Debug, Default)]
pub struct EtcdCounters {
    /// `Txn` requests handled (`grpc_server_handled_total{grpc_method="Txn"}`).
    pub txns: f64,
    /// `Put` and `DeleteRange` requests handled (writes outside a transaction).
    pub plain_writes: f64,
    /// `Range` requests handled.
    pub ranges: f64,
    /// Keys put or deleted (`etcd_mvcc_put_total` + `etcd_mvcc_delete_total`): the store's
    /// changes, each one watch event per watcher of its key.
    pub changes: f64,
    /// Watch events sent to every watcher (`etcd_debugging_mvcc_events_total`).
    pub events: f64,
    /// Bytes etcd sent to its clients (`etcd_network_client_grpc_sent_bytes_total`):
    /// watch events, and also every read's and write's answer.
    pub sent_bytes: f64,
    /// The backend database's size (`etcd_mvcc_db_total_size_in_bytes`): every revision
    /// is kept until someone compacts, so this grows with the changes.
    pub db_bytes: f64,
}

/// Reads [`EtcdCounters`] from the etcd at `endpoint` (`http://host:port`).
pub async fn etcd(endpoint: &str) -> Result<EtcdCounters, BenchError> {
    let text = metrics(endpoint.trim_start_matches("http://")).await?;
    let handled =
        |method: &str| metric_sum(&text, "grpc_server_handled_total", &format!("grpc_method=\"{method}\""));
    Ok(EtcdCounters {
        txns: handled("Txn"),
        plain_writes: handled("Put") + handled("DeleteRange"),
        ranges: handled("Range"),
        changes: metric_sum(&text, "etcd_mvcc_put_total", "")
            + metric_sum(&text, "etcd_mvcc_delete_total", ""),
        events: metric_sum(&text, "etcd_debugging_mvcc_events_total", ""),
        sent_bytes: metric_sum(&text, "etcd_network_client_grpc_sent_bytes_total", ""),
        db_bytes: metric_sum(&text, "etcd_mvcc_db_total_size_in_bytes", ""),
    })
}

impl EtcdCounters {
    /// What happened from `self` (earlier) to `later`.
    pub fn to(&self, later: &EtcdCounters) -> EtcdCounters {
        EtcdCounters {
            txns: later.txns - self.txns,
            plain_writes: later.plain_writes - self.plain_writes,
            ranges: later.ranges - self.ranges,
            changes: later.changes - self.changes,
            events: later.events - self.events,
            sent_bytes: later.sent_bytes - self.sent_bytes,
            db_bytes: later.db_bytes - self.db_bytes,
        }
    }
}

/// One instance's counters at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub struct InstanceCounters {
    /// CPU seconds (user + system).
    pub cpu_s: f64,
    /// `kafka_assigner_plan_seconds_total`: seconds spent in the leader's pure planning.
    pub plan_s: f64,
    /// `kafka_assigner_watch_resyncs_total`: whole-prefix re-reads.
    pub resyncs: f64,
    /// `kafka_assigner_partition_moves_total`: moves in the plans this instance wrote.
    pub moves: f64,
    /// `kafka_assigner_leader_groups_led`.
    pub groups_led: u32,
}

/// Reads an instance's [`InstanceCounters`].
pub async fn instance(server: &ServerProcess) -> Result<InstanceCounters, BenchError> {
    let text = metrics(&server.admin_addr()).await?;
    Ok(InstanceCounters {
        cpu_s: server.cpu_seconds()?,
        plan_s: metric_sum(&text, "kafka_assigner_plan_seconds_total", ""),
        resyncs: metric_sum(&text, "kafka_assigner_watch_resyncs_total", ""),
        moves: metric_sum(&text, "kafka_assigner_partition_moves_total", ""),
        groups_led: metric_sum(&text, "kafka_assigner_leader_groups_led", "") as u32,
    })
}

impl InstanceCounters {
    /// What happened from `self` (earlier) to `later`; leadership as `later` has it.
    pub fn to(&self, later: &InstanceCounters) -> InstanceCounters {
        InstanceCounters {
            cpu_s: later.cpu_s - self.cpu_s,
            plan_s: later.plan_s - self.plan_s,
            resyncs: later.resyncs - self.resyncs,
            moves: later.moves - self.moves,
            groups_led: later.groups_led,
        }
    }
}

async fn metrics(host_port: &str) -> Result<String, BenchError> {
    let (code, text) = http_get(host_port, "/metrics").await?;
    if code != 200 {
        return Err(BenchError::Http {
            url: format!("http://{host_port}/metrics"),
            reason: format!("status {code}"),
        });
    }
    Ok(text)
}

/// The whole-prefix read of a resync, as the raw etcd client makes it.
#[derive(Clone, Copy, Debug, Default)]
pub struct PrefixRead {
    /// Keys under the prefix.
    pub keys: usize,
    /// Bytes of their keys and values.
    pub bytes: usize,
    /// Median time of the reads, in milliseconds.
    pub median_ms: f64,
}

/// Reads everything under `prefix` `runs` times; the median time.
pub async fn prefix_read(endpoints: &[String], prefix: &str, runs: usize) -> Result<PrefixRead, BenchError> {
    let mut client = Client::connect(endpoints, None).await?;
    let mut times = Vec::with_capacity(runs);
    let mut read = PrefixRead::default();
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        let answer = client.get(prefix, Some(GetOptions::new().with_prefix())).await?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
        read.keys = answer.kvs().len();
        read.bytes = answer.kvs().iter().map(|kv| kv.key().len() + kv.value().len()).sum();
    }
    times.sort_by(f64::total_cmp);
    read.median_ms = times[times.len() / 2];
    Ok(read)
}
