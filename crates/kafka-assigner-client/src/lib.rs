//! # kafka-assigner-client
//!
//! The consumer's side of kafka-assigner: a client that drives a [`Handler`], so consumer
//! code never sees the wire, and the wire contract itself ([`proto`]). A service that
//! consumes partitions depends on this crate, not on the server (`kafka-assigner`): its
//! build compiles no etcd, Kubernetes, HTTP server or Kafka client code.
//!
//! ```no_run
//! use std::sync::Arc;
//! use kafka_assigner_client::{AssignerClient, ClientConfig, Handler, Partition, WarmError};
//!
//! struct Printer;
//!
//! #[async_trait::async_trait]
//! impl Handler for Printer {
//!     async fn warm(&self, p: Partition) -> Result<(), WarmError> { println!("warm {p}"); Ok(()) }
//!     async fn assigned(&self, p: Partition) { println!("assigned {p} at epoch {}", p.epoch) }
//!     async fn release(&self, p: Partition) { println!("release {p}") }
//!     async fn unassigned(&self, p: Partition) { println!("unassigned {p}") }
//! }
//!
//! # async fn run() -> Result<(), kafka_assigner_client::ClientError> {
//! let config = ClientConfig::new(["http://assigner-0:50051", "http://assigner-1:50051"], "pod-0", "events");
//! let client = AssignerClient::start(config, Arc::new(Printer), None)?;
//! let mut owned = client.owned();
//! owned.changed().await.ok();
//! println!("owning {:?}", *owned.borrow());
//! client.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! ## Fencing your sink with epochs
//!
//! Every [`Partition`] handed to the handler carries an `epoch` (docs/design.md §10): it
//! grows each time the partition gets a new owner and never goes back. A warm handoff is
//! make-before-break, and a consumer cut off from the assigner may not know yet that it
//! lost a partition, so two consumers can briefly process one partition. Make that
//! harmless where the writes land: tag every write (a row, an offset commit, a message)
//! with the epoch of the partition it came from, and let the sink refuse a write whose
//! epoch is below the highest it has seen for that partition.
//!
//! The check must hold until the write has landed: a superseded owner that passed it just
//! before the new owner must not write after it. [`Fence`] is that check for a sink in
//! your process, in a form that holds its partition across the write:
//!
//! ```
//! # use kafka_assigner_client::{Fence, Partition, StaleEpoch};
//! # fn store(_: &Partition, _: &[u8]) {}
//! fn write(fence: &Fence, partition: &Partition, row: &[u8]) -> Result<(), StaleEpoch> {
//!     // A higher epoch waits until this write is done; a lower one is refused.
//!     fence.admit_then(partition, || store(partition, row))
//! }
//! ```
//!
//! ([`Fence::lock`] returns the guard itself, [`Fence::lock_async`] and
//! [`Fence::admit_then_async`] wait without blocking the runtime; [`Fence::admit`] is the
//! check alone, which does not cover the write that follows it.) A store that compares as
//! it writes needs no lock: a database's conditional write (`UPDATE ... SET ..., epoch = $1
//! WHERE key = $2 AND epoch <= $1`, zero rows updated meaning fenced), or an etcd
//! transaction that compares the epoch stored beside the value. The Kafka example
//! (`kafka_example`, feature `kafka-example`) keeps the epoch in its offset commits'
//! metadata and will not resume from a commit of a newer owner.
//!
//! `warm` is handed the epoch the consumer *will* own the partition with: it does not own
//! it yet. A warm handler must not write to the shared sink with that epoch (the sink
//! would then refuse the current owner, which is still processing the partition until the
//! handoff completes); it may only read and load local state.
//!
//! The epochs come from the assigner's `OwnershipEpochs` service, beside the contract;
//! [`ClientConfig::epochs`] says what to do with an assigner that has none
//! ([`EpochPolicy`]).
//!
//! ## Modules
//!
//! * [`proto`]: the generated `kafka_assigner.v1` messages, client and server trait (the
//!   server crate uses these too: one copy of the generated code).
//! * [`state`]: pure — what the client owns and what it must do on each command.
//! * `driver`: the task that holds the stream, reconnects with backoff and jitter across
//!   the endpoints, runs the client-side lease and the shutdown (`Deregister`, drain).
//! * `calls`: the RPCs, retrying `UNAVAILABLE` / `ABORTED`.
//! * `epochs`: pure — the commands waiting for their partitions' epochs.
//! * [`Fence`]: a sink-side check of epochs, held across the write ([`FenceGuard`]).
//! * `workers`: one queue per partition, so handler calls for a partition never overlap.
//! * [`signal`]: SIGTERM / Ctrl-C, for a consumer's `main` (and the assigner's).
//! * `kafka_example` (cargo feature `kafka-example`): the rdkafka consumer of the
//!   repository's `examples/consumer.rs` (also used by its tests).
//! * `status` (cargo feature `status`): an assigner's admin `/status`, read over HTTP.
//! * `testing::containers` (cargo feature `testcontainers`): the assigner and etcd images
//!   as containers, for a consumer's integration tests (needs Docker).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod backoff;
mod calls;
mod driver;
mod epochs;
mod fence;
mod handler;
#[cfg(feature = "kafka-example")]
pub mod kafka_example;
mod metrics;
pub mod proto;
pub mod signal;
pub mod state;
#[cfg(feature = "status")]
pub mod status;
#[cfg(feature = "testcontainers")]
pub mod testing;
mod workers;

