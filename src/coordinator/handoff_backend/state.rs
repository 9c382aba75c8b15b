//! Every instance's in-memory copy of the stored state, fed by one prefix watch.
//!
//! Each record is kept with its mod revision, so a decision taken from the cache can be
//! written with compare-and-swap: if the record changed since, the write fails instead of
//! acting on stale state.

use std::collections::{BTreeMap, BTreeSet};

use super::leader_groups::{self, LeaderGroup};
use super::records::{AssignmentRecord, ConsumerRecord, HandoffRecord, Key, Keys, TopicRecord, decode};
use crate::coordinator::shared::instance_record::leader_groups_of;
use crate::coordinator::shared::mirror::{Changes, MirrorCache, Versioned};
use crate::handoff::{ConsumerView, Handoff, Phase, TopicState};
use crate::store::{KeyValue, Revision};

/// Everything stored about one topic.
#[derive(Clone, Debug, Default)]
pub struct TopicEntry {
    /// The topic config, once created.
    pub config: Option<Versioned<TopicRecord>>,
    /// Live registrations by consumer name.
    pub consumers: BTreeMap<String, Versioned<ConsumerRecord>>,
    /// Owner by partition.
    pub owners: BTreeMap<u32, Versioned<String>>,
    /// The epoch of each owner's ownership (docs/design.md §10), by partition.
    pub epochs: BTreeMap<u32, u64>,
    /// Handoffs by partition.
    pub handoffs: BTreeMap<u32, Versioned<Handoff>>,
    /// Index: the partitions each consumer owns (kept with `owners`).
    owned_by: BTreeMap<String, BTreeSet<u32>>,
    /// Index: the partitions each consumer takes part in a handoff of, as source or target
    /// (kept with `handoffs`).
    handoffs_of: BTreeMap<String, BTreeSet<u32>>,
}

impl TopicEntry {
    /// The pure state machine's view of this topic.
    pub fn state(&self) -> TopicState {
        TopicState {
            partition_count: self.config.as_ref().map_or(0, |c| c.value.partition_count),
            consumers: self.consumers.iter().map(|(n, r)| (n.clone(), r.value.status)).collect(),
            owners: self.owners.iter().map(|(p, o)| (*p, o.value.clone())).collect(),
            handoffs: self.handoffs.iter().map(|(p, h)| (*p, h.value.clone())).collect(),
            info: self
                .consumers
                .iter()
                .filter(|(_, r)| !r.value.info.is_default())
                .map(|(n, r)| (n.clone(), r.value.info.clone()))
                .collect(),
            weights: self.config.as_ref().map(|c| c.value.weights.clone()).unwrap_or_default(),
            epochs: self.epochs.clone(),
            next_epoch: 0,
        }
    }

    /// The highest epoch the topic's records hold, owners' and handoffs' alike: the floor
    /// every new ownership planned from this entry is put above (docs/design.md §10).
    pub fn highest_epoch(&self) -> u64 {
        let handoffs = self.handoffs.values().map(|h| h.value.epoch);
        self.epochs.values().copied().chain(handoffs).max().unwrap_or(0)
    }

    /// The epochs of the partitions `consumer` owns or is warming (docs/design.md §10), in
    /// partition order: O(its partitions), from the indexes. A record last written before
    /// `since` (the consumer's registration) holds an earlier incarnation's epoch, not yet
    /// raised (`incarnation.rs`: a registration decided from a cache that lagged): left out.
    pub fn epochs_of(&self, consumer: &str, since: Revision) -> Vec<crate::coordinator::PartitionEpoch> {
        use crate::coordinator::PartitionEpoch;
        let current = |p: &u32| self.owners.get(p).is_some_and(|o| o.mod_revision >= since);
        let owned = self.owned_by.get(consumer).into_iter().flatten().filter(|p| current(p)).map(|p| {
            PartitionEpoch { partition: *p, epoch: self.epochs.get(p).copied().unwrap_or(0), warming: false }
        });
        let warming = self.handoffs_of.get(consumer).into_iter().flatten().filter_map(|p| {
            let h = self.handoffs.get(p).filter(|h| h.mod_revision >= since)?;
            let h = &h.value;
            (h.phase == Phase::Warming && h.to == consumer).then_some(PartitionEpoch {
                partition: *p,
                epoch: h.epoch,
                warming: true,
            })
        });
        let mut epochs: Vec<PartitionEpoch> = owned.chain(warming).collect();
        epochs.sort_unstable();
        epochs
    }

