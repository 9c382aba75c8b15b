//! Simulation of the handoff state machine (DESIGN.md §5, §8): seeded random schedules of
//! joins, crashes, drains, `PartitionReady` / `PartitionReleased` calls (right and wrong)
//! and leader ticks, driving [`kafka_assigner::handoff::step`] with the invariants checked
//! after every step.
//!
//! # The model
//!
//! * One topic with `P` partitions (random in `1..=24`) and a pool of six consumer names
//!   (`c0`..`c5`); `ghost` and the empty name never join. `PlanConfig` has a 5 s warm and a
//!   3 s release limit and a random warm cap in `1..=4`. Time is a `u64` millisecond counter
//!   the test advances (a little on every step, more on ticks, sometimes past both limits);
//!   no real clock is read and nothing sleeps.
//! * A schedule is 200 random steps: `Joined` (a name that is not live), `Expired` (a crash
//!   of a live one, or a drained consumer leaving), `Draining`, `Ready` / `Released`
//!   answering a pending warm / release, wrong calls, `Tick`, and leader failovers (the
//!   leader's in-memory [`Cooldowns`] are lost).
//! * The relay is modelled exactly as an instance runs it: every live consumer has the
//!   [`ConsumerView`] it was last `told`; after every step, for every consumer,
//!   `diff_views(told, ConsumerView::of(state, name))` is delivered and becomes `told`. A
//!   consumer that dies loses its view; one that (re-)joins starts from the empty view, so it
//!   gets a snapshot.
//! * Each consumer is a client that only knows what it was sent: its *belief* (partitions
//!   it thinks it owns: added by `assigned`, removed by `unassigned` or `Release`), the
//!   warms it was asked for (dropped by `assigned` / `unassigned`) and the releases it was
//!   asked for. "Correct" calls answer one of those; "wrong" calls use random or unknown
//!   names, out-of-range partitions, repeated calls and swapped roles. A draining consumer
//!   that is idle leaves (expires) at a later step.
//! * Every call is also checked against a small reference model of §5.3/§5.4/§5.7 (which
//!   calls are accepted, with which refusal, and what an accepted call changes).
//!
//! # Checked after every step
//!
//! * a refused call changes nothing (and so writes nothing); applying the returned
//!   [`Write`]s to the old state gives exactly the new one, and every write changes
//!   something; membership events write nothing;
//! * handoffs: a warming handoff's `from` is the owner, a releasing handoff's `to` is the
//!   owner, `from != to`, no consumer warms more than `max_warming_per_consumer`;
//! * no command contradicts the state (`assigned` ⇒ owner, `Warm` ⇒ warming handoff to the
//!   consumer from the named owner, `Release` ⇒ releasing handoff from it to the named owner,
//!   `unassigned` ⇒ not the owner and not warming), `Assignment` comes first, and nothing is
//!   sent to a consumer that is not live;
//! * the ownership invariant of §5: every partition is believed owned by at most one live
//!   consumer, and each live consumer's belief is exactly what it owns;
//! * owners are names that joined at some point; partitions are `< P`;
//! * after a tick: no live owner is replaced without a handoff, a partition without a live
//!   owner goes straight to an active consumer (§5.1), no handoff has a dead or draining
//!   target or a dead source (§5.5), none is past its time limit (§5.6), and a new handoff
//!   is a warm from a live owner to an active consumer.
//!
//! After the schedule the fleet is quiesced (no more joins or crashes; every warm and
//! release is answered, drained consumers leave, time passes) until nothing changes; then,
//! if a consumer is active, every partition has exactly one active owner, the assignment is
//! balanced, no handoff is left and every belief equals the owned set.
//!
//! `SIM_SCHEDULES=N` runs N schedules (default 1,000), `SIM_BASE_SEED=B` starts the seeds
//! at B, `SIM_SEED=S` replays one. Schedules are independent and run on a few threads (the
//! result does not depend on how many). A failure prints its seed, the last steps with the
//! commands each consumer was sent, and the state. With many schedules the test also checks
//! that every interesting path was taken (accepted and refused calls of every kind, warm
//! and release timeouts, crashes, drains, settled fleets), so it cannot pass vacuously.
//!
//! A second random test runs tiny topics (`P` in `0..=2`, one or two consumers); scripted
//! tests cover no partitions and a single consumer.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::ops::RangeInclusive;
use std::panic::{AssertUnwindSafe, catch_unwind};