pub use backoff::Backoff;
pub use fence::{Fence, FenceGuard, StaleEpoch};
pub use handler::{Handler, Partition, WarmError};
pub use metrics::ClientMetrics;

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use prometheus_client::registry::Registry;
use tokio::{
    sync::{oneshot, watch},
    task::JoinHandle,
};
use tonic::{Status, transport::Endpoint};

/// Errors of the client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The configuration cannot work (no endpoint, empty name, zero timeout).
    #[error("invalid client configuration: {0}")]
    InvalidConfig(String),
    /// An endpoint is not a URL tonic can connect to.
    #[error("invalid endpoint '{endpoint}': {message}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why.
        message: String,
    },
    /// The assigner refused the registration for good (`INVALID_ARGUMENT`).
    #[error("the assigner refused Register: {0}")]
    Refused(Status),
    /// Another registration under the same name replaced this one (`ABORTED` on the stream).
    #[error("replaced by another registration of the same consumer name: {0}")]
    Replaced(Status),
    /// [`EpochPolicy::Required`], and the assigner hands out no ownership epochs
    /// (`UNIMPLEMENTED` on `WatchEpochs`).
    #[error(
        "the assigner at {endpoint} hands out no ownership epochs, and ClientConfig::epochs is \
         EpochPolicy::Required: {status}"
    )]
    EpochsNotServed {
        /// The endpoint that answered.
        endpoint: String,
        /// Its answer.
        status: Status,
    },
    /// The client task ended abnormally (a handler panicked, or the runtime is shutting down).
    #[error("the client task failed: {0}")]
    Task(String),
    /// The client stopped as `outcome` says, but handler calls were still running after
    /// waiting `waited` (the session timeout) for them: they were abandoned (their futures
    /// dropped), so whatever they had not made durable is not. Counted in
    /// `handler_calls_abandoned`.
    #[error(
        "stopped ({outcome:?}), but {abandoned} handler call(s) had not returned after {waited:?} \
         (the session timeout) and were abandoned"
    )]
    HandlerCallsAbandoned {
        /// Handler calls still running (one per partition; what was queued behind them never ran).
        abandoned: usize,
        /// How long the shutdown waited for them.
        waited: Duration,
        /// How the shutdown ended otherwise.
        outcome: ShutdownOutcome,
    },
}

