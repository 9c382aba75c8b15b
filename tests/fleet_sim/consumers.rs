//! What the fleet backend's consumers do, acting only on what they were told: read their
//! streams (applied to their [`Belief`](crate::invariants::Belief)s, checked at every
//! command), crash, move. Registering, leaving and reconnecting are shared
//! (`sim_support::cast`).

use std::time::Duration;

use kafka_assigner::coordinator::CoordinatorError;
use kafka_assigner::proto::v1::{AssignmentCommand, DeregisterAction};

use crate::driver::{Agenda, Phase, Reply, Sim, TOPIC};
use crate::invariants;

impl Sim {
    /// Consumer `c` dies without deregistering (its stream dropped); back after `rejoin`.
    pub fn crash_consumer(&mut self, c: usize, rejoin: Option<Duration>) {
        if let Phase::Online { inc, leaving: false, .. } = self.world.consumers[c].phase {
            self.world.note(format!("{}#{inc} crashes", self.world.consumers[c].name));
            self.world.drop_stream(c, inc);
        } else if !matches!(self.world.consumers[c].phase, Phase::Offline) {
            return;
        }
        self.world.consumers[c].want = rejoin.is_some();
        if let Some(wait) = rejoin {
            self.world.after(wait, Agenda::Reconnect { consumer: c });
        }
    }

    /// Consumer `c` reconnects at once through `instance`; with `half_open` its old stream
    /// stays open, unread by anyone alive (the old instance has not noticed).
    pub fn move_consumer(&mut self, c: usize, instance: usize, half_open: bool) {
        let Phase::Online { inc, leaving: false, .. } = self.world.consumers[c].phase else { return };
        self.world.note(format!(
            "{}#{inc} moves to i{instance} (half-open: {half_open})",
            self.world.consumers[c].name
        ));
        if half_open && let Some(k) = self.world.open.iter().position(|(i, _, _)| *i == inc) {
            let stream = self.world.open.remove(k);
            self.world.zombies.push(stream);
        }
        self.world.drop_stream(c, inc);
        self.world.join(c, instance);
    }

    /// One command (or the end) of consumer `c`'s stream `inc`.
    pub fn item(
        &mut self,
        inc: u64,
        c: usize,
        item: Option<Result<AssignmentCommand, CoordinatorError>>,
    ) -> Result<(), String> {
        let (partitions, ttl) = (self.shape.partitions, self.shape.ttl);
        let name = self.world.consumers[c].name.clone();
        let Phase::Online { belief, instance, leaving, .. } = &mut self.world.consumers[c].phase else {
            return Err(format!("{name}: a command for a stream it no longer holds"));
        };
        let (instance, leaving) = (*instance, *leaving);
        match item {
            Some(Ok(command)) => {
                self.outcome.commands += 1;
                let stopped =
                    belief.apply(&command, TOPIC, partitions).map_err(|e| format!("{name}#{inc}: {e}"))?;
                let owned = belief.owned.clone();
                self.outcome.stopped += stopped as u64;
                self.world
                    .note(format!("{name}#{inc}@i{instance} told {} -> owns {owned:?}", brief(&command)));
                invariants::exclusive(self.world.beliefs())?;
            }
            Some(Err(error)) => {
                if let Some(late) = self.world.stream_failed(c, inc, instance, error, ttl)? {
                    self.outcome.fenced += 1;
                    self.outcome.max_fence_ttl = self.outcome.max_fence_ttl.max(late);
                }
            }
            None => {
                let owned = std::mem::take(&mut belief.owned);
                self.world.note(format!("{name}#{inc}@i{instance} stream ended cleanly"));
                ensure!(leaving, "{name}#{inc}: the stream ended cleanly, but it never deregistered");
                ensure!(owned.is_empty(), "{name}#{inc}: its stream ended cleanly while it owns {owned:?}");
                self.world.drop_stream(c, inc);
            }
        }
        Ok(())
    }

    /// The answer of a spawned call.
    pub fn reply(&mut self, reply: Reply) {
        match reply {
            Reply::Registered { consumer, attempt, generation, result } => {
                if self.world.registered(consumer, attempt, generation, result) {
                    self.outcome.streams += 1;
                }
            }
            Reply::Deregistered { consumer, inc, result } => self.deregistered(consumer, inc, result),
            Reply::Started { instance, result } => self.world.started(instance, result),
        }
    }

    fn deregistered(&mut self, c: usize, inc: u64, result: Result<DeregisterAction, CoordinatorError>) {
        let name = self.world.consumers[c].name.clone();
        match result {
            Ok(action) => self
                .world
                .note(format!("{name}#{inc}: deregistered, {action:?}; waits for its stream to end")),
            Err(error) => self.world.deregister_failed(c, inc, error),
        }
    }
}

/// A command, short: `+[assigned] -[unassigned]`.
fn brief(command: &AssignmentCommand) -> String {
    use kafka_assigner::proto::v1::assignment_command::Command;
    match &command.command {
        Some(Command::Assignment(u)) => {
            let ps = |tps: &[kafka_assigner::proto::v1::TopicPartition]| {
                tps.iter().map(|t| t.partition).collect::<Vec<_>>()
            };
            format!("+{:?} -{:?}", ps(&u.assigned), ps(&u.unassigned))
        }
        other => format!("{other:?}"),
    }
}
