//! What the loop does at a given instant: the schedule's actions (consumer churn and store
//! faults), consumers' answers, reconnects, and the quiet phase at the end.

use std::sync::Arc;
use std::time::Duration;

use kafka_assigner::config::DrainPolicy;
use kafka_assigner::coordinator::{
    ConsumerGroupCoordinator, CoordinatorError, ErrorCode, HandoffConfig, HandoffCoordinator,
};
use kafka_assigner::handoff::PlanConfig;
use kafka_assigner::metrics::Metrics;
use kafka_assigner::store::FaultyStore;
use tokio::time::Instant;

use crate::driver::{Agenda, PREFIX, Phase, Reply, Sim, TOPIC};
use crate::invariants::{self, Settled};
use crate::model::Todo;
use crate::schedules::{Action, Shape};

/// Starts instance `i` over its fault wrapper.
pub async fn start(faulty: &FaultyStore, shape: &Shape, i: usize) -> Result<HandoffCoordinator, CoordinatorError> {
    let config = HandoffConfig {
        instance_id: format!("i{i}"),
        prefix: PREFIX.into(),
        lease_ttl: shape.ttl,
        // Time limits run on the wall clock, which barely moves under paused time: they
        // never fire here (the pure simulation covers them).
        plan: PlanConfig { max_warming_per_consumer: shape.max_warming, ..PlanConfig::default() },
        // Deregistering drains when someone can take over; otherwise the partitions are
        // held for no time (the hold is wall-clock too).
        drain_policy: DrainPolicy::Drain,
        restart_grace: Duration::ZERO,
        topic_partitions: [(TOPIC.to_string(), shape.partitions)].into(),
        reconcile_interval: shape.reconcile,
        resync_interval: shape.ttl * 4,
        ..HandoffConfig::default()
    };
    HandoffCoordinator::start(Arc::new(faulty.clone()), config, Arc::new(Metrics::new())).await
}

impl Sim {
    /// A running instance: `i` (modulo the fleet) if it runs, else the next one that does.
    fn running(&self, i: usize) -> Option<usize> {
        let n = self.instances.len();
        (0..n).map(|k| (i + k) % n).find(|k| self.instances[*k].coordinator.is_some())
    }

    fn coordinator(&self, i: usize) -> Option<HandoffCoordinator> {
        self.instances[i].coordinator.clone()
    }

    /// Does one agenda item.
    pub async fn act(&mut self, what: Agenda) -> Result<(), String> {
        match what {
            Agenda::Act(action) => self.action(action).await,
            Agenda::Reconnect { consumer } => {
                let instance = self.draw(&[3, consumer as u64, self.seq]).below(8) as usize;
                self.join(consumer, instance);
            }
            Agenda::Answer { consumer, inc, todo, instance } => self.answer(consumer, inc, todo, instance),
            Agenda::Deregister { consumer, inc } => self.deregister(consumer, inc, consumer),
            Agenda::Call { consumer, inc, ready, partition } => self.retry_call(consumer, inc, ready, partition),
            Agenda::StopLosing { instance } => self.instances[instance].faulty.lose_answers(0.0),
            Agenda::StopDelaying { instance } => {
                self.instances[instance].faulty.delay(Duration::ZERO, Duration::ZERO)
            }
            Agenda::Restore { instance, cut } => {
                if self.instances[instance].cut.is_some_and(|(id, _)| id == cut) {
                    self.note(format!("i{instance} back in touch with the store"));
                    self.instances[instance].faulty.restore();
                    self.instances[instance].cut = None;
                }
            }
            Agenda::Expire { instance, cut } => {
                if self.instances[instance].cut.is_some_and(|(id, _)| id == cut) {
                    // Cut off for a whole TTL: the store may expire the session (and etcd
                    // would have); errors mean it already did.
                    let expired = self.instances[instance].faulty.expire_all_sessions().await;
                    self.note(format!("i{instance}: the store expires its sessions: {expired:?}"));
                }
            }
            Agenda::FenceDeadline { instance, cut } => self.fence_deadline(instance, cut)?,
            Agenda::Restart { instance } => self.restart(instance),
            Agenda::Quiesce => self.quiesce(),
            Agenda::CheckSettled => self.check_settled().await?,
        }
        Ok(())
    }

