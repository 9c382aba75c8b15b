//! The cluster: the event queue, the instances and their network to the store model, and
//! the run loop. Consumers and scheduled actions are in `actors.rs`, the checks after
//! every step in `checks.rs`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Duration;

use super::consumer::ConsumerModel;
use super::events::{BASE, CallKind, Ev, PREFIX, Queued, tag};
use super::fleet_truth::FleetTruth;
use super::instance::Machine;
use super::lease::Keeper;
use super::schedule::{Kind, Schedule};
use super::truth::Truth;
use super::{Failure, Outcome, Rng, SimBackend, SimConfig, Trace, Violation};
use crate::coordinator::machine::io::{CallId, Effect, Input, Micros, RequestId, StreamId};
use crate::coordinator::records::Keys;
use crate::proto::v1::{AssignmentCommand, assignment_command::Command};
use crate::store::{StoreModel, WatchCursor};

/// How long the driver waits for a store answer before it reports a timeout (µs).
pub(super) const CALL_BUDGET: u64 = 500_000;

/// The most an instance's clock is off the virtual time (µs): clocks disagree a little,
/// which the epochs' floor must cover.
const MAX_SKEW: u64 = 50_000;

/// Events handled per schedule before it counts as spinning.
const MAX_EVENTS: u64 = 2_000_000;

/// One instance: its state (while running), its lease keeper and its network.
pub(super) struct Node {
    /// Its id (the leader key's value when it leads).
    pub id: String,
    /// Its state, while it runs.
    pub machine: Option<Machine>,
    /// Bumped at every crash and start: events of an earlier life are dropped.
    pub life: u32,
    pub keeper: Keeper,
    pub keeper_wake_at: Option<u64>,
    /// Its current watch, the id of the request that started it.
    pub watch: Option<(RequestId, WatchCursor)>,
    pub pump_pending: bool,
    /// The instance's connection is cut off from the store until then (virtual µs).
    pub cut_until: u64,
    /// When its last cut began.
    pub cut_from: u64,
    /// When its instance last crashed.
    pub crashed_at: u64,
    /// The lease keeper's own connection is cut off until then.
    pub keeper_cut_until: u64,
    /// When its last store answer arrives (answers keep the order the store served them
    /// in, unless `SimConfig::answers_reorder`).
    pub answer_clock: u64,
    /// How far its clock is off the virtual time (µs), drawn at each start.
    pub skew: i64,
    /// Its `WakeAt`.
    pub wake: Option<Micros>,
    /// Open streams (from the instance's side) → consumer.
    pub streams: BTreeMap<StreamId, usize>,
    /// Calls in flight → (consumer, the instance and stream it reads, what).
    pub calls: BTreeMap<CallId, (usize, usize, StreamId, CallKind)>,
    pub next_stream: StreamId,
    pub next_call: CallId,
    /// When each stream's last command reaches its consumer (commands stay in order).
    pub stream_clock: BTreeMap<StreamId, u64>,
    pub leading: bool,
}

/// The whole simulated cluster.
pub(super) struct Cluster {
    pub seed: u64,
    pub config: SimConfig,
    pub kind: Kind,
    pub rng: Rng,
    pub now: u64,
    pub queue: BinaryHeap<Reverse<Queued>>,
    pub seq: u64,
    pub store: StoreModel,
    pub keys: Keys,
    pub truth: Truth,
    /// The fleet's records and their history (fleet runs only).
    pub fleet: Option<FleetTruth>,
    /// Set while the store revokes a session early (`Action::Revoke`): the revisions the
    /// truth follows meanwhile are that revocation.
    pub revoking: bool,
    pub truth_cursor: WatchCursor,
    pub nodes: Vec<Node>,
    pub consumers: Vec<ConsumerModel>,
    pub trace: Trace,
    pub outcome: Outcome,
    pub outage_until: u64,
    pub lossy_until: u64,
    pub schedule: Schedule,
    pub quiet: bool,
    pub store_tick_at: Option<u64>,
    /// Bookkeeping of the checks (`checks.rs`).
    pub checks: super::check_state::CheckState,
    /// What the store, the watches and the consumers did so far (`scenario.rs`).
    pub counts: super::scenario_state::Counts,
    /// The scenario under way, if the run is one.
    pub scenario: Option<super::scenario_state::ScenarioRun>,
}

