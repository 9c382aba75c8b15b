//! The leader: [`election`], [`reconcile`] (with what it takes from the Kubernetes
//! [`view`]), the [`weights`] refresh and the topic refresh. It is a part of the instance's
//! loop (`driver.rs`), not a task of its own.
//!
//! **How the loop drives it.** The leader looks again when something it follows changed
//! ([`Leader::poke`]: the cache, the instance lease, the mirror's health) or when its timer
//! is due ([`Leader::wake_at`]: the reconcile interval, arrivals settling, the plan's pace).
//! A look decides on the cache, with no I/O of its own. It returns the leader's next store
//! call ([`Leader::next_job`]): a campaign, a plan's batch, a check, a weights update. The
//! loop runs that call beside its other store calls and hands the answer back
//! ([`Leader::answered`]). The leader has at most one call in flight, so its writes go
//! one after another, as a leader's always have.
//!
//! **Leader groups.** The topics are split into `--leader-groups` groups
//! (`leader_groups.rs`), one leadership each; the loop keeps one [`Leader`] per group
//! ([`Leaders`]), each planning only its group's topics, with its own call in flight. With
//! one group (the default) this is the single leader it always was.
//!
//! **Leadership** is one `watch` value, the fences of the groups this instance leads:
//! `is_leader` and the leader gauges read it, and only the election writes it. A group's
//! leader key is created (compare: absent) bound to this instance's session; its create
//! revision is the **fence**. Every write a group's leader makes also compares that key's
//! create revision with the fence: a deposed leader's write fails and changes nothing.
//!
//! With a weight source configured, the leader asks it for the weights of every stored
//! topic every `weights_refresh` and stores those that changed meaningfully in the topic
//! record ([`weights`]), so a new leader starts from them.
//!
//! With Kafka configured, the leader also refreshes the partition counts of the stored
//! topics every `topic_refresh_interval` ([`Leader::refresh`]). The refresh runs among the
//! loop's store calls, beside the leader's one call in flight, since Kafka may be slow. It
//! grows a topic's record when Kafka's count grew (fenced); the next reconcile assigns the
//! new partitions like any orphan.

pub(super) mod election;
mod leaders;
#[cfg(test)]
mod loop_tests;
pub(super) mod reconcile;
mod view;
pub(super) mod weights;

pub(super) use election::resignation;
pub(super) use leaders::{GroupIndex, Leaders};

use std::{collections::BTreeMap, collections::VecDeque, sync::Arc, time::Duration};

use futures::future::BoxFuture;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Handoff;
use super::leader_groups::LeaderGroup;
use crate::handoff::{Cooldowns, PlacementMemory};
use crate::store::{Compare, KeyValue, Revision, SessionId, StoreError, Txn, TxnOutcome};

/// The leader plans at most about one part in `PLAN_PACE + 1` of the time: after a plan
/// that took `d`, the next waits until `PLAN_PACE × d` has passed. With several leader
/// groups the budget is the instance's: a group's pass also waits for the pace left by
/// any other group's plan ([`Leaders`]). Under a stream of
/// revisions (a scale-out of 10,000 partitions writes thousands) a big topic is then
/// planned every few milliseconds instead of after every revision, leaving the CPU to the
/// relay and the store; a small topic's plan (well under a millisecond) is barely delayed.
pub(in crate::coordinator::handoff_backend) const PLAN_PACE: u32 = 4;

/// Proof of leadership: the create revision of our leader key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The session the leader key is bound to.
    pub session: SessionId,
    /// The leader key's create revision.
    pub revision: Revision,
}

/// One store call of the leader's, for the loop to run.
pub(super) enum Job {
    /// A transaction. Its ops are applied to the cache on success only for a plan's batch
    /// (owner and handoff records, whose cache reads no create revision); the watch
    /// brings the rest.
    Txn(Txn, Why),
    /// A read of one key.
    Read(String, Why),
}

