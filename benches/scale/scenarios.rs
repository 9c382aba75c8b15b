//! The scenarios: scale-out (N → M consumers on P partitions) and fan-out (a storm of N
//! `Register`s, then joins one at a time with N streams open). Each runs against a fresh
//! server (and a fresh etcd), so memory and etcd rates belong to that scenario alone.

use std::time::{Duration, Instant};

use super::{
    Backend, Config,
    error::BenchError,
    etcd_ref::{self, EtcdCounters, EtcdRates, RawEtcd, ms},
    fleet::Fleet,
    report::Row,
    server::{ServerProcess, ServerSpec, Store},
    world::{PhaseStats, Shared, World},
};
use crate::etcd::EtcdServer;

const TOPIC: &str = "bench";
/// Fan-out with spectators: the topic their streams are on.
const IDLE_TOPIC: &str = "idle";

/// Streams per HTTP/2 connection (the server does not cap concurrent streams; a few
/// connections still spread the work over the client's and server's I/O).
const STREAMS_PER_CONNECTION: u32 = 500;

/// Fan-out connects its consumers in waves of this many `Register`s, each wave settling
/// before the next, so the storm (a scenario of its own) does not decide whether fan-out
/// can be measured at all.
const WAVE: u32 = 1_000;

/// One scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// `from` consumers hold `partitions`; `to - from` join at once.
    ScaleOut {
        /// Partitions of the topic.
        partitions: u32,
        /// Consumers before.
        from: u32,
        /// Consumers after.
        to: u32,
    },
    /// `consumers` connected (in waves), then `joins` joins one after another, each taking
    /// one partition (the topic has `consumers + joins` partitions).
    FanOut {
        /// Consumers connected.
        consumers: u32,
        /// Joins measured.
        joins: u32,
        /// Only a tenth of the consumers (2 to 100) on the measured topic, the rest on
        /// another topic of one partition (today's server cannot settle thousands of
        /// consumers on one topic; this still holds that many streams open).
        spectators: bool,
    },
    /// `consumers` `Register`s at once on a topic of as many partitions.
    Storm {
        /// Consumers registering.
        consumers: u32,
    },
}

impl Scenario {
    /// Its key in `SCALE_SCENARIOS` and the JSON.
    pub fn key(&self) -> String {
        match self {
            Self::ScaleOut { partitions, from, to } => format!("scaleout-{partitions}-{from}-{to}"),
            Self::FanOut { consumers, spectators: false, .. } => format!("fanout-{consumers}"),
            Self::FanOut { consumers, spectators: true, .. } => format!("fanout-{consumers}-spectators"),
            Self::Storm { consumers } => format!("storm-{consumers}"),
        }
    }
}

/// The raw etcd reference on a fresh etcd.
pub async fn raw_etcd(config: &Config) -> Result<RawEtcd, BenchError> {
    let etcd = EtcdServer::start().await;
    etcd_ref::raw_reference(&etcd.endpoints(), config.raw_window, config.raw_samples).await
}

