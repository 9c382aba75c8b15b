//! The consumers' calls in the state machine, decided as the running instance decides
//! them: `PartitionReady` / `PartitionReleased` by `decide.rs` ([`next_step`]: on the
//! cache, then on the store's records when the cache may lag or the compare lost),
//! `Deregister` by `leave.rs` ([`decide_leave`], on the records read from the store), and
//! `WatchEpochs` from the cache. While the lease is not live a call is refused
//! `UNAVAILABLE`.

use super::{Instance, Waiting, expect};
use crate::coordinator::CoordinatorError;
use crate::coordinator::causes::ConsumerUnknown;
use crate::coordinator::handoff_backend::calls::refusal_while_rewritten;
use crate::coordinator::handoff_backend::decide::{
    Applied, CallInFlight, CallStep, PartitionSlice, next_step, slice_from_records, slice_keys,
};
use crate::coordinator::handoff_backend::leave::{
    self, LeaveInFlight, LeaveStep, Leaving, decide_leave, keys_to_read,
};
use crate::coordinator::machine::batching::Batch;
use crate::coordinator::machine::io::{Call, CallId, Effect, Replied, StoreReply, StoreRequest};
use crate::coordinator::machine::observe::Observation;
use crate::coordinator::shared::instance::Report;
use crate::coordinator::shared::mirror::{
    Changes, OwnFit, apply_ahead, apply_watched, own_batch, own_write_fits,
};
use crate::store::{Compare, KeyValue, Op, Revision, StoreError, Txn};

use super::streams::EpochWatch;

/// A ready / released call between its store calls.
#[derive(Debug)]
pub(super) struct CallWait {
    call: CallInFlight<CallId>,
    /// The transaction it is writing, and what it answers once written (`None`: its slice
    /// is being read).
    writing: Option<(Txn, Applied)>,
}

/// A ready / released call's first write, waiting for its batch or in it: the call, and
/// what it answers once written.
pub(super) type BatchedCall = (CallInFlight<CallId>, Applied);

/// A `Deregister` between its store calls.
#[derive(Debug)]
pub(super) struct LeaveWait {
    leave: LeaveInFlight<CallId>,
    /// What its transaction, once written, answers.
    left: Option<leave::Left>,
}

impl Instance {
    /// A consumer call arrived.
    pub(super) fn call(&mut self, id: CallId, body: Call) {
        match body {
            Call::Register { stream, consumer, topic, incarnation } => {
                self.register(id, stream, consumer, topic, incarnation)
            }
            Call::PartitionReady { consumer, topic, partition } => {
                self.handoff_call(CallInFlight::new(Report::Ready, consumer, topic, partition, id))
            }
            Call::PartitionReleased { consumer, topic, partition } => {
                self.handoff_call(CallInFlight::new(Report::Released, consumer, topic, partition, id))
            }
            Call::Deregister { consumer, wants_drain } => self.deregister(id, consumer, wants_drain),
            Call::WatchEpochs { stream, consumer, topic } => self.watch_epochs(id, stream, consumer, topic),
        }
    }

    /// A ready or released call, decided on the cache first.
    fn handoff_call(&mut self, mut call: CallInFlight<CallId>) {
        let slice = self
            .cache
            .as_ref()
            .and_then(|cache| PartitionSlice::from_cache(cache, &call.topic, &call.consumer, call.partition));
        let step = match slice {
            Some(slice) => next_step(&self.keys, &mut call, &slice, false, self.now_ms(), &self.config.plan),
            None => CallStep::ReadStore,
        };
        self.go(call, step);
    }

