//! The leader in the state machine, deciding with the running leader's functions: the
//! election (`leader/election.rs`: [`campaign_txn`] with its compare on absence,
//! [`steps_down`], [`adopted`], [`deposed`]), the settle period
//! ([`HandoffConfig::settle_for`]), and each topic's plan ([`plan_topic`]: the planner
//! under the configured placement, cut into batches that each compare the fence), written
//! one after another, one store call at a time per leader group. With `leader_groups` > 1
//! there is one [`LeaderState`] per group, each planning its group's topics under its own
//! key, campaigning and handing over by the running leader's rules
//! ([`leader_groups::campaigns`], [`leader_groups::hands_over`]).
//!
//! [`HandoffConfig::settle_for`]: crate::coordinator::handoff_backend::HandoffConfig::settle_for

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use tokio::time::Instant;

use super::{Instance, Waiting, expect};
use crate::coordinator::handoff_backend::leader::election::resignation_txn;
use crate::coordinator::handoff_backend::leader::election::{
    adopted, campaign_reason, campaign_txn, deposed, steps_down,
};
use crate::coordinator::handoff_backend::leader::reconcile::{
    Arrivals, PlanClock, active, may_plan, plan_topic,
};
use crate::coordinator::handoff_backend::leader::{Fence, PLAN_PACE};
use crate::coordinator::handoff_backend::leader_groups::{self, LeaderGroup};
use crate::coordinator::machine::io::{Effect, Micros, StoreReply, StoreRequest};
use crate::coordinator::machine::observe::Observation;
use crate::handoff::{Cooldowns, Millis, MoveReason, PlacementMemory, PlanReport};
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
    /// Deleting the key of a group handed over.
    Resign,
    /// Storing a topic's weights (`weights.rs`).
    Weights(String, usize),
}

/// One topic's plan being written.
#[derive(Debug)]
pub(super) struct Writing {
    topic: String,
    planned_at: Millis,
    batches: VecDeque<(Txn, Vec<u32>)>,
    sending: Vec<u32>,
    applied: BTreeSet<u32>,
    moves: Vec<(u32, MoveReason)>,
    /// What the plan does (metrics and logs, once all of it is written).
    report: Box<PlanReport>,
    rollout: bool,
    /// No batch failed so far.
    all_applied: bool,
}

/// What the leader still has to do in its pass.
#[derive(Debug)]
pub(super) enum Step {
    Topic(Writing),
    StillLeading(Fence),
    /// A topic's weights to store: its name, the write, how many partitions it weighs.
    Weights(String, Txn, usize),
}

/// The instance's planning budget, shared by its groups: the running leader's
/// [`PLAN_PACE`] over what planning took. The production driver measures each step that
/// planned and tells it ([`Input::PlanningTook`], [`Start::plans_timed`]): no group looks
/// again before `PLAN_PACE ×` that time has passed. A simulation states a cost per
/// partition instead ([`Start::plan_nanos_per_partition`]): after a look that planned `n`
/// partitions, `PLAN_PACE × n × cost`. Either way the groups take their looks in turn.
///
/// [`Input::PlanningTook`]: crate::coordinator::machine::io::Input::PlanningTook
/// [`Start::plans_timed`]: super::Start::plans_timed
/// [`Start::plan_nanos_per_partition`]: super::Start::plan_nanos_per_partition
#[derive(Debug)]
pub(super) struct Pacing {
    nanos_per_partition: u64,
    /// The driver tells what each planning step took.
    timed: bool,
    /// No look before this.
    until: Micros,
    /// The group whose look comes first in the next round.
    turn: usize,
}

impl Pacing {
    /// A budget for planning at a stated `nanos_per_partition` (0: free), and by the
    /// measured time when `timed`.
    pub fn new(nanos_per_partition: u64, timed: bool) -> Self {
        Pacing { nanos_per_partition, timed, until: 0, turn: 0 }
    }

    /// When a paced look is due (`None` when none waits on the budget).
    pub fn wake_at(&self, now: Micros) -> Option<Micros> {
        (self.until > now).then_some(self.until)
    }

