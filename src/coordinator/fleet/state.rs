//! The fleet backend's records, key layout and in-memory cache.
//!
//! ```text
//! {prefix}fleet/topics/{topic}                 TopicRecord   (durable; first registration creates it)
//! {prefix}fleet/members/{topic}/{consumer}     MemberRecord  (bound to the consumer's session)
//! {prefix}fleet/leases/{topic}/{partition}     LeaseRecord   (bound to the owner's session)
//! ```
//!
//! A lease is bound to the same session as its owner's member record, so the two vanish in
//! one revision when the session expires or is revoked: at every revision, every lease's
//! owner has a member record. Records are JSON with a version field `v`
//! ([`crate::coordinator::records`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::coordinator::cache::Versioned;
use crate::coordinator::mirror::MirrorCache;
use crate::coordinator::records::{TopicRecord, decode};
use crate::store::{KeyValue, PrefixSnapshot, Revision, WatchEvent, WatchEventKind};

/// `{prefix}fleet/members/{topic}/{consumer}`: a live registration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// Record format version.
    pub v: u32,
    /// The session the record (and the consumer's leases) are bound to.
    pub session: i64,
    /// The assigner instance holding the consumer's stream.
    pub instance: String,
    /// Set by `Deregister`: the consumer takes no part in the fair share any more, and the
    /// instance holding its stream ends it and revokes its session (freeing its leases).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leaving: bool,
}

/// `{prefix}fleet/leases/{topic}/{partition}`: the partition's owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// Record format version.
    pub v: u32,
    /// The owning consumer.
    pub owner: String,
}

/// A parsed fleet key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FleetKey {
    /// A topic config.
    Topic(String),
    /// A consumer registration.
    Member(String, String),
    /// A partition lease.
    Lease(String, u32),
}

/// Builds and parses the fleet's keys under one prefix.
#[derive(Clone, Debug)]
pub struct FleetKeys {
    root: String,
}

impl FleetKeys {
    /// Keys under `{prefix}fleet/` (a `/` is added to `prefix` when missing).
    pub fn new(prefix: &str) -> Self {
        let mut root = prefix.to_string();
        if !root.ends_with('/') {
            root.push('/');
        }
        root.push_str("fleet/");
        Self { root }
    }

    /// `{prefix}fleet/`: everything the fleet backend stores.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// `{prefix}fleet/topics/{topic}`.
    pub fn topic(&self, topic: &str) -> String {
        format!("{}topics/{topic}", self.root)
    }

    /// `{prefix}fleet/members/{topic}/{consumer}`.
    pub fn member(&self, topic: &str, consumer: &str) -> String {
        format!("{}members/{topic}/{consumer}", self.root)
    }

    /// `{prefix}fleet/members/`: every registration of every topic.
    pub fn all_members(&self) -> String {
        format!("{}members/", self.root)
    }

    /// `{prefix}fleet/leases/{topic}/{partition}`.
    pub fn lease(&self, topic: &str, partition: u32) -> String {
        format!("{}leases/{topic}/{partition}", self.root)
    }

    /// `{prefix}fleet/leases/{topic}/`: the topic's leases.
    pub fn leases(&self, topic: &str) -> String {
        format!("{}leases/{topic}/", self.root)
    }

    /// Parses a fleet key; `None` for anything else.
    pub fn parse(&self, key: &str) -> Option<FleetKey> {
        let rest = key.strip_prefix(&self.root)?;
        let (kind, rest) = rest.split_once('/')?;
        match kind {
            "topics" => Some(FleetKey::Topic(rest.to_string())),
            "members" => {
                let (topic, consumer) = rest.split_once('/')?;
                Some(FleetKey::Member(topic.to_string(), consumer.to_string()))
            }
            "leases" => {
                let (topic, partition) = rest.split_once('/')?;
                Some(FleetKey::Lease(topic.to_string(), partition.parse().ok()?))
            }
            _ => None,
        }
    }
}

/// Everything stored about one topic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetTopic {
    /// The partition count, once stored.
    pub count: Option<Versioned<u32>>,
    /// Registrations by consumer name.
    pub members: BTreeMap<String, Versioned<MemberRecord>>,
    /// Lease owner by partition.
    pub leases: BTreeMap<u32, Versioned<String>>,
}

impl FleetTopic {
    /// The stored partition count (0 until stored).
    pub fn partition_count(&self) -> u32 {
        self.count.as_ref().map_or(0, |c| c.value)
    }

    /// Members taking part in the fair share (registered and not leaving), in name order.
    pub fn live(&self) -> Vec<&str> {
        self.members.iter().filter(|(_, r)| !r.value.leaving).map(|(n, _)| n.as_str()).collect()
    }