    /// The view of one consumer ([`ConsumerView::of`] of [`state`](Self::state)), from the
    /// per-consumer indexes: O(its partitions), whatever the size of the topic. Unlike
    /// the model's view, it does not look at the registration: the relay asks only for
    /// streams whose registration it holds, or lost and being written again (the machine's rebind),
    /// whose consumers still own what they own.
    pub fn view_of(&self, consumer: &str) -> ConsumerView {
        let owned = self.owned_by.get(consumer).cloned().unwrap_or_default();
        let mut view = ConsumerView { owned, ..ConsumerView::default() };
        for p in self.handoffs_of.get(consumer).into_iter().flatten() {
            self.note_handoff(&mut view, consumer, *p);
        }
        view
    }

    /// The part of [`view_of`](Self::view_of) within `partitions`: O(their number), for a
    /// relay step that compares only the partitions a revision changed.
    pub fn view_within(&self, consumer: &str, partitions: &BTreeSet<u32>) -> ConsumerView {
        let mut view = ConsumerView::default();
        for p in partitions {
            if self.owners.get(p).is_some_and(|o| o.value == consumer) {
                view.owned.insert(*p);
            }
            self.note_handoff(&mut view, consumer, *p);
        }
        view
    }

    /// Adds to `view` the part `consumer` takes in `partition`'s handoff, if any: warming it
    /// (the target while warming) or releasing it (the source while releasing).
    fn note_handoff(&self, view: &mut ConsumerView, consumer: &str, partition: u32) {
        let Some(h) = self.handoffs.get(&partition).map(|h| &h.value) else { return };
        match h.phase {
            Phase::Warming if h.to == consumer => {
                view.warming.insert(partition, h.from.clone());
            }
            Phase::Releasing if h.from == consumer => {
                view.releasing.insert(partition, h.to.clone());
            }
            _ => {}
        }
    }

    /// Sets a partition's owner (keeping the index); returns the previous one.
    pub(super) fn set_owner(&mut self, partition: u32, owner: Option<Versioned<String>>) -> Option<String> {
        let before = match owner {
            Some(owner) => {
                self.owned_by.entry(owner.value.clone()).or_default().insert(partition);
                self.owners.insert(partition, owner)
            }
            None => self.owners.remove(&partition),
        };
        let before = before.map(|o| o.value);
        if let Some(old) = &before
            && self.owners.get(&partition).is_none_or(|o| o.value != *old)
            && let Some(set) = self.owned_by.get_mut(old)
        {
            set.remove(&partition);
            if set.is_empty() {
                self.owned_by.remove(old);
            }
        }
        before
    }

    /// Sets a partition's handoff (keeping the index); returns the previous one.
    pub(super) fn set_handoff(
        &mut self,
        partition: u32,
        handoff: Option<Versioned<Handoff>>,
    ) -> Option<Handoff> {
        let before = match handoff {
            Some(h) => self.handoffs.insert(partition, h),
            None => self.handoffs.remove(&partition),
        }
        .map(|h| h.value);
        for name in before.iter().flat_map(|h| [&h.from, &h.to]) {
            if let Some(set) = self.handoffs_of.get_mut(name) {
                set.remove(&partition);
                if set.is_empty() {
                    self.handoffs_of.remove(name);
                }
            }
        }
        if let Some(h) = self.handoffs.get(&partition) {
            for name in [&h.value.from, &h.value.to] {
                self.handoffs_of.entry(name.clone()).or_default().insert(partition);
            }
        }
        before
    }

