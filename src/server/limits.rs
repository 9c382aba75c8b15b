//! What one client may use of the gRPC server, each limit answered with a precise status:
//!
//! | limit | flag | status |
//! | --- | --- | --- |
//! | open `Register` streams, whole instance | `--max-streams` | `RESOURCE_EXHAUSTED` |
//! | open `Register` streams per client IP | `--max-streams-per-ip` | `RESOURCE_EXHAUSTED` |
//! | request message size | `--max-request-bytes` | `OUT_OF_RANGE` (tonic's decoder) |
//! | unary call duration | `--unary-timeout` | `DEADLINE_EXCEEDED` |
//! | dead TCP peer | `--http2-keepalive-interval` / `-timeout` | connection closed, its streams end |
//! | HTTP/2 streams open on one connection | [`HTTP2_MAX_CONCURRENT_STREAMS`] | the client waits for one to end |
//! | unread small DATA frames on one connection | [`HTTP2_CONNECTION_WINDOW`] (h2's budget) | GOAWAY `ENHANCE_YOUR_CALM` |
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

use crate::metrics::Metrics;

/// HTTP/2 streams one connection may have open at once (`SETTINGS_MAX_CONCURRENT_STREAMS`);
/// a client at the limit waits for a stream to end before it opens another.
///
/// tonic's default is no limit. This one is above the default `--max-streams` (20,000), so a
/// single connection that carries every consumer (a pooling proxy such as Envoy, a mesh
/// sidecar, a client multiplexing its consumers) can hold every `Register` stream the
/// instance accepts and still have 12,768 calls in flight: a client that does not open a
/// second connection never waits behind its own streams. It bounds what one connection
/// costs, and [`HTTP2_CONNECTION_WINDOW`] is sized from it.
pub const HTTP2_MAX_CONCURRENT_STREAMS: u32 = 32_768;

/// The HTTP/2 connection flow-control window: request bytes one connection may have in
/// flight that the server has not read yet (16 MiB; hyper's default is 1 MiB).
///
/// h2 (0.4.16 and later) also budgets small DATA frames held unread: each frame under
/// 256 bytes costs 256 minus its length, and when the cost passes half the connection
/// window h2 closes the connection with GOAWAY `ENHANCE_YOUR_CALM` ("too_many_data_frames"),
/// failing every call and stream on it. Every `Register`, `PartitionReady` and
/// `PartitionReleased` request is one such frame, held unread until its handler task runs;
/// a burst of a few thousand calls multiplexed on one connection (a scale-out answering
/// 5,000 warms at once behind a proxy) used to exhaust the 512 KiB budget of the default
/// window. 512 bytes per stream of [`HTTP2_MAX_CONCURRENT_STREAMS`] gives a budget of one
/// unread small frame on every stream a connection may open, so a client that keeps to the
/// stream limit cannot reach it; a client that sends many small frames per stream faster
/// than the server reads them still does (and h2's separate cap on empty DATA frames is
/// unchanged).
pub const HTTP2_CONNECTION_WINDOW: u32 = HTTP2_MAX_CONCURRENT_STREAMS * 512;

// h2's largest window, and the budget (half the window) covers 256 bytes per stream.
const _: () = assert!(HTTP2_CONNECTION_WINDOW < (1 << 31));
const _: () = assert!(HTTP2_CONNECTION_WINDOW / 2 >= HTTP2_MAX_CONCURRENT_STREAMS * 256);

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

/// The stream limit that refused a `Register`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamLimit {
    /// `--max-streams`: streams of the whole instance.
    Instance,
    /// `--max-streams-per-ip`: streams from one peer address.
    PerIp,
}

impl StreamLimit {
    /// The `limit` label of `streams_refused_total`: the flag's name.
    pub fn label(self) -> &'static str {
        match self {
            StreamLimit::Instance => "max_streams",
            StreamLimit::PerIp => "max_streams_per_ip",
        }
    }
}

/// Counts a refusal and logs it: the first of each limit, then at every power of two, so
/// a fleet retrying against a limit cannot flood the log but the operator still sees it.
fn refuse(metrics: &Metrics, limit: StreamLimit, message: String) -> Status {
    let refused = metrics.observe_stream_refused(limit.label());
    if refused.is_power_of_two() {
        tracing::warn!(limit = limit.label(), refused, "{message}");
    }
    Status::resource_exhausted(message)
}