    async fn action(&mut self, action: Action) {
        let (pool, ttl) = (self.shape.pool, self.shape.ttl);
        self.note(format!("action {action:?}"));
        match action {
            Action::Join { consumer, instance } => {
                // A consumer that is online (or leaving) is not started twice.
                if matches!(self.consumers[consumer % pool].phase, Phase::Offline) {
                    self.consumers[consumer % pool].want = true;
                }
                self.join(consumer % pool, instance);
            }
            Action::CrashConsumer { consumer, rejoin } => {
                let c = consumer % pool;
                if !self.strict && self.avoids_orphan(c) {
                    return;
                }
                if let Phase::Online { inc, .. } = self.consumers[c].phase {
                    self.drop_stream(c, inc);
                }
                self.consumers[c].want = rejoin.is_some();
                if let Some(wait) = rejoin {
                    self.after(wait, Agenda::Reconnect { consumer: c });
                }
            }
            Action::Deregister { consumer, instance } => {
                let c = consumer % pool;
                if !self.strict && (self.avoids_orphan(c) || self.avoids_draining_ready(c)) {
                    return;
                }
                if let Phase::Online { inc, draining: false, .. } = self.consumers[c].phase {
                    self.deregister(c, inc, instance);
                }
            }
            Action::LoseNext { instance, count } => self.faulty(instance).lose_next_answers(count),
            Action::LoseSome { instance, chance, period } => {
                let i = instance % self.instances.len();
                self.instances[i].faulty.lose_answers(chance);
                self.after(period, Agenda::StopLosing { instance: i });
            }
            Action::Delay { instance, high, period } => {
                let i = instance % self.instances.len();
                self.instances[i].faulty.delay(Duration::ZERO, high);
                self.after(period, Agenda::StopDelaying { instance: i });
            }
            Action::CutOff { instance, period, expire } => {
                self.cut_off(instance % self.instances.len(), period, expire);
            }
            Action::Outage { period } => {
                for i in 0..self.instances.len() {
                    self.cut_off(i, period, true);
                }
            }
            Action::CrashInstance { instance, restart } => {
                let i = instance % self.instances.len();
                let running = self.instances.iter().filter(|x| x.coordinator.is_some()).count();
                if running < 2 {
                    return;
                }
                let Some(coordinator) = self.instances[i].coordinator.take() else { return };
                coordinator.crash();
                self.instances[i].generation += 1;
                if self.draw(&[4, self.seq]).below(2) == 0 {
                    // The process is dead and its consumers were cut: expiring its
                    // session early only speeds the failover up.
                    let expired = self.instances[i].faulty.expire_all_sessions().await;
                    self.note(format!("i{i} crashed; its sessions expire at once: {expired:?}"));
                }
                let _ = ttl;
                self.after(restart, Agenda::Restart { instance: i });
            }
        }
    }

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

    fn faulty(&self, instance: usize) -> &FaultyStore {
        &self.instances[instance % self.instances.len()].faulty
    }

