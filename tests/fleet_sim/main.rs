//! Simulation of the fleet backend: two or three
//! [`FleetCoordinator`](kafka_assigner::coordinator::FleetCoordinator) instances over ONE
//! [`MemoryStore`](kafka_assigner::store::MemoryStore), each behind its own
//! [`FaultyStore`](kafka_assigner::store::FaultyStore), on paused tokio time, driven by
//! seeded schedules, with the invariants checked from what each consumer was told.
//!
//! # A run
//!
//! * **Shape** (`schedule.rs`, from the seed): 2–3 instances, 2–5 consumers, one topic of
//!   1–12 partitions, a TTL of 2–3 s, a claim interval of 100–300 ms, 12–20 s of actions.
//!   Lossy runs have 3–5 consumers, 4–12 partitions, and only two join early (the others'
//!   joins make the early ones give back). Consumers call the `ConsumerGroupCoordinator`
//!   trait directly (no gRPC) and read their streams at once.
//! * **Actions**, half churn: consumers join on a random instance, leave (`Deregister`;
//!   they keep acting on their stream until it ends), crash (drop the stream; back within
//!   half a TTL, after one to three, or never), move to another instance at once (sometimes
//!   leaving the old stream half-open). The other half are faults, by kind (`Kind`): lost
//!   answers (a chance, and the next transactions) with a lagging watch, also aimed at the
//!   give-back a join causes (`LossyJoin`: every watch lags, every instance but the
//!   joiner's loses its next transaction's answer); delayed answers and watch batches; an
//!   instance cut off or its connection stalled (held requests land late; with a reset,
//!   their answers are lost), its sessions expired by the store once it was out of touch
//!   for a TTL; instances crashing (their consumers' connections break; half the time the
//!   store expires their sessions at once) and restarting.
//! * Then the faults stop, every instance runs, consumers that want to be online
//!   reconnect, and the fleet must settle.
//!
//! # Invariants (from the consumers' side)
//!
//! * (a) **Strict exclusivity**: after every command a consumer takes (in the order they
//!   take them, which is what the fleet waits on before it frees a given-back lease), no
//!   partition is believed owned by two consumers. A consumer whose stream ended, or whose
//!   connection broke, stops at once and believes nothing.
//! * (a′) A believed partition is backed by the believer's lease in the store at the end of
//!   every instant. No relay lag needs allowing (`driver.rs`, `check_backing`): gains are
//!   relayed after the lease exists, and a lease goes only after its believer was told or
//!   fenced.
//! * (b) Commands never contradict the stream: the snapshot first, no `assigned` of an owned
//!   partition, no `unassigned` of one not owned, partitions in range, a clean end only after
//!   `Deregister` and after everything was unassigned; a stream is never ended as replaced
//!   (`ABORTED`) unless its consumer registered again. The store: every lease's owner has a
//!   member record at every revision.
//! * (c) Within 20 TTL + 10 s of the faults stopping: every partition leased by exactly
//!   one online consumer, each holding its quota (`⌊P/N⌋ + (rank < P mod N)`, name order),
//!   the members exactly the online consumers, each believing exactly its leases, every
//!   instance's status showing the store's owners. The bound: a dead registration goes a
//!   TTL after its stream dropped, a reconnect waits at most 1.5 TTL, each claim step at
//!   most 300 ms; runs settle within a few TTL (the slowest is reported), the rest is margin.
//! * (d) An instance cut off (or stalled) ends every stream it ends within 0.8 TTL of the
//!   cut (its fence is due 3/4 TTL after its last renewal, docs/design.md §6), and a TTL
//!   after the cut it holds none.
//!
//! Not covered: the store expiring a session early while its instance is in touch (an
//! operator's revoke): the fleet then keeps the streams open while the leases are gone,
//! so strict exclusivity cannot hold, by design (`shared/lease.rs`).
//!
//! What `coordinator_sim` drives the same way (draws, the loop, registering and
//! reconnecting, cut-offs and restarts, the knobs and survey) is in `tests/sim_support`.
//!
//! # Running
//!
//! Six tests, one per kind; seed `s` runs `KINDS[s % 6]`. `FLEET_SIM_SCHEDULES=N` runs N
//! schedules in all (default 300), `FLEET_SIM_BASE=B` starts at seed B, `FLEET_SIM_SEED=S`
//! replays seed S (its log digest is printed: replays compare it), `FLEET_SIM_TRACE=1`
//! prints every step as it happens, `FLEET_SIM_LOG=<filter>` the coordinator's own logs,
//! `FLEET_SIM_SURVEY=1` runs every seed and lists the failures. A failure prints the seed,
//! the shape, the last 300 steps and the store.
//!
//! Replays: the schedule, the consumers' draws and each wrapper's fault draws are fixed by
//! the seed, but the coordinator's own randomness (`tokio::select!` branch order, hash
//! seeds) is not seedable on stable tokio, so two replays of a seed may interleave
//! differently (compare the digests); a failing seed fails again on nearly every replay.

