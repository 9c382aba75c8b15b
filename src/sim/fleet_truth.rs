//! What the store really holds of the fleet backend (`{prefix}fleet/`), followed through
//! every revision by the truth's watch (no fault touches it), and checked as it is followed
//! (module docs of `fleet_backend`, docs/design.md §10):
//!
//! * [`Invariant::Epochs`]: a new lease (created, or taken by another owner) carries an
//!   epoch above every earlier one of the partition; a lease rewritten for the same owner
//!   (a reconnect moving it, a new incarnation raising it) never lowers it; a partition's
//!   durable floor never goes down.
//! * [`Invariant::LegalMove`]: a lease is written only for a consumer whose member record
//!   exists at that revision, is not leaving, and is bound to the same store session (the
//!   lease goes with the registration); a registration written takes every lease of its
//!   name to its session; a lease is taken from another owner only if that owner had no
//!   member record (a stale lease), never from a registered one.
//! * [`Invariant::NoComeback`]: a replaced registration never comes back.
//!
//! The truth keeps its own records rather than a `FleetCache`: it decodes every record
//! strictly (an undecodable one is a violation, where the cache would skip it), and keeps
//! the store sessions the records are bound to, which the cache does not.

use std::collections::{BTreeMap, BTreeSet};

use super::events::Topics;
use super::{Invariant, Violation};
use crate::coordinator::fleet_backend::records::{EpochRecord, FleetKey, FleetKeys};
use crate::coordinator::fleet_backend::{LeaseRecord, MemberRecord};
use crate::coordinator::records::decode;
use crate::store::{Revision, SessionId, WatchBatch, WatchEventKind};

/// A record and the store session it is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bound<T> {
    /// The record.
    pub record: T,
    /// The session it goes with (`None`: durable).
    pub session: Option<SessionId>,
}

/// The fleet's records as the store holds them, and their history. Partitions are known by
/// their global number ([`Topics`]), consumers by name (names are unique across topics).
#[derive(Debug)]
pub struct FleetTruth {
    keys: FleetKeys,
    topics: Topics,
    /// The last revision followed.
    pub revision: Revision,
    /// Member records by consumer name.
    pub members: BTreeMap<String, Bound<MemberRecord>>,
    /// Leases by partition.
    pub leases: BTreeMap<u32, Bound<LeaseRecord>>,
    /// Epoch floors by partition.
    floors: BTreeMap<u32, u64>,
    /// The highest lease epoch each partition was given, and to whom.
    epochs: BTreeMap<u32, (String, u64)>,
    /// Every (consumer, registration id) the store has held.
    registrations_seen: BTreeSet<(String, i64)>,
    /// (partition, consumer) → when (virtual µs) the store took its lease away by revoking
    /// its session early (a fault no keeper can fence ahead of): cleared when it gets the
    /// lease again.
    revoked: BTreeMap<(u32, String), u64>,
    /// Consumer name → when (virtual µs) its member record was last replaced by another
    /// registration of the name.
    replaced: BTreeMap<String, u64>,
    /// Lease owner changes (a lease taken by another owner, or deleted), for the outage
    /// check.
    pub moves: u64,
    /// Leases written (claims, raises, reconnects moving them).
    pub lease_writes: u64,
    /// New leases whose epoch was compared with earlier ones.
    pub epoch_checks: u64,
}

impl FleetTruth {
    /// Nothing followed yet, of a run with `topics` under `prefix`.
    pub fn new(prefix: &str, topics: Topics) -> Self {
        FleetTruth {
            keys: FleetKeys::new(prefix),
            topics,
            revision: 0,
            members: BTreeMap::new(),
            leases: BTreeMap::new(),
            floors: BTreeMap::new(),
            epochs: BTreeMap::new(),
            registrations_seen: BTreeSet::new(),
            revoked: BTreeMap::new(),
            replaced: BTreeMap::new(),
            moves: 0,
            lease_writes: 0,
            epoch_checks: 0,
        }
    }

    /// The global number of a partition key's partition (`None`: not one of the run's).
    fn global(&self, topic: &str, p: u32) -> Option<u32> {
        self.topics.index(topic).filter(|_| p < self.topics.partitions).map(|t| self.topics.global(t, p))
    }

