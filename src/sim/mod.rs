//! The deterministic whole-cluster simulation (issue 40): N handoff instances, each a state
//! and a step (`coordinator::machine`), over one model of etcd ([`StoreModel`]), with
//! consumer models, a virtual clock and faults, in one thread, from a seed. With
//! [`SimConfig::backend`] = [`SimBackend::Fleet`], N fleet instances instead
//! (`coordinator::fleet_backend::machine`), checked against the fleet's invariants
//! (`fleet_truth.rs`, `fleet_checks.rs`; docs/simulation.md).
//!
//! # A run ([`run`])
//!
//! * **Cluster**: [`SimConfig::instances`] instance states (3), [`SimConfig::consumers`]
//!   consumers (6), one topic of [`SimConfig::partitions`] partitions (12). Everything that
//!   happens is an event on one queue ordered by (virtual time, sequence number): there
//!   are no threads, no tokio, no sockets and no sleeps, and the only source of chance is
//!   the seeded [`Rng`]. Every collection iterated is ordered, so a seed replays exactly
//!   (the trace hash says so).
//! * **Network**: each store request reaches the store model after a random delay and its
//!   answer comes back after another, or is lost, or fails `Unavailable` (an outage, an
//!   instance cut off). Watch batches arrive late, a watch may be cut or hang (an instance
//!   cut off hears nothing, not even progress marks), and the store compacts its history.
//!   Commands reach a consumer in the order they were sent, after a delay.
//! * **Lease keepers** ([`lease`]): each instance's lease through the same network, fenced
//!   at ¾ TTL without a renewal, reported to the instance as [`LeaseState`].
//! * **Consumers** ([`consumer`]): register on a random instance, warm and answer
//!   `PartitionReady`, release and answer `PartitionReleased` (one in eight answers never,
//!   until the faults stop), crash (a new incarnation comes back under the same name),
//!   pause, reconnect elsewhere, deregister (drain or shut down).
//! * **Schedule** ([`schedule`]): [`SimConfig::actions`] faults and consumer actions drawn
//!   from the seed; then the faults stop and every consumer comes back.
//!
//! # Invariants ([`Invariant`]), checked after every step
//!
//! * [`Invariant::Exclusive`]: no partition believed owned by two consumers outside a
//!   handoff's release window (from what each stream told its consumer, against the store).
//! * [`Invariant::Epochs`]: each new ownership's epoch is above every earlier one of the
//!   partition (so epochs are unique per partition), and a warm's coming epoch is above its
//!   source's.
//! * [`Invariant::LegalMove`], [`Invariant::LeaderOnly`], [`Invariant::NoComeback`]: every
//!   revision is a step of the handoff rules, a move by plan is written by the instance that
//!   holds the leader key, a replaced registration never comes back.
//! * [`Invariant::Orphan`]: no registration without a stream for more than 1.5 TTL (once
//!   the store can be written: an outage is not counted).
//! * [`Invariant::OutageMoved`]: an outage shorter than the settle period moves nothing
//!   (the [`Kind::Outage`] schedules).
//! * [`Invariant::HandoffOverdue`]: every handoff's phase ends within its time limit (plus
//!   a leader's reconcile pass and a failover) while the store is reachable.
//! * [`Invariant::Converged`]: once the faults stop, within [`SimConfig::converge_within`],
//!   every partition has one owner among the online consumers, balanced as the assignor
//!   places them, no handoff is left, and every consumer believes exactly what it owns.
//! * [`Invariant::Contradiction`]: a stream never contradicts itself (the snapshot first,
//!   no warm of a partition owned outright, partitions in range).
//!
//! A failure ([`Failure`]) names the seed, the invariant and the last steps of the trace
//! (the seed is run again with the text of its steps kept).

mod actors;
mod check_state;
mod checks;
pub(crate) mod cluster;
pub mod consumer;
pub(crate) mod events;
mod fleet_checks;
mod fleet_truth;
mod instance;
pub mod lease;
mod rng;
pub mod scenario;
mod scenario_state;
mod schedule;
mod store_side;
mod trace;
mod truth;

use std::{fmt, time::Duration};

