//! The fleet of `docs/capacity.md` at model level (issue 42, item 5): 100,000 consumers
//! and 100,000 partitions on 10 handoff instances, run by the deterministic whole-cluster
//! simulation (`kafka_assigner::sim`, the instances' real states and steps over the store
//! model) through the scripted scenario of `sim::scenario`: every consumer joins, a
//! rolling restart in 10 waves (each consumer drains away and comes back as a new process
//! on an instance picked at random, as a load balancer would), a zone of 3 goes down (its
//! instances and its consumers die) and comes back.
//!
//! What it counts does not depend on the machine: transactions, reads, keys changed, watch
//! events and bytes delivered, commands, moves, and the virtual time each phase took to
//! settle. The wall-clock time of the run is printed for what it is, the simulation's own
//! cost. The instances run with the service's defaults (TTL 10 s, settle = TTL, reconcile
//! 1 s), `--leader-groups 40`, and the leaders' planning paced as the running leader's is,
//! at a modelled 0.5 µs per partition planned (the fleet-size plan bench:
//! `docs/benchmarks/assignment.md`).
//!
//! Prints the table, writes it to `bench-fleet-model.md` under the target directory, and
//! with `-- --write-docs` (or `BENCH_DOCS=1`) to `docs/benchmarks/fleet_model.md`. Run:
//! `cargo bench --bench fleet_model -- --write-docs`. Sizes: `FLEET_MODEL_CONSUMERS`
//! (100,000; as many partitions, 10 a topic), `FLEET_MODEL_INSTANCES` (10),
//! `FLEET_MODEL_GROUPS` (40), `FLEET_MODEL_SEED` (1).
#![forbid(unsafe_code)]

// Only the docs writer of the shared module is used here.
#[allow(dead_code)]
#[path = "support/docs.rs"]
mod docs;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kafka_assigner::sim::scenario::{Counts, PhaseReport};
use kafka_assigner::sim::{self, Scenario, SimConfig};

