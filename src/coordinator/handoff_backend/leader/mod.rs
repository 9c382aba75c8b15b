//! The leader: [`election`], [`reconcile`] (with what it takes from the Kubernetes
//! [`view`]) and the topic refresh.
//!
//! Leadership is one `watch` value, `Some(Fence)` while this instance leads: `is_leader`,
//! the leader gauge and this loop read it, and only the election writes it. The leader key
//! is created (compare: absent) bound to this instance's session; its create revision is
//! the **fence**. Every write the leader makes also compares the leader key's create
//! revision with the fence: a deposed leader's write fails and changes nothing.
//!
//! With a weight source configured, the leader asks it for the weights of every stored
//! topic every `weights_refresh` and stores those that changed meaningfully in the topic
//! record ([`weights`]), so a new leader starts from them.
//!
//! With Kafka configured, the leader also refreshes the partition counts of the stored
//! topics every `topic_refresh_interval` (in a task of its own: Kafka may be slow) and
//! grows a topic's record when Kafka's count grew; the next reconcile assigns the new
//! partitions like any orphan.

mod election;
mod reconcile;
mod view;
mod weights;

pub(super) use election::resign;

use std::{collections::BTreeMap, sync::Arc};

use tokio::task::JoinHandle;

use super::Handoff;
use crate::handoff::{Cooldowns, PlacementMemory};
use crate::store::{Compare, Revision, SessionId};

/// The leader plans at most about one part in `PLAN_PACE + 1` of the time: after a plan
/// that took `d`, the next waits until `PLAN_PACE × d` has passed. Under a stream of
/// revisions (a scale-out of 10,000 partitions writes thousands) a big topic is then
/// planned every few milliseconds instead of after every revision, leaving the CPU to the
/// relay and the store; a small topic's plan (well under a millisecond) is barely delayed.
const PLAN_PACE: u32 = 4;

/// Proof of leadership: the create revision of our leader key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The session the leader key is bound to.
    pub session: SessionId,
    /// The leader key's create revision.
    pub revision: Revision,
}

/// The leader loop's own state.
#[derive(Default)]
struct Leadership {
    /// Until when orphaned partitions are left alone (see [`HandoffConfig::settle_period`]).
    ///
    /// [`HandoffConfig::settle_period`]: super::HandoffConfig::settle_period
    settle_until: Option<tokio::time::Instant>,
    /// The mirror's interruption count last seen.
    interruptions: u64,
    /// The cache's count of ended instance leases last seen.
    instance_losses: u64,
    /// Per topic, who has been arriving (see [`HandoffConfig::rebalance_delay`]).
    ///
    /// [`HandoffConfig::rebalance_delay`]: super::HandoffConfig::rebalance_delay
    arrivals: BTreeMap<String, reconcile::Arrivals>,
    /// When a topic waiting for arrivals to stop is due to be planned.
    wake_at: Option<tokio::time::Instant>,
    /// Per-topic cooldowns of the planner; lost with leadership.
    cooldowns: BTreeMap<String, Cooldowns>,
    /// Per-topic budget and cool-downs of placement by load (docs/design.md §11); lost
    /// with leadership: a new leader starts with a fresh budget and no cool-downs.
    placement: BTreeMap<String, PlacementMemory>,
    /// When the weights refresh is next due.
    next_weights: Option<tokio::time::Instant>,
    /// Revision our last write produced; reconcile again only once the cache has it.
    written: Revision,
    /// No plan before this ([`PLAN_PACE`]).
    next_plan: Option<tokio::time::Instant>,
    /// The running topic refresh, if any.
    refresh: Option<JoinHandle<()>>,
    /// When the next topic refresh is due.
    next_refresh: Option<tokio::time::Instant>,
}

impl Handoff {
    /// The settle period (one TTL unless configured).
    fn settle_period(&self) -> std::time::Duration {
        self.config.settle_period.unwrap_or(self.config.lease_ttl)
    }

    /// Our fence, while we lead.
    fn fence(&self) -> Option<Fence> {
        *self.leadership.borrow()
    }

