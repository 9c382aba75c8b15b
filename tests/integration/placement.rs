//! Placement by load in the handoff leader (docs/design.md §11), over a real etcd with two
//! assigner instances and four consumers, the topic's weights skewed by
//! `--partition-weights`: under `load` the consumers end within tolerance of their share,
//! every move is a warm handoff and no partition moves twice within its cool-down; under
//! `shadow` placement stays by count while `/status` shows what the load plan would move.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use kafka_assigner::coordinator::records::{TopicRecord, decode};
use kafka_assigner::handoff::{PlacementMode, PlacementSettings};
use kafka_assigner::proto::v1::assignment_command::Command;
use kafka_assigner::weights::{ExplicitWeights, parse_weights_flag};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::POLL_INTERVAL;
use crate::support::assigner::{
    Backend, PROMPT, TestCluster, TestConsumer, WIDE, is_stable, json, owned_by, settle, topic, try_topic,
};

/// `--partition-weights` of the tests: on the 12 partitions of [`WIDE`], two weigh 8, two
/// weigh 4 and the other eight weigh 1 (32 in all: a share of 8 for each of four consumers).
/// Count placement (3 partitions each) leaves someone with at least 8 + 4 + 1.
const WEIGHTS: &str = "wide:0=8,1=8,2=4,3=4";
/// The move cool-down of the load test: long enough to see, short enough to end within it.
const COOLDOWN: Duration = Duration::from_secs(3);
/// Bound for the whole fleet to settle (moves may wait for cool-downs).
const SETTLE: Duration = Duration::from_secs(40);

fn weight(p: u32) -> u64 {
    match p {
        0 | 1 => 8,
        2 | 3 => 4,
        _ => 1,
    }
}

/// Max/mean of the consumers' loads, from what each was told it owns.
fn imbalance(consumers: &[&TestConsumer]) -> f64 {
    let loads: Vec<u64> = consumers.iter().map(|c| c.owned.iter().map(|p| weight(*p)).sum()).collect();
    let total: u64 = loads.iter().sum();
    let mean = total as f64 / loads.len() as f64;
    loads.iter().copied().max().unwrap_or(0) as f64 / mean
}

async fn start(mode: PlacementMode) -> TestCluster {
    TestCluster::start(Backend::Etcd, 2, |config| {
        config.placement = PlacementSettings {
            mode,
            max_moves_per_minute: 30,
            move_cooldown_ms: COOLDOWN.as_millis() as u64,
            ..PlacementSettings::default()
        };
        let flag = parse_weights_flag(WEIGHTS).expect("the test's weights");
        config.weights = Some(Arc::new(ExplicitWeights::new(flag, None).expect("explicit weights")));
        config.weights_refresh = Duration::from_millis(200);
    })
    .await
}

