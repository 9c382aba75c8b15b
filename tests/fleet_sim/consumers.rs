//! What the consumers do, acting only on what they were told: register, read their
//! streams (applied to their [`Belief`]s, checked at every command), leave, crash, move.

use std::time::Duration;

use kafka_assigner::coordinator::{CommandStream, ConsumerGroupCoordinator, CoordinatorError, StreamEnd};
use kafka_assigner::proto::v1::{AssignmentCommand, DeregisterAction};
use kafka_assigner::server::status::code_of;
use tokio::time::Instant;
use tonic::Code;

use crate::driver::{Agenda, Phase, Reply, Sim, TOPIC};
use crate::invariants::{self, Belief};

/// How late (in TTLs after a cut-off) an instance may end its streams: its fence is due
/// 3/4 TTL after its last renewal, which was before the cut (docs/design.md §6).
pub const FENCE_BOUND: f64 = 0.8;

impl Sim {
    /// Consumer `c` registers on `instance` (or the next running one), if it is offline.
    pub fn join(&mut self, c: usize, instance: usize) {
        if !self.consumers[c].want || !matches!(self.consumers[c].phase, Phase::Offline) {
            return;
        }
        let Some(i) = self.running(instance) else {
            self.after(Duration::from_millis(300), Agenda::Reconnect { consumer: c });
            return;
        };
        let consumer = &mut self.consumers[c];
        consumer.attempt = ((i as u64) << 32) | ((consumer.attempt + 1) & 0xFFFF_FFFF);
        consumer.phase = Phase::Registering;
        let (attempt, name) = (consumer.attempt, consumer.name.clone());
        let (coordinator, generation) = (self.instances[i].coordinator.clone(), self.instances[i].generation);
        self.note(format!("{name} registers via i{i}"));
        let replies = self.replies_tx.clone();
        tokio::spawn(async move {
            let Some(coordinator) = coordinator else { return };
            let result = coordinator.register(&name, TOPIC).await;
            let _ = replies.send(Reply::Registered { consumer: c, attempt, generation, result });
        });
    }

    /// Consumer `c` (stream `inc`) deregisters through `instance`. It keeps acting on its
    /// stream until the stream ends: the fleet tells it to stop everything first.
    pub fn deregister(&mut self, c: usize, inc: u64, instance: usize) {
        let Some(i) = self.running(instance) else { return };
        let Phase::Online { inc: current, leaving, .. } = &mut self.consumers[c].phase else { return };
        if *current != inc {
            return;
        }
        *leaving = true;
        self.consumers[c].want = false;
        let (name, coordinator, replies) =
            (self.consumers[c].name.clone(), self.instances[i].coordinator.clone(), self.replies_tx.clone());
        self.note(format!("{name}#{inc} deregisters via i{i}"));
        tokio::spawn(async move {
            let Some(coordinator) = coordinator else { return };
            let result = coordinator.deregister(&name).await;
            let _ = replies.send(Reply::Deregistered { consumer: c, inc, result });
        });
    }

    /// Consumer `c` dies without deregistering (its stream dropped); back after `rejoin`.
    pub fn crash_consumer(&mut self, c: usize, rejoin: Option<Duration>) {
        if let Phase::Online { inc, leaving: false, .. } = self.consumers[c].phase {
            self.note(format!("{}#{inc} crashes", self.consumers[c].name));
            self.drop_stream(c, inc);
        } else if !matches!(self.consumers[c].phase, Phase::Offline) {
            return;
        }
        self.consumers[c].want = rejoin.is_some();
        if let Some(wait) = rejoin {
            self.after(wait, Agenda::Reconnect { consumer: c });
        }
    }

    /// Consumer `c` reconnects at once through `instance`; with `half_open` its old stream
    /// stays open, unread by anyone alive (the old instance has not noticed).
    pub fn move_consumer(&mut self, c: usize, instance: usize, half_open: bool) {
        let Phase::Online { inc, leaving: false, .. } = self.consumers[c].phase else { return };
        self.note(format!("{}#{inc} moves to i{instance} (half-open: {half_open})", self.consumers[c].name));
        if half_open && let Some(k) = self.open.iter().position(|(i, _, _)| *i == inc) {
            let stream = self.open.remove(k);
            self.zombies.push(stream);
        }
        self.drop_stream(c, inc);
        self.join(c, instance);
    }

    /// Forgets stream `inc` of consumer `c`: the consumer stops processing at once.
    pub fn drop_stream(&mut self, c: usize, inc: u64) {
        self.open.retain(|(i, _, _)| *i != inc);
        if matches!(self.consumers[c].phase, Phase::Online { inc: i, .. } if i == inc) {
            self.consumers[c].phase = Phase::Offline;
        }
    }

