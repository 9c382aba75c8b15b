//! [`Assignor`]: the one placement interface. It places a topic's partitions (with their
//! weights) on its consumers (with their [`ConsumerInfo`]), and it serves both users of
//! placement:
//!
//! * the handoff leader's plan asks for the target owner of every partition
//!   ([`Assignor::assign`]);
//! * a fleet consumer, claiming without a leader, asks for its own quota
//!   ([`Assignor::quota`]): a number that depends only on the consumers and partitions,
//!   never on who holds what, so every instance computes the same and claims converge.
//!
//! Two implementations are in use today: [`Balanced`] (the sticky, balanced assignment of
//! [`super::assign_keeping`]) and [`RolloutRule`] (each partition moves once while a
//! generation of consumers is replaced, [`super::assign_rollout`]). Both count partitions:
//! they read neither weights nor capacities, so with every attribute at its default the
//! behaviour is exactly what it was before attributes existed. A third,
//! [`super::LoadBalanced`], balances weights within a tolerance (not wired in yet). Pure: no
//! I/O, no clock.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{Rollout, assign_keeping, assign_rollout};

/// What placement knows of a consumer, stored with its registration record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerInfo {
    /// The zone the consumer runs in, where known (its pod's node's
    /// `topology.kubernetes.io/zone`); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// How much the consumer can carry relative to the others (default 1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub capacity: u32,
    /// The rollout generation of the consumer (its pod template's hash), which the rollout
    /// rule tells old from new consumers by; `None` when not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<String>,
}

fn one() -> u32 {
    1
}

fn is_one(capacity: &u32) -> bool {
    *capacity == 1
}

impl Default for ConsumerInfo {
    fn default() -> Self {
        Self { zone: None, capacity: 1, generation: None }
    }
}

impl ConsumerInfo {
    /// Whether every attribute is at its default (records then store none of them).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// The weight of a partition that has none stored.
pub const DEFAULT_WEIGHT: u64 = 1;

/// One topic as placement sees it.
#[derive(Clone, Copy, Debug)]
pub struct Placement<'a> {
    /// Partitions `0..partition_count`.
    pub partition_count: u32,
    /// Weights of partitions that have one ([`DEFAULT_WEIGHT`] otherwise).
    pub weights: &'a BTreeMap<u32, u64>,
    /// Consumers that may receive partitions, with their info, in name order.
    pub active: &'a BTreeMap<String, ConsumerInfo>,
    /// Live consumers handing their partitions off (they receive none).
    pub draining: &'a BTreeSet<String>,
    /// The current owner of each owned partition.
    pub current: &'a BTreeMap<u32, String>,
    /// Partitions an over-quota consumer gives up last (warms towards their target).
    pub keep_first: &'a BTreeSet<u32>,
}

/// Places a topic's partitions on its consumers (see the module docs).
pub trait Assignor {
    /// The target owner of every partition `0..partition_count` (empty with no active
    /// consumer or no partition).
    fn assign(&self, topic: &Placement<'_>) -> BTreeMap<u32, String>;

    /// How many partitions the active consumer `me` should hold, whatever anyone holds now
    /// (`topic.current` is not read); 0 when `me` is not active.
    fn quota(&self, topic: &Placement<'_>, me: &str) -> usize;
}

/// The quota of the consumer of rank `rank` among `members` sharing `count` partitions:
/// `⌊P/N⌋`, plus one for the first `P mod N` ranks, so the quotas sum to exactly `P`.
pub fn quota_by_rank(count: u32, members: usize, rank: usize) -> usize {
    if members == 0 {
        return 0;
    }
    let count = count as usize;
    count / members + usize::from(rank < count % members)
}

fn active_names(topic: &Placement<'_>) -> BTreeSet<String> {
    topic.active.keys().cloned().collect()
}

/// The sticky, balanced assignment by partition count ([`super::assign_keeping`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Balanced;

impl Assignor for Balanced {
    fn assign(&self, topic: &Placement<'_>) -> BTreeMap<u32, String> {
        assign_keeping(topic.partition_count, topic.current, &active_names(topic), topic.keep_first)
    }

    fn quota(&self, topic: &Placement<'_>, me: &str) -> usize {
        match topic.active.keys().position(|name| name == me) {
            Some(rank) => quota_by_rank(topic.partition_count, topic.active.len(), rank),
            None => 0,
        }
    }
}

/// The rollout rule ([`super::assign_rollout`]): while `rollout.outgoing` is being
/// replaced, each partition moves once, to a consumer that stays.
#[derive(Clone, Copy, Debug)]
pub struct RolloutRule<'r>(pub &'r Rollout);

impl Assignor for RolloutRule<'_> {
    fn assign(&self, topic: &Placement<'_>) -> BTreeMap<u32, String> {
        let active = active_names(topic);
        assign_rollout(
            topic.partition_count,
            topic.current,
            &active,
            topic.draining,
            topic.keep_first,
            self.0,
        )
    }

