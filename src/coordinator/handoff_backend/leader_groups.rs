//! Leader groups (docs/design.md §4): the topics are split into `groups` by a stable hash of
//! their names, and each group has a leadership of its own, so that with several instances
//! the planning and the fenced writes are spread over them. With one group (the default)
//! there is one leader key, `{prefix}leader`, as before groups existed.
//!
//! Who campaigns for which group is decided from the instance records every instance
//! mirrors ([`preferred`], pure): a balanced rendezvous, the same on every instance for the
//! same records. An instance campaigns for the groups it is preferred for, and for a group
//! left without a leader for longer than a TTL (a preferred instance that cannot campaign);
//! it resigns a group it leads once another live instance is preferred for it. An instance
//! that dies takes only its groups' leader keys with its lease; the same revision removes
//! its instance record, so every survivor computes the same new preferences at once.

use std::collections::BTreeMap;
use std::time::Duration;

/// One leadership: group `group` of `groups`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaderGroup {
    /// How many groups the topics are split into.
    pub groups: u32,
    /// This group's number, below `groups`.
    pub group: u32,
}

impl LeaderGroup {
    /// The only group when the topics are not split: the classic single leader.
    pub const ONLY: LeaderGroup = LeaderGroup { groups: 1, group: 0 };

    /// Every group of a split into `groups` (at least one).
    pub fn all(groups: u32) -> impl Iterator<Item = LeaderGroup> {
        let groups = groups.max(1);
        (0..groups).map(move |group| LeaderGroup { groups, group })
    }

    /// Whether this group plans `topic`.
    pub fn plans(&self, topic: &str) -> bool {
        group_of(topic, self.groups) == self.group
    }
}

/// A group campaigned for after its vacancy grace, not as its preferred instance (that one
/// did not campaign for a TTL: its loop is stuck, or not loaded, while its lease lives),
/// is kept this many TTLs
/// before it is handed back, so that such an instance does not make the group change
/// hands, and its new leader settle, every TTL.
pub const KEEP_AFTER_GRACE_TTLS: u32 = 10;

/// The group of `topic` among `groups` (FNV-1a of the name: stable across builds and
/// versions, unlike the standard library's hasher, so instances of different versions
/// agree during a rolling upgrade).
pub fn group_of(topic: &str, groups: u32) -> u32 {
    if groups <= 1 {
        return 0;
    }
    (fnv1a(topic.as_bytes()) % u64::from(groups)) as u32
}

/// FNV-1a, 64 bits, over bytes from anywhere (a rank hashes three pieces without joining them).
fn fnv1a<'a>(bytes: impl IntoIterator<Item = &'a u8>) -> u64 {
    bytes
        .into_iter()
        .fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3))
}

/// The instance preferred to lead each group of `groups`, given the live `instances`
/// (pure; the same answer on every instance for the same records). A balanced rendezvous:
/// groups are taken in order, each by the instance that ranks it highest among those not
/// yet holding `⌈groups / instances⌉`. No instance is preferred for more than its share,
/// and an instance that leaves changes the preference of few groups besides its own.
pub fn preferred<'a>(groups: u32, instances: impl IntoIterator<Item = &'a str>) -> BTreeMap<u32, String> {
    let instances: Vec<&str> = instances.into_iter().collect();
    let mut chosen = BTreeMap::new();
    if instances.is_empty() {
        return chosen;
    }
    let groups = groups.max(1);
    let share = groups.div_ceil(instances.len() as u32);
    let mut held: BTreeMap<&str, u32> = BTreeMap::new();
    for group in 0..groups {
        let best = instances
            .iter()
            .filter(|instance| held.get(**instance).copied().unwrap_or(0) < share)
            .max_by_key(|instance| (rank(instance, group), **instance));
        if let Some(instance) = best {
            *held.entry(instance).or_default() += 1;
            chosen.insert(group, (*instance).to_string());
        }
    }
    chosen
}

/// Why an instance campaigns for a group ([`campaigns`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Campaign {
    /// It is the preferred instance (always so with one group: whoever comes first).
    Preferred,
    /// The group has been without a leader key for the grace: the preferred instance does
    /// not campaign (its loop is stuck or not loaded, or its view of the instances differs).
    AfterGrace,
    /// Not preferred, but the key is bound to its own live session: it led the group and
    /// stepped down while its lease was fenced, and the session outlived the fence. Nobody
    /// else can take the key while that session lives, so it adopts it (reads it, never
    /// creates it: a key of its own seen after its own resignation may be gone already)
    /// and hands the group over at its next look.
    Own,
}

/// Whether instance `me` campaigns for `group` now, and why, given the live instances'
/// `preferences` ([`preferred`] of their count) and how long the group has been without a
/// leader key (pure; `None`: it leaves the group to the preferred instance).
pub fn campaigns(
    group: LeaderGroup,
    me: &str,
    preferences: Option<&BTreeMap<u32, String>>,
    vacant_for: Duration,
    grace: Duration,
) -> Option<Campaign> {
    let preferred = group.groups <= 1 || chosen(preferences, group).is_some_and(|chosen| chosen == me);
    match (preferred, vacant_for >= grace) {
        (true, _) => Some(Campaign::Preferred),
        (false, true) => Some(Campaign::AfterGrace),
        (false, false) => None,
    }
}

