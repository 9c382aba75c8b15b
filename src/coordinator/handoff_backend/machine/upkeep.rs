//! What the state machine keeps up beside the calls: the mirror (the first read, the
//! watch, a re-read after the watch broke), the instance lease as reported (self-fencing:
//! [`fences_streams`]; the instance record), an instance that cannot follow its store
//! fencing its streams ([`stale_fence_due`]), the registrations of ended streams settled
//! ([`Departures::due_with`] with the backend's hold rule), lost registrations written
//! again (`shared/cas.rs`'s [`create_bound_txn`]), the timer, and a graceful stop.
//!
//! [`Departures::due_with`]: crate::coordinator::shared::departures::Departures::due_with

use crate::coordinator::causes::{EndOfStream, Fence};
use std::time::Duration;

use super::leader::LeaderState;
use super::{Instance, Waiting, expect};
use crate::coordinator::CoordinatorError;
use crate::coordinator::handoff_backend::leader::election::resignation_txn;
use crate::coordinator::handoff_backend::records::{ConsumerRecord, decode, encode};
use crate::coordinator::handoff_backend::register::{
    active_record, cached_registration, held, registrations_of,
};
use crate::coordinator::handoff_backend::state::Cache;
use crate::coordinator::machine::Rebind;
use crate::coordinator::machine::io::{Effect, EndReason, LeaseState, Micros, StoreReply, StoreRequest};
use crate::coordinator::machine::observe::Observation;
use crate::coordinator::shared::cas::create_bound_txn;
use crate::coordinator::shared::departures::Held;
use crate::coordinator::shared::instance_record::{instance_key, instance_record_txn};
use crate::coordinator::shared::lease::{fence_after, fences_streams};
use crate::coordinator::shared::mirror::{
    Changes, MirrorCache, apply_watched, reread_changes, snapshot_regresses,
};
use crate::coordinator::shared::streams::{StreamKey, replaced_error};
use crate::coordinator::shared::upkeep::stale_fence_due;
use crate::store::{Compare, Op, StoreError, Txn, WatchBatch};

/// The first wait before a failed delete of an ended stream's registration is tried again
/// (doubling up to the TTL).
const UNREGISTER_BACKOFF: Micros = 50_000;

/// How long a failed re-read waits before it is tried again.
const REREAD_AFTER: Micros = 100_000;

impl Instance {
    /// Reads the whole prefix (the first load, or closing a gap in the watch).
    pub(super) fn reread(&mut self) {
        self.reread_at = None;
        self.request(StoreRequest::GetPrefix(self.keys.prefix().to_string()), Waiting::Reread);
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
            && snapshot_regresses(snapshot.revision, cache.revision, self.ahead)
        {
            // Older than what the cache holds (an own write applied meanwhile): taking it
            // would move the consumers back. Read again.
            return self.reread();
        }
        let from = snapshot.revision + 1;
        let mut fresh = Cache::from_snapshot(&self.keys, snapshot);
        let changes = match self.cache.take() {
            Some(old) => {
                old.carry_over(&mut fresh);
                reread_changes(&old, &fresh)
            }
            None => Changes::default(),
        };
        self.cache = Some(fresh);
        self.cache_loads += 1;
        if !self.watchdog.unproven() {
            self.follow_again();
        }
        self.poke_leaders();
        self.relay(&changes);
        let watch = self
            .request(StoreRequest::Watch { prefix: self.keys.prefix().to_string(), from }, Waiting::Watch);
        self.watch = Some(watch);
        self.watchdog.opened(self.now);
    }

    /// The answer to starting the watch: an error ends it.
    pub(super) fn watch_answered(&mut self, request: u64, answer: Result<StoreReply, StoreError>) {
        match answer {
            Err(error) => self.watch_ended(request, error),
            Ok(_) if self.watch == Some(request) => self.watchdog.opened(self.now),
            Ok(_) => {}
        }
    }

    /// One watched revision: applied to the cache (unless the cache has it already, an
    /// own write applied ahead) and relayed.
    pub(super) fn watched(&mut self, watch: u64, batch: WatchBatch) {
        if self.watch != Some(watch) {
            return;
        }
        self.heard_from_watch();
        let Some(cache) = self.cache.as_mut() else { return };
        // A progress mark, or a revision already applied as an own write.
        if batch.events.is_empty() || batch.revision <= cache.revision {
            return;
        }
        let mut changes = Changes::default();
        apply_watched(cache, &self.keys, batch.revision, batch.events, self.ahead, &mut changes);
        self.relay(&changes);
    }

