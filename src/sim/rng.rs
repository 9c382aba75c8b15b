//! A small seeded generator (SplitMix64): the simulation's only source of chance, so a
//! seed replays exactly on every platform and with every version of any dependency.

use std::time::Duration;

/// A seeded pseudo-random generator.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator whose whole sequence follows from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed ^ 0x5851_f42d_4c95_7f2d }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`0` when `n` is `0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Multiply-shift: no modulo bias worth the name at these ranges, and no division.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// An index into a slice of `len` elements (`len` > 0).
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// `true` with probability `percent` / 100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A duration in `low..=high`, to the microsecond.
    pub fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let (low_us, high_us) = (low.as_micros() as u64, high.as_micros() as u64);
        Duration::from_micros(low_us + self.below(high_us.saturating_sub(low_us) + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_sequence_and_ranges_hold() {
        let draw = |seed| {
            let mut rng = Rng::new(seed);
            (0..64).map(|_| rng.below(10)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        assert!(draw(7).iter().all(|n| *n < 10));
        assert!((0..10).all(|n| draw(7).contains(&n)), "every value comes up");
        let mut rng = Rng::new(1);
        let (low, high) = (Duration::from_millis(5), Duration::from_millis(6));
        assert!((0..100).all(|_| (low..=high).contains(&rng.between(low, high))));
    }
}