/// Whether `me`, leading `group`, hands it over: another live instance is preferred for it
/// in `preferences` (pure; never with one group).
pub fn hands_over(group: LeaderGroup, me: &str, preferences: Option<&BTreeMap<u32, String>>) -> bool {
    group.groups > 1 && chosen(preferences, group).is_some_and(|chosen| chosen != me)
}

/// The instance `preferences` choose for `group`.
fn chosen(preferences: Option<&BTreeMap<u32, String>>, group: LeaderGroup) -> Option<&str> {
    preferences.and_then(|p| p.get(&group.group)).map(String::as_str)
}

/// How much `instance` wants `group` (rendezvous weight).
fn rank(instance: &str, group: u32) -> u64 {
    let group = group.to_be_bytes();
    // One more round of mixing: FNV alone leaves close inputs with close hashes.
    let hash = fnv1a(instance.as_bytes().iter().chain(&[0]).chain(&group));
    (hash ^ (hash >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("assigner-{i}")).collect()
    }

    #[test]
    fn one_group_plans_every_topic() {
        assert!(["a", "orders", ""].iter().all(|topic| LeaderGroup::ONLY.plans(topic)));
        assert_eq!(LeaderGroup::all(0).collect::<Vec<_>>(), vec![LeaderGroup::ONLY]);
    }

    #[test]
    fn every_topic_has_exactly_one_group_and_the_groups_are_used_evenly() {
        let mut counts = [0u32; 8];
        for t in 0..4000 {
            let topic = format!("topic-{t}");
            let planners: Vec<_> = LeaderGroup::all(8).filter(|g| g.plans(&topic)).collect();
            assert_eq!(planners.len(), 1, "{topic}");
            counts[planners[0].group as usize] += 1;
        }
        assert!(counts.iter().all(|c| (400..600).contains(c)), "uneven split {counts:?}");
    }

    #[test]
    fn preferences_are_balanced_and_the_same_whatever_the_order_of_the_records() {
        for (groups, n) in [(1, 1), (1, 3), (6, 3), (20, 5), (40, 5), (7, 10), (16, 3)] {
            let instances = names(n);
            let forward = preferred(groups, instances.iter().map(String::as_str));
            let backward = preferred(groups, instances.iter().rev().map(String::as_str));
            assert_eq!(forward, backward);
            assert_eq!(forward.len() as u32, groups);
            let mut load: BTreeMap<&str, u32> = BTreeMap::new();
            for instance in forward.values() {
                *load.entry(instance).or_default() += 1;
            }
            let share = groups.div_ceil(n as u32);
            assert!(load.values().all(|l| *l <= share), "{groups} over {n}: {load:?}");
        }
    }

    #[test]
    fn an_instance_that_leaves_moves_its_own_groups_and_few_others() {
        let instances = names(5);
        let before = preferred(40, instances.iter().map(String::as_str));
        let gone = "assigner-2";
        let after = preferred(40, instances.iter().map(String::as_str).filter(|i| *i != gone));
        let moved_others =
            before.iter().filter(|(group, owner)| *owner != gone && after.get(group) != Some(*owner)).count();
        let own = before.values().filter(|owner| *owner == gone).count();
        assert!(own > 0);
        assert!(after.values().all(|owner| owner != gone));
        // Balancing may shift a few more, never most of the survivors' groups.
        assert!(moved_others <= own, "{moved_others} other groups moved for {own} of the leaver's");
    }

    #[test]
    fn the_preferred_instance_campaigns_at_once_the_others_after_the_grace() {
        let instances = names(3);
        let live = || instances.iter().map(String::as_str);
        let group = LeaderGroup { groups: 6, group: 4 };
        let chosen = preferred(6, live())[&4].clone();
        let other = instances.iter().find(|i| **i != chosen).expect("three instances");
        let grace = Duration::from_secs(10);
        let preferences = preferred(6, live());
        let prefer = Some(&preferences);
        assert_eq!(campaigns(group, &chosen, prefer, Duration::ZERO, grace), Some(Campaign::Preferred));
        assert_eq!(campaigns(group, other, prefer, Duration::from_secs(9), grace), None);
        assert_eq!(campaigns(group, other, prefer, grace, grace), Some(Campaign::AfterGrace));
        assert!(hands_over(group, other, prefer));
        assert!(!hands_over(group, &chosen, prefer));
        // One group: everyone campaigns, nobody hands over.
        assert_eq!(
            campaigns(LeaderGroup::ONLY, other, prefer, Duration::ZERO, grace),
            Some(Campaign::Preferred)
        );
        assert!(!hands_over(LeaderGroup::ONLY, other, prefer));
    }

    #[test]
    fn nobody_is_preferred_without_instances() {
        assert!(preferred(4, std::iter::empty()).is_empty());
    }
}
