//! Tests of a stream's transport (`transport.rs`): how it ends itself when the bell rings.

use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use tokio::sync::watch;

use super::{EndWatch, Ends, Held, Stop, command_stream};
use crate::coordinator::causes::{EndOfStream, Fence};
use crate::coordinator::shared::outgoing::{STREAM_BUFFER, command_channel, update};
use crate::coordinator::shared::streams::LocalStream;
use crate::coordinator::{CommandStream, CoordinatorError};
use crate::handoff::Command;
use crate::proto::v1::AssignmentCommand;
use crate::store::SessionId;

/// The bell an instance's transports read, rung as the lease keeper and the driver ring it.
#[derive(Default)]
struct Bell(watch::Sender<Ends>);

impl Bell {
    /// Fences every stream admitted so far, saying `why`.
    fn fence(&self, why: Fence) {
        self.0.send_modify(|ends| {
            ends.fences += 1;
            ends.fence = Some(why);
        });
    }

    /// Ends every stream for good; a crash wins over a graceful stop.
    fn stop(&self, stop: Stop) {
        self.0.send_modify(|ends| {
            if ends.stop.is_none() || stop == Stop::Crashed {
                ends.stop = Some(stop);
            }
        });
    }
}

/// A stream admitted now under `bell`, and what its gRPC layer reads.
fn admitted(bell: &Bell, session: i64) -> (LocalStream<()>, CommandStream) {
    let (tx, rx) = command_channel();
    let (stream, _end) = LocalStream::new(SessionId(session), session, tx);
    let bell = bell.0.subscribe();
    let fences = bell.borrow().fences;
    (stream, command_stream(rx, EndWatch::new(bell, fences)))
}

fn registry() -> Bell {
    Bell::default()
}

fn warm(partition: u32) -> AssignmentCommand {
    super::super::outgoing::to_wire("t", Command::Warm { partition, current_owner: "x".into() })
}

fn release(partition: u32) -> AssignmentCommand {
    super::super::outgoing::to_wire("t", Command::Release { partition, new_owner: "y".into() })
}

/// Everything the stream yields until it ends (within a deadline: it must not wait on
/// anything but the runtime).
async fn drain(out: &mut CommandStream) -> Vec<Result<AssignmentCommand, CoordinatorError>> {
    let mut items = Vec::new();
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(10), out.next()).await {
            Ok(Some(item)) => items.push(item),
            Ok(None) => return items,
            Err(_) => panic!("the stream still waits after {} items", items.len()),
        }
    }
}

fn session_lost() -> Fence {
    Fence::SessionLost { instance: "i1".into() }
}

#[test]
fn what_the_consumer_was_sent_folds_into_what_it_holds() {
    let mut held = Held::default();
    assert_eq!(held.farewell(), None, "nothing sent, nothing to say");
    for command in [update("t", [0, 1, 2], []), warm(3), warm(4), update("t", [], [1, 4]), release(2)] {
        held.note(&command);
    }
    assert_eq!(held.farewell(), Some(update("t", [], [0, 3])), "owned 0, warming 3");
    held.note(&update("t", [], [0, 3]));
    assert_eq!(held.farewell(), None);
}

#[tokio::test]
async fn a_fence_sends_what_was_queued_then_the_farewell_of_what_was_sent_then_the_error() {
    let streams = registry();
    let (mut stream, mut out) = admitted(&streams, 1);
    stream.send([update("t", [0, 1], [])]);
    assert_eq!(out.next().await.and_then(Result::ok), Some(update("t", [0, 1], [])));
    stream.send([warm(5), update("t", [], [1])]);
    streams.fence(session_lost());
    // Sent after the bell rang, before the transport noticed: it goes, and the farewell
    // covers it.
    stream.send([update("t", [9], [])]);
    let items = drain(&mut out).await;
    let commands: Vec<_> = items.iter().filter_map(|i| i.as_ref().ok().cloned()).collect();
    let farewell = update("t", [], [0, 5, 9]);
    assert_eq!(commands, vec![warm(5), update("t", [], [1]), update("t", [9], []), farewell]);
    stream.send([update("t", [7], [])]);
    assert!(out.next().await.is_none(), "the stream ended; what is sent now goes nowhere");
    let last = items.last().and_then(|i| i.as_ref().err());
    assert!(
        matches!(last, Some(CoordinatorError::StreamEnded(EndOfStream::Fenced(Fence::SessionLost { .. })))),
        "{last:?}"
    );
}

