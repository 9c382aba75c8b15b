//! Partition weights: where the load of each partition comes from (docs/design.md §11).
//!
//! A [`WeightSource`] answers, for a topic, the weight of each of its partitions now:
//! learned from Kafka (produce rate, lag) or given by the operator. The leader stores the
//! weights with the topic's record, so a new leader starts from them instead of relearning,
//! and placement by load ([`crate::assignment::LoadBalanced`]) balances them.

use std::collections::BTreeMap;

mod explicit;

pub use explicit::{
    ExplicitWeights, Reload, TopicWeights, WeightsError, parse_weights_flag, parse_weights_json,
};

/// Where partition weights (and, when known, partition zones) come from.
///
/// Reads are synchronous snapshots: a source that learns (Kafka) refreshes in its own task
/// and answers from what it learned last, so asking never waits on the network.
pub trait WeightSource: Send + Sync + 'static {
    /// The weights of `topic`'s partitions now: partition → weight (a missing partition
    /// weighs [`crate::assignment::assignor::DEFAULT_WEIGHT`]). `None` while the source knows
    /// nothing of the topic yet; a learning source starts learning a topic when first asked.
    fn weights(&self, topic: &str) -> Option<BTreeMap<u32, u64>>;

    /// The zone of each of `topic`'s partitions whose zone is known (its leader broker's
    /// rack), for same-zone placement. `None` when the source knows no zones.
    fn zones(&self, topic: &str) -> Option<BTreeMap<u32, String>> {
        let _ = topic;
        None
    }

    /// Names the source in logs and `/status` (for instance "Kafka at host:9092").
    fn describe(&self) -> String;
}

impl std::fmt::Debug for dyn WeightSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}
