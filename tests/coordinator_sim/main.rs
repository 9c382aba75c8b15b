//! Coordinator-level simulation: two or three
//! [`HandoffCoordinator`](kafka_assigner::coordinator::HandoffCoordinator) instances over
//! ONE [`MemoryStore`](kafka_assigner::store::MemoryStore), each behind its own
//! [`FaultyStore`](kafka_assigner::store::FaultyStore), on paused tokio time, driven by
//! seeded schedules, with the ownership invariants checked from the consumers' side.
//!
//! # A run
//!
//! * **Fleet** (`schedules.rs`, drawn from the seed): 2–3 instances, a pool of 2–5
//!   consumers, one topic of 1–12 partitions, a TTL of 1–3 s, a reconcile interval of
//!   100–300 ms, a warm cap of 1–4. The consumers call the `ConsumerGroupCoordinator` trait
//!   directly (no gRPC) and read their `CommandStream`s.
//! * **Schedule**: 15–25 s of timed actions drawn before the run starts: consumers join (on
//!   a random instance), crash (drop the stream; back within the TTL, after it, or never),
//!   deregister; and, by kind, store faults: lost answers, delayed answers and watch
//!   batches, one instance cut off (its session expired by the store once cut off for a
//!   TTL), instances crashing (`HandoffCoordinator::crash`) and restarting, a whole-store
//!   outage. A call already running on an instance that crashes still completes on its
//!   frozen cache, as on a process that stalled mid-call and resumed; its answer counts
//!   only for `PartitionReady` / `PartitionReleased` (a `Register` answer is lost).
//! * **Targeted families** (`families.rs`) aim at what random schedules reach too rarely:
//!   `Stalls` (an instance's connection hangs, often from its next write of ownership —
//!   a leader's plan, a consumer's call — so that write lands late, after a session expired
//!   and another instance won; when the connection then resets, the answers it held are
//!   lost: delayed answers lost, not only those in flight at a cut), `Revokes` (the store
//!   expires the session of the leader, or of any instance, early while its streams are
//!   open; its answers slowed,
//!   one of its consumers restarting elsewhere meanwhile), `ReadyRaces` (a `PartitionReady`
//!   held on its way to the store while a burst of consumers joins). Consumers there also
//!   restart while their old stream stays open (a half-open connection); in `Stalls`, also
//!   while their `Deregister` is held on its way to the store (it must then change nothing).
//! * **Consumers** (`consumers.rs`, `replies.rs`) act only on what they were told: a warm is
//!   answered with `PartitionReady` and a release with `PartitionReleased` after 0–1.5 s
//!   (one in eight never, until the faults stop), retried on `UNAVAILABLE` / `ABORTED`; a
//!   stream that ends with an error means the consumer stops at once and reconnects after
//!   50 ms–1.5 TTL; a failed `Deregister` is retried, a `NOT_FOUND` one makes it exit.
//! * **Truth** is a watch on the shared store that no fault touches (`model.rs`).
//!
//! # Invariants (`invariants.rs`, `model.rs`, `fleet.rs`)
//!
//! * After every instant of virtual time (every task woken at that instant has run): no two
//!   consumers believe they own a partition outside a handoff's release window (the store
//!   flipped it away from one of them with a `Releasing` handoff since it last became the
//!   owner; its instance may relay that later than the new owner's does).
//! * Commands never contradict the stream: the snapshot first, no warm of a partition owned
//!   outright, partitions in range.
//! * A live consumer's stream is never ended as replaced (`ABORTED`): it registers again
//!   only once it has no stream, so an older registration took its name back.
//! * An instance cut off from the store for a TTL (its session could have expired) holds no
//!   open stream any more: its consumers were told `unassigned` and their streams ended;
//!   and every stream it ends while cut off ends within 0.8 TTL of the cut (the fence is
//!   due 3/4 TTL after the last renewal).
//! * Every store revision is a step of the handoff rules: ownership leaves a registered
//!   owner only through a `PartitionReady` flip of a warming handoff to its target, a
//!   partition whose owner is gone is assigned directly, a warm starts from the owner, only
//!   a flip makes a handoff `Releasing`; a flip gives the partition only to a registered,
//!   `Active` consumer (in strict mode: every assignment does). A move by plan (a warm
//!   started or cancelled, a direct assignment) is written by the instance that holds the
//!   leader key at that revision (each instance's `FaultyStore` logs what it wrote): a
//!   deposed leader's late write changes nothing. A registration id that was replaced never
//!   comes back over the registration that replaced it (a rebind finds the name free).
//! * After the faults stop: within 20 TTL + 10 s, every partition is owned exactly once by
//!   an online consumer, balanced (⌊P/N⌋ or ⌈P/N⌉), no handoff left in the store nor in
//!   any instance's `status()`, the registrations are exactly the online consumers, and
//!   each consumer believes exactly what it owns.
//!
//! # Bugs it found, all fixed (`COORD_SIM_STRICT=0` steers around them again)
//!
//! * **A**: a disconnected consumer's registration whose deletion (a TTL after the stream
//!   ended) fails because the store is out of reach is never deleted while the instance
//!   lease lives (its settling gave up): the consumer keeps its partitions for good.
//!   Fixed: the deletion is retried until it succeeds or the instance stops.
//! * **B**: a consumer that goes away before its instance's cache has seen its registration
//!   leaves the registration behind for good (`held` says `NotOurs`). Fixed: before the
//!   cache has seen it, a registration counts as held for the TTL.
//! * **C**: `PartitionReady` through an instance whose cache lags may answer OK without
//!   writing anything ("already in effect" decided on the cache). Fixed: "already in
//!   effect" is decided on the store's state.
//! * **D**: `PartitionReady` from a `Draining` consumer is accepted (ownership flips to
//!   it). Fixed: a draining target is refused (`FAILED_PRECONDITION`).
//! * **E**: a direct assignment does not guard the new owner's registration, so a stale
//!   cache can give a partition to a consumer that just went away (a gap until the next
//!   reconcile). Fixed: the leader's batch compares the new owner's registration.
//! * **H**: two consumers that deregister at once, each decided while its instance's cache
//!   still saw the other `Active`, both drain with nobody left to drain to: neither drain
//!   ever ends (`mixed`, seed 707, about 1 run in 25). Fixed: whether someone can take
//!   over is decided on the candidates' records in the store, and the drain is guarded by
//!   the one it counts on. (Not steered around.)
//!
//! # Open bugs it found, steered around until fixed (`COORD_SIM_OPEN=1` runs into them)
//!
//! * **F**: a registration the store expired early is written again as `Active`
//!   (`rewrite_lost` writes a fresh active record), so a draining consumer's drain is
//!   forgotten: it is never drained, its stream never ends and its registration stays.
//!   Steered: the store does not expire a session that holds a draining stream.
//! * **G**: while such a registration is being written again, `PartitionReady` and
//!   `PartitionReleased` are refused `NOT_FOUND`, which a client takes as final; the
//!   handoff then waits for its (wall-clock) time limit. Steered: a consumer whose stream
//!   is open tries again.
//!
//! # Running
//!
//! Nine tests, one per schedule kind (`schedules::Kind`): six random kinds, where seed `s`
//! runs kind `KINDS[s % 6]`, and three targeted families with seeds of their own, where seed
//! `s` runs `FAMILIES[s % 3]`. `COORD_SIM_SCHEDULES=N` runs N schedules of the random kinds
//! in all (default 360), `COORD_SIM_FAMILY_SCHEDULES=N` N of each family (default 60);
//! `scripts/test` (CI) sets both higher. `COORD_SIM_SEED=S` replays seed S (in the random
//! kind and the family it belongs to), `COORD_SIM_BASE=B` starts the seeds at B,
//! `COORD_SIM_STRICT=0` steers around the fixed bugs above, `COORD_SIM_OPEN=1` runs into
//! the open ones, `COORD_SIM_SCHEDULE_BUDGET_SECS` bounds one schedule's wall time (120 s;
//! a schedule that spins past it fails the run, naming its seed), `COORD_SIM_SURVEY=1` runs every seed and lists the failures at the end,
//! `COORD_SIM_TRACE=1` prints every step as it happens (run with `--nocapture`: a failing
//! replay and a passing one compare), `COORD_SIM_LOG=<filter>` the coordinator's own logs. A
//! failure prints the seed, the fleet's shape, the last steps and every instance's status.
//! Replays are deterministic up to the coordinator's own randomness (`tokio::select!`
//! branch order, hash seeds): the schedule and the consumers' draws are fixed by the seed.
//!
//! # Layout
//!
//! `schedules.rs` (shapes, actions), `families.rs` (the targeted families),
//! `driver.rs` (the backend's hooks into the loop, the checks per instant), `fleet.rs`
//! (actions, faults, the quiet phase), `consumers.rs` (consumer calls), `replies.rs`
//! (commands and answers), `model.rs` (beliefs, truth), `invariants.rs`. What `fleet_sim`
//! drives the same way (draws, the loop, registering and reconnecting, cut-offs and
//! restarts, the knobs and survey) is in `tests/sim_support`.

