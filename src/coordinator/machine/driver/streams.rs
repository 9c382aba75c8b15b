//! The driver's side of the consumers' streams: putting a step's commands into their
//! channels in their order (the gains-first gate; the fleet's give-backs held until taken,
//! `told.rs`), ending a stream whose consumer does not read it, and forwarding a stream's
//! closing as an input.

use tokio_util::sync::CancellationToken;

use super::{Driver, Machine, Message, Order, Outlet, told};
use crate::coordinator::CoordinatorError;
use crate::coordinator::causes::NotReadingStream;
use crate::coordinator::machine::io::{Call, Input, StreamId};
use crate::coordinator::shared::outgoing::{CommandSender, Outgoing, PassGate};
use crate::proto::v1::{AssignmentCommand, assignment_command::Command};

/// A command stream the driver sends on.
pub(super) struct Open {
    pub(super) tx: CommandSender,
    pub(super) topic: String,
    pub(super) consumer: String,
    /// Dropped when the stream ends here: its closing is no longer forwarded.
    _ended: tokio_util::sync::DropGuard,
}

impl<M: Machine> Driver<M> {
    /// Puts `command` into `stream`'s channel in its place in the step's order; a consumer
    /// whose channel is full is not reading: its stream ends, and the machine hears so.
    pub(super) fn command(&mut self, stream: StreamId, command: AssignmentCommand, order: &mut Order) {
        let Some(open) = self.commands.get(&stream) else { return };
        let unassigned = told::unassigned(&command);
        let (outgoing, held) = match order.told.as_ref() {
            // An `unassigned` is held until the transport takes it: what the step asks of the
            // store after it waits (the partitions it gives back are freed then).
            Some(_) if !unassigned.is_empty() => {
                let gate = PassGate::new();
                (gate.gain(command), Some(gate))
            }
            _ if is_loss(&command) => (order.gate.loss(command), None),
            _ => (order.gate.gain(command), None),
        };
        if open.tx.capacity() > 2 && open.tx.try_send(outgoing).is_ok() {
            if let (Some(told), Some(gate)) = (order.told.as_mut(), held) {
                told.push(told::Told { stream, gate, tx: open.tx.clone(), unassigned });
            }
            return;
        }
        let (consumer, topic) = (open.consumer.clone(), open.topic.clone());
        let error = match held {
            Some(_) => {
                order.refused = true;
                CoordinatorError::NotReading(NotReadingStream::GivingBack {
                    consumer,
                    topic,
                    partitions: unassigned,
                    stall: crate::coordinator::causes::GiveBackStall::BufferFull,
                })
            }
            _ => CoordinatorError::NotReading(NotReadingStream::BufferFull { consumer, topic }),
        };
        self.end_not_reading(stream, error);
        order.closed.push(stream);
    }

    /// Ends `stream` with `error` (its consumer does not read it).
    pub(super) fn end_not_reading(&mut self, stream: StreamId, error: CoordinatorError) {
        if let Some(open) = self.commands.remove(&stream) {
            tracing::warn!(topic = open.topic, consumer = open.consumer, %error, "ending a stream its consumer does not read");
            let _ = open.tx.try_send(Outgoing::free(Err(error)));
        }
    }

    /// Keeps the sending half of the stream a call opens, and forwards its closing: a task
    /// that waits for the receiver to go, or for the driver to end the stream (it then
    /// lets its clone of the sender go, so the stream can end).
    pub(super) fn open(&mut self, stream: StreamId, body: &Call, outlet: Outlet) {
        let to_self = self.to_self.clone();
        let ended = CancellationToken::new();
        let guard = ended.clone().drop_guard();
        let closed: futures::future::BoxFuture<'static, ()> = match outlet {
            Outlet::Commands(tx) => {
                let (topic, consumer) = match body {
                    Call::Register { topic, consumer, .. } => (topic.clone(), consumer.clone()),
                    _ => Default::default(),
                };
                let watched = tx.clone();
                self.commands.insert(stream, Open { tx, topic, consumer, _ended: guard });
                Box::pin(async move { watched.closed().await })
            }
            Outlet::Epochs(tx) => {
                let watched = tx.clone();
                self.epochs.insert(stream, (tx, guard));
                Box::pin(async move { watched.closed().await })
            }
        };
        tokio::spawn(async move {
            tokio::select! {
                () = closed => {
                    let _ = to_self.send(Message::Input(Input::StreamClosed { stream }));
                }
                () = ended.cancelled() => {}
            }
        });
    }
}

/// Whether `command` takes something from its consumer (an `unassigned` alone, a release):
/// it goes after the step's gains.
fn is_loss(command: &AssignmentCommand) -> bool {
    match &command.command {
        Some(Command::Assignment(update)) => update.assigned.is_empty() && !update.unassigned.is_empty(),
        Some(Command::Release(_)) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::is_loss;
    use crate::coordinator::shared::outgoing::update;
    use crate::proto::v1::{
        AssignmentCommand, ReleasePartition, TopicPartition, WarmPartition, assignment_command::Command,
    };

    #[test]
    fn only_what_takes_partitions_away_goes_after_the_gains() {
        let tp = Some(TopicPartition { topic: "t".into(), partition: 1 });
        assert!(!is_loss(&update("t", [1], [])), "assigned");
        assert!(!is_loss(&update("t", [], [])), "a snapshot of nothing");
        assert!(!is_loss(&update("t", [1], [2])), "a snapshot that also takes something back");
        assert!(is_loss(&update("t", [], [2])), "unassigned");
        let warm = AssignmentCommand {
            command: Some(Command::Warm(WarmPartition { partition: tp.clone(), ..Default::default() })),
        };
        assert!(!is_loss(&warm));
        let release = AssignmentCommand {
            command: Some(Command::Release(ReleasePartition { partition: tp, ..Default::default() })),
        };
        assert!(is_loss(&release));
    }
}
