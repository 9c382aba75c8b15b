//! The Kafka topic refresh as a part of an instance's state: every `topic_refresh_interval`
//! each stored topic that is not configured is looked up in Kafka, one at a time (Kafka may
//! be slow; nothing else waits for it), and a count that grew is written to the topic's
//! record with compare-and-swap on the record as read (`shared/topics.rs::grown_txn`), so
//! the next plan or claim gives the new partitions out. The handoff backend refreshes from
//! each group's leader, its writes fenced; the fleet from every instance, unfenced (growth
//! only ever grows, so any instance may write it).
//!
//! It issues nothing itself: it says what to ask next ([`Ask`]), the machine sends it as a
//! lookup or a store request and hands the answer back.

use std::collections::VecDeque;
use std::time::Duration;

use super::io::{Micros, StoreReply};
use crate::coordinator::CoordinatorError;
use crate::coordinator::causes::TopicUnknown;
use crate::store::{Compare, StoreError, Txn};

/// What the refresh asks for next.
#[derive(Clone, Debug, PartialEq)]
pub enum Ask {
    /// Kafka's partition count of this topic ([`super::io::Effect::LookUpPartitions`]).
    Count(String),
    /// The topic's record, at this key (a store `Get`).
    Read(String),
    /// The write of a grown count.
    Write(Txn),
}

/// One topic of a round.
#[derive(Clone, Debug)]
struct Topic {
    name: String,
    key: String,
    /// The count the cache held when the round started.
    cached: u32,
}

/// Where the round is with its current topic.
#[derive(Clone, Debug)]
enum Current {
    Counting(Topic),
    Reading(Topic, u32),
    Writing(Topic, u32),
}

/// The refresh's state (module docs).
#[derive(Debug)]
pub struct TopicRefresh {
    every: Micros,
    /// When the next round starts.
    next_at: Micros,
    /// The topics left in the round under way, and the one being looked at.
    left: VecDeque<Topic>,
    current: Option<Current>,
    /// Counts rounds and stops: an answer is for the round it was asked in
    /// ([`round`](Self::round)), later ones ignore it.
    round: u64,
}

impl TopicRefresh {
    /// A refresh every `every`, the first round at `first_at`.
    pub fn new(every: Duration, first_at: Micros) -> Self {
        Self {
            every: every.as_micros() as Micros,
            next_at: first_at,
            left: VecDeque::new(),
            current: None,
            round: 0,
        }
    }

    /// The round under way (an answer carries the round it was asked in).
    pub fn round(&self) -> u64 {
        self.round
    }

    /// Starts again with the first round at `first_at` (leadership won).
    pub fn restart(&mut self, first_at: Micros) {
        self.stop();
        self.next_at = first_at;
    }

    /// When a round is due next (`None` while one is under way).
    pub fn wake_at(&self) -> Option<Micros> {
        (self.current.is_none() && self.left.is_empty()).then_some(self.next_at)
    }

    /// Ends the round under way (leadership lost, the instance stops); answers still out
    /// are ignored.
    pub fn stop(&mut self) {
        self.left.clear();
        self.current = None;
        self.round += 1;
    }

    /// What to ask next at `now`, if anything: a new round starts when due, over `stored`
    /// (name, record key, cached count of each stored topic that is not configured).
    pub fn next(&mut self, now: Micros, stored: impl FnOnce() -> Vec<(String, String, u32)>) -> Option<Ask> {
        if self.current.is_some() {
            return None;
        }
        if self.left.is_empty() {
            if now < self.next_at {
                return None;
            }
            self.next_at = now + self.every;
            self.round += 1;
            self.left = stored().into_iter().map(|(name, key, cached)| Topic { name, key, cached }).collect();
        }
        let topic = self.left.pop_front()?;
        let ask = Ask::Count(topic.name.clone());
        self.current = Some(Current::Counting(topic));
        Some(ask)
    }

    /// Kafka's answer for the topic being counted.
    pub fn counted(&mut self, answer: Result<u32, CoordinatorError>) -> Option<Ask> {
        let Some(Current::Counting(topic)) = self.current.take() else { return None };
        match answer {
            Ok(count) if count == topic.cached => None,
            Ok(count) => {
                let ask = Ask::Read(topic.key.clone());
                self.current = Some(Current::Reading(topic, count));
                Some(ask)
            }
            Err(CoordinatorError::UnknownTopic(TopicUnknown::NotInKafka { .. })) => {
                tracing::warn!(
                    topic = topic.name,
                    "topic refresh: the topic no longer exists in Kafka; its partition count is kept"
                );
                None
            }
            Err(error) => {
                tracing::warn!(%error, "topic refresh: Kafka unavailable; trying again at the next refresh");
                self.left.clear();
                None
            }
        }
    }

