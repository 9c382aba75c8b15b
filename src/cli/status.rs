//! `kafka-assigner status`: reads `/status` from a running assigner's admin port and
//! prints it as a table (like `kafka-consumer-groups --describe`) or as JSON. The document
//! and its HTTP fetch are the client crate's (`kafka_assigner_client::status`, one reader
//! for this command and the container tests); here are the flags and the table. The
//! placement part of the document (`placement`: loads, shares and the shadow load plan,
//! docs/design.md §11) is read here from the raw document, so older readers are unaffected.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

pub(crate) use kafka_assigner_client::status::source_chain;
pub use kafka_assigner_client::status::{Consumer, Handoff, Status, StatusError, Topic};

/// `kafka-assigner status` flags.
#[derive(Clone, Debug, clap::Args)]
pub struct StatusArgs {
    /// The assigner's admin address (`host:port` or `http://host:port`).
    #[arg(long, env = "KAFKA_ASSIGNER_ADMIN_ADDR", default_value = "127.0.0.1:9090")]
    pub admin_addr: String,

    /// Print the raw status as JSON instead of a table.
    #[arg(long, env = "KAFKA_ASSIGNER_STATUS_JSON")]
    pub json: bool,

    /// Give up when the admin server does not answer within this.
    #[arg(long, env = "KAFKA_ASSIGNER_STATUS_TIMEOUT", value_parser = crate::duration::parse_duration, default_value = "5s")]
    pub timeout: Duration,
}

/// Runs the subcommand: the text to print.
pub async fn run(args: &StatusArgs) -> Result<String, StatusError> {
    let (raw, status) = kafka_assigner_client::status::fetch(&args.admin_addr, args.timeout).await?;
    if args.json {
        // The server's document, every field kept (checked above to be a status).
        // Serialising a JSON value into a String cannot fail.
        return Ok(serde_json::to_string_pretty(&raw).unwrap_or_default() + "\n");
    }
    let mut out = render_table(&status, now_ms());
    let placement = placement_of(&raw);
    if !placement.is_empty() {
        out.push('\n');
        out.push_str(&render_placement(&placement));
    }
    Ok(out)
}

/// One topic's `placement` entry of the `/status` document.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct Placement {
    /// Topic name.
    pub topic: String,
    /// `count`, `load` or `shadow`.
    pub mode: String,
    /// Total weight of the partitions.
    #[serde(default)]
    pub total_weight: u64,
    /// Max/mean of the consumers' normalized loads.
    #[serde(default)]
    pub imbalance: f64,
    /// Each consumer's load.
    #[serde(default)]
    pub consumers: Vec<Load>,
    /// Under `shadow`: what placement by load would do.
    #[serde(default)]
    pub load_plan: Option<LoadPlan>,
}

/// A consumer's load in a [`Placement`].
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct Load {
    /// Consumer name.
    pub name: String,
    /// Partitions it owns.
    #[serde(default)]
    pub partitions: usize,
    /// Their total weight.
    #[serde(default)]
    pub load: u64,
    /// Its share of the total weight.
    #[serde(default)]
    pub share: f64,
}

/// The shadow load plan of a [`Placement`].
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct LoadPlan {
    /// Partitions it would move.
    #[serde(default)]
    pub moves: usize,
    /// The imbalance it would reach.
    #[serde(default)]
    pub imbalance_after: f64,
}

/// The `placement` entries of a raw `/status` document (none when absent or unreadable:
/// a server without placement by load).
pub fn placement_of(raw: &serde_json::Value) -> Vec<Placement> {
    raw.get("placement").and_then(|p| serde_json::from_value(p.clone()).ok()).unwrap_or_default()
}