    /// Known bug B (see `main.rs`): a consumer that goes away before its snapshot arrived
    /// (its instance's cache had not seen its registration) leaves its registration behind
    /// for good; so does one whose `Register` answer was lost and that never retries. Outside
    /// strict mode such a consumer is not made to go away.
    fn avoids_orphan(&mut self, c: usize) -> bool {
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
    fn avoids_draining_ready(&mut self, c: usize) -> bool {
        let warming = matches!(&self.consumers[c].phase, Phase::Online { belief, .. } if !belief.warming.is_empty());
        let avoid = warming || self.consumers[c].readies > 0;
        if avoid {
            self.note(format!("{}: does not deregister now (known bug D)", self.consumers[c].name));
        }
        avoid
    }

    fn cut_off(&mut self, i: usize, period: Duration, expire: bool) {
        if self.instances[i].cut.is_some() {
            return;
        }
        // Known bug A (see `main.rs`): a registration whose deletion falls in a cut-off
        // shorter than the TTL is never deleted. Outside strict mode, an instance is not
        // cut off while it has such a deletion pending.
        let pending = self.instances[i].dropped_at.is_some_and(|at| {
            Instant::now() < at + self.shape.ttl + Duration::from_millis(200)
        });
        if !self.strict && pending {
            self.note(format!("i{i}: not cut off now (known bug A)"));
            return;
        }
        self.seq += 1;
        let (cut, ttl) = (self.seq, self.shape.ttl);
        self.instances[i].faulty.cut_off();
        self.instances[i].cut = Some((cut, Instant::now()));
        self.after(period, Agenda::Restore { instance: i, cut });
        self.after(ttl, Agenda::FenceDeadline { instance: i, cut });
        if expire {
            self.after(ttl + Duration::from_millis(10), Agenda::Expire { instance: i, cut });
        }
    }

    /// An instance cut off for a whole TTL may have lost its session in the store: none of
    /// its consumers may still believe it owns anything (their streams ended).
    fn fence_deadline(&mut self, instance: usize, cut: u64) -> Result<(), String> {
        if !self.instances[instance].cut.is_some_and(|(id, _)| id == cut) {
            return Ok(());
        }
        for c in &self.consumers {
            if let Phase::Online { inc, instance: i, belief, .. } = &c.phase {
                ensure!(
                    *i != instance,
                    "{}#{inc} still has an open stream on i{instance} (believing it owns {:?}) a whole TTL \
                     after i{instance} was cut off from the store",
                    c.name,
                    belief.owned
                );
            }
        }
        Ok(())
    }

    fn restart(&mut self, i: usize) {
        if self.instances[i].coordinator.is_some() || self.instances[i].starting {
            return;
        }
        self.instances[i].starting = true;
        let (faulty, shape, replies) = (self.instances[i].faulty.clone(), self.shape.clone(), self.replies_tx.clone());
        tokio::spawn(async move {
            let result = start(&faulty, &shape, i).await;
            let _ = replies.send(Reply::Started { instance: i, result });
        });
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
        let other = rng.below(4) == 0 && (self.strict || self.shape.kind == crate::schedules::Kind::LostAnswers);
        let instance = if other { rng.below(8) as usize } else { usize::MAX };
        self.after(wait, Agenda::Answer { consumer: c, inc, todo, instance });
    }

    fn answer(&mut self, c: usize, inc: u64, todo: Todo, via: usize) {
        let name = self.consumers[c].name.clone();
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
    fn call(&mut self, c: usize, inc: u64, ready: bool, p: u32, via: usize) {
        let name = self.consumers[c].name.clone();
        let Some(i) = self.running(via) else { return };
        if ready {
            self.consumers[c].readies += 1;
        }
        let (coordinator, replies) = (self.coordinator(i), self.replies_tx.clone());
        tokio::spawn(async move {
            let Some(coordinator) = coordinator else { return };
            let (what, result) = if ready {
                ("ready", coordinator.partition_ready(&name, TOPIC, p).await)
            } else {
                ("released", coordinator.partition_released(&name, TOPIC, p).await)
            };
            // A client tries again when the store was out of reach or the call lost a race.
            let retry = result.as_ref().is_err_and(|e| matches!(e.code(), ErrorCode::Unavailable | ErrorCode::Aborted));
            let outcome = match result {
                Ok(()) => "ok".to_string(),
                Err(e) => format!("{:?} {e}", e.code()),
            };
            let line = format!("{name}#{inc} {what} {p} via i{i}: {outcome}");
            let _ = replies.send(Reply::Called { consumer: c, inc, ready, partition: p, line, retry });
        });
    }

    /// A retry of a failed call, while the stream it answers is open (and, for a ready,
    /// the warm still pending).
    fn retry_call(&mut self, c: usize, inc: u64, ready: bool, p: u32) {
        let Phase::Online { inc: current, instance, belief, .. } = &self.consumers[c].phase else { return };
        if *current != inc || (ready && !belief.warming.contains_key(&p)) {
            return;
        }
        let own = *instance;
        self.call(c, inc, ready, p, own);
    }

    /// The faults stop: every instance is back in touch and running, every consumer that
    /// wants to be online reconnects, and every warm and release is answered.
    fn quiesce(&mut self) {
        self.note("faults stop; the fleet settles".into());
        self.quiescing = true;
        for i in 0..self.instances.len() {
            let faulty = &self.instances[i].faulty;
            faulty.restore();
            faulty.lose_answers(0.0);
            faulty.lose_next_answers(0);
            faulty.delay(Duration::ZERO, Duration::ZERO);
            self.instances[i].cut = None;
            self.restart(i);
        }
        self.keep_someone();
        for c in 0..self.consumers.len() {
            self.join(c, c);
            if let Phase::Online { inc, belief, .. } = &self.consumers[c].phase {
                let inc = *inc;
                let todos: Vec<Todo> = (belief.warming.keys().map(|p| Todo::Ready(*p)))
                    .chain(belief.releasing.keys().map(|p| Todo::Release(*p)))
                    .collect();
                for todo in todos {
                    self.plan_answer(c, inc, todo);
                }
            }
        }
        self.after(Duration::from_millis(250), Agenda::CheckSettled);
    }

    /// Someone stays to own the partitions (and to take over from those leaving).
    fn keep_someone(&mut self) {
        if !self.consumers.iter().any(|c| c.want)
            && let Some(c) = self.consumers.iter_mut().find(|c| matches!(c.phase, Phase::Offline))
        {
            c.want = true;
        }
    }

    async fn check_settled(&mut self) -> Result<(), String> {
        let mut statuses = Vec::new();
        for instance in &self.instances {
            if let Some(coordinator) = &instance.coordinator {
                statuses.push(coordinator.status().await);
            }
        }
        let settled = Settled {
            partitions: self.shape.partitions,
            truth: &self.truth,
            online: self.online(),
            statuses,
            topic: TOPIC,
        };
        let result = invariants::settled(&settled);
        let waited = Instant::now() - (self.start + self.shape.active);
        match result {
            Ok(()) => {
                self.outcome.settled_after = waited;
                self.done = true;
            }
            Err(why) if waited > self.shape.ttl * 20 + Duration::from_secs(10) => {
                return Err(format!("not settled {waited:?} after the faults stopped: {why}"));
            }
            Err(_) => {
                // Consumers that want to be online but are not (a refused registration
                // while an instance restarted) try again.
                self.keep_someone();
                for c in 0..self.consumers.len() {
                    self.join(c, c + 1);
                }
                self.after(Duration::from_millis(250), Agenda::CheckSettled);
            }
        }
        Ok(())
    }
}
