//! One run: the instances over one store, the consumers, and the loop that delivers every
//! command, answer and store revision, checking the invariants as it goes.

use std::collections::{BTreeMap, VecDeque};
use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kafka_assigner::coordinator::fleet_backend::FleetKeys;
use kafka_assigner::coordinator::{CommandStream, CoordinatorError, FleetConfig, FleetCoordinator};
use kafka_assigner::metrics::Metrics;
use kafka_assigner::proto::v1::{AssignmentCommand, DeregisterAction};
use kafka_assigner::store::{FaultyStore, LeaseStore, MemoryStore, WatchBatch, WatchStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::invariants::{Belief, Truth};
use crate::schedule::{Action, Rng, Shape};

pub const TOPIC: &str = "events";
pub const PREFIX: &str = "/fsim/";
/// Scheduler rounds let pass before the loop looks whether the instant is over.
const SETTLE_ROUNDS: usize = 24;
/// Lines the failure report shows.
const LOG_LEN: usize = 300;

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
    Started {
        instance: usize,
        result: Result<FleetCoordinator, CoordinatorError>,
    },
}

/// Something the loop does at a given instant.
pub enum Agenda {
    Act(Action),
    Reconnect {
        consumer: usize,
    },
    Deregister {
        consumer: usize,
        inc: u64,
    },
    /// Ends the lossy spell (or the delay) numbered `token` of an instance, if still in force.
    EndLossy {
        instance: usize,
        token: u64,
    },
    EndDelay {
        instance: usize,
        token: u64,
    },
    /// Ends the cut-off or stall `cut`.
    Restore {
        instance: usize,
        cut: u64,
    },
    /// A TTL into cut-off `cut`: the instance must hold no stream any more.
    FenceDeadline {
        instance: usize,
        cut: u64,
    },
    Restart {
        instance: usize,
    },
    Quiesce,
    CheckSettled,
}

pub struct Instance {
    pub faulty: FaultyStore,
    pub coordinator: Option<FleetCoordinator>,
    pub starting: bool,
    /// The cut-off or stall in force: (id, since).
    pub cut: Option<(u64, Instant)>,
    /// Counts crashes: an answer from an earlier generation never reached its client.
    pub generation: u64,
    /// The latest lossy spell and delay (a later one outlives an earlier one's end).
    pub lossy: u64,
    pub delayed: u64,
}

pub enum Phase {
    Offline,
    Registering,
    Online { inc: u64, instance: usize, belief: Belief, leaving: bool },
}

pub struct Consumer {
    pub name: String,
    /// Whether it wants to be online (false once it left or crashed for good).
    pub want: bool,
    pub phase: Phase,
    /// The registration attempt in flight: the instance in the high half.
    pub attempt: u64,
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub commands: u64,
    pub streams: u64,
    /// Partitions a consumer was told to stop while its stream stayed open (give-backs).
    pub stopped: u64,
    /// Streams an instance ended while cut off, and the latest such end in TTLs.
    pub fenced: u64,
    pub max_fence_ttl: f64,
    pub settled_after: Duration,
    pub lost_answers: u64,
    /// A digest of the whole log (replays compare it).
    pub digest: u64,
}

pub struct Sim {
    pub seed: u64,
    pub shape: Shape,
    pub keys: FleetKeys,
    pub instances: Vec<Instance>,
    pub consumers: Vec<Consumer>,
    /// Open streams by incarnation, polled in this order; half-open ones (read, ignored).
    pub open: Vec<(u64, usize, CommandStream)>,
    pub zombies: Vec<(u64, usize, CommandStream)>,
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
    pub trace: bool,
    pub outcome: Outcome,
}

enum Woke {
    Truth(Option<Result<WatchBatch, String>>),
    Reply(Reply),
    Item(u64, usize, Option<Result<AssignmentCommand, CoordinatorError>>),
    Zombie(u64, usize, Option<Result<AssignmentCommand, CoordinatorError>>),
    Agenda,
}

/// Starts instance `i` over its fault wrapper.
pub async fn start(
    faulty: &FaultyStore,
    shape: &Shape,
    i: usize,
) -> Result<FleetCoordinator, CoordinatorError> {
    let config = FleetConfig {
        instance_id: format!("i{i}"),
        backend: "fleet-memory".into(),
        prefix: PREFIX.into(),
        lease_ttl: shape.ttl,
        topic_partitions: [(TOPIC.to_string(), shape.partitions)].into(),
        claim_interval: shape.claim_interval,
        resync_interval: shape.ttl * 4,
        ..FleetConfig::default()
    };
    FleetCoordinator::start(Arc::new(faulty.clone()), config, Arc::new(Metrics::new())).await
}

impl Sim {
    pub async fn new(seed: u64, trace: bool) -> Result<Sim, String> {
        let shape = Shape::draw(seed);
        let store = MemoryStore::new();
        let snapshot = store.get_prefix(PREFIX).await.map_err(|e| e.to_string())?;
        let god = store.watch_prefix(PREFIX, snapshot.revision + 1).await.map_err(|e| e.to_string())?;
        let (replies_tx, replies) = mpsc::unbounded_channel();
        let consumers = (0..shape.pool)
            .map(|i| Consumer { name: format!("c{i}"), want: false, phase: Phase::Offline, attempt: 0 })
            .collect();
        let mut sim = Sim {
            seed,
            keys: FleetKeys::new(PREFIX),
            instances: Vec::new(),
            consumers,
            open: Vec::new(),
            zombies: Vec::new(),
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
            trace,
            outcome: Outcome::default(),
            shape,
        };
        for i in 0..sim.shape.instances {
            let faulty =
                FaultyStore::new(Arc::new(store.clone()), seed.wrapping_mul(31).wrapping_add(i as u64));
            let coordinator = start(&faulty, &sim.shape, i).await.map_err(|e| e.to_string())?;
            sim.instances.push(Instance {
                faulty,
                coordinator: Some(coordinator),
                starting: false,
                cut: None,
                generation: 0,
                lossy: 0,
                delayed: 0,
            });
        }
        for (at, action) in sim.shape.actions.clone() {
            sim.at(sim.start + at, Agenda::Act(action));
        }
        sim.at(sim.start + sim.shape.active, Agenda::Quiesce);
        Ok(sim)
    }

