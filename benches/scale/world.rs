//! What the benchmark's consumers were told, with timestamps: who owns which partition in
//! the consumers' views, moves, overlaps, gaps and delivery latencies.
//!
//! Every consumer task reports into one [`World`] behind a mutex (short critical sections);
//! a waiter is woken on every change to test for stability.

use std::time::{Duration, Instant};

use super::call_errors::ErrorFigures;
use super::ownership::{OwnerChange, OwnershipFigures, PartitionOwners};
use super::watched::{Phased, Watched};

/// Shared handle on the consumers' views.
pub type Shared = Watched<World>;

/// One partition's ownership as the consumers were told it.
#[derive(Default)]
struct PartitionView {
    /// Consumers that were told they own it and not yet told to stop.
    owners: PartitionOwners,
    /// `PartitionReady` for this partition: who sent it, when, and how many deliveries
    /// (new owner's `assigned`, old owner's release) are still to be timed against it.
    ready: Option<(u32, Instant, u8)>,
}

/// Per-consumer state.
#[derive(Default, Clone)]
struct ConsumerView {
    register_sent: Option<Instant>,
    snapshot: bool,
    /// Has had a snapshot at least once (a lost stream clears `snapshot`, not this).
    ever_snapshot: bool,
    load: u32,
    warmed: bool,
    ended: bool,
}

/// Everything the consumers saw in one scenario.
pub struct World {
    partitions: Vec<PartitionView>,
    consumers: Vec<ConsumerView>,
    /// Partitions with exactly one owner right now.
    single_owned: usize,
    /// `PartitionReady` / `PartitionReleased` calls not yet answered.
    in_flight: usize,
    /// Only changes while measuring count towards moves, overlaps, gaps and latencies.
    measuring: bool,
    /// The measured phase's figures.
    pub stats: PhaseStats,
}

/// Figures of one measured phase.
#[derive(Default, Clone, Debug)]
pub struct PhaseStats {
    /// Partitions given to a consumer while another consumer had owned them last.
    pub moves: u64,
    /// `WarmPartition` commands received.
    pub warms: u64,
    /// Longest overlap and gap, and how many gaps.
    pub owners: OwnershipFigures,
    /// `PartitionReady` sent → `assigned` / `ReleasePartition` received by the consumers
    /// it concerns (the new owner and the old owner).
    pub delivery: Vec<Duration>,
    /// A joining consumer's `Register` sent → its first `WarmPartition`.
    pub join_to_warm: Vec<Duration>,
    /// `Register` sent → first message (the snapshot).
    pub register_to_snapshot: Vec<Duration>,
    /// When the last first-ever snapshot of a consumer arrived in the phase.
    pub last_snapshot: Option<Instant>,
    /// Consumers that got their first-ever snapshot in the phase (not counting snapshots
    /// after registering again).
    pub first_snapshots: u64,
    /// Streams lost and calls refused, with the first few messages.
    pub errors: ErrorFigures,
}

impl Shared {
    /// Waits until `consumers` (ids `0..consumers`) all have their snapshot and the views are
    /// stable (see [`World::is_stable`]), or the deadline passes. Returns when it became so.
    pub async fn wait_stable(&self, consumers: u32, deadline: Instant) -> Option<Instant> {
        self.wait_for(deadline, |w| w.is_stable(consumers)).await
    }
}

impl Phased for World {
    type Stats = PhaseStats;

    fn phase(&mut self) -> (&mut bool, &mut PhaseStats) {
        (&mut self.measuring, &mut self.stats)
    }
}

impl World {
    /// Views for one topic of `partitions` partitions.
    pub fn new(partitions: u32) -> Self {
        Self {
            partitions: (0..partitions).map(|_| PartitionView::default()).collect(),
            consumers: Vec::new(),
            single_owned: 0,
            in_flight: 0,
            measuring: false,
            stats: PhaseStats::default(),
        }
    }

    fn consumer(&mut self, id: u32) -> &mut ConsumerView {
        let index = id as usize;
        if self.consumers.len() <= index {
            self.consumers.resize(index + 1, ConsumerView::default());
        }
        &mut self.consumers[index]
    }

    /// Stable: every consumer `0..consumers` has its snapshot and an open stream, every
    /// partition has exactly one owner, loads are balanced (⌊P/N⌋ or ⌈P/N⌉) and no
    /// `PartitionReady` / `PartitionReleased` is in flight.
    pub fn is_stable(&self, consumers: u32) -> bool {
        let partitions = self.partitions.len();
        if self.in_flight != 0 || self.single_owned != partitions || consumers == 0 {
            return false;
        }
        let n = consumers as usize;
        if self.consumers.len() < n {
            return false;
        }
        let (low, high) = (partitions / n, partitions.div_ceil(n));
        self.consumers[..n]
            .iter()
            .all(|c| c.snapshot && !c.ended && (low..=high).contains(&(c.load as usize)))
            && self.consumers[n..].iter().all(|c| c.load == 0)
    }

    /// What the views look like (for a phase that did not settle).
    pub fn describe(&self, consumers: u32) -> String {
        let n = (consumers as usize).min(self.consumers.len());
        let loads = self.consumers[..n].iter().map(|c| c.load);
        let (low, high) = (loads.clone().min().unwrap_or(0), loads.max().unwrap_or(0));
        let snapshots = self.consumers[..n].iter().filter(|c| c.snapshot && !c.ended).count();
        let unowned = self.partitions.iter().filter(|p| p.owners.is_unowned()).count();
        format!(
            "{} of {} partitions with one owner, {unowned} with none; loads {low}–{high}; \
             {snapshots} of {consumers} streams up; {} calls in flight",
            self.single_owned,
            self.partitions.len(),
            self.in_flight
        )
    }

