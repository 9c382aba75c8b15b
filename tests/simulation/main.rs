//! Simulation of the handoff state machine (docs/design.md §5, §8): seeded random schedules of
//! joins, crashes, drains, `PartitionReady` / `PartitionReleased` calls (right and wrong)
//! and leader ticks, driving [`kafka_assigner::handoff::step`] with the invariants checked
//! after every step.
//!
//! # The model
//!
//! * One topic with `P` partitions (random in `1..=24`) and a pool of six consumer names
//!   (`c0`..`c5`); `ghost` and the empty name never join. `PlanConfig` has a 5 s warm and a
//!   3 s release limit and a random warm cap in `1..=4`. Time is a `u64` millisecond counter
//!   the test advances (a little on every step, more on ticks, sometimes past both limits);
//!   no real clock is read and nothing sleeps.
//! * A schedule is 200 random steps: `Joined` (a name that is not live), `Expired` (a crash
//!   of a live one, or a drained consumer leaving), `Draining`, `Ready` / `Released`
//!   answering a pending warm / release, wrong calls, `Tick`, and leader failovers (the
//!   leader's in-memory [`Cooldowns`] are lost).
//! * The relay is modelled exactly as an instance runs it: every live consumer has the
//!   [`ConsumerView`] it was last `told`; after every step, for every consumer,
//!   `diff_views(told, ConsumerView::of(state, name))` is delivered and becomes `told`. A
//!   consumer that dies loses its view; one that (re-)joins starts from the empty view, so it
//!   gets a snapshot.
//! * Each consumer is a client that only knows what it was sent: its *belief* (partitions
//!   it thinks it owns: added by `assigned`, removed by `unassigned` or `Release`), the
//!   warms it was asked for (dropped by `assigned` / `unassigned`) and the releases it was
//!   asked for. "Correct" calls answer one of those; "wrong" calls use random or unknown
//!   names, out-of-range partitions, repeated calls and swapped roles. A draining consumer
//!   that is idle leaves (expires) at a later step.
//! * Every call is also checked against a small reference model of §5.3/§5.4/§5.7 (which
//!   calls are accepted, with which refusal, and what an accepted call changes).
//!
//! # Checked after every step
//!
//! * a refused call changes nothing (and so writes nothing); applying the returned
//!   [`Write`]s to the old state gives exactly the new one, and every write changes
//!   something; membership events write nothing;
//! * handoffs: a warming handoff's `from` is the owner, a releasing handoff's `to` is the
//!   owner, `from != to`, no consumer warms more than `max_warming_per_consumer`;
//! * no command contradicts the state (`assigned` ⇒ owner, `Warm` ⇒ warming handoff to the
//!   consumer from the named owner, `Release` ⇒ releasing handoff from it to the named owner,
//!   `unassigned` ⇒ not the owner and not warming), `Assignment` comes first, and nothing is
//!   sent to a consumer that is not live;
//! * the ownership invariant of §5: every partition is believed owned by at most one live
//!   consumer, and each live consumer's belief is exactly what it owns;
//! * owners are names that joined at some point; partitions are `< P`;
//! * after a tick: no live owner is replaced without a handoff, a partition without a live
//!   owner goes straight to an active consumer (§5.1), no handoff has a dead or draining
//!   target or a dead source (§5.5), none is past its time limit (§5.6), and a new handoff
//!   is a warm from a live owner to an active consumer.
//!
//! After the schedule the fleet is quiesced (no more joins or crashes; every warm and
//! release is answered, drained consumers leave, time passes) until nothing changes; then,
//! if a consumer is active, every partition has exactly one active owner, the assignment is
//! balanced, no handoff is left and every belief equals the owned set.
//!
//! `SIM_SCHEDULES=N` runs N schedules (default 1,000), `SIM_BASE_SEED=B` starts the seeds
//! at B, `SIM_SEED=S` replays one. Schedules are independent and run on a few threads (the
//! result does not depend on how many). A failure prints its seed, the last steps with the
//! commands each consumer was sent, and the state. With many schedules the test also checks
//! that every interesting path was taken (accepted and refused calls of every kind, warm
//! and release timeouts, crashes, drains, settled fleets), so it cannot pass vacuously.
//!
//! A second random test runs tiny topics (`P` in `0..=2`, one or two consumers); scripted
//! tests cover no partitions and a single consumer.
//!
//! # Layout
//!
//! * `model.rs`: the reference model of the calls and membership events, how writes apply,
//!   and what a client knows;
//! * `invariants.rs`: every check above;
//! * `driver.rs`: one schedule: random events through `step`, the relay, quiescing, and
//!   the failure report;
//! * this file: running many seeds on a few threads, the coverage counts, and the tests.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