    /// Does what `call` needs next (refused while the lease is not live).
    fn go(&mut self, call: CallInFlight<CallId>, step: CallStep) {
        let step = match self.live_lease() {
            Err(error) if !matches!(step, CallStep::Answer(_)) => CallStep::Answer(Err(error)),
            _ => step,
        };
        match step {
            CallStep::Answer(result) => {
                let (topic, consumer) = (&call.topic, &call.consumer);
                let (partition, at) = (call.partition, self.now_ms());
                // Counted as the running instance counts them (`calls.rs::answer`).
                let seen = match (&result, call.report) {
                    (Ok(Some(applied)), Report::Ready) => Some(Observation::Ready {
                        topic: topic.clone(),
                        partition,
                        consumer: consumer.clone(),
                        warm_since: applied.phase_since,
                        at,
                    }),
                    (Ok(_), Report::Released) => Some(Observation::Released {
                        topic: topic.clone(),
                        partition,
                        consumer: consumer.clone(),
                        at,
                    }),
                    _ => None,
                };
                self.out.extend(seen.map(Effect::Observe));
                let held = self.streams.contains_key(&(topic.clone(), consumer.clone()));
                let reply = result
                    .map(|_| Replied::Applied)
                    .map_err(|error| refusal_while_rewritten(topic, consumer, held, error));
                self.reply(call.reply, reply);
            }
            CallStep::ReadStore => {
                let keys = slice_keys(&self.keys, &call.topic, &call.consumer, call.partition);
                let wait = CallWait { call, writing: None };
                self.request(StoreRequest::Get(keys.to_vec()), Waiting::Call(Box::new(wait)));
            }
            // A first attempt joins the calls decided with it in one transaction; a call
            // decided again (its batch lost a compare) writes alone.
            CallStep::Write(txn, applied) if call.attempt == 0 => {
                let key = self.keys.handoff(&call.topic, call.partition);
                self.call_batches.queue(key, txn, (call, applied));
            }
            CallStep::Write(txn, applied) => {
                let wait = CallWait { call, writing: Some((txn.clone(), applied)) };
                self.request(StoreRequest::Txn(txn), Waiting::Call(Box::new(wait)));
            }
        }
    }

    /// What the store answered a ready / released call.
    pub(super) fn call_answered(&mut self, wait: CallWait, answer: Result<StoreReply, StoreError>) {
        let CallWait { mut call, writing } = wait;
        let step = if let Some((txn, applied)) = writing {
            let written = expect(answer, |r| match r {
                StoreReply::Txn(o) => Some(o),
                _ => None,
            });
            match written {
                Ok(outcome) if outcome.succeeded => {
                    // Applied and told at once, not when the watch brings it back.
                    self.applied(outcome.revision, &txn.ops, &txn.compares);
                    CallStep::Answer(Ok(Some(applied)))
                }
                Ok(_) => call.retry(),
                Err(error) => CallStep::Answer(Err(error.into())),
            }
        } else {
            let keys = slice_keys(&self.keys, &call.topic, &call.consumer, call.partition);
            let records = expect(answer, |r| match r {
                StoreReply::Values(v) => Some(v),
                _ => None,
            });
            match records.map_err(CoordinatorError::from).and_then(|records| {
                slice_from_records(&call.topic, &call.consumer, call.partition, &keys, &records)
            }) {
                Ok(slice) => next_step(&self.keys, &mut call, &slice, true, self.now_ms(), &self.config.plan),
                Err(error) => CallStep::Answer(Err(error)),
            }
        };
        self.go(call, step);
    }

    /// Sends the batches of calls' writes due, or, with a `refusal` (no live lease, or
    /// stopping), answers what waits for a batch with it.
    pub(super) fn send_call_batches(&mut self, refusal: Option<&CoordinatorError>) {
        if let Some(error) = refusal {
            for (call, _) in self.call_batches.take_waiting() {
                self.go(call, CallStep::Answer(Err(error.clone())));
            }
            return;
        }
        for batch in self.call_batches.due() {
            self.request(StoreRequest::Txn(batch.txn.clone()), Waiting::Calls(Box::new(batch)));
        }
    }

    /// What the store answered a batch of calls' writes: all written at one revision
    /// (applied at once, then each answered), or, when a compare lost (maybe another
    /// call's), each decided again on the store's records.
    pub(super) fn calls_answered(
        &mut self,
        batch: Batch<BatchedCall>,
        answer: Result<StoreReply, StoreError>,
    ) {
        self.call_batches.answered();
        let written = expect(answer, |r| match r {
            StoreReply::Txn(o) => Some(o),
            _ => None,
        });
        if let Ok(outcome) = &written
            && outcome.succeeded
        {
            self.applied(outcome.revision, &batch.txn.ops, &batch.txn.compares);
        }
        for (mut call, applied) in batch.writers {
            let step = match &written {
                Ok(outcome) if outcome.succeeded => CallStep::Answer(Ok(Some(applied))),
                Ok(_) => call.retry(),
                Err(error) => CallStep::Answer(Err(error.clone().into())),
            };
            self.go(call, step);
        }
    }

    /// Applies `ops`, committed here at `revision`, to the cache at once when nothing else
    /// happened in between (the cache is at the revision before), and relays what changed;
    /// otherwise the watch brings them.
    pub(super) fn applied(&mut self, revision: Revision, ops: &[Op], compares: &[Compare]) {
        let Some(cache) = self.cache.as_mut() else { return };
        let Some(batch) = own_batch(self.keys.prefix(), revision, ops) else { return };
        let mut changes = Changes::default();
        match own_write_fits(&*cache, &self.keys, &batch, compares) {
            OwnFit::InTurn => {
                apply_watched(cache, &self.keys, revision, batch.events, self.ahead, &mut changes)
            }
            OwnFit::Ahead => {
                apply_ahead(cache, &self.keys, batch, &mut changes);
                self.ahead = self.ahead.max(revision);
            }
            OwnFit::Later => return,
        }
        self.relay(&changes);
    }