/// Why the leader made a store call: what its answer goes on with.
pub(super) enum Why {
    /// Creating the leader key bound to `session`.
    Campaign(SessionId),
    /// Reading the leader key after a campaign whose answer was lost or refused.
    Adopt(SessionId),
    /// A batch of the current plan.
    Plan,
    /// Reading the leader key after a refused batch: a stale read, or deposed?
    StillLeading(Fence),
    /// Storing `topic`'s weights (`weighted`: how many partitions have one).
    Weights { topic: String, weighted: usize },
    /// Deleting the key of a group handed over.
    Resign,
}

/// What the store answered a [`Job`].
pub(super) enum Answer {
    /// A [`Job::Txn`]'s outcome.
    Txn(Result<TxnOutcome, StoreError>),
    /// A [`Job::Read`]'s record.
    Read(Result<Option<KeyValue>, StoreError>),
}

impl Why {
    /// Whether a transaction made for this, once it succeeded, is applied to the cache at
    /// once (see [`Job::Txn`]).
    pub(super) fn applies_at_once(&self) -> bool {
        matches!(self, Why::Plan)
    }
}

/// Work of the current pass still to do, in order.
enum Step {
    /// A topic's plan, with the batches still to write.
    Topic(Box<reconcile::TopicWrite>),
    /// A weights update to write.
    Weights { topic: String, txn: Txn, weighted: usize },
    /// Create the leader key bound to our session.
    Campaign(Txn, SessionId),
    /// Read the leader key after a campaign that did not say it won.
    Adopt(SessionId),
    /// Check the leader key after a refused batch.
    StillLeading(Fence),
    /// Delete our leader key of a group handed over (compare: still our election).
    Resign(Txn),
    /// The pass's plans are written: pace the next one by how long planning took.
    EndPass { planning: Duration },
}

/// The leader's own state, kept by the instance's loop: one per leader group.
struct Leadership {
    /// The group this is the leadership of.
    group: LeaderGroup,
    /// Since when the group's leader key has been seen absent.
    vacant_since: Option<Instant>,
    /// A group won while another instance was preferred is not handed over before this
    /// ([`KEEP_AFTER_GRACE_TTLS`](super::leader_groups::KEEP_AFTER_GRACE_TTLS)).
    keep_until: Option<Instant>,
    /// Its last campaign was after the vacancy grace, not as the preferred instance.
    after_grace: bool,
    /// A leader key of another group count is in the store (logged once per sighting).
    mixed: bool,
    /// Until when orphaned partitions are left alone (see [`HandoffConfig::settle_period`]).
    ///
    /// [`HandoffConfig::settle_period`]: super::HandoffConfig::settle_period
    settle_until: Option<Instant>,
    /// The mirror's interruption count last seen.
    interruptions: u64,
    /// The cache's count of ended instance leases last seen.
    instance_losses: u64,
    /// Per topic, who has been arriving (see [`HandoffConfig::rebalance_delay`]).
    ///
    /// [`HandoffConfig::rebalance_delay`]: super::HandoffConfig::rebalance_delay
    arrivals: BTreeMap<String, reconcile::Arrivals>,
    /// When a topic waiting for arrivals to stop is due to be planned.
    wake_at: Option<Instant>,
    /// Per-topic cooldowns of the planner; lost with leadership.
    cooldowns: BTreeMap<String, Cooldowns>,
    /// Per-topic budget and cool-downs of placement by load (docs/design.md §11); lost
    /// with leadership: a new leader starts with a fresh budget and no cool-downs.
    placement: BTreeMap<String, PlacementMemory>,
    /// When the weights refresh is next due.
    next_weights: Option<Instant>,
    /// Revision our last write produced; reconcile again only once the cache has it.
    written: Revision,
    /// No plan before this ([`PLAN_PACE`]).
    next_plan: Option<Instant>,
    /// The running topic refresh, if any: its number, and what stops it when leadership
    /// is lost.
    refresh: Option<(u64, CancellationToken)>,
    /// Topic refreshes started so far (each one's number).
    refreshes: u64,
    /// A topic refresh is due under this fence: the loop starts it ([`Leader::refresh`]).
    refresh_due: Option<Fence>,
    /// When the next topic refresh is due.
    next_refresh: Option<Instant>,
    /// What is left of the current pass.
    queue: VecDeque<Step>,
}