use kafka_assigner::handoff::{
    Command, ConsumerStatus, ConsumerView, Cooldowns, Event, HandoffError, Millis, Phase, PlanConfig,
    TopicState, Write, diff_views, step,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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

/// Names that never join.
const UNKNOWN: [&str; 2] = ["ghost", ""];
/// How many steps the failure report shows.
const LOG_LEN: usize = 30;

macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(format!($($arg)+));
        }
    };
}

/// Applies one persisted write to a state (owners and handoffs only).
fn apply(state: &mut TopicState, write: &Write) {
    match write {
        Write::SetOwner { partition, owner } => {
            state.owners.insert(*partition, owner.clone());
        }
        Write::ClearOwner { partition } => {
            state.owners.remove(partition);
        }
        Write::PutHandoff { partition, handoff } => {
            state.handoffs.insert(*partition, handoff.clone());
        }
        Write::DeleteHandoff { partition } => {
            state.handoffs.remove(partition);
        }
    }
}

/// Why the reference model refuses a call (DESIGN.md §5.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    OutOfRange,
    Unknown,
    NotWarming,
    NotReleasing,
}

impl Refusal {
    fn of(err: &HandoffError) -> Self {
        match err {
            HandoffError::PartitionOutOfRange { .. } => Refusal::OutOfRange,
            HandoffError::UnknownConsumer(_) => Refusal::Unknown,
            HandoffError::NotWarmingTarget { .. } => Refusal::NotWarming,
            HandoffError::NotReleasing { .. } => Refusal::NotReleasing,
        }
    }
}

/// The reference model of `PartitionReady` (`ready`) and `PartitionReleased`: the state an
/// accepted call leads to, or why it is refused.
fn expected_call(
    state: &TopicState,
    ready: bool,
    c: &str,
    p: u32,
    now: Millis,
) -> Result<TopicState, Refusal> {
    if p >= state.partition_count {
        return Err(Refusal::OutOfRange);
    }
    if !state.consumers.contains_key(c) {
        return Err(Refusal::Unknown);
    }
    let mut next = state.clone();
    let handoff = state.handoffs.get(&p);
    if ready {
        match handoff {
            // §5.3: owner = B and phase Releasing, in one step.
            Some(h) if h.to == c && h.phase == Phase::Warming => {
                next.owners.insert(p, c.to_string());
                let h = next.handoffs.get_mut(&p).expect("handoff exists");
                h.phase = Phase::Releasing;
                h.since = now;
            }
            // A retried ready from the consumer that already owns it: accepted, no change.
            Some(h) if h.to == c => {}
            None if state.owners.get(&p).map(String::as_str) == Some(c) => {}
            _ => return Err(Refusal::NotWarming),
        }
    } else {
        match handoff {
            // §5.4: the handoff is removed.
            Some(h) if h.phase == Phase::Releasing && h.from == c => {
                next.handoffs.remove(&p);
            }
            _ => return Err(Refusal::NotReleasing),
        }
    }
    Ok(next)
}

/// What the test knows about one name of the pool: whether it is live, and, as a client,
/// only what it was sent.
#[derive(Clone, Debug, Default)]
struct Client {
    live: bool,
    /// The view the relay last sent (the relay's memory, not the client's).
    told: ConsumerView,
    /// Partitions the client believes it owns.
    belief: BTreeSet<u32>,
    /// Warms it was asked for and not told to drop: partition → current owner.
    warms: BTreeMap<u32, String>,
    /// Releases it was asked for and has not answered: partition → new owner.
    releases: BTreeMap<u32, String>,
}

/// The shape of the schedules of one test.
#[derive(Clone, Debug)]
struct Params {
    partitions: RangeInclusive<u32>,
    pool: RangeInclusive<usize>,
    steps: usize,
}

/// Counts across schedules, to check the simulation reaches the interesting paths.
#[derive(Clone, Debug, Default)]
struct Stats {
    ready_ok: u64,
    released_ok: u64,
    refused: BTreeMap<String, u64>,
    handoffs_started: u64,
    direct_assignments: u64,
    warm_timeouts: u64,
    release_timeouts: u64,
    crashes: u64,
    drained_left: u64,
    settled_with_active: u64,
    quiesce_rounds_max: u64,
    steps: u64,
}