    /// A `Deregister`: decided on its records read from the store.
    fn deregister(&mut self, call: CallId, consumer: String, wants_drain: bool) {
        let found = self.cache.as_ref().map(|c| leave::registrations(c, &consumer)).unwrap_or_default();
        if found.is_empty() {
            return self.reply(call, Err(leave::not_registered(&consumer)));
        }
        let leave = LeaveInFlight { consumer, wants_drain, found, attempt: 0, reply: call };
        self.go_leave(leave, LeaveStep::ReadStore);
    }

    /// Does what `leave` needs next (refused while the lease is not live).
    fn go_leave(&mut self, leave: LeaveInFlight<CallId>, step: LeaveStep) {
        let step = match self.live_lease() {
            Err(error) if !matches!(step, LeaveStep::Answer(_)) => LeaveStep::Answer(Err(error)),
            _ => step,
        };
        match step {
            LeaveStep::Answer(result) => {
                if let Ok(left) = &result {
                    for (topic, leaving) in &left.topics {
                        let (consumer, topic) = (leave.consumer.clone(), topic.clone());
                        let draining = *leaving == Leaving::Draining;
                        self.out.push(Effect::Observe(Observation::Left { consumer, topic, draining }));
                    }
                }
                self.reply(leave.reply, result.map(|left| Replied::Deregistered(left.action())))
            }
            LeaveStep::ReadStore => {
                let keys = keys_to_read(&self.keys, &leave);
                self.request(
                    StoreRequest::Get(keys),
                    Waiting::Leave(Box::new(LeaveWait { leave, left: None })),
                );
            }
            LeaveStep::Write(txn, left) => {
                let wait = LeaveWait { leave, left: Some(left) };
                self.request(StoreRequest::Txn(txn), Waiting::Leave(Box::new(wait)));
            }
        }
    }

    /// What the store answered a `Deregister`.
    pub(super) fn leave_answered(&mut self, wait: LeaveWait, answer: Result<StoreReply, StoreError>) {
        let LeaveWait { mut leave, left } = wait;
        let step = match left {
            Some(left) => match expect(answer, |r| match r {
                StoreReply::Txn(o) => Some(o),
                _ => None,
            }) {
                Ok(outcome) if outcome.succeeded => {
                    self.keep_left(&left, &leave.consumer, outcome.revision);
                    LeaveStep::Answer(Ok(left))
                }
                Ok(_) => leave.retry(),
                Err(error) => LeaveStep::Answer(Err(error.into())),
            },
            None => match expect(answer, |r| match r {
                StoreReply::Values(v) => Some(v),
                _ => None,
            }) {
                Ok(records) => {
                    let records: Vec<Option<KeyValue>> = records;
                    decide_leave(&leave, &records, self.now_ms(), self.config.restart_grace)
                }
                Err(error) => LeaveStep::Answer(Err(error.into())),
            },
        };
        self.go_leave(leave, step);
    }

    /// Keeps what a `Deregister` wrote at `revision` in the streams it belongs to
    /// ([`leave::Left::kept`]), unless they keep a later record already.
    fn keep_left(&mut self, left: &leave::Left, consumer: &str, revision: Revision) {
        for (key, record) in left.kept(consumer) {
            let Some(stream) = self.streams.get_mut(&(key.0, key.1)) else { continue };
            if stream.registration == key.2 && stream.kept.as_ref().is_none_or(|(at, _)| *at < revision) {
                stream.kept = Some((revision, record.to_vec()));
            }
        }
    }

    /// `WatchEpochs`: the epoch stream `stream` of the consumer's command stream here.
    fn watch_epochs(&mut self, call: CallId, stream: u64, consumer: String, topic: String) {
        let name = (topic.clone(), consumer.clone());
        let Some(registration) = self.streams.get(&name).map(|s| s.registration) else {
            let error =
                CoordinatorError::UnknownConsumer(ConsumerUnknown::NotRegisteredHere { consumer, topic });
            return self.reply(call, Err(error));
        };
        self.epoch_streams.insert(stream, EpochWatch { key: (topic, consumer, registration), last: None });
        self.reply(call, Ok(Replied::WatchingEpochs));
        self.tell_epochs_of(stream);
    }
}
