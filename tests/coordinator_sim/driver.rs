//! One run: the fleet over one store, the consumers, the main loop that delivers every
//! command and answer, and the invariant checks after every instant.

use std::collections::{BTreeMap, VecDeque};
use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kafka_assigner::coordinator::{CommandStream, CoordinatorError, HandoffCoordinator, records::Keys};
use kafka_assigner::proto::v1::{AssignmentCommand, DeregisterAction};
use kafka_assigner::server::status::code_of;
use kafka_assigner::store::{FaultyStore, LeaseStore, MemoryStore, Revision, WatchStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::Code;

use crate::invariants;
use crate::model::{Belief, Todo, Truth};
use crate::schedules::{Action, Kind, Rng, Shape};

pub const TOPIC: &str = "events";
pub const PREFIX: &str = "/sim/";
/// Scheduler rounds the checker lets pass before it looks: every task woken at this
/// instant (a watch batch crosses a few tasks before a relay sends) has run by then.
const SETTLE_ROUNDS: usize = 24;
/// How many lines the failure report shows.
const LOG_LEN: usize = 400;

/// What a spawned call reports back to the loop.
pub enum Reply {
    Registered {
        consumer: usize,
        attempt: u64,
        generation: u64,
        result: Result<CommandStream, CoordinatorError>,
    },
    Deregistered {
        consumer: usize,
        inc: u64,
        result: Result<DeregisterAction, CoordinatorError>,
    },
    /// A `PartitionReady` (`ready`) or `PartitionReleased` answer: the log line, and
    /// whether the consumer should try again (the store was out of reach).
    Called {
        consumer: usize,
        inc: u64,
        ready: bool,
        partition: u32,
        line: String,
        retry: bool,
    },
    Started {
        instance: usize,
        result: Result<HandoffCoordinator, CoordinatorError>,
    },
}

/// Something the loop does at a given instant.
pub enum Agenda {
    Act(Action),
    Reconnect {
        consumer: usize,
    },
    /// A consumer whose `Deregister` failed tries again.
    Deregister {
        consumer: usize,
        inc: u64,
    },
    Answer {
        consumer: usize,
        inc: u64,
        todo: Todo,
        instance: usize,
    },
    /// A consumer calls `PartitionReady` / `PartitionReleased` again after a failure.
    Call {
        consumer: usize,
        inc: u64,
        ready: bool,
        partition: u32,
    },
    StopLosing {
        instance: usize,
    },
    StopDelaying {
        instance: usize,
    },
    Restore {
        instance: usize,
        cut: u64,
    },
    Expire {
        instance: usize,
        cut: u64,
    },
    FenceDeadline {
        instance: usize,
        cut: u64,
    },
    Restart {
        instance: usize,
    },
    /// A stall the sim treats as a cut-off (`cut`) is over.
    Unstalled {
        instance: usize,
        cut: u64,
    },
    /// The instance notices that the half-open stream `inc`'s connection is dead.
    DropZombie {
        inc: u64,
    },
    Quiesce,
    CheckSettled,
}

/// One assigner instance: its fault wrapper and, while it runs, its coordinator.
pub struct Instance {
    pub faulty: FaultyStore,
    pub coordinator: Option<HandoffCoordinator>,
    pub starting: bool,
    /// The cut-off (or stall) in force: (id, since).
    pub cut: Option<(u64, Instant)>,
    /// The id of the last stall of its connection the sim has seen begin.
    pub stall_seen: u64,
    /// When a stream it held last ended (its registration is then deleted a TTL later).
    pub dropped_at: Option<Instant>,
    /// Counts crashes: an answer from an earlier generation never reached its client.
    pub generation: u64,
}

/// Where a consumer stands.
pub enum Phase {
    Offline,
    Registering,
    Online { inc: u64, instance: usize, belief: Belief, draining: bool },
}

pub struct Consumer {
    pub name: String,
    /// Whether it wants to be online (false once it crashed for good or left).
    pub want: bool,
    pub phase: Phase,
    /// Counts registration attempts, so a late answer to an abandoned one is recognised.
    pub attempt: u64,
    /// `PartitionReady` calls in flight.
    pub readies: u32,
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub commands: u64,
    pub streams_opened: u64,
    pub fenced: u64,
    /// The longest time from a cut-off to the end of one of that instance's streams, in
    /// TTL fractions (the design says at most 3/4).
    pub max_fence_ttl: f64,
    pub settled_after: Duration,
    /// Instants at which two consumers believed they owned a partition, one of them in a
    /// handoff's release window (allowed; counted so the check is seen not to be vacuous).
    pub overlaps_in_window: u64,
    /// Partition moves by plan, each checked to be the leader's.
    pub plan_moves: u64,
    /// Owner changes whose epochs were checked to grow.
    pub epoch_checks: u64,
    /// Stalls that began, early expiries, restarts with the old stream left open.
    pub stalls: u64,
    pub revokes: u64,
    pub half_open: u64,
    /// Readies held while a burst of joins went on.
    pub ready_races: u64,
    /// Half-open streams their instance ended as replaced by the new registration.
    pub zombies_replaced: u64,
}

pub struct Sim {
    pub seed: u64,
    /// Whether the schedules may trigger the bugs this simulation found (fixed; the
    /// default, see `main.rs`); `COORD_SIM_STRICT=0` steers around them.
    pub strict: bool,
    /// Whether the schedules may run into the open bugs this simulation found (see
    /// `main.rs`; `COORD_SIM_OPEN=1`); by default they steer around them.
    pub open_bugs: bool,
    pub shape: Shape,
    pub keys: Keys,
    pub instances: Vec<Instance>,
    pub consumers: Vec<Consumer>,
    /// Open streams, by incarnation id, polled in this order.
    pub open: Vec<(u64, usize, CommandStream)>,
    /// Half-open streams: their consumer restarted; read (and ignored) until they end.
    pub zombies: Vec<(u64, usize, CommandStream)>,
    /// Transactions the instances applied, by revision: (instance, keys written).
    writes: BTreeMap<Revision, Vec<(usize, Vec<String>)>>,
    pub agenda: BTreeMap<(Instant, u64), Agenda>,
    pub seq: u64,
    pub next_inc: u64,
    pub truth: Truth,
    god: WatchStream,
    pub replies_tx: mpsc::UnboundedSender<Reply>,
    replies: mpsc::UnboundedReceiver<Reply>,
    pub start: Instant,
    pub quiescing: bool,
    pub done: bool,
    pub log: VecDeque<String>,
    pub outcome: Outcome,
}

enum Woke {
    Truth(Option<kafka_assigner::store::WatchBatch>),
    Reply(Reply),
    Item(u64, usize, Option<Result<AssignmentCommand, CoordinatorError>>),
    Zombie(u64, usize, Option<Result<AssignmentCommand, CoordinatorError>>),
    Agenda,
}

impl Sim {
    /// Sets up the store, the instances and the agenda of schedule `seed` of `kind`.
    pub async fn new(seed: u64, kind: Kind, strict: bool) -> Result<Sim, String> {
        let shape = Shape::draw(seed, kind);
        let store = MemoryStore::new();
        let keys = Keys::new(PREFIX);
        let snapshot = store.get_prefix(PREFIX).await.map_err(|e| e.to_string())?;
        let god = store.watch_prefix(PREFIX, snapshot.revision + 1).await.map_err(|e| e.to_string())?;
        let (replies_tx, replies) = mpsc::unbounded_channel();
        let mut sim = Sim {
            seed,
            strict,
            open_bugs: std::env::var("COORD_SIM_OPEN").is_ok_and(|v| v == "1"),
            keys,
            instances: Vec::new(),
            consumers: (0..shape.pool)
                .map(|i| Consumer {
                    name: format!("c{i}"),
                    want: false,
                    phase: Phase::Offline,
                    attempt: 0,
                    readies: 0,
                })
                .collect(),
            open: Vec::new(),
            zombies: Vec::new(),
            writes: BTreeMap::new(),
            agenda: BTreeMap::new(),
            seq: 0,
            next_inc: 0,
            truth: Truth::default(),
            god,
            replies_tx,
            replies,
            start: Instant::now(),
            quiescing: false,
            done: false,
            log: VecDeque::new(),
            outcome: Outcome::default(),
            shape,
        };
        for i in 0..sim.shape.instances {
            let faulty =
                FaultyStore::new(Arc::new(store.clone()), seed.wrapping_mul(31).wrapping_add(i as u64));
            faulty.record_writes(true);
            let coordinator = crate::fleet::start(&faulty, &sim.shape, i).await.map_err(|e| e.to_string())?;
            sim.instances.push(Instance {
                faulty,
                coordinator: Some(coordinator),
                starting: false,
                cut: None,
                stall_seen: 0,
                dropped_at: None,
                generation: 0,
            });
        }
        for (at, action) in sim.shape.actions.clone() {
            sim.at(sim.start + at, Agenda::Act(action));
        }
        sim.at(sim.start + sim.shape.active, Agenda::Quiesce);
        Ok(sim)
    }

    /// Puts `what` on the agenda at `when`.
    pub fn at(&mut self, when: Instant, what: Agenda) {
        self.seq += 1;
        self.agenda.insert((when, self.seq), what);
    }

    /// Puts `what` on the agenda `after` from now.
    pub fn after(&mut self, after: Duration, what: Agenda) {
        self.at(Instant::now() + after, what);
    }

    /// A draw keyed by this run's seed and `tag`.
    pub fn draw(&self, tag: &[u64]) -> Rng {
        Rng::keyed(self.seed, tag)
    }

    pub fn note(&mut self, line: String) {
        let ms = (Instant::now() - self.start).as_millis();
        if self.log.len() == LOG_LEN {
            self.log.pop_front();
        }
        self.log.push_back(format!("[{ms:>6} ms] {line}"));
    }

    /// Runs the schedule to its end; `Err` names the broken invariant.
    pub async fn run(&mut self) -> Result<(), String> {
        while !self.done {
            let next = self.agenda.first_key_value().map(|((t, _), _)| *t);
            let next = next.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            let woke = tokio::select! {
                biased;
                batch = self.god.next() => Woke::Truth(batch.map(|b| b.map_err(|e| e.to_string())).transpose().map_err(|e| format!("the fault-free watch failed: {e}"))?),
                Some(reply) = self.replies.recv() => Woke::Reply(reply),
                (inc, consumer, item) = poll_fn(|cx| poll_streams(&mut self.open, cx)) => Woke::Item(inc, consumer, item),
                (inc, consumer, item) = poll_fn(|cx| poll_streams(&mut self.zombies, cx)) => Woke::Zombie(inc, consumer, item),
                () = tokio::time::sleep_until(next) => Woke::Agenda,
            };
            self.handle(woke).await?;
            self.settle().await?;
            self.observe_stalls();
            let beliefs = self.consumers.iter().filter_map(|c| match &c.phase {
                Phase::Online { belief, .. } => Some((c.name.as_str(), belief)),
                _ => None,
            });
            self.outcome.overlaps_in_window +=
                invariants::exclusive(&self.truth, self.shape.partitions, beliefs)?;
        }
        Ok(())
    }

    async fn handle(&mut self, woke: Woke) -> Result<(), String> {
        match woke {
            Woke::Truth(Some(batch)) => {
                let writers = self.writers(batch.revision);
                self.truth.apply(&self.keys, &batch, self.strict, &writers)?;
                self.outcome.plan_moves = self.truth.plan_moves;
                self.outcome.epoch_checks = self.truth.epoch_checks;
            }
            Woke::Truth(None) => return Err("the fault-free watch ended".into()),
            Woke::Reply(reply) => self.reply(reply),
            Woke::Item(inc, consumer, item) => self.item(inc, consumer, item)?,
            Woke::Zombie(inc, consumer, item) => self.zombie_item(inc, consumer, item),
            Woke::Agenda => {
                let now = Instant::now();
                while let Some(entry) = self.agenda.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    let what = entry.remove();
                    self.act(what).await?;
                }
            }
        }
        Ok(())
    }

    /// Lets every task woken at this instant run, delivering what they produce, until
    /// nothing more comes: then the instant is over and the invariants may be checked.
    async fn settle(&mut self) -> Result<(), String> {
        loop {
            for _ in 0..SETTLE_ROUNDS {
                tokio::task::yield_now().await;
            }
            let mut any = false;
            while let Some(batch) = self.god.next().now_or_never() {
                any = true;
                self.handle(Woke::Truth(batch.transpose().map_err(|e| e.to_string())?)).await?;
            }
            while let Ok(reply) = self.replies.try_recv() {
                any = true;
                self.reply(reply);
            }
            while let Some((inc, consumer, item)) =
                poll_fn(|cx| poll_streams(&mut self.open, cx)).now_or_never()
            {
                any = true;
                self.item(inc, consumer, item)?;
            }
            while let Some((inc, consumer, item)) =
                poll_fn(|cx| poll_streams(&mut self.zombies, cx)).now_or_never()
            {
                any = true;
                self.zombie_item(inc, consumer, item);
            }
            if !any {
                return Ok(());
            }
        }
    }

    /// Which instances wrote what at `revision` (from their fault wrappers' logs).
    fn writers(&mut self, revision: Revision) -> Vec<(usize, Vec<String>)> {
        for (i, instance) in self.instances.iter().enumerate() {
            for written in instance.faulty.take_writes() {
                self.writes.entry(written.revision).or_default().push((i, written.keys));
            }
        }
        let later = self.writes.split_off(&(revision + 1));
        let at = std::mem::replace(&mut self.writes, later).remove(&revision);
        at.unwrap_or_default()
    }

    /// An item of a half-open stream: nobody acts on it; its end is noted.
    fn zombie_item(&mut self, inc: u64, c: usize, item: Option<Result<AssignmentCommand, CoordinatorError>>) {
        let ended = match item {
            Some(Ok(_)) => return,
            Some(Err(error)) => {
                if code_of(&error) == Code::Aborted {
                    self.outcome.zombies_replaced += 1;
                }
                format!("{:?} {error}", code_of(&error))
            }
            None => "cleanly".to_string(),
        };
        self.zombies.retain(|(i, _, _)| *i != inc);
        self.note(format!("{}#{inc} (half-open) ended: {ended}", self.consumers[c].name));
    }

    /// The consumers with an open stream, and their beliefs.
    pub fn online(&self) -> BTreeMap<&str, &Belief> {
        self.consumers
            .iter()
            .filter_map(|c| match &c.phase {
                Phase::Online { belief, draining: false, .. } if c.want => Some((c.name.as_str(), belief)),
                _ => None,
            })
            .collect()
    }
}

/// Polls the open streams in order; the first with an item wins.
#[allow(clippy::type_complexity)]
fn poll_streams(
    open: &mut [(u64, usize, CommandStream)],
    cx: &mut Context<'_>,
) -> Poll<(u64, usize, Option<Result<AssignmentCommand, CoordinatorError>>)> {
    for (inc, consumer, stream) in open.iter_mut() {
        if let Poll::Ready(item) = stream.poll_next_unpin(cx) {
            return Poll::Ready((*inc, *consumer, item));
        }
    }
    Poll::Pending
}
