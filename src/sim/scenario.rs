//! A scripted run at fleet size (issue 42): every consumer joins, the fleet restarts in
//! waves (each consumer of a wave deregisters with a drain and comes back as a new process
//! on an instance the load balancer picks), then a zone goes down (its instances and its
//! consumers die) and comes back. Each phase begins once the one before has settled (every
//! partition owned once by an online consumer, balanced, no handoff left, every consumer
//! believing what it owns) and a pause has passed, and what it cost is counted at the
//! store, at the instances' watches and at the consumers.
//!
//! The invariants stay checked: those of every revision always, those that read the whole
//! cluster every [`SimConfig::check_every`](super::SimConfig::check_every) steps, and each
//! phase must settle within [`SimConfig::converge_within`](super::SimConfig::converge_within).

use std::time::Duration;

use super::Violation;
use super::cluster::Cluster;
use super::consumer::Phase as ConsumerPhase;
use super::events::Ev;
use super::schedule::Action;

/// How often (virtual µs) a scenario looks whether its phase has settled.
const TICK: u64 = 100_000;

/// The script (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scenario {
    /// Waves of the rolling restart (10: a tenth of the consumers each).
    pub waves: u32,
    /// Zones: instance `i` is in zone `i mod zones`, consumer `c` in zone
    /// `(c / topics) mod zones` (so every topic has consumers in every zone). Zone 0 goes
    /// down. Below 2: no zone outage.
    pub zones: u32,
    /// The quiet time between a phase settling and the next beginning.
    pub pause: Duration,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario { waves: 10, zones: 3, pause: Duration::from_secs(1) }
    }
}

/// What a phase cost, counted where it happens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Transactions the instances sent that reached the store.
    pub txns: u64,
    /// Reads of single keys.
    pub gets: u64,
    /// Whole-prefix reads (a start or a resync).
    pub prefix_reads: u64,
    /// The keys those reads returned.
    pub prefix_read_keys: u64,
    /// The lease keepers' requests (grants and keep-alives).
    pub keeper_requests: u64,
    /// Keys the store changed (events of its revisions).
    pub keys_changed: u64,
    /// Watch events delivered to instances, summed over them.
    pub watch_events: u64,
    /// The key and value bytes of those events.
    pub watch_bytes: u64,
    /// `Register` calls made.
    pub registers: u64,
    /// Commands the consumers applied.
    pub commands: u64,
    /// Partitions that changed owner.
    pub owner_changes: u64,
    /// Moves by plan, by the instance whose leader wrote them.
    pub plan_moves_by_node: Vec<u64>,
}

impl Counts {
    /// Each count of `self` and `other` combined by `f`.
    fn zip(&self, other: &Counts, f: impl Fn(u64, u64) -> u64) -> Counts {
        let nodes = self.plan_moves_by_node.len().max(other.plan_moves_by_node.len());
        let at = |v: &[u64], n: usize| v.get(n).copied().unwrap_or(0);
        Counts {
            txns: f(self.txns, other.txns),
            gets: f(self.gets, other.gets),
            prefix_reads: f(self.prefix_reads, other.prefix_reads),
            prefix_read_keys: f(self.prefix_read_keys, other.prefix_read_keys),
            keeper_requests: f(self.keeper_requests, other.keeper_requests),
            keys_changed: f(self.keys_changed, other.keys_changed),
            watch_events: f(self.watch_events, other.watch_events),
            watch_bytes: f(self.watch_bytes, other.watch_bytes),
            registers: f(self.registers, other.registers),
            commands: f(self.commands, other.commands),
            owner_changes: f(self.owner_changes, other.owner_changes),
            plan_moves_by_node: (0..nodes)
                .map(|n| f(at(&self.plan_moves_by_node, n), at(&other.plan_moves_by_node, n)))
                .collect(),
        }
    }

    /// What was counted since `earlier` (counts only grow).
    fn since(&self, earlier: &Counts) -> Counts {
        self.zip(earlier, u64::saturating_sub)
    }

    /// Both counted together (a sum of phases).
    pub fn plus(&self, other: &Counts) -> Counts {
        self.zip(other, u64::saturating_add)
    }

    /// Moves by plan, all instances.
    pub fn plan_moves(&self) -> u64 {
        self.plan_moves_by_node.iter().sum()
    }
}

/// One phase, measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseReport {
    /// What it did (`join`, `wave 3`, `zone down`, `zone back`).
    pub name: String,
    /// Virtual µs from its beginning until it settled.
    pub settled_after: u64,
    /// In `zone down`: virtual µs until every partition's owner was a live consumer again.
    pub live_owners_after: Option<u64>,
    /// What it cost.
    pub counts: Counts,
}

/// Every phase of a scenario, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The phases.
    pub phases: Vec<PhaseReport>,
}

/// The phases, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Join,
    Wave(u32),
    ZoneDown,
    ZoneBack,
}

impl Step {
    fn name(self) -> String {
        match self {
            Step::Join => "join".into(),
            Step::Wave(w) => format!("wave {}", w + 1),
            Step::ZoneDown => "zone down".into(),
            Step::ZoneBack => "zone back".into(),
        }
    }

    /// The phase after this one, in `scenario`.
    fn next(self, scenario: &Scenario) -> Option<Step> {
        let zone = scenario.zones >= 2;
        match self {
            Step::Join if scenario.waves > 0 => Some(Step::Wave(0)),
            Step::Wave(w) if w + 1 < scenario.waves => Some(Step::Wave(w + 1)),
            Step::Join | Step::Wave(_) if zone => Some(Step::ZoneDown),
            Step::ZoneDown => Some(Step::ZoneBack),
            _ => None,
        }
    }
}