#![forbid(unsafe_code)]

#[macro_use]
#[path = "../sim_support/mod.rs"]
mod sim_support;

mod consumers;
mod driver;
mod families;
mod fleet;
mod invariants;
mod model;
mod replies;
mod schedules;

use std::time::Duration;

use driver::{Outcome, Sim};
use kafka_assigner::coordinator::ConsumerGroupCoordinator;
use schedules::{FAMILIES, KINDS, Kind};
use sim_support::runner::{self, Knobs, Watchdog};

/// This simulation's environment variables.
const KNOBS: Knobs = Knobs("COORD_SIM_");
/// Schedules of the random kinds, in all, when no variable says otherwise.
const DEFAULT_SCHEDULES: u64 = 360;
/// Schedules of each targeted family when no variable says otherwise.
const DEFAULT_FAMILY_SCHEDULES: u64 = 60;
/// Wall-clock seconds one schedule may take when no variable says otherwise. A schedule
/// takes well under a second; one that spins without letting paused time advance (a
/// livelock: a loop that never awaits a timer) would otherwise hang the test for good.
const DEFAULT_SCHEDULE_BUDGET_SECS: u64 = 120;

/// Runs one schedule on its own paused runtime, under a [`Watchdog`] of
/// `COORD_SIM_SCHEDULE_BUDGET_SECS`.
fn run_one(seed: u64, kind: Kind, strict: bool, trace: bool) -> Result<Outcome, String> {
    let budget =
        Duration::from_secs(KNOBS.u64("SCHEDULE_BUDGET_SECS").unwrap_or(DEFAULT_SCHEDULE_BUDGET_SECS));
    let watchdog = Watchdog::start(
        budget,
        format!(
            "coordinator simulation failed: seed {seed} ({kind:?}) did not finish within {budget:?} of wall \
             time: the coordinator spins without letting time pass (replay: COORD_SIM_SEED={seed})"
        ),
    );
    runner::run_paused(watchdog, async move {
        let mut sim = Sim::new(seed, kind, strict, trace)
            .await
            .map_err(|e| format!("seed {seed}: setup failed: {e}"))?;
        let Err(why) = sim.run().await else { return Ok(sim.outcome.clone()) };
        let shape = &sim.shape;
        let mut report = runner::report(
            &format!("coordinator simulation failed: seed {seed} (replay: COORD_SIM_SEED={seed})"),
            &why,
            &format!(
                "{:?} instances={} pool={} partitions={} ttl={:?} reconcile={:?} warm cap={}",
                shape.kind,
                shape.instances,
                shape.pool,
                shape.partitions,
                shape.ttl,
                shape.reconcile,
                shape.max_warming
            ),
            &sim.world.log,
        );
        report.push_str(&format!("  store: {:?}\n", sim.truth));
        for (i, instance) in sim.world.instances.iter().enumerate() {
            if let Some(coordinator) = &instance.coordinator {
                let status = coordinator.status().await;
                let topics: Vec<_> = status.topics.iter().map(|t| (&t.owners, &t.handoffs)).collect();
                report.push_str(&format!(
                    "  i{i}: ready={} leader={:?} leads={} {topics:?}\n",
                    status.ready,
                    status.leader,
                    coordinator.is_leader()
                ));
            }
        }
        Err(report)
    })
}

