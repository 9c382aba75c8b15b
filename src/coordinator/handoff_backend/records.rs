//! The stored records and their key layout (docs/design.md §3).
//!
//! ```text
//! {prefix}topics/{topic}                   TopicRecord
//! {prefix}consumers/{topic}/{consumer}     ConsumerRecord   (bound to the consumer's session)
//! {prefix}assignments/{topic}/{partition}  AssignmentRecord (durable)
//! {prefix}handoffs/{topic}/{partition}     HandoffRecord    (durable)
//! {prefix}leader                           the elected instance (bound to its session)
//! {prefix}leaders/{groups}/{group}         with --leader-groups > 1: a group's leader (same)
//! {prefix}instances/{instance}             the instance's own record (bound to its lease)
//! ```
//!
//! Records are versioned JSON ([`crate::coordinator::shared::records`]).

use serde::{Deserialize, Serialize};

use crate::assignment::ConsumerInfo;
pub use crate::coordinator::shared::records::{RECORD_VERSION, TopicRecord, decode, encode};
use crate::handoff::{ConsumerStatus, Handoff, Millis, Write};
use crate::store::Op;

use super::leader_groups::LeaderGroup;

/// `{prefix}consumers/{topic}/{consumer}`: a live registration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerRecord {
    /// Record format version.
    pub v: u32,
    /// Active or draining.
    pub status: ConsumerStatus,
    /// The session (etcd lease) the record is bound to; identifies the current stream.
    pub session: i64,
    /// The assigner instance holding the consumer's stream.
    pub instance: String,
    /// Set by a `SHUTDOWN_NOW` deregistration: the holding instance keeps the session
    /// (and so the partitions) alive until this time, waiting for the consumer's return.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_until: Option<Millis>,
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

/// `{prefix}assignments/{topic}/{partition}`: the partition's owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignmentRecord {
    /// Record format version.
    pub v: u32,
    /// The owning consumer.
    pub owner: String,
    /// The epoch of this ownership (docs/design.md §10). 0 in records written before
    /// epochs existed (the record's mod revision stands in).
    #[serde(default)]
    pub epoch: u64,
}

/// `{prefix}handoffs/{topic}/{partition}`: a handoff in flight.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffRecord {
    /// Record format version.
    pub v: u32,
    /// The handoff.
    #[serde(flatten)]
    pub handoff: Handoff,
}

/// A parsed key under the prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Key {
    /// A topic config.
    Topic(String),
    /// A consumer registration.
    Consumer(String, String),
    /// A partition's owner.
    Assignment(String, u32),
    /// A partition's handoff.
    Handoff(String, u32),
    /// A leader election key: of the only group, or of one group of several.
    Leader(LeaderGroup),
    /// An instance's own record ([`crate::coordinator::shared::instance_record`]).
    Instance(String),
}

