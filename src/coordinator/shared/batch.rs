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
//! [`Batcher`] writes the registrations in a task of its own. The handoff instance's loop
//! (`handoff_backend/driver.rs`) batches the consumer calls' writes with the same
//! [`take_batch`] and [`commit`], inside the loop, so that it applies and relays each
//! batch it committed itself.

use std::{
    collections::{HashSet, VecDeque},
    sync::Arc,
};

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

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

/// A write waiting for its batch in the [`Batcher`], and where its answer goes.
struct Pending {
    write: KeyWrite,
    reply: oneshot::Sender<Answer>,
}

impl Queued for Pending {
    fn write(&self) -> &KeyWrite {
        &self.write
    }
}

/// A queue of writes of one instance, and its writer.
pub struct Batcher {
    queue: mpsc::UnboundedSender<Pending>,
    incoming: std::sync::Mutex<Option<mpsc::UnboundedReceiver<Pending>>>,
    /// Batch transactions in flight.
    in_flight: Arc<Semaphore>,
}

impl Default for Batcher {
    fn default() -> Self {
        let (queue, incoming) = mpsc::unbounded_channel();
        Self {
            queue,
            incoming: std::sync::Mutex::new(Some(incoming)),
            in_flight: Arc::new(Semaphore::new(BATCHES_IN_FLIGHT)),
        }
    }
}

impl Batcher {
    /// Queues `write` for the next batch and waits for its outcome. `UNAVAILABLE` once the
    /// writer has stopped.
    pub async fn write(&self, write: KeyWrite) -> Result<Batched, StoreError> {
        let (reply, answer) = oneshot::channel();
        let pending = Pending { write, reply };
        let stopped = || StoreError::Unavailable("the registration writer has stopped".into());
        self.queue.send(pending).map_err(|_| stopped())?;
        let written = answer.await.map_err(|_| stopped())??;
        Ok(written.map_or(Batched::Lost, |b| Batched::Written(b.revision)))
    }

    /// Writes the queued writes in batches until `stop` is cancelled. Runs once: a second
    /// call returns at once.
    pub async fn run(&self, store: Arc<dyn LeaseStore>, stop: CancellationToken) {
        let Some(mut incoming) = self.incoming.lock().ok().and_then(|mut slot| slot.take()) else { return };
        let in_flight = self.in_flight.clone();
        let mut waiting: VecDeque<Pending> = VecDeque::new();
        loop {
            if waiting.is_empty() {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    next = incoming.recv() => match next {
                        Some(pending) => waiting.push_back(pending),
                        None => return,
                    },
                }
            }
            // Waiting for a free slot lets more registrations queue up for this batch.
            let permit = tokio::select! {
                _ = stop.cancelled() => return,
                permit = in_flight.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
            };
            while let Ok(pending) = incoming.try_recv() {
                waiting.push_back(pending);
            }
            let batch = take_batch(&mut waiting);
            let store = store.clone();
            tokio::spawn(async move {
                let answer = commit(&*store, &batch).await;
                for pending in batch {
                    let _ = pending.reply.send(answer.clone());
                }
                drop(permit);
            });
        }
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

    use super::{BATCH, Batched, Batcher, KeyWrite};
    use crate::store::{Compare, LeaseStore, MemoryStore, Op};

    fn put(key: &str, expected: i64) -> KeyWrite {
        KeyWrite {
            key: key.into(),
            compares: vec![Compare::ModRevision(key.into(), expected)],
            ops: vec![Op::put(key, "v")],
        }
    }

    async fn started() -> (Arc<Batcher>, MemoryStore, tokio_util::sync::CancellationToken) {
        let memory = MemoryStore::new();
        let batcher = Arc::new(Batcher::default());
        let stop = tokio_util::sync::CancellationToken::new();
        let (runner, store, token) = (batcher.clone(), Arc::new(memory.clone()), stop.clone());
        tokio::spawn(async move { runner.run(store, token).await });
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
    async fn stopping_the_writer_answers_unavailable() {
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
        // The writer stops at its next turn; a write after that is refused.
        result.await.expect("refused once stopped");
    }
}