/// How [`AssignerClient::shutdown`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShutdownOutcome {
    /// `WAIT_FOR_DRAIN`: every partition was handed off and the server ended the stream.
    Drained,
    /// `SHUTDOWN_NOW` (or unspecified): the assigner holds the partitions for our return.
    ShutdownNow,
    /// `WAIT_FOR_DRAIN`, but the drain deadline passed first.
    DrainTimedOut,
    /// `Deregister` could not be delivered before the drain deadline.
    NotDeregistered(String),
}

/// What the client does with an assigner that hands out no ownership epochs (its
/// `WatchEpochs` answers `UNIMPLEMENTED`).
///
/// The default is [`Required`](Self::Required): every backend of this release serves
/// epochs, and a partition is never handed to code without one. [`IfServed`](Self::IfServed)
/// lets a client run against an assigner from before epochs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EpochPolicy {
    /// Epochs or nothing: such an assigner ends the client with
    /// [`ClientError::EpochsNotServed`] before any partition reaches the handler (a
    /// partition with epoch 0 would defeat a sink's fence).
    #[default]
    Required,
    /// Run as before epochs existed: every partition is handed to the handler with
    /// `epoch: 0` ("this server hands out no epochs: nothing to fence with").
    IfServed,
}

/// Settings of an [`AssignerClient`].
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// gRPC endpoints of assigner instances (`http://host:port`), tried in turn.
    pub endpoints: Vec<String>,
    /// This consumer's name: stable across restarts (e.g. the pod name).
    pub consumer_name: String,
    /// The topic to consume.
    pub topic: String,
    /// Waits between reconnects and between retried calls.
    pub backoff: Backoff,
    /// Client-side lease: a stream down this long (counted from the last moment the
    /// connection was known alive) without a reconnect restoring it means `unassigned`
    /// for everything; a `release` running this long stops counting as holding its
    /// partition. An upper bound: each assigner announces its session TTL on `Register`,
    /// and the client uses the lower of this and 60% of that TTL
    /// ([`with_server_lease_ttl`](Self::with_server_lease_ttl)'s rule), so a setting
    /// above what the server allows is never used.
    pub session_timeout: Duration,
    /// HTTP/2 keepalive ping interval (and ping timeout): bounds how long a silently dead
    /// connection goes unnoticed. Detection takes up to twice this, which is taken off
    /// the session timeout.
    pub keepalive: Duration,
    /// Bound of connecting and of one RPC attempt.
    pub call_timeout: Duration,
    /// How long one `PartitionReady` / `PartitionReleased` is retried.
    pub retry_limit: Duration,
    /// How long [`AssignerClient::shutdown`] serves releases after `WAIT_FOR_DRAIN`.
    pub drain_timeout: Duration,
    /// What to do with an assigner that hands out no ownership epochs (default
    /// [`EpochPolicy::Required`]). With epochs, `warm` and `assigned` wait for the
    /// partition's epoch, at most [`call_timeout`](Self::call_timeout): past that the
    /// session is dropped and registered again, never a partition handed over without it.
    pub epochs: EpochPolicy,
}

