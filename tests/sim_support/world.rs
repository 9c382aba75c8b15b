//! The state both simulations keep the same way: the instances over their fault wrappers,
//! the consumers and where they stand, their open and half-open streams, the agenda of
//! timed steps, the channel spawned calls answer on, the fault-free watch, and the log.
//! What differs by backend (the coordinator type, what a stream tells, the agenda's own
//! steps) comes in through [`Backend`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use kafka_assigner::coordinator::{CommandStream, ConsumerGroupCoordinator, CoordinatorError};
use kafka_assigner::proto::v1::DeregisterAction;
use kafka_assigner::store::{FaultyStore, LeaseStore, MemoryStore, WatchStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::draws::Rng;

/// What a backend's simulation plugs into the shared [`World`].
pub trait Backend: Sized + 'static {
    /// The coordinator an instance runs.
    type Coordinator: ConsumerGroupCoordinator + Clone;
    /// What one stream told its consumer.
    type Belief: Default;
    /// The backend's own per-instance state.
    type Ext;
    /// What a spawned call reports back to the loop.
    type Reply: Send + 'static;
    /// A step on the agenda.
    type Agenda;
    /// A timed action of the schedule.
    type Action;
    /// The salt of this simulation's seeds ([`Rng::new`]).
    const SALT: u64;
    /// How many lines the failure report shows.
    const LOG_LEN: usize;
    /// The answer to a `Register` call.
    fn registered(
        consumer: usize,
        attempt: u64,
        generation: u64,
        result: Result<CommandStream, CoordinatorError>,
    ) -> Self::Reply;
    /// The answer to a `Deregister` call.
    fn deregistered(
        consumer: usize,
        inc: u64,
        result: Result<DeregisterAction, CoordinatorError>,
    ) -> Self::Reply;
    /// An instance (re)started, or could not.
    fn started(instance: usize, result: Result<Self::Coordinator, CoordinatorError>) -> Self::Reply;
    /// The schedule's action, on the agenda.
    fn act(action: Self::Action) -> Self::Agenda;
    /// The consumer registers again.
    fn reconnect(consumer: usize) -> Self::Agenda;
    /// The consumer calls `Deregister` again after a failure.
    fn deregister_again(consumer: usize, inc: u64) -> Self::Agenda;
    /// The instance starts again.
    fn restart(instance: usize) -> Self::Agenda;
    /// The cut-off `cut` of the instance ends.
    fn restore(instance: usize, cut: u64) -> Self::Agenda;
    /// A TTL into cut-off `cut`: the instance must hold no stream any more.
    fn fence_deadline(instance: usize, cut: u64) -> Self::Agenda;
    /// The faults stop.
    fn quiesce() -> Self::Agenda;
    /// The partitions a belief says its consumer owns.
    fn owned(belief: &Self::Belief) -> &BTreeSet<u32>;
    /// A stream of a consumer of this instance ended (the handoff backend notes when).
    fn stream_dropped(ext: &mut Self::Ext);
}

/// One assigner instance: its fault wrapper and, while it runs, its coordinator.
pub struct Instance<C, X> {
    /// Its own fault wrapper over the shared store.
    pub faulty: FaultyStore,
    /// The coordinator, while the process runs.
    pub coordinator: Option<C>,
    /// Whether a restart is under way.
    pub starting: bool,
    /// The cut-off (or stall) in force: (id, since).
    pub cut: Option<(u64, Instant)>,
    /// Counts crashes: an answer from an earlier generation never reached its client.
    pub generation: u64,
    /// The backend's own state of it.
    pub ext: X,
}

/// Where a consumer stands.
pub enum Phase<B> {
    /// No stream, no registration under way.
    Offline,
    /// A `Register` call is under way.
    Registering,
    /// Stream `inc` through `instance` is open; `leaving` once it deregistered (draining).
    Online { inc: u64, instance: usize, belief: B, leaving: bool },
}

/// One consumer process.
pub struct Consumer<B> {
    /// Its name, `c0`, `c1`, …
    pub name: String,
    /// Whether it wants to be online (false once it left or crashed for good).
    pub want: bool,
    /// Where it stands.
    pub phase: Phase<B>,
    /// The registration attempt in flight: the instance in the high half.
    pub attempt: u64,
}

/// An open stream: (incarnation, consumer, stream).
pub type Open = (u64, usize, CommandStream);

/// Everything of a run but the backend's own bookkeeping.
pub struct World<K: Backend> {
    /// The run's seed.
    pub seed: u64,
    /// The one topic of the run.
    pub topic: &'static str,
    /// The instances, by index.
    pub instances: Vec<Instance<K::Coordinator, K::Ext>>,
    /// The consumers, by index.
    pub consumers: Vec<Consumer<K::Belief>>,
    /// Open streams by incarnation, polled in this order.
    pub open: Vec<Open>,
    /// Half-open streams: their consumer moved on; read (and ignored) until they end.
    pub zombies: Vec<Open>,
    /// The last incarnation handed out.
    pub next_inc: u64,
    /// Timed steps, in order (ties in the order they were put).
    pub agenda: BTreeMap<(Instant, u64), K::Agenda>,
    /// Counts agenda entries and cut-offs (also a tag of draws).
    pub seq: u64,
    /// Where spawned calls answer.
    pub replies_tx: mpsc::UnboundedSender<K::Reply>,
    pub(super) replies: mpsc::UnboundedReceiver<K::Reply>,
    /// A watch on the shared store that no fault touches.
    pub(super) god: WatchStream,
    /// When the run started (virtual time).
    pub start: Instant,
    /// Whether the faults stopped.
    pub quiescing: bool,
    /// Whether the run is over.
    pub done: bool,
    /// The last steps, for the failure report.
    pub log: VecDeque<String>,
    /// Whether every step is printed as it happens.
    pub trace: bool,
    /// FNV-1a over every line of the log: two replays of a seed compare it.
    pub digest: u64,
}

