//! How the fleet instance follows its store and keeps itself honest: the first read, the
//! watch, a re-read after the watch broke (the mirror's stale-snapshot rule), the lease as
//! reported (self-fencing, the instance record), an instance that cannot follow fencing
//! its streams ([`stale_fence_due`]), and the watchdog (a deadline for every store request,
//! the watch's [`silence_bound`]), as the handoff machine does them.
//!
//! [`silence_bound`]: crate::coordinator::shared::mirror::silence_bound

use std::time::Duration;

use super::{Instance, Waiting, expect};
use crate::coordinator::causes::Fence;
use crate::coordinator::fleet_backend::state::FleetCache;
use crate::coordinator::machine::io::{Effect, LeaseState, Micros, RequestId, StoreReply, StoreRequest};
use crate::coordinator::machine::watchdog::no_answer;
use crate::coordinator::shared::instance_record::{instance_key, instance_record_txn};
use crate::coordinator::shared::lease::{fence_after, fences_streams};
use crate::coordinator::shared::mirror::{
    Changes, MirrorCache, apply_watched, reread_changes, snapshot_regresses,
};
use crate::coordinator::shared::upkeep::stale_fence_due;
use crate::store::{StoreError, WatchBatch};

/// How long a failed re-read waits before it is tried again.
const REREAD_AFTER: Micros = 100_000;

impl Instance {
    /// Reads the whole prefix (the first load, or closing a gap in the watch).
    pub(super) fn reread(&mut self) {
        self.reread_at = None;
        self.request(StoreRequest::GetPrefix(self.keys.root().to_string()), Waiting::Reread);
    }

    /// The prefix as read: the cache becomes it (what changed is relayed), and the watch
    /// follows from the revision after it.
    pub(super) fn reread_answered(&mut self, answer: Result<StoreReply, StoreError>) {
        let snapshot = match expect(answer, |r| match r {
            StoreReply::Prefix(s) => Some(s),
            _ => None,
        }) {
            Ok(snapshot) => snapshot,
            Err(_) => {
                self.stale_since.get_or_insert(self.now);
                self.sweeper.health(false, self.instant(self.now));
                self.reread_at = Some(self.now + REREAD_AFTER);
                return;
            }
        };
        if let Some(cache) = &self.cache
            && snapshot_regresses(snapshot.revision, cache.revision, 0)
        {
            // Older than what the cache holds: taking it would move the consumers back.
            return self.reread();
        }
        let from = snapshot.revision + 1;
        let fresh = FleetCache::from_snapshot(&self.keys, snapshot);
        let changes = match self.cache.take() {
            Some(old) => reread_changes(&old, &fresh),
            None => Changes::default(),
        };
        self.cache = Some(fresh);
        if !self.watchdog.unproven() {
            self.follow_again();
        }
        self.relay(&changes);
        let watch =
            self.request(StoreRequest::Watch { prefix: self.keys.root().to_string(), from }, Waiting::Watch);
        self.watch = Some(watch);
        self.watchdog.opened(self.now);
        self.all_claims_due();
    }

    /// The answer to starting the watch: an error ends it.
    pub(super) fn watch_answered(&mut self, request: RequestId, answer: Result<StoreReply, StoreError>) {
        match answer {
            Err(error) => self.watch_ended(request, error),
            Ok(_) if self.watch == Some(request) => self.watchdog.opened(self.now),
            Ok(_) => {}
        }
    }

    /// One watched revision: applied to the cache and relayed; every claim step looks
    /// again.
    pub(super) fn watched(&mut self, watch: RequestId, batch: WatchBatch) {
        if self.watch != Some(watch) {
            return;
        }
        self.heard_from_watch();
        let Some(cache) = self.cache.as_mut() else { return };
        // A progress mark, or a revision the cache has already.
        if batch.events.is_empty() || batch.revision <= cache.revision {
            return;
        }
        let mut changes = Changes::default();
        apply_watched(cache, &self.keys, batch.revision, batch.events, 0, &mut changes);
        // Relayed before any claim step looks at the cache: a step decides on a cache
        // whose every change its consumer was told.
        self.relay(&changes);
        self.all_claims_due();
    }

