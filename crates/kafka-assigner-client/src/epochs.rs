//! Pure: the epochs a command needs, and the commands waiting for them (docs/design.md §10;
//! no I/O, the time is an input).
//!
//! The assigner sends commands on the `Register` stream and epochs on a second stream
//! (`WatchEpochs`), with no order between the two. A command that hands a partition to the
//! handler waits here until the latest epoch snapshot has what it needs: `WarmPartition(p)`
//! needs `p` (warming or owned), an assignment needs each assigned partition owned (not
//! warming). Commands leave in the order they came, so a waiting command holds up those
//! behind it (handler calls for one partition must stay in order, and the wait is short).
//! A command that waits past its deadline is the driver's cue to drop the session and
//! register again: a partition is never handed over without its epoch.
//!
//! When a release or an unassign takes a partition away, its epoch is forgotten, so taking
//! it again waits for a snapshot sent after that: the epoch stream may lag behind the
//! commands, and an epoch of an earlier ownership must not be handed out as the new one's.
//! (Should the epoch stream instead run ahead, past a whole move away and back, the wait
//! runs out and the session starts over, with a fresh snapshot: slower, never wrong.)
//!
//! Forgetting is not enough on its own: a snapshot computed before the handover can still
//! be on its way when the release is applied, and would teach the old epoch again. Each
//! snapshot carries the store revision it was computed at, and one below the last applied
//! is ignored, but that does not close this: the two streams have no order between them,
//! so the stale snapshot may be the first one to arrive after the release, with a revision
//! above every one applied before. So the gate also remembers the highest epoch it forgot
//! per partition (the *floor*), and a later snapshot teaches that partition only an epoch
//! above it: a new ownership's epoch is greater than every earlier one (docs/design.md
//! §10), so an entry at or below the floor is the ended ownership's, ignored for that
//! partition; the command that needs it waits for a newer snapshot. Floors and revisions
//! belong to a session: a new one starts from nothing (its first snapshot is the truth).

use std::{
    collections::{BTreeMap, VecDeque},
    time::Duration,
};

use tokio::time::Instant;

use crate::state::Input;

/// A command of the `Register` stream, before its epochs are known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// The first message of a stream: every partition owned.
    Snapshot(Vec<u32>),
    /// `AssignmentUpdate`.
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
}

/// What the assigner said about epochs on this session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// No answer to `WatchEpochs` yet: commands that need epochs wait.
    Unknown,
    /// `WatchEpochs` is open: epochs come from its snapshots.
    Yes,
    /// The assigner has no epochs (`UNIMPLEMENTED`) and the policy allows it: epoch 0.
    No,
}

/// A partition of the latest epoch snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Known {
    epoch: u64,
    warming: bool,
}

/// Commands waiting for their epochs, and the epochs known (see the module docs).
#[derive(Debug)]
pub struct EpochGate {
    served: Served,
    known: BTreeMap<u32, Known>,
    /// The revision of the last snapshot applied this session.
    applied: Option<u64>,
    /// Per partition, the highest epoch forgotten this session (a release or unassign):
    /// a snapshot teaches the partition only an epoch above it.
    floor: BTreeMap<u32, u64>,
    /// Per partition, the last epoch a command was resolved with (what the state holds it
    /// with, which a newer snapshot may no longer show when it is forgotten).
    handed: BTreeMap<u32, u64>,
    /// Each command with the moment it gives up waiting.
    pending: VecDeque<(Instant, Command)>,
    /// How long a command may wait.
    bound: Duration,
}

impl EpochGate {
    /// A gate whose commands wait at most `bound` for their epochs.
    pub fn new(bound: Duration) -> Self {
        Self {
            served: Served::Unknown,
            known: BTreeMap::new(),
            applied: None,
            floor: BTreeMap::new(),
            handed: BTreeMap::new(),
            pending: VecDeque::new(),
            bound,
        }
    }

    /// A new session: nothing known, nothing waiting (the new stream's snapshot replaces
    /// whatever was waiting), no revision or floor: the new stream's snapshots are computed
    /// after the new registration, which starts from what the store says.
    pub fn reset(&mut self) {
        self.served = Served::Unknown;
        self.known.clear();
        self.applied = None;
        self.floor.clear();
        self.handed.clear();
        self.pending.clear();
    }

    /// What the assigner said about epochs on this session.
    #[cfg(test)]
    pub fn served(&self) -> Served {
        self.served
    }

    /// `WatchEpochs` was answered: `true` if it is open, `false` for an assigner without
    /// epochs whose partitions are handed out with epoch 0.
    pub fn answered(&mut self, served: bool) {
        self.served = if served { Served::Yes } else { Served::No };
    }