impl Stats {
    fn add(&mut self, other: &Stats) {
        self.ready_ok += other.ready_ok;
        self.released_ok += other.released_ok;
        for (k, v) in &other.refused {
            *self.refused.entry(k.clone()).or_default() += v;
        }
        self.handoffs_started += other.handoffs_started;
        self.direct_assignments += other.direct_assignments;
        self.warm_timeouts += other.warm_timeouts;
        self.release_timeouts += other.release_timeouts;
        self.crashes += other.crashes;
        self.drained_left += other.drained_left;
        self.settled_with_active += other.settled_with_active;
        self.quiesce_rounds_max = self.quiesce_rounds_max.max(other.quiesce_rounds_max);
        self.steps += other.steps;
    }
}

struct Sim {
    seed: u64,
    rng: StdRng,
    names: Vec<String>,
    config: PlanConfig,
    state: TopicState,
    cooldowns: Cooldowns,
    now: Millis,
    clients: BTreeMap<String, Client>,
    ever_joined: BTreeSet<String>,
    /// The last accepted Ready / Released call, for duplicates.
    last_call: Option<Event>,
    steps: usize,
    step_no: usize,
    log: VecDeque<LogEntry>,
    stats: Stats,
}

impl Sim {
    fn new(seed: u64, params: &Params) -> Self {
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

    fn with(partitions: u32, pool: usize, config: PlanConfig) -> Self {
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
        }
    }

    fn p(&self) -> u32 {
        self.state.partition_count
    }

    fn note(&mut self, entry: LogEntry) {
        if self.log.len() == LOG_LEN {
            self.log.pop_front();
        }
        self.log.push_back(entry);
    }

