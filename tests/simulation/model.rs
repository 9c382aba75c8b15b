//! The model the simulation checks `step` against: a reference model of the calls
//! (docs/design.md §5.3, §5.4, §5.7) and of membership events, how persisted writes apply, and
//! what a consumer knows as a client (only what it was sent).

use std::collections::{BTreeMap, BTreeSet};

use kafka_assigner::handoff::{
    ConsumerStatus, ConsumerView, Event, HandoffError, Millis, Phase, TopicState, Write,
};

/// Names that never join.
pub(crate) const UNKNOWN: [&str; 2] = ["ghost", ""];

/// Applies one persisted write to a state (owners and handoffs only).
pub(crate) fn apply(state: &mut TopicState, write: &Write) {
    match write {
        Write::SetOwner { partition, owner, epoch } => {
            state.owners.insert(*partition, owner.clone());
            state.epochs.insert(*partition, *epoch);
        }
        Write::ClearOwner { partition } => {
            state.owners.remove(partition);
            state.epochs.remove(partition);
        }
        Write::PutHandoff { partition, handoff } => {
            state.handoffs.insert(*partition, handoff.clone());
        }
        Write::DeleteHandoff { partition } => {
            state.handoffs.remove(partition);
        }
    }
}

/// Why the reference model refuses a call (docs/design.md §5.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    OutOfRange,
    Unknown,
    NotWarming,
    NotReleasing,
}

impl Refusal {
    pub(crate) fn of(err: &HandoffError) -> Self {
        match err {
            HandoffError::PartitionOutOfRange { .. } => Refusal::OutOfRange,
            HandoffError::UnknownConsumer(_) => Refusal::Unknown,
            HandoffError::NotWarmingTarget { .. } => Refusal::NotWarming,
            HandoffError::NotReleasing { .. } => Refusal::NotReleasing,
        }
    }
}

/// The reference model of `PartitionReady` (`ready`) and `PartitionReleased`: the state an
/// accepted call leads to, or why it is refused.
fn expected_call(
    state: &TopicState,
    ready: bool,
    c: &str,
    p: u32,
    now: Millis,
) -> Result<TopicState, Refusal> {
    if p >= state.partition_count {
        return Err(Refusal::OutOfRange);
    }
    if !state.consumers.contains_key(c) {
        return Err(Refusal::Unknown);
    }
    let mut next = state.clone();
    let handoff = state.handoffs.get(&p);
    if ready {
        match handoff {
            // §5.3: owner = B and phase Releasing, in one step (B still active: a
            // draining consumer takes nothing new).
            Some(h) if h.to == c && h.phase == Phase::Warming && state.is_active(c) => {
                next.owners.insert(p, c.to_string());
                let h = next.handoffs.get_mut(&p).expect("handoff exists");
                h.phase = Phase::Releasing;
                h.since = now;
                // §10: it owns the partition with the epoch it warmed for.
                next.epochs.insert(p, h.epoch);
            }
            // A retried ready from the consumer that already owns it: accepted, no change.
            Some(h) if h.to == c && h.phase == Phase::Releasing => {}
            None if state.owners.get(&p).map(String::as_str) == Some(c) => {}
            _ => return Err(Refusal::NotWarming),
        }
    } else {
        match handoff {
            // §5.4: the handoff is removed.
            Some(h) if h.phase == Phase::Releasing && h.from == c => {
                next.handoffs.remove(&p);
            }
            _ => return Err(Refusal::NotReleasing),
        }
    }
    Ok(next)
}

/// What the reference model expects of `event` at `now` from `state`: the next state or
/// the refusal. `None` for a tick, which the invariants check instead.
pub(crate) fn expected(
    state: &TopicState,
    event: &Event,
    now: Millis,
) -> Option<Result<TopicState, Refusal>> {
    match event {
        Event::Ready(c, p) => Some(expected_call(state, true, c, *p, now)),
        Event::Released(c, p) => Some(expected_call(state, false, c, *p, now)),
        Event::Joined(c) => {
            let mut s = state.clone();
            s.consumers.insert(c.clone(), ConsumerStatus::Active);
            Some(Ok(s))
        }
        Event::Expired(c) => {
            let mut s = state.clone();
            s.consumers.remove(c);
            Some(Ok(s))
        }
        Event::Draining(c) => {
            let mut s = state.clone();
            if let Some(status) = s.consumers.get_mut(c) {
                *status = ConsumerStatus::Draining;
            }
            Some(Ok(s))
        }
        Event::Tick(_) => None,
    }
}

/// What the test knows about one name of the pool: whether it is live, and, as a client,
/// only what it was sent.
#[derive(Clone, Debug, Default)]
pub(crate) struct Client {
    pub(crate) live: bool,
    /// The view the relay last sent (the relay's memory, not the client's).
    pub(crate) told: ConsumerView,
    /// Partitions the client believes it owns.
    pub(crate) belief: BTreeSet<u32>,
    /// Warms it was asked for and not told to drop: partition → current owner.
    pub(crate) warms: BTreeMap<u32, String>,
    /// Releases it was asked for and has not answered: partition → new owner.
    pub(crate) releases: BTreeMap<u32, String>,
}
