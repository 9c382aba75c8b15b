//! Many topics, and the scripted fleet scenario (`kafka_assigner::sim::scenario`): the
//! same instance states and store model as the drawn schedules, at the shape the capacity
//! model projects (`docs/capacity.md`), here at a size CI runs in seconds.

use std::time::Duration;

use kafka_assigner::mutation::{Mutation, with_mutation};
use kafka_assigner::sim::{self, Scenario, SimConfig};

use super::{keep, seeds};

/// Three topics planned by two leader groups, paced as the running leader is: every
/// invariant holds over drawn schedules, and a group leader writing without its fence is
/// caught.
#[test]
fn many_topics_keep_every_invariant() {
    let config = SimConfig {
        topics: 3,
        consumers: 9,
        partitions: 6,
        leader_groups: 2,
        plan_nanos_per_partition: 2_000,
        ..SimConfig::default()
    };
    let mut plan_moves = 0;
    for seed in seeds(200) {
        match sim::run_keeping(seed, &config, keep()) {
            Ok(outcome) => plan_moves += outcome.plan_moves,
            Err(failure) => panic!("{failure}"),
        }
    }
    assert!(plan_moves > 0, "no move by plan was checked");
    let caught = seeds(2_500)
        .find_map(|seed| with_mutation(Mutation::LeaderUnfenced, || sim::run(seed, &config)).err());
    assert!(caught.is_some(), "LeaderUnfenced over many topics broke no invariant");
}

/// The fleet scenario in small: 3 instances, 6 topics of 10 partitions, 10 consumers each;
/// they join, restart in 10 waves, lose a zone and get it back. Every phase settles, each
/// costs what it must (a wave moves partitions, the zone's loss re-registers the consumers
/// of its instances), and a seed replays exactly.
#[test]
fn the_fleet_scenario_settles_every_phase_and_counts_what_it_cost() {
    let config = SimConfig {
        instances: 3,
        consumers: 60,
        topics: 6,
        partitions: 10,
        leader_groups: 3,
        plan_nanos_per_partition: 500,
        scenario: Some(Scenario { waves: 10, zones: 3, pause: Duration::from_millis(500) }),
        ..SimConfig::default()
    };
    let run = |seed| sim::run_keeping(seed, &config, keep()).unwrap_or_else(|failure| panic!("{failure}"));
    let outcome = run(5);
    let Some(report) = outcome.scenario.as_ref() else { panic!("a scenario without its report") };
    let names: Vec<&str> = report.phases.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names.len(), 13, "{names:?}");
    let ends = (names[0], names[1], names[10], names[11], names[12]);
    assert_eq!(ends, ("join", "wave 1", "wave 10", "zone down", "zone back"));
    let join = &report.phases[0].counts;
    assert_eq!(join.registers, 60, "{join:?}");
    for wave in &report.phases[1..11] {
        // Each of a wave's 6 consumers hands its partition(s) away and takes some back.
        let c = &wave.counts;
        assert!(c.owner_changes >= 6 && c.registers >= 6 && c.plan_moves() > 0 && c.txns > 0, "{wave:?}");
        // Every instance follows every change (a change made just before a phase ended
        // may reach an instance just after: counted in the next).
        let per_change = c.watch_events as f64 / c.keys_changed as f64;
        assert!((per_change - 3.0).abs() < 0.2, "{per_change} events per change: {wave:?}");
    }
    let down = &report.phases[11];
    assert!(down.live_owners_after.is_some_and(|after| after <= down.settled_after), "{down:?}");
    assert!(down.counts.registers > 0 && down.counts.owner_changes > 0, "{down:?}");
    assert_eq!(outcome.trace_hash, run(5).trace_hash, "seed 5 gave two different traces");
}
