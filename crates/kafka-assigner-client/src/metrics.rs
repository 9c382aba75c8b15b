//! The client's metrics, registered in the user's `prometheus-client` registry.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

/// A label set with one `kind` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// What was counted (command kind, handler method, RPC and outcome).
    pub kind: String,
}

/// Counters and gauges of one client.
#[derive(Clone, Debug, Default)]
pub struct ClientMetrics {
    /// Commands received, by kind (`snapshot`, `assignment`, `warm`, `release`).
    pub commands: Family<KindLabel, Counter>,
    /// Handler calls, by method (`warm_ok`, `warm_error`, `assigned`, `release`, `unassigned`).
    pub handler_calls: Family<KindLabel, Counter>,
    /// RPCs sent, by method and outcome (`ready_ok`, `released_done`, `ready_refused`, ...).
    pub calls: Family<KindLabel, Counter>,
    /// Streams opened (first connect and every reconnect).
    pub connects: Counter,
    /// Times the client-side lease ran out and everything was unassigned.
    pub lease_expirations: Counter,
    /// Sessions dropped because a partition's epoch did not arrive within the call timeout.
    pub epoch_timeouts: Counter,
    /// `release` calls still running when their partition stopped being held (the session
    /// was lost, or the release outlived the session timeout).
    pub abandoned_releases: Counter,
    /// Handler calls still running when a shutdown stopped waiting for them (after the
    /// session timeout): the client ended without them.
    pub handler_calls_abandoned: Counter,
    /// The session timeout in force, in seconds: the configured one, or lower if the
    /// assigner's session TTL asks for it.
    pub session_timeout_seconds: Gauge<f64, AtomicU64>,
    /// Partitions held (owned or releasing).
    pub owned_partitions: Gauge,
    /// 1 while a stream is open.
    pub connected: Gauge,
}

impl ClientMetrics {
    /// Registers every metric under `kafka_assigner_client_` in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("kafka_assigner_client");
        r.register("commands", "Commands received from the assigner, by kind", self.commands.clone());
        r.register("handler_calls", "Handler calls, by method and outcome", self.handler_calls.clone());
        r.register("calls", "RPCs sent to the assigner, by method and outcome", self.calls.clone());
        r.register("connects", "Register streams opened", self.connects.clone());
        r.register(
            "lease_expirations",
            "Client-side lease expirations (everything unassigned)",
            self.lease_expirations.clone(),
        );
        r.register(
            "epoch_timeouts",
            "Sessions dropped because a partition's epoch did not arrive in time",
            self.epoch_timeouts.clone(),
        );
        r.register(
            "abandoned_releases",
            "Releases still running when their partition stopped being held (session lost or timed out)",
            self.abandoned_releases.clone(),
        );
        r.register(
            "handler_calls_abandoned",
            "Handler calls still running when the shutdown stopped waiting for them (after the session timeout)",
            self.handler_calls_abandoned.clone(),
        );
        r.register(
            "session_timeout_seconds",
            "Client-side session timeout in force (configured, or lowered to the assigner's TTL)",
            self.session_timeout_seconds.clone(),
        );
        r.register("owned_partitions", "Partitions held (owned or releasing)", self.owned_partitions.clone());
        r.register("connected", "1 while a Register stream is open", self.connected.clone());
    }

    /// Counts one `kind` in `family`.
    pub fn count(family: &Family<KindLabel, Counter>, kind: &str) {
        family.get_or_create(&KindLabel { kind: kind.to_string() }).inc();
    }
}
