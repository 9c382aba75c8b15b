//! Every instance's in-memory copy of the stored state, fed by one prefix watch.
//!
//! Each record is kept with its mod revision, so a decision taken from the cache can be
//! written with compare-and-swap: if the record changed since, the write fails instead of
//! acting on stale state.

use std::collections::{BTreeMap, BTreeSet};

use super::records::{AssignmentRecord, ConsumerRecord, HandoffRecord, Key, Keys, TopicRecord, decode};
use crate::coordinator::shared::mirror::{MirrorCache, Versioned};
use crate::handoff::{ConsumerView, Handoff, TopicState};
use crate::store::{KeyValue, PrefixSnapshot, Revision, WatchEvent, WatchEventKind};

/// Everything stored about one topic.
#[derive(Clone, Debug, Default)]
pub struct TopicEntry {
    /// The topic config, once created.
    pub config: Option<Versioned<TopicRecord>>,
    /// Live registrations by consumer name.
    pub consumers: BTreeMap<String, Versioned<ConsumerRecord>>,
    /// Owner by partition.
    pub owners: BTreeMap<u32, Versioned<String>>,
    /// Handoffs by partition.
    pub handoffs: BTreeMap<u32, Versioned<Handoff>>,
}

impl TopicEntry {
    /// The pure state machine's view of this topic.
    pub fn state(&self) -> TopicState {
        TopicState {
            partition_count: self.config.as_ref().map_or(0, |c| c.value.partition_count),
            consumers: self.consumers.iter().map(|(n, r)| (n.clone(), r.value.status)).collect(),
            owners: self.owners.iter().map(|(p, o)| (*p, o.value.clone())).collect(),
            handoffs: self.handoffs.iter().map(|(p, h)| (*p, h.value.clone())).collect(),
        }
    }

    /// The part of [`state`](Self::state) a call of `consumer` about `partition` reads:
    /// the partition count, the caller's registration and the partition's owner and
    /// handoff (what the transitions of `handoff::transitions` look at). Building it
    /// costs O(1) instead of a clone of every partition: it is on the handoff fast path.
    pub fn partition_state(&self, consumer: &str, partition: u32) -> TopicState {
        let mut state = TopicState {
            partition_count: self.config.as_ref().map_or(0, |c| c.value.partition_count),
            ..Default::default()
        };
        if let Some(record) = self.consumers.get(consumer) {
            state.consumers.insert(consumer.to_string(), record.value.status);
        }
        if let Some(owner) = self.owners.get(&partition) {
            state.owners.insert(partition, owner.value.clone());
        }
        if let Some(handoff) = self.handoffs.get(&partition) {
            state.handoffs.insert(partition, handoff.value.clone());
        }
        state
    }

    /// [`ConsumerView::all`] of [`state`](Self::state), without cloning the state.
    pub fn views(&self) -> BTreeMap<String, ConsumerView> {
        ConsumerView::all_of(
            self.consumers.keys(),
            self.owners.iter().map(|(p, o)| (p, &o.value)),
            self.handoffs.iter().map(|(p, h)| (p, &h.value)),
        )
    }

    /// The view of one consumer ([`ConsumerView::of`] of [`state`](Self::state), without
    /// cloning the state).
    pub fn view_of(&self, consumer: &str) -> ConsumerView {
        ConsumerView::all_of(
            self.consumers.keys().filter(|name| *name == consumer),
            self.owners.iter().filter(|(_, o)| o.value == consumer).map(|(p, o)| (p, &o.value)),
            self.handoffs
                .iter()
                .filter(|(_, h)| h.value.from == consumer || h.value.to == consumer)
                .map(|(p, h)| (p, &h.value)),
        )
        .remove(consumer)
        .unwrap_or_default()
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
    /// The leader key, if someone leads.
    pub leader: Option<KeyValue>,
}

impl Cache {
    fn put(&mut self, keys: &Keys, kv: KeyValue) -> Option<String> {
        let key = keys.parse(&kv.key)?;
        let rev = kv.mod_revision;
        let decoded = match &key {
            Key::Leader => {
                self.leader = Some(kv);
                return None;
            }
            Key::Topic(t) => decode::<TopicRecord>(&kv.key, &kv.value).map(|value| {
                self.topic(t).config = Some(Versioned { value, mod_revision: rev });
            }),
            Key::Consumer(t, c) => decode::<ConsumerRecord>(&kv.key, &kv.value).map(|value| {
                self.topic(t).consumers.insert(c.clone(), Versioned { value, mod_revision: rev });
            }),
            Key::Assignment(t, p) => decode::<AssignmentRecord>(&kv.key, &kv.value).map(|r| {
                self.topic(t).owners.insert(*p, Versioned { value: r.owner, mod_revision: rev });
            }),
            Key::Handoff(t, p) => decode::<HandoffRecord>(&kv.key, &kv.value).map(|r| {
                self.topic(t).handoffs.insert(*p, Versioned { value: r.handoff, mod_revision: rev });
            }),
        };
        if let Err(error) = decoded {
            // A record we cannot read is skipped, not fatal: the rest of the fleet keeps working.
            tracing::warn!(%error, "ignoring unreadable record");
            return None;
        }
        topic_of(key)
    }

    fn delete(&mut self, keys: &Keys, key: &str) -> Option<String> {
        let key = keys.parse(key)?;
        match &key {
            Key::Leader => self.leader = None,
            Key::Topic(t) => self.topic(t).config = None,
            Key::Consumer(t, c) => {
                self.topic(t).consumers.remove(c);
            }
            Key::Assignment(t, p) => {
                self.topic(t).owners.remove(p);
            }
            Key::Handoff(t, p) => {
                self.topic(t).handoffs.remove(p);
            }
        }
        topic_of(key)
    }

    fn topic(&mut self, topic: &str) -> &mut TopicEntry {
        self.topics.entry(topic.to_string()).or_default()
    }
}

impl MirrorCache for Cache {
    type Keys = Keys;

    fn prefix(keys: &Keys) -> &str {
        keys.prefix()
    }

    /// A cache holding exactly `snapshot`.
    fn from_snapshot(keys: &Keys, snapshot: PrefixSnapshot) -> Self {
        let mut cache = Cache { revision: snapshot.revision, ..Default::default() };
        for kv in snapshot.kvs {
            cache.put(keys, kv);
        }
        cache
    }

    /// Applies one watched change; returns the topic it touched, if any.
    fn apply(&mut self, keys: &Keys, event: WatchEvent) -> Option<String> {
        self.revision = self.revision.max(event.revision);
        match event.kind {
            WatchEventKind::Put(kv) => self.put(keys, kv),
            WatchEventKind::Delete => self.delete(keys, &event.key),
        }
    }

    /// Names of topics touched between `self` and `other` (used after a re-read).
    fn topics_differing(&self, other: &Cache) -> BTreeSet<String> {
        let names: BTreeSet<&String> = self.topics.keys().chain(other.topics.keys()).collect();
        names
            .into_iter()
            .filter(|t| {
                let (a, b) = (self.topics.get(*t), other.topics.get(*t));
                a.map(TopicEntry::state) != b.map(TopicEntry::state) || a.map(sessions) != b.map(sessions)
            })
            .cloned()
            .collect()
    }

    fn revision(&self) -> Revision {
        self.revision
    }

    fn topic_key(keys: &Keys, topic: &str) -> String {
        keys.topic(topic)
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

fn topic_of(key: Key) -> Option<String> {
    match key {
        Key::Topic(t) | Key::Consumer(t, _) | Key::Assignment(t, _) | Key::Handoff(t, _) => Some(t),
        Key::Leader => None,
    }
}