    /// Whether `consumer`'s registration was replaced by another registration of its name
    /// after `since` and at most `grace` µs before `now`.
    pub fn replaced_lately(&self, consumer: &str, since: u64, now: u64, grace: u64) -> bool {
        self.replaced.get(consumer).is_some_and(|at| *at > since && now <= at + grace)
    }

    /// Whether `consumer` lost its lease of `p` to an early revocation of its session at
    /// most `grace` µs before `now` (and has not held it again since).
    pub fn revoked_lately(&self, p: u32, consumer: &str, now: u64, grace: u64) -> bool {
        self.revoked.get(&(p, consumer.to_string())).is_some_and(|at| now <= at + grace)
    }

    /// Follows one revision at virtual time `now`; `revoked`: the revision is the store
    /// revoking a session early (`Action::Revoke`).
    pub fn apply(&mut self, batch: &WatchBatch, revoked: bool, now: u64) -> Result<(), Violation> {
        let at = batch.revision;
        self.revision = at;
        // Who was registered before this revision: a lease may be taken only from an owner
        // that was not. The members the revision changed, with whether each was registered
        // before it (the first change of each tells); any other is as `members` says.
        let mut changed: Vec<(String, bool)> = Vec::new();
        let (mut written, mut registered) = (Vec::new(), Vec::new());
        for event in &batch.events {
            let Some(key) = self.keys.parse(&event.key) else { continue };
            let undecodable = |e| {
                Violation::new(Invariant::LegalMove, format!("revision {at}: undecodable {}: {e}", event.key))
            };
            match (key, &event.kind) {
                (FleetKey::Member(_, name), WatchEventKind::Put(kv)) => {
                    let record = decode::<MemberRecord>(&kv.key, &kv.value).map_err(undecodable)?;
                    self.no_comeback(&name, &record)?;
                    self.note_change(&mut changed, &name);
                    if self.members.get(&name).is_some_and(|m| m.record.session != record.session) {
                        self.replaced.insert(name.clone(), now);
                    }
                    registered.push(name.clone());
                    self.members.insert(name, Bound { record, session: kv.session });
                }
                (FleetKey::Member(_, name), WatchEventKind::Delete) => {
                    self.note_change(&mut changed, &name);
                    self.members.remove(&name);
                }
                (FleetKey::Lease(t, p), WatchEventKind::Put(kv)) => {
                    let Some(g) = self.global(&t, p) else { continue };
                    let record = decode::<LeaseRecord>(&kv.key, &kv.value).map_err(undecodable)?;
                    let before = self.leases.get(&g).map(|l| l.record.owner.clone());
                    self.epoch_grows(g, before.as_deref(), &record)
                        .map_err(|d| Violation::new(Invariant::Epochs, format!("revision {at}: {d}")))?;
                    if let Some(owner) = before.as_ref().filter(|o| **o != record.owner) {
                        self.moves += 1;
                        let registered_before = changed
                            .iter()
                            .find(|(name, _)| name == owner)
                            .map_or_else(|| self.members.contains_key(owner), |(_, was)| *was);
                        if registered_before {
                            return Err(Violation::new(
                                Invariant::LegalMove,
                                format!(
                                    "revision {at}: partition {g}'s lease taken from {owner}, which was registered, by {}",
                                    record.owner
                                ),
                            ));
                        }
                    }
                    // Revocations are rare: no key built for an empty map.
                    if !self.revoked.is_empty() {
                        self.revoked.remove(&(g, record.owner.clone()));
                    }
                    self.lease_writes += 1;
                    written.push(g);
                    self.leases.insert(g, Bound { record, session: kv.session });
                }
                (FleetKey::Lease(t, p), WatchEventKind::Delete) => {
                    let Some(g) = self.global(&t, p) else { continue };
                    if let Some(lease) = self.leases.remove(&g) {
                        self.moves += 1;
                        if revoked {
                            self.revoked.insert((g, lease.record.owner), now);
                        }
                    }
                }
                (FleetKey::Epoch(t, p), WatchEventKind::Put(kv)) => {
                    let Some(g) = self.global(&t, p) else { continue };
                    let floor = decode::<EpochRecord>(&kv.key, &kv.value).map_err(undecodable)?.epoch;
                    let seen = self.floors.insert(g, floor).unwrap_or(0);
                    if floor < seen {
                        return Err(Violation::new(
                            Invariant::Epochs,
                            format!(
                                "revision {at}: partition {g}'s epoch floor went down from {seen} to {floor}"
                            ),
                        ));
                    }
                }
                (FleetKey::Epoch(t, p), WatchEventKind::Delete) => {
                    let detail = format!("revision {at}: the durable epoch floor of {t}/{p} was deleted");
                    return Err(Violation::new(Invariant::Epochs, detail));
                }
                (FleetKey::Topic(_), _) => {}
            }
        }
        // The whole revision applied: each lease written must belong to a live registration
        // bound to the same session.
        for g in written {
            self.lease_of_a_member(g).map_err(|d| {
                Violation::new(Invariant::LegalMove, format!("revision {at}: partition {g}: {d}"))
            })?;
        }
        for name in registered {
            self.leases_follow(&name)
                .map_err(|d| Violation::new(Invariant::LegalMove, format!("revision {at}: {d}")))?;
        }
        Ok(())
    }

