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
pub use transitions::{HandoffError, apply_ready, apply_released};
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

/// One record change that persists a state change. The coordinator turns these into
/// transaction ops, each guarded by the revision of the record as it was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Set the owner of a partition.
    SetOwner {
        /// The partition.
        partition: u32,
        /// Its new owner.
        owner: String,
        /// The epoch of this ownership.
        epoch: u64,
    },
    /// Remove the owner record of a partition (only for partitions beyond the count).
    ClearOwner {
        /// The partition.
        partition: u32,
    },
    /// Create or replace the handoff record of a partition.
    PutHandoff {
        /// The partition.
        partition: u32,
        /// The handoff.
        handoff: Handoff,
    },
    /// Remove the handoff record of a partition.
    DeleteHandoff {
        /// The partition.
        partition: u32,
    },
}

impl Write {
    /// The partition this write touches.
    pub fn partition(&self) -> u32 {
        match self {
            Write::SetOwner { partition, .. }
            | Write::ClearOwner { partition }
            | Write::PutHandoff { partition, .. }
            | Write::DeleteHandoff { partition } => *partition,
        }
    }
}

/// The writes that turn `old` into `new` (owners and handoffs only), in partition order.
pub fn diff_writes(old: &TopicState, new: &TopicState) -> Vec<Write> {
    let mut writes = Vec::new();
    let partitions: std::collections::BTreeSet<u32> = old
        .owners
        .keys()
        .chain(new.owners.keys())
        .chain(old.handoffs.keys())
        .chain(new.handoffs.keys())
        .copied()
        .collect();
    for partition in partitions {
        let epoch = |state: &TopicState| state.epochs.get(&partition).copied().unwrap_or(0);
        match (old.owners.get(&partition), new.owners.get(&partition)) {
            (a, Some(b)) if a != Some(b) || epoch(old) != epoch(new) => {
                writes.push(Write::SetOwner { partition, owner: b.clone(), epoch: epoch(new) })
            }
            (Some(_), None) => writes.push(Write::ClearOwner { partition }),
            _ => {}
        }
        match (old.handoffs.get(&partition), new.handoffs.get(&partition)) {
            (a, Some(b)) if a != Some(b) => writes.push(Write::PutHandoff { partition, handoff: b.clone() }),
            (Some(_), None) => writes.push(Write::DeleteHandoff { partition }),
            _ => {}
        }
    }
    writes
}

/// Something that happens to a topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A consumer registered (or re-registered) and is active.
    Joined(String),
    /// A consumer's session ended (crash, or lease expiry).
    Expired(String),
    /// A consumer asked to drain.
    Draining(String),
    /// `PartitionReady` from a consumer.
    Ready(String, u32),
    /// `PartitionReleased` from a consumer.
    Released(String, u32),
    /// Time passes; the leader reconciles at `now`.
    Tick(Millis),
}

/// Applies one event. Consumer events change membership only (the leader reacts on its
/// next tick); `Ready` / `Released` are validated and may be refused, leaving `state` as
/// it was; `Tick` runs [`plan`]. Returns the writes that persist the change.
pub fn step(
    state: &mut TopicState,
    event: &Event,
    now: Millis,
    config: &PlanConfig,
    cooldowns: &mut Cooldowns,
) -> Result<Vec<Write>, HandoffError> {
    let before = state.clone();
    match event {
        Event::Joined(name) => {
            state.consumers.insert(name.clone(), ConsumerStatus::Active);
        }
        Event::Expired(name) => {
            state.consumers.remove(name);
        }
        Event::Draining(name) => {
            if let Some(status) = state.consumers.get_mut(name) {
                *status = ConsumerStatus::Draining;
            }
        }
        Event::Ready(name, partition) => apply_ready(state, name, *partition, now)?,
        Event::Released(name, partition) => apply_released(state, name, *partition)?,
        Event::Tick(at) => {
            plan(state, *at, config, cooldowns);
        }
    }
    Ok(diff_writes(&before, state))
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
