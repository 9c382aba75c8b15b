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
    collections::BTreeSet,
    sync::{RwLock, RwLockReadGuard},
    time::Duration,
};

use futures::{FutureExt, StreamExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::store::{LeaseStore, PrefixSnapshot, Revision, StoreError, WatchEvent, WatchStream};

/// The in-memory copy of a store prefix that a [`Mirror`] keeps up to date.
pub(crate) trait MirrorCache: Sized {
    /// What parses the keys under the prefix.
    type Keys;

    /// The prefix this cache mirrors.
    fn prefix(keys: &Self::Keys) -> &str;

    /// A cache holding exactly `snapshot`.
    fn from_snapshot(keys: &Self::Keys, snapshot: PrefixSnapshot) -> Self;

    /// Applies one watched change; returns the topic it touched, if any.
    fn apply(&mut self, keys: &Self::Keys, event: WatchEvent) -> Option<String>;

    /// Names of the topics whose state differs between `self` and `other` (after a
    /// re-read): the ones whose consumers must hear about it.
    fn topics_differing(&self, other: &Self) -> BTreeSet<String>;

    /// The store revision this cache reflects.
    fn revision(&self) -> Revision;
}

/// Where a [`Mirror`] follows the store from, and when it stops.
pub(crate) struct Source<'a, K> {
    /// The store.
    pub store: &'a dyn LeaseStore,
    /// The keys of the mirrored prefix.
    pub keys: &'a K,
    /// How often the whole prefix is re-read as a safety net.
    pub resync_interval: Duration,
    /// Cancelled when the instance shuts down.
    pub shutdown: &'a CancellationToken,
}

/// A cache kept equal to a store prefix, and the channel that announces its revisions.
pub(crate) struct Mirror<C> {
    /// The store's state as last seen by the watcher.
    cache: RwLock<C>,
    /// Bumped (with the cache revision) after every applied revision.
    changed: watch::Sender<Revision>,
    /// Names this mirror in its logs.
    name: &'static str,
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
        Ok(Self { cache: RwLock::new(cache), changed, name })
    }

    /// Reads the cache. A poisoned lock still holds a whole cache (writers replace or
    /// apply whole events), so it is used as it is.
    pub fn read(&self) -> RwLockReadGuard<'_, C> {
        self.cache.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A receiver woken after every applied revision.
    pub fn subscribe(&self) -> watch::Receiver<Revision> {
        self.changed.subscribe()
    }

    /// Keeps the cache equal to the store and calls `relay` with the topics each change
    /// touched, under the read lock of the updated cache. Runs until shutdown.
    pub async fn run(&self, source: Source<'_, C::Keys>, relay: impl Fn(&C, &BTreeSet<String>)) {
        let Source { store, keys, shutdown, .. } = source;
        let name = self.name;
        let mut from = self.read().revision() + 1;
        let mut backoff = Duration::from_millis(50);
        loop {
            let watch = tokio::select! {
                _ = shutdown.cancelled() => return,
                w = store.watch_prefix(C::prefix(keys), from) => w,
            };
            match watch {
                Ok(stream) => {
                    backoff = Duration::from_millis(50);
                    self.follow(&source, stream, &relay).await;
                }
                Err(error) => tracing::warn!(%error, mirror = name, "watch failed; re-reading state"),
            }
            if shutdown.is_cancelled() {
                return;
            }
            // Re-read everything, then relay what differs: nothing is missed across the gap.
            loop {
                match store.get_prefix(C::prefix(keys)).await {
                    Ok(snapshot) => {
                        let fresh = C::from_snapshot(keys, snapshot);
                        from = fresh.revision() + 1;
                        let topics = {
                            let mut cache = self.cache.write().unwrap_or_else(|p| p.into_inner());
                            let topics = cache.topics_differing(&fresh);
                            *cache = fresh;
                            topics
                        };
                        self.publish(&topics, &relay);
                        break;
                    }
                    Err(error) => {
                        tracing::warn!(%error, mirror = name, "cannot re-read state; retrying");
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

    /// Applies a watch stream to the cache until it fails, the resync interval passes, or
    /// shutdown. Events that are ready together (one revision at least) are applied before
    /// relaying, so consumers never see part of a transaction.
    async fn follow(
        &self,
        source: &Source<'_, C::Keys>,
        mut stream: WatchStream,
        relay: &impl Fn(&C, &BTreeSet<String>),
    ) {
        let resync = tokio::time::sleep(source.resync_interval);
        tokio::pin!(resync);
        loop {
            let mut item = tokio::select! {
                _ = source.shutdown.cancelled() => return,
                _ = &mut resync => return,
                item = stream.next() => item,
            };
            let mut topics = BTreeSet::new();
            let mut failed = false;
            {
                let mut cache = self.cache.write().unwrap_or_else(|p| p.into_inner());
                loop {
                    match item {
                        Some(Ok(batch)) => topics
                            .extend(batch.events.into_iter().filter_map(|e| cache.apply(source.keys, e))),
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
                    match stream.next().now_or_never() {
                        Some(next) => item = next,
                        None => break,
                    }
                }
            }
            self.publish(&topics, relay);
            if failed {
                return;
            }
        }
    }

    /// Relays the changed topics, then announces the new revision, under one read of the
    /// cache: both are about the same revision.
    fn publish(&self, topics: &BTreeSet<String>, relay: &impl Fn(&C, &BTreeSet<String>)) {
        let cache = self.read();
        relay(&cache, topics);
        self.changed.send_replace(cache.revision());
    }
}