/// Builds and parses keys under one prefix.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys under `prefix` (a trailing `/` is added when missing).
    pub fn new(prefix: &str) -> Self {
        let mut prefix = prefix.to_string();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        Self { prefix }
    }

    /// The prefix itself (everything the assigner stores lives under it).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `{prefix}topics/{topic}`.
    pub fn topic(&self, topic: &str) -> String {
        format!("{}topics/{topic}", self.prefix)
    }

    /// `{prefix}consumers/{topic}/{consumer}`.
    pub fn consumer(&self, topic: &str, consumer: &str) -> String {
        format!("{}consumers/{topic}/{consumer}", self.prefix)
    }

    /// `{prefix}assignments/{topic}/{partition}`.
    pub fn assignment(&self, topic: &str, partition: u32) -> String {
        format!("{}assignments/{topic}/{partition}", self.prefix)
    }

    /// `{prefix}handoffs/{topic}/{partition}`.
    pub fn handoff(&self, topic: &str, partition: u32) -> String {
        format!("{}handoffs/{topic}/{partition}", self.prefix)
    }

    /// `{prefix}assignments/{topic}/`: the topic's owners.
    pub fn assignments(&self, topic: &str) -> String {
        format!("{}assignments/{topic}/", self.prefix)
    }

    /// `{prefix}handoffs/{topic}/`: the topic's handoffs.
    pub fn handoffs(&self, topic: &str) -> String {
        format!("{}handoffs/{topic}/", self.prefix)
    }

    /// The leader key of `group`: `{prefix}leader` when the topics are not split,
    /// `{prefix}leaders/{groups}/{group}` otherwise. The group count is in the key, so
    /// instances configured with different counts never share a key (and see each other's:
    /// [`super::leader_groups`]).
    pub fn leader(&self, group: LeaderGroup) -> String {
        if group.groups <= 1 {
            format!("{}leader", self.prefix)
        } else {
            format!("{}leaders/{}/{}", self.prefix, group.groups, group.group)
        }
    }

    /// The operations that make `writes` (the handoff machine's) on `topic`.
    pub fn write_ops(&self, topic: &str, writes: &[Write]) -> Vec<Op> {
        writes
            .iter()
            .map(|w| match w {
                Write::SetOwner { partition, owner, epoch } => Op::put(
                    self.assignment(topic, *partition),
                    encode(&AssignmentRecord { v: RECORD_VERSION, owner: owner.clone(), epoch: *epoch }),
                ),
                Write::ClearOwner { partition } => Op::delete(self.assignment(topic, *partition)),
                Write::PutHandoff { partition, handoff } => Op::put(
                    self.handoff(topic, *partition),
                    encode(&HandoffRecord { v: RECORD_VERSION, handoff: handoff.clone() }),
                ),
                Write::DeleteHandoff { partition } => Op::delete(self.handoff(topic, *partition)),
            })
            .collect()
    }

    /// Parses a key under the prefix; `None` for anything else.
    pub fn parse(&self, key: &str) -> Option<Key> {
        let rest = key.strip_prefix(&self.prefix)?;
        if rest == "leader" {
            return Some(Key::Leader(LeaderGroup::ONLY));
        }
        let (kind, rest) = rest.split_once('/')?;
        match kind {
            "topics" => Some(Key::Topic(rest.to_string())),
            "instances" => Some(Key::Instance(rest.to_string())),
            "leaders" => {
                let (groups, group) = rest.split_once('/')?;
                let group = LeaderGroup { groups: groups.parse().ok()?, group: group.parse().ok()? };
                (group.groups > 1 && group.group < group.groups).then_some(Key::Leader(group))
            }
            "consumers" => {
                let (topic, consumer) = rest.split_once('/')?;
                Some(Key::Consumer(topic.to_string(), consumer.to_string()))
            }
            "assignments" | "handoffs" => {
                let (topic, partition) = rest.split_once('/')?;
                let partition = partition.parse().ok()?;
                Some(if kind == "handoffs" {
                    Key::Handoff(topic.to_string(), partition)
                } else {
                    Key::Assignment(topic.to_string(), partition)
                })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handoff::Phase;
    use crate::store::{Malformed, StoreError};

    #[test]
    fn keys_round_trip() {
        let keys = Keys::new("/ka");
        for key in [
            Key::Topic("events".into()),
            Key::Consumer("events".into(), "pod-0".into()),
            Key::Assignment("events".into(), 7),
            Key::Handoff("events".into(), 3),
            Key::Leader(LeaderGroup::ONLY),
            Key::Leader(LeaderGroup { groups: 8, group: 5 }),
            Key::Instance("i-1".into()),
        ] {
            let text = match &key {
                Key::Topic(t) => keys.topic(t),
                Key::Consumer(t, c) => keys.consumer(t, c),
                Key::Assignment(t, p) => keys.assignment(t, *p),
                Key::Handoff(t, p) => keys.handoff(t, *p),
                Key::Leader(group) => keys.leader(*group),
                Key::Instance(i) => {
                    crate::coordinator::shared::instance_record::instance_key(keys.prefix(), i)
                }
            };
            assert_eq!(keys.parse(&text), Some(key));
        }
        assert_eq!(keys.parse("/other/leader"), None);
        assert_eq!(keys.parse("/ka/leaders/8/8"), None);
        assert_eq!(keys.parse("/ka/leaders/1/0"), None);
        assert_eq!(keys.parse("/ka/assignments/events/x"), None);
    }

    #[test]
    fn records_are_versioned() {
        let h = HandoffRecord {
            v: RECORD_VERSION,
            handoff: Handoff { from: "a".into(), to: "b".into(), phase: Phase::Warming, since: 5, epoch: 0 },
        };
        let bytes = encode(&h);
        assert_eq!(decode::<HandoffRecord>("k", &bytes).unwrap(), h);
        let newer = br#"{"v":99,"owner":"a"}"#;
        let err = decode::<AssignmentRecord>("k", newer).unwrap_err();
        let newer = matches!(&err, StoreError::Invalid(Malformed::NewerRecord { version: 99, .. }));
        assert!(newer, "{err}");
        let garbage = decode::<AssignmentRecord>("k", b"garbage").unwrap_err();
        assert!(matches!(garbage, StoreError::Invalid(Malformed::Undecodable { .. })), "{garbage}");
    }
}
