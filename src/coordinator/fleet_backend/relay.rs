//! The relay: tell every local consumer the difference between the leases it holds and
//! what it was told. The machine (`machine/streams.rs`) keeps the cache equal to the store
//! and relays every change with this step (pure).
//!
//! Updates come from here, derived from the cache after a whole revision has been applied
//! (so a consumer never sees half a transaction), with one exception: a partition the
//! consumer's own claim step gives back is `unassigned` by the claim step *before* its
//! lease is deleted, once the stream's transport took it (`machine/claim.rs`), and kept out of the
//! consumer's view meanwhile ([`FleetTold::releasing`]).

use std::collections::BTreeSet;

use super::state::{FleetCache, FleetTopic};
use crate::coordinator::shared::{
    mirror::{Changes, Touched},
    outgoing::update,
    relay::{Registration, RelayStep, StreamSeen, Tell},
    streams::{StreamKey, Told},
};
use crate::proto::v1::AssignmentCommand;
use crate::store::{Revision, SessionId};

/// What a fleet stream remembers.
#[derive(Debug, Default)]
pub struct FleetTold {
    /// Partitions the consumer has been told it owns.
    pub owned: BTreeSet<u32>,
    /// Partitions given back (already `unassigned`) whose lease deletion is in flight.
    pub releasing: BTreeSet<u32>,
}

impl Told for FleetTold {
    fn farewell(&self, topic: &str) -> Vec<AssignmentCommand> {
        if self.owned.is_empty() {
            return Vec::new();
        }
        vec![update(topic, [], self.owned.iter().copied())]
    }

    /// The fleet relay compares whole views; a part replaces what it is about.
    fn patch(&mut self, partitions: &BTreeSet<u32>, part: Self) {
        self.owned.retain(|p| !partitions.contains(p));
        self.releasing.retain(|p| !partitions.contains(p));
        self.owned.extend(part.owned);
        self.releasing.extend(part.releasing);
    }
}

/// The relay model: what the local stream `seen` of `consumer` on `topic` must be told,
/// given the topic's cached leases. Pure.
pub(super) fn relay_step(
    topic: &str,
    consumer: &str,
    seen: StreamSeen<'_, FleetTold>,
    entry: Option<&FleetTopic>,
    revision: Revision,
) -> RelayStep<FleetTold> {
    let record = entry.and_then(|e| e.members.get(consumer));
    let registration = seen.registration(record.map(|r| r.value.session), revision);
    // A lost registration (being written again) keeps the stream relayed.
    if let Some(step) = RelayStep::not_relayed(registration) {
        return step;
    }
    if registration == Registration::Ours && record.is_some_and(|r| r.value.leaving) {
        return RelayStep::Farewell;
    }
    let held = entry.map(|e| e.held_by(consumer)).unwrap_or_default();
    let releasing: BTreeSet<u32> = seen.told.releasing.intersection(&held).copied().collect();
    let view: BTreeSet<u32> = held.difference(&releasing).copied().collect();
    let gains = if !seen.activated {
        // The first message is always the snapshot, even when it is empty.
        vec![update(topic, view.iter().copied(), [])]
    } else {
        let assigned: Vec<u32> = view.difference(&seen.told.owned).copied().collect();
        let unassigned: Vec<u32> = seen.told.owned.difference(&view).copied().collect();
        if assigned.is_empty() && unassigned.is_empty() {
            Vec::new()
        } else {
            vec![update(topic, assigned, unassigned)]
        }
    };
    RelayStep::Tell(Tell {
        gains,
        losses: Vec::new(),
        told: FleetTold { owned: view, releasing },
        within: None,
        lost: registration == Registration::Lost,
        end: None,
    })
}

/// The registrations among those `changes` concerns that are marked leaving and name
/// `instance` as the one holding their stream, with their mod revisions (pure): the ones
/// this instance settles itself if it holds no stream of theirs (its consumer deregistered
/// after its stream had dropped).
pub(super) fn leaving_here(
    cache: &FleetCache,
    changes: &Changes,
    instance: &str,
) -> Vec<(StreamKey, Revision)> {
    let mut found = Vec::new();
    for (topic, touched) in changes.iter() {
        let Some(entry) = cache.topics.get(topic) else { continue };
        let names: Vec<&String> = match touched {
            Touched::All => entry.members.keys().collect(),
            Touched::Consumers(names) => names.keys().collect(),
        };
        for consumer in names {
            let Some(record) = entry.members.get(consumer) else { continue };
            if record.value.leaving && record.value.instance == instance {
                let key = (topic.clone(), consumer.clone(), SessionId(record.value.session));
                found.push((key, record.mod_revision));
            }
        }
    }
    found
}
