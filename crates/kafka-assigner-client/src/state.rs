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
    /// The first message of a (re)connected stream: every partition the server says we own.
    Snapshot(Vec<u32>),
    /// `AssignmentUpdate` after the snapshot.
    Update {
        /// Newly owned.
        assigned: Vec<u32>,
        /// No longer owned, or a warm that was cancelled.
        unassigned: Vec<u32>,
    },
    /// `WarmPartition`.
    Warm(u32),
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
    /// Call the handler's `warm`.
    Warm(u32),
    /// Call the handler's `assigned`.
    Assigned(u32),
    /// Call the handler's `release`.
    Release(u32),
    /// Call the handler's `unassigned`.
    Unassigned(u32),
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
            Action::Warm(p)
            | Action::Assigned(p)
            | Action::Release(p)
            | Action::Unassigned(p)
            | Action::SendReady(p)
            | Action::SendReleased(p)
            | Action::ReleaseAbandoned(p) => *p,
        }
    }
}

/// The client's view of its partitions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientState {
    stages: BTreeMap<u32, Stage>,
}

impl ClientState {
    /// The stage of `partition`, if the client has anything to do with it.
    pub fn stage(&self, partition: u32) -> Option<Stage> {
        self.stages.get(&partition).copied()
    }

    /// Partitions the client holds: owned, or releasing until `release` returns (the old
    /// owner keeps processing through the release window of a handoff) but no longer than
    /// the session ([`Stage::Abandoned`]).
    pub fn owned(&self) -> BTreeSet<u32> {
        self.stages
            .iter()
            .filter(|(_, s)| matches!(s, Stage::Owned | Stage::Releasing))
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
                let keep: BTreeSet<u32> = assigned.iter().copied().collect();
                // Owned before but not in the snapshot: the session was lost or the
                // partition moved while we were away. A pending Release after the
                // snapshot is then answered at once (see `Release` of an unknown partition).
                // Warms are kept: a Warm still pending follows the snapshot.
                let lost: Vec<u32> = self
                    .stages
                    .iter()
                    .filter(|(p, s)| **s == Stage::Owned && !keep.contains(p))
                    .map(|(p, _)| *p)
                    .collect();
                for p in lost {
                    self.stages.remove(&p);
                    actions.push(Action::Unassigned(p));
                }
                for p in assigned {
                    self.assign(p, &mut actions);
                }
            }
            Input::Update { assigned, unassigned } => {
                for p in unassigned {
                    self.unassign(p, &mut actions);
                }
                for p in assigned {
                    self.assign(p, &mut actions);
                }
            }
            Input::Warm(p) => match self.stages.get(&p) {
                None | Some(Stage::Releasing | Stage::Abandoned) => {
                    // Releasing: the partition comes back to us; the queue runs `release`
                    // first, and `ReleaseFinished` still acknowledges it.
                    self.stages.insert(p, Stage::Warming);
                    actions.push(Action::Warm(p));
                }
                Some(Stage::Ready) => actions.push(Action::SendReady(p)),
                Some(Stage::Warming) | Some(Stage::Owned) => {}
            },
            Input::Release(p) => match self.stages.get(&p) {
                None => actions.push(Action::SendReleased(p)),
                Some(Stage::Releasing | Stage::Abandoned) => {}
                Some(_) => {
                    self.stages.insert(p, Stage::Releasing);
                    actions.push(Action::Release(p));
                }
            },
            Input::WarmFinished(p, ok) => {
                if self.stages.get(&p) == Some(&Stage::Warming) {
                    if ok {
                        self.stages.insert(p, Stage::Ready);
                        actions.push(Action::SendReady(p));
                    } else {
                        // The server times the warm out and cancels it, or sends it again.
                        self.stages.remove(&p);
                    }
                }
            }
            Input::ReleaseFinished(p) => {
                if matches!(self.stages.get(&p), Some(Stage::Releasing | Stage::Abandoned)) {
                    self.stages.remove(&p);
                }
                actions.push(Action::SendReleased(p));
            }
            Input::ReleaseOverdue(p) => self.abandon(p, &mut actions),
            Input::LoseAll => {
                let all: Vec<(u32, Stage)> = self.stages.iter().map(|(p, s)| (*p, *s)).collect();
                for (p, stage) in all {
                    match stage {
                        // A running release already stops the work (no `unassigned` on top),
                        // but without a session the partition may be someone else's now.
                        Stage::Releasing => self.abandon(p, &mut actions),
                        Stage::Abandoned => {}
                        Stage::Warming | Stage::Ready | Stage::Owned => {
                            self.stages.remove(&p);
                            actions.push(Action::Unassigned(p));
                        }
                    }
                }
            }
        }
        actions
    }

    fn assign(&mut self, p: u32, actions: &mut Vec<Action>) {
        if self.stages.get(&p) != Some(&Stage::Owned) {
            self.stages.insert(p, Stage::Owned);
            actions.push(Action::Assigned(p));
        }
    }

    fn unassign(&mut self, p: u32, actions: &mut Vec<Action>) {
        match self.stages.get(&p) {
            Some(Stage::Warming | Stage::Ready | Stage::Owned) => {
                self.stages.remove(&p);
                actions.push(Action::Unassigned(p));
            }
            // The server is done with it while `release` still runs.
            Some(Stage::Releasing) => self.abandon(p, actions),
            Some(Stage::Abandoned) | None => {}
        }
    }

    /// A `release` still running no longer holds its partition.
    fn abandon(&mut self, p: u32, actions: &mut Vec<Action>) {
        if self.stages.get(&p) == Some(&Stage::Releasing) {
            self.stages.insert(p, Stage::Abandoned);
            actions.push(Action::ReleaseAbandoned(p));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::*;

    fn update(assigned: &[u32], unassigned: &[u32]) -> Input {
        Input::Update { assigned: assigned.to_vec(), unassigned: unassigned.to_vec() }
    }

    #[test]
    fn warm_ready_assigned_then_release() {
        let mut s = ClientState::default();
        assert_eq!(s.apply(Input::Snapshot(vec![0])), vec![Assigned(0)]);
        assert_eq!(s.apply(Input::Warm(1)), vec![Warm(1)]);
        assert_eq!(s.apply(Input::WarmFinished(1, true)), vec![SendReady(1)]);
        assert_eq!(s.owned(), BTreeSet::from([0]));
        assert_eq!(s.apply(update(&[1], &[])), vec![Assigned(1)]);
        assert_eq!(s.apply(Input::Release(0)), vec![Release(0)]);
        assert_eq!(s.owned(), BTreeSet::from([0, 1]), "held until release returns");
        assert_eq!(s.apply(Input::ReleaseFinished(0)), vec![SendReleased(0)]);
        assert_eq!(s.owned(), BTreeSet::from([1]));
    }

    #[test]
    fn repeated_commands_do_nothing_new() {
        let mut s = ClientState::default();
        s.apply(Input::Snapshot(vec![0]));
        assert!(s.apply(update(&[0], &[])).is_empty());
        assert!(s.apply(Input::Snapshot(vec![0])).is_empty(), "a reconnect snapshot keeps it");
        assert_eq!(s.apply(Input::Warm(1)), vec![Warm(1)]);
        assert!(s.apply(Input::Warm(1)).is_empty(), "still warming");
        s.apply(Input::WarmFinished(1, true));
        assert_eq!(s.apply(Input::Warm(1)), vec![SendReady(1)], "ready is re-sent, warm is not re-run");
        assert_eq!(s.apply(Input::Release(0)), vec![Release(0)]);
        assert!(s.apply(Input::Release(0)).is_empty());
        assert_eq!(s.apply(Input::ReleaseFinished(0)), vec![SendReleased(0)]);
        assert!(s.apply(update(&[], &[0])).is_empty(), "an unassign after the release changes nothing");
        assert_eq!(s.apply(Input::Release(0)), vec![SendReleased(0)], "acknowledged again, no handler call");
    }

    #[test]
    fn reordered_commands() {
        let mut s = ClientState::default();
        // Assigned before the warm finished (the old owner died while we warmed).
        s.apply(Input::Warm(2));
        assert_eq!(s.apply(update(&[2], &[])), vec![Assigned(2)]);
        assert!(s.apply(Input::WarmFinished(2, true)).is_empty(), "no ready once owned");
        assert!(s.apply(Input::Warm(2)).is_empty(), "a stale warm of an owned partition");
        // A release of a partition never held.
        assert_eq!(s.apply(Input::Release(7)), vec![SendReleased(7)]);
        // Moved back while releasing.
        s.apply(Input::Release(2));
        assert_eq!(s.apply(Input::Warm(2)), vec![Warm(2)]);
        assert_eq!(s.apply(Input::ReleaseFinished(2)), vec![SendReleased(2)]);
        assert_eq!(s.stage(2), Some(Stage::Warming));
    }

    #[test]
    fn cancelled_and_failed_warms() {
        let mut s = ClientState::default();
        s.apply(Input::Warm(3));
        assert_eq!(s.apply(update(&[], &[3])), vec![Unassigned(3)]);
        assert!(s.apply(Input::WarmFinished(3, true)).is_empty(), "a cancelled warm sends no ready");
        s.apply(Input::Warm(4));
        assert!(s.apply(Input::WarmFinished(4, false)).is_empty());
        assert!(s.is_empty());
        assert_eq!(s.apply(Input::Warm(4)), vec![Warm(4)], "the server may ask again");
    }

    #[test]
    fn snapshot_drops_what_the_server_no_longer_gives_us() {
        let mut s = ClientState::default();
        s.apply(Input::Snapshot(vec![0, 1, 2]));
        s.apply(Input::Warm(5));
        assert_eq!(s.apply(Input::Snapshot(vec![1, 3])), vec![Unassigned(0), Unassigned(2), Assigned(3)]);
        assert_eq!(s.stage(5), Some(Stage::Warming), "warms survive a reconnect");
        assert_eq!(s.owned(), BTreeSet::from([1, 3]));
    }

    #[test]
    fn lose_all_holds_nothing_not_even_a_running_release() {
        let mut s = ClientState::default();
        s.apply(Input::Snapshot(vec![0, 1]));
        s.apply(Input::Warm(2));
        s.apply(Input::Release(1));
        let actions = s.apply(Input::LoseAll);
        assert!(s.owned().is_empty(), "without a session nothing is held: {:?}", s.owned());
        assert_eq!(
            actions,
            vec![Unassigned(0), ReleaseAbandoned(1), Unassigned(2)],
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
        s.apply(Input::Snapshot(vec![0, 1]));
        s.apply(Input::Release(0));
        s.apply(Input::Release(1));
        assert_eq!(s.apply(Input::ReleaseOverdue(0)), vec![ReleaseAbandoned(0)]);
        assert_eq!(s.apply(update(&[], &[1])), vec![ReleaseAbandoned(1)], "the server is done with it");
        assert!(s.owned().is_empty());
        assert!(s.apply(Input::ReleaseOverdue(0)).is_empty(), "reported once");
        assert!(s.apply(Input::Release(0)).is_empty(), "a repeated release waits for the running one");
        assert!(s.apply(Input::ReleaseOverdue(2)).is_empty(), "nothing to abandon");
        // Given back while the old release still runs: owned again, after that release.
        assert_eq!(s.apply(update(&[1], &[])), vec![Assigned(1)]);
        assert_eq!(s.apply(Input::ReleaseFinished(1)), vec![SendReleased(1)]);
        assert_eq!(s.stage(1), Some(Stage::Owned), "the late acknowledgement keeps the new assignment");
        assert_eq!(s.apply(Input::ReleaseFinished(0)), vec![SendReleased(0)]);
        assert_eq!(s.owned(), BTreeSet::from([1]));
        // Overdue after it returned, or once moved back to warming: nothing.
        s.apply(Input::Release(1));
        assert_eq!(s.apply(Input::Warm(1)), vec![Warm(1)]);
        assert!(s.apply(Input::ReleaseOverdue(1)).is_empty());
    }
}