impl Cluster {
    /// A cluster for `seed`; `keep` lines of step text when recording.
    pub fn new(seed: u64, config: &SimConfig, keep: Option<usize>) -> Self {
        let mut rng = Rng::new(seed);
        let kind = if config.scenario.is_some() { Kind::Scenario } else { Kind::of(seed) };
        let schedule = Schedule::draw(kind, config, &mut rng);
        let store = StoreModel::new();
        let truth_cursor = store.watch(PREFIX, 0).unwrap_or(WatchCursor { prefix: PREFIX.into(), next: 2 });
        let nodes = (0..config.instances)
            .map(|i| Node {
                id: format!("i{i}"),
                machine: None,
                life: 0,
                keeper: Keeper::new(config.ttl, BASE),
                keeper_wake_at: None,
                watch: None,
                pump_pending: false,
                cut_until: 0,
                cut_from: 0,
                crashed_at: 0,
                keeper_cut_until: 0,
                answer_clock: 0,
                skew: 0,
                wake: None,
                streams: BTreeMap::new(),
                calls: BTreeMap::new(),
                next_stream: 1,
                next_call: 1,
                stream_clock: BTreeMap::new(),
                leading: false,
            })
            .collect();
        let consumers = (0..config.consumers).map(|c| ConsumerModel::new(format!("c{c}"), 0)).collect();
        let mut cluster = Self {
            seed,
            config: config.clone(),
            kind,
            rng,
            now: 0,
            queue: BinaryHeap::new(),
            seq: 0,
            store,
            keys: Keys::new(PREFIX),
            truth: Truth::new(config.topic_set()),
            fleet: (config.backend == SimBackend::Fleet).then(|| FleetTruth::new(PREFIX, config.topic_set())),
            revoking: false,
            truth_cursor,
            nodes,
            consumers,
            trace: Trace::new(keep),
            outcome: Outcome::default(),
            outage_until: 0,
            lossy_until: 0,
            schedule,
            quiet: false,
            store_tick_at: None,
            checks: Default::default(),
            counts: super::scenario_state::Counts {
                plan_moves_by_node: vec![0; config.instances],
                ..Default::default()
            },
            scenario: config.scenario.clone().map(super::scenario_state::ScenarioRun::new),
        };
        for node in 0..config.instances {
            cluster.start_instance(node);
        }
        for (at, action) in cluster.schedule.actions.clone() {
            cluster.push(at, Ev::Act(action));
        }
        if cluster.scenario.is_some() {
            cluster.start_scenario();
        } else {
            cluster.push(cluster.schedule.quiet_at, Ev::Quiet);
        }
        cluster
    }

    /// Runs to convergence or the first broken invariant.
    pub fn run(mut self) -> Result<Outcome, Box<Failure>> {
        // A fleet takes more events than a handful of consumers.
        let max_events = MAX_EVENTS.max(2_000 * self.config.consumers as u64);
        while let Some(Reverse(Queued { at, event, .. })) = self.queue.pop() {
            self.now = at;
            self.outcome.steps += 1;
            let checks_now = self.outcome.steps.is_multiple_of(self.config.check_every.max(1));
            let result = self.handle(*event).and_then(|()| if checks_now { self.check() } else { Ok(()) });
            if let Err(violation) = result {
                return Err(self.failure(violation));
            }
            if self.checks.converged_at.is_some() {
                break;
            }
            if self.outcome.steps > max_events {
                let detail = format!("{max_events} events without converging: the cluster spins");
                return Err(self.failure(Violation::new(super::Invariant::Converged, detail)));
            }
        }
        if self.checks.converged_at.is_none() {
            let detail = "the event queue ran dry before the cluster converged";
            return Err(self.failure(Violation::new(super::Invariant::Converged, detail)));
        }
        self.outcome.trace_hash = self.trace.hash();
        self.outcome.revisions = self.store.revision();
        self.outcome.plan_moves = self.truth.plan_moves;
        self.outcome.epoch_checks = self.truth.epoch_checks;
        if let Some(fleet) = &self.fleet {
            self.outcome.epoch_checks = fleet.epoch_checks;
            self.outcome.lease_writes = fleet.lease_writes;
        }
        self.outcome.scenario = self.scenario_report();
        Ok(self.outcome)
    }

    pub(super) fn failure(&self, violation: Violation) -> Box<Failure> {
        Box::new(Failure {
            seed: self.seed,
            kind: self.kind,
            violation,
            at: self.now,
            last_steps: self.trace.lines(),
        })
    }

