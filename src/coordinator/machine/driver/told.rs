//! The fleet's order rule as the driver applies it: a partition given back is freed only
//! once its giver heard. A step of a machine that tells before it frees
//! ([`Machine::tells_before_freeing`](super::Machine::tells_before_freeing)) lists the
//! giver's `unassigned` before the request that deletes the lease; the driver holds that
//! request until the transport of every stream told in the step took its command, for at
//! most one session TTL. A stream that did not take it in time, or whose consumer went away
//! first, never heard: its stream is ended (`RESOURCE_EXHAUSTED`), the request is not sent
//! (the machine's watchdog fails it), and the registration with its leases is kept for the
//! TTL, so nobody else gets the partitions while a consumer that was not told may still
//! process them.

use std::time::Duration;

use tokio::sync::mpsc;

use super::{Driver, Machine, Message};
use crate::coordinator::CoordinatorError;
use crate::coordinator::causes::{GiveBackStall, NotReadingStream};
use crate::coordinator::machine::io::{RequestId, StoreRequest, StreamId};
use crate::coordinator::shared::outgoing::{CommandSender, PassGate};
use crate::proto::v1::{AssignmentCommand, assignment_command::Command};

/// One command of the step, held until its transport takes it.
#[derive(Clone)]
pub(super) struct Told {
    pub stream: StreamId,
    pub gate: PassGate,
    /// The stream's sender: whether its consumer is still there once the command was taken.
    pub tx: CommandSender,
    /// The partitions the command takes away (named in the error if it is never taken).
    pub unassigned: Vec<u32>,
}

/// A stream that did not hear in time, and why.
#[derive(Debug)]
pub(crate) struct Stalled {
    stream: StreamId,
    unassigned: Vec<u32>,
    /// `None`: its consumer went away before it took the command.
    why: Option<GiveBackStall>,
}

/// The partitions `command` unassigns.
pub(super) fn unassigned(command: &AssignmentCommand) -> Vec<u32> {
    match &command.command {
        Some(Command::Assignment(update)) => update.unassigned.iter().map(|tp| tp.partition).collect(),
        _ => Vec::new(),
    }
}

/// Waits (in a task) until every command of `told` was taken, within `bound`, then hands
/// `op` back to the driver with the streams that did not hear.
pub(super) fn send_once_taken(
    told: Vec<Told>,
    request: RequestId,
    op: StoreRequest,
    bound: Duration,
    to_driver: &mpsc::UnboundedSender<Message>,
) {
    let to_driver = to_driver.clone();
    tokio::spawn(async move {
        let waits = told.into_iter().map(|Told { stream, gate, tx, unassigned }| async move {
            let taken = tokio::time::timeout(bound, gate.taken()).await;
            let why = match taken {
                // Taken, or dropped with its channel: only a stream still open heard it.
                Ok(()) if !tx.is_closed() => return None,
                Ok(()) => None,
                Err(_) => Some(GiveBackStall::NotTaken { waited: bound }),
            };
            Some(Stalled { stream, unassigned, why })
        });
        let stalled = futures::future::join_all(waits).await.into_iter().flatten().collect();
        let _ = to_driver.send(Message::Told { request, op, stalled });
    });
}

impl<M: Machine> Driver<M> {
    /// A held request whose commands were taken (it is sent) or not (their streams end and
    /// it is not sent).
    pub(super) fn told(&mut self, request: RequestId, op: StoreRequest, stalled: Vec<Stalled>) {
        if stalled.is_empty() {
            return self.store.send(request, op);
        }
        for Stalled { stream, unassigned, why } in stalled {
            let Some(why) = why else { continue };
            self.shared.metrics.give_backs_timed_out.inc();
            if let Some(open) = self.commands.get(&stream) {
                let error = CoordinatorError::NotReading(NotReadingStream::GivingBack {
                    consumer: open.consumer.clone(),
                    topic: open.topic.clone(),
                    partitions: unassigned,
                    stall: why,
                });
                self.end_not_reading(stream, error);
                self.step(crate::coordinator::machine::io::Input::StreamClosed { stream });
            }
        }
    }
}