#![forbid(unsafe_code)]

#[macro_use]
#[path = "../sim_support/mod.rs"]
mod sim_support;

mod consumers;
mod driver;
mod faults;
mod invariants;
mod schedule;

use std::time::Duration;

use driver::{Outcome, Sim};
use schedule::{KINDS, Kind};
use sim_support::runner::{self, Knobs, Watchdog};

/// This simulation's environment variables.
const KNOBS: Knobs = Knobs("FLEET_SIM_");
/// Schedules in all when no variable says otherwise.
const DEFAULT_SCHEDULES: u64 = 300;
/// Wall time one schedule may take: one that spins without letting paused time advance
/// would otherwise hang the test for good.
const SCHEDULE_BUDGET: Duration = Duration::from_secs(120);

/// Runs one schedule on its own paused runtime, under a [`Watchdog`].
fn run_one(seed: u64, trace: bool) -> Result<Outcome, String> {
    let watchdog = Watchdog::start(
        SCHEDULE_BUDGET,
        format!("fleet simulation: seed {seed} did not finish within {SCHEDULE_BUDGET:?} of wall time"),
    );
    runner::run_paused(watchdog, async move {
        let mut sim = Sim::new(seed, trace).await.map_err(|e| format!("seed {seed}: setup failed: {e}"))?;
        let Err(why) = sim.run().await else { return Ok(sim.outcome.clone()) };
        let shape = &sim.shape;
        let mut report = runner::report(
            &format!(
                "fleet simulation failed: seed {seed} (replay: FLEET_SIM_SEED={seed} FLEET_SIM_TRACE=1)"
            ),
            &why,
            &format!(
                "{:?} instances={} consumers={} partitions={} ttl={:?} claim interval={:?}",
                shape.kind, shape.instances, shape.pool, shape.partitions, shape.ttl, shape.claim_interval
            ),
            &sim.world.log,
        );
        report.push_str(&format!(
            "  store: leases {:?}\n  members {:?}\n",
            sim.truth.leases, sim.truth.members
        ));
        Err(report)
    })
}

/// Runs the seeds of `kind` (its share of `FLEET_SIM_SCHEDULES` from `FLEET_SIM_BASE`, or
/// `FLEET_SIM_SEED` alone if it is one of its seeds); panics with the first failure's
/// report (or, in a survey, with the list of the failed seeds).
fn run_kind(kind: Kind) {
    let index = KINDS.iter().position(|k| *k == kind).unwrap_or_default() as u64;
    let seeds = KNOBS.seeds(index, KINDS.len() as u64, KNOBS.u64("SCHEDULES").unwrap_or(DEFAULT_SCHEDULES));
    if seeds.is_empty() {
        return;
    }
    if let Ok(filter) = std::env::var("FLEET_SIM_LOG") {
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    }
    let trace = KNOBS.on("TRACE");
    let started = std::time::Instant::now();
    let mut total = Outcome::default();
    let (label, single) = (format!("{kind:?}"), seeds.len() == 1);
    runner::run_seeds(
        &label,
        &seeds,
        KNOBS.on("SURVEY"),
        |seed| run_one(seed, trace),
        |seed, outcome| {
            if single {
                eprintln!("{kind:?}: seed {seed} passed; log digest {:016x}", outcome.digest);
            }
            total.add(&outcome);
        },
    );
    eprintln!(
        "{kind:?}: {} schedules in {:?}: {} commands, {} streams, {} partitions told to stop, {} streams fenced \
         (latest {:.2} TTL after the cut), {} lost answers, slowest settle {:?}, {} new owners' epochs checked",
        seeds.len(),
        started.elapsed(),
        total.commands,
        total.streams,
        total.stopped,
        total.fenced,
        total.max_fence_ttl,
        total.lost_answers,
        total.settled_after,
        total.epoch_checks
    );
    // Not vacuous: consumers were told things, gave partitions back, were fenced.
    assert!(total.commands > seeds.len() as u64, "{kind:?}: hardly any command was delivered");
    if seeds.len() >= 10 {
        assert!(total.stopped > 0, "{kind:?}: no consumer was ever told to stop a partition");
        assert!(total.epoch_checks > 0, "{kind:?}: no new owner's epoch was ever checked");
        match kind {
            Kind::CutOffs => assert!(total.fenced > 0, "{kind:?}: no stream was ever fenced"),
            Kind::Lossy => assert!(total.lost_answers > 0, "{kind:?}: no answer was ever lost"),
            _ => {}
        }
    }
}

#[test]
fn calm() {
    run_kind(Kind::Calm);
}

#[test]
fn lossy() {
    run_kind(Kind::Lossy);
}

#[test]
fn delays() {
    run_kind(Kind::Delays);
}

#[test]
fn cut_offs() {
    run_kind(Kind::CutOffs);
}

#[test]
fn crashes() {
    run_kind(Kind::Crashes);
}

#[test]
fn mixed() {
    run_kind(Kind::Mixed);
}
