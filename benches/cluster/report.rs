//! One row per instance count, and the Markdown table (one column per K).

use super::{
    Config,
    measure::{EtcdCounters, InstanceCounters, PrefixRead},
    views::PhaseStats,
};

/// What one run (K instances) measured.
#[derive(Debug, Default)]
pub struct Row {
    /// Instances.
    pub k: usize,
    /// Topics, partitions per topic, consumers per topic.
    pub topics: u32,
    /// Partitions per topic.
    pub partitions: u32,
    /// Consumers per topic.
    pub consumers: u32,
    /// Waves of the restart.
    pub waves: u32,
    /// `--leader-groups` of the instances.
    pub leader_groups: u32,
    /// Every consumer connected and the views stable, in seconds.
    pub connect_s: Option<f64>,
    /// The whole rolling restart, in seconds (`None`: it did not complete).
    pub restart_s: Option<f64>,
    /// The slowest wave (drain, return, stable), in seconds.
    pub slowest_wave_s: f64,
    /// The consumers' views over the restart.
    pub stats: PhaseStats,
    /// etcd's counters while every consumer connected (first `Register`s, first plans).
    pub connect_etcd: EtcdCounters,
    /// etcd's counters over the restart.
    pub etcd: EtcdCounters,
    /// Each instance's counters over the restart.
    pub instances: Vec<InstanceCounters>,
    /// CPU seconds of the bench process (its consumers) over the restart.
    pub bench_cpu_s: Option<f64>,
    /// Each instance's RSS at the end, in MiB.
    pub rss_mib: Vec<f64>,
    /// The whole-prefix read of a resync, at the end.
    pub prefix_read: Option<PrefixRead>,
    /// The 1-minute load average before and after.
    pub load_before: Option<f64>,
    /// See `load_before`.
    pub load_after: Option<f64>,
    /// WARN and ERROR lines in the instances' logs.
    pub warn_lines: u64,
    /// See `warn_lines`.
    pub error_lines: u64,
    /// What went wrong.
    pub notes: Vec<String>,
}

impl Row {
    /// An empty row for `k` instances.
    pub fn new(config: &Config, k: usize) -> Self {
        Self {
            k,
            topics: config.topics,
            partitions: config.partitions,
            consumers: config.consumers,
            waves: config.waves,
            leader_groups: config.leader_groups,
            ..Self::default()
        }
    }

    /// Adds a note.
    pub fn note(&mut self, text: String) {
        eprintln!("  note: {text}");
        self.notes.push(text);
    }

    /// Handoffs (moves in the consumers' views) per second of the restart.
    pub fn handoffs_per_s(&self) -> Option<f64> {
        self.restart_s.map(|s| self.stats.moves as f64 / s.max(1e-9))
    }

    /// The busiest instance's share of the planning seconds, and planning's share of that
    /// instance's CPU.
    pub fn planning(&self) -> Option<(f64, f64)> {
        let total: f64 = self.instances.iter().map(|i| i.plan_s).sum();
        let busiest = self.instances.iter().max_by(|a, b| a.plan_s.total_cmp(&b.plan_s))?;
        (total > 0.0).then(|| (busiest.plan_s / total, busiest.plan_s / busiest.cpu_s.max(1e-9)))
    }

    /// One line for the log.
    pub fn summary(&self) -> String {
        format!(
            "K={}: restart {:?} s, {} moves, gap {:?}, overlap {:?}, errors {}/{}",
            self.k,
            self.restart_s,
            self.stats.moves,
            self.stats.owners.max_gap,
            self.stats.owners.max_overlap,
            self.stats.errors.stream_errors,
            self.stats.errors.rpc_errors
        )
    }
}

fn per(a: f64, b: f64) -> String {
    if b > 0.0 { format!("{:.2}", a / b) } else { "–".into() }
}

fn opt(value: Option<f64>, digits: usize) -> String {
    value.map_or("–".into(), |v| format!("{v:.digits$}"))
}