    /// The watch ended: the view has a gap, closed by a re-read; until then the mirror does
    /// not follow the store.
    pub(super) fn watch_ended(&mut self, watch: RequestId, _error: StoreError) {
        if self.watch != Some(watch) {
            return;
        }
        self.watch = None;
        self.stale_since.get_or_insert(self.now);
        self.sweeper.health(false, self.instant(self.now));
        self.reread();
    }

    /// The lease keeper reported `state`: a lost session fences every stream; a new one
    /// gets the instance record.
    pub(super) fn lease_reported(&mut self, state: LeaseState) {
        let before = std::mem::replace(&mut self.lease, state);
        if matches!(state, LeaseState::Fenced(_))
            && !matches!(before, LeaseState::Fenced(_))
            && fences_streams()
        {
            self.fence_all(Fence::SessionLost { instance: self.config.instance_id.clone() });
        }
        if let Some(session) = state.live().filter(|s| self.recorded != Some(*s)) {
            let key = instance_key(self.keys.root(), &self.config.instance_id);
            let txn = instance_record_txn(&key, &self.config.instance_id, 1, session);
            self.request(StoreRequest::Txn(txn), Waiting::Record(session));
        }
        if state.live().is_some() {
            self.all_claims_due();
        }
    }

    /// An instance that has not followed its store for ¾ TTL fences its streams (and its
    /// keeper stops renewing, [`Instance::renews`]).
    pub(super) fn fence_if_stale(&mut self) {
        if let Some(since) = self.stale_since
            && !self.stale_fenced
            && stale_fence_due(self.instant(since), self.instant(self.now), self.config.lease_ttl)
        {
            self.stale_fenced = true;
            self.fence_all(Fence::CannotFollow { instance: self.config.instance_id.clone() });
        }
    }

    /// When the stale fence falls if the mirror does not follow again first.
    pub(super) fn stale_wake(&self) -> Option<Micros> {
        let after = fence_after(self.config.lease_ttl).as_micros() as Micros;
        self.stale_since.filter(|_| !self.stale_fenced).map(|since| since + after)
    }

    /// Fails the requests whose deadline has passed, as the store failing them: the answer
    /// was lost, whether or not the request took effect. A later answer is ignored.
    pub(super) fn expire_requests(&mut self) {
        for request in self.watchdog.expired(self.now) {
            self.answered(request, Err(no_answer()));
        }
    }

    /// A watch that has said nothing for its bound went silent: the mirror does not follow
    /// as of when it was last heard from, and it reads and watches again, following again
    /// only once the new watch speaks.
    pub(super) fn check_silence(&mut self) {
        let Some(watch) = self.watch else { return };
        let Some(heard) = self.watchdog.silent(self.now, true) else { return };
        self.waiting.remove(&watch);
        self.watchdog.settled(watch);
        self.watch = None;
        if self.stale_since.is_none_or(|since| since > heard) {
            self.stale_since = Some(heard);
        }
        self.sweeper.health(false, self.instant(heard));
        self.reread();
    }

    /// The watch in use said something: it is alive, and after a silence it proves the new
    /// watch.
    fn heard_from_watch(&mut self) {
        if self.watchdog.heard(self.now) && self.cache.is_some() {
            self.follow_again();
        }
    }

    /// The mirror follows the store again.
    fn follow_again(&mut self) {
        self.sweeper.health(true, self.instant(self.now));
        self.stale_since = None;
        if std::mem::take(&mut self.stale_fenced) {
            // Its keeper renews again, at once.
            self.out.push(Effect::KeepLeaseAliveNow);
        }
    }

    /// When the watchdog has something to do next.
    pub(super) fn watchdog_wake(&self) -> Option<Micros> {
        self.watchdog.wake(self.watch.is_some())
    }

    /// The instant `micros` of the shared pieces, back as µs of `now`.
    pub(super) fn micros_of(&self, at: tokio::time::Instant) -> Micros {
        at.saturating_duration_since(self.origin).as_micros() as Micros
    }

    /// `d` in µs.
    pub(super) fn micros(d: Duration) -> Micros {
        d.as_micros() as Micros
    }
}