pub use crate::coordinator::machine::io::LeaseState;
pub use crate::store::StoreModel;
pub use rng::Rng;
pub use scenario::Scenario;
pub use schedule::Kind;
pub use trace::{Trace, TraceHasher};

/// The shape and timing of a simulated cluster.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Instance states (assigner processes).
    pub instances: usize,
    /// Consumers (names; each may have many incarnations).
    pub consumers: usize,
    /// Partitions of each topic.
    pub partitions: u32,
    /// Topics (1: the one topic `events`; more: `t0`, `t1`, ...). Consumer `c` reads topic
    /// `c mod topics`, so each topic has `consumers / topics` of them.
    pub topics: u32,
    /// Faults and consumer actions drawn per schedule.
    pub actions: usize,
    /// The session TTL of instances (and so of registrations).
    pub ttl: Duration,
    /// The leader's settle period after an interruption (`None`: one TTL).
    pub settle: Option<Duration>,
    /// The leader's reconcile interval.
    pub reconcile: Duration,
    /// A warming handoff not ready after this long is cancelled.
    pub warm_timeout: Duration,
    /// A releasing handoff not acknowledged after this long is completed anyway.
    pub release_timeout: Duration,
    /// After the faults stop, the bound within which the cluster must converge.
    pub converge_within: Duration,
    /// Whether a restarted instance keeps its id (`i0`), or takes a new one per life
    /// (`i0.2`, `i0.3`, ...).
    pub same_id_on_restart: bool,
    /// Whether a lost store answer never arrives (the instance must time the request out
    /// itself), or arrives as the driver's timeout (`Unavailable` after its call budget,
    /// whether or not the request took effect), as a driver with a call budget does.
    pub lost_answers_vanish: bool,
    /// Whether an instance's store answers may arrive in another order than the store
    /// served its requests in (off by default: one ordered connection; the mutation table
    /// in docs/simulation.md was measured so).
    pub answers_reorder: bool,
    /// Whether an instance's connection may stall in a lossy period: a request held on its
    /// way for half a TTL to two and a half TTLs, so it lands long after the instance
    /// timed it out (and maybe after its session expired and another instance decided),
    /// and its answer comes as late. Off by default, like `answers_reorder`.
    pub stalls: bool,
    /// `--leader-groups` of every instance: with more than one, the topic is planned by
    /// its group's leader, campaigned for by the preferred instance and handed over as
    /// instances come and go (`leader_groups.rs`).
    pub leader_groups: u32,
    /// The checks that read the whole cluster (exclusive ownership, orphans, handoffs in
    /// time, convergence) run after every `check_every`-th step; those the truth makes as it
    /// follows each revision (legal moves, epochs, the leader's fence, no comeback) run on
    /// every revision whatever this says. 1 but for the fleet-size scenario, where one
    /// whole-cluster check reads 100,000 partitions.
    pub check_every: u64,
    /// A scripted run instead of a schedule drawn from the seed ([`scenario`]).
    pub scenario: Option<Scenario>,
    /// What the instances' leaders pay to plan one partition, in ns
    /// (`Start::plan_nanos_per_partition`): with more than 0 they plan at most one part in
    /// five of the time, as the running leader does (`PLAN_PACE`).
    pub plan_nanos_per_partition: u64,
    /// Which backend's instances run (handoff by default: every trace hash and mutation
    /// seed of the handoff was measured so).
    pub backend: SimBackend,
}

/// The store-backed backend whose instances a run drives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SimBackend {
    /// `coordinator::handoff_backend::machine`: a leader plans, warm handoffs move.
    #[default]
    Handoff,
    /// `coordinator::fleet_backend::machine`: no leader, per-partition leases claimed up
    /// to a fair share, no warm handoffs (module docs of `fleet_backend`).
    Fleet,
}

