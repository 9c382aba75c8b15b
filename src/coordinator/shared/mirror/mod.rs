//! A cache kept equal to a store prefix, shared by the store-backed coordinators.
//!
//! The mirror loads a snapshot of the prefix; its [`Follower`] then follows a prefix watch
//! from the snapshot's revision + 1. Events that are ready together (one revision at least)
//! are applied before the follower hands their [`Changes`] to the backend, so a consumer
//! never sees part of a transaction. On a watch error, and every resync interval as a
//! safety net, it re-reads the whole prefix and hands over only the topics that differ:
//! nothing is missed across the gap.
//!
//! The mirror never calls the backend: the backend's own loop asks the follower for the
//! next changes, reads the cache, tells its consumers, and then [`Mirror::announce`]s the
//! revision to whoever waits for it. What the cache holds, and what the consumers are told,
//! is the backend's business ([`MirrorCache`]).

mod follower;
mod own;

pub use follower::{Follower, silence_bound};
pub use own::{OwnFit, apply_ahead, apply_watched, own_batch, own_write_fits, snapshot_regresses};

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Mutex, RwLock, RwLockReadGuard,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::store::{
    Compare, KeyValue, LeaseStore, Op, PrefixSnapshot, Revision, StoreError, WatchBatch, WatchEvent,
    WatchEventKind,
};

/// How many of its own writes a mirror keeps waiting for their turn; older ones are
/// dropped (the watch delivers them anyway).
const OWN_WRITES_KEPT: usize = 256;

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

    /// The touched topics.
    #[cfg(test)]
    pub fn topics(&self) -> BTreeSet<String> {
        self.0.keys().cloned().collect()
    }

    /// Per topic, what was touched.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Touched)> {
        self.0.iter()
    }
}

/// The in-memory copy of a store prefix that a [`Mirror`] keeps up to date.
pub trait MirrorCache: Sized + Default {
    /// What parses the keys under the prefix.
    type Keys: Send + Sync + 'static;

    /// The prefix this cache mirrors.
    fn prefix(keys: &Self::Keys) -> &str;

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

    /// The key of `topic`'s record (its partition count).
    fn topic_key(keys: &Self::Keys, topic: &str) -> String;

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

/// Where a [`Mirror`] follows the store from, and when it stops.
pub struct Source<'a, K> {
    /// The store.
    pub store: &'a dyn LeaseStore,
    /// The keys of the mirrored prefix.
    pub keys: &'a K,
    /// How often the whole prefix is re-read as a safety net.
    pub resync_interval: Duration,
    /// How long a watch of a store that sends progress marks
    /// ([`LeaseStore::watch_progress_every`]) may send nothing at all before the mirror
    /// counts itself stale: the fence's margin, three quarters of the session TTL.
    pub stale_after: Duration,
    /// Cancelled when the instance shuts down.
    pub shutdown: &'a CancellationToken,
}

/// Whether the mirror follows the store, and how often its view was interrupted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MirrorHealth {
    /// Whether the last read or watch of the store worked.
    pub following: bool,
    /// How many times the watch broke (each one a gap in the view, closed by a re-read).
    pub interruptions: u64,
    /// When the mirror last heard from a watch that then went silent (no event, no
    /// progress mark, no error: a hung connection), while it does not follow for that
    /// reason. The store may have changed from then on, so the fence counts from then.
    pub silent_since: Option<tokio::time::Instant>,
}

/// A cache kept equal to a store prefix, and the channel that announces its revisions.
pub struct Mirror<C> {
    /// The store's state as last seen by the follower (or this instance's own writes).
    cache: RwLock<C>,
    /// The cache revision whose changes the consumers were told ([`Mirror::announce`]).
    changed: watch::Sender<Revision>,
    /// Names this mirror in its logs.
    name: &'static str,
    /// Whether it follows the store.
    health: watch::Sender<MirrorHealth>,
    /// This instance's own committed writes, by revision, waiting to be applied ahead of
    /// their watch delivery ([`Mirror::offer`]).
    own: Mutex<BTreeMap<Revision, Vec<WatchEvent>>>,
    /// Wakes the follower when an own write is offered.
    own_offered: Notify,
    /// The newest own write applied ahead of revisions the cache has not seen yet
    /// ([`Mirror::apply_own_now`]); `0` if none. Written under the cache's write lock.
    ahead: AtomicI64,
}

