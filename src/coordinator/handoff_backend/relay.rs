//! The relay: turn every change into commands for the consumers connected to this
//! instance (pure). The machine keeps the cache equal to the store and, after every
//! change, tells the consumers what this step says (`machine/streams.rs`).
//!
//! Commands come only from here, derived from the cache after a whole revision has been
//! applied, so a consumer never sees a half-applied transaction, and every instance derives
//! the same commands from the same revision.

use std::collections::BTreeSet;

use super::state::TopicEntry;
use crate::coordinator::shared::{
    mirror::Scope,
    outgoing::to_wire,
    records::encode,
    relay::{Registration, RelayStep, StreamSeen, Tell},
    streams::{EndReason, Told},
};
use crate::handoff::{Command, ConsumerStatus, ConsumerView, diff_views};
use crate::proto::v1::AssignmentCommand;
use crate::store::Revision;

impl Told for ConsumerView {
    fn farewell(&self, topic: &str) -> Vec<AssignmentCommand> {
        wire(topic, diff_views(self, &ConsumerView::default()))
    }

    fn patch(&mut self, partitions: &BTreeSet<u32>, part: Self) {
        ConsumerView::patch(self, partitions, part);
    }
}

fn wire(topic: &str, commands: Vec<Command>) -> Vec<AssignmentCommand> {
    commands.into_iter().map(|c| to_wire(topic, c)).collect()
}

/// The relay model: what the local stream `seen` of `consumer` on `topic` must be told,
/// given the topic's cached state and what of the consumer's view may have changed
/// (`scope`): all of it is compared, or only its part in the partitions a revision changed,
/// the rest being what the stream was told. Pure.
pub(super) fn relay_step(
    topic: &str,
    consumer: &str,
    seen: StreamSeen<'_, ConsumerView>,
    entry: Option<&TopicEntry>,
    scope: &Scope,
    revision: Revision,
) -> RelayStep<ConsumerView> {
    let record = entry.and_then(|e| e.consumers.get(consumer));
    let registration = seen.registration(record.map(|r| r.value.session), revision);
    // A lost registration (being written again) keeps the stream relayed: if the
    // leader moved its partitions meanwhile, the consumer hears it.
    if let Some(step) = RelayStep::not_relayed(registration) {
        return step;
    }
    // A part is compared only once the stream heard its snapshot (the first message is
    // always the whole snapshot, even when it is empty) and followed every step since.
    let within = match scope {
        Scope::Partitions(partitions) if seen.activated && seen.told_complete => Some(partitions),
        _ => None,
    };
    let view = match (entry, within) {
        (Some(entry), Some(partitions)) => entry.view_within(consumer, partitions),
        (Some(entry), None) => entry.view_of(consumer),
        (None, _) => ConsumerView::default(),
    };
    let draining = record.is_some_and(|r| r.value.status == ConsumerStatus::Draining);
    let idle = || view.is_idle_outside(None) && within.is_none_or(|ps| seen.told.is_idle_outside(Some(ps)));
    let end = (draining && idle()).then_some((EndReason::Left, None));
    let mut gains = Vec::new();
    let (more, losses) = split(match within {
        Some(partitions) => diff_views(&seen.told.within(partitions), &view),
        None if seen.activated => diff_views(seen.told, &view),
        None => {
            let owned = view.owned.iter().copied().collect();
            gains.push(Command::Assignment { assigned: owned, unassigned: vec![] });
            let snapshot = ConsumerView { owned: view.owned.clone(), ..Default::default() };
            diff_views(&snapshot, &view)
        }
    });
    gains.extend(more);
    RelayStep::Tell(Tell {
        gains: wire(topic, gains),
        losses: wire(topic, losses),
        told: view,
        within: within.cloned(),
        lost: registration == Registration::Lost,
        end,
    })
}

/// What of `consumer`'s registration record in `entry` the stream of registration
/// `session` keeps (pure): `None` while the record is not its own; else the record's mod
/// revision and its encoding, which says `None` when the record says nothing a fresh
/// registration would not (encoded only when asked: only when the record changed).
pub(super) fn to_keep<'e>(
    entry: Option<&'e TopicEntry>,
    consumer: &str,
    session: crate::store::SessionId,
) -> Option<(Revision, impl FnOnce() -> Option<Vec<u8>> + 'e)> {
    let record = entry.and_then(|e| e.consumers.get(consumer))?;
    if record.value.session != session.0 {
        return None;
    }
    let plain = record.value.status == ConsumerStatus::Active
        && record.value.hold_until.is_none()
        && record.value.info.is_default()
        && record.value.incarnation == 0;
    Some((record.mod_revision, move || (!plain).then(|| encode(&record.value))))
}

/// Splits commands into what the consumer gains (`assigned`, warms), sent at once, and
/// what it loses (`unassigned`, releases), sent once every stream of the relay pass heard
/// its gains: the new owner hears first.
fn split(commands: Vec<Command>) -> (Vec<Command>, Vec<Command>) {
    let (mut gains, mut losses) = (Vec::new(), Vec::new());
    for command in commands {
        match command {
            Command::Assignment { assigned, unassigned } => {
                if !assigned.is_empty() {
                    gains.push(Command::Assignment { assigned, unassigned: vec![] });
                }
                if !unassigned.is_empty() {
                    losses.push(Command::Assignment { assigned: vec![], unassigned });
                }
            }
            warm @ Command::Warm { .. } => gains.push(warm),
            release @ Command::Release { .. } => losses.push(release),
        }
    }
    (gains, losses)
}