    /// An outgoing consumer's quota is 0; a stayer's is its share of the final group.
    fn quota(&self, topic: &Placement<'_>, me: &str) -> usize {
        let stayers: Vec<&String> =
            topic.active.keys().filter(|name| !self.0.outgoing.contains(*name)).collect();
        match stayers.iter().position(|name| *name == me) {
            Some(rank) => {
                let group = self.0.final_members.max(stayers.len()).max(1);
                quota_by_rank(topic.partition_count, group, rank)
            }
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn infos(names: &[String]) -> BTreeMap<String, ConsumerInfo> {
        names.iter().map(|n| (n.clone(), ConsumerInfo::default())).collect()
    }

    #[test]
    fn default_info_is_stored_as_nothing_and_old_records_read_as_default() {
        let info = ConsumerInfo::default();
        assert_eq!(serde_json::to_string(&info).expect("encodes"), "{}");
        assert_eq!(serde_json::from_str::<ConsumerInfo>("{}").expect("decodes"), info);
        let zoned = ConsumerInfo { zone: Some("eu-1a".into()), capacity: 2, generation: None };
        let text = serde_json::to_string(&zoned).expect("encodes");
        assert_eq!(serde_json::from_str::<ConsumerInfo>(&text).expect("decodes"), zoned);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// With every attribute at its default, the interface gives exactly the assignment
        /// it wraps, and quotas that sum to the partition count.
        #[test]
        fn balanced_is_todays_assignment(
            (p, n, owners) in (0u32..200, 1usize..9, proptest::collection::vec(0usize..12, 210)),
            keep in proptest::collection::btree_set(0u32..200, 0..12),
        ) {
            let names: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
            let current: BTreeMap<u32, String> =
                (0..p).filter_map(|q| names.get(owners[q as usize]).map(|o| (q, o.clone()))).collect();
            let active = infos(&names);
            let (weights, draining) = (BTreeMap::new(), BTreeSet::new());
            let topic = Placement {
                partition_count: p, weights: &weights, active: &active, draining: &draining,
                current: &current, keep_first: &keep,
            };
            let set: BTreeSet<String> = names.iter().cloned().collect();
            prop_assert_eq!(Balanced.assign(&topic), assign_keeping(p, &current, &set, &keep));
            let quotas: usize = names.iter().map(|c| Balanced.quota(&topic, c)).sum();
            prop_assert_eq!(quotas, p as usize);
            prop_assert_eq!(Balanced.quota(&topic, "nobody"), 0);
            let rollout = Rollout { outgoing: BTreeSet::new(), final_members: n };
            prop_assert_eq!(
                RolloutRule(&rollout).assign(&topic),
                assign_rollout(p, &current, &set, &draining, &keep, &rollout)
            );
            let quotas: usize = names.iter().map(|c| RolloutRule(&rollout).quota(&topic, c)).sum();
            prop_assert_eq!(quotas, p as usize);
        }
    }
}
