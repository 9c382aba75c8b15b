//! Seeded schedules: the fleet's shape and the timed actions of one run, all drawn from the
//! seed before the run starts (so the driver's decisions do not depend on how the
//! coordinator's tasks interleave), and the seeded draws consumers make as they answer.

use std::time::Duration;

pub use crate::sim_support::draws::Rng;
use crate::sim_support::draws::{actions_until, early_joins, rejoin_after};

/// What kind of faults a schedule injects (every kind has consumer churn).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// No store faults: joins, crashes, deregistrations, answers and silences only.
    Calm,
    /// Lost answers: writes applied by the store but reported failed.
    LostAnswers,
    /// Delayed answers and watch batches (instances see the store at different times).
    Delays,
    /// One instance cut off from the store for a while, sessions expired while it is.
    CutOff,
    /// Instances crash (and come back); a whole-store outage.
    Crashes,
    /// All of the above at once.
    Mixed,
    /// Targeted (`families.rs`): instances' connections stall, often from the next write of
    /// ownership (a leader's plan, a consumer's ready), the held writes landing late and
    /// their answers sometimes lost; consumers restart while their old stream stays open,
    /// or while their `Deregister` is held.
    Stalls,
    /// Targeted (`families.rs`): the store expires the leader's session early while its
    /// streams are open (an operator's revoke), often with its answers slowed and one of
    /// its consumers restarting on another instance meanwhile.
    Revokes,
    /// Targeted (`families.rs`): a consumer's `PartitionReady` is held on its way to the
    /// store while a burst of consumers joins, so the leader may give the warm's partition
    /// another target before the ready lands.
    ReadyRaces,
}

/// The random kinds, in seed order: seed `s` runs `KINDS[s % KINDS.len()]` in its kind's
/// test.
pub const KINDS: [Kind; 6] =
    [Kind::Calm, Kind::LostAnswers, Kind::Delays, Kind::CutOff, Kind::Crashes, Kind::Mixed];

/// The targeted families, with seeds of their own: seed `s` runs
/// `FAMILIES[s % FAMILIES.len()]` in its family's test.
pub const FAMILIES: [Kind; 3] = [Kind::Stalls, Kind::Revokes, Kind::ReadyRaces];

/// One timed action of a schedule. Indices are taken modulo the pool / fleet size; an
/// action that does not fit the current state (joining a consumer that is online) does
/// nothing.
#[derive(Clone, Debug)]
pub enum Action {
    /// The consumer registers on this instance.
    Join { consumer: usize, instance: usize },
    /// The consumer process dies (drops its stream); it comes back after `rejoin`, if any.
    CrashConsumer { consumer: usize, rejoin: Option<Duration> },
    /// The consumer deregisters through this instance.
    Deregister { consumer: usize, instance: usize },
    /// The next `count` writes of the instance lose their answers.
    LoseNext { instance: usize, count: u32 },
    /// Each write of the instance loses its answer with this chance, for a while.
    LoseSome { instance: usize, chance: f64, period: Duration },
    /// The instance's answers and watch batches are delayed up to `high`, for a while.
    Delay { instance: usize, high: Duration, period: Duration },
    /// The instance is cut off from the store for `period`; with `expire`, the store also
    /// expires its session once it has been cut off for a TTL (as etcd would).
    CutOff { instance: usize, period: Duration, expire: bool },
    /// The instance process dies; a new one with the same id starts after `restart`.
    CrashInstance { instance: usize, restart: Duration },
    /// Every instance is cut off from the store (a store outage) for `period`.
    Outage { period: Duration },
    /// The connection of the instance (of the leader, with `leader`) stalls for `period`:
    /// from now, or from its next write of an assignment or a handoff (`at_write`). With
    /// `lose`, the held calls lose their answers when it ends (the connection resets).
    Stall { instance: usize, leader: bool, period: Duration, at_write: bool, lose: bool },
    /// The store expires the session of the leader (`instance` `None`) or of this instance
    /// (whether it leads or not) early (an operator's revoke) while it is in touch: its
    /// calls and watch batches are first slowed by up to `delay` for a TTL, and with
    /// `restart`, one of its consumers restarts on another instance after the wait.
    Revoke { instance: Option<usize>, delay: Duration, restart: Option<(usize, Duration)> },
    /// The consumer process restarts and registers on this instance while its old stream
    /// stays open (its instance has not noticed the old connection is dead yet).
    RestartConsumer { consumer: usize, instance: usize },
    /// The consumer deregisters through this instance, whose connection stalls for
    /// `period` from its next write of a registration (the `Deregister`'s, mostly); after
    /// `give_up` the consumer gives up on the call and restarts on the next instance, its
    /// old stream left open, so the held write lands after the new registration.
    DeregisterRace { consumer: usize, instance: usize, period: Duration, give_up: Duration },
}

