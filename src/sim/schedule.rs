//! What a schedule does, drawn from its seed before it runs: consumer actions and faults at
//! virtual times. Reactions (a consumer answering a warm, reconnecting after its stream
//! ended) are drawn as they happen, by the cluster, from the same generator.

use std::time::Duration;

use super::{Rng, SimConfig};

/// The kinds of schedules; a seed's kind follows from the seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Consumer actions and every fault, mixed.
    Mixed,
    /// The cluster settles, then the store is out for less than the settle period while
    /// consumers come straight back: nothing may move.
    Outage,
    /// A scripted scenario ([`SimConfig::scenario`]): no faults but its own.
    Scenario,
}

impl Kind {
    /// The kind of `seed`'s schedule: one in eight is an outage.
    pub fn of(seed: u64) -> Self {
        if seed % 8 == 7 { Kind::Outage } else { Kind::Mixed }
    }
}

/// One scheduled action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The consumer (re)starts, as a new incarnation, and registers on a random instance.
    Start(usize),
    /// The consumer's process dies (its stream breaks; the instance hears it late).
    Crash(usize),
    /// The consumer drops its stream and registers on another instance (same process).
    Reconnect(usize),
    /// The consumer stops reading and calling for this long (µs).
    Pause(usize, u64),
    /// The consumer deregisters: draining, or shutting down (to return later).
    Deregister(usize, bool),
    /// The instance's process dies.
    InstanceCrash(usize),
    /// The instance (re)starts, as a fresh state.
    InstanceStart(usize),
    /// The instance is cut off from the store for this long (µs): its requests fail or
    /// are lost, its watch hangs; its lease keeper's own connection too.
    Cut(usize, u64),
    /// Only the instance's connection is cut (its watch ends, its requests fail) while its
    /// lease keeper's connection works: the relay must fence on its own.
    MainCut(usize, u64),
    /// Only the lease keeper's connection is cut while the instance follows the store: the
    /// lease must fence on its own.
    KeeperCut(usize, u64),
    /// The store is out for this long (µs).
    Outage(u64),
    /// The instance's watch is cut (it ends with an error).
    WatchCut(usize),
    /// The store compacts its history up to a recent revision.
    Compact,
    /// The store expires the instance's session early.
    Revoke(usize),
    /// Answers are lost one time in five, for this long (µs).
    Lossy(u64),
    /// The store expires the instance's session early while each of its consumers moves
    /// to another instance, its old stream left half-open for a while.
    RevokeAndMove(usize),
}

/// The actions of one schedule, by virtual time (µs), and when its faults end.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// (time, action), in time order.
    pub actions: Vec<(u64, Action)>,
    /// When the faults stop and every consumer comes back.
    pub quiet_at: u64,
    /// The outage of an [`Kind::Outage`] schedule: (start, end).
    pub outage: Option<(u64, u64)>,
}

fn us(d: Duration) -> u64 {
    d.as_micros() as u64
}

impl Schedule {
    /// Draws the schedule of `kind` for `config`.
    pub fn draw(kind: Kind, config: &SimConfig, rng: &mut Rng) -> Self {
        match kind {
            Kind::Mixed => Self::mixed(config, rng),
            Kind::Outage => Self::outage(config, rng),
            Kind::Scenario => Self::scenario(config, rng),
        }
    }

    fn mixed(config: &SimConfig, rng: &mut Rng) -> Self {
        let ttl = us(config.ttl);
        let mut actions: Vec<(u64, Action)> =
            (0..config.consumers).map(|c| (rng.below(300_000), Action::Start(c))).collect();
        let mut t = 300_000;
        let (n, m) = (config.consumers, config.instances);
        for _ in 0..config.actions {
            t += 5_000 + rng.below(40_000);
            let c = rng.index(n);
            let i = rng.index(m);
            let action = match rng.below(100) {
                0..=19 => Action::Start(c),
                20..=31 => Action::Crash(c),
                32..=41 => Action::Reconnect(c),
                42..=49 => Action::Pause(c, rng.below(ttl)),
                50..=57 => Action::Deregister(c, rng.percent(50)),
                58..=62 => Action::InstanceCrash(i),
                63..=70 => Action::InstanceStart(i),
                71..=72 => Action::Cut(i, rng.below(ttl * 2)),
                73 => Action::MainCut(i, ttl / 2 + rng.below(ttl * 4)),
                74..=75 => Action::KeeperCut(i, ttl / 2 + rng.below(ttl * 2)),
                76..=78 => Action::Outage(rng.below(ttl * 2)),
                79..=83 => Action::WatchCut(i),
                84..=87 => Action::Compact,
                88..=90 => Action::Revoke(i),
                91..=93 => Action::RevokeAndMove(i),
                _ => Action::Lossy(rng.below(ttl)),
            };
            actions.push((t, action));
        }
        actions.sort_by_key(|(t, _)| *t);
        Self { actions, quiet_at: t + 1, outage: None }
    }

    /// A scenario's schedule: the consumers start, spread over a window that grows with
    /// their number (a fleet does not start in one instant); the scenario does the rest.
    fn scenario(config: &SimConfig, rng: &mut Rng) -> Self {
        let window = 300_000 + 10 * config.consumers as u64;
        let mut actions: Vec<(u64, Action)> =
            (0..config.consumers).map(|c| (rng.below(window), Action::Start(c))).collect();
        actions.sort_by_key(|(t, _)| *t);
        Self { actions, quiet_at: u64::MAX, outage: None }
    }

    fn outage(config: &SimConfig, rng: &mut Rng) -> Self {
        let ttl = us(config.ttl);
        let settle = config.settle.map_or(ttl, us);
        let mut actions: Vec<(u64, Action)> =
            (0..config.consumers).map(|c| (rng.below(300_000), Action::Start(c))).collect();
        // Long enough for the cluster to settle first.
        let start = 300_000 + us(config.converge_within) / 2;
        let length = settle / 3 + rng.below(settle / 2);
        actions.push((start, Action::Outage(length)));
        actions.sort_by_key(|(t, _)| *t);
        let end = start + length;
        Self { actions, quiet_at: end + settle + 2 * ttl, outage: Some((start, end)) }
    }
}
