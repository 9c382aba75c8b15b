//! What the store really holds: the topics' records, followed through every revision
//! by a watch no fault touches, and the history the invariants need (who became owner
//! when, which flip released whom, which instance wrote which revision).
//!
//! Every revision is checked as it is followed: it must be a step of the handoff rules
//! (docs/design.md §5), a move by plan must be the leader's, epochs only grow
//! (docs/design.md §10), and a replaced registration never comes back (§6).

use std::collections::{BTreeMap, BTreeSet};

use super::events::Topics;
use super::{Invariant, Violation};
use crate::coordinator::handoff_backend::leader_groups::LeaderGroup;
use crate::coordinator::records::{AssignmentRecord, ConsumerRecord, HandoffRecord, Key, Keys, decode};
use crate::handoff::{ConsumerStatus, Handoff, Phase};
use crate::store::{Revision, WatchBatch, WatchEventKind};

/// The topics' records as the store holds them, and their history. Partitions are known
/// by their global number ([`Topics`]).
#[derive(Debug)]
pub struct Truth {
    /// The run's topics.
    topics: Topics,
    /// The last revision followed.
    pub revision: Revision,
    /// Each owned partition's owner.
    pub owners: BTreeMap<u32, String>,
    /// Handoffs in flight.
    pub handoffs: BTreeMap<u32, Handoff>,
    /// Registrations.
    pub consumers: BTreeMap<String, ConsumerRecord>,
    /// The instance named by each group's leader key.
    leaders: BTreeMap<LeaderGroup, String>,
    /// (partition, consumer) → revision at which it last became the owner.
    owner_since: BTreeMap<(u32, String), Revision>,
    /// (partition, consumer) → last revision with a `Releasing` handoff from it.
    released_from: BTreeMap<(u32, String), Revision>,
    /// (partition, consumer) → when (virtual µs) its last `Releasing` handoff ended.
    release_ended: BTreeMap<(u32, String), u64>,
    /// Every (consumer, registration session) the store has held.
    registrations_seen: BTreeSet<(String, i64)>,
    /// The last owner of each partition and its epoch.
    epochs: BTreeMap<u32, (String, u64)>,
    /// Owner changes so far: (partition, new owner or none), for the outage check.
    pub owner_changes: u64,
    /// Registrations deleted so far.
    pub registrations_deleted: u64,
    /// Owner changes that were not a handoff's flip (a direct assignment, an owner
    /// cleared), for the outage check.
    pub direct_moves: u64,
    /// Moves by plan checked to be the leader's (the check is not vacuous).
    pub plan_moves: u64,
    /// Owner changes whose epochs were compared.
    pub epoch_checks: u64,
    /// Keys changed so far (events followed).
    pub keys_changed: u64,
}

impl Truth {
    /// Nothing followed yet, of a run with `topics`.
    pub fn new(topics: Topics) -> Self {
        Truth {
            topics,
            revision: 0,
            owners: BTreeMap::new(),
            handoffs: BTreeMap::new(),
            consumers: BTreeMap::new(),
            leaders: BTreeMap::new(),
            owner_since: BTreeMap::new(),
            released_from: BTreeMap::new(),
            release_ended: BTreeMap::new(),
            registrations_seen: BTreeSet::new(),
            epochs: BTreeMap::new(),
            owner_changes: 0,
            registrations_deleted: 0,
            direct_moves: 0,
            plan_moves: 0,
            epoch_checks: 0,
            keys_changed: 0,
        }
    }

    /// The instance named by the leader key of the group that plans the topic of global
    /// partition `g`.
    fn leader_of(&self, g: u32) -> Option<&str> {
        let topic = self.topics.name(self.topics.split(g).0);
        self.leaders.iter().find(|(group, _)| group.plans(&topic)).map(|(_, id)| id.as_str())
    }

