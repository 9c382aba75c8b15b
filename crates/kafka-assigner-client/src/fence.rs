//! A sink-side fence (docs/design.md §10): remembers the highest epoch seen per partition
//! and refuses lower ones, so a superseded owner (slow, cut off, or still inside a warm
//! handoff's release window) cannot write once a newer owner has.
//!
//! The fence must live where the writes land (the sink, or the process that is the only
//! way into it): a fence inside each consumer only sees that consumer's own writes.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard},
};

use crate::Partition;

/// A write carried an epoch below the highest one seen for its partition: a newer owner
/// has written since.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "stale epoch for {topic}/{partition}: offered {offered}, but epoch {highest} was seen: \
     a newer owner has taken the partition over"
)]
pub struct StaleEpoch {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// The epoch the refused write carried.
    pub offered: u64,
    /// The highest epoch seen for the partition.
    pub highest: u64,
}

/// The highest epoch seen per (topic, partition); thread-safe (`&self`), cheap to share in
/// an `Arc`.
///
/// Epoch 0 (an assigner that hands out no epochs) is the lowest epoch like any other: it
/// passes while the partition has seen no real epoch, and is refused once one was seen, so
/// mixing assigners with and without epochs fences the writers without them, the safe side.
/// Equal epochs pass: the same ownership may write many times, and an owner that
/// reconnects keeps its epoch.
#[derive(Debug, Default)]
pub struct Fence {
    /// topic → partition → highest epoch seen.
    highest: Mutex<HashMap<String, HashMap<u32, u64>>>,
}

impl Fence {
    /// An empty fence: every epoch passes until one is seen.
    pub fn new() -> Self {
        Self::default()
    }

    /// Admits a write for `partition` with its epoch ([`admit_epoch`](Self::admit_epoch)).
    pub fn admit(&self, partition: &Partition) -> Result<(), StaleEpoch> {
        self.admit_epoch(&partition.topic, partition.partition, partition.epoch)
    }

    /// Admits a write for `topic`/`partition` carrying `epoch` if it is at least the highest
    /// epoch seen for that partition, and remembers it; refuses it otherwise. Check and
    /// update are one step: of two writers racing, the lower epoch loses once the higher
    /// one got in.
    pub fn admit_epoch(&self, topic: &str, partition: u32, epoch: u64) -> Result<(), StaleEpoch> {
        let mut highest = self.lock();
        // Looked up by `&str`: no allocation once the topic is known.
        if !highest.contains_key(topic) {
            highest.insert(topic.to_string(), HashMap::new());
        }
        match highest.get_mut(topic).map(|partitions| partitions.entry(partition).or_insert(epoch)) {
            Some(seen) if epoch < *seen => {
                Err(StaleEpoch { topic: topic.to_string(), partition, offered: epoch, highest: *seen })
            }
            Some(seen) => {
                *seen = epoch;
                Ok(())
            }
            // Inserted just above, under the same lock.
            None => Ok(()),
        }
    }

    /// The highest epoch seen for `topic`/`partition` (`None`: nothing seen yet).
    pub fn highest(&self, topic: &str, partition: u32) -> Option<u64> {
        self.lock().get(topic).and_then(|partitions| partitions.get(&partition)).copied()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, HashMap<u32, u64>>> {
        // The map stays consistent whatever panicked while holding it (one update at a time).
        self.highest.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn p(partition: u32, epoch: u64) -> Partition {
        Partition { topic: "events".into(), partition, epoch }
    }

    #[test]
    fn lower_epochs_are_refused_equal_and_higher_pass() {
        let fence = Fence::new();
        assert_eq!(fence.highest("events", 0), None);
        assert_eq!(fence.admit(&p(0, 5)), Ok(()));
        assert_eq!(fence.admit(&p(0, 5)), Ok(()), "the same owner writes again");
        assert_eq!(fence.admit(&p(0, 9)), Ok(()), "a newer owner");
        let stale = fence.admit(&p(0, 5)).expect_err("the superseded owner is refused");
        assert_eq!(stale, StaleEpoch { topic: "events".into(), partition: 0, offered: 5, highest: 9 });
        assert_eq!(
            stale.to_string(),
            "stale epoch for events/0: offered 5, but epoch 9 was seen: a newer owner has taken the partition over"
        );
        assert_eq!(fence.highest("events", 0), Some(9), "a refused write changes nothing");
    }

    #[test]
    fn partitions_and_topics_are_fenced_apart() {
        let fence = Fence::new();
        fence.admit(&p(0, 9)).expect("first");
        assert_eq!(fence.admit(&p(1, 2)), Ok(()), "another partition");
        assert_eq!(fence.admit_epoch("other", 0, 1), Ok(()), "another topic");
        assert_eq!(fence.highest("other", 0), Some(1));
    }

    #[test]
    fn epoch_zero_passes_only_until_a_real_epoch_was_seen() {
        let fence = Fence::new();
        assert_eq!(fence.admit(&p(0, 0)), Ok(()));
        assert_eq!(fence.admit(&p(0, 0)), Ok(()), "no epochs at all: nothing to fence with");
        assert_eq!(fence.admit(&p(0, 3)), Ok(()));
        assert!(fence.admit(&p(0, 0)).is_err(), "a writer without epochs after one with them");
    }

    #[test]
    fn racing_writers_the_highest_epoch_wins_for_good() {
        let fence = Arc::new(Fence::new());
        let threads: Vec<_> = (1..=8u64)
            .map(|epoch| {
                let fence = fence.clone();
                // How many of its 100 writes got in.
                std::thread::spawn(move || (0..100).filter(|_| fence.admit(&p(0, epoch)).is_ok()).count())
            })
            .collect();
        let admitted: Vec<usize> = threads.into_iter().map(|t| t.join().expect("thread")).collect();
        assert_eq!(fence.highest("events", 0), Some(8));
        assert_eq!(admitted[7], 100, "the highest epoch is never refused: {admitted:?}");
        assert_eq!(fence.admit(&p(0, 7)).map_err(|e| e.highest), Err(8));
    }
}
