//! The handoff instance's loop: the one task that changes the cache, decides the consumer
//! calls and tells the streams.
//!
//! Its inputs are events: the store's changes (the mirror's [`Follower`]: watched
//! revisions, re-reads), the consumers' `PartitionReady` / `PartitionReleased` /
//! `Deregister`, the streams that end without their consumer leaving, the instance
//! lease's state, the mirror's health, the leader's and the upkeep's timers, and the
//! store's answers to what the loop asked of it. The upkeep (`shared/upkeep.rs`: settling
//! the ended streams' registrations after the TTL, writing again those the store lost,
//! fencing the streams while the mirror cannot follow the store, the sweep of orphaned
//! registrations) is decided on the same inputs, and its store calls run among the
//! loop's. The leader is a part of the loop
//! ([`Leader`]): when it looks, it decides on the cache and hands the loop its next store
//! call, whose answer goes back to it; a plan's batch that succeeded is applied and told to
//! the streams like a call's commit. A call is decided by the pure model of `decide.rs`
//! ([`next_step`]) on the cache; its transaction is written with the calls that arrive
//! with it ([`Batches`]: at most [`BATCHES_IN_FLIGHT`](batch::BATCHES_IN_FLIGHT) batches
//! in flight, the rest queue and join the next one); when the cache may lag or the
//! transaction lost, the loop reads the call's records from the store and decides again,
//! in a transaction of its own. A `Deregister` is decided by the pure model of `leave.rs`
//! on its records read from the store, and written in a transaction of its own. Every
//! store call runs inside the loop, beside its other inputs, not in a task of its own.
//! While the instance lease is not live (fenced, or expired and not yet granted again:
//! `shared/lease.rs`) the loop decides nothing for a consumer: calls that arrive or wait
//! for a batch are answered `UNAVAILABLE`, and the consumer, whose stream the fence ended,
//! retries where it registers again; what is already in the store's hands completes.
//!
//! Each change, watched or committed here, is applied to the mirror and relayed to the
//! local streams (`relay.rs`) by this loop, so no two relay passes ever run at once, and a
//! committed `PartitionReady` is applied and its two commands handed to the two streams by
//! the loop that committed it as soon as the store answers, without waiting for the watch
//! to bring it back (docs/design.md §9).
//!
//! [`Follower`]: crate::coordinator::shared::mirror::Follower

use std::sync::Arc;

use futures::{StreamExt, future::BoxFuture, stream::FuturesUnordered};
use tokio::time::Instant;

use super::calls::{answer, answer_leave};
use super::decide::{Applied, CallInFlight, CallStep, PartitionSlice, next_step};
use super::leader::{self, Answer as LeaderAnswer, GroupIndex, Job, Leaders, Why};
use super::leave::{self, LeaveInFlight, LeaveStep, Left};
use super::{Handoff, now_ms, relay};
use crate::coordinator::CoordinatorError;
use crate::coordinator::shared::batch::{self, Answer, Batches, KeyWrite, Queued};
use crate::coordinator::shared::instance::{Call, stopping};
use crate::coordinator::shared::upkeep::{self, Upkeep, Woke, Worked};
use crate::store::{Compare, KeyValue, LeaseStore, Op, StoreError, Txn, TxnOutcome};

/// A call's transaction waiting for its batch.
struct QueuedCall {
    write: KeyWrite,
    call: CallInFlight,
    applied: Applied,
}

impl Queued for QueuedCall {
    fn write(&self) -> &KeyWrite {
        &self.write
    }
}

/// Who waits for a transaction of its own.
enum Writer {
    /// A call decided again on the store's state, answered `Applied` once it is written.
    Call(CallInFlight, Applied),
    /// A `Deregister`, answered `Left` once it is written.
    Leave(LeaveInFlight, Left),
}

