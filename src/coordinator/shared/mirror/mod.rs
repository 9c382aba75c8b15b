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

pub use follower::Follower;

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

/// What the watch will deliver for a transaction of `ops` that this instance committed at
/// `revision`: its changes under `prefix`, to [`Mirror::offer`]. `None` without a put: a
/// transaction of deletes alone may change nothing, and then `revision` is not its own.
///
/// A put's `create_revision` is unknown when the key existed before, so it is set to
/// `revision`: offer only records whose cache reads the mod revision alone.
pub fn own_batch(prefix: &str, revision: Revision, ops: &[Op]) -> Option<WatchBatch> {
    if !ops.iter().any(|op| matches!(op, Op::Put { .. })) {
        return None;
    }
    let events = ops
        .iter()
        .filter_map(|op| {
            let (key, kind) = match op {
                Op::Put { key, value, session } => {
                    let kv = KeyValue {
                        key: key.clone(),
                        value: value.clone(),
                        create_revision: revision,
                        mod_revision: revision,
                        session: *session,
                    };
                    (key, WatchEventKind::Put(kv))
                }
                Op::Delete { key } => (key, WatchEventKind::Delete),
            };
            key.starts_with(prefix).then(|| WatchEvent { key: key.clone(), revision, kind })
        })
        .collect::<Vec<_>>();
    (!events.is_empty()).then_some(WatchBatch { revision, events })
}