impl Default for SimConfig {
    fn default() -> Self {
        let ttl = Duration::from_secs(2);
        Self {
            instances: 3,
            consumers: 6,
            partitions: 12,
            actions: 300,
            ttl,
            settle: None,
            reconcile: Duration::from_millis(200),
            warm_timeout: Duration::from_secs(4),
            release_timeout: Duration::from_secs(3),
            converge_within: Duration::from_secs(30),
            same_id_on_restart: false,
            lost_answers_vanish: false,
            answers_reorder: false,
            stalls: false,
            leader_groups: 1,
            topics: 1,
            check_every: 1,
            scenario: None,
            plan_nanos_per_partition: 0,
            backend: SimBackend::Handoff,
        }
    }
}

impl SimConfig {
    /// The run's topics.
    pub(crate) fn topic_set(&self) -> events::Topics {
        events::Topics { count: self.topics.max(1), partitions: self.partitions }
    }
}

/// The invariants (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Invariant {
    /// Two consumers believe they own a partition outside a release window.
    Exclusive,
    /// An epoch did not grow.
    Epochs,
    /// A revision is not a step of the handoff rules.
    LegalMove,
    /// A move by plan was written by an instance not holding the leader key.
    LeaderOnly,
    /// A replaced registration came back.
    NoComeback,
    /// A registration outlived its stream by more than 1.5 TTL.
    Orphan,
    /// An outage within the settle period moved a partition.
    OutageMoved,
    /// A handoff outlived its time limit.
    HandoffOverdue,
    /// The cluster did not converge after the faults stopped.
    Converged,
    /// A stream contradicted itself.
    Contradiction,
}

/// A broken invariant: which, and what was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The invariant.
    pub invariant: Invariant,
    /// What broke it, for a human.
    pub detail: String,
}

impl Violation {
    /// A violation of `invariant`.
    pub fn new(invariant: Invariant, detail: impl Into<String>) -> Self {
        Self { invariant, detail: detail.into() }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.invariant, self.detail)
    }
}

/// A schedule that broke an invariant.
#[derive(Clone, Debug)]
pub struct Failure {
    /// Its seed (`CLUSTER_SIM_SEED` replays it).
    pub seed: u64,
    /// Its kind.
    pub kind: Kind,
    /// What broke.
    pub violation: Violation,
    /// The virtual time of the failing step, in µs since the start.
    pub at: u64,
    /// The last steps, oldest first (empty unless the failure was replayed with text).
    pub last_steps: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {} ({:?}) broke {} at {:.3}s (replay: CLUSTER_SIM_SEED={})",
            self.seed,
            self.kind,
            self.violation,
            self.at as f64 / 1e6,
            self.seed
        )?;
        for line in &self.last_steps {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// What a passing schedule did (counts show the checks were not vacuous).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The trace hash: equal for equal seeds.
    pub trace_hash: u64,
    /// Events handled.
    pub steps: u64,
    /// Instance steps taken.
    pub machine_steps: u64,
    /// Store revisions written.
    pub revisions: i64,
    /// Commands consumers applied.
    pub commands: u64,
    /// Overlaps of claims that a release window allowed.
    pub in_window: u64,
    /// Moves by plan checked to be the leader's.
    pub plan_moves: u64,
    /// Owner changes whose epochs were compared.
    pub epoch_checks: u64,
    /// Fleet leases written (claims, raises, reconnects moving them); 0 in handoff runs.
    pub lease_writes: u64,
    /// Virtual time from the faults' end to convergence, in µs.
    pub converged_after: u64,
    /// A scenario's phases, measured (`None` for a drawn schedule).
    pub scenario: Option<scenario::Report>,
}

/// Runs the schedule of `seed` (its kind drawn from the seed); `Err` names the first
/// broken invariant, with the last steps of the trace.
pub fn run(seed: u64, config: &SimConfig) -> Result<Outcome, Box<Failure>> {
    run_keeping(seed, config, 80)
}

/// [`run`], keeping the last `keep` steps of a failing schedule.
pub fn run_keeping(seed: u64, config: &SimConfig, keep: usize) -> Result<Outcome, Box<Failure>> {
    match cluster::Cluster::new(seed, config, None).run() {
        Ok(outcome) => Ok(outcome),
        Err(failure) => {
            // The same seed again, keeping the text of its steps this time.
            let replay = cluster::Cluster::new(seed, config, Some(keep)).run();
            Err(replay.err().unwrap_or(failure))
        }
    }
}
