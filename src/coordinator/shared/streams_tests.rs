//! Tests of the stream registry (`streams.rs`).

use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc::error::TryRecvError, oneshot};

use super::super::outgoing::STREAM_BUFFER;
use super::{EndReason, LocalStream, Streams};
use crate::coordinator::CoordinatorError;
use crate::coordinator::causes::Fence;
use crate::coordinator::shared::mirror::Changes;
use crate::coordinator::shared::outgoing::update;
use crate::coordinator::shared::outgoing::{CommandReceiver, command_channel};
use crate::coordinator::shared::relay::{RelayStep, StreamSeen, Tell};
use crate::coordinator::shared::transport::unbelled_stream as command_stream;
use crate::metrics::Metrics;
use crate::proto::v1::AssignmentCommand;
use crate::store::SessionId;

/// A stream's channel, read without the gRPC layer.
struct Rx(CommandReceiver);

impl Rx {
    fn try_recv(&mut self) -> Result<Result<AssignmentCommand, CoordinatorError>, TryRecvError> {
        self.0.try_recv().map(|outgoing| outgoing.item)
    }
}

fn stream(session: i64, registered_at: i64) -> (LocalStream<()>, Rx, oneshot::Receiver<EndReason>) {
    let (tx, rx) = command_channel();
    let (stream, end) = LocalStream::new(SessionId(session), registered_at, tx);
    (stream, Rx(rx), end)
}

fn registry() -> (Streams<LocalStream<()>>, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    (Streams::new(metrics.clone()), metrics)
}

fn error_item(rx: &mut Rx) -> Option<CoordinatorError> {
    rx.try_recv().ok().and_then(Result::err)
}

#[test]
fn the_later_registration_stays_and_the_other_ends_aborted() {
    let (streams, metrics) = registry();
    let (old, mut old_rx, mut old_end) = stream(1, 10);
    let (new, mut new_rx, _new_end) = stream(2, 11);
    streams.insert("t", "a", old);
    streams.insert("t", "a", new);
    assert!(matches!(error_item(&mut old_rx), Some(CoordinatorError::Replaced { .. })));
    assert_eq!(old_end.try_recv(), Ok(EndReason::Replaced), "its session is revoked");
    assert!(new_rx.try_recv().is_err(), "the newer stream hears nothing");
    assert!(streams.contains(&("t".into(), "a".into(), SessionId(2))));
    // A registration that arrives late but was written earlier loses.
    let (stale, mut stale_rx, _stale_end) = stream(3, 5);
    streams.insert("t", "a", stale);
    assert!(matches!(error_item(&mut stale_rx), Some(CoordinatorError::Replaced { .. })));
    assert!(streams.contains(&("t".into(), "a".into(), SessionId(2))));
    assert_eq!(metrics.streams.get(), 1);
}

#[test]
fn ending_names_the_session_so_a_stale_cleanup_cannot_remove_the_newer_stream() {
    let (streams, _) = registry();
    let (s, _rx, _end) = stream(2, 11);
    streams.insert("t", "a", s);
    streams.end(&("t".into(), "a".into(), SessionId(1)), EndReason::Shutdown, None);
    assert!(streams.contains(&("t".into(), "a".into(), SessionId(2))), "session 1 is not the one held");
    streams.end(&("t".into(), "a".into(), SessionId(2)), EndReason::Shutdown, None);
    assert!(streams.names().is_empty());
}

