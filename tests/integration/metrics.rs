//! `/metrics` after a scripted run on the etcd backend, started from flags as the binary
//! starts it (so the store is metered): `a` joins (4 direct assignments), `b` joins (two
//! warm handoffs, answered), a refused call, `b` crashes (its 2 partitions go to `a`
//! directly), `a` deregisters (`SHUTDOWN_NOW` by policy). Then etcd goes away and comes
//! back: store errors and a watch re-read. Every listed series is checked for the value
//! the script implies.

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc, time::Duration};

use clap::Parser;
use kafka_assigner::config::{Cli, Command};
use kafka_assigner::metrics::Metrics;
use kafka_assigner::proto::v1::{
    DeregisterAction, PartitionReadyRequest, TopicPartition, kafka_assigner_client::KafkaAssignerClient,
};
use kafka_assigner::{backend::coordinator_from_args, server::AssignerServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

use crate::support::{
    EtcdServer,
    assigner::{EXPIRY, PROMPT, TestConsumer},
    wait_until,
};

const TOPIC: &str = "events";

/// `GET path` on an admin server: (HTTP status, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap_or_else(|e| panic!("admin {addr}: {e}"));
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).await.unwrap_or_else(|e| panic!("admin {addr}: {e}"));
    let mut response = String::new();
    tokio::time::timeout(PROMPT, conn.read_to_string(&mut response))
        .await
        .unwrap_or_else(|_| panic!("admin {addr}{path}: no response"))
        .unwrap_or_else(|e| panic!("admin {addr}{path}: {e}"));
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or_else(|| panic!("bad response: {response}"));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, body.to_string())
}

/// The samples of an OpenMetrics text: `name{labels}` → value.
pub fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    let mut samples = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not a sample: {line}"));
        let value: f64 = value.parse().unwrap_or_else(|e| panic!("bad value in '{line}': {e}"));
        assert!(samples.insert(series.to_string(), value).is_none(), "series twice: {line}");
    }
    samples
}

async fn scrape(server: &AssignerServer) -> BTreeMap<String, f64> {
    let (code, body) = http_get(server.admin_addr, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.ends_with("# EOF\n"), "OpenMetrics text ends with # EOF: {body}");
    parse_metrics(&body)
}

fn value(samples: &BTreeMap<String, f64>, series: &str) -> f64 {
    *samples.get(series).unwrap_or_else(|| {
        let near: Vec<&String> =
            samples.keys().filter(|k| k.starts_with(series.split('{').next().unwrap_or(series))).collect();
        panic!("no series {series}; similar: {near:#?}")
    })
}