impl Leadership {
    fn new(group: LeaderGroup) -> Self {
        Leadership {
            group,
            vacant_since: None,
            keep_until: None,
            after_grace: false,
            mixed: false,
            settle_until: None,
            interruptions: 0,
            instance_losses: 0,
            arrivals: BTreeMap::new(),
            wake_at: None,
            cooldowns: BTreeMap::new(),
            placement: BTreeMap::new(),
            next_weights: None,
            written: 0,
            next_plan: None,
            refresh: None,
            refreshes: 0,
            refresh_due: None,
            next_refresh: None,
            queue: VecDeque::new(),
        }
    }
}

/// The leader as the instance's loop keeps it (see the module docs).
pub(super) struct Leader {
    me: Leadership,
    /// The lease or the mirror's health changed since its last look.
    dirty: bool,
    /// The cache's revision at its last look: a newer one is a change it follows too.
    seen: Revision,
    /// A call of the leader's is in flight.
    busy: bool,
    /// When the leader looks again if nothing changes.
    wake: Instant,
    /// The instance is shutting down: the leader makes no more calls and sets no timer.
    stopped: bool,
}

impl Handoff {
    /// The settle period (one TTL unless configured).
    fn settle_period(&self) -> std::time::Duration {
        self.config.settle_for()
    }

    /// Our fence of `group`, while we lead it.
    fn fence(&self, group: LeaderGroup) -> Option<Fence> {
        self.leadership.borrow().get(&group.group).copied()
    }

    /// The compare that holds only while `fence` is the current election of `group`.
    fn fenced(&self, group: LeaderGroup, fence: Fence) -> Compare {
        Compare::CreateRevision(self.core.keys().leader(group), fence.revision)
    }
}

impl Leader {
    /// The leader of `group`, looking at once.
    fn new(group: LeaderGroup, now: Instant) -> Self {
        Leader { me: Leadership::new(group), dirty: true, seen: 0, busy: false, wake: now, stopped: false }
    }

    /// The instance lease or the mirror's health changed: the leader looks again once it is
    /// idle (a newer cache it sees by itself).
    pub(super) fn poke(&mut self) {
        self.dirty = true;
    }

    /// When the leader's timer is due, while no call of its is in flight (`None`: it waits
    /// for its answer, or the instance is stopping).
    pub(super) fn wake_at(&self) -> Option<Instant> {
        (!self.busy && !self.stopped).then_some(self.wake)
    }

    /// Whether the next [`next_job`](Self::next_job) may plan (so the loop lets the
    /// streams it just fed go first: planning a big topic takes hundreds of µs).
    pub(super) fn may_plan(&self, inner: &Handoff, now: Instant) -> bool {
        self.will_look(inner, now)
            && inner.fence(self.me.group).is_some()
            && self.me.next_plan.is_none_or(|at| now >= at)
    }

    /// Whether the leader looks at its next chance: it is idle, and something changed or
    /// its timer is due.
    fn will_look(&self, inner: &Handoff, now: Instant) -> bool {
        self.due(inner.core.mirror().read().revision, now)
    }

    /// [`will_look`](Self::will_look), given the cache's revision.
    fn due(&self, revision: Revision, now: Instant) -> bool {
        !self.busy && self.me.queue.is_empty() && (self.dirty || now >= self.wake || revision != self.seen)
    }

