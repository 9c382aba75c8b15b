//! What the invariant checks (`checks.rs`) remember between steps: a value the cluster
//! holds, apart from the checks themselves.

use std::collections::BTreeMap;

use crate::coordinator::machine::io::StreamId;

/// What the checks remember between steps.
#[derive(Debug, Default)]
pub(super) struct CheckState {
    /// Per consumer: since when its registration has had no stream.
    pub orphan_since: Vec<Option<u64>>,
    /// Until when a fault lasts (the overdue check waits it out).
    pub last_disruption: u64,
    /// When the faults stopped.
    pub quiet_at: Option<u64>,
    /// When the cluster converged after that.
    pub converged_at: Option<u64>,
    /// The direct moves the store had seen when an outage began.
    pub outage_moves: Option<u64>,
    /// Per partition: the consumer that claims it (a buffer reused every step).
    pub claimant: Vec<Option<usize>>,
    /// Per consumer: whether an instance holds a stream of it (a buffer reused every step).
    pub streaming: Vec<bool>,
    /// Fleet runs: (node, stream, partition) → `unassigned` of the partition sent on the
    /// stream and not delivered yet (the fleet's promise: a giver was sent `unassigned`
    /// before its lease is deleted).
    pub unassigned_in_flight: BTreeMap<(usize, StreamId, u32), u32>,
    /// Fleet runs: (node, stream) → when its consumer started reading it as registered.
    pub online_since: BTreeMap<(usize, StreamId), u64>,
}

impl CheckState {
    /// An outage of a [`Kind::Outage`] schedule begins, with `moves` direct moves so far.
    pub fn outage_started(&mut self, moves: u64) {
        self.outage_moves = Some(moves);
    }
}

impl CheckState {
    /// An `AssignmentUpdate` unassigning `partitions` was sent on `stream` of `node`.
    pub fn unassigned_sent(&mut self, node: usize, stream: StreamId, partitions: impl Iterator<Item = u32>) {
        for p in partitions {
            *self.unassigned_in_flight.entry((node, stream, p)).or_insert(0) += 1;
        }
    }

    /// That update reached its consumer (or was dropped on the way: the consumer reads
    /// another stream now).
    pub fn unassigned_delivered(
        &mut self,
        node: usize,
        stream: StreamId,
        partitions: impl Iterator<Item = u32>,
    ) {
        for p in partitions {
            if let std::collections::btree_map::Entry::Occupied(mut entry) =
                self.unassigned_in_flight.entry((node, stream, p))
            {
                *entry.get_mut() -= 1;
                if *entry.get() == 0 {
                    entry.remove();
                }
            }
        }
    }

    /// Whether an `unassigned` of `p` is on its way on `stream` of `node`.
    pub fn unassigned_pending(&self, node: usize, stream: StreamId, p: u32) -> bool {
        self.unassigned_in_flight.contains_key(&(node, stream, p))
    }
}
