//! What comes back to the consumers: the commands of their streams (applied to their
//! beliefs), and the answers to their calls and to instance restarts.

use std::time::Duration;

use kafka_assigner::coordinator::{CommandStream, CoordinatorError, HandoffCoordinator, StreamEnd};
use kafka_assigner::proto::v1::{AssignmentCommand, DeregisterAction};
use kafka_assigner::server::status::code_of;
use tokio::time::Instant;
use tonic::Code;

use crate::driver::{Agenda, Phase, Reply, Sim, TOPIC};
use crate::model::Belief;

/// How late (in TTLs after a cut-off) an instance may end its streams: its fence is due
/// 3/4 TTL after its last renewal, which was before the cut.
pub const FENCE_BOUND: f64 = 0.8;

impl Sim {
    /// One command (or the end) of consumer `c`'s stream `inc`.
    pub fn item(
        &mut self,
        inc: u64,
        c: usize,
        item: Option<Result<AssignmentCommand, CoordinatorError>>,
    ) -> Result<(), String> {
        let (partitions, ttl) = (self.shape.partitions, self.shape.ttl);
        let name = self.consumers[c].name.clone();
        let Phase::Online { belief, instance, draining, .. } = &mut self.consumers[c].phase else {
            return Err(format!("{name}: a command for a stream it no longer holds"));
        };
        let (instance, draining) = (*instance, *draining);
        match item {
            Some(Ok(command)) => {
                self.outcome.commands += 1;
                let todos =
                    belief.apply(&command, TOPIC, partitions).map_err(|e| format!("{name}#{inc}: {e}"))?;
                let line = format!("{name}#{inc}@i{instance} told {:?}", command.command);
                self.note(line);
                for todo in todos {
                    self.plan_answer(c, inc, todo);
                }
            }
            Some(Err(error)) => {
                self.note(format!("{name}#{inc}@i{instance} stream ended: {:?} {error}", code_of(&error)));
                // Only a later registration of the same name replaces a stream, and a live
                // consumer registers only once it has no stream: an older registration (a
                // half-open stream's, written again) took the name back.
                ensure!(
                    code_of(&error) != Code::Aborted,
                    "{name}#{inc}: its stream on i{instance} was ended as replaced, but {name} made no later \
                     registration: {error}"
                );
                self.drop_stream(c, inc);
                if let Some((_, since)) = self.instances[instance].cut {
                    let fraction = (Instant::now() - since).as_secs_f64() / ttl.as_secs_f64();
                    self.outcome.fenced += 1;
                    self.outcome.max_fence_ttl = self.outcome.max_fence_ttl.max(fraction);
                    // The fence comes 3/4 TTL after the last renewal, which was before the cut
                    // (lease.rs); a little slack for the watch of the lease state.
                    ensure!(
                        fraction.total_cmp(&FENCE_BOUND).is_le(),
                        "{name}#{inc}: i{instance} ended its stream {fraction:.2} TTL after it was cut off \
                         (the fence is due within {FENCE_BOUND} TTL)"
                    );
                }
                if self.consumers[c].want {
                    let wait = self.draw(&[1, inc]).millis(50, ttl.as_millis() as u64 * 3 / 2);
                    self.after(wait, Agenda::Reconnect { consumer: c });
                }
            }
            None => {
                self.note(format!("{name}#{inc}@i{instance} stream ended cleanly"));
                ensure!(draining, "{name}#{inc}: the stream ended cleanly, but it never asked to drain");
                self.drop_stream(c, inc);
            }
        }
        Ok(())
    }

    /// Forgets stream `inc` of consumer `c`: the consumer stops processing at once.
    pub fn drop_stream(&mut self, c: usize, inc: u64) {
        self.open.retain(|(i, _, _)| *i != inc);
        if let Phase::Online { inc: i, instance, .. } = self.consumers[c].phase
            && i == inc
        {
            self.instances[instance].dropped_at = Some(Instant::now());
            self.consumers[c].phase = Phase::Offline;
        }
    }

