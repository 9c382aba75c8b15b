//! Pure: what the client owns and what it must do on each command (no I/O, no clock).
//!
//! The driver feeds every stream command and every finished handler call into
//! [`ClientState::apply`] and carries out the [`Action`]s it returns, in order. Handler
//! calls for one partition run one after another (the driver keeps a queue per
//! partition), so `Warm` then `Assigned` means `warm` returns before `assigned` starts.
//!
//! Repeated and reordered commands are harmless: a command that asks for what is
//! already true does nothing, a `Warm` for a partition already warmed re-sends
//! `PartitionReady` (the first one may have been lost with a connection), and a
//! `Release` for a partition the client does not hold is acknowledged at once.
//!
//! A `release` that does not return is bounded: once the session is lost ([`Input::LoseAll`])
//! or the release has run for the session timeout ([`Input::ReleaseOverdue`]; the server may
//! have completed the handoff without us, and says nothing to the old owner then), the
//! partition is [`Stage::Abandoned`]: no longer held, whatever the handler still does.
//!
//! Every partition is held with an epoch (docs/design.md §10; `0` from a server without
//! epochs): the driver resolves a command's epochs before it feeds it in (`epochs.rs`), the
//! state remembers them, and every handler call carries the epoch it concerns. Told it owns
//! a partition it already owns with another epoch, the state ends the old ownership
//! (`Unassigned` with the old epoch) before the new one (`Assigned` with the new epoch): the
//! partition had another owner in between.

use std::collections::{BTreeMap, BTreeSet};

/// Where one partition stands, from the client's side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// `warm` was called (or is queued) and has not returned.
    Warming,
    /// `warm` returned `Ok`; `PartitionReady` was sent (or is being sent).
    Ready,
    /// Owned: `assigned` was called (or is queued).
    Owned,
    /// `release` was called (or is queued); `PartitionReleased` follows when it returns.
    Releasing,
    /// `release` is still running, but the partition is no longer held: the session was
    /// lost, or the release outlived the session timeout. A handler call cannot be
    /// stopped; it is only no longer counted as ownership. `PartitionReleased` is still
    /// sent when it returns.
    Abandoned,
}

/// What happened: a command from the stream, or a handler call that finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// The first message of a (re)connected stream: every partition the server says we own,
    /// with its epoch.
    Snapshot(Vec<(u32, u64)>),
    /// `AssignmentUpdate` after the snapshot.
    Update {
        /// Newly owned, with their epochs.
        assigned: Vec<(u32, u64)>,
        /// No longer owned, or a warm that was cancelled.
        unassigned: Vec<u32>,
    },
    /// `WarmPartition`, with the epoch the partition will be owned with.
    Warm(u32, u64),
    /// `ReleasePartition`.
    Release(u32),
    /// The handler's `warm` returned (`true`: `Ok`).
    WarmFinished(u32, bool),
    /// The handler's `release` returned.
    ReleaseFinished(u32),
    /// The handler's `release` has run for the session timeout and not returned.
    ReleaseOverdue(u32),
    /// The client-side lease ran out (stream down longer than the session timeout), or the
    /// client stops: nothing is owned any more.
    LoseAll,
}

/// What the driver must do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Call the handler's `warm` (partition, epoch).
    Warm(u32, u64),
    /// Call the handler's `assigned` (partition, epoch).
    Assigned(u32, u64),
    /// Call the handler's `release` (partition, epoch it was held with).
    Release(u32, u64),
    /// Call the handler's `unassigned` (partition, epoch it was held or warmed with).
    Unassigned(u32, u64),
    /// Send `PartitionReady`.
    SendReady(u32),
    /// Send `PartitionReleased`.
    SendReleased(u32),
    /// Report (log, count) that a still-running `release` no longer holds its partition.
    ReleaseAbandoned(u32),
}

