//! Refused calls (docs/design.md §5.7): each gets its exact gRPC status code and a message
//! naming what was wrong, and changes nothing — neither the store (records and revision)
//! nor any instance's status view — nor tells any consumer anything. On both backends.
//!
//! The calls are one table ([`cases`]): the request, the code, and the words the message
//! must mention. They run against a topic with a warming handoff a → b and a third
//! consumer c that takes part in nothing.

use kafka_assigner::proto::v1::{
    DeregisterRequest, PartitionReadyRequest, PartitionReleasedRequest, RegisterRequest, TopicPartition,
    kafka_assigner_client::KafkaAssignerClient,
};
use tonic::{Code, Status, transport::Channel};

use crate::support::assigner::{
    Backend, PROMPT, SMALL, TestCluster, consumer_names, on_both_backends, topic,
};

on_both_backends!(refused_calls_change_nothing);

/// One call the server must refuse.
enum Request {
    Register(RegisterRequest),
    Ready(PartitionReadyRequest),
    Released(PartitionReleasedRequest),
    Deregister(DeregisterRequest),
}

/// A row of the table: what the call is, the call, its code, and what its message names.
struct Case {
    what: &'static str,
    request: Request,
    code: Code,
    mentions: Vec<String>,
}

fn case(what: &'static str, request: Request, code: Code, mentions: &[&str]) -> Case {
    Case { what, request, code, mentions: mentions.iter().map(|m| m.to_string()).collect() }
}

fn register(consumer: &str, topic: &str) -> Request {
    Request::Register(RegisterRequest { consumer_name: consumer.into(), topic: topic.into() })
}

fn ready(consumer: &str, partition: Option<TopicPartition>) -> Request {
    Request::Ready(PartitionReadyRequest { consumer_name: consumer.into(), partition })
}

fn released(consumer: &str, partition: Option<TopicPartition>) -> Request {
    Request::Released(PartitionReleasedRequest { consumer_name: consumer.into(), partition })
}

fn deregister(consumer: &str) -> Request {
    Request::Deregister(DeregisterRequest { consumer_name: consumer.into() })
}

fn tp(topic: &str, partition: u32) -> Option<TopicPartition> {
    Some(TopicPartition { topic: topic.into(), partition })
}

/// Every refusal, for a handoff of partition `w` a → b (Warming) on [`SMALL`], whose other
/// partition `other` a owns with no handoff.
fn cases(w: u32, other: u32) -> Vec<Case> {
    use Code::{FailedPrecondition, InvalidArgument, NotFound};
    let (ws, os) = (w.to_string(), other.to_string());
    let at = |partition| tp(SMALL, partition);
    vec![
        case("Register: empty consumer_name", register("", SMALL), InvalidArgument, &["consumer_name"]),
        case("Register: consumer_name with '/'", register("x/y", SMALL), InvalidArgument, &["x/y"]),
        case("Register: empty topic", register("d", ""), InvalidArgument, &["topic"]),
        case("Register: invalid topic a/b", register("d", "a/b"), InvalidArgument, &["a/b"]),
        case("Register: topic with a space", register("d", "two words"), InvalidArgument, &["two words"]),
        case("Register: no partition count", register("d", "unknown-topic"), NotFound, &["unknown-topic"]),
        case("Ready without partition", ready("b", None), InvalidArgument, &["partition"]),
        case("Ready with empty consumer_name", ready("", at(w)), InvalidArgument, &["consumer_name"]),
        case("Ready with empty topic", ready("b", tp("", w)), InvalidArgument, &["topic"]),
        case("Ready from the current owner", ready("a", at(w)), FailedPrecondition, &["'a'", &ws]),
        case("Ready from a third consumer", ready("c", at(w)), FailedPrecondition, &["'c'", &ws]),
        case("Ready with no handoff", ready("b", at(other)), FailedPrecondition, &["'b'", &os]),
        case("Ready from an unknown consumer", ready("zed", at(w)), NotFound, &["zed"]),
        case("Ready for a partition out of range", ready("b", at(7)), InvalidArgument, &["7"]),
        case("Ready for an unknown topic", ready("b", tp("nope", 0)), NotFound, &["nope"]),
        case("Released without partition", released("a", None), InvalidArgument, &["partition"]),
        case("Released from the warming owner", released("a", at(w)), FailedPrecondition, &["'a'", &ws]),
        case("Released from the warming target", released("b", at(w)), FailedPrecondition, &["'b'", &ws]),
        case("Released from a third consumer", released("c", at(other)), FailedPrecondition, &["'c'", &os]),
        case("Released from an unknown consumer", released("zed", at(w)), NotFound, &["zed"]),
        case("Released for a partition out of range", released("a", at(9)), InvalidArgument, &["9"]),
        case("Deregister of an unknown name", deregister("zed"), NotFound, &["zed"]),
        case("Deregister with an empty name", deregister(""), InvalidArgument, &["consumer_name"]),
    ]
}