/// `c0` owns every partition of [`WIDE`] and the leader has stored the weights; then `c1`
/// (instance 0), `c2` and `c3` (instance 1) join. Returns them and when the joins began.
async fn four_consumers(cluster: &TestCluster) -> (Vec<TestConsumer>, Instant) {
    let mut c0 = cluster.consumer_on(0, "c0", WIDE).await;
    c0.wait_owned(12, PROMPT).await;
    let key = format!("{}topics/{WIDE}", cluster.config.prefix);
    let give_up = Instant::now() + PROMPT;
    loop {
        let stored = cluster.store.get(&key).await.expect("read the topic record");
        let record = stored.map(|kv| decode::<TopicRecord>(&key, &kv.value).expect("a topic record"));
        if let Some(record) = record.filter(|r| !r.weights.is_empty()) {
            let want: BTreeMap<u32, u64> = (0..4).map(|p| (p, weight(p))).collect();
            assert_eq!(record.weights, want, "the leader stores the weights with the topic");
            assert_eq!(record.partition_count, 12, "and keeps the partition count");
            break;
        }
        assert!(Instant::now() < give_up, "the weights were not stored within {PROMPT:?}");
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    let mut consumers = vec![c0];
    let joins = Instant::now();
    for (i, name) in [(0, "c1"), (1, "c2"), (1, "c3")] {
        let mut c = cluster.consumer_on(i, name, WIDE).await;
        assert!(c.expect_snapshot().await.is_empty(), "{name} joins owning nothing");
        consumers.push(c);
    }
    (consumers, joins)
}

/// Answers warms and releases until no handoff is in flight on instance 0, every consumer's
/// view matches it and `done` holds for what the consumers were told.
async fn drive_until(
    cluster: &TestCluster,
    consumers: &mut [TestConsumer],
    done: impl Fn(&[&TestConsumer]) -> bool,
) {
    let give_up = Instant::now() + SETTLE;
    loop {
        for c in consumers.iter_mut() {
            c.answer_all().await;
        }
        let status = cluster.status_of(0).await;
        let views: Vec<&TestConsumer> = consumers.iter().collect();
        if let Some(t) = try_topic(&status, WIDE)
            && t.handoffs.is_empty()
            && t.consumers.len() == consumers.len()
            && consumers
                .iter()
                .all(|c| c.warms.is_empty() && c.releases.is_empty() && owned_by(t, &c.name) == c.owned)
            && done(&views)
        {
            return;
        }
        assert!(Instant::now() < give_up, "not settled within {SETTLE:?}: {}; {consumers:#?}", json(&status));
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Every partition a consumer was assigned after `joins` (c0's first partitions come before,
/// with nobody to warm from) was warmed first; returns, per partition, when each handoff's
/// warm arrived. A `Warm` repeated while the consumer is still warming that partition from
/// the same owner (no assignment or cancellation in between) is the same handoff told
/// again, which the protocol allows (design.md §3: consumers tolerate a repeated command),
/// not a second move; a warm from another owner is another handoff.
fn warms_before_assignments(consumers: &[TestConsumer], joins: Instant) -> BTreeMap<u32, Vec<Instant>> {
    let mut warms_at: BTreeMap<u32, Vec<Instant>> = BTreeMap::new();
    for c in consumers {
        let mut warmed: BTreeMap<u32, &str> = BTreeMap::new();
        for (at, command) in &c.history {
            match &command.command {
                Some(Command::Warm(w)) => {
                    let p = w.partition.as_ref().map_or(u32::MAX, |tp| tp.partition);
                    if warmed.insert(p, w.current_owner.as_str()) != Some(w.current_owner.as_str()) {
                        warms_at.entry(p).or_default().push(*at);
                    }
                }
                Some(Command::Assignment(update)) => {
                    for tp in &update.assigned {
                        let was_warmed = warmed.remove(&tp.partition).is_some();
                        assert!(
                            was_warmed || *at < joins,
                            "{}: assigned {} without a warm: {c:?}",
                            c.name,
                            tp.partition
                        );
                    }
                    // A warm cancelled: the next warm of it is another handoff.
                    for tp in &update.unassigned {
                        warmed.remove(&tp.partition);
                    }
                }
                _ => {}
            }
        }
    }
    warms_at
}

/// What each consumer was told about partition `p`, with times since `joins`, for a
/// failure's message.
fn heard_of(consumers: &[TestConsumer], p: u32, joins: Instant) -> String {
    let mentions = |command: &Command| match command {
        Command::Warm(w) => w.partition.as_ref().is_some_and(|tp| tp.partition == p),
        Command::Release(r) => r.partition.as_ref().is_some_and(|tp| tp.partition == p),
        Command::Assignment(u) => u.assigned.iter().chain(&u.unassigned).any(|tp| tp.partition == p),
    };
    let mut lines = Vec::new();
    for c in consumers {
        for (at, command) in &c.history {
            if command.command.as_ref().is_some_and(mentions) {
                let since = at.saturating_duration_since(joins);
                lines.push(format!(
                    "{} at {since:?}: {}",
                    c.name,
                    crate::support::assigner::describe(command)
                ));
            }
        }
    }
    lines.join("; ")
}

/// `GET path` from an admin port.
async fn admin_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("admin port");
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).await.expect("ask");
    let mut response = String::new();
    conn.read_to_string(&mut response).await.expect("read");
    response
}

/// The sum of the series of `kafka_assigner_{name}` whose labels include `label`.
fn metric_sum(text: &str, name: &str, label: &str) -> f64 {
    let prefix = format!("kafka_assigner_{name}{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_placement_balances_weight_with_warm_handoffs_and_cool_downs() {
    let cluster = start(PlacementMode::Load).await;
    let (mut consumers, joined) = four_consumers(&cluster).await;
    drive_until(&cluster, &mut consumers, |cs| imbalance(cs) <= 1.10 + 1e-9).await;
    let settled = joined.elapsed();
    // Within tolerance, nothing moves any more.
    for c in consumers.iter_mut() {
        c.assert_quiet(Duration::from_millis(300)).await;
    }
    let views: Vec<&TestConsumer> = consumers.iter().collect();
    let max_mean = imbalance(&views);
    assert!(max_mean <= 1.15, "max/mean {max_mean}");

    let mut warms_at = warms_before_assignments(&consumers, joined);
    let moves: usize = warms_at.values().map(Vec::len).sum();
    for (p, times) in &mut warms_at {
        // Gathered consumer by consumer: in time order only once sorted (unsorted, a later
        // warm to an earlier consumer made `duration_since` saturate to "0ns apart").
        times.sort_unstable();
        for pair in times.windows(2) {
            let apart = pair[1].duration_since(pair[0]);
            // The cool-down starts when the leader starts the handoff; the warms' deliveries
            // may differ from that by a relay pass.
            assert!(
                apart + Duration::from_millis(250) >= COOLDOWN,
                "partition {p} moved twice {apart:?} apart; what each consumer heard of it: {}",
                heard_of(&consumers, *p, joined)
            );
        }
    }
    let twice = warms_at.values().filter(|t| t.len() > 1).count();
    let loads: Vec<(String, u64)> =
        consumers.iter().map(|c| (c.name.clone(), c.owned.iter().map(|p| weight(*p)).sum())).collect();
    eprintln!(
        "[placement load] settled {settled:?} after the joins: max/mean {max_mean:.3}, loads {loads:?}, \
         {moves} warm handoffs, {twice} partitions moved twice"
    );

    // /status of either instance shows the placement; the leader counted the moves.
    let status: serde_json::Value = cluster.admin_status(1).await;
    let wide =
        status["placement"].as_array().expect("placement").iter().find(|t| t["topic"] == WIDE).cloned();
    let wide = wide.expect("wide in placement");
    assert_eq!(wide["mode"], "load");
    assert!(wide["imbalance"].as_f64().expect("imbalance") <= 1.15, "{wide}");
    assert!(wide.get("load_plan").is_none(), "only shadow shows a load plan: {wide}");
    let leader = cluster.leader().expect("a leader");
    let metrics = admin_get(cluster.instance(leader).admin_addr, "/metrics").await;
    let counted = metric_sum(&metrics, "partition_moves_total", "reason=\"balance\"")
        + metric_sum(&metrics, "partition_moves_total", "reason=\"join\"");
    // A warm started and cancelled within one relay pass may never reach its consumer.
    assert!(
        counted as usize >= moves && moves > 0,
        "balance and join moves counted ({counted}, {moves} seen): {metrics}"
    );
    assert_eq!(metric_sum(&metrics, "partition_moves_total", "reason=\"failover\""), 12.0, "c0's first 12");
    let held_back = metric_sum(&metrics, "moves_deferred_total", "why=\"cooldown\"");
    if twice > 0 {
        assert!(held_back >= 1.0, "a second move waited for a cool-down, counted: {metrics}");
    }
    assert!(metrics.contains("kafka_assigner_load_imbalance{topic=\"wide\"}"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_placement_moves_by_count_and_shows_the_load_plan() {
    let cluster = start(PlacementMode::Shadow).await;
    let (mut consumers, joined) = four_consumers(&cluster).await;
    let mut refs: Vec<&mut TestConsumer> = consumers.iter_mut().collect();
    let status = settle(&cluster, WIDE, &mut refs, SETTLE).await;
    let t = topic(&status, WIDE);
    assert!(is_stable(t), "balanced by count: {}", json(&status));
    for c in consumers.iter_mut() {
        assert_eq!(c.owned.len(), 3, "{c:?}");
        c.assert_quiet(Duration::from_millis(300)).await;
    }
    let warms_at = warms_before_assignments(&consumers, joined);
    let moves: usize = warms_at.values().map(Vec::len).sum();
    let views: Vec<&TestConsumer> = consumers.iter().collect();
    let max_mean = imbalance(&views);

    for i in 0..2 {
        let status: serde_json::Value = cluster.admin_status(i).await;
        let placement = status["placement"].as_array().expect("placement").clone();
        let wide = placement.iter().find(|t| t["topic"] == WIDE).expect("wide in placement");
        assert_eq!(wide["mode"], "shadow");
        let now = wide["imbalance"].as_f64().expect("imbalance");
        assert!((now - max_mean).abs() < 1e-9, "instance {i}: {now} vs {max_mean}: {wide}");
        let plan = &wide["load_plan"];
        let would_move = plan["moves"].as_u64().expect("moves");
        let after = plan["imbalance_after"].as_f64().expect("imbalance_after");
        assert!(would_move > 0 && after <= 1.10 + 1e-9 && after < now, "instance {i}: {wide}");
        assert_eq!(plan["would_move"].as_array().expect("would_move").len() as u64, would_move);
        if i == 0 {
            eprintln!(
                "[placement shadow] count placement: max/mean {max_mean:.3} after {moves} warm handoffs; \
                 the load plan would move {would_move} to reach {after:.3}"
            );
        }
    }
    let leader = cluster.leader().expect("a leader");
    let metrics = admin_get(cluster.instance(leader).admin_addr, "/metrics").await;
    assert!(metrics.contains("kafka_assigner_shadow_moves{topic=\"wide\"}"), "{metrics}");
    assert_eq!(metric_sum(&metrics, "partition_moves_total", "reason=\"balance\""), 0.0, "{metrics}");
    let joins = metric_sum(&metrics, "partition_moves_total", "reason=\"join\"") as usize;
    assert!(joins >= moves && moves > 0, "join moves counted ({joins}, {moves} seen): {metrics}");
}