impl Action {
    /// The partition the action is about.
    pub fn partition(&self) -> u32 {
        match self {
            Action::Warm(p, _)
            | Action::Assigned(p, _)
            | Action::Release(p, _)
            | Action::Unassigned(p, _)
            | Action::SendReady(p)
            | Action::SendReleased(p)
            | Action::ReleaseAbandoned(p) => *p,
        }
    }
}

/// The client's view of its partitions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientState {
    /// Each partition's stage and the epoch it is held (or warmed) with.
    stages: BTreeMap<u32, (Stage, u64)>,
}

impl ClientState {
    /// The stage of `partition`, if the client has anything to do with it.
    pub fn stage(&self, partition: u32) -> Option<Stage> {
        self.stages.get(&partition).map(|(stage, _)| *stage)
    }

    /// The epoch `partition` is held (or warmed) with, if the client has anything to do with it.
    pub fn epoch(&self, partition: u32) -> Option<u64> {
        self.stages.get(&partition).map(|(_, epoch)| *epoch)
    }

    /// Partitions the client holds: owned, or releasing until `release` returns (the old
    /// owner keeps processing through the release window of a handoff) but no longer than
    /// the session ([`Stage::Abandoned`]).
    pub fn owned(&self) -> BTreeSet<u32> {
        self.stages
            .iter()
            .filter(|(_, (s, _))| matches!(s, Stage::Owned | Stage::Releasing))
            .map(|(p, _)| *p)
            .collect()
    }

    /// Whether the client holds or warms nothing.
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// Applies `input`; returns what to do.
    pub fn apply(&mut self, input: Input) -> Vec<Action> {
        let mut actions = Vec::new();
        match input {
            Input::Snapshot(assigned) => {
                let keep: BTreeSet<u32> = assigned.iter().map(|(p, _)| *p).collect();
                // Owned before but not in the snapshot: the session was lost or the
                // partition moved while we were away. A pending Release after the
                // snapshot is then answered at once (see `Release` of an unknown partition).
                // Warms are kept: a Warm still pending follows the snapshot.
                let lost: Vec<(u32, u64)> = self
                    .stages
                    .iter()
                    .filter(|(p, (s, _))| *s == Stage::Owned && !keep.contains(p))
                    .map(|(p, (_, epoch))| (*p, *epoch))
                    .collect();
                for (p, epoch) in lost {
                    self.stages.remove(&p);
                    actions.push(Action::Unassigned(p, epoch));
                }
                for (p, epoch) in assigned {
                    self.assign(p, epoch, &mut actions);
                }
            }
            Input::Update { assigned, unassigned } => {
                for p in unassigned {
                    self.unassign(p, &mut actions);
                }
                for (p, epoch) in assigned {
                    self.assign(p, epoch, &mut actions);
                }
            }
            Input::Warm(p, epoch) => match self.stage(p) {
                None | Some(Stage::Releasing | Stage::Abandoned) => {
                    // Releasing: the partition comes back to us; the queue runs `release`
                    // first, and `ReleaseFinished` still acknowledges it.
                    self.stages.insert(p, (Stage::Warming, epoch));
                    actions.push(Action::Warm(p, epoch));
                }
                Some(stage @ (Stage::Ready | Stage::Warming)) => {
                    // The same warm again (or a later handoff's): the epoch to own it with is
                    // the newest one; the `assigned` that follows carries its own.
                    self.stages.insert(p, (stage, epoch));
                    if stage == Stage::Ready {
                        actions.push(Action::SendReady(p));
                    }
                }
                Some(Stage::Owned) => {}
            },
            Input::Release(p) => match self.stages.get(&p).copied() {
                None => actions.push(Action::SendReleased(p)),
                Some((Stage::Releasing | Stage::Abandoned, _)) => {}
                Some((_, epoch)) => {
                    self.stages.insert(p, (Stage::Releasing, epoch));
                    actions.push(Action::Release(p, epoch));
                }
            },
            Input::WarmFinished(p, ok) => {
                if let Some((Stage::Warming, epoch)) = self.stages.get(&p).copied() {
                    if ok {
                        self.stages.insert(p, (Stage::Ready, epoch));
                        actions.push(Action::SendReady(p));
                    } else {
                        // The server times the warm out and cancels it, or sends it again.
                        self.stages.remove(&p);
                    }
                }
            }
            Input::ReleaseFinished(p) => {
                if matches!(self.stage(p), Some(Stage::Releasing | Stage::Abandoned)) {
                    self.stages.remove(&p);
                }
                actions.push(Action::SendReleased(p));
            }
            Input::ReleaseOverdue(p) => self.abandon(p, &mut actions),
            Input::LoseAll => {
                let all: Vec<(u32, Stage, u64)> =
                    self.stages.iter().map(|(p, (s, e))| (*p, *s, *e)).collect();
                for (p, stage, epoch) in all {
                    match stage {
                        // A running release already stops the work (no `unassigned` on top),
                        // but without a session the partition may be someone else's now.
                        Stage::Releasing => self.abandon(p, &mut actions),
                        Stage::Abandoned => {}
                        Stage::Warming | Stage::Ready | Stage::Owned => {
                            self.stages.remove(&p);
                            actions.push(Action::Unassigned(p, epoch));
                        }
                    }
                }
            }
        }
        actions
    }

