//! The consumer models: what each stream told its consumer (its [`Belief`]), and where
//! each consumer is in its life (offline, registering, online on an instance, leaving).
//!
//! A consumer acts only on what its stream told it, in order: a warm is answered with
//! `PartitionReady`, a release with `PartitionReleased` once it stopped processing. A
//! stream that ends, or that it drops, means it stops processing everything at once (the
//! client's side of the lease); a new stream starts from an empty belief.

use std::collections::{BTreeMap, BTreeSet};

pub use super::events::Todo;
use crate::coordinator::machine::io::StreamId;
use crate::proto::v1::{AssignmentCommand, assignment_command::Command};

/// What one stream told its consumer. The consumer processes the partitions in `owned`
/// until it is told otherwise.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Belief {
    /// Whether the snapshot (always the first command) arrived.
    pub snapshot: bool,
    /// Partitions it processes (one it was told to release stays until it acts on it).
    pub owned: BTreeSet<u32>,
    /// Partitions it was told to release, with the new owner.
    pub releasing: BTreeMap<u32, String>,
    /// Partitions it was asked to warm, with their owner.
    pub warming: BTreeMap<u32, String>,
}

impl Belief {
    /// Applies one command as a consumer would; `Err` when it contradicts what the stream
    /// said before (the server must never send one).
    pub fn apply(
        &mut self,
        command: &AssignmentCommand,
        topic: &str,
        partitions: u32,
    ) -> Result<Vec<Todo>, String> {
        let Some(command) = &command.command else { return Err("a command without a body".into()) };
        let first = !self.snapshot;
        let check = |p: u32, t: &str| -> Result<u32, String> {
            if t != topic || p >= partitions {
                return Err(format!("partition {t}/{p} is not one of {topic}/0..{partitions}"));
            }
            Ok(p)
        };
        let mut todo = Vec::new();
        match command {
            Command::Assignment(update) => {
                if first && !update.unassigned.is_empty() {
                    return Err(format!("the snapshot unassigns {:?}", update.unassigned));
                }
                self.snapshot = true;
                for tp in &update.unassigned {
                    let p = check(tp.partition, &tp.topic)?;
                    self.owned.remove(&p);
                    self.releasing.remove(&p);
                    self.warming.remove(&p);
                }
                for tp in &update.assigned {
                    let p = check(tp.partition, &tp.topic)?;
                    self.owned.insert(p);
                    self.warming.remove(&p);
                    self.releasing.remove(&p);
                }
            }
            _ if first => return Err(format!("the first command is not the snapshot: {command:?}")),
            Command::Warm(warm) => {
                let tp = warm.partition.as_ref().ok_or("a warm without a partition")?;
                let p = check(tp.partition, &tp.topic)?;
                // A partition it was told to release may come back to it (the handoff ended
                // without its acknowledgement); one it owns outright may not.
                if self.owned.contains(&p) && !self.releasing.contains_key(&p) {
                    return Err(format!("asked to warm {p}, which it was told it owns"));
                }
                self.warming.insert(p, warm.current_owner.clone());
                todo.push(Todo::Ready(p));
            }
            Command::Release(release) => {
                let tp = release.partition.as_ref().ok_or("a release without a partition")?;
                let p = check(tp.partition, &tp.topic)?;
                self.releasing.insert(p, release.new_owner.clone());
                todo.push(Todo::Release(p));
            }
        }
        Ok(todo)
    }

    /// The partitions it processes and was not told to release: what it claims.
    pub fn claims(&self) -> impl Iterator<Item = u32> + '_ {
        self.owned.iter().copied().filter(|p| !self.releasing.contains_key(p))
    }
}

/// Where a consumer is in its life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// No stream; it registers again at its next wake, if it `wants` to.
    Offline,
    /// A `Register` is on its way (stream `stream` on `instance`).
    Registering {
        /// The instance called.
        instance: usize,
        /// The stream it will read.
        stream: StreamId,
    },
    /// Its stream on `instance` is open.
    Online {
        /// The instance holding the stream.
        instance: usize,
        /// The stream.
        stream: StreamId,
        /// What the stream told it.
        belief: Belief,
        /// It deregistered and waits for its drain to end the stream.
        draining: bool,
    },
}

/// One consumer: a name, the process incarnation, and its phase.
#[derive(Debug)]
pub struct ConsumerModel {
    /// Its name (the same across restarts).
    pub name: String,
    /// The process' incarnation: a restart is a new one, a reconnect keeps it.
    pub incarnation: u64,
    /// Where it is.
    pub phase: Phase,
    /// Whether it wants a stream (false once it left for good).
    pub wants: bool,
    /// Until when it is paused: it reads nothing and calls nothing (virtual µs).
    pub paused_until: u64,
    /// What reached it while paused, in order (the cluster's events).
    pub(crate) inbox: std::collections::VecDeque<crate::sim::events::Ev>,
}

impl ConsumerModel {
    /// A consumer that has not registered yet.
    pub fn new(name: String, incarnation: u64) -> Self {
        Self {
            name,
            incarnation,
            phase: Phase::Offline,
            wants: true,
            paused_until: 0,
            inbox: Default::default(),
        }
    }

    /// Its belief, while its stream is open.
    pub fn belief(&self) -> Option<&Belief> {
        match &self.phase {
            Phase::Online { belief, .. } => Some(belief),
            _ => None,
        }
    }

    /// The instance and stream it reads, while registering or online.
    pub fn stream(&self) -> Option<(usize, StreamId)> {
        match &self.phase {
            Phase::Registering { instance, stream } | Phase::Online { instance, stream, .. } => {
                Some((*instance, *stream))
            }
            Phase::Offline => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::v1::{AssignmentUpdate, ReleasePartition, TopicPartition, WarmPartition};

    fn tp(p: u32) -> TopicPartition {
        TopicPartition { topic: "t".into(), partition: p }
    }

    fn assignment(assigned: &[u32], unassigned: &[u32]) -> AssignmentCommand {
        let update = AssignmentUpdate {
            assigned: assigned.iter().map(|p| tp(*p)).collect(),
            unassigned: unassigned.iter().map(|p| tp(*p)).collect(),
        };
        AssignmentCommand { command: Some(Command::Assignment(update)) }
    }

    #[test]
    fn a_belief_follows_its_stream_and_refuses_contradictions() {
        let mut belief = Belief::default();
        let warm = AssignmentCommand {
            command: Some(Command::Warm(WarmPartition { partition: Some(tp(1)), current_owner: "a".into() })),
        };
        assert!(belief.apply(&warm, "t", 4).is_err(), "the snapshot comes first");
        assert!(belief.apply(&assignment(&[0], &[]), "t", 4).unwrap().is_empty());
        assert_eq!(belief.apply(&warm, "t", 4).unwrap(), [Todo::Ready(1)]);
        belief.apply(&assignment(&[1], &[]), "t", 4).unwrap();
        assert_eq!(belief.claims().collect::<Vec<_>>(), [0, 1]);
        let release = AssignmentCommand {
            command: Some(Command::Release(ReleasePartition {
                partition: Some(tp(0)),
                new_owner: "b".into(),
            })),
        };
        assert_eq!(belief.apply(&release, "t", 4).unwrap(), [Todo::Release(0)]);
        assert_eq!(belief.claims().collect::<Vec<_>>(), [1]);
        let warm_owned = AssignmentCommand {
            command: Some(Command::Warm(WarmPartition { partition: Some(tp(1)), current_owner: "a".into() })),
        };
        assert!(belief.apply(&warm_owned, "t", 4).is_err());
        assert!(belief.apply(&assignment(&[9], &[]), "t", 4).is_err());
    }
}
