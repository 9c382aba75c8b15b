//! What goes out to a consumer: commands in their wire form ([`to_wire`], one place for
//! every backend), a stream's command channel, and the gate that makes the new owner hear
//! first.
//!
//! Within one relay pass, what consumers gain (`assigned`, `WarmPartition`) is sent before
//! what they lose (`unassigned`, `ReleasePartition`), see [`super::relay::RelayPass`].
//! Putting the gains into their channels first is not enough: every stream is written to
//! the network by its own task, and the runtime runs those tasks in any order (tokio even
//! runs the task woken last first), so the old owner could read its release before the new
//! owner's `assigned` left the server, and the partition would have no owner in between.
//!
//! So each gain of a pass holds a share of the pass's [`PassGate`], given up when the
//! transport takes the command from its channel, and each loss of the pass waits, in its
//! own channel, until every share is given up (or [`GAINS_FIRST_WAIT`] passed). Waiting in
//! the channel keeps the relay from blocking and keeps each stream's order; a loss only
//! waits for gains of its own pass, which sit behind older commands only, so no two
//! streams can wait for each other. A consumer that does not read its stream delays the
//! other's release by at most [`GAINS_FIRST_WAIT`]: a longer overlap, never a gap.
//!
//! The fleet backend, which has no overlap, waits on a gate the other way round: a
//! partition given back is freed only once [`PassGate::taken`] says the giver's transport
//! took its `unassigned` (`fleet_backend/claim.rs`).

use std::{sync::Arc, time::Duration};

use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::coordinator::CoordinatorError;
use crate::handoff::Command;
use crate::proto::v1::{
    AssignmentCommand, AssignmentUpdate, ReleasePartition, TopicPartition, WarmPartition, assignment_command,
};

fn tp(topic: &str, partition: u32) -> TopicPartition {
    TopicPartition { topic: topic.to_string(), partition }
}

/// Converts a pure command for a consumer of `topic` into the wire message.
pub(crate) fn to_wire(topic: &str, command: Command) -> AssignmentCommand {
    let command = match command {
        Command::Assignment { assigned, unassigned } => {
            assignment_command::Command::Assignment(AssignmentUpdate {
                assigned: assigned.into_iter().map(|p| tp(topic, p)).collect(),
                unassigned: unassigned.into_iter().map(|p| tp(topic, p)).collect(),
            })
        }
        Command::Warm { partition, current_owner } => assignment_command::Command::Warm(WarmPartition {
            partition: Some(tp(topic, partition)),
            current_owner,
        }),
        Command::Release { partition, new_owner } => assignment_command::Command::Release(ReleasePartition {
            partition: Some(tp(topic, partition)),
            new_owner,
        }),
    };
    AssignmentCommand { command: Some(command) }
}

/// An `AssignmentUpdate` for `topic` (the only command the fleet and static backends send).
pub(crate) fn update(
    topic: &str,
    assigned: impl IntoIterator<Item = u32>,
    unassigned: impl IntoIterator<Item = u32>,
) -> AssignmentCommand {
    let assigned = assigned.into_iter().collect();
    let unassigned = unassigned.into_iter().collect();
    to_wire(topic, Command::Assignment { assigned, unassigned })
}

/// How long a loss waits, at most, for the gains of its relay pass to be taken by their
/// streams' transport. Only a consumer that stopped reading makes it wait that long.
pub const GAINS_FIRST_WAIT: Duration = Duration::from_secs(1);

/// One item of a command channel: a command or the error that ends the stream, and its
/// place in the gains-before-losses order.
pub struct Outgoing {
    /// What the consumer receives.
    pub item: Result<AssignmentCommand, CoordinatorError>,
    order: Order,
}

enum Order {
    /// Sent when its turn comes.
    Free,
    /// A gain: holds its pass's gate until the transport takes it.
    Gain(Arc<DropGuard>),
    /// A loss: waits until its pass's gains were all taken, or until the deadline (then
    /// counted in the counter, if any).
    Loss(CancellationToken, tokio::time::Instant, Option<Counter>),
}

impl Outgoing {
    /// An item with no place in any pass (snapshots, errors, the static backend).
    pub fn free(item: Result<AssignmentCommand, CoordinatorError>) -> Self {
        Self { item, order: Order::Free }
    }

    /// The item, once its turn came: a gain gives up its share of its pass's gate, a
    /// loss waits until its pass's gains were taken or [`GAINS_FIRST_WAIT`] passed.
    pub async fn in_turn(self) -> Result<AssignmentCommand, CoordinatorError> {
        match self.order {
            Order::Free => {}
            Order::Gain(share) => drop(share),
            Order::Loss(taken, deadline, waited_out) => {
                let waited = tokio::time::timeout_at(deadline, taken.cancelled()).await;
                if let (Err(_), Some(counter)) = (waited, waited_out) {
                    counter.inc();
                }
            }
        }
        self.item
    }
}

/// The gains-before-losses gate of one relay pass. Every clone holds it as a gain does.
#[derive(Clone)]
pub struct PassGate {
    hold: Arc<DropGuard>,
    taken: CancellationToken,
    /// Counts the losses that waited out [`GAINS_FIRST_WAIT`].
    waited_out: Option<Counter>,
}