/// What the store answered.
enum Done {
    /// A batch of calls' transactions.
    Batch(Vec<QueuedCall>, Answer),
    /// A call's records, read to decide it again.
    Slice(CallInFlight, Result<PartitionSlice, CoordinatorError>),
    /// A `Deregister`'s records, read to decide it.
    Records(LeaveInFlight, Result<Vec<Option<KeyValue>>, StoreError>),
    /// A transaction of its own.
    Txn(Txn, Result<TxnOutcome, StoreError>, Writer),
    /// A store call of a group's leader (with its transaction, if it was one).
    Leader(GroupIndex, Option<Txn>, Why, LeaderAnswer),
    /// A store call of the upkeep's ended (it logged and counted what it did).
    Upkeep(Worked),
    /// A group leader's topic refresh of this number ended (it logged what it did).
    Refreshed(GroupIndex, u64),
    /// The resignation at a graceful stop was answered.
    Resigned(Result<TxnOutcome, StoreError>),
}

/// What the loop has asked of the store and not yet sent.
struct Pending {
    store: Arc<dyn LeaseStore>,
    /// Calls' transactions waiting for a batch, and the batches in flight.
    batches: Batches<QueuedCall>,
    /// Store calls under way.
    in_flight: FuturesUnordered<BoxFuture<'static, Done>>,
}

/// Runs the instance's loop until shutdown (see the module docs). What is in flight then
/// still completes and is answered (as in a process that stalled mid-call and resumed),
/// but nothing more is applied or decided: the streams are gone. A graceful stop resigns
/// leadership among those last store calls, and waits until they are all answered.
pub(super) async fn run(inner: Arc<Handoff>) {
    // However the loop ends, a graceful stop waiting for it goes on.
    let _stopped = inner.stopped.clone().drop_guard();
    // Taken once, by this loop (the backend starts one).
    let Some(mut calls) = inner.core.calls() else { return };
    let mut follower = inner.core.follower(inner.config.resync_interval);
    let store = inner.core.shared_store();
    let mut leader = Leaders::new(inner.config.leader_groups, Instant::now());
    let mut upkeep = Upkeep::new(inner.core.lease_ttl(), Instant::now());
    let mut upkept = upkeep::Inputs::new(&*inner);
    let mut pending = Pending { store, batches: Batches::default(), in_flight: FuturesUnordered::new() };
    loop {
        if leader.may_plan(&inner, Instant::now()) {
            // The streams this loop just fed go first: a big topic's plan takes hundreds
            // of µs, and a handoff's `assigned` and release wait for their tasks
            // (docs/benchmarks/handoff.md).
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
        }
        for (group, job) in leader.next_jobs(&inner, Instant::now()) {
            run_leader_job(&pending, group, job);
        }
        for (group, number, refresh) in leader.refreshes(&inner) {
            pending.in_flight.push(Box::pin(async move {
                refresh.await;
                Done::Refreshed(group, number)
            }));
        }
        for work in upkeep::run_due(&mut upkeep, &inner, Instant::now()) {
            pending.in_flight.push(Box::pin(async move { Done::Upkeep(work.await) }));
        }
        for batch in pending.batches.due() {
            let store = pending.store.clone();
            pending.in_flight.push(Box::pin(async move {
                let answer = batch::commit(&*store, &batch).await;
                Done::Batch(batch, answer)
            }));
        }
        tokio::select! {
            changes = follower.next() => match changes {
                Some(changes) => relay::tell(&inner, &changes),
                None => break,
            },
            call = calls.recv() => {
                let Some(call) = call else { break };
                // Whatever else is queued joins the same batch.
                for call in std::iter::once(call).chain(std::iter::from_fn(|| calls.try_recv().ok())) {
                    take(&inner, &mut pending, call);
                }
            }
            (woke, work) = upkept.next(&mut upkeep, &inner) => {
                if let Some(work) = work {
                    pending.in_flight.push(Box::pin(async move { Done::Upkeep(work.await) }));
                }
                // While the lease is not live, the calls waiting for a batch are answered why.
                if woke == Woke::Lease {
                    while let Some(error) = refusal(&inner, true) {
                        let Some(QueuedCall { call, .. }) = pending.batches.pop_waiting() else { break };
                        let _ = call.reply.send(Err(error));
                    }
                }
                if woke != Woke::Other {
                    leader.poke();
                }
            }
            () = sleep_until_some(leader.wake_at()) => {}
            Some(done) = pending.in_flight.next(), if !pending.in_flight.is_empty() => {
                if matches!(done, Done::Batch(..)) {
                    pending.batches.done();
                }
                match done {
                    Done::Leader(group, txn, why, answer) => {
                        if let (Some(txn), LeaderAnswer::Txn(Ok(o))) = (&txn, &answer)
                            && o.succeeded
                            && why.applies_at_once()
                        {
                            applied(&inner, o.revision, &txn.ops, &txn.compares);
                        }
                        leader.answered(&inner, group, why, answer);
                    }
                    Done::Upkeep(worked) => upkeep.worked(worked),
                    Done::Refreshed(group, number) => leader.refreshed(group, number),
                    done => finish(&inner, &mut pending, done, true),
                }
            }
        }
    }
    leader.stop();
    // Their transports end the streams (`Core::begin_shutdown`, `crash`); no more relay.
    inner.core.streams().drop_all();
    // A graceful stop resigns leadership, beside what is still in flight; a crash, like a
    // dead process, leaves the key to expire with the lease.
    if !inner.core.crashed() {
        for txn in leader::resignation(&inner) {
            let store = pending.store.clone();
            pending.in_flight.push(Box::pin(async move { Done::Resigned(store.txn(txn).await) }));
        }
    }
    while let Some(done) = pending.in_flight.next().await {
        finish(&inner, &mut pending, done, false);
    }
}

