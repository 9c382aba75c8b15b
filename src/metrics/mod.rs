//! Prometheus metrics, served by the admin server at `/metrics` (all names prefixed
//! `kafka_assigner_`).
//!
//! * Counters and histograms are updated where things happen: the coordinators (handoff
//!   steps, rebalances: the driver, from what the state machine observed,
//!   `coordinator/machine/observe.rs`), the store wrapper ([`crate::store::MeteredStore`]: latency and
//!   errors by operation, watch re-reads), the gRPC layer (calls by method and code, streams
//!   ended by reason) and the drain decider.
//! * The fleet gauges (partitions owned per consumer and per topic, unowned partitions,
//!   consumers by status, handoffs in flight by phase) are rebuilt from the coordinator's
//!   status view at every scrape ([`Metrics::render`]), so a consumer's series disappear
//!   with the consumer. Every instance reports the fleet as its cache sees it: aggregate
//!   them with `max`, not `sum`. The placement gauges (load imbalance, the shadow plan)
//!   are rebuilt the same way from the placement status ([`Metrics::render_with_placement`]).

pub mod grpc;
mod handoffs;
pub mod labels;
mod placement;
mod scrape;

use std::sync::{Mutex, atomic::AtomicU64};

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use labels::{
    DeferredLabels, DrainLabels, GrpcLabels, LimitLabels, MoveLabels, OpLabels, ReasonLabels,
    StoreErrorLabels, TlsReloadLabels,
};

/// A family of histograms with the same buckets.
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The metrics one instance exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Warming handoffs started by the leader.
    pub handoffs_started: Counter,
    /// Handoffs flipped to their new owner by `PartitionReady`.
    pub handoffs_ready: Counter,
    /// Handoffs completed by `PartitionReleased`.
    pub handoffs_released: Counter,
    /// Warming handoffs cancelled (target died, drained or stopped being the target).
    pub handoffs_cancelled: Counter,
    /// Warming handoffs cancelled because they were not ready in time.
    pub warm_timeouts: Counter,
    /// Releasing handoffs completed without an acknowledgement because it timed out.
    pub release_timeouts: Counter,
    /// Fleet give-backs whose giver's transport did not take the `unassigned` within the
    /// bound (one TTL): the giver's stream was ended, its leases wait for its registration.
    pub give_backs_timed_out: Counter,
    /// Releases and `unassigned`s of a relay pass sent after waiting out their bound (1 s)
    /// for the pass's gains (`assigned`, warms) to be taken: a consumer that does not read
    /// its stream made the handoff's overlap longer.
    pub losses_waited_out: Counter,
    /// Partitions given to a consumer directly (no live owner to hand off from).
    pub direct_assignments: Counter,
    /// Leader reconcile transactions that failed their compare (stale state or deposed).
    pub reconcile_conflicts: Counter,
    /// Registrations of this instance that no stream held for a TTL, ended by the sweep
    /// (a safety net: every other path settles its own registrations).
    pub registrations_swept: Counter,
    /// Renewals of the `--state-dir` epoch floor that could not be written (memory
    /// backend): the previous reservation covers half a block more, then epochs run past
    /// the floor a restart would read.
    pub epoch_floor_renewal_failures: Counter,
    /// `Register` calls whose caller went away while they still run (each ends without
    /// replacing anyone's registration: docs/design.md §6).
    pub registers_abandoned: Gauge,
    /// 1 while this instance leads (with leader groups: leads at least one group).
    pub is_leader: Gauge,
    /// How many leader groups this instance leads (0 or 1 with one group).
    pub leader_groups_led: Gauge,
    /// How many leader groups the topics are split into (`--leader-groups`; 0 on the
    /// backends without a leader).
    pub leader_groups: Gauge,
    /// Consumer streams held by this instance.
    pub streams: Gauge,
    /// `Register` calls refused by a stream limit, by limit.
    pub streams_refused: Family<LimitLabels, Counter>,
    /// Whole handoffs, warm start to `PartitionReleased`, in seconds.
    pub handoff_duration: Histogram,
    /// Warms, `WarmPartition` stored to `PartitionReady`, in seconds.
    pub warm_duration: Histogram,
    /// `PartitionReady` applied to `ReleasePartition` sent to the old owner, in seconds.
    pub release_delivery: Histogram,
    /// Leader reconcile rounds that changed the assignment.
    pub rebalances: Counter,
    /// Partitions whose movement a rebalance started (handoffs and direct assignments).
    pub partitions_moved: Counter,
    /// Seconds the leader spent planning (its pure pass over every topic, no I/O): with
    /// several instances, which one carries the planning, and how much of its CPU it takes.
    pub plan_seconds: Counter<f64, AtomicU64>,
    /// Store request latency by operation, in seconds.
    pub store_latency: HistogramFamily<OpLabels>,
    /// Failed store requests by operation and kind.
    pub store_errors: Family<StoreErrorLabels, Counter>,
    /// Re-reads of the whole prefix after a broken watch or at the resync interval.
    pub watch_resyncs: Counter,
    /// Finished gRPC calls by method and status code.
    pub grpc_calls: Family<GrpcLabels, Counter>,
    /// `Register` streams ended, by reason.
    pub streams_ended: Family<ReasonLabels, Counter>,
    /// `Deregister` answers by decision and reason.
    pub drain_decisions: Family<DrainLabels, Counter>,
    /// Changes to the gRPC TLS files seen by the reload watcher, by result: each check
    /// that finds changed files it cannot use yet counts once as `refused`.
    pub tls_reloads: Family<TlsReloadLabels, Counter>,
    fleet: scrape::FleetGauges,
    placement: placement::PlacementMetrics,
    warm_starts: handoffs::WarmStarts,
    /// Serialises refresh + encode, so two scrapes never interleave their rebuilds.
    scrape_lock: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn counter(registry: &mut Registry, name: &str, help: &str) -> Counter {
    let c = Counter::default();
    registry.register(name, help, c.clone());
    c
}