use kafka_assigner::handoff::{Event, PlanConfig};

/// Returns `Err(message)` from the enclosing function unless `$cond` holds.
macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(format!($($arg)+));
        }
    };
}

mod driver;
mod invariants;
mod model;

use driver::{Params, Sim};

/// Counts across schedules, to check the simulation reaches the interesting paths.
#[derive(Clone, Debug, Default)]
pub(crate) struct Stats {
    pub(crate) ready_ok: u64,
    pub(crate) released_ok: u64,
    pub(crate) refused: BTreeMap<String, u64>,
    pub(crate) handoffs_started: u64,
    pub(crate) direct_assignments: u64,
    pub(crate) warm_timeouts: u64,
    pub(crate) release_timeouts: u64,
    pub(crate) crashes: u64,
    pub(crate) drained_left: u64,
    pub(crate) settled_with_active: u64,
    quiesce_rounds_max: u64,
    steps: u64,
}

impl Stats {
    fn add(&mut self, other: &Stats) {
        self.ready_ok += other.ready_ok;
        self.released_ok += other.released_ok;
        for (k, v) in &other.refused {
            *self.refused.entry(k.clone()).or_default() += v;
        }
        self.handoffs_started += other.handoffs_started;
        self.direct_assignments += other.direct_assignments;
        self.warm_timeouts += other.warm_timeouts;
        self.release_timeouts += other.release_timeouts;
        self.crashes += other.crashes;
        self.drained_left += other.drained_left;
        self.settled_with_active += other.settled_with_active;
        self.quiesce_rounds_max = self.quiesce_rounds_max.max(other.quiesce_rounds_max);
        self.steps += other.steps;
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(value.trim().parse().unwrap_or_else(|_| panic!("{name}={value} is not a number")))
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_string()
    }
}

/// Runs some schedules; returns their summed stats, the failing seeds and the report of
/// the first failure.
fn run_chunk(seeds: &[u64], params: &Params) -> (Stats, Vec<u64>, Option<String>) {
    let mut total = Stats::default();
    let mut failed: Vec<u64> = Vec::new();
    let mut first_report = None;
    for &seed in seeds {
        let mut sim = Sim::new(seed, params);
        let outcome = catch_unwind(AssertUnwindSafe(|| sim.run()));
        let error = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(msg)) => Some(msg),
            Err(payload) => Some(format!("panicked: {}", panic_message(payload.as_ref()))),
        };
        match error {
            None => {
                sim.stats.steps = sim.step_no as u64;
                total.add(&sim.stats)
            }
            Some(msg) => {
                failed.push(seed);
                if first_report.is_none() {
                    first_report = Some(sim.report(&msg));
                }
            }
        }
    }
    (total, failed, first_report)
}