    /// The partitions `consumer` owns, in order (from the index).
    pub fn owned_by(&self, consumer: &str) -> impl Iterator<Item = u32> + '_ {
        self.owned_by.get(consumer).into_iter().flatten().copied()
    }

    /// The partitions `consumer` takes part in a handoff of, as source or target, in order.
    pub fn handoffs_of(&self, consumer: &str) -> impl Iterator<Item = u32> + '_ {
        self.handoffs_of.get(consumer).into_iter().flatten().copied()
    }

    /// Mod revision of a partition's assignment record (0 when absent).
    pub fn owner_revision(&self, partition: u32) -> Revision {
        self.owners.get(&partition).map_or(0, |o| o.mod_revision)
    }

    /// Mod revision of a partition's handoff record (0 when absent).
    pub fn handoff_revision(&self, partition: u32) -> Revision {
        self.handoffs.get(&partition).map_or(0, |h| h.mod_revision)
    }
}

/// The cached state under the prefix.
#[derive(Clone, Debug, Default)]
pub struct Cache {
    /// The store revision this cache reflects.
    pub revision: Revision,
    /// Topics by name.
    pub topics: BTreeMap<String, TopicEntry>,
    /// The leader keys present, by group (with one group, at most `LeaderGroup::ONLY`).
    pub leaders: BTreeMap<LeaderGroup, KeyValue>,
    /// How many instance records went since this cache was loaded: each one an instance
    /// lease that ended, taking that instance's registrations with it in the same revision
    /// (the leader settles when it grows). Kept across re-reads (`MirrorCache::carry_over`),
    /// which also count the records that went in the gap they close.
    pub instance_losses: u64,
    /// The instance records present, with the revision each was created at: one created
    /// again is another lease (the one before ended).
    pub instances: BTreeMap<String, Revision>,
    /// The leader group count each present instance record says (`leader_groups.rs`: an
    /// instance hands a group over only to one campaigning under the same count).
    pub instance_groups: BTreeMap<String, u32>,
    /// Per group count present, which instance each group prefers
    /// ([`leader_groups::preferred`] over [`Cache::instances_under`]): kept with the
    /// instance records, since every leader's look asks and the records rarely change.
    preferences: BTreeMap<u32, BTreeMap<u32, String>>,
}

impl Cache {
    /// The leader key of `group`, if someone leads it.
    pub fn leader(&self, group: LeaderGroup) -> Option<&KeyValue> {
        self.leaders.get(&group)
    }

    /// The names of the instances leading some group, each once, in order (for the status:
    /// a name is a leader key's value).
    pub fn leader_names(&self) -> Vec<String> {
        let names: BTreeSet<String> =
            self.leaders.values().map(|kv| String::from_utf8_lossy(&kv.value).into_owned()).collect();
        names.into_iter().collect()
    }

    /// Which instance each of `groups` groups prefers, among those campaigning under that
    /// count (`None`: no instance record says `groups`).
    pub fn preferences(&self, groups: u32) -> Option<&BTreeMap<u32, String>> {
        self.preferences.get(&groups)
    }

    /// The instance records changed: the preferences again, for every count present.
    fn instances_changed(&mut self) {
        let counts: BTreeSet<u32> = self.instance_groups.values().copied().collect();
        self.preferences =
            counts.into_iter().map(|g| (g, leader_groups::preferred(g, self.instances_under(g)))).collect();
    }

    /// The instances present that campaign under `groups` (who leader groups are shared
    /// among: `leader_groups::preferred`).
    pub fn instances_under(&self, groups: u32) -> impl Iterator<Item = &str> {
        self.instance_groups.iter().filter(move |(_, g)| **g == groups).map(|(instance, _)| instance.as_str())
    }

