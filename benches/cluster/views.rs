//! What the cluster bench's consumers were told, with timestamps: who owns which partition
//! of which topic in the consumers' views, moves, overlaps and gaps.
//!
//! Consumers are *slots*: a slot is one consumer of one topic across its restarts (a
//! restarted consumer is a new process under a new name, in the same slot). A slot's old
//! stream has ended before its new one starts, so one owner id per slot is exact.
//! Every consumer task reports into one [`Views`] behind a mutex (short critical sections);
//! a waiter is woken on every change.

use std::time::Instant;

use super::call_errors::ErrorFigures;
use super::ownership::{OwnerChange, OwnershipFigures, PartitionOwners};
use super::watched::{Phased, Watched};

/// Shared handle on the consumers' views.
pub type Shared = Watched<Views>;

#[derive(Default, Clone)]
struct SlotView {
    /// Its stream is open and has delivered its snapshot.
    up: bool,
    load: u32,
}

/// Everything the consumers saw.
pub struct Views {
    /// Partitions per topic; partition `p` of topic `t` is `partitions[t * per_topic + p]`.
    per_topic: u32,
    /// Consumers per topic; slot `s` is on topic `s / per_topic_consumers`.
    per_topic_consumers: u32,
    partitions: Vec<PartitionOwners>,
    slots: Vec<SlotView>,
    single_owned: usize,
    /// `PartitionReady` / `PartitionReleased` / `Deregister` calls not yet answered.
    in_flight: usize,
    measuring: bool,
    /// The measured phase's figures.
    pub stats: PhaseStats,
}

/// Figures of the measured phase.
#[derive(Default, Clone, Debug)]
pub struct PhaseStats {
    /// Partitions given to a slot while another slot had owned them last.
    pub moves: u64,
    /// Longest overlap and gap, and how many gaps.
    pub owners: OwnershipFigures,
    /// Streams lost and calls refused, with the first few messages.
    pub errors: ErrorFigures,
}

impl Phased for Views {
    type Stats = PhaseStats;

    fn phase(&mut self) -> (&mut bool, &mut PhaseStats) {
        (&mut self.measuring, &mut self.stats)
    }
}

impl Views {
    /// Views for `topics` topics of `per_topic` partitions with `consumers` slots each.
    pub fn new(topics: u32, per_topic: u32, consumers: u32) -> Self {
        Self {
            per_topic,
            per_topic_consumers: consumers,
            partitions: (0..topics * per_topic).map(|_| PartitionOwners::default()).collect(),
            slots: vec![SlotView::default(); (topics * consumers) as usize],
            single_owned: 0,
            in_flight: 0,
            measuring: false,
            stats: PhaseStats::default(),
        }
    }

    /// Index of partition `partition` of topic `topic` in the views.
    pub fn index(&self, topic: u32, partition: u32) -> Option<usize> {
        (partition < self.per_topic).then_some((topic * self.per_topic + partition) as usize)
    }

    /// Stable: no call in flight, every partition has exactly one owner, every slot is up
    /// and every topic's loads are balanced (⌊P/C⌋ or ⌈P/C⌉).
    pub fn is_stable(&self) -> bool {
        let (low, high) =
            (self.per_topic / self.per_topic_consumers, self.per_topic.div_ceil(self.per_topic_consumers));
        self.in_flight == 0
            && self.single_owned == self.partitions.len()
            && self.slots.iter().all(|s| s.up && (low..=high).contains(&s.load))
    }

    /// Whether none of `slots` has a stream open.
    pub fn all_down(&self, slots: &[u32]) -> bool {
        slots.iter().all(|s| self.slots.get(*s as usize).is_none_or(|v| !v.up))
    }

    /// What the views look like (for a phase that did not settle).
    pub fn describe(&self) -> String {
        let loads = self.slots.iter().map(|s| s.load);
        let (low, high) = (loads.clone().min().unwrap_or(0), loads.max().unwrap_or(0));
        let up = self.slots.iter().filter(|s| s.up).count();
        let unowned = self.partitions.iter().filter(|p| p.is_unowned()).count();
        format!(
            "{} of {} partitions with one owner, {unowned} with none; loads {low}–{high}; \
             {up} of {} streams up; {} calls in flight",
            self.single_owned,
            self.partitions.len(),
            self.slots.len(),
            self.in_flight
        )
    }

    /// A slot's stream delivered its first message.
    pub fn snapshot(&mut self, slot: u32) {
        if let Some(view) = self.slots.get_mut(slot as usize) {
            view.up = true;
        }
    }

    /// A slot's stream ended (`expected`: after the drain the bench asked for). Its
    /// partitions leave its view: a consumer without a stream stops processing them.
    pub fn stream_ended(&mut self, slot: u32, expected: bool, why: &str, at: Instant) {
        if let Some(view) = self.slots.get_mut(slot as usize) {
            view.up = false;
        }
        if !expected {
            self.stats.errors.stream_error(format!("slot {slot}: {why}"));
        }
        let held: Vec<usize> =
            (0..self.partitions.len()).filter(|p| self.partitions[*p].holds(slot)).collect();
        for index in held {
            self.released(slot, index, at);
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

    /// A call starts.
    pub fn call_started(&mut self) {
        self.in_flight += 1;
    }

    /// A call was answered.
    pub fn call_finished(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// The slot was told it owns the partition at `index` (snapshot or `assigned`).
    pub fn assigned(&mut self, slot: u32, index: usize, at: Instant) {
        let Some(change) = self.partitions.get_mut(index).and_then(|view| view.add(slot, at)) else { return };
        if let Some(s) = self.slots.get_mut(slot as usize) {
            s.load += 1;
        }
        self.count_change(&change, at);
        if self.measuring && change.moved {
            self.stats.moves += 1;
        }
    }

    /// The slot was told to stop owning the partition at `index`.
    pub fn released(&mut self, slot: u32, index: usize, at: Instant) {
        let Some(change) = self.partitions.get_mut(index).and_then(|view| view.remove(slot, at)) else {
            return;
        };
        if let Some(s) = self.slots.get_mut(slot as usize) {
            s.load = s.load.saturating_sub(1);
        }
        self.count_change(&change, at);
    }

    fn count_change(&mut self, change: &OwnerChange, at: Instant) {
        change.count(at, &mut self.single_owned, self.measuring.then_some(&mut self.stats.owners));
    }
}
