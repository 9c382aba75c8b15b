//! What each consumer was told (its [`Belief`]), and what the store really holds
//! ([`Truth`], fed by a watch on the shared store that no fault touches).

use std::collections::{BTreeMap, BTreeSet};

use kafka_assigner::coordinator::records::{
    AssignmentRecord, ConsumerRecord, HandoffRecord, Key, Keys, decode,
};
use kafka_assigner::handoff::{ConsumerStatus, Handoff, Phase};
use kafka_assigner::proto::v1::{AssignmentCommand, assignment_command::Command};
use kafka_assigner::store::{Revision, WatchBatch, WatchEventKind};

/// What one stream (one registration of a consumer) was told. The consumer acts on it at
/// once: it processes the partitions in `owned` until it is told otherwise.
#[derive(Clone, Debug, Default)]
pub struct Belief {
    /// Whether the snapshot (always the first message) arrived.
    pub snapshot: bool,
    /// Partitions it believes it owns (a partition it was told to release stays here until
    /// the consumer acts on the release).
    pub owned: BTreeSet<u32>,
    /// Partitions it was told to release, with the new owner named.
    pub releasing: BTreeMap<u32, String>,
    /// Partitions it was asked to warm, with the owner named.
    pub warming: BTreeMap<u32, String>,
}

/// What a command asks the consumer to do next (the driver schedules the answer).
pub enum Todo {
    Ready(u32),
    Release(u32),
}

impl Belief {
    /// Applies one command as a consumer would; `Err` when the command contradicts what the
    /// stream said before (the server must never send a contradictory command).
    pub fn apply(
        &mut self,
        command: &AssignmentCommand,
        topic: &str,
        partitions: u32,
    ) -> Result<Vec<Todo>, String> {
        let Some(command) = &command.command else { return Err("a command without a body".into()) };
        let first = !self.snapshot;
        let check = |p: u32, t: &str| -> Result<u32, String> {
            if t != topic || p >= partitions {
                return Err(format!("partition {t}/{p} is not one of {topic}/0..{partitions}"));
            }
            Ok(p)
        };
        let mut todo = Vec::new();
        match command {
            Command::Assignment(update) => {
                if first && !update.unassigned.is_empty() {
                    return Err(format!("the snapshot unassigns {:?}", update.unassigned));
                }
                self.snapshot = true;
                for tp in &update.unassigned {
                    let p = check(tp.partition, &tp.topic)?;
                    self.owned.remove(&p);
                    self.releasing.remove(&p);
                    self.warming.remove(&p);
                }
                for tp in &update.assigned {
                    let p = check(tp.partition, &tp.topic)?;
                    self.owned.insert(p);
                    self.warming.remove(&p);
                    self.releasing.remove(&p);
                }
            }
            _ if first => return Err(format!("the first command is not the snapshot: {command:?}")),
            Command::Warm(warm) => {
                let tp = warm.partition.as_ref().ok_or("a warm without a partition")?;
                let p = check(tp.partition, &tp.topic)?;
                // A partition it was told to release may come back to it later (the
                // handoff ended without its acknowledgement); one it owns outright may not.
                if self.owned.contains(&p) && !self.releasing.contains_key(&p) {
                    return Err(format!("asked to warm {p}, which it was told it owns"));
                }
                self.warming.insert(p, warm.current_owner.clone());
                todo.push(Todo::Ready(p));
            }
            Command::Release(release) => {
                let tp = release.partition.as_ref().ok_or("a release without a partition")?;
                let p = check(tp.partition, &tp.topic)?;
                // A stream that starts while a release of the consumer's is pending gets
                // the snapshot without the partition, then the release (docs/design.md §3): the
                // consumer only acknowledges it.
                self.releasing.insert(p, release.new_owner.clone());
                todo.push(Todo::Release(p));
            }
        }
        Ok(todo)
    }

    /// The partitions it processes and was not told to release: what it claims.
    pub fn claims(&self) -> impl Iterator<Item = u32> + '_ {
        self.owned.iter().copied().filter(|p| !self.releasing.contains_key(p))
    }
}

