//! The fleet instance's Kafka topic refresh (`coordinator/machine/refresh.rs`): every
//! instance looks up the stored topics that are not configured and grows the records of
//! those that grew (compare-and-swap; growth only grows, so no fence is needed).

use super::{Instance, Waiting};
use crate::coordinator::CoordinatorError;
use crate::coordinator::machine::io::{Effect, Micros, StoreRequest};
use crate::coordinator::machine::refresh::Ask;
use crate::coordinator::shared::mirror::MirrorCache;

impl Instance {
    /// The refresh asks what comes next, if Kafka is configured.
    pub(super) fn refresh_topics(&mut self) {
        if self.config.kafka.is_none() {
            return;
        }
        let Some(cache) = self.cache.as_ref() else { return };
        let (configured, keys) = (&self.config.topic_partitions, &self.keys);
        let stored = || {
            let topics = cache.stored_topics().into_iter();
            let unconfigured = topics.filter(|(topic, _)| !configured.contains_key(topic));
            unconfigured.map(|(topic, count)| (topic.clone(), keys.topic(&topic), count)).collect()
        };
        let ask = self.refresh.next(self.now, stored);
        self.refresh_ask(ask);
    }

    /// Kafka's answer to the refresh in `round`.
    pub(super) fn refresh_counted(&mut self, round: u64, answer: Result<u32, CoordinatorError>) {
        if self.refresh.round() == round {
            let ask = self.refresh.counted(answer);
            self.refresh_ask(ask);
        }
    }

    /// Sends what the refresh asks for.
    pub(super) fn refresh_ask(&mut self, ask: Option<Ask>) {
        let waiting = Waiting::Refresh(self.refresh.round());
        match ask {
            None => {}
            Some(Ask::Count(topic)) => {
                let request = self.next_request;
                self.next_request += 1;
                self.waiting.insert(request, waiting);
                self.out.push(Effect::LookUpPartitions { request, topic });
            }
            Some(Ask::Read(key)) => {
                self.request(StoreRequest::Get(vec![key]), waiting);
            }
            Some(Ask::Write(txn)) => {
                self.request(StoreRequest::Txn(txn), waiting);
            }
        }
    }

    /// When the next refresh round is due.
    pub(super) fn refresh_wake(&self) -> Option<Micros> {
        (self.config.kafka.is_some() && self.cache.is_some()).then(|| self.refresh.wake_at()).flatten()
    }
}
