//! Tests of the enrolments (`enrolment.rs`): batching, topics stored once, refusals.

use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::oneshot;

use super::{Enrolment, Enrolments};
use crate::coordinator::CoordinatorError;
use crate::coordinator::shared::registrar::{Caller, CallerGuard};
use crate::coordinator::shared::test_backend::{TestBackend, registration};
use crate::store::{LeaseStore, SessionId};

const TTL: Duration = Duration::from_secs(3);

type Answer = oneshot::Receiver<Result<crate::coordinator::CommandStream, CoordinatorError>>;

/// A `Register` of `consumer` on `events` with registration id `id`, and its answer; its
/// caller waits while the guard is held.
fn enrolment(backend: &TestBackend, consumer: &str, id: i64) -> (Enrolment, Answer, CallerGuard) {
    enrolment_on(backend, "events", consumer, id)
}

/// [`enrolment`] on `topic`.
fn enrolment_on(
    backend: &TestBackend,
    topic: &str,
    consumer: &str,
    id: i64,
) -> (Enrolment, Answer, CallerGuard) {
    let (caller, guard) = Caller::waiting(Gauge::default());
    let (reply, answer) = oneshot::channel();
    let lease = backend.core.live_lease().expect("live");
    let key = (topic.to_string(), consumer.to_string(), SessionId(id));
    (Enrolment { key, lease, incarnation: 0, caller, reply }, answer, guard)
}

/// Runs the store calls `enrolments` asks for, one round after another, until it asks
/// for none; returns how many each round had.
async fn run_calls(enrolments: &mut Enrolments, backend: &std::sync::Arc<TestBackend>) -> Vec<usize> {
    let mut rounds = Vec::new();
    loop {
        let calls = enrolments.due(backend);
        if calls.is_empty() {
            return rounds;
        }
        rounds.push(calls.len());
        for call in calls {
            enrolments.done(call.await);
        }
    }
}

/// `Register`s of a topic whose record is not stored yet wait for it: it is stored once
/// for all of them, then their registrations share one transaction.
#[tokio::test(start_paused = true)]
async fn registers_of_a_topic_not_stored_yet_store_it_once_then_share_one_transaction() {
    let (backend, store) = TestBackend::start(TTL).await;
    let (a, a_answer, _a_waits) = enrolment_on(&backend, "fresh", "a", 7);
    let (b, b_answer, _b_waits) = enrolment_on(&backend, "fresh", "b", 8);
    let mut enrolments = Enrolments::default();
    {
        let cache = backend.core.mirror.read();
        enrolments.arrive(&*backend, &cache, a);
        enrolments.arrive(&*backend, &cache, b);
    }
    assert_eq!(run_calls(&mut enrolments, &backend).await, [1, 1], "the topic, then one batch");
    for answer in [a_answer, b_answer] {
        assert!(answer.await.expect("answered").is_ok());
    }
    let topic = store.get("/t/fresh/config").await.expect("read").expect("the topic is stored");
    let record: crate::coordinator::shared::records::TopicRecord =
        crate::coordinator::shared::records::decode(&topic.key, &topic.value).expect("a topic record");
    assert_eq!(record.partition_count, 2);
    let (a, b) = (registration("fresh", "a"), registration("fresh", "b"));
    let (a, b) = (store.get(&a).await.expect("read"), store.get(&b).await.expect("read"));
    let revisions = [a.map(|kv| kv.mod_revision), b.map(|kv| kv.mod_revision)];
    assert!(revisions[0].is_some() && revisions[0] == revisions[1], "one transaction: {revisions:?}");
}

/// `Register`s of a topic nobody knows are refused with the reason, and write nothing.
#[tokio::test(start_paused = true)]
async fn registers_of_an_unknown_topic_are_refused_and_write_nothing() {
    let (backend, store) = TestBackend::start(TTL).await;
    let (a, a_answer, _a_waits) = enrolment_on(&backend, "nope", "a", 7);
    let (b, b_answer, _b_waits) = enrolment_on(&backend, "nope", "b", 8);
    let mut enrolments = Enrolments::default();
    {
        let cache = backend.core.mirror.read();
        enrolments.arrive(&*backend, &cache, a);
        enrolments.arrive(&*backend, &cache, b);
    }
    assert_eq!(run_calls(&mut enrolments, &backend).await, [1], "the topic asked for once");
    for answer in [a_answer, b_answer] {
        let refused = answer.await.expect("answered");
        assert!(matches!(refused, Err(CoordinatorError::UnknownTopic(_))), "{:?}", refused.err());
    }
    assert!(store.get_prefix("/t/nope/").await.expect("read").kvs.is_empty(), "nothing written");
}

#[tokio::test(start_paused = true)]
async fn a_register_whose_caller_went_away_before_it_was_decided_writes_nothing() {
    let (backend, store) = TestBackend::start(TTL).await;
    let (gone, answer, guard) = enrolment(&backend, "a", 7);
    drop(guard);
    let mut enrolments = Enrolments::default();
    enrolments.arrive(&*backend, &backend.core.mirror.read(), gone);
    assert!(enrolments.due(&backend).is_empty(), "no store call");
    let refused = answer.await.expect("answered");
    assert!(matches!(refused, Err(CoordinatorError::Abandoned { .. })), "{:?}", refused.err());
    assert!(store.get(&registration("events", "a")).await.expect("read").is_none());
}

#[tokio::test(start_paused = true)]
async fn registers_that_arrive_together_share_one_transaction_then_their_streams_are_admitted() {
    let (backend, store) = TestBackend::start(TTL).await;
    let (a, a_answer, _a_waits) = enrolment(&backend, "a", 7);
    let (b, b_answer, _b_waits) = enrolment(&backend, "b", 8);
    let mut enrolments = Enrolments::default();
    {
        let cache = backend.core.mirror.read();
        enrolments.arrive(&*backend, &cache, a);
        enrolments.arrive(&*backend, &cache, b);
    }
    let mut calls = enrolments.due(&backend);
    assert_eq!(calls.len(), 1, "one batch");
    let done = calls.pop().expect("the batch").await;
    enrolments.done(done);
    assert!(enrolments.due(&backend).is_empty(), "written: nothing more to ask the store");
    for (answer, consumer) in [(a_answer, "a"), (b_answer, "b")] {
        assert!(answer.await.expect("answered").is_ok(), "{consumer} admitted");
        assert!(backend.core.streams.session_of("events", consumer).is_some(), "{consumer} held");
    }
    let (a, b) = (registration("events", "a"), registration("events", "b"));
    let (a, b) = (store.get(&a).await.expect("read"), store.get(&b).await.expect("read"));
    let revisions = [a.map(|kv| kv.mod_revision), b.map(|kv| kv.mod_revision)];
    assert!(revisions[0].is_some() && revisions[0] == revisions[1], "one transaction: {revisions:?}");
}
