//! The fleet backend in the whole-cluster simulation (`SimConfig::backend`): its instances
//! (`fleet_backend::machine`) under the same schedules as the handoff's, checked against the
//! fleet's invariants (module docs of `sim`), and the fleet's mutation row.

use kafka_assigner::mutation::Mutation;
use kafka_assigner::sim::{self, Outcome, SimBackend, SimConfig};

use super::{env_u64, failure_hash, finds_in, keep, seeds};

/// Fleet schedules in CI (a few seconds in a debug build).
const FLEET_SCHEDULES: u64 = 300;

fn fleet() -> SimConfig {
    SimConfig { backend: SimBackend::Fleet, ..SimConfig::default() }
}

#[test]
fn fleet_schedules_keep_every_invariant() {
    let actions = env_u64("CLUSTER_SIM_ACTIONS").map_or(SimConfig::default().actions, |n| n as usize);
    let config = SimConfig { actions, ..fleet() };
    let mut total = Outcome::default();
    let mut count = 0;
    for seed in seeds(FLEET_SCHEDULES) {
        match sim::run_keeping(seed, &config, keep()) {
            Ok(outcome) => {
                count += 1;
                total.steps += outcome.steps;
                total.machine_steps += outcome.machine_steps;
                total.commands += outcome.commands;
                total.in_window += outcome.in_window;
                total.lease_writes += outcome.lease_writes;
                total.epoch_checks += outcome.epoch_checks;
                total.converged_after = total.converged_after.max(outcome.converged_after);
            }
            Err(failure) => panic!("{failure}"),
        }
    }
    println!(
        "{count} fleet schedules: {} events, {} instance steps, {} commands applied, {} overlaps while \
         `unassigned` was on its way, {} leases written, {} epoch comparisons; slowest convergence {:.1}s \
         after the faults stopped",
        total.steps,
        total.machine_steps,
        total.commands,
        total.in_window,
        total.lease_writes,
        total.epoch_checks,
        total.converged_after as f64 / 1e6
    );
    // The checks are not vacuous: leases were claimed, and taken over with a new epoch.
    assert!(total.commands > 0 && total.lease_writes > 0 && total.epoch_checks > 0, "{total:?}");
}

#[test]
fn a_fleet_seed_replays_exactly_and_seeds_differ() {
    let config = fleet();
    let base = env_u64("CLUSTER_SIM_SEED").unwrap_or(11);
    let hash = |seed| match sim::run(seed, &config) {
        Ok(outcome) => outcome.trace_hash,
        Err(failure) => failure_hash(&failure),
    };
    let first = hash(base);
    assert_eq!(first, hash(base), "fleet seed {base} gave two different traces");
    let others: Vec<u64> = (base + 1..base + 4).map(hash).collect();
    assert!(others.iter().all(|h| *h != first), "fleet seeds {base}.. share a trace: {first:x} {others:x?}");
}

#[test]
fn mutation_fleet_claim_compare_dropped() {
    finds_in(Mutation::FleetClaimCompareDropped, SimBackend::Fleet);
}

/// Seeds the fleet runs found breaking an invariant, each kept by what fixed it (see "Bugs
/// the fleet simulation found" in docs/simulation.md): 259, a registration that left a lease
/// of its name behind; 26,876, a stale `Register` that replaced the registration its
/// consumer was reading; 33,686, a registration written and lost between two views of a
/// re-read; 51,237, 83,190 and 160,874, consumers whose pause was cleared at the faults'
/// end acting before what reached them while paused.
const FOUND_BY_THE_FLEET_RUNS: [u64; 6] = [259, 26_876, 33_686, 51_237, 83_190, 160_874];

#[test]
fn seeds_the_fleet_runs_found_keep_every_invariant() {
    for seed in FOUND_BY_THE_FLEET_RUNS {
        if let Err(failure) = sim::run_keeping(seed, &fleet(), keep()) {
            panic!("{failure}");
        }
    }
}

/// The rows of the mutation table whose safety decision the fleet shares (the rebind's
/// compare on absence, the epoch floor, the relay's stale fence, self-fencing) are caught
/// in fleet runs too.
#[test]
fn the_shared_mutation_rows_are_caught_in_fleet_runs() {
    for mutation in [
        Mutation::RebindCompareDropped,
        Mutation::EpochFloorDropped,
        Mutation::StaleRelayNotFenced,
        Mutation::SelfFenceSkipped,
    ] {
        finds_in(mutation, SimBackend::Fleet);
    }
}
