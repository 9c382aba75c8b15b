//! A cache kept equal to a store prefix, shared by the store-backed coordinators.
//!
//! The mirror loads a snapshot of the prefix, then follows a prefix watch from the
//! snapshot's revision + 1. Events that are ready together (one revision at least) are
//! applied before the coordinator's relay runs, so a consumer never sees part of a
//! transaction. On a watch error, and every resync interval as a safety net, it re-reads
//! the whole prefix and relays only the topics that differ: nothing is missed across the
//! gap. After every applied batch the `changed` channel is bumped with the cache revision.
//!
//! What the cache holds, and what the relay tells the consumers, is the coordinator's own
//! business ([`MirrorCache`] and the relay callback).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Mutex, RwLock, RwLockReadGuard},
    time::Duration,
};

use futures::{FutureExt, StreamExt};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::store::{
    KeyValue, LeaseStore, Op, PrefixSnapshot, Revision, StoreError, WatchBatch, WatchEvent, WatchEventKind,
    WatchStream,
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

/// `interval` ± 25 %, at random: the periodic resync (O(all records)) must not run at the
/// same moment on every instance.
fn jittered(interval: Duration) -> Duration {
    use std::hash::BuildHasher;
    let random = std::collections::hash_map::RandomState::new().hash_one(0u8);
    interval.mul_f64(0.75 + (random % 1_000) as f64 / 2_000.0)
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
    /// These consumers.
    Consumers(BTreeSet<String>),
}

impl Changes {
    /// Marks the whole topic.
    pub fn topic(&mut self, topic: &str) {
        self.0.insert(topic.to_string(), Touched::All);
    }

    /// Marks these consumers of `topic`.
    pub fn consumers<'a>(&mut self, topic: &str, names: impl IntoIterator<Item = &'a str>) {
        let touched = self.0.entry(topic.to_string()).or_insert_with(|| Touched::Consumers(BTreeSet::new()));
        if let Touched::Consumers(set) = touched {
            set.extend(names.into_iter().map(str::to_string));
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

    /// The store revision this cache reflects.
    fn revision(&self) -> Revision;

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
    /// The store's state as last seen by the watcher.
    cache: RwLock<C>,
    /// Bumped (with the cache revision) after every applied revision.
    changed: watch::Sender<Revision>,
    /// Names this mirror in its logs.
    name: &'static str,
    /// Whether it follows the store.
    health: watch::Sender<MirrorHealth>,
    /// This instance's own committed writes, by revision, waiting to be applied ahead of
    /// their watch delivery ([`Mirror::offer`]).
    own: Mutex<BTreeMap<Revision, Vec<WatchEvent>>>,
    /// Wakes the watcher when an own write is offered.
    own_offered: Notify,
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
        })
    }

    /// Offers a write this instance committed, so the cache and the relay need not wait
    /// for the watch to bring it back (a handoff's fast path, docs/design.md §9). The watcher
    /// applies it as soon as the cache is at the revision just before it, which proves
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

    /// Applies the offered own writes that follow the cache's revision without a gap,
    /// and forgets those the cache already has.
    fn apply_own(&self, cache: &mut C, keys: &C::Keys, changes: &mut Changes) {
        let mut own = self.own.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(entry) = own.first_entry() {
            let revision = *entry.key();
            if revision <= cache.revision() {
                entry.remove();
            } else if revision == cache.revision() + 1 {
                for event in entry.remove() {
                    cache.apply(keys, event, changes);
                }
            } else {
                break;
            }
        }
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

    /// A receiver woken after every applied revision.
    pub fn subscribe(&self) -> watch::Receiver<Revision> {
        self.changed.subscribe()
    }

    /// Keeps the cache equal to the store and calls `relay` with the topics each change
    /// touched, under the read lock of the updated cache. Runs until shutdown.
    pub async fn run(&self, source: Source<'_, C::Keys>, relay: impl Fn(&C, &Changes)) {
        let Source { store, keys, shutdown, .. } = source;
        let name = self.name;
        let mut from = self.read().revision() + 1;
        let mut backoff = Duration::from_millis(50);
        loop {
            let watch = tokio::select! {
                _ = shutdown.cancelled() => return,
                w = store.watch_prefix(C::prefix(keys), from) => w,
            };
            let interrupted = match watch {
                Ok(stream) => {
                    backoff = Duration::from_millis(50);
                    self.set_following(true, false);
                    self.follow(&source, stream, &relay).await
                }
                Err(error) => {
                    tracing::warn!(%error, mirror = name, "watch failed; re-reading state");
                    true
                }
            };
            if shutdown.is_cancelled() {
                return;
            }
            // Re-read everything, then relay what differs: nothing is missed across the gap.
            loop {
                match store.get_prefix(C::prefix(keys)).await {
                    Ok(snapshot) => {
                        let fresh = C::from_snapshot(keys, snapshot);
                        from = fresh.revision() + 1;
                        let changes = {
                            let mut cache = self.cache.write().unwrap_or_else(|p| p.into_inner());
                            let changes = cache.differing(&fresh);
                            *cache = fresh;
                            changes
                        };
                        self.set_following(true, interrupted);
                        self.publish(&changes, &relay);
                        break;
                    }
                    Err(error) => {
                        tracing::warn!(%error, mirror = name, "cannot re-read state; retrying");
                        self.set_following(false, false);
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
            }
        }
    }

    /// Applies a watch stream to the cache until it fails (returns `true`), the resync
    /// interval passes, or shutdown. Events that are ready together (one revision at least)
    /// are applied before relaying, so consumers never see part of a transaction.
    async fn follow(
        &self,
        source: &Source<'_, C::Keys>,
        mut stream: WatchStream,
        relay: &impl Fn(&C, &Changes),
    ) -> bool {
        let resync = tokio::time::sleep(jittered(source.resync_interval));
        tokio::pin!(resync);
        loop {
            // `None`: an own write was offered, no watch item is at hand.
            let mut item = tokio::select! {
                _ = source.shutdown.cancelled() => return false,
                _ = &mut resync => return false,
                item = stream.next() => Some(item),
                _ = self.own_offered.notified() => None,
            };
            let mut changes = Changes::default();
            let mut failed = false;
            let advanced = {
                let mut cache = self.cache.write().unwrap_or_else(|p| p.into_inner());
                let before = cache.revision();
                while let Some(next) = item {
                    match next {
                        // A revision already applied as an own write: skip the copy.
                        Some(Ok(batch)) if batch.revision <= cache.revision() => {}
                        Some(Ok(batch)) => {
                            for event in batch.events {
                                cache.apply(source.keys, event, &mut changes);
                            }
                        }
                        Some(Err(error)) => {
                            tracing::warn!(%error, mirror = self.name, "watch ended");
                            failed = true;
                            break;
                        }
                        None => {
                            failed = true;
                            break;
                        }
                    }
                    item = stream.next().now_or_never();
                }
                if !failed {
                    self.apply_own(&mut cache, source.keys, &mut changes);
                }
                cache.revision() != before
            };
            if advanced || failed {
                self.publish(&changes, relay);
            }
            if failed {
                return true;
            }
        }
    }

    /// Relays the changed topics, then announces the new revision, under one read of the
    /// cache: both are about the same revision.
    fn publish(&self, changes: &Changes, relay: &impl Fn(&C, &Changes)) {
        let cache = self.read();
        relay(&cache, changes);
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
            mirror.run(source, |_, changes| seen.lock().expect("lock").push(changes.topics())).await;
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