    fn report(&self, msg: &str) -> String {
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

    fn live_names(&self) -> Vec<String> {
        self.names.iter().filter(|n| self.clients[*n].live).cloned().collect()
    }

    fn drained(&self) -> Vec<String> {
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

    fn run(&mut self) -> Result<(), String> {
        for _ in 0..self.steps {
            self.random_step()?;
        }
        self.quiesce()
    }

    fn tick(&mut self, advance: Millis) -> Result<(), String> {
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
    fn do_step(&mut self, event: Event) -> Result<(), String> {
        self.step_no += 1;
        let before = self.state.clone();
        let expected: Option<Result<TopicState, Refusal>> = match &event {
            Event::Ready(c, p) => Some(expected_call(&before, true, c, *p, self.now)),
            Event::Released(c, p) => Some(expected_call(&before, false, c, *p, self.now)),
            Event::Joined(c) => {
                let mut s = before.clone();
                s.consumers.insert(c.clone(), ConsumerStatus::Active);
                Some(Ok(s))
            }
            Event::Expired(c) => {
                let mut s = before.clone();
                s.consumers.remove(c);
                Some(Ok(s))
            }
            Event::Draining(c) => {
                let mut s = before.clone();
                if let Some(status) = s.consumers.get_mut(c) {
                    *status = ConsumerStatus::Draining;
                }
                Some(Ok(s))
            }
            Event::Tick(_) => None,
        };
        let result = step(&mut self.state, &event, self.now, &self.config, &mut self.cooldowns);
        let outcome = match &result {
            Ok(writes) => Ok(writes.len()),
            Err(e) => Err(e.clone()),
        };
        let what = Logged::Step(event.clone(), outcome);
        self.note(LogEntry { step: self.step_no, now: self.now, what, sent: Vec::new() });

        // Writes, refusals and the reference model.
        match &result {
            Err(_) => ensure!(self.state == before, "a refused call changed the state"),
            Ok(writes) => {
                let mut applied = before.clone();
                applied.consumers = self.state.consumers.clone();
                for (i, w) in writes.iter().enumerate() {
                    let p = w.partition();
                    ensure!(
                        i == 0 || writes[i - 1].partition() <= p,
                        "writes not in partition order: {writes:?}"
                    );
                    let changes = match w {
                        Write::SetOwner { owner, .. } => applied.owners.get(&p) != Some(owner),
                        Write::ClearOwner { .. } => applied.owners.contains_key(&p),
                        Write::PutHandoff { handoff, .. } => applied.handoffs.get(&p) != Some(handoff),
                        Write::DeleteHandoff { .. } => applied.handoffs.contains_key(&p),
                    };
                    ensure!(changes, "write {w:?} changes nothing");
                    apply(&mut applied, w);
                }
                ensure!(
                    applied == self.state,
                    "the writes {writes:?} applied to the old state do not give the new state"
                );
                if !matches!(event, Event::Tick(_) | Event::Ready(..) | Event::Released(..)) {
                    ensure!(writes.is_empty(), "a membership event wrote {writes:?}");
                }
            }
        }
        if let Some(expected) = expected {
            match (expected, &result) {
                (Ok(s), Ok(_)) => ensure!(s == self.state, "expected state {s:#?}"),
                (Err(r), Err(e)) => ensure!(r == Refusal::of(e), "expected refusal {r:?}, got {e:?}"),
                (Ok(_), Err(e)) => return Err(format!("expected the call to be accepted, got {e:?}")),
                (Err(r), Ok(_)) => return Err(format!("expected refusal {r:?}, the call was accepted")),
            }
        }
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

        self.deliver_all()?;
        self.check_state()
    }

    /// The relay: every consumer gets the diff of what it was told and its view now.
    fn deliver_all(&mut self) -> Result<(), String> {
        for i in 0..self.names.len() {
            let name = self.names[i].clone();
            let view = ConsumerView::of(&self.state, &name);
            let client = &self.clients[&name];
            let cmds = diff_views(&client.told, &view);
            ensure!(
                client.live == self.state.is_live(&name),
                "{name}: test thinks live={}, state disagrees",
                client.live
            );
            if !client.live {
                ensure!(view == ConsumerView::default(), "{name} is not live but has a view {view:?}");
                ensure!(cmds.is_empty(), "{cmds:?} sent to {name}, which is not live");
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
            let client = &self.clients[&name];
            ensure!(
                client.belief == client.told.owned,
                "{name} believes it owns {:?} but owns {:?}",
                client.belief,
                client.told.owned
            );
            ensure!(
                client.warms == client.told.warming,
                "{name} was asked to warm {:?} but is warming {:?}",
                client.warms,
                client.told.warming
            );
            for (p, to) in &client.told.releasing {
                ensure!(client.releases.get(p) == Some(to), "{name} was never asked to release {p} to {to}");
            }
        }
        for name in UNKNOWN {
            ensure!(ConsumerView::of(&self.state, name) == ConsumerView::default(), "'{name}' has a view");
        }
        // The ownership invariant of DESIGN.md §5.
        let mut believer: Vec<Option<&str>> = vec![None; self.p() as usize];
        for (name, client) in self.clients.iter().filter(|(_, c)| c.live) {
            for &p in &client.belief {
                let slot = believer
                    .get_mut(p as usize)
                    .ok_or_else(|| format!("{name} believes it owns {p} >= P"))?;
                if let Some(other) = slot {
                    return Err(format!("partition {p} is believed owned by {other} and {name}"));
                }
                *slot = Some(name);
            }
        }
        Ok(())
    }

    /// One consumer receives its commands; each is checked against the state.
    fn deliver(&mut self, name: &str, cmds: &[Command]) -> Result<(), String> {
        let state = &self.state;
        let client = self.clients.get_mut(name).expect("pool name");
        let owner = |p: &u32| state.owners.get(p).map(String::as_str);
        for (i, cmd) in cmds.iter().enumerate() {
            match cmd {
                Command::Assignment { assigned, unassigned } => {
                    ensure!(i == 0, "{name}: Assignment is not the first command: {cmds:?}");
                    ensure!(!assigned.is_empty() || !unassigned.is_empty(), "{name}: empty Assignment");
                    ensure!(
                        assigned.windows(2).all(|w| w[0] < w[1]),
                        "{name}: assigned not sorted: {cmds:?}"
                    );
                    ensure!(
                        unassigned.windows(2).all(|w| w[0] < w[1]),
                        "{name}: unassigned not sorted: {cmds:?}"
                    );
                    for p in assigned {
                        ensure!(owner(p) == Some(name), "{name} assigned {p}, owned by {:?}", owner(p));
                        ensure!(!client.belief.contains(p), "{name} assigned {p}, which it already had");
                        client.belief.insert(*p);
                        client.warms.remove(p);
                    }
                    for p in unassigned {
                        ensure!(!assigned.contains(p), "{name}: {p} both assigned and unassigned");
                        ensure!(owner(p) != Some(name), "{name} unassigned {p}, which it owns");
                        let warming =
                            state.handoffs.get(p).is_some_and(|h| h.phase == Phase::Warming && h.to == name);
                        ensure!(!warming, "{name} unassigned {p}, which it is warming");
                        ensure!(
                            client.belief.contains(p) || client.warms.contains_key(p),
                            "{name} unassigned {p}, which it neither owned nor warmed"
                        );
                        client.belief.remove(p);
                        client.warms.remove(p);
                    }
                }
                Command::Warm { partition, current_owner } => {
                    let ok = state.handoffs.get(partition).is_some_and(|h| {
                        h.phase == Phase::Warming && h.to == name && h.from == *current_owner
                    });
                    ensure!(
                        ok,
                        "{name} told to warm {partition} from {current_owner}: no such warming handoff"
                    );
                    ensure!(owner(partition) == Some(current_owner.as_str()), "Warm names a non-owner");
                    client.warms.insert(*partition, current_owner.clone());
                }
                Command::Release { partition, new_owner } => {
                    let ok = state
                        .handoffs
                        .get(partition)
                        .is_some_and(|h| h.phase == Phase::Releasing && h.from == name && h.to == *new_owner);
                    ensure!(
                        ok,
                        "{name} told to release {partition} to {new_owner}: no such releasing handoff"
                    );
                    ensure!(owner(partition) == Some(new_owner.as_str()), "Release names a non-owner");
                    client.belief.remove(partition);
                    client.releases.insert(*partition, new_owner.clone());
                }
            }
        }
        Ok(())
    }

    /// Invariants of the state after any step.
    fn check_state(&self) -> Result<(), String> {
        let s = &self.state;
        for name in s.consumers.keys() {
            ensure!(self.clients.get(name).is_some_and(|c| c.live), "'{name}' is live in the state only");
        }
        for (p, o) in &s.owners {
            ensure!(*p < self.p(), "owner record for partition {p} >= P");
            ensure!(self.ever_joined.contains(o), "partition {p} owned by '{o}', which never joined");
        }
        let mut warming: BTreeMap<&str, usize> = BTreeMap::new();
        for (p, h) in &s.handoffs {
            ensure!(*p < self.p(), "handoff for partition {p} >= P");
            ensure!(h.from != h.to, "handoff of {p} from {} to itself", h.from);
            ensure!(
                self.ever_joined.contains(&h.from) && self.ever_joined.contains(&h.to),
                "handoff of {p} names a consumer that never joined: {h:?}"
            );
            ensure!(h.since <= self.now, "handoff of {p} starts in the future: {h:?}");
            let owner = s.owners.get(p);
            match h.phase {
                Phase::Warming => {
                    ensure!(
                        owner == Some(&h.from),
                        "warming handoff of {p} {h:?}, but the owner is {owner:?}"
                    );
                    *warming.entry(h.to.as_str()).or_default() += 1;
                }
                Phase::Releasing => {
                    ensure!(
                        owner == Some(&h.to),
                        "releasing handoff of {p} {h:?}, but the owner is {owner:?}"
                    )
                }
            }
        }
        for (to, n) in warming {
            ensure!(
                n <= self.config.max_warming_per_consumer,
                "{to} warms {n} partitions, more than {}",
                self.config.max_warming_per_consumer
            );
        }
        Ok(())
    }

    /// What the leader's reconcile at `at` must have done (DESIGN.md §5.1, §5.5, §5.6).
    fn check_tick(&mut self, before: &TopicState, at: Millis) -> Result<(), String> {
        let s = &self.state;
        let any_active = s.consumers.values().any(|st| *st == ConsumerStatus::Active);
        for (p, h) in &before.handoffs {
            if s.handoffs.get(p) == Some(h) {
                continue;
            }
            let age = at.saturating_sub(h.since);
            let live = s.is_live(&h.from) && s.is_live(&h.to);
            match h.phase {
                Phase::Warming if live && age >= self.config.warm_timeout_ms => self.stats.warm_timeouts += 1,
                Phase::Releasing if live && age >= self.config.release_timeout_ms => {
                    self.stats.release_timeouts += 1
                }
                _ => {}
            }
        }
        for (p, h) in &s.handoffs {
            let age = at - h.since;
            match h.phase {
                Phase::Warming => {
                    ensure!(s.is_live(&h.from), "after a tick, warming handoff of {p} from dead {}", h.from);
                    ensure!(
                        s.is_active(&h.to),
                        "after a tick, warming handoff of {p} to non-active {}",
                        h.to
                    );
                    ensure!(age < self.config.warm_timeout_ms, "after a tick, warm of {p} is past its limit");
                }
                Phase::Releasing => {
                    ensure!(
                        s.is_live(&h.from),
                        "after a tick, releasing handoff of {p} from dead {}",
                        h.from
                    );
                    ensure!(
                        age < self.config.release_timeout_ms,
                        "after a tick, release of {p} is past its limit"
                    );
                }
            }
            if before.handoffs.get(p) != Some(h) {
                ensure!(
                    h.phase == Phase::Warming && h.since == at,
                    "a tick created a handoff that is not a new warm: {h:?}"
                );
                self.stats.handoffs_started += 1;
            }
        }
        for p in 0..self.p() {
            let (old, new) = (before.owners.get(&p), s.owners.get(&p));
            if old != new {
                ensure!(
                    old.is_none_or(|o| !before.is_live(o)),
                    "a tick took {p} from live owner {old:?} without a handoff (now {new:?})"
                );
                ensure!(new.is_some_and(|o| s.is_active(o)), "a tick gave {p} to non-active {new:?}");
                self.stats.direct_assignments += 1;
            }
            if any_active {
                let live_owner = new.is_some_and(|o| s.is_live(o));
                let releasing = s.handoffs.get(&p).is_some_and(|h| h.phase == Phase::Releasing);
                ensure!(
                    live_owner || releasing,
                    "after a tick, {p} has no live owner ({new:?}) though a consumer is active"
                );
            }
        }
        Ok(())
    }

    /// No more joins or crashes: answer everything, let drained consumers leave, let time
    /// pass, until nothing changes; then check the stable fleet.
    fn quiesce(&mut self) -> Result<(), String> {
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
            if self.state == start && self.cooldowns.0.is_empty() {
                self.stats.quiesce_rounds_max = round + 1;
                return self.check_settled();
            }
        }
        Err(format!("the fleet did not settle within {bound} quiesce rounds"))
    }

    fn check_settled(&mut self) -> Result<(), String> {
        let s = &self.state;
        self.step_no += 1;
        ensure!(s.handoffs.is_empty(), "settled with handoffs left: {:?}", s.handoffs);
        let active: Vec<&String> =
            s.consumers.iter().filter(|(_, st)| **st == ConsumerStatus::Active).map(|(n, _)| n).collect();
        if !active.is_empty() {
            self.stats.settled_with_active += 1;
            ensure!(
                s.consumers.len() == active.len(),
                "settled with draining consumers that did not leave: {:?}",
                s.consumers
            );
            let mut counts: BTreeMap<&str, u32> = active.iter().map(|n| (n.as_str(), 0)).collect();
            for p in 0..self.p() {
                let owner = s.owners.get(&p);
                ensure!(owner.is_some_and(|o| s.is_active(o)), "settled: partition {p} owned by {owner:?}");
                *counts.get_mut(owner.expect("checked").as_str()).expect("active") += 1;
            }
            ensure!(s.owners.len() as u32 == self.p(), "settled with extra owner records");
            let n = active.len() as u32;
            let (lo, hi) = (self.p() / n, self.p().div_ceil(n));
            for (c, k) in &counts {
                ensure!(*k >= lo && *k <= hi, "unbalanced: {c} owns {k}, expected {lo}..={hi} ({counts:?})");
            }
        }
        for (name, client) in self.clients.iter().filter(|(_, c)| c.live) {
            let owned: BTreeSet<u32> = s.owners.iter().filter(|(_, o)| *o == name).map(|(p, _)| *p).collect();
            ensure!(client.belief == owned, "settled: {name} believes {:?}, owns {owned:?}", client.belief);
            ensure!(client.warms.is_empty(), "settled: {name} still asked to warm {:?}", client.warms);
            ensure!(
                client.releases.is_empty(),
                "settled: {name} still asked to release {:?}",
                client.releases
            );
        }
        Ok(())
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(value.trim().parse().unwrap_or_else(|_| panic!("{name}={value} is not a number")))
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_string()
    }
}

/// Runs some schedules; returns their summed stats, the failing seeds and the report of
/// the first failure.
fn run_chunk(seeds: &[u64], params: &Params) -> (Stats, Vec<u64>, Option<String>) {
    let mut total = Stats::default();
    let mut failed: Vec<u64> = Vec::new();
    let mut first_report = None;
    for &seed in seeds {
        let mut sim = Sim::new(seed, params);
        let outcome = catch_unwind(AssertUnwindSafe(|| sim.run()));
        let error = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(msg)) => Some(msg),
            Err(payload) => Some(format!("panicked: {}", panic_message(payload.as_ref()))),
        };
        match error {
            None => {
                sim.stats.steps = sim.step_no as u64;
                total.add(&sim.stats)
            }
            Some(msg) => {
                failed.push(seed);
                if first_report.is_none() {
                    first_report = Some(sim.report(&msg));
                }
            }
        }
    }
    (total, failed, first_report)
}

/// Runs the schedules of one test (`SIM_SEED`, `SIM_SCHEDULES`, `SIM_BASE_SEED`) and
/// returns the summed stats; panics with the first failure's report.
fn run_schedules(test: &str, params: &Params, default_base: u64, default_count: u64) -> (u64, Stats) {
    let seeds: Vec<u64> = match env_u64("SIM_SEED") {
        Some(seed) => vec![seed],
        None => {
            let base = env_u64("SIM_BASE_SEED").unwrap_or(default_base);
            let count = env_u64("SIM_SCHEDULES").unwrap_or(default_count);
            (0..count).map(|i| base.wrapping_add(i)).collect()
        }
    };
    // Schedules are independent: run contiguous chunks of seeds on a few threads. The
    // outcome does not depend on the number of threads.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8);
    let chunk = seeds.len().div_ceil(threads).max(1);
    let results: Vec<(Stats, Vec<u64>, Option<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> =
            seeds.chunks(chunk).map(|seeds| scope.spawn(move || run_chunk(seeds, params))).collect();
        handles.into_iter().map(|h| h.join().expect("simulation thread")).collect()
    });
    let mut total = Stats::default();
    let mut failed: Vec<u64> = Vec::new();
    let mut first_report = None;
    // Chunks are in seed order, so the first report found is the smallest failing seed's.
    for (stats, seeds, report) in results {
        total.add(&stats);
        failed.extend(seeds);
        if first_report.is_none() {
            first_report = report;
        }
    }
    if let Some(report) = first_report {
        let shown: Vec<String> = failed.iter().take(20).map(u64::to_string).collect();
        panic!(
            "{} of {} schedules failed (seeds {}{}).\nFirst failure, {report}\nreplay: SIM_SEED={} cargo test --test simulation {test}",
            failed.len(),
            seeds.len(),
            shown.join(", "),
            if failed.len() > shown.len() { ", ..." } else { "" },
            failed[0]
        );
    }
    (seeds.len() as u64, total)
}