    /// The store's answer to the read or the write of the topic being grown; `guard` is
    /// what the write must also compare (the leader's fence), if anything.
    pub fn stored(&mut self, answer: Result<StoreReply, StoreError>, guard: Option<Compare>) -> Option<Ask> {
        match self.current.take()? {
            Current::Reading(topic, count) => {
                let stored = match answer {
                    Ok(StoreReply::Values(mut values)) => values.pop().flatten(),
                    Ok(_) => None,
                    Err(error) => {
                        tracing::warn!(%error, topic = topic.name, "topic refresh: cannot read the topic record");
                        None
                    }
                };
                let txn = crate::coordinator::shared::topics::grown_txn(
                    &topic.key,
                    &topic.name,
                    stored.as_ref(),
                    count,
                    guard,
                )?;
                self.current = Some(Current::Writing(topic, count));
                Some(Ask::Write(txn))
            }
            Current::Writing(topic, count) => {
                let written =
                    answer.map(|reply| matches!(reply, StoreReply::Txn(outcome) if outcome.succeeded));
                crate::coordinator::shared::topics::grown(&topic.name, count, written);
                None
            }
            Current::Counting(topic) => {
                // Not an answer this topic waits for: it still waits for Kafka.
                self.current = Some(Current::Counting(topic));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Ask, TopicRefresh};
    use crate::coordinator::machine::io::StoreReply;
    use crate::coordinator::shared::records::{TopicRecord, encode};
    use crate::store::{KeyValue, TxnOutcome};

    fn record(count: u32, revision: i64) -> StoreReply {
        let value = encode(&TopicRecord::new(count));
        let kv =
            KeyValue { key: "k/t".into(), value, create_revision: 1, mod_revision: revision, session: None };
        StoreReply::Values(vec![Some(kv)])
    }

    #[test]
    fn a_round_asks_each_topic_in_turn_and_writes_only_what_grew() {
        let mut refresh = TopicRefresh::new(std::time::Duration::from_secs(60), 0);
        let stored =
            || vec![("t".to_string(), "k/t".to_string(), 4), ("u".to_string(), "k/u".to_string(), 2)];
        assert_eq!(refresh.next(0, stored), Some(Ask::Count("t".into())));
        assert_eq!(refresh.next(0, Vec::new), None, "one topic at a time");
        assert_eq!(refresh.counted(Ok(6)), Some(Ask::Read("k/t".into())));
        let Some(Ask::Write(txn)) = refresh.stored(Ok(record(4, 7)), None) else { panic!("no write") };
        assert_eq!(txn.compares.len(), 1, "compare-and-swap on the record as read");
        let done = StoreReply::Txn(TxnOutcome { succeeded: true, revision: 8 });
        assert_eq!(refresh.stored(Ok(done), None), None);
        assert_eq!(refresh.next(1, Vec::new), Some(Ask::Count("u".into())));
        assert_eq!(refresh.counted(Ok(2)), None, "unchanged: nothing to read");
        assert_eq!(
            refresh.wake_at(),
            Some(60_000_000),
            "the next round is due an interval after this one began"
        );
        assert_eq!(refresh.next(59_999_999, Vec::new), None);
    }

    #[test]
    fn a_smaller_count_is_not_written_and_kafka_down_ends_the_round() {
        let mut refresh = TopicRefresh::new(std::time::Duration::from_secs(60), 0);
        let stored =
            || vec![("t".to_string(), "k/t".to_string(), 4), ("u".to_string(), "k/u".to_string(), 2)];
        refresh.next(0, stored);
        assert_eq!(refresh.counted(Ok(5)), Some(Ask::Read("k/t".into())));
        assert_eq!(refresh.stored(Ok(record(8, 7)), None), None, "the store holds more already");
        assert_eq!(refresh.next(0, Vec::new), Some(Ask::Count("u".into())));
        let down = crate::coordinator::CoordinatorError::Store(crate::store::StoreError::Unavailable(
            crate::store::Unreachable::NotLoaded,
        ));
        assert_eq!(refresh.counted(Err(down)), None);
        assert_eq!(refresh.next(1, Vec::new), None, "the round ended; the next is an interval later");
    }
}
