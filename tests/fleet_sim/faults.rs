//! What the loop does at a given instant: the schedule's actions (churn and store faults),
//! reconnects, restarts, the fencing deadline, and the quiet phase at the end.

use std::time::Duration;

use kafka_assigner::coordinator::{ConsumerGroupCoordinator, CoordinatorError, FleetCoordinator};
use kafka_assigner::store::AfterStall;
use tokio::time::Instant;

use crate::driver::{self, Agenda, Phase, Reply, Sim, TOPIC};
use crate::invariants::{self, Settled};
use crate::schedule::Action;

impl Sim {
    /// Does one agenda item.
    pub async fn act(&mut self, what: Agenda) -> Result<(), String> {
        match what {
            Agenda::Act(action) => self.action(action).await,
            Agenda::Reconnect { consumer } => {
                let instance = self.draw(&[3, consumer as u64, self.seq]).below(8) as usize;
                self.join(consumer, instance);
            }
            Agenda::Deregister { consumer, inc } => self.deregister(consumer, inc, consumer + 1),
            Agenda::EndLossy { instance, token } => {
                if self.instances[instance].lossy == token {
                    let faulty = &self.instances[instance].faulty;
                    faulty.lose_answers(0.0);
                    faulty.lose_next_txn_answers(0);
                    faulty.lag_watch(Duration::ZERO);
                }
            }
            Agenda::EndDelay { instance, token } => {
                if self.instances[instance].delayed == token {
                    self.instances[instance].faulty.delay(Duration::ZERO, Duration::ZERO);
                }
            }
            Agenda::Restore { instance, cut } => {
                if self.instances[instance].cut.is_some_and(|(id, _)| id == cut) {
                    self.note(format!("i{instance} back in touch with the store"));
                    self.instances[instance].faulty.restore();
                    self.instances[instance].cut = None;
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
        let (pool, n) = (self.shape.pool, self.instances.len());
        self.note(format!("action {action:?}"));
        match action {
            Action::Join { consumer, instance } => {
                if matches!(self.consumers[consumer % pool].phase, Phase::Offline) {
                    self.consumers[consumer % pool].want = true;
                }
                self.join(consumer % pool, instance);
            }
            Action::Leave { consumer, instance } => {
                if let Phase::Online { inc, leaving: false, .. } = self.consumers[consumer % pool].phase {
                    self.deregister(consumer % pool, inc, instance);
                }
            }
            Action::Crash { consumer, rejoin } => self.crash_consumer(consumer % pool, rejoin),
            Action::Move { consumer, instance, half_open } => {
                self.move_consumer(consumer % pool, instance, half_open)
            }
            Action::Lossy { instance, chance, next_txns, lag, period } => {
                let i = instance % n;
                self.lossy(i, period);
                let faulty = &self.instances[i].faulty;
                faulty.lose_answers(chance);
                faulty.lose_next_txn_answers(next_txns);
                faulty.lag_watch(lag);
            }
            Action::LossyJoin { consumer, instance, lag } => {
                let offline = |c: &usize| matches!(self.consumers[*c].phase, Phase::Offline);
                let Some(joiner) = (0..pool).map(|k| (consumer + k) % pool).find(offline) else {
                    return;
                };
                let Some(j) = self.running(instance) else { return };
                for i in 0..n {
                    self.lossy(i, lag * 4 + Duration::from_secs(1));
                    self.instances[i].faulty.lag_watch(lag);
                    if i != j {
                        self.instances[i].faulty.lose_next_txn_answers(1);
                    }
                }
                self.consumers[joiner].want = true;
                self.join(joiner, j);
            }
            Action::Delay { instance, high, period } => {
                let i = instance % n;
                self.instances[i].delayed += 1;
                let token = self.instances[i].delayed;
                self.instances[i].faulty.delay(Duration::ZERO, high);
                self.after(period, Agenda::EndDelay { instance: i, token });
            }
            Action::CutOff { instance, period } => {
                let i = instance % n;
                if self.begin_cut(i, period) {
                    self.instances[i].faulty.cut_off();
                }
            }
            Action::Stall { instance, period, lose } => {
                let i = instance % n;
                if self.begin_cut(i, period) {
                    let then = if lose { AfterStall::Lose } else { AfterStall::Deliver };
                    self.instances[i].faulty.stall(period, then);
                }
            }
            Action::CrashInstance { instance, restart } => self.crash_instance(instance % n, restart).await,
        }
    }

    /// Starts a lossy spell of `period` on instance `i` (ending any earlier one with it).
    fn lossy(&mut self, i: usize, period: Duration) {
        self.instances[i].lossy += 1;
        let token = self.instances[i].lossy;
        self.after(period, Agenda::EndLossy { instance: i, token });
    }

    /// Records a cut-off (or stall) of instance `i` for `period`; false if one is in force.
    fn begin_cut(&mut self, i: usize, period: Duration) -> bool {
        if self.instances[i].cut.is_some() {
            return false;
        }
        self.seq += 1;
        let cut = self.seq;
        self.instances[i].cut = Some((cut, Instant::now()));
        self.after(period, Agenda::Restore { instance: i, cut });
        self.after(self.shape.ttl, Agenda::FenceDeadline { instance: i, cut });
        true
    }

    /// (d) An instance out of touch for a whole TTL (its session may have expired) holds no
    /// open stream: every consumer of it was told to stop and its stream ended.
    fn fence_deadline(&mut self, instance: usize, cut: u64) -> Result<(), String> {
        if self.instances[instance].cut.is_none_or(|(id, _)| id != cut) {
            return Ok(());
        }
        for c in &self.consumers {
            if let Phase::Online { inc, instance: i, belief, .. } = &c.phase {
                ensure!(
                    *i != instance,
                    "{}#{inc} still has an open stream on i{instance} (believing it owns {:?}) a TTL after \
                     i{instance} lost touch with the store",
                    c.name,
                    belief.owned
                );
            }
        }
        Ok(())
    }

    /// The process of instance `i` dies: its consumers' connections break (they stop at
    /// once); half the time the store expires its sessions at once.
    async fn crash_instance(&mut self, i: usize, restart: Duration) {
        if self.instances.iter().filter(|x| x.coordinator.is_some()).count() < 2 {
            return;
        }
        let Some(coordinator) = self.instances[i].coordinator.take() else { return };
        coordinator.crash();
        self.instances[i].generation += 1;
        for c in 0..self.consumers.len() {
            if let Phase::Online { inc, instance, .. } = self.consumers[c].phase
                && instance == i
            {
                self.note(format!("{}#{inc}: its connection to i{i} broke", self.consumers[c].name));
                self.drop_stream(c, inc);
                if self.consumers[c].want {
                    let wait = self.draw(&[4, inc]).millis(50, self.shape.ttl.as_millis() as u64);
                    self.after(wait, Agenda::Reconnect { consumer: c });
                }
            }
        }
        if self.draw(&[5, self.seq]).below(2) == 0 {
            let expired = self.instances[i].faulty.expire_all_sessions().await;
            self.note(format!("i{i} crashed; its sessions expire at once: {expired:?}"));
        }
        self.after(restart, Agenda::Restart { instance: i });
    }

    fn restart(&mut self, i: usize) {
        if self.instances[i].coordinator.is_some() || self.instances[i].starting {
            return;
        }
        self.instances[i].starting = true;
        let (faulty, shape, replies) =
            (self.instances[i].faulty.clone(), self.shape.clone(), self.replies_tx.clone());
        tokio::spawn(async move {
            let result = driver::start(&faulty, &shape, i).await;
            let _ = replies.send(Reply::Started { instance: i, result });
        });
    }

    pub fn started(&mut self, i: usize, result: Result<FleetCoordinator, CoordinatorError>) {
        self.instances[i].starting = false;
        match result {
            Ok(coordinator) => {
                self.note(format!("i{i} restarted"));
                self.instances[i].coordinator = Some(coordinator);
            }
            Err(error) => {
                self.note(format!("i{i} cannot start: {error}; retrying"));
                self.after(Duration::from_millis(500), Agenda::Restart { instance: i });
            }
        }
    }

    /// The faults stop: every instance is in touch and running, half-open connections are
    /// found dead, every consumer that wants to be online reconnects.
    fn quiesce(&mut self) {
        self.note("faults stop; the fleet settles".into());
        self.quiescing = true;
        for i in 0..self.instances.len() {
            let faulty = &self.instances[i].faulty;
            faulty.restore();
            faulty.end_stall();
            faulty.lose_answers(0.0);
            faulty.lose_next_answers(0);
            faulty.lose_next_txn_answers(0);
            faulty.delay(Duration::ZERO, Duration::ZERO);
            faulty.lag_watch(Duration::ZERO);
            self.instances[i].cut = None;
            self.instances[i].lossy += 1;
            self.instances[i].delayed += 1;
            self.restart(i);
        }
        self.zombies.clear();
        self.rejoin_all();
        self.after(Duration::from_millis(250), Agenda::CheckSettled);
    }

    /// Someone stays, and every consumer that wants to be online and is not registers.
    fn rejoin_all(&mut self) {
        if !self.consumers.iter().any(|c| c.want) {
            let c = self.draw(&[6]).below(self.consumers.len() as u64) as usize;
            self.consumers[c].want = true;
        }
        for c in 0..self.consumers.len() {
            self.join(c, c);
        }
    }

    /// (c) Within 20 TTL + 10 s of the faults stopping, the fleet is settled (`invariants::settled`).
    async fn check_settled(&mut self) -> Result<(), String> {
        let mut statuses = Vec::new();
        for instance in &self.instances {
            if let Some(coordinator) = &instance.coordinator {
                statuses.push(coordinator.status().await);
            }
        }
        let online = self
            .consumers
            .iter()
            .filter_map(|c| match &c.phase {
                Phase::Online { belief, leaving: false, .. } if c.want => Some((c.name.as_str(), belief)),
                _ => None,
            })
            .collect();
        let lingering = self.zombies.len()
            + self
                .consumers
                .iter()
                .filter(|c| matches!(c.phase, Phase::Online { leaving: true, .. }))
                .count();
        let settled = Settled {
            partitions: self.shape.partitions,
            truth: &self.truth,
            online,
            lingering,
            statuses,
            topic: TOPIC,
        };
        let result = invariants::settled(&settled);
        let waited = Instant::now() - (self.start + self.shape.active);
        match result {
            Ok(()) => {
                self.note(format!("settled {waited:?} after the faults stopped"));
                self.outcome.settled_after = waited;
                self.done = true;
            }
            Err(why) if waited > self.shape.ttl * 20 + Duration::from_secs(10) => {
                return Err(format!("not settled {waited:?} after the faults stopped: {why}"));
            }
            Err(_) => {
                self.rejoin_all();
                self.after(Duration::from_millis(250), Agenda::CheckSettled);
            }
        }
        Ok(())
    }
}