/// A server (and its etcd) for one scenario.
struct Setup {
    server: ServerProcess,
    etcd: Option<EtcdServer>,
    rss_empty: u64,
    /// Where logs of phases that did not settle are kept.
    logs: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Setup {
    async fn start(
        config: &Config,
        backend: Backend,
        topics: &str,
        max_warming: u32,
    ) -> Result<Self, BenchError> {
        let dir = tempfile::Builder::new().prefix("kafka-assigner-scale-").tempdir()?;
        let etcd = match backend {
            Backend::Memory => None,
            Backend::Etcd => Some(EtcdServer::start().await),
        };
        let store = match &etcd {
            None => Store::Memory,
            Some(etcd) => Store::Etcd { endpoints: etcd.endpoints(), prefix: etcd.unique_prefix("scale") },
        };
        let spec = ServerSpec {
            binary: &config.binary,
            store: &store,
            topics,
            max_warming: config.max_warming.unwrap_or(max_warming),
            extra_args: &config.extra_args,
            log: dir.path().join("server.log"),
        };
        let server = ServerProcess::start(&spec).await?;
        let rss_empty = server.rss_bytes()?;
        Ok(Self { server, etcd, rss_empty, logs: super::logs_dir(&config.out), _dir: dir })
    }

    async fn etcd_counters(&self) -> Option<EtcdCounters> {
        let endpoint = self.etcd.as_ref()?.endpoints().into_iter().next()?;
        etcd_ref::counters(&endpoint).await.ok()
    }

    /// Waits `window` with everyone connected and returns etcd's rates over it.
    async fn idle_rates(&self, window: Duration) -> Option<EtcdRates> {
        let before = self.etcd_counters().await;
        tokio::time::sleep(window).await;
        let after = self.etcd_counters().await;
        Some(before?.rates_to(&after?))
    }

    /// Fills the server-side columns of `row` with `consumers` connected.
    fn finish(&mut self, row: &mut Row, consumers: u32) {
        let rss = self.server.rss_bytes().unwrap_or(0);
        row.rss_mib = rss as f64 / (1024.0 * 1024.0);
        row.rss_per_consumer_kib =
            rss.saturating_sub(self.rss_empty) as f64 / 1024.0 / f64::from(consumers.max(1));
        let (warn, error) = self.server.log_warnings();
        row.server_warn_lines = warn;
        row.server_error_lines = error;
        row.server_alive = self.server.alive();
        if !(row.stable && row.stable_after_idle) {
            // Keep the server's log of a phase that did not settle, for whoever fixes it.
            let kept = self.logs.join(format!("{}-{}.log", row.backend, row.scenario));
            let copied = std::fs::create_dir_all(&self.logs).and_then(|()| self.server.copy_log(&kept));
            match copied {
                Ok(()) => row.note(format!("server log: {}", kept.display())),
                Err(e) => row.note(format!("server log not kept: {e}")),
            }
        }
    }
}

/// Runs one scenario on one backend.
pub async fn run(config: &Config, backend: Backend, scenario: Scenario) -> Result<Row, BenchError> {
    match scenario {
        Scenario::ScaleOut { partitions, from, to } => {
            scale_out(config, backend, scenario, partitions, from, to).await
        }
        Scenario::FanOut { consumers, joins, spectators } => {
            fan_out(config, backend, scenario, consumers, joins, spectators).await
        }
        Scenario::Storm { consumers } => storm(config, backend, scenario, consumers).await,
    }
}

fn connections(consumers: u32) -> usize {
    consumers.div_ceil(STREAMS_PER_CONNECTION).clamp(1, 32) as usize
}

async fn scale_out(
    config: &Config,
    backend: Backend,
    scenario: Scenario,
    partitions: u32,
    from: u32,
    to: u32,
) -> Result<Row, BenchError> {
    let mut setup =
        Setup::start(config, backend, &format!("{TOPIC}={partitions}"), partitions.div_ceil(to)).await?;
    let shared = Shared::new(World::new(partitions));
    let mut fleet = Fleet::connect(&setup.server.grpc_url(), connections(to), TOPIC, shared.clone()).await?;
    let mut row = Row::new(backend, &scenario.key(), "scale-out", partitions, from, to);
    row.max_warming = config.max_warming.unwrap_or(partitions.div_ceil(to));

    let connecting = Instant::now();
    fleet.spawn_all(0..from);
    if shared.wait_stable(from, connecting + config.deadline).await.is_none() {
        let views = shared.lock().describe(from);
        row.note(format!(
            "{from} consumers not stable within {:?} before the scale-out ({views})",
            config.deadline
        ));
        setup.finish(&mut row, from);
        return Ok(row);
    }
    row.connect_ms = Some(ms(connecting.elapsed()));
    row.moves_min = min_moves(&shared.lock().loads(from), partitions, to);
    let before = setup.etcd_counters().await;
    shared.start_phase();
    let start = Instant::now();
    fleet.spawn_all(from..to);
    let stable = shared.wait_stable(to, start + config.deadline).await;
    if stable.is_none() {
        row.note(format!("not stable within {:?} ({})", config.deadline, shared.lock().describe(to)));
    }
    let stats = shared.end_phase();
    if let (Some(before), Some(after)) = (before, setup.etcd_counters().await) {
        row.etcd_busy = Some(before.rates_to(&after));
    }
    row.apply(&stats, stable.map(|at| at - start));
    measure_idle(config, &mut setup, &shared, &mut row, to).await;
    Ok(row)
}

/// The idle window (etcd rates with everyone connected), then whether the views stayed
/// stable through it, then the server-side columns.
async fn measure_idle(config: &Config, setup: &mut Setup, shared: &Shared, row: &mut Row, consumers: u32) {
    row.etcd_idle = setup.idle_rates(config.idle_window).await;
    if row.stable && !shared.lock().is_stable(consumers) {
        row.note(format!("became unstable during the {:?} idle window", config.idle_window));
        row.stable_after_idle = false;
    }
    setup.finish(row, consumers);
}

/// Every `Register` at once on a topic of as many partitions as consumers.
async fn storm(
    config: &Config,
    backend: Backend,
    scenario: Scenario,
    consumers: u32,
) -> Result<Row, BenchError> {
    let partitions = consumers;
    let mut setup = Setup::start(config, backend, &format!("{TOPIC}={partitions}"), 4).await?;
    let shared = Shared::new(World::new(partitions));
    let mut fleet =
        Fleet::connect(&setup.server.grpc_url(), connections(consumers), TOPIC, shared.clone()).await?;
    let mut row = Row::new(backend, &scenario.key(), "storm", partitions, 0, consumers);
    row.max_warming = config.max_warming.unwrap_or(4);
    let before = setup.etcd_counters().await;
    shared.start_phase();
    let start = Instant::now();
    fleet.spawn_all(0..consumers);
    let stable = shared.wait_stable(consumers, start + config.deadline).await;
    if stable.is_none() {
        row.note(format!("not stable within {:?} ({})", config.deadline, shared.lock().describe(consumers)));
    }
    let stats = shared.end_phase();
    if let (Some(before), Some(after)) = (before, setup.etcd_counters().await) {
        row.etcd_busy = Some(before.rates_to(&after));
    }
    row.apply(&stats, stable.map(|at| at - start));
    if stats.first_snapshots == u64::from(consumers) {
        row.registers_complete_ms = stats.last_snapshot.map(|at| ms(at.saturating_duration_since(start)));
    } else {
        row.note(format!("{} of {consumers} consumers ever got a snapshot", stats.first_snapshots));
    }
    measure_idle(config, &mut setup, &shared, &mut row, consumers).await;
    Ok(row)
}

/// `consumers` connected in waves (not a storm: that is its own scenario), an idle window,
/// then `joins` joins one at a time, each taking one partition from a consumer holding two.
/// With `spectators`, only a tenth of them (2 to 100) are on the measured topic and the
/// rest hold streams on a second topic of one partition.
async fn fan_out(
    config: &Config,
    backend: Backend,
    scenario: Scenario,
    consumers: u32,
    joins: u32,
    spectators: bool,
) -> Result<Row, BenchError> {
    let active = if spectators { (consumers / 10).clamp(2, 100).min(consumers) } else { consumers };
    let idle_count = consumers - active;
    let partitions = active + joins;
    let topics = if idle_count > 0 {
        format!("{TOPIC}={partitions},{IDLE_TOPIC}=1")
    } else {
        format!("{TOPIC}={partitions}")
    };
    // A newcomer's share is one or two partitions: warming never limits anything here.
    let mut setup = Setup::start(config, backend, &topics, 4).await?;
    let url = setup.server.grpc_url();
    let shared = Shared::new(World::new(partitions));
    let mut fleet = Fleet::connect(&url, connections(active + joins), TOPIC, shared.clone()).await?;
    let idle = Shared::new(World::new(1));
    let mut idle_fleet = Fleet::connect(&url, connections(idle_count), IDLE_TOPIC, idle.clone()).await?;
    let mut row = Row::new(backend, &scenario.key(), "fan-out", partitions, consumers, consumers + joins);
    row.max_warming = config.max_warming.unwrap_or(4);

    let start = Instant::now();
    for (world, fleet, count) in [(&idle, &mut idle_fleet, idle_count), (&shared, &mut fleet, active)] {
        for wave in (0..count).step_by(WAVE as usize) {
            let end = (wave + WAVE).min(count);
            fleet.spawn_all(wave..end);
            if world.wait_stable(end, Instant::now() + config.deadline).await.is_none() {
                let views = world.lock().describe(end);
                row.note(format!(
                    "not measured: {end} consumers not stable within {:?} ({views})",
                    config.deadline
                ));
                row.stream_errors =
                    shared.end_phase().errors.stream_errors + idle.end_phase().errors.stream_errors;
                setup.finish(&mut row, end);
                return Ok(row);
            }
        }
    }
    row.connect_ms = Some(ms(start.elapsed()));
    // Idle with everyone connected, before the joins.
    row.etcd_idle = setup.idle_rates(config.idle_window).await;
    if !shared.lock().is_stable(active) || (idle_count > 0 && !idle.lock().is_stable(idle_count)) {
        row.note(format!("{consumers} consumers became unstable while idle"));
        row.stable_after_idle = false;
    }

    let before = setup.etcd_counters().await;
    shared.start_phase();
    let mut slowest = Duration::ZERO;
    let mut all_stable = true;
    for join in 0..joins {
        let n = active + join;
        row.moves_min += min_moves(&shared.lock().loads(n), partitions, n + 1);
        let start = Instant::now();
        fleet.spawn(n);
        match shared.wait_stable(n + 1, start + config.deadline).await {
            Some(at) => slowest = slowest.max(at - start),
            None => {
                all_stable = false;
                let views = shared.lock().describe(n + 1);
                row.note(format!("join {} not stable within {:?} ({views})", join + 1, config.deadline));
                break;
            }
        }
    }
    let stats: PhaseStats = shared.end_phase();
    if let (Some(before), Some(after)) = (before, setup.etcd_counters().await) {
        row.etcd_busy = Some(before.rates_to(&after));
    }
    // Time to stable of the slowest join.
    row.apply(&stats, all_stable.then_some(slowest));
    let idle_stats = idle.end_phase();
    row.stream_errors += idle_stats.errors.stream_errors;
    if idle_count > 0 && !idle.lock().is_stable(idle_count) {
        row.note("the spectators' topic lost its stability".into());
        row.stable_after_idle = false;
    }
    setup.finish(&mut row, consumers + joins);
    Ok(row)
}

/// The fewest partitions that must change owner for `loads` (the current owners' loads,
/// holding every partition) to become balanced over `members` consumers: the old consumers
/// keep as much as their new share allows, the largest ones taking the ⌈P/M⌉ shares.
pub fn min_moves(loads: &[u32], partitions: u32, members: u32) -> u64 {
    if members == 0 {
        return 0;
    }
    let (share, extra) = (partitions / members, (partitions % members) as usize);
    let mut sorted = loads.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let kept: u64 = sorted
        .iter()
        .enumerate()
        .map(|(i, load)| u64::from(*load.min(&if i < extra { share + 1 } else { share })))
        .sum();
    u64::from(partitions).saturating_sub(kept)
}
