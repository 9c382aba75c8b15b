//! The handoff instance's loop: the one task that changes the cache and tells the streams.
//!
//! Its inputs are the store's changes (the mirror's [`Follower`]: watched revisions,
//! re-reads), the writes of consumer calls, the leader's transactions, and the store's
//! answers to them. Each change, watched or committed here, is applied to the mirror and
//! relayed to the local streams (`relay.rs`) by this task, so no two relay passes ever
//! run at once, and a committed `PartitionReady` is applied and its two commands handed to
//! the two streams by the task that saw its commit, without waiting for the watch to bring
//! it back (docs/design.md §9).
//!
//! Calls' writes that arrive together share transactions ([`batch`]: at most
//! [`BATCHES_IN_FLIGHT`] batches in flight, the rest queue and join the next batch); a
//! transaction of its own (the leader's plan, a call decided again on the store's state)
//! starts at once. Transactions run inside the loop, beside its other inputs, not in tasks
//! of their own.
//!
//! [`Follower`]: crate::coordinator::shared::mirror::Follower

use std::{collections::VecDeque, sync::Arc};

use futures::{StreamExt, future::BoxFuture, stream::FuturesUnordered};
use tokio::sync::{mpsc, oneshot};

use super::{Handoff, relay};
use crate::coordinator::shared::batch::{self, Answer, BATCHES_IN_FLIGHT, KeyWrite, Pending};
use crate::store::{Compare, LeaseStore, Op, StoreError, Txn, TxnOutcome};

/// An input of the loop from a caller, with where its answer goes.
enum Input {
    /// A call's write, batched with those that arrive with it.
    Batched(Pending),
    /// A transaction of its own.
    Alone(Txn, oneshot::Sender<Result<TxnOutcome, StoreError>>),
}

/// A transaction the store answered.
enum Done {
    /// A batch of calls' writes.
    Batch(Vec<Pending>, Answer),
    /// A transaction of its own: its operations and compares, and the answer.
    Alone(Txn, Result<TxnOutcome, StoreError>, oneshot::Sender<Result<TxnOutcome, StoreError>>),
}

/// Where this instance's writes of owner and handoff records go: to the loop, which
/// commits them, applies them and tells the streams before it answers.
pub(super) struct Writes {
    inputs: mpsc::UnboundedSender<Input>,
}

/// The receiving end of [`Writes`], for [`run`].
pub(super) struct Inputs(mpsc::UnboundedReceiver<Input>);

/// A loop's [`Writes`] and its inputs.
pub(super) fn channel() -> (Writes, Inputs) {
    let (inputs, receiver) = mpsc::unbounded_channel();
    (Writes { inputs }, Inputs(receiver))
}

fn stopped() -> StoreError {
    StoreError::Unavailable("this assigner instance is stopping".into())
}

impl Writes {
    /// Commits `write` with the calls' writes that arrive with it. `true` once it is
    /// written, applied and told to the streams; `false` if a compare of its batch lost
    /// (nothing of the batch was written).
    pub async fn write(&self, write: KeyWrite) -> Result<bool, StoreError> {
        let (pending, answer) = Pending::new(write);
        self.inputs.send(Input::Batched(pending)).map_err(|_| stopped())?;
        Ok(answer.await.map_err(|_| stopped())??.is_some())
    }

    /// Commits `txn` (owner and handoff records only: their cache reads no create
    /// revision) in a transaction of its own; once it succeeded it is applied and told to
    /// the streams before the answer comes.
    pub async fn txn(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.inputs.send(Input::Alone(txn, reply)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Runs the instance's loop until shutdown (see the module docs). What is in flight then
/// still completes and is answered (as in a process that stalled mid-call and resumed),
/// but is no longer applied: the streams are gone.
pub(super) async fn run(inner: Arc<Handoff>, inputs: Inputs) {
    let Inputs(mut inputs) = inputs;
    let store = inner.core.shared_store();
    let mut follower = inner.core.follower(inner.config.resync_interval);
    let mut waiting: VecDeque<Pending> = VecDeque::new();
    let mut in_flight: FuturesUnordered<BoxFuture<'static, Done>> = FuturesUnordered::new();
    let mut batches = 0;
    loop {
        while batches < BATCHES_IN_FLIGHT && !waiting.is_empty() {
            batches += 1;
            in_flight.push(commit_batch(store.clone(), batch::take_batch(&mut waiting)));
        }
        tokio::select! {
            changes = follower.next() => match changes {
                Some(changes) => relay::tell(&inner, &changes),
                None => break,
            },
            input = inputs.recv() => {
                let Some(input) = input else { break };
                // Whatever else is queued joins the same batch.
                for input in std::iter::once(input).chain(std::iter::from_fn(|| inputs.try_recv().ok())) {
                    match input {
                        Input::Batched(pending) => waiting.push_back(pending),
                        Input::Alone(txn, reply) => in_flight.push(commit_alone(store.clone(), txn, reply)),
                    }
                }
            }
            Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                batches -= usize::from(matches!(done, Done::Batch(..)));
                finish(&inner, done, true);
            }
        }
    }
    while let Some(done) = in_flight.next().await {
        finish(&inner, done, false);
    }
}

/// Commits a batch of calls' writes.
fn commit_batch(store: Arc<dyn LeaseStore>, batch: Vec<Pending>) -> BoxFuture<'static, Done> {
    Box::pin(async move {
        let answer = batch::commit(&*store, &batch).await;
        Done::Batch(batch, answer)
    })
}

/// Commits a transaction of its own.
fn commit_alone(
    store: Arc<dyn LeaseStore>,
    txn: Txn,
    reply: oneshot::Sender<Result<TxnOutcome, StoreError>>,
) -> BoxFuture<'static, Done> {
    Box::pin(async move {
        let outcome = store.txn(txn.clone()).await;
        Done::Alone(txn, outcome, reply)
    })
}

/// Applies what `done` wrote (when `apply`: the loop still runs), tells the streams, then
/// answers its writers.
fn finish(inner: &Handoff, done: Done, apply: bool) {
    match done {
        Done::Batch(batch, answer) => {
            if let (true, Ok(Some(written))) = (apply, &answer) {
                applied(inner, written.revision, &written.ops, &written.compares);
            }
            for pending in batch {
                let _ = pending.reply.send(answer.clone());
            }
        }
        Done::Alone(txn, outcome, reply) => {
            if let (true, Ok(o)) = (apply, &outcome)
                && o.succeeded
            {
                applied(inner, o.revision, &txn.ops, &txn.compares);
            }
            let _ = reply.send(outcome);
        }
    }
}

/// Applies `ops`, committed here at `revision`, to the mirror at once where nothing else
/// happened in between ([`Core::apply_own_write`]) and tells the streams what changed.
///
/// [`Core::apply_own_write`]: crate::coordinator::shared::Core::apply_own_write
fn applied(inner: &Handoff, revision: crate::store::Revision, ops: &[Op], compares: &[Compare]) {
    if let Some(changes) = inner.core.apply_own_write(revision, ops, compares) {
        relay::tell(inner, &changes);
    }
}