    fn topic(&mut self, topic: &str) -> &mut TopicEntry {
        self.topics.entry(topic.to_string()).or_default()
    }
}

impl MirrorCache for Cache {
    type Keys = Keys;

    fn put(&mut self, keys: &Keys, kv: KeyValue, changes: &mut Changes) {
        let Some(key) = keys.parse(&kv.key) else { return };
        let rev = kv.mod_revision;
        let decoded = match &key {
            Key::Leader(group) => {
                self.leaders.insert(*group, kv);
                Ok(())
            }
            Key::Instance(instance) => {
                self.instances.insert(instance.clone(), kv.create_revision);
                let groups = leader_groups_of(&kv.value);
                if self.instance_groups.insert(instance.clone(), groups) != Some(groups) {
                    self.instances_changed();
                }
                Ok(())
            }
            Key::Topic(t) => decode::<TopicRecord>(&kv.key, &kv.value).map(|value| {
                self.topic(t).config = Some(Versioned { value, mod_revision: rev });
                changes.topic(t);
            }),
            Key::Consumer(t, c) => decode::<ConsumerRecord>(&kv.key, &kv.value).map(|value| {
                self.topic(t).consumers.insert(c.clone(), Versioned { value, mod_revision: rev });
                changes.consumers(t, [c.as_str()]);
            }),
            Key::Assignment(t, p) => decode::<AssignmentRecord>(&kv.key, &kv.value).map(|r| {
                let owner = r.owner.clone();
                let epoch = crate::coordinator::shared::records::stored_epoch(r.epoch, rev);
                self.topic(t).epochs.insert(*p, epoch);
                let before =
                    self.topic(t).set_owner(*p, Some(Versioned { value: r.owner, mod_revision: rev }));
                changes.partition(t, before.iter().map(String::as_str).chain([owner.as_str()]), *p);
            }),
            Key::Handoff(t, p) => decode::<HandoffRecord>(&kv.key, &kv.value).map(|r| {
                let names = [r.handoff.from.clone(), r.handoff.to.clone()];
                let before =
                    self.topic(t).set_handoff(*p, Some(Versioned { value: r.handoff, mod_revision: rev }));
                let old = before.iter().flat_map(|h| [h.from.as_str(), h.to.as_str()]);
                changes.partition(t, old.chain(names.iter().map(String::as_str)), *p);
            }),
        };
        if let Err(error) = decoded {
            // A record we cannot read is skipped, not fatal: the rest of the fleet keeps working.
            tracing::warn!(%error, "ignoring unreadable record");
        }
    }

    fn delete(&mut self, keys: &Keys, key: &str, changes: &mut Changes) {
        let Some(key) = keys.parse(key) else { return };
        match &key {
            Key::Leader(group) => {
                self.leaders.remove(group);
            }
            Key::Instance(instance) => {
                self.instances.remove(instance);
                if self.instance_groups.remove(instance).is_some() {
                    self.instances_changed();
                }
                self.instance_losses += 1;
            }
            Key::Topic(t) => {
                self.topic(t).config = None;
                changes.topic(t);
            }
            Key::Consumer(t, c) => {
                self.topic(t).consumers.remove(c);
                changes.consumers(t, [c.as_str()]);
            }
            Key::Assignment(t, p) => {
                self.topic(t).epochs.remove(p);
                let before = self.topic(t).set_owner(*p, None);
                changes.partition(t, before.iter().map(String::as_str), *p);
            }
            Key::Handoff(t, p) => {
                let before = self.topic(t).set_handoff(*p, None);
                changes.partition(t, before.iter().flat_map(|h| [h.from.as_str(), h.to.as_str()]), *p);
            }
        }
    }

    fn carry_over(&self, fresh: &mut Cache) {
        // A record gone from the snapshot, or created again, is a lease that ended in the gap.
        let ended =
            self.instances.iter().filter(|(i, created)| fresh.instances.get(*i) != Some(created)).count();
        fresh.instance_losses = self.instance_losses + ended as u64;
    }