/// Runs the schedules of one test (`SIM_SEED`, `SIM_SCHEDULES`, `SIM_BASE_SEED`) and
/// returns the summed stats; panics with the first failure's report.
fn run_schedules(test: &str, params: &Params, default_base: u64, default_count: u64) -> (u64, Stats) {
    let seeds: Vec<u64> = match env_u64("SIM_SEED") {
        Some(seed) => vec![seed],
        None => {
            let base = env_u64("SIM_BASE_SEED").unwrap_or(default_base);
            let count = env_u64("SIM_SCHEDULES").unwrap_or(default_count);
            (0..count).map(|i| base.wrapping_add(i)).collect()
        }
    };
    // Schedules are independent: run contiguous chunks of seeds on a few threads. The
    // outcome does not depend on the number of threads.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8);
    let chunk = seeds.len().div_ceil(threads).max(1);
    let results: Vec<(Stats, Vec<u64>, Option<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> =
            seeds.chunks(chunk).map(|seeds| scope.spawn(move || run_chunk(seeds, params))).collect();
        handles.into_iter().map(|h| h.join().expect("simulation thread")).collect()
    });
    let mut total = Stats::default();
    let mut failed: Vec<u64> = Vec::new();
    let mut first_report = None;
    // Chunks are in seed order, so the first report found is the smallest failing seed's.
    for (stats, seeds, report) in results {
        total.add(&stats);
        failed.extend(seeds);
        if first_report.is_none() {
            first_report = report;
        }
    }
    if let Some(report) = first_report {
        let shown: Vec<String> = failed.iter().take(20).map(u64::to_string).collect();
        panic!(
            "{} of {} schedules failed (seeds {}{}).\nFirst failure, {report}\nreplay: SIM_SEED={} cargo test --test simulation {test}",
            failed.len(),
            seeds.len(),
            shown.join(", "),
            if failed.len() > shown.len() { ", ..." } else { "" },
            failed[0]
        );
    }
    (seeds.len() as u64, total)
}

#[test]
fn random_schedules_keep_the_handoff_invariants() {
    let params = Params { partitions: 1..=24, pool: 6..=6, steps: 200 };
    let (n, stats) =
        run_schedules("random_schedules_keep_the_handoff_invariants", &params, 0x5eed_0000, 1_000);
    eprintln!("{n} schedules: {stats:?}");
    // With many schedules, every interesting path must have been taken (so the simulation
    // cannot pass by never reaching them).
    if n >= 200 {
        ensure_coverage(&stats, true);
    }
}

fn ensure_coverage(stats: &Stats, timeouts: bool) {
    assert!(stats.ready_ok > 0 && stats.released_ok > 0, "{stats:?}");
    assert!(stats.handoffs_started > 0 && stats.direct_assignments > 0, "{stats:?}");
    assert!(stats.crashes > 0 && stats.drained_left > 0 && stats.settled_with_active > 0, "{stats:?}");
    for kind in ["OutOfRange", "Unknown", "NotWarming", "NotReleasing"] {
        assert!(stats.refused.get(kind).is_some_and(|n| *n > 0), "no {kind} refusal: {stats:?}");
    }
    if timeouts {
        assert!(stats.warm_timeouts > 0 && stats.release_timeouts > 0, "{stats:?}");
    }
}

/// Random schedules on the smallest topics and fleets: no partitions, one partition, one
/// or two consumers.
#[test]
fn random_schedules_on_tiny_topics() {
    let params = Params { partitions: 0..=2, pool: 1..=2, steps: 100 };
    let (n, stats) = run_schedules("random_schedules_on_tiny_topics", &params, 0x7171_0000, 300);
    if n >= 200 {
        ensure_coverage(&stats, false);
    }
}

fn scripted(partitions: u32, pool: usize) -> Sim {
    Sim::with(
        partitions,
        pool,
        PlanConfig { warm_timeout_ms: 5_000, release_timeout_ms: 3_000, max_warming_per_consumer: 2 },
    )
}

fn ok(result: Result<(), String>, sim: &Sim) {
    if let Err(msg) = result {
        panic!("{}", sim.report(&msg));
    }
}