/// Sends `request`; only the status matters.
async fn send(client: &mut KafkaAssignerClient<Channel>, request: Request) -> Result<(), Status> {
    match request {
        // A refusal must come as the call's status, not as a stream that starts and then fails.
        Request::Register(r) => client.register(r).await.map(|_| ()),
        Request::Ready(r) => client.partition_ready(r).await.map(|_| ()),
        Request::Released(r) => client.partition_released(r).await.map(|_| ()),
        Request::Deregister(r) => client.deregister(r).await.map(|_| ()),
    }
}

/// Sends the case's call and asserts it is refused with its code and a message naming
/// every one of its words, and that the cluster's fingerprint is still `before`.
async fn refused(
    cluster: &TestCluster,
    client: &mut KafkaAssignerClient<Channel>,
    before: &(kafka_assigner::store::PrefixSnapshot, Vec<String>),
    case: Case,
) {
    let Case { what, request, code, mentions } = case;
    let status = match send(client, request).await {
        Ok(()) => panic!("{what}: expected {code:?}, but it was accepted"),
        Err(status) => status,
    };
    assert_eq!(status.code(), code, "{what}: {status:?}");
    for needle in &mentions {
        assert!(
            status.message().contains(needle.as_str()),
            "{what}: the message should mention {needle:?}: {status:?}"
        );
    }
    assert_eq!(&cluster.fingerprint().await, before, "{what}: a refused call must change nothing");
}

/// Every case of the table against a warming handoff a → b with a bystander c; then,
/// after the handoff completes, the new owner's `PartitionReleased` is refused too.
async fn refused_calls_change_nothing(backend: Backend) {
    let cluster = TestCluster::start(backend, 1, |_| {}).await;
    let (mut a, mut b) = cluster.warming_pair(SMALL, (0, 0), 1).await;
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

    for case in cases(w, other) {
        refused(&cluster, &mut client, &before, case).await;
    }
    for (consumer, seen) in [&mut a, &mut b, &mut c].into_iter().zip(seen) {
        consumer.poll_now();
        assert_eq!(consumer.seen(), seen, "{} was told nothing: {consumer:?}", consumer.name);
        assert!(consumer.ended.is_none(), "{consumer:?}");
    }

    // The refusals broke nothing: the handoff completes, and only then is a
    // PartitionReleased from the new owner refused.
    b.ready(w).await.unwrap_or_else(|s| panic!("PartitionReady({w}) from the target: {s:?}"));
    a.wait_for(PROMPT, "a is told to release", |c| c.releases.contains_key(&w)).await;
    let before = cluster.fingerprint().await;
    let new_owner = case(
        "Released from the new owner",
        released("b", tp(SMALL, w)),
        Code::FailedPrecondition,
        &["'b'", &w.to_string()],
    );
    refused(&cluster, &mut client, &before, new_owner).await;
    a.released(w).await.unwrap_or_else(|s| panic!("PartitionReleased({w}) from the old owner: {s:?}"));
    let after = cluster.fingerprint().await;
    assert_ne!(after.0.revision, before.0.revision, "an accepted call writes");
}
