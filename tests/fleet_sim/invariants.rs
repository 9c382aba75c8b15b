//! What each consumer was told (its [`Belief`]), what the store holds ([`Truth`], from a
//! watch on the shared store that no fault touches), and the invariants between them.

use std::collections::{BTreeMap, BTreeSet};

use kafka_assigner::coordinator::StatusView;
use kafka_assigner::coordinator::fleet_backend::{FleetKeys, LeaseRecord, MemberRecord, records::FleetKey};
use kafka_assigner::coordinator::records::decode;
use kafka_assigner::proto::v1::{AssignmentCommand, assignment_command::Command};
use kafka_assigner::store::{Revision, WatchBatch, WatchEventKind};

/// What one stream told its consumer. The consumer processes `owned` until told otherwise.
#[derive(Clone, Debug, Default)]
pub struct Belief {
    /// Whether the snapshot (always the first message) arrived.
    pub snapshot: bool,
    pub owned: BTreeSet<u32>,
}

impl Belief {
    /// Applies one command as the consumer would; `Err` when it contradicts what the stream
    /// said before (invariant (b)). Returns how many partitions it was told to stop.
    pub fn apply(
        &mut self,
        command: &AssignmentCommand,
        topic: &str,
        partitions: u32,
    ) -> Result<usize, String> {
        let Some(Command::Assignment(update)) = &command.command else {
            return Err(format!("the fleet sends only AssignmentUpdate, not {command:?}"));
        };
        let first = !self.snapshot;
        ensure!(!first || update.unassigned.is_empty(), "the snapshot unassigns {:?}", update.unassigned);
        self.snapshot = true;
        for tp in update.unassigned.iter().chain(&update.assigned) {
            ensure!(
                tp.topic == topic && tp.partition < partitions,
                "{}/{} is not a partition",
                tp.topic,
                tp.partition
            );
        }
        for tp in &update.unassigned {
            ensure!(self.owned.remove(&tp.partition), "unassigned {}, which it does not own", tp.partition);
        }
        for tp in &update.assigned {
            ensure!(
                self.owned.insert(tp.partition),
                "assigned {}, which it owns already (no unassigned between)",
                tp.partition
            );
        }
        Ok(update.unassigned.len())
    }
}

/// A member record as the store holds it.
#[derive(Clone, Debug)]
pub struct Member {
    pub instance: String,
    pub leaving: bool,
}

/// The store's fleet records, revision by revision.
#[derive(Debug, Default)]
pub struct Truth {
    pub revision: Revision,
    pub members: BTreeMap<String, Member>,
    pub leases: BTreeMap<u32, String>,
    /// Per partition, the highest lease epoch written so far and its owner.
    pub epochs: BTreeMap<u32, (String, u64)>,
    /// New ownerships whose epoch was compared with an earlier one (not vacuous).
    pub epoch_checks: u64,
}

impl Truth {
    /// Applies one revision; returns a line for the log when leases or members changed.
    /// `Err` if a lease's owner has no member record (they are bound to one session and
    /// vanish together: `records.rs`).
    pub fn apply(
        &mut self,
        keys: &FleetKeys,
        topic: &str,
        batch: &WatchBatch,
    ) -> Result<Option<String>, String> {
        self.revision = batch.revision;
        let mut changes = Vec::new();
        for event in &batch.events {
            let put = match &event.kind {
                WatchEventKind::Put(kv) => Some(&kv.value),
                WatchEventKind::Delete => None,
            };
            match keys.parse(&event.key) {
                Some(FleetKey::Lease(t, p)) if t == topic => match put {
                    Some(value) => {
                        let lease: LeaseRecord = decode(&event.key, value).map_err(|e| e.to_string())?;
                        changes.push(format!("+{p}:{}@{}", lease.owner, lease.epoch));
                        self.epoch_grows(
                            p,
                            self.leases.get(&p) == Some(&lease.owner),
                            &lease,
                            batch.revision,
                        )?;
                        self.leases.insert(p, lease.owner);
                    }
                    None => {
                        changes.push(format!("-{p}"));
                        self.leases.remove(&p);
                    }
                },
                Some(FleetKey::Member(t, name)) if t == topic => match put {
                    Some(value) => {
                        let m: MemberRecord = decode(&event.key, value).map_err(|e| e.to_string())?;
                        let leaving = if m.leaving { " leaving" } else { "" };
                        changes.push(format!("+{name}@{}{leaving}", m.instance));
                        self.members.insert(name, Member { instance: m.instance, leaving: m.leaving });
                    }
                    None => {
                        changes.push(format!("-{name}"));
                        self.members.remove(&name);
                    }
                },
                _ => {}
            }
        }
        for (p, owner) in &self.leases {
            ensure!(
                self.members.contains_key(owner),
                "revision {}: lease {p} is owned by {owner}, which has no member record",
                batch.revision
            );
        }
        Ok((!changes.is_empty()).then(|| format!("store r{}: {}", batch.revision, changes.join(" "))))
    }

