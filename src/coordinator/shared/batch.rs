//! Writes that arrive together are written together: one store transaction per batch,
//! instead of a transaction (or a read and a compare-and-swap) each.
//!
//! A storm of `Register`s (a fleet restarting, the end of an outage) or of consumer calls
//! (a scale-out: thousands of `PartitionReady` and `PartitionReleased` at once) would
//! otherwise cost a store round trip each, and etcd's throughput comes from many writes
//! per transaction and many transactions in flight. Each write brings its compares (what
//! it was decided from) and its operations. The writer takes whatever is queued, at most
//! one write per key and within etcd's limits per transaction ([`BATCH`],
//! [`TXN_LIMIT`]), and commits the batch in one transaction, with up to
//! [`BATCHES_IN_FLIGHT`] transactions at once: the busier the store, the more queues up
//! behind them and the larger the next batch. A transaction is all or nothing, so if any
//! compare lost (a cache behind the store, a concurrent write elsewhere), the whole batch
//! is answered [`Batched::Lost`] and each of its writes falls back to its own
//! read and compare-and-swap.
//!
//! Every batch is committed by the instance's loop, among its other store calls: the
//! registrations queued by their callers ([`Batcher`], [`Batches`], run by the loop's
//! upkeep, `upkeep.rs`), and the handoff backend's consumer calls, which its loop
//! (`handoff_backend/driver.rs`) batches with the same [`take_batch`] and [`commit`] so
//! that it applies and relays each batch it committed itself.

use std::{
    collections::{HashSet, VecDeque},
    sync::Arc,
};

use tokio::sync::{mpsc, oneshot};

use crate::store::{Compare, LeaseStore, Op, Revision, StoreError, Txn};

/// Writes per transaction, at most.
pub const BATCH: usize = 64;

/// Compares, and operations, per transaction, at most: etcd refuses more than 128 of
/// either by default (`--max-txn-ops`).
pub const TXN_LIMIT: usize = 120;

/// Batch transactions in flight at once.
pub const BATCHES_IN_FLIGHT: usize = 4;

/// How a batched write ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batched {
    /// Written at this revision.
    Written(Revision),
    /// A compare of the batch lost: nothing of it was written.
    Lost,
}

/// One write: `ops`, if `compares` hold.
#[derive(Clone, Debug)]
pub struct KeyWrite {
    /// What the write is about (a batch holds each key at most once). Two writes of
    /// different keys must write different records: etcd refuses a transaction that
    /// writes one key twice.
    pub key: String,
    /// What the write was decided from.
    pub compares: Vec<Compare>,
    /// The write.
    pub ops: Vec<Op>,
}

/// A batch that was written: its revision and every operation of it, what the watch will
/// deliver at that revision, for a writer that applies its own writes at once.
#[derive(Clone, Debug)]
pub struct WrittenBatch {
    /// The revision it was written at.
    pub revision: Revision,
    /// Every operation of the batch.
    pub ops: Arc<[Op]>,
    /// Every compare of the batch (what its operations were decided from).
    pub compares: Arc<[Compare]>,
}

/// How a batch ended, as each of its writers hears it: `None` if a compare lost.
pub type Answer = Result<Option<WrittenBatch>, StoreError>;

/// Something queued for a batch: a write, and whatever its writer needs with the answer.
pub trait Queued {
    /// The write.
    fn write(&self) -> &KeyWrite;
}

/// A write waiting for its batch, and where its answer goes.
#[derive(Debug)]
pub struct Pending {
    write: KeyWrite,
    reply: oneshot::Sender<Answer>,
}

impl Queued for Pending {
    fn write(&self) -> &KeyWrite {
        &self.write
    }
}

/// The queue of an instance's registration writes. A writer queues one and waits for its
/// answer ([`write`](Self::write)); the instance's loop takes the queue
/// ([`incoming`](Self::incoming)), keeps the writes waiting for their batch
/// ([`Batches`]) and commits each batch among its other store calls
/// ([`commit_and_answer`]).
pub struct Batcher {
    queue: mpsc::UnboundedSender<Pending>,
    incoming: std::sync::Mutex<Option<mpsc::UnboundedReceiver<Pending>>>,
}

impl Default for Batcher {
    fn default() -> Self {
        let (queue, incoming) = mpsc::unbounded_channel();
        Self { queue, incoming: std::sync::Mutex::new(Some(incoming)) }
    }
}