#[tokio::test]
async fn a_fenced_consumer_a_whole_buffer_behind_hears_its_backlog_then_its_farewell() {
    let streams = registry();
    let (mut stream, mut out) = admitted(&streams, 1);
    for _ in 0..STREAM_BUFFER {
        stream.send([update("t", [0], [])]);
    }
    streams.fence(session_lost());
    let items = drain(&mut out).await;
    let n = items.len();
    assert_eq!(n, STREAM_BUFFER + 2, "the backlog, the farewell, the error");
    assert!(items[..STREAM_BUFFER].iter().all(|i| matches!(i, Ok(c) if *c == update("t", [0], []))));
    assert!(matches!(&items[n - 2], Ok(c) if *c == update("t", [], [0])), "{:?}", items[n - 2]);
    assert!(matches!(items[n - 1], Err(CoordinatorError::StreamEnded(EndOfStream::Fenced(_)))));
}

#[tokio::test]
async fn a_fence_rung_on_another_thread_wakes_a_waiting_transport() {
    let streams = Arc::new(registry());
    let (mut stream, mut out) = admitted(&streams, 1);
    stream.send([update("t", [2], [])]);
    assert!(out.next().await.is_some_and(|i| i.is_ok()));
    let waiting = tokio::spawn(async move { (out.next().await, out.next().await, out.next().await) });
    let ringer = streams.clone();
    let rung = std::thread::spawn(move || ringer.fence(Fence::CannotFollow { instance: "i1".into() }));
    assert!(rung.join().is_ok());
    let Ok((farewell, error, end)) = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
        .await
        .map(|joined| joined.unwrap_or_else(|e| panic!("{e}")))
    else {
        panic!("the transport did not wake")
    };
    assert_eq!(farewell.and_then(Result::ok), Some(update("t", [], [2])));
    assert!(matches!(error, Some(Err(CoordinatorError::StreamEnded(EndOfStream::Fenced(_))))));
    assert!(end.is_none(), "then the stream ends");
}

#[tokio::test]
async fn a_fence_ends_the_streams_admitted_before_it_and_no_later_one() {
    let streams = registry();
    let (_before_stream, mut before) = admitted(&streams, 1);
    streams.fence(session_lost());
    let (mut after_stream, mut after) = admitted(&streams, 2);
    assert!(matches!(drain(&mut before).await.last(), Some(Err(CoordinatorError::StreamEnded(_)))));
    after_stream.send([update("t", [3], [])]);
    assert_eq!(after.next().now_or_never().flatten().and_then(Result::ok), Some(update("t", [3], [])));
    assert!(after.next().now_or_never().is_none(), "still open");
}

#[tokio::test]
async fn a_stop_ends_every_stream_without_a_farewell_and_a_crash_wins_over_a_fence() {
    let streams = registry();
    let (mut stream, mut out) = admitted(&streams, 1);
    stream.send([update("t", [0], [])]);
    streams.stop(Stop::Shutdown { instance: "i1".into() });
    let items = drain(&mut out).await;
    assert_eq!(items.len(), 2, "{items:?}");
    assert!(matches!(items[1], Err(CoordinatorError::StreamEnded(EndOfStream::Shutdown { .. }))));

    let crashed = registry();
    let (mut stream, mut out) = admitted(&crashed, 1);
    stream.send([update("t", [0], [])]);
    crashed.fence(session_lost());
    crashed.stop(Stop::Crashed);
    crashed.stop(Stop::Shutdown { instance: "i1".into() });
    let items = drain(&mut out).await;
    assert_eq!(items.len(), 2, "a dead process says goodbye to no one: {items:?}");
    assert!(matches!(items[1], Err(CoordinatorError::StreamEnded(EndOfStream::Crashed))));
}

#[tokio::test]
async fn a_fence_before_a_graceful_stop_still_says_farewell() {
    let streams = registry();
    let (mut stream, mut out) = admitted(&streams, 1);
    stream.send([update("t", [0], [])]);
    streams.fence(session_lost());
    streams.stop(Stop::Shutdown { instance: "i1".into() });
    let items = drain(&mut out).await;
    assert!(matches!(&items[1], Ok(c) if *c == update("t", [], [0])), "{items:?}");
    assert!(matches!(items[2], Err(CoordinatorError::StreamEnded(EndOfStream::Fenced(_)))));
}