impl<C: MirrorCache> Mirror<C> {
    /// A mirror holding a fresh snapshot of the prefix; fails if the store cannot be read.
    pub async fn load(
        store: &dyn LeaseStore,
        keys: &C::Keys,
        name: &'static str,
    ) -> Result<Self, StoreError> {
        let snapshot = store.get_prefix(C::prefix(keys)).await?;
        let cache = C::from_snapshot(keys, snapshot);
        let (changed, _) = watch::channel(cache.revision());
        let health =
            watch::Sender::new(MirrorHealth { following: true, interruptions: 0, silent_since: None });
        Ok(Self {
            cache: RwLock::new(cache),
            changed,
            name,
            health,
            own: Mutex::new(BTreeMap::new()),
            own_offered: Notify::new(),
            ahead: AtomicI64::new(0),
        })
    }

    /// Offers a write this instance committed, so the cache and the consumers need not
    /// wait for the watch to bring it back (docs/design.md §9). The [`Follower`] applies it
    /// as soon as the cache is at the revision just before it, which proves
    /// that nothing else happened in between; otherwise the watch delivers it as usual,
    /// and the watch's own copy of an applied revision is skipped. `batch` must hold every
    /// change of its revision under the prefix, as the watch would deliver them.
    pub fn offer(&self, batch: WatchBatch) {
        if batch.revision <= self.read().revision() {
            return;
        }
        let mut own = self.own.lock().unwrap_or_else(|p| p.into_inner());
        own.insert(batch.revision, batch.events);
        while own.len() > OWN_WRITES_KEPT {
            own.pop_first();
        }
        drop(own);
        self.own_offered.notify_one();
    }

    /// Applies `ops`, which this instance committed at `revision` with `compares`, at once
    /// if nothing else happened in between, and returns what changed for the caller to tell
    /// its consumers ([`Self::apply_own_now`]); offers them otherwise. See [`own_batch`] for
    /// which records may be given.
    pub fn apply_own_write(
        &self,
        keys: &C::Keys,
        revision: Revision,
        ops: &[Op],
        compares: &[Compare],
    ) -> Option<Changes> {
        let batch = own_batch(C::prefix(keys), revision, ops)?;
        self.apply_own_now(keys, batch, compares)
    }

    /// Applies a write this instance committed right away, in the task that committed it, and
    /// returns what it changed, for the caller to tell its consumers and then
    /// [`announce`](Self::announce): the fast path of a handoff, with no task between the
    /// commit and the streams (docs/design.md §9). It applies when the cache is at the
    /// revision just before it (nothing else happened in between), or **ahead** of revisions
    /// the cache has not seen, when `compares` (the transaction's) held every key it writes
    /// at the mod revision the cache holds: those keys did not change in between, so the
    /// write lands on exactly what the cache has, and what the unseen revisions changed are
    /// other keys, which the watch brings later (a shared etcd's other writers make such
    /// gaps the rule, not the exception). The cache's [`revision`](MirrorCache::revision)
    /// stays where the watch is. Otherwise it is offered ([`Self::offer`]), the follower
    /// applies it in turn, and `None` is returned.
    pub fn apply_own_now(&self, keys: &C::Keys, batch: WatchBatch, compares: &[Compare]) -> Option<Changes> {
        let mut changes = Changes::default();
        let mut cache = self.cache.write().unwrap_or_else(|p| p.into_inner());
        let revision = batch.revision;
        match own_write_fits(&*cache, keys, &batch, compares) {
            OwnFit::InTurn => {
                // Like a watched revision: a writer of a shared batch may come after another
                // applied it ahead and a newer write followed on its keys.
                self.apply_revision(&mut cache, keys, revision, batch.events, &mut changes);
                // Own writes offered meanwhile that now follow without a gap.
                self.apply_own(&mut cache, keys, &mut changes);
                Some(changes)
            }
            OwnFit::Ahead => {
                apply_ahead(&mut *cache, keys, batch, &mut changes);
                self.ahead.fetch_max(revision, Ordering::SeqCst);
                Some(changes)
            }
            OwnFit::Later => {
                drop(cache);
                self.offer(batch);
                None
            }
        }
    }

