//! A sink-side fence (docs/design.md §10): remembers the highest epoch seen per partition
//! and refuses lower ones, so a superseded owner (slow, cut off, or still inside a warm
//! handoff's release window) cannot write once a newer owner has.
//!
//! The fence must live where the writes land (the sink, or the process that is the only
//! way into it): a fence inside each consumer only sees that consumer's own writes.
//!
//! A check alone does not fence a write that follows it: two writers can pass
//! [`Fence::admit`] in one order (epoch 5, then 9) and write in the other (9, then 5), and
//! the superseded owner's write lands last. The guarded forms close that gap: a
//! [`FenceGuard`] ([`Fence::lock`], [`Fence::lock_async`], [`Fence::admit_then`],
//! [`Fence::admit_then_async`]) holds its partition's slot from the check until the write
//! is done, so a writer with a higher epoch waits for the lower one's write to finish, and
//! once it is admitted every lower epoch is refused. The slot is per partition: writes of
//! different partitions never wait for each other.

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Condvar, Mutex, MutexGuard},
};

use tokio::sync::Notify;

use crate::Partition;

/// A write carried an epoch below the highest one seen for its partition: a newer owner
/// has written since.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "stale epoch for {topic}/{partition}: offered {offered}, but epoch {highest} was seen: \
     a newer owner has taken the partition over"
)]
pub struct StaleEpoch {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// The epoch the refused write carried.
    pub offered: u64,
    /// The highest epoch seen for the partition.
    pub highest: u64,
}

/// The highest epoch seen per (topic, partition); thread-safe (`&self`), cheap to share in
/// an `Arc`.
///
/// Epoch 0 (an assigner that hands out no epochs) is the lowest epoch like any other: it
/// passes while the partition has seen no real epoch, and is refused once one was seen, so
/// mixing assigners with and without epochs fences the writers without them, the safe side.
/// Equal epochs pass: the same ownership may write many times, and an owner that
/// reconnects keeps its epoch.
#[derive(Debug, Default)]
pub struct Fence {
    /// topic → partition → its slot. Held only to find a slot, never across a write.
    slots: Mutex<HashMap<String, HashMap<u32, Arc<Slot>>>>,
}

/// One partition's highest epoch, and whether a guarded write holds it.
#[derive(Debug, Default)]
struct Slot {
    state: Mutex<SlotState>,
    /// Wakes threads waiting in [`Fence::lock`].
    freed: Condvar,
    /// Wakes tasks waiting in [`Fence::lock_async`].
    freed_async: Notify,
}

#[derive(Debug, Default)]
struct SlotState {
    /// `None`: nothing seen yet.
    highest: Option<u64>,
    /// A [`FenceGuard`] holds the slot.
    held: bool,
    /// Writers waiting for the slot (for the tests, which must know a writer waits).
    waiting: usize,
}

impl SlotState {
    /// Checks `epoch` against the highest seen; on success remembers it.
    fn admit(&mut self, topic: &str, partition: u32, epoch: u64) -> Result<(), StaleEpoch> {
        match self.highest {
            Some(highest) if epoch < highest => {
                Err(StaleEpoch { topic: topic.to_string(), partition, offered: epoch, highest })
            }
            _ => {
                self.highest = Some(epoch);
                Ok(())
            }
        }
    }
}

impl Fence {
    /// An empty fence: every epoch passes until one is seen.
    pub fn new() -> Self {
        Self::default()
    }

    /// Admits a write for `partition` with its epoch ([`admit_epoch`](Self::admit_epoch)).
    ///
    /// A check only: the caller writes afterwards, so a superseded owner that passed the
    /// check just before the new owner can still write after it. Use it only where writes
    /// of one partition cannot overlap (one writer at a time by construction), or where
    /// the store itself compares the epoch when it writes; otherwise use
    /// [`admit_then`](Self::admit_then) or [`lock`](Self::lock).
    pub fn admit(&self, partition: &Partition) -> Result<(), StaleEpoch> {
        self.admit_epoch(&partition.topic, partition.partition, partition.epoch)
    }

    /// Admits a write for `topic`/`partition` carrying `epoch` if it is at least the highest
    /// epoch seen for that partition, and remembers it; refuses it otherwise. Check and
    /// update are one step (of two checks, the lower epoch's fails once the higher one
    /// passed), but the write that follows is not covered: see [`admit`](Self::admit).
    /// It does not wait for a guarded write in progress.
    pub fn admit_epoch(&self, topic: &str, partition: u32, epoch: u64) -> Result<(), StaleEpoch> {
        lock(&self.slot(topic, partition).state).admit(topic, partition, epoch)
    }