    /// Notes that member `name` changes in the revision under way, with whether it was
    /// registered before it, unless an earlier change of the revision noted it already.
    fn note_change(&self, changed: &mut Vec<(String, bool)>, name: &str) {
        if !changed.iter().any(|(n, _)| n == name) {
            changed.push((name.to_string(), self.members.contains_key(name)));
        }
    }

    /// A registration written at this revision took every lease of its name along: each is
    /// bound to the member record's session (records.rs: the two vanish together), or the
    /// name's leases outlive it under another session, and a new incarnation holds a lease
    /// it did not raise.
    fn leases_follow(&self, name: &str) -> Result<(), String> {
        let Some(member) = self.members.get(name) else { return Ok(()) };
        let behind = self.leases.iter().find(|(_, l)| l.record.owner == name && l.session != member.session);
        match behind {
            Some((g, lease)) => Err(format!(
                "{name} registered under session {:?}, its lease of partition {g} left under {:?}",
                member.session, lease.session
            )),
            None => Ok(()),
        }
    }

    /// A lease written at this revision is its owner's: a member record exists, is not
    /// leaving, and is bound to the lease's session.
    fn lease_of_a_member(&self, g: u32) -> Result<(), String> {
        let Some(lease) = self.leases.get(&g) else { return Ok(()) };
        let owner = &lease.record.owner;
        match self.members.get(owner) {
            None => Err(format!("leased to {owner}, who has no member record")),
            Some(member) if member.record.leaving => Err(format!("leased to {owner}, who is leaving")),
            Some(member) if member.session != lease.session => Err(format!(
                "leased to {owner} under session {:?}, its member record under {:?}",
                lease.session, member.session
            )),
            Some(_) => Ok(()),
        }
    }

    /// A new lease's epoch is above every earlier one of the partition; a rewrite for the
    /// same owner keeps or raises it.
    fn epoch_grows(&mut self, g: u32, before: Option<&str>, lease: &LeaseRecord) -> Result<(), String> {
        let (owner, epoch) = (lease.owner.as_str(), lease.epoch);
        if epoch == 0 {
            return Err(format!("partition {g} was leased to {owner} without an epoch"));
        }
        let fresh = before != Some(owner);
        if let Some((earlier, seen)) = self.epochs.get(&g) {
            if epoch < *seen {
                return Err(format!(
                    "partition {g}'s epoch went back from {seen} ({earlier}) to {epoch} ({owner})"
                ));
            }
            if fresh && epoch == *seen {
                return Err(format!(
                    "partition {g}: a new lease of {owner} repeats epoch {epoch} ({earlier}'s)"
                ));
            }
            if fresh {
                self.epoch_checks += 1;
            }
        }
        match self.epochs.get_mut(&g) {
            Some((earlier, seen)) if earlier == owner => *seen = epoch,
            _ => {
                self.epochs.insert(g, (owner.to_string(), epoch));
            }
        }
        Ok(())
    }

    /// A registration the store held once may come back only where the name is free.
    fn no_comeback(&mut self, name: &str, record: &MemberRecord) -> Result<(), Violation> {
        let held = self.members.get(name).map(|m| m.record.session);
        super::truth::no_comeback(&mut self.registrations_seen, name, held, record.session, self.revision)
    }

    /// The owner of global partition `g`'s lease.
    pub fn owner(&self, g: u32) -> Option<&str> {
        self.leases.get(&g).map(|l| l.record.owner.as_str())
    }
}
