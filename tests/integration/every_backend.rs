//! The scenarios every backend must pass, run on all four (`memory`, `etcd`, `fleet` on
//! both stores, `static`), each started the way the binary starts it: flags parsed by
//! [`Cli`], the coordinator built by [`coordinator_from_args`], served by
//! [`AssignerServer`]. Consumers `pod-0` and `pod-1` on a 4-partition topic:
//!
//! * the first message of every stream is the snapshot;
//! * two consumers end up with 2 partitions each, disjoint and covering the topic;
//! * a consumer that reconnects at once gets the same partitions back, and keeps them
//!   past its old session's TTL;
//! * a crashed consumer's partitions go to the other within the TTL plus slack (not on
//!   `static`, where nothing moves: its partitions wait for it);
//! * malformed and unknown names are refused with `INVALID_ARGUMENT` / `NOT_FOUND`.

use std::{collections::BTreeSet, time::Duration};

use kafka_assigner::proto::v1::{
    PartitionReadyRequest, RegisterRequest, kafka_assigner_client::KafkaAssignerClient,
};
use kafka_assigner::server::AssignerServer;
use tonic::Code;

use crate::support::{
    EtcdServer,
    assigner::{EXPIRY, PROMPT, TTL, TestConsumer},
};

const TOPIC: &str = "events";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Memory,
    Etcd,
    FleetMemory,
    FleetEtcd,
    Static,
}

/// One test per backend, named `$name`, running [`common_scenarios`] on `Kind::$kind`.
macro_rules! every_kind {
    ($($name:ident: $kind:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                common_scenarios(Kind::$kind).await;
            }
        )*
    };
}

every_kind!(
    memory: Memory,
    etcd: Etcd,
    fleet_memory: FleetMemory,
    fleet_etcd: FleetEtcd,
    static_backend: Static,
);

/// Starts the backend from command-line flags, as `kafka-assigner serve` does.
async fn start(kind: Kind, etcd: Option<&EtcdServer>) -> AssignerServer {
    let ttl = format!("{}s", TTL.as_secs());
    let mut flags = vec![
        "kafka-assigner".to_string(),
        "serve".into(),
        "--topic-partitions".into(),
        format!("{TOPIC}=4"),
        "--lease-ttl".into(),
        ttl,
        "--restart-grace".into(),
        "1s".into(),
        "--instance-id".into(),
        format!("{kind:?}"),
    ];
    let backend: &[&str] = match kind {
        Kind::Memory => &["--backend", "memory"],
        Kind::Etcd => &["--backend", "etcd"],
        Kind::FleetMemory => &["--backend", "fleet", "--store", "memory"],
        Kind::FleetEtcd => &["--backend", "fleet", "--store", "etcd"],
        Kind::Static => &["--backend", "static", "--static-members", "2"],
    };
    flags.extend(backend.iter().map(|s| s.to_string()));
    if let Some(etcd) = etcd {
        flags.extend(["--etcd-endpoints".into(), etcd.endpoints().join(",")]);
        flags.extend(["--etcd-prefix".into(), etcd.unique_prefix("every-backend")]);
    }
    crate::support::serve_flags::serve_from_flags(&flags, &format!("{kind:?}")).await
}

async fn register(server: &AssignerServer, name: &str) -> (TestConsumer, BTreeSet<u32>) {
    let client = KafkaAssignerClient::connect(server.grpc_url()).await.expect("connect");
    let mut consumer = TestConsumer::register(client, name, TOPIC)
        .await
        .unwrap_or_else(|status| panic!("Register({name}) refused: {status:?}"));
    let snapshot = consumer.expect_snapshot().await;
    (consumer, snapshot)
}

/// Drives the consumers (answering warms and releases, which only the handoff backends
/// send) until their views satisfy `done`.
async fn drive(
    consumers: &mut [&mut TestConsumer],
    deadline: Duration,
    what: &str,
    done: impl Fn(&[BTreeSet<u32>]) -> bool,
) {
    let give_up = tokio::time::Instant::now() + deadline;
    loop {
        for consumer in consumers.iter_mut() {
            consumer.answer_all().await;
        }
        let views: Vec<BTreeSet<u32>> = consumers.iter().map(|c| c.owned.clone()).collect();
        let quiet =
            consumers.iter().all(|c| c.warms.is_empty() && c.releases.is_empty() && c.ended.is_none());
        if quiet && done(&views) {
            return;
        }
        if tokio::time::Instant::now() >= give_up {
            panic!("timed out after {deadline:?} waiting until {what}: {consumers:#?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Two consumers, two partitions each, disjoint, covering the topic.
fn split(views: &[BTreeSet<u32>]) -> bool {
    views.len() == 2
        && views.iter().all(|v| v.len() == 2)
        && views[0].is_disjoint(&views[1])
        && views[0].union(&views[1]).count() == 4
}

async fn common_scenarios(kind: Kind) {
    let etcd = match kind {
        Kind::Etcd | Kind::FleetEtcd => Some(EtcdServer::start().await),
        _ => None,
    };
    let server = start(kind, etcd.as_ref()).await;
    let dynamic = kind != Kind::Static;

    // Snapshot first, then balance.
    let (mut a, _) = register(&server, "pod-0").await;
    if dynamic {
        drive(&mut [&mut a], PROMPT, "one consumer owns everything", |v| v[0].len() == 4).await;
    }
    let (mut b, _) = register(&server, "pod-1").await;
    drive(&mut [&mut a, &mut b], PROMPT, "two consumers split the topic", split).await;

    // Reconnect at once: the same partitions, kept past the old session's TTL.
    let had = a.owned.clone();
    a.crash().await;
    let (mut a, snapshot) = register(&server, "pod-0").await;
    assert_eq!(snapshot, had, "{kind:?}: a reconnected consumer resumes its partitions");
    tokio::time::sleep(TTL + Duration::from_millis(500)).await;
    drive(&mut [&mut a, &mut b], PROMPT, "the split holds after the TTL", split).await;
    assert_eq!(a.owned, had, "{kind:?}: nothing moved");

    // Crash recovery: the survivor takes everything (static: nothing moves).
    let b_had = b.owned.clone();
    b.crash().await;
    if dynamic {
        drive(&mut [&mut a], EXPIRY, "the survivor owns everything", |v| v[0].len() == 4).await;
    } else {
        a.assert_quiet(TTL).await;
        let (_, snapshot) = register(&server, "pod-1").await;
        assert_eq!(snapshot, b_had, "static: the partitions wait for their consumer");
    }

    // Bad input.
    let mut client = KafkaAssignerClient::connect(server.grpc_url()).await.expect("connect");
    let register =
        |name: &str, topic: &str| RegisterRequest { consumer_name: name.into(), topic: topic.into() };
    let status = client.register(register("", TOPIC)).await.expect_err("empty name");
    assert_eq!(status.code(), Code::InvalidArgument, "{kind:?}: {status:?}");
    let status = client.register(register("pod-0", "a/b")).await.expect_err("bad topic");
    assert_eq!(status.code(), Code::InvalidArgument, "{kind:?}: {status:?}");
    let status = client.register(register("pod-0", "nope")).await.expect_err("unknown topic");
    assert_eq!(status.code(), Code::NotFound, "{kind:?}: {status:?}");
    assert!(status.message().contains("'nope'"), "{kind:?}: {status:?}");
    let request = PartitionReadyRequest { consumer_name: "pod-0".into(), partition: None };
    let status = client.partition_ready(request).await.expect_err("no partition");
    assert_eq!(status.code(), Code::InvalidArgument, "{kind:?}: {status:?}");
    server.stop().await;
}
