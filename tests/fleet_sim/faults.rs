//! What the loop does at a given instant: the schedule's actions (churn and store faults),
//! reconnects, restarts, the fencing deadline, and the quiet phase at the end.

use std::time::Duration;

use kafka_assigner::coordinator::ConsumerGroupCoordinator;
use kafka_assigner::store::AfterStall;

use crate::driver::{self, Agenda, Phase, Sim, TOPIC};
use crate::invariants::{self, Settled};
use crate::schedule::Action;
use crate::sim_support::cast;

impl Sim {
    /// Does one agenda item.
    pub async fn act(&mut self, what: Agenda) -> Result<(), String> {
        match what {
            Agenda::Act(action) => self.action(action).await,
            Agenda::Reconnect { consumer } => {
                let instance = self.world.draw(&[3, consumer as u64, self.world.seq]).below(8) as usize;
                self.world.join(consumer, instance);
            }
            Agenda::Deregister { consumer, inc } => self.world.deregister(consumer, inc, consumer + 1),
            Agenda::EndLossy { instance, token } => {
                if self.world.instances[instance].ext.lossy == token {
                    let faulty = &self.world.instances[instance].faulty;
                    faulty.lose_answers(0.0);
                    faulty.lose_next_txn_answers(0);
                    faulty.lag_watch(Duration::ZERO);
                }
            }
            Agenda::EndDelay { instance, token } => {
                if self.world.instances[instance].ext.delayed == token {
                    self.world.instances[instance].faulty.delay(Duration::ZERO, Duration::ZERO);
                }
            }
            Agenda::Restore { instance, cut } => self.world.restore(instance, cut),
            Agenda::FenceDeadline { instance, cut } => self.world.fence_deadline(instance, cut)?,
            Agenda::Restart { instance } => self.restart(instance),
            Agenda::Quiesce => self.quiesce(),
            Agenda::CheckSettled => self.check_settled().await?,
        }
        Ok(())
    }

    async fn action(&mut self, action: Action) {
        let (pool, n) = (self.shape.pool, self.world.instances.len());
        self.world.note(format!("action {action:?}"));
        match action {
            Action::Join { consumer, instance } => {
                if matches!(self.world.consumers[consumer % pool].phase, Phase::Offline) {
                    self.world.consumers[consumer % pool].want = true;
                }
                self.world.join(consumer % pool, instance);
            }
            Action::Leave { consumer, instance } => {
                if let Phase::Online { inc, leaving: false, .. } = self.world.consumers[consumer % pool].phase
                {
                    self.world.deregister(consumer % pool, inc, instance);
                }
            }
            Action::Crash { consumer, rejoin } => self.crash_consumer(consumer % pool, rejoin),
            Action::Move { consumer, instance, half_open } => {
                self.move_consumer(consumer % pool, instance, half_open)
            }
            Action::Lossy { instance, chance, next_txns, lag, period } => {
                let i = instance % n;
                self.lossy(i, period);
                let faulty = &self.world.instances[i].faulty;
                faulty.lose_answers(chance);
                faulty.lose_next_txn_answers(next_txns);
                faulty.lag_watch(lag);
            }
            Action::LossyJoin { consumer, instance, lag } => {
                let offline = |c: &usize| matches!(self.world.consumers[*c].phase, Phase::Offline);
                let Some(joiner) = (0..pool).map(|k| (consumer + k) % pool).find(offline) else {
                    return;
                };
                let Some(j) = self.world.running(instance) else { return };
                for i in 0..n {
                    self.lossy(i, lag * 4 + Duration::from_secs(1));
                    self.world.instances[i].faulty.lag_watch(lag);
                    if i != j {
                        self.world.instances[i].faulty.lose_next_txn_answers(1);
                    }
                }
                self.world.consumers[joiner].want = true;
                self.world.join(joiner, j);
            }
            Action::Delay { instance, high, period } => {
                let i = instance % n;
                self.world.instances[i].ext.delayed += 1;
                let token = self.world.instances[i].ext.delayed;
                self.world.instances[i].faulty.delay(Duration::ZERO, high);
                self.world.after(period, Agenda::EndDelay { instance: i, token });
            }
            Action::CutOff { instance, period } => {
                let i = instance % n;
                if self.world.begin_cut(i, period, self.shape.ttl).is_some() {
                    self.world.instances[i].faulty.cut_off();
                }
            }
            Action::Stall { instance, period, lose } => {
                let i = instance % n;
                if self.world.begin_cut(i, period, self.shape.ttl).is_some() {
                    let then = if lose { AfterStall::Lose } else { AfterStall::Deliver };
                    self.world.instances[i].faulty.stall(period, then);
                }
            }
            Action::CrashInstance { instance, restart } => self.crash_instance(instance % n, restart).await,
        }
    }