    /// Epochs (docs/design.md §10): a lease's epoch is never 0 and never below one written
    /// before for its partition; a new ownership (`kept` false: the partition was free or
    /// another's) is strictly above every earlier one, so no two ownerships share one.
    fn epoch_grows(
        &mut self,
        p: u32,
        kept: bool,
        lease: &LeaseRecord,
        revision: Revision,
    ) -> Result<(), String> {
        ensure!(lease.epoch > 0, "revision {revision}: lease {p} of {} has no epoch", lease.owner);
        if let Some((before, seen)) = self.epochs.get(&p) {
            ensure!(
                lease.epoch >= *seen && (kept || lease.epoch > *seen),
                "revision {revision}: partition {p} was leased to {} with epoch {}, not above {before}'s {seen}",
                lease.owner,
                lease.epoch
            );
            if !kept {
                self.epoch_checks += 1;
            }
        }
        self.epochs.insert(p, (lease.owner.clone(), lease.epoch));
        Ok(())
    }

    pub fn held_by(&self, name: &str) -> BTreeSet<u32> {
        self.leases.iter().filter(|(_, o)| *o == name).map(|(p, _)| *p).collect()
    }
}

/// (a) Strict exclusivity: no partition is believed owned by two consumers. Checked after
/// every command a consumer takes, in the order they take them.
pub fn exclusive<'a>(beliefs: impl Iterator<Item = (&'a str, &'a Belief)>) -> Result<(), String> {
    let mut believer: BTreeMap<u32, &str> = BTreeMap::new();
    for (name, belief) in beliefs {
        for p in &belief.owned {
            if let Some(other) = believer.insert(*p, name) {
                return Err(format!("partition {p} is believed owned by both {other} and {name}"));
            }
        }
    }
    Ok(())
}

/// The fleet once the faults stopped and it had time to settle.
pub struct Settled<'a> {
    pub partitions: u32,
    pub truth: &'a Truth,
    /// Consumers with an open stream that want to stay: name → belief.
    pub online: BTreeMap<&'a str, &'a Belief>,
    /// Streams still open of consumers that left, and half-open ones.
    pub lingering: usize,
    pub statuses: Vec<StatusView>,
    pub topic: &'a str,
}

/// (c) Every partition leased exactly once by an online consumer, the counts per quota
/// (rank in name order: `⌊P/N⌋ + (rank < P mod N)`, `share.rs`), the members exactly the
/// online consumers, each believing exactly its leases (a′), every instance's view equal to
/// the store's. `Err` says what is not so yet.
pub fn settled(s: &Settled<'_>) -> Result<(), String> {
    let n = s.online.len();
    ensure!(n > 0, "no consumer online");
    ensure!(s.lingering == 0, "{} streams of departed consumers are still open", s.lingering);
    let members: Vec<String> = s.truth.members.iter().map(|(k, m)| format!("{k}@{}", m.instance)).collect();
    ensure!(
        s.truth.members.values().all(|m| !m.leaving)
            && s.truth.members.keys().map(String::as_str).eq(s.online.keys().copied()),
        "members {members:?} are not the online consumers {:?}",
        s.online.keys()
    );
    for p in 0..s.partitions {
        let owner = s.truth.leases.get(&p).ok_or(format!("partition {p} has no lease"))?;
        ensure!(s.online.contains_key(owner.as_str()), "partition {p} is leased to {owner}, not online");
    }
    let (base, extra) = (s.partitions as usize / n, s.partitions as usize % n);
    for (rank, (name, belief)) in s.online.iter().enumerate() {
        let held = s.truth.held_by(name);
        let quota = base + usize::from(rank < extra);
        ensure!(held.len() == quota, "{name} (rank {rank}) holds {held:?}, its quota is {quota}");
        ensure!(
            belief.snapshot && belief.owned == held,
            "{name} believes {:?} but holds {held:?}",
            belief.owned
        );
    }
    let owners: Vec<Option<&String>> = (0..s.partitions).map(|p| s.truth.leases.get(&p)).collect();
    for status in &s.statuses {
        let topic = status.topics.iter().find(|t| t.topic == s.topic);
        let topic = topic.ok_or(format!("{} does not show the topic", status.instance))?;
        ensure!(
            topic.owners.iter().map(Option::as_ref).eq(owners.iter().copied()),
            "{} shows owners {:?}, the store {owners:?}",
            status.instance,
            topic.owners
        );
    }
    Ok(())
}
