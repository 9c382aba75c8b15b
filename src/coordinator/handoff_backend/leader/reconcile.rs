//! Reconcile: plan every topic from one consistent read of the cache with
//! [`crate::handoff::plan_placed`] (under the configured placement, docs/design.md §11),
//! and cut each topic's changes into batched transactions fenced by our leadership, each
//! write also guarded by the revision of the record it replaces ([`plan_topic`]). The
//! machine's leader (`machine/leader.rs`) writes them one after another; the moves of the
//! batches that were written are counted by reason and, under `load`, spend the topic's
//! budget and start their cool-downs.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::Fence;
use crate::coordinator::handoff_backend::HandoffConfig;
use crate::coordinator::handoff_backend::records::Keys;
use crate::coordinator::handoff_backend::state::TopicEntry;
use crate::coordinator::shared::records::next_epoch;
use crate::handoff::{
    Cooldowns, Millis, PlacementInputs, PlacementMemory, PlacementReport, PlanReport, Write, diff_writes,
    plan_placed,
};
use crate::store::{Compare, Revision, Txn};

/// etcd refuses transactions with more than 128 compares (or operations) by default; a
/// batch holds the writes of at most this many partitions (each: ≤ 2 ops, 2 compares on
/// its own records, at most one on a gone owner's registration and one on the new owner's),
/// plus the fence.
const PARTITIONS_PER_TXN: usize = 30;

/// Builds the fenced transactions for one topic's writes, a batch per
/// [`PARTITIONS_PER_TXN`] partitions. Each batch compares the fence and, once each, the
/// `guards` of its partitions: what the plan for that partition was decided from. (The
/// plan builds them from [`chunks`] and [`fenced_txn`] itself, to know which partitions
/// each committed batch wrote.)
#[cfg(test)]
pub fn fenced_batches(
    leader_key: &str,
    fence: Fence,
    writes: &[Write],
    guards: impl Fn(u32) -> Vec<Compare>,
    ops: impl Fn(&[Write]) -> Vec<crate::store::Op>,
) -> Vec<Txn> {
    chunks(writes).iter().map(|batch| fenced_txn(leader_key, fence, batch, &guards, &ops)).collect()
}

/// `writes` cut into batches of at most [`PARTITIONS_PER_TXN`] partitions, a partition's
/// writes never split.
fn chunks(writes: &[Write]) -> Vec<Vec<Write>> {
    let mut batches: Vec<Vec<Write>> = Vec::new();
    let mut partitions = 0;
    let mut last = None;
    for write in writes {
        if last != Some(write.partition()) {
            last = Some(write.partition());
            if partitions % PARTITIONS_PER_TXN == 0 {
                batches.push(Vec::new());
            }
            partitions += 1;
        }
        if let Some(batch) = batches.last_mut() {
            batch.push(write.clone());
        }
    }
    batches
}

/// One batch's transaction: the fence, then each partition's guards once.
fn fenced_txn(
    leader_key: &str,
    fence: Fence,
    batch: &[Write],
    guards: &impl Fn(u32) -> Vec<Compare>,
    ops: &impl Fn(&[Write]) -> Vec<crate::store::Op>,
) -> Txn {
    let mut compares = Vec::new();
    if !crate::mutation::is_active(crate::mutation::Mutation::LeaderUnfenced) {
        compares.push(Compare::CreateRevision(leader_key.to_string(), fence.revision));
    }
    let mut partitions: Vec<u32> = batch.iter().map(Write::partition).collect();
    partitions.dedup();
    for compare in partitions.into_iter().flat_map(guards) {
        if !compares.contains(&compare) {
            compares.push(compare);
        }
    }
    Txn { compares, ops: ops(batch) }
}

/// Who has been joining one topic, to plan a burst of joins once.
#[derive(Debug)]
pub(in crate::coordinator::handoff_backend) struct Arrivals<At = tokio::time::Instant> {
    /// The active consumers at the last look.
    members: BTreeSet<String>,
    /// When the last new one appeared.
    last_join: Option<At>,
    /// Whether members are still arriving: the group was empty, or a join followed the
    /// previous one within the rebalance delay.
    arriving: bool,
}

impl<At> Default for Arrivals<At> {
    fn default() -> Self {
        Self { members: BTreeSet::new(), last_join: None, arriving: false }
    }
}

impl<At: Copy + Ord + std::ops::Add<std::time::Duration, Output = At>> Arrivals<At> {
    /// Notes the active consumers now; returns until when planning should wait (joins
    /// still arriving), if it should. Pure: the time is any clock's.
    /// `active` yields the names in order ([`active`]); the leader looks at every topic of
    /// its groups on every look, so an unchanged set is compared, not copied.
    pub(in crate::coordinator::handoff_backend) fn wait_until<'a>(
        &mut self,
        active: impl Iterator<Item = &'a str> + Clone,
        now: At,
        delay: std::time::Duration,
    ) -> Option<At> {
        if !active.clone().eq(self.members.iter().map(String::as_str)) {
            if active.clone().any(|name| !self.members.contains(name)) {
                let recent = self.last_join.is_some_and(|at| now < at + delay);
                self.arriving = recent || self.members.is_empty();
                self.last_join = Some(now);
            }
            self.members = active.map(str::to_owned).collect();
        }
        let due = self.last_join? + delay;
        (self.arriving && now < due).then_some(due)
    }
}

