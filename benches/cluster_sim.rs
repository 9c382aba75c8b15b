//! The deterministic whole-cluster simulation's speed (issue 40): whole schedules per
//! second on one core, with the default cluster (3 instances, 6 consumers, 12 partitions,
//! 300 faults and consumer actions per schedule, then the faults stop and the cluster
//! converges), every invariant checked after every step: the handoff's instances, then the
//! fleet's (`SimBackend::Fleet`) on the same seeds.
//!
//! In the same run, a fixed reference workload is timed (the store model applying 10,000
//! compare-and-swap transactions and reading its prefix every 100): the machine is shared
//! and noisy, and the ratio of a schedule's time to the reference's is what stays
//! comparable between runs.
//!
//! Prints the table, writes it to `bench-cluster-sim.md` under the target directory, and
//! with `-- --write-docs` (or `BENCH_DOCS=1`) to `docs/benchmarks/cluster_sim.md`. Run:
//! `cargo bench --bench cluster_sim`. `CLUSTER_SIM_BENCH_SCHEDULES=N` sets the schedules
//! per round (default 200).
#![forbid(unsafe_code)]

// Only the docs writer of the shared module is used here.
#[allow(dead_code)]
#[path = "support/docs.rs"]
mod docs;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kafka_assigner::sim::{self, SimBackend, SimConfig, StoreModel};
use kafka_assigner::store::{Compare, Op, Txn};

const ROUNDS: usize = 5;

/// What the rounds of one backend measured.
#[derive(Default)]
struct Measured {
    rates: Vec<f64>,
    references: Vec<f64>,
    ratios: Vec<f64>,
    events: u64,
    steps: u64,
    failures: u64,
}

/// `ROUNDS` rounds of `per_round` schedules of `config`, each beside the reference.
fn measure(config: &SimConfig, per_round: u64) -> Measured {
    let mut m = Measured::default();
    for round in 0..ROUNDS {
        let reference = reference_workload();
        let started = Instant::now();
        for seed in (round as u64 * per_round)..((round as u64 + 1) * per_round) {
            match sim::run(seed, config) {
                Ok(outcome) => {
                    m.events += outcome.steps;
                    m.steps += outcome.machine_steps;
                }
                Err(failure) => {
                    m.failures += 1;
                    eprintln!("{failure}");
                }
            }
        }
        let elapsed = started.elapsed();
        let per_schedule = elapsed / per_round as u32;
        m.rates.push(per_round as f64 / elapsed.as_secs_f64());
        m.references.push(reference.as_secs_f64() * 1e3);
        m.ratios.push(per_schedule.as_secs_f64() / reference.as_secs_f64());
    }
    m
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let per_round: u64 =
        std::env::var("CLUSTER_SIM_BENCH_SCHEDULES").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let config = SimConfig::default();
    // The handoff's rows first, as before; then the fleet's instances on the same schedules.
    let handoff = measure(&config, per_round);
    let fleet = measure(&SimConfig { backend: SimBackend::Fleet, ..config.clone() }, per_round);
    let schedules = per_round * ROUNDS as u64;
    let mut md = String::new();
    let _ = writeln!(md, "| measure | median (min–max) of {ROUNDS} rounds of {per_round} schedules |");
    let _ = writeln!(md, "| --- | --- |");
    let _ = writeln!(md, "| whole schedules per second, one core | {} |", spread(&handoff.rates, 0));
    let _ = writeln!(md, "| reference workload (baseline), ms | {} |", spread(&handoff.references, 2));
    let _ = writeln!(md, "| one schedule ÷ the reference | {} |", spread(&handoff.ratios, 2));
    let _ = writeln!(md, "| fleet: whole schedules per second, one core | {} |", spread(&fleet.rates, 0));
    let _ = writeln!(md, "| fleet: one schedule ÷ the reference | {} |", spread(&fleet.ratios, 2));
    for (name, m) in [("handoff", &handoff), ("fleet", &fleet)] {
        let total_time: f64 = m.rates.iter().map(|r| per_round as f64 / r).sum();
        let _ = writeln!(
            md,
            "\n{name}: {schedules} schedules ({} failed an invariant): {:.0} events and {:.0} instance steps \
             per schedule on average, {:.2} µs per event.",
            m.failures,
            m.events as f64 / schedules as f64,
            m.steps as f64 / schedules as f64,
            total_time * 1e6 / m.events as f64,
        );
    }
    let _ = writeln!(
        md,
        "\nCluster: {} instances, {} consumers, {} partitions, {} faults and consumer actions per schedule, \
         TTL {:?}. The reference: the store model applying 10,000 compare-and-swap transactions, reading its \
         prefix every 100.",
        config.instances, config.consumers, config.partitions, config.actions, config.ttl,
    );
    println!("{md}");
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    let path = dir.join("bench-cluster-sim.md");
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, &md)) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => eprintln!("could not write {}: {e}", path.display()),
    }
    if docs::wanted() {
        let command = docs::command("cluster_sim", &["CLUSTER_SIM_BENCH"]);
        let path =
            docs::write("cluster_sim", "Whole-cluster simulation: schedules per second", &command, &md)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Median and range of `values`, with `digits` decimals.
fn spread(values: &[f64], digits: usize) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    format!("{median:.digits$} ({:.digits$}–{:.digits$})", sorted[0], sorted[sorted.len() - 1])
}

/// The fixed workload every round is compared with.
fn reference_workload() -> Duration {
    let started = Instant::now();
    let mut store = StoreModel::new();
    let now = Duration::ZERO;
    let mut read = 0;
    for i in 0..10_000u32 {
        let key = format!("/ref/{}", i % 64);
        let current = store.get(now, &key).map_or(0, |kv| kv.mod_revision);
        let txn =
            Txn::new().when(Compare::ModRevision(key.clone(), current)).then(Op::put(key, i.to_string()));
        let _ = store.txn(now, &txn);
        if i % 100 == 0 {
            read += store.get_prefix(now, "/ref/").kvs.len();
        }
    }
    std::hint::black_box(read);
    started.elapsed()
}
