//! The `static` backend over real gRPC: snapshots from the explicit assignment and from
//! round-robin, streams that stay open, reconnects and replaced registrations, refused
//! calls, shutdown; and the binary itself, started with the environment variables: a
//! malformed variable stops it at start with a message naming the variable and the bad
//! part, a good one serves.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead, BufReader},
    net::SocketAddr,
    process::{Command as Process, Stdio},
    sync::Arc,
    time::Duration,
};

use kafka_assigner::coordinator::{StaticConfig, StaticCoordinator};
use kafka_assigner::metrics::Metrics;
use kafka_assigner::proto::v1::{
    DeregisterAction, DeregisterRequest, PartitionReadyRequest, PartitionReleasedRequest, RegisterRequest,
    TopicPartition, kafka_assigner_client::KafkaAssignerClient,
};
use kafka_assigner::server::AssignerServer;
use tonic::{Code, transport::Channel};

use crate::support::assigner::{PROMPT, TestConsumer};

/// Starts a static server over `assignment` / `members` with events=12 and orders=2.
async fn serve(assignment: Option<&str>, members: Option<&str>) -> AssignerServer {
    let topics: BTreeMap<String, u32> = [("events".to_string(), 12), ("orders".to_string(), 2)].into();
    let config = StaticConfig::from_settings("static-test".into(), topics, assignment, members)
        .unwrap_or_else(|e| panic!("bad static config: {e}"));
    let metrics = Arc::new(Metrics::new());
    let coordinator = Arc::new(StaticCoordinator::new(config, metrics.clone()));
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    AssignerServer::start(coordinator, metrics, any, any).await.expect("static server starts")
}

async fn client(server: &AssignerServer) -> KafkaAssignerClient<Channel> {
    KafkaAssignerClient::connect(server.grpc_url()).await.expect("connect")
}

async fn consumer(server: &AssignerServer, name: &str, topic: &str) -> (TestConsumer, BTreeSet<u32>) {
    let mut consumer = TestConsumer::register(client(server).await, name, topic)
        .await
        .unwrap_or_else(|status| panic!("Register({name}, {topic}) refused: {status:?}"));
    let snapshot = consumer.expect_snapshot().await;
    (consumer, snapshot)
}

fn tp(topic: &str, partition: u32) -> Option<TopicPartition> {
    Some(TopicPartition { topic: topic.into(), partition })
}

const EXPLICIT: &str = "consumer-0=events:0-5,orders:0;consumer-1=events:6,7,8-11,orders:1";

/// Each consumer's snapshot is its configured partitions; the stream then stays open with
/// nothing more; the status view shows the static assignment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_assignment_snapshot_then_open_stream() {
    let server = serve(Some(EXPLICIT), None).await;
    let (mut c0, s0) = consumer(&server, "consumer-0", "events").await;
    let (mut c1, s1) = consumer(&server, "consumer-1", "events").await;
    let (mut o1, s2) = consumer(&server, "consumer-1", "orders").await;
    assert_eq!(s0, (0..=5).collect());
    assert_eq!(s1, (6..=11).collect());
    assert_eq!(s2, [1].into());
    c0.assert_quiet(Duration::from_millis(300)).await;
    c1.assert_quiet(Duration::ZERO).await;
    o1.assert_quiet(Duration::ZERO).await;
    assert!(c0.ended.is_none() && c1.ended.is_none(), "streams stay open");

    let status = server.coordinator.status().await;
    assert_eq!(status.backend, "static");
    let events = status.topics.iter().find(|t| t.topic == "events").expect("events in status");
    let expected: Vec<Option<String>> =
        (0..12).map(|p| Some(if p < 6 { "consumer-0" } else { "consumer-1" }.to_string())).collect();
    assert_eq!(events.owners, expected);
    let names: Vec<&str> = events.consumers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["consumer-0", "consumer-1"]);
    // A consumer that goes away drops out of the status view.
    c0.crash().await;
    crate::support::wait_until(PROMPT, "consumer-0 is gone from the status", || async {
        let status = server.coordinator.status().await;
        status.topics.iter().all(|t| t.consumers.iter().all(|c| c.name != "consumer-0"))
    })
    .await;
    server.stop().await;
}