/// Whether a topic's `entry` is planned at all (pure): it has a stored record and, while
/// `settling`, no partition whose owner's registration is gone (that consumer may be
/// about to come back).
pub(in crate::coordinator::handoff_backend) fn may_plan(entry: &TopicEntry, settling: bool) -> bool {
    entry.config.is_some()
        && (!settling || entry.owners.values().all(|o| entry.consumers.contains_key(&o.value)))
}

/// The active consumers of a topic, whose joins [`Arrivals`] follows.
pub(in crate::coordinator::handoff_backend) fn active(
    entry: &TopicEntry,
) -> impl Iterator<Item = &str> + Clone {
    entry
        .consumers
        .iter()
        .filter(|(_, r)| r.value.status == crate::handoff::ConsumerStatus::Active)
        .map(|(name, _)| name.as_str())
}

/// When a plan is made: the cache's revision, and the wall clock in ms (deadlines) and in
/// µs (epochs).
#[derive(Clone, Copy, Debug)]
pub(in crate::coordinator::handoff_backend) struct PlanClock {
    /// The revision of the cache the plan reads.
    pub revision: Revision,
    /// Wall-clock ms.
    pub now: Millis,
    /// Wall-clock µs.
    pub now_micros: u64,
}

/// One topic's plan, decided (pure): what [`plan_topic`] returns.
pub(in crate::coordinator::handoff_backend) struct TopicPlan {
    /// What the planner did.
    pub report: PlanReport,
    /// What placement did (moves, deferrals, the shadow plan).
    pub placed: PlacementReport,
    /// Whether it was planned as a rollout.
    pub rollout: bool,
    /// How many writes the plan has (0: nothing to write).
    pub writes: usize,
    /// Its fenced transactions, each with the partitions it writes.
    pub batches: VecDeque<(Txn, Vec<u32>)>,
}

/// Plans `topic` from its cached `entry` under the leadership `fence` (pure): the state
/// machine's plan ([`plan_placed`]) under `config`'s placement, and its writes cut into
/// fenced batches, each write guarded by what its partition's plan was decided from.
pub(in crate::coordinator::handoff_backend) fn plan_topic(
    config: &HandoffConfig,
    keys: &Keys,
    fence: Fence,
    (topic, entry): (&str, &TopicEntry),
    clock: PlanClock,
    cooldowns: &mut Cooldowns,
    memory: &mut PlacementMemory,
) -> TopicPlan {
    let mut before = entry.state();
    // New ownerships get an epoch above every record this plan reads, and above
    // the clock, which a restored store cannot rewind (§10).
    before.next_epoch = next_epoch(clock.revision, entry.highest_epoch(), clock.now_micros);
    let rollout = super::view::from_view(config, &mut before);
    let mut after = before.clone();
    let zones = zones_of(config, topic);
    let inputs = PlacementInputs { settings: &config.placement, zones: &zones, memory };
    let (report, placed) =
        plan_placed(&mut after, clock.now, &config.plan, cooldowns, rollout.as_ref(), inputs);
    let writes = diff_writes(&before, &after);
    // What each written partition's plan was decided from: its guards.
    let guards = |p: u32| {
        let mut compares = vec![
            Compare::ModRevision(keys.assignment(topic, p), entry.owner_revision(p)),
            Compare::ModRevision(keys.handoff(topic, p), entry.handoff_revision(p)),
        ];
        // A direct assignment is only right while the gone owner's registration
        // is still absent...
        if let Some(owner) = before.owners.get(&p).filter(|o| !before.is_live(o)) {
            compares.push(Compare::ModRevision(keys.consumer(topic, owner), 0));
        }
        // ...and a new owner only while it is still that registration.
        let new_owner = after.owners.get(&p).filter(|o| before.owners.get(&p) != Some(*o));
        if let Some((owner, record)) = new_owner.and_then(|o| entry.consumers.get(o).map(|r| (o, r))) {
            compares.push(Compare::ModRevision(keys.consumer(topic, owner), record.mod_revision));
        }
        compares
    };
    let ops = |w: &[Write]| keys.write_ops(topic, w);
    let leader_key = keys.leader(config.leader_group_of(topic));
    let batches: VecDeque<(Txn, Vec<u32>)> = chunks(&writes)
        .iter()
        .map(|batch| {
            let mut partitions: Vec<u32> = batch.iter().map(Write::partition).collect();
            partitions.dedup();
            (fenced_txn(&leader_key, fence, batch, &guards, &ops), partitions)
        })
        .collect();
    TopicPlan { report, placed, rollout: rollout.is_some(), writes: writes.len(), batches }
}

/// The zones the weight source knows for `topic`'s partitions (none under `count`, which
/// does not read them).
fn zones_of(config: &HandoffConfig, topic: &str) -> BTreeMap<u32, String> {
    if config.placement.mode == crate::handoff::PlacementMode::Count {
        return BTreeMap::new();
    }
    config.weights.as_ref().and_then(|source| source.zones(topic)).unwrap_or_default()
}

#[cfg(test)]
#[path = "reconcile_tests.rs"]
mod tests;