impl PassGate {
    /// A gate for a new relay pass. Dropping it and its clones (at the end of the pass)
    /// leaves only the gains' shares holding it.
    pub fn new() -> Self {
        let taken = CancellationToken::new();
        Self { hold: Arc::new(taken.clone().drop_guard()), taken, waited_out: None }
    }

    /// A gate like [`new`](Self::new) whose losses that waited out [`GAINS_FIRST_WAIT`]
    /// are counted in `waited_out` (`losses_waited_out_total`): a release that went before
    /// its new owner heard `assigned` is a longer overlap, worth seeing, not only a delay.
    pub fn counting(waited_out: Counter) -> Self {
        Self { waited_out: Some(waited_out), ..Self::new() }
    }

    /// A gain of this pass.
    pub fn gain(&self, command: AssignmentCommand) -> Outgoing {
        Outgoing { item: Ok(command), order: Order::Gain(self.hold.clone()) }
    }

    /// A loss of this pass, sent once its gains were taken.
    pub fn loss(&self, command: AssignmentCommand) -> Outgoing {
        let deadline = tokio::time::Instant::now() + GAINS_FIRST_WAIT;
        Outgoing {
            item: Ok(command),
            order: Order::Loss(self.taken.clone(), deadline, self.waited_out.clone()),
        }
    }

    /// Resolves once every gain of this gate was taken from its channel, or dropped with
    /// it: a sender that must know the consumer heard checks that its stream is still open.
    pub fn taken(self) -> impl Future<Output = ()> + Send + 'static {
        let Self { hold, taken, .. } = self;
        drop(hold);
        taken.cancelled_owned()
    }
}

impl Default for PassGate {
    fn default() -> Self {
        Self::new()
    }
}

/// The sending half of a consumer's command stream.
pub type CommandSender = mpsc::Sender<Outgoing>;

/// The receiving half of a consumer's command stream.
pub type CommandReceiver = mpsc::Receiver<Outgoing>;

/// How many commands may wait unread in one stream. A consumer that stops reading has its
/// stream ended with `RESOURCE_EXHAUSTED` instead of growing the server's memory; its
/// registration is kept for the TTL so it can reconnect (and get a fresh snapshot).
pub const STREAM_BUFFER: usize = 1024;

/// A new command channel of [`STREAM_BUFFER`] commands, and two slots beyond them: the
/// farewell that tells a fenced or replaced consumer it owns nothing, and the last error.
pub fn command_channel() -> (CommandSender, CommandReceiver) {
    mpsc::channel(STREAM_BUFFER + 2)
}

#[cfg(test)]
mod tests {
    use futures::{FutureExt, StreamExt};

    use super::{Outgoing, PassGate, command_channel};
    use crate::coordinator::shared::outgoing::update;
    use crate::coordinator::shared::transport::unbelled_stream as command_stream;

    #[tokio::test(start_paused = true)]
    async fn a_loss_waits_until_the_gains_of_its_pass_are_taken() {
        let (gain_tx, gain_rx) = command_channel();
        let (loss_tx, loss_rx) = command_channel();
        let (mut gains, mut losses) = (command_stream(gain_rx), command_stream(loss_rx));
        let gate = PassGate::new();
        assert!(gain_tx.try_send(gate.gain(update("t", [1], []))).is_ok());
        assert!(loss_tx.try_send(gate.loss(update("t", [], [1]))).is_ok());
        drop(gate);
        assert!(losses.next().now_or_never().is_none(), "the release waits for the new owner's assigned");
        assert!(gains.next().await.is_some_and(|c| c.is_ok()));
        assert!(losses.next().now_or_never().flatten().is_some_and(|c| c.is_ok()), "then it goes");
    }

    #[tokio::test(start_paused = true)]
    async fn a_loss_waits_at_most_the_bound_for_a_consumer_that_does_not_read() {
        let (gain_tx, _unread) = command_channel();
        let (loss_tx, loss_rx) = command_channel();
        let mut losses = command_stream(loss_rx);
        let gate = PassGate::new();
        assert!(gain_tx.try_send(gate.gain(update("t", [1], []))).is_ok());
        assert!(loss_tx.try_send(gate.loss(update("t", [], [1]))).is_ok());
        assert!(loss_tx.try_send(Outgoing::free(Ok(update("t", [2], [])))).is_ok());
        drop(gate);
        let start = tokio::time::Instant::now();
        assert!(losses.next().await.is_some_and(|c| c.is_ok()));
        assert_eq!(start.elapsed(), super::GAINS_FIRST_WAIT);
        assert!(losses.next().await.is_some_and(|c| c.is_ok()), "what follows keeps its order");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_without_gains_holds_nothing_back() {
        let (loss_tx, loss_rx) = command_channel();
        let mut losses = command_stream(loss_rx);
        let gate = PassGate::new();
        assert!(loss_tx.try_send(gate.loss(update("t", [], [1]))).is_ok());
        drop(gate);
        assert!(losses.next().now_or_never().flatten().is_some());
    }
}