    /// One command (or the end) of consumer `c`'s stream `inc`.
    pub fn item(
        &mut self,
        inc: u64,
        c: usize,
        item: Option<Result<AssignmentCommand, CoordinatorError>>,
    ) -> Result<(), String> {
        let (partitions, ttl) = (self.shape.partitions, self.shape.ttl);
        let name = self.consumers[c].name.clone();
        let Phase::Online { belief, instance, leaving, .. } = &mut self.consumers[c].phase else {
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
                self.note(format!("{name}#{inc}@i{instance} told {} -> owns {owned:?}", brief(&command)));
                invariants::exclusive(self.beliefs())?;
            }
            Some(Err(error)) => {
                self.note(format!("{name}#{inc}@i{instance} stream ended: {:?} {error}", code_of(&error)));
                ensure!(
                    code_of(&error) != Code::Aborted,
                    "{name}#{inc}: its stream on i{instance} ended as replaced, but it registered nowhere since"
                );
                self.drop_stream(c, inc);
                if let Some((_, since)) = self.instances[instance].cut {
                    let fraction = (Instant::now() - since).as_secs_f64() / ttl.as_secs_f64();
                    self.outcome.fenced += 1;
                    self.outcome.max_fence_ttl = self.outcome.max_fence_ttl.max(fraction);
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
                let owned = std::mem::take(&mut belief.owned);
                self.note(format!("{name}#{inc}@i{instance} stream ended cleanly"));
                ensure!(leaving, "{name}#{inc}: the stream ended cleanly, but it never deregistered");
                ensure!(owned.is_empty(), "{name}#{inc}: its stream ended cleanly while it owns {owned:?}");
                self.drop_stream(c, inc);
            }
        }
        Ok(())
    }

    /// An item of a half-open stream: nobody acts on it; its end is noted.
    pub fn zombie_item(
        &mut self,
        inc: u64,
        c: usize,
        item: Option<Result<AssignmentCommand, CoordinatorError>>,
    ) {
        let ended = match item {
            Some(Ok(_)) => return,
            Some(Err(error)) => format!("{:?} {error}", code_of(&error)),
            None => "cleanly".into(),
        };
        self.zombies.retain(|(i, _, _)| *i != inc);
        self.note(format!("{}#{inc} (half-open) ended: {ended}", self.consumers[c].name));
    }

    pub fn reply(&mut self, reply: Reply) {
        match reply {
            Reply::Registered { consumer, attempt, generation, result } => {
                let instance = (attempt >> 32) as usize;
                let result = if self.instances[instance].generation == generation {
                    result
                } else {
                    Err(CoordinatorError::StreamEnded(StreamEnd::Crashed, "the instance crashed".into()))
                };
                self.registered(consumer, attempt, result);
            }
            Reply::Deregistered { consumer, inc, result } => self.deregistered(consumer, inc, result),
            Reply::Started { instance, result } => self.started(instance, result),
        }
    }

    fn registered(&mut self, c: usize, attempt: u64, result: Result<CommandStream, CoordinatorError>) {
        let consumer = &self.consumers[c];
        let current = consumer.attempt == attempt && matches!(consumer.phase, Phase::Registering);
        let name = consumer.name.clone();
        let instance = (attempt >> 32) as usize;
        match result {
            Ok(stream) if current && consumer.want => {
                self.next_inc += 1;
                let inc = self.next_inc;
                self.outcome.streams += 1;
                self.note(format!("{name}#{inc}@i{instance} registered"));
                self.consumers[c].phase =
                    Phase::Online { inc, instance, belief: Belief::default(), leaving: false };
                self.open.push((inc, c, stream));
            }
            Ok(_) => {
                // An abandoned attempt: the stream is dropped as the client's connection would be.
                self.note(format!("{name}: late registration via i{instance} dropped"));
                if current {
                    self.consumers[c].phase = Phase::Offline;
                }
            }
            Err(error) => {
                self.note(format!("{name}: register via i{instance} failed: {:?} {error}", code_of(&error)));
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
            Ok(action) => {
                self.note(format!("{name}#{inc}: deregistered, {action:?}; waits for its stream to end"))
            }
            Err(error) => {
                self.note(format!("{name}#{inc}: deregister failed: {:?} {error}", code_of(&error)));
                if code_of(&error) == Code::NotFound {
                    // It believes it is not registered: it exits.
                    self.drop_stream(c, inc);
                } else {
                    let wait = self.draw(&[7, inc, self.seq]).millis(100, 500);
                    self.after(wait, Agenda::Deregister { consumer: c, inc });
                }
            }
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