/// The shape of one run.
#[derive(Clone, Debug)]
pub struct Shape {
    pub kind: Kind,
    pub instances: usize,
    pub pool: usize,
    pub partitions: u32,
    pub ttl: Duration,
    pub reconcile: Duration,
    pub max_warming: usize,
    /// How long actions are injected before the fleet is left to settle.
    pub active: Duration,
    /// The actions, by offset from the start.
    pub actions: Vec<(Duration, Action)>,
}

/// The salt of this simulation's seeds (`sim_support::draws::Rng`).
pub const SALT: u64 = 0x5DEE_CE66_D1CE_5EED;

impl Shape {
    /// Draws the shape and the actions of schedule `seed` of `kind`.
    pub fn draw(seed: u64, kind: Kind) -> Shape {
        let mut rng = Rng::new(seed, SALT);
        let instances = 2 + rng.below(2) as usize;
        let mut pool = 2 + rng.below(4) as usize;
        let mut partitions = 1 + rng.below(12) as u32;
        let ttl = Duration::from_secs(1 + rng.below(3));
        let reconcile = rng.millis(100, 300);
        let mut max_warming = 1 + rng.below(4) as usize;
        let active = Duration::from_secs(15 + rng.below(10));
        let mut early = pool;
        if kind == Kind::ReadyRaces {
            // Room for bursts: a small group first, whose newcomers warm many partitions,
            // and consumers left to join in a burst.
            pool = 4 + rng.below(3) as usize;
            partitions = 6 + rng.below(7) as u32;
            max_warming = 2 + rng.below(3) as usize;
            early = 2;
        }
        // Every consumer joins early, so each run starts from a populated fleet.
        let (mut actions, at) =
            early_joins(&mut rng, early, |consumer, instance| Action::Join { consumer, instance });
        let mut last_revoke: Option<Duration> = None;
        actions_until(&mut rng, &mut actions, at, active, (50, 700), |rng, at| {
            let action = match kind {
                Kind::Stalls | Kind::Revokes | Kind::ReadyRaces => {
                    crate::families::draw_action(kind, ttl, rng)
                }
                _ => draw_action(kind, ttl, rng),
            };
            // One revoke at a time: the next comes once the last one's rebinds are over.
            if let Some(Action::Revoke { .. }) = action {
                if last_revoke.is_some_and(|last| at < last + 3 * ttl) {
                    return None;
                }
                last_revoke = Some(at);
            }
            action
        });
        Shape { kind, instances, pool, partitions, ttl, reconcile, max_warming, active, actions }
    }
}

/// Consumer churn: joins, crashes (back within the TTL, after it, or never) and
/// deregistrations.
pub fn churn(consumer: usize, instance: usize, ttl: Duration, rng: &mut Rng) -> Action {
    let ttl_ms = ttl.as_millis() as u64;
    match rng.below(6) {
        0..=2 => Action::Join { consumer, instance },
        3 | 4 => {
            let rejoin = rejoin_after(rng, ttl_ms);
            Action::CrashConsumer { consumer, rejoin }
        }
        _ => Action::Deregister { consumer, instance },
    }
}

fn draw_action(kind: Kind, ttl: Duration, rng: &mut Rng) -> Option<Action> {
    let consumer = rng.below(8) as usize;
    let instance = rng.below(8) as usize;
    let ttl_ms = ttl.as_millis() as u64;
    // Consumer churn: 6 in 10 actions in every kind.
    let roll = rng.below(10);
    if roll < 6 {
        return Some(churn(consumer, instance, ttl, rng));
    }
    let lost = |rng: &mut Rng| match rng.below(2) {
        0 => Action::LoseNext { instance, count: 1 + rng.below(3) as u32 },
        _ => Action::LoseSome { instance, chance: 0.1 + 0.4 * rng.unit(), period: rng.millis(500, 4000) },
    };
    let delay =
        |rng: &mut Rng| Action::Delay { instance, high: rng.millis(5, 200), period: rng.millis(1000, 6000) };
    let cut = |rng: &mut Rng| Action::CutOff {
        instance,
        period: rng.millis(ttl_ms / 4, 3 * ttl_ms),
        expire: rng.below(2) == 0,
    };
    let crash = |rng: &mut Rng| match rng.below(3) {
        0 => Action::Outage { period: rng.millis(ttl_ms / 2, 3 * ttl_ms) },
        _ => Action::CrashInstance { instance, restart: rng.millis(200, 3 * ttl_ms) },
    };
    match kind {
        Kind::Calm => None,
        Kind::LostAnswers => Some(lost(rng)),
        Kind::Delays => Some(delay(rng)),
        Kind::CutOff => Some(cut(rng)),
        Kind::Crashes => Some(crash(rng)),
        Kind::Mixed => Some(match rng.below(4) {
            0 => lost(rng),
            1 => delay(rng),
            2 => cut(rng),
            _ => crash(rng),
        }),
        Kind::Stalls | Kind::Revokes | Kind::ReadyRaces => None,
    }
}
