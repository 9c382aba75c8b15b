//! Following the store: the watch, the re-reads that close its gaps, and the periodic
//! resync, as one step at a time that the backend's own loop asks for.
//!
//! **A watch that hangs without an error** (a connection that stopped forwarding) would
//! look like a quiet store. A store whose watches can hang sends progress marks on a quiet
//! watch ([`LeaseStore::watch_progress_every`]): a watch that has sent nothing at all, not
//! even a mark, for [`Source::stale_after`] (three quarters of the TTL) is stale. The
//! mirror then does not follow, as of when it last heard from the watch, so the upkeep
//! fences the streams at once (the fence of a mirror that cannot read the store); and it
//! watches again, following again only once the new watch has been heard from.
//!
//! [`LeaseStore::watch_progress_every`]: crate::store::LeaseStore::watch_progress_every

use std::time::Duration;

use futures::{FutureExt, StreamExt, future::BoxFuture};
use tokio::time::Sleep;

use super::{Changes, Mirror, MirrorCache, Source};
use crate::store::{PrefixSnapshot, Revision, StoreError, WatchStream};

/// The first pause before re-reading after a failed read; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// `interval` ± 25 %, at random: the periodic resync (O(all records)) must not run at the
/// same moment on every instance.
fn jittered(interval: Duration) -> Duration {
    use std::hash::BuildHasher;
    let random = std::collections::hash_map::RandomState::new().hash_one(0u8);
    interval.mul_f64(0.75 + (random % 1_000) as f64 / 2_000.0)
}

/// How long a watch whose store sends a progress mark every `every` may say nothing at
/// all before the mirror counts itself stale (pure): `stale_after` (three quarters of the
/// TTL), but never less than two marks' worth, whatever the TTL. The handoff state machine
/// applies the same bound.
pub fn silence_bound(stale_after: Duration, every: Duration) -> Duration {
    stale_after.max(every * 2)
}

/// Where the follower is: watching, or due to re-read the whole prefix. A store call, once
/// made, is kept here until it answers: a [`Follower::next`] dropped while it runs does
/// not make it again.
enum Phase<'a> {
    /// Open a watch from this revision (the call, once made).
    Watch(Revision, Option<BoxFuture<'a, Result<WatchStream, StoreError>>>),
    /// Following this watch until the resync is due.
    Following(WatchStream, std::pin::Pin<Box<Sleep>>),
    /// Re-read everything (the read, once made); `interrupted` says whether the watch broke
    /// (a gap in the view).
    Reread { interrupted: bool, read: Option<BoxFuture<'a, Result<PrefixSnapshot, StoreError>>> },
}

/// Keeps a [`Mirror`]'s cache equal to the store, one step at a time: each
/// [`next`](Self::next) applies at least one revision and returns what it changed.
pub struct Follower<'a, C: MirrorCache> {
    mirror: &'a Mirror<C>,
    source: Source<'a, C::Keys>,
    phase: Phase<'a>,
    backoff: Duration,
    /// When a failed re-read may be tried again.
    retry_at: Option<tokio::time::Instant>,
    /// When the watch was last heard from (opened, an event, a progress mark).
    heard: tokio::time::Instant,
    /// A watch went silent: the mirror follows again only once a new watch is heard from.
    unproven: bool,
}

impl<'a, C: MirrorCache> Follower<'a, C> {
    pub(super) fn new(mirror: &'a Mirror<C>, source: Source<'a, C::Keys>) -> Self {
        let from = mirror.read().revision() + 1;
        Self {
            mirror,
            source,
            phase: Phase::Watch(from, None),
            backoff: FIRST_BACKOFF,
            retry_at: None,
            heard: tokio::time::Instant::now(),
            unproven: false,
        }
    }

    /// How long the open watch may say nothing, if the store's watches send progress
    /// marks (never less than two marks' worth, whatever the TTL), and how often they do.
    fn silence(&self) -> Option<(Duration, Duration)> {
        let every = self.source.store.watch_progress_every()?;
        Some((silence_bound(self.source.stale_after, every), every))
    }

    /// The watch's silence reached its bound at `at`. Noticed late, it says nothing about
    /// the watch: the loop was busy elsewhere, and the watch asks for progress only while it
    /// is polled (a busy instance delivers late; it must not fence itself for being busy).
    /// Then the watch gets two more progress periods to speak, and `false` is returned.
    fn silence_holds(&mut self, at: tokio::time::Instant, (bound, every): (Duration, Duration)) -> bool {
        let now = tokio::time::Instant::now();
        if now.duration_since(at) <= every {
            return true;
        }
        self.heard = now + every * 2 - bound;
        false
    }

    /// The watch said nothing since [`heard`](Self::heard): not following as of then, and
    /// watch again (after a re-read: what the watch held back is unknown).
    fn went_silent(&mut self) {
        let (mirror, silent_for) = (self.mirror, self.heard.elapsed());
        tracing::warn!(
            mirror = mirror.name,
            ?silent_for,
            "the watch sent nothing, not even a progress mark: the relay is stale; watching again"
        );
        mirror.set_silent(self.heard);
        self.unproven = true;
        self.phase = Phase::Reread { interrupted: true, read: None };
    }

    /// Reports following, unless a silent watch made the mirror wait for a new one to speak.
    fn following(&self, interrupted: bool) {
        if !self.unproven {
            self.mirror.set_following(true, interrupted);
        }
    }

