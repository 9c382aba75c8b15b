//! Seeded schedules: the fleet's shape and its timed actions, all drawn from the seed
//! before the run starts, so what the driver does never depends on how the coordinator's
//! tasks interleave; and the keyed draws consumers make as they go.

use std::time::Duration;

pub use crate::sim_support::draws::Rng;
use crate::sim_support::draws::{actions_until, early_joins, rejoin_after};

/// What a schedule stresses besides consumer churn (every kind has churn).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Churn only: joins, leaves, crashes, moves.
    Calm,
    /// Lost answers with a lagging watch, often aimed at the give-back a join causes.
    Lossy,
    /// Delayed answers and watch batches.
    Delays,
    /// One instance cut off or stalled (its sessions expire once it was out of touch for a
    /// TTL, as the store would expire them).
    CutOffs,
    /// Instances crash and restart; consumers move between instances.
    Crashes,
    /// All of the above.
    Mixed,
}

/// The kinds in seed order: seed `s` runs `KINDS[s % KINDS.len()]`.
pub const KINDS: [Kind; 6] =
    [Kind::Calm, Kind::Lossy, Kind::Delays, Kind::CutOffs, Kind::Crashes, Kind::Mixed];

/// One timed action. Indices are taken modulo the pool / fleet; an action that does not
/// fit the moment (joining a consumer that is online) does nothing.
#[derive(Clone, Debug)]
pub enum Action {
    /// The consumer registers on this instance.
    Join { consumer: usize, instance: usize },
    /// The consumer deregisters through this instance (and does not come back).
    Leave { consumer: usize, instance: usize },
    /// The consumer process dies without deregistering; it registers again after `rejoin`.
    Crash { consumer: usize, rejoin: Option<Duration> },
    /// The consumer reconnects at once to this instance; with `half_open` its old stream
    /// stays open (the old instance has not noticed the connection died).
    Move { consumer: usize, instance: usize, half_open: bool },
    /// For `period`: the instance loses each write's answer with `chance` and the answers
    /// of its next `next_txns` transactions, and its watch lags its answers by `lag`.
    Lossy { instance: usize, chance: f64, next_txns: u32, lag: Duration, period: Duration },
    /// Every watch lags by `lag` and every instance but the joiner's loses its next
    /// transaction's answer, then the consumer joins: the give-back it causes is applied
    /// by the store, its answer lost, while the giver's cache lags.
    LossyJoin { consumer: usize, instance: usize, lag: Duration },
    /// The instance's answers and watch batches are delayed up to `high` for `period`.
    Delay { instance: usize, high: Duration, period: Duration },
    /// The instance is cut off from the store for `period`.
    CutOff { instance: usize, period: Duration },
    /// The instance's connection stalls for `period`; with `lose`, the held answers are
    /// lost when it ends (the connection resets).
    Stall { instance: usize, period: Duration, lose: bool },
    /// The instance process dies; a new one with the same id starts after `restart`.
    CrashInstance { instance: usize, restart: Duration },
}

/// The shape of one run.
#[derive(Clone, Debug)]
pub struct Shape {
    pub kind: Kind,
    pub instances: usize,
    pub pool: usize,
    pub partitions: u32,
    pub ttl: Duration,
    pub claim_interval: Duration,
    /// How long actions come before the fleet is left to settle.
    pub active: Duration,
    pub actions: Vec<(Duration, Action)>,
}

/// The salt of this simulation's seeds (`sim_support::draws::Rng`).
pub const SALT: u64 = 0x0F1E_E751_10DD_BA11;

impl Shape {
    /// Draws the shape and actions of schedule `seed`.
    pub fn draw(seed: u64) -> Shape {
        let kind = KINDS[(seed % KINDS.len() as u64) as usize];
        let mut rng = Rng::new(seed, SALT);
        let instances = 2 + rng.below(2) as usize;
        let mut pool = 2 + rng.below(4) as usize;
        let mut partitions = 1 + rng.below(12) as u32;
        let ttl = Duration::from_secs(2 + rng.below(2));
        let claim_interval = rng.millis(100, 300);
        let active = Duration::from_secs(12 + rng.below(9));
        // Everyone joins early, so each run starts from a populated fleet; but in lossy
        // runs some are left to join later, each join making the others give back.
        let mut early = pool;
        if kind == Kind::Lossy {
            pool = 3 + rng.below(3) as usize;
            partitions = 4 + rng.below(9) as u32;
            early = 2;
        }
        let (mut actions, at) =
            early_joins(&mut rng, early, |consumer, instance| Action::Join { consumer, instance });
        actions_until(&mut rng, &mut actions, at, active, (100, 900), |rng, _| {
            Some(draw_action(kind, ttl, rng))
        });
        Shape { kind, instances, pool, partitions, ttl, claim_interval, active, actions }
    }
}

fn churn(consumer: usize, instance: usize, ttl_ms: u64, rng: &mut Rng) -> Action {
    match rng.below(8) {
        0..=2 => Action::Join { consumer, instance },
        3 | 4 => {
            let rejoin = rejoin_after(rng, ttl_ms);
            Action::Crash { consumer, rejoin }
        }
        5 => Action::Leave { consumer, instance },
        _ => Action::Move { consumer, instance, half_open: rng.below(3) == 0 },
    }
}

fn draw_action(kind: Kind, ttl: Duration, rng: &mut Rng) -> Action {
    let (consumer, instance) = (rng.below(8) as usize, rng.below(8) as usize);
    let ttl_ms = ttl.as_millis() as u64;
    if kind == Kind::Calm || rng.below(10) < 5 {
        return churn(consumer, instance, ttl_ms, rng);
    }
    // A watch lag of several claim intervals, under the fencing margin (3/4 TTL).
    let lag = |rng: &mut Rng| rng.millis(300, ttl_ms * 7 / 10);
    let lossy = |rng: &mut Rng| match rng.below(3) {
        0 | 1 => Action::LossyJoin { consumer, instance, lag: lag(rng) },
        _ => Action::Lossy {
            instance,
            chance: 0.5 * rng.unit(),
            next_txns: rng.below(3) as u32,
            lag: if rng.below(3) == 0 { Duration::ZERO } else { lag(rng) },
            period: rng.millis(500, 4000),
        },
    };
    let delay =
        |rng: &mut Rng| Action::Delay { instance, high: rng.millis(5, 250), period: rng.millis(1000, 6000) };
    let cut = |rng: &mut Rng| match rng.below(3) {
        0 => Action::Stall { instance, period: rng.millis(ttl_ms / 4, 2 * ttl_ms), lose: rng.below(2) == 0 },
        _ => Action::CutOff { instance, period: rng.millis(ttl_ms / 4, 3 * ttl_ms) },
    };
    let crash = |rng: &mut Rng| match rng.below(2) {
        0 => Action::CrashInstance { instance, restart: rng.millis(200, 3 * ttl_ms) },
        _ => Action::Move { consumer, instance, half_open: rng.below(2) == 0 },
    };
    match kind {
        Kind::Calm => unreachable!("churn only"),
        Kind::Lossy => lossy(rng),
        Kind::Delays => delay(rng),
        Kind::CutOffs => cut(rng),
        Kind::Crashes => crash(rng),
        Kind::Mixed => match rng.below(4) {
            0 => lossy(rng),
            1 => delay(rng),
            2 => cut(rng),
            _ => crash(rng),
        },
    }
}