#[test]
fn random_schedules_keep_the_handoff_invariants() {
    let params = Params { partitions: 1..=24, pool: 6..=6, steps: 200 };
    let (n, stats) =
        run_schedules("random_schedules_keep_the_handoff_invariants", &params, 0x5eed_0000, 1_000);
    eprintln!("{n} schedules: {stats:?}");
    // With many schedules, every interesting path must have been taken (so the simulation
    // cannot pass by never reaching them).
    if n >= 200 {
        ensure_coverage(&stats, true);
    }
}

fn ensure_coverage(stats: &Stats, timeouts: bool) {
    assert!(stats.ready_ok > 0 && stats.released_ok > 0, "{stats:?}");
    assert!(stats.handoffs_started > 0 && stats.direct_assignments > 0, "{stats:?}");
    assert!(stats.crashes > 0 && stats.drained_left > 0 && stats.settled_with_active > 0, "{stats:?}");
    for kind in ["OutOfRange", "Unknown", "NotWarming", "NotReleasing"] {
        assert!(stats.refused.get(kind).is_some_and(|n| *n > 0), "no {kind} refusal: {stats:?}");
    }
    if timeouts {
        assert!(stats.warm_timeouts > 0 && stats.release_timeouts > 0, "{stats:?}");
    }
}