    /// The leader's next store call, if it has one now (see the module docs); `pace` is
    /// the instance's planning budget ([`Leaders`]).
    fn next_job(&mut self, inner: &Arc<Handoff>, now: Instant, pace: &mut Option<Instant>) -> Option<Job> {
        // A timer left set after the shutdown would fire at once, again and again, until
        // the loop ends.
        self.stopped = inner.core.shutdown().is_cancelled();
        if self.busy || self.stopped {
            return None;
        }
        let revision = inner.core.mirror().read().revision;
        if self.due(revision, now) {
            self.dirty = false;
            self.seen = revision;
            self.look(inner, now, pace);
        }
        let job = self.take_step(inner);
        self.busy = job.is_some();
        job
    }

    /// The topic refresh to run now, if one is due (module docs), with its number for
    /// [`refreshed`](Self::refreshed). It asks Kafka and writes the grown counts, fenced;
    /// it stops between topics, or at once, when leadership is lost.
    pub(super) fn refresh(&mut self, inner: &Arc<Handoff>) -> Option<(u64, BoxFuture<'static, ()>)> {
        let fence = self.me.refresh_due.take()?;
        self.me.refreshes += 1;
        let (number, stop) = (self.me.refreshes, CancellationToken::new());
        self.me.refresh = Some((number, stop.clone()));
        let (inner, group) = (inner.clone(), self.me.group);
        Some((
            number,
            Box::pin(async move {
                let go_on = || !inner.core.shutdown().is_cancelled() && inner.fence(group) == Some(fence);
                let grow = inner.core.grow_topics(
                    Some(inner.fenced(group, fence)),
                    |topic| group.plans(topic),
                    go_on,
                );
                stop.run_until_cancelled(grow).await;
            }),
        ))
    }

    /// The loop stops: a topic refresh under way is cancelled, so the stop waits for no
    /// Kafka answer (the leadership is resigned by the loop: [`resignation`]).
    pub(super) fn stop(&mut self) {
        if let Some((_, stop)) = self.me.refresh.take() {
            stop.cancel();
        }
    }

    /// The topic refresh `number` ended.
    pub(super) fn refreshed(&mut self, number: u64) {
        if self.me.refresh.as_ref().is_some_and(|(running, _)| *running == number) {
            self.me.refresh = None;
        }
    }

    /// What the store answered the leader's call.
    pub(super) fn answered(&mut self, inner: &Handoff, why: Why, answer: Answer) {
        self.busy = false;
        let me = &mut self.me;
        match (why, answer) {
            (Why::Campaign(session), Answer::Txn(outcome)) => {
                election::campaigned(inner, me, session, outcome)
            }
            (Why::Adopt(session), Answer::Read(read)) => election::adopt(inner, me, session, read),
            (Why::Plan, Answer::Txn(outcome)) => reconcile::batch_answered(inner, me, outcome),
            (Why::StillLeading(fence), Answer::Read(read)) => election::still_leading(inner, me, fence, read),
            (Why::Weights { topic, weighted }, Answer::Txn(outcome)) => {
                weights::answered(inner, me, &topic, weighted, outcome)
            }
            (Why::Resign, Answer::Txn(outcome)) => election::resigned(inner, me, outcome),
            // A job's answer is always of its kind (`driver.rs` runs them).
            (_, _) => tracing::error!("the leader got an answer of another kind than its call"),
        }
    }

