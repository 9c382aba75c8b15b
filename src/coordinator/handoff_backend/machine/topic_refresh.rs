//! The Kafka topic refresh of each leader group's leader (`coordinator/machine/refresh.rs`):
//! while it leads, the leader looks up its group's stored topics that are not configured
//! and grows the records of those that grew, each write fenced by its leadership.

use super::{Instance, Waiting};
use crate::coordinator::CoordinatorError;
use crate::coordinator::machine::io::{Effect, Micros, StoreReply, StoreRequest};
use crate::coordinator::machine::refresh::Ask;
use crate::coordinator::shared::mirror::MirrorCache;
use crate::store::{Compare, StoreError};

impl Instance {
    /// Group `g`'s refresh asks what comes next, if it leads and Kafka is configured.
    pub(super) fn refresh_topics(&mut self, g: usize) {
        if self.config.kafka.is_none() || self.leaders[g].fence.is_none() {
            return;
        }
        let Some(cache) = self.cache.as_ref() else { return };
        let (configured, keys, group) = (&self.config.topic_partitions, &self.keys, self.leaders[g].group());
        let stored = || {
            let topics = cache.stored_topics().into_iter();
            let ours = topics.filter(|(topic, _)| group.plans(topic) && !configured.contains_key(topic));
            ours.map(|(topic, count)| (topic.clone(), keys.topic(&topic), count)).collect()
        };
        let ask = self.leaders[g].refresh.next(self.now, stored);
        self.refresh_ask(g, ask);
    }

    /// Kafka's answer to group `g`'s refresh in `round`.
    pub(super) fn refresh_counted(&mut self, g: usize, round: u64, answer: Result<u32, CoordinatorError>) {
        if self.leaders.get(g).is_some_and(|me| me.refresh.round() == round) {
            let ask = self.leaders[g].refresh.counted(answer);
            self.refresh_ask(g, ask);
        }
    }

    /// The store's answer to group `g`'s refresh in `round`.
    pub(super) fn refresh_stored(&mut self, g: usize, round: u64, answer: Result<StoreReply, StoreError>) {
        let Some(me) = self.leaders.get_mut(g).filter(|me| me.refresh.round() == round) else { return };
        let guard =
            me.fence.map(|fence| Compare::CreateRevision(self.keys.leader(me.group()), fence.revision));
        let ask = me.refresh.stored(answer, guard);
        self.refresh_ask(g, ask);
    }

    /// Sends what group `g`'s refresh asks for.
    fn refresh_ask(&mut self, g: usize, ask: Option<Ask>) {
        let waiting = Waiting::Refresh(g, self.leaders[g].refresh.round());
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

    /// When a leader's next refresh round is due.
    pub(super) fn refresh_wake(&self) -> impl Iterator<Item = Micros> + '_ {
        let refreshes = self.config.kafka.is_some() && self.cache.is_some();
        self.leaders
            .iter()
            .filter(move |me| refreshes && me.fence.is_some())
            .filter_map(|me| me.refresh.wake_at())
    }
}
