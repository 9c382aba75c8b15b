//! The alert rules on a real Prometheus (Debian's `prometheus`), scraping a running
//! assigner: the only consumer crashes, its registration expires and nobody is there to
//! take its partitions (they stay its own, read by nobody), KafkaAssignerPartitionsUnowned
//! fires in Prometheus's own `/api/v1/alerts`; a consumer comes, takes them, and the alert
//! resolves. Then the assigner stops: its scrapes fail and KafkaAssignerNotReady fires for
//! it (the rule's `up == 0` half).
//!
//! The rules are the deployed file, `deploy/prometheus/kafka-assigner.rules.yml`, with one
//! change made here: every `for:` becomes 2 s (the deployed ones are minutes; the test's
//! TTL is 1 s and Prometheus scrapes and evaluates every second). The expressions are the
//! deployed ones untouched, so the deployed file stays a plain rules file (no template to
//! render) and what is tested is what ships.

use std::{net::SocketAddr, time::Duration};

use crate::support::{
    assigner::{Backend, PROMPT, TestCluster},
    poll::poll_async,
    prometheus::Prometheus,
};

/// The test's `for:` (see the module docs).
const FOR: &str = "2s";
/// Scrape (1 s) + evaluation (1 s) + `for` (2 s) + the TTL, with room for a busy machine.
const ALERT: Duration = Duration::from_secs(60);
const UNOWNED: &str = "KafkaAssignerPartitionsUnowned";
const NOT_READY: &str = "KafkaAssignerNotReady";

/// The deployed rules with every `for:` set to `for_`.
pub fn rules_with_for(for_: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus/kafka-assigner.rules.yml");
    let text = std::fs::read_to_string(path).expect("rules file");
    let mut changed = 0;
    let lines: Vec<String> = text
        .lines()
        .map(|line| match line.trim_start().strip_prefix("for: ") {
            Some(_) => {
                changed += 1;
                format!("{}for: {for_}", &line[..line.len() - line.trim_start().len()])
            }
            None => line.to_string(),
        })
        .collect();
    assert!(changed >= 5, "the rules file has its for: lines ({changed})");
    lines.join("\n") + "\n"
}

/// `alertname`'s state in Prometheus now (`None`: neither pending nor firing).
async fn state(prometheus: &Prometheus, alertname: &str) -> Option<String> {
    prometheus.alerts().await.into_iter().find(|(name, _, _)| name == alertname).map(|(_, state, _)| state)
}

/// Waits until `alertname`'s state passes `want`; on the deadline the panic shows the
/// alerts, the assigner's `/status` (if it still answers) and Prometheus's log.
async fn eventually(
    prometheus: &Prometheus,
    admin: SocketAddr,
    alertname: &str,
    what: &str,
    want: impl Fn(&Option<String>) -> bool,
) {
    let give_up = tokio::time::Instant::now() + ALERT;
    while !want(&state(prometheus, alertname).await) {
        if tokio::time::Instant::now() >= give_up {
            let status = crate::support::http10::get(admin, "/status").await;
            let alerts = prometheus.alerts().await;
            panic!(
                "{what}: not within {ALERT:?}; alerts {alerts:?}; /status {status:?}; log {}",
                prometheus.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_fire_and_resolve_on_a_real_prometheus() {
    // One topic, so the only unowned partitions are the ones this test makes.
    let mut cluster = TestCluster::start(Backend::Memory, 1, |c| {
        c.topic_partitions.clear();
        c.topic_partitions.insert("events".into(), 4);
        // A crashed consumer's partitions are not held for it past its TTL.
        c.restart_grace = Duration::ZERO;
    })
    .await;
    let admin = cluster.instance(0).admin_addr;
    let mut a = cluster.consumer_on(0, "a", "events").await;
    a.wait_owned(4, PROMPT).await;

    let prometheus = Prometheus::start(&rules_with_for(FOR), &[admin]).await;
    // Healthy first: the target is scraped, the rules evaluate, and the alert is not there.
    poll_async(ALERT, "Prometheus scrapes the assigner and evaluates the rules", || async {
        let targets = prometheus.api("/api/v1/targets").await;
        let up = targets["activeTargets"].as_array()?.iter().any(|t| t["health"] == "up");
        let rules = prometheus.api("/api/v1/rules").await;
        let group = rules["groups"].as_array()?.first()?.clone();
        let evaluated = group["rules"].as_array()?.iter().all(|r| r["health"] == "ok")
            && group["lastEvaluation"].as_str().is_some_and(|t| !t.starts_with("0001"));
        (up && evaluated).then_some(())
    })
    .await;
    // Both sides of a positive check: the series is there and is 0.
    let query = prometheus.api("/api/v1/query?query=kafka_assigner_partitions_unowned").await;
    assert_eq!(query["result"][0]["value"][1], "0", "{query}");
    // No rule fires, or is pending, on a healthy assigner.
    let alerts = prometheus.alerts().await;
    assert!(alerts.is_empty(), "{alerts:?}\n{}", prometheus.log());

    // a crashes: its registration expires after the TTL, nobody can take its partitions.
    a.crash().await;
    eventually(&prometheus, admin, UNOWNED, "the unowned alert fires", |s| s.as_deref() == Some("firing"))
        .await;
    let firing = prometheus.alerts().await.into_iter().find(|(name, _, _)| name == UNOWNED).expect("firing");
    assert_eq!(firing.2["topic"], "events", "{firing:?}");
    assert_eq!(firing.2["severity"], "critical", "{firing:?}");

    // Healed: b registers and gets every partition directly; the alert resolves.
    let mut b = cluster.consumer_on(0, "b", "events").await;
    b.wait_owned(4, PROMPT).await;
    eventually(&prometheus, admin, UNOWNED, "the unowned alert resolves", |s| s.is_none()).await;
    // Nothing else fired on the way (a crash is not a leader loss, a store outage, ...).
    let others: Vec<_> = prometheus.alerts().await.into_iter().filter(|(n, _, _)| n != UNOWNED).collect();
    assert!(others.is_empty(), "{others:?}");

    // The assigner goes away: its scrapes fail (up == 0), and NotReady fires for it, found
    // by the ready series it exported before.
    drop(b);
    cluster.stop(0).await;
    eventually(&prometheus, admin, NOT_READY, "the not-ready alert fires for a silent assigner", |s| {
        s.as_deref() == Some("firing")
    })
    .await;
    let firing =
        prometheus.alerts().await.into_iter().find(|(name, _, _)| name == NOT_READY).expect("firing");
    assert_eq!(firing.2["instance"], admin.to_string(), "{firing:?}");
    prometheus.close().await;
}