    /// No look before this.
    pub fn until(&self) -> Micros {
        self.until
    }

    /// Whether planning is paced at all (a stated cost, or a measured one).
    fn paced(&self) -> bool {
        self.nanos_per_partition > 0 || self.timed
    }

    /// Group `g`'s look planned `partitions` at `now`: the next waits, and the next
    /// round starts after `g` (when planning is paced: a free one changes nothing).
    /// Returns whether the other groups wait for the rest of this step (the measure of it
    /// comes after the step).
    fn spent(&mut self, now: Micros, partitions: u64, g: usize) -> bool {
        if !self.paced() || partitions == 0 {
            return false;
        }
        let cost = partitions.saturating_mul(self.nanos_per_partition) / 1_000;
        self.until = self.until.max(now + cost * Micros::from(PLAN_PACE));
        self.turn = g + 1;
        self.timed
    }

    /// The step before, which planned, took `took` (its driver measured it): no look
    /// before `PLAN_PACE × took` from `now`, as the running leader waits after a pass.
    pub fn took(&mut self, now: Micros, took: std::time::Duration) {
        if !self.timed {
            return; // a stated cost paces this instance
        }
        let took = Micros::try_from(took.as_micros()).unwrap_or(Micros::MAX);
        let wait = took.saturating_mul(Micros::from(PLAN_PACE));
        self.until = self.until.max(now.saturating_add(wait));
    }
}

/// One leader group's leader state (see the module docs).
#[derive(Debug)]
pub(super) struct LeaderState {
    /// The group it leads or campaigns for.
    group: LeaderGroup,
    /// `Some` while this instance leads the group.
    pub fence: Option<Fence>,
    /// Since when the group's key has been seen absent.
    vacant_since: Option<Micros>,
    /// Won after the vacancy grace: not handed over before this.
    keep_until: Option<Micros>,
    /// Its last campaign was after the vacancy grace, not as the preferred instance.
    after_grace: bool,
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
    pub(super) written: Revision,
    arrivals: BTreeMap<String, Arrivals<Instant>>,
    /// The topics of its group, in order, and the cache (its load, its topic count) they
    /// were listed from: a look visits only these, not every topic's hash.
    topics: (u64, usize, Vec<String>),
    cooldowns: BTreeMap<String, Cooldowns>,
    placement: BTreeMap<String, PlacementMemory>,
    /// The Kafka topic refresh of its group's topics, while it leads (`topic_refresh.rs`).
    pub refresh: crate::coordinator::machine::refresh::TopicRefresh,
    /// When the weights refresh is next due, while it leads (`weights.rs`).
    pub next_weights: Micros,
    /// Its steps still to take (plans, checks, weights).
    pub(super) queue: VecDeque<Step>,
}

impl LeaderState {
    /// The leader of every group of `groups`, each looking at once.
    pub fn all(groups: u32, now: Micros, refresh_every: std::time::Duration) -> Vec<Self> {
        LeaderGroup::all(groups).map(|group| LeaderState::new(group, now, refresh_every)).collect()
    }

    /// The leader of `group`, looking at once.
    fn new(group: LeaderGroup, now: Micros, refresh_every: std::time::Duration) -> Self {
        LeaderState {
            group,
            vacant_since: None,
            keep_until: None,
            after_grace: false,
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
            topics: (0, 0, Vec::new()),
            cooldowns: BTreeMap::new(),
            placement: BTreeMap::new(),
            queue: VecDeque::new(),
            refresh: crate::coordinator::machine::refresh::TopicRefresh::new(refresh_every, now),
            next_weights: now,
        }
    }

