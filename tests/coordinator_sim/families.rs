//! The targeted families (`Kind::Stalls`, `Kind::Revokes`, `Kind::ReadyRaces`): faults the
//! random kinds reach too rarely to catch what they would show, drawn so they do.
//!
//! * **A deposed leader's write lands late** (stalls). A leader's connection stalls from its
//!   next write of ownership (its plan) for longer than the TTL: the store expires its
//!   session, another instance wins, and the held plan reaches the store after that. The
//!   fence must refuse it (checked in `model.rs`: only the instance holding the leader key
//!   moves partitions by plan).
//! * **Delayed answers lost** (stalls). A stall that ends by resetting the connection loses
//!   the answers of everything it held: writes applied late, and answered never.
//! * **A ready lands late** (ready races). A consumer's `PartitionReady` goes through a
//!   non-leader whose connection stalls from that write on, while every offline consumer
//!   joins elsewhere: quotas shrink, and the leader may give the warm's partition another
//!   target before the held ready lands. It must then change nothing (`model.rs`: every
//!   revision is a step of the handoff rules). The group starts small and the warm cap
//!   high, so newcomers warm more than a shrunken quota leaves them.
//! * **An early expiry.** The store expires the leader's session while it is in touch: its
//!   streams stay open and their registrations are written again (the rebind); the new
//!   leader must leave their partitions alone until then (the settle period), or move them
//!   only after the old owner was told (`invariants.rs`). Its answers are slowed first, so
//!   its consumers hear of any move later than the new owner would.
//! * **A `Deregister` lands late** (stalls). A consumer's `Deregister` is decided on the
//!   record it read, and its write held by a stall of its instance's connection; the
//!   consumer gives up on the call and restarts on another instance, which writes its new
//!   registration meanwhile. The held write must then change nothing: were it to land, the
//!   old registration would take the name back from the live one (`model.rs`: a
//!   registration id never replaces another; `replies.rs`: a live consumer's stream is
//!   never ended as replaced).
//! * **A restart while the old stream is open.** A consumer restarts on another instance
//!   while its old stream stays open (a half-open connection); with an early expiry at the
//!   same time, the rebind of the old registration must not take the name back from the
//!   new one (`model.rs`: a registration id never replaces another; `replies.rs`: a live
//!   consumer's stream is never ended as replaced, since it never registered again).

use std::time::Duration;

use kafka_assigner::store::{AfterStall, Op, Stall, Txn};
use tokio::time::Instant;

use crate::driver::{Agenda, Phase, Sim};
use crate::schedules::{Action, Kind, Rng, churn};

/// Draws one action of a targeted family: churn 6 in 10, a restart with the old stream
/// open 1 in 10, the family's fault otherwise.
pub fn draw_action(kind: Kind, ttl: Duration, rng: &mut Rng) -> Option<Action> {
    let consumer = rng.below(8) as usize;
    let instance = rng.below(8) as usize;
    let ttl_ms = ttl.as_millis() as u64;
    if kind == Kind::ReadyRaces {
        // Churn only, less of it: the bursts come with the readies.
        return (rng.below(10) < 4).then(|| churn(consumer, instance, ttl, rng));
    }
    match rng.below(10) {
        0..=5 => return Some(churn(consumer, instance, ttl, rng)),
        6 => return Some(Action::RestartConsumer { consumer, instance }),
        7 if kind == Kind::Stalls => {
            // Held past the new registration, short of the fence.
            let (period, give_up) = (rng.millis(ttl_ms / 5, ttl_ms * 3 / 5), rng.millis(10, ttl_ms / 10));
            return Some(Action::DeregisterRace { consumer, instance, period, give_up });
        }
        _ => {}
    }
    Some(match kind {
        Kind::Revokes => {
            let delay = match rng.below(4) {
                0 => Duration::ZERO,
                _ => rng.millis(ttl_ms / 20, ttl_ms / 8),
            };
            let restart =
                (rng.below(3) != 0).then(|| (consumer, rng.millis(0, delay.as_millis() as u64 / 4)));
            // Half the time any instance's, leader or not: the leader must then tell an
            // interrupted registration (its instance record went with it) from a departed one.
            let instance = (rng.below(2) == 0).then_some(instance);
            Action::Revoke { instance, delay, restart }
        }
        _ => {
            // Short (no fence: late requests and answers) or past the TTL (the session
            // expires, leadership moves).
            let period = match rng.below(2) {
                0 => rng.millis(50, ttl_ms * 3 / 5),
                _ => rng.millis(ttl_ms * 11 / 10, ttl_ms * 5 / 2),
            };
            Action::Stall {
                instance,
                leader: rng.below(2) == 0,
                period,
                at_write: rng.below(3) != 0,
                lose: rng.below(3) == 0,
            }
        }
    })
}