/// The store's records of the one topic, kept by a fault-free watch, and the history the
/// release-window rule needs.
#[derive(Debug, Default)]
pub struct Truth {
    pub revision: Revision,
    pub owners: BTreeMap<u32, String>,
    pub handoffs: BTreeMap<u32, Handoff>,
    pub consumers: BTreeMap<String, ConsumerRecord>,
    pub leader: Option<String>,
    /// (partition, consumer) → revision at which it last became the owner.
    owner_since: BTreeMap<(u32, String), Revision>,
    /// (partition, consumer) → last revision with a `Releasing` handoff from it.
    released_from: BTreeMap<(u32, String), Revision>,
    /// Every (consumer, registration id) the store has held.
    registrations_seen: BTreeSet<(String, i64)>,
    /// Revisions at which a partition moved by plan (counted: the check is not vacuous).
    pub plan_moves: u64,
    /// The last owner of each partition and the epoch it owns it with (docs/design.md §10).
    epochs: BTreeMap<u32, (String, u64)>,
    /// Owner changes whose epochs were compared (the check is not vacuous).
    pub epoch_checks: u64,
    /// Partitions whose epoch a new incarnation of their owner was checked to raise.
    pub incarnation_checks: u64,
}

impl Truth {
    /// Applies one watch batch of the shared store. `Err` when the revision gives a
    /// partition to a consumer that is not registered and active (docs/design.md §4, §5: only
    /// active consumers get partitions, and a `PartitionReady` flips ownership only to a
    /// live one), moves a partition by plan without holding the leader key, or brings a
    /// registration back over another one. `writers`: which instance (by index) wrote
    /// which keys at this revision.
    pub fn apply(
        &mut self,
        keys: &Keys,
        batch: &WatchBatch,
        strict: bool,
        writers: &[(usize, Vec<String>)],
    ) -> Result<(), String> {
        self.revision = batch.revision;
        let leader = self.leader.clone();
        let mut given = Vec::new();
        let before: BTreeMap<u32, (Option<String>, Option<Handoff>)> = batch
            .events
            .iter()
            .filter_map(|e| match keys.parse(&e.key) {
                Some(Key::Assignment(_, p) | Key::Handoff(_, p)) => Some(p),
                _ => None,
            })
            .map(|p| (p, (self.owners.get(&p).cloned(), self.handoffs.get(&p).cloned())))
            .collect();
        // What a new incarnation is compared with: the registrations replaced in this
        // batch, and every partition's epochs (owner's, handoff's) before it.
        // A lost registration written again keeps its id: only an id the store never held
        // for the name is a new incarnation.
        let sessions_before: BTreeMap<String, BTreeSet<i64>> = batch
            .events
            .iter()
            .filter_map(|e| match keys.parse(&e.key) {
                Some(Key::Consumer(_, name)) => {
                    let known = self.registrations_seen.iter().filter(|(n, _)| *n == name).map(|(_, id)| *id);
                    let known = known.collect();
                    Some((name, known))
                }
                _ => None,
            })
            .collect();
        let epochs_before: BTreeMap<u32, (u64, u64)> = self
            .epochs
            .iter()
            .map(|(p, (_, e))| (*p, (*e, self.handoffs.get(p).map_or(0, |h| h.epoch))))
            .collect();
        for event in &batch.events {
            let Some(key) = keys.parse(&event.key) else { continue };
            let value = match &event.kind {
                WatchEventKind::Put(kv) => Some(kv.value.as_slice()),
                WatchEventKind::Delete => None,
            };
            let bad = |e: kafka_assigner::store::StoreError| format!("undecodable {}: {e}", event.key);
            match (key, value) {
                (Key::Assignment(_, p), Some(v)) => {
                    let record = decode::<AssignmentRecord>(&event.key, v).map_err(bad)?;
                    self.epoch_grows(p, &record.owner, record.epoch)
                        .map_err(|e| format!("revision {}: {e}", batch.revision))?;
                    let owner = record.owner;
                    if self.owners.get(&p) != Some(&owner) {
                        self.owner_since.insert((p, owner.clone()), batch.revision);
                        given.push((p, owner.clone()));
                    }
                    self.owners.insert(p, owner);
                }
                (Key::Assignment(_, p), None) => {
                    self.owners.remove(&p);
                }
                (Key::Handoff(_, p), Some(v)) => {
                    let handoff = decode::<HandoffRecord>(&event.key, v).map_err(bad)?.handoff;
                    let source = self
                        .epochs
                        .get(&p)
                        .filter(|(owner, _)| handoff.phase == Phase::Warming && *owner == handoff.from);
                    if let Some((owner, epoch)) = source {
                        ensure!(
                            handoff.epoch > *epoch,
                            "revision {}: partition {p}'s handoff to {} carries epoch {}, not above \
                             {owner}'s {epoch}",
                            batch.revision,
                            handoff.to,
                            handoff.epoch
                        );
                    }
                    if handoff.phase == Phase::Releasing {
                        self.released_from.insert((p, handoff.from.clone()), batch.revision);
                    }
                    self.handoffs.insert(p, handoff);
                }
                (Key::Handoff(_, p), None) => {
                    self.handoffs.remove(&p);
                }
                (Key::Consumer(_, name), Some(v)) => {
                    let record = decode::<ConsumerRecord>(&event.key, v).map_err(bad)?;
                    self.no_comeback(&name, &record)?;
                    self.consumers.insert(name, record);
                }
                (Key::Consumer(_, name), None) => {
                    self.consumers.remove(&name);
                }
                (Key::Leader(_), v) => self.leader = v.map(|v| String::from_utf8_lossy(v).into_owned()),
                (Key::Topic(_) | Key::Instance(_), _) => {}
            }
        }
        self.incarnations_raised(keys, batch, &sessions_before, &epochs_before)
            .map_err(|e| format!("revision {}: {e}", batch.revision))?;
        for (p, (owner, handoff)) in before {
            let after = (self.owners.get(&p).cloned(), self.handoffs.get(&p).cloned());
            let by_plan = plan_move(&(owner.clone(), handoff.clone()), &after);
            self.legal_move(p, (owner, handoff), after)
                .map_err(|e| format!("revision {}: {e}", batch.revision))?;
            if by_plan {
                self.plan_moves += 1;
                self.by_the_leader(keys, p, leader.as_deref(), writers)
                    .map_err(|e| format!("revision {}: {e}", batch.revision))?;
            }
        }
        for (p, owner) in given {
            // Known bug E (see `main.rs`): a direct assignment does not guard the new owner's
            // registration; outside strict mode only flips are held to this.
            let flip = self.handoffs.get(&p).is_some_and(|h| h.phase == Phase::Releasing && h.to == owner);
            if !strict && !flip {
                continue;
            }
            let status = self.consumers.get(&owner).map(|r| r.status);
            ensure!(
                status == Some(ConsumerStatus::Active),
                "revision {}: partition {p} was given to {owner}, whose registration is {status:?}",
                batch.revision
            );
        }
        Ok(())
    }

