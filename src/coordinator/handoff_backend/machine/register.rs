//! `Register` in the state machine: the topic's record made sure of (`shared/topics.rs`'s
//! [`count_to_store`] and [`topic_txn`]), the registration decided on the cache as the
//! running instance's enrolment decides it (compare on the record's mod revision as
//! cached, the record of [`active_record`], bound to the instance lease, and a new
//! incarnation's epochs raised in the same transaction by `incarnation.rs`), then the
//! stream admitted and told its snapshot. A write that lost its compare is decided again
//! on the record as the store holds it.

use crate::coordinator::causes::{Contention, SessionMissing};

use super::{Instance, Waiting, expect};
use crate::coordinator::CoordinatorError;
use crate::coordinator::handoff_backend::incarnation::{raise, raise_writes};
use crate::coordinator::handoff_backend::records::{ConsumerRecord, decode, encode};
use crate::coordinator::handoff_backend::register::{active_record, cached_incarnation, cached_registration};
use crate::coordinator::machine::io::{
    CallId, Effect, Replied, RequestId, StoreReply, StoreRequest, StreamId,
};
use crate::coordinator::machine::registration_id;
use crate::coordinator::shared::admits;
use crate::coordinator::shared::cas::CAS_ATTEMPTS;
use crate::coordinator::shared::departures::Departed;
use crate::coordinator::shared::mirror::MirrorCache;
use crate::coordinator::shared::registration::is_same_process;
use crate::coordinator::shared::streams::StreamKey;
use crate::coordinator::shared::topics::{Counted, count_to_store, no_count, topic_txn};
use crate::coordinator::shared::validate::{validate_consumer_name, validate_topic_name};
use crate::store::{Compare, KeyValue, Op, Revision, SessionId, StoreError, Txn};

/// A `Register` between its store calls.
#[derive(Debug)]
pub(super) struct Enrolling {
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The topic's record written.
    Topic,
    /// The topic's partition count asked of the source.
    Source,
    /// The registration record read, to decide again.
    Read,
    /// The registration written (`same_process`: it replaced the same client process').
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
    /// answer, once asked), then decides its registration.
    fn ensure_topic(&mut self, mut enrolling: Enrolling, from_source: Option<u32>) {
        let topic = enrolling.key.0.clone();
        let Some(cache) = self.cache.as_ref() else {
            return self.reply(
                enrolling.call,
                Err(StoreError::Unavailable(crate::store::Unreachable::NotLoaded).into()),
            );
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
                self.decide_registration(enrolling, None)
            }
            Counted::Stored(_) => self.decide_registration(enrolling, None),
            Counted::Write(count, revision) => {
                let kept = cache.topics.get(&topic).and_then(|e| e.config.as_ref()).map(|c| c.value.clone());
                let txn =
                    topic_txn(&self.keys.topic(&topic), count, revision, kept.filter(|_| revision != 0));
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
            Some(Waiting::Refresh(g, round)) => return self.refresh_counted(g, round, answer),
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
                Ok(()) => self.decide_registration(waiter, None),
                Err(error) => self.reply(waiter.call, Err(error.clone())),
            }
        }
    }

    /// Decides the registration of `enrolling` on the cache, or on `stored` (the record as
    /// the store holds it, after a lost compare), and writes it.
    fn decide_registration(&mut self, mut enrolling: Enrolling, stored: Option<Option<KeyValue>>) {
        if let Err(error) = self.live_lease() {
            return self.reply(enrolling.call, Err(error));
        }
        if self.closed.remove(&enrolling.stream) {
            // Its caller went away: decided no more, so it never replaces the next attempt.
            let error = CoordinatorError::Abandoned { consumer: enrolling.key.1.clone() };
            return self.reply(enrolling.call, Err(error));
        }
        let Some(cache) = self.cache.as_ref() else { return };
        let (topic, consumer, registration) = &enrolling.key;
        let record_key = self.keys.consumer(topic, consumer);
        let (existing, stored_incarnation) = match &stored {
            Some(kv) => (
                kv.as_ref().map_or(0, |kv| kv.mod_revision),
                kv.as_ref()
                    .and_then(|kv| decode::<ConsumerRecord>(&kv.key, &kv.value).ok())
                    .map_or(0, |r| r.incarnation),
            ),
            None => (cached_registration(cache, topic, consumer), cached_incarnation(cache, topic, consumer)),
        };
        let record = encode(&active_record(&self.config, consumer, *registration, enrolling.incarnation));
        let mut txn = Txn::new().when(Compare::ModRevision(record_key.clone(), existing)).then(Op::put_in(
            &record_key,
            record,
            enrolling.lease,
        ));
        // A new incarnation of the name: its epochs are raised in the same transaction.
        let same_process = is_same_process(enrolling.incarnation, stored_incarnation);
        if !same_process && let Some(entry) = cache.topics.get(topic) {
            let raised = raise(entry, consumer, cache.revision, self.now);
            for write in raise_writes(&self.keys, entry, topic, raised) {
                txn.compares.extend(write.compares);
                txn.ops.extend(write.ops);
            }
        }
        enrolling.stage = Stage::Written { same_process };
        if stored.is_none() {
            // Decided on the cache: written with the registrations decided with it.
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
    /// (one that lost decides again on its record as stored, and writes alone).
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

    /// What the store answered a `Register`'s call.
    pub(super) fn register_answered(
        &mut self,
        mut enrolling: Enrolling,
        answer: Result<StoreReply, StoreError>,
    ) {
        match enrolling.stage {
            Stage::Topic | Stage::Source => match expect(answer, |r| match r {
                StoreReply::Txn(o) => Some(o),
                _ => None,
            }) {
                // Stored here or by someone else meanwhile: the registration does not
                // depend on it (the watch brings the record).
                Ok(_) => {
                    let topic = enrolling.key.0.clone();
                    self.decide_registration(enrolling, None);
                    self.topic_settled(&topic, Ok(()));
                }
                Err(error) => {
                    let error = CoordinatorError::from(error);
                    self.topic_settled(&enrolling.key.0, Err(error.clone()));
                    self.reply(enrolling.call, Err(error))
                }
            },
            Stage::Read => match expect(answer, |r| match r {
                StoreReply::Values(mut v) if v.len() == 1 => v.pop(),
                _ => None,
            }) {
                Ok(stored) => self.decide_registration(enrolling, Some(stored)),
                Err(error) => self.reply(enrolling.call, Err(error.into())),
            },
            Stage::Written { same_process } => match expect(answer, |r| match r {
                StoreReply::Txn(o) => Some(o),
                _ => None,
            }) {
                Ok(outcome) if outcome.succeeded => {
                    self.registered(enrolling, outcome.revision, same_process)
                }
                Ok(_) => {
                    enrolling.attempt += 1;
                    if enrolling.attempt >= CAS_ATTEMPTS {
                        let consumer = &enrolling.key.1;
                        let error = CoordinatorError::Contended(Contention::RegisteredElsewhere {
                            consumer: consumer.clone(),
                        });
                        return self.reply(enrolling.call, Err(error));
                    }
                    enrolling.stage = Stage::Read;
                    let key = self.keys.consumer(&enrolling.key.0, &enrolling.key.1);
                    self.request(StoreRequest::Get(vec![key]), Waiting::Register(Box::new(enrolling)));
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
