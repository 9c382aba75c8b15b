//! The warm / ready / release state machine, as pure code.
//!
//! Everything here is a function of its inputs: the state of one topic (consumers,
//! owners, handoffs), an [`Event`], and the time `now` in milliseconds, passed in by the
//! caller. There is no I/O and no clock, which is what lets the simulation test run
//! thousands of random schedules, and what lets the memory and etcd backends share one
//! implementation: the coordinator turns the state change into compare-and-swap writes.
//!
//! * [`step`] applies an event and returns the new state plus the [`Write`]s that persist it.
//! * [`plan`] (the `Tick` event) is the leader's decision: targets from
//!   [`crate::assignment::assign`], handoffs started, cancelled, timed out and completed
//!   (docs/design.md §5); [`plan_with`] plans during a rollout of the consumers
//!   ([`crate::assignment::assign_rollout`]), and [`plan_placed`] under a placement mode
//!   ([`placement`]: by count, by load, or by count with the load plan in the shadow,
//!   docs/design.md §11).
//! * [`ConsumerView`] and [`diff_views`] derive the commands a consumer must be sent from
//!   what it was told before and the state now.

pub mod placement;
mod plan;
mod transitions;
mod view;

pub use placement::{
    Deferral, LoadPreview, MoveReason, PlacementMemory, PlacementMode, PlacementReport, PlacementSettings,
};
pub use plan::{
    Cooldowns, PlacementInputs, PlanConfig, PlanReport, load_preview, plan, plan_placed, plan_with,
};
pub use transitions::{Event, HandoffError, Write, apply_ready, apply_released, diff_writes, step};
pub use view::{Command, ConsumerView, diff_views};

use std::collections::BTreeMap;

use crate::assignment::ConsumerInfo;

/// Milliseconds since the Unix epoch: the only notion of time this module knows.
pub type Millis = u64;

/// Whether a consumer may receive partitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ConsumerStatus {
    /// Eligible for partitions.
    Active,
    /// Leaving: gets no new partitions, hands off the ones it has.
    Draining,
}

/// The two phases of a handoff of one partition from `from` to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Phase {
    /// `to` is warming; `from` still owns the partition.
    Warming,
    /// `to` owns the partition; `from` has been told to release it.
    Releasing,
}

/// An in-flight move of one partition.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Handoff {
    /// The consumer giving the partition up.
    pub from: String,
    /// The consumer taking it.
    pub to: String,
    /// Where the handoff stands.
    pub phase: Phase,
    /// When the current phase began (for the warm and release time limits).
    pub since: Millis,
    /// The epoch `to` owns the partition with once the handoff completes (docs/design.md
    /// §10), known from the start so a warming consumer is told it. 0 in records written
    /// before epochs existed.
    #[serde(default)]
    pub epoch: u64,
}

/// The state of one topic, as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicState {
    /// Number of partitions (`0..partition_count`).
    pub partition_count: u32,
    /// Live consumers (their session records exist) and their status.
    pub consumers: BTreeMap<String, ConsumerStatus>,
    /// Current owner of each partition that has one.
    pub owners: BTreeMap<u32, String>,
    /// In-flight handoffs by partition.
    pub handoffs: BTreeMap<u32, Handoff>,
    /// What placement knows of each live consumer that has more than the defaults.
    pub info: BTreeMap<String, ConsumerInfo>,
    /// Weights of the partitions that have one (the default weight otherwise).
    pub weights: BTreeMap<u32, u64>,
    /// The epoch of each owned partition's ownership (docs/design.md §10).
    pub epochs: BTreeMap<u32, u64>,
    /// The epoch an ownership decided from this state gets (a direct assignment, a new
    /// handoff's target): one above the store revision the state was read at, so above
    /// every epoch already written (each was one above an earlier revision, and the
    /// writes that decide from this state compare the records they replace).
    pub next_epoch: u64,
}

impl TopicState {
    /// Whether `name` is a live consumer.
    pub fn is_live(&self, name: &str) -> bool {
        self.consumers.contains_key(name)
    }

    /// Whether `name` is a live, active (not draining) consumer.
    pub fn is_active(&self, name: &str) -> bool {
        self.consumers.get(name) == Some(&ConsumerStatus::Active)
    }

    /// Whether `name` owns nothing and takes part in no handoff (a drained consumer).
    pub fn is_idle(&self, name: &str) -> bool {
        !self.owners.values().any(|o| o == name)
            && !self.handoffs.values().any(|h| h.from == name || h.to == name)
    }
}

/// `a` and `b` active on a topic of two partitions that `a` owns, `b` warming `partition`
/// (a state the transitions' and the views' tests start from).
#[cfg(test)]
pub(crate) fn warming_fixture(partition: u32) -> TopicState {
    let mut s = TopicState { partition_count: 2, ..Default::default() };
    s.consumers.insert("a".into(), ConsumerStatus::Active);
    s.consumers.insert("b".into(), ConsumerStatus::Active);
    s.owners.insert(0, "a".into());
    s.owners.insert(1, "a".into());
    let handoff = Handoff { from: "a".into(), to: "b".into(), phase: Phase::Warming, since: 0, epoch: 0 };
    s.handoffs.insert(partition, handoff);
    s
}