    /// A snapshot of `WatchEpochs` computed at `revision` (partition, epoch, warming):
    /// replaces what is known, except for entries at or below their partition's floor
    /// (see the module docs). A snapshot older than the last one applied is ignored
    /// (`false`).
    pub fn snapshot(
        &mut self,
        revision: u64,
        partitions: impl IntoIterator<Item = (u32, u64, bool)>,
    ) -> bool {
        if self.applied.is_some_and(|applied| revision < applied) {
            return false;
        }
        self.applied = Some(revision);
        self.served = Served::Yes;
        let floor = &self.floor;
        self.known = partitions
            .into_iter()
            .filter(|(p, epoch, _)| floor.get(p).is_none_or(|forgotten| epoch > forgotten))
            .map(|(p, epoch, warming)| (p, Known { epoch, warming }))
            .collect();
        true
    }

    /// A command arrived at `now`.
    pub fn push(&mut self, command: Command, now: Instant) {
        self.pending.push_back((now + self.bound, command));
    }

    /// The commands whose epochs are known, as inputs of the state machine, in order; stops
    /// at the first one that still waits.
    pub fn ready(&mut self) -> Vec<Input> {
        let mut inputs = Vec::new();
        while let Some((_, command)) = self.pending.front() {
            let Some(input) = self.resolve(command) else { break };
            if let Some((_, command)) = self.pending.pop_front() {
                self.forget_what_leaves(&command);
            }
            self.remember_handed(&input);
            inputs.push(input);
        }
        inputs
    }

    /// When the first waiting command gives up (`None`: nothing waits).
    pub fn deadline(&self) -> Option<Instant> {
        self.pending.front().map(|(at, _)| *at)
    }

    /// Why the first command still waits, for the log.
    pub fn waiting_for(&self) -> String {
        let Some((_, command)) = self.pending.front() else { return "nothing".into() };
        if self.served == Served::Unknown {
            return "the answer to WatchEpochs".into();
        }
        let missing = |ps: &[u32]| -> Vec<u32> {
            ps.iter().copied().filter(|p| self.known.get(p).is_none_or(|k| k.warming)).collect()
        };
        match command {
            Command::Snapshot(ps) | Command::Update { assigned: ps, .. } => {
                format!("the epochs of owned partitions {:?}", missing(ps))
            }
            Command::Warm(p) => format!("the epoch of warming partition {p}"),
            Command::Release(_) => "nothing".into(),
        }
    }

    /// `command` as a state input, if its epochs are known.
    fn resolve(&self, command: &Command) -> Option<Input> {
        let owned = |p: &u32| -> Option<(u32, u64)> {
            match self.served {
                Served::No => Some((*p, 0)),
                Served::Unknown => None,
                Served::Yes => self.known.get(p).filter(|k| !k.warming).map(|k| (*p, k.epoch)),
            }
        };
        Some(match command {
            Command::Snapshot(ps) => Input::Snapshot(ps.iter().map(owned).collect::<Option<_>>()?),
            Command::Update { assigned, unassigned } => Input::Update {
                assigned: assigned.iter().map(owned).collect::<Option<_>>()?,
                unassigned: unassigned.clone(),
            },
            Command::Warm(p) => match self.served {
                Served::No => Input::Warm(*p, 0),
                Served::Unknown => return None,
                // Owned already: the handoff completed before the warm got here.
                Served::Yes => Input::Warm(*p, self.known.get(p)?.epoch),
            },
            // Released with the epoch it is held with, which the state knows.
            Command::Release(p) => Input::Release(*p),
        })
    }

    /// Forgets the epochs of what `command` takes away, and raises their floors to them.
    fn forget_what_leaves(&mut self, command: &Command) {
        let leaving: &[u32] = match command {
            Command::Release(p) => std::slice::from_ref(p),
            Command::Update { unassigned, .. } => unassigned,
            Command::Snapshot(_) | Command::Warm(_) => &[],
        };
        for p in leaving {
            let known = self.known.remove(p).map(|k| k.epoch);
            if let Some(forgotten) = known.into_iter().chain(self.handed.remove(p)).max() {
                let floor = self.floor.entry(*p).or_insert(forgotten);
                *floor = (*floor).max(forgotten);
            }
        }
    }