    /// Partitions (below the count) whose lease `consumer` holds.
    pub fn held_by(&self, consumer: &str) -> BTreeSet<u32> {
        let count = self.partition_count();
        self.leases.iter().filter(|(p, o)| **p < count && o.value == consumer).map(|(p, _)| *p).collect()
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
    /// A cache holding exactly `snapshot`.
    pub fn from_snapshot(keys: &FleetKeys, snapshot: PrefixSnapshot) -> Self {
        let mut cache = FleetCache { revision: snapshot.revision, ..Default::default() };
        for kv in snapshot.kvs {
            cache.put(keys, kv);
        }
        cache
    }

    /// Applies one watched change; returns the topic it touched, if any.
    pub fn apply(&mut self, keys: &FleetKeys, event: WatchEvent) -> Option<String> {
        self.revision = self.revision.max(event.revision);
        match event.kind {
            WatchEventKind::Put(kv) => self.put(keys, kv),
            WatchEventKind::Delete => {
                let key = keys.parse(&event.key)?;
                let topic = match key {
                    FleetKey::Topic(t) => {
                        self.topic(&t).count = None;
                        t
                    }
                    FleetKey::Member(t, c) => {
                        self.topic(&t).members.remove(&c);
                        t
                    }
                    FleetKey::Lease(t, p) => {
                        self.topic(&t).leases.remove(&p);
                        t
                    }
                };
                Some(topic)
            }
        }
    }

    /// Names of topics whose state differs between `self` and `other` (after a re-read).
    pub fn topics_differing(&self, other: &FleetCache) -> BTreeSet<String> {
        let names: BTreeSet<&String> = self.topics.keys().chain(other.topics.keys()).collect();
        names.into_iter().filter(|t| self.topics.get(*t) != other.topics.get(*t)).cloned().collect()
    }

    fn put(&mut self, keys: &FleetKeys, kv: KeyValue) -> Option<String> {
        let key = keys.parse(&kv.key)?;
        let rev = kv.mod_revision;
        let decoded = match &key {
            FleetKey::Topic(t) => decode::<TopicRecord>(&kv.key, &kv.value).map(|r| {
                self.topic(t).count = Some(Versioned { value: r.partition_count, mod_revision: rev });
            }),
            FleetKey::Member(t, c) => decode::<MemberRecord>(&kv.key, &kv.value).map(|value| {
                self.topic(t).members.insert(c.clone(), Versioned { value, mod_revision: rev });
            }),
            FleetKey::Lease(t, p) => decode::<LeaseRecord>(&kv.key, &kv.value).map(|r| {
                self.topic(t).leases.insert(*p, Versioned { value: r.owner, mod_revision: rev });
            }),
        };
        if let Err(error) = decoded {
            // An unreadable record is skipped, not fatal: the rest of the fleet keeps working.
            tracing::warn!(%error, "ignoring unreadable fleet record");
            return None;
        }
        match key {
            FleetKey::Topic(t) | FleetKey::Member(t, _) | FleetKey::Lease(t, _) => Some(t),
        }
    }

    fn topic(&mut self, topic: &str) -> &mut FleetTopic {
        self.topics.entry(topic.to_string()).or_default()
    }
}

impl MirrorCache for FleetCache {
    type Keys = FleetKeys;

    fn prefix(keys: &FleetKeys) -> &str {
        keys.root()
    }

    fn from_snapshot(keys: &FleetKeys, snapshot: PrefixSnapshot) -> Self {
        FleetCache::from_snapshot(keys, snapshot)
    }

    fn apply(&mut self, keys: &FleetKeys, event: WatchEvent) -> Option<String> {
        FleetCache::apply(self, keys, event)
    }

    fn topics_differing(&self, other: &Self) -> BTreeSet<String> {
        FleetCache::topics_differing(self, other)
    }

    fn revision(&self) -> Revision {
        self.revision
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let keys = FleetKeys::new("/ka");
        assert_eq!(keys.root(), "/ka/fleet/");
        assert_eq!(keys.parse(&keys.topic("events")), Some(FleetKey::Topic("events".into())));
        assert_eq!(
            keys.parse(&keys.member("events", "pod-0")),
            Some(FleetKey::Member("events".into(), "pod-0".into()))
        );
        assert_eq!(keys.parse(&keys.lease("events", 7)), Some(FleetKey::Lease("events".into(), 7)));
        assert!(keys.lease("events", 7).starts_with(&keys.leases("events")));
        assert!(!keys.lease("events2", 7).starts_with(&keys.leases("events")));
        assert_eq!(keys.parse("/ka/fleet/leases/events/x"), None);
        assert_eq!(keys.parse("/ka/consumers/events/pod-0"), None);
    }
}