/// Partitions (and consumers) of each topic.
const PER_TOPIC: u32 = 10;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let consumers = env_u64("FLEET_MODEL_CONSUMERS", 100_000) as u32;
    let topics = (consumers / PER_TOPIC).max(1);
    let config = SimConfig {
        instances: env_u64("FLEET_MODEL_INSTANCES", 10) as usize,
        consumers: (topics * PER_TOPIC) as usize,
        topics,
        partitions: PER_TOPIC,
        leader_groups: env_u64("FLEET_MODEL_GROUPS", 40) as u32,
        ttl: Duration::from_secs(10),
        settle: None,
        reconcile: Duration::from_secs(1),
        warm_timeout: Duration::from_secs(60),
        release_timeout: Duration::from_secs(60),
        converge_within: Duration::from_secs(600),
        plan_nanos_per_partition: 500,
        // One whole-cluster check reads every partition: every 100,000 steps (the checks of
        // each revision run on every revision).
        check_every: 100_000,
        scenario: Some(Scenario { waves: 10, zones: 3, pause: Duration::from_secs(2) }),
        ..SimConfig::default()
    };
    let seed = env_u64("FLEET_MODEL_SEED", 1);
    let started = Instant::now();
    let outcome = sim::run(seed, &config).map_err(|failure| failure.to_string())?;
    let wall = started.elapsed();
    let report = outcome.scenario.ok_or("the scenario returned no report")?;
    let md = table(&config, &report.phases, seed, outcome.steps, outcome.machine_steps, wall);
    println!("{md}");
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    let path = dir.join("bench-fleet-model.md");
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, &md)) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => eprintln!("could not write {}: {e}", path.display()),
    }
    if docs::wanted() {
        let command = docs::command("fleet_model", &["FLEET_MODEL"]);
        let title = format!("The fleet at model level: {} consumers", config.consumers);
        let path = docs::write("fleet_model", &title, &command, &md)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// The phases' table, the whole restart's sums and ratios, and how the run was made.
fn table(
    config: &SimConfig,
    phases: &[PhaseReport],
    seed: u64,
    events: u64,
    steps: u64,
    wall: Duration,
) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "| phase | settled after (s) | live owners after (s) | `Txn` | `Get` | prefix reads (keys) | keeper calls | \
         keys changed | watch events | watch MB | `Register`s | commands | owner changes | moves by plan | \
         busiest instance's share of them |"
    );
    let _ = writeln!(md, "|{}", " --- |".repeat(15));
    for phase in phases {
        let c = &phase.counts;
        let live = phase.live_owners_after.map_or("".into(), |us| format!("{:.1}", us as f64 / 1e6));
        let _ = writeln!(
            md,
            "| {} | {:.1} | {live} | {} | {} | {} ({}) | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} |",
            phase.name,
            phase.settled_after as f64 / 1e6,
            c.txns,
            c.gets,
            c.prefix_reads,
            c.prefix_read_keys,
            c.keeper_requests,
            c.keys_changed,
            c.watch_events,
            c.watch_bytes as f64 / 1e6,
            c.registers,
            c.commands,
            c.owner_changes,
            c.plan_moves(),
            share(c),
        );
    }
    let waves: Vec<&PhaseReport> = phases.iter().filter(|p| p.name.starts_with("wave")).collect();
    let restart = waves.iter().fold(Counts::default(), |sum, p| sum.plus(&p.counts));
    let restart_secs: f64 = waves.iter().map(|p| p.settled_after as f64 / 1e6).sum();
    let per = |n: u64, d: u64| if d == 0 { 0.0 } else { n as f64 / d as f64 };
    let _ = writeln!(
        md,
        "\n**The rolling restart** ({} waves, {restart_secs:.1} s of virtual time settling): {} owner changes, \
         {:.2} `Txn` per owner change, {:.2} keys changed per owner change, {:.2} watch events delivered per \
         change ({} instances), {:.0} bytes per event delivered, {:.2} `Register`s per consumer, busiest \
         instance {} of the moves by plan.",
        waves.len(),
        restart.owner_changes,
        per(restart.txns, restart.owner_changes),
        per(restart.keys_changed, restart.owner_changes),
        per(restart.watch_events, restart.keys_changed),
        config.instances,
        per(restart.watch_bytes, restart.watch_events),
        per(restart.registers, config.consumers as u64),
        share(&restart),
    );
    let _ = writeln!(
        md,
        "\nCluster: {} instances, {} consumers, {} topics of {} partitions ({} partitions), `--leader-groups {}`, \
         TTL {:?}, settle = TTL, reconcile {:?}, planning modelled at {} ns a partition and paced (`PLAN_PACE`), \
         zones {}, seed {seed}. A phase begins {:?} after the previous settled (every partition owned once by an \
         online consumer, balanced, no handoff left, every consumer believing what it owns); \"live owners \
         after\": until no partition's owner was a dead consumer. Network delays drawn per message (mostly \
         0.1–2 ms, one in ten up to 60 ms); consumers warm and release within 0.1 s. The simulation handled \
         {events} events and {steps} instance steps in {:.0} s of wall-clock time (its own cost, not the \
         service's).",
        config.instances,
        config.consumers,
        config.topics,
        config.partitions,
        config.topics * config.partitions,
        config.leader_groups,
        config.ttl,
        config.reconcile,
        config.plan_nanos_per_partition,
        config.scenario.as_ref().map_or(0, |s| s.zones),
        config.scenario.as_ref().map_or(Duration::ZERO, |s| s.pause),
        wall.as_secs_f64(),
    );
    md
}

/// The busiest instance's share of the moves by plan, in percent.
fn share(c: &Counts) -> String {
    let (all, most) = (c.plan_moves(), c.plan_moves_by_node.iter().copied().max().unwrap_or(0));
    if all == 0 { "–".into() } else { format!("{:.0} %", 100.0 * most as f64 / all as f64) }
}