    pub fn reply(&mut self, reply: Reply) {
        match reply {
            Reply::Registered { consumer, attempt, generation, result } => {
                let instance = (attempt >> 32) as usize;
                let result = if self.instances[instance].generation == generation {
                    result
                } else {
                    // The instance crashed while the call ran: the client's connection broke.
                    Err(CoordinatorError::StreamEnded(
                        StreamEnd::Crashed,
                        "the connection to the instance broke".into(),
                    ))
                };
                self.registered(consumer, attempt, result)
            }
            Reply::Deregistered { consumer, inc, result } => self.deregistered(consumer, inc, result),
            Reply::Called { consumer, inc, ready, partition, line, retry } => {
                self.note(line);
                if ready {
                    self.consumers[consumer].readies -= 1;
                }
                if retry {
                    let wait = self.draw(&[8, inc, partition as u64, self.seq]).millis(100, 500);
                    self.after(wait, Agenda::Call { consumer, inc, ready, partition });
                }
            }
            Reply::Started { instance, result } => self.started(instance, result),
        }
    }

    fn registered(&mut self, c: usize, attempt: u64, result: Result<CommandStream, CoordinatorError>) {
        let consumer = &self.consumers[c];
        let current = consumer.attempt == attempt && matches!(consumer.phase, Phase::Registering);
        let name = consumer.name.clone();
        match result {
            Ok(stream) if current && consumer.want => {
                self.next_inc += 1;
                let inc = self.next_inc;
                let instance = (attempt >> 32) as usize;
                self.outcome.streams_opened += 1;
                self.note(format!("{name}#{inc}@i{instance} registered"));
                self.consumers[c].phase =
                    Phase::Online { inc, instance, belief: Belief::default(), draining: false };
                self.open.push((inc, c, stream));
            }
            Ok(_) => {
                // An abandoned attempt: the consumer is gone or registering again; the
                // stream is dropped as the client's connection would be.
                self.note(format!("{name}: late registration dropped"));
                if current {
                    self.consumers[c].phase = Phase::Offline;
                }
            }
            Err(error) => {
                self.note(format!("{name}: register failed: {:?} {error}", code_of(&error)));
                if current {
                    self.consumers[c].phase = Phase::Offline;
                    if self.consumers[c].want {
                        let wait = self.draw(&[2, attempt]).millis(100, 600);
                        self.after(wait, Agenda::Reconnect { consumer: c });
                    }
                }
            }
        }
    }

    fn deregistered(&mut self, c: usize, inc: u64, result: Result<DeregisterAction, CoordinatorError>) {
        let name = self.consumers[c].name.clone();
        match result {
            Ok(DeregisterAction::WaitForDrain) => self.note(format!("{name}#{inc}: deregistered, draining")),
            Ok(action) => {
                self.note(format!("{name}#{inc}: deregistered, {action:?}: it stops"));
                self.drop_stream(c, inc);
            }
            Err(error) => {
                self.note(format!("{name}#{inc}: deregister failed: {:?} {error}", code_of(&error)));
                if code_of(&error) == Code::NotFound {
                    // It believes it is not registered: it exits.
                    self.drop_stream(c, inc);
                } else {
                    // Still leaving (the lost answer may have been a drain): it asks again.
                    let wait = self.draw(&[7, inc, self.seq]).millis(100, 500);
                    self.after(wait, Agenda::Deregister { consumer: c, inc });
                }
            }
        }
    }

    fn started(&mut self, instance: usize, result: Result<HandoffCoordinator, CoordinatorError>) {
        self.instances[instance].starting = false;
        match result {
            Ok(coordinator) => {
                self.note(format!("i{instance} restarted"));
                self.instances[instance].coordinator = Some(coordinator);
            }
            Err(error) => {
                self.note(format!("i{instance} cannot start: {error}; retrying"));
                self.after(Duration::from_millis(500), Agenda::Restart { instance });
            }
        }
    }
}
