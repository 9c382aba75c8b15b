//! Tests of the stream registry (`streams.rs`) and of what a stream's book knows.

use std::sync::Arc;

use tokio::sync::{mpsc::error::TryRecvError, oneshot};

use super::{Book, EndReason, LocalStream, Streams};
use crate::coordinator::CoordinatorError;
use crate::coordinator::shared::outgoing::{CommandReceiver, command_channel};
use crate::coordinator::shared::relay::{RelayStep, Tell};
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
    assert_eq!(streams.session_of("t", "a"), Some(SessionId(2)));
    // A registration that arrives late but was written earlier loses.
    let (stale, mut stale_rx, _stale_end) = stream(3, 5);
    streams.insert("t", "a", stale);
    assert!(matches!(error_item(&mut stale_rx), Some(CoordinatorError::Replaced { .. })));
    assert_eq!(streams.session_of("t", "a"), Some(SessionId(2)));
    assert_eq!(metrics.streams.get(), 1);
}

#[test]
fn ending_names_the_session_so_a_stale_cleanup_cannot_remove_the_newer_stream() {
    let (streams, _) = registry();
    let (s, _rx, _end) = stream(2, 11);
    streams.insert("t", "a", s);
    streams.end(&("t".into(), "a".into(), SessionId(1)), EndReason::Shutdown, None);
    assert_eq!(streams.session_of("t", "a"), Some(SessionId(2)), "session 1 is not the one held");
    streams.end(&("t".into(), "a".into(), SessionId(2)), EndReason::Shutdown, None);
    assert!(streams.names().is_empty());
}

#[test]
fn a_step_that_told_nothing_leaves_what_the_stream_knows_incomplete_until_a_whole_step() {
    let mut a = Book { activated: true, told: (), told_complete: true };
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
