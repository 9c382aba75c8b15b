//! The leader's pure decisions, which the machine's leader (`machine/leader.rs`) takes:
//! the [`election`] (campaign, adoption, stepping down, resignation), the [`reconcile`]
//! plan of each topic (with what it takes from the Kubernetes [`view`]), cut into fenced
//! batches, and the [`weights`] to store.
//!
//! **Leader groups.** The topics are split into `--leader-groups` groups
//! (`leader_groups.rs`), one leadership each, each planning only its group's topics.
//!
//! **The fence.** A group's leader key is created (compare: absent) bound to this
//! instance's session; its create revision is the [`Fence`]. Every write a group's leader
//! makes also compares that key's create revision with the fence: a deposed leader's write
//! fails and changes nothing.

pub(super) mod election;
pub(super) mod reconcile;
mod view;
pub(super) mod weights;

use crate::store::{Revision, SessionId};

/// The leader plans at most about one part in `PLAN_PACE + 1` of the time: after a plan
/// that took `d`, the next waits until `PLAN_PACE × d` has passed. With several leader
/// groups the budget is the instance's: a group's pass also waits for the pace left by
/// any other group's plan. Under a stream of
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