    /// Admits `partition`'s epoch and holds its slot until the returned guard is dropped:
    /// write while holding it. A writer with a higher epoch waits (blocking the thread)
    /// until the guard is dropped; a writer with a lower epoch than one admitted is refused
    /// at once. In async code use [`lock_async`](Self::lock_async), which does not block
    /// the runtime's thread. The slot is not reentrant: a writer that already holds the
    /// partition's guard and locks it again waits for itself.
    pub fn lock(&self, partition: &Partition) -> Result<FenceGuard, StaleEpoch> {
        let slot = self.slot(&partition.topic, partition.partition);
        let mut state = lock(&slot.state);
        loop {
            // Refused at once when stale: waiting would not change the answer.
            if let Some(stale) = stale(&state, partition) {
                return Err(stale);
            }
            if !state.held {
                break;
            }
            state.waiting += 1;
            state = slot.freed.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
            state.waiting -= 1;
        }
        Ok(hold(state, &slot, partition))
    }

    /// [`lock`](Self::lock) for async code: waits for the slot without blocking a thread.
    pub async fn lock_async(&self, partition: &Partition) -> Result<FenceGuard, StaleEpoch> {
        let slot = self.slot(&partition.topic, partition.partition);
        loop {
            let freed = slot.freed_async.notified();
            tokio::pin!(freed);
            {
                let mut state = lock(&slot.state);
                if let Some(stale) = stale(&state, partition) {
                    return Err(stale);
                }
                if !state.held {
                    return Ok(hold(state, &slot, partition));
                }
                // Registered before the slot's lock is let go, so the guard's drop, which
                // takes that lock first, cannot wake everyone before this waits.
                freed.as_mut().enable();
                state.waiting += 1;
            }
            // Uncounted however this wait ends (woken, or the caller dropped the future).
            let _waiting = Waiting(&slot);
            freed.await;
        }
    }

    /// Runs `write` if `partition`'s epoch is admitted, holding the partition's slot until
    /// it returns ([`lock`](Self::lock)): its result, or [`StaleEpoch`] without running it.
    pub fn admit_then<T>(&self, partition: &Partition, write: impl FnOnce() -> T) -> Result<T, StaleEpoch> {
        let guard = self.lock(partition)?;
        let written = write();
        drop(guard);
        Ok(written)
    }

    /// [`admit_then`](Self::admit_then) for an async write ([`lock_async`](Self::lock_async)).
    pub async fn admit_then_async<T, F>(
        &self,
        partition: &Partition,
        write: impl FnOnce() -> F,
    ) -> Result<T, StaleEpoch>
    where
        F: Future<Output = T>,
    {
        let guard = self.lock_async(partition).await?;
        let written = write().await;
        drop(guard);
        Ok(written)
    }

    /// The highest epoch seen for `topic`/`partition` (`None`: nothing seen yet).
    pub fn highest(&self, topic: &str, partition: u32) -> Option<u64> {
        let slot = lock(&self.slots).get(topic).and_then(|partitions| partitions.get(&partition)).cloned();
        slot.and_then(|slot| lock(&slot.state).highest)
    }

    /// How many writers wait for `topic`/`partition`'s slot.
    #[cfg(test)]
    fn waiting(&self, topic: &str, partition: u32) -> usize {
        lock(&self.slot(topic, partition).state).waiting
    }

    /// The slot of `topic`/`partition`, made on first use.
    fn slot(&self, topic: &str, partition: u32) -> Arc<Slot> {
        let mut slots = lock(&self.slots);
        // Looked up by `&str`: no allocation once the topic is known.
        if let Some(slot) = slots.get(topic).and_then(|partitions| partitions.get(&partition)) {
            return slot.clone();
        }
        slots.entry(topic.to_string()).or_default().entry(partition).or_default().clone()
    }
}

/// A partition's slot, held by a write whose epoch was admitted ([`Fence::lock`]): until it
/// is dropped, writers of that partition with a higher epoch wait, and those with a lower
/// one are refused. Hold it for the whole write, and no longer.
#[derive(Debug)]
#[must_use = "the slot is held only while the guard lives: write before dropping it"]
pub struct FenceGuard {
    slot: Arc<Slot>,
    epoch: u64,
}

impl FenceGuard {
    /// The epoch admitted.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl Drop for FenceGuard {
    fn drop(&mut self) {
        lock(&self.slot.state).held = false;
        self.slot.freed.notify_all();
        self.slot.freed_async.notify_waiters();
    }
}

/// A writer counted in [`SlotState::waiting`]; uncounted when dropped.
struct Waiting<'a>(&'a Slot);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        lock(&self.0.state).waiting -= 1;
    }
}

/// Why `partition` would be refused now, if it would.
fn stale(state: &SlotState, partition: &Partition) -> Option<StaleEpoch> {
    let highest = state.highest?;
    (partition.epoch < highest).then(|| StaleEpoch {
        topic: partition.topic.clone(),
        partition: partition.partition,
        offered: partition.epoch,
        highest,
    })
}

/// Takes a free, admitted slot for `partition`.
fn hold(mut state: MutexGuard<'_, SlotState>, slot: &Arc<Slot>, partition: &Partition) -> FenceGuard {
    state.held = true;
    state.highest = Some(partition.epoch);
    FenceGuard { slot: slot.clone(), epoch: partition.epoch }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update is one assignment: whatever panicked while holding the lock left the
    // state whole (and a guard's drop still frees its slot while unwinding).
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
#[path = "fence_tests.rs"]
mod tests;