    fn assign(&mut self, p: u32, epoch: u64, actions: &mut Vec<Action>) {
        match self.stages.get(&p).copied() {
            Some((Stage::Owned, held)) if held == epoch => {}
            Some((Stage::Owned, held)) => {
                // Owned again with another epoch: someone else owned it in between (while we
                // were away). The handler hears the old ownership end before the new one.
                self.stages.insert(p, (Stage::Owned, epoch));
                actions.push(Action::Unassigned(p, held));
                actions.push(Action::Assigned(p, epoch));
            }
            _ => {
                self.stages.insert(p, (Stage::Owned, epoch));
                actions.push(Action::Assigned(p, epoch));
            }
        }
    }

    fn unassign(&mut self, p: u32, actions: &mut Vec<Action>) {
        match self.stages.get(&p).copied() {
            Some((Stage::Warming | Stage::Ready | Stage::Owned, epoch)) => {
                self.stages.remove(&p);
                actions.push(Action::Unassigned(p, epoch));
            }
            // The server is done with it while `release` still runs.
            Some((Stage::Releasing, _)) => self.abandon(p, actions),
            Some((Stage::Abandoned, _)) | None => {}
        }
    }

    /// A `release` still running no longer holds its partition.
    fn abandon(&mut self, p: u32, actions: &mut Vec<Action>) {
        if let Some((Stage::Releasing, epoch)) = self.stages.get(&p).copied() {
            self.stages.insert(p, (Stage::Abandoned, epoch));
            actions.push(Action::ReleaseAbandoned(p));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::*;

    /// The epoch tests give partition `p`: distinct per partition, never 0.
    fn e(p: u32) -> u64 {
        100 + u64::from(p)
    }

    fn owned(ps: &[u32]) -> Vec<(u32, u64)> {
        ps.iter().map(|p| (*p, e(*p))).collect()
    }

    fn snapshot(ps: &[u32]) -> Input {
        Input::Snapshot(owned(ps))
    }

    fn update(assigned: &[u32], unassigned: &[u32]) -> Input {
        Input::Update { assigned: owned(assigned), unassigned: unassigned.to_vec() }
    }

    fn warm(p: u32) -> Input {
        Input::Warm(p, e(p))
    }

    #[test]
    fn warm_ready_assigned_then_release() {
        let mut s = ClientState::default();
        assert_eq!(s.apply(snapshot(&[0])), vec![Assigned(0, e(0))]);
        assert_eq!(s.apply(warm(1)), vec![Warm(1, e(1))]);
        assert_eq!(s.apply(Input::WarmFinished(1, true)), vec![SendReady(1)]);
        assert_eq!(s.owned(), BTreeSet::from([0]));
        assert_eq!(s.apply(update(&[1], &[])), vec![Assigned(1, e(1))]);
        assert_eq!(s.apply(Input::Release(0)), vec![Release(0, e(0))]);
        assert_eq!(s.owned(), BTreeSet::from([0, 1]), "held until release returns");
        assert_eq!(s.apply(Input::ReleaseFinished(0)), vec![SendReleased(0)]);
        assert_eq!(s.owned(), BTreeSet::from([1]));
        assert_eq!(s.epoch(1), Some(e(1)));
        assert_eq!(s.epoch(0), None);
    }

    #[test]
    fn repeated_commands_do_nothing_new() {
        let mut s = ClientState::default();
        s.apply(snapshot(&[0]));
        assert!(s.apply(update(&[0], &[])).is_empty());
        assert!(s.apply(snapshot(&[0])).is_empty(), "a reconnect snapshot keeps it");
        assert_eq!(s.apply(warm(1)), vec![Warm(1, e(1))]);
        assert!(s.apply(warm(1)).is_empty(), "still warming");
        s.apply(Input::WarmFinished(1, true));
        assert_eq!(s.apply(warm(1)), vec![SendReady(1)], "ready is re-sent, warm is not re-run");
        assert_eq!(s.apply(Input::Release(0)), vec![Release(0, e(0))]);
        assert!(s.apply(Input::Release(0)).is_empty());
        assert_eq!(s.apply(Input::ReleaseFinished(0)), vec![SendReleased(0)]);
        assert!(s.apply(update(&[], &[0])).is_empty(), "an unassign after the release changes nothing");
        assert_eq!(s.apply(Input::Release(0)), vec![SendReleased(0)], "acknowledged again, no handler call");
    }

    #[test]
    fn owned_again_with_another_epoch_ends_the_old_ownership_first() {
        let mut s = ClientState::default();
        s.apply(snapshot(&[0, 1]));
        // After a reconnect: 0 had another owner meanwhile (a greater epoch), 1 did not.
        let actions = s.apply(Input::Snapshot(vec![(0, 500), (1, e(1))]));
        assert_eq!(actions, vec![Unassigned(0, e(0)), Assigned(0, 500)]);
        assert_eq!(s.epoch(0), Some(500));
        assert_eq!(s.apply(Input::Update { assigned: vec![(1, 600)], unassigned: vec![] }).len(), 2);
        assert_eq!(s.apply(Input::Release(1)), vec![Release(1, 600)], "released with the epoch held");
        // A warm repeated with a newer handoff's epoch: the newest is kept.
        s.apply(warm(2));
        s.apply(Input::WarmFinished(2, true));
        assert_eq!(s.apply(Input::Warm(2, 700)), vec![SendReady(2)]);
        assert_eq!(s.apply(update(&[], &[2])), vec![Unassigned(2, 700)]);
    }

    #[test]
    fn reordered_commands() {
        let mut s = ClientState::default();
        // Assigned before the warm finished (the old owner died while we warmed).
        s.apply(warm(2));
        assert_eq!(s.apply(update(&[2], &[])), vec![Assigned(2, e(2))]);
        assert!(s.apply(Input::WarmFinished(2, true)).is_empty(), "no ready once owned");
        assert!(s.apply(warm(2)).is_empty(), "a stale warm of an owned partition");
        // A release of a partition never held.
        assert_eq!(s.apply(Input::Release(7)), vec![SendReleased(7)]);
        // Moved back while releasing.
        s.apply(Input::Release(2));
        assert_eq!(s.apply(Input::Warm(2, 300)), vec![Warm(2, 300)]);
        assert_eq!(s.apply(Input::ReleaseFinished(2)), vec![SendReleased(2)]);
        assert_eq!(s.stage(2), Some(Stage::Warming));
        assert_eq!(s.epoch(2), Some(300));
    }

    #[test]
    fn cancelled_and_failed_warms() {
        let mut s = ClientState::default();
        s.apply(warm(3));
        assert_eq!(s.apply(update(&[], &[3])), vec![Unassigned(3, e(3))]);
        assert!(s.apply(Input::WarmFinished(3, true)).is_empty(), "a cancelled warm sends no ready");
        s.apply(warm(4));
        assert!(s.apply(Input::WarmFinished(4, false)).is_empty());
        assert!(s.is_empty());
        assert_eq!(s.apply(warm(4)), vec![Warm(4, e(4))], "the server may ask again");
    }

    #[test]
    fn snapshot_drops_what_the_server_no_longer_gives_us() {
        let mut s = ClientState::default();
        s.apply(snapshot(&[0, 1, 2]));
        s.apply(warm(5));
        assert_eq!(
            s.apply(snapshot(&[1, 3])),
            vec![Unassigned(0, e(0)), Unassigned(2, e(2)), Assigned(3, e(3))]
        );
        assert_eq!(s.stage(5), Some(Stage::Warming), "warms survive a reconnect");
        assert_eq!(s.owned(), BTreeSet::from([1, 3]));
    }

    #[test]
    fn lose_all_holds_nothing_not_even_a_running_release() {
        let mut s = ClientState::default();
        s.apply(snapshot(&[0, 1]));
        s.apply(warm(2));
        s.apply(Input::Release(1));
        let actions = s.apply(Input::LoseAll);
        assert!(s.owned().is_empty(), "without a session nothing is held: {:?}", s.owned());
        assert_eq!(
            actions,
            vec![Unassigned(0, e(0)), ReleaseAbandoned(1), Unassigned(2, e(2))],
            "no unassigned on top of a release"
        );
        assert_eq!(s.stage(1), Some(Stage::Abandoned));
        assert!(s.apply(Input::LoseAll).is_empty());
        assert_eq!(s.apply(Input::ReleaseFinished(1)), vec![SendReleased(1)], "acknowledged when it returns");
        assert!(s.is_empty());
    }

    #[test]
    fn a_release_stops_being_held_when_overdue_or_unassigned() {
        let mut s = ClientState::default();
        s.apply(snapshot(&[0, 1]));
        s.apply(Input::Release(0));
        s.apply(Input::Release(1));
        assert_eq!(s.apply(Input::ReleaseOverdue(0)), vec![ReleaseAbandoned(0)]);
        assert_eq!(s.apply(update(&[], &[1])), vec![ReleaseAbandoned(1)], "the server is done with it");
        assert!(s.owned().is_empty());
        assert!(s.apply(Input::ReleaseOverdue(0)).is_empty(), "reported once");
        assert!(s.apply(Input::Release(0)).is_empty(), "a repeated release waits for the running one");
        assert!(s.apply(Input::ReleaseOverdue(2)).is_empty(), "nothing to abandon");
        // Given back while the old release still runs: owned again, after that release.
        assert_eq!(s.apply(update(&[1], &[])), vec![Assigned(1, e(1))]);
        assert_eq!(s.apply(Input::ReleaseFinished(1)), vec![SendReleased(1)]);
        assert_eq!(s.stage(1), Some(Stage::Owned), "the late acknowledgement keeps the new assignment");
        assert_eq!(s.apply(Input::ReleaseFinished(0)), vec![SendReleased(0)]);
        assert_eq!(s.owned(), BTreeSet::from([1]));
        // Overdue after it returned, or once moved back to warming: nothing.
        s.apply(Input::Release(1));
        assert_eq!(s.apply(warm(1)), vec![Warm(1, e(1))]);
        assert!(s.apply(Input::ReleaseOverdue(1)).is_empty());
    }
}
