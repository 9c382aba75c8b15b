//! What comes back to the consumers: the commands of their streams (applied to their
//! beliefs), and the answers to their calls (registering, reconnecting, the fence and
//! restarts are shared: `sim_support::cast`).

use kafka_assigner::coordinator::CoordinatorError;
use kafka_assigner::proto::v1::{AssignmentCommand, DeregisterAction};

use crate::driver::{Agenda, Phase, Reply, Sim, TOPIC};

impl Sim {
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
                let todos =
                    belief.apply(&command, TOPIC, partitions).map_err(|e| format!("{name}#{inc}: {e}"))?;
                let line = format!("{name}#{inc}@i{instance} told {:?}", command.command);
                self.world.note(line);
                for todo in todos {
                    self.plan_answer(c, inc, todo);
                }
            }
            Some(Err(error)) => {
                if let Some(late) = self.world.stream_failed(c, inc, instance, error, ttl)? {
                    self.outcome.fenced += 1;
                    self.outcome.max_fence_ttl = self.outcome.max_fence_ttl.max(late);
                }
            }
            None => {
                self.world.note(format!("{name}#{inc}@i{instance} stream ended cleanly"));
                ensure!(leaving, "{name}#{inc}: the stream ended cleanly, but it never asked to drain");
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
                    self.outcome.streams_opened += 1;
                }
            }
            Reply::Deregistered { consumer, inc, result } => self.deregistered(consumer, inc, result),
            Reply::Called { consumer, inc, ready, partition, line, retry } => {
                self.world.note(line);
                if ready {
                    self.readies[consumer] -= 1;
                }
                if retry {
                    let wait = self.world.draw(&[8, inc, partition as u64, self.world.seq]).millis(100, 500);
                    self.world.after(wait, Agenda::Call { consumer, inc, ready, partition });
                }
            }
            Reply::Started { instance, result } => self.world.started(instance, result),
        }
    }

    fn deregistered(&mut self, c: usize, inc: u64, result: Result<DeregisterAction, CoordinatorError>) {
        let name = self.world.consumers[c].name.clone();
        match result {
            Ok(DeregisterAction::WaitForDrain) => {
                self.world.note(format!("{name}#{inc}: deregistered, draining"))
            }
            Ok(action) => {
                self.world.note(format!("{name}#{inc}: deregistered, {action:?}: it stops"));
                self.world.drop_stream(c, inc);
            }
            Err(error) => self.world.deregister_failed(c, inc, error),
        }
    }
}