    /// Waits until the cache has advanced (a watched revision, an own write, a re-read
    /// after a gap or the periodic resync) and returns what changed, for the caller to tell
    /// its consumers and then [`Mirror::announce`]. After a broken watch the changes may be
    /// empty: the re-read that follows brings what differs. `None` once the instance stops.
    ///
    /// Cancel-safe: dropped before it returns (another branch of the caller's `select!`
    /// won), it has applied nothing, and the next call goes on where this one was (the
    /// watch stays open, a watch or re-read under way goes on, a failed re-read keeps its
    /// backoff), so an instance's loop can wait on it beside its other inputs.
    pub async fn next(&mut self) -> Option<Changes> {
        let Source { store, keys, shutdown, resync_interval, .. } = self.source;
        let (mirror, name) = (self.mirror, self.mirror.name);
        loop {
            if shutdown.is_cancelled() {
                return None;
            }
            let silence = self.silence();
            let silent_at = silence.map(|(bound, _)| self.heard + bound);
            match &mut self.phase {
                Phase::Watch(from, call) => {
                    let from = *from;
                    let call = call.get_or_insert_with(|| store.watch_prefix(C::prefix(keys), from));
                    let watch = tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        w = call => w,
                    };
                    match watch {
                        Ok(stream) => {
                            self.backoff = FIRST_BACKOFF;
                            self.heard = tokio::time::Instant::now();
                            self.following(false);
                            let resync = Box::pin(tokio::time::sleep(jittered(resync_interval)));
                            self.phase = Phase::Following(stream, resync);
                        }
                        Err(error) => {
                            tracing::warn!(%error, mirror = name, "watch failed; re-reading state");
                            self.phase = Phase::Reread { interrupted: true, read: None };
                        }
                    }
                }
                Phase::Following(stream, resync) => {
                    let silent = async {
                        match silent_at {
                            Some(at) => tokio::time::sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    };
                    // `None`: an own write was offered, no watch item is at hand. A watch
                    // item at hand goes before the silence: it ends it.
                    let item = tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => return None,
                        _ = resync.as_mut() => {
                            self.phase = Phase::Reread { interrupted: false, read: None };
                            continue;
                        }
                        item = stream.next() => Some(item),
                        _ = mirror.own_offered.notified() => None,
                        () = silent => {
                            if let (Some(at), Some(silence)) = (silent_at, silence)
                                && self.silence_holds(at, silence)
                            {
                                self.went_silent();
                            }
                            continue;
                        }
                    };
                    if item.is_some() {
                        self.heard = tokio::time::Instant::now();
                    }
                    // Only a batch or a progress mark proves a new watch (an error ends it).
                    if matches!(item, Some(Some(Ok(_)))) && std::mem::take(&mut self.unproven) {
                        tracing::info!(mirror = name, "the new watch speaks: following again");
                        mirror.set_following(true, false);
                    }
                    let (changes, advanced, failed) = apply(mirror, keys, stream, item);
                    if failed {
                        self.phase = Phase::Reread { interrupted: true, read: None };
                    }
                    if advanced || failed {
                        return Some(changes);
                    }
                }
                Phase::Reread { interrupted, read } => {
                    let interrupted = *interrupted;
                    if read.is_none()
                        && let Some(at) = self.retry_at
                    {
                        tokio::select! {
                            _ = shutdown.cancelled() => return None,
                            _ = tokio::time::sleep_until(at) => {}
                        }
                        self.retry_at = None;
                    }
                    let call = read.get_or_insert_with(|| store.get_prefix(C::prefix(keys)));
                    let result = tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        r = call => r,
                    };
                    *read = None;
                    match result {
                        Ok(snapshot) => {
                            let mut fresh = C::from_snapshot(keys, snapshot);
                            let mut cache = mirror.cache.write().unwrap_or_else(|p| p.into_inner());
                            if mirror.regresses(fresh.revision(), &cache) {
                                // An own write was applied while the read was under way
                                // (`Mirror::apply_own_now`): the snapshot is older than the
                                // cache, and taking it would move the consumers back. Read again.
                                continue;
                            }
                            self.phase = Phase::Watch(fresh.revision() + 1, None);
                            let changes = super::reread_changes(&*cache, &fresh);
                            cache.carry_over(&mut fresh);
                            *cache = fresh;
                            drop(cache);
                            self.following(interrupted);
                            return Some(changes);
                        }
                        Err(error) => {
                            tracing::warn!(%error, mirror = name, "cannot re-read state; retrying");
                            mirror.set_following(false, false);
                            self.retry_at = Some(tokio::time::Instant::now() + self.backoff);
                            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                        }
                    }
                }
            }
        }
    }
}

/// Applies `item` and every watch item ready with it, then the own writes that follow
/// without a gap: whole revisions, so consumers never see part of a transaction. Returns
/// the changes, whether the cache advanced, and whether the watch failed.
fn apply<C: MirrorCache>(
    mirror: &Mirror<C>,
    keys: &C::Keys,
    stream: &mut WatchStream,
    mut item: Option<Option<Result<crate::store::WatchBatch, crate::store::StoreError>>>,
) -> (Changes, bool, bool) {
    let mut changes = Changes::default();
    let mut failed = false;
    let mut cache = mirror.cache.write().unwrap_or_else(|p| p.into_inner());
    let before = cache.revision();
    while let Some(next) = item {
        match next {
            // A progress mark: the watch is alive, there is nothing to apply.
            Some(Ok(batch)) if batch.events.is_empty() => {}
            // A revision already applied as an own write: skip the copy.
            Some(Ok(batch)) if batch.revision <= cache.revision() => {}
            Some(Ok(batch)) => {
                mirror.apply_revision(&mut cache, keys, batch.revision, batch.events, &mut changes)
            }
            Some(Err(error)) => {
                tracing::warn!(%error, mirror = mirror.name, "watch ended");
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
        mirror.apply_own(&mut cache, keys, &mut changes);
    }
    let advanced = cache.revision() != before;
    (changes, advanced, failed)
}
