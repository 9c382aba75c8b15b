//! One run: the fleet over one store, the consumers, the main loop that delivers every
//! command and answer, and the invariant checks after every instant.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kafka_assigner::coordinator::{CommandStream, CoordinatorError, HandoffCoordinator, records::Keys};
use kafka_assigner::proto::v1::DeregisterAction;
use kafka_assigner::store::{MemoryStore, Revision, WatchBatch};
use tokio::time::Instant;

use crate::invariants;
use crate::model::{Belief, Todo, Truth};
use crate::schedules::{Action, Kind, SALT, Shape};
use crate::sim_support::run::{self, Driven, Item};
use crate::sim_support::world::{self, Backend, World};

pub const TOPIC: &str = "events";
pub const PREFIX: &str = "/sim/";

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
    /// Consumer `consumer` gives up on the `Deregister` of stream `inc`, held by a stall
    /// of instance `stalled` (`armed`: its last stall before), and restarts on `instance`.
    GiveUp {
        consumer: usize,
        inc: u64,
        instance: usize,
        stalled: usize,
        armed: Option<u64>,
    },
    /// The instance notices that the half-open stream `inc`'s connection is dead.
    DropZombie {
        inc: u64,
    },
    Quiesce,
    CheckSettled,
}

/// The handoff backend's own state of an instance.
#[derive(Default)]
pub struct Ext {
    /// The id of the last stall of its connection the sim has seen begin.
    pub stall_seen: u64,
    /// When a stream it held last ended (its registration is then deleted a TTL later).
    pub dropped_at: Option<Instant>,
}

/// Where a consumer stands (`leaving`: it deregistered and drains).
pub type Phase = world::Phase<Belief>;

/// What [`World`] needs of this simulation.
pub struct Handoff;

impl Backend for Handoff {
    type Coordinator = HandoffCoordinator;
    type Belief = Belief;
    type Ext = Ext;
    type Reply = Reply;
    type Agenda = Agenda;
    type Action = Action;
    const SALT: u64 = SALT;
    const LOG_LEN: usize = 400;

    fn registered(
        consumer: usize,
        attempt: u64,
        generation: u64,
        result: Result<CommandStream, CoordinatorError>,
    ) -> Reply {
        Reply::Registered { consumer, attempt, generation, result }
    }
    fn deregistered(consumer: usize, inc: u64, result: Result<DeregisterAction, CoordinatorError>) -> Reply {
        Reply::Deregistered { consumer, inc, result }
    }
    fn started(instance: usize, result: Result<HandoffCoordinator, CoordinatorError>) -> Reply {
        Reply::Started { instance, result }
    }
    fn act(action: Action) -> Agenda {
        Agenda::Act(action)
    }
    fn reconnect(consumer: usize) -> Agenda {
        Agenda::Reconnect { consumer }
    }
    fn deregister_again(consumer: usize, inc: u64) -> Agenda {
        Agenda::Deregister { consumer, inc }
    }
    fn restart(instance: usize) -> Agenda {
        Agenda::Restart { instance }
    }
    fn restore(instance: usize, cut: u64) -> Agenda {
        Agenda::Restore { instance, cut }
    }
    fn fence_deadline(instance: usize, cut: u64) -> Agenda {
        Agenda::FenceDeadline { instance, cut }
    }
    fn quiesce() -> Agenda {
        Agenda::Quiesce
    }
    fn owned(belief: &Belief) -> &BTreeSet<u32> {
        &belief.owned
    }
    fn stream_dropped(ext: &mut Ext) {
        ext.dropped_at = Some(Instant::now());
    }
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
    /// Owned partitions a new incarnation of their owner was checked to raise.
    pub incarnation_checks: u64,
    /// Stalls that began, early expiries, restarts with the old stream left open.
    pub stalls: u64,
    pub revokes: u64,
    /// Early expiries of an instance that did not lead.
    pub follower_revokes: u64,
    pub half_open: u64,
    /// Readies held while a burst of joins went on.
    pub ready_races: u64,
    /// Deregisters held while their consumer registered again elsewhere.
    pub deregister_races: u64,
    /// Half-open streams their instance ended as replaced by the new registration.
    pub zombies_replaced: u64,
}

impl Outcome {
    /// Adds another run's measures to these (the longest times are kept).
    pub fn add(&mut self, o: &Outcome) {
        self.commands += o.commands;
        self.streams_opened += o.streams_opened;
        self.fenced += o.fenced;
        self.max_fence_ttl = self.max_fence_ttl.max(o.max_fence_ttl);
        self.settled_after = self.settled_after.max(o.settled_after);
        self.overlaps_in_window += o.overlaps_in_window;
        self.plan_moves += o.plan_moves;
        self.epoch_checks += o.epoch_checks;
        self.incarnation_checks += o.incarnation_checks;
        self.stalls += o.stalls;
        self.revokes += o.revokes;
        self.follower_revokes += o.follower_revokes;
        self.half_open += o.half_open;
        self.zombies_replaced += o.zombies_replaced;
        self.ready_races += o.ready_races;
        self.deregister_races += o.deregister_races;
    }
}