#[test]
fn no_partitions() {
    let mut sim = scripted(0, 2);
    let r = (|| {
        sim.do_step(Event::Joined("c0".into()))?;
        sim.tick(10)?;
        ensure!(sim.state.owners.is_empty() && sim.state.handoffs.is_empty(), "P=0 got owners");
        sim.do_step(Event::Ready("c0".into(), 0))?; // refused: out of range
        sim.do_step(Event::Released("c0".into(), 0))?;
        ensure!(sim.stats.refused.get("OutOfRange") == Some(&2), "{:?}", sim.stats);
        sim.do_step(Event::Joined("c1".into()))?;
        sim.do_step(Event::Draining("c0".into()))?;
        ensure!(sim.drained() == vec!["c0".to_string()], "a draining consumer with nothing is drained");
        sim.quiesce()?;
        ensure!(sim.live_names() == vec!["c1".to_string()], "c0 left");
        Ok(())
    })();
    ok(r, &sim);
}

#[test]
fn single_consumer() {
    let mut sim = scripted(5, 2);
    let r = (|| {
        let c0 = || "c0".to_string();
        sim.do_step(Event::Joined(c0()))?;
        sim.tick(10)?;
        ensure!(sim.clients["c0"].belief.len() == 5, "the only consumer gets everything directly");
        ensure!(sim.state.handoffs.is_empty(), "no handoff without a live owner");
        // A crash and a re-join before the next tick resumes the partitions: the new
        // session gets them in its snapshot, and nothing moves.
        sim.do_step(Event::Expired(c0()))?;
        sim.do_step(Event::Joined(c0()))?;
        ensure!(sim.clients["c0"].belief.len() == 5, "re-join resumes from a snapshot");
        // Dead with nobody to take over: the partitions wait for it.
        sim.do_step(Event::Expired(c0()))?;
        sim.tick(10_000)?;
        ensure!(sim.state.owners.values().all(|o| o == "c0"), "no active consumer: nothing moves");
        sim.do_step(Event::Joined(c0()))?;
        // Draining with nobody to hand to: it keeps everything and is not idle.
        sim.do_step(Event::Draining(c0()))?;
        sim.tick(10)?;
        ensure!(sim.state.handoffs.is_empty() && sim.drained().is_empty(), "nobody to hand off to");
        // A second consumer arrives: the drained one hands everything over, then leaves.
        sim.do_step(Event::Joined("c1".into()))?;
        sim.quiesce()?;
        ensure!(sim.live_names() == vec!["c1".to_string()], "c0 drained and left");
        ensure!(sim.clients["c1"].belief.len() == 5, "c1 owns everything");
        Ok(())
    })();
    ok(r, &sim);
}

/// When the source of a warm dies and the warming consumer is no longer the partition's
/// target (the fleet changed since the warm started), the partition has no live owner, so
/// §5.1 applies: it goes straight to its target (c0 → c4), not to the warming consumer
/// and then on again with another handoff (c0 → c1 → c4), which §5.5 read literally would do.
#[test]
fn source_death_gives_the_partition_to_its_target() {
    let mut sim = scripted(4, 5);
    sim.config.max_warming_per_consumer = 4;
    let r = (|| {
        sim.do_step(Event::Joined("c0".into()))?;
        sim.tick(10)?;
        sim.do_step(Event::Joined("c1".into()))?;
        sim.tick(10)?; // c1 warms 2 and 3 from c0
        ensure!(sim.clients["c1"].warms.len() == 2, "c1 warms two partitions");
        for c in ["c2", "c3", "c4"] {
            sim.do_step(Event::Joined(c.into()))?;
        }
        sim.do_step(Event::Expired("c0".into()))?;
        // Target with c1..c4 active and c1's warms counted as done: c1 keeps 2; 0, 1 and 3
        // go to c2, c3 and c4.
        sim.tick(10)?;
        let owners: Vec<(u32, &str)> = sim.state.owners.iter().map(|(p, o)| (*p, o.as_str())).collect();
        ensure!(
            owners == vec![(0, "c2"), (1, "c3"), (2, "c1"), (3, "c4")] && sim.state.handoffs.is_empty(),
            "partition 3 should go straight to its target c4; owners {owners:?}, handoffs {:?}",
            sim.state.handoffs
        );
        Ok(())
    })();
    ok(r, &sim);
}
