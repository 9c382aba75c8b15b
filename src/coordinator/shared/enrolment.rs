//! A `Register` as the instance's loop takes it: when the cache does not hold its topic's
//! record, the topic is stored first (`ensure_topic`: it may ask Kafka), once for all the
//! `Register`s of that topic that arrive meanwhile; then its registration is decided on the
//! cache and written in a batch with the others that arrive with it, or, where the cache
//! cannot decide or the batch lost, decided on the store's state and written in a
//! transaction of its own; once written, its stream is admitted and told its snapshot, in
//! the loop, the only relay, so the next change it relays finds the stream.
//!
//! The calling task (`register.rs`) only validates and waits for the answer. The loop's
//! upkeep (`upkeep.rs`) carries the [`Enrolments`]: their
//! decisions are pure, their store calls run among the loop's, and what the store answered
//! comes back to them.
//!
//! A registration whose caller went away is never decided again ([`Caller`]): a client
//! that gave up has sent its next attempt, and a write decided from what that attempt
//! wrote would replace it (docs/design.md §6).

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::batch::{Answer, Batches, KeyWrite, Queued, commit};
use super::outgoing::{CommandSender, command_channel};
use super::registrar::{Caller, Registrar};
use super::registration::{Written, is_same_process};
use super::streams::{EndReason, LocalStream, StreamKey};
use super::transport::command_stream;
use crate::coordinator::{CommandStream, CoordinatorError};
use crate::store::{Compare, Op, Revision, SessionId};

/// A `Register` handed to the instance's loop: where its answer goes.
pub struct Enrolment {
    /// The registration: topic, consumer and its fresh registration id.
    pub key: StreamKey,
    /// The instance lease it is written on, and its stream admitted under.
    pub lease: SessionId,
    /// The client process that sent it (`INCARNATION_HEADER`; 0: unknown).
    pub incarnation: u64,
    /// Whether anyone still waits for it.
    pub caller: Caller,
    /// The answer: the command stream, whose first item is the snapshot.
    pub reply: oneshot::Sender<Result<CommandStream, CoordinatorError>>,
}

impl std::fmt::Debug for Enrolment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enrolment")
            .field("key", &self.key)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// How an enrolment's write ended, for [`Enrolments::ended`].
#[derive(Debug)]
pub enum Outcome {
    /// Written: admit the stream (told every epoch when it replaced a registration of the
    /// same client process, whose epochs were not raised).
    Written(Written),
    /// To be decided on the store's state: the batch it was in lost a compare, or the
    /// cache cannot decide it.
    OnStore,
    /// Its caller went away before anything was written.
    Abandoned,
    /// The store failed; the write may have been applied.
    Failed(CoordinatorError),
    /// Refused before anything of it was written (its topic could not be stored).
    Refused(CoordinatorError),
}

/// An enrolment's write decided on the cache, waiting for its batch.
#[derive(Debug)]
pub struct Batched {
    write: KeyWrite,
    enrolment: Enrolment,
    /// It replaces a registration of the same client process.
    same_process: bool,
}

impl Queued for Batched {
    fn write(&self) -> &KeyWrite {
        &self.write
    }
}

/// The enrolments of one instance's loop, between their store calls (pure bookkeeping;
/// [`Enrolments::due`] is where they act).
#[derive(Debug, Default)]
pub struct Enrolments {
    /// Writes decided on the cache, waiting for their batch or in flight.
    batches: Batches<Batched>,
    /// Enrolments whose write ended, to act on.
    ended: Vec<(Enrolment, Outcome)>,
    /// Per topic whose record is being stored, the enrolments that wait for it.
    topics: HashMap<String, Vec<Enrolment>>,
    /// Topics to store (their enrolments wait in `topics`).
    to_store: Vec<String>,
    /// Enrolments whose topic was stored, to decide.
    stored: Vec<Enrolment>,
}

/// A store call of the enrolments', for the loop to run.
pub type Call = futures::future::BoxFuture<'static, Done>;

/// What a [`Call`] was, for [`Enrolments::done`].
#[derive(Debug)]
pub enum Done {
    /// A batch of writes decided on the cache, and the store's answer.
    Batch(Vec<Batched>, Answer),
    /// One enrolment written on the store's state.
    Alone(Enrolment, Outcome),
    /// A topic's record made sure of (or why it could not be).
    Topic(String, Result<(), CoordinatorError>),
}

impl Enrolments {
    /// Takes `enrolment` in: its topic is stored first if `cache` does not hold it; its
    /// write is decided on `cache` where `backend` allows, and joins the next batch.
    pub fn arrive<R: Registrar>(&mut self, backend: &R, cache: &R::Cache, enrolment: Enrolment) {
        let topic = &enrolment.key.0;
        if backend.core().topic_stored(cache, topic) {
            return self.decide(backend, cache, enrolment);
        }
        if enrolment.caller.is_gone() {
            self.ended.push((enrolment, Outcome::Abandoned));
            return;
        }
        let waiting = self.topics.entry(topic.clone()).or_default();
        if waiting.is_empty() {
            self.to_store.push(topic.clone());
        }
        waiting.push(enrolment);
    }