impl ClientConfig {
    /// Defaults for a server with the default `--lease-ttl` of 10 s.
    pub fn new(
        endpoints: impl IntoIterator<Item = impl Into<String>>,
        consumer_name: impl Into<String>,
        topic: impl Into<String>,
    ) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            consumer_name: consumer_name.into(),
            topic: topic.into(),
            backoff: Backoff::default(),
            session_timeout: Duration::ZERO,
            keepalive: Duration::ZERO,
            call_timeout: Duration::from_secs(5),
            retry_limit: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(60),
            epochs: EpochPolicy::Required,
        }
        .with_server_lease_ttl(Duration::from_secs(10))
    }

    /// Sets the session timeout a safety margin below the server's `--lease-ttl`: 60% of
    /// it, with keepalives every 5%. The server refreshes a session every third of the
    /// TTL, so once the stream drops it may expire as soon as two thirds of the TTL later;
    /// the client stops at most 60% - 2 x 5% = half the TTL after the last sign of life.
    ///
    /// The client applies the same rule on its own to the TTL the assigner announces, so
    /// this matters for the keepalive, which is set before connecting.
    pub fn with_server_lease_ttl(mut self, ttl: Duration) -> Self {
        self.session_timeout = session_timeout_within(ttl);
        self.keepalive = (ttl / 20).max(Duration::from_millis(20));
        self
    }

    /// The configured endpoints, checked.
    fn endpoints(&self) -> Result<Vec<Endpoint>, ClientError> {
        if self.endpoints.is_empty() {
            return Err(ClientError::InvalidConfig("at least one endpoint is needed".into()));
        }
        self.endpoints
            .iter()
            .map(|url| {
                Endpoint::from_shared(url.clone())
                    .map(|e| {
                        e.connect_timeout(self.call_timeout)
                            .tcp_nodelay(true)
                            .http2_keep_alive_interval(self.keepalive)
                            .keep_alive_timeout(self.keepalive)
                            .keep_alive_while_idle(true)
                    })
                    .map_err(|e| ClientError::InvalidEndpoint {
                        endpoint: url.clone(),
                        message: e.to_string(),
                    })
            })
            .collect()
    }

    fn validate(&self) -> Result<(), ClientError> {
        let bad = |m: &str| Err(ClientError::InvalidConfig(m.into()));
        if self.consumer_name.trim().is_empty() {
            return bad("the consumer name is empty");
        }
        if self.topic.trim().is_empty() {
            return bad("the topic is empty");
        }
        if self.session_timeout.is_zero() || self.keepalive.is_zero() || self.call_timeout.is_zero() {
            return bad("session_timeout, keepalive and call_timeout must be greater than zero");
        }
        if self.keepalive * 2 >= self.session_timeout {
            return bad("keepalive must be well below session_timeout (detection takes twice the keepalive)");
        }
        Ok(())
    }
}

/// The longest client session a server session TTL of `ttl` allows (see
/// [`ClientConfig::with_server_lease_ttl`]).
fn session_timeout_within(ttl: Duration) -> Duration {
    ttl.mul_f64(0.6)
}

/// The session timeout in force once a server announced its session TTL: the configured
/// one, lowered to what that TTL allows, never raised above the configuration.
fn effective_session_timeout(configured: Duration, announced_ttl: Duration) -> Duration {
    configured.min(session_timeout_within(announced_ttl))
}

/// A running client (see the module docs). Dropping it without
/// [`shutdown`](Self::shutdown) stops it abruptly, like a killed process: no `Deregister`,
/// no handler calls.
pub struct AssignerClient {
    owned: watch::Receiver<BTreeSet<u32>>,
    connected: watch::Receiver<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<ShutdownOutcome, ClientError>>>,
}

impl AssignerClient {
    /// Starts the client in the background (it connects, and reconnects, on its own).
    /// Metrics go to `registry` when given. Must be called inside a tokio runtime.
    pub fn start<H: Handler>(
        config: ClientConfig,
        handler: Arc<H>,
        registry: Option<&mut Registry>,
    ) -> Result<Self, ClientError> {
        config.validate()?;
        let endpoints = config.endpoints()?;
        let metrics = ClientMetrics::default();
        if let Some(registry) = registry {
            metrics.register(registry);
        }
        let (owned_tx, owned) = watch::channel(BTreeSet::new());
        let (connected_tx, connected) = watch::channel(false);
        let (stop, stop_rx) = oneshot::channel();
        let driver = driver::Driver::new(config, endpoints, handler, metrics, owned_tx, connected_tx);
        let task = tokio::spawn(driver.run(stop_rx));
        Ok(Self { owned, connected, stop: Some(stop), task: Some(task) })
    }

