//! The scale benchmark, black-box over gRPC and the admin port: the server runs
//! as a child process, etcd as another, and the benchmark's own consumers share a few HTTP/2
//! connections. Shared by `benches/scale.rs` (full sizes) and `tests/scale_smoke.rs` (the
//! smallest size, in CI).

pub mod backend;
// Shared with the cluster bench.
#[path = "../support/call_errors.rs"]
pub mod call_errors;
// Shared with the cluster bench (`benches/cluster/`).
#[path = "../support/bench_error.rs"]
pub mod error;
pub mod etcd_ref;
// Shared with the cluster bench.
pub mod fleet;
#[path = "../support/ownership.rs"]
pub mod ownership;
// Shared with the cluster bench.
#[path = "../support/grpc_clients.rs"]
pub mod grpc_clients;
pub mod report;
pub mod scenarios;
// The cluster bench also reads its CPU and admin address; this one does not.
#[allow(dead_code)]
#[path = "../support/server_process.rs"]
pub mod server;
// Shared with the cluster bench.
#[path = "../support/watched.rs"]
pub mod watched;
pub mod world;

use std::{path::PathBuf, time::Duration};

pub use backend::Backend;
use error::BenchError;
pub use report::Report;
pub use scenarios::Scenario;

/// What to run (from `SCALE_*` environment variables, see [`Config::from_env`]).
#[derive(Clone, Debug)]
pub struct Config {
    /// `smoke` or `full`: which scenario sizes.
    pub sizes: String,
    /// Scenarios to run, in order.
    pub scenarios: Vec<Scenario>,
    /// Backends to run them on.
    pub backends: Vec<Backend>,
    /// The `kafka-assigner` binary to run as the server.
    pub binary: PathBuf,
    /// Output path without extension (`.md` and `.json` are written).
    pub out: PathBuf,
    /// `--max-warming` for the server; `None`: a newcomer's whole share (warming is then
    /// not what limits a scale-out).
    pub max_warming: Option<u32>,
    /// More server flags.
    pub extra_args: Vec<String>,
    /// How long one phase may take to become stable.
    pub deadline: Duration,
    /// How long the idle measurement (etcd requests with everyone connected) lasts.
    pub idle_window: Duration,
    /// Raw etcd reference: throughput window and put → watch samples.
    pub raw_window: Duration,
    /// Put → watch samples of the raw reference.
    pub raw_samples: usize,
}

impl Config {
    /// The config for `sizes` (`smoke` or `full`) with defaults for everything else.
    pub fn for_sizes(sizes: &str, binary: PathBuf, out: PathBuf) -> Result<Self, BenchError> {
        let smoke = match sizes {
            "smoke" => true,
            "full" => false,
            other => return Err(BenchError::Config(format!("SCALE_SIZES={other}: use smoke or full"))),
        };
        let scenarios = if smoke {
            vec![
                Scenario::ScaleOut { partitions: 12, from: 3, to: 4 },
                Scenario::FanOut { consumers: 20, joins: 3, spectators: false },
                Scenario::FanOut { consumers: 20, joins: 3, spectators: true },
                Scenario::Storm { consumers: 20 },
            ]
        } else {
            vec![
                Scenario::ScaleOut { partitions: 12, from: 3, to: 4 },
                Scenario::ScaleOut { partitions: 256, from: 16, to: 17 },
                Scenario::ScaleOut { partitions: 256, from: 8, to: 16 },
                Scenario::ScaleOut { partitions: 10_000, from: 100, to: 200 },
                Scenario::FanOut { consumers: 1_000, joins: 10, spectators: false },
                Scenario::FanOut { consumers: 5_000, joins: 10, spectators: false },
                Scenario::FanOut { consumers: 10_000, joins: 10, spectators: false },
                Scenario::FanOut { consumers: 1_000, joins: 10, spectators: true },
                Scenario::FanOut { consumers: 5_000, joins: 10, spectators: true },
                Scenario::FanOut { consumers: 10_000, joins: 10, spectators: true },
                Scenario::Storm { consumers: 10_000 },
            ]
        };
        let secs = |smoke_s: u64, full_s: u64| Duration::from_secs(if smoke { smoke_s } else { full_s });
        Ok(Self {
            sizes: sizes.to_string(),
            scenarios,
            backends: vec![Backend::Memory, Backend::Etcd],
            binary,
            out,
            max_warming: None,
            extra_args: Vec::new(),
            deadline: secs(20, 90),
            idle_window: if smoke { Duration::from_millis(500) } else { Duration::from_secs(5) },
            raw_window: if smoke { Duration::from_millis(300) } else { Duration::from_secs(3) },
            raw_samples: if smoke { 20 } else { 200 },
        })
    }