    /// Decides `enrolment`'s write on `cache` where `backend` allows, and queues it for
    /// the next batch.
    fn decide<R: Registrar>(&mut self, backend: &R, cache: &R::Cache, enrolment: Enrolment) {
        let (topic, consumer, registration) = &enrolment.key;
        let Some(cached) = backend.cached_registration(cache, topic, consumer) else {
            self.ended.push((enrolment, Outcome::OnStore));
            return;
        };
        if enrolment.caller.is_gone() {
            self.ended.push((enrolment, Outcome::Abandoned));
            return;
        }
        let key = backend.registration_key(topic, consumer);
        let record = backend.registration_record(consumer, *registration, enrolment.incarnation);
        let mut write = KeyWrite {
            key: key.clone(),
            compares: vec![Compare::ModRevision(key.clone(), cached)],
            ops: vec![Op::put_in(&key, record, enrolment.lease)],
        };
        // A new incarnation of the name: its epochs are raised in the same transaction,
        // so its stream never hears an epoch the old incarnation still holds (§10). The
        // same process reconnecting (the compare holds the record it was decided on) has
        // nobody to fence.
        let same_process =
            is_same_process(enrolment.incarnation, backend.cached_incarnation(cache, topic, consumer));
        let now_micros = super::records::now_micros();
        let raise = if same_process {
            Vec::new()
        } else {
            backend.raise_epochs(cache, topic, consumer, enrolment.lease, now_micros)
        };
        for raised in raise {
            write.compares.extend(raised.compares);
            write.ops.extend(raised.ops);
        }
        if write.compares.len().max(write.ops.len()) > super::batch::TXN_LIMIT {
            // Too many for one transaction: the store's-state path splits them.
            self.ended.push((enrolment, Outcome::OnStore));
            return;
        }
        self.batches.queue(Batched { write, enrolment, same_process });
    }

    /// A [`Call`] ended.
    pub fn done(&mut self, done: Done) {
        match done {
            Done::Batch(batch, answer) => {
                self.batches.done();
                for Batched { enrolment, same_process, .. } in batch {
                    let outcome = match &answer {
                        Ok(Some(written)) => {
                            Outcome::Written(Written { revision: written.revision, same_process })
                        }
                        Ok(None) => Outcome::OnStore,
                        Err(error) => Outcome::Failed(error.clone().into()),
                    };
                    self.ended.push((enrolment, outcome));
                }
            }
            Done::Alone(enrolment, outcome) => self.ended.push((enrolment, outcome)),
            Done::Topic(topic, stored) => {
                let waiting = self.topics.remove(&topic).unwrap_or_default();
                match stored {
                    Ok(()) => self.stored.extend(waiting),
                    Err(error) => {
                        let failed = waiting.into_iter().map(|e| (e, Outcome::Refused(error.clone())));
                        self.ended.extend(failed);
                    }
                }
            }
        }
    }

    /// Acts for `backend`'s loop: admits the streams of what was written, answers what
    /// failed, and returns the store calls to make (the batches due, and the writes to
    /// decide on the store's state).
    pub fn due<R: Registrar>(&mut self, backend: &Arc<R>) -> Vec<Call> {
        let mut calls: Vec<Call> = Vec::new();
        for topic in std::mem::take(&mut self.to_store) {
            let backend = backend.clone();
            calls.push(Box::pin(async move {
                let stored = backend.core().ensure_topic(&topic).await.map(|_| ());
                Done::Topic(topic, stored)
            }));
        }
        if !self.stored.is_empty() {
            // The cache may not hold the topic's record yet: the watch brings it. The
            // registration's write does not depend on it.
            let cache = backend.core().mirror.read();
            for enrolment in std::mem::take(&mut self.stored) {
                self.decide(&**backend, &cache, enrolment);
            }
        }
        for (enrolment, outcome) in std::mem::take(&mut self.ended) {
            match outcome {
                Outcome::Written(written) => admit(backend, enrolment, written),
                Outcome::OnStore => calls.push(write_alone(backend.clone(), enrolment)),
                Outcome::Abandoned => {
                    let (topic, consumer, _) = &enrolment.key;
                    tracing::info!(
                        topic,
                        consumer,
                        "a Register whose caller went away is dropped: nothing written"
                    );
                    let error = CoordinatorError::Abandoned { consumer: consumer.to_string() };
                    let _ = enrolment.reply.send(Err(error));
                }
                Outcome::Refused(error) => {
                    let _ = enrolment.reply.send(Err(error));
                }
                Outcome::Failed(error) => {
                    // The write may have been applied although its answer was lost: a
                    // record left behind must end like one whose stream went away. Its
                    // revision is unknown: it is held for the TTL whatever the cache says
                    // (by then the cache has seen the write, if it was applied), then
                    // deleted if it is this registration.
                    backend.core().depart(enrolment.key, Revision::MAX);
                    let _ = enrolment.reply.send(Err(error));
                }
            }
        }
        // Not applied to the mirror at once, as the calls' batches are: a registration
        // record is read with its create revision, which a batch's operations do not carry.
        // The watch brings it.
        for batch in self.batches.due() {
            let store = backend.core().shared_store();
            calls.push(Box::pin(async move {
                let answer = commit(&*store, &batch).await;
                Done::Batch(batch, answer)
            }));
        }
        calls
    }
}

