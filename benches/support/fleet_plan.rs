//! The leader's pure plan at fleet size (issue 42, item 4), for `benches/assignment.rs`.
//!
//! Two shapes: one topic of 100,000 partitions over 10,000 consumers, and 10,000 topics of
//! 16 partitions over 4 consumers each (160,000 partitions, 40,000 registrations), all
//! planned in one pass as the leader's `plan_all` does. Two placements: `count` (every weight
//! equal, `Balanced`) and `load` (`LoadBalanced`, weights drawn from Zipf(1.1) over 1..=1000
//! with a fixed seed, the placement bench's distribution). Five cases each:
//!
//! * **fresh**: every consumer registered, nobody owns anything;
//! * **steady**: the fresh plan's result, planned again until it starts nothing: the plan
//!   the leader runs on every pass when nothing changed;
//! * **one joins**, **one drains** (`Deregister`), **one dies** (its registration gone):
//!   from steady, in the one topic, or in the first of the 10,000 (the others steady, and
//!   planned all the same, since the leader plans every topic on each pass).
//!
//! Per row, three timed quantities, each the median and the min–max of its runs:
//!
//! * **clone**: cloning every topic's `TopicState`, the baseline. The leader does as much on
//!   each pass (it builds the state from its cache and clones it into the plan's `after`),
//!   and it scales with the input alone, so *plan / clone* is the machine-independent number;
//! * **target**: the `Assignor`'s target alone (`Balanced::assign`, or `LoadBalanced::assign`
//!   with the default budget of 10 moves), over a `Placement` built before the clock starts;
//! * **plan**: `plan_placed` (the placement mode's targets, then settling, direct
//!   assignments and handoffs, capped at 4 warms per consumer) and `diff_writes` of every
//!   topic, on a clone made before the clock starts: the leader's whole pure work per pass.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use kafka_assigner::assignment::{Assignor, Balanced, ConsumerInfo, LoadBalanced, Placement};
use kafka_assigner::handoff::{
    ConsumerStatus, Cooldowns, PlacementInputs, PlacementMemory, PlacementMode, PlacementSettings,
    PlanConfig, TopicState, diff_writes, plan_placed,
};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// The target for one plan of 100,000 partitions over 10,000 consumers.
pub const BUDGET: Duration = Duration::from_millis(200);

/// The plan's clock: fixed, since nothing here times out.
const NOW: u64 = 1_000_000;

/// A fleet's shape: `topics` topics of `partitions` partitions and `consumers` consumers.
#[derive(Clone, Copy)]
struct Shape {
    label: &'static str,
    topics: usize,
    partitions: u32,
    consumers: usize,
}

const SHAPES: [Shape; 2] = [
    Shape { label: "1 × 100000 P, 10000 C", topics: 1, partitions: 100_000, consumers: 10_000 },
    Shape { label: "10000 × 16 P, 4 C each", topics: 10_000, partitions: 16, consumers: 4 },
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    Fresh,
    Steady,
    Join,
    Drain,
    Dies,
}

const CASES: [Case; 5] = [Case::Fresh, Case::Steady, Case::Join, Case::Drain, Case::Dies];

impl Case {
    fn label(self) -> &'static str {
        match self {
            Case::Fresh => "fresh",
            Case::Steady => "steady",
            Case::Join => "one joins",
            Case::Drain => "one drains",
            Case::Dies => "one dies",
        }
    }
}

fn name(i: usize) -> String {
    format!("consumer-{i:05}")
}

/// Zipf(s) over `1..=n` by inverse transform on the cumulative weights (as in the placement
/// bench), so the draws are the same on every run.
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(n: u64, s: f64) -> Self {
        let mut sum = 0.0;
        Self {
            cumulative: (1..=n)
                .map(|k| {
                    sum += (k as f64).powf(-s);
                    sum
                })
                .collect(),
        }
    }

    fn sample(&self, rng: &mut StdRng) -> u64 {
        let u = rng.random::<f64>() * self.cumulative.last().copied().unwrap_or(0.0);
        self.cumulative.partition_point(|&c| c < u) as u64 + 1
    }
}

fn settings(mode: PlacementMode) -> PlacementSettings {
    PlacementSettings { mode, ..PlacementSettings::default() }
}

/// One plan of `state` the way the leader runs it: a fresh memory (a full budget, nothing
/// cooling), no rollout, no partition zones. Returns the writes and the moves (handoffs
/// started plus direct assignments).
fn plan_one(state: &mut TopicState, before: &TopicState, mode: PlacementMode) -> (usize, usize) {
    let settings = settings(mode);
    let (zones, memory) = (BTreeMap::new(), PlacementMemory::default());
    let inputs = PlacementInputs { settings: &settings, zones: &zones, memory: &memory };
    let (report, _) =
        plan_placed(state, NOW, &PlanConfig::default(), &mut Cooldowns::default(), None, inputs);
    let writes = diff_writes(before, state).len();
    (writes, report.started.len() + report.assigned_directly.len())
}