/// Random schedules on the smallest topics and fleets: no partitions, one partition, one
/// or two consumers.
#[test]
fn random_schedules_on_tiny_topics() {
    let params = Params { partitions: 0..=2, pool: 1..=2, steps: 100 };
    let (n, stats) = run_schedules("random_schedules_on_tiny_topics", &params, 0x7171_0000, 300);
    if n >= 200 {
        ensure_coverage(&stats, false);
    }
}

fn scripted(partitions: u32, pool: usize) -> Sim {
    Sim::with(
        partitions,
        pool,
        PlanConfig { warm_timeout_ms: 5_000, release_timeout_ms: 3_000, max_warming_per_consumer: 2 },
    )
}

fn ok(result: Result<(), String>, sim: &Sim) {
    if let Err(msg) = result {
        panic!("{}", sim.report(&msg));
    }
}

#[test]
fn no_partitions() {
    let mut sim = scripted(0, 2);
    let r = (|| {
        sim.do_step(Event::Joined("c0".into()))?;
        sim.tick(10)?;
        ensure!(sim.state.owners.is_empty() && sim.state.handoffs.is_empty(), "P=0 got owners");
        sim.do_step(Event::Ready("c0".into(), 0))?; // refused: out of range
        sim.do_step(Event::Released("c0".into(), 0))?;
        ensure!(sim.stats.refused.get("OutOfRange") == Some(&2), "{:?}", sim.stats);
        sim.do_step(Event::Joined("c1".into()))?;
        sim.do_step(Event::Draining("c0".into()))?;
        ensure!(sim.drained() == vec!["c0".to_string()], "a draining consumer with nothing is drained");
        sim.quiesce()?;
        ensure!(sim.live_names() == vec!["c1".to_string()], "c0 left");
        Ok(())
    })();
    ok(r, &sim);
}

