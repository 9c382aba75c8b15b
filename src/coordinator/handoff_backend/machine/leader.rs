//! The leader in the state machine, deciding with the running leader's functions: the
//! election (`leader/election.rs`: [`campaign_txn`] with its compare on absence,
//! [`steps_down`], [`adopted`], [`deposed`]), the settle period
//! ([`HandoffConfig::settle_for`]), and each topic's plan ([`plan_topic`]: the planner
//! under the configured placement, cut into batches that each compare the fence), written
//! one after another, one store call at a time. It models one leader group (the default
//! `--leader-groups 1`); several groups run only in the production loop so far.
//!
//! [`HandoffConfig::settle_for`]: crate::coordinator::handoff_backend::HandoffConfig::settle_for

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use tokio::time::Instant;

use super::{Instance, Waiting, expect};
use crate::coordinator::handoff_backend::leader::Fence;
use crate::coordinator::handoff_backend::leader::election::{adopted, campaign_txn, deposed, steps_down};
use crate::coordinator::handoff_backend::leader::reconcile::{
    Arrivals, PlanClock, active, may_plan, plan_topic,
};
use crate::coordinator::handoff_backend::leader_groups::LeaderGroup;
use crate::coordinator::machine::io::{Effect, Micros, StoreReply, StoreRequest};
use crate::handoff::{Cooldowns, Millis, MoveReason, PlacementMemory};
use crate::store::{KeyValue, Revision, SessionId, StoreError, Txn};

/// Why the leader made a store call.
#[derive(Debug)]
pub(super) enum Why {
    /// Creating the leader key bound to this session.
    Campaign(SessionId),
    /// Reading the leader key after a campaign that did not say it won.
    Adopt(SessionId),
    /// A batch of the plan at the head of the queue.
    Plan(Txn),
    /// Reading the leader key after a refused batch.
    StillLeading(Fence),
}

/// One topic's plan being written.
#[derive(Debug)]
struct Writing {
    topic: String,
    planned_at: Millis,
    batches: VecDeque<(Txn, Vec<u32>)>,
    sending: Vec<u32>,
    applied: BTreeSet<u32>,
    moves: Vec<(u32, MoveReason)>,
}

/// What the leader still has to do in its pass.
#[derive(Debug)]
enum Step {
    Topic(Writing),
    StillLeading(Fence),
}

/// The leader's state (see the module docs).
#[derive(Debug)]
pub(super) struct LeaderState {
    /// `Some` while this instance leads.
    pub fence: Option<Fence>,
    /// A store call of the leader's is in flight.
    busy: bool,
    /// Something it follows changed (the lease, the mirror's view).
    pub dirty: bool,
    /// The cache revision at its last look.
    seen: Revision,
    /// When it looks again if nothing changes.
    next_look: Micros,
    /// When a topic whose consumers are still arriving is due.
    arrivals_due: Option<Micros>,
    /// Until when orphaned partitions are left alone.
    settle_until: Option<Micros>,
    /// The mirror's interruptions and the cache's instance losses last seen.
    interruptions: u64,
    instance_losses: u64,
    /// The revision its last write produced: it plans again once the cache has it.
    written: Revision,
    arrivals: BTreeMap<String, Arrivals<Instant>>,
    cooldowns: BTreeMap<String, Cooldowns>,
    placement: BTreeMap<String, PlacementMemory>,
    queue: VecDeque<Step>,
}

impl LeaderState {
    /// A leader that looks at once.
    pub fn new(now: Micros) -> Self {
        LeaderState {
            fence: None,
            busy: false,
            dirty: true,
            seen: 0,
            next_look: now,
            arrivals_due: None,
            settle_until: None,
            interruptions: 0,
            instance_losses: 0,
            written: 0,
            arrivals: BTreeMap::new(),
            cooldowns: BTreeMap::new(),
            placement: BTreeMap::new(),
            queue: VecDeque::new(),
        }
    }