    /// Current loads of consumers `0..consumers` (for minimum-move arithmetic).
    pub fn loads(&self, consumers: u32) -> Vec<u32> {
        (0..consumers as usize).map(|i| self.consumers.get(i).map_or(0, |c| c.load)).collect()
    }

    /// A consumer's `Register` is about to be sent.
    pub fn register_sent(&mut self, id: u32, at: Instant) {
        self.consumer(id).register_sent = Some(at);
    }

    /// A consumer's stream ended or failed (or its `Register` was refused).
    /// Its partitions leave its view: a consumer without a stream stops processing them.
    pub fn stream_ended(&mut self, id: u32, why: String, at: Instant) {
        let consumer = self.consumer(id);
        consumer.ended = true;
        consumer.snapshot = false;
        self.stats.errors.stream_error(format!("consumer {id}: {why}"));
        let held: Vec<u32> = (0..self.partitions.len() as u32)
            .filter(|p| self.partitions[*p as usize].owners.holds(id))
            .collect();
        for partition in held {
            self.released(id, partition, at);
        }
    }

    /// A call was refused.
    pub fn rpc_error(&mut self, text: String) {
        self.stats.errors.rpc_error(text);
    }

    /// A `PartitionReady` was refused because its warm is gone.
    pub fn ready_refused(&mut self, text: String) {
        self.stats.errors.ready_refused(text);
    }

    /// A `PartitionReady` / `PartitionReleased` call starts (`ready`: which one).
    pub fn call_started(&mut self, id: u32, partition: u32, ready: bool, at: Instant) {
        self.in_flight += 1;
        if ready && let Some(view) = self.partitions.get_mut(partition as usize) {
            view.ready = Some((id, at, 2));
        }
    }

    /// A `PartitionReady` / `PartitionReleased` call was answered.
    pub fn call_finished(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// The first message of a stream arrived.
    pub fn snapshot(&mut self, id: u32, at: Instant) {
        let measuring = self.measuring;
        let consumer = self.consumer(id);
        consumer.snapshot = true;
        consumer.ended = false;
        let first = !std::mem::replace(&mut consumer.ever_snapshot, true);
        let sent = consumer.register_sent;
        if measuring {
            if let Some(sent) = sent {
                self.stats.register_to_snapshot.push(at.saturating_duration_since(sent));
            }
            if first {
                self.stats.last_snapshot = Some(at);
                self.stats.first_snapshots += 1;
            }
        }
    }

    /// `WarmPartition` arrived.
    pub fn warm(&mut self, id: u32, at: Instant) {
        let measuring = self.measuring;
        let consumer = self.consumer(id);
        let first = !consumer.warmed;
        consumer.warmed = true;
        let sent = consumer.register_sent;
        if measuring {
            self.stats.warms += 1;
            if first && let Some(sent) = sent {
                self.stats.join_to_warm.push(at.saturating_duration_since(sent));
            }
        }
    }

    /// The consumer was told it owns `partition` (snapshot or `assigned`).
    pub fn assigned(&mut self, id: u32, partition: u32, at: Instant) {
        let Some(view) = self.partitions.get_mut(partition as usize) else {
            self.rpc_error(format!("consumer {id} assigned partition {partition}, out of range"));
            return;
        };
        let Some(change) = view.owners.add(id, at) else {
            return;
        };
        let ready = take_ready(&mut view.ready, |by| by == id);
        self.consumer(id).load += 1;
        self.count_change(&change, at);
        if self.measuring {
            if change.moved {
                self.stats.moves += 1;
            }
            if let Some(sent) = ready {
                self.stats.delivery.push(at.saturating_duration_since(sent));
            }
        }
    }

    /// The consumer was told to stop owning `partition` (`ReleasePartition` or `unassigned`).
    pub fn released(&mut self, id: u32, partition: u32, at: Instant) {
        let Some(view) = self.partitions.get_mut(partition as usize) else {
            return;
        };
        let Some(change) = view.owners.remove(id, at) else {
            return;
        };
        let ready = take_ready(&mut view.ready, |by| by != id);
        let consumer = self.consumer(id);
        consumer.load = consumer.load.saturating_sub(1);
        self.count_change(&change, at);
        if self.measuring
            && let Some(sent) = ready
        {
            self.stats.delivery.push(at.saturating_duration_since(sent));
        }
    }

    fn count_change(&mut self, change: &OwnerChange, at: Instant) {
        change.count(at, &mut self.single_owned, self.measuring.then_some(&mut self.stats.owners));
    }
}

/// The `PartitionReady` time to measure one delivery against, if `matches(sender)`; counts
/// the delivery so a stale `PartitionReady` is never used for a later handoff.
fn take_ready(ready: &mut Option<(u32, Instant, u8)>, matches: impl Fn(u32) -> bool) -> Option<Instant> {
    let (by, sent, left) = ready.as_mut()?;
    if !matches(*by) {
        return None;
    }
    let sent = *sent;
    *left -= 1;
    if *left == 0 {
        *ready = None;
    }
    Some(sent)
}
