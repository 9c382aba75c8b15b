//! What happens to a topic ([`Event`]) and the one entry point that applies it ([`step`]),
//! returning the record [`Write`]s that persist the change; among the events, the
//! consumer-driven steps of a handoff: `PartitionReady` and `PartitionReleased`.
//!
//! Any instance applies these (no round trip through the leader); the coordinator makes
//! the resulting writes conditional on the handoff record it validated against, so a
//! concurrent change makes the write fail instead of acting on stale state.

use super::{ConsumerStatus, Cooldowns, Handoff, Millis, Phase, PlanConfig, TopicState, plan};

/// Why a consumer's call was refused. Nothing changes when one is returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HandoffError {
    /// The partition is not in `0..partition_count`.
    #[error(
        "partition {partition} is out of range: the topic has {partition_count} partitions (0..{partition_count})"
    )]
    PartitionOutOfRange {
        /// The partition asked for.
        partition: u32,
        /// The topic's partition count.
        partition_count: u32,
    },
    /// The consumer has no live registration for this topic.
    #[error("consumer '{0}' is not registered for this topic")]
    UnknownConsumer(String),
    /// `PartitionReady` from a consumer that is not warming this partition.
    #[error(
        "consumer '{consumer}' is not the target of a warming handoff for partition {partition} ({actual})"
    )]
    NotWarmingTarget {
        /// The caller.
        consumer: String,
        /// The partition.
        partition: u32,
        /// What the state actually is, for the message.
        actual: String,
    },
    /// `PartitionReleased` from a consumer that is not releasing this partition.
    #[error("consumer '{consumer}' is not releasing partition {partition} ({actual})")]
    NotReleasing {
        /// The caller.
        consumer: String,
        /// The partition.
        partition: u32,
        /// What the state actually is, for the message.
        actual: String,
    },
}

/// Describes a partition's ownership for an error message.
fn describe(state: &TopicState, partition: u32) -> String {
    let owner = state.owners.get(&partition).map_or("no owner".to_string(), |o| format!("owner '{o}'"));
    match state.handoffs.get(&partition) {
        None => format!("{owner}, no handoff in flight"),
        Some(h) => format!("{owner}, handoff '{}' -> '{}' is {:?}", h.from, h.to, h.phase),
    }
}

fn check_common(state: &TopicState, consumer: &str, partition: u32) -> Result<(), HandoffError> {
    if partition >= state.partition_count {
        return Err(HandoffError::PartitionOutOfRange { partition, partition_count: state.partition_count });
    }
    if !state.is_live(consumer) {
        return Err(HandoffError::UnknownConsumer(consumer.to_string()));
    }
    Ok(())
}

/// `PartitionReady(consumer, partition)`: the target of a warming handoff is ready, so in
/// one step it becomes the owner and the handoff moves to `Releasing` (docs/design.md §5.3).
///
/// A repeated call from the consumer that already owns the partition (the handoff is
/// releasing or done) succeeds without change, so a client may retry a call whose
/// response it lost.
pub fn apply_ready(
    state: &mut TopicState,
    consumer: &str,
    partition: u32,
    now: Millis,
) -> Result<(), HandoffError> {
    check_common(state, consumer, partition)?;
    let owner = state.owners.get(&partition).map(String::as_str);
    match state.handoffs.get(&partition) {
        // A draining target takes nothing new: the leader cancels the handoff.
        Some(Handoff { to, phase: Phase::Warming, .. }) if to == consumer && state.is_active(consumer) => {}
        Some(Handoff { to, phase: Phase::Releasing, .. }) if to == consumer => return Ok(()),
        None if owner == Some(consumer) => return Ok(()),
        _ => {
            return Err(HandoffError::NotWarmingTarget {
                consumer: consumer.to_string(),
                partition,
                actual: describe(state, partition),
            });
        }
    }
    state.owners.insert(partition, consumer.to_string());
    if let Some(handoff) = state.handoffs.get_mut(&partition) {
        handoff.phase = Phase::Releasing;
        handoff.since = now;
        // The new owner owns it with the epoch it warmed for (docs/design.md §10).
        state.epochs.insert(partition, handoff.epoch);
    }
    Ok(())
}

/// `PartitionReleased(consumer, partition)`: the old owner has stopped; the handoff is
/// removed (docs/design.md §5.4).
pub fn apply_released(state: &mut TopicState, consumer: &str, partition: u32) -> Result<(), HandoffError> {
    check_common(state, consumer, partition)?;
    match state.handoffs.get(&partition) {
        Some(Handoff { from, phase: Phase::Releasing, .. }) if from == consumer => {
            state.handoffs.remove(&partition);
            Ok(())
        }
        _ => Err(HandoffError::NotReleasing {
            consumer: consumer.to_string(),
            partition,
            actual: describe(state, partition),
        }),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn warming() -> TopicState {
        crate::handoff::warming_fixture(0)
    }

    #[test]
    fn ready_flips_owner_and_phase_in_one_step() {
        let mut s = warming();
        apply_ready(&mut s, "b", 0, 7).unwrap();
        assert_eq!(s.owners[&0], "b");
        assert_eq!(s.handoffs[&0].phase, Phase::Releasing);
        assert_eq!(s.handoffs[&0].since, 7);
        // Retried call: accepted, no change.
        let before = s.clone();
        apply_ready(&mut s, "b", 0, 9).unwrap();
        assert_eq!(s, before);
    }

    #[test]
    fn wrong_calls_are_refused_and_change_nothing() {
        let s = warming();
        let cases: Vec<(&str, u32, bool)> =
            vec![("a", 0, true), ("b", 1, true), ("c", 0, true), ("b", 2, true), ("b", 0, false)];
        for (consumer, partition, ready) in cases {
            let mut t = s.clone();
            let result = if ready {
                apply_ready(&mut t, consumer, partition, 1)
            } else {
                apply_released(&mut t, consumer, partition)
            };
            assert!(result.is_err(), "{consumer} {partition} ready={ready} must be refused");
            assert_eq!(t, s);
        }
        let mut t = s.clone();
        assert!(matches!(apply_ready(&mut t, "c", 0, 1), Err(HandoffError::UnknownConsumer(_))));
        assert!(matches!(apply_ready(&mut t, "b", 5, 1), Err(HandoffError::PartitionOutOfRange { .. })));
        let msg = apply_ready(&mut t, "a", 0, 1).unwrap_err().to_string();
        assert!(msg.contains("handoff 'a' -> 'b' is Warming"), "{msg}");
    }

    #[test]
    fn released_removes_the_handoff_only_from_the_releasing_owner() {
        let mut s = warming();
        apply_ready(&mut s, "b", 0, 1).unwrap();
        assert!(apply_released(&mut s, "b", 0).is_err());
        apply_released(&mut s, "a", 0).unwrap();
        assert!(s.handoffs.is_empty());
        assert_eq!(s.owners[&0], "b");
        assert!(apply_released(&mut s, "a", 0).is_err(), "a second release is refused");
    }
}