    /// When the leader's timer is due (`None` while its call is in flight).
    pub fn wake_at(&self) -> Option<Micros> {
        if self.busy {
            return None;
        }
        Some(self.arrivals_due.map_or(self.next_look, |at| at.min(self.next_look)))
    }
}

impl Instance {
    /// The leader looks, when it is idle and something changed or its timer is due, and
    /// sends its next store call.
    pub(super) fn lead(&mut self) {
        let Some(revision) = self.cache.as_ref().map(|c| c.revision) else { return };
        let now = self.now;
        let me = &self.leader;
        if me.busy {
            return;
        }
        let due_arrivals = me.arrivals_due.is_some_and(|at| now >= at);
        if me.queue.is_empty() && (me.dirty || now >= me.next_look || revision != me.seen || due_arrivals) {
            self.look(revision);
        }
        self.take_step();
    }

    /// A look: settle after an interruption, check or win leadership, plan.
    fn look(&mut self, revision: Revision) {
        let now = self.now;
        self.leader.dirty = false;
        self.leader.seen = revision;
        self.leader.arrivals_due = None;
        self.leader.next_look = now + self.config.reconcile_interval.as_micros() as Micros;
        if self.interruptions != self.leader.interruptions {
            self.leader.interruptions = self.interruptions;
            self.settle();
        }
        let Some(cache) = self.cache.as_ref() else { return };
        if let Some(fence) = self.leader.fence
            && steps_down(LeaderGroup::ONLY, fence, self.lease, cache).is_some()
        {
            self.step_down();
        }
        let Some(cache) = self.cache.as_ref() else { return };
        let Some(fence) = self.leader.fence else {
            if let Some((txn, session)) =
                campaign_txn(&self.keys, LeaderGroup::ONLY, &self.config.instance_id, self.lease, cache)
            {
                self.leader.busy = true;
                self.request(StoreRequest::Txn(txn), Waiting::Leader(Why::Campaign(session)));
            }
            return;
        };
        if cache.revision < self.leader.written {
            return;
        }
        let mut settling = self.leader.settle_until.is_some_and(|until| now < until);
        if cache.instance_losses != self.leader.instance_losses {
            self.leader.instance_losses = cache.instance_losses;
            self.settle();
            settling = true;
        }
        let cache = self.cache.as_ref().expect("checked above");
        let (at, delay) = (self.origin + std::time::Duration::from_micros(now), self.config.rebalance_delay);
        let clock = PlanClock { revision: cache.revision, now: now / 1000, now_micros: now };
        let me = &mut self.leader;
        for (topic, entry) in cache.topics.iter().filter(|(_, e)| may_plan(e, settling)) {
            let wait = me.arrivals.entry(topic.clone()).or_default().wait_until(active(entry), at, delay);
            if let Some(due) = wait {
                let due = now + (due - at).as_micros() as Micros;
                me.arrivals_due = Some(me.arrivals_due.map_or(due, |d| d.min(due)));
                continue;
            }
            let cooldowns = me.cooldowns.entry(topic.clone()).or_default();
            let memory = me.placement.entry(topic.clone()).or_default();
            let plan = plan_topic(&self.config, &self.keys, fence, (topic, entry), clock, cooldowns, memory);
            if plan.writes > 0 {
                me.queue.push_back(Step::Topic(Writing {
                    topic: topic.clone(),
                    planned_at: clock.now,
                    batches: plan.batches,
                    sending: Vec::new(),
                    applied: BTreeSet::new(),
                    moves: plan.placed.moves,
                }));
            }
        }
    }

