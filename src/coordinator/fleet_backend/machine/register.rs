//! `Register` in the fleet machine, decided on the store's state as the running fleet's
//! registration decides it (`shared/registration.rs::write`): the topic's record made sure
//! of, then the member record read, then the topic's leases (and, for a new incarnation,
//! its epoch floors); the member record is written bound to the instance lease with a
//! compare on the record as read, the leases bound to the earlier registration move to
//! the new one in the same transaction (a reconnect keeps its partitions), and a new
//! incarnation's epochs are raised there too (`claim_decide::raise_txns`). A write that
//! lost its compare is decided again on a fresh read.

use std::collections::HashSet;

use super::{Instance, Waiting, expect, txn_outcome};
use crate::coordinator::CoordinatorError;
use crate::coordinator::causes::{Contention, SessionMissing};
use crate::coordinator::fleet_backend::claim_decide::raise_txns;
use crate::coordinator::fleet_backend::records::{LeaseRecord, MemberRecord};
use crate::coordinator::fleet_backend::register::member_record_of;
use crate::coordinator::fleet_backend::state::FleetCache;
use crate::coordinator::machine::io::{
    CallId, Effect, Replied, RequestId, StoreReply, StoreRequest, StreamId,
};
use crate::coordinator::machine::registration_id;
use crate::coordinator::shared::admits;
use crate::coordinator::shared::cas::CAS_ATTEMPTS;
use crate::coordinator::shared::departures::Departed;
use crate::coordinator::shared::mirror::MirrorCache;
use crate::coordinator::shared::records::{decode, encode};
use crate::coordinator::shared::registration::is_same_process;
use crate::coordinator::shared::streams::StreamKey;
use crate::coordinator::shared::topics::{Counted, count_to_store, no_count, topic_txn};
use crate::coordinator::shared::validate::{validate_consumer_name, validate_topic_name};
use crate::store::{Compare, KeyValue, Op, PrefixSnapshot, Revision, SessionId, StoreError, Txn};

/// A `Register` between its store calls.
#[derive(Debug)]
pub(in crate::coordinator::fleet_backend) struct Enrolling {
    call: CallId,
    stream: StreamId,
    /// Topic, consumer and the fresh registration id.
    key: StreamKey,
    /// The instance lease it is written on.
    lease: SessionId,
    incarnation: u64,
    /// Writes that lost their compare so far.
    attempt: usize,
    stage: Stage,
}

/// What an [`Enrolling`]'s store call was.
#[derive(Debug)]
enum Stage {
    /// The topic's record written.
    Topic,
    /// The topic's partition count asked of the source.
    Source,
    /// The member record read.
    Member,
    /// The topic's leases read, after the member record (`existing`: its mod revision, 0
    /// when none; `same_process`: it is the same client process').
    Leases { existing: Revision, same_process: bool },
    /// The topic's epoch floors read, after its leases.
    Floors { existing: Revision, leases: PrefixSnapshot },
    /// The registration written.
    Written { same_process: bool },
}

impl Instance {
    /// A `Register` of `consumer` on `topic` for the stream `stream`.
    pub(super) fn register(
        &mut self,
        call: CallId,
        stream: StreamId,
        consumer: String,
        topic: String,
        incarnation: u64,
    ) {
        let checked = validate_consumer_name(&consumer).and_then(|()| validate_topic_name(&topic));
        let lease = match checked.and_then(|()| self.live_lease()) {
            Ok(lease) => lease,
            Err(error) => return self.reply(call, Err(error)),
        };
        let key = (topic, consumer, self.registration_id());
        let enrolling = Enrolling { call, stream, key, lease, incarnation, attempt: 0, stage: Stage::Topic };
        self.ensure_topic(enrolling, None);
    }

    /// A fresh registration id ([`registration_id`]).
    fn registration_id(&mut self) -> SessionId {
        self.registrations += 1;
        registration_id(&self.config.instance_id, self.nonce, self.registrations)
    }