/// The seeds this kind's test runs: its share of `COORD_SIM_SCHEDULES` (random kinds, in
/// all) or `COORD_SIM_FAMILY_SCHEDULES` (each targeted family) from `COORD_SIM_BASE`, or
/// only `COORD_SIM_SEED` if it is one of its seeds.
fn seeds_of(kind: Kind) -> Vec<u64> {
    let (group, total): (&[Kind], u64) = match KINDS.iter().position(|k| *k == kind) {
        Some(_) => (&KINDS, KNOBS.u64("SCHEDULES").unwrap_or(DEFAULT_SCHEDULES)),
        None => (
            &FAMILIES,
            KNOBS.u64("FAMILY_SCHEDULES").unwrap_or(DEFAULT_FAMILY_SCHEDULES) * FAMILIES.len() as u64,
        ),
    };
    let index = group.iter().position(|k| *k == kind).expect("a known kind") as u64;
    KNOBS.seeds(index, group.len() as u64, total)
}

/// Runs this kind's seeds; panics with the first failure's report (or, in a survey,
/// with the list of the failed seeds).
fn run_kind(kind: Kind) {
    let seeds = seeds_of(kind);
    if seeds.is_empty() {
        return;
    }
    let strict = KNOBS.u64("STRICT").is_none_or(|v| v != 0);
    if let Ok(filter) = std::env::var("COORD_SIM_LOG") {
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    }
    let trace = KNOBS.on("TRACE");
    let started = std::time::Instant::now();
    let mut total = Outcome::default();
    let label = format!("{kind:?}");
    runner::run_seeds(
        &label,
        &seeds,
        KNOBS.on("SURVEY"),
        |seed| run_one(seed, kind, strict, trace),
        |_, outcome| total.add(&outcome),
    );
    eprintln!(
        "{kind:?}: {} schedules in {:?}: {} commands, {} streams, {} ended while cut off (latest at {:.2} TTL), \
         slowest settle {:?}, {} overlaps inside release windows, {} moves by plan, {} new owners' epochs \
         checked, {} epochs raised by a new incarnation; {} stalls, {} early \
         expiries ({} of an instance that did not lead), {} restarts with the old stream open ({} of those replaced), {} readies raced by joins, \
         {} deregisters raced by a restart",
        seeds.len(),
        started.elapsed(),
        total.commands,
        total.streams_opened,
        total.fenced,
        total.max_fence_ttl,
        total.settled_after,
        total.overlaps_in_window,
        total.plan_moves,
        total.epoch_checks,
        total.incarnation_checks,
        total.stalls,
        total.revokes,
        total.follower_revokes,
        total.half_open,
        total.zombies_replaced,
        total.ready_races,
        total.deregister_races
    );
    // Not vacuous: consumers were told things, and fenced where instances were cut off;
    // the targeted faults happened.
    assert!(total.commands > seeds.len() as u64, "{kind:?}: hardly any command was delivered");
    assert!(total.plan_moves > 0, "{kind:?}: no partition was ever moved by plan");
    assert!(total.epoch_checks > 0, "{kind:?}: no new owner's epoch was ever checked");
    assert!(total.incarnation_checks > 0, "{kind:?}: no new incarnation ever raised an epoch");
    if seeds.len() >= 10 {
        match kind {
            Kind::CutOff | Kind::Crashes => {
                assert!(total.fenced > 0, "{kind:?}: no stream was ever ended by a cut-off")
            }
            Kind::Stalls => {
                assert!(total.stalls > 0 && total.fenced > 0, "{kind:?}: no stall fenced anything");
                assert!(total.deregister_races > 0, "{kind:?}: no Deregister was held past a restart");
            }
            Kind::Revokes => {
                assert!(
                    total.revokes > 0 && total.follower_revokes > 0 && total.zombies_replaced > 0,
                    "{kind:?}: no early expiry (of a leader and of an instance that did not lead), or no restart"
                )
            }
            _ => {}
        }
    }
}

#[test]
fn calm() {
    run_kind(Kind::Calm);
}

#[test]
fn lost_answers() {
    run_kind(Kind::LostAnswers);
}

#[test]
fn delays() {
    run_kind(Kind::Delays);
}

#[test]
fn cut_off() {
    run_kind(Kind::CutOff);
}

#[test]
fn crashes() {
    run_kind(Kind::Crashes);
}

#[test]
fn mixed() {
    run_kind(Kind::Mixed);
}

#[test]
fn stalls() {
    run_kind(Kind::Stalls);
}

#[test]
fn revokes() {
    run_kind(Kind::Revokes);
}

#[test]
fn ready_races() {
    run_kind(Kind::ReadyRaces);
}
