//! How registrations end and come back in the fleet machine: `Deregister` (every member
//! record of the name marked leaving, with a compare on each: `calls.rs::deregister`), the
//! registrations of ended streams deleted with the leases bound to them once their hold is
//! over (`Departures::due_with` with the fleet's hold rule; `shared/registration.rs::delete`),
//! the sweep of registrations no stream here holds, lost registrations written again where
//! no record is (`cas.rs`'s [`create_bound_txn`]), and a graceful stop.
//!
//! [`create_bound_txn`]: crate::coordinator::shared::cas::create_bound_txn

use super::register::bound_to;
use super::{Instance, Waiting};
use crate::coordinator::CoordinatorError;
use crate::coordinator::causes::{ConsumerUnknown, Contention, EndOfStream};
use crate::coordinator::fleet_backend::records::{FleetKey, MemberRecord};
use crate::coordinator::fleet_backend::register::member_record_of;
use crate::coordinator::fleet_backend::register::{held, registrations_of};
use crate::coordinator::machine::Rebind;
use crate::coordinator::machine::io::{CallId, Effect, EndReason, Micros, Replied, StoreReply, StoreRequest};
use crate::coordinator::machine::observe::Observation;
use crate::coordinator::shared::cas::{CAS_ATTEMPTS, create_bound_txn};
use crate::coordinator::shared::departures::Held;
use crate::coordinator::shared::records::{decode, encode};
use crate::coordinator::shared::streams::{StreamKey, replaced_error};
use crate::proto::v1::DeregisterAction;
use crate::store::{Compare, KeyValue, Op, StoreError, Txn};

/// The first wait before a failed delete of an ended stream's registration is tried again
/// (doubling up to the TTL).
const UNREGISTER_BACKOFF: Micros = 50_000;

/// A `Deregister` between its store calls.
#[derive(Debug)]
pub(in crate::coordinator::fleet_backend) struct LeaveWait {
    call: CallId,
    consumer: String,
    /// The member records of the name still to mark, the first one under way.
    keys: Vec<String>,
    /// Writes of the first one that lost their compare so far.
    attempt: usize,
    stage: LeaveStage,
}

/// What a [`LeaveWait`]'s store call was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaveStage {
    /// Every member record read, to find the name's.
    Members,
    /// The first record read.
    Read,
    /// The first record written leaving.
    Write,
}

/// Where the delete of an ended stream's registration is.
#[derive(Debug)]
pub(in crate::coordinator::fleet_backend) enum Unregistering {
    /// The member record read.
    Member,
    /// The topic's leases read, the member record as found.
    Leases(KeyValue),
    /// The delete sent.
    Delete,
}

impl Instance {
    /// `Deregister` of `consumer`: its records are found in the store (the registration
    /// may have been made a moment ago elsewhere), then marked leaving one by one.
    pub(super) fn deregister(&mut self, call: CallId, consumer: String) {
        if let Err(error) = self.live_lease() {
            return self.reply(call, Err(error));
        }
        let wait = LeaveWait { call, consumer, keys: Vec::new(), attempt: 0, stage: LeaveStage::Members };
        self.request(StoreRequest::GetPrefix(self.keys.all_members()), Waiting::Leave(Box::new(wait)));
    }

    /// Reads the next member record of a `Deregister`, or answers it once all are marked.
    fn leave_next(&mut self, mut wait: LeaveWait) {
        let Some(key) = wait.keys.first().cloned() else {
            return self.reply(wait.call, Ok(Replied::Deregistered(DeregisterAction::ShutdownNow)));
        };
        wait.stage = LeaveStage::Read;
        self.request(StoreRequest::Get(vec![key]), Waiting::Leave(Box::new(wait)));
    }