/// One run: the shared world and what the handoff backend's checks keep.
pub struct Sim {
    /// Instances, consumers, streams, agenda and log (shared with `fleet_sim`).
    pub world: World<Handoff>,
    /// Whether the schedules may trigger the bugs this simulation found (fixed; the
    /// default, see `main.rs`); `COORD_SIM_STRICT=0` steers around them.
    pub strict: bool,
    /// Whether the schedules may run into the open bugs this simulation found (see
    /// `main.rs`; `COORD_SIM_OPEN=1`); by default they steer around them.
    pub open_bugs: bool,
    pub shape: Shape,
    pub keys: Keys,
    /// `PartitionReady` calls in flight, by consumer.
    pub readies: Vec<u32>,
    /// Transactions the instances applied, by revision: (instance, keys written).
    writes: BTreeMap<Revision, Vec<(usize, Vec<String>)>>,
    pub truth: Truth,
    pub outcome: Outcome,
}

impl Sim {
    /// Sets up the store, the instances and the agenda of schedule `seed` of `kind`.
    pub async fn new(seed: u64, kind: Kind, strict: bool, trace: bool) -> Result<Sim, String> {
        let shape = Shape::draw(seed, kind);
        let store = MemoryStore::new();
        let mut world = World::new(seed, TOPIC, &store, PREFIX, shape.pool, trace).await?;
        for i in 0..shape.instances {
            let faulty = world.wrapper(&store, i);
            faulty.record_writes(true);
            let coordinator = crate::fleet::start(&faulty, &shape, i).await.map_err(|e| e.to_string())?;
            world.add_instance(faulty, coordinator, Ext::default());
        }
        world.schedule(shape.actions.clone(), shape.active);
        Ok(Sim {
            world,
            strict,
            open_bugs: std::env::var("COORD_SIM_OPEN").is_ok_and(|v| v == "1"),
            keys: Keys::new(PREFIX),
            readies: vec![0; shape.pool],
            writes: BTreeMap::new(),
            truth: Truth::default(),
            outcome: Outcome::default(),
            shape,
        })
    }

    /// Runs the schedule to its end; `Err` names the broken invariant.
    pub async fn run(&mut self) -> Result<(), String> {
        run::run(self).await
    }

    /// Which instances wrote what at `revision` (from their fault wrappers' logs).
    fn writers(&mut self, revision: Revision) -> Vec<(usize, Vec<String>)> {
        for (i, instance) in self.world.instances.iter().enumerate() {
            for written in instance.faulty.take_writes() {
                self.writes.entry(written.revision).or_default().push((i, written.keys));
            }
        }
        let later = self.writes.split_off(&(revision + 1));
        let at = std::mem::replace(&mut self.writes, later).remove(&revision);
        at.unwrap_or_default()
    }
}

impl Driven for Sim {
    type K = Handoff;

    fn world(&mut self) -> &mut World<Handoff> {
        &mut self.world
    }

    fn on_truth(&mut self, batch: WatchBatch) -> Result<(), String> {
        let writers = self.writers(batch.revision);
        self.truth.apply(&self.keys, &batch, self.strict, &writers)?;
        self.outcome.plan_moves = self.truth.plan_moves;
        self.outcome.epoch_checks = self.truth.epoch_checks;
        self.outcome.incarnation_checks = self.truth.incarnation_checks;
        Ok(())
    }

    fn on_reply(&mut self, reply: Reply) {
        self.reply(reply);
    }

    fn on_item(&mut self, inc: u64, c: usize, item: Item) -> Result<(), String> {
        self.item(inc, c, item)
    }

    fn on_zombie(&mut self, inc: u64, c: usize, item: Item) {
        if self.world.zombie_item(inc, c, item) {
            self.outcome.zombies_replaced += 1;
        }
    }

    async fn act(&mut self, what: Agenda) -> Result<(), String> {
        self.act(what).await
    }

    /// After every instant: the stalls that began are noted, and no two consumers believe
    /// they own a partition outside a handoff's release window.
    fn end_of_instant(&mut self) -> Result<(), String> {
        self.observe_stalls();
        self.outcome.overlaps_in_window +=
            invariants::exclusive(&self.truth, self.shape.partitions, self.world.beliefs())?;
        Ok(())
    }
}
