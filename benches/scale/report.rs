//! Rows, the Markdown table and the JSON file.

use std::{path::Path, time::Duration};

use serde::Serialize;

use super::{
    Config,
    backend::Backend,
    error::BenchError,
    etcd_ref::{EtcdRates, RawEtcd, ms, percentile_ms},
    world::PhaseStats,
};

/// One measured phase of one scenario on one backend.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// `memory` or `etcd`.
    pub backend: String,
    /// Scenario key (`scaleout-256-16-17`, `storm-10000`, `fanout-10000`).
    pub scenario: String,
    /// `scale-out`, `storm` or `fan-out`.
    pub kind: String,
    /// Partitions of the topic.
    pub partitions: u32,
    /// Consumers before the measured phase.
    pub consumers_before: u32,
    /// Consumers after it.
    pub consumers_after: u32,
    /// The server's `--max-warming`.
    pub max_warming: u32,
    /// Whether the consumers' views became stable (one owner each, balanced, nothing in flight).
    pub stable: bool,
    /// Whether they were still stable after the idle window.
    pub stable_after_idle: bool,
    /// Trigger → stable (fan-out: the slowest join).
    pub time_to_stable_ms: Option<f64>,
    /// Partitions moved from one consumer to another in the consumers' views.
    pub moves: u64,
    /// The fewest moves balance needs.
    pub moves_min: u64,
    /// `WarmPartition`s received.
    pub warms: u64,
    /// Longest time a partition had two owners in the consumers' views.
    pub max_overlap_ms: f64,
    /// Longest time a partition had no owner in the consumers' views.
    pub max_gap_ms: f64,
    /// Ownership changes that left a partition without an owner at all.
    pub gaps: u64,
    /// `PartitionReady` → `assigned` / `ReleasePartition` at the consumers concerned.
    pub delivery_p50_ms: Option<f64>,
    /// Same, p99.
    pub delivery_p99_ms: Option<f64>,
    /// Delivery samples.
    pub delivery_samples: usize,
    /// A joiner's `Register` → its first `WarmPartition`, p50.
    pub join_to_warm_p50_ms: Option<f64>,
    /// Same, p99.
    pub join_to_warm_p99_ms: Option<f64>,
    /// `Register` → snapshot, p50.
    pub register_p50_ms: Option<f64>,
    /// Same, p99.
    pub register_p99_ms: Option<f64>,
    /// Storm: first `Register` sent → last snapshot received.
    pub registers_complete_ms: Option<f64>,
    /// Fan-out: connecting every consumer (in waves) before the joins.
    pub connect_ms: Option<f64>,
    /// Server RSS at the end, MiB.
    pub rss_mib: f64,
    /// (RSS at the end − RSS of the empty server) / consumers, KiB.
    pub rss_per_consumer_kib: f64,
    /// etcd rates during the measured phase.
    pub etcd_busy: Option<EtcdRates>,
    /// etcd rates in the idle window after it, everyone connected.
    pub etcd_idle: Option<EtcdRates>,
    /// Streams that ended or failed.
    pub stream_errors: u64,
    /// Calls refused (other than `ready_refused`).
    pub rpc_errors: u64,
    /// `PartitionReady` refused because the warm had been cancelled or retargeted.
    pub ready_refused: u64,
    /// Server log lines at WARN.
    pub server_warn_lines: u64,
    /// Server log lines at ERROR.
    pub server_error_lines: u64,
    /// Whether the server process was still running at the end.
    pub server_alive: bool,
    /// What went wrong, and the first errors seen.
    pub notes: Vec<String>,
}

impl Row {
    /// An empty row.
    pub fn new(
        backend: Backend,
        scenario: &str,
        kind: &str,
        partitions: u32,
        before: u32,
        after: u32,
    ) -> Self {
        Self {
            backend: backend.name().into(),
            scenario: scenario.into(),
            kind: kind.into(),
            partitions,
            consumers_before: before,
            consumers_after: after,
            max_warming: 0,
            stable: false,
            stable_after_idle: true,
            time_to_stable_ms: None,
            moves: 0,
            moves_min: 0,
            warms: 0,
            max_overlap_ms: 0.0,
            max_gap_ms: 0.0,
            gaps: 0,
            delivery_p50_ms: None,
            delivery_p99_ms: None,
            delivery_samples: 0,
            join_to_warm_p50_ms: None,
            join_to_warm_p99_ms: None,
            register_p50_ms: None,
            register_p99_ms: None,
            registers_complete_ms: None,
            connect_ms: None,
            rss_mib: 0.0,
            rss_per_consumer_kib: 0.0,
            etcd_busy: None,
            etcd_idle: None,
            stream_errors: 0,
            rpc_errors: 0,
            ready_refused: 0,
            server_warn_lines: 0,
            server_error_lines: 0,
            server_alive: true,
            notes: Vec::new(),
        }
    }

    /// Adds a note.
    pub fn note(&mut self, text: String) {
        self.notes.push(text);
    }