    /// Makes sure the topic of `enrolling` has a stored count (`from_source`: the source's
    /// answer, once asked), then reads its member record.
    fn ensure_topic(&mut self, mut enrolling: Enrolling, from_source: Option<u32>) {
        let topic = enrolling.key.0.clone();
        let Some(cache) = self.cache.as_ref() else {
            let error = StoreError::Unavailable(crate::store::Unreachable::NotLoaded);
            return self.reply(enrolling.call, Err(error.into()));
        };
        let configured = self.config.topic_partitions.get(&topic).copied();
        let counted = count_to_store(cache.topic_count(&topic), configured, from_source);
        let leads = match counted {
            Counted::Write(..) => true,
            Counted::AskSource => self.config.kafka.is_some(),
            Counted::Stored(_) => false,
        };
        if leads && from_source.is_none() {
            // One write (or question to Kafka) for all the registrations of the topic.
            let Some(lead) = self.topic_waits.lead_or_wait(&topic, enrolling) else { return };
            enrolling = lead;
        }
        match counted {
            Counted::Stored(_) if from_source.is_some() => {
                // Stored meanwhile: the waiters go on too.
                self.topic_settled(&topic, Ok(()));
                self.read_member(enrolling)
            }
            Counted::Stored(_) => self.read_member(enrolling),
            Counted::Write(count, revision) => {
                let txn = topic_txn(&self.keys.topic(&topic), count, revision, None);
                enrolling.stage = Stage::Topic;
                self.request(StoreRequest::Txn(txn), Waiting::Register(Box::new(enrolling)));
            }
            Counted::AskSource if self.config.kafka.is_none() => {
                self.reply(enrolling.call, Err(no_count(&topic)))
            }
            Counted::AskSource => {
                enrolling.stage = Stage::Source;
                let request = self.next_request;
                self.next_request += 1;
                self.waiting.insert(request, Waiting::Register(Box::new(enrolling)));
                self.out.push(Effect::LookUpPartitions { request, topic });
            }
        }
    }

    /// The source's answer to a partition count asked for a `Register`.
    pub(super) fn partition_count(&mut self, request: RequestId, answer: Result<u32, CoordinatorError>) {
        let enrolling = match self.waiting.remove(&request) {
            Some(Waiting::Register(enrolling)) => enrolling,
            Some(Waiting::Refresh(round)) => return self.refresh_counted(round, answer),
            _ => return,
        };
        match answer {
            Ok(count) => self.ensure_topic(*enrolling, Some(count)),
            Err(error) => {
                self.topic_settled(&enrolling.key.0, Err(error.clone()));
                self.reply(enrolling.call, Err(error))
            }
        }
    }

    /// The topic's record was made sure of (or could not be): the registrations that
    /// waited for it go on, or are answered why not.
    fn topic_settled(&mut self, topic: &str, result: Result<(), CoordinatorError>) {
        for waiter in self.topic_waits.done(topic) {
            match &result {
                Ok(()) => self.read_member(waiter),
                Err(error) => self.reply(waiter.call, Err(error.clone())),
            }
        }
    }

    /// Reads the member record of `enrolling` (each attempt decides on a fresh read).
    fn read_member(&mut self, mut enrolling: Enrolling) {
        if let Err(error) = self.live_lease() {
            return self.reply(enrolling.call, Err(error));
        }
        enrolling.stage = Stage::Member;
        let key = self.keys.member(&enrolling.key.0, &enrolling.key.1);
        self.request(StoreRequest::Get(vec![key]), Waiting::Register(Box::new(enrolling)));
    }