/// Round-robin by the ordinal at the end of the name: three members split 12 partitions
/// 4/4/4, disjoint and complete; a name beyond the member count or without an ordinal is
/// `NOT_FOUND` naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_by_ordinal() {
    let server = serve(None, Some("3")).await;
    let mut all = BTreeSet::new();
    let mut consumers = Vec::new();
    for name in ["pod-0", "pod-1", "pod-2"] {
        let (c, snapshot) = consumer(&server, name, "events").await;
        assert_eq!(snapshot.len(), 4, "{name}: {snapshot:?}");
        let ordinal: u32 = name[4..].parse().unwrap();
        assert!(snapshot.iter().all(|p| p % 3 == ordinal), "{name}: {snapshot:?}");
        assert!(all.is_disjoint(&snapshot));
        all.extend(snapshot);
        consumers.push(c);
    }
    assert_eq!(all, (0..12).collect());
    let (_, orders) = consumer(&server, "pod-2", "orders").await;
    assert!(orders.is_empty(), "member 2 of 3 gets nothing of a 2-partition topic: {orders:?}");
    let mut client = client(&server).await;
    for name in ["pod-3", "consumer"] {
        let request = RegisterRequest { consumer_name: name.into(), topic: "events".into() };
        let status = client.register(request).await.expect_err(name);
        assert_eq!(status.code(), Code::NotFound, "{name}: {status:?}");
        assert!(status.message().contains(&format!("'{name}'")), "{status:?}");
        assert!(status.message().contains("KAFKA_ASSIGNER_STATIC_MEMBERS"), "{status:?}");
    }
    let status = server.coordinator.status().await;
    let events = status.topics.iter().find(|t| t.topic == "events").unwrap();
    assert!(events.owners.iter().all(Option::is_some), "{events:?}");
    server.stop().await;
}

/// A consumer that crashes and registers again gets the same snapshot; a second live
/// registration replaces the first (`ABORTED`); shutdown ends streams with `UNAVAILABLE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_replace_and_shutdown() {
    let server = serve(Some(EXPLICIT), None).await;
    let (mut first, snapshot) = consumer(&server, "consumer-1", "events").await;
    first.crash().await;
    let (mut second, again) = consumer(&server, "consumer-1", "events").await;
    assert_eq!(snapshot, again);
    let (mut third, again) = consumer(&server, "consumer-1", "events").await;
    assert_eq!(snapshot, again);
    let end = second.expect_end(PROMPT).await.expect_err("replaced");
    assert_eq!(end.code(), Code::Aborted, "{end:?}");
    assert!(end.message().contains("replaced"), "{end:?}");
    third.assert_quiet(Duration::from_millis(100)).await;
    server.stop().await;
    let end = third.expect_end(PROMPT).await.expect_err("shutdown");
    assert_eq!(end.code(), Code::Unavailable, "{end:?}");
}

/// Refused calls: no handoffs (`FAILED_PRECONDITION`), bad names (`INVALID_ARGUMENT`),
/// unknown topic or uncovered consumer (`NOT_FOUND` naming it); `Deregister` is
/// `SHUTDOWN_NOW`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_calls_and_deregister() {
    let server = serve(Some(EXPLICIT), None).await;
    let (mut c0, _) = consumer(&server, "consumer-0", "events").await;
    let mut client = client(&server).await;
    let ready = client
        .partition_ready(PartitionReadyRequest {
            consumer_name: "consumer-0".into(),
            partition: tp("events", 1),
        })
        .await
        .unwrap_err();
    assert_eq!(ready.code(), Code::FailedPrecondition, "{ready:?}");
    assert!(ready.message().contains("static backend performs no handoffs"), "{ready:?}");
    let released = client
        .partition_released(PartitionReleasedRequest {
            consumer_name: "consumer-0".into(),
            partition: tp("events", 1),
        })
        .await
        .unwrap_err();
    assert_eq!(released.code(), Code::FailedPrecondition, "{released:?}");
    assert!(released.message().contains("static backend performs no handoffs"), "{released:?}");

    let register =
        |name: &str, topic: &str| RegisterRequest { consumer_name: name.into(), topic: topic.into() };
    for (name, topic, code, mention) in [
        ("", "events", Code::InvalidArgument, "consumer_name"),
        ("a/b", "events", Code::InvalidArgument, "a/b"),
        ("consumer-0", "", Code::InvalidArgument, "topic"),
        ("consumer-0", "nope", Code::NotFound, "'nope'"),
        ("consumer-9", "events", Code::NotFound, "'consumer-9'"),
    ] {
        let status = client.register(register(name, topic)).await.expect_err(name);
        assert_eq!(status.code(), code, "Register({name:?}, {topic:?}): {status:?}");
        assert!(status.message().contains(mention), "should mention {mention:?}: {status:?}");
    }
    let ready = client
        .partition_ready(PartitionReadyRequest { consumer_name: "".into(), partition: tp("events", 1) })
        .await
        .unwrap_err();
    assert_eq!(ready.code(), Code::InvalidArgument, "{ready:?}");

    let deregister = |name: &str| DeregisterRequest { consumer_name: name.into() };
    let action = client.deregister(deregister("consumer-0")).await.unwrap().into_inner();
    assert_eq!(action.action(), DeregisterAction::ShutdownNow);
    // Covered but not connected: nothing to drain either.
    let action = client.deregister(deregister("consumer-1")).await.unwrap().into_inner();
    assert_eq!(action.action(), DeregisterAction::ShutdownNow);
    let status = client.deregister(deregister("ghost")).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(status.message().contains("'ghost'"), "{status:?}");
    let status = client.deregister(deregister("")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    c0.assert_quiet(Duration::from_millis(100)).await;
    server.stop().await;
}