    /// Takes the consumers' figures of the measured phase.
    pub fn apply(&mut self, stats: &PhaseStats, time_to_stable: Option<Duration>) {
        self.stable = time_to_stable.is_some();
        self.time_to_stable_ms = time_to_stable.map(ms);
        self.moves = stats.moves;
        self.warms = stats.warms;
        self.max_overlap_ms = ms(stats.owners.max_overlap);
        self.max_gap_ms = ms(stats.owners.max_gap);
        self.gaps = stats.owners.gaps;
        let (mut delivery, mut warm, mut register) =
            (stats.delivery.clone(), stats.join_to_warm.clone(), stats.register_to_snapshot.clone());
        self.delivery_samples = delivery.len();
        self.delivery_p50_ms = percentile_ms(&mut delivery, 0.50);
        self.delivery_p99_ms = percentile_ms(&mut delivery, 0.99);
        self.join_to_warm_p50_ms = percentile_ms(&mut warm, 0.50);
        self.join_to_warm_p99_ms = percentile_ms(&mut warm, 0.99);
        self.register_p50_ms = percentile_ms(&mut register, 0.50);
        self.register_p99_ms = percentile_ms(&mut register, 0.99);
        self.stream_errors = stats.errors.stream_errors;
        self.rpc_errors = stats.errors.rpc_errors;
        self.ready_refused = stats.errors.ready_refused;
        self.notes.extend(stats.errors.samples.iter().cloned());
    }

    /// One line for the progress log.
    pub fn summary(&self) -> String {
        format!(
            "{} {}: stable {} moves {}/{} gap {:.1} ms overlap {:.1} ms delivery p99 {} errors {}/{} {}",
            self.backend,
            self.scenario,
            opt(self.time_to_stable_ms),
            self.moves,
            self.moves_min,
            self.max_gap_ms,
            self.max_overlap_ms,
            opt(self.delivery_p99_ms),
            self.stream_errors,
            self.rpc_errors,
            self.notes.join("; ")
        )
    }

    fn markdown(&self) -> String {
        let stable = match (self.time_to_stable_ms, self.stable_after_idle) {
            (Some(t), true) => format!("{t:.0} ms"),
            (Some(t), false) => format!("{t:.0} ms, then lost ‡"),
            (None, _) => "**no** ‡".into(),
        };
        let pair = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => format!("{a:.1} / {b:.1}"),
            _ => "–".into(),
        };
        let rates = |r: &Option<EtcdRates>| match r {
            Some(r) => format!("{:.0} ({:.0} ka)", r.requests_per_s, r.keepalives_per_s),
            None => "–".into(),
        };
        let registers = match (self.registers_complete_ms, self.connect_ms) {
            (Some(t), _) => format!("{t:.0} ms; {}", pair(self.register_p50_ms, self.register_p99_ms)),
            (None, Some(t)) => format!("(setup {t:.0} ms) §"),
            (None, None) => "–".into(),
        };
        format!(
            "| {} | {} | {} → {} | {} | {} / {} | {:.1} | {:.1} ({}) | {} | {} | {} | {:.0} MiB ({:.1} KiB) | {} | {} | {} / {} ({}) |\n",
            self.backend,
            self.scenario,
            self.consumers_before,
            self.consumers_after,
            stable,
            self.moves,
            self.moves_min,
            self.max_overlap_ms,
            self.max_gap_ms,
            self.gaps,
            pair(self.delivery_p50_ms, self.delivery_p99_ms),
            pair(self.join_to_warm_p50_ms, self.join_to_warm_p99_ms),
            registers,
            self.rss_mib,
            self.rss_per_consumer_kib,
            rates(&self.etcd_busy),
            rates(&self.etcd_idle),
            self.stream_errors,
            self.rpc_errors,
            self.ready_refused,
        )
    }
}

fn opt(value: Option<f64>) -> String {
    value.map_or_else(|| "–".into(), |v| format!("{v:.1} ms"))
}

/// Everything one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// `smoke` or `full`.
    pub sizes: String,
    /// The open-files limit the run had.
    pub nofile_limit: u64,
    /// The server's extra flags.
    pub server_args: Vec<String>,
    /// The raw etcd reference (when etcd ran).
    pub raw_etcd: Option<RawEtcd>,
    /// The rows.
    pub rows: Vec<Row>,
}

impl Report {
    /// An empty report for `config`.
    pub fn new(config: &Config, nofile_limit: u64) -> Self {
        Self {
            sizes: config.sizes.clone(),
            nofile_limit,
            server_args: config.extra_args.clone(),
            raw_etcd: None,
            rows: Vec::new(),
        }
    }