/// Takes a consumer's call in: a `PartitionReady` or `PartitionReleased` is decided on
/// the cache at once.
fn take(inner: &Arc<Handoff>, pending: &mut Pending, call: Call) {
    match call {
        Call::Handoff { report, consumer, topic, partition, reply } => {
            let mut call = CallInFlight::new(report, consumer, topic, partition, reply);
            let slice = {
                let cache = inner.core.mirror().read();
                PartitionSlice::from_cache(&cache, &call.topic, &call.consumer, call.partition)
            };
            let step = match slice {
                Some(slice) => {
                    next_step(inner.core.keys(), &mut call, &slice, false, now_ms(), &inner.config.plan)
                }
                // A topic the cache does not know: only the store can tell.
                None => CallStep::ReadStore,
            };
            go(inner, pending, call, step, true);
        }
        Call::Leave { consumer, wants_drain, reply } => {
            let found = leave::registrations(&inner.core.mirror().read(), &consumer);
            if found.is_empty() {
                let _ = reply.send(Err(leave::not_registered(&consumer)));
                return;
            }
            let leave = LeaveInFlight { consumer, wants_drain, found, attempt: 0, reply };
            go_leave(inner, pending, leave, LeaveStep::ReadStore, true);
        }
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Runs one of the leader's store calls; a plan's batch that succeeded is applied and told
/// to the streams when the loop takes its answer in.
fn run_leader_job(pending: &Pending, group: GroupIndex, job: Job) {
    let store = pending.store.clone();
    pending.in_flight.push(Box::pin(async move {
        match job {
            Job::Txn(txn, why) => {
                let outcome = store.txn(txn.clone()).await;
                Done::Leader(group, Some(txn), why, LeaderAnswer::Txn(outcome))
            }
            Job::Read(key, why) => Done::Leader(group, None, why, LeaderAnswer::Read(store.get(&key).await)),
        }
    }));
}

/// Why the loop may not go on with a consumer's call now: it stopped, or
/// the instance lease is not live (read at each step, so a call taken in just after the
/// fence is refused too). `None`: it may.
fn refusal(inner: &Handoff, running: bool) -> Option<CoordinatorError> {
    if !running {
        return Some(stopping().into());
    }
    inner.core.live_lease().err()
}

/// Commits `txn` in a transaction of its own, for `writer`.
fn commit_alone(pending: &mut Pending, txn: Txn, writer: Writer) {
    let store = pending.store.clone();
    pending.in_flight.push(Box::pin(async move {
        let outcome = store.txn(txn.clone()).await;
        Done::Txn(txn, outcome, writer)
    }));
}

/// Does what `call` needs next; once the loop has stopped (`running` false) or while the
/// instance lease is not live ([`refusal`]), only an answer is given, and what would need
/// the store again is answered `UNAVAILABLE`.
fn go(inner: &Arc<Handoff>, pending: &mut Pending, call: CallInFlight, step: CallStep, running: bool) {
    let step = match refusal(inner, running) {
        Some(error) if !matches!(step, CallStep::Answer(_)) => CallStep::Answer(Err(error)),
        _ => step,
    };
    match step {
        CallStep::Answer(result) => answer(inner, call, result),
        CallStep::ReadStore => {
            let inner = inner.clone();
            pending.in_flight.push(Box::pin(async move {
                let slice = from_store(&inner, &call.topic, &call.consumer, call.partition).await;
                Done::Slice(call, slice)
            }));
        }
        CallStep::Write(txn, applied) if call.attempt == 0 => {
            let key = inner.core.keys().handoff(&call.topic, call.partition);
            let write = KeyWrite { key, compares: txn.compares, ops: txn.ops };
            pending.batches.queue(QueuedCall { write, call, applied });
        }
        CallStep::Write(txn, applied) => commit_alone(pending, txn, Writer::Call(call, applied)),
    }
}

/// Does what `leave` needs next, as [`go`] does for a call.
fn go_leave(inner: &Handoff, pending: &mut Pending, leave: LeaveInFlight, step: LeaveStep, running: bool) {
    let step = match refusal(inner, running) {
        Some(error) if !matches!(step, LeaveStep::Answer(_)) => LeaveStep::Answer(Err(error)),
        _ => step,
    };
    match step {
        LeaveStep::Answer(result) => answer_leave(inner, leave, result),
        LeaveStep::ReadStore => {
            let store = pending.store.clone();
            let keys = leave::keys_to_read(inner.core.keys(), &leave);
            pending.in_flight.push(Box::pin(async move {
                // The leaver's records and those of the candidates to take over, at once.
                let records = futures::future::try_join_all(keys.iter().map(|key| store.get(key))).await;
                Done::Records(leave, records)
            }));
        }
        LeaveStep::Write(txn, left) => commit_alone(pending, txn, Writer::Leave(leave, left)),
    }
}

/// Keeps what a `Deregister` wrote at `revision` in the streams held here it belongs to
/// ([`Left::kept`]), unless they keep a later record already.
fn keep_left(inner: &Handoff, left: &Left, consumer: &str, revision: crate::store::Revision) {
    for (key, record) in left.kept(consumer) {
        inner.core.streams().with(&key, |stream| {
            if stream.kept.as_ref().is_none_or(|kept| kept.0 < revision) {
                stream.kept = Some(Box::new((revision, record.to_vec())));
            }
        });
    }
}

/// The slice of `topic` that a call of `consumer` about `partition` reads, from the store
/// (`NOT_FOUND` for a topic nobody registered for).
async fn from_store(
    inner: &Handoff,
    topic: &str,
    consumer: &str,
    partition: u32,
) -> Result<PartitionSlice, CoordinatorError> {
    let keys = super::decide::slice_keys(inner.core.keys(), topic, consumer, partition);
    let mut records = Vec::with_capacity(keys.len());
    for key in &keys {
        records.push(inner.core.store().get(key).await?);
        if records[0].is_none() {
            break; // no topic record: nothing more to read
        }
    }
    super::decide::slice_from_records(topic, consumer, partition, &keys, &records)
}

/// Takes in what the store answered: applies what was written and tells the streams (while
/// the loop runs), then answers its writers, or decides again what lost.
fn finish(inner: &Arc<Handoff>, pending: &mut Pending, done: Done, running: bool) {
    match done {
        Done::Batch(batch, answer) => {
            if let (true, Ok(Some(written))) = (running, &answer) {
                applied(inner, written.revision, &written.ops, &written.compares);
            }
            for QueuedCall { mut call, applied, .. } in batch {
                let step = match &answer {
                    Ok(Some(_)) => CallStep::Answer(Ok(Some(applied))),
                    // A compare of the batch lost, maybe another call's: decide again.
                    Ok(None) => call.retry(),
                    Err(error) => CallStep::Answer(Err(error.clone().into())),
                };
                go(inner, pending, call, step, running);
            }
        }
        Done::Slice(mut call, slice) => {
            let step = match slice {
                // Nothing is decided once the loop has stopped.
                _ if !running => CallStep::ReadStore,
                Ok(slice) => {
                    next_step(inner.core.keys(), &mut call, &slice, true, now_ms(), &inner.config.plan)
                }
                Err(error) => CallStep::Answer(Err(error)),
            };
            go(inner, pending, call, step, running);
        }
        Done::Records(leave, records) => {
            let step = match records {
                // Nothing is decided once the loop has stopped.
                _ if !running => LeaveStep::ReadStore,
                Ok(records) => leave::decide_leave(&leave, &records, now_ms(), inner.config.restart_grace),
                Err(error) => LeaveStep::Answer(Err(error.into())),
            };
            go_leave(inner, pending, leave, step, running);
        }
        // After a stop nothing is applied, and the leader is gone with the loop.
        Done::Leader(..) | Done::Upkeep(_) | Done::Refreshed(..) => {}
        Done::Resigned(outcome) => {
            let instance = &inner.config.instance_id;
            match outcome {
                Ok(o) if o.succeeded => tracing::info!(%instance, "resigned leadership"),
                Ok(_) => tracing::info!(%instance, "stopped; the leader key was no longer ours"),
                Err(error) => {
                    tracing::warn!(%instance, %error, "could not resign leadership; it ends with the lease")
                }
            }
        }
        Done::Txn(txn, outcome, writer) => {
            if let (true, Ok(o)) = (running, &outcome)
                && o.succeeded
            {
                applied(inner, o.revision, &txn.ops, &txn.compares);
            }
            match writer {
                Writer::Call(mut call, written) => {
                    let step = match outcome {
                        Ok(o) if o.succeeded => CallStep::Answer(Ok(Some(written))),
                        // Nothing is decided again once the loop has stopped.
                        Ok(_) if !running => CallStep::ReadStore,
                        Ok(_) => call.retry(),
                        Err(error) => CallStep::Answer(Err(error.into())),
                    };
                    go(inner, pending, call, step, running);
                }
                Writer::Leave(mut leave, left) => {
                    let step = match outcome {
                        Ok(o) if o.succeeded => {
                            keep_left(inner, &left, &leave.consumer, o.revision);
                            LeaveStep::Answer(Ok(left))
                        }
                        Ok(_) if !running => LeaveStep::ReadStore,
                        Ok(_) => leave.retry(),
                        Err(error) => LeaveStep::Answer(Err(error.into())),
                    };
                    go_leave(inner, pending, leave, step, running);
                }
            }
        }
    }
}

/// Applies `ops`, committed here at `revision`, to the mirror at once where nothing else
/// happened in between ([`Mirror::apply_own_write`]) and tells the streams what changed.
///
/// [`Mirror::apply_own_write`]: crate::coordinator::shared::mirror::Mirror::apply_own_write
fn applied(inner: &Handoff, revision: crate::store::Revision, ops: &[Op], compares: &[Compare]) {
    if let Some(changes) = inner.core.mirror().apply_own_write(inner.core.keys(), revision, ops, compares) {
        relay::tell(inner, &changes);
    }
}
