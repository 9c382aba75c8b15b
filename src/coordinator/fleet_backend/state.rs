//! The fleet backend's cache of the store: per topic, the count, members and leases.

use crate::assignment::ConsumerInfo;
use std::collections::{BTreeMap, BTreeSet};

use super::records::{EpochRecord, FleetKey, FleetKeys, LeaseRecord, MemberRecord};
use crate::coordinator::shared::mirror::{Changes, MirrorCache, Versioned};
use crate::coordinator::shared::records::{TopicRecord, decode};
use crate::store::{KeyValue, Revision};

/// Everything stored about one topic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetTopic {
    /// The partition count, once stored.
    pub count: Option<Versioned<u32>>,
    /// Registrations by consumer name.
    pub members: BTreeMap<String, Versioned<MemberRecord>>,
    /// Lease owner by partition.
    pub leases: BTreeMap<u32, Versioned<String>>,
    /// The epoch of each lease (docs/design.md §10), by partition.
    pub epochs: BTreeMap<u32, u64>,
    /// The durable epoch floor of each partition ever leased since floors exist
    /// (`EpochRecord`), with its mod revision.
    pub floors: BTreeMap<u32, Versioned<u64>>,
}

impl FleetTopic {
    /// The stored partition count (0 until stored).
    pub fn partition_count(&self) -> u32 {
        self.count.as_ref().map_or(0, |c| c.value)
    }

    /// Members taking part in the fair share (registered and not leaving), in name order.
    pub fn live(&self) -> BTreeMap<String, ConsumerInfo> {
        self.members
            .iter()
            .filter(|(_, r)| !r.value.leaving)
            .map(|(n, r)| (n.clone(), r.value.info.clone()))
            .collect()
    }

    /// Partitions (below the count) whose lease `consumer` holds.
    pub fn held_by(&self, consumer: &str) -> BTreeSet<u32> {
        let count = self.partition_count();
        self.leases.iter().filter(|(p, o)| **p < count && o.value == consumer).map(|(p, _)| *p).collect()
    }

    /// The epochs of the partitions whose lease `consumer` holds, in partition order, save
    /// leases last written before `since` (the consumer's registration, which rewrites every
    /// lease it keeps with a raised epoch): an earlier incarnation's.
    pub fn epochs_of(&self, consumer: &str, since: Revision) -> Vec<crate::coordinator::PartitionEpoch> {
        self.held_by(consumer)
            .into_iter()
            .filter(|p| self.lease_revision(*p) >= since)
            .filter_map(|partition| {
                let epoch = *self.epochs.get(&partition)?;
                Some(crate::coordinator::PartitionEpoch { partition, epoch, warming: false })
            })
            .collect()
    }

    /// The highest epoch this cache knows for `partition` (its floor record's, or its
    /// lease's, written before floors existed) and the mod revision of its floor record (0:
    /// none), which a claim compares.
    pub fn floor(&self, partition: u32) -> (u64, Revision) {
        let stored = self.floors.get(&partition);
        let leased = self.epochs.get(&partition).copied().unwrap_or(0);
        (stored.map_or(0, |f| f.value).max(leased), stored.map_or(0, |f| f.mod_revision))
    }

    /// Mod revision of a partition's lease (0 when free).
    pub fn lease_revision(&self, partition: u32) -> Revision {
        self.leases.get(&partition).map_or(0, |l| l.mod_revision)
    }
}

/// The cached fleet state under the prefix.
#[derive(Clone, Debug, Default)]
pub struct FleetCache {
    /// The store revision this cache reflects.
    pub revision: Revision,
    /// Topics by name.
    pub topics: BTreeMap<String, FleetTopic>,
}

impl FleetCache {
    fn topic(&mut self, topic: &str) -> &mut FleetTopic {
        self.topics.entry(topic.to_string()).or_default()
    }
}

impl MirrorCache for FleetCache {
    type Keys = FleetKeys;

    fn put(&mut self, keys: &FleetKeys, kv: KeyValue, changes: &mut Changes) {
        let Some(key) = keys.parse(&kv.key) else { return };
        let rev = kv.mod_revision;
        let decoded = match &key {
            FleetKey::Topic(t) => decode::<TopicRecord>(&kv.key, &kv.value).map(|r| {
                self.topic(t).count = Some(Versioned { value: r.partition_count, mod_revision: rev });
                changes.topic(t);
            }),
            FleetKey::Member(t, c) => decode::<MemberRecord>(&kv.key, &kv.value).map(|value| {
                self.topic(t).members.insert(c.clone(), Versioned { value, mod_revision: rev });
                changes.consumers(t, [c.as_str()]);
            }),
            FleetKey::Lease(t, p) => decode::<LeaseRecord>(&kv.key, &kv.value).map(|r| {
                let owner = r.owner.clone();
                let epoch = crate::coordinator::shared::records::stored_epoch(r.epoch, rev);
                self.topic(t).epochs.insert(*p, epoch);
                let before = self.topic(t).leases.insert(*p, Versioned { value: r.owner, mod_revision: rev });
                changes.consumers(t, before.iter().map(|o| o.value.as_str()).chain([owner.as_str()]));
            }),
            // A floor changes no one's view: only claims read it.
            FleetKey::Epoch(t, p) => decode::<EpochRecord>(&kv.key, &kv.value).map(|r| {
                self.topic(t).floors.insert(*p, Versioned { value: r.epoch, mod_revision: rev });
            }),
        };
        if let Err(error) = decoded {
            // An unreadable record is skipped, not fatal: the rest of the fleet keeps working.
            tracing::warn!(%error, "ignoring unreadable fleet record");
        }
    }

    fn delete(&mut self, keys: &FleetKeys, key: &str, changes: &mut Changes) {
        match keys.parse(key) {
            Some(FleetKey::Topic(t)) => {
                self.topic(&t).count = None;
                changes.topic(&t);
            }
            Some(FleetKey::Member(t, c)) => {
                self.topic(&t).members.remove(&c);
                changes.consumers(&t, [c.as_str()]);
            }
            Some(FleetKey::Lease(t, p)) => {
                self.topic(&t).epochs.remove(&p);
                let before = self.topic(&t).leases.remove(&p);
                changes.consumers(&t, before.iter().map(|o| o.value.as_str()));
            }
            Some(FleetKey::Epoch(t, p)) => {
                self.topic(&t).floors.remove(&p);
            }
            None => {}
        }
    }

    fn differing(&self, other: &FleetCache) -> Changes {
        let names: BTreeSet<&String> = self.topics.keys().chain(other.topics.keys()).collect();
        let mut changes = Changes::default();
        for topic in names.into_iter().filter(|t| self.topics.get(*t) != other.topics.get(*t)) {
            changes.topic(topic);
        }
        changes
    }

    fn revision(&self) -> Revision {
        self.revision
    }

    fn set_revision(&mut self, revision: Revision) {
        self.revision = revision;
    }

    fn topic_count(&self, topic: &str) -> Option<(u32, Revision)> {
        let count = self.topics.get(topic)?.count.as_ref()?;
        Some((count.value, count.mod_revision))
    }

    fn stored_topics(&self) -> Vec<(String, u32)> {
        self.topics
            .iter()
            .filter_map(|(topic, entry)| Some((topic.clone(), entry.count.as_ref()?.value)))
            .collect()
    }
}