    /// A look: settle after an interruption, check or win leadership, plan, refresh; all
    /// decided on the cache, the store calls queued (module docs).
    fn look(&mut self, inner: &Arc<Handoff>, now: Instant, pace: &mut Option<Instant>) {
        self.wake = now + inner.config.reconcile_interval;
        let me = &mut self.me;
        let interruptions = inner.core.mirror().health().borrow().interruptions;
        if interruptions != me.interruptions {
            me.interruptions = interruptions;
            settle(inner, me, "the store watch was interrupted");
        }
        election::check_leadership(inner, me);
        if inner.fence(me.group).is_none() {
            election::campaign(inner, me, now);
            return;
        }
        if election::hand_over(inner, me) {
            return;
        }
        if let Some(fence) = inner.fence(me.group)
            && inner.core.mirror().read().revision >= me.written
        {
            match me.next_plan.max(*pace).filter(|at| now < *at) {
                Some(at) => me.wake_at = Some(me.wake_at.map_or(at, |wake| wake.min(at))),
                None => {
                    let settling = me.settle_until.is_some_and(|until| now < until);
                    let (topics, planning) = reconcile::plan_all(inner, me, fence, settling);
                    inner.core.metrics().plan_seconds.inc_by(planning.as_secs_f64());
                    // The instance's budget from now; this group's own pace starts once its
                    // plans are written (`EndPass`), so with one group it is what rules.
                    *pace = Some(Instant::now() + planning * PLAN_PACE);
                    me.queue.extend(topics.into_iter().map(|topic| Step::Topic(Box::new(topic))));
                    me.queue.push_back(Step::EndPass { planning });
                }
            }
        }
        if let Some(fence) = inner.fence(me.group) {
            start_topic_refresh(inner, me, fence);
            weights::queue_when_due(inner, me, fence);
        }
        if let Some(at) = me.wake_at.take() {
            self.wake = self.wake.min(at);
        }
    }

    /// The next store call of the current pass; finished steps are done and dropped.
    fn take_step(&mut self, inner: &Handoff) -> Option<Job> {
        let me = &mut self.me;
        while let Some(step) = me.queue.pop_front() {
            match step {
                Step::Topic(mut topic) => match topic.next_batch() {
                    Some(txn) => {
                        me.queue.push_front(Step::Topic(topic));
                        return Some(Job::Txn(txn, Why::Plan));
                    }
                    None => {
                        reconcile::finish_topic(inner, me, *topic);
                        if inner.fence(me.group).is_none() {
                            me.queue.clear();
                        }
                    }
                },
                Step::Weights { topic, txn, weighted } => {
                    return Some(Job::Txn(txn, Why::Weights { topic, weighted }));
                }
                Step::Campaign(txn, session) => return Some(Job::Txn(txn, Why::Campaign(session))),
                Step::Adopt(session) => {
                    return Some(Job::Read(inner.core.keys().leader(me.group), Why::Adopt(session)));
                }
                Step::StillLeading(fence) => {
                    return Some(Job::Read(inner.core.keys().leader(me.group), Why::StillLeading(fence)));
                }
                Step::Resign(txn) => return Some(Job::Txn(txn, Why::Resign)),
                Step::EndPass { planning } => me.next_plan = Some(Instant::now() + planning * PLAN_PACE),
            }
        }
        None
    }
}

/// Starts a settle period: orphaned partitions are left alone until it ends.
fn settle(inner: &Handoff, me: &mut Leadership, why: &str) {
    let period = inner.settle_period();
    me.settle_until = Some(Instant::now() + period);
    if inner.fence(me.group).is_some() {
        let group = me.group.group;
        tracing::info!(
            group,
            why,
            ?period,
            "settling: partitions of consumers whose registrations are gone wait"
        );
    }
}

/// Keeps the leader gauges equal to the leadership value: whether this instance leads
/// some group, and how many.
pub(super) async fn publish_gauge(inner: Arc<Handoff>) {
    let mut leadership = inner.leadership.subscribe();
    inner.core.metrics().leader_groups.set(i64::from(inner.config.leader_groups.max(1)));
    loop {
        let led = leadership.borrow_and_update().len();
        inner.core.metrics().is_leader.set(i64::from(led > 0));
        inner.core.metrics().leader_groups_led.set(led as i64);
        if leadership.changed().await.is_err() {
            return;
        }
    }
}

/// Marks a topic refresh due when its time came and none is running.
fn start_topic_refresh(inner: &Arc<Handoff>, me: &mut Leadership, fence: Fence) {
    if inner.core.topics().source.is_none() || me.refresh.is_some() {
        return;
    }
    let now = Instant::now();
    if me.next_refresh.is_some_and(|due| now < due) {
        return;
    }
    me.next_refresh = Some(now + inner.config.topic_refresh_interval);
    me.refresh_due = Some(fence);
}
