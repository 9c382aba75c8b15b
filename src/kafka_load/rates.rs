//! Pure: the produce rate of one partition from its high-watermark samples, and the weight
//! formula (docs/design.md §11). No clock, no I/O: the caller gives the time of each sample.
//!
//! **Rate.** Between two samples the instantaneous rate is the watermark's growth over the
//! time between them. The estimate is an exponentially weighted moving average of those
//! rates with time constant `window` (τ): a sample `dt` after the previous one moves the
//! estimate by `1 - e^(-dt/τ)` of the way to the new rate, so irregular sample intervals
//! (a refresh that ran late, an extra refresh when a topic is first asked for) weigh what
//! they cover. The first rate (second sample) is taken as is, so a new topic is not
//! under-weighted while the average warms up from zero.
//!
//! **Weight.** `weight = round(1000 × (rate + lag / horizon))`, at least 1: milli-messages
//! per second of the work the partition asks of its consumer — keeping up with producers,
//! plus draining the backlog within `horizon`.

use std::time::{Duration, Instant};

/// What a sample did to the estimate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampled {
    /// The first sample (or the first after a reset): a baseline, no rate yet.
    Baseline,
    /// The estimate now, in messages per second.
    Rate(f64),
    /// The watermark went back (the topic was deleted and recreated, or truncated): the
    /// estimate is dropped and this sample is the new baseline.
    Reset,
    /// Not later than the previous sample: ignored.
    Ignored,
}

/// The smoothed produce rate of one partition (see the module docs).
#[derive(Clone, Debug)]
pub struct RateEstimator {
    window: Duration,
    last: Option<(Instant, i64)>,
    rate: Option<f64>,
}

impl RateEstimator {
    /// An estimator with EWMA time constant `window` (a zero window follows the last
    /// interval's rate exactly).
    pub fn new(window: Duration) -> Self {
        Self { window, last: None, rate: None }
    }

    /// Feeds the high watermark seen at `now`.
    pub fn sample(&mut self, now: Instant, high_watermark: i64) -> Sampled {
        let Some((then, previous)) = self.last else {
            self.last = Some((now, high_watermark));
            return Sampled::Baseline;
        };
        if high_watermark < previous {
            self.last = Some((now, high_watermark));
            self.rate = None;
            return Sampled::Reset;
        }
        let dt = now.saturating_duration_since(then);
        if dt.is_zero() {
            return Sampled::Ignored;
        }
        // Watermarks are i64 and `high_watermark >= previous`: the difference fits in u64.
        let grown = high_watermark.abs_diff(previous) as f64;
        let instant = grown / dt.as_secs_f64();
        let rate = match self.rate {
            None => instant,
            Some(rate) => {
                let alpha = if self.window.is_zero() {
                    1.0
                } else {
                    1.0 - (-dt.as_secs_f64() / self.window.as_secs_f64()).exp()
                };
                rate + alpha * (instant - rate)
            }
        };
        self.last = Some((now, high_watermark));
        self.rate = Some(rate);
        Sampled::Rate(rate)
    }

    /// The estimate in messages per second; `None` until two samples are known.
    pub fn rate(&self) -> Option<f64> {
        self.rate
    }

    /// The last high watermark fed.
    pub fn high_watermark(&self) -> Option<i64> {
        self.last.map(|(_, hw)| hw)
    }
}