    /// What the store answered a `Register`'s call.
    pub(super) fn register_answered(
        &mut self,
        mut enrolling: Enrolling,
        answer: Result<StoreReply, StoreError>,
    ) {
        let stage = std::mem::replace(&mut enrolling.stage, Stage::Topic);
        let topic = enrolling.key.0.clone();
        match stage {
            Stage::Topic | Stage::Source => match txn_outcome(answer) {
                // Stored here or by someone else meanwhile: the watch brings the record.
                Ok(_) => {
                    self.read_member(enrolling);
                    self.topic_settled(&topic, Ok(()));
                }
                Err(error) => {
                    let error = CoordinatorError::from(error);
                    self.topic_settled(&topic, Err(error.clone()));
                    self.reply(enrolling.call, Err(error))
                }
            },
            Stage::Member => match expect(answer, |r| match r {
                StoreReply::Values(mut v) if v.len() == 1 => v.pop(),
                _ => None,
            }) {
                Ok(stored) => {
                    let existing = stored.as_ref().map_or(0, |kv| kv.mod_revision);
                    let stored_incarnation = stored
                        .as_ref()
                        .and_then(|kv| decode::<MemberRecord>(&kv.key, &kv.value).ok())
                        .map_or(0, |r| r.incarnation);
                    let same_process = is_same_process(enrolling.incarnation, stored_incarnation);
                    enrolling.stage = Stage::Leases { existing, same_process };
                    let leases = self.keys.leases(&topic);
                    self.request(StoreRequest::GetPrefix(leases), Waiting::Register(Box::new(enrolling)));
                }
                Err(error) => self.reply(enrolling.call, Err(error.into())),
            },
            Stage::Leases { existing, same_process } => match prefix(answer) {
                Ok(leases) if same_process => self.write_registration(enrolling, existing, leases, None),
                Ok(leases) => {
                    enrolling.stage = Stage::Floors { existing, leases };
                    let floors = self.keys.epochs(&topic);
                    self.request(StoreRequest::GetPrefix(floors), Waiting::Register(Box::new(enrolling)));
                }
                Err(error) => self.reply(enrolling.call, Err(error.into())),
            },
            Stage::Floors { existing, leases } => match prefix(answer) {
                Ok(floors) => self.write_registration(enrolling, existing, leases, Some(floors)),
                Err(error) => self.reply(enrolling.call, Err(error.into())),
            },
            Stage::Written { same_process } => match txn_outcome(answer) {
                Ok(outcome) if outcome.succeeded => {
                    self.registered(enrolling, outcome.revision, same_process)
                }
                Ok(_) => {
                    enrolling.attempt += 1;
                    if enrolling.attempt >= CAS_ATTEMPTS {
                        let consumer = enrolling.key.1.clone();
                        let error = CoordinatorError::Contended(Contention::RegisteredElsewhere { consumer });
                        return self.reply(enrolling.call, Err(error));
                    }
                    self.read_member(enrolling);
                }
                Err(error) => {
                    // The write may have been applied although its answer was lost: its
                    // record is settled like one whose stream went away.
                    self.depart(enrolling.key, Revision::MAX);
                    self.reply(enrolling.call, Err(error.into()));
                }
            },
        }
    }

    /// Writes the registration of `enrolling` over the member record at `existing`, with
    /// the leases of the name in `leases` moved to it, and, for a new incarnation
    /// (`floors` read), its epochs raised.
    fn write_registration(
        &mut self,
        mut enrolling: Enrolling,
        existing: Revision,
        leases: PrefixSnapshot,
        floors: Option<PrefixSnapshot>,
    ) {
        if self.closed.remove(&enrolling.stream) {
            // Its caller went away: decided no more, so it never replaces the next attempt.
            let error = CoordinatorError::Abandoned { consumer: enrolling.key.1.clone() };
            return self.reply(enrolling.call, Err(error));
        }
        let (topic, consumer, registration) = &enrolling.key;
        let record_key = self.keys.member(topic, consumer);
        // The view is what the running instance reads from memory; the simulation has none.
        let info = self.config.view.as_ref().and_then(|view| view.info(consumer)).unwrap_or_default();
        let record = member_record_of(&self.config.instance_id, *registration, enrolling.incarnation, info);
        let mut txn = Txn::new().when(Compare::ModRevision(record_key.clone(), existing)).then(Op::put_in(
            &record_key,
            encode(&record),
            enrolling.lease,
        ));
        let same_process = floors.is_none();
        let raised = match floors {
            Some(floors) => {
                let mut read =
                    PrefixSnapshot { revision: leases.revision.max(floors.revision), kvs: Vec::new() };
                read.kvs.extend(leases.kvs.iter().cloned());
                read.kvs.extend(floors.kvs);
                let cache = FleetCache::from_snapshot(&self.keys, read);
                let entry = cache.topics.get(topic);
                entry.map_or_else(Vec::new, |entry| {
                    raise_txns(&self.keys, entry, topic, consumer, enrolling.lease, cache.revision, self.now)
                })
            }
            None => Vec::new(),
        };
        // A lease whose epoch is raised is moved to the new lease by its raise.
        let raised_keys: HashSet<&str> = raised.iter().map(|w| w.key.as_str()).collect();
        for kv in
            leases.kvs.iter().filter(|kv| bound_to(consumer, kv) && !raised_keys.contains(kv.key.as_str()))
        {
            txn = txn.when(Compare::ModRevision(kv.key.clone(), kv.mod_revision)).then(Op::put_in(
                &kv.key,
                kv.value.clone(),
                enrolling.lease,
            ));
        }
        for write in raised {
            txn.compares.extend(write.compares);
            txn.ops.extend(write.ops);
        }
        enrolling.stage = Stage::Written { same_process };
        if enrolling.attempt == 0 {
            // A first attempt is written with the registrations decided with it.
            return self.register_batches.queue(record_key, txn, enrolling);
        }
        self.request(StoreRequest::Txn(txn), Waiting::Register(Box::new(enrolling)));
    }