    /// The global number of a partition key's partition (`None`: not one of the run's topics).
    fn global(&self, topic: &str, p: u32) -> Option<u32> {
        self.topics.index(topic).filter(|_| p < self.topics.partitions).map(|t| self.topics.global(t, p))
    }
    /// Follows one revision; `writer` is the instance whose transaction made it (`None`:
    /// the store itself, a session's expiry).
    pub fn apply(
        &mut self,
        keys: &Keys,
        batch: &WatchBatch,
        writer: Option<&str>,
        now: u64,
    ) -> Result<(), Violation> {
        self.revision = batch.revision;
        self.keys_changed += batch.events.len() as u64;
        let at = batch.revision;
        let partitions: BTreeSet<u32> = batch
            .events
            .iter()
            .filter_map(|e| match keys.parse(&e.key) {
                Some(Key::Assignment(t, p) | Key::Handoff(t, p)) => self.global(&t, p),
                _ => None,
            })
            .collect();
        // The leaders before this revision: a move is checked against who held the key.
        let leaders: BTreeMap<u32, Option<String>> =
            partitions.iter().map(|g| (*g, self.leader_of(*g).map(str::to_string))).collect();
        let before: BTreeMap<u32, Cell> = partitions
            .iter()
            .map(|p| (*p, (self.owners.get(p).cloned(), self.handoffs.get(p).cloned())))
            .collect();
        for event in &batch.events {
            let Some(key) = keys.parse(&event.key) else { continue };
            let value = match &event.kind {
                WatchEventKind::Put(kv) => Some(kv.value.as_slice()),
                WatchEventKind::Delete => None,
            };
            let undecodable = |e| {
                Violation::new(Invariant::LegalMove, format!("revision {at}: undecodable {}: {e}", event.key))
            };
            // Partitions by their global number from here on; other topics' are not the run's.
            let key = match key {
                Key::Assignment(t, p) => match self.global(&t, p) {
                    Some(g) => Key::Assignment(t, g),
                    None => continue,
                },
                Key::Handoff(t, p) => match self.global(&t, p) {
                    Some(g) => Key::Handoff(t, g),
                    None => continue,
                },
                other => other,
            };
            match (key, value) {
                (Key::Assignment(_, p), Some(v)) => {
                    let record = decode::<AssignmentRecord>(&event.key, v).map_err(undecodable)?;
                    self.epoch_grows(p, &record.owner, record.epoch)
                        .map_err(|d| Violation::new(Invariant::Epochs, format!("revision {at}: {d}")))?;
                    if self.owners.get(&p) != Some(&record.owner) {
                        self.owner_since.insert((p, record.owner.clone()), at);
                        self.owner_changes += 1;
                    }
                    self.owners.insert(p, record.owner);
                }
                (Key::Assignment(_, p), None) => {
                    if self.owners.remove(&p).is_some() {
                        self.owner_changes += 1;
                    }
                }
                (Key::Handoff(_, p), Some(v)) => {
                    let handoff = decode::<HandoffRecord>(&event.key, v).map_err(undecodable)?.handoff;
                    self.release_ends(p, now);
                    self.handoff_epoch_above_owner(p, &handoff)
                        .map_err(|d| Violation::new(Invariant::Epochs, format!("revision {at}: {d}")))?;
                    if handoff.phase == Phase::Releasing {
                        self.released_from.insert((p, handoff.from.clone()), at);
                    }
                    self.handoffs.insert(p, handoff);
                }
                (Key::Handoff(_, p), None) => {
                    self.release_ends(p, now);
                    self.handoffs.remove(&p);
                }
                (Key::Consumer(_, name), Some(v)) => {
                    let record = decode::<ConsumerRecord>(&event.key, v).map_err(undecodable)?;
                    self.no_comeback(&name, &record)?;
                    self.consumers.insert(name, record);
                }
                (Key::Consumer(_, name), None) => {
                    if self.consumers.remove(&name).is_some() {
                        self.registrations_deleted += 1;
                    }
                }
                (Key::Leader(group), Some(v)) => {
                    self.leaders.insert(group, String::from_utf8_lossy(v).into_owned());
                }
                (Key::Leader(group), None) => {
                    self.leaders.remove(&group);
                }
                (Key::Topic(_) | Key::Instance(_), _) => {}
            }
        }
        for (p, cell) in before {
            let after = (self.owners.get(&p).cloned(), self.handoffs.get(&p).cloned());
            let what = format!("revision {at}: partition {p}: {cell:?} → {after:?}");
            self.legal_move(&cell, &after)
                .map_err(|d| Violation::new(Invariant::LegalMove, format!("{what}: {d}")))?;
            if plan_move(&cell, &after) {
                self.plan_moves += 1;
                let leader = leaders.get(&p).cloned().flatten();
                if writer.is_none() || writer != leader.as_deref() {
                    return Err(Violation::new(
                        Invariant::LeaderOnly,
                        format!(
                            "{what}: a move by plan written by {writer:?}, the leader key held by {leader:?}"
                        ),
                    ));
                }
            }
            if cell.0 != after.0 && !is_flip(&cell, &after) {
                self.direct_moves += 1;
            }
            if let Some(owner) = after.0.as_ref().filter(|o| cell.0.as_ref() != Some(*o)) {
                let status = self.consumers.get(owner).map(|r| r.status);
                if status != Some(ConsumerStatus::Active) {
                    return Err(Violation::new(
                        Invariant::LegalMove,
                        format!("{what}: given to {owner}, whose registration is {status:?}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether `consumer` is in the release window of `p` at `now`: its ownership ended
    /// through a handoff's flip since it last became the owner, and that `Releasing` handoff
    /// is still in the store or ended at most `grace` µs ago (its instance may relay the
    /// release later than the new owner's instance relays the flip, but an instance that
    /// cannot follow the store fences its streams within ¾ TTL).
    pub fn in_release_window(&self, p: u32, consumer: &str, now: u64, grace: u64) -> bool {
        let key = (p, consumer.to_string());
        let since = self.owner_since.get(&key).copied().unwrap_or(0);
        if self.released_from.get(&key).is_none_or(|r| *r <= since) {
            return false;
        }
        let releasing =
            self.handoffs.get(&p).is_some_and(|h| h.phase == Phase::Releasing && h.from == consumer);
        releasing || self.release_ended.get(&key).is_none_or(|ended| now <= ended + grace)
    }

    /// The handoff of `p` is replaced or deleted: a `Releasing` one ends its release window.
    fn release_ends(&mut self, p: u32, now: u64) {
        if let Some(h) = self.handoffs.get(&p).filter(|h| h.phase == Phase::Releasing) {
            self.release_ended.insert((p, h.from.clone()), now);
        }
    }

    /// A partition's epoch never goes back, and a new owner's is above every earlier one.
    fn epoch_grows(&mut self, p: u32, owner: &str, epoch: u64) -> Result<(), String> {
        if epoch == 0 {
            return Err(format!("partition {p} was given to {owner} without an epoch"));
        }
        if let Some((before, seen)) = self.epochs.get(&p) {
            if epoch < *seen {
                return Err(format!(
                    "partition {p}'s epoch went back from {seen} ({before}) to {epoch} ({owner})"
                ));
            }
            if before != owner && epoch <= *seen {
                return Err(format!("partition {p}: {before} and {owner} share epoch {epoch}"));
            }
            if before != owner {
                self.epoch_checks += 1;
            }
        }
        self.epochs.insert(p, (owner.to_string(), epoch));
        Ok(())
    }

    /// A warm's coming epoch is above its source's, so the flip raises it.
    fn handoff_epoch_above_owner(&self, p: u32, handoff: &Handoff) -> Result<(), String> {
        let source = self
            .epochs
            .get(&p)
            .filter(|(owner, _)| handoff.phase == Phase::Warming && *owner == handoff.from);
        match source {
            Some((owner, epoch)) if handoff.epoch <= *epoch => Err(format!(
                "partition {p}'s handoff to {} carries epoch {}, not above {owner}'s {epoch}",
                handoff.to, handoff.epoch
            )),
            _ => Ok(()),
        }
    }

    /// One revision's change of a partition is a step of the handoff rules: ownership leaves
    /// a registered owner only by a flip of a warming handoff to its target; a partition
    /// whose owner is gone is assigned directly; a warm starts from the owner; only a flip
    /// makes a handoff `Releasing`.
    fn legal_move(&self, (o0, h0): &Cell, (o1, h1): &Cell) -> Result<(), String> {
        if o0 != o1 {
            let flip = is_flip(&(o0.clone(), h0.clone()), &(o1.clone(), h1.clone()));
            let owner_gone = o0.as_ref().is_none_or(|o| !self.consumers.contains_key(o));
            return if flip || (owner_gone && h1.is_none()) { Ok(()) } else { Err("an illegal move".into()) };
        }
        match h1 {
            Some(h) if h.phase == Phase::Releasing => {
                let same = h0
                    .as_ref()
                    .is_some_and(|x| x.from == h.from && x.to == h.to && x.phase == Phase::Releasing);
                if same { Ok(()) } else { Err("a release without a flip".into()) }
            }
            Some(h) if o1.as_ref() != Some(&h.from) => Err("a warm not from the owner".into()),
            _ => Ok(()),
        }
    }

    /// A registration the store held once may come back only where the name is free.
    fn no_comeback(&mut self, name: &str, record: &ConsumerRecord) -> Result<(), Violation> {
        let held = self.consumers.get(name).map(|r| r.session);
        no_comeback(&mut self.registrations_seen, name, held, record.session, self.revision)
    }
}

/// A partition's owner and handoff.
type Cell = (Option<String>, Option<Handoff>);

/// Whether a change of one partition is a `PartitionReady` flip: a warming handoff became
/// releasing and its target the owner.
fn is_flip((o0, h0): &Cell, (o1, h1): &Cell) -> bool {
    matches!((h0, h1, o0, o1), (Some(w), Some(r), Some(a), Some(b))
        if w.phase == Phase::Warming && r.phase == Phase::Releasing
            && &w.from == a && &w.to == b && r.from == w.from && r.to == w.to)
}

/// Whether a change of one partition is the leader's doing: anything but a consumer's flip
/// (`PartitionReady`), the end of a release, or a new incarnation's epoch raise.
fn plan_move((o0, h0): &Cell, (o1, h1): &Cell) -> bool {
    let same_but_epoch = |a: &Option<Handoff>, b: &Option<Handoff>| match (a, b) {
        (Some(a), Some(b)) => Handoff { epoch: b.epoch, ..a.clone() } == *b,
        _ => a == b,
    };
    if o0 == o1 && same_but_epoch(h0, h1) {
        return false;
    }
    let flip = matches!((h0, h1), (Some(w), Some(r))
        if w.phase == Phase::Warming && r.phase == Phase::Releasing && w.from == r.from && w.to == r.to)
        && o1.as_ref() == h1.as_ref().map(|h| &h.to);
    let released = o0 == o1 && h0.as_ref().is_some_and(|h| h.phase == Phase::Releasing) && h1.is_none();
    let releasing = matches!((h0, h1), (Some(a), Some(b))
        if a.phase == Phase::Releasing && b.phase == Phase::Releasing && a.from == b.from && a.to == b.to);
    !(flip || released || (o0 == o1 && releasing))
}

/// A registration the store held once may come back only where the name is free: over
/// another registration (`held`) it would take the name back from a newer one. `seen` keeps
/// every (name, registration) the store has held; `id` is the one written at `revision`.
/// The one rule for both backends' truths.
pub(super) fn no_comeback(
    seen: &mut BTreeSet<(String, i64)>,
    name: &str,
    held: Option<i64>,
    id: i64,
    revision: Revision,
) -> Result<(), Violation> {
    if let Some(held) = held.filter(|held| *held != id)
        && seen.contains(&(name.to_string(), id))
    {
        return Err(Violation::new(
            Invariant::NoComeback,
            format!(
                "revision {revision}: registration {id} of {name} came back over {held}, which replaced it"
            ),
        ));
    }
    seen.insert((name.to_string(), id));
    Ok(())
}
