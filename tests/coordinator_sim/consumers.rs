//! What the consumers do: register, answer warms and releases (with retries), deregister,
//! and how the driver keeps them clear of the known bugs outside strict mode.

use std::time::Duration;

use kafka_assigner::coordinator::ConsumerGroupCoordinator;
use kafka_assigner::server::status::code_of;
use tonic::Code;

use crate::driver::{Agenda, Phase, Reply, Sim, TOPIC};
use crate::model::Todo;

impl Sim {
    /// Consumer `c` (stream `inc`) deregisters through `instance`. From now on it is
    /// leaving: even if the answer is lost, its stream may end cleanly once drained.
    pub fn deregister(&mut self, c: usize, inc: u64, instance: usize) {
        let name = self.consumers[c].name.clone();
        let running = self.running(instance);
        let (Phase::Online { inc: current, draining, .. }, Some(i)) = (&mut self.consumers[c].phase, running)
        else {
            return;
        };
        if *current != inc {
            return;
        }
        *draining = true;
        self.consumers[c].want = false;
        let coordinator = self.coordinator(i);
        let replies = self.replies_tx.clone();
        tokio::spawn(async move {
            let Some(coordinator) = coordinator else { return };
            let result = coordinator.deregister(&name).await;
            let _ = replies.send(Reply::Deregistered { consumer: c, inc, result });
        });
    }

    /// Known bug B (see `main.rs`): a consumer that goes away before its snapshot arrived
    /// (its instance's cache had not seen its registration) leaves its registration behind
    /// for good; so does one whose `Register` answer was lost and that never retries. Outside
    /// strict mode such a consumer is not made to go away.
    pub fn avoids_orphan(&mut self, c: usize) -> bool {
        let avoid = match &self.consumers[c].phase {
            Phase::Online { belief, .. } => !belief.snapshot,
            Phase::Registering => true,
            Phase::Offline => self.consumers[c].want,
        };
        if avoid {
            self.note(format!("{}: not made to go away now (known bug B)", self.consumers[c].name));
        }
        avoid
    }

    /// Known bug D (see `main.rs`): a `PartitionReady` from a consumer that has become
    /// `Draining` is accepted. Outside strict mode a consumer does not deregister while it
    /// warms or a ready of its is in flight.
    pub fn avoids_draining_ready(&mut self, c: usize) -> bool {
        let warming =
            matches!(&self.consumers[c].phase, Phase::Online { belief, .. } if !belief.warming.is_empty());
        let avoid = warming || self.consumers[c].readies > 0;
        if avoid {
            self.note(format!("{}: does not deregister now (known bug D)", self.consumers[c].name));
        }
        avoid
    }

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
        // The attempt names the instance in its high half (the reply needs it).
        consumer.attempt = ((i as u64) << 32) | ((consumer.attempt + 1) & 0xFFFF_FFFF);
        consumer.phase = Phase::Registering;
        let (attempt, name, coordinator) = (consumer.attempt, consumer.name.clone(), self.coordinator(i));
        self.note(format!("{name} registers via i{i}"));
        let (replies, generation) = (self.replies_tx.clone(), self.instances[i].generation);
        tokio::spawn(async move {
            let Some(coordinator) = coordinator else { return };
            let result = coordinator.register(&name, TOPIC).await;
            let _ = replies.send(Reply::Registered { consumer: c, attempt, generation, result });
        });
    }

    /// Decides when (and whether) consumer `c` answers a warm or a release.
    pub fn plan_answer(&mut self, c: usize, inc: u64, todo: Todo) {
        let (kind, p) = match todo {
            Todo::Ready(p) => (5, p),
            Todo::Release(p) => (6, p),
        };
        let mut rng = self.draw(&[kind, inc, p as u64, self.outcome.commands]);
        if !self.quiescing && rng.below(8) == 0 {
            return; // it never answers (until the faults stop)
        }
        let wait = if self.quiescing { rng.millis(0, 100) } else { rng.millis(0, 1500) };
        // Mostly through its own instance, sometimes through another (whose cache may lag).
        // Known bug C (see `main.rs`): an instance whose cache lags may answer a ready "ok"
        // without writing anything; outside strict mode consumers use their own instance,
        // whose cache is at least as new as the command they answer.
        let other =
            rng.below(4) == 0 && (self.strict || self.shape.kind == crate::schedules::Kind::LostAnswers);
        let instance = if other { rng.below(8) as usize } else { usize::MAX };
        self.after(wait, Agenda::Answer { consumer: c, inc, todo, instance });
    }

    pub fn answer(&mut self, c: usize, inc: u64, todo: Todo, via: usize) {
        let strict = self.strict;
        let Phase::Online { inc: current, instance, belief, draining } = &mut self.consumers[c].phase else {
            return;
        };
        if *current != inc {
            return;
        }
        let ready = match todo {
            // Known bug D (see `main.rs`): outside strict mode a leaving consumer does not
            // finish its warms.
            Todo::Ready(p) if belief.warming.contains_key(&p) && (strict || !*draining) => Some((true, p)),
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
        let name = self.consumers[c].name.clone();
        let via = if ready { self.race_ready(c, inc, p, via) } else { via };
        let Some(i) = self.running(via) else { return };
        if ready {
            self.consumers[c].readies += 1;
        }
        let (coordinator, replies) = (self.coordinator(i), self.replies_tx.clone());
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
        let Phase::Online { inc: current, instance, belief, .. } = &self.consumers[c].phase else { return };
        if *current != inc || (ready && !belief.warming.contains_key(&p)) {
            return;
        }
        let own = *instance;
        self.call(c, inc, ready, p, own);
    }
}