    /// Starts a lossy spell of `period` on instance `i` (ending any earlier one with it).
    fn lossy(&mut self, i: usize, period: Duration) {
        self.world.instances[i].ext.lossy += 1;
        let token = self.world.instances[i].ext.lossy;
        self.world.after(period, Agenda::EndLossy { instance: i, token });
    }

    /// The process of instance `i` dies: its consumers' connections break (they stop at
    /// once); half the time the store expires its sessions at once.
    async fn crash_instance(&mut self, i: usize, restart: Duration) {
        if self.world.instances.iter().filter(|x| x.coordinator.is_some()).count() < 2 {
            return;
        }
        let Some(coordinator) = self.world.instances[i].coordinator.take() else { return };
        coordinator.crash();
        self.world.instances[i].generation += 1;
        for c in 0..self.world.consumers.len() {
            if let Phase::Online { inc, instance, .. } = self.world.consumers[c].phase
                && instance == i
            {
                self.world
                    .note(format!("{}#{inc}: its connection to i{i} broke", self.world.consumers[c].name));
                self.world.drop_stream(c, inc);
                if self.world.consumers[c].want {
                    let wait = self.world.draw(&[4, inc]).millis(50, self.shape.ttl.as_millis() as u64);
                    self.world.after(wait, Agenda::Reconnect { consumer: c });
                }
            }
        }
        if self.world.draw(&[5, self.world.seq]).below(2) == 0 {
            let expired = self.world.instances[i].faulty.expire_all_sessions().await;
            self.world.note(format!("i{i} crashed; its sessions expire at once: {expired:?}"));
        }
        self.world.after(restart, Agenda::Restart { instance: i });
    }

    fn restart(&mut self, i: usize) {
        let shape = self.shape.clone();
        self.world.restart(i, |faulty| async move { driver::start(&faulty, &shape, i).await });
    }

    /// The faults stop: every instance is in touch and running, half-open connections are
    /// found dead, every consumer that wants to be online reconnects.
    fn quiesce(&mut self) {
        self.world.note("faults stop; the fleet settles".into());
        self.world.quiescing = true;
        for i in 0..self.world.instances.len() {
            cast::calm(&self.world.instances[i].faulty);
            self.world.instances[i].cut = None;
            self.world.instances[i].ext.lossy += 1;
            self.world.instances[i].ext.delayed += 1;
            self.restart(i);
        }
        self.world.zombies.clear();
        self.rejoin_all();
        self.world.after(Duration::from_millis(250), Agenda::CheckSettled);
    }

    /// Someone stays, and every consumer that wants to be online and is not registers.
    fn rejoin_all(&mut self) {
        if !self.world.consumers.iter().any(|c| c.want) {
            let c = self.world.draw(&[6]).below(self.world.consumers.len() as u64) as usize;
            self.world.consumers[c].want = true;
        }
        for c in 0..self.world.consumers.len() {
            self.world.join(c, c);
        }
    }

    /// (c) Within 20 TTL + 10 s of the faults stopping, the fleet is settled (`invariants::settled`).
    async fn check_settled(&mut self) -> Result<(), String> {
        let mut statuses = Vec::new();
        for instance in &self.world.instances {
            if let Some(coordinator) = &instance.coordinator {
                statuses.push(coordinator.status().await);
            }
        }
        let lingering = self.world.zombies.len()
            + self
                .world
                .consumers
                .iter()
                .filter(|c| matches!(c.phase, Phase::Online { leaving: true, .. }))
                .count();
        let settled = Settled {
            partitions: self.shape.partitions,
            truth: &self.truth,
            online: self.world.online(),
            lingering,
            statuses,
            topic: TOPIC,
        };
        let result = invariants::settled(&settled);
        match self.world.settled(result, self.shape.active, self.shape.ttl)? {
            Some(waited) => self.outcome.settled_after = waited,
            None => {
                self.rejoin_all();
                self.world.after(Duration::from_millis(250), Agenda::CheckSettled);
            }
        }
        Ok(())
    }
}