/// A relay pass over `changes` whose model is `step`.
fn relay(
    streams: &Streams<LocalStream<()>>,
    changes: &Changes,
    mut step: impl FnMut(&str, &str, StreamSeen<'_, ()>) -> RelayStep<()>,
) {
    let mut pass = streams.pass(changes);
    while let Some(visit) = pass.next() {
        let decided = step(visit.topic(), visit.consumer(), visit.seen());
        visit.apply(decided);
    }
    pass.finish();
}

#[test]
fn relay_visits_the_given_topics_and_ends_what_it_says() {
    let (streams, _) = registry();
    let (a, _a_rx, mut a_end) = stream(1, 1);
    let (b, _b_rx, _b_end) = stream(2, 1);
    let (c, _c_rx, _c_end) = stream(3, 1);
    streams.insert("t", "a", a);
    streams.insert("t", "b", b);
    streams.insert("u", "c", c);
    let mut visited = Vec::new();
    let mut changes = Changes::default();
    changes.topic("t");
    relay(&streams, &changes, |topic, consumer, _| {
        visited.push(format!("{topic}/{consumer}"));
        if consumer == "a" { RelayStep::Farewell } else { RelayStep::Wait }
    });
    visited.sort();
    assert_eq!(visited, ["t/a", "t/b"]);
    assert_eq!(a_end.try_recv(), Ok(EndReason::Left));
    assert_eq!(streams.names(), [("t".to_string(), "b".to_string()), ("u".to_string(), "c".to_string())]);
}

#[tokio::test(start_paused = true)]
async fn in_one_pass_the_old_owner_hears_its_release_only_after_the_new_owner_took_its_assigned() {
    let (streams, _) = registry();
    let (old, old_rx, _old_end) = stream(1, 1);
    let (new, new_rx, _new_end) = stream(2, 1);
    streams.insert("t", "old", old);
    streams.insert("t", "new", new);
    let mut changes = Changes::default();
    changes.topic("t");
    // The old owner is visited first: the order of visits must not matter.
    relay(&streams, &changes, |_, consumer, _| {
        let (gains, losses) = if consumer == "old" {
            (vec![], vec![update("t", [], [7])])
        } else {
            (vec![update("t", [7], [])], vec![])
        };
        RelayStep::Tell(Tell { gains, losses, told: (), within: None, lost: false, end: None })
    });
    let (mut old_rx, mut new_rx) = (command_stream(old_rx.0), command_stream(new_rx.0));
    assert!(old_rx.next().now_or_never().is_none(), "the release waits");
    let assigned = new_rx.next().await.and_then(Result::ok);
    assert_eq!(assigned, Some(update("t", [7], [])));
    let released = old_rx.next().now_or_never().flatten().and_then(Result::ok);
    assert_eq!(released, Some(update("t", [], [7])), "then it goes");
}

#[test]
fn a_fence_only_rings_and_the_loop_lets_the_fenced_streams_go() {
    let (streams, metrics) = registry();
    let (a, mut a_rx, mut a_end) = stream(1, 1);
    assert!(streams.admit("t", "a", a, || true).is_some());
    streams.fence(Fence::SessionLost { instance: "i1".into() });
    assert!(a_rx.try_recv().is_err(), "the ringer puts nothing in any channel (the transport speaks)");
    assert_eq!(metrics.streams.get(), 1, "nor removes any stream");
    let (b, _b_rx, mut b_end) = stream(2, 2);
    assert!(streams.admit("t", "b", b, || true).is_some());
    streams.reap_fenced();
    assert_eq!(a_end.try_recv(), Ok(EndReason::Disconnected), "the registration is kept for the TTL");
    assert_eq!(streams.names(), vec![("t".to_string(), "b".to_string())], "admitted after the fence");
    assert_eq!(metrics.streams.get(), 1);
    streams.drop_all();
    assert_eq!(b_end.try_recv(), Ok(EndReason::Shutdown), "the instance stopped: nothing to settle");
    assert_eq!(metrics.streams.get(), 0);
}

#[test]
fn a_consumer_that_stops_reading_is_ended_resource_exhausted() {
    let (streams, _) = registry();
    let (a, mut rx, mut end) = stream(1, 1);
    streams.insert("t", "a", a);
    let command = crate::coordinator::shared::outgoing::update("t", [0], []);
    for _ in 0..STREAM_BUFFER + 10 {
        let mut changes = Changes::default();
        changes.topic("t");
        relay(&streams, &changes, |_, _, _| {
            RelayStep::Tell(Tell {
                gains: vec![command.clone()],
                losses: vec![],
                told: (),
                within: None,
                lost: false,
                end: None,
            })
        });
    }
    assert!(streams.names().is_empty(), "the stream is ended");
    assert_eq!(end.try_recv(), Ok(EndReason::Disconnected), "its registration is kept for the TTL");
    let mut items = 0;
    let last = loop {
        match rx.try_recv() {
            Ok(Ok(_)) => items += 1,
            Ok(Err(error)) => break error,
            Err(e) => panic!("no error item after {items} commands: {e:?}"),
        }
    };
    assert_eq!(items, STREAM_BUFFER, "the buffer is bounded");
    assert!(matches!(last, CoordinatorError::NotReading(_)), "{last}");
}

#[test]
fn a_step_that_told_nothing_leaves_what_the_stream_knows_incomplete_until_a_whole_step() {
    let (mut a, _rx, _end) = stream(1, 1);
    a.activated = true;
    assert!(a.told_complete);
    let _ = a.apply("t", "a", RelayStep::Wait);
    assert!(!a.told_complete, "changes relayed meanwhile were not told");
    let part =
        Tell { gains: vec![], losses: vec![], told: (), within: Some([1].into()), lost: false, end: None };
    let _ = a.apply("t", "a", RelayStep::Tell(part));
    assert!(!a.told_complete, "a part does not make it whole");
    let whole = Tell { gains: vec![], losses: vec![], told: (), within: None, lost: false, end: None };
    let _ = a.apply("t", "a", RelayStep::Tell(whole));
    assert!(a.told_complete);
}
