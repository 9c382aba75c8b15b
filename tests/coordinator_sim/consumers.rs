//! What the handoff backend's consumers do besides registering and deregistering (shared:
//! `sim_support::cast`): answer warms and releases (with retries), and how the driver
//! keeps them clear of the known bugs outside strict mode.

use kafka_assigner::coordinator::ConsumerGroupCoordinator;
use kafka_assigner::server::status::code_of;
use tonic::Code;

use crate::driver::{Agenda, Phase, Reply, Sim, TOPIC};
use crate::model::Todo;

impl Sim {
    /// Known bug B (see `main.rs`): a consumer that goes away before its snapshot arrived
    /// (its instance's cache had not seen its registration) leaves its registration behind
    /// for good; so does one whose `Register` answer was lost and that never retries. Outside
    /// strict mode such a consumer is not made to go away.
    pub fn avoids_orphan(&mut self, c: usize) -> bool {
        let avoid = match &self.world.consumers[c].phase {
            Phase::Online { belief, .. } => !belief.snapshot,
            Phase::Registering => true,
            Phase::Offline => self.world.consumers[c].want,
        };
        if avoid {
            self.world
                .note(format!("{}: not made to go away now (known bug B)", self.world.consumers[c].name));
        }
        avoid
    }

    /// Known bug D (see `main.rs`): a `PartitionReady` from a consumer that has become
    /// `Draining` is accepted. Outside strict mode a consumer does not deregister while it
    /// warms or a ready of its is in flight.
    pub fn avoids_draining_ready(&mut self, c: usize) -> bool {
        let warming = matches!(&self.world.consumers[c].phase, Phase::Online { belief, .. } if !belief.warming.is_empty());
        let avoid = warming || self.readies[c] > 0;
        if avoid {
            self.world
                .note(format!("{}: does not deregister now (known bug D)", self.world.consumers[c].name));
        }
        avoid
    }

    /// Decides when (and whether) consumer `c` answers a warm or a release.
    pub fn plan_answer(&mut self, c: usize, inc: u64, todo: Todo) {
        let (kind, p) = match todo {
            Todo::Ready(p) => (5, p),
            Todo::Release(p) => (6, p),
        };
        let mut rng = self.world.draw(&[kind, inc, p as u64, self.outcome.commands]);
        if !self.world.quiescing && rng.below(8) == 0 {
            return; // it never answers (until the faults stop)
        }
        let wait = if self.world.quiescing { rng.millis(0, 100) } else { rng.millis(0, 1500) };
        // Mostly through its own instance, sometimes through another (whose cache may lag).
        // Known bug C (see `main.rs`): an instance whose cache lags may answer a ready "ok"
        // without writing anything; outside strict mode consumers use their own instance,
        // whose cache is at least as new as the command they answer.
        let other =
            rng.below(4) == 0 && (self.strict || self.shape.kind == crate::schedules::Kind::LostAnswers);
        let instance = if other { rng.below(8) as usize } else { usize::MAX };
        self.world.after(wait, Agenda::Answer { consumer: c, inc, todo, instance });
    }

    pub fn answer(&mut self, c: usize, inc: u64, todo: Todo, via: usize) {
        let strict = self.strict;
        let Phase::Online { inc: current, instance, belief, leaving } = &mut self.world.consumers[c].phase
        else {
            return;
        };
        if *current != inc {
            return;
        }
        let ready = match todo {
            // Known bug D (see `main.rs`): outside strict mode a leaving consumer does not
            // finish its warms.
            Todo::Ready(p) if belief.warming.contains_key(&p) && (strict || !*leaving) => Some((true, p)),
            Todo::Release(p) if belief.releasing.contains_key(&p) => {
                // It stops processing p, then says so.
                belief.releasing.remove(&p);
                belief.owned.remove(&p);
                Some((false, p))
            }
            _ => None,
        };
        let Some((ready, p)) = ready else { return };
        let own = *instance;
        self.call(c, inc, ready, p, if via == usize::MAX { own } else { via });
    }

    /// Consumer `c` (stream `inc`) calls `PartitionReady` (`ready`) or `PartitionReleased`
    /// about `p` through instance `via` (or the next running one).
    pub fn call(&mut self, c: usize, inc: u64, ready: bool, p: u32, via: usize) {
        let name = self.world.consumers[c].name.clone();
        let via = if ready { self.race_ready(c, inc, p, via) } else { via };
        let Some(i) = self.world.running(via) else { return };
        if ready {
            self.readies[c] += 1;
        }
        let (coordinator, replies) = (self.coordinator(i), self.world.replies_tx.clone());
        // Open bug G (see `main.rs`): while a registration the store expired early is being
        // written again, `PartitionReady` and `PartitionReleased` are refused `NOT_FOUND`,
        // which a client takes as final, leaving the handoff to its (wall-clock) timeout.
        // Unless told to run into it, a consumer whose stream is open tries again.
        let retry_not_found = !self.open_bugs;
        tokio::spawn(async move {
            let Some(coordinator) = coordinator else { return };
            let (what, result) = if ready {
                ("ready", coordinator.partition_ready(&name, TOPIC, p).await)
            } else {
                ("released", coordinator.partition_released(&name, TOPIC, p).await)
            };
            // A client tries again when the store was out of reach or the call lost a race.
            let retry = result.as_ref().is_err_and(|e| match code_of(e) {
                Code::Unavailable | Code::Aborted => true,
                Code::NotFound => retry_not_found,
                _ => false,
            });
            let outcome = match result {
                Ok(()) => "ok".to_string(),
                Err(e) => format!("{:?} {e}", code_of(&e)),
            };
            let line = format!("{name}#{inc} {what} {p} via i{i}: {outcome}");
            let _ = replies.send(Reply::Called { consumer: c, inc, ready, partition: p, line, retry });
        });
    }

    /// A retry of a failed call, while the stream it answers is open (and, for a ready,
    /// the warm still pending).
    pub fn retry_call(&mut self, c: usize, inc: u64, ready: bool, p: u32) {
        let Phase::Online { inc: current, instance, belief, .. } = &self.world.consumers[c].phase else {
            return;
        };
        if *current != inc || (ready && !belief.warming.contains_key(&p)) {
            return;
        }
        let own = *instance;
        self.call(c, inc, ready, p, own);
    }
}