    /// Remembers the epochs `input` hands out, for [`forget_what_leaves`](Self::forget_what_leaves).
    fn remember_handed(&mut self, input: &Input) {
        match input {
            Input::Snapshot(held) | Input::Update { assigned: held, .. } => {
                self.handed.extend(held.iter().copied());
            }
            Input::Warm(p, epoch) => {
                self.handed.insert(*p, *epoch);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(5);

    fn update(assigned: &[u32], unassigned: &[u32]) -> Command {
        Command::Update { assigned: assigned.to_vec(), unassigned: unassigned.to_vec() }
    }

    #[test]
    fn commands_wait_for_their_epochs_in_order() {
        let now = Instant::now();
        let mut gate = EpochGate::new(BOUND);
        gate.push(Command::Snapshot(vec![0, 1]), now);
        gate.push(Command::Release(5), now + Duration::from_secs(1));
        assert!(gate.ready().is_empty(), "no answer to WatchEpochs yet");
        assert_eq!(gate.waiting_for(), "the answer to WatchEpochs");
        assert_eq!(gate.deadline(), Some(now + BOUND));
        gate.answered(true);
        gate.snapshot(1, [(0, 7, false)]);
        assert!(gate.ready().is_empty(), "partition 1 has no epoch yet; the release waits behind");
        assert_eq!(gate.waiting_for(), "the epochs of owned partitions [1]");
        gate.snapshot(1, [(0, 7, false), (1, 9, true)]);
        assert!(gate.ready().is_empty(), "warming is not owned");
        gate.snapshot(1, [(0, 7, false), (1, 9, false)]);
        assert_eq!(gate.ready(), vec![Input::Snapshot(vec![(0, 7), (1, 9)]), Input::Release(5)]);
        assert_eq!(gate.deadline(), None);
        assert_eq!(gate.waiting_for(), "nothing");
    }

    #[test]
    fn a_warm_takes_the_epoch_it_will_own_with_and_an_assignment_the_owned_one() {
        let now = Instant::now();
        let mut gate = EpochGate::new(BOUND);
        gate.snapshot(1, [(0, 3, false)]);
        gate.push(Command::Warm(2), now);
        assert!(gate.ready().is_empty());
        assert_eq!(gate.waiting_for(), "the epoch of warming partition 2");
        gate.snapshot(1, [(0, 3, false), (2, 11, true)]);
        assert_eq!(gate.ready(), vec![Input::Warm(2, 11)]);
        gate.push(update(&[2], &[]), now);
        assert!(gate.ready().is_empty(), "still warming on the server's side");
        gate.snapshot(1, [(0, 3, false), (2, 11, false)]);
        assert_eq!(gate.ready(), vec![Input::Update { assigned: vec![(2, 11)], unassigned: vec![] }]);
        // A warm that arrives after the handoff completed takes the owned epoch.
        gate.snapshot(1, [(0, 3, false), (2, 11, false), (4, 12, false)]);
        gate.push(Command::Warm(4), now);
        assert_eq!(gate.ready(), vec![Input::Warm(4, 12)]);
    }

    #[test]
    fn a_partition_taken_away_needs_a_newer_snapshot_to_come_back() {
        let now = Instant::now();
        let mut gate = EpochGate::new(BOUND);
        gate.snapshot(1, [(0, 3, false), (1, 4, false)]);
        gate.push(Command::Release(0), now);
        gate.push(update(&[], &[1]), now);
        assert_eq!(gate.ready().len(), 2, "nothing to wait for");
        // Back again while the epoch stream still shows the old ownership: no stale epoch.
        gate.push(update(&[0, 1], &[]), now);
        assert!(gate.ready().is_empty());
        gate.snapshot(1, [(0, 20, false), (1, 21, false)]);
        assert_eq!(
            gate.ready(),
            vec![Input::Update { assigned: vec![(0, 20), (1, 21)], unassigned: vec![] }]
        );
    }

    #[test]
    fn without_epochs_everything_passes_with_epoch_zero() {
        let now = Instant::now();
        let mut gate = EpochGate::new(BOUND);
        gate.push(Command::Snapshot(vec![0]), now);
        gate.push(Command::Warm(1), now);
        gate.push(update(&[1], &[0]), now);
        gate.answered(false);
        assert_eq!(gate.served(), Served::No);
        assert_eq!(
            gate.ready(),
            vec![
                Input::Snapshot(vec![(0, 0)]),
                Input::Warm(1, 0),
                Input::Update { assigned: vec![(1, 0)], unassigned: vec![0] },
            ]
        );
    }

    #[test]
    fn the_deadline_is_the_first_waiting_commands_and_a_reset_drops_everything() {
        let now = Instant::now();
        let mut gate = EpochGate::new(BOUND);
        gate.answered(true);
        gate.push(Command::Warm(1), now);
        gate.push(Command::Warm(2), now + Duration::from_secs(2));
        assert_eq!(gate.deadline(), Some(now + BOUND));
        gate.snapshot(1, [(1, 5, true)]);
        assert_eq!(gate.ready(), vec![Input::Warm(1, 5)]);
        assert_eq!(gate.deadline(), Some(now + Duration::from_secs(2) + BOUND), "the next one's own");
        gate.reset();
        assert_eq!(gate.deadline(), None);
        assert_eq!(gate.served(), Served::Unknown);
        gate.push(Command::Warm(1), now);
        gate.answered(true);
        assert!(gate.ready().is_empty(), "what the old session knew is gone");
    }

    #[test]
    fn a_snapshot_older_than_one_applied_is_ignored() {
        let now = Instant::now();
        let mut gate = EpochGate::new(BOUND);
        assert!(gate.snapshot(12, [(0, 30, false)]));
        assert!(!gate.snapshot(11, [(0, 7, false), (1, 8, false)]), "computed before the one applied");
        gate.push(Command::Snapshot(vec![0]), now);
        assert_eq!(gate.ready(), vec![Input::Snapshot(vec![(0, 30)])], "what revision 12 said");
        gate.push(update(&[1], &[]), now);
        assert!(gate.ready().is_empty(), "partition 1 was only in the ignored snapshot");
        assert!(gate.snapshot(12, [(0, 30, false), (1, 31, false)]), "the same revision again is not older");
        assert_eq!(gate.ready(), vec![Input::Update { assigned: vec![(1, 31)], unassigned: vec![] }]);
        // A new session starts over: its snapshots are not compared with the old one's.
        gate.reset();
        assert!(gate.snapshot(5, [(0, 40, false)]));
    }

    /// The race the floor closes. Snapshot S1 (revision 10: partition 0 owned at epoch 7)
    /// was computed before the handover, but arrives after `Release(0)` was applied: its
    /// revision is above every one applied, so the revision alone takes it. Partition 0
    /// then comes back: the assignment must not be resolved with the ended ownership's 7,
    /// only with the next snapshot's new epoch (9 > 7).
    #[test]
    fn a_stale_snapshot_read_after_the_release_does_not_teach_the_old_epoch() {
        let now = Instant::now();
        let mut gate = EpochGate::new(BOUND);
        assert!(gate.snapshot(9, [(0, 7, false), (1, 8, false)]));
        gate.push(Command::Snapshot(vec![0, 1]), now);
        assert_eq!(gate.ready(), vec![Input::Snapshot(vec![(0, 7), (1, 8)])]);
        gate.push(Command::Release(0), now);
        assert_eq!(gate.ready(), vec![Input::Release(0)]);
        assert!(gate.snapshot(10, [(0, 7, false), (1, 8, false)]), "S1: newer than any applied");
        gate.push(update(&[0], &[]), now);
        assert!(gate.ready().is_empty(), "epoch 7 belongs to the ownership that was released");
        assert_eq!(gate.waiting_for(), "the epochs of owned partitions [0]");
        assert!(gate.snapshot(11, [(1, 8, false)]), "the handover: 0 is someone else's");
        assert!(gate.ready().is_empty());
        assert!(gate.snapshot(13, [(0, 9, false), (1, 8, false)]), "0 is ours again, newly");
        assert_eq!(gate.ready(), vec![Input::Update { assigned: vec![(0, 9)], unassigned: vec![] }]);
        // Without a floor for it, partition 1 kept its epoch all along.
        gate.push(update(&[], &[1]), now);
        assert_eq!(gate.ready(), vec![Input::Update { assigned: vec![], unassigned: vec![1] }]);
    }

    /// The floor also holds when the snapshots had moved on before the release: the epoch
    /// forgotten is the one the partition was handed out with, and a warm cancelled by an
    /// unassign raises the floor to the warm's epoch.
    #[test]
    fn the_floor_is_the_epoch_handed_out_even_when_no_snapshot_shows_it_any_more() {
        let now = Instant::now();
        let mut gate = EpochGate::new(BOUND);
        assert!(gate.snapshot(9, [(0, 7, false)]));
        gate.push(Command::Snapshot(vec![0]), now);
        assert_eq!(gate.ready().len(), 1);
        assert!(gate.snapshot(11, []), "the handover shows before the release arrives");
        gate.push(Command::Release(0), now);
        assert_eq!(gate.ready(), vec![Input::Release(0)]);
        gate.push(update(&[0], &[]), now);
        assert!(gate.snapshot(11, [(0, 7, false)]), "a stale copy");
        assert!(gate.ready().is_empty(), "7 was handed out with the ownership that ended");
        assert!(gate.snapshot(12, [(0, 8, false), (2, 20, true)]));
        assert_eq!(gate.ready(), vec![Input::Update { assigned: vec![(0, 8)], unassigned: vec![] }]);
        gate.push(Command::Warm(2), now);
        assert_eq!(gate.ready(), vec![Input::Warm(2, 20)]);
        gate.push(update(&[], &[2]), now);
        assert_eq!(gate.ready().len(), 1, "the warm is cancelled");
        gate.push(Command::Warm(2), now);
        assert!(gate.snapshot(12, [(0, 8, false), (2, 20, true)]));
        assert!(gate.ready().is_empty(), "20 belonged to the cancelled warm");
        assert!(gate.snapshot(14, [(0, 8, false), (2, 22, true)]));
        assert_eq!(gate.ready(), vec![Input::Warm(2, 22)]);
    }
}
