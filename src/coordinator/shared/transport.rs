//! The stream the gRPC layer sends for one consumer, and how it ends itself when the
//! instance fences itself or stops.
//!
//! Whoever finds that every stream must end (the lease keeper's thread on a session it
//! could not renew, the driver on a store it cannot follow, a shutdown or a crash) only rings
//! the instance's [`Ends`] bell: it writes no stream. Each stream's transport reads the
//! bell before every item it sends. Once rung for it, the transport takes nothing new,
//! sends what was already queued (in its gains-first order), then tells the consumer it
//! owns nothing (on a fence) and ends with the error that says why; the machine hears the
//! stream close and forgets it.
//!
//! The farewell is what the consumer was actually sent, folded here ([`Held`]): the
//! partitions it was assigned or asked to warm, less those it was told to drop or release.
//! A fence then needs nothing of what the driver holds, so it works while the driver is
//! stalled, as long as the runtime runs the transports.

use std::collections::BTreeSet;

use tokio::sync::watch;

use super::outgoing::{CommandReceiver, Outgoing, update};
use crate::coordinator::causes::{EndOfStream, Fence};
use crate::coordinator::{CommandStream, CoordinatorError};
use crate::proto::v1::{AssignmentCommand, assignment_command::Command};

/// Why an instance stops serving every stream for good.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// A graceful stop: consumers reconnect elsewhere, their sessions left to the TTL.
    Shutdown {
        /// This instance's id, named in the error.
        instance: String,
    },
    /// A crash (failover tests): the streams break as a dead process's would.
    Crashed,
}

/// The bell every stream's transport reads: how many fences rang and why the last did,
/// and whether the instance stopped.
#[derive(Clone, Debug, Default)]
pub struct Ends {
    /// Fences rung so far; a stream admitted when the count was `n` ends at `n + 1`.
    pub fences: u64,
    /// Why the last fence rang.
    pub fence: Option<Fence>,
    /// Set once the instance stops; final.
    pub stop: Option<Stop>,
}

/// How one stream's transport ending looks.
#[derive(Clone, Debug, PartialEq)]
enum Ending {
    Fenced(Fence),
    Stopped(Stop),
}

impl Ending {
    fn error(self) -> CoordinatorError {
        CoordinatorError::StreamEnded(match self {
            Ending::Fenced(why) => EndOfStream::Fenced(why),
            Ending::Stopped(Stop::Shutdown { instance }) => EndOfStream::Shutdown { instance },
            Ending::Stopped(Stop::Crashed) => EndOfStream::Crashed,
        })
    }
}

/// One stream's view of the bell: the fence count it was admitted at.
pub struct EndWatch {
    bell: watch::Receiver<Ends>,
    admitted_at: u64,
}

impl EndWatch {
    /// A watch on `bell` for a stream admitted while `admitted_at` fences had rung.
    pub fn new(bell: watch::Receiver<Ends>, admitted_at: u64) -> Self {
        Self { bell, admitted_at }
    }

    /// How this stream must end now, if it must: a crash before a fence (a dead process
    /// says nothing), a fence before a graceful stop (a fenced consumer must hear that it
    /// owns nothing).
    fn ending(&self) -> Option<Ending> {
        let ends = self.bell.borrow();
        if let Some(Stop::Crashed) = ends.stop {
            return Some(Ending::Stopped(Stop::Crashed));
        }
        if ends.fences > self.admitted_at {
            let why = ends.fence.clone()?;
            return Some(Ending::Fenced(why));
        }
        ends.stop.clone().map(Ending::Stopped)
    }

