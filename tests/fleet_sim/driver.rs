//! One run: the instances over one store, the consumers, and the loop that delivers every
//! command, answer and store revision, checking the invariants as it goes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kafka_assigner::coordinator::fleet_backend::FleetKeys;
use kafka_assigner::coordinator::{CommandStream, CoordinatorError, FleetConfig, FleetCoordinator};
use kafka_assigner::metrics::Metrics;
use kafka_assigner::proto::v1::DeregisterAction;
use kafka_assigner::store::{FaultyStore, MemoryStore, WatchBatch};

use crate::invariants::{Belief, Truth};
use crate::schedule::{Action, SALT, Shape};
use crate::sim_support::run::{self, Driven, Item};
use crate::sim_support::world::{self, Backend, World};

pub const TOPIC: &str = "events";
pub const PREFIX: &str = "/fsim/";

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

/// The fleet backend's own state of an instance: its latest lossy spell and delay (a
/// later one outlives an earlier one's end).
#[derive(Default)]
pub struct Ext {
    /// The latest lossy spell's token.
    pub lossy: u64,
    /// The latest delay's token.
    pub delayed: u64,
}

/// Where a consumer stands (`leaving`: it deregistered).
pub type Phase = world::Phase<Belief>;

/// What [`World`] needs of this simulation.
pub struct Fleet;

impl Backend for Fleet {
    type Coordinator = FleetCoordinator;
    type Belief = Belief;
    type Ext = Ext;
    type Reply = Reply;
    type Agenda = Agenda;
    type Action = Action;
    const SALT: u64 = SALT;
    const LOG_LEN: usize = 300;

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
    fn started(instance: usize, result: Result<FleetCoordinator, CoordinatorError>) -> Reply {
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
    fn stream_dropped(_: &mut Ext) {}
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
    /// New ownerships whose epoch was checked to be above every earlier one.
    pub epoch_checks: u64,
    /// A digest of the whole log (replays compare it).
    pub digest: u64,
}

impl Outcome {
    /// Adds another run's measures to these (the longest times are kept).
    pub fn add(&mut self, o: &Outcome) {
        self.commands += o.commands;
        self.streams += o.streams;
        self.stopped += o.stopped;
        self.fenced += o.fenced;
        self.max_fence_ttl = self.max_fence_ttl.max(o.max_fence_ttl);
        self.settled_after = self.settled_after.max(o.settled_after);
        self.lost_answers += o.lost_answers;
        self.epoch_checks += o.epoch_checks;
    }
}

/// One run: the shared world and what the fleet backend's checks keep.
pub struct Sim {
    /// Instances, consumers, streams, agenda and log (shared with `coordinator_sim`).
    pub world: World<Fleet>,
    pub shape: Shape,
    pub keys: FleetKeys,
    pub truth: Truth,
    pub outcome: Outcome,
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
    /// Sets up the store, the instances and the agenda of schedule `seed`.
    pub async fn new(seed: u64, trace: bool) -> Result<Sim, String> {
        let shape = Shape::draw(seed);
        let store = MemoryStore::new();
        let mut world = World::new(seed, TOPIC, &store, PREFIX, shape.pool, trace).await?;
        for i in 0..shape.instances {
            let faulty = world.wrapper(&store, i);
            let coordinator = start(&faulty, &shape, i).await.map_err(|e| e.to_string())?;
            world.add_instance(faulty, coordinator, Ext::default());
        }
        world.schedule(shape.actions.clone(), shape.active);
        Ok(Sim {
            world,
            keys: FleetKeys::new(PREFIX),
            truth: Truth::default(),
            outcome: Outcome::default(),
            shape,
        })
    }

    /// Runs the schedule to its end; `Err` names the broken invariant.
    pub async fn run(&mut self) -> Result<(), String> {
        run::run(self).await?;
        self.outcome.lost_answers = self.world.instances.iter().map(|i| i.faulty.stats().lost_answers).sum();
        self.outcome.digest = self.world.digest;
        self.outcome.epoch_checks = self.truth.epoch_checks;
        Ok(())
    }

    /// (a′) Every believed partition is backed by the believer's lease in the store, at the
    /// end of every instant. No lag needs allowing: a gain is relayed only once its lease
    /// is in the store, and a lease goes only after its believer was told (a give-back, a
    /// leave) or fenced (its session expired; the fence comes first, docs/design.md §6).
    fn check_backing(&self) -> Result<(), String> {
        for (name, belief) in self.world.beliefs() {
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
}

impl Driven for Sim {
    type K = Fleet;

    fn world(&mut self) -> &mut World<Fleet> {
        &mut self.world
    }

    fn on_truth(&mut self, batch: WatchBatch) -> Result<(), String> {
        if let Some(line) = self.truth.apply(&self.keys, TOPIC, &batch)? {
            self.world.note(line);
        }
        Ok(())
    }

    fn on_reply(&mut self, reply: Reply) {
        self.reply(reply);
    }

    fn on_item(&mut self, inc: u64, c: usize, item: Item) -> Result<(), String> {
        self.item(inc, c, item)
    }

    fn on_zombie(&mut self, inc: u64, c: usize, item: Item) {
        self.world.zombie_item(inc, c, item);
    }

    async fn act(&mut self, what: Agenda) -> Result<(), String> {
        self.act(what).await
    }

    fn end_of_instant(&mut self) -> Result<(), String> {
        self.check_backing()
    }
}