    /// The watch ended: the view has a gap, closed by a re-read; until then the mirror does
    /// not follow the store.
    pub(super) fn watch_ended(&mut self, watch: u64, _error: StoreError) {
        if self.watch != Some(watch) {
            return;
        }
        self.watch = None;
        self.interruptions += 1;
        self.stale_since.get_or_insert(self.now);
        self.sweeper.health(false, self.instant(self.now));
        self.poke_leaders();
        self.reread();
    }

    /// The lease keeper reported `state`.
    pub(super) fn lease_reported(&mut self, state: LeaseState) {
        let before = std::mem::replace(&mut self.lease, state);
        self.poke_leaders();
        if matches!(state, LeaseState::Fenced(_)) && !matches!(before, LeaseState::Fenced(_)) {
            if fences_streams() {
                self.fence_all(Fence::SessionLost { instance: self.config.instance_id.clone() });
            }
            for g in 0..self.leaders.len() {
                if let Some(fence) = self.leaders[g].fence
                    && self.lease.live() != Some(fence.session)
                {
                    self.step_down(g);
                }
            }
        }
        if let Some(session) = state.live().filter(|s| self.recorded != Some(*s)) {
            let key = instance_key(self.keys.prefix(), &self.config.instance_id);
            let txn = instance_record_txn(&key, &self.config.instance_id, self.config.leader_groups, session);
            self.request(StoreRequest::Txn(txn), Waiting::Record(session));
        }
    }

    /// What is due at `now` beside the inputs: a re-read to try again, the fence of an
    /// instance that cannot follow its store, the registrations of ended streams, the lost
    /// registrations.
    pub(super) fn upkeep(&mut self) {
        let now = self.now;
        self.expire_requests();
        self.check_silence();
        if self.reread_at.is_some_and(|at| now >= at) {
            self.reread();
        }
        if let Some(since) = self.stale_since
            && !self.stale_fenced
            && stale_fence_due(self.instant(since), self.instant(now), self.config.lease_ttl)
        {
            self.stale_fenced = true;
            self.fence_all(Fence::CannotFollow { instance: self.config.instance_id.clone() });
        }
        if let Some(cache) = self.cache.as_ref() {
            let at = self.instant(now);
            for key in self.departures.due_with(held, cache, at, self.now_ms()) {
                // In flight: the sweep leaves it to this delete (and its retries).
                self.unregistering.insert(key.clone(), (Micros::MAX, 0));
                let record_key = self.keys.consumer(&key.0, &key.1);
                self.request(StoreRequest::Get(vec![record_key]), Waiting::Unregister(key, None));
            }
        }
        let retries: Vec<StreamKey> =
            self.unregistering.iter().filter(|(_, (at, _))| now >= *at).map(|(key, _)| key.clone()).collect();
        for key in retries {
            if let Some((at, _)) = self.unregistering.get_mut(&key) {
                *at = Micros::MAX; // in flight
            }
            let record_key = self.keys.consumer(&key.0, &key.1);
            self.request(StoreRequest::Get(vec![record_key]), Waiting::Unregister(key, None));
        }
        self.sweep();
        self.rebind_lost();
    }

    /// The sweep, a safety net: a registration naming this instance that no stream here
    /// holds, still found a TTL and a half later, is deleted if it is still that one.
    fn sweep(&mut self) {
        let at = self.instant(self.now);
        let Some(cache) = self.cache.as_ref() else {
            // Nothing loaded, nothing to sweep; its timer moves on all the same: left due, it
            // held the instance's wake in the past, and what fell due later (a request's
            // deadline) was not woken for.
            let _ = self.sweeper.sweep_due(at, Vec::new);
            return;
        };
        let (streams, departures, instance) = (&self.streams, &self.departures, &self.config.instance_id);
        let unregistering = &self.unregistering;
        let holds = |key: &StreamKey| {
            departures.contains(key)
                || unregistering.contains_key(key)
                || streams.get(&(key.0.clone(), key.1.clone())).is_some_and(|s| s.registration == key.2)
        };
        let found = || {
            registrations_of(cache, instance)
                .into_iter()
                .filter(|key| !holds(key) && held(cache, key) == Held::ForTtl)
                .collect()
        };
        for key in self.sweeper.sweep_due(at, found) {
            let record_key = self.keys.consumer(&key.0, &key.1);
            self.sweeping.insert(key.clone());
            self.request(StoreRequest::Get(vec![record_key]), Waiting::Unregister(key, None));
        }
    }

