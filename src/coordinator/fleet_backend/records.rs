//! The fleet backend's records and key layout.
//!
//! ```text
//! {prefix}fleet/topics/{topic}                 TopicRecord   (durable; first registration creates it)
//! {prefix}fleet/members/{topic}/{consumer}     MemberRecord  (bound to the consumer's session)
//! {prefix}fleet/leases/{topic}/{partition}     LeaseRecord   (bound to the owner's session)
//! {prefix}fleet/epochs/{topic}/{partition}     EpochRecord   (durable: the partition's highest epoch)
//! ```
//!
//! A lease is bound to the same session as its owner's member record, so the two vanish in
//! one revision when the session expires or is revoked: at every revision, every lease's
//! owner has a member record. Records are versioned JSON
//! ([`crate::coordinator::shared::records`]).

use serde::{Deserialize, Serialize};

use crate::assignment::ConsumerInfo;

/// `{prefix}fleet/members/{topic}/{consumer}`: a live registration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// Record format version.
    pub v: u32,
    /// The registration id: tells this registration from earlier and later ones of the
    /// same name. The record and the consumer's leases are bound to the lease of the
    /// instance holding the stream.
    pub session: i64,
    /// The assigner instance holding the consumer's stream.
    pub instance: String,
    /// Set by `Deregister`: the consumer takes no part in the fair share any more, and the
    /// instance holding its stream ends it and deletes the record and its leases.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leaving: bool,
    /// What placement knows of the consumer (nothing stored while all defaults).
    #[serde(default, skip_serializing_if = "ConsumerInfo::is_default")]
    pub info: ConsumerInfo,
    /// The number the registering client's process sent ([`INCARNATION_HEADER`]; 0: none),
    /// which tells a reconnect of the same process from a new incarnation of the name.
    ///
    /// [`INCARNATION_HEADER`]: crate::proto::INCARNATION_HEADER
    #[serde(default, skip_serializing_if = "crate::coordinator::shared::records::is_zero")]
    pub incarnation: u64,
}

/// `{prefix}fleet/leases/{topic}/{partition}`: the partition's owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// Record format version.
    pub v: u32,
    /// The owning consumer.
    pub owner: String,
    /// The epoch of this ownership (docs/design.md §10): one above the cache revision the
    /// claim was decided from, so above every earlier owner's. 0 in records written before
    /// epochs existed (their mod revision stands in).
    #[serde(default)]
    pub epoch: u64,
}

/// `{prefix}fleet/epochs/{topic}/{partition}`: the highest epoch the partition was ever
/// leased with (docs/design.md §10). Durable: a lease vanishes with its owner's session,
/// this record does not, so a claim decided from a cache that missed a lease claimed and
/// given back since still fails its compare on this record instead of repeating an epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochRecord {
    /// Record format version.
    pub v: u32,
    /// The highest epoch handed out for the partition.
    pub epoch: u64,
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
    /// A partition's epoch floor.
    Epoch(String, u32),
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

    /// `{prefix}fleet/epochs/{topic}/{partition}`.
    pub fn epoch(&self, topic: &str, partition: u32) -> String {
        format!("{}epochs/{topic}/{partition}", self.root)
    }

    /// `{prefix}fleet/epochs/{topic}/`: the topic's epoch floors.
    pub fn epochs(&self, topic: &str) -> String {
        format!("{}epochs/{topic}/", self.root)
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
            "epochs" => {
                let (topic, partition) = rest.split_once('/')?;
                Some(FleetKey::Epoch(topic.to_string(), partition.parse().ok()?))
            }
            _ => None,
        }
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
        assert_eq!(keys.parse(&keys.epoch("events", 7)), Some(FleetKey::Epoch("events".into(), 7)));
        assert!(keys.epoch("events", 7).starts_with(&keys.epochs("events")));
        assert_eq!(keys.parse("/ka/fleet/leases/events/x"), None);
        assert_eq!(keys.parse("/ka/consumers/events/pod-0"), None);
    }
}