/// Whether `compares` hold every key `batch` writes at the mod revision `cache` holds for
/// it: then nothing changed those keys between the cache and the batch's revision.
fn writes_as_compared<C: MirrorCache>(
    cache: &C,
    keys: &C::Keys,
    batch: &WatchBatch,
    compares: &[Compare],
) -> bool {
    batch.events.iter().all(|event| {
        let Some(cached) = cache.mod_revision(keys, &event.key) else { return false };
        compares.iter().any(|c| matches!(c, Compare::ModRevision(k, r) if *k == event.key && *r == cached))
    })
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
pub trait MirrorCache: Sized {
    /// What parses the keys under the prefix.
    type Keys: Send + Sync + 'static;

    /// The prefix this cache mirrors.
    fn prefix(keys: &Self::Keys) -> &str;

    /// A cache holding exactly `snapshot`.
    fn from_snapshot(keys: &Self::Keys, snapshot: PrefixSnapshot) -> Self;

    /// Applies one watched change, noting in `changes` whose view it may have changed.
    fn apply(&mut self, keys: &Self::Keys, event: WatchEvent, changes: &mut Changes);

    /// The topics whose state differs between `self` and `other` (after a re-read), as
    /// whole topics: their consumers must hear about it.
    fn differing(&self, other: &Self) -> Changes;

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

/// Where a [`Mirror`] follows the store from, and when it stops.
pub struct Source<'a, K> {
    /// The store.
    pub store: &'a dyn LeaseStore,
    /// The keys of the mirrored prefix.
    pub keys: &'a K,
    /// How often the whole prefix is re-read as a safety net.
    pub resync_interval: Duration,
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
        let health = watch::Sender::new(MirrorHealth { following: true, interruptions: 0 });
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

    /// Applies a write this instance committed right away, in the committing task, and
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
        if revision == cache.revision() + 1 {
            for event in batch.events {
                cache.apply(keys, event, &mut changes);
            }
            // Own writes offered meanwhile that now follow without a gap.
            self.apply_own(&mut cache, keys, &mut changes);
            return Some(changes);
        }
        if revision > cache.revision() && writes_as_compared(&*cache, keys, &batch, compares) {
            let watched = cache.revision();
            for event in batch.events {
                cache.apply(keys, event, &mut changes);
            }
            cache.set_revision(watched);
            self.ahead.fetch_max(revision, Ordering::SeqCst);
            return Some(changes);
        }
        drop(cache);
        self.offer(batch);
        None
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
        let ahead = self.ahead.load(Ordering::SeqCst) >= revision;
        for event in events {
            if ahead && cache.mod_revision(keys, &event.key).is_some_and(|held| held >= revision) {
                continue;
            }
            cache.apply(keys, event, changes);
        }
        cache.set_revision(cache.revision().max(revision));
    }

    /// The newest revision the cache holds a change of: its revision, or an own write
    /// applied ahead of it. A re-read older than this would take the consumers back.
    fn newest(&self, cache: &C) -> Revision {
        cache.revision().max(self.ahead.load(Ordering::SeqCst))
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
mod tests {
    use std::{
        collections::BTreeSet,
        sync::{Arc, Mutex},
        time::Duration,
    };

    use tokio_util::sync::CancellationToken;

    use super::{Mirror, Source};
    use crate::coordinator::shared::test_backend::{PREFIX, Records};
    use crate::store::{LeaseStore, MemoryStore};

    /// Runs a mirror of [`PREFIX`] over `store`, recording the topics of every relay call.
    fn run(
        store: MemoryStore,
        mirror: Arc<Mirror<Records>>,
        resync: Duration,
    ) -> (Arc<Mutex<Vec<BTreeSet<String>>>>, CancellationToken) {
        let relayed = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let (seen, token) = (relayed.clone(), stop.clone());
        tokio::spawn(async move {
            let source = Source { store: &store, keys: &(), resync_interval: resync, shutdown: &token };
            let mut follower = mirror.follower(source);
            while let Some(changes) = follower.next().await {
                let cache = mirror.read();
                seen.lock().expect("lock").push(changes.topics());
                mirror.announce(&cache);
            }
        });
        (relayed, stop)
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn follows_the_store_and_relays_whole_revisions() {
        let store = MemoryStore::new();
        let mirror = Arc::new(Mirror::<Records>::load(&store, &(), "test").await.expect("loads"));
        let (relayed, stop) = run(store.clone(), mirror.clone(), Duration::from_secs(300));
        let txn = crate::store::Txn::new()
            .then(crate::store::Op::put(format!("{PREFIX}a/x"), "1"))
            .then(crate::store::Op::put(format!("{PREFIX}b/x"), "2"));
        let revision = store.txn(txn).await.expect("written").revision;
        settle().await;
        assert_eq!(mirror.read().revision, revision);
        assert_eq!(mirror.read().kvs.len(), 2, "both keys of the transaction");
        let relayed = relayed.lock().expect("lock").clone();
        assert!(relayed.iter().any(|t| t.contains("a") && t.contains("b")), "{relayed:?}");
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_cannot_resume_re_reads_and_relays_what_differs() {
        let store = MemoryStore::new();
        store.put(&format!("{PREFIX}a/x"), b"1".to_vec(), None).await.expect("written");
        let mirror = Arc::new(Mirror::<Records>::load(&store, &(), "test").await.expect("loads"));
        // Changes, then history compacted past them, before the mirror starts watching:
        // its watch from the snapshot's revision fails and it must re-read.
        store.put(&format!("{PREFIX}b/x"), b"2".to_vec(), None).await.expect("written");
        store.put(&format!("{PREFIX}b/y"), b"3".to_vec(), None).await.expect("written");
        store.compact(store.revision()).await.expect("compacted");
        let (relayed, stop) = run(store.clone(), mirror.clone(), Duration::from_secs(300));
        settle().await;
        assert_eq!(mirror.read().revision, store.revision(), "caught up by the re-read");
        assert_eq!(mirror.read().kvs.len(), 3);
        let relayed = relayed.lock().expect("lock").clone();
        assert_eq!(relayed.first(), Some(&BTreeSet::from(["b".to_string()])), "only the topic that changed");
        // And it follows the store again afterwards.
        store.put(&format!("{PREFIX}c/x"), b"4".to_vec(), None).await.expect("written");
        settle().await;
        assert_eq!(mirror.read().kvs.len(), 4);
        stop.cancel();
    }

    fn own_put(revision: crate::store::Revision, key: &str, value: &str) -> crate::store::WatchBatch {
        let ops = [crate::store::Op::put(format!("{PREFIX}{key}"), value)];
        super::own_batch(PREFIX, revision, &ops).expect("a put under the prefix")
    }

    #[tokio::test(start_paused = true)]
    async fn an_own_write_is_applied_without_the_watch_and_its_watched_copy_is_skipped() {
        let store = MemoryStore::new();
        let mirror = Arc::new(Mirror::<Records>::load(&store, &(), "test").await.expect("loads"));
        let (relayed, stop) = run(store.clone(), mirror.clone(), Duration::from_secs(300));
        let next = store.revision() + 1;
        // Offered before the store has it: only the offer can bring it into the cache.
        mirror.offer(own_put(next, "a/x", "1"));
        settle().await;
        assert_eq!(mirror.read().revision, next);
        assert!(mirror.read().kvs.contains_key(&format!("{PREFIX}a/x")));
        assert_eq!(relayed.lock().expect("lock").len(), 1, "relayed once");
        // The same write now reaches the store and comes back through the watch: skipped.
        store.put(&format!("{PREFIX}a/x"), b"1".to_vec(), None).await.expect("written");
        assert_eq!(store.revision(), next);
        settle().await;
        assert_eq!(relayed.lock().expect("lock").len(), 1, "the watched copy is not relayed again");
        // And the watch is still followed.
        store.put(&format!("{PREFIX}b/x"), b"2".to_vec(), None).await.expect("written");
        settle().await;
        assert_eq!(mirror.read().kvs.len(), 2);
        assert_eq!(relayed.lock().expect("lock").len(), 2);
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn an_own_write_after_unseen_revisions_waits_for_them() {
        let store = MemoryStore::new();
        let mirror = Arc::new(Mirror::<Records>::load(&store, &(), "test").await.expect("loads"));
        let base = store.revision();
        // Revision base + 1 is somebody else's and not seen yet: base + 2 must wait for it,
        // or the cache would claim a revision it has not fully seen.
        mirror.offer(own_put(base + 2, "b/x", "2"));
        let (relayed, stop) = run(store.clone(), mirror.clone(), Duration::from_secs(300));
        settle().await;
        assert_eq!(mirror.read().revision, base, "held back");
        assert!(relayed.lock().expect("lock").is_empty());
        store.put(&format!("{PREFIX}a/x"), b"1".to_vec(), None).await.expect("written");
        settle().await;
        assert_eq!(mirror.read().revision, base + 2, "the watched revision, then the own write after it");
        assert_eq!(mirror.read().kvs.len(), 2);
        // An offer the cache has already passed is ignored.
        mirror.offer(own_put(base + 1, "z/x", "9"));
        settle().await;
        assert!(!mirror.read().kvs.contains_key(&format!("{PREFIX}z/x")));
        stop.cancel();
    }

    /// Commits a put of `key` (under the prefix) guarded by its mod revision `held`, and
    /// returns its batch as the committing task has it, with the compares.
    async fn commit_put(
        store: &MemoryStore,
        key: &str,
        value: &str,
        held: crate::store::Revision,
    ) -> (crate::store::WatchBatch, Vec<crate::store::Compare>) {
        use crate::store::{Compare, Op, Txn};
        let key = format!("{PREFIX}{key}");
        let txn = Txn::new().when(Compare::ModRevision(key.clone(), held)).then(Op::put(key, value));
        let outcome = store.txn(txn.clone()).await.expect("committed");
        assert!(outcome.succeeded);
        (super::own_batch(PREFIX, outcome.revision, &txn.ops).expect("a put"), txn.compares)
    }

    #[tokio::test(start_paused = true)]
    async fn an_own_write_whose_compares_hold_its_keys_is_applied_ahead_of_unseen_revisions() {
        let store = MemoryStore::new();
        let mirror = Arc::new(Mirror::<Records>::load(&store, &(), "test").await.expect("loads"));
        let base = store.revision();
        // Another writer of the same store, outside the prefix: a revision the watch of the
        // prefix never delivers.
        store.put("/elsewhere/k", b"0".to_vec(), None).await.expect("written");
        let (batch, compares) = commit_put(&store, "a/x", "1", 0).await;
        assert_eq!(batch.revision, base + 2);
        // Without the compares the gap cannot be crossed: offered, nothing applied.
        assert!(mirror.apply_own_now(&(), batch.clone(), &[]).is_none());
        assert!(mirror.read().kvs.is_empty());
        let changes = mirror.apply_own_now(&(), batch, &compares).expect("applied ahead");
        assert_eq!(changes.topics(), BTreeSet::from(["a".to_string()]));
        assert_eq!(mirror.read().kvs[&format!("{PREFIX}a/x")].value, b"1");
        assert_eq!(mirror.read().revision, base, "the revision stays where the watch is");
        // A write decided from the store while the cache lags (it has not seen `b/x`
        // written): applying it ahead would delete a record the cache does not have, and
        // the watch would then bring that record back. Its compare says so: offered.
        let key = format!("{PREFIX}b/x");
        let written = store.put(&key, b"2".to_vec(), None).await.expect("written");
        let txn = crate::store::Txn::new()
            .when(crate::store::Compare::ModRevision(key.clone(), written))
            .when(crate::store::Compare::ModRevision(format!("{PREFIX}b/y"), 0))
            .then(crate::store::Op::delete(key))
            .then(crate::store::Op::put(format!("{PREFIX}b/y"), "3"));
        let outcome = store.txn(txn.clone()).await.expect("committed");
        let lagging = super::own_batch(PREFIX, outcome.revision, &txn.ops).expect("a put");
        assert!(mirror.apply_own_now(&(), lagging, &txn.compares).is_none());
        assert!(!mirror.read().kvs.contains_key(&format!("{PREFIX}b/y")));
        // The watch brings both revisions: the own write's copy changes nothing, the other is applied.
        let (relayed, stop) = run(store.clone(), mirror.clone(), Duration::from_secs(300));
        settle().await;
        assert_eq!(mirror.read().revision, store.revision());
        let keys: Vec<String> = mirror.read().kvs.keys().cloned().collect();
        assert_eq!(keys, [format!("{PREFIX}a/x"), format!("{PREFIX}b/y")]);
        let relayed = relayed.lock().expect("lock").clone();
        assert!(relayed.iter().all(|topics| !topics.contains("a")), "'a' told twice: {relayed:?}");
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_watched_revision_never_takes_a_key_back_behind_an_own_write_applied_ahead() {
        let store = MemoryStore::new();
        let mirror = Arc::new(Mirror::<Records>::load(&store, &(), "test").await.expect("loads"));
        store.put("/elsewhere/k", b"0".to_vec(), None).await.expect("written");
        let (first, compares) = commit_put(&store, "a/x", "1", 0).await;
        let (held, first_events) = (first.revision, first.events.clone());
        assert!(mirror.apply_own_now(&(), first, &compares).is_some());
        let (second, compares) = commit_put(&store, "a/x", "2", held).await;
        let second_events = second.events.clone();
        assert!(mirror.apply_own_now(&(), second, &compares).is_some(), "its compare holds the first");
        // The watch now delivers the first revision alone, then the second: the key must
        // stay at the second's record after each of them.
        for (revision, events) in [(held, first_events), (held + 1, second_events)] {
            let mut changes = super::Changes::default();
            let mut cache = mirror.cache.write().expect("lock");
            mirror.apply_revision(&mut cache, &(), revision, events, &mut changes);
            assert_eq!(cache.revision, revision);
            assert_eq!(cache.kvs[&format!("{PREFIX}a/x")].value, b"2", "taken back at {revision}");
            assert!(changes.topics().is_empty(), "nothing new to tell at {revision}");
        }
        // A re-read older than the write applied ahead would take it back as well: the
        // follower reads again until it has the write.
        assert_eq!(mirror.newest(&mirror.read()), held + 1);
    }

    #[test]
    fn own_batches_carry_puts_and_deletes_under_the_prefix_only() {
        use crate::store::Op;
        let ops = [
            Op::put(format!("{PREFIX}a/x"), "1"),
            Op::delete(format!("{PREFIX}a/y")),
            Op::put("/other/k", "2"),
        ];
        let batch = super::own_batch(PREFIX, 7, &ops).expect("has a put");
        assert_eq!(batch.revision, 7);
        let keys: Vec<&str> = batch.events.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, [format!("{PREFIX}a/x"), format!("{PREFIX}a/y")]);
        assert_eq!(super::own_batch(PREFIX, 7, &[Op::delete(format!("{PREFIX}a/x"))]), None, "deletes alone");
    }

    #[tokio::test(start_paused = true)]
    async fn the_periodic_resync_re_reads_without_relaying_anything_unchanged() {
        let store = MemoryStore::new();
        store.put(&format!("{PREFIX}a/x"), b"1".to_vec(), None).await.expect("written");
        let mirror = Arc::new(Mirror::<Records>::load(&store, &(), "test").await.expect("loads"));
        let (relayed, stop) = run(store.clone(), mirror.clone(), Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(4000)).await;
        let relayed = relayed.lock().expect("lock").clone();
        assert!(relayed.len() >= 3, "three resyncs (each 1 s ± 25 %) relayed: {relayed:?}");
        assert!(relayed.iter().all(BTreeSet::is_empty), "nothing differed: {relayed:?}");
        stop.cancel();
    }
}