    /// What the store answered a `Deregister`'s call.
    pub(super) fn leave_answered(&mut self, mut wait: LeaveWait, answer: Result<StoreReply, StoreError>) {
        match (wait.stage, answer) {
            (LeaveStage::Members, Ok(StoreReply::Prefix(members))) => {
                let ours = |kv: &&KeyValue| matches!(self.keys.parse(&kv.key), Some(FleetKey::Member(_, name)) if name == wait.consumer);
                wait.keys = members.kvs.iter().filter(ours).map(|kv| kv.key.clone()).collect();
                if wait.keys.is_empty() {
                    let consumer = wait.consumer.clone();
                    let error =
                        CoordinatorError::UnknownConsumer(ConsumerUnknown::NotRegistered { consumer });
                    return self.reply(wait.call, Err(error));
                }
                self.leave_next(wait)
            }
            (LeaveStage::Read, Ok(StoreReply::Values(mut found))) => {
                let record = found.pop().flatten().and_then(|kv| {
                    let record = decode::<MemberRecord>(&kv.key, &kv.value).ok()?;
                    Some((kv, record))
                });
                match record {
                    // Gone (the session ended: its leases are free), or marked already.
                    None => self.leave_done_one(wait),
                    Some((_, record)) if record.leaving => self.leave_done_one(wait),
                    Some((kv, mut record)) => {
                        record.leaving = true;
                        let op = match kv.session {
                            Some(session) => Op::put_in(&kv.key, encode(&record), session),
                            None => Op::put(&kv.key, encode(&record)),
                        };
                        let txn =
                            Txn::new().when(Compare::ModRevision(kv.key.clone(), kv.mod_revision)).then(op);
                        wait.stage = LeaveStage::Write;
                        self.request(StoreRequest::Txn(txn), Waiting::Leave(Box::new(wait)));
                    }
                }
            }
            (LeaveStage::Write, Ok(StoreReply::Txn(outcome))) if outcome.succeeded => {
                self.leave_done_one(wait)
            }
            (LeaveStage::Write, Ok(StoreReply::Txn(_))) => {
                wait.attempt += 1;
                if wait.attempt >= CAS_ATTEMPTS {
                    let consumer = wait.consumer.clone();
                    let error = CoordinatorError::Contended(Contention::Consumer { consumer });
                    return self.reply(wait.call, Err(error));
                }
                self.leave_next(wait)
            }
            // The instance lease ended meanwhile: the record and its leases are gone already.
            (_, Err(StoreError::SessionExpired(_))) if wait.stage == LeaveStage::Write => {
                self.leave_done_one(wait)
            }
            (_, Err(error)) => self.reply(wait.call, Err(error.into())),
            (_, Ok(_)) => {
                let error = StoreError::Invalid(crate::store::Malformed::WrongAnswerKind);
                self.reply(wait.call, Err(error.into()))
            }
        }
    }

    /// The first record of a `Deregister` is marked (or gone): on to the next.
    fn leave_done_one(&mut self, mut wait: LeaveWait) {
        wait.keys.remove(0);
        wait.attempt = 0;
        self.leave_next(wait)
    }

    /// What is due at `now` beside the inputs: the watchdog, a re-read to try again, the
    /// stale fence, the registrations of ended streams, the sweep, the lost registrations.
    pub(super) fn upkeep(&mut self) {
        let now = self.now;
        self.expire_requests();
        self.check_silence();
        if self.reread_at.is_some_and(|at| now >= at) {
            self.reread();
        }
        self.fence_if_stale();
        if let Some(cache) = self.cache.as_ref() {
            let at = self.instant(now);
            let due = self.departures.due_with(held, cache, at, now / 1000);
            for key in due {
                // In flight: the sweep leaves it to this delete (and its retries).
                self.unregistering.insert(key.clone(), (Micros::MAX, 0));
                self.unregister(key);
            }
        }
        let retries: Vec<StreamKey> =
            self.unregistering.iter().filter(|(_, (at, _))| now >= *at).map(|(key, _)| key.clone()).collect();
        for key in retries {
            if let Some((at, _)) = self.unregistering.get_mut(&key) {
                *at = Micros::MAX; // in flight
            }
            self.unregister(key);
        }
        self.sweep();
        self.rebind_lost();
    }

