//! Exponential backoff with full jitter, for reconnects and retried calls.

use std::{
    collections::hash_map::RandomState,
    hash::{BuildHasher, Hasher},
    time::Duration,
};

/// Backoff settings: the n-th wait is uniform in `[0, min(max, initial * 2^n)]`, so many
/// consumers cut off at once do not come back in lockstep ("full jitter").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Upper bound of the first wait.
    pub initial: Duration,
    /// Upper bound of every wait.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { initial: Duration::from_millis(50), max: Duration::from_secs(2) }
    }
}

impl Backoff {
    /// The ceiling of wait number `attempt` (0-based), before jitter.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// Wait number `attempt`, jittered with `random` (any u64).
    pub fn delay_with(&self, attempt: u32, random: u64) -> Duration {
        let ceiling = self.ceiling(attempt).as_micros().min(u64::MAX as u128) as u64;
        Duration::from_micros(random.checked_rem(ceiling.saturating_add(1)).unwrap_or(0))
    }

    /// Wait number `attempt`, with fresh randomness.
    pub fn delay(&self, attempt: u32) -> Duration {
        self.delay_with(attempt, random_u64())
    }
}

/// A random u64 from the standard library's per-hasher random keys: enough for jitter,
/// and no extra dependency.
fn random_u64() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(0x9e37_79b9_7f4a_7c15);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_up_to_max() {
        let b = Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(1) };
        assert_eq!(b.ceiling(0), Duration::from_millis(100));
        assert_eq!(b.ceiling(1), Duration::from_millis(200));
        assert_eq!(b.ceiling(3), Duration::from_millis(800));
        assert_eq!(b.ceiling(4), Duration::from_secs(1));
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn jitter_stays_within_the_ceiling_and_varies() {
        let b = Backoff::default();
        for attempt in 0..30 {
            for random in [0, 1, 12_345, u64::MAX] {
                assert!(b.delay_with(attempt, random) <= b.ceiling(attempt));
            }
        }
        let delays: std::collections::BTreeSet<Duration> = (0..20).map(|_| b.delay(10)).collect();
        assert!(delays.len() > 1, "jitter must vary: {delays:?}");
        let zero = Backoff { initial: Duration::ZERO, max: Duration::ZERO };
        assert_eq!(zero.delay(3), Duration::ZERO);
    }
}