    /// The Markdown table with its legend.
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| backend | scenario | consumers | stable in | moves / min | longest overlap (ms) | longest gap (ms) (gaps) | delivery p50 / p99 (ms) | join → warm p50 / p99 (ms) | Registers complete; → snapshot p50 / p99 (ms) | server RSS (per consumer) | etcd req/s busy (keep-alive) | etcd req/s idle (keep-alive) | stream / call errors (ready refused) |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        );
        for row in &self.rows {
            out.push_str(&row.markdown());
        }
        out.push_str(
            "\n§ setup: the consumers before the measured phase, connected (fan-out: in waves of \
             1,000) until stable. Busy = during the measured phase; idle = a window after it with \
             everyone connected; ka = LeaseKeepAlive messages.\n",
        );
        let targets = self.targets();
        if !targets.is_empty() {
            out.push_str("\ntargets (docs/design.md §9):\n");
            for (what, measured, pass) in targets {
                out.push_str(&format!("- {what}: {measured}: {}\n", if pass { "PASS" } else { "**FAIL**" }));
            }
        }
        if let Some(raw) = &self.raw_etcd {
            out.push_str(&format!(
                "\nraw etcd, same run: {:.0} fenced txn/s with 64 in flight; put → another client's watch p50 {:.2} ms, p99 {:.2} ms\n",
                raw.txn_per_s, raw.put_watch_p50_ms, raw.put_watch_p99_ms
            ));
        }
        let notes: Vec<String> = self
            .rows
            .iter()
            .filter(|r| !r.notes.is_empty())
            .map(|r| format!("- {} {}: {}", r.backend, r.scenario, r.notes.join("; ")))
            .collect();
        if !notes.is_empty() {
            out.push_str("\n‡ notes:\n");
            out.push_str(&notes.join("\n"));
            out.push('\n');
        }
        out
    }

    fn row(&self, backend: &str, scenario: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.backend == backend && r.scenario == scenario)
    }

    /// The targets of docs/design.md §9 that this run's rows can check: (target, measured, met).
    pub fn targets(&self) -> Vec<(String, String, bool)> {
        let mut out = Vec::new();
        for backend in ["memory", "etcd"] {
            for scenario in ["fanout-10000", "fanout-10000-spectators"] {
                let Some(r) = self.row(backend, scenario) else { continue };
                let held = r.stable && r.stable_after_idle && r.stream_errors == 0;
                out.push((
                    format!("{backend} {scenario}: stable, no session lost"),
                    format!("stable {}, stream errors {}", r.stable && r.stable_after_idle, r.stream_errors),
                    held,
                ));
                let rss = if r.stable {
                    format!("{:.0} MiB", r.rss_mib)
                } else {
                    format!("did not settle ({:.0} MiB then)", r.rss_mib)
                };
                out.push((format!("{backend} {scenario}: RSS < 1 GiB"), rss, r.stable && r.rss_mib < 1024.0));
                let p99 = r.delivery_p99_ms;
                out.push((
                    format!("{backend} {scenario}: delivery p99 < 50 ms"),
                    opt(p99),
                    p99.is_some_and(|p| p < 50.0),
                ));
            }
            if let Some(r) = self.row(backend, "storm-10000") {
                let limit = if backend == "etcd" { 3_000.0 } else { 1_000.0 };
                let t = r.registers_complete_ms;
                out.push((
                    format!("{backend} storm: 10,000 Registers complete < {limit:.0} ms"),
                    opt(t),
                    t.is_some_and(|t| t < limit),
                ));
            }
            let gaps: Vec<&Row> =
                self.rows.iter().filter(|r| r.backend == backend && r.kind != "storm").collect();
            if !gaps.is_empty() {
                let worst = gaps.iter().map(|r| r.max_gap_ms).fold(0.0, f64::max);
                out.push((
                    format!("{backend}: no ownership gap in planned moves"),
                    format!("longest {worst:.2} ms"),
                    worst == 0.0,
                ));
            }
        }
        if let Some(r) = self.row("etcd", "scaleout-10000-100-200") {
            let t = r.time_to_stable_ms;
            out.push((
                "etcd scale-out 10,000 partitions 100 → 200 < 2 s".into(),
                opt(t),
                t.is_some_and(|t| t < 2_000.0),
            ));
        }
        let idle = |n: &str| self.row("etcd", n).and_then(|r| r.etcd_idle).map(|i| i.requests_per_s);
        for suffix in ["", "-spectators"] {
            let (small, large) = (format!("fanout-1000{suffix}"), format!("fanout-10000{suffix}"));
            if let (Some(a), Some(b)) = (idle(&small), idle(&large)) {
                out.push((
                    format!("etcd requests/s idle independent of consumers ({large} ≤ 1.5 × {small} + 2)"),
                    format!("{a:.1}/s at 1,000, {b:.1}/s at 10,000"),
                    b <= a * 1.5 + 2.0,
                ));
            }
        }
        out
    }

    /// Writes `{out}.md` and `{out}.json`.
    pub fn write(&self, out: &Path) -> Result<(), BenchError> {
        if let Some(parent) = out.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(out.with_extension("md"), self.markdown())?;
        let mut json = serde_json::to_value(self)?;
        if let Some(object) = json.as_object_mut() {
            let targets = self.targets().into_iter().map(|(target, measured, met)| {
                serde_json::json!({ "target": target, "measured": measured, "met": met })
            });
            object.insert("targets".into(), serde_json::Value::Array(targets.collect()));
        }
        std::fs::write(out.with_extension("json"), serde_json::to_string_pretty(&json)?)?;
        Ok(())
    }
}
