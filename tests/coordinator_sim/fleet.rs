//! What the loop does at a given instant: the schedule's actions (consumer churn and store
//! faults), consumers' answers, reconnects, and the quiet phase at the end.

use std::sync::Arc;
use std::time::Duration;

use kafka_assigner::config::DrainPolicy;
use kafka_assigner::coordinator::{
    ConsumerGroupCoordinator, CoordinatorError, HandoffConfig, HandoffCoordinator,
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
pub async fn start(
    faulty: &FaultyStore,
    shape: &Shape,
    i: usize,
) -> Result<HandoffCoordinator, CoordinatorError> {
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
    pub fn running(&self, i: usize) -> Option<usize> {
        let n = self.instances.len();
        (0..n).map(|k| (i + k) % n).find(|k| self.instances[*k].coordinator.is_some())
    }

    pub fn coordinator(&self, i: usize) -> Option<HandoffCoordinator> {
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
            Agenda::Call { consumer, inc, ready, partition } => {
                self.retry_call(consumer, inc, ready, partition)
            }
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
            Agenda::Unstalled { instance, cut } => self.unstalled(instance, cut),
            Agenda::DropZombie { inc } => self.drop_zombie(inc),
            Agenda::Quiesce => self.quiesce(),
            Agenda::CheckSettled => self.check_settled().await?,
        }
        Ok(())
    }

    async fn action(&mut self, action: Action) {
        let pool = self.shape.pool;
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
            Action::Stall { instance, leader, period, at_write, lose } => {
                self.stall(instance, leader, period, at_write, lose);
            }
            Action::Revoke { delay, restart } => self.revoke(delay, restart).await,
            Action::RestartConsumer { consumer, instance } => {
                self.restart_consumer(consumer % pool, instance)
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
                self.after(restart, Agenda::Restart { instance: i });
            }
        }
    }

    fn faulty(&self, instance: usize) -> &FaultyStore {
        &self.instances[instance % self.instances.len()].faulty
    }

    fn cut_off(&mut self, i: usize, period: Duration, expire: bool) {
        if self.instances[i].cut.is_some() {
            return;
        }
        // Known bug A (see `main.rs`): a registration whose deletion falls in a cut-off
        // shorter than the TTL is never deleted. Outside strict mode, an instance is not
        // cut off while it has such a deletion pending.
        let pending = self.instances[i]
            .dropped_at
            .is_some_and(|at| Instant::now() < at + self.shape.ttl + Duration::from_millis(200));
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
        if self.instances[instance].cut.is_none_or(|(id, _)| id != cut) {
            return Ok(());
        }
        for c in &self.consumers {
            if let Phase::Online { inc, instance: i, belief, .. } = &c.phase {
                ensure!(
                    *i != instance,
                    "{}#{inc} still has an open stream on i{instance} (believing it owns {:?}) a whole TTL \
                     after i{instance} was cut off from (or stalled on) the store",
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
        let (faulty, shape, replies) =
            (self.instances[i].faulty.clone(), self.shape.clone(), self.replies_tx.clone());
        tokio::spawn(async move {
            let result = start(&faulty, &shape, i).await;
            let _ = replies.send(Reply::Started { instance: i, result });
        });
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
            faulty.end_stall();
            self.instances[i].cut = None;
            self.restart(i);
        }
        // The instances notice every half-open connection is dead.
        for (inc, _, _) in std::mem::take(&mut self.zombies) {
            self.note(format!("#{inc} (half-open): its connection is found dead"));
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
