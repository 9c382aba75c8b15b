//! What the cluster bench's consumers were told, with timestamps: who owns which partition
//! of which topic in the consumers' views, moves, overlaps and gaps.
//!
//! Consumers are *slots*: a slot is one consumer of one topic across its restarts (a
//! restarted consumer is a new process under a new name, in the same slot). A slot's old
//! stream has ended before its new one starts, so one owner id per slot is exact.
//! Every consumer task reports into one [`Views`] behind a mutex (short critical sections);
//! a waiter is woken on every change.

use std::time::{Duration, Instant};

use super::watched::{Phased, Watched};

/// Shared handle on the consumers' views.
pub type Shared = Watched<Views>;

#[derive(Default)]
struct PartitionView {
    /// Slots told they own it and not yet told to stop.
    owners: Vec<u32>,
    /// The last slot told it owns it (to tell a move from a first assignment).
    last_owner: Option<u32>,
    /// When the owner count last changed; `None` until it first had an owner.
    since: Option<Instant>,
}

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
    partitions: Vec<PartitionView>,
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
    /// Longest time a partition had two or more owners in the consumers' views.
    pub max_overlap: Duration,
    /// Longest time a partition that had an owner had none in the consumers' views.
    pub max_gap: Duration,
    /// Ownership changes that left a partition without an owner for a while.
    pub gaps: u64,
    /// Streams that ended or failed other than by a drain the bench asked for.
    pub stream_errors: u64,
    /// Calls refused, other than `ready_refused`.
    pub rpc_errors: u64,
    /// `PartitionReady` refused with `FAILED_PRECONDITION` (the warm was retargeted first).
    pub ready_refused: u64,
    /// The first few errors, for the report.
    pub error_samples: Vec<String>,
}

impl PhaseStats {
    fn error(&mut self, text: String) {
        if self.error_samples.len() < 5 {
            self.error_samples.push(text);
        }
    }
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
            partitions: (0..topics * per_topic).map(|_| PartitionView::default()).collect(),
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
        let unowned = self.partitions.iter().filter(|p| p.owners.is_empty()).count();
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
            self.stats.stream_errors += 1;
            self.stats.error(format!("slot {slot}: {why}"));
        }
        let held: Vec<usize> =
            (0..self.partitions.len()).filter(|p| self.partitions[*p].owners.contains(&slot)).collect();
        for index in held {
            self.released(slot, index, at);
        }
    }

    /// A call was refused.
    pub fn rpc_error(&mut self, text: String) {
        self.stats.rpc_errors += 1;
        self.stats.error(text);
    }

    /// A `PartitionReady` was refused because its warm is gone.
    pub fn ready_refused(&mut self, text: String) {
        self.stats.ready_refused += 1;
        self.stats.error(text);
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
        let Some(view) = self.partitions.get_mut(index) else { return };
        if view.owners.contains(&slot) {
            return;
        }
        let before = view.owners.len();
        view.owners.push(slot);
        let moved = view.last_owner.is_some_and(|last| last != slot);
        view.last_owner = Some(slot);
        let since = view.since.replace(at);
        if let Some(s) = self.slots.get_mut(slot as usize) {
            s.load += 1;
        }
        self.count_change(before, before + 1, since, at);
        if self.measuring && moved {
            self.stats.moves += 1;
        }
    }

    /// The slot was told to stop owning the partition at `index`.
    pub fn released(&mut self, slot: u32, index: usize, at: Instant) {
        let Some(view) = self.partitions.get_mut(index) else { return };
        let Some(position) = view.owners.iter().position(|o| *o == slot) else { return };
        let before = view.owners.len();
        view.owners.swap_remove(position);
        let since = view.since.replace(at);
        if let Some(s) = self.slots.get_mut(slot as usize) {
            s.load = s.load.saturating_sub(1);
        }
        self.count_change(before, before - 1, since, at);
    }

    /// Keeps `single_owned` and the overlap / gap figures as a partition's owner count
    /// goes from `before` to `after`; `since` is when it reached `before`.
    fn count_change(&mut self, before: usize, after: usize, since: Option<Instant>, at: Instant) {
        if before == 1 {
            self.single_owned -= 1;
        }
        if after == 1 {
            self.single_owned += 1;
        }
        let Some(since) = since.filter(|_| self.measuring) else { return };
        let lasted = at.saturating_duration_since(since);
        if before == 0 {
            // `since` is set only once a partition has had an owner: this ends a gap.
            self.stats.max_gap = self.stats.max_gap.max(lasted);
            self.stats.gaps += 1;
        } else if before >= 2 && after < 2 {
            self.stats.max_overlap = self.stats.max_overlap.max(lasted);
        }
    }
}