/// The weight of a partition producing `rate` messages per second with `lag` messages not
/// yet consumed, to be drained within `horizon` (see the module docs): milli-messages per
/// second, at least 1.
pub fn weight(rate: f64, lag: u64, horizon: Duration) -> u64 {
    let drain = if horizon.is_zero() { 0.0 } else { lag as f64 / horizon.as_secs_f64() };
    let milli = ((rate.max(0.0) + drain) * 1000.0).round();
    if milli.is_nan() || milli < 1.0 {
        1
    } else if milli >= u64::MAX as f64 {
        u64::MAX
    } else {
        milli as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn first_sample_gives_no_rate_second_gives_the_growth() {
        let start = Instant::now();
        let mut estimator = RateEstimator::new(Duration::from_secs(60));
        assert_eq!(estimator.sample(start, 1_000), Sampled::Baseline);
        assert_eq!(estimator.rate(), None);
        assert_eq!(estimator.sample(start + 10 * SECOND, 1_500), Sampled::Rate(50.0));
        assert_eq!(estimator.rate(), Some(50.0));
        assert_eq!(estimator.high_watermark(), Some(1_500));
    }

    #[test]
    fn smooths_with_the_time_constant() {
        let start = Instant::now();
        let window = Duration::from_secs(60);
        let mut estimator = RateEstimator::new(window);
        estimator.sample(start, 0);
        estimator.sample(start + 10 * SECOND, 1_000); // 100/s
        // The rate jumps to 400/s: one 10 s step moves 1 - e^(-1/6) ≈ 15.4 % of the way.
        let Sampled::Rate(rate) = estimator.sample(start + 20 * SECOND, 5_000) else { panic!() };
        let alpha = 1.0 - (-10.0f64 / 60.0).exp();
        assert!(close(rate, 100.0 + alpha * 300.0), "{rate}");
        // Two 5 s steps weigh the same as one 10 s step (irregular intervals are fair).
        let mut split = RateEstimator::new(window);
        split.sample(start, 0);
        split.sample(start + 10 * SECOND, 1_000);
        split.sample(start + 15 * SECOND, 3_000);
        let Sampled::Rate(two_steps) = split.sample(start + 20 * SECOND, 5_000) else { panic!() };
        assert!(close(two_steps, rate), "{two_steps} vs {rate}");
        // After five time constants at 400/s, the estimate is within 1 % of it.
        let mut hw = 5_000;
        let mut now = start + 20 * SECOND;
        for _ in 0..30 {
            now += 10 * SECOND;
            hw += 4_000;
            estimator.sample(now, hw);
        }
        let settled = estimator.rate().unwrap();
        assert!((settled - 400.0).abs() < 4.0, "{settled}");
    }

    #[test]
    fn an_idle_partition_decays_to_zero() {
        let start = Instant::now();
        let mut estimator = RateEstimator::new(Duration::from_secs(10));
        estimator.sample(start, 0);
        estimator.sample(start + SECOND, 100);
        for s in 2..=100 {
            estimator.sample(start + s * SECOND, 100);
        }
        assert!(estimator.rate().unwrap() < 1e-2, "{:?}", estimator.rate());
    }

    #[test]
    fn a_watermark_that_goes_back_resets() {
        let start = Instant::now();
        let mut estimator = RateEstimator::new(Duration::from_secs(60));
        estimator.sample(start, 10_000);
        estimator.sample(start + 10 * SECOND, 20_000);
        assert_eq!(estimator.rate(), Some(1_000.0));
        // Recreated: the new topic starts at 0.
        assert_eq!(estimator.sample(start + 20 * SECOND, 30), Sampled::Reset);
        assert_eq!(estimator.rate(), None);
        // The next rate is the new topic's own, not an average with the old one.
        assert_eq!(estimator.sample(start + 30 * SECOND, 130), Sampled::Rate(10.0));
    }

    #[test]
    fn samples_not_later_are_ignored() {
        let start = Instant::now() + 60 * SECOND;
        let mut estimator = RateEstimator::new(Duration::from_secs(60));
        estimator.sample(start, 0);
        assert_eq!(estimator.sample(start, 500), Sampled::Ignored);
        assert_eq!(estimator.sample(start - SECOND, 500), Sampled::Ignored);
        assert_eq!(estimator.rate(), None);
        assert_eq!(estimator.sample(start + SECOND, 500), Sampled::Rate(500.0));
    }

    #[test]
    fn zero_window_follows_the_last_interval() {
        let start = Instant::now();
        let mut estimator = RateEstimator::new(Duration::ZERO);
        estimator.sample(start, 0);
        estimator.sample(start + SECOND, 100);
        assert_eq!(estimator.sample(start + 2 * SECOND, 300), Sampled::Rate(200.0));
    }

    #[test]
    fn weight_is_milli_messages_per_second_with_the_backlog() {
        let horizon = Duration::from_secs(60);
        assert_eq!(weight(12.5, 0, horizon), 12_500);
        // 6,000 behind, drained in 60 s: 100/s more.
        assert_eq!(weight(12.5, 6_000, horizon), 112_500);
        // Idle and caught up still weighs 1 (a weight is never zero).
        assert_eq!(weight(0.0, 0, horizon), 1);
        assert_eq!(weight(0.0001, 0, horizon), 1);
        assert_eq!(weight(-3.0, 0, horizon), 1);
        assert_eq!(weight(f64::NAN, 0, horizon), 1);
        assert_eq!(weight(f64::INFINITY, 0, horizon), u64::MAX);
        // No horizon: lag is not counted.
        assert_eq!(weight(2.0, 1_000_000, Duration::ZERO), 2_000);
    }
}
