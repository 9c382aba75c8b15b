//! Seeded draws: the SplitMix64 generator both simulations draw their schedules and their
//! consumers' choices from, and the steps of shaping a schedule that both take the same
//! way. Each simulation salts the seed with its own constant, so a seed keeps drawing
//! exactly what it drew before the two shared this code (seeds quoted in notes replay).

use std::time::Duration;

/// SplitMix64: small, seedable, and no dependency.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The generator of `seed` in the simulation whose constant is `salt`.
    pub fn new(seed: u64, salt: u64) -> Self {
        Rng(seed ^ salt)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A duration uniform in `low..=high` milliseconds.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high.saturating_sub(low) + 1))
    }

    /// A draw that depends only on `seed` (salted) and `tag`, not on how many draws came
    /// before: consumers answering in whatever order the run delivers commands still get
    /// the same delays.
    pub fn keyed(seed: u64, salt: u64, tag: &[u64]) -> Rng {
        let mut rng = Rng::new(seed, salt);
        for t in tag {
            rng.0 ^= t.wrapping_mul(0x2545_F491_4F6C_DD1D);
            rng.next();
        }
        rng
    }
}

/// The first actions of every schedule: consumers `0..early` join one after the other,
/// 0–300 ms apart, each on a drawn instance (`join(consumer, instance)` builds the
/// action), so each run starts from a populated fleet. Returns the actions and the time
/// of the last one.
pub fn early_joins<A>(
    rng: &mut Rng,
    early: usize,
    join: impl Fn(usize, usize) -> A,
) -> (Vec<(Duration, A)>, Duration) {
    let mut actions = Vec::new();
    let mut at = Duration::ZERO;
    for consumer in 0..early {
        at += rng.millis(0, 300);
        actions.push((at, join(consumer, rng.below(8) as usize)));
    }
    (actions, at)
}

/// The rest of a schedule: from `at`, an action every `gap` (low, high ms) until
/// `active`; `draw(rng, at)` draws the action at `at`, or `None` for a quiet slot.
pub fn actions_until<A>(
    rng: &mut Rng,
    actions: &mut Vec<(Duration, A)>,
    mut at: Duration,
    active: Duration,
    gap: (u64, u64),
    mut draw: impl FnMut(&mut Rng, Duration) -> Option<A>,
) {
    loop {
        at += rng.millis(gap.0, gap.1);
        if at >= active {
            return;
        }
        if let Some(action) = draw(rng, at) {
            actions.push((at, action));
        }
    }
}

/// When a crashed consumer comes back: within half a TTL, after one to three, or never.
pub fn rejoin_after(rng: &mut Rng, ttl_ms: u64) -> Option<Duration> {
    match rng.below(3) {
        0 => Some(rng.millis(50, ttl_ms / 2)),
        1 => Some(rng.millis(ttl_ms, 3 * ttl_ms)),
        _ => None,
    }
}
