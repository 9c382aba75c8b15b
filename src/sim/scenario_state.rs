//! What a scripted run (`scenario.rs`) is and what it counts: values the cluster holds,
//! apart from the script's steps over the cluster.

use std::time::Duration;

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
    pub(super) fn since(&self, earlier: &Counts) -> Counts {
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
pub(super) enum Step {
    Join,
    Wave(u32),
    ZoneDown,
    ZoneBack,
}

impl Step {
    pub(super) fn name(self) -> String {
        match self {
            Step::Join => "join".into(),
            Step::Wave(w) => format!("wave {}", w + 1),
            Step::ZoneDown => "zone down".into(),
            Step::ZoneBack => "zone back".into(),
        }
    }

    /// The phase after this one, in `scenario`.
    pub(super) fn next(self, scenario: &Scenario) -> Option<Step> {
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
    pub(super) scenario: Scenario,
    pub(super) step: Step,
    pub(super) began: u64,
    pub(super) counted_before: Counts,
    /// The phase settled then; the next begins after the pause.
    pub(super) settled_at: Option<u64>,
    pub(super) live_owners_at: Option<u64>,
    pub(super) report: Report,
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
