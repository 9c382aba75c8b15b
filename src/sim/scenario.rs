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

use super::Violation;
use super::cluster::Cluster;
use super::consumer::Phase as ConsumerPhase;
use super::events::Ev;
pub use super::scenario_state::{Counts, PhaseReport, Report, Scenario};
use super::scenario_state::{ScenarioRun, Step};
use super::schedule::Action;

/// How often (virtual µs) a scenario looks whether its phase has settled.
const TICK: u64 = 100_000;

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
                for i in (0..self.nodes.len()).filter(|i| (*i as u32).is_multiple_of(scenario.zones)) {
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
                for i in (0..self.nodes.len()).filter(|i| (*i as u32).is_multiple_of(scenario.zones)) {
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