async fn start(etcd: &EtcdServer) -> AssignerServer {
    let endpoints = etcd.endpoints().join(",");
    let prefix = etcd.unique_prefix("metrics");
    let flags = [
        "kafka-assigner",
        "serve",
        "--backend",
        "etcd",
        "--etcd-endpoints",
        &endpoints,
        "--etcd-prefix",
        &prefix,
        "--topic-partitions",
        "events=4",
        "--lease-ttl",
        "1s",
        "--instance-id",
        "m1",
    ];
    let Command::Serve(args) = Cli::try_parse_from(flags).expect("flags").command else {
        unreachable!("serve was asked for")
    };
    let metrics = Arc::new(Metrics::new());
    let coordinator = coordinator_from_args(&args, metrics.clone()).await.expect("etcd backend starts");
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    AssignerServer::start(coordinator, metrics, any, any).await.expect("serve")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_after_join_handoff_crash_and_store_outage() {
    let mut etcd = EtcdServer::start().await;
    let server = start(&etcd).await;
    let client = KafkaAssignerClient::connect(server.grpc_url()).await.expect("connect");

    // a joins: all four partitions directly.
    let mut a = TestConsumer::register(client.clone(), "a", TOPIC).await.expect("Register(a)");
    a.expect_snapshot().await;
    a.wait_owned(4, PROMPT).await;

    // b joins: two warm handoffs from a.
    let mut b = TestConsumer::register(client.clone(), "b", TOPIC).await.expect("Register(b)");
    b.expect_snapshot().await;
    b.wait_warms(2, PROMPT).await;
    let mid = scrape(&server).await;
    assert_eq!(value(&mid, r#"kafka_assigner_handoffs_in_flight{topic="events",phase="warming"}"#), 2.0);
    assert_eq!(value(&mid, r#"kafka_assigner_handoffs_in_flight{topic="events",phase="releasing"}"#), 0.0);
    assert_eq!(value(&mid, r#"kafka_assigner_partitions_owned{topic="events",consumer="b"}"#), 0.0);
    assert_eq!(value(&mid, r#"kafka_assigner_consumers{topic="events",status="active"}"#), 2.0);
    for p in b.warms.keys().copied().collect::<Vec<_>>() {
        b.ready(p).await.unwrap_or_else(|s| panic!("PartitionReady({p}): {s:?}"));
    }
    a.wait_for(PROMPT, "a's two releases", |a| a.releases.len() == 2).await;
    a.release_all().await;
    b.wait_owned(2, PROMPT).await;

    // A refused call.
    let bad = PartitionReadyRequest {
        consumer_name: "a".into(),
        partition: Some(TopicPartition { topic: TOPIC.into(), partition: 99 }),
    };
    let refused = client.clone().partition_ready(bad).await.expect_err("partition 99 is out of range");
    assert_eq!(refused.code(), Code::InvalidArgument);

    // b crashes: after its TTL, a gets its two partitions directly.
    b.crash().await;
    a.wait_owned(4, EXPIRY).await;
    assert_eq!(a.deregister().await.expect("Deregister"), DeregisterAction::ShutdownNow);

    // The crashed stream's end is seen when the server notices the reset connection.
    wait_until(PROMPT, "b's stream counted as ended", || async {
        scrape(&server).await.get(r#"kafka_assigner_streams_ended_total{reason="client_gone"}"#) == Some(&1.0)
    })
    .await;
    let m = scrape(&server).await;
    let expected = [
        (r#"kafka_assigner_grpc_calls_total{method="Register",code="OK"}"#, 2.0),
        (r#"kafka_assigner_grpc_calls_total{method="PartitionReady",code="OK"}"#, 2.0),
        (r#"kafka_assigner_grpc_calls_total{method="PartitionReady",code="INVALID_ARGUMENT"}"#, 1.0),
        (r#"kafka_assigner_grpc_calls_total{method="PartitionReleased",code="OK"}"#, 2.0),
        (r#"kafka_assigner_grpc_calls_total{method="Deregister",code="OK"}"#, 1.0),
        ("kafka_assigner_handoffs_started_total", 2.0),
        ("kafka_assigner_handoffs_ready_total", 2.0),
        ("kafka_assigner_handoffs_released_total", 2.0),
        ("kafka_assigner_direct_assignments_total", 6.0),
        ("kafka_assigner_partitions_moved_total", 8.0),
        ("kafka_assigner_rebalances_total", 3.0),
        ("kafka_assigner_handoff_warm_duration_seconds_count", 2.0),
        ("kafka_assigner_handoff_duration_seconds_count", 2.0),
        ("kafka_assigner_handoff_release_delivery_seconds_count", 2.0),
        (r#"kafka_assigner_partitions_owned{topic="events",consumer="a"}"#, 4.0),
        (r#"kafka_assigner_topic_partitions_owned{topic="events"}"#, 4.0),
        (r#"kafka_assigner_partitions_unowned{topic="events"}"#, 0.0),
        (r#"kafka_assigner_consumers{topic="events",status="active"}"#, 1.0),
        (r#"kafka_assigner_handoffs_in_flight{topic="events",phase="warming"}"#, 0.0),
        (r#"kafka_assigner_handoffs_in_flight{topic="events",phase="releasing"}"#, 0.0),
        (r#"kafka_assigner_streams_ended_total{reason="client_gone"}"#, 1.0),
        (r#"kafka_assigner_drain_decisions_total{decision="shutdown_now",reason="policy"}"#, 1.0),
        ("kafka_assigner_is_leader", 1.0),
        ("kafka_assigner_streams", 1.0),
        ("kafka_assigner_watch_resyncs_total", 0.0),
    ];
    let wrong: Vec<String> = expected
        .iter()
        .filter(|(series, want)| m.get(*series) != Some(want))
        .map(|(series, want)| format!("{series}: want {want}, got {:?}", m.get(*series)))
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}\nall samples: {m:#?}");
    // b's series left with b (bounded cardinality).
    assert!(!m.keys().any(|k| k.contains(r#"consumer="b""#)), "{m:#?}");
    // Warms and handoffs took some time; the sums are positive and below the run's length.
    for sum in
        ["kafka_assigner_handoff_warm_duration_seconds_sum", "kafka_assigner_handoff_duration_seconds_sum"]
    {
        let s = value(&m, sum);
        assert!(s > 0.0 && s < 60.0, "{sum} = {s}");
    }
    for op in ["grant_session", "keep_alive", "get_prefix", "watch_prefix", "txn", "get"] {
        let count =
            value(&m, &format!(r#"kafka_assigner_store_request_duration_seconds_count{{op="{op}"}}"#));
        assert!(count >= 1.0, "{op}: {count}");
    }
    assert!(
        !m.keys().any(|k| k.starts_with("kafka_assigner_store_errors_total")),
        "no store errors yet: {m:#?}"
    );

    if etcd.is_shared() {
        return; // a shared ETCD_ENDPOINTS cluster cannot be stopped
    }
    // Store outage: requests fail (counted by operation and kind), the watch breaks, and
    // once etcd is back the state is re-read.
    etcd.stop();
    wait_until(Duration::from_secs(15), "store errors counted", || async {
        scrape(&server)
            .await
            .iter()
            .any(|(k, v)| k.starts_with("kafka_assigner_store_errors_total{") && *v > 0.0)
    })
    .await;
    etcd.restart().await;
    wait_until(Duration::from_secs(20), "a watch re-read after the outage", || async {
        scrape(&server).await.get("kafka_assigner_watch_resyncs_total").is_some_and(|v| *v >= 1.0)
    })
    .await;
    let m = scrape(&server).await;
    assert!(
        m.keys().any(|k| k.starts_with(r#"kafka_assigner_store_errors_total{op=""#)
            && k.contains(r#"kind="unavailable""#)),
        "{m:#?}"
    );
    server.stop().await;
}
