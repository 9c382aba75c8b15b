//! What one consumer should know, and the commands that bring it up to date.
//!
//! Commands are derived from state, never stored: an instance remembers the last
//! [`ConsumerView`] it sent to each of its consumers and, on every state change, sends
//! [`diff_views`] of that and the new view. A reconnecting consumer starts from an empty
//! view, so it gets a full snapshot plus every warm or release still pending for it.

use std::collections::{BTreeMap, BTreeSet};

use super::{Handoff, Phase, TopicState};

/// One consumer's share of a topic's state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsumerView {
    /// Partitions it owns.
    pub owned: BTreeSet<u32>,
    /// Partitions it is warming, with their current owner.
    pub warming: BTreeMap<u32, String>,
    /// Partitions it must release, with their new owner.
    pub releasing: BTreeMap<u32, String>,
}

impl ConsumerView {
    /// The view of `consumer` in `state`. A consumer that is not live sees nothing.
    pub fn of(state: &TopicState, consumer: &str) -> Self {
        let mut view = Self::default();
        if !state.is_live(consumer) {
            return view;
        }
        view.owned = state.owners.iter().filter(|(_, o)| *o == consumer).map(|(p, _)| *p).collect();
        for (p, h) in state.handoffs.iter().filter(|(_, h)| role_holder(h) == consumer) {
            view.take_role(*p, h);
        }
        view
    }

    /// Notes the role its consumer ([`role_holder`]) has in the handoff `h` of `partition`.
    fn take_role(&mut self, partition: u32, h: &Handoff) {
        match h.phase {
            Phase::Warming => self.warming.insert(partition, h.from.clone()),
            Phase::Releasing => self.releasing.insert(partition, h.to.clone()),
        };
    }

    /// The part of this view within `partitions`.
    pub fn within(&self, partitions: &BTreeSet<u32>) -> Self {
        let mut part = Self::default();
        for p in partitions {
            if self.owned.contains(p) {
                part.owned.insert(*p);
            }
            if let Some(from) = self.warming.get(p) {
                part.warming.insert(*p, from.clone());
            }
            if let Some(to) = self.releasing.get(p) {
                part.releasing.insert(*p, to.clone());
            }
        }
        part
    }

    /// Replaces the part of this view within `partitions` by `part` (a view of them alone).
    pub fn patch(&mut self, partitions: &BTreeSet<u32>, part: Self) {
        for p in partitions {
            self.owned.remove(p);
            self.warming.remove(p);
            self.releasing.remove(p);
        }
        self.owned.extend(part.owned);
        self.warming.extend(part.warming);
        self.releasing.extend(part.releasing);
    }

    /// Whether it owns nothing and takes part in no handoff, outside `partitions` (all of
    /// it: `None`). The view shows every role: a warm's source and a release's target own
    /// the partition, the others are listed.
    pub fn is_idle_outside(&self, partitions: Option<&BTreeSet<u32>>) -> bool {
        let outside = |p: &u32| partitions.is_none_or(|within| !within.contains(p));
        !self.owned.iter().any(outside)
            && !self.warming.keys().any(outside)
            && !self.releasing.keys().any(outside)
    }

    /// The views of every live consumer of `state`, in one pass over the partitions
    /// (what the relay needs after each revision; [`ConsumerView::of`] per consumer would
    /// be quadratic on a large topic).
    pub fn all(state: &TopicState) -> BTreeMap<String, ConsumerView> {
        Self::all_of(state.consumers.keys(), &state.owners, &state.handoffs)
    }

    /// [`ConsumerView::all`] over the parts of a state held elsewhere (the coordinator's
    /// cache keeps them with their revisions), so the views are derived without first
    /// cloning the whole topic into a [`TopicState`].
    pub fn all_of<'a>(
        consumers: impl IntoIterator<Item = &'a String>,
        owners: impl IntoIterator<Item = (&'a u32, &'a String)>,
        handoffs: impl IntoIterator<Item = (&'a u32, &'a Handoff)>,
    ) -> BTreeMap<String, ConsumerView> {
        let mut views: BTreeMap<String, ConsumerView> =
            consumers.into_iter().map(|c| (c.clone(), ConsumerView::default())).collect();
        for (p, owner) in owners {
            if let Some(view) = views.get_mut(owner) {
                view.owned.insert(*p);
            }
        }
        for (p, h) in handoffs {
            if let Some(view) = views.get_mut(role_holder(h)) {
                view.take_role(*p, h);
            }
        }
        views
    }
}

/// The consumer a handoff asks for something now: its target while it warms, its source
/// while it releases (the other side only owns the partition).
fn role_holder(h: &Handoff) -> &str {
    match h.phase {
        Phase::Warming => &h.to,
        Phase::Releasing => &h.from,
    }
}

/// A command for one consumer, mirroring `AssignmentCommand` on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Partitions now owned, and partitions no longer owned (or no longer to be warmed).
    Assignment {
        /// Newly owned.
        assigned: Vec<u32>,
        /// No longer owned, or a warm that was cancelled.
        unassigned: Vec<u32>,
    },
    /// Start warming a partition.
    Warm {
        /// The partition.
        partition: u32,
        /// Its current owner.
        current_owner: String,
    },
    /// Stop processing a partition: the handoff is complete.
    Release {
        /// The partition.
        partition: u32,
        /// The new owner.
        new_owner: String,
    },
}