    /// Sends the batches of registrations due, or, with a `refusal` (no live lease, or
    /// stopping), answers what waits for a batch with it.
    pub(super) fn send_register_batches(&mut self, refusal: Option<&CoordinatorError>) {
        if let Some(error) = refusal {
            for enrolling in self.register_batches.take_waiting() {
                self.reply(enrolling.call, Err(error.clone()));
            }
            return;
        }
        for batch in self.register_batches.due() {
            self.request(StoreRequest::Txn(batch.txn), Waiting::Registers(batch.writers));
        }
    }

    /// What the store answered a batch of registrations: each takes the answer as its own
    /// (one that lost reads its records again, and writes alone).
    pub(super) fn registers_answered(
        &mut self,
        writers: Vec<Enrolling>,
        answer: Result<StoreReply, StoreError>,
    ) {
        self.register_batches.answered();
        for enrolling in writers {
            self.register_answered(enrolling, answer.clone());
        }
    }

    /// The registration of `enrolling` is written at `revision`: its stream is admitted
    /// while the lease it was written on is live and the mirror follows the store.
    fn registered(&mut self, enrolling: Enrolling, revision: Revision, same_process: bool) {
        let Enrolling { call, stream, key, lease, .. } = enrolling;
        if !admits(self.stopping, self.lease, lease, self.stale_fenced) {
            let error = CoordinatorError::NoSession(SessionMissing::LostWhileRegistering {
                instance: self.config.instance_id.clone(),
                consumer: key.1.clone(),
            });
            self.depart(key, revision);
            return self.reply(call, Err(error));
        }
        self.reply(call, Ok(Replied::Registered));
        if self.closed.remove(&stream) {
            // Written, but its caller went away meanwhile: settled as after a disconnect.
            return self.depart(key, revision);
        }
        self.admit(stream, &key, revision, same_process);
    }

    /// The registration `key`, written at `registered_at`, has no stream: it is settled as
    /// after a disconnect.
    pub(super) fn depart(&mut self, key: StreamKey, registered_at: Revision) {
        let at = self.instant(self.now);
        self.departures.add(Departed { key, registered_at, at, left: false });
    }
}

/// Whether the lease record `kv` is `consumer`'s.
pub(super) fn bound_to(consumer: &str, kv: &KeyValue) -> bool {
    decode::<LeaseRecord>(&kv.key, &kv.value).is_ok_and(|lease| lease.owner == consumer)
}

/// The snapshot of a prefix from a store answer.
fn prefix(answer: Result<StoreReply, StoreError>) -> Result<PrefixSnapshot, StoreError> {
    expect(answer, |r| match r {
        StoreReply::Prefix(s) => Some(s),
        _ => None,
    })
}