    /// Queues `event` at virtual time `at` (never before now).
    pub fn push(&mut self, at: u64, event: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Queued { at: at.max(self.now), seq: self.seq, event: Box::new(event) }));
    }

    /// Queues `event` after `delay` µs.
    pub fn after(&mut self, delay: u64, event: Ev) {
        self.push(self.now + delay, event);
    }

    /// Instance `node`'s clock now: the virtual time, off by the node's skew.
    pub fn wall(&self, node: usize) -> Micros {
        (BASE + self.now).saturating_add_signed(self.nodes[node].skew)
    }

    /// The virtual time at which `node`'s clock shows `wall`.
    pub(super) fn virtual_at(&self, node: usize, wall: Micros) -> u64 {
        wall.saturating_add_signed(-self.nodes[node].skew).saturating_sub(BASE)
    }

    pub(super) fn store_now(&self) -> Duration {
        Duration::from_micros(self.now)
    }

    /// Whether the store can be reached from `node` now.
    pub fn reachable(&self, node: usize) -> bool {
        self.now >= self.outage_until && self.now >= self.nodes[node].cut_until
    }

    /// Whether `node`'s lease keeper reaches the store now (it has a connection of its own).
    pub fn keeper_reachable(&self, node: usize) -> bool {
        self.now >= self.outage_until && self.now >= self.nodes[node].keeper_cut_until
    }

    /// A network delay: mostly short, sometimes long.
    pub fn delay(&mut self) -> u64 {
        if self.rng.percent(90) { 100 + self.rng.below(2_000) } else { 2_000 + self.rng.below(60_000) }
    }

    /// Whether a request is held on a stalled connection now ([`super::SimConfig::stalls`]).
    fn stalled(&mut self) -> bool {
        self.config.stalls && !self.quiet && self.now < self.lossy_until && self.rng.percent(10)
    }

    /// How long a stalled request is held: half a TTL to two and a half.
    fn stall(&mut self) -> u64 {
        let ttl = self.config.ttl.as_micros() as u64;
        ttl / 2 + self.rng.below(2 * ttl)
    }

    /// Whether an answer is lost now.
    pub(super) fn lost(&mut self) -> bool {
        !self.quiet && self.now < self.lossy_until && self.rng.percent(20)
    }

    pub(super) fn handle(&mut self, event: Ev) -> Result<(), Violation> {
        self.trace.mix(&[self.now, tag(&event)]);
        if self.trace.recording() {
            let (now, line) = (self.now, format!("{event:?}"));
            self.trace.line(|| format!("{:>10.6} {line}", now as f64 / 1e6));
        }
        match event {
            Ev::Act(action) => self.act(action),
            Ev::Quiet => self.go_quiet(),
            Ev::Input { node, life, input } => {
                if self.nodes[node].life == life {
                    if let Input::StreamClosed { stream } = &input {
                        // From now on the instance knows: its side of the stream is closed.
                        self.nodes[node].streams.remove(stream);
                        self.nodes[node].stream_clock.remove(stream);
                    }
                    self.step(node, input)?;
                }
                Ok(())
            }
            Ev::Timer { node, life, at } => {
                if self.nodes[node].life == life && self.nodes[node].wake == Some(at) {
                    self.nodes[node].wake = None;
                    self.step(node, Input::TimerFired)?;
                }
                Ok(())
            }
            Ev::Arrive { node, life, request, op } => self.arrive(node, life, request, op),
            Ev::Pump { node, life, watch } => self.pump(node, life, watch),
            Ev::Progress { node, life } => self.progress(node, life),
            Ev::StoreTick => {
                self.store_tick_at = None;
                if self.now >= self.outage_until {
                    self.sync_truth(None)?;
                }
                Ok(())
            }
            Ev::KeeperWake { node, life, at } => {
                if self.nodes[node].life == life && self.nodes[node].keeper_wake_at == Some(at) {
                    self.nodes[node].keeper_wake_at = None;
                    self.keeper_wake(node)?;
                }
                Ok(())
            }
            Ev::KeeperArrive { node, life, token, ask } => self.keeper_arrive(node, life, token, ask),
            Ev::KeeperAnswer { node, life, token, answer } => {
                if self.nodes[node].life != life || self.nodes[node].machine.is_none() {
                    return Ok(());
                }
                let wall = self.wall(node);
                if let Some(state) = self.nodes[node].keeper.answered(wall, token, answer) {
                    self.step(node, Input::Lease(state))?;
                }
                self.schedule_keeper(node);
                Ok(())
            }
            Ev::Resume { consumer } => self.resume(consumer),
            Ev::ScenarioTick => self.scenario_tick(),
            event @ (Ev::Told { .. }
            | Ev::Ended { .. }
            | Ev::Replied { .. }
            | Ev::Register { .. }
            | Ev::Answer { .. }) => self.handle_for_consumer(event),
            Ev::OutageEnd => {
                let now = self.store_now();
                self.store.renew_all_sessions(now);
                self.wake_watches();
                Ok(())
            }
        }
    }

    /// An event for a consumer.
    pub(super) fn handle_for_consumer(&mut self, event: Ev) -> Result<(), Violation> {
        match event {
            Ev::Told { consumer, node, stream, command } => self.told(consumer, node, stream, command),
            Ev::Ended { consumer, node, stream, clean } => self.ended(consumer, node, stream, clean),
            Ev::Replied { consumer, node, stream, call, ok } => {
                self.replied(consumer, node, stream, call, ok)
            }
            Ev::Register { consumer, restart } => self.register(consumer, restart),
            Ev::Answer { consumer, node, stream, todo } => self.answer(consumer, node, stream, todo),
            _ => Ok(()),
        }
    }

    /// The node an instance id names (`i2`, `i2.3`: node 2), whichever life it was.
    pub fn node_of(instance: &str) -> Option<usize> {
        instance.strip_prefix('i')?.split('.').next()?.parse().ok()
    }

    /// Starts instance `node` as a fresh state.
    pub fn start_instance(&mut self, node: usize) {
        self.nodes[node].skew = self.rng.below(2 * MAX_SKEW) as i64 - MAX_SKEW as i64;
        let wall = self.wall(node);
        let life = self.nodes[node].life + 1;
        // `same_id_on_restart` off: each life takes a new id (`i0.2`), as a pod with a
        // generated name does; on: a restart keeps its id, as a StatefulSet's pod does, and
        // only the life's nonce keeps its registration ids apart from the previous life's.
        if !self.config.same_id_on_restart && life > 1 {
            self.nodes[node].id = format!("i{node}.{life}");
        }
        // Distinct for every life of every node, and drawn from no generator, so the
        // schedule's random stream is the same whatever the machine does with it.
        let nonce = ((node as u64) << 32) | u64::from(life);
        let (machine, effects) = Machine::new(&self.config, &self.nodes[node].id, nonce, wall);
        let n = &mut self.nodes[node];
        n.life = life;
        n.machine = Some(machine);
        n.keeper = Keeper::new(self.config.ttl, wall);
        n.keeper_wake_at = None;
        n.watch = None;
        n.pump_pending = false;
        n.wake = None;
        n.leading = false;
        for effect in effects {
            // Applying effects breaks no invariant by itself (the checks run after the step).
            let _ = self.apply(node, effect);
        }
        self.schedule_keeper(node);
        let life = self.nodes[node].life;
        let every = self.config.ttl.as_micros() as u64 / 4;
        self.after(every, Ev::Progress { node, life });
    }

    /// Stops instance `node` as a crash: nothing more comes from it, its streams break.
    pub fn crash_instance(&mut self, node: usize) {
        let Some(mut machine) = self.nodes[node].machine.take() else { return };
        let wall = self.wall(node);
        let _ = machine.step(wall, Input::Stop(crate::coordinator::machine::io::Stop::Crash));
        let n = &mut self.nodes[node];
        n.crashed_at = self.now;
        n.life += 1;
        n.watch = None;
        n.wake = None;
        n.leading = false;
        n.calls.clear();
        let streams: Vec<(StreamId, usize)> = std::mem::take(&mut n.streams).into_iter().collect();
        for (stream, consumer) in streams {
            let delay = self.delay();
            self.after(delay, Ev::Ended { consumer, node, stream, clean: false });
        }
    }

    /// One step of instance `node`'s state, and its effects applied.
    pub fn step(&mut self, node: usize, input: Input) -> Result<(), Violation> {
        let wall = self.wall(node);
        let Some(machine) = self.nodes[node].machine.as_mut() else { return Ok(()) };
        if self.trace.recording() {
            let line = format!("  i{node} <- {input:?}");
            self.trace.line(|| line);
        }
        let effects = machine.step(wall, input);
        self.outcome.machine_steps += 1;
        // Observations are for metrics and logs: they are not part of the trace.
        let said = effects.iter().filter(|e| !matches!(e, Effect::Observe(_))).count();
        self.trace.mix(&[node as u64, said as u64]);
        for effect in effects {
            self.apply(node, effect)?;
        }
        Ok(())
    }

    pub(super) fn apply(&mut self, node: usize, effect: Effect) -> Result<(), Violation> {
        if let Effect::Observe(_) = effect {
            // Metrics and logs only: nothing to model, and kept out of the trace.
            return Ok(());
        }
        if self.trace.recording() {
            let line = format!("  i{node} -> {effect:?}");
            self.trace.line(|| line);
        }
        let life = self.nodes[node].life;
        match effect {
            Effect::Store { request, op } => {
                self.trace.mix(&[1, request]);
                let delay = if self.stalled() { self.stall() } else { self.delay() };
                self.after(delay, Ev::Arrive { node, life, request, op });
            }
            Effect::Command { stream, command } => {
                self.trace.mix(&[2, stream]);
                let Some(&consumer) = self.nodes[node].streams.get(&stream) else { return Ok(()) };
                if self.fleet.is_some() {
                    self.checks.unassigned_sent(node, stream, unassigned(&command));
                }
                let delay = self.delay();
                let at = self.in_order(node, stream, delay);
                self.push(at, Ev::Told { consumer, node, stream, command });
            }
            Effect::Epochs { stream, epochs } => {
                self.trace.mix(&[3, stream, epochs.revision]);
            }
            Effect::Reply { call, reply } => {
                self.trace.mix(&[4, call, u64::from(reply.is_ok())]);
                let Some((consumer, own, stream, kind)) = self.nodes[node].calls.remove(&call) else {
                    return Ok(());
                };
                let ok = match &reply {
                    Ok(crate::coordinator::machine::io::Replied::Deregistered(action)) => {
                        let drain = *action == crate::proto::v1::DeregisterAction::WaitForDrain;
                        if drain && self.fleet.is_some() {
                            let detail =
                                format!("i{node} answered a Deregister with a drain: the fleet has none");
                            return Err(Violation::new(super::Invariant::Contradiction, detail));
                        }
                        Ok(drain)
                    }
                    Ok(_) => Ok(true),
                    Err(_) => Err(()),
                };
                let delay = self.delay();
                self.after(delay, Ev::Replied { consumer, node: own, stream, call: kind, ok });
            }
            Effect::EndStream { stream, reason, error } => {
                self.trace.mix(&[5, stream, u64::from(error.is_some())]);
                let _ = reason;
                if let Some(consumer) = self.nodes[node].streams.remove(&stream) {
                    let delay = self.delay();
                    let at = self.in_order(node, stream, delay);
                    self.push(at, Ev::Ended { consumer, node, stream, clean: error.is_none() });
                }
                self.nodes[node].stream_clock.remove(&stream);
            }
            Effect::WakeAt(at) => {
                self.trace.mix(&[6, at]);
                self.nodes[node].wake = Some(at);
                let when = self.virtual_at(node, at);
                self.push(when, Ev::Timer { node, life, at });
            }
            Effect::Ready(ready) => self.trace.mix(&[7, u64::from(ready)]),
            Effect::Leading(leading) => {
                self.trace.mix(&[8, u64::from(leading)]);
                self.nodes[node].leading = leading;
            }
            Effect::KeepLeaseAliveNow => {
                self.trace.mix(&[9]);
                let wall = self.wall(node);
                self.nodes[node].keeper.check_now(wall);
                self.schedule_keeper(node);
            }
            // The simulation configures no weight source: no instance asks.
            Effect::LookUpWeights { .. } => {}
            Effect::Observe(_) => {}
            Effect::LookUpPartitions { request, topic } => {
                self.trace.mix(&[10, request]);
                let answer = if self.config.topic_set().index(&topic).is_some() {
                    Ok(self.config.partitions)
                } else {
                    Err(crate::coordinator::CoordinatorError::UnknownTopic(
                        crate::coordinator::causes::TopicUnknown::NotConfigured { topic },
                    ))
                };
                let delay = self.delay();
                self.after(delay, Ev::Input { node, life, input: Input::PartitionCount { request, answer } });
            }
        }
        Ok(())
    }

    /// When a message sent on `stream` now, `delay` µs late, arrives: never before the
    /// stream's previous one.
    pub(super) fn in_order(&mut self, node: usize, stream: StreamId, delay: u64) -> u64 {
        let at = self.now + delay;
        let clock = self.nodes[node].stream_clock.entry(stream).or_insert(0);
        *clock = (*clock).max(at);
        *clock
    }
}

/// The partitions an `AssignmentUpdate` unassigns (none for other commands).
pub(super) fn unassigned(command: &AssignmentCommand) -> impl Iterator<Item = u32> + '_ {
    let update = match &command.command {
        Some(Command::Assignment(update)) => Some(update),
        _ => None,
    };
    update.into_iter().flat_map(|u| u.unassigned.iter().map(|tp| tp.partition))
}