    /// Sends the next store call of the pass; finished topics are recorded.
    fn take_step(&mut self) {
        while let Some(step) = self.leader.queue.pop_front() {
            match step {
                Step::Topic(mut topic) => match topic.batches.pop_front() {
                    Some((txn, partitions)) => {
                        topic.sending = partitions;
                        self.leader.queue.push_front(Step::Topic(topic));
                        self.leader.busy = true;
                        self.request(StoreRequest::Txn(txn.clone()), Waiting::Leader(Why::Plan(txn)));
                        return;
                    }
                    None => {
                        let made: Vec<(u32, MoveReason)> =
                            topic.moves.into_iter().filter(|(p, _)| topic.applied.contains(p)).collect();
                        if let Some(memory) = self.leader.placement.get_mut(&topic.topic) {
                            memory.record(topic.planned_at, &made, &self.config.placement);
                        }
                    }
                },
                Step::StillLeading(fence) => {
                    self.leader.busy = true;
                    let key = self.keys.leader(LeaderGroup::ONLY);
                    self.request(StoreRequest::Get(vec![key]), Waiting::Leader(Why::StillLeading(fence)));
                    return;
                }
            }
        }
    }

    /// What the store answered the leader.
    pub(super) fn leader_answered(&mut self, why: Why, answer: Result<StoreReply, StoreError>) {
        self.leader.busy = false;
        if self.stopping {
            return;
        }
        let txn = |r: StoreReply| match r {
            StoreReply::Txn(o) => Some(o),
            _ => None,
        };
        let read = |r: StoreReply| match r {
            StoreReply::Values(mut v) if v.len() == 1 => v.pop(),
            _ => None,
        };
        match why {
            Why::Campaign(session) => match expect(answer, txn) {
                Ok(outcome) if outcome.succeeded => self.won(session, outcome.revision),
                _ => {
                    self.leader.busy = true;
                    let key = self.keys.leader(LeaderGroup::ONLY);
                    self.request(StoreRequest::Get(vec![key]), Waiting::Leader(Why::Adopt(session)));
                }
            },
            Why::Adopt(session) => {
                let read: Result<Option<KeyValue>, StoreError> = expect(answer, read);
                if let Some(revision) = adopted(session, &read) {
                    self.won(session, revision);
                }
            }
            Why::Plan(written) => self.batch_answered(&written, expect(answer, txn)),
            Why::StillLeading(fence) => {
                if deposed(fence, &expect(answer, read)) == Some(true) {
                    self.step_down();
                }
            }
        }
    }

    /// The answer to the batch in flight of the topic at the head of the queue.
    fn batch_answered(&mut self, txn: &Txn, outcome: Result<crate::store::TxnOutcome, StoreError>) {
        let fence = self.leader.fence;
        let Some(Step::Topic(topic)) = self.leader.queue.front_mut() else { return };
        match outcome {
            Ok(outcome) if outcome.succeeded => {
                self.leader.written = self.leader.written.max(outcome.revision);
                topic.applied.extend(topic.sending.drain(..));
                self.applied(outcome.revision, &txn.ops, &txn.compares);
            }
            Ok(_) => {
                // Planned from a stale view: nothing of this batch was written. Deposed?
                topic.batches.clear();
                if let Some(fence) = fence {
                    self.leader.queue.insert(1, Step::StillLeading(fence));
                }
            }
            Err(_) => {
                topic.batches.clear();
                self.settle();
            }
        }
    }

    /// We lead from `revision` on.
    fn won(&mut self, session: SessionId, revision: Revision) {
        self.leader.written = self.leader.written.max(revision);
        self.leader.fence = Some(Fence { session, revision });
        self.settle();
        self.out.push(Effect::Leading(true));
    }

    /// Gives up leadership and what only a leader keeps.
    pub(super) fn step_down(&mut self) {
        if self.leader.fence.take().is_some() {
            self.leader.cooldowns.clear();
            self.leader.placement.clear();
            self.leader.queue.clear();
            self.out.push(Effect::Leading(false));
        }
    }

    /// Starts a settle period: orphaned partitions are left alone until it ends.
    fn settle(&mut self) {
        let period = self.config.settle_for().as_micros() as Micros;
        self.leader.settle_until = Some(self.now + period);
    }
}
