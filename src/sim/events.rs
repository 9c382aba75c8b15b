//! What happens in a simulated cluster, as events on its queue, and the constants every
//! part of the simulation shares.

use super::lease::KeeperAsk;
use super::schedule::Action;
use crate::coordinator::machine::io::{Input, Micros, RequestId, StoreRequest, StreamId};
use crate::proto::v1::AssignmentCommand;
use crate::store::{SessionId, StoreError};

/// The wall clock the instances see at virtual time 0 (µs since the Unix epoch): epochs
/// are built from it, so it is a plausible present.
pub(super) const BASE: Micros = 1_760_000_000_000_000;

/// The topic's name when there is one.
pub(super) const TOPIC: &str = "events";

/// The topics of a run ([`SimConfig::topics`](super::SimConfig::topics) of
/// [`SimConfig::partitions`](super::SimConfig::partitions) each), and the numbering the
/// checks use: partition `p` of topic `t` is `t × partitions + p` (its *global* number).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Topics {
    /// How many.
    pub count: u32,
    /// Partitions of each.
    pub partitions: u32,
}

impl Topics {
    /// Topic `t`'s name: `events` when there is one, else `t{t}`.
    pub fn name(&self, t: u32) -> String {
        if self.count == 1 { TOPIC.to_string() } else { format!("t{t}") }
    }

    /// The number of the topic named `name`, if it is one of the run's.
    pub fn index(&self, name: &str) -> Option<u32> {
        let t = if self.count == 1 {
            (name == TOPIC).then_some(0)?
        } else {
            name.strip_prefix('t')?.parse::<u32>().ok()?
        };
        (t < self.count).then_some(t)
    }

    /// Consumer `c`'s topic: consumers are dealt to the topics in turn.
    pub fn of_consumer(&self, c: usize) -> u32 {
        (c % self.count as usize) as u32
    }

    /// The global number of partition `p` of topic `t`.
    pub fn global(&self, t: u32, p: u32) -> u32 {
        t * self.partitions + p
    }

    /// Every partition of every topic.
    pub fn total(&self) -> u32 {
        self.count * self.partitions
    }

    /// The topic and partition of global number `g`.
    pub fn split(&self, g: u32) -> (u32, u32) {
        (g / self.partitions, g % self.partitions)
    }
}

/// The key prefix.
pub(super) const PREFIX: &str = "/sim/";

/// What a command asks of the consumer next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Todo {
    /// Warm the partition, then call `PartitionReady`.
    Ready(u32),
    /// Stop processing the partition, then call `PartitionReleased`.
    Release(u32),
}

/// Something that happens at a virtual time.
#[derive(Clone, Debug)]
pub(crate) enum Ev {
    /// A scheduled action.
    Act(Action),
    /// The faults stop; every consumer comes back.
    Quiet,
    /// An input reaches an instance (of generation `life`: a restarted one ignores the old).
    Input { node: usize, life: u32, input: Input },
    /// An instance's `WakeAt`.
    Timer { node: usize, life: u32, at: Micros },
    /// A store request reaches the store.
    Arrive { node: usize, life: u32, request: RequestId, op: StoreRequest },
    /// A watch's pending revisions reach its instance.
    Pump { node: usize, life: u32, watch: RequestId },
    /// A quiet watch's progress mark is due.
    Progress { node: usize, life: u32 },
    /// Sessions may have expired.
    StoreTick,
    /// A lease keeper's wake.
    KeeperWake { node: usize, life: u32, at: u64 },
    /// A keeper's request reaches the store.
    KeeperArrive { node: usize, life: u32, token: u64, ask: KeeperAsk },
    /// The store's answer reaches a keeper.
    KeeperAnswer { node: usize, life: u32, token: u64, answer: Result<Option<SessionId>, StoreError> },
    /// A command reaches a consumer.
    Told { consumer: usize, node: usize, stream: StreamId, command: AssignmentCommand },
    /// A consumer's stream ended (`clean`: drained, without an error).
    Ended { consumer: usize, node: usize, stream: StreamId, clean: bool },
    /// A call's answer reaches its consumer.
    Replied { consumer: usize, node: usize, stream: StreamId, call: CallKind, ok: Result<bool, ()> },
    /// A consumer registers (a new incarnation when `restart`).
    Register { consumer: usize, restart: bool },
    /// A consumer acts on a warm or a release.
    Answer { consumer: usize, node: usize, stream: StreamId, todo: Todo },
    /// The store's outage ends.
    OutageEnd,
    /// A paused consumer's pause ends: what waited in its inbox is handled.
    Resume { consumer: usize },
    /// A scenario looks whether its phase settled (`scenario.rs`).
    ScenarioTick,
}

/// An event on the queue, ordered by (time, sequence number) alone: the order it was
/// queued in breaks ties, so the run does not depend on anything else.
pub(crate) struct Queued {
    /// When it happens (virtual µs).
    pub at: u64,
    /// Its place among the events of the same time.
    pub seq: u64,
    /// Boxed: the heap moves entries as it sifts, and an event is large.
    pub event: Box<Ev>,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Queued {}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Queued {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// What a consumer called, so its answer finds its way back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum CallKind {
    /// `Register` of the stream.
    Register,
    /// `PartitionReady` / `PartitionReleased`.
    Answer(Todo),
    /// `Deregister`, draining or not.
    Deregister(bool),
}

/// A number per kind of event, for the trace hash.
pub(super) fn tag(event: &Ev) -> u64 {
    match event {
        Ev::Act(_) => 1,
        Ev::Quiet => 2,
        Ev::Input { node, .. } => 3 + 100 * *node as u64,
        Ev::Timer { node, .. } => 4 + 100 * *node as u64,
        Ev::Arrive { node, request, .. } => 5 + 100 * *node as u64 + 10_000 * request,
        Ev::Pump { node, .. } => 6 + 100 * *node as u64,
        Ev::Progress { node, .. } => 7 + 100 * *node as u64,
        Ev::StoreTick => 8,
        Ev::KeeperWake { node, .. } => 9 + 100 * *node as u64,
        Ev::KeeperArrive { node, .. } => 10 + 100 * *node as u64,
        Ev::KeeperAnswer { node, .. } => 11 + 100 * *node as u64,
        Ev::Told { consumer, .. } => 12 + 100 * *consumer as u64,
        Ev::Ended { consumer, .. } => 13 + 100 * *consumer as u64,
        Ev::Replied { consumer, .. } => 14 + 100 * *consumer as u64,
        Ev::Register { consumer, .. } => 15 + 100 * *consumer as u64,
        Ev::Answer { consumer, .. } => 16 + 100 * *consumer as u64,
        Ev::OutageEnd => 17,
        Ev::Resume { consumer } => 18 + 100 * *consumer as u64,
        Ev::ScenarioTick => 19,
    }
}