    /// Applies the offered own writes that follow the cache's revision without a gap,
    /// and forgets those the cache already has.
    fn apply_own(&self, cache: &mut C, keys: &C::Keys, changes: &mut Changes) {
        let mut own = self.own.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(entry) = own.first_entry() {
            let revision = *entry.key();
            if revision <= cache.revision() {
                entry.remove();
            } else if revision == cache.revision() + 1 {
                self.apply_revision(cache, keys, revision, entry.remove(), changes);
            } else {
                break;
            }
        }
    }

    /// Applies the changes of one revision after the cache's, as the watch delivers them
    /// (or an own write offered for its turn), and moves the cache to that revision. A key
    /// an own write changed ahead of the watch ([`Self::apply_own_now`]) may hold this
    /// revision's record or a newer one already: that change is skipped, so the cache never
    /// goes back.
    fn apply_revision(
        &self,
        cache: &mut C,
        keys: &C::Keys,
        revision: Revision,
        events: Vec<WatchEvent>,
        changes: &mut Changes,
    ) {
        apply_watched(cache, keys, revision, events, self.ahead.load(Ordering::SeqCst), changes);
    }

    /// The newest revision the cache holds a change of: its revision, or an own write
    /// applied ahead of it. A re-read older than this would take the consumers back.
    #[cfg(test)]
    fn newest(&self, cache: &C) -> Revision {
        cache.revision().max(self.ahead.load(Ordering::SeqCst))
    }

    /// Whether a snapshot read at `snapshot` is older than `cache` (with the own writes
    /// applied ahead of it): see [`snapshot_regresses`].
    fn regresses(&self, snapshot: Revision, cache: &C) -> bool {
        snapshot_regresses(snapshot, cache.revision(), self.ahead.load(Ordering::SeqCst))
    }

    /// Reads the cache. A poisoned lock still holds a whole cache (writers replace or
    /// apply whole events), so it is used as it is.
    pub fn read(&self) -> RwLockReadGuard<'_, C> {
        self.cache.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A receiver of the mirror's health.
    pub fn health(&self) -> watch::Receiver<MirrorHealth> {
        self.health.subscribe()
    }

    fn set_following(&self, following: bool, interrupted: bool) {
        self.health.send_if_modified(|h| {
            let before = *h;
            h.following = following;
            h.interruptions += u64::from(interrupted);
            h.silent_since = None;
            *h != before
        });
    }

    /// The watch has said nothing since `heard`: the mirror does not follow the store.
    fn set_silent(&self, heard: tokio::time::Instant) {
        self.health.send_if_modified(|h| {
            let before = *h;
            h.following = false;
            h.silent_since = Some(heard);
            *h != before
        });
    }

    /// A receiver woken after every announced revision.
    pub fn subscribe(&self) -> watch::Receiver<Revision> {
        self.changed.subscribe()
    }

    /// Follows the store from the cache's revision ([`Follower`]).
    pub fn follower<'a>(&'a self, source: Source<'a, C::Keys>) -> Follower<'a, C> {
        Follower::new(self, source)
    }

    /// Announces the revision of `cache` (a read of this mirror) to
    /// [`subscribe`](Self::subscribe)rs, once the consumers were told what it changed. Called
    /// with the read still held, so the announced revision never goes back: a cache update
    /// (the follower's, or [`Self::apply_own_now`]) waits for that read to end.
    pub fn announce(&self, cache: &C) {
        self.changed.send_replace(cache.revision());
    }
}

#[cfg(test)]
mod tests;
