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
//! is answered as lost and each of its writes falls back to its own read and
//! compare-and-swap.
//!
//! A writer keeps its books in [`Batches`] (which cuts each batch with `take_batch`); the
//! state machines do, through `coordinator/machine/batching.rs`, which sends each batch as
//! one transaction.

use std::collections::{HashSet, VecDeque};

use crate::store::{Compare, Op};

/// Writes per transaction, at most.
pub const BATCH: usize = 64;

/// Compares, and operations, per transaction, at most: etcd refuses more than 128 of
/// either by default (`--max-txn-ops`).
pub const TXN_LIMIT: usize = 120;

/// Batch transactions in flight at once.
pub const BATCHES_IN_FLIGHT: usize = 4;

/// One write: `ops`, if `compares` hold.
#[derive(Clone, Debug)]
pub struct KeyWrite {
    /// What the write is about: a batch holds no two writes that touch a key one of them
    /// writes, this one included ([`Batches::due`]).
    pub key: String,
    /// What the write was decided from.
    pub compares: Vec<Compare>,
    /// The write.
    pub ops: Vec<Op>,
}

/// Something queued for a batch: a write, and whatever its writer needs with the answer.
pub trait Queued {
    /// The write.
    fn write(&self) -> &KeyWrite;
}

/// The writes waiting for their batch, and how many batches are in flight: a writer's books
/// for its batches. While [`BATCHES_IN_FLIGHT`] batches are in flight, what arrives waits
/// and joins the next batch, so the busier the store, the larger the batch.
#[derive(Debug)]
pub struct Batches<P> {
    waiting: VecDeque<P>,
    in_flight: usize,
}

impl<P> Default for Batches<P> {
    fn default() -> Self {
        Self { waiting: VecDeque::new(), in_flight: 0 }
    }
}

impl<P: Queued> Batches<P> {
    /// `pending` waits for its batch.
    pub fn queue(&mut self, pending: P) {
        self.waiting.push_back(pending);
    }

    /// The batches to commit now, each counted in flight until
    /// [`done`](Self::done).
    pub fn due(&mut self) -> Vec<Vec<P>> {
        let mut batches = Vec::new();
        while self.in_flight < BATCHES_IN_FLIGHT && !self.waiting.is_empty() {
            self.in_flight += 1;
            batches.push(take_batch(&mut self.waiting));
        }
        batches
    }

    /// The first write still waiting for its batch, taken out of the queue.
    pub fn pop_waiting(&mut self) -> Option<P> {
        self.waiting.pop_front()
    }

    /// A batch from [`due`](Self::due) was committed.
    pub fn done(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }
}

/// Takes up to [`BATCH`] writes that touch no key another one writes, within
/// [`TXN_LIMIT`], off the front of `waiting`, keeping the order of the rest (a write that
/// clashes waits for the next batch). The first write is always taken.
///
/// etcd refuses a transaction that writes one key twice, and a batch's compares are all
/// read before any of its writes: a write whose compare reads a key another one of the
/// batch writes would be decided on a record the batch replaces. So the keys a write
/// writes are kept apart from every key of the others, and the keys it compares from the
/// keys the others write; keys that several writes only compare are shared freely.
fn take_batch<P: Queued>(waiting: &mut VecDeque<P>) -> Vec<P> {
    let mut batch = Vec::new();
    let (mut written, mut compared) = (HashSet::new(), HashSet::new());
    let mut rest = VecDeque::new();
    let (mut compares, mut ops) = (0, 0);
    while let Some(pending) = waiting.pop_front() {
        // A full batch, or a long run of writes that clash (a storm of one name): the rest
        // waits unread, so taking a batch never costs more than a few batches' worth.
        if batch.len() == BATCH || rest.len() == SKIPPED_AT_MOST {
            rest.push_back(pending);
            break;
        }
        let write = pending.write();
        let fits = batch.is_empty()
            || (compares + write.compares.len() <= TXN_LIMIT
                && ops + write.ops.len() <= TXN_LIMIT
                && !clashes(write, &written, &compared));
        if fits {
            written.insert(write.key.clone());
            written.extend(write.ops.iter().map(|op| op_key(op).to_owned()));
            compared.extend(write.compares.iter().map(|c| compare_key(c).to_owned()));
            compares += write.compares.len();
            ops += write.ops.len();
            batch.push(pending);
        } else {
            rest.push_back(pending);
        }
    }
    rest.append(waiting);
    *waiting = rest;
    batch
}

