//! The deterministic whole-cluster simulation (`kafka_assigner::sim`, issue 40): handoff
//! instances (or fleet instances: `fleet.rs`) as states with one step, over a model of
//! etcd, with consumer models and faults, in one thread on a virtual clock. See the module
//! docs of `sim` for what a run does and the invariants it checks after every step.
//!
//! * `CLUSTER_SIM_SCHEDULES=N`: schedules per test (default [`DEFAULT_SCHEDULES`] for the
//!   invariants, [`DEFAULT_MUTATION_SCHEDULES`] searched by each mutation row);
//! * `CLUSTER_SIM_LONG=1`: a million schedules;
//! * `CLUSTER_SIM_SEED=S`: only seed `S` (a failure prints its seed and its last steps);
//! * `CLUSTER_SIM_BASE=B`: seeds start at `B`;
//! * `CLUSTER_SIM_TRACE=N`: a failure shows its last `N` steps (default 80).
//!
//! The mutation table: each row switches one safety decision off
//! (`kafka_assigner::mutation`) and must see an invariant break within CI's count; the
//! first failing seed of each is in `docs/simulation.md`.

#![forbid(unsafe_code)]

use kafka_assigner::mutation::{Mutation, with_mutation};
use kafka_assigner::sim::{self, Failure, Outcome, SimBackend, SimConfig};

/// Schedules of the invariants test in CI.
const DEFAULT_SCHEDULES: u64 = 500;

/// Schedules a mutation row searches in CI (its first failing seed is below; the slowest
/// row fails at seed 1,778 today).
const DEFAULT_MUTATION_SCHEDULES: u64 = 2_500;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The seeds to run (`default` of them unless the environment says otherwise).
fn seeds(default: u64) -> std::ops::Range<u64> {
    if let Some(seed) = env_u64("CLUSTER_SIM_SEED") {
        return seed..seed + 1;
    }
    let count = if std::env::var("CLUSTER_SIM_LONG").is_ok_and(|v| v == "1") {
        1_000_000
    } else {
        env_u64("CLUSTER_SIM_SCHEDULES").unwrap_or(default)
    };
    let base = env_u64("CLUSTER_SIM_BASE").unwrap_or(0);
    base..base + count
}

/// How many steps a failure shows (`CLUSTER_SIM_TRACE`, default 80).
fn keep() -> usize {
    env_u64("CLUSTER_SIM_TRACE").map_or(80, |n| n as usize)
}

#[test]
fn random_schedules_keep_every_invariant() {
    let actions = env_u64("CLUSTER_SIM_ACTIONS").map_or(SimConfig::default().actions, |n| n as usize);
    let config = SimConfig { actions, ..SimConfig::default() };
    let mut total = Outcome::default();
    let mut count = 0;
    for seed in seeds(DEFAULT_SCHEDULES) {
        match sim::run_keeping(seed, &config, keep()) {
            Ok(outcome) => {
                count += 1;
                total.steps += outcome.steps;
                total.machine_steps += outcome.machine_steps;
                total.commands += outcome.commands;
                total.in_window += outcome.in_window;
                total.plan_moves += outcome.plan_moves;
                total.epoch_checks += outcome.epoch_checks;
                total.converged_after = total.converged_after.max(outcome.converged_after);
            }
            Err(failure) => panic!("{failure}"),
        }
    }
    println!(
        "{count} schedules: {} events, {} instance steps, {} commands applied, {} overlaps in a release window, \
         {} moves by plan, {} epoch comparisons; slowest convergence {:.1}s after the faults stopped",
        total.steps,
        total.machine_steps,
        total.commands,
        total.in_window,
        total.plan_moves,
        total.epoch_checks,
        total.converged_after as f64 / 1e6
    );
    // The checks are not vacuous: the schedules moved partitions, by plan and by flips.
    assert!(total.commands > 0 && total.plan_moves > 0 && total.epoch_checks > 0, "{total:?}");
}

/// Seeds the million-schedule run (`CLUSTER_SIM_LONG=1`) found breaking an invariant, each
/// fixed since: replayed on every run (docs/simulation.md).
const FOUND_BY_THE_LONG_RUN: [u64; 6] = [19_891, 28_483, 35_320, 99_075, 299_699, 323_108];

#[test]
fn seeds_the_long_run_found_keep_every_invariant() {
    let config = SimConfig::default();
    for seed in FOUND_BY_THE_LONG_RUN {
        if let Err(failure) = sim::run_keeping(seed, &config, keep()) {
            panic!("{failure}");
        }
    }
}

#[test]
fn a_seed_replays_exactly_and_seeds_differ() {
    let config = SimConfig::default();
    let base = env_u64("CLUSTER_SIM_SEED").unwrap_or(11);
    let hash = |seed| match sim::run(seed, &config) {
        Ok(outcome) => outcome.trace_hash,
        Err(failure) => failure_hash(&failure),
    };
    let first = hash(base);
    assert_eq!(first, hash(base), "seed {base} gave two different traces");
    let others: Vec<u64> = (base + 1..base + 4).map(hash).collect();
    assert!(others.iter().all(|h| *h != first), "seeds {base}.. share a trace: {first:x} {others:x?}");
}

