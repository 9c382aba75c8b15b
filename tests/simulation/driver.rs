//! The driver of the simulation: a [`Sim`] runs one seeded schedule of random events
//! through [`step`], relays the commands to the clients and calls the invariants after
//! every step, then quiesces the fleet; on a failure it reports the last steps.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::ops::RangeInclusive;

use kafka_assigner::handoff::{
    Command, ConsumerStatus, ConsumerView, Cooldowns, Event, HandoffError, Millis, PlanConfig, TopicState,
    diff_views, step,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::Stats;
use crate::model::{Client, Refusal, UNKNOWN};

/// One step of the failure report.
struct LogEntry {
    step: usize,
    now: Millis,
    what: Logged,
    /// Commands delivered after the step, per consumer.
    sent: Vec<(String, Vec<Command>)>,
}

enum Logged {
    Step(Event, Result<usize, HandoffError>),
    Failover,
}

impl std::fmt::Display for LogEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{} t={} ", self.step, self.now)?;
        match &self.what {
            Logged::Step(event, Ok(writes)) => write!(f, "{event:?} -> ok, {writes} writes")?,
            Logged::Step(event, Err(e)) => write!(f, "{event:?} -> refused: {e}")?,
            Logged::Failover => write!(f, "leader failover (cooldowns lost)")?,
        }
        if !self.sent.is_empty() {
            write!(f, "; sent")?;
            for (name, cmds) in &self.sent {
                write!(f, " {name}:{cmds:?}")?;
            }
        }
        Ok(())
    }
}

/// How many steps the failure report shows.
const LOG_LEN: usize = 30;

/// The shape of the schedules of one test.
#[derive(Clone, Debug)]
pub(crate) struct Params {
    pub(crate) partitions: RangeInclusive<u32>,
    pub(crate) pool: RangeInclusive<usize>,
    pub(crate) steps: usize,
}

/// One schedule: the state, the leader's cooldowns, the clock, the clients and the log.
pub(crate) struct Sim {
    seed: u64,
    rng: StdRng,
    pub(crate) names: Vec<String>,
    pub(crate) config: PlanConfig,
    pub(crate) state: TopicState,
    cooldowns: Cooldowns,
    pub(crate) now: Millis,
    pub(crate) clients: BTreeMap<String, Client>,
    pub(crate) ever_joined: BTreeSet<String>,
    /// The last accepted Ready / Released call, for duplicates.
    last_call: Option<Event>,
    steps: usize,
    pub(crate) step_no: usize,
    log: VecDeque<LogEntry>,
    pub(crate) stats: Stats,
    /// The last owner and epoch of each partition (docs/design.md §10).
    pub(crate) epochs_seen: BTreeMap<u32, (String, u64)>,
}