    /// The registration `key` of an ended stream: read, then deleted if it is still that
    /// registration (compare on its mod revision).
    pub(super) fn unregister_answered(
        &mut self,
        key: StreamKey,
        deleting: Option<Txn>,
        answer: Result<StoreReply, StoreError>,
    ) {
        // Retried with backoff while the store is out of reach: a registration left behind
        // would keep its partitions.
        let retry_later = |me: &mut Self, key: StreamKey| {
            let backoff = me.unregistering.get(&key).map_or(UNREGISTER_BACKOFF, |(_, b)| {
                (*b * 2).clamp(UNREGISTER_BACKOFF, me.config.lease_ttl_micros())
            });
            me.unregistering.insert(key, (me.now + backoff, backoff));
        };
        match (deleting, answer) {
            (None, Ok(StoreReply::Values(mut records))) => {
                let found = records.pop().flatten();
                let Some(kv) = found.filter(|kv| {
                    decode::<ConsumerRecord>(&kv.key, &kv.value).is_ok_and(|r| r.session == key.2.0)
                }) else {
                    // Gone, or another registration's now: nothing of this one to delete.
                    self.unregistering.remove(&key);
                    self.sweeping.remove(&key);
                    return;
                };
                let txn = Txn::new()
                    .when(Compare::ModRevision(kv.key.clone(), kv.mod_revision))
                    .then(Op::delete(&kv.key));
                self.request(StoreRequest::Txn(txn.clone()), Waiting::Unregister(key, Some(txn)));
            }
            (Some(_), Ok(StoreReply::Txn(outcome))) if !outcome.succeeded => {
                // Changed since it was read: read again.
                let record_key = self.keys.consumer(&key.0, &key.1);
                self.request(StoreRequest::Get(vec![record_key]), Waiting::Unregister(key, None));
            }
            (Some(_), Ok(StoreReply::Txn(_))) => {
                self.unregistering.remove(&key);
                if self.sweeping.remove(&key) {
                    let (topic, consumer) = (key.0, key.1);
                    self.out.push(Effect::Observe(Observation::Swept { topic, consumer }));
                }
            }
            (_, _) => retry_later(self, key),
        }
    }

    /// Writes again the registrations the store lost while their streams are open, bound to
    /// the live lease, only where no record is; a stream whose registration could not be
    /// written again within one TTL ends.
    fn rebind_lost(&mut self) {
        let ttl = self.config.lease_ttl_micros();
        let lost: Vec<(StreamKey, Micros, bool)> = self
            .lost
            .iter()
            .filter_map(|name| {
                let s = self.streams.get(name)?;
                Some(((name.0.clone(), name.1.clone(), s.registration), s.lost_since?, s.rebinding))
            })
            .collect();
        for (key, since, rebinding) in lost {
            if self.now >= since + ttl {
                let (topic, consumer) = (&key.0, &key.1);
                let error = CoordinatorError::StreamEnded(EndOfStream::RegistrationExpired {
                    consumer: consumer.clone(),
                    topic: topic.clone(),
                });
                self.farewell_and_end(&key, (EndReason::Expired, Some(error)));
                continue;
            }
            let Some(lease) = self.lease.live().filter(|_| !rebinding) else { continue };
            let mut kept = None;
            if let Some(stream) = self.streams.get_mut(&(key.0.clone(), key.1.clone())) {
                stream.rebinding = true;
                kept = stream.kept.as_ref().map(|(_, record)| record.clone());
            }
            let record_key = self.keys.consumer(&key.0, &key.1);
            // As the record said when this instance last saw it (a draining consumer still
            // drains), else as a fresh registration.
            let record = kept.unwrap_or_else(|| encode(&active_record(&self.config, &key.1, key.2, 0)));
            let txn = create_bound_txn(&record_key, record, lease);
            self.request(StoreRequest::Txn(txn), Waiting::Rebind(key));
        }
    }