/// The placement tables: per topic the mode, max/mean and (shadow) the load plan; per
/// consumer its partitions, load and share.
pub fn render_placement(placement: &[Placement]) -> String {
    let mut topics = Vec::new();
    let mut loads = Vec::new();
    for t in placement {
        let (moves, after) = match &t.load_plan {
            Some(plan) => (plan.moves.to_string(), format!("{:.2}", plan.imbalance_after)),
            None => ("-".to_string(), "-".to_string()),
        };
        topics.push(vec![
            t.topic.clone(),
            t.mode.clone(),
            t.total_weight.to_string(),
            format!("{:.2}", t.imbalance),
            moves,
            after,
        ]);
        for c in &t.consumers {
            let share = if c.share > 0.0 { format!("{:.1}", c.share) } else { "-".to_string() };
            let percent = if t.total_weight > 0 {
                format!("{:.1}%", c.load as f64 * 100.0 / t.total_weight as f64)
            } else {
                "-".to_string()
            };
            let row = [&t.topic, &c.name, &c.partitions.to_string(), &c.load.to_string(), &percent, &share];
            loads.push(row.iter().map(|s| s.to_string()).collect());
        }
    }
    let mut out = String::from("PLACEMENT\n");
    let header = ["TOPIC", "MODE", "WEIGHT", "MAX/MEAN", "LOAD PLAN MOVES", "LOAD PLAN MAX/MEAN"];
    out.push_str(&table(&header, &topics));
    if !loads.is_empty() {
        out.push('\n');
        out.push_str(&table(&["TOPIC", "CONSUMER", "OWNED", "LOAD", "OF TOTAL", "SHARE"], &loads));
    }
    out
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// `0-3,8,10-11`.
pub fn ranges(partitions: &[u32]) -> String {
    let mut sorted = partitions.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        out.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
        i += 1;
    }
    if out.is_empty() { "-".to_string() } else { out.join(",") }
}

/// `850ms`, `2.1s`, `3m05s`, `2h04m`.
pub fn age(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}