    pub fn at(&mut self, when: Instant, what: Agenda) {
        self.seq += 1;
        self.agenda.insert((when, self.seq), what);
    }

    pub fn after(&mut self, after: Duration, what: Agenda) {
        self.at(Instant::now() + after, what);
    }

    /// A draw keyed by this run's seed and `tag`.
    pub fn draw(&self, tag: &[u64]) -> Rng {
        Rng::keyed(self.seed, tag)
    }

    pub fn note(&mut self, line: String) {
        let line = format!("[{:>6} ms] {line}", (Instant::now() - self.start).as_millis());
        // FNV-1a over every line: two replays of a seed compare their digests.
        for byte in line.bytes().chain([b'\n']) {
            self.outcome.digest = (self.outcome.digest ^ u64::from(byte)).wrapping_mul(0x100_0000_01B3);
        }
        if self.trace {
            eprintln!("{line}");
        }
        if self.log.len() == LOG_LEN {
            self.log.pop_front();
        }
        self.log.push_back(line);
    }

    /// Runs the schedule to its end; `Err` names the broken invariant.
    pub async fn run(&mut self) -> Result<(), String> {
        self.outcome.digest = 0xCBF2_9CE4_8422_2325;
        while !self.done {
            let next = self.agenda.first_key_value().map(|((t, _), _)| *t);
            let next = next.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            let woke = tokio::select! {
                biased;
                batch = self.god.next() => Woke::Truth(batch.map(|b| b.map_err(|e| e.to_string()))),
                Some(reply) = self.replies.recv() => Woke::Reply(reply),
                (inc, c, item) = poll_fn(|cx| poll_streams(&mut self.open, cx)) => Woke::Item(inc, c, item),
                (inc, c, item) = poll_fn(|cx| poll_streams(&mut self.zombies, cx)) => Woke::Zombie(inc, c, item),
                () = tokio::time::sleep_until(next) => Woke::Agenda,
            };
            self.handle(woke).await?;
            self.settle().await?;
            self.check_backing()?;
        }
        self.outcome.lost_answers = self.instances.iter().map(|i| i.faulty.stats().lost_answers).sum();
        Ok(())
    }

    async fn handle(&mut self, woke: Woke) -> Result<(), String> {
        match woke {
            Woke::Truth(Some(Ok(batch))) => {
                if let Some(line) = self.truth.apply(&self.keys, TOPIC, &batch)? {
                    self.note(line);
                }
            }
            Woke::Truth(other) => {
                return Err(format!("the fault-free watch ended: {:?}", other.map(|r| r.err())));
            }
            Woke::Reply(reply) => self.reply(reply),
            Woke::Item(inc, c, item) => self.item(inc, c, item)?,
            Woke::Zombie(inc, c, item) => self.zombie_item(inc, c, item),
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
    /// nothing more comes: then the instant is over.
    async fn settle(&mut self) -> Result<(), String> {
        loop {
            for _ in 0..SETTLE_ROUNDS {
                tokio::task::yield_now().await;
            }
            let mut any = false;
            while let Some(batch) = self.god.next().now_or_never() {
                any = true;
                self.handle(Woke::Truth(batch.map(|b| b.map_err(|e| e.to_string())))).await?;
            }
            while let Ok(reply) = self.replies.try_recv() {
                any = true;
                self.reply(reply);
            }
            while let Some((inc, c, item)) = poll_fn(|cx| poll_streams(&mut self.open, cx)).now_or_never() {
                any = true;
                self.item(inc, c, item)?;
            }
            while let Some((inc, c, item)) = poll_fn(|cx| poll_streams(&mut self.zombies, cx)).now_or_never()
            {
                any = true;
                self.zombie_item(inc, c, item);
            }
            if !any {
                return Ok(());
            }
        }
    }

    /// (a′) Every believed partition is backed by the believer's lease in the store, at the
    /// end of every instant. No lag needs allowing: a gain is relayed only once its lease
    /// is in the store, and a lease goes only after its believer was told (a give-back, a
    /// leave) or fenced (its session expired; the fence comes first, docs/design.md §6).
    fn check_backing(&self) -> Result<(), String> {
        for (name, belief) in self.beliefs() {
            for p in &belief.owned {
                let lease = self.truth.leases.get(p);
                ensure!(
                    lease.is_some_and(|owner| owner == name),
                    "{name} believes it owns {p}, whose lease is {lease:?} (store r{})",
                    self.truth.revision
                );
            }
        }
        Ok(())
    }

    /// The beliefs of the consumers whose stream is open (half-open ones are dead).
    pub fn beliefs(&self) -> impl Iterator<Item = (&str, &Belief)> {
        self.consumers.iter().filter_map(|c| match &c.phase {
            Phase::Online { belief, .. } => Some((c.name.as_str(), belief)),
            _ => None,
        })
    }

    /// A running instance: `i` (modulo the fleet) if it runs, else the next one that does.
    pub fn running(&self, i: usize) -> Option<usize> {
        let n = self.instances.len();
        (0..n).map(|k| (i + k) % n).find(|k| self.instances[*k].coordinator.is_some())
    }
}

/// Polls the streams in order; the first with an item wins.
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