    /// The answer to a rebind: written (the stream goes on, registered at the new
    /// revision), or found taken (read: ours after a lost answer, or another
    /// registration's, which wins).
    pub(super) fn rebind_answered(&mut self, key: StreamKey, answer: Result<StoreReply, StoreError>) {
        let name = (key.0.clone(), key.1.clone());
        let rebound = |me: &mut Self, revision| {
            // The mirror already saw the record written and deleted again (the new session
            // revoked too): still lost, written again at the next upkeep.
            let gone_again = me.cache.as_ref().is_some_and(|cache| {
                cache.revision >= revision && cached_registration(cache, &name.0, &name.1) == 0
            });
            if gone_again && me.streams.get(&name).is_some_and(|s| s.registration == key.2) {
                me.unmark_rebinding(&name);
                return;
            }
            if let Some(stream) = me.streams.get_mut(&name).filter(|s| s.registration == key.2) {
                stream.lost_since = None;
                me.lost.remove(&name);
                stream.rebinding = false;
                stream.registered_at = revision;
            } else {
                // Its consumer went away meanwhile: the record written again is settled as
                // after any disconnect (`shared/rebind.rs::rebound`), not left behind.
                me.depart(key.clone(), revision);
            }
        };
        let ours = |kv: &crate::store::KeyValue| {
            decode::<ConsumerRecord>(&kv.key, &kv.value).is_ok_and(|r| r.session == key.2.0)
        };
        match Rebind::of(answer, ours) {
            Rebind::Rebound(revision) => rebound(self, revision),
            Rebind::ReadBack => {
                let record_key = self.keys.consumer(&key.0, &key.1);
                self.request(StoreRequest::Get(vec![record_key]), Waiting::Rebind(key));
            }
            Rebind::Taken => {
                let error = replaced_error(&key.0, &key.1);
                self.farewell_and_end(&key, (EndReason::Replaced, Some(error)));
            }
            // Gone again meanwhile, or no answer: the next upkeep writes it again.
            Rebind::Again => self.unmark_rebinding(&name),
        }
    }

    fn unmark_rebinding(&mut self, name: &(String, String)) {
        if let Some(stream) = self.streams.get_mut(name) {
            stream.rebinding = false;
        }
    }

    /// A graceful stop: every stream ends `UNAVAILABLE` (registrations kept for the TTL),
    /// leadership is resigned; what is in flight is still answered.
    pub(super) fn stop(&mut self) {
        if self.stopping {
            return;
        }
        self.stopping = true;
        let instance = self.config.instance_id.clone();
        let streams: Vec<StreamKey> =
            self.streams.iter().map(|((t, c), s)| (t.clone(), c.clone(), s.registration)).collect();
        for key in streams {
            let error = CoordinatorError::StreamEnded(EndOfStream::Shutdown { instance: instance.clone() });
            self.end_stream(&key, (EndReason::Shutdown, Some(error)));
        }
        for g in 0..self.leaders.len() {
            if let Some(fence) = self.leaders[g].fence {
                let txn = resignation_txn(&self.keys, self.leaders[g].group(), fence);
                self.request(StoreRequest::Txn(txn), Waiting::Resign);
                self.step_down(g);
            }
        }
    }

    /// When the instance has something to do next if no input comes.
    pub(super) fn next_wake(&self) -> Option<Micros> {
        let micros =
            |at: tokio::time::Instant| at.saturating_duration_since(self.origin).as_micros() as Micros;
        let ttl = self.config.lease_ttl_micros();
        let stale = self
            .stale_since
            .filter(|_| !self.stale_fenced)
            .map(|since| since + fence_after(Duration::from_micros(ttl)).as_micros() as Micros);
        let lost =
            self.lost.iter().filter_map(|name| self.streams.get(name)?.lost_since.map(|since| since + ttl));
        let sweep = Some(micros(self.sweeper.next_sweep()));
        let retries = self.unregistering.values().map(|(at, _)| *at).filter(|at| *at != Micros::MAX);
        let watchdog = self.watchdog_wake();
        [self.departures.wake_at().map(micros), self.reread_at, stale, sweep, watchdog]
            .into_iter()
            .flatten()
            // The leaders look only once the cache is loaded: their timers wait for it.
            // A look is held back by the planning budget: its timer is never before the
            // budget allows (a time already past, not acted on and said again unchanged,
            // would leave the driver with no timer at all).
            .chain(
                self.leaders
                    .iter()
                    .filter(|_| self.cache.is_some())
                    .filter_map(LeaderState::wake_at)
                    .map(|at| at.max(self.pacing.until())),
            )
            .chain(self.refresh_wake())
            .chain(self.weights_wake())
            .chain(self.pacing.wake_at(self.now))
            .chain(lost)
            .chain(retries)
            .min()
    }
}

impl crate::coordinator::handoff_backend::HandoffConfig {
    /// The lease TTL in µs.
    pub(super) fn lease_ttl_micros(&self) -> Micros {
        self.lease_ttl.as_micros() as Micros
    }
}