    /// Resolves when this stream must end. Never, once the bell is gone (the instance
    /// was dropped: the channel closes then too).
    async fn rung(&mut self) -> Ending {
        loop {
            if let Some(ending) = self.ending() {
                return ending;
            }
            if self.bell.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// What the consumer holds by what it was sent: the partitions assigned or being warmed,
/// less those unassigned or released. A stream is of one topic.
#[derive(Debug, Default)]
pub struct Held {
    topic: Option<String>,
    partitions: BTreeSet<u32>,
}

impl Held {
    /// Folds in one command the consumer was sent.
    pub fn note(&mut self, command: &AssignmentCommand) {
        let mut hold = |tp: &crate::proto::v1::TopicPartition, held: bool| {
            self.topic.get_or_insert_with(|| tp.topic.clone());
            if held {
                self.partitions.insert(tp.partition);
            } else {
                self.partitions.remove(&tp.partition);
            }
        };
        match &command.command {
            Some(Command::Assignment(update)) => {
                update.assigned.iter().for_each(|tp| hold(tp, true));
                update.unassigned.iter().for_each(|tp| hold(tp, false));
            }
            Some(Command::Warm(warm)) => warm.partition.iter().for_each(|tp| hold(tp, true)),
            Some(Command::Release(release)) => release.partition.iter().for_each(|tp| hold(tp, false)),
            None => {}
        }
    }

    /// The command that tells the consumer it owns nothing any more, if it holds anything.
    pub fn farewell(&self) -> Option<AssignmentCommand> {
        let topic = self.topic.as_deref()?;
        (!self.partitions.is_empty()).then(|| update(topic, [], self.partitions.iter().copied()))
    }
}

/// Where a transport is in its life.
struct Transport {
    rx: CommandReceiver,
    ends: EndWatch,
    held: Held,
    /// Set once the bell rang for this stream: the channel is closed and being drained.
    ending: Option<Ending>,
    /// Set once the channel is drained: only the tail is left.
    drained: bool,
    /// The farewell and the error, sent once the channel is drained.
    tail: std::vec::IntoIter<Result<AssignmentCommand, CoordinatorError>>,
}

impl Transport {
    async fn next(&mut self) -> Option<Result<AssignmentCommand, CoordinatorError>> {
        if self.drained {
            return self.tail.next();
        }
        if self.ending.is_none() {
            tokio::select! {
                biased;
                ending = self.ends.rung() => {
                    // Nothing new gets in; what was queued still goes, in order.
                    self.rx.close();
                    self.ending = Some(ending);
                }
                queued = self.rx.recv() => match queued {
                    Some(queued) => return Some(self.sent(queued).await),
                    None => self.drained = true,
                },
            }
        }
        if !self.drained {
            if let Some(queued) = self.rx.recv().await {
                return Some(self.sent(queued).await);
            }
            self.drained = true;
        }
        if let Some(ending) = self.ending.take() {
            let farewell = matches!(ending, Ending::Fenced(_)).then(|| self.held.farewell()).flatten();
            let tail: Vec<_> = farewell.map(Ok).into_iter().chain([Err(ending.error())]).collect();
            self.tail = tail.into_iter();
        }
        self.tail.next()
    }

    /// `queued` once its turn came ([`super::outgoing`]), noted as sent.
    async fn sent(&mut self, queued: Outgoing) -> Result<AssignmentCommand, CoordinatorError> {
        let item = queued.in_turn().await;
        if let Ok(command) = &item {
            self.held.note(command);
        }
        item
    }
}

/// The stream the gRPC layer sends: the channel's items in order, each loss held until
/// its pass's gains were taken ([`super::outgoing`]), ended as [`ends`](EndWatch) says.
pub fn command_stream(rx: CommandReceiver, ends: EndWatch) -> CommandStream {
    let transport = Transport {
        rx,
        ends,
        held: Held::default(),
        ending: None,
        drained: false,
        tail: Vec::new().into_iter(),
    };
    let items = futures::stream::unfold(transport, |mut transport| async move {
        let item = transport.next().await?;
        Some((item, transport))
    });
    // Fused: a stream that ended stays ended, however often it is asked.
    Box::pin(futures::StreamExt::fuse(items))
}

/// A command stream that no bell ends (tests of what goes through a channel).
#[cfg(test)]
pub(crate) fn unbelled_stream(rx: CommandReceiver) -> CommandStream {
    let (bell, ends) = watch::channel(Ends::default());
    // The sender is dropped: the watch then never rings.
    drop(bell);
    command_stream(rx, EndWatch::new(ends, 0))
}

#[cfg(test)]
#[path = "transport_tests.rs"]
mod tests;
