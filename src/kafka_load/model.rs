//! Pure: what is known of one topic's partitions — rate estimators, lag, leaders — fed
//! with what one refresh observed, and the weights and zones it gives (docs/design.md §11).

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use super::rates::{RateEstimator, weight};

/// What one refresh saw of one partition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionObservation {
    /// The leader broker's id, if the partition has a leader.
    pub leader: Option<i32>,
    /// The latest offset (high watermark); `None` when Kafka did not give it this time.
    pub end_offset: Option<i64>,
    /// The lag group's committed offset; `None` when no group is configured, the group
    /// committed nothing for the partition, or the request failed.
    pub committed: Option<i64>,
}

/// What one refresh saw of one topic: every partition Kafka lists.
pub type TopicObservation = BTreeMap<u32, PartitionObservation>;

#[derive(Clone, Debug)]
struct PartitionModel {
    rate: RateEstimator,
    lag: u64,
    leader: Option<i32>,
}

/// What is known of one topic (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct TopicModel {
    partitions: BTreeMap<u32, PartitionModel>,
}

impl TopicModel {
    /// Feeds a refresh taken at `now`. Partitions Kafka no longer lists are forgotten; new
    /// ones start with a baseline. `window` is the rate's EWMA time constant.
    pub fn observe(&mut self, now: Instant, observed: &TopicObservation, window: Duration) {
        self.partitions.retain(|p, _| observed.contains_key(p));
        for (&partition, seen) in observed {
            let model = self.partitions.entry(partition).or_insert_with(|| PartitionModel {
                rate: RateEstimator::new(window),
                lag: 0,
                leader: None,
            });
            model.leader = seen.leader;
            if let Some(end) = seen.end_offset {
                model.rate.sample(now, end);
            }
            // Lag needs both offsets of this refresh; a committed offset past the end
            // (a recreated topic, an old commit) is no backlog.
            model.lag = match (seen.end_offset, seen.committed) {
                (Some(end), Some(committed)) if committed >= 0 && end > committed => end.abs_diff(committed),
                _ => 0,
            };
        }
    }

    /// Every listed partition's weight ([`weight`]); `None` until some partition has a
    /// rate. A partition without a rate yet (new, or reset) weighs the mean of the others:
    /// the best guess, rather than the near-zero default that would make it look free.
    pub fn weights(&self, horizon: Duration) -> Option<BTreeMap<u32, u64>> {
        let known: BTreeMap<u32, u64> = self
            .partitions
            .iter()
            .filter_map(|(&p, m)| m.rate.rate().map(|rate| (p, weight(rate, m.lag, horizon))))
            .collect();
        if known.is_empty() {
            return None;
        }
        let total: u128 = known.values().map(|&w| u128::from(w)).sum();
        let mean = u64::try_from(total / known.len() as u128).unwrap_or(u64::MAX).max(1);
        Some(self.partitions.keys().map(|&p| (p, known.get(&p).copied().unwrap_or(mean))).collect())
    }

    /// The zone of each partition whose leader's rack is in `racks`; `None` when none is.
    pub fn zones(&self, racks: &BTreeMap<i32, String>) -> Option<BTreeMap<u32, String>> {
        let zones: BTreeMap<u32, String> = self
            .partitions
            .iter()
            .filter_map(|(&p, m)| m.leader.and_then(|leader| racks.get(&leader)).map(|z| (p, z.clone())))
            .collect();
        (!zones.is_empty()).then_some(zones)
    }

    /// Partitions known.
    pub fn partition_count(&self) -> usize {
        self.partitions.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(60);
    const HORIZON: Duration = Duration::from_secs(60);

    /// partition, leader, end offset, committed offset.
    type Seen = (u32, Option<i32>, Option<i64>, Option<i64>);

    fn seen(entries: &[Seen]) -> TopicObservation {
        entries
            .iter()
            .map(|&(p, leader, end_offset, committed)| {
                (p, PartitionObservation { leader, end_offset, committed })
            })
            .collect()
    }

    #[test]
    fn weights_from_rates_and_lag() {
        let start = Instant::now();
        let mut topic = TopicModel::default();
        topic.observe(start, &seen(&[(0, Some(1), Some(0), None), (1, Some(2), Some(0), None)]), WINDOW);
        assert_eq!(topic.weights(HORIZON), None, "one sample gives no rate");
        let later = start + Duration::from_secs(10);
        // p0: 100/s, caught up. p1: 10/s, 6,000 behind (100/s to drain in 60 s).
        topic.observe(
            later,
            &seen(&[(0, Some(1), Some(1_000), Some(1_000)), (1, Some(2), Some(7_100), Some(1_100))]),
            WINDOW,
        );
        // p1: 710/s produced (7,100 in 10 s) + 100/s of backlog.
        assert_eq!(topic.weights(HORIZON), Some(BTreeMap::from([(0, 100_000), (1, 810_000)])));
        assert_eq!(topic.partition_count(), 2);
    }

    #[test]
    fn committed_past_the_end_or_unknown_is_no_lag() {
        let start = Instant::now();
        let mut topic = TopicModel::default();
        topic.observe(start, &seen(&[(0, None, Some(0), None)]), WINDOW);
        topic.observe(start + Duration::from_secs(1), &seen(&[(0, None, Some(10), Some(50))]), WINDOW);
        assert_eq!(topic.weights(HORIZON), Some(BTreeMap::from([(0, 10_000)])));
        // -1001 is librdkafka's "no committed offset".
        topic.observe(start + Duration::from_secs(2), &seen(&[(0, None, Some(20), Some(-1001))]), WINDOW);
        assert_eq!(topic.weights(HORIZON), Some(BTreeMap::from([(0, 10_000)])));
    }

    #[test]
    fn a_partition_without_a_rate_weighs_the_mean() {
        let start = Instant::now();
        let mut topic = TopicModel::default();
        topic.observe(start, &seen(&[(0, None, Some(0), None), (1, None, Some(0), None)]), WINDOW);
        let t1 = start + Duration::from_secs(1);
        // The topic grew to 3 partitions; p1's offset was not answered this time.
        topic.observe(
            t1,
            &seen(&[(0, None, Some(10), None), (1, None, None, None), (2, None, Some(0), None)]),
            WINDOW,
        );
        assert_eq!(topic.weights(HORIZON), Some(BTreeMap::from([(0, 10_000), (1, 10_000), (2, 10_000)])));
        // Shrunk (recreated smaller): p2 is forgotten.
        topic.observe(
            t1 + Duration::from_secs(1),
            &seen(&[(0, None, Some(40), None), (1, None, Some(0), None)]),
            WINDOW,
        );
        assert_eq!(topic.partition_count(), 2);
        let weights = topic.weights(HORIZON).unwrap();
        assert_eq!(weights.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(weights[&1], 1, "p1 is idle since its baseline");
    }

    #[test]
    fn zones_from_the_leaders_racks() {
        let racks = BTreeMap::from([(1, "zone-a".to_string()), (2, "zone-b".to_string())]);
        let mut topic = TopicModel::default();
        assert_eq!(topic.zones(&racks), None);
        topic.observe(
            Instant::now(),
            &seen(&[
                (0, Some(1), None, None),
                (1, Some(2), None, None),
                (2, Some(3), None, None),
                (3, None, None, None),
            ]),
            WINDOW,
        );
        assert_eq!(
            topic.zones(&racks),
            Some(BTreeMap::from([(0, "zone-a".to_string()), (1, "zone-b".to_string())]))
        );
        assert_eq!(topic.zones(&BTreeMap::new()), None);
    }
}
