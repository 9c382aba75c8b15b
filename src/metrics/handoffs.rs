//! Handoff timing: warm duration, whole-handoff duration, and the `PartitionReady` →
//! `ReleasePartition`-sent latency.
//!
//! The stored handoff record keeps only the start of its *current* phase, so the warm
//! start is gone once a handoff is releasing. The instance that applies `PartitionReady`
//! remembers it here, and observes the whole handoff when it also applies the
//! `PartitionReleased` (always on one node; on several, when both calls reach the same
//! instance). Entries of handoffs no longer in flight are dropped at each scrape.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Mutex,
    time::{SystemTime, UNIX_EPOCH},
};

use super::Metrics;
use crate::status::StatusView;

/// At most this many remembered warm starts: a bound even if scrapes never come.
const MAX_REMEMBERED: usize = 100_000;

/// Warm start (Unix ms) by (topic, partition), for handoffs this instance flipped.
#[derive(Debug, Default)]
pub(super) struct WarmStarts(Mutex<HashMap<(String, u32), u64>>);

impl WarmStarts {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u32), u64>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Forgets handoffs that are no longer in flight.
    pub(super) fn retain_in_flight(&self, status: &StatusView) {
        let in_flight: std::collections::HashSet<(&str, u32)> = status
            .topics
            .iter()
            .flat_map(|t| t.handoffs.iter().map(move |h| (t.topic.as_str(), h.partition)))
            .collect();
        self.lock().retain(|(topic, p), _| in_flight.contains(&(topic.as_str(), *p)));
    }
}

/// Wall-clock milliseconds (stored phase starts are wall-clock, so they survive failover).
fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Seconds from `since_ms` to now (0 if the clock went backwards).
fn secs_since(since_ms: u64) -> f64 {
    secs_between(since_ms, now_ms())
}

/// Seconds from `since_ms` to `at_ms` (0 if the clock went backwards).
fn secs_between(since_ms: u64, at_ms: u64) -> f64 {
    at_ms.saturating_sub(since_ms) as f64 / 1000.0
}

impl Metrics {
    /// This instance applied `PartitionReady` for a handoff whose warm began at
    /// `warm_since_ms` (`None`: unknown, e.g. a repeated call).
    pub fn observe_warm_done(&self, topic: &str, partition: u32, warm_since_ms: Option<u64>) {
        self.observe_warm_done_at(topic, partition, warm_since_ms, now_ms());
    }

    /// [`Metrics::observe_warm_done`], applied at `at_ms` (wall-clock ms).
    pub fn observe_warm_done_at(&self, topic: &str, partition: u32, warm_since_ms: Option<u64>, at_ms: u64) {
        let Some(since) = warm_since_ms else { return };
        self.warm_duration.observe(secs_between(since, at_ms));
        let mut starts = self.warm_starts.lock();
        if starts.len() < MAX_REMEMBERED {
            starts.insert((topic.to_string(), partition), since);
        }
    }

    /// This instance applied `PartitionReleased`: the handoff is complete.
    pub fn observe_handoff_done(&self, topic: &str, partition: u32) {
        self.observe_handoff_done_at(topic, partition, now_ms());
    }

    /// [`Metrics::observe_handoff_done`], applied at `at_ms` (wall-clock ms).
    pub fn observe_handoff_done_at(&self, topic: &str, partition: u32, at_ms: u64) {
        if let Some(since) = self.warm_starts.lock().remove(&(topic.to_string(), partition)) {
            self.handoff_duration.observe(secs_between(since, at_ms));
        }
    }

    /// A `ReleasePartition` whose releasing phase began at `ready_ms` was sent at `at_ms`
    /// (wall-clock ms).
    pub fn observe_release_sent_at(&self, ready_ms: u64, at_ms: u64) {
        self.release_delivery.observe(secs_between(ready_ms, at_ms));
    }

    /// The relay brought a stream from releasing `before` to releasing `after`: each newly
    /// released partition's `ReleasePartition` was just sent; `ready_ms` gives the start
    /// of its releasing phase (when `PartitionReady` was applied).
    pub fn observe_releases_sent(
        &self,
        before: &BTreeMap<u32, String>,
        after: &BTreeMap<u32, String>,
        ready_ms: impl Fn(u32) -> Option<u64>,
    ) {
        for partition in after.keys().filter(|p| !before.contains_key(p)) {
            if let Some(since) = ready_ms(*partition) {
                self.release_delivery.observe(secs_since(since));
            }
        }
    }
}