/// Left-aligned columns separated by two spaces.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The human table.
pub fn render_table(status: &Status, now_ms: u64) -> String {
    let mut out = String::new();
    let leader = status.leader.as_deref().unwrap_or("(none)");
    let ready = if status.ready { "ready" } else { "NOT READY" };
    let _ = writeln!(
        out,
        "instance {} ({} backend, {ready}); leader: {leader}\n",
        status.instance, status.backend
    );
    let (mut consumers, mut handoffs, mut unowned) = (Vec::new(), Vec::new(), Vec::new());
    for t in &status.topics {
        let mut owned: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        let mut free = Vec::new();
        for (p, owner) in t.owners.iter().enumerate() {
            match owner {
                Some(o) => owned.entry(o.as_str()).or_default().push(p as u32),
                None => free.push(p as u32),
            }
        }
        for c in &t.consumers {
            let parts = owned.remove(c.name.as_str()).unwrap_or_default();
            let row = [&t.topic, &c.name, &c.instance, &c.status.to_lowercase()];
            let mut row: Vec<String> = row.iter().map(|s| s.to_string()).collect();
            row.extend([parts.len().to_string(), ranges(&parts)]);
            consumers.push(row);
        }
        // Owners with no registration: held for a restarting consumer, or about to move.
        for (name, parts) in owned {
            let row = [t.topic.as_str(), name, "-", "not registered"];
            let mut row: Vec<String> = row.iter().map(|s| s.to_string()).collect();
            row.extend([parts.len().to_string(), ranges(&parts)]);
            consumers.push(row);
        }
        for h in &t.handoffs {
            let age = age(now_ms.saturating_sub(h.since));
            let row = [&t.topic, &h.partition.to_string(), &h.from, &h.to, &h.phase.to_lowercase(), &age];
            handoffs.push(row.iter().map(|s| s.to_string()).collect());
        }
        if !free.is_empty() {
            unowned.push(vec![t.topic.clone(), free.len().to_string(), ranges(&free)]);
        }
    }
    let header = ["TOPIC", "CONSUMER", "INSTANCE", "STATUS", "OWNED", "PARTITIONS"];
    if consumers.is_empty() {
        out.push_str("CONSUMERS: none\n");
    } else {
        out.push_str(&table(&header, &consumers));
    }
    out.push('\n');
    if handoffs.is_empty() {
        out.push_str("HANDOFFS IN FLIGHT: none\n");
    } else {
        out.push_str("HANDOFFS IN FLIGHT\n");
        out.push_str(&table(&["TOPIC", "PARTITION", "FROM", "TO", "PHASE", "AGE"], &handoffs));
    }
    out.push('\n');
    if unowned.is_empty() {
        out.push_str("UNOWNED PARTITIONS: none\n");
    } else {
        out.push_str("UNOWNED PARTITIONS\n");
        out.push_str(&table(&["TOPIC", "COUNT", "PARTITIONS"], &unowned));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_ranges() {
        assert_eq!(ranges(&[]), "-");
        assert_eq!(ranges(&[3]), "3");
        assert_eq!(ranges(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(ranges(&[5, 4, 4, 1]), "1,4-5");
    }

    #[test]
    fn ages() {
        assert_eq!(age(850), "850ms");
        assert_eq!(age(2_140), "2.1s");
        assert_eq!(age(185_000), "3m05s");
        assert_eq!(age(7_440_000), "2h04m");
    }

    #[test]
    fn placement_shows_mode_loads_shares_and_the_shadow_plan() {
        let raw = serde_json::json!({
            "instance": "a-1",
            "placement": [{
                "topic": "events", "mode": "shadow", "total_weight": 32, "imbalance": 2.5,
                "consumers": [
                    {"name": "c-0", "partitions": 3, "load": 20, "share": 8.0, "normalized": 2.5},
                    {"name": "c-1", "partitions": 3, "load": 3, "share": 8.0, "normalized": 0.375},
                    {"name": "c-2", "partitions": 1, "load": 1, "share": 0.0, "normalized": 0.0}
                ],
                "load_plan": {"moves": 4, "imbalance_after": 1.0, "would_move": []}
            }, {"topic": "orders", "mode": "shadow", "total_weight": 2, "imbalance": 1.0, "consumers": []}]
        });
        let text = render_placement(&placement_of(&raw));
        let has =
            |line: &str| text.lines().any(|l| l.split_whitespace().collect::<Vec<_>>().join(" ") == line);
        for line in [
            "TOPIC MODE WEIGHT MAX/MEAN LOAD PLAN MOVES LOAD PLAN MAX/MEAN",
            "events shadow 32 2.50 4 1.00",
            "orders shadow 2 1.00 - -",
            "events c-0 3 20 62.5% 8.0",
            "events c-2 1 1 3.1% -",
        ] {
            assert!(has(line), "missing '{line}' in\n{text}");
        }
        assert!(placement_of(&serde_json::json!({"instance": "x"})).is_empty());
    }

    #[test]
    fn table_shows_consumers_handoffs_unowned_and_leader() {
        let consumer = |name: &str, status: &str, instance: &str, partitions| Consumer {
            name: name.into(),
            status: status.into(),
            instance: instance.into(),
            partitions,
            zone: None,
            capacity: 1,
        };
        let status = Status {
            instance: "a-1".into(),
            backend: "etcd".into(),
            leader: Some("a-2".into()),
            ready: true,
            topics: vec![Topic {
                topic: "events".into(),
                partition_count: 6,
                consumers: vec![consumer("c-0", "Active", "a-1", 3), consumer("c-1", "Draining", "a-2", 1)],
                owners: vec![
                    Some("c-0".into()),
                    Some("c-0".into()),
                    Some("c-1".into()),
                    None,
                    Some("gone".into()),
                    Some("c-0".into()),
                ],
                handoffs: vec![Handoff {
                    partition: 2,
                    from: "c-1".into(),
                    to: "c-0".into(),
                    phase: "Warming".into(),
                    since: 1_000,
                }],
            }],
            placement: Vec::new(),
        };
        let text = render_table(&status, 3_500);
        assert!(text.starts_with("instance a-1 (etcd backend, ready); leader: a-2\n"), "{text}");
        let has =
            |line: &str| text.lines().any(|l| l.split_whitespace().collect::<Vec<_>>().join(" ") == line);
        for line in [
            "TOPIC CONSUMER INSTANCE STATUS OWNED PARTITIONS",
            "events c-0 a-1 active 3 0-1,5",
            "events c-1 a-2 draining 1 2",
            "events gone - not registered 1 4",
            "events 2 c-1 c-0 warming 2.5s",
            "events 1 3",
        ] {
            assert!(has(line), "missing '{line}' in\n{text}");
        }
    }
}