    /// A new incarnation (docs/design.md §10): where this batch put a registration of a
    /// name under a new registration id, every record of a partition the name owns or
    /// warms that the batch rewrote carries a greater epoch than before (the raise shares
    /// the registration's transaction). A partition the registering instance's cache did
    /// not show as the name's yet keeps its record, and its epoch is never told to the new
    /// incarnation until raised (`epochs_of`); that is not visible from the store.
    fn incarnations_raised(
        &mut self,
        keys: &Keys,
        batch: &WatchBatch,
        sessions_before: &BTreeMap<String, BTreeSet<i64>>,
        epochs_before: &BTreeMap<u32, (u64, u64)>,
    ) -> Result<(), String> {
        for (name, before) in sessions_before {
            let Some(record) = self.consumers.get(name) else { continue };
            let put_here = batch.events.iter().any(|e| {
                matches!(keys.parse(&e.key), Some(Key::Consumer(_, n)) if n == *name)
                    && matches!(e.kind, WatchEventKind::Put(_))
            });
            if !put_here || before.contains(&record.session) {
                continue;
            }
            let rewritten: BTreeSet<u32> = batch
                .events
                .iter()
                .filter_map(|e| match keys.parse(&e.key) {
                    Some(Key::Assignment(_, p) | Key::Handoff(_, p)) => Some(p),
                    _ => None,
                })
                .collect();
            for (p, owner) in self.owners.iter().filter(|(p, _)| rewritten.contains(p)) {
                let Some((old, _)) = epochs_before.get(p).filter(|_| owner == name) else { continue };
                let now = self.epochs.get(p).map_or(0, |(_, e)| *e);
                ensure!(now > *old, "{name} registered again, but its partition {p} kept epoch {now}");
                self.incarnation_checks += 1;
            }
            for (p, handoff) in self.handoffs.iter().filter(|(p, _)| rewritten.contains(p)) {
                let Some((_, old)) = epochs_before.get(p) else { continue };
                if handoff.to == *name && handoff.phase == Phase::Warming {
                    ensure!(
                        handoff.epoch > *old,
                        "{name} registered again, but the partition {p} it warms kept epoch {old}"
                    );
                }
            }
        }
        Ok(())
    }

    /// Epochs (docs/design.md §10): a partition's epoch never goes back, and a new owner's
    /// is above every earlier owner's, so two owners never share one.
    fn epoch_grows(&mut self, p: u32, owner: &str, epoch: u64) -> Result<(), String> {
        ensure!(epoch > 0, "partition {p} was given to {owner} without an epoch");
        if let Some((before, seen)) = self.epochs.get(&p) {
            ensure!(
                epoch >= *seen,
                "partition {p}'s epoch went back from {seen} ({before}) to {epoch} ({owner})"
            );
            ensure!(
                before == owner || epoch > *seen,
                "partition {p}: {before} and {owner} share epoch {epoch}"
            );
            if before != owner {
                self.epoch_checks += 1;
            }
        }
        self.epochs.insert(p, (owner.to_string(), epoch));
        Ok(())
    }

