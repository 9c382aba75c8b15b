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
    /// Each command with the moment it gives up waiting.
    pending: VecDeque<(Instant, Command)>,
    /// How long a command may wait.
    bound: Duration,
}

impl EpochGate {
    /// A gate whose commands wait at most `bound` for their epochs.
    pub fn new(bound: Duration) -> Self {
        Self { served: Served::Unknown, known: BTreeMap::new(), pending: VecDeque::new(), bound }
    }

    /// A new session: nothing known, nothing waiting (the new stream's snapshot replaces
    /// whatever was waiting).
    pub fn reset(&mut self) {
        self.served = Served::Unknown;
        self.known.clear();
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

    /// A snapshot of `WatchEpochs` (partition, epoch, warming): replaces what is known.
    pub fn snapshot(&mut self, partitions: impl IntoIterator<Item = (u32, u64, bool)>) {
        self.served = Served::Yes;
        self.known =
            partitions.into_iter().map(|(p, epoch, warming)| (p, Known { epoch, warming })).collect();
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

    fn forget_what_leaves(&mut self, command: &Command) {
        match command {
            Command::Release(p) => {
                self.known.remove(p);
            }
            Command::Update { unassigned, .. } => {
                for p in unassigned {
                    self.known.remove(p);
                }
            }
            Command::Snapshot(_) | Command::Warm(_) => {}
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
        gate.snapshot([(0, 7, false)]);
        assert!(gate.ready().is_empty(), "partition 1 has no epoch yet; the release waits behind");
        assert_eq!(gate.waiting_for(), "the epochs of owned partitions [1]");
        gate.snapshot([(0, 7, false), (1, 9, true)]);
        assert!(gate.ready().is_empty(), "warming is not owned");
        gate.snapshot([(0, 7, false), (1, 9, false)]);
        assert_eq!(gate.ready(), vec![Input::Snapshot(vec![(0, 7), (1, 9)]), Input::Release(5)]);
        assert_eq!(gate.deadline(), None);
        assert_eq!(gate.waiting_for(), "nothing");
    }

    #[test]
    fn a_warm_takes_the_epoch_it_will_own_with_and_an_assignment_the_owned_one() {
        let now = Instant::now();
        let mut gate = EpochGate::new(BOUND);
        gate.snapshot([(0, 3, false)]);
        gate.push(Command::Warm(2), now);
        assert!(gate.ready().is_empty());
        assert_eq!(gate.waiting_for(), "the epoch of warming partition 2");
        gate.snapshot([(0, 3, false), (2, 11, true)]);
        assert_eq!(gate.ready(), vec![Input::Warm(2, 11)]);
        gate.push(update(&[2], &[]), now);
        assert!(gate.ready().is_empty(), "still warming on the server's side");
        gate.snapshot([(0, 3, false), (2, 11, false)]);
        assert_eq!(gate.ready(), vec![Input::Update { assigned: vec![(2, 11)], unassigned: vec![] }]);
        // A warm that arrives after the handoff completed takes the owned epoch.
        gate.snapshot([(0, 3, false), (2, 11, false), (4, 12, false)]);
        gate.push(Command::Warm(4), now);
        assert_eq!(gate.ready(), vec![Input::Warm(4, 12)]);
    }

    #[test]
    fn a_partition_taken_away_needs_a_newer_snapshot_to_come_back() {
        let now = Instant::now();
        let mut gate = EpochGate::new(BOUND);
        gate.snapshot([(0, 3, false), (1, 4, false)]);
        gate.push(Command::Release(0), now);
        gate.push(update(&[], &[1]), now);
        assert_eq!(gate.ready().len(), 2, "nothing to wait for");
        // Back again while the epoch stream still shows the old ownership: no stale epoch.
        gate.push(update(&[0, 1], &[]), now);
        assert!(gate.ready().is_empty());
        gate.snapshot([(0, 20, false), (1, 21, false)]);
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
        gate.snapshot([(1, 5, true)]);
        assert_eq!(gate.ready(), vec![Input::Warm(1, 5)]);
        assert_eq!(gate.deadline(), Some(now + Duration::from_secs(2) + BOUND), "the next one's own");
        gate.reset();
        assert_eq!(gate.deadline(), None);
        assert_eq!(gate.served(), Served::Unknown);
        gate.push(Command::Warm(1), now);
        gate.answered(true);
        assert!(gate.ready().is_empty(), "what the old session knew is gone");
    }
}