/// The binary with its environment cleared of `KAFKA_ASSIGNER_*` settings, plus `env`.
fn binary(args: &[&str], env: &[(&str, &str)]) -> Process {
    let mut process = Process::new(env!("CARGO_BIN_EXE_kafka-assigner"));
    for (key, _) in std::env::vars() {
        if key.starts_with("KAFKA_ASSIGNER_") {
            process.env_remove(key);
        }
    }
    process
        .args(["serve", "--backend", "static", "--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    process
}

/// Runs the binary and expects it to fail at start with a message mentioning everything
/// in `mentions`.
fn expect_start_failure(args: &[&str], env: &[(&str, &str)], mentions: &[&str]) {
    let mut child = binary(args, env).spawn().expect("spawn kafka-assigner");
    let give_up = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > give_up {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kafka-assigner {args:?} {env:?} did not stop at start");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let output = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!status.success(), "{env:?}: expected a failure, got {status}; stderr: {stderr}");
    for needle in mentions {
        assert!(stderr.contains(needle), "{env:?}: stderr should mention {needle:?}: {stderr}");
    }
}

/// Malformed variables stop the server at start, naming the variable and the bad part.
#[test]
fn malformed_environment_stops_the_server_at_start() {
    let topics = ["--topic-partitions", "events=12"];
    let var = "KAFKA_ASSIGNER_STATIC_ASSIGNMENT";
    expect_start_failure(&topics, &[(var, "a=0-5;b=5-11")], &[var, "b=5-11", "partition 5", "overlap"]);
    expect_start_failure(&topics, &[(var, "a=0-12")], &[var, "a=0-12", "partition 12", "12 partitions"]);
    expect_start_failure(&topics, &[(var, "a=zero")], &[var, "'zero'"]);
    expect_start_failure(&topics, &[(var, "a=3-1")], &[var, "'3-1'", "reversed"]);
    let members = "KAFKA_ASSIGNER_STATIC_MEMBERS";
    expect_start_failure(&topics, &[(members, "0")], &[members, "at least one"]);
    expect_start_failure(&topics, &[(members, "many")], &[members, "'many'"]);
    expect_start_failure(&topics, &[], &[var, members]);
    expect_start_failure(&[], &[(members, "2")], &["--topic-partitions"]);
}

/// A good environment: the binary serves the static assignment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_the_environment() {
    let env = [
        ("KAFKA_ASSIGNER_STATIC_ASSIGNMENT", "pod-0=0-5;pod-1=6-11"),
        ("KAFKA_ASSIGNER_TOPIC_PARTITIONS", "events=12"),
    ];
    let mut child = KillOnDrop(binary(&[], &env).spawn().expect("spawn kafka-assigner"));
    let stdout = child.0.stdout.take().expect("stdout");
    // The log line `serving grpc_addr=127.0.0.1:PORT ...` tells the port.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("serving")
                && let Some(addr) = line.split("grpc_addr=").nth(1).and_then(|r| r.split_whitespace().next())
            {
                let _ = tx.send(addr.to_string());
            }
        }
    });
    let Ok(addr) = rx.recv_timeout(Duration::from_secs(20)) else {
        let mut stderr = String::new();
        let _ = child.0.kill();
        if let Some(mut pipe) = child.0.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        panic!("the binary did not serve: {stderr}");
    };
    let client = KafkaAssignerClient::connect(format!("http://{addr}")).await.expect("connect");
    let mut pod = TestConsumer::register(client, "pod-1", "events").await.expect("register");
    assert_eq!(pod.expect_snapshot().await, (6..=11).collect());
    let status = TestConsumer::register(
        KafkaAssignerClient::connect(format!("http://{addr}")).await.unwrap(),
        "pod-2",
        "events",
    )
    .await
    .expect_err("pod-2 is not in the assignment");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
}

/// Kills (and reaps) the child process when dropped, even when the test panics.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
