//! What the invariant checks (`checks.rs`) remember between steps: a value the cluster
//! holds, apart from the checks themselves.

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
}

impl CheckState {
    /// An outage of a [`Kind::Outage`] schedule begins, with `moves` direct moves so far.
    pub fn outage_started(&mut self, moves: u64) {
        self.outage_moves = Some(moves);
    }
}