/// Whether `txn` writes a key under any of `folders` (`/assignments/`, ...).
fn writes_under(txn: &Txn, folders: &[&str]) -> bool {
    txn.ops.iter().any(|op| {
        let (Op::Put { key, .. } | Op::Delete { key }) = op;
        folders.iter().any(|folder| key.contains(folder))
    })
}

/// Whether `txn` writes a consumer's registration.
fn writes_registration(txn: &Txn) -> bool {
    writes_under(txn, &["/consumers/"])
}

/// Whether `txn` writes an assignment or a handoff record.
fn writes_ownership(txn: &Txn) -> bool {
    writes_under(txn, &["/assignments/", "/handoffs/"])
}

impl Sim {
    /// The instance that leads now, if one does.
    pub fn leader(&self) -> Option<usize> {
        (0..self.world.instances.len())
            .find(|i| self.world.instances[*i].coordinator.as_ref().is_some_and(|c| c.is_leader()))
    }

    pub fn stall(&mut self, instance: usize, leader: bool, period: Duration, at_write: bool, lose: bool) {
        let i = if leader {
            self.leader().unwrap_or(instance % self.world.instances.len())
        } else {
            instance % self.world.instances.len()
        };
        if self.world.instances[i].cut.is_some() {
            return;
        }
        let then = if lose { AfterStall::Lose } else { AfterStall::Deliver };
        let faulty = &self.world.instances[i].faulty;
        if at_write {
            faulty.stall_at_txn(period, then, writes_ownership);
        } else {
            faulty.stall(period, then);
        }
        self.world
            .note(format!("i{i}: stall armed ({period:?}, {then:?}, at next ownership write: {at_write})"));
    }

    /// Notes the stalls that began (an armed one starts when its write comes): while one
    /// lasts, the instance is out of touch as if cut off, and held to the same fence.
    pub fn observe_stalls(&mut self) {
        for i in 0..self.world.instances.len() {
            let Some(stall) = self.world.instances[i].faulty.last_stall() else { continue };
            if stall.id == self.world.instances[i].ext.stall_seen {
                continue;
            }
            self.world.instances[i].ext.stall_seen = stall.id;
            self.stalled(i, stall);
        }
    }

    /// A stall began, or one in force was extended (same `since`).
    fn stalled(&mut self, i: usize, stall: Stall) {
        self.world.note(format!("i{i}: stalled until +{:?} ({:?})", stall.until - stall.since, stall.then));
        self.outcome.stalls += 1;
        if Instant::now() >= stall.until {
            return;
        }
        let cut = match self.world.instances[i].cut {
            Some((cut, since)) if since == stall.since => cut,
            Some(_) => return, // cut off meanwhile: the cut's own checks apply
            None => {
                self.world.seq += 1;
                self.world.instances[i].cut = Some((self.world.seq, stall.since));
                self.world.seq
            }
        };
        self.world.at(stall.until, Agenda::Unstalled { instance: i, cut });
        if stall.until >= stall.since + self.shape.ttl {
            self.world.at(stall.since + self.shape.ttl, Agenda::FenceDeadline { instance: i, cut });
        }
    }