/// The commands that take a consumer from `told` to `now`.
///
/// * a newly owned partition is `assigned`;
/// * a partition owned before that it now must release gets `Release` (never `unassigned`:
///   the old owner keeps processing until it acknowledges);
/// * a partition owned before and not releasing now (its owner died or was replaced) is
///   `unassigned`, as is a warm that was cancelled (the proto has no "cancel warm";
///   `unassigned` for a partition being warmed means "drop the warm state");
/// * a new warm or release is sent once.
///
/// An `Assignment` comes first, so a consumer learns what it lost and gained before it is
/// asked to warm or release; an empty diff sends nothing.
pub fn diff_views(told: &ConsumerView, now: &ConsumerView) -> Vec<Command> {
    let assigned: Vec<u32> = now.owned.difference(&told.owned).copied().collect();
    let mut unassigned: Vec<u32> = told
        .owned
        .iter()
        .filter(|p| !now.owned.contains(p) && !now.releasing.contains_key(p))
        .copied()
        .collect();
    unassigned.extend(
        told.warming.keys().filter(|p| !now.warming.contains_key(p) && !now.owned.contains(p)).copied(),
    );
    unassigned.sort_unstable();
    let mut commands = Vec::new();
    if !assigned.is_empty() || !unassigned.is_empty() {
        commands.push(Command::Assignment { assigned, unassigned });
    }
    for (p, from) in &now.warming {
        if told.warming.get(p) != Some(from) {
            commands.push(Command::Warm { partition: *p, current_owner: from.clone() });
        }
    }
    for (p, to) in &now.releasing {
        if told.releasing.get(p) != Some(to) {
            commands.push(Command::Release { partition: *p, new_owner: to.clone() });
        }
    }
    commands
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handoff::{ConsumerStatus, apply_ready};

    fn two_consumers_warming() -> TopicState {
        crate::handoff::warming_fixture(1)
    }

    #[test]
    fn snapshot_then_warm_then_flip() {
        let mut s = two_consumers_warming();
        let a0 = ConsumerView::of(&s, "a");
        let b0 = ConsumerView::of(&s, "b");
        assert_eq!(
            diff_views(&ConsumerView::default(), &a0),
            vec![Command::Assignment { assigned: vec![0, 1], unassigned: vec![] }]
        );
        assert_eq!(
            diff_views(&ConsumerView::default(), &b0),
            vec![Command::Warm { partition: 1, current_owner: "a".into() }]
        );
        apply_ready(&mut s, "b", 1, 1).unwrap();
        let a1 = ConsumerView::of(&s, "a");
        let b1 = ConsumerView::of(&s, "b");
        assert_eq!(diff_views(&a0, &a1), vec![Command::Release { partition: 1, new_owner: "b".into() }]);
        assert_eq!(diff_views(&b0, &b1), vec![Command::Assignment { assigned: vec![1], unassigned: vec![] }]);
        assert!(diff_views(&a1, &a1).is_empty());
    }

    #[test]
    fn all_views_match_one_by_one() {
        let mut s = two_consumers_warming();
        s.consumers.insert("idle".into(), ConsumerStatus::Draining);
        for state in [s.clone(), {
            apply_ready(&mut s, "b", 1, 1).unwrap();
            s
        }] {
            let all = ConsumerView::all(&state);
            assert_eq!(all.len(), 3);
            for (name, view) in all {
                assert_eq!(view, ConsumerView::of(&state, &name), "{name}");
            }
        }
    }

    #[test]
    fn cancelled_warm_and_lost_ownership_are_unassigned() {
        let s = two_consumers_warming();
        let b0 = ConsumerView::of(&s, "b");
        let mut cancelled = s.clone();
        cancelled.handoffs.clear();
        assert_eq!(
            diff_views(&b0, &ConsumerView::of(&cancelled, "b")),
            vec![Command::Assignment { assigned: vec![], unassigned: vec![1] }]
        );
        let a0 = ConsumerView::of(&s, "a");
        let mut gone = s.clone();
        gone.consumers.remove("a");
        assert_eq!(
            diff_views(&a0, &ConsumerView::of(&gone, "a")),
            vec![Command::Assignment { assigned: vec![], unassigned: vec![0, 1] }]
        );
    }

    /// A view of partitions `0..12`: each one owned, warming from `x`, releasing to `y`,
    /// or nothing, as `roles` says.
    fn view_from(roles: &[u8]) -> ConsumerView {
        let mut view = ConsumerView::default();
        for (p, role) in roles.iter().enumerate() {
            let p = p as u32;
            match role % 5 {
                1 => {
                    view.owned.insert(p);
                }
                2 => {
                    view.warming.insert(p, "x".into());
                }
                3 => {
                    view.owned.insert(p);
                    view.releasing.insert(p, "y".into());
                }
                4 => {
                    view.warming.insert(p, "z".into());
                }
                _ => {}
            }
        }
        view
    }

    proptest::proptest! {
        /// Comparing only the partitions where two views differ (and any others) gives the
        /// commands of the whole comparison, and patching that part into the old view gives
        /// the new one: what lets the relay compare only what a revision changed.
        #[test]
        fn comparing_the_changed_part_is_comparing_the_whole(
            told in proptest::collection::vec(0u8..5, 12),
            now in proptest::collection::vec(0u8..5, 12),
            extra in proptest::collection::btree_set(0u32..12, 0..4),
        ) {
            let (told, now) = (view_from(&told), view_from(&now));
            let mut within = extra;
            within.extend((0..12).filter(|p| told.within(&BTreeSet::from([*p])) != now.within(&BTreeSet::from([*p]))));
            let part = now.within(&within);
            proptest::prop_assert_eq!(diff_views(&told.within(&within), &part), diff_views(&told, &now));
            let outside_idle = told.is_idle_outside(Some(&within)) && part.is_idle_outside(None);
            proptest::prop_assert_eq!(outside_idle, now.is_idle_outside(None));
            let mut patched = told;
            patched.patch(&within, part);
            proptest::prop_assert_eq!(patched, now);
        }
    }
}