    /// The compare that holds only while `fence` is the current election.
    fn fenced(&self, fence: Fence) -> Compare {
        Compare::CreateRevision(self.core.keys().leader(), fence.revision)
    }
}

/// Campaigns with the instance lease, and reconciles while leading.
pub(super) async fn leader_loop(inner: Arc<Handoff>) {
    let mut changed = inner.core.mirror().subscribe();
    let mut lease = inner.core.lease().subscribe();
    let mut health = inner.core.mirror().health();
    let mut me = Leadership::default();
    loop {
        if inner.core.shutdown().is_cancelled() {
            return;
        }
        let interruptions = health.borrow_and_update().interruptions;
        if interruptions != me.interruptions {
            me.interruptions = interruptions;
            settle(&inner, &mut me, "the store watch was interrupted");
        }
        election::check_leadership(&inner, &mut me);
        if inner.fence().is_none() {
            election::campaign(&inner, &mut me).await;
        }
        if let Some(fence) = inner.fence()
            && inner.core.mirror().read().revision >= me.written
        {
            let now = tokio::time::Instant::now();
            match me.next_plan.filter(|at| now < *at) {
                Some(at) => me.wake_at = Some(me.wake_at.map_or(at, |wake| wake.min(at))),
                None => {
                    // The revision that woke us was relayed first: its streams' tasks are
                    // runnable, and a handoff's `assigned` and release wait for them. This
                    // task was woken last, so without a yield it would run next and plan
                    // (hundreds of µs on a big topic) before they go (docs/benchmarks/handoff.md).
                    for _ in 0..3 {
                        tokio::task::yield_now().await;
                    }
                    let settling = me.settle_until.is_some_and(|until| now < until);
                    let planning = reconcile::reconcile_all(&inner, &mut me, fence, settling).await;
                    me.next_plan = Some(tokio::time::Instant::now() + planning * PLAN_PACE);
                }
            }
        }
        if let Some(fence) = inner.fence() {
            start_topic_refresh(&inner, &mut me, fence);
            weights::refresh_when_due(&inner, &mut me, fence).await;
        }
        let next = tokio::time::Instant::now() + inner.config.reconcile_interval;
        let wake = me.wake_at.take().map_or(next, |at| at.min(next));
        tokio::select! {
            _ = inner.core.shutdown().cancelled() => return,
            _ = changed.changed() => {}
            _ = lease.changed() => {}
            _ = health.changed() => {}
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Starts a settle period: orphaned partitions are left alone until it ends.
fn settle(inner: &Handoff, me: &mut Leadership, why: &str) {
    let period = inner.settle_period();
    me.settle_until = Some(tokio::time::Instant::now() + period);
    if inner.fence().is_some() {
        tracing::info!(why, ?period, "settling: partitions of consumers whose registrations are gone wait");
    }
}

/// Keeps the leader gauge equal to the leadership value.
pub(super) async fn publish_gauge(inner: Arc<Handoff>) {
    let mut leadership = inner.leadership.subscribe();
    loop {
        let leading = leadership.borrow_and_update().is_some();
        inner.core.metrics().is_leader.set(i64::from(leading));
        if leadership.changed().await.is_err() {
            return;
        }
    }
}

/// Starts a topic refresh when one is due and none is running.
fn start_topic_refresh(inner: &Arc<Handoff>, me: &mut Leadership, fence: Fence) {
    if inner.core.topics().source.is_none() || me.refresh.as_ref().is_some_and(|task| !task.is_finished()) {
        return;
    }
    let now = tokio::time::Instant::now();
    if me.next_refresh.is_some_and(|due| now < due) {
        return;
    }
    me.next_refresh = Some(now + inner.config.topic_refresh_interval);
    let inner = inner.clone();
    me.refresh = Some(tokio::spawn(async move {
        let go_on = || !inner.core.shutdown().is_cancelled() && inner.fence() == Some(fence);
        inner.core.grow_topics(Some(inner.fenced(fence)), go_on).await;
    }));
}