    /// The partitions held, as a watch: owned, or releasing until `release` returns, but
    /// never longer than the session timeout, nor after the session is lost: a `release`
    /// that hangs past either is still running (a handler call cannot be stopped) but no
    /// longer reported here, and is logged and counted (`abandoned_releases`).
    pub fn owned(&self) -> watch::Receiver<BTreeSet<u32>> {
        self.owned.clone()
    }

    /// Whether a `Register` stream is open, as a watch.
    pub fn connected(&self) -> watch::Receiver<bool> {
        self.connected.clone()
    }

    /// Leaves gracefully: `Deregister`; on `WAIT_FOR_DRAIN` keeps serving releases until
    /// the server ends the stream or the drain deadline passes. Every partition still
    /// held gets `unassigned` before this returns.
    ///
    /// The handler calls still queued then are waited for at most the session timeout
    /// (past it the partitions may have new owners anyway): a call that has not returned
    /// by then is abandoned (its future dropped), counted in `handler_calls_abandoned`,
    /// and the shutdown answers [`ClientError::HandlerCallsAbandoned`].
    pub async fn shutdown(mut self) -> Result<ShutdownOutcome, ClientError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.join().await
    }

    /// Waits for the client to end on its own (it only does on a fatal error).
    pub async fn join(&mut self) -> Result<ShutdownOutcome, ClientError> {
        match self.task.as_mut() {
            Some(task) => {
                let result = task.await.map_err(|e| ClientError::Task(e.to_string()))?;
                self.task = None;
                result
            }
            None => Err(ClientError::Task("the client already ended".into())),
        }
    }
}

impl Drop for AssignerClient {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

#[cfg(test)]
#[path = "shutdown_tests.rs"]
mod shutdown_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ClientConfig {
        ClientConfig::new(["http://127.0.0.1:50051"], "pod-0", "events")
    }

    #[test]
    fn defaults_follow_the_server_ttl() {
        let c = config();
        assert_eq!(c.session_timeout, Duration::from_secs(6));
        assert_eq!(c.keepalive, Duration::from_millis(500));
        assert!(c.keepalive * 2 < c.session_timeout);
        let short = config().with_server_lease_ttl(Duration::from_secs(1));
        assert_eq!(short.session_timeout, Duration::from_millis(600));
        assert!(short.validate().is_ok());
        assert_eq!(config().endpoints().map(|e| e.len()).ok(), Some(1));
    }

    #[test]
    fn the_server_ttl_lowers_the_session_timeout_and_never_raises_it() {
        let six = config().session_timeout;
        let lowered = effective_session_timeout(six, Duration::from_secs(3));
        assert!(lowered.abs_diff(Duration::from_millis(1800)) < Duration::from_millis(1), "{lowered:?}");
        assert_eq!(effective_session_timeout(six, Duration::from_secs(60)), six);
        assert_eq!(effective_session_timeout(six, Duration::from_secs(10)), six);
    }

    #[test]
    fn bad_configurations_are_refused_with_a_reason() {
        let refused = |c: ClientConfig| match c.validate().and_then(|()| c.endpoints().map(|_| ())) {
            Err(error) => error.to_string(),
            Ok(()) => panic!("accepted: {c:?}"),
        };
        let mut c = config();
        c.consumer_name = " ".into();
        assert!(refused(c).contains("consumer name"));
        let mut c = config();
        c.topic = String::new();
        assert!(refused(c).contains("topic"));
        let mut c = config();
        c.endpoints.clear();
        assert!(refused(c).contains("endpoint"));
        let mut c = config();
        c.endpoints = vec!["not a url".into()];
        assert!(refused(c).contains("'not a url'"));
        let mut c = config();
        c.keepalive = c.session_timeout;
        assert!(refused(c).contains("keepalive"));
        let mut c = config();
        c.session_timeout = Duration::ZERO;
        assert!(refused(c).contains("greater than zero"));
    }
}