/// A failing seed's trace: its violation and where, so the replay test still compares runs.
fn failure_hash(failure: &Failure) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = sim::TraceHasher::default();
    (failure.at, failure.violation.detail.as_str()).hash(&mut hasher);
    hasher.finish()
}

/// Runs schedules with `mutation` on until one breaks an invariant; panics if none does
/// within CI's count.
fn finds(mutation: Mutation) -> Box<Failure> {
    finds_in(mutation, SimBackend::Handoff)
}

/// [`finds`], with `backend`'s instances.
fn finds_in(mutation: Mutation, backend: SimBackend) -> Box<Failure> {
    let actions =
        env_u64("CLUSTER_SIM_MUTATION_ACTIONS").map_or(SimConfig::default().actions, |n| n as usize);
    let config = SimConfig { actions, backend, ..SimConfig::default() };
    let seeds = seeds(DEFAULT_MUTATION_SCHEDULES);
    for seed in seeds.clone() {
        if let Err(failure) = with_mutation(mutation, || sim::run(seed, &config)) {
            println!("{mutation:?}: first failing schedule {failure}");
            return failure;
        }
    }
    panic!("{mutation:?}: no schedule of {seeds:?} broke an invariant");
}

#[test]
fn mutation_handoff_compare_dropped() {
    finds(Mutation::HandoffCompareDropped);
}

#[test]
fn mutation_caller_registration_compare_dropped() {
    finds(Mutation::CallerRegistrationCompareDropped);
}

#[test]
fn mutation_self_fence_skipped() {
    finds(Mutation::SelfFenceSkipped);
}

#[test]
fn mutation_settle_zero() {
    finds(Mutation::SettleZero);
}

#[test]
fn mutation_leader_unfenced() {
    finds(Mutation::LeaderUnfenced);
}

#[test]
fn mutation_rebind_compare_dropped() {
    finds(Mutation::RebindCompareDropped);
}

#[test]
fn mutation_epoch_floor_dropped() {
    finds(Mutation::EpochFloorDropped);
}

#[test]
fn mutation_stale_relay_not_fenced() {
    finds(Mutation::StaleRelayNotFenced);
}

/// Writes held on a stalled connection land long after their instance timed them out,
/// maybe after its session expired and another instance decided (what the retired
/// instance-level simulations drew as stalls): every invariant holds over the CI count, on
/// both backends.
#[test]
fn writes_held_on_a_stalled_connection_land_late_and_change_nothing_they_should_not() {
    for backend in [SimBackend::Handoff, SimBackend::Fleet] {
        let config = SimConfig { stalls: true, backend, ..SimConfig::default() };
        if let Some(failure) = seeds(300).find_map(|seed| sim::run_keeping(seed, &config, keep()).err()) {
            panic!("{backend:?}: {failure}");
        }
        // Stalls are drawn: some schedules' traces differ from the same seeds without them.
        let plain = SimConfig { backend, ..SimConfig::default() };
        let hash = |seed, config: &SimConfig| sim::run(seed, config).map(|o| o.trace_hash).ok();
        let stalled = (0..20).filter(|seed| hash(*seed, &config) != hash(*seed, &plain)).count();
        assert!(stalled > 0, "{backend:?}: no stall drawn in 20 schedules");
    }
}

/// The machine's fixed bugs (`docs/simulation.md`) stay fixed: a restart under the same
/// instance id (only the life's nonce keeps its registration ids apart) and store answers
/// that never arrive (the instance times its own requests out), over the schedules of the
/// CI count.
#[test]
fn restarts_under_the_same_id_and_answers_that_never_arrive() {
    let config = SimConfig {
        same_id_on_restart: true,
        lost_answers_vanish: true,
        answers_reorder: true,
        ..SimConfig::default()
    };
    if let Some(failure) = seeds(300).find_map(|seed| sim::run_keeping(seed, &config, keep()).err()) {
        panic!("{failure}");
    }
}

/// Leader groups (`--leader-groups 4` on 3 instances): the topic is planned by its group's
/// leader, campaigned for by the preferred instance, handed over as instances crash and
/// come back; every invariant holds, moves by plan are checked to be that leader's, and a
/// group leader writing without its fence is caught.
#[test]
fn leader_groups_keep_every_invariant_and_their_fence_is_needed() {
    let config = SimConfig { leader_groups: 4, ..SimConfig::default() };
    let mut plan_moves = 0;
    for seed in seeds(300) {
        match sim::run_keeping(seed, &config, keep()) {
            Ok(outcome) => plan_moves += outcome.plan_moves,
            Err(failure) => panic!("{failure}"),
        }
    }
    assert!(plan_moves > 0, "no move by plan was checked");
    let seeds = seeds(DEFAULT_MUTATION_SCHEDULES);
    let caught = seeds
        .clone()
        .find_map(|seed| with_mutation(Mutation::LeaderUnfenced, || sim::run(seed, &config)).err());
    match caught {
        Some(failure) => println!("LeaderUnfenced under leader groups: first failing schedule {failure}"),
        None => panic!("LeaderUnfenced under leader groups: no schedule of {seeds:?} broke an invariant"),
    }
}

mod fleet;
mod scenario;