    fn differing(&self, other: &Cache) -> Changes {
        let names: BTreeSet<&String> = self.topics.keys().chain(other.topics.keys()).collect();
        let mut changes = Changes::default();
        for topic in names {
            let (a, b) = (self.topics.get(topic), other.topics.get(topic));
            if a.map(TopicEntry::state) != b.map(TopicEntry::state) || a.map(sessions) != b.map(sessions) {
                changes.topic(topic);
            }
        }
        changes
    }

    fn revision(&self) -> Revision {
        self.revision
    }

    fn set_revision(&mut self, revision: Revision) {
        self.revision = revision;
    }

    /// Owner and handoff records, what a call or the leader writes (their compares hold
    /// them); no other record is ever applied ahead.
    fn mod_revision(&self, keys: &Keys, key: &str) -> Option<Revision> {
        let entry = |topic: &str| self.topics.get(topic);
        match keys.parse(key)? {
            Key::Assignment(t, p) => Some(entry(&t).map_or(0, |e| e.owner_revision(p))),
            Key::Handoff(t, p) => Some(entry(&t).map_or(0, |e| e.handoff_revision(p))),
            _ => None,
        }
    }

    fn topic_count(&self, topic: &str) -> Option<(u32, Revision)> {
        let config = self.topics.get(topic)?.config.as_ref()?;
        Some((config.value.partition_count, config.mod_revision))
    }

    fn stored_topics(&self) -> Vec<(String, u32)> {
        self.topics
            .iter()
            .filter_map(|(topic, entry)| Some((topic.clone(), entry.config.as_ref()?.value.partition_count)))
            .collect()
    }
}

fn sessions(entry: &TopicEntry) -> Vec<(String, i64, Revision)> {
    entry.consumers.iter().map(|(n, r)| (n.clone(), r.value.session, r.mod_revision)).collect()
}

#[cfg(test)]
mod tests {
    use super::Cache;
    use crate::coordinator::handoff_backend::records::Keys;
    use crate::coordinator::shared::instance_record::instance_key;
    use crate::coordinator::shared::mirror::{Changes, MirrorCache};
    use crate::store::{KeyValue, PrefixSnapshot, WatchEvent, WatchEventKind};

    /// Instance `name`'s record, created at `created`.
    fn record(name: &str, created: i64) -> KeyValue {
        KeyValue {
            key: instance_key("/k/", name),
            value: b"{}".to_vec(),
            mod_revision: created,
            create_revision: created,
            session: None,
        }
    }

    fn snapshot(revision: i64, records: &[(&str, i64)]) -> Cache {
        let kvs = records.iter().map(|(name, created)| record(name, *created)).collect();
        Cache::from_snapshot(&Keys::new("/k/"), PrefixSnapshot { kvs, revision })
    }

    #[test]
    fn an_instance_lease_that_ended_in_a_reread_gap_is_counted_and_no_count_is_lost() {
        let keys = Keys::new("/k/");
        let mut cache = snapshot(5, &[("i0", 3), ("i1", 4)]);
        // Watched: i1's lease ends.
        let gone = WatchEvent { key: instance_key("/k/", "i1"), revision: 6, kind: WatchEventKind::Delete };
        cache.apply(&keys, gone, &mut Changes::default());
        assert_eq!(cache.instance_losses, 1);
        // A re-read closes a gap in which i0's lease ended and i0 wrote its record again:
        // counted on top of what was followed, never reset.
        let mut fresh = snapshot(9, &[("i0", 8)]);
        cache.carry_over(&mut fresh);
        assert_eq!(fresh.instance_losses, 2, "the one followed and the one in the gap");
        // A re-read that finds the same records counts nothing new.
        let mut same = snapshot(10, &[("i0", 8)]);
        fresh.carry_over(&mut same);
        assert_eq!(same.instance_losses, 2);
    }
}