/// How many writes that do not fit [`take_batch`] passes over before it stops looking.
const SKIPPED_AT_MOST: usize = 4 * BATCH;

/// Whether `write` touches a key the batch so far writes, or writes a key it compares.
fn clashes(write: &KeyWrite, written: &HashSet<String>, compared: &HashSet<String>) -> bool {
    let mut writes = std::iter::once(write.key.as_str()).chain(write.ops.iter().map(op_key));
    writes.any(|key| written.contains(key) || compared.contains(key))
        || write.compares.iter().any(|c| written.contains(compare_key(c)))
}

/// The key an operation writes.
fn op_key(op: &Op) -> &str {
    match op {
        Op::Put { key, .. } | Op::Delete { key } => key,
    }
}

/// The key a compare reads.
fn compare_key(compare: &Compare) -> &str {
    match compare {
        Compare::ModRevision(key, _) | Compare::CreateRevision(key, _) | Compare::Value(key, _) => key,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::{StreamExt, stream::FuturesUnordered};
    use tokio::sync::{mpsc, oneshot};

    use super::{BATCH, Batches, KeyWrite, Queued};
    use crate::store::{Compare, LeaseStore, MemoryStore, Op, Revision, StoreError, Txn};

    /// How a write ended: written at a revision, or `None` when a compare of its batch lost.
    type Outcome = Result<Option<Revision>, StoreError>;

    /// Commits `batch` in one transaction; the outcome is for each of its writes.
    async fn commit(store: &dyn LeaseStore, batch: &[Pending]) -> Outcome {
        let mut txn = Txn::new();
        for pending in batch {
            txn.compares.extend(pending.write().compares.iter().cloned());
            txn.ops.extend(pending.write().ops.iter().cloned());
        }
        let outcome = store.txn(txn).await?;
        Ok(outcome.succeeded.then_some(outcome.revision))
    }

    /// A write and where its outcome goes.
    struct Pending(KeyWrite, oneshot::Sender<Outcome>);

    impl Queued for Pending {
        fn write(&self) -> &KeyWrite {
            &self.0
        }
    }

    fn put(key: &str, expected: i64) -> KeyWrite {
        KeyWrite {
            key: key.into(),
            compares: vec![Compare::ModRevision(key.into(), expected)],
            ops: vec![Op::put(key, "v")],
        }
    }

    /// A task that takes writes and commits them in batches, as a writer does;
    /// it stops when the sender is dropped.
    fn started(store: &MemoryStore) -> mpsc::UnboundedSender<Pending> {
        let (sender, mut incoming) = mpsc::unbounded_channel::<Pending>();
        let store = Arc::new(store.clone());
        tokio::spawn(async move {
            let (mut batches, mut in_flight) = (Batches::default(), FuturesUnordered::new());
            loop {
                for batch in batches.due() {
                    let store = store.clone();
                    in_flight.push(async move {
                        let answer = commit(&*store, &batch).await;
                        for Pending(_, reply) in batch {
                            let _ = reply.send(answer.clone());
                        }
                    });
                }
                tokio::select! {
                    pending = incoming.recv() => match pending {
                        Some(pending) => {
                            batches.queue(pending);
                            while let Ok(pending) = incoming.try_recv() {
                                batches.queue(pending);
                            }
                        }
                        None => return,
                    },
                    Some(()) = in_flight.next(), if !in_flight.is_empty() => batches.done(),
                }
            }
        });
        sender
    }

    async fn write(loop_: &mpsc::UnboundedSender<Pending>, write: KeyWrite) -> Outcome {
        let (reply, answer) = oneshot::channel();
        assert!(loop_.send(Pending(write, reply)).is_ok(), "the loop runs");
        answer.await.expect("answered")
    }

    /// Sends every write of `writes` at once, asserts each was written, and returns how
    /// many transactions they took.
    async fn transactions_for(store: &MemoryStore, writes: Vec<KeyWrite>) -> i64 {
        let loop_ = started(store);
        let before = store.revision();
        let outcomes = futures::future::join_all(writes.into_iter().map(|w| write(&loop_, w))).await;
        assert!(outcomes.iter().all(|o| matches!(o, Ok(Some(_)))), "{outcomes:?}");
        store.revision() - before
    }

    #[tokio::test]
    async fn writes_that_arrive_together_share_transactions() {
        let store = MemoryStore::new();
        let writes = (0..500).map(|i| put(&format!("k{i}"), 0)).collect();
        let transactions = transactions_for(&store, writes).await;
        assert!(transactions < 500 / 4, "500 writes took {transactions} transactions");
        assert!(transactions >= (500 / BATCH) as i64, "no transaction holds more than {BATCH}");
        assert_eq!(store.get_prefix("k").await.expect("read").kvs.len(), 500);
    }

    #[tokio::test]
    async fn a_batch_stays_within_the_stores_limit_of_compares_per_transaction() {
        let store = MemoryStore::new();
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
        let transactions = transactions_for(&store, writes).await;
        assert!(transactions >= 3, "100 writes of 3 compares in {transactions} transactions");
    }

    #[tokio::test]
    async fn a_lost_compare_loses_its_whole_batch_and_writes_nothing() {
        let store = MemoryStore::new();
        let loop_ = started(&store);
        store.put("taken", b"x".to_vec(), None).await.expect("written");
        let before = store.revision();
        let (good, bad) = tokio::join!(write(&loop_, put("free", 0)), write(&loop_, put("taken", 0)));
        assert_eq!(bad.expect("answered"), None);
        // `free` was in the same batch (lost with it) or in a batch of its own (written).
        match good.expect("answered") {
            None => assert_eq!(store.revision(), before, "a lost batch writes nothing"),
            Some(_) => assert!(store.get("free").await.expect("read").is_some()),
        }
    }

    #[tokio::test]
    async fn two_writes_of_one_key_never_share_a_transaction() {
        let store = MemoryStore::new();
        let loop_ = started(&store);
        let (first, second) = tokio::join!(write(&loop_, put("k", 0)), write(&loop_, put("k", 0)));
        let outcomes = [first.expect("answered"), second.expect("answered")];
        let written = outcomes.iter().filter(|o| o.is_some()).count();
        assert_eq!(written, 1, "exactly one creates the key: {outcomes:?}");
    }

    #[test]
    fn no_more_than_the_bound_of_batches_is_in_flight_and_the_rest_joins_the_next() {
        let mut batches = Batches::default();
        for i in 0..(BATCH * super::BATCHES_IN_FLIGHT + 10) {
            let (reply, _) = oneshot::channel();
            batches.queue(Pending(put(&format!("k{i}"), 0), reply));
        }
        let due = batches.due();
        assert_eq!(due.len(), super::BATCHES_IN_FLIGHT);
        assert!(due.iter().all(|b| b.len() == BATCH));
        assert!(batches.due().is_empty(), "every slot is taken");
        batches.done();
        let next = batches.due();
        assert_eq!(next.iter().map(Vec::len).collect::<Vec<_>>(), [10], "the rest, once a slot is free");
    }

    #[test]
    fn writes_that_touch_a_key_another_writes_wait_for_the_next_batch() {
        let mut batches = Batches::default();
        let raise = |key: &str, shared: &str| KeyWrite {
            key: key.into(),
            compares: vec![Compare::ModRevision(key.into(), 1), Compare::ModRevision(shared.into(), 1)],
            ops: vec![Op::put(key, "v"), Op::put(shared, "v")],
        };
        let reader = KeyWrite {
            key: "c".into(),
            compares: vec![Compare::ModRevision("h".into(), 1), Compare::ModRevision("t".into(), 1)],
            ops: vec![Op::put("c", "v")],
        };
        let other_reader = KeyWrite {
            key: "d".into(),
            compares: vec![Compare::ModRevision("t".into(), 1)],
            ops: vec![Op::put("d", "v")],
        };
        for write in [raise("a", "h"), raise("b", "h"), reader, other_reader] {
            batches.queue(Pending(write, tokio::sync::oneshot::channel().0));
        }
        let keys = |batch: &[Pending]| batch.iter().map(|p| p.0.key.clone()).collect::<Vec<_>>();
        let due = batches.due();
        // "b" writes "h", which "a" writes; "c" compares "h": both wait. "d" only shares
        // a compared key with "c".
        assert_eq!(keys(&due[0]), ["a", "d"]);
        assert_eq!(keys(&due[1]), ["b"]);
        assert_eq!(keys(&due[2]), ["c"]);
    }
}
