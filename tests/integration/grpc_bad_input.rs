//! Refused calls (DESIGN.md §5.7): each gets its exact gRPC status code and a message
//! naming what was wrong, and changes nothing — neither the store (records and revision)
//! nor any instance's status view — nor tells any consumer anything. On both backends.

use std::fmt::Debug;

use kafka_assigner::proto::v1::{
    DeregisterRequest, PartitionReadyRequest, PartitionReleasedRequest, RegisterRequest, TopicPartition,
    kafka_assigner_client::KafkaAssignerClient,
};
use tonic::{Code, Status, transport::Channel};

use crate::support::assigner::{
    Backend, PARTITIONS, PROMPT, SMALL, TOPIC, TestCluster, consumer_names, on_both_backends, topic,
};

on_both_backends!(register_refusals, ready_released_and_deregister_refusals);

/// Asserts `result` is refused with `code` and a message containing every one of
/// `mentions`, and that nothing changed.
async fn refused<T: Debug>(
    cluster: &TestCluster,
    before: &(kafka_assigner::store::PrefixSnapshot, Vec<String>),
    what: &str,
    result: Result<T, Status>,
    code: Code,
    mentions: &[&str],
) {
    let status = match result {
        Ok(value) => panic!("{what}: expected {code:?}, but it was accepted: {value:?}"),
        Err(status) => status,
    };
    assert_eq!(status.code(), code, "{what}: {status:?}");
    for needle in mentions {
        assert!(
            status.message().contains(needle),
            "{what}: the message should mention {needle:?}: {status:?}"
        );
    }
    assert_eq!(&cluster.fingerprint().await, before, "{what}: a refused call must change nothing");
}

fn tp(topic: &str, partition: u32) -> Option<TopicPartition> {
    Some(TopicPartition { topic: topic.into(), partition })
}

async fn ready(
    client: &mut KafkaAssignerClient<Channel>,
    consumer: &str,
    partition: Option<TopicPartition>,
) -> Result<(), Status> {
    client
        .partition_ready(PartitionReadyRequest { consumer_name: consumer.into(), partition })
        .await
        .map(|_| ())
}

async fn released(
    client: &mut KafkaAssignerClient<Channel>,
    consumer: &str,
    partition: Option<TopicPartition>,
) -> Result<(), Status> {
    client
        .partition_released(PartitionReleasedRequest { consumer_name: consumer.into(), partition })
        .await
        .map(|_| ())
}

async fn register(cluster: &TestCluster, consumer: &str, topic: &str) -> Result<(), Status> {
    let mut client = cluster.client(0).await;
    let request = RegisterRequest { consumer_name: consumer.into(), topic: topic.into() };
    // A refusal must come as the call's status, not as a stream that starts and then fails.
    client.register(request).await.map(|_| ())
}

/// Register with an empty name, an empty or invalid topic, or a topic with no known
/// partition count.
async fn register_refusals(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let mut a = cluster.consumer("a").await;
    a.expect_snapshot().await;
    a.wait_owned(PARTITIONS as usize, PROMPT).await;
    cluster.wait_status(PROMPT, "a registered", |s| consumer_names(topic(s, TOPIC)) == ["a"]).await;
    let before = cluster.fingerprint().await;
    let a_seen = a.seen();

    let cases: [(&str, &str, &str, Code, &[&str]); 6] = [
        ("empty consumer_name", "", TOPIC, Code::InvalidArgument, &["consumer_name"]),
        ("consumer_name with '/'", "x/y", TOPIC, Code::InvalidArgument, &["x/y"]),
        ("empty topic", "c", "", Code::InvalidArgument, &["topic"]),
        ("invalid topic a/b", "c", "a/b", Code::InvalidArgument, &["a/b"]),
        ("invalid topic with a space", "c", "two words", Code::InvalidArgument, &["two words"]),
        ("topic with no known partition count", "c", "unknown-topic", Code::NotFound, &["unknown-topic"]),
    ];
    for (what, consumer, topic_name, code, mentions) in cases {
        let result = register(&cluster, consumer, topic_name).await;
        refused(&cluster, &before, &format!("Register: {what}"), result, code, mentions).await;
    }
    a.poll_now();
    assert_eq!(a.seen(), a_seen, "a was told nothing: {a:?}");
    assert!(a.ended.is_none());
}