    /// The group it is the leader state of.
    pub fn group(&self) -> LeaderGroup {
        self.group
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
    /// Each group's leader looks, when it is idle and something changed or its timer is
    /// due, and sends its next store call.
    pub(super) fn lead(&mut self) {
        let Some(revision) = self.cache.as_ref().map(|c| c.revision) else { return };
        let (now, groups) = (self.now, self.leaders.len());
        let first = self.pacing.turn % groups.max(1);
        let mut planned_here = 0;
        // A group planned in this step and the driver tells what it took after the step:
        // the other groups wait for that.
        let mut held = false;
        for g in (first..groups).chain(0..first) {
            let me = &self.leaders[g];
            if me.busy {
                continue;
            }
            let due_arrivals = me.arrivals_due.is_some_and(|at| now >= at);
            let wants = me.dirty || now >= me.next_look || revision != me.seen || due_arrivals;
            if me.queue.is_empty() && wants && now >= self.pacing.until && !held {
                let planned = self.look(g, revision);
                held = self.pacing.spent(now, planned, g);
                planned_here += planned;
            }
            self.ask_weights(g);
            self.take_step(g);
            self.refresh_topics(g);
        }
        if planned_here > 0 {
            self.out.push(Effect::Observe(Observation::Planned { partitions: planned_here }));
        }
    }

    /// Something every leader follows changed (the lease, the mirror's view).
    pub(super) fn poke_leaders(&mut self) {
        self.leaders.iter_mut().for_each(|me| me.dirty = true);
    }

    /// A look of group `g`'s leader: settle after an interruption, check, win or hand over
    /// leadership, plan. Returns how many partitions it planned.
    fn look(&mut self, g: usize, revision: Revision) -> u64 {
        let now = self.now;
        let me = &mut self.leaders[g];
        me.dirty = false;
        me.seen = revision;
        me.arrivals_due = None;
        me.next_look = now + self.config.reconcile_interval.as_micros() as Micros;
        if self.interruptions != me.interruptions {
            me.interruptions = self.interruptions;
            self.settle(g);
        }
        let group = self.leaders[g].group;
        let Some(cache) = self.cache.as_ref() else { return 0 };
        if let Some(fence) = self.leaders[g].fence
            && steps_down(group, fence, self.lease, cache).is_some()
        {
            self.step_down(g);
        }
        let Some(cache) = self.cache.as_ref() else { return 0 };
        let Some(fence) = self.leaders[g].fence else {
            self.campaign(g);
            return 0;
        };
        let kept = self.leaders[g].keep_until.is_some_and(|until| now < until);
        let hands_over = !kept
            && leader_groups::hands_over(group, &self.config.instance_id, cache.preferences(group.groups));
        if hands_over {
            self.step_down(g);
            self.leaders[g].busy = true;
            let txn = resignation_txn(&self.keys, group, fence);
            self.request(StoreRequest::Txn(txn), Waiting::Leader(g, Why::Resign));
            return 0;
        }
        if cache.revision < self.leaders[g].written {
            return 0;
        }
        let mut settling = self.leaders[g].settle_until.is_some_and(|until| now < until);
        if cache.instance_losses != self.leaders[g].instance_losses {
            self.leaders[g].instance_losses = cache.instance_losses;
            self.settle(g);
            settling = true;
        }
        let Some(cache) = self.cache.as_ref() else { return 0 };
        let (at, delay) = (self.origin + std::time::Duration::from_micros(now), self.config.rebalance_delay);
        let clock = PlanClock { revision: cache.revision, now: now / 1000, now_micros: now };
        let me = &mut self.leaders[g];
        let listed = (self.cache_loads, cache.topics.len());
        if (me.topics.0, me.topics.1) != listed {
            me.topics =
                (listed.0, listed.1, cache.topics.keys().filter(|t| group.plans(t)).cloned().collect());
        }
        let mut planned = 0;
        let topics = me.topics.2.iter().filter_map(|topic| cache.topics.get_key_value(topic));
        for (topic, entry) in topics.filter(|(_, e)| may_plan(e, settling)) {
            let wait = me.arrivals.entry(topic.clone()).or_default().wait_until(active(entry), at, delay);
            if let Some(due) = wait {
                let due = now + (due - at).as_micros() as Micros;
                me.arrivals_due = Some(me.arrivals_due.map_or(due, |d| d.min(due)));
                continue;
            }
            let cooldowns = me.cooldowns.entry(topic.clone()).or_default();
            let memory = me.placement.entry(topic.clone()).or_default();
            let plan = plan_topic(&self.config, &self.keys, fence, (topic, entry), clock, cooldowns, memory);
            planned += u64::from(entry.config.as_ref().map_or(0, |c| c.value.partition_count));
            // Counted once when it starts being held back (the memory's note changes no plan).
            for (partition, why) in memory.note_deferred(&plan.placed.deferred) {
                let topic = topic.clone();
                self.out.push(Effect::Observe(Observation::Deferred { topic, partition, why }));
            }
            if plan.writes > 0 {
                me.queue.push_back(Step::Topic(Writing {
                    topic: topic.clone(),
                    planned_at: clock.now,
                    batches: plan.batches,
                    sending: Vec::new(),
                    applied: BTreeSet::new(),
                    moves: plan.placed.moves,
                    report: Box::new(plan.report),
                    rollout: plan.rollout,
                    all_applied: true,
                }));
            }
        }
        planned
    }

    /// Group `g`'s leader campaigns for its key when the rules say so: always with one
    /// group; with several, when preferred for it or after a TTL of vacancy, and never
    /// beside a leader key of another group count.
    fn campaign(&mut self, g: usize) {
        let Some(cache) = self.cache.as_ref() else { return };
        let (now, me) = (self.now, &mut self.leaders[g]);
        let group = me.group;
        let vacant_for = match cache.leader(group) {
            Some(_) => {
                me.vacant_since = None;
                0
            }
            None => now.saturating_sub(*me.vacant_since.get_or_insert(now)),
        };
        let vacant_for = std::time::Duration::from_micros(vacant_for);
        let id = &self.config.instance_id;
        let Some(why) = campaign_reason(group, id, cache, self.lease, vacant_for, self.config.lease_ttl)
        else {
            return;
        };
        me.after_grace = why == leader_groups::Campaign::AfterGrace;
        if let (leader_groups::Campaign::Own, Some(session)) = (why, self.lease.live()) {
            me.busy = true;
            let key = self.keys.leader(group);
            self.request(StoreRequest::Get(vec![key]), Waiting::Leader(g, Why::Adopt(session)));
            return;
        }
        if let Some((txn, session)) =
            campaign_txn(&self.keys, group, &self.config.instance_id, self.lease, cache)
        {
            self.leaders[g].busy = true;
            self.request(StoreRequest::Txn(txn), Waiting::Leader(g, Why::Campaign(session)));
        }
    }

    /// Sends group `g`'s next store call of the pass; finished topics are recorded.
    fn take_step(&mut self, g: usize) {
        while let Some(step) = self.leaders[g].queue.pop_front() {
            match step {
                Step::Topic(mut topic) => match topic.batches.pop_front() {
                    Some((txn, partitions)) => {
                        topic.sending = partitions;
                        self.leaders[g].queue.push_front(Step::Topic(topic));
                        self.leaders[g].busy = true;
                        self.request(StoreRequest::Txn(txn.clone()), Waiting::Leader(g, Why::Plan(txn)));
                        return;
                    }
                    None => {
                        let made: Vec<(u32, MoveReason)> =
                            topic.moves.into_iter().filter(|(p, _)| topic.applied.contains(p)).collect();
                        if let Some(memory) = self.leaders[g].placement.get_mut(&topic.topic) {
                            memory.record(topic.planned_at, &made, &self.config.placement);
                        }
                        let written = Observation::Written {
                            topic: topic.topic,
                            moves: made,
                            report: topic.all_applied.then_some(*topic.report),
                            rollout: topic.rollout,
                        };
                        self.out.push(Effect::Observe(written));
                    }
                },
                Step::Weights(topic, txn, weighted) => {
                    self.leaders[g].busy = true;
                    self.request(StoreRequest::Txn(txn), Waiting::Leader(g, Why::Weights(topic, weighted)));
                    return;
                }
                Step::StillLeading(fence) => {
                    self.leaders[g].busy = true;
                    let key = self.keys.leader(self.leaders[g].group);
                    self.request(StoreRequest::Get(vec![key]), Waiting::Leader(g, Why::StillLeading(fence)));
                    return;
                }
            }
        }
    }

    /// What the store answered group `g`'s leader.
    pub(super) fn leader_answered(&mut self, g: usize, why: Why, answer: Result<StoreReply, StoreError>) {
        if g >= self.leaders.len() {
            return;
        }
        self.leaders[g].busy = false;
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
                Ok(outcome) if outcome.succeeded => self.won(g, session, outcome.revision),
                _ => {
                    self.leaders[g].busy = true;
                    let key = self.keys.leader(self.leaders[g].group);
                    self.request(StoreRequest::Get(vec![key]), Waiting::Leader(g, Why::Adopt(session)));
                }
            },
            Why::Adopt(session) => {
                let read: Result<Option<KeyValue>, StoreError> = expect(answer, read);
                if let Some(revision) = adopted(session, &read) {
                    self.won(g, session, revision);
                }
            }
            Why::Plan(written) => self.batch_answered(g, &written, expect(answer, txn)),
            Why::StillLeading(fence) => {
                if deposed(fence, &expect(answer, read)) == Some(true) {
                    self.step_down(g);
                }
            }
            // Lost or refused: the key ends with the lease, or is no longer ours.
            Why::Resign => {}
            Why::Weights(topic, weighted) => self.weights_answered(g, &topic, weighted, expect(answer, txn)),
        }
    }

    /// The answer to the batch in flight of the topic at the head of the queue.
    fn batch_answered(&mut self, g: usize, txn: &Txn, outcome: Result<crate::store::TxnOutcome, StoreError>) {
        let me = &mut self.leaders[g];
        let fence = me.fence;
        let Some(Step::Topic(topic)) = me.queue.front_mut() else { return };
        match outcome {
            Ok(outcome) if outcome.succeeded => {
                topic.applied.extend(topic.sending.drain(..));
                me.written = me.written.max(outcome.revision);
                self.applied(outcome.revision, &txn.ops, &txn.compares);
            }
            Ok(_) => {
                // Planned from a stale view: nothing of this batch was written. Deposed?
                topic.batches.clear();
                topic.all_applied = false;
                let conflict = Observation::Conflict { topic: topic.topic.clone() };
                if let Some(fence) = fence {
                    me.queue.insert(1, Step::StillLeading(fence));
                }
                self.out.push(Effect::Observe(conflict));
            }
            Err(_) => {
                topic.batches.clear();
                topic.all_applied = false;
                self.settle(g);
            }
        }
    }

    /// We lead group `g` from `revision` on.
    fn won(&mut self, g: usize, session: SessionId, revision: Revision) {
        let leading_before = self.is_leader();
        let keep = self.config.lease_ttl_micros() * Micros::from(leader_groups::KEEP_AFTER_GRACE_TTLS);
        let me = &mut self.leaders[g];
        me.keep_until = me.after_grace.then_some(self.now + keep);
        me.written = me.written.max(revision);
        me.fence = Some(Fence { session, revision });
        me.refresh.restart(self.now);
        me.next_weights = self.now;
        let group = me.group.group;
        self.settle(g);
        if !leading_before {
            self.out.push(Effect::Leading(true));
        }
        self.observe_leadership(group, true);
    }

    /// Says group `group`'s leadership was won or given up, and how many groups it leads.
    fn observe_leadership(&mut self, group: u32, won: bool) {
        let led = self.leaders.iter().filter(|me| me.fence.is_some()).count() as u32;
        self.out.push(Effect::Observe(Observation::Leadership { group, won, led }));
    }

    /// Gives up group `g`'s leadership and what only its leader keeps.
    pub(super) fn step_down(&mut self, g: usize) {
        let me = &mut self.leaders[g];
        if me.fence.take().is_some() {
            me.refresh.stop();
            me.cooldowns.clear();
            me.placement.clear();
            me.queue.clear();
            let group = me.group.group;
            if !self.is_leader() {
                self.out.push(Effect::Leading(false));
            }
            self.observe_leadership(group, false);
        }
    }

    /// Starts a settle period of group `g`: orphaned partitions are left alone until it ends.
    fn settle(&mut self, g: usize) {
        let period = self.config.settle_for().as_micros() as Micros;
        self.leaders[g].settle_until = Some(self.now + period);
    }
}