    /// The stall of the instance's connection that the sim treats as the cut `cut` is over,
    /// unless it was extended.
    pub fn unstalled(&mut self, i: usize, cut: u64) {
        let over = self.world.instances[i].faulty.last_stall().is_none_or(|s| s.until <= Instant::now());
        if over && self.world.instances[i].cut.is_some_and(|(id, _)| id == cut) {
            self.world.note(format!("i{i}: its stall is over"));
            self.world.instances[i].cut = None;
        }
    }

    /// In the stalls family, a `PartitionReady` often races a burst of joins: it goes
    /// through a non-leader whose connection stalls from that write on (the call was
    /// decided, its write is held), while every offline consumer joins elsewhere, so the
    /// leader may give the warm's partition another target meanwhile. Returns the instance
    /// the call goes through.
    pub fn race_ready(&mut self, c: usize, inc: u64, p: u32, via: usize) -> usize {
        if self.shape.kind != Kind::ReadyRaces || self.world.quiescing {
            return via;
        }
        let mut rng = self.world.draw(&[10, inc, p as u64, self.world.seq]);
        if rng.below(2) != 0 {
            return via;
        }
        let (n, leader) = (self.world.instances.len(), self.leader());
        let free = |i: &usize| {
            Some(*i) != leader
                && self.world.instances[*i].coordinator.is_some()
                && self.world.instances[*i].cut.is_none()
        };
        let Some(v) = (0..n).map(|k| (via + k) % n).find(free) else { return via };
        // Past the rebalance delay a burst waits for, short of the fence.
        let ttl = self.shape.ttl.as_millis() as u64;
        let period = rng.millis(350, (ttl * 3 / 5).max(400));
        self.world.instances[v].faulty.stall_at_txn(period, AfterStall::Deliver, writes_ownership);
        self.world.note(format!(
            "{}#{inc}: ready {p} races a burst of joins through i{v}",
            self.world.consumers[c].name
        ));
        self.outcome.ready_races += 1;
        for k in (0..self.world.consumers.len()).filter(|k| *k != c) {
            if matches!(self.world.consumers[k].phase, Phase::Offline) {
                self.world.consumers[k].want = true;
                self.world.join(k, v + 1);
            }
        }
        v
    }

    /// The store expires the leader's session while it is in touch (see the module docs).
    pub async fn revoke(
        &mut self,
        instance: Option<usize>,
        delay: Duration,
        restart: Option<(usize, Duration)>,
    ) {
        let target = match instance {
            Some(i) => Some(i % self.world.instances.len()),
            None => self.leader(),
        };
        let Some(l) = target else { return };
        let role = if self.leader() == Some(l) { "the leader" } else { "not the leader" };
        if self.world.instances[l].cut.is_some() {
            return;
        }
        // Open bug F (see `main.rs`): a lost registration is written again as active, so a
        // draining consumer's drain is forgotten and its stream never ends. Unless told to
        // run into it, the store does not expire a session with a draining stream on it.
        let leaving = self
            .world
            .consumers
            .iter()
            .any(|c| matches!(c.phase, Phase::Online { instance, leaving: true, .. } if instance == l));
        if leaving && !self.open_bugs {
            self.world.note(format!("i{l}: its session is not expired now (open bug F)"));
            return;
        }
        if !delay.is_zero() {
            self.world.instances[l].faulty.delay(Duration::ZERO, delay);
            self.world.after(self.shape.ttl, Agenda::StopDelaying { instance: l });
        }
        let expired = self.world.instances[l].faulty.expire_all_sessions().await;
        self.world.note(format!("i{l} ({role}): the store expires its sessions early: {expired:?}"));
        self.outcome.revokes += 1;
        self.outcome.follower_revokes += u64::from(role == "not the leader");
        let Some((pick, wait)) = restart else { return };
        // One of its consumers restarts on another instance, its old stream left open.
        let on_it: Vec<usize> = (0..self.world.consumers.len())
            .filter(|c| matches!(self.world.consumers[*c].phase, Phase::Online { instance, leaving: false, .. } if instance == l))
            .collect();
        if on_it.is_empty() {
            return;
        }
        let consumer = on_it[pick % on_it.len()];
        let instance = l + 1 + pick % (self.world.instances.len() - 1);
        self.world.after(wait, Agenda::Act(Action::RestartConsumer { consumer, instance }));
    }