/// Writes `enrolment`'s registration decided on the store's state
/// ([`super::registration::write`]), as a call of the loop.
fn write_alone<R: Registrar>(backend: Arc<R>, enrolment: Enrolment) -> Call {
    Box::pin(async move {
        let (topic, consumer, registration) = &enrolment.key;
        let written = super::registration::write(
            &*backend,
            consumer,
            topic,
            *registration,
            enrolment.lease,
            enrolment.incarnation,
            &enrolment.caller,
        )
        .await;
        let outcome = match written {
            Ok(Some(written)) => Outcome::Written(written),
            Ok(None) => Outcome::Abandoned,
            Err(error) => Outcome::Failed(error),
        };
        Done::Alone(enrolment, outcome)
    })
}

/// Admits the stream of `enrolment`, `written` at its revision, while the instance lease
/// it was written on is live and the relay follows the store ([`Core::admit`]), tells it
/// its snapshot, and answers. A registration written but not admitted (the instance
/// fenced meanwhile) is settled as after a disconnect: it ends after the TTL unless the
/// consumer comes back.
///
/// [`Core::admit`]: super::Core::admit
fn admit<R: Registrar>(backend: &Arc<R>, enrolment: Enrolment, written: Written) {
    let Written { revision: registered_at, same_process } = written;
    let Enrolment { key, lease, reply, .. } = enrolment;
    let core = backend.core();
    let (topic, consumer, registration) = (&key.0, &key.1, key.2);
    let (tx, rx) = command_channel();
    let (mut stream, end_rx) = LocalStream::new(registration, registered_at, tx.clone());
    if same_process {
        // The process's own epochs, none of them an earlier incarnation's.
        stream.incarnation_at = 0;
    }
    let ends = {
        // Relay and admit under one read of the cache: this loop relays the next
        // revision only after, and its relay then finds the stream.
        let cache = core.mirror.read();
        let step = backend.relay_step(&cache, topic, consumer, stream.seen());
        let ended = stream.apply(topic, consumer, step);
        stream.flush();
        let Some(ends) = core.admit(lease, topic, consumer, stream) else {
            // Fenced (or the relay stopped) since the write: the consumer never sees the
            // snapshot, which may already be stale.
            drop(cache);
            tracing::warn!(
                topic,
                consumer,
                "registration written, but this instance fenced itself meanwhile"
            );
            let error = CoordinatorError::NoSession(
                crate::coordinator::causes::SessionMissing::LostWhileRegistering {
                    instance: core.instance_id.to_string(),
                    consumer: consumer.to_string(),
                },
            );
            core.depart(key, registered_at);
            let _ = reply.send(Err(error));
            return;
        };
        if let Some((reason, last)) = ended {
            core.streams.end(&key, reason, last);
        }
        ends
    };
    tracing::info!(topic, consumer, %registration, "consumer registered");
    let done = CancellationToken::new();
    backend.spawn_companion(key.clone(), registered_at, done.clone());
    tokio::spawn(stream_task(backend.clone(), key, registered_at, tx, end_rx, done));
    // A caller gone by now drops the stream: its task sees it closed, as after a
    // disconnect.
    let _ = reply.send(Ok(command_stream(rx, ends)));
}

/// The stream's task: waits for the stream to end, cancels `done`, then hands its
/// registration to the loop to settle ([`Departures`](super::departures::Departures)): at
/// once when its consumer left, once its transport took the last commands; after the TTL
/// when it went away. It only forwards: the loop ends a stream whose consumer went away
/// when it takes the departure in (`upkeep.rs`), so no coordinator state is written here.
async fn stream_task<R: Registrar>(
    backend: Arc<R>,
    key: StreamKey,
    registered_at: Revision,
    tx: CommandSender,
    end_rx: oneshot::Receiver<EndReason>,
    done: CancellationToken,
) {
    let core = backend.core();
    let reason = tokio::select! {
        reason = end_rx => reason.unwrap_or(EndReason::Shutdown),
        _ = tx.closed() => {
            tracing::info!(topic = %key.0, consumer = %key.1, "consumer disconnected");
            EndReason::Disconnected
        }
    };
    done.cancel();
    if reason == EndReason::Left {
        // The consumer hears that it owns nothing before anyone can be given what it
        // owned: its registration (on the fleet, with its leases) is handed over for
        // deletion once the transport took everything queued for it, or after one TTL for
        // a consumer that does not read.
        let everything = tx.max_capacity();
        let _ = tokio::time::timeout(core.lease_ttl, tx.reserve_many(everything)).await;
    }
    drop(tx);
    match reason {
        EndReason::Left => core.leave(key, registered_at),
        EndReason::Disconnected => core.depart(key, registered_at),
        EndReason::Replaced | EndReason::Expired | EndReason::Shutdown => {}
    }
}

#[cfg(test)]
#[path = "enrolment_tests.rs"]
mod tests;