    /// Whether one revision's change of partition `p` (owner, handoff) is a step of the
    /// handoff rules (docs/design.md §5): ownership moves from a registered owner only by a
    /// `PartitionReady` flip of a warming handoff to its target; a partition whose owner
    /// is gone (or that has none) is assigned directly; a handoff starts from the owner,
    /// and only a flip makes one `Releasing`.
    fn legal_move(
        &self,
        p: u32,
        (o0, h0): (Option<String>, Option<Handoff>),
        (o1, h1): (Option<String>, Option<Handoff>),
    ) -> Result<(), String> {
        let what = || format!("partition {p}: owner {o0:?} → {o1:?}, handoff {h0:?} → {h1:?}");
        if o0 != o1 {
            let flip = matches!((&h0, &h1, &o0, &o1), (Some(w), Some(r), Some(a), Some(b))
                if w.phase == Phase::Warming && r.phase == Phase::Releasing
                    && &w.from == a && &w.to == b && r.from == w.from && r.to == w.to);
            let owner_gone = o0.as_ref().is_none_or(|o| !self.consumers.contains_key(o));
            ensure!(flip || (owner_gone && h1.is_none()), "an illegal move: {}", what());
            return Ok(());
        }
        match &h1 {
            Some(h) if h.phase == Phase::Releasing => {
                ensure!(
                    h0.as_ref() == Some(h)
                        || h0
                            .as_ref()
                            .is_some_and(|x| x.from == h.from && x.to == h.to && x.phase == Phase::Releasing),
                    "a release without a flip: {}",
                    what()
                );
            }
            Some(h) => ensure!(o1.as_ref() == Some(&h.from), "a warm not from the owner: {}", what()),
            None => {}
        }
        Ok(())
    }

    /// A registration id the store held once may come back only where the name is free (a
    /// lost registration written again, compare-and-swap on absence); over another
    /// registration it would take the name back from a newer one (docs/design.md §6).
    fn no_comeback(&mut self, name: &str, record: &ConsumerRecord) -> Result<(), String> {
        let id = record.session;
        let over = self.consumers.get(name).map(|r| r.session).filter(|held| *held != id);
        let known = self.registrations_seen.contains(&(name.to_string(), id));
        if let (Some(held), true) = (over, known) {
            return Err(format!(
                "revision {}: registration {id} of {name} came back over registration {held}, which replaced it \
                 (a rebind must find the name free)",
                self.revision
            ));
        }
        self.registrations_seen.insert((name.to_string(), id));
        Ok(())
    }

    /// A move by plan (a warm started or cancelled, a direct assignment) is the leader's
    /// alone: the instance that wrote it held the leader key when it landed (docs/design.md §3,
    /// every leader write is fenced). A deposed leader's late write must change nothing.
    fn by_the_leader(
        &self,
        keys: &Keys,
        p: u32,
        leader: Option<&str>,
        writers: &[(usize, Vec<String>)],
    ) -> Result<(), String> {
        let ours =
            |k: &String| matches!(keys.parse(k), Some(Key::Assignment(_, q) | Key::Handoff(_, q)) if q == p);
        let writer =
            writers.iter().find(|(_, written)| written.iter().any(ours)).map(|(w, _)| format!("i{w}"));
        ensure!(
            writer.is_some() && writer.as_deref() == leader,
            "partition {p} was moved by plan by {writer:?}, but the leader key was held by {leader:?} (owner {:?}, \
             handoff {:?})",
            self.owners.get(&p),
            self.handoffs.get(&p)
        );
        Ok(())
    }

    /// Whether `consumer`'s ownership of `p` ended through a handoff's flip since it last
    /// became the owner: it is in that handoff's release window until it is told.
    pub fn in_release_window(&self, p: u32, consumer: &str) -> bool {
        let key = (p, consumer.to_string());
        let since = self.owner_since.get(&key).copied().unwrap_or(0);
        self.released_from.get(&key).is_some_and(|r| *r > since)
    }
}

/// Whether a change of one partition (owner, handoff) is the leader's doing: anything but
/// a consumer's flip (`PartitionReady`) or the end of a release (`PartitionReleased`, or a
/// release the leader completed: both look alike, so neither is counted).
fn plan_move(
    (o0, h0): &(Option<String>, Option<Handoff>),
    (o1, h1): &(Option<String>, Option<Handoff>),
) -> bool {
    // A handoff whose epoch alone changed was raised by a new incarnation of one of its
    // consumers (docs/design.md §10), which is a registration's write, not a plan's.
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