/// Every topic of `shape`, consumers registered and active, nobody owning anything;
/// Zipf weights under `load`.
fn fresh(shape: Shape, mode: PlacementMode, rng: &mut StdRng) -> Vec<TopicState> {
    let zipf = Zipf::new(1000, 1.1);
    (0..shape.topics)
        .map(|_| TopicState {
            partition_count: shape.partitions,
            consumers: (0..shape.consumers).map(|i| (name(i), ConsumerStatus::Active)).collect(),
            weights: match mode {
                PlacementMode::Load => (0..shape.partitions).map(|p| (p, zipf.sample(rng))).collect(),
                _ => BTreeMap::new(),
            },
            next_epoch: 1,
            ..TopicState::default()
        })
        .collect()
}

/// `state` planned, its handoffs completed, until a plan starts nothing (at most 20 rounds,
/// each with a fresh budget).
fn settle(mut state: TopicState, mode: PlacementMode) -> TopicState {
    for _ in 0..20 {
        let before = state.clone();
        let (writes, _) = plan_one(&mut state, &before, mode);
        for (p, h) in std::mem::take(&mut state.handoffs) {
            state.owners.insert(p, h.to);
            state.epochs.insert(p, h.epoch);
        }
        state.next_epoch += 1;
        if writes == 0 {
            break;
        }
    }
    state
}

/// The fleet of `case`, from the settled fleet `steady` (changed in its first topic).
fn apply(case: Case, shape: Shape, fresh: &[TopicState], steady: &[TopicState]) -> Vec<TopicState> {
    if case == Case::Fresh {
        return fresh.to_vec();
    }
    let mut fleet = steady.to_vec();
    let first = &mut fleet[0];
    let middle = name(shape.consumers / 2);
    match case {
        Case::Fresh | Case::Steady => {}
        Case::Join => {
            first.consumers.insert(name(shape.consumers), ConsumerStatus::Active);
        }
        Case::Drain => {
            first.consumers.insert(middle, ConsumerStatus::Draining);
        }
        Case::Dies => {
            first.consumers.remove(&middle);
        }
    }
    fleet
}

/// What a `Placement` of a state borrows: active consumers, draining ones, no warms.
struct Inputs {
    active: BTreeMap<String, ConsumerInfo>,
    draining: BTreeSet<String>,
    keep_first: BTreeSet<u32>,
}

impl Inputs {
    fn of(state: &TopicState) -> Self {
        let (active, draining): (Vec<_>, Vec<_>) =
            state.consumers.iter().partition(|(_, s)| **s == ConsumerStatus::Active);
        Self {
            active: active.into_iter().map(|(c, _)| (c.clone(), ConsumerInfo::default())).collect(),
            draining: draining.into_iter().map(|(c, _)| c.clone()).collect(),
            keep_first: BTreeSet::new(),
        }
    }

    fn placement<'a>(&'a self, state: &'a TopicState) -> Placement<'a> {
        Placement {
            partition_count: state.partition_count,
            weights: &state.weights,
            active: &self.active,
            draining: &self.draining,
            current: &state.owners,
            keep_first: &self.keep_first,
        }
    }
}

/// Median and extremes of a run's samples.
#[derive(Clone, Copy)]
pub struct Spread {
    /// The middle sample.
    pub median: Duration,
    /// The fastest sample.
    pub min: Duration,
    /// The slowest sample.
    pub max: Duration,
}