impl Sim {
    pub(crate) fn new(seed: u64, params: &Params) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let partitions = rng.random_range(params.partitions.clone());
        let pool = rng.random_range(params.pool.clone());
        let config = PlanConfig {
            warm_timeout_ms: 5_000,
            release_timeout_ms: 3_000,
            max_warming_per_consumer: rng.random_range(1..=4),
        };
        let mut sim = Self::with(partitions, pool, config);
        sim.seed = seed;
        sim.rng = rng;
        sim.steps = params.steps;
        sim
    }

    pub(crate) fn with(partitions: u32, pool: usize, config: PlanConfig) -> Self {
        let names: Vec<String> = (0..pool).map(|i| format!("c{i}")).collect();
        Sim {
            seed: 0,
            rng: StdRng::seed_from_u64(0),
            clients: names.iter().map(|n| (n.clone(), Client::default())).collect(),
            names,
            config,
            state: TopicState { partition_count: partitions, ..Default::default() },
            cooldowns: Cooldowns::default(),
            now: 1_000,
            ever_joined: BTreeSet::new(),
            last_call: None,
            steps: 0,
            step_no: 0,
            log: VecDeque::new(),
            stats: Stats::default(),
            epochs_seen: BTreeMap::new(),
        }
    }

    pub(crate) fn p(&self) -> u32 {
        self.state.partition_count
    }

    fn note(&mut self, entry: LogEntry) {
        if self.log.len() == LOG_LEN {
            self.log.pop_front();
        }
        self.log.push_back(entry);
    }

    pub(crate) fn report(&self, msg: &str) -> String {
        let mut out = format!(
            "seed {}: P={} pool={} config={:?}\nfailure at step {}: {msg}\nlast steps:\n",
            self.seed,
            self.p(),
            self.names.len(),
            self.config,
            self.step_no
        );
        for entry in &self.log {
            let _ = writeln!(out, "  {entry}");
        }
        let _ = writeln!(out, "state: {:#?}", self.state);
        let _ = writeln!(out, "cooldowns: {:?}", self.cooldowns.0);
        for (name, c) in &self.clients {
            let _ = writeln!(
                out,
                "client {name}: live={} belief={:?} warms={:?} releases={:?}",
                c.live, c.belief, c.warms, c.releases
            );
        }
        out
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> Option<T> {
        if items.is_empty() { None } else { Some(items[self.rng.random_range(0..items.len())].clone()) }
    }

    pub(crate) fn live_names(&self) -> Vec<String> {
        self.names.iter().filter(|n| self.clients[*n].live).cloned().collect()
    }

    pub(crate) fn drained(&self) -> Vec<String> {
        self.live_names()
            .into_iter()
            .filter(|n| {
                self.state.consumers.get(n) == Some(&ConsumerStatus::Draining) && self.state.is_idle(n)
            })
            .collect()
    }

    fn pending_warms(&self) -> Vec<(String, u32)> {
        let mut out = Vec::new();
        for (n, c) in self.clients.iter().filter(|(_, c)| c.live) {
            out.extend(c.warms.keys().map(|p| (n.clone(), *p)));
        }
        out
    }

    fn pending_releases(&self) -> Vec<(String, u32)> {
        let mut out = Vec::new();
        for (n, c) in self.clients.iter().filter(|(_, c)| c.live) {
            out.extend(c.releases.keys().map(|p| (n.clone(), *p)));
        }
        out
    }

    pub(crate) fn run(&mut self) -> Result<(), String> {
        for _ in 0..self.steps {
            self.random_step()?;
        }
        self.quiesce()
    }

    pub(crate) fn tick(&mut self, advance: Millis) -> Result<(), String> {
        self.now += advance;
        self.do_step(Event::Tick(self.now))
    }

    fn random_step(&mut self) -> Result<(), String> {
        self.now += self.rng.random_range(0..50);
        let roll = self.rng.random_range(0..100);
        let event = match roll {
            0..12 => {
                let idle: Vec<String> =
                    self.names.iter().filter(|n| !self.clients[*n].live).cloned().collect();
                self.pick(&idle).map(Event::Joined)
            }
            12..18 => {
                let live = self.live_names();
                let crashed = self.pick(&live);
                if crashed.is_some() {
                    self.stats.crashes += 1;
                }
                crashed.map(Event::Expired)
            }
            18..23 => {
                let live = self.live_names();
                self.pick(&live).map(Event::Draining)
            }
            23..28 => {
                let drained = self.drained();
                let left = self.pick(&drained);
                if left.is_some() {
                    self.stats.drained_left += 1;
                }
                left.map(Event::Expired)
            }
            28..48 => {
                let warms = self.pending_warms();
                self.pick(&warms).map(|(c, p)| Event::Ready(c, p))
            }
            48..62 => {
                let releases = self.pending_releases();
                self.pick(&releases).map(|(c, p)| {
                    self.clients.get_mut(&c).expect("pool name").releases.remove(&p);
                    Event::Released(c, p)
                })
            }
            62..74 => Some(self.wrong_event()),
            74..76 => {
                // Leader failover: the cooldowns live in the leader's memory only.
                self.cooldowns = Cooldowns::default();
                self.step_no += 1;
                let entry =
                    LogEntry { step: self.step_no, now: self.now, what: Logged::Failover, sent: Vec::new() };
                self.note(entry);
                return Ok(());
            }
            _ => None,
        };
        match event {
            Some(event) => self.do_step(event),
            None => {
                let advance = if self.rng.random_bool(0.15) {
                    self.rng.random_range(3_000..=12_000)
                } else {
                    self.rng.random_range(1..=1_500)
                };
                self.tick(advance)
            }
        }
    }

    /// A call the reference model may well refuse.
    fn wrong_event(&mut self) -> Event {
        let kind = self.rng.random_range(0..6);
        if kind == 0
            && let Some(call) = self.last_call.clone()
        {
            return call; // a duplicate of the last accepted call
        }
        if kind == 1 {
            // Swapped roles: a warm answered with Released, a release with Ready.
            let warms = self.pending_warms();
            let releases = self.pending_releases();
            if self.rng.random_bool(0.5) {
                if let Some((c, p)) = self.pick(&warms) {
                    return Event::Released(c, p);
                }
            } else if let Some((c, p)) = self.pick(&releases) {
                return Event::Ready(c, p);
            }
        }
        if kind == 2 {
            // Membership events for names that are not live: no-ops.
            let idle: Vec<String> = self.names.iter().filter(|n| !self.clients[*n].live).cloned().collect();
            let mut candidates: Vec<String> = UNKNOWN.iter().map(|s| s.to_string()).collect();
            candidates.extend(idle);
            let name = self.pick(&candidates).expect("never empty");
            return if self.rng.random_bool(0.5) { Event::Draining(name) } else { Event::Expired(name) };
        }
        let mut candidates: Vec<String> = self.names.clone();
        candidates.extend(UNKNOWN.iter().map(|s| s.to_string()));
        let name = self.pick(&candidates).expect("never empty");
        let partition = self.rng.random_range(0..self.p() + 3);
        if self.rng.random_bool(0.5) {
            Event::Ready(name, partition)
        } else {
            Event::Released(name, partition)
        }
    }

    /// Applies one event through `step`, delivers the commands, and checks everything.
    pub(crate) fn do_step(&mut self, event: Event) -> Result<(), String> {
        self.step_no += 1;
        // The step stands for one store revision: new ownerships get an epoch above it.
        self.state.next_epoch = self.step_no as u64 + 1;
        let before = self.state.clone();
        let result = step(&mut self.state, &event, self.now, &self.config, &mut self.cooldowns);
        let outcome = match &result {
            Ok(writes) => Ok(writes.len()),
            Err(e) => Err(e.clone()),
        };
        let what = Logged::Step(event.clone(), outcome);
        self.note(LogEntry { step: self.step_no, now: self.now, what, sent: Vec::new() });

        // Writes, refusals and the reference model.
        self.check_writes(&before, &event, &result)?;
        self.check_model(&before, &event, &result)?;
        match (&event, &result) {
            (Event::Ready(..), Ok(_)) => {
                self.stats.ready_ok += 1;
                self.last_call = Some(event.clone());
            }
            (Event::Released(..), Ok(_)) => {
                self.stats.released_ok += 1;
                self.last_call = Some(event.clone());
            }
            (_, Err(e)) => *self.stats.refused.entry(format!("{:?}", Refusal::of(e))).or_default() += 1,
            _ => {}
        }
        if let Event::Tick(at) = event {
            ensure!(self.state.consumers == before.consumers, "a tick changed membership");
            self.check_tick(&before, at)?;
        }

        // Membership, as the relay sees it: a dead consumer loses its view, a joining one
        // starts from the empty view.
        match &event {
            Event::Joined(c) => {
                self.ever_joined.insert(c.clone());
                if let Some(client) = self.clients.get_mut(c) {
                    *client = Client { live: true, ..Client::default() };
                }
            }
            Event::Expired(c) => {
                if let Some(client) = self.clients.get_mut(c) {
                    *client = Client::default();
                }
            }
            _ => {}
        }

        self.relay()?;
        self.check_state()?;
        self.check_epochs()
    }

    /// The relay, as an instance runs it: every live consumer gets the diff of what it was
    /// told and its view now, and receives it as a client.
    fn relay(&mut self) -> Result<(), String> {
        for i in 0..self.names.len() {
            let name = self.names[i].clone();
            let view = ConsumerView::of(&self.state, &name);
            let cmds = diff_views(&self.clients[&name].told, &view);
            if !self.check_relayed(&name, &view, &cmds)? {
                continue;
            }
            let delivered = self.deliver(&name, &cmds);
            if !cmds.is_empty()
                && let Some(last) = self.log.back_mut()
            {
                last.sent.push((name.clone(), cmds));
            }
            delivered?;
            let client = self.clients.get_mut(&name).expect("pool name");
            client.told = view;
            self.check_beliefs(&name)?;
        }
        self.check_ownership()
    }

    /// No more joins or crashes: answer everything, let drained consumers leave, let time
    /// pass, until nothing changes; then check the stable fleet.
    pub(crate) fn quiesce(&mut self) -> Result<(), String> {
        let bound = 10 * self.p() as u64 + 50;
        for round in 0..bound {
            let start = self.state.clone();
            for (c, p) in self.pending_warms() {
                self.now += 1;
                self.do_step(Event::Ready(c, p))?;
            }
            for (c, p) in self.pending_releases() {
                self.now += 1;
                self.clients.get_mut(&c).expect("pool name").releases.remove(&p);
                self.do_step(Event::Released(c, p))?;
            }
            for c in self.drained() {
                self.stats.drained_left += 1;
                self.do_step(Event::Expired(c))?;
            }
            self.tick(1_000)?;
            // The next epoch moves on every step; what is stored is what must not.
            let unchanged = TopicState { next_epoch: start.next_epoch, ..self.state.clone() } == start;
            if unchanged && self.cooldowns.0.is_empty() {
                self.stats.quiesce_rounds_max = round + 1;
                return self.check_settled();
            }
        }
        Err(format!("the fleet did not settle within {bound} quiesce rounds"))
    }
}
