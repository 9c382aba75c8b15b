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

/// Returns `Err(message)` from the enclosing function unless `$cond` holds.
macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(format!($($arg)+));
        }
    };
}

mod consumers;
mod driver;
mod faults;
mod invariants;
mod schedule;

use std::time::Duration;

use driver::{Outcome, Sim};
use schedule::{KINDS, Kind};

const DEFAULT_SCHEDULES: u64 = 300;
/// Wall time one schedule may take: one that spins without letting paused time advance
/// would otherwise hang the test for good.
const SCHEDULE_BUDGET: Duration = Duration::from_secs(120);

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(value.parse().unwrap_or_else(|_| panic!("{name}={value} is not a number")))
}

/// Exits the process, naming the seed, if the schedule has not finished within its budget
/// (a stuck runtime cannot be interrupted from outside).
fn watchdog(seed: u64) -> std::sync::mpsc::Sender<()> {
    let (done, finished) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(SCHEDULE_BUDGET) {
            eprintln!("fleet simulation: seed {seed} did not finish within {SCHEDULE_BUDGET:?} of wall time");
            std::process::exit(101);
        }
    });
    done
}

/// Runs one schedule on its own paused current-thread runtime.
fn run_one(seed: u64, trace: bool) -> Result<Outcome, String> {
    let _done = watchdog(seed);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let mut sim = Sim::new(seed, trace).await.map_err(|e| format!("seed {seed}: setup failed: {e}"))?;
        let result = sim.run().await;
        let shape = &sim.shape;
        let Err(why) = result else { return Ok(sim.outcome.clone()) };
        let mut report = format!(
            "fleet simulation failed: seed {seed} (replay: FLEET_SIM_SEED={seed} FLEET_SIM_TRACE=1)\n  {why}\n  \
             shape: {:?} instances={} consumers={} partitions={} ttl={:?} claim interval={:?}\n  last steps:\n",
            shape.kind, shape.instances, shape.pool, shape.partitions, shape.ttl, shape.claim_interval
        );
        for line in &sim.log {
            report.push_str(&format!("    {line}\n"));
        }
        report.push_str(&format!("  store: leases {:?}\n  members {:?}\n", sim.truth.leases, sim.truth.members));
        Err(report)
    })
}

/// The seeds of `kind`: its share of `FLEET_SIM_SCHEDULES` from `FLEET_SIM_BASE`, or
/// `FLEET_SIM_SEED` alone if it is one of its seeds.
fn seeds_of(kind: Kind) -> Vec<u64> {
    let kinds = KINDS.len() as u64;
    let index = KINDS.iter().position(|k| *k == kind).unwrap_or_default() as u64;
    if let Some(seed) = env_u64("FLEET_SIM_SEED") {
        return if seed % kinds == index { vec![seed] } else { Vec::new() };
    }
    let total = env_u64("FLEET_SIM_SCHEDULES").unwrap_or(DEFAULT_SCHEDULES);
    let base = env_u64("FLEET_SIM_BASE").unwrap_or(0) / kinds * kinds;
    (0..total.div_ceil(kinds)).map(|k| base + k * kinds + index).collect()
}

fn run_kind(kind: Kind) {
    let seeds = seeds_of(kind);
    if seeds.is_empty() {
        return;
    }
    if let Ok(filter) = std::env::var("FLEET_SIM_LOG") {
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    }
    let trace = env_u64("FLEET_SIM_TRACE").is_some_and(|v| v != 0);
    let survey = env_u64("FLEET_SIM_SURVEY").is_some_and(|v| v != 0);
    let started = std::time::Instant::now();
    let (mut total, mut failed) = (Outcome::default(), Vec::new());
    for seed in &seeds {
        match run_one(*seed, trace) {
            Ok(o) => {
                if seeds.len() == 1 {
                    eprintln!("{kind:?}: seed {seed} passed; log digest {:016x}", o.digest);
                }
                total.commands += o.commands;
                total.streams += o.streams;
                total.stopped += o.stopped;
                total.fenced += o.fenced;
                total.max_fence_ttl = total.max_fence_ttl.max(o.max_fence_ttl);
                total.settled_after = total.settled_after.max(o.settled_after);
                total.lost_answers += o.lost_answers;
            }
            Err(report) if survey => {
                let why = report.lines().nth(1).unwrap_or_default().trim().to_string();
                eprintln!("{kind:?}: seed {seed} failed: {why}");
                failed.push(*seed);
            }
            Err(report) => panic!("{report}"),
        }
    }
    assert!(
        failed.is_empty(),
        "{kind:?}: {} of {} schedules failed: seeds {failed:?}",
        failed.len(),
        seeds.len()
    );
    eprintln!(
        "{kind:?}: {} schedules in {:?}: {} commands, {} streams, {} partitions told to stop, {} streams fenced \
         (latest {:.2} TTL after the cut), {} lost answers, slowest settle {:?}",
        seeds.len(),
        started.elapsed(),
        total.commands,
        total.streams,
        total.stopped,
        total.fenced,
        total.max_fence_ttl,
        total.lost_answers,
        total.settled_after
    );
    // Not vacuous: consumers were told things, gave partitions back, were fenced.
    assert!(total.commands > seeds.len() as u64, "{kind:?}: hardly any command was delivered");
    if seeds.len() >= 10 {
        assert!(total.stopped > 0, "{kind:?}: no consumer was ever told to stop a partition");
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