    /// The consumer restarts and registers on `instance`; its old stream stays open, read by
    /// nobody, until its instance ends it or notices the connection is dead.
    pub fn restart_consumer(&mut self, c: usize, instance: usize) {
        if matches!(self.world.consumers[c].phase, Phase::Online { leaving: false, .. }) {
            self.restart_open(c, instance);
        }
    }

    /// Consumer `c`, online, restarts and registers on `instance`, its old stream left open.
    fn restart_open(&mut self, c: usize, instance: usize) {
        let Phase::Online { inc, instance: old, .. } = self.world.consumers[c].phase else { return };
        let Some(at) = self.world.open.iter().position(|(i, _, _)| *i == inc) else { return };
        let (inc, consumer, stream) = self.world.open.remove(at);
        self.world.note(format!(
            "{}#{inc}@i{old} restarts; its old stream stays open",
            self.world.consumers[c].name
        ));
        self.world.zombies.push((inc, consumer, stream));
        self.outcome.half_open += 1;
        // The instance notices the dead connection within 1–3 TTL (keepalives).
        let ttl = self.shape.ttl.as_millis() as u64;
        let noticed = self.world.draw(&[9, inc]).millis(ttl, 3 * ttl);
        self.world.after(noticed, Agenda::DropZombie { inc });
        self.world.consumers[c].phase = Phase::Offline;
        self.world.consumers[c].want = true;
        self.world.join(c, instance);
    }

    /// Consumer `c` deregisters through `instance`, whose connection stalls from its next
    /// registration write for `period`; after `give_up` it restarts elsewhere (see the
    /// module docs).
    pub fn deregister_race(&mut self, c: usize, instance: usize, period: Duration, give_up: Duration) {
        let Phase::Online { inc, leaving: false, .. } = self.world.consumers[c].phase else { return };
        let Some(i) = self.world.running(instance) else { return };
        if self.world.instances[i].cut.is_some() || self.world.instances.len() < 2 {
            return;
        }
        let armed = self.world.instances[i].faulty.last_stall().map(|s| s.id);
        self.world.instances[i].faulty.stall_at_txn(period, AfterStall::Deliver, writes_registration);
        self.world.note(format!(
            "{}#{inc}: its Deregister races its restart (i{i} stalls {period:?} from its next registration write)",
            self.world.consumers[c].name
        ));
        self.world.deregister(c, inc, i);
        let other = (i + 1) % self.world.instances.len();
        self.world.after(give_up, Agenda::GiveUp { consumer: c, inc, instance: other, stalled: i, armed });
    }

    /// Consumer `c` gave up on the `Deregister` of stream `inc` and restarts on `instance`,
    /// its old stream left open. Counted as a race when the `Deregister`'s instance is still
    /// in a stall that began after the race was set up (`armed`: the stall before it).
    pub fn give_up(&mut self, c: usize, inc: u64, instance: usize, stalled: usize, armed: Option<u64>) {
        let Phase::Online { inc: current, leaving: true, .. } = self.world.consumers[c].phase else { return };
        if current != inc {
            return;
        }
        let held = self.world.instances[stalled]
            .faulty
            .last_stall()
            .is_some_and(|s| Some(s.id) != armed && Instant::now() < s.until);
        if held {
            self.outcome.deregister_races += 1;
        }
        self.restart_open(c, instance);
    }

    /// The instance notices that a half-open stream's connection is dead.
    pub fn drop_zombie(&mut self, inc: u64) {
        if let Some(at) = self.world.zombies.iter().position(|(i, _, _)| *i == inc) {
            let (inc, c, _) = self.world.zombies.remove(at);
            self.world
                .note(format!("{}#{inc}: its old connection is found dead", self.world.consumers[c].name));
        }
    }
}
