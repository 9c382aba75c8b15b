//! The user's side: the [`Handler`] the client drives.

use std::fmt;

use async_trait::async_trait;

/// A partition of the client's topic.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Partition {
    /// The topic.
    pub topic: String,
    /// The partition number.
    pub partition: u32,
    /// The epoch of this consumer's ownership of the partition (docs/design.md §10): greater
    /// than the epoch of every earlier owner, so a sink that refuses epochs below the highest
    /// it has seen ([`Fence`](crate::Fence)) cannot be written by a superseded owner. For
    /// `warm`, the epoch the consumer will own the partition with (not yet: nothing may be
    /// written to the shared sink with it during the warm); for `release` and
    /// `unassigned`, the epoch it was held with.
    ///
    /// `0` means this server hands out no epochs: nothing to fence with (see
    /// [`EpochPolicy`](crate::EpochPolicy)). A served epoch is never 0.
    pub epoch: u64,
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}

/// Why a warm failed (anything the handler wants to report).
pub type WarmError = Box<dyn std::error::Error + Send + Sync>;

/// What the client calls as the assigner moves partitions. Calls for one partition never
/// overlap and come in the order the commands arrived; calls for different partitions may
/// run at the same time.
///
/// Every partition handed to the handler carries its [`Partition::epoch`]: the client waits
/// for it (on the assigner's `WatchEpochs` stream) before `warm` and `assigned`, and never
/// calls either without it.
///
/// * `warm(p)`: prepare `p` (load state, catch up) without processing it. `Ok` sends
///   `PartitionReady`; an error is logged and the assigner times the warm out. `p.epoch`
///   is the epoch the consumer *will* own `p` with, and another consumer still owns it:
///   never write to the shared sink with it (a fenced sink would take it as the newest
///   owner's and refuse the current owner's writes for the rest of the warm). Read, load
///   local state, and keep the epoch for the writes that follow `assigned`.
/// * `assigned(p)`: `p` is ours: start processing it.
/// * `release(p)`: `p` moved to another consumer: stop processing it and make progress
///   durable (commit offsets) before returning; `PartitionReleased` is sent on return.
/// * `unassigned(p)`: `p` is no longer ours, or a warm of `p` was cancelled, or the
///   client-side lease ran out, or the client stops: stop processing it and drop any
///   warm state.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Prepare `partition` before taking it over: read only, nothing written to the shared
    /// sink with its (future) epoch.
    async fn warm(&self, partition: Partition) -> Result<(), WarmError>;
    /// Start processing `partition`.
    async fn assigned(&self, partition: Partition);
    /// Stop processing `partition` (handoff), committing progress first.
    async fn release(&self, partition: Partition);
    /// Stop processing (or warming) `partition`: it is not ours any more.
    async fn unassigned(&self, partition: Partition);
}