impl Spread {
    fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        Self { median: samples[samples.len() / 2], min: samples[0], max: samples[samples.len() - 1] }
    }

    fn cell(&self) -> String {
        format!("{} ({}–{})", ms(self.median), ms(self.min), ms(self.max))
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// `runs` samples of `timed(input)`, each on an input made by `setup` before the clock
/// starts; the output is dropped after the clock stops.
fn sample<I, T>(runs: usize, mut setup: impl FnMut() -> I, mut timed: impl FnMut(&mut I) -> T) -> Spread {
    let samples = (0..runs)
        .map(|_| {
            let mut input = setup();
            let start = Instant::now();
            let out = std::hint::black_box(timed(std::hint::black_box(&mut input)));
            let took = start.elapsed();
            drop(out);
            drop(input);
            took
        })
        .collect();
    Spread::of(samples)
}

/// One row of the table.
pub struct Row {
    shape: Shape,
    mode: PlacementMode,
    case: Case,
    moves: usize,
    writes: usize,
    clone: Spread,
    target: Spread,
    /// The leader's pure plan of every topic.
    pub plan: Spread,
}

impl Row {
    /// Whether this is a row of the one-topic 100,000 × 10,000 plan the target is about.
    pub fn is_big(&self) -> bool {
        self.shape.topics == 1
    }

    /// Whether the row places by count (`Balanced`).
    pub fn is_count(&self) -> bool {
        self.mode == PlacementMode::Count
    }

    fn cells(&self) -> Vec<String> {
        let ratio = self.plan.median.as_secs_f64() / self.clone.median.as_secs_f64().max(1e-9);
        vec![
            self.shape.label.to_string(),
            self.mode.name().to_string(),
            self.case.label().to_string(),
            self.moves.to_string(),
            self.writes.to_string(),
            self.clone.cell(),
            self.target.cell(),
            self.plan.cell(),
            format!("{ratio:.1}x"),
        ]
    }
}

const HEADER: [&str; 9] = [
    "shape (topics × P, C)",
    "placement",
    "case",
    "moves",
    "writes",
    "clone ms (baseline)",
    "target ms",
    "plan ms",
    "plan/clone",
];

/// Times every shape, placement and case (module docs); `runs` samples per quantity.
pub fn run(runs: usize) -> Vec<Row> {
    let mut rows = Vec::new();
    for shape in SHAPES {
        for mode in [PlacementMode::Count, PlacementMode::Load] {
            let mut rng = StdRng::seed_from_u64(42);
            let fresh = fresh(shape, mode, &mut rng);
            let steady: Vec<TopicState> = fresh.iter().cloned().map(|s| settle(s, mode)).collect();
            for case in CASES {
                let fleet = apply(case, shape, &fresh, &steady);
                let (mut moves, mut writes) = (0, 0);
                for state in &fleet {
                    let (w, m) = plan_one(&mut state.clone(), state, mode);
                    writes += w;
                    moves += m;
                }
                let clone = sample(runs, || (), |()| fleet.to_vec());
                let inputs: Vec<Inputs> = fleet.iter().map(Inputs::of).collect();
                let by_load =
                    LoadBalanced::new(settings(mode).load(Some(settings(mode).max_moves_per_minute)));
                let target = sample(
                    runs,
                    || (),
                    |()| {
                        let targets = fleet.iter().zip(&inputs).map(|(state, i)| {
                            let topic = i.placement(state);
                            match mode {
                                PlacementMode::Load => by_load.assign(&topic),
                                _ => Balanced.assign(&topic),
                            }
                        });
                        targets.collect::<Vec<_>>()
                    },
                );
                let plan = sample(
                    runs,
                    || fleet.to_vec(),
                    |after| {
                        after
                            .iter_mut()
                            .zip(&fleet)
                            .map(|(state, before)| plan_one(state, before, mode))
                            .collect::<Vec<_>>()
                    },
                );
                rows.push(Row { shape, mode, case, moves, writes, clone, target, plan });
            }
        }
    }
    rows
}

/// The rows as a Markdown table, with the text that says what each column is.
pub fn markdown(rows: &[Row]) -> String {
    let mut md = format!("| {} |\n|{}\n", HEADER.join(" | "), " --- |".repeat(HEADER.len()));
    for row in rows {
        let _ = writeln!(md, "| {} |", row.cells().join(" | "));
    }
    md
}

/// The rows as plain text, columns padded.
pub fn text(rows: &[Row]) -> String {
    let cells: Vec<Vec<String>> = rows.iter().map(Row::cells).collect();
    let widths: Vec<usize> = (0..HEADER.len())
        .map(|i| {
            cells.iter().map(|c| c[i].chars().count()).chain([HEADER[i].chars().count()]).max().unwrap_or(0)
        })
        .collect();
    let line = |cols: Vec<String>| {
        let padded =
            cols.iter().zip(&widths).map(|(c, &w)| format!("{c}{}", " ".repeat(w - c.chars().count())));
        padded.collect::<Vec<_>>().join(" | ")
    };
    let mut out = line(HEADER.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    out += &widths.iter().map(|&w| "-".repeat(w)).collect::<Vec<_>>().join("-+-");
    for c in cells {
        out.push('\n');
        out += &line(c);
    }
    out
}

/// What the fleet table's rows and columns are, under it in the Markdown.
pub const EXPLAINED: &str = "\
Shapes: one topic of 100,000 partitions over 10,000 consumers; 10,000 topics of 16 partitions \
over 4 consumers each, all planned in one pass as the leader's `plan_all` does (every topic, \
changed or not). *count*: every weight equal (`Balanced`); *load*: `--placement load` \
(`LoadBalanced`, default tolerance, minimum gain and budget of 10 moves a minute, fresh \
memory), weights drawn from Zipf(1.1) over 1..=1000 with seed 42. Cases: *fresh*, every \
consumer registered and nobody owning anything; *steady*, the fresh plan's result (its \
handoffs completed, planned again until it starts nothing); *one joins*, *one drains* \
(`Deregister`), *one dies* (its registration gone): from steady, in the one topic or in the \
first of the 10,000. *moves*: handoffs started plus direct assignments in the plan (a join \
starts at most 4 warms per consumer, `max_warming_per_consumer`); *writes*: what \
`diff_writes` returns. Times in ms, median (min–max) of 11 runs, each quantity on the whole \
fleet: *clone*, cloning every topic's `TopicState` (the baseline: the leader builds and \
clones each state on every pass anyway); *target*, the `Assignor`'s target alone \
(`Balanced::assign` or `LoadBalanced::assign` over a `Placement` built beforehand); *plan*, \
`plan_placed` (targets, then settling, direct assignments and handoffs) and `diff_writes` \
of every topic, on a clone made beforehand: the leader's whole pure work per pass. \
*plan/clone* is the ratio of the medians, the number to compare across machines (in the \
*fresh* rows nobody owns anything, so the clone is small and the ratio large).\n";
