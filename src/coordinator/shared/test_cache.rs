//! A minimal cache for the shared pieces' unit tests: the raw records under a prefix, a
//! registration being one record.

use std::collections::{BTreeMap, BTreeSet};

use super::mirror::{Changes, MirrorCache};
use super::records::{TopicRecord, decode};
use crate::store::{KeyValue, Revision};

/// The prefix everything lives under.
pub const PREFIX: &str = "/t/";

/// Every record under [`PREFIX`]: `{prefix}{topic}/...`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Records {
    pub revision: Revision,
    pub kvs: BTreeMap<String, KeyValue>,
}

fn topic_of(key: &str) -> Option<String> {
    key.strip_prefix(PREFIX)?.split('/').next().map(str::to_string)
}

impl MirrorCache for Records {
    type Keys = ();

    fn put(&mut self, _: &(), kv: KeyValue, changes: &mut Changes) {
        if let Some(topic) = topic_of(&kv.key) {
            changes.topic(&topic);
        }
        self.kvs.insert(kv.key.clone(), kv);
    }

    fn delete(&mut self, _: &(), key: &str, changes: &mut Changes) {
        self.kvs.remove(key);
        if let Some(topic) = topic_of(key) {
            changes.topic(&topic);
        }
    }

    fn differing(&self, other: &Self) -> Changes {
        let keys: BTreeSet<&String> = self.kvs.keys().chain(other.kvs.keys()).collect();
        let mut changes = Changes::default();
        for key in keys.into_iter().filter(|k| self.kvs.get(*k) != other.kvs.get(*k)) {
            if let Some(topic) = topic_of(key) {
                changes.topic(&topic);
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

    fn mod_revision(&self, _: &(), key: &str) -> Option<Revision> {
        Some(self.kvs.get(key).map_or(0, |kv| kv.mod_revision))
    }

    fn topic_count(&self, topic: &str) -> Option<(u32, Revision)> {
        let kv = self.kvs.get(&format!("{PREFIX}{topic}/config"))?;
        let record = decode::<TopicRecord>(&kv.key, &kv.value).ok()?;
        Some((record.partition_count, kv.mod_revision))
    }

    fn stored_topics(&self) -> Vec<(String, u32)> {
        let topics: BTreeSet<String> = self.kvs.keys().filter_map(|key| topic_of(key)).collect();
        topics.into_iter().filter_map(|t| Some((t.clone(), self.topic_count(&t)?.0))).collect()
    }
}

/// The registration key of `consumer` on `topic`.
pub fn registration(topic: &str, consumer: &str) -> String {
    format!("{PREFIX}{topic}/consumers/{consumer}")
}