/// PartitionReady / PartitionReleased / Deregister refusals, against a topic with a
/// warming handoff a → b and a third consumer c that takes part in nothing.
async fn ready_released_and_deregister_refusals(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let mut a = cluster.consumer_on(0, "a", SMALL).await;
    a.expect_snapshot().await;
    a.wait_owned(2, PROMPT).await;
    let mut b = cluster.consumer_on(0, "b", SMALL).await;
    b.expect_snapshot().await;
    b.wait_warms(1, PROMPT).await;
    let w = *b.warms.keys().next().expect("a warm");
    let other = 1 - w;
    let mut c = cluster.consumer_on(0, "c", SMALL).await;
    assert!(c.expect_snapshot().await.is_empty());
    cluster
        .wait_status(PROMPT, "a, b, c registered, one handoff warming", |s| {
            let t = topic(s, SMALL);
            consumer_names(t) == ["a", "b", "c"]
                && t.handoffs.len() == 1
                && t.handoffs[0].phase == kafka_assigner::handoff::Phase::Warming
        })
        .await;
    let before = cluster.fingerprint().await;
    let seen = [a.seen(), b.seen(), c.seen()];
    let mut client = cluster.client(0).await;
    let ws = w.to_string();

    refused(
        &cluster,
        &before,
        "Ready without partition",
        ready(&mut client, "b", None).await,
        Code::InvalidArgument,
        &["partition"],
    )
    .await;
    refused(
        &cluster,
        &before,
        "Ready with empty consumer_name",
        ready(&mut client, "", tp(SMALL, w)).await,
        Code::InvalidArgument,
        &["consumer_name"],
    )
    .await;
    refused(
        &cluster,
        &before,
        "Ready with empty topic",
        ready(&mut client, "b", tp("", w)).await,
        Code::InvalidArgument,
        &["topic"],
    )
    .await;
    refused(
        &cluster,
        &before,
        "Ready from the current owner",
        ready(&mut client, "a", tp(SMALL, w)).await,
        Code::FailedPrecondition,
        &["'a'", &ws],
    )
    .await;
    refused(
        &cluster,
        &before,
        "Ready from a third consumer",
        ready(&mut client, "c", tp(SMALL, w)).await,
        Code::FailedPrecondition,
        &["'c'", &ws],
    )
    .await;
    refused(
        &cluster,
        &before,
        "Ready for a partition with no handoff",
        ready(&mut client, "b", tp(SMALL, other)).await,
        Code::FailedPrecondition,
        &["'b'", &other.to_string()],
    )
    .await;
    refused(
        &cluster,
        &before,
        "Ready from an unknown consumer",
        ready(&mut client, "zed", tp(SMALL, w)).await,
        Code::NotFound,
        &["zed"],
    )
    .await;
    refused(
        &cluster,
        &before,
        "Ready for a partition out of range",
        ready(&mut client, "b", tp(SMALL, 7)).await,
        Code::InvalidArgument,
        &["7"],
    )
    .await;
    refused(
        &cluster,
        &before,
        "Ready for an unknown topic",
        ready(&mut client, "b", tp("nope", 0)).await,
        Code::NotFound,
        &["nope"],
    )
    .await;

    refused(
        &cluster,
        &before,
        "Released without partition",
        released(&mut client, "a", None).await,
        Code::InvalidArgument,
        &["partition"],
    )
    .await;
    refused(
        &cluster,
        &before,
        "Released from the owner of a warming handoff",
        released(&mut client, "a", tp(SMALL, w)).await,
        Code::FailedPrecondition,
        &["'a'", &ws],
    )
    .await;
    refused(
        &cluster,
        &before,
        "Released from the warming target",
        released(&mut client, "b", tp(SMALL, w)).await,
        Code::FailedPrecondition,
        &["'b'", &ws],
    )
    .await;
    refused(
        &cluster,
        &before,
        "Released from a third consumer",
        released(&mut client, "c", tp(SMALL, other)).await,
        Code::FailedPrecondition,
        &["'c'", &other.to_string()],
    )
    .await;
    refused(
        &cluster,
        &before,
        "Released from an unknown consumer",
        released(&mut client, "zed", tp(SMALL, w)).await,
        Code::NotFound,
        &["zed"],
    )
    .await;
    refused(
        &cluster,
        &before,
        "Released for a partition out of range",
        released(&mut client, "a", tp(SMALL, 9)).await,
        Code::InvalidArgument,
        &["9"],
    )
    .await;

    let deregister = |name: &str| {
        let mut client = client.clone();
        let request = DeregisterRequest { consumer_name: name.into() };
        async move { client.deregister(request).await.map(|r| r.into_inner()) }
    };
    refused(
        &cluster,
        &before,
        "Deregister of an unknown name",
        deregister("zed").await,
        Code::NotFound,
        &["zed"],
    )
    .await;
    refused(
        &cluster,
        &before,
        "Deregister with an empty name",
        deregister("").await,
        Code::InvalidArgument,
        &["consumer_name"],
    )
    .await;

    for (consumer, seen) in [&mut a, &mut b, &mut c].into_iter().zip(seen) {
        consumer.poll_now();
        assert_eq!(consumer.seen(), seen, "{} was told nothing: {consumer:?}", consumer.name);
    }

    // The refusals broke nothing: the handoff completes, and only then is a released
    // PartitionReleased from the new owner refused.
    b.ready(w).await.unwrap_or_else(|s| panic!("PartitionReady({w}) from the target: {s:?}"));
    a.wait_for(PROMPT, "a is told to release", |c| c.releases.contains_key(&w)).await;
    let before = cluster.fingerprint().await;
    refused(
        &cluster,
        &before,
        "Released from the new owner",
        released(&mut client, "b", tp(SMALL, w)).await,
        Code::FailedPrecondition,
        &["'b'", &ws],
    )
    .await;
    a.released(w).await.unwrap_or_else(|s| panic!("PartitionReleased({w}) from the old owner: {s:?}"));
    let after = cluster.fingerprint().await;
    assert_ne!(after.0.revision, before.0.revision, "an accepted call writes");
}