#[test]
fn single_consumer() {
    let mut sim = scripted(5, 2);
    let r = (|| {
        let c0 = || "c0".to_string();
        sim.do_step(Event::Joined(c0()))?;
        sim.tick(10)?;
        ensure!(sim.clients["c0"].belief.len() == 5, "the only consumer gets everything directly");
        ensure!(sim.state.handoffs.is_empty(), "no handoff without a live owner");
        // A crash and a re-join before the next tick resumes the partitions: the new
        // session gets them in its snapshot, and nothing moves.
        sim.do_step(Event::Expired(c0()))?;
        sim.do_step(Event::Joined(c0()))?;
        ensure!(sim.clients["c0"].belief.len() == 5, "re-join resumes from a snapshot");
        // Dead with nobody to take over: the partitions wait for it.
        sim.do_step(Event::Expired(c0()))?;
        sim.tick(10_000)?;
        ensure!(sim.state.owners.values().all(|o| o == "c0"), "no active consumer: nothing moves");
        sim.do_step(Event::Joined(c0()))?;
        // Draining with nobody to hand to: it keeps everything and is not idle.
        sim.do_step(Event::Draining(c0()))?;
        sim.tick(10)?;
        ensure!(sim.state.handoffs.is_empty() && sim.drained().is_empty(), "nobody to hand off to");
        // A second consumer arrives: the drained one hands everything over, then leaves.
        sim.do_step(Event::Joined("c1".into()))?;
        sim.quiesce()?;
        ensure!(sim.live_names() == vec!["c1".to_string()], "c0 drained and left");
        ensure!(sim.clients["c1"].belief.len() == 5, "c1 owns everything");
        Ok(())
    })();
    ok(r, &sim);
}

