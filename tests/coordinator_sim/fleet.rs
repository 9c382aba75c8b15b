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

use crate::driver::{Agenda, PREFIX, Phase, Sim, TOPIC};
use crate::invariants::{self, Settled};
use crate::model::Todo;
use crate::schedules::{Action, Shape};
use crate::sim_support::cast;

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
    /// Instance `i`'s coordinator, if it runs.
    pub fn coordinator(&self, i: usize) -> Option<HandoffCoordinator> {
        self.world.instances[i].coordinator.clone()
    }

    /// Does one agenda item.
    pub async fn act(&mut self, what: Agenda) -> Result<(), String> {
        match what {
            Agenda::Act(action) => self.action(action).await,
            Agenda::Reconnect { consumer } => {
                let instance = self.world.draw(&[3, consumer as u64, self.world.seq]).below(8) as usize;
                self.world.join(consumer, instance);
            }
            Agenda::Answer { consumer, inc, todo, instance } => self.answer(consumer, inc, todo, instance),
            Agenda::Deregister { consumer, inc } => self.world.deregister(consumer, inc, consumer),
            Agenda::Call { consumer, inc, ready, partition } => {
                self.retry_call(consumer, inc, ready, partition)
            }
            Agenda::StopLosing { instance } => self.world.instances[instance].faulty.lose_answers(0.0),
            Agenda::StopDelaying { instance } => {
                self.world.instances[instance].faulty.delay(Duration::ZERO, Duration::ZERO)
            }
            Agenda::Restore { instance, cut } => self.world.restore(instance, cut),
            Agenda::Expire { instance, cut } => {
                if self.world.instances[instance].cut.is_some_and(|(id, _)| id == cut) {
                    // Cut off for a whole TTL: the store may expire the session (and etcd
                    // would have); errors mean it already did.
                    let expired = self.world.instances[instance].faulty.expire_all_sessions().await;
                    self.world.note(format!("i{instance}: the store expires its sessions: {expired:?}"));
                }
            }
            Agenda::FenceDeadline { instance, cut } => self.world.fence_deadline(instance, cut)?,
            Agenda::Restart { instance } => self.restart(instance),
            Agenda::Unstalled { instance, cut } => self.unstalled(instance, cut),
            Agenda::GiveUp { consumer, inc, instance, stalled, armed } => {
                self.give_up(consumer, inc, instance, stalled, armed)
            }
            Agenda::DropZombie { inc } => self.drop_zombie(inc),
            Agenda::Quiesce => self.quiesce(),
            Agenda::CheckSettled => self.check_settled().await?,
        }
        Ok(())
    }

    async fn action(&mut self, action: Action) {
        let pool = self.shape.pool;
        self.world.note(format!("action {action:?}"));
        match action {
            Action::Join { consumer, instance } => {
                // A consumer that is online (or leaving) is not started twice.
                if matches!(self.world.consumers[consumer % pool].phase, Phase::Offline) {
                    self.world.consumers[consumer % pool].want = true;
                }
                self.world.join(consumer % pool, instance);
            }
            Action::CrashConsumer { consumer, rejoin } => {
                let c = consumer % pool;
                if !self.strict && self.avoids_orphan(c) {
                    return;
                }
                if let Phase::Online { inc, .. } = self.world.consumers[c].phase {
                    self.world.drop_stream(c, inc);
                }
                self.world.consumers[c].want = rejoin.is_some();
                if let Some(wait) = rejoin {
                    self.world.after(wait, Agenda::Reconnect { consumer: c });
                }
            }
            Action::Deregister { consumer, instance } => {
                let c = consumer % pool;
                if !self.strict && (self.avoids_orphan(c) || self.avoids_draining_ready(c)) {
                    return;
                }
                if let Phase::Online { inc, leaving: false, .. } = self.world.consumers[c].phase {
                    self.world.deregister(c, inc, instance);
                }
            }
            Action::LoseNext { instance, count } => self.faulty(instance).lose_next_answers(count),
            Action::LoseSome { instance, chance, period } => {
                let i = instance % self.world.instances.len();
                self.world.instances[i].faulty.lose_answers(chance);
                self.world.after(period, Agenda::StopLosing { instance: i });
            }
            Action::Delay { instance, high, period } => {
                let i = instance % self.world.instances.len();
                self.world.instances[i].faulty.delay(Duration::ZERO, high);
                self.world.after(period, Agenda::StopDelaying { instance: i });
            }
            Action::CutOff { instance, period, expire } => {
                self.cut_off(instance % self.world.instances.len(), period, expire);
            }
            Action::Outage { period } => {
                for i in 0..self.world.instances.len() {
                    self.cut_off(i, period, true);
                }
            }
            Action::Stall { instance, leader, period, at_write, lose } => {
                self.stall(instance, leader, period, at_write, lose);
            }
            Action::Revoke { instance, delay, restart } => self.revoke(instance, delay, restart).await,
            Action::RestartConsumer { consumer, instance } => {
                self.restart_consumer(consumer % pool, instance)
            }
            Action::DeregisterRace { consumer, instance, period, give_up } => {
                let c = consumer % pool;
                if !self.strict && (self.avoids_orphan(c) || self.avoids_draining_ready(c)) {
                    return;
                }
                self.deregister_race(c, instance, period, give_up);
            }
            Action::CrashInstance { instance, restart } => {
                let i = instance % self.world.instances.len();
                let running = self.world.instances.iter().filter(|x| x.coordinator.is_some()).count();
                if running < 2 {
                    return;
                }
                let Some(coordinator) = self.world.instances[i].coordinator.take() else { return };
                coordinator.crash();
                self.world.instances[i].generation += 1;
                if self.world.draw(&[4, self.world.seq]).below(2) == 0 {
                    // The process is dead and its consumers were cut: expiring its
                    // session early only speeds the failover up.
                    let expired = self.world.instances[i].faulty.expire_all_sessions().await;
                    self.world.note(format!("i{i} crashed; its sessions expire at once: {expired:?}"));
                }
                self.world.after(restart, Agenda::Restart { instance: i });
            }
        }
    }

    fn faulty(&self, instance: usize) -> &FaultyStore {
        &self.world.instances[instance % self.world.instances.len()].faulty
    }

    fn cut_off(&mut self, i: usize, period: Duration, expire: bool) {
        if self.world.instances[i].cut.is_some() {
            return;
        }
        // Known bug A (see `main.rs`): a registration whose deletion falls in a cut-off
        // shorter than the TTL is never deleted. Outside strict mode, an instance is not
        // cut off while it has such a deletion pending.
        let pending = self.world.instances[i]
            .ext
            .dropped_at
            .is_some_and(|at| Instant::now() < at + self.shape.ttl + Duration::from_millis(200));
        if !self.strict && pending {
            self.world.note(format!("i{i}: not cut off now (known bug A)"));
            return;
        }
        let ttl = self.shape.ttl;
        let Some(cut) = self.world.begin_cut(i, period, ttl) else { return };
        self.world.instances[i].faulty.cut_off();
        if expire {
            self.world.after(ttl + Duration::from_millis(10), Agenda::Expire { instance: i, cut });
        }
    }

    fn restart(&mut self, i: usize) {
        let shape = self.shape.clone();
        self.world.restart(i, |faulty| async move { start(&faulty, &shape, i).await });
    }

    /// The faults stop: every instance is back in touch and running, every consumer that
    /// wants to be online reconnects, and every warm and release is answered.
    fn quiesce(&mut self) {
        self.world.note("faults stop; the fleet settles".into());
        self.world.quiescing = true;
        for i in 0..self.world.instances.len() {
            cast::calm(&self.world.instances[i].faulty);
            self.world.instances[i].cut = None;
            self.restart(i);
        }
        // The instances notice every half-open connection is dead.
        for (inc, _, _) in std::mem::take(&mut self.world.zombies) {
            self.world.note(format!("#{inc} (half-open): its connection is found dead"));
        }
        self.keep_someone();
        for c in 0..self.world.consumers.len() {
            self.world.join(c, c);
            if let Phase::Online { inc, belief, .. } = &self.world.consumers[c].phase {
                let inc = *inc;
                let todos: Vec<Todo> = (belief.warming.keys().map(|p| Todo::Ready(*p)))
                    .chain(belief.releasing.keys().map(|p| Todo::Release(*p)))
                    .collect();
                for todo in todos {
                    self.plan_answer(c, inc, todo);
                }
            }
        }
        self.world.after(Duration::from_millis(250), Agenda::CheckSettled);
    }

    /// Someone stays to own the partitions (and to take over from those leaving).
    fn keep_someone(&mut self) {
        if !self.world.consumers.iter().any(|c| c.want)
            && let Some(c) = self.world.consumers.iter_mut().find(|c| matches!(c.phase, Phase::Offline))
        {
            c.want = true;
        }
    }

    async fn check_settled(&mut self) -> Result<(), String> {
        let mut statuses = Vec::new();
        for instance in &self.world.instances {
            if let Some(coordinator) = &instance.coordinator {
                statuses.push(coordinator.status().await);
            }
        }
        let settled = Settled {
            partitions: self.shape.partitions,
            truth: &self.truth,
            online: self.world.online(),
            statuses,
            topic: TOPIC,
        };
        let result = invariants::settled(&settled);
        match self.world.settled(result, self.shape.active, self.shape.ttl)? {
            Some(waited) => self.outcome.settled_after = waited,
            None => {
                // Consumers that want to be online but are not (a refused registration
                // while an instance restarted) try again.
                self.keep_someone();
                for c in 0..self.world.consumers.len() {
                    self.world.join(c, c + 1);
                }
                self.world.after(Duration::from_millis(250), Agenda::CheckSettled);
            }
        }
        Ok(())
    }
}