impl Batcher {
    /// Queues `write` for the next batch and waits for its outcome. `UNAVAILABLE` once the
    /// loop has stopped.
    pub async fn write(&self, write: KeyWrite) -> Result<Batched, StoreError> {
        let (reply, answer) = oneshot::channel();
        let pending = Pending { write, reply };
        let stopped = || StoreError::Unavailable("this assigner instance is stopping".into());
        self.queue.send(pending).map_err(|_| stopped())?;
        let written = answer.await.map_err(|_| stopped())??;
        Ok(written.map_or(Batched::Lost, |b| Batched::Written(b.revision)))
    }

    /// The queued writes, for the instance's loop: `None` once a loop took them.
    pub fn incoming(&self) -> Option<mpsc::UnboundedReceiver<Pending>> {
        self.incoming.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The writes waiting for their batch, and how many batches are in flight: the loop's
/// books for the [`Batcher`]. While [`BATCHES_IN_FLIGHT`] batches are in flight, what
/// arrives waits and joins the next batch, so the busier the store, the larger the batch.
#[derive(Debug, Default)]
pub struct Batches {
    waiting: VecDeque<Pending>,
    in_flight: usize,
}

impl Batches {
    /// `first`, and every write queued behind it in `incoming`, wait for their batch.
    pub fn queue(&mut self, first: Pending, incoming: &mut mpsc::UnboundedReceiver<Pending>) {
        self.waiting.push_back(first);
        while let Ok(pending) = incoming.try_recv() {
            self.waiting.push_back(pending);
        }
    }

    /// The batches to commit now, each counted in flight until [`done`](Self::done).
    pub fn due(&mut self) -> Vec<Vec<Pending>> {
        let mut batches = Vec::new();
        while self.in_flight < BATCHES_IN_FLIGHT && !self.waiting.is_empty() {
            self.in_flight += 1;
            batches.push(take_batch(&mut self.waiting));
        }
        batches
    }

    /// A batch from [`due`](Self::due) was committed and answered.
    pub fn done(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }
}

/// Commits `batch` in one transaction and answers each of its writers.
pub async fn commit_and_answer(store: &dyn LeaseStore, batch: Vec<Pending>) {
    let answer = commit(store, &batch).await;
    for pending in batch {
        let _ = pending.reply.send(answer.clone());
    }
}

/// Takes up to [`BATCH`] writes of distinct keys, within [`TXN_LIMIT`], off the front of
/// `waiting`, keeping the order of the rest (a second write of a key waits for the next
/// batch). The first write is always taken.
pub fn take_batch<P: Queued>(waiting: &mut VecDeque<P>) -> Vec<P> {
    let mut batch = Vec::new();
    let mut keys = HashSet::new();
    let mut rest = VecDeque::new();
    let (mut compares, mut ops) = (0, 0);
    while let Some(pending) = waiting.pop_front() {
        let write = pending.write();
        let fits = batch.is_empty()
            || (batch.len() < BATCH
                && compares + write.compares.len() <= TXN_LIMIT
                && ops + write.ops.len() <= TXN_LIMIT);
        if fits && keys.insert(write.key.clone()) {
            compares += write.compares.len();
            ops += write.ops.len();
            batch.push(pending);
        } else {
            rest.push_back(pending);
        }
    }
    *waiting = rest;
    batch
}

/// Commits `batch` in one transaction; the answer is for each of its writes.
pub async fn commit<P: Queued>(store: &dyn LeaseStore, batch: &[P]) -> Answer {
    let mut txn = Txn::new();
    for pending in batch {
        txn.compares.extend(pending.write().compares.iter().cloned());
        txn.ops.extend(pending.write().ops.iter().cloned());
    }
    let (ops, compares): (Arc<[Op]>, Arc<[Compare]>) = (txn.ops.clone().into(), txn.compares.clone().into());
    let outcome = store.txn(txn).await?;
    Ok(outcome.succeeded.then_some(WrittenBatch { revision: outcome.revision, ops, compares }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::{StreamExt, stream::FuturesUnordered};

    use super::{BATCH, Batched, Batcher, Batches, KeyWrite, commit_and_answer};
    use crate::store::{Compare, LeaseStore, MemoryStore, Op};

    fn put(key: &str, expected: i64) -> KeyWrite {
        KeyWrite {
            key: key.into(),
            compares: vec![Compare::ModRevision(key.into(), expected)],
            ops: vec![Op::put(key, "v")],
        }
    }

    /// A batcher, and a loop that commits its batches as the instance's loop does, until
    /// `stop` is cancelled.
    async fn started() -> (Arc<Batcher>, MemoryStore, tokio_util::sync::CancellationToken) {
        let memory = MemoryStore::new();
        let batcher = Arc::new(Batcher::default());
        let stop = tokio_util::sync::CancellationToken::new();
        let (mut incoming, store, token) =
            (batcher.incoming().expect("the queue"), Arc::new(memory.clone()), stop.clone());
        assert!(batcher.incoming().is_none(), "one loop takes the queue");
        tokio::spawn(async move {
            let (mut batches, mut in_flight) = (Batches::default(), FuturesUnordered::new());
            loop {
                for batch in batches.due() {
                    let store = store.clone();
                    in_flight.push(async move { commit_and_answer(&*store, batch).await });
                }
                tokio::select! {
                    () = token.cancelled() => return,
                    Some(pending) = incoming.recv() => batches.queue(pending, &mut incoming),
                    Some(()) = in_flight.next(), if !in_flight.is_empty() => batches.done(),
                }
            }
        });
        (batcher, memory, stop)
    }

    /// Sends every write of `writes` at once, asserts each was written, and returns how
    /// many transactions they took.
    async fn transactions_for(batcher: &Arc<Batcher>, store: &MemoryStore, writes: Vec<KeyWrite>) -> i64 {
        let before = store.revision();
        let outcomes = futures::future::join_all(writes.into_iter().map(|write| batcher.write(write))).await;
        assert!(outcomes.iter().all(|o| matches!(o, Ok(Batched::Written(_)))), "{outcomes:?}");
        store.revision() - before
    }

    #[tokio::test]
    async fn writes_that_arrive_together_share_transactions() {
        let (batcher, store, _stop) = started().await;
        let writes = (0..500).map(|i| put(&format!("k{i}"), 0)).collect();
        let transactions = transactions_for(&batcher, &store, writes).await;
        assert!(transactions < 500 / 4, "500 writes took {transactions} transactions");
        assert!(transactions >= (500 / BATCH) as i64, "no transaction holds more than {BATCH}");
        assert_eq!(store.get_prefix("k").await.expect("read").kvs.len(), 500);
    }

    #[tokio::test]
    async fn a_batch_stays_within_the_stores_limit_of_compares_per_transaction() {
        let (batcher, store, _stop) = started().await;
        // Three compares each: at most 40 such writes fit one transaction.
        let writes = (0..100)
            .map(|i| {
                let mut write = put(&format!("k{i}"), 0);
                write
                    .compares
                    .extend([Compare::ModRevision("x".into(), 0), Compare::ModRevision("y".into(), 0)]);
                write
            })
            .collect();
        let transactions = transactions_for(&batcher, &store, writes).await;
        assert!(transactions >= 3, "100 writes of 3 compares in {transactions} transactions");
    }

    #[tokio::test]
    async fn a_lost_compare_loses_its_whole_batch_and_writes_nothing() {
        let (batcher, store, _stop) = started().await;
        store.put("taken", b"x".to_vec(), None).await.expect("written");
        let before = store.revision();
        let (good, bad) = tokio::join!(batcher.write(put("free", 0)), batcher.write(put("taken", 0)));
        assert_eq!(bad.expect("answered"), Batched::Lost);
        // `free` was in the same batch (lost with it) or in a batch of its own (written).
        match good.expect("answered") {
            Batched::Lost => assert_eq!(store.revision(), before, "a lost batch writes nothing"),
            Batched::Written(_) => assert!(store.get("free").await.expect("read").is_some()),
        }
    }

    #[tokio::test]
    async fn two_writes_of_one_key_never_share_a_transaction() {
        let (batcher, _store, _stop) = started().await;
        let (first, second) = tokio::join!(batcher.write(put("k", 0)), batcher.write(put("k", 0)));
        let outcomes = [first.expect("answered"), second.expect("answered")];
        let written = outcomes.iter().filter(|o| matches!(o, Batched::Written(_))).count();
        assert_eq!(written, 1, "exactly one creates the key: {outcomes:?}");
    }

    #[tokio::test]
    async fn stopping_the_loop_answers_unavailable() {
        let (batcher, _store, stop) = started().await;
        stop.cancel();
        let result = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            loop {
                if batcher.write(put("k", 0)).await.is_err() {
                    return;
                }
                tokio::task::yield_now().await;
            }
        });
        // The loop stops at its next turn; a write after that is refused.
        result.await.expect("refused once stopped");
    }
}