/// The Markdown: one column per K, then the notes.
pub fn markdown(rows: &[Row]) -> String {
    let mut lines: Vec<(&str, Vec<String>)> = Vec::new();
    let mut add = |name: &'static str, cell: &dyn Fn(&Row) -> String| {
        lines.push((name, rows.iter().map(cell).collect()));
    };
    add("topics × partitions, consumers per topic (total); leader groups", &|r| {
        let (topics, partitions, consumers) = (r.topics, r.partitions, r.consumers);
        format!("{topics} × {partitions}, {consumers} ({}); {}", topics * consumers, r.leader_groups)
    });
    add("connect: every consumer up and stable (s)", &|r| opt(r.connect_s, 1));
    add("connect: etcd `Txn` per consumer (its Register and its share of the first plan)", &|r| {
        per(r.connect_etcd.txns, f64::from(r.topics * r.consumers))
    });
    add("rolling restart (s) (waves); slowest wave (s)", &|r| {
        format!("{} ({}); {:.1}", opt(r.restart_s, 1), r.waves, r.slowest_wave_s)
    });
    add("partitions moved in the consumers' views", &|r| r.stats.moves.to_string());
    add("handoffs per second", &|r| opt(r.handoffs_per_s(), 0));
    add("longest no-owner gap (ms) (gaps)", &|r| {
        format!("{:.0} ({})", r.stats.owners.max_gap.as_secs_f64() * 1e3, r.stats.owners.gaps)
    });
    add("longest overlap (ms)", &|r| format!("{:.0}", r.stats.owners.max_overlap.as_secs_f64() * 1e3));
    add("etcd `Txn` per moved partition", &|r| per(r.etcd.txns, r.stats.moves as f64));
    add("etcd `Put`+`DeleteRange` per moved partition", &|r| per(r.etcd.plain_writes, r.stats.moves as f64));
    add("etcd `Range` per moved partition", &|r| per(r.etcd.ranges, r.stats.moves as f64));
    add("keys changed per moved partition", &|r| per(r.etcd.changes, r.stats.moves as f64));
    add("watch events delivered per change (all instances)", &|r| per(r.etcd.events, r.etcd.changes));
    add("bytes etcd sent per change (watch + answers)", &|r| per(r.etcd.sent_bytes, r.etcd.changes));
    add("etcd database growth per change (bytes; nothing compacts)", &|r| {
        per(r.etcd.db_bytes, r.etcd.changes)
    });
    add("CPU s per instance over the restart (leader groups it led)", &|r| {
        let cells: Vec<String> =
            r.instances.iter().map(|i| format!("{:.1} ({})", i.cpu_s, i.groups_led)).collect();
        cells.join(" / ")
    });
    add("CPU s of the bench's own consumers (one thread) over the restart", &|r| opt(r.bench_cpu_s, 1));
    add("RSS MiB per instance at the end", &|r| {
        r.rss_mib.iter().map(|m| format!("{m:.0}")).collect::<Vec<_>>().join(" / ")
    });
    add("planning: busiest instance's share; share of its CPU", &|r| match r.planning() {
        Some((share, of_cpu)) => format!("{:.0} %; {:.1} %", share * 100.0, of_cpu * 100.0),
        None => "–".into(),
    });
    add("planning s (busiest instance)", &|r| {
        opt(r.instances.iter().map(|i| i.plan_s).max_by(f64::total_cmp), 3)
    });
    add("plan moves written: busiest instance's share", &|r| {
        let total: f64 = r.instances.iter().map(|i| i.moves).sum();
        let busiest = r.instances.iter().map(|i| i.moves).max_by(f64::total_cmp).unwrap_or(0.0);
        if total > 0.0 { format!("{:.0} %", busiest / total * 100.0) } else { "–".into() }
    });
    add("watch resyncs (all instances)", &|r| {
        format!("{:.0}", r.instances.iter().map(|i| i.resyncs).sum::<f64>())
    });
    add("resync read: keys, KiB, ms (median of 5); × K instances (ms)", &|r| match r.prefix_read {
        Some(p) => format!(
            "{}, {:.0}, {:.1}; {:.1}",
            p.keys,
            p.bytes as f64 / 1024.0,
            p.median_ms,
            p.median_ms * r.k as f64
        ),
        None => "–".into(),
    });
    add("stream / call errors (ready refused)", &|r| {
        format!(
            "{} / {} ({})",
            r.stats.errors.stream_errors, r.stats.errors.rpc_errors, r.stats.errors.ready_refused
        )
    });
    add("server WARN / ERROR lines", &|r| format!("{} / {}", r.warn_lines, r.error_lines));
    add("load average before → after", &|r| {
        format!("{} → {}", opt(r.load_before, 1), opt(r.load_after, 1))
    });

    let mut out = String::from("| figure |");
    for row in rows {
        out.push_str(&format!(" K = {} |", row.k));
    }
    out.push_str("\n|---|");
    out.push_str(&"---:|".repeat(rows.len()));
    out.push('\n');
    for (name, cells) in lines {
        out.push_str(&format!("| {name} | {} |\n", cells.join(" | ")));
    }
    out.push_str(FOOTER);
    for row in rows {
        for note in &row.notes {
            out.push_str(&format!("\nK = {}: {note}\n", row.k));
        }
        for sample in &row.stats.errors.samples {
            out.push_str(&format!("\nK = {}, error: {sample}\n", row.k));
        }
    }
    out
}

const FOOTER: &str = "
Each column is a fresh etcd (one member, loopback) and K fresh instances (child processes,
release build, `--drain-policy drain`, default placement `shadow`, the topics split into
`CLUSTER_LEADER_GROUPS` leader groups, default 20), on the same 2 cores as the bench's
consumers. The consumers are slots spread round robin over the instances; in
wave *w* of 10, every slot whose number is *w* modulo 10 sends `Deregister`, serves its
releases until the server ends its stream, and registers again under a new name on the
next instance (a topic has at most one consumer in a wave); the next wave starts once every
partition has one owner in the consumers' views and every topic is balanced. A partition
therefore moves twice per restart (away from the leaving consumer, back to its successor).
*Gap* and *overlap* are taken from the consumers' views, timestamped when the bench's one
thread reads each message, so the bench's own queueing (its CPU is a row) lengthens both;
with K > 1 the old owner's release and the new owner's `assigned` come from different
instances, which nothing orders. etcd figures are deltas of etcd's own `/metrics` over the
restart: `Txn` and `Range` are `grpc_server_handled_total` by method, changes are
`etcd_mvcc_put_total` + `etcd_mvcc_delete_total`, events delivered are
`etcd_debugging_mvcc_events_total` (every watcher's), bytes are
`etcd_network_client_grpc_sent_bytes_total` (watch events and every answer). Planning is
each instance's `kafka_assigner_plan_seconds_total` over the restart, plan moves its
`kafka_assigner_partition_moves_total` (the moves of the fenced plan batches it wrote); CPU is `utime` +
`stime` of `/proc/<pid>/stat`; RSS is `VmRSS` at the end. The resync read is the raw etcd
client's range read of the whole prefix after the restart, which every instance makes on
start, on a broken watch and every resync interval.
";
