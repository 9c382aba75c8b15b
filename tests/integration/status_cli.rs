//! `kafka-assigner status` (the real binary) against a running assigner: the table and
//! the JSON show the consumers with their partition ranges, a handoff in flight, a
//! crashed consumer's held partitions and the leader (unowned rows: unit-tested); an unreachable admin port is a clear error and exit 1.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use clap::Parser;
use kafka_assigner::config::{Cli, Command};
use kafka_assigner::metrics::Metrics;
use kafka_assigner::proto::v1::kafka_assigner_client::KafkaAssignerClient;
use kafka_assigner::{backend::coordinator_from_args, server::AssignerServer};

use crate::support::{
    assigner::{EXPIRY, PROMPT, TestConsumer},
    wait_until,
};

async fn start() -> AssignerServer {
    let flags = [
        "kafka-assigner",
        "serve",
        "--backend",
        "memory",
        "--topic-partitions",
        "events=4,orders=2",
        "--lease-ttl",
        "1s",
        "--instance-id",
        "s1",
    ];
    let Command::Serve(args) = Cli::try_parse_from(flags).expect("flags").command else {
        unreachable!("serve was asked for")
    };
    let metrics = Arc::new(Metrics::new());
    let coordinator = coordinator_from_args(&args, metrics.clone()).await.expect("memory backend starts");
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    AssignerServer::start(coordinator, metrics, any, any).await.expect("serve")
}

/// Runs the binary: (exit code, stdout, stderr).
async fn status_cli(args: &[&str]) -> (i32, String, String) {
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_kafka-assigner"))
            .arg("status")
            .args(args)
            .env_remove("KAFKA_ASSIGNER_ADMIN_ADDR")
            .output(),
    )
    .await
    .expect("kafka-assigner status finished")
    .expect("kafka-assigner status ran");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

/// The table's lines with runs of spaces collapsed.
fn lines(table: &str) -> Vec<String> {
    table.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_table_and_json_against_a_running_server() {
    let server = start().await;
    let client = KafkaAssignerClient::connect(server.grpc_url()).await.expect("connect");
    // events: a owns everything, then b joins and two warms stay unanswered (in flight).
    let mut a = TestConsumer::register(client.clone(), "a", "events").await.expect("Register(a)");
    a.expect_snapshot().await;
    a.wait_owned(4, PROMPT).await;
    let mut b = TestConsumer::register(client.clone(), "b", "events").await.expect("Register(b)");
    b.expect_snapshot().await;
    b.wait_warms(2, PROMPT).await;
    // orders: its only consumer crashes; with nobody to take them, its partitions stay
    // with it (shown as "not registered").
    let mut c = TestConsumer::register(client.clone(), "c", "orders").await.expect("Register(c)");
    c.expect_snapshot().await;
    c.wait_owned(2, PROMPT).await;
    c.crash().await;
    wait_until(EXPIRY, "orders' consumer gone", || async {
        let s = server.coordinator.status().await;
        s.topics.iter().any(|t| t.topic == "orders" && t.consumers.is_empty())
    })
    .await;

    let addr = server.admin_addr.to_string();
    let (code, table, stderr) = status_cli(&["--admin-addr", &addr]).await;
    assert_eq!(code, 0, "stdout: {table}\nstderr: {stderr}");
    let got = lines(&table);
    let a_parts = a.owned.iter().map(u32::to_string).collect::<Vec<_>>();
    let warming: Vec<u32> = b.warms.keys().copied().collect();
    let a_ranges = kafka_assigner::cli::status::ranges(&a.owned.iter().copied().collect::<Vec<_>>());
    let mut want = vec![
        "instance s1 (memory backend, ready); leader: s1".to_string(),
        "TOPIC CONSUMER INSTANCE STATUS OWNED PARTITIONS".to_string(),
        format!("events a s1 active 4 {a_ranges}"),
        "events b s1 active 0 -".to_string(),
        "HANDOFFS IN FLIGHT".to_string(),
        "TOPIC PARTITION FROM TO PHASE AGE".to_string(),
        "orders c - not registered 2 0-1".to_string(),
        "UNOWNED PARTITIONS: none".to_string(),
    ];
    assert_eq!(a_parts.len(), 4);
    for p in &warming {
        want.push(format!("events {p} a b warming"));
    }
    for line in &want {
        assert!(
            got.iter()
                .any(|g| g == line || (line.ends_with("warming") && g.starts_with(&format!("{line} ")))),
            "missing '{line}' in\n{table}"
        );
    }

    let (code, json, stderr) = status_cli(&["--admin-addr", &format!("http://{addr}/"), "--json"]).await;
    assert_eq!(code, 0, "stderr: {stderr}");
    let doc: serde_json::Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("not JSON ({e}): {json}"));
    assert_eq!(doc["instance"], "s1");
    assert_eq!(doc["leader"], "s1");
    let events =
        doc["topics"].as_array().and_then(|t| t.iter().find(|t| t["topic"] == "events")).expect("events");
    let handoffs: Vec<u64> = events["handoffs"]
        .as_array()
        .expect("handoffs")
        .iter()
        .filter_map(|h| h["partition"].as_u64())
        .collect();
    assert_eq!(handoffs, warming.iter().map(|p| u64::from(*p)).collect::<Vec<_>>());
    assert!(
        events["handoffs"]
            .as_array()
            .expect("handoffs")
            .iter()
            .all(|h| h["phase"] == "Warming" && h["from"] == "a" && h["to"] == "b")
    );
    assert_eq!(events["owners"].as_array().expect("owners").iter().filter(|o| *o == "a").count(), 4);
    // The server's document as it is, fields the table does not use included.
    let a_json = events["consumers"].as_array().and_then(|c| c.iter().find(|c| c["name"] == "a")).expect("a");
    assert_eq!(a_json["partitions"], 4);
    let orders =
        doc["topics"].as_array().and_then(|t| t.iter().find(|t| t["topic"] == "orders")).expect("orders");
    assert_eq!(orders["owners"], serde_json::json!(["c", "c"]));
    assert_eq!(orders["consumers"], serde_json::json!([]));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_exits_non_zero_when_the_admin_port_is_unreachable() {
    // A port that was free a moment ago and has no listener now.
    let port =
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
    let addr = format!("127.0.0.1:{port}");
    let (code, stdout, stderr) = status_cli(&["--admin-addr", &addr]).await;
    assert_eq!(code, 1, "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    let want =
        format!("kafka-assigner status: cannot reach the assigner's admin server at http://{addr}/status");
    assert!(stderr.starts_with(&want), "{stderr}");
    let (code, _, stderr) = status_cli(&["--admin-addr", "https://x:1"]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("--admin-addr 'https://x:1' is not host:port"), "{stderr}");
}