    /// Reads `SCALE_SIZES` (default `default_sizes`), `SCALE_SCENARIOS` (comma-separated
    /// scenario keys or their kinds, e.g. `scaleout,fanout-1000,storm`), `SCALE_BACKENDS`
    /// (`memory,etcd`), `SCALE_MAX_WARMING`, `SCALE_SERVER_ARGS` (space-separated),
    /// `SCALE_DEADLINE_S`, `SCALE_IDLE_S` and `SCALE_OUT` (path without extension).
    pub fn from_env(default_sizes: &str, binary: PathBuf, out: PathBuf) -> Result<Self, BenchError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let sizes = var("SCALE_SIZES").unwrap_or_else(|| default_sizes.to_string());
        let out = var("SCALE_OUT").map(PathBuf::from).unwrap_or(out);
        let mut config = Self::for_sizes(sizes.trim(), binary, out)?;
        if let Some(wanted) = var("SCALE_SCENARIOS") {
            let wanted: Vec<String> = wanted.split(',').map(|w| w.trim().to_lowercase()).collect();
            // `scaleout` picks every scale-out, `fanout-1000` only that one.
            config.scenarios.retain(|s| {
                let key = s.key();
                wanted.iter().any(|w| key == *w || key.starts_with(&format!("{w}-")))
            });
            if config.scenarios.is_empty() {
                return Err(BenchError::Config(format!("SCALE_SCENARIOS={wanted:?} matches no scenario")));
            }
        }
        if let Some(backends) = var("SCALE_BACKENDS") {
            config.backends =
                backends.split(',').map(|b| Backend::parse(b.trim())).collect::<Result<_, _>>()?;
        }
        let number = |name: &str| -> Result<Option<u64>, BenchError> {
            var(name)
                .map(|v| {
                    v.trim().parse().map_err(|_| BenchError::Config(format!("{name}={v} is not a number")))
                })
                .transpose()
        };
        config.max_warming = number("SCALE_MAX_WARMING")?.map(|n| n as u32).or(config.max_warming);
        if let Some(s) = number("SCALE_DEADLINE_S")? {
            config.deadline = Duration::from_secs(s);
        }
        if let Some(s) = number("SCALE_IDLE_S")? {
            config.idle_window = Duration::from_secs(s);
        }
        if let Some(args) = var("SCALE_SERVER_ARGS") {
            config.extra_args = args.split_whitespace().map(str::to_string).collect();
        }
        Ok(config)
    }
}

/// Runs every scenario on every backend, writes `{out}.md` and `{out}.json`, and returns
/// the report.
pub async fn run(config: &Config) -> Result<Report, BenchError> {
    // 10,000 streams share a few connections, but etcd clients, the server's own sockets and
    // slack for a future one-connection-per-consumer client need more than the usual 1,024.
    let nofile = rlimit::increase_nofile_limit(65_536)?;
    let mut report = Report::new(config, nofile);
    // Server logs of phases that did not settle go here (see `scenarios`); start empty.
    let logs = logs_dir(&config.out);
    if logs.is_dir() {
        std::fs::remove_dir_all(&logs)?;
    }
    for backend in &config.backends {
        if *backend == Backend::Etcd {
            report.raw_etcd = Some(scenarios::raw_etcd(config).await?);
        }
        for scenario in &config.scenarios {
            eprintln!("scale: {} on {}", scenario.key(), backend.name());
            let row = scenarios::run(config, *backend, *scenario).await?;
            eprintln!("  {}", row.summary());
            report.rows.push(row);
        }
    }
    report.write(&config.out)?;
    Ok(report)
}

/// `{out}-logs`: where the server logs of phases that did not settle are kept.
pub fn logs_dir(out: &std::path::Path) -> PathBuf {
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    out.with_file_name(format!("{name}-logs"))
}