impl<K: Backend> World<K> {
    /// A world of `pool` offline consumers and no instance yet, watching `prefix` of
    /// `store` from its current revision.
    pub async fn new(
        seed: u64,
        topic: &'static str,
        store: &MemoryStore,
        prefix: &str,
        pool: usize,
        trace: bool,
    ) -> Result<Self, String> {
        let snapshot = store.get_prefix(prefix).await.map_err(|e| e.to_string())?;
        let god = store.watch_prefix(prefix, snapshot.revision + 1).await.map_err(|e| e.to_string())?;
        let (replies_tx, replies) = mpsc::unbounded_channel();
        let consumers = (0..pool)
            .map(|i| Consumer { name: format!("c{i}"), want: false, phase: Phase::Offline, attempt: 0 })
            .collect();
        Ok(World {
            seed,
            topic,
            instances: Vec::new(),
            consumers,
            open: Vec::new(),
            zombies: Vec::new(),
            next_inc: 0,
            agenda: BTreeMap::new(),
            seq: 0,
            replies_tx,
            replies,
            god,
            start: Instant::now(),
            quiescing: false,
            done: false,
            log: VecDeque::new(),
            trace,
            digest: 0xCBF2_9CE4_8422_2325,
        })
    }

    /// Instance `i`'s fault wrapper over `store`, its faults seeded from the run's seed.
    pub fn wrapper(&self, store: &MemoryStore, i: usize) -> FaultyStore {
        FaultyStore::new(Arc::new(store.clone()), self.seed.wrapping_mul(31).wrapping_add(i as u64))
    }

    /// Adds an instance running `coordinator` over `faulty`.
    pub fn add_instance(&mut self, faulty: FaultyStore, coordinator: K::Coordinator, ext: K::Ext) {
        let instance = Instance {
            faulty,
            coordinator: Some(coordinator),
            starting: false,
            cut: None,
            generation: 0,
            ext,
        };
        self.instances.push(instance);
    }

    /// Puts the schedule's `actions` on the agenda, and the end of the faults at `active`.
    pub fn schedule(&mut self, actions: Vec<(Duration, K::Action)>, active: Duration) {
        for (at, action) in actions {
            self.at(self.start + at, K::act(action));
        }
        self.at(self.start + active, K::quiesce());
    }

    /// Puts `what` on the agenda at `when`.
    pub fn at(&mut self, when: Instant, what: K::Agenda) {
        self.seq += 1;
        self.agenda.insert((when, self.seq), what);
    }

    /// Puts `what` on the agenda `after` from now.
    pub fn after(&mut self, after: Duration, what: K::Agenda) {
        self.at(Instant::now() + after, what);
    }

    /// The next step due at `now`, taken off the agenda.
    pub fn due(&mut self, now: Instant) -> Option<K::Agenda> {
        let entry = self.agenda.first_entry()?;
        (entry.key().0 <= now).then(|| entry.remove())
    }

    /// A draw keyed by this run's seed and `tag`.
    pub fn draw(&self, tag: &[u64]) -> Rng {
        Rng::keyed(self.seed, K::SALT, tag)
    }

    /// Logs `line`, stamped with the run's virtual time.
    pub fn note(&mut self, line: String) {
        let line = format!("[{:>6} ms] {line}", (Instant::now() - self.start).as_millis());
        for byte in line.bytes().chain([b'\n']) {
            self.digest = (self.digest ^ u64::from(byte)).wrapping_mul(0x100_0000_01B3);
        }
        if self.trace {
            eprintln!("{line}");
        }
        if self.log.len() == K::LOG_LEN {
            self.log.pop_front();
        }
        self.log.push_back(line);
    }

    /// A running instance: `i` (modulo the fleet) if it runs, else the next one that does.
    pub fn running(&self, i: usize) -> Option<usize> {
        let n = self.instances.len();
        (0..n).map(|k| (i + k) % n).find(|k| self.instances[*k].coordinator.is_some())
    }

    /// The beliefs of the consumers whose stream is open (half-open ones are dead).
    pub fn beliefs(&self) -> impl Iterator<Item = (&str, &K::Belief)> + Clone {
        self.consumers.iter().filter_map(|c| match &c.phase {
            Phase::Online { belief, .. } => Some((c.name.as_str(), belief)),
            _ => None,
        })
    }

    /// The consumers online to stay (not leaving), and their beliefs.
    pub fn online(&self) -> BTreeMap<&str, &K::Belief> {
        self.consumers
            .iter()
            .filter_map(|c| match &c.phase {
                Phase::Online { belief, leaving: false, .. } if c.want => Some((c.name.as_str(), belief)),
                _ => None,
            })
            .collect()
    }
}