/// For a loopback peer, what most likely put every consumer behind it: a sidecar proxy,
/// which connects to the server from one local address.
fn mesh_hint(ip: IpAddr) -> &'static str {
    if ip.is_loopback() {
        "A loopback peer usually means a sidecar proxy in front of this server (Istio connects from \
         127.0.0.6, Linkerd from 127.0.0.1), so every consumer counts against this one address; behind a \
         mesh set --max-streams-per-ip to --max-streams and let --max-streams bound the instance. "
    } else {
        ""
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

    /// A place for one more stream from `ip`, or `RESOURCE_EXHAUSTED` saying which limit
    /// refused it, its value, the peer and how to raise it; counted in `metrics`
    /// (`streams_refused_total`, labelled by [`StreamLimit`]).
    pub fn acquire(&self, ip: Option<IpAddr>, metrics: &Metrics) -> Result<StreamPermit, Status> {
        let mut counts = self.counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let peer = ip.map_or_else(|| "unknown".to_string(), |ip| ip.to_string());
        if counts.total >= self.max_total {
            let message = format!(
                "Register refused by the instance limit: this assigner instance already serves {} streams \
                 (--max-streams {}, env KAFKA_ASSIGNER_MAX_STREAMS; peer {peer}). Retry on another instance, \
                 add instances, or raise --max-streams",
                counts.total, self.max_total
            );
            return Err(refuse(metrics, StreamLimit::Instance, message));
        }
        if let Some(ip) = ip {
            let from_ip = counts.per_ip.get(&ip).copied().unwrap_or(0);
            if from_ip >= self.max_per_ip {
                let message = format!(
                    "Register refused by the per-IP limit: peer {ip} already has {from_ip} open streams \
                     (--max-streams-per-ip {}, env KAFKA_ASSIGNER_MAX_STREAMS_PER_IP; the instance limit is \
                     --max-streams {}). {}Raise --max-streams-per-ip if many consumers share this address.",
                    self.max_per_ip,
                    self.max_total,
                    mesh_hint(ip),
                );
                return Err(refuse(metrics, StreamLimit::PerIp, message));
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
        let metrics = Metrics::new();
        let gate = StreamGate::new(&Limits { max_streams: 3, max_streams_per_ip: 2, ..Limits::default() });
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let a1 = gate.acquire(Some(a), &metrics).unwrap();
        let _a2 = gate.acquire(Some(a), &metrics).unwrap();
        let denied = gate.acquire(Some(a), &metrics).unwrap_err();
        assert_eq!(denied.code(), tonic::Code::ResourceExhausted);
        let message = denied.message();
        for needle in
            ["per-IP limit", "peer 10.0.0.1", "--max-streams-per-ip 2", "KAFKA_ASSIGNER_MAX_STREAMS_PER_IP"]
        {
            assert!(message.contains(needle), "{needle:?} missing: {message}");
        }
        assert!(!message.contains("sidecar"), "no mesh hint for a routable peer: {message}");
        let _b1 = gate.acquire(Some(b), &metrics).unwrap();
        let denied = gate.acquire(Some(b), &metrics).unwrap_err();
        let message = denied.message();
        for needle in ["instance limit", "peer 10.0.0.2", "--max-streams 3", "KAFKA_ASSIGNER_MAX_STREAMS;"] {
            assert!(message.contains(needle), "{needle:?} missing: {message}");
        }
        drop(a1);
        assert_eq!(gate.open(), 2);
        assert!(gate.acquire(Some(a), &metrics).is_ok());
        let text = metrics.encode();
        assert!(text.contains("streams_refused_total{limit=\"max_streams_per_ip\"} 1"), "{text}");
        assert!(text.contains("streams_refused_total{limit=\"max_streams\"} 1"), "{text}");
    }

    #[test]
    fn a_loopback_peer_is_explained_as_a_sidecar() {
        let gate = StreamGate::new(&Limits { max_streams_per_ip: 1, ..Limits::default() });
        let sidecar: IpAddr = [127, 0, 0, 6].into();
        let metrics = Metrics::new();
        let _held = gate.acquire(Some(sidecar), &metrics).unwrap();
        let message = gate.acquire(Some(sidecar), &metrics).unwrap_err().message().to_string();
        for needle in
            ["peer 127.0.0.6", "sidecar", "Istio", "Linkerd", "--max-streams-per-ip to --max-streams"]
        {
            assert!(message.contains(needle), "{needle:?} missing: {message}");
        }
    }
}