    /// Starts deleting the registration `key` with the leases bound to it.
    fn unregister(&mut self, key: StreamKey) {
        let record_key = self.keys.member(&key.0, &key.1);
        self.request(StoreRequest::Get(vec![record_key]), Waiting::Unregister(key, Unregistering::Member));
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
            self.sweeping.insert(key.clone());
            self.unregister(key);
        }
    }

    /// The delete of the registration `key`: its record read, then the topic's leases,
    /// then the record and the leases of the name deleted in one transaction, each compared
    /// with its mod revision, if the record is still this registration.
    pub(super) fn unregister_answered(
        &mut self,
        key: StreamKey,
        stage: Unregistering,
        answer: Result<StoreReply, StoreError>,
    ) {
        match (stage, answer) {
            (Unregistering::Member, Ok(StoreReply::Values(mut records))) => {
                let found = records.pop().flatten().filter(|kv| {
                    decode::<MemberRecord>(&kv.key, &kv.value).is_ok_and(|r| r.session == key.2.0)
                });
                let Some(kv) = found else {
                    // Gone, or another registration's now: nothing of this one to delete.
                    self.unregistering.remove(&key);
                    self.sweeping.remove(&key);
                    return;
                };
                let leases = self.keys.leases(&key.0);
                self.request(
                    StoreRequest::GetPrefix(leases),
                    Waiting::Unregister(key, Unregistering::Leases(kv)),
                );
            }
            (Unregistering::Leases(member), Ok(StoreReply::Prefix(leases))) => {
                let mut txn = Txn::new()
                    .when(Compare::ModRevision(member.key.clone(), member.mod_revision))
                    .then(Op::delete(&member.key));
                for lease in leases.kvs.iter().filter(|kv| bound_to(&key.1, kv)) {
                    txn = txn
                        .when(Compare::ModRevision(lease.key.clone(), lease.mod_revision))
                        .then(Op::delete(&lease.key));
                }
                self.request(StoreRequest::Txn(txn), Waiting::Unregister(key, Unregistering::Delete));
            }
            // Changed since it was read: read again.
            (Unregistering::Delete, Ok(StoreReply::Txn(outcome))) if !outcome.succeeded => {
                self.unregister(key)
            }
            (Unregistering::Delete, Ok(StoreReply::Txn(_))) => {
                self.unregistering.remove(&key);
                if self.sweeping.remove(&key) {
                    let (topic, consumer) = (key.0, key.1);
                    self.out.push(Effect::Observe(Observation::Swept { topic, consumer }));
                }
            }
            // Retried with backoff while the store is out of reach: a registration left
            // behind would keep its partitions.
            _ => {
                let ttl = self.ttl_micros();
                let backoff = self
                    .unregistering
                    .get(&key)
                    .map_or(UNREGISTER_BACKOFF, |(_, b)| (*b * 2).clamp(UNREGISTER_BACKOFF, ttl));
                self.unregistering.insert(key, (self.now + backoff, backoff));
            }
        }
    }

    /// Writes again the registrations the store lost while their streams are open, bound to
    /// the live lease, only where no record is; a stream whose registration could not be
    /// written again within one TTL ends. The leases went with the lost session: the claim
    /// step claims again.
    fn rebind_lost(&mut self) {
        let ttl = self.ttl_micros();
        let lost: Vec<(StreamKey, Micros, bool)> = self
            .lost
            .iter()
            .filter_map(|name| {
                let s = self.streams.get(name)?;
                Some((s.key(name), s.lost_since?, s.rebinding))
            })
            .collect();
        for (key, since, rebinding) in lost {
            if self.now >= since + ttl {
                let (topic, consumer) = (key.0.clone(), key.1.clone());
                let error =
                    CoordinatorError::StreamEnded(EndOfStream::RegistrationExpired { consumer, topic });
                self.farewell_and_end(&key, (EndReason::Expired, Some(error)));
                continue;
            }
            let Some(lease) = self.lease.live().filter(|_| !rebinding) else { continue };
            if let Some(stream) = self.streams.get_mut(&(key.0.clone(), key.1.clone())) {
                stream.rebinding = true;
            }
            let record = member_record_of(&self.config.instance_id, key.2, 0, Default::default());
            let txn = create_bound_txn(&self.keys.member(&key.0, &key.1), encode(&record), lease);
            self.request(StoreRequest::Txn(txn), Waiting::Rebind(key));
        }
    }

    /// The answer to a rebind: written (the stream goes on, registered at the new
    /// revision), or found taken (read: ours after a lost answer, or another
    /// registration's, which wins).
    pub(super) fn rebind_answered(&mut self, key: StreamKey, answer: Result<StoreReply, StoreError>) {
        let name = (key.0.clone(), key.1.clone());
        let rebound = |me: &mut Self, revision| {
            // The mirror already saw the record written and deleted again: still lost,
            // written again at the next upkeep.
            let gone_again = me.cache.as_ref().is_some_and(|cache| {
                cache.revision >= revision
                    && cache.topics.get(&name.0).is_none_or(|t| !t.members.contains_key(&name.1))
            });
            let open = me.streams.get(&name).is_some_and(|s| s.registration == key.2);
            if gone_again && open {
                return me.unmark_rebinding(&name);
            }
            match me.streams.get_mut(&name).filter(|s| s.registration == key.2) {
                Some(stream) => {
                    stream.lost_since = None;
                    stream.rebinding = false;
                    stream.registered_at = revision;
                    // Its leases went with the lost session: it claims again once the
                    // cache holds the record written again.
                    stream.claimer.rebound(revision);
                    me.lost.remove(&name);
                }
                // Its consumer went away meanwhile: settled as after any disconnect.
                None => me.depart(key.clone(), revision),
            }
        };
        let ours = |kv: &crate::store::KeyValue| {
            decode::<MemberRecord>(&kv.key, &kv.value).is_ok_and(|r| r.session == key.2.0)
        };
        match Rebind::of(answer, ours) {
            Rebind::Rebound(revision) => rebound(self, revision),
            Rebind::ReadBack => {
                let record_key = self.keys.member(&key.0, &key.1);
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

    /// A graceful stop: every stream ends `UNAVAILABLE` (registrations kept for the TTL);
    /// what is in flight is still answered.
    pub(super) fn stop(&mut self) {
        if self.stopping {
            return;
        }
        self.stopping = true;
        let instance = self.config.instance_id.clone();
        let keys: Vec<StreamKey> = self.streams.iter().map(|(name, s)| s.key(name)).collect();
        for key in keys {
            let error = CoordinatorError::StreamEnded(EndOfStream::Shutdown { instance: instance.clone() });
            self.end_stream(&key, (EndReason::Shutdown, Some(error)));
        }
    }

    /// When the instance has something to do next if no input comes.
    pub(super) fn next_wake(&self) -> Option<Micros> {
        let ttl = self.ttl_micros();
        let lost =
            self.lost.iter().filter_map(|name| self.streams.get(name)?.lost_since.map(|since| since + ttl));
        let retries = self.unregistering.values().map(|(at, _)| *at).filter(|at| *at != Micros::MAX);
        let departures = self.departures.wake_at().map(|at| self.micros_of(at));
        let sweep = Some(self.micros_of(self.sweeper.next_sweep()));
        [departures, self.reread_at, self.stale_wake(), sweep, self.watchdog_wake(), self.claim_wake()]
            .into_iter()
            .flatten()
            .chain(lost)
            .chain(retries)
            .chain(self.refresh_wake())
            .min()
    }
}