fn histogram(registry: &mut Registry, name: &str, help: &str, new: fn() -> Histogram) -> Histogram {
    let h = new();
    registry.register(name, help, h.clone());
    h
}

/// What a label set must be to key a registered family.
pub trait Labels:
    Clone
    + std::hash::Hash
    + Eq
    + std::fmt::Debug
    + prometheus_client::encoding::EncodeLabelSet
    + Send
    + Sync
    + 'static
{
}

impl<T> Labels for T where
    T: Clone
        + std::hash::Hash
        + Eq
        + std::fmt::Debug
        + prometheus_client::encoding::EncodeLabelSet
        + Send
        + Sync
        + 'static
{
}

fn counters<L: Labels>(registry: &mut Registry, name: &str, help: &str) -> Family<L, Counter> {
    let f = Family::<L, Counter>::default();
    registry.register(name, help, f.clone());
    f
}

impl Metrics {
    /// Registers every metric under the `kafka_assigner` prefix.
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("kafka_assigner");
        let r = &mut r;
        let handoffs_started = counter(r, "handoffs_started", "Warming handoffs started");
        let handoffs_ready = counter(r, "handoffs_ready", "Handoffs flipped by PartitionReady");
        let handoffs_released = counter(r, "handoffs_released", "Handoffs completed by PartitionReleased");
        let handoffs_cancelled = counter(r, "handoffs_cancelled", "Warming handoffs cancelled");
        let warm_timeouts = counter(r, "warm_timeouts", "Warming handoffs that timed out");
        let release_timeouts =
            counter(r, "release_timeouts", "Releases completed without acknowledgement after the timeout");
        let give_backs_timed_out = counter(
            r,
            "give_backs_timed_out",
            "Fleet give-backs whose giver did not take its unassigned within one TTL (its stream was ended)",
        );
        let losses_waited_out = counter(
            r,
            "losses_waited_out",
            "Releases and unassigns sent after waiting out their bound for the new owner's commands to be taken",
        );
        let direct_assignments = counter(r, "direct_assignments", "Partitions assigned with no live owner");
        let reconcile_conflicts =
            counter(r, "reconcile_conflicts", "Leader transactions refused by their compare");
        let registrations_swept = counter(
            r,
            "registrations_swept",
            "Registrations of this instance no stream held for a TTL, ended by the sweep",
        );
        let epoch_floor_renewal_failures = counter(
            r,
            "epoch_floor_renewal_failures",
            "Renewals of the --state-dir epoch floor that could not be written",
        );
        let registers_abandoned = Gauge::default();
        r.register(
            "registers_abandoned",
            "Register calls whose caller went away, still being carried out",
            registers_abandoned.clone(),
        );
        let is_leader = Gauge::default();
        r.register("is_leader", "1 while this instance leads (some leader group)", is_leader.clone());
        let leader_groups_led = Gauge::default();
        r.register("leader_groups_led", "Leader groups this instance leads", leader_groups_led.clone());
        let leader_groups = Gauge::default();
        r.register(
            "leader_groups",
            "Leader groups the topics are split into (--leader-groups)",
            leader_groups.clone(),
        );
        let streams = Gauge::default();
        r.register("streams", "Consumer streams held by this instance", streams.clone());
        let streams_refused =
            counters(r, "streams_refused", "Register calls refused by a stream limit, by limit");
        let handoff_duration = histogram(
            r,
            "handoff_duration_seconds",
            "Handoffs from warm start to PartitionReleased",
            labels::duration_histogram,
        );
        let warm_duration = histogram(
            r,
            "handoff_warm_duration_seconds",
            "Warms from WarmPartition to PartitionReady",
            labels::duration_histogram,
        );
        let release_delivery = histogram(
            r,
            "handoff_release_delivery_seconds",
            "PartitionReady applied to ReleasePartition sent to the old owner",
            labels::latency_histogram,
        );
        let rebalances = counter(r, "rebalances", "Leader reconcile rounds that changed the assignment");
        let partitions_moved =
            counter(r, "partitions_moved", "Partitions moved by rebalances (handoffs and direct)");
        let plan_seconds = Counter::<f64, AtomicU64>::default();
        r.register("plan_seconds", "Seconds the leader spent planning (pure, no I/O)", plan_seconds.clone());
        let store_latency: HistogramFamily<OpLabels> =
            Family::new_with_constructor(labels::latency_histogram);
        r.register(
            "store_request_duration_seconds",
            "Store request latency by operation",
            store_latency.clone(),
        );
        let store_errors = counters(r, "store_errors", "Failed store requests by operation and kind");
        let watch_resyncs =
            counter(r, "watch_resyncs", "Re-reads of the whole prefix (broken watch or resync)");
        let grpc_calls = counters(r, "grpc_calls", "Finished gRPC calls by method and status code");
        let streams_ended = counters(r, "streams_ended", "Register streams ended, by reason");
        let drain_decisions = counters(r, "drain_decisions", "Deregister answers by decision and reason");
        let tls_reloads = counters(
            r,
            "tls_reloads",
            "Changes to the gRPC TLS files seen, by result (reloaded, or refused: the previous ones stay)",
        );
        let fleet = scrape::FleetGauges::register(r);
        let placement = placement::PlacementMetrics::register(r);
        Self {
            registry: std::mem::take(r),
            handoffs_started,
            handoffs_ready,
            handoffs_released,
            handoffs_cancelled,
            warm_timeouts,
            release_timeouts,
            give_backs_timed_out,
            losses_waited_out,
            direct_assignments,
            reconcile_conflicts,
            registrations_swept,
            epoch_floor_renewal_failures,
            registers_abandoned,
            is_leader,
            leader_groups_led,
            leader_groups,
            streams,
            streams_refused,
            handoff_duration,
            warm_duration,
            release_delivery,
            rebalances,
            partitions_moved,
            plan_seconds,
            store_latency,
            store_errors,
            watch_resyncs,
            grpc_calls,
            streams_ended,
            drain_decisions,
            tls_reloads,
            fleet,
            placement,
            warm_starts: handoffs::WarmStarts::default(),
            scrape_lock: Mutex::new(()),
        }
    }

    /// The OpenMetrics text exposition (counters and histograms as they stand; the fleet
    /// gauges as of the last [`Metrics::render`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    /// Rebuilds the fleet gauges from `status`, then encodes everything: what `/metrics`
    /// serves.
    pub fn render(&self, status: &crate::status::StatusView) -> String {
        self.render_with_placement(status, &[])
    }

    /// Rebuilds the fleet gauges from `status` and the placement gauges from `placement`,
    /// then encodes everything: what `/metrics` serves for a handoff backend.
    pub fn render_with_placement(
        &self,
        status: &crate::status::StatusView,
        placement: &[crate::status::TopicPlacement],
    ) -> String {
        let _guard = self.scrape_lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.fleet.refresh(status);
        self.placement.refresh(placement);
        self.warm_starts.retain_in_flight(status);
        self.encode()
    }

    /// The leader wrote a move of a partition of `topic`, for `reason` (`join`, `leave`,
    /// `balance`, `rollout`, `failover`).
    pub fn observe_partition_move(&self, topic: &str, reason: &'static str) {
        self.placement.moves.get_or_create(&MoveLabels { topic: topic.to_string(), reason }).inc();
    }

    /// A balance move of `topic` started being held back, `why` (`budget`, `cooldown`).
    pub fn observe_move_deferred(&self, topic: &str, why: &'static str) {
        self.placement.deferred.get_or_create(&DeferredLabels { topic: topic.to_string(), why }).inc();
    }

    /// A leader reconcile round wrote its changes, which move `moved` partitions (a round
    /// that only cancels or times out handoffs is not a rebalance).
    pub fn observe_rebalance(&self, moved: usize) {
        if moved > 0 {
            self.rebalances.inc();
            self.partitions_moved.inc_by(moved as u64);
        }
    }

    /// A leader wrote a whole plan that did what `report` says: the rebalance, the handoffs
    /// started, the direct assignments, the cancels and the timeouts.
    pub fn observe_plan_written(&self, report: &crate::handoff::PlanReport) {
        self.observe_rebalance(report.started.len() + report.assigned_directly.len());
        self.handoffs_started.inc_by(report.started.len() as u64);
        self.direct_assignments.inc_by(report.assigned_directly.len() as u64);
        self.handoffs_cancelled.inc_by(report.cancelled.len() as u64);
        self.warm_timeouts.inc_by(report.warm_timeouts.len() as u64);
        self.release_timeouts.inc_by(report.release_timeouts.len() as u64);
    }

    /// A `Register` was refused by the stream limit `limit`; returns how many it has
    /// refused so far.
    pub fn observe_stream_refused(&self, limit: &'static str) -> u64 {
        self.streams_refused.get_or_create(&LimitLabels { limit }).inc() + 1
    }

    /// A `Deregister` was answered (`drain`: `WAIT_FOR_DRAIN`) for `reason`.
    pub fn observe_drain_decision(&self, drain: bool, reason: &'static str) {
        let decision = if drain { "wait_for_drain" } else { "shutdown_now" };
        self.drain_decisions.get_or_create(&DrainLabels { decision, reason }).inc();
    }

    /// The reload watcher saw the gRPC TLS files change and `reloaded` them, or could not
    /// use them yet.
    pub fn observe_tls_reload(&self, reloaded: bool) {
        let result = if reloaded { "reloaded" } else { "refused" };
        self.tls_reloads.get_or_create(&TlsReloadLabels { result }).inc();
    }
}
