//! Transactions that a step decided together, written together: an instance's books for
//! its batched writes (pure, over `shared/batch.rs`'s [`Batches`]).
//!
//! A storm of `Register`s or of `PartitionReady` / `PartitionReleased` calls would cost a
//! store round trip each; the running store's throughput comes from many writes per
//! transaction and a few transactions in flight. A writer's first attempt is queued here
//! with the key it is about; at the end of each step the instance sends what is due, one
//! transaction per batch, at most [`BATCHES_IN_FLIGHT`](crate::coordinator::shared::batch::BATCHES_IN_FLIGHT)
//! at once: while they are in flight, what is decided meanwhile waits and joins the next
//! batch, so the busier the store, the larger the batch. A transaction is all or nothing:
//! when a compare of a batch lost, each of its writers decides again and writes alone.
//!
//! The batches are decided in the step, not by the driver, because a batch's answer is a
//! decision input: which writers retry, and which writes are applied to the mirror at the
//! batch's revision. The simulation therefore checks batching as production runs it.

use crate::coordinator::shared::batch::{Batches, KeyWrite, Queued};
use crate::store::Txn;

/// A write waiting for its batch, and who waits for its answer.
#[derive(Debug)]
struct Waiter<W> {
    write: KeyWrite,
    writer: W,
}

impl<W> Queued for Waiter<W> {
    fn write(&self) -> &KeyWrite {
        &self.write
    }
}

/// One batch to send: its transaction (every write's compares and operations, in queue
/// order) and its writers in the same order.
#[derive(Debug)]
pub struct Batch<W> {
    /// The transaction to send.
    pub txn: Txn,
    /// Who waits for its answer.
    pub writers: Vec<W>,
}

/// An instance's batched writes of one kind (see the module docs).
#[derive(Debug)]
pub struct TxnBatches<W> {
    batches: Batches<Waiter<W>>,
}

impl<W> Default for TxnBatches<W> {
    fn default() -> Self {
        Self { batches: Batches::default() }
    }
}

impl<W> TxnBatches<W> {
    /// `txn`, about `key`, waits for its batch, answered to `writer`.
    pub fn queue(&mut self, key: String, txn: Txn, writer: W) {
        let Txn { compares, ops } = txn;
        self.batches.queue(Waiter { write: KeyWrite { key, compares, ops }, writer });
    }

    /// The batches to send now, each counted in flight until [`Self::answered`].
    pub fn due(&mut self) -> Vec<Batch<W>> {
        self.batches
            .due()
            .into_iter()
            .map(|waiters| {
                let mut batch = Batch { txn: Txn::new(), writers: Vec::with_capacity(waiters.len()) };
                for Waiter { write, writer } in waiters {
                    batch.txn.compares.extend(write.compares);
                    batch.txn.ops.extend(write.ops);
                    batch.writers.push(writer);
                }
                batch
            })
            .collect()
    }

    /// A batch from [`Self::due`] was answered (or failed).
    pub fn answered(&mut self) {
        self.batches.done();
    }

    /// Every writer still waiting for a batch, taken out (to be refused: the instance
    /// lost its lease or stops).
    pub fn take_waiting(&mut self) -> Vec<W> {
        std::iter::from_fn(|| self.batches.pop_waiting()).map(|waiter| waiter.writer).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::TxnBatches;
    use crate::coordinator::shared::batch::BATCHES_IN_FLIGHT;
    use crate::store::{Compare, Op, Txn};

    fn put(key: &str) -> Txn {
        Txn::new().when(Compare::ModRevision(key.into(), 0)).then(Op::put(key, "v"))
    }

    #[test]
    fn what_waits_while_batches_are_in_flight_joins_one_batch() {
        let mut books = TxnBatches::default();
        for i in 0..BATCHES_IN_FLIGHT {
            books.queue(format!("k{i}"), put(&format!("k{i}")), i);
            assert_eq!(books.due().len(), 1, "alone while fewer than the limit are in flight");
        }
        for i in 10..20 {
            books.queue(format!("k{i}"), put(&format!("k{i}")), i);
        }
        assert!(books.due().is_empty(), "nothing more goes out while the limit is in flight");
        books.answered();
        let due = books.due();
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].writers, (10..20).collect::<Vec<_>>());
        assert_eq!(due[0].txn.ops.len(), 10);
        assert_eq!(due[0].txn.compares.len(), 10);
    }

    #[test]
    fn writers_waiting_are_taken_out_to_be_refused() {
        let mut books = TxnBatches::default();
        for i in 0..BATCHES_IN_FLIGHT + 2 {
            books.queue(format!("k{i}"), put(&format!("k{i}")), i);
            let _ = books.due();
        }
        assert_eq!(books.take_waiting(), vec![BATCHES_IN_FLIGHT, BATCHES_IN_FLIGHT + 1]);
        books.answered();
        assert!(books.due().is_empty());
    }
}