/// When the source of a warm dies and the warming consumer is no longer the partition's
/// target (the fleet changed since the warm started), the partition has no live owner, so
/// §5.1 applies: it goes straight to its target (c0 → c4), not to the warming consumer
/// and then on again with another handoff (c0 → c1 → c4), which §5.5 read literally would do.
#[test]
fn source_death_gives_the_partition_to_its_target() {
    let mut sim = scripted(4, 5);
    sim.config.max_warming_per_consumer = 4;
    let r = (|| {
        sim.do_step(Event::Joined("c0".into()))?;
        sim.tick(10)?;
        sim.do_step(Event::Joined("c1".into()))?;
        sim.tick(10)?; // c1 warms 2 and 3 from c0
        ensure!(sim.clients["c1"].warms.len() == 2, "c1 warms two partitions");
        for c in ["c2", "c3", "c4"] {
            sim.do_step(Event::Joined(c.into()))?;
        }
        sim.do_step(Event::Expired("c0".into()))?;
        // Target with c1..c4 active and c1's warms counted as done: c1 keeps 2; 0, 1 and 3
        // go to c2, c3 and c4.
        sim.tick(10)?;
        let owners: Vec<(u32, &str)> = sim.state.owners.iter().map(|(p, o)| (*p, o.as_str())).collect();
        ensure!(
            owners == vec![(0, "c2"), (1, "c3"), (2, "c1"), (3, "c4")] && sim.state.handoffs.is_empty(),
            "partition 3 should go straight to its target c4; owners {owners:?}, handoffs {:?}",
            sim.state.handoffs
        );
        Ok(())
    })();
    ok(r, &sim);
}
