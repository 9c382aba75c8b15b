//! etcd's side: request rates from etcd's own `/metrics`, and the raw etcd reference
//! (fenced transactions per second with 64 in flight, put → another client's watch).

use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, WatchOptions};
use serde::Serialize;

use super::{
    error::BenchError,
    server::{http_get, metric_sum},
};

/// Counters read from etcd's `/metrics` at one moment.
#[derive(Clone, Copy, Debug)]
pub struct EtcdCounters {
    at: Instant,
    /// Every gRPC message etcd received (unary requests and stream messages: keep-alives,
    /// watch requests).
    requests: f64,
    /// `LeaseKeepAlive` stream messages received.
    keepalives: f64,
    /// Raft proposals committed (writes).
    writes: f64,
}

/// Rates between two [`EtcdCounters`].
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct EtcdRates {
    /// gRPC messages received per second.
    pub requests_per_s: f64,
    /// Of which `LeaseKeepAlive` per second.
    pub keepalives_per_s: f64,
    /// Raft proposals committed per second.
    pub writes_per_s: f64,
}

/// Reads the counters of the etcd at `endpoint` (`http://host:port`).
pub async fn counters(endpoint: &str) -> Result<EtcdCounters, BenchError> {
    let host = endpoint.trim_start_matches("http://");
    let (code, text) = http_get(host, "/metrics").await?;
    if code != 200 {
        return Err(BenchError::Http {
            url: format!("{endpoint}/metrics"),
            reason: format!("status {code}"),
        });
    }
    Ok(EtcdCounters {
        at: Instant::now(),
        requests: metric_sum(&text, "grpc_server_msg_received_total", ""),
        keepalives: metric_sum(&text, "grpc_server_msg_received_total", "grpc_method=\"LeaseKeepAlive\""),
        writes: metric_sum(&text, "etcd_server_proposals_committed_total", ""),
    })
}

impl EtcdCounters {
    /// Rates from `self` (earlier) to `later`.
    pub fn rates_to(&self, later: &EtcdCounters) -> EtcdRates {
        let secs = later.at.saturating_duration_since(self.at).as_secs_f64().max(1e-3);
        EtcdRates {
            requests_per_s: (later.requests - self.requests) / secs,
            keepalives_per_s: (later.keepalives - self.keepalives) / secs,
            writes_per_s: (later.writes - self.writes) / secs,
        }
    }
}

/// The raw etcd reference, measured on the same machine in the same run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RawEtcd {
    /// Fenced transactions (one compare, one put) per second with 64 in flight.
    pub txn_per_s: f64,
    /// Put → another client's watch receives it, p50 (ms).
    pub put_watch_p50_ms: f64,
    /// Same, p99 (ms).
    pub put_watch_p99_ms: f64,
}

/// Transactions in flight for the throughput reference.
const IN_FLIGHT: usize = 64;

/// Measures [`RawEtcd`] for `window` (throughput) and `samples` put → watch round trips.
pub async fn raw_reference(
    endpoints: &[String],
    window: Duration,
    samples: usize,
) -> Result<RawEtcd, BenchError> {
    let client = Client::connect(endpoints, None).await?;
    let fence = "/bench-raw/fence";
    client.kv_client().put(fence, "1", None).await?;
    let until = Instant::now() + window;
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..IN_FLIGHT {
        let mut kv = client.kv_client();
        workers.spawn(async move {
            let mut done = 0u64;
            while Instant::now() < until {
                let key = format!("/bench-raw/txn/{worker}/{}", done % 16);
                let txn = Txn::new()
                    .when([Compare::version(fence, CompareOp::Greater, 0)])
                    .and_then([TxnOp::put(key, "x", None)]);
                kv.txn(txn).await?;
                done += 1;
            }
            Ok::<_, etcd_client::Error>(done)
        });
    }
    let mut total = 0;
    while let Some(joined) = workers.join_next().await {
        total += joined.map_err(|e| BenchError::Config(format!("raw etcd worker: {e}")))??;
    }
    let txn_per_s = total as f64 / started.elapsed().as_secs_f64();

    let mut writer = client.kv_client();
    let mut watcher = Client::connect(endpoints, None).await?;
    let key = "/bench-raw/watch";
    let revision = writer.put(key, "0", None).await?.header().map_or(0, |h| h.revision());
    let mut stream = watcher.watch(key, Some(WatchOptions::new().with_start_revision(revision + 1))).await?;
    let mut latencies = Vec::with_capacity(samples);
    for i in 0..samples {
        let start = Instant::now();
        let revision = writer.put(key, i.to_string(), None).await?.header().map_or(0, |h| h.revision());
        loop {
            let message = stream.message().await?.ok_or_else(|| BenchError::Config("watch ended".into()))?;
            if message.events().iter().any(|e| e.kv().is_some_and(|kv| kv.mod_revision() >= revision)) {
                break;
            }
        }
        latencies.push(start.elapsed());
    }
    Ok(RawEtcd {
        txn_per_s,
        put_watch_p50_ms: percentile_ms(&mut latencies, 0.50).unwrap_or(0.0),
        put_watch_p99_ms: percentile_ms(&mut latencies, 0.99).unwrap_or(0.0),
    })
}

/// Milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The `p` quantile of `samples` in milliseconds (nearest rank); `None` without samples.
pub fn percentile_ms(samples: &mut [Duration], p: f64) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    Some(samples[index].as_secs_f64() * 1e3)
}
