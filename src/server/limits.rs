//! What one client may use of the gRPC server, each limit answered with a precise status:
//!
//! | limit | flag | status |
//! | --- | --- | --- |
//! | open `Register` streams, whole instance | `--max-streams` | `RESOURCE_EXHAUSTED` |
//! | open `Register` streams per client IP | `--max-streams-per-ip` | `RESOURCE_EXHAUSTED` |
//! | request message size | `--max-request-bytes` | `OUT_OF_RANGE` (tonic's decoder) |
//! | unary call duration | `--unary-timeout` | `DEADLINE_EXCEEDED` |
//! | dead TCP peer | `--http2-keepalive-interval` / `-timeout` | connection closed, its streams end |
//!
//! Consumer names (at most 253 characters, a Kubernetes pod name) and topic names (Kafka's
//! 249) are checked by the coordinator's validation (`INVALID_ARGUMENT`).

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use tonic::Status;

/// The limits of one server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Open `Register` streams on this instance.
    pub max_streams: usize,
    /// Open `Register` streams from one client IP address.
    pub max_streams_per_ip: usize,
    /// Largest request message accepted, in bytes.
    pub max_request_bytes: usize,
    /// Longest a unary call (`PartitionReady`, `PartitionReleased`, `Deregister`) may run.
    pub unary_timeout: Duration,
    /// HTTP/2 ping interval on idle connections.
    pub keepalive_interval: Duration,
    /// A ping not answered within this closes the connection.
    pub keepalive_timeout: Duration,
}

impl Default for Limits {
    /// 20,000 streams, 1,000 per IP, 64 KiB requests, 30 s unary calls, a ping every 30 s
    /// answered within 10 s (a dead peer is found within 40 s).
    fn default() -> Self {
        Self {
            max_streams: 20_000,
            max_streams_per_ip: 1_000,
            max_request_bytes: 64 * 1024,
            unary_timeout: Duration::from_secs(30),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
        }
    }
}

/// A limit that cannot be set.
#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    /// A value of zero (or too small) for a flag.
    #[error("{0}")]
    Invalid(String),
}

impl Limits {
    /// Refuses settings that would make the server unusable.
    pub fn validate(&self) -> Result<(), LimitsError> {
        if self.max_streams == 0 || self.max_streams_per_ip == 0 {
            return Err(LimitsError::Invalid(
                "--max-streams and --max-streams-per-ip must be at least 1".into(),
            ));
        }
        if self.max_request_bytes < 1024 {
            return Err(LimitsError::Invalid(
                "--max-request-bytes must be at least 1024 (a valid request with a 253-character name and a 249-character topic is about 520 bytes)".into(),
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
}

/// Counts open streams against [`Limits::max_streams`] and [`Limits::max_streams_per_ip`].
#[derive(Clone, Debug)]
pub struct StreamGate {
    max_total: usize,
    max_per_ip: usize,
    counts: Arc<Mutex<Counts>>,
}

/// One open stream; dropping it (the stream ended or the client went away) frees its place.
#[derive(Debug)]
pub struct StreamPermit {
    ip: Option<IpAddr>,
    counts: Arc<Mutex<Counts>>,
}

impl StreamGate {
    /// A gate for `limits`.
    pub fn new(limits: &Limits) -> Self {
        Self { max_total: limits.max_streams, max_per_ip: limits.max_streams_per_ip, counts: Arc::default() }
    }

    /// A place for one more stream from `ip`, or `RESOURCE_EXHAUSTED` naming the limit.
    pub fn acquire(&self, ip: Option<IpAddr>) -> Result<StreamPermit, Status> {
        let mut counts = self.counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if counts.total >= self.max_total {
            return Err(Status::resource_exhausted(format!(
                "this assigner instance already serves {} streams (--max-streams {}); retry later or on another instance",
                counts.total, self.max_total
            )));
        }
        if let Some(ip) = ip {
            let from_ip = counts.per_ip.get(&ip).copied().unwrap_or(0);
            if from_ip >= self.max_per_ip {
                return Err(Status::resource_exhausted(format!(
                    "client {ip} already has {from_ip} open streams (--max-streams-per-ip {})",
                    self.max_per_ip
                )));
            }
            *counts.per_ip.entry(ip).or_insert(0) += 1;
        }
        counts.total += 1;
        Ok(StreamPermit { ip, counts: self.counts.clone() })
    }

    /// Streams open now.
    pub fn open(&self) -> usize {
        self.counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).total
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        counts.total = counts.total.saturating_sub(1);
        if let Some(ip) = self.ip
            && let Some(n) = counts.per_ip.get_mut(&ip)
        {
            *n -= 1;
            if *n == 0 {
                counts.per_ip.remove(&ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_counts_total_and_per_ip() {
        let gate = StreamGate::new(&Limits { max_streams: 3, max_streams_per_ip: 2, ..Limits::default() });
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let a1 = gate.acquire(Some(a)).unwrap();
        let _a2 = gate.acquire(Some(a)).unwrap();
        let denied = gate.acquire(Some(a)).unwrap_err();
        assert_eq!(denied.code(), tonic::Code::ResourceExhausted);
        assert!(denied.message().contains("--max-streams-per-ip 2"), "{}", denied.message());
        let _b1 = gate.acquire(Some(b)).unwrap();
        let denied = gate.acquire(Some(b)).unwrap_err();
        assert!(denied.message().contains("--max-streams 3"), "{}", denied.message());
        drop(a1);
        assert_eq!(gate.open(), 2);
        assert!(gate.acquire(Some(a)).is_ok());
    }
}