/// A scenario under way: the phase, since when, and what was counted before it.
#[derive(Debug)]
pub(super) struct ScenarioRun {
    scenario: Scenario,
    step: Step,
    began: u64,
    counted_before: Counts,
    /// The phase settled then; the next begins after the pause.
    settled_at: Option<u64>,
    live_owners_at: Option<u64>,
    report: Report,
}

impl ScenarioRun {
    /// The run of `scenario`, in its first phase (the consumers' starts are scheduled).
    pub fn new(scenario: Scenario) -> Self {
        ScenarioRun {
            scenario,
            step: Step::Join,
            began: 0,
            counted_before: Counts::default(),
            settled_at: None,
            live_owners_at: None,
            report: Report::default(),
        }
    }
}

impl Cluster {
    /// The scenario's first look.
    pub(super) fn start_scenario(&mut self) {
        self.after(TICK, Ev::ScenarioTick);
    }

    /// The scenario looks: the phase settled, the pause ended, or the phase took too long.
    pub(super) fn scenario_tick(&mut self) -> Result<(), Violation> {
        let Some(mut run) = self.scenario.take() else { return Ok(()) };
        self.after(TICK, Ev::ScenarioTick);
        let result = self.look_at(&mut run);
        self.scenario = Some(run);
        result
    }

    fn look_at(&mut self, run: &mut ScenarioRun) -> Result<(), Violation> {
        let bound = self.config.converge_within.as_micros() as u64;
        if let Some(at) = run.settled_at {
            if self.now >= at + run.scenario.pause.as_micros() as u64 {
                match run.step.next(&run.scenario) {
                    Some(next) => self.begin(run, next),
                    None => self.checks.converged_at = Some(self.now),
                }
            }
            return Ok(());
        }
        if run.step == Step::ZoneDown && run.live_owners_at.is_none() && self.owners_live() {
            run.live_owners_at = Some(self.now);
        }
        let waiting = !self.truth.handoffs.is_empty() || self.someone_away();
        if waiting && self.now <= run.began + bound {
            return Ok(());
        }
        let settled = match self.someone_away() {
            true => Err("a consumer that wants a stream is not online".to_string()),
            false => self.settled(),
        };
        match settled {
            Ok(()) => {
                run.report.phases.push(PhaseReport {
                    name: run.step.name(),
                    settled_after: self.now - run.began,
                    live_owners_after: run.live_owners_at.map(|at| at - run.began),
                    counts: self.counts.since(&run.counted_before),
                });
                run.settled_at = Some(self.now);
                Ok(())
            }
            Err(why) if self.now > run.began + bound => Err(Violation::new(
                super::Invariant::Converged,
                format!("{} did not settle within {:.1}s: {why}", run.step.name(), bound as f64 / 1e6),
            )),
            Err(_) => Ok(()),
        }
    }

    /// Whether a consumer that wants a stream is not online yet (one of a wave coming back):
    /// the cluster may look settled without it, but the phase is not over.
    fn someone_away(&self) -> bool {
        self.consumers
            .iter()
            .any(|c| c.wants && !matches!(c.phase, ConsumerPhase::Online { draining: false, .. }))
    }

    /// Whether every owned partition's owner is a live consumer (one that has not died).
    fn owners_live(&self) -> bool {
        let dead: std::collections::BTreeSet<&str> =
            self.consumers.iter().filter(|c| !c.wants).map(|c| c.name.as_str()).collect();
        self.truth.owners.values().all(|owner| !dead.contains(owner.as_str()))
    }

    /// Phase `next` of `run` begins now.
    fn begin(&mut self, run: &mut ScenarioRun, next: Step) {
        let now = self.now;
        (run.step, run.began, run.counted_before, run.settled_at, run.live_owners_at) =
            (next, now, self.counts.clone(), None, None);
        let scenario = &run.scenario;
        let topics = self.config.topic_set().count as usize;
        let ttl = self.config.ttl.as_micros() as u64;
        let zone = |c: usize| (c / topics) as u32 % scenario.zones.max(1);
        match next {
            Step::Join => {}
            Step::Wave(w) => {
                for c in (0..self.consumers.len()).filter(|c| (c / topics) as u32 % scenario.waves == w) {
                    // Drains; its stream ends once drained, and it comes back (`ended`).
                    let _ = self.act(Action::Deregister(c, true));
                }
            }
            Step::ZoneDown => {
                for i in (0..self.nodes.len()).filter(|i| *i as u32 % scenario.zones == 0) {
                    self.crash_instance(i);
                }
                for c in (0..self.consumers.len()).filter(|c| zone(*c) == 0) {
                    self.consumers[c].wants = false;
                    if let Some((node, stream)) = self.consumers[c].stream() {
                        self.consumers[c].phase = ConsumerPhase::Offline;
                        let late = self.rng.below(ttl / 2);
                        self.close_stream(node, stream, late);
                    }
                }
                self.checks.last_disruption = self.checks.last_disruption.max(now + ttl);
            }
            Step::ZoneBack => {
                for i in (0..self.nodes.len()).filter(|i| *i as u32 % scenario.zones == 0) {
                    self.start_instance(i);
                }
                for c in (0..self.consumers.len()).filter(|c| zone(*c) == 0) {
                    self.consumers[c].wants = true;
                    let soon = self.rng.below(300_000);
                    self.after(soon, Ev::Register { consumer: c, restart: true });
                }
            }
        }
    }

    /// The scenario's measurements, once it ran.
    pub(super) fn scenario_report(&self) -> Option<Report> {
        self.scenario.as_ref().map(|run| run.report.clone())
    }
}
