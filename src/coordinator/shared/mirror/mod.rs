//! A cache kept equal to a store prefix, as both machines keep theirs ([`MirrorCache`]):
//! loaded from a snapshot of the prefix, then following a prefix watch from the snapshot's
//! revision + 1, a whole revision at a time, so a consumer never sees part of a
//! transaction; on a watch error, and every resync interval as a safety net, re-read whole
//! ([`reread_changes`]: nothing is missed across the gap). Each revision applied says what
//! it changed ([`Changes`]), so the relay compares only what may differ. [`own`] applies an
//! instance's own writes ahead of the watch where that is safe (pure).

mod own;

pub use own::{OwnFit, apply_ahead, apply_watched, own_batch, own_write_fits, snapshot_regresses};

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use crate::store::{KeyValue, PrefixSnapshot, Revision, WatchEvent, WatchEventKind};

/// A record and the revision it was last written at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned<T> {
    /// The record.
    pub value: T,
    /// Its mod revision.
    pub mod_revision: Revision,
}

/// Who one applied batch concerns, per topic: only the consumers whose view it may have
/// changed (a record names them: owner, handoff source and target, the registration), or
/// the whole topic. It is what keeps the relay's work proportional to the change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes(BTreeMap<String, Touched>);

/// What a batch touched in one topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Touched {
    /// Every consumer of the topic (a re-read, a topic record).
    All,
    /// These consumers, each with what of its view the batch may have changed.
    Consumers(BTreeMap<String, Scope>),
}

/// What of one consumer's view a batch may have changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Anything: a record of the consumer itself changed.
    Whole,
    /// Only its part in these partitions (their owner or handoff records changed): the
    /// relay may compare that part alone, so its work follows the change, not the
    /// consumer's partitions.
    Partitions(BTreeSet<u32>),
}

impl Changes {
    /// Marks the whole topic.
    pub fn topic(&mut self, topic: &str) {
        self.0.insert(topic.to_string(), Touched::All);
    }

    /// Marks these consumers of `topic` as wholly touched.
    pub fn consumers<'a>(&mut self, topic: &str, names: impl IntoIterator<Item = &'a str>) {
        if let Some(touched) = self.touched(topic) {
            for name in names {
                touched.insert(name.to_string(), Scope::Whole);
            }
        }
    }

    /// Marks `partition` of `topic` as touched for these consumers.
    pub fn partition<'a>(&mut self, topic: &str, names: impl IntoIterator<Item = &'a str>, partition: u32) {
        if let Some(touched) = self.touched(topic) {
            for name in names {
                let scope =
                    touched.entry(name.to_string()).or_insert_with(|| Scope::Partitions(BTreeSet::new()));
                if let Scope::Partitions(partitions) = scope {
                    partitions.insert(partition);
                }
            }
        }
    }

    /// The consumers touched in `topic`, to add to; `None` when the whole topic is.
    fn touched(&mut self, topic: &str) -> Option<&mut BTreeMap<String, Scope>> {
        let touched = self.0.entry(topic.to_string()).or_insert_with(|| Touched::Consumers(BTreeMap::new()));
        match touched {
            Touched::Consumers(names) => Some(names),
            Touched::All => None,
        }
    }

    /// What of `consumer`'s view in `topic` may have changed (`Whole` when the whole topic
    /// was touched, or nothing of the consumer: a caller asks only for touched ones).
    pub fn scope(&self, topic: &str, consumer: &str) -> &Scope {
        match self.0.get(topic) {
            Some(Touched::Consumers(names)) => names.get(consumer).unwrap_or(&Scope::Whole),
            _ => &Scope::Whole,
        }
    }

    /// Per topic, what was touched.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Touched)> {
        self.0.iter()
    }
}

/// The in-memory copy of a store prefix that an instance keeps up to date.
pub trait MirrorCache: Sized + Default {
    /// What parses the keys under the prefix.
    type Keys: Send + Sync + 'static;

    /// Takes in the record `kv` (written or rewritten), noting in `changes` whose view it
    /// may have changed. A key the cache does not know, or a record it cannot read, is
    /// skipped: the rest keeps working.
    fn put(&mut self, keys: &Self::Keys, kv: KeyValue, changes: &mut Changes);

    /// Forgets the record at `key` (deleted), noting in `changes` whose view it may have
    /// changed.
    fn delete(&mut self, keys: &Self::Keys, key: &str, changes: &mut Changes);

    /// A cache holding exactly `snapshot`.
    fn from_snapshot(keys: &Self::Keys, snapshot: PrefixSnapshot) -> Self {
        let mut cache = Self::default();
        cache.set_revision(snapshot.revision);
        let mut ignored = Changes::default();
        for kv in snapshot.kvs {
            cache.put(keys, kv, &mut ignored);
        }
        cache
    }

    /// Applies one watched change, noting in `changes` whose view it may have changed.
    fn apply(&mut self, keys: &Self::Keys, event: WatchEvent, changes: &mut Changes) {
        self.set_revision(self.revision().max(event.revision));
        match event.kind {
            WatchEventKind::Put(kv) => self.put(keys, kv, changes),
            WatchEventKind::Delete => self.delete(keys, &event.key, changes),
        }
    }

    /// The topics whose state differs between `self` and `other` (after a re-read), as
    /// whole topics: their consumers must hear about it.
    fn differing(&self, other: &Self) -> Changes;

    /// Carries into `fresh`, a re-read's snapshot about to replace this cache, what a
    /// snapshot cannot know: what this cache counted of the changes it followed (nothing,
    /// unless a backend keeps such counts).
    fn carry_over(&self, _fresh: &mut Self) {}

    /// The store revision this cache reflects: every change under the prefix up to it is
    /// applied (own writes applied ahead, [`Mirror::apply_own_now`], may be newer).
    fn revision(&self) -> Revision;

    /// Sets [`revision`](Self::revision): after an own write was applied ahead of unseen
    /// revisions (it goes back to where the watch is), or after a watched revision whose
    /// every change the cache held already.
    fn set_revision(&mut self, revision: Revision);

    /// The mod revision of the record at `key` as cached (`0`: no record), or `None` for a
    /// key whose record this cache does not version: a write of such a key is never applied
    /// ahead of the revisions before it. The default versions nothing.
    fn mod_revision(&self, keys: &Self::Keys, key: &str) -> Option<Revision> {
        let _ = (keys, key);
        None
    }

    /// The stored partition count of `topic` and its record's mod revision.
    fn topic_count(&self, topic: &str) -> Option<(u32, Revision)>;

    /// Every topic with a stored partition count, and the count.
    fn stored_topics(&self) -> Vec<(String, u32)>;
}

/// What a re-read changed for the streams, `old` being the cache it replaces: every topic
/// the snapshot stores, as a whole, not only those whose records differ. A registration
/// written and lost again between the two views (its session revoked before the watch
/// delivered it) leaves no trace in either, yet its stream was admitted before its record
/// was seen and waits for it: relayed, it is found lost and written again, where a relay of
/// the differing topics alone would leave it waiting for good.
pub fn reread_changes<C: MirrorCache>(old: &C, fresh: &C) -> Changes {
    let mut changes = old.differing(fresh);
    for (topic, _) in fresh.stored_topics() {
        changes.topic(&topic);
    }
    changes
}

/// How long a watch whose store sends a progress mark every `every` may say nothing at
/// all before an instance counts its cache stale (pure): `stale_after` (three quarters of
/// the TTL), but never less than two marks' worth, whatever the TTL.
pub fn silence_bound(stale_after: Duration, every: Duration) -> Duration {
    stale_after.max(every * 2)
}
